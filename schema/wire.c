/* wire.c -- Reel's wire transport (see wire.h and docs/PROTOCOL.md):
 * receiving a message (every part drained, the header tokenized under the
 * limits, the envelope -- id, proto, type -- and the tensor descriptors
 * checked against the frames) and sending one (an encoded header and the
 * tensor frames, copied or shared). The header's own fields are msg.c's
 * business; the value-tree forms here serve tests and tools. */
#include "schema/wire_codec.h"

#include <errno.h>
#include <malloc.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ctype.h>
#include <sys/un.h>

/* ---- the arena of a received message ------------------------------------------ */

struct wire_chunk {
    wire_chunk_t *next;
    size_t cap, used;
    alignas(max_align_t) unsigned char data[];
};

#define CHUNK_MIN 4096

void *wire_msg_alloc(wire_msg_t *m, size_t n) {
    n = (n + alignof(max_align_t) - 1) & ~(alignof(max_align_t) - 1);
    wire_chunk_t *c = m->arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CHUNK_MIN ? n : CHUNK_MIN;
        if (c && cap < 2 * c->cap) cap = 2 * c->cap;
        if (!(c = malloc(sizeof *c + cap))) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = m->arena;
        m->arena = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

/* ---- received messages --------------------------------------------------------- */

/* Frees what the message's body holds (not the identity) and empties it. */
static void release_body(wire_msg_t *m) {
    wv_free(&m->hdr);
    wire_toks_free(&m->tok);
    while (m->arena) {
        wire_chunk_t *next = m->arena->next;
        free(m->arena);
        m->arena = next;
    }
    if (m->has_head) zmq_msg_close(&m->head);
    m->has_head = false;
    for (int i = 0; i < m->n_tensors && i < WIRE_MAX_TENSORS; i++) zmq_msg_close(&m->frame[i]);
    m->n_tensors = 0; /* t[] and frame[] past n_tensors are never read */
    m->type = NULL;
    m->type_buf[0] = '\0';
    m->id = 0;
}

/* Makes *m (any bytes) an empty message. The large arrays (tokens, tensor
 * descriptors, frames: most of its ~3.7 KB) are left as they are: each
 * entry is written before it is read, so a message struct received into
 * again and again costs no clearing. */
static void reset(wire_msg_t *m) {
    m->has_identity = false;
    m->has_head = false;
    m->tok.heap = NULL;
    m->tok.n = m->tok.cap = 0;
    m->arena = NULL;
    m->hdr = NULL;
    m->type = NULL;
    m->type_buf[0] = '\0';
    m->id = 0;
    m->n_tensors = 0;
}

void wire_msg_close(wire_msg_t *m) {
    if (!m) return;
    release_body(m);
    if (m->has_identity) zmq_msg_close(&m->identity);
    m->has_identity = false;
}

const wire_tensor_t *wire_msg_tensor(const wire_msg_t *m, const char *name) {
    if (!m || !name) return NULL;
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

/* A key looked for, with its length. */
typedef struct {
    const char *s;
    uint32_t n;
} env_key_t;
#define KEY(lit) { lit, sizeof(lit) - 1 }

/* The values of keys[0..n) in map token `map`, in one pass (0 where
 * absent). */
static void find_keys(const wire_msg_t *m, uint32_t map, const env_key_t *keys, uint32_t *at, int n) {
    const wire_tok_t *v = wire_toks_v(&m->tok);
    const char *h = wire_msg_head(m);
    for (int j = 0; j < n; j++) at[j] = 0;
    /* (the envelope's keys come first in what Reel writes: the scan ends
     * once each was met, as a key appears once) */
    for (uint32_t i = 0, k = map + 1, found = 0; i < v[map].n && found < (uint32_t)n; i++, k = v[k + 1].next) {
        /* keys are strings without NUL bytes: the tokenizer checked */
        const char *ks = h + v[k].v.off;
        for (int j = 0; j < n; j++)
            if (!at[j] && keys[j].n == v[k].n && keys[j].s[0] == ks[0] && !memcmp(keys[j].s, ks, keys[j].n)) {
                at[j] = k + 1;
                found++;
                break;
            }
    }
}

/* Fills *t from descriptor token d (descriptor i). 1 with *err set when
 * it is bad. Unknown keys of a descriptor are ignored. */
static int parse_tensor(const wire_msg_t *m, uint32_t d, int i, wire_tensor_t *t, wire_err_t *err) {
    static const env_key_t keys[4] = { KEY("name"), KEY("dtype"), KEY("shape"), KEY("bytes") };
    const wire_toks_t *tk = &m->tok;
    const void *h = wire_msg_head(m);
    const wire_tok_t *v = wire_toks_v(tk);
    memset(t, 0, sizeof *t);
    if (v[d].kind != WV_MAP) {
        wire_set_err(err, WIRE_E_MALFORMED, "tensor %d: descriptor is not a map", i);
        return 1;
    }
    uint32_t at[4];
    find_keys(m, d, keys, at, 4);
    uint32_t name = at[0], dt = at[1], shape = at[2], b = at[3];
    size_t len = 0;
    const char *s = name && v[name].kind == WV_STR ? wire_tok_str(tk, h, name, &len) : NULL;
    if (!s || len == 0 || len >= sizeof t->name || memchr(s, 0, len)) {
        wire_set_err(err, WIRE_E_MALFORMED, "tensor %d: \"name\" must be a string of 1..%zu bytes", i,
                     sizeof t->name - 1);
        return 1;
    }
    memcpy(t->name, s, len);
    t->name[len] = '\0';
    char dts[16] = "";
    s = dt && v[dt].kind == WV_STR ? wire_tok_str(tk, h, dt, &len) : NULL;
    if (s && len < sizeof dts) memcpy(dts, s, len), dts[len] = '\0';
    if (wire_dtype_parse(dts, &t->dtype) < 0) {
        wire_set_err(err, WIRE_E_MALFORMED, "tensor '%s': unknown dtype", t->name);
        return 1;
    }
    if (!shape || v[shape].kind != WV_ARR) {
        wire_set_err(err, WIRE_E_MALFORMED, "tensor '%s': \"shape\" is not an array", t->name);
        return 1;
    }
    if (v[shape].n > WIRE_MAX_DIMS) {
        wire_set_err(err, WIRE_E_TOO_LARGE, "tensor '%s': %u dims (max %d)", t->name, (unsigned)v[shape].n,
                     WIRE_MAX_DIMS);
        return 1;
    }
    t->ndim = (int)v[shape].n;
    uint64_t numel = 1, want, bytes;
    for (int k = 0; k < t->ndim; k++) {
        int64_t dim;
        if (!wire_tok_i64(tk, shape + 1 + (uint32_t)k, &dim) || dim < 0) {
            wire_set_err(err, WIRE_E_MALFORMED, "tensor '%s': dim %d is not a non-negative integer",
                         t->name, k);
            return 1;
        }
        t->shape[k] = dim;
        if (__builtin_mul_overflow(numel, (uint64_t)dim, &numel)) {
            wire_set_err(err, WIRE_E_MALFORMED, "tensor '%s': element count overflows", t->name);
            return 1;
        }
    }
    if (__builtin_mul_overflow(numel, (uint64_t)wire_dtype_size(t->dtype), &want)) {
        wire_set_err(err, WIRE_E_MALFORMED, "tensor '%s': byte size overflows", t->name);
        return 1;
    }
    if (!b || !wire_tok_u64(tk, b, &bytes)) {
        wire_set_err(err, WIRE_E_MALFORMED, "tensor '%s': \"bytes\" %s", t->name,
                     b ? "is not a non-negative integer" : "missing");
        return 1;
    }
    if (bytes != want) {
        wire_set_err(err, WIRE_E_MALFORMED, "tensor '%s': bytes %llu != %llu (shape x dtype)", t->name,
                     (unsigned long long)bytes, (unsigned long long)want);
        return 1;
    }
    t->bytes = (size_t)bytes;
    return 0;
}

/* The envelope: id, proto, type. 1 with *err set when it is bad. */
static int parse_envelope(wire_msg_t *m, uint32_t *tensors, wire_err_t *err) {
    static const env_key_t keys[4] = { KEY("id"), KEY("proto"), KEY("type"), KEY("tensors") };
    const wire_toks_t *tk = &m->tok;
    const void *h = wire_msg_head(m);
    const wire_tok_t *v = wire_toks_v(tk);
    uint32_t at[4];
    find_keys(m, 0, keys, at, 4);
    uint32_t id = at[0];
    *tensors = at[3];
    if (id && !wire_tok_u64(tk, id, &m->id)) {
        wire_set_err(err, WIRE_E_MALFORMED, "\"id\" is not an unsigned integer");
        return 1;
    }
    uint32_t proto = at[1];
    if (!proto || !wire_tok_is(tk, h, proto, WIRE_PROTO)) {
        size_t len = 0;
        const char *p = proto && v[proto].kind == WV_STR ? wire_tok_str(tk, h, proto, &len) : NULL;
        const char *why = proto ? "is not a string" : "missing";
        /* Quoted up to a NUL, "reel/1\0x" would read as the very proto
         * wanted: say what is wrong instead. */
        if (p && memchr(p, '\0', len)) {
            p = NULL;
            why = "holds a NUL byte";
        }
        wire_set_err(err, WIRE_E_PROTO, "proto %s%.*s%s, want \"" WIRE_PROTO "\"", p ? "\"" : "",
                     p ? (int)(len < 64 ? len : 64) : (int)strlen(why), p ? p : why, p ? "\"" : "");
        return 1;
    }
    uint32_t type = at[2];
    if (!type || v[type].kind != WV_STR) {
        wire_set_err(err, WIRE_E_MALFORMED, "\"type\" missing or not a string");
        return 1;
    }
    size_t len;
    const char *s = wire_tok_str(tk, h, type, &len);
    if (memchr(s, '\0', len)) { /* no type has one, and an answer could not name it whole */
        wire_set_err(err, WIRE_E_MALFORMED, "\"type\" contains a NUL byte");
        return 1;
    }
    if (len >= sizeof m->type_buf) len = sizeof m->type_buf - 1; /* no type is that long: unknown */
    memcpy(m->type_buf, s, len);
    m->type_buf[len] = '\0';
    m->type = m->type_buf;
    return 0;
}

/* Checks the tensor descriptors against frames[1..n_total). */
static int parse_tensors(wire_msg_t *m, uint32_t desc, zmq_msg_t *frames, size_t n_total, wire_err_t *err) {
    const wire_toks_t *tk = &m->tok;
    const wire_tok_t *v = wire_toks_v(tk);
    if (desc && v[desc].kind != WV_ARR) {
        wire_set_err(err, WIRE_E_MALFORMED, "\"tensors\" is not an array");
        return 1;
    }
    size_t n_desc = desc ? v[desc].n : 0, n_frames = n_total - 1;
    if (n_desc > WIRE_MAX_TENSORS || n_frames > WIRE_MAX_TENSORS) {
        wire_set_err(err, WIRE_E_TOO_LARGE, "%zu tensors (max %d)", n_desc > n_frames ? n_desc : n_frames,
                     WIRE_MAX_TENSORS);
        return 1;
    }
    if (n_desc != n_frames) {
        wire_set_err(err, WIRE_E_MALFORMED, "%zu tensors declared but %zu frames sent", n_desc, n_frames);
        return 1;
    }
    for (size_t i = 0, d = desc + 1; i < n_desc; i++, d = v[d].next) {
        wire_tensor_t *t = &m->t[i];
        if (parse_tensor(m, (uint32_t)d, (int)i, t, err)) return 1;
        /* wire_msg_tensor looks tensors up by name: keep names unambiguous */
        for (size_t j = 0; j < i; j++)
            if (!strcmp(m->t[j].name, t->name)) {
                wire_set_err(err, WIRE_E_MALFORMED, "tensor '%s' declared twice", t->name);
                return 1;
            }
        size_t fsz = zmq_msg_size(&frames[1 + i]);
        if (fsz != t->bytes) {
            wire_set_err(err, WIRE_E_MALFORMED, "tensor '%s': %zu bytes declared, frame has %zu", t->name,
                         t->bytes, fsz);
            return 1;
        }
    }
    for (size_t i = 0; i < n_desc; i++) {
        zmq_msg_init(&m->frame[i]);
        zmq_msg_move(&m->frame[i], &frames[1 + i]);
        zmq_msg_close(&frames[1 + i]); /* now empty */
        /* data is taken after the move: small messages live inside zmq_msg_t */
        m->t[i].data = zmq_msg_data(&m->frame[i]);
    }
    m->n_tensors = (int)n_desc;
    return 0;
}

/* Decodes frames[0..n_kept) of a message that had n_total frames (those
 * past n_kept were already closed: they only count). Takes ownership of
 * the kept frames; on success the header frame moves into m->head and the
 * tensor frames into m->frame. The identity is left alone. */
static int decode_frames(wire_msg_t *m, zmq_msg_t *frames, size_t n_kept, size_t n_total,
                         wire_err_t *err, bool tree) {
    int rc = 1;
    size_t done = 0; /* frames[0..done) no longer ours to close */
    release_body(m);
    if (n_total == 0) {
        wire_set_err(err, WIRE_E_MALFORMED, "message without a header frame");
        goto out;
    }
    zmq_msg_init(&m->head);
    zmq_msg_move(&m->head, &frames[0]);
    zmq_msg_close(&frames[0]);
    m->has_head = true;
    done = 1;
    /* The id is read as soon as the tokenizer meets it: a rejected request
     * is still answered under its id, which is how the client matches the
     * ERROR to what it sent. */
    uint32_t desc = 0;
    if (wire_tokenize(wire_msg_head(m), zmq_msg_size(&m->head), &m->tok, &m->id, m->type_buf, sizeof m->type_buf,
                      err) ||
        parse_envelope(m, &desc, err) || parse_tensors(m, desc, frames, n_total, err))
        goto out;
    done = n_kept;
    if (tree && !(m->hdr = wire_tok_tree(&m->tok, wire_msg_head(m), 0))) {
        wire_set_err(err, WIRE_E_INTERNAL, "out of memory decoding header");
        goto out;
    }
    rc = 0;
out:
    for (size_t i = done; i < n_kept; i++) zmq_msg_close(&frames[i]);
    if (rc) { /* id and type outlive the body when read: an answer names them */
        uint64_t keep_id = m->id;
        char keep_type[sizeof m->type_buf];
        bool typed = m->type != NULL, read = m->type_buf[0] != '\0'; /* (read: wire_msg_type_read) */
        if (read) memcpy(keep_type, m->type_buf, sizeof keep_type);
        release_body(m);
        m->id = keep_id;
        if (read) memcpy(m->type_buf, keep_type, sizeof keep_type);
        if (typed) m->type = m->type_buf;
    }
    return rc;
}

/* wire_decode resets the whole of *m, has_identity included: a caller with
 * an identity attaches it after. */
int wire_decode_as(wire_msg_t *m, zmq_msg_t *frames, size_t n, wire_err_t *err, bool tree) {
    reset(m);
    size_t keep = n <= 1 + WIRE_MAX_TENSORS ? n : 1 + WIRE_MAX_TENSORS;
    for (size_t i = keep; i < n; i++) zmq_msg_close(&frames[i]);
    return decode_frames(m, frames, keep, n, err, tree);
}

int wire_decode(wire_msg_t *m, zmq_msg_t *frames, size_t n, wire_err_t *err) {
    return wire_decode_as(m, frames, n, err, true);
}

wire_val_t *wire_decode_header(const void *buf, size_t len, wire_err_t *err) {
    wire_toks_t t;
    memset(&t, 0, sizeof t);
    wire_val_t *v = NULL;
    if (wire_tokenize(buf, len, &t, NULL, NULL, 0, err) == 0 && !(v = wire_tok_tree(&t, buf, 0)))
        wire_set_err(err, WIRE_E_INTERNAL, "out of memory decoding header");
    wire_toks_free(&t);
    return v;
}

/* Receives one part, retrying EINTR when `retry` (inside a multipart
 * message the rest is already queued). -1 with errno on failure. */
static int recv_part(void *sock, zmq_msg_t *msg, int flags, bool retry) {
    for (;;) {
        if (zmq_msg_recv(msg, sock, flags) >= 0) return 0;
        if (!(retry && errno == EINTR)) return -1;
    }
}

int wire_recv_as(void *sock, bool router, int flags, wire_msg_t *m, wire_err_t *err, bool tree) {
    reset(m);
    zmq_msg_t frames[1 + WIRE_MAX_TENSORS];
    size_t kept = 0, total = 0;
    zmq_msg_t *first = router ? &m->identity : &frames[0];
    zmq_msg_init(first);
    if (recv_part(sock, first, flags, false) < 0) {
        int e = errno;
        zmq_msg_close(first);
        errno = e;
        return -1;
    }
    bool more = zmq_msg_more(first);
    if (router) {
        m->has_identity = true;
    } else {
        kept = total = 1;
    }
    /* Drain every remaining part, even of a bad message, so the next recv
     * starts at a message boundary. Parts past the tensor limit are only
     * counted. */
    while (more) {
        zmq_msg_t spill;
        zmq_msg_t *part = kept < 1 + WIRE_MAX_TENSORS ? &frames[kept] : &spill;
        zmq_msg_init(part);
        if (recv_part(sock, part, flags & ~ZMQ_DONTWAIT, true) < 0) {
            int e = errno;
            zmq_msg_close(part);
            for (size_t i = 0; i < kept; i++) zmq_msg_close(&frames[i]);
            wire_msg_close(m);
            errno = e;
            return -1;
        }
        more = zmq_msg_more(part);
        if (part == &spill) zmq_msg_close(&spill);
        else kept++;
        total++;
    }
    /* decode_frames leaves the identity alone */
    return decode_frames(m, frames, kept, total, err, tree);
}

int wire_recv(void *sock, bool router, int flags, wire_msg_t *m, wire_err_t *err) {
    return wire_recv_as(sock, router, flags, m, err, true);
}

void wire_tune_malloc(void) {
    (void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
    (void)mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

bool wire_code_known(const char *code) {
    static const char *const codes[] = { WIRE_E_MALFORMED, WIRE_E_TOO_LARGE,  WIRE_E_PROTO,       WIRE_E_UNKNOWN,
                                         WIRE_E_BAD_REQUEST, WIRE_E_BUSY,    WIRE_E_STALE,       WIRE_E_NO_WORKER,
                                         WIRE_E_WORKER_LOST, WIRE_E_TIMEOUT, WIRE_E_CANCELLED,   WIRE_E_STANDBY,
                                         WIRE_E_INTERNAL,  WIRE_E_FORBIDDEN, WIRE_E_SHUTDOWN };
    for (size_t i = 0; code && i < sizeof codes / sizeof codes[0]; i++)
        if (!strcmp(code, codes[i])) return true;
    return false;
}

int wire_socket_limits(void *sock) {
    int64_t max = WIRE_MAX_FRAME;
    int linger = 0;
    if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max, sizeof max) < 0) return -1;
    return zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
}

int wire_socket_endpoint(void *sock, const char *ep, char *out, size_t n) {
    static const char lh[] = "tcp://localhost:";
    int w = !strncasecmp(ep, lh, sizeof lh - 1) ? snprintf(out, n, "tcp://127.0.0.1:%s", ep + sizeof lh - 1)
                                            : snprintf(out, n, "%s", ep);
    if (w < 0 || (size_t)w >= n) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if (!strncmp(ep, "tcp://", 6) && strchr(ep + 6, '[')) { /* an IPv6 host, the peer's or a source's
                                                               * ("tcp://lo:0;[::1]:P") */
        int one = 1;
        if (zmq_setsockopt(sock, ZMQ_IPV6, &one, sizeof one) < 0) return -1;
    }
    return 0;
}

/* A host of a tcp:// endpoint, from h to end: a name or IPv4 address
 * (letters, digits, '.', '-', '_', starting with a letter or a digit), or
 * a bracketed IPv6 address with an optional %zone. */
static bool tcp_host_ok(const char *h, const char *end) {
    if (h >= end) return false;
    if (*h == '[') {
        const char *p = h + 1;
        while (p < end && (isxdigit((unsigned char)*p) || *p == ':' || *p == '.')) p++;
        if (p == h + 1) return false;
        if (p < end && *p == '%') {
            const char *z = ++p;
            while (p < end && (isalnum((unsigned char)*p) || *p == '.' || *p == '-' || *p == '_')) p++;
            if (p == z) return false;
        }
        return p + 1 == end && *p == ']';
    }
    if (!isalnum((unsigned char)*h)) return false;
    for (const char *p = h; p < end; p++)
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-' && *p != '_') return false;
    return true;
}

/* A source address before ';' (ZeroMQ's "tcp://SRC;HOST:PORT"): an
 * interface or address, with an optional port, in ZeroMQ's characters. */
static bool tcp_source_ok(const char *s, const char *end) {
    if (s >= end) return false;
    for (const char *p = s; p < end; p++)
        if (!isalnum((unsigned char)*p) && !strchr(".-_:%[]*", *p)) return false;
    return true;
}

int wire_endpoint_check(const char *ep, char *why, size_t n) {
    static const char expected[] = "expected tcp://HOST:PORT (HOST a name, an address or [IPv6]), ipc://PATH or "
                                   "inproc://NAME";
    if (!strncmp(ep, "inproc://", 9)) {
        if (ep[9]) return 0;
        snprintf(why, n, "an inproc:// endpoint without a name");
        return -1;
    }
    if (!strncmp(ep, "ipc://", 6)) {
        const char *path = ep + 6;
        size_t len = strlen(path), most = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
        if (!len || !strcmp(path, "@")) {
            snprintf(why, n, "an ipc:// endpoint without a path");
            return -1;
        }
        if (len > most) {
            snprintf(why, n, "an ipc path of %zu bytes, more than a socket path holds (%zu)", len, most);
            return -1;
        }
        return 0;
    }
    if (strncmp(ep, "tcp://", 6)) {
        snprintf(why, n, "%s", expected);
        return -1;
    }
    const char *host = ep + 6, *semi = strchr(host, ';');
    if (semi) {
        if (!tcp_source_ok(host, semi)) {
            snprintf(why, n, "%s (a source address before ';': an interface or address, and a port)", expected);
            return -1;
        }
        host = semi + 1;
    }
    const char *colon = strrchr(host, ':'), *end = host + strlen(host);
    if (!colon || !tcp_host_ok(host, colon)) {
        snprintf(why, n, "%s", expected);
        return -1;
    }
    const char *port = colon + 1;
    size_t digits = strspn(port, "0123456789");
    if (!digits || port + digits != end) {
        snprintf(why, n, "%s: the port must be a number", expected);
        return -1;
    }
    long v = digits > 5 ? 65536 : strtol(port, NULL, 10);
    if (v < 1 || v > 65535) {
        snprintf(why, n, "port %.*s is not in 1..65535", (int)(digits < 12 ? digits : 12), port);
        return -1;
    }
    return 0;
}

/* ---- sending ------------------------------------------------------------------- */

wire_val_t *wire_hdr(const char *type, uint64_t id) {
    wire_val_t *h = wv_map();
    if (!h) return NULL;
    if (wv_set(h, "type", wv_str(type)) < 0 || wv_set(h, "id", wv_u64(id)) < 0) {
        wv_free(&h);
        return NULL;
    }
    return h;
}

/* A sender-side check: what the receiver would reject is not sent. */
static bool tensor_ok(const wire_tensor_t *t) {
    if (t->ndim < 0 || t->ndim > WIRE_MAX_DIMS || t->dtype < 0 || t->dtype > WIRE_U8)
        return false;
    size_t nl = strnlen(t->name, sizeof t->name);
    if (nl == 0 || nl == sizeof t->name) return false;
    uint64_t numel = 1;
    for (int k = 0; k < t->ndim; k++)
        if (t->shape[k] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[k], &numel)) return false;
    uint64_t want;
    if (__builtin_mul_overflow(numel, (uint64_t)wire_dtype_size(t->dtype), &want)) return false;
    return want == t->bytes && (t->bytes == 0 || t->data);
}

/* Sends one part; parts after the first retry EINTR (ZeroMQ queues a
 * multipart message atomically, so only the first part can block). */
static int send_part(void *sock, zmq_msg_t *msg, int flags, bool retry) {
    for (;;) {
        if (zmq_msg_send(msg, sock, flags) >= 0) return 0;
        if (!(retry && errno == EINTR)) return -1;
    }
}

/* Index of t in share->t[], or -1 when t is not one of its tensors. */
static int shared_index(const wire_msg_t *share, const wire_tensor_t *t) {
    if (!share) return -1;
    for (int i = 0; i < share->n_tensors; i++)
        if (t == &share->t[i]) return i;
    return -1;
}

/* Builds part np as a copy of n bytes at p. -1 with errno. */
static int part_copy(zmq_msg_t *part, const void *p, size_t n) {
    if (zmq_msg_init_size(part, n) < 0) return -1;
    if (n) memcpy(zmq_msg_data(part), p, n);
    return 0;
}

/* The np built parts into keep (they are its now; parts[] is left empty). */
static void move_parts(wire_parts_t *keep, zmq_msg_t *parts, int np) {
    for (int i = 0; i < np; i++) {
        zmq_msg_init(&keep->part[i]);
        zmq_msg_move(&keep->part[i], &parts[i]);
    }
    keep->np = np;
}

int wire_send_buf(void *sock, const zmq_msg_t *identity, const wire_buf_t *hdr,
                  const wire_tensor_t *const *t, int n, const wire_msg_t *share) {
    return wire_send_buf_keep(sock, identity, hdr, t, n, share, NULL);
}

int wire_send_buf_keep(void *sock, const zmq_msg_t *identity, const wire_buf_t *hdr,
                       const wire_tensor_t *const *t, int n, const wire_msg_t *share, wire_parts_t *keep) {
    if (keep && keep->np) {
        errno = EINVAL;
        return -1;
    }
    if (!sock && !keep) {
        errno = EINVAL;
        return -1;
    }
    if (hdr->failed || n < 0 || n > WIRE_MAX_TENSORS) {
        errno = hdr->failed && !hdr->too_deep ? ENOMEM : EINVAL;
        return -1;
    }
    if (hdr->n > WIRE_MAX_HEADER) {
        errno = EMSGSIZE;
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (!t[i] || !tensor_ok(t[i])) {
            errno = EINVAL;
            return -1;
        }
    zmq_msg_t parts[2 + WIRE_MAX_TENSORS];
    int np = 0, sent = 0, e = 0;
    bool built = false;
    if (identity) {
        zmq_msg_t *id = (zmq_msg_t *)identity; /* zmq's getters are not const */
        if (part_copy(&parts[np], zmq_msg_data(id), zmq_msg_size(id)) < 0) goto zerr;
        np++;
    }
    if (part_copy(&parts[np], hdr->p, hdr->n) < 0) goto zerr;
    np++;
    for (int i = 0; i < n; i++) {
        int s = shared_index(share, t[i]);
        if (s >= 0) {
            /* reference-counted by ZeroMQ: the bytes are not copied */
            if (zmq_msg_init(&parts[np]) < 0 || zmq_msg_copy(&parts[np], (zmq_msg_t *)&share->frame[s]) < 0)
                goto zerr;
        } else if (part_copy(&parts[np], t[i]->data, t[i]->bytes) < 0) {
            goto zerr;
        }
        np++;
    }
    if (!sock) { /* built only: the caller sends it later */
        move_parts(keep, parts, np);
        return 0;
    }
    built = true;
    for (sent = 0; sent < np; sent++)
        if (send_part(sock, &parts[sent], sent + 1 < np ? ZMQ_SNDMORE : 0, sent > 0) < 0) goto zerr;
    goto out; /* a sent part belongs to zmq */
zerr:
    e = errno;
    /* ZeroMQ takes a multipart message whole or not at all: a first part
     * refused for a full queue means nothing went, and the message can
     * wait for room */
    if (keep && built && sent == 0 && e == EAGAIN) {
        move_parts(keep, parts, np);
        errno = EAGAIN;
        return -1;
    }
out:
    for (int i = sent; i < np; i++) zmq_msg_close(&parts[i]);
    if (e) {
        errno = e;
        return -1;
    }
    return 0;
}

int wire_parts_send(void *sock, wire_parts_t *p) {
    int sent = 0;
    for (; sent < p->np; sent++)
        if (send_part(sock, &p->part[sent], sent + 1 < p->np ? ZMQ_SNDMORE : 0, sent > 0) < 0) break;
    if (sent == p->np) {
        p->np = 0; /* every part belongs to zmq now */
        return 0;
    }
    int e = errno;
    if (sent == 0 && e == EAGAIN) return -1; /* nothing went: still held */
    for (int i = sent; i < p->np; i++) zmq_msg_close(&p->part[i]);
    p->np = 0;
    errno = e;
    return -1;
}

size_t wire_parts_bytes(const wire_parts_t *p) {
    size_t n = 0;
    for (int i = 0; i < p->np; i++) n += zmq_msg_size((zmq_msg_t *)&p->part[i]);
    return n;
}

void wire_parts_close(wire_parts_t *p) {
    for (int i = 0; i < p->np; i++) zmq_msg_close(&p->part[i]);
    p->np = 0;
}

/* The caller's map minus "proto"/"tensors", then those two. */
static void put_tree_header(wire_buf_t *w, const wire_val_t *hdr, const wire_tensor_t *const *t, int n) {
    wire_put_map(w);
    for (size_t i = 0; i < hdr->as.c.n; i++) {
        const char *k = hdr->as.c.k[i];
        if (!strcmp(k, "proto") || !strcmp(k, "tensors")) continue;
        wire_put_str(w, k);
        wire_put_tree(w, hdr->as.c.v[i]);
    }
    wire_put_str(w, "proto");
    wire_put_str(w, WIRE_PROTO);
    wire_put_tensors(w, t, n);
    wire_put_end(w);
}

static int send_tree(void *sock, const zmq_msg_t *identity, const wire_val_t *hdr, const wire_tensor_t *t,
                     int n, const wire_msg_t *share) {
    if (!hdr || hdr->kind != WV_MAP || n < 0 || n > WIRE_MAX_TENSORS || (n && !t)) {
        errno = EINVAL;
        return -1;
    }
    const wire_tensor_t *tp[WIRE_MAX_TENSORS];
    for (int i = 0; i < n; i++) {
        if (!tensor_ok(&t[i])) {
            errno = EINVAL;
            return -1;
        }
        tp[i] = &t[i];
    }
    wire_buf_t *w = malloc(sizeof *w);
    if (!w) return -1;
    wire_buf_init(w);
    put_tree_header(w, hdr, tp, n);
    int rc = wire_send_buf(sock, identity, w, tp, n, share);
    int e = errno;
    wire_buf_free(w);
    free(w);
    errno = e;
    return rc;
}

int wire_send(void *sock, const zmq_msg_t *identity, const wire_val_t *hdr, const wire_tensor_t *t,
              int n) {
    return send_tree(sock, identity, hdr, t, n, NULL);
}

int wire_forward(void *sock, const zmq_msg_t *identity, const wire_val_t *hdr, wire_msg_t *src) {
    return send_tree(sock, identity, hdr, src->t, src->n_tensors, src);
}
