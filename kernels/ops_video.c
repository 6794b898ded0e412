/* ops_video.c -- validating wrappers of the video ops (see ops_video.h):
 * check every tensor, fill the argument block, dispatch; and the causal
 * 3-D convolution, written once over IM2COL3D and GEMM. */
#include "ops_video.h"
#include "ops_video_args.h"
#include "ops_check.h"
#include "ops.h"
#include "base/error.h"
#include <string.h>

/* kernel sizes: kt >= 1, kh and kw odd and >= 1. */
static int check_kernel(const char *op, int64_t kt, int64_t kh, int64_t kw) {
    if (kt < 1 || kh < 1 || kw < 1 || !(kh & 1) || !(kw & 1) || kt > 64 || kh > 64 || kw > 64)
        return reel_fail(REEL_E_INVALID, "%s: kernel %lldx%lldx%lld: need kt >= 1 and odd kh, kw (at most 64)",
                         op, (long long)kt, (long long)kh, (long long)kw);
    return 0;
}

/* x [T,H,W,C] and prev [P,H,W,C] with P <= kt-1: the shared checks of
 * IM2COL3D and the convolution. */
static int check_clip(kern_stream_t *s, const char *op, const kern_tensor_t *prev,
                      const kern_tensor_t *x, int64_t kt) {
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (kern_op_check(s, op, "x", x, dt, 4) || (prev && kern_op_check(s, op, "prev", prev, dt, 4))) return -1;
    for (int i = 0; i < 4; i++)
        if (x->shape[i] < 1) return kern_op_shape_fail(op, "x", x, "[T, H, W, C] with every dim >= 1");
    if (prev && (prev->shape[0] > kt - 1 || prev->shape[1] != x->shape[1] ||
                 prev->shape[2] != x->shape[2] || prev->shape[3] != x->shape[3]))
        return kern_op_shape_fail(op, "prev", prev, "[P <= kt-1, H, W, C] of x's H, W, C");
    return 0;
}

int kern_im2col3d(kern_stream_t *s, const kern_tensor_t *prev, const kern_tensor_t *x,
                  int64_t kt, int64_t kh, int64_t kw, int64_t row0, kern_tensor_t *cols) {
    const char *op = "im2col3d";
    if (check_kernel(op, kt, kh, kw) || check_clip(s, op, prev, x, kt) ||
        kern_op_check(s, op, "cols", cols, x->dtype, 2))
        return -1;
    int64_t T = x->shape[0], H = x->shape[1], W = x->shape[2], C = x->shape[3];
    if (cols->shape[1] != kt * kh * kw * C) return kern_op_shape_fail(op, "cols", cols, "[rows, kt*kh*kw*C]");
    int64_t rows = cols->shape[0];
    if (row0 < 0 || rows < 0 || row0 + rows > T * H * W)
        return reel_fail(REEL_E_INVALID, "%s: rows %lld..%lld outside the %lld output rows", op,
                         (long long)row0, (long long)(row0 + rows), (long long)(T * H * W));
    kern_im2col3d_args_t a = { .prev = prev && prev->shape[0] ? kern_tensor_ptr(prev) : NULL,
                               .x = kern_tensor_ptr(x), .cols = kern_tensor_ptr(cols),
                               .P = prev ? prev->shape[0] : 0, .T = T, .H = H, .W = W, .C = C,
                               .kt = kt, .kh = kh, .kw = kw, .row0 = row0, .rows = rows };
    if (rows == 0) return 0;
    return kern_dispatch(s, KERN_OP_IM2COL3D, x->dtype, &a);
}

/* A contiguous 2-D view [rows, cols] of t's elements from element first. */
static kern_tensor_t view2(const kern_tensor_t *t, int64_t first, int64_t rows, int64_t cols) {
    int64_t shape[2] = { rows, cols };
    kern_tensor_t v = kern_tensor_make(t->data, t->dtype, t->device, 2, shape);
    v.offset = t->offset + (size_t)first * kern_dtype_size(t->dtype);
    return v;
}

int kern_conv3d_causal(kern_stream_t *s, const kern_tensor_t *prev, const kern_tensor_t *x,
                       const kern_tensor_t *w, const kern_tensor_t *bias, int64_t kt, int64_t kh,
                       int64_t kw, kern_tensor_t *cols, kern_tensor_t *y) {
    const char *op = "conv3d_causal";
    if (check_kernel(op, kt, kh, kw) || check_clip(s, op, prev, x, kt)) return -1;
    kern_dtype_t dt = x->dtype;
    if (kern_op_check(s, op, "w", w, dt, 2) || kern_op_check(s, op, "y", y, dt, 4) ||
        (bias && kern_op_check(s, op, "bias", bias, dt, -1)))
        return -1;
    int64_t T = x->shape[0], H = x->shape[1], W = x->shape[2], C = x->shape[3];
    int64_t K = kt * kh * kw * C, N = w->shape[0], M = T * H * W;
    if (w->shape[1] != K) return kern_op_shape_fail(op, "w", w, "[Cout, kt*kh*kw*Cin]");
    if (y->shape[0] != T || y->shape[1] != H || y->shape[2] != W || y->shape[3] != N)
        return kern_op_shape_fail(op, "y", y, "[T, H, W, Cout] of x's T, H, W and w's Cout");
    if (kt * kh * kw == 1) { /* no neighbours: the conv is x · wᵀ */
        kern_tensor_t xv = view2(x, 0, M, C), yv = view2(y, 0, M, N);
        return kern_gemm(s, &xv, w, bias, &yv);
    }
    if (kern_op_check(s, op, "cols", cols, dt, 2)) return -1;
    if (cols->shape[1] != K || cols->shape[0] < 1) return kern_op_shape_fail(op, "cols", cols, "[R >= 1, kt*kh*kw*Cin]");
    int64_t R = cols->shape[0];
    for (int64_t r0 = 0; r0 < M; r0 += R) {
        int64_t n = M - r0 < R ? M - r0 : R;
        kern_tensor_t cv = view2(cols, 0, n, K), yv = view2(y, r0 * N, n, N);
        if (kern_im2col3d(s, prev, x, kt, kh, kw, r0, &cv) || kern_gemm(s, &cv, w, bias, &yv)) return -1;
    }
    return 0;
}

/* UPSAMPLE2X and FRAME_INTERLEAVE: both read x [T,H,W,C'] and write y. */
int kern_upsample2x(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y) {
    const char *op = "upsample2x";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (kern_op_check(s, op, "x", x, dt, 4) || kern_op_check(s, op, "y", y, dt, 4)) return -1;
    if (y->shape[0] != x->shape[0] || y->shape[1] != 2 * x->shape[1] || y->shape[2] != 2 * x->shape[2] ||
        y->shape[3] != x->shape[3])
        return kern_op_shape_fail(op, "y", y, "[T, 2H, 2W, C] of x [T, H, W, C]");
    kern_video_args_t a = { .x = kern_tensor_ptr(x), .y = kern_tensor_ptr(y), .T = x->shape[0],
                            .H = x->shape[1], .W = x->shape[2], .C = x->shape[3] };
    if (kern_tensor_numel(x) == 0) return 0;
    return kern_dispatch(s, KERN_OP_UPSAMPLE2X, dt, &a);
}

int kern_frame_interleave(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y) {
    const char *op = "frame_interleave";
    kern_dtype_t dt = x ? x->dtype : KERN_F32;
    if (kern_op_check(s, op, "x", x, dt, 4) || kern_op_check(s, op, "y", y, dt, 4)) return -1;
    if (x->shape[3] % 2) return kern_op_shape_fail(op, "x", x, "[T, H, W, 2C]");
    if (y->shape[0] != 2 * x->shape[0] || y->shape[1] != x->shape[1] || y->shape[2] != x->shape[2] ||
        y->shape[3] * 2 != x->shape[3])
        return kern_op_shape_fail(op, "y", y, "[2T, H, W, C] of x [T, H, W, 2C]");
    kern_video_args_t a = { .x = kern_tensor_ptr(x), .y = kern_tensor_ptr(y), .T = x->shape[0],
                            .H = x->shape[1], .W = x->shape[2], .C = y->shape[3] };
    if (kern_tensor_numel(x) == 0) return 0;
    return kern_dispatch(s, KERN_OP_FRAME_INTERLEAVE, dt, &a);
}
