/* ops_gemm.c -- y[M,N] = x[M,K]·w[N,K]ᵀ + bias on the CPU through OpenBLAS,
 * the same followed by GELU-tanh (GEMM_GELU), and the strided-batched GEMM
 * of the decomposed attention (one sgemm per batch member: this OpenBLAS
 * has no cblas_sgemm_batch).
 *
 * The bias is written into y's rows first and sgemm accumulates onto it
 * (beta = 1), so the op is one pass over y. OpenBLAS splits work across its
 * threads by rows and columns of y, never along K, so each output is summed
 * in the same order on every run: eager and replayed results are bitwise
 * equal. y must not alias x or w. */
#include "../ops_args.h"
#include "base/error.h"
#include "cpu_arith.h"
#include <cblas.h>
#include <limits.h>
#include <string.h>

/* Fails (nothing written) when a size does not fit OpenBLAS's 32-bit ints. */
static int gemm_run(const kern_gemm_args_t *a) {
    const float *x = a->x, *w = a->w, *bias = a->bias;
    float *y = a->y;
    int64_t M = a->M, N = a->N, K = a->K;
    if (M <= 0 || N <= 0) return 0;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return reel_fail(REEL_E_INVALID, "gemm_openblas: M=%lld N=%lld K=%lld exceed the BLAS int range",
                         (long long)M, (long long)N, (long long)K);
    float beta = 0.0f;
    if (bias) {
        for (int64_t i = 0; i < M; i++) memcpy(y + i * N, bias, (size_t)N * sizeof(float));
        beta = 1.0f;
    }
    if (K <= 0) { /* an empty sum: y is the bias, or zero; lda = 0 is invalid BLAS */
        if (!bias) memset(y, 0, (size_t)(M * N) * sizeof(float));
        return 0;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)N, (blasint)K,
                1.0f, x, (blasint)K, w, (blasint)K, beta, y, (blasint)N);
    return 0;
}

static int gemm_f32(void *ctx, const void *args) {
    (void)ctx;
    return gemm_run(args);
}

/* The GEMM, then GELU_TANH's arithmetic over y: bit for bit kern_gemm then
 * kern_gelu_tanh. A second pass over y, kept on purpose: running the GELU
 * per block of rows while they are in cache would mean splitting the sgemm,
 * and OpenBLAS may sum an element differently in another partition. The
 * CPU is the reference; the fusion pays on CUDA (one cuBLASLt epilogue).
 * Fails as gemm_f32 (nothing written). */
static int gemm_gelu_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_gemm_args_t *a = args;
    if (gemm_run(a)) return -1;
    float *y = a->y;
    const int64_t n = a->M > 0 && a->N > 0 ? a->M * a->N : 0;
    for (int64_t i = 0; i < n; i++) y[i] = cpu_gelu_tanh(y[i]);
    return 0;
}

/* Fails (nothing written) when a size is < 1, a leading dim is shorter
 * than its row, or a size does not fit OpenBLAS's ints. */
static int gemm_batched_check(const kern_gemm_batched_args_t *a) {
    if (a->m < 1 || a->n < 1 || a->k < 1)
        return reel_fail(REEL_E_INVALID, "gemm_batched_openblas: m=%lld n=%lld k=%lld must all be >= 1",
                         (long long)a->m, (long long)a->n, (long long)a->k);
    if (a->m > INT_MAX || a->n > INT_MAX || a->k > INT_MAX || a->lda > INT_MAX ||
        a->ldb > INT_MAX || a->ldc > INT_MAX)
        return reel_fail(REEL_E_INVALID, "gemm_batched_openblas: sizes exceed the BLAS int range");
    if (a->lda < a->k || a->ldb < (a->trans_b ? a->k : a->n) || a->ldc < a->n)
        return reel_fail(REEL_E_INVALID, "gemm_batched_openblas: a leading dim is shorter than its row "
                         "(lda=%lld ldb=%lld ldc=%lld for m=%lld n=%lld k=%lld)",
                         (long long)a->lda, (long long)a->ldb, (long long)a->ldc,
                         (long long)a->m, (long long)a->n, (long long)a->k);
    return 0;
}

/* One sgemm per batch member, in order: each output is summed exactly as a
 * lone sgemm of that member would sum it, on every run. */
static int gemm_batched_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_gemm_batched_args_t *a = args;
    if (a->batch <= 0) return 0;
    if (gemm_batched_check(a)) return -1;
    const float *x = a->a, *w = a->b;
    float *y = a->c;
    for (int64_t b = 0; b < a->batch; b++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, a->trans_b ? CblasTrans : CblasNoTrans,
                    (blasint)a->m, (blasint)a->n, (blasint)a->k, a->alpha,
                    x + b * a->stride_a, (blasint)a->lda, w + b * a->stride_b, (blasint)a->ldb,
                    0.0f, y + b * a->stride_c, (blasint)a->ldc);
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_GEMM, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "gemm_openblas", .fn = gemm_f32, .args_size = sizeof(kern_gemm_args_t),
      .workspace_bytes = NULL, .capturable = true },
    { .op = KERN_OP_GEMM_GELU, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "gemm_gelu_openblas", .fn = gemm_gelu_f32, .args_size = sizeof(kern_gemm_args_t),
      .workspace_bytes = NULL, .capturable = true },
    { .op = KERN_OP_GEMM_BATCHED, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "gemm_batched_openblas", .fn = gemm_batched_f32,
      .args_size = sizeof(kern_gemm_batched_args_t), .workspace_bytes = NULL,
      .capturable = true },
};

size_t kern_cpu_gemm_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}

void kern_cpu_blas_threads_set(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
int kern_cpu_blas_threads(void) { return openblas_get_num_threads(); }
