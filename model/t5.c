/* t5.c -- the umT5 encoder as Wan2.1 runs it (t5.h): configs, the check
 * of a checkpoint's names and shapes, loading onto a backend, encoding, and
 * random weights under the release's names.
 *
 * Every matrix product is kern_gemm (the gate's with its GELU, kern_gemm_gelu),
 * the norms are kern_rmsnorm (T5's norm is RMSNorm: x·rsqrt(mean(x²) + eps)·w),
 * the gated product kern_mul, the residuals kern_add and attention
 * kern_attention_bias with scale 1. The relative-position bias depends only
 * on the offset j − i, so each layer's bias is a [heads, 2L − 1] table the
 * host fills from its small [buckets, heads] embedding (kept on the host)
 * and uploads once per encode. */
#include "t5.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "kernels/philox.h"
#include "base/error.h"
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T5_EPS 1e-6f
#define T5_MAX_LEN ((int64_t)1 << 16) /* longest sequence t5_encode runs */
#define T5_CHUNK ((int64_t)1 << 20)   /* elements converted per upload */

static const t5_config_t builtins[] = {
    { "umt5-xxl", 256384, 4096, 4096, 10240, 64, 24, 32, 128 },
    { "t5-tiny", 320, 32, 32, 64, 4, 2, 32, 128 },
    { "t5-small", 1000, 256, 256, 512, 4, 4, 32, 128 },
};
#define N_BUILTINS (sizeof builtins / sizeof builtins[0])

int t5_config_builtin(const char *name, t5_config_t *out) {
    for (size_t i = 0; i < N_BUILTINS; i++)
        if (name && !strcmp(name, builtins[i].name)) {
            *out = builtins[i];
            return 0;
        }
    return reel_fail(REEL_E_NOT_FOUND, "t5 config '%.40s': not one of umt5-xxl, t5-tiny, t5-small",
                     name ? name : "(null)");
}

int t5_config_validate(const t5_config_t *c) {
    if (c->vocab < 1 || c->vocab > INT32_MAX || c->dim < 1 || c->dim_attn < 1 || c->dim_ffn < 1 ||
        c->heads < 1 || c->layers < 1)
        return reel_fail(REEL_E_INVALID, "t5 config %s: vocab, dim, dim_attn, dim_ffn, heads and layers must be >= 1"
                         " (vocab within int32)", c->name);
    if (c->dim_attn % c->heads)
        return reel_fail(REEL_E_INVALID, "t5 config %s: dim_attn %" PRId64 " is not a multiple of %" PRId64 " heads",
                         c->name, c->dim_attn, c->heads);
    /* the log buckets need max_exact = buckets/4 >= 1 and max_dist above it */
    if (c->buckets < 4 || c->max_dist <= c->buckets / 4)
        return reel_fail(REEL_E_INVALID, "t5 config %s: %" PRId64 " buckets, max_dist %" PRId64
                         " (needs buckets >= 4 and max_dist > buckets/4)", c->name, c->buckets, c->max_dist);
    return 0;
}

int64_t t5_bucket(int64_t rel, int64_t buckets, int64_t max_dist) {
    const int64_t nb = buckets / 2, max_exact = nb / 2;
    int64_t b = rel > 0 ? nb : 0;
    int64_t a = rel < 0 ? -rel : rel;
    if (a < max_exact) return b + a;
    /* torch's arithmetic: float32 log of a float32 ratio, divided by the
     * float32 of Python's double log, times an int, truncated (.long()) */
    float t = logf((float)a / (float)max_exact);
    t = t / (float)log((double)max_dist / (double)max_exact);
    t = t * (float)(nb - max_exact);
    int64_t large = max_exact + (int64_t)t;
    return b + (large < nb - 1 ? large : nb - 1);
}

/* ---- names and shapes ------------------------------------------------------ */

typedef struct {
    char name[64];
    int ndim;
    int64_t shape[2];
} t5_entry_t;

/* The tensors of config c in the state dict's order; *n set. NULL when out
 * of memory (message set). */
static t5_entry_t *t5_entries(const t5_config_t *c, size_t *n) {
    size_t cnt = 2 + 10 * (size_t)c->layers, k = 0;
    t5_entry_t *e = calloc(cnt, sizeof *e);
    if (!e) {
        reel_fail(REEL_E_NOMEM, "out of memory listing t5 tensors");
        return NULL;
    }
#define ADD(nd, d0, d1, ...)                                                    \
    do {                                                                        \
        snprintf(e[k].name, sizeof e[k].name, __VA_ARGS__);                     \
        e[k].ndim = nd;                                                         \
        e[k].shape[0] = d0;                                                     \
        e[k].shape[1] = d1;                                                     \
        k++;                                                                    \
    } while (0)
    ADD(2, c->vocab, c->dim, "token_embedding.weight");
    for (int64_t l = 0; l < c->layers; l++) {
        ADD(1, c->dim, 0, "blocks.%" PRId64 ".norm1.weight", l);
        ADD(2, c->dim_attn, c->dim, "blocks.%" PRId64 ".attn.q.weight", l);
        ADD(2, c->dim_attn, c->dim, "blocks.%" PRId64 ".attn.k.weight", l);
        ADD(2, c->dim_attn, c->dim, "blocks.%" PRId64 ".attn.v.weight", l);
        ADD(2, c->dim, c->dim_attn, "blocks.%" PRId64 ".attn.o.weight", l);
        ADD(1, c->dim, 0, "blocks.%" PRId64 ".norm2.weight", l);
        ADD(2, c->dim_ffn, c->dim, "blocks.%" PRId64 ".ffn.gate.0.weight", l);
        ADD(2, c->dim_ffn, c->dim, "blocks.%" PRId64 ".ffn.fc1.weight", l);
        ADD(2, c->dim, c->dim_ffn, "blocks.%" PRId64 ".ffn.fc2.weight", l);
        ADD(2, c->buckets, c->heads, "blocks.%" PRId64 ".pos_embedding.embedding.weight", l);
    }
    ADD(1, c->dim, 0, "norm.weight");
#undef ADD
    *n = k;
    return e;
}

/* The tensor `name` of f with rank ndim, or NULL with a message naming it. */
static const st_tensor_t *need(const st_file_t *f, const char *name, int ndim) {
    const st_tensor_t *t = st_find(f, name);
    if (!t) {
        reel_fail(REEL_E_INVALID, "%s: no tensor %s: not a umT5 encoder checkpoint", st_origin(f), name);
        return NULL;
    }
    if (t->ndim != ndim) {
        char s[64];
        reel_fail(REEL_E_INVALID, "%s: %s has shape %s, expected rank %d", st_origin(f), name,
                  kern_shape_text(t->ndim, t->shape, s, sizeof s), ndim);
        return NULL;
    }
    return t;
}

/* Checks that f holds exactly c's tensors with c's shapes. */
static int check_file(const st_file_t *f, const t5_config_t *c) {
    size_t n;
    t5_entry_t *e = t5_entries(c, &n);
    if (!e) return -1;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const st_tensor_t *t = st_find(f, e[i].name);
        char got[64], want[64];
        if (!t) {
            rc = reel_fail(REEL_E_INVALID, "%s: no tensor %s (config %s has %" PRId64 " layers)", st_origin(f),
                           e[i].name, c->name, c->layers);
        } else if (t->ndim != e[i].ndim || t->shape[0] != e[i].shape[0] ||
                   (e[i].ndim == 2 && t->shape[1] != e[i].shape[1])) {
            rc = reel_fail(REEL_E_INVALID, "%s: %s has shape %s, expected %s", st_origin(f), e[i].name,
                           kern_shape_text(t->ndim, t->shape, got, sizeof got),
                           kern_shape_text(e[i].ndim, e[i].shape, want, sizeof want));
        }
    }
    /* names beyond the list: a decoder's, a misspelling, a layer too many */
    if (!rc && st_count(f) != n)
        for (size_t i = 0; i < st_count(f) && !rc; i++) {
            const char *nm = st_at(f, i)->name;
            bool known = false;
            for (size_t j = 0; j < n && !known; j++) known = !strcmp(nm, e[j].name);
            if (!known)
                rc = reel_fail(REEL_E_INVALID, "%s: unexpected tensor %s (not one of a %" PRId64
                               "-layer umT5 encoder's)", st_origin(f), nm, c->layers);
        }
    free(e);
    return rc;
}

int t5_config_from_weights(const st_file_t *f, t5_config_t *out) {
    t5_config_t c = { .max_dist = 128 };
    const st_tensor_t *emb = need(f, "token_embedding.weight", 2);
    const st_tensor_t *q = emb ? need(f, "blocks.0.attn.q.weight", 2) : NULL;
    const st_tensor_t *fc1 = q ? need(f, "blocks.0.ffn.fc1.weight", 2) : NULL;
    const st_tensor_t *pos = fc1 ? need(f, "blocks.0.pos_embedding.embedding.weight", 2) : NULL;
    if (!pos) return -1;
    c.vocab = emb->shape[0];
    c.dim = emb->shape[1];
    c.dim_attn = q->shape[0];
    c.dim_ffn = fc1->shape[0];
    c.buckets = pos->shape[0];
    c.heads = pos->shape[1];
    char nm[64];
    for (c.layers = 0;; c.layers++) {
        snprintf(nm, sizeof nm, "blocks.%" PRId64 ".norm1.weight", c.layers);
        if (!st_find(f, nm)) break;
    }
    snprintf(c.name, sizeof c.name, "custom");
    for (size_t i = 0; i < N_BUILTINS; i++) {
        t5_config_t b = builtins[i];
        memcpy(b.name, c.name, sizeof b.name);
        if (!memcmp(&b, &c, sizeof b)) memcpy(c.name, builtins[i].name, sizeof c.name);
    }
    if (t5_config_validate(&c)) return reel_fail_prefix("%s: ", st_origin(f));
    if (check_file(f, &c)) return -1;
    *out = c;
    return 0;
}

/* ---- the model ------------------------------------------------------------- */

typedef struct {
    kern_tensor_t norm1, q, k, v, o, norm2, gate, fc1, fc2;
} t5_block_t;

struct t5_model {
    kern_backend_t *b;
    t5_config_t c;
    kern_dtype_t dt;
    kern_tensor_t emb, norm;
    t5_block_t *blk;
    float *pos; /* host: [layers][buckets][heads], F32 */
    size_t bytes;
};

/* Element i of t (any alignment) as float. */
static float elem_f32(const st_tensor_t *t, int64_t i) {
    if (t->dtype == KERN_F32) {
        float v;
        memcpy(&v, (const char *)t->data + i * 4, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, (const char *)t->data + i * 2, 2);
    return t->dtype == KERN_BF16 ? kern_bf16_to_f32(h) : kern_f16_to_f32(h);
}

/* Uploads tensor `name` of f (checked by check_file) into a new device
 * tensor *dst in dtype dt, converted in chunks so no host copy of a whole
 * tensor (the 2 GB embedding) is made. */
static int upload(t5_model_t *m, kern_stream_t *s, const st_file_t *f, const char *name,
                  kern_tensor_t *dst) {
    const st_tensor_t *t = st_find(f, name);
    *dst = kern_tensor_alloc(m->b, m->dt, t->ndim, t->shape);
    if (!dst->data) return reel_fail_prefix("t5: no device memory for %s: ", name);
    m->bytes += kern_tensor_bytes(dst);
    int64_t n = kern_tensor_numel(dst);
    size_t es = kern_dtype_size(m->dt);
    void *buf = malloc((size_t)(n < T5_CHUNK ? n : T5_CHUNK) * es);
    if (!buf) return reel_fail(REEL_E_NOMEM, "t5: out of memory converting %s", name);
    int rc = 0;
    for (int64_t i0 = 0; i0 < n && !rc; i0 += T5_CHUNK) {
        int64_t cnt = n - i0 < T5_CHUNK ? n - i0 : T5_CHUNK;
        for (int64_t i = 0; i < cnt && !rc; i++) {
            float v = elem_f32(t, i0 + i);
            if (!isfinite(v))
                rc = reel_fail(REEL_E_INVALID, "%s: t5 tensor %s holds %s at element %" PRId64
                               " (the encoder would write a context of NaN)", st_origin(f), name,
                               isnan(v) ? "a NaN" : "an infinity", i0 + i);
            else if (m->dt == KERN_F32) ((float *)buf)[i] = v;
            else if (!isfinite(kern_bf16_to_f32(((uint16_t *)buf)[i] = kern_f32_to_bf16(v))))
                rc = reel_fail(REEL_E_INVALID, "%s: t5 tensor %s: element %" PRId64 " (%g) is past BF16's "
                               "largest value (load the encoder in F32)", st_origin(f), name, i0 + i, (double)v);
        }
        if (rc) break;
        rc = kern_copy_h2d(s, (char *)kern_tensor_ptr(dst) + (size_t)i0 * es, buf, (size_t)cnt * es);
        if (!rc) rc = kern_stream_sync(s); /* buf is reused by the next chunk */
    }
    free(buf);
    return rc;
}

t5_model_t *t5_model_load(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype) {
    if (dtype != KERN_F32 && dtype != KERN_BF16) {
        reel_fail(REEL_E_INVALID, "t5: dtype %s: F32 or BF16 only", kern_dtype_name(dtype));
        return NULL;
    }
    const kern_op_t ops[] = { KERN_OP_GEMM, KERN_OP_GEMM_GELU, KERN_OP_RMSNORM, KERN_OP_ADD,
                              KERN_OP_MUL, KERN_OP_ATTENTION_BIAS };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!kern_registry_lookup(ops[i], kern_backend_kind(b), dtype)) {
            reel_fail(REEL_E_UNSUPPORTED, "t5: no %s kernel for %s on %s (load the encoder in F32)",
                      kern_op_name(ops[i]), kern_dtype_name(dtype), kern_backend_device_name(b));
            return NULL;
        }
    t5_model_t *m = calloc(1, sizeof *m);
    kern_stream_t *s = NULL;
    if (!m) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    m->b = b;
    m->dt = dtype;
    if (t5_config_from_weights(f, &m->c)) goto err;
    const t5_config_t *c = &m->c;
    m->blk = calloc((size_t)c->layers, sizeof *m->blk);
    m->pos = malloc((size_t)(c->layers * c->buckets * c->heads) * sizeof *m->pos);
    if (!m->blk || !m->pos) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto err;
    }
    s = kern_stream_new(b);
    if (!s) goto err;
    if (upload(m, s, f, "token_embedding.weight", &m->emb) || upload(m, s, f, "norm.weight", &m->norm)) goto err;
    for (int64_t l = 0; l < c->layers; l++) {
        t5_block_t *k = &m->blk[l];
        struct { const char *suffix; kern_tensor_t *t; } w[] = {
            { "norm1.weight", &k->norm1 }, { "attn.q.weight", &k->q }, { "attn.k.weight", &k->k },
            { "attn.v.weight", &k->v }, { "attn.o.weight", &k->o }, { "norm2.weight", &k->norm2 },
            { "ffn.gate.0.weight", &k->gate }, { "ffn.fc1.weight", &k->fc1 }, { "ffn.fc2.weight", &k->fc2 },
        };
        char nm[96];
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
            snprintf(nm, sizeof nm, "blocks.%" PRId64 ".%s", l, w[i].suffix);
            if (upload(m, s, f, nm, w[i].t)) goto err;
        }
        snprintf(nm, sizeof nm, "blocks.%" PRId64 ".pos_embedding.embedding.weight", l);
        float *pos = m->pos + l * c->buckets * c->heads;
        if (st_read_f32(f, nm, 2, (const int64_t[]){ c->buckets, c->heads }, pos)) goto err;
        if (!kern_all_finite(pos, (size_t)(c->buckets * c->heads), KERN_F32)) {
            reel_fail(REEL_E_INVALID, "%s: t5 tensor %s holds a NaN or an infinity", st_origin(f), nm);
            goto err;
        }
    }
    kern_stream_destroy(&s);
    return m;
err:
    kern_stream_destroy(&s);
    t5_model_destroy(&m);
    return NULL;
}

void t5_model_destroy(t5_model_t **mp) {
    if (!mp || !*mp) return;
    t5_model_t *m = *mp;
    kern_free(m->b, m->emb.data);
    kern_free(m->b, m->norm.data);
    if (m->blk)
        for (int64_t l = 0; l < m->c.layers; l++) {
            t5_block_t *k = &m->blk[l];
            kern_tensor_t *all[] = { &k->norm1, &k->q, &k->k, &k->v, &k->o, &k->norm2, &k->gate, &k->fc1, &k->fc2 };
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kern_free(m->b, all[i]->data);
        }
    free(m->blk);
    free(m->pos);
    free(m);
    *mp = NULL;
}

const t5_config_t *t5_model_config(const t5_model_t *m) { return &m->c; }

size_t t5_model_bytes(const t5_model_t *m) { return m->bytes; }

kern_dtype_t t5_model_dtype(const t5_model_t *m) { return m->dt; }

/* ---- encoding -------------------------------------------------------------- */

/* The activations of one encode at length L. */
typedef struct {
    kern_tensor_t x, h, q, k, v, a, f1, f2, rel;
} t5_acts_t;

static void acts_free(kern_backend_t *b, t5_acts_t *a) {
    kern_tensor_t *all[] = { &a->x, &a->h, &a->q, &a->k, &a->v, &a->a, &a->f1, &a->f2, &a->rel };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        kern_free(b, all[i]->data);
        all[i]->data = NULL;
    }
}

static int acts_alloc(t5_model_t *m, int64_t L, t5_acts_t *a) {
    const t5_config_t *c = &m->c;
    memset(a, 0, sizeof *a);
    a->x = kern_tensor_alloc(m->b, m->dt, 2, (const int64_t[]){ L, c->dim });
    a->h = kern_tensor_alloc(m->b, m->dt, 2, (const int64_t[]){ L, c->dim });
    a->q = kern_tensor_alloc(m->b, m->dt, 2, (const int64_t[]){ L, c->dim_attn });
    a->k = kern_tensor_alloc(m->b, m->dt, 2, (const int64_t[]){ L, c->dim_attn });
    a->v = kern_tensor_alloc(m->b, m->dt, 2, (const int64_t[]){ L, c->dim_attn });
    a->a = kern_tensor_alloc(m->b, m->dt, 2, (const int64_t[]){ L, c->dim_attn });
    a->f1 = kern_tensor_alloc(m->b, m->dt, 2, (const int64_t[]){ L, c->dim_ffn });
    a->f2 = kern_tensor_alloc(m->b, m->dt, 2, (const int64_t[]){ L, c->dim_ffn });
    a->rel = kern_tensor_alloc(m->b, KERN_F32, 3, (const int64_t[]){ c->layers, c->heads, 2 * L - 1 });
    kern_tensor_t *all[] = { &a->x, &a->h, &a->q, &a->k, &a->v, &a->a, &a->f1, &a->f2, &a->rel };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!all[i]->data) {
            acts_free(m->b, a);
            return reel_fail_prefix("t5: no device memory for the activations at length %" PRId64 ": ", L);
        }
    return 0;
}

/* Layer l's bias as a view of rel: [heads, 2L − 1]. */
static kern_tensor_t rel_of(const t5_acts_t *a, int64_t l) {
    kern_tensor_t t = kern_tensor_make(a->rel.data, KERN_F32, a->rel.device, 2,
                                       (const int64_t[]){ a->rel.shape[1], a->rel.shape[2] });
    t.offset = a->rel.offset + (size_t)(l * a->rel.shape[1] * a->rel.shape[2]) * sizeof(float);
    return t;
}

/* One block: x += o(attn(n1)); x += fc2(fc1(n2)·gelu(gate(n2))). */
static int block(t5_model_t *m, kern_stream_t *s, t5_acts_t *a, int64_t l, int64_t n) {
    const t5_block_t *k = &m->blk[l];
    kern_tensor_t rel = rel_of(a, l);
    if (kern_rmsnorm(s, &a->x, &k->norm1, T5_EPS, &a->h) || kern_gemm(s, &a->h, &k->q, NULL, &a->q) ||
        kern_gemm(s, &a->h, &k->k, NULL, &a->k) || kern_gemm(s, &a->h, &k->v, NULL, &a->v) ||
        kern_attention_bias(s, &a->q, &a->k, &a->v, &rel, m->c.heads, n, 1.0f, &a->a) ||
        kern_gemm(s, &a->a, &k->o, NULL, &a->h) || kern_add(s, &a->x, &a->h, &a->x))
        return -1;
    if (kern_rmsnorm(s, &a->x, &k->norm2, T5_EPS, &a->h) || kern_gemm(s, &a->h, &k->fc1, NULL, &a->f1) ||
        kern_gemm_gelu(s, &a->h, &k->gate, NULL, &a->f2) || kern_mul(s, &a->f1, &a->f2, &a->f1) ||
        kern_gemm(s, &a->f1, &k->fc2, NULL, &a->h) || kern_add(s, &a->x, &a->h, &a->x))
        return -1;
    return 0;
}

int t5_encode(t5_model_t *m, kern_stream_t *s, const int32_t *ids, int64_t n, int64_t pad_to, float *out) {
    const t5_config_t *c = &m->c;
    if (n < 1 || n > T5_MAX_LEN)
        return reel_fail(REEL_E_INVALID, "t5: %" PRId64 " ids (needs 1..%" PRId64 ")", n, T5_MAX_LEN);
    if (pad_to != 0 && (pad_to < n || pad_to > T5_MAX_LEN))
        return reel_fail(REEL_E_INVALID, "t5: pad to %" PRId64 " for %" PRId64 " ids (needs n..%" PRId64 ", or 0)",
                         pad_to, n, T5_MAX_LEN);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return reel_fail(REEL_E_INVALID, "t5: id %" PRId32 " at position %" PRId64 " is outside the vocabulary"
                             " of %" PRId64, ids[i], i, c->vocab);
    const int64_t L = pad_to ? pad_to : n, R = 2 * L - 1;
    const size_t es = kern_dtype_size(m->dt), row = (size_t)c->dim * es;
    t5_acts_t a;
    if (acts_alloc(m, L, &a)) return -1;
    float *rel = malloc((size_t)(c->layers * c->heads * R) * sizeof *rel);
    int64_t *bk = malloc((size_t)R * sizeof *bk);
    void *host = malloc((size_t)n * row);
    int rc = -1;
    if (!rel || !bk || !host) {
        reel_fail(REEL_E_NOMEM, "t5: out of memory encoding %" PRId64 " tokens", L);
        goto out;
    }
    /* bias[l][h][r + L − 1] = pos[l][bucket(r)][h], r = j − i */
    for (int64_t r = 0; r < R; r++) bk[r] = t5_bucket(r - (L - 1), c->buckets, c->max_dist);
    for (int64_t l = 0; l < c->layers; l++)
        for (int64_t h = 0; h < c->heads; h++)
            for (int64_t r = 0; r < R; r++)
                rel[(l * c->heads + h) * R + r] = m->pos[(l * c->buckets + bk[r]) * c->heads + h];
    if (kern_copy_h2d(s, kern_tensor_ptr(&a.rel), rel, kern_tensor_bytes(&a.rel))) goto out;
    /* padding is token 0, as Wan's tokenizer pads; the mask keeps it out of
     * every real row */
    for (int64_t i = 0; i < L; i++) {
        int64_t id = i < n ? ids[i] : 0;
        if (kern_copy_d2d(s, (char *)kern_tensor_ptr(&a.x) + (size_t)i * row,
                          (const char *)kern_tensor_ptr(&m->emb) + (size_t)id * row, row))
            goto out;
    }
    for (int64_t l = 0; l < c->layers; l++)
        if (block(m, s, &a, l, n)) goto out;
    if (kern_rmsnorm(s, &a.x, &m->norm, T5_EPS, &a.h)) goto out;
    if (kern_copy_d2h(s, host, kern_tensor_ptr(&a.h), (size_t)n * row) || kern_stream_sync(s)) goto out;
    int64_t cnt = n * c->dim;
    if (m->dt == KERN_F32) memcpy(out, host, (size_t)cnt * sizeof(float));
    else
        for (int64_t i = 0; i < cnt; i++) out[i] = kern_bf16_to_f32(((const uint16_t *)host)[i]);
    rc = 0;
out:
    if (rc) (void)kern_stream_sync(s); /* nothing queued may outlive the buffers */
    free(rel);
    free(bk);
    free(host);
    acts_free(m->b, &a);
    return rc;
}

/* ---- random weights -------------------------------------------------------- */

int t5_weights_init(const t5_config_t *c, uint64_t seed, kern_dtype_t dtype, const char *path) {
    if (dtype != KERN_F32 && dtype != KERN_BF16)
        return reel_fail(REEL_E_INVALID, "t5 weights: dtype %s: F32 or BF16 only", kern_dtype_name(dtype));
    if (t5_config_validate(c)) return -1;
    size_t n;
    t5_entry_t *e = t5_entries(c, &n);
    if (!e) return -1;
    st_writer_t *w = st_writer_new();
    float *buf = NULL;
    uint16_t *half = NULL;
    int rc = -1;
    if (!w) goto out;
    for (size_t i = 0; i < n; i++) {
        int64_t cnt = e[i].shape[0] * (e[i].ndim == 2 ? e[i].shape[1] : 1);
        float *nb = realloc(buf, (size_t)cnt * sizeof *buf);
        uint16_t *nh = dtype == KERN_BF16 ? realloc(half, (size_t)cnt * sizeof *half) : half;
        if (!nb || (dtype == KERN_BF16 && !nh)) {
            if (nb) buf = nb;
            if (nh) half = nh;
            reel_fail(REEL_E_NOMEM, "out of memory initialising %s", e[i].name);
            goto out;
        }
        buf = nb;
        half = nh;
        /* Fan-in scaled normals, each tensor its own Philox stream (seed, i).
         * Norm weights scatter around 1 and the position embedding is wide
         * (std 0.5), so a test sees a wrong norm, bucket or mask. */
        const char *nm = e[i].name;
        bool is_norm = strstr(nm, "norm") && e[i].ndim == 1;
        bool is_pos = strstr(nm, "pos_embedding") != NULL;
        double std = !strcmp(nm, "token_embedding.weight") ? 1.0
                   : is_pos ? 0.5
                   : is_norm ? 0.1
                   : 1.0 / sqrt((double)e[i].shape[1]);
        for (int64_t j = 0; j < cnt; j++) {
            double z = std * kern_philox_normal(seed, (uint32_t)i, (uint64_t)j);
            buf[j] = (float)(is_norm ? 1.0 + z : z);
            if (dtype == KERN_BF16) half[j] = kern_f32_to_bf16(buf[j]);
        }
        if (st_writer_add(w, nm, dtype, e[i].ndim, e[i].shape, dtype == KERN_BF16 ? (const void *)half : buf))
            goto out;
    }
    char v[32];
    snprintf(v, sizeof v, "%" PRIu64, seed);
    if (st_writer_meta(w, "t5_config", c->name) || st_writer_meta(w, "init_seed", v)) goto out;
    rc = st_writer_save(w, path);
out:
    free(buf);
    free(half);
    free(e);
    st_writer_destroy(&w);
    return rc;
}
