/* im2col3d.cu -- IM2COL3D: the columns of a causal, spatially 'same' 3-D
 * convolution over a channels-last clip (ops_video_args.h says exactly
 * which element goes where). One thread per column element: pure data
 * movement, exact in F32 and BF16. */
#include "cuda_device.cuh"
#include "../ops_video_args.h"

template <typename T>
__global__ void im2col3d_kernel(kern_im2col3d_args_t a, int64_t n) {
    const int64_t C = a.C, HW = a.H * a.W;
    const int64_t K = a.kt * a.kh * a.kw * C, Z = a.kt - 1 - a.P;
    KC_FOR(i, n) {
        int64_t row = i / K, col = i % K;
        int64_t c = col % C, tap = col / C;
        int64_t dx = tap % a.kw, dy = (tap / a.kw) % a.kh, dt = tap / (a.kw * a.kh);
        int64_t r = a.row0 + row, t = r / HW, y = (r % HW) / a.W, x = r % a.W;
        int64_t lt = t + dt, sy = y + dy - a.kh / 2, sx = x + dx - a.kw / 2;
        T v = kc_store<T>(0.0f);
        if (lt >= Z && sy >= 0 && sy < a.H && sx >= 0 && sx < a.W) {
            const T *frame = lt < Z + a.P ? (const T *)a.prev + (lt - Z) * HW * C
                                          : (const T *)a.x + (lt - Z - a.P) * HW * C;
            v = frame[(sy * a.W + sx) * C + c];
        }
        ((T *)a.cols)[i] = v;
    }
}

template <typename T>
static int im2col3d_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_im2col3d_args_t *a = (const kern_im2col3d_args_t *)args;
    int64_t n = a->rows * a->kt * a->kh * a->kw * a->C;
    if (n <= 0) return 0;
    im2col3d_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(*a, n);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_im2col3d_f32(void *ctx, const void *args) {
    return im2col3d_launch<float>(ctx, args);
}

extern "C" int kern_cuda_im2col3d_bf16(void *ctx, const void *args) {
    return im2col3d_launch<__nv_bfloat16>(ctx, args);
}
