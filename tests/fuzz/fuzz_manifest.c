/* fuzz_manifest.c -- libFuzzer harness: an artifact's manifest.json
 * (kernels/artifacts.h, docs/ARTIFACTS.md), which Reel reads from any
 * bundle directory before deciding whether to load it. Whatever the bytes,
 * the parser returns 0 or -1 with a message; anything it accepts must hold
 * the schema's promises, checked here (an accepted manifest is what the
 * loader trusts). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/artifacts.h"
#include "base/error.h"

static void check(const kern_art_manifest_t *m) {
    if (!m->id[0] || !m->version[0] || !m->object[0]) abort();
    if (!kern_art_op_supported(m->op)) abort();
    if ((unsigned)m->backend >= KERN_BACKEND_COUNT) abort();
    if (m->n_arch < 1 || m->n_arch > KERN_ART_MAX_ARCH) abort();
    if (!m->dtypes || m->dtypes >= (1u << KERN_DTYPE_COUNT)) abort();
    if (m->n_shapes < 0 || m->n_shapes > KERN_ART_MAX_DIMS) abort();
    for (int i = 0; i < m->n_shapes; i++)
        if (m->shapes[i].min < 0 || m->shapes[i].max < m->shapes[i].min) abort();
    if (m->parity == KERN_PARITY_MAX_REL && !(m->max_rel > 0 && m->max_rel <= 1)) abort();
    if (m->n_files < 1 || m->n_files > KERN_ART_MAX_FILES) abort();
    int object = 0;
    for (int i = 0; i < m->n_files; i++) {
        if (strlen(m->files[i].sha256) != 64 || strchr(m->files[i].name, '/')) abort();
        object += !strcmp(m->files[i].name, m->object);
    }
    if (object != 1) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kern_art_manifest_t m;
    if (kern_art_manifest_parse((const char *)data, size, &m) == 0) check(&m);
    else if (!reel_err_text()[0]) abort(); /* a refusal always says why */
    /* The same bytes as a parity rule and a timing name (NUL-terminated). */
    if (size < 64) {
        char s[64];
        memcpy(s, data, size);
        s[size] = '\0';
        kern_parity_kind_t k;
        double r;
        kern_art_timing_t t;
        if (kern_art_parity_parse(s, &k, &r) == 0 && k == KERN_PARITY_MAX_REL && !(r > 0 && r <= 1))
            abort();
        (void)kern_art_timing_parse(s, &t);
    }
    return 0;
}
