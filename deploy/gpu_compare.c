/* gpu_compare.c -- compares one tensor of two safetensors files by a stated
 * tolerance, for deploy/gpu-check.sh (CUDA results against the CPU's, where
 * `reelctl tensor diff`, being bitwise, cannot be the judge).
 *
 *   gpu_compare GOT REF --nmse T [--max-rel R] [--tensor NAME] [--differ]
 *
 * NMSE = Σ(got − ref)² / Σref² must be ≤ T; with --max-rel, every
 * |got − ref| must also be ≤ R · max|ref|. Any NaN or Inf in either file,
 * a shape mismatch, an empty or all-zero reference fails. --differ fails
 * when the two are bitwise equal: a CUDA result bitwise equal to the CPU's
 * is the mark of a run that fell back to the CPU.
 *
 * Prints one line, "compare NAME [shape]: nmse ... (tol ...), max err ...,
 * bitwise equal yes|no", then "OK" or "FAIL <reason>" on it. Exits 0 within
 * tolerance, 1 otherwise (unreadable file included), 2 on bad usage. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/safetensors.h"

static int usage(void) {
    fprintf(stderr, "usage: gpu_compare GOT.safetensors REF.safetensors --nmse T [--max-rel R] "
                    "[--tensor latent] [--differ]\n");
    return 2;
}

static bool parse_pos(const char *s, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* The tensor `name` of path widened to F32 (caller frees), its shape
 * written to *t; NULL with a message on stdout. */
static float *load(const char *path, const char *name, st_tensor_t *t) {
    st_file_t *f = st_open(path);
    if (!f) {
        printf("compare: FAIL %s\n", reel_err_text());
        return NULL;
    }
    float *x = NULL;
    const st_tensor_t *e = st_find(f, name);
    if (!e) {
        printf("compare: FAIL %s has no tensor '%s'\n", path, name);
        goto out;
    }
    *t = *e;
    t->name = NULL; /* both owned by f, gone with it: only ndim and shape are kept */
    t->data = NULL;
    size_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= (size_t)e->shape[i];
    x = malloc((n ? n : 1) * sizeof *x);
    if (!x || st_read_f32(f, name, -1, NULL, x) != 0) {
        printf("compare: FAIL %s: %s\n", path, x ? reel_err_text() : "out of memory");
        free(x);
        x = NULL;
    }
out:
    st_close(&f);
    return x;
}

int main(int argc, char **argv) {
    const char *paths[2] = { NULL, NULL }, *name = "latent";
    double tol = -1, max_rel = -1;
    bool differ = false;
    int np = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nmse") && i + 1 < argc) {
            if (!parse_pos(argv[++i], &tol)) return usage();
        } else if (!strcmp(argv[i], "--max-rel") && i + 1 < argc) {
            if (!parse_pos(argv[++i], &max_rel)) return usage();
        } else if (!strcmp(argv[i], "--tensor") && i + 1 < argc) {
            name = argv[++i];
        } else if (!strcmp(argv[i], "--differ")) {
            differ = true;
        } else if (argv[i][0] != '-' && np < 2) {
            paths[np++] = argv[i];
        } else {
            return usage();
        }
    }
    if (np != 2 || tol < 0) return usage();

    st_tensor_t tg, tr;
    float *g = load(paths[0], name, &tg), *r = g ? load(paths[1], name, &tr) : NULL;
    if (!g || !r) {
        free(g);
        return 1;
    }
    int rc = 1;
    char shape[KERN_MAX_DIMS * 21 + 3];
    kern_shape_text(tr.ndim, tr.shape, shape, sizeof shape);
    if (tg.ndim != tr.ndim || memcmp(tg.shape, tr.shape, sizeof tg.shape[0] * (size_t)tr.ndim) != 0) {
        printf("compare %s: FAIL shapes differ (reference %s)\n", name, shape);
        goto out;
    }
    size_t n = 1;
    for (int i = 0; i < tr.ndim; i++) n *= (size_t)tr.shape[i];
    double num = 0, den = 0, worst = 0, ref_max = 0;
    size_t bad = 0, worst_i = 0;
    bool same = true;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) || !isfinite(r[i])) {
            bad++;
            continue;
        }
        double d = (double)g[i] - (double)r[i];
        num += d * d;
        den += (double)r[i] * (double)r[i];
        if (fabs(d) > worst) {
            worst = fabs(d);
            worst_i = i;
        }
        if (fabs((double)r[i]) > ref_max) ref_max = fabs((double)r[i]);
        if (memcmp(&g[i], &r[i], sizeof g[i]) != 0) same = false;
    }
    double nmse = den > 0 ? num / den : INFINITY;
    printf("compare %s %s: nmse %.3g (tol %.0e), max err %.3g = %.3g of max|ref| %.3g (at %zu), bitwise equal %s",
           name, shape, nmse, tol, worst, ref_max > 0 ? worst / ref_max : INFINITY, ref_max, worst_i,
           same && !bad ? "yes" : "no");
    if (bad)
        printf(": FAIL %zu values are NaN or Inf\n", bad);
    else if (n == 0 || !(den > 0))
        printf(": FAIL the reference is empty or all zeros, so it proves nothing\n");
    else if (!(nmse <= tol))
        printf(": FAIL nmse above tolerance\n");
    else if (max_rel > 0 && !(worst <= max_rel * ref_max))
        printf(": FAIL max err above %.0e of max|ref|\n", max_rel);
    else if (differ && same)
        printf(": FAIL bitwise equal to the reference: the run fell back to the reference's backend\n");
    else {
        printf(": OK\n");
        rc = 0;
    }
out:
    free(g);
    free(r);
    return rc;
}
