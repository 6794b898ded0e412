/* residual_norm.cu -- RESIDUAL_NORM over [rows, dim]: x += gate·y, then
 * out = LN(x)·(1 + scale) + shift (modulate) or LN(x)·weight + bias, in one
 * block per row. Bit for bit GATED_RESIDUAL then LAYERNORM_MODULATE or
 * LAYERNORM (gated_residual.cu, norm_rows.cuh): the block first updates
 * and stores its row of x (the residual's arithmetic per value is
 * gated_residual.cu's, 8 values a load where x, y and gate allow, the same
 * bits either way), then, after a barrier, normalises x as stored, rounded
 * to T, by norm_rows.cuh on the path the LAYERNORM kernels' own rule picks
 * (x, out, p0, p1): the pair's sums in the pair's order. One launch, and
 * the row read from L1/L2 instead of HBM the second time. */
#include "norm_rows.cuh"
#include <limits.h>

template <typename T, bool VEC>
__global__ void residual_norm_kernel(T *x, const T *y, const T *gate, const T *p0, const T *p1, T *out,
                                     int64_t dim, float eps, bool modulate, bool res_vec) {
    __shared__ float sh[33];
    const int64_t r = blockIdx.x;
    T *xr = x + r * dim;
    const T *yr = y + r * dim;
    if (res_vec) {
        for (int64_t c = threadIdx.x; c < dim / KC_VEC; c += blockDim.x) {
            float xv[KC_VEC], yv[KC_VEC], gv[KC_VEC];
            kc_load8(xr + c * KC_VEC, xv);
            kc_load8(yr + c * KC_VEC, yv);
            if (gate) kc_load8(gate + c * KC_VEC, gv);
#pragma unroll
            for (int k = 0; k < KC_VEC; k++) xv[k] = kc_residual(xv[k], gate ? gv[k] : 1.0f, yv[k]);
            kc_store8(xr + c * KC_VEC, xv);
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
            const float g = gate ? kc_f32(gate[i]) : 1.0f;
            xr[i] = kc_store<T>(kc_residual(kc_f32(xr[i]), g, kc_f32(yr[i])));
        }
    }
    __syncthreads(); /* the row as stored, whichever thread stored it */
    if (modulate) kc_ln_modulate_row<T, VEC>(xr, p0, p1, out + r * dim, dim, eps, sh);
    else kc_ln_row<T, VEC>(xr, p0, p1, out + r * dim, dim, eps, sh);
}

template <typename T>
static int residual_norm_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_residual_norm_args_t *a = (const kern_residual_norm_args_t *)args;
    if (a->rows <= 0 || a->dim <= 0) return 0;
    if (a->rows > INT_MAX)
        return reel_fail(REEL_E_LIMIT, "residual_norm: %lld rows exceed the CUDA grid (one block per row)",
                         (long long)a->rows);
    /* each part by its own kernel's rule, as the pair would run */
    const bool res_vec = kc_vec_ok(a->dim, a->x, a->y, a->gate);
    if (kc_vec_ok(a->dim, a->x, a->out, a->p0, a->p1))
        residual_norm_kernel<T, true><<<(unsigned)a->rows, kc_norm_threads<true>(a->dim), 0, c->stream>>>(
            (T *)a->x, (const T *)a->y, (const T *)a->gate, (const T *)a->p0, (const T *)a->p1, (T *)a->out,
            a->dim, a->eps, a->modulate, res_vec);
    else
        residual_norm_kernel<T, false><<<(unsigned)a->rows, kc_norm_threads<false>(a->dim), 0, c->stream>>>(
            (T *)a->x, (const T *)a->y, (const T *)a->gate, (const T *)a->p0, (const T *)a->p1, (T *)a->out,
            a->dim, a->eps, a->modulate, res_vec);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_residual_norm_f32(void *ctx, const void *args) {
    return residual_norm_launch<float>(ctx, args);
}

extern "C" int kern_cuda_residual_norm_bf16(void *ctx, const void *args) {
    return residual_norm_launch<__nv_bfloat16>(ctx, args);
}
