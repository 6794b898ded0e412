/* artifact_impl.h -- internal to kernels/artifact*.c: the ops an artifact
 * may replace (how to read an argument block's sizes and find its output),
 * and the state of a set, shared by the loader (artifacts.c), the
 * dispatcher (artifact_run.c) and the reports (artifact_report.c). */
#ifndef REEL_KERNELS_ARTIFACT_IMPL_H
#define REEL_KERNELS_ARTIFACT_IMPL_H

#include "artifacts.h"
#include "artifact_abi.h"
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
    pthread_mutex_t mu;             /* keys and their counters */
    art_key_t **bucket;
    size_t n_bucket, n_keys;
    art_key_t *first, *last;
    /* Candidates per (op, backend, dtype), manifest id order. */
    const art_kernel_t *cand[KERN_OP_COUNT][KERN_BACKEND_COUNT][KERN_DTYPE_COUNT][ART_MAX_CANDS];
    int n_cand[KERN_OP_COUNT][KERN_BACKEND_COUNT][KERN_DTYPE_COUNT];
    kern_art_event_fn on_event;
    void *event_user;
};

/* The dispatch hook kern_artifacts_install sets (artifact_run.c). */
int art_dispatch_hook(kern_stream_t *s, kern_op_t op, kern_dtype_t dt, void *args,
                      const kern_impl_t *native, int *rc);
/* Frees the keys (artifact_run.c). Set not installed. */
void art_run_free(kern_artifacts_t *set);
/* Makes set (NULL: none) the one the hook routes through (artifact_run.c;
 * kern_artifacts_installed reads it). Called only by kern_artifacts_install
 * and _uninstall, under their lock. */
void art_run_set_installed(kern_artifacts_t *set);

#endif
