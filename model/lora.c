/* lora.c -- PEFT LoRA adapters read, judged and merged (see lora.h). */
#include "model/lora.h"

#include <cblas.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/sha256.h"
#include "model/pth.h"
#include "model/safetensors.h"

struct lora {
    int r;           /* the config's; from the file: the largest target's */
    double alpha;    /* the config's; from the file: the targets' if all agree, else 0 */
    bool rslora;
    float scale;     /* the config's s; from the file: the targets' if all agree, else 0 */
    bool from_file;  /* no r in the config: ranks and alphas per target from the tensors */
    bool down_up;    /* lora_down / lora_up names (kohya's, ComfyUI's) */
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
#define KOHYA_PREFIX "lora_unet_" /* kohya / musubi-tuner: lora_unet_blocks_0_self_attn_q.lora_down.weight */

/* A key of the adapter file, taken apart. */
typedef enum { KEY_A, KEY_B, KEY_ALPHA } key_kind_t;
typedef struct {
    char weight[80]; /* the base weight: blocks.N.<wan module>.weight */
    key_kind_t kind; /* lora_A / lora_down, lora_B / lora_up, or the module's alpha */
    const char *layout;
} key_t_;

/* The matrix suffixes, PEFT's and kohya's (ComfyUI's Wan LoRAs). */
static const struct {
    const char *s;
    key_kind_t kind;
} suffixes[] = { { ".lora_A", KEY_A }, { ".lora_B", KEY_B }, { ".lora_down", KEY_A }, { ".lora_up", KEY_B } };

/* Whether the n bytes at mod name module m, with '_' for '.' in kohya's
 * names. */
static bool module_is(const char *mod, size_t n, const char *m, bool kohya) {
    if (strlen(m) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (mod[i] != (kohya && m[i] == '.' ? '_' : m[i])) return false;
    return true;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Parses key into *k. -1 naming what the key is when it is not a LoRA
 * A or B of a block Linear. */
static int parse_key(const char *key, key_t_ *k) {
    if (strstr(key, "lora_magnitude_vector") || ends_with(key, ".dora_scale")) /* PEFT's, kohya's */
        return reel_fail(REEL_E_UNSUPPORTED, "DoRA is not supported (key %s; use_dora adapters are refused)", key);
    if (ends_with(key, ".bias") || ends_with(key, ".diff_b"))
        return reel_fail(REEL_E_UNSUPPORTED, "bias training is not supported (key %s)", key);
    if (ends_with(key, ".diff"))
        return reel_fail(REEL_E_UNSUPPORTED, "a full weight difference (.diff) is not a LoRA (key %s)", key);
    const char *s = key;
    bool kohya = !strncmp(s, KOHYA_PREFIX, strlen(KOHYA_PREFIX));
    if (kohya) s += strlen(KOHYA_PREFIX);
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0] && !kohya; i++)
        if (!strncmp(s, prefixes[i], strlen(prefixes[i]))) {
            s += strlen(prefixes[i]);
            break;
        }
    /* where the module's name ends: at its matrix suffix, or its ".alpha" */
    const char *end = NULL;
    if (ends_with(s, ".alpha")) {
        end = s + strlen(s) - strlen(".alpha");
        k->kind = KEY_ALPHA;
    }
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0] && !end; i++) {
        const char *at = strstr(s, suffixes[i].s);
        if (!at) continue;
        const char *tail = at + strlen(suffixes[i].s);
        if (strcmp(tail, ".weight") && strcmp(tail, ".default.weight"))
            return reel_fail(REEL_E_UNSUPPORTED, "unknown target: %s (not a %s weight)", key, suffixes[i].s + 1);
        end = at;
        k->kind = suffixes[i].kind;
    }
    unsigned long blk;
    int at = 0;
    if (!end || sscanf(s, kohya ? "blocks_%lu_%n" : "blocks.%lu.%n", &blk, &at) != 1 || at == 0 || end < s + at)
        return reel_fail(REEL_E_UNSUPPORTED, "unknown target: %s (a LoRA may target the blocks' Linears: self- and "
                         "cross-attention q, k, v, o and the FFN's two, as lora_A/lora_B or lora_down/lora_up "
                         "weights and an optional alpha)", key);
    size_t mlen = (size_t)(end - (s + at));
    const char *mod = s + at;
    for (size_t i = 0; i < N_MODULES; i++) {
        bool wan = module_is(mod, mlen, modules[i].wan, kohya);
        bool dif = module_is(mod, mlen, modules[i].diffusers, kohya);
        if (!wan && !dif) continue;
        k->layout = kohya ? "kohya" : wan ? "wan" : "diffusers";
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
    } else if (!r && !a && !rs) {
        l->from_file = true; /* no r: ranks from the tensors, alpha from each module's or its rank (diffusers') */
        rc = 0;
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

/* The target changing weight (created on first sight), or NULL with a
 * message when there are cap already. */
static lora_target_t *target_for(lora_t *l, const char *weight, size_t cap) {
    lora_target_t *g = target_of(l, weight);
    if (g) return g;
    if ((size_t)l->n == cap) {
        reel_fail(REEL_E_LIMIT, "more than %d targets", LORA_MAX_TARGETS);
        return NULL;
    }
    g = &l->t[l->n++];
    memset(g, 0, sizeof *g);
    snprintf(g->weight, sizeof g->weight, "%s", weight);
    return g;
}

/* A module's alpha: one finite value > 0, with no adapter_config.json r
 * (whose lora_alpha would say otherwise). */
static int add_alpha(lora_t *l, const st_file_t *f, const st_tensor_t *t, const key_t_ *k, size_t cap) {
    if (!l->from_file)
        return reel_fail(REEL_E_INVALID, "%s: a module's alpha beside a config's lora_alpha (one of the two must "
                         "go)", t->name);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    if (n != 1) return reel_fail(REEL_E_INVALID, "%s: an alpha is one value, not %lld", t->name, (long long)n);
    float v;
    if (st_read_f32(f, t->name, t->ndim, t->shape, &v) != 0) return -1;
    if (!isfinite(v) || v <= 0) return reel_fail(REEL_E_INVALID, "%s: alpha %g (a finite value > 0)", t->name, (double)v);
    lora_target_t *g = target_for(l, k->weight, cap);
    if (!g) return -1;
    if (g->has_alpha) return reel_fail(REEL_E_INVALID, "%s: a second alpha for %s", t->name, k->weight);
    g->alpha = v;
    g->has_alpha = true;
    return 0;
}

/* One A or B tensor (or a module's alpha) into its target. */
static int add_tensor(lora_t *l, const st_file_t *f, const st_tensor_t *t, size_t cap) {
    key_t_ k;
    if (parse_key(t->name, &k) != 0) return -1;
    if (l->layout && strcmp(l->layout, k.layout))
        return reel_fail(REEL_E_INVALID, "keys in two layouts' names (%s is %s's, others %s's)", t->name, k.layout,
                         l->layout);
    l->layout = k.layout;
    if (k.kind == KEY_ALPHA) return add_alpha(l, f, t, &k, cap);
    const bool is_b = k.kind == KEY_B;
    if (strstr(t->name, ".lora_down.") || strstr(t->name, ".lora_up.")) l->down_up = true;
    if (t->ndim != 2)
        return reel_fail(REEL_E_INVALID, "%s: %d dimensions, a LoRA matrix has 2", t->name, t->ndim);
    if (t->dtype != KERN_F32 && t->dtype != KERN_BF16 && t->dtype != KERN_F16)
        return reel_fail(REEL_E_UNSUPPORTED, "%s: dtype %s (F32, BF16 or F16 are read)", t->name,
                         kern_dtype_name(t->dtype));
    int64_t rank = is_b ? t->shape[1] : t->shape[0], other = is_b ? t->shape[0] : t->shape[1];
    if (!l->from_file && rank != l->r)
        return reel_fail(REEL_E_INVALID, "%s: rank %lld is not the config's r = %d", t->name, (long long)rank, l->r);
    if (l->from_file && (rank < 1 || rank > LORA_MAX_RANK))
        return reel_fail(rank < 1 ? REEL_E_INVALID : REEL_E_LIMIT, "%s: rank %lld (1..%d)", t->name, (long long)rank,
                         LORA_MAX_RANK);
    if (other < 1) return reel_fail(REEL_E_INVALID, "%s: an empty dimension", t->name);
    lora_target_t *g = target_for(l, k.weight, cap);
    if (!g) return -1;
    if ((g->a || g->b) && g->rank != rank)
        return reel_fail(REEL_E_INVALID, "%s: rank %lld, its other matrix's is %lld", t->name, (long long)rank,
                         (long long)g->rank);
    g->rank = rank;
    if (is_b ? g->b != NULL : g->a != NULL)
        return reel_fail(REEL_E_INVALID, "%s: a second lora_%c for %s", t->name, is_b ? 'B' : 'A', k.weight);
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
    if (is_b) g->out = other, g->b = v;
    else g->in = other, g->a = v;
    l->bytes += t->nbytes;
    return 0;
}

int lora_locate(const char *path, char *cfg, char *weights, size_t len) {
    /* the safetensors first, in the order a worker takes them (it reads no .bin) */
    static const char *const names[] = { "adapter_model.safetensors", "pytorch_lora_weights.safetensors",
                                         "adapter_model.bin" };
    struct stat st;
    if (stat(path, &st) != 0)
        return reel_fail(REEL_E_NOT_FOUND, "%s: no such adapter (a PEFT folder, or a LoRA's weights file)", path);
    if (S_ISDIR(st.st_mode)) {
        snprintf(cfg, len, "%s/adapter_config.json", path);
        weights[0] = '\0';
        for (size_t i = 0; i < sizeof names / sizeof names[0] && !weights[0]; i++) {
            snprintf(weights, len, "%s/%s", path, names[i]);
            if (stat(weights, &st) != 0) weights[0] = '\0';
        }
        if (!weights[0])
            return reel_fail(REEL_E_NOT_FOUND, "%s: no adapter_model.safetensors, adapter_model.bin or "
                             "pytorch_lora_weights.safetensors", path);
    } else {
        const char *slash = strrchr(path, '/');
        snprintf(cfg, len, "%.*sadapter_config.json", slash ? (int)(slash - path + 1) : 0, path);
        snprintf(weights, len, "%s", path);
    }
    if (stat(cfg, &st) != 0) cfg[0] = '\0'; /* none: the config is the file's own (lora_parse) */
    return 0;
}

static lora_t *lora_parse_config(const char *config, size_t config_len, const char *config_name, const st_file_t *f,
                                 const char *sha256);

/* Each target's scale: the config's s, or, from the file, its module's
 * alpha (else its rank, as diffusers takes a LoRA with no alphas) over its
 * rank; then the adapter's r (the largest rank), alpha and s (the targets'
 * when they all agree, else 0: lora_describe says "per target"). */
static int finish_scales(lora_t *l) {
    if (!l->from_file) {
        for (int i = 0; i < l->n; i++) l->t[i].scale = l->scale;
        return 0;
    }
    l->r = 0;
    for (int i = 0; i < l->n; i++) {
        lora_target_t *t = &l->t[i];
        double alpha = t->has_alpha ? t->alpha : (double)t->rank;
        t->scale = (float)(alpha / (double)t->rank);
        if (!isfinite(t->scale)) return reel_fail(REEL_E_INVALID, "%s: alpha %g gives no finite scale", t->weight, alpha);
        if (t->rank > l->r) l->r = (int)t->rank;
        if (i == 0) l->alpha = alpha, l->scale = t->scale;
        else if (l->alpha != alpha || l->scale != t->scale) l->alpha = 0, l->scale = 0;
    }
    return 0;
}

/* Whether an adapter read without a config names its own scale: a
 * module's alpha, kohya's lora_down / lora_up names (whose files carry
 * alphas or mean s = 1, as diffusers loads them), or diffusers' file name
 * (its save_lora_weights writes no config: s = 1). */
static bool says_its_scale(const lora_t *l, const st_file_t *f) {
    for (int i = 0; i < l->n; i++)
        if (l->t[i].has_alpha) return true;
    if (l->down_up) return true;
    const char *o = st_origin(f), *slash = strrchr(o, '/');
    return !strcmp(slash ? slash + 1 : o, "pytorch_lora_weights.safetensors");
}

/* The config diffusers' save_lora_weights keeps in the weights file's
 * metadata (lora_adapter_metadata: a LoraConfig's fields, each under
 * "transformer." for a pipeline's), as adapter_config.json text; NULL
 * when there is none. */
static char *metadata_config(const st_file_t *f) {
    const char *meta = st_meta(f, "lora_adapter_metadata");
    json_t *j = meta ? json_loads(meta, 0, NULL) : NULL;
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    json_t *out = json_object();
    const char *key;
    json_t *v;
    bool prefixed = json_object_get(j, "transformer.r") != NULL;
    json_object_foreach(j, key, v) {
        if (prefixed && strncmp(key, "transformer.", strlen("transformer."))) continue;
        json_object_set(out, prefixed ? key + strlen("transformer.") : key, v);
    }
    char *text = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    json_decref(j);
    return text;
}

lora_t *lora_parse(const char *config, size_t config_len, const char *config_name, const st_file_t *f,
                   const char *sha256) {
    /* No r in the config ("{}" in a SYNC by value, whose sender read the
     * adapter; none found beside the weights: config_len 0): the file's
     * own, diffusers' metadata, else from the tensors. */
    const bool none = config_len == 0;
    if (none) config = "{}", config_len = 2;
    char *meta = NULL;
    json_t *probe = json_loadb(config, config_len, 0, NULL);
    if (probe && json_is_object(probe) && !json_object_get(probe, "r") && (meta = metadata_config(f))) {
        config = meta;
        config_len = strlen(meta);
        config_name = "lora_adapter_metadata";
    }
    json_decref(probe);
    lora_t *l = lora_parse_config(config, config_len, config_name, f, sha256);
    /* With no config at all, the file must say its scale itself: a PEFT
     * file whose adapter_config.json did not come along would otherwise be
     * merged at s = 1, not its lora_alpha / r. */
    if (l && none && !meta && !says_its_scale(l, f)) {
        reel_fail(REEL_E_NOT_FOUND, "%s: no adapter_config.json beside it, and nothing in it says its scale "
                  "(lora_A/lora_B without .alpha keys or diffusers' lora_adapter_metadata): give the adapter's "
                  "adapter_config.json (PEFT), or name diffusers' pytorch_lora_weights.safetensors (s = 1)",
                  st_origin(f));
        lora_close(&l);
    }
    free(meta);
    return l;
}

static lora_t *lora_parse_config(const char *config, size_t config_len, const char *config_name, const st_file_t *f,
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
            if (!l->t[i].a && !l->t[i].b)
                reel_fail(REEL_E_INVALID, "%s: %s has an alpha and no matrices", st_origin(f), l->t[i].weight);
            else
                reel_fail(REEL_E_INVALID, "%s: %s has lora_%c without lora_%c", st_origin(f), l->t[i].weight,
                          l->t[i].a ? 'A' : 'B', l->t[i].a ? 'B' : 'A');
            goto err;
        }
    if (finish_scales(l) != 0) {
        reel_fail_prefix("%s: ", st_origin(f));
        goto err;
    }
    return l;
err:
    lora_close(&l);
    return NULL;
}

bool lora_is_adapter(const char *path) {
    char cfg[4096], weights[4096];
    struct stat st;
    if (stat(path, &st) != 0 || lora_locate(path, cfg, weights, sizeof cfg) != 0) {
        reel_err_clear();
        return false;
    }
    if (cfg[0] && S_ISDIR(st.st_mode)) return true; /* a PEFT folder */
    /* else its first tensor's name says (weights files of a model have none of these) */
    int fd = open(weights, O_RDONLY | O_CLOEXEC);
    st_header_t *h = fd >= 0 ? st_header_read(fd, weights, NULL, NULL) : NULL;
    if (fd >= 0) close(fd);
    bool lora = false;
    for (size_t i = 0; h && i < st_header_count(h) && !lora; i++) {
        const char *n = st_header_at(h, i)->name;
        lora = strstr(n, ".lora_A.") || strstr(n, ".lora_B.") || strstr(n, ".lora_down.") || strstr(n, ".lora_up.");
    }
    st_header_free(&h);
    reel_err_clear();
    return lora;
}

lora_t *lora_open(const char *path) {
    char cfg[4096], weights[4096], sha[65];
    if (lora_locate(path, cfg, weights, sizeof cfg) != 0) return NULL;
    if (!cfg[0]) { /* no adapter_config.json: the weights file's own config, or its tensors' */
        st_file_t *f = NULL;
        lora_t *l = NULL;
        if (reel_sha256_file(weights, sha) == 0 && (f = weights_open_any(weights)))
            l = lora_parse("", 0, weights, f, sha);
        st_close(&f);
        return l;
    }
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
        worst = fmax(worst, fabs((double)t->scale) * (double)t->rank * ma * mb);
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
                t->scale, t->b, (blasint)t->rank, t->a, (blasint)t->in, 1.0f, w, (blasint)t->in);
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
                     "\"bytes\":%zu,\"sha256\":\"%s\",\"layout\":\"%s\",\"config\":\"%s\"}",
                     l->r, l->alpha, l->rslora ? "true" : "false", (double)l->scale, l->n, mods, l->bytes, l->sha,
                     l->layout ? l->layout : "", !l->from_file ? "adapter_config" : l->scale != 0 ? "file" : "per target");
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
