/* brk_broker.h -- the broker's state and the handlers of its routing loop
 * (internal header). One thread owns all of it: the loop (brk_loop.c)
 * receives a message, hands it to the handler of its type, and settles
 * (dispatch what can run, drop what died) before the next one. Only the
 * catalog writer runs elsewhere, fed through brk_catq.
 *
 *   brk_workers.c   READY / HEARTBEAT / DISCONNECT / EVENTS, liveness,
 *                   catch-up syncs, dropping a worker and requeueing its work
 *   brk_requests.c  GEN: validate, shard, queue, dispatch; PROGRESS, RESULT
 *                   and ERROR back to the client; deadlines
 *   brk_sync.c      SYNC from trainers, SYNC_ACK, the SYNC_DONE barrier
 *   brk_status.c    STATUS_REPLY
 *   brk_msg.c       headers copied between messages, sends to identities
 *   brk_loop.c      the poll loop, malformed messages, timers
 *   brk_main.c      options, signals, sockets, start and shutdown
 * and, outside the loop's state: brk_route (pure routing rules, unit
 * tested), brk_catq (the catalog writer), brk_opts, brk_log. */
#ifndef REEL_BROKER_BRK_BROKER_H
#define REEL_BROKER_BRK_BROKER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "broker/brk_catq.h"
#include "broker/brk_opts.h"
#include "broker/brk_route.h"
#include "schema/wire.h"

#define BRK_IDENT_MAX 256

/* A ROUTER routing identity, copied out of a message. */
typedef struct {
    unsigned char b[BRK_IDENT_MAX];
    size_t n;
} brk_ident_t;

/* One worker's progress on one component's syncs: what it was sent, and
 * why it is behind when it is (STATUS shows it as lagging with that
 * reason). */
typedef struct {
    char component[BRK_NAME_MAX];
    uint64_t sent;             /* newest SYNC version sent (or reported at READY) */
    bool waiting;              /* its ack of `sent` has not come, and no deadline passed */
    uint64_t failed;           /* the version `why` is about (0: none) */
    char why[128];             /* its error applying `failed`, or "no ack within the sync deadline" */
} brk_wsync_t;

typedef struct brk_worker {
    brk_peer_t route;          /* name, routable, capacity, models, applied versions */
    brk_ident_t ident;
    char device[32], arch[32];
    int streams;
    uint64_t budget;
    int64_t ready_ms;          /* monotonic ms of READY */
    int64_t seen_ms;           /* monotonic ms of the last message from it */
    bool dead;                 /* to be dropped by brk_settle */
    const char *dead_why;      /* "expired", "disconnect", "restarted" */
    brk_wsync_t syncs[BRK_MAX_COMPONENTS];
    int n_syncs;
    uint64_t keys[BRK_KEYS_RECENT];
    int n_keys;
} brk_worker_t;

typedef enum { REQ_QUEUED, REQ_INFLIGHT, REQ_ABANDONED } brk_req_state_t;

/* A GEN the broker accepted. `msg` is the client's message (identity,
 * header, tensor frames), kept whole so the request can be sent again
 * after its worker dies. */
typedef struct brk_req {
    uint64_t id;               /* the broker's request id (REQUEST "id") */
    uint64_t client_id;        /* the client's "id", echoed in every reply */
    wire_msg_t *msg;           /* owned; heap: tensor data points into it */
    uint64_t bytes;            /* its tensor bytes, counted in brk_t.held_bytes */
    char model[BRK_NAME_MAX];
    uint64_t shard;
    uint64_t required;         /* transformer version it must run on */
    int steps;
    bool progress;
    int64_t accepted_ms, deadline_ms;
    int losses;                /* workers that died holding it */
    bool had_owner;            /* some eligible worker existed at some point */
    brk_req_state_t state;
    brk_worker_t *worker;      /* INFLIGHT / ABANDONED: who runs it */
    struct brk_req *prev, *next; /* all live requests (brk_t.reqs) */
} brk_req_t;

/* The current SYNC of one component: the newest version at least one
 * live worker applied. Late joiners and lagging workers are caught up to
 * it; a GEN without "version" needs it. */
typedef struct {
    char component[BRK_NAME_MAX];
    uint64_t version;          /* 0 while no sync of it was ever applied */
    char sha256[65];
    uint64_t sync_id;          /* the broker's id for it (SYNC "id" to workers) */
    wire_msg_t *msg;           /* owned; NULL while version is 0 */
} brk_current_t;

typedef struct {
    char worker[BRK_NAME_MAX];
    int state;                 /* 0 waiting, 1 applied, 2 failed */
    char reason[128];
} brk_member_t;

/* Who asked for a barrier's SYNC_DONE (a trainer resending a SYNC still
 * running joins it instead of starting another). */
typedef struct {
    brk_ident_t ident;
    uint64_t id;
} brk_trainer_t;

/* One SYNC's barrier: the workers live when it arrived, and the trainers
 * to answer once each has applied it, failed, died or timed out. At most
 * one per (component, version). While the version is pending (no worker
 * applied it yet) the barrier owns its SYNC; the first ok ack makes it the
 * component's current one (msg moves to brk_current_t). A barrier ending
 * with msg still here changed nothing: the version failed. */
typedef struct brk_barrier {
    char component[BRK_NAME_MAX];
    uint64_t version;
    char sha256[65];
    uint64_t sync_id;
    wire_msg_t *msg;           /* owned while pending; NULL once current, or for a resend */
    brk_trainer_t *trainers;   /* owned */
    int n_trainers;
    int64_t deadline_ms;
    int n;
    brk_member_t *m;
    struct brk_barrier *next;
} brk_barrier_t;

typedef struct {
    brk_opts_t opt;
    void *ctx, *clients, *workers;   /* ZeroMQ context and ROUTER sockets */
    brk_catq_t *cat;

    brk_worker_t **w;                /* registered workers */
    int n_w, cap_w;
    brk_req_t *reqs;                 /* every live request */
    brk_queue_t queue;               /* REQ_QUEUED requests, FIFO */
    uint64_t next_id;
    uint64_t held_bytes;       /* tensor bytes of live requests (bounded: BUSY beyond) */
    brk_current_t cur[BRK_MAX_COMPONENTS];
    int n_cur;
    brk_barrier_t *barriers;

    int64_t next_heartbeat_ms;
    uint64_t malformed;              /* bad messages answered ERROR */
} brk_t;

/* ---- brk_msg.c ------------------------------------------------------------- */

int64_t brk_now_ms(void);
void brk_ident_from(brk_ident_t *id, const zmq_msg_t *msg);
/* Sends hdr + tensors to identity `to` on sock. 0, or -1 with errno. */
int brk_send_to(void *sock, const brk_ident_t *to, const wire_val_t *hdr, const wire_tensor_t *t,
                int n);
int brk_send_error_to(void *sock, const brk_ident_t *to, uint64_t id, const char *code,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* A deep copy of v. NULL on out-of-memory. */
wire_val_t *brk_wv_clone(const wire_val_t *v);
/* A new header {type, id} plus every field of src except proto, type, id
 * and tensors. NULL on out-of-memory. */
wire_val_t *brk_hdr_from(const wire_val_t *src, const char *type, uint64_t id);
/* As brk_send_to with src's tensor frames shared, not copied. */
int brk_forward_to(void *sock, const brk_ident_t *to, const wire_val_t *hdr, wire_msg_t *src);
/* "%016llx" of h into buf[17]. Returns buf. */
char *brk_hex(uint64_t h, char buf[17]);

/* ---- brk_workers.c --------------------------------------------------------- */

brk_worker_t *brk_worker_find(brk_t *b, const zmq_msg_t *identity);
brk_worker_t *brk_worker_named(brk_t *b, const char *name);
/* Handles one message on the worker socket (well-formed; routed by type). */
void brk_on_worker_msg(brk_t *b, wire_msg_t *m);
/* Sends every current SYNC newer than what w has and was sent. */
void brk_catch_up(brk_t *b, brk_worker_t *w);
/* w's sync progress on component (created when create is set). NULL when
 * there is none (or no room: components are capped at BRK_MAX_COMPONENTS). */
brk_wsync_t *brk_worker_sync(brk_worker_t *w, const char *component, bool create);
/* Forwards SYNC msg (component, version, broker id sync_id) to w and notes
 * it sent and awaiting its ack. 0, or -1 with the failure logged (w is
 * marked unreachable when its pipe is gone or full). */
int brk_sync_send(brk_t *b, brk_worker_t *w, const char *component, uint64_t version,
                  uint64_t sync_id, wire_msg_t *msg);
/* Sends HEARTBEAT to every worker when due; marks silent ones dead. */
void brk_worker_timers(brk_t *b, int64_t now);
/* Drops dead workers: catalog, barriers, requeue or fail their requests.
 * Returns how many were dropped. */
int brk_reap(brk_t *b);
/* Marks w unreachable after a failed send (it stays registered until it
 * speaks again or expires). */
void brk_worker_unreachable(brk_t *b, brk_worker_t *w, const char *what);

/* ---- brk_requests.c -------------------------------------------------------- */

/* GEN from a client. Takes ownership of *mp when it keeps the message
 * (sets *mp = NULL). */
void brk_on_gen(brk_t *b, wire_msg_t **mp);
/* PROGRESS / RESULT / ERROR from worker w. */
void brk_on_reply(brk_t *b, brk_worker_t *w, wire_msg_t *m);
/* Sends queued requests whose owner has room, oldest first. */
void brk_pump(brk_t *b);
/* A request held by a worker that died: requeue once, or ERROR
 * worker_lost. */
void brk_req_lost(brk_t *b, brk_req_t *r, const char *worker);
/* Answers expired requests (timeout / no_worker). */
void brk_req_timers(brk_t *b, int64_t now);
/* Answers every request ERROR internal (shutdown) and frees them all. */
void brk_req_shutdown(brk_t *b);
/* Earliest request deadline (INT64_MAX when none). */
int64_t brk_req_next_deadline(const brk_t *b);

/* ---- brk_sync.c ------------------------------------------------------------- */

void brk_on_sync(brk_t *b, wire_msg_t **mp);
/* Makes a sync recorded current in the catalog (by path) the component's
 * current one again: after a broker restart, late joiners are still caught
 * up, requests still need it and a resend of it is still an ack. 0, or -1
 * with a message. */
int brk_sync_restore(brk_t *b, const char *component, uint64_t version, const char *sha256,
                     const char *path);
void brk_on_sync_ack(brk_t *b, brk_worker_t *w, const wire_msg_t *m);
/* A worker was dropped: its pending barrier entries fail "worker lost". */
void brk_sync_worker_lost(brk_t *b, const char *worker);
void brk_sync_timers(brk_t *b, int64_t now);
int64_t brk_sync_next_deadline(const brk_t *b);
/* The current version of component (0 before any applied sync). */
uint64_t brk_current_version(const brk_t *b, const char *component);
/* Why w is behind the current version of component: NULL when it is not,
 * else a reason written into buf[0..len). */
const char *brk_sync_lag(const brk_t *b, const brk_worker_t *w, const char *component, char *buf,
                         size_t len);
void brk_sync_shutdown(brk_t *b);

/* ---- brk_status.c ------------------------------------------------------------ */

void brk_on_status(brk_t *b, const wire_msg_t *m);

/* ---- brk_loop.c --------------------------------------------------------------- */

/* Runs until *stop becomes nonzero (a signal). 0 on a clean stop, -1 when
 * polling failed (message logged). */
int brk_run(brk_t *b, volatile sig_atomic_t *stop);

#endif
