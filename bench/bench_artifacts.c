/* bench_artifacts.c -- the example kernel artifacts (BUILD/artifacts, `make
 * artifacts`) against the native kernels they replace, per shape, in one
 * run: median time of each (the artifact promoted by its parity gate
 * first, timing off), their ratio, the cost of shadow timing (every call
 * runs both kernels and compares) over timing off, and a whole denoising
 * step of the small model eager and replayed, native vs with the
 * artifacts. CPU only (the CUDA bundles have not run on a device yet).
 *
 *   bench_artifacts BUILD */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "kernels/artifacts.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "model/loop.h"
#include "model/tinydit.h"
#include "bench/bench.h"
#include "bench/bench_step.h"

#define REPS 7
#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, ": %s\n", reel_err_text()); exit(1); } while (0)

typedef int (*call_fn)(void *ctx);

/* Median seconds per call of f, inner iterations sized to ~20 ms. */
static double median(call_fn f, void *ctx, kern_stream_t *s) {
    int inner = 1;
    for (;;) {
        double t0 = bench_now();
        for (int i = 0; i < inner; i++) if (f(ctx)) DIE("call");
        kern_stream_sync(s);
        if (bench_now() - t0 > 0.02 || inner > (1 << 16)) break;
        inner *= 2;
    }
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = bench_now();
        for (int i = 0; i < inner; i++) f(ctx);
        kern_stream_sync(s);
        t[r] = (bench_now() - t0) / inner;
    }
    qsort(t, REPS, sizeof *t, bench_cmp_double);
    return t[REPS / 2];
}

static void fill(kern_tensor_t *t, uint64_t seed) {
    tdit_initial_latent(seed, t->data, (size_t)kern_tensor_numel(t));
    float *h = t->data;
    for (int64_t i = 0; i < kern_tensor_numel(t); i++) h[i] *= 0.1f;
}

typedef struct {
    kern_stream_t *s;
    kern_tensor_t a, b, c, out;
    int64_t heads;
} op_t;

static int run_gemm_gelu(void *ctx) {
    op_t *o = ctx;
    return kern_gemm_gelu(o->s, &o->a, &o->b, &o->c, &o->out);
}

static int run_attention(void *ctx) {
    op_t *o = ctx;
    const kern_attn_opts_t fused = { .path = KERN_ATTN_FUSED, .block_bytes = 0 };
    return kern_attention_ex(o->s, &o->a, &o->b, &o->c, o->heads, &o->out, &fused);
}

/* Native, artifact (off) and artifact under shadow timing at one shape. */
static void bench_op(kern_artifacts_t *off, kern_artifacts_t *shadow, const char *id,
                     call_fn f, op_t *o, const char *shape) {
    double tn = median(f, o, o->s);
    if (kern_artifacts_install(off, KERN_ART_TIMING_OFF)) DIE("install");
    if (f(o)) DIE("parity run");
    kern_art_key_stats_t ks[64];
    size_t n = kern_artifacts_keys(off, ks, 64);
    const kern_art_key_stats_t *k = n && n <= 64 ? &ks[n - 1] : NULL;
    if (!k || k->state != KERN_ART_PROMOTED) {
        kern_artifacts_uninstall(off);
        printf("%-24s %-34s native %9.3f ms; artifact not promoted: %s\n", id, shape, tn * 1e3,
               k ? k->reason : "no key");
        return;
    }
    double ta = median(f, o, o->s);
    kern_artifacts_uninstall(off);
    if (kern_artifacts_install(shadow, KERN_ART_TIMING_SHADOW)) DIE("install");
    if (f(o)) DIE("parity run");
    double ts = median(f, o, o->s);
    kern_artifacts_uninstall(shadow);
    printf("%-24s %-34s native %9.3f ms, artifact %9.3f ms, native/artifact %.3fx; shadow timing "
           "%9.3f ms per call (%.2fx the artifact alone)\n", id, shape, tn * 1e3, ta * 1e3,
           tn / ta, ts * 1e3, ts / ta);
}

static void gemm_gelu_case(kern_backend_t *be, kern_artifacts_t *off, kern_artifacts_t *sh,
                           int64_t M, int64_t N, int64_t K) {
    op_t o = { .s = kern_stream_new(be) };
    o.a = kern_tensor_alloc(be, KERN_F32, 2, (int64_t[]){ M, K });
    o.b = kern_tensor_alloc(be, KERN_F32, 2, (int64_t[]){ N, K });
    o.c = kern_tensor_alloc(be, KERN_F32, 1, (int64_t[]){ N });
    o.out = kern_tensor_alloc(be, KERN_F32, 2, (int64_t[]){ M, N });
    fill(&o.a, 1), fill(&o.b, 2), fill(&o.c, 3);
    char shape[64];
    snprintf(shape, sizeof shape, "M=%lld N=%lld K=%lld", (long long)M, (long long)N, (long long)K);
    const char *region = kern_artifacts_set_region("block.ffn"); /* where its manifest ("ffn") applies */
    bench_op(off, sh, "cpu-gemm-gelu-epilogue", run_gemm_gelu, &o, shape);
    kern_artifacts_set_region(region);
    kern_free(be, o.a.data), kern_free(be, o.b.data), kern_free(be, o.c.data), kern_free(be, o.out.data);
    kern_stream_destroy(&o.s);
}

static void attention_case(kern_backend_t *be, kern_artifacts_t *off, kern_artifacts_t *sh,
                           int64_t nq, int64_t nk, int64_t H, int64_t d) {
    op_t o = { .s = kern_stream_new(be), .heads = H };
    o.a = kern_tensor_alloc(be, KERN_F32, 2, (int64_t[]){ nq, H * d });
    o.b = kern_tensor_alloc(be, KERN_F32, 2, (int64_t[]){ nk, H * d });
    o.c = kern_tensor_alloc(be, KERN_F32, 2, (int64_t[]){ nk, H * d });
    o.out = kern_tensor_alloc(be, KERN_F32, 2, (int64_t[]){ nq, H * d });
    fill(&o.a, 4), fill(&o.b, 5), fill(&o.c, 6);
    char shape[64];
    snprintf(shape, sizeof shape, "nq=%lld nk=%lld H=%lld d=%lld", (long long)nq, (long long)nk,
             (long long)H, (long long)d);
    const char *region = kern_artifacts_set_region("block.self_attn"); /* its manifest: "attention" */
    bench_op(off, sh, "cpu-attention-parsoftmax", run_attention, &o, shape);
    kern_artifacts_set_region(region);
    kern_free(be, o.a.data), kern_free(be, o.b.data), kern_free(be, o.c.data), kern_free(be, o.out.data);
    kern_stream_destroy(&o.s);
}

/* A CFG step of the small model at 512 tokens (its FFN output is past the
 * GELU example's threshold; its attentions are under the softmax one's):
 * eager and graph replay, median of STEP_REPS. */
#define STEP_REPS 3
static void step_times(kern_backend_t *be, tdit_model_t *m, double *eager, double *replay) {
    kern_stream_t *s = kern_stream_new(be);
    tdit_shape_t sh = { 4, 16, 32, 16, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    tdit_ws_t *ws = bench_step_ws(m, s, &sh);
    if (!ws) DIE("workspace");
    if (tdit_step(m, ws, s) || tdit_step(m, ws, s)) DIE("warmup"); /* decides every key */
    kern_graph_t *g = NULL;
    if (kern_capture_begin(s) || tdit_step(m, ws, s) || kern_capture_end(s, &g)) DIE("capture");
    double te[STEP_REPS], tg[STEP_REPS];
    for (int r = 0; r < STEP_REPS; r++) {
        double t0 = bench_now();
        if (tdit_step(m, ws, s)) DIE("step");
        kern_stream_sync(s);
        te[r] = bench_now() - t0;
        t0 = bench_now();
        if (kern_graph_replay(g, s)) DIE("replay");
        kern_stream_sync(s);
        tg[r] = bench_now() - t0;
    }
    qsort(te, STEP_REPS, sizeof *te, bench_cmp_double);
    qsort(tg, STEP_REPS, sizeof *tg, bench_cmp_double);
    *eager = te[STEP_REPS / 2];
    *replay = tg[STEP_REPS / 2];
    kern_graph_destroy(&g);
    tdit_ws_destroy(&ws);
    kern_stream_destroy(&s);
}

int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "build";
    char root[512];
    snprintf(root, sizeof root, "%s/artifacts", build);
    kern_artifacts_t *off = kern_artifacts_scan(root), *sh = kern_artifacts_scan(root);
    if (!off || !sh) DIE("scan %s", root);
    if (kern_artifacts_enable_list(off, "cpu-gemm-gelu-epilogue,cpu-attention-parsoftmax") ||
        kern_artifacts_enable_list(sh, "cpu-gemm-gelu-epilogue,cpu-attention-parsoftmax"))
        DIE("enable (make artifacts builds them)");
    kern_backend_t *be = kern_backend_cpu_new();
    printf("artifacts vs native on %s (median of %d; shadow = both kernels + comparison per call)\n",
           kern_backend_arch(be), REPS);
    /* The FFN's GEMM+GELU of the tiny and small models' step shapes, then
     * larger rows (Wan's FFN at fewer tokens). */
    static const int64_t gg[][3] = { { 32, 128, 64 }, { 1024, 1024, 384 }, { 4096, 1024, 384 },
                                     { 2048, 8960, 256 } };
    for (size_t i = 0; i < sizeof gg / sizeof gg[0]; i++)
        gemm_gelu_case(be, off, sh, gg[i][0], gg[i][1], gg[i][2]);
    /* The CPU attention kernel (named: AUTO takes it too on the CPU; from
     * 2^20 scores a head it and the artifact go flash-style). */
    static const int64_t at[][4] = { { 32, 32, 4, 16 }, { 1000, 600, 6, 64 }, { 1024, 1024, 6, 64 },
                                     { 2048, 2048, 6, 64 } };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
        attention_case(be, off, sh, at[i][0], at[i][1], at[i][2], at[i][3]);

    char dir[] = "/tmp/reel-bench-art.XXXXXX", wpath[64];
    if (!mkdtemp(dir)) DIE("mkdtemp");
    snprintf(wpath, sizeof wpath, "%s/small.safetensors", dir);
    tdit_config_t c;
    if (tdit_config_builtin("small", &c) || tdit_weights_init(&c, 3, wpath)) DIE("weights");
    tdit_model_t *m = tdit_model_load_path(be, wpath, KERN_F32);
    if (!m) DIE("load");
    double ne, nr, ae, ar;
    step_times(be, m, &ne, &nr);
    if (kern_artifacts_install(off, KERN_ART_TIMING_OFF)) DIE("install");
    step_times(be, m, &ae, &ar);
    kern_artifacts_uninstall(off);
    printf("step small latent [16,4,16,32] L=16 CFG: eager native %.3f ms, with artifacts %.3f ms "
           "(%.3fx); replay native %.3f ms, with artifacts %.3f ms (%.3fx)\n", ne * 1e3, ae * 1e3,
           ne / ae, nr * 1e3, ar * 1e3, nr / ar);
    tdit_model_destroy(&m);
    unlink(wpath);
    rmdir(dir);
    kern_artifacts_destroy(&off);
    kern_artifacts_destroy(&sh);
    kern_backend_destroy(&be);
    return 0;
}
