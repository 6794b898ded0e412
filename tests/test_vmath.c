/* test_vmath.c -- the CPU backend's vector transcendentals (cpu_vmath.h):
 * their error against double-precision references, their special values,
 * and the two promises the bitwise tests of the step rest on: an element's
 * bits do not depend on where it falls in its array, and they do not
 * depend on the ISA the code was compiled for (this file's inline copies
 * are compiled for baseline x86-64; the library's dispatched ones run
 * AVX-512 or AVX2 where the machine has them).
 *
 * This suite reads kernels/cpu/ directly: it tests the arithmetic, not an op
 * (tests/test_ops_cpu.c covers the ops through the public API). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_arith.h"
#include "kernels/cpu/cpu_attn.h"
#include "kernels/cpu/cpu_vmath.h"

/* The float's place in the order of all floats: the key grows by one from
 * each float to the next one up (-0 and +0 share key 0), and key_float
 * undoes it. */
static int32_t float_key(float f) {
    int32_t i;
    memcpy(&i, &f, 4);
    return i < 0 ? INT32_MIN - i : i;
}

static float key_float(int32_t k) {
    int32_t i = k < 0 ? INT32_MIN - k : k;
    float f;
    memcpy(&f, &i, 4);
    return f;
}

/* Distance in units in the last place between a and the float nearest ref. */
static int64_t ulps(float a, double ref) {
    int64_t d = (int64_t)float_key(a) - float_key((float)ref);
    return d < 0 ? -d : d;
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static float uniform(float lo, float hi) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((rng >> 40) & 0xffffff) / 16777216.0f;
}

static float *fbuf(size_t n) {
    float *p = malloc(n * sizeof *p);
    ck_assert_ptr_nonnull(p);
    return p;
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Every 97th float from e^-87.3 (the smallest normal result) to e^88.72
 * (the largest finite): at most 2 ulp from double exp (the header says 2;
 * 1 was measured over every float). */
START_TEST(test_exp_is_within_two_ulp_of_double_exp_over_the_normal_range) {
    const size_t cap = 1 << 16;
    float *x = fbuf(cap), *y = fbuf(cap);
    int64_t worst = 0;
    float at = 0;
    size_t n = 0, total = 0;
    /* Step through the floats in order by their ordered integer keys (the
     * mapping ulps() uses): 97 keys on is the 97th float up, and costs one
     * add instead of 97 calls of nextafterf. */
    const int32_t hi = float_key(88.72f);
    for (int32_t k = float_key(-87.3f); k < hi;) {
        x[n++] = key_float(k);
        k = (int64_t)hi - k > 97 ? k + 97 : hi;
        if (n == cap || k >= hi) {
            cpu_vec_exp(y, x, (int64_t)n);
            for (size_t i = 0; i < n; i++) {
                int64_t u = ulps(y[i], exp((double)x[i]));
                if (u > worst) worst = u, at = x[i];
            }
            total += n;
            n = 0;
        }
    }
    ck_assert_msg(total > 10000000, "only %zu values tried", total);
    ck_assert_msg(worst <= 2, "exp: %lld ulp at x = %.9g (bound 2)", (long long)worst, at);
    free(x);
    free(y);
}
END_TEST

/* Overflow to +inf, underflow to +0 through the subnormals (rounded once),
 * NaN kept, e^0 = 1 exactly. */
START_TEST(test_exp_special_values) {
    float x[] = { 0.0f, -0.0f, 88.8f, 1000.0f, INFINITY, -104.0f, -1000.0f, -INFINITY, NAN,
                  -100.0f, -90.0f, 88.7f };
    const int n = (int)(sizeof x / sizeof x[0]);
    float y[sizeof x / sizeof x[0]];
    cpu_vec_exp(y, x, n);
    ck_assert_msg(y[0] == 1.0f && y[1] == 1.0f, "e^±0 = %g, %g", y[0], y[1]);
    for (int i = 2; i <= 4; i++) ck_assert_msg(isinf(y[i]) && y[i] > 0, "e^%g = %g, not +inf", x[i], y[i]);
    for (int i = 5; i <= 7; i++) ck_assert_msg(y[i] == 0.0f && !signbit(y[i]), "e^%g = %g, not +0", x[i], y[i]);
    ck_assert_msg(isnan(y[8]), "e^NaN = %g", y[8]);
    /* subnormal results: within one subnormal step of the double result */
    for (int i = 9; i <= 10; i++) {
        double ref = exp((double)x[i]);
        ck_assert_msg(fabs((double)y[i] - ref) <= 1.4013e-45, "e^%g = %g, double %g", x[i], y[i], ref);
        ck_assert_msg(y[i] > 0 && y[i] < 1.18e-38f, "e^%g = %g is not a subnormal", x[i], y[i]);
    }
    ck_assert_msg(isfinite(y[11]) && ulps(y[11], exp((double)x[11])) <= 2, "e^88.7 = %g", y[11]);
}
END_TEST

/* GELU-tanh against the double tanh form: 2e-7·(1 + |ref|) on |u| <= 12
 * (the exponential's 1 ulp, one add and one divide), and the limits. */
START_TEST(test_gelu_tanh_matches_the_double_tanh_form) {
    const int64_t n = 300001;
    float *x = fbuf((size_t)n), *y = fbuf((size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = -12.0f + 24.0f * (float)i / (float)(n - 1);
    cpu_vec_gelu_tanh(y, x, n);
    double worst = 0;
    float at = 0;
    for (int64_t i = 0; i < n; i++) {
        double u = x[i];
        double ref = 0.5 * u * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (u + 0.044715 * u * u * u)));
        double e = fabs((double)y[i] - ref) / (1.0 + fabs(ref));
        if (e > worst) worst = e, at = x[i];
    }
    ck_assert_msg(worst <= 2e-7, "gelu: error %.3g·(1 + |ref|) at u = %g (bound 2e-7)", worst, at);
    float s[] = { 1e6f, -1e6f, INFINITY, NAN, 0.0f };
    float g[5];
    cpu_vec_gelu_tanh(g, s, 5);
    ck_assert_msg(g[0] == 1e6f, "gelu(1e6) = %g", g[0]);
    ck_assert_msg(g[1] == 0.0f, "gelu(-1e6) = %g, not 0", g[1]);
    ck_assert_msg(isinf(g[2]) && g[2] > 0, "gelu(inf) = %g", g[2]);
    ck_assert_msg(isnan(g[3]), "gelu(NaN) = %g", g[3]);
    ck_assert_msg(g[4] == 0.0f, "gelu(0) = %g", g[4]);
    free(x);
    free(y);
}
END_TEST

/* SiLU against double: 2e-7·(1 + |ref|) on |u| <= 30; e^100 overflowing
 * gives -0, not NaN. */
START_TEST(test_silu_matches_double_and_survives_overflow) {
    const int64_t n = 100003;
    float *x = fbuf((size_t)n), *y = fbuf((size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = uniform(-30.0f, 30.0f);
    x[0] = -100.0f;
    x[1] = -1e30f;
    cpu_vec_silu(y, x, n);
    ck_assert_msg(y[0] == 0.0f && y[1] == 0.0f, "silu(-100) = %g, silu(-1e30) = %g", y[0], y[1]);
    for (int64_t i = 2; i < n; i++) {
        double u = x[i], ref = u / (1.0 + exp(-u));
        ck_assert_msg(fabs((double)y[i] - ref) <= 2e-7 * (1.0 + fabs(ref)), "silu(%g) = %.9g, double %.9g",
                      x[i], y[i], ref);
    }
    free(x);
    free(y);
}
END_TEST

/* The same value at every index of arrays of 1..70 elements (a whole
 * vector, a tail, both) comes out with the same bits: a request batched
 * with others (a longer array) gets what it gets alone. */
START_TEST(test_an_elements_bits_do_not_depend_on_its_place_or_the_array_length) {
    float vals[] = { -3.7f, -0.25f, 0.0f, 0.5f, 1.0f, 2.6f, -11.0f, 7.5f };
    float x[70], y[70];
    for (size_t v = 0; v < sizeof vals / sizeof vals[0]; v++) {
        float g1, s1, e1;
        cpu_vec_gelu_tanh(&g1, &vals[v], 1);
        cpu_vec_silu(&s1, &vals[v], 1);
        cpu_vec_exp(&e1, &vals[v], 1);
        for (int64_t n = 1; n <= 70; n++)
            for (int64_t at = 0; at < n; at += 7) {
                for (int64_t i = 0; i < n; i++) x[i] = uniform(-5, 5);
                x[at] = vals[v];
                cpu_vec_gelu_tanh(y, x, n);
                ck_assert_msg(same_bits(y[at], g1), "gelu(%g) at %lld of %lld differs", vals[v], (long long)at,
                              (long long)n);
                cpu_vec_silu(y, x, n);
                ck_assert_msg(same_bits(y[at], s1), "silu(%g) at %lld of %lld differs", vals[v], (long long)at,
                              (long long)n);
                cpu_vec_exp(y, x, n);
                ck_assert_msg(same_bits(y[at], e1), "exp(%g) at %lld of %lld differs", vals[v], (long long)at,
                              (long long)n);
            }
    }
}
END_TEST

/* The library's dispatched build (AVX-512 or AVX2 on this machine) and this
 * file's baseline copies give the same bits: the CPU artifacts, compiled
 * with their own flags, rely on it for byte_equal parity. */
START_TEST(test_the_dispatched_and_the_baseline_builds_give_the_same_bits) {
    const int64_t n = 4099;
    float *x = fbuf((size_t)n), *a = fbuf((size_t)n), *b = fbuf((size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = uniform(-90.0f, 90.0f);
    cpu_vec_exp(a, x, n);
    cpu_exp_n(b, x, n);
    ck_assert_msg(memcmp(a, b, (size_t)n * 4) == 0, "exp differs between builds");
    for (int64_t i = 0; i < n; i++) x[i] = uniform(-8.0f, 8.0f);
    cpu_vec_gelu_tanh(a, x, n);
    cpu_gelu_tanh_n(b, x, n);
    ck_assert_msg(memcmp(a, b, (size_t)n * 4) == 0, "gelu differs between builds");
    for (int64_t i = 0; i < n; i++) ck_assert_msg(same_bits(b[i], cpu_gelu_tanh1(x[i])), "gelu1 differs at %lld",
                                                  (long long)i);
    cpu_vec_silu(a, x, n);
    cpu_silu_n(b, x, n);
    ck_assert_msg(memcmp(a, b, (size_t)n * 4) == 0, "silu differs between builds");
    const int64_t rows = 7, w = 131;
    cpu_vec_softmax_rows(a, w, x, w, rows, w, 0.3f);
    for (int64_t r = 0; r < rows; r++) cpu_softmax_row(b + r * w, x + r * w, w, 0.3f);
    ck_assert_msg(memcmp(a, b, (size_t)(rows * w) * 4) == 0, "softmax differs between builds");
    free(x);
    free(a);
    free(b);
}
END_TEST

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* Each vector kernel compiled for one x86 level (the library's clones are
 * x86-64-v4, -v3 and baseline; this machine runs only one of them there).
 * The baseline is this file's own flags (baseline x86-64, or with -mfma in
 * the sanitizer builds: a function can't inline code built for more than
 * its target). */
#define ISA_ATTR_v1 noinline
#define ISA_ATTR_v3 target("arch=x86-64-v3"), noinline
#define ISA_ATTR_v4 target("arch=x86-64-v4"), noinline
#define ISA_KERNELS(tag)                                                                                         \
    __attribute__((ISA_ATTR_##tag)) static void tag##_exp(float *y, const float *x, int64_t n) {         \
        cpu_exp_n(y, x, n);                                                                                      \
    }                                                                                                            \
    __attribute__((ISA_ATTR_##tag)) static void tag##_gelu(float *y, const float *x, int64_t n) {        \
        cpu_gelu_tanh_n(y, x, n);                                                                                \
    }                                                                                                            \
    __attribute__((ISA_ATTR_##tag)) static void tag##_silu(float *y, const float *x, int64_t n) {        \
        cpu_silu_n(y, x, n);                                                                                     \
    }                                                                                                            \
    __attribute__((ISA_ATTR_##tag)) static void tag##_softmax(float *p, const float *s, int64_t n,       \
                                                                     float scale) {                             \
        cpu_softmax_row(p, s, n, scale);                                                                         \
    }                                                                                                            \
    __attribute__((ISA_ATTR_##tag)) static void tag##_softmax_h(float *p, const float *s, int64_t n,     \
                                                                       float scale) {                           \
        cpu_softmax_row_h(p, s, n, scale);                                                                       \
    }                                                                                                            \
    __attribute__((ISA_ATTR_##tag)) static void tag##_flash(float *s, int64_t rows, int64_t n, float *m, \
                                                                   double *l, float *c) {                       \
        cpu_flash_rows(s, n, rows, n, m, l, c);                                                                  \
    }                                                                                                            \
    __attribute__((ISA_ATTR_##tag)) static void tag##_flash_h(float *s, int64_t rows, int64_t n,         \
                                                                     float *m, double *l, float *c) {           \
        cpu_flash_rows_h(s, n, rows, n, m, l, c);                                                                \
    }                                                                                                            \
    __attribute__((ISA_ATTR_##tag)) static void tag##_attn(const float *q, const float *k,               \
                                                                  const float *v, float *o, int64_t rows,       \
                                                                  int64_t nk, int64_t d, int64_t ld) {          \
        cpu_attn_direct_rows(q, k, v, o, rows, nk, d, ld, 0.37f);                                                \
    }                                                                                                            \
    __attribute__((ISA_ATTR_##tag)) static void tag##_attn_h(const float *q, const float *k,             \
                                                                    const float *v, float *o, int64_t rows,     \
                                                                    int64_t nk, int64_t d, int64_t ld) {        \
        cpu_attn_direct_rows_h(q, k, v, o, rows, nk, d, ld, 0.37f);                                              \
    }                                                                                                            \
    __attribute__((ISA_ATTR_##tag)) static void tag##_transpose(cpu_vf *m) { cpu_vtranspose16(m); }      \
    __attribute__((ISA_ATTR_##tag)) static void tag##_transpose_h(cpu_vf *m) { cpu_vtranspose16_h(m); }  \
    __attribute__((ISA_ATTR_##tag)) static void tag##_stats(const float *x, int64_t n, int64_t D,        \
                                                                   float *mean, float *rstd, float *rrms) {     \
        cpu_layernorm_stats_rows(x, n, D, 1e-6f, mean, rstd);                                                    \
        cpu_rms_scale_rows(x, n, D, 1e-6f, rrms);                                                                \
    }
ISA_KERNELS(v1)
ISA_KERNELS(v3)
ISA_KERNELS(v4)

typedef struct {
    const char *name;
    void (*exp)(float *, const float *, int64_t);
    void (*gelu)(float *, const float *, int64_t);
    void (*silu)(float *, const float *, int64_t);
    void (*softmax)(float *, const float *, int64_t, float);
    void (*softmax_h)(float *, const float *, int64_t, float);
    void (*flash)(float *, int64_t, int64_t, float *, double *, float *);
    void (*flash_h)(float *, int64_t, int64_t, float *, double *, float *);
    void (*attn)(const float *, const float *, const float *, float *, int64_t, int64_t, int64_t, int64_t);
    void (*attn_h)(const float *, const float *, const float *, float *, int64_t, int64_t, int64_t, int64_t);
    void (*transpose)(cpu_vf *);
    void (*transpose_h)(cpu_vf *);
    void (*stats)(const float *, int64_t, int64_t, float *, float *, float *);
} isa_t;

#define ISA(tag) { #tag, tag##_exp, tag##_gelu, tag##_silu, tag##_softmax, tag##_softmax_h, tag##_flash, \
                   tag##_flash_h, tag##_attn, \
                   tag##_attn_h, tag##_transpose, tag##_transpose_h, tag##_stats }

/* Inputs with the edges in: both signs of 0, ±inf, NaN, subnormals, the
 * ends of exp's range and of the clamps. */
static void edge_fill(float *x, int64_t n, float lo, float hi) {
    static const float edge[] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 88.72f, 88.8f,
                                  88.9f, -87.33f, -86.0f, -86.01f, -103.97f, -104.0f, -150.0f, 1e30f, -1e30f };
    for (int64_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
    for (size_t i = 0; i < sizeof edge / sizeof *edge && (int64_t)(7 * i) < n; i++) x[7 * i] = edge[i];
}

static int bits_eq(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* Every x86 level the machine has computes the baseline's bits, kernel by
 * kernel: e^x, GELU, SiLU (with edge values), softmax rows of 1..70, flash
 * rows, the direct attention (rows, keys and widths across its range), the
 * 16 x 16 transpose and the norms' statistics. A level the machine lacks
 * is skipped with a line saying so. */
START_TEST(test_every_x86_level_gives_the_baseline_bits) {
    const isa_t base = ISA(v1), lv[2] = { ISA(v3), ISA(v4) };
    /* the library's own test (cpu_vmath.h, CPU_BY_LEVEL) */
    const int have[2] = { __builtin_cpu_supports("x86-64-v3"), __builtin_cpu_supports("x86-64-v4") };
    enum { N = 4099, MX = CPU_ATTN_DIRECT_MAX, LD = MX + 3, QN = 40 * LD, KN = MX * LD };
    float *x = fbuf(N), *a = fbuf(N), *b = fbuf(N);
    float *q = fbuf(QN), *k = fbuf(KN), *v = fbuf(KN), *oa = fbuf(QN), *ob = fbuf(QN);
    int ran = 0;
    for (int li = 0; li < 2; li++) {
        const isa_t *L = &lv[li];
        if (!have[li]) {
            printf("test_vmath: SKIP %s: this CPU lacks it (the baseline and the other levels still checked)\n",
                   L->name);
            continue;
        }
        ran++;
        edge_fill(x, N, -110.0f, 95.0f);
        base.exp(a, x, N), L->exp(b, x, N);
        ck_assert_msg(bits_eq(a, b, N * 4), "%s: exp differs from the baseline", L->name);
        edge_fill(x, N, -20.0f, 20.0f);
        base.gelu(a, x, N), L->gelu(b, x, N);
        ck_assert_msg(bits_eq(a, b, N * 4), "%s: gelu differs from the baseline", L->name);
        base.silu(a, x, N), L->silu(b, x, N);
        ck_assert_msg(bits_eq(a, b, N * 4), "%s: silu differs from the baseline", L->name);
        for (int64_t n = 1; n <= 70; n++) {
            for (int64_t j = 0; j < n; j++) x[j] = uniform(-60.0f, 60.0f);
            if (n % 9 == 4) x[n / 2] = -INFINITY;
            base.softmax(a, x, n, 0.3f), L->softmax(b, x, n, 0.3f);
            ck_assert_msg(bits_eq(a, b, (size_t)n * 4), "%s: softmax row of %lld differs", L->name, (long long)n);
            L->softmax_h(b, x, n, 0.3f);
            ck_assert_msg(bits_eq(a, b, (size_t)n * 4), "%s: softmax row (half form) of %lld differs", L->name,
                          (long long)n);
            base.softmax_h(b, x, n, 0.3f);
            ck_assert_msg(bits_eq(a, b, (size_t)n * 4), "baseline: softmax row (half form) of %lld differs",
                          (long long)n);
        }
        for (int form = 0; form < 2; form++) {
            for (int64_t n = 1; n <= 300; n += 37) { /* two blocks of 3 rows: m, l, c carried */
                float sa[3 * 300], sb[3 * 300], ma[3], mb[3], ca[3], cb[3];
                double la[3] = { 0 }, lb[3] = { 0 };
                for (int r = 0; r < 3; r++) ma[r] = mb[r] = -INFINITY;
                for (int blk = 0; blk < 2; blk++) {
                    for (int64_t j = 0; j < 3 * n; j++) sa[j] = sb[j] = uniform(-30.0f, 30.0f) + (float)blk * 5.0f;
                    base.flash(sa, 3, n, ma, la, ca);
                    (form ? L->flash_h : L->flash)(sb, 3, n, mb, lb, cb);
                    ck_assert_msg(bits_eq(sa, sb, (size_t)(3 * n) * 4) && bits_eq(ma, mb, sizeof ma) &&
                                      bits_eq(la, lb, sizeof la) && bits_eq(ca, cb, sizeof ca),
                                  "%s: flash rows%s of %lld differ (block %d)", L->name, form ? " (half form)" : "",
                                  (long long)n, blk);
                }
            }
        }
        static const int64_t shapes[][3] = { { 32, 32, 16 }, { 32, 5, 16 }, { 1, 1, 1 },  { 17, 64, 64 },
                                             { 40, 16, 64 }, { 3, 63, 33 }, { 16, 7, 17 }, { 33, 40, 8 } };
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const int64_t rows = shapes[si][0], nk = shapes[si][1], d = shapes[si][2], ld = d + 3;
            for (int64_t i = 0; i < QN; i++) q[i] = uniform(-3.0f, 3.0f);
            for (int64_t i = 0; i < KN; i++) k[i] = uniform(-3.0f, 3.0f), v[i] = uniform(-2.0f, 2.0f);
            memset(oa, 0, QN * 4), memset(ob, 0, QN * 4);
            base.attn(q, k, v, oa, rows, nk, d, ld), L->attn(q, k, v, ob, rows, nk, d, ld);
            ck_assert_msg(bits_eq(oa, ob, QN * 4), "%s: direct attention %lld x %lld x %lld differs", L->name,
                          (long long)rows, (long long)nk, (long long)d);
            memset(ob, 0, QN * 4);
            L->attn_h(q, k, v, ob, rows, nk, d, ld);
            ck_assert_msg(bits_eq(oa, ob, QN * 4), "%s: direct attention (half form) %lld x %lld x %lld differs",
                          L->name, (long long)rows, (long long)nk, (long long)d);
            if (li == 0) { /* the baseline's own half form too */
                memset(ob, 0, QN * 4);
                base.attn_h(q, k, v, ob, rows, nk, d, ld);
                ck_assert_msg(bits_eq(oa, ob, QN * 4), "baseline: half form %lld x %lld x %lld differs",
                              (long long)rows, (long long)nk, (long long)d);
            }
        }
        void (*const tr[4])(cpu_vf *) = { base.transpose, base.transpose_h, L->transpose, L->transpose_h };
        for (int t = 0; t < 4; t++) {
            cpu_vf mt[16];
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++) mt[i][j] = (float)(16 * i + j);
            tr[t](mt);
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++)
                    ck_assert_msg(mt[i][j] == (float)(16 * j + i), "%s: transpose %d [%d][%d] = %g", L->name, t, i,
                                  j, mt[i][j]);
        }
        for (int64_t D = 1; D <= 200; D += 13) {
            float ra[3][CPU_STAT_ROWS], rb[3][CPU_STAT_ROWS];
            for (int64_t i = 0; i < CPU_STAT_ROWS * D; i++) x[i] = uniform(-5.0f, 5.0f) + 40.0f;
            base.stats(x, CPU_STAT_ROWS, D, ra[0], ra[1], ra[2]), L->stats(x, CPU_STAT_ROWS, D, rb[0], rb[1], rb[2]);
            ck_assert_msg(bits_eq(ra, rb, sizeof ra), "%s: norm statistics of width %lld differ", L->name,
                          (long long)D);
        }
    }
    printf("test_vmath: %d of 2 x86 levels checked against the baseline\n", ran);
    free(x), free(a), free(b), free(q), free(k), free(v), free(oa), free(ob);
}
END_TEST
#endif

/* Rows of every width 1..70 (tails of every length): each p within
 * (1e-6 + 6e-8·|x_j − m|) relative of the double softmax (the second term
 * is x_j − m rounded to float before its exponential, as the kernel must), the row sums to 1 within 1e-6, and
 * a row computed in place equals the row computed out of place. */
START_TEST(test_softmax_rows_of_every_width_match_double_and_ignore_padding) {
    float s[70], p[70], q[70];
    double ref[70];
    for (int64_t n = 1; n <= 70; n++) {
        const float scale = n % 3 ? 0.125f : 1.0f;
        for (int64_t j = 0; j < n; j++) s[j] = uniform(-40.0f, 40.0f);
        cpu_vec_softmax_rows(p, n, s, n, 1, n, scale);
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < n; j++) m = fmax(m, (double)(s[j] * scale));
        for (int64_t j = 0; j < n; j++) sum += ref[j] = exp((double)(s[j] * scale) - m);
        double tot = 0.0;
        for (int64_t j = 0; j < n; j++) {
            ref[j] /= sum;
            tot += p[j];
            double tol = (1e-6 + 6e-8 * (m - (double)(s[j] * scale))) * ref[j] + 1e-37;
            ck_assert_msg(fabs(p[j] - ref[j]) <= tol, "n=%lld: p[%lld] = %.9g, double %.9g",
                          (long long)n, (long long)j, p[j], ref[j]);
        }
        ck_assert_msg(fabs(tot - 1.0) <= 1e-6, "n=%lld: sum %.9g", (long long)n, tot);
        memcpy(q, s, (size_t)n * 4);
        cpu_vec_softmax_rows(q, n, q, n, 1, n, scale);
        ck_assert_msg(memcmp(p, q, (size_t)n * 4) == 0, "n=%lld: in place differs", (long long)n);
    }
    /* a row of one -inf and finite values: the -inf weighs 0 */
    float r[3] = { -INFINITY, 1.0f, 1.0f }, o[3];
    cpu_vec_softmax_rows(o, 3, r, 3, 1, 3, 1.0f);
    ck_assert_msg(o[0] == 0.0f && o[1] == 0.5f && o[2] == 0.5f, "softmax(-inf,1,1) = %g %g %g", o[0], o[1], o[2]);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("vmath");
    TCase *tc = tcase_create("vmath");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_exp_is_within_two_ulp_of_double_exp_over_the_normal_range);
    tcase_add_test(tc, test_exp_special_values);
    tcase_add_test(tc, test_gelu_tanh_matches_the_double_tanh_form);
    tcase_add_test(tc, test_silu_matches_double_and_survives_overflow);
    tcase_add_test(tc, test_an_elements_bits_do_not_depend_on_its_place_or_the_array_length);
    tcase_add_test(tc, test_the_dispatched_and_the_baseline_builds_give_the_same_bits);
    tcase_add_test(tc, test_softmax_rows_of_every_width_match_double_and_ignore_padding);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    tcase_add_test(tc, test_every_x86_level_gives_the_baseline_bits);
#endif
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
