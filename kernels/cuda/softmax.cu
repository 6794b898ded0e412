/* softmax.cu -- SOFTMAX: p[r, j] = softmax_j(scale·s[r, j]) per row, the
 * fused scale + softmax of the decomposed attention (ops_args.h): reads the
 * F32 scores the first batched GEMM wrote, writes probabilities in the op's
 * dtype for the second.
 *
 * One block per row (grid-stride over rows), two passes over the row:
 *   1. each thread keeps a running max m_t and sum l_t of e^(x − m_t) over
 *      its elements x = scale·s_j (rescaling l_t when m_t grows); the block
 *      combines them into m = max m_t and l = Σ l_t·e^(m_t − m);
 *   2. p_j = e^(x_j − m)·(1/l), rounded once to T.
 * All arithmetic is F32 with full-precision expf. The block size depends
 * only on n and the reduction trees are fixed, so every run (eager or a
 * graph replay) sums in the same order: the result is deterministic. p may
 * equal s (F32): element j is read and written by the same thread, and
 * pass 2 starts after pass 1's reductions, which end in barriers. */
#include "cuda_device.cuh"
#include <limits.h>

template <typename T>
__global__ void softmax_kernel(const float *s, T *p, int64_t rows, int64_t n, int64_t lds,
                               int64_t ldp, float scale) {
    __shared__ float sh[33];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) { /* uniform across the block */
        const float *sr = s + r * lds;
        T *pr = p + r * ldp;
        float m = -INFINITY, l = 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const float x = sr[j] * scale;
            if (x > m) {
                l = l * expf(m - x) + 1.0f; /* e^(−inf) = 0 on the first element */
                m = x;
            } else {
                l += expf(x - m);
            }
        }
        const float bm = kc_block_max(m, sh);
        /* threads without elements (m = −inf) add nothing */
        const float bl = kc_block_sum(m == -INFINITY ? 0.0f : l * expf(m - bm), sh);
        const float inv = 1.0f / bl;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            pr[j] = kc_store<T>(expf(sr[j] * scale - bm) * inv);
    }
}

template <typename T>
static int softmax_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_softmax_args_t *a = (const kern_softmax_args_t *)args;
    if (a->rows <= 0) return 0;
    if (a->n < 1 || a->lds < a->n || a->ldp < a->n)
        return reel_fail(REEL_E_INVALID, "softmax: n=%lld lds=%lld ldp=%lld: need n >= 1 and strides >= n",
                         (long long)a->n, (long long)a->lds, (long long)a->ldp);
    const int threads = kc_row_threads(a->n);
    const unsigned blocks = (unsigned)(a->rows < 65536 ? a->rows : 65536);
    softmax_kernel<T><<<blocks, threads, 0, c->stream>>>(a->s, (T *)a->p, a->rows, a->n, a->lds,
                                                          a->ldp, a->scale);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_softmax_f32(void *ctx, const void *args) {
    return softmax_launch<float>(ctx, args);
}

extern "C" int kern_cuda_softmax_bf16(void *ctx, const void *args) {
    return softmax_launch<__nv_bfloat16>(ctx, args);
}
