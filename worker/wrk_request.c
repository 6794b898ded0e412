/* wrk_request.c -- REQUEST checking and copying (see wrk_request.h). The
 * messages are the client's: they name the field and say what was expected
 * and what came, because the client cannot see the worker's log. */
#include "worker/wrk_request.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <assert.h>
#include <string.h>
#include <time.h>
#include "base/error.h"
#include "model/t2v.h"

static int bad(wire_err_t *err, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(wire_err_t *err, const char *code, const char *fmt, ...) {
    snprintf(err->code, sizeof err->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

void wrk_model_info(const tdit_config_t *cfg, msg_model_t *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", cfg->name);
    out->in_channels = (uint64_t)cfg->in_channels;
    out->text_dim = (uint64_t)cfg->text_dim;
    out->patch = WRK_PATCH;
    out->layers = (uint64_t)cfg->layers;
    out->text_len = (uint64_t)cfg->text_len;
}

/* A host copy of a context padded with zero rows to text_len rows, as
 * Wan's DiT pads every prompt before its text embedding (the padded rows
 * are attended to: they change the output). NULL with err set. */
static float *pad_context(const float *x, int64_t rows, int64_t text_len, int64_t width, wire_err_t *err) {
    if (rows < 1 || rows > text_len) { /* msg_gen_validate refused it already: never trust a size twice removed */
        bad(err, WIRE_E_BAD_REQUEST, "a context of %" PRId64 " rows does not fit text_len %" PRId64, rows, text_len);
        return NULL;
    }
    float *p = calloc((size_t)(text_len * width), sizeof *p);
    if (!p) { bad(err, WIRE_E_INTERNAL, "out of memory padding a context"); return NULL; }
    memcpy(p, x, (size_t)(rows * width) * sizeof *p);
    return p;
}

/* A host copy of an F32 tensor's frame (frames carry no alignment promise). */
static float *copy_f32(const wire_tensor_t *t, wire_err_t *err) {
    if (!kern_all_finite(t->data, t->bytes / sizeof(float), KERN_F32)) {
        bad(err, WIRE_E_BAD_REQUEST, "tensor '%s' holds NaN or infinite values", t->name);
        return NULL;
    }
    float *x = malloc(t->bytes ? t->bytes : 1);
    if (!x) { bad(err, WIRE_E_INTERNAL, "out of memory copying tensor '%s'", t->name); return NULL; }
    memcpy(x, t->data, t->bytes);
    return x;
}

void wrk_hold_release(wrk_hold_t **h) {
    if (!h || !*h) return;
    if (atomic_fetch_sub(&(*h)->refs, 1) == 1) free(*h);
    *h = NULL;
}

void wrk_job_free(wrk_job_t **jp) {
    if (!jp || !*jp) return;
    wrk_job_t *j = *jp;
    wrk_hold_release(&j->hold);
    tdit_req_destroy(&j->req);
    free(j->g_out);
    free(j->g_traj);
    free(j->g_means);
    free(j->g_logp);
    free(j->g_vers);
    free(j->latent);
    free(j->context);
    free(j->uncond);
    free(j->prompt);
    free(j->neg_prompt);
    free(j);
    *jp = NULL;
}

int64_t wrk_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int wrk_request_fits(const msg_gen_t *r, const tdit_config_t *cfg, int64_t max_tokens, wire_err_t *err) {
    msg_model_t model;
    wrk_model_info(cfg, &model);
    /* The protocol's and the model's rules answer first: a latent of the
     * wrong channels is wrong on every worker, while --max-tokens is this
     * one's bound (and validated, the shape is in range: no overflow). */
    if (msg_gen_validate(r, &model, err) != 0) return -1;
    int64_t p = model.patch ? (int64_t)model.patch : 1;
    const int64_t *ls = r->latent_shape;
    int64_t tokens = ls[1] * (ls[2] / p) * (ls[3] / p); /* at most 2^48 */
    if (max_tokens > 0 && tokens > max_tokens)
        return bad(err, WIRE_E_TOO_LARGE, "a sample of %" PRId64 " tokens (F x H/%" PRId64 " x W/%" PRId64
                   "), more than this worker's --max-tokens %" PRId64, tokens, p, p, max_tokens);
    return 0;
}

int wrk_prewarm_from_key(const msg_prewarm_key_t *k, const tdit_config_t *cfg, int64_t max_tokens,
                         wrk_prewarm_t *out, wire_err_t *err) {
    msg_model_t model;
    wrk_model_info(cfg, &model);
    const int64_t *ls = k->latent_shape;
    if (strcmp(k->model, model.name)) return bad(err, WIRE_E_BAD_REQUEST, "model %s is not this worker's (%s)", k->model, model.name);
    if (ls[0] != (int64_t)model.in_channels)
        return bad(err, WIRE_E_BAD_REQUEST, "a latent of %" PRId64 " channels; model %s takes %" PRIu64, ls[0],
                   model.name, model.in_channels);
    if (k->text_dim != model.text_dim)
        return bad(err, WIRE_E_BAD_REQUEST, "contexts %" PRIu64 " wide; model %s takes %" PRIu64, k->text_dim,
                   model.name, model.text_dim);
    if (model.text_len > 0 && k->text_len != model.text_len)
        return bad(err, WIRE_E_BAD_REQUEST, "contexts of %" PRIu64 " rows; model %s pads them to %" PRIu64,
                   k->text_len, model.name, model.text_len);
    int64_t p = model.patch ? (int64_t)model.patch : 1;
    for (int d = 1; d < 4; d++)
        if (ls[d] <= 0 || ls[d] > MSG_MAX_DIM) return bad(err, WIRE_E_BAD_REQUEST, "latent_shape is not a shape");
    int64_t tokens = ls[1] * (ls[2] / p) * (ls[3] / p);
    if (max_tokens > 0 && tokens > max_tokens)
        return bad(err, WIRE_E_TOO_LARGE, "a sample of %" PRId64 " tokens, more than --max-tokens %" PRId64, tokens,
                   max_tokens);
    tdit_solver_t solver;
    if (tdit_solver_parse(k->solver[0] ? k->solver : "euler", &solver) != 0)
        return bad(err, WIRE_E_BAD_REQUEST, "%s", reel_err_text());
    memset(out, 0, sizeof *out);
    out->shape = (tdit_shape_t){ ls[1], ls[2], ls[3], (int64_t)k->text_len, k->cfg, k->n > 1 ? (int64_t)k->n : 1,
                                 solver, false, TDIT_SOLVER_EULER };
    if (tdit_shape_validate(&out->shape) != 0) return bad(err, WIRE_E_BAD_REQUEST, "%s", reel_err_text());
    /* The key does not depend on the schedule: any valid loop of its kind. */
    out->loop = (tdit_loop_t){ 2, 1.0, 1.0f, k->sde, 0.7f, 0, solver };
    if (tdit_loop_validate(&out->loop) != 0) return bad(err, WIRE_E_BAD_REQUEST, "%s", reel_err_text());
    tdit_loop_shape(&out->loop, &out->shape);
    out->shard = k->key_hash;
    return 0;
}

/* The job's prompt and, when guided, its negative prompt (the GEN's, or
 * Wan's default), copied. */
static int job_prompts(wrk_job_t *j, const msg_gen_t *r, wire_err_t *err) {
    const char *neg = r->negative_prompt && *r->negative_prompt ? r->negative_prompt : T2V_WAN_NEG_PROMPT;
    if (!(j->prompt = strdup(r->prompt)) || (msg_gen_guided(r) && !(j->neg_prompt = strdup(neg))))
        return bad(err, WIRE_E_INTERNAL, "out of memory copying the prompt");
    return 0;
}

/* What a context of `sent` bytes is once the step can read it: text_len
 * rows when the config pads to them (pad_context; msg_gen_validate
 * refused longer ones), else as sent. */
static size_t context_kept(size_t sent, const tdit_config_t *cfg) {
    return cfg->text_len > 0 ? (size_t)cfg->text_len * (size_t)cfg->text_dim * sizeof(float) : sent;
}

size_t wrk_request_bytes(const msg_gen_t *r, const tdit_config_t *cfg) {
    size_t n = r->latent ? r->latent->bytes : 0;
    if (r->prompt && *r->prompt) { /* (as job_prompts and wrk_job_from_request copy them) */
        const char *neg = r->negative_prompt && *r->negative_prompt ? r->negative_prompt : T2V_WAN_NEG_PROMPT;
        n += strlen(r->prompt) + 1 + (msg_gen_guided(r) ? strlen(neg) + 1 : 0);
        return n + (r->uncond ? r->uncond->bytes : 0); /* copied as sent, never padded */
    }
    n += r->context ? context_kept(r->context->bytes, cfg) : 0;
    return n + (r->uncond ? context_kept(r->uncond->bytes, cfg) : 0);
}

size_t wrk_request_bytes_most(const tdit_config_t *cfg) {
    size_t pad = context_kept(0, cfg);
    size_t neg = strlen(T2V_WAN_NEG_PROMPT) + 1;
    return (size_t)MSG_MAX_GEN_BYTES + 2 * pad + MSG_MAX_PROMPT_BYTES + 1 +
           (neg > MSG_MAX_PROMPT_BYTES + 1 ? neg : MSG_MAX_PROMPT_BYTES + 1);
}

int wrk_job_from_request(const msg_gen_t *r, uint64_t id, const tdit_config_t *cfg, uint64_t applied,
                         wrk_job_t **out, wire_err_t *err) {
    *out = NULL;
    msg_model_t model;
    wrk_model_info(cfg, &model);
    if (msg_gen_validate(r, &model, err) != 0) return -1;
    if (r->version > applied)
        return bad(err, WIRE_E_BAD_REQUEST, "worker at v%" PRIu64 ", request needs v%" PRIu64, applied, r->version);
    const int64_t *ls = r->latent_shape;
    /* The model's own checks stay the backstop of what the protocol allows. */
    tdit_solver_t solver;
    if (tdit_solver_parse(msg_gen_solver(r), &solver) != 0) return bad(err, WIRE_E_BAD_REQUEST, "%s", reel_err_text());
    /* With the config's text_len, every context is padded to it (msg_gen_validate
     * refused longer ones): one shape, one key, for every prompt length. */
    bool prompt = r->prompt && *r->prompt; /* msg_gen_validate: then text_len > 0 */
    int64_t L = cfg->text_len > 0 ? cfg->text_len : r->context->shape[0];
    tdit_shape_t shape = { ls[1], ls[2], ls[3], L, msg_gen_guided(r), 1, solver, false, TDIT_SOLVER_EULER };
    if (tdit_shape_validate(&shape) != 0) return bad(err, WIRE_E_BAD_REQUEST, "%s", reel_err_text());
    tdit_loop_t loop = { (int)r->steps, r->shift, (float)r->cfg, r->sde, (float)r->eta, r->seed, solver };
    if (tdit_loop_validate(&loop) != 0) return bad(err, WIRE_E_BAD_REQUEST, "%s", reel_err_text());
    tdit_loop_shape(&loop, &shape); /* sde with a solver: SDE steps on its grid */

    wrk_job_t *j = calloc(1, sizeof *j);
    if (!j) return bad(err, WIRE_E_INTERNAL, "out of memory");
    j->id = id;
    j->version = r->version;
    /* REQUEST deadline_ms: what the broker still waits (it answers the client timeout after) */
    j->deadline_at = r->deadline_ms ? wrk_mono_ms() + (int64_t)(r->deadline_ms < INT32_MAX ? r->deadline_ms : INT32_MAX) : 0;
    j->progress = r->progress;
    j->rec = (r->return_trajectory ? TDIT_REC_TRAJECTORY : 0u) | (r->return_log_probs ? TDIT_REC_LOG_PROBS : 0u) |
             (r->return_means ? TDIT_REC_MEANS : 0u);
    j->want_timesteps = r->return_timesteps;
    j->shape = shape;
    j->loop = loop;
    j->n = (int)msg_gen_n(r);
    for (int i = 0; i < j->n; i++) j->seeds[i] = r->n_seeds ? r->seeds[i] : r->seed + (uint64_t)i;
    memcpy(j->latent_shape, ls, sizeof j->latent_shape);
    j->n_latent = (size_t)(ls[0] * ls[1] * ls[2] * ls[3]);
    snprintf(j->output, sizeof j->output, "%s", msg_gen_output(r));
    if (prompt && job_prompts(j, r, err) != 0) {
        wrk_job_free(&j);
        return -1;
    }
    if ((!prompt && !(j->context = copy_f32(r->context, err))) || (r->uncond && !(j->uncond = copy_f32(r->uncond, err))) ||
        (r->latent && !(j->latent = copy_f32(r->latent, err)))) {
        wrk_job_free(&j);
        return -1;
    }
    const wire_tensor_t *in[3] = { r->latent, prompt ? NULL : r->context, r->uncond };
    for (int i = 0; i < 3; i++) {
        const float *x = i == 0 ? j->latent : i == 1 ? j->context : j->uncond;
        for (size_t k = 0; in[i] && x && k < in[i]->bytes / sizeof(float); k++)
            if (fabsf(x[k]) > j->input_abs[i]) j->input_abs[i] = fabsf(x[k]);
    }
    if (prompt) {
        *out = j;
        return 0;
    }
    /* Each of them padded on its own: the negative prompt has its own
     * length, shorter or longer than the prompt's (both at most text_len:
     * msg_gen_validate). Every buffer the step reads is text_len rows. */
    float **bufs[2] = { &j->context, &j->uncond };
    const wire_tensor_t *ts[2] = { r->context, r->uncond };
    for (int u = 0; u < 2 && cfg->text_len > 0; u++) {
        if (!ts[u] || ts[u]->shape[0] == cfg->text_len) continue;
        float *p = pad_context(*bufs[u], ts[u]->shape[0], cfg->text_len, cfg->text_dim, err);
        if (!p) { wrk_job_free(&j); return -1; }
        free(*bufs[u]);
        *bufs[u] = p;
    }
    *out = j;
    return 0;
}

int wrk_prewarm_take(wrk_prewarm_t *pw, int at, int i) {
    assert(at <= i);
    wrk_prewarm_t t = pw[i];
    memmove(&pw[at + 1], &pw[at], (size_t)(i - at) * sizeof *pw);
    pw[at] = t;
    return at + 1;
}
