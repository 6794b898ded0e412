/* rmsnorm.cu -- RMSNORM over the last dim of [rows, dim]:
 * x/√(mean(x²) + eps)·weight (weight required). One block per row, the sum
 * of squares reduced in F32 per thread, per warp, then across warps. y may
 * equal x: the reduction is a block barrier before the first write. */
#include "cuda_device.cuh"
#include <limits.h>

template <typename T>
__global__ void rmsnorm_kernel(const T *x, const T *weight, T *y, int64_t dim, float eps) {
    __shared__ float sh[33];
    const T *xr = x + (int64_t)blockIdx.x * dim;
    T *yr = y + (int64_t)blockIdx.x * dim;
    float q = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = kc_f32(xr[i]);
        q += v * v;
    }
    const float r = 1.0f / sqrtf(kc_block_sum(q, sh) / (float)dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = kc_store<T>(kc_f32(xr[i]) * r * kc_f32(weight[i]));
}

/* The same row by 16-byte loads (dim % 8 == 0, every pointer aligned). */
template <typename T>
__global__ void rmsnorm_vec_kernel(const T *x, const T *weight, T *y, int64_t dim, float eps) {
    __shared__ float sh[33];
    const T *xr = x + (int64_t)blockIdx.x * dim;
    T *yr = y + (int64_t)blockIdx.x * dim;
    const int64_t chunks = dim / KC_VEC;
    float v[KC_VEC], q = 0.0f;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        kc_load8(xr + c * KC_VEC, v);
#pragma unroll
        for (int k = 0; k < KC_VEC; k++) q += v[k] * v[k];
    }
    const float r = 1.0f / sqrtf(kc_block_sum(q, sh) / (float)dim + eps);
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        float w[KC_VEC];
        kc_load8(xr + c * KC_VEC, v);
        kc_load8(weight + c * KC_VEC, w);
#pragma unroll
        for (int k = 0; k < KC_VEC; k++) v[k] = v[k] * r * w[k];
        kc_store8(yr + c * KC_VEC, v);
    }
}

template <typename T>
static int rmsnorm_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_norm_args_t *a = (const kern_norm_args_t *)args;
    if (a->rows <= 0 || a->dim <= 0) return 0;
    if (!a->weight) return reel_fail(REEL_E_INVALID, "rmsnorm: weight is required");
    if (a->rows > INT_MAX)
        return reel_fail(REEL_E_LIMIT, "rmsnorm: %lld rows exceed the CUDA grid (one block per row)",
                         (long long)a->rows);
    if (kc_vec_ok(a->dim, a->x, a->y, a->weight))
        rmsnorm_vec_kernel<T><<<(unsigned)a->rows, kc_row_threads(a->dim / KC_VEC), 0, c->stream>>>(
            (const T *)a->x, (const T *)a->weight, (T *)a->y, a->dim, a->eps);
    else
        rmsnorm_kernel<T><<<(unsigned)a->rows, kc_row_threads(a->dim), 0, c->stream>>>(
            (const T *)a->x, (const T *)a->weight, (T *)a->y, a->dim, a->eps);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_rmsnorm_f32(void *ctx, const void *args) {
    return rmsnorm_launch<float>(ctx, args);
}

extern "C" int kern_cuda_rmsnorm_bf16(void *ctx, const void *args) {
    return rmsnorm_launch<__nv_bfloat16>(ctx, args);
}
