/* cpu_arith.h -- the arithmetic that a CPU kernel and its fused twin must
 * share bit for bit: GELU-tanh, LayerNorm and RMSNorm row statistics, and
 * the 3-D RoPE table and rotation.
 *
 * The fused CPU kernels (ops_fused.c) promise results identical to the
 * unfused sequence (ops.h); writing each expression once, here, and calling
 * it from both is what keeps that promise when either changes. Every
 * function is a pure computation on floats and doubles: none can fail.
 * Only kernels/cpu/ includes this. */
#ifndef REEL_KERNELS_CPU_ARITH_H
#define REEL_KERNELS_CPU_ARITH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³))), in float. */
static inline float cpu_gelu_tanh(float u) {
    const float k = 0.7978845608028654f; /* √(2/π) */
    return 0.5f * u * (1.0f + tanhf(k * (u + 0.044715f * u * u * u)));
}

/* adaLN modulation of one value: x·(1 + scale) + shift, in float. */
static inline float cpu_modulate_value(float x, float shift, float scale) {
    return x * (1.0f + scale) + shift;
}

/* Mean and 1/√(var + eps) of x[0..D), D >= 1, accumulated in double, the
 * variance by a second pass over x − mean (no cancellation). */
static inline void cpu_layernorm_stats(const float *x, int64_t D, float eps, double *mean,
                                       double *rstd) {
    double sum = 0.0;
    for (int64_t i = 0; i < D; i++) sum += x[i];
    const double m = sum / (double)D;
    double sq = 0.0;
    for (int64_t i = 0; i < D; i++) {
        double c = (double)x[i] - m;
        sq += c * c;
    }
    *mean = m;
    *rstd = 1.0 / sqrt(sq / (double)D + (double)eps);
}

/* One LayerNorm output without affine: (x − mean)·rstd in double, rounded
 * once to float. */
static inline float cpu_layernorm_value(float x, double mean, double rstd) {
    return (float)(((double)x - mean) * rstd);
}

/* One LayerNorm output with affine: (x − mean)·rstd·w + b in double
 * (b NULL: no bias), rounded once to float. */
static inline float cpu_layernorm_affine_value(float x, double mean, double rstd, float w, const float *b) {
    double v = ((double)x - mean) * rstd;
    v = v * (double)w + (b ? (double)*b : 0.0);
    return (float)v;
}

/* x[0..D) += g[i]·y[i], or += y[i] without a gate, in float. */
static inline void cpu_residual_row(float *x, const float *y, const float *g, int64_t D) {
    if (g)
        for (int64_t i = 0; i < D; i++) x[i] += g[i] * y[i];
    else
        for (int64_t i = 0; i < D; i++) x[i] += y[i];
}

/* 1/√(mean(x²) + eps) of x[0..D), D >= 1, accumulated in double. */
static inline double cpu_rms_scale(const float *x, int64_t D, float eps) {
    double sq = 0.0;
    for (int64_t i = 0; i < D; i++) sq += (double)x[i] * (double)x[i];
    return 1.0 / sqrt(sq / (double)D + (double)eps);
}

/* One RMSNorm output: x·rrms·w in double, rounded once to float. */
static inline float cpu_rms_value(float x, double rrms, float w) {
    return (float)((double)x * rrms * (double)w);
}

/* 3-D RoPE (TINYDIT.md): head width d splits into a frame part of d − 4q
 * real dims and a row and a column part of 2q each, q = ⌊d/6⌋. */
typedef struct { int64_t rf, rr, rc; } cpu_rope_split_t;

static inline cpu_rope_split_t cpu_rope_split(int64_t d) {
    int64_t q = d / 6;
    return (cpu_rope_split_t){ d - 4 * q, 2 * q, 2 * q };
}

/* Bytes of the (cos, sin) table of every (position, pair) of each part: the
 * scratch of the ROPE3D and RMSNORM_ROPE3D kernels. 0 for empty sizes. */
static inline size_t cpu_rope_table_bytes(int64_t head_dim, int64_t frames, int64_t rows,
                                          int64_t cols) {
    cpu_rope_split_t p = cpu_rope_split(head_dim);
    int64_t n = frames * (p.rf / 2) + rows * (p.rr / 2) + cols * (p.rc / 2);
    return n > 0 ? (size_t)n * 2 * sizeof(double) : 0;
}

/* Fills tab[pos·(r/2) + j] = (cos, sin)(pos·ω_j), ω_j = 10000^(−2j/r), for
 * pos < npos, in double; returns the end of the filled part. */
static inline double *cpu_rope_fill(double *tab, int64_t npos, int64_t r) {
    for (int64_t pos = 0; pos < npos; pos++)
        for (int64_t j = 0; j < r / 2; j++) {
            double th = (double)pos * pow(10000.0, -2.0 * (double)j / (double)r);
            *tab++ = cos(th);
            *tab++ = sin(th);
        }
    return tab;
}

/* The three parts of the table, filled by cpu_rope_tables. */
typedef struct { const double *f, *r, *c; cpu_rope_split_t p; } cpu_rope_tables_t;

/* Fills the table at `scratch` (cpu_rope_table_bytes of room). */
static inline cpu_rope_tables_t cpu_rope_tables(void *scratch, int64_t head_dim, int64_t frames,
                                                int64_t rows, int64_t cols) {
    cpu_rope_tables_t t;
    t.p = cpu_rope_split(head_dim);
    double *tf = scratch;
    double *tr = cpu_rope_fill(tf, frames, t.p.rf);
    double *tc = cpu_rope_fill(tr, rows, t.p.rr);
    cpu_rope_fill(tc, cols, t.p.rc);
    t.f = tf;
    t.r = tr;
    t.c = tc;
    return t;
}

/* Rotates the pair (u, w) by (c, s) in double, each result rounded once. */
static inline void cpu_rope_turn(float u, float w, double c, double s, float *o0, float *o1) {
    double du = u, dw = w;
    *o0 = (float)(du * c - dw * s);
    *o1 = (float)(du * s + dw * c);
}

#endif
