/* ops_attention.c -- multi-head softmax(q·kᵀ·scale)·v on the CPU.
 *
 * Per head, OpenBLAS computes a block of scores from the strided head slices
 * (leading dimension heads·head_dim, no repacking), a row softmax turns them
 * into weights in place, and a second sgemm writes the block's outputs
 * straight into o's head slice. Queries are taken in blocks so the scores
 * never need more than ATTN_SCRATCH_CAP bytes of the stream arena, however
 * long the sequence; the block size depends only on (nq, nk), so a replay
 * repeats the eager computation exactly. */
#include "../ops_args.h"
#include "base/error.h"
#include <cblas.h>
#include <limits.h>
#include <math.h>

#define ATTN_SCRATCH_CAP ((int64_t)16 << 20) /* bytes of scores per block */

/* Query rows per block: all of them when the scores fit the cap. */
static int64_t attn_block_rows(int64_t nq, int64_t nk) {
    if (nq <= 0 || nk <= 0) return 0;
    int64_t rows = ATTN_SCRATCH_CAP / (nk * (int64_t)sizeof(float));
    if (rows < 1) rows = 1;
    return rows < nq ? rows : nq;
}

static size_t attention_workspace(const void *args) {
    const kern_attention_args_t *a = args;
    return (size_t)(attn_block_rows(a->nq, a->nk) * a->nk) * sizeof(float);
}

/* Softmax of each of `rows` rows of width n, in place. The max is subtracted
 * first so no exponential overflows; the sum is kept in double. */
static void softmax_rows(float *s, int64_t rows, int64_t n) {
    for (int64_t i = 0; i < rows; i++) {
        float *row = s + i * n;
        float m = row[0];
        for (int64_t j = 1; j < n; j++) m = fmaxf(m, row[j]);
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) {
            row[j] = expf(row[j] - m);
            sum += row[j];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < n; j++) row[j] *= inv;
    }
}

/* Fails (o untouched) when there are no keys, the scratch is short, or a
 * size exceeds the BLAS int range. */
static int attention_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_attention_args_t *a = args;
    int64_t nq = a->nq, nk = a->nk, H = a->heads, d = a->head_dim, ld = H * d;
    if (nq <= 0 || H <= 0 || d <= 0) return 0;
    if (nk <= 0) return reel_fail(REEL_E_INVALID, "attention_cpu: no keys");
    if (nq > INT_MAX || nk > INT_MAX || ld > INT_MAX)
        return reel_fail(REEL_E_INVALID, "attention_cpu: nq=%lld nk=%lld width=%lld exceed the BLAS int range",
                         (long long)nq, (long long)nk, (long long)ld);
    int64_t rows = attn_block_rows(nq, nk);
    if (!a->hdr.scratch || a->hdr.scratch_bytes < (size_t)(rows * nk) * sizeof(float))
        return reel_fail(REEL_E_INVALID, "attention_cpu: scratch of %zu bytes, needs %zu", a->hdr.scratch_bytes,
                         (size_t)(rows * nk) * sizeof(float));
    float *s = a->hdr.scratch;
    const float *q = a->q, *k = a->k, *v = a->v;
    float *o = a->o;
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i0 = 0; i0 < nq; i0 += rows) {
            int64_t m = nq - i0 < rows ? nq - i0 : rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)nk,
                        (blasint)d, a->scale, q + i0 * ld + h * d, (blasint)ld,
                        k + h * d, (blasint)ld, 0.0f, s, (blasint)nk);
            softmax_rows(s, m, nk);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)d,
                        (blasint)nk, 1.0f, s, (blasint)nk, v + h * d, (blasint)ld, 0.0f,
                        o + i0 * ld + h * d, (blasint)ld);
        }
    }
    return 0;
}

/* ATTENTION_SDPA on the CPU is this same kernel: the reference a library's
 * fused attention (cuDNN on CUDA) is checked against. */
/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_ATTENTION, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "attention_cpu", .fn = attention_f32,
      .args_size = sizeof(kern_attention_args_t), .workspace_bytes = attention_workspace,
      .capturable = true },
    { .op = KERN_OP_ATTENTION_SDPA, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "attention_sdpa_cpu", .fn = attention_f32,
      .args_size = sizeof(kern_attention_args_t), .workspace_bytes = attention_workspace,
      .capturable = true },
};

size_t kern_cpu_attention_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
