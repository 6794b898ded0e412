/* ops_elementwise.c -- modulate, gated residual, add, GELU-tanh and SiLU on
 * the CPU, in float.
 *
 * Each output element depends only on the same-index inputs (and the
 * per-column vectors), read before it is written, so in-place use (y == x,
 * y == a or b) is safe; and rows or blocks run on the pool (cpu_pool.h) in
 * any chunks with the same results. */
#include "../ops_args.h"
#include "cpu_arith.h"
#include "cpu_pool.h"
#include "cpu_vmath.h"

static CPU_VEC_DISPATCH void modulate_rows(void *ctx, int64_t r0, int64_t r1) {
    const kern_modulate_args_t *a = ctx;
    const float *sh = a->shift, *sc = a->scale;
    const int64_t D = a->dim;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)a->x + r * D;
        float *y = (float *)a->y + r * D;
        for (int64_t i = 0; i < D; i++) y[i] = cpu_modulate_value(x[i], sh[i], sc[i]);
    }
}

/* y = x·(1 + scale) + shift per row. Cannot fail. */
static int modulate_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_modulate_args_t *a = args;
    if (a->dim > 0) cpu_par_rows(a->rows, a->dim, modulate_rows, (void *)a);
    return 0;
}

static CPU_VEC_DISPATCH void residual_rows(void *ctx, int64_t r0, int64_t r1) {
    const kern_residual_args_t *a = ctx;
    const int64_t D = a->dim;
    for (int64_t r = r0; r < r1; r++) {
        const float *g = a->gate && a->group ? (const float *)a->gate + r / a->group * a->gate_stride : a->gate;
        cpu_residual_row((float *)a->x + r * D, (const float *)a->y + r * D, g, D);
    }
}

/* x += gate·y, or x += y without a gate. Cannot fail. */
static int gated_residual_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_residual_args_t *a = args;
    if (a->dim > 0) cpu_par_rows(a->rows, a->dim, residual_rows, (void *)a);
    return 0;
}

/* Element-wise ops over n elements, in blocks of EW_BLOCK shared out over
 * the pool: an element's result does not depend on its block. */
#define EW_BLOCK 4096

typedef struct {
    const float *p, *q;
    float *y;
    int64_t n;
    int op; /* 0 add, 1 GELU-tanh, 2 SiLU */
    int64_t period; /* add: p repeats every period elements (0: none) */
} ew_job_t;

/* Blocks [r0, r1): the add here (memory-bound: plain vectorised C), GELU
 * and SiLU through cpu_vec.c's dispatched faces. */
static void ew_rows(void *ctx, int64_t r0, int64_t r1) {
    const ew_job_t *j = ctx;
    const int64_t lo = r0 * EW_BLOCK, hi = r1 * EW_BLOCK < j->n ? r1 * EW_BLOCK : j->n;
    if (j->op == 0 && j->period)
        for (int64_t i = lo; i < hi; i++) j->y[i] = j->p[i % j->period] + j->q[i];
    else if (j->op == 0)
        for (int64_t i = lo; i < hi; i++) j->y[i] = j->p[i] + j->q[i];
    else if (j->op == 1)
        cpu_vec_gelu_tanh(j->y + lo, j->p + lo, hi - lo);
    else
        cpu_vec_silu(j->y + lo, j->p + lo, hi - lo);
}

static void ew_run(const float *p, const float *q, float *y, int64_t n, int op, int64_t period) {
    if (n <= 0) return;
    ew_job_t j = { p, q, y, n, op, period };
    cpu_par_rows((n + EW_BLOCK - 1) / EW_BLOCK, op ? 8 * EW_BLOCK : EW_BLOCK, ew_rows, &j);
}

/* Cannot fail. */
static int add_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_binary_args_t *a = args;
    ew_run(a->a, a->b, a->y, a->n, 0, a->a_period);
    return 0;
}

/* 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³))), as u / (1 + e^(−2z)) in
 * cpu_vmath.h (shared with GEMM_GELU). Cannot fail. */
static int gelu_tanh_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_unary_args_t *a = args;
    ew_run(a->x, NULL, a->y, a->n, 1, 0);
    return 0;
}

/* u / (1 + e^−u) (cpu_vmath.h); e^−u overflowing to inf gives −0, the right
 * limit. Cannot fail. */
static int silu_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_unary_args_t *a = args;
    ew_run(a->x, NULL, a->y, a->n, 2, 0);
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_MODULATE, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "modulate_cpu", .fn = modulate_f32,
      .args_size = sizeof(kern_modulate_args_t), .capturable = true },
    { .op = KERN_OP_GATED_RESIDUAL, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "gated_residual_cpu", .fn = gated_residual_f32,
      .args_size = sizeof(kern_residual_args_t), .capturable = true },
    { .op = KERN_OP_ADD, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "add_cpu", .fn = add_f32,
      .args_size = sizeof(kern_binary_args_t), .capturable = true },
    { .op = KERN_OP_GELU_TANH, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "gelu_tanh_cpu", .fn = gelu_tanh_f32,
      .args_size = sizeof(kern_unary_args_t), .capturable = true },
    { .op = KERN_OP_SILU, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "silu_cpu", .fn = silu_f32,
      .args_size = sizeof(kern_unary_args_t), .capturable = true },
};

size_t kern_cpu_elementwise_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
