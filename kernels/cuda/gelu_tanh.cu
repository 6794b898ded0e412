/* gelu_tanh.cu -- GELU_TANH: y = 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³)))
 * over n elements, F32 arithmetic (TINYDIT.md). y may equal x. */
#include "cuda_device.cuh"

template <typename T>
__global__ void gelu_tanh_kernel(const T *x, T *y, int64_t n) {
    const float k0 = 0.7978845608028654f; /* √(2/π) */
    KC_FOR(i, n) {
        float u = kc_f32(x[i]);
        y[i] = kc_store<T>(0.5f * u * (1.0f + tanhf(k0 * (u + 0.044715f * u * u * u))));
    }
}

template <typename T>
static int gelu_tanh_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_unary_args_t *a = (const kern_unary_args_t *)args;
    if (a->n <= 0) return 0;
    gelu_tanh_kernel<T><<<kc_blocks(a->n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->x, (T *)a->y, a->n);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_gelu_tanh_f32(void *ctx, const void *args) {
    return gelu_tanh_launch<float>(ctx, args);
}

extern "C" int kern_cuda_gelu_tanh_bf16(void *ctx, const void *args) {
    return gelu_tanh_launch<__nv_bfloat16>(ctx, args);
}
