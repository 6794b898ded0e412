/* artifact_impl.h -- internal to kernels/artifact*.c: the ops an artifact
 * may replace (how to read an argument block's sizes and find its output),
 * the state of a set, shared by the loader (artifacts.c), the dispatcher
 * (artifact_run.c) and the reports (artifact_report.c), and the locks that
 * know their owner (artifact_lock.c).
 *
 * Locks: a set's mutex (art_lock / art_unlock) and the install lock. Where
 * a function needs one held, or must run without one (a kernel, a backend
 * allocation, an event callback), it checks (ART_ASSERT_LOCKED,
 * ART_ASSERT_UNLOCKED, ART_CHECK) instead of saying so in a comment. */
#ifndef REEL_KERNELS_ARTIFACT_IMPL_H
#define REEL_KERNELS_ARTIFACT_IMPL_H

#include "artifacts.h"
#include "artifact_abi.h"
#include "base/thread.h" /* reel_owner_t: who holds a lock */
#include <limits.h>
#include <pthread.h>

/* An op an artifact may replace: one output buffer, found at out_off in
 * the argument block, of out_elems(args) elements of the op's dtype. */
typedef struct {
    kern_op_t op;
    size_t args_size;
    int n_dims;
    const char *dims[KERN_ART_MAX_DIMS];
    void (*sizes)(const void *args, int64_t *out); /* n_dims values */
    size_t out_off;                                /* offsetof the output pointer */
    int64_t (*out_elems)(const void *args);
} art_op_t;

/* The op's descriptor, or NULL when no artifact may replace it. */
const art_op_t *art_op(kern_op_t op);

#define ART_MAX_KERNELS 4           /* one per dtype */
#define ART_BLOCK_MAX 512           /* an argument block plus the trampoline's trailer */

struct art_bundle;

typedef struct {
    kern_impl_t impl;
    char name[64];
    struct art_bundle *art;
} art_kernel_t;

typedef struct art_bundle {
    char bundle[NAME_MAX + 1];
    char path[PATH_MAX];
    char error[768];
    bool parsed, verified, enabled, named, loaded;
    kern_art_manifest_t m;
    void *dl;
    art_kernel_t k[ART_MAX_KERNELS];
    int n_k;
} art_bundle_t;

/* One (artifact kernel, arch, sizes): its state and counters. Keys live as
 * long as the set (a graph's trampoline block points at one). */
typedef struct art_key {
    struct art_key *next;           /* hash chain */
    struct art_key *all;            /* creation order */
    const art_kernel_t *k;
    char arch[KERN_ART_ARCH_MAX];
    int64_t sizes[KERN_ART_MAX_DIMS];
    uint64_t scope;                 /* the capture key's hash (kern_artifacts_set_scope); 0: none */
    uint64_t hash;
    kern_art_state_t state;
    int fail_streak;                /* runtime failures in a row while undecided */
    char text[KERN_ART_KEY_MAX];
    char reason[192];
    kern_art_counts_t n;
    double m2;                      /* Welford's sum of squares of speedup */
} art_key_t;

#define ART_MAX_CANDS 8

struct kern_artifacts {
    char root[PATH_MAX];
    art_bundle_t *b;
    size_t n;
    kern_art_timing_t timing;
    bool installed;
    pthread_mutex_t mu;             /* keys and their counters: art_lock / art_unlock only */
    reel_owner_t mu_owner;          /* who holds mu (debug builds; see ART_LOCK_CHECKS) */
    art_key_t **bucket;
    size_t n_bucket, n_keys;
    art_key_t *first, *last;
    /* Candidates per (op, backend, dtype), manifest id order. */
    const art_kernel_t *cand[KERN_OP_COUNT][KERN_BACKEND_COUNT][KERN_DTYPE_COUNT][ART_MAX_CANDS];
    int n_cand[KERN_OP_COUNT][KERN_BACKEND_COUNT][KERN_DTYPE_COUNT];
    kern_art_event_fn on_event;
    void *event_user;
};

/* ---- locks that know their owner ------------------------------------------ */

/* Debug builds (assertions on, or -DREEL_INVARIANTS) record which thread
 * holds a set's mutex and the install lock, so "held" and "not held" are
 * checked where they are needed; otherwise the checks and the bookkeeping
 * compile to nothing. */
#if !defined(NDEBUG) || defined(REEL_INVARIANTS)
#define ART_LOCK_CHECKS 1
#endif

/* Prints what was expected of a lock, where, and aborts (artifact_lock.c). */
void art_lock_violation(const char *what, const char *file, int line);

#ifdef ART_LOCK_CHECKS
#define ART_CHECK(cond, what) ((void)((cond) || (art_lock_violation(what, __FILE__, __LINE__), 0)))
#else
#define ART_CHECK(cond, what) ((void)sizeof((cond) ? 1 : 0)) /* never evaluated: no cost */
#endif
#define ART_ASSERT_LOCKED(set) \
    ART_CHECK(reel_owner_mine(&(set)->mu_owner), "the set's mutex must be held by this thread")
#define ART_ASSERT_UNLOCKED(set) \
    ART_CHECK(!reel_owner_mine(&(set)->mu_owner), "the set's mutex must not be held by this thread")

/* Takes the set's mutex; taking it again on the thread that holds it
 * aborts (debug builds) instead of deadlocking. */
static inline void art_lock(kern_artifacts_t *set) {
    ART_ASSERT_UNLOCKED(set);
    pthread_mutex_lock(&set->mu);
#ifdef ART_LOCK_CHECKS
    reel_owner_set(&set->mu_owner);
#endif
}

static inline void art_unlock(kern_artifacts_t *set) {
#ifdef ART_LOCK_CHECKS
    ART_CHECK(reel_owner_mine(&set->mu_owner), "the set's mutex unlocked by a thread that does not hold it");
    reel_owner_clear(&set->mu_owner);
#endif
    pthread_mutex_unlock(&set->mu);
}

/* The install lock (artifact_lock.c): serialises kern_artifacts_install
 * and _uninstall. art_install_lock_mine is true when this thread holds it;
 * meaningful only with ART_LOCK_CHECKS (use it inside ART_CHECK). */
void art_install_lock(void);
void art_install_unlock(void);
bool art_install_lock_mine(void);

/* The dispatch hook kern_artifacts_install sets (artifact_run.c). */
int art_dispatch_hook(kern_stream_t *s, kern_op_t op, kern_dtype_t dt, void *args,
                      const kern_impl_t *native, int *rc);
/* Frees the keys (artifact_run.c). Set not installed. */
void art_run_free(kern_artifacts_t *set);
/* Makes set (NULL: none) the one the hook routes through (artifact_run.c;
 * kern_artifacts_installed reads it). Called only by kern_artifacts_install
 * and _uninstall, with the install lock held (checked). */
void art_run_set_installed(kern_artifacts_t *set);

#endif
