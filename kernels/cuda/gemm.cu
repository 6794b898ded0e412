/* gemm.cu -- GEMM: y[M,N] = x[M,K]·w[N,K]ᵀ + bias[N] through cuBLAS.
 *
 * Row-major y = x·wᵀ is column-major yᵀ[N,M] = wᵀ·x, i.e.
 * gemm(OP_T, OP_N, m=N, n=M, k=K, w (ld K), x (ld K), y (ld N)).
 * The bias is broadcast into y first and the product added with beta = 1,
 * so BF16 output is rounded once (a bias pass after the product would round
 * twice) and no extra read-modify-write pass over y is needed.
 * F32 runs cublasSgemm in CUBLAS_PEDANTIC_MATH (true FP32: never TF32, so it
 * compares with the CPU at F32 tolerance); BF16 runs cublasGemmEx with BF16
 * storage and CUBLAS_COMPUTE_32F accumulation in the default math mode
 * (tensor cores). The handle's workspace is preallocated (backend_cuda.c),
 * so the call is legal inside a stream capture. */
#include "cuda_device.cuh"
#include <limits.h>

template <typename T>
__global__ void gemm_bias_fill_kernel(const T *bias, T *y, int64_t n, int64_t N) {
    KC_FOR(i, n) y[i] = bias[i % N];
}

/* Fills y with the bias rows (or zeros when K = 0 and there is no bias) and
 * returns the beta the product must use. */
template <typename T>
static int gemm_prologue(const kern_cuda_ctx_t *c, const kern_gemm_args_t *a, float *beta) {
    int64_t n = a->M * a->N;
    *beta = 0.0f;
    if (a->bias) {
        gemm_bias_fill_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
            (const T *)a->bias, (T *)a->y, n, a->N);
        CUDA_CHECK(cudaGetLastError());
        *beta = 1.0f;
    } else if (a->K == 0) {
        CUDA_CHECK(cudaMemsetAsync(a->y, 0, (size_t)n * sizeof(T), c->stream));
    }
    return 0;
}

/* Fails when a size does not fit cuBLAS's int. */
static int gemm_check_sizes(const kern_gemm_args_t *a) {
    if (a->M > INT_MAX || a->N > INT_MAX || a->K > INT_MAX)
        return kern_fail("gemm: M=%lld N=%lld K=%lld exceed cuBLAS's int sizes",
                         (long long)a->M, (long long)a->N, (long long)a->K);
    return 0;
}

extern "C" int kern_cuda_gemm_f32(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_gemm_args_t *a = (const kern_gemm_args_t *)args;
    if (a->M <= 0 || a->N <= 0) return 0;
    if (gemm_check_sizes(a) != 0) return -1;
    float alpha = 1.0f, beta;
    if (gemm_prologue<float>(c, a, &beta) != 0) return -1;
    if (a->K == 0) return 0;
    CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH));
    CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->N, (int)a->M, (int)a->K,
                             &alpha, (const float *)a->w, (int)a->K, (const float *)a->x,
                             (int)a->K, &beta, (float *)a->y, (int)a->N));
    return 0;
}

extern "C" int kern_cuda_gemm_bf16(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_gemm_args_t *a = (const kern_gemm_args_t *)args;
    if (a->M <= 0 || a->N <= 0) return 0;
    if (gemm_check_sizes(a) != 0) return -1;
    float alpha = 1.0f, beta;
    if (gemm_prologue<__nv_bfloat16>(c, a, &beta) != 0) return -1;
    if (a->K == 0) return 0;
    CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->N, (int)a->M, (int)a->K,
                              &alpha, a->w, CUDA_R_16BF, (int)a->K, a->x, CUDA_R_16BF, (int)a->K,
                              &beta, a->y, CUDA_R_16BF, (int)a->N, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    return 0;
}
