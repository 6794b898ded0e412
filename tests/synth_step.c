/* synth_step.c -- the capture cache suites' synthetic step (synth_step.h):
 * y = latent + context; y += w · latent, with each suite's hooks. */
#include "tests/synth_step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/backend_impl.h" /* kern_stream_launch: the bias kernel */
#include "kernels/ops.h"
#include "tests/support.h"

static const synth_hooks_t *hooks_of(const synth_user_t *u) { return u ? u->hooks : NULL; }

/* ---- the program ---------------------------------------------------------------- */

void synth_ws_free(void *user, void *ws_) {
    (void)user; /* may be gone: a suite's teardown frees the workspaces of stack users */
    synth_ws_t *ws = ws_;
    if (!ws) return;
    kern_free(ws->b, ws->x.data);
    kern_free(ws->b, ws->ctx.data);
    kern_free(ws->b, ws->y.data);
    free(ws);
}

void *synth_ws_new(void *user, const cap_key_t *key, kern_stream_t *s) {
    synth_user_t *u = user;
    const synth_hooks_t *h = hooks_of(u);
    if (h && h->ws_new && h->ws_new(u) != 0) return NULL;
    if (key->n_inputs < 2) {
        reel_fail(REEL_E_INVALID, "synthetic step: the key needs two inputs");
        return NULL;
    }
    const cap_sig_t *a = &key->inputs[0], *c = &key->inputs[1];
    if (a->ndim < 1 || a->shape[a->ndim - 1] > SYNTH_W) {
        reel_fail(REEL_E_INVALID, "synthetic step: rows wider than %d", SYNTH_W);
        return NULL;
    }
    synth_ws_t *ws = calloc(1, sizeof *ws);
    if (!ws) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    ws->b = kern_stream_backend(s);
    ws->x = kern_tensor_alloc(ws->b, a->dtype, a->ndim, a->shape);
    ws->ctx = kern_tensor_alloc(ws->b, c->dtype, c->ndim, c->shape);
    ws->y = kern_tensor_alloc(ws->b, a->dtype, a->ndim, a->shape);
    if (!ws->x.data || !ws->ctx.data || !ws->y.data) goto err;
    return ws;
err:
    synth_ws_free(user, ws);
    /* out of memory, so the cache gives idle entries back and tries again */
    reel_fail(REEL_E_NOMEM, "synthetic step: workspace");
    return NULL;
}

size_t synth_ws_bytes(void *user, const void *ws_) {
    (void)user;
    const synth_ws_t *ws = ws_;
    return kern_tensor_bytes(&ws->x) + kern_tensor_bytes(&ws->ctx) + kern_tensor_bytes(&ws->y);
}

size_t synth_ws_size(void *user, const cap_key_t *key) {
    synth_user_t *u = user;
    const synth_hooks_t *h = hooks_of(u);
    if (h && h->ws_size) h->ws_size(u);
    int64_t a = 1, c = 1;
    for (int d = 0; d < key->inputs[0].ndim; d++) a *= key->inputs[0].shape[d];
    for (int d = 0; d < key->inputs[1].ndim; d++) c *= key->inputs[1].shape[d];
    return (size_t)(2 * a + c) * kern_dtype_size(key->inputs[0].dtype);
}

kern_tensor_t *synth_input(void *user, void *ws_, int i) {
    (void)user;
    synth_ws_t *ws = ws_;
    return i == 0 ? &ws->x : &ws->ctx;
}

kern_tensor_t *synth_output(void *user, void *ws_, int i) {
    (void)user;
    (void)i;
    return &((synth_ws_t *)ws_)->y;
}

/* Reads only the workspace slots and the weights: what a replay re-reads. */
int synth_launch(void *user, void *ws_, const cap_const_t *consts, int n_consts, kern_stream_t *s) {
    synth_user_t *u = user;
    synth_ws_t *ws = ws_;
    const synth_hooks_t *h = hooks_of(u);
    const synth_launch_t l = { ws, consts, n_consts, s };
    int64_t D = ws->x.shape[ws->x.ndim - 1];
    kern_tensor_t gate = kern_tensor_make(u->w, KERN_F32, kern_backend_device(ws->b), 1, &D);
    if (h && h->before_add && h->before_add(u, &l) != 0) return -1;
    if (kern_add(s, &ws->x, &ws->ctx, &ws->y) != 0) return -1;
    if (h && h->after_add && h->after_add(u, &l) != 0) return -1;
    if (kern_gated_residual(s, &ws->y, &ws->x, &gate) != 0) return -1;
    if (h && h->after_residual) return h->after_residual(u, &l);
    return 0;
}

int synth_weights(void *user, cap_weight_t *out, int max) {
    synth_user_t *u = user;
    const synth_hooks_t *h = hooks_of(u);
    if (h && h->weights && h->weights(u) != 0) return -1;
    if (max >= 1) out[0] = (cap_weight_t){ .addr = u->w, .bytes = SYNTH_W * sizeof(float), .dtype = KERN_F32, .component = 0 };
    return 1;
}

/* ---- kernels a hook may add ------------------------------------------------------ */

typedef struct {
    float *y;
    int64_t n;
    float v;
} bias_args_t;

static int bias_kernel(void *ctx, const void *args) {
    (void)ctx;
    const bias_args_t *a = args;
    for (int64_t i = 0; i < a->n; i++) a->y[i] += a->v;
    return 0;
}

int synth_add_scalar(const synth_launch_t *l, float v) {
    bias_args_t a = { kern_tensor_ptr(&l->ws->y), kern_tensor_numel(&l->ws->y), v };
    return kern_stream_launch(l->s, bias_kernel, &a, sizeof a);
}

int synth_add_const(const synth_launch_t *l) {
    if (l->n_consts < 1) return 0;
    const cap_const_t *c = &l->consts[0];
    return synth_add_scalar(l, c->type == CAP_CONST_F64 ? (float)c->v.f : (float)c->v.i);
}

/* ---- keys, inputs and references ------------------------------------------------- */

cap_key_t synth_key(kern_backend_t *b, const char *model, int64_t rows, int64_t cols, const char *comp,
                    uint64_t ver) {
    cap_key_t k;
    memset(&k, 0, sizeof k);
    snprintf(k.device, sizeof k.device, "%s", kern_backend_device_name(b));
    snprintf(k.arch, sizeof k.arch, "%s", kern_backend_arch(b));
    snprintf(k.model, sizeof k.model, "%s", model);
    snprintf(k.loop, sizeof k.loop, "euler");
    int64_t shape[2] = { rows, cols };
    TS_OK(cap_key_add_input(&k, "latent", KERN_F32, 2, shape));
    TS_OK(cap_key_add_input(&k, "context", KERN_F32, 2, shape));
    if (comp) TS_OK(cap_key_add_component(&k, comp, ver));
    k.graph.dtype = KERN_F32;
    snprintf(k.graph.cfg, sizeof k.graph.cfg, "cond");
    snprintf(k.graph.expert, sizeof k.graph.expert, "-");
    snprintf(k.graph.sched, sizeof k.graph.sched, "f32");
    return k;
}

kern_tensor_t synth_host_tensor(float *p, int64_t rows, int64_t cols) {
    int64_t shape[2] = { rows, cols };
    return kern_tensor_make(p, KERN_F32, KERN_DEVICE_HOST, 2, shape);
}

void synth_gather(const kern_tensor_t *t, float *dst) {
    int64_t n = kern_tensor_numel(t), idx[KERN_MAX_DIMS] = { 0 };
    const float *base = kern_tensor_ptr(t);
    for (int64_t j = 0; j < n; j++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
        dst[j] = base[off];
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

int synth_reference(const float *w, kern_stream_t *s, const cap_key_t *key, const float *x, const float *ctx,
                    const cap_const_t *consts, int n_consts, float *out) {
    synth_user_t plain = { .w = (float *)w, .hooks = NULL };
    synth_ws_t *ws = synth_ws_new(&plain, key, s);
    if (!ws) return -1;
    memcpy(kern_tensor_ptr(&ws->x), x, kern_tensor_bytes(&ws->x));
    memcpy(kern_tensor_ptr(&ws->ctx), ctx, kern_tensor_bytes(&ws->ctx));
    int rc = synth_launch(&plain, ws, NULL, 0, s);
    if (rc == 0) rc = kern_stream_sync(s);
    int64_t n = kern_tensor_numel(&ws->y);
    if (rc == 0) memcpy(out, kern_tensor_ptr(&ws->y), kern_tensor_bytes(&ws->y));
    synth_ws_free(&plain, ws);
    if (rc != 0) return -1;
    if (n_consts < 1) return 0;
    /* Converted here, not through synth_add_const's code, so a fault there shows. */
    const cap_const_t *c = &consts[0];
    const float v = c->type == CAP_CONST_F64 ? (float)c->v.f : (float)c->v.i;
    for (int64_t j = 0; j < n; j++) out[j] += v;
    return 0;
}

int64_t synth_first_diff(const float *a, const float *b, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        if (memcmp(&a[j], &b[j], sizeof(float)) != 0) return j;
    return -1;
}

/* ---- data -------------------------------------------------------------------------- */

void synth_fill(uint64_t *st, float *p, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * (float)((double)(ts_splitmix64(st) >> 40) / (double)(1ull << 24));
}
