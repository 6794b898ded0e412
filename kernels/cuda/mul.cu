/* mul.cu -- MUL: y = a·b over n elements, F32 arithmetic. y may alias a
 * or b: each element is read before it is written, by the same thread. */
#include "cuda_device.cuh"

template <typename T>
__global__ void mul_kernel(const T *a, const T *b, T *y, int64_t n) {
    KC_FOR(i, n) y[i] = kc_store<T>(kc_f32(a[i]) * kc_f32(b[i]));
}

template <typename T>
static int mul_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_binary_args_t *a = (const kern_binary_args_t *)args;
    if (a->n <= 0) return 0;
    mul_kernel<T><<<kc_blocks(a->n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->a, (const T *)a->b, (T *)a->y, a->n);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_mul_f32(void *ctx, const void *args) {
    return mul_launch<float>(ctx, args);
}

extern "C" int kern_cuda_mul_bf16(void *ctx, const void *args) {
    return mul_launch<__nv_bfloat16>(ctx, args);
}
