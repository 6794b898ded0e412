/* cpu_vec.c -- the out-of-line, runtime-dispatched faces of cpu_vmath.h:
 * each is compiled for AVX-512, AVX2 and baseline x86-64 (CPU_VEC_DISPATCH)
 * and computes the same bits on all three (cpu_vmath.h says why). The CPU
 * kernels call these; none can fail. */
#include "cpu_vmath.h"

CPU_VEC_DISPATCH void cpu_vec_gelu_tanh(float *y, const float *x, int64_t n) { cpu_gelu_tanh_n(y, x, n); }

CPU_VEC_DISPATCH void cpu_vec_silu(float *y, const float *x, int64_t n) { cpu_silu_n(y, x, n); }

CPU_VEC_DISPATCH void cpu_vec_exp(float *y, const float *x, int64_t n) { cpu_exp_n(y, x, n); }

CPU_VEC_DISPATCH void cpu_vec_softmax_rows(float *p, int64_t ldp, const float *s, int64_t lds,
                                           int64_t rows, int64_t n, float scale) {
    for (int64_t r = 0; r < rows; r++) cpu_softmax_row(p + r * ldp, s + r * lds, n, scale);
}
