/* cmd_run.c -- `reelctl run`: one denoising loop in this process, no broker.
 * Inputs and output are safetensors files with tensors `latent` [C,F,H,W]
 * and `context` [L,T]. */
#include "ctl.h"
#include "base/error.h"
#include "base/opts.h"
#include "model/loop.h"
#include "model/tinydit.h"
#include "model/tdit_program.h"
#include "model/wan_ckpt.h"
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *weights, *latent, *context, *uncond, *out, *backend, *dtype;
    tdit_loop_t loop;
    bool have_cfg, have_seed;
    bool graphs;
    bool no_fallback;               /* --no-fallback: an unusable CUDA is an error */
    int warmup;
    int64_t size[3];   /* F, H, W when no --latent */
} run_opts_t;

static int set_solver(void *dst, const char *v, char *err, size_t len) {
    if (tdit_solver_parse(v, &((run_opts_t *)dst)->loop.solver) == 0) return 0;
    snprintf(err, len, "--solver: %s", kern_error());
    return -1;
}
static int set_cfg(void *dst, const char *v, char *err, size_t len) {
    (void)err, (void)len;
    double d;
    if (ctl_parse_double(v, &d)) return -1;
    ((run_opts_t *)dst)->loop.guidance = (float)d;
    ((run_opts_t *)dst)->have_cfg = true;
    return 0;
}
static int set_seed(void *dst, const char *v, char *err, size_t len) {
    (void)err, (void)len;
    if (ctl_parse_u64(v, &((run_opts_t *)dst)->loop.seed)) return -1;
    ((run_opts_t *)dst)->have_seed = true;
    return 0;
}
static int set_size(void *dst, const char *v, char *err, size_t len) {
    (void)err, (void)len;
    return ctl_parse_size(v, ((run_opts_t *)dst)->size) != 0 ? -1 : 0;
}

static const char *const on_off[] = { "off", "on", NULL };

#define O(f) offsetof(run_opts_t, f)
/* `reelctl run`'s options (its usage is reelctl's, ctl/reelctl.c). */
static const reel_opt_t run_rows[] = {
    { .name = "weights", .kind = REEL_OPT_STRING, .off = O(weights) },
    { .name = "latent", .kind = REEL_OPT_STRING, .off = O(latent) },
    { .name = "context", .kind = REEL_OPT_STRING, .off = O(context) },
    { .name = "uncond", .kind = REEL_OPT_STRING, .off = O(uncond) },
    { .name = "steps", .kind = REEL_OPT_INT, .off = O(loop.steps), .lo = -2147483647LL, .hi = 2147483647LL,
      .expect = "an integer" },
    { .name = "shift", .kind = REEL_OPT_DOUBLE, .off = O(loop.shift) },
    { .name = "cfg", .kind = REEL_OPT_SET, .set = set_cfg, .expect = "a number" },
    { .name = "sde", .kind = REEL_OPT_FLAG, .off = O(loop.sde) },
    { .name = "eta", .kind = REEL_OPT_FLOAT, .off = O(loop.eta) },
    { .name = "seed", .kind = REEL_OPT_SET, .set = set_seed, .expect = "a non-negative integer" },
    { .name = "backend", .kind = REEL_OPT_STRING, .off = O(backend) },
    { .name = "dtype", .kind = REEL_OPT_STRING, .off = O(dtype) },
    { .name = "out", .kind = REEL_OPT_STRING, .off = O(out) },
    { .name = "size", .kind = REEL_OPT_SET, .set = set_size,
      .expect = "FxHxW (e.g. 2x16x16; each 1..65536, F x H x W at most 2^24)" },
    { .name = "graphs", .kind = REEL_OPT_BOOL_CHOICE, .off = O(graphs), .choices = on_off },
    { .name = "warmup", .kind = REEL_OPT_INT, .off = O(warmup), .lo = 0, .hi = 1000 },
    { .name = "no-fallback", .kind = REEL_OPT_FLAG, .off = O(no_fallback) },
    { .name = "solver", .kind = REEL_OPT_SET, .set = set_solver },
};
#undef O

static int parse(int argc, char **argv, run_opts_t *r) {
    memset(r, 0, sizeof *r);
    r->loop.steps = -1;
    r->loop.shift = 1.0;
    r->loop.guidance = 1.0f;
    r->loop.eta = 0.7f;
    r->backend = "cpu";
    r->dtype = "f32";
    r->graphs = true;
    r->warmup = 2;
    char err[512];
    int rest = argc;
    if (reel_opts_parse(run_rows, sizeof run_rows / sizeof run_rows[0], r, argc, argv, &rest, err, sizeof err))
        return ctl_die(CTL_USAGE, "run: %s", err);
    if (rest < argc) return ctl_die(CTL_USAGE, "run: unexpected argument '%s'", argv[rest]);
    if (!r->weights || !r->context || !r->out)
        return ctl_die(CTL_USAGE, "run needs --weights, --context and --out");
    if (r->loop.steps < 0) return ctl_die(CTL_USAGE, "run needs --steps N");
    if (!r->latent && !r->size[0])
        return ctl_die(CTL_USAGE, "run needs --latent FILE, or --size FxHxW (with --seed K, default 0) to draw one");
    if (r->latent && r->size[0]) return ctl_die(CTL_USAGE, "--latent and --size exclude each other");
    if (r->uncond && !r->have_cfg) return ctl_die(CTL_USAGE, "--uncond needs --cfg G");
    if (r->have_cfg && !r->uncond) return ctl_die(CTL_USAGE, "--cfg needs --uncond U.safetensors");
    if (tdit_loop_validate(&r->loop) != 0) return ctl_die(CTL_USAGE, "%s", kern_error());
    return 0;
}

static int write_output(const char *path, const int64_t *shape, const float *x, const run_opts_t *r,
                        const tdit_config_t *c) {
    st_writer_t *w = st_writer_new();
    if (!w) return -1;
    char v[64];
    int rc = st_writer_add_f32(w, "latent", 4, shape, x);
    snprintf(v, sizeof v, "%d", r->loop.steps);
    rc = rc ? rc : st_writer_meta(w, "steps", v);
    snprintf(v, sizeof v, "%.9g", r->loop.shift);
    rc = rc ? rc : st_writer_meta(w, "shift", v);
    snprintf(v, sizeof v, "%.9g", r->have_cfg ? r->loop.guidance : 0.0);
    rc = rc ? rc : st_writer_meta(w, "cfg", v);
    rc = rc ? rc : st_writer_meta(w, "sampler", r->loop.sde ? "sde" : tdit_solver_name(r->loop.solver));
    rc = rc ? rc : st_writer_meta(w, "config", c->name);
    rc = rc ? rc : st_writer_save(w, path);
    st_writer_destroy(&w);
    return rc;
}

int cmd_run(int argc, char **argv) {
    run_opts_t r;
    int code = parse(argc, argv, &r);
    if (code) return code;
    kern_backend_kind_t kind;
    if (kern_backend_kind_parse(r.backend, &kind) != 0) return ctl_die(CTL_USAGE, "--backend: %s", kern_error());
    kern_dtype_t dtype;
    if (!strcmp(r.dtype, "f32")) dtype = KERN_F32;
    else if (!strcmp(r.dtype, "bf16")) dtype = KERN_BF16;
    else return ctl_die(CTL_USAGE, "--dtype: '%s' is not f32 or bf16", r.dtype);

    float *lat = NULL, *ctx = NULL, *unc = NULL, *out = NULL;
    int64_t lshape[4] = { 0 }, cshape[2], ushape[2];
    kern_backend_t *b = NULL;
    kern_stream_t *s = NULL;
    tdit_model_t *m = NULL;
    tdit_ws_t *ws = NULL;
    cap_cache_t *cache = NULL;
    code = CTL_USAGE;

    st_file_t *wf = wan_ckpt_load(r.weights); /* any layout a Wan2.1 user has (wan_ckpt.h) */
    if (!wf) { ctl_die(CTL_USAGE, "%s", kern_error()); goto out; }
    tdit_config_t cfg;
    if (tdit_config_from_meta(wf, &cfg) != 0) { ctl_die(CTL_USAGE, "%s: %s", r.weights, kern_error()); goto out; }
    if (r.latent && !(lat = ctl_read_tensor(r.latent, "latent", 4, lshape))) goto out;
    if (!(ctx = ctl_read_tensor(r.context, "context", 2, cshape))) goto out;
    if (r.uncond && !(unc = ctl_read_tensor(r.uncond, "context", 2, ushape))) goto out;
    code = CTL_USAGE;
    if (!r.latent) {
        lshape[0] = cfg.in_channels;
        memcpy(lshape + 1, r.size, sizeof r.size);
    }
    if (lshape[0] != cfg.in_channels) {
        ctl_die(CTL_USAGE, "%s: latent has %" PRId64 " channels, config %s expects %" PRId64,
                r.latent, lshape[0], cfg.name, cfg.in_channels);
        goto out;
    }
    if (cshape[1] != cfg.text_dim) {
        ctl_die(CTL_USAGE, "%s: context width %" PRId64 ", config %s expects text_dim %" PRId64,
                r.context, cshape[1], cfg.name, cfg.text_dim);
        goto out;
    }
    if (unc && ((cfg.text_len == 0 && ushape[0] != cshape[0]) || ushape[1] != cshape[1])) {
        ctl_die(CTL_USAGE, "%s: uncond context is [%" PRId64 ",%" PRId64 "], context is [%" PRId64 ",%" PRId64 "]",
                r.uncond, ushape[0], ushape[1], cshape[0], cshape[1]);
        goto out;
    }
    if (cfg.text_len > 0) {
        /* Wan pads every context with zero rows to text_len and attends to
         * all of them (docs/MODEL.md): so does Reel for such a config. */
        if (cshape[0] > cfg.text_len || (unc && ushape[0] > cfg.text_len)) {
            ctl_die(CTL_USAGE, "%s: a context of %" PRId64 " rows; config %s pads contexts to text_len %" PRId64
                    " and takes at most that many", cshape[0] > cfg.text_len ? r.context : r.uncond,
                    cshape[0] > cfg.text_len ? cshape[0] : ushape[0], cfg.name, cfg.text_len);
            goto out;
        }
        float *pc = calloc((size_t)(cfg.text_len * cfg.text_dim), sizeof *pc);
        float *pu = unc ? calloc((size_t)(cfg.text_len * cfg.text_dim), sizeof *pu) : NULL;
        if (!pc || (unc && !pu)) {
            free(pc);
            free(pu);
            ctl_die(CTL_FAIL, "out of memory");
            goto out;
        }
        memcpy(pc, ctx, (size_t)(cshape[0] * cshape[1]) * sizeof *pc);
        free(ctx);
        ctx = pc;
        cshape[0] = cfg.text_len;
        if (unc) {
            memcpy(pu, unc, (size_t)(ushape[0] * ushape[1]) * sizeof *pu);
            free(unc);
            unc = pu;
            ushape[0] = cfg.text_len;
        }
    }

    code = CTL_FAIL;
    b = kern_backend_new(kind, 0);
    if (!b && kind == KERN_BACKEND_CUDA && r.no_fallback) {
        /* A device check must never compare the CPU with itself. */
        ctl_die(CTL_FAIL, "%s (and --no-fallback was given)", kern_error());
        goto out;
    }
    if (!b && kind == KERN_BACKEND_CUDA) {
        fprintf(stderr, "reelctl: %s; using the CPU backend\n", kern_error());
        b = kern_backend_cpu_new();
        dtype = KERN_F32;
    }
    if (!b) { ctl_die(CTL_FAIL, "%s", kern_error()); goto out; }
    if (!(s = kern_stream_new(b))) { ctl_die(CTL_FAIL, "%s", kern_error()); goto out; }
    if (!(m = tdit_model_load(b, wf, dtype))) { ctl_die(CTL_USAGE, "%s: %s", r.weights, kern_error()); code = CTL_USAGE; goto out; }
    st_close(&wf);
    tdit_shape_t shape = { lshape[1], lshape[2], lshape[3], cshape[0], unc != NULL, 1, r.loop.solver };
    if (tdit_shape_validate(&shape) != 0) { ctl_die(CTL_USAGE, "%s", kern_error()); code = CTL_USAGE; goto out; }
    if (!r.graphs && !(ws = tdit_ws_new(m, s, &shape))) { ctl_die(CTL_USAGE, "%s", kern_error()); code = CTL_USAGE; goto out; }
    size_t n = (size_t)(lshape[0] * lshape[1] * lshape[2] * lshape[3]);
    if (!(out = malloc(n * sizeof *out))) { ctl_die(CTL_FAIL, "out of memory"); goto out; }
    tdit_run_stats_t st = { 0 };
    if (r.graphs) {
        cap_options_t co = cap_options_default();
        co.warmup = r.warmup;
        cache = cap_cache_new(b, &co);
        if (!cache || tdit_register_weights(cache, m, 1) != 0 ||
            tdit_generate_cached(m, cache, s, NULL, &shape, &r.loop, lat, ctx, unc, out, &st) != 0) {
            ctl_die(CTL_FAIL, "%s", kern_error());
            goto out;
        }
    } else {
        tdit_loop_stats_t es = { 0 };
        if (tdit_generate(m, ws, s, &r.loop, lat, ctx, unc, out, &es) != 0) { ctl_die(CTL_FAIL, "%s", kern_error()); goto out; }
        st.steps = st.eager = es.steps_run;
        st.declines[CAP_DECLINE_OVERRIDE] = es.steps_run;
        st.seconds = es.seconds;
    }
    if (write_output(r.out, lshape, out, &r, &cfg) != 0) { ctl_die(CTL_FAIL, "%s", kern_error()); goto out; }
    fprintf(stderr, "reelctl: %s on %s (%s): latent [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "], "
            "%d %s steps%s, %.3f s (%.1f ms/step) -> %s\n",
            cfg.name, kern_backend_device_name(b), kern_backend_arch(b), lshape[0], lshape[1], lshape[2],
            lshape[3], st.steps, r.loop.sde ? "SDE" : r.loop.solver == TDIT_SOLVER_EULER ? "Euler" : tdit_solver_name(r.loop.solver),
            unc ? " with CFG" : "",
            st.seconds, 1e3 * st.seconds / (st.steps ? st.steps : 1), r.out);
    fprintf(stderr, "reelctl: graphs %s: %d captured, %d replayed, %d eager", r.graphs ? "on" : "off",
            st.captured, st.replayed, st.eager);
    const char *sep = " (";
    for (int i = 0; i < CAP_DECLINE_COUNT; i++)
        if (st.declines[i]) {
            fprintf(stderr, "%s%s %d", sep, cap_reason_name((cap_reason_t)i), st.declines[i]);
            sep = ", ";
        }
    fprintf(stderr, "%s\n", sep[0] == ',' ? ")" : "");
    code = CTL_OK;
out:
    cap_cache_destroy(&cache);
    tdit_ws_destroy(&ws);
    tdit_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
    st_close(&wf);
    free(lat); free(ctx); free(unc); free(out);
    return code;
}
