/* wrk_request.c -- REQUEST checking and copying (see wrk_request.h). The
 * messages are the client's: they name the field and say what was expected
 * and what came, because the client cannot see the worker's log. */
#include "worker/wrk_request.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/error.h"

#define DIM_MAX ((int64_t)1 << 20)   /* any one dimension; tdit_shape_validate bounds the rest */

static int bad(wire_err_t *err, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(wire_err_t *err, const char *code, const char *fmt, ...) {
    snprintf(err->code, sizeof err->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* Optional unsigned field: absent -> def; present but not a non-negative
 * integer -> -1. */
static int opt_u64(const wire_val_t *h, const char *k, uint64_t def, uint64_t *out, wire_err_t *err) {
    const wire_val_t *v = wv_get(h, k);
    if (!v) { *out = def; return 0; }
    if (!wv_as_u64(v, out)) return bad(err, WIRE_E_BAD_REQUEST, "'%s' must be a non-negative integer", k);
    return 0;
}

static int opt_f64(const wire_val_t *h, const char *k, double def, double *out, wire_err_t *err) {
    const wire_val_t *v = wv_get(h, k);
    if (!v) { *out = def; return 0; }
    if (!wv_as_f64(v, out) || !isfinite(*out)) return bad(err, WIRE_E_BAD_REQUEST, "'%s' must be a finite number", k);
    return 0;
}

static int opt_bool(const wire_val_t *h, const char *k, bool *out, wire_err_t *err) {
    const wire_val_t *v = wv_get(h, k);
    if (!v) { *out = false; return 0; }
    if (v->kind != WV_BOOL) return bad(err, WIRE_E_BAD_REQUEST, "'%s' must be a boolean", k);
    *out = v->as.b;
    return 0;
}

static void shape_text(const wire_tensor_t *t, char *buf, size_t len) {
    kern_tensor_t k = kern_tensor_make(NULL, t->dtype, KERN_DEVICE_HOST, t->ndim, t->shape);
    kern_tensor_describe(&k, buf, len);
}

/* A host copy of an F32 tensor's frame (frames carry no alignment promise). */
static float *copy_f32(const wire_tensor_t *t, wire_err_t *err) {
    float *x = malloc(t->bytes ? t->bytes : 1);
    if (!x) { bad(err, WIRE_E_INTERNAL, "out of memory copying tensor '%s'", t->name); return NULL; }
    memcpy(x, t->data, t->bytes);
    return x;
}

void wrk_job_free(wrk_job_t **jp) {
    if (!jp || !*jp) return;
    wrk_job_t *j = *jp;
    tdit_req_destroy(&j->req);
    free(j->latent);
    free(j->context);
    free(j->uncond);
    free(j);
    *jp = NULL;
}

int wrk_job_from_request(const wire_msg_t *m, const tdit_config_t *cfg, uint64_t applied,
                         wrk_job_t **out, wire_err_t *err) {
    *out = NULL;
    const wire_val_t *h = m->hdr;
    char d[96];

    const char *model = wv_get_str(h, "model");
    if (!model) return bad(err, WIRE_E_BAD_REQUEST, "missing 'model' (this worker serves '%s')", cfg->name);
    if (strcmp(model, cfg->name) != 0)
        return bad(err, WIRE_E_BAD_REQUEST, "model '%.64s' is not served here (this worker serves '%s')", model, cfg->name);

    uint64_t version, steps, seed;
    if (opt_u64(h, "version", 0, &version, err)) return -1;
    if (version > applied)
        return bad(err, WIRE_E_BAD_REQUEST, "worker at v%" PRIu64 ", request needs v%" PRIu64, applied, version);
    if (!wv_get(h, "steps")) return bad(err, WIRE_E_BAD_REQUEST, "missing 'steps' (1..%d)", WRK_MAX_STEPS);
    if (opt_u64(h, "steps", 0, &steps, err)) return -1;
    if (steps < 1 || steps > WRK_MAX_STEPS)
        return bad(err, WIRE_E_BAD_REQUEST, "'steps' must be in 1..%d (got %" PRIu64 ")", WRK_MAX_STEPS, steps);
    if (opt_u64(h, "seed", 0, &seed, err)) return -1;
    double shift = 1.0, guidance = 1.0, eta = 0.7;
    bool sde = false, progress = false;
    if (opt_f64(h, "shift", 1.0, &shift, err) || opt_f64(h, "cfg", 1.0, &guidance, err) ||
        opt_f64(h, "eta", 0.7, &eta, err) || opt_bool(h, "sde", &sde, err) ||
        opt_bool(h, "progress", &progress, err))
        return -1;
    if (!(shift > 0)) return bad(err, WIRE_E_BAD_REQUEST, "'shift' must be > 0 (got %g)", shift);
    if (sde && !(eta >= 0)) return bad(err, WIRE_E_BAD_REQUEST, "'eta' must be >= 0 (got %g)", eta);

    const wire_val_t *ls = wv_get(h, "latent_shape");
    if (!ls) return bad(err, WIRE_E_BAD_REQUEST, "missing 'latent_shape' [C,F,H,W]");
    if (ls->kind != WV_ARR || wv_len(ls) != 4)
        return bad(err, WIRE_E_BAD_REQUEST, "'latent_shape' must be an array [C,F,H,W] of 4 integers");
    int64_t lshape[4];
    for (size_t i = 0; i < 4; i++) {
        uint64_t x;
        if (!wv_as_u64(wv_at(ls, i), &x) || x == 0 || x > (uint64_t)DIM_MAX)
            return bad(err, WIRE_E_BAD_REQUEST, "'latent_shape'[%zu] must be an integer in 1..%" PRId64, i, DIM_MAX);
        lshape[i] = (int64_t)x;
    }
    if (lshape[0] != cfg->in_channels)
        return bad(err, WIRE_E_BAD_REQUEST, "latent has %" PRId64 " channels, model %s expects %" PRId64,
                   lshape[0], cfg->name, cfg->in_channels);

    const wire_tensor_t *ctx = wire_msg_tensor(m, "context");
    const wire_tensor_t *unc = wire_msg_tensor(m, "uncond");
    const wire_tensor_t *lat = wire_msg_tensor(m, "latent");
    if (!ctx) return bad(err, WIRE_E_BAD_REQUEST, "missing tensor 'context' [L,%" PRId64 "] F32", cfg->text_dim);
    if (ctx->dtype != KERN_F32 || ctx->ndim != 2) {
        shape_text(ctx, d, sizeof d);
        return bad(err, WIRE_E_BAD_REQUEST, "tensor 'context' is %s, expected F32[L,%" PRId64 "]", d, cfg->text_dim);
    }
    if (ctx->shape[1] != cfg->text_dim)
        return bad(err, WIRE_E_BAD_REQUEST, "context width %" PRId64 ", model %s expects text_dim %" PRId64,
                   ctx->shape[1], cfg->name, cfg->text_dim);
    if (unc && (unc->dtype != KERN_F32 || unc->ndim != 2 || unc->shape[0] != ctx->shape[0] ||
                unc->shape[1] != ctx->shape[1])) {
        char c2[96];
        shape_text(unc, d, sizeof d);
        shape_text(ctx, c2, sizeof c2);
        return bad(err, WIRE_E_BAD_REQUEST, "tensor 'uncond' is %s, expected the context's %s", d, c2);
    }
    if (lat) {
        bool same = lat->dtype == KERN_F32 && lat->ndim == 4;
        for (int i = 0; same && i < 4; i++) same = lat->shape[i] == lshape[i];
        if (!same) {
            shape_text(lat, d, sizeof d);
            return bad(err, WIRE_E_BAD_REQUEST, "tensor 'latent' is %s, expected F32[%" PRId64 ",%" PRId64
                       ",%" PRId64 ",%" PRId64 "] (latent_shape)", d, lshape[0], lshape[1], lshape[2], lshape[3]);
        }
    }

    tdit_shape_t shape = { lshape[1], lshape[2], lshape[3], ctx->shape[0], unc != NULL };
    if (tdit_shape_validate(&shape) != 0) return bad(err, WIRE_E_BAD_REQUEST, "%s", kern_error());
    tdit_loop_t loop = { (int)steps, shift, (float)guidance, sde, (float)eta, seed };
    if (!isfinite(loop.guidance) || (sde && !isfinite(loop.eta)))
        return bad(err, WIRE_E_BAD_REQUEST, "'cfg' and 'eta' must fit a float");
    if (tdit_loop_validate(&loop) != 0) return bad(err, WIRE_E_BAD_REQUEST, "%s", kern_error());

    wrk_job_t *j = calloc(1, sizeof *j);
    if (!j) return bad(err, WIRE_E_INTERNAL, "out of memory");
    j->id = m->id;
    j->version = version;
    j->progress = progress;
    j->shape = shape;
    j->loop = loop;
    memcpy(j->latent_shape, lshape, sizeof lshape);
    j->n_latent = (size_t)(lshape[0] * lshape[1] * lshape[2] * lshape[3]);
    if (!(j->context = copy_f32(ctx, err)) || (unc && !(j->uncond = copy_f32(unc, err))) ||
        (lat && !(j->latent = copy_f32(lat, err)))) {
        wrk_job_free(&j);
        return -1;
    }
    *out = j;
    return 0;
}
