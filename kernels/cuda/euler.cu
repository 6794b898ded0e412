/* euler.cu -- EULER: x += (sigmas[1] − sigmas[0])·v over n elements, F32
 * arithmetic. The sigmas are read from device memory when the kernel runs,
 * so one captured graph serves every step of the schedule. */
#include "cuda_device.cuh"

template <typename T>
__global__ void euler_kernel(T *x, const T *v, const float *sigmas, int64_t n, int64_t group, int64_t sstride) {
    KC_FOR(i, n) {
        const float *sg = sigmas + (group ? i / group * sstride : 0); /* the sample's own σ */
        const float dt = sg[1] - sg[0];
        x[i] = kc_store<T>(kc_f32(x[i]) + dt * kc_f32(v[i]));
    }
}

template <typename T>
static int euler_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_euler_args_t *a = (const kern_euler_args_t *)args;
    if (a->n <= 0) return 0;
    euler_kernel<T><<<kc_blocks(a->n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (T *)a->x, (const T *)a->v, a->sigmas, a->n, a->group, a->sigma_stride);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_euler_f32(void *ctx, const void *args) {
    return euler_launch<float>(ctx, args);
}

extern "C" int kern_cuda_euler_bf16(void *ctx, const void *args) {
    return euler_launch<__nv_bfloat16>(ctx, args);
}
