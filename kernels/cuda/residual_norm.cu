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
                                     int64_t dim, float eps, bool modulate, bool res_vec, int64_t group,
                                     int64_t gs, int64_t s0, int64_t s1) {
    __shared__ float sh[33];
    const int64_t r = blockIdx.x, g = group ? r / group : 0; /* the row's group (ops_args.h) */
    if (gate) gate += g * gs;
    if (p0) p0 += g * s0;
    if (p1) p1 += g * s1;
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
    const int64_t group = a->group, gs = group && a->gate ? a->gate_stride : 0,
                  s0 = group && a->p0 ? a->p0_stride : 0, s1 = group && a->p1 ? a->p1_stride : 0;
    /* The LayerNorm's two paths sum in different orders: a group takes the
     * one it takes alone. Parameter strides of whole 16-byte chunks keep
     * every group's alignment the first's; else group by group. */
    if (group && a->dim % KC_VEC == 0 && (s0 % KC_VEC || s1 % KC_VEC)) { /* (dim % 8: scalar for all) */
        for (int64_t g = 0; g < a->rows / group; g++) {
            kern_residual_norm_args_t one = *a;
            one.x = (T *)a->x + g * group * a->dim;
            one.y = (const T *)a->y + g * group * a->dim;
            one.out = (T *)a->out + g * group * a->dim;
            if (a->gate) one.gate = (const T *)a->gate + g * gs;
            if (a->p0) one.p0 = (const T *)a->p0 + g * s0;
            if (a->p1) one.p1 = (const T *)a->p1 + g * s1;
            one.rows = group;
            one.group = 0;
            if (residual_norm_launch<T>(ctx, &one)) return -1;
        }
        return 0;
    }
    /* each part by its own kernel's rule, as the pair would run (the
     * residual's two paths give the same bits: its choice is speed only) */
    const bool res_vec = kc_vec_ok(a->dim, a->x, a->y, a->gate) && gs % KC_VEC == 0;
    if (kc_vec_ok(a->dim, a->x, a->out, a->p0, a->p1))
        residual_norm_kernel<T, true><<<(unsigned)a->rows, kc_norm_threads<true>(a->dim), 0, c->stream>>>(
            (T *)a->x, (const T *)a->y, (const T *)a->gate, (const T *)a->p0, (const T *)a->p1, (T *)a->out,
            a->dim, a->eps, a->modulate, res_vec, group, gs, s0, s1);
    else
        residual_norm_kernel<T, false><<<(unsigned)a->rows, kc_norm_threads<false>(a->dim), 0, c->stream>>>(
            (T *)a->x, (const T *)a->y, (const T *)a->gate, (const T *)a->p0, (const T *)a->p1, (T *)a->out,
            a->dim, a->eps, a->modulate, res_vec, group, gs, s0, s1);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_residual_norm_f32(void *ctx, const void *args) {
    return residual_norm_launch<float>(ctx, args);
}

extern "C" int kern_cuda_residual_norm_bf16(void *ctx, const void *args) {
    return residual_norm_launch<__nv_bfloat16>(ctx, args);
}
