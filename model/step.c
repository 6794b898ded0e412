/* step.c -- the step workspace and the capturable denoising step.
 *
 * Every buffer the forward pass touches is allocated by tdit_ws_new, in one
 * block, before any step runs; the step only launches kernels over those
 * addresses, reading σ and the guidance scale from device memory.
 *
 * A batch (shape.batch = B > 1) is B samples of one prompt in one step: the
 * token activations hold B·N rows; the time and text embeddings, the
 * modulation and the cross-attention keys and values are computed once for
 * the group; every other op is one launch over all B samples (row-wise ops
 * over the B·N rows, RoPE turning each token by its place in its own
 * sample, attention and patchify batched: kernels/ops.h), each sample's
 * part bitwise what the op gives it alone; only the SDE update (a seed per
 * sample) runs per sample over views. The GEMMs run per sample: a BLAS
 * may sum an output row differently depending on where it falls in its M
 * tiling (OpenBLAS on x86 does for small M; cuBLAS picks its algorithm by
 * M), and a batched sample must be bitwise the single request with its
 * seed; the token GEMMs run as one grouped GEMM only where that was found
 * bitwise the same for their shape (tdit_gemm_merge_ok).
 *
 * A mixed batch (shape.mixed) is B requests: what a group shares is each
 * sample's own (S = B rows of σ, guidance, the time embedding and its
 * modulation; B·L rows of context and text embedding, cross-attention keys
 * and values). Those ops still run once for the batch: ops whose
 * parameters are a sample's take them per row group ([B, D] views: the
 * adaLN modulation, gates; σ and guidance rows), and the samples' own
 * GEMMs are grouped GEMMs (owner_linear), so each sample gets the very
 * bits of a single request's calls. */
#include "tinydit.h"
#include "kernels/artifacts.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/ops_args.h"
#include "kernels/registry.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tinydit_impl.h"

struct tdit_ws {
    /* No pointer to the model: a workspace held by a capture cache entry may
     * be freed after its model (another model's sync, the budget, the
     * cache's destruction), so it keeps what it needs to free itself. */
    kern_backend_t *backend; /* the model's, taken at creation: frees block */
    tdit_shape_t shape;
    int64_t B, N, grid_h, grid_w;   /* samples, tokens per sample, patch grid */
    void *block;          /* every buffer below, one allocation */
    size_t bytes;
    kern_scratch_t scratch; /* the kernels' scratch, inside block: owned, never shared */
    /* inputs */
    kern_tensor_t latent, context, uncond, sigmas, guidance;
    kern_tensor_t sde;      /* F32 [4] ([B,4]): eta, seed, step (kern_sde_params_pack) */
    kern_tensor_t mean;     /* the latent's shape: an SDE step's mean μ (for log-probabilities) */
    kern_tensor_t solver;   /* F32 [16]: a multistep step's coefficients and timestep (KERN_MS_*) */
    kern_tensor_t hist;     /* [3, latent elements]: a multistep solver's history */
    /* activations */
    kern_tensor_t tok, x, a, q, k, v, o, o2, h, y;
    kern_tensor_t txt_h, c, kc, vc;
    kern_tensor_t s_emb, e_h, e, e_silu, e6, mod, hshift, hscale;
    kern_tensor_t v_cond, v_uncond, v_comb;
    /* CFG: what the conditional pass leaves for the unconditional one
     * (forward's pass_t): x after the first block's self-attention and the
     * first cross-attention's normalised queries, [B·N, D] each. */
    kern_tensor_t x_keep, q_keep;
};

/* Views, defined with the forward pass below. */
static kern_tensor_t rows_of(const kern_tensor_t *t, int64_t b, int64_t n);
static kern_tensor_t sample_of(const tdit_ws_t *ws, const kern_tensor_t *t, int64_t b);
static kern_tensor_t own_sigmas(const tdit_ws_t *ws, int64_t b);
static kern_tensor_t own_guidance(const tdit_ws_t *ws, int64_t b);
static int read_tensor(kern_stream_t *s, const kern_tensor_t *t, float *out, size_t n);

/* Carves tensors out of one block; first pass (base NULL) only sizes it. */
typedef struct { char *base; size_t off; int device; } carver_t;

static void carve(carver_t *c, kern_tensor_t *t, kern_dtype_t dt, int ndim, const int64_t *shape) {
    *t = kern_tensor_make(c->base ? c->base + c->off : NULL, dt, c->device, ndim, shape);
    c->off += (kern_tensor_bytes(t) + 255) & ~(size_t)255;
}

/* Scratch the step's kernels need, from their workspace_bytes contracts:
 * the largest of attention's (self and cross: kern_attention_scratch_bytes,
 * whichever path its rule picks at these sizes) and rope3d's, at the sizes
 * the step calls them with. */
static size_t scratch_needed(const tdit_model_t *m, const tdit_ws_t *ws) {
    kern_backend_kind_t bk = kern_backend_kind(m->backend);
    kern_dtype_t dt = m->dtype;
    const tdit_config_t *c = &m->cfg;
    const int64_t d = c->dim / c->heads;
    size_t need = kern_attention_scratch_bytes(bk, dt, ws->N, ws->N, c->heads, d), n;
    if ((n = kern_attention_scratch_bytes(bk, dt, ws->N, ws->shape.text_len, c->heads, d)) > need)
        need = n;
    const kern_impl_t *impl = kern_registry_lookup(KERN_OP_ROPE3D, bk, dt);
    if (impl && impl->workspace_bytes) {
        kern_rope3d_args_t r;
        memset(&r, 0, sizeof r);
        r.heads = c->heads;
        r.head_dim = c->dim / c->heads;
        r.frames = ws->shape.frames;
        r.rows = ws->grid_h;
        r.cols = ws->grid_w;
        if ((n = impl->workspace_bytes(&r)) > need) need = n;
    }
    return need;
}

static void layout(const tdit_model_t *m, tdit_ws_t *ws, carver_t *cv) {
    const tdit_config_t *c = &m->cfg;
    kern_dtype_t dt = m->dtype;
    int64_t D = c->dim, C = c->in_channels, B = ws->B, N = ws->B * ws->N, L = ws->shape.text_len;
    const int64_t S = ws->shape.mixed ? B : 1; /* rows of what a group shares and a mixed batch does not */
    /* One sample: [C,F,H,W]; a batch: [B,C,F,H,W]. */
    const int64_t lat5[5] = { B, C, ws->shape.frames, ws->shape.height, ws->shape.width };
    const int64_t *lat = B == 1 ? lat5 + 1 : lat5;
    const int lnd = B == 1 ? 4 : 5;
    carve(cv, &ws->latent, dt, lnd, lat);
    carve(cv, &ws->context, dt, 2, SHAPE(S * L, c->text_dim));
    if (ws->shape.cfg) carve(cv, &ws->uncond, dt, 2, SHAPE(S * L, c->text_dim));
    const int64_t SW = tdit_sigma_width(&ws->shape);
    if (S == 1) {
        carve(cv, &ws->sigmas, KERN_F32, 1, SHAPE(SW));
        carve(cv, &ws->guidance, KERN_F32, 1, SHAPE(1));
    } else {
        carve(cv, &ws->sigmas, KERN_F32, 2, SHAPE(S, SW));
        carve(cv, &ws->guidance, KERN_F32, 2, SHAPE(S, 1));
    }
    if (B == 1) carve(cv, &ws->sde, KERN_F32, 1, SHAPE(4));
    else carve(cv, &ws->sde, KERN_F32, 2, SHAPE(B, 4));
    carve(cv, &ws->solver, KERN_F32, 1, SHAPE(KERN_MS_COEFS));
    if (tdit_solver_multistep(ws->shape.solver))
        carve(cv, &ws->hist, dt, 2, SHAPE(3, B * C * ws->shape.frames * ws->shape.height * ws->shape.width));
    carve(cv, &ws->tok, dt, 2, SHAPE(N, 4 * C));
    kern_tensor_t *nd[] = { &ws->x, &ws->a, &ws->q, &ws->k, &ws->v, &ws->o, &ws->o2 };
    for (size_t i = 0; i < sizeof nd / sizeof nd[0]; i++) carve(cv, nd[i], dt, 2, SHAPE(N, D));
    carve(cv, &ws->h, dt, 2, SHAPE(N, c->ffn_dim));
    carve(cv, &ws->y, dt, 2, SHAPE(N, 4 * C));
    kern_tensor_t *ld[] = { &ws->txt_h, &ws->c, &ws->kc, &ws->vc };
    for (size_t i = 0; i < sizeof ld / sizeof ld[0]; i++) carve(cv, ld[i], dt, 2, SHAPE(S * L, D));
    carve(cv, &ws->s_emb, dt, 2, SHAPE(S, c->freq_dim));
    kern_tensor_t *d1[] = { &ws->e_h, &ws->e, &ws->e_silu, &ws->hshift, &ws->hscale };
    for (size_t i = 0; i < sizeof d1 / sizeof d1[0]; i++) carve(cv, d1[i], dt, 2, SHAPE(S, D));
    carve(cv, &ws->e6, dt, 2, SHAPE(S * 6, D));
    carve(cv, &ws->mod, dt, 2, SHAPE(S * 6, D));
    carve(cv, &ws->v_cond, dt, lnd, lat);
    carve(cv, &ws->mean, dt, lnd, lat);
    if (ws->shape.cfg) {
        carve(cv, &ws->v_uncond, dt, lnd, lat);
        carve(cv, &ws->v_comb, dt, lnd, lat);
        carve(cv, &ws->x_keep, dt, 2, SHAPE(N, D));
        carve(cv, &ws->q_keep, dt, 2, SHAPE(N, D));
    }
    size_t sb = scratch_needed(m, ws);
    ws->scratch.base = cv->base ? cv->base + cv->off : NULL; /* bound even when 0 bytes */
    ws->scratch.bytes = sb;
    cv->off += (sb + 255) & ~(size_t)255;
}

bool tdit_shape_equal(const tdit_shape_t *a, const tdit_shape_t *b) {
    return a->frames == b->frames && a->height == b->height && a->width == b->width &&
           a->text_len == b->text_len && a->cfg == b->cfg && tdit_shape_batch(a) == tdit_shape_batch(b) &&
           a->solver == b->solver && a->mixed == b->mixed && a->grid == b->grid;
}

int tdit_shape_validate(const tdit_shape_t *shape) {
    if (shape->frames <= 0 || shape->height <= 0 || shape->width <= 0 ||
        shape->height % 2 || shape->width % 2)
        return reel_fail(REEL_E_INVALID, "latent frames/height/width must be positive and height, width even "
                         "(got F=%lld H=%lld W=%lld)", (long long)shape->frames,
                         (long long)shape->height, (long long)shape->width);
    if (shape->text_len <= 0 || shape->text_len > 65536)
        return reel_fail(REEL_E_INVALID, "context length must be in 1..65536 (got %lld)", (long long)shape->text_len);
    if (shape->batch < 0 || shape->batch > TDIT_MAX_BATCH)
        return reel_fail(REEL_E_INVALID, "batch must be in 1..%d (got %lld)", TDIT_MAX_BATCH, (long long)shape->batch);
    if (shape->mixed && tdit_shape_batch(shape) < 2)
        return reel_fail(REEL_E_INVALID, "a mixed batch is at least 2 requests (got %lld): one request steps alone",
                         (long long)tdit_shape_batch(shape));
    if ((unsigned)shape->solver >= TDIT_SOLVER_COUNT || (unsigned)shape->grid >= TDIT_SOLVER_COUNT)
        return reel_fail(REEL_E_INVALID, "unknown solver %d or grid %d", (int)shape->solver, (int)shape->grid);
    if (shape->grid != TDIT_SOLVER_EULER && tdit_solver_multistep(shape->solver))
        return reel_fail(REEL_E_INVALID, "a %s grid is for Euler and SDE steps, not %s's own", tdit_solver_name(shape->grid),
                         tdit_solver_name(shape->solver));
    if (shape->mixed && tdit_solver_multistep(shape->solver))
        return reel_fail(REEL_E_UNSUPPORTED, "a mixed batch (different requests in one step) runs Euler and SDE steps "
                         "only, not %s", tdit_solver_name(shape->solver));
    if (shape->frames > (1 << 16) || shape->height > (1 << 16) || shape->width > (1 << 16) ||
        shape->frames * shape->height * shape->width > (int64_t)1 << 24)
        return reel_fail(REEL_E_LIMIT, "latent too large (F=%lld H=%lld W=%lld)", (long long)shape->frames,
                         (long long)shape->height, (long long)shape->width);
    return 0;
}

static void ws_init(tdit_ws_t *ws, tdit_model_t *m, const tdit_shape_t *shape) {
    ws->backend = m->backend;
    ws->shape = *shape;
    ws->B = tdit_shape_batch(shape);
    ws->grid_h = shape->height / 2;
    ws->grid_w = shape->width / 2;
    ws->N = shape->frames * ws->grid_h * ws->grid_w;
}

size_t tdit_ws_size(tdit_model_t *m, const tdit_shape_t *shape) {
    if (tdit_shape_validate(shape) != 0) return 0;
    tdit_ws_t ws;
    memset(&ws, 0, sizeof ws);
    ws_init(&ws, m, shape);
    carver_t cv = { NULL, 0, kern_backend_device(m->backend) };
    layout(m, &ws, &cv);
    return cv.off;
}

tdit_ws_t *tdit_ws_new(tdit_model_t *m, kern_stream_t *s, const tdit_shape_t *shape) {
    if (tdit_shape_validate(shape) != 0) return NULL;
    tdit_ws_t *ws = calloc(1, sizeof *ws);
    if (!ws) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    ws_init(ws, m, shape);
    carver_t cv = { NULL, 0, kern_backend_device(m->backend) };
    layout(m, ws, &cv);
    ws->bytes = cv.off;
    ws->block = kern_alloc(m->backend, ws->bytes);
    if (!ws->block) { free(ws); return NULL; }
    cv.base = ws->block;
    cv.off = 0;
    layout(m, ws, &cv);
    (void)s; /* the scratch is the workspace's own: nothing to reserve on s */
    if (ws->B > 1 && m->cfg.layers > 0) {
        /* Ask now, outside any capture, whether the token GEMMs merge: a
         * captured step finds the verdicts kept (tdit_gemm_merge_ok). */
        const block_t *b0 = &m->blocks[0];
        const kern_tensor_t *ws_w[] = { &m->patch.w, &b0->sq.w, &b0->ffn0.w, &b0->ffn2.w, &m->head.w };
        for (size_t i = 0; i < sizeof ws_w / sizeof ws_w[0]; i++)
            (void)tdit_gemm_merge_ok(m->backend, m->dtype, ws->N, ws->B, ws_w[i]->shape[1], ws_w[i]->shape[0],
                                     ws_w[i] == &b0->ffn0.w);
        if (ws->shape.mixed) { /* and the samples' own GEMMs (owner_linear): text rows, the time row */
            const int64_t L = ws->shape.text_len;
            const struct { const lin_t *l; int64_t n; bool gelu; } own_w[] = {
                { &m->text0, L, true }, { &m->text2, L, false }, { &b0->ck, L, false },
                { &m->time0, 1, false }, { &m->time2, 1, false }, { &m->proj, 1, false },
            };
            for (size_t i = 0; i < sizeof own_w / sizeof own_w[0]; i++)
                (void)tdit_gemm_merge_ok(m->backend, m->dtype, own_w[i].n, ws->B, own_w[i].l->w.shape[1],
                                         own_w[i].l->w.shape[0], own_w[i].gelu);
        }
    }
    return ws;
}

void tdit_ws_destroy(tdit_ws_t **wp) {
    if (!wp || !*wp) return;
    kern_free((*wp)->backend, (*wp)->block);
    free(*wp);
    *wp = NULL;
}

const tdit_shape_t *tdit_ws_shape(const tdit_ws_t *ws) { return &ws->shape; }
size_t tdit_ws_bytes(const tdit_ws_t *ws) { return ws->bytes; }
kern_tensor_t *tdit_ws_latent(tdit_ws_t *ws) { return &ws->latent; }
kern_tensor_t *tdit_ws_context(tdit_ws_t *ws) { return &ws->context; }
kern_tensor_t *tdit_ws_uncond(tdit_ws_t *ws) { return &ws->uncond; }
kern_tensor_t *tdit_ws_sigmas(tdit_ws_t *ws) { return &ws->sigmas; }
kern_tensor_t *tdit_ws_guidance(tdit_ws_t *ws) { return &ws->guidance; }
kern_tensor_t *tdit_ws_sde(tdit_ws_t *ws) { return &ws->sde; }
kern_tensor_t *tdit_ws_mean(tdit_ws_t *ws) { return &ws->mean; }
kern_tensor_t *tdit_ws_velocity(tdit_ws_t *ws) { return ws->shape.cfg ? &ws->v_comb : &ws->v_cond; }
kern_tensor_t *tdit_ws_solver(tdit_ws_t *ws) { return &ws->solver; }
kern_tensor_t *tdit_ws_history(tdit_ws_t *ws) { return &ws->hist; }

/* Copies n host floats into t (converting to t's dtype); n must fit. */
static int bind(kern_stream_t *s, kern_tensor_t *t, const float *src, size_t n, const char *what) {
    if (!t->data) return reel_fail(REEL_E_INVALID, "bind %s: this workspace has no %s buffer", what, what);
    if ((int64_t)n != kern_tensor_numel(t)) {
        char d[96];
        return reel_fail(REEL_E_INVALID, "bind %s: %zu values do not fit the workspace's %s", what, n,
                         kern_tensor_describe(t, d, sizeof d));
    }
    if (t->dtype == KERN_F32) return kern_copy_h2d(s, kern_tensor_ptr(t), src, n * 4);
    uint16_t *tmp = malloc(n * 2);
    if (!tmp) return reel_fail(REEL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) tmp[i] = kern_f32_to_bf16(src[i]);
    int rc = kern_copy_h2d(s, kern_tensor_ptr(t), tmp, n * 2);
    if (rc == 0) rc = kern_stream_sync(s); /* tmp must outlive the copy */
    free(tmp);
    return rc;
}

int tdit_ws_bind_latent(tdit_ws_t *ws, kern_stream_t *s, const float *x, size_t n) {
    return bind(s, &ws->latent, x, n, "latent");
}

int tdit_ws_bind_context(tdit_ws_t *ws, kern_stream_t *s, const float *ctx, size_t n, bool uncond) {
    return bind(s, uncond ? &ws->uncond : &ws->context, ctx, n, uncond ? "uncond" : "context");
}

int tdit_ws_bind_step(tdit_ws_t *ws, kern_stream_t *s, const float *sigmas, float guidance) {
    if (ws->shape.mixed)
        return reel_fail(REEL_E_INVALID, "bind step: a mixed batch binds each sample's σ and guidance (tdit_ws_bind_sample)");
    TRY(kern_copy_h2d(s, kern_tensor_ptr(&ws->sigmas), sigmas, (size_t)tdit_sigma_width(&ws->shape) * sizeof(float)));
    TRY(kern_copy_h2d(s, kern_tensor_ptr(&ws->guidance), &guidance, sizeof(float)));
    return kern_stream_sync(s); /* the host values are stack memory */
}

int tdit_ws_bind_solver(tdit_ws_t *ws, kern_stream_t *s, const float *coef) {
    if (!tdit_solver_multistep(ws->shape.solver)) return reel_fail(REEL_E_INVALID, "bind solver: this workspace has no multistep solver");
    TRY(kern_copy_h2d(s, kern_tensor_ptr(&ws->solver), coef, KERN_MS_COEFS * sizeof(float)));
    return kern_stream_sync(s); /* the host values may be stack memory */
}

int tdit_ws_clear_history(tdit_ws_t *ws, kern_stream_t *s) {
    if (!tdit_solver_multistep(ws->shape.solver)) return reel_fail(REEL_E_INVALID, "clear history: this workspace has no multistep solver");
    size_t bytes = kern_tensor_bytes(&ws->hist);
    void *zero = calloc(1, bytes);
    if (!zero) return reel_fail(REEL_E_NOMEM, "out of memory");
    int rc = kern_copy_h2d(s, kern_tensor_ptr(&ws->hist), zero, bytes);
    if (rc == 0) rc = kern_stream_sync(s);
    free(zero);
    return rc;
}

static int sample_index(const tdit_ws_t *ws, int64_t b, const char *what) {
    if (b < 0 || b >= ws->B)
        return reel_fail(REEL_E_INVALID, "%s: sample %lld of a batch of %lld", what, (long long)b, (long long)ws->B);
    return 0;
}

int tdit_ws_bind_sample_latent(tdit_ws_t *ws, kern_stream_t *s, int64_t b, const float *x, size_t n) {
    TRY(sample_index(ws, b, "bind sample latent"));
    kern_tensor_t t = sample_of(ws, &ws->latent, b);
    return bind(s, &t, x, n, "latent");
}

int tdit_ws_bind_sample(tdit_ws_t *ws, kern_stream_t *s, int64_t b, const float *ctx, const float *uncond,
                        size_t n_ctx, const float *sigmas, float guidance) {
    TRY(sample_index(ws, b, "bind sample"));
    if (!ws->shape.mixed)
        return reel_fail(REEL_E_INVALID, "bind sample: the samples of a group share their context, σ and guidance "
                         "(tdit_ws_bind_context, tdit_ws_bind_step); only a mixed batch binds them per sample");
    const int64_t L = ws->shape.text_len;
    kern_tensor_t c = rows_of(&ws->context, b, L);
    TRY(bind(s, &c, ctx, n_ctx, "context"));
    if (ws->shape.cfg) {
        if (!uncond) return reel_fail(REEL_E_INVALID, "bind sample: this workspace runs CFG and needs an uncond");
        kern_tensor_t u = rows_of(&ws->uncond, b, L);
        TRY(bind(s, &u, uncond, n_ctx, "uncond"));
    }
    kern_tensor_t sig = own_sigmas(ws, b), g = own_guidance(ws, b);
    TRY(kern_copy_h2d(s, kern_tensor_ptr(&sig), sigmas, (size_t)tdit_sigma_width(&ws->shape) * sizeof(float)));
    TRY(kern_copy_h2d(s, kern_tensor_ptr(&g), &guidance, sizeof(float)));
    return kern_stream_sync(s); /* the host values may be stack memory */
}

int tdit_ws_read_sample_latent(tdit_ws_t *ws, kern_stream_t *s, int64_t b, float *out, size_t n) {
    TRY(sample_index(ws, b, "read sample latent"));
    kern_tensor_t t = sample_of(ws, &ws->latent, b);
    return read_tensor(s, &t, out, n);
}

int tdit_ws_read_latent(tdit_ws_t *ws, kern_stream_t *s, float *out, size_t n) {
    return read_tensor(s, &ws->latent, out, n);
}

/* n floats of t (widened from BF16) into out. */
static int read_tensor(kern_stream_t *s, const kern_tensor_t *t, float *out, size_t n) {
    if ((int64_t)n != kern_tensor_numel(t))
        return reel_fail(REEL_E_INVALID, "read latent: buffer of %zu values, latent has %lld", n,
                         (long long)kern_tensor_numel(t));
    if (t->dtype == KERN_F32) {
        TRY(kern_copy_d2h(s, out, kern_tensor_ptr(t), n * 4));
        return kern_stream_sync(s);
    }
    uint16_t *tmp = malloc(n * 2);
    if (!tmp) return reel_fail(REEL_E_NOMEM, "out of memory");
    int rc = kern_copy_d2h(s, tmp, kern_tensor_ptr(t), n * 2);
    if (rc == 0) rc = kern_stream_sync(s);
    for (size_t i = 0; rc == 0 && i < n; i++) out[i] = kern_bf16_to_f32(tmp[i]);
    free(tmp);
    return rc;
}

/* ---- the forward pass ------------------------------------------------- */

/* Rows [b·n, (b+1)·n) of a contiguous 2-D tensor: sample b's tokens. */
static kern_tensor_t rows_of(const kern_tensor_t *t, int64_t b, int64_t n) {
    kern_tensor_t v = kern_tensor_make(t->data, t->dtype, t->device, 2, SHAPE(n, t->shape[1]));
    v.offset = t->offset + (size_t)(b * n * t->shape[1]) * kern_dtype_size(t->dtype);
    return v;
}

/* Sample b of a latent-shaped tensor ([C,F,H,W] or [B,C,F,H,W]) or of the
 * SDE parameters ([4] or [B,4]). */
static kern_tensor_t sample_of(const tdit_ws_t *ws, const kern_tensor_t *t, int64_t b) {
    return ws->B == 1 ? *t : kern_tensor_row(t, b);
}

/* What a sample owns in a mixed batch and a group shares: the number of
 * owners (B mixed, else 1), and owner b's view of a tensor of n rows per
 * owner (the whole tensor when shared). */
static int64_t owners(const tdit_ws_t *ws) { return ws->shape.mixed ? ws->B : 1; }
static kern_tensor_t own(const tdit_ws_t *ws, const kern_tensor_t *t, int64_t b, int64_t n) {
    return ws->shape.mixed ? rows_of(t, b, n) : *t;
}
/* Row k of the block modulation (shift1, scale1, gate1, shift2, scale2,
 * gate2) of every owner: [D] for a group, a [B, D] view (row stride 6·D)
 * for a mixed batch, whose row b is sample b's: a per-row-group parameter
 * of the ops (kernels/ops.h), so one launch serves every sample. */
static kern_tensor_t mod_rows(const tdit_ws_t *ws, int k) {
    kern_tensor_t r = kern_tensor_row(&ws->mod, k);
    if (!ws->shape.mixed) return r;
    const int64_t D = ws->mod.shape[1];
    kern_tensor_t v = kern_tensor_make(ws->mod.data, ws->mod.dtype, ws->mod.device, 2, SHAPE(ws->B, D));
    v.offset = r.offset;
    v.stride[0] = 6 * D;
    return v;
}
/* Owner b's σ row [3] and guidance [1]. */
static kern_tensor_t own_sigmas(const tdit_ws_t *ws, int64_t b) {
    return ws->shape.mixed ? kern_tensor_row(&ws->sigmas, b) : ws->sigmas;
}
static kern_tensor_t own_guidance(const tdit_ws_t *ws, int64_t b) {
    return ws->shape.mixed ? kern_tensor_row(&ws->guidance, b) : ws->guidance;
}

/* y = x·wᵀ + bias (then GELU-tanh with gelu) over the token rows: one GEMM
 * per sample, each the very call a single request makes (see the top). */
static int token_linear(const tdit_ws_t *ws, kern_stream_t *s, const kern_tensor_t *x,
                        const kern_tensor_t *w, const kern_tensor_t *bias, kern_tensor_t *y, bool gelu) {
    if (ws->B > 1 && tdit_gemm_merge_ok(ws->backend, x->dtype, ws->N, ws->B, w->shape[1], w->shape[0], gelu))
        return kern_gemm_grouped(s, x, w, bias, y, ws->N, gelu); /* bitwise the loop below */
    for (int64_t b = 0; b < ws->B; b++) {
        kern_tensor_t xb = ws->B == 1 ? *x : rows_of(x, b, ws->N), yb = ws->B == 1 ? *y : rows_of(y, b, ws->N);
        TRY(gelu ? kern_gemm_gelu(s, &xb, w, bias, &yb) : kern_gemm(s, &xb, w, bias, &yb));
    }
    return 0;
}

static int tlinear(const tdit_ws_t *ws, kern_stream_t *s, const kern_tensor_t *x, const lin_t *l, kern_tensor_t *y) {
    return token_linear(ws, s, x, &l->w, &l->b, y, false);
}

/* y = x·wᵀ + bias (GELU-tanh after it with gelu) over what each owner has
 * n rows of (a mixed batch's text): one grouped GEMM where merging is
 * bitwise (as token_linear), else the single request's call per owner. */
static int owner_linear(const tdit_ws_t *ws, kern_stream_t *s, const kern_tensor_t *x, const lin_t *l,
                        kern_tensor_t *y, int64_t n, bool gelu) {
    const int64_t S = owners(ws);
    if (S > 1 && tdit_gemm_merge_ok(ws->backend, x->dtype, n, S, l->w.shape[1], l->w.shape[0], gelu))
        return kern_gemm_grouped(s, x, &l->w, &l->b, y, n, gelu);
    for (int64_t i = 0; i < S; i++) {
        kern_tensor_t xi = own(ws, x, i, n), yi = own(ws, y, i, n);
        TRY(gelu ? kern_gemm_gelu(s, &xi, &l->w, &l->b, &yi) : kern_gemm(s, &xi, &l->w, &l->b, &yi));
    }
    return 0;
}

/* a = LN(x)·(1 + scale) + shift, LN without affine: one fused op (on the
 * CPU bit for bit LN then modulate). */
static int ln_modulate(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *shift,
                       const kern_tensor_t *scale, kern_tensor_t *a) {
    return kern_layernorm_modulate(s, x, shift, scale, LN_EPS, a);
}

/* t = RoPE(RMS(t)·g) in place, RMS over the whole width: one fused op (on
 * the CPU bit for bit RMSNorm then RoPE; its scratch is RoPE's, which
 * scratch_needed reserves), over every sample's tokens at once, each
 * turned by its place in its own sample. */
static int rms_rope(tdit_ws_t *ws, kern_stream_t *s, kern_tensor_t *t, const kern_tensor_t *g,
                    int64_t heads) {
    return kern_rmsnorm_rope3d(s, t, g, LN_EPS, heads, ws->shape.frames, ws->grid_h, ws->grid_w);
}

/* o = attention(q, k, v) of every sample (kern_attention_batch: one launch
 * where the path allows); k and v shared by the group when shared_kv (a
 * group's text tokens in cross-attention), else sample b's rows. */
static int attention(tdit_ws_t *ws, kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                     const kern_tensor_t *v, bool shared_kv, int64_t heads, kern_tensor_t *o) {
    return kern_attention_batch(s, q, k, v, heads, o, ws->B, shared_kv);
}

/* Which part of a forward pass runs. Up to the first block's cross-
 * attention keys, a pass reads the latent, σ and the weights, never the
 * context: the time embedding and its modulation, the patch embedding, the
 * first block's self-attention with its residual, and that block's
 * cross-attention queries. A CFG step's two passes compute those the same
 * way on the same inputs, so the conditional pass keeps them (x and the
 * queries, copied aside) and the unconditional one starts from them: the
 * very bits it would compute, with about half a block and the embeddings
 * fewer launches. */
typedef enum {
    PASS_FULL, /* everything (no CFG) */
    PASS_KEEP, /* everything, keeping the context-free part for PASS_REUSE */
    PASS_REUSE /* the context-dependent part, after PASS_KEEP on this latent and σ */
} pass_t;

static int copy_tensor(kern_stream_t *s, kern_tensor_t *dst, const kern_tensor_t *src) {
    return kern_copy_d2d(s, kern_tensor_ptr(dst), kern_tensor_ptr(src), kern_tensor_bytes(src));
}

static int block_forward(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s, const block_t *b, pass_t pass) {
    const int64_t H = m->cfg.heads, L = ws->shape.text_len;
    /* Every op below takes the whole batch in one launch: a mixed batch's
     * per-sample parameters are per-row-group views (mod_rows), each
     * sample's rows bitwise what its request alone gets. */
    /* 4: m = modulation + e6, rows (shift1, scale1, gate1, shift2, scale2, gate2), per owner */
    TRY(kern_add_repeat(s, &b->modulation, &ws->e6, &ws->mod));
    /* self-attention */
    kern_artifacts_set_region("block.self_attn");
    kern_tensor_t shift1 = mod_rows(ws, 0), scale1 = mod_rows(ws, 1), gate1 = mod_rows(ws, 2);
    kern_tensor_t shift2 = mod_rows(ws, 3), scale2 = mod_rows(ws, 4), gate2 = mod_rows(ws, 5);
    if (pass == PASS_REUSE) {
        TRY(copy_tensor(s, &ws->x, &ws->x_keep));
        TRY(copy_tensor(s, &ws->q, &ws->q_keep));
        goto cross_kv;
    }
    TRY(ln_modulate(s, &ws->x, &shift1, &scale1, &ws->a));
    TRY(tlinear(ws, s, &ws->a, &b->sq, &ws->q));
    TRY(rms_rope(ws, s, &ws->q, &b->s_norm_q, H));
    TRY(tlinear(ws, s, &ws->a, &b->sk, &ws->k));
    TRY(rms_rope(ws, s, &ws->k, &b->s_norm_k, H));
    TRY(tlinear(ws, s, &ws->a, &b->sv, &ws->v));
    TRY(attention(ws, s, &ws->q, &ws->k, &ws->v, false, H, &ws->o));
    TRY(tlinear(ws, s, &ws->o, &b->so, &ws->o2));
    /* cross-attention over the text tokens, no RoPE, no gate; their keys
     * and values once for a group (per sample in a mixed batch). Its norm
     * is fused with the residual before it: x += gate1·o2, a = LN(x)·w + b
     * (bit for bit the pair). */
    kern_artifacts_set_region("block.cross_attn");
    TRY(kern_residual_layernorm(s, &ws->x, &ws->o2, &gate1, &b->norm3_w, &b->norm3_b, LN_EPS, &ws->a));
    TRY(tlinear(ws, s, &ws->a, &b->cq, &ws->q));
    TRY(kern_rmsnorm(s, &ws->q, &b->c_norm_q, LN_EPS, &ws->q));
    if (pass == PASS_KEEP) {
        TRY(copy_tensor(s, &ws->x_keep, &ws->x));
        TRY(copy_tensor(s, &ws->q_keep, &ws->q));
    }
cross_kv:
    kern_artifacts_set_region("block.cross_attn");
    TRY(owner_linear(ws, s, &ws->c, &b->ck, &ws->kc, L, false));
    TRY(kern_rmsnorm(s, &ws->kc, &b->c_norm_k, LN_EPS, &ws->kc));
    TRY(owner_linear(ws, s, &ws->c, &b->cv, &ws->vc, L, false));
    TRY(attention(ws, s, &ws->q, &ws->kc, &ws->vc, !ws->shape.mixed, H, &ws->o));
    TRY(tlinear(ws, s, &ws->o, &b->co, &ws->o2));
    /* feed-forward; its adaLN fused with the residual before it: x += o2,
     * a = LN(x)·(1 + scale2) + shift2 */
    kern_artifacts_set_region("block.ffn");
    TRY(kern_residual_layernorm_modulate(s, &ws->x, &ws->o2, NULL, &shift2, &scale2, LN_EPS, &ws->a));
    TRY(token_linear(ws, s, &ws->a, &b->ffn0.w, &b->ffn0.b, &ws->h, true));
    TRY(tlinear(ws, s, &ws->h, &b->ffn2, &ws->o2));
    TRY(kern_gated_residual(s, &ws->x, &ws->o2, &gate2));
    return 0;
}

static int forward(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s,
                   const kern_tensor_t *context, kern_tensor_t *v, pass_t pass) {
    if (m->cfg.layers == 0 && pass != PASS_FULL) pass = PASS_FULL; /* nothing to keep */
    const int64_t L = ws->shape.text_len;
    if (pass == PASS_REUSE) goto text; /* e, e6 and the tokens are PASS_KEEP's */
    /* 1: time embedding from σ_i in device memory */
    kern_artifacts_set_region("embed.time");
    const int64_t S = owners(ws);
    kern_tensor_t e6_all = kern_tensor_make(ws->e6.data, ws->e6.dtype, ws->e6.device, 2,
                                            SHAPE(S, 6 * m->cfg.dim));
    e6_all.offset = ws->e6.offset;
    /* One launch per op for every owner: a mixed batch's rows are each
     * sample's own (σ row by row; GEMMs grouped by one row, as alone). */
    if (tdit_solver_multistep(ws->shape.solver)) {
        /* A multistep solver hands the transformer its own timestep (Wan's
         * int64 t), not 1000·σ_i. (Never mixed: tdit_shape_validate.) */
        kern_tensor_t t = kern_tensor_make(ws->solver.data, KERN_F32, ws->solver.device, 1, SHAPE(1));
        t.offset = ws->solver.offset + KERN_MS_T * sizeof(float);
        TRY(kern_timestep_embed_at(s, &t, &ws->s_emb));
    } else if (ws->shape.grid != TDIT_SOLVER_EULER) {
        /* An SDE loop on a multistep solver's grid: its integer t_i, the
         * σ row's fourth value. */
        if (S > 1) {
            TRY(kern_timestep_embed_rows_at(s, &ws->sigmas, 3, &ws->s_emb));
        } else {
            kern_tensor_t t = kern_tensor_make(ws->sigmas.data, KERN_F32, ws->sigmas.device, 1, SHAPE(1));
            t.offset = ws->sigmas.offset + 3 * sizeof(float);
            TRY(kern_timestep_embed_at(s, &t, &ws->s_emb));
        }
    } else if (S > 1) {
        TRY(kern_timestep_embed_rows(s, &ws->sigmas, &ws->s_emb));
    } else {
        TRY(kern_timestep_embed(s, &ws->sigmas, &ws->s_emb));
    }
    TRY(owner_linear(ws, s, &ws->s_emb, &m->time0, &ws->e_h, 1, false));
    TRY(kern_silu(s, &ws->e_h, &ws->e_h));
    TRY(owner_linear(ws, s, &ws->e_h, &m->time2, &ws->e, 1, false));
    TRY(kern_silu(s, &ws->e, &ws->e_silu));
    TRY(owner_linear(ws, s, &ws->e_silu, &m->proj, &e6_all, 1, false));
    /* 3: tokens (before the text: PASS_REUSE starts at the text) */
    kern_artifacts_set_region("embed.patch");
    TRY(kern_patchify(s, &ws->latent, &ws->tok)); /* every sample's tokens */
    TRY(tlinear(ws, s, &ws->tok, &m->patch, &ws->x));
text:
    /* 2: text embedding */
    kern_artifacts_set_region("embed.text");
    TRY(owner_linear(ws, s, context, &m->text0, &ws->txt_h, L, true));
    TRY(owner_linear(ws, s, &ws->txt_h, &m->text2, &ws->c, L, false));
    /* 4: blocks; the first one's context-free part per pass */
    for (int64_t i = 0; i < m->cfg.layers; i++)
        TRY(block_forward(m, ws, s, &m->blocks[i], i == 0 ? pass : PASS_FULL));
    /* 5: head, (shift, scale) = head.modulation + e */
    kern_artifacts_set_region("head");
    kern_tensor_t hm0 = kern_tensor_row(&m->head_mod, 0), hm1 = kern_tensor_row(&m->head_mod, 1);
    TRY(kern_add_repeat(s, &hm0, &ws->e, &ws->hshift)); /* [S, D]: row i owner i's */
    TRY(kern_add_repeat(s, &hm1, &ws->e, &ws->hscale));
    TRY(ln_modulate(s, &ws->x, &ws->hshift, &ws->hscale, &ws->a));
    TRY(tlinear(ws, s, &ws->a, &m->head, &ws->y));
    /* 6: unpatchify, every sample */
    return kern_unpatchify(s, &ws->y, v);
}

/* The forward pass with the workspace's own scratch bound to s: whatever
 * a capture bakes in belongs to this workspace, so workspaces of any
 * shapes can hold live graphs on one stream. */
static int forward_pass(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s,
                        const kern_tensor_t *context, kern_tensor_t *v, pass_t pass) {
    kern_scratch_t prev = kern_stream_bind_scratch(s, ws->scratch);
    /* Each part names its region for kernel artifacts (kernels/artifacts.h). */
    const char *region = kern_artifacts_set_region(NULL);
    int rc = forward(m, ws, s, context, v, pass);
    kern_artifacts_set_region(region);
    kern_stream_bind_scratch(s, prev);
    return rc;
}

int tdit_forward(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s,
                 const kern_tensor_t *context, kern_tensor_t *v) {
    return forward_pass(m, ws, s, context, v, PASS_FULL);
}

/* v for the current latent: conditional, and combined with CFG if set (the
 * unconditional pass from the conditional one's context-free part). */
static int velocity(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s) {
    if (!ws->shape.cfg) return forward_pass(m, ws, s, &ws->context, &ws->v_cond, PASS_FULL);
    TRY(forward_pass(m, ws, s, &ws->context, &ws->v_cond, PASS_KEEP));
    TRY(forward_pass(m, ws, s, &ws->uncond, &ws->v_uncond, PASS_REUSE));
    if (!ws->shape.mixed) return kern_cfg_combine(s, &ws->v_cond, &ws->v_uncond, &ws->guidance, &ws->v_comb);
    /* each sample its own guidance, one launch */
    return kern_cfg_combine_rows(s, &ws->v_cond, &ws->v_uncond, &ws->guidance, &ws->v_comb);
}

int tdit_step(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s) {
    TRY(velocity(m, ws, s));
    if (!ws->shape.mixed) return kern_euler_update(s, &ws->latent, tdit_ws_velocity(ws), &ws->sigmas);
    /* each sample its own σ, one launch */
    return kern_euler_update_rows(s, &ws->latent, tdit_ws_velocity(ws), &ws->sigmas);
}

int tdit_step_sde(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s, float eta,
                  uint64_t seed, uint32_t step) {
    if (ws->B != 1) return reel_fail(REEL_E_INVALID, "tdit_step_sde: a batch steps with tdit_step_sde_ws (a seed per sample)");
    TRY(velocity(m, ws, s));
    return kern_sde_update(s, &ws->latent, tdit_ws_velocity(ws), &ws->sigmas, eta, seed, step);
}

int tdit_step_sde_ws(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s) {
    TRY(velocity(m, ws, s));
    /* Each sample draws its own noise: its row of the SDE parameters. */
    for (int64_t b = 0; b < ws->B; b++) {
        kern_tensor_t xb = sample_of(ws, &ws->latent, b), vb = sample_of(ws, tdit_ws_velocity(ws), b),
                      pb = sample_of(ws, &ws->sde, b), mb = sample_of(ws, &ws->mean, b), sig = own_sigmas(ws, b);
        TRY(kern_sde_update_dev_mean(s, &xb, &vb, &sig, &pb, &mb));
    }
    return 0;
}

int tdit_step_multistep(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s) {
    if (!tdit_solver_multistep(ws->shape.solver)) return reel_fail(REEL_E_INVALID, "tdit_step_multistep: the workspace has no multistep history");
    TRY(velocity(m, ws, s));
    return kern_multistep_update(s, &ws->latent, tdit_ws_velocity(ws), &ws->hist, &ws->solver);
}

void tdit_schedule(int steps, double shift, double *sigmas) {
    for (int i = 0; i <= steps; i++) {
        double u = 1.0 - (double)i / steps;
        sigmas[i] = tdit_shift_sigma(shift, u);
    }
}
