/* add.cu -- ADD: y = a + b over n elements, F32 arithmetic, a repeating
 * every a_period elements when that is set. y may alias a or b (not a
 * repeated a: ops.c refuses it): each element is read before it is
 * written, by the same thread. */
#include "cuda_device.cuh"

template <typename T>
__global__ void add_kernel(const T *a, const T *b, T *y, int64_t n, int64_t period) {
    KC_FOR(i, n) y[i] = kc_store<T>(kc_f32(a[period ? i % period : i]) + kc_f32(b[i]));
}

template <typename T>
static int add_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_binary_args_t *a = (const kern_binary_args_t *)args;
    if (a->n <= 0) return 0;
    add_kernel<T><<<kc_blocks(a->n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->a, (const T *)a->b, (T *)a->y, a->n, a->a_period);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_add_f32(void *ctx, const void *args) {
    return add_launch<float>(ctx, args);
}

extern "C" int kern_cuda_add_bf16(void *ctx, const void *args) {
    return add_launch<__nv_bfloat16>(ctx, args);
}
