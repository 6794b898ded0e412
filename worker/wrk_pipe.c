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
static int tag_msg(zmq_msg_t *msg, uint64_t epoch) {
    wrk_pipe_tag_t tag = { epoch };
    if (zmq_msg_init_size(msg, sizeof tag) != 0) return -1;
    memcpy(zmq_msg_data(msg), &tag, sizeof tag);
    return 0;
}

int wrk_pipe_send(void *push, uint64_t epoch, msg_type_t type, uint64_t id, const void *body) {
    zmq_msg_t tag;
    if (tag_msg(&tag, epoch) != 0) return -1;
    int rc = msg_send(push, &tag, type, id, body, NULL);
    int e = errno;
    zmq_msg_close(&tag);
    errno = e;
    return rc;
}

int wrk_pipe_send_error(void *push, uint64_t epoch, uint64_t id, const char *code, const char *message) {
    zmq_msg_t tag;
    if (tag_msg(&tag, epoch) != 0) return -1;
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

int wrk_pipe_forward(void *pull, void *out, uint64_t epoch, int flags) {
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
    if (keep && bytes >= MSG_HEADS_UP_BYTES) {
        wire_val_t *h = wire_hdr("HEARTBEAT", 0);
        /* best effort: a broker that is gone or full loses it, as below */
        if (h && wv_set(h, "incoming", wv_u64(bytes)) == 0) (void)wire_send(out, NULL, h, NULL, 0);
        wv_free(&h);
    }
    /* Never block on the broker: a peer that is gone or full loses the
     * message (the broker requeues what it does not hear back about). */
    for (int i = 0; i < np; i++) {
        if (keep && zmq_msg_send(&part[i], out, (i + 1 < np ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) keep = false;
        zmq_msg_close(&part[i]);
    }
    if (!whole) return -1;
    return keep ? 1 : 0;
}
