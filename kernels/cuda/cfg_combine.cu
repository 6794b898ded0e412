/* cfg_combine.cu -- CFG_COMBINE: v = vu + g[0]·(vc − vu) over n elements,
 * F32 arithmetic. g lives in device memory and is read when the kernel
 * runs, so a captured graph follows the guidance scale of each replay. */
#include "cuda_device.cuh"

template <typename T>
__global__ void cfg_combine_kernel(const T *vc, const T *vu, const float *g, T *v, int64_t n, int64_t group) {
    KC_FOR(i, n) {
        const float gs = g[group ? i / group : 0]; /* the sample's own scale */
        float u = kc_f32(vu[i]);
        v[i] = kc_store<T>(u + gs * (kc_f32(vc[i]) - u));
    }
}

template <typename T>
static int cfg_combine_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_cfg_args_t *a = (const kern_cfg_args_t *)args;
    if (a->n <= 0) return 0;
    cfg_combine_kernel<T><<<kc_blocks(a->n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->vc, (const T *)a->vu, a->g, (T *)a->v, a->n, a->group);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_cfg_combine_f32(void *ctx, const void *args) {
    return cfg_combine_launch<float>(ctx, args);
}

extern "C" int kern_cuda_cfg_combine_bf16(void *ctx, const void *args) {
    return cfg_combine_launch<__nv_bfloat16>(ctx, args);
}
