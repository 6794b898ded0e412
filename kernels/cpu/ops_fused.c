/* ops_fused.c -- the fused norm ops on the CPU: LayerNorm + adaLN modulate,
 * RMSNorm + 3-D RoPE, and a residual + LayerNorm (modulated or affine),
 * each one pass over its rows.
 *
 * Each is bit for bit the unfused pair of CPU kernels (ops.h): the same
 * cpu_arith.h expressions in the same order, with the intermediate rounded
 * to float where the unfused pair stores it. The numpy crosscheck and every
 * bitwise test of the step depend on that. What the fusion saves is the
 * intermediate row's trip through memory: the row is normalised and finished
 * while it is in cache. Every row's inputs are read before its outputs are
 * written, so y may equal x. Rows are independent: the pool (cpu_pool.h)
 * runs them in chunks, which changes no result. */
#include <string.h>
#include "../ops_args.h"
#include "base/error.h"
#include "cpu_arith.h"
#include "cpu_pool.h"

/* Row r's per-group parameter (ops_args.h, "Row groups"). */
static inline const float *group_row(const void *p, int64_t group, int64_t stride, int64_t r) {
    return p && group ? (const float *)p + r / group * stride : p;
}

static CPU_VEC_DISPATCH void layernorm_modulate_rows(void *ctx, int64_t r0, int64_t r1) {
    const kern_norm_modulate_args_t *a = ctx;
    const int64_t D = a->dim;
    for (int64_t r = r0; r < r1; r += CPU_STAT_ROWS) { /* the chunk's statistics, then its outputs */
        const int64_t n = r1 - r < CPU_STAT_ROWS ? r1 - r : CPU_STAT_ROWS;
        float mean[CPU_STAT_ROWS], rstd[CPU_STAT_ROWS];
        cpu_layernorm_stats_rows((const float *)a->x + r * D, n, D, a->eps, mean, rstd);
        for (int64_t i = 0; i < n; i++) {
            const float *sh = group_row(a->shift, a->group, a->shift_stride, r + i);
            const float *sc = group_row(a->scale, a->group, a->scale_stride, r + i);
            const float *x = (const float *)a->x + (r + i) * D;
            float *y = (float *)a->y + (r + i) * D;
            for (int64_t c = 0; c < D; c++)
                y[c] = cpu_modulate_value(cpu_layernorm_value(x[c], mean[i], rstd[i]), sh[c], sc[c]);
        }
    }
}

/* y = LN(x)·(1 + scale) + shift per row; LN(x) is rounded to float first,
 * as LAYERNORM stores it. Cannot fail. */
static int layernorm_modulate_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_norm_modulate_args_t *a = args;
    if (a->dim > 0) cpu_par_rows(a->rows, a->dim, layernorm_modulate_rows, (void *)a);
    return 0;
}

static size_t rmsnorm_rope_workspace(const void *args) {
    const kern_rmsnorm_rope_args_t *a = args;
    return cpu_rope_table_bytes(a->head_dim, a->frames, a->rows, a->cols);
}

/* Normalises the npairs pairs at x (weights at w) by rrms, rounding each to
 * float as RMSNORM stores it, and turns them by the (cos, sin) pairs of cs:
 * four pairs at a time as eight doubles, then the rest pair by pair
 * (cpu_rope_turn). Lane by lane the vector loop does cpu_rms_value's and
 * cpu_rope_turn's operations: every product rounded to double, then u·c −
 * w·s or u·s + w·c, then float, so the same bits. Written as vectors
 * because GCC 12 had fused the scalar form's first product into the
 * subtraction (cpu_opaque in cpu_arith.h); with the product rounded as
 * written, tiny's node runs as fast as the fused form did. */
static inline __attribute__((always_inline)) void norm_turn(float *x, const float *w, float rrms, const double *cs,
                                                            int64_t npairs) {
    int64_t j = 0;
    for (; j + 4 <= npairs; j += 4) {
        cpu_vh xv = cpu_vhload(x + 2 * j), wv = cpu_vhload(w + 2 * j);
        cpu_vd c;
        memcpy(&c, cs + 2 * j, sizeof c);
        const cpu_vd d = __builtin_convertvector(xv * rrms * wv, cpu_vd); /* u0 w0 u1 w1 ... */
        const cpu_vd sw = __builtin_shufflevector(d, d, 1, 0, 3, 2, 5, 4, 7, 6);
        const cpu_vd p = d * __builtin_shufflevector(c, c, 0, 0, 2, 2, 4, 4, 6, 6);  /* u·c, w·c */
        const cpu_vd q = sw * __builtin_shufflevector(c, c, 1, 1, 3, 3, 5, 5, 7, 7); /* w·s, u·s */
        const cpu_vd diff = p - q, sum = q + p;
        cpu_vhstore(x + 2 * j, __builtin_convertvector(__builtin_shufflevector(diff, sum, 0, 9, 2, 11, 4, 13, 6, 15), cpu_vh));
    }
    for (; j < npairs; j++) {
        float u = cpu_rms_value(x[2 * j], rrms, w[2 * j]);
        float v = cpu_rms_value(x[2 * j + 1], rrms, w[2 * j + 1]);
        cpu_rope_turn(u, v, cs[2 * j], cs[2 * j + 1], &x[2 * j], &x[2 * j + 1]);
    }
}

/* Head widths up to this take a token's three parts of the table as one
 * row (the same values in the same order: no result changes). */
#define ROPE_ROW_MAX 512

typedef struct {
    const kern_rmsnorm_rope_args_t *a;
    cpu_rope_tables_t t;
} rope_job_t;

/* Token rows [r0, r1): the RMS over the whole row, then each head
 * normalised and rotated pair by pair. */
static CPU_VEC_DISPATCH void rmsnorm_rope_rows(void *ctx, int64_t r0, int64_t r1) {
    const rope_job_t *j = ctx;
    const kern_rmsnorm_rope_args_t *a = j->a;
    const cpu_rope_tables_t t = j->t;
    const int64_t H = a->heads, d = a->head_dim, R = a->rows, C = a->cols, D = H * d, T = a->frames * R * C;
    const float *wt = a->weight;
    double cs[ROPE_ROW_MAX]; /* the token's (cos, sin) of every pair of a head */
    for (int64_t r = r0; r < r1; r += CPU_STAT_ROWS) { /* the chunk's RMS, then its rows */
        const int64_t n = r1 - r < CPU_STAT_ROWS ? r1 - r : CPU_STAT_ROWS;
        float rrms[CPU_STAT_ROWS];
        cpu_rms_scale_rows((const float *)a->x + r * D, n, D, a->eps, rrms);
        for (int64_t i = 0; i < n; i++) {
            const int64_t tok = (r + i) % T; /* the token's place in its sample */
            const int64_t f = tok / (R * C), h = tok / C % R, w = tok % C;
            float *row = (float *)a->x + (r + i) * D;
            if (d <= ROPE_ROW_MAX) { /* the three parts side by side: one run of pairs a head */
                memcpy(cs, t.f + f * t.p.rf, (size_t)t.p.rf * sizeof(double));
                memcpy(cs + t.p.rf, t.r + h * t.p.rr, (size_t)t.p.rr * sizeof(double));
                memcpy(cs + t.p.rf + t.p.rr, t.c + w * t.p.rc, (size_t)t.p.rc * sizeof(double));
                for (int64_t hd = 0; hd < H; hd++) norm_turn(row + hd * d, wt + hd * d, rrms[i], cs, d / 2);
                continue;
            }
            for (int64_t hd = 0; hd < H; hd++) {
                float *xh = row + hd * d;
                const float *wh = wt + hd * d;
                norm_turn(xh, wh, rrms[i], t.f + f * t.p.rf, t.p.rf / 2);
                norm_turn(xh + t.p.rf, wh + t.p.rf, rrms[i], t.r + h * t.p.rr, t.p.rr / 2);
                norm_turn(xh + t.p.rf + t.p.rr, wh + t.p.rf + t.p.rr, rrms[i], t.c + w * t.p.rc, t.p.rc / 2);
            }
        }
    }
}

/* Per token row, the rows shared out over the pool: the RMS over the whole
 * row, then each head normalised and rotated pair by pair. Fails (x
 * untouched) when the head width is odd or the scratch is short. */
static int rmsnorm_rope3d_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_rmsnorm_rope_args_t *a = args;
    int64_t H = a->heads, d = a->head_dim, F = a->frames, R = a->rows, C = a->cols;
    if (H <= 0 || d <= 0 || F <= 0 || R <= 0 || C <= 0) return 0;
    if (d % 2) return reel_fail(REEL_E_INVALID, "rmsnorm_rope3d_cpu: head width %lld is odd", (long long)d);
    size_t need = rmsnorm_rope_workspace(a);
    if (!a->hdr.scratch || a->hdr.scratch_bytes < need)
        return reel_fail(REEL_E_INVALID, "rmsnorm_rope3d_cpu: scratch of %zu bytes, needs %zu",
                         a->hdr.scratch_bytes, need);
    rope_job_t j = { a, cpu_rope_tables(a->hdr.scratch, d, F, R, C) };
    cpu_par_rows((a->batch > 1 ? a->batch : 1) * F * R * C, H * d, rmsnorm_rope_rows, &j);
    return 0;
}

static CPU_VEC_DISPATCH void residual_norm_rows(void *ctx, int64_t r0, int64_t r1) {
    const kern_residual_norm_args_t *a = ctx;
    const int64_t D = a->dim;
    for (int64_t r = r0; r < r1; r += CPU_STAT_ROWS) { /* the chunk's residuals and statistics, then its outputs */
        const int64_t n = r1 - r < CPU_STAT_ROWS ? r1 - r : CPU_STAT_ROWS;
        float mean[CPU_STAT_ROWS], rstd[CPU_STAT_ROWS];
        for (int64_t i = 0; i < n; i++) {
            const float *g = group_row(a->gate, a->group, a->gate_stride, r + i);
            float *x = (float *)a->x + (r + i) * D;
            cpu_residual_row(x, (const float *)a->y + (r + i) * D, g, D);
        }
        cpu_layernorm_stats_rows((const float *)a->x + r * D, n, D, a->eps, mean, rstd);
        for (int64_t i = 0; i < n; i++) {
            const float *p0 = group_row(a->p0, a->group, a->p0_stride, r + i);
            const float *p1 = group_row(a->p1, a->group, a->p1_stride, r + i);
            const float *x = (const float *)a->x + (r + i) * D;
            float *out = (float *)a->out + (r + i) * D;
            if (a->modulate)
                for (int64_t c = 0; c < D; c++)
                    out[c] = cpu_modulate_value(cpu_layernorm_value(x[c], mean[i], rstd[i]), p0[c], p1[c]);
            else if (p0)
                cpu_layernorm_affine_row(out, x, D, mean[i], rstd[i], p0, p1);
            else
                for (int64_t c = 0; c < D; c++) out[c] = cpu_layernorm_value(x[c], mean[i], rstd[i]);
        }
    }
}

/* Per row: x += gate·y (cpu_residual_row, as GATED_RESIDUAL), then out =
 * LN(x) modulated (as LAYERNORM_MODULATE) or affine (as LAYERNORM) while
 * the row is in cache. Cannot fail. */
static int residual_norm_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_residual_norm_args_t *a = args;
    if (a->dim > 0) cpu_par_rows(a->rows, a->dim, residual_norm_rows, (void *)a);
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_LAYERNORM_MODULATE, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "layernorm_modulate_cpu", .fn = layernorm_modulate_f32,
      .args_size = sizeof(kern_norm_modulate_args_t), .workspace_bytes = NULL,
      .capturable = true },
    { .op = KERN_OP_RMSNORM_ROPE3D, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "rmsnorm_rope3d_cpu", .fn = rmsnorm_rope3d_f32,
      .args_size = sizeof(kern_rmsnorm_rope_args_t),
      .workspace_bytes = rmsnorm_rope_workspace, .capturable = true },
    { .op = KERN_OP_RESIDUAL_NORM, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "residual_norm_cpu", .fn = residual_norm_f32,
      .args_size = sizeof(kern_residual_norm_args_t), .workspace_bytes = NULL, .capturable = true },
};

size_t kern_cpu_fused_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
