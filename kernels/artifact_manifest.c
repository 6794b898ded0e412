/* artifact_manifest.c -- the schema of an artifact's manifest.json, checked
 * field by field with jansson (duplicate keys rejected, unknown keys
 * refused), and the table of ops an artifact may replace.
 *
 * Pure: no files, no loading. The parser is fuzzed
 * (tests/fuzz/fuzz_manifest.c): every path returns 0 or -1 with a message,
 * whatever the bytes. */
#include "artifact_impl.h"
#include "base/parse.h"
#include "base/error.h"
#include "base/names.h"
#include "ops_args.h"
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- the ops ------------------------------------------------------------- */

static void gemm_sizes(const void *args, int64_t *o) {
    const kern_gemm_args_t *a = args;
    o[0] = a->M, o[1] = a->N, o[2] = a->K, o[3] = a->bias != NULL, o[4] = a->group;
}
static int64_t gemm_out(const void *args) {
    const kern_gemm_args_t *a = args;
    return a->M > 0 && a->N > 0 ? a->M * a->N : 0;
}
static void attn_sizes(const void *args, int64_t *o) {
    const kern_attention_args_t *a = args;
    o[0] = a->nq, o[1] = a->nk, o[2] = a->heads, o[3] = a->head_dim;
}
/* Every sample's output: a batch (ABI 3) writes batch·nq rows. */
static int64_t attn_out(const void *args) {
    const kern_attention_args_t *a = args;
    return a->nq > 0 && a->heads > 0 && a->head_dim > 0 ? (a->batch > 1 ? a->batch : 1) * a->nq * a->heads * a->head_dim
                                                         : 0;
}
static void unary_sizes(const void *args, int64_t *o) { o[0] = ((const kern_unary_args_t *)args)->n; }
static int64_t unary_out(const void *args) {
    int64_t n = ((const kern_unary_args_t *)args)->n;
    return n > 0 ? n : 0;
}
static void lnmod_sizes(const void *args, int64_t *o) {
    const kern_norm_modulate_args_t *a = args;
    o[0] = a->rows, o[1] = a->dim;
}
static int64_t lnmod_out(const void *args) {
    const kern_norm_modulate_args_t *a = args;
    return a->rows > 0 && a->dim > 0 ? a->rows * a->dim : 0;
}

/* Ops with one output buffer the shadow run can redirect. In-place ops
 * (rope3d, gated_residual, the step updates) are left out: their output is
 * their input, so a shadow run would need a copy of it first. */
static const art_op_t ops[] = {
    { KERN_OP_GEMM, sizeof(kern_gemm_args_t), 5, { "M", "N", "K", "bias", "group" }, gemm_sizes,
      offsetof(kern_gemm_args_t, y), gemm_out },
    { KERN_OP_GEMM_GELU, sizeof(kern_gemm_args_t), 5, { "M", "N", "K", "bias", "group" }, gemm_sizes,
      offsetof(kern_gemm_args_t, y), gemm_out },
    { KERN_OP_ATTENTION, sizeof(kern_attention_args_t), 4, { "nq", "nk", "heads", "head_dim" },
      attn_sizes, offsetof(kern_attention_args_t, o), attn_out },
    { KERN_OP_GELU_TANH, sizeof(kern_unary_args_t), 1, { "n" }, unary_sizes,
      offsetof(kern_unary_args_t, y), unary_out },
    { KERN_OP_SILU, sizeof(kern_unary_args_t), 1, { "n" }, unary_sizes,
      offsetof(kern_unary_args_t, y), unary_out },
    { KERN_OP_LAYERNORM_MODULATE, sizeof(kern_norm_modulate_args_t), 2, { "rows", "dim" },
      lnmod_sizes, offsetof(kern_norm_modulate_args_t, y), lnmod_out },
};

const art_op_t *art_op(kern_op_t op) {
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (ops[i].op == op) return &ops[i];
    return NULL;
}

bool kern_art_op_supported(kern_op_t op) { return art_op(op) != NULL; }

/* ---- small parsers --------------------------------------------------------- */

/* A plain file name: no slash, no leading dot, [A-Za-z0-9_.+-]. */
static bool file_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= KERN_ART_FILE_MAX || s[0] == '.') return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_.+-", s[i])) return false;
    return true;
}

int kern_art_parity_parse(const char *s, kern_parity_kind_t *kind, double *max_rel) {
    if (!strcmp(s, "byte_equal")) {
        *kind = KERN_PARITY_BYTE_EQUAL;
        *max_rel = 0;
        return 0;
    }
    double r;
    if (!strncmp(s, "max_rel=", 8) && reel_parse_f64(s + 8, 0, 1, "max_rel", &r) == 0) {
        if (r > 0) {
            *kind = KERN_PARITY_MAX_REL;
            *max_rel = r;
            return 0;
        }
    }
    return reel_fail(REEL_E_INVALID, "parity '%.40s': expected byte_equal or max_rel=R with 0 < R <= 1", s);
}

const char *kern_art_timing_name(kern_art_timing_t t) {
    return t == KERN_ART_TIMING_OFF ? "off" : t == KERN_ART_TIMING_SYNC ? "sync"
         : t == KERN_ART_TIMING_SHADOW ? "shadow" : "?";
}

int kern_art_timing_parse(const char *s, kern_art_timing_t *out) {
    if (!strcmp(s, "off")) *out = KERN_ART_TIMING_OFF;
    else if (!strcmp(s, "sync")) *out = KERN_ART_TIMING_SYNC;
    else if (!strcmp(s, "shadow")) *out = KERN_ART_TIMING_SHADOW;
    else return reel_fail(REEL_E_INVALID, "artifact timing '%.40s': expected off, sync or shadow", s);
    return 0;
}

static int op_parse(const char *s, kern_op_t *out) {
    for (int i = 0; i < KERN_OP_COUNT; i++)
        if (!strcmp(s, kern_op_name((kern_op_t)i))) {
            *out = (kern_op_t)i;
            return 0;
        }
    return -1;
}

/* ---- the manifest ------------------------------------------------------------ */

static int str_field(json_t *o, const char *key, bool required, char *dst, size_t max,
                     bool (*ok)(const char *, size_t)) {
    json_t *v = json_object_get(o, key);
    if (!v) {
        if (required) return reel_fail(REEL_E_INVALID, "manifest: \"%s\" is missing", key);
        dst[0] = '\0';
        return 0;
    }
    if (!json_is_string(v)) return reel_fail(REEL_E_INVALID, "manifest: \"%s\" must be a string", key);
    const char *s = json_string_value(v);
    if (strlen(s) != json_string_length(v) || !ok(s, max))
        return reel_fail(REEL_E_INVALID, "manifest: \"%s\" must be 1..%zu characters of [A-Za-z0-9_.:+-]", key,
                         max - 1);
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

/* A string of json_t, refusing embedded NULs. */
static const char *plain_string(json_t *v) {
    if (!json_is_string(v)) return NULL;
    const char *s = json_string_value(v);
    return strlen(s) == json_string_length(v) ? s : NULL;
}

static int parse_arch(json_t *v, kern_art_manifest_t *m) {
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > KERN_ART_MAX_ARCH)
        return reel_fail(REEL_E_INVALID, "manifest: \"arch\" must be an array of 1..%d names", KERN_ART_MAX_ARCH);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *s = plain_string(json_array_get(v, i));
        if (!s || !reel_name_valid(s, KERN_ART_ARCH_MAX))
            return reel_fail(REEL_E_INVALID, "manifest: \"arch\"[%zu] must be a name of [A-Za-z0-9_.:+-] "
                             "(\"any\", \"cpu-avx2\", \"sm_90\")", i);
        memcpy(m->arch[m->n_arch++], s, strlen(s) + 1);
    }
    return 0;
}

static int parse_dtypes(json_t *v, kern_art_manifest_t *m) {
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > KERN_DTYPE_COUNT)
        return reel_fail(REEL_E_INVALID, "manifest: \"dtypes\" must be an array of 1..%d dtype names",
                         KERN_DTYPE_COUNT);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *s = plain_string(json_array_get(v, i));
        kern_dtype_t dt;
        if (!s || kern_dtype_parse(s, &dt) != 0)
            return reel_fail(REEL_E_INVALID, "manifest: \"dtypes\"[%zu] must be F32, BF16 or F16", i);
        if (m->dtypes & (1u << dt)) return reel_fail(REEL_E_INVALID, "manifest: \"dtypes\" names %s twice", s);
        m->dtypes |= 1u << dt;
    }
    return 0;
}

static int parse_shapes(json_t *v, kern_art_manifest_t *m) {
    const art_op_t *op = art_op(m->op);
    if (!json_is_object(v)) return reel_fail(REEL_E_INVALID, "manifest: \"shapes\" must be an object");
    const char *key;
    json_t *r;
    json_object_foreach(v, key, r) {
        int d = -1;
        for (int i = 0; i < op->n_dims; i++)
            if (!strcmp(key, op->dims[i])) d = i;
        if (d < 0) {
            char names[96] = "";
            for (int i = 0; i < op->n_dims; i++) {
                strcat(names, i ? ", " : "");
                strcat(names, op->dims[i]);
            }
            return reel_fail(REEL_E_INVALID, "manifest: \"shapes\": op %s has no size \"%.32s\" (its sizes: %s)",
                             kern_op_name(m->op), key, names);
        }
        if (!json_is_array(r) || json_array_size(r) != 2 ||
            !json_is_integer(json_array_get(r, 0)) || !json_is_integer(json_array_get(r, 1)))
            return reel_fail(REEL_E_INVALID, "manifest: \"shapes\".%s must be [min, max] integers", key);
        int64_t lo = json_integer_value(json_array_get(r, 0));
        int64_t hi = json_integer_value(json_array_get(r, 1));
        if (lo < 0 || hi < lo)
            return reel_fail(REEL_E_INVALID, "manifest: \"shapes\".%s: need 0 <= min <= max", key);
        kern_art_range_t *x = &m->shapes[m->n_shapes++];
        snprintf(x->name, sizeof x->name, "%s", key);
        x->min = lo;
        x->max = hi;
    }
    return 0;
}

static bool hex64(const char *s) {
    if (strlen(s) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    return true;
}

static int parse_files(json_t *v, kern_art_manifest_t *m) {
    if (!json_is_object(v) || json_object_size(v) < 1 || json_object_size(v) > KERN_ART_MAX_FILES)
        return reel_fail(REEL_E_INVALID, "manifest: \"files\" must map 1..%d file names to sha256 digests",
                         KERN_ART_MAX_FILES);
    const char *key;
    json_t *h;
    json_object_foreach(v, key, h) {
        const char *s = plain_string(h);
        if (!file_name_ok(key) || !strcmp(key, "manifest.json"))
            return reel_fail(REEL_E_INVALID, "manifest: \"files\": \"%.64s\" is not a plain file name of the "
                             "bundle (no slash, no leading dot, not manifest.json)", key);
        if (!s || !hex64(s))
            return reel_fail(REEL_E_INVALID, "manifest: \"files\".%s must be a sha256 digest (64 hex digits)", key);
        kern_art_file_t *f = &m->files[m->n_files++];
        memcpy(f->name, key, strlen(key) + 1);
        for (int i = 0; i < 64; i++) f->sha256[i] = (char)tolower((unsigned char)s[i]);
        f->sha256[64] = '\0';
    }
    return 0;
}

static const char *const known_keys[] = {
    "id", "version", "op", "region", "backend", "arch", "dtypes", "shapes", "parity", "abi",
    "object", "files",
};

static int parse_obj(json_t *o, kern_art_manifest_t *m) {
    if (!json_is_object(o)) return reel_fail(REEL_E_INVALID, "manifest: not a JSON object");
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        bool known = false;
        for (size_t i = 0; i < sizeof known_keys / sizeof known_keys[0]; i++)
            if (!strcmp(key, known_keys[i])) known = true;
        if (!known) return reel_fail(REEL_E_INVALID, "manifest: unknown key \"%.40s\"", key);
    }
    if (str_field(o, "id", true, m->id, sizeof m->id, reel_name_valid) ||
        str_field(o, "version", true, m->version, sizeof m->version, reel_name_valid) ||
        str_field(o, "region", false, m->region, sizeof m->region, reel_name_valid))
        return -1;
    static const char *const regions[] = { KERN_ART_REGIONS };
    bool region_known = !m->region[0];
    for (size_t i = 0; i < sizeof regions / sizeof regions[0] && !region_known; i++)
        region_known = !strcmp(m->region, regions[i]);
    if (!region_known)
        return reel_fail(REEL_E_INVALID, "manifest: \"region\": no region named \"%.40s\" (embed, embed.time, embed.text, "
                         "embed.patch, block, block.self_attn, block.cross_attn, block.ffn, head, attention, ffn)",
                         m->region);
    const char *s = plain_string(json_object_get(o, "op"));
    if (!s) return reel_fail(REEL_E_INVALID, "manifest: \"op\" must be a string (a registry op name)");
    if (op_parse(s, &m->op) != 0) return reel_fail(REEL_E_INVALID, "manifest: \"op\": no op named \"%.40s\"", s);
    if (!art_op(m->op))
        return reel_fail(REEL_E_INVALID, "manifest: \"op\": %s cannot be replaced by an artifact (supported: "
                         "gemm, gemm_gelu, attention, gelu_tanh, silu, layernorm_modulate)", s);
    s = plain_string(json_object_get(o, "backend"));
    if (!s || (strcmp(s, "cpu") && strcmp(s, "cuda")))
        return reel_fail(REEL_E_INVALID, "manifest: \"backend\" must be \"cpu\" or \"cuda\"");
    m->backend = !strcmp(s, "cuda") ? KERN_BACKEND_CUDA : KERN_BACKEND_CPU;
    if (!json_object_get(o, "arch")) return reel_fail(REEL_E_INVALID, "manifest: \"arch\" is missing");
    if (parse_arch(json_object_get(o, "arch"), m)) return -1;
    if (!json_object_get(o, "dtypes")) return reel_fail(REEL_E_INVALID, "manifest: \"dtypes\" is missing");
    if (parse_dtypes(json_object_get(o, "dtypes"), m)) return -1;
    if (json_object_get(o, "shapes") && parse_shapes(json_object_get(o, "shapes"), m)) return -1;
    s = plain_string(json_object_get(o, "parity"));
    if (!s) return reel_fail(REEL_E_INVALID, "manifest: \"parity\" must be \"byte_equal\" or \"max_rel=R\"");
    if (kern_art_parity_parse(s, &m->parity, &m->max_rel) != 0) {
        char why[160];
        snprintf(why, sizeof why, "%s", reel_err_text());
        return reel_fail(REEL_E_INVALID, "manifest: %s", why);
    }
    json_t *abi = json_object_get(o, "abi");
    if (!json_is_integer(abi) || json_integer_value(abi) < 1 || json_integer_value(abi) > 1000000)
        return reel_fail(REEL_E_INVALID, "manifest: \"abi\" must be a positive integer");
    m->abi = (uint32_t)json_integer_value(abi);
    s = plain_string(json_object_get(o, "object"));
    if (!s || !file_name_ok(s)) return reel_fail(REEL_E_INVALID, "manifest: \"object\" must name the shared object file");
    memcpy(m->object, s, strlen(s) + 1);
    if (!json_object_get(o, "files")) return reel_fail(REEL_E_INVALID, "manifest: \"files\" is missing");
    if (parse_files(json_object_get(o, "files"), m)) return -1;
    for (int i = 0; i < m->n_files; i++)
        if (!strcmp(m->files[i].name, m->object)) return 0;
    return reel_fail(REEL_E_INVALID, "manifest: the object %s has no digest in \"files\"", m->object);
}

int kern_art_manifest_parse(const char *text, size_t len, kern_art_manifest_t *out) {
    memset(out, 0, sizeof *out);
    if (len > KERN_ART_MANIFEST_MAX)
        return reel_fail(REEL_E_LIMIT, "manifest: %zu bytes, more than %d", len, KERN_ART_MANIFEST_MAX);
    json_error_t jerr;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) return reel_fail(REEL_E_INVALID, "manifest: not JSON (line %d: %.120s)", jerr.line, jerr.text);
    int rc = parse_obj(o, out);
    json_decref(o);
    return rc;
}
