/* wrk_pipe.c -- the inproc pipe from worker threads to the main thread (see
 * wrk_pipe.h). */
#include "worker/wrk_pipe.h"

#include <errno.h>
#include <string.h>
#include "worker/wrk.h"

static void *pipe_socket(void *zctx, int type) {
    void *s = zmq_socket(zctx, type);
    if (!s) return NULL;
    int zero = 0;
    if (zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(s, type == ZMQ_PUSH ? ZMQ_SNDHWM : ZMQ_RCVHWM, &zero, sizeof zero) != 0) {
        int e = errno;
        zmq_close(s);
        errno = e;
        return NULL;
    }
    return s;
}

void *wrk_pipe_push_new(void *zctx) {
    void *s = pipe_socket(zctx, ZMQ_PUSH);
    if (s && zmq_connect(s, WRK_PIPE_ENDPOINT) != 0) {
        int e = errno;
        zmq_close(s);
        errno = e;
        return NULL;
    }
    return s;
}

void *wrk_pipe_pull_new(void *zctx) {
    void *s = pipe_socket(zctx, ZMQ_PULL);
    if (s && zmq_bind(s, WRK_PIPE_ENDPOINT) != 0) {
        int e = errno;
        zmq_close(s);
        errno = e;
        return NULL;
    }
    return s;
}

/* The tag travels in msg_send's identity slot: msg_send builds every part
 * before sending the first, so a failure never leaves a tag without its
 * message in the pipe. */
static int tag_msg(zmq_msg_t *msg, uint64_t epoch, bool droppable) {
    wrk_pipe_tag_t tag = { epoch, droppable };
    if (zmq_msg_init_size(msg, sizeof tag) != 0) return -1;
    memcpy(zmq_msg_data(msg), &tag, sizeof tag);
    return 0;
}

int wrk_pipe_send(void *push, uint64_t epoch, msg_type_t type, uint64_t id, const void *body) {
    zmq_msg_t tag;
    if (tag_msg(&tag, epoch, type == MSG_PROGRESS) != 0) return -1;
    int rc = msg_send(push, &tag, type, id, body, NULL);
    int e = errno;
    zmq_msg_close(&tag);
    errno = e;
    return rc;
}

int wrk_pipe_send_error(void *push, uint64_t epoch, uint64_t id, const char *code, const char *message) {
    zmq_msg_t tag;
    if (tag_msg(&tag, epoch, false) != 0) return -1;
    int rc = msg_send_error(push, &tag, id, code, "%s", message);
    int e = errno;
    zmq_msg_close(&tag);
    errno = e;
    return rc;
}

/* True when the part just received has more parts after it. */
static bool more(void *s) {
    int m = 0;
    size_t len = sizeof m;
    return zmq_getsockopt(s, ZMQ_RCVMORE, &m, &len) == 0 && m;
}

/* Sends parts[0..np) on out without waiting. 1 sent, 0 when out could
 * not take the first part (EAGAIN: nothing went), -1 otherwise (a part
 * after the first failed, or another error: what went is lost). The
 * parts are closed once sent; on 0 they stay as they were. */
static int send_parts(zmq_msg_t *parts, int np, void *out) {
    for (int i = 0; i < np; i++) {
        zmq_msg_t copy;
        zmq_msg_init(&copy);
        if (zmq_msg_copy(&copy, &parts[i]) != 0) {
            zmq_msg_close(&copy);
            return -1;
        }
        if (zmq_msg_send(&copy, out, (i + 1 < np ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
            int e = errno;
            zmq_msg_close(&copy);
            /* ZeroMQ takes a multipart message whole or not at all: a
             * first part refused means none went */
            if (i == 0 && e == EAGAIN) return 0;
            return -1;
        }
    }
    for (int i = 0; i < np; i++) zmq_msg_close(&parts[i]);
    return 1;
}

static void close_parts(zmq_msg_t *parts, int np) {
    for (int i = 0; i < np; i++) zmq_msg_close(&parts[i]);
}

int wrk_pipe_forward(void *pull, void *out, uint64_t epoch, int flags, wrk_pipe_held_t *held) {
    wrk_pipe_tag_t tag;
    int n = zmq_recv(pull, &tag, sizeof tag, flags);
    if (n < 0) return -1;
    bool keep = out && n == (int)sizeof tag && (tag.epoch == 0 || tag.epoch == epoch);
    /* The message's parts are all here already (never waits): taken
     * first, so that a large one (a RESULT with its tensors) goes after a
     * HEARTBEAT saying how large it is: nothing else of ours reaches the
     * broker until it has (docs/PROTOCOL.md, "incoming"). */
    enum { PARTS = 2 + WIRE_MAX_TENSORS };
    zmq_msg_t part[PARTS];
    int np = 0;
    uint64_t bytes = 0;
    bool whole = true;
    while (more(pull)) {
        zmq_msg_t p;
        zmq_msg_init(&p);
        if (zmq_msg_recv(&p, pull, 0) < 0) {
            zmq_msg_close(&p);
            whole = false;
            break;
        }
        bool last = !more(pull);
        if (np < PARTS) {
            if (np > 0) bytes += zmq_msg_size(&p);
            zmq_msg_init(&part[np]);
            zmq_msg_move(&part[np++], &p);
        } else { /* more parts than a message carries: not forwarded */
            keep = false;
        }
        zmq_msg_close(&p);
        if (last) break;
    }
    if (!whole) keep = false;
    if (!keep) {
        close_parts(part, np);
        return whole ? 0 : -1;
    }
    if (bytes >= MSG_HEADS_UP_BYTES) {
        wire_val_t *h = wire_hdr("HEARTBEAT", 0);
        /* best effort: a broker that is gone or full loses it, as below */
        if (h && wv_set(h, "incoming", wv_u64(bytes)) == 0) (void)wire_send(out, NULL, h, NULL, 0);
        wv_free(&h);
    }
    /* Never block on the broker. A PROGRESS it cannot take now is lost
     * (the next one says more); anything else is held for wrk_pipe_retry:
     * a full queue is a broker busy for a moment, and a RESULT dropped
     * there would leave its client waiting until the request's deadline
     * (a broker that is gone is found by the liveness, which ends the
     * session, and the broker requeues what it held). */
    int rc = send_parts(part, np, out);
    if (rc == 0 && held && !tag.droppable && held->np == 0) {
        for (int i = 0; i < np; i++) {
            zmq_msg_init(&held->part[i]);
            zmq_msg_move(&held->part[i], &part[i]);
            zmq_msg_close(&part[i]);
        }
        held->np = np;
        held->epoch = tag.epoch;
        return 2;
    }
    if (rc != 1) close_parts(part, np);
    return rc == 1 ? 1 : 0;
}

int wrk_pipe_retry(wrk_pipe_held_t *held, void *out, uint64_t epoch) {
    if (!held->np) return 1;
    if (!out || (held->epoch != 0 && held->epoch != epoch)) {
        wrk_pipe_held_clear(held);
        return 1;
    }
    int rc = send_parts(held->part, held->np, out);
    if (rc == 0) return 0;
    if (rc < 0) close_parts(held->part, held->np);
    held->np = 0;
    return 1;
}

void wrk_pipe_held_clear(wrk_pipe_held_t *held) {
    close_parts(held->part, held->np);
    held->np = 0;
}
