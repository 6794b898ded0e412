/* cache.h -- safe capture, verify, replay and eviction of step graphs.
 *
 * A *program* is a capturable step: it owns an address-stable workspace per
 * (key, stream), reads every per-step value from it, and writes its outputs
 * into static buffers. cap_dispatch() runs one call of a program for a key
 * on a stream, choosing eager or graph replay and proving replay safe:
 *
 *   warmup (W eager runs, default 2; never a failure)
 *     -> capture (launches recorded, nothing runs)
 *     -> verify (replay once, run eager on the same inputs; publish only if
 *        every output is bitwise equal; else refuse and release the graph)
 *     -> replay, after checking on every call that pinned inputs, baked
 *        constants and weights are still what the graph baked in.
 *
 * Pinning: an input the program marks pinnable whose layout identity
 * (address, offset, dtype, shape, strides, device) stayed the same through
 * warmup is read in place by the graph instead of copied. A replay call
 * whose pinned input moved declines (pinned_input_moved) and never reads
 * the old address; the entry then stops pinning that input and captures
 * again on its next call, copying it from then on.
 *
 * Weights: at capture the cache records the identity (address, bytes,
 * dtype, layout, component) of every weight buffer the program reports
 * through weights(); before every replay it asks again and compares. Any
 * difference (weights freed, moved or re-laid-out without a versioned
 * update) declines weights_moved and drops the graph: no replay reads a
 * freed weight, or a weight through a layout it no longer has.
 *
 * Entries: an entry (one per key, stream and user) owns its workspace,
 * including the kernels' scratch memory, so any mix of shapes on a stream
 * can be captured side by side. A new entry is admitted only if its
 * workspace fits the budget (idle LRU entries are evicted to make room);
 * when it cannot fit, the call runs eagerly in a transient workspace
 * (declined budget_exceeded): a call never fails for lack of budget. The
 * arithmetic never wraps: a size that could not be added to what is held
 * (a budget of SIZE_MAX, or none, and a workspace reporting most of the
 * address space) is one that does not fit, declined the same way.
 *
 * A check that fails *declines* the call to eager with a reason; only a
 * permanent reason (verify_mismatch, backend_unavailable, or a capture that
 * failed CAP_CAPTURE_TRIES times) disables the entry. Every decline is counted, logged once per (reason,
 * key) at warning level (of the 4096 most recent pairs: cache_impl.h), and reported through the event
 * callback.
 *
 * Threads: calls on one stream are serialized (a per-stream lock, so two
 * threads sharing a stream never share a workspace); calls on different
 * streams run concurrently. A dispatch made from a step's launch (a
 * re-entrant dispatch) declines entry_busy and runs eagerly in a transient
 * workspace when what it needs is held by an outer call:
 *   - its entry is in use by an outer call on this thread (never re-bound);
 *   - its stream is busy on another thread: a re-entrant dispatch never
 *     waits for another stream's lock (two threads doing that in opposite
 *     orders would deadlock); it runs on the outer call's stream instead,
 *     so its inputs must be ready there (work queued on its own stream is
 *     not waited for).
 * A dispatch made while its thread captures (from a launch being
 * captured, on any stream) fails at once with a message, touching nothing:
 * a capturing thread may not allocate a workspace or destroy a graph, and
 * waiting for the cache's lock there could deadlock with a thread freeing
 * device memory. No entry is disabled or evicted for it; a step that
 * passes the failure on fails its capture (capture_failed), and the eager
 * run that serves that call dispatches normally.
 *
 * Lifetimes: an entry keeps a copy of its program's table (taken when the
 * entry is made) and its user pointer, never what the pointer points at.
 * The program table and the user need live only while a dispatch that
 * passes them runs: an entry is freed whenever it is evicted (another
 * model's weight sync, the budget, a failed workspace allocation,
 * cap_evict_key, cap_forget_stream, cap_cache_destroy), which may be after
 * its user is gone, so ws_free() and input() must not dereference user: a
 * workspace keeps what it needs to free itself (its backend, taken at
 * ws_new).
 *
 * Streams are not like users: an entry's graph was captured on its stream
 * and its workspace made for it (on CUDA the graph bakes the stream's
 * cuBLAS workspace), and a stream with live graphs may not be destroyed.
 * A stream the cache has seen must be forgotten (cap_forget_stream) before
 * it is destroyed, unless the cache goes first (cap_cache_destroy): the
 * cache knows a stream by its address, so a stream made later at a dead
 * one's address would otherwise be taken for it and handed its entries.
 *
 * Program callbacks: weights(), ws_size(), ws_free() and input() may run
 * with the cache's mutex held. From them a program may call
 * cap_component_version() (it takes a lock of its own) and the key
 * functions (key.h); any other cache function would deadlock.
 *
 * The cache's tables are guarded by one mutex held only for lookups and
 * bookkeeping, never while kernels run. Builds with -DREEL_INVARIANTS
 * (make asan, make tsan) check cap_cache_invariants() at the end of every
 * public function. */
#ifndef REEL_CAPTURE_CACHE_H
#define REEL_CAPTURE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "base/metrics.h"
#include "capture_cache/key.h"
#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CAP_DECLINE_WARMING_UP = 0,     /* still in warmup: expected, not a failure */
    CAP_DECLINE_NOT_CAPTURABLE,     /* step flagged non-capturable (SDE, no static form) */
    CAP_DECLINE_OVERRIDE,           /* an interceptor override forced eager */
    CAP_DECLINE_SHAPE_MISMATCH,     /* an input does not fit the static workspace */
    CAP_DECLINE_PINNED_INPUT_MOVED, /* a pinned input changed address/layout */
    CAP_DECLINE_CONSTANT_CHANGED,   /* a baked constant changed type or value */
    CAP_DECLINE_WEIGHTS_MOVED,      /* a weight component moved or changed generation */
    CAP_DECLINE_VERIFY_MISMATCH,    /* replay != eager bitwise (permanent) */
    CAP_DECLINE_CAPTURE_FAILED,     /* capture itself failed (retried CAP_CAPTURE_TRIES times, then permanent) */
    CAP_DECLINE_BUDGET_EXCEEDED,    /* graph would not fit the memory budget */
    CAP_DECLINE_BACKEND_UNAVAILABLE,/* backend cannot capture (permanent) */
    CAP_DECLINE_MUTABLE_OUTPUT,     /* an output aliases an input read in place */
    CAP_DECLINE_ENTRY_BUSY,         /* a re-entrant dispatch found its entry, stream or
                                     * thread busy with an outer call (see Threads) */
    CAP_DECLINE_MUTABLE_INPUT,      /* the step wrote an input it declared pinnable */
    CAP_DECLINE_AUDIT_MISMATCH,     /* a runtime audit found replay != eager: entry evicted */
    CAP_DECLINE_WRONG_STREAM,       /* the graph was captured on another stream: never replayed here */
    CAP_DECLINE_ARTIFACT_PARITY,    /* a kernel artifact's parity gate decided during the call
                                     * (kernels/artifacts.h): native result served; a graph
                                     * from before the decision is dropped and captured again */
    CAP_DECLINE_COUNT
} cap_reason_t;

typedef enum {
    CAP_EVICT_WEIGHT_SYNC = 0,
    CAP_EVICT_LRU,
    CAP_EVICT_SHAPE_CHANGE,
    CAP_EVICT_EXPLICIT,
    CAP_EVICT_SHUTDOWN,
    CAP_EVICT_AUDIT_MISMATCH,       /* a runtime audit caught replay != eager */
    CAP_EVICT_DROPPED,              /* the graph only, its key kept: a decline (pinned_input_moved,
                                     * weights_moved, wrong_stream, mutable_input, verify_mismatch,
                                     * artifact_parity) says why; the key captures again or runs eagerly */
    CAP_EVICT_STREAM_GONE,          /* its stream is going away (cap_forget_stream) */
    CAP_EVICT_COUNT
} cap_evict_reason_t;

typedef enum {
    CAP_POLICY_EVICT = 0,   /* a weight sync drops the graphs that read it */
    CAP_POLICY_INPLACE,     /* weights copied in place; graphs re-verified */
} cap_policy_t;

/* "warming_up", "not_capturable", ...; "weight_sync", "lru", ...; "evict",
 * "inplace". "?" when out of range. */
const char *cap_reason_name(cap_reason_t r);
const char *cap_evict_reason_name(cap_evict_reason_t r);
const char *cap_policy_name(cap_policy_t p);
int cap_policy_parse(const char *s, cap_policy_t *out);
/* True for reasons that disable an entry for good at once. A failed
 * capture (an invalidated CUDA capture is often transient) is retried on
 * the entry's next calls, up to CAP_CAPTURE_TRIES failed captures in a
 * row (a capture that works starts the count again), and only then
 * disables the entry. */
bool cap_reason_permanent(cap_reason_t r);
#define CAP_CAPTURE_TRIES 3

/* REKEY: an entry a sync re-keyed in place (--policy inplace, or a LoRA
 * sync): its graph is kept under its new key (key_text, key_hash: the
 * new ones; component, from_version, to_version: the sync; bytes: what
 * it holds). No capture follows for the new key, so this is where its
 * text is told. */
typedef enum { CAP_EV_CAPTURE, CAP_EV_DECLINE, CAP_EV_EVICT, CAP_EV_REKEY } cap_event_kind_t;
/* A CAPTURE event's reason: what asked for the capture. */
typedef enum { CAP_CAPTURE_DEMAND = 0, CAP_CAPTURE_PREWARM = 1 } cap_capture_origin_t;
/* "demand", "prewarm"; "?" when out of range. */
const char *cap_capture_origin_name(int origin);

typedef struct {
    cap_event_kind_t kind;
    int reason;                 /* cap_reason_t (DECLINE), cap_evict_reason_t (EVICT) or
                                 * cap_capture_origin_t (CAPTURE) */
    const char *key_text;       /* valid during the callback only (as component) */
    uint64_t key_hash;
    int stream;                 /* stream index in this cache, from 0 */
    size_t bytes;               /* CAPTURE: graph + workspace; EVICT: bytes freed */
    size_t nodes;               /* CAPTURE: graph nodes */
    double seconds;             /* CAPTURE: capture + verify wall time */
    const char *component;      /* EVICT weight_sync: the component, else NULL; valid
                                 * during the callback only */
    uint64_t from_version, to_version;
    bool graph;                 /* EVICT: the entry held a graph (its CAPTURE came before);
                                 * false for one evicted while warming up, that only ran
                                 * eager, or whose graph was still being captured or
                                 * verified (never published: its workspace alone is freed) */
} cap_event_t;

typedef void (*cap_event_fn)(void *user, const cap_event_t *ev);
/* level: 0 debug, 1 info, 2 warning. */
typedef void (*cap_log_fn)(void *user, int level, const char *msg);

typedef struct {
    size_t budget_bytes;        /* graph + workspace bytes held; 0 = unlimited (up to
                                 * SIZE_MAX held in all: see Entries above) */
    int warmup;                 /* eager runs before capture (0: a key's first call
                                 * captures, pinning nothing); < 0 means default 2 */
    cap_policy_t policy;
    bool graphs;                /* false: never capture (every call eager, counted as override) */
    bool pin_inputs;            /* false: copy every input every call (for comparisons) */
    bool check_weights;         /* false: skip the per-buffer weight identity check before
                                 * replays (unsafe; for measuring its cost only) */
    int audit_every;            /* 1 replay in N per entry also runs eager and compares
                                 * bitwise (a mismatch evicts the entry); 0 = off */
    cap_event_fn on_event;      /* may be NULL; called with no cache lock held, from
                                 * the thread whose call or sync caused the event:
                                 * from several threads at once where several
                                 * dispatch (it must be thread-safe) */
    void *event_user;
    cap_log_fn log;             /* NULL: warnings to stderr */
    void *log_user;
} cap_options_t;

/* Defaults: unlimited budget, warmup 2, evict policy, graphs on, pinning on,
 * weight identity checked, audits off. */
cap_options_t cap_options_default(void);

/* A baked scalar constant of a call: captured once, compared on replay. A
 * call has at most CAP_MAX_CONSTS of them, each name NUL-terminated. */
#define CAP_MAX_CONSTS 8
typedef enum { CAP_CONST_I64, CAP_CONST_F64 } cap_const_type_t;
typedef struct {
    char name[CAP_NAME_MAX];
    cap_const_type_t type;
    union { int64_t i; double f; } v;
} cap_const_t;

/* The identity of one weight buffer a step reads: checked on every replay.
 * A kernel reads a weight through its layout as well as its address, and a
 * capture bakes both, so a weight re-laid-out in place (the same address,
 * bytes and dtype, another shape or strides: transposed, say) is a weight
 * the graph no longer reads as eager would: layout tells it apart. */
typedef struct {
    const void *addr;           /* first byte read */
    size_t bytes;
    kern_dtype_t dtype;
    int component;              /* index into the program's components[] */
    uint64_t layout;            /* its rank, shape and strides (cap_weight_of); 0: not told,
                                 * and then a re-layout at the same address goes unseen */
} cap_weight_t;

/* The identity of weight tensor t, read by the program's component
 * `component`: its first byte, bytes, dtype and layout. Can't fail. */
cap_weight_t cap_weight_of(const kern_tensor_t *t, int component);

/* The capturable step. Slots are tensors inside the workspace that the
 * step reads its inputs from; the cache redirects a slot to the caller's
 * tensor when it pins that input, and restores it otherwise. */
typedef struct {
    const char *name;
    int n_inputs, n_outputs;
    bool pinnable[CAP_MAX_INPUTS];   /* may input i be read in place? */
    /* The workspace for key on s; NULL with a message on failure. The
     * workspace owns every byte the step touches besides the weights,
     * including its kernels' scratch. */
    void *(*ws_new)(void *user, const cap_key_t *key, kern_stream_t *s);
    /* Bytes ws_new would allocate for key (for admission before the
     * allocation); NULL: the cache allocates, then measures. */
    size_t (*ws_size)(void *user, const cap_key_t *key);
    /* Frees ws. user may be gone (see Lifetimes): free from what ws holds. */
    void (*ws_free)(void *user, void *ws);
    size_t (*ws_bytes)(void *user, const void *ws);
    /* Slot of input i inside ws; also called as an entry is freed, when
     * user may be gone (see Lifetimes). */
    kern_tensor_t *(*input)(void *user, void *ws, int i);
    kern_tensor_t *(*output)(void *user, void *ws, int i);
    /* Launches one step on s reading only the workspace (and consts, which
     * the capture bakes in). 0, or -1 with a message. */
    int (*launch)(void *user, void *ws, const cap_const_t *consts, int n_consts, kern_stream_t *s);
    /* Components (names) whose weights the step reads, with their resident
     * memory: checked on every replay. */
    int n_components;
    const char *components[CAP_MAX_COMPONENTS];
    /* The weight buffers the step reads as they are now: fills up to max
     * entries of out and returns the total count (which may exceed max),
     * or -1 with a message. NULL: only the components' registered
     * residence is checked. */
    int (*weights)(void *user, cap_weight_t *out, int max);
} cap_program_t;

typedef struct {
    const cap_key_t *key;
    const kern_tensor_t *inputs;     /* n_inputs; on the backend's device or the host */
    const kern_tensor_t *outputs;    /* n_outputs destinations (copied out to); on the backend's
                                      * device or the host */
    const cap_const_t *consts;
    int n_consts;                    /* 0..CAP_MAX_CONSTS */
    bool not_capturable;             /* eager break: SDE step, no static form */
    bool override;                   /* eager break: interceptor override */
    bool prewarm;                    /* capture now if the entry is still in warmup (its
                                      * first call: no input pinned); the CAPTURE event's
                                      * reason says CAP_CAPTURE_PREWARM. A call like any
                                      * other otherwise (an entry READY replays) */
} cap_call_t;

typedef enum { CAP_RAN_EAGER, CAP_RAN_CAPTURED, CAP_RAN_REPLAYED } cap_ran_t;

typedef struct {
    cap_ran_t ran;
    cap_reason_t reason;             /* why eager (valid when ran == CAP_RAN_EAGER) */
} cap_result_t;

typedef struct {
    uint64_t calls, captures, replays, eager_runs, verifies, reverifies;
    uint64_t prewarm_captures;       /* of captures: asked by a prewarm call (cap_call_t) */
    uint64_t audits;                 /* audits run, equal or not (a mismatch is also an audit_mismatch
                                      * decline and eviction; an equal one a replay) */
    uint64_t transient_runs;         /* eager calls in a transient workspace (busy, budget) */
    uint64_t declines[CAP_DECLINE_COUNT];
    uint64_t evictions[CAP_EVICT_COUNT];       /* entries evicted, a graph or not */
    uint64_t graphless_evictions[CAP_EVICT_COUNT]; /* of those, entries that held no graph:
                                               * captures - cap_graph_evictions = graphs */
    double capture_seconds;          /* capture + verify, summed */
    double replay_seconds;           /* bind + replay + copy-out of replayed calls (an audit's eager run too) */
    double eager_seconds;            /* bind + launch + copy-out of eager calls */
    size_t bytes_held;               /* graph + workspace bytes of live entries */
    size_t graph_bytes, ws_bytes;
    size_t entries, graphs;
    uint64_t bind_bytes_copied;      /* copied into static buffers */
    uint64_t bind_bytes_pinned;      /* read in place instead */
    /* per call: eager, replayed (bind + run + copy-out), capture + verify;
     * eager_hist counts every call eager_runs does (transient ones too),
     * replay_hist every call replays does (audited ones too) */
    reel_hist_t eager_hist, replay_hist, capture_hist;
} cap_stats_t;

/* The graphs evicted for reason r (r < 0: for every reason): the
 * evictions of entries that held one. */
static inline uint64_t cap_graph_evictions(const cap_stats_t *st, int r) {
    int from = r < 0 ? 0 : r, to = r < 0 ? CAP_EVICT_COUNT : r + 1;
    uint64_t n = 0;
    for (int i = from; i < to; i++) n += st->evictions[i] - st->graphless_evictions[i];
    return n;
}

typedef struct cap_cache cap_cache_t;

/* A cache for backend b. NULL with a message on bad options. */
cap_cache_t *cap_cache_new(kern_backend_t *b, const cap_options_t *opt);
/* Evicts every entry (reason shutdown, one event each) and frees. The
 * caller guarantees no dispatch is running. */
void cap_cache_destroy(cap_cache_t **c);

/* Registers weight component `name` whose tensors live in [base, base+bytes)
 * at `version`. -1 with a message if the name is not a valid key name (as
 * cap_key_add_component requires), is taken, or the table is full. */
int cap_component_register(cap_cache_t *c, const char *name, const void *base, size_t bytes,
                           uint64_t version);
/* A weight sync of component `name` to new_version (must be greater than the
 * current one: -1 otherwise). Under the evict policy every entry whose key
 * reads `name` is dropped (event weight_sync) and base/bytes are taken as
 * the new residence. Under inplace, base must equal the registered base (the
 * caller copied the new weights into the resident buffers); entries are
 * re-keyed to new_version and each is re-verified bitwise on its next call.
 * Call between steps, never while a dispatch that reads `name` runs.
 * Returns the number of entries affected, or -1 with a message. */
int cap_component_update(cap_cache_t *c, const char *name, const void *base, size_t bytes,
                         uint64_t new_version);
/* cap_component_update under `policy` for this sync only, whatever the
 * cache's: a LoRA sync rewrites the resident buffers in place and keeps
 * every graph (inplace) even in a cache that evicts on full syncs. A
 * policy that is neither: -1, nothing changed. */
int cap_component_update_policy(cap_cache_t *c, const char *name, const void *base, size_t bytes,
                                uint64_t new_version, cap_policy_t policy);
/* The registered version of `name`; -1 (as int64) if unknown. Safe to call
 * from a program callback (see Program callbacks). */
int64_t cap_component_version(const cap_cache_t *c, const char *name);

/* Runs one call (see the top of this file). On success fills *res (may be
 * NULL) and the caller's outputs hold the step's results. Returns -1 with a
 * message when the call itself cannot run: an input that does not fit the
 * static workspace (counted as shape_mismatch; nothing is resized), an
 * unknown weight component, n_consts outside 0..CAP_MAX_CONSTS or a
 * constant whose name is not terminated, a failing launch, or a
 * re-entrant dispatch that cannot run (see Threads); and before anything
 * runs, for what the caller got wrong: a NULL cache, stream, program,
 * call, key, inputs or outputs, a program table missing ws_new, ws_free,
 * ws_bytes, input, output or launch or with counts past CAP_MAX_INPUTS /
 * CAP_MAX_COMPONENTS, an input or an output on another device than the
 * backend's (or the host); and as its workspace is made (freed again, no other entry
 * touched), a workspace whose input() or output() gives no slot. A
 * weights() listing that names a component outside the program's is a
 * failed capture (capture_failed), as a failing weights() is.
 * A key that names a registered component at another version than the
 * registered one (stale, or ahead of a sync) never gets an entry: the call
 * declines weights_moved and runs eagerly in a transient workspace. */
int cap_dispatch(cap_cache_t *c, kern_stream_t *s, const cap_program_t *p, void *user,
                 const cap_call_t *call, cap_result_t *res);

/* Drops every entry of key (all streams) with reason, which must be
 * CAP_EVICT_EXPLICIT or CAP_EVICT_SHAPE_CHANGE (the others belong to the
 * cache). Returns how many were dropped, or -1 with a message for another
 * reason or an invalid key. */
int cap_evict_key(cap_cache_t *c, const cap_key_t *key, cap_evict_reason_t reason);

/* Forgets stream s before its owner destroys it (see Lifetimes): waits for
 * a call on s in progress on another thread to end (as a dispatch on s
 * would), evicts every entry of s (reason stream_gone, one event each,
 * delivered before it returns), graphs and workspaces freed, and drops s
 * from the cache's streams, so a stream made later at its address is a new
 * one to the cache (its slot's index may be given to it). A stream the
 * cache never saw, or forgot already, is nothing to forget: 0. The caller
 * guarantees no call on s starts meanwhile; a dispatch on s afterwards
 * starts s afresh. Returns how many entries were evicted; -1 with a
 * message, nothing done, for a NULL cache or stream, or when called from
 * a dispatch (a step's launch: it would wait for its own stream, or hold
 * another's) or while this thread captures. */
int cap_forget_stream(cap_cache_t *c, kern_stream_t *s);

/* Evicts every entry (reason shutdown, one event each, delivered before it
 * returns), as cap_cache_destroy does, while the cache and its owner's
 * event sink still live: a worker that stops calls it before it says
 * goodbye, so the events of its last graphs reach the catalog. An entry a
 * dispatch holds goes when that dispatch ends. Call once no step will run:
 * a later call would capture again. Returns how many were evicted; -1
 * with a message for a NULL cache. */
int cap_cache_evict_all(cap_cache_t *c);

/* *out = the counters (all zero for a NULL cache; nothing for a NULL out). */
void cap_cache_stats(const cap_cache_t *c, cap_stats_t *out);

/* Checks the cache's invariants (the MRU list, byte and entry accounting,
 * the budget, in-use and doomed marks, entry states, per-stream
 * ownership); on a violation prints which one to stderr and returns
 * false. Takes the cache lock; can't fail otherwise. */
bool cap_cache_invariants(const cap_cache_t *c);

#ifdef __cplusplus
}
#endif
#endif
