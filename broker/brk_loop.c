/* brk_loop.c -- the routing loop: one zmq_poll over the client and worker
 * ROUTERs with a timeout that wakes it for the next heartbeat or deadline.
 * Every message goes through wire_recv; a malformed one is answered ERROR
 * (its code and message) to its sender and counted, and the loop goes on.
 * After each message and each timer pass the broker settles: dead workers
 * are dropped (their work requeued) and queued requests that can run are
 * sent. Nothing here waits on SQLite (brk_catq does). */
#include "broker/brk_broker.h"
#include "schema/notify.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_log.h"

#define DRAIN_MAX 256 /* messages taken from one socket before looking at the other */

static void settle(brk_t *b) {
    brk_reap(b);
    brk_pump(b);
}

static void on_client_msg(brk_t *b, wire_msg_t **mp) {
    wire_msg_t *m = *mp;
    if (!strcmp(m->type, "GEN")) brk_on_gen(b, mp);
    else if (!strcmp(m->type, "SYNC")) brk_on_sync(b, mp);
    else if (!strcmp(m->type, "STATUS")) brk_on_status(b, m);
    else
        wire_send_error(b->clients, &m->identity, m->id, WIRE_E_UNKNOWN,
                        "unknown message type '%.64s' on the client socket", m->type);
}

/* The first ten, then one in a thousand: a fuzzing peer must not flood the
 * log, and the count is in STATUS_REPLY anyway. */
static void log_malformed(brk_t *b, bool worker_side, const wire_err_t *err) {
    b->malformed++;
    if (b->malformed <= 10 || b->malformed % 1000 == 0)
        brk_log("malformed message on the %s socket (%llu so far): %s: %s",
                worker_side ? "worker" : "client", (unsigned long long)b->malformed, err->code,
                err->message);
}

/* Handles up to DRAIN_MAX messages waiting on one socket. -1 on a socket
 * error other than EAGAIN/EINTR. */
static int drain(brk_t *b, bool worker_side) {
    void *sock = worker_side ? b->workers : b->clients;
    for (int i = 0; i < DRAIN_MAX; i++) {
        wire_msg_t *m = malloc(sizeof *m);
        if (!m) return 0; /* try again at the next poll */
        wire_err_t err;
        int rc = wire_recv(sock, true, ZMQ_DONTWAIT, m, &err);
        if (rc < 0) {
            int e = errno;
            free(m);
            if (e == EAGAIN || e == EINTR) return 0;
            if (e == ETERM) return -1;
            brk_log("receive failed: %s", zmq_strerror(e));
            return 0;
        }
        if (rc == 1) {
            log_malformed(b, worker_side, &err);
            if (m->has_identity) {
                if (worker_side) {
                    brk_worker_t *w = brk_worker_find(b, &m->identity);
                    if (w) w->seen_ms = brk_now_ms(); /* any message proves it alive */
                }
                wire_send_error(sock, &m->identity, m->id, err.code, "%s", err.message);
            }
        } else if (worker_side) {
            brk_on_worker_msg(b, m);
        } else {
            on_client_msg(b, &m);
        }
        if (m) {
            wire_msg_close(m);
            free(m);
        }
        settle(b);
    }
    return 0;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int brk_run(brk_t *b, volatile sig_atomic_t *stop) {
    zmq_pollitem_t items[2] = {
        { b->clients, 0, ZMQ_POLLIN, 0 },
        { b->workers, 0, ZMQ_POLLIN, 0 },
    };
    b->next_heartbeat_ms = brk_now_ms() + b->opt.heartbeat_ms;
    while (!*stop) {
        int64_t now = brk_now_ms();
        int64_t next = min64(b->next_heartbeat_ms,
                             min64(brk_req_next_deadline(b), brk_sync_next_deadline(b)));
        long timeout = next <= now ? 0 : (long)min64(next - now, b->opt.heartbeat_ms);
        int rc = zmq_poll(items, 2, timeout);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            if (zmq_errno() == ETERM) return 0;
            brk_log("poll failed: %s", zmq_strerror(zmq_errno()));
            return -1;
        }
        if ((items[1].revents & ZMQ_POLLIN) && drain(b, true) < 0) return 0;
        if ((items[0].revents & ZMQ_POLLIN) && drain(b, false) < 0) return 0;
        now = brk_now_ms();
        if (now >= b->next_heartbeat_ms) reel_notify("WATCHDOG=1"); /* systemd: the loop is alive */
        brk_worker_timers(b, now);
        brk_req_timers(b, now);
        brk_sync_timers(b, now);
        settle(b);
    }
    return 0;
}
