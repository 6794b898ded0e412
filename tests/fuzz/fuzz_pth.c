/* fuzz_pth.c -- libFuzzer harness: a .pth checkpoint (model/pth.h) from
 * bytes, as pth_parse reads it (zip container, pickle, strided views), every
 * tensor then read back as F32. Nothing may crash, leak or read out of
 * bounds; every refusal is a message. Seeds: small archives written by
 * tests/pth_make.py (tests/fuzz/corpus/pth/). */
#include <stdint.h>
#include <stdlib.h>
#include "base/error.h"
#include "model/pth.h"

/* A hostile size must be refused by Reel's own checks, not abort ASan. */
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)pth_sniff(data, size);
    st_file_t *f = pth_parse(data, size, "fuzz input");
    if (!f) return 0;
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
        if (n > (1 << 20)) continue;
        float *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
        if (buf && st_read_f32(f, t->name, t->ndim, t->shape, buf) != 0) abort(); /* pth_parse let a bad tensor by */
        free(buf);
    }
    st_close(&f);
    return 0;
}
