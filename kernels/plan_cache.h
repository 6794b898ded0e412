/* plan_cache.h -- a small per-stream cache of library plans keyed by shape
 * (cuDNN's SDPA execution plans, kernels/cuda/attention_cudnn.c): found by
 * shape, made on a miss only outside a capture, the least recently used
 * one recycled when full. Pure C: the caller makes and frees the plans
 * through callbacks, so the rules are tested on the CPU
 * (tests/test_plan_cache.c).
 *
 * Not thread-safe: one cache per stream, used by the thread that owns the
 * stream (as the stream itself is). */
#ifndef REEL_KERNELS_PLAN_CACHE_H
#define REEL_KERNELS_PLAN_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t nq, nk, heads, d;
} kern_plan_shape_t;

/* Makes the plan for sh into *plan: 0, or -1 with the error value set
 * (nothing is cached then). */
typedef int (*kern_plan_make_fn)(void *ctx, const kern_plan_shape_t *sh, void **plan);
/* Frees a plan the cache holds. Can't fail. */
typedef void (*kern_plan_free_fn)(void *ctx, void *plan);

typedef struct kern_plan_cache kern_plan_cache_t;

/* A cache of at most capacity (>= 1) plans, freed by free_fn(ctx, plan);
 * NULL with a message when out of memory. */
kern_plan_cache_t *kern_plan_cache_new(int capacity, kern_plan_free_fn free_fn, void *ctx);
/* Frees every plan held, then the cache; sets *c = NULL. NULL is fine. */
void kern_plan_cache_destroy(kern_plan_cache_t **c);
/* The plan for sh in *plan: the cached one (now the most recently used),
 * or, on a miss outside a capture, one made by make and cached (when full,
 * in place of the least recently used plan, which is freed once the new
 * one was made: a failed make loses nothing). On a miss while capturing: -1,
 * code state, naming the shape (a plan is made outside captures only: the
 * eager run before a capture makes it). A failed make: -1 with its error. */
int kern_plan_cache_get(kern_plan_cache_t *c, const kern_plan_shape_t *sh, bool capturing,
                        kern_plan_make_fn make, void *make_ctx, void **plan);
/* Plans held. */
int kern_plan_cache_size(const kern_plan_cache_t *c);

#endif
