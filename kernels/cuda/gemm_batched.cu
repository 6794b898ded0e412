/* gemm_batched.cu -- GEMM_BATCHED: c_b = alpha·a_b·op(b_b) for every batch
 * member b, row-major with leading dims and batch strides (ops_args.h), by
 * one cublasGemmStridedBatchedEx on the stream's handle. The decomposed
 * attention's S = Q·Kᵀ (c F32) and O = P·V (c in the op's dtype).
 *
 * Row-major c = a·op(b) is column-major cᵀ = op(b)ᵀ·aᵀ, so the call passes
 * b first: gemm(trans_b ? T : N, N, m' = n, n' = m, k, b (ldb), a (lda),
 * c (ldc)), the same mapping as gemm.cu. BF16 runs BF16 inputs with
 * CUBLAS_COMPUTE_32F in the default math mode (tensor cores, F32
 * accumulation), c BF16 or F32; F32 runs CUBLAS_COMPUTE_32F_PEDANTIC in
 * pedantic math mode (true FP32, never TF32), as the F32 GEMM does. cuBLAS
 * picks its algorithm by heuristics (no search, no timing) and its
 * workspace is the handle's preallocated one (backend_cuda.c), so the call
 * allocates nothing and is legal inside a stream capture; with the same
 * sizes and pointers it picks the same algorithm, so replay ≡ eager. */
#include "cuda_device.cuh"
#include <limits.h>

/* Fails when a size is < 1, a leading dim is shorter than its row, or a
 * size does not fit cuBLAS's int. */
static int gemm_batched_check(const kern_gemm_batched_args_t *a) {
    if (a->m < 1 || a->n < 1 || a->k < 1)
        return reel_fail(REEL_E_INVALID, "gemm_batched: m=%lld n=%lld k=%lld must all be >= 1",
                         (long long)a->m, (long long)a->n, (long long)a->k);
    if (a->m > INT_MAX || a->n > INT_MAX || a->k > INT_MAX || a->lda > INT_MAX ||
        a->ldb > INT_MAX || a->ldc > INT_MAX || a->batch > INT_MAX)
        return reel_fail(REEL_E_LIMIT, "gemm_batched: sizes exceed cuBLAS's int range");
    if (a->lda < a->k || a->ldb < (a->trans_b ? a->k : a->n) || a->ldc < a->n)
        return reel_fail(REEL_E_INVALID, "gemm_batched: a leading dim is shorter than its row "
                         "(lda=%lld ldb=%lld ldc=%lld for m=%lld n=%lld k=%lld)",
                         (long long)a->lda, (long long)a->ldb, (long long)a->ldc,
                         (long long)a->m, (long long)a->n, (long long)a->k);
    return 0;
}

static int gemm_batched(void *ctx, const void *args, cudaDataType_t in, cublasMath_t math,
                        cublasComputeType_t compute) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_gemm_batched_args_t *a = (const kern_gemm_batched_args_t *)args;
    if (a->batch <= 0) return 0;
    if (gemm_batched_check(a) != 0) return -1;
    const cudaDataType_t out = a->c_f32 ? CUDA_R_32F : in;
    const float alpha = a->alpha, beta = 0.0f;
    CUBLAS_CHECK(cublasSetMathMode(c->blas, math));
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        c->blas, a->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, (int)a->n, (int)a->m,
        (int)a->k, &alpha, a->b, in, (int)a->ldb, (long long)a->stride_b, a->a, in,
        (int)a->lda, (long long)a->stride_a, &beta, a->c, out, (int)a->ldc,
        (long long)a->stride_c, (int)a->batch, compute, CUBLAS_GEMM_DEFAULT));
    return 0;
}

extern "C" int kern_cuda_gemm_batched_f32(void *ctx, const void *args) {
    return gemm_batched(ctx, args, CUDA_R_32F, CUBLAS_PEDANTIC_MATH, CUBLAS_COMPUTE_32F_PEDANTIC);
}

extern "C" int kern_cuda_gemm_batched_bf16(void *ctx, const void *args) {
    return gemm_batched(ctx, args, CUDA_R_16BF, CUBLAS_DEFAULT_MATH, CUBLAS_COMPUTE_32F);
}
