/* wan_names.c -- what wan_ckpt.c judges a Wan2.1 checkpoint by: the
 * model's tensors under Wan's and diffusers' names, and Wan's and diffusers'
 * config.json (see wan_ckpt_impl.h).
 *
 * Names: Reel's are Wan's (TINYDIT.md); diffusers' are derived from them
 * by the rename table of diffusers' scripts/convert_wan_to_diffusers.py
 * (diffusers_name below), so one table of the model's weights
 * (tdit_config_weights) answers for both. */
#include "model/wan_ckpt_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static const char *const layout_names[] = { "reel", "wan-original", "wan-sharded", "diffusers", "diffusers-pipeline" };

const char *wan_layout_name(wan_layout_t l) {
    return (unsigned)l < sizeof layout_names / sizeof layout_names[0] ? layout_names[l] : "?";
}

int wan_file_problem(bool stopped) {
    reel_code_t c = reel_err_code();
    if (stopped) c = REEL_E_STATE;
    else if (c == REEL_E_UNSUPPORTED || c == REEL_E_STATE || c == REEL_OK) c = REEL_E_INVALID;
    return reel_fail_detail(c, reel_err()->detail, "%s", reel_err()->msg);
}

reel_code_t wan_errno_code(int e) {
    return e == ENOENT ? REEL_E_NOT_FOUND : e == ELOOP || e == ENOTDIR ? REEL_E_INVALID : e == ENOMEM ? REEL_E_NOMEM
                                                                                                      : REEL_E_IO;
}

/* ---- names ------------------------------------------------------------------------ */


/* The diffusers name of Reel (= Wan) weight `reel`: convert_wan_to_diffusers'
 * TRANSFORMER_KEYS_RENAME_DICT, applied to the names TINYDIT.md lists. */
static void diffusers_name(const char *reel, char *out, size_t len) {
    static const struct { const char *from, *to; } top[] = {
        { "text_embedding.0.", "condition_embedder.text_embedder.linear_1." },
        { "text_embedding.2.", "condition_embedder.text_embedder.linear_2." },
        { "time_embedding.0.", "condition_embedder.time_embedder.linear_1." },
        { "time_embedding.2.", "condition_embedder.time_embedder.linear_2." },
        { "time_projection.1.", "condition_embedder.time_proj." },
        { "head.head.", "proj_out." },
    }, blk[] = {
        { "self_attn.q.", "attn1.to_q." }, { "self_attn.k.", "attn1.to_k." },
        { "self_attn.v.", "attn1.to_v." }, { "self_attn.o.", "attn1.to_out.0." },
        { "self_attn.norm_q.", "attn1.norm_q." }, { "self_attn.norm_k.", "attn1.norm_k." },
        { "cross_attn.q.", "attn2.to_q." }, { "cross_attn.k.", "attn2.to_k." },
        { "cross_attn.v.", "attn2.to_v." }, { "cross_attn.o.", "attn2.to_out.0." },
        { "cross_attn.norm_q.", "attn2.norm_q." }, { "cross_attn.norm_k.", "attn2.norm_k." },
        /* Wan's norms run norm1, norm3, norm2; diffusers numbers them in order */
        { "norm3.", "norm2." }, { "ffn.0.", "ffn.net.0.proj." }, { "ffn.2.", "ffn.net.2." },
    };
    if (!strcmp(reel, "head.modulation")) {
        snprintf(out, len, "scale_shift_table");
        return;
    }
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strncmp(reel, top[i].from, strlen(top[i].from))) {
            snprintf(out, len, "%s%s", top[i].to, reel + strlen(top[i].from));
            return;
        }
    unsigned long blockno;
    int at = 0;
    if (sscanf(reel, "blocks.%lu.%n", &blockno, &at) == 1 && at > 0) {
        const char *rest = reel + at;
        if (!strcmp(rest, "modulation")) {
            snprintf(out, len, "blocks.%lu.scale_shift_table", blockno);
            return;
        }
        for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++)
            if (!strncmp(rest, blk[i].from, strlen(blk[i].from))) {
                snprintf(out, len, "blocks.%lu.%s%s", blockno, blk[i].to, rest + strlen(blk[i].from));
                return;
            }
    }
    snprintf(out, len, "%s", reel); /* patch_embedding.*: the same in both */
}

/* What a tensor of another Wan model is, by its name; NULL: none known. */
static const char *foreign_kind(const char *n) {
    if (!strncmp(n, "img_emb.", 8) || strstr(n, "image_embedder."))
        return "an image embedding (an image-to-video model)";
    if (strstr(n, ".k_img.") || strstr(n, ".v_img.") || strstr(n, ".norm_k_img.") || strstr(n, ".add_k_proj.") ||
        strstr(n, ".add_v_proj.") || strstr(n, ".norm_added_k."))
        return "an image cross-attention projection (an image-to-video model)";
    if (strstr(n, "vace")) return "a VACE block (a video-editing model)";
    if (strstr(n, "motion_encoder") || strstr(n, "face_encoder") || strstr(n, "face_adapter"))
        return "a Wan-Animate block";
    return NULL;
}

/* A plain file name: one component, not "." or "..". */
bool wan_plain_name(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n <= NAME_MAX && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

bool wan_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* ---- the model's weights, looked up by either name ---------------------------------- */




static int cmp_key(const void *a, const void *b) { return strcmp(((const wkey_t *)a)->name, ((const wkey_t *)b)->name); }

void wan_match_free(match_t *m) {
    free(m->w);
    free(m->dname);
    free(m->wan);
    free(m->diff);
    free(m->slot);
    memset(m, 0, sizeof *m);
}

int wan_match_init(match_t *m, const tdit_config_t *c, bool reel) {
    memset(m, 0, sizeof *m);
    m->reel = reel;
    if (!(m->w = tdit_config_weights(c, &m->n))) return -1;
    m->dname = malloc(m->n * sizeof *m->dname);
    m->wan = malloc(m->n * sizeof *m->wan);
    m->diff = malloc(m->n * sizeof *m->diff);
    m->slot = calloc(m->n, sizeof *m->slot);
    if (!m->dname || !m->wan || !m->diff || !m->slot) {
        wan_match_free(m);
        return reel_fail(REEL_E_NOMEM, "out of memory for the weight table");
    }
    for (size_t i = 0; i < m->n; i++) {
        diffusers_name(m->w[i].name, m->dname[i], WAN_DNAME);
        m->wan[i] = (wkey_t){ m->w[i].name, i };
        m->diff[i] = (wkey_t){ m->dname[i], i };
    }
    qsort(m->wan, m->n, sizeof *m->wan, cmp_key);
    qsort(m->diff, m->n, sizeof *m->diff, cmp_key);
    return 0;
}

/* The weight named `name` in naming *how (NAMES_ANY: both agree), or -1. */
static long lookup(const match_t *m, const char *name, names_t *how) {
    wkey_t k = { name, 0 };
    const wkey_t *a = bsearch(&k, m->wan, m->n, sizeof k, cmp_key);
    const wkey_t *b = m->reel ? NULL : bsearch(&k, m->diff, m->n, sizeof k, cmp_key);
    if (a && b) *how = NAMES_ANY;
    else if (a) *how = NAMES_WAN;
    else if (b) *how = NAMES_DIFFUSERS;
    else return -1;
    return (long)(a ? a->idx : b->idx);
}

static char *shape_text(int ndim, const int64_t *shape, char *buf, size_t len) {
    return kern_shape_text(ndim, shape, buf, len);
}

/* Records one tensor of file `where`; -1 (REEL_E_UNSUPPORTED) on a tensor
 * that is not the model's (foreign, unknown), a second copy, a mixed
 * naming or a wrong shape. */
int wan_match_add(match_t *m, const item_t *it, const char *where, const char *const *part_name) {
    names_t how;
    long i = lookup(m, it->name, &how);
    if (i < 0) {
        if (m->reel) return 0; /* a Reel file may carry more */
        const char *kind = foreign_kind(it->name);
        if (kind)
            return reel_fail(REEL_E_UNSUPPORTED,
                             "%s: tensor '%s' is %s: Reel serves Wan2.1 text-to-video transformers only", where,
                             it->name, kind);
        return reel_fail(REEL_E_UNSUPPORTED,
                         "%s: unknown tensor '%s': not a tensor of this Wan2.1 text-to-video transformer "
                         "(config: %zu tensors)",
                         where, it->name, m->n);
    }
    if (how != NAMES_ANY) {
        if (m->names != NAMES_ANY && m->names != how)
            return reel_fail(REEL_E_UNSUPPORTED,
                             "%s: '%s' is a %s name, but '%s' is a %s name: one checkpoint, one naming", where,
                             it->name, how == NAMES_WAN ? "Wan" : "diffusers", m->named_by,
                             m->names == NAMES_WAN ? "Wan" : "diffusers");
        m->names = how;
        m->named_by = it->name;
    }
    /* one naming: a second copy can only come from another file */
    if (m->slot[i])
        return reel_fail(REEL_E_UNSUPPORTED, "tensor '%s' is in two files: %s and %s", it->name,
                         part_name[m->slot[i]->part], part_name[it->part]);
    const tdit_weight_t *w = &m->w[i];
    bool same = it->ndim == w->ndim;
    for (int d = 0; same && d < w->ndim; d++) same = it->shape[d] == w->shape[d];
    if (!same) {
        char a[96], b[96];
        return reel_fail(REEL_E_UNSUPPORTED, "%s: %s is %s %s, the config needs %s", where, it->name,
                         kern_dtype_name(it->dtype), shape_text(it->ndim, it->shape, a, sizeof a),
                         shape_text(w->ndim, w->shape, b, sizeof b));
    }
    m->slot[i] = it;
    return 0;
}

/* The name weight i has in the naming seen. */
static const char *name_in(const match_t *m, size_t i) {
    return m->names == NAMES_DIFFUSERS ? m->dname[i] : m->w[i].name;
}

/* Every weight found? -1 naming the first missing one otherwise. */
int wan_match_missing(const match_t *m, const char *where) {
    for (size_t i = 0; i < m->n; i++)
        if (!m->slot[i]) {
            if (m->reel) return reel_fail(REEL_E_UNSUPPORTED, "weights: missing tensor %s", m->w[i].name);
            return reel_fail(REEL_E_UNSUPPORTED, "%s: missing tensor %s", where, name_in(m, i));
        }
    return 0;
}

/* A Reel header over the found tensors: cfg as metadata, Reel names, each
 * tensor where it lies in the one buffer. Malloc'd JSON text, *len bytes. */
char *wan_reel_header(const match_t *m, const tdit_config_t *c, wan_layout_t layout, size_t *len) {
    json_t *root = json_object(), *meta = json_object();
    char *text = NULL, v[32];
    if (!root || !meta) goto out;
    const struct { const char *k; int64_t v; } kv[] = {
        { "dim", c->dim }, { "heads", c->heads }, { "layers", c->layers }, { "ffn_dim", c->ffn_dim },
        { "in_channels", c->in_channels }, { "text_dim", c->text_dim }, { "freq_dim", c->freq_dim },
    };
    if (json_object_set_new(meta, "config", json_string(c->name)) != 0) goto out;
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        snprintf(v, sizeof v, "%" PRId64, kv[i].v);
        if (json_object_set_new(meta, kv[i].k, json_string(v)) != 0) goto out;
    }
    snprintf(v, sizeof v, "%" PRId64, c->text_len);
    if ((c->text_len && json_object_set_new(meta, "text_len", json_string(v)) != 0) ||
        json_object_set_new(meta, "format", json_string("pt")) != 0 ||
        json_object_set_new(meta, "source_layout", json_string(wan_layout_name(layout))) != 0 ||
        json_object_set(root, "__metadata__", meta) != 0)
        goto out;
    for (size_t i = 0; i < m->n; i++) {
        const item_t *it = m->slot[i];
        json_t *shape = json_array();
        if (!shape) goto out;
        for (int d = 0; d < it->ndim; d++)
            if (json_array_append_new(shape, json_integer(it->shape[d])) != 0) {
                json_decref(shape);
                goto out;
            }
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", kern_dtype_name(it->dtype), "shape", shape,
                              "data_offsets", (json_int_t)it->begin, (json_int_t)(it->begin + it->nbytes));
        if (!e || json_object_set_new(root, m->w[i].name, e) != 0) goto out;
    }
    if ((text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER))) *len = strlen(text);
out:
    json_decref(meta);
    json_decref(root);
    if (!text) reel_fail(REEL_E_NOMEM, "out of memory building a Reel header");
    return text;
}

wan_layout_t wan_layout_by_names(names_t names, bool sharded, bool pipeline) {
    if (pipeline) return WAN_LAYOUT_PIPELINE;
    if (names == NAMES_DIFFUSERS) return WAN_LAYOUT_DIFFUSERS;
    return sharded ? WAN_LAYOUT_SHARDED : WAN_LAYOUT_ORIGINAL;
}

/* ---- configs ----------------------------------------------------------------------- */

/* The built-in name of c's network, else "custom". */
static void name_config(tdit_config_t *c) {
    snprintf(c->name, sizeof c->name, "custom");
    for (int i = 0; tdit_config_builtin_name(i); i++) {
        tdit_config_t b;
        if (tdit_config_builtin(tdit_config_builtin_name(i), &b) == 0 && tdit_config_same_network(&b, c)) {
            snprintf(c->name, sizeof c->name, "%s", b.name);
            return;
        }
    }
}

/* j[key] as an integer into *out (def when absent and not required). */
static int jint(const json_t *j, const char *key, bool required, int64_t def, int64_t *out, const char *where) {
    const json_t *v = json_object_get(j, key);
    if (!v) {
        if (required) return reel_fail(REEL_E_INVALID, "%s: no '%s'", where, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return reel_fail(REEL_E_INVALID, "%s: '%s' is not an integer", where, key);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > ((json_int_t)1 << 30))
        return reel_fail(REEL_E_UNSUPPORTED, "%s: '%s' = %lld is out of range", where, key, (long long)x);
    *out = (int64_t)x;
    return 0;
}

/* What Reel computes the same way or not at all: patch (1, 2, 2), eps 1e-6. */
static int check_common(const json_t *j, const char *where) {
    const json_t *p = json_object_get(j, "patch_size");
    if (p && !json_is_null(p)) {
        bool ok = json_is_array(p) && json_array_size(p) == 3;
        for (size_t i = 0; ok && i < 3; i++)
            ok = json_is_integer(json_array_get(p, i)) && json_integer_value(json_array_get(p, i)) == (i ? 2 : 1);
        if (!ok)
            return reel_fail(REEL_E_UNSUPPORTED, "%s: patch_size is not [1, 2, 2] (Reel patchifies by 1x2x2)", where);
    }
    const json_t *e = json_object_get(j, "eps");
    if (e && (!json_is_number(e) || fabs(json_number_value(e) - 1e-6) > 1e-12))
        return reel_fail(REEL_E_UNSUPPORTED, "%s: eps %g: Reel's norms use 1e-6", where,
                         json_is_number(e) ? json_number_value(e) : NAN);
    return 0;
}

static int require_true(const json_t *j, const char *key, const char *what, const char *where) {
    const json_t *v = json_object_get(j, key);
    if (v && !json_is_true(v))
        return reel_fail(REEL_E_UNSUPPORTED, "%s: %s is not true: Reel's blocks %s", where, key, what);
    return 0;
}

/* Wan's own config.json (wan/modules/model.py's WanModel arguments; absent
 * keys take its defaults, except the sizes, which must be there). */
static int wan_config(const json_t *j, const char *where, tdit_config_t *c) {
    const json_t *mt = json_object_get(j, "model_type");
    if (mt) {
        const char *t = json_string_value(mt);
        if (!t) return reel_fail(REEL_E_INVALID, "%s: 'model_type' is not a string", where);
        if (strcmp(t, "t2v")) {
            const char *what = !strcmp(t, "i2v") ? "an image-to-video model"
                             : !strcmp(t, "flf2v") ? "a first-last-frame-to-video model"
                             : !strcmp(t, "vace") ? "a VACE (video editing) model"
                             : "not a text-to-video model";
            return reel_fail(REEL_E_UNSUPPORTED,
                             "%s: model_type '%.32s' is %s: Reel serves Wan2.1 text-to-video (t2v) only", where, t,
                             what);
        }
    }
    int64_t out_dim;
    memset(c, 0, sizeof *c);
    if (jint(j, "dim", true, 0, &c->dim, where) || jint(j, "num_heads", true, 0, &c->heads, where) ||
        jint(j, "num_layers", true, 0, &c->layers, where) || jint(j, "ffn_dim", true, 0, &c->ffn_dim, where) ||
        jint(j, "in_dim", true, 0, &c->in_channels, where) || jint(j, "out_dim", false, 16, &out_dim, where) ||
        jint(j, "text_dim", false, 4096, &c->text_dim, where) ||
        jint(j, "freq_dim", false, 256, &c->freq_dim, where) ||
        jint(j, "text_len", false, WAN_TEXT_LEN, &c->text_len, where))
        return -1;
    if (c->in_channels != out_dim)
        return reel_fail(REEL_E_UNSUPPORTED,
                         "%s: in_dim %" PRId64 " != out_dim %" PRId64 ": the input carries more than the "
                         "latent (an image- or video-conditioned model); Reel serves text-to-video only",
                         where, c->in_channels, out_dim);
    if (c->text_len < 1)
        return reel_fail(REEL_E_UNSUPPORTED, "%s: text_len %" PRId64 " must be positive", where, c->text_len);
    if (check_common(j, where) || require_true(j, "qk_norm", "normalise q and k (RMS)", where) ||
        require_true(j, "cross_attn_norm", "normalise before cross-attention (norm3)", where))
        return -1;
    const json_t *w = json_object_get(j, "window_size");
    if (w && !json_is_null(w)) {
        bool ok = json_is_array(w) && json_array_size(w) == 2;
        for (size_t i = 0; ok && i < 2; i++)
            ok = json_is_integer(json_array_get(w, i)) && json_integer_value(json_array_get(w, i)) == -1;
        if (!ok)
            return reel_fail(REEL_E_UNSUPPORTED, "%s: window_size is not [-1, -1]: Reel's attention is global", where);
    }
    return 0;
}

/* diffusers' WanTransformer3DModel config.json (its defaults for absent
 * keys, except the sizes). diffusers has no text_len: WanPipeline pads
 * every prompt to max_sequence_length 512, as Wan does. */
static int diffusers_config(const json_t *j, const char *where, tdit_config_t *c) {
    static const struct { const char *k, *what; } image[] = {
        { "image_dim", "an image-to-video transformer (image embedding)" },
        { "added_kv_proj_dim", "an image-to-video transformer (image cross-attention)" },
        { "pos_embed_seq_len", "a first-last-frame-to-video transformer" },
    };
    for (size_t i = 0; i < sizeof image / sizeof image[0]; i++) {
        const json_t *v = json_object_get(j, image[i].k);
        if (v && !json_is_null(v))
            return reel_fail(REEL_E_UNSUPPORTED, "%s: %s is set: %s; Reel serves Wan2.1 text-to-video only", where,
                             image[i].k, image[i].what);
    }
    int64_t heads, head_dim, out_ch;
    memset(c, 0, sizeof *c);
    if (jint(j, "num_attention_heads", true, 0, &heads, where) ||
        jint(j, "attention_head_dim", true, 0, &head_dim, where) ||
        jint(j, "num_layers", true, 0, &c->layers, where) || jint(j, "ffn_dim", true, 0, &c->ffn_dim, where) ||
        jint(j, "in_channels", true, 0, &c->in_channels, where) ||
        jint(j, "out_channels", false, 16, &out_ch, where) ||
        jint(j, "text_dim", false, 4096, &c->text_dim, where) ||
        jint(j, "freq_dim", false, 256, &c->freq_dim, where))
        return -1;
    c->heads = heads;
    c->dim = heads * head_dim;
    c->text_len = WAN_TEXT_LEN;
    if (c->in_channels != out_ch)
        return reel_fail(REEL_E_UNSUPPORTED,
                         "%s: in_channels %" PRId64 " != out_channels %" PRId64 ": an image- or "
                         "video-conditioned model; Reel serves text-to-video only",
                         where, c->in_channels, out_ch);
    const json_t *q = json_object_get(j, "qk_norm");
    if (q && (!json_is_string(q) || strcmp(json_string_value(q), "rms_norm_across_heads")))
        return reel_fail(REEL_E_UNSUPPORTED,
                         "%s: qk_norm is not \"rms_norm_across_heads\": Reel normalises q and k over the whole width",
                         where);
    if (check_common(j, where) ||
        require_true(j, "cross_attn_norm", "normalise before cross-attention (norm2)", where))
        return -1;
    return 0;
}

/* The config of config.json j, either kind; *diffusers says which. */
int wan_json_config(const json_t *j, const char *where, tdit_config_t *c, bool *diffusers) {
    if (!json_is_object(j)) return reel_fail(REEL_E_INVALID, "%s: not a JSON object", where);
    const json_t *cls = json_object_get(j, "_class_name");
    const char *cn = json_string_value(cls);
    if (cls && !cn) return reel_fail(REEL_E_INVALID, "%s: '_class_name' is not a string", where);
    if (cn && strcmp(cn, "WanModel") && strcmp(cn, "WanTransformer3DModel"))
        return reel_fail(REEL_E_UNSUPPORTED,
                         "%s: class '%.64s' is not a Wan2.1 text-to-video transformer (WanModel or "
                         "WanTransformer3DModel)",
                         where, cn);
    *diffusers = cn ? !strcmp(cn, "WanTransformer3DModel") : json_object_get(j, "num_attention_heads") != NULL;
    if ((*diffusers ? diffusers_config : wan_config)(j, where, c) != 0) return -1;
    name_config(c);
    if (tdit_config_validate(c) != 0) return reel_fail(REEL_E_UNSUPPORTED, "%s: %s", where, reel_err_text());
    return 0;
}

