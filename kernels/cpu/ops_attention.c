/* ops_attention.c -- multi-head softmax(q·kᵀ·scale)·v on the CPU, for
 * every size: direct (no BLAS, no scratch) up to 64 keys and head width,
 * else whole rows of scores below 2^20 scores per head, flash-style (one
 * pass over key blocks with a running max and sum) from there on
 * (cpu_attn.h has the plan and the arithmetic, shared with the CPU
 * attention artifact). OpenBLAS computes the scores from the strided head
 * slices (leading dimension heads·head_dim, no repacking) and writes the
 * outputs straight into o's head slice; the (head, query block) items run
 * on the pool (cpu_pool.h), up to a fixed number of lanes, each lane with
 * its own scratch: for whole rows 8 lanes of at most 2 MiB of scores (or
 * of one row, for rows longer than that), 64 lanes of 130 KiB for flash,
 * none direct. Blocks and lanes depend only on (nq, nk, heads, head_dim),
 * so a replay repeats the eager computation exactly, on any number of
 * threads; a pool with threads to spare may cut whole-row blocks smaller
 * where OpenBLAS computes them to the same bits (below). */
#include "../ops_args.h"
#include "base/error.h"
#include <limits.h>
#include "cpu_attn.h"
#include "ops_attention.h"
#include "cpu_pool.h"
#include "cpu_vmath.h"
#include "cpu_verdict.h"
#include <stdlib.h>
#include <string.h>

static size_t attention_workspace(const void *args) {
    const kern_attention_args_t *a = args;
    return cpu_attn_workspace(a->nq, a->nk, a->heads, a->head_dim);
}

typedef struct {
    const kern_attention_args_t *a;
    int64_t rows, blocks, lanes;
    int64_t items;  /* batch·heads·blocks */
    bool products;  /* the matrix products alone (kern_cpu_attention_products) */
} attn_job_t;

/* Item it of (sample, head, query block): sample b's q, k, v, o (k and v
 * the same for every sample when kv_shared), the head h and the block's
 * first query i0. Each sample's items are those of a call over its rows
 * alone. */
typedef struct {
    const float *q, *k, *v;
    float *o;
    int64_t h, i0;
} attn_item_t;

static inline attn_item_t attn_item(const attn_job_t *j, int64_t it) {
    const kern_attention_args_t *a = j->a;
    const int64_t per = a->heads * j->blocks, b = it / per, ld = a->heads * a->head_dim;
    it %= per;
    const int64_t kb = a->kv_shared ? 0 : b * a->nk * ld;
    attn_item_t x = { (const float *)a->q + b * a->nq * ld, (const float *)a->k + kb, (const float *)a->v + kb,
                      (float *)a->o + b * a->nq * ld, it / j->blocks, (it % j->blocks) * j->rows };
    return x;
}

/* m query rows of one head, whole rows: one sgemm for the scores into s
 * [m, nk], the row softmax (not for the products alone), one sgemm into
 * o's head slice. q, k, v, o at the head's first column, rows ld apart. */
static void rows_block(const float *q, const float *k, const float *v, float *o, float *s, int64_t m, int64_t nk,
                       int64_t d, int64_t ld, float scale, bool products) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)nk, (blasint)d, scale, q, (blasint)ld,
                k, (blasint)ld, 0.0f, s, (blasint)nk);
    if (!products) cpu_vec_softmax_rows(s, nk, s, nk, m, nk, 1.0f);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)d, (blasint)nk, 1.0f, s, (blasint)nk,
                v, (blasint)ld, 0.0f, o, (blasint)ld);
}

/* Whole rows, lane t: items t, t + lanes, ... of (head, query block). A
 * block's results do not depend on the lane or thread that computes it. */
static void attention_lane(void *ctx, int64_t t) {
    const attn_job_t *j = ctx;
    const kern_attention_args_t *a = j->a;
    const int64_t nq = a->nq, nk = a->nk, d = a->head_dim, ld = a->heads * d;
    float *s = (float *)a->hdr.scratch + t * j->rows * nk;
    for (int64_t it = t; it < j->items; it += j->lanes) {
        const attn_item_t x = attn_item(j, it);
        const int64_t h = x.h, i0 = x.i0;
        const int64_t m = nq - i0 < j->rows ? nq - i0 : j->rows;
        rows_block(x.q + i0 * ld + h * d, x.k + h * d, x.v + h * d, x.o + i0 * ld + h * d, s, m, nk, d, ld, a->scale,
                   j->products);
    }
}

/* Cutting whole-row blocks for idle threads. A pool with more threads
 * than a call has (head, query block) items (a 256-token model's
 * self-attention: one block a head, 6 items) cuts each block into 2 to 8
 * blocks of at least 64 rows where OpenBLAS computes a smaller block's
 * outputs the very bits of the whole block's, as the GEMM cuts its tiles
 * (ops_gemm.c): asked once per (block, cut) shape of the process on random
 * operands, never while a graph replays. The scratch is the same: cut f
 * ways, up to f times the lanes each take 1/f of a lane's scores. */
static cpu_verdicts_t cut_verdicts = CPU_VERDICTS_INIT;
static uint64_t cut_runs;

/* 1: rows query rows cut into f blocks give the whole block's outputs bit
 * for bit, three times on random operands, the scores scaled by the call's
 * scale (the first sgemm's alpha); 0: not; -1: no memory. */
static int cut_probe(int64_t rows, int64_t nk, int64_t d, int64_t ld, int64_t f, float scale) {
    const size_t nq_ = (size_t)(rows * ld), nkv = (size_t)(nk * ld);
    float *q = malloc(nq_ * sizeof *q), *k = malloc(nkv * sizeof *k), *v = malloc(nkv * sizeof *v);
    float *o1 = calloc(nq_, sizeof *o1), *o2 = calloc(nq_, sizeof *o2), *s = malloc((size_t)(rows * nk) * sizeof *s);
    int rc = -1;
    if (!q || !k || !v || !o1 || !o2 || !s) goto out;
    uint64_t seed = 0x2545f4914f6cdd1dull ^ (uint64_t)(rows * 977 + nk * 131 + d * 7 + f);
    const int64_t sub = rows / f;
    rc = 1;
    for (int round = 0; round < 3 && rc == 1; round++) {
        cpu_fill_random(q, nq_, &seed);
        cpu_fill_random(k, nkv, &seed);
        cpu_fill_random(v, nkv, &seed);
        rows_block(q, k, v, o1, s, rows, nk, d, ld, scale, false);
        for (int64_t b = 0; b < f; b++)
            rows_block(q + b * sub * ld, k, v, o2 + b * sub * ld, s, sub, nk, d, ld, scale, false);
        for (int64_t r = 0; r < rows && rc == 1; r++)
            if (memcmp(o1 + r * ld, o2 + r * ld, (size_t)d * sizeof(float)) != 0) rc = 0;
    }
out:
    free(q);
    free(k);
    free(v);
    free(o1);
    free(o2);
    free(s);
    return rc;
}

typedef struct {
    int64_t rows, nk, d, ld, f;
    float scale;
} cut_key_t;

static int cut_probe_fn(const void *ctx) {
    const cut_key_t *k = ctx;
    return cut_probe(k->rows, k->nk, k->d, k->ld, k->f, k->scale);
}

/* The cut (1, 2, 4 or 8) of j's whole-row blocks for a pool of T threads:
 * blocks of at least 64 rows, multiples of 16, every block full (nq a
 * multiple of the block), where OpenBLAS says the cut keeps the bits; 1 on
 * a pool of 2 or 3 (CPU_CUT_MIN_THREADS). */
static int64_t cut_choose(const attn_job_t *j, int64_t nq, int64_t nk, int64_t d, int64_t ld, int T) {
    if (!cpu_cut_wanted(j->items, T) || nq % j->rows) return 1;
    int64_t pick = 1;
    double pick_cost = cpu_cut_cost(j->items, 1, T);
    for (int64_t f = 2; f <= 8; f *= 2) {
        const int64_t sub = j->rows / f;
        if (j->rows % f || sub < 64 || sub % 16) continue;
        double c = cpu_cut_cost(j->items, f, T);
        if (c < pick_cost * 0.95) pick = f, pick_cost = c;
    }
    if (pick == 1) return 1;
    const cut_key_t k = { j->rows, nk, d, ld, pick, j->a->scale };
    uint32_t sbits;
    memcpy(&sbits, &k.scale, sizeof sbits);
    const int64_t key[CPU_VERDICT_KEY] = { k.rows, nk, d, ld, pick, (int64_t)sbits, 0, 0 };
    return cpu_verdict_ask(&cut_verdicts, key, cut_probe_fn, &k) ? pick : 1;
}

void kern_cpu_attention_cut_stats(uint64_t *runs, int *yes, int *no) {
    *runs = __atomic_load_n(&cut_runs, __ATOMIC_RELAXED);
    cpu_verdict_count(&cut_verdicts, yes, no);
}

void kern_cpu_attention_cut_forget(void) { cpu_verdict_forget(&cut_verdicts); }

/* cpu_attn_flash_item's two sgemm calls a key block, and nothing else. */
static void flash_products(const float *q, const float *k, const float *v, float *o, int64_t mq, int64_t nk,
                           int64_t d, int64_t ld, float scale, void *lane) {
    enum { BK = CPU_ATTN_FLASH_BK };
    float *s = lane;
    for (int64_t kb = 0; kb < nk; kb += BK) {
        const int64_t n = nk - kb < BK ? nk - kb : BK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)mq, (blasint)n, (blasint)d, scale, q,
                    (blasint)ld, k + kb * ld, (blasint)ld, 0.0f, s, (blasint)BK);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)mq, (blasint)d, (blasint)n, 1.0f, s,
                    (blasint)BK, v + kb * ld, (blasint)ld, kb ? 1.0f : 0.0f, o, (blasint)ld);
    }
}

/* Flash, lane t: items t, t + lanes, ... of (head, block of BQ queries). */
static void attention_flash_lane(void *ctx, int64_t t) {
    const attn_job_t *j = ctx;
    const kern_attention_args_t *a = j->a;
    const int64_t nq = a->nq, d = a->head_dim, ld = a->heads * d;
    void *lane = (char *)a->hdr.scratch + (size_t)t * CPU_ATTN_FLASH_LANE_BYTES;
    for (int64_t it = t; it < j->items; it += j->lanes) {
        const attn_item_t x = attn_item(j, it);
        const int64_t h = x.h, i0 = x.i0;
        const int64_t m = nq - i0 < j->rows ? nq - i0 : j->rows;
        if (j->products) {
            flash_products(x.q + i0 * ld + h * d, x.k + h * d, x.v + h * d, x.o + i0 * ld + h * d, m, a->nk, d, ld,
                           a->scale, lane);
            continue;
        }
        cpu_attn_flash_item(x.q + i0 * ld + h * d, x.k + h * d, x.v + h * d, x.o + i0 * ld + h * d, m, a->nk, d, ld,
                            a->scale, lane, cpu_vec_flash_rows);
    }
}

/* Direct, item t of (head, block of CPU_ATTN_DIRECT_ROWS queries). */
static void attention_direct_item(void *ctx, int64_t t) {
    const attn_job_t *j = ctx;
    const kern_attention_args_t *a = j->a;
    const int64_t nq = a->nq, d = a->head_dim, ld = a->heads * d;
    const attn_item_t x = attn_item(j, t);
    const int64_t h = x.h, i0 = x.i0;
    const int64_t m = nq - i0 < j->rows ? nq - i0 : j->rows;
    (j->products ? cpu_vec_attn_direct_products : cpu_vec_attn_direct)(
        x.q + i0 * ld + h * d, x.k + h * d, x.v + h * d, x.o + i0 * ld + h * d, m, a->nk, d, ld, a->scale);
}

/* Fails (o untouched) when there are no keys, the scratch is short, or a
 * size exceeds the BLAS int range. products: the matrix products alone. */
static int attention_run(const kern_attention_args_t *a, bool products) {
    int64_t nq = a->nq, nk = a->nk, H = a->heads, d = a->head_dim, ld = H * d;
    if (nq <= 0 || H <= 0 || d <= 0) return 0;
    if (nk <= 0) return reel_fail(REEL_E_INVALID, "attention_cpu: no keys");
    if (nq > INT_MAX || nk > INT_MAX || ld > INT_MAX)
        return reel_fail(REEL_E_INVALID, "attention_cpu: nq=%lld nk=%lld width=%lld exceed the BLAS int range",
                         (long long)nq, (long long)nk, (long long)ld);
    size_t need = attention_workspace(a);
    if (need && (!a->hdr.scratch || a->hdr.scratch_bytes < need))
        return reel_fail(REEL_E_INVALID, "attention_cpu: scratch of %zu bytes, needs %zu", a->hdr.scratch_bytes,
                         need);
    const cpu_attn_way_t way = cpu_attn_way(nq, nk, d);
    attn_job_t j = { .a = a, .rows = cpu_attn_item_rows(nq, nk, d), .products = products };
    if (j.rows > nq) j.rows = nq;
    j.blocks = (nq + j.rows - 1) / j.rows;
    const int64_t batch = a->batch > 1 ? a->batch : 1;
    j.items = batch * H * j.blocks;
    /* below about a million multiply-adds (the batch's) the threads cost
     * more than they save: one lane takes every item (lane 0's scratch) */
    const bool one = batch * nq * nk * ld < ((int64_t)1 << 20);
    if (way == CPU_ATTN_DIRECT) {
        if (one)
            for (int64_t t = 0; t < j.items; t++) attention_direct_item(&j, t);
        else
            cpu_par_for(j.items, attention_direct_item, &j);
        return 0;
    }
    j.lanes = one ? 1 : cpu_attn_lanes(nq, nk, H, d);
    if (!one && way == CPU_ATTN_ROWS) {
        const int64_t f = cut_choose(&j, nq, nk, d, ld, cpu_pool_threads());
        if (f > 1) {
            __atomic_fetch_add(&cut_runs, 1, __ATOMIC_RELAXED);
            j.rows /= f;
            j.blocks *= f;
            j.items *= f;
            j.lanes = j.items < j.lanes * f ? j.items : j.lanes * f; /* within the same scratch */
        }
    }
    cpu_par_for(j.lanes, way == CPU_ATTN_FLASH ? attention_flash_lane : attention_lane, &j);
    return 0;
}

static int attention_f32(void *ctx, const void *args) {
    (void)ctx;
    return attention_run(args, false);
}

int kern_cpu_attention_products(const void *args) {
    return attention_run(args, true);
}

/* ATTENTION_SDPA on the CPU is this same kernel: the reference a library's
 * fused attention (cuDNN on CUDA) is checked against. */
/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_ATTENTION, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "attention_cpu", .fn = attention_f32,
      .args_size = sizeof(kern_attention_args_t), .workspace_bytes = attention_workspace,
      .capturable = true },
    { .op = KERN_OP_ATTENTION_SDPA, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "attention_sdpa_cpu", .fn = attention_f32,
      .args_size = sizeof(kern_attention_args_t), .workspace_bytes = attention_workspace,
      .capturable = true },
};

size_t kern_cpu_attention_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
