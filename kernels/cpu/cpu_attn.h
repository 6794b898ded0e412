/* cpu_attn.h -- the CPU attention kernel's plan and per-item arithmetic,
 * shared by the native kernel (ops_attention.c) and the CPU attention
 * artifact, which must give its bytes.
 *
 * Two ways, chosen by the sizes alone (scores per head, nq·nk):
 * - below CPU_ATTN_FLASH_MIN (2^20): whole rows. Per head, as many queries
 *   as fit CPU_ATTN_CAP bytes of scores make one block: one sgemm for the
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

#define CPU_ATTN_LANES 8                          /* whole-row blocks in flight at once, at most */
#define CPU_ATTN_CAP ((int64_t)2 << 20)           /* bytes of scores per whole-row block */
#define CPU_ATTN_FLASH_MIN ((int64_t)1 << 20)     /* scores per head from which items go flash */
#define CPU_ATTN_FLASH_BQ 128                     /* queries per flash item */
#define CPU_ATTN_FLASH_BK 256                     /* keys per flash block */
#define CPU_ATTN_FLASH_LANES 64                   /* flash items in flight at once, at most */
/* One flash lane's scratch: scores [BQ × BK], m [BQ], c [BQ] (floats), l [BQ] (doubles). */
#define CPU_ATTN_FLASH_LANE_BYTES \
    ((size_t)CPU_ATTN_FLASH_BQ * CPU_ATTN_FLASH_BK * 4 + (size_t)CPU_ATTN_FLASH_BQ * 16)

/* Whether attention of these sizes runs flash-style: nq·nk >= 2^20,
 * without forming the product. */
static inline bool cpu_attn_flash(int64_t nq, int64_t nk) {
    return nq > 0 && nk > 0 && nq >= (CPU_ATTN_FLASH_MIN + nk - 1) / nk;
}

/* Whole rows: query rows per block (all of them when the scores fit). */
static inline int64_t cpu_attn_block_rows(int64_t nq, int64_t nk) {
    if (nq <= 0 || nk <= 0) return 0;
    int64_t rows = CPU_ATTN_CAP / (nk * (int64_t)sizeof(float));
    if (rows < 1) rows = 1;
    return rows < nq ? rows : nq;
}

/* Items (head, query block) of either way. */
static inline int64_t cpu_attn_items(int64_t nq, int64_t nk, int64_t heads) {
    if (nq <= 0 || nk <= 0 || heads <= 0) return 0;
    int64_t rows = cpu_attn_flash(nq, nk) ? CPU_ATTN_FLASH_BQ : cpu_attn_block_rows(nq, nk);
    return heads * ((nq + rows - 1) / rows);
}

/* Lanes: each works through every lanes-th item with its own scratch. */
static inline int64_t cpu_attn_lanes(int64_t nq, int64_t nk, int64_t heads) {
    int64_t items = cpu_attn_items(nq, nk, heads);
    int64_t cap = cpu_attn_flash(nq, nk) ? CPU_ATTN_FLASH_LANES : CPU_ATTN_LANES;
    return items < cap ? items : cap;
}

/* Bytes of scratch the kernel needs for these sizes. */
static inline size_t cpu_attn_workspace(int64_t nq, int64_t nk, int64_t heads) {
    int64_t lanes = cpu_attn_lanes(nq, nk, heads);
    if (cpu_attn_flash(nq, nk)) return (size_t)lanes * CPU_ATTN_FLASH_LANE_BYTES;
    return (size_t)(lanes * cpu_attn_block_rows(nq, nk) * nk) * sizeof(float);
}

/* The flash rows of one key block: s [rows × n] (stride lds) becomes the
 * block's weights e^(s − m'), m and l are updated and c[r] = e^(m − m')
 * (0 for the first block, where m = −inf). Each row's bits are a function
 * of that row alone (cpu_vmath.h). Callers wrap it in a CPU_VEC_DISPATCH
 * function (cpu_vec_flash_rows). */
CPU_VINLINE void cpu_flash_rows(float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l,
                                float *c) {
    for (int64_t r = 0; r < rows; r++) {
        float *x = s + r * lds;
        const float bm = cpu_row_max(x, n, 1.0f);
        const float mo = m[r], mn = bm > mo ? bm : mo;
        const float cr = mo == -INFINITY ? 0.0f : cpu_vexp(cpu_vsplat(mo - mn))[0];
        const double sum = cpu_exp_shift_sum(x, x, n, 1.0f, mn);
        l[r] = l[r] * (double)cr + sum;
        m[r] = mn;
        c[r] = cr;
    }
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
