/* fuzz_lora.c -- libFuzzer harness: a LoRA adapter as users download it
 * (model/lora.h): a PEFT folder (adapter_config.json beside
 * adapter_model.safetensors or .bin), diffusers' pytorch_lora_weights.
 * safetensors, or a weights file alone, given as a small archive of files
 * (tests/fuzz/fuzz_files.h) and read by lora_is_adapter and lora_open, by
 * the folder and by the file the archive names first.
 * Whatever the bytes, lora_open returns an adapter or NULL with a message.
 * What it accepts must hold what lora_check and the merge rely on (checked
 * below with abort()); one lora_check accepts against a model must merge
 * onto that model's weights without leaving F32's range, as lora.h
 * promises. Seeds: tests/fuzz/corpus/lora/, from tests/fuzz/make_seeds.py. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/lora.h"
#include "model/tinydit.h"
#include "tests/fuzz/fuzz_files.h"

/* A hostile size must be refused by Reel's own checks, not abort ASan. */
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* What lora.h says of an accepted adapter's targets. */
static void check_targets(const lora_t *l) {
    int n = lora_n_targets(l);
    if (n < 1 || n > LORA_MAX_TARGETS) abort();
    if (lora_rank(l) < 0 || lora_rank(l) > LORA_MAX_RANK) abort();
    for (int i = 0; i < n; i++) {
        const lora_target_t *t = lora_target(l, i);
        size_t wl = strnlen(t->weight, sizeof t->weight);
        if (wl == 0 || wl == sizeof t->weight) abort();
        if (lora_find(l, t->weight) != t) abort(); /* each weight one target */
        if (!t->a != !t->b) abort();                /* an A without its B is refused */
        if (t->a) {
            if (t->rank < 1 || t->rank > LORA_MAX_RANK || t->out < 1 || t->in < 1) abort();
            if (!isfinite(t->scale)) abort();
            for (int64_t j = 0; j < t->rank * t->in; j++)
                if (!isfinite(t->a[j])) abort();
            for (int64_t j = 0; j < t->out * t->rank; j++)
                if (!isfinite(t->b[j])) abort();
        } else if (t->rank != 0 || t->m) {
            abort(); /* a DoRA magnitude needs its matrices */
        }
        if (t->d) {
            if (t->d_ndim < 1 || t->d_ndim > LORA_DIFF_MAX_DIMS) abort();
            int64_t numel = 1;
            for (int d = 0; d < t->d_ndim; d++) numel *= t->d_shape[d];
            if (numel < 1 || numel != t->d_numel || !isfinite(t->d_scale)) abort();
            for (int64_t j = 0; j < t->d_numel; j++)
                if (!isfinite(t->d[j])) abort();
        }
        if (t->m) {
            if (t->m_len != t->out || t->d) abort();
            for (int64_t j = 0; j < t->m_len; j++)
                if (!isfinite(t->m[j])) abort();
        }
    }
    char buf[1024];
    if (lora_describe(l, buf, sizeof buf) != 0) abort(); /* bounded: at most 192 bytes of modules */
}

/* Against model c: lora_check's verdict, and, when it accepts, every
 * target merged onto weights of ones stays finite (or the merge refuses a
 * DoRA row, naming it). */
static void check_against(const lora_t *l, const tdit_config_t *c) {
    if (lora_check(l, c) != 0) {
        if (!reel_err_text()[0]) abort();
        if (getenv("REEL_FUZZ_SAY")) fprintf(stderr, "%s: lora_check refused: %s\n", c->name, reel_err_text());
        return;
    }
    size_t n;
    tdit_weight_t *w = tdit_config_weights(c, &n);
    if (!w) abort();
    for (size_t i = 0; i < n; i++) {
        if (!lora_find(l, w[i].name)) continue;
        int64_t numel = 1;
        for (int d = 0; d < w[i].ndim; d++) numel *= w[i].shape[d];
        float *v = malloc((size_t)numel * sizeof *v);
        if (!v) abort();
        for (int64_t j = 0; j < numel; j++) v[j] = 1.0f;
        if (lora_merge_into(l, w[i].name, v, numel) == 0) {
            for (int64_t j = 0; j < numel; j++)
                if (!isfinite(v[j])) abort(); /* lora_check let a merge leave F32's range */
        } else if (!reel_err_text()[0]) {
            abort();
        }
        free(v);
    }
    free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the seeds' model (tests/fuzz/make_seeds.py) and the built-in tiny */
    static const tdit_config_t seeds = { "fuzz", 8, 2, 2, 16, 4, 8, 8, 0 };
    static tdit_config_t tiny;
    if (!tiny.dim && tdit_config_builtin("tiny", &tiny) != 0) abort();
    fuzz_file_t files[FUZZ_FILES_MAX];
    int nfiles;
    const char *dir = fuzz_files_write(data, size, files, &nfiles);
    /* the folder, then the file the archive names first (a weights file
     * named by path, adapter_config.json beside it or not) */
    for (int run = 0; run < 2; run++) {
        char path[512];
        if (run == 0) snprintf(path, sizeof path, "%s", dir);
        else if (nfiles && !strchr(files[0].name, '/')) snprintf(path, sizeof path, "%s/%s", dir, files[0].name);
        else break;
        (void)lora_is_adapter(path);
        reel_err_clear();
        lora_t *l = lora_open(path);
        if (!l) {
            if (!reel_err_text()[0]) abort(); /* a refusal always says why */
            if (getenv("REEL_FUZZ_SAY")) fprintf(stderr, "refused: %s\n", reel_err_text());
            continue;
        }
        if (getenv("REEL_FUZZ_SAY")) fprintf(stderr, "accepted: %d targets\n", lora_n_targets(l));
        check_targets(l);
        check_against(l, &seeds);
        check_against(l, &tiny);
        lora_close(&l);
    }
    fuzz_files_done(dir);
    return 0;
}
