/* cpu_vec.c -- the out-of-line, runtime-dispatched faces of cpu_vmath.h:
 * each is compiled for AVX-512, AVX2 and baseline x86-64 (CPU_VEC_DISPATCH)
 * and computes the same bits on all three (cpu_vmath.h says why); and the
 * cache of RoPE tables (cpu_arith.h). The CPU kernels call these; none can
 * fail (an allocation that fails leaves a table uncached). */
#include "cpu_arith.h"
#include "cpu_attn.h"
#include "cpu_vmath.h"
#include <pthread.h>
#include <stdlib.h>

CPU_VEC_DISPATCH void cpu_vec_gelu_tanh(float *y, const float *x, int64_t n) { cpu_gelu_tanh_n(y, x, n); }

CPU_VEC_DISPATCH void cpu_vec_silu(float *y, const float *x, int64_t n) { cpu_silu_n(y, x, n); }

CPU_VEC_DISPATCH void cpu_vec_exp(float *y, const float *x, int64_t n) { cpu_exp_n(y, x, n); }

/* The kernels whose loops carry 16-float sums have two forms with the same
 * bits, dispatched by the CPU's level (CPU_BY_LEVEL_FNS, cpu_vmath.h). */
#define SOFTMAX_PARAMS (float *p, int64_t ldp, const float *s, int64_t lds, int64_t rows, int64_t n, float scale)
CPU_BY_LEVEL_FNS(softmax, SOFTMAX_PARAMS,
             for (int64_t r = 0; r < rows; r++) cpu_softmax_row(p + r * ldp, s + r * lds, n, scale),
             for (int64_t r = 0; r < rows; r++) cpu_softmax_row_h(p + r * ldp, s + r * lds, n, scale))

#define FLASH_PARAMS (float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l, float *c)
CPU_BY_LEVEL_FNS(flash, FLASH_PARAMS, cpu_flash_rows(s, lds, rows, n, m, l, c),
                 cpu_flash_rows_h(s, lds, rows, n, m, l, c))

#define DIRECT_PARAMS                                                                                          \
    (const float *q, const float *k, const float *v, float *o, int64_t rows, int64_t nk, int64_t d, int64_t ld, \
     float scale, bool softmax)
CPU_BY_LEVEL_FNS(direct, DIRECT_PARAMS, cpu_attn_direct_do(q, k, v, o, rows, nk, d, ld, scale, softmax),
             cpu_attn_direct_do_h(q, k, v, o, rows, nk, d, ld, scale, softmax))

void cpu_vec_softmax_rows(float *p, int64_t ldp, const float *s, int64_t lds, int64_t rows, int64_t n,
                          float scale) {
    CPU_BY_LEVEL(softmax, (p, ldp, s, lds, rows, n, scale));
}

void cpu_vec_flash_rows(float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l, float *c) {
    CPU_BY_LEVEL(flash, (s, lds, rows, n, m, l, c));
}

void cpu_vec_attn_direct(const float *q, const float *k, const float *v, float *o, int64_t rows, int64_t nk,
                         int64_t d, int64_t ld, float scale) {
    CPU_BY_LEVEL(direct, (q, k, v, o, rows, nk, d, ld, scale, true));
}

void cpu_vec_attn_direct_products(const float *q, const float *k, const float *v, float *o, int64_t rows,
                                  int64_t nk, int64_t d, int64_t ld, float scale) {
    CPU_BY_LEVEL(direct, (q, k, v, o, rows, nk, d, ld, scale, false));
}

/* Tables computed once and kept for the process, never freed or moved, so
 * a pointer handed out stays valid for every thread (cpu_arith.h): RoPE
 * tables by shape, timestep frequencies by half-width. TABLES at most;
 * later ones are computed by their callers each call. */
#define TABLES 40
typedef enum { TABLE_ROPE, TABLE_FREQ } table_kind_t;
static struct { table_kind_t kind; int64_t k[4]; const double *tab; } tables[TABLES];
static int tables_n;
static pthread_mutex_t tables_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* tables_mu is held across a fork, so the child's copy is never mid-fill. */
static void tables_lock(void) { pthread_mutex_lock(&tables_mu); }
static void tables_unlock(void) { pthread_mutex_unlock(&tables_mu); }
static void tables_atfork(void) { pthread_atfork(tables_lock, tables_unlock, tables_unlock); }

/* The table of (kind, k), filled by fill into bytes on first use; NULL when
 * the cache is full or out of memory. */
static const double *table_cached(table_kind_t kind, const int64_t k[4], size_t bytes,
                                  void (*fill)(double *tab, const int64_t k[4])) {
    const double *hit = NULL;
    pthread_once(&tables_once, tables_atfork);
    pthread_mutex_lock(&tables_mu);
    for (int i = 0; i < tables_n && !hit; i++)
        if (tables[i].kind == kind && !memcmp(tables[i].k, k, sizeof tables[i].k)) hit = tables[i].tab;
    if (!hit && tables_n < TABLES) {
        double *tab = bytes ? malloc(bytes) : NULL;
        if (tab) {
            fill(tab, k);
            tables[tables_n].kind = kind;
            memcpy(tables[tables_n].k, k, sizeof tables[tables_n].k);
            tables[tables_n].tab = tab;
            tables_n++;
            hit = tab;
        }
    }
    pthread_mutex_unlock(&tables_mu);
    return hit;
}

static void rope_fill(double *tab, const int64_t k[4]) { cpu_rope_fill_all(tab, k[0], k[1], k[2], k[3]); }

const double *cpu_rope_cached(int64_t head_dim, int64_t frames, int64_t rows, int64_t cols) {
    const int64_t k[4] = { head_dim, frames, rows, cols };
    return table_cached(TABLE_ROPE, k, cpu_rope_table_bytes(head_dim, frames, rows, cols), rope_fill);
}

static void freq_fill(double *tab, const int64_t k[4]) {
    for (int64_t j = 0; j < k[0]; j++) tab[j] = cpu_freq(j, k[0]);
}

const double *cpu_freq_cached(int64_t h) {
    const int64_t k[4] = { h, 0, 0, 0 };
    return h > 0 ? table_cached(TABLE_FREQ, k, (size_t)h * sizeof(double), freq_fill) : NULL;
}
