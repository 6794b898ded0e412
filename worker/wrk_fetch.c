/* wrk_fetch.c -- fetching an uploaded weights file from the broker (see
 * wrk_fetch.h). The broker answers FETCH in order on one connection, so
 * the answers come back as the requests went: WRK_FETCH_WINDOW of them
 * are kept in flight, each answer is written at its offset and hashed in
 * turn, and the next request goes out. */
#include "worker/wrk_fetch.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "kernels/error.h"
#include "schema/sha256.h"
#include "worker/wrk_weights.h"

typedef struct {
    void *sock;
    const msg_sync_t *m;
    uint64_t next_id;
    uint64_t asked;              /* the offset the next FETCH asks for */
    uint64_t size;               /* the file's, from the first answer; UINT64_MAX before */
    int in_flight;
} fetch_t;

static int fail(char *err, size_t errlen, char *wire, size_t wlen, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int fail(char *err, size_t errlen, char *wire, size_t wlen, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    snprintf(wire, wlen, "%s", code);
    return -1;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Asks for the chunk at f->asked. 0, or -1 (errno). */
static int ask(fetch_t *f) {
    msg_fetch_t q;
    memset(&q, 0, sizeof q);
    snprintf(q.component, sizeof q.component, "%s", f->m->component);
    q.version = f->m->version;
    snprintf(q.sha256, sizeof q.sha256, "%s", f->m->sha256);
    q.offset = f->asked;
    q.max = MSG_CHUNK_MAX;
    if (msg_fetch_send(f->sock, NULL, ++f->next_id, &q) != 0) return -1;
    f->asked += MSG_CHUNK_MAX;
    f->in_flight++;
    return 0;
}

/* The next answer, within the timeout and while not stopping: 0 with *m
 * (a FETCH_DATA whose fields and chunk are checked), -1 with the reason. */
static int answer(fetch_t *f, const atomic_bool *stop, wire_msg_t *m, msg_fetch_data_t *d, char *why, size_t len) {
    int64_t deadline = now_ms() + WRK_FETCH_TIMEOUT_MS;
    for (;;) {
        if (stop && atomic_load(stop)) return snprintf(why, len, "stopping"), -1;
        int64_t left = deadline - now_ms();
        if (left <= 0) return snprintf(why, len, "no answer from the broker in %d ms", WRK_FETCH_TIMEOUT_MS), -1;
        zmq_pollitem_t it = { f->sock, 0, ZMQ_POLLIN, 0 };
        if (zmq_poll(&it, 1, left < 200 ? (long)left : 200) <= 0) continue;
        wire_err_t e;
        int rc = msg_recv(f->sock, false, ZMQ_DONTWAIT, m, &e);
        if (rc < 0) continue;
        if (rc == 1) return snprintf(why, len, "an unreadable answer: %s", e.message), -1;
        f->in_flight--;
        if (msg_type(m) == MSG_ERROR) {
            msg_error_t er;
            if (msg_error_decode(m, &er, &e) == 0) snprintf(why, len, "the broker answered %s: %.300s", er.code, er.message);
            else snprintf(why, len, "the broker answered ERROR");
            wire_msg_close(m);
            return -1;
        }
        if (msg_type(m) != MSG_FETCH_DATA || msg_fetch_data_decode(m, d, &e) != 0 ||
            msg_fetch_data_validate(d, &e) != 0) {
            snprintf(why, len, "a bad answer %s: %s", m->type, msg_type(m) == MSG_FETCH_DATA ? e.message : "");
            wire_msg_close(m);
            return -1;
        }
        return 0;
    }
}

/* The whole file into fd, hashed into hex. 0, or -1 with err/wire. */
static int pull(fetch_t *f, int fd, uint64_t max_bytes, const atomic_bool *stop, char hex[65], char *wire, size_t wlen,
                char *err, size_t errlen) {
    reel_sha256_t *h = reel_sha256_new();
    uint64_t done = 0;
    int rc = -1;
    if (!h) return fail(err, errlen, wire, wlen, WRK_E_FETCH, "out of memory");
    for (int i = 0; i < WRK_FETCH_WINDOW; i++)
        if (ask(f) != 0) {
            fail(err, errlen, wire, wlen, WRK_E_FETCH, "cannot send FETCH: %s", zmq_strerror(errno));
            goto out;
        }
    while (done < f->size) {
        wire_msg_t m;
        msg_fetch_data_t d;
        char why[400];
        if (answer(f, stop, &m, &d, why, sizeof why) != 0) {
            fail(err, errlen, wire, wlen, stop && atomic_load(stop) ? WRK_E_STOPPED : WRK_E_FETCH, "%s", why);
            goto out;
        }
        if (f->size == UINT64_MAX) {
            f->size = d.size;
            if (max_bytes && d.size > max_bytes) {
                wire_msg_close(&m);
                fail(err, errlen, wire, wlen, WRK_E_MODEL, "the uploaded file is %" PRIu64 " bytes, more than %" PRIu64
                     " this model holds", d.size, max_bytes);
                goto out;
            }
        }
        bool bad = d.size != f->size || d.offset != done || (d.chunk->bytes == 0 && done < f->size);
        size_t n = d.chunk->bytes;
        bool wrote = !bad && pwrite(fd, d.chunk->data, n, (off_t)done) == (ssize_t)n;
        if (wrote) reel_sha256_update(h, d.chunk->data, n);
        wire_msg_close(&m);
        if (bad || !wrote) {
            fail(err, errlen, wire, wlen, WRK_E_FETCH, "%s at %" PRIu64, bad ? "answers out of order" : strerror(errno),
                 done);
            goto out;
        }
        done += n;
        if (f->asked < f->size && ask(f) != 0) {
            fail(err, errlen, wire, wlen, WRK_E_FETCH, "cannot send FETCH: %s", zmq_strerror(errno));
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
    if (wire_socket_limits(s) != 0 || reel_curve_apply(s, src->curve) != 0 || zmq_connect(s, src->endpoint) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

st_file_t *wrk_fetch(const wrk_fetch_src_t *src, const msg_sync_t *m, uint64_t max_bytes, const atomic_bool *stop,
                     char hex[65], char *wire, size_t wlen, char *err, size_t errlen) {
    hex[0] = '\0';
    if (!src || !src->zctx) {
        fail(err, errlen, wire, wlen, WRK_E_FETCH, "this worker cannot fetch from the broker");
        return NULL;
    }
    const char *tmp = getenv("TMPDIR");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/reel-worker-fetch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fail(err, errlen, wire, wlen, WRK_E_FETCH, "cannot create a temporary directory: %s", strerror(errno));
        return NULL;
    }
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    fetch_t f = { connect_to(src), m, 0, 0, UINT64_MAX, 0 };
    st_file_t *out = NULL;
    if (fd < 0 || !f.sock) {
        fail(err, errlen, wire, wlen, WRK_E_FETCH, "%s", fd < 0 ? strerror(errno) : "cannot connect to the broker");
    } else if (pull(&f, fd, max_bytes, stop, hex, wire, wlen, err, errlen) == 0 && !(out = st_open(path))) {
        fail(err, errlen, wire, wlen, WRK_E_FILE, "the uploaded file: %s", kern_error());
    }
    if (f.sock) zmq_close(f.sock);
    if (fd >= 0) close(fd);
    unlink(path); /* open or not, nobody else ever reads it */
    rmdir(dir);
    return out;
}
