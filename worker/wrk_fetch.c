/* wrk_fetch.c -- fetching an uploaded weights file from the broker (see
 * wrk_fetch.h). The broker answers FETCH in order on one connection, so
 * the answers come back as the requests went: WRK_FETCH_WINDOW of them
 * are kept in flight, each answer is copied to its place in memory (the
 * header, then the data buffer the loaded file will own) and hashed in
 * turn, and the next request goes out. No temporary file: writing one and
 * reading it back cost two thirds of a fetch (0.5 of 0.7 s for the small
 * config's 100 MB here).
 *
 * Resumable: answers are taken by offset, the next one the file needs;
 * others (a re-asked chunk answered twice, answers to requests from
 * before a re-ask) are dropped. When the broker is silent for
 * WRK_FETCH_RESEND_MS the fetch asks again for the chunk it needs next
 * (a restarted broker, or a connection that dropped, lost what was in
 * flight; ZeroMQ reconnects the socket by itself) and fills its window
 * again from the answer on, so a broker back within WRK_FETCH_TIMEOUT_MS
 * resumes the file where it stopped. The broker folds a re-asked FETCH
 * that waits for an upload's bytes into the one already waiting. */
#include "worker/wrk_fetch.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "base/error.h"
#include "base/sha256.h"
#include "worker/wrk_fetch_state.h"
#include "worker/wrk_weights.h"

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Asks for the chunk at f->asked. 0, or -1 (errno). */
static int ask(wrk_fetch_t *f) {
    msg_fetch_t q;
    memset(&q, 0, sizeof q);
    snprintf(q.component, sizeof q.component, "%s", f->m->component);
    q.version = f->m->version;
    snprintf(q.sha256, sizeof q.sha256, "%s", f->m->sha256);
    q.offset = f->asked;
    q.max = MSG_CHUNK_MAX;
    if (msg_fetch_send(f->sock, NULL, ++f->next_id, &q) != 0) return -1;
    f->asked += MSG_CHUNK_MAX;
    return 0;
}

/* The next answer within quiet_ms, while not stopping: 0 with *m (a
 * FETCH_DATA whose fields and chunk are checked), 1 when none came in
 * quiet_ms, 2 when the broker answered ERROR busy (it holds too many of
 * this connection's answers on their way: ask again later,
 * docs/PROTOCOL.md "Weights by value"), -1 with the reason as the
 * message: REEL_E_STATE when stopping, REEL_E_INVALID for an answer that
 * is not one, REEL_E_IO when the broker answered another ERROR. */
static int answer(wrk_fetch_t *f, const atomic_bool *stop, int quiet_ms, wire_msg_t *m, msg_fetch_data_t *d) {
    int64_t deadline = now_ms() + quiet_ms;
    for (;;) {
        if (stop && atomic_load(stop)) return reel_fail(REEL_E_STATE, "stopping");
        int64_t left = deadline - now_ms();
        if (left <= 0) return 1;
        zmq_pollitem_t it = { f->sock, 0, ZMQ_POLLIN, 0 };
        if (zmq_poll(&it, 1, left < 200 ? (long)left : 200) <= 0) continue;
        wire_err_t e;
        int rc = msg_recv(f->sock, false, ZMQ_DONTWAIT, m, &e);
        if (rc < 0) continue;
        if (rc == 1) return reel_fail(REEL_E_INVALID, "an unreadable answer: %s", e.message);
        if (msg_type(m) == MSG_ERROR) {
            msg_error_t er;
            int busy = 0;
            if (msg_error_decode(m, &er, &e) != 0)
                reel_fail(REEL_E_IO, "the broker answered ERROR");
            else if (!strcmp(er.code, WIRE_E_BUSY))
                busy = 1;
            else
                reel_fail(REEL_E_IO, "the broker answered %s: %.300s", er.code, er.message);
            wire_msg_close(m);
            return busy ? 2 : -1;
        }
        if (msg_type(m) != MSG_FETCH_DATA || msg_fetch_data_decode(m, d, &e) != 0 ||
            msg_fetch_data_validate(d, &e) != 0) {
            reel_fail(REEL_E_INVALID, "a bad answer %s: %s", m->type, msg_type(m) == MSG_FETCH_DATA ? e.message : "");
            wire_msg_close(m);
            return -1;
        }
        return 0;
    }
}

/* A data buffer of at least n bytes, *cap its size: the spare one when it
 * is big enough, else a new one (free()d by the loaded file) on 2 MiB pages
 * where the kernel gives them on request (transparent huge pages
 * "madvise"): first touching 4 KiB pages, one fault each, cost as much
 * as the copy into them (100 MB: 25,600 faults). */
static unsigned char *data_buffer(size_t n, wrk_fetch_buf_t *spare, size_t *cap) {
    const size_t huge = (size_t)2 << 20;
    if (spare && spare->p) {
        unsigned char *p = spare->p;
        spare->p = NULL;
        if (spare->cap >= n) {
            *cap = spare->cap;
            return p;
        }
        free(p);
    }
    if (n < huge) {
        *cap = n ? n : 1;
        return malloc(*cap);
    }
    void *p = NULL;
    size_t len = (n + huge - 1) / huge * huge;
    if (posix_memalign(&p, huge, len) != 0) return NULL;
    (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: 4 KiB pages still work */
    *cap = len;
    return p;
}

void wrk_fetch_spare_release(wrk_fetch_buf_t *spare) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)spare->p + page - 1) / page * page, e = ((uintptr_t)spare->p + spare->cap) / page * page;
    if (spare->p && e > a) (void)madvise((void *)a, e - a, MADV_FREE); /* a hint: without it the pages stay */
}

int wrk_fetch_invariants(const wrk_fetch_t *f, const wrk_fetch_mem_t *m, uint64_t done) {
    bool sized = f->size != UINT64_MAX;
    if (sized && done > f->size)
        return reel_fail(REEL_E_INTERNAL, "fetch: %" PRIu64 " bytes came of a %" PRIu64 "-byte file", done, f->size);
    if (f->asked < done) return reel_fail(REEL_E_INTERNAL, "fetch: asking at %" PRIu64 ", behind the %" PRIu64 " bytes that came", f->asked, done);
    if (f->asked - done > (uint64_t)WRK_FETCH_WINDOW * MSG_CHUNK_MAX)
        return reel_fail(REEL_E_INTERNAL, "fetch: %" PRIu64 " bytes asked ahead, more than %d chunks", f->asked - done, WRK_FETCH_WINDOW);
    if (done < 8 && (m->hdr || m->data)) return reel_fail(REEL_E_INTERNAL, "fetch: buffers before the header's length came");
    if (done >= 8) {
        if (!m->hdr || !m->data) return reel_fail(REEL_E_INTERNAL, "fetch: the header's length came but a buffer is missing");
        if (!sized || 8 + m->hlen + m->dlen != f->size)
            return reel_fail(REEL_E_INTERNAL, "fetch: 8 + %" PRIu64 " header + %" PRIu64 " data bytes is not the file's size",
                             m->hlen, m->dlen);
        if (m->cap < m->dlen) return reel_fail(REEL_E_INTERNAL, "fetch: a %zu-byte buffer for %" PRIu64 " data bytes", m->cap, m->dlen);
    }
    return 0;
}

/* Copies the n bytes at file offset off into m. -1 with the reason as
 * the message: a header length the file cannot hold (REEL_E_INVALID),
 * more data than the model holds (REEL_E_UNSUPPORTED), no memory. */
static int put(wrk_fetch_mem_t *m, uint64_t size, uint64_t off, const unsigned char *p, size_t n) {
    while (n) {
        size_t take;
        if (off < 8) {
            take = n < 8 - off ? n : (size_t)(8 - off);
            memcpy(m->len8 + off, p, take);
            if (off + take == 8) {
                for (int i = 7; i >= 0; i--) m->hlen = m->hlen << 8 | m->len8[i];
                if (m->hlen > size - 8 || m->hlen > (uint64_t)100 << 20)
                    return reel_fail(REEL_E_INVALID, "a header of %" PRIu64 " bytes in a %" PRIu64 "-byte file",
                                     m->hlen, size);
                m->dlen = size - 8 - m->hlen;
                if (m->max_data && m->dlen > m->max_data) /* as a file read by path is judged */
                    return reel_fail(REEL_E_UNSUPPORTED, "%" PRIu64 " data bytes, more than the model's %" PRIu64,
                                     m->dlen, m->max_data);
                if (m->dlen > SIZE_MAX || !(m->hdr = malloc(m->hlen ? (size_t)m->hlen : 1)) ||
                    !(m->data = data_buffer((size_t)m->dlen, m->spare, &m->cap)))
                    return reel_fail(REEL_E_NOMEM, "out of memory for %" PRIu64 " bytes", size);
            }
        } else if (off < 8 + m->hlen) {
            take = n < 8 + m->hlen - off ? n : (size_t)(8 + m->hlen - off);
            memcpy(m->hdr + (off - 8), p, take);
        } else {
            take = n;
            memcpy(m->data + (off - 8 - m->hlen), p, take);
        }
        off += take;
        p += take;
        n -= take;
    }
    return 0;
}

/* The whole file into m, hashed into hex. 0, or -1 as wrk_fetch fails. */
static int pull(wrk_fetch_t *f, wrk_fetch_mem_t *mem, const atomic_bool *stop, char hex[65]) {
    /* Every parameter, and room for the header: the most a file of this model holds. */
    uint64_t max_bytes = mem->max_data ? mem->max_data + 8 + ST_MAX_HEADER_BYTES : 0;
    reel_sha256_t *h = reel_sha256_new();
    uint64_t done = 0;
    int rc = -1;
    if (!h) return wrk_refuse(REEL_E_NOMEM, WRK_E_FETCH, "out of memory");
    for (int i = 0; i < WRK_FETCH_WINDOW; i++)
        if (ask(f) != 0) {
            wrk_refuse(REEL_E_IO, WRK_E_FETCH, "cannot send FETCH: %s", zmq_strerror(errno));
            goto out;
        }
    int64_t progress = now_ms(); /* when the last chunk came (or the fetch began) */
    for (;;) {
        WRK_CHECK(wrk_fetch_invariants(f, mem, done));
        if (done >= f->size) break;
        wire_msg_t m;
        msg_fetch_data_t d;
        int64_t left = progress + WRK_FETCH_TIMEOUT_MS - now_ms();
        int arc = left > 0 ? answer(f, stop, left < WRK_FETCH_RESEND_MS ? (int)left : WRK_FETCH_RESEND_MS, &m, &d) : 1;
        if (arc == 1) { /* silence */
            if (now_ms() - progress >= WRK_FETCH_TIMEOUT_MS) {
                wrk_refuse(REEL_E_TIMEOUT, WRK_E_FETCH,
                           "no answer from the broker in %d ms (at %" PRIu64 " of %" PRIu64
                           " bytes; asked again %u time(s), %u answer(s) dropped)",
                           WRK_FETCH_TIMEOUT_MS, done, f->size == UINT64_MAX ? 0 : f->size, f->reasked, f->dropped);
                goto out;
            }
            /* What was in flight may be lost: ask for the next chunk
             * again; its answer fills the window. */
            f->asked = done;
            f->reasked++;
            if (ask(f) != 0) {
                wrk_refuse(REEL_E_IO, WRK_E_FETCH, "cannot send FETCH: %s", zmq_strerror(errno));
                goto out;
            }
            continue;
        }
        if (arc == 2) {
            /* busy: a FETCH was not answered; a moment, then the chunk
             * needed next again (its answer fills the window). A broker
             * busy for ever ends at the timeout, as a silent one. */
            struct timespec pause = { 0, WRK_FETCH_BUSY_PAUSE_MS * 1000000L };
            nanosleep(&pause, NULL);
            f->asked = done;
            f->reasked++;
            if (ask(f) != 0) {
                wrk_refuse(REEL_E_IO, WRK_E_FETCH, "cannot send FETCH: %s", zmq_strerror(errno));
                goto out;
            }
            continue;
        }
        if (arc != 0) {
            if (stop && atomic_load(stop))
                wrk_refuse(REEL_E_STATE, WRK_E_STOPPED, "%s", reel_err()->msg);
            else
                wrk_refuse(reel_err_code(), WRK_E_FETCH, "%s", reel_err()->msg);
            goto out;
        }
        if (f->size == UINT64_MAX) {
            f->size = d.size;
            if (max_bytes && d.size > max_bytes) {
                wire_msg_close(&m);
                wrk_refuse(REEL_E_UNSUPPORTED, WRK_E_MODEL,
                           "the uploaded file is %" PRIu64 " bytes, more than %" PRIu64 " this model holds", d.size,
                           max_bytes);
                goto out;
            }
            if (d.size < 8) {
                wire_msg_close(&m);
                wrk_refuse(REEL_E_INVALID, WRK_E_FILE, "the uploaded file is %" PRIu64 " bytes: no safetensors file",
                           d.size);
                goto out;
            }
        }
        if (d.size == f->size && d.offset != done) {
            /* Not the chunk needed next: a re-asked chunk's second answer,
             * or one asked before a re-ask (even the first to come). */
            f->dropped++;
            wire_msg_close(&m);
            continue;
        }
        bool bad = d.size != f->size || d.offset != done || (d.chunk->bytes == 0 && done < f->size) ||
                   d.chunk->bytes > f->size - done;
        size_t n = d.chunk->bytes;
        bool kept = !bad && put(mem, f->size, done, d.chunk->data, n) == 0;
        if (kept) reel_sha256_update(h, d.chunk->data, n);
        wire_msg_close(&m);
        if (bad) {
            wrk_refuse(REEL_E_INVALID, WRK_E_FETCH, "answers out of order at %" PRIu64, done);
            goto out;
        }
        if (!kept) {
            wrk_refuse(reel_err_code(), reel_err_code() == REEL_E_UNSUPPORTED ? WRK_E_MODEL : WRK_E_FILE,
                       "%s at %" PRIu64, reel_err()->msg, done);
            goto out;
        }
        done += n;
        progress = now_ms();
        /* keep WRK_FETCH_WINDOW chunks asked ahead of what came (answers
         * to requests from before a re-ask may have carried it past) */
        if (f->asked < done) f->asked = done;
        while (f->asked < f->size && f->asked - done < (uint64_t)WRK_FETCH_WINDOW * MSG_CHUNK_MAX)
            if (ask(f) != 0) {
                wrk_refuse(REEL_E_IO, WRK_E_FETCH, "cannot send FETCH: %s", zmq_strerror(errno));
                goto out;
            }
    }
    rc = 0;
out:
    reel_sha256_final(&h, hex);
    return rc;
}

static void *connect_to(const wrk_fetch_src_t *src) {
    void *s = zmq_socket(src->zctx, ZMQ_DEALER);
    if (!s) return NULL;
    char ep[1024];
    if (wire_socket_limits(s) != 0 || reel_curve_apply(s, src->curve) != 0 ||
        wire_socket_endpoint(s, src->endpoint, ep, sizeof ep) != 0 || zmq_connect(s, ep) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

st_file_t *wrk_fetch(const wrk_fetch_src_t *src, const msg_sync_t *m, uint64_t max_data, const atomic_bool *stop,
                     char hex[65]) {
    hex[0] = '\0';
    if (!src || !src->zctx) {
        wrk_refuse(REEL_E_STATE, WRK_E_FETCH, "this worker cannot fetch from the broker");
        return NULL;
    }
    wrk_fetch_t f = { connect_to(src), m, 0, 0, UINT64_MAX, 0, 0 };
    wrk_fetch_mem_t mem;
    memset(&mem, 0, sizeof mem);
    mem.spare = src->spare;
    mem.max_data = max_data;
    st_file_t *out = NULL;
    char origin[MSG_NAME_MAX + 48];
    snprintf(origin, sizeof origin, "uploaded %s v%" PRIu64, m->component, m->version);
    if (!f.sock) {
        wrk_refuse(REEL_E_IO, WRK_E_FETCH, "cannot connect to the broker");
    } else if (pull(&f, &mem, stop, hex) == 0) {
        /* The data buffer goes to the file (freed by it, or on failure). */
        out = st_adopt(origin, mem.hdr, (size_t)mem.hlen, mem.data, (size_t)mem.dlen);
        if (out && src->spare) src->spare->cap = mem.cap; /* for st_take_data's buffer after */
        mem.data = NULL;
        if (!out) wrk_refuse(reel_err_code(), WRK_E_FILE, "the uploaded file: %s", reel_err_text());
    }
    if (src->reasked) *src->reasked = f.reasked;
    if (f.sock) zmq_close(f.sock);
    free(mem.hdr);
    if (mem.data && src->spare && !src->spare->p) { /* a failed fetch: its buffer serves the next */
        src->spare->p = mem.data;
        src->spare->cap = mem.cap;
    } else {
        free(mem.data);
    }
    return out;
}
