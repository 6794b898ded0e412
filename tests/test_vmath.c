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
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_vmath.h"

/* Distance in units in the last place between a and the float nearest ref. */
static int64_t ulps(float a, double ref) {
    float r = (float)ref;
    int32_t ia, ir;
    memcpy(&ia, &a, 4);
    memcpy(&ir, &r, 4);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ir < 0) ir = INT32_MIN - ir;
    int64_t d = (int64_t)ia - ir;
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
    for (float v = -87.3f; v < 88.72f;) {
        x[n++] = v;
        for (int k = 0; k < 97 && v < 88.72f; k++) v = nextafterf(v, INFINITY);
        if (n == cap || v >= 88.72f) {
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
