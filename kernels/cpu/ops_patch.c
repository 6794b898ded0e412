/* ops_patch.c -- patchify and unpatchify with patch (1, 2, 2) on the CPU.
 *
 * Token (f, h, w), f slowest, covers latent[c, f, 2h + ph, 2w + pw]. The
 * two directions use different token vector orders (TINYDIT.md): patchify
 * writes (c, ph, pw), index c·4 + ph·2 + pw, as the patch embedding's
 * flattened [D, C, 1, 2, 2] weight expects; unpatchify reads (ph, pw, c),
 * index (ph·2 + pw)·C + c, as the head emits. Pure copies: exact. */
#include "../ops_args.h"

/* Cannot fail. */
static int patchify_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_patch_args_t *a = args;
    int64_t C = a->C, F = a->F, H = a->H, W = a->W, Hp = H / 2, Wp = W / 2, per = C * F * H * W;
    for (int64_t b = 0; b < (a->batch > 1 ? a->batch : 1); b++) /* a batch: its samples one after another */
    for (int64_t f = 0; f < F; f++)
        for (int64_t h = 0; h < Hp; h++)
            for (int64_t w = 0; w < Wp; w++) {
                const float *src = (const float *)a->src + b * per;
                float *tok = (float *)a->dst + b * per + ((f * Hp + h) * Wp + w) * 4 * C;
                for (int64_t c = 0; c < C; c++)
                    for (int64_t ph = 0; ph < 2; ph++)
                        for (int64_t pw = 0; pw < 2; pw++)
                            tok[c * 4 + ph * 2 + pw] =
                                src[((c * F + f) * H + 2 * h + ph) * W + 2 * w + pw];
            }
    return 0;
}

/* Cannot fail. */
static int unpatchify_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_patch_args_t *a = args;
    int64_t C = a->C, F = a->F, H = a->H, W = a->W, Hp = H / 2, Wp = W / 2, per = C * F * H * W;
    for (int64_t b = 0; b < (a->batch > 1 ? a->batch : 1); b++) /* a batch: its samples one after another */
    for (int64_t f = 0; f < F; f++)
        for (int64_t h = 0; h < Hp; h++)
            for (int64_t w = 0; w < Wp; w++) {
                float *dst = (float *)a->dst + b * per;
                const float *tok = (const float *)a->src + b * per + ((f * Hp + h) * Wp + w) * 4 * C;
                for (int64_t ph = 0; ph < 2; ph++)
                    for (int64_t pw = 0; pw < 2; pw++)
                        for (int64_t c = 0; c < C; c++)
                            dst[((c * F + f) * H + 2 * h + ph) * W + 2 * w + pw] =
                                tok[(ph * 2 + pw) * C + c];
            }
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_PATCHIFY, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "patchify_cpu", .fn = patchify_f32,
      .args_size = sizeof(kern_patch_args_t), .capturable = true },
    { .op = KERN_OP_UNPATCHIFY, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "unpatchify_cpu", .fn = unpatchify_f32,
      .args_size = sizeof(kern_patch_args_t), .capturable = true },
};

size_t kern_cpu_patch_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
