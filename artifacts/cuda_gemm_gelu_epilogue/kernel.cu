/* kernel.cu -- artifact cuda-gemm-gelu-epilogue: GEMM_GELU on CUDA as one
 * cuBLAS SGEMM (on the stream's handle and its preallocated workspace: it
 * never allocates, so it can be captured) and one pass of a bias + GELU-tanh
 * epilogue over y, in F32.
 *
 * The native kernel is one cublasLtMatmul with the GELU_BIAS epilogue; this
 * is the counterpart of the CPU example for devices where cuBLASLt's fused
 * epilogues are unavailable or slow. cuBLAS and cuBLASLt pick their own
 * algorithms and cuBLASLt has its own GELU, so the bytes differ: the
 * manifest asks for max_rel=1e-5. It has been compiled, never run on a
 * device yet: the parity gate is what stands between it and a result. */
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include "kernels/artifact_abi.h"
#include "kernels/cuda/cuda_common.h"

extern "C" {
extern const uint32_t reel_artifact_abi;
const uint32_t reel_artifact_abi = KERN_ART_OBJECT_ABI;
int reel_artifact_init(const kern_art_host_t *host);
}

static int (*fail)(const char *fmt, ...);

__global__ void bias_gelu(float *y, const float *bias, int64_t M, int64_t N) {
    const float k = 0.7978845608028654f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < M * N;
         i += (int64_t)gridDim.x * blockDim.x) {
        float u = y[i] + (bias ? bias[i % N] : 0.0f);
        y[i] = 0.5f * u * (1.0f + tanhf(k * (u + 0.044715f * u * u * u)));
    }
}

static int gemm_gelu(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_gemm_args_t *a = (const kern_gemm_args_t *)args;
    if (a->M <= 0 || a->N <= 0) return 0;
    if (a->M > INT32_MAX || a->N > INT32_MAX || a->K > INT32_MAX || a->K < 1)
        return fail("cuda_gemm_gelu_epilogue: M=%lld N=%lld K=%lld out of range", (long long)a->M,
                    (long long)a->N, (long long)a->K);
    const float one = 1.0f, zero = 0.0f;
    /* A grouped GEMM (kern_gemm_args_t.group): each group a GEMM of its
     * own rows, as it would be alone. */
    const int64_t rows = a->group > 0 && a->group < a->M && a->M % a->group == 0 ? a->group : a->M;
    for (int64_t r0 = 0; r0 < a->M; r0 += rows) {
        /* Row-major y[M,N] = x[M,K]·w[N,K]ᵀ is column-major yᵀ = wᵀ·x. */
        cublasStatus_t st = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->N, (int)rows, (int)a->K, &one,
                                        (const float *)a->w, (int)a->K, (const float *)a->x + r0 * a->K, (int)a->K,
                                        &zero, (float *)a->y + r0 * a->N, (int)a->N);
        if (st != CUBLAS_STATUS_SUCCESS)
            return fail("cuda_gemm_gelu_epilogue: cublasSgemm failed (%d)", (int)st);
    }
    int64_t n = a->M * a->N, blocks = (n + 255) / 256;
    bias_gelu<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, c->stream>>>(
        (float *)a->y, (const float *)a->bias, a->M, a->N);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail("cuda_gemm_gelu_epilogue: %s", cudaGetErrorString(e));
    return 0;
}

int reel_artifact_init(const kern_art_host_t *host) {
    fail = host->fail;
    kern_impl_t impl;
    memset(&impl, 0, sizeof impl);
    impl.op = KERN_OP_GEMM_GELU;
    impl.backend = KERN_BACKEND_CUDA;
    impl.dtype = KERN_F32;
    impl.name = "gemm_gelu_epilogue_cuda";
    impl.fn = gemm_gelu;
    impl.args_size = sizeof(kern_gemm_args_t);
    impl.capturable = true;
    return host->register_kernel(host->reg, &impl);
}
