/* release.c -- a release folder's parts by name (see release.h). */
#include "model/release.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
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
