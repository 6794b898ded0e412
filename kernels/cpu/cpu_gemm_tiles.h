/* cpu_gemm_tiles.h -- how the CPU GEMM cuts y into tiles, one sgemm each:
 * the native kernel's rule (ops_gemm.c), written once so the CPU artifacts
 * that promise its bytes (artifacts/cpu_gemm_gelu_epilogue, the test
 * variants) make the very same calls.
 *
 * OpenBLAS may sum an output differently in a call of another shape
 * (measured: any other slicing moves a few percent of the outputs by an
 * ulp), so the tiles are a function of (M, N, K) alone, never of the
 * threads: below 2^22 flops one call, else 256 rows by 64 columns (128
 * from N = 1024). A grouped GEMM (kern_gemm_args_t.group: a batch's
 * samples stacked, `group` rows each) is cut group by group, each group
 * exactly as a GEMM of its rows alone: every sgemm call of sample b is the
 * call sample b makes by itself, with the same operands, so a batch gives
 * each sample the bits it gets alone, and the groups' tiles share the
 * pool. Includes cblas.h: the includer links OpenBLAS. */
#ifndef REEL_KERNELS_CPU_GEMM_TILES_H
#define REEL_KERNELS_CPU_GEMM_TILES_H

#include <cblas.h>
#include <stdint.h>
#include <string.h>

#define CPU_GEMM_TILE_FLOPS ((int64_t)1 << 22)
#define CPU_GEMM_TILE_M 256

typedef struct {
    int64_t tm, tn;         /* tile rows and columns (the last ones may be short) */
    int64_t mtiles, ntiles; /* tiles down one group's rows and across the columns */
    int64_t group, groups;  /* rows per group, groups (M = group·groups) */
} cpu_gemm_tiles_t;

/* The tiles of an [M, N] output summing over K, in groups of `group` rows
 * (0, or anything that does not divide M: one group of M); M, N >= 1. */
static inline cpu_gemm_tiles_t cpu_gemm_tiles(int64_t M, int64_t N, int64_t K, int64_t group) {
    if (group <= 0 || group > M || M % group) group = M;
    cpu_gemm_tiles_t t = { group, N, 1, 1, group, M / group };
    if (2.0 * (double)group * (double)N * (double)(K > 0 ? K : 0) >= (double)CPU_GEMM_TILE_FLOPS) {
        const int64_t cols = N >= 1024 ? 128 : 64;
        t.tm = group < CPU_GEMM_TILE_M ? group : CPU_GEMM_TILE_M;
        t.tn = N < cols ? N : cols;
    }
    t.mtiles = (group + t.tm - 1) / t.tm;
    t.ntiles = (N + t.tn - 1) / t.tn;
    return t;
}

/* Tiles in all. */
static inline int64_t cpu_gemm_tile_count(const cpu_gemm_tiles_t *t) { return t->groups * t->mtiles * t->ntiles; }

/* Tile i (0 <= i < cpu_gemm_tile_count) of y[M,N] = x[M,K]·w[N,K]ᵀ + bias
 * (bias NULL: none): the bias written into its rows, one sgemm onto it
 * (beta 1), zeros for an empty sum. Sets *r0, *c0, *rows, *cols to the
 * tile's place in y. */
static inline void cpu_gemm_tile(const float *x, const float *w, const float *bias, float *y, int64_t M,
                                 int64_t N, int64_t K, const cpu_gemm_tiles_t *t, int64_t i, int64_t *r0,
                                 int64_t *c0, int64_t *rows, int64_t *cols) {
    (void)M;
    const int64_t per = t->mtiles * t->ntiles, g = i / per;
    i %= per;
    const int64_t m0 = (i % t->mtiles) * t->tm, n0 = (i / t->mtiles) * t->tn;
    const int64_t mb = t->group - m0 < t->tm ? t->group - m0 : t->tm, nb = N - n0 < t->tn ? N - n0 : t->tn;
    x += g * t->group * K; /* the group as a GEMM of its own */
    y += g * t->group * N;
    float *yt = y + m0 * N + n0;
    float beta = 0.0f;
    if (bias) {
        for (int64_t r = 0; r < mb; r++) memcpy(yt + r * N, bias + n0, (size_t)nb * sizeof(float));
        beta = 1.0f;
    }
    if (K > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)mb, (blasint)nb, (blasint)K, 1.0f,
                    x + m0 * K, (blasint)K, w + n0 * K, (blasint)K, beta, yt, (blasint)N);
    else if (!bias) /* an empty sum: zero; lda = 0 is invalid BLAS */
        for (int64_t r = 0; r < mb; r++) memset(yt + r * N, 0, (size_t)nb * sizeof(float));
    *r0 = g * t->group + m0;
    *c0 = n0;
    *rows = mb;
    *cols = nb;
}

#endif
