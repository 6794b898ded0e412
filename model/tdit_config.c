/* tdit_config.c -- a model's config and the weights it implies (see
 * tinydit.h): the built-in configs, a config read from JSON or from a
 * weights file's metadata, its validation, and the table of its weights
 * in file order (names, shapes, how each is initialised). It loads
 * nothing: the checkpoint readers (wan_names.c, wan_ckpt.c) and the model
 * (tinydit.c) use it, and it calls none of them. */
#include "tinydit.h"
#include <jansson.h>
#include "tinydit_impl.h"
#include "base/parse.h"
#include "base/error.h"
#include "base/names.h"
#include <inttypes.h>
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
    return reel_fail(REEL_E_NOT_FOUND, "unknown config '%s' (built-in: %s)", name, list);
}

bool tdit_config_same_network(const tdit_config_t *a, const tdit_config_t *b) {
    return a->dim == b->dim && a->heads == b->heads && a->layers == b->layers && a->ffn_dim == b->ffn_dim &&
           a->in_channels == b->in_channels && a->text_dim == b->text_dim && a->freq_dim == b->freq_dim;
}

int tdit_config_validate(const tdit_config_t *c) {
    if (!reel_name_valid(c->name, sizeof c->name))
        return reel_fail(REEL_E_INVALID, "config name '%s': 1..%zu of [A-Za-z0-9_.:+-] (it names the model on the wire)", c->name,
                         sizeof c->name - 1);
    if (c->dim <= 0 || c->heads <= 0 || c->layers <= 0 || c->ffn_dim <= 0 ||
        c->in_channels <= 0 || c->text_dim <= 0 || c->freq_dim <= 0)
        return reel_fail(REEL_E_INVALID, "config %s: every size must be positive", c->name);
    if (c->dim % c->heads)
        return reel_fail(REEL_E_INVALID, "config %s: dim %" PRId64 " not divisible by heads %" PRId64,
                         c->name, c->dim, c->heads);
    if ((c->dim / c->heads) % 2) return reel_fail(REEL_E_INVALID, "config %s: head width must be even", c->name);
    if (c->freq_dim % 2) return reel_fail(REEL_E_INVALID, "config %s: freq_dim must be even", c->name);
    if (c->dim > (1 << 16) || c->layers > 512 || c->ffn_dim > (1 << 18) ||
        c->in_channels > 4096 || c->text_dim > (1 << 16) || c->freq_dim > 8192)
        return reel_fail(REEL_E_INVALID, "config %s: sizes beyond Reel's limits", c->name);
    if (c->text_len < 0 || c->text_len > (1 << 16))
        return reel_fail(REEL_E_INVALID, "config %s: text_len %" PRId64 " is outside 0..65536", c->name, c->text_len);
    return 0;
}

int tdit_config_from_json(const char *text, size_t len, const char *what, tdit_config_t *c) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return reel_fail(REEL_E_INVALID, "%s:%d: %s", what, je.line, je.text);
    int rc = -1;
    if (!json_is_object(root)) {
        reel_fail(REEL_E_INVALID, "%s: not a JSON object", what);
        goto out;
    }
    memset(c, 0, sizeof *c);
    json_t *name = json_object_get(root, "name");
    if (name && !json_is_string(name)) {
        reel_fail(REEL_E_INVALID, "%s: 'name' must be a string", what);
        goto out;
    }
    if (snprintf(c->name, sizeof c->name, "%s", name ? json_string_value(name) : "custom") >= (int)sizeof c->name) {
        reel_fail(REEL_E_INVALID, "%s: name '%.64s...' is longer than %zu bytes", what, json_string_value(name), sizeof c->name - 1);
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
            reel_fail(REEL_E_INVALID, "%s: '%s' must be an integer", what, keys[i].k);
            goto out;
        }
        *keys[i].v = json_integer_value(v);
    }
    json_t *tl = json_object_get(root, "text_len");
    if (tl && !json_is_integer(tl)) {
        reel_fail(REEL_E_INVALID, "%s: 'text_len' must be an integer", what);
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
    if (!v) return reel_fail(REEL_E_INVALID, "weights metadata lacks '%s'", key);
    if (reel_parse_i64(v, INT64_MIN, INT64_MAX, key, out) != 0)
        return reel_fail(REEL_E_INVALID, "weights metadata '%s' = '%s' is not an integer", key, v);
    return 0;
}

static int config_from(meta_get_t get, const void *f, tdit_config_t *out) {
    const char *name = get(f, "config");
    if (get(f, "dim")) {
        memset(out, 0, sizeof *out);
        if (snprintf(out->name, sizeof out->name, "%s", name ? name : "custom") >= (int)sizeof out->name)
            return reel_fail(REEL_E_INVALID, "weights metadata: config name '%.64s...' is longer than %zu bytes", name,
                             sizeof out->name - 1);
        TRY(meta_int(get, f, "dim", &out->dim));
        TRY(meta_int(get, f, "heads", &out->heads));
        TRY(meta_int(get, f, "layers", &out->layers));
        TRY(meta_int(get, f, "ffn_dim", &out->ffn_dim));
        TRY(meta_int(get, f, "in_channels", &out->in_channels));
        TRY(meta_int(get, f, "text_dim", &out->text_dim));
        TRY(meta_int(get, f, "freq_dim", &out->freq_dim));
        /* A built-in's name is a promise of its widths (a client asking for
         * "wan2.1-14b" must not be served a 64-wide network); its layers may
         * be fewer (a truncated variant, as benchmarks write). */
        tdit_config_t b;
        if (name && tdit_config_builtin(name, &b) == 0 &&
            (b.dim != out->dim || b.heads != out->heads || b.ffn_dim != out->ffn_dim ||
             b.in_channels != out->in_channels || b.text_dim != out->text_dim || b.freq_dim != out->freq_dim))
            return reel_fail(REEL_E_INVALID, "weights metadata names config '%s' but its sizes are another model's "
                             "(dim %lld, heads %lld, ffn_dim %lld, in_channels %lld, text_dim %lld, freq_dim %lld; '%s' "
                             "has %lld, %lld, %lld, %lld, %lld, %lld): name it another config", name,
                             (long long)out->dim, (long long)out->heads, (long long)out->ffn_dim,
                             (long long)out->in_channels, (long long)out->text_dim, (long long)out->freq_dim, name,
                             (long long)b.dim, (long long)b.heads, (long long)b.ffn_dim, (long long)b.in_channels,
                             (long long)b.text_dim, (long long)b.freq_dim);
        reel_err_clear(); /* an unknown name is a custom config's own */
    } else if (name) {
        TRY(tdit_config_builtin(name, out));
    } else {
        return reel_fail(REEL_E_INVALID, "weights metadata names no config (need 'config' or the size keys)");
    }
    out->text_len = 0;
    if (get(f, "text_len")) TRY(meta_int(get, f, "text_len", &out->text_len));
    return tdit_config_validate(out);
}

int tdit_config_from_meta(const st_file_t *f, tdit_config_t *out) { return config_from(file_meta, f, out); }

int tdit_config_from_header(const st_header_t *h, tdit_config_t *out) { return config_from(header_meta, h, out); }

/* ---- the weight table --------------------------------------------------- */

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

int tdit_list_weights(const tdit_config_t *c, tdit_model_t *m, wlist_t *l) {
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
    if (l->failed) return reel_fail(REEL_E_NOMEM, "out of memory listing weights");
    return 0;
}

tdit_weight_t *tdit_config_weights(const tdit_config_t *c, size_t *n) {
    wlist_t l = { 0 };
    *n = 0;
    if (tdit_list_weights(c, NULL, &l) != 0) {
        free(l.e);
        return NULL;
    }
    tdit_weight_t *w = malloc((l.n ? l.n : 1) * sizeof *w);
    if (!w) {
        free(l.e);
        reel_fail(REEL_E_NOMEM, "out of memory listing weights");
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
    if (tdit_list_weights(c, NULL, &l) != 0) { free(l.e); return -1; }
    int64_t n = 0;
    for (size_t i = 0; i < l.n; i++) {
        int64_t k = 1;
        for (int d = 0; d < l.e[i].ndim; d++) k *= l.e[i].shape[d];
        n += k;
    }
    free(l.e);
    return n;
}
