/* bench_cpu_step.c -- the CPU step at its floor (issue 31): one CFG step of
 * tiny, small and a wan2.1-1.3b-width model (2 of its 30 layers: the
 * widths, dim 1536 and ffn 8960, are what matter for the kernels, and 2
 * layers keep a step near a second on 2 cores), all from one run:
 *   - the step eager and replayed (the captured graph);
 *   - the same GEMMs alone: the graph's GEMM and GEMM_GELU nodes, same
 *     shapes, same kernel and tiles, same pool, nothing else (a GEMM_GELU
 *     node runs as the plain GEMM); step / GEMMs is the goal's ratio;
 *   - all its matrix products alone: those GEMMs plus the attention
 *     nodes' own products (scores and weights·values: the very sgemm
 *     calls on the same lanes, or the direct kernel's own two loops, up to
 *     64 keys and head width, with the scores standing in for the weights:
 *     kern_cpu_attention_products), nothing between them; step / products
 *     is the title's ratio ("a step costs little more than its matrix
 *     products"), for the eager step and (in brackets) the replayed one;
 *   - a profile: every node of the graph timed alone, summed by op, every
 *     op listed;
 *   - each at the default pool (REEL_THREADS, else the cores) and at 1.
 * PyTorch eager on the same weights is bench/torch_step.py's, run here when
 * python3-torch is installed (one line says so when it is not).
 * REEL_BENCH_REPS=N runs N timed steps a case (for a profiler or a steadier
 * median); REEL_BENCH_TORCH=0 leaves PyTorch out; REEL_BENCH_NODES=1 lists
 * every node with its shape and its best time alone.
 * Usage: bench_cpu_step [BUILD] [tiny|small|wan]... (all three by default). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/error.h"
#include "bench/bench.h"
#include "bench/bench_step.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_attn.h"
#include "kernels/cpu/ops_attention.h"
#include "kernels/ops_args.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/loop.h"
#include "model/tinydit.h"

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, ": %s\n", reel_err_text()); exit(1); } while (0)

typedef struct {
    const char *label, *config;
    int64_t layers; /* 0: the config's */
    int64_t F, H, W, L;
    int reps;
} step_case_t;

static const step_case_t cases[] = {
    { "tiny", "tiny", 0, 2, 8, 8, 5, 41 },
    { "small", "small", 0, 4, 16, 16, 16, 9 },
    { "wan", "wan2.1-1.3b", 2, 4, 32, 32, 64, 3 },
};

typedef int (*node_fn_t)(void *ctx, const void *args);

/* The op of a node, by its kernel function; KERN_OP_COUNT if unknown. */
static kern_op_t op_of(node_fn_t fn) {
    const kern_impl_t *all[256];
    size_t n = kern_registry_list(all, 256);
    for (size_t i = 0; i < n && i < 256; i++)
        if (all[i]->fn == fn && all[i]->backend == KERN_BACKEND_CPU) return all[i]->op;
    return KERN_OP_COUNT;
}

typedef struct {
    double eager, replay, gemms, products;
    double by_op[KERN_OP_COUNT + 1];
    size_t count[KERN_OP_COUNT + 1]; /* nodes of each op */
    size_t nodes, gemm_nodes, attn_nodes, blas_attn_nodes;
} result_t;

static bool is_attention(kern_op_t op) { return op == KERN_OP_ATTENTION || op == KERN_OP_ATTENTION_SDPA; }

/* The graph's GEMM nodes alone, and with products, its attention nodes'
 * own matrix products too. */
static double run_products(kern_graph_t *g, const kern_op_t *ops, size_t n, node_fn_t gemm, bool products) {
    double t0 = bench_now();
    for (size_t i = 0; i < n; i++) {
        node_fn_t fn;
        const void *args;
        kern_graph_node(g, i, &fn, &args);
        if (ops[i] == KERN_OP_GEMM || ops[i] == KERN_OP_GEMM_GELU) {
            if (gemm(NULL, args)) DIE("gemm node %zu", i);
        } else if (products && is_attention(ops[i]) && kern_cpu_attention_products(args)) {
            DIE("attention node %zu", i);
        }
    }
    return bench_now() - t0;
}

static void measure(const step_case_t *sc, const char *wpath, result_t *r) {
    kern_backend_t *b = kern_backend_cpu_new();
    kern_stream_t *s = kern_stream_new(b);
    tdit_model_t *m = tdit_model_load_path(b, wpath, KERN_F32);
    if (!m) DIE("load %s", wpath);
    tdit_shape_t sh = { sc->F, sc->H, sc->W, sc->L, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    tdit_ws_t *ws = bench_step_ws(m, s, &sh);
    if (!ws) DIE("workspace");
    if (tdit_step(m, ws, s)) DIE("warmup");
    kern_graph_t *g = NULL;
    if (kern_capture_begin(s) || tdit_step(m, ws, s) || kern_capture_end(s, &g)) DIE("capture");
    int reps = sc->reps;
    const char *env = getenv("REEL_BENCH_REPS"); /* more, for a profiler */
    if (env && atoi(env) > 0) reps = atoi(env);
    double *te = calloc((size_t)reps * 4, sizeof *te), *tg = te + reps, *tm = tg + reps, *tp = tm + reps;
    if (!te) DIE("reps");
    memset(r, 0, sizeof *r);
    r->nodes = kern_graph_nodes(g);
    kern_op_t *ops = calloc(r->nodes, sizeof *ops);
    for (size_t i = 0; i < r->nodes; i++) {
        node_fn_t fn;
        const void *args;
        if (kern_graph_node(g, i, &fn, &args)) DIE("node %zu", i);
        ops[i] = op_of(fn);
        if (ops[i] == KERN_OP_GEMM || ops[i] == KERN_OP_GEMM_GELU) r->gemm_nodes++;
        if (is_attention(ops[i])) {
            const kern_attention_args_t *a = args;
            r->attn_nodes++;
            if (cpu_attn_way(a->nq, a->nk, a->head_dim) != CPU_ATTN_DIRECT) r->blas_attn_nodes++;
        }
    }
    const kern_impl_t *gi = kern_registry_lookup(KERN_OP_GEMM, KERN_BACKEND_CPU, KERN_F32);
    if (!gi) DIE("no cpu gemm");
    for (int k = 0; k < reps; k++) {
        double t0 = bench_now();
        if (tdit_step(m, ws, s) || kern_stream_sync(s)) DIE("step");
        te[k] = bench_now() - t0;
        t0 = bench_now();
        if (kern_graph_replay(g, s) || kern_stream_sync(s)) DIE("replay");
        tg[k] = bench_now() - t0;
        tm[k] = run_products(g, ops, r->nodes, gi->fn, false);
        tp[k] = run_products(g, ops, r->nodes, gi->fn, true);
    }
    r->eager = bench_median(te, reps);
    r->replay = bench_median(tg, reps);
    r->gemms = bench_median(tm, reps);
    r->products = bench_median(tp, reps);
    free(te);
    if (getenv("REEL_BENCH_NODES")) /* every node with its shape and its time alone (the best of the reps) */
        for (size_t i = 0; i < r->nodes; i++) {
            node_fn_t fn;
            const void *args;
            kern_graph_node(g, i, &fn, &args);
            double best = 1e9;
            for (int k = 0; k < sc->reps; k++) {
                double t0 = bench_now();
                fn(NULL, args);
                double t = bench_now() - t0;
                if (t < best) best = t;
            }
            char shape[96] = "";
            if (ops[i] == KERN_OP_GEMM || ops[i] == KERN_OP_GEMM_GELU) {
                const kern_gemm_args_t *a = args;
                snprintf(shape, sizeof shape, "M=%lld N=%lld K=%lld group=%lld", (long long)a->M, (long long)a->N,
                         (long long)a->K, (long long)a->group);
            } else if (is_attention(ops[i])) {
                const kern_attention_args_t *a = args;
                snprintf(shape, sizeof shape, "nq=%lld nk=%lld heads=%lld d=%lld batch=%lld", (long long)a->nq,
                         (long long)a->nk, (long long)a->heads, (long long)a->head_dim, (long long)a->batch);
            }
            printf("    node %3zu %-20s %8.2f us  %s\n", i,
                   ops[i] == KERN_OP_COUNT ? "(other)" : kern_op_name(ops[i]), best * 1e6, shape);
        }
    /* the profile: each node alone, reps times, summed by op (median of the
     * per-rep sums would cost reps x nodes clock reads; the mean is enough
     * for shares) */
    for (int k = 0; k < sc->reps; k++)
        for (size_t i = 0; i < r->nodes; i++) {
            node_fn_t fn;
            const void *args;
            kern_graph_node(g, i, &fn, &args);
            double t0 = bench_now();
            fn(NULL, args);
            r->by_op[ops[i]] += (bench_now() - t0) / sc->reps;
            if (k == 0) r->count[ops[i]]++;
        }
    free(ops);
    kern_graph_destroy(&g);
    tdit_ws_destroy(&ws);
    tdit_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
}

static void report(const step_case_t *sc, int threads, const result_t *r) {
    printf("cpu step %-5s threads=%d latent F,H,W [%lld,%lld,%lld] L=%lld CFG: eager %9.3f ms, replay %9.3f ms, "
           "GEMMs alone %9.3f ms (%zu of %zu nodes), step/GEMMs %.3f\n",
           sc->label, threads, (long long)sc->F, (long long)sc->H, (long long)sc->W, (long long)sc->L,
           r->eager * 1e3, r->replay * 1e3, r->gemms * 1e3, r->gemm_nodes, r->nodes, r->eager / r->gemms);
    printf("    all its matrix products alone %9.3f ms (the GEMMs + %zu attention nodes' own products, %zu by BLAS, "
           "%zu direct), step/products %.3f (replayed: %.3f)\n",
           r->products * 1e3, r->attn_nodes, r->blas_attn_nodes, r->attn_nodes - r->blas_attn_nodes,
           r->eager / r->products, r->replay / r->products);
    double total = 0;
    for (int o = 0; o <= KERN_OP_COUNT; o++) total += r->by_op[o];
    for (;;) { /* every op, largest first */
        int best = -1;
        for (int o = 0; o <= KERN_OP_COUNT; o++)
            if (r->by_op[o] > 0 && (best < 0 || r->by_op[o] > r->by_op[best])) best = o;
        if (best < 0) break;
        printf("    %-20s %9.3f ms %5.1f%%  %3zu nodes, %8.2f us each\n",
               best == KERN_OP_COUNT ? "(other)" : kern_op_name((kern_op_t)best), r->by_op[best] * 1e3,
               100.0 * r->by_op[best] / total, r->count[best], r->by_op[best] * 1e6 / (double)r->count[best]);
        ((result_t *)r)->by_op[best] = -r->by_op[best]; /* shown: skip it */
    }
    for (int o = 0; o <= KERN_OP_COUNT; o++)
        if (r->by_op[o] < 0) ((result_t *)r)->by_op[o] = -r->by_op[o];
}

/* PyTorch eager on the same weights and inputs, when python3-torch is
 * installed: bench/torch_step.py prints "torch step <label> threads=N ms". */
static void torch_step(const step_case_t *sc, const char *wpath, double reel_ms) {
    static int have = -1;
    const char *skip = getenv("REEL_BENCH_TORCH"); /* 0: leave PyTorch out (a profile of Reel alone) */
    if (skip && !strcmp(skip, "0")) {
        printf("torch step %-5s: SKIP: REEL_BENCH_TORCH=0\n", sc->label);
        return;
    }
    if (have < 0) have = system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
    if (!have) {
        printf("torch step %-5s: SKIP: python3-torch is not installed (apt-get install python3-torch)\n", sc->label);
        return;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 bench/torch_step.py %s %s %lld %lld %lld %lld %d", wpath, sc->label,
             (long long)sc->F, (long long)sc->H, (long long)sc->W, (long long)sc->L, sc->reps);
    FILE *p = popen(cmd, "r");
    if (!p) {
        printf("torch step %-5s: FAILED to start\n", sc->label);
        return;
    }
    char line[512];
    double best = 0;
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        double ms;
        int th;
        if (sscanf(line, "torch step %*s threads=%d %lf ms", &th, &ms) == 2 && (best == 0 || ms < best)) best = ms;
    }
    if (pclose(p) != 0 || best == 0) {
        printf("torch step %-5s: FAILED (see above)\n", sc->label);
        return;
    }
    printf("torch/reel %-5s: %.3f (PyTorch eager's best thread count against Reel's default pool)\n", sc->label,
           best / reel_ms);
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/reel-bench-step.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    int first = 1; /* argv[1] is BUILD unless it names a case */
    if (argc > 1) {
        first = 2;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            if (!strcmp(argv[1], cases[i].label)) first = 1;
    }
    int def = kern_cpu_threads();
    printf("cpu pool: %d threads by default (REEL_THREADS, else the cores); OpenBLAS single-threaded inside\n", def);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const step_case_t *sc = &cases[i];
        bool want = argc <= first;
        for (int a = first; a < argc; a++) want |= strcmp(argv[a], sc->label) == 0;
        if (!want) continue;
        tdit_config_t c;
        if (tdit_config_builtin(sc->config, &c)) DIE("config");
        if (sc->layers) {
            c.layers = sc->layers;
            snprintf(c.name, sizeof c.name, "%s-%lldlayers", sc->config, (long long)sc->layers);
        }
        char p[256];
        snprintf(p, sizeof p, "%s/%s.safetensors", dir, sc->label);
        if (tdit_weights_init(&c, 1, p)) DIE("weights init");
        result_t r1, rn;
        kern_cpu_threads_set(def);
        measure(sc, p, &rn);
        report(sc, def, &rn);
        if (def > 1) {
            kern_cpu_threads_set(1);
            measure(sc, p, &r1);
            report(sc, 1, &r1);
            printf("cpu step %-5s: %d threads / 1 thread speedup %.2fx\n", sc->label, def, r1.eager / rn.eager);
            kern_cpu_threads_set(0);
        }
        torch_step(sc, p, rn.eager * 1e3);
        remove(p);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) != 0;
}
