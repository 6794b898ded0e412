/* ops_norm.c -- LayerNorm and RMSNorm over the last dim on the CPU.
 *
 * Row statistics and outputs are in float, as upstream Wan2.1's LayerNorm
 * and RMSNorm on float32 tensors (two passes for LayerNorm, so a large mean
 * does not cancel the variance away; cpu_arith.h). Every row's inputs are fully read
 * before its outputs are written, which is what lets y equal x. The row
 * statistics are cpu_arith.h's, shared with the fused kernels (ops_fused.c).
 * Rows are independent: they are shared out over the pool (cpu_pool.h),
 * which changes no result. */
#include "../ops_args.h"
#include "cpu_arith.h"
#include "cpu_pool.h"

static CPU_VEC_DISPATCH void layernorm_rows(void *ctx, int64_t r0, int64_t r1) {
    const kern_norm_args_t *a = ctx;
    const float *w = a->weight, *b = a->bias;
    const int64_t D = a->dim;
    for (int64_t r = r0; r < r1; r += CPU_STAT_ROWS) { /* the chunk's statistics, then its outputs */
        const int64_t n = r1 - r < CPU_STAT_ROWS ? r1 - r : CPU_STAT_ROWS;
        const float *x = (const float *)a->x + r * D;
        float *y = (float *)a->y + r * D;
        float mean[CPU_STAT_ROWS], rstd[CPU_STAT_ROWS];
        cpu_layernorm_stats_rows(x, n, D, a->eps, mean, rstd);
        for (int64_t i = 0; i < n; i++) {
            const float *xi = x + i * D;
            float *yi = y + i * D;
            if (w)
                cpu_layernorm_affine_row(yi, xi, D, mean[i], rstd[i], w, b);
            else
                for (int64_t c = 0; c < D; c++) yi[c] = cpu_layernorm_value(xi[c], mean[i], rstd[i]);
        }
    }
}

/* Rows shared out over the pool (cpu_pool.h). Cannot fail. */
static int layernorm_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_norm_args_t *a = args;
    if (a->dim > 0) cpu_par_rows(a->rows, a->dim, layernorm_rows, (void *)a);
    return 0;
}

static CPU_VEC_DISPATCH void rmsnorm_rows(void *ctx, int64_t r0, int64_t r1) {
    const kern_norm_args_t *a = ctx;
    const float *w = a->weight;
    const int64_t D = a->dim;
    for (int64_t r = r0; r < r1; r += CPU_STAT_ROWS) { /* the chunk's statistics, then its outputs */
        const int64_t n = r1 - r < CPU_STAT_ROWS ? r1 - r : CPU_STAT_ROWS;
        const float *x = (const float *)a->x + r * D;
        float *y = (float *)a->y + r * D;
        float rrms[CPU_STAT_ROWS];
        cpu_rms_scale_rows(x, n, D, a->eps, rrms);
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < D; c++) y[i * D + c] = cpu_rms_value(x[i * D + c], rrms[i], w[c]);
    }
}

/* Cannot fail. */
static int rmsnorm_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_norm_args_t *a = args;
    if (a->dim > 0) cpu_par_rows(a->rows, a->dim, rmsnorm_rows, (void *)a);
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_LAYERNORM, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "layernorm_cpu", .fn = layernorm_f32, .args_size = sizeof(kern_norm_args_t),
      .workspace_bytes = NULL, .capturable = true },
    { .op = KERN_OP_RMSNORM, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "rmsnorm_cpu", .fn = rmsnorm_f32, .args_size = sizeof(kern_norm_args_t),
      .workspace_bytes = NULL, .capturable = true },
};

size_t kern_cpu_norm_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
