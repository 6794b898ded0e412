/* tinydit.c -- configs, weights and the forward pass of the Wan2.1-style DiT
 * (../shared/TINYDIT.md is the specification; section numbers below refer
 * to its "Forward" list).
 *
 * All weights live in one device allocation so their addresses never move
 * while the model lives: graphs captured over them stay valid until the
 * weights themselves change. */
#include "tinydit.h"
#include <jansson.h>
#include "tinydit_impl.h"
#include "wan_ckpt.h"
#include "base/error.h"
#include "base/names.h"
#include "kernels/ops.h"
#include "kernels/ops_args.h"
#include "kernels/philox.h"
#include "kernels/registry.h"
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- configs ----------------------------------------------------------- */

/* The one table of built-in configs (README and docs/MODEL.md list it). */
static const tdit_config_t builtin[] = {
    { "tiny", 64, 4, 2, 128, 4, 32, 256, 0 },
    { "small", 384, 6, 12, 1024, 16, 256, 256, 0 },
    { "wan2.1-1.3b", 1536, 12, 30, 8960, 16, 4096, 256, 0 },
    { "wan2.1-14b", 5120, 40, 40, 13824, 16, 4096, 256, 0 },
};
#define N_BUILTIN (sizeof builtin / sizeof builtin[0])

const char *tdit_config_builtin_name(int i) {
    return i >= 0 && (size_t)i < N_BUILTIN ? builtin[i].name : NULL;
}

int tdit_config_builtin(const char *name, tdit_config_t *out) {
    char list[N_BUILTIN * sizeof builtin[0].name + 2 * N_BUILTIN] = "";
    for (size_t i = 0; i < N_BUILTIN; i++) {
        if (!strcmp(builtin[i].name, name)) {
            *out = builtin[i];
            return 0;
        }
        if (i) strcat(list, ", ");
        strcat(list, builtin[i].name);
    }
    return kern_fail("unknown config '%s' (built-in: %s)", name, list);
}

bool tdit_config_same_network(const tdit_config_t *a, const tdit_config_t *b) {
    return a->dim == b->dim && a->heads == b->heads && a->layers == b->layers && a->ffn_dim == b->ffn_dim &&
           a->in_channels == b->in_channels && a->text_dim == b->text_dim && a->freq_dim == b->freq_dim;
}

int tdit_config_validate(const tdit_config_t *c) {
    if (!reel_name_valid(c->name, sizeof c->name))
        return kern_fail("config name '%s': 1..%zu of [A-Za-z0-9_.:+-] (it names the model on the wire)", c->name,
                         sizeof c->name - 1);
    if (c->dim <= 0 || c->heads <= 0 || c->layers <= 0 || c->ffn_dim <= 0 ||
        c->in_channels <= 0 || c->text_dim <= 0 || c->freq_dim <= 0)
        return kern_fail("config %s: every size must be positive", c->name);
    if (c->dim % c->heads)
        return kern_fail("config %s: dim %" PRId64 " not divisible by heads %" PRId64,
                         c->name, c->dim, c->heads);
    if ((c->dim / c->heads) % 2) return kern_fail("config %s: head width must be even", c->name);
    if (c->freq_dim % 2) return kern_fail("config %s: freq_dim must be even", c->name);
    if (c->dim > (1 << 16) || c->layers > 512 || c->ffn_dim > (1 << 18) ||
        c->in_channels > 4096 || c->text_dim > (1 << 16) || c->freq_dim > 8192)
        return kern_fail("config %s: sizes beyond Reel's limits", c->name);
    if (c->text_len < 0 || c->text_len > (1 << 16))
        return kern_fail("config %s: text_len %" PRId64 " is outside 0..65536", c->name, c->text_len);
    return 0;
}

int tdit_config_from_json(const char *text, size_t len, const char *what, tdit_config_t *c) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return kern_fail("%s:%d: %s", what, je.line, je.text);
    int rc = -1;
    if (!json_is_object(root)) {
        kern_fail("%s: not a JSON object", what);
        goto out;
    }
    memset(c, 0, sizeof *c);
    json_t *name = json_object_get(root, "name");
    if (name && !json_is_string(name)) {
        kern_fail("%s: 'name' must be a string", what);
        goto out;
    }
    if (snprintf(c->name, sizeof c->name, "%s", name ? json_string_value(name) : "custom") >= (int)sizeof c->name) {
        kern_fail("%s: name '%.64s...' is longer than %zu bytes", what, json_string_value(name), sizeof c->name - 1);
        goto out;
    }
    struct { const char *k; int64_t *v; } keys[] = {
        { "dim", &c->dim }, { "heads", &c->heads }, { "layers", &c->layers },
        { "ffn_dim", &c->ffn_dim }, { "in_channels", &c->in_channels },
        { "text_dim", &c->text_dim }, { "freq_dim", &c->freq_dim },
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(root, keys[i].k);
        if (!json_is_integer(v)) {
            kern_fail("%s: '%s' must be an integer", what, keys[i].k);
            goto out;
        }
        *keys[i].v = json_integer_value(v);
    }
    json_t *tl = json_object_get(root, "text_len");
    if (tl && !json_is_integer(tl)) {
        kern_fail("%s: 'text_len' must be an integer", what);
        goto out;
    }
    c->text_len = tl ? json_integer_value(tl) : 0;
    rc = tdit_config_validate(c);
out:
    json_decref(root);
    return rc;
}

/* Metadata read through a getter, so a file and a header without its
 * data (st_header_t) give the same config and the same messages. */
typedef const char *(*meta_get_t)(const void *src, const char *key);

static const char *file_meta(const void *f, const char *key) { return st_meta(f, key); }
static const char *header_meta(const void *h, const char *key) { return st_header_meta(h, key); }

static int meta_int(meta_get_t get, const void *f, const char *key, int64_t *out) {
    const char *v = get(f, key);
    if (!v) return kern_fail("weights metadata lacks '%s'", key);
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end) return kern_fail("weights metadata '%s' = '%s' is not an integer", key, v);
    *out = x;
    return 0;
}

static int config_from(meta_get_t get, const void *f, tdit_config_t *out) {
    const char *name = get(f, "config");
    if (get(f, "dim")) {
        memset(out, 0, sizeof *out);
        if (snprintf(out->name, sizeof out->name, "%s", name ? name : "custom") >= (int)sizeof out->name)
            return kern_fail("weights metadata: config name '%.64s...' is longer than %zu bytes", name,
                             sizeof out->name - 1);
        TRY(meta_int(get, f, "dim", &out->dim));
        TRY(meta_int(get, f, "heads", &out->heads));
        TRY(meta_int(get, f, "layers", &out->layers));
        TRY(meta_int(get, f, "ffn_dim", &out->ffn_dim));
        TRY(meta_int(get, f, "in_channels", &out->in_channels));
        TRY(meta_int(get, f, "text_dim", &out->text_dim));
        TRY(meta_int(get, f, "freq_dim", &out->freq_dim));
    } else if (name) {
        TRY(tdit_config_builtin(name, out));
    } else {
        return kern_fail("weights metadata names no config (need 'config' or the size keys)");
    }
    out->text_len = 0;
    if (get(f, "text_len")) TRY(meta_int(get, f, "text_len", &out->text_len));
    return tdit_config_validate(out);
}

int tdit_config_from_meta(const st_file_t *f, tdit_config_t *out) { return config_from(file_meta, f, out); }

int tdit_config_from_header(const st_header_t *h, tdit_config_t *out) { return config_from(header_meta, h, out); }

/* ---- the weight table --------------------------------------------------- */

typedef enum { W_LINEAR, W_BIAS, W_NORM, W_NORM_BIAS, W_MOD } wkind_t;

typedef struct {
    char name[80];
    int ndim;
    int64_t shape[KERN_MAX_DIMS];
    wkind_t kind;
    int64_t fan_in;
    kern_tensor_t *slot;   /* where the loaded tensor goes (NULL when listing) */
} wentry_t;

typedef struct {
    wentry_t *e;
    size_t n, cap;
    int failed;
} wlist_t;

static void add(wlist_t *l, kern_tensor_t *slot, wkind_t kind, int64_t fan_in, int ndim,
                const int64_t *shape, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static void add(wlist_t *l, kern_tensor_t *slot, wkind_t kind, int64_t fan_in, int ndim,
                const int64_t *shape, const char *fmt, ...) {
    if (l->failed) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        wentry_t *e = realloc(l->e, cap * sizeof *e);
        if (!e) { l->failed = 1; return; }
        l->e = e;
        l->cap = cap;
    }
    wentry_t *w = &l->e[l->n++];
    memset(w, 0, sizeof *w);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->name, sizeof w->name, fmt, ap);
    va_end(ap);
    w->ndim = ndim;
    memcpy(w->shape, shape, (size_t)ndim * sizeof *shape);
    w->kind = kind;
    w->fan_in = fan_in;
    w->slot = slot;
}

static void add_linear(wlist_t *l, lin_t *lin, int64_t out, int64_t in, const char *prefix) {
    add(l, lin ? &lin->w : NULL, W_LINEAR, in, 2, SHAPE(out, in), "%s.weight", prefix);
    add(l, lin ? &lin->b : NULL, W_BIAS, in, 1, SHAPE(out), "%s.bias", prefix);
}

/* Lists every weight of c in file order; with m, slots point into m. */
static int list_weights(const tdit_config_t *c, tdit_model_t *m, wlist_t *l) {
    int64_t D = c->dim, C = c->in_channels;
    char p[80];
    add(l, m ? &m->patch.w : NULL, W_LINEAR, 4 * C, 5, SHAPE(D, C, 1, 2, 2), "patch_embedding.weight");
    add(l, m ? &m->patch.b : NULL, W_BIAS, 4 * C, 1, SHAPE(D), "patch_embedding.bias");
    add_linear(l, m ? &m->text0 : NULL, D, c->text_dim, "text_embedding.0");
    add_linear(l, m ? &m->text2 : NULL, D, D, "text_embedding.2");
    add_linear(l, m ? &m->time0 : NULL, D, c->freq_dim, "time_embedding.0");
    add_linear(l, m ? &m->time2 : NULL, D, D, "time_embedding.2");
    add_linear(l, m ? &m->proj : NULL, 6 * D, D, "time_projection.1");
    for (int64_t i = 0; i < c->layers; i++) {
        block_t *b = m ? &m->blocks[i] : NULL;
        add(l, b ? &b->modulation : NULL, W_MOD, D, 3, SHAPE(1, 6, D), "blocks.%" PRId64 ".modulation", i);
        const char *attn[2] = { "self_attn", "cross_attn" };
        for (int a = 0; a < 2; a++) {
            lin_t *q = b ? (a ? &b->cq : &b->sq) : NULL, *k = b ? (a ? &b->ck : &b->sk) : NULL;
            lin_t *v = b ? (a ? &b->cv : &b->sv) : NULL, *o = b ? (a ? &b->co : &b->so) : NULL;
            const char *pq[4] = { "q", "k", "v", "o" };
            lin_t *lq[4] = { q, k, v, o };
            for (int j = 0; j < 4; j++) {
                snprintf(p, sizeof p, "blocks.%" PRId64 ".%s.%s", i, attn[a], pq[j]);
                add_linear(l, lq[j], D, D, p);
            }
            add(l, b ? (a ? &b->c_norm_q : &b->s_norm_q) : NULL, W_NORM, D, 1, SHAPE(D),
                "blocks.%" PRId64 ".%s.norm_q.weight", i, attn[a]);
            add(l, b ? (a ? &b->c_norm_k : &b->s_norm_k) : NULL, W_NORM, D, 1, SHAPE(D),
                "blocks.%" PRId64 ".%s.norm_k.weight", i, attn[a]);
            if (a == 0) {
                add(l, b ? &b->norm3_w : NULL, W_NORM, D, 1, SHAPE(D), "blocks.%" PRId64 ".norm3.weight", i);
                add(l, b ? &b->norm3_b : NULL, W_NORM_BIAS, D, 1, SHAPE(D), "blocks.%" PRId64 ".norm3.bias", i);
            }
        }
        snprintf(p, sizeof p, "blocks.%" PRId64 ".ffn.0", i);
        add_linear(l, b ? &b->ffn0 : NULL, c->ffn_dim, D, p);
        snprintf(p, sizeof p, "blocks.%" PRId64 ".ffn.2", i);
        add_linear(l, b ? &b->ffn2 : NULL, D, c->ffn_dim, p);
    }
    add(l, m ? &m->head_mod : NULL, W_MOD, D, 3, SHAPE(1, 2, D), "head.modulation");
    add_linear(l, m ? &m->head : NULL, 4 * C, D, "head.head");
    if (l->failed) return kern_fail("out of memory listing weights");
    return 0;
}

tdit_weight_t *tdit_config_weights(const tdit_config_t *c, size_t *n) {
    wlist_t l = { 0 };
    *n = 0;
    if (list_weights(c, NULL, &l) != 0) {
        free(l.e);
        return NULL;
    }
    tdit_weight_t *w = malloc((l.n ? l.n : 1) * sizeof *w);
    if (!w) {
        free(l.e);
        kern_fail("out of memory listing weights");
        return NULL;
    }
    for (size_t i = 0; i < l.n; i++) {
        memset(&w[i], 0, sizeof w[i]);
        snprintf(w[i].name, sizeof w[i].name, "%s", l.e[i].name);
        w[i].ndim = l.e[i].ndim;
        memcpy(w[i].shape, l.e[i].shape, sizeof w[i].shape);
    }
    *n = l.n;
    free(l.e);
    return w;
}

int64_t tdit_config_params(const tdit_config_t *c) {
    wlist_t l = { 0 };
    if (list_weights(c, NULL, &l) != 0) { free(l.e); return -1; }
    int64_t n = 0;
    for (size_t i = 0; i < l.n; i++) {
        int64_t k = 1;
        for (int d = 0; d < l.e[i].ndim; d++) k *= l.e[i].shape[d];
        n += k;
    }
    free(l.e);
    return n;
}

static int64_t numel_of(const wentry_t *w) {
    int64_t k = 1;
    for (int d = 0; d < w->ndim; d++) k *= w->shape[d];
    return k;
}

/* ---- deterministic initial weights --------------------------------------- */

int tdit_weights_init(const tdit_config_t *c, uint64_t seed, const char *path) {
    TRY(tdit_config_validate(c));
    wlist_t l = { 0 };
    st_writer_t *w = NULL;
    float *buf = NULL;
    int rc = -1;
    if (list_weights(c, NULL, &l) != 0) goto out;
    w = st_writer_new();
    if (!w) goto out;
    char v[32];
    if (st_writer_meta(w, "config", c->name)) goto out;
    const struct { const char *k; int64_t v; } kv[] = {
        { "dim", c->dim }, { "heads", c->heads }, { "layers", c->layers },
        { "ffn_dim", c->ffn_dim }, { "in_channels", c->in_channels },
        { "text_dim", c->text_dim }, { "freq_dim", c->freq_dim },
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        snprintf(v, sizeof v, "%" PRId64, kv[i].v);
        if (st_writer_meta(w, kv[i].k, v)) goto out;
    }
    snprintf(v, sizeof v, "%" PRId64, c->text_len);
    if (c->text_len && st_writer_meta(w, "text_len", v)) goto out;
    snprintf(v, sizeof v, "%" PRIu64, seed);
    if (st_writer_meta(w, "init_seed", v) || st_writer_meta(w, "format", "pt")) goto out;
    for (size_t i = 0; i < l.n; i++) {
        const wentry_t *e = &l.e[i];
        int64_t n = numel_of(e);
        float *nb = realloc(buf, (size_t)n * sizeof *buf);
        if (!nb) { kern_fail("out of memory initialising %s", e->name); goto out; }
        buf = nb;
        /* Tensor i draws from its own Philox stream (seed, i): adding a
         * tensor never changes the values of the others. */
        double std = e->kind == W_LINEAR ? 1.0 / sqrt((double)e->fan_in)
                   : e->kind == W_MOD ? 1.0 / sqrt((double)c->dim)
                   : 0.02;
        for (int64_t j = 0; j < n; j++) {
            switch (e->kind) {
            case W_NORM: buf[j] = 1.0f; break;
            case W_NORM_BIAS: buf[j] = 0.0f; break;
            default: buf[j] = (float)(std * kern_philox_normal(seed, (uint32_t)i, (uint64_t)j));
            }
        }
        if (st_writer_add_f32(w, e->name, e->ndim, e->shape, buf)) goto out;
    }
    rc = st_writer_save(w, path);
out:
    free(buf);
    free(l.e);
    st_writer_destroy(&w);
    return rc;
}

/* ---- loading ------------------------------------------------------------ */

/* Views t (contiguous) as 2-D [rows, cols]. */
static kern_tensor_t view2(const kern_tensor_t *t, int64_t rows, int64_t cols) {
    kern_tensor_t v = kern_tensor_make(t->data, t->dtype, t->device, 2, SHAPE(rows, cols));
    v.offset = t->offset;
    return v;
}

/* Checks that f holds every tensor of l with its shape (before anything is
 * copied, so a bad file leaves the resident weights intact). */
static int check_file(const st_file_t *f, const wlist_t *l) {
    for (size_t i = 0; i < l->n; i++) {
        const wentry_t *e = &l->e[i];
        const st_tensor_t *t = st_find(f, e->name);
        if (!t) return kern_fail("weights: missing tensor %s", e->name);
        bool ok = t->ndim == e->ndim;
        for (int d = 0; ok && d < e->ndim; d++) ok = t->shape[d] == e->shape[d];
        if (!ok) {
            char a[96], b[96];
            kern_tensor_t ta = kern_tensor_make(NULL, t->dtype, KERN_DEVICE_HOST, t->ndim, t->shape);
            kern_tensor_t tb = kern_tensor_make(NULL, t->dtype, KERN_DEVICE_HOST, e->ndim, e->shape);
            return kern_fail("weights: %s is %s, the config needs %s", e->name,
                             kern_tensor_describe(&ta, a, sizeof a), kern_tensor_describe(&tb, b, sizeof b));
        }
    }
    return 0;
}

/* Copies every tensor of l from f into m's arena, in list order, each
 * 256-byte aligned; with set_slots, points the model's tensors at them. */
static int copy_weights(tdit_model_t *m, const st_file_t *f, const wlist_t *l, bool set_slots) {
    size_t esz = kern_dtype_size(m->dtype), maxn = 0;
    /* F32 on the CPU: each tensor is read straight into the arena (one
     * copy, and no staging buffer: a fresh one costs a fault and a
     * zeroing per page, more than the copy on the VMs measured). */
    bool direct = m->dtype == KERN_F32 && kern_backend_kind(m->backend) == KERN_BACKEND_CPU;
    for (size_t i = 0; i < l->n && !direct; i++)
        if ((size_t)numel_of(&l->e[i]) > maxn) maxn = (size_t)numel_of(&l->e[i]);
    float *host = direct ? NULL : malloc(maxn * sizeof *host);
    uint16_t *narrow = m->dtype == KERN_F32 ? NULL : malloc(maxn * esz);
    kern_stream_t *s = kern_stream_new(m->backend);
    int rc = -1;
    if (!s) goto out;
    if ((!direct && !host) || (m->dtype != KERN_F32 && !narrow)) { kern_fail("out of memory"); goto out; }
    size_t off = 0;
    for (size_t i = 0; i < l->n; i++) {
        const wentry_t *e = &l->e[i];
        size_t n = (size_t)numel_of(e);
        kern_tensor_t t = kern_tensor_make((char *)m->arena + off, m->dtype,
                                           kern_backend_device(m->backend), e->ndim, e->shape);
        if (direct) {
            if (st_read_f32(f, e->name, e->ndim, e->shape, kern_tensor_ptr(&t)) != 0) goto out;
            if (set_slots) *e->slot = t;
            off += (n * esz + 255) & ~(size_t)255;
            continue;
        }
        if (st_read_f32(f, e->name, e->ndim, e->shape, host) != 0) goto out;
        if (set_slots) *e->slot = t;
        const void *src = host;
        if (m->dtype == KERN_BF16) {
            for (size_t j = 0; j < n; j++) narrow[j] = kern_f32_to_bf16(host[j]);
            src = narrow;
        }
        if (kern_copy_h2d(s, kern_tensor_ptr(&t), src, n * esz) != 0 || kern_stream_sync(s) != 0)
            goto out;
        off += (n * esz + 255) & ~(size_t)255;
    }
    rc = 0;
out:
    kern_stream_destroy(&s);
    free(host);
    free(narrow);
    return rc;
}

tdit_model_t *tdit_model_load(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype) {
    tdit_model_t *m = calloc(1, sizeof *m);
    wlist_t l = { 0 };
    if (!m) { kern_fail("out of memory"); return NULL; }
    m->backend = b;
    m->dtype = dtype;
    if (dtype != KERN_F32 && !(dtype == KERN_BF16 && kern_backend_kind(b) == KERN_BACKEND_CUDA)) {
        kern_fail("model dtype %s is not supported on %s (CPU computes in F32)",
                  kern_dtype_name(dtype), kern_backend_device_name(b));
        goto err;
    }
    if (tdit_config_from_meta(f, &m->cfg) != 0) goto err;
    m->blocks = calloc((size_t)m->cfg.layers, sizeof *m->blocks);
    if (!m->blocks) { kern_fail("out of memory"); goto err; }
    if (list_weights(&m->cfg, m, &l) != 0 || check_file(f, &l) != 0) goto err;
    /* One allocation, each tensor 256-byte aligned inside it. */
    size_t total = 0, esz = kern_dtype_size(dtype);
    for (size_t i = 0; i < l.n; i++) total += ((size_t)numel_of(&l.e[i]) * esz + 255) & ~(size_t)255;
    m->arena = kern_alloc(b, total);
    if (!m->arena) goto err;
    m->bytes = total;
    if (copy_weights(m, f, &l, true) != 0) goto err;
    /* Views the forward pass wants. */
    int64_t D = m->cfg.dim;
    m->patch.w = view2(&m->patch.w, D, 4 * m->cfg.in_channels);
    m->head_mod = view2(&m->head_mod, 2, D);
    for (int64_t i = 0; i < m->cfg.layers; i++)
        m->blocks[i].modulation = view2(&m->blocks[i].modulation, 6, D);
    if (!(m->tensors = malloc(l.n * sizeof *m->tensors))) { kern_fail("out of memory"); goto err; }
    for (size_t i = 0; i < l.n; i++) m->tensors[i] = l.e[i].slot;
    m->n_tensors = (int)l.n;
    free(l.e);
    return m;
err:
    free(l.e);
    tdit_model_destroy(&m);
    return NULL;
}

int tdit_model_reload(tdit_model_t *m, const st_file_t *f) {
    tdit_config_t c;
    if (tdit_config_from_meta(f, &c) != 0) return -1;
    if (!tdit_config_same_network(&c, &m->cfg))
        return kern_fail("weights: config %s does not match the resident %s", c.name, m->cfg.name);
    wlist_t l = { 0 };
    int rc = list_weights(&m->cfg, NULL, &l);
    if (rc == 0) rc = check_file(f, &l);
    if (rc == 0 && copy_weights(m, f, &l, false) != 0)
        rc = kern_fail("weights: reload failed part-way, resident weights are mixed: %s", kern_error());
    free(l.e);
    return rc;
}

tdit_model_t *tdit_model_load_path(kern_backend_t *b, const char *path, kern_dtype_t dtype) {
    st_file_t *f = wan_ckpt_load(path);
    if (!f) return NULL;
    tdit_model_t *m = tdit_model_load(b, f, dtype);
    st_close(&f);
    return m;
}

void tdit_model_destroy(tdit_model_t **mp) {
    if (!mp || !*mp) return;
    tdit_model_t *m = *mp;
    kern_free(m->backend, m->arena);
    free(m->blocks);
    free(m->tensors);
    free(m);
    *mp = NULL;
}

int tdit_model_n_tensors(const tdit_model_t *m) { return m->n_tensors; }

const kern_tensor_t *tdit_model_tensor(const tdit_model_t *m, int i) {
    return i >= 0 && i < m->n_tensors ? m->tensors[i] : NULL;
}

int tdit_model_relocate(tdit_model_t *m) {
    void *old = m->arena, *arena = kern_alloc(m->backend, m->bytes);
    if (!arena) return -1;
    kern_stream_t *s = kern_stream_new(m->backend);
    int rc = s ? kern_copy_d2d(s, arena, old, m->bytes) : -1;
    if (rc == 0) rc = kern_stream_sync(s);
    kern_stream_destroy(&s);
    if (rc != 0) {
        kern_free(m->backend, arena);
        return -1;
    }
    for (int i = 0; i < m->n_tensors; i++)
        m->tensors[i]->data = (char *)arena + ((char *)m->tensors[i]->data - (char *)old);
    m->arena = arena;
    kern_free(m->backend, old);
    return 0;
}

const tdit_config_t *tdit_model_config(const tdit_model_t *m) { return &m->cfg; }
kern_backend_t *tdit_model_backend(const tdit_model_t *m) { return m->backend; }
kern_dtype_t tdit_model_dtype(const tdit_model_t *m) { return m->dtype; }
size_t tdit_model_bytes(const tdit_model_t *m) { return m->bytes; }
const void *tdit_model_weights(const tdit_model_t *m) { return m->arena; }
