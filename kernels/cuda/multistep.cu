/* multistep.cu -- MULTISTEP: one multistep solver step (UniPC, DPM++) per
 * element, in double, with every coefficient read from device memory when
 * the kernel runs (kern_multistep_args_t), so one captured graph serves
 * every step of a schedule. Element-wise: x and h update in place. */
#include "cuda_device.cuh"

template <typename T>
__global__ void multistep_kernel(T *x, const T *v, T *h, const float *c, int64_t n) {
    KC_FOR(i, n) {
        T *h0 = h, *h1 = h + n, *h2 = h + 2 * n;
        double xi = (double)kc_f32(x[i]), p1 = (double)kc_f32(h1[i]), p2 = (double)kc_f32(h2[i]);
        /* m and the corrected sample rounded to T, as the history stores
         * them: the predictor reads the very values the next step will. */
        double m = (double)kc_f32(kc_store_f64<T>(xi + (double)c[KERN_MS_CM] * (double)kc_f32(v[i])));
        double xc = (double)kc_f32(kc_store_f64<T>((double)c[KERN_MS_CX] * xi + (double)c[KERN_MS_CXL] * (double)kc_f32(h0[i]) +
                                                   (double)c[KERN_MS_CP1] * p1 + (double)c[KERN_MS_CP2] * p2 +
                                                   (double)c[KERN_MS_CCM] * m));
        double xn = (double)c[KERN_MS_DXC] * xc + (double)c[KERN_MS_DM] * m + (double)c[KERN_MS_DP1] * p1 +
                    (double)c[KERN_MS_DP2] * p2;
        x[i] = kc_store_f64<T>(xn);
        h0[i] = kc_store_f64<T>(xc);
        h2[i] = kc_store_f64<T>(p1);
        h1[i] = kc_store_f64<T>(m);
    }
}

template <typename T>
static int multistep_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_multistep_args_t *a = (const kern_multistep_args_t *)args;
    if (a->n <= 0) return 0;
    multistep_kernel<T><<<kc_blocks(a->n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (T *)a->x, (const T *)a->v, (T *)a->h, a->coef, a->n);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_multistep_f32(void *ctx, const void *args) {
    return multistep_launch<float>(ctx, args);
}

extern "C" int kern_cuda_multistep_bf16(void *ctx, const void *args) {
    return multistep_launch<__nv_bfloat16>(ctx, args);
}
