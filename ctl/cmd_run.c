/* cmd_run.c -- `reelctl run`: one denoising loop in this process, no broker.
 * Inputs and output are safetensors files with tensors `latent` [C,F,H,W]
 * and `context` [L,T]. */
#include "ctl.h"
#include "base/error.h"
#include "base/opts.h"
#include "base/parse.h"
#include "model/loop.h"
#include "model/tinydit.h"
#include "model/tdit_program.h"
#include "model/wan_ckpt.h"
#include <float.h>
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

/* tdit_solver_parse's message, naming the option. */
static int set_solver(void *dst, const char *v) {
    if (tdit_solver_parse(v, &((run_opts_t *)dst)->loop.solver) == 0) return 0;
    return reel_fail_prefix("--solver: ");
}
/* The next three fail through their rows' expect (base/opts.h). */
static int set_cfg(void *dst, const char *v) {
    double d;
    if (reel_parse_f64(v, -FLT_MAX, FLT_MAX, "--cfg", &d)) return -1;
    ((run_opts_t *)dst)->loop.guidance = (float)d;
    ((run_opts_t *)dst)->have_cfg = true;
    return 0;
}
static int set_seed(void *dst, const char *v) {
    if (reel_parse_u64(v, 0, UINT64_MAX, "--seed", &((run_opts_t *)dst)->loop.seed)) return -1;
    ((run_opts_t *)dst)->have_seed = true;
    return 0;
}
static int set_size(void *dst, const char *v) { return ctl_size_parse(v, "--size", ((run_opts_t *)dst)->size); }

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

/* The command line into r, and what must go together. 0, or -1 with an
 * invalid error. */
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
    int rest = argc;
    if (reel_opts_parse(run_rows, sizeof run_rows / sizeof run_rows[0], r, argc, argv, &rest))
        return reel_fail_prefix("run: ");
    if (rest < argc) return reel_fail(REEL_E_INVALID, "run: unexpected argument '%s'", argv[rest]);
    if (!r->weights || !r->context || !r->out)
        return reel_fail(REEL_E_INVALID, "run needs --weights, --context and --out");
    if (r->loop.steps < 0) return reel_fail(REEL_E_INVALID, "run needs --steps N");
    if (!r->latent && !r->size[0])
        return reel_fail(REEL_E_INVALID,
                         "run needs --latent FILE, or --size FxHxW (with --seed K, default 0) to draw one");
    if (r->latent && r->size[0]) return reel_fail(REEL_E_INVALID, "--latent and --size exclude each other");
    if (r->uncond && !r->have_cfg) return reel_fail(REEL_E_INVALID, "--uncond needs --cfg G");
    if (r->have_cfg && !r->uncond) return reel_fail(REEL_E_INVALID, "--cfg needs --uncond U.safetensors");
    if (tdit_loop_validate(&r->loop) != 0) return ctl_fail_as(REEL_E_INVALID, NULL);
    return 0;
}

/* One `reelctl run`: what was asked, read, opened and computed; run_done
 * releases all of it, whichever phase failed. */
typedef struct {
    run_opts_t o;
    kern_backend_kind_t kind;
    kern_dtype_t dtype;
    st_file_t *wf;                  /* the weights, until the model holds them */
    tdit_config_t cfg;
    float *lat, *ctx, *unc, *out;   /* lat NULL: drawn from --seed */
    int64_t lshape[4], cshape[2], ushape[2];
    kern_backend_t *b;
    kern_stream_t *s;
    tdit_model_t *m;
    tdit_ws_t *ws;                  /* --graphs off */
    cap_cache_t *cache;             /* --graphs on */
    tdit_shape_t shape;
    tdit_run_stats_t st;
} run_t;

/* --backend and --dtype, the weights' config and the input tensors. 0, or
 * -1 with the error value set (exit status 2: the input is the user's to
 * fix, whatever the library called it). */
static int read_inputs(run_t *r) {
    if (kern_backend_kind_parse(r->o.backend, &r->kind) != 0) return ctl_fail_as(REEL_E_INVALID, "--backend: ");
    if (!strcmp(r->o.dtype, "f32")) r->dtype = KERN_F32;
    else if (!strcmp(r->o.dtype, "bf16")) r->dtype = KERN_BF16;
    else return reel_fail(REEL_E_INVALID, "--dtype: '%s' is not f32 or bf16", r->o.dtype);
    r->wf = wan_ckpt_load(r->o.weights); /* any layout a Wan2.1 user has (wan_ckpt.h) */
    if (!r->wf) return ctl_fail_as(REEL_E_INVALID, NULL);
    if (tdit_config_from_meta(r->wf, &r->cfg) != 0) return ctl_fail_as(REEL_E_INVALID, "%s: ", r->o.weights);
    if (r->o.latent && !(r->lat = ctl_read_tensor(r->o.latent, "latent", 4, r->lshape))) return -1;
    if (!(r->ctx = ctl_read_tensor(r->o.context, "context", 2, r->cshape))) return -1;
    if (r->o.uncond && !(r->unc = ctl_read_tensor(r->o.uncond, "context", 2, r->ushape))) return -1;
    if (!r->o.latent) {
        r->lshape[0] = r->cfg.in_channels;
        memcpy(r->lshape + 1, r->o.size, sizeof r->o.size);
    }
    return 0;
}

/* The inputs against the config: channels, context width, the uncond's
 * shape, and at most text_len rows where the config pads. 0, or -1 with
 * an invalid error. */
static int check_inputs(const run_t *r) {
    const tdit_config_t *c = &r->cfg;
    const int64_t *cs = r->cshape, *us = r->ushape;
    if (r->lshape[0] != c->in_channels)
        return reel_fail(REEL_E_INVALID, "%s: latent has %" PRId64 " channels, config %s expects %" PRId64,
                         r->o.latent, r->lshape[0], c->name, c->in_channels);
    if (cs[1] != c->text_dim)
        return reel_fail(REEL_E_INVALID, "%s: context width %" PRId64 ", config %s expects text_dim %" PRId64,
                         r->o.context, cs[1], c->name, c->text_dim);
    if (r->unc && ((c->text_len == 0 && us[0] != cs[0]) || us[1] != cs[1]))
        return reel_fail(REEL_E_INVALID,
                         "%s: uncond context is [%" PRId64 ",%" PRId64 "], context is [%" PRId64 ",%" PRId64 "]",
                         r->o.uncond, us[0], us[1], cs[0], cs[1]);
    if (c->text_len > 0 && (cs[0] > c->text_len || (r->unc && us[0] > c->text_len)))
        return reel_fail(REEL_E_INVALID,
                         "%s: a context of %" PRId64 " rows; config %s pads contexts to text_len %" PRId64
                         " and takes at most that many", cs[0] > c->text_len ? r->o.context : r->o.uncond,
                         cs[0] > c->text_len ? cs[0] : us[0], c->name, c->text_len);
    return 0;
}

/* *x of rows x width, grown with zero rows to text_len (the new buffer
 * replaces it; rows too). 0, or -1 with a nomem error (*x unchanged). */
static int pad_rows(float **x, int64_t *rows, int64_t width, int64_t text_len) {
    float *p = calloc((size_t)(text_len * width), sizeof *p);
    if (!p) return reel_fail(REEL_E_NOMEM, "out of memory");
    memcpy(p, *x, (size_t)(*rows * width) * sizeof *p);
    free(*x);
    *x = p;
    *rows = text_len;
    return 0;
}

/* Wan pads every context with zero rows to text_len and attends to all of
 * them (docs/MODEL.md): so does Reel for such a config. 0, or -1. */
static int pad_contexts(run_t *r) {
    int64_t tl = r->cfg.text_len;
    if (tl <= 0) return 0;
    if (pad_rows(&r->ctx, &r->cshape[0], r->cshape[1], tl) != 0) return -1;
    return r->unc ? pad_rows(&r->unc, &r->ushape[0], r->ushape[1], tl) : 0;
}

/* The backend (the CPU in place of an unusable CUDA, unless
 * --no-fallback), a stream, the model on it and the step shape. 0, or -1
 * with the error value set: the backend's failures exit 1, the model's
 * and the shape's 2 (as reelctl always has). */
static int open_model(run_t *r) {
    r->b = kern_backend_new(r->kind, 0);
    if (!r->b && r->kind == KERN_BACKEND_CUDA && r->o.no_fallback) {
        /* A device check must never compare the CPU with itself. */
        ctl_fail_as(REEL_E_DEVICE, NULL); /* exit 1, even in a build without CUDA */
        return reel_fail(reel_err_code(), "%s (and --no-fallback was given)", reel_err_text());
    }
    if (!r->b && r->kind == KERN_BACKEND_CUDA) {
        fprintf(stderr, "reelctl: %s; using the CPU backend\n", reel_err_text());
        r->b = kern_backend_cpu_new();
        r->dtype = KERN_F32;
    }
    if (!r->b) return ctl_fail_as(REEL_E_DEVICE, NULL);
    if (!(r->s = kern_stream_new(r->b))) return ctl_fail_as(REEL_E_DEVICE, NULL);
    if (!(r->m = tdit_model_load(r->b, r->wf, r->dtype))) return ctl_fail_as(REEL_E_INVALID, "%s: ", r->o.weights);
    st_close(&r->wf);
    r->shape = (tdit_shape_t){ r->lshape[1], r->lshape[2], r->lshape[3], r->cshape[0], r->unc != NULL, 1,
                               r->o.loop.solver };
    if (tdit_shape_validate(&r->shape) != 0) return ctl_fail_as(REEL_E_INVALID, NULL);
    if (!r->o.graphs && !(r->ws = tdit_ws_new(r->m, r->s, &r->shape))) return ctl_fail_as(REEL_E_INVALID, NULL);
    return 0;
}

/* The loop: through a capture cache (--graphs on), or eagerly, every step
 * then counted eager (declined: override). 0, or -1 with the error value
 * set (exit status 1). */
static int generate(run_t *r) {
    size_t n = (size_t)(r->lshape[0] * r->lshape[1] * r->lshape[2] * r->lshape[3]);
    if (!(r->out = malloc(n * sizeof *r->out))) return reel_fail(REEL_E_NOMEM, "out of memory");
    if (r->o.graphs) {
        cap_options_t co = cap_options_default();
        co.warmup = r->o.warmup;
        r->cache = cap_cache_new(r->b, &co);
        if (!r->cache || tdit_register_weights(r->cache, r->m, 1) != 0 ||
            tdit_generate_cached(r->m, r->cache, r->s, NULL, &r->shape, &r->o.loop, r->lat, r->ctx, r->unc, r->out,
                                 &r->st) != 0)
            return ctl_fail_as(REEL_E_INTERNAL, NULL);
        return 0;
    }
    tdit_loop_stats_t es = { 0 };
    if (tdit_generate(r->m, r->ws, r->s, &r->o.loop, r->lat, r->ctx, r->unc, r->out, &es) != 0)
        return ctl_fail_as(REEL_E_INTERNAL, NULL);
    r->st.steps = r->st.eager = es.steps_run;
    r->st.declines[CAP_DECLINE_OVERRIDE] = es.steps_run;
    r->st.seconds = es.seconds;
    return 0;
}

/* The result to --out, with what made it as metadata. 0, or -1 with the
 * error value set (exit status 1: the output is not the user's input). */
static int write_output(const run_t *r) {
    st_writer_t *w = st_writer_new();
    if (!w) return -1;
    char v[64];
    int rc = st_writer_add_f32(w, "latent", 4, r->lshape, r->out);
    snprintf(v, sizeof v, "%d", r->o.loop.steps);
    rc = rc ? rc : st_writer_meta(w, "steps", v);
    snprintf(v, sizeof v, "%.9g", r->o.loop.shift);
    rc = rc ? rc : st_writer_meta(w, "shift", v);
    snprintf(v, sizeof v, "%.9g", r->o.have_cfg ? r->o.loop.guidance : 0.0);
    rc = rc ? rc : st_writer_meta(w, "cfg", v);
    rc = rc ? rc : st_writer_meta(w, "sampler", r->o.loop.sde ? "sde" : tdit_solver_name(r->o.loop.solver));
    rc = rc ? rc : st_writer_meta(w, "config", r->cfg.name);
    rc = rc ? rc : st_writer_save(w, r->o.out);
    st_writer_destroy(&w);
    return rc ? ctl_fail_as(REEL_E_IO, NULL) : 0;
}

/* What ran, on what, how fast, and what the capture cache did: two lines
 * on stderr. Can't fail. */
static void report(const run_t *r) {
    const tdit_run_stats_t *st = &r->st;
    const tdit_loop_t *p = &r->o.loop;
    const int64_t *ls = r->lshape;
    fprintf(stderr, "reelctl: %s on %s (%s): latent [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "], "
            "%d %s steps%s, %.3f s (%.1f ms/step) -> %s\n",
            r->cfg.name, kern_backend_device_name(r->b), kern_backend_arch(r->b), ls[0], ls[1], ls[2], ls[3],
            st->steps, p->sde ? "SDE" : p->solver == TDIT_SOLVER_EULER ? "Euler" : tdit_solver_name(p->solver),
            r->unc ? " with CFG" : "", st->seconds, 1e3 * st->seconds / (st->steps ? st->steps : 1), r->o.out);
    fprintf(stderr, "reelctl: graphs %s: %d captured, %d replayed, %d eager", r->o.graphs ? "on" : "off",
            st->captured, st->replayed, st->eager);
    const char *sep = " (";
    for (int i = 0; i < CAP_DECLINE_COUNT; i++)
        if (st->declines[i]) {
            fprintf(stderr, "%s%s %d", sep, cap_reason_name((cap_reason_t)i), st->declines[i]);
            sep = ", ";
        }
    fprintf(stderr, "%s\n", sep[0] == ',' ? ")" : "");
}

/* Releases what the phases made; the error value is left as it was. */
static void run_done(run_t *r) {
    cap_cache_destroy(&r->cache);
    tdit_ws_destroy(&r->ws);
    tdit_model_destroy(&r->m);
    kern_stream_destroy(&r->s);
    kern_backend_destroy(&r->b);
    st_close(&r->wf);
    free(r->lat);
    free(r->ctx);
    free(r->unc);
    free(r->out);
}

int cmd_run(int argc, char **argv) {
    run_t r = { 0 };
    int rc = parse(argc, argv, &r.o) != 0 || read_inputs(&r) != 0 || check_inputs(&r) != 0 ||
                     pad_contexts(&r) != 0 || open_model(&r) != 0 || generate(&r) != 0 || write_output(&r) != 0
                 ? -1
                 : 0;
    if (rc == 0) report(&r);
    run_done(&r);
    return rc;
}
