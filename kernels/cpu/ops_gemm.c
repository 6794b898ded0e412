/* ops_gemm.c -- y[M,N] = x[M,K]·w[N,K]ᵀ + bias on the CPU through OpenBLAS.
 *
 * The bias is written into y's rows first and sgemm accumulates onto it
 * (beta = 1), so the op is one pass over y. OpenBLAS splits work across its
 * threads by rows and columns of y, never along K, so each output is summed
 * in the same order on every run: eager and replayed results are bitwise
 * equal. y must not alias x or w. */
#include "../ops_args.h"
#include "../error.h"
#include <cblas.h>
#include <limits.h>
#include <string.h>

/* Fails (nothing written) when a size does not fit OpenBLAS's 32-bit ints. */
static int gemm_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_gemm_args_t *a = args;
    const float *x = a->x, *w = a->w, *bias = a->bias;
    float *y = a->y;
    int64_t M = a->M, N = a->N, K = a->K;
    if (M <= 0 || N <= 0) return 0;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return kern_fail("gemm_openblas: M=%lld N=%lld K=%lld exceed the BLAS int range",
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

void kern_cpu_register_gemm(void) {
    const kern_impl_t impl = {
        .op = KERN_OP_GEMM, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
        .name = "gemm_openblas", .fn = gemm_f32, .args_size = sizeof(kern_gemm_args_t),
        .workspace_bytes = NULL, .capturable = true,
    };
    (void)kern_registry_register(&impl);
}
