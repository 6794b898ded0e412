/* gpu_step_time.c -- one denoising step (CFG) eager vs graph replay, for
 * deploy/gpu-check.sh: the numbers for tiny, small and wan2.1-1.3b in BF16
 * on CUDA, with the replay checked bitwise against the eager step first.
 *
 *   gpu_step_time --config tiny|small|wan2.1-1.3b --size FxHxW --text L
 *                 [--layers N] [--dtype bf16|f32] [--backend cuda|cpu]
 *                 [--budget-s 30] [--tmp DIR]
 *                 [--attention auto|fused|decomposed] [--out FILE]
 *
 * --attention sets the mode (as $REEL_ATTN does) and the line names the
 * path the step's self-attention took (sdpa: cuDNN's fused SDPA;
 * fused-kernel: Reel's own one-launch kernel; decomposed) and why; --out writes the eager step's
 * latent (F32, tensor "latent") so two runs (fused and decomposed) can be
 * compared by gpu_compare.
 *
 * Weights are drawn here (nothing is read from disk but what this writes):
 * tdit_weights_init for configs under 200 M parameters; above that, one
 * block is drawn and repeated --layers times (the step's cost does not
 * depend on the values, and drawing 1.3 B normals would take half a
 * minute), stored in BF16, in --tmp (default /dev/shm when it has room,
 * else $TMPDIR or /tmp) and removed once loaded.
 *
 * The step: a warm-up eager step, a timed eager step (which also gives the
 * reference latent; skipped when the first step took over 5 s, which then
 * stands for both), a capture, a replay from the same inputs whose latent
 * must equal the eager one bit for bit; then rounds alternating `iters`
 * eager steps and `iters` replays, as many as fit in --budget-s (none when
 * one step is over 2 s: the single timed eager step and replay stand). The
 * medians are printed on one line ending in "OK"; any failure ends the line
 * with "FAIL <reason>" and exits 1 (no fallback to another backend). */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "model/loop.h"
#include "model/safetensors.h"
#include "model/tinydit.h"
#include "bench/bench.h"

#define MAX_ROUNDS 7

typedef struct {
    const char *config, *dtype, *backend, *tmp, *attention, *out;
    int64_t F, H, W, L, layers;
    double budget;
} opts_t;

/* A folder with room for `bytes` (twice over, for the .tmp of an atomic
 * save): the caller's, else /dev/shm, else $TMPDIR or /tmp. */
static const char *tmp_dir(const char *want, size_t bytes) {
    if (want) return want;
    struct statvfs v;
    if (statvfs("/dev/shm", &v) == 0 && access("/dev/shm", W_OK) == 0 &&
        (double)v.f_bavail * (double)v.f_frsize > 2.5 * (double)bytes)
        return "/dev/shm";
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

/* Writes weights for c to path: drawn outright when small; else block 0 of
 * a one-layer draw repeated c->layers times, in BF16. 0, or -1 with a
 * message. */
static int make_weights(const tdit_config_t *c, const char *path) {
    if (tdit_config_params(c) < 200000000) return tdit_weights_init(c, 1, path);
    tdit_config_t one = *c;
    one.layers = 1;
    char path1[1100];
    snprintf(path1, sizeof path1, "%s.one", path);
    if (tdit_weights_init(&one, 1, path1) != 0) return -1;
    st_file_t *f = st_open(path1);
    unlink(path1);
    if (!f) return -1;
    int rc = -1;
    st_writer_t *w = st_writer_new();
    uint16_t *bf = NULL;
    float *x = NULL;
    if (!w) goto out;
    char v[32];
    const struct { const char *k; int64_t v; } kv[] = {
        { "dim", c->dim }, { "heads", c->heads }, { "layers", c->layers },
        { "ffn_dim", c->ffn_dim }, { "in_channels", c->in_channels },
        { "text_dim", c->text_dim }, { "freq_dim", c->freq_dim },
    };
    if (st_writer_meta(w, "config", c->name)) goto out;
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        snprintf(v, sizeof v, "%" PRId64, kv[i].v);
        if (st_writer_meta(w, kv[i].k, v)) goto out;
    }
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        size_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        float *nx = realloc(x, (n ? n : 1) * sizeof *x);
        uint16_t *nb = realloc(bf, (n ? n : 1) * sizeof *bf);
        if (nx) x = nx;
        if (nb) bf = nb;
        if (!nx || !nb) { reel_fail(REEL_E_NOMEM, "out of memory"); goto out; }
        if (st_read_f32(f, t->name, -1, NULL, x) != 0) goto out;
        for (size_t j = 0; j < n; j++) bf[j] = kern_f32_to_bf16(x[j]);
        if (strncmp(t->name, "blocks.0.", 9) != 0) {
            if (st_writer_add(w, t->name, KERN_BF16, t->ndim, t->shape, bf)) goto out;
            continue;
        }
        for (int64_t l = 0; l < c->layers; l++) {
            char name[256];
            snprintf(name, sizeof name, "blocks.%" PRId64 ".%s", l, t->name + 9);
            if (st_writer_add(w, name, KERN_BF16, t->ndim, t->shape, bf)) goto out;
        }
    }
    rc = st_writer_save(w, path);
out:
    free(x);
    free(bf);
    st_writer_destroy(&w);
    st_close(&f);
    return rc;
}

static int run(const opts_t *o) {
    tdit_config_t c;
    kern_backend_kind_t kind;
    kern_dtype_t dt = strcmp(o->dtype, "bf16") ? KERN_F32 : KERN_BF16;
    kern_backend_t *b = NULL;
    kern_stream_t *s = NULL;
    tdit_model_t *m = NULL;
    tdit_ws_t *ws = NULL;
    kern_graph_t *g = NULL;
    float *lat = NULL, *ctx = NULL, *unc = NULL, *eager = NULL, *replay = NULL;
    char path[1024] = "";
    int rc = 1;
    char what[256];
    snprintf(what, sizeof what, "step %s %s %s", o->config, o->dtype, o->backend);
    if (tdit_config_builtin(o->config, &c) != 0) goto fail;
    if (o->layers > 0) c.layers = o->layers;
    const tdit_shape_t sh = { o->F, o->H, o->W, o->L, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    if (tdit_shape_validate(&sh) != 0) goto fail;
    if (kern_backend_kind_parse(o->backend, &kind) != 0 || !(b = kern_backend_new(kind, 0)) ||
        !(s = kern_stream_new(b)))
        goto fail;
    snprintf(what, sizeof what, "step %s %s %s %s", o->config, o->dtype, kern_backend_device_name(b),
             kern_backend_arch(b));
    if (o->attention) {
        kern_attn_mode_t am;
        if (kern_attention_mode_parse(o->attention, &am)) goto fail;
        kern_attention_set_mode(am);
    }
    const int64_t N = o->F * (o->H / 2) * (o->W / 2);
    const char *attn_why = "";
    const kern_attn_path_t attn = kern_attention_choose(kind, dt, N, N, c.dim / c.heads, &attn_why);
    const char *attn_name = attn == KERN_ATTN_SDPA ? "sdpa" : attn == KERN_ATTN_FUSED ? "fused-kernel" : "decomposed";

    double tw = bench_now();
    snprintf(path, sizeof path, "%s/reel-gpu-step-%ld-%s.safetensors",
             tmp_dir(o->tmp, (size_t)tdit_config_params(&c) * 2), (long)getpid(), o->config);
    if (make_weights(&c, path) != 0) goto fail;
    m = tdit_model_load_path(b, path, dt);
    unlink(path);
    path[0] = 0;
    if (!m) goto fail;
    tw = bench_now() - tw;

    if (!(ws = tdit_ws_new(m, s, &sh))) goto fail;
    size_t nl = (size_t)(c.in_channels * o->F * o->H * o->W), nc = (size_t)(o->L * c.text_dim);
    lat = malloc(nl * 4); ctx = malloc(nc * 4); unc = malloc(nc * 4);
    eager = malloc(nl * 4); replay = malloc(nl * 4);
    if (!lat || !ctx || !unc || !eager || !replay) { reel_fail(REEL_E_NOMEM, "out of host memory"); goto fail; }
    tdit_initial_latent(1, lat, nl);
    tdit_initial_latent(2, ctx, nc);
    tdit_initial_latent(3, unc, nc);
    const float sig[3] = { 0.9f, 0.8f, 0.9f };
    if (tdit_ws_bind_latent(ws, s, lat, nl) || tdit_ws_bind_context(ws, s, ctx, nc, false) ||
        tdit_ws_bind_context(ws, s, unc, nc, true) || tdit_ws_bind_step(ws, s, sig, 5.0f))
        goto fail;

    /* Warm-up, then the timed eager step that is also the reference. A
     * first step over 5 s is its own reference and time: the one-time
     * costs are small beside it, and a second one would not fit. */
    double t0 = bench_now();
    if (tdit_step(m, ws, s) || kern_stream_sync(s)) goto fail;
    double t_first = bench_now() - t0, t_eager1 = t_first;
    if (t_first <= 5.0) {
        if (tdit_ws_bind_latent(ws, s, lat, nl) || kern_stream_sync(s)) goto fail;
        t0 = bench_now();
        if (tdit_step(m, ws, s) || kern_stream_sync(s)) goto fail;
        t_eager1 = bench_now() - t0;
    }
    if (tdit_ws_read_latent(ws, s, eager, nl) || kern_stream_sync(s)) goto fail;
    if (o->out) {
        st_writer_t *wr = st_writer_new();
        const int64_t shape[4] = { c.in_channels, o->F, o->H, o->W };
        int wrc = !wr || st_writer_add_f32(wr, "latent", 4, shape, eager) || st_writer_save(wr, o->out);
        if (!wr) reel_fail(REEL_E_NOMEM, "out of host memory");
        st_writer_destroy(&wr);
        if (wrc) goto fail;
    }

    if (tdit_ws_bind_latent(ws, s, lat, nl) || kern_stream_sync(s)) goto fail;
    t0 = bench_now();
    if (kern_capture_begin(s) || tdit_step(m, ws, s) || kern_capture_end(s, &g)) goto fail;
    double t_cap = bench_now() - t0;
    if (tdit_ws_bind_latent(ws, s, lat, nl) || kern_stream_sync(s)) goto fail;
    t0 = bench_now();
    if (kern_graph_replay(g, s) || kern_stream_sync(s)) goto fail;
    double t_replay1 = bench_now() - t0;
    if (tdit_ws_read_latent(ws, s, replay, nl) || kern_stream_sync(s)) goto fail;
    size_t differ = 0, nonfinite = 0;
    for (size_t i = 0; i < nl; i++) {
        if (memcmp(&eager[i], &replay[i], sizeof eager[i]) != 0) differ++;
        if (!isfinite(eager[i])) nonfinite++;
    }
    if (nonfinite) {
        reel_fail(REEL_E_INTERNAL, "%zu of %zu latent values after the eager step are NaN/Inf", nonfinite, nl);
        goto fail;
    }
    if (differ) {
        reel_fail(REEL_E_INTERNAL, "graph replay differs from the eager step in %zu of %zu latent values", differ, nl);
        goto fail;
    }

    /* Rounds alternating eager and replay, so drift hits both alike. */
    double te[MAX_ROUNDS], tg[MAX_ROUNDS];
    int rounds = 0, iters = 1;
    double est = t_eager1 > t_replay1 ? t_eager1 : t_replay1;
    if (est <= 2.0) {
        iters = est > 0 ? (int)(0.05 / est) : 50;
        iters = iters < 1 ? 1 : iters > 50 ? 50 : iters;
        rounds = (int)(o->budget / (2.0 * iters * est + 1e-9));
        rounds = rounds < 1 ? 1 : rounds > MAX_ROUNDS ? MAX_ROUNDS : rounds;
    }
    for (int r = 0; r < rounds; r++) {
        if (tdit_ws_bind_latent(ws, s, lat, nl) || kern_stream_sync(s)) goto fail;
        t0 = bench_now();
        for (int i = 0; i < iters; i++)
            if (tdit_step(m, ws, s)) goto fail;
        if (kern_stream_sync(s)) goto fail;
        te[r] = (bench_now() - t0) / iters;
        if (tdit_ws_bind_latent(ws, s, lat, nl) || kern_stream_sync(s)) goto fail;
        t0 = bench_now();
        for (int i = 0; i < iters; i++)
            if (kern_graph_replay(g, s)) goto fail;
        if (kern_stream_sync(s)) goto fail;
        tg[r] = (bench_now() - t0) / iters;
    }
    double e = t_eager1, rp = t_replay1;
    if (rounds) {
        qsort(te, (size_t)rounds, sizeof *te, bench_cmp_double);
        qsort(tg, (size_t)rounds, sizeof *tg, bench_cmp_double);
        e = te[rounds / 2];
        rp = tg[rounds / 2];
    }
    printf("%s: latent [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] tokens %" PRId64 " text %" PRId64
           " layers %" PRId64 " CFG, attention %s (%s): eager %.3f ms, replay %.3f ms, eager/replay %.2fx (median of %d rounds x %d), "
           "%zu nodes, capture %.1f ms, first step %.1f ms, weights %.1f s; replay == eager bitwise: OK\n",
           what, c.in_channels, o->F, o->H, o->W, N, o->L, c.layers, attn_name, attn_why, e * 1e3,
           rp * 1e3, e / rp, rounds ? rounds : 1, iters, kern_graph_nodes(g), t_cap * 1e3, t_first * 1e3, tw);
    rc = 0;
    goto out;
fail:
    printf("%s: FAIL %s\n", what, reel_err_text());
out:
    if (path[0]) unlink(path);
    kern_graph_destroy(&g);
    tdit_ws_destroy(&ws);
    tdit_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
    free(lat); free(ctx); free(unc); free(eager); free(replay);
    return rc;
}

static int usage(void) {
    fprintf(stderr, "usage: gpu_step_time --config tiny|small|wan2.1-1.3b --size FxHxW --text L [--layers N] "
                    "[--dtype bf16|f32] [--backend cuda|cpu] [--budget-s S] [--tmp DIR] "
                    "[--attention auto|fused|decomposed] [--out FILE]\n");
    return 2;
}

int main(int argc, char **argv) {
    opts_t o = { NULL, "bf16", "cuda", NULL, NULL, NULL, 0, 0, 0, 0, 0, 30.0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!val) return usage();
        i++;
        if (!strcmp(a, "--config")) o.config = val;
        else if (!strcmp(a, "--dtype")) o.dtype = val;
        else if (!strcmp(a, "--backend")) o.backend = val;
        else if (!strcmp(a, "--tmp")) o.tmp = val;
        else if (!strcmp(a, "--attention")) o.attention = val;
        else if (!strcmp(a, "--out")) o.out = val;
        else if (!strcmp(a, "--text")) o.L = strtoll(val, &end, 10);
        else if (!strcmp(a, "--layers")) o.layers = strtoll(val, &end, 10);
        else if (!strcmp(a, "--budget-s")) o.budget = strtod(val, &end);
        else if (!strcmp(a, "--size")) {
            long long f, h, w;
            char tail;
            if (sscanf(val, "%lldx%lldx%lld%c", &f, &h, &w, &tail) != 3) return usage();
            o.F = f; o.H = h; o.W = w;
        } else return usage();
        if (end && *end) return usage();
    }
    if (!o.config || !o.F || o.L < 1 || !(o.budget > 0) || o.layers < 0 ||
        (strcmp(o.dtype, "bf16") && strcmp(o.dtype, "f32")))
        return usage();
    return run(&o);
}
