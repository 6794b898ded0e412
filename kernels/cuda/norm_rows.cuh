/* norm_rows.cuh -- one row of LayerNorm, then modulate or affine, as block
 * device functions: the bodies of LAYERNORM (layernorm.cu),
 * LAYERNORM_MODULATE (layernorm_modulate.cu) and RESIDUAL_NORM
 * (residual_norm.cu), written once so the fused op gives the unfused
 * pair's bits.
 *
 * One block per row. VEC: 16-byte loads of 8 values (dim % 8 == 0, every
 * pointer aligned), thread t owning chunks t, t + blockDim.x, ...; scalar:
 * thread t owning values t, t + blockDim.x, .... Mean and variance are two
 * F32 passes (the second over x − mean), each summed per thread in its own
 * order, then per warp, then across warps (kc_block_sum): a tree fixed by
 * dim and the block size, so every run sums in the same order. The store
 * pass rounds to T once. Every read of the row happens before the first
 * write (the reductions end in barriers), so y may equal x. Every thread of
 * the block must call these (they contain barriers). */
#ifndef REEL_KERNELS_CUDA_NORM_ROWS_CUH
#define REEL_KERNELS_CUDA_NORM_ROWS_CUH

#include "cuda_device.cuh"

/* Threads per row: one per value (scalar) or per chunk of 8 (VEC), as
 * kc_row_threads allows. */
template <bool VEC>
static inline int kc_norm_threads(int64_t dim) { return kc_row_threads(VEC ? dim / KC_VEC : dim); }

template <typename T, bool VEC>
static __device__ __forceinline__ void kc_ln_stats(const T *xr, int64_t dim, float eps, float *sh,
                                                   float *mean_out, float *rstd_out) {
    float s = 0.0f;
    if (VEC) {
        float v[KC_VEC];
        for (int64_t c = threadIdx.x; c < dim / KC_VEC; c += blockDim.x) {
            kc_load8(xr + c * KC_VEC, v);
#pragma unroll
            for (int k = 0; k < KC_VEC; k++) s += v[k];
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += kc_f32(xr[i]);
    }
    const float mean = kc_block_sum(s, sh) / (float)dim;
    float q = 0.0f;
    if (VEC) {
        float v[KC_VEC];
        for (int64_t c = threadIdx.x; c < dim / KC_VEC; c += blockDim.x) {
            kc_load8(xr + c * KC_VEC, v);
#pragma unroll
            for (int k = 0; k < KC_VEC; k++) {
                const float d = v[k] - mean;
                q += d * d;
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
            const float d = kc_f32(xr[i]) - mean;
            q += d * d;
        }
    }
    *mean_out = mean;
    *rstd_out = 1.0f / sqrtf(kc_block_sum(q, sh) / (float)dim + eps);
}

/* yr = LN(xr)·(1 + scale) + shift. */
template <typename T, bool VEC>
static __device__ __forceinline__ void kc_ln_modulate_row(const T *xr, const T *shift, const T *scale, T *yr,
                                                          int64_t dim, float eps, float *sh) {
    float mean, rstd;
    kc_ln_stats<T, VEC>(xr, dim, eps, sh, &mean, &rstd);
    if (VEC) {
        for (int64_t c = threadIdx.x; c < dim / KC_VEC; c += blockDim.x) {
            float v[KC_VEC], sc[KC_VEC], sf[KC_VEC];
            kc_load8(xr + c * KC_VEC, v);
            kc_load8(scale + c * KC_VEC, sc);
            kc_load8(shift + c * KC_VEC, sf);
#pragma unroll
            for (int k = 0; k < KC_VEC; k++) v[k] = (v[k] - mean) * rstd * (1.0f + sc[k]) + sf[k];
            kc_store8(yr + c * KC_VEC, v);
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
            const float n = (kc_f32(xr[i]) - mean) * rstd;
            yr[i] = kc_store<T>(n * (1.0f + kc_f32(scale[i])) + kc_f32(shift[i]));
        }
    }
}

/* yr = LN(xr), then ·weight + bias when weight != NULL (bias may be NULL). */
template <typename T, bool VEC>
static __device__ __forceinline__ void kc_ln_row(const T *xr, const T *weight, const T *bias, T *yr,
                                                 int64_t dim, float eps, float *sh) {
    float mean, rstd;
    kc_ln_stats<T, VEC>(xr, dim, eps, sh, &mean, &rstd);
    if (VEC) {
        for (int64_t c = threadIdx.x; c < dim / KC_VEC; c += blockDim.x) {
            float v[KC_VEC], w[KC_VEC], b[KC_VEC];
            kc_load8(xr + c * KC_VEC, v);
            if (weight) kc_load8(weight + c * KC_VEC, w);
            if (weight && bias) kc_load8(bias + c * KC_VEC, b);
#pragma unroll
            for (int k = 0; k < KC_VEC; k++) {
                float o = (v[k] - mean) * rstd;
                if (weight) o = o * w[k] + (bias ? b[k] : 0.0f);
                v[k] = o;
            }
            kc_store8(yr + c * KC_VEC, v);
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
            float o = (kc_f32(xr[i]) - mean) * rstd;
            if (weight) o = o * kc_f32(weight[i]) + (bias ? kc_f32(bias[i]) : 0.0f);
            yr[i] = kc_store<T>(o);
        }
    }
}

#endif
