/* unpatchify.cu -- UNPATCHIFY with patch (1, 2, 2): tokens [N, 4C], each
 * token's vector in (ph, pw, c) order, c fastest -- not the patchify order
 * (TINYDIT.md step 6) -> latent [C,F,H,W]. One thread per output element,
 * so writes are coalesced. */
#include "cuda_device.cuh"

template <typename T>
__global__ void unpatchify_kernel(const T *src, T *dst, int64_t C, int64_t F, int64_t H, int64_t W, int64_t batch) {
    const int64_t Hp = H / 2, Wp = W / 2, per = C * F * H * W;
    KC_FOR(k, batch * per) { /* a batch: its samples one after another */
        const int64_t b = k / per, i = k % per;
        const T *src_b = src + b * per;
        int64_t w = i % W, h = (i / W) % H, f = (i / (W * H)) % F, c = i / (W * H * F);
        int64_t tok = (f * Hp + h / 2) * Wp + w / 2;
        dst[k] = src_b[tok * 4 * C + ((h % 2) * 2 + w % 2) * C + c];
    }
}

template <typename T>
static int unpatchify_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_patch_args_t *a = (const kern_patch_args_t *)args;
    const int64_t batch = a->batch > 1 ? a->batch : 1, n = a->C * a->F * a->H * a->W * batch;
    if (n <= 0) return 0;
    unpatchify_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->src, (T *)a->dst, a->C, a->F, a->H, a->W, batch);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_unpatchify_f32(void *ctx, const void *args) {
    return unpatchify_launch<float>(ctx, args);
}

extern "C" int kern_cuda_unpatchify_bf16(void *ctx, const void *args) {
    return unpatchify_launch<__nv_bfloat16>(ctx, args);
}
