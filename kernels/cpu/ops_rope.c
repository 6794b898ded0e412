/* ops_rope.c -- 3-D rotary position embedding (TINYDIT.md "3-D RoPE") on
 * the CPU, in place on x [frames·rows·cols, heads·head_dim].
 *
 * Head width d is split into a frame part of d − 4q real dims, a row part
 * and a column part of 2q each (q = ⌊d/6⌋); pair j of a part of r dims turns
 * by pos·10000^(−2j/r). The cos/sin of every (position, pair) of each part
 * are tabulated in the stream arena once per launch (in double), then every
 * pair of every head is rotated in double and rounded to float once, so a
 * position of 0 leaves its values bit for bit unchanged. */
#include "../ops_args.h"
#include "../error.h"
#include <math.h>

/* The split of head_dim into its three parts, in real dims. */
typedef struct { int64_t rf, rr, rc; } rope_split_t;

static rope_split_t rope_split(int64_t d) {
    int64_t q = d / 6;
    return (rope_split_t){ d - 4 * q, 2 * q, 2 * q };
}

/* Table entries (cos, sin pairs) for all three parts. */
static int64_t rope_table_pairs(const kern_rope3d_args_t *a) {
    rope_split_t p = rope_split(a->head_dim);
    return a->frames * (p.rf / 2) + a->rows * (p.rr / 2) + a->cols * (p.rc / 2);
}

static size_t rope_workspace(const void *args) {
    int64_t n = rope_table_pairs(args);
    return n > 0 ? (size_t)n * 2 * sizeof(double) : 0;
}

/* Fills tab[pos·(r/2) + j] = (cos, sin)(pos·ω_j) for pos < npos; returns the
 * end of the filled part. */
static double *rope_fill(double *tab, int64_t npos, int64_t r) {
    for (int64_t pos = 0; pos < npos; pos++)
        for (int64_t j = 0; j < r / 2; j++) {
            double th = (double)pos * pow(10000.0, -2.0 * (double)j / (double)r);
            *tab++ = cos(th);
            *tab++ = sin(th);
        }
    return tab;
}

/* Rotates the npairs pairs of x by the (cos, sin) pairs of cs. */
static void rope_apply(float *x, const double *cs, int64_t npairs) {
    for (int64_t j = 0; j < npairs; j++) {
        double c = cs[2 * j], s = cs[2 * j + 1];
        double u = x[2 * j], w = x[2 * j + 1];
        x[2 * j] = (float)(u * c - w * s);
        x[2 * j + 1] = (float)(u * s + w * c);
    }
}

/* Fails (x untouched) when the head width is odd or the scratch is short. */
static int rope3d_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_rope3d_args_t *a = args;
    int64_t H = a->heads, d = a->head_dim, F = a->frames, R = a->rows, C = a->cols;
    if (H <= 0 || d <= 0 || F <= 0 || R <= 0 || C <= 0) return 0;
    if (d % 2) return kern_fail("rope3d_cpu: head width %lld is odd", (long long)d);
    size_t need = rope_workspace(a);
    if (!a->hdr.scratch || a->hdr.scratch_bytes < need)
        return kern_fail("rope3d_cpu: scratch of %zu bytes, needs %zu", a->hdr.scratch_bytes, need);
    rope_split_t p = rope_split(d);
    double *tf = a->hdr.scratch;
    double *tr = rope_fill(tf, F, p.rf);
    double *tc = rope_fill(tr, R, p.rr);
    rope_fill(tc, C, p.rc);
    float *x = a->x;
    int64_t t = 0;
    for (int64_t f = 0; f < F; f++)
        for (int64_t h = 0; h < R; h++)
            for (int64_t w = 0; w < C; w++, t++)
                for (int64_t hd = 0; hd < H; hd++) {
                    float *xh = x + (t * H + hd) * d;
                    rope_apply(xh, tf + f * p.rf, p.rf / 2);
                    rope_apply(xh + p.rf, tr + h * p.rr, p.rr / 2);
                    rope_apply(xh + p.rf + p.rr, tc + w * p.rc, p.rc / 2);
                }
    return 0;
}

void kern_cpu_register_rope(void) {
    const kern_impl_t impl = {
        .op = KERN_OP_ROPE3D, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
        .name = "rope3d_cpu", .fn = rope3d_f32, .args_size = sizeof(kern_rope3d_args_t),
        .workspace_bytes = rope_workspace, .capturable = true,
    };
    (void)kern_registry_register(&impl);
}
