/* frame_interleave.cu -- FRAME_INTERLEAVE: y [2T, H, W, C] from x [T, H,
 * W, 2C], y[2t+k, p, c] = x[t, p, k·C + c] (Wan's upsample3d frame
 * doubling). One thread per output element; exact. */
#include "cuda_device.cuh"
#include "../ops_video_args.h"

template <typename T>
__global__ void frame_interleave_kernel(const T *x, T *y, int64_t HW, int64_t C, int64_t n) {
    KC_FOR(i, n) {
        int64_t c = i % C, p = (i / C) % HW, f = i / (C * HW);
        int64_t t = f / 2, k = f % 2;
        y[i] = x[(t * HW + p) * 2 * C + k * C + c];
    }
}

template <typename T>
static int frame_interleave_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_video_args_t *a = (const kern_video_args_t *)args;
    int64_t n = 2 * a->T * a->H * a->W * a->C;
    if (n <= 0) return 0;
    frame_interleave_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->x, (T *)a->y, a->H * a->W, a->C, n);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_frame_interleave_f32(void *ctx, const void *args) {
    return frame_interleave_launch<float>(ctx, args);
}

extern "C" int kern_cuda_frame_interleave_bf16(void *ctx, const void *args) {
    return frame_interleave_launch<__nv_bfloat16>(ctx, args);
}
