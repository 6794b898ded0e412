/* ops_softmax.c -- SOFTMAX on the CPU: p = softmax(scale·s) per row, the
 * fused scale + softmax step of the decomposed attention (ops_args.h).
 *
 * Per row (cpu_softmax_row, cpu_vmath.h): x_j = scale·s_j, m = max x_j
 * (subtracted first, so no exponential overflows), e_j = e^(x_j − m)
 * summed in double, p_j = e_j·(1/Σ) rounded once to float. The same
 * arithmetic as the fused CPU attention kernel's softmax, with the scale
 * applied here instead of in the score GEMM. p may equal s: each element
 * is read before it is written. */
#include "../ops_args.h"
#include "base/error.h"
#include "cpu_vmath.h"

/* Fails (nothing written) on an empty row or a row stride shorter than n. */
static int softmax_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_softmax_args_t *a = args;
    if (a->rows <= 0) return 0;
    if (a->n < 1 || a->lds < a->n || a->ldp < a->n)
        return reel_fail(REEL_E_INVALID, "softmax_cpu: n=%lld lds=%lld ldp=%lld: need n >= 1 and strides >= n",
                         (long long)a->n, (long long)a->lds, (long long)a->ldp);
    cpu_vec_softmax_rows(a->p, a->ldp, a->s, a->lds, a->rows, a->n, a->scale);
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_SOFTMAX, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "softmax_cpu", .fn = softmax_f32, .args_size = sizeof(kern_softmax_args_t),
      .workspace_bytes = NULL, .capturable = true },
};

size_t kern_cpu_softmax_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
