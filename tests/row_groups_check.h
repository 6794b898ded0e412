/* row_groups_check.h -- the batch-wide ops of a mixed batch (kernels/ops.h
 * "Row groups", kern_add_repeat, kern_rmsnorm_rope3d over B samples,
 * kern_attention_batch) against the same ops called group by group on the
 * same backend: every byte must be equal, since a batched sample must be
 * bitwise the request alone. Shared by test_row_groups.c (the CPU) and
 * test_cuda.c (CUDA, F32 and BF16).
 *
 * rg_check(b, s, dt, name, why, len) runs one named case ("layernorm_modulate",
 * "residual_layernorm_modulate", "residual_layernorm", "gated_residual",
 * "add_repeat", "rmsnorm_rope3d", "attention", "attention_shared_kv",
 * "timestep_embed", "cfg_combine", "euler", "patchify") over
 * several shapes, some whose parameter strides are not whole 16-byte chunks
 * and some whose width is not a multiple of 8 (the scalar paths); 0 when all
 * are bitwise equal, else -1 with the first difference in why. Only the
 * public API is used. */
#ifndef REEL_TESTS_ROW_GROUPS_CHECK_H
#define REEL_TESTS_ROW_GROUPS_CHECK_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    kern_dtype_t dt;
    void *owned[32];
    int n;
    uint64_t rng;
    char *why;
    size_t len;
} rg_ctx_t;

static int rg_fail(rg_ctx_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, c->len, fmt, ap);
    va_end(ap);
    return -1;
}

/* A device tensor of c's dtype filled from the generator (values in
 * [-1, 1), rounded to the dtype). NULL data (with why) on failure. */
static kern_tensor_t rg_tensor(rg_ctx_t *c, int ndim, const int64_t *shape, bool fill) {
    kern_tensor_t t = kern_tensor_alloc(c->b, c->dt, ndim, shape);
    if (!t.data || c->n >= 32) {
        rg_fail(c, "alloc: %s", reel_err_text());
        t.data = NULL;
        return t;
    }
    c->owned[c->n++] = t.data;
    if (!fill) return t;
    const int64_t n = kern_tensor_numel(&t);
    const size_t esz = kern_dtype_size(c->dt);
    unsigned char *h = malloc((size_t)n * esz);
    for (int64_t i = 0; h && i < n; i++) {
        c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)((double)(c->rng >> 40) / (double)(1ull << 23)) * 2.0f - 1.0f;
        if (c->dt == KERN_F32) memcpy(h + i * 4, &v, 4);
        else {
            uint16_t u = c->dt == KERN_BF16 ? kern_f32_to_bf16(v) : kern_f32_to_f16(v);
            memcpy(h + i * 2, &u, 2);
        }
    }
    if (!h || kern_copy_h2d(c->s, kern_tensor_ptr(&t), h, (size_t)n * esz) || kern_stream_sync(c->s)) {
        rg_fail(c, "upload: %s", h ? reel_err_text() : "out of memory");
        t.data = NULL;
    }
    free(h);
    return t;
}

/* dst = src's bytes (same shape), on the device. */
static int rg_copy(rg_ctx_t *c, kern_tensor_t *dst, const kern_tensor_t *src) {
    size_t n = kern_tensor_bytes(src);
    void *h = malloc(n);
    int rc = !h || kern_copy_d2h(c->s, h, kern_tensor_ptr(src), n) || kern_stream_sync(c->s) ||
             kern_copy_h2d(c->s, kern_tensor_ptr(dst), h, n) || kern_stream_sync(c->s);
    free(h);
    return rc ? rg_fail(c, "copy: %s", reel_err_text()) : 0;
}

/* 0 when a and b hold the same bytes, else -1 naming what and the first
 * differing element. */
static int rg_same(rg_ctx_t *c, const kern_tensor_t *a, const kern_tensor_t *b, const char *what) {
    size_t n = kern_tensor_bytes(a), esz = kern_dtype_size(c->dt);
    unsigned char *ha = malloc(n), *hb = malloc(n);
    int rc = !ha || !hb || kern_copy_d2h(c->s, ha, kern_tensor_ptr(a), n) ||
             kern_copy_d2h(c->s, hb, kern_tensor_ptr(b), n) || kern_stream_sync(c->s);
    if (rc) rg_fail(c, "%s: download: %s", what, reel_err_text());
    for (size_t i = 0; !rc && i < n; i += esz)
        if (memcmp(ha + i, hb + i, esz)) rc = rg_fail(c, "%s: element %zu differs from the per-group call's", what, i / esz);
    free(ha);
    free(hb);
    return rc ? -1 : 0;
}

/* Rows [r0, r0 + n) of a 2-D tensor. */
static kern_tensor_t rg_rows(const kern_tensor_t *t, int64_t r0, int64_t n) {
    kern_tensor_t v = kern_tensor_make(t->data, t->dtype, t->device, 2, (int64_t[]){ n, t->shape[1] });
    v.offset = t->offset + (size_t)(r0 * t->shape[1]) * kern_dtype_size(t->dtype);
    return v;
}

/* The [G, D] view of the first D columns of rows k, k + every, k +
 * 2·every, ... of a 2-D tensor (every sample's row k of a modulation block
 * of `every` rows; the tensor may be wider than D). */
static kern_tensor_t rg_every(const kern_tensor_t *t, int64_t k, int64_t every, int64_t G, int64_t D) {
    const int64_t W = t->shape[1];
    kern_tensor_t v = kern_tensor_make(t->data, t->dtype, t->device, 2, (int64_t[]){ G, D });
    v.offset = t->offset + (size_t)(k * W) * kern_dtype_size(t->dtype);
    v.stride[0] = every * W;
    return v;
}

/* Row r of a 2-D tensor cut to its first D columns, as a contiguous [D]. */
static kern_tensor_t rg_row(const kern_tensor_t *t, int64_t r, int64_t D) {
    kern_tensor_t v = kern_tensor_make(t->data, t->dtype, t->device, 1, (int64_t[]){ D });
    v.offset = t->offset + (size_t)(r * t->shape[1]) * kern_dtype_size(t->dtype);
    return v;
}

/* The row-wise cases, one shape: G groups of n rows of width D, the
 * parameters rows of a block of `every` rows per group, each row pad
 * values wider than D (so the row stride, every·(D + pad), need not be
 * whole 16-byte chunks while D is); share0: the first parameter (the
 * shift) shared by every group, [D], the others per group. */
static int rg_rowwise(rg_ctx_t *c, const char *name, int64_t G, int64_t n, int64_t D, int64_t every, int64_t pad,
                      bool share0) {
    char what[160];
    snprintf(what, sizeof what, "%s G=%lld n=%lld D=%lld stride=%lld%s", name, (long long)G, (long long)n,
             (long long)D, (long long)(every * (D + pad)), share0 ? " shared shift" : "");
    kern_tensor_t x = rg_tensor(c, 2, (int64_t[]){ G * n, D }, true);
    kern_tensor_t y = rg_tensor(c, 2, (int64_t[]){ G * n, D }, true);
    kern_tensor_t P = rg_tensor(c, 2, (int64_t[]){ G * every, D + pad }, true);
    kern_tensor_t w = rg_tensor(c, 1, (int64_t[]){ D }, true), bias = rg_tensor(c, 1, (int64_t[]){ D }, true);
    kern_tensor_t x1 = rg_tensor(c, 2, (int64_t[]){ G * n, D }, false), x2 = rg_tensor(c, 2, (int64_t[]){ G * n, D }, false);
    kern_tensor_t o1 = rg_tensor(c, 2, (int64_t[]){ G * n, D }, false), o2 = rg_tensor(c, 2, (int64_t[]){ G * n, D }, false);
    if (!x.data || !y.data || !P.data || !w.data || !bias.data || !x1.data || !x2.data || !o1.data || !o2.data) return -1;
    if (rg_copy(c, &x1, &x) || rg_copy(c, &x2, &x) || rg_copy(c, &o1, &y) || rg_copy(c, &o2, &y)) return -1;
    const int64_t k1 = 1 % every, k2 = every - 1; /* the parameters' rows in a group's block */
    kern_tensor_t p0 = share0 ? w : rg_every(&P, 0, every, G, D), p1 = rg_every(&P, k1, every, G, D),
                  p2 = rg_every(&P, k2, every, G, D);
    int rc = 0;
    const float eps = 1e-6f;
    /* the batch: one call */
    if (!strcmp(name, "layernorm_modulate")) rc = kern_layernorm_modulate(c->s, &x1, &p0, &p1, eps, &o1);
    else if (!strcmp(name, "residual_layernorm_modulate"))
        rc = kern_residual_layernorm_modulate(c->s, &x1, &y, &p2, &p0, &p1, eps, &o1);
    else if (!strcmp(name, "residual_layernorm")) rc = kern_residual_layernorm(c->s, &x1, &y, &p2, &w, &bias, eps, &o1);
    else rc = kern_gated_residual(c->s, &x1, &y, &p2);
    if (rc || kern_stream_sync(c->s)) return rg_fail(c, "%s: the batched call failed: %s", what, reel_err_text());
    /* group by group, each with its own rows as [D] */
    for (int64_t g = 0; g < G && !rc; g++) {
        kern_tensor_t xg = rg_rows(&x2, g * n, n), yg = rg_rows(&y, g * n, n), og = rg_rows(&o2, g * n, n);
        kern_tensor_t q0 = share0 ? w : rg_row(&P, g * every, D), q1 = rg_row(&P, g * every + k1, D),
                      q2 = rg_row(&P, g * every + k2, D);
        if (!strcmp(name, "layernorm_modulate")) rc = kern_layernorm_modulate(c->s, &xg, &q0, &q1, eps, &og);
        else if (!strcmp(name, "residual_layernorm_modulate"))
            rc = kern_residual_layernorm_modulate(c->s, &xg, &yg, &q2, &q0, &q1, eps, &og);
        else if (!strcmp(name, "residual_layernorm")) rc = kern_residual_layernorm(c->s, &xg, &yg, &q2, &w, &bias, eps, &og);
        else rc = kern_gated_residual(c->s, &xg, &yg, &q2);
    }
    if (rc || kern_stream_sync(c->s)) return rg_fail(c, "%s: a per-group call failed: %s", what, reel_err_text());
    char wx[200], wo[200];
    snprintf(wx, sizeof wx, "%s (x)", what);
    snprintf(wo, sizeof wo, "%s (out)", what);
    if (strcmp(name, "gated_residual") && rg_same(c, &o1, &o2, wo)) return -1;
    return rg_same(c, &x1, &x2, wx); /* the residual, stored in x */
}

static int rg_add_repeat(rg_ctx_t *c, int64_t G, int64_t K) {
    char what[96];
    snprintf(what, sizeof what, "add_repeat G=%lld K=%lld", (long long)G, (long long)K);
    kern_tensor_t a = rg_tensor(c, 1, (int64_t[]){ K }, true), b = rg_tensor(c, 2, (int64_t[]){ G, K }, true);
    kern_tensor_t y1 = rg_tensor(c, 2, (int64_t[]){ G, K }, false), y2 = rg_tensor(c, 2, (int64_t[]){ G, K }, false);
    if (!a.data || !b.data || !y1.data || !y2.data) return -1;
    int rc = kern_add_repeat(c->s, &a, &b, &y1);
    for (int64_t g = 0; g < G && !rc; g++) {
        kern_tensor_t bg = kern_tensor_row(&b, g), yg = kern_tensor_row(&y2, g);
        rc = kern_add(c->s, &a, &bg, &yg);
    }
    if (rc || kern_stream_sync(c->s)) return rg_fail(c, "%s: %s", what, reel_err_text());
    return rg_same(c, &y1, &y2, what);
}

static int rg_rope(rg_ctx_t *c, int64_t B, int64_t F, int64_t R, int64_t C, int64_t H, int64_t d) {
    char what[128];
    snprintf(what, sizeof what, "rmsnorm_rope3d B=%lld grid %lldx%lldx%lld heads %lld x %lld", (long long)B,
             (long long)F, (long long)R, (long long)C, (long long)H, (long long)d);
    const int64_t T = F * R * C;
    kern_tensor_t x = rg_tensor(c, 2, (int64_t[]){ B * T, H * d }, true), w = rg_tensor(c, 1, (int64_t[]){ H * d }, true);
    kern_tensor_t x2 = rg_tensor(c, 2, (int64_t[]){ B * T, H * d }, false);
    if (!x.data || !w.data || !x2.data || rg_copy(c, &x2, &x)) return -1;
    int rc = kern_rmsnorm_rope3d(c->s, &x, &w, 1e-6f, H, F, R, C);
    for (int64_t b = 0; b < B && !rc; b++) {
        kern_tensor_t xb = rg_rows(&x2, b * T, T);
        rc = kern_rmsnorm_rope3d(c->s, &xb, &w, 1e-6f, H, F, R, C);
    }
    if (rc || kern_stream_sync(c->s)) return rg_fail(c, "%s: %s", what, reel_err_text());
    return rg_same(c, &x, &x2, what);
}

static int rg_attention(rg_ctx_t *c, int64_t B, int64_t nq, int64_t nk, int64_t H, int64_t d, bool shared) {
    char what[128];
    snprintf(what, sizeof what, "attention B=%lld nq=%lld nk=%lld heads %lld x %lld%s", (long long)B,
             (long long)nq, (long long)nk, (long long)H, (long long)d, shared ? " shared k, v" : "");
    const int64_t kr = shared ? nk : B * nk;
    kern_tensor_t q = rg_tensor(c, 2, (int64_t[]){ B * nq, H * d }, true);
    kern_tensor_t k = rg_tensor(c, 2, (int64_t[]){ kr, H * d }, true), v = rg_tensor(c, 2, (int64_t[]){ kr, H * d }, true);
    kern_tensor_t o1 = rg_tensor(c, 2, (int64_t[]){ B * nq, H * d }, false), o2 = rg_tensor(c, 2, (int64_t[]){ B * nq, H * d }, false);
    if (!q.data || !k.data || !v.data || !o1.data || !o2.data) return -1;
    int rc = kern_attention_batch(c->s, &q, &k, &v, H, &o1, B, shared);
    for (int64_t b = 0; b < B && !rc; b++) {
        kern_tensor_t qb = rg_rows(&q, b * nq, nq), ob = rg_rows(&o2, b * nq, nq);
        kern_tensor_t kb = shared ? k : rg_rows(&k, b * nk, nk), vb = shared ? v : rg_rows(&v, b * nk, nk);
        rc = kern_attention(c->s, &qb, &kb, &vb, H, &ob);
    }
    if (rc || kern_stream_sync(c->s)) return rg_fail(c, "%s: %s", what, reel_err_text());
    return rg_same(c, &o1, &o2, what);
}

/* The per-step ops of S samples at once against each sample alone: the
 * timestep embedding by σ rows, the CFG combine and the Euler update with
 * each sample's guidance and σ, patchify and unpatchify of B latents. */
static int rg_step_ops(rg_ctx_t *c, const char *name, int64_t S, int64_t Cc, int64_t F, int64_t H, int64_t W) {
    char what[128];
    snprintf(what, sizeof what, "%s S=%lld latent [%lld,%lld,%lld,%lld]", name, (long long)S, (long long)Cc,
             (long long)F, (long long)H, (long long)W);
    const int64_t n = Cc * F * H * W, N = F * (H / 2) * (W / 2);
    int rc = 0;
    /* σ rows [S, 3] and guidance [S, 1] as the step keeps them: F32 in
     * device memory, each row its own (a schedule's values) */
    kern_tensor_t sig = kern_tensor_alloc(c->b, KERN_F32, 2, (int64_t[]){ S, 3 });
    kern_tensor_t g = kern_tensor_alloc(c->b, KERN_F32, 2, (int64_t[]){ S, 1 });
    if (!sig.data || !g.data || c->n + 2 > 32) return rg_fail(c, "alloc: %s", reel_err_text());
    c->owned[c->n++] = sig.data;
    c->owned[c->n++] = g.data;
    float hs[3 * 64], hg[64];
    for (int64_t b = 0; b < S && b < 64; b++) {
        /* every sample its own step size, so a kernel reading row 0's
         * σ for every sample differs in most elements */
        hs[3 * b] = 0.95f - 0.07f * (float)b, hs[3 * b + 1] = hs[3 * b] - 0.03f * (float)(b + 1), hs[3 * b + 2] = 0.99f;
        hg[b] = 1.5f + 0.75f * (float)b;
    }
    if (S > 64 || kern_copy_h2d(c->s, kern_tensor_ptr(&sig), hs, (size_t)S * 12) ||
        kern_copy_h2d(c->s, kern_tensor_ptr(&g), hg, (size_t)S * 4) || kern_stream_sync(c->s))
        return rg_fail(c, "%s: scalars: %s", what, reel_err_text());
    if (!strcmp(name, "timestep_embed")) {
        const int64_t dim = 2 * W + 6; /* any even width */
        kern_tensor_t e1 = rg_tensor(c, 2, (int64_t[]){ S, dim }, false), e2 = rg_tensor(c, 2, (int64_t[]){ S, dim }, false);
        if (!e1.data || !e2.data) return -1;
        rc = kern_timestep_embed_rows(c->s, &sig, &e1);
        for (int64_t b = 0; b < S && !rc; b++) {
            kern_tensor_t sb = kern_tensor_row(&sig, b), eb = kern_tensor_row(&e2, b);
            rc = kern_timestep_embed(c->s, &sb, &eb);
        }
        if (rc || kern_stream_sync(c->s)) return rg_fail(c, "%s: %s", what, reel_err_text());
        return rg_same(c, &e1, &e2, what);
    }
    if (!strcmp(name, "cfg_combine") || !strcmp(name, "euler")) {
        const bool cfg = !strcmp(name, "cfg_combine");
        kern_tensor_t a = rg_tensor(c, 2, (int64_t[]){ S, n }, true), v = rg_tensor(c, 2, (int64_t[]){ S, n }, true);
        kern_tensor_t y1 = rg_tensor(c, 2, (int64_t[]){ S, n }, true), y2 = rg_tensor(c, 2, (int64_t[]){ S, n }, false);
        if (!a.data || !v.data || !y1.data || !y2.data || rg_copy(c, &y2, &y1)) return -1;
        rc = cfg ? kern_cfg_combine_rows(c->s, &a, &v, &g, &y1) : kern_euler_update_rows(c->s, &y1, &v, &sig);
        for (int64_t b = 0; b < S && !rc; b++) {
            kern_tensor_t ab = kern_tensor_row(&a, b), vb = kern_tensor_row(&v, b), yb = kern_tensor_row(&y2, b);
            kern_tensor_t gb = kern_tensor_row(&g, b), sb = kern_tensor_row(&sig, b);
            rc = cfg ? kern_cfg_combine(c->s, &ab, &vb, &gb, &yb) : kern_euler_update(c->s, &yb, &vb, &sb);
        }
        if (rc || kern_stream_sync(c->s)) return rg_fail(c, "%s: %s", what, reel_err_text());
        return rg_same(c, &y1, &y2, what);
    }
    /* patchify, then unpatchify back */
    kern_tensor_t lat = rg_tensor(c, 5, (int64_t[]){ S, Cc, F, H, W }, true);
    kern_tensor_t t1 = rg_tensor(c, 2, (int64_t[]){ S * N, 4 * Cc }, false), t2 = rg_tensor(c, 2, (int64_t[]){ S * N, 4 * Cc }, false);
    kern_tensor_t l1 = rg_tensor(c, 5, (int64_t[]){ S, Cc, F, H, W }, false), l2 = rg_tensor(c, 5, (int64_t[]){ S, Cc, F, H, W }, false);
    if (!lat.data || !t1.data || !t2.data || !l1.data || !l2.data) return -1;
    rc = kern_patchify(c->s, &lat, &t1) || kern_unpatchify(c->s, &t1, &l1);
    for (int64_t b = 0; b < S && !rc; b++) {
        kern_tensor_t lb = kern_tensor_row(&lat, b), tb = rg_rows(&t2, b * N, N), ob = kern_tensor_row(&l2, b);
        rc = kern_patchify(c->s, &lb, &tb) || kern_unpatchify(c->s, &tb, &ob);
    }
    if (rc || kern_stream_sync(c->s)) return rg_fail(c, "%s: %s", what, reel_err_text());
    /* (not a round trip: the two token orders differ by design, TINYDIT.md) */
    if (rg_same(c, &t1, &t2, "patchify of a batch")) return -1;
    return rg_same(c, &l1, &l2, "unpatchify of a batch");
}

static void rg_release(rg_ctx_t *c) {
    if (c->s) (void)kern_stream_sync(c->s);
    for (int i = 0; i < c->n; i++) kern_free(c->b, c->owned[i]);
    c->n = 0;
}

static int rg_check(kern_backend_t *b, kern_stream_t *s, kern_dtype_t dt, const char *name, char *why, size_t len) {
    rg_ctx_t c = { .b = b, .s = s, .dt = dt, .rng = 0x2545F4914F6CDD1Dull, .why = why, .len = len };
    int rc = 0;
    why[0] = 0;
    if (kern_stream_reserve(s, (size_t)16 << 20)) return rg_fail(&c, "reserve: %s", reel_err_text());
    /* (G, n, D, every, pad, share0): the step's block (6 rows), its head
     * (1 row: a contiguous [G, D]), widths off the 16-byte paths, strides
     * off them with widths on them (the CUDA norms' group-by-group way),
     * one group, a shift shared with per-group scales */
    static const int64_t rows[][6] = { { 3, 5, 64, 6, 0, 0 }, { 8, 32, 64, 6, 0, 0 }, { 4, 3, 20, 3, 0, 0 },
                                       { 2, 7, 36, 1, 0, 0 }, { 5, 2, 64, 1, 0, 0 }, { 1, 4, 64, 6, 0, 0 },
                                       { 4, 5, 64, 3, 4, 0 }, { 3, 2, 64, 1, 4, 0 }, { 3, 4, 64, 6, 0, 1 },
                                       { 2, 3, 64, 1, 1, 1 } };
    /* each shape's tensors are released before the next */
#define RG_ONE(call) do { if (!rc) rc = (call); rg_release(&c); } while (0)
    if (!strcmp(name, "add_repeat")) {
        RG_ONE(rg_add_repeat(&c, 6, 384));
        RG_ONE(rg_add_repeat(&c, 3, 20));
        RG_ONE(rg_add_repeat(&c, 8, 5000));
    } else if (!strcmp(name, "rmsnorm_rope3d")) {
        RG_ONE(rg_rope(&c, 3, 2, 4, 4, 4, 16));
        RG_ONE(rg_rope(&c, 8, 1, 2, 3, 2, 12));
        RG_ONE(rg_rope(&c, 2, 3, 2, 2, 1, 8));
        RG_ONE(rg_rope(&c, 2, 1, 2, 2, 3, 6)); /* a row of 18: off the 16-byte path */
    } else if (!strcmp(name, "attention") || !strcmp(name, "attention_shared_kv")) {
        const bool sh = !strcmp(name, "attention_shared_kv");
        /* direct, whole rows, flash-style (the CPU's ways); small and
         * ragged tiles on CUDA */
        RG_ONE(rg_attention(&c, 4, 32, 32, 4, 16, sh));
        RG_ONE(rg_attention(&c, 3, 17, 100, 2, 24, sh));
        RG_ONE(rg_attention(&c, 2, 1100, 1000, 1, 8, sh));
        RG_ONE(rg_attention(&c, 8, 5, 7, 3, 64, sh));
        RG_ONE(rg_attention(&c, 8, 64, 64, 4, 16, sh)); /* one sample below the CPU's thread threshold, the batch above */
    } else if (!strcmp(name, "timestep_embed") || !strcmp(name, "cfg_combine") || !strcmp(name, "euler") ||
               !strcmp(name, "patchify")) {
        RG_ONE(rg_step_ops(&c, name, 5, 4, 2, 8, 8));
        RG_ONE(rg_step_ops(&c, name, 2, 3, 1, 6, 10));
        RG_ONE(rg_step_ops(&c, name, 1, 4, 2, 4, 4));
    } else if (!strcmp(name, "layernorm_modulate") || !strcmp(name, "residual_layernorm_modulate") ||
               !strcmp(name, "residual_layernorm") || !strcmp(name, "gated_residual")) {
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            RG_ONE(rg_rowwise(&c, name, rows[i][0], rows[i][1], rows[i][2], rows[i][3], rows[i][4], rows[i][5] != 0));
    } else {
        rc = rg_fail(&c, "no case named %s", name);
    }
#undef RG_ONE
    return rc;
}

#endif
