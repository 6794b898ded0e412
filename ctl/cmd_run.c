/* cmd_run.c -- `reelctl run`: one denoising loop in this process, no broker.
 * Inputs and output are safetensors files with tensors `latent` [C,F,H,W]
 * and `context` [L,T]. */
#include "ctl.h"
#include "base/error.h"
#include "base/opts.h"
#include "base/parse.h"
#include "model/loop.h"
#include "model/lora.h"
#include "model/release.h"
#include "model/t2v.h"
#include "model/tinydit.h"
#include "model/tdit_program.h"
#include "model/wan_ckpt.h"
#include <float.h>
#include <math.h>
#include <limits.h>
#include <sys/stat.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *weights, *latent, *context, *uncond, *out, *backend, *dtype;
    const char *prompt, *neg_prompt; /* --prompt, --negative-prompt: encoded here (issue 26) */
    const char *t5, *tokenizer, *vae; /* else a release folder's (--weights DIR) */
    const char *lora;               /* --lora DIR: a PEFT adapter merged into the weights (model/lora.h) */
    int frame_num;                  /* --frame_num N with a pixel --size W*H (Wan's generate.py) */
    int64_t pixels[2];              /* W, H of a pixel --size; 0: latent units */
    tdit_loop_t loop;
    bool have_cfg, have_seed, have_solver;
    bool graphs;
    bool no_fallback;               /* --no-fallback: an unusable CUDA is an error */
    int warmup;
    int64_t size[3];   /* F, H, W when no --latent */
} run_opts_t;

/* tdit_solver_parse's message, naming the option. */
static int set_solver(void *dst, const char *v) {
    if (tdit_solver_parse(v, &((run_opts_t *)dst)->loop.solver) != 0) return reel_fail_prefix("--solver: ");
    ((run_opts_t *)dst)->have_solver = true;
    return 0;
}
/* The next three fail through their rows' expect (base/opts.h). */
static int set_cfg(void *dst, const char *v) {
    double d;
    if (reel_parse_f64(v, -FLT_MAX, FLT_MAX, "--cfg", &d)) return -1;
    ((run_opts_t *)dst)->loop.guidance = (float)d;
    ((run_opts_t *)dst)->have_cfg = true;
    return 0;
}
static int set_base_seed(void *dst, const char *v) { /* generate.py's --base_seed: -1 refused naming --seed */
    if (ctl_base_seed(v, &((run_opts_t *)dst)->loop.seed)) return -1;
    ((run_opts_t *)dst)->have_seed = true;
    return 0;
}
static int set_sample_solver(void *dst, const char *v) {
    if (tdit_solver_parse(v, &((run_opts_t *)dst)->loop.solver) != 0) return reel_fail_prefix("--sample_solver: ");
    ((run_opts_t *)dst)->have_solver = true;
    return 0;
}
/* generate.py's flags that have no alias: each names Reel's own */
static int no_ckpt_dir(void *dst, const char *v) {
    (void)dst, (void)v;
    return ctl_wan_flag_refused("ckpt_dir", "--weights DIR (the release folder)");
}
static int no_save_file(void *dst, const char *v) {
    (void)dst, (void)v;
    return ctl_wan_flag_refused("save_file", "-o OUT.mp4");
}
static int no_task(void *dst, const char *v) {
    (void)dst, (void)v;
    return ctl_wan_flag_refused("task", "--weights: the model is the checkpoint's (text-to-video only)");
}
static int set_seed(void *dst, const char *v) {
    if (reel_parse_u64(v, 0, UINT64_MAX, "--seed", &((run_opts_t *)dst)->loop.seed)) return -1;
    ((run_opts_t *)dst)->have_seed = true;
    return 0;
}
/* --size: either form (ctl_size_parse_any, which gen shares). */
static int set_size(void *dst, const char *v) {
    run_opts_t *r = dst;
    return ctl_size_parse_any(v, "--size", r->size, r->pixels);
}

static const char *const on_off[] = { "off", "on", NULL };

#define O(f) offsetof(run_opts_t, f)
/* --steps and generate.py's --sample_steps: one row, so the alias takes
 * exactly what the flag takes. A negative count is refused here: loop.steps
 * < 0 means "not given", which a prompt run fills with Wan's 50 (-3 was
 * taken so); 0 and more than 10000 the loop refuses (tdit_loop_validate) */
#define STEPS_ROW(n) \
    { .name = n, .kind = REEL_OPT_INT, .off = O(loop.steps), .lo = 0, .hi = 2147483647LL, \
      .expect = "a number of steps (1..10000)" }
/* `reelctl run`'s options (its usage is reelctl's, ctl/reelctl.c). */
static const reel_opt_t run_rows[] = {
    { .name = "weights", .kind = REEL_OPT_STRING, .off = O(weights) },
    { .name = "latent", .kind = REEL_OPT_STRING, .off = O(latent) },
    { .name = "context", .kind = REEL_OPT_STRING, .off = O(context) },
    { .name = "uncond", .kind = REEL_OPT_STRING, .off = O(uncond) },
    STEPS_ROW("steps"),
    { .name = "shift", .kind = REEL_OPT_DOUBLE, .off = O(loop.shift) },
    { .name = "cfg", .kind = REEL_OPT_SET, .set = set_cfg, .expect = "a number" },
    { .name = "sde", .kind = REEL_OPT_FLAG, .off = O(loop.sde) },
    { .name = "eta", .kind = REEL_OPT_FLOAT, .off = O(loop.eta) },
    { .name = "seed", .kind = REEL_OPT_SET, .set = set_seed, .expect = "a non-negative integer" },
    { .name = "backend", .kind = REEL_OPT_STRING, .off = O(backend) },
    { .name = "dtype", .kind = REEL_OPT_STRING, .off = O(dtype) },
    { .name = "out", .short_name = 'o', .kind = REEL_OPT_STRING, .off = O(out) },
    { .name = "size", .kind = REEL_OPT_SET, .set = set_size }, /* set_size says what it expected */
    { .name = "graphs", .kind = REEL_OPT_BOOL_CHOICE, .off = O(graphs), .choices = on_off },
    { .name = "warmup", .kind = REEL_OPT_INT, .off = O(warmup), .lo = 0, .hi = 1000 },
    { .name = "no-fallback", .kind = REEL_OPT_FLAG, .off = O(no_fallback) },
    { .name = "solver", .kind = REEL_OPT_SET, .set = set_solver },
    { .name = "prompt", .kind = REEL_OPT_STRING, .off = O(prompt) },
    { .name = "negative-prompt", .kind = REEL_OPT_STRING, .off = O(neg_prompt) },
    { .name = "t5", .kind = REEL_OPT_STRING, .off = O(t5) },
    { .name = "tokenizer", .kind = REEL_OPT_STRING, .off = O(tokenizer) },
    { .name = "vae", .kind = REEL_OPT_STRING, .off = O(vae) },
    { .name = "lora", .kind = REEL_OPT_STRING, .off = O(lora) },
    { .name = "frame_num", .kind = REEL_OPT_INT, .off = O(frame_num), .lo = 1, .hi = 4 * 65535 + 1,
      .expect = "1 + 4k frames (81)" },
    /* Wan2.1's generate.py spellings of the same flags */
    { .name = "sample_solver", .kind = REEL_OPT_SET, .set = set_sample_solver },
    STEPS_ROW("sample_steps"),
    { .name = "sample_shift", .kind = REEL_OPT_DOUBLE, .off = O(loop.shift) },
    { .name = "sample_guide_scale", .kind = REEL_OPT_SET, .set = set_cfg, .expect = "a number" },
    { .name = "base_seed", .kind = REEL_OPT_SET, .set = set_base_seed },
    { .name = "negative_prompt", .kind = REEL_OPT_STRING, .off = O(neg_prompt) },
    { .name = "ckpt_dir", .kind = REEL_OPT_SET, .set = no_ckpt_dir },
    { .name = "save_file", .kind = REEL_OPT_SET, .set = no_save_file },
    { .name = "task", .kind = REEL_OPT_SET, .set = no_task },
};
#undef STEPS_ROW
#undef O

/* The scheduler config of --weights when it is a diffusers pipeline root
 * (release_sched_read; out->found false otherwise). 0, or -1 with an
 * invalid error naming the file. */
static int pipeline_sched(const char *weights, release_sched_t *out) {
    release_parts_t rel;
    struct stat st;
    if (stat(weights, &st) != 0 || !S_ISDIR(st.st_mode) || release_find(weights, &rel) != 0) return 0;
    return release_sched_read(weights, &rel, out);
}

/* The command line into r, and what must go together. 0, or -1 with an
 * invalid error. */
static int parse(int argc, char **argv, run_opts_t *r) {
    memset(r, 0, sizeof *r);
    r->loop.steps = -1;
    r->loop.shift = NAN; /* not given: 1, or Wan's 5 with --prompt */
    r->loop.guidance = 1.0f;
    r->loop.eta = 0.7f;
    r->backend = "cpu";
    r->dtype = "f32";
    r->graphs = true;
    r->warmup = 2;
    int rest = argc;
    if (reel_opts_parse(run_rows, sizeof run_rows / sizeof run_rows[0], r, argc, argv, &rest))
        return rest ? reel_fail_prefix("run: ") : ctl_fail_usage("run", "run: %s", reel_err()->msg);
    if (rest < argc) return reel_fail(REEL_E_INVALID, "run: unexpected argument '%s'", argv[rest]);
    if (!r->weights || !(r->context || r->prompt) || !r->out)
        return reel_fail(REEL_E_INVALID, "run needs --weights, --context (or --prompt) and --out");
    if (r->prompt && (r->context || r->uncond))
        return reel_fail(REEL_E_INVALID, "--prompt replaces --context and --uncond (give --negative-prompt)");
    if (r->neg_prompt && !r->prompt) return reel_fail(REEL_E_INVALID, "--negative-prompt needs --prompt");
    char took[128] = "", piped[128] = "";
    release_sched_t sched = { .shift = NAN };
    if (r->prompt && pipeline_sched(r->weights, &sched) != 0) return -1;
    if (r->prompt && sched.found) { /* a diffusers pipeline's own sampler first (scheduler/scheduler_config.json) */
        size_t n = 0;
        bool took_solver = sched.solver && !r->have_solver && !r->loop.sde;
        if (took_solver) {
            tdit_solver_parse(sched.solver, &r->loop.solver);
            r->have_solver = true;
            n += (size_t)snprintf(piped + n, sizeof piped - n, " --solver %s", sched.solver);
        }
        if (!isnan(sched.shift) && isnan(r->loop.shift)) {
            r->loop.shift = sched.shift;
            snprintf(piped + n, sizeof piped - n, " --shift %g", sched.shift);
        }
        if (sched.note[0])
            fprintf(stderr, "reelctl: %s (%s): %s: Wan2.1's defaults stand for what it does not give\n", sched.path,
                    sched.class_name[0] ? sched.class_name : "no _class_name", sched.note);
        if (took_solver && sched.unlike[0]) /* the sampler taken is not what diffusers would step: say how */
            fprintf(stderr, "reelctl: %s (%s): --solver %s is not diffusers' stepping: %s\n", sched.path,
                    sched.class_name, sched.solver, sched.unlike);
    }
    if (r->prompt) { /* a prompt alone samples as Wan2.1's generate.py does */
        double g = r->loop.guidance;
        const char *solver = ctl_wan_t2v_fill(r->have_solver, r->loop.sde, &r->loop.steps, &r->loop.shift,
                                              &r->have_cfg, &g, took, sizeof took);
        r->loop.guidance = (float)g;
        if (solver) tdit_solver_parse(solver, &r->loop.solver);
    }
    if (isnan(r->loop.shift)) r->loop.shift = 1.0;
    if (r->neg_prompt && r->loop.guidance == 1.0f)
        return reel_fail(REEL_E_INVALID, "--negative-prompt is used only with guidance: --cfg 1 turns it off (Wan's "
                         "default is 5)");
    if (ctl_prompts_check(r->prompt, r->neg_prompt)) return -1;
    if (r->prompt && !ctl_has_ext(r->out, ".mp4") && !ctl_has_ext(r->out, ".safetensors")) /* a prompt's user wants a video: a latent under another name is no answer */
        return reel_fail(REEL_E_INVALID, "-o %s: a prompt run writes OUT.mp4 (the video, the latent beside it as "
                         "OUT.mp4.safetensors) or OUT.safetensors (the latent alone)", r->out);
    /* where the outputs go, before anything runs (as gen checks): the
     * folder, and each file (an MP4's latent beside it) absent or regular */
    char beside[PATH_MAX];
    if (snprintf(beside, sizeof beside, "%s.safetensors", r->out) >= (int)sizeof beside)
        return reel_fail(REEL_E_INVALID, "--out %s: path too long", r->out);
    if (ctl_out_folder(r->out) != 0 || ctl_out_file(r->out) != 0 ||
        (ctl_has_ext(r->out, ".mp4") && ctl_out_file(beside) != 0))
        return -1;
    if (ctl_size_finish(r->size, r->pixels, r->frame_num) != 0) return -1; /* Wan's W*H: the latent of frame_num frames */
    if (r->loop.steps < 0) return reel_fail(REEL_E_INVALID, "run needs --steps N");
    if (!r->latent && !r->size[0])
        return reel_fail(REEL_E_INVALID,
                         "run needs --latent FILE, or --size FxHxW (with --seed K, default 0) to draw one");
    if (r->latent && r->size[0]) return reel_fail(REEL_E_INVALID, "--latent and --size exclude each other");
    if (r->uncond && !r->have_cfg) return reel_fail(REEL_E_INVALID, "--uncond needs --cfg G");
    if (r->have_cfg && !r->uncond && !r->prompt) return reel_fail(REEL_E_INVALID, "--cfg needs --uncond U.safetensors");
    if (tdit_loop_validate(&r->loop) != 0) return ctl_fail_as(REEL_E_INVALID, NULL);
    ctl_wan_defaults_note("run", took, piped, sched.path);
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
    t2v_text_t *text;               /* --prompt: the text encoder */
    t2v_vae_t *vae;                 /* --out X.mp4: the VAE */
    double encode_s, decode_s;
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
    char beside[PATH_MAX]; /* an MP4's latent goes beside it */
    snprintf(beside, sizeof beside, "%s.safetensors", r->o.out ? r->o.out : "");
    const run_opts_t *o = &r->o;
    for (int i = 0; i < 2; i++)
        if (ctl_out_spares(i ? beside : o->out, "--weights", o->weights, "--latent", o->latent, "--context",
                           o->context, "--uncond", o->uncond, "--t5", o->t5, "--tokenizer", o->tokenizer, "--vae",
                           o->vae, "--lora", o->lora, (const char *)NULL) != 0)
            return -1;
    if (kern_backend_kind_parse(r->o.backend, &r->kind) != 0) return ctl_fail_as(REEL_E_INVALID, "--backend: ");
    if (!strcmp(r->o.dtype, "f32")) r->dtype = KERN_F32;
    else if (!strcmp(r->o.dtype, "bf16")) r->dtype = KERN_BF16;
    else return reel_fail(REEL_E_INVALID, "--dtype: '%s' is not f32 or bf16", r->o.dtype);
    r->wf = wan_ckpt_load(r->o.weights); /* any layout a Wan2.1 user has (wan_ckpt.h) */
    if (!r->wf) return ctl_fail_as(REEL_E_INVALID, NULL);
    if (tdit_config_from_meta(r->wf, &r->cfg) != 0) return ctl_fail_as(REEL_E_INVALID, "%s: ", r->o.weights);
    if (r->o.latent && !(r->lat = ctl_read_tensor(r->o.latent, "latent", 4, r->lshape))) return -1;
    if (r->o.context && !(r->ctx = ctl_read_tensor(r->o.context, "context", 2, r->cshape))) return -1;
    if (r->o.uncond && !(r->unc = ctl_read_tensor(r->o.uncond, "context", 2, r->ushape))) return -1;
    if (r->o.prompt) { /* encoded once the backend is open: a context of text_len rows */
        r->cshape[0] = r->ushape[0] = r->cfg.text_len;
        r->cshape[1] = r->ushape[1] = r->cfg.text_dim;
        if (r->cfg.text_len < 1)
            return reel_fail(REEL_E_INVALID, "--prompt: config %s has no text_len (a Wan2.1 release has 512)",
                             r->cfg.name);
    }
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
    if (tl <= 0 || r->o.prompt) return 0;
    if (pad_rows(&r->ctx, &r->cshape[0], r->cshape[1], tl) != 0) return -1;
    return r->unc ? pad_rows(&r->unc, &r->ushape[0], r->ushape[1], tl) : 0;
}

/* Progress bars on a terminal: the loop's steps, the decode's latent frames. */
static void step_bar(void *user, int done, int steps) {
    (void)user;
    ctl_progress("step", done, steps);
}
static int decode_bar(void *user, int64_t done, int64_t total) {
    (void)user;
    ctl_progress("decode, latent frame", done, total);
    return 0;
}

/* --prompt: the text encoder (--t5/--tokenizer, else the release folder's)
 * encodes it, and, with --cfg, the negative prompt (Wan's default when
 * none or empty, as Wan's generate and a GEN read ""); --out X.mp4: the VAE (--vae, else the folder's). 0, or -1 with the
 * error value set (exit 2: a missing part is the user's to give). */
static int open_media(run_t *r) {
    const run_opts_t *o = &r->o;
    release_parts_t rel;
    memset(&rel, 0, sizeof rel);
    struct stat st;
    bool folder = stat(o->weights, &st) == 0 && S_ISDIR(st.st_mode) && release_find(o->weights, &rel) == 0;
    if (o->prompt) {
        const char *t5 = o->t5 ? o->t5 : rel.t5[0] ? rel.t5 : NULL;
        const char *tok = o->tokenizer ? o->tokenizer : rel.tokenizer[0] ? rel.tokenizer : NULL;
        if ((!t5 || !tok) && folder) { /* where it looked, and the file it expected there */
            release_parts_t seen = rel;
            if (o->t5) snprintf(seen.t5, sizeof seen.t5, "%s", o->t5);
            if (o->tokenizer) snprintf(seen.tokenizer, sizeof seen.tokenizer, "%s", o->tokenizer);
            char why[3 * PATH_MAX];
            release_text_missing(o->weights, &seen, why, sizeof why);
            return reel_fail(REEL_E_INVALID, "--prompt needs a text encoder and its tokenizer: %s (or give %s)", why,
                             !t5 && !tok ? "--t5 FILE --tokenizer PATH" : !t5 ? "--t5 FILE" : "--tokenizer PATH");
        }
        if (!t5 || !tok)
            return reel_fail(REEL_E_INVALID, "--prompt needs a text encoder and its tokenizer: --t5 FILE --tokenizer "
                             "PATH, or --weights on a release folder holding %s and %s/ (or a diffusers "
                             "pipeline holding %s/ and %s/spiece.model)", RELEASE_T5_NAME, RELEASE_TOKENIZER_DIR,
                             RELEASE_DIFFUSERS_T5, RELEASE_DIFFUSERS_TOKENIZER);
        double t0 = ctl_now();
        int64_t rows;
        bool guided = o->have_cfg && o->loop.guidance != 1.0f;
        if (!(r->text = t2v_text_new(r->b, t5, tok, r->cfg.text_len, r->cfg.text_dim, 0)) ||
            t2v_text_context(r->text, o->prompt, &r->ctx, &rows) != 0 ||
            (guided && t2v_text_context(r->text, o->neg_prompt && *o->neg_prompt ? o->neg_prompt : T2V_WAN_NEG_PROMPT, &r->unc,
                                        &rows) != 0))
            return ctl_fail_as(REEL_E_INVALID, NULL);
        r->encode_s = ctl_now() - t0;
    }
    if (ctl_has_ext(o->out, ".mp4")) {
        const char *vae = o->vae ? o->vae : rel.vae[0] ? rel.vae : NULL;
        if (!vae)
            return reel_fail(REEL_E_INVALID, "--out %s needs the VAE: --vae FILE, or --weights on a release folder "
                             "holding %s", o->out, RELEASE_VAE_NAME);
        if (!(r->vae = t2v_vae_new(r->b, vae, r->cfg.in_channels))) return ctl_fail_as(REEL_E_INVALID, NULL);
    }
    return 0;
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
    lora_t *lora = NULL;
    if (r->o.lora) {
        tdit_config_t c;
        if (tdit_config_from_meta(r->wf, &c) != 0 || !(lora = lora_open(r->o.lora)) || lora_check(lora, &c) != 0) {
            lora_close(&lora);
            return ctl_fail_as(REEL_E_INVALID, "--lora %s: ", r->o.lora);
        }
    }
    tdit_weight_edit_t edit = lora ? lora_edit(lora, false) : (tdit_weight_edit_t){ 0 };
    r->m = tdit_model_load_edit(r->b, r->wf, r->dtype, lora ? &edit : NULL);
    lora_close(&lora);
    if (!r->m) return ctl_fail_as(REEL_E_INVALID, "%s: ", r->o.weights);
    st_close(&r->wf);
    if (open_media(r) != 0) return -1;
    bool guided = r->unc != NULL || (r->o.prompt && r->o.have_cfg && r->o.loop.guidance != 1.0f);
    r->shape = (tdit_shape_t){ r->lshape[1], r->lshape[2], r->lshape[3], r->cshape[0], guided, 1,
                               r->o.loop.solver, false, TDIT_SOLVER_EULER };
    tdit_loop_shape(&r->o.loop, &r->shape); /* sde with --solver: SDE steps on that solver's grid */
    if (tdit_shape_validate(&r->shape) != 0) return ctl_fail_as(REEL_E_INVALID, NULL);
    if (!r->o.graphs && !(r->ws = tdit_ws_new(r->m, r->s, &r->shape))) return ctl_fail_as(REEL_E_INVALID, NULL);
    return 0;
}

/* The loop: through a capture cache (--graphs on), or eagerly, every step
 * then counted eager (declined: override). 0, or -1 with the error value
 * set: exit status 2 for a loop whose values overflowed (its inputs'
 * fault: a result of NaN or infinity is never written), else 1. */
static int loop_failed(void) {
    return ctl_fail_as(reel_err_code() == REEL_E_INVALID ? REEL_E_INVALID : REEL_E_INTERNAL, NULL);
}

static int generate(run_t *r) {
    size_t n = (size_t)(r->lshape[0] * r->lshape[1] * r->lshape[2] * r->lshape[3]);
    if (!(r->out = malloc(n * sizeof *r->out))) return reel_fail(REEL_E_NOMEM, "out of memory");
    if (r->o.graphs) {
        cap_options_t co = cap_options_default();
        co.warmup = r->o.warmup;
        r->cache = cap_cache_new(r->b, &co);
        if (!r->cache || tdit_register_weights(r->cache, r->m, 1) != 0 ||
            tdit_generate_cached_progress(r->m, r->cache, r->s, NULL, &r->shape, &r->o.loop, r->lat, r->ctx, r->unc,
                                          r->out, &r->st, step_bar, NULL) != 0)
            return loop_failed();
        return 0;
    }
    tdit_loop_stats_t es = { 0 };
    if (tdit_generate(r->m, r->ws, r->s, &r->o.loop, r->lat, r->ctx, r->unc, r->out, &es) != 0)
        return loop_failed();
    r->st.steps = r->st.eager = es.steps_run;
    r->st.declines[CAP_DECLINE_OVERRIDE] = es.steps_run;
    r->st.seconds = es.seconds;
    return 0;
}

/* The result to --out, with what made it as metadata. 0, or -1 with the
 * error value set (exit status 1: the output is not the user's input). */
static int write_output(run_t *r) {
    char lat_path[PATH_MAX];
    const char *dst = r->o.out;
    if (r->vae) { /* the video to --out, the latent beside it */
        uint8_t *frames = NULL, *mp4 = NULL;
        size_t len = 0;
        double t0 = ctl_now();
        int rc = t2v_vae_decode_progress(r->vae, r->out, 1, r->lshape, &frames, &mp4, &len, decode_bar, NULL);
        r->decode_s = ctl_now() - t0;
        rc = rc ? rc : ctl_write_bytes(r->o.out, mp4, len);
        free(frames);
        free(mp4);
        if (rc) return ctl_fail_as(reel_err_code() == REEL_E_INVALID ? REEL_E_INVALID : REEL_E_IO, NULL);
        snprintf(lat_path, sizeof lat_path, "%s.safetensors", r->o.out);
        dst = lat_path;
    }
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
    rc = rc ? rc : st_writer_meta(w, "sampler", tdit_step_loop(&r->shape, r->o.loop.sde)); /* euler, sde, unipc, sde-unipc, ... */
    rc = rc ? rc : st_writer_meta(w, "config", r->cfg.name);
    rc = rc ? rc : st_writer_save(w, dst);
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
            st->steps, p->sde ? (p->solver == TDIT_SOLVER_UNIPC ? "SDE (on unipc's grid)" : p->solver == TDIT_SOLVER_DPMPP ? "SDE (on dpm++'s grid)" : "SDE")
                              : p->solver == TDIT_SOLVER_EULER ? "Euler" : tdit_solver_name(p->solver),
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
    if (r->text && r->vae)
        fprintf(stderr, "reelctl: prompt encoded in %.3f s, video decoded in %.3f s\n", r->encode_s, r->decode_s);
    else if (r->text)
        fprintf(stderr, "reelctl: prompt encoded in %.3f s\n", r->encode_s);
    else if (r->vae)
        fprintf(stderr, "reelctl: video decoded in %.3f s\n", r->decode_s);
}

/* Releases what the phases made; the error value is left as it was. */
static void run_done(run_t *r) {
    /* The cache goes before the stream its graphs were captured on (cache.h,
     * Lifetimes: else cap_forget_stream first). */
    cap_cache_destroy(&r->cache);
    t2v_text_destroy(&r->text);
    t2v_vae_destroy(&r->vae);
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
