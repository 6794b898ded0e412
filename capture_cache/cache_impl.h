/* cache_impl.h -- the capture cache's insides, shared by its files (not
 * part of the API; see cache.h for that):
 *
 *   cache.c           the cache: create/destroy, components and syncs,
 *                     eviction, the budget and LRU, the invariants
 *   cache_entry.c     entries: make, admit, free; binding inputs, copying
 *                     outputs, weight identities, an eager run
 *   cache_paths.c     the paths of a call: eager, capture + verify,
 *                     re-verify or audit, replay
 *   cache_dispatch.c  cap_dispatch: the call's stream, its entry, the path
 *                     chosen, the accounting
 *   cache_events.c    names, queued events, logs, declines
 *   cache_lock.c      the lock that knows its owner
 *
 * Calls point down that list's dependency order (dispatch -> paths ->
 * cache -> entry, events -> lock); no two files call each other.
 *
 * Entries live in one list (most recently used first) guarded by the cache
 * lock. A dispatch takes its stream's lock (recursive: a re-entrant call
 * on the same thread gets through and finds its entry busy), marks its
 * entry in_use under the cache lock, runs kernels without it, and clears
 * in_use under it again: eviction never frees an entry in use; it marks it
 * doomed and the dispatcher frees it on release. Events are queued while
 * the lock is held and delivered after it is dropped, so a callback may
 * call back into the cache.
 *
 * Every entry owns its workspace, scratch included, so entries of any
 * shapes coexist on one stream: a graph reads only its own entry's memory,
 * the caller's pinned inputs and the weights, each checked before a replay.
 *
 * Lock order: stream lock, then cache lock, then the component lock. A
 * re-entrant dispatch takes a second stream lock only if it is free, so no
 * thread ever waits for a stream lock while holding another. Where a
 * function needs a lock held, it checks (CAP_ASSERT_LOCKED) instead of
 * saying so in a comment. */
#ifndef REEL_CAPTURE_CACHE_IMPL_H
#define REEL_CAPTURE_CACHE_IMPL_H

#include "base/thread.h" /* reel_thread_self: the lock's owner */
#include "cache.h"
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* ---- locks that know their owner ------------------------------------------ */

/* Debug builds (assertions on, or -DREEL_INVARIANTS) record which thread
 * holds each lock, so "the caller holds the lock" is checked where it is
 * needed. The owner is atomic (read by any thread, compared only with the
 * reader's own id, which no other thread ever stores); the nesting depth
 * of a recursive lock is touched only by its owner, under the lock. */
#if !defined(NDEBUG) || defined(REEL_INVARIANTS)
#define CAP_LOCK_CHECKS 1
#endif

typedef struct {
    pthread_mutex_t mu;
#ifdef CAP_LOCK_CHECKS
    _Atomic uintptr_t owner;    /* reel_thread_self() of the holder; 0: nobody */
    int depth;                  /* the owner's holds (a recursive lock nests) */
#endif
} cap_lock_t;

/* Prints what was expected of a lock, where, and aborts. */
void cap_lock_violation(const char *what, const char *file, int line);
/* 0, or -1 with a message when the mutex cannot be made. */
int cap_lock_init(cap_lock_t *l, bool recursive);
void cap_lock_destroy(cap_lock_t *l);

static inline void cap_lock_took(cap_lock_t *l) {
#ifdef CAP_LOCK_CHECKS
    if (l->depth++ == 0) atomic_store_explicit(&l->owner, reel_thread_self(), memory_order_relaxed);
#else
    (void)l;
#endif
}

static inline void cap_lock(cap_lock_t *l) {
    pthread_mutex_lock(&l->mu);
    cap_lock_took(l);
}

/* True when it took the lock (free, or a recursive one this thread holds). */
static inline bool cap_trylock(cap_lock_t *l) {
    if (pthread_mutex_trylock(&l->mu) != 0) return false;
    cap_lock_took(l);
    return true;
}

/* True when this thread holds l (always true without CAP_LOCK_CHECKS). */
static inline bool cap_lock_mine(const cap_lock_t *l) {
#ifdef CAP_LOCK_CHECKS
    return atomic_load_explicit(&((cap_lock_t *)l)->owner, memory_order_relaxed) == reel_thread_self();
#else
    (void)l;
    return true;
#endif
}

static inline void cap_unlock(cap_lock_t *l) {
#ifdef CAP_LOCK_CHECKS
    if (!cap_lock_mine(l)) cap_lock_violation("unlocked by a thread that does not hold it", __FILE__, __LINE__);
    if (--l->depth == 0) atomic_store_explicit(&l->owner, 0, memory_order_relaxed);
#endif
    pthread_mutex_unlock(&l->mu);
}

#ifdef CAP_LOCK_CHECKS
#define CAP_ASSERT_LOCKED(l) \
    ((void)(cap_lock_mine(l) || (cap_lock_violation(#l " must be held by this thread", __FILE__, __LINE__), 0)))
#define CAP_ASSERT_UNLOCKED(l) \
    ((void)(!cap_lock_mine(l) || (cap_lock_violation(#l " must not be held by this thread", __FILE__, __LINE__), 0)))
#else
#define CAP_ASSERT_LOCKED(l) ((void)0)
#define CAP_ASSERT_UNLOCKED(l) ((void)0)
#endif

/* ---- the cache's state ------------------------------------------------------- */

typedef enum {
    ST_WARMUP,      /* eager runs, learning which inputs stay put */
    ST_CAPTURE,     /* warmup done: the next call captures */
    ST_READY,       /* a verified graph; calls replay after the checks */
    ST_REVERIFY,    /* weights updated in place: next call re-verifies */
    ST_BUDGET,      /* the graph did not fit: eager until the budget has room */
    ST_DISABLED,    /* permanent reason: always eager */
} state_t;

typedef struct {
    char name[CAP_NAME_MAX];
    const void *base;
    size_t bytes;
    uint64_t version;
    uint64_t generation;    /* bumped on every update of the memory */
} comp_t;

/* One stream the cache has seen: its lock serializes calls on it. Slots
 * are allocated one by one and never freed before the cache, so a mutex
 * never moves; a forgotten stream's slot (s NULL: cap_forget_stream) is
 * given to the next new stream. */
typedef struct {
    kern_stream_t *s;       /* NULL: forgotten, free for another stream */
    cap_lock_t mu;          /* recursive */
    int depth;              /* calls inside mu (nesting); written under the cache lock */
} stream_slot_t;

typedef struct entry {
    struct entry *prev, *next;          /* MRU list */
    cap_key_t key;
    char text[CAP_KEY_TEXT_MAX];
    uint64_t hash;
    kern_stream_t *stream;
    int stream_idx;
    const cap_program_t *prog_id;       /* the caller's table: identity only, never read (it
                                         * may be gone by the time the entry is freed) */
    cap_program_t prog;                 /* a copy of it, taken at creation: what the
                                         * entry calls, including after its program and
                                         * user are gone (cache.h, Lifetimes) */
    void *user;
    void *ws;
    size_t ws_bytes;                           /* the workspace's, plus snap's */
    void *snap;                                /* verify's copy of the inputs: allocated with the
                                                * entry, so no verify or audit allocates device
                                                * memory (which could break another stream's capture) */
    bool transient;                            /* not in the list, not accounted */
    kern_tensor_t static_in[CAP_MAX_INPUTS];   /* slots as the workspace made them */
    kern_graph_t *graph;
    size_t graph_bytes;
    bool admitted;                             /* graph accounted (verified and fit) */
    size_t budget_need;                        /* ST_BUDGET: bytes the graph needed */
    state_t state;
    cap_reason_t disabled_reason;
    int warm;
    int capture_fails;                         /* failed captures so far (CAP_CAPTURE_TRIES) */
    bool told_permanent;                       /* the permanent capture_failed was logged */
    uint64_t since_audit;                      /* replays since the last audit */
    bool ident_stable[CAP_MAX_INPUTS];
    kern_tensor_t ident[CAP_MAX_INPUTS];       /* caller's tensor seen in warmup / pinned */
    bool pinned[CAP_MAX_INPUTS];
    cap_const_t consts[CAP_MAX_CONSTS];
    int n_consts;
    int comp[CAP_MAX_COMPONENTS];              /* index into the component table */
    const void *comp_base[CAP_MAX_COMPONENTS]; /* as baked into the graph */
    uint64_t comp_gen[CAP_MAX_COMPONENTS];
    cap_weight_t *wid;                         /* weight buffers baked in (program's weights()) */
    int n_wid;
    cap_weight_t *wid_now;                     /* room for n_wid + 1: the replay-time listing */
    bool in_use, doomed;
    bool reverify_pending;                     /* an inplace sync landed during a capture */
    cap_evict_reason_t doom_reason;
} entry_t;

typedef struct {
    cap_event_t ev;
    char text[CAP_KEY_TEXT_MAX];
    char comp[CAP_NAME_MAX];
} queued_t;

typedef struct {
    queued_t *q;
    size_t n, cap;
    bool lost;          /* an allocation failed: events were dropped (stats still count) */
} evq_t;

/* The (key, reason) pairs whose decline was logged: a set-associative
 * table of CAP_LOGGED_SETS sets of CAP_LOGGED_WAYS, most recent first in
 * its set, so memory and each lookup stay bounded however many keys a
 * long run makes (every evict-policy sync makes new ones). A pair pushed
 * out of its set by CAP_LOGGED_WAYS newer ones is logged again when it
 * recurs. */
#define CAP_LOGGED_SETS 1024
#define CAP_LOGGED_WAYS 4
typedef struct { uint64_t hash; int reason; bool used; } logged_t;

struct cap_cache {
    kern_backend_t *backend;
    cap_options_t opt;
    cap_lock_t lock;
    entry_t *head;                  /* most recently used first */
    comp_t comp[CAP_MAX_COMPONENTS];
    int n_comp;                     /* n_comp, names and versions change under lock and comp_lock */
    cap_lock_t comp_lock;           /* lets cap_component_version run without lock, so a
                                     * program callback called under lock may use it */
    stream_slot_t **streams;        /* index = stream number in events */
    int n_streams, cap_streams;
    logged_t *logged;               /* CAP_LOGGED_SETS x CAP_LOGGED_WAYS, made on first use */
    cap_stats_t st;
};

/* Where a new (or re-learning) entry starts: warmup, or with warmup 0 a
 * capture at its first call (nothing pinned: no address seen twice). */
static inline state_t cap_warm_state(const struct cap_cache *c) {
    return c->opt.warmup == 0 ? ST_CAPTURE : ST_WARMUP;
}

/* SQLite style: the invariants hold at the end of every public function.
 * Checked in builds with -DREEL_INVARIANTS (make asan, make tsan). */
#ifdef REEL_INVARIANTS
#define CHECK_INVARIANTS(c) assert(cap_cache_invariants(c))
#else
#define CHECK_INVARIANTS(c) ((void)0)
#endif

/* Bytes a call moved into the workspace, and when it started. */
typedef struct {
    uint64_t copied, pinned;
    double t0;
} call_acct_t;

/* One call in progress: what the phases of a dispatch share. */
typedef enum { P_EAGER, P_CAPTURE, P_REPLAY, P_REVERIFY, P_AUDIT } path_t;

typedef struct {
    cap_cache_t *c;
    kern_stream_t *s;
    stream_slot_t *sl;
    const cap_program_t *p;
    void *user;
    const cap_call_t *call;
    entry_t *e;
    path_t path;
    cap_reason_t reason;        /* COUNT: no decline */
    cap_ran_t ran;
    call_acct_t acct;
    evq_t q;
    char logbuf[CAP_KEY_TEXT_MAX + 200];
} dispatch_t;

/* ---- cache_events.c ---------------------------------------------------------- */

/* Queues an event about e (delivered by cap_evq_flush); on out of memory
 * the event is dropped and the queue remembers it. Can't fail. */
void cap_evq_push(evq_t *q, cap_event_kind_t kind, int reason, const entry_t *e, size_t bytes, size_t nodes,
                  double secs, const char *comp, uint64_t from, uint64_t to);
/* Delivers and frees the queued events (the queue is empty afterwards).
 * The cache lock must not be held (callbacks may call the cache). */
void cap_evq_flush(cap_cache_t *c, evq_t *q);
/* To the log callback, or warnings (level 2) to stderr. */
void cap_log(cap_cache_t *c, int level, const char *msg);
/* Records a decline of e: counts, queues the event, and the first time
 * for (reason, key) writes a warning into logbuf. Lock held. */
void cap_declined(cap_cache_t *c, entry_t *e, cap_reason_t r, evq_t *q, char *logbuf, size_t loglen);

/* ---- cache_entry.c ------------------------------------------------------------ */

entry_t *cap_entry_make(cap_cache_t *c, kern_stream_t *s, int sidx, const cap_program_t *p, void *user,
                        const cap_key_t *key, uint64_t hash, const char *text, const int *comp);
void cap_entry_admit(cap_cache_t *c, entry_t *e);
void cap_entry_unlink(cap_cache_t *c, entry_t *e);
void cap_entry_push_front(cap_cache_t *c, entry_t *e);
void cap_entry_drop_graph(cap_cache_t *c, entry_t *e);
/* Drops e's graph (if any) while the key stays: an eviction (dropped)
 * event on q and in the counters, then cap_entry_drop_graph. */
void cap_entry_retire_graph(cap_cache_t *c, entry_t *e, evq_t *q);
void cap_entry_free(cap_cache_t *c, entry_t *e);
void cap_unpin_and_recapture(cap_cache_t *c, entry_t *e, int i, evq_t *q);
bool cap_same_ident(const kern_tensor_t *a, const kern_tensor_t *b);
int cap_check_inputs(const entry_t *e, const cap_call_t *call);
int cap_bind(entry_t *e, kern_stream_t *s, const cap_call_t *call, bool use_pins, uint64_t *copied,
             uint64_t *pinned);
int cap_copy_out(entry_t *e, kern_stream_t *s, const cap_call_t *call);
bool cap_consts_equal(const entry_t *e, const cap_call_t *call);
bool cap_output_aliases_pin(const entry_t *e, const cap_call_t *call);
int cap_weights_record(entry_t *e);
bool cap_weights_same(const cap_cache_t *c, entry_t *e);
int cap_launch_eager(entry_t *e, kern_stream_t *s, const cap_call_t *call, call_acct_t *a);
int cap_run_eager(entry_t *e, kern_stream_t *s, const cap_call_t *call, call_acct_t *a);

/* ---- cache.c -------------------------------------------------------------------- */

void cap_evict(cap_cache_t *c, entry_t *e, cap_evict_reason_t r, evq_t *q, const char *comp, uint64_t from,
               uint64_t to);
bool cap_evict_idle(cap_cache_t *c, evq_t *q, size_t need);
/* Whether need bytes more would fit the budget once every idle entry but
 * keep were evicted (what cap_make_room checks before it evicts). */
bool cap_could_fit(const cap_cache_t *c, const entry_t *keep, size_t need);
bool cap_make_room(cap_cache_t *c, entry_t *keep, size_t need, evq_t *q);
void cap_admit_graph(cap_cache_t *c, entry_t *e, size_t gb);
int cap_stream_find(const cap_cache_t *c, const kern_stream_t *s);
int cap_stream_slot(cap_cache_t *c, kern_stream_t *s);
int cap_stream_forget(cap_cache_t *c, int si, evq_t *q);
int cap_comp_find(const cap_cache_t *c, const char *name);
int cap_resolve_components(const cap_cache_t *c, const cap_program_t *p, int *comp);
entry_t *cap_find(cap_cache_t *c, kern_stream_t *s, const cap_program_t *p, void *user, uint64_t hash,
                  const char *text);
bool cap_versions_current(const cap_cache_t *c, const cap_key_t *k);

/* ---- cache_paths.c --------------------------------------------------------------- */

/* True while this thread captures a step (between begin and end). */
bool cap_this_thread_captures(void);
int cap_path_eager(dispatch_t *d);
int cap_path_capture(dispatch_t *d);
int cap_path_verify(dispatch_t *d);
int cap_path_replay(dispatch_t *d);

#endif
