/* modulate.cu -- MODULATE: y[r,i] = x[r,i]·(1 + scale[i]) + shift[i] over
 * [rows, dim], F32 arithmetic. y may equal x. */
#include "cuda_device.cuh"

template <typename T>
__global__ void modulate_kernel(const T *x, const T *shift, const T *scale, T *y,
                                int64_t n, int64_t dim) {
    KC_FOR(i, n) {
        int64_t c = i % dim;
        y[i] = kc_store<T>(kc_f32(x[i]) * (1.0f + kc_f32(scale[c])) + kc_f32(shift[c]));
    }
}

template <typename T>
static int modulate_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_modulate_args_t *a = (const kern_modulate_args_t *)args;
    int64_t n = a->rows * a->dim;
    if (n <= 0) return 0;
    modulate_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->x, (const T *)a->shift, (const T *)a->scale, (T *)a->y, n, a->dim);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_modulate_f32(void *ctx, const void *args) {
    return modulate_launch<float>(ctx, args);
}

extern "C" int kern_cuda_modulate_bf16(void *ctx, const void *args) {
    return modulate_launch<__nv_bfloat16>(ctx, args);
}
