/* fuzz_release.c -- libFuzzer harness: a release folder's parts beside the
 * DiT, as users download them (model/release.h, model/hf_parts.h): Wan's
 * models_t5_*.safetensors and Wan2.1_VAE.safetensors, a diffusers
 * pipeline's text_encoder/ (model.safetensors.index.json and its shards
 * under UMT5's names, config.json) and vae/ (AutoencoderKLWan's names,
 * config.json with latents_mean / latents_std) and
 * scheduler/scheduler_config.json, given as a small archive of files
 * (tests/fuzz/fuzz_files.h). The folder goes through release_find,
 * release_text_missing and release_sched_read, each part found through
 * hf_part_open, then the model's reader of it (t5_config_from_weights,
 * vae_config_from_weights) and, small enough, its load on the CPU backend.
 * Whatever the bytes: a result or -1 / NULL with a message; what is
 * accepted must hold what the callers rely on (checked with abort()).
 * Seeds: tests/fuzz/corpus/release/, from tests/fuzz/make_seeds.py. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/backend.h"
#include "model/hf_parts.h"
#include "model/release.h"
#include "model/safetensors.h"
#include "model/t5.h"
#include "model/vae.h"
#include "tests/fuzz/fuzz_files.h"

/* A hostile size must be refused by Reel's own checks, not abort ASan. */
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static void refused(void) {
    if (!reel_err_text()[0]) abort(); /* a refusal always says why */
    if (getenv("REEL_FUZZ_SAY")) fprintf(stderr, "refused: %s\n", reel_err_text());
}

static int64_t numel_of(const st_tensor_t *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* One part as hf_part_open gives it: every tensor readable, then its
 * model's reading of the shapes and a load that leaves nothing behind. */
static void part(kern_backend_t *cpu, const char *path, hf_part_t kind) {
    reel_err_clear();
    st_file_t *f = hf_part_open(path, kind);
    if (!f) {
        refused();
        return;
    }
    int64_t total = 0;
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        int64_t n = numel_of(t);
        total += n;
        if (n > (1 << 20)) continue;
        float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        if (v) (void)st_read_f32(f, t->name, t->ndim, t->shape, v); /* a dtype it cannot widen: refused */
        free(v);
        /* a message naming the tensor gains its name in the file, within the message's bound */
        reel_fail(REEL_E_INVALID, "%s: missing %s", path, t->name);
        hf_part_explain(f);
    }
    reel_err_clear();
    if (kind == HF_PART_T5) {
        t5_config_t c;
        if (t5_config_from_weights(f, &c) != 0) {
            refused();
        } else {
            if (t5_config_validate(&c) != 0) abort();
            if (getenv("REEL_FUZZ_SAY")) fprintf(stderr, "t5 %s: %s\n", path, c.name);
            if (total < (1 << 16)) {
                t5_model_t *m = t5_model_load(cpu, f, KERN_F32);
                if (!m) refused();
                t5_model_destroy(&m);
                if (kern_bytes_in_use(cpu) != 0) abort();
            }
        }
    } else {
        vae_config_t c;
        if (vae_config_from_weights(f, &c) != 0) {
            refused();
        } else {
            if (vae_config_validate(&c) != 0) abort();
            if (getenv("REEL_FUZZ_SAY")) fprintf(stderr, "vae %s: %s\n", path, c.name);
            if (total < (1 << 16)) {
                vae_model_t *m = vae_model_load(cpu, f, KERN_F32);
                if (!m) refused();
                vae_model_destroy(&m);
                if (kern_bytes_in_use(cpu) != 0) abort();
            }
        }
    }
    st_close(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kern_backend_t *cpu;
    if (!cpu && !(cpu = kern_backend_cpu_new())) abort();
    const char *dir = fuzz_files_write(data, size, NULL, NULL);
    release_parts_t p;
    if (release_find(dir, &p) != 0) abort(); /* dir is a readable folder */
    char missing[1024];
    release_text_missing(dir, &p, missing, sizeof missing);
    if (strlen(missing) >= sizeof missing) abort();
    release_sched_t s;
    reel_err_clear();
    if (release_sched_read(dir, &p, &s) != 0) {
        refused();
    } else if (s.solver) {
        if (getenv("REEL_FUZZ_SAY")) fprintf(stderr, "scheduler: %s %g\n", s.solver, s.shift);
        if (strcmp(s.solver, "unipc") && strcmp(s.solver, "euler") && strcmp(s.solver, "dpm++")) abort();
        if (!isnan(s.shift) && !(s.shift > 0 && isfinite(s.shift))) abort(); /* a shift taken is a number > 0 */
    }
    if (p.t5[0]) part(cpu, p.t5, HF_PART_T5);
    if (p.vae[0]) part(cpu, p.vae, HF_PART_VAE);
    fuzz_files_done(dir);
    return 0;
}
