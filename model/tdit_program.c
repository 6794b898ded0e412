/* tdit_program.c -- the tinydit step as a capture_cache program (see
 * tdit_program.h). */
#include "tdit_program.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/ops_args.h"
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IN_LATENT, IN_SIGMAS, IN_GUIDANCE, IN_CONTEXT, IN_UNCOND };

/* The step shape a key describes; -1 with a message. */
static int key_shape(const cap_key_t *key, tdit_shape_t *sh) {
    if (key->n_inputs < 4 || (key->inputs[IN_LATENT].ndim != 4 && key->inputs[IN_LATENT].ndim != 5) ||
        key->inputs[IN_CONTEXT].ndim != 2)
        return reel_fail(REEL_E_INVALID, "tinydit program: key has no latent/context signature");
    bool cfg = key->n_inputs > IN_UNCOND && !strcmp(key->inputs[IN_UNCOND].name, "uncond");
    /* [C,F,H,W], or [B,C,F,H,W] for a batch; a mixed batch's σ is [B,3]
     * and its context [B·L,T] */
    const int64_t *ls = key->inputs[IN_LATENT].shape + (key->inputs[IN_LATENT].ndim - 4);
    int64_t B = key->inputs[IN_LATENT].ndim == 5 ? key->inputs[IN_LATENT].shape[0] : 1;
    bool mixed = key->inputs[IN_SIGMAS].ndim == 2;
    if (mixed && (B < 2 || key->inputs[IN_CONTEXT].shape[0] % B))
        return reel_fail(REEL_E_INVALID, "tinydit program: a mixed key's context is not B rows of L");
    *sh = (tdit_shape_t){ ls[1], ls[2], ls[3], key->inputs[IN_CONTEXT].shape[0] / (mixed ? B : 1), cfg, B,
                          TDIT_SOLVER_EULER, mixed, TDIT_SOLVER_EULER };
    if (!strcmp(key->loop, "unipc") || !strcmp(key->loop, "dpm++")) (void)tdit_solver_parse(key->loop, &sh->solver);
    const char *grid = strchr(key->loop, '-'); /* euler-unipc, sde-dpm++, ...: Euler or SDE steps on that grid */
    if (grid) (void)tdit_solver_parse(grid + 1, &sh->grid);
    return 0;
}

static void *ws_new(void *user, const cap_key_t *key, kern_stream_t *s) {
    tdit_shape_t sh;
    return key_shape(key, &sh) == 0 ? tdit_ws_new(user, s, &sh) : NULL;
}

static size_t ws_size(void *user, const cap_key_t *key) {
    tdit_shape_t sh;
    return key_shape(key, &sh) == 0 ? tdit_ws_size(user, &sh) : 0;
}

/* Every weight tensor of the model as it is now (address, size, dtype and
 * layout): what a graph baked in. */
static int weights(void *user, cap_weight_t *out, int max) {
    const tdit_model_t *m = user;
    int n = tdit_model_n_tensors(m);
    for (int i = 0; i < n && i < max; i++) {
        const kern_tensor_t *t = tdit_model_tensor(m, i);
        out[i] = cap_weight_of(t, 0);
    }
    return n;
}

/* user (the model) may be gone: the cache frees an entry's workspace when
 * it evicts it (cache.h, Lifetimes); the workspace frees itself alone. */
static void ws_free(void *user, void *ws) {
    (void)user;
    tdit_ws_t *w = ws;
    tdit_ws_destroy(&w);
}

static size_t ws_bytes(void *user, const void *ws) {
    (void)user;
    return tdit_ws_bytes(ws);
}

/* Inputs in key order: latent, sigmas, guidance, context, then uncond (CFG)
 * and the SDE parameters (SDE steps) or the solver's coefficients and
 * history (multistep steps). */
static kern_tensor_t *input(void *user, void *ws, int i) {
    (void)user; /* may be gone when an entry is freed */
    const tdit_shape_t *sh = tdit_ws_shape(ws);
    switch (i) {
    case IN_LATENT: return tdit_ws_latent(ws);
    case IN_SIGMAS: return tdit_ws_sigmas(ws);
    case IN_GUIDANCE: return tdit_ws_guidance(ws);
    case IN_CONTEXT: return tdit_ws_context(ws);
    default: break;
    }
    int extra = i - IN_UNCOND - (sh->cfg ? 1 : 0);
    if (extra < 0) return tdit_ws_uncond(ws);
    if (!tdit_solver_multistep(sh->solver)) return tdit_ws_sde(ws);
    return extra == 0 ? tdit_ws_solver(ws) : tdit_ws_history(ws);
}

/* Output 0: the updated latent; output 1: an SDE step's mean μ, or a
 * multistep step's history. */
static kern_tensor_t *output(void *user, void *ws, int i) {
    (void)user;
    if (i == 0) return tdit_ws_latent(ws);
    return tdit_solver_multistep(tdit_ws_shape(ws)->solver) ? tdit_ws_history(ws) : tdit_ws_mean(ws);
}

/* Every per-step value is read from the workspace, the SDE's eta, seed and
 * step included: nothing is baked, so both kinds capture. */
static int launch(void *user, void *ws, const cap_const_t *k, int n, kern_stream_t *s) {
    (void)k;
    (void)n;
    return tdit_step(user, ws, s);
}

static int launch_sde(void *user, void *ws, const cap_const_t *k, int n, kern_stream_t *s) {
    (void)k;
    (void)n;
    return tdit_step_sde_ws(user, ws, s);
}

static int launch_ms(void *user, void *ws, const cap_const_t *k, int n, kern_stream_t *s) {
    (void)k;
    (void)n;
    return tdit_step_multistep(user, ws, s);
}

#define TDIT_PROGRAM(NAME, N, OUTS, LAUNCH, ...)                                            \
    { .name = NAME, .n_inputs = N, .n_outputs = OUTS, .pinnable = { __VA_ARGS__ }, .ws_new = ws_new, \
      .ws_size = ws_size, .ws_free = ws_free, .ws_bytes = ws_bytes, .input = input,            \
      .output = output, .launch = LAUNCH, .n_components = 1,                                   \
      .components = { TDIT_COMPONENT }, .weights = weights }

/* Contexts are pinnable (they stay put across a request's steps); the
 * latent, the per-step scalars and the SDE parameters are copied. */
static const cap_program_t programs[2][2] = {
    { TDIT_PROGRAM("tinydit-step", 4, 1, launch, 0, 0, 0, 1),
      TDIT_PROGRAM("tinydit-step-sde", 5, 2, launch_sde, 0, 0, 0, 1, 0) },
    { TDIT_PROGRAM("tinydit-step-cfg", 5, 1, launch, 0, 0, 0, 1, 1),
      TDIT_PROGRAM("tinydit-step-cfg-sde", 6, 2, launch_sde, 0, 0, 0, 1, 1, 0) },
};

/* Multistep: the history is copied in and out like the latent (it is the
 * request's, and requests interleave on one workspace). */
static const cap_program_t ms_programs[2] = {
    TDIT_PROGRAM("tinydit-step-ms", 6, 2, launch_ms, 0, 0, 0, 1, 0, 0),
    TDIT_PROGRAM("tinydit-step-cfg-ms", 7, 2, launch_ms, 0, 0, 0, 1, 1, 0, 0),
};

const cap_program_t *tdit_program(bool cfg, bool sde) { return &programs[cfg][sde]; }
const cap_program_t *tdit_program_ms(bool cfg) { return &ms_programs[cfg]; }

const char *tdit_step_loop(const tdit_shape_t *sh, bool sde) {
    if (tdit_solver_multistep(sh->solver)) return tdit_solver_name(sh->solver);
    if (sh->grid == TDIT_SOLVER_UNIPC) return sde ? "sde-unipc" : "euler-unipc";
    if (sh->grid == TDIT_SOLVER_DPMPP) return sde ? "sde-dpm++" : "euler-dpm++";
    return sde ? "sde" : "euler";
}

int tdit_step_key(const tdit_model_t *m, const tdit_shape_t *sh, bool sde, uint64_t version,
                  cap_key_t *k) {
    const tdit_config_t *c = tdit_model_config(m);
    kern_backend_t *b = tdit_model_backend(m);
    char model[CAP_MODEL_MAX];
    if ((size_t)snprintf(model, sizeof model, "tinydit:%s", c->name) >= sizeof model)
        return reel_fail(REEL_E_LIMIT, "model name %s too long for a capture key", c->name);
    const int64_t lat[4] = { c->in_channels, sh->frames, sh->height, sh->width };
    const int64_t ctx[2] = { sh->text_len, c->text_dim };
    if (sh->mixed)
        return cap_key_denoise_mixed(k, kern_backend_device_name(b), kern_backend_arch(b), model,
                                     tdit_step_loop(sh, sde), tdit_model_dtype(m), tdit_shape_batch(sh), lat, ctx,
                                     sh->cfg, TDIT_COMPONENT, version);
    return cap_key_denoise_batch(k, kern_backend_device_name(b), kern_backend_arch(b), model,
                                 tdit_step_loop(sh, sde), tdit_model_dtype(m), tdit_shape_batch(sh), lat, ctx,
                                 sh->cfg, TDIT_COMPONENT, version);
}

int tdit_register_weights(cap_cache_t *c, const tdit_model_t *m, uint64_t version) {
    return cap_component_register(c, TDIT_COMPONENT, tdit_model_weights(m), tdit_model_bytes(m), version);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Request buffers on the device: what the program's inputs point at. */
struct tdit_staging {
    kern_backend_t *b;
    tdit_shape_t shape;
    kern_tensor_t t[CAP_MAX_INPUTS];  /* the SDE (or multistep) key's inputs: every tensor a step reads */
    int n;
    kern_tensor_t mean;               /* an SDE step's mean μ, copied out with the latent */
};

void tdit_staging_destroy(tdit_staging_t **sp) {
    if (!sp || !*sp) return;
    for (int i = 0; i < (*sp)->n; i++) kern_free((*sp)->b, (*sp)->t[i].data);
    kern_free((*sp)->b, (*sp)->mean.data);
    free(*sp);
    *sp = NULL;
}

const tdit_shape_t *tdit_staging_shape(const tdit_staging_t *st) { return &st->shape; }

tdit_staging_t *tdit_staging_new(tdit_model_t *m, const tdit_shape_t *sh) {
    cap_key_t key;
    /* The SDE key's inputs: every tensor an Euler or an SDE step reads; a
     * multistep shape's: its solver's coefficients and history. */
    if (tdit_step_key(m, sh, !tdit_solver_multistep(sh->solver), 0, &key) != 0) return NULL;
    tdit_staging_t *st = calloc(1, sizeof *st);
    if (!st) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    st->b = tdit_model_backend(m);
    st->shape = *sh;
    for (int i = 0; i < key.n_inputs; i++) {
        st->t[i] = kern_tensor_alloc(st->b, key.inputs[i].dtype, key.inputs[i].ndim, key.inputs[i].shape);
        if (!st->t[i].data) { tdit_staging_destroy(&st); return NULL; }
        st->n++;
    }
    st->mean = kern_tensor_alloc(st->b, st->t[IN_LATENT].dtype, st->t[IN_LATENT].ndim, st->t[IN_LATENT].shape);
    if (!st->mean.data) tdit_staging_destroy(&st);
    return st;
}

static int req_upload(kern_stream_t *s, kern_tensor_t *t, const float *src) {
    size_t n = (size_t)kern_tensor_numel(t);
    if (t->dtype == KERN_F32) {
        if (kern_copy_h2d(s, kern_tensor_ptr(t), src, n * 4)) return -1;
        return kern_stream_sync(s);
    }
    uint16_t *tmp = malloc(n * 2);
    if (!tmp) return reel_fail(REEL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) tmp[i] = kern_f32_to_bf16(src[i]);
    int rc = kern_copy_h2d(s, kern_tensor_ptr(t), tmp, n * 2);
    if (rc == 0) rc = kern_stream_sync(s);
    free(tmp);
    return rc;
}

static int req_download(kern_stream_t *s, const kern_tensor_t *t, float *dst) {
    size_t n = (size_t)kern_tensor_numel(t);
    if (t->dtype == KERN_F32) {
        if (kern_copy_d2h(s, dst, kern_tensor_ptr(t), n * 4)) return -1;
        return kern_stream_sync(s);
    }
    uint16_t *tmp = malloc(n * 2);
    if (!tmp) return reel_fail(REEL_E_NOMEM, "out of memory");
    int rc = kern_copy_d2h(s, tmp, kern_tensor_ptr(t), n * 2);
    if (rc == 0) rc = kern_stream_sync(s);
    for (size_t i = 0; rc == 0 && i < n; i++) dst[i] = kern_bf16_to_f32(tmp[i]);
    free(tmp);
    return rc;
}

/* ---- a request as a sequence of steps ------------------------------------- */

struct tdit_req {
    tdit_model_t *m;
    tdit_shape_t shape;
    tdit_loop_t loop;
    tdit_staging_t *stg;
    bool own_stg;          /* false: the caller's long-lived buffers */
    double *sig;           /* [steps + 1] the solver's sigmas, then [steps] its timesteps */
    double *ts;
    int done;
    uint64_t key_hash, shard_hash;
    tdit_run_stats_t stats;
    uint64_t *versions;    /* [steps]: the transformer version each step ran on */
    int64_t batch;         /* samples B */
    uint64_t *seeds;       /* [B]: each sample's SDE seed (and initial latent's) */
    unsigned rec;          /* TDIT_REC_* */
    size_t n;              /* latent elements of one sample */
    float *traj;           /* [B][steps+1][n] with TRAJECTORY */
    float *means;          /* [B][steps][n] with MEANS */
    float *logp;           /* [B][steps] with LOG_PROBS */
    float *cur, *mu;       /* [B][n]: one step's x_{i+1} and μ_i, as read back */
    uint64_t uid;          /* unique in the process: what a mixed batch's rows remember */
    bool prewarm;          /* its steps ask the cache to capture at once (tdit_req_set_prewarm) */
};

void tdit_req_set_prewarm(tdit_req_t *r, bool on) { r->prewarm = on; }

static _Atomic uint64_t next_uid = 1;

tdit_req_t *tdit_req_new(tdit_model_t *m, kern_stream_t *s, const tdit_shape_t *sh, const tdit_loop_t *p,
                         const float *latent, const float *context, const float *uncond) {
    return tdit_req_new_in(m, s, NULL, sh, p, latent, context, uncond);
}

tdit_req_t *tdit_req_new_in(tdit_model_t *m, kern_stream_t *s, tdit_staging_t *stg, const tdit_shape_t *sh,
                            const tdit_loop_t *p, const float *latent, const float *context,
                            const float *uncond) {
    return tdit_req_new_group(m, s, stg, sh, p, NULL, latent, context, uncond);
}

tdit_req_t *tdit_req_new_group(tdit_model_t *m, kern_stream_t *s, tdit_staging_t *stg, const tdit_shape_t *sh,
                               const tdit_loop_t *p, const uint64_t *seeds, const float *latent,
                               const float *context, const float *uncond) {
    if (tdit_loop_validate(p) != 0 || tdit_shape_validate(sh) != 0) return NULL;
    if (stg && !tdit_shape_equal(&stg->shape, sh)) {
        reel_fail(REEL_E_INVALID, "staging buffers were made for another shape");
        return NULL;
    }
    if (sh->cfg != (uncond != NULL)) {
        reel_fail(REEL_E_INVALID, sh->cfg ? "CFG needs an unconditional context" : "unconditional context given without CFG");
        return NULL;
    }
    tdit_shape_t want = *sh;
    tdit_loop_shape(p, &want);
    if (sh->solver != want.solver || sh->grid != want.grid) {
        reel_fail(REEL_E_INVALID, "solver %s%s runs in a shape made for %s (grid %s)", p->sde ? "sde on " : "",
                  tdit_solver_name(p->solver), tdit_solver_name(sh->solver), tdit_solver_name(sh->grid));
        return NULL;
    }
    tdit_req_t *r = calloc(1, sizeof *r);
    if (!r) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    r->m = m;
    r->shape = *sh;
    r->loop = *p;
    r->uid = atomic_fetch_add(&next_uid, 1);
    r->sig = malloc(((size_t)p->steps * 2 + 1) * sizeof *r->sig);
    r->ts = r->sig ? r->sig + p->steps + 1 : NULL;
    r->versions = calloc((size_t)p->steps, sizeof *r->versions);
    r->batch = tdit_shape_batch(sh);
    r->seeds = malloc((size_t)r->batch * sizeof *r->seeds);
    r->own_stg = !stg;
    r->stg = stg ? stg : tdit_staging_new(m, sh);
    float *init = NULL;
    if (!r->sig || !r->versions || !r->seeds || !r->stg) {
        if (!r->sig || !r->versions || !r->seeds) reel_fail(REEL_E_NOMEM, "out of memory");
        goto err;
    }
    /* Sample b's seed: seeds[b], or p->seed + b. */
    for (int64_t b = 0; b < r->batch; b++) r->seeds[b] = seeds ? seeds[b] : p->seed + (uint64_t)b;
    size_t n_lat = (size_t)kern_tensor_numel(&r->stg->t[IN_LATENT]);
    r->n = n_lat / (size_t)r->batch;
    if (!latent) {
        if (!(init = malloc(n_lat * sizeof *init))) { reel_fail(REEL_E_NOMEM, "out of memory"); goto err; }
        for (int64_t b = 0; b < r->batch; b++) tdit_initial_latent(r->seeds[b], init + (size_t)b * r->n, r->n);
        latent = init;
    }
    int rc = req_upload(s, &r->stg->t[IN_LATENT], latent) || req_upload(s, &r->stg->t[IN_CONTEXT], context) ||
             (uncond && req_upload(s, &r->stg->t[IN_UNCOND], uncond));
    free(init);
    init = NULL;
    if (rc) goto err;
    if (tdit_solver_multistep(sh->solver)) {
        /* A new request starts with no history: step 0's coefficients read
         * none of it, and zeros keep 0·h exact. */
        kern_tensor_t *h = &r->stg->t[r->stg->n - 1];
        float *zero = calloc((size_t)kern_tensor_numel(h), sizeof *zero);
        if (!zero) { reel_fail(REEL_E_NOMEM, "out of memory"); goto err; }
        rc = req_upload(s, h, zero);
        free(zero);
        if (rc) goto err;
    }
    tdit_solver_schedule(p->solver, p->steps, p->shift, r->sig, r->ts);
    return r;
err:
    free(init);
    tdit_req_destroy(&r);
    return NULL;
}

void tdit_req_destroy(tdit_req_t **rp) {
    if (!rp || !*rp) return;
    if ((*rp)->own_stg) tdit_staging_destroy(&(*rp)->stg);
    free((*rp)->versions);
    free((*rp)->seeds);
    free((*rp)->traj);
    free((*rp)->means);
    free((*rp)->logp);
    free((*rp)->cur);
    free((*rp)->mu);
    free((*rp)->sig);
    free(*rp);
    *rp = NULL;
}

/* The Flow-GRPO log-probability of x1 given mean mu, for step sv
 * (σ_i, σ_{i+1}, σ_1 as the kernel read them) at eta: the mean over the
 * latent of −(x1 − μ)²/(2s²) − log s − log √(2π), s = std·√(−Δ), computed
 * in double as the SDE kernel computes std (its Wan form η·σ_1·σ_i on a
 * solver's grid). */
static float log_prob(const float *x1, const float *mu, size_t n, const float sv[3], float eta, bool grid) {
    double si = sv[0], sn = sv[1], s1 = sv[2];
    double sp = si == 1.0 ? s1 : si;
    double sd = (grid ? (double)eta * s1 * si : (double)eta * sqrt(si / (1.0 - sp))) * sqrt(-(sn - si));
    double acc = 0;
    for (size_t j = 0; j < n; j++) {
        double d = (double)x1[j] - (double)mu[j];
        acc += d * d;
    }
    return (float)(-acc / (2.0 * sd * sd * (double)n) - log(sd) - 0.5 * log(2.0 * M_PI));
}

/* Sample b's block of rows of a [B][rows][n] record. */
static float *rec_at(const tdit_req_t *r, float *base, int rows, int64_t b, int row) {
    return base + ((size_t)b * (size_t)rows + (size_t)row) * r->n;
}

/* After step i: keeps x_{i+1}, μ_i and the log-probability of every sample
 * as asked. */
static int record_step(tdit_req_t *r, kern_stream_t *s, int i, const float sv[3]) {
    int steps = r->loop.steps;
    if (req_download(s, &r->stg->t[IN_LATENT], r->cur) != 0) return -1;
    for (int64_t b = 0; r->traj && b < r->batch; b++)
        memcpy(rec_at(r, r->traj, steps + 1, b, i + 1), r->cur + (size_t)b * r->n, r->n * sizeof *r->cur);
    if (!(r->rec & (TDIT_REC_LOG_PROBS | TDIT_REC_MEANS))) return 0;
    if (req_download(s, &r->stg->mean, r->mu) != 0) return -1;
    for (int64_t b = 0; b < r->batch; b++) {
        const float *x1 = r->cur + (size_t)b * r->n, *mu = r->mu + (size_t)b * r->n;
        if (r->means) memcpy(rec_at(r, r->means, steps, b, i), mu, r->n * sizeof *mu);
        if (r->logp)
            r->logp[(size_t)b * (size_t)steps + (size_t)i] =
                log_prob(x1, mu, r->n, sv, r->loop.eta, r->shape.grid != TDIT_SOLVER_EULER);
    }
    return 0;
}

int tdit_req_record(tdit_req_t *r, kern_stream_t *s, unsigned what) {
    if (r->done) return reel_fail(REEL_E_STATE, "record: the request has already run %d steps", r->done);
    if ((what & (TDIT_REC_LOG_PROBS | TDIT_REC_MEANS)) && !(r->loop.sde && r->loop.eta > 0))
        return reel_fail(REEL_E_INVALID, "log-probabilities and means need an SDE loop with eta > 0");
    size_t steps = (size_t)r->loop.steps, B = (size_t)r->batch, bn = B * r->n;
    if (!what) return 0;
    if (!(r->cur = malloc(bn * sizeof *r->cur))) goto oom;
    if ((what & (TDIT_REC_LOG_PROBS | TDIT_REC_MEANS)) && !(r->mu = malloc(bn * sizeof *r->mu))) goto oom;
    if ((what & TDIT_REC_TRAJECTORY) && !(r->traj = malloc(B * (steps + 1) * r->n * sizeof *r->traj))) goto oom;
    if ((what & TDIT_REC_MEANS) && !(r->means = malloc(B * steps * r->n * sizeof *r->means))) goto oom;
    if ((what & TDIT_REC_LOG_PROBS) && !(r->logp = malloc(B * steps * sizeof *r->logp))) goto oom;
    r->rec = what;
    /* x_0: the latent each sample starts from. */
    if (!r->traj) return 0;
    if (req_download(s, &r->stg->t[IN_LATENT], r->cur) != 0) return -1;
    for (size_t b = 0; b < B; b++)
        memcpy(rec_at(r, r->traj, (int)steps + 1, (int64_t)b, 0), r->cur + b * r->n, r->n * sizeof *r->cur);
    return 0;
oom:
    return reel_fail(REEL_E_NOMEM, "out of memory recording a request's trajectory");
}

const float *tdit_req_trajectory(const tdit_req_t *r) { return r->traj; }
const float *tdit_req_means(const tdit_req_t *r) { return r->means; }
const float *tdit_req_log_probs(const tdit_req_t *r) { return r->logp; }
const double *tdit_req_sigmas(const tdit_req_t *r) { return r->sig; }
double tdit_req_timestep(const tdit_req_t *r, int i) {
    const bool given = tdit_solver_multistep(r->shape.solver) || r->shape.grid != TDIT_SOLVER_EULER;
    return given ? r->ts[i] : (double)1000.0f * (double)(float)r->sig[i]; /* kern_timestep_embed's t */
}
const uint64_t *tdit_req_versions(const tdit_req_t *r) { return r->versions; }
int64_t tdit_req_batch(const tdit_req_t *r) { return r->batch; }
const tdit_shape_t *tdit_req_shape(const tdit_req_t *r) { return &r->shape; }
const tdit_loop_t *tdit_req_loop(const tdit_req_t *r) { return &r->loop; }
const uint64_t *tdit_req_seeds(const tdit_req_t *r) { return r->seeds; }

/* Step i's σ_i, σ_{i+1}, σ_1 as the step reads them, and on a grid its
 * timestep t_i (an integer, exact in F32). */
static void req_sigmas(const tdit_req_t *r, int i, float sv[4]) {
    sv[0] = (float)r->sig[i];
    sv[1] = (float)r->sig[i + 1];
    sv[2] = (float)r->sig[1];
    sv[3] = (float)r->ts[i];
}

/* What follows step i of r, however it ran (alone or in a mixed batch):
 * its version, records, keys and counts. key is r's own step key (its
 * shard hash is what the broker routes r by); ran is the capture key hash
 * of the graph the step ran under: r's own, or its mixed batch's. */
static int req_after(tdit_req_t *r, kern_stream_t *s, const cap_key_t *key, uint64_t ran, uint64_t version,
                     const float sv[3], const cap_result_t *res, double t0) {
    int i = r->done;
    r->versions[i] = version;
    if (r->rec && record_step(r, s, i, sv) != 0) return -1;
    r->key_hash = ran;
    r->shard_hash = cap_key_shard_hash(key);
    r->done++;
    r->stats.steps++;
    r->stats.seconds += now() - t0;
    if (res->ran == CAP_RAN_CAPTURED) r->stats.captured++;
    else if (res->ran == CAP_RAN_REPLAYED) r->stats.replayed++;
    else {
        r->stats.eager++;
        r->stats.declines[res->reason]++;
    }
    return 0;
}

int tdit_req_step(tdit_req_t *r, cap_cache_t *c, kern_stream_t *s, cap_result_t *out) {
    if (r->done >= r->loop.steps) return reel_fail(REEL_E_STATE, "request already finished its %d steps", r->loop.steps);
    int64_t version = cap_component_version(c, TDIT_COMPONENT);
    if (version < 0) return reel_fail(REEL_E_INVALID, "weights are not registered with the capture cache");
    cap_key_t key;
    if (tdit_step_key(r->m, &r->shape, r->loop.sde, (uint64_t)version, &key) != 0) return -1;
    int i = r->done;
    tdit_staging_t *st = r->stg;
    float sv[4];
    req_sigmas(r, i, sv);
    double t0 = now();
    if (kern_copy_h2d(s, kern_tensor_ptr(&st->t[IN_SIGMAS]), sv, (size_t)tdit_sigma_width(&r->shape) * sizeof *sv) ||
        kern_copy_h2d(s, kern_tensor_ptr(&st->t[IN_GUIDANCE]), &r->loop.guidance, sizeof r->loop.guidance) ||
        kern_stream_sync(s))
        return -1;
    if (tdit_solver_multistep(r->shape.solver)) {
        float coef[KERN_MS_COEFS];
        tdit_solver_coefs(r->loop.solver, r->loop.steps, r->sig, r->ts, i, coef);
        if (kern_copy_h2d(s, kern_tensor_ptr(&st->t[st->n - 2]), coef, sizeof coef) || kern_stream_sync(s))
            return -1;
    }
    if (r->loop.sde) {
        /* The noise is keyed by (seed, step, index): the step reads them from
         * device memory, so one captured SDE step serves every seed. */
        float sde[4 * TDIT_MAX_BATCH];
        for (int64_t b = 0; b < r->batch; b++)
            kern_sde_params_pack(sde + 4 * b, r->loop.eta, r->seeds[b], (uint32_t)i);
        if (kern_copy_h2d(s, kern_tensor_ptr(&st->t[st->n - 1]), sde, (size_t)r->batch * 4 * sizeof *sde) ||
            kern_stream_sync(s))
            return -1;
    }
    /* Inputs in key order; an Euler step's stop before the SDE parameters.
     * Outputs: the latent, and an SDE step's mean μ. */
    kern_tensor_t in[CAP_MAX_INPUTS], outs[2] = { st->t[IN_LATENT], st->mean };
    int n_in = 0;
    const cap_program_t *prog;
    if (tdit_solver_multistep(r->shape.solver)) {
        /* Every staging tensor, the history last; it comes back out too. */
        for (int j = 0; j < st->n; j++) in[n_in++] = st->t[j];
        outs[1] = st->t[st->n - 1];
        prog = tdit_program_ms(r->shape.cfg);
    } else {
        for (int j = 0; j < st->n - 1; j++) in[n_in++] = st->t[j];
        if (r->loop.sde) in[n_in++] = st->t[st->n - 1];
        prog = tdit_program(r->shape.cfg, r->loop.sde);
    }
    cap_call_t call = { .key = &key, .inputs = in, .outputs = outs, .prewarm = r->prewarm };
    cap_result_t res;
    if (cap_dispatch(c, s, prog, r->m, &call, &res) != 0) return -1;
    if (req_after(r, s, &key, cap_key_hash(&key), (uint64_t)version, sv, &res, t0) != 0) return -1;
    if (out) *out = res;
    return 0;
}

/* ---- a mixed batch: different requests in one step ------------------------ */

struct tdit_mix {
    tdit_model_t *m;
    kern_backend_t *b;         /* m's: what zero was allocated from */
    tdit_shape_t one;          /* the members' shape */
    tdit_shape_t shape;        /* the batch's: one, B samples, mixed */
    bool sde;
    tdit_staging_t *stg;       /* the batch's inputs, [B,...] */
    size_t lat_bytes, ctx_bytes; /* one sample's latent, one sample's context */
    uint64_t ctx_of[TDIT_MAX_BATCH]; /* the request (uid) whose contexts row b holds; 0: zeros;
                                      * CTX_UNKNOWN: a copy into it failed */
    void *zero;                /* max(lat_bytes, ctx_bytes) zero bytes on the device: padding's source */
    bool prewarm;              /* its steps ask the cache to capture at once (tdit_mix_set_prewarm) */
};

#define CTX_UNKNOWN UINT64_MAX /* never a request's uid (they count from 1) */

void tdit_mix_set_prewarm(tdit_mix_t *x, bool on) { x->prewarm = on; }

bool tdit_req_mixable(const tdit_req_t *r) {
    return r->batch == 1 && !tdit_solver_multistep(r->shape.solver) && r->done < r->loop.steps;
}

bool tdit_req_same_class(const tdit_req_t *a, const tdit_req_t *b) {
    return a->m == b->m && a->loop.sde == b->loop.sde && tdit_shape_equal(&a->shape, &b->shape);
}

bool tdit_mix_fits(const tdit_mix_t *x, const tdit_req_t *r) {
    return tdit_req_mixable(r) && r->m == x->m && r->loop.sde == x->sde && tdit_shape_equal(&r->shape, &x->one);
}

int64_t tdit_mix_capacity(const tdit_mix_t *x) { return x->shape.batch; }

tdit_mix_t *tdit_mix_new(tdit_model_t *m, kern_stream_t *s, const tdit_shape_t *one, bool sde, int64_t B) {
    if (tdit_shape_validate(one) != 0) return NULL;
    if (tdit_shape_batch(one) != 1 || one->mixed || tdit_solver_multistep(one->solver)) {
        reel_fail(REEL_E_INVALID, "a mixed batch is made of single Euler or SDE requests");
        return NULL;
    }
    if (B < 2 || B > TDIT_MAX_BATCH) {
        reel_fail(REEL_E_INVALID, "a mixed batch holds 2..%d requests, not %lld", TDIT_MAX_BATCH, (long long)B);
        return NULL;
    }
    tdit_mix_t *x = calloc(1, sizeof *x);
    if (!x) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    x->m = m;
    x->one = *one;
    x->shape = *one;
    x->shape.batch = B;
    x->shape.mixed = true;
    x->sde = sde;
    if (!(x->stg = tdit_staging_new(m, &x->shape))) goto err;
    const kern_tensor_t *lat = &x->stg->t[IN_LATENT], *ctx = &x->stg->t[IN_CONTEXT];
    x->lat_bytes = kern_tensor_bytes(lat) / (size_t)B;
    x->ctx_bytes = kern_tensor_bytes(ctx) / (size_t)B;
    /* Rows no request holds run too (a padded batch): zeros, never garbage
     * -- and never what a request that left the row put there (its latent,
     * stepped on since, maybe not finite; its contexts): tdit_mix_step
     * zeroes a padded row from x->zero before each step. */
    size_t most = kern_tensor_bytes(lat) > kern_tensor_bytes(ctx) ? kern_tensor_bytes(lat) : kern_tensor_bytes(ctx);
    void *zero = calloc(1, most);
    if (!zero) { reel_fail(REEL_E_NOMEM, "out of memory"); goto err; }
    size_t row = x->lat_bytes > x->ctx_bytes ? x->lat_bytes : x->ctx_bytes;
    x->b = tdit_model_backend(m);
    int rc = (x->zero = kern_alloc(x->b, row)) ? kern_copy_h2d(s, x->zero, zero, row) : -1;
    for (int i = 0; rc == 0 && i < x->stg->n; i++)
        if (i == IN_LATENT || i == IN_CONTEXT || (i == IN_UNCOND && one->cfg))
            rc = kern_copy_h2d(s, kern_tensor_ptr(&x->stg->t[i]), zero, kern_tensor_bytes(&x->stg->t[i]));
    if (rc == 0) rc = kern_stream_sync(s);
    free(zero);
    if (rc != 0) goto err;
    return x;
err:
    tdit_mix_destroy(&x);
    return NULL;
}

void tdit_mix_destroy(tdit_mix_t **xp) {
    if (!xp || !*xp) return;
    if ((*xp)->zero) kern_free((*xp)->b, (*xp)->zero);
    tdit_staging_destroy(&(*xp)->stg);
    free(*xp);
    *xp = NULL;
}

/* dst = src, n bytes, on s (device to device). */
static int d2d(kern_stream_t *s, void *dst, const void *src, size_t n) { return kern_copy_d2d(s, dst, src, n); }

int tdit_mix_step(tdit_mix_t *x, tdit_req_t *const *reqs, int n, cap_cache_t *c, kern_stream_t *s,
                  cap_result_t *out, bool *advanced) {
    *advanced = false;
    const int64_t B = x->shape.batch;
    if (n < 1 || n > B) return reel_fail(REEL_E_INVALID, "mixed step: %d requests in a batch of %lld", n, (long long)B);
    for (int b = 0; b < n; b++) {
        if (!tdit_mix_fits(x, reqs[b]))
            return reel_fail(REEL_E_INVALID, "mixed step: request %d is not of this batch's kind (shape, loop, or done)", b);
        for (int o = 0; o < b; o++)
            if (reqs[o] == reqs[b]) return reel_fail(REEL_E_INVALID, "mixed step: request %d is in the batch twice", b);
    }
    int64_t version = cap_component_version(c, TDIT_COMPONENT);
    if (version < 0) return reel_fail(REEL_E_INVALID, "weights are not registered with the capture cache");
    cap_key_t key;
    if (tdit_step_key(x->m, &x->shape, x->sde, (uint64_t)version, &key) != 0) return -1;
    tdit_staging_t *st = x->stg;
    float sig[4 * TDIT_MAX_BATCH], row[4], gd[TDIT_MAX_BATCH], sde[4 * TDIT_MAX_BATCH];
    const int sw = tdit_sigma_width(&x->one);
    double t0 = now();
    for (int64_t b = 0; b < B; b++) {
        /* a padded row repeats row 0's scalars: finite, and thrown away */
        const tdit_req_t *r = reqs[b < n ? b : 0];
        req_sigmas(r, r->done, row);
        memcpy(sig + sw * b, row, (size_t)sw * sizeof *row);
        gd[b] = r->loop.guidance;
        kern_sde_params_pack(sde + 4 * b, r->loop.eta, r->seeds[0], (uint32_t)r->done);
    }
    char *lat = kern_tensor_ptr(&st->t[IN_LATENT]), *ctx = kern_tensor_ptr(&st->t[IN_CONTEXT]);
    char *unc = x->one.cfg ? kern_tensor_ptr(&st->t[IN_UNCOND]) : NULL;
    for (int b = 0; b < n; b++) {
        tdit_staging_t *rs = reqs[b]->stg;
        if (d2d(s, lat + (size_t)b * x->lat_bytes, kern_tensor_ptr(&rs->t[IN_LATENT]), x->lat_bytes)) return -1;
        if (x->ctx_of[b] == reqs[b]->uid) continue; /* its contexts are there from its last step */
        x->ctx_of[b] = CTX_UNKNOWN;
        if (d2d(s, ctx + (size_t)b * x->ctx_bytes, kern_tensor_ptr(&rs->t[IN_CONTEXT]), x->ctx_bytes) ||
            (unc && d2d(s, unc + (size_t)b * x->ctx_bytes, kern_tensor_ptr(&rs->t[IN_UNCOND]), x->ctx_bytes)))
            return -1;
        x->ctx_of[b] = reqs[b]->uid;
    }
    /* Padding computes from zeros: the last step wrote its own result into
     * a padded row's latent, and a row a request left still holds that
     * request's contexts. Every op keeps a sample's rows to themselves
     * (bitwise: tests/row_groups_check.h), so no real row's bits depend on
     * it; zeros keep what padding computes the same whoever came before. */
    for (int64_t b = n; b < B; b++) {
        if (d2d(s, lat + (size_t)b * x->lat_bytes, x->zero, x->lat_bytes)) return -1;
        if (x->ctx_of[b] == 0) continue;
        x->ctx_of[b] = CTX_UNKNOWN;
        if (d2d(s, ctx + (size_t)b * x->ctx_bytes, x->zero, x->ctx_bytes) ||
            (unc && d2d(s, unc + (size_t)b * x->ctx_bytes, x->zero, x->ctx_bytes)))
            return -1;
        x->ctx_of[b] = 0;
    }
    if (kern_copy_h2d(s, kern_tensor_ptr(&st->t[IN_SIGMAS]), sig, (size_t)B * (size_t)sw * sizeof *sig) ||
        kern_copy_h2d(s, kern_tensor_ptr(&st->t[IN_GUIDANCE]), gd, (size_t)B * sizeof *gd) ||
        (x->sde && kern_copy_h2d(s, kern_tensor_ptr(&st->t[st->n - 1]), sde, (size_t)B * 4 * sizeof *sde)) ||
        kern_stream_sync(s))
        return -1;
    kern_tensor_t in[CAP_MAX_INPUTS], outs[2] = { st->t[IN_LATENT], st->mean };
    int n_in = 0;
    for (int j = 0; j < st->n - 1; j++) in[n_in++] = st->t[j];
    if (x->sde) in[n_in++] = st->t[st->n - 1];
    cap_call_t call = { .key = &key, .inputs = in, .outputs = outs, .prewarm = x->prewarm };
    cap_result_t res;
    if (cap_dispatch(c, s, tdit_program(x->one.cfg, x->sde), x->m, &call, &res) != 0) return -1;
    /* From here on the requests have moved: a failure fails them all. */
    *advanced = true;
    const char *mean = kern_tensor_ptr(&st->mean);
    for (int b = 0; b < n; b++) {
        tdit_staging_t *rs = reqs[b]->stg;
        if (d2d(s, kern_tensor_ptr(&rs->t[IN_LATENT]), lat + (size_t)b * x->lat_bytes, x->lat_bytes) ||
            (x->sde && d2d(s, kern_tensor_ptr(&rs->mean), mean + (size_t)b * x->lat_bytes, x->lat_bytes)))
            return -1;
    }
    if (kern_stream_sync(s)) return -1;
    for (int b = 0; b < n; b++) {
        tdit_req_t *r = reqs[b];
        cap_key_t own;
        if (tdit_step_key(r->m, &r->shape, r->loop.sde, (uint64_t)version, &own) != 0 ||
            req_after(r, s, &own, cap_key_hash(&key), (uint64_t)version, sig + sw * b, &res, t0) != 0)
            return -1;
        r->stats.batched++;
        r->stats.batch_rows += n;
        r->stats.padded_rows += (int)(x->shape.batch - n);
    }
    if (out) *out = res;
    return 0;
}

int tdit_mix_read(tdit_mix_t *x, kern_stream_t *s, float *out, size_t n) {
    const kern_tensor_t *t = &x->stg->t[IN_LATENT];
    if ((int64_t)n != kern_tensor_numel(t))
        return reel_fail(REEL_E_INVALID, "mix read: buffer of %zu values, the batch's latent has %lld", n,
                         (long long)kern_tensor_numel(t));
    return req_download(s, t, out);
}

int tdit_req_steps_done(const tdit_req_t *r) { return r->done; }
int tdit_req_steps(const tdit_req_t *r) { return r->loop.steps; }
bool tdit_req_done(const tdit_req_t *r) { return r->done >= r->loop.steps; }
uint64_t tdit_req_key_hash(const tdit_req_t *r) { return r->key_hash; }
uint64_t tdit_req_shard_hash(const tdit_req_t *r) { return r->shard_hash; }
const tdit_run_stats_t *tdit_req_stats(const tdit_req_t *r) { return &r->stats; }

int tdit_req_read(tdit_req_t *r, kern_stream_t *s, float *out, size_t n) {
    const kern_tensor_t *t = &r->stg->t[IN_LATENT];
    if ((int64_t)n != kern_tensor_numel(t))
        return reel_fail(REEL_E_INVALID, "read: buffer of %zu values, latent has %lld", n, (long long)kern_tensor_numel(t));
    if (req_download(s, t, out) != 0) return -1;
    return tdit_result_finite(out, n, r->done);
}

int tdit_generate_cached(tdit_model_t *m, cap_cache_t *c, kern_stream_t *s, tdit_staging_t *stg,
                         const tdit_shape_t *sh, const tdit_loop_t *p, const float *latent,
                         const float *context, const float *uncond, float *out,
                         tdit_run_stats_t *stats) {
    return tdit_generate_cached_progress(m, c, s, stg, sh, p, latent, context, uncond, out, stats, NULL, NULL);
}

int tdit_generate_cached_progress(tdit_model_t *m, cap_cache_t *c, kern_stream_t *s, tdit_staging_t *stg,
                                  const tdit_shape_t *sh, const tdit_loop_t *p, const float *latent,
                                  const float *context, const float *uncond, float *out,
                                  tdit_run_stats_t *stats, void (*progress)(void *user, int done, int steps),
                                  void *user) {
    tdit_req_t *r = tdit_req_new_in(m, s, stg, sh, p, latent, context, uncond);
    if (!r) return -1;
    int rc = 0;
    while (rc == 0 && !tdit_req_done(r)) {
        rc = tdit_req_step(r, c, s, NULL);
        if (rc == 0 && progress) progress(user, tdit_req_steps_done(r), p->steps);
    }
    size_t n = (size_t)kern_tensor_numel(&r->stg->t[IN_LATENT]);
    if (rc == 0) rc = tdit_req_read(r, s, out, n);
    if (stats) {
        const tdit_run_stats_t *a = &r->stats;
        stats->steps += a->steps;
        stats->captured += a->captured;
        stats->replayed += a->replayed;
        stats->eager += a->eager;
        stats->seconds += a->seconds;
        for (int i = 0; i < CAP_DECLINE_COUNT; i++) stats->declines[i] += a->declines[i];
    }
    tdit_req_destroy(&r);
    return rc;
}
