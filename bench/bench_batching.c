/* bench_batching.c -- many clients' single requests batched into one step
 * (issue 29, worker --max-batch) against each request stepped alone, through
 * a real reel-broker and reel-worker (CPU backend, ipc), side by side in
 * one run.
 *
 * For each config (tiny, small, and micro: tiny's model on one token for one
 * step, the request path's own rate): four broker + worker pairs, started one at
 * a time, alike but for the worker's --max-batch: 1 (today: every request
 * alone, interleaved with the others on the streams), and N (default 8)
 * with --batching auto (the default: batches while they cost a request
 * less) and always (requests of one kind share a step; --batch-sizes
 * ladder and exact). Load: CLIENTS client threads (16), each sending N single
 * CFG Euler GENs one after another, each with its own context (prompt)
 * and seed (N per config and backend, cases[]: tiny 40 on the CPU and 60
 * on CUDA, small 3 and 40; BENCH_BATCHING_REQS=N sets every config's);
 * samples/s = requests / wall time. Lone: one client, the worker
 * otherwise idle, LONE requests one at a time after each timed load: the
 * p50 latency. Each setup is started afresh for every rep, warmed by one
 * untimed load round (graphs captured); the setups' order rotates over
 * the reps; medians. Every result of the batched workers is
 * checked bitwise against the unbatched worker's for the same request.
 * BACKEND cuda runs the workers on CUDA in BF16 (--no-fallback: no CPU
 * stand-in); the default is the CPU in F32.
 * Usage: bench_batching [BUILD_DIR [REPS [CLIENTS [MAX_BATCH [CONFIG|all [BACKEND]]]]]] */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/error.h"
#include "bench/bench.h"
#include "bench/bench_proc.h"
#include "clients/c/client.h"

#define DIE(...) do { fprintf(stderr, "bench_batching: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define REPS_MAX 9
#define CLIENTS_MAX 64
#define REQS_MAX 200
#define LONE 9
#define SETUPS 4

typedef struct {
    const char *config; /* the row's name */
    const char *model;  /* its model (NULL: config) */
    int64_t lat[4];   /* C, F, H, W */
    int64_t ctx[2];   /* L, T */
    int steps;
    int reqs[2];      /* requests per client: on the CPU, on CUDA */
} case_t;

typedef struct {
    const char *ep;
    reel_gen_t g;
    float *ctx, *unc; /* this client's prompt */
    float *out;       /* [reqs][nl] */
    size_t nl;
    int reqs;
    int rc;
} client_t;

static void *client_run(void *arg) {
    client_t *o = arg;
    reel_client_t *c = reel_client_new(o->ep);
    wire_err_t err;
    o->rc = c ? 0 : -1;
    for (int i = 0; c && o->rc == 0 && i < o->reqs; i++) {
        reel_gen_t g = o->g;
        g.seed = o->g.seed + (uint64_t)i;
        o->rc = reel_gen(c, &g, o->out + (size_t)i * o->nl, NULL, NULL, NULL, 600000, &err);
        if (o->rc) fprintf(stderr, "bench_batching: gen: %s %s\n", err.code, err.message);
    }
    reel_client_destroy(&c);
    return NULL;
}

/* n clients at once, reqs requests each; the wall time. */
static double load(client_t *cl, int n) {
    pthread_t th[CLIENTS_MAX];
    double t0 = bench_now();
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, client_run, &cl[i])) DIE("pthread_create");
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    double t = bench_now() - t0;
    for (int i = 0; i < n; i++)
        if (cl[i].rc) DIE("a request failed");
    return t;
}

/* LONE single requests one at a time: their median latency. */
static double lone(const char *ep, const reel_gen_t *base, float *out) {
    reel_client_t *c = reel_client_new(ep);
    if (!c) DIE("%s", reel_err_text());
    double t[LONE];
    for (int i = 0; i < LONE; i++) {
        reel_gen_t g = *base;
        g.seed = 77 + (uint64_t)i;
        wire_err_t err;
        double t0 = bench_now();
        if (reel_gen(c, &g, out, NULL, NULL, NULL, 600000, &err) != 0) DIE("lone gen: %s %s", err.code, err.message);
        t[i] = bench_now() - t0;
    }
    reel_client_destroy(&c);
    return bench_median(t, LONE);
}

typedef struct {
    const char *name;
    const char *max_batch;
    const char *sizes;
    const char *batching;
    pid_t pb, pw;
    char cep[300];
} setup_t;

static const char *g_backend = "cpu";

static void start(setup_t *s, const char *build, const char *dir, int idx, const char *wpath) {
    char broker[300], worker[300], wep[300], db[300], blog[300], wlog[300];
    snprintf(broker, sizeof broker, "%s/reel-broker", build);
    snprintf(worker, sizeof worker, "%s/reel-worker", build);
    snprintf(s->cep, sizeof s->cep, "ipc://%s/c%d", dir, idx);
    snprintf(wep, sizeof wep, "ipc://%s/w%d", dir, idx);
    snprintf(db, sizeof db, "%s/reel%d.db", dir, idx);
    snprintf(blog, sizeof blog, "%s/broker%d.log", dir, idx);
    snprintf(wlog, sizeof wlog, "%s/worker%d.log", dir, idx);
    char *bargv[] = { broker, "--clients", s->cep, "--workers", wep, "--catalog", db, NULL };
    char *wargv[] = { worker, "--broker", wep, "--name", "w1", "--weights", (char *)wpath, "--warmup", "1",
                      "--max-batch", (char *)s->max_batch, "--batch-sizes", (char *)s->sizes,
                      "--batching", (char *)s->batching, NULL, NULL, NULL, NULL, NULL, NULL };
    if (!strcmp(g_backend, "cuda")) {
        static char *cuda_args[] = { "--backend", "cuda", "--no-fallback", "--dtype", "bf16" };
        size_t n = 0;
        while (wargv[n]) n++;
        memcpy(wargv + n, cuda_args, sizeof cuda_args);
    }
    s->pb = bench_spawn(bargv, blog);
    s->pw = bench_spawn(wargv, wlog);
    reel_client_t *c = reel_client_new(s->cep);
    if (!c) DIE("%s", reel_err_text());
    const pid_t pids[] = { s->pw, s->pb };
    const char *logs[] = { wlog, blog };
    bench_wait_workers_of(c, 1, "bench_batching", pids, logs, 2);
    reel_client_destroy(&c);
}

static void stop(setup_t *s) {
    kill(s->pw, SIGTERM);
    kill(s->pb, SIGTERM);
    waitpid(s->pw, NULL, 0);
    waitpid(s->pb, NULL, 0);
}

int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "build";
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    int nclients = argc > 3 ? atoi(argv[3]) : 16;
    const char *maxb = argc > 4 ? argv[4] : "8";
    const char *only = argc > 5 && strcmp(argv[5], "all") ? argv[5] : NULL; /* one config */
    if (argc > 6) g_backend = argv[6];
    if (strcmp(g_backend, "cpu") && strcmp(g_backend, "cuda")) DIE("backend must be cpu or cuda");
    if (reps < 1 || reps > REPS_MAX) DIE("reps must be 1..%d", REPS_MAX);
    if (nclients < 1 || nclients > CLIENTS_MAX) DIE("clients must be 1..%d", CLIENTS_MAX);
    char dir[] = "/tmp/reel-bench-batching.XXXXXX", cmd[1024], ctl[300];
    if (!mkdtemp(dir)) DIE("mkdtemp");
    snprintf(ctl, sizeof ctl, "%s/reelctl", build);
    if (access(ctl, X_OK)) DIE("build %s first", build);
    static const case_t cases[] = {
        /* Each timed load runs long enough to be mostly steady state (all
         * clients in flight): about 0.5-1 s where the requests are quick.
         * (3 each, as before 2026-12-05, made tiny's timed load ~80 ms on
         * the CPU and ~40 ms on a GPU, mostly the clients' ramp.) */
        { "tiny", NULL, { 4, 2, 8, 8 }, { 5, 32 }, 4, { 40, 60 } },      /* 32 tokens a sample */
        { "small", NULL, { 16, 2, 8, 16 }, { 16, 256 }, 4, { 3, 40 } },  /* 64 tokens a sample */
        /* the request path's own rate: tiny's model on one token, one step,
         * one text token: what a request costs the client, broker and
         * worker around its (negligible) step */
        { "micro", "tiny", { 4, 1, 2, 2 }, { 1, 32 }, 1, { 200, 200 } },
    };
    const char *env_reqs = getenv("BENCH_BATCHING_REQS");
    int reqs_all = env_reqs ? atoi(env_reqs) : 0;
    if (env_reqs && (reqs_all < 1 || reqs_all > REQS_MAX)) DIE("BENCH_BATCHING_REQS must be 1..%d", REQS_MAX);
    printf("bench_batching: %d clients x N single CFG Euler GENs (own prompt, own seeds) on one worker (%s,\n"
           "--streams 2): --max-batch 1 (each request alone) vs --max-batch %s --batching auto, always (ladder,\n"
           "exact); graphs warm, "
           "%d reps rotating, medians; lone: p50 of %d requests one at a time on an idle worker\n",
           nclients, strcmp(g_backend, "cuda") ? "CPU, F32" : "CUDA, BF16", maxb, reps, LONE);
    printf("%-6s %-14s %10s %8s %12s %8s  %s\n", "config", "worker", "smp/s", "vs off", "lone p50 ms", "vs off",
           "bitwise");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const case_t *k = &cases[ci];
        if (only && strcmp(only, k->config)) continue;
        const int reqs = reqs_all ? reqs_all : k->reqs[strcmp(g_backend, "cuda") == 0];
        printf("%s: N = %d requests per client (BENCH_BATCHING_REQS sets it)\n", k->config, reqs);
        char wpath[300];
        snprintf(wpath, sizeof wpath, "%s/%s.safetensors", dir, k->config);
        snprintf(cmd, sizeof cmd, "%s weights init --config %s --seed 1 --out %s 2>/dev/null", ctl, k->model ? k->model : k->config, wpath);
        if (system(cmd) != 0) DIE("weights init");
        size_t nl = (size_t)(k->lat[0] * k->lat[1] * k->lat[2] * k->lat[3]), nc = (size_t)(k->ctx[0] * k->ctx[1]);
        client_t cl[SETUPS][CLIENTS_MAX];
        float *prompts = malloc((size_t)nclients * 2 * nc * sizeof *prompts);
        if (!prompts) DIE("out of memory");
        for (size_t i = 0; i < (size_t)nclients * 2 * nc; i++)
            prompts[i] = (float)((i * 7919 + 13) % 1000) / 500.0f - 1.0f;
        reel_gen_t base = { .model = k->model ? k->model : k->config, .steps = k->steps, .shift = 3.0, .cfg = 4.0 };
        memcpy(base.latent_shape, k->lat, sizeof k->lat);
        memcpy(base.ctx_shape, k->ctx, sizeof k->ctx);
        base.context = prompts; /* the lone client's: the first client's prompt */
        base.uncond = prompts + nc;
        setup_t su[SETUPS] = { { "off", "1", "ladder", "auto", 0, 0, "" },
                               { "auto", maxb, "ladder", "auto", 0, 0, "" },
                               { "always ladder", maxb, "ladder", "always", 0, 0, "" },
                               { "always exact", maxb, "exact", "always", 0, 0, "" } };
        double tl[SETUPS][REPS_MAX], tlone[SETUPS][REPS_MAX], lat[SETUPS];
        float *lone_out = malloc(nl * sizeof *lone_out);
        if (!lone_out) DIE("out of memory");
        for (int s = 0; s < SETUPS; s++)
            for (int i = 0; i < nclients; i++) {
                cl[s][i] = (client_t){ NULL, base, prompts + (size_t)i * 2 * nc, prompts + ((size_t)i * 2 + 1) * nc,
                                       malloc((size_t)reqs * nl * sizeof(float)), nl, reqs, 0 };
                if (!cl[s][i].out) DIE("out of memory");
                cl[s][i].g.context = cl[s][i].ctx;
                cl[s][i].g.uncond = cl[s][i].unc;
                cl[s][i].g.seed = 1000 + 10 * (uint64_t)i;
            }
        /* One setup at a time on the machine: started, warmed, its lone
         * latency, stopped; the reps alternate by restarting in turn. */
        for (int rep = -1; rep < reps; rep++) {
            for (int o = 0; o < SETUPS; o++) {
                int s = rep < 0 ? o : (o + rep) % SETUPS;
                start(&su[s], build, dir, (int)ci * SETUPS + s, wpath);
                for (int i = 0; i < nclients; i++) cl[s][i].ep = su[s].cep;
                load(cl[s], nclients); /* warm: every batch size this load forms is captured */
                if (rep >= 0) {
                    tl[s][rep] = load(cl[s], nclients);
                    tlone[s][rep] = lone(su[s].cep, &base, lone_out);
                }
                stop(&su[s]);
            }
        }
        bool same = true;
        for (int s = 1; s < SETUPS; s++)
            for (int i = 0; i < nclients; i++)
                same = same && !memcmp(cl[s][i].out, cl[0][i].out, (size_t)reqs * nl * sizeof(float));
        for (int s = 0; s < SETUPS; s++) lat[s] = bench_median(tlone[s], reps);
        double off = (double)(nclients * reqs) / bench_median(tl[0], reps);
        for (int s = 0; s < SETUPS; s++) {
            double sps = (double)(nclients * reqs) / bench_median(tl[s], reps);
            printf("%-6s %-14s %10.1f %7.2fx %12.1f %7.2fx  %s\n", k->config, su[s].name, sps, sps / off,
                   1e3 * lat[s], lat[s] / lat[0], s == 0 ? "-" : same ? "yes" : "NO");
        }
        fflush(stdout);
        if (!same) DIE("a batched result differs from the same request served alone");
        for (int s = 0; s < SETUPS; s++)
            for (int i = 0; i < nclients; i++) free(cl[s][i].out);
        free(prompts);
        free(lone_out);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) != 0;
}
