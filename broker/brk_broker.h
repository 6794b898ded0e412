/* brk_broker.h -- the broker's state (internal header): the types every
 * broker module shares, and nothing else. One thread owns all of it.
 *
 * The modules form a tree (no module calls or includes one beside it):
 *
 *   brk_main.c      options, signals, sockets, start and shutdown
 *    brk_loop.c     the poll loop: every message is received, decoded
 *     |             (schema/msg.h), answered when bad, and dispatched here;
 *     |             dead workers are dropped here (one clean-up for all)
 *     +- brk_requests.c  GEN: shard, queue, dispatch; PROGRESS, RESULT and
 *     |                  ERROR back to the client; deadlines
 *     +- brk_workers.c   READY, liveness and heartbeats, EVENTS, PREWARM
 *     |                  (the hot keys a starting worker owns: brk_hot.c)
 *     +- brk_sync.c      SYNC, SYNC_ACK, barriers, current versions,
 *     |                  catching workers up
 *     +- brk_status.c    STATUS_REPLY (reads the state; asks brk_sync why a
 *     |                  worker lags)
 *     +- brk_ha.c        a standby pair: PEER both ways, the fencing rule,
 *                        taking over (the peer's versions: brk_sync) and
 *                        stepping down (brk_requests, brk_sync give up)
 *   leaves, used by any of them: brk_msg.c (clock, identities, sends,
 *   looking workers up), brk_deliver.c (sends to clients: an answer a
 *   full queue cannot take is held until it can), brk_route.c (pure routing rules), brk_catq.c (the
 *   catalog writer thread), brk_upload.c (weights by value: UPLOAD into
 *   --weights-dir, FETCH out of it; one module in files by phase, each
 *   calling only those after it: brk_upload.c the core, brk_upload_recv.c
 *   UPLOAD, brk_upload_hash.c its hashing thread, brk_upload_serve.c
 *   FETCH, brk_upload_prune.c removals and spares, brk_upload_files.c
 *   names and look-ups; brk_upload_int.h), brk_zap.c, brk_opts.c,
 *   brk_log.c.
 *   brk_check.c, the invariants (brk_check.h), reads the state the
 *   modules own; the loop runs it after every message and timer pass in
 *   builds with -DREEL_INVARIANTS.
 *
 * tests/cli_broker_graph.sh checks that the objects' calls keep this
 * shape. */
#ifndef REEL_BROKER_BRK_BROKER_H
#define REEL_BROKER_BRK_BROKER_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "broker/brk_log.h"
#include "broker/brk_counters.h"
#include "broker/brk_catq.h"
#include "broker/brk_opts.h"
#include "broker/brk_hot.h"
#include "broker/brk_route.h"
#include "net/keys.h"
#include "schema/msg.h"

#define BRK_IDENT_MAX 256
#define BRK_HEARD_EVERY_MS 60000 /* a live worker's catalog last_seen moves at most this often */

/* A ROUTER routing identity, copied out of a message. */
typedef struct {
    unsigned char b[BRK_IDENT_MAX];
    size_t n;
} brk_ident_t;

/* One worker's progress on one component's syncs: what it was sent, and
 * why it is behind when it is (STATUS shows it as lagging with that
 * reason). */
#define BRK_SENT_KEPT 8            /* versions of one component a worker's acks are checked against */

typedef struct {
    char component[BRK_NAME_MAX];
    uint64_t sent;             /* newest SYNC version sent (or reported at READY) */
    uint64_t sent_id;          /* the id of the SYNC that sent it (0: reported at READY) */
    /* The versions it was sent (or reported at READY), the last
     * BRK_SENT_KEPT of them, a ring at n_sent % BRK_SENT_KEPT: an ack of
     * any other is refused (a worker sent v5 acking v3, never sent, was
     * recorded as running v3). More than BRK_SENT_KEPT SYNCs unacked at
     * once would take an old one's ack for never sent: logged, and its
     * later acks come in turn. */
    uint64_t sent_v[BRK_SENT_KEPT];
    unsigned n_sent;
    bool waiting;              /* its ack of `sent` has not come, and no deadline passed */
    uint64_t failed;           /* the version `why` is about (0: none) */
    char why[128];             /* its error applying `failed`, or "no ack within the sync deadline" */
} brk_wsync_t;

typedef struct brk_worker {
    brk_peer_t route;          /* name, routable, capacity, models, applied versions */
    brk_ident_t ident;
    char device[32], arch[32];
    char text_encoder[MSG_NAME_MAX], vae[MSG_NAME_MAX]; /* its READY's ("": none), shown in STATUS */
    int streams;
    uint64_t budget;
    int64_t ready_ms;          /* monotonic ms of READY */
    int64_t seen_ms;           /* monotonic ms of the last message from it */
    int64_t quiet_until_ms;    /* not expired for silence before this: a large REQUEST went to it */
    int64_t heard_ms;          /* monotonic ms of its last catalog worker_heard (or READY) */
    bool dead;                 /* to be dropped by brk_settle */
    const char *dead_why;      /* "expired", "disconnect", "restarted" */
    brk_wsync_t syncs[BRK_MAX_COMPONENTS];
    int n_syncs;
    uint64_t keys[BRK_KEYS_RECENT];
    int n_keys;
    int prewarm_want;          /* READY "prewarm": hot keys it asked for (0: none) */
    int64_t max_tokens;        /* READY "max_tokens": the most tokens a sample may have there (0: any) */
    bool prewarm_sent;         /* its PREWARM went out (once its join syncs were answered) */
    msg_model_t configs[BRK_MAX_MODELS]; /* what READY said of its models */
    int n_configs;
    char key[41];              /* its CURVE public key (z85); "" without keys (brk_zap.h) */
    reel_log_budget_t log;     /* what its faulty messages, and what it can repeat (acks, catch-up
                                * SYNCs and PREWARMs its READYs again ask, its toggles between
                                * unreachable and reachable again) may write to the log
                                * (brk_log_limited; summed up as "NAME: N more lines ...") */
    reel_log_budget_t again_log; /* its READYs again (restarts): "lost (restarted)" and "ready"
                                * ("NAME READYs again: N more lines ..."); apart, so its faults
                                * leave a restart its lines. Both are kept across a READY again */
} brk_worker_t;

/* A worker's shares of the log, handed from a registration to the one
 * its READY again makes. */
typedef struct {
    reel_log_budget_t log, again_log;
} brk_worker_shares_t;

/* Whether a sample of `latent` [C,F,H,W] of `model` fits w's
 * --max-tokens (READY max_tokens): F x H/p x W/p with the patch p of w's
 * config of the model. True when w announced no bound or no such config
 * (not judged). Routing (brk_requests.c) and prewarm ownership
 * (brk_workers.c) use it alike. */
static inline bool brk_worker_fits(const brk_worker_t *w, const char *model, const int64_t latent[4]) {
    if (w->max_tokens <= 0) return true;
    for (int i = 0; i < w->n_configs; i++)
        if (!strcmp(w->configs[i].name, model) && w->configs[i].patch) {
            const int64_t p = (int64_t)w->configs[i].patch;
            return latent[1] * (latent[2] / p) * (latent[3] / p) <= w->max_tokens;
        }
    return true;
}

typedef enum { REQ_QUEUED, REQ_INFLIGHT, REQ_ABANDONED } brk_req_state_t;

/* A GEN the broker accepted. `msg` is the client's message (identity,
 * header, tensor frames), kept whole so the request can be sent again
 * after its worker dies: it is forwarded as the REQUEST (msg_forward). */
typedef struct brk_req {
    uint64_t id;               /* the broker's request id (REQUEST "id") */
    uint64_t client_id;        /* the client's "id", echoed in every reply */
    wire_msg_t *msg;           /* owned; heap */
    msg_gen_t gen;             /* msg decoded (its tensors point into msg): what a RESULT must match */
    uint64_t bytes;            /* its tensor bytes, counted in brk_t.held_bytes */
    char model[BRK_NAME_MAX];
    uint64_t shard;
    int loop;                  /* BRK_LOOP_*: only workers that run it may own it */
    unsigned needs;            /* 1u << loop, and BRK_CAP_* bits (a prompt, a decoded output): only workers
                                * holding all of them may own it */
    uint64_t required;         /* transformer version it must run on */
    int steps;
    bool progress;
    uint64_t progress_at;      /* step + decoded of the last PROGRESS forwarded (this run) */
    uint64_t progress_of;      /* and its steps + decode_frames */
    int64_t accepted_ms, deadline_ms;
    int64_t dispatched_ms;     /* brk_now_ms() when it was last sent to a worker (0: never) */
    int losses;                /* workers that died holding it */
    bool had_owner;            /* some eligible worker existed at some point */
    brk_req_state_t state;
    brk_worker_t *worker;      /* INFLIGHT / ABANDONED: who runs it */
    struct brk_req *prev, *next; /* all live requests (brk_t.reqs) */
    struct brk_req *id_next;   /* its bucket of brk_t.by_id */
    uint64_t client;           /* the GEN's client token (0: none): (client, client_id) names it to a resend */
    uint64_t sender;           /* whose turn it takes (brk_pump): its token, else its connection's id hashed */
    struct brk_req *ck_next;   /* its bucket of brk_t.by_client (client != 0 only) */
} brk_req_t;

/* A peer's budget of answers to its bad messages (brk_msg.h): a token
 * bucket per routing identity, BRK_REPLY_SLOTS of them (identities that
 * share a slot share its budget). */
#define BRK_REPLY_SLOTS 256
#define BRK_REPLY_BURST 20.0       /* answers at once */
#define BRK_REPLY_RATE 10.0        /* answers per second after that */
typedef struct {
    uint64_t who;              /* hash of the identity; 0 for a free slot */
    double tokens;
    int64_t at_ms;             /* when tokens was last refilled */
} brk_bucket_t;

#define BRK_ID_BUCKETS 1024    /* live requests by id: ids are sequential, so id % buckets spreads them */

/* The bucket of brk_t.by_client that a request of client token `client`
 * and client id `id` is in. */
static inline unsigned brk_client_bucket(uint64_t client, uint64_t id) {
    return (unsigned)((client ^ (id * 0x9e3779b97f4a7c15ull)) % BRK_ID_BUCKETS);
}
#define BRK_MSG_POOL 64        /* spare message structs kept for reuse */
#define BRK_REQ_POOL 64        /* spare request structs kept for reuse */

/* A SYNC's resends past the first of each key (brk_sync.c): a trainer's
 * first resend of a version is audited, the rest are counted here and
 * written as one audit row per key when the tally ends (its barrier
 * ends, its version stops being current, the broker stops). One kept
 * audit row per resend let a trainer key that resends in a loop grow
 * the catalog without bound. Keys past BRK_SYNC_RESENDERS are counted
 * together (others), written as key "*". */
#define BRK_SYNC_RESENDERS 4
typedef struct {
    char name[REEL_KEY_NAME_MAX]; /* the key's name ("-" without keys) */
    int role;                     /* its reel_role_t */
    uint64_t more;                /* its resends since the one audited, not audited yet */
} brk_resender_t;
typedef struct {
    brk_resender_t by[BRK_SYNC_RESENDERS];
    int n;
    uint64_t others;              /* resends of keys past the first BRK_SYNC_RESENDERS: counted only */
} brk_resends_t;

/* The current SYNC of one component: the newest version at least one
 * live worker applied. Late joiners and lagging workers are caught up to
 * it; a GEN without "version" needs it. */
typedef struct {
    char component[BRK_NAME_MAX];
    uint64_t version;          /* 0 while no sync of it was ever applied */
    char sha256[65];
    uint64_t sync_id;          /* the broker's id for it (SYNC "id" to workers) */
    msg_sync_t *sync;          /* owned; NULL while version is 0 */
    /* When sync is a LoRA adapter: the full version it is on (its
     * base_version), sent first to a worker that joins below it (owned;
     * NULL when not known: then such a worker refuses the adapter and
     * lags until the next full version). */
    msg_sync_t *base;
    uint64_t base_id;          /* the broker's id for base */
    brk_resends_t resent;      /* resends of version while it is current */
} brk_current_t;

/* A barrier member's state. */
enum { BRK_MEMBER_WAITING, BRK_MEMBER_APPLIED, BRK_MEMBER_FAILED };

typedef struct {
    char worker[BRK_NAME_MAX];
    int state;                 /* BRK_MEMBER_* */
    bool undelivered;          /* waiting, but its SYNC never reached the worker (a send failed: its
                                * connection was gone, or its queue full): sent again when the worker
                                * registers again or speaks again; it fails only when the worker is
                                * dropped or the deadline passes ("SYNC not delivered: ..."). Only
                                * ever set while waiting; a send that fails but for its transport
                                * fails the member at once instead ("SYNC could not be sent: ...") */
    char reason[MSG_REASON_MAX]; /* a refusal's why, whole (an adapter's key names are long) */
} brk_member_t;

/* Who asked for a barrier's SYNC_DONE (a trainer resending a SYNC still
 * running joins it instead of starting another). A resend of the same
 * (identity, id) is one of them already; past BRK_SYNC_TRAINERS_MAX a
 * resend is answered busy: a barrier may wait for an upload for ever, and
 * each resend would otherwise add one, and one SYNC_DONE at its end. */
#define BRK_SYNC_TRAINERS_MAX 64
typedef struct {
    brk_ident_t ident;
    uint64_t id;
} brk_trainer_t;

/* One SYNC's barrier: the workers live when it arrived, and the trainers
 * to answer once each has applied it, failed, died or timed out (one its
 * SYNC could not reach stays on it until then: brk_member_t). At most
 * one per (component, version). While the version is pending (no worker
 * applied it yet) the barrier owns its SYNC; the first ok ack makes it the
 * component's current one (sync moves to brk_current_t). A barrier ending
 * with sync still here changed nothing: the version failed. */
typedef struct brk_barrier {
    char component[BRK_NAME_MAX];
    uint64_t version;
    char sha256[65];
    uint64_t sync_id;
    msg_sync_t *sync;          /* owned while pending; NULL once current, or for a resend */
    brk_trainer_t *trainers;   /* owned */
    int n_trainers;
    int64_t accepted_ms;
    int64_t deadline_ms;       /* INT64_MAX while its uploaded file still comes (then + wait_ms) */
    int64_t wait_ms;
    int n;
    brk_member_t *m;
    bool hold;                 /* no worker yet, and it may be one that has not registered
                                * again (brk_sync.c): workers that register join it, and it
                                * waits for them until hold_until_ms */
    int64_t hold_until_ms;
    bool resend_only;          /* a resend of the current version that retried no worker and is not
                                * held (nobody lags): the lines of its end come out of
                                * b->resend_log, as the resend's own did */
    brk_resends_t resent;      /* its resends while it runs and its version is not current */
    struct brk_barrier *next;
} brk_barrier_t;

/* A sync the previous broker process accepted and no worker had applied
 * when it stopped (the catalog's pending rows at start; brk_main.c). The
 * catalog marks it failed at once; a worker that registers running it
 * makes it current again (it was applied after all), and a trainer's
 * resend of it waits for the workers to register instead of failing with
 * no live worker (brk_sync.c). */
#define BRK_MAX_INTERRUPTED 8
typedef struct {
    char component[BRK_NAME_MAX];
    uint64_t version;
    char sha256[65];
    char source[MSG_PATH_MAX];  /* a path, or BRK_SOURCE_UPLOADED */
    uint64_t base_version;      /* > 0: a LoRA adapter on that base (msg_sync_t) */
    char lora_config[MSG_LORA_CONFIG_MAX]; /* one sent by upload: its config text */
    bool timed_out;             /* not a restart's: its barrier ran out of time with
                                 * workers still on it (a late ok makes it current) */
} brk_interrupted_t;

struct brk_zap;
struct brk_uploads;
struct brk_ha;
struct brk_held_client;

/* A connection FETCH answers are read for (brk_upload_serve.c): a
 * worker's on the worker socket, or the peer broker's on the client
 * socket. Each answer read into memory counts in `out` until ZeroMQ has
 * sent it and frees its buffer (on ZeroMQ's I/O thread, hence atomic). A
 * connection with BRK_FETCH_OUT_MAX on their way is answered busy: a
 * worker, and a pair's copy, keep 4 in flight, and one that asks without
 * reading would otherwise have the routing thread read and hold 4 MiB
 * for each FETCH. BRK_FETCH_PEERS connections at once, a slot reused once
 * its answers went. Over all connections, the bytes of those answers are
 * bounded by --max-fetch-mb (brk_t.fetch_out_bytes): 64 connections of 16
 * answers of 4 MiB would be 4 GiB read for peers that never read. */
#define BRK_FETCH_PEERS 64
#define BRK_FETCH_OUT_MAX 16
typedef struct {
    unsigned char who[256];          /* its routing id */
    size_t who_len;
    bool worker_side;                /* on the worker socket (else the client socket: ids are per socket) */
    atomic_int out;
} brk_fetch_peer_t;

typedef struct {
    brk_opts_t opt;
    void *ctx, *clients, *workers;   /* ZeroMQ context and ROUTER sockets */
    struct brk_zap *zap;             /* keys and roles (brk_zap.h); NULL without keys */
    struct brk_uploads *uploads;     /* weights by value (brk_upload.h); NULL without --weights-dir */
    brk_fetch_peer_t fetch_peers[BRK_FETCH_PEERS]; /* (brk_t outlives the context: their frees come first) */
    atomic_uint_fast64_t fetch_out_bytes; /* bytes of FETCH answers read and not yet sent, all connections
                                           * (at most --max-fetch-mb; freed on ZeroMQ's I/O thread) */
    struct brk_ha *ha;               /* one of a standby pair (brk_ha.h); NULL alone (always active) */
    brk_catq_t *cat;

    brk_worker_t **w;                /* registered workers */
    int n_w, cap_w;
    brk_req_t *reqs;                 /* every live request */
    brk_req_t *by_id[BRK_ID_BUCKETS]; /* the same, chained by id % BRK_ID_BUCKETS */
    brk_req_t *by_client[BRK_ID_BUCKETS]; /* those with a client token, by (client, client_id) */
    uint64_t resends;                /* GENs resent while their request was live: attached to it */
    uint64_t last_sender;            /* the sender of the request dispatched last (brk_pump's ties) */
    uint64_t cancels;                /* CANCELs that ended a live request */
    uint64_t cancels_unknown;        /* CANCELs that named none (answered already, or never sent) */
    uint64_t queue_displaced;        /* waiting GENs answered BUSY to make way in a full queue (make_way) */
    uint64_t boot;                   /* this process's id (STATUS_REPLY "boot"): new at every start */
    int64_t started_ms;              /* brk_now_ms() at start */
    int64_t active_ms;               /* when it last became active (its start, or a standby's takeover):
                                      * a SYNC in the workers' rejoin window after it is held */
    brk_queue_t queue;               /* REQ_QUEUED requests, FIFO */
    uint64_t next_id;
    uint64_t held_bytes;       /* tensor bytes of live requests (bounded: BUSY beyond) */
    brk_current_t cur[BRK_MAX_COMPONENTS];
    int n_cur;
    brk_barrier_t *barriers;
    brk_interrupted_t interrupted[BRK_MAX_INTERRUPTED];
    int n_interrupted;

    int64_t handling_ms;       /* when brk_handle took up the message it handles now */
    int64_t next_heartbeat_ms;
    uint64_t malformed;              /* unreadable messages (answered ERROR while the peer's budget lasts) */
    uint64_t worker_refused;         /* registered workers' messages refused or dropped for what they said
                                      * (BRK_WORKER_REFUSED; STATUS worker_refused) */
    uint64_t undelivered;            /* messages a peer could not take (queue full, or gone): dropped;
                                      * a client's PROGRESS counts in progress_dropped instead */
    uint64_t progress_dropped;       /* PROGRESS a client could not take (a full queue, answers held
                                      * before it, or gone): harmless, the next one says more */
    struct brk_held_client *held;    /* clients with answers their full queue could not take yet, held
                                      * to send when it can (brk_deliver.c) */
    uint64_t answers_held;           /* those answers, all clients */
    uint64_t answers_held_bytes;     /* ... and their bytes (at most --max-held-mb) */
    uint64_t fetch_bytes_shared;     /* FETCH_DATA bytes sent from an arriving UPLOAD chunk's frame */
    uint64_t fetch_bytes_read;       /* ... and read back from --weights-dir for it */
    uint64_t replies_suppressed;     /* answers to bad messages not sent: over the peer's budget, or an unknown worker */
    brk_bucket_t replies[BRK_REPLY_SLOTS];
    brk_shard_memo_t shard_memo;     /* shard hashes of recent GENs' inputs */
    brk_hot_t hot;                   /* the keys hot lately, with their shapes (brk_hot.h): prewarm */
    uint64_t prewarm_keys_sent;      /* keys sent in PREWARMs */
    wire_msg_t *msg_pool[BRK_MSG_POOL]; /* closed message structs (brk_msg_new) */
    int n_msg_pool;
    brk_req_t *req_pool[BRK_REQ_POOL]; /* freed request structs (brk_req_new) */
    int n_req_pool;
    brk_metrics_t metrics;           /* live counters, and the --metrics server (brk_metrics.h) */
    reel_log_budget_t ready_log;     /* READY refusals: their share of the log (brk_log_limited; a
                                      * restart's lines are the worker's own, w->again_log) */
    /* EVENTS from worker connections not registered yet, kept until their
     * READY (brk_workers.c, "EVENTS before READY"); oldest first */
    struct brk_orphan *orphans;
    int n_orphans;
    uint64_t orphan_events_lost;     /* their entries never recorded: no READY in time, or too many */
    uint64_t worker_events_lost;     /* events the workers said they lost (EVENTS `dropped`): past a
                                      * worker's buffer, or in an EVENTS it could not send */
    reel_log_budget_t orphan_log;    /* those losses' share of the log */
    brk_log_kinds_t refused_log;     /* peers' refused messages, by kind: their share of the log
                                      * (brk_log_kind; the loop's timers sum up what was left out) */
    reel_log_budget_t resend_log;    /* trainers' SYNC resends (BRK_SYNC_RESENDS, brk_sync.c): no
                                      * refusals, but a trainer resending in a loop is as many lines */
    brk_log_kinds_t request_log;     /* clients' requests, by kind (BRK_GEN_RESENDS, BRK_REQUEST_ENDS:
                                      * brk_requests.h; BRK_UPLOAD_LINES: brk_upload.h): each line is a
                                      * GEN, CANCEL or UPLOAD's, and a client or trainer sends them in a
                                      * loop as cheaply as refused ones */
} brk_t;

/* Notes route.applying of every worker: the newest transformer version of
 * a barrier (a trainer's SYNC, bounded by its deadline) still waiting for
 * the worker's ack; 0: none. Routing reads it (brk_peer_eligible): such a
 * worker keeps its keys while it applies. A catch-up SYNC (a worker that
 * joined, or came back, behind the current version) belongs to no barrier
 * and has no deadline: that worker takes no keys before its ack, as
 * before; nor does a barrier whose uploaded file still comes (no deadline
 * yet). Called before each routing pass, from the state the sync module
 * keeps. */
static inline void brk_note_applying(brk_t *b) {
    for (int i = 0; i < b->n_w; i++) b->w[i]->route.applying = 0;
    for (const brk_barrier_t *s = b->barriers; s; s = s->next) {
        if (strcmp(s->component, BRK_COMPONENT) || s->deadline_ms == INT64_MAX) continue;
        for (int k = 0; k < s->n; k++) {
            /* (one its SYNC never reached is not applying it) */
            if (s->m[k].state != BRK_MEMBER_WAITING || s->m[k].undelivered) continue;
            for (int i = 0; i < b->n_w; i++)
                if (!strcmp(b->w[i]->route.name, s->m[k].worker) && b->w[i]->route.applying < s->version)
                    b->w[i]->route.applying = s->version;
        }
    }
}

/* A registered worker's message refused or dropped for what it said (a
 * bad RESULT, PROGRESS, SYNC_ACK or EVENTS, a reply for a request it does
 * not hold, an ack of a version never sent): counted (STATUS
 * worker_refused) and logged within the worker's share of the log. */
#define BRK_WORKER_REFUSED(b, w, ...)                                    \
    do {                                                                 \
        (b)->worker_refused++;                                           \
        brk_log_limited(&(w)->log, (w)->route.name, __VA_ARGS__);        \
    } while (0)

#endif
