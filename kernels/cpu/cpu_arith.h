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
#include <stddef.h>
#include <stdint.h>
#include "cpu_vmath.h"

/* adaLN modulation of one value: x·(1 + scale) + shift, in float. */
static inline float cpu_modulate_value(float x, float shift, float scale) {
    return x * (1.0f + scale) + shift;
}

/* Row sums in double: 16 lanes (two vectors of 8 doubles) over the whole
 * vectors of x, reduced in a fixed order, then the tail in order. The
 * order depends on D alone, so a row's statistics are the same bits
 * wherever the row is, on any ISA (cpu_vmath.h). */
typedef float cpu_vh __attribute__((vector_size(CPU_VW * 2))); /* 8 floats */

CPU_VINLINE void cpu_vsplit_d(cpu_vf v, cpu_vd *lo, cpu_vd *hi) {
    cpu_vh l, h;
    memcpy(&l, &v, sizeof l);
    memcpy(&h, (const char *)&v + sizeof l, sizeof h);
    *lo = __builtin_convertvector(l, cpu_vd);
    *hi = __builtin_convertvector(h, cpu_vd);
}

/* Σ x[i]. */
CPU_VINLINE double cpu_row_sum(const float *x, int64_t D) {
    cpu_vd a0 = { 0 }, a1 = { 0 };
    int64_t i = 0;
    for (; i + CPU_VW <= D; i += CPU_VW) {
        cpu_vd lo, hi;
        cpu_vsplit_d(cpu_vload(x + i), &lo, &hi);
        a0 += lo;
        a1 += hi;
    }
    double s = cpu_vsum_d(a0, a1);
    for (; i < D; i++) s += x[i];
    return s;
}

/* Σ (x[i] − m)². */
CPU_VINLINE double cpu_row_sumsq_centered(const float *x, int64_t D, double m) {
    cpu_vd a0 = { 0 }, a1 = { 0 };
    const cpu_vd vm = { m, m, m, m, m, m, m, m };
    int64_t i = 0;
    for (; i + CPU_VW <= D; i += CPU_VW) {
        cpu_vd lo, hi;
        cpu_vsplit_d(cpu_vload(x + i), &lo, &hi);
        lo -= vm;
        hi -= vm;
        a0 += lo * lo;
        a1 += hi * hi;
    }
    double s = cpu_vsum_d(a0, a1);
    for (; i < D; i++) {
        double c = (double)x[i] - m;
        s += c * c;
    }
    return s;
}

/* Mean and 1/√(var + eps) of x[0..D), D >= 1, accumulated in double, the
 * variance by a second pass over x − mean (no cancellation). */
CPU_VINLINE void cpu_layernorm_stats(const float *x, int64_t D, float eps, double *mean, double *rstd) {
    const double m = cpu_row_sum(x, D) / (double)D;
    *mean = m;
    *rstd = 1.0 / sqrt(cpu_row_sumsq_centered(x, D, m) / (double)D + (double)eps);
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

/* A row's LayerNorm outputs with affine, y[i] =
 * cpu_layernorm_affine_value(x[i], mean, rstd, w[i], b ? &b[i] : NULL),
 * as two loops without a branch inside, so that each vectorises (the
 * conditional bias kept the one loop scalar). y may equal x. */
static inline void cpu_layernorm_affine_row(float *y, const float *x, int64_t D, double mean, double rstd,
                                            const float *w, const float *b) {
    if (b)
        for (int64_t i = 0; i < D; i++) {
            double v = ((double)x[i] - mean) * rstd;
            y[i] = (float)(v * (double)w[i] + (double)b[i]);
        }
    else
        for (int64_t i = 0; i < D; i++) {
            double v = ((double)x[i] - mean) * rstd;
            y[i] = (float)(v * (double)w[i] + 0.0);
        }
}

/* Rows whose statistics a row kernel takes before it writes any of their
 * outputs. A row's statistics are a chain of dependent sums, a square
 * root and a division; for short rows (tiny's 64) that chain, not the
 * arithmetic, was the row's time. The chains of a chunk's rows are
 * independent, so the core runs them side by side. Each row's arithmetic
 * is unchanged: no result depends on the chunk. */
#define CPU_STAT_ROWS 16

/* x[0..D) += g[i]·y[i], or += y[i] without a gate, in float. */
static inline void cpu_residual_row(float *x, const float *y, const float *g, int64_t D) {
    if (g)
        for (int64_t i = 0; i < D; i++) x[i] += g[i] * y[i];
    else
        for (int64_t i = 0; i < D; i++) x[i] += y[i];
}

/* 1/√(mean(x²) + eps) of x[0..D), D >= 1, accumulated in double. */
CPU_VINLINE double cpu_rms_scale(const float *x, int64_t D, float eps) {
    return 1.0 / sqrt(cpu_row_sumsq_centered(x, D, 0.0) / (double)D + (double)eps);
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

/* Rotates the pair (u, w) by (c, s) in double, each result rounded once. */
static inline void cpu_rope_turn(float u, float w, double c, double s, float *o0, float *o1) {
    double du = u, dw = w;
    *o0 = (float)(du * c - dw * s);
    *o1 = (float)(du * s + dw * c);
}

#endif
