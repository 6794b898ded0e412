/* upsample2x.cu -- UPSAMPLE2X: nearest 2x in space over a channels-last
 * clip, y [T, 2H, 2W, C] from x [T, H, W, C]. One thread per output
 * element; exact. */
#include "cuda_device.cuh"
#include "../ops_video_args.h"

template <typename T>
__global__ void upsample2x_kernel(const T *x, T *y, int64_t H, int64_t W, int64_t C, int64_t n) {
    KC_FOR(i, n) {
        int64_t c = i % C, p = i / C;
        int64_t X = p % (2 * W), Y = (p / (2 * W)) % (2 * H), t = p / (4 * H * W);
        y[i] = x[((t * H + Y / 2) * W + X / 2) * C + c];
    }
}

template <typename T>
static int upsample2x_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_video_args_t *a = (const kern_video_args_t *)args;
    int64_t n = a->T * 4 * a->H * a->W * a->C;
    if (n <= 0) return 0;
    upsample2x_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->x, (T *)a->y, a->H, a->W, a->C, n);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_upsample2x_f32(void *ctx, const void *args) {
    return upsample2x_launch<float>(ctx, args);
}

extern "C" int kern_cuda_upsample2x_bf16(void *ctx, const void *args) {
    return upsample2x_launch<__nv_bfloat16>(ctx, args);
}
