/* wrk.h -- what the worker's threads share: the model, the capture cache,
 * the step lock and a few atomics. Everything else is private to one
 * thread, and threads talk through queues (main -> streams, main -> sync)
 * and the inproc pipe (streams, sync -> main; wrk_pipe.h).
 *
 *   main thread    the DEALER to the broker, heartbeats, reconnects, REQUEST
 *                  checking, EVENTS batching, forwarding the pipe
 *   stream i       one kern_stream_t; interleaves the steps of its requests
 *   sync thread    reads and verifies SYNC weights, applies them between
 *                  steps under the write side of the step lock
 *
 * The step lock is a writer-preferring rwlock: each step holds it for
 * reading, a weight sync for writing, so a sync lands between steps, never
 * inside one, and is not starved by streams that step back to back. */
#ifndef REEL_WORKER_WRK_H
#define REEL_WORKER_WRK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "base/logbudget.h"
#include "base/thread.h"
#include "capture_cache/cache.h"
#include "kernels/backend.h"
#include "model/tinydit.h"
#include "worker/wrk_events.h"
#include "worker/wrk_opts.h"
#include "worker/wrk_request.h"
#include "worker/wrk_weights.h"
#include "net/keys.h"

/* Buckets of samples per step (wrk_t.step_samples): 1, 2, 4, ... 64. */
#define WRK_SAMPLE_BUCKETS 7

/* Broker endpoints --broker may list (a standby pair: 2). */
#define WRK_MAX_BROKERS 4

/* Where stream and sync threads push finished messages for the main thread. */
#define WRK_PIPE_ENDPOINT "inproc://reel-worker-out"

typedef struct {
    const wrk_opts_t *opt;
    void *zctx;                      /* the one ZeroMQ context */
    kern_backend_t *backend;
    kern_dtype_t dtype;              /* weights and activations: F32, or BF16 on CUDA */
    tdit_model_t *model;
    struct t2v_text *text;           /* the text encoder (model/t2v.h), or NULL: no prompts */
    struct t2v_vae *vae;             /* the VAE, or NULL: no decoded outputs */
    cap_cache_t *cache;
    wrk_events_t *events;
    const wrk_roots_t *roots;        /* where a SYNC's path may lead (wrk_weights.h) */
    const reel_curve_t *curve;       /* the keys the DEALER connects with (off: plain) */
    /* --broker A[,B]: the endpoints of a broker or of a standby pair, and
     * the one in use (the main thread moves it; a sync thread's FETCH
     * reads it: wrk_broker_endpoint). */
    char brokers[WRK_MAX_BROKERS][256];
    int n_brokers;
    atomic_int broker_at;
    pthread_rwlock_t step_lock;
    /* The transformer version applied (written by the sync thread under the
     * write lock, read anywhere). */
    _Atomic uint64_t applied_version;
    /* Broker session: bumped by the main thread when it reconnects or is
     * told RECONNECT. Requests of an older session are abandoned (the
     * broker requeued or forgot them) and their messages are not sent. */
    _Atomic uint64_t epoch;
    atomic_bool stop;                /* shutting down: start nothing new */
    atomic_bool fatal;               /* weights are unusable: exit 1 (wrk_sync.h) */
    /* --sync-mode drain: while `draining`, stream threads start no new
     * request; `running` counts requests between their first and last step
     * (changed through wrk_running_add/_done only: its drop to 0 wakes the
     * drain). */
    atomic_bool draining;
    atomic_int running;
    pthread_mutex_t idle_mu;         /* with idle_cv: the drain waits for running == 0 or stop */
    pthread_cond_t idle_cv;
    /* Called when a drain ends (wrk_drain_hook, by wrk_exec_new): the
     * streams' held requests may start; and at each CANCEL, so a stream
     * with only held requests drops a cancelled one at once. Under
     * idle_mu. */
    void (*drain_ended)(void *arg);
    void *drain_arg;
    reel_owner_t step_writer;        /* who holds the write side of step_lock (base/thread.h) */
    /* Denoising steps run, by the samples in each (a batched group's step
     * counts its batch): counts per bound of wrk_step_sample_bounds (1, 2,
     * 4, ... 64), the last above them all, and the samples summed. Bumped
     * by the stream threads (wrk_count_step), read by the metrics
     * (wrk_step_samples_read); both under samples_mu, so a scrape's count
     * and sum agree. */
    pthread_mutex_t samples_mu;
    uint64_t step_samples[WRK_SAMPLE_BUCKETS + 1], step_samples_sum;
    /* The REQUESTs this worker holds (queued or running), the main
     * thread's own: each taken at its REQUEST (wrk_hold_take) and dropped
     * once its job, and every part of a split group, let go of its hold.
     * A CANCEL marks the holds of its id (wrk_cancel_note); a stream reads
     * its job's mark before each step (wrk_cancelled). A CANCEL names
     * only a REQUEST that came before it (one connection keeps order): one
     * of an id the worker does not hold marks nothing and is kept nowhere,
     * so a REQUEST of that id later runs, and no flood of such CANCELs can
     * push a real one out (a ring of the last 256 CANCELs could). */
    struct wrk_held { uint64_t epoch, id; wrk_hold_t *hold; size_t bytes; } *held;
    size_t n_held, cap_held;
    /* The tensor bytes the held REQUESTs keep (the sum of held[].bytes:
     * what wrk_job_from_request copied for each), and the most they may
     * (--max-held-mb in bytes; 0: no bound). The main thread's. */
    size_t held_bytes, held_max;
    /* The log lines of messages refused from the broker, and of the
     * ERRORs it sends: their shares of the log (wrk_log_refused,
     * wrk_log_said). The main thread's. */
    reel_log_budget_t refused_log, said_log;
    /* The log lines of requests that end without a RESULT (cancelled,
     * past their deadline, failed: wrk_log_ended), and the notes a
     * request's start may write (its group split into batches:
     * wrk_log_noted): their shares of the log. The streams' and the main
     * thread's, under streams_log_mu. */
    reel_log_budget_t ended_log, noted_log;
    /* The sync thread's lines of SYNCs it refused or failed
     * (wrk_log_sync_refused): their share of the log, under
     * streams_log_mu. */
    reel_log_budget_t sync_log;
    pthread_mutex_t streams_log_mu;
    /* Mixed steps (several requests in one step) run, and the padded rows
     * they computed for nobody (--batch-sizes ladder). */
    _Atomic uint64_t mixed_steps, padded_rows;
    /* Weight syncs applied and failed by the sync thread, and the seconds
     * of the applied ones (read + hash or fetch, drain, reload), in µs. */
    _Atomic uint64_t syncs_applied, syncs_failed, sync_us;
    /* --lora: what every adapter is merged from (model/lora.h): the last
     * full version applied, kept whole in host memory, and the adapter
     * merged into the resident weights now. The sync thread's (set at
     * startup before it runs). */
    char attention[320];             /* kern_attention_describe's line, logged at start */
    bool attention_fused;            /* what AUTO takes for Wan's head: a fused kernel (CUDA: SDPA; CPU: its own), else decomposed */
    struct {
        st_file_t *file;             /* NULL without --lora */
        uint64_t version;
        char sha[65];
        struct lora *applied;        /* NULL: the base itself is resident */
    } base;
} wrk_t;

/* The broker endpoint in use (--broker's first until the main thread
 * moves on; opt->broker before it split the list). */
static inline const char *wrk_broker_endpoint(wrk_t *w) {
    return w->n_brokers ? w->brokers[atomic_load(&w->broker_at)] : w->opt->broker;
}
/* idle_mu and idle_cv, samples_mu, streams_log_mu. 0, or -1 with a message in
 * reel_err_text() (nothing left made). */
int wrk_shared_init(wrk_t *w);
/* Destroys what wrk_shared_init made (after every thread stopped). */
void wrk_shared_fini(wrk_t *w);
/* n more requests running (their first step comes). Can't fail. */
void wrk_running_add(wrk_t *w, int n);
/* One request no longer running; the last wakes a drain. Can't fail. */
void wrk_running_done(wrk_t *w);
/* Sets w->stop and wakes a drain waiting. Can't fail. */
void wrk_stop(wrk_t *w);
/* Waits until no request is running or the worker stops: condition
 * variable, no polling. Can't fail. */
void wrk_wait_drained(wrk_t *w);
/* Ends a drain: held requests may start (calls the drain hook: the
 * executor wakes its streams). Can't fail. */
void wrk_drain_end(wrk_t *w);
/* Sets what wrk_drain_end calls (NULL: nothing); once it returns, no call
 * of the previous hook is in progress. Can't fail. */
void wrk_drain_hook(wrk_t *w, void (*fn)(void *arg), void *arg);

/* A worker holds at most this many times its --max-inflight REQUESTs
 * (queued or running, of any broker session): wrk_holds. */
#define WRK_HELD_PER_INFLIGHT 4
/* ... and at most --max-held-mb of their tensors: by default this many
 * times --max-inflight times the most one REQUEST of its model keeps
 * (wrk_request_bytes_most). A broker that sends at most max_inflight has
 * no more here; the second share is the slack the count bound keeps too
 * (requests answered but not yet let go, an earlier session's ending
 * their step), at the largest size each. Half of what the count alone
 * would let a broker that ignores max_inflight pin (4 x K x 256 MiB). */
#define WRK_HELD_BYTES_PER_INFLIGHT 2

/* The REQUESTs held now, queued or running, of any session (those whose
 * job ended are dropped from the table first). The main thread's. Can't
 * fail. */
size_t wrk_holds(wrk_t *w);
/* The tensor bytes those keep (w->held_bytes once the ended ones are
 * dropped: each entry's bytes leave the sum exactly once, as it leaves the
 * table). The main thread's. Can't fail. */
size_t wrk_held_bytes(wrk_t *w);
/* Job j (its id and epoch set), taken from a REQUEST, is held: j->hold is
 * its mark, in w's table until j (and every part made of it) is freed;
 * `bytes` (wrk_request_bytes: what was copied for it) count in
 * w->held_bytes as long. The main thread's. 0, or -1 out of memory (j
 * and w unchanged). */
int wrk_hold_take(wrk_t *w, wrk_job_t *j, size_t bytes);
/* The broker cancelled its request id (of the session now): every REQUEST
 * of that id held now is marked (those to come are not). The main
 * thread's. The number marked (0: none held: the CANCEL is ignored).
 * Can't fail. */
size_t wrk_cancel_note(wrk_t *w, uint64_t id);
/* Whether a CANCEL that came after j's REQUEST marked it. Any thread.
 * Can't fail. */
bool wrk_cancelled(const wrk_job_t *j);

/* One step of `samples` samples ran (wrk_t.step_samples). Can't fail. */
void wrk_count_step(wrk_t *w, int64_t samples);
/* One consistent copy of the counts per bucket (not cumulative) and the
 * samples' sum. */
void wrk_step_samples_read(wrk_t *w, uint64_t counts[WRK_SAMPLE_BUCKETS + 1], uint64_t *sum);
/* The upper bound of bucket i < WRK_SAMPLE_BUCKETS: 2^i. */
static inline int64_t wrk_step_sample_bound(int i) { return (int64_t)1 << i; }

/* "reel-worker NAME: <msg>\n" on stderr, one write. */
void wrk_log(const wrk_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As wrk_log, for a message from the broker the worker refuses (a
 * REQUEST busy, malformed or too large; a bad CANCEL, PREWARM or frame; a
 * SYNC past the queue's bound): within w->refused_log, at most
 * REEL_LOG_BURST lines a REEL_LOG_WINDOW_MS window (base/logbudget.h);
 * the rest are counted and said in one line ("refused messages: N more
 * lines like the ones above were left out of the log ...") with the first
 * line after the window, or by wrk_log_budgets_tick. So a peer that
 * floods the worker with messages it refuses cannot fill its disk. The
 * main thread's. Can't fail. */
void wrk_log_refused(wrk_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As wrk_log_refused, for an ERROR the broker sends ("broker says: ..."),
 * within a budget of its own, w->said_log ("broker ERRORs: N more lines
 * ..."): a broker, or anything that reaches the worker's socket as one,
 * that sends ERRORs in a loop cannot fill the disk, nor use up the
 * refusals' lines. The main thread's. Can't fail. */
void wrk_log_said(wrk_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As wrk_log_refused, for a request that ends without a RESULT
 * ("request N failed: ...": cancelled, dropped past its deadline, a
 * step's failure; a split group's other parts stopping), within
 * w->ended_log ("request ends: N more lines ..."): a broker that sends
 * REQUESTs it cancels, or whose deadlines have passed, in a loop (its
 * clients' GENs and CANCELs, say) wrote a line for each one. Any thread's
 * (the streams write them): under w->streams_log_mu. Can't fail. */
void wrk_log_ended(wrk_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As wrk_log_ended, for what a request's start notes about it (a group
 * split into batches to fit --max-tokens or the memory budget; a batch
 * that could not start at its size), within w->noted_log ("request
 * notes: N more lines ..."): one line per request otherwise, and a client
 * that sends such GENs in a loop would write them all. Any thread's:
 * under w->streams_log_mu. Can't fail. */
void wrk_log_noted(wrk_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As wrk_log_ended, for a SYNC the sync thread refused or failed ("sync
 * to vN refused: ..."), within w->sync_log ("sync refusals: N more lines
 * ..."): whatever sends SYNCs on the broker's socket in a loop writes a
 * line each otherwise. Any thread's: under w->streams_log_mu. Can't
 * fail. */
void wrk_log_sync_refused(wrk_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Says the lines w->refused_log, w->said_log, w->ended_log, w->noted_log
 * and w->sync_log left out once their window is over, though no line of
 * theirs came since (a flood that stopped). The main thread's, on its
 * ticks. Can't fail. */
void wrk_log_budgets_tick(wrk_t *w);

#endif
