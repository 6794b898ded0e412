/* brk_loop.c -- the routing loop: one zmq_poll over the client and worker
 * ROUTERs with a timeout that wakes it for the next heartbeat or deadline.
 * Every message comes in through msg_recv and is dispatched here, by type,
 * as a decoded struct (schema/msg.h): a message that cannot be read is
 * answered ERROR (its code and message) to its sender and counted; one
 * whose fields are wrong is answered bad_request. Dead workers are dropped
 * here too, one clean-up for every way a worker dies. Nothing here waits
 * on SQLite (brk_catq does). */
#include "broker/brk_loop.h"
#include "broker/brk_metrics.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_check.h"
#include "broker/brk_ha.h"
#include "broker/brk_log.h"
#include "broker/brk_deliver.h"
#include "broker/brk_msg.h"
#include "broker/brk_requests.h"
#include "broker/brk_status.h"
#include "broker/brk_sync.h"
#include "broker/brk_upload.h"
#include "broker/brk_workers.h"
#include "broker/brk_zap.h"
#include "base/notify.h"

#define DRAIN_MAX 256 /* messages taken from one socket before looking at the other */
#define DRAIN_MS 20   /* ... or this long: heartbeats and deadlines are never starved */

/* Every body a peer may send, decoded in place. */
typedef union {
    msg_gen_t gen;
    msg_sync_t sync;
    msg_progress_t progress;
    msg_result_t result;
    msg_error_t error;
    msg_sync_ack_t ack;
    msg_ready_t ready;
    msg_events_t events;
    msg_upload_t upload;
    msg_fetch_t fetch;
    msg_peer_t peer;
    msg_cancel_t cancel;
} body_t;

int brk_reap(brk_t *b) {
    int dropped = 0;
    for (int i; (i = brk_workers_next_dead(b)) >= 0; dropped++) {
        brk_worker_t *w = brk_workers_unlink(b, i);
        b->metrics.workers_lost[brk_metrics_lost_kind(w->dead_why)]++;
        brk_sync_worker_lost(b, w);
        brk_req_worker_lost(b, w);
        free(w);
    }
    return dropped;
}

static void settle(brk_t *b) {
    brk_reap(b);
    brk_pump(b);
}

/* ---- clients ------------------------------------------------------------------ */

/* The answer to a bad message from a peer: sent while the peer's budget
 * of such answers lasts (brk_reply_allowed), else only counted. */
#define BAD_REPLY(b, worker_side, m, code, ...)                                              \
    do {                                                                                     \
        if (brk_reply_allowed((b), &(m)->identity))                                          \
            brk_error_to((b), (worker_side), &(m)->identity, (m)->id, (code), __VA_ARGS__); \
    } while (0)

static void on_client(brk_t *b, wire_msg_t **mp, body_t *u) {
    wire_msg_t *m = *mp;
    wire_err_t err;
    msg_type_t t = msg_type(m);
    /* One of a standby pair serves a GEN, SYNC or UPLOAD only while active
     * (brk_ha_client, after the decode: the request's key says whether a
     * client came back after trying the other broker); a standby answers
     * ERROR standby unless that makes it take over. */
    switch (t) {
    case MSG_PEER:
        if (msg_peer_decode(m, &u->peer, &err))
            BAD_REPLY(b, false, m, err.code, "PEER: %s", err.message);
        else
            brk_ha_peer(b, m, &u->peer);
        break;
    case MSG_GEN:
        if (msg_gen_decode(m, &u->gen, &err) || msg_gen_validate(&u->gen, NULL, &err))
            BAD_REPLY(b, false, m, err.code, "GEN: %s", err.message);
        else if (brk_ha_client(b, m, brk_ha_key_gen(&u->gen, m->id)))
            brk_req_accept(b, mp, &u->gen, brk_current_version(b, BRK_COMPONENT));
        break;
    case MSG_SYNC:
        /* A message carries at most 8 tensors and a model has more:
         * reel-worker reloads whole models from a file, so a SYNC with
         * inline tensors is refused rather than recorded as a version no
         * worker will ever reach. */
        if (msg_sync_decode(m, &u->sync, &err) || msg_sync_validate(&u->sync, false, &err)) {
            /* logged (and audited: brk_zap_admit) within the answers' budget */
            if (brk_reply_allowed(b, &m->identity)) {
                brk_log_kind(&b->refused_log, "SYNC refused", "SYNC refused: %s", err.message);
                brk_error_to(b, false, &m->identity, m->id, err.code, "SYNC: %s", err.message);
            }
        } else if (brk_ha_client(b, m, brk_ha_key_weights(u->sync.client, u->sync.component, u->sync.version, u->sync.sha256))) {
            brk_sync_request(b, &m->identity, m->id, &u->sync);
        }
        break;
    case MSG_UPLOAD: /* a trainer's: the gate checked the role */
        if (msg_upload_decode(m, &u->upload, &err) || msg_upload_validate(&u->upload, &err))
            BAD_REPLY(b, false, m, err.code, "UPLOAD: %s", err.message);
        else if (brk_ha_client(b, m, brk_ha_key_weights(u->upload.client, u->upload.component, u->upload.version,
                                                          u->upload.sha256)))
            brk_upload_chunk(b, &m->identity, m->id, &u->upload, m);
        break;
    case MSG_FETCH: /* the peer broker copying an uploaded version (the gate checked its key) */
        if (!b->ha)
            BAD_REPLY(b, false, m, WIRE_E_UNKNOWN,
                      "FETCH on the client socket is for the peer broker of a standby pair (workers fetch on the "
                      "worker socket)");
        else if (msg_fetch_decode(m, &u->fetch, &err))
            BAD_REPLY(b, false, m, err.code, "FETCH: %s", err.message);
        else
            brk_upload_fetch(b, false, &m->identity, m->id, &u->fetch);
        break;
    case MSG_CANCEL: /* no reply of its own: the GEN's final reply says */
        if (msg_cancel_decode(m, &u->cancel, &err))
            BAD_REPLY(b, false, m, err.code, "CANCEL: %s", err.message);
        else
            brk_req_cancel(b, m, &u->cancel);
        break;
    case MSG_STATUS:
        if (msg_decode(m, MSG_STATUS, NULL, &err))
            BAD_REPLY(b, false, m, err.code, "STATUS: %s", err.message);
        else
            brk_status_reply(b, &m->identity, m->id);
        break;
    default:
        BAD_REPLY(b, false, m, WIRE_E_UNKNOWN, "unknown message type '%.64s' on the client socket", m->type);
    }
}

/* ---- workers ------------------------------------------------------------------- */

/* READY: a worker registers. One from an identity already registered
 * means the worker restarted: the old registration is dropped first (its
 * in-flight work is gone with the old process). */
static void on_ready(brk_t *b, brk_worker_t *old, wire_msg_t *m, msg_ready_t *r) {
    wire_err_t err;
    if (msg_ready_decode(m, r, &err) || msg_ready_validate(r, &err)) {
        brk_log_limited(&b->ready_log, "READY", "READY refused: %s", err.message);
        BAD_REPLY(b, true, m, err.code, "READY: %s", err.message);
        return;
    }
    if (brk_workers_refuse(b, r->name, old) != 0) {
        brk_log_limited(&b->ready_log, "READY", "READY refused: %s", reel_err()->msg);
        if (brk_reply_allowed(b, &m->identity)) /* as BAD_REPLY */
            brk_error_from(b, true, &m->identity, m->id, reel_err(), "READY: "); /* invalid: bad_request */
        return;
    }
    brk_worker_shares_t kept = { { 0 }, { 0 } };
    const bool again = old != NULL;
    if (old) {
        /* A READY again does not buy fresh shares of the log, and its
         * lines come out of them: this loss and "ready" out of its READYs
         * again's, the PREWARM or catch-up SYNC it asks out of its own. A
         * worker that sent READY in a loop wrote three lines for each. */
        char who[BRK_NAME_MAX + 16];
        old->dead = true;
        old->dead_why = "restarted";
        brk_log_limited(&old->again_log, brk_workers_again_who(old, who, sizeof who), "worker %s lost (restarted)",
                        old->route.name);
        kept = (brk_worker_shares_t){ old->log, old->again_log };
        brk_reap(b);
    }
    brk_worker_t *w = brk_workers_add(b, &m->identity, r, again ? &kept : NULL);
    if (!w) {
        brk_log("out of memory registering worker %s", r->name);
        brk_error_to(b, true, &m->identity, m->id, WIRE_E_INTERNAL, "READY: broker out of memory");
        return;
    }
    brk_sync_joined(b, w);
    brk_workers_adopt_events(b, w);
    brk_workers_prewarm(b, w, brk_now_ms(), brk_current_version(b, BRK_COMPONENT));
}

/* A final reply that cannot be read still ends the request: the client is
 * answered internal rather than left waiting for its deadline. */
static void bad_reply(brk_t *b, brk_worker_t *w, const wire_msg_t *m, const wire_err_t *bad, msg_error_t *e) {
    BRK_WORKER_REFUSED(b, w, "worker %s sent a bad %s: %s", w->route.name, m->type, bad->message);
    snprintf(e->code, sizeof e->code, "%s", WIRE_E_INTERNAL);
    snprintf(e->message, sizeof e->message, "worker %s sent a bad %s: %s", w->route.name, m->type, bad->message);
    uint64_t counted = b->worker_refused; /* one message: counted once, also when it names no request it holds */
    brk_req_error(b, w, m->id, e);
    b->worker_refused = counted;
}

static void on_worker(brk_t *b, wire_msg_t *m, body_t *u) {
    if (!brk_ha_active(b)) { /* a standby registers no worker: READY is told to go to the other broker */
        brk_ha_worker(b, m);
        return;
    }
    brk_worker_t *w = brk_worker_find(b, &m->identity);
    msg_type_t t = msg_type(m);
    wire_err_t err;
    if (t == MSG_READY) {
        on_ready(b, w, m, &u->ready);
        return;
    }
    if (t == MSG_FETCH) { /* from any connection with a worker's key: a sync thread has its own */
        if (msg_fetch_decode(m, &u->fetch, &err) == 0) brk_upload_fetch(b, true, &m->identity, m->id, &u->fetch);
        else BAD_REPLY(b, true, m, err.code, "FETCH: %s", err.message);
        return;
    }
    if (!w) {
        if (t == MSG_DISCONNECT) return; /* already forgotten */
        if (t == MSG_EVENTS && msg_events_decode(m, &u->events, &err) == 0) /* recorded at its READY */
            brk_workers_keep_events(b, &m->identity, &u->events);
        /* A worker the broker forgot (it restarted, or expired the worker)
         * re-registers when told; anyone else is told no more often than
         * its budget allows. */
        if (!brk_reply_allowed(b, &m->identity)) return;
        if (msg_send(b->workers, &m->identity, MSG_RECONNECT, 0, NULL, NULL) == 0)
            brk_log_kind(&b->refused_log, "RECONNECT", "unknown worker sent %s: told to RECONNECT", m->type);
        else
            brk_undelivered(b, "RECONNECT");
        return;
    }
    /* It may have missed syncs while a send to it failed: a barrier's it
     * could not be sent, and catch-ups. */
    if (brk_workers_heard(b, w)) brk_sync_reachable(b, w);
    switch (t) {
    case MSG_HEARTBEAT: { /* "incoming": a large message from it follows, and nothing else of its until it has */
        uint64_t in = msg_heartbeat_incoming(m);
        if (in > 0) {
            /* Counted from now, never added after a grace still running:
             * one connection keeps order, so whatever an earlier HEARTBEAT
             * of this worker announced has come by now (or never will). A
             * worker that announced 60 messages and sent none was kept 60
             * messages' time, silent, with requests routed to it. (The
             * grace of a large REQUEST sent to it stays.) */
            const uint64_t most = (uint64_t)WIRE_MAX_FRAME / MSG_SLOW_BYTES_PER_MS;
            const int64_t until =
                brk_now_ms() + (int64_t)(in / MSG_SLOW_BYTES_PER_MS < most ? in / MSG_SLOW_BYTES_PER_MS : most);
            if (until > w->quiet_until_ms) w->quiet_until_ms = until;
        }
        break;
    }
    case MSG_DISCONNECT:
        w->dead = true;
        w->dead_why = "disconnect";
        break;
    case MSG_PROGRESS: /* (no answer: a PROGRESS ends nothing, and the worker has nothing to retry) */
        if (msg_progress_decode(m, &u->progress, &err) == 0) brk_req_progress(b, w, m->id, &u->progress);
        else BRK_WORKER_REFUSED(b, w, "worker %s sent a bad PROGRESS for request %llu (dropped): %s", w->route.name,
                                (unsigned long long)m->id, err.message);
        break;
    case MSG_RESULT:
        if (msg_result_decode(m, &u->result, &err) == 0) brk_req_result(b, w, m->id, &u->result, m);
        else bad_reply(b, w, m, &err, &u->error);
        break;
    case MSG_ERROR:
        if (msg_error_decode(m, &u->error, &err) == 0) brk_req_error(b, w, m->id, &u->error);
        else bad_reply(b, w, m, &err, &u->error);
        break;
    case MSG_SYNC_ACK:
        if (msg_sync_ack_decode(m, &u->ack, &err) == 0) {
            brk_sync_ack(b, w, m->id, &u->ack);
            brk_workers_prewarm(b, w, brk_now_ms(), brk_current_version(b, BRK_COMPONENT));
        } else {
            BRK_WORKER_REFUSED(b, w, "worker %s sent a bad SYNC_ACK (ignored): %s", w->route.name, err.message);
            BAD_REPLY(b, true, m, err.code, "SYNC_ACK: %s", err.message);
        }
        break;
    case MSG_EVENTS:
        if (msg_events_decode(m, &u->events, &err) == 0) brk_workers_events(b, w, &u->events);
        else BRK_WORKER_REFUSED(b, w, "worker %s sent bad EVENTS (dropped): %s", w->route.name, err.message);
        break;
    default:
        BAD_REPLY(b, true, m, WIRE_E_UNKNOWN, "unknown message type '%.64s' on the worker socket", m->type);
    }
}

/* ---- the loop ------------------------------------------------------------------------ */

/* The first ten, then one in a thousand: a fuzzing peer must not flood the
 * log, and the count is in STATUS_REPLY anyway. */
static void log_malformed(brk_t *b, bool worker_side, const wire_err_t *err) {
    b->malformed++;
    if (b->malformed <= 10 || b->malformed % 1000 == 0)
        brk_log("malformed message on the %s socket (%llu so far): %s: %s", worker_side ? "worker" : "client",
                (unsigned long long)b->malformed, err->code, err->message);
}

void brk_handle(brk_t *b, bool worker_side, wire_msg_t **mp, int rc, const wire_err_t *err) {
    wire_msg_t *m = *mp;
    b->handling_ms = brk_now_ms(); /* (the time spent on this message is no peer's silence) */
    body_t u; /* on the stack: no allocation per message */
    if (rc == 1) log_malformed(b, worker_side, err); /* counted whoever sent it (STATUS malformed) */
    if (!brk_zap_admit(b, worker_side, m, rc == 1 ? err : NULL)) return; /* keys and roles */
    if (rc == 1) {
        if (m->has_identity) {
            brk_worker_t *w = worker_side ? brk_worker_find(b, &m->identity) : NULL;
            if (w) w->seen_ms = brk_now_ms(); /* any message proves it alive */
            /* On the worker socket only a registered worker is answered:
             * junk from anyone else is counted and dropped. */
            if (worker_side && !w) b->replies_suppressed++;
            else BAD_REPLY(b, worker_side, m, err->code, "%s", err->message);
            /* A final reply that cannot be read still ends its request
             * (only one this worker holds: held_by checks), also when its
             * header broke after its id and type (trailing bytes, a
             * duplicate key): its client waited its deadline out before. */
            const char *ty = wire_msg_type_read(m);
            if (w && m->id && ty && (!strcmp(ty, "RESULT") || !strcmp(ty, "ERROR"))) {
                snprintf(u.error.code, sizeof u.error.code, "%s", WIRE_E_INTERNAL);
                snprintf(u.error.message, sizeof u.error.message, "worker %s sent a bad %s: %s", w->route.name,
                         ty, err->message);
                uint64_t counted = b->worker_refused; /* (counted as malformed above, not twice) */
                brk_req_error(b, w, m->id, &u.error);
                b->worker_refused = counted;
            }
        }
    } else if (worker_side) {
        on_worker(b, m, &u);
    } else {
        on_client(b, mp, &u);
    }
    settle(b);
    BRK_CHECK_INVARIANTS(b, worker_side ? "a message on the worker socket" : "a message on the client socket");
}

/* Handles up to DRAIN_MAX messages waiting on one socket, each received
 * into *spare: one message struct serves every message until a GEN is
 * accepted and keeps it (brk_handle takes it), and only then is another
 * allocated. -1 on a socket error other than EAGAIN/EINTR. */
static int drain(brk_t *b, bool worker_side, wire_msg_t **spare) {
    void *sock = worker_side ? b->workers : b->clients;
    int64_t until = brk_now_ms() + DRAIN_MS;
    /* the clock after every message (a vDSO read): one UPLOAD or FETCH
     * chunk costs milliseconds, 16 of them under a sanitizer or on a busy
     * machine outlasted a worker's liveness */
    for (int i = 0; i < DRAIN_MAX && (i == 0 || brk_now_ms() < until); i++) {
        if (!*spare && !(*spare = brk_msg_new(b))) return 0; /* try again at the next poll */
        wire_err_t err;
        int rc = msg_recv(sock, true, ZMQ_DONTWAIT, *spare, &err);
        if (rc < 0) {
            int e = errno;
            if (e == EAGAIN || e == EINTR) return 0;
            if (e == ETERM) return -1;
            brk_log("receive failed: %s", zmq_strerror(e));
            return 0;
        }
        brk_handle(b, worker_side, spare, rc, &err);
        if (*spare) wire_msg_close(*spare);
    }
    return 0;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* What the log's budgets left out, once their window ends: said now, not
 * only with the next line of their kind (which may never come). */
static void log_summaries(brk_t *b) {
    brk_log_kinds_summary(&b->refused_log);
    brk_log_kinds_summary(&b->request_log);
    brk_log_summary(&b->ready_log, "READY");
    brk_log_summary(&b->orphan_log, "EVENTS");
    brk_log_summary(&b->resend_log, BRK_SYNC_RESENDS);
    brk_workers_log_summaries(b);
}

int brk_run(brk_t *b, volatile sig_atomic_t *stop) {
    void *ha = brk_ha_socket(b), *worker_mon = brk_zap_monitor(b->zap, true);
    zmq_pollitem_t items[5] = {
        { b->clients, 0, ZMQ_POLLIN, 0 },
        { b->workers, 0, ZMQ_POLLIN, 0 },
        { ha, 0, ZMQ_POLLIN, 0 }, /* one of a pair: the answers of its peer */
        { brk_zap_monitor(b->zap, false), 0, ZMQ_POLLIN, 0 }, /* with keys: handshakes that failed */
        { worker_mon, 0, ZMQ_POLLIN, 0 },
    };
    int n_items = 0;
    for (int i = 0; i < 5; i++) /* the sockets there are, in this order */
        if (items[i].socket) items[n_items++] = items[i];
    b->next_heartbeat_ms = brk_now_ms() + b->opt.heartbeat_ms;
    wire_msg_t *spare = NULL;
    int ret = 0;
    while (!*stop) {
        int64_t now = brk_now_ms();
        int64_t next = min64(b->next_heartbeat_ms, min64(brk_req_next_deadline(b), brk_sync_next_deadline(b)));
        if (b->metrics.http) next = min64(next, b->metrics.next_publish_ms);
        next = min64(next, brk_ha_next_wake(b));
        next = min64(next, brk_deliver_next_wake(b, now)); /* answers held for a full client queue */
        long timeout = next <= now ? 0 : (long)min64(next - now, b->opt.heartbeat_ms);
        int rc = zmq_poll(items, n_items, timeout);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            if (zmq_errno() == ETERM) break;
            brk_log("poll failed: %s", zmq_strerror(zmq_errno()));
            ret = -1;
            break;
        }
        if ((items[1].revents & ZMQ_POLLIN) && drain(b, true, &spare) < 0) break;
        int64_t t0 = brk_now_ms();
        if ((items[0].revents & ZMQ_POLLIN) && drain(b, false, &spare) < 0) break;
        /* Clients' messages that took a heartbeat or more (a 256 MiB GEN
         * checked): what the workers sent meanwhile is read before the
         * timers, so the broker's own stall is no worker's silence. */
        if (brk_now_ms() - t0 >= b->opt.heartbeat_ms && drain(b, true, &spare) < 0) break;
        for (int i = 2; i < n_items; i++) {
            if (!(items[i].revents & ZMQ_POLLIN)) continue;
            if (items[i].socket == ha) brk_ha_answers(b);
            else brk_zap_monitor_read(b->zap, items[i].socket == worker_mon);
        }
        now = brk_now_ms();
        brk_deliver_retry(b, now); /* what a client's full queue could not take, as it can */
        if (now >= b->next_heartbeat_ms) reel_notify("WATCHDOG=1"); /* systemd: the loop is alive */
        brk_workers_timers(b, now, brk_current_version(b, BRK_COMPONENT));
        brk_req_timers(b, now);
        brk_sync_timers(b, now);
        brk_upload_timers(b, now);
        brk_ha_timers(b, now);
        log_summaries(b);
        settle(b);
        BRK_CHECK_INVARIANTS(b, "the timers");
        brk_metrics_publish(b, now);
    }
    brk_msg_free(b, spare); /* empty: closed after its last message */
    return ret;
}
