/* attention_bias.cu -- ATTENTION_BIAS (T5's attention): for every head h
 * and query i, o_i,h = Σ_{j<nk_valid} softmax_j(scale·q_i,h·k_j,h +
 * rel[h, j − i + nq − 1])·v_j,h; keys at and after nk_valid get weight 0.
 *
 * One block of 128 threads per (query, head). The query row and the row of
 * scores over the valid keys live in shared memory: thread t scores keys
 * t, t + 128, ... (F32 dot products), the block takes the row max and the
 * sum of e^(s − max), and each thread then accumulates output columns
 * c = t, t + 128, ... over the keys. All arithmetic is F32, rounded once
 * to T. Simple rather than fast: T5 encodes at most text_len (512) tokens
 * once per prompt; the row must fit 48 KB of shared memory (nk_valid +
 * head_dim <= 12,000 floats), else the launch is refused. */
#include "cuda_device.cuh"
#include <limits.h>

#define AB_THREADS 128
#define AB_MAX_FLOATS 12000

template <typename T>
__global__ void __launch_bounds__(AB_THREADS)
attention_bias_kernel(const T *q, const T *k, const T *v, const float *rel, T *o, int64_t nq,
                      int64_t nk, int64_t nv, int d, int64_t ld, float scale) {
    extern __shared__ float smem[];
    __shared__ float red[33];
    float *sq = smem;     /* [d] */
    float *ss = smem + d; /* [nv] */
    const int64_t i = blockIdx.x;
    const int h = blockIdx.y;
    const int64_t hoff = (int64_t)h * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) sq[c] = kc_f32(q[i * ld + hoff + c]);
    __syncthreads();
    const float *rh = rel ? rel + (int64_t)h * (nq + nk - 1) + (nq - 1 - i) : NULL;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
        const T *kr = k + j * ld + hoff;
        float s = 0.0f;
        for (int c = 0; c < d; c++) s = fmaf(sq[c], kc_f32(kr[c]), s);
        s *= scale;
        if (rh) s += rh[j];
        ss[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = kc_block_max(mx, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
        const float p = expf(ss[j] - mx);
        ss[j] = p;
        sum += p;
    }
    sum = kc_block_sum(sum, red); /* its barriers publish ss */
    const float inv = 1.0f / sum;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < nv; j++) acc = fmaf(ss[j], kc_f32(v[j * ld + hoff + c]), acc);
        o[i * ld + hoff + c] = kc_store<T>(acc * inv);
    }
}

template <typename T>
static int attention_bias_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_attention_bias_args_t *a = (const kern_attention_bias_args_t *)args;
    if (a->nq <= 0 || a->heads <= 0 || a->head_dim <= 0) return 0;
    if (a->nk_valid < 1 || a->nk_valid > a->nk)
        return reel_fail(REEL_E_INVALID, "attention_bias: %lld valid keys of %lld", (long long)a->nk_valid,
                         (long long)a->nk);
    if (a->nq > INT_MAX || a->heads > 65535)
        return reel_fail(REEL_E_LIMIT, "attention_bias: %lld queries x %lld heads exceed the CUDA grid",
                         (long long)a->nq, (long long)a->heads);
    if (a->nk_valid + a->head_dim > AB_MAX_FLOATS)
        return reel_fail(REEL_E_LIMIT,
                         "attention_bias: %lld keys + head width %lld exceed the kernel's %d floats of shared memory",
                         (long long)a->nk_valid, (long long)a->head_dim, AB_MAX_FLOATS);
    const size_t smem = sizeof(float) * (size_t)(a->nk_valid + a->head_dim);
    dim3 grid((unsigned)a->nq, (unsigned)a->heads);
    attention_bias_kernel<T><<<grid, AB_THREADS, smem, c->stream>>>(
        (const T *)a->q, (const T *)a->k, (const T *)a->v, a->rel, (T *)a->o, a->nq, a->nk,
        a->nk_valid, (int)a->head_dim, a->heads * a->head_dim, a->scale);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_attention_bias_f32(void *ctx, const void *args) {
    return attention_bias_launch<float>(ctx, args);
}

extern "C" int kern_cuda_attention_bias_bf16(void *ctx, const void *args) {
    return attention_bias_launch<__nv_bfloat16>(ctx, args);
}
