/* bench_kernels.c -- kernel and step benchmarks, all numbers from one run:
 * GEMM GFLOP/s of the model's shapes against the OpenBLAS peak measured
 * here, attention time, one full denoising step eager vs graph replay.
 * CPU always; CUDA too when a GPU is usable (else one line says why). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/cpu/cpu_pool.h"
#include "model/loop.h"
#include "model/tinydit.h"
#include "bench/bench.h"
#include "bench/bench_step.h"

#define REPS 7
#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, ": %s\n", reel_err_text()); exit(1); } while (0)

static void fill(kern_stream_t *s, kern_tensor_t *t, uint64_t seed) {
    size_t n = (size_t)kern_tensor_numel(t);
    float *h = malloc(n * sizeof *h);
    tdit_initial_latent(seed, h, n);
    for (size_t i = 0; i < n; i++) h[i] *= 0.1f;
    if (kern_copy_h2d(s, kern_tensor_ptr(t), h, n * 4) || kern_stream_sync(s)) DIE("fill");
    free(h);
}

/* Median seconds of one gemm [M,K]x[N,K]^T through the dispatcher. */
static double time_gemm(kern_backend_t *b, kern_stream_t *s, int64_t M, int64_t N, int64_t K) {
    kern_tensor_t x = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ M, K });
    kern_tensor_t w = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ N, K });
    kern_tensor_t bias = kern_tensor_alloc(b, KERN_F32, 1, (int64_t[]){ N });
    kern_tensor_t y = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ M, N });
    fill(s, &x, 1); fill(s, &w, 2); fill(s, &bias, 3);
    double t[REPS];
    int inner = 1;
    for (;;) { /* enough inner iterations for ~20 ms */
        double t0 = bench_now();
        for (int i = 0; i < inner; i++) if (kern_gemm(s, &x, &w, &bias, &y)) DIE("gemm");
        kern_stream_sync(s);
        if (bench_now() - t0 > 0.02 || inner > (1 << 20)) break;
        inner *= 2;
    }
    for (int r = 0; r < REPS; r++) {
        double t0 = bench_now();
        for (int i = 0; i < inner; i++) kern_gemm(s, &x, &w, &bias, &y);
        kern_stream_sync(s);
        t[r] = (bench_now() - t0) / inner;
    }
    qsort(t, REPS, sizeof *t, bench_cmp_double);
    kern_free(b, x.data); kern_free(b, w.data); kern_free(b, bias.data); kern_free(b, y.data);
    return t[REPS / 2];
}

static double time_attention(kern_backend_t *b, kern_stream_t *s, int64_t n, int64_t D, int64_t H) {
    kern_tensor_t q = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ n, D });
    kern_tensor_t k = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ n, D });
    kern_tensor_t v = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ n, D });
    kern_tensor_t o = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ n, D });
    fill(s, &q, 4); fill(s, &k, 5); fill(s, &v, 6);
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = bench_now();
        for (int i = 0; i < 5; i++) if (kern_attention(s, &q, &k, &v, H, &o)) DIE("attention");
        kern_stream_sync(s);
        t[r] = (bench_now() - t0) / 5;
    }
    qsort(t, REPS, sizeof *t, bench_cmp_double);
    kern_free(b, q.data); kern_free(b, k.data); kern_free(b, v.data); kern_free(b, o.data);
    return t[REPS / 2];
}

/* Median seconds of one attention of nq queries over nk keys (H heads of
 * d) by the given path, and the scratch it asked for. */
static double time_attention_path(kern_backend_t *b, kern_stream_t *s, int64_t nq, int64_t nk, int64_t H,
                                  int64_t d, kern_attn_path_t path, size_t *scratch) {
    kern_tensor_t q = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ nq, H * d });
    kern_tensor_t k = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ nk, H * d });
    kern_tensor_t v = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ nk, H * d });
    kern_tensor_t o = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ nq, H * d });
    fill(s, &q, 4); fill(s, &k, 5); fill(s, &v, 6);
    kern_attn_opts_t opts = { path, 0, false };
    kern_attn_plan_t p;
    if (kern_attention_plan(kern_backend_kind(b), KERN_F32, nq, nk, H, d, &opts, &p)) DIE("attention plan");
    *scratch = p.scratch_bytes;
    if (kern_attention_ex(s, &q, &k, &v, H, &o, &opts)) DIE("attention"); /* warm */
    double t[3];
    for (int r = 0; r < 3; r++) {
        double t0 = bench_now();
        if (kern_attention_ex(s, &q, &k, &v, H, &o, &opts)) DIE("attention");
        kern_stream_sync(s);
        t[r] = bench_now() - t0;
    }
    qsort(t, 3, sizeof *t, bench_cmp_double);
    kern_free(b, q.data); kern_free(b, k.data); kern_free(b, v.data); kern_free(b, o.data);
    return t[1];
}

/* Long attention on the CPU: what AUTO takes now (the CPU kernel,
 * flash-style from 2^20 scores a head) against the decomposition AUTO took
 * before, side by side: Wan's head (12 × 128) at 1,024 and 4,096 tokens,
 * and a cross-attention of 4,096 tokens over 512 text rows. */
static void bench_long_attention(kern_backend_t *b) {
    static const int64_t shapes[][4] = { { 1024, 1024, 12, 128 }, { 4096, 4096, 12, 128 }, { 4096, 512, 12, 128 } };
    kern_stream_t *s = kern_stream_new(b);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t nq = shapes[i][0], nk = shapes[i][1], H = shapes[i][2], d = shapes[i][3];
        size_t sf, sd;
        double tf = time_attention_path(b, s, nq, nk, H, d, KERN_ATTN_FUSED, &sf);
        double td = time_attention_path(b, s, nq, nk, H, d, KERN_ATTN_DECOMPOSED, &sd);
        double gf = 4.0 * (double)nq * (double)nk * (double)(H * d) / 1e9;
        printf("attn-long nq=%-5lld nk=%-5lld H=%lld d=%lld: flash %9.2f ms (%6.2f GFLOP/s, scratch %6.2f MiB) "
               "decomposed %9.2f ms (%6.2f GFLOP/s, scratch %6.2f MiB) decomposed/flash %.2f\n",
               (long long)nq, (long long)nk, (long long)H, (long long)d, tf * 1e3, gf / tf, sf / 1048576.0,
               td * 1e3, gf / td, sd / 1048576.0, td / tf);
    }
    kern_stream_destroy(&s);
}

/* OpenBLAS peak on this machine: a large square sgemm called directly, on
 * OpenBLAS's own threads, one per core the pool uses (Reel runs it
 * single-threaded inside its pool: it is made so again after). */
static double blas_peak(void) {
    openblas_set_num_threads(kern_cpu_threads());
    const int n = 1024;
    float *a = calloc((size_t)n * n, 4), *bb = calloc((size_t)n * n, 4), *c = calloc((size_t)n * n, 4);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, bb, n, 0, c, n);
        double g = 2.0 * n * n * n / (bench_now() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(a); free(bb); free(c);
    kern_cpu_blas_single();
    return best;
}

typedef struct { const char *config; int64_t F, H, W, L; } step_case_t;

/* One full CFG step: eager vs replay of its captured graph, median ms. */
static void bench_step(kern_backend_t *b, const char *wpath, const step_case_t *sc) {
    kern_stream_t *s = kern_stream_new(b);
    tdit_model_t *m = tdit_model_load_path(b, wpath, KERN_F32);
    if (!m) DIE("load %s", wpath);
    tdit_shape_t sh = { sc->F, sc->H, sc->W, sc->L, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    tdit_ws_t *ws = bench_step_ws(m, s, &sh);
    if (!ws) DIE("workspace");
    const tdit_config_t *c = tdit_model_config(m);
    int iters = sc->L > 8 ? 3 : 20;
    double te[REPS], tg[REPS];
    if (tdit_step(m, ws, s)) DIE("warmup");
    kern_graph_t *g = NULL;
    double t0 = bench_now();
    if (kern_capture_begin(s) || tdit_step(m, ws, s) || kern_capture_end(s, &g)) DIE("capture");
    double tcap = bench_now() - t0;
    for (int r = 0; r < REPS; r++) {
        t0 = bench_now();
        for (int i = 0; i < iters; i++) tdit_step(m, ws, s);
        kern_stream_sync(s);
        te[r] = (bench_now() - t0) / iters;
        t0 = bench_now();
        for (int i = 0; i < iters; i++) kern_graph_replay(g, s);
        kern_stream_sync(s);
        tg[r] = (bench_now() - t0) / iters;
    }
    qsort(te, REPS, sizeof *te, bench_cmp_double);
    qsort(tg, REPS, sizeof *tg, bench_cmp_double);
    printf("step %-6s %-7s latent [%lld,%lld,%lld,%lld] L=%lld CFG: eager %8.3f ms, graph replay %8.3f ms, "
           "eager/replay %.3fx, %zu nodes, capture %.3f ms\n",
           sc->config, kern_backend_device_name(b), (long long)c->in_channels, (long long)sc->F,
           (long long)sc->H, (long long)sc->W, (long long)sc->L, te[REPS / 2] * 1e3, tg[REPS / 2] * 1e3,
           te[REPS / 2] / tg[REPS / 2], kern_graph_nodes(g), tcap * 1e3);
    kern_graph_destroy(&g);
    tdit_ws_destroy(&ws);
    tdit_model_destroy(&m);
    kern_stream_destroy(&s);
}

static void bench_backend(kern_backend_t *b, const char *dir) {
    kern_stream_t *s = kern_stream_new(b);
    static const char *configs[] = { "tiny", "small" };
    static const step_case_t steps[] = { { "tiny", 2, 8, 8, 5 }, { "small", 4, 16, 16, 16 } };
    for (int ci = 0; ci < 2; ci++) {
        tdit_config_t c;
        tdit_config_builtin(configs[ci], &c);
        int64_t N = steps[ci].F * (steps[ci].H / 2) * (steps[ci].W / 2);
        const int64_t shapes[3][3] = { { N, c.dim, c.dim }, { N, c.ffn_dim, c.dim }, { N, c.dim, c.ffn_dim } };
        for (int i = 0; i < 3; i++) {
            double t = time_gemm(b, s, shapes[i][0], shapes[i][1], shapes[i][2]);
            double gf = 2.0 * shapes[i][0] * shapes[i][1] * shapes[i][2] / t / 1e9;
            printf("gemm %-6s %-7s M=%-5lld N=%-5lld K=%-5lld %9.3f us %8.2f GFLOP/s\n", configs[ci],
                   kern_backend_device_name(b), (long long)shapes[i][0], (long long)shapes[i][1],
                   (long long)shapes[i][2], t * 1e6, gf);
        }
        double ta = time_attention(b, s, N, c.dim, c.heads);
        printf("attn %-6s %-7s N=%lld D=%lld H=%lld %9.3f us\n", configs[ci], kern_backend_device_name(b),
               (long long)N, (long long)c.dim, (long long)c.heads, ta * 1e6);
    }
    kern_stream_destroy(&s);
    for (int ci = 0; ci < 2; ci++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s.safetensors", dir, configs[ci]);
        bench_step(b, p, &steps[ci]);
    }
}

int main(void) {
    char dir[] = "/tmp/reel-bench.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    const char *configs[] = { "tiny", "small" };
    for (int i = 0; i < 2; i++) {
        tdit_config_t c;
        char p[256];
        tdit_config_builtin(configs[i], &c);
        snprintf(p, sizeof p, "%s/%s.safetensors", dir, configs[i]);
        if (tdit_weights_init(&c, 1, p)) DIE("weights init");
    }
    double peak = blas_peak();
    printf("openblas peak (sgemm 1024^3, direct call): %.2f GFLOP/s\n", peak);
    kern_backend_t *cpu = kern_backend_cpu_new();
    printf("cpu arch: %s\n", kern_backend_arch(cpu));
    bench_backend(cpu, dir);
    bench_long_attention(cpu);
    kern_backend_destroy(&cpu);
    kern_backend_t *gpu = kern_backend_cuda_new(0);
    if (!gpu) {
        printf("cuda: SKIP: %s\n", reel_err_text());
    } else {
        printf("cuda arch: %s\n", kern_backend_arch(gpu));
        bench_backend(gpu, dir);
        kern_backend_destroy(&gpu);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) != 0;
}
