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

CPU_VEC_DISPATCH void cpu_vec_softmax_rows(float *p, int64_t ldp, const float *s, int64_t lds,
                                           int64_t rows, int64_t n, float scale) {
    for (int64_t r = 0; r < rows; r++) cpu_softmax_row(p + r * ldp, s + r * lds, n, scale);
}

CPU_VEC_DISPATCH void cpu_vec_flash_rows(float *s, int64_t lds, int64_t rows, int64_t n, float *m, double *l,
                                         float *c) {
    cpu_flash_rows(s, lds, rows, n, m, l, c);
}

CPU_VEC_DISPATCH void cpu_vec_attn_direct(const float *q, const float *k, const float *v, float *o, int64_t rows,
                                          int64_t nk, int64_t d, int64_t ld, float scale) {
    cpu_attn_direct_rows(q, k, v, o, rows, nk, d, ld, scale);
}

CPU_VEC_DISPATCH void cpu_vec_attn_direct_products(const float *q, const float *k, const float *v, float *o,
                                                   int64_t rows, int64_t nk, int64_t d, int64_t ld, float scale) {
    cpu_attn_direct_do(q, k, v, o, rows, nk, d, ld, scale, false);
}

/* RoPE tables by shape (cpu_arith.h): filled once, kept for the process,
 * never freed or moved, so a pointer handed out stays valid for every
 * thread. 32 shapes at most; later ones are filled per call. */
#define ROPE_CACHE 32
static struct { int64_t d, f, r, c; const double *tab; } rope_cache[ROPE_CACHE];
static int rope_cached_n;
static pthread_mutex_t rope_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t rope_once = PTHREAD_ONCE_INIT;

/* rope_mu is held across a fork, so the child's copy is never mid-fill. */
static void rope_lock(void) { pthread_mutex_lock(&rope_mu); }
static void rope_unlock(void) { pthread_mutex_unlock(&rope_mu); }
static void rope_atfork(void) { pthread_atfork(rope_lock, rope_unlock, rope_unlock); }

const double *cpu_rope_cached(int64_t head_dim, int64_t frames, int64_t rows, int64_t cols) {
    const double *hit = NULL;
    pthread_once(&rope_once, rope_atfork);
    pthread_mutex_lock(&rope_mu);
    for (int i = 0; i < rope_cached_n && !hit; i++)
        if (rope_cache[i].d == head_dim && rope_cache[i].f == frames && rope_cache[i].r == rows &&
            rope_cache[i].c == cols)
            hit = rope_cache[i].tab;
    if (!hit && rope_cached_n < ROPE_CACHE) {
        size_t bytes = cpu_rope_table_bytes(head_dim, frames, rows, cols);
        double *tab = bytes ? malloc(bytes) : NULL;
        if (tab) {
            cpu_rope_fill_all(tab, head_dim, frames, rows, cols);
            rope_cache[rope_cached_n].d = head_dim;
            rope_cache[rope_cached_n].f = frames;
            rope_cache[rope_cached_n].r = rows;
            rope_cache[rope_cached_n].c = cols;
            rope_cache[rope_cached_n].tab = tab;
            rope_cached_n++;
            hit = tab;
        }
    }
    pthread_mutex_unlock(&rope_mu);
    return hit;
}

/* Timestep frequencies by half-width (cpu_arith.h), under the RoPE cache's
 * lock: filled once, never freed or moved; 8 widths at most. */
#define FREQ_CACHE 8
static struct { int64_t h; const double *w; } freq_cache[FREQ_CACHE];
static int freq_cached_n;

const double *cpu_freq_cached(int64_t h) {
    const double *hit = NULL;
    if (h <= 0) return NULL;
    pthread_once(&rope_once, rope_atfork);
    pthread_mutex_lock(&rope_mu);
    for (int i = 0; i < freq_cached_n && !hit; i++)
        if (freq_cache[i].h == h) hit = freq_cache[i].w;
    if (!hit && freq_cached_n < FREQ_CACHE) {
        double *w = malloc((size_t)h * sizeof *w);
        if (w) {
            for (int64_t j = 0; j < h; j++) w[j] = cpu_freq(j, h);
            freq_cache[freq_cached_n].h = h;
            freq_cache[freq_cached_n].w = w;
            freq_cached_n++;
            hit = w;
        }
    }
    pthread_mutex_unlock(&rope_mu);
    return hit;
}
