/* gpu_attn_wan.c -- attention at Wan sizes against a double-precision CPU
 * reference on sampled query rows, for deploy/gpu-check.sh.
 *
 *   gpu_attn_wan [--backend cuda|cpu] [--dtype bf16|f32] [--tokens 32760]
 *                [--kv N] [--heads 12] [--head-dim 128] [--rows 256]
 *                [--sigma 1.5] [--seed 1] [--nmse 1e-4] [--max-rel 0.03125]
 *
 * q [tokens, heads·d] and k, v [kv, heads·d] (kv defaults to tokens: self
 * attention; 512 is Wan's cross attention over the text) are drawn from a
 * fixed seed: q, k normal with std sigma (1.5 gives logits of std 2.25, a
 * softmax neither flat nor one-hot), v uniform in [-1, 1]; in BF16 they are
 * rounded first and the reference computes on their exact widening, so the
 * error measured is the kernel's own. The output is poisoned (NaN) before
 * the run and every value of it must come back finite. `rows` query rows,
 * evenly spaced from the first to the last, are checked against the
 * reference: NMSE ≤ --nmse and every |err| ≤ --max-rel · max|ref|.
 *
 * Prints one line per run ("attention ...: OK" or "...: FAIL <reason>") and
 * exits 0 when it passes, 1 on failure (a backend that is not there
 * included; there is no fallback), 2 on bad usage. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "base/error.h"
#include "kernels/ops.h"

typedef struct {
    const char *backend, *dtype;
    int64_t tokens, kv, heads, hd, rows;
    double sigma, nmse, max_rel;
    uint64_t seed;
} opts_t;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unit(uint64_t *s) { return ((double)(splitmix(s) >> 11) + 0.5) / 9007199254740992.0; }

/* n values, normal (std sigma) or uniform in [-1, 1], rounded to BF16 when
 * bf16 (so host and device hold the same numbers). */
static void draw(float *x, size_t n, uint64_t seed, double sigma, bool normal, bool bf16) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        double v = normal ? sigma * sqrt(-2.0 * log(unit(&s))) * cos(6.283185307179586 * unit(&s))
                          : 2.0 * unit(&s) - 1.0;
        x[i] = (float)v;
        if (bf16) x[i] = kern_bf16_to_f32(kern_f32_to_bf16(x[i]));
    }
}

/* --- the reference: rows [r0, r1) of the checked set, all heads -------- */

typedef struct {
    const opts_t *o;
    const float *q, *k, *v;
    const int64_t *rows;
    int64_t r0, r1;
    double *out; /* [rows, heads·d] */
} ref_job_t;

static void *ref_worker(void *arg) {
    ref_job_t *j = arg;
    const opts_t *o = j->o;
    int64_t D = o->heads * o->hd;
    double scale = 1.0 / sqrt((double)o->hd);
    double *p = malloc((size_t)o->kv * sizeof *p);
    if (!p) return (void *)1;
    for (int64_t ri = j->r0; ri < j->r1; ri++) {
        const float *qr = j->q + j->rows[ri] * D;
        for (int64_t h = 0; h < o->heads; h++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t t = 0; t < o->kv; t++) {
                const float *kr = j->k + t * D + h * o->hd;
                double dot = 0;
                for (int64_t d = 0; d < o->hd; d++) dot += (double)qr[h * o->hd + d] * (double)kr[d];
                p[t] = dot * scale;
                if (p[t] > mx) mx = p[t];
            }
            for (int64_t t = 0; t < o->kv; t++) sum += (p[t] = exp(p[t] - mx));
            double *dst = j->out + ri * D + h * o->hd;
            for (int64_t d = 0; d < o->hd; d++) dst[d] = 0;
            for (int64_t t = 0; t < o->kv; t++) {
                const float *vr = j->v + t * D + h * o->hd;
                for (int64_t d = 0; d < o->hd; d++) dst[d] += p[t] * (double)vr[d];
            }
            for (int64_t d = 0; d < o->hd; d++) dst[d] /= sum;
        }
    }
    free(p);
    return NULL;
}

/* The reference rows on every core; 0, or -1 when a thread failed. */
static int reference(const opts_t *o, const float *q, const float *k, const float *v,
                     const int64_t *rows, double *out) {
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = nc < 1 ? 1 : nc > 64 ? 64 : (int)nc;
    if (nt > o->rows) nt = (int)o->rows;
    pthread_t th[64];
    ref_job_t jobs[64];
    int rc = 0, started = 0;
    for (int i = 0; i < nt; i++) {
        jobs[i] = (ref_job_t){ o, q, k, v, rows, o->rows * i / nt, o->rows * (i + 1) / nt, out };
        if (pthread_create(&th[i], NULL, ref_worker, &jobs[i]) != 0) {
            rc = -1;
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        if (r) rc = -1;
    }
    return rc;
}

/* --- one run --------------------------------------------------------------- */

static int upload(kern_stream_t *s, kern_tensor_t *t, const float *h) {
    size_t n = (size_t)kern_tensor_numel(t), bytes = kern_tensor_bytes(t);
    void *buf = (void *)h;
    if (t->dtype == KERN_BF16) {
        uint16_t *b = malloc(n * sizeof *b);
        if (!b) return reel_fail(REEL_E_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) b[i] = kern_f32_to_bf16(h[i]);
        buf = b;
    }
    int rc = kern_copy_h2d(s, kern_tensor_ptr(t), buf, bytes);
    if (rc == 0) rc = kern_stream_sync(s);
    if (buf != h) free(buf);
    return rc;
}

static int poison(kern_stream_t *s, kern_tensor_t *t) {
    size_t bytes = kern_tensor_bytes(t);
    void *p = malloc(bytes);
    if (!p) return reel_fail(REEL_E_NOMEM, "out of memory");
    memset(p, 0xff, bytes); /* NaN in F32 and BF16 */
    int rc = kern_copy_h2d(s, kern_tensor_ptr(t), p, bytes);
    if (rc == 0) rc = kern_stream_sync(s);
    free(p);
    return rc;
}

static int run(const opts_t *o) {
    kern_backend_kind_t kind;
    kern_dtype_t dt = strcmp(o->dtype, "bf16") ? KERN_F32 : KERN_BF16;
    const int64_t D = o->heads * o->hd;
    const size_t nq = (size_t)(o->tokens * D), nk = (size_t)(o->kv * D);
    int rc = 1;
    kern_backend_t *b = NULL;
    kern_stream_t *s = NULL;
    kern_tensor_t tq = { 0 }, tk = { 0 }, tv = { 0 }, to = { 0 };
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *got = malloc(nq * 4);
    uint16_t *raw = malloc(nq * kern_dtype_size(dt));
    int64_t *rows = malloc((size_t)o->rows * sizeof *rows);
    double *ref = malloc((size_t)o->rows * (size_t)D * sizeof *ref);
    char what[160];
    snprintf(what, sizeof what, "attention %s %s q %lld kv %lld heads %lld d %lld", o->dtype, o->backend,
             (long long)o->tokens, (long long)o->kv, (long long)o->heads, (long long)o->hd);
    if (!q || !k || !v || !got || !raw || !rows || !ref) {
        printf("%s: FAIL out of host memory\n", what);
        goto out;
    }
    if (kern_backend_kind_parse(o->backend, &kind) != 0 || !(b = kern_backend_new(kind, 0)) ||
        !(s = kern_stream_new(b))) {
        printf("%s: FAIL %s\n", what, reel_err_text());
        goto out;
    }
    snprintf(what, sizeof what, "attention %s %s q %lld kv %lld heads %lld d %lld", o->dtype,
             kern_backend_device_name(b), (long long)o->tokens, (long long)o->kv, (long long)o->heads,
             (long long)o->hd);
    draw(q, nq, o->seed * 3 + 0, o->sigma, true, dt == KERN_BF16);
    draw(k, nk, o->seed * 3 + 1, o->sigma, true, dt == KERN_BF16);
    draw(v, nk, o->seed * 3 + 2, 1.0, false, dt == KERN_BF16);
    tq = kern_tensor_alloc(b, dt, 2, (int64_t[]){ o->tokens, D });
    tk = kern_tensor_alloc(b, dt, 2, (int64_t[]){ o->kv, D });
    tv = kern_tensor_alloc(b, dt, 2, (int64_t[]){ o->kv, D });
    to = kern_tensor_alloc(b, dt, 2, (int64_t[]){ o->tokens, D });
    if (!tq.data || !tk.data || !tv.data || !to.data || upload(s, &tq, q) || upload(s, &tk, k) ||
        upload(s, &tv, v)) {
        printf("%s: FAIL %s\n", what, reel_err_text());
        goto out;
    }
    /* The first run loads modules and sizes scratch; the second is timed
     * and checked, each on a poisoned output. */
    double t0 = 0, t1 = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (poison(s, &to) != 0) {
            printf("%s: FAIL %s\n", what, reel_err_text());
            goto out;
        }
        t0 = now();
        if (kern_attention(s, &tq, &tk, &tv, o->heads, &to) != 0 || kern_stream_sync(s) != 0) {
            printf("%s: FAIL %s\n", what, reel_err_text());
            goto out;
        }
        t1 = now();
    }
    if (kern_copy_d2h(s, raw, kern_tensor_ptr(&to), kern_tensor_bytes(&to)) != 0 || kern_stream_sync(s) != 0) {
        printf("%s: FAIL %s\n", what, reel_err_text());
        goto out;
    }
    size_t nonfinite = 0;
    for (size_t i = 0; i < nq; i++) {
        got[i] = dt == KERN_BF16 ? kern_bf16_to_f32(raw[i]) : ((const float *)raw)[i];
        if (!isfinite(got[i])) nonfinite++;
    }
    for (int64_t i = 0; i < o->rows; i++)
        rows[i] = o->rows == 1 ? 0 : (int64_t)((double)i * (double)(o->tokens - 1) / (double)(o->rows - 1) + 0.5);
    double tr = now();
    if (reference(o, q, k, v, rows, ref) != 0) {
        printf("%s: FAIL the reference could not start its threads\n", what);
        goto out;
    }
    tr = now() - tr;
    double num = 0, den = 0, worst = 0, ref_max = 0;
    int64_t worst_row = 0;
    for (int64_t i = 0; i < o->rows; i++)
        for (int64_t d = 0; d < D; d++) {
            double r = ref[i * D + d], g = got[rows[i] * D + d], e = fabs(g - r);
            num += (g - r) * (g - r);
            den += r * r;
            if (!(e <= worst)) {
                worst = e;
                worst_row = rows[i];
            }
            if (fabs(r) > ref_max) ref_max = fabs(r);
        }
    double nmse = den > 0 ? num / den : INFINITY;
    printf("%s: %.3f ms; %lld rows checked (reference %.1f s): nmse %.3g (tol %.0e), max err %.3g = %.3g of "
           "max|ref| %.3g (tol %.3g, row %lld)",
           what, (t1 - t0) * 1e3, (long long)o->rows, tr, nmse, o->nmse, worst,
           ref_max > 0 ? worst / ref_max : INFINITY, ref_max, o->max_rel, (long long)worst_row);
    if (nonfinite)
        printf(": FAIL %zu of %zu outputs are NaN/Inf (unwritten or overflowed)\n", nonfinite, nq);
    else if (!(den > 0))
        printf(": FAIL the reference is all zeros\n");
    else if (!(nmse <= o->nmse))
        printf(": FAIL nmse above tolerance\n");
    else if (!(worst <= o->max_rel * ref_max))
        printf(": FAIL max err above tolerance\n");
    else {
        printf(": OK\n");
        rc = 0;
    }
out:
    if (b) {
        kern_free(b, tq.data);
        kern_free(b, tk.data);
        kern_free(b, tv.data);
        kern_free(b, to.data);
    }
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
    free(q); free(k); free(v); free(got); free(raw); free(rows); free(ref);
    return rc;
}

static int usage(void) {
    fprintf(stderr, "usage: gpu_attn_wan [--backend cuda|cpu] [--dtype bf16|f32] [--tokens N] [--kv N] "
                    "[--heads H] [--head-dim d] [--rows R] [--sigma S] [--seed K] [--nmse T] [--max-rel R]\n");
    return 2;
}

int main(int argc, char **argv) {
    opts_t o = { "cuda", "bf16", 32760, -1, 12, 128, 256, 1.5, 1e-4, 1.0 / 32, 1 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!val) return usage();
        i++;
        if (!strcmp(a, "--backend")) o.backend = val;
        else if (!strcmp(a, "--dtype")) o.dtype = val;
        else if (!strcmp(a, "--tokens")) o.tokens = strtoll(val, &end, 10);
        else if (!strcmp(a, "--kv")) o.kv = strtoll(val, &end, 10);
        else if (!strcmp(a, "--heads")) o.heads = strtoll(val, &end, 10);
        else if (!strcmp(a, "--head-dim")) o.hd = strtoll(val, &end, 10);
        else if (!strcmp(a, "--rows")) o.rows = strtoll(val, &end, 10);
        else if (!strcmp(a, "--seed")) o.seed = strtoull(val, &end, 10);
        else if (!strcmp(a, "--sigma")) o.sigma = strtod(val, &end);
        else if (!strcmp(a, "--nmse")) o.nmse = strtod(val, &end);
        else if (!strcmp(a, "--max-rel")) o.max_rel = strtod(val, &end);
        else return usage();
        if (end && *end) return usage();
    }
    if (o.kv < 0) o.kv = o.tokens;
    if (strcmp(o.dtype, "bf16") && strcmp(o.dtype, "f32")) return usage();
    if (o.tokens < 1 || o.kv < 1 || o.heads < 1 || o.hd < 1 || o.rows < 1 || !(o.sigma > 0) ||
        !(o.nmse > 0) || !(o.max_rel > 0))
        return usage();
    if (o.rows > o.tokens) o.rows = o.tokens;
    return run(&o);
}
