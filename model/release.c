/* release.c -- a release folder's parts by name (see release.h). */
#include "model/release.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <math.h>
#include <jansson.h>
#include <sys/stat.h>

#include "base/error.h"
#include "media/tokenizer.h"

/* Whether p is there: anything (see try_file). */
static bool is_there(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* dir/name into out when it is there: a file, or anything else under a
 * release's name (a folder, a FIFO, a link to nowhere), which its loader
 * then refuses naming it ("not a regular file") rather than the folder
 * being taken to lack it. */
static bool try_file(const char *dir, const char *name, char *out) {
    char p[PATH_MAX];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p || lstat(p, &st) != 0) return false;
    snprintf(out, PATH_MAX, "%s", p);
    return true;
}

/* Whether dir holds weights of its own (a *.safetensors or an index): then
 * it is a release folder, not a pipeline root (model/wan_ckpt.c's rule). */
static bool has_weights(const char *dir) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    bool any = false;
    for (int i = 0; i < n; i++) {
        const char *s = names[i]->d_name; /* dotfiles skipped, as the DiT's loader skips them */
        any = any || (s[0] != '.' && (ends_with(s, ".safetensors") || ends_with(s, ".safetensors.index.json")));
        free(names[i]);
    }
    free(names);
    return any;
}

/* The text encoder: its release name, its safetensors copy, else the first
 * models_t5_* checkpoint in name order. */
static void find_t5(const char *dir, char *out) {
    if (try_file(dir, RELEASE_T5_NAME, out) || try_file(dir, "models_t5_umt5-xxl-enc-bf16.safetensors", out)) return;
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        const char *s = names[i]->d_name;
        if (!out[0] && !strncmp(s, "models_t5_", 10) && (ends_with(s, ".pth") || ends_with(s, ".safetensors")))
            try_file(dir, s, out);
        free(names[i]);
    }
    free(names);
}

const char *release_dir(const char *dir, char *buf) {
    size_t n = strlen(dir);
    if (n < 2 || dir[n - 1] != '/' || n >= PATH_MAX) return dir;
    memcpy(buf, dir, n + 1);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    return buf;
}

int release_find(const char *dir_arg, release_parts_t *out) {
    memset(out, 0, sizeof *out);
    char dbuf[PATH_MAX];
    const char *dir = release_dir(dir_arg, dbuf);
    struct stat st;
    if (stat(dir, &st) != 0) return reel_fail_errno(REEL_E_IO, errno, "%s", dir);
    if (!S_ISDIR(st.st_mode)) return reel_fail(REEL_E_INVALID, "%s is not a release folder", dir);
    find_t5(dir, out->t5);
    if (!try_file(dir, RELEASE_VAE_NAME, out->vae)) try_file(dir, "Wan2.1_VAE.safetensors", out->vae);
    char tok[PATH_MAX];
    if (snprintf(tok, sizeof tok, "%s/%s/spiece.model", dir, RELEASE_TOKENIZER_DIR) < (int)sizeof tok && is_there(tok))
        snprintf(out->tokenizer, PATH_MAX, "%s/%s", dir, RELEASE_TOKENIZER_DIR);
    /* a diffusers pipeline root, as model/wan_ckpt.c takes one:
     * model_index.json, or transformer/ with no weights of its own beside
     * it; its text_encoder/, tokenizer/ and vae/, each read by its loader
     * (model/hf_parts.h) */
    char mi[PATH_MAX], tr[PATH_MAX];
    bool root = (snprintf(mi, sizeof mi, "%s/model_index.json", dir) < (int)sizeof mi && is_there(mi)) ||
                (snprintf(tr, sizeof tr, "%s/transformer", dir) < (int)sizeof tr && is_there(tr) &&
                 !has_weights(dir));
    out->pipeline = root;
    if (root) {
        if (!out->t5[0]) try_file(dir, RELEASE_DIFFUSERS_T5, out->t5);
        if (!out->vae[0]) try_file(dir, RELEASE_DIFFUSERS_VAE, out->vae);
        if (!out->tokenizer[0] &&
            snprintf(tok, sizeof tok, "%s/%s/spiece.model", dir, RELEASE_DIFFUSERS_TOKENIZER) < (int)sizeof tok &&
            is_there(tok))
            snprintf(out->tokenizer, PATH_MAX, "%s/%s", dir, RELEASE_DIFFUSERS_TOKENIZER);
    }
    return 0;
}

void release_text_missing(const char *dir_arg, const release_parts_t *p, char *out, size_t len) {
    char dbuf[PATH_MAX];
    const char *dir = release_dir(dir_arg, dbuf);
    size_t n = 0;
    out[0] = '\0';
    if (!p->t5[0])
        /* what find_t5 looks for: the release name, then any models_t5_* .pth or .safetensors */
        n += (size_t)snprintf(out + n, len - n, "no text encoder: %s/ has no %s (nor another models_t5_*.pth or "
                              "models_t5_*.safetensors)%s%s%s", dir, RELEASE_T5_NAME, p->pipeline ? " and no " : "",
                              p->pipeline ? RELEASE_DIFFUSERS_T5 : "", p->pipeline ? "/" : "");
    if (p->tokenizer[0] || n >= len) return;
    const char *sub = p->pipeline ? RELEASE_DIFFUSERS_TOKENIZER : RELEASE_TOKENIZER_DIR;
    char json[PATH_MAX];
    bool has_json = p->pipeline &&
                    snprintf(json, sizeof json, "%s/%s/tokenizer.json", dir, RELEASE_DIFFUSERS_TOKENIZER) <
                        (int)sizeof json && is_there(json);
    n += (size_t)snprintf(out + n, len - n, "%sno tokenizer: %s/%s/ has no spiece.model", n ? "; " : "", dir, sub);
    if (p->pipeline && n < len)
        n += (size_t)snprintf(out + n, len - n, " (nor %s/%s/spiece.model)", dir, RELEASE_TOKENIZER_DIR);
    if (has_json && n < len) snprintf(out + n, len - n, "; it holds tokenizer.json: " TOK_JSON_HINT);
}

/* A scheduler's shift key: absent or null is diffusers' default, 1.0. 0,
 * or -1 with an error naming the file when it is not a number > 0. */
static int sched_shift(const release_sched_t *s, const json_t *root, const char *key, double *out) {
    const json_t *v = json_object_get(root, key);
    *out = 1.0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return reel_fail(REEL_E_INVALID, "%s: \"%s\" must be a number > 0", s->path, key);
    *out = json_number_value(v);
    return 0;
}

static bool sched_true(const json_t *root, const char *key) { return json_is_true(json_object_get(root, key)); }

/* One key of a scheduler's config that changes how diffusers steps, and
 * the values with which it steps as Reel's sampler does. */
typedef struct {
    const char *key;
    const char *takes;  /* "|"-separated; the first is what Reel runs, the others diffusers' spellings of it */
    const char *absent; /* diffusers' default (the __init__ argument) when the file leaves the key out */
    bool truth;         /* read as Python's truth: null, false, 0, "" and [] are false */
    const char *runs;   /* what Reel runs, as a message says it; NULL: takes' first */
} sched_key_t;

/* diffusers' UniPCMultistepScheduler with use_flow_sigmas as Wan2.1's
 * FlowUniPCMultistepScheduler runs (Reel's unipc); use_dynamic_shifting
 * needs a mu WanPipeline never passes */
static const sched_key_t unipc_keys[] = {
    { "prediction_type", "flow_prediction", "epsilon", false, NULL },
    { "solver_order", "2", "2", false, NULL },
    { "solver_type", "bh2|midpoint|heun|logrho", "bh2", false, NULL }, /* diffusers reads the last three as bh2 */
    { "predict_x0", "true", "true", true, NULL },
    { "lower_order_final", "true", "true", true, NULL },
    { "final_sigmas_type", "zero", "zero", false, NULL },
    { "use_karras_sigmas", "false", "false", true, NULL }, /* each of these three replaces the flow sigmas */
    { "use_exponential_sigmas", "false", "false", true, NULL },
    { "use_beta_sigmas", "false", "false", true, NULL },
    { "shift_terminal", "false", "false", true, "none" },
    { "thresholding", "false", "false", true, NULL },
    { "disable_corrector", "false", "false", true, "[]" },
    { "solver_p", "false", "false", true, "none" },
    { "num_train_timesteps", "1000", "1000", false, NULL },
};

/* DPMSolverMultistepScheduler (dpmsolver++, use_flow_sigmas) as Wan2.1's
 * FlowDPMSolverMultistepScheduler steps (Reel's dpm++); final σ 0 makes
 * the last step first order whatever lower_order_final and euler_at_final say */
static const sched_key_t dpm_keys[] = {
    { "prediction_type", "flow_prediction", "epsilon", false, NULL },
    { "solver_order", "2", "2", false, NULL },
    /* diffusers reads bh1, bh2 and logrho as midpoint */
    { "solver_type", "midpoint|bh1|bh2|logrho", "midpoint", false, NULL },
    { "final_sigmas_type", "zero", "zero", false, NULL },
    { "use_karras_sigmas", "false", "false", true, NULL },
    { "use_lu_lambdas", "false", "false", true, NULL },
    { "use_exponential_sigmas", "false", "false", true, NULL },
    { "use_beta_sigmas", "false", "false", true, NULL },
    { "thresholding", "false", "false", true, NULL },
    { "variance_type", "false", "false", true, "none" },
    { "num_train_timesteps", "1000", "1000", false, NULL },
};

/* FlowMatchEulerDiscreteScheduler's keys that change its sigmas or its
 * step further (Reel's euler steps another grid whatever they say) */
static const sched_key_t euler_keys[] = {
    { "use_karras_sigmas", "false", "false", true, NULL },
    { "use_exponential_sigmas", "false", "false", true, NULL },
    { "use_beta_sigmas", "false", "false", true, NULL },
    { "shift_terminal", "false", "false", true, "none" },
    { "invert_sigmas", "false", "false", true, NULL },
    { "stochastic_sampling", "false", "false", true, NULL },
    { "num_train_timesteps", "1000", "1000", false, NULL },
};

static bool py_truth(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_TRUE: return true;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER:
    case JSON_REAL: return json_number_value(v) != 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_OBJECT: return json_object_size(v) > 0;
    default: return false;
    }
}

/* v as a message shows it and a takes list spells it: a string's text, a
 * number's shortest form ("2", not "2.0"), true, false, null, [...]. */
static void key_text(const json_t *v, char *out, size_t len) {
    if (json_is_string(v)) snprintf(out, len, "%.48s", json_string_value(v));
    else if (json_is_number(v)) snprintf(out, len, "%.17g", json_number_value(v));
    else if (json_is_true(v)) snprintf(out, len, "true");
    else if (json_is_false(v)) snprintf(out, len, "false");
    else if (json_is_null(v)) snprintf(out, len, "null");
    else snprintf(out, len, json_is_array(v) ? "a list" : "an object");
}

static bool takes_has(const char *takes, const char *t) {
    size_t n = strlen(t);
    for (const char *p = takes; p; p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL)
        if (!strncmp(p, t, n) && (p[n] == '|' || p[n] == '\0')) return true;
    return false;
}

/* Each of the n keys whose value (or diffusers' default where the file
 * has none) steps otherwise than Reel's sampler, appended to out as "KEY
 * VALUE (Reel runs R)". The number of such keys; can't fail (cut at len). */
static int sched_keys_differ(const json_t *root, const sched_key_t *keys, size_t n, char *out, size_t len) {
    int k = 0;
    size_t at = strlen(out);
    for (size_t i = 0; i < n && at < len; i++) {
        const json_t *v = json_object_get(root, keys[i].key);
        char t[64];
        if (v) key_text(v, t, sizeof t);
        else snprintf(t, sizeof t, "%s", keys[i].absent);
        if (takes_has(keys[i].takes, v && keys[i].truth ? (py_truth(v) ? "true" : "false") : t)) continue;
        int first = keys[i].runs ? (int)strlen(keys[i].runs) : (int)strcspn(keys[i].takes, "|");
        at += (size_t)snprintf(out + at, len - at, "%s%s %s%s (Reel runs %.*s)", k ? ", " : "", keys[i].key,
                               v ? "" : "absent, so diffusers' default ", t, first,
                               keys[i].runs ? keys[i].runs : keys[i].takes);
        k++;
    }
    return k;
}

#define NKEYS(a) (sizeof(a) / sizeof(a)[0])

int release_sched_read(const char *dir_arg, const release_parts_t *p, release_sched_t *out) {
    memset(out, 0, sizeof *out);
    char dbuf[PATH_MAX];
    const char *dir = release_dir(dir_arg, dbuf);
    out->shift = NAN;
    if (!p->pipeline ||
        snprintf(out->path, sizeof out->path, "%s/scheduler/scheduler_config.json", dir) >= (int)sizeof out->path ||
        !is_there(out->path))
        return 0;
    out->found = true;
    /* what keeps the file from being read is said as itself: jansson
     * reports an unopenable file, and a directory (which fopen opens),
     * as a parse error */
    struct stat st;
    if (stat(out->path, &st) != 0)
        return reel_fail(REEL_E_INVALID, "%s: cannot be read: %s", out->path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return reel_fail(REEL_E_INVALID, "%s: is a directory, not a JSON file", out->path);
    if (!S_ISREG(st.st_mode)) return reel_fail(REEL_E_INVALID, "%s: not a regular file", out->path);
    FILE *f = fopen(out->path, "rb");
    if (!f) return reel_fail(REEL_E_INVALID, "%s: cannot be read: %s", out->path, strerror(errno));
    json_error_t je;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    int read_err = ferror(f) ? (errno ? errno : EIO) : 0;
    fclose(f);
    if (!root && read_err)
        return reel_fail(REEL_E_INVALID, "%s: cannot be read: %s", out->path, strerror(read_err));
    if (!root)
        return reel_fail(REEL_E_INVALID, "%s: malformed JSON (line %d, column %d: %s)", out->path, je.line, je.column,
                         je.text);
    int rc = 0;
    const json_t *cn = json_object_get(root, "_class_name");
    if (!json_is_object(root)) {
        rc = reel_fail(REEL_E_INVALID, "%s: not a JSON object", out->path);
        goto done;
    }
    snprintf(out->class_name, sizeof out->class_name, "%s", json_is_string(cn) ? json_string_value(cn) : "");
    const char *c = out->class_name;
    const json_t *algo = json_object_get(root, "algorithm_type");
    double shift;
    char keys[448] = "";
    if (!strcmp(c, "UniPCMultistepScheduler") || !strcmp(c, "DPMSolverMultistepScheduler")) {
        bool dpm = c[0] == 'D';
        if (dpm && algo && !(json_is_string(algo) && !strcmp(json_string_value(algo), "dpmsolver++"))) {
            snprintf(out->note, sizeof out->note, "its algorithm_type is not dpmsolver++ (Reel's dpm++ is "
                     "DPM-Solver++)");
        } else if (!sched_true(root, "use_flow_sigmas")) {
            snprintf(out->note, sizeof out->note, "it has no use_flow_sigmas: a VP schedule, not Wan's flow "
                     "matching");
        } else if ((rc = sched_shift(out, root, "flow_shift", &shift)) == 0) {
            out->solver = dpm ? "dpm++" : "unipc";
            out->shift = shift;
            if (dpm) /* diffusers spaces DPM's flow sigmas as its UniPC's, from 0.999; Wan's DPM from 1 */
                snprintf(out->unlike, sizeof out->unlike, "Reel's dpm++ is Wan2.1's DPM-Solver++(2M) on "
                         "sigma_i = shift(1 - i/N), from 1; diffusers' steps shift(0.999*(1 - i/N)), from "
                         "shift(0.999): the same solver on other sigmas%s",
                         sched_keys_differ(root, dpm_keys, NKEYS(dpm_keys), keys, sizeof keys) ? "; and " : "");
            else if (sched_keys_differ(root, unipc_keys, NKEYS(unipc_keys), keys, sizeof keys)) {
                snprintf(out->unlike, sizeof out->unlike, "%s: Reel runs its own UniPC (order 2, bh2, data "
                         "prediction, flow sigmas, lower order on the first and the last step, final sigma 0) "
                         "with the file's flow_shift %g", keys, shift);
                keys[0] = '\0';
            }
        }
    } else if (!strcmp(c, "FlowMatchEulerDiscreteScheduler")) {
        out->solver = "euler";
        if (sched_true(root, "use_dynamic_shifting"))
            snprintf(out->note, sizeof out->note, "its use_dynamic_shifting takes the shift from a mu WanPipeline "
                     "never passes (diffusers' set_timesteps refuses it)");
        else if ((rc = sched_shift(out, root, "shift", &shift)) == 0)
            out->shift = shift;
        /* diffusers' sigma_min is already shifted, and its set_timesteps
         * shifts the N-point linspace down to it once more */
        snprintf(out->unlike, sizeof out->unlike, "Reel's euler steps sigma_i = shift(1 - i/N); diffusers' "
                 "shift(linspace(1, shift(1/1000), N)), far lower at its end (N 50, shift 3: its last sigma "
                 "before 0 is 0.0089, Reel's 0.0577): the same Euler step on other sigmas%s",
                 sched_keys_differ(root, euler_keys, NKEYS(euler_keys), keys, sizeof keys) ? "; and " : "");
    } else {
        snprintf(out->note, sizeof out->note, "%s is no scheduler Reel maps to a sampler (UniPCMultistepScheduler, "
                 "FlowMatchEulerDiscreteScheduler, DPMSolverMultistepScheduler)", c[0] ? c : "a _class_name-less one");
    }
    if (out->unlike[0] && keys[0]) {
        size_t n = strlen(out->unlike);
        snprintf(out->unlike + n, sizeof out->unlike - n, "%s", keys);
    }
done:
    json_decref(root);
    return rc;
}
