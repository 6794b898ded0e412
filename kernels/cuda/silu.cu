/* silu.cu -- SILU: y = u / (1 + e^(−u)) over n elements, F32 arithmetic.
 * y may equal x. For u → −∞ e^(−u) overflows to inf and y is −0, not NaN. */
#include "cuda_device.cuh"

template <typename T>
__global__ void silu_kernel(const T *x, T *y, int64_t n) {
    KC_FOR(i, n) {
        float u = kc_f32(x[i]);
        y[i] = kc_store<T>(u / (1.0f + expf(-u)));
    }
}

template <typename T>
static int silu_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_unary_args_t *a = (const kern_unary_args_t *)args;
    if (a->n <= 0) return 0;
    silu_kernel<T><<<kc_blocks(a->n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->x, (T *)a->y, a->n);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_silu_f32(void *ctx, const void *args) {
    return silu_launch<float>(ctx, args);
}

extern "C" int kern_cuda_silu_bf16(void *ctx, const void *args) {
    return silu_launch<__nv_bfloat16>(ctx, args);
}
