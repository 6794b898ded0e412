/* ops_rope.c -- 3-D rotary position embedding (TINYDIT.md "3-D RoPE") on
 * the CPU, in place on x [frames·rows·cols, heads·head_dim].
 *
 * Head width d is split into a frame part of d − 4q real dims, a row part
 * and a column part of 2q each (q = ⌊d/6⌋); pair j of a part of r dims turns
 * by pos·10000^(−2j/r). The cos/sin of every (position, pair) of each part
 * are tabulated in the stream arena once per launch (in double), then every
 * pair of every head is rotated in double and rounded to float once, so a
 * position of 0 leaves its values bit for bit unchanged. The table and the
 * rotation are cpu_arith.h's, shared with the fused RMSNORM_ROPE3D kernel. */
#include "../ops_args.h"
#include "base/error.h"
#include "cpu_arith.h"

static size_t rope_workspace(const void *args) {
    const kern_rope3d_args_t *a = args;
    return cpu_rope_table_bytes(a->head_dim, a->frames, a->rows, a->cols);
}

/* Rotates the npairs pairs of x by the (cos, sin) pairs of cs. */
static inline __attribute__((always_inline)) void rope_apply(float *x, const double *cs, int64_t npairs) {
    for (int64_t j = 0; j < npairs; j++)
        cpu_rope_turn(x[2 * j], x[2 * j + 1], cs[2 * j], cs[2 * j + 1], &x[2 * j], &x[2 * j + 1]);
}

/* Fails (x untouched) when the head width is odd or the scratch is short. */
static int rope3d_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_rope3d_args_t *a = args;
    int64_t H = a->heads, d = a->head_dim, F = a->frames, R = a->rows, C = a->cols;
    if (H <= 0 || d <= 0 || F <= 0 || R <= 0 || C <= 0) return 0;
    if (d % 2) return reel_fail(REEL_E_INVALID, "rope3d_cpu: head width %lld is odd", (long long)d);
    size_t need = rope_workspace(a);
    if (!a->hdr.scratch || a->hdr.scratch_bytes < need)
        return reel_fail(REEL_E_INVALID, "rope3d_cpu: scratch of %zu bytes, needs %zu", a->hdr.scratch_bytes, need);
    cpu_rope_tables_t t = cpu_rope_tables(a->hdr.scratch, d, F, R, C);
    float *x = a->x;
    int64_t tok = 0;
    for (int64_t f = 0; f < F; f++)
        for (int64_t h = 0; h < R; h++)
            for (int64_t w = 0; w < C; w++, tok++)
                for (int64_t hd = 0; hd < H; hd++) {
                    float *xh = x + (tok * H + hd) * d;
                    rope_apply(xh, t.f + f * t.p.rf, t.p.rf / 2);
                    rope_apply(xh + t.p.rf, t.r + h * t.p.rr, t.p.rr / 2);
                    rope_apply(xh + t.p.rf + t.p.rr, t.c + w * t.p.rc, t.p.rc / 2);
                }
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_ROPE3D, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "rope3d_cpu", .fn = rope3d_f32, .args_size = sizeof(kern_rope3d_args_t),
      .workspace_bytes = rope_workspace, .capturable = true },
};

size_t kern_cpu_rope_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
