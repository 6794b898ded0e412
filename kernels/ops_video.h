/* ops_video.h -- the ops of the video VAE decoder (model/vae.h), validated
 * and dispatched like those of ops.h (same checks, same messages, same
 * launch rules).
 *
 * Layout: channels-last. A clip of T frames, H x W pixels, C channels is a
 * contiguous [T, H, W, C] tensor (4-D), so a convolution is an im2col
 * followed by one GEMM against weights stored [Cout, kt·kh·kw·Cin] in
 * (dt, dy, dx, c) order, and a norm over channels is a row norm. F32 on
 * every backend (BF16 too on CUDA, for the data-movement ops). */
#ifndef REEL_KERNELS_OPS_VIDEO_H
#define REEL_KERNELS_OPS_VIDEO_H

#include "backend.h"
#include "base/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The im2col of a causal 3-D convolution (kernels/ops_video_args.h,
 * kern_im2col3d_args_t, says exactly what it writes): x [T, H, W, C], prev
 * [P, H, W, C] with P <= kt−1 (NULL: P = 0), kt >= 1 and kh, kw odd;
 * cols [rows, kt·kh·kw·C] receives the output rows row0 .. row0+rows−1 of
 * the [T, H, W] grid (row0 + rows <= T·H·W). -1 with a message naming the
 * op and the tensor on anything else. */
int kern_im2col3d(kern_stream_t *s, const kern_tensor_t *prev, const kern_tensor_t *x,
                  int64_t kt, int64_t kh, int64_t kw, int64_t row0, kern_tensor_t *cols);

/* y [T, H, W, Cout] = the causal 3-D convolution of x [T, H, W, Cin]
 * (stride 1, 'same' in space, causal in time: the kt−1 frames before x
 * are prev's P frames, preceded by kt−1−P zero frames) with w [Cout,
 * kt·kh·kw·Cin] ((dt, dy, dx, c) order) and bias [Cout] (may be NULL).
 * Written once here over two ops: IM2COL3D into cols, then GEMM, in blocks
 * of cols' rows (cols: F32 [R, kt·kh·kw·Cin], any R >= 1, the caller's
 * scratch: its size bounds the memory whatever the clip). A 1x1x1 kernel
 * is one GEMM on x itself (cols unused, may be NULL). y aliases nothing.
 * -1 with a message on a bad tensor; y may be partly written when a block
 * fails. */
int kern_conv3d_causal(kern_stream_t *s, const kern_tensor_t *prev, const kern_tensor_t *x,
                       const kern_tensor_t *w, const kern_tensor_t *bias, int64_t kt, int64_t kh,
                       int64_t kw, kern_tensor_t *cols, kern_tensor_t *y);

/* y [T, 2H, 2W, C] = nearest 2x upsampling in space of x [T, H, W, C]. */
int kern_upsample2x(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y);

/* y [2T, H, W, C] from x [T, H, W, 2C]: frame 2t+k of y is channel half k
 * of frame t of x (Wan's upsample3d: a time conv to 2C channels, then
 * reshape (2, C) and stack the halves along time). */
int kern_frame_interleave(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y);

#ifdef __cplusplus
}
#endif
#endif
