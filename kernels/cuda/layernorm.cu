/* layernorm.cu -- LAYERNORM over the last dim of [rows, dim]:
 * (x − mean)/√(var + eps), then ·weight + bias when weight != NULL (bias may
 * be NULL). One block per row (norm_rows.cuh: two F32 passes for mean and
 * variance, then the store; 16-byte loads where dim % 8 == 0 and the
 * pointers are aligned). y may equal x. */
#include "norm_rows.cuh"
#include <limits.h>

template <typename T, bool VEC>
__global__ void layernorm_kernel(const T *x, const T *weight, const T *bias, T *y, int64_t dim, float eps) {
    __shared__ float sh[33];
    const int64_t r = blockIdx.x;
    kc_ln_row<T, VEC>(x + r * dim, weight, bias, y + r * dim, dim, eps, sh);
}

template <typename T>
static int layernorm_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_norm_args_t *a = (const kern_norm_args_t *)args;
    if (a->rows <= 0 || a->dim <= 0) return 0;
    if (a->rows > INT_MAX)
        return reel_fail(REEL_E_LIMIT, "layernorm: %lld rows exceed the CUDA grid (one block per row)",
                         (long long)a->rows);
    if (kc_vec_ok(a->dim, a->x, a->y, a->weight, a->bias))
        layernorm_kernel<T, true><<<(unsigned)a->rows, kc_norm_threads<true>(a->dim), 0, c->stream>>>(
            (const T *)a->x, (const T *)a->weight, (const T *)a->bias, (T *)a->y, a->dim, a->eps);
    else
        layernorm_kernel<T, false><<<(unsigned)a->rows, kc_norm_threads<false>(a->dim), 0, c->stream>>>(
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
