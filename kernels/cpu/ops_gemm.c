/* ops_gemm.c -- y[M,N] = x[M,K]·w[N,K]ᵀ + bias on the CPU through OpenBLAS,
 * the same followed by GELU-tanh (GEMM_GELU), and the strided-batched GEMM
 * of the decomposed attention (one sgemm per batch member: this OpenBLAS
 * has no cblas_sgemm_batch).
 *
 * OpenBLAS runs single-threaded; a large GEMM is cut into tiles of y (256
 * rows by 64 or 128 columns, cpu_gemm_tiles.h), one sgemm each, run on the
 * pool (cpu_pool.h). The bias is written into a tile's rows first and
 * sgemm accumulates onto it (beta = 1). The tiles depend on the GEMM's
 * shape alone and never on the pool's size: the bits are the same on any
 * number of threads (tests/test_ops_cpu.c), and eager and replayed results
 * are bitwise equal. y must not alias x or w.
 *
 * A pool with more threads than a GEMM has tiles (a 256-token model's
 * 256 x 384 output is 6 tiles: 6 of 64 cores) cuts each tile into 2 to 8
 * sub-tiles, one sgemm each, where OpenBLAS computes a sub-tile the very
 * bits it computes for it inside the whole tile: asked once per (tile,
 * split) shape of the process, on random operands, three times (as the
 * merged GEMMs ask, model/gemm_merge.c), never while a graph replays.
 * OpenBLAS's AVX-512 kernels (SkylakeX, Cooperlake) say yes for sub-tiles
 * of 64 rows and 32 columns upwards; its Haswell and Zen kernels sum an
 * output differently in a call of any other shape and say no, so there
 * the tiles stay whole. Either way the bits are the tiles' own. */
#include "../ops_args.h"
#include "base/error.h"
#include "cpu_gemm_tiles.h"
#include "cpu_pool.h"
#include "cpu_verdict.h"
#include "cpu_vmath.h"
#include <cblas.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const kern_gemm_args_t *a;
    cpu_gemm_tiles_t t;
    bool gelu;
    int fr, fc; /* a whole tile's sub-tiles: fr down its rows, fc across its columns (1, 1: none) */
} gemm_job_t;

static void gelu_rows(const kern_gemm_args_t *a, int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
    for (int64_t r = r0; r < r0 + rows; r++) {
        float *y = (float *)a->y + r * a->N + c0;
        cpu_vec_gelu_tanh(y, y, cols);
    }
}

/* Tile i of y (cpu_gemm_tiles.h), then its GELU while in cache. */
static void gemm_tile(void *ctx, int64_t i) {
    const gemm_job_t *j = ctx;
    const kern_gemm_args_t *a = j->a;
    int64_t r0, c0, rows, cols;
    cpu_gemm_tile(a->x, a->w, a->bias, a->y, a->M, a->N, a->K, &j->t, i, &r0, &c0, &rows, &cols);
    if (j->gelu) gelu_rows(a, r0, c0, rows, cols);
}

/* rows x cols of y at (r0, c0) as cpu_gemm_tile computes a tile: the bias
 * written first, one sgemm onto it (K >= 1 here). */
static void gemm_block(const float *x, const float *w, const float *bias, float *y, int64_t N, int64_t K,
                       int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
    float *yt = y + r0 * N + c0;
    float beta = 0.0f;
    if (bias) {
        for (int64_t r = 0; r < rows; r++) memcpy(yt + r * N, bias + c0, (size_t)cols * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, (blasint)cols, (blasint)K, 1.0f,
                x + r0 * K, (blasint)K, w + c0 * K, (blasint)K, beta, yt, (blasint)N);
}

/* Item it of a split job: sub-tile it % (fr·fc) of tile it / (fr·fc). A
 * tile at the edge (shorter than tm or tn) is not split: its first item
 * runs it whole, the others nothing. */
static void gemm_subtile(void *ctx, int64_t it) {
    const gemm_job_t *j = ctx;
    const kern_gemm_args_t *a = j->a;
    const cpu_gemm_tiles_t *t = &j->t;
    const int64_t f = (int64_t)j->fr * j->fc, i = it / f, s = it % f;
    const int64_t per = t->mtiles * t->ntiles, g = i / per, ii = i % per;
    const int64_t m0 = (ii % t->mtiles) * t->tm, n0 = (ii / t->mtiles) * t->tn;
    const int64_t mb = t->group - m0 < t->tm ? t->group - m0 : t->tm, nb = a->N - n0 < t->tn ? a->N - n0 : t->tn;
    if (mb != t->tm || nb != t->tn) {
        if (s == 0) gemm_tile(ctx, i);
        return;
    }
    const int64_t sm = t->tm / j->fr, sn = t->tn / j->fc;
    const int64_t r0 = g * t->group + m0 + (s / j->fc) * sm, c0 = n0 + (s % j->fc) * sn;
    gemm_block(a->x, a->w, a->bias, (float *)a->y, a->N, a->K, r0, c0, sm, sn);
    if (j->gelu) gelu_rows(a, r0, c0, sm, sn);
}

/* OpenBLAS's answers about cut tiles: the key is a tile of tm x tn over K
 * (y's rows N apart, the bias written first or not) cut fr x fc. */
static cpu_verdicts_t split_verdicts = CPU_VERDICTS_INIT;
static uint64_t split_runs; /* GEMMs run cut (kern_cpu_gemm_split_stats) */

typedef struct {
    int64_t tm, tn, K, N;
    int fr, fc;
    bool bias;
} split_key_t;

static void split_key(const split_key_t *k, int64_t out[CPU_VERDICT_KEY]) {
    const int64_t key[CPU_VERDICT_KEY] = { k->tm, k->tn, k->K, k->N, k->fr, k->fc, k->bias, 0 };
    memcpy(out, key, sizeof key);
}

/* 1: every sub-tile of k's cut is bitwise its part of the whole tile, on
 * three sets of random operands; 0: not; -1: no memory to ask. */
static int split_probe(const split_key_t *k) {
    const int64_t tm = k->tm, tn = k->tn, K = k->K, N = k->N, sm = tm / k->fr, sn = tn / k->fc;
    const size_t nx = (size_t)(tm * K), nw = (size_t)(tn * K), ny = (size_t)(tm * N);
    float *x = malloc(nx * sizeof *x), *w = malloc(nw * sizeof *w), *b = malloc((size_t)tn * sizeof *b);
    float *y1 = calloc(ny, sizeof *y1), *y2 = calloc(ny, sizeof *y2);
    int rc = -1;
    if (!x || !w || !b || !y1 || !y2) goto out;
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)(tm * 131 + tn * 31 + K);
    rc = 1;
    for (int round = 0; round < 3 && rc == 1; round++) {
        cpu_fill_random(x, nx, &seed);
        cpu_fill_random(w, nw, &seed);
        cpu_fill_random(b, (size_t)tn, &seed);
        const float *bias = k->bias ? b : NULL;
        gemm_block(x, w, bias, y1, N, K, 0, 0, tm, tn);
        for (int r = 0; r < k->fr; r++)
            for (int c = 0; c < k->fc; c++) gemm_block(x, w, bias, y2, N, K, r * sm, c * sn, sm, sn);
        for (int64_t r = 0; r < tm && rc == 1; r++)
            if (memcmp(y1 + r * N, y2 + r * N, (size_t)tn * sizeof(float)) != 0) rc = 0;
    }
out:
    free(x);
    free(w);
    free(b);
    free(y1);
    free(y2);
    return rc;
}

static int split_probe_fn(const void *k) { return split_probe(k); }

/* Picks j->fr, j->fc for a pool of T threads: the cheapest split by
 * cpu_cut_cost that OpenBLAS computes bitwise, sub-tiles at least 64 rows and
 * 32 columns, each a multiple of 16; 1, 1 when none beats the whole tiles,
 * and always on a pool of 2 or 3 (CPU_CUT_MIN_THREADS). */
static void split_choose(gemm_job_t *j, int64_t tiles, int T) {
    static const int cand[][2] = { { 2, 1 }, { 1, 2 }, { 4, 1 }, { 2, 2 }, { 4, 2 }, { 2, 4 } };
    j->fr = j->fc = 1;
    if (!cpu_cut_wanted(tiles, T) || j->a->K < 1) return;
    int pick = -1;
    double pick_cost = cpu_cut_cost(tiles, 1, T);
    for (size_t c = 0; c < sizeof cand / sizeof cand[0]; c++) {
        const int fr = cand[c][0], fc = cand[c][1];
        const int64_t sm = j->t.tm / fr, sn = j->t.tn / fc;
        if (j->t.tm % fr || j->t.tn % fc || sm < 64 || sn < 32 || sm % 16 || sn % 16) continue;
        double cost = cpu_cut_cost(tiles, fr * fc, T);
        if (cost < pick_cost * 0.95) pick = (int)c, pick_cost = cost;
    }
    if (pick < 0) return;
    /* One question, the best split's: OpenBLAS's answer is about its
     * kernels (they sum a call of another shape alike, or not), so where
     * it says no the tiles stay whole. */
    const split_key_t k = { j->t.tm, j->t.tn, j->a->K, j->a->N, cand[pick][0], cand[pick][1], j->a->bias != NULL };
    int64_t key[CPU_VERDICT_KEY];
    split_key(&k, key);
    if (cpu_verdict_ask(&split_verdicts, key, split_probe_fn, &k)) {
        j->fr = cand[pick][0];
        j->fc = cand[pick][1];
    }
}

void kern_cpu_gemm_split_forget(void) { cpu_verdict_forget(&split_verdicts); }

void kern_cpu_gemm_split_stats(uint64_t *runs, int *yes, int *no) {
    *runs = __atomic_load_n(&split_runs, __ATOMIC_RELAXED);
    cpu_verdict_count(&split_verdicts, yes, no);
}

/* Fails (nothing written) when a size does not fit OpenBLAS's 32-bit ints.
 * The tiles run on the pool; they are the shape's alone, so the bits are
 * the same on any number of threads. */
static int gemm_run(const kern_gemm_args_t *a, bool gelu) {
    int64_t M = a->M, N = a->N, K = a->K;
    if (M <= 0 || N <= 0) return 0;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return reel_fail(REEL_E_INVALID, "gemm_openblas: M=%lld N=%lld K=%lld exceed the BLAS int range",
                         (long long)M, (long long)N, (long long)K);
    gemm_job_t j = { .a = a, .t = cpu_gemm_tiles(M, N, K, a->group), .gelu = gelu };
    const int64_t tiles = cpu_gemm_tile_count(&j.t);
    /* A grouped GEMM below one tile's worth of work in all (a batch of
     * tiny samples): its tiles stay on the caller, where waking a thread
     * costs more than a tile (bench_mix_step: 2 tiny samples at 2 threads
     * took 1.7x their time at 1). Same tiles either way: same bits. */
    if (2.0 * (double)M * (double)N * (double)K < (double)CPU_GEMM_TILE_FLOPS) {
        for (int64_t i = 0; i < tiles; i++) gemm_tile(&j, i);
        return 0;
    }
    split_choose(&j, tiles, cpu_pool_threads());
    if (j.fr * j.fc > 1) {
        __atomic_fetch_add(&split_runs, 1, __ATOMIC_RELAXED);
        cpu_par_for(tiles * j.fr * j.fc, gemm_subtile, &j);
    } else {
        cpu_par_for(tiles, gemm_tile, &j);
    }
    return 0;
}

static int gemm_f32(void *ctx, const void *args) {
    (void)ctx;
    return gemm_run(args, false);
}

/* The GEMM, then GELU_TANH's arithmetic (cpu_vmath.h) over each tile while
 * it is in cache: bit for bit kern_gemm then kern_gelu_tanh, since the
 * tiles are kern_gemm's and the GELU of an element does not depend on its
 * neighbours. Fails as gemm_f32 (nothing written). */
static int gemm_gelu_f32(void *ctx, const void *args) {
    (void)ctx;
    return gemm_run(args, true);
}

/* Fails (nothing written) when a size is < 1, a leading dim is shorter
 * than its row, or a size does not fit OpenBLAS's ints. */
static int gemm_batched_check(const kern_gemm_batched_args_t *a) {
    if (a->m < 1 || a->n < 1 || a->k < 1)
        return reel_fail(REEL_E_INVALID, "gemm_batched_openblas: m=%lld n=%lld k=%lld must all be >= 1",
                         (long long)a->m, (long long)a->n, (long long)a->k);
    if (a->m > INT_MAX || a->n > INT_MAX || a->k > INT_MAX || a->lda > INT_MAX ||
        a->ldb > INT_MAX || a->ldc > INT_MAX)
        return reel_fail(REEL_E_INVALID, "gemm_batched_openblas: sizes exceed the BLAS int range");
    if (a->lda < a->k || a->ldb < (a->trans_b ? a->k : a->n) || a->ldc < a->n)
        return reel_fail(REEL_E_INVALID, "gemm_batched_openblas: a leading dim is shorter than its row "
                         "(lda=%lld ldb=%lld ldc=%lld for m=%lld n=%lld k=%lld)",
                         (long long)a->lda, (long long)a->ldb, (long long)a->ldc,
                         (long long)a->m, (long long)a->n, (long long)a->k);
    return 0;
}

typedef struct {
    const kern_gemm_batched_args_t *a;
    int64_t per; /* members per task */
} batched_job_t;

static void batched_slice(void *ctx, int64_t t) {
    const batched_job_t *j = ctx;
    const kern_gemm_batched_args_t *a = j->a;
    const float *x = a->a, *w = a->b;
    float *y = a->c;
    for (int64_t b = t * j->per; b < a->batch && b < (t + 1) * j->per; b++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, a->trans_b ? CblasTrans : CblasNoTrans,
                    (blasint)a->m, (blasint)a->n, (blasint)a->k, a->alpha,
                    x + b * a->stride_a, (blasint)a->lda, w + b * a->stride_b, (blasint)a->ldb,
                    0.0f, y + b * a->stride_c, (blasint)a->ldc);
}

/* One sgemm per batch member, the members shared out over the pool: each
 * output is summed exactly as a lone sgemm of that member would sum it, on
 * every run. */
static int gemm_batched_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_gemm_batched_args_t *a = args;
    if (a->batch <= 0) return 0;
    if (gemm_batched_check(a)) return -1;
    batched_job_t j = { .a = a, .per = a->batch };
    int threads = cpu_pool_threads();
    if (threads > 1 && a->batch > 1 && 2.0 * (double)a->m * (double)a->n * (double)a->k * (double)a->batch >= (double)CPU_GEMM_TILE_FLOPS)
        j.per = (a->batch + threads - 1) / threads;
    cpu_par_for((a->batch + j.per - 1) / j.per, batched_slice, &j);
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_GEMM, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "gemm_openblas", .fn = gemm_f32, .args_size = sizeof(kern_gemm_args_t),
      .workspace_bytes = NULL, .capturable = true },
    { .op = KERN_OP_GEMM_GELU, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "gemm_gelu_openblas", .fn = gemm_gelu_f32, .args_size = sizeof(kern_gemm_args_t),
      .workspace_bytes = NULL, .capturable = true },
    { .op = KERN_OP_GEMM_BATCHED, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "gemm_batched_openblas", .fn = gemm_batched_f32,
      .args_size = sizeof(kern_gemm_batched_args_t), .workspace_bytes = NULL,
      .capturable = true },
};

size_t kern_cpu_gemm_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}

void kern_cpu_blas_single(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    /* and its thread server stopped, whatever its count (OPENBLAS_NUM_THREADS
     * =1 starts the server with no thread); once stopped the call returns
     * at once. A build without it (OpenMP, serial) has no server. It is the
     * call OpenBLAS's own fork handler makes. */
    int (*stop)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "blas_thread_shutdown_");
    if (stop) stop();
}

/* OpenBLAS's pthreads build starts cores − 1 threads of its own when it
 * loads, before main, and each spins on sched_yield for about 0.1 s (2^28
 * cycles) waiting for work before it sleeps: in every Reel process, one
 * that never multiplies a matrix too, and 63 threads on a 64-core machine,
 * taking the cores from whatever else runs. Reel never gives them work
 * (OpenBLAS runs single-threaded inside the pool, and a sum's bits must
 * not depend on the machine's cores), so this process's start makes
 * OpenBLAS single-threaded and stops them (kern_cpu_blas_single): the
 * executable's constructors run after its libraries'. A LoRA merge into
 * host weights (model/lora.c) therefore runs on one thread on every host,
 * a CUDA worker's too: its bits do not depend on the host's cores. */
__attribute__((constructor)) static void blas_threads_stop(void) { kern_cpu_blas_single(); }
