/* rope3d.cu -- ROPE3D in place on x [F·Hp·Wp, heads·d], tokens in (f, h, w)
 * order (TINYDIT.md "3-D RoPE"). With q = ⌊d/6⌋ the first d − 4q real dims
 * rotate by the frame index, the next 2q by the row, the last 2q by the
 * column; pair j of a part of r dims has ω_j = 10000^(−2j/r) and turns
 * (a, b) into (a·cos θ − b·sin θ, a·sin θ + b·cos θ), θ = pos·ω_j.
 * One thread per (token, pair): the angle, its cos/sin and the rotation are
 * computed in double and rounded once, like the CPU (so position 0 leaves a
 * pair bit for bit unchanged); the cos/sin are shared by every head. */
#include "cuda_device.cuh"

template <typename T>
__global__ void rope3d_kernel(T *x, int64_t heads, int64_t d, int64_t rows, int64_t cols,
                              int64_t ntok) {
    const int64_t half = d / 2, q = d / 6, n0 = d - 4 * q; /* real dims of the frame part */
    KC_FOR(i, ntok * half) {
        const int64_t tok = i / half, p = i % half;
        int64_t pos, j, r;
        if (2 * p < n0) {                       /* frame */
            pos = tok / (rows * cols); j = p; r = n0;
        } else if (2 * p < n0 + 2 * q) {        /* row */
            pos = (tok / cols) % rows; j = p - n0 / 2; r = 2 * q;
        } else {                                /* column */
            pos = tok % cols; j = p - n0 / 2 - q; r = 2 * q;
        }
        double sn, cs;
        sincos((double)pos * pow(10000.0, -2.0 * (double)j / (double)r), &sn, &cs);
        T *px = x + tok * heads * d + 2 * p;
        for (int64_t h = 0; h < heads; h++, px += d) {
            double a = kc_f32(px[0]), b = kc_f32(px[1]);
            px[0] = kc_store_f64<T>(a * cs - b * sn);
            px[1] = kc_store_f64<T>(a * sn + b * cs);
        }
    }
}

template <typename T>
static int rope3d_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_rope3d_args_t *a = (const kern_rope3d_args_t *)args;
    const int64_t ntok = a->frames * a->rows * a->cols, n = ntok * (a->head_dim / 2);
    if (n <= 0 || a->heads <= 0) return 0;
    if (a->head_dim % 2) return reel_fail(REEL_E_INVALID, "rope3d: head_dim %lld is odd", (long long)a->head_dim);
    rope3d_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (T *)a->x, a->heads, a->head_dim, a->rows, a->cols, ntok);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_rope3d_f32(void *ctx, const void *args) {
    return rope3d_launch<float>(ctx, args);
}

extern "C" int kern_cuda_rope3d_bf16(void *ctx, const void *args) {
    return rope3d_launch<__nv_bfloat16>(ctx, args);
}
