/* layernorm.cu -- LAYERNORM over the last dim of [rows, dim]:
 * (x − mean)/√(var + eps), then ·weight + bias when weight != NULL (bias may
 * be NULL). One block per row; mean and variance are two F32 passes over the
 * row (the second over x − mean, so no cancellation), each reduced per
 * thread, then per warp, then across warps. y may equal x: every read of the
 * row happens before the first write (the reductions are block barriers). */
#include "cuda_device.cuh"
#include <limits.h>

template <typename T>
__global__ void layernorm_kernel(const T *x, const T *weight, const T *bias, T *y,
                                 int64_t dim, float eps) {
    __shared__ float sh[33];
    const T *xr = x + (int64_t)blockIdx.x * dim;
    T *yr = y + (int64_t)blockIdx.x * dim;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += kc_f32(xr[i]);
    const float mean = kc_block_sum(s, sh) / (float)dim;
    float q = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float d = kc_f32(xr[i]) - mean;
        q += d * d;
    }
    const float var = kc_block_sum(q, sh) / (float)dim;
    const float rstd = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float o = (kc_f32(xr[i]) - mean) * rstd;
        if (weight) o = o * kc_f32(weight[i]) + (bias ? kc_f32(bias[i]) : 0.0f);
        yr[i] = kc_store<T>(o);
    }
}

template <typename T>
static int layernorm_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_norm_args_t *a = (const kern_norm_args_t *)args;
    if (a->rows <= 0 || a->dim <= 0) return 0;
    if (a->rows > INT_MAX)
        return reel_fail(REEL_E_LIMIT, "layernorm: %lld rows exceed the CUDA grid (one block per row)",
                         (long long)a->rows);
    int threads = kc_row_threads(a->dim);
    layernorm_kernel<T><<<(unsigned)a->rows, threads, 0, c->stream>>>(
        (const T *)a->x, (const T *)a->weight, (const T *)a->bias, (T *)a->y, a->dim, a->eps);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_layernorm_f32(void *ctx, const void *args) {
    return layernorm_launch<float>(ctx, args);
}

extern "C" int kern_cuda_layernorm_bf16(void *ctx, const void *args) {
    return layernorm_launch<__nv_bfloat16>(ctx, args);
}
