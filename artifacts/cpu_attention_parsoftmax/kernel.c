/* kernel.c -- artifact cpu-attention-parsoftmax: the fused attention on
 * the CPU with its row softmax spread over every core.
 *
 * The native kernel (kernels/cpu/ops_attention.c, plan and arithmetic in
 * kernels/cpu/cpu_attn.h) takes, below 2^20 scores per head, as many
 * queries per head as fit 2 MiB of scores; for each block one sgemm makes
 * the scores, a row softmax turns them into weights, and a second sgemm
 * writes the outputs, up to 8 (head, block) items at once on its thread
 * pool. Here the blocks and the sgemm calls are the native kernel's
 * exactly, one block at a time, and the softmax of a block runs in slices
 * of rows on one thread per core (an example of an artifact, no longer
 * faster than the native kernel). From 2^20 scores per head on, the native
 * kernel goes flash-style; so does this one, through the same
 * cpu_attn_flash_item, one item at a time; and up to 64 keys and head
 * width both go direct, through the same cpu_attn_direct_rows. Every row goes through the same
 * operations in the same order, so the manifest asks for byte_equal.
 * Blocks under 512 Ki scores stay on the calling thread (the threads cost
 * more than they save there); a thread that cannot be started is not a
 * failure: its rows run inline. */
#include "kernels/artifact_abi.h"
#include "kernels/cpu/cpu_attn.h"
#include "kernels/cpu/cpu_vmath.h"
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>

const uint32_t reel_artifact_abi = KERN_ART_OBJECT_ABI;
static int (*fail)(const char *fmt, ...);
static long cpus = 1; /* cores online, read once at init (sysconf reads a file) */

#define MAX_THREADS 16
#define MIN_PARALLEL ((int64_t)1 << 19)

static size_t workspace(const void *args) {
    const kern_attention_args_t *a = args;
    switch (cpu_attn_way(a->nq, a->nk, a->head_dim)) {
    case CPU_ATTN_DIRECT: return 0;
    case CPU_ATTN_FLASH: return CPU_ATTN_FLASH_LANE_BYTES;
    default: return (size_t)(cpu_attn_block_rows(a->nq, a->nk) * a->nk) * sizeof(float);
    }
}

/* The native direct rows, flash rows and row softmax, compiled here the
 * same way: each form for its own CPU level (cpu_vmath.h). */
#define DIRECT_PARAMS                                                                                          \
    (const float *q, const float *k, const float *v, float *o, int64_t rows, int64_t nk, int64_t d, int64_t ld, \
     float scale)
CPU_BY_LEVEL_FNS(direct_level, DIRECT_PARAMS, cpu_attn_direct_rows(q, k, v, o, rows, nk, d, ld, scale),
                 cpu_attn_direct_rows_h(q, k, v, o, rows, nk, d, ld, scale))

static void direct_rows(const float *q, const float *k, const float *v, float *o, int64_t rows, int64_t nk,
                        int64_t d, int64_t ld, float scale) {
    CPU_BY_LEVEL(direct_level, (q, k, v, o, rows, nk, d, ld, scale));
}

#define FLASH_PARAMS (float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l, float *c)
CPU_BY_LEVEL_FNS(flash_level, FLASH_PARAMS, cpu_flash_rows(s, lds, rows, n, m, l, c),
                 cpu_flash_rows_h(s, lds, rows, n, m, l, c))

static void flash_rows(float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l, float *c) {
    CPU_BY_LEVEL(flash_level, (s, lds, rows, n, m, l, c));
}

/* The native row softmax: cpu_vmath.h's, the same bits on any ISA. */
CPU_BY_LEVEL_FNS(softmax_level, (float *s, int64_t rows, int64_t n),
                 for (int64_t i = 0; i < rows; i++) cpu_softmax_row(s + i * n, s + i * n, n, 1.0f),
                 for (int64_t i = 0; i < rows; i++) cpu_softmax_row_h(s + i * n, s + i * n, n, 1.0f))

static void softmax_rows(float *s, int64_t rows, int64_t n) { CPU_BY_LEVEL(softmax_level, (s, rows, n)); }

typedef struct { float *s; int64_t rows, n; } slice_t;

static void *softmax_slice(void *p) {
    const slice_t *sl = p;
    softmax_rows(sl->s, sl->rows, sl->n);
    return NULL;
}

static void softmax_par(float *s, int64_t rows, int64_t n) {
    int p = rows * n < MIN_PARALLEL || cpus < 2 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
    if (p > rows) p = (int)rows;
    slice_t sl[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = { false };
    for (int t = 0; t < p; t++) {
        int64_t lo = rows * t / p, hi = rows * (t + 1) / p;
        sl[t] = (slice_t){ s + lo * n, hi - lo, n };
        if (t > 0) started[t] = pthread_create(&th[t], NULL, softmax_slice, &sl[t]) == 0;
    }
    softmax_slice(&sl[0]);
    for (int t = 1; t < p; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else softmax_slice(&sl[t]);
    }
}

static int attention_one(const kern_attention_args_t *a) {
    const int64_t nq = a->nq, nk = a->nk, H = a->heads, d = a->head_dim, ld = H * d;
    if (nq <= 0 || H <= 0 || d <= 0) return 0;
    if (nk <= 0) return fail("attention_parsoftmax: no keys");
    if (nq > INT_MAX || nk > INT_MAX || ld > INT_MAX)
        return fail("attention_parsoftmax: nq=%lld nk=%lld width=%lld exceed the BLAS int range",
                    (long long)nq, (long long)nk, (long long)ld);
    if (workspace(a) && (!a->hdr.scratch || a->hdr.scratch_bytes < workspace(a)))
        return fail("attention_parsoftmax: scratch of %zu bytes, needs %zu", a->hdr.scratch_bytes, workspace(a));
    float *s = a->hdr.scratch;
    const float *q = a->q, *k = a->k, *v = a->v;
    float *o = a->o;
    if (cpu_attn_direct(nk, d)) { /* the native rows, here all of a head at once */
        for (int64_t h = 0; h < H; h++) direct_rows(q + h * d, k + h * d, v + h * d, o + h * d, nq, nk, d, ld, a->scale);
        return 0;
    }
    if (cpu_attn_flash(nq, nk)) {
        for (int64_t h = 0; h < H; h++)
            for (int64_t i0 = 0; i0 < nq; i0 += CPU_ATTN_FLASH_BQ) {
                const int64_t m = nq - i0 < CPU_ATTN_FLASH_BQ ? nq - i0 : CPU_ATTN_FLASH_BQ;
                cpu_attn_flash_item(q + i0 * ld + h * d, k + h * d, v + h * d, o + i0 * ld + h * d, m, nk, d, ld,
                                    a->scale, s, flash_rows);
            }
        return 0;
    }
    const int64_t rows = cpu_attn_block_rows(nq, nk);
    for (int64_t h = 0; h < H; h++) {
        for (int64_t i0 = 0; i0 < nq; i0 += rows) {
            const int64_t m = nq - i0 < rows ? nq - i0 : rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)nk,
                        (blasint)d, a->scale, q + i0 * ld + h * d, (blasint)ld, k + h * d,
                        (blasint)ld, 0.0f, s, (blasint)nk);
            softmax_par(s, m, nk);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)d,
                        (blasint)nk, 1.0f, s, (blasint)nk, v + h * d, (blasint)ld, 0.0f,
                        o + i0 * ld + h * d, (blasint)ld);
        }
    }
    return 0;
}

/* A batch (ABI 3: kern_attention_args_t.batch) is its samples one after
 * another, each exactly as a call of its own. */
static int attention_par(void *ctx, const void *args) {
    (void)ctx;
    const kern_attention_args_t *a = args;
    const int64_t ld = a->heads * a->head_dim;
    for (int64_t b = 0; b < (a->batch > 1 ? a->batch : 1); b++) {
        kern_attention_args_t one = *a;
        const int64_t kb = a->kv_shared ? 0 : b * a->nk * ld;
        one.q = (const float *)a->q + b * a->nq * ld;
        one.o = (float *)a->o + b * a->nq * ld;
        one.k = (const float *)a->k + kb;
        one.v = (const float *)a->v + kb;
        one.batch = 1;
        if (attention_one(&one)) return -1;
    }
    return 0;
}

int reel_artifact_init(const kern_art_host_t *host) {
    fail = host->fail;
    cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const kern_impl_t impl = {
        .op = KERN_OP_ATTENTION, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
        .name = "attention_parsoftmax_cpu", .fn = attention_par,
        .args_size = sizeof(kern_attention_args_t), .workspace_bytes = workspace,
        .capturable = true,
    };
    return host->register_kernel(host->reg, &impl);
}
