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
 * threads. */
#include "../ops_args.h"
#include "base/error.h"
#include <limits.h>
#include "cpu_attn.h"
#include "ops_attention.h"
#include "cpu_pool.h"
#include "cpu_vmath.h"

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

/* Whole rows, lane t: items t, t + lanes, ... of (head, query block), one
 * sgemm for the scores, the row softmax, one sgemm into o's head slice. A
 * block's results do not depend on the lane or thread that computes it. */
static void attention_lane(void *ctx, int64_t t) {
    const attn_job_t *j = ctx;
    const kern_attention_args_t *a = j->a;
    const int64_t nq = a->nq, nk = a->nk, d = a->head_dim, ld = a->heads * d;
    float *s = (float *)a->hdr.scratch + t * j->rows * nk;
    for (int64_t it = t; it < j->items; it += j->lanes) {
        const attn_item_t x = attn_item(j, it);
        const float *q = x.q, *k = x.k, *v = x.v;
        float *o = x.o;
        const int64_t h = x.h, i0 = x.i0;
        const int64_t m = nq - i0 < j->rows ? nq - i0 : j->rows;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)nk,
                    (blasint)d, a->scale, q + i0 * ld + h * d, (blasint)ld,
                    k + h * d, (blasint)ld, 0.0f, s, (blasint)nk);
        if (!j->products) cpu_vec_softmax_rows(s, nk, s, nk, m, nk, 1.0f);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)d,
                    (blasint)nk, 1.0f, s, (blasint)nk, v + h * d, (blasint)ld, 0.0f,
                    o + i0 * ld + h * d, (blasint)ld);
    }
}

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
