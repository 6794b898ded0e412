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
 * are bitwise equal. y must not alias x or w. */
#include "../ops_args.h"
#include "base/error.h"
#include "cpu_gemm_tiles.h"
#include "cpu_pool.h"
#include "cpu_vmath.h"
#include <cblas.h>
#include <dlfcn.h>
#include <limits.h>
#include <string.h>

typedef struct {
    const kern_gemm_args_t *a;
    cpu_gemm_tiles_t t;
    bool gelu;
} gemm_job_t;

/* Tile i of y (cpu_gemm_tiles.h), then its GELU while in cache. */
static void gemm_tile(void *ctx, int64_t i) {
    const gemm_job_t *j = ctx;
    const kern_gemm_args_t *a = j->a;
    int64_t r0, c0, rows, cols;
    cpu_gemm_tile(a->x, a->w, a->bias, a->y, a->M, a->N, a->K, &j->t, i, &r0, &c0, &rows, &cols);
    if (j->gelu)
        for (int64_t r = r0; r < r0 + rows; r++) {
            float *y = (float *)a->y + r * a->N + c0;
            cpu_vec_gelu_tanh(y, y, cols);
        }
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
    if (2.0 * (double)M * (double)N * (double)K < (double)CPU_GEMM_TILE_FLOPS)
        for (int64_t i = 0; i < tiles; i++) gemm_tile(&j, i);
    else
        cpu_par_for(tiles, gemm_tile, &j);
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
