/* bench_groups.c -- groups of rollouts (GEN n = G, docs/PROTOCOL.md) against
 * the same G samples sent as G single requests at once, through the same
 * reel-broker and reel-worker (CPU backend, ipc), measured side by side.
 *
 * For each config (tiny, small) and each G in 1, 4, 8, 16: one rep sends
 * the group as one GEN with n = G (the worker runs batched steps, batch G
 * in the capture key) and, in the other order on alternate reps, G GENs
 * at once from G client threads (the worker's streams interleave their
 * steps). Both are SDE rollouts with CFG of the same seeds, graphs warm
 * (a first untimed round captures every key). samples/s = G / wall time
 * from the first send to the last RESULT; the summary is the median over
 * the reps and the ratio batched / singles. The batched samples are
 * checked bitwise equal to the singles in every rep.
 * Usage: bench_groups [BUILD_DIR [REPS [STREAMS]]] */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/error.h"
#include "clients/c/client.h"
#include "bench/bench.h"
#include "bench/bench_proc.h"

#define DIE(...) do { fprintf(stderr, "bench_groups: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define REPS_MAX 9
#define G_MAX 16


typedef struct {
    const char *config;
    int64_t lat[4];   /* C, F, H, W */
    int64_t ctx[2];   /* L, T */
    int steps;
} case_t;

typedef struct {
    const char *ep;
    reel_gen_t g;     /* the single request of one seed */
    float *out;
    int rc;
} one_t;

static void *run_one(void *arg) {
    one_t *o = arg;
    reel_client_t *c = reel_client_new(o->ep);
    wire_err_t err;
    o->rc = c ? reel_gen(c, &o->g, o->out, NULL, NULL, NULL, 600000, &err) : -1;
    if (o->rc) fprintf(stderr, "bench_groups: single gen: %s %s\n", c ? err.code : "", c ? err.message : reel_err_text());
    reel_client_destroy(&c);
    return NULL;
}

/* G single requests at once, one client thread each; out[i·nl..]. */
static double singles(const char *ep, const reel_gen_t *base, int G, const uint64_t *seeds, float *out, size_t nl) {
    one_t o[G_MAX];
    pthread_t th[G_MAX];
    double t0 = bench_now();
    for (int i = 0; i < G; i++) {
        o[i] = (one_t){ ep, *base, out + (size_t)i * nl, 0 };
        o[i].g.n = 1;
        o[i].g.seeds = NULL;
        o[i].g.seed = seeds[i];
        if (pthread_create(&th[i], NULL, run_one, &o[i])) DIE("pthread_create");
    }
    for (int i = 0; i < G; i++) pthread_join(th[i], NULL);
    double t = bench_now() - t0;
    for (int i = 0; i < G; i++)
        if (o[i].rc) DIE("a single request failed");
    return t;
}

static double batched(reel_client_t *c, const reel_gen_t *base, int G, const uint64_t *seeds, float *out,
                      reel_gen_result_t *r) {
    reel_gen_t g = *base;
    g.n = G;
    g.seeds = seeds;
    wire_err_t err;
    double t0 = bench_now();
    if (reel_gen(c, &g, out, r, NULL, NULL, 600000, &err) != 0) DIE("group of %d: %s %s", G, err.code, err.message);
    return bench_now() - t0;
}


int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "build";
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    const char *streams = argc > 3 ? argv[3] : "2";
    if (reps < 1 || reps > REPS_MAX) DIE("reps must be 1..%d", REPS_MAX);
    char dir[] = "/tmp/reel-bench-groups.XXXXXX", cmd[1024], broker[300], worker[300], ctl[300];
    if (!mkdtemp(dir)) DIE("mkdtemp");
    snprintf(broker, sizeof broker, "%s/reel-broker", build);
    snprintf(worker, sizeof worker, "%s/reel-worker", build);
    snprintf(ctl, sizeof ctl, "%s/reelctl", build);
    if (access(broker, X_OK) || access(worker, X_OK) || access(ctl, X_OK)) DIE("build %s first", build);
    static const case_t cases[] = {
        { "tiny", { 4, 2, 8, 8 }, { 5, 32 }, 4 },        /* 32 tokens a sample */
        { "small", { 16, 2, 8, 16 }, { 16, 256 }, 4 },   /* 64 tokens a sample */
    };
    static const int groups[] = { 1, 4, 8, 16 };
    printf("bench_groups: SDE rollouts with CFG, a group as one GEN (n = G, batched steps) vs G single GENs at once,\n"
           "one worker (CPU, --streams %s), graphs warm, %d reps, medians\n", streams, reps);
    printf("%-6s %3s %14s %14s %8s  %s\n", "config", "G", "batched smp/s", "singles smp/s", "ratio", "bitwise");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const case_t *k = &cases[ci];
        char wpath[300], cep[300], wep[300], db[300], blog[300], wlog[300];
        snprintf(wpath, sizeof wpath, "%s/%s.safetensors", dir, k->config);
        snprintf(cmd, sizeof cmd, "%s weights init --config %s --seed 1 --out %s 2>/dev/null", ctl, k->config, wpath);
        if (system(cmd) != 0) DIE("weights init");
        snprintf(cep, sizeof cep, "ipc://%s/c%zu", dir, ci);
        snprintf(wep, sizeof wep, "ipc://%s/w%zu", dir, ci);
        snprintf(db, sizeof db, "%s/reel%zu.db", dir, ci);
        snprintf(blog, sizeof blog, "%s/broker%zu.log", dir, ci);
        snprintf(wlog, sizeof wlog, "%s/worker%zu.log", dir, ci);
        char *bargv[] = { broker, "--clients", cep, "--workers", wep, "--catalog", db, NULL };
        char *wargv[] = { worker, "--broker", wep, "--name", "w1", "--weights", wpath, "--streams", (char *)streams,
                          "--warmup", "1", NULL };
        pid_t pb = bench_spawn(bargv, blog), pw = bench_spawn(wargv, wlog);
        reel_client_t *c = reel_client_new(cep);
        if (!c) DIE("%s", reel_err_text());
        bench_wait_workers(c, 1, "bench_groups");
        size_t nl = (size_t)(k->lat[0] * k->lat[1] * k->lat[2] * k->lat[3]), nc = (size_t)(k->ctx[0] * k->ctx[1]);
        float *ctx = malloc(nc * sizeof *ctx), *unc = malloc(nc * sizeof *unc);
        float *a = malloc(G_MAX * nl * sizeof *a), *b = malloc(G_MAX * nl * sizeof *b);
        if (!ctx || !unc || !a || !b) DIE("out of memory");
        for (size_t i = 0; i < nc; i++) {
            ctx[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
            unc[i] = (float)((i * 104729) % 1000) / 500.0f - 1.0f;
        }
        reel_gen_t base = { .model = k->config, .steps = k->steps, .shift = 3.0, .cfg = 4.0, .sde = true, .eta = 0.7,
                            .context = ctx, .uncond = unc };
        memcpy(base.latent_shape, k->lat, sizeof k->lat);
        memcpy(base.ctx_shape, k->ctx, sizeof k->ctx);
        for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
            int G = groups[gi];
            uint64_t seeds[G_MAX];
            for (int i = 0; i < G; i++) seeds[i] = 1000 + (uint64_t)i;
            reel_gen_result_t r;
            /* warm: capture the group's key and the single key */
            batched(c, &base, G, seeds, a, &r);
            batched(c, &base, G, seeds, a, &r);
            singles(cep, &base, G, seeds, b, nl);
            singles(cep, &base, G, seeds, b, nl);
            double tb[REPS_MAX], ts[REPS_MAX], q[REPS_MAX];
            bool same = true;
            for (int rep = 0; rep < reps; rep++) {
                if (rep % 2) ts[rep] = singles(cep, &base, G, seeds, b, nl);
                tb[rep] = batched(c, &base, G, seeds, a, &r);
                if (!(rep % 2)) ts[rep] = singles(cep, &base, G, seeds, b, nl);
                q[rep] = ts[rep] / tb[rep];
                same = same && !memcmp(a, b, (size_t)G * nl * sizeof *a);
            }
            double mb = bench_median(tb, reps), ms = bench_median(ts, reps), mq = bench_median(q, reps);
            printf("%-6s %3d %14.1f %14.1f %7.2fx  %s (last group: replayed %d, eager %d)\n", k->config, G, G / mb,
                   G / ms, mq, same ? "yes" : "NO", r.replayed, r.eager);
            fflush(stdout);
            if (!same) DIE("a batched sample differs from its single request");
        }
        free(ctx);
        free(unc);
        free(a);
        free(b);
        reel_client_destroy(&c);
        kill(pw, SIGTERM);
        kill(pb, SIGTERM);
        waitpid(pw, NULL, 0);
        waitpid(pb, NULL, 0);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) != 0;
}
