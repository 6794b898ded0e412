/* cpu_arith.h -- the arithmetic that a CPU kernel and its fused twin must
 * share bit for bit: LayerNorm and RMSNorm row statistics, and the 3-D
 * RoPE table and rotation (GELU-tanh, SiLU and softmax are cpu_vmath.h's).
 *
 * The fused CPU kernels (ops_fused.c) promise results identical to the
 * unfused sequence (ops.h); writing each expression once, here, and calling
 * it from both is what keeps that promise when either changes. Every
 * function is a pure computation on floats and doubles: none can fail.
 * Only kernels/cpu/ includes this. */
#ifndef REEL_KERNELS_CPU_ARITH_H
#define REEL_KERNELS_CPU_ARITH_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "cpu_vmath.h"

/* adaLN modulation of one value: x·(1 + scale) + shift, in float. */
static inline float cpu_modulate_value(float x, float shift, float scale) {
    return x * (1.0f + scale) + shift;
}

/* Row statistics in float, as upstream Wan2.1 takes them (its LayerNorm
 * and RMSNorm run on float32 tensors): Σ x[i] and Σ (x[i] − m)² over the
 * whole vectors of x into four 16-lane accumulators (vector v into v mod
 * 4), reduced as ((a0 + a1) + (a2 + a3)) and then a fixed tree over the
 * lanes, then the tail in order. The order depends on D alone, so a row's
 * statistics are the same bits wherever the row is, on any ISA
 * (cpu_vmath.h). These sums were in double before (and each output in
 * double, rounded once): float moves outputs by a few ulps, more for a
 * row on an offset far above its spread (the mean's own rounding, as in
 * float32 PyTorch), inside every tolerance of the tests and the numpy
 * cross-check, and took a third off the row kernels' time (docs/BENCH.md,
 * "Statistics in float"). */

/* The sum of a 16-float vector's lanes l + (l + 8), given as b: lane l plus
 * lane l + w, for w = 4, 2, 1. */
CPU_VINLINE float cpu_vsum_h(cpu_vh b) {
    typedef float v4 __attribute__((vector_size(16)));
    typedef float v2 __attribute__((vector_size(8)));
    v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
    v2 d = __builtin_shufflevector(c, c, 0, 1) + __builtin_shufflevector(c, c, 2, 3);
    return d[0] + d[1];
}

/* One 16-float chunk's term of cpu_row_sum_f, as its two halves: c, or
 * (c − m)². */
CPU_VINLINE void cpu_row_term(const float *x, float m, const bool sq, cpu_vh *lo, cpu_vh *hi) {
    cpu_vh c0 = cpu_vhload(x), c1 = cpu_vhload(x + CPU_VW / 2);
    if (sq) {
        c0 = c0 - m, c1 = c1 - m;
        c0 = c0 * c0, c1 = c1 * c1;
    }
    *lo += c0, *hi += c1;
}

/* Σ (x[i] − m)² (sq) or Σ x[i] (m must then be 0): 16-float chunk v into
 * accumulator v mod 4, then (a0 + a1) + (a2 + a3), its lanes l + (l + 8),
 * then cpu_vsum_h's tree, then the tail in order. The accumulators are named half
 * vectors, four chunks a turn: indexed by v mod 4 they lived in memory
 * (1.3-2.5x slower on AVX-512, 4.8x on AVX2). */
CPU_VINLINE float cpu_row_sum_f(const float *x, int64_t D, float m, const bool sq) {
    cpu_vh a0 = { 0 }, b0 = { 0 }, a1 = { 0 }, b1 = { 0 }, a2 = { 0 }, b2 = { 0 }, a3 = { 0 }, b3 = { 0 };
    int64_t i = 0;
    for (; i + 4 * CPU_VW <= D; i += 4 * CPU_VW) {
        cpu_row_term(x + i, m, sq, &a0, &b0);
        cpu_row_term(x + i + CPU_VW, m, sq, &a1, &b1);
        cpu_row_term(x + i + 2 * CPU_VW, m, sq, &a2, &b2);
        cpu_row_term(x + i + 3 * CPU_VW, m, sq, &a3, &b3);
    }
    if (i + CPU_VW <= D) cpu_row_term(x + i, m, sq, &a0, &b0), i += CPU_VW;
    if (i + CPU_VW <= D) cpu_row_term(x + i, m, sq, &a1, &b1), i += CPU_VW;
    if (i + CPU_VW <= D) cpu_row_term(x + i, m, sq, &a2, &b2), i += CPU_VW;
    float s = cpu_vsum_h(((a0 + a1) + (a2 + a3)) + ((b0 + b1) + (b2 + b3)));
    for (; i < D; i++) {
        float c = x[i];
        if (sq) {
            c = c - m;
            c = c * c;
        }
        s += c;
    }
    return s;
}

/* Rows whose statistics a row kernel takes before it writes any of their
 * outputs. A row's statistics are a chain of dependent sums, a square
 * root and a division; for short rows (tiny's 64) that chain, not the
 * arithmetic, was the row's time. The chains of a chunk's rows are
 * independent, so the core runs them side by side. Each row's arithmetic
 * is unchanged: no result depends on the chunk. */
#define CPU_STAT_ROWS 16

/* Mean and 1/√(var + eps) of each row x + i·D, i < n <= CPU_STAT_ROWS, D
 * >= 1: the mean, then the variance by a second pass over x − mean (no
 * cancellation), in float. Taken phase by phase over the rows (every sum,
 * every mean, every centred sum, every 1/√), so that the rows' dependent
 * chains run side by side; each row's operations are its own alone. */
CPU_VINLINE void cpu_layernorm_stats_rows(const float *x, int64_t n, int64_t D, float eps, float *mean,
                                          float *rstd) {
    float ss[CPU_STAT_ROWS];
    for (int64_t i = 0; i < n; i++) mean[i] = cpu_row_sum_f(x + i * D, D, 0.0f, false);
    for (int64_t i = 0; i < n; i++) mean[i] /= (float)D;
    for (int64_t i = 0; i < n; i++) ss[i] = cpu_row_sum_f(x + i * D, D, mean[i], true);
    for (int64_t i = 0; i < n; i++) rstd[i] = 1.0f / sqrtf(ss[i] / (float)D + eps);
}

/* One LayerNorm output without affine: (x − mean)·rstd. */
static inline float cpu_layernorm_value(float x, float mean, float rstd) { return (x - mean) * rstd; }

/* A row's LayerNorm outputs with affine, y[i] = ((x[i] − mean)·rstd)·w[i]
 * + b[i] (+ 0 without a bias), as two loops without a branch inside, so
 * that each vectorises. y may equal x. */
static inline void cpu_layernorm_affine_row(float *y, const float *x, int64_t D, float mean, float rstd,
                                            const float *w, const float *b) {
    if (b)
        for (int64_t i = 0; i < D; i++) y[i] = cpu_layernorm_value(x[i], mean, rstd) * w[i] + b[i];
    else
        for (int64_t i = 0; i < D; i++) y[i] = cpu_layernorm_value(x[i], mean, rstd) * w[i] + 0.0f;
}

/* x[0..D) += g[i]·y[i], or += y[i] without a gate, in float. */
static inline void cpu_residual_row(float *x, const float *y, const float *g, int64_t D) {
    if (g)
        for (int64_t i = 0; i < D; i++) x[i] += g[i] * y[i];
    else
        for (int64_t i = 0; i < D; i++) x[i] += y[i];
}

/* 1/√(mean(x²) + eps) of each row x + i·D, i < n <= CPU_STAT_ROWS, D >=
 * 1, in float, phase by phase (as cpu_layernorm_stats_rows). */
CPU_VINLINE void cpu_rms_scale_rows(const float *x, int64_t n, int64_t D, float eps, float *rrms) {
    float ss[CPU_STAT_ROWS];
    for (int64_t i = 0; i < n; i++) ss[i] = cpu_row_sum_f(x + i * D, D, 0.0f, true);
    for (int64_t i = 0; i < n; i++) rrms[i] = 1.0f / sqrtf(ss[i] / (float)D + eps);
}

/* One RMSNorm output: (x·rrms)·w, as upstream's norm then its weight. */
static inline float cpu_rms_value(float x, float rrms, float w) { return x * rrms * w; }

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

/* Fills the whole table at tab (cpu_rope_table_bytes of room): the frame
 * part, then the row part, then the column part. */
static inline void cpu_rope_fill_all(double *tab, int64_t head_dim, int64_t frames, int64_t rows,
                                     int64_t cols) {
    cpu_rope_split_t p = cpu_rope_split(head_dim);
    cpu_rope_fill(cpu_rope_fill(cpu_rope_fill(tab, frames, p.rf), rows, p.rr), cols, p.rc);
}

/* The three parts of the table, filled by cpu_rope_tables. */
typedef struct { const double *f, *r, *c; cpu_rope_split_t p; } cpu_rope_tables_t;

/* The parts of a filled table at tab. */
static inline cpu_rope_tables_t cpu_rope_parts(const double *tab, int64_t head_dim, int64_t frames,
                                               int64_t rows) {
    cpu_rope_tables_t t;
    t.p = cpu_rope_split(head_dim);
    t.f = tab;
    t.r = t.f + frames * (t.p.rf / 2) * 2;
    t.c = t.r + rows * (t.p.rr / 2) * 2;
    return t;
}

/* The table of a shape, computed once per process and kept (cpu_vec.c; at
 * most 40 tables in all, then NULL: the caller fills its scratch). The same
 * values cpu_rope_fill writes: a cached table changes no result. */
const double *cpu_rope_cached(int64_t head_dim, int64_t frames, int64_t rows, int64_t cols);

/* The table: the cached one, else filled at `scratch` (cpu_rope_table_bytes
 * of room). */
static inline cpu_rope_tables_t cpu_rope_tables(void *scratch, int64_t head_dim, int64_t frames,
                                                int64_t rows, int64_t cols) {
    const double *tab = cpu_rope_cached(head_dim, frames, rows, cols);
    if (!tab) {
        cpu_rope_fill_all(scratch, head_dim, frames, rows, cols);
        tab = scratch;
    }
    return cpu_rope_parts(tab, head_dim, frames, rows);
}

/* The timestep embedding's frequency ω_j = 10000^(−j/h), in double. */
static inline double cpu_freq(int64_t j, int64_t h) { return pow(10000.0, -(double)j / (double)h); }

/* ω_0 .. ω_(h−1), computed once per process for each h (cpu_vec.c; at
 * most 40 tables in all, then NULL: the caller computes them). The same values
 * as cpu_freq: a cached table changes no result. */
const double *cpu_freq_cached(int64_t h);

/* x, opaque to the optimiser: a product passed through it is rounded
 * where it stands. GCC 12 ignores -ffp-contract=off in one place, its
 * vectoriser's add-sub pattern: a pair's u·c − w·s and u·s + w·c became
 * one fused multiply-add-subtract (vfmaddsub, the first product never
 * rounded) in the AVX2 and AVX-512 builds of the fused RMSNorm + RoPE,
 * so they differed from the baseline build and from ROPE3D wherever a
 * near-cancellation made that rounding show in the float result. */
static inline double cpu_opaque(double x) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
    __asm__("" : "+w"(x));
#endif
    return x;
}

/* Rotates the pair (u, w) by (c, s) in double: each product rounded to
 * double, then their difference or sum rounded to double, then to float. */
static inline void cpu_rope_turn(float u, float w, double c, double s, float *o0, float *o1) {
    double du = u, dw = w;
    *o0 = (float)(cpu_opaque(du * c) - cpu_opaque(dw * s));
    *o1 = (float)(cpu_opaque(du * s) + cpu_opaque(dw * c));
}

#endif
