/* bench_mix_step.c -- what a mixed batch (B different requests in one step,
 * issue 29) shares in one process: one CFG Euler step of tiny and small,
 * replayed from its captured graph, for a mixed workspace of B samples
 * against B single workspaces replayed one after another (the unbatched
 * worker's work for the same B requests on one stream), with each graph's
 * node count. Every sample has its own context, σ, guidance and latent.
 * batched/singles above 1 is the batch's gain. The pool is the default
 * (REEL_THREADS, else the cores). With `cuda`: on GPU 0 in BF16 (in the GPU
 * bundle, deploy/gpu-bundle.sh), where a small model's step is its
 * launches and the batch's one-launch ops are what it shares.
 * Usage: bench_mix_step [BUILD] [cuda] [tiny|small]... (both by default). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/error.h"
#include "bench/bench.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "model/loop.h"
#include "model/tinydit.h"

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, ": %s\n", reel_err_text()); exit(1); } while (0)

typedef struct {
    const char *label;
    int64_t F, H, W, L;
    int reps;
} mix_case_t;

static const mix_case_t cases[] = {
    { "tiny", 2, 8, 8, 32, 31 },
    { "small", 4, 16, 16, 16, 5 },
};

/* A workspace of B samples (mixed when B > 1), sample b bound to inputs of
 * its own (seeded by base + b). */
static tdit_ws_t *make_ws(tdit_model_t *m, kern_stream_t *s, const mix_case_t *mc, int64_t B, int base) {
    const tdit_config_t *c = tdit_model_config(m);
    tdit_shape_t sh = { mc->F, mc->H, mc->W, mc->L, true, B, TDIT_SOLVER_EULER, B > 1, TDIT_SOLVER_EULER };
    tdit_ws_t *ws = tdit_ws_new(m, s, &sh);
    if (!ws) DIE("workspace B=%lld", (long long)B);
    size_t nl = (size_t)(c->in_channels * mc->F * mc->H * mc->W), nc = (size_t)(mc->L * c->text_dim);
    float *lat = malloc(nl * 4), *ctx = malloc(nc * 4), *unc = malloc(nc * 4);
    if (!lat || !ctx || !unc) DIE("out of memory");
    for (int64_t b = 0; b < B; b++) {
        int k = base + (int)b;
        const float sig[3] = { 0.9f - 0.01f * (float)k, 0.8f - 0.01f * (float)k, 0.9f - 0.01f * (float)k };
        tdit_initial_latent((uint64_t)(100 + k), lat, nl);
        tdit_initial_latent((uint64_t)(200 + k), ctx, nc);
        tdit_initial_latent((uint64_t)(300 + k), unc, nc);
        int rc;
        if (B == 1)
            rc = tdit_ws_bind_latent(ws, s, lat, nl) || tdit_ws_bind_context(ws, s, ctx, nc, false) ||
                 tdit_ws_bind_context(ws, s, unc, nc, true) || tdit_ws_bind_step(ws, s, sig, 4.0f + (float)k);
        else
            rc = tdit_ws_bind_sample_latent(ws, s, b, lat, nl) ||
                 tdit_ws_bind_sample(ws, s, b, ctx, unc, nc, sig, 4.0f + (float)k);
        if (rc || kern_stream_sync(s)) DIE("bind sample %lld", (long long)b);
    }
    free(lat);
    free(ctx);
    free(unc);
    return ws;
}

static kern_graph_t *capture(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s) {
    kern_graph_t *g = NULL;
    if (tdit_step(m, ws, s)) DIE("warmup");
    if (kern_capture_begin(s) || tdit_step(m, ws, s) || kern_capture_end(s, &g)) DIE("capture");
    return g;
}

static bool on_cuda;

static void run_case(const mix_case_t *mc, const char *dir) {
    tdit_config_t c;
    if (tdit_config_builtin(mc->label, &c)) DIE("config %s", mc->label);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, mc->label);
    if (tdit_weights_init(&c, 7, path)) DIE("weights init");
    kern_backend_t *be = on_cuda ? kern_backend_cuda_new(0) : kern_backend_cpu_new();
    if (!be) DIE("backend");
    kern_stream_t *s = kern_stream_new(be);
    tdit_model_t *m = tdit_model_load_path(be, path, on_cuda ? KERN_BF16 : KERN_F32);
    if (!m) DIE("load %s", path);
    const int64_t sizes[] = { 2, 4, 8 };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int64_t B = sizes[k];
        tdit_ws_t *mix = make_ws(m, s, mc, B, 0), *one[8];
        kern_graph_t *gm = capture(m, mix, s), *g1[8];
        size_t nodes1 = 0;
        for (int64_t b = 0; b < B; b++) {
            one[b] = make_ws(m, s, mc, 1, (int)b);
            g1[b] = capture(m, one[b], s);
            nodes1 += kern_graph_nodes(g1[b]);
        }
        double tb[64], ts[64];
        for (int r = 0; r < mc->reps; r++) {
            double t0 = bench_now();
            if (kern_graph_replay(gm, s) || kern_stream_sync(s)) DIE("replay mixed");
            tb[r] = bench_now() - t0;
            t0 = bench_now();
            for (int64_t b = 0; b < B; b++)
                if (kern_graph_replay(g1[b], s)) DIE("replay single");
            if (kern_stream_sync(s)) DIE("sync");
            ts[r] = bench_now() - t0;
        }
        double mb = bench_median(tb, mc->reps), ms = bench_median(ts, mc->reps);
        printf("mix step %s %-5s B=%lld: batched %8.3f ms (%zu nodes), %lld singles %8.3f ms (%zu nodes), "
               "batched/singles speed %.2fx\n",
               on_cuda ? "cuda bf16" : "cpu f32", mc->label, (long long)B, mb * 1e3, kern_graph_nodes(gm), (long long)B, ms * 1e3, nodes1, ms / mb);
        kern_graph_destroy(&gm);
        tdit_ws_destroy(&mix);
        for (int64_t b = 0; b < B; b++) {
            kern_graph_destroy(&g1[b]);
            tdit_ws_destroy(&one[b]);
        }
    }
    tdit_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&be);
    remove(path);
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/reel-bench-mix.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    int first = 1; /* argv[1] is BUILD unless it names a case or cuda */
    if (argc > 1) {
        first = 2;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            if (!strcmp(argv[1], cases[i].label)) first = 1;
        if (!strcmp(argv[1], "cuda")) first = 1;
    }
    if (argc > first && !strcmp(argv[first], "cuda")) {
        on_cuda = true;
        first++;
    }
    if (on_cuda) printf("cuda: GPU 0, BF16\n");
    else printf("cpu pool: %d threads (REEL_THREADS, else the cores)\n", kern_cpu_threads());
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool want = argc <= first;
        for (int a = first; a < argc; a++) want |= strcmp(argv[a], cases[i].label) == 0;
        if (want) run_case(&cases[i], dir);
    }
    rmdir(dir);
    return 0;
}
