/* cmd_gen.c -- client commands against a running broker: `reelctl gen`,
 * `reelctl sync` and `reelctl status`. */
#include "ctl.h"
#include "model/lora.h"
#include "base/error.h"
#include "base/parse.h"
#include "clients/c/client.h"
#include "base/sha256.h"
#include "model/safetensors.h"
#include "model/tinydit.h"
#include "model/wan_ckpt.h"
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* Said at once (a waiting operator, and tests, see it happen); user is
 * the message's name, "GEN" or "SYNC". */
static void resent(void *user, uint64_t id, int silent_ms) {
    const char *what = user, *cmd = strcmp(what, "GEN") ? "sync" : "gen";
    if (silent_ms < 0)
        fprintf(stderr, "reelctl: %s: the broker is the standby of a pair: %s %llu sent to the other (the same "
                "request)\n", cmd, what, (unsigned long long)id);
    else if (silent_ms)
        fprintf(stderr, "reelctl: %s: no word from the broker for %d ms: %s %llu sent again (the same request)\n",
                cmd, silent_ms, what, (unsigned long long)id);
    else
        fprintf(stderr, "reelctl: %s: a broker that may not hold %s %llu answers (a restart): sent again (the same "
                "request)\n", cmd, what, (unsigned long long)id);
    fflush(stderr);
}

/* user: the label, which says whether decoded frames follow the steps */
static void progress_bar(void *user, int step, int steps) {
    ctl_progress((const char *)user, step, steps);
}

/* What `reelctl gen` was asked, after the command line. */
typedef struct {
    const char *broker, *ctx_path, *unc_path, *lat_path, *out;
    const char *key, *broker_key; /* NULL: $REEL_KEY, $REEL_BROKER_KEY */
    reel_gen_t g;
    reel_rollout_t rollout;     /* --trajectory, --log-probs, --means */
    reel_decoded_t decoded;     /* --output frames / video (or --out X.mp4) */
    const char *video_out;      /* --out X.mp4: the video goes there, the latent to X.mp4.safetensors */
    bool have_cfg, quiet;
    int timeout_ms, channels;
    int64_t size[3];
    int64_t pixels[2];          /* --size W*H (Wan's pixels; 0: a latent FxHxW) */
    int frame_num;              /* --frame_num N with a pixel --size */
    uint64_t seeds[MSG_MAX_GROUP]; /* --seeds */
    int n_seeds;
    const char *prompts;        /* --prompts FILE: one request per line (gen_prompts) */
    const char *out_dir;        /* --out-dir DIR: where their outputs go */
    int window;                 /* --window W: requests in flight at once (0: the client's 16) */
    bool skip_existing;         /* --skip-existing: a line whose output is in DIR is not run again */
} gen_opts_t;

enum { O_BROKER = 1, O_MODEL, O_VERSION, O_CONTEXT, O_UNCOND, O_CFG, O_LATENT, O_SIZE, O_STEPS,
       O_SHIFT, O_SDE, O_ETA, O_SEED, O_OUT, O_TIMEOUT, O_DEADLINE, O_QUIET, O_CHANNELS, O_KEY, O_BKEY,
       O_TRAJ, O_LOGP, O_MEANS, O_N, O_SEEDS, O_SOLVER, O_PROMPT, O_NEG, O_OUTPUT, O_FRAME_NUM, O_BASE_SEED, O_CKPT_DIR, O_SAVE_FILE, O_TASK,
       O_PROMPTS, O_OUT_DIR, O_WINDOW, O_SKIP_EXISTING, O_LAST = O_SKIP_EXISTING };

/* "7,9,100" into seeds[]; the count, or -1 with an invalid error. */
static int parse_seeds(const char *arg, uint64_t *seeds, int max) {
    char buf[MSG_MAX_GROUP * 21 + 1];
    int n = 0;
    bool ok = strlen(arg) < sizeof buf;
    if (ok) strcpy(buf, arg);
    for (char *save = NULL, *tok = ok ? strtok_r(buf, ",", &save) : NULL; ok && tok; tok = strtok_r(NULL, ",", &save))
        ok = n < max && reel_parse_u64(tok, 0, UINT64_MAX, "--seeds", &seeds[n++]) == 0;
    if (!ok || !n)
        return reel_fail(REEL_E_INVALID, "--seeds: '%s' is not a list of 1..%d seeds (7,9,100)", arg, max);
    return n;
}

/* One option of gen with its argument into o. 0, or -1 with an invalid
 * error naming the option. */
static int gen_option(gen_opts_t *o, int opt, const char *arg) {
    reel_gen_t *g = &o->g;
    switch (opt) {
    case O_BROKER: o->broker = arg; return 0;
    case O_KEY: o->key = arg; return 0;
    case O_BKEY: o->broker_key = arg; return 0;
    case O_MODEL: g->model = arg; return 0;
    case O_CONTEXT: o->ctx_path = arg; return 0;
    case O_UNCOND: o->unc_path = arg; return 0;
    case O_LATENT: o->lat_path = arg; return 0;
    case O_OUT: o->out = arg; return 0;
    case O_SDE: g->sde = true; return 0;
    case O_SOLVER:
        if (strcmp(arg, "euler") && strcmp(arg, "unipc") && strcmp(arg, "dpm++"))
            return reel_fail(REEL_E_INVALID, "--solver: '%s' is not euler, unipc or dpm++", arg);
        g->solver = arg;
        return 0;
    case O_QUIET: o->quiet = true; return 0;
    case O_PROMPT: g->prompt = arg; return 0;
    case O_NEG: g->negative_prompt = arg; return 0;
    case O_OUTPUT:
        if (strcmp(arg, "latent") && strcmp(arg, "frames") && strcmp(arg, "video"))
            return reel_fail(REEL_E_INVALID, "--output: '%s' is not latent, frames or video", arg);
        g->output = arg;
        return 0;
    case O_TRAJ: o->rollout.want_trajectory = true; return 0;
    case O_LOGP: o->rollout.want_log_probs = o->rollout.want_timesteps = true; return 0;
    case O_MEANS: o->rollout.want_means = true; return 0;
    case O_N: /* tests/cli_group.sh reads this message */
        return reel_parse_int(arg, 1, MSG_MAX_GROUP, "--n", &g->n)
                   ? reel_fail(REEL_E_INVALID, "--n: '%s' is not a group size in 1..%d", arg, MSG_MAX_GROUP)
                   : 0;
    case O_SEEDS: return (o->n_seeds = parse_seeds(arg, o->seeds, MSG_MAX_GROUP)) < 0 ? -1 : 0;
    case O_VERSION: return reel_parse_u64(arg, 0, UINT64_MAX, "--weights-version", &g->version);
    case O_CFG:
        o->have_cfg = true;
        return reel_parse_f64(arg, -DBL_MAX, DBL_MAX, "--cfg", &g->cfg);
    case O_SHIFT: return reel_parse_f64(arg, -DBL_MAX, DBL_MAX, "--shift", &g->shift);
    case O_ETA: return reel_parse_f64(arg, -DBL_MAX, DBL_MAX, "--eta", &g->eta);
    case O_STEPS: return reel_parse_int(arg, 1, INT_MAX, "--steps", &g->steps);
    case O_SEED: return reel_parse_u64(arg, 0, UINT64_MAX, "--seed", &g->seed);
    case O_BASE_SEED: return ctl_base_seed(arg, &g->seed); /* generate.py's spelling; -1 refused */
    case O_CKPT_DIR: return ctl_wan_flag_refused("ckpt_dir", "--model NAME (the workers load the folder: reel-worker --weights DIR)");
    case O_SAVE_FILE: return ctl_wan_flag_refused("save_file", "--out OUT.mp4");
    case O_TASK: return ctl_wan_flag_refused("task", "--model NAME (text-to-video only)");
    case O_PROMPTS: o->prompts = arg; return 0;
    case O_OUT_DIR: o->out_dir = arg; return 0;
    case O_WINDOW: return reel_parse_int(arg, 1, 1024, "--window", &o->window);
    case O_SKIP_EXISTING: o->skip_existing = true; return 0;
    case O_TIMEOUT: return reel_parse_int(arg, 1, INT_MAX, "--timeout-ms", &o->timeout_ms);
    case O_DEADLINE: return reel_parse_u64(arg, 0, UINT64_MAX, "--deadline-ms", &g->deadline_ms);
    case O_CHANNELS: return reel_parse_int(arg, 1, INT_MAX, "--channels", &o->channels);
    case O_SIZE: return ctl_size_parse_any(arg, "--size", o->size, o->pixels); /* as run takes it */
    case O_FRAME_NUM:
        return reel_parse_int(arg, 1, 4 * 65535 + 1, "--frame_num", &o->frame_num)
                   ? reel_fail(REEL_E_INVALID, "--frame_num: '%s' is a bad value: expected 1 + 4k frames (81)", arg)
                   : 0;
    }
    return reel_fail(REEL_E_INTERNAL, "gen: option %d has no handler", opt);
}

/* gen_parse's end for --prompts: what the lines share, checked as one
 * --prompt's are (their outputs are checked with the file, gen_round). 0,
 * or -1 with an invalid error. */
static int gen_parse_round(gen_opts_t *o, const char *took) {
    if (!o->g.model) return reel_fail(REEL_E_INVALID, "gen --prompts needs --model");
    if (o->g.negative_prompt && o->g.cfg == 1.0)
        return reel_fail(REEL_E_INVALID, "--negative-prompt is used only with guidance: --cfg 1 turns it off (Wan's "
                         "default is 5)");
    if (ctl_prompts_check(NULL, o->g.negative_prompt)) return -1;
    if (ctl_size_finish(o->size, o->pixels, o->frame_num) != 0) return -1;
    if (!o->size[0]) return reel_fail(REEL_E_INVALID, "gen --prompts needs --size FxHxW or W*H (each line's latent "
                                      "drawn from its seed)");
    if ((o->rollout.want_log_probs || o->rollout.want_means) && !o->g.sde)
        return reel_fail(REEL_E_INVALID, "--log-probs and --means are for SDE rollouts (--sde)");
    o->g.n = 1;
    struct stat st;
    if (stat(o->out_dir, &st) == 0 ? !S_ISDIR(st.st_mode) : ctl_out_folder(o->out_dir) != 0)
        return reel_fail(REEL_E_INVALID, "--out-dir %s: %s", o->out_dir,
                         stat(o->out_dir, &st) == 0 ? "exists and is not a folder" : "its parent is not a folder");
    if (!o->quiet) ctl_wan_defaults_note("gen", took, NULL, NULL);
    return 0;
}

/* The command line into o, and what must go together. 0, or -1 with an
 * invalid error. */
static int gen_parse(int argc, char **argv, gen_opts_t *o) {
    static const struct option opts[] = {
        { "broker", required_argument, 0, O_BROKER }, { "model", required_argument, 0, O_MODEL },
        { "config", required_argument, 0, O_MODEL },
        { "weights-version", required_argument, 0, O_VERSION }, { "context", required_argument, 0, O_CONTEXT },
        { "uncond", required_argument, 0, O_UNCOND }, { "cfg", required_argument, 0, O_CFG },
        { "latent", required_argument, 0, O_LATENT }, { "size", required_argument, 0, O_SIZE },
        { "steps", required_argument, 0, O_STEPS }, { "shift", required_argument, 0, O_SHIFT },
        { "sde", no_argument, 0, O_SDE }, { "eta", required_argument, 0, O_ETA },
        { "seed", required_argument, 0, O_SEED }, { "out", required_argument, 0, O_OUT },
        { "timeout-ms", required_argument, 0, O_TIMEOUT }, { "deadline-ms", required_argument, 0, O_DEADLINE },
        { "quiet", no_argument, 0, O_QUIET }, { "channels", required_argument, 0, O_CHANNELS },
        { "key", required_argument, 0, O_KEY }, { "broker-key", required_argument, 0, O_BKEY },
        { "trajectory", no_argument, 0, O_TRAJ }, { "log-probs", no_argument, 0, O_LOGP },
        { "means", no_argument, 0, O_MEANS }, { "n", required_argument, 0, O_N },
        { "seeds", required_argument, 0, O_SEEDS }, { "solver", required_argument, 0, O_SOLVER },
        { "prompt", required_argument, 0, O_PROMPT }, { "negative-prompt", required_argument, 0, O_NEG },
        { "output", required_argument, 0, O_OUTPUT }, { "frame_num", required_argument, 0, O_FRAME_NUM },
        /* Wan2.1's generate.py spellings of the same flags */
        { "sample_solver", required_argument, 0, O_SOLVER }, { "sample_steps", required_argument, 0, O_STEPS },
        { "sample_shift", required_argument, 0, O_SHIFT }, { "sample_guide_scale", required_argument, 0, O_CFG },
        { "base_seed", required_argument, 0, O_BASE_SEED }, { "negative_prompt", required_argument, 0, O_NEG },
        { "ckpt_dir", required_argument, 0, O_CKPT_DIR }, { "save_file", required_argument, 0, O_SAVE_FILE },
        { "task", required_argument, 0, O_TASK },
        { "prompts", required_argument, 0, O_PROMPTS }, { "out-dir", required_argument, 0, O_OUT_DIR },
        { "window", required_argument, 0, O_WINDOW }, { "skip-existing", no_argument, 0, O_SKIP_EXISTING },
        { 0, 0, 0, 0 },
    };
    memset(o, 0, sizeof *o);
    o->broker = DEFAULT_BROKER;
    o->g.shift = NAN; /* not given: 1, or Wan's 5 with --prompt */
    o->g.cfg = 1.0;
    o->g.eta = 0.7;
    o->g.steps = -1;
    o->timeout_ms = 120000;
    int opt;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
        if (opt == 'o') opt = O_OUT; /* -o X: --out X */
        if (opt < O_BROKER || opt > O_LAST)
            return ctl_fail_usage("gen", "gen: unknown or incomplete option '%s'", argv[optind - 1]);
        if (gen_option(o, opt, optarg) != 0) return -1;
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "gen: unexpected argument '%s'", argv[optind]);
    /* Never give up before the broker does: it would run the request for nobody. */
    uint64_t dl = o->g.deadline_ms;
    if (dl && dl + 2000 > (uint64_t)o->timeout_ms) o->timeout_ms = dl + 2000 > INT32_MAX ? INT32_MAX : (int)(dl + 2000);
    char took[128] = "";
    if (o->prompts) { /* a round: one request per line, its outputs in --out-dir */
        if (o->g.prompt || o->ctx_path || o->unc_path || o->lat_path)
            return reel_fail(REEL_E_INVALID, "--prompts gives each request its prompt, one a line: it replaces "
                             "--prompt, --context, --uncond and --latent");
        if (o->out)
            return reel_fail(REEL_E_INVALID, "--prompts writes one output a line into --out-dir DIR, not --out");
        if (!o->out_dir) return reel_fail(REEL_E_INVALID, "--prompts needs --out-dir DIR (one output a line there)");
        if (o->g.n || o->n_seeds)
            return reel_fail(REEL_E_INVALID, "--prompts runs one sample a line: --n and --seeds are for one --prompt "
                             "(each line's seed: --seed K + its line number - 1, or its JSON \"seed\")");
    } else if (o->out_dir || o->window || o->skip_existing) {
        return reel_fail(REEL_E_INVALID, "%s goes with --prompts FILE",
                         o->out_dir ? "--out-dir" : o->window ? "--window" : "--skip-existing");
    }
    if (o->g.prompt || o->prompts) { /* a prompt alone samples as Wan2.1's generate.py does */
        const char *solver = ctl_wan_t2v_fill(o->g.solver != NULL, o->g.sde, &o->g.steps, &o->g.shift, &o->have_cfg,
                                              &o->g.cfg, took, sizeof took);
        if (solver) o->g.solver = solver;
    }
    if (isnan(o->g.shift)) o->g.shift = 1.0;
    if (o->prompts) return gen_parse_round(o, took);
    if (!o->g.model || !(o->ctx_path || o->g.prompt) || !o->out || o->g.steps < 0)
        return reel_fail(REEL_E_INVALID, "gen needs --model, --context (or --prompt), --steps and --out");
    if (ctl_out_folder(o->out)) return -1; /* before the cluster runs the request for it */
    char beside[3][PATH_MAX]; /* an MP4's latent, decoded frames and a video go beside it */
    snprintf(beside[0], sizeof beside[0], "%s.safetensors", o->out);
    snprintf(beside[1], sizeof beside[1], "%s.frames.npy", o->out);
    snprintf(beside[2], sizeof beside[2], "%s.mp4", o->out);
    for (int i = 0; i < 4; i++)
        if (ctl_out_spares(i ? beside[i - 1] : o->out, "--context", o->ctx_path, "--uncond", o->unc_path, "--latent",
                           o->lat_path, (const char *)NULL) != 0)
            return -1;
    if (o->g.prompt && (o->ctx_path || o->unc_path))
        return reel_fail(REEL_E_INVALID, "--prompt replaces --context and --uncond (give --negative-prompt)");
    if (o->g.negative_prompt && !o->g.prompt) return reel_fail(REEL_E_INVALID, "--negative-prompt needs --prompt");
    if (o->g.negative_prompt && o->g.cfg == 1.0)
        return reel_fail(REEL_E_INVALID, "--negative-prompt is used only with guidance: --cfg 1 turns it off (Wan's "
                         "default is 5)");
    if (ctl_prompts_check(o->g.prompt, o->g.negative_prompt)) return -1;
    if (!o->g.prompt && !!o->unc_path != o->have_cfg) return reel_fail(REEL_E_INVALID, "--uncond and --cfg go together");
    /* --out X.mp4: the video itself (the latent beside it, X.mp4.safetensors) */
    if (ctl_has_ext(o->out, ".mp4")) {
        if (o->g.output && strcmp(o->g.output, "video"))
            return reel_fail(REEL_E_INVALID, "--out %s is a video; --output %s does not make one", o->out, o->g.output);
        o->g.output = "video";
        o->video_out = o->out;
    }
    if (o->g.output && strcmp(o->g.output, "latent")) o->g.decoded = &o->decoded;
    if (ctl_size_finish(o->size, o->pixels, o->frame_num) != 0) return -1; /* Wan's W*H: the latent of frame_num frames */
    if (!o->lat_path == !o->size[0])
        return reel_fail(REEL_E_INVALID, "gen needs --latent FILE or --size FxHxW or W*H (with --seed)");
    if ((o->rollout.want_log_probs || o->rollout.want_means) && !o->g.sde)
        return reel_fail(REEL_E_INVALID, "--log-probs and --means are for SDE rollouts (--sde)");
    if (o->n_seeds) {
        if (!o->g.n) o->g.n = o->n_seeds; /* --seeds alone: one sample per seed */
        if (o->n_seeds != o->g.n)
            return reel_fail(REEL_E_INVALID, "--seeds gives %d seeds for --n %d samples", o->n_seeds, o->g.n);
        o->g.seeds = o->seeds;
    }
    if (!o->g.n) o->g.n = 1;
    bool video = o->g.output && !strcmp(o->g.output, "video"), frames = o->g.output && !strcmp(o->g.output, "frames");
    if (video && o->g.n > 1) /* the broker's rule (docs/PROTOCOL.md "Prompts and videos"), said before sending */
        return reel_fail(REEL_E_INVALID, "%s%s: a video is one MP4 of one sample; a group (--n %d) asks for "
                         "--output frames", o->video_out ? "--out " : "--output video", o->video_out ? o->out : "",
                         o->g.n);
    /* each output absent or a regular file, as its writer will insist,
     * before the cluster runs the request for it */
    if (ctl_out_file(o->out) != 0 || (o->video_out && ctl_out_file(beside[0]) != 0) ||
        (frames && ctl_out_file(beside[1]) != 0) || (video && !o->video_out && ctl_out_file(beside[2]) != 0))
        return -1;
    reel_rollout_t *ro = &o->rollout;
    if (ro->want_trajectory || ro->want_log_probs || ro->want_means) o->g.rollout = ro;
    if (!o->quiet) ctl_wan_defaults_note("gen", took, NULL, NULL);
    return 0;
}

/* Reads the tensors the options name into o->g (the caller frees
 * g.context, g.uncond, g.latent). 0, or -1 with the error value set (exit
 * status 2). */
static int gen_inputs(gen_opts_t *o) {
    reel_gen_t *g = &o->g;
    float *t;
    if (o->ctx_path) {
        if (!(t = ctl_read_tensor(o->ctx_path, "context", 2, g->ctx_shape))) return -1;
        g->context = t;
    }
    if (o->unc_path) {
        int64_t us[2];
        if (!(t = ctl_read_tensor(o->unc_path, "context", 2, us))) return -1;
        g->uncond = t;
        /* Another L is the worker's to judge: a model with text_len pads both. */
        if (us[1] != g->ctx_shape[1])
            return reel_fail(REEL_E_INVALID, "%s: uncond width differs from the context's", o->unc_path);
        g->unc_rows = us[0];
    }
    if (o->lat_path) {
        /* A group's latents: [n,C,F,H,W]. */
        int64_t ls[5];
        int grp = g->n > 1;
        if (!(t = ctl_read_tensor(o->lat_path, "latent", 4 + grp, ls))) return -1;
        g->latent = t;
        if (grp && ls[0] != g->n)
            return reel_fail(REEL_E_INVALID, "%s: latent holds %lld samples, --n is %d", o->lat_path,
                             (long long)ls[0], g->n);
        memcpy(g->latent_shape, ls + grp, sizeof g->latent_shape);
        return 0;
    }
    tdit_config_t cfg;
    if (!o->channels && tdit_config_builtin(g->model, &cfg) == 0) o->channels = (int)cfg.in_channels;
    if (!o->channels) return reel_fail(REEL_E_INVALID, "--size with a custom model needs --channels C");
    g->latent_shape[0] = o->channels;
    memcpy(g->latent_shape + 1, o->size, sizeof o->size);
    return 0;
}

/* The rollout outputs that came, as tensors of the output file (names as
 * on the wire), and the weight version of each step as metadata
 * "version_runs" ("from:version,..."). 0 or -1. */
static int add_rollout(st_writer_t *w, const reel_rollout_t *ro) {
    int64_t n[2] = { ro->n, ro->steps }, n1[1] = { ro->steps + 1 };
    int grp = ro->n > 1;
    if ((ro->log_probs && st_writer_add_f32(w, "log_probs", 1 + grp, grp ? n : n + 1, ro->log_probs)) ||
        (ro->sigmas && st_writer_add_f32(w, "sigmas", 1, n1, ro->sigmas)) ||
        (ro->timesteps && st_writer_add_f32(w, "timesteps", 1, n + 1, ro->timesteps)))
        return -1;
    /* A file tensor has at most 5 dims: a group's trajectory and means
     * are written per sample, "trajectory.0", "trajectory.1", ... */
    for (int i = 0; i < (grp ? ro->n : 1); i++) {
        char tn[32], mn[32];
        snprintf(tn, sizeof tn, grp ? "trajectory.%d" : "trajectory", i);
        snprintf(mn, sizeof mn, grp ? "means.%d" : "means", i);
        const int64_t *ts = ro->trajectory_shape + grp, *ms = ro->means_shape + grp;
        size_t tsz = (size_t)(ts[0] * ts[1] * ts[2] * ts[3] * ts[4]), msz = (size_t)(ms[0] * ms[1] * ms[2] * ms[3] * ms[4]);
        if ((ro->trajectory && st_writer_add_f32(w, tn, 5, ts, ro->trajectory + (size_t)i * tsz)) ||
            (ro->means && st_writer_add_f32(w, mn, 5, ms, ro->means + (size_t)i * msz)))
            return -1;
    }
    if (!ro->n_runs) return 0;
    char runs[16 * 44] = "";
    size_t at = 0;
    for (int i = 0; i < ro->n_runs && at < sizeof runs; i++)
        at += (size_t)snprintf(runs + at, sizeof runs - at, "%s%" PRIu64 ":%" PRIu64, i ? "," : "",
                               ro->run_from[i], ro->run_version[i]);
    return st_writer_meta(w, "version_runs", runs);
}

/* ", encode 0.012 s, decode 0.300 s" when there was either. */
static const char *media_text(const reel_decoded_t *d) {
    static char buf[96];
    buf[0] = 0;
    if (d->encode_seconds > 0 || d->decode_seconds > 0)
        snprintf(buf, sizeof buf, " (+ encode %.3f s, decode %.3f s)", d->encode_seconds, d->decode_seconds);
    return buf;
}

/* Writes the result latent to o->out (safetensors, with the worker, the
 * weights version and the config) and says so on stderr. 0, or -1 with
 * the error value set (exit status 1). */
static int gen_save(const gen_opts_t *o, const reel_gen_result_t *r, const float *res_lat) {
    st_writer_t *w = st_writer_new();
    char v[32];
    snprintf(v, sizeof v, "%" PRIu64, r->version);
    int grp = o->g.n > 1;
    int64_t ls[5] = { o->g.n };
    memcpy(ls + 1, o->g.latent_shape, sizeof o->g.latent_shape);
    char lat_path[PATH_MAX];
    const char *dst = o->out;
    if (o->video_out) { /* the video to -o, the latent beside it */
        if (ctl_write_bytes(o->video_out, o->decoded.video, o->decoded.video_bytes) != 0) {
            st_writer_destroy(&w);
            return ctl_fail_as(REEL_E_IO, NULL);
        }
        snprintf(lat_path, sizeof lat_path, "%s.safetensors", o->out);
        dst = lat_path;
    }
    const reel_decoded_t *d = &o->decoded;
    char mp4[PATH_MAX + 8] = "";
    if (d->video && !o->video_out) { /* --output video, --out not X.mp4: the video beside the latent */
        snprintf(mp4, sizeof mp4, "%s.mp4", o->out);
        if (ctl_write_bytes(mp4, d->video, d->video_bytes) != 0) {
            st_writer_destroy(&w);
            return ctl_fail_as(REEL_E_IO, NULL);
        }
    }
    char npy[PATH_MAX];
    snprintf(npy, sizeof npy, "%s.frames.npy", o->out);
    if (d->frames && ctl_write_npy_u8(npy, d->frames, d->frames_ndim, d->frames_shape) != 0) {
        st_writer_destroy(&w);
        return ctl_fail_as(REEL_E_IO, NULL);
    }
    int wrc = !w || st_writer_add_f32(w, "latent", 4 + grp, grp ? ls : ls + 1, res_lat) ||
              add_rollout(w, &o->rollout) || st_writer_meta(w, "worker", r->worker) ||
              st_writer_meta(w, "weights_version", v) || st_writer_meta(w, "config", o->g.model) ||
              st_writer_save(w, dst);
    st_writer_destroy(&w);
    if (wrc) return ctl_fail_as(REEL_E_IO, NULL);
    char vers[48];
    if (r->first_version != r->version)
        snprintf(vers, sizeof vers, "v%" PRIu64 "->v%" PRIu64, r->first_version, r->version);
    else
        snprintf(vers, sizeof vers, "v%" PRIu64, r->version);
    char grp_text[128] = "";
    /* A group the worker split (over its streams, or into smaller batches
     * by its budget) runs each step once per part: the counts below are of
     * those runs, so say how many there were. */
    long long runs = (long long)r->captured + r->replayed + r->eager;
    if (grp && runs > o->g.steps)
        snprintf(grp_text, sizeof grp_text, ", a group of %d in batched steps run in parts, %lld steps in all",
                 o->g.n, runs);
    else if (grp)
        snprintf(grp_text, sizeof grp_text, ", a group of %d in batched steps", o->g.n);
    if (!grp && r->batched)
        snprintf(grp_text, sizeof grp_text, ", %d batched with other requests (%.1f a batch, %d padded rows)",
                 r->batched, (double)r->batch_rows / r->batched, r->padded_rows);
    fprintf(stderr, "reelctl: gen %s via %s: worker %s, weights %s, %d steps%s (captured %d, "
            "replayed %d, eager %d%s%s), %.3f s on the worker%s -> %s\n", o->g.model, o->broker, r->worker, vers,
            o->g.steps, grp_text, r->captured, r->replayed, r->eager, r->declines[0] ? ": " : "", r->declines,
            r->seconds, media_text(d), o->out);
    if (mp4[0]) fprintf(stderr, "reelctl: the video -> %s\n", mp4);
    return 0;
}

/* SIGINT / SIGTERM during the GEN: the client's wait ends and the GEN is
 * cancelled (reel_client_interrupt), so the cluster stops it. */
static reel_client_t *volatile g_gen_client;
static void on_interrupt(int sig) {
    (void)sig;
    reel_client_interrupt(g_gen_client);
}

/* ---- gen --prompts FILE: a round of one request a line ---------------------------------- */

/* Line `line`'s output (width digits) into path[PATH_MAX], as one gen's
 * --out: DIR/NNNN.safetensors, or DIR/NNNN.mp4 for a video. 0, or -1 with
 * an invalid error (too long). */
static int round_name(const gen_opts_t *o, int line, int width, char *path) {
    bool video = o->g.output && !strcmp(o->g.output, "video");
    if (snprintf(path, PATH_MAX, "%s/%0*d.%s", o->out_dir, width, line, video ? "mp4" : "safetensors") >= PATH_MAX)
        return reel_fail(REEL_E_INVALID, "--out-dir %s: path too long", o->out_dir);
    return 0;
}

/* What the round's hooks need. */
typedef struct {
    const gen_opts_t *o;
    const ctl_prompt_line_t *lines;
    int width;                  /* the digits of the outputs' names (round_path) */
    bool *told;                 /* each line's end said (done ran for it) */
    size_t written, failed;
    bool bar;                   /* a progress bar is drawn: a message starts a new line */
    reel_client_t *c;           /* the round's: ended when an output cannot be written */
    int stopped_at;             /* the line whose output could not be written (0: none): the round ended there */
} round_run_t;

static void round_bar(void *user, int done, int total) {
    round_run_t *r = user;
    ctl_progress(r->o->g.output && strcmp(r->o->g.output, "latent") ? "(steps, then the decodes' frames, of all)"
                                                                    : "(steps of all)", done, total);
}

/* As each line's request ends: its output written (as one gen writes its
 * --out), or its failure said with its line; what it held freed at once.
 * An output that cannot be written ends the round. */
static void round_done(void *user, size_t i, reel_gen_item_t *it, const float *latent) {
    round_run_t *r = user;
    r->told[i] = true;
    if (r->bar) fputc('\n', stderr);
    if (it->rc == 0) {
        gen_opts_t one = *r->o;
        char path[PATH_MAX];
        (void)round_name(r->o, r->lines[i].line, r->width, path); /* (checked before the round: round_path) */
        one.g = it->g;
        one.out = path;
        one.video_out = it->g.output && !strcmp(it->g.output, "video") ? path : NULL;
        if (it->g.decoded) one.decoded = *it->g.decoded;
        if (it->g.rollout) one.rollout = *it->g.rollout;
        if (gen_save(&one, &it->res, latent) == 0) {
            r->written++;
        } else {
            it->rc = -1;
            snprintf(it->err.code, sizeof it->err.code, "io");
            snprintf(it->err.message, sizeof it->err.message, "%s", reel_err_text());
            fprintf(stderr, "reelctl: gen: line %d: %s\n", r->lines[i].line, reel_err_text());
            r->failed++;
            /* A full disk, a folder gone: the lines after it would run on
             * the cluster only to fail here too. The round ends as on
             * SIGINT (reel_client_interrupt only sets a flag: a done hook
             * may call it). */
            if (!r->stopped_at) {
                r->stopped_at = r->lines[i].line;
                reel_client_interrupt(r->c);
            }
        }
    } else {
        fprintf(stderr, "reelctl: gen: line %d: %s: %s\n", r->lines[i].line, it->err.code, it->err.message);
        r->failed++;
    }
    fflush(stderr);
    reel_decoded_free(it->g.decoded);
    reel_rollout_free(it->g.rollout);
}

/* "7, 19, 33" into buf: the lines of the requests with rc != 0 (want_told:
 * those done told of, else the others). */
static void round_lines(const reel_gen_item_t *items, const ctl_prompt_line_t *lines, const bool *told, size_t n,
                        bool want_told, char *buf, size_t len) {
    size_t at = 0, listed = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && at < len; i++) {
        if (items[i].rc == 0 || told[i] != want_told) continue;
        if (listed++ == 20) {
            snprintf(buf + at, len - at, ", ...");
            return;
        }
        at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? ", " : "", lines[i].line);
    }
}

/* The outputs of line `line` (width digits): DIR/NNNN.safetensors, or
 * .mp4 for a video (its latent beside it, NNNN.mp4.safetensors, as gen
 * --out X.mp4 writes it); each absent or a regular file. 0 or -1. */
static int round_path(const gen_opts_t *o, int line, int width, char *path) {
    bool video = o->g.output && !strcmp(o->g.output, "video"), frames = o->g.output && !strcmp(o->g.output, "frames");
    if (round_name(o, line, width, path) != 0) return -1;
    char beside[PATH_MAX + 16];
    snprintf(beside, sizeof beside, "%s%s", path, video ? ".safetensors" : ".frames.npy");
    if (ctl_out_file(path) != 0 || ((video || frames) && ctl_out_file(beside) != 0)) return -1;
    return ctl_out_spares(path, "--prompts", o->prompts, (const char *)NULL);
}

/* Whether line `line`'s output is in DIR already: the file its gen writes
 * last (the latent, NNNN.safetensors, or NNNN.mp4.safetensors beside a
 * video), which appears whole or not at all (written to a temporary name,
 * then renamed), so a round cut short leaves no line taken for done that
 * is not. */
static bool round_has_output(const gen_opts_t *o, int line, int width) {
    bool video = o->g.output && !strcmp(o->g.output, "video");
    char path[PATH_MAX], last[PATH_MAX + 16];
    if (round_name(o, line, width, path) != 0) return false;
    snprintf(last, sizeof last, "%s%s", path, video ? ".safetensors" : "");
    struct stat st;
    return stat(last, &st) == 0 && S_ISREG(st.st_mode);
}

/* `gen --prompts FILE --out-dir DIR`: every line judged before anything is
 * sent (exit 2 for a bad one), then one round of GENs on one connection
 * (reel_gen_many, --window of them in flight), each output written as it
 * comes; a line that fails is said with its line number and the others go
 * on, but for an output that cannot be written (the round ends there). 0
 * when every line's output was written; CTL_NO (said) when some failed;
 * 130 when interrupted; -1 with the error value otherwise. */
static int gen_round(gen_opts_t *o) {
    ctl_prompt_line_t *lines = NULL;
    size_t n = 0;
    if (ctl_prompt_lines(o->prompts, &lines, &n) != 0) return -1;
    ctl_prompt_line_t *file_lines = lines, *run_lines = NULL; /* all the file's; those run (--skip-existing) */
    size_t n_file = n, skipped = 0;
    reel_gen_item_t *items = calloc(n, sizeof *items);
    reel_decoded_t *dec = calloc(n, sizeof *dec);
    reel_rollout_t *ros = calloc(n, sizeof *ros);
    bool *told = calloc(n, sizeof *told);
    reel_client_t *c = NULL;
    int code = -1;
    if (!items || !dec || !ros || !told) {
        reel_fail(REEL_E_NOMEM, "out of memory for %zu requests", n);
        goto done;
    }
    int width = 4;
    for (int last = lines[n - 1].line; last >= 10000; last /= 10) width++; /* names sort as the lines do */
    for (size_t i = 0; i < n; i++) {
        if (lines[i].negative && o->g.cfg == 1.0) {
            reel_fail(REEL_E_INVALID, "%s line %d: negative_prompt is used only with guidance: --cfg 1 turns it off",
                      o->prompts, lines[i].line);
            goto done;
        }
        char path[PATH_MAX]; /* made again as its output comes (round_done): PATH_MAX a line was 400 MB */
        if (round_path(o, lines[i].line, width, path) != 0) goto done;
    }
    if (mkdir(o->out_dir, 0777) != 0 && errno != EEXIST) {
        reel_fail_errno(REEL_E_IO, errno, "--out-dir %s", o->out_dir);
        goto done;
    }
    if (o->skip_existing) { /* the lines whose outputs are in DIR drop out: a round cut short, run again */
        if (!(run_lines = malloc(n * sizeof *run_lines))) {
            reel_fail(REEL_E_NOMEM, "out of memory for %zu requests", n);
            goto done;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (round_has_output(o, lines[i].line, width))
                skipped++;
            else
                run_lines[k++] = lines[i]; /* (a view: file_lines owns the text) */
        }
        lines = run_lines;
        n = k;
        if (n == 0) {
            fprintf(stderr, "reelctl: gen --prompts %s: %zu requests: every output is in %s already "
                    "(--skip-existing): nothing to run\n", o->prompts, skipped, o->out_dir);
            code = 0;
            goto done;
        }
    }
    if (gen_inputs(o) != 0) goto done; /* the latent's shape (nothing to read with --prompts) */
    bool rollout = o->rollout.want_trajectory || o->rollout.want_log_probs || o->rollout.want_means;
    for (size_t i = 0; i < n; i++) {
        reel_gen_t *g = &items[i].g;
        *g = o->g;
        g->prompt = lines[i].prompt;
        if (lines[i].negative) g->negative_prompt = lines[i].negative;
        /* line N's seed: --seed K + N - 1 (the first line's is K, as one gen --seed K) */
        g->seed = lines[i].has_seed ? lines[i].seed : o->g.seed + (uint64_t)(lines[i].line - 1);
        g->decoded = o->g.output && strcmp(o->g.output, "latent") ? &dec[i] : NULL;
        if (rollout) {
            ros[i] = o->rollout;
            g->rollout = &ros[i];
        }
    }
    if (!(c = reel_client_new_keys(o->broker, o->key, o->broker_key))) goto done;
    reel_client_on_resend(c, resent, "GEN");
    round_run_t run = { .o = o, .lines = lines, .width = width, .told = told, .bar = !o->quiet && ctl_tty(), .c = c };
    reel_gen_many_t many = { .window = o->window, .timeout_ms = o->timeout_ms, .keep_going = true,
                             .progress = run.bar ? round_bar : NULL, .done = round_done, .user = &run };
    struct sigaction sa = { .sa_handler = on_interrupt }, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    g_gen_client = c;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    size_t failed;
    wire_err_t err;
    int got = reel_gen_many(c, items, n, &many, &failed, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    g_gen_client = NULL;
    char bad[256], unrun[256];
    round_lines(items, lines, told, n, true, bad, sizeof bad);
    round_lines(items, lines, told, n, false, unrun, sizeof unrun);
    if (run.bar) fputc('\n', stderr);
    fprintf(stderr, "reelctl: gen --prompts %s: %zu requests: %zu written to %s", o->prompts, n + skipped,
            run.written, o->out_dir);
    if (skipped) fprintf(stderr, ", %zu skipped (their outputs were there: --skip-existing)", skipped);
    if (run.failed) fprintf(stderr, ", %zu failed (line%s %s)", run.failed, run.failed > 1 ? "s" : "", bad);
    if (unrun[0]) fprintf(stderr, ", %zu not run (cancelled or never sent: line%s %s)", n - run.written - run.failed,
                          n - run.written - run.failed > 1 ? "s" : "", unrun);
    fputc('\n', stderr);
    if (run.stopped_at) {
        if (unrun[0])
            fprintf(stderr, "reelctl: gen: stopped: line %d's output could not be written (above); the GENs in "
                    "flight were cancelled, the rest not sent\n", run.stopped_at);
        code = CTL_NO;
    } else if (got != 0 && !strcmp(err.code, REEL_CLIENT_E_INTERRUPTED)) {
        fprintf(stderr, "reelctl: gen: interrupted; the GENs in flight were cancelled (the cluster stops them)\n");
        code = 130;
    } else if (got != 0 && failed == REEL_GEN_NO_INDEX) {
        ctl_fail_wire(&err, "gen --prompts: the round ended");
    } else {
        code = run.written == n ? 0 : CTL_NO;
    }
done:
    reel_client_destroy(&c);
    for (size_t i = 0; dec && ros && i < n; i++) { /* what a request the round never ended holds */
        reel_decoded_free(&dec[i]);
        reel_rollout_free(&ros[i]);
    }
    free(items);
    free(dec);
    free(ros);
    free(told);
    free(run_lines);
    ctl_prompt_lines_free(file_lines, n_file);
    return code;
}

int cmd_gen(int argc, char **argv) {
    gen_opts_t o;
    if (gen_parse(argc, argv, &o) != 0) return -1;
    if (o.prompts) return gen_round(&o);
    float *res_lat = NULL;
    reel_client_t *c = NULL;
    int code = -1;
    if (gen_inputs(&o) != 0) goto done;
    reel_gen_t *g = &o.g;
    g->progress = !o.quiet && ctl_tty();
    size_t n = (size_t)(g->latent_shape[0] * g->latent_shape[1] * g->latent_shape[2] * g->latent_shape[3]) * (size_t)g->n;
    if (!(res_lat = malloc(n * sizeof *res_lat))) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto done;
    }
    if (!(c = reel_client_new_keys(o.broker, o.key, o.broker_key))) goto done; /* its error: a bad key or endpoint is 2 */
    reel_client_on_resend(c, resent, "GEN");
    reel_gen_result_t r;
    wire_err_t err;
    struct sigaction sa = { .sa_handler = on_interrupt }, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    g_gen_client = c;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    const char *label = g->decoded ? "(steps, then the decode's frames)" : "(steps)";
    int got = reel_gen(c, g, res_lat, &r, progress_bar, (void *)label, o.timeout_ms, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    g_gen_client = NULL;
    if (got != 0 && !strcmp(err.code, REEL_CLIENT_E_INTERRUPTED)) {
        fprintf(stderr, "%sreelctl: gen: interrupted; the GEN was cancelled (the cluster stops it)\n",
                g->progress ? "\n" : "");
        code = 130;
        goto done;
    }
    if (got != 0) {
        ctl_fail_wire(&err, "gen");
        goto done;
    }
    code = gen_save(&o, &r, res_lat);
done:
    reel_client_destroy(&c);
    free((void *)o.g.context);
    free((void *)o.g.uncond);
    free((void *)o.g.latent);
    free(res_lat);
    reel_rollout_free(&o.rollout);
    reel_decoded_free(&o.decoded);
    return code;
}

typedef struct {
    double t0, done_s; /* done_s: when the broker held all of it; -1 before */
} upload_clock_t;

static void upload_done(void *user, uint64_t done, uint64_t size) {
    upload_clock_t *k = user;
    if (done == size && k->done_s < 0) k->done_s = ctl_now();
}

/* The text of the file at path (at most max bytes), malloc'd and
 * NUL-terminated; NULL with a message. */
static char *read_text(const char *path, size_t max, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        reel_fail(REEL_E_NOT_FOUND, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *t = malloc(max + 2);
    *n = t ? fread(t, 1, max + 1, f) : 0;
    fclose(f);
    if (!t) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    if (*n > max) {
        free(t);
        reel_fail(REEL_E_LIMIT, "%s: more than %zu bytes", path, max);
        return NULL;
    }
    t[*n] = '\0';
    return t;
}

/* `reelctl sync --lora DIR --base B --version V`: the adapter checked here
 * as the workers will check it (its sha256 the identity they compare),
 * its folder sent as an absolute path; `--lora-upload DIR`: by value (its
 * weights file uploaded through the broker, its config in the SYNC);
 * `--lora none --weights BASE`: the base again (BASE's identity). */
static int sync_adapter(const char *broker, const char *key, const char *broker_key, const char *component,
                        uint64_t version, bool have_version, uint64_t base, const char *lora, const char *weights,
                        bool upload, uint64_t deadline, int timeout_ms) {
    if (!lora || !base || !have_version)
        return reel_fail(REEL_E_INVALID, "sync of an adapter needs --version V --base B --lora DIR (or --lora none "
                         "--weights BASE for the base again)");
    char path[4096] = "", sha[65], *config = NULL;
    if (strcmp(lora, "none")) {
        if (weights) return reel_fail(REEL_E_INVALID, "sync --lora DIR: no --weights (the base is the workers')");
        lora_t *l = lora_open(lora);
        if (!l) return ctl_fail_as(REEL_E_INVALID, "--lora %s: ", lora);
        snprintf(sha, sizeof sha, "%s", lora_sha256(l));
        fprintf(stderr, "reelctl: adapter %s: rank %d, alpha %g, %d targets, %zu bytes\n", lora, lora_rank(l),
                lora_alpha(l), lora_n_targets(l), lora_bytes(l));
        lora_close(&l);
        if (!realpath(lora, path)) return reel_fail(REEL_E_INVALID, "--lora %s: %s", lora, strerror(errno));
        if (upload) { /* by value: its weights file uploaded, its config in the SYNC */
            char cfg[sizeof path], wts[sizeof path];
            if (lora_locate(path, cfg, wts, sizeof cfg) != 0) return ctl_fail_as(REEL_E_INVALID, NULL);
            memcpy(path, wts, sizeof path);
            size_t n = 0;
            /* none beside it: "{}", the weights file's own (model/lora.h) */
            if (!(config = cfg[0] ? read_text(cfg, MSG_LORA_CONFIG_MAX - 1, &n) : strdup("{}")))
                return ctl_fail_as(REEL_E_INVALID, NULL);
        }
    } else {
        if (upload) return reel_fail(REEL_E_INVALID, "sync --lora none: nothing to upload (the base is the workers')");
        if (!weights) return reel_fail(REEL_E_INVALID, "sync --lora none: --weights BASE gives the base's identity");
        wan_sync_source_t src;
        if (wan_sync_source(weights, false, &src) != 0) return ctl_fail_as(REEL_E_INVALID, NULL);
        snprintf(sha, sizeof sha, "%s", src.sha256);
        wan_sync_source_done(&src);
    }
    reel_client_t *c = reel_client_new_keys(broker, key, broker_key);
    if (!c) { /* its error stands: a bad key or endpoint exits 2, a socket failure 1 */
        free(config);
        return -1;
    }
    reel_client_on_resend(c, resent, "SYNC");
    reel_sync_result_t r;
    wire_err_t err;
    int rc = config ? reel_publish_adapter(c, component, version, base, sha, path, config, deadline, NULL, NULL, &r,
                                           timeout_ms, &err)
                    : reel_sync_adapter(c, component, version, base, sha, path, deadline, &r, timeout_ms, &err);
    reel_client_destroy(&c);
    free(config);
    if (rc != 0) return ctl_fail_wire(&err, "sync");
    const char *state = r.complete ? "complete"
                        : !r.applied[0] ? "FAILED, no worker applied it (the broker's current version is unchanged)"
                        : "INCOMPLETE (it is current; the failed workers lag)";
    fprintf(stderr, "reelctl: sync %s v%" PRIu64 " (%s on base v%" PRIu64 "): %s; applied %s; failed %s\n", component,
            version, path[0] ? "adapter" : "no adapter", base, state, r.applied[0] ? r.applied : "-",
            r.failed[0] ? r.failed : "-");
    return r.complete ? 0 : CTL_NO;
}

int cmd_sync(int argc, char **argv) {
    static const struct option opts[] = {
        { "broker", required_argument, 0, 'b' }, { "component", required_argument, 0, 'c' },
        { "version", required_argument, 0, 'v' }, { "weights", required_argument, 0, 'w' },
        { "timeout-ms", required_argument, 0, 't' }, { "deadline-ms", required_argument, 0, 'd' },
        { "key", required_argument, 0, 'k' }, { "broker-key", required_argument, 0, 'K' },
        { "upload", required_argument, 0, 'u' }, { "lora", required_argument, 0, 'l' },
        { "lora-upload", required_argument, 0, 'L' },
        { "base", required_argument, 0, 'B' }, { 0, 0, 0, 0 },
    };
    const char *lora = NULL; /* --lora DIR|none with --base B: an adapter on base B, or B again */
    uint64_t base = 0;
    const char *broker = DEFAULT_BROKER, *component = "transformer", *weights = NULL;
    bool upload = false; /* by value: the file's bytes go through the broker */
    const char *key = NULL, *broker_key = NULL; /* NULL: $REEL_KEY, $REEL_BROKER_KEY */
    uint64_t version = 0, deadline = 60000;
    int timeout_ms = 120000, o;
    bool have_version = false;
    const char *by_path = NULL, *by_value = NULL; /* the last of --weights/--lora, of --upload/--lora-upload */
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'b': broker = optarg; break;
        case 'k': key = optarg; break;
        case 'K': broker_key = optarg; break;
        case 'c': component = optarg; break;
        case 'w':
            weights = optarg;
            by_path = "--weights";
            break;
        case 'l':
            lora = optarg;
            if (strcmp(optarg, "none")) by_path = "--lora";
            break;
        case 'L':
            lora = optarg;
            upload = true;
            by_value = "--lora-upload";
            break;
        case 'B':
            if (reel_parse_u64(optarg, 1, UINT64_MAX, "--base", &base)) return -1;
            break;
        case 'u':
            weights = optarg;
            upload = true;
            by_value = "--upload";
            break;
        case 'v':
            if (reel_parse_u64(optarg, 0, UINT64_MAX, "--version", &version)) return -1;
            have_version = true;
            break;
        case 't':
            if (reel_parse_int(optarg, 1, INT_MAX, "--timeout-ms", &timeout_ms)) return -1;
            break;
        case 'd':
            if (reel_parse_u64(optarg, 0, UINT64_MAX, "--deadline-ms", &deadline)) return -1;
            break;
        default: return ctl_fail_usage("sync", "sync: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "sync: unexpected argument '%s'", argv[optind]);
    /* one source: by path (the workers read it) or by value (through the
     * broker); --lora none --weights BASE names the base, nothing is sent */
    if (by_path && by_value && !(lora && !strcmp(lora, "none")))
        return reel_fail(REEL_E_INVALID, "sync: %s and %s exclude each other (%s sends the file by value; the other "
                         "names a path the workers read)", by_path, by_value, by_value);
    if (base && have_version && base >= version)
        return reel_fail(REEL_E_INVALID, "sync: --base %" PRIu64 " must be below --version %" PRIu64 ": the full version "
                         "the adapter applies to, published before it", base, version);
    if (lora || base) return sync_adapter(broker, key, broker_key, component, version, have_version, base, lora,
                                          weights, upload, deadline, timeout_ms);
    if (!weights || !have_version)
        return reel_fail(REEL_E_INVALID, "sync needs --version V and --weights W.safetensors (or --upload W.safetensors)");
    /* Any layout a Wan2.1 user has (a file, an index, a folder): judged here
     * as the workers will judge it, with the identity they will check; an
     * upload of several files goes packed into one (wan_ckpt.h). */
    wan_sync_source_t src;
    if (wan_sync_source(weights, upload, &src) != 0) return ctl_fail_as(REEL_E_INVALID, NULL);
    const char *path = src.path, *hex = src.sha256;
    reel_client_t *c = reel_client_new_keys(broker, key, broker_key);
    if (!c) {
        wan_sync_source_done(&src);
        return -1;
    }
    reel_client_on_resend(c, resent, "SYNC");
    reel_sync_result_t r;
    wire_err_t err;
    int rc = 0;
    if (upload) { /* the SYNC goes with the first chunk: workers fetch while the rest comes */
        upload_clock_t k = { ctl_now(), -1 };
        rc = reel_publish(c, component, version, hex, path, deadline, upload_done, &k, &r, timeout_ms, &err);
        if (k.done_s >= 0)
            fprintf(stderr, "reelctl: uploaded %s to the broker in %.2f s\n", weights, k.done_s - k.t0);
    } else {
        rc = reel_sync(c, component, version, hex, path, deadline, &r, timeout_ms, &err);
    }
    reel_client_destroy(&c);
    wan_sync_source_done(&src);
    if (rc != 0) return ctl_fail_wire(&err, "sync");
    /* The broker makes a version current once some worker applied it: with
     * nobody in `applied` nothing changed, otherwise the failed workers lag
     * (docs/PROTOCOL.md, "Weight syncs"). */
    const char *state = r.complete ? "complete"
                        : !r.applied[0] ? (r.failed[0] ? "FAILED, no worker applied it (the broker's current version is unchanged)"
                                                       : "FAILED, no live worker (the broker's current version is unchanged)")
                        : "INCOMPLETE (it is current; the failed workers lag until a reconnect or a resend catches them up)";
    fprintf(stderr, "reelctl: sync %s v%" PRIu64 ": %s; applied %s; failed %s\n", component, version, state,
            r.applied[0] ? r.applied : "-", r.failed[0] ? r.failed : "-");
    return r.complete ? 0 : CTL_NO; /* the line above said why */
}

static json_t *versions_json(const msg_versions_t *v) {
    json_t *o = json_object();
    for (int i = 0; o && i < v->n; i++) json_object_set_new(o, v->e[i].name, json_integer((json_int_t)v->e[i].n));
    return o;
}

static json_t *worker_json(const msg_worker_status_t *w) {
    json_t *lag = json_object(), *keys = json_array();
    for (int i = 0; lag && i < w->lagging.n; i++)
        json_object_set_new(lag, w->lagging.e[i].name, json_string(w->lagging.e[i].text));
    for (int i = 0; keys && i < w->n_keys; i++) {
        char hex[17];
        json_array_append_new(keys, json_string(msg_hex64(w->keys[i], hex)));
    }
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:b, s:o, s:o, s:o, s:I}", "name", w->name, "device",
                     w->device, "arch", w->arch, "text_encoder", w->text_encoder, "vae", w->vae, "streams",
                     (json_int_t)w->streams, "inflight", (json_int_t)w->inflight, "max_inflight",
                     (json_int_t)w->max_inflight, "routable", w->routable, "versions", versions_json(&w->versions),
                     "lagging", lag, "keys", keys, "alive_ms", (json_int_t)w->alive_ms);
}

/* STATUS_REPLY as one line of JSON, its fields in wire order. */
static void status_json(const msg_status_reply_t *r, FILE *f) {
    json_t *ws = json_array(), *models = json_array(), *refused = json_array();
    for (size_t i = 0; refused && i < r->n_auth_refused_recent; i++) {
        const msg_refused_peer_t *p = &r->auth_refused_recent[i];
        json_array_append_new(refused, json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:I}", "socket", p->socket, "key",
                                                 p->key, "name", p->name, "address", p->address, "why", p->why,
                                                 "count", (json_int_t)p->count, "ago_ms", (json_int_t)p->ago_ms));
    }
    for (size_t i = 0; ws && i < r->n_workers; i++) json_array_append_new(ws, worker_json(&r->workers[i]));
    for (size_t i = 0; models && i < r->n_models; i++) {
        const msg_model_t *m = &r->models[i];
        json_array_append_new(models, json_pack("{s:s, s:I, s:I, s:I, s:I}", "name", m->name, "in_channels",
                                                (json_int_t)m->in_channels, "text_dim", (json_int_t)m->text_dim,
                                                "patch", (json_int_t)m->patch, "layers", (json_int_t)m->layers));
    }
    json_t *o = json_pack("{s:o, s:I, s:I, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:I, "
                          "s:o}",
                          "workers", ws,
                          "queue", (json_int_t)r->queue, "queue_max", (json_int_t)r->queue_max, "versions",
                          versions_json(&r->versions), "pending", versions_json(&r->pending), "malformed",
                          (json_int_t)r->malformed, "catalog_dropped", (json_int_t)r->catalog_dropped,
                          "catalog_failures", (json_int_t)r->catalog_failures, "catalog_pending",
                          (json_int_t)r->catalog_pending,
                          "undelivered", (json_int_t)r->undelivered, "replies_suppressed",
                          (json_int_t)r->replies_suppressed, "auth_refused", (json_int_t)r->auth_refused,
                          "auth_refused_peers", (json_int_t)r->auth_refused_peers, "auth_refused_recent", refused,
                          "requests_ok", (json_int_t)r->requests_ok, "requests_failed", (json_int_t)r->requests_failed,
                          "steps_replayed", (json_int_t)r->steps_replayed, "steps_eager", (json_int_t)r->steps_eager,
                          "steps_captured", (json_int_t)r->steps_captured, "models", models);
    if (o && r->worker_refused) /* (absent while 0, as on the wire) */
        json_object_set_new(o, "worker_refused", json_integer((json_int_t)r->worker_refused));
    if (o && r->progress_dropped)
        json_object_set_new(o, "progress_dropped", json_integer((json_int_t)r->progress_dropped));
    if (o && r->ha_state[0]) /* one of a standby pair */
        json_object_set_new(o, "ha", json_pack("{s:s, s:s, s:I, s:s}", "state", r->ha_state, "role", r->ha_role,
                                               "term", (json_int_t)r->ha_term, "peer", r->ha_peer));
    if (o) json_dumpf(o, f, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
}

/* The version of `name` in v (0 when absent). */
uint64_t ctl_version_of(const msg_versions_t *v, const char *name, bool *found) {
    for (int i = 0; i < v->n; i++)
        if (!strcmp(v->e[i].name, name)) {
            if (found) *found = true;
            return v->e[i].n;
        }
    if (found) *found = false;
    return 0;
}

const char *ctl_lag_of(const msg_worker_status_t *w, const char *component) {
    for (int i = 0; i < w->lagging.n; i++)
        if (!strcmp(w->lagging.e[i].name, component)) return w->lagging.e[i].text;
    return NULL;
}

static void status_text(const msg_status_reply_t *r, const char *broker) {
    uint64_t v = ctl_version_of(&r->versions, "transformer", NULL), pv;
    if (v) printf("broker %s: queue %" PRIu64 "/%" PRIu64 ", transformer v%" PRIu64 "\n", broker, r->queue, r->queue_max, v);
    else printf("broker %s: queue %" PRIu64 "/%" PRIu64 ", transformer: no sync applied yet\n", broker, r->queue, r->queue_max);
    if (r->ha_state[0])
        printf("one of a standby pair: %s (%s, term %" PRIu64 "); its peer: %s\n", r->ha_state, r->ha_role, r->ha_term,
               r->ha_peer);
    bool pending;
    pv = ctl_version_of(&r->pending, "transformer", &pending);
    if (pending) printf("transformer v%" PRIu64 " pending (no worker has applied it yet)\n", pv);
    /* what the broker dropped or could not do, shown once any is not zero */
    if (r->malformed || r->undelivered || r->replies_suppressed || r->auth_refused)
        printf("peers: %" PRIu64 " malformed, %" PRIu64 " undelivered, %" PRIu64 " answers suppressed, %" PRIu64
               " handshakes refused\n", r->malformed, r->undelivered, r->replies_suppressed, r->auth_refused);
    if (r->progress_dropped) /* apart: harmless, and noisy while clients read slowly */
        printf("progress: %" PRIu64 " PROGRESS not delivered (a client's full queue: the next one says more)\n",
               r->progress_dropped);
    if (r->worker_refused)
        printf("workers: %" PRIu64 " message%s refused or dropped for what %s said (the broker's log names each)\n",
               r->worker_refused, r->worker_refused == 1 ? "" : "s", r->worker_refused == 1 ? "it" : "they");
    if (r->auth_refused_peers) { /* from how many peers, and the latest few (--json: all the broker keeps) */
        printf("handshakes refused: %" PRIu64 " from %" PRIu64 " peer%s; most recently:\n", r->auth_refused,
               r->auth_refused_peers, r->auth_refused_peers == 1 ? "" : "s");
        for (size_t i = 0; i < r->n_auth_refused_recent && i < 5; i++) {
            const msg_refused_peer_t *p = &r->auth_refused_recent[i];
            printf("  %s socket, key %s%s%s%s from %s: %s; %" PRIu64 " time%s, the last %.1f s ago\n", p->socket,
                   p->key[0] ? p->key : "(none read)", p->name[0] ? " (" : "", p->name, p->name[0] ? ")" : "",
                   p->address[0] ? p->address : "?", p->why, p->count, p->count == 1 ? "" : "s",
                   (double)p->ago_ms / 1000.0);
        }
    }
    if (r->catalog_dropped || r->catalog_failures || r->catalog_pending > 1000)
        printf("catalog: %" PRIu64 " events shed, %" PRIu64 " failed writes (retried), %" PRIu64 " records waiting\n",
               r->catalog_dropped, r->catalog_failures, r->catalog_pending);
    printf("%-12s %-8s %-11s %-8s %-9s %-8s %-5s %s\n", "WORKER", "DEVICE", "ARCH", "STREAMS", "INFLIGHT", "VERSION",
           "KEYS", "STATE");
    for (size_t i = 0; i < r->n_workers; i++) {
        const msg_worker_status_t *w = &r->workers[i];
        char infs[48];
        snprintf(infs, sizeof infs, "%" PRIu64 "/%" PRIu64, w->inflight, w->max_inflight);
        /* lagging: behind the current version, and why (its error, a
         * missed deadline, a sync on its way) */
        const char *lag = ctl_lag_of(w, "transformer");
        /* what else it does: prompts in (its text encoder), frames and videos out (its VAE) */
        char media[2 * MSG_NAME_MAX + 32] = "";
        if (w->text_encoder[0] || w->vae[0])
            snprintf(media, sizeof media, " [%s%s%s%s%s]", w->text_encoder[0] ? "text " : "", w->text_encoder,
                     w->text_encoder[0] && w->vae[0] ? ", " : "", w->vae[0] ? "vae " : "", w->vae);
        printf("%-12s %-8s %-11s %-8" PRIu64 " %-9s v%-7" PRIu64 " %-5d %s%s%s%s\n", w->name, w->device, w->arch,
               w->streams, infs, ctl_version_of(&w->versions, "transformer", NULL), w->n_keys, lag ? "lagging: " : "",
               lag ? lag : w->routable ? "ok" : "", !w->routable ? (lag ? " (unreachable)" : "unreachable") : "", media);
    }
}

static void prom(FILE *out, const char *name, const char *type, const char *help, uint64_t v) {
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type, name, v);
}

int ctl_broker_metrics(const char *broker, FILE *out) {
    reel_client_t *c = reel_client_new_keys(broker, NULL, NULL);
    if (!c) return -1;
    reel_status_t *s = NULL;
    wire_err_t err;
    int rc = reel_status(c, &s, 5000, &err);
    reel_client_destroy(&c);
    if (rc != 0) return ctl_fail_wire(&err, "broker %s", broker);
    const msg_status_reply_t *r = reel_status_reply(s);
    /* By state, with the label set of the broker's live /metrics (one
     * name, one label set, whichever source Prometheus scrapes); STATUS
     * lists the live workers only, so no "dead". */
    uint64_t routable = 0; /* as the broker counts them: routable and lagging behind no current version */
    for (size_t i = 0; i < r->n_workers; i++) routable += r->workers[i].routable && r->workers[i].lagging.n == 0;
    fputs("# HELP reel_broker_workers Workers registered, by state.\n# TYPE reel_broker_workers gauge\n", out);
    fprintf(out, "reel_broker_workers{state=\"routable\"} %" PRIu64 "\n", routable);
    fprintf(out, "reel_broker_workers{state=\"unroutable\"} %" PRIu64 "\n", (uint64_t)r->n_workers - routable);
    prom(out, "reel_broker_queue_depth", "gauge", "Requests waiting for a worker.", r->queue);
    prom(out, "reel_broker_malformed_total", "counter", "Unreadable messages received.", r->malformed);
    prom(out, "reel_broker_worker_refused_total", "counter",
         "Registered workers' messages refused or dropped for what they said (each logged).", r->worker_refused);
    prom(out, "reel_broker_undelivered_total", "counter",
         "Messages but PROGRESS dropped because their peer could not take them: gone, a worker's full "
         "queue, or a client's answers held past their bounds.", r->undelivered);
    prom(out, "reel_broker_progress_dropped_total", "counter",
         "PROGRESS a client could not take (a full queue, answers held before it, or gone): harmless.",
         r->progress_dropped);
    prom(out, "reel_broker_replies_suppressed_total", "counter",
         "Answers to bad messages not sent (over the peer's budget, or not a registered worker).",
         r->replies_suppressed);
    prom(out, "reel_broker_auth_refusals_total", "counter", "CURVE handshakes refused.", r->auth_refused);
    prom(out, "reel_broker_auth_refused_peers_total", "counter",
         "Peers (a key from an address on one socket) whose CURVE handshakes were refused.", r->auth_refused_peers);
    prom(out, "reel_catalog_events_shed_total", "counter",
         "Worker events not written: their worker had too many waiting.", r->catalog_dropped);
    prom(out, "reel_catalog_write_failures_total", "counter",
         "Catalog batches the store refused for now (kept and retried).", r->catalog_failures);
    prom(out, "reel_catalog_pending", "gauge", "Catalog records waiting to be written.", r->catalog_pending);
    reel_status_free(&s);
    return fflush(out) == 0 ? 0 : reel_fail(REEL_E_IO, "writing the metrics failed");
}

int cmd_status(int argc, char **argv) {
    const char *broker = DEFAULT_BROKER, *key = NULL, *broker_key = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--broker") && i + 1 < argc) broker = argv[++i];
        else if (!strcmp(argv[i], "--key") && i + 1 < argc) key = argv[++i];
        else if (!strcmp(argv[i], "--broker-key") && i + 1 < argc) broker_key = argv[++i];
        else return ctl_fail_usage("status", "status: unknown option '%s'", argv[i]);
    }
    reel_client_t *c = reel_client_new_keys(broker, key, broker_key);
    if (!c) return -1;
    reel_status_t *s = NULL;
    wire_err_t err;
    int rc = reel_status(c, &s, 5000, &err);
    if (rc != 0) {
        reel_client_destroy(&c);
        return ctl_fail_wire(&err, "status");
    }
    if (json) {
        status_json(reel_status_reply(s), stdout);
        fputc('\n', stdout);
    } else {
        status_text(reel_status_reply(s), reel_client_endpoint(c)); /* of a pair: the one that answered */
    }
    reel_status_free(&s);
    reel_client_destroy(&c);
    return 0;
}
