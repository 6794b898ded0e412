/* fuzz_wan_ckpt.c -- libFuzzer harness: a Wan2.1 checkpoint folder as
 * users download it (model/wan_ckpt.h): config.json (Wan's or diffusers'),
 * a sharded release's diffusion_pytorch_model.safetensors.index.json and
 * its shards, a diffusers pipeline's model_index.json and transformer/, or
 * one safetensors file, given as a small archive of files
 * (tests/fuzz/fuzz_files.h) and opened by wan_ckpt_open as `reelctl
 * weights inspect`, a worker's --weights and a sync by path would.
 * Whatever the
 * bytes, wan_ckpt_open returns a checkpoint or NULL with a message; what it
 * accepts must be what tdit_model_load takes: a valid config, the
 * model's tensors under Reel's names, each of its shape, readable, and a
 * load that leaves nothing behind. Seeds: tests/fuzz/corpus/wan_ckpt/,
 * from tests/fuzz/make_seeds.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/backend.h"
#include "model/safetensors.h"
#include "model/tinydit.h"
#include "model/wan_ckpt.h"
#include "tests/fuzz/fuzz_files.h"

/* A hostile size must be refused by Reel's own checks, not abort ASan. */
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* What wan_ckpt.h promises of c, opened with o. */
static void check(const wan_ckpt_t *c, const wan_opts_t *o, kern_backend_t *cpu) {
    const tdit_config_t *cfg = wan_ckpt_config(c);
    if (tdit_config_validate(cfg) != 0) abort();
    if (o->expect && !tdit_config_same_network(cfg, o->expect)) abort();
    if ((unsigned)wan_ckpt_layout(c) > WAN_LAYOUT_PIPELINE) abort();
    const char *id = wan_ckpt_identity(c);
    if (strlen(id) != 64 || strspn(id, "0123456789abcdef") != 64) abort();
    size_t nf = wan_ckpt_n_files(c);
    if (nf < 1 || !wan_ckpt_file_at(c, nf - 1) || wan_ckpt_file_at(c, nf)) abort();
    wan_summary_t s;
    wan_ckpt_summary(c, &s);
    if (s.parameters != tdit_config_params(cfg)) abort();
    const st_file_t *f = wan_ckpt_file(c);
    if (o->no_data) {
        if (f) abort();
        return;
    }
    if (!f) abort();
    /* every weight of the config, of its shape, readable */
    size_t n;
    tdit_weight_t *w = tdit_config_weights(cfg, &n);
    if (!w) abort();
    if (wan_ckpt_layout(c) != WAN_LAYOUT_REEL && (st_count(f) != n || s.tensors != n)) abort();
    for (size_t i = 0; i < n; i++) {
        const st_tensor_t *t = st_find(f, w[i].name);
        if (!t) abort();
        int64_t numel = 1;
        for (int d = 0; d < w[i].ndim; d++) numel *= w[i].shape[d];
        if (numel > (1 << 20)) continue;
        float *v = malloc((size_t)(numel ? numel : 1) * sizeof *v);
        if (!v) abort();
        if (st_read_f32(f, w[i].name, w[i].ndim, w[i].shape, v) != 0) abort();
        free(v);
    }
    free(w);
    if (tdit_config_params(cfg) < (1 << 18)) {
        tdit_model_t *m = tdit_model_load(cpu, f, KERN_F32);
        if (!m && !reel_err_text()[0]) abort();
        tdit_model_destroy(&m);
        if (kern_bytes_in_use(cpu) != 0) abort(); /* a load left memory behind */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kern_backend_t *cpu;
    static const tdit_config_t seeds = { "custom", 4, 2, 1, 4, 2, 4, 4, 16 }; /* make_seeds.py's DiT */
    if (!cpu && !(cpu = kern_backend_cpu_new())) abort();
    fuzz_file_t files[FUZZ_FILES_MAX];
    int nfiles;
    const char *dir = fuzz_files_write(data, size, files, &nfiles);
    /* as reelctl opens it (the folder, then the file or index the
     * archive names first), then as a worker (the model expected, its
     * size the bound, no symlink followed) or inspect (no data kept) */
    for (int run = 0; run < 3; run++) {
        wan_opts_t o = { 0 };
        char path[512];
        snprintf(path, sizeof path, "%s", dir);
        if (run == 1) {
            if (!nfiles || strchr(files[0].name, '/')) continue;
            snprintf(path, sizeof path, "%s/%s", dir, files[0].name);
        } else if (run == 2 && size % 2) {
            o.no_data = true;
        } else if (run == 2) {
            o.expect = &seeds;
            o.max_data = (uint64_t)tdit_config_params(&seeds) * 4;
            o.nofollow = true;
        }
        reel_err_clear();
        wan_ckpt_t *c = wan_ckpt_open(path, &o);
        if (!c) {
            if (!reel_err_text()[0] || reel_err_code() == REEL_OK) abort(); /* a refusal says why, with a code */
            if (getenv("REEL_FUZZ_SAY")) fprintf(stderr, "refused: %s\n", reel_err_text());
            continue;
        }
        if (getenv("REEL_FUZZ_SAY")) fprintf(stderr, "accepted: %s\n", wan_layout_name(wan_ckpt_layout(c)));
        check(c, &o, cpu);
        wan_ckpt_destroy(&c);
    }
    fuzz_files_done(dir);
    return 0;
}
