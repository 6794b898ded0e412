/* unpatchify.cu -- UNPATCHIFY with patch (1, 2, 2): tokens [N, 4C], each
 * token's vector in (ph, pw, c) order, c fastest -- not the patchify order
 * (TINYDIT.md step 6) -> latent [C,F,H,W]. One thread per output element,
 * so writes are coalesced. */
#include "cuda_device.cuh"

template <typename T>
__global__ void unpatchify_kernel(const T *src, T *dst, int64_t C, int64_t F, int64_t H, int64_t W) {
    const int64_t Hp = H / 2, Wp = W / 2, n = C * F * H * W;
    KC_FOR(i, n) {
        int64_t w = i % W, h = (i / W) % H, f = (i / (W * H)) % F, c = i / (W * H * F);
        int64_t tok = (f * Hp + h / 2) * Wp + w / 2;
        dst[i] = src[tok * 4 * C + ((h % 2) * 2 + w % 2) * C + c];
    }
}

template <typename T>
static int unpatchify_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_patch_args_t *a = (const kern_patch_args_t *)args;
    int64_t n = a->C * a->F * a->H * a->W;
    if (n <= 0) return 0;
    unpatchify_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->src, (T *)a->dst, a->C, a->F, a->H, a->W);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_unpatchify_f32(void *ctx, const void *args) {
    return unpatchify_launch<float>(ctx, args);
}

extern "C" int kern_cuda_unpatchify_bf16(void *ctx, const void *args) {
    return unpatchify_launch<__nv_bfloat16>(ctx, args);
}
