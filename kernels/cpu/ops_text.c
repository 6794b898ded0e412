/* ops_text.c -- the text encoder's kernels on the CPU: T5's attention with
 * a relative-position bias and a key mask (ATTENTION_BIAS) and the
 * elementwise product of its gated feed-forward (MUL).
 *
 * ATTENTION_BIAS works as attention_cpu does (ops_attention.c): per head,
 * OpenBLAS scores a block of queries against the valid keys only (masked
 * keys are never scored, which is the exact 0 weight T5's finfo.min fill
 * gives), the bias of each offset j − i is added, a row softmax (sum in
 * double) turns scores into weights in place, and a second sgemm writes the
 * block's outputs into o's head slice. The block size depends only on the
 * sizes, so a replay repeats the eager computation exactly. */
#include "../ops_args.h"
#include "base/error.h"
#include <cblas.h>
#include <limits.h>
#include "cpu_vmath.h"

#define ATTN_BIAS_SCRATCH_CAP ((int64_t)16 << 20) /* bytes of scores per block */

/* Query rows per block: all of them when their scores fit the cap. */
static int64_t block_rows(int64_t nq, int64_t nv) {
    if (nq <= 0 || nv <= 0) return 0;
    int64_t rows = ATTN_BIAS_SCRATCH_CAP / (nv * (int64_t)sizeof(float));
    if (rows < 1) rows = 1;
    return rows < nq ? rows : nq;
}

static size_t attention_bias_workspace(const void *args) {
    const kern_attention_bias_args_t *a = args;
    return (size_t)(block_rows(a->nq, a->nk_valid) * a->nk_valid) * sizeof(float);
}

/* Fails (o untouched) when the keys are not 1..nk, the scratch is short, or
 * a size exceeds the BLAS int range. */
static int attention_bias_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_attention_bias_args_t *a = args;
    int64_t nq = a->nq, nk = a->nk, nv = a->nk_valid, H = a->heads, d = a->head_dim, ld = H * d;
    if (nq <= 0 || H <= 0 || d <= 0) return 0;
    if (nv < 1 || nv > nk)
        return reel_fail(REEL_E_INVALID, "attention_bias_cpu: %lld valid keys of %lld", (long long)nv,
                         (long long)nk);
    if (nq > INT_MAX || nk > INT_MAX || ld > INT_MAX)
        return reel_fail(REEL_E_INVALID, "attention_bias_cpu: nq=%lld nk=%lld width=%lld exceed the BLAS int range",
                         (long long)nq, (long long)nk, (long long)ld);
    int64_t rows = block_rows(nq, nv);
    size_t need = (size_t)(rows * nv) * sizeof(float);
    if (!a->hdr.scratch || a->hdr.scratch_bytes < need)
        return reel_fail(REEL_E_INVALID, "attention_bias_cpu: scratch of %zu bytes, needs %zu",
                         a->hdr.scratch_bytes, need);
    float *s = a->hdr.scratch;
    const float *q = a->q, *k = a->k, *v = a->v;
    float *o = a->o;
    const int64_t nrel = nq + nk - 1;
    for (int64_t h = 0; h < H; h++) {
        const float *rel = a->rel ? a->rel + h * nrel : NULL;
        for (int64_t i0 = 0; i0 < nq; i0 += rows) {
            int64_t m = nq - i0 < rows ? nq - i0 : rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)nv,
                        (blasint)d, a->scale, q + i0 * ld + h * d, (blasint)ld, k + h * d,
                        (blasint)ld, 0.0f, s, (blasint)nv);
            for (int64_t r = 0; r < m; r++) {
                float *row = s + r * nv;
                int64_t i = i0 + r;
                if (rel)
                    for (int64_t j = 0; j < nv; j++) row[j] += rel[j - i + nq - 1];
                cpu_vec_softmax_rows(row, nv, row, nv, 1, nv, 1.0f);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)d,
                        (blasint)nv, 1.0f, s, (blasint)nv, v + h * d, (blasint)ld, 0.0f,
                        o + i0 * ld + h * d, (blasint)ld);
        }
    }
    return 0;
}

/* Cannot fail. */
static int mul_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_binary_args_t *a = args;
    const float *x = a->a, *w = a->b;
    float *y = a->y;
    for (int64_t i = 0; i < a->n; i++) y[i] = x[i] * w[i];
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_ATTENTION_BIAS, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "attention_bias_cpu", .fn = attention_bias_f32,
      .args_size = sizeof(kern_attention_bias_args_t),
      .workspace_bytes = attention_bias_workspace, .capturable = true },
    { .op = KERN_OP_MUL, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32, .name = "mul_cpu",
      .fn = mul_f32, .args_size = sizeof(kern_binary_args_t), .workspace_bytes = NULL,
      .capturable = true },
};

size_t kern_cpu_text_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
