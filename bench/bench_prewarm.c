/* bench_prewarm.c -- a worker restarting into live traffic, with and
 * without --prewarm (issue 29 §2), through a real reel-broker and
 * reel-worker (CPU backend, ipc), side by side in one run.
 *
 * For each config (tiny, small): one broker; a worker (--streams 2, the
 * default warmup 2) serves HEAT GENs of each of KEYS keys (CFG Euler, four
 * latent sizes), so the broker knows them hot; then, for --prewarm 0 and
 * --prewarm 8 in turn, the worker is killed (SIGKILL, as a crash), the
 * broker lets it go, and a new worker is started while CLIENTS client
 * threads send GENs of the hot keys round robin, without pause, for
 * WINDOW seconds from its start (live: the traffic never stopped, GENs
 * wait at the broker until it registers), and again with the traffic
 * coming back 1 s after it registered (after: a restart the traffic was
 * drained from; a window of at most 15 s). Reported from the RESULTs (their
 * stats): the time from the worker's start to its registration, to the
 * first RESULT holding a replayed step and to the first RESULT whose every
 * step replayed (an upper bound: the RESULT comes after its steps), the
 * requests served and the eager steps among them in the window, and the
 * eager steps of each key's first request.
 * Usage: bench_prewarm [BUILD_DIR [WINDOW_S [CONFIG]]] (WINDOW_S 60) */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/error.h"
#include "bench/bench.h"
#include "bench/bench_proc.h"
#include "clients/c/client.h"

#define DIE(...) do { fprintf(stderr, "bench_prewarm: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define KEYS 4
#define HEAT 3
#define CLIENTS 4

typedef struct {
    const char *config;
    int64_t lat[KEYS][4]; /* C, F, H, W of each key */
    int64_t ctx[2];       /* L, T */
    int steps;
} case_t;

/* One run: a worker started at t0 into the clients' traffic. */
typedef struct {
    const char *ep;
    const case_t *k;
    const float *ctx, *unc;
    double t0;
    _Atomic double until;                          /* written by the main thread while clients run */
    _Atomic double start_at;                       /* clients send from then on (0: at once) */
    pthread_mutex_t mu;
    double registered, first_replay, all_replayed; /* s after t0; < 0: not seen */
    int requests, eager, replayed;
    int first_eager[KEYS];                         /* eager steps of each key's first RESULT; -1: none */
    atomic_int failed;
} run_t;

typedef struct {
    run_t *r;
    int idx;
} client_t;

static void *client_run(void *arg) {
    client_t *cl = arg;
    run_t *r = cl->r;
    reel_client_t *c = reel_client_new(r->ep);
    if (!c) {
        atomic_fetch_add(&r->failed, 1);
        return NULL;
    }
    size_t nl = 0;
    for (int k = 0; k < KEYS; k++) {
        size_t n = (size_t)(r->k->lat[k][0] * r->k->lat[k][1] * r->k->lat[k][2] * r->k->lat[k][3]);
        if (n > nl) nl = n;
    }
    float *out = malloc(nl * sizeof *out);
    while (bench_now() < r->start_at) usleep(1000);
    for (int i = 0; out && bench_now() < r->until; i++) {
        int key = (cl->idx + i) % KEYS;
        reel_gen_t g = { .model = r->k->config, .steps = r->k->steps, .shift = 3.0, .cfg = 4.0,
                         .seed = (uint64_t)(1000 * cl->idx + i), .context = r->ctx, .uncond = r->unc };
        memcpy(g.latent_shape, r->k->lat[key], sizeof g.latent_shape);
        memcpy(g.ctx_shape, r->k->ctx, sizeof g.ctx_shape);
        reel_gen_result_t res;
        wire_err_t err;
        if (reel_gen(c, &g, out, &res, NULL, NULL, 600000, &err) != 0) {
            fprintf(stderr, "bench_prewarm: gen: %s %s\n", err.code, err.message);
            atomic_fetch_add(&r->failed, 1);
            break;
        }
        double t = bench_now() - r->t0;
        pthread_mutex_lock(&r->mu);
        if (t <= r->until - r->t0) {
            r->requests++;
            r->eager += res.eager;
            r->replayed += res.replayed;
        }
        if (res.replayed > 0 && (r->first_replay < 0 || t < r->first_replay)) r->first_replay = t;
        if (res.eager == 0 && res.captured == 0 && (r->all_replayed < 0 || t < r->all_replayed)) r->all_replayed = t;
        if (r->first_eager[key] < 0) r->first_eager[key] = res.eager;
        pthread_mutex_unlock(&r->mu);
    }
    free(out);
    reel_client_destroy(&c);
    return NULL;
}

/* Workers the broker at c lists now; -1 when it does not answer. */
static int workers(reel_client_t *c) {
    reel_status_t *s = NULL;
    wire_err_t err;
    if (reel_status(c, &s, 2000, &err) != 0) return -1;
    int n = (int)reel_status_reply(s)->n_workers;
    reel_status_free(&s);
    return n;
}

static pid_t spawn_worker(const char *build, const char *wep, const char *wpath, const char *prewarm,
                          const char *log) {
    char worker[300];
    snprintf(worker, sizeof worker, "%s/reel-worker", build);
    char *argv[] = { worker, "--broker", (char *)wep, "--name", "w1", "--weights", (char *)wpath, "--streams", "2",
                     "--heartbeat-ms", "200", "--prewarm", (char *)prewarm, NULL };
    return bench_spawn(argv, log);
}

/* Kills the worker as a crash does, and waits until the broker let it go. */
static void crash(pid_t pw, reel_client_t *c) {
    kill(pw, SIGKILL);
    waitpid(pw, NULL, 0);
    for (int i = 0; i < 600 && workers(c) != 0; i++) usleep(50000);
    if (workers(c) != 0) DIE("the broker still lists the killed worker");
}

int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "build";
    double window = argc > 2 ? atof(argv[2]) : 60.0;
    const char *only = argc > 3 ? argv[3] : NULL;
    if (window < 1 || window > 3600) DIE("window must be 1..3600 s");
    char dir[] = "/tmp/reel-bench-prewarm.XXXXXX", cmd[1024], ctl[300];
    if (!mkdtemp(dir)) DIE("mkdtemp");
    snprintf(ctl, sizeof ctl, "%s/reelctl", build);
    if (access(ctl, X_OK)) DIE("build %s first", build);
    static const case_t cases[] = {
        { "tiny", { { 4, 2, 8, 8 }, { 4, 2, 8, 16 }, { 4, 2, 16, 8 }, { 4, 2, 16, 16 } }, { 5, 32 }, 4 },
        { "small", { { 16, 2, 8, 16 }, { 16, 2, 16, 16 }, { 16, 2, 8, 8 }, { 16, 2, 16, 8 } }, { 16, 256 }, 4 },
    };
    static const char *const modes[2] = { "0", "8" };
    static const char *const arrivals[2] = { "live", "+1 s" };
    printf("bench_prewarm: a worker (CPU, --streams 2, warmup 2) killed and restarted into %d clients' GENs of\n"
           "%d hot keys (CFG Euler, 4 steps), with --prewarm 0 and 8; times from its start; the window is %.0f s\n",
           CLIENTS, KEYS, window);
    printf("%-6s %-8s %-8s %8s %10s %14s %14s %9s %12s %16s\n", "config", "traffic", "prewarm", "window", "ready s",
           "1st replay s", "1st warm req s", "requests", "eager steps", "eager/1st req");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const case_t *k = &cases[ci];
        if (only && strcmp(only, k->config)) continue;
        char wpath[300], broker[300], cep[300], wep[300], db[300], blog[300], wlog[300];
        snprintf(wpath, sizeof wpath, "%s/%s.safetensors", dir, k->config);
        snprintf(cmd, sizeof cmd, "%s weights init --config %s --seed 1 --out %s 2>/dev/null", ctl, k->config, wpath);
        if (system(cmd) != 0) DIE("weights init");
        snprintf(broker, sizeof broker, "%s/reel-broker", build);
        snprintf(cep, sizeof cep, "ipc://%s/c%zu", dir, ci);
        snprintf(wep, sizeof wep, "ipc://%s/w%zu", dir, ci);
        snprintf(db, sizeof db, "%s/reel%zu.db", dir, ci);
        snprintf(blog, sizeof blog, "%s/broker%zu.log", dir, ci);
        char *bargv[] = { broker, "--clients", cep, "--workers", wep, "--catalog", db, "--heartbeat-ms", "200", NULL };
        pid_t pb = bench_spawn(bargv, blog);
        size_t nc = (size_t)(k->ctx[0] * k->ctx[1]);
        float *ctx = malloc(2 * nc * sizeof *ctx);
        if (!ctx) DIE("out of memory");
        for (size_t i = 0; i < 2 * nc; i++) ctx[i] = (float)((i * 7919 + 13) % 1000) / 500.0f - 1.0f;
        reel_client_t *c = reel_client_new(cep);
        if (!c) DIE("%s", reel_err_text());
        /* the keys get hot */
        snprintf(wlog, sizeof wlog, "%s/worker%zu-heat.log", dir, ci);
        pid_t pw = spawn_worker(build, wep, wpath, "0", wlog);
        bench_wait_workers(c, 1, "bench_prewarm");
        {
            for (int i = 0; i < KEYS * HEAT; i++) {
                reel_gen_t g = { .model = k->config, .steps = k->steps, .shift = 3.0, .cfg = 4.0, .seed = (uint64_t)i,
                                 .context = ctx, .uncond = ctx + nc };
                memcpy(g.latent_shape, k->lat[i % KEYS], sizeof g.latent_shape);
                memcpy(g.ctx_shape, k->ctx, sizeof g.ctx_shape);
                size_t nl = (size_t)(g.latent_shape[0] * g.latent_shape[1] * g.latent_shape[2] * g.latent_shape[3]);
                float *out = malloc(nl * sizeof *out);
                wire_err_t err;
                if (!out || reel_gen(c, &g, out, NULL, NULL, NULL, 600000, &err) != 0) DIE("heat: %s", err.message);
                free(out);
            }
        }
        for (int run = 0; run < 4; run++) {
            int m = run % 2, late = run / 2;
            double win = late && window > 15 ? 15 : window;
            crash(pw, c);
            run_t r = { .ep = cep, .k = k, .ctx = ctx, .unc = ctx + nc, .registered = -1, .first_replay = -1,
                        .all_replayed = -1 };
            pthread_mutex_init(&r.mu, NULL);
            atomic_init(&r.failed, 0);
            for (int i = 0; i < KEYS; i++) r.first_eager[i] = -1;
            r.t0 = bench_now();
            r.start_at = late ? 1e300 : 0; /* set once it registered */
            r.until = r.t0 + win;
            pthread_t th[CLIENTS];
            client_t cl[CLIENTS];
            for (int i = 0; i < CLIENTS; i++) {
                cl[i] = (client_t){ &r, i };
                if (pthread_create(&th[i], NULL, client_run, &cl[i])) DIE("pthread_create");
            }
            snprintf(wlog, sizeof wlog, "%s/worker%zu-%s.log", dir, ci, modes[m]);
            pw = spawn_worker(build, wep, wpath, modes[m], wlog);
            for (int i = 0; i < 6000 && workers(c) < 1; i++) usleep(5000);
            r.registered = bench_now() - r.t0;
            if (late) { /* the window counts from the traffic's return */
                pthread_mutex_lock(&r.mu);
                r.until = bench_now() + 1 + win;
                pthread_mutex_unlock(&r.mu);
                r.start_at = bench_now() + 1;
            }
            for (int i = 0; i < CLIENTS; i++) pthread_join(th[i], NULL);
            if (atomic_load(&r.failed)) DIE("%d clients failed", atomic_load(&r.failed));
            double fe = 0;
            int nk = 0;
            for (int i = 0; i < KEYS; i++)
                if (r.first_eager[i] >= 0) {
                    fe += r.first_eager[i];
                    nk++;
                }
            printf("%-6s %-8s %-8s %8.0f %10.3f %14.3f %14.3f %9d %12d %16.2f\n", k->config, arrivals[late], modes[m],
                   win, r.registered, r.first_replay, r.all_replayed, r.requests, r.eager, nk ? fe / nk : 0.0);
            fflush(stdout);
            pthread_mutex_destroy(&r.mu);
        }
        kill(pw, SIGTERM);
        waitpid(pw, NULL, 0);
        reel_client_destroy(&c);
        kill(pb, SIGTERM);
        waitpid(pb, NULL, 0);
        free(ctx);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) != 0;
}
