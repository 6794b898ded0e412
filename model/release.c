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

int release_find(const char *dir, release_parts_t *out) {
    memset(out, 0, sizeof *out);
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

void release_text_missing(const char *dir, const release_parts_t *p, char *out, size_t len) {
    size_t n = 0;
    out[0] = '\0';
    if (!p->t5[0])
        n += (size_t)snprintf(out + n, len - n, p->pipeline ? "no text encoder: %s/ has neither %s nor %s/"
                                                            : "no text encoder: %s/ has no %s (nor a models_t5_*.pth)",
                              dir, RELEASE_T5_NAME, RELEASE_DIFFUSERS_T5);
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

int release_sched_read(const char *dir, const release_parts_t *p, release_sched_t *out) {
    memset(out, 0, sizeof *out);
    out->shift = NAN;
    if (!p->pipeline ||
        snprintf(out->path, sizeof out->path, "%s/scheduler/scheduler_config.json", dir) >= (int)sizeof out->path ||
        !is_there(out->path))
        return 0;
    out->found = true;
    json_error_t je;
    json_t *root = json_load_file(out->path, JSON_REJECT_DUPLICATES, &je);
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
        }
    } else if (!strcmp(c, "FlowMatchEulerDiscreteScheduler")) {
        out->solver = "euler";
        if (sched_true(root, "use_dynamic_shifting"))
            snprintf(out->note, sizeof out->note, "its use_dynamic_shifting makes the shift the size's, not one value");
        else if ((rc = sched_shift(out, root, "shift", &shift)) == 0)
            out->shift = shift;
    } else {
        snprintf(out->note, sizeof out->note, "%s is no scheduler Reel maps to a sampler (UniPCMultistepScheduler, "
                 "FlowMatchEulerDiscreteScheduler, DPMSolverMultistepScheduler)", c[0] ? c : "a _class_name-less one");
    }
done:
    json_decref(root);
    return rc;
}
