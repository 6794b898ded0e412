/* fuzz_safetensors.c -- libFuzzer harness: a safetensors file as a worker
 * receives it (st_parse), every tensor read back as F32, the model config
 * from its metadata, and a model load on the CPU backend when the config is
 * small enough to allocate. Nothing may crash, leak or read out of bounds;
 * every refusal is a message. */
#include <stdint.h>
#include <stdlib.h>
#include "kernels/backend.h"
#include "base/error.h"
#include "model/safetensors.h"
#include "model/tinydit.h"

/* A hostile size must be refused by Reel's own checks, not abort ASan. */
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kern_backend_t *cpu;
    if (!cpu && !(cpu = kern_backend_cpu_new())) abort();
    st_file_t *f = st_parse(data, size);
    if (!f) return 0;
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
        if (n > (1 << 20)) continue;
        float *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
        if (buf) (void)st_read_f32(f, t->name, t->ndim, t->shape, buf);
        free(buf);
    }
    (void)st_meta(f, "config");
    tdit_config_t c;
    if (tdit_config_from_meta(f, &c) == 0 && tdit_config_params(&c) < (1 << 20)) {
        tdit_model_t *m = tdit_model_load(cpu, f, KERN_F32);
        tdit_model_destroy(&m);
        if (kern_bytes_in_use(cpu) != 0) abort(); /* a failed load left memory behind */
    }
    st_close(&f);
    return 0;
}
