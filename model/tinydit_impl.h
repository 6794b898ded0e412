/* tinydit_impl.h -- the model's private layout, shared by tdit_config.c
 * (the weight table), tinydit.c (loading) and step.c (the forward pass).
 * Nothing outside model includes it. */
#ifndef REEL_MODEL_TINYDIT_IMPL_H
#define REEL_MODEL_TINYDIT_IMPL_H

#include "tinydit.h"

#define TRY(x) do { if ((x) != 0) return -1; } while (0)
#define LN_EPS 1e-6f
#define SHAPE(...) ((const int64_t[]){ __VA_ARGS__ })

typedef struct { kern_tensor_t w, b; } lin_t;

typedef struct {
    kern_tensor_t modulation;                  /* [6, D] view of [1, 6, D] */
    lin_t sq, sk, sv, so;                      /* self-attention */
    kern_tensor_t s_norm_q, s_norm_k;
    kern_tensor_t norm3_w, norm3_b;
    lin_t cq, ck, cv, co;                      /* cross-attention */
    kern_tensor_t c_norm_q, c_norm_k;
    lin_t ffn0, ffn2;
} block_t;

struct tdit_model {
    kern_backend_t *backend;
    tdit_config_t cfg;
    kern_dtype_t dtype;
    void *arena;            /* every weight, one allocation: addresses never move */
    size_t bytes;
    lin_t patch;            /* w viewed as [D, 4C] */
    lin_t text0, text2, time0, time2, proj;
    block_t *blocks;
    kern_tensor_t head_mod; /* [2, D] view of [1, 2, D] */
    lin_t head;
    kern_tensor_t **tensors; /* every weight tensor above, in file order */
    int n_tensors;
};

/* ---- the weight table (tdit_config.c) ---- */

typedef enum { W_LINEAR, W_BIAS, W_NORM, W_NORM_BIAS, W_MOD } wkind_t;

typedef struct {
    char name[80];
    int ndim;
    int64_t shape[KERN_MAX_DIMS];
    wkind_t kind;
    int64_t fan_in;
    kern_tensor_t *slot;   /* where the loaded tensor goes (NULL when listing) */
} wentry_t;

typedef struct {
    wentry_t *e;
    size_t n, cap;
    int failed;
} wlist_t;

/* Lists every weight of c in file order into l (l->e is the caller's to
 * free, also on failure); with m, each entry's slot points into m. 0, or
 * -1 with a message (out of memory). */
int tdit_list_weights(const tdit_config_t *c, tdit_model_t *m, wlist_t *l);

/* The number of elements of w. */
static inline int64_t numel_of(const wentry_t *w) {
    int64_t k = 1;
    for (int d = 0; d < w->ndim; d++) k *= w->shape[d];
    return k;
}

#endif
