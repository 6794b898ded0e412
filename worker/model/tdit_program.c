/* tdit_program.c -- the tinydit step as a capture_cache program (see
 * tdit_program.h). */
#include "tdit_program.h"
#include "kernels/error.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IN_LATENT, IN_SIGMAS, IN_GUIDANCE, IN_CONTEXT, IN_UNCOND };

static void *ws_new(void *user, const cap_key_t *key, kern_stream_t *s) {
    tdit_model_t *m = user;
    if (key->n_inputs < 4 || key->inputs[IN_LATENT].ndim != 4 || key->inputs[IN_CONTEXT].ndim != 2) {
        kern_fail("tinydit program: key has no latent/context signature");
        return NULL;
    }
    tdit_shape_t sh = { key->inputs[IN_LATENT].shape[1], key->inputs[IN_LATENT].shape[2],
                        key->inputs[IN_LATENT].shape[3], key->inputs[IN_CONTEXT].shape[0],
                        key->n_inputs == 5 };
    return tdit_ws_new(m, s, &sh);
}

static void ws_free(void *user, void *ws) {
    (void)user;
    tdit_ws_t *w = ws;
    tdit_ws_destroy(&w);
}

static size_t ws_bytes(void *user, const void *ws) {
    (void)user;
    return tdit_ws_bytes(ws);
}

static kern_tensor_t *input(void *user, void *ws, int i) {
    (void)user;
    switch (i) {
    case IN_LATENT: return tdit_ws_latent(ws);
    case IN_SIGMAS: return tdit_ws_sigmas(ws);
    case IN_GUIDANCE: return tdit_ws_guidance(ws);
    case IN_CONTEXT: return tdit_ws_context(ws);
    default: return tdit_ws_uncond(ws);
    }
}

static kern_tensor_t *output(void *user, void *ws, int i) {
    (void)user;
    (void)i;
    return tdit_ws_latent(ws);
}

/* consts: none for an Euler step; {eta, seed, step} for an SDE step. */
static int launch(void *user, void *ws, const cap_const_t *k, int n, kern_stream_t *s) {
    if (n == 3)
        return tdit_step_sde(user, ws, s, (float)k[0].v.f, (uint64_t)k[1].v.i, (uint32_t)k[2].v.i);
    return tdit_step(user, ws, s);
}

static const cap_program_t prog_cfg = {
    .name = "tinydit-step-cfg", .n_inputs = 5, .n_outputs = 1,
    .pinnable = { false, false, false, true, true },
    .ws_new = ws_new, .ws_free = ws_free, .ws_bytes = ws_bytes,
    .input = input, .output = output, .launch = launch,
    .n_components = 1, .components = { TDIT_COMPONENT },
};

static const cap_program_t prog_plain = {
    .name = "tinydit-step", .n_inputs = 4, .n_outputs = 1,
    .pinnable = { false, false, false, true },
    .ws_new = ws_new, .ws_free = ws_free, .ws_bytes = ws_bytes,
    .input = input, .output = output, .launch = launch,
    .n_components = 1, .components = { TDIT_COMPONENT },
};

const cap_program_t *tdit_program(bool cfg) { return cfg ? &prog_cfg : &prog_plain; }

int tdit_step_key(const tdit_model_t *m, const tdit_shape_t *sh, bool sde, uint64_t version,
                  cap_key_t *k) {
    const tdit_config_t *c = tdit_model_config(m);
    kern_backend_t *b = tdit_model_backend(m);
    char model[CAP_NAME_MAX];
    if ((size_t)snprintf(model, sizeof model, "tinydit:%s", c->name) >= sizeof model)
        return kern_fail("model name %s too long for a capture key", c->name);
    const int64_t lat[4] = { c->in_channels, sh->frames, sh->height, sh->width };
    const int64_t ctx[2] = { sh->text_len, c->text_dim };
    return cap_key_denoise(k, kern_backend_device_name(b), kern_backend_arch(b), model,
                           sde ? "sde" : "euler", tdit_model_dtype(m), lat, ctx, sh->cfg,
                           TDIT_COMPONENT, version);
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
    kern_tensor_t t[5];
    int n;
};

void tdit_staging_destroy(tdit_staging_t **sp) {
    if (!sp || !*sp) return;
    for (int i = 0; i < (*sp)->n; i++) kern_free((*sp)->b, (*sp)->t[i].data);
    free(*sp);
    *sp = NULL;
}

tdit_staging_t *tdit_staging_new(tdit_model_t *m, const tdit_shape_t *sh) {
    cap_key_t key;
    if (tdit_step_key(m, sh, false, 0, &key) != 0) return NULL;
    tdit_staging_t *st = calloc(1, sizeof *st);
    if (!st) { kern_fail("out of memory"); return NULL; }
    st->b = tdit_model_backend(m);
    st->shape = *sh;
    for (int i = 0; i < key.n_inputs; i++) {
        st->t[i] = kern_tensor_alloc(st->b, key.inputs[i].dtype, key.inputs[i].ndim, key.inputs[i].shape);
        if (!st->t[i].data) { tdit_staging_destroy(&st); return NULL; }
        st->n++;
    }
    return st;
}

static int req_upload(kern_stream_t *s, kern_tensor_t *t, const float *src) {
    size_t n = (size_t)kern_tensor_numel(t);
    if (t->dtype == KERN_F32) {
        if (kern_copy_h2d(s, kern_tensor_ptr(t), src, n * 4)) return -1;
        return kern_stream_sync(s);
    }
    uint16_t *tmp = malloc(n * 2);
    if (!tmp) return kern_fail("out of memory");
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
    if (!tmp) return kern_fail("out of memory");
    int rc = kern_copy_d2h(s, tmp, kern_tensor_ptr(t), n * 2);
    if (rc == 0) rc = kern_stream_sync(s);
    for (size_t i = 0; rc == 0 && i < n; i++) dst[i] = kern_bf16_to_f32(tmp[i]);
    free(tmp);
    return rc;
}

int tdit_generate_cached(tdit_model_t *m, cap_cache_t *c, kern_stream_t *s, tdit_staging_t *stg,
                         const tdit_shape_t *sh, const tdit_loop_t *p, const float *latent,
                         const float *context, const float *uncond, float *out,
                         tdit_run_stats_t *stats) {
    if (tdit_loop_validate(p) != 0) return -1;
    if (sh->cfg != (uncond != NULL))
        return kern_fail(sh->cfg ? "CFG needs an unconditional context"
                                 : "unconditional context given without CFG");
    int64_t version = cap_component_version(c, TDIT_COMPONENT);
    if (version < 0) return kern_fail("weights are not registered with the capture cache");
    cap_key_t key;
    if (tdit_step_key(m, sh, p->sde, (uint64_t)version, &key) != 0) return -1;
    const cap_program_t *prog = tdit_program(sh->cfg);
    tdit_staging_t *own = NULL;
    if (stg && memcmp(&stg->shape, sh, sizeof *sh) != 0)
        return kern_fail("staging buffers were made for another shape");
    if (!stg && !(stg = own = tdit_staging_new(m, sh))) return -1;
    tdit_staging_t r = *stg;
    double *sig = malloc(((size_t)p->steps + 1) * sizeof *sig);
    float *init = NULL;
    int rc = -1;
    if (!sig) { kern_fail("out of memory"); goto out; }
    size_t n_lat = (size_t)kern_tensor_numel(&r.t[IN_LATENT]);
    if (!latent) {
        if (!(init = malloc(n_lat * sizeof *init))) { kern_fail("out of memory"); goto out; }
        tdit_initial_latent(p->seed, init, n_lat);
        latent = init;
    }
    if (req_upload(s, &r.t[IN_LATENT], latent) || req_upload(s, &r.t[IN_CONTEXT], context) ||
        (uncond && req_upload(s, &r.t[IN_UNCOND], uncond)))
        goto out;
    tdit_schedule(p->steps, p->shift, sig);
    double t0 = now();
    for (int i = 0; i < p->steps; i++) {
        const float sv[3] = { (float)sig[i], (float)sig[i + 1], (float)sig[1] };
        if (kern_copy_h2d(s, kern_tensor_ptr(&r.t[IN_SIGMAS]), sv, sizeof sv) ||
            kern_copy_h2d(s, kern_tensor_ptr(&r.t[IN_GUIDANCE]), &p->guidance, sizeof p->guidance) ||
            kern_stream_sync(s))
            goto out;
        cap_const_t k[3];
        memset(k, 0, sizeof k);
        snprintf(k[0].name, sizeof k[0].name, "eta");
        k[0].type = CAP_CONST_F64;
        k[0].v.f = p->eta;
        snprintf(k[1].name, sizeof k[1].name, "seed");
        k[1].type = CAP_CONST_I64;
        k[1].v.i = (int64_t)p->seed;
        snprintf(k[2].name, sizeof k[2].name, "step");
        k[2].type = CAP_CONST_I64;
        k[2].v.i = i;
        cap_call_t call = { .key = &key, .inputs = r.t, .outputs = &r.t[IN_LATENT],
                            .consts = p->sde ? k : NULL, .n_consts = p->sde ? 3 : 0,
                            .not_capturable = p->sde };
        cap_result_t res;
        if (cap_dispatch(c, s, prog, m, &call, &res) != 0) goto out;
        if (stats) {
            stats->steps++;
            if (res.ran == CAP_RAN_CAPTURED) stats->captured++;
            else if (res.ran == CAP_RAN_REPLAYED) stats->replayed++;
            else {
                stats->eager++;
                stats->declines[res.reason]++;
            }
        }
    }
    if (stats) stats->seconds += now() - t0;
    rc = req_download(s, &r.t[IN_LATENT], out);
out:
    tdit_staging_destroy(&own);
    free(sig);
    free(init);
    return rc;
}
