/* ops_video.c -- the CPU kernels of the video ops (kernels/ops_video.h):
 * IM2COL3D, UPSAMPLE2X and FRAME_INTERLEAVE, F32. They only move floats
 * (zeros where the convolution pads), so each is exact. */
#include "../ops_video_args.h"
#include <string.h>

/* One output row of the columns per (t, y, x): for every tap (dt, dy, dx)
 * a run of C channels copied from the input pixel, or zeros. Cannot fail. */
static int im2col3d_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_im2col3d_args_t *a = args;
    const int64_t H = a->H, W = a->W, C = a->C, HW = H * W;
    const int64_t Z = a->kt - 1 - a->P, ph = a->kh / 2, pw = a->kw / 2;
    const int64_t K = a->kt * a->kh * a->kw * C;
    const size_t run = (size_t)C * sizeof(float);
    for (int64_t i = 0; i < a->rows; i++) {
        int64_t r = a->row0 + i, t = r / HW, y = (r % HW) / W, x = r % W;
        float *out = (float *)a->cols + i * K;
        for (int64_t dt = 0; dt < a->kt; dt++) {
            int64_t lt = t + dt; /* frame of the padded clip */
            const float *frame = lt < Z ? NULL
                               : lt < Z + a->P ? (const float *)a->prev + (lt - Z) * HW * C
                               : (const float *)a->x + (lt - Z - a->P) * HW * C;
            for (int64_t dy = 0; dy < a->kh; dy++) {
                int64_t sy = y + dy - ph;
                for (int64_t dx = 0; dx < a->kw; dx++, out += C) {
                    int64_t sx = x + dx - pw;
                    if (!frame || sy < 0 || sy >= H || sx < 0 || sx >= W) memset(out, 0, run);
                    else memcpy(out, frame + (sy * W + sx) * C, run);
                }
            }
        }
    }
    return 0;
}

/* Cannot fail. */
static int upsample2x_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_video_args_t *a = args;
    const int64_t C = a->C, H = a->H, W = a->W;
    const size_t run = (size_t)C * sizeof(float);
    for (int64_t t = 0; t < a->T; t++)
        for (int64_t Y = 0; Y < 2 * H; Y++) {
            const float *src = (const float *)a->x + ((t * H + Y / 2) * W) * C;
            float *dst = (float *)a->y + ((t * 2 * H + Y) * 2 * W) * C;
            for (int64_t X = 0; X < 2 * W; X++) memcpy(dst + X * C, src + (X / 2) * C, run);
        }
    return 0;
}

/* Cannot fail. */
static int frame_interleave_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_video_args_t *a = args;
    const int64_t C = a->C, HW = a->H * a->W;
    const size_t run = (size_t)C * sizeof(float);
    for (int64_t t = 0; t < a->T; t++)
        for (int64_t k = 0; k < 2; k++)
            for (int64_t p = 0; p < HW; p++)
                memcpy((float *)a->y + ((2 * t + k) * HW + p) * C,
                       (const float *)a->x + (t * HW + p) * 2 * C + k * C, run);
    return 0;
}

/* This file's kernels, in registration order. */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_IM2COL3D, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "im2col3d_cpu", .fn = im2col3d_f32,
      .args_size = sizeof(kern_im2col3d_args_t), .capturable = true },
    { .op = KERN_OP_UPSAMPLE2X, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "upsample2x_cpu", .fn = upsample2x_f32,
      .args_size = sizeof(kern_video_args_t), .capturable = true },
    { .op = KERN_OP_FRAME_INTERLEAVE, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "frame_interleave_cpu", .fn = frame_interleave_f32,
      .args_size = sizeof(kern_video_args_t), .capturable = true },
};

size_t kern_cpu_video_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
