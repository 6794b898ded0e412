/* ops_elementwise.c -- modulate, gated residual, add, GELU-tanh and SiLU on
 * the CPU, in float.
 *
 * Each output element depends only on the same-index inputs (and the
 * per-column vectors), read before it is written, so in-place use (y == x,
 * y == a or b) is safe. */
#include "../ops_args.h"
#include "cpu_arith.h"
#include <math.h>

/* y = x·(1 + scale) + shift per row. Cannot fail. */
static int modulate_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_modulate_args_t *a = args;
    const float *sh = a->shift, *sc = a->scale;
    int64_t D = a->dim;
    for (int64_t r = 0; r < a->rows; r++) {
        const float *x = (const float *)a->x + r * D;
        float *y = (float *)a->y + r * D;
        for (int64_t i = 0; i < D; i++) y[i] = cpu_modulate_value(x[i], sh[i], sc[i]);
    }
    return 0;
}

/* x += gate·y, or x += y without a gate. Cannot fail. */
static int gated_residual_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_residual_args_t *a = args;
    const float *g = a->gate;
    int64_t D = a->dim;
    for (int64_t r = 0; r < a->rows; r++)
        cpu_residual_row((float *)a->x + r * D, (const float *)a->y + r * D, g, D);
    return 0;
}

/* Cannot fail. */
static int add_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_binary_args_t *a = args;
    const float *p = a->a, *q = a->b;
    float *y = a->y;
    for (int64_t i = 0; i < a->n; i++) y[i] = p[i] + q[i];
    return 0;
}

/* 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³))), cpu_arith.h's (shared with
 * GEMM_GELU). Cannot fail. */
static int gelu_tanh_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_unary_args_t *a = args;
    const float *x = a->x;
    float *y = a->y;
    for (int64_t i = 0; i < a->n; i++) y[i] = cpu_gelu_tanh(x[i]);
    return 0;
}

/* u / (1 + e^−u); e^−u overflowing to inf gives −0, the right limit. Cannot fail. */
static int silu_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_unary_args_t *a = args;
    const float *x = a->x;
    float *y = a->y;
    for (int64_t i = 0; i < a->n; i++) {
        float u = x[i];
        y[i] = u / (1.0f + expf(-u));
    }
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
