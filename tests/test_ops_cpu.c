/* test_ops_cpu.c -- every CPU F32 op against a plain double-precision
 * reference, plus the capture contract of the CPU kernels.
 *
 * Inputs come from a fixed-seed generator, so a failure reproduces. Each
 * test states its tolerance next to the comparison and in the failure
 * message; kernels that compute in double and round once are held to about
 * 1e-6 relative, float kernels to a bound derived from their rounding steps.
 * All calls go through the public API (ops.h, backend.h), never the kernels. */
#include <cblas.h>
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/ops_args.h"
#include "kernels/philox.h"
#include "kernels/registry.h"
#include "tests/support.h"
#include "kernels/cpu/cpu_attn.h"
#include "kernels/cpu/cpu_pool.h"

/* --- fixture: one CPU backend and stream per test; everything allocated
 * through the helpers below is released (and accounted) in teardown. ---- */

#define MAX_OWNED 64

static kern_backend_t *B;
static kern_stream_t *S;
static void *dev_owned[MAX_OWNED];
static int n_dev_owned;
static void *host_owned[MAX_OWNED];
static int n_host_owned;
static uint64_t rng;

static void setup(void) {
    B = kern_backend_cpu_new();
    ck_assert_msg(B != NULL, "cpu backend: %s", reel_err_text());
    S = kern_stream_new(B);
    ck_assert_msg(S != NULL, "cpu stream: %s", reel_err_text());
    n_dev_owned = n_host_owned = 0;
    rng = 0x9e3779b97f4a7c15ull;
}

static void restore_sdpa(void);

static void teardown(void) {
    restore_sdpa();
    for (int i = 0; i < n_dev_owned; i++) kern_free(B, dev_owned[i]);
    for (int i = 0; i < n_host_owned; i++) free(host_owned[i]);
    kern_stream_destroy(&S);
    ck_assert_msg(kern_bytes_in_use(B) == 0, "%zu bytes leaked on the backend",
                  kern_bytes_in_use(B));
    kern_backend_destroy(&B);
}

/* splitmix64: a fixed-seed generator with no global libc state. */
static uint64_t next_u64(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(next_u64() >> 11) / 9007199254740992.0);
}

/* A contiguous F32 tensor, freed in teardown. */
static kern_tensor_t tens(int ndim, const int64_t *shape) {
    kern_tensor_t t = kern_tensor_alloc(B, KERN_F32, ndim, shape);
    ck_assert_msg(t.data != NULL, "alloc: %s", reel_err_text());
    ck_assert_int_lt(n_dev_owned, MAX_OWNED);
    dev_owned[n_dev_owned++] = t.data;
    return t;
}

#define T1(a) tens(1, (int64_t[]){ (a) })
#define T2(a, b) tens(2, (int64_t[]){ (a), (b) })
#define T4(a, b, c, d) tens(4, (int64_t[]){ (a), (b), (c), (d) })

static float *F(const kern_tensor_t *t) { return kern_tensor_ptr(t); }
static int64_t N(const kern_tensor_t *t) { return kern_tensor_numel(t); }

static void fill(kern_tensor_t *t, float lo, float hi) {
    float *p = F(t);
    for (int64_t i = 0; i < N(t); i++) p[i] = uniform(lo, hi);
}

/* Host scratch for references and snapshots, freed in teardown. */
static void *hmalloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_lt(n_host_owned, MAX_OWNED);
    host_owned[n_host_owned++] = p;
    return p;
}

static double *dbuf(int64_t n) { return hmalloc((size_t)n * sizeof(double)); }

static float *snapshot(const kern_tensor_t *t) {
    float *p = hmalloc(kern_tensor_bytes(t));
    memcpy(p, F(t), kern_tensor_bytes(t));
    return p;
}

/* Fails unless |got[i] − ref[i]| <= tol_i for every i, where tol_i is
 * tol[i] when tol is given, else abs_tol + rel_tol·|ref[i]|. Reports the
 * element with the largest err/tol, and the rule, on failure. */
static void expect_close(const char *what, const float *got, const double *ref, int64_t n,
                         double abs_tol, double rel_tol, const double *tol, const char *rule) {
    int64_t worst = -1;
    double worst_ratio = 1.0, worst_err = 0, worst_tol = 0;
    for (int64_t i = 0; i < n; i++) {
        double t = tol ? tol[i] : abs_tol + rel_tol * fabs(ref[i]);
        double err = fabs((double)got[i] - ref[i]);
        if (isnan(err)) err = INFINITY;
        if (err > t && (worst < 0 || err / t > worst_ratio)) {
            worst = i;
            worst_ratio = err / t;
            worst_err = err;
            worst_tol = t;
        }
    }
    ck_assert_msg(worst < 0,
                  "%s: element %lld = %.9g, reference %.12g: |err| %.3g > tol %.3g (%s)",
                  what, (long long)worst, worst < 0 ? 0.0 : (double)got[worst],
                  worst < 0 ? 0.0 : ref[worst], worst_err, worst_tol, rule);
}

/* --- gemm ------------------------------------------------------------- */

/* y = x·wᵀ (+ b) in double; tol_ij = 1e-5·(Σ_k |x_ik·w_jk| + |b_j|), the
 * worst-case float accumulation bound K·2⁻²⁴·Σ|terms| for K <= 160. */
static void gemm_check(int with_bias) {
    const int64_t M = 37, Nn = 29, K = 53;
    kern_tensor_t x = T2(M, K), w = T2(Nn, K), b = T1(Nn), y = T2(M, Nn);
    fill(&x, -1, 1);
    fill(&w, -1, 1);
    fill(&b, -1, 1);
    ck_assert_msg(kern_gemm(S, &x, &w, with_bias ? &b : NULL, &y) == 0, "gemm: %s", reel_err_text());
    double *ref = dbuf(M * Nn), *tol = dbuf(M * Nn);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < Nn; j++) {
            double s = with_bias ? F(&b)[j] : 0.0, mag = fabs(s);
            for (int64_t k = 0; k < K; k++) {
                double p = (double)F(&x)[i * K + k] * (double)F(&w)[j * K + k];
                s += p;
                mag += fabs(p);
            }
            ref[i * Nn + j] = s;
            tol[i * Nn + j] = 1e-5 * mag;
        }
    expect_close(with_bias ? "gemm with bias" : "gemm without bias", F(&y), ref, M * Nn, 0, 0,
                 tol, "1e-5 * (sum_k |x*w| + |b|)");
}

START_TEST(test_gemm_with_bias_matches_double_reference) { gemm_check(1); }
END_TEST

START_TEST(test_gemm_without_bias_matches_double_reference) { gemm_check(0); }
END_TEST

START_TEST(test_gemm_rejects_mismatched_k_with_a_message_naming_the_op) {
    kern_tensor_t x = T2(4, 5), w = T2(3, 6), y = T2(4, 3);
    fill(&x, -1, 1);
    fill(&w, -1, 1);
    for (int64_t i = 0; i < N(&y); i++) F(&y)[i] = 42.0f;
    reel_err_clear();
    ck_assert_int_eq(kern_gemm(S, &x, &w, NULL, &y), -1);
    ck_assert_msg(strstr(reel_err_text(), "gemm") != NULL, "message lacks the op name: '%s'",
                  reel_err_text());
    ck_assert_msg(strstr(reel_err_text(), "w") != NULL, "message lacks the tensor: '%s'", reel_err_text());
    for (int64_t i = 0; i < N(&y); i++) ck_assert_float_eq(F(&y)[i], 42.0f);
}
END_TEST

START_TEST(test_attention_rejects_width_not_divisible_by_heads_naming_the_op) {
    kern_tensor_t q = T2(4, 10), k = T2(3, 10), v = T2(3, 10), o = T2(4, 10);
    fill(&q, -1, 1);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    reel_err_clear();
    ck_assert_int_eq(kern_attention(S, &q, &k, &v, 3, &o), -1);
    ck_assert_msg(strstr(reel_err_text(), "attention") != NULL, "message lacks the op name: '%s'",
                  reel_err_text());
}
END_TEST

/* --- norms ------------------------------------------------------------ */

/* Reference LayerNorm (two-pass, double). */
static void layernorm_ref(const float *x, const float *w, const float *b, int64_t rows,
                          int64_t D, double eps, double *ref) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < D; i++) mean += xr[i];
        mean /= (double)D;
        for (int64_t i = 0; i < D; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        var /= (double)D;
        for (int64_t i = 0; i < D; i++) {
            double v = ((double)xr[i] - mean) / sqrt(var + eps);
            if (w) v = v * w[i] + (b ? b[i] : 0.0);
            ref[r * D + i] = v;
        }
    }
}

/* Inputs sit on an offset of 3 so a one-pass variance would lose digits.
 * Tolerance 1e-6·(1 + |ref|): the kernel's statistics and outputs are in
 * float (cpu_arith.h), a few roundings of values near 1. */
static void layernorm_check(int affine) {
    const int64_t rows = 13, D = 67;
    const float eps = 1e-6f;
    kern_tensor_t x = T2(rows, D), w = T1(D), b = T1(D), y = T2(rows, D);
    fill(&x, 2, 4);
    fill(&w, -1, 1);
    fill(&b, -1, 1);
    ck_assert_msg(kern_layernorm(S, &x, affine ? &w : NULL, affine ? &b : NULL, eps, &y) == 0,
                  "layernorm: %s", reel_err_text());
    double *ref = dbuf(rows * D);
    layernorm_ref(F(&x), affine ? F(&w) : NULL, affine ? F(&b) : NULL, rows, D, eps, ref);
    expect_close(affine ? "layernorm affine" : "layernorm plain", F(&y), ref, rows * D, 1e-6,
                 1e-6, NULL, "1e-6 * (1 + |ref|)");
}

START_TEST(test_layernorm_affine_matches_double_reference) { layernorm_check(1); }
END_TEST

START_TEST(test_layernorm_plain_matches_double_reference) { layernorm_check(0); }
END_TEST

START_TEST(test_layernorm_in_place_gives_the_same_bits_as_out_of_place) {
    const int64_t rows = 7, D = 40;
    kern_tensor_t x = T2(rows, D), w = T1(D), b = T1(D), y = T2(rows, D);
    fill(&x, -2, 2);
    fill(&w, -1, 1);
    fill(&b, -1, 1);
    ck_assert_int_eq(kern_layernorm(S, &x, &w, &b, 1e-6f, &y), 0);
    ck_assert_msg(kern_layernorm(S, &x, &w, &b, 1e-6f, &x) == 0, "in place: %s", reel_err_text());
    ck_assert_msg(memcmp(F(&x), F(&y), kern_tensor_bytes(&x)) == 0,
                  "layernorm with y == x differs from y != x");
}
END_TEST

/* The row kernels take the statistics of 16 rows before writing their
 * outputs (CPU_STAT_ROWS): 37 rows, each on its own offset and scale so a
 * row given another's statistics is far off, against the reference, with
 * and without a bias, out of place and in place (the same bits). A
 * constant row normalises to 0, and with negative weights and no bias
 * v·w is −0: the kernel adds 0 as its one expression does, so the
 * output is +0. */
START_TEST(test_layernorm_rows_across_statistics_chunks_match_reference) {
    const int64_t rows = 37, D = 24;
    const float eps = 1e-6f;
    kern_tensor_t x = T2(rows, D), w = T1(D), b = T1(D), y = T2(rows, D), xi = T2(rows, D);
    fill(&x, -2, 2);
    fill(&w, 0.1f, 1);
    fill(&b, -1, 1);
    for (int64_t i = 0; i < D; i++) F(&w)[i] = -F(&w)[i];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < D; i++) F(&x)[r * D + i] = F(&x)[r * D + i] * (1.0f + 0.25f * (float)r) + (float)r;
    for (int64_t i = 0; i < D; i++) F(&x)[20 * D + i] = 1.5f; /* row 20: constant */
    double *ref = dbuf(rows * D);
    for (int bias = 0; bias < 2; bias++) {
        const kern_tensor_t *bp = bias ? &b : NULL;
        ck_assert_msg(kern_layernorm(S, &x, &w, bp, eps, &y) == 0, "layernorm: %s", reel_err_text());
        layernorm_ref(F(&x), F(&w), bias ? F(&b) : NULL, rows, D, eps, ref);
        expect_close(bias ? "layernorm 37 rows, bias" : "layernorm 37 rows, no bias", F(&y), ref, rows * D, 1e-6,
                     1e-6, NULL, "1e-6 * (1 + |ref|)");
        memcpy(F(&xi), F(&x), kern_tensor_bytes(&x));
        ck_assert_msg(kern_layernorm(S, &xi, &w, bp, eps, &xi) == 0, "in place: %s", reel_err_text());
        ck_assert_msg(memcmp(F(&xi), F(&y), kern_tensor_bytes(&y)) == 0, "37 rows in place differ (bias %d)", bias);
        if (!bias)
            for (int64_t i = 0; i < D; i++)
                ck_assert_msg(F(&y)[20 * D + i] == 0.0f && !signbit(F(&y)[20 * D + i]),
                              "constant row, column %lld: %g, not +0", (long long)i, (double)F(&y)[20 * D + i]);
    }
}
END_TEST

/* Tolerance 1e-6·(1 + |ref|): float sums of 48 squares near 1, then two
 * roundings. */
START_TEST(test_rmsnorm_matches_double_reference) {
    const int64_t rows = 9, D = 48;
    const float eps = 1e-6f;
    kern_tensor_t x = T2(rows, D), w = T1(D), y = T2(rows, D);
    fill(&x, -2, 2);
    fill(&w, -1, 1);
    ck_assert_msg(kern_rmsnorm(S, &x, &w, eps, &y) == 0, "rmsnorm: %s", reel_err_text());
    double *ref = dbuf(rows * D);
    for (int64_t r = 0; r < rows; r++) {
        double ms = 0;
        for (int64_t i = 0; i < D; i++) ms += (double)F(&x)[r * D + i] * F(&x)[r * D + i];
        ms /= (double)D;
        for (int64_t i = 0; i < D; i++)
            ref[r * D + i] = F(&x)[r * D + i] / sqrt(ms + eps) * F(&w)[i];
    }
    expect_close("rmsnorm", F(&y), ref, rows * D, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
}
END_TEST

/* The largest error of got against ref, for the message. */
static double max_abs_err(const float *got, const double *ref, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)got[i] - ref[i]));
    return m;
}

/* Wan-width rows (dim 1536 and 5120, the 1.3B and 14B models) with the
 * statistics in float: LayerNorm (affine, with bias) and RMSNorm against
 * the double reference. Row r sits on an offset of r/2 with a spread of
 * 1 + r/4, so no two rows share statistics. Tolerance 4e-6·(1 + |ref|):
 * the float sums of 1536 or 5120 terms (4 accumulators of 16 lanes) put
 * the mean off by a few of its ulps (measured: 2e-7 to 5e-7, printed); a
 * sum that dropped or doubled one vector of 16 would move every output of
 * its row by about 1e-2. */
START_TEST(test_norms_of_wan_width_rows_in_float_match_double_reference) {
    static const int64_t dims[] = { 1536, 5120 };
    const int64_t rows = 17;
    const float eps = 1e-6f;
    for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
        const int64_t D = dims[k];
        kern_tensor_t x = T2(rows, D), w = T1(D), b = T1(D), y = T2(rows, D);
        fill(&x, -1, 1);
        fill(&w, -1, 1);
        fill(&b, -1, 1);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < D; i++)
                F(&x)[r * D + i] = F(&x)[r * D + i] * (1.0f + 0.25f * (float)r) + 0.5f * (float)r;
        double *ref = dbuf(rows * D);
        ck_assert_msg(kern_layernorm(S, &x, &w, &b, eps, &y) == 0, "layernorm: %s", reel_err_text());
        layernorm_ref(F(&x), F(&w), F(&b), rows, D, eps, ref);
        printf("  layernorm, %lld rows of %lld in float: max |err| %.3g\n", (long long)rows, (long long)D,
               max_abs_err(F(&y), ref, rows * D));
        expect_close("layernorm, Wan width", F(&y), ref, rows * D, 4e-6, 4e-6, NULL, "4e-6 * (1 + |ref|)");
        ck_assert_msg(kern_rmsnorm(S, &x, &w, eps, &y) == 0, "rmsnorm: %s", reel_err_text());
        for (int64_t r = 0; r < rows; r++) {
            double ms = 0;
            for (int64_t i = 0; i < D; i++) ms += (double)F(&x)[r * D + i] * F(&x)[r * D + i];
            ms /= (double)D;
            for (int64_t i = 0; i < D; i++) ref[r * D + i] = F(&x)[r * D + i] / sqrt(ms + eps) * F(&w)[i];
        }
        printf("  rmsnorm, %lld rows of %lld in float: max |err| %.3g\n", (long long)rows, (long long)D,
               max_abs_err(F(&y), ref, rows * D));
        expect_close("rmsnorm, Wan width", F(&y), ref, rows * D, 4e-6, 4e-6, NULL, "4e-6 * (1 + |ref|)");
    }
}
END_TEST

/* --- elementwise ------------------------------------------------------ */

/* Float kernel, three roundings of values <= 3 in size: 1e-6·(1 + |ref|). */
START_TEST(test_modulate_matches_double_reference) {
    const int64_t rows = 10, D = 33;
    kern_tensor_t x = T2(rows, D), sh = T1(D), sc = T1(D), y = T2(rows, D);
    fill(&x, -1, 1);
    fill(&sh, -1, 1);
    fill(&sc, -1, 1);
    ck_assert_msg(kern_modulate(S, &x, &sh, &sc, &y) == 0, "modulate: %s", reel_err_text());
    double *ref = dbuf(rows * D);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < D; i++)
            ref[r * D + i] = (double)F(&x)[r * D + i] * (1.0 + F(&sc)[i]) + F(&sh)[i];
    expect_close("modulate", F(&y), ref, rows * D, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
}
END_TEST

/* x += gate·y (or x += y): two float roundings, 1e-6·(1 + |ref|). */
static void residual_check(int gated) {
    const int64_t rows = 6, D = 21;
    kern_tensor_t x = T2(rows, D), y = T2(rows, D), g = T1(D);
    fill(&x, -1, 1);
    fill(&y, -1, 1);
    fill(&g, -1, 1);
    float *x0 = snapshot(&x);
    ck_assert_msg(kern_gated_residual(S, &x, &y, gated ? &g : NULL) == 0, "gated_residual: %s",
                  reel_err_text());
    double *ref = dbuf(rows * D);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < D; i++)
            ref[r * D + i] = (double)x0[r * D + i] + (gated ? (double)F(&g)[i] : 1.0) * F(&y)[r * D + i];
    expect_close(gated ? "gated residual" : "residual without gate", F(&x), ref, rows * D, 1e-6,
                 1e-6, NULL, "1e-6 * (1 + |ref|)");
}

START_TEST(test_gated_residual_with_gate_matches_double_reference) { residual_check(1); }
END_TEST

START_TEST(test_gated_residual_without_gate_adds_y) { residual_check(0); }
END_TEST

/* One float rounding: 1e-6·(1 + |ref|). */
START_TEST(test_add_matches_double_reference) {
    kern_tensor_t a = T1(1001), b = T1(1001), y = T1(1001);
    fill(&a, -5, 5);
    fill(&b, -5, 5);
    ck_assert_msg(kern_add(S, &a, &b, &y) == 0, "add: %s", reel_err_text());
    double *ref = dbuf(1001);
    for (int64_t i = 0; i < 1001; i++) ref[i] = (double)F(&a)[i] + F(&b)[i];
    expect_close("add", F(&y), ref, 1001, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
}
END_TEST

/* tanhf and a few float roundings on |u| <= 6: 1e-6·(1 + |ref|). */
START_TEST(test_gelu_tanh_matches_double_reference) {
    const int64_t n = 2001;
    kern_tensor_t x = T1(n), y = T1(n);
    fill(&x, -6, 6);
    F(&x)[0] = 0.0f;
    ck_assert_msg(kern_gelu_tanh(S, &x, &y) == 0, "gelu: %s", reel_err_text());
    double *ref = dbuf(n);
    for (int64_t i = 0; i < n; i++) {
        double u = F(&x)[i];
        ref[i] = 0.5 * u * (1.0 + tanh(sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
    }
    expect_close("gelu_tanh", F(&y), ref, n, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
}
END_TEST

/* expf and two float roundings on |u| <= 20: 1e-6·(1 + |ref|). */
START_TEST(test_silu_matches_double_reference) {
    const int64_t n = 2001;
    kern_tensor_t x = T1(n), y = T1(n);
    fill(&x, -20, 20);
    F(&x)[0] = -100.0f; /* e^100 overflows float: the result must still be ~0, not NaN */
    ck_assert_msg(kern_silu(S, &x, &y) == 0, "silu: %s", reel_err_text());
    double *ref = dbuf(n);
    for (int64_t i = 0; i < n; i++) ref[i] = F(&x)[i] / (1.0 + exp(-(double)F(&x)[i]));
    expect_close("silu", F(&y), ref, n, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
}
END_TEST

/* --- attention -------------------------------------------------------- */

/* softmax(q·kᵀ/√d)·v per head, all in double. */
static void attention_ref(const float *q, const float *k, const float *v, int64_t nq,
                          int64_t nk, int64_t H, int64_t d, double *o) {
    int64_t ld = H * d;
    double *p = malloc((size_t)nk * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < nq; i++) {
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < nk; j++) {
                double s = 0;
                for (int64_t c = 0; c < d; c++)
                    s += (double)q[i * ld + h * d + c] * k[j * ld + h * d + c];
                p[j] = s / sqrt((double)d);
                if (p[j] > m) m = p[j];
            }
            for (int64_t j = 0; j < nk; j++) sum += (p[j] = exp(p[j] - m));
            for (int64_t c = 0; c < d; c++) {
                double acc = 0;
                for (int64_t j = 0; j < nk; j++) acc += p[j] / sum * v[j * ld + h * d + c];
                o[i * ld + h * d + c] = acc;
            }
        }
    free(p);
}

/* kern_attention (AUTO) on q in [-qmax, qmax], k and v in [-1, 1] against
 * attention_ref, 1e-5 absolute (outputs are convex combinations of v);
 * the call's scratch at most max_scratch bytes (0: unchecked). what names
 * the case in a failure. */
static void attention_vs_ref(const char *what, int64_t nq, int64_t nk, int64_t H, int64_t d, float qmax,
                             size_t max_scratch) {
    kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d), o = T2(nq, H * d);
    fill(&q, -qmax, qmax);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    char name[160];
    snprintf(name, sizeof name, "%s nq=%lld nk=%lld H=%lld d=%lld", what, (long long)nq, (long long)nk,
             (long long)H, (long long)d);
    ck_assert_msg(kern_attention(S, &q, &k, &v, H, &o) == 0, "%s: %s", name, reel_err_text());
    if (max_scratch)
        ck_assert_msg(kern_stream_scratch_size(S) <= max_scratch, "%s: %zu bytes of scratch", name,
                      kern_stream_scratch_size(S));
    double *ref = dbuf(nq * H * d);
    attention_ref(F(&q), F(&k), F(&v), nq, nk, H, d, ref);
    expect_close(name, F(&o), ref, nq * H * d, 1e-5, 0, NULL, "1e-5 absolute");
}

/* q spans [-3, 3] so the softmax is peaked. */
START_TEST(test_attention_matches_double_reference) { attention_vs_ref("attention", 11, 7, 3, 8, 3, 0); }
END_TEST

/* 1100 queries over 4096 keys need more score rows than either path keeps
 * in scratch at once (16 MiB), so the queries run in blocks; the result
 * must not show the seam. AUTO takes the CPU kernel here (4.5M scores per
 * head: flash-style); the decomposition is asked for by name for the
 * second run. Tolerance 1e-5 absolute, as above. */
START_TEST(test_attention_over_long_sequence_matches_reference_with_bounded_scratch) {
    const int64_t nq = 1100, nk = 4096, H = 2, d = 4;
    kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d), o = T2(nq, H * d);
    fill(&q, -2, 2);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    double *ref = dbuf(nq * H * d);
    attention_ref(F(&q), F(&k), F(&v), nq, nk, H, d, ref);
    ck_assert_int_eq(kern_attention_pick(nq, nk, d), KERN_ATTN_DECOMPOSED);
    for (int dec = 0; dec < 2; dec++) {
        kern_attn_opts_t opts = { dec ? KERN_ATTN_DECOMPOSED : KERN_ATTN_AUTO, 0, false };
        memset(F(&o), 0, kern_tensor_bytes(&o));
        ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o, &opts) == 0, "attention: %s",
                      reel_err_text());
        ck_assert_msg(kern_stream_scratch_size(S) <= ((size_t)16 << 20),
                      "attention used %zu bytes of scratch, more than 16 MiB",
                      kern_stream_scratch_size(S));
        expect_close(dec ? "long attention (decomposed)" : "long attention (the CPU kernel)", F(&o), ref,
                     nq * H * d, 1e-5, 0, NULL, "1e-5 absolute");
    }
}
END_TEST

/* --- decomposed attention (kernels/attention.c) ----------------------- */

/* Device scratch that is not a tensor, freed in teardown. */
static void *dev_bytes(size_t bytes) {
    void *p = kern_alloc(B, bytes);
    ck_assert_msg(p != NULL, "alloc %zu: %s", bytes, reel_err_text());
    ck_assert_int_lt(n_dev_owned, MAX_OWNED);
    dev_owned[n_dev_owned++] = p;
    return p;
}

/* The bound that gives exactly `rows` query rows per block of all heads. */
static size_t bound_for_rows(int64_t nk, int64_t H, int64_t rows) {
    return (size_t)(((nk + 7) & ~7) * 4 * H * rows);
}

static kern_attn_plan_t plan_of(int64_t nq, int64_t nk, int64_t H, int64_t d,
                                const kern_attn_opts_t *o) {
    kern_attn_plan_t p;
    ck_assert_msg(kern_attention_plan(KERN_BACKEND_CPU, KERN_F32, nq, nk, H, d, o, &p) == 0,
                  "plan: %s", reel_err_text());
    return p;
}

/* Runs the decomposition forced at the given bound and checks it against
 * the double reference. Outputs are convex combinations of v in [-1, 1],
 * so 1e-5 absolute is a relative bound on the output range; F32 rounding
 * of the logits (d <= 128 terms) and of the P·V sums (nk <= 4096 terms)
 * stays near 1e-6 here, as the fused kernel's test shows. */
static void decomposed_case(int64_t nq, int64_t nk, int64_t H, int64_t d, size_t bound,
                            int64_t want_rows, int64_t want_heads) {
    kern_attn_opts_t opts = { KERN_ATTN_DECOMPOSED, bound, false };
    kern_attn_plan_t p = plan_of(nq, nk, H, d, &opts);
    ck_assert_int_eq(p.path, KERN_ATTN_DECOMPOSED);
    ck_assert_msg(p.rows == want_rows && p.heads == want_heads,
                  "nq=%lld nk=%lld H=%lld: plan of %lld rows x %lld heads, expected %lld x %lld",
                  (long long)nq, (long long)nk, (long long)H, (long long)p.rows,
                  (long long)p.heads, (long long)want_rows, (long long)want_heads);
    kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d), o = T2(nq, H * d);
    fill(&q, -2, 2);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o, &opts) == 0, "attention: %s",
                  reel_err_text());
    ck_assert_msg(p.scratch_bytes <= (bound ? bound : KERN_ATTN_BLOCK_BYTES_CPU),
                  "decomposition plans %zu bytes of scratch over a bound of %zu",
                  p.scratch_bytes, bound);
    double *ref = dbuf(nq * H * d);
    attention_ref(F(&q), F(&k), F(&v), nq, nk, H, d, ref);
    char what[128];
    snprintf(what, sizeof what, "decomposed attention nq=%lld nk=%lld H=%lld d=%lld",
             (long long)nq, (long long)nk, (long long)H, (long long)d);
    expect_close(what, F(&o), ref, nq * H * d, 1e-5, 0, NULL, "1e-5 absolute");
}

/* Query counts that the block does not divide (37 = 7·5 + 2, 70 = 2·32 + 6),
 * keys not a multiple of the 8-float row padding (53, 257), heads split in
 * ragged groups when one row of every head exceeds the bound (5 heads as
 * 2 + 2 + 1), head widths 1, 2, 16 and 128, and a long sequence (4096 keys). */
START_TEST(test_decomposed_attention_matches_double_reference_on_ragged_blocks) {
    decomposed_case(37, 53, 3, 16, bound_for_rows(53, 3, 5), 5, 3);
    decomposed_case(70, 4096, 2, 128, bound_for_rows(4096, 2, 32), 32, 2);
    decomposed_case(100, 257, 3, 128, bound_for_rows(257, 3, 7), 7, 3);
    decomposed_case(29, 300, 5, 2, (size_t)304 * 4 * 2 + 100, 1, 2);
    decomposed_case(9, 40, 4, 1, bound_for_rows(40, 4, 4), 4, 4);
    decomposed_case(33, 4096, 1, 16, 0, 33, 1); /* default bound: one block */
}
END_TEST

/* One key: every weight is e^0/1 = 1 exactly, so o is v's row, bit for
 * bit, in every block. */
START_TEST(test_decomposed_attention_with_a_single_key_returns_v_exactly) {
    const int64_t nq = 13, H = 3, d = 8;
    kern_attn_opts_t opts = { KERN_ATTN_DECOMPOSED, bound_for_rows(1, H, 4), false };
    ck_assert_int_eq(plan_of(nq, 1, H, d, &opts).rows, 4);
    kern_tensor_t q = T2(nq, H * d), k = T2(1, H * d), v = T2(1, H * d), o = T2(nq, H * d);
    fill(&q, -3, 3);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o, &opts) == 0, "attention: %s",
                  reel_err_text());
    for (int64_t i = 0; i < nq; i++)
        ck_assert_msg(memcmp(F(&o) + i * H * d, F(&v), (size_t)(H * d) * sizeof(float)) == 0,
                      "row %lld of o is not v's only row", (long long)i);
}
END_TEST

/* Both CPU paths are sgemm + softmax + sgemm over the same values; they
 * differ only in where the scale is applied and in the blocking, so they
 * agree to NMSE <= 1e-12 (both are ~1e-7 from the exact result). */
START_TEST(test_decomposed_attention_agrees_with_the_fused_cpu_kernel) {
    static const int64_t cases[][4] = { { 200, 4096, 3, 128 }, { 61, 77, 4, 64 }, { 5, 1000, 2, 16 } };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t nq = cases[c][0], nk = cases[c][1], H = cases[c][2], d = cases[c][3];
        kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d);
        kern_tensor_t o1 = T2(nq, H * d), o2 = T2(nq, H * d);
        fill(&q, -2, 2);
        fill(&k, -1, 1);
        fill(&v, -1, 1);
        kern_attn_opts_t fused = { KERN_ATTN_FUSED, 0, false };
        kern_attn_opts_t dec = { KERN_ATTN_DECOMPOSED, bound_for_rows(nk, H, 16), false };
        ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o1, &fused) == 0, "fused: %s",
                      reel_err_text());
        ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o2, &dec) == 0, "decomposed: %s",
                      reel_err_text());
        double num = 0, den = 0;
        for (int64_t i = 0; i < N(&o1); i++) {
            double e = (double)F(&o2)[i] - F(&o1)[i];
            num += e * e;
            den += (double)F(&o1)[i] * F(&o1)[i];
        }
        ck_assert_msg(num <= 1e-12 * den, "case %zu: NMSE %.3g between the paths > 1e-12", c,
                      num / den);
    }
}
END_TEST

/* The rule (ops.h): decomposed from 2^20 scores per head or past a head
 * width of 256, fused below. The shapes the tests and demos run (at most a
 * few thousand tokens per side of tiny/small models) stay fused. */
START_TEST(test_attention_pick_rule_routes_by_scores_per_head_and_head_width) {
    ck_assert_int_eq(kern_attention_pick(1023, 1024, 64), KERN_ATTN_FUSED);
    ck_assert_int_eq(kern_attention_pick(1024, 1024, 64), KERN_ATTN_DECOMPOSED);
    ck_assert_int_eq(kern_attention_pick(1, (int64_t)1 << 20, 16), KERN_ATTN_DECOMPOSED);
    ck_assert_int_eq(kern_attention_pick((int64_t)1 << 20, 1, 16), KERN_ATTN_DECOMPOSED);
    ck_assert_int_eq(kern_attention_pick(1025, 1023, 128), KERN_ATTN_FUSED); /* 2^20 − 1 */
    ck_assert_int_eq(kern_attention_pick(1023, 1025, 128), KERN_ATTN_FUSED);
    ck_assert_int_eq(kern_attention_pick(1000, 1048, 128), KERN_ATTN_FUSED); /* 1,048,000 */
    ck_assert_int_eq(kern_attention_pick(1000, 1049, 128), KERN_ATTN_DECOMPOSED);
    ck_assert_int_eq(kern_attention_pick(1049, 1000, 128), KERN_ATTN_DECOMPOSED);
    ck_assert_int_eq(kern_attention_pick(4, 4, 256), KERN_ATTN_FUSED);
    ck_assert_int_eq(kern_attention_pick(4, 4, 257), KERN_ATTN_DECOMPOSED);
    ck_assert_int_eq(kern_attention_pick(0, 5, 8), KERN_ATTN_FUSED);
    ck_assert_int_eq(kern_attention_pick(256, 256, 16), KERN_ATTN_FUSED);      /* demo self */
    ck_assert_int_eq(kern_attention_pick(32760, 32760, 128), KERN_ATTN_DECOMPOSED); /* Wan self */
    ck_assert_int_eq(kern_attention_pick(32760, 512, 128), KERN_ATTN_DECOMPOSED);   /* Wan cross */
    /* the rule is CUDA's: on the CPU AUTO takes the CPU kernel at every size */
    kern_attn_plan_t p = plan_of(100, 100, 2, 8, NULL);
    ck_assert_int_eq(p.path, KERN_ATTN_FUSED);
    p = plan_of(1024, 1024, 2, 8, NULL);
    ck_assert_int_eq(p.path, KERN_ATTN_FUSED);
}
END_TEST

/* On the CPU, AUTO is one launch of the CPU kernel on either side of 2^20
 * scores per head (whole rows below, flash from there on); the
 * decomposition, asked for by name, is three launches per block of its
 * plan. */
START_TEST(test_attention_runs_the_path_its_rule_picks) {
    const int64_t H = 2, d = 4;
    const int64_t shapes[3][2] = { { 1023, 1024 }, { 1024, 1024 }, { 1024, 1024 } };
    for (int c = 0; c < 3; c++) {
        int64_t nq = shapes[c][0], nk = shapes[c][1];
        kern_attn_opts_t opts = { c == 2 ? KERN_ATTN_DECOMPOSED : KERN_ATTN_AUTO, 0, false };
        kern_attn_plan_t p = plan_of(nq, nk, H, d, &opts);
        kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d), o = T2(nq, H * d);
        fill(&q, -1, 1);
        fill(&k, -1, 1);
        fill(&v, -1, 1);
        ck_assert_int_eq(kern_stream_reserve(S, p.scratch_bytes), 0);
        ck_assert_int_eq(kern_capture_begin(S), 0);
        ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o, &opts) == 0, "attention: %s", reel_err_text());
        kern_graph_t *g = NULL;
        ck_assert_int_eq(kern_capture_end(S, &g), 0);
        size_t want = p.path == KERN_ATTN_FUSED ? 1 : (size_t)(3 * p.blocks);
        ck_assert_msg(kern_graph_nodes(g) == want, "nq=%lld nk=%lld: %zu launches, expected %zu",
                      (long long)nq, (long long)nk, kern_graph_nodes(g), want);
        ck_assert_int_eq(p.path, c == 2 ? KERN_ATTN_DECOMPOSED : KERN_ATTN_FUSED);
        kern_graph_destroy(&g);
    }
}
END_TEST

/* --- direct CPU attention (kernels/cpu/cpu_attn.h) ----------------------- */

/* Up to 64 keys and head width the CPU kernel runs without BLAS: against
 * the double reference at the edges (64 keys of 64, one key, one column,
 * widths and key counts that are not whole vectors, query counts that
 * leave 1, 2 or 3 rows of the last group of four), and on either side of
 * the edge (65 keys, a head of 65: the BLAS ways). 1e-5 absolute. */
START_TEST(test_direct_attention_matches_double_reference_at_its_edges) {
    static const int64_t cases[][4] = { { 37, 64, 2, 64 }, { 9, 1, 3, 16 }, { 6, 17, 2, 1 }, { 7, 5, 4, 24 },
                                        { 33, 31, 3, 48 }, { 300, 16, 6, 64 }, { 12, 65, 2, 16 }, { 12, 20, 1, 65 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t nk = cases[i][1], d = cases[i][3];
        attention_vs_ref(nk <= 64 && d <= 64 ? "direct attention" : "BLAS attention", cases[i][0], nk, cases[i][2],
                         d, 2, 0);
    }
}
END_TEST

/* A query row's result is a function of that row alone: the same query
 * placed at every position of a block of four (and alone) gives the same
 * bytes. */
START_TEST(test_direct_attention_gives_a_row_the_same_bits_wherever_it_sits) {
    const int64_t nk = 29, H = 2, d = 40, nq = 9;
    kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d), o = T2(nq, H * d);
    kern_tensor_t q1 = T2(1, H * d), o1 = T2(1, H * d);
    fill(&q, -2, 2);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    fill(&q1, -2, 2);
    ck_assert_int_eq(kern_attention(S, &q1, &k, &v, H, &o1), 0);
    for (int64_t at = 0; at < nq; at++) {
        memcpy(F(&q) + at * H * d, F(&q1), (size_t)(H * d) * sizeof(float));
        ck_assert_int_eq(kern_attention(S, &q, &k, &v, H, &o), 0);
        ck_assert_msg(memcmp(F(&o) + at * H * d, F(&o1), (size_t)(H * d) * sizeof(float)) == 0,
                      "the row at %lld differs from the same query alone", (long long)at);
        fill(&q, -2, 2);
    }
}
END_TEST

/* The row-major direct kernel as it was before the 16-row (lane = row)
 * one (Reel at 8d6d35e): one row's softmax at a time. Kept here as the
 * reference the new kernel must match bit for bit. */
static void old_direct_rows(const float *q, const float *k, const float *v, float *o, int64_t rows,
                                      int64_t nk, int64_t d, int64_t ld, float scale) {
    enum { MX = CPU_ATTN_DIRECT_MAX, R = 4 }; /* R rows at once: R independent sums per vector */
    float kt[MX * MX], vp[MX * MX], sv[R][MX], ov[MX], zero[MX];
    const int64_t nkv = (nk + CPU_VW - 1) / CPU_VW, dv = (d + CPU_VW - 1) / CPU_VW;
    const int64_t nkp = nkv * CPU_VW, dp = dv * CPU_VW;
    for (int64_t c = 0; c < d; c++) /* kᵀ, the keys padded with zeros */
        for (int64_t j = 0; j < nkp; j++) kt[c * nkp + j] = j < nk ? k[j * ld + c] : 0.0f;
    for (int64_t j = 0; j < nk; j++)
        for (int64_t c = 0; c < dp; c++) vp[j * dp + c] = c < d ? v[j * ld + c] : 0.0f;
    memset(zero, 0, sizeof zero);
    for (int64_t r = 0; r < rows; r += R) {
        const int64_t rb = rows - r < R ? rows - r : R;
        const float *q0 = q + r * ld, *q1 = rb > 1 ? q0 + ld : zero, *q2 = rb > 2 ? q0 + 2 * ld : zero,
                    *q3 = rb > 3 ? q0 + 3 * ld : zero;
        /* scores: row i's sum over c in order, whatever rows share the pass */
        for (int64_t u = 0; u < nkv; u++) {
            cpu_vf a0 = cpu_vsplat(0.0f), a1 = a0, a2 = a0, a3 = a0;
            const float *kc = kt + u * CPU_VW;
            for (int64_t c = 0; c < d; c++, kc += nkp) {
                const cpu_vf kv = cpu_vload(kc);
                a0 = a0 + kv * q0[c];
                a1 = a1 + kv * q1[c];
                a2 = a2 + kv * q2[c];
                a3 = a3 + kv * q3[c];
            }
            cpu_vstore(sv[0] + u * CPU_VW, a0 * scale);
            cpu_vstore(sv[1] + u * CPU_VW, a1 * scale);
            cpu_vstore(sv[2] + u * CPU_VW, a2 * scale);
            cpu_vstore(sv[3] + u * CPU_VW, a3 * scale);
        }
        for (int64_t i = 0; i < rb; i++) cpu_softmax_row(sv[i], sv[i], nk, 1.0f);
        for (int64_t i = rb; i < R; i++) memset(sv[i], 0, sizeof sv[i]);
        for (int64_t u = 0; u < dv; u++) {
            cpu_vf a0 = cpu_vsplat(0.0f), a1 = a0, a2 = a0, a3 = a0;
            const float *vj = vp + u * CPU_VW;
            for (int64_t j = 0; j < nk; j++, vj += dp) {
                const cpu_vf vv = cpu_vload(vj);
                a0 = a0 + vv * sv[0][j];
                a1 = a1 + vv * sv[1][j];
                a2 = a2 + vv * sv[2][j];
                a3 = a3 + vv * sv[3][j];
            }
            const cpu_vf out[R] = { a0, a1, a2, a3 };
            for (int64_t i = 0; i < rb; i++) {
                cpu_vstore(ov, out[i]);
                const int64_t w = d - u * CPU_VW < CPU_VW ? d - u * CPU_VW : CPU_VW;
                memcpy(o + (r + i) * ld + u * CPU_VW, ov, (size_t)w * sizeof(float));
            }
        }
    }
}


/* The direct kernel, 16 query rows per vector (cpu_vec_attn_direct, this
 * machine's dispatched ISA), gives the bytes of the row-major kernel it
 * replaced (compiled here with the test's own flags: another ISA's code)
 * at every edge: 1 to 64 keys and head widths, row counts that leave any
 * remainder of 16, a stride wider than the head, and scores from small to
 * wide (scale up to 4, values up to ±3: e^x over a wide range). */
START_TEST(test_direct_attention_is_bitwise_the_row_major_kernel_it_replaced) {
    static const int64_t nks[] = { 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64 };
    static const int64_t ds[] = { 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 24, 31, 40, 63, 64 };
    static const int64_t nqs[] = { 1, 3, 15, 16, 17, 33, 47, 130 };
    const int64_t H = 2;
    uint64_t cases = 0;
    for (size_t a = 0; a < sizeof nks / sizeof *nks; a++)
        for (size_t b = 0; b < sizeof ds / sizeof *ds; b++)
            for (size_t c = 0; c < sizeof nqs / sizeof *nqs; c++) {
                const int64_t nk = nks[a], d = ds[b], nq = nqs[c], ld = H * d + 3;
                const float scale = (float)(0.25 + (double)((a + b + c) % 4));
                float *q = malloc((size_t)(nq * ld) * sizeof(float)), *k = malloc((size_t)(nk * ld) * sizeof(float)),
                      *v = malloc((size_t)(nk * ld) * sizeof(float)), *o1 = calloc((size_t)(nq * ld), sizeof(float)),
                      *o2 = calloc((size_t)(nq * ld), sizeof(float));
                for (int64_t i = 0; i < nq * ld; i++) q[i] = uniform(-3, 3);
                for (int64_t i = 0; i < nk * ld; i++) {
                    k[i] = uniform(-3, 3);
                    v[i] = uniform(-1, 1);
                }
                for (int64_t h = 0; h < H; h++) {
                    cpu_vec_attn_direct(q + h * d, k + h * d, v + h * d, o1 + h * d, nq, nk, d, ld, scale);
                    old_direct_rows(q + h * d, k + h * d, v + h * d, o2 + h * d, nq, nk, d, ld, scale);
                }
                ck_assert_msg(memcmp(o1, o2, (size_t)(nq * ld) * sizeof(float)) == 0,
                              "nq %lld nk %lld d %lld: the 16-row kernel differs from the row-major one", (long long)nq,
                              (long long)nk, (long long)d);
                cases++;
                free(q); free(k); free(v); free(o1); free(o2);
            }
    ck_assert_uint_eq(cases, 16 * 15 * 8);
}
END_TEST

/* --- flash-style CPU attention (kernels/cpu/cpu_attn.h) ------------------ */

/* The CPU kernel against the double reference at sizes from 2^20 scores
 * per head, where it walks the keys in blocks of 256 with a running max
 * and sum: queries and keys that the blocks do not divide (1100 = 8·128 +
 * 76 queries, 1000 = 3·256 + 232 keys), one query over 2^20 keys, 2^18 + 1
 * queries over 4 keys (one short key block), 129 queries over 8,200 keys
 * (a last query block of 1), and a head of 128. Outputs are convex combinations of v in [-1, 1]:
 * 1e-5 absolute, as for the other paths. */
START_TEST(test_flash_attention_matches_double_reference_on_ragged_blocks) {
    static const int64_t cases[][4] = { { 1100, 1000, 2, 16 }, { 1, (int64_t)1 << 20, 1, 4 },
                                        { ((int64_t)1 << 18) + 1, 4, 1, 2 }, { 129, 8200, 1, 8 },
                                        { 1024, 1024, 1, 128 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t nq = cases[i][0], nk = cases[i][1], H = cases[i][2], d = cases[i][3];
        ck_assert_int_eq(kern_attention_pick(nq, nk, d), KERN_ATTN_DECOMPOSED); /* >= 2^20 scores */
        attention_vs_ref("flash attention", nq, nk, H, d, 2, (size_t)9 << 20);
    }
}
END_TEST

/* The running max must rescale what came before: scores that rise from
 * key block to key block (every block holds a new max, the first blocks'
 * weights end near e^-40 of the last's), that fall (the first block holds
 * the max), and one spike in the middle block. Exact in the reference; in
 * the kernel a wrong or missing rescale moves the outputs by O(1). */
START_TEST(test_flash_attention_rescales_when_a_later_key_block_holds_the_max) {
    const int64_t nq = 300, nk = 3600, H = 1, d = 4;
    for (int shape = 0; shape < 3; shape++) {
        kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d), o = T2(nq, H * d);
        fill(&q, -0.1f, 0.1f);
        fill(&k, -0.1f, 0.1f);
        fill(&v, -1, 1);
        float *qf = F(&q), *kf = F(&k);
        for (int64_t i = 0; i < nq; i++) qf[i * d] = 4.0f + (float)(i % 7) * 0.25f;
        for (int64_t j = 0; j < nk; j++) {
            float x = (float)j / (float)nk; /* 0 .. 1 */
            kf[j * d] = shape == 0 ? 20.0f * x : shape == 1 ? 20.0f * (1.0f - x)
                                                            : (j == nk / 2 ? 25.0f : 5.0f * x);
        }
        ck_assert_msg(kern_attention(S, &q, &k, &v, H, &o) == 0, "attention: %s", reel_err_text());
        double *ref = dbuf(nq * H * d);
        attention_ref(F(&q), F(&k), F(&v), nq, nk, H, d, ref);
        static const char *const names[] = { "rising scores", "falling scores", "a spike mid-sequence" };
        expect_close(names[shape], F(&o), ref, nq * H * d, 1e-5, 0, NULL, "1e-5 absolute");
    }
}
END_TEST

/* A captured flash attention is one node whose replays repeat the eager
 * bytes, whatever stale data the scratch holds; its scratch is a few lanes
 * of one score block, the same for 2^20 keys as for 1000 (Wan's 32,760
 * tokens ask for the same); one byte short is refused with a message. */
START_TEST(test_flash_attention_replays_bitwise_equal_to_eager_in_its_bounded_scratch) {
    const int64_t nq = 1100, nk = 1000, H = 2, d = 16;
    size_t need = kern_attention_scratch_bytes(KERN_BACKEND_CPU, KERN_F32, nq, nk, H, d);
    ck_assert_uint_gt(need, 0);
    ck_assert_uint_eq(kern_attention_scratch_bytes(KERN_BACKEND_CPU, KERN_F32, 32760, 32760, 12, 128),
                      kern_attention_scratch_bytes(KERN_BACKEND_CPU, KERN_F32, 32760, (int64_t)1 << 24, 12, 128));
    ck_assert_uint_le(kern_attention_scratch_bytes(KERN_BACKEND_CPU, KERN_F32, 32760, 32760, 12, 128),
                      (size_t)9 << 20);
    kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d), o = T2(nq, H * d);
    fill(&q, -2, 2);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    kern_scratch_t ws = { dev_bytes(need), need };
    kern_scratch_t prev = kern_stream_bind_scratch(S, ws);
    ck_assert_msg(kern_attention(S, &q, &k, &v, H, &o) == 0, "eager: %s", reel_err_text());
    float *eager = snapshot(&o);
    ck_assert_int_eq(kern_capture_begin(S), 0);
    ck_assert_msg(kern_attention(S, &q, &k, &v, H, &o) == 0, "capture: %s", reel_err_text());
    kern_graph_t *g = NULL;
    ck_assert_int_eq(kern_capture_end(S, &g), 0);
    ck_assert_uint_eq(kern_graph_nodes(g), 1);
    for (int rep = 0; rep < 2; rep++) {
        memset(F(&o), 0, kern_tensor_bytes(&o));
        memset(ws.base, rep ? 0xff : 0x7f, ws.bytes); /* stale scores, maxima and sums must not matter */
        ck_assert_msg(kern_graph_replay(g, S) == 0, "replay: %s", reel_err_text());
        ck_assert_msg(memcmp(F(&o), eager, kern_tensor_bytes(&o)) == 0,
                      "replay %d of the flash attention differs from eager", rep);
    }
    kern_graph_destroy(&g);
    kern_stream_bind_scratch(S, (kern_scratch_t){ ws.base, ws.bytes - 1 });
    reel_err_clear();
    ck_assert_int_eq(kern_attention(S, &q, &k, &v, H, &o), -1);
    ck_assert_msg(strstr(reel_err_text(), "attention") && strstr(reel_err_text(), "scratch"),
                  "message should name attention and its scratch: '%s'", reel_err_text());
    kern_stream_bind_scratch(S, prev);
}
END_TEST

/* Every block fits the bound; the blocks tile heads × queries exactly; a
 * bound below one row of one head still plans (one row, one head). The
 * CUDA plan for Wan's self-attention in BF16 (S F32 + P BF16 = 6 bytes a
 * score) takes 227 rows of all 12 heads per block under 512 MiB. */
START_TEST(test_attention_plan_keeps_each_block_within_its_memory_bound) {
    static const int64_t shapes[][4] = {
        { 1100, 4096, 2, 4 }, { 32760, 32760, 12, 128 }, { 7, 3, 5, 2 }, { 1, 100000, 3, 64 },
    };
    const size_t bounds[] = { 0, (size_t)1 << 20, 4096, 100, 1 };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t j = 0; j < sizeof bounds / sizeof bounds[0]; j++) {
            int64_t nq = shapes[i][0], nk = shapes[i][1], H = shapes[i][2], d = shapes[i][3];
            kern_attn_opts_t o = { KERN_ATTN_DECOMPOSED, bounds[j], false };
            kern_attn_plan_t p = plan_of(nq, nk, H, d, &o);
            size_t bound = bounds[j] ? bounds[j] : KERN_ATTN_BLOCK_BYTES_CPU;
            size_t row = (size_t)p.ld * sizeof(float);
            ck_assert(p.ld >= nk && p.ld % 8 == 0 && p.ld < nk + 8);
            ck_assert(p.rows >= 1 && p.rows <= nq && p.heads >= 1 && p.heads <= H);
            ck_assert_uint_eq(p.scratch_bytes, (size_t)(p.rows * p.heads) * row);
            ck_assert_uint_eq(p.probs_bytes, 0);
            if (row <= bound)
                ck_assert_msg(p.scratch_bytes <= bound, "shape %zu bound %zu: %zu bytes", i,
                              bound, p.scratch_bytes);
            else
                ck_assert(p.rows == 1 && p.heads == 1);
            if (p.heads < H) ck_assert_int_eq(p.rows, 1);
            ck_assert_int_eq(p.blocks, ((H + p.heads - 1) / p.heads) * ((nq + p.rows - 1) / p.rows));
            ck_assert_uint_eq(kern_attention_scratch_bytes(KERN_BACKEND_CPU, KERN_F32, nq, nk, H, d),
                              plan_of(nq, nk, H, d, NULL).scratch_bytes);
        }
    kern_attn_plan_t none = plan_of(0, 10, 2, 4, &(kern_attn_opts_t){ KERN_ATTN_DECOMPOSED, 0, false });
    ck_assert(none.blocks == 0 && none.scratch_bytes == 0);
#ifdef HAVE_CUDA
    kern_attn_plan_t w;
    ck_assert_msg(kern_attention_plan(KERN_BACKEND_CUDA, KERN_BF16, 32760, 32760, 12, 128, NULL,
                                      &w) == 0, "cuda plan: %s", reel_err_text());
    ck_assert_int_eq(w.path, KERN_ATTN_DECOMPOSED);
    ck_assert_int_eq(w.rows, 227);
    ck_assert_int_eq(w.heads, 12);
    ck_assert_int_eq(w.blocks, 145);
    ck_assert_uint_eq(w.probs_bytes, (size_t)12 * 227 * 32760 * 2);
    ck_assert(w.scratch_bytes <= KERN_ATTN_BLOCK_BYTES_CUDA);
#endif
}
END_TEST

START_TEST(test_attention_plan_rejects_bad_sizes_and_unknown_paths_with_a_message) {
    kern_attn_plan_t p;
    ck_assert_int_eq(kern_attention_plan(KERN_BACKEND_CPU, KERN_F32, 4, 0, 2, 4, NULL, &p), -1);
    ck_assert_msg(strstr(reel_err_text(), "attention") != NULL, "'%s'", reel_err_text());
    ck_assert_int_eq(kern_attention_plan(KERN_BACKEND_CPU, KERN_F32, 4, 4, 2, 4,
                                         &(kern_attn_opts_t){ (kern_attn_path_t)7, 0, false }, &p), -1);
    ck_assert_msg(strstr(reel_err_text(), "unknown path") != NULL, "'%s'", reel_err_text());
    /* the CPU has F32 kernels only: BF16 names what is missing */
    ck_assert_int_eq(kern_attention_plan(KERN_BACKEND_CPU, KERN_BF16, 4096, 4096, 2, 4, NULL, &p),
                     -1);
    ck_assert_msg(strstr(reel_err_text(), "gemm_batched") != NULL, "'%s'", reel_err_text());
    ck_assert_uint_eq(kern_attention_scratch_bytes(KERN_BACKEND_CPU, KERN_F32, 4, 0, 2, 4), 0);
}
END_TEST

/* As a step workspace runs it: scratch sized by kern_attention_scratch_bytes
 * (here the plan of a forced bound) bound to the stream, the stream arena
 * untouched; the captured launches replay bit for bit equal to eager; the
 * same call with a bound scratch one byte short fails, naming attention. */
START_TEST(test_decomposed_attention_replays_bitwise_equal_to_eager_in_bound_scratch) {
    const int64_t nq = 301, nk = 3500, H = 3, d = 16;
    kern_attn_opts_t opts = { KERN_ATTN_DECOMPOSED, bound_for_rows(nk, H, 64), false };
    kern_attn_plan_t p = plan_of(nq, nk, H, d, &opts);
    ck_assert_int_eq(p.blocks, 5); /* 4 × 64 + 45 */
    kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d), o = T2(nq, H * d);
    fill(&q, -2, 2);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    kern_scratch_t ws = { dev_bytes(p.scratch_bytes), p.scratch_bytes };
    kern_scratch_t prev = kern_stream_bind_scratch(S, ws);
    ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o, &opts) == 0, "eager: %s", reel_err_text());
    float *eager = snapshot(&o);
    memset(F(&o), 0, kern_tensor_bytes(&o));
    ck_assert_int_eq(kern_capture_begin(S), 0);
    ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o, &opts) == 0, "capture: %s", reel_err_text());
    kern_graph_t *g = NULL;
    ck_assert_int_eq(kern_capture_end(S, &g), 0);
    ck_assert_uint_eq(kern_graph_nodes(g), 3 * 5);
    for (int rep = 0; rep < 2; rep++) {
        memset(F(&o), 0, kern_tensor_bytes(&o));
        memset(ws.base, 0xff, ws.bytes); /* stale scores must not matter */
        ck_assert_msg(kern_graph_replay(g, S) == 0, "replay: %s", reel_err_text());
        ck_assert_msg(memcmp(F(&o), eager, kern_tensor_bytes(&o)) == 0,
                      "replay %d of the decomposed attention differs from eager", rep);
    }
    kern_graph_destroy(&g);
    ck_assert_uint_eq(kern_stream_scratch_size(S), 0);

    kern_stream_bind_scratch(S, (kern_scratch_t){ ws.base, ws.bytes - 1 });
    reel_err_clear();
    ck_assert_int_eq(kern_attention_ex(S, &q, &k, &v, H, &o, &opts), -1);
    ck_assert_msg(strstr(reel_err_text(), "attention") && strstr(reel_err_text(), "scratch"),
                  "message should name attention and its scratch: '%s'", reel_err_text());
    kern_stream_bind_scratch(S, prev);
}
END_TEST

/* --- 3-D RoPE --------------------------------------------------------- */

/* Rotates every pair as TINYDIT.md words it: pair p of a head sits in the
 * frame part while 2p < d − 4q, then the row part, then the column part. */
static void rope_ref(const float *x, int64_t H, int64_t d, int64_t Fr, int64_t R, int64_t C,
                     double *out) {
    int64_t q = d / 6, rf = d - 4 * q, rr = 2 * q, rc = 2 * q;
    for (int64_t t = 0; t < Fr * R * C; t++) {
        int64_t f = t / (R * C), h = (t / C) % R, w = t % C;
        for (int64_t hd = 0; hd < H; hd++)
            for (int64_t p = 0; p < d / 2; p++) {
                int64_t j, r, pos;
                if (2 * p < rf) { j = p; r = rf; pos = f; }
                else if (2 * p < rf + rr) { j = p - rf / 2; r = rr; pos = h; }
                else { j = p - (rf + rr) / 2; r = rc; pos = w; }
                double th = (double)pos * pow(10000.0, -2.0 * (double)j / (double)r);
                int64_t i = (t * H + hd) * d + 2 * p;
                double a = x[i], b = x[i + 1];
                out[i] = a * cos(th) - b * sin(th);
                out[i + 1] = a * sin(th) + b * cos(th);
            }
    }
}

/* Head widths 8 (parts 4/2/2), 20 (8/6/6) and 2 (all frame, q = 0). The
 * kernel rotates in double and rounds once: 1e-6·(1 + |ref|). */
START_TEST(test_rope3d_matches_pairwise_rotation_reference) {
    const struct { int64_t H, d, F, R, C; } cases[] = {
        { 3, 8, 2, 3, 4 }, { 2, 20, 3, 2, 5 }, { 1, 2, 4, 1, 2 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t H = cases[c].H, d = cases[c].d, Fr = cases[c].F, R = cases[c].R, C = cases[c].C;
        int64_t n = Fr * R * C * H * d;
        kern_tensor_t x = T2(Fr * R * C, H * d);
        fill(&x, -1, 1);
        double *ref = dbuf(n);
        rope_ref(F(&x), H, d, Fr, R, C, ref);
        ck_assert_msg(kern_rope3d(S, &x, H, Fr, R, C) == 0, "rope3d: %s", reel_err_text());
        char what[64];
        snprintf(what, sizeof what, "rope3d d=%lld", (long long)d);
        expect_close(what, F(&x), ref, n, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
    }
}
END_TEST

/* Token (0,0,0) must come back bit for bit; (0,0,1) may change only its
 * column dims and (1,0,0) only its frame dims. d = 20: frame 8, row 6, col 6. */
START_TEST(test_rope3d_rotates_each_part_by_its_own_position_only) {
    const int64_t H = 2, d = 20, Fr = 2, R = 3, C = 3, W = H * d;
    kern_tensor_t x = T2(Fr * R * C, W);
    fill(&x, -1, 1);
    float *x0 = snapshot(&x);
    ck_assert_msg(kern_rope3d(S, &x, H, Fr, R, C) == 0, "rope3d: %s", reel_err_text());
    ck_assert_msg(memcmp(F(&x), x0, (size_t)W * sizeof(float)) == 0,
                  "token at position (0,0,0) changed");
    const struct { int64_t t, lo, hi; } moved[] = {
        { 1, 14, 20 },          /* (f,h,w) = (0,0,1): column dims 14..19 */
        { R * C, 0, 8 },        /* (1,0,0): frame dims 0..7 */
        { C, 8, 14 },           /* (0,1,0): row dims 8..13 */
    };
    for (size_t m = 0; m < sizeof moved / sizeof moved[0]; m++)
        for (int64_t hd = 0; hd < H; hd++) {
            int changed = 0;
            for (int64_t i = 0; i < d; i++) {
                int64_t at = moved[m].t * W + hd * d + i;
                int inside = i >= moved[m].lo && i < moved[m].hi;
                if (!inside)
                    ck_assert_msg(F(&x)[at] == x0[at], "token %lld head %lld dim %lld moved "
                                  "outside its part", (long long)moved[m].t, (long long)hd,
                                  (long long)i);
                else
                    changed |= F(&x)[at] != x0[at];
            }
            ck_assert_msg(changed, "token %lld head %lld: its part did not rotate",
                          (long long)moved[m].t, (long long)hd);
        }
}
END_TEST

/* A rotation keeps |(a, b)|: 1e-6·(1 + |(a, b)|) per pair. */
START_TEST(test_rope3d_preserves_the_norm_of_every_pair) {
    const int64_t H = 3, d = 16, Fr = 3, R = 4, C = 5, n = Fr * R * C * H * d;
    kern_tensor_t x = T2(Fr * R * C, H * d);
    fill(&x, -1, 1);
    float *x0 = snapshot(&x);
    ck_assert_msg(kern_rope3d(S, &x, H, Fr, R, C) == 0, "rope3d: %s", reel_err_text());
    double *ref = dbuf(n / 2), *got = dbuf(n / 2);
    float *gotf = hmalloc((size_t)(n / 2) * sizeof(float));
    for (int64_t i = 0; i < n / 2; i++) {
        ref[i] = hypot(x0[2 * i], x0[2 * i + 1]);
        got[i] = hypot(F(&x)[2 * i], F(&x)[2 * i + 1]);
        gotf[i] = (float)got[i];
    }
    expect_close("rope3d pair norms", gotf, ref, n / 2, 1e-6, 1e-6, NULL, "1e-6 * (1 + |pair|)");
}
END_TEST

/* --- patchify / unpatchify -------------------------------------------- */

/* Exact: both ops are copies. C = 3 so the (c, ph, pw) and (ph, pw, c)
 * orders cannot coincide; every value is its own index, so any misplaced
 * element shows. */
START_TEST(test_patchify_places_each_value_by_the_c_ph_pw_index_formula) {
    const int64_t C = 3, Fr = 2, H = 4, W = 6, Hp = H / 2, Wp = W / 2;
    kern_tensor_t lat = T4(C, Fr, H, W), tok = T2(Fr * Hp * Wp, 4 * C);
    for (int64_t i = 0; i < N(&lat); i++) F(&lat)[i] = (float)i;
    for (int64_t i = 0; i < N(&tok); i++) F(&tok)[i] = NAN;
    ck_assert_msg(kern_patchify(S, &lat, &tok) == 0, "patchify: %s", reel_err_text());
    for (int64_t f = 0; f < Fr; f++)
        for (int64_t h = 0; h < Hp; h++)
            for (int64_t w = 0; w < Wp; w++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t ph = 0; ph < 2; ph++)
                        for (int64_t pw = 0; pw < 2; pw++) {
                            int64_t t = (f * Hp + h) * Wp + w;
                            float got = F(&tok)[t * 4 * C + c * 4 + ph * 2 + pw];
                            float want = F(&lat)[((c * Fr + f) * H + 2 * h + ph) * W + 2 * w + pw];
                            ck_assert_msg(got == want, "patchify token %lld c %lld ph %lld pw %lld:"
                                          " %g, expected %g", (long long)t, (long long)c,
                                          (long long)ph, (long long)pw, got, want);
                        }
}
END_TEST

START_TEST(test_unpatchify_places_each_value_by_the_ph_pw_c_index_formula) {
    const int64_t C = 3, Fr = 2, H = 4, W = 6, Hp = H / 2, Wp = W / 2;
    kern_tensor_t lat = T4(C, Fr, H, W), tok = T2(Fr * Hp * Wp, 4 * C);
    for (int64_t i = 0; i < N(&tok); i++) F(&tok)[i] = (float)i;
    for (int64_t i = 0; i < N(&lat); i++) F(&lat)[i] = NAN;
    ck_assert_msg(kern_unpatchify(S, &tok, &lat) == 0, "unpatchify: %s", reel_err_text());
    /* The loops below visit every latent element once, so a NaN left
     * anywhere (an element never written) fails too. */
    for (int64_t f = 0; f < Fr; f++)
        for (int64_t h = 0; h < Hp; h++)
            for (int64_t w = 0; w < Wp; w++)
                for (int64_t ph = 0; ph < 2; ph++)
                    for (int64_t pw = 0; pw < 2; pw++)
                        for (int64_t c = 0; c < C; c++) {
                            int64_t t = (f * Hp + h) * Wp + w;
                            float got = F(&lat)[((c * Fr + f) * H + 2 * h + ph) * W + 2 * w + pw];
                            float want = F(&tok)[t * 4 * C + (ph * 2 + pw) * C + c];
                            ck_assert_msg(got == want, "unpatchify c %lld f %lld y %lld x %lld:"
                                          " %g, expected %g", (long long)c, (long long)f,
                                          (long long)(2 * h + ph), (long long)(2 * w + pw), got, want);
                        }
}
END_TEST

/* --- per-step ops ----------------------------------------------------- */

/* emb = [cos(1000σ·ω_j), sin(1000σ·ω_j)] in double. The kernel evaluates
 * the same double formula and rounds once, so 2.5e-7 absolute (4 float ulps
 * at 1) is ample; an angle formed in float would be off by ~1e-5. */
static void timestep_ref(float sigma, int64_t dim, double *ref) {
    double t = 1000.0 * (double)sigma;
    int64_t h = dim / 2;
    for (int64_t j = 0; j < h; j++) {
        double om = pow(10000.0, -(double)j / (double)h);
        ref[j] = cos(t * om);
        ref[h + j] = sin(t * om);
    }
}

START_TEST(test_timestep_embed_matches_double_formula) {
    const int64_t dim = 256;
    kern_tensor_t sigma = T1(1), emb = T2(1, dim);
    double *ref = dbuf(dim);
    const float sigmas[] = { 0.731f, 1.0f, 0.0f };
    for (size_t i = 0; i < 3; i++) {
        F(&sigma)[0] = sigmas[i];
        ck_assert_msg(kern_timestep_embed(S, &sigma, &emb) == 0, "timestep: %s", reel_err_text());
        timestep_ref(sigmas[i], dim, ref);
        expect_close("timestep_embed", F(&emb), ref, dim, 2.5e-7, 0, NULL, "2.5e-7 absolute");
    }
}
END_TEST

/* Float kernel: 1e-6·(1 + |vu| + |g·(vc − vu)|), the size of its terms. */
START_TEST(test_cfg_combine_matches_double_reference) {
    const int64_t n = 777;
    kern_tensor_t vc = T1(n), vu = T1(n), g = T1(1), v = T1(n);
    fill(&vc, -1, 1);
    fill(&vu, -1, 1);
    F(&g)[0] = 4.5f;
    ck_assert_msg(kern_cfg_combine(S, &vc, &vu, &g, &v) == 0, "cfg: %s", reel_err_text());
    double *ref = dbuf(n), *tol = dbuf(n);
    for (int64_t i = 0; i < n; i++) {
        double d = (double)F(&g)[0] * ((double)F(&vc)[i] - F(&vu)[i]);
        ref[i] = F(&vu)[i] + d;
        tol[i] = 1e-6 * (1.0 + fabs(F(&vu)[i]) + fabs(d));
    }
    expect_close("cfg_combine", F(&v), ref, n, 0, 0, tol, "1e-6 * (1 + |vu| + |g (vc - vu)|)");
}
END_TEST

/* Float kernel: 1e-6·(1 + |ref|). */
START_TEST(test_euler_update_matches_double_reference) {
    const int64_t n = 777;
    kern_tensor_t x = T1(n), v = T1(n), sig = T1(2);
    fill(&x, -1, 1);
    fill(&v, -1, 1);
    F(&sig)[0] = 0.8f;
    F(&sig)[1] = 0.75f;
    float *x0 = snapshot(&x);
    ck_assert_msg(kern_euler_update(S, &x, &v, &sig) == 0, "euler: %s", reel_err_text());
    double *ref = dbuf(n);
    for (int64_t i = 0; i < n; i++)
        ref[i] = x0[i] + ((double)F(&sig)[1] - F(&sig)[0]) * F(&v)[i];
    expect_close("euler", F(&x), ref, n, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
}
END_TEST

/* The Flow-GRPO step of TINYDIT.md, literally, in double; with `grid`
 * its Wan trainer's std (wan_pipeline_with_logprob.py's sde_step_with_logprob:
 * std_dev_t = sigma_min + (sigma_max - sigma_min) * sigma, sigma_max =
 * sigmas[1], sigma_min = sigmas[-1] = 0), scaled by eta. */
static void sde_ref_form(const float *x, const float *v, const float *sig, float eta, uint64_t seed,
                         uint32_t step, int64_t n, double *ref, bool grid) {
    double si = sig[0], sn = sig[1], s1 = sig[2];
    double delta = sn - si;
    double sp = si == 1.0 ? s1 : si;
    double std = grid ? eta * (0.0 + (s1 - 0.0) * si) : eta * sqrt(si / (1.0 - sp));
    for (int64_t j = 0; j < n; j++) {
        double eps = kern_philox_normal(seed, step, (uint64_t)j);
        ref[j] = x[j] + (v[j] + std * std / (2.0 * si) * (x[j] + (1.0 - si) * v[j])) * delta
                 + std * sqrt(-delta) * eps;
    }
}

static void sde_ref(const float *x, const float *v, const float *sig, float eta, uint64_t seed,
                    uint32_t step, int64_t n, double *ref) {
    sde_ref_form(x, v, sig, eta, seed, step, n, ref, false);
}

/* Double kernel, one rounding: 1e-6·(1 + |ref|). Covers σ_i < 1 and the
 * σ_i = 1 case, where σ' is σ_1. */
START_TEST(test_sde_update_matches_double_reference) {
    const int64_t n = 1000;
    const struct { float s[3]; float eta; uint64_t seed; uint32_t step; } cases[] = {
        { { 0.8f, 0.7f, 0.95f }, 0.7f, 1234, 3 },
        { { 1.0f, 0.9f, 0.9f }, 0.5f, 0x123456789abcdefull, 0 },
    };
    kern_tensor_t x = T1(n), v = T1(n), sig = T1(3);
    double *ref = dbuf(n);
    for (size_t c = 0; c < 2; c++) {
        fill(&x, -1, 1);
        fill(&v, -1, 1);
        memcpy(F(&sig), cases[c].s, sizeof cases[c].s);
        sde_ref(F(&x), F(&v), F(&sig), cases[c].eta, cases[c].seed, cases[c].step, n, ref);
        ck_assert_msg(kern_sde_update(S, &x, &v, &sig, cases[c].eta, cases[c].seed,
                                      cases[c].step) == 0, "sde: %s", reel_err_text());
        expect_close(c ? "sde at sigma 1" : "sde", F(&x), ref, n, 1e-6, 1e-6, NULL,
                     "1e-6 * (1 + |ref|)");
    }
    /* a σ row of 4 (σ_i, σ_{i+1}, σ_1, t_i: a solver's grid) takes the Wan
     * trainer's std, η·σ_1·σ_i: at UniPC's σ_0 just under 1, where the SD3
     * form's √(σ/(1 − σ)) would be about 60 */
    kern_tensor_t sig4 = T1(4);
    const float g[4] = { 0.99967f, 0.96394f, 0.96394f, 999.0f };
    memcpy(F(&sig4), g, sizeof g);
    fill(&x, -1, 1);
    fill(&v, -1, 1);
    sde_ref_form(F(&x), F(&v), F(&sig4), 1.0f, 77, 0, n, ref, true);
    ck_assert_msg(kern_sde_update(S, &x, &v, &sig4, 1.0f, 77, 0) == 0, "sde: %s", reel_err_text());
    expect_close("sde on a solver's grid", F(&x), ref, n, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
    /* more than 4 values is neither form (a mixed batch's whole [S,3], say): refused */
    kern_tensor_t sig6 = T1(6);
    ck_assert_int_eq(kern_sde_update(S, &x, &v, &sig6, 1.0f, 77, 0), -1);
    ck_assert_msg(strstr(reel_err_text(), "or a grid's 4"), "%s", reel_err_text());
}
END_TEST

/* η = 0 removes the noise and the drift correction: the step is
 * x + Δ·v whatever the seed. Tolerance 1e-6·(1 + |ref|). */
START_TEST(test_sde_with_zero_eta_is_the_noiseless_euler_step) {
    const int64_t n = 300;
    kern_tensor_t x = T1(n), v = T1(n), sig = T1(3);
    fill(&x, -1, 1);
    fill(&v, -1, 1);
    F(&sig)[0] = 0.5f;
    F(&sig)[1] = 0.4f;
    F(&sig)[2] = 0.9f;
    float *x0 = snapshot(&x);
    ck_assert_msg(kern_sde_update(S, &x, &v, &sig, 0.0f, 99, 1) == 0, "sde: %s", reel_err_text());
    float *first = snapshot(&x);
    double *ref = dbuf(n);
    for (int64_t i = 0; i < n; i++) ref[i] = x0[i] + ((double)F(&sig)[1] - F(&sig)[0]) * F(&v)[i];
    expect_close("sde with eta 0", F(&x), ref, n, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
    memcpy(F(&x), x0, kern_tensor_bytes(&x));
    ck_assert_int_eq(kern_sde_update(S, &x, &v, &sig, 0.0f, 12345, 1), 0);
    ck_assert_msg(memcmp(F(&x), first, kern_tensor_bytes(&x)) == 0,
                  "with eta 0 the seed still changed the result");
}
END_TEST

/* Runs the SDE step on a copy of x0 into out. */
static void sde_run(const float *x0, kern_tensor_t *x, const kern_tensor_t *v,
                    const kern_tensor_t *sig, uint64_t seed, uint32_t step, float *out) {
    memcpy(F(x), x0, kern_tensor_bytes(x));
    ck_assert_msg(kern_sde_update(S, x, v, sig, 0.8f, seed, step) == 0, "sde: %s", reel_err_text());
    memcpy(out, F(x), kern_tensor_bytes(x));
}

static int64_t count_differing(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

START_TEST(test_sde_same_seed_gives_same_bits_and_other_seed_or_step_differs) {
    const int64_t n = 512;
    kern_tensor_t x = T1(n), v = T1(n), sig = T1(3);
    fill(&x, -1, 1);
    fill(&v, -1, 1);
    F(&sig)[0] = 0.6f;
    F(&sig)[1] = 0.5f;
    F(&sig)[2] = 0.95f;
    float *x0 = snapshot(&x);
    float *a = hmalloc(n * 4), *b = hmalloc(n * 4), *c = hmalloc(n * 4), *d = hmalloc(n * 4);
    sde_run(x0, &x, &v, &sig, 77, 5, a);
    sde_run(x0, &x, &v, &sig, 77, 5, b);
    sde_run(x0, &x, &v, &sig, 78, 5, c);
    sde_run(x0, &x, &v, &sig, 77, 6, d);
    ck_assert_msg(memcmp(a, b, n * 4) == 0, "same seed and step gave different bits");
    ck_assert_msg(count_differing(a, c, n) > n * 9 / 10, "another seed left %lld of %lld equal",
                  (long long)(n - count_differing(a, c, n)), (long long)n);
    ck_assert_msg(count_differing(a, d, n) > n * 9 / 10, "another step left %lld of %lld equal",
                  (long long)(n - count_differing(a, d, n)), (long long)n);
}
END_TEST

START_TEST(test_sde_refuses_to_launch_on_a_capturing_stream) {
    const int64_t n = 64;
    kern_tensor_t x = T1(n), v = T1(n), sig = T1(3);
    fill(&x, -1, 1);
    fill(&v, -1, 1);
    F(&sig)[0] = 0.6f;
    F(&sig)[1] = 0.5f;
    F(&sig)[2] = 0.95f;
    float *x0 = snapshot(&x);
    ck_assert_msg(kern_capture_begin(S) == 0, "capture: %s", reel_err_text());
    reel_err_clear();
    ck_assert_int_eq(kern_sde_update(S, &x, &v, &sig, 0.7f, 1, 0), -1);
    ck_assert_msg(strstr(reel_err_text(), "capturable") && strstr(reel_err_text(), "sde"),
                  "message should say the sde kernel is not capturable: '%s'", reel_err_text());
    kern_graph_t *g = NULL;
    ck_assert_msg(kern_capture_end(S, &g) == 0, "end capture: %s", reel_err_text());
    ck_assert_ptr_nonnull(g);
    ck_assert_uint_eq(kern_graph_nodes(g), 0);
    kern_graph_destroy(&g);
    ck_assert_ptr_null(g);
    ck_assert_msg(memcmp(F(&x), x0, kern_tensor_bytes(&x)) == 0, "refused SDE touched x");
}
END_TEST

START_TEST(test_sde_dev_reads_eta_seed_and_step_from_memory_bitwise_equal_to_sde) {
    const int64_t n = 300;
    kern_tensor_t x = T1(n), v = T1(n), sig = T1(3), prm = T1(4);
    fill(&x, -1, 1);
    fill(&v, -1, 1);
    F(&sig)[0] = 0.6f;
    F(&sig)[1] = 0.5f;
    F(&sig)[2] = 0.95f;
    float *x0 = snapshot(&x), *want = hmalloc(n * 4);
    /* Seeds above 2^32 and steps above 2^16 exercise every packed bit. */
    const struct { float eta; uint64_t seed; uint32_t step; } cases[] = {
        { 0.8f, 77, 5 }, { 0.3f, 0x123456789abcdefull, 70000 }, { 0.0f, 1, 0 }, { 1.5f, UINT64_MAX, UINT32_MAX },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(F(&x), x0, kern_tensor_bytes(&x));
        ck_assert_int_eq(kern_sde_update(S, &x, &v, &sig, cases[c].eta, cases[c].seed, cases[c].step), 0);
        memcpy(want, F(&x), kern_tensor_bytes(&x));
        memcpy(F(&x), x0, kern_tensor_bytes(&x));
        kern_sde_params_pack(F(&prm), cases[c].eta, cases[c].seed, cases[c].step);
        ck_assert_msg(kern_sde_update_dev(S, &x, &v, &sig, &prm) == 0, "sde_dev: %s", reel_err_text());
        ck_assert_msg(memcmp(F(&x), want, kern_tensor_bytes(&x)) == 0, "case %zu: sde_dev != sde", c);
    }
}
END_TEST

START_TEST(test_a_captured_sde_dev_replays_for_new_seeds_and_steps_written_between_replays) {
    const int64_t n = 128;
    kern_tensor_t x = T1(n), v = T1(n), sig = T1(3), prm = T1(4);
    fill(&x, -1, 1);
    fill(&v, -1, 1);
    F(&sig)[0] = 0.7f;
    F(&sig)[1] = 0.6f;
    F(&sig)[2] = 0.95f;
    float *x0 = snapshot(&x), *want = hmalloc(n * 4);
    kern_sde_params_pack(F(&prm), 0.7f, 1, 0);
    kern_graph_t *g = NULL;
    ck_assert_msg(kern_capture_begin(S) == 0, "capture: %s", reel_err_text());
    ck_assert_msg(kern_sde_update_dev(S, &x, &v, &sig, &prm) == 0, "sde_dev while capturing: %s", reel_err_text());
    ck_assert_msg(kern_capture_end(S, &g) == 0, "end capture: %s", reel_err_text());
    ck_assert_msg(memcmp(F(&x), x0, kern_tensor_bytes(&x)) == 0, "capturing ran the kernel");
    for (uint32_t k = 0; k < 4; k++) {
        uint64_t seed = 1000 + k;
        float eta = 0.2f * (float)(k + 1);
        memcpy(F(&x), x0, kern_tensor_bytes(&x));
        ck_assert_int_eq(kern_sde_update(S, &x, &v, &sig, eta, seed, k), 0);
        memcpy(want, F(&x), kern_tensor_bytes(&x));
        memcpy(F(&x), x0, kern_tensor_bytes(&x));
        kern_sde_params_pack(F(&prm), eta, seed, k);
        ck_assert_msg(kern_graph_replay(g, S) == 0, "replay: %s", reel_err_text());
        ck_assert_msg(memcmp(F(&x), want, kern_tensor_bytes(&x)) == 0, "replay %u != eager sde", k);
    }
    kern_graph_destroy(&g);
}
END_TEST

/* --- capture and replay ----------------------------------------------- */

/* gemm → gelu → attention → rope3d → in-place layernorm: five launches. */
static int run_chain(kern_tensor_t *x, kern_tensor_t *w, kern_tensor_t *b, kern_tensor_t *h,
                     kern_tensor_t *g, kern_tensor_t *k, kern_tensor_t *v, kern_tensor_t *o,
                     kern_tensor_t *lw, kern_tensor_t *lb) {
    if (kern_gemm(S, x, w, b, h)) return -1;
    if (kern_gelu_tanh(S, h, g)) return -1;
    if (kern_attention(S, g, k, v, 3, o)) return -1;
    if (kern_rope3d(S, o, 3, 2, 2, 3)) return -1;
    if (kern_layernorm(S, o, lw, lb, 1e-6f, o)) return -1;
    return 0;
}

START_TEST(test_cpu_capture_replays_bitwise_equal_to_eager_with_one_node_per_launch) {
    const int64_t T = 12, D = 24, L = 9; /* 12 tokens = 2 frames x 2 rows x 3 cols */
    kern_tensor_t x = T2(T, D), w = T2(D, D), b = T1(D), h = T2(T, D), g = T2(T, D);
    kern_tensor_t k = T2(L, D), v = T2(L, D), o = T2(T, D), lw = T1(D), lb = T1(D);
    fill(&x, -1, 1);
    fill(&w, -0.5f, 0.5f);
    fill(&b, -1, 1);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    fill(&lw, -1, 1);
    fill(&lb, -1, 1);
    ck_assert_msg(run_chain(&x, &w, &b, &h, &g, &k, &v, &o, &lw, &lb) == 0, "eager: %s",
                  reel_err_text());
    float *eh = snapshot(&h), *eg = snapshot(&g), *eo = snapshot(&o);
    memset(F(&h), 0, kern_tensor_bytes(&h));
    memset(F(&g), 0, kern_tensor_bytes(&g));
    memset(F(&o), 0, kern_tensor_bytes(&o));

    ck_assert_msg(kern_capture_begin(S) == 0, "capture: %s", reel_err_text());
    ck_assert_msg(run_chain(&x, &w, &b, &h, &g, &k, &v, &o, &lw, &lb) == 0, "capture: %s",
                  reel_err_text());
    kern_graph_t *gr = NULL;
    ck_assert_msg(kern_capture_end(S, &gr) == 0, "end capture: %s", reel_err_text());
    ck_assert_uint_eq(kern_graph_nodes(gr), 5);
    for (int64_t i = 0; i < N(&o); i++)
        ck_assert_msg(F(&o)[i] == 0.0f, "capture ran a kernel instead of recording it");

    for (int rep = 0; rep < 2; rep++) {
        memset(F(&o), 0, kern_tensor_bytes(&o));
        ck_assert_msg(kern_graph_replay(gr, S) == 0, "replay: %s", reel_err_text());
        ck_assert_msg(memcmp(F(&h), eh, kern_tensor_bytes(&h)) == 0, "replayed gemm differs");
        ck_assert_msg(memcmp(F(&g), eg, kern_tensor_bytes(&g)) == 0, "replayed gelu differs");
        ck_assert_msg(memcmp(F(&o), eo, kern_tensor_bytes(&o)) == 0,
                      "replay %d of attention+rope+layernorm differs from eager", rep);
    }
    ck_assert_uint_eq(kern_graph_replays(gr), 2);
    kern_graph_destroy(&gr);
}
END_TEST

/* A captured step must read σ when it replays, not the σ seen at capture.
 * Timestep tolerance 2.5e-7 absolute; Euler 1e-6·(1 + |ref|). */
START_TEST(test_captured_timestep_and_euler_read_sigma_at_replay_time) {
    const int64_t dim = 64, n = 50;
    kern_tensor_t sig = T1(2), emb = T1(dim), x = T1(n), v = T1(n);
    F(&sig)[0] = 0.9f;
    F(&sig)[1] = 0.85f;
    fill(&x, -1, 1);
    fill(&v, -1, 1);
    float *x0 = snapshot(&x);
    ck_assert_int_eq(kern_capture_begin(S), 0);
    ck_assert_msg(kern_timestep_embed(S, &sig, &emb) == 0, "timestep: %s", reel_err_text());
    ck_assert_msg(kern_euler_update(S, &x, &v, &sig) == 0, "euler: %s", reel_err_text());
    kern_graph_t *gr = NULL;
    ck_assert_int_eq(kern_capture_end(S, &gr), 0);
    ck_assert_uint_eq(kern_graph_nodes(gr), 2);

    F(&sig)[0] = 0.6f;
    F(&sig)[1] = 0.55f;
    ck_assert_msg(kern_graph_replay(gr, S) == 0, "replay: %s", reel_err_text());
    double *ref = dbuf(dim), *xr = dbuf(n);
    timestep_ref(0.6f, dim, ref);
    expect_close("replayed timestep_embed", F(&emb), ref, dim, 2.5e-7, 0, NULL, "2.5e-7 absolute");
    for (int64_t i = 0; i < n; i++) xr[i] = x0[i] + ((double)0.55f - (double)0.6f) * F(&v)[i];
    expect_close("replayed euler", F(&x), xr, n, 1e-6, 1e-6, NULL, "1e-6 * (1 + |ref|)");
    kern_graph_destroy(&gr);
}
END_TEST

/* The SDPA path asked for by name runs, on the CPU, the fused kernel: the
 * reference a library's fused attention is checked against (bit for bit). */
START_TEST(test_attention_sdpa_path_on_the_cpu_is_the_fused_kernel_bit_for_bit) {
    const int64_t nq = 37, nk = 53, H = 3, d = 16;
    kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d);
    kern_tensor_t o1 = T2(nq, H * d), o2 = T2(nq, H * d);
    fill(&q, -2, 2);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    kern_attn_opts_t sdpa = { KERN_ATTN_SDPA, 0, false }, fused = { KERN_ATTN_FUSED, 0, false };
    kern_attn_plan_t p;
    ck_assert_msg(kern_attention_plan(KERN_BACKEND_CPU, KERN_F32, nq, nk, H, d, &sdpa, &p) == 0,
                  "plan: %s", reel_err_text());
    ck_assert_int_eq(p.path, KERN_ATTN_SDPA);
    ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o1, &sdpa) == 0, "sdpa: %s", reel_err_text());
    ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &o2, &fused) == 0, "fused: %s", reel_err_text());
    ck_assert_msg(memcmp(F(&o1), F(&o2), kern_tensor_bytes(&o1)) == 0,
                  "SDPA on the CPU differs from the fused kernel");
    for (int64_t nqs = 1; nqs < 5000; nqs *= 7)
        ck_assert_int_ne(kern_attention_pick(nqs, 4096, 128), KERN_ATTN_SDPA);
}
END_TEST

/* A fused SDPA that fails when it runs (cuDNN with no plan for a shape):
 * the CPU's SDPA kernel is swapped for one that fails as cuDNN would, and
 * put back in teardown. */
static kern_impl_t sdpa_saved;
static bool sdpa_swapped;
static int fake_sdpa_calls;
static reel_code_t fake_sdpa_code = REEL_E_DEVICE;

static int fake_sdpa(void *ctx, const void *args) {
    (void)ctx;
    (void)args;
    fake_sdpa_calls++;
    return reel_fail(fake_sdpa_code, "fake cuDNN: no engine config finalized for this shape");
}

static void swap_in_failing_sdpa(reel_code_t code) {
    const kern_impl_t *cur = kern_registry_lookup(KERN_OP_ATTENTION_SDPA, KERN_BACKEND_CPU, KERN_F32);
    ck_assert_ptr_nonnull(cur);
    if (!sdpa_swapped) sdpa_saved = *cur;
    kern_impl_t fake = sdpa_saved;
    fake.name = "fake_failing_sdpa";
    fake.fn = fake_sdpa;
    fake.workspace_bytes = NULL;
    ck_assert_int_eq(kern_registry_register(&fake), 0);
    sdpa_swapped = true;
    fake_sdpa_calls = 0;
    fake_sdpa_code = code;
}

static void restore_sdpa(void) {
    if (sdpa_swapped) (void)kern_registry_register(&sdpa_saved);
    sdpa_swapped = false;
    kern_attention_sdpa_forget();
}

/* What the process writes to stderr while fn runs, into buf. */
static void stderr_of(void (*fn)(void *), void *arg, char *buf, size_t len) {
    char path[] = "/tmp/reel-stderr-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    ck_assert_int_ge(saved, 0);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, buf, len - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
}

typedef struct {
    kern_tensor_t *q, *k, *v, *o;
    int64_t H;
    kern_attn_opts_t opts;
    int rc;
} attn_call_t;

static void attn_call(void *arg) {
    attn_call_t *c = arg;
    c->rc = kern_attention_ex(S, c->q, c->k, c->v, c->H, c->o, &c->opts);
}

/* The fallback runs the decomposition within its bound, bit for bit what
 * the decomposition gives when asked for by name; the failure is logged
 * once per shape with the library's message, counted every time, and
 * remembered, so AUTO on CUDA takes the decomposition for that shape and
 * says why (other shapes keep SDPA). A plan that may fall back reserves
 * the decomposition's scratch. */
START_TEST(test_a_failing_sdpa_falls_back_to_the_decomposition_and_the_shape_remembers) {
    const int64_t nq = 300, nk = 4096, H = 2, d = 16;
    kern_attention_sdpa_forget();
    swap_in_failing_sdpa(REEL_E_DEVICE);
    kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d);
    kern_tensor_t o = T2(nq, H * d), ref = T2(nq, H * d);
    fill(&q, -2, 2);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    kern_attn_opts_t dec = { .path = KERN_ATTN_DECOMPOSED, .block_bytes = KERN_ATTN_BLOCK_BYTES_CPU };
    ck_assert_msg(kern_attention_ex(S, &q, &k, &v, H, &ref, &dec) == 0, "decomposed: %s", reel_err_text());

    kern_attn_plan_t p, pd;
    kern_attn_opts_t fb = { .path = KERN_ATTN_SDPA, .fallback = true };
    ck_assert_int_eq(kern_attention_plan(KERN_BACKEND_CPU, KERN_F32, nq, nk, H, d, &fb, &p), 0);
    ck_assert_int_eq(kern_attention_plan(KERN_BACKEND_CPU, KERN_F32, nq, nk, H, d, &dec, &pd), 0);
    ck_assert(p.path == KERN_ATTN_SDPA && p.fallback);
    ck_assert_uint_ge(p.scratch_bytes, pd.scratch_bytes);

    char err[2048];
    attn_call_t c = { &q, &k, &v, &o, H, fb, -1 };
    stderr_of(attn_call, &c, err, sizeof err);
    ck_assert_msg(c.rc == 0, "fallback: %s", reel_err_text());
    ck_assert_int_eq(fake_sdpa_calls, 1);
    ck_assert_msg(memcmp(F(&o), F(&ref), kern_tensor_bytes(&o)) == 0, "the fallback differs from the decomposition");
    ck_assert_msg(strstr(err, "cuDNN's fused SDPA failed for nq=300 nk=4096 heads=2 d=16: fake cuDNN: no engine "
                              "config finalized for this shape; this shape runs the decomposition") != NULL,
                  "stderr: %s", err);
    ck_assert_uint_eq(kern_attention_sdpa_fallbacks(), 1);
    char why[256];
    ck_assert(kern_attention_sdpa_failed(nq, nk, d, why, sizeof why));
    ck_assert_str_eq(why, "fake cuDNN: no engine config finalized for this shape");
    ck_assert(!kern_attention_sdpa_failed(nq + 1, nk, d, NULL, 0));

    /* again: counted, not logged again */
    memset(F(&o), 0, kern_tensor_bytes(&o));
    stderr_of(attn_call, &c, err, sizeof err);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_str_eq(err, "");
    ck_assert_uint_eq(kern_attention_sdpa_fallbacks(), 2);
    ck_assert_msg(memcmp(F(&o), F(&ref), kern_tensor_bytes(&o)) == 0, "the second fallback differs");

    /* AUTO on CUDA in BF16: the failed shape takes the decomposition and says why */
    kern_attn_mode_t mode = kern_attention_mode();
    kern_attention_set_mode(KERN_ATTN_MODE_AUTO);
    kern_attention_set_sdpa_ready(true, NULL);
    if (kern_registry_lookup(KERN_OP_ATTENTION_SDPA, KERN_BACKEND_CUDA, KERN_BF16)) {
        const char *w = NULL;
        ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CUDA, KERN_BF16, nq, nk, d, &w), KERN_ATTN_DECOMPOSED);
        ck_assert_str_eq(w, "cuDNN's fused SDPA failed for this shape: fake cuDNN: no engine config finalized "
                            "for this shape");
        ck_assert_int_eq(kern_attention_choose(KERN_BACKEND_CUDA, KERN_BF16, nq, nk + 8, d, &w), KERN_ATTN_SDPA);
    }
    kern_attention_set_sdpa_ready(false, "no CUDA backend has come up in this process");
    kern_attention_set_mode(mode);
    restore_sdpa();
}
END_TEST

/* Without leave to fall back (SDPA asked for by name) the failure is the
 * caller's, with the library's message, and nothing is remembered; a shape
 * first met inside a capture (code state: the capture is tried again after
 * an eager run) never falls back. */
START_TEST(test_sdpa_by_name_or_in_a_capture_does_not_fall_back) {
    const int64_t nq = 37, nk = 53, H = 3, d = 16;
    kern_attention_sdpa_forget();
    kern_tensor_t q = T2(nq, H * d), k = T2(nk, H * d), v = T2(nk, H * d), o = T2(nq, H * d);
    fill(&q, -2, 2);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    swap_in_failing_sdpa(REEL_E_DEVICE);
    kern_attn_opts_t named = { .path = KERN_ATTN_SDPA };
    ck_assert_int_eq(kern_attention_ex(S, &q, &k, &v, H, &o, &named), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_DEVICE);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "fake cuDNN"));
    ck_assert(!kern_attention_sdpa_failed(nq, nk, d, NULL, 0));
    ck_assert_uint_eq(kern_attention_sdpa_fallbacks(), 0);
    swap_in_failing_sdpa(REEL_E_STATE);
    kern_attn_opts_t fb = { .path = KERN_ATTN_SDPA, .fallback = true };
    ck_assert_int_eq(kern_attention_ex(S, &q, &k, &v, H, &o, &fb), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_STATE);
    ck_assert_int_eq(fake_sdpa_calls, 1);
    ck_assert(!kern_attention_sdpa_failed(nq, nk, d, NULL, 0));
    restore_sdpa();
    /* put back: SDPA on the CPU is the fused kernel again */
    ck_assert_int_eq(kern_attention_ex(S, &q, &k, &v, H, &o, &fb), 0);
}
END_TEST

/* --- fused ops: bit for bit the unfused sequences ---------------------- */

/* Fails unless the n floats at a and b are the same bits, naming the first
 * element that differs. */
static void expect_same_bits(const char *what, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&a[i], &b[i], sizeof(float)) == 0,
                      "%s: element %lld is %.9g fused, %.9g unfused (must be the same bits)",
                      what, (long long)i, (double)a[i], (double)b[i]);
}

/* The CPU GEMM_GELU is the reference the step's CPU results (and the numpy
 * crosscheck) rest on: it must be exactly GEMM then GELU_TANH, with and
 * without a bias, at a size OpenBLAS splits across threads too. */
START_TEST(test_gemm_gelu_is_bitwise_gemm_then_gelu_tanh) {
    const int64_t cases[][3] = { { 37, 29, 53 }, { 1, 64, 256 }, { 300, 256, 384 } };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int bias = 0; bias < 2; bias++) {
            const int64_t M = cases[c][0], Nn = cases[c][1], K = cases[c][2];
            kern_tensor_t x = T2(M, K), w = T2(Nn, K), b = T1(Nn), y = T2(M, Nn), u = T2(M, Nn);
            fill(&x, -2, 2);
            fill(&w, -0.3f, 0.3f);
            fill(&b, -1, 1);
            ck_assert_msg(kern_gemm_gelu(S, &x, &w, bias ? &b : NULL, &y) == 0, "gemm_gelu: %s",
                          reel_err_text());
            ck_assert_msg(kern_gemm(S, &x, &w, bias ? &b : NULL, &u) == 0, "gemm: %s", reel_err_text());
            ck_assert_msg(kern_gelu_tanh(S, &u, &u) == 0, "gelu: %s", reel_err_text());
            char what[80];
            snprintf(what, sizeof what, "gemm_gelu M=%lld N=%lld K=%lld%s", (long long)M,
                     (long long)Nn, (long long)K, bias ? " +bias" : "");
            expect_same_bits(what, F(&y), F(&u), M * Nn);
        }
}
END_TEST

/* The pool (kernels/cpu/cpu_pool.h) may cut a GEMM into column slices and
 * run attention's heads side by side, differently for each pool size, and
 * a pool with more threads than a GEMM has tiles cuts its tiles where
 * OpenBLAS computes the parts alike; the bits must not move. Each op at
 * the model's shapes (tiny, small, the wan2.1-1.3b widths) on pools of 1,
 * 2, 3, 5 and 16 threads, against the same op on one thread. */
static void each_pool_size(void (*run)(float *out, void *ctx), void *ctx, int64_t n, const char *what) {
    float *ref = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    ck_assert(ref && got);
    kern_cpu_threads_set(1);
    ck_assert_int_eq(kern_cpu_threads(), 1);
    run(ref, ctx);
    static const int sizes[] = { 2, 3, 5, 16 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        kern_cpu_threads_set(sizes[i]);
        ck_assert_int_eq(kern_cpu_threads(), sizes[i]);
        memset(got, 0xff, (size_t)n * 4);
        run(got, ctx);
        char msg[160];
        snprintf(msg, sizeof msg, "%s on %d threads against 1", what, sizes[i]);
        /* memcmp first: an assertion per element is slow in Check */
        if (memcmp(got, ref, (size_t)n * 4) != 0) expect_same_bits(msg, got, ref, n);
    }
    kern_cpu_threads_set(0);
    free(ref);
    free(got);
}

typedef struct { kern_tensor_t x, w, b, y; bool gelu, bias; } gemm_case_t;

static void run_gemm(float *out, void *ctx) {
    gemm_case_t *c = ctx;
    int rc = c->gelu ? kern_gemm_gelu(S, &c->x, &c->w, c->bias ? &c->b : NULL, &c->y)
                     : kern_gemm(S, &c->x, &c->w, c->bias ? &c->b : NULL, &c->y);
    ck_assert_msg(rc == 0, "gemm: %s", reel_err_text());
    memcpy(out, F(&c->y), kern_tensor_bytes(&c->y));
}

START_TEST(test_gemm_bits_do_not_depend_on_the_pool_size) {
    const int64_t cases[][3] = { { 256, 384, 384 }, { 256, 1024, 384 }, { 256, 384, 1024 }, { 32, 64, 64 },
                                 { 16, 768, 384 }, { 130, 1536, 1536 }, { 64, 8960, 1536 }, { 77, 200, 129 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t M = cases[i][0], Nn = cases[i][1], K = cases[i][2];
        gemm_case_t c = { .x = T2(M, K), .w = T2(Nn, K), .b = T1(Nn), .y = T2(M, Nn) };
        fill(&c.x, -2, 2);
        fill(&c.w, -0.3f, 0.3f);
        fill(&c.b, -1, 1);
        for (int v = 0; v < 3; v++) {
            c.gelu = v == 2;
            c.bias = v != 0;
            char what[96];
            snprintf(what, sizeof what, "%s M=%lld N=%lld K=%lld%s", c.gelu ? "gemm_gelu" : "gemm", (long long)M,
                     (long long)Nn, (long long)K, c.bias ? " +bias" : "");
            each_pool_size(run_gemm, &c, M * Nn, what);
        }
    }
}
END_TEST

/* A 256-token model's GEMMs on a pool of 16: 6 and 16 tiles, fewer than
 * the threads, so each tile is cut where OpenBLAS computes its parts
 * bitwise as the whole (ops_gemm.c): the results are the pool of one's,
 * bit for bit, whatever OpenBLAS answered, and a yes was acted on. */
START_TEST(test_gemm_tiles_cut_for_idle_threads_keep_the_bits) {
    const int64_t cases[][3] = { { 256, 384, 384 }, { 256, 1024, 384 }, { 256, 384, 1024 }, { 512, 384, 384 } };
    uint64_t runs0, runs1;
    int yes0, no0, yes1, no1;
    kern_cpu_gemm_split_forget(); /* asked afresh here, whatever ran before in this process */
    kern_cpu_gemm_split_stats(&runs0, &yes0, &no0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t M = cases[i][0], Nn = cases[i][1], K = cases[i][2];
        gemm_case_t c = { .x = T2(M, K), .w = T2(Nn, K), .b = T1(Nn), .y = T2(M, Nn), .bias = true };
        fill(&c.x, -2, 2);
        fill(&c.w, -0.3f, 0.3f);
        fill(&c.b, -1, 1);
        float *ref = malloc((size_t)(M * Nn) * 4), *got = malloc((size_t)(M * Nn) * 4);
        ck_assert(ref && got);
        for (int v = 0; v < 3; v++) {
            c.gelu = v == 2;
            c.bias = v != 0;
            kern_cpu_threads_set(1);
            run_gemm(ref, &c);
            kern_cpu_threads_set(16);
            uint64_t before, after;
            int y, n;
            kern_cpu_gemm_split_stats(&before, &y, &n);
            memset(got, 0xff, (size_t)(M * Nn) * 4);
            run_gemm(got, &c);
            kern_cpu_gemm_split_stats(&after, &y, &n);
            char what[128];
            snprintf(what, sizeof what, "%s M=%lld N=%lld K=%lld%s on 16 threads (%s) against 1",
                     c.gelu ? "gemm_gelu" : "gemm", (long long)M, (long long)Nn, (long long)K,
                     c.bias ? " +bias" : "", after > before ? "tiles cut" : "tiles whole");
            if (memcmp(got, ref, (size_t)(M * Nn) * 4) != 0) expect_same_bits(what, got, ref, M * Nn);
        }
        kern_cpu_threads_set(0);
        free(ref);
        free(got);
    }
    kern_cpu_gemm_split_stats(&runs1, &yes1, &no1);
    /* every (tile, split) shape above was asked about, once */
    ck_assert_int_ge(yes1 + no1 - yes0 - no0, 1);
    if (yes1 > yes0) ck_assert_msg(runs1 > runs0, "OpenBLAS said yes to %d splits, and no GEMM was cut", yes1 - yes0);
    else ck_assert_msg(runs1 == runs0, "OpenBLAS said no to every split, and %llu GEMMs were cut anyway",
                       (unsigned long long)(runs1 - runs0));
    printf("test_ops_cpu: OpenBLAS (%s) computes a cut tile bitwise the whole for %d of %d (tile, split) shapes\n",
           openblas_get_corename(), yes1 - yes0, yes1 + no1 - yes0 - no0);
}
END_TEST

/* A replay asks OpenBLAS nothing (a captured step allocates nothing): a
 * GEMM, and an attention call, captured before any answer was kept replay
 * their tiles and blocks whole on 16 threads, the same bits, and ask
 * nothing; once an eager run has asked, the replay acts on the answer. */
START_TEST(test_replay_asks_nothing_of_openblas) {
    const int64_t M = 256, Nn = 384, K = 384;
    kern_tensor_t x = T2(M, K), w = T2(Nn, K), b = T1(Nn), y = T2(M, Nn);
    fill(&x, -2, 2);
    fill(&w, -0.3f, 0.3f);
    fill(&b, -1, 1);
    float *ref = malloc((size_t)(M * Nn) * 4);
    ck_assert(ref);
    kern_cpu_threads_set(1);
    ck_assert_int_eq(kern_gemm(S, &x, &w, &b, &y), 0);
    memcpy(ref, F(&y), (size_t)(M * Nn) * 4);
    kern_cpu_threads_set(16);
    kern_cpu_gemm_split_forget();
    ck_assert_int_eq(kern_capture_begin(S), 0);
    ck_assert_int_eq(kern_gemm(S, &x, &w, &b, &y), 0);
    kern_graph_t *g = NULL;
    ck_assert_int_eq(kern_capture_end(S, &g), 0);
    uint64_t runs0, runs1, runs2;
    int yes, no;
    kern_cpu_gemm_split_stats(&runs0, &yes, &no);
    memset(F(&y), 0xff, (size_t)(M * Nn) * 4);
    ck_assert_int_eq(kern_graph_replay(g, S), 0);
    kern_cpu_gemm_split_stats(&runs1, &yes, &no);
    ck_assert_msg(yes == 0 && no == 0, "a replay asked OpenBLAS about %d splits", yes + no);
    ck_assert_msg(runs1 == runs0, "a replay cut tiles without an answer");
    if (memcmp(F(&y), ref, (size_t)(M * Nn) * 4) != 0) expect_same_bits("replay, tiles whole", F(&y), ref, M * Nn);
    ck_assert_int_eq(kern_gemm(S, &x, &w, &b, &y), 0); /* eager: asks */
    kern_cpu_gemm_split_stats(&runs1, &yes, &no);
    ck_assert_int_eq(yes + no, 1);
    memset(F(&y), 0xff, (size_t)(M * Nn) * 4);
    ck_assert_int_eq(kern_graph_replay(g, S), 0);
    kern_cpu_gemm_split_stats(&runs2, &yes, &no);
    ck_assert_int_eq(yes + no, 1);
    ck_assert_msg((runs2 > runs1) == (yes == 1), "the replay %s though OpenBLAS said %s",
                  runs2 > runs1 ? "cut its tiles" : "kept its tiles whole", yes ? "yes" : "no");
    if (memcmp(F(&y), ref, (size_t)(M * Nn) * 4) != 0) expect_same_bits("replay after an answer", F(&y), ref, M * Nn);
    kern_graph_destroy(&g);
    free(ref);
    /* the same for attention's whole-row blocks */
    const int64_t nq = 256, H = 6, d = 64;
    kern_tensor_t q = T2(nq, H * d), k = T2(nq, H * d), v = T2(nq, H * d), o = T2(nq, H * d);
    fill(&q, -1, 1);
    fill(&k, -1, 1);
    fill(&v, -1, 1);
    kern_attn_opts_t opts = { KERN_ATTN_FUSED, 0, false };
    kern_attn_plan_t p = plan_of(nq, nq, H, d, &opts);
    ck_assert_int_eq(kern_stream_reserve(S, p.scratch_bytes), 0);
    float *aref = malloc((size_t)(nq * H * d) * 4);
    ck_assert(aref);
    kern_cpu_threads_set(1);
    ck_assert_int_eq(kern_attention_ex(S, &q, &k, &v, H, &o, &opts), 0);
    memcpy(aref, F(&o), (size_t)(nq * H * d) * 4);
    kern_cpu_threads_set(16);
    kern_cpu_attention_cut_forget();
    ck_assert_int_eq(kern_capture_begin(S), 0);
    ck_assert_int_eq(kern_attention_ex(S, &q, &k, &v, H, &o, &opts), 0);
    ck_assert_int_eq(kern_capture_end(S, &g), 0);
    kern_cpu_attention_cut_stats(&runs0, &yes, &no);
    memset(F(&o), 0xff, (size_t)(nq * H * d) * 4);
    ck_assert_int_eq(kern_graph_replay(g, S), 0);
    kern_cpu_attention_cut_stats(&runs1, &yes, &no);
    ck_assert_msg(yes == 0 && no == 0, "a replay asked OpenBLAS about %d attention cuts", yes + no);
    ck_assert_msg(runs1 == runs0, "a replay cut attention blocks without an answer");
    if (memcmp(F(&o), aref, (size_t)(nq * H * d) * 4) != 0)
        expect_same_bits("attention replay, blocks whole", F(&o), aref, nq * H * d);
    ck_assert_int_eq(kern_attention_ex(S, &q, &k, &v, H, &o, &opts), 0); /* eager: asks */
    kern_cpu_attention_cut_stats(&runs1, &yes, &no);
    ck_assert_int_eq(yes + no, 1);
    memset(F(&o), 0xff, (size_t)(nq * H * d) * 4);
    ck_assert_int_eq(kern_graph_replay(g, S), 0);
    kern_cpu_attention_cut_stats(&runs2, &yes, &no);
    ck_assert_msg((runs2 > runs1) == (yes == 1), "the attention replay %s though OpenBLAS said %s",
                  runs2 > runs1 ? "cut its blocks" : "kept its blocks whole", yes ? "yes" : "no");
    if (memcmp(F(&o), aref, (size_t)(nq * H * d) * 4) != 0)
        expect_same_bits("attention replay after an answer", F(&o), aref, nq * H * d);
    kern_graph_destroy(&g);
    kern_cpu_threads_set(0);
    free(aref);
}
END_TEST

typedef struct { kern_tensor_t q, k, v, o; int64_t H; } attn_case_t;

static void run_attention(float *out, void *ctx) {
    attn_case_t *c = ctx;
    kern_attn_opts_t opts = { KERN_ATTN_FUSED, 0, false };
    ck_assert_msg(kern_attention_ex(S, &c->q, &c->k, &c->v, c->H, &c->o, &opts) == 0, "attention: %s",
                  reel_err_text());
    memcpy(out, F(&c->o), kern_tensor_bytes(&c->o));
}

/* A 256-token model's self-attention on 16 threads: one whole-row block
 * a head, 6 items, so each block is cut where OpenBLAS computes a smaller
 * block's outputs bitwise as the whole's (ops_attention.c): the results
 * are the pool of one's, bit for bit, and a yes was acted on. */
START_TEST(test_attention_blocks_cut_for_idle_threads_keep_the_bits) {
    const int64_t cases[][4] = { { 256, 256, 6, 64 }, { 512, 512, 2, 64 }, { 256, 300, 3, 128 } };
    kern_cpu_attention_cut_forget();
    uint64_t runs0, runs1;
    int yes, no;
    kern_cpu_attention_cut_stats(&runs0, &yes, &no);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t nq = cases[i][0], nk = cases[i][1], H = cases[i][2], d = cases[i][3];
        attn_case_t c = { .q = T2(nq, H * d), .k = T2(nk, H * d), .v = T2(nk, H * d), .o = T2(nq, H * d), .H = H };
        fill(&c.q, -1, 1);
        fill(&c.k, -1, 1);
        fill(&c.v, -1, 1);
        kern_attn_opts_t opts = { KERN_ATTN_FUSED, 0, false };
        kern_attn_plan_t p = plan_of(nq, nk, H, d, &opts);
        ck_assert_int_eq(kern_stream_reserve(S, p.scratch_bytes), 0);
        float *ref = malloc((size_t)(nq * H * d) * 4), *got = malloc((size_t)(nq * H * d) * 4);
        ck_assert(ref && got);
        kern_cpu_threads_set(1);
        run_attention(ref, &c);
        kern_cpu_threads_set(16);
        uint64_t before, after;
        kern_cpu_attention_cut_stats(&before, &yes, &no);
        memset(got, 0xff, (size_t)(nq * H * d) * 4);
        run_attention(got, &c);
        kern_cpu_attention_cut_stats(&after, &yes, &no);
        char what[128];
        snprintf(what, sizeof what, "attention nq=%lld nk=%lld heads=%lld d=%lld on 16 threads (%s) against 1",
                 (long long)nq, (long long)nk, (long long)H, (long long)d, after > before ? "blocks cut" : "whole");
        if (memcmp(got, ref, (size_t)(nq * H * d) * 4) != 0) expect_same_bits(what, got, ref, nq * H * d);
        kern_cpu_threads_set(0);
        free(ref);
        free(got);
    }
    kern_cpu_attention_cut_stats(&runs1, &yes, &no);
    ck_assert_int_ge(yes + no, 1);
    if (yes > 0) ck_assert_msg(runs1 > runs0, "OpenBLAS said yes to %d cuts, and no attention was cut", yes);
    else ck_assert_msg(runs1 == runs0, "OpenBLAS said no to every cut, and %llu attention calls were cut anyway",
                       (unsigned long long)(runs1 - runs0));
    printf("test_ops_cpu: OpenBLAS (%s) computes a cut attention block bitwise the whole for %d of %d shapes\n",
           openblas_get_corename(), yes, yes + no);
}
END_TEST

/* A grouped GEMM (a batch's samples stacked, kern_gemm_grouped) on 16
 * threads: its tiles, fewer than 4 x 16, are cut within each group (rows
 * g·group on), the groups' edge tiles (300 = 256 + 44 rows, 200 = 3 x 64 +
 * 8 columns) whole; every group is the GEMM of its rows alone on one
 * thread, bit for bit, GELU or not. No other test cuts a grouped GEMM: a
 * sub-tile placed in the wrong group passed them all. */
START_TEST(test_grouped_gemm_tiles_cut_for_idle_threads_keep_each_group_its_own_bits) {
    static const int64_t shapes[][4] = { /* group rows, groups, K, N */
        { 256, 2, 384, 384 }, { 192, 3, 384, 384 }, { 300, 2, 384, 384 }, { 256, 2, 384, 200 } };
    uint64_t runs0, runs1;
    int yes, no;
    kern_cpu_gemm_split_forget();
    kern_cpu_gemm_split_stats(&runs0, &yes, &no);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t n = shapes[i][0], G = shapes[i][1], K = shapes[i][2], Nn = shapes[i][3], M = n * G;
        kern_tensor_t x = T2(M, K), w = T2(Nn, K), b = T1(Nn), y = T2(M, Nn);
        fill(&x, -2, 2);
        fill(&w, -0.3f, 0.3f);
        fill(&b, -1, 1);
        float *ref = malloc((size_t)(M * Nn) * 4);
        ck_assert(ref);
        for (int v = 0; v < 3; v++) {
            const bool gelu = v == 2;
            const kern_tensor_t *bias = v ? &b : NULL;
            kern_cpu_threads_set(1);
            for (int64_t g = 0; g < G; g++) {
                kern_tensor_t xg = kern_tensor_make(x.data, KERN_F32, x.device, 2, (const int64_t[]){ n, K });
                kern_tensor_t yg = kern_tensor_make(y.data, KERN_F32, y.device, 2, (const int64_t[]){ n, Nn });
                xg.offset = x.offset + (size_t)(g * n * K) * 4;
                yg.offset = y.offset + (size_t)(g * n * Nn) * 4;
                ck_assert_int_eq(gelu ? kern_gemm_gelu(S, &xg, &w, bias, &yg) : kern_gemm(S, &xg, &w, bias, &yg), 0);
            }
            memcpy(ref, F(&y), (size_t)(M * Nn) * 4);
            kern_cpu_threads_set(16);
            memset(F(&y), 0xff, (size_t)(M * Nn) * 4);
            ck_assert_int_eq(kern_gemm_grouped(S, &x, &w, bias, &y, n, gelu), 0);
            char what[128];
            snprintf(what, sizeof what, "grouped %s %lld x %lld rows N=%lld K=%lld%s on 16 threads against each group "
                     "alone on 1", gelu ? "gemm_gelu" : "gemm", (long long)G, (long long)n, (long long)Nn,
                     (long long)K, bias ? " +bias" : "");
            if (memcmp(F(&y), ref, (size_t)(M * Nn) * 4) != 0) expect_same_bits(what, F(&y), ref, M * Nn);
        }
        free(ref);
    }
    kern_cpu_threads_set(0);
    kern_cpu_gemm_split_stats(&runs1, &yes, &no);
    ck_assert_int_ge(yes + no, 1);
    if (yes > 0) ck_assert_msg(runs1 > runs0, "OpenBLAS said yes to %d splits, and no grouped GEMM was cut", yes);
}
END_TEST

/* A pool of 2 or 3 threads never cuts (ops_gemm.c, ops_attention.c:
 * CPU_CUT_MIN_THREADS), nor asks OpenBLAS whether it could, whatever the
 * tiles or items: the GEMMs of 1 to 7 tiles (small's output projection,
 * 256 x 64, is 1) and attention of 1 to 3 items, on which the cost model
 * alone would cut 1, 3 or 5 tiles on 2 threads and 1, 2, 4 or 7 on 3. */
START_TEST(test_pools_of_2_and_3_threads_never_cut) {
    static const int pools[] = { 2, 3 };
    kern_cpu_gemm_split_forget();
    kern_cpu_attention_cut_forget();
    uint64_t g0, g1, a0, a1;
    int gy, gn, ay, an;
    kern_cpu_gemm_split_stats(&g0, &gy, &gn);
    kern_cpu_attention_cut_stats(&a0, &ay, &an);
    for (int64_t tiles = 1; tiles <= 7; tiles++) {
        const int64_t M = 256, K = 384, Nn = 64 * tiles;
        kern_tensor_t x = T2(M, K), w = T2(Nn, K), b = T1(Nn), y = T2(M, Nn);
        fill(&x, -2, 2);
        fill(&w, -0.3f, 0.3f);
        fill(&b, -1, 1);
        for (size_t p = 0; p < sizeof pools / sizeof pools[0]; p++) {
            kern_cpu_threads_set(pools[p]);
            ck_assert_int_eq(kern_gemm(S, &x, &w, &b, &y), 0);
            kern_cpu_gemm_split_stats(&g1, &gy, &gn);
            ck_assert_msg(g1 == g0 && gy + gn == 0, "%d threads: a GEMM of %lld tiles was cut (%llu) or asked (%d)",
                          pools[p], (long long)tiles, (unsigned long long)(g1 - g0), gy + gn);
        }
    }
    for (int64_t H = 1; H <= 3; H++) {
        const int64_t nq = 256, d = 128;
        kern_tensor_t q = T2(nq, H * d), k = T2(nq, H * d), v = T2(nq, H * d), o = T2(nq, H * d);
        fill(&q, -1, 1);
        fill(&k, -1, 1);
        fill(&v, -1, 1);
        kern_attn_opts_t opts = { KERN_ATTN_FUSED, 0, false };
        kern_attn_plan_t pl = plan_of(nq, nq, H, d, &opts);
        ck_assert_int_eq(kern_stream_reserve(S, pl.scratch_bytes), 0);
        for (size_t p = 0; p < sizeof pools / sizeof pools[0]; p++) {
            kern_cpu_threads_set(pools[p]);
            ck_assert_int_eq(kern_attention_ex(S, &q, &k, &v, H, &o, &opts), 0);
            kern_cpu_attention_cut_stats(&a1, &ay, &an);
            ck_assert_msg(a1 == a0 && ay + an == 0, "%d threads: attention of %lld items was cut (%llu) or asked (%d)",
                          pools[p], (long long)H, (unsigned long long)(a1 - a0), ay + an);
        }
    }
    kern_cpu_threads_set(0);
}
END_TEST

/* Heads and query blocks side by side: the fused kernel's lanes (one block
 * per head at small sizes, two blocks a head at 1000 x 1048 queries x keys,
 * flash items at 1100 x 1000). */
START_TEST(test_attention_bits_do_not_depend_on_the_pool_size) {
    const int64_t cases[][4] = { { 256, 256, 6, 64 }, { 32, 32, 4, 16 }, { 1000, 1048, 3, 8 }, { 300, 16, 12, 128 },
                                 { 1100, 1000, 2, 16 } /* flash */, { 700, 16, 6, 64 } /* direct, 36 items */ };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t nq = cases[i][0], nk = cases[i][1], H = cases[i][2], d = cases[i][3];
        attn_case_t c = { .q = T2(nq, H * d), .k = T2(nk, H * d), .v = T2(nk, H * d), .o = T2(nq, H * d), .H = H };
        fill(&c.q, -2, 2);
        fill(&c.k, -1, 1);
        fill(&c.v, -1, 1);
        char what[96];
        snprintf(what, sizeof what, "attention nq=%lld nk=%lld H=%lld d=%lld", (long long)nq, (long long)nk,
                 (long long)H, (long long)d);
        each_pool_size(run_attention, &c, nq * H * d, what);
        ck_assert_msg(kern_stream_scratch_size(S) <= ((size_t)16 << 20), "%s: %zu bytes of scratch", what,
                      kern_stream_scratch_size(S));
    }
}
END_TEST

typedef struct { kern_tensor_t x, w, b, sh, sc, y, x2; int op; } rows_case_t;

/* Row-wise ops over 300 rows of 384 (chunked on the pool from 2^15
 * elements) and GELU/SiLU over 300·384 elements (blocks of 4096). */
static void run_rows(float *out, void *ctx) {
    rows_case_t *c = ctx;
    int rc = 0;
    switch (c->op) {
    case 0: rc = kern_layernorm(S, &c->x, &c->w, &c->b, 1e-6f, &c->y); break;
    case 1: rc = kern_rmsnorm(S, &c->x, &c->w, 1e-6f, &c->y); break;
    case 2: rc = kern_layernorm_modulate(S, &c->x, &c->sh, &c->sc, 1e-6f, &c->y); break;
    case 3: rc = kern_gelu_tanh(S, &c->x, &c->y); break;
    case 4: rc = kern_silu(S, &c->x, &c->y); break;
    case 5: /* in place on a copy: RMSNorm + RoPE over 5 x 6 x 10 tokens of 6 heads of 64 */
        memcpy(F(&c->x2), F(&c->x), kern_tensor_bytes(&c->x2));
        rc = kern_rmsnorm_rope3d(S, &c->x2, &c->w, 1e-6f, 6, 5, 6, 10);
        memcpy(F(&c->y), F(&c->x2), kern_tensor_bytes(&c->y));
        break;
    }
    ck_assert_msg(rc == 0, "row op %d: %s", c->op, reel_err_text());
    memcpy(out, F(&c->y), kern_tensor_bytes(&c->y));
}

START_TEST(test_row_wise_ops_bits_do_not_depend_on_the_pool_size) {
    const int64_t R = 300, D = 384;
    rows_case_t c = { .x = T2(R, D), .w = T1(D), .b = T1(D), .sh = T1(D), .sc = T1(D), .y = T2(R, D),
                      .x2 = T2(R, D) };
    fill(&c.x, -3, 3);
    fill(&c.w, 0.5f, 1.5f);
    fill(&c.b, -1, 1);
    fill(&c.sh, -1, 1);
    fill(&c.sc, -0.5f, 0.5f);
    static const char *names[] = { "layernorm", "rmsnorm", "layernorm_modulate", "gelu_tanh", "silu",
                                   "rmsnorm_rope3d" };
    for (c.op = 0; c.op < 6; c.op++) each_pool_size(run_rows, &c, R * D, names[c.op]);
}
END_TEST

/* LN(x)·(1 + scale) + shift fused against LAYERNORM (no affine) then
 * MODULATE in place, as the step ran them; inputs on an offset of 3, the
 * fused op out of place and in place (y == x). */
START_TEST(test_layernorm_modulate_is_bitwise_layernorm_then_modulate_in_and_out_of_place) {
    const int64_t cases[][2] = { { 13, 67 }, { 37, 24 }, { 4, 1536 }, { 3, 5 }, { 1, 1 } };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t rows = cases[c][0], D = cases[c][1];
        kern_tensor_t x = T2(rows, D), sh = T1(D), sc = T1(D), y = T2(rows, D), u = T2(rows, D);
        fill(&x, 2, 4);
        fill(&sh, -1, 1);
        fill(&sc, -1, 1);
        ck_assert_msg(kern_layernorm_modulate(S, &x, &sh, &sc, 1e-6f, &y) == 0,
                      "layernorm_modulate: %s", reel_err_text());
        ck_assert_msg(kern_layernorm(S, &x, NULL, NULL, 1e-6f, &u) == 0, "ln: %s", reel_err_text());
        ck_assert_msg(kern_modulate(S, &u, &sh, &sc, &u) == 0, "modulate: %s", reel_err_text());
        expect_same_bits("layernorm_modulate", F(&y), F(&u), rows * D);
        ck_assert_msg(kern_layernorm_modulate(S, &x, &sh, &sc, 1e-6f, &x) == 0,
                      "layernorm_modulate in place: %s", reel_err_text());
        expect_same_bits("layernorm_modulate in place", F(&x), F(&u), rows * D);
    }
}
END_TEST

/* RMSNorm over the whole row then 3-D RoPE per head, fused against the two
 * ops in the step's order, for head widths that split every way: 2 and 4
 * (frame only), 10 (6/2/2), 16, and Wan's 128 with 12 heads. */
START_TEST(test_rmsnorm_rope3d_is_bitwise_rmsnorm_then_rope3d_for_every_split) {
    const int64_t cases[][5] = { /* heads, d, frames, rows, cols */
        { 3, 16, 2, 3, 5 }, { 2, 10, 3, 2, 4 }, { 1, 4, 2, 2, 2 },
        { 4, 2, 1, 3, 3 },  { 12, 128, 2, 2, 3 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t H = cases[c][0], d = cases[c][1], Fr = cases[c][2], R = cases[c][3];
        const int64_t C = cases[c][4], T = Fr * R * C;
        kern_tensor_t x = T2(T, H * d), g = T1(H * d), u = T2(T, H * d);
        fill(&x, -3, 3);
        fill(&g, -1.5f, 1.5f);
        memcpy(F(&u), F(&x), kern_tensor_bytes(&x));
        ck_assert_msg(kern_rmsnorm_rope3d(S, &x, &g, 1e-6f, H, Fr, R, C) == 0,
                      "rmsnorm_rope3d: %s", reel_err_text());
        ck_assert_msg(kern_rmsnorm(S, &u, &g, 1e-6f, &u) == 0, "rmsnorm: %s", reel_err_text());
        ck_assert_msg(kern_rope3d(S, &u, H, Fr, R, C) == 0, "rope3d: %s", reel_err_text());
        char what[64];
        snprintf(what, sizeof what, "rmsnorm_rope3d heads=%lld d=%lld", (long long)H,
                 (long long)d);
        expect_same_bits(what, F(&x), F(&u), T * H * d);
    }
}
END_TEST

/* The (cos, sin) that 3-D RoPE turns pair jj of a head of width d by, for
 * a token at (f, h, w): the TINYDIT.md formula, in double. */
static void rope_cs(int64_t d, int64_t jj, int64_t f, int64_t h, int64_t w, double *c, double *s) {
    const int64_t q = d / 6, rf = d - 4 * q, rr = 2 * q;
    int64_t j = jj, r = rf, pos = f;
    if (jj >= rf / 2 + rr / 2) j = jj - rf / 2 - rr / 2, r = 2 * q, pos = w;
    else if (jj >= rf / 2) j = jj - rf / 2, r = rr, pos = h;
    const double th = (double)pos * pow(10000.0, -2.0 * (double)j / (double)r);
    *c = cos(th);
    *s = sin(th);
}

/* A pair whose turn nearly cancels (u·c ≈ w·s) shows in its float result
 * whether the product u·c was rounded to double before the subtraction:
 * GCC 12 made the AVX2 and AVX-512 builds of the fused kernel a fused
 * multiply-add-subtract there (cpu_arith.h, cpu_opaque). Rows are drawn
 * with such pairs (x_a ≈ x_b·s/c, weights 1) until at least 16 pairs'
 * results would differ under that fusion, and the fused kernel must equal
 * RMSNORM then ROPE3D and a reference that rounds every product. Head
 * width 18 takes 8 pairs a head through the vector loop and the ninth
 * alone. */
START_TEST(test_rmsnorm_rope3d_rounds_each_product_where_a_pair_nearly_cancels) {
    const int64_t H = 2, d = 18, Fr = 2, R = 2, C = 3, T = Fr * R * C, D = H * d;
    kern_tensor_t x = T2(T, D), g = T1(D), n = T2(T, D), u = T2(T, D);
    float *ref = hmalloc((size_t)(T * D) * sizeof(float));
    for (int64_t i = 0; i < D; i++) F(&g)[i] = 1.0f;
    int sharp = 0, trials = 0;
    for (; trials < 2000 && sharp < 16; trials++) {
        float *px = F(&x);
        for (int64_t t = 0; t < T; t++)
            for (int64_t hd = 0; hd < H; hd++)
                for (int64_t jj = 0; jj < d / 2; jj++) {
                    double c, sn;
                    rope_cs(d, jj, t / (R * C), t / C % R, t % C, &c, &sn);
                    float *pr = px + t * D + hd * d + 2 * jj;
                    pr[1] = uniform(0.5f, 1.0f);
                    pr[0] = fabs(c) > 1e-3 ? (float)(pr[1] * sn / c) : uniform(-1.0f, 1.0f);
                    for (int k = (int)uniform(-4.0f, 4.0f); k != 0; k += k > 0 ? -1 : 1)
                        pr[0] = nextafterf(pr[0], k > 0 ? INFINITY : -INFINITY);
                }
        ck_assert_msg(kern_rmsnorm(S, &x, &g, 1e-6f, &n) == 0, "rmsnorm: %s", reel_err_text());
        int here = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t hd = 0; hd < H; hd++)
                for (int64_t jj = 0; jj < d / 2; jj++) {
                    double c, sn;
                    rope_cs(d, jj, t / (R * C), t / C % R, t % C, &c, &sn);
                    const int64_t i = t * D + hd * d + 2 * jj;
                    const double du = F(&n)[i], dw = F(&n)[i + 1];
                    volatile double uc = du * c, ws = dw * sn, us = du * sn, wc = dw * c;
                    ref[i] = (float)(uc - ws);
                    ref[i + 1] = (float)(us + wc);
                    if ((float)fma(du, c, -ws) != ref[i] || (float)fma(du, sn, wc) != ref[i + 1]) here++;
                }
        if (!here) continue;
        sharp += here;
        memcpy(F(&u), F(&n), kern_tensor_bytes(&n));
        ck_assert_msg(kern_rmsnorm_rope3d(S, &x, &g, 1e-6f, H, Fr, R, C) == 0, "rmsnorm_rope3d: %s",
                      reel_err_text());
        ck_assert_msg(kern_rope3d(S, &u, H, Fr, R, C) == 0, "rope3d: %s", reel_err_text());
        expect_same_bits("rmsnorm_rope3d against products rounded one by one", F(&x), ref, T * D);
        expect_same_bits("rope3d against products rounded one by one", F(&u), ref, T * D);
    }
    ck_assert_msg(sharp >= 16, "only %d pairs in %d draws would show a fused multiply-add", sharp, trials);
}
END_TEST

/* The step workspace reserves ROPE3D's scratch contract (model/
 * step.c) and runs RMSNORM_ROPE3D in it: the two must ask for the same. */
START_TEST(test_rmsnorm_rope3d_asks_for_exactly_the_scratch_of_rope3d) {
    const kern_impl_t *fused = kern_registry_lookup(KERN_OP_RMSNORM_ROPE3D, KERN_BACKEND_CPU,
                                                    KERN_F32);
    const kern_impl_t *rope = kern_registry_lookup(KERN_OP_ROPE3D, KERN_BACKEND_CPU, KERN_F32);
    ck_assert_ptr_nonnull(fused);
    ck_assert_ptr_nonnull(rope);
    ck_assert_ptr_nonnull(fused->workspace_bytes);
    ck_assert_ptr_nonnull(rope->workspace_bytes);
    const int64_t cases[][5] = { { 4, 16, 2, 4, 6 }, { 12, 128, 21, 30, 52 }, { 2, 2, 1, 1, 1 } };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kern_rope3d_args_t r;
        kern_rmsnorm_rope_args_t f;
        memset(&r, 0, sizeof r);
        memset(&f, 0, sizeof f);
        r.heads = f.heads = cases[c][0];
        r.head_dim = f.head_dim = cases[c][1];
        r.frames = f.frames = cases[c][2];
        r.rows = f.rows = cases[c][3];
        r.cols = f.cols = cases[c][4];
        ck_assert_uint_eq(fused->workspace_bytes(&f), rope->workspace_bytes(&r));
    }
}
END_TEST

/* Bad inputs fail with a message naming the fused op and the tensor. */
/* x += gate·y then LN(x) modulated, affine (weight and bias, weight
 * alone) or plain, fused against GATED_RESIDUAL then LAYERNORM_MODULATE or
 * LAYERNORM as the step ran them: x and out bit for bit, gated or not, for
 * rows of 67, Wan's 1536, 5 and 1. */
START_TEST(test_residual_norm_is_bitwise_gated_residual_then_the_layernorm) {
    const int64_t cases[][2] = { { 13, 67 }, { 37, 24 }, { 4, 1536 }, { 3, 5 }, { 1, 1 } };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t rows = cases[c][0], D = cases[c][1];
        kern_tensor_t x0 = T2(rows, D), y = T2(rows, D), g = T1(D), p0 = T1(D), p1 = T1(D);
        kern_tensor_t x = T2(rows, D), xu = T2(rows, D), out = T2(rows, D), u = T2(rows, D);
        for (int gated = 0; gated < 2; gated++)
            for (int form = 0; form < 4; form++) { /* modulate, weight + bias, weight, plain */
                fill(&x0, 2, 4);
                fill(&y, -1, 1);
                fill(&g, -1, 1);
                fill(&p0, -1, 1);
                fill(&p1, -1, 1);
                memcpy(F(&x), F(&x0), kern_tensor_bytes(&x));
                memcpy(F(&xu), F(&x0), kern_tensor_bytes(&x));
                const kern_tensor_t *gp = gated ? &g : NULL, *w = form == 1 || form == 2 ? &p0 : NULL,
                                    *b = form == 1 ? &p1 : NULL;
                if (form == 0) TS_OK(kern_residual_layernorm_modulate(S, &x, &y, gp, &p0, &p1, 1e-6f, &out));
                else TS_OK(kern_residual_layernorm(S, &x, &y, gp, w, b, 1e-6f, &out));
                TS_OK(kern_gated_residual(S, &xu, &y, gp));
                if (form == 0) TS_OK(kern_layernorm_modulate(S, &xu, &p0, &p1, 1e-6f, &u));
                else TS_OK(kern_layernorm(S, &xu, w, b, 1e-6f, &u));
                char what[96];
                snprintf(what, sizeof what, "residual_norm %lldx%lld %s form %d", (long long)rows, (long long)D,
                         gated ? "gated" : "plain", form);
                expect_same_bits(what, F(&x), F(&xu), rows * D);
                expect_same_bits(what, F(&out), F(&u), rows * D);
            }
    }
}
END_TEST

/* Out on top of x or y is refused (the fused pass reads them while it
 * writes out), as are a missing shift, a bias without a weight and a
 * gate of the wrong width; x is left as it was. */
START_TEST(test_residual_norm_refuses_aliasing_and_bad_shapes_and_leaves_x) {
    kern_tensor_t x = T2(4, 24), y = T2(4, 24), out = T2(4, 24), d24 = T1(24), d7 = T1(7);
    fill(&x, -1, 1);
    fill(&y, -1, 1);
    float *x0 = snapshot(&x);
    const struct { int rc; const char *want; } want[] = {
        { kern_residual_layernorm_modulate(S, &x, &y, NULL, &d24, &d24, 1e-6f, &x), "overlaps" },
        { kern_residual_layernorm(S, &x, &y, NULL, NULL, NULL, 1e-6f, &y), "overlaps" },
        { kern_residual_layernorm_modulate(S, &x, &y, NULL, NULL, &d24, 1e-6f, &out), "shift" },
        { kern_residual_layernorm(S, &x, &y, NULL, NULL, &d24, 1e-6f, &out), "bias without weight" },
        { kern_residual_layernorm(S, &x, &y, &d7, NULL, NULL, 1e-6f, &out), "gate" },
        { kern_residual_layernorm(S, &x, &y, NULL, NULL, NULL, 0.0f, &out), "eps" },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) ck_assert_int_eq(want[i].rc, -1);
    /* each message, one at a time (the error value is the last call's) */
    reel_err_clear();
    ck_assert_int_eq(kern_residual_layernorm_modulate(S, &x, &y, NULL, &d24, &d24, 1e-6f, &x), -1);
    ck_assert_msg(strstr(reel_err_text(), "residual_layernorm_modulate: out overlaps"), "'%s'", reel_err_text());
    ck_assert_int_eq(kern_residual_layernorm(S, &x, &y, NULL, NULL, &d24, 1e-6f, &out), -1);
    ck_assert_msg(strstr(reel_err_text(), "bias without weight"), "'%s'", reel_err_text());
    ck_assert_int_eq(kern_residual_layernorm(S, &x, &y, &d7, NULL, NULL, 1e-6f, &out), -1);
    ck_assert_msg(strstr(reel_err_text(), "residual_layernorm") && strstr(reel_err_text(), "gate"), "'%s'",
                  reel_err_text());
    ck_assert_msg(memcmp(F(&x), x0, kern_tensor_bytes(&x)) == 0, "a refused call changed x");
}
END_TEST

START_TEST(test_fused_ops_reject_bad_shapes_with_a_message_naming_the_op) {
    kern_tensor_t x = T2(12, 24), w = T2(8, 20), y = T2(12, 8), d24 = T1(24), d7 = T1(7);
    reel_err_clear();
    ck_assert_int_eq(kern_gemm_gelu(S, &x, &w, NULL, &y), -1);
    ck_assert_msg(strstr(reel_err_text(), "gemm_gelu") && strstr(reel_err_text(), "w"), "'%s'",
                  reel_err_text());
    reel_err_clear();
    ck_assert_int_eq(kern_layernorm_modulate(S, &x, &d7, &d24, 1e-6f, &x), -1);
    ck_assert_msg(strstr(reel_err_text(), "layernorm_modulate") && strstr(reel_err_text(), "shift"),
                  "'%s'", reel_err_text());
    reel_err_clear();
    ck_assert_int_eq(kern_rmsnorm_rope3d(S, &x, &d7, 1e-6f, 2, 2, 2, 3), -1);
    ck_assert_msg(strstr(reel_err_text(), "rmsnorm_rope3d") && strstr(reel_err_text(), "weight"),
                  "'%s'", reel_err_text());
    reel_err_clear();
    ck_assert_int_eq(kern_rmsnorm_rope3d(S, &x, &d24, 1e-6f, 2, 2, 2, 2), -1);
    ck_assert_msg(strstr(reel_err_text(), "rmsnorm_rope3d") && strstr(reel_err_text(), "x"), "'%s'",
                  reel_err_text());
    reel_err_clear();
    ck_assert_int_eq(kern_rmsnorm_rope3d(S, &x, &d24, 1e-6f, 5, 2, 2, 3), -1);
    ck_assert_msg(strstr(reel_err_text(), "head width"), "'%s'", reel_err_text());
}
END_TEST

/* The three fused ops recorded on a CPU stream: one node each, and every
 * replay gives the eager bits (the rope table lives in the arena, reserved
 * by the eager run). */
START_TEST(test_fused_ops_replay_bitwise_equal_to_eager_one_node_each) {
    const int64_t T = 12, D = 24, Fd = 40, H = 3; /* 12 tokens = 2 x 2 x 3, heads of 8 */
    kern_tensor_t x = T2(T, D), sh = T1(D), sc = T1(D), a = T2(T, D), w = T2(Fd, D), b = T1(Fd);
    kern_tensor_t h = T2(T, Fd), q = T2(T, D), q0 = T2(T, D), g = T1(D);
    fill(&x, -1, 1);
    fill(&sh, -1, 1);
    fill(&sc, -1, 1);
    fill(&w, -0.5f, 0.5f);
    fill(&b, -1, 1);
    fill(&q0, -2, 2);
    fill(&g, -1, 1);
    float *ea = NULL, *eh = NULL, *eq = NULL;
    for (int pass = 0; pass < 2; pass++) { /* 0: eager, 1: capture */
        memcpy(F(&q), F(&q0), kern_tensor_bytes(&q));
        memset(F(&a), 0, kern_tensor_bytes(&a));
        memset(F(&h), 0, kern_tensor_bytes(&h));
        if (pass == 1) ck_assert_msg(kern_capture_begin(S) == 0, "capture: %s", reel_err_text());
        TS_OK(kern_layernorm_modulate(S, &x, &sh, &sc, 1e-6f, &a));
        TS_OK(kern_gemm_gelu(S, &a, &w, &b, &h));
        TS_OK(kern_rmsnorm_rope3d(S, &q, &g, 1e-6f, H, 2, 2, 3));
        if (pass == 1) break;
        ea = snapshot(&a), eh = snapshot(&h), eq = snapshot(&q);
        ck_assert_msg(memcmp(eq, F(&q0), kern_tensor_bytes(&q)) != 0, "rmsnorm_rope3d did nothing");
    }
    kern_graph_t *gr = NULL;
    ck_assert_msg(kern_capture_end(S, &gr) == 0, "end capture: %s", reel_err_text());
    ck_assert_uint_eq(kern_graph_nodes(gr), 3);
    ck_assert_msg(memcmp(F(&q), F(&q0), kern_tensor_bytes(&q)) == 0,
                  "capture ran rmsnorm_rope3d instead of recording it");
    for (int rep = 0; rep < 2; rep++) {
        memset(F(&a), 0, kern_tensor_bytes(&a));
        memset(F(&h), 0, kern_tensor_bytes(&h));
        memcpy(F(&q), F(&q0), kern_tensor_bytes(&q));
        ck_assert_msg(kern_graph_replay(gr, S) == 0, "replay: %s", reel_err_text());
        expect_same_bits("replayed layernorm_modulate", F(&a), ea, T * D);
        expect_same_bits("replayed gemm_gelu", F(&h), eh, T * Fd);
        expect_same_bits("replayed rmsnorm_rope3d", F(&q), eq, T * D);
    }
    kern_graph_destroy(&gr);
}
END_TEST

/* --- registry --------------------------------------------------------- */

START_TEST(test_every_op_has_a_cpu_f32_kernel_and_only_sde_is_not_capturable) {
    for (int op = 0; op < KERN_OP_COUNT; op++) {
        const kern_impl_t *impl = kern_registry_lookup(op, KERN_BACKEND_CPU, KERN_F32);
        ck_assert_msg(impl != NULL, "no CPU F32 kernel for %s", kern_op_name(op));
        ck_assert_msg(impl->name && impl->name[0], "%s: kernel without a name", kern_op_name(op));
        ck_assert_msg(impl->args_size >= sizeof(kern_args_hdr_t), "%s: args_size %zu",
                      kern_op_name(op), impl->args_size);
        ck_assert_msg(impl->capturable == (op != KERN_OP_SDE), "%s: capturable is %d",
                      kern_op_name(op), impl->capturable);
    }
}
END_TEST

/* What the process looked like when main began (main records it, before
 * anything here starts a thread). */
static int threads_at_start = -1;
static int blas_server_at_start = -1; /* OpenBLAS's blas_server_avail; -1: this build has none */

static int threads_now(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "Threads:", 8)) n = atoi(line + 8);
    if (f) fclose(f);
    return n;
}

/* OpenBLAS's pthreads build starts cores - 1 threads as it loads, each
 * spinning on sched_yield for about 0.1 s; Reel never gives them work, so
 * its start stops them (ops_gemm.c): by main none is left, and OpenBLAS
 * is single-threaded. (Under TSan the sanitizer's own thread is there:
 * only OpenBLAS's state is checked.) */
START_TEST(test_openblas_starts_no_spinning_threads_of_its_own) {
    if (blas_server_at_start < 0) {
        fprintf(stderr, "SKIP openblas-threads: this OpenBLAS has no thread server (blas_server_avail)\n");
        return;
    }
    ck_assert_msg(blas_server_at_start == 0, "OpenBLAS's thread server was still running when main began");
    ck_assert_int_eq(openblas_get_num_threads(), 1);
#ifndef __SANITIZE_THREAD__
    ck_assert_msg(threads_at_start == 1, "%d threads when main began, expected 1 (OpenBLAS's not stopped)",
                  threads_at_start);
#endif
}
END_TEST

static Suite *ops_cpu_suite(void) {
    Suite *s = suite_create("ops_cpu");
    TCase *tc = tcase_create("ops");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_gemm_with_bias_matches_double_reference);
    tcase_add_test(tc, test_gemm_without_bias_matches_double_reference);
    tcase_add_test(tc, test_gemm_rejects_mismatched_k_with_a_message_naming_the_op);
    tcase_add_test(tc, test_attention_rejects_width_not_divisible_by_heads_naming_the_op);
    tcase_add_test(tc, test_layernorm_affine_matches_double_reference);
    tcase_add_test(tc, test_layernorm_plain_matches_double_reference);
    tcase_add_test(tc, test_layernorm_in_place_gives_the_same_bits_as_out_of_place);
    tcase_add_test(tc, test_layernorm_rows_across_statistics_chunks_match_reference);
    tcase_add_test(tc, test_rmsnorm_matches_double_reference);
    tcase_add_test(tc, test_norms_of_wan_width_rows_in_float_match_double_reference);
    tcase_add_test(tc, test_modulate_matches_double_reference);
    tcase_add_test(tc, test_gated_residual_with_gate_matches_double_reference);
    tcase_add_test(tc, test_gated_residual_without_gate_adds_y);
    tcase_add_test(tc, test_add_matches_double_reference);
    tcase_add_test(tc, test_gelu_tanh_matches_double_reference);
    tcase_add_test(tc, test_silu_matches_double_reference);
    tcase_add_test(tc, test_attention_matches_double_reference);
    tcase_add_test(tc, test_attention_over_long_sequence_matches_reference_with_bounded_scratch);
    tcase_add_test(tc, test_decomposed_attention_matches_double_reference_on_ragged_blocks);
    tcase_add_test(tc, test_decomposed_attention_with_a_single_key_returns_v_exactly);
    tcase_add_test(tc, test_decomposed_attention_agrees_with_the_fused_cpu_kernel);
    tcase_add_test(tc, test_attention_pick_rule_routes_by_scores_per_head_and_head_width);
    tcase_add_test(tc, test_attention_runs_the_path_its_rule_picks);
    tcase_add_test(tc, test_direct_attention_matches_double_reference_at_its_edges);
    tcase_add_test(tc, test_direct_attention_gives_a_row_the_same_bits_wherever_it_sits);
    tcase_add_test(tc, test_direct_attention_is_bitwise_the_row_major_kernel_it_replaced);
    tcase_add_test(tc, test_flash_attention_matches_double_reference_on_ragged_blocks);
    tcase_add_test(tc, test_flash_attention_rescales_when_a_later_key_block_holds_the_max);
    tcase_add_test(tc, test_flash_attention_replays_bitwise_equal_to_eager_in_its_bounded_scratch);
    tcase_add_test(tc, test_attention_plan_keeps_each_block_within_its_memory_bound);
    tcase_add_test(tc, test_attention_plan_rejects_bad_sizes_and_unknown_paths_with_a_message);
    tcase_add_test(tc, test_decomposed_attention_replays_bitwise_equal_to_eager_in_bound_scratch);
    tcase_add_test(tc, test_rope3d_matches_pairwise_rotation_reference);
    tcase_add_test(tc, test_rope3d_rotates_each_part_by_its_own_position_only);
    tcase_add_test(tc, test_rope3d_preserves_the_norm_of_every_pair);
    tcase_add_test(tc, test_patchify_places_each_value_by_the_c_ph_pw_index_formula);
    tcase_add_test(tc, test_unpatchify_places_each_value_by_the_ph_pw_c_index_formula);
    tcase_add_test(tc, test_timestep_embed_matches_double_formula);
    tcase_add_test(tc, test_cfg_combine_matches_double_reference);
    tcase_add_test(tc, test_euler_update_matches_double_reference);
    tcase_add_test(tc, test_sde_update_matches_double_reference);
    tcase_add_test(tc, test_sde_with_zero_eta_is_the_noiseless_euler_step);
    tcase_add_test(tc, test_sde_same_seed_gives_same_bits_and_other_seed_or_step_differs);
    tcase_add_test(tc, test_sde_refuses_to_launch_on_a_capturing_stream);
    tcase_add_test(tc, test_sde_dev_reads_eta_seed_and_step_from_memory_bitwise_equal_to_sde);
    tcase_add_test(tc, test_a_captured_sde_dev_replays_for_new_seeds_and_steps_written_between_replays);
    tcase_add_test(tc, test_cpu_capture_replays_bitwise_equal_to_eager_with_one_node_per_launch);
    tcase_add_test(tc, test_captured_timestep_and_euler_read_sigma_at_replay_time);
    tcase_add_test(tc, test_attention_sdpa_path_on_the_cpu_is_the_fused_kernel_bit_for_bit);
    tcase_add_test(tc, test_a_failing_sdpa_falls_back_to_the_decomposition_and_the_shape_remembers);
    tcase_add_test(tc, test_sdpa_by_name_or_in_a_capture_does_not_fall_back);
    tcase_add_test(tc, test_gemm_gelu_is_bitwise_gemm_then_gelu_tanh);
    tcase_add_test(tc, test_gemm_bits_do_not_depend_on_the_pool_size);
    tcase_add_test(tc, test_gemm_tiles_cut_for_idle_threads_keep_the_bits);
    tcase_add_test(tc, test_replay_asks_nothing_of_openblas);
    tcase_add_test(tc, test_attention_bits_do_not_depend_on_the_pool_size);
    tcase_add_test(tc, test_attention_blocks_cut_for_idle_threads_keep_the_bits);
    tcase_add_test(tc, test_grouped_gemm_tiles_cut_for_idle_threads_keep_each_group_its_own_bits);
    tcase_add_test(tc, test_pools_of_2_and_3_threads_never_cut);
    tcase_add_test(tc, test_row_wise_ops_bits_do_not_depend_on_the_pool_size);
    tcase_add_test(tc, test_layernorm_modulate_is_bitwise_layernorm_then_modulate_in_and_out_of_place);
    tcase_add_test(tc, test_rmsnorm_rope3d_is_bitwise_rmsnorm_then_rope3d_for_every_split);
    tcase_add_test(tc, test_rmsnorm_rope3d_rounds_each_product_where_a_pair_nearly_cancels);
    tcase_add_test(tc, test_rmsnorm_rope3d_asks_for_exactly_the_scratch_of_rope3d);
    tcase_add_test(tc, test_fused_ops_reject_bad_shapes_with_a_message_naming_the_op);
    tcase_add_test(tc, test_residual_norm_is_bitwise_gated_residual_then_the_layernorm);
    tcase_add_test(tc, test_residual_norm_refuses_aliasing_and_bad_shapes_and_leaves_x);
    tcase_add_test(tc, test_fused_ops_replay_bitwise_equal_to_eager_one_node_each);
    tcase_add_test(tc, test_every_op_has_a_cpu_f32_kernel_and_only_sde_is_not_capturable);
    tcase_add_test(tc, test_openblas_starts_no_spinning_threads_of_its_own);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    threads_at_start = threads_now();
    const int *avail = dlsym(RTLD_DEFAULT, "blas_server_avail");
    blas_server_at_start = avail ? *avail : -1;
    return ts_run(ops_cpu_suite());
}
