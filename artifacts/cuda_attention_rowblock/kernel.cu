/* kernel.cu -- artifact cuda-attention-rowblock: the fused attention on
 * CUDA tiled one (query, head) per thread block: the block puts the
 * query's scores over every key in shared memory, takes their max and sum
 * with block reductions, and each thread accumulates its columns of the
 * output; F32 throughout. The native kernel streams keys through an online
 * softmax per warp instead. For the short key sets of cross-attention
 * (text tokens) and small latents this spreads work over more blocks.
 * Keys are limited to what shared memory holds (the manifest: nk <= 8192,
 * head_dim <= 256). Another order of summation: max_rel=1e-4. Compiled,
 * never run on a device yet: the parity gate stands between it and a
 * result. No scratch (the native contract's is at least 0). */
#include <cuda_runtime.h>
#include "kernels/artifact_abi.h"
#include "kernels/cuda/cuda_common.h"

extern "C" {
extern const uint32_t reel_artifact_abi;
const uint32_t reel_artifact_abi = KERN_ART_OBJECT_ABI;
int reel_artifact_init(const kern_art_host_t *host);
}

static int (*fail)(const char *fmt, ...);

#define THREADS 128
#define MAX_KEYS 8192
#define MAX_DIM 256

__device__ float block_reduce(float v, float *sh, bool is_max) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float r = sh[0];
        for (int i = 1; i < THREADS / 32; i++) r = is_max ? fmaxf(r, sh[i]) : r + sh[i];
        sh[THREADS / 32] = r;
    }
    __syncthreads();
    float r = sh[THREADS / 32];
    __syncthreads();
    return r;
}

__global__ void attention_rowblock(const float *q, const float *k, const float *v, float *o,
                                   int64_t nk, int64_t H, int64_t d, float scale) {
    extern __shared__ float s[]; /* nk scores, then the query row */
    __shared__ float red[THREADS / 32 + 1];
    const int64_t i = blockIdx.x / H, h = blockIdx.x % H, ld = H * d;
    float *qs = s + nk;
    for (int64_t t = threadIdx.x; t < d; t += THREADS) qs[t] = q[i * ld + h * d + t];
    __syncthreads();
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < nk; j += THREADS) {
        const float *kr = k + j * ld + h * d;
        float acc = 0.0f;
        for (int64_t t = 0; t < d; t++) acc += qs[t] * kr[t];
        s[j] = acc * scale;
        m = fmaxf(m, s[j]);
    }
    m = block_reduce(m, red, true);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < nk; j += THREADS) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    sum = block_reduce(sum, red, false);
    const float inv = 1.0f / sum;
    for (int64_t t = threadIdx.x; t < d; t += THREADS) {
        float acc = 0.0f;
        for (int64_t j = 0; j < nk; j++) acc += s[j] * v[j * ld + h * d + t];
        o[i * ld + h * d + t] = acc * inv;
    }
}

static int attention_one(const kern_cuda_ctx_t *c, const kern_attention_args_t *a) {
    if (a->nq <= 0 || a->heads <= 0 || a->head_dim <= 0) return 0;
    if (a->nk < 1 || a->nk > MAX_KEYS || a->head_dim > MAX_DIM || a->nq * a->heads > INT32_MAX)
        return fail("cuda_attention_rowblock: nk=%lld head_dim=%lld outside 1..%d, 1..%d",
                    (long long)a->nk, (long long)a->head_dim, MAX_KEYS, MAX_DIM);
    size_t smem = (size_t)(a->nk + a->head_dim) * sizeof(float);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(attention_rowblock,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return fail("cuda_attention_rowblock: %s", cudaGetErrorString(e));
    }
    attention_rowblock<<<(unsigned)(a->nq * a->heads), THREADS, smem, c->stream>>>(
        (const float *)a->q, (const float *)a->k, (const float *)a->v, (float *)a->o, a->nk,
        a->heads, a->head_dim, a->scale);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return fail("cuda_attention_rowblock: %s", cudaGetErrorString(e));
    return 0;
}

/* A batch (ABI 3: kern_attention_args_t.batch): one launch per sample,
 * each exactly as a call of its own. */
static int attention(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_attention_args_t *a = (const kern_attention_args_t *)args;
    const int64_t ld = a->heads * a->head_dim;
    for (int64_t b = 0; b < (a->batch > 1 ? a->batch : 1); b++) {
        kern_attention_args_t one = *a;
        const int64_t kb = a->kv_shared ? 0 : b * a->nk * ld;
        one.q = (const float *)a->q + b * a->nq * ld;
        one.o = (float *)a->o + b * a->nq * ld;
        one.k = (const float *)a->k + kb;
        one.v = (const float *)a->v + kb;
        one.batch = 1;
        if (attention_one(c, &one)) return -1;
    }
    return 0;
}

int reel_artifact_init(const kern_art_host_t *host) {
    fail = host->fail;
    kern_impl_t impl;
    memset(&impl, 0, sizeof impl);
    impl.op = KERN_OP_ATTENTION;
    impl.backend = KERN_BACKEND_CUDA;
    impl.dtype = KERN_F32;
    impl.name = "attention_rowblock_cuda";
    impl.fn = attention;
    impl.args_size = sizeof(kern_attention_args_t);
    impl.capturable = true;
    return host->register_kernel(host->reg, &impl);
}
