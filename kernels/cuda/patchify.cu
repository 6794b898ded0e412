/* patchify.cu -- PATCHIFY with patch (1, 2, 2): latent [C,F,H,W] -> tokens
 * [F·H/2·W/2, 4C], tokens in (f, h, w) order, each token's vector in
 * (c, ph, pw) order (ops_args.h, TINYDIT.md). Pure data movement: one
 * thread per output element, so writes are coalesced. */
#include "cuda_device.cuh"

template <typename T>
__global__ void patchify_kernel(const T *src, T *dst, int64_t C, int64_t F, int64_t H, int64_t W, int64_t batch) {
    const int64_t Hp = H / 2, Wp = W / 2, per = F * Hp * Wp * 4 * C;
    KC_FOR(k, batch * per) { /* a batch: its samples one after another */
        const int64_t b = k / per, i = k % per;
        const T *src_b = src + b * per;
        int64_t tok = i / (4 * C), e = i % (4 * C);
        int64_t c = e / 4, ph = (e / 2) % 2, pw = e % 2;
        int64_t f = tok / (Hp * Wp), hh = (tok / Wp) % Hp, ww = tok % Wp;
        dst[k] = src_b[((c * F + f) * H + 2 * hh + ph) * W + 2 * ww + pw];
    }
}

template <typename T>
static int patchify_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_patch_args_t *a = (const kern_patch_args_t *)args;
    const int64_t batch = a->batch > 1 ? a->batch : 1, n = a->C * a->F * a->H * a->W * batch;
    if (n <= 0) return 0;
    patchify_kernel<T><<<kc_blocks(n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (const T *)a->src, (T *)a->dst, a->C, a->F, a->H, a->W, batch);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_patchify_f32(void *ctx, const void *args) {
    return patchify_launch<float>(ctx, args);
}

extern "C" int kern_cuda_patchify_bf16(void *ctx, const void *args) {
    return patchify_launch<__nv_bfloat16>(ctx, args);
}
