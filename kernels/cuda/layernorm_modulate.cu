/* layernorm_modulate.cu -- LAYERNORM_MODULATE over [rows, dim]:
 * y = LN(x)·(1 + scale) + shift, LN without affine (the adaLN of the DiT
 * blocks and the head). One block per row (norm_rows.cuh: mean and
 * variance by two F32 passes, then one pass that normalises, modulates and
 * stores, rounding to T once; 16-byte loads where dim % 8 == 0 and the
 * pointers are aligned). The unfused pair stores LN(x) in T in between:
 * one rounding more for BF16, and one more trip of the row through memory.
 * y may equal x. */
#include "norm_rows.cuh"
#include <limits.h>

template <typename T, bool VEC>
__global__ void layernorm_modulate_kernel(const T *x, const T *shift, const T *scale, T *y, int64_t dim,
                                          float eps, int64_t group, int64_t sh_stride, int64_t sc_stride) {
    __shared__ float sh[33];
    const int64_t r = blockIdx.x, g = group ? r / group : 0; /* the row's group (ops_args.h) */
    kc_ln_modulate_row<T, VEC>(x + r * dim, shift + g * sh_stride, scale + g * sc_stride, y + r * dim, dim, eps,
                               sh);
}

template <typename T>
static int layernorm_modulate_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_norm_modulate_args_t *a = (const kern_norm_modulate_args_t *)args;
    if (a->rows <= 0 || a->dim <= 0) return 0;
    if (a->rows > INT_MAX)
        return reel_fail(REEL_E_LIMIT, "layernorm_modulate: %lld rows exceed the CUDA grid (one block per row)",
                         (long long)a->rows);
    const int64_t group = a->group, ss = group ? a->shift_stride : 0, cs = group ? a->scale_stride : 0;
    /* The two paths sum in different orders: a group takes the one it
     * takes alone. Rows whose parameter rows keep the first group's
     * alignment (strides of whole 16-byte chunks) share it; else group by
     * group, each with its own. */
    if (group && a->dim % KC_VEC == 0 && (ss % KC_VEC || cs % KC_VEC)) { /* (dim % 8: scalar for all) */
        for (int64_t g = 0; g < a->rows / group; g++) {
            kern_norm_modulate_args_t one = *a;
            one.x = (const T *)a->x + g * group * a->dim;
            one.y = (T *)a->y + g * group * a->dim;
            one.shift = (const T *)a->shift + g * ss;
            one.scale = (const T *)a->scale + g * cs;
            one.rows = group;
            one.group = 0;
            if (layernorm_modulate_launch<T>(ctx, &one)) return -1;
        }
        return 0;
    }
    if (kc_vec_ok(a->dim, a->x, a->y, a->shift, a->scale))
        layernorm_modulate_kernel<T, true><<<(unsigned)a->rows, kc_norm_threads<true>(a->dim), 0, c->stream>>>(
            (const T *)a->x, (const T *)a->shift, (const T *)a->scale, (T *)a->y, a->dim, a->eps, group, ss, cs);
    else
        layernorm_modulate_kernel<T, false><<<(unsigned)a->rows, kc_norm_threads<false>(a->dim), 0, c->stream>>>(
            (const T *)a->x, (const T *)a->shift, (const T *)a->scale, (T *)a->y, a->dim, a->eps, group, ss, cs);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_layernorm_modulate_f32(void *ctx, const void *args) {
    return layernorm_modulate_launch<float>(ctx, args);
}

extern "C" int kern_cuda_layernorm_modulate_bf16(void *ctx, const void *args) {
    return layernorm_modulate_launch<__nv_bfloat16>(ctx, args);
}
