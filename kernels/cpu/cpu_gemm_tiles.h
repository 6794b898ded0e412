/* cpu_gemm_tiles.h -- how the CPU GEMM cuts y into tiles, one sgemm each:
 * the native kernel's rule (ops_gemm.c), written once so the CPU artifacts
 * that promise its bytes (artifacts/cpu_gemm_gelu_epilogue, the test
 * variants) make the very same calls.
 *
 * OpenBLAS may sum an output differently in a call of another shape
 * (measured: any other slicing moves a few percent of the outputs by an
 * ulp), so the tiles are a function of (M, N, K) alone, never of the
 * threads: below 2^22 flops one call, else 256 rows by 64 columns (128
 * from N = 1024). Includes cblas.h: the includer links OpenBLAS. */
#ifndef REEL_KERNELS_CPU_GEMM_TILES_H
#define REEL_KERNELS_CPU_GEMM_TILES_H

#include <cblas.h>
#include <stdint.h>
#include <string.h>

#define CPU_GEMM_TILE_FLOPS ((int64_t)1 << 22)
#define CPU_GEMM_TILE_M 256

typedef struct {
    int64_t tm, tn;         /* tile rows and columns (the last ones may be short) */
    int64_t mtiles, ntiles; /* tiles down the rows and across the columns */
} cpu_gemm_tiles_t;

/* The tiles of an [M, N] output summing over K; M, N >= 1. */
static inline cpu_gemm_tiles_t cpu_gemm_tiles(int64_t M, int64_t N, int64_t K) {
    cpu_gemm_tiles_t t = { M, N, 1, 1 };
    if (2.0 * (double)M * (double)N * (double)(K > 0 ? K : 0) >= (double)CPU_GEMM_TILE_FLOPS) {
        const int64_t cols = N >= 1024 ? 128 : 64;
        t.tm = M < CPU_GEMM_TILE_M ? M : CPU_GEMM_TILE_M;
        t.tn = N < cols ? N : cols;
    }
    t.mtiles = (M + t.tm - 1) / t.tm;
    t.ntiles = (N + t.tn - 1) / t.tn;
    return t;
}

/* Tile i (0 <= i < mtiles·ntiles) of y[M,N] = x[M,K]·w[N,K]ᵀ + bias (bias
 * NULL: none): the bias written into its rows, one sgemm onto it (beta 1),
 * zeros for an empty sum. Sets *r0, *c0, *rows, *cols to the tile's place. */
static inline void cpu_gemm_tile(const float *x, const float *w, const float *bias, float *y, int64_t M,
                                 int64_t N, int64_t K, const cpu_gemm_tiles_t *t, int64_t i, int64_t *r0,
                                 int64_t *c0, int64_t *rows, int64_t *cols) {
    const int64_t m0 = (i % t->mtiles) * t->tm, n0 = (i / t->mtiles) * t->tn;
    const int64_t mb = M - m0 < t->tm ? M - m0 : t->tm, nb = N - n0 < t->tn ? N - n0 : t->tn;
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
    *r0 = m0;
    *c0 = n0;
    *rows = mb;
    *cols = nb;
}

#endif
