/* ops_video_args.h -- the argument blocks of the video ops (ops_video.h),
 * shared by their validating wrappers (ops_video.c), the CPU kernels
 * (cpu/ops_video.c) and the CUDA kernels (cuda/im2col3d.cu,
 * cuda/upsample2x.cu, cuda/frame_interleave.cu).
 *
 * Activations are channels-last: a clip of T frames of H x W pixels and C
 * channels is [T, H, W, C], row-major, so a pixel's channels are one row.
 * Blocks hold resolved pointers and sizes only, as ops_args.h's do. */
#ifndef REEL_KERNELS_OPS_VIDEO_ARGS_H
#define REEL_KERNELS_OPS_VIDEO_ARGS_H

#include <stdint.h>
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* IM2COL3D: the columns of a causal, spatially 'same' 3-D convolution of
 * stride 1. The input clip is, in time, Z = kt−1−P zero frames, then the
 * P frames of prev (may be NULL when P is 0), then the T frames of x,
 * all [.., H, W, C]; spatially it is zero-padded by kh/2 rows and kw/2
 * columns each side (kh, kw odd). Output position r of the [T, H, W]
 * grid (t, y, x) has the column vector, in (dt, dy, dx, c) order,
 *   cols[r − row0, ((dt·kh + dy)·kw + dx)·C + c]
 *     = in[t + dt, y + dy − kh/2, x + dx − kw/2, c]   (0 outside),
 * for the rows row0 ≤ r < row0 + rows. cols aliases neither input. */
typedef struct {
    kern_args_hdr_t hdr;
    const void *prev, *x;
    void *cols;
    int64_t P, T, H, W, C;
    int64_t kt, kh, kw;
    int64_t row0, rows;
} kern_im2col3d_args_t;

/* UPSAMPLE2X: y[t, Y, X, c] = x[t, Y/2, X/2, c] over y [T, 2H, 2W, C]
 * (nearest; for a factor of 2 'nearest-exact' picks the same pixels).
 * FRAME_INTERLEAVE: x [T, H, W, 2C] -> y [2T, H, W, C] with
 * y[2t + k, h, w, c] = x[t, h, w, k·C + c], k in {0, 1}: the frame
 * doubling of Wan's upsample3d time conv. y aliases x in neither. */
typedef struct {
    kern_args_hdr_t hdr;
    const void *x;
    void *y;
    int64_t T, H, W, C;
} kern_video_args_t;

#ifdef __cplusplus
}
#endif
#endif
