/* gated_residual.cu -- GATED_RESIDUAL: x[r,i] += gate[i]·y[r,i] over
 * [rows, dim], or x += y when gate is NULL; F32 arithmetic (kc_residual:
 * never an FMA, so the CPU's bits in F32). Where dim is a
 * multiple of 8 and x, y, gate are 16-byte aligned, each thread moves 8
 * values a load (cuda_device.cuh, kc_load8): the same arithmetic per
 * value, so the same bits as the scalar loop. */
#include "cuda_device.cuh"

/* Element i's gate value: row i / dim's group's (group rows a group,
 * gstride elements apart; group 0: one gate for every row). */
template <typename T>
static __device__ __forceinline__ const T *kc_gate_at(const T *gate, int64_t i, int64_t dim, int64_t group,
                                                    int64_t gstride) {
    return gate + (group ? i / dim / group * gstride : 0) + i % dim;
}

template <typename T>
__global__ void gated_residual_kernel(T *x, const T *y, const T *gate, int64_t n, int64_t dim, int64_t group,
                                      int64_t gstride) {
    KC_FOR(i, n) {
        float g = gate ? kc_f32(*kc_gate_at(gate, i, dim, group, gstride)) : 1.0f;
        x[i] = kc_store<T>(kc_residual(kc_f32(x[i]), g, kc_f32(y[i])));
    }
}

/* n/8 chunks of 8; a chunk lies in one row (dim % 8 == 0). */
template <typename T>
__global__ void gated_residual_vec_kernel(T *x, const T *y, const T *gate, int64_t chunks, int64_t dim,
                                          int64_t group, int64_t gstride) {
    KC_FOR(c, chunks) {
        const int64_t i = c * KC_VEC;
        float xv[KC_VEC], yv[KC_VEC], gv[KC_VEC];
        kc_load8(x + i, xv);
        kc_load8(y + i, yv);
        if (gate) kc_load8(kc_gate_at(gate, i, dim, group, gstride), gv);
#pragma unroll
        for (int k = 0; k < KC_VEC; k++) xv[k] = kc_residual(xv[k], gate ? gv[k] : 1.0f, yv[k]);
        kc_store8(x + i, xv);
    }
}

template <typename T>
static int gated_residual_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_residual_args_t *a = (const kern_residual_args_t *)args;
    int64_t n = a->rows * a->dim;
    if (n <= 0) return 0;
    /* the two paths give the same bits; vec only where every group's gate
     * row is as aligned as the first */
    const int64_t group = a->gate ? a->group : 0, gs = group ? a->gate_stride : 0;
    if (kc_vec_ok(a->dim, a->x, a->y, a->gate) && gs % KC_VEC == 0)
        gated_residual_vec_kernel<T><<<kc_blocks(n / KC_VEC, KC_THREADS), KC_THREADS, 0, c->stream>>>(
            (T *)a->x, (const T *)a->y, (const T *)a->gate, n / KC_VEC, a->dim, group, gs);
    else
        gated_residual_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
            (T *)a->x, (const T *)a->y, (const T *)a->gate, n, a->dim, group, gs);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_gated_residual_f32(void *ctx, const void *args) {
    return gated_residual_launch<float>(ctx, args);
}

extern "C" int kern_cuda_gated_residual_bf16(void *ctx, const void *args) {
    return gated_residual_launch<__nv_bfloat16>(ctx, args);
}
