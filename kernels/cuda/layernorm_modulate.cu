/* layernorm_modulate.cu -- LAYERNORM_MODULATE over [rows, dim]:
 * y = LN(x)·(1 + scale) + shift, LN without affine (the adaLN of the DiT
 * blocks and the head). One block per row, as layernorm.cu: mean and
 * variance by two F32 passes over the row (the second over x − mean), each
 * reduced per thread, per warp, then across warps; then one pass that
 * normalises, modulates and stores, rounding to T once (the unfused pair
 * stores LN(x) in T in between: one rounding more for BF16, and one more
 * trip of the row through memory). The reduction trees depend only on dim,
 * so every run sums in the same order. y may equal x: every read of the
 * row happens before the first write (the reductions end in barriers). */
#include "cuda_device.cuh"
#include <limits.h>

template <typename T>
__global__ void layernorm_modulate_kernel(const T *x, const T *shift, const T *scale, T *y,
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
    const float rstd = 1.0f / sqrtf(kc_block_sum(q, sh) / (float)dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float n = (kc_f32(xr[i]) - mean) * rstd;
        yr[i] = kc_store<T>(n * (1.0f + kc_f32(scale[i])) + kc_f32(shift[i]));
    }
}

template <typename T>
static int layernorm_modulate_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_norm_modulate_args_t *a = (const kern_norm_modulate_args_t *)args;
    if (a->rows <= 0 || a->dim <= 0) return 0;
    if (a->rows > INT_MAX)
        return reel_fail(REEL_E_LIMIT, "layernorm_modulate: %lld rows exceed the CUDA grid (one block per row)",
                         (long long)a->rows);
    const int threads = kc_row_threads(a->dim);
    layernorm_modulate_kernel<T><<<(unsigned)a->rows, threads, 0, c->stream>>>(
        (const T *)a->x, (const T *)a->shift, (const T *)a->scale, (T *)a->y, a->dim, a->eps);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_layernorm_modulate_f32(void *ctx, const void *args) {
    return layernorm_modulate_launch<float>(ctx, args);
}

extern "C" int kern_cuda_layernorm_modulate_bf16(void *ctx, const void *args) {
    return layernorm_modulate_launch<__nv_bfloat16>(ctx, args);
}
