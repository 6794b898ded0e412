/* cpu_attn.h -- the CPU attention kernel's plan and per-item arithmetic,
 * shared by the native kernel (ops_attention.c) and the CPU attention
 * artifact, which must give its bytes.
 *
 * Three ways, chosen by the sizes alone:
 * - up to CPU_ATTN_DIRECT_MAX (64) keys and head width: direct, no BLAS
 *   and no scratch. Per head, the keys are packed transposed and the
 *   values padded to whole vectors (on the stack), then per query row the
 *   scores are 16 keys at a time (Σ_c q_c·k_c in order of c, IEEE multiply
 *   then add, then ×scale), cpu_softmax_row, and o's row 16 columns at a
 *   time (Σ_j p_j·v_j in order of j); four rows go through each pass
 *   together (four independent sums), which changes no row's bits. For
 *   tiny's heads (16 wide, 32 or 5 keys) and every cross-attention over a
 *   short text, where a BLAS call per head costs more than the arithmetic.
 * - otherwise, below CPU_ATTN_FLASH_MIN (2^20) scores per head: whole
 *   rows. Per head, as many queries as fit CPU_ATTN_CAP bytes of scores
 *   make one block: one sgemm for the
 *   scores (scale folded in), cpu_softmax_row over each whole row, one
 *   sgemm straight into o's head slice. Up to CPU_ATTN_LANES blocks at once.
 * - from 2^20 on: flash-style, one pass. A (head, block of CPU_ATTN_FLASH_BQ
 *   queries) item walks the keys in blocks of CPU_ATTN_FLASH_BK: the
 *   block's scores by one sgemm, then per row a running max m and sum l
 *   (in double): m' = max(m, max of the block), c = e^(m − m'), the
 *   block's weights e^(s − m'), l' = c·l + Σ weights; o's row is scaled by
 *   c and the block's weights·V added by a second sgemm (β = 1), and after
 *   the last block o's row is scaled by (float)(1/l). No score matrix
 *   beyond one BQ × BK block per lane (128 × 256 floats, 128 KiB),
 *   whatever the sequence: Wan's 32,760-token self-attention takes 64
 *   lanes · 130 KiB = 8.1 MiB of scratch, where the decomposition took
 *   16 MiB blocks of whole rows. The block sizes were measured on a
 *   2-core AVX-512 machine (bench_kernels' attn-long lines): 128 × 256 and
 *   256 × 256 ran 1.2-1.35x the decomposition at Wan's head, 32 × 256 and
 *   64 × 128 no faster than it.
 * Blocks, lanes and the order of every sum are functions of the sizes, so
 * the result is the same on any number of threads and in any replay. */
#ifndef REEL_KERNELS_CPU_ATTN_H
#define REEL_KERNELS_CPU_ATTN_H

#include "cpu_vmath.h"
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define CPU_ATTN_DIRECT_MAX 64                    /* keys and head width the direct way takes */
#define CPU_ATTN_DIRECT_ROWS 128                  /* query rows per direct item */
#define CPU_ATTN_LANES 8                          /* whole-row blocks in flight at once, at most */
#define CPU_ATTN_CAP ((int64_t)2 << 20)           /* bytes of scores per whole-row block */
#define CPU_ATTN_FLASH_MIN ((int64_t)1 << 20)     /* scores per head from which items go flash */
#define CPU_ATTN_FLASH_BQ 128                     /* queries per flash item */
#define CPU_ATTN_FLASH_BK 256                     /* keys per flash block */
#define CPU_ATTN_FLASH_LANES 64                   /* flash items in flight at once, at most */
/* One flash lane's scratch: scores [BQ × BK], m [BQ], c [BQ] (floats), l [BQ] (doubles). */
#define CPU_ATTN_FLASH_LANE_BYTES \
    ((size_t)CPU_ATTN_FLASH_BQ * CPU_ATTN_FLASH_BK * 4 + (size_t)CPU_ATTN_FLASH_BQ * 16)

/* Whether attention with nk keys of head width d runs direct. */
static inline bool cpu_attn_direct(int64_t nk, int64_t d) {
    return nk >= 1 && nk <= CPU_ATTN_DIRECT_MAX && d >= 1 && d <= CPU_ATTN_DIRECT_MAX;
}

/* Whether attention of these sizes runs flash-style: nq·nk >= 2^20,
 * without forming the product (and not direct: see cpu_attn_way). */
static inline bool cpu_attn_flash(int64_t nq, int64_t nk) {
    return nq > 0 && nk > 0 && nq >= (CPU_ATTN_FLASH_MIN + nk - 1) / nk;
}

typedef enum { CPU_ATTN_DIRECT, CPU_ATTN_ROWS, CPU_ATTN_FLASH } cpu_attn_way_t;

static inline cpu_attn_way_t cpu_attn_way(int64_t nq, int64_t nk, int64_t d) {
    return cpu_attn_direct(nk, d) ? CPU_ATTN_DIRECT : cpu_attn_flash(nq, nk) ? CPU_ATTN_FLASH : CPU_ATTN_ROWS;
}

/* Whole rows: query rows per block (all of them when the scores fit). */
static inline int64_t cpu_attn_block_rows(int64_t nq, int64_t nk) {
    if (nq <= 0 || nk <= 0) return 0;
    int64_t rows = CPU_ATTN_CAP / (nk * (int64_t)sizeof(float));
    if (rows < 1) rows = 1;
    return rows < nq ? rows : nq;
}

/* Query rows per item of the way these sizes take. */
static inline int64_t cpu_attn_item_rows(int64_t nq, int64_t nk, int64_t d) {
    switch (cpu_attn_way(nq, nk, d)) {
    case CPU_ATTN_DIRECT: return CPU_ATTN_DIRECT_ROWS;
    case CPU_ATTN_FLASH: return CPU_ATTN_FLASH_BQ;
    default: return cpu_attn_block_rows(nq, nk);
    }
}

/* Items (head, query block) of the way these sizes take. */
static inline int64_t cpu_attn_items(int64_t nq, int64_t nk, int64_t heads, int64_t d) {
    if (nq <= 0 || nk <= 0 || heads <= 0) return 0;
    int64_t rows = cpu_attn_item_rows(nq, nk, d);
    return heads * ((nq + rows - 1) / rows);
}

/* Lanes: each works through every lanes-th item with its own scratch
 * (direct: no scratch, a lane per item). */
static inline int64_t cpu_attn_lanes(int64_t nq, int64_t nk, int64_t heads, int64_t d) {
    int64_t items = cpu_attn_items(nq, nk, heads, d);
    cpu_attn_way_t w = cpu_attn_way(nq, nk, d);
    if (w == CPU_ATTN_DIRECT) return items;
    int64_t cap = w == CPU_ATTN_FLASH ? CPU_ATTN_FLASH_LANES : CPU_ATTN_LANES;
    return items < cap ? items : cap;
}

/* Bytes of scratch the kernel needs for these sizes. */
static inline size_t cpu_attn_workspace(int64_t nq, int64_t nk, int64_t heads, int64_t d) {
    switch (cpu_attn_way(nq, nk, d)) {
    case CPU_ATTN_DIRECT: return 0;
    case CPU_ATTN_FLASH: return (size_t)cpu_attn_lanes(nq, nk, heads, d) * CPU_ATTN_FLASH_LANE_BYTES;
    default:
        return (size_t)(cpu_attn_lanes(nq, nk, heads, d) * cpu_attn_block_rows(nq, nk) * nk) * sizeof(float);
    }
}

/* The 8 floats at p as doubles. */
CPU_VINLINE cpu_vd cpu_attn_half_d(const float *p) {
    typedef float half_t __attribute__((vector_size(CPU_VW * 2)));
    half_t h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, cpu_vd);
}

/* The direct kernel's row block in and out: qt [d][16] gets rb <= 16 rows
 * of q (stride ld) transposed, lane i row i, missing rows and columns 0;
 * rows_out writes ot [d][16] back to rb rows of o. Moves bits only; half
 * picks the transpose its form uses (cpu_vtranspose16_h for AVX2). */
CPU_VINLINE void cpu_attn_rows_in(const float *q, float *qt, int64_t rb, int64_t d, int64_t ld, const bool half) {
    enum { G = CPU_VW };
    for (int64_t c0 = 0; c0 < d; c0 += G) {
        const int64_t cn = d - c0 < G ? d - c0 : G;
        cpu_vf m[G];
        for (int64_t i = 0; i < G; i++) {
            if (i >= rb) {
                m[i] = cpu_vsplat(0.0f);
                continue;
            }
            const float *qi = q + i * ld + c0;
            m[i] = cn == G ? cpu_vload(qi) : cpu_vload_part(qi, cn, 0.0f);
        }
        if (half)
            cpu_vtranspose16_h(m);
        else
            cpu_vtranspose16(m);
        for (int c = 0; c < G; c++) /* the test in the loop: as a plain copy loop it became a rep movs */
            if (c < cn) cpu_vstore(qt + (c0 + c) * G, m[c]);
    }
}

CPU_VINLINE void cpu_attn_rows_out(const float *ot, float *o, int64_t rb, int64_t d, int64_t ld, const bool half) {
    enum { G = CPU_VW };
    for (int64_t c0 = 0; c0 < d; c0 += G) { /* row i's columns c0 .. c0 + cn */
        const int64_t cn = d - c0 < G ? d - c0 : G;
        cpu_vf m[G];
        for (int64_t cc = 0; cc < G; cc++) m[cc] = cc < cn ? cpu_vload(ot + (c0 + cc) * G) : cpu_vsplat(0.0f);
        if (half)
            cpu_vtranspose16_h(m);
        else
            cpu_vtranspose16(m);
        for (int64_t i = 0; i < rb; i++) {
            float *oi = o + i * ld + c0;
            if (cn == G)
                cpu_vstore(oi, m[i]);
            else
                cpu_vstore_part(oi, m[i], cn);
        }
    }
}

/* Direct: rows query rows q [rows × d] (stride ld) of one head against its
 * nk keys and values k, v [nk × d] (stride ld), into o (stride ld); all
 * already offset to the head's slice; nk, d <= CPU_ATTN_DIRECT_MAX. Each
 * row's bits are a function of that row and the head's keys and values
 * alone. Callers wrap it in a CPU_VEC_DISPATCH function
 * (cpu_vec_attn_direct).
 *
 * Sixteen query rows at a time, one per vector lane (rows transposed into
 * qt, scores and weights kept as st [key][row]): every step of a row's
 * softmax is then a vertical operation on 16 rows at once, where one row
 * at a time spent most of its time in short horizontal reductions (rows
 * of 5 to 64 keys). A row's arithmetic is cpu_softmax_row's and the
 * earlier row-major kernel's, operation for operation: score_j = (Σ_c in
 * order q_c·k_jc)·scale; m = max_j score_j; e_j = e^(score_j·1 − m); the
 * sum of e_j in double kept as cpu_exp_shift_sum keeps it (16 partial
 * sums by j mod 16, each over its keys in order and taken one at a time
 * from the stored e_j, so they stay in registers; lanes l and l + 8
 * added, then the same tree); p_j =
 * e_j·(float)(1/Σ); o_c = Σ_j in order p_j·v_jc. So the bits are those of
 * the row-major kernel (tests/test_ops_cpu.c keeps it and compares). */
CPU_VINLINE void cpu_attn_direct_do(const float *q, const float *k, const float *v, float *o, int64_t rows,
                                    int64_t nk, int64_t d, int64_t ld, float scale, const bool softmax) {
    enum { MX = CPU_ATTN_DIRECT_MAX, G = CPU_VW };
    typedef float cpu_attn_half_t __attribute__((vector_size(CPU_VW * 2)));
    float qt[MX * G], st[MX * G], ot[MX * G];
    const cpu_vf one = cpu_vsplat(1.0f);
    for (int64_t r = 0; r < rows; r += G) {
        const int64_t rb = rows - r < G ? rows - r : G;
        cpu_attn_rows_in(q + r * ld, qt, rb, d, ld, false);
        cpu_vf m = cpu_vsplat(-INFINITY);
        int64_t j = 0;
        for (; j + 4 <= nk; j += 4) { /* scores, four keys' independent sums at once, and the running max */
            const float *k0 = k + j * ld, *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
            cpu_vf a0 = cpu_vsplat(0.0f), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t c = 0; c < d; c++) {
                const cpu_vf qc = cpu_vload(qt + c * G);
                a0 = a0 + qc * k0[c];
                a1 = a1 + qc * k1[c];
                a2 = a2 + qc * k2[c];
                a3 = a3 + qc * k3[c];
            }
            const cpu_vf s4[4] = { a0 * scale, a1 * scale, a2 * scale, a3 * scale };
            for (int u = 0; u < 4; u++) {
                cpu_vstore(st + (j + u) * G, s4[u]);
                m = cpu_vmax2(m, s4[u] * one);
            }
        }
        for (; j < nk; j++) {
            const float *kj = k + j * ld;
            cpu_vf a = cpu_vsplat(0.0f);
            for (int64_t c = 0; c < d; c++) a = a + cpu_vload(qt + c * G) * kj[c];
            a = a * scale;
            cpu_vstore(st + j * G, a);
            m = cpu_vmax2(m, a * one);
        }
        if (softmax) { /* without: the weights are the scores, the products alone */
            for (j = 0; j < nk; j++) cpu_vstore(st + j * G, cpu_vexp(cpu_vload(st + j * G) * one - m));
            cpu_vf inv;
            for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7: cpu_vsum_d's tree over lanes l + (l + 8) */
                cpu_vd t[8];
                for (int l = 0; l < 8; l++) { /* partial sums l and l + 8, each over its keys in order */
                    cpu_vd a = { 0 }, b = { 0 };
                    for (int64_t jj = l; jj < nk; jj += 16) a += cpu_attn_half_d(st + jj * G + h * (G / 2));
                    for (int64_t jj = l + 8; jj < nk; jj += 16) b += cpu_attn_half_d(st + jj * G + h * (G / 2));
                    t[l] = a + b;
                }
                const cpu_vd sum = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
                const cpu_vd id = 1.0 / sum;
                const cpu_attn_half_t f = __builtin_convertvector(id, cpu_attn_half_t);
                memcpy((char *)&inv + h * sizeof f, &f, sizeof f);
            }
            for (j = 0; j < nk; j++) cpu_vstore(st + j * G, cpu_vload(st + j * G) * inv);
        }
        int64_t c = 0;
        for (; c + 4 <= d; c += 4) { /* outputs, four columns' independent sums at once */
            cpu_vf a0 = cpu_vsplat(0.0f), a1 = a0, a2 = a0, a3 = a0;
            for (j = 0; j < nk; j++) {
                const cpu_vf pj = cpu_vload(st + j * G);
                const float *vj = v + j * ld + c;
                a0 = a0 + pj * vj[0];
                a1 = a1 + pj * vj[1];
                a2 = a2 + pj * vj[2];
                a3 = a3 + pj * vj[3];
            }
            cpu_vstore(ot + c * G, a0);
            cpu_vstore(ot + (c + 1) * G, a1);
            cpu_vstore(ot + (c + 2) * G, a2);
            cpu_vstore(ot + (c + 3) * G, a3);
        }
        for (; c < d; c++) {
            cpu_vf a = cpu_vsplat(0.0f);
            for (j = 0; j < nk; j++) a = a + cpu_vload(st + j * G) * v[j * ld + c];
            cpu_vstore(ot + c * G, a);
        }
        cpu_attn_rows_out(ot, o + r * ld, rb, d, ld, false);
    }
}

/* 4 floats from p as doubles. */
CPU_VINLINE cpu_vq cpu_attn_quarter_d(const float *p) {
    typedef float quarter_t __attribute__((vector_size(CPU_VW)));
    quarter_t h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, cpu_vq);
}

/* cpu_attn_direct_do for AVX2 and baseline x86-64, the same bits: the
 * loops that carry sums are written on half vectors (8 floats, 4 doubles:
 * cpu_vh), which an AVX2 clone keeps in registers, where its 16-float
 * accumulators lived in memory (3.5x slower). AVX-512 runs the 16-float
 * form: there the half form is 2.3x slower. */
CPU_VINLINE void cpu_attn_direct_do_h(const float *q, const float *k, const float *v, float *o, int64_t rows,
                                    int64_t nk, int64_t d, int64_t ld, float scale, const bool softmax) {
    enum { MX = CPU_ATTN_DIRECT_MAX, G = CPU_VW, HW = CPU_VW / 2, QW = CPU_VW / 4 };
    float qt[MX * G], st[MX * G], ot[MX * G];
    for (int64_t r = 0; r < rows; r += G) {
        const int64_t rb = rows - r < G ? rows - r : G;
        cpu_attn_rows_in(q + r * ld, qt, rb, d, ld, true);
        cpu_vh m[2] = { cpu_vhsplat(-INFINITY), cpu_vhsplat(-INFINITY) };
        int64_t j = 0;
        for (; j + 4 <= nk; j += 4) { /* scores, four keys' independent sums at once, and the running max */
            const float *k0 = k + j * ld, *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
            /* named: as an array a[4][2] GCC kept them in memory (a load
             * and a store an add, 4.5x the AVX-512 form's time) */
            cpu_vh a00 = { 0 }, a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (int64_t c = 0; c < d; c++) {
                const cpu_vh q0 = cpu_vhload(qt + c * G), q1 = cpu_vhload(qt + c * G + HW);
                a00 = a00 + q0 * k0[c], a01 = a01 + q1 * k0[c];
                a10 = a10 + q0 * k1[c], a11 = a11 + q1 * k1[c];
                a20 = a20 + q0 * k2[c], a21 = a21 + q1 * k2[c];
                a30 = a30 + q0 * k3[c], a31 = a31 + q1 * k3[c];
            }
            const cpu_vh a[4][2] = { { a00, a01 }, { a10, a11 }, { a20, a21 }, { a30, a31 } };
            for (int u = 0; u < 4; u++) {
                for (int h = 0; h < 2; h++) {
                    const cpu_vh sc = a[u][h] * scale;
                    cpu_vhstore(st + (j + u) * G + h * HW, sc);
                    m[h] = cpu_vhmax2(m[h], sc * 1.0f);
                }
            }
        }
        for (; j < nk; j++) {
            const float *kj = k + j * ld;
            for (int h = 0; h < 2; h++) {
                cpu_vh a = { 0 };
                for (int64_t c = 0; c < d; c++) a = a + cpu_vhload(qt + c * G + h * HW) * kj[c];
                a = a * scale;
                cpu_vhstore(st + j * G + h * HW, a);
                m[h] = cpu_vhmax2(m[h], a * 1.0f);
            }
        }
        if (softmax) { /* without: the weights are the scores, the products alone */
            cpu_vf mv;
            cpu_vset_half(&mv, 0, m[0]);
            cpu_vset_half(&mv, 1, m[1]);
            const cpu_vf one = cpu_vsplat(1.0f);
            for (j = 0; j < nk; j++) cpu_vstore(st + j * G, cpu_vexp(cpu_vload(st + j * G) * one - mv));
            float inv[G];
            for (int h = 0; h < 4; h++) { /* rows 4h .. 4h + 3: cpu_vsum_d's tree over lanes l + (l + 8) */
                cpu_vq t[8];
                for (int l = 0; l < 8; l++) { /* partial sums l and l + 8, each over its keys in order */
                    cpu_vq a = { 0 }, b = { 0 };
                    for (int64_t jj = l; jj < nk; jj += 16) a += cpu_attn_quarter_d(st + jj * G + h * QW);
                    for (int64_t jj = l + 8; jj < nk; jj += 16) b += cpu_attn_quarter_d(st + jj * G + h * QW);
                    t[l] = a + b;
                }
                const cpu_vq sum = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
                const cpu_vq id = 1.0 / sum;
                for (int i = 0; i < QW; i++) inv[h * QW + i] = (float)id[i];
            }
            for (j = 0; j < nk; j++)
                for (int h = 0; h < 2; h++)
                    cpu_vhstore(st + j * G + h * HW, cpu_vhload(st + j * G + h * HW) * cpu_vhload(inv + h * HW));
        }
        int64_t c = 0;
        for (; c + 4 <= d; c += 4) { /* outputs, four columns' independent sums at once */
            cpu_vh a00 = { 0 }, a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (j = 0; j < nk; j++) {
                const float *vj = v + j * ld + c;
                const cpu_vh p0 = cpu_vhload(st + j * G), p1 = cpu_vhload(st + j * G + HW);
                a00 = a00 + p0 * vj[0], a01 = a01 + p1 * vj[0];
                a10 = a10 + p0 * vj[1], a11 = a11 + p1 * vj[1];
                a20 = a20 + p0 * vj[2], a21 = a21 + p1 * vj[2];
                a30 = a30 + p0 * vj[3], a31 = a31 + p1 * vj[3];
            }
            const cpu_vh a[4][2] = { { a00, a01 }, { a10, a11 }, { a20, a21 }, { a30, a31 } };
            for (int u = 0; u < 4; u++)
                for (int h = 0; h < 2; h++) cpu_vhstore(ot + (c + u) * G + h * HW, a[u][h]);
        }
        for (; c < d; c++) {
            for (int h = 0; h < 2; h++) {
                cpu_vh a = { 0 };
                for (j = 0; j < nk; j++) a = a + cpu_vhload(st + j * G + h * HW) * v[j * ld + c];
                cpu_vhstore(ot + c * G + h * HW, a);
            }
        }
        cpu_attn_rows_out(ot, o + r * ld, rb, d, ld, true);
    }
}

/* The direct kernel (cpu_attn_direct_do with its softmax). */
CPU_VINLINE void cpu_attn_direct_rows(const float *q, const float *k, const float *v, float *o, int64_t rows,
                                      int64_t nk, int64_t d, int64_t ld, float scale) {
    cpu_attn_direct_do(q, k, v, o, rows, nk, d, ld, scale, true);
}

/* The same for AVX2 and baseline x86-64 (cpu_attn_direct_do_h). */
CPU_VINLINE void cpu_attn_direct_rows_h(const float *q, const float *k, const float *v, float *o, int64_t rows,
                                        int64_t nk, int64_t d, int64_t ld, float scale) {
    cpu_attn_direct_do_h(q, k, v, o, rows, nk, d, ld, scale, true);
}

/* cpu_attn_direct_rows compiled for each ISA and dispatched (cpu_vec.c):
 * AVX-512 runs cpu_attn_direct_rows, the others cpu_attn_direct_rows_h. */
void cpu_vec_attn_direct(const float *q, const float *k, const float *v, float *o, int64_t rows, int64_t nk,
                         int64_t d, int64_t ld, float scale);

/* The direct kernel's matrix products alone, dispatched: the same q
 * transpose, scores and weights·values loops, with the scores standing in
 * for the weights (no max, e^x, sum or scaling). For bench_cpu_step's
 * floor (kern_cpu_attention_products); o gets no attention output. */
void cpu_vec_attn_direct_products(const float *q, const float *k, const float *v, float *o, int64_t rows,
                                  int64_t nk, int64_t d, int64_t ld, float scale);

/* The flash rows of one key block: s [rows × n] (stride lds) becomes the
 * block's weights e^(s − m'), m and l are updated and c[r] = e^(m − m')
 * (0 for the first block, where m = −inf). Each row's bits are a function
 * of that row alone (cpu_vmath.h). Callers wrap it in a CPU_VEC_DISPATCH
 * function (cpu_vec_flash_rows). */
CPU_VINLINE void cpu_flash_rows_do(float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l,
                                   float *c, const bool half) {
    for (int64_t r = 0; r < rows; r++) {
        float *x = s + r * lds;
        const float bm = cpu_row_max(x, n, 1.0f, half);
        const float mo = m[r], mn = bm > mo ? bm : mo;
        const float cr = mo == -INFINITY ? 0.0f : cpu_vexp(cpu_vsplat(mo - mn))[0];
        const double sum = cpu_exp_shift_sum(x, x, n, 1.0f, mn, half);
        l[r] = l[r] * (double)cr + sum;
        m[r] = mn;
        c[r] = cr;
    }
}

/* The 16-float form (AVX-512) and the half-vector form (AVX2, baseline) of
 * cpu_flash_rows_do: the same bits (cpu_vmath.h, the softmax's steps). */
CPU_VINLINE void cpu_flash_rows(float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l, float *c) {
    cpu_flash_rows_do(s, lds, rows, n, m, l, c, false);
}

CPU_VINLINE void cpu_flash_rows_h(float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l, float *c) {
    cpu_flash_rows_do(s, lds, rows, n, m, l, c, true);
}

typedef void (*cpu_flash_rows_fn)(float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l,
                                  float *c);

/* cpu_flash_rows compiled for each ISA and dispatched (cpu_vec.c). */
void cpu_vec_flash_rows(float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l, float *c);

/* One flash item: queries q [mq × d] (row stride ld), keys and values k, v
 * [nk × d] (stride ld), output o [mq × d] (stride ld), all already offset
 * to the head's slice; mq <= CPU_ATTN_FLASH_BQ; lane: one lane's scratch
 * (CPU_ATTN_FLASH_LANE_BYTES, 8-byte aligned). */
static inline void cpu_attn_flash_item(const float *q, const float *k, const float *v, float *o, int64_t mq,
                                       int64_t nk, int64_t d, int64_t ld, float scale, void *lane,
                                       cpu_flash_rows_fn rows_fn) {
    enum { BQ = CPU_ATTN_FLASH_BQ, BK = CPU_ATTN_FLASH_BK };
    float *s = lane, *m = s + BQ * BK, *c = m + BQ;
    double *l = (double *)(c + BQ);
    for (int64_t r = 0; r < mq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0;
    }
    for (int64_t kb = 0; kb < nk; kb += BK) {
        const int64_t n = nk - kb < BK ? nk - kb : BK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)mq, (blasint)n, (blasint)d, scale, q,
                    (blasint)ld, k + kb * ld, (blasint)ld, 0.0f, s, (blasint)BK);
        rows_fn(s, BK, mq, n, m, l, c);
        if (kb)
            for (int64_t r = 0; r < mq; r++) {
                float *orow = o + r * ld;
                const float cr = c[r];
                for (int64_t j = 0; j < d; j++) orow[j] *= cr;
            }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)mq, (blasint)d, (blasint)n, 1.0f, s,
                    (blasint)BK, v + kb * ld, (blasint)ld, kb ? 1.0f : 0.0f, o, (blasint)ld);
    }
    for (int64_t r = 0; r < mq; r++) {
        float *orow = o + r * ld;
        const float inv = (float)(1.0 / l[r]);
        for (int64_t j = 0; j < d; j++) orow[j] *= inv;
    }
}

#endif
