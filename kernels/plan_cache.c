/* plan_cache.c -- see plan_cache.h. A linear table: capacity is a few tens
 * (32 for SDPA), and a lookup happens once per attention launch. */
#include "plan_cache.h"
#include "base/error.h"

#include <stdlib.h>

typedef struct {
    kern_plan_shape_t sh;
    void *plan;
    uint64_t used;
} slot_t;

struct kern_plan_cache {
    int cap, n;
    uint64_t tick;
    kern_plan_free_fn free_fn;
    void *ctx;
    slot_t slot[];
};

kern_plan_cache_t *kern_plan_cache_new(int capacity, kern_plan_free_fn free_fn, void *ctx) {
    if (capacity < 1) capacity = 1;
    kern_plan_cache_t *c = calloc(1, sizeof *c + (size_t)capacity * sizeof(slot_t));
    if (!c) {
        reel_fail(REEL_E_NOMEM, "plan cache: out of memory");
        return NULL;
    }
    c->cap = capacity;
    c->free_fn = free_fn;
    c->ctx = ctx;
    return c;
}

void kern_plan_cache_destroy(kern_plan_cache_t **cp) {
    if (!cp || !*cp) return;
    kern_plan_cache_t *c = *cp;
    for (int i = 0; i < c->n; i++)
        if (c->free_fn) c->free_fn(c->ctx, c->slot[i].plan);
    free(c);
    *cp = NULL;
}

static bool same(const kern_plan_shape_t *a, const kern_plan_shape_t *b) {
    return a->nq == b->nq && a->nk == b->nk && a->heads == b->heads && a->d == b->d;
}

int kern_plan_cache_get(kern_plan_cache_t *c, const kern_plan_shape_t *sh, bool capturing,
                        kern_plan_make_fn make, void *make_ctx, void **plan) {
    c->tick++;
    int lru = 0;
    for (int i = 0; i < c->n; i++) {
        if (same(&c->slot[i].sh, sh)) {
            c->slot[i].used = c->tick;
            *plan = c->slot[i].plan;
            return 0;
        }
        if (c->slot[i].used < c->slot[lru].used) lru = i;
    }
    if (capturing)
        return reel_fail(REEL_E_STATE, "no plan yet for nq=%lld nk=%lld heads=%lld d=%lld on this stream, and "
                         "none is made inside a capture: run the shape eagerly on this stream before "
                         "capturing it", (long long)sh->nq, (long long)sh->nk, (long long)sh->heads,
                         (long long)sh->d);
    void *fresh = NULL;
    if (make(make_ctx, sh, &fresh)) return -1;
    int i;
    if (c->n < c->cap) {
        i = c->n++;
    } else {
        i = lru;
        if (c->free_fn) c->free_fn(c->ctx, c->slot[i].plan);
    }
    c->slot[i] = (slot_t){ *sh, fresh, c->tick };
    *plan = fresh;
    return 0;
}

int kern_plan_cache_size(const kern_plan_cache_t *c) { return c->n; }
