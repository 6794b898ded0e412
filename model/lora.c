/* lora.c -- PEFT LoRA adapters read, judged and merged (see lora.h). */
#include "model/lora.h"

#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/sha256.h"
#include "model/pth.h"
#include "model/safetensors.h"

struct lora {
    int r;
    double alpha;
    bool rslora;
    float scale;
    const char *layout;
    char sha[65];
    size_t bytes;
    int n;
    lora_target_t *t;
};

/* ---- names ------------------------------------------------------------------------- */

/* The blocks' Linears, by the name of the module in each layout. */
static const struct {
    const char *wan, *diffusers;
} modules[] = {
    { "self_attn.q", "attn1.to_q" },   { "self_attn.k", "attn1.to_k" },   { "self_attn.v", "attn1.to_v" },
    { "self_attn.o", "attn1.to_out.0" }, { "cross_attn.q", "attn2.to_q" }, { "cross_attn.k", "attn2.to_k" },
    { "cross_attn.v", "attn2.to_v" },  { "cross_attn.o", "attn2.to_out.0" }, { "ffn.0", "ffn.net.0.proj" },
    { "ffn.2", "ffn.net.2" },
};
#define N_MODULES (sizeof modules / sizeof modules[0])

static const char *const prefixes[] = { "base_model.model.", "transformer.", "diffusion_model." };

/* A key of the adapter file, taken apart. */
typedef struct {
    char weight[80]; /* the base weight: blocks.N.<wan module>.weight */
    bool is_b;       /* lora_B (else lora_A) */
    const char *layout;
} key_t_;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Parses key into *k. -1 naming what the key is when it is not a LoRA
 * A or B of a block Linear. */
static int parse_key(const char *key, key_t_ *k) {
    if (strstr(key, "lora_magnitude_vector"))
        return reel_fail(REEL_E_UNSUPPORTED, "DoRA is not supported (key %s; use_dora adapters are refused)", key);
    if (ends_with(key, ".bias"))
        return reel_fail(REEL_E_UNSUPPORTED, "bias training is not supported (key %s)", key);
    const char *s = key;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (!strncmp(s, prefixes[i], strlen(prefixes[i]))) {
            s += strlen(prefixes[i]);
            break;
        }
    unsigned long blk;
    int at = 0;
    const char *ab = strstr(s, ".lora_A");
    k->is_b = false;
    if (!ab && (ab = strstr(s, ".lora_B"))) k->is_b = true;
    if (sscanf(s, "blocks.%lu.%n", &blk, &at) != 1 || at == 0 || !ab || ab < s + at)
        return reel_fail(REEL_E_UNSUPPORTED, "unknown target: %s (a LoRA may target the blocks' Linears: self- and "
                         "cross-attention q, k, v, o and the FFN's two)", key);
    const char *tail = ab + strlen(".lora_A");
    if (strcmp(tail, ".weight") && strcmp(tail, ".default.weight"))
        return reel_fail(REEL_E_UNSUPPORTED, "unknown target: %s (not a lora_A/lora_B weight)", key);
    size_t mlen = (size_t)(ab - (s + at));
    const char *mod = s + at;
    for (size_t i = 0; i < N_MODULES; i++) {
        bool wan = strlen(modules[i].wan) == mlen && !strncmp(mod, modules[i].wan, mlen);
        bool dif = strlen(modules[i].diffusers) == mlen && !strncmp(mod, modules[i].diffusers, mlen);
        if (!wan && !dif) continue;
        k->layout = wan ? "wan" : "diffusers";
        snprintf(k->weight, sizeof k->weight, "blocks.%lu.%s.weight", blk, modules[i].wan);
        return 0;
    }
    return reel_fail(REEL_E_UNSUPPORTED, "unknown target: %s (module '%.*s' is not one of the blocks' Linears)", key,
                     (int)mlen, mod);
}

/* ---- the config ---------------------------------------------------------------------- */

/* A JSON value that counts as "not set": absent, null, false, an empty
 * list or object, "none". */
static bool unset(const json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) || (json_is_array(v) && json_array_size(v) == 0) ||
           (json_is_object(v) && json_object_size(v) == 0) || (json_is_string(v) && !strcmp(json_string_value(v), "none"));
}

static int read_config(lora_t *l, const char *text, size_t len, const char *path) {
    json_error_t e;
    json_t *j = json_loadb(text, len, 0, &e);
    if (!j) return reel_fail(REEL_E_INVALID, "%s: %s (line %d)", path, e.text, e.line);
    int rc = -1;
    const json_t *pt = json_object_get(j, "peft_type"), *r = json_object_get(j, "r"),
                 *a = json_object_get(j, "lora_alpha"), *rs = json_object_get(j, "use_rslora");
    if (!json_is_object(j)) {
        reel_fail(REEL_E_INVALID, "%s: not a JSON object", path);
    } else if (pt && !(json_is_string(pt) && !strcmp(json_string_value(pt), "LORA"))) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: peft_type %s is not supported (LORA is)", path,
                  json_is_string(pt) ? json_string_value(pt) : "(not a string)");
    } else if (!unset(json_object_get(j, "use_dora"))) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: DoRA (use_dora) is not supported", path);
    } else if (!unset(json_object_get(j, "bias")) || !unset(json_object_get(j, "lora_bias"))) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: bias training (bias, lora_bias) is not supported", path);
    } else if (!unset(json_object_get(j, "modules_to_save"))) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: modules_to_save is not supported (an adapter changes Linears only)", path);
    } else if (!unset(json_object_get(j, "rank_pattern")) || !unset(json_object_get(j, "alpha_pattern"))) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: rank_pattern and alpha_pattern are not supported (one r and alpha)", path);
    } else if (!unset(json_object_get(j, "fan_in_fan_out"))) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: fan_in_fan_out is not supported (Wan's Linears store [out, in])", path);
    } else if (!json_is_integer(r) || json_integer_value(r) < 1) {
        reel_fail(REEL_E_INVALID, "%s: r must be a positive integer", path);
    } else if (json_integer_value(r) > LORA_MAX_RANK) {
        reel_fail(REEL_E_LIMIT, "%s: rank r = %lld is above %d", path, (long long)json_integer_value(r), LORA_MAX_RANK);
    } else if (a && !json_is_number(a)) {
        reel_fail(REEL_E_INVALID, "%s: lora_alpha must be a number", path);
    } else if (rs && !json_is_boolean(rs)) {
        reel_fail(REEL_E_INVALID, "%s: use_rslora must be true or false", path);
    } else {
        l->r = (int)json_integer_value(r);
        l->alpha = a ? json_number_value(a) : 8.0; /* PEFT's default lora_alpha */
        l->rslora = rs && json_is_true(rs);
        l->scale = (float)(l->rslora ? l->alpha / sqrt((double)l->r) : l->alpha / l->r);
        if (!isfinite(l->scale)) reel_fail(REEL_E_INVALID, "%s: lora_alpha %g gives no finite scale", path, l->alpha);
        else rc = 0;
    }
    json_decref(j);
    return rc;
}

/* ---- the weights --------------------------------------------------------------------- */

static lora_target_t *target_of(lora_t *l, const char *weight) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].weight, weight)) return &l->t[i];
    return NULL;
}

/* One A or B tensor into its target (created on first sight). */
static int add_tensor(lora_t *l, const st_file_t *f, const st_tensor_t *t, size_t cap) {
    key_t_ k;
    if (parse_key(t->name, &k) != 0) return -1;
    if (l->layout && strcmp(l->layout, k.layout))
        return reel_fail(REEL_E_INVALID, "keys in both Wan's and diffusers' names (%s is %s's)", t->name, k.layout);
    l->layout = k.layout;
    if (t->ndim != 2)
        return reel_fail(REEL_E_INVALID, "%s: %d dimensions, a LoRA matrix has 2", t->name, t->ndim);
    if (t->dtype != KERN_F32 && t->dtype != KERN_BF16 && t->dtype != KERN_F16)
        return reel_fail(REEL_E_UNSUPPORTED, "%s: dtype %s (F32, BF16 or F16 are read)", t->name,
                         kern_dtype_name(t->dtype));
    int64_t rank = k.is_b ? t->shape[1] : t->shape[0], other = k.is_b ? t->shape[0] : t->shape[1];
    if (rank != l->r)
        return reel_fail(REEL_E_INVALID, "%s: rank %lld is not the config's r = %d", t->name, (long long)rank, l->r);
    if (other < 1) return reel_fail(REEL_E_INVALID, "%s: an empty dimension", t->name);
    lora_target_t *g = target_of(l, k.weight);
    if (!g) {
        if ((size_t)l->n == cap) return reel_fail(REEL_E_LIMIT, "more than %d targets", LORA_MAX_TARGETS);
        g = &l->t[l->n++];
        memset(g, 0, sizeof *g);
        snprintf(g->weight, sizeof g->weight, "%s", k.weight);
        g->rank = rank;
    }
    if (k.is_b ? g->b != NULL : g->a != NULL)
        return reel_fail(REEL_E_INVALID, "%s: a second lora_%c for %s", t->name, k.is_b ? 'B' : 'A', k.weight);
    size_t n = (size_t)(rank * other);
    float *v = malloc(n * sizeof *v);
    if (!v) return reel_fail(REEL_E_NOMEM, "out of memory");
    if (st_read_f32(f, t->name, 2, t->shape, v) != 0) {
        free(v);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) {
            free(v);
            return reel_fail(REEL_E_INVALID, "%s: NaN or infinite values", t->name);
        }
    if (k.is_b) g->out = other, g->b = v;
    else g->in = other, g->a = v;
    l->bytes += t->nbytes;
    return 0;
}

/* The folder and the two files of an adapter at path. */
static int locate(const char *path, char *cfg, char *weights, size_t len) {
    struct stat st;
    if (stat(path, &st) != 0) return reel_fail(REEL_E_NOT_FOUND, "%s: no such adapter (a PEFT folder)", path);
    if (S_ISDIR(st.st_mode)) {
        snprintf(cfg, len, "%s/adapter_config.json", path);
        snprintf(weights, len, "%s/adapter_model.safetensors", path);
        if (stat(weights, &st) != 0) snprintf(weights, len, "%s/adapter_model.bin", path);
    } else {
        const char *slash = strrchr(path, '/');
        snprintf(cfg, len, "%.*sadapter_config.json", slash ? (int)(slash - path + 1) : 0, path);
        snprintf(weights, len, "%s", path);
    }
    if (stat(cfg, &st) != 0)
        return reel_fail(REEL_E_NOT_FOUND, "%s: no adapter_config.json (a PEFT adapter folder holds it)", cfg);
    if (stat(weights, &st) != 0)
        return reel_fail(REEL_E_NOT_FOUND, "%s: no adapter_model.safetensors or adapter_model.bin", path);
    return 0;
}

lora_t *lora_parse(const char *config, size_t config_len, const char *config_name, const st_file_t *f,
                   const char *sha256) {
    lora_t *l = calloc(1, sizeof *l);
    if (!l) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    snprintf(l->sha, sizeof l->sha, "%s", sha256 ? sha256 : "");
    if (read_config(l, config, config_len, config_name) != 0) goto err;
    size_t cap = st_count(f) < LORA_MAX_TARGETS ? st_count(f) : LORA_MAX_TARGETS;
    if (!(l->t = calloc(cap ? cap : 1, sizeof *l->t))) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto err;
    }
    for (size_t i = 0; i < st_count(f); i++)
        if (add_tensor(l, f, st_at(f, i), cap) != 0) {
            reel_fail_prefix("%s: ", st_origin(f));
            goto err;
        }
    if (l->n == 0) {
        reel_fail(REEL_E_INVALID, "%s: no LoRA tensors", st_origin(f));
        goto err;
    }
    for (int i = 0; i < l->n; i++)
        if (!l->t[i].a || !l->t[i].b) {
            reel_fail(REEL_E_INVALID, "%s: %s has lora_%c without lora_%c", st_origin(f), l->t[i].weight,
                      l->t[i].a ? 'A' : 'B', l->t[i].a ? 'B' : 'A');
            goto err;
        }
    return l;
err:
    lora_close(&l);
    return NULL;
}

lora_t *lora_open(const char *path) {
    char cfg[4096], weights[4096], sha[65];
    if (locate(path, cfg, weights, sizeof cfg) != 0) return NULL;
    FILE *cf = fopen(cfg, "rb");
    if (!cf) {
        reel_fail(REEL_E_IO, "%s: cannot read it", cfg);
        return NULL;
    }
    char *text = malloc(LORA_CONFIG_MAX + 1);
    size_t n = text ? fread(text, 1, LORA_CONFIG_MAX + 1, cf) : 0;
    fclose(cf);
    if (!text) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    lora_t *l = NULL;
    st_file_t *f = NULL;
    if (n > LORA_CONFIG_MAX) reel_fail(REEL_E_LIMIT, "%s: larger than %d bytes", cfg, LORA_CONFIG_MAX);
    else if (reel_sha256_file(weights, sha) == 0 && (f = weights_open_any(weights)))
        l = lora_parse(text, n, cfg, f, sha);
    st_close(&f);
    free(text);
    return l;
}

void lora_close(lora_t **lp) {
    if (!lp || !*lp) return;
    lora_t *l = *lp;
    for (int i = 0; i < l->n; i++) {
        free((void *)l->t[i].a);
        free((void *)l->t[i].b);
    }
    free(l->t);
    free(l);
    *lp = NULL;
}

int lora_check(const lora_t *l, const tdit_config_t *c) {
    size_t n;
    tdit_weight_t *w = tdit_config_weights(c, &n);
    if (!w) return -1;
    int rc = 0;
    for (int i = 0; i < l->n && rc == 0; i++) {
        const lora_target_t *t = &l->t[i];
        const tdit_weight_t *m = NULL;
        for (size_t j = 0; j < n && !m; j++)
            if (!strcmp(w[j].name, t->weight)) m = &w[j];
        if (!m)
            rc = reel_fail(REEL_E_INVALID, "the adapter targets %s, which model %s (%lld layers) does not have",
                           t->weight, c->name, (long long)c->layers);
        else if (m->ndim != 2 || m->shape[0] != t->out || m->shape[1] != t->in)
            rc = reel_fail(REEL_E_INVALID,
                           "shape mismatch: the adapter changes %s as [%lld, %lld] (B [%lld, %lld] x A [%lld, %lld]), "
                           "model %s has [%lld, %lld]",
                           t->weight, (long long)t->out, (long long)t->in, (long long)t->out, (long long)t->rank,
                           (long long)t->rank, (long long)t->in, c->name, (long long)m->shape[0],
                           (long long)(m->ndim > 1 ? m->shape[1] : 0));
    }
    free(w);
    if (rc == 0 && lora_max_delta(l) >= LORA_MAX_DELTA)
        rc = reel_fail(REEL_E_INVALID, "its merge could overflow F32: |s|·r·max|B|·max|A| = %g (lora_alpha %g, r %d)",
                       lora_max_delta(l), l->alpha, l->r);
    return rc;
}

double lora_max_delta(const lora_t *l) {
    double worst = 0;
    for (int i = 0; i < l->n; i++) {
        const lora_target_t *t = &l->t[i];
        double ma = 0, mb = 0;
        for (int64_t j = 0; j < t->rank * t->in; j++) ma = fmax(ma, fabs((double)t->a[j]));
        for (int64_t j = 0; j < t->out * t->rank; j++) mb = fmax(mb, fabs((double)t->b[j]));
        worst = fmax(worst, fabs((double)l->scale) * (double)t->rank * ma * mb);
    }
    return worst;
}

int lora_rank(const lora_t *l) { return l->r; }
double lora_alpha(const lora_t *l) { return l->alpha; }
bool lora_rslora(const lora_t *l) { return l->rslora; }
float lora_scale(const lora_t *l) { return l->scale; }
const char *lora_layout(const lora_t *l) { return l->layout; }
const char *lora_sha256(const lora_t *l) { return l->sha; }
size_t lora_bytes(const lora_t *l) { return l->bytes; }
int lora_n_targets(const lora_t *l) { return l->n; }
const lora_target_t *lora_target(const lora_t *l, int i) { return i >= 0 && i < l->n ? &l->t[i] : NULL; }

const lora_target_t *lora_find(const lora_t *l, const char *name) { return target_of((lora_t *)l, name); }

int lora_merge_into(const lora_t *l, const char *name, float *w, int64_t numel) {
    const lora_target_t *t = lora_find(l, name);
    if (!t) return 0;
    if (numel != t->out * t->in)
        return reel_fail(REEL_E_INVALID, "%s: %lld values, the adapter needs [%lld, %lld]", name, (long long)numel,
                         (long long)t->out, (long long)t->in);
    /* W[out, in] += s · B[out, r] · A[r, in] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)t->out, (blasint)t->in, (blasint)t->rank,
                l->scale, t->b, (blasint)t->rank, t->a, (blasint)t->in, 1.0f, w, (blasint)t->in);
    return 0;
}

int lora_describe(const lora_t *l, char *buf, size_t len) {
    char mods[256] = "";
    for (int i = 0; i < l->n; i++) {
        const char *m = strchr(l->t[i].weight + strlen("blocks."), '.');
        if (!m) continue;
        char one[48];
        snprintf(one, sizeof one, "%.*s", (int)(strlen(m + 1) - strlen(".weight")), m + 1);
        char tok[52];
        snprintf(tok, sizeof tok, ",%s,", one);
        char have[260];
        snprintf(have, sizeof have, ",%s,", mods);
        if (!strstr(have, tok) && strlen(mods) + strlen(one) + 2 < sizeof mods)
            snprintf(mods + strlen(mods), sizeof mods - strlen(mods), "%s%s", mods[0] ? "," : "", one);
    }
    int n = snprintf(buf, len,
                     "{\"rank\":%d,\"alpha\":%g,\"rslora\":%s,\"scale\":%g,\"targets\":%d,\"modules\":\"%s\","
                     "\"bytes\":%zu,\"sha256\":\"%s\",\"layout\":\"%s\"}",
                     l->r, l->alpha, l->rslora ? "true" : "false", (double)l->scale, l->n, mods, l->bytes, l->sha,
                     l->layout ? l->layout : "");
    return n > 0 && (size_t)n < len ? 0 : reel_fail(REEL_E_LIMIT, "adapter description over %zu bytes", len);
}

static bool edit_want(void *user, const char *name) { return lora_find(user, name) != NULL; }

static int edit_adjust(void *user, const char *name, float *w, int64_t numel) {
    return lora_merge_into(user, name, w, numel);
}

tdit_weight_edit_t lora_edit(const lora_t *l, bool targets_only) {
    tdit_weight_edit_t e = { targets_only ? edit_want : NULL, edit_adjust, (void *)l };
    return e;
}
