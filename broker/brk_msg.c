/* brk_msg.c -- the broker's leaf helpers (see brk_msg.h). */
#include "broker/brk_msg.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/brk_log.h"
#include "capture_cache/key.h"

double brk_unix_of(int64_t t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 - (double)(brk_now_ms() - t) / 1000.0;
}

int64_t brk_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void brk_undelivered(brk_t *b, const char *what) {
    b->undelivered++;
    if (b->undelivered <= 10 || b->undelivered % 1000 == 0)
        brk_log("%s not delivered (%llu so far): %s", what, (unsigned long long)b->undelivered,
                zmq_strerror(errno));
}

/* The budget of the peer at identity, refilled to now. */
static brk_bucket_t *bucket(brk_t *b, const zmq_msg_t *identity) {
    zmq_msg_t *m = (zmq_msg_t *)identity; /* zmq's getters are not const */
    uint64_t who = cap_hash_bytes(zmq_msg_data(m), zmq_msg_size(m));
    brk_bucket_t *k = &b->replies[who % BRK_REPLY_SLOTS];
    int64_t now = brk_now_ms();
    if (k->who != who) /* a new peer in this slot: a full budget */
        *k = (brk_bucket_t){ who, BRK_REPLY_BURST, now };
    k->tokens += (double)(now - k->at_ms) * (BRK_REPLY_RATE / 1000.0);
    if (k->tokens > BRK_REPLY_BURST) k->tokens = BRK_REPLY_BURST;
    k->at_ms = now;
    return k;
}

bool brk_reply_budget_left(brk_t *b, const zmq_msg_t *identity) { return bucket(b, identity)->tokens >= 1.0; }

bool brk_reply_allowed(brk_t *b, const zmq_msg_t *identity) {
    brk_bucket_t *k = bucket(b, identity);
    if (k->tokens >= 1.0) {
        k->tokens -= 1.0;
        return true;
    }
    b->replies_suppressed++;
    return false;
}

wire_msg_t *brk_msg_new(brk_t *b) {
    if (b->n_msg_pool) return b->msg_pool[--b->n_msg_pool];
    return malloc(sizeof(wire_msg_t));
}

void brk_msg_free(brk_t *b, wire_msg_t *m) {
    if (!m) return;
    wire_msg_close(m);
    if (b->n_msg_pool < BRK_MSG_POOL) b->msg_pool[b->n_msg_pool++] = m;
    else free(m);
}

brk_req_t *brk_req_new(brk_t *b) {
    brk_req_t *r = b->n_req_pool ? b->req_pool[--b->n_req_pool] : malloc(sizeof *r);
    if (r) memset(r, 0, sizeof *r);
    return r;
}

void brk_req_release(brk_t *b, brk_req_t *r) {
    if (!r) return;
    if (b->n_req_pool < BRK_REQ_POOL) b->req_pool[b->n_req_pool++] = r;
    else free(r);
}

void brk_msg_pool_free(brk_t *b) {
    while (b->n_msg_pool) free(b->msg_pool[--b->n_msg_pool]);
    while (b->n_req_pool) free(b->req_pool[--b->n_req_pool]);
}

void brk_ident_from(brk_ident_t *id, const zmq_msg_t *msg) {
    zmq_msg_t *m = (zmq_msg_t *)msg; /* zmq's getters are not const */
    size_t n = zmq_msg_size(m);
    id->n = n < sizeof id->b ? n : sizeof id->b; /* ZeroMQ identities are <= 255 bytes */
    memcpy(id->b, zmq_msg_data(m), id->n);
}

/* A zmq_msg_t holding identity `to`. -1 with errno. */
static int ident_msg(zmq_msg_t *m, const brk_ident_t *to) {
    if (zmq_msg_init_size(m, to->n) < 0) return -1;
    memcpy(zmq_msg_data(m), to->b, to->n);
    return 0;
}

int brk_send_heads_up(void *sock, const brk_ident_t *to, uint64_t bytes) {
    zmq_msg_t ident;
    if (ident_msg(&ident, to) < 0) return -1;
    wire_val_t *h = wire_hdr("HEARTBEAT", 0);
    int rc = h && wv_set(h, "incoming", wv_u64(bytes)) == 0 ? wire_send(sock, &ident, h, NULL, 0) : -1;
    int e = errno;
    wv_free(&h);
    zmq_msg_close(&ident);
    errno = e;
    return rc;
}

int brk_send(void *sock, const brk_ident_t *to, msg_type_t type, uint64_t id, const void *body,
             const wire_msg_t *share) {
    zmq_msg_t ident;
    if (ident_msg(&ident, to) < 0) return -1;
    int rc = msg_send(sock, &ident, type, id, body, share);
    int e = errno;
    zmq_msg_close(&ident);
    errno = e;
    return rc;
}

int brk_send_error(void *sock, const brk_ident_t *to, uint64_t id, const char *code, const char *fmt, ...) {
    zmq_msg_t ident;
    if (ident_msg(&ident, to) < 0) return -1;
    va_list ap;
    va_start(ap, fmt);
    int rc = msg_send_verror(sock, &ident, id, code, fmt, ap);
    va_end(ap);
    int e = errno;
    zmq_msg_close(&ident);
    errno = e;
    return rc;
}

bool brk_ident_eq(const brk_ident_t *a, const brk_ident_t *b) { return a->n == b->n && !memcmp(a->b, b->b, a->n); }

brk_worker_t *brk_worker_find(brk_t *b, const zmq_msg_t *identity) {
    brk_ident_t id;
    brk_ident_from(&id, identity);
    for (int i = 0; i < b->n_w; i++)
        if (brk_ident_eq(&b->w[i]->ident, &id)) return b->w[i];
    return NULL;
}

brk_worker_t *brk_worker_named(brk_t *b, const char *name) {
    for (int i = 0; i < b->n_w; i++)
        if (!strcmp(b->w[i]->route.name, name)) return b->w[i];
    return NULL;
}

void brk_worker_unreachable(brk_worker_t *w, const char *what) {
    if (!w->route.routable) return;
    w->route.routable = false;
    /* (within w's share: a worker that never reads, and speaks, is
     * reachable again and unreachable at each of its messages) */
    brk_log_limited(&w->log, w->route.name, "worker %s unreachable (%s send failed: %s)", w->route.name, what,
                    zmq_strerror(errno));
}

/* What a failed send to w means (see brk_worker_send). Returns -1. */
static int send_failed(brk_worker_t *w, msg_type_t type) {
    int e = errno;
    /* Only a transport failure says the worker is gone; a message the codec
     * refuses must not make every worker unroutable. */
    if (e == EHOSTUNREACH || e == EAGAIN) brk_worker_unreachable(w, msg_type_name(type));
    else brk_log("cannot send %s to %s: %s", msg_type_name(type), w->route.name, zmq_strerror(e));
    errno = e;
    return -1;
}

int brk_worker_send(brk_t *b, brk_worker_t *w, msg_type_t type, uint64_t id, const void *body,
                    const wire_msg_t *share) {
    if (brk_send(b->workers, &w->ident, type, id, body, share) == 0) return 0;
    return send_failed(w, type);
}

int brk_worker_forward(brk_t *b, brk_worker_t *w, const wire_msg_t *m, msg_type_t type, uint64_t id,
                       const msg_set_t *set, int n_set) {
    zmq_msg_t ident;
    if (ident_msg(&ident, &w->ident) < 0) return send_failed(w, type);
    int rc = msg_forward(b->workers, &ident, m, type, id, set, n_set);
    int e = errno;
    zmq_msg_close(&ident);
    errno = e;
    return rc == 0 ? 0 : send_failed(w, type);
}
