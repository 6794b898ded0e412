/* bench_capture.c -- what capture_cache costs and saves, from one run:
 * per-step time eager vs graph replay through cap_dispatch (tiny:
 * launch-bound, small: compute-bound), bytes bind copies per step with and
 * without pinning, capture + verify cost in step-equivalents, and the cost
 * of a weight sync plus the steps after it under the evict and inplace
 * policies. CPU always; CUDA too when a GPU is usable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base/error.h"
#include "model/tdit_program.h"
#include "bench/bench.h"

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, ": %s\n", reel_err_text()); exit(1); } while (0)

static void quiet(void *u, int l, const char *m) { (void)u; (void)l; (void)m; }

typedef struct { const char *config; tdit_shape_t shape; int steps; } case_t;

typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    tdit_model_t *m;
    tdit_staging_t *stg;
    float *lat, *ctx, *unc, *out;
} env_t;

static void env_open(env_t *e, kern_backend_t *b, const char *wpath, const tdit_shape_t *sh) {
    memset(e, 0, sizeof *e);
    e->b = b;
    e->s = kern_stream_new(b);
    e->m = tdit_model_load_path(b, wpath, KERN_F32);
    if (!e->m) DIE("load");
    e->stg = tdit_staging_new(e->m, sh);
    const tdit_config_t *c = tdit_model_config(e->m);
    size_t nl = (size_t)(c->in_channels * sh->frames * sh->height * sh->width), nc = (size_t)(sh->text_len * c->text_dim);
    e->lat = malloc(nl * 4); e->out = malloc(nl * 4);
    e->ctx = malloc(nc * 4); e->unc = malloc(nc * 4);
    tdit_initial_latent(1, e->lat, nl);
    tdit_initial_latent(2, e->ctx, nc);
    tdit_initial_latent(3, e->unc, nc);
}

static void env_close(env_t *e) {
    tdit_staging_destroy(&e->stg);
    tdit_model_destroy(&e->m);
    kern_stream_destroy(&e->s);
    free(e->lat); free(e->out); free(e->ctx); free(e->unc);
}

static cap_cache_t *cache_opt(env_t *e, bool graphs, bool pin, cap_policy_t pol, bool check_w, int audit) {
    cap_options_t o = cap_options_default();
    o.check_weights = check_w;
    o.audit_every = audit;
    o.graphs = graphs;
    o.pin_inputs = pin;
    o.policy = pol;
    o.log = quiet;
    cap_cache_t *c = cap_cache_new(e->b, &o);
    if (!c || tdit_register_weights(c, e->m, 1)) DIE("cache");
    return c;
}

static cap_cache_t *cache(env_t *e, bool graphs, bool pin, cap_policy_t pol) {
    return cache_opt(e, graphs, pin, pol, true, 0);
}

/* Runs a loop (Euler, or SDE when sde); returns its wall time. */
static double loop_kind(env_t *e, cap_cache_t *c, const tdit_shape_t *sh, int steps, tdit_run_stats_t *st,
                        bool sde) {
    tdit_loop_t p = { .steps = steps, .shift = 3.0, .guidance = 4.0f, .sde = sde, .eta = 0.7f, .seed = 11 };
    memset(st, 0, sizeof *st);
    double t0 = bench_now();
    if (tdit_generate_cached(e->m, c, e->s, e->stg, sh, &p, e->lat, e->ctx, e->unc, e->out, st)) DIE("loop");
    return bench_now() - t0;
}

static double loop(env_t *e, cap_cache_t *c, const tdit_shape_t *sh, int steps, tdit_run_stats_t *st) {
    return loop_kind(e, c, sh, steps, st, false);
}

static void bench_case(kern_backend_t *b, const char *wpath, const case_t *k) {
    env_t e;
    env_open(&e, b, wpath, &k->shape);
    const char *dev = kern_backend_device_name(b);
    tdit_run_stats_t st;
    /* eager vs replay, side by side: warm both, then alternate requests */
    cap_cache_t *ce = cache(&e, false, true, CAP_POLICY_EVICT), *cg = cache(&e, true, true, CAP_POLICY_EVICT);
    loop(&e, ce, &k->shape, k->steps, &st);
    loop(&e, cg, &k->shape, k->steps, &st); /* warmup + capture happen here */
    double te = 1e30, tg = 1e30;
    for (int r = 0; r < 5; r++) {
        double a = loop(&e, ce, &k->shape, k->steps, &st) / k->steps;
        double g = loop(&e, cg, &k->shape, k->steps, &st) / k->steps;
        if (st.replayed != k->steps) DIE("expected every step replayed, got %d", st.replayed);
        if (a < te) te = a;
        if (g < tg) tg = g;
    }
    printf("cache %-6s %-7s step (CFG, via cap_dispatch): eager %9.3f ms, replay %9.3f ms, eager/replay %.3fx\n",
           k->config, dev, te * 1e3, tg * 1e3, te / tg);
    cap_stats_t cs;
    cap_cache_stats(cg, &cs);
    printf("cache %-6s %-7s capture+verify %.3f ms = %.2f eager steps; graph %zu bytes, workspace %zu bytes\n",
           k->config, dev, cs.capture_seconds * 1e3, cs.capture_seconds / te, cs.graph_bytes, cs.ws_bytes);
    /* SDE rollouts (Flow-GRPO steps): captured too, eta/seed/step read from
     * the workspace; the same side-by-side measurement. */
    loop_kind(&e, ce, &k->shape, k->steps, &st, true);
    loop_kind(&e, cg, &k->shape, k->steps, &st, true);
    double se = 1e30, sg = 1e30;
    for (int r = 0; r < 5; r++) {
        double a = loop_kind(&e, ce, &k->shape, k->steps, &st, true) / k->steps;
        double g = loop_kind(&e, cg, &k->shape, k->steps, &st, true) / k->steps;
        if (st.replayed != k->steps) DIE("expected every SDE step replayed, got %d", st.replayed);
        if (a < se) se = a;
        if (g < sg) sg = g;
    }
    printf("cache %-6s %-7s SDE step (CFG, via cap_dispatch): eager %9.3f ms, replay %9.3f ms, eager/replay %.3fx\n",
           k->config, dev, se * 1e3, sg * 1e3, se / sg);
    cap_cache_destroy(&ce);
    cap_cache_destroy(&cg);

    /* What the replay-time safety costs, side by side on the same inputs:
     * the weight identity check (every weight buffer compared before each
     * replay) and runtime audits (1 replay in N also runs eager). */
    {
        enum { V_BARE, V_CHECKED, V_AUDIT256, V_AUDIT16, V_N };
        static const char *names[V_N] = { "no identity check, no audit", "identity check (default)",
                                          "check + audit 1 in 256", "check + audit 1 in 16" };
        static const int audit[V_N] = { 0, 0, 256, 16 };
        cap_cache_t *cv[V_N];
        double best[V_N];
        for (int v = 0; v < V_N; v++) {
            cv[v] = cache_opt(&e, true, true, CAP_POLICY_EVICT, v != V_BARE, audit[v]);
            loop(&e, cv[v], &k->shape, k->steps, &st); /* warmup + capture */
            best[v] = 0;
        }
        /* Launch-bound cases: enough steps that the 1-in-256 audit fires;
         * compute-bound ones: 32 steps (the 1-in-16 audit fires twice; the
         * count is printed). Per-step means over rounds that alternate the
         * variants, so drift hits all alike. */
        int rounds = 8, reqs = (te < 0.02 ? 520 : 32) / k->steps;
        double sum[V_N] = { 0 };
        for (int r = 0; r < rounds; r++)
            for (int v = 0; v < V_N; v++)
                for (int q = 0; q < (reqs + rounds - 1) / rounds; q++) sum[v] += loop(&e, cv[v], &k->shape, k->steps, &st);
        int per = (reqs + rounds - 1) / rounds * rounds * k->steps;
        for (int v = 0; v < V_N; v++) {
            cap_stats_t cs;
            cap_cache_stats(cv[v], &cs);
            best[v] = sum[v] / per;
            printf("cache %-6s %-7s replay safety %-28s: %9.4f ms/step = %.3fx bare (%llu audits in %d steps)\n",
                   k->config, dev, names[v], best[v] * 1e3, best[v] / best[V_BARE], (unsigned long long)cs.audits,
                   per);
            cap_cache_destroy(&cv[v]);
        }
    }

    /* bind bytes per step with and without pinning */
    for (int pin = 1; pin >= 0; pin--) {
        cap_cache_t *c = cache(&e, true, pin, CAP_POLICY_EVICT);
        loop(&e, c, &k->shape, k->steps, &st);
        cap_stats_t a, z;
        cap_cache_stats(c, &a);
        loop(&e, c, &k->shape, k->steps, &st);
        cap_cache_stats(c, &z);
        printf("cache %-6s %-7s bind per replayed step, pinning %-3s: %8.0f bytes copied, %8.0f bytes read in place\n",
               k->config, dev, pin ? "on" : "off", (double)(z.bind_bytes_copied - a.bind_bytes_copied) / k->steps,
               (double)(z.bind_bytes_pinned - a.bind_bytes_pinned) / k->steps);
        cap_cache_destroy(&c);
    }

    /* a weight sync, then the next request: evict vs inplace */
    st_file_t *wf = st_open(wpath);
    for (int pol = 0; pol < 2; pol++) {
        cap_cache_t *c = cache(&e, true, true, pol ? CAP_POLICY_INPLACE : CAP_POLICY_EVICT);
        loop(&e, c, &k->shape, k->steps, &st);
        loop(&e, c, &k->shape, k->steps, &st);
        double t0 = bench_now();
        if (tdit_model_reload(e.m, wf)) DIE("reload");
        if (cap_component_update(c, TDIT_COMPONENT, tdit_model_weights(e.m), tdit_model_bytes(e.m), 2) < 0) DIE("sync");
        double tsync = bench_now() - t0;
        double tl = loop(&e, c, &k->shape, k->steps, &st);
        printf("cache %-6s %-7s sync policy %-7s: sync %.3f ms, next %d-step request %.3f ms "
               "(%d eager, %d captured, %d replayed) = %.2f steady-state requests\n",
               k->config, dev, pol ? "inplace" : "evict", tsync * 1e3, k->steps, tl * 1e3, st.eager,
               st.captured, st.replayed, tl / (tg * k->steps));
        cap_cache_destroy(&c);
    }
    st_close(&wf);
    env_close(&e);
}

static void bench_backend(kern_backend_t *b, const char *dir, bool gpu) {
    static const case_t cases[] = {
        { "tiny", { 2, 8, 8, 5, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER }, 8 },
        { "small", { 4, 16, 16, 16, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER }, 4 },
        /* wan2.1-1.3b widths, 2 blocks: a GPU-only case (too slow on 2 cores) */
        { "wanblk", { 4, 30, 52, 64, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER }, 4 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!gpu && !strcmp(cases[i].config, "wanblk")) continue;
        char p[256];
        snprintf(p, sizeof p, "%s/%s.safetensors", dir, cases[i].config);
        bench_case(b, p, &cases[i]);
    }
}

int main(void) {
    char dir[] = "/tmp/reel-bench-cap.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    const char *configs[] = { "tiny", "small" };
    for (int i = 0; i < 2; i++) {
        tdit_config_t c;
        char p[256];
        tdit_config_builtin(configs[i], &c);
        snprintf(p, sizeof p, "%s/%s.safetensors", dir, configs[i]);
        if (tdit_weights_init(&c, 1, p)) DIE("weights init");
    }
    kern_backend_t *cpu = kern_backend_cpu_new();
    bench_backend(cpu, dir, false);
    kern_backend_destroy(&cpu);
    kern_backend_t *gpu = kern_backend_cuda_new(0);
    if (!gpu) printf("cuda: SKIP: %s\n", reel_err_text());
    else {
        tdit_config_t c;
        char p[256];
        tdit_config_builtin("wan2.1-1.3b", &c);
        snprintf(c.name, sizeof c.name, "wanblk");
        c.layers = 2;
        snprintf(p, sizeof p, "%s/wanblk.safetensors", dir);
        if (tdit_weights_init(&c, 1, p)) DIE("weights init");
        bench_backend(gpu, dir, true);
        kern_backend_destroy(&gpu);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) != 0;
}
