/* wrk_exec_state.h -- the executor's state, for wrk_executor.c and its
 * invariants (wrk_invariants.c, tests/test_worker_invariants.c); nothing
 * else includes it.
 *
 * Who owns what: a stream's round (active, nactive) and staging pool are
 * its thread's alone; `load` is written by the submitting (main) thread
 * and the stream thread; a group is shared by its parts' streams under its
 * mutex. */
#ifndef REEL_WORKER_WRK_EXEC_STATE_H
#define REEL_WORKER_WRK_EXEC_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "base/thread.h"
#include "worker/wrk_check.h"
#include "worker/wrk_executor.h"

#define WRK_STG_POOL 8
#define WRK_MIX_POOL 8

/* What batching costs a stream, per kind of request (--batching auto): the
 * seconds a request's step took alone and in a mixed step (the step's
 * time over its requests), as moving averages of replayed and eager steps
 * (captures, far slower, are left out). */
typedef struct {
    tdit_shape_t one;
    bool sde;
    double alone_s, mixed_s;
    int n_alone, n_mixed;
    uint32_t turns;              /* batching decisions taken */
} wrk_batch_cost_t;

typedef struct {
    wrk_exec_t *x;
    int idx;
    reel_thread_t *th;           /* the stream thread; its queue holds jobs submitted, not yet in the round */
    kern_stream_t *ks;
    void *push;                  /* used by the thread while it runs */
    atomic_int load;             /* jobs queued + active: raised before the post, lowered when a job ends */
    wrk_job_t *active;           /* the round, in arrival order */
    int nactive;                 /* its length */
    /* Staging sets reused across requests, so a key's graph keeps reading
     * the contexts in place (pinned) from one request to the next. */
    tdit_staging_t *pool[WRK_STG_POOL];
    bool busy[WRK_STG_POOL];     /* an active job runs in it */
    uint64_t used[WRK_STG_POOL]; /* last take, for LRU replacement */
    uint64_t clock;
    int npool;
    /* Mixed batches (model/tdit_program.h tdit_mix_*): the buffers of the
     * batches this stream ran lately, one per kind and size, LRU. */
    tdit_mix_t *mix[WRK_MIX_POOL];
    uint64_t mix_used[WRK_MIX_POOL];
    int nmix;
    wrk_batch_cost_t cost[WRK_MIX_POOL]; /* the kinds seen lately (replaced in turn) */
    int ncost, cost_next;
    /* Keys to prewarm (wrk_exec_prewarm): handed in under pw_mu by the
     * main thread, taken by the stream thread (one in a round where no
     * request stepped, or by a request of the key: prewarm_claim). */
    pthread_mutex_t pw_mu;
    wrk_prewarm_t *pw;           /* pw[pw_at..npw) still to try */
    int npw, pw_at;
    atomic_int pw_left;          /* npw - pw_at, readable from any thread */
} wrk_stream_t;

struct wrk_exec {
    wrk_t *w;
    int n;
    wrk_stream_t *s;
};

/* A group split over the streams (the CPU backend: a stream is a core's
 * thread): each part is a job of its own on its own stream, batched as a
 * group, writing its samples' outputs here; the part that finishes last
 * sends the one RESULT (or nothing, when a part failed: that part sent
 * the ERROR). Every part is bitwise the single requests of its seeds, so
 * the whole is too. */
struct wrk_group {
    pthread_mutex_t mu;
    reel_owner_t owner;          /* who holds mu */
    int parts, parts_left, parts_ok;
    bool started;                /* counted in wrk_t.running, all parts at once */
    atomic_bool failed;          /* a part sent ERROR: the others stop */
    int n, steps;
    float *out, *traj, *means, *logp;
    uint64_t *vers;
    tdit_run_stats_t stats;
    uint64_t first_version, last_version;
    bool have_version;
    int progress_done, progress_total;
};

/* ---- invariants (wrk_invariants.c) ----------------------------------------
 * Each returns 0, or -1 with reel_err_text() naming the first invariant that
 * does not hold. Builds with -DREEL_INVARIANTS check them after every
 * state change and abort with that description (WRK_CHECK, wrk_check.h). */

/* One job of a stream's round (or queue): its sub-batch lies within its
 * samples, a running request is counted in wrk_t.running, a part's
 * samples lie within its group's. */
int wrk_job_invariants(const wrk_job_t *j);
/* A group: parts left and parts finished well add up to at most its parts,
 * progress done is at most progress total. The caller holds g->mu. */
int wrk_group_invariants(const wrk_group_t *g);
/* A stream, from its own thread between steps: the round holds nactive
 * jobs, each sound; a pool slot is busy exactly when an active job runs
 * in its staging set, and no two share one; load counts at least the
 * active jobs plus `queued` (jobs still in the thread's queue). */
int wrk_stream_invariants(const wrk_stream_t *st, int queued);
/* The whole executor, every stream paused (the caller is the only thread
 * that submits): each stream's load equals its active plus queued jobs,
 * each group's parts left equal its parts still alive on the streams, and
 * wrk_t.running equals the running single requests plus the parts left of
 * the started groups. */
int wrk_exec_invariants(wrk_exec_t *x);

#endif
