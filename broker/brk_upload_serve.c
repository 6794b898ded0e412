/* brk_upload_serve.c -- FETCH: a stored version's bytes read from its
 * file, or an upload in progress's as they come: what came is served, a
 * FETCH of bytes still to come waits (parked) in the upload's slot until
 * its chunk comes (answered with that chunk's frame, shared with ZeroMQ)
 * or the upload fails (ERROR). A connection's answers keep its order. A
 * connection with BRK_FETCH_OUT_MAX answers read and not yet sent is
 * answered busy (brk_fetch_peer_t), and so is any FETCH whose bytes would
 * take the answers read and not yet sent, all connections together, past
 * --max-fetch-mb: a worker's on the worker socket and the peer broker's
 * on the client socket alike (without keys anyone may send the latter,
 * and a peer that asks without reading would have every answer read and
 * held: 1,000 of 4 MiB in ZeroMQ's queue of one connection). */
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "broker/brk_log.h"
#include "broker/brk_deliver.h"
#include "broker/brk_msg.h"

/* One FETCH on its way through brk_upload_fetch's phases. */
typedef struct {
    brk_t *b;
    const zmq_msg_t *from;     /* the asking worker's connection */
    bool worker_side;          /* else the peer broker, on the client socket */
    uint64_t id;
    const msg_fetch_t *f;
    uint64_t max;              /* f->max bounded by MSG_CHUNK_MAX */
} fetch_t;

/* The buffer an answer is read into, with what it counts against until
 * ZeroMQ frees it. */
typedef struct {
    brk_fetch_peer_t *peer;          /* NULL: not counted per connection */
    atomic_uint_fast64_t *out_bytes; /* brk_t.fetch_out_bytes */
    uint64_t n;
    _Alignas(16) unsigned char data[]; /* (malloc aligns to 16: no more may be asked of it) */
} out_buf_t;

/* ZeroMQ is done with an answer's buffer (its I/O thread, or the routing
 * thread when the send failed): one fewer on its way to its peer, its
 * bytes no longer held. */
static void free_chunk(void *data, void *hint) {
    out_buf_t *o = hint;
    (void)data; /* (o->data) */
    if (o->peer) atomic_fetch_sub(&o->peer->out, 1);
    atomic_fetch_sub(o->out_bytes, o->n);
    free(o);
}

/* The fetch peer of connection `to` on the worker (worker_side) or the
 * client socket (each numbers its connections on its own): its own slot,
 * else one with no answer on its way, taken; NULL when none is free. */
static brk_fetch_peer_t *fetch_peer(brk_t *b, bool worker_side, const zmq_msg_t *to) {
    size_t n = zmq_msg_size((zmq_msg_t *)to);
    const void *who = zmq_msg_data((zmq_msg_t *)to);
    brk_fetch_peer_t *idle = NULL;
    if (n > sizeof b->fetch_peers[0].who) return NULL;
    for (int i = 0; i < BRK_FETCH_PEERS; i++) {
        brk_fetch_peer_t *p = &b->fetch_peers[i];
        if (p->worker_side == worker_side && p->who_len == n && !memcmp(p->who, who, n)) return p;
        if (!idle && atomic_load(&p->out) == 0) idle = p;
    }
    if (idle) {
        memcpy(idle->who, who, n);
        idle->who_len = n;
        idle->worker_side = worker_side;
    }
    return idle;
}

/* The bytes an answer to a FETCH at offset of at most max bytes of a
 * file of size bytes carries. */
static uint64_t answer_bytes(uint64_t size, uint64_t offset, uint64_t max) {
    return offset >= size ? 0 : size - offset < max ? size - offset : max;
}

/* Whether n more bytes of answers may be read now: false (ERROR busy
 * sent to `to` on the worker or client socket, naming the bound) when
 * they would take those read and not yet sent past --max-fetch-mb. */
static bool bytes_fit(brk_t *b, bool worker_side, const zmq_msg_t *to, uint64_t id, uint64_t n) {
    /* (only the routing thread adds: what it reads can only shrink meanwhile) */
    uint64_t out = atomic_load(&b->fetch_out_bytes);
    if (out + n <= b->opt.max_fetch_bytes) return true;
    brk_error_to(b, worker_side, to, id, WIRE_E_BUSY, "FETCH: %.1f MiB of answers are on their way, the most "
                 "the broker holds (--max-fetch-mb %llu): ask again later", (double)out / 1048576.0,
                 (unsigned long long)(b->opt.max_fetch_bytes >> 20));
    return false;
}

/* Whether FETCH q, whose answer carries n bytes, may have them read now;
 * else it is answered busy (docs/PROTOCOL.md: ask again later). On either
 * socket: the peer broker's copy asks 4 chunks at a time, as a worker. */
static bool may_read(fetch_t *q, uint64_t n, brk_fetch_peer_t **peer) {
    *peer = NULL;
    brk_fetch_peer_t *p = fetch_peer(q->b, q->worker_side, q->from);
    if (p && atomic_load(&p->out) < BRK_FETCH_OUT_MAX) {
        if (!bytes_fit(q->b, q->worker_side, q->from, q->id, n)) return false;
        *peer = p;
        return true;
    }
    if (p)
        brk_error_to(q->b, q->worker_side, q->from, q->id, WIRE_E_BUSY, "FETCH: %d answers to this connection are still being "
                     "sent: ask again once they are read", BRK_FETCH_OUT_MAX);
    else
        brk_error_to(q->b, q->worker_side, q->from, q->id, WIRE_E_BUSY, "FETCH: answers are on their way to %d connections: "
                     "ask again later", BRK_FETCH_PEERS);
    return false;
}

/* FETCH_DATA: the bytes of fd from offset (at most max, none past end),
 * the file being size bytes long; or ERROR when they cannot be read. The
 * chunk's frame is the buffer it was read into, handed to ZeroMQ (freed
 * once sent): no copy of it on the routing thread. Counted on its way to
 * peer (NULL: not counted) until then, and its bytes in fetch_out_bytes. */
static void serve(brk_t *b, bool worker_side, const zmq_msg_t *to, uint64_t id, const char *comp, uint64_t v, int fd, uint64_t size,
                  uint64_t offset, uint64_t max, brk_fetch_peer_t *peer) {
    uint64_t n = answer_bytes(size, offset, max);
    out_buf_t *o = malloc(sizeof *o + n);
    unsigned char *buf = o ? o->data : NULL;
    ssize_t got = buf && n ? pread(fd, buf, n, (off_t)offset) : 0;
    wire_msg_t *sh = buf && got == (ssize_t)n ? calloc(1, sizeof *sh) : NULL;
    if (o) *o = (out_buf_t){ .peer = peer, .out_bytes = &b->fetch_out_bytes, .n = n };
    if (peer) atomic_fetch_add(&peer->out, 1);
    if (o) atomic_fetch_add(&b->fetch_out_bytes, n);
    if (!sh || zmq_msg_init_data(&sh->frame[0], buf, n, free_chunk, o) != 0) {
        if (peer) atomic_fetch_sub(&peer->out, 1); /* (buf never reached ZeroMQ) */
        if (o) atomic_fetch_sub(&b->fetch_out_bytes, n);
        brk_error_to(b, worker_side, to, id, WIRE_E_INTERNAL, "FETCH: cannot read %s v%" PRIu64 ": %s", comp, v,
                     !buf || (sh == NULL && got == (ssize_t)n) ? "out of memory"
                     : got < 0                                 ? strerror(errno)
                     : got != (ssize_t)n                       ? "the file is shorter than it was"
                                                               : "out of memory");
        free(sh);
        free(o);
        return;
    }
    sh->n_tensors = 1;
    sh->t[0] = msg_chunk(buf, n);
    msg_fetch_data_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.component, sizeof d.component, "%s", comp);
    d.version = v;
    d.offset = offset;
    d.size = size;
    d.chunk = &sh->t[0];
    /* (the peer broker's, on the client socket, is held when its queue is
     * full: brk_deliver.h) */
    int rc = worker_side ? msg_send(b->workers, to, MSG_FETCH_DATA, id, &d, sh)
                         : brk_client_send(b, to, MSG_FETCH_DATA, id, &d, sh);
    if (rc != 0 && worker_side) brk_undelivered(b, "FETCH_DATA");
    else if (rc == 0) b->fetch_bytes_read += n;
    zmq_msg_close(&sh->frame[0]); /* zmq holds its own reference while it sends */
    free(sh);
}

/* A worker asks for fixed offsets and takes each answer as the whole
 * chunk, so a chunk is never sent short. */
bool brk_upl_ready(const slot_t *s, uint64_t offset, uint64_t max) {
    /* Past the end: answered empty, but only once all came, so that it
     * does not overtake the same connection's FETCHes still waiting
     * (a worker asks 4 ahead before it knows the size). */
    if (offset >= s->size) return s->received >= s->size;
    uint64_t end = s->size - offset < max ? s->size : offset + max;
    return s->received >= end;
}

static void serve_slot(brk_t *b, slot_t *s, const zmq_msg_t *to, uint64_t id, uint64_t offset, uint64_t max,
                       brk_fetch_peer_t *peer) {
    serve(b, true, to, id, s->component, s->version, s->fd, s->size, offset, max, peer);
}

/* FETCH_DATA of the chunk u that just came, in m: when the FETCH asks for
 * exactly those bytes (a worker's fixed offsets and the trainer's chunks
 * line up, as they do at the default 4 MiB), its frame goes out shared
 * with ZeroMQ (reference-counted: no read back from the file, no copy, for
 * every worker that waits for it). False when the FETCH asks for other
 * bytes. */
static bool serve_arrived(brk_t *b, slot_t *s, const zmq_msg_t *to, uint64_t id, uint64_t offset, uint64_t max,
                          const msg_upload_t *u, const wire_msg_t *m) {
    if (!u || !m || offset != u->offset || offset >= s->size) return false;
    uint64_t n = s->size - offset < max ? s->size - offset : max;
    if (n != u->chunk->bytes) return false;
    msg_fetch_data_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.component, sizeof d.component, "%s", s->component);
    d.version = s->version;
    d.offset = offset;
    d.size = s->size;
    d.chunk = u->chunk;
    if (msg_send(b->workers, to, MSG_FETCH_DATA, id, &d, m) != 0) brk_undelivered(b, "FETCH_DATA");
    else b->fetch_bytes_shared += n;
    return true;
}

static int grow_parked(slot_t *s) {
    int cap = s->cap_parked ? 2 * s->cap_parked : 16;
    if (cap > BRK_FETCH_PARKED_MAX) cap = BRK_FETCH_PARKED_MAX;
    parked_t *p = realloc(s->parked, (size_t)cap * sizeof *p);
    if (!p) return -1;
    s->parked = p;
    s->cap_parked = cap;
    return 0;
}

/* The routing id of parked FETCH p as a message to send to. -1: no memory. */
static int parked_to(const parked_t *p, zmq_msg_t *to) {
    if (zmq_msg_init_size(to, p->who_len) != 0) return -1;
    memcpy(zmq_msg_data(to), p->who, p->who_len);
    return 0;
}

/* (one connection's answers must keep its order) */
void brk_upl_serve_parked(brk_t *b, slot_t *s, const msg_upload_t *u, const wire_msg_t *m) {
    int keep = 0;
    for (int i = 0; i < s->n_parked; i++) {
        parked_t *p = &s->parked[i];
        if (!brk_upl_ready(s, p->offset, p->max)) {
            s->parked[keep++] = *p;
            continue;
        }
        zmq_msg_t to;
        if (parked_to(p, &to) != 0) { /* out of memory: it waits for the next chunk */
            s->parked[keep++] = *p;
            continue;
        }
        /* (one is answered whatever its connection has on its way: it was
         * taken when it came, within BRK_FETCH_PARKED_MAX; but no more bytes
         * are read for it past --max-fetch-mb: busy, and it asks again) */
        if (!serve_arrived(b, s, &to, p->id, p->offset, p->max, u, m) &&
            bytes_fit(b, true, &to, p->id, answer_bytes(s->size, p->offset, p->max)))
            serve_slot(b, s, &to, p->id, p->offset, p->max, fetch_peer(b, true, &to));
        zmq_msg_close(&to);
    }
    s->n_parked = keep;
}

void brk_upl_fail_parked(brk_t *b, slot_t *s, const char *code, const char *reason) {
    for (int i = 0; i < s->n_parked; i++) {
        parked_t *p = &s->parked[i];
        zmq_msg_t to;
        if (parked_to(p, &to) != 0) continue;
        brk_error_to(b, true, &to, p->id, code, "FETCH: %s v%" PRIu64 ": %s", s->component,
                     s->version, reason);
        zmq_msg_close(&to);
    }
    s->n_parked = 0;
}

/* A FETCH from the connection `from` at offset that waits already (the
 * worker asked again after a silence: docs/PROTOCOL.md, "Weights by
 * value"): it takes the new id, keeping its place in the order. */
static bool refold(slot_t *s, const zmq_msg_t *from, uint64_t id, uint64_t offset, uint64_t max) {
    size_t n = zmq_msg_size(from);
    const void *who = zmq_msg_data((zmq_msg_t *)from);
    for (int i = 0; i < s->n_parked; i++) {
        parked_t *p = &s->parked[i];
        if (p->offset == offset && p->who_len == n && !memcmp(p->who, who, n)) {
            p->id = id;
            p->max = max;
            return true;
        }
    }
    return false;
}

/* The FETCH of an upload in progress of these bytes (slot s): what came
 * is served, the rest when it comes (a SYNC may name a version still
 * coming); refused while the upload stalls, or BUSY when no more may
 * wait. */
static void fetch_coming(fetch_t *q, slot_t *s) {
    brk_t *b = q->b;
    const msg_fetch_t *f = q->f;
    brk_fetch_peer_t *peer;
    if (brk_upl_ready(s, f->offset, q->max)) {
        if (may_read(q, answer_bytes(s->size, f->offset, q->max), &peer))
            serve_slot(b, s, q->from, q->id, f->offset, q->max, peer);
    } else if (s->stalled[0]) {
        brk_error_to(b, true, q->from, q->id, WIRE_E_INTERNAL, "FETCH: %s v%" PRIu64 ": the upload stalled: %s",
                     s->component, s->version, s->stalled);
    } else if (refold(s, q->from, q->id, f->offset, q->max)) {
        /* a worker asking again for a chunk it waits for: one answer */
    } else if (s->n_parked == BRK_FETCH_PARKED_MAX || zmq_msg_size(q->from) > sizeof s->parked[0].who ||
               (s->n_parked == s->cap_parked && grow_parked(s) != 0)) {
        brk_error_to(b, true, q->from, q->id, WIRE_E_BUSY, "FETCH: %d fetches already wait for %s v%" PRIu64,
                     s->n_parked, s->component, s->version);
    } else {
        parked_t *p = &s->parked[s->n_parked++];
        p->who_len = zmq_msg_size(q->from);
        memcpy(p->who, zmq_msg_data((zmq_msg_t *)q->from), p->who_len);
        p->id = q->id;
        p->offset = f->offset;
        p->max = q->max;
    }
}

/* The FETCH of a stored version: read from its file, or ERROR when it is
 * not stored or cannot be opened. */
static void fetch_stored(fetch_t *q) {
    brk_t *b = q->b;
    const msg_fetch_t *f = q->f;
    char path[1024];
    if (!brk_upload_stored(b, f->component, f->version, f->sha256)) { /* unsupported, not_found, invalid */
        brk_error_from(b, q->worker_side, q->from, q->id, reel_err(), "FETCH: "); /* all bad_request */
        return;
    }
    brk_upl_path(b, "", f->component, f->version, ".safetensors", path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        brk_error_to(b, q->worker_side, q->from, q->id, WIRE_E_INTERNAL, "FETCH: cannot open %s v%" PRIu64 ": %s",
                     f->component, f->version, strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    uint64_t size = (uint64_t)st.st_size;
    brk_fetch_peer_t *peer;
    if (may_read(q, answer_bytes(size, f->offset, q->max), &peer))
        serve(b, q->worker_side, q->from, q->id, f->component, f->version, fd, size, f->offset, q->max, peer);
    close(fd);
}

void brk_upload_fetch(brk_t *b, bool worker_side, const zmq_msg_t *from, uint64_t id, const msg_fetch_t *f) {
    fetch_t q = { .b = b, .from = from, .worker_side = worker_side, .id = id, .f = f,
                  .max = f->max && f->max < MSG_CHUNK_MAX ? f->max : MSG_CHUNK_MAX };
    char sha[65];
    brk_upl_lower(f->sha256, sha);
    slot_t *s = b->uploads ? brk_upl_slot(b, f->component, f->version) : NULL;
    if (s && !strcmp(s->sha256, sha) && worker_side) fetch_coming(&q, s);
    else fetch_stored(&q);
}
