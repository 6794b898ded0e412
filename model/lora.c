/* lora.c -- PEFT LoRA adapters read, judged and merged (see lora.h). */
#include "model/lora.h"

#include <cblas.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/sha256.h"
#include "model/pth.h"
#include "model/safetensors.h"

/* One key of rank_pattern or alpha_pattern: PEFT's regex, compiled as
 * POSIX ERE ^(.*\.)?(KEY)$ (PEFT's re.match(rf"(.*\.)?({key})$", name)),
 * and its value. A key of plain characters, '.' and escaped punctuation
 * (a module's name, as tools that give each module its rank write it) is
 * kept as lit instead, compared without a regex (pattern_matches). */
typedef struct {
    regex_t re;     /* when !lit */
    char *lit;      /* a literal key's characters, 0 for its '.'s (any character but a newline); or NULL */
    size_t lit_len;
    char *key;
    double v;
} lora_pattern_t;

struct lora {
    int r;           /* the config's (with patterns: the largest target's); from the file: the largest target's */
    double alpha;    /* the config's; from the file: the targets' if all agree, else 0 */
    bool rslora;
    float scale;     /* the config's s; from the file: the targets' if all agree, else 0 */
    bool from_file;  /* no r in the config: ranks and alphas per target from the tensors */
    bool down_up;    /* lora_down / lora_up names (kohya's, ComfyUI's) */
    bool not_peft;   /* a low-rank key under diffusion_model. or transformer.: a name PEFT never
                      * saves (its keys are base_model.model.<name>), diffusers' loader takes s = 1 */
    int lora_bias;   /* the config's "lora_bias": 1 true, 0 false, -1 not said */
    int use_dora;    /* the config's "use_dora": 1 true, 0 false, -1 not said */
    lora_pattern_t *pat[2]; /* rank_pattern, alpha_pattern, in the config's order (the first match wins) */
    int npat[2];
    long regex_runs;        /* regexec calls while reading (lora_regex_runs) */
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

/* The Linears outside the blocks, likewise. */
static const struct {
    const char *wan, *diffusers;
} top_modules[] = {
    { "text_embedding.0", "condition_embedder.text_embedder.linear_1" },
    { "text_embedding.2", "condition_embedder.text_embedder.linear_2" },
    { "time_embedding.0", "condition_embedder.time_embedder.linear_1" },
    { "time_embedding.2", "condition_embedder.time_embedder.linear_2" },
    { "time_projection.1", "condition_embedder.time_proj" },
    { "head.head", "proj_out" },
};
#define N_TOP_MODULES (sizeof top_modules / sizeof top_modules[0])

static const char *const prefixes[] = { "base_model.model.", "transformer.", "diffusion_model." };
#define KOHYA_PREFIX "lora_unet_" /* kohya / musubi-tuner: lora_unet_blocks_0_self_attn_q.lora_down.weight */

/* A key of the adapter file, taken apart. */
typedef enum { KEY_A, KEY_B, KEY_ALPHA, KEY_DIFF, KEY_LORA_BIAS, KEY_MAG } key_kind_t;
typedef struct {
    char weight[80];   /* the weight it changes: blocks.N.<wan module>.weight, or .bias */
    char module[80];   /* a lora_B.bias: its Linear's weight, whose s it takes */
    char peft[160];    /* the module's name as PEFT saw it (rank_pattern / alpha_pattern match it) */
    key_kind_t kind;   /* lora_A / lora_down, lora_B / lora_up, the module's alpha, a .diff / .diff_b, a lora_B.bias,
                        * a DoRA magnitude (lora_magnitude_vector) */
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

/* Whether the n bytes at s can name a weight of the model in Wan's names
 * (letters, digits, '_' and '.', no empty part). */
static bool plain_name(const char *s, size_t n) {
    if (n == 0 || s[0] == '.' || s[n - 1] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                  (c == '.' && s[i + 1] != '.');
        if (!ok) return false;
    }
    return true;
}

/* The length of "blocks.N." (kohya's "blocks_N_") at s, N in *blk: N
 * in decimal digits as PyTorch names a block (no sign, space or leading
 * zero; at most 9 digits). 0 when s does not start so. */
static int block_prefix(const char *s, bool kohya, unsigned long *blk) {
    const char *p = kohya ? "blocks_" : "blocks.";
    size_t n = strlen(p), i = n;
    if (strncmp(s, p, n)) return 0;
    unsigned long v = 0;
    while (s[i] >= '0' && s[i] <= '9' && i < n + 9) v = v * 10 + (unsigned long)(s[i++] - '0');
    if (i == n || s[i] != p[n - 1] || (s[n] == '0' && i > n + 1)) return 0;
    *blk = v;
    return (int)i + 1;
}

/* The Linear the n bytes at mod name (its Wan name into out, and its
 * layout), or NULL: a block's module (block blk) when in_block, else one
 * outside the blocks. */
static const char *linear_named(const char *mod, size_t n, bool in_block, unsigned long blk, bool kohya, char *out,
                                size_t len) {
    for (size_t i = 0; in_block && i < N_MODULES; i++) {
        bool wan = module_is(mod, n, modules[i].wan, kohya), dif = module_is(mod, n, modules[i].diffusers, kohya);
        if (!wan && !dif) continue;
        snprintf(out, len, "blocks.%lu.%s", blk, modules[i].wan);
        return kohya ? "kohya" : wan ? "wan" : "diffusers";
    }
    for (size_t i = 0; !in_block && i < N_TOP_MODULES; i++) {
        bool wan = module_is(mod, n, top_modules[i].wan, kohya), dif = module_is(mod, n, top_modules[i].diffusers, kohya);
        if (!wan && !dif) continue;
        snprintf(out, len, "%s", top_modules[i].wan);
        return kohya ? "kohya" : wan ? "wan" : "diffusers";
    }
    return NULL;
}

/* Parses key into *k. -1 naming what the key is when it is none of a
 * LoRA's: an A, B or alpha of a Linear, a full difference of a weight. */
static int parse_key(const char *key, key_t_ *k) {
    memset(k, 0, sizeof *k);
    /* kohya's / LyCORIS' DoRA: its dora_scale is [out, 1] or [1, in] as
     * the trainer decomposed the weight (LyCORIS' wd_on_out), merged by
     * ComfyUI with its own strength rule: not PEFT's magnitude */
    if (ends_with(key, ".dora_scale"))
        return reel_fail(REEL_E_UNSUPPORTED, "kohya's / LyCORIS' DoRA (key %s) is not supported: its dora_scale's axis "
                         "and merge are the trainer's; PEFT's DoRA (use_dora, lora_magnitude_vector keys) is", key);
    const char *s = key;
    bool kohya = !strncmp(s, KOHYA_PREFIX, strlen(KOHYA_PREFIX));
    if (kohya) s += strlen(KOHYA_PREFIX);
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0] && !kohya; i++)
        if (!strncmp(s, prefixes[i], strlen(prefixes[i]))) {
            s += strlen(prefixes[i]);
            break;
        }
    /* where the module's name ends: at its matrix suffix, its ".alpha", its
     * difference's or its DoRA magnitude's */
    const char *end = NULL, *diff_of = NULL; /* a difference: the weight's last part */
    const char *mag = strstr(s, ".lora_magnitude_vector");
    if (mag) {
        /* PEFT saves <module>.lora_magnitude_vector (its state dict's
         * lora_magnitude_vector.<adapter>.weight, ".weight" and the adapter
         * name removed); the in-memory names are read too */
        const char *tail = mag + strlen(".lora_magnitude_vector");
        if (strcmp(tail, "") && strcmp(tail, ".weight") && strcmp(tail, ".default") && strcmp(tail, ".default.weight"))
            return reel_fail(REEL_E_UNSUPPORTED, "unknown target: %s (not a lora_magnitude_vector)", key);
        if (kohya)
            return reel_fail(REEL_E_UNSUPPORTED, "%s: a DoRA magnitude in kohya's names is not supported (PEFT's "
                             "base_model.model.<module>.lora_magnitude_vector is)", key);
        end = mag;
        k->kind = KEY_MAG;
    } else if (ends_with(s, ".alpha")) {
        end = s + strlen(s) - strlen(".alpha");
        k->kind = KEY_ALPHA;
    } else if (ends_with(s, ".diff") || ends_with(s, ".diff_b") || ends_with(s, ".diff_m")) {
        /* X.diff: X.weight (X itself for a modulation, as ComfyUI maps a
         * parameter without ".weight"); X.diff_b: X.bias; X.diff_m (lightx2v's):
         * X.modulation */
        const char *suf = strrchr(s, '.');
        end = suf;
        k->kind = KEY_DIFF;
        diff_of = !strcmp(suf, ".diff_b") ? ".bias" : !strcmp(suf, ".diff_m") ? ".modulation" : ".weight";
        if (!strcmp(diff_of, ".weight") && (size_t)(end - s) >= strlen("modulation") &&
            !strncmp(end - strlen("modulation"), "modulation", strlen("modulation")) &&
            (end - s == (long)strlen("modulation") || end[-(long)strlen("modulation") - 1] == '.'))
            diff_of = "";
        if (kohya)
            return reel_fail(REEL_E_UNSUPPORTED, "%s: a difference in kohya's names (whose '_' for '.' names no "
                             "weight unambiguously); name it diffusion_model.<weight>%s", key, suf);
    }
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0] && !end; i++) {
        const char *at = strstr(s, suffixes[i].s);
        if (!at) continue;
        const char *tail = at + strlen(suffixes[i].s);
        bool bias = !strcmp(tail, ".bias") || !strcmp(tail, ".default.bias");
        if (bias && suffixes[i].kind == KEY_B) {
            k->kind = KEY_LORA_BIAS; /* PEFT's lora_bias */
        } else if (strcmp(tail, ".weight") && strcmp(tail, ".default.weight")) {
            return reel_fail(REEL_E_UNSUPPORTED, "unknown target: %s (not a %s weight)", key, suffixes[i].s + 1);
        } else {
            k->kind = suffixes[i].kind;
        }
        end = at;
    }
    if (!end && ends_with(key, ".bias"))
        return reel_fail(REEL_E_UNSUPPORTED, "bias training is not supported (key %s: a bias's own values; a "
                         "difference to add is <weight>.diff_b, PEFT's lora_bias a lora_B.bias)", key);
    unsigned long blk = 0;
    int at = end ? block_prefix(s, kohya, &blk) : 0;
    bool in_block = at > 0 && end >= s + at;
    const char *mod = in_block ? s + at : s;
    size_t mlen = end ? (size_t)(end - mod) : 0;
    char name[sizeof k->weight - 12]; /* room for ".modulation" after it */
    const char *layout = end ? linear_named(mod, mlen, in_block, blk, kohya, name, sizeof name) : NULL;
    if (!layout && diff_of && plain_name(s, (size_t)(end - s)) && (size_t)(end - s) < sizeof name) {
        snprintf(name, sizeof name, "%.*s", (int)(end - s), s); /* any weight, by Wan's name */
        layout = "wan";
    }
    if (!layout) {
        if (end && in_block)
            return reel_fail(REEL_E_UNSUPPORTED, "unknown target: %s (module '%.*s' is not one of the blocks' "
                             "Linears)", key, (int)mlen, mod);
        return reel_fail(REEL_E_UNSUPPORTED, "unknown target: %s (a LoRA may target the Linears: the blocks' self- and "
                         "cross-attention q, k, v, o and FFN's two, the text and time embeddings', the time "
                         "projection and the head, as lora_A/lora_B or lora_down/lora_up weights and an optional "
                         "alpha; or add a difference to any weight, as <weight>.diff or .diff_b)", key);
    }
    k->layout = layout;
    /* PEFT's module name: the key's, past its prefix (diffusers' own names
     * for a diffusers adapter); Wan's for kohya's '_' names */
    if (kohya) snprintf(k->peft, sizeof k->peft, "%s", name);
    else snprintf(k->peft, sizeof k->peft, "%.*s", (int)(end - s), s);
    snprintf(k->weight, sizeof k->weight, "%s%s", name,
             diff_of ? diff_of : k->kind == KEY_LORA_BIAS ? ".bias" : ".weight");
    if (k->kind == KEY_LORA_BIAS) snprintf(k->module, sizeof k->module, "%s.weight", name);
    return 0;
}

/* ---- the config ---------------------------------------------------------------------- */

/* A JSON value that counts as "not set": absent, null, false, an empty
 * list or object, "none". */
static bool unset(const json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) || (json_is_array(v) && json_array_size(v) == 0) ||
           (json_is_object(v) && json_object_size(v) == 0) || (json_is_string(v) && !strcmp(json_string_value(v), "none"));
}

/* Whether p starts a quantifier as Python's re reads one: '*', '+', '?',
 * or '{', digits, at most one ',' and digits, '}' ({m}, {m,}, {,n},
 * {m,n}, {,}). "{}" and any other '{' are a literal '{' to Python, as is a
 * '}' alone. *lo and *hi (-1: no bound) are its counts, LONG_MAX past
 * that; *end its last character. */
static bool quantifier_at(const char *p, long *lo, long *hi, const char **end) {
    *end = p;
    if (*p == '*' || *p == '+' || *p == '?') {
        *lo = *p == '+';
        *hi = *p == '?' ? 1 : -1;
        return true;
    }
    if (*p != '{' || p[1] == '}') return false;
    long v[2] = { 0, -1 }; /* {,n}: at least 0; {m,}: no bound */
    int part = 0;
    const char *q = p + 1;
    for (;; q++) {
        if (*q >= '0' && *q <= '9') {
            long d = *q - '0', x = v[part] < 0 ? 0 : v[part];
            v[part] = x > (LONG_MAX - d) / 10 ? LONG_MAX : x * 10 + d;
        } else if (*q == ',' && part == 0) {
            part = 1;
        } else {
            break;
        }
    }
    if (*q != '}') return false;
    *lo = v[0];
    *hi = part ? v[1] : v[0];
    *end = q;
    return true;
}

/* PEFT's key (a Python re pattern) as POSIX ERE into out: the common
 * subset (literals, '.', classes, groups, '|', the quantifiers * + ? and
 * {m,n} as Python reads them ({,n} and {m,} too; a '{' that starts no
 * quantifier is a literal '{', "a{x}" the four characters), lazy ones
 * taken greedy as a whole-name match cannot tell them apart, escaped
 * punctuation, \d \w \s and their negations); -1 naming the key for what
 * Python refuses (a quantifier with nothing to repeat or after another,
 * {m,n} with m > n, a ')' closing no '(' of the key) and for what has no
 * ERE equal (lookarounds and other (? groups, backreferences, \b and
 * other escapes, possessive quantifiers, '[' or an escape other than \d
 * \w \s and punctuation inside a class, a counted repetition of a group
 * that repeats by count, counts adding up past 255). */
static int pattern_to_ere(const char *key, char *out, size_t len, const char *path, const char *which) {
    size_t o = 0;
    /* what was read last, as Python's parser tells quantifiers apart: one
     * needs something to repeat (not the key's start, '(', '|' or an
     * anchor) and may not follow another but as its lazy '?' or
     * possessive '+' */
    enum { NOTHING, ANCHOR, ITEM, REPEAT, REPEAT_LAZY } last = NOTHING;
    /* counted repetitions: glibc's regcomp copies a repeated group once per
     * count, so a count over a group that counts again multiplies them
     * ("((.{0,255}){255}){255}" held regcomp for minutes and gigabytes).
     * Refused: such nesting, a count over LORA_PATTERN_COUNTS, and counts
     * adding up past it. counted[d]: group depth d holds one. */
    enum { LORA_PATTERN_COUNTS = 255, MAX_DEPTH = 32 };
    bool counted[MAX_DEPTH + 1] = { false }, group_counted = false;
    int depth = 0;
    long counts = 0;
#define PUT(str)                                                                                                       \
    do {                                                                                                               \
        size_t n_ = strlen(str);                                                                                       \
        if (o + n_ >= len) return reel_fail(REEL_E_LIMIT, "%s: %s key '%s' is too long", path, which, key);            \
        memcpy(out + o, str, n_);                                                                                      \
        o += n_;                                                                                                       \
    } while (0)
    for (const char *p = key; *p; p++) {
        char c = *p, one[3] = { c, 0, 0 };
        long lo, hi;
        const char *qend;
        if (quantifier_at(p, &lo, &hi, &qend)) {
            if (last == REPEAT && (c == '?' || c == '+')) {
                if (c == '+')
                    return reel_fail(REEL_E_UNSUPPORTED, "%s: %s key '%s': a possessive quantifier (%c+) has no POSIX "
                                     "regex equal", path, which, key, p[-1]);
                last = REPEAT_LAZY; /* lazy: the same whole-name matches */
                continue;
            }
            if (last == NOTHING || last == ANCHOR)
                return reel_fail(REEL_E_INVALID, "%s: %s key '%s': '%.*s' has nothing to repeat (Python's re refuses "
                                 "it too)", path, which, key, (int)(qend - p + 1), p);
            if (last != ITEM)
                return reel_fail(REEL_E_INVALID, "%s: %s key '%s': '%.*s' repeats a repetition (Python's re refuses "
                                 "it too)", path, which, key, (int)(qend - p + 1), p);
            last = REPEAT;
            if (c != '{') {
                group_counted = false;
                PUT(one);
                continue;
            }
            if (hi >= 0 && hi < lo)
                return reel_fail(REEL_E_INVALID, "%s: %s key '%s': '%.*s' repeats at least more than at most",
                                 path, which, key, (int)(qend - p + 1), p);
            if (group_counted)
                return reel_fail(REEL_E_UNSUPPORTED, "%s: %s key '%s': a counted repetition of a group that "
                                 "repeats by count itself is not supported", path, which, key);
            long most = hi < 0 ? lo : hi;
            if (most > LORA_PATTERN_COUNTS - counts)
                return reel_fail(REEL_E_UNSUPPORTED, "%s: %s key '%s': repetition counts adding up past %d are "
                                 "not supported", path, which, key, LORA_PATTERN_COUNTS);
            counts += most;
            counted[depth] = true;
            char q[48];
            if (hi < 0) snprintf(q, sizeof q, "{%ld,}", lo);
            else snprintf(q, sizeof q, "{%ld,%ld}", lo, hi);
            PUT(q);
            p = qend;
            continue;
        }
        group_counted = false;
        last = ITEM;
        if (c == '(' && p[1] == '?')
            return reel_fail(REEL_E_UNSUPPORTED, "%s: %s key '%s': '(?' groups (lookarounds, flags, named or "
                             "non-capturing groups) are not supported", path, which, key);
        if (c == '\\') {
            char e = *++p;
            if (!e) return reel_fail(REEL_E_INVALID, "%s: %s key '%s' ends in a lone backslash", path, which, key);
            const char *cls = e == 'd' ? "[0-9]" : e == 'D' ? "[^0-9]" : e == 'w' ? "[A-Za-z0-9_]" :
                              e == 'W' ? "[^A-Za-z0-9_]" : e == 's' ? "[[:space:]]" : e == 'S' ? "[^[:space:]]" : NULL;
            if (cls) {
                PUT(cls);
            } else if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
                return reel_fail(REEL_E_UNSUPPORTED, "%s: %s key '%s': the escape \\%c is not supported (\\d \\w \\s, "
                                 "their negations and escaped punctuation are)", path, which, key, e);
            } else {
                char lit[3] = { '\\', e, 0 };
                PUT(strchr(".[]()*+?{}|^$\\", e) ? lit : lit + 1);
            }
            continue;
        }
        if (c == '[') {
            PUT("[");
            const char *q = p + 1;
            if (*q == '^') {
                PUT("^");
                q++;
            }
            if (*q == ']') {
                PUT("]");
                q++;
            }
            for (; *q && *q != ']'; q++) {
                if (*q == '[')
                    return reel_fail(REEL_E_UNSUPPORTED, "%s: %s key '%s': '[' inside a class is not supported", path,
                                     which, key);
                if (*q == '\\') {
                    char e = *++q;
                    const char *in = e == 'd' ? "0-9" : e == 'w' ? "A-Za-z0-9_" : e == 's' ? "[:space:]" : NULL;
                    char lit[2] = { e, 0 };
                    if (!in && e && e != ']' && e != '^' && e != '-' && e != '\\' &&
                        !((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')))
                        in = lit; /* escaped punctuation: itself */
                    if (!in)
                        return reel_fail(REEL_E_UNSUPPORTED, "%s: %s key '%s': the escape \\%c inside a class is not "
                                         "supported", path, which, key, e ? e : ' ');
                    PUT(in);
                    continue;
                }
                char lit[2] = { *q, 0 };
                PUT(lit);
            }
            if (*q != ']') return reel_fail(REEL_E_INVALID, "%s: %s key '%s': an unclosed '['", path, which, key);
            PUT("]");
            p = q;
            continue;
        }
        if (c == '(') {
            if (depth == MAX_DEPTH)
                return reel_fail(REEL_E_UNSUPPORTED, "%s: %s key '%s': groups nested deeper than %d", path, which, key,
                                 MAX_DEPTH);
            counted[++depth] = false;
            last = NOTHING;
        } else if (c == ')') {
            /* PEFT's f-string would close its own group with it ("a)|(b"
             * matches "a.x" there); Python refuses it alone ("a)") */
            if (depth == 0)
                return reel_fail(REEL_E_INVALID, "%s: %s key '%s': a ')' closes no '(' of the key", path, which, key);
            group_counted = counted[depth--];
            counted[depth] |= group_counted;
        } else if (c == '|') {
            last = NOTHING;
        } else if (c == '^' || c == '$') {
            last = ANCHOR;
        } else if (c == '{' || c == '}') {
            one[0] = '\\', one[1] = c; /* a literal (no quantifier: quantifier_at) */
        }
        PUT(one);
    }
#undef PUT
    out[o] = '\0';
    return 0;
}

/* key's characters into p->lit when it is a literal one: plain ASCII
 * characters (Python's '.' takes one UTF-8 character, not one byte), '.'
 * (any character but a newline, as Python's '.') and escaped punctuation,
 * nothing else Python's re reads as special. Then
 * ^(.*\.)?(KEY)$ matches exactly the names whose last lit_len characters
 * match KEY position by position, the whole name or after a '.': KEY
 * matches lit_len characters, no fewer or more, so it can only take the
 * name's tail, and what is left before it is "" or what .*\. matches (a
 * string ending in '.'). 0 (p->lit NULL when the key is no literal), or
 * -1 out of memory. */
static int pattern_literal(lora_pattern_t *p, const char *key) {
    p->lit = NULL;
    size_t n = 0;
    for (const char *c = key; *c; c++, n++) {
        if (strchr("^$*+?{}[]|()", *c) || (unsigned char)*c >= 0x80) return 0;
        if (*c == '\\' && (!c[1] || (c[1] >= 'a' && c[1] <= 'z') || (c[1] >= 'A' && c[1] <= 'Z') ||
                           (c[1] >= '0' && c[1] <= '9')))
            return 0; /* \d, \b, a backreference: pattern_to_ere's */
        if (*c == '\\') c++;
    }
    if (!(p->lit = malloc(n ? n : 1))) return reel_fail(REEL_E_NOMEM, "out of memory");
    p->lit_len = n;
    n = 0;
    for (const char *c = key; *c; c++) p->lit[n++] = *c == '.' ? 0 : *c == '\\' ? *++c : *c;
    return 0;
}

/* key compiled into *p (which names its table in messages): 0, or -1
 * naming the key, *p then holding nothing to free. */
static int pattern_compile(lora_pattern_t *p, const char *key, const char *path, const char *which) {
    if (pattern_literal(p, key) != 0) return -1;
    if (!p->lit) {
        char ere[1024];
        if (pattern_to_ere(key, ere, sizeof ere - 16, path, which) != 0) return -1;
        char full[1100];
        snprintf(full, sizeof full, "^(.*\\.)?(%s)$", ere);
        int e = regcomp(&p->re, full, REG_EXTENDED | REG_NOSUB);
        if (e != 0) {
            char why[128];
            regerror(e, &p->re, why, sizeof why);
            return reel_fail(REEL_E_INVALID, "%s: %s key '%s' is not a regex Reel can read (%s)", path, which, key,
                             why);
        }
    }
    if (!(p->key = strdup(key))) {
        if (p->lit) free(p->lit);
        else regfree(&p->re);
        return reel_fail(REEL_E_NOMEM, "out of memory");
    }
    return 0;
}

static void pattern_free(lora_pattern_t *p) {
    if (p->lit) free(p->lit);
    else regfree(&p->re);
    free(p->key);
}

/* Whether p matches PEFT's module name (a literal key by its characters,
 * pattern_literal; else its regex, counted in *runs). */
static bool pattern_matches(const lora_pattern_t *p, const char *module, long *runs) {
    if (!p->lit) {
        ++*runs;
        return regexec(&p->re, module, 0, NULL, 0) == 0;
    }
    size_t n = strlen(module), k = p->lit_len;
    if (n < k || (n > k && module[n - k - 1] != '.')) return false;
    const char *tail = module + n - k;
    for (size_t i = k; i-- > 0;)
        if (p->lit[i] ? tail[i] != p->lit[i] : tail[i] == '\n') return false;
    return true;
}

int lora_pattern_match(const char *key, const char *module) {
    lora_pattern_t p;
    long runs = 0;
    if (pattern_compile(&p, key, "adapter_config.json", "rank_pattern") != 0) return -1;
    bool m = pattern_matches(&p, module, &runs);
    pattern_free(&p);
    return m;
}

long lora_regex_runs(const lora_t *l) { return l->regex_runs; }

/* rank_pattern (ranks: 1..LORA_MAX_RANK) or alpha_pattern (numbers), each
 * key compiled, into l->pat[which]. */
static int read_patterns(lora_t *l, const json_t *obj, int which, const char *path) {
    const char *name = which ? "alpha_pattern" : "rank_pattern";
    if (unset(obj)) return 0;
    if (!json_is_object(obj)) return reel_fail(REEL_E_INVALID, "%s: %s must be an object", path, name);
    l->pat[which] = calloc(json_object_size(obj), sizeof *l->pat[which]);
    if (!l->pat[which]) return reel_fail(REEL_E_NOMEM, "out of memory");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)obj, key, v) { /* jansson keeps the file's order: PEFT's first match wins */
        if (which == 0 && (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > LORA_MAX_RANK))
            return reel_fail(json_is_integer(v) && json_integer_value(v) > LORA_MAX_RANK ? REEL_E_LIMIT : REEL_E_INVALID,
                             "%s: rank_pattern '%s' must be a rank 1..%d", path, key, LORA_MAX_RANK);
        if (which == 1 && !json_is_number(v))
            return reel_fail(REEL_E_INVALID, "%s: alpha_pattern '%s' must be a number", path, key);
        lora_pattern_t *p = &l->pat[which][l->npat[which]];
        if (pattern_compile(p, key, path, name) != 0) return -1;
        l->npat[which]++;
        p->v = json_number_value(v);
    }
    return 0;
}

/* The first key of l->pat[which] that matches PEFT's module name, or NULL. */
static const lora_pattern_t *pattern_for(lora_t *l, int which, const char *module) {
    for (int i = 0; i < l->npat[which]; i++)
        if (pattern_matches(&l->pat[which][i], module, &l->regex_runs)) return &l->pat[which][i];
    return NULL;
}

static int read_config(lora_t *l, const char *text, size_t len, const char *path) {
    json_error_t e;
    json_t *j = json_loadb(text, len, 0, &e);
    if (!j) return reel_fail(REEL_E_INVALID, "%s: %s (line %d)", path, e.text, e.line);
    int rc = -1;
    const json_t *pt = json_object_get(j, "peft_type"), *r = json_object_get(j, "r"),
                 *a = json_object_get(j, "lora_alpha"), *rs = json_object_get(j, "use_rslora"),
                 *lb = json_object_get(j, "lora_bias");
    l->lora_bias = !lb || json_is_null(lb) ? -1 : json_is_true(lb) ? 1 : 0;
    const json_t *ud = json_object_get(j, "use_dora");
    l->use_dora = !ud || json_is_null(ud) ? -1 : json_is_true(ud) ? 1 : 0;
    if (!json_is_object(j)) {
        reel_fail(REEL_E_INVALID, "%s: not a JSON object", path);
    } else if (pt && !(json_is_string(pt) && !strcmp(json_string_value(pt), "LORA"))) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: peft_type %s is not supported (LORA is)", path,
                  json_is_string(pt) ? json_string_value(pt) : "(not a string)");
    } else if (ud && !json_is_null(ud) && !json_is_boolean(ud)) {
        reel_fail(REEL_E_INVALID, "%s: use_dora must be true or false", path);
    } else if (l->use_dora == 1 && l->lora_bias == 1) { /* PEFT's LoraConfig refuses the two together */
        reel_fail(REEL_E_UNSUPPORTED, "%s: use_dora with lora_bias (PEFT trains no lora_bias under DoRA)", path);
    } else if (!unset(json_object_get(j, "bias"))) { /* lora_bias (a lora_B.bias key) is read */
        reel_fail(REEL_E_UNSUPPORTED, "%s: bias training (bias other than \"none\") is not supported", path);
    } else if (lb && !json_is_null(lb) && !json_is_boolean(lb)) {
        reel_fail(REEL_E_INVALID, "%s: lora_bias must be true or false", path);
    } else if (!unset(json_object_get(j, "modules_to_save"))) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: modules_to_save is not supported (an adapter changes Linears only)", path);
    } else if (!unset(json_object_get(j, "fan_in_fan_out"))) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: fan_in_fan_out is not supported (Wan's Linears store [out, in])", path);
    } else if (!r && !a && !rs && unset(json_object_get(j, "rank_pattern")) &&
               unset(json_object_get(j, "alpha_pattern"))) {
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
        else if (read_patterns(l, json_object_get(j, "rank_pattern"), 0, path) == 0 &&
                 read_patterns(l, json_object_get(j, "alpha_pattern"), 1, path) == 0)
            rc = 0;
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

/* A module's alpha: one finite value other than 0 (a negative one turns
 * the adapter's sign, as a negative config lora_alpha does), with no
 * adapter_config.json r (whose lora_alpha would say otherwise). */
static int add_alpha(lora_t *l, const st_file_t *f, const st_tensor_t *t, const key_t_ *k, size_t cap) {
    if (!l->from_file)
        return reel_fail(REEL_E_INVALID, "%s: a module's alpha beside a config's lora_alpha (one of the two must "
                         "go)", t->name);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    if (n != 1) return reel_fail(REEL_E_INVALID, "%s: an alpha is one value, not %lld", t->name, (long long)n);
    float v;
    if (st_read_f32(f, t->name, t->ndim, t->shape, &v) != 0) return -1;
    if (!isfinite(v) || v == 0)
        return reel_fail(REEL_E_INVALID, "%s: alpha %g (a finite value, not 0: kohya reads 0 as the rank, diffusers as "
                         "no change)", t->name, (double)v);
    lora_target_t *g = target_for(l, k->weight, cap);
    if (!g) return -1;
    if (g->has_alpha) return reel_fail(REEL_E_INVALID, "%s: a second alpha for %s", t->name, k->weight);
    g->alpha = v;
    g->has_alpha = true;
    return 0;
}

/* Tensor t's n values as F32 (malloc'd), all finite; NULL naming what is
 * wrong (its dtype: F32, BF16 or F16 are read; NaN or infinity). */
static float *read_finite(const st_file_t *f, const st_tensor_t *t, size_t n) {
    if (t->dtype != KERN_F32 && t->dtype != KERN_BF16 && t->dtype != KERN_F16) {
        reel_fail(REEL_E_UNSUPPORTED, "%s: dtype %s (F32, BF16 or F16 are read)", t->name, kern_dtype_name(t->dtype));
        return NULL;
    }
    float *v = malloc(n * sizeof *v);
    if (!v) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    if (st_read_f32(f, t->name, t->ndim, t->shape, v) != 0) {
        free(v);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) {
            free(v);
            reel_fail(REEL_E_INVALID, "%s: NaN or infinite values", t->name);
            return NULL;
        }
    return v;
}

/* A full difference (.diff, .diff_b, PEFT's lora_B.bias) into its
 * target: any shape up to LORA_DIFF_MAX_DIMS (lora_check holds it to the
 * weight's), finite values. */
static int add_difference(lora_t *l, const st_file_t *f, const st_tensor_t *t, const key_t_ *k, size_t cap) {
    if (t->ndim < 1 || t->ndim > LORA_DIFF_MAX_DIMS || (k->kind == KEY_LORA_BIAS && t->ndim != 1))
        return reel_fail(REEL_E_INVALID, "%s: %d dimensions (a %s has %s)", t->name, t->ndim,
                         k->kind == KEY_LORA_BIAS ? "lora_B.bias" : "difference",
                         k->kind == KEY_LORA_BIAS ? "1" : "its weight's, 1 to 5");
    /* PEFT builds lora_B with a bias only under "lora_bias": true, and
     * loads none without it; diffusers, given no config, says true when
     * the file has one */
    if (k->kind == KEY_LORA_BIAS && (l->from_file ? l->lora_bias == 0 : l->lora_bias != 1))
        return reel_fail(REEL_E_INVALID, "%s: a lora_B.bias, but the adapter's config does not say \"lora_bias\": true "
                         "(PEFT would not load it): set it in adapter_config.json, or drop the key", t->name);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    if (n < 1) return reel_fail(REEL_E_INVALID, "%s: an empty dimension", t->name);
    lora_target_t *g = target_for(l, k->weight, cap);
    if (!g) return -1;
    if (g->d) return reel_fail(REEL_E_INVALID, "%s: a second difference for %s", t->name, k->weight);
    float *v = read_finite(f, t, (size_t)n);
    if (!v) return -1;
    g->d = v;
    g->d_ndim = t->ndim;
    memcpy(g->d_shape, t->shape, (size_t)t->ndim * sizeof *g->d_shape);
    g->d_numel = n;
    g->d_scale = 1.0f;
    if (k->kind == KEY_LORA_BIAS) snprintf(g->d_scale_of, sizeof g->d_scale_of, "%s", k->module);
    l->bytes += t->nbytes;
    return 0;
}

/* A DoRA magnitude (PEFT's lora_magnitude_vector: [out], one per row of
 * the Linear's [out, in] weight) into its target, finite values; under a
 * config that says use_dora: true (PEFT loads none otherwise), or none
 * that says false when the config is the file's (diffusers' loader takes
 * use_dora from the keys). lora_parse_config holds it to the module's B. */
static int add_magnitude(lora_t *l, const st_file_t *f, const st_tensor_t *t, const key_t_ *k, size_t cap) {
    if (l->from_file ? l->use_dora == 0 : l->use_dora != 1)
        return reel_fail(REEL_E_INVALID, "%s: a DoRA magnitude, but the adapter's config does not say \"use_dora\": "
                         "true (PEFT would not load it): set it in adapter_config.json, or drop the key", t->name);
    if (t->ndim != 1 || t->shape[0] < 1) {
        char s[96] = "[";
        for (int d = 0; d < t->ndim && strlen(s) < 64; d++)
            snprintf(s + strlen(s), sizeof s - strlen(s), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        strcat(s, "]");
        return reel_fail(REEL_E_INVALID, "%s: a lora_magnitude_vector is [out] (one value per output row of %s), not "
                         "%s", t->name, k->weight, s);
    }
    lora_target_t *g = target_for(l, k->weight, cap);
    if (!g) return -1;
    if (g->m) return reel_fail(REEL_E_INVALID, "%s: a second lora_magnitude_vector for %s", t->name, k->weight);
    float *v = read_finite(f, t, (size_t)t->shape[0]);
    if (!v) return -1;
    g->m = v;
    g->m_len = t->shape[0];
    l->bytes += t->nbytes;
    return 0;
}

/* One A or B tensor, a module's alpha, a difference or a DoRA magnitude
 * into its target. */
static int add_tensor(lora_t *l, const st_file_t *f, const st_tensor_t *t, size_t cap) {
    key_t_ k;
    if (parse_key(t->name, &k) != 0) return -1;
    if (l->layout && strcmp(l->layout, k.layout))
        return reel_fail(REEL_E_INVALID, "keys in two layouts' names (%s is %s's, others %s's)", t->name, k.layout,
                         l->layout);
    l->layout = k.layout;
    if (k.kind == KEY_ALPHA) return add_alpha(l, f, t, &k, cap);
    if (k.kind == KEY_DIFF || k.kind == KEY_LORA_BIAS) return add_difference(l, f, t, &k, cap);
    if (k.kind == KEY_MAG) return add_magnitude(l, f, t, &k, cap);
    const bool is_b = k.kind == KEY_B;
    if (strstr(t->name, ".lora_down.") || strstr(t->name, ".lora_up.")) l->down_up = true;
    if (!strncmp(t->name, "diffusion_model.", strlen("diffusion_model.")) ||
        !strncmp(t->name, "transformer.", strlen("transformer.")))
        l->not_peft = true;
    if (t->ndim != 2)
        return reel_fail(REEL_E_INVALID, "%s: %d dimensions, a LoRA matrix has 2", t->name, t->ndim);
    int64_t rank = is_b ? t->shape[1] : t->shape[0], other = is_b ? t->shape[0] : t->shape[1];
    if (l->from_file && (rank < 1 || rank > LORA_MAX_RANK))
        return reel_fail(rank < 1 ? REEL_E_INVALID : REEL_E_LIMIT, "%s: rank %lld (1..%d)", t->name, (long long)rank,
                         LORA_MAX_RANK);
    if (other < 1) return reel_fail(REEL_E_INVALID, "%s: an empty dimension", t->name);
    lora_target_t *g = target_for(l, k.weight, cap);
    if (!g) return -1;
    if (g->a || g->b) {
        /* its other matrix came first: the module's r, alpha and s are
         * known, its name is not matched against the patterns again */
        if (g->rank != rank)
            return reel_fail(REEL_E_INVALID, "%s: rank %lld, its other matrix's is %lld", t->name, (long long)rank,
                             (long long)g->rank);
    } else if (!l->from_file) {
        /* the module's r and alpha: rank_pattern's and alpha_pattern's
         * first key matching its name as PEFT saw it, else the config's */
        const lora_pattern_t *pr = pattern_for(l, 0, k.peft), *pa = pattern_for(l, 1, k.peft);
        const int r_m = pr ? (int)pr->v : l->r;
        const double alpha_m = pa ? pa->v : l->alpha;
        if (rank != r_m && pr)
            return reel_fail(REEL_E_INVALID, "%s: rank %lld is not %d, the r rank_pattern '%s' gives module %s",
                             t->name, (long long)rank, r_m, pr->key, k.peft);
        if (rank != r_m)
            return reel_fail(REEL_E_INVALID, "%s: rank %lld is not the config's r = %d%s%s", t->name, (long long)rank,
                             l->r, l->npat[0] ? " (no rank_pattern key matches module " : "",
                             l->npat[0] ? k.peft : "");
        g->scale = (float)(l->rslora ? alpha_m / sqrt((double)r_m) : alpha_m / r_m);
        if (!isfinite(g->scale))
            return reel_fail(REEL_E_INVALID, "%s: alpha %g gives no finite scale (module %s)", t->name, alpha_m, k.peft);
        g->alpha = alpha_m; /* has_alpha stays false: no module alpha key */
    }
    g->rank = rank;
    if (is_b ? g->b != NULL : g->a != NULL)
        return reel_fail(REEL_E_INVALID, "%s: a second lora_%c for %s", t->name, is_b ? 'B' : 'A', k.weight);
    float *v = read_finite(f, t, (size_t)(rank * other));
    if (!v) return -1;
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
 * alpha (else its rank: s = 1 whatever the ranks, ComfyUI's rule and
 * diffusers' since it mirrors ranks into alphas; older diffusers gave a
 * module of rank r_m r_first / r_m, docs/MODEL.md "LoRA adapters") over its
 * rank; then the adapter's r (the largest rank), alpha and s (the targets'
 * when they all agree, else 0: lora_describe says "per target"). */
static int finish_scales(lora_t *l) {
    if (!l->from_file) {
        /* each target's s from its module's r and alpha (add_tensor); with
         * patterns the adapter's r is the largest rank, its alpha and s the
         * targets' when they all agree, else 0 (per target) */
        bool first = true, patterns = l->npat[0] || l->npat[1];
        if (patterns) l->r = 0;
        for (int i = 0; i < l->n; i++) {
            lora_target_t *t = &l->t[i];
            if (!t->a) {
                t->scale = 0;
                continue;
            }
            if (!patterns) continue;
            if (t->rank > l->r) l->r = (int)t->rank;
            if (first) l->alpha = t->alpha, l->scale = t->scale, first = false;
            else if (l->alpha != t->alpha || l->scale != t->scale) l->alpha = 0, l->scale = 0;
        }
    } else {
        l->r = 0;
        bool first = true;
        for (int i = 0; i < l->n; i++) {
            lora_target_t *t = &l->t[i];
            if (!t->a) continue; /* a difference only */
            double alpha = t->has_alpha ? t->alpha : (double)t->rank;
            t->scale = (float)(alpha / (double)t->rank);
            if (!isfinite(t->scale))
                return reel_fail(REEL_E_INVALID, "%s: alpha %g gives no finite scale", t->weight, alpha);
            if (t->rank > l->r) l->r = (int)t->rank;
            if (first) l->alpha = alpha, l->scale = t->scale, first = false;
            else if (l->alpha != alpha || l->scale != t->scale) l->alpha = 0, l->scale = 0;
        }
    }
    /* a lora_B.bias takes its Linear's s, as PEFT scales lora_B's output */
    for (int i = 0; i < l->n; i++) {
        lora_target_t *t = &l->t[i];
        if (!t->d_scale_of[0]) continue;
        const lora_target_t *m = target_of(l, t->d_scale_of);
        if (!m || !m->a)
            return reel_fail(REEL_E_INVALID, "%s has a lora_B.bias without its Linear's lora_A and lora_B (%s)",
                             t->weight, t->d_scale_of);
        t->d_scale = m->scale;
    }
    return 0;
}

/* DoRA (PEFT's use_dora, or magnitude keys in a file that is its own
 * config): every low-rank target has its magnitude, one value per row of
 * its B; no full difference on a DoRA weight (no trainer writes the two,
 * and which comes first would be a guess) and no lora_B.bias (PEFT refuses
 * lora_bias with use_dora). */
static int finish_dora(lora_t *l) {
    bool any = l->use_dora == 1;
    for (int i = 0; i < l->n; i++) any |= l->t[i].m != NULL;
    if (!any) return 0;
    for (int i = 0; i < l->n; i++) {
        const lora_target_t *t = &l->t[i];
        if (t->a && !t->m)
            return reel_fail(REEL_E_INVALID, "%s has lora_A and lora_B but no lora_magnitude_vector, and the adapter "
                             "is DoRA (%s)", t->weight, l->use_dora == 1 ? "use_dora: true" : "other modules have one");
        if (t->m && t->m_len != t->out)
            return reel_fail(REEL_E_INVALID, "%s: its lora_magnitude_vector has %lld values, its lora_B %lld rows "
                             "(one magnitude per output row)", t->weight, (long long)t->m_len, (long long)t->out);
        if (t->m && t->d)
            return reel_fail(REEL_E_UNSUPPORTED, "%s: a full difference (.diff) on a DoRA module is not supported",
                             t->weight);
        if (t->d_scale_of[0])
            return reel_fail(REEL_E_UNSUPPORTED, "%s: a lora_B.bias in a DoRA adapter (PEFT trains no lora_bias under "
                             "use_dora)", t->weight);
    }
    return 0;
}

/* Whether an adapter read without a config names its own scale: a
 * module's alpha, kohya's lora_down / lora_up names (whose files carry
 * alphas or mean s = 1, as diffusers loads them), or diffusers' file name
 * (its save_lora_weights writes no config: s = 1). */
static bool says_its_scale(const lora_t *l, const st_file_t *f) {
    bool low_rank = false;
    for (int i = 0; i < l->n; i++) {
        if (l->t[i].has_alpha) return true;
        low_rank |= l->t[i].a != NULL;
    }
    if (!low_rank) return true; /* differences only: they take no scale */
    if (l->down_up) return true;
    /* ComfyUI's / ai-toolkit's diffusion_model.<Wan name>.lora_A/B and a
     * diffusers file under another name: diffusers' Wan loader
     * (_convert_non_diffusers_wan_lora_to_diffusers, or its own names with
     * no lora_adapter_metadata) takes a module without .alpha at s = 1
     * (with equal ranks; finish_scales on mixed ones) */
    if (l->not_peft) return true;
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
        if (l->t[i].m && !l->t[i].a && !l->t[i].b) {
            reel_fail(REEL_E_INVALID, "%s: %s has a lora_magnitude_vector (DoRA) without lora_A and lora_B",
                      st_origin(f), l->t[i].weight);
            goto err;
        }
    for (int i = 0; i < l->n; i++)
        if (!l->t[i].a || !l->t[i].b) {
            if (!l->t[i].a && !l->t[i].b && !l->t[i].has_alpha) continue; /* a difference only */
            if (!l->t[i].a && !l->t[i].b)
                reel_fail(REEL_E_INVALID, "%s: %s has an alpha and no matrices", st_origin(f), l->t[i].weight);
            else
                reel_fail(REEL_E_INVALID, "%s: %s has lora_%c without lora_%c", st_origin(f), l->t[i].weight,
                          l->t[i].a ? 'A' : 'B', l->t[i].a ? 'B' : 'A');
            goto err;
        }
    if (finish_scales(l) != 0 || finish_dora(l) != 0) {
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
    int fd = open(weights, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY); /* a FIFO does not wait */
    st_header_t *h = fd >= 0 ? st_header_read(fd, weights, NULL, NULL) : NULL;
    if (fd >= 0) close(fd);
    bool lora = false;
    for (size_t i = 0; h && i < st_header_count(h) && !lora; i++) {
        const char *n = st_header_at(h, i)->name;
        lora = strstr(n, ".lora_A.") || strstr(n, ".lora_B.") || strstr(n, ".lora_down.") || strstr(n, ".lora_up.") ||
               ends_with(n, ".diff") || ends_with(n, ".diff_b");
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
    /* a FIFO does not wait for a writer; nothing but a regular file is read */
    int cfd = open(cfg, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat cst;
    if (cfd >= 0 && (fstat(cfd, &cst) != 0 || !S_ISREG(cst.st_mode))) {
        close(cfd);
        reel_fail(REEL_E_INVALID, "%s: not a regular file", cfg);
        return NULL;
    }
    FILE *cf = cfd >= 0 ? fdopen(cfd, "rb") : NULL;
    if (!cf) {
        if (cfd >= 0) close(cfd);
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
        free((void *)l->t[i].d);
        free((void *)l->t[i].m);
    }
    free(l->t);
    for (int w = 0; w < 2; w++) {
        for (int i = 0; i < l->npat[w]; i++) pattern_free(&l->pat[w][i]);
        free(l->pat[w]);
    }
    free(l);
    *lp = NULL;
}

static bool same_shape(const tdit_weight_t *m, const lora_target_t *t) {
    if (m->ndim != t->d_ndim) return false;
    for (int d = 0; d < m->ndim; d++)
        if (m->shape[d] != t->d_shape[d]) return false;
    return true;
}

/* "[a, b, ...]" of a shape, into buf. */
static const char *shape_text(const int64_t *shape, int ndim, char *buf, size_t len) {
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (at < len) snprintf(buf + at, len - at, "]");
    return buf;
}

int lora_check(const lora_t *l, const tdit_config_t *c) {
    char s1[96], s2[96];
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
        else if (t->d && !same_shape(m, t))
            rc = reel_fail(REEL_E_INVALID, "shape mismatch: the adapter's difference for %s is %s, model %s has %s",
                           t->weight, shape_text(t->d_shape, t->d_ndim, s1, sizeof s1), c->name,
                           shape_text(m->shape, m->ndim, s2, sizeof s2));
        else if (t->a && (m->ndim != 2 || m->shape[0] != t->out || m->shape[1] != t->in))
            rc = reel_fail(REEL_E_INVALID,
                           "shape mismatch: the adapter changes %s as [%lld, %lld] (B [%lld, %lld] x A [%lld, %lld]), "
                           "model %s has [%lld, %lld]",
                           t->weight, (long long)t->out, (long long)t->in, (long long)t->out, (long long)t->rank,
                           (long long)t->rank, (long long)t->in, c->name, (long long)m->shape[0],
                           (long long)(m->ndim > 1 ? m->shape[1] : 0));
    }
    free(w);
    if (rc == 0 && lora_max_delta(l) >= LORA_MAX_DELTA)
        rc = reel_fail(REEL_E_INVALID, "its merge could overflow F32: |s|·r·max|B|·max|A| + max|diff| = %g "
                       "(lora_alpha %g, r %d)", lora_max_delta(l), l->alpha, l->r);
    /* the merge forms B·A in F32 before scaling it (as PEFT does), so a
     * small s does not keep B·A itself in range */
    for (int i = 0; i < l->n && rc == 0; i++) {
        const lora_target_t *t = &l->t[i];
        if (!t->a) continue;
        double ma = 0, mb = 0;
        for (int64_t j = 0; j < t->rank * t->in; j++) ma = fmax(ma, fabs((double)t->a[j]));
        for (int64_t j = 0; j < t->out * t->rank; j++) mb = fmax(mb, fabs((double)t->b[j]));
        if ((double)t->rank * ma * mb >= LORA_MAX_DELTA)
            rc = reel_fail(REEL_E_INVALID, "its merge could overflow F32: B·A of %s, before its scale, can reach "
                           "r·max|B|·max|A| = %g", t->weight, (double)t->rank * ma * mb);
    }
    return rc;
}

double lora_max_delta(const lora_t *l) {
    double worst = 0;
    for (int i = 0; i < l->n; i++) {
        const lora_target_t *t = &l->t[i];
        double ma = 0, mb = 0, md = 0;
        for (int64_t j = 0; t->a && j < t->rank * t->in; j++) ma = fmax(ma, fabs((double)t->a[j]));
        for (int64_t j = 0; t->b && j < t->out * t->rank; j++) mb = fmax(mb, fabs((double)t->b[j]));
        for (int64_t j = 0; t->d && j < t->d_numel; j++) md = fmax(md, fabs((double)t->d[j]));
        worst = fmax(worst, fabs((double)t->scale) * (double)t->rank * ma * mb + fabs((double)t->d_scale) * md);
        /* DoRA: a merged row is m_i times a unit vector, no value above |m_i| */
        for (int64_t j = 0; t->m && j < t->m_len; j++) worst = fmax(worst, fabs((double)t->m[j]));
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

/* DoRA, as PEFT's Linear.merge: w holds V = W + s·B·A (F32, as PEFT adds
 * its F32 delta); each row i becomes (m_i / ||V_i||) · V_i. The row's norm
 * is accumulated in double and rounded to F32 (PEFT's F32
 * torch.linalg.norm(dim=1), within a few ulp of it), the factor m_i /
 * ||V_i|| an F32 division and each value an F32 product, as PEFT's
 * dora_factor.view(-1, 1) * (W + delta). -1 naming the weight and row
 * when a row's norm is 0 or its factor not finite (PEFT would write NaN or
 * infinities). */
static int dora_rows(const lora_target_t *t, const char *name, float *w) {
    for (int64_t i = 0; i < t->out; i++) {
        float *row = w + i * t->in;
        double acc[4] = { 0, 0, 0, 0 };
        int64_t j = 0;
        for (; j + 4 <= t->in; j += 4)
            for (int q = 0; q < 4; q++) acc[q] += (double)row[j + q] * (double)row[j + q];
        for (; j < t->in; j++) acc[0] += (double)row[j] * (double)row[j];
        const float norm = (float)sqrt((acc[0] + acc[1]) + (acc[2] + acc[3]));
        const float factor = t->m[i] / norm;
        if (!(norm > 0) || !isfinite(factor))
            return reel_fail(REEL_E_INVALID, "%s: DoRA row %lld: ||W + s·B·A|| = %g and magnitude %g give no finite "
                             "scale", name, (long long)i, (double)norm, (double)t->m[i]);
        for (j = 0; j < t->in; j++) row[j] = factor * row[j];
    }
    return 0;
}

int lora_merge_into(const lora_t *l, const char *name, float *w, int64_t numel) {
    const lora_target_t *t = lora_find(l, name);
    if (!t) return 0;
    if (t->a && numel != t->out * t->in)
        return reel_fail(REEL_E_INVALID, "%s: %lld values, the adapter needs [%lld, %lld]", name, (long long)numel,
                         (long long)t->out, (long long)t->in);
    if (t->d && numel != t->d_numel)
        return reel_fail(REEL_E_INVALID, "%s: %lld values, the adapter's difference has %lld", name, (long long)numel,
                         (long long)t->d_numel);
    /* W[out, in] += s · B[out, r] · A[r, in], then the difference */
    if (t->a)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)t->out, (blasint)t->in, (blasint)t->rank,
                    t->scale, t->b, (blasint)t->rank, t->a, (blasint)t->in, 1.0f, w, (blasint)t->in);
    if (t->m && dora_rows(t, name, w) != 0) return -1;
    for (int64_t i = 0; t->d && i < numel; i++) w[i] += t->d_scale * t->d[i];
    return 0;
}

int lora_check_merge(const lora_t *l, const st_file_t *base) {
    float *w = NULL;
    size_t cap = 0;
    int rc = 0;
    for (int i = 0; i < l->n && rc == 0; i++) {
        const lora_target_t *t = &l->t[i];
        if (!t->m) continue;
        size_t n = (size_t)(t->out * t->in);
        if (n > cap) {
            free(w);
            if (!(w = malloc(n * sizeof *w))) {
                rc = reel_fail(REEL_E_NOMEM, "out of memory");
                break;
            }
            cap = n;
        }
        int64_t shape[2] = { t->out, t->in };
        rc = st_read_f32(base, t->weight, 2, shape, w) != 0 ? -1 : lora_merge_into(l, t->weight, w, (int64_t)n);
    }
    free(w);
    return rc;
}

int lora_describe(const lora_t *l, char *buf, size_t len) {
    /* the modules, each once, in the targets' order: at most MODS_SHOWN
     * bytes of them, then how many more (the whole description must fit a
     * worker's ack: MSG_REASON_MAX) */
    enum { MODS_SHOWN = 192 };
    char mods[MODS_SHOWN + 24] = "", seen[4096] = ",", dora[32] = "";
    int diffs = 0, more = 0, doras = 0;
    for (int i = 0; i < l->n; i++) {
        diffs += l->t[i].d != NULL;
        doras += l->t[i].m != NULL;
        /* the module: the weight's name without "blocks.N." and its last part */
        const char *m = l->t[i].weight;
        unsigned long blk;
        int at = block_prefix(m, false, &blk);
        m += at;
        const char *dot = strrchr(m, '.');
        char tok[96];
        snprintf(tok, sizeof tok, "%.*s,", dot ? (int)(dot - m) : (int)strlen(m), m);
        char key[100];
        snprintf(key, sizeof key, ",%s", tok);
        if (strstr(seen, key)) continue;
        if (strlen(seen) + strlen(tok) < sizeof seen) strcat(seen, tok);
        size_t have = strlen(mods), one = strlen(tok) - 1;
        if (have + one + 1 <= MODS_SHOWN)
            snprintf(mods + have, sizeof mods - have, "%s%.*s", have ? "," : "", (int)one, tok);
        else
            more++;
    }
    if (more) snprintf(mods + strlen(mods), sizeof mods - strlen(mods), ",+%d more", more);
    if (doras) snprintf(dora, sizeof dora, "\"dora\":%d,", doras); /* only a DoRA adapter says it */
    int n = snprintf(buf, len,
                     "{\"rank\":%d,\"alpha\":%g,\"rslora\":%s,\"scale\":%g,\"targets\":%d,\"diffs\":%d,%s"
                     "\"modules\":\"%s\",\"bytes\":%zu,\"sha256\":\"%s\",\"layout\":\"%s\",\"config\":\"%s\"}",
                     l->r, l->alpha, l->rslora ? "true" : "false", (double)l->scale, l->n, diffs, dora, mods, l->bytes, l->sha,
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
