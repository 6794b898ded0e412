/* bench_lora.c -- a LoRA sync against a full sync of the same model
 * (issue 27), side by side in one run on loopback TCP: a reel-broker
 * (--weights-dir) and two reel-workers (--lora, --policy evict) serving a
 * model of wan2.1-1.3b's widths (dim 1536, 12 heads, FFN 8960, text 4096,
 * 16 channels) with LAYERS blocks (4 by default: what two workers, each
 * with its model and the kept base, and the files fit in on a 24 GB
 * machine in a few minutes; the real model has 30). A trainer here
 * publishes, alternately, a whole new version by value (reel_publish, as
 * `reelctl sync --upload`) and a rank-32, alpha-64 adapter on q, k, v, o
 * of both attentions by value (reel_publish_adapter, as `reelctl sync
 * --lora-upload`), each timed from its first byte to SYNC_DONE (both
 * workers applied it). After each, one GEN on the new version reports what
 * the sync cost the capture cache: captured, replayed and eager steps.
 * Then GEN step times on a LoRA version against the base (the adapter is
 * merged: the same kernels on the same shapes).
 * Usage: bench_lora [BUILD_DIR [REPS [LAYERS]]] */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/error.h"
#include "base/sha256.h"
#include "bench/bench.h"
#include "bench/bench_proc.h"
#include "clients/c/client.h"
#include "model/safetensors.h"

#define DIE(...) do { fprintf(stderr, "bench_lora: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define REPS_MAX 9
#define RANK 32
#define DIM 1536
#define STEPS 4

static void sh(const char *cmd) {
    if (system(cmd) != 0) DIE("%s", cmd);
}

/* A PEFT adapter folder dir/name: rank RANK on q, k, v, o of both
 * attentions of each of `layers` blocks, values from seed. */
static void make_adapter(const char *dir, const char *name, int layers, unsigned seed) {
    char path[512], cmd[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(cmd, sizeof cmd, "mkdir -p %s", path);
    sh(cmd);
    static const char *const mods[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
                                        "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o" };
    st_writer_t *w = st_writer_new();
    float *a = malloc((size_t)RANK * DIM * sizeof *a), *b = malloc((size_t)DIM * RANK * sizeof *b);
    if (!w || !a || !b) DIE("out of memory");
    srand(seed);
    for (int n = 0; n < layers; n++)
        for (int m = 0; m < 8; m++) {
            for (size_t i = 0; i < (size_t)RANK * DIM; i++) a[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.05f;
            for (size_t i = 0; i < (size_t)DIM * RANK; i++) b[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.05f;
            int64_t sa[2] = { RANK, DIM }, sb[2] = { DIM, RANK };
            char ka[128], kb[128];
            snprintf(ka, sizeof ka, "base_model.model.blocks.%d.%s.lora_A.weight", n, mods[m]);
            snprintf(kb, sizeof kb, "base_model.model.blocks.%d.%s.lora_B.weight", n, mods[m]);
            if (st_writer_add_f32(w, ka, 2, sa, a) || st_writer_add_f32(w, kb, 2, sb, b)) DIE("%s", reel_err_text());
        }
    char file[600];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", path);
    if (st_writer_save(w, file) != 0) DIE("%s", reel_err_text());
    st_writer_destroy(&w);
    free(a);
    free(b);
    snprintf(file, sizeof file, "%s/adapter_config.json", path);
    FILE *f = fopen(file, "w");
    if (!f) DIE("%s", file);
    fprintf(f, "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %d, \"target_modules\": [\"q\", \"k\", \"v\", "
               "\"o\"], \"bias\": \"none\", \"use_dora\": false}", RANK, 2 * RANK);
    fclose(f);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) DIE("%s", path);
    char *t = calloc(1, 8192);
    if (!t || fread(t, 1, 8191, f) == 0) DIE("%s: empty", path);
    fclose(f);
    return t;
}

/* One GEN on `version` (STEPS steps, no CFG): its result. */
static reel_gen_result_t gen(reel_client_t *c, uint64_t version, const float *ctx, float *out) {
    reel_gen_t g;
    memset(&g, 0, sizeof g);
    g.model = "wide";
    g.version = version;
    g.steps = STEPS;
    g.shift = 3.0;
    g.cfg = 1.0;
    g.seed = 7;
    g.latent_shape[0] = 16, g.latent_shape[1] = 1, g.latent_shape[2] = 16, g.latent_shape[3] = 16;
    g.context = ctx;
    g.ctx_shape[0] = 16, g.ctx_shape[1] = 4096;
    reel_gen_result_t r;
    wire_err_t err;
    if (reel_gen(c, &g, out, &r, NULL, NULL, 600000, &err) != 0) DIE("gen v%llu: %s %s", (unsigned long long)version,
                                                                      err.code, err.message);
    return r;
}

/* A sync by value: full (path: the weights file) or an adapter (path: its
 * folder) on base. Seconds from the first byte to SYNC_DONE. */
static double publish(reel_client_t *c, uint64_t version, uint64_t base, const char *path) {
    char file[600], hex[65];
    snprintf(file, sizeof file, "%s%s", path, base ? "/adapter_model.safetensors" : "");
    if (reel_sha256_file(file, hex) != 0) DIE("%s", reel_err_text());
    reel_sync_result_t r;
    wire_err_t err;
    sync();
    double t0 = bench_now();
    int rc;
    if (base) {
        char cfg[600];
        snprintf(cfg, sizeof cfg, "%s/adapter_config.json", path);
        char *text = slurp(cfg);
        t0 = bench_now();
        rc = reel_publish_adapter(c, "transformer", version, base, hex, file, text, 600000, NULL, NULL, &r, 600000,
                                  &err);
        free(text);
    } else {
        rc = reel_publish(c, "transformer", version, hex, file, 600000, NULL, NULL, &r, 600000, &err);
    }
    if (rc != 0 || !r.complete)
        DIE("sync v%llu: %s %s (applied %s, failed %s)", (unsigned long long)version, err.code, err.message, r.applied,
            r.failed);
    return bench_now() - t0;
}

int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "build";
    int reps = argc > 2 ? atoi(argv[2]) : 3, layers = argc > 3 ? atoi(argv[3]) : 4;
    if (reps < 1 || reps > REPS_MAX || layers < 1 || layers > 40) DIE("usage: bench_lora [BUILD [REPS [LAYERS]]]");
    wire_tune_malloc();
    char dir[] = "/tmp/reel-bench-lora.XXXXXX", cmd[1200], broker[300], worker[300], ctl[300];
    if (!mkdtemp(dir)) DIE("mkdtemp");
    snprintf(broker, sizeof broker, "%s/reel-broker", build);
    snprintf(worker, sizeof worker, "%s/reel-worker", build);
    snprintf(ctl, sizeof ctl, "%s/reelctl", build);
    if (access(broker, X_OK) || access(worker, X_OK) || access(ctl, X_OK)) DIE("build %s first", build);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/store %s/w %s/tr && printf '{\"name\": \"wide\", \"dim\": 1536, \"heads\": "
             "12, \"layers\": %d, \"ffn_dim\": 8960, \"in_channels\": 16, \"text_dim\": 4096, \"freq_dim\": 256}' "
             "> %s/wide.json", dir, dir, dir, layers, dir);
    sh(cmd);
    /* two full versions (v1 the workers start on; the other alternates) */
    for (int v = 1; v <= 2; v++) {
        snprintf(cmd, sizeof cmd, "%s weights init --config %s/wide.json --seed %d --out %s/%s/v%d.safetensors "
                 "2>/dev/null", ctl, dir, v, dir, v == 1 ? "w" : "tr", v);
        sh(cmd);
    }
    make_adapter(dir, "tr/lora_a", layers, 1);
    make_adapter(dir, "tr/lora_b", layers, 2);
    char full[400], la[400], lb[400], wts[400];
    snprintf(full, sizeof full, "%s/tr/v2.safetensors", dir);
    snprintf(la, sizeof la, "%s/tr/lora_a", dir);
    snprintf(lb, sizeof lb, "%s/tr/lora_b", dir);
    snprintf(wts, sizeof wts, "%s/w/v1.safetensors", dir);
    long full_bytes = file_size(full);
    snprintf(cmd, sizeof cmd, "%s/adapter_model.safetensors", la);
    long lora_bytes = file_size(cmd);

    int port = 33000 + getpid() % 20000;
    char cep[64], wep[64], store[300], log[300];
    snprintf(cep, sizeof cep, "tcp://127.0.0.1:%d", port);
    snprintf(wep, sizeof wep, "tcp://127.0.0.1:%d", port + 1);
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(log, sizeof log, "%s/broker.log", dir);
    char *bargv[] = { broker, "--clients", cep, "--workers", wep, "--catalog", "", "--weights-dir", store, NULL };
    pid_t pids[3];
    pids[0] = bench_spawn(bargv, log);
    for (int i = 0; i < 2; i++) {
        char name[16], wlog[300], wdir[300];
        snprintf(name, sizeof name, "w%d", i + 1);
        snprintf(wlog, sizeof wlog, "%s/w%d.log", dir, i + 1);
        snprintf(wdir, sizeof wdir, "%s/w", dir);
        char *wargv[] = { worker, "--broker", wep, "--name", name, "--weights", wts, "--weights-dir", wdir,
                          "--streams", "1", "--lora", "--policy", "evict", "--warmup", "1", NULL };
        pids[1 + i] = bench_spawn(wargv, wlog);
    }
    reel_client_t *c = reel_client_new(cep);
    if (!c) DIE("%s", reel_err_text());
    bench_wait_workers(c, 2, "bench_lora");
    printf("bench_lora: wan2.1-1.3b widths, %d layers (the real model has 30), 2 workers (--lora, --policy evict), "
           "by value over loopback, %d reps\n", layers, reps);
    printf("bytes a sync moves to the broker: full %ld, LoRA rank %d on q,k,v,o of both attentions %ld (%.2f%%; "
           "goal <= 2%%)\n", full_bytes, RANK, lora_bytes, 100.0 * (double)lora_bytes / (double)full_bytes);
    float *ctx = malloc(16 * 4096 * sizeof *ctx), *out = malloc(16 * 16 * 16 * sizeof *out);
    for (int i = 0; i < 16 * 4096; i++) ctx[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    /* graphs captured on the starting version, both workers */
    for (int i = 0; i < 4; i++) gen(c, 1, ctx, out);

    double tf[REPS_MAX], tl[REPS_MAX];
    int fcap[REPS_MAX], frep[REPS_MAX], feag[REPS_MAX], lcap[REPS_MAX], lrep[REPS_MAX], leag[REPS_MAX];
    uint64_t v = 1, base = 1;
    for (int k = 0; k < reps; k++) {
        /* a full sync: a new base (v1's file and v2's alternate, as different versions) */
        tf[k] = publish(c, ++v, 0, k % 2 ? wts : full);
        base = v;
        reel_gen_result_t r = gen(c, v, ctx, out);
        fcap[k] = r.captured, frep[k] = r.replayed, feag[k] = r.eager;
        for (int i = 0; i < 3; i++) gen(c, v, ctx, out); /* captured again, on both workers */
        tl[k] = publish(c, ++v, base, k % 2 ? lb : la);
        r = gen(c, v, ctx, out);
        lcap[k] = r.captured, lrep[k] = r.replayed, leag[k] = r.eager;
        printf("rep %d: full sync %.3f s (next GEN: %d captured, %d replayed, %d eager); LoRA sync %.3f s "
               "(next GEN: %d captured, %d replayed, %d eager); LoRA / full %.3f\n", k + 1, tf[k], fcap[k], frep[k],
               feag[k], tl[k], lcap[k], lrep[k], leag[k], tl[k] / tf[k]);
        fflush(stdout);
    }
    double q[REPS_MAX];
    for (int k = 0; k < reps; k++) q[k] = tl[k] / tf[k];
    printf("\nmedians: full sync %.3f s, LoRA sync %.3f s: LoRA / full %.3f (goal <= 0.05)\n", bench_median(tf, reps),
           bench_median(tl, reps), bench_median(q, reps));
    /* step time with the adapter merged against the base: alternating GENs */
    double tb[REPS_MAX * 2], ta[REPS_MAX * 2];
    uint64_t vl = v;
    tf[0] = publish(c, ++v, 0, full); /* a base with graphs, then an adapter on it */
    base = v;
    for (int i = 0; i < 4; i++) gen(c, base, ctx, out);
    tl[0] = publish(c, ++v, base, la);
    vl = v;
    for (int i = 0; i < 4; i++) gen(c, vl, ctx, out);
    int n = 2 * reps;
    for (int k = 0; k < n; k++) {
        /* the base itself again, then the adapter: both served from the same graphs */
        char hex[65];
        if (reel_sha256_file(full, hex) != 0) DIE("%s", reel_err_text());
        reel_sync_result_t r;
        wire_err_t err;
        if (reel_sync_adapter(c, "transformer", ++v, base, hex, NULL, 600000, &r, 600000, &err) != 0 || !r.complete)
            DIE("base again: %s %s", err.code, err.message);
        reel_gen_result_t g = gen(c, v, ctx, out);
        tb[k] = g.seconds / STEPS;
        publish(c, ++v, base, la);
        g = gen(c, v, ctx, out);
        ta[k] = g.seconds / STEPS;
    }
    double mb = bench_median(tb, n), ma = bench_median(ta, n);
    printf("step time (the worker's seconds / %d steps, medians of %d): base %.4f s, with the adapter merged %.4f s: "
           "%.3fx (goal within 5%%)\n", STEPS, n, mb, ma, ma / mb);
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "grep -o 'applied transformer v[0-9]* .*' %s/w%d.log | tail -4 | sed 's/^/  w%d /'",
                 dir, i + 1, i + 1);
        if (system(cmd) != 0) printf("  (no sync lines in w%d's log)\n", i + 1);
    }
    free(ctx);
    free(out);
    reel_client_destroy(&c);
    for (int i = 0; i < 3; i++) kill(pids[i], SIGTERM);
    for (int i = 0; i < 3; i++) waitpid(pids[i], NULL, 0);
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "grep -o 'stopping; capture cache: .*' %s/w%d.log | sed 's/^/  w%d /'", dir, i + 1,
                 i + 1);
        if (system(cmd) != 0) printf("  (no closing line in w%d's log)\n", i + 1);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) != 0;
}
