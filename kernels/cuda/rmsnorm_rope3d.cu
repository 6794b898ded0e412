/* rmsnorm_rope3d.cu -- RMSNORM_ROPE3D in place on x [F·Hp·Wp, heads·d]:
 * each token row becomes x/√(mean(x²) + eps)·weight, the mean over the
 * whole row (all heads, TINYDIT.md), then every head turns by the 3-D RoPE
 * of the token (rope3d.cu: q = ⌊d/6⌋, frame part d − 4q real dims, row and
 * column parts 2q; pair j of a part of r dims turns by pos·10000^(−2j/r)).
 *
 * One block per token row. Pass 1 reduces the sum of squares in F32 (per
 * thread, by 16-byte loads of 8 values where the row allows, per warp,
 * across warps: a tree fixed by the row width, so every run sums in the
 * same order). Pass 2 reads each pair once, normalises it
 * in F32 (as rmsnorm.cu), turns it in double by the angle computed in
 * double (as rope3d.cu, so position 0 leaves a pair as RMSNorm left it) and
 * stores it rounded once to T: the unfused pair writes and re-reads the
 * whole row in between, and rounds BF16 twice. The threads of a block split
 * the d/2 pairs of a head and, when there are more threads than pairs, the
 * heads in G groups; each (pair, group) computes its angle's cos/sin once
 * and reuses it for its heads. In place is safe: pass 1 ends in a barrier
 * before any write, and each pair is read and written by one thread. */
#include "cuda_device.cuh"
#include <limits.h>

template <typename T>
__global__ void rmsnorm_rope3d_kernel(T *x, const T *weight, int64_t heads, int64_t d,
                                      int64_t rows, int64_t cols, int64_t ntok, float eps, bool vec) {
    __shared__ float sh[33];
    /* block: a row of the batch; tok: its token's place in its sample */
    const int64_t D = heads * d, tok = (int64_t)blockIdx.x % ntok;
    T *xr = x + (int64_t)blockIdx.x * D;
    float q = 0.0f;
    if (vec) { /* 8 values a 16-byte load (D % 8 == 0, x aligned) */
        float v[KC_VEC];
        for (int64_t c = threadIdx.x; c < D / KC_VEC; c += blockDim.x) {
            kc_load8(xr + c * KC_VEC, v);
#pragma unroll
            for (int k = 0; k < KC_VEC; k++) q += v[k] * v[k];
        }
    } else {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            const float v = kc_f32(xr[i]);
            q += v * v;
        }
    }
    const float r = 1.0f / sqrtf(kc_block_sum(q, sh) / (float)D + eps);
    const int64_t half = d / 2, q6 = d / 6, n0 = d - 4 * q6; /* n0: real dims of the frame part */
    const int64_t nt = blockDim.x, t = threadIdx.x;
    const bool wide = half >= nt; /* at least one pair per thread: no head groups */
    const int64_t groups = wide ? 1 : nt / half, g = wide ? 0 : t / half;
    const int64_t pstep = wide ? nt : half;
    if (g >= groups) return; /* no barrier follows */
    for (int64_t p = wide ? t : t % half; p < half; p += pstep) {
        int64_t pos, j, rd;
        if (2 * p < n0) {                       /* frame */
            pos = tok / (rows * cols); j = p; rd = n0;
        } else if (2 * p < n0 + 2 * q6) {       /* row */
            pos = (tok / cols) % rows; j = p - n0 / 2; rd = 2 * q6;
        } else {                                /* column */
            pos = tok % cols; j = p - n0 / 2 - q6; rd = 2 * q6;
        }
        double sn, cs;
        sincos((double)pos * pow(10000.0, -2.0 * (double)j / (double)rd), &sn, &cs);
        for (int64_t h = g; h < heads; h += groups) {
            const int64_t i = h * d + 2 * p;
            const double a = kc_f32(xr[i]) * r * kc_f32(weight[i]);
            const double b = kc_f32(xr[i + 1]) * r * kc_f32(weight[i + 1]);
            xr[i] = kc_store_f64<T>(a * cs - b * sn);
            xr[i + 1] = kc_store_f64<T>(a * sn + b * cs);
        }
    }
}

template <typename T>
static int rmsnorm_rope3d_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_rmsnorm_rope_args_t *a = (const kern_rmsnorm_rope_args_t *)args;
    const int64_t ntok = a->frames * a->rows * a->cols, all = ntok * (a->batch > 1 ? a->batch : 1);
    if (ntok <= 0 || a->heads <= 0 || a->head_dim <= 0) return 0;
    if (a->head_dim % 2)
        return reel_fail(REEL_E_INVALID, "rmsnorm_rope3d: head_dim %lld is odd", (long long)a->head_dim);
    if (!a->weight) return reel_fail(REEL_E_INVALID, "rmsnorm_rope3d: weight is required");
    if (all > INT_MAX)
        return reel_fail(REEL_E_LIMIT, "rmsnorm_rope3d: %lld tokens exceed the CUDA grid (one block per token)",
                         (long long)all);
    const int threads = kc_row_threads(a->heads * a->head_dim);
    /* a batch's samples: the same vec choice as each alone (D % 8 == 0
     * keeps every sample's rows aligned as the first's) */
    rmsnorm_rope3d_kernel<T><<<(unsigned)all, threads, 0, c->stream>>>(
        (T *)a->x, (const T *)a->weight, a->heads, a->head_dim, a->rows, a->cols, ntok, a->eps,
        kc_vec_ok(a->heads * a->head_dim, a->x));
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_rmsnorm_rope3d_f32(void *ctx, const void *args) {
    return rmsnorm_rope3d_launch<float>(ctx, args);
}

extern "C" int kern_cuda_rmsnorm_rope3d_bf16(void *ctx, const void *args) {
    return rmsnorm_rope3d_launch<__nv_bfloat16>(ctx, args);
}
