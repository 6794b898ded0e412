/* test_cuda.c -- every CUDA kernel against the CPU backend, and the CUDA
 * graph contract (capture, replay, refusal of non-capturable kernels).
 *
 * Without a usable GPU (or in a CUDA=0 build) the suite prints one line,
 * "test_cuda: SKIP: <reason>", and exits 0 without running anything.
 *
 * Each op runs on both backends on the same fixed-seed inputs; the CUDA
 * result y is compared with the CPU F32 result r by the normalised mean
 * squared error NMSE = Σ(y − r)² / Σr², at most 1e-6 for F32 and 1e-3 for
 * BF16. BF16 inputs are rounded to BF16 first and the CPU computes on their
 * exact F32 widening, so the BF16 error measured is the kernel's own (the
 * Wan-shaped attention states its own per-element BF16 bound). Every
 * op test runs twice (loop index 0: F32, 1: BF16). Only the public API
 * (ops.h, backend.h, registry.h) is used. Tests run in-process (CK_NOFORK):
 * a CUDA context does not survive fork(). */
#include <stdio.h>

#ifndef HAVE_CUDA
int main(void) {
    printf("test_cuda: SKIP: built without CUDA (CUDA=0)\n");
    return 0;
}
#else

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/tdit_program.h"
#include "tests/row_groups_check.h"
#include "tests/support.h"

/* --- fixture: a CUDA and a CPU backend with one stream each; everything
 * allocated through the helpers is released (and accounted) in teardown. */

#define MAX_OWNED 256
#define MAX_GRAPHS 8

static kern_backend_t *G, *C; /* under test, reference */
static kern_stream_t *GS, *CS;
static void *g_owned[MAX_OWNED], *c_owned[MAX_OWNED], *h_owned[MAX_OWNED];
static int n_g_owned, n_c_owned, n_h_owned;
static kern_graph_t *graphs[MAX_GRAPHS];
static int n_graphs;
static uint64_t rng;

static void setup(void) {
    G = kern_backend_cuda_new(0);
    ck_assert_msg(G != NULL, "cuda backend: %s", reel_err_text());
    C = kern_backend_cpu_new();
    ck_assert_msg(C != NULL, "cpu backend: %s", reel_err_text());
    GS = kern_stream_new(G);
    ck_assert_msg(GS != NULL, "cuda stream: %s", reel_err_text());
    CS = kern_stream_new(C);
    ck_assert_msg(CS != NULL, "cpu stream: %s", reel_err_text());
    n_g_owned = n_c_owned = n_h_owned = n_graphs = 0;
    rng = 0x9e3779b97f4a7c15ull;
}

/* Also cleans up after a test that failed mid-capture, so one failure does
 * not abort the suite on the stream's "destroyed while capturing" assert. */
static void teardown(void) {
    if (GS && kern_stream_is_capturing(GS)) {
        kern_graph_t *g = NULL;
        (void)kern_capture_end(GS, &g);
        kern_graph_destroy(&g);
    }
    for (int i = 0; i < n_graphs; i++) kern_graph_destroy(&graphs[i]);
    if (GS) (void)kern_stream_sync(GS);
    for (int i = 0; i < n_g_owned; i++) kern_free(G, g_owned[i]);
    for (int i = 0; i < n_c_owned; i++) kern_free(C, c_owned[i]);
    for (int i = 0; i < n_h_owned; i++) free(h_owned[i]);
    kern_stream_destroy(&GS);
    kern_stream_destroy(&CS);
    size_t gb = G ? kern_bytes_in_use(G) : 0, cb = C ? kern_bytes_in_use(C) : 0;
    kern_backend_destroy(&G);
    kern_backend_destroy(&C);
    ck_assert_msg(gb == 0, "%zu bytes leaked on the CUDA backend", gb);
    ck_assert_msg(cb == 0, "%zu bytes leaked on the CPU backend", cb);
}


static kern_dtype_t dtype_of(int loop) { return loop ? KERN_BF16 : KERN_F32; }

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

static void *hmalloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_lt(n_h_owned, MAX_OWNED);
    h_owned[n_h_owned++] = p;
    return p;
}

static kern_graph_t *own_graph(kern_graph_t *g) {
    ck_assert_int_lt(n_graphs, MAX_GRAPHS);
    graphs[n_graphs++] = g;
    return g;
}

static kern_tensor_t gpu_tensor(kern_dtype_t dt, int ndim, const int64_t *shape) {
    kern_tensor_t t = kern_tensor_alloc(G, dt, ndim, shape);
    ck_assert_msg(t.data != NULL, "cuda alloc: %s", reel_err_text());
    ck_assert_int_lt(n_g_owned, MAX_OWNED);
    g_owned[n_g_owned++] = t.data;
    return t;
}

static kern_tensor_t cpu_tensor(int ndim, const int64_t *shape) {
    kern_tensor_t t = kern_tensor_alloc(C, KERN_F32, ndim, shape);
    ck_assert_msg(t.data != NULL, "cpu alloc: %s", reel_err_text());
    ck_assert_int_lt(n_c_owned, MAX_OWNED);
    c_owned[n_c_owned++] = t.data;
    return t;
}

/* Copies n floats into the device tensor g, narrowed to g's dtype, and
 * waits (the staging buffer is freed right after). */
static void upload(kern_tensor_t *g, const float *h) {
    int64_t n = kern_tensor_numel(g);
    size_t bytes = kern_tensor_bytes(g);
    void *buf = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(buf);
    if (g->dtype == KERN_BF16)
        for (int64_t i = 0; i < n; i++) ((uint16_t *)buf)[i] = kern_f32_to_bf16(h[i]);
    else
        memcpy(buf, h, bytes);
    int rc = kern_copy_h2d(GS, kern_tensor_ptr(g), buf, bytes);
    if (rc == 0) rc = kern_stream_sync(GS);
    free(buf);
    ck_assert_msg(rc == 0, "upload: %s", reel_err_text());
}

/* The raw bytes of a device tensor (after the stream's queued work). */
static void *download_raw(const kern_tensor_t *g) {
    void *h = hmalloc(kern_tensor_bytes(g));
    TS_OK(kern_copy_d2h(GS, h, kern_tensor_ptr(g), kern_tensor_bytes(g)));
    TS_OK(kern_stream_sync(GS));
    return h;
}

/* A device tensor's values widened to float. */
static float *download(const kern_tensor_t *g) {
    int64_t n = kern_tensor_numel(g);
    void *raw = download_raw(g);
    if (g->dtype == KERN_F32) return raw;
    float *f = hmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = kern_bf16_to_f32(((const uint16_t *)raw)[i]);
    return f;
}

/* The same values on both backends: c F32 on the CPU, g in dtype dt on the
 * GPU. Values are rounded to dt first, so both sides hold equal numbers. */
typedef struct {
    kern_tensor_t c, g;
} pair_t;

static pair_t pair_from(kern_dtype_t dt, int ndim, const int64_t *shape, float *h) {
    pair_t p = { cpu_tensor(ndim, shape), gpu_tensor(dt, ndim, shape) };
    int64_t n = kern_tensor_numel(&p.c);
    if (dt == KERN_BF16)
        for (int64_t i = 0; i < n; i++) h[i] = kern_bf16_to_f32(kern_f32_to_bf16(h[i]));
    memcpy(kern_tensor_ptr(&p.c), h, (size_t)n * sizeof(float));
    upload(&p.g, h);
    return p;
}

static pair_t pair_rand(kern_dtype_t dt, int ndim, const int64_t *shape, float lo, float hi) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *h = hmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = uniform(lo, hi);
    return pair_from(dt, ndim, shape, h);
}

#define P1(dt, a, lo, hi) pair_rand(dt, 1, (int64_t[]){ (a) }, lo, hi)
#define P2(dt, a, b, lo, hi) pair_rand(dt, 2, (int64_t[]){ (a), (b) }, lo, hi)
#define P4(dt, a, b, c, d, lo, hi) pair_rand(dt, 4, (int64_t[]){ (a), (b), (c), (d) }, lo, hi)

/* Per-step scalars: always F32, whatever the op's dtype. */
static pair_t scalars(int64_t n, const float *vals) {
    float *h = hmalloc((size_t)n * sizeof(float));
    memcpy(h, vals, (size_t)n * sizeof(float));
    return pair_from(KERN_F32, 1, (int64_t[]){ n }, h);
}

static double nmse_tol(kern_dtype_t dt) { return dt == KERN_F32 ? 1e-6 : 1e-3; }

/* Fails unless the CUDA side of p is within NMSE tolerance of the CPU side. */
static void expect_nmse(const char *what, kern_dtype_t dt, const pair_t *p) {
    int64_t n = kern_tensor_numel(&p->c);
    const float *got = download(&p->g), *ref = kern_tensor_ptr(&p->c);
    double num = 0, den = 0;
    int64_t worst = 0;
    double worst_err = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
        if (!(fabs(d) <= worst_err)) {
            worst_err = fabs(d);
            worst = i;
        }
    }
    double e = den > 0 ? num / den : num;
    ck_assert_msg(e <= nmse_tol(dt),
                  "%s %s: NMSE %.3g > %.0e over %lld values (worst: [%lld] cuda %.9g, cpu %.9g)",
                  what, kern_dtype_name(dt), e, nmse_tol(dt), (long long)n, (long long)worst,
                  n ? (double)got[worst] : 0.0, n ? (double)ref[worst] : 0.0);
}

/* Fails unless the CUDA side of p equals the CPU side exactly (copies). */
static void expect_exact(const char *what, kern_dtype_t dt, const pair_t *p) {
    int64_t n = kern_tensor_numel(&p->c);
    const float *got = download(&p->g), *ref = kern_tensor_ptr(&p->c);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == ref[i], "%s %s: element %lld is %.9g on CUDA, %.9g on the CPU",
                      what, kern_dtype_name(dt), (long long)i, (double)got[i], (double)ref[i]);
}

/* --- backend ---------------------------------------------------------- */

START_TEST(test_cuda_backend_names_its_device_and_sm_arch) {
    ck_assert_int_eq(kern_backend_kind(G), KERN_BACKEND_CUDA);
    ck_assert_int_eq(kern_backend_device(G), 0);
    ck_assert_str_eq(kern_backend_device_name(G), "cuda:0");
    ck_assert_msg(strncmp(kern_backend_arch(G), "sm_", 3) == 0, "arch '%s'", kern_backend_arch(G));
}
END_TEST

START_TEST(test_cuda_new_on_a_missing_ordinal_fails_with_a_one_line_reason) {
    reel_err_clear();
    kern_backend_t *b = kern_backend_cuda_new(4096);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(reel_err_text(), "CUDA backend unavailable") != NULL, "'%s'", reel_err_text());
    ck_assert_msg(strchr(reel_err_text(), '\n') == NULL, "reason spans lines: '%s'", reel_err_text());
}
END_TEST

START_TEST(test_alloc_and_free_account_every_byte) {
    size_t sizes[] = { 1, 1000, (size_t)1 << 20 }, total = 0;
    void *p[3];
    for (int i = 0; i < 3; i++) {
        p[i] = kern_alloc(G, sizes[i]);
        ck_assert_msg(p[i] != NULL, "alloc %zu: %s", sizes[i], reel_err_text());
        ck_assert_msg(((uintptr_t)p[i] & 63) == 0, "allocation not 64-byte aligned");
        total += sizes[i];
        ck_assert_uint_eq(kern_bytes_in_use(G), total);
    }
    for (int i = 0; i < 3; i++) {
        kern_free(G, p[i]);
        total -= sizes[i];
        ck_assert_uint_eq(kern_bytes_in_use(G), total);
    }
}
END_TEST

START_TEST(test_copies_round_trip_host_device_device_host_bit_for_bit) {
    enum { n = 4097 };
    float *h = hmalloc(n * sizeof(float)), *back = hmalloc(n * sizeof(float));
    for (int i = 0; i < n; i++) h[i] = uniform(-1e3f, 1e3f);
    void *a = kern_alloc(G, n * sizeof(float)), *b = kern_alloc(G, n * sizeof(float));
    ck_assert_msg(a && b, "alloc: %s", reel_err_text());
    g_owned[n_g_owned++] = a;
    g_owned[n_g_owned++] = b;
    TS_OK(kern_copy_h2d(GS, a, h, n * sizeof(float)));
    TS_OK(kern_copy_d2d(GS, b, a, n * sizeof(float)));
    TS_OK(kern_copy_d2h(GS, back, b, n * sizeof(float)));
    TS_OK(kern_stream_sync(GS));
    ck_assert_msg(memcmp(h, back, n * sizeof(float)) == 0, "round trip changed the bytes");
}
END_TEST

/* --- gemm ------------------------------------------------------------- */

static void gemm_case(kern_dtype_t dt, int64_t M, int64_t N, int64_t K, int bias) {
    pair_t x = P2(dt, M, K, -1, 1), w = P2(dt, N, K, -1, 1), b = P1(dt, N, -1, 1);
    pair_t y = P2(dt, M, N, -1, 1);
    TS_OK(kern_gemm(CS, &x.c, &w.c, bias ? &b.c : NULL, &y.c));
    TS_OK(kern_gemm(GS, &x.g, &w.g, bias ? &b.g : NULL, &y.g));
    char what[96];
    snprintf(what, sizeof what, "gemm M=%lld N=%lld K=%lld%s", (long long)M, (long long)N,
             (long long)K, bias ? " +bias" : "");
    expect_nmse(what, dt, &y);
}

START_TEST(test_gemm_with_and_without_bias_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    gemm_case(dt, 37, 53, 70, 1);
    gemm_case(dt, 37, 53, 70, 0);
    gemm_case(dt, 1, 64, 256, 1);
    gemm_case(dt, 130, 96, 1, 1);
    gemm_case(dt, 256, 384, 1536, 1);
}
END_TEST

/* A grouped GEMM on CUDA (one strided-batched cuBLASLt matmul): the CPU's
 * values within the GEMM's tolerance (a layout that read the wrong rows
 * would fail here, where the merge probe would only say "no"), with and
 * without a bias and GELU; and where the probe says the batch is bitwise
 * the per-group calls, it is, on fresh operands. */
static void grouped_case(kern_dtype_t dt, int64_t n, int64_t B, int64_t N, int64_t K, int bias, bool gelu) {
    pair_t x = P2(dt, B * n, K, -1, 1), w = P2(dt, N, K, -1, 1), b = P1(dt, N, -1, 1);
    pair_t y = P2(dt, B * n, N, -1, 1);
    TS_OK(kern_gemm_grouped(CS, &x.c, &w.c, bias ? &b.c : NULL, &y.c, n, gelu));
    TS_OK(kern_gemm_grouped(GS, &x.g, &w.g, bias ? &b.g : NULL, &y.g, n, gelu));
    char what[128];
    snprintf(what, sizeof what, "grouped gemm%s %lld x %lld rows N=%lld K=%lld%s", gelu ? "_gelu" : "", (long long)B,
             (long long)n, (long long)N, (long long)K, bias ? " +bias" : "");
    expect_nmse(what, dt, &y);
    if (!bias || !tdit_gemm_merge_ok(G, dt, n, B, K, N, gelu)) return;
    pair_t y2 = P2(dt, B * n, N, -1, 1);
    const size_t esz = kern_dtype_size(dt);
    for (int64_t i = 0; i < B; i++) {
        kern_tensor_t xb = kern_tensor_make(x.g.data, dt, x.g.device, 2, (int64_t[]){ n, K });
        kern_tensor_t yb = kern_tensor_make(y2.g.data, dt, y2.g.device, 2, (int64_t[]){ n, N });
        xb.offset = x.g.offset + (size_t)(i * n * K) * esz;
        yb.offset = y2.g.offset + (size_t)(i * n * N) * esz;
        TS_OK(gelu ? kern_gemm_gelu(GS, &xb, &w.g, &b.g, &yb) : kern_gemm(GS, &xb, &w.g, &b.g, &yb));
    }
    size_t bytes = (size_t)(B * n * N) * esz;
    void *h1 = malloc(bytes), *h2 = malloc(bytes);
    TS_OK(kern_copy_d2h(GS, h1, kern_tensor_ptr(&y.g), bytes));
    TS_OK(kern_copy_d2h(GS, h2, kern_tensor_ptr(&y2.g), bytes));
    TS_OK(kern_stream_sync(GS));
    ck_assert_msg(memcmp(h1, h2, bytes) == 0, "%s: the probe said bitwise, the batch differs", what);
    free(h1);
    free(h2);
    printf("test_cuda: %s %s merges (bitwise the per-group calls)\n", what, kern_dtype_name(dt));
}

START_TEST(test_grouped_gemm_on_cuda_matches_cpu_and_merges_only_where_bitwise) {
    kern_dtype_t dt = dtype_of(_i);
    grouped_case(dt, 32, 8, 64, 64, 1, false); /* tiny's token GEMMs */
    grouped_case(dt, 32, 4, 128, 64, 1, true);
    grouped_case(dt, 5, 3, 64, 256, 1, false); /* text rows */
    grouped_case(dt, 1, 8, 384, 64, 1, false); /* the time embedding's row */
    grouped_case(dt, 37, 2, 53, 70, 0, false);
}
END_TEST

/* --- norms ------------------------------------------------------------ */

static void layernorm_case(kern_dtype_t dt, int64_t rows, int64_t D, int affine) {
    pair_t x = P2(dt, rows, D, 2, 4), w = P1(dt, D, -1, 1), b = P1(dt, D, -1, 1);
    pair_t y = P2(dt, rows, D, 0, 0);
    TS_OK(kern_layernorm(CS, &x.c, affine ? &w.c : NULL, affine ? &b.c : NULL, 1e-6f, &y.c));
    TS_OK(kern_layernorm(GS, &x.g, affine ? &w.g : NULL, affine ? &b.g : NULL, 1e-6f, &y.g));
    expect_nmse(affine ? "layernorm affine" : "layernorm plain", dt, &y);
}

/* Inputs on an offset of 3 so a one-pass variance would lose digits. */
START_TEST(test_layernorm_affine_and_plain_match_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    layernorm_case(dt, 13, 67, 1);
    layernorm_case(dt, 13, 67, 0);
    layernorm_case(dt, 4, 1536, 1);
    layernorm_case(dt, 3, 5, 0);
}
END_TEST

START_TEST(test_layernorm_in_place_gives_the_same_bits_as_out_of_place) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t x = P2(dt, 7, 300, -2, 2), w = P1(dt, 300, -1, 1), b = P1(dt, 300, -1, 1);
    pair_t y = P2(dt, 7, 300, 0, 0);
    TS_OK(kern_layernorm(GS, &x.g, &w.g, &b.g, 1e-6f, &y.g));
    TS_OK(kern_layernorm(GS, &x.g, &w.g, &b.g, 1e-6f, &x.g));
    void *a = download_raw(&x.g), *c = download_raw(&y.g);
    ck_assert_msg(memcmp(a, c, kern_tensor_bytes(&x.g)) == 0,
                  "layernorm with y == x differs from y != x");
}
END_TEST

START_TEST(test_rmsnorm_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    int64_t cases[][2] = { { 9, 48 }, { 3, 1536 }, { 5, 7 } };
    for (int k = 0; k < 3; k++) {
        int64_t rows = cases[k][0], D = cases[k][1];
        pair_t x = P2(dt, rows, D, -2, 2), w = P1(dt, D, -1, 1), y = P2(dt, rows, D, 0, 0);
        TS_OK(kern_rmsnorm(CS, &x.c, &w.c, 1e-6f, &y.c));
        TS_OK(kern_rmsnorm(GS, &x.g, &w.g, 1e-6f, &y.g));
        expect_nmse("rmsnorm", dt, &y);
    }
}
END_TEST

/* --- elementwise ------------------------------------------------------ */

START_TEST(test_modulate_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t x = P2(dt, 10, 333, -1, 1), sh = P1(dt, 333, -1, 1), sc = P1(dt, 333, -1, 1);
    pair_t y = P2(dt, 10, 333, 0, 0);
    TS_OK(kern_modulate(CS, &x.c, &sh.c, &sc.c, &y.c));
    TS_OK(kern_modulate(GS, &x.g, &sh.g, &sc.g, &y.g));
    expect_nmse("modulate", dt, &y);
}
END_TEST

/* In F32 the CPU's bits exactly: product, then sum, never one FMA
 * (kc_residual), on the 16-byte path (208) and the scalar one (210). */
START_TEST(test_gated_residual_with_and_without_gate_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    for (int64_t D = 208; D <= 210; D += 2)
        for (int gated = 0; gated < 2; gated++) {
            pair_t x = P2(dt, 6, D, -1, 1), y = P2(dt, 6, D, -1, 1), g = P1(dt, D, -1, 1);
            TS_OK(kern_gated_residual(CS, &x.c, &y.c, gated ? &g.c : NULL));
            TS_OK(kern_gated_residual(GS, &x.g, &y.g, gated ? &g.g : NULL));
            const char *what = gated ? "gated residual" : "residual without gate";
            if (dt == KERN_F32) expect_exact(what, dt, &x);
            else expect_nmse(what, dt, &x);
        }
}
END_TEST

/* 100003 elements: several blocks of the grid-stride loop, ragged tail. */
START_TEST(test_add_matches_cpu_over_many_blocks) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t a = P1(dt, 100003, -5, 5), b = P1(dt, 100003, -5, 5), y = P1(dt, 100003, 0, 0);
    TS_OK(kern_add(CS, &a.c, &b.c, &y.c));
    TS_OK(kern_add(GS, &a.g, &b.g, &y.g));
    expect_nmse("add", dt, &y);
}
END_TEST

START_TEST(test_gelu_tanh_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t x = P1(dt, 2001, -6, 6), y = P1(dt, 2001, 0, 0);
    TS_OK(kern_gelu_tanh(CS, &x.c, &y.c));
    TS_OK(kern_gelu_tanh(GS, &x.g, &y.g));
    expect_nmse("gelu_tanh", dt, &y);
}
END_TEST

/* Down to −100, where e^−u overflows: the result must be −0, not NaN. */
START_TEST(test_silu_matches_cpu_including_overflowing_exponentials) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t x = P1(dt, 2001, -100, 20), y = P1(dt, 2001, 0, 0);
    TS_OK(kern_silu(CS, &x.c, &y.c));
    TS_OK(kern_silu(GS, &x.g, &y.g));
    expect_nmse("silu", dt, &y);
}
END_TEST

START_TEST(test_silu_in_place_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t x = P1(dt, 777, -8, 8);
    TS_OK(kern_silu(CS, &x.c, &x.c));
    TS_OK(kern_silu(GS, &x.g, &x.g));
    expect_nmse("silu in place", dt, &x);
}
END_TEST

/* --- the 16-byte paths against the scalar ones ---------------------------- */

/* n host values drawn in [lo, hi], rounded to dt's precision. */
static float *hrand(kern_dtype_t dt, int64_t n, float lo, float hi) {
    float *h = hmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        h[i] = uniform(lo, hi);
        if (dt == KERN_BF16) h[i] = kern_bf16_to_f32(kern_f32_to_bf16(h[i]));
    }
    return h;
}

/* h on the device, 16-byte aligned (off 0: the kernels' vector path) or
 * one element past it (off 1: their scalar path). */
static kern_tensor_t dev_at(kern_dtype_t dt, int ndim, const int64_t *shape, const float *h, int off) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    kern_tensor_t big = gpu_tensor(dt, 1, (int64_t[]){ n + 8 });
    kern_tensor_t v = kern_tensor_make(big.data, dt, big.device, ndim, shape);
    v.offset = big.offset + (size_t)off * kern_dtype_size(dt);
    upload(&v, h);
    return v;
}

static void expect_same_raw(const char *what, const kern_tensor_t *a, const kern_tensor_t *b) {
    ck_assert_msg(memcmp(download_raw(a), download_raw(b), kern_tensor_bytes(a)) == 0,
                  "%s: the 16-byte path differs from the scalar path", what);
}

static void expect_close_raw(const char *what, const kern_tensor_t *a, const kern_tensor_t *b, double tol) {
    int64_t n = kern_tensor_numel(a);
    const float *x = download(a), *y = download(b);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        den += (double)y[i] * y[i];
    }
    ck_assert_msg(num <= tol * den, "%s: 16-byte vs scalar path nmse %g > %g", what, num / den, tol);
}

/* The element-wise kernels give the scalar path's bits (the same
 * arithmetic per value); the row kernels, which sum each thread's 8 values
 * first, agree within rounding. Rows of 1536 (Wan's width). */
START_TEST(test_the_16_byte_paths_match_the_scalar_paths) {
    kern_dtype_t dt = dtype_of(_i);
    const int64_t R = 6, D = 1536, rd[2] = { R, D }, d1[1] = { D };
    const float *hx = hrand(dt, R * D, -3, 3), *hy = hrand(dt, R * D, -1, 1), *hg = hrand(dt, D, -1, 1);
    const float *hs = hrand(dt, D, -1, 1);
    for (int gated = 0; gated < 2; gated++) {
        kern_tensor_t t[2][3];
        for (int off = 0; off < 2; off++) {
            t[off][0] = dev_at(dt, 2, rd, hx, off);
            t[off][1] = dev_at(dt, 2, rd, hy, off);
            t[off][2] = dev_at(dt, 1, d1, hg, off);
            TS_OK(kern_gated_residual(GS, &t[off][0], &t[off][1], gated ? &t[off][2] : NULL));
        }
        expect_same_raw(gated ? "gated residual" : "residual", &t[0][0], &t[1][0]);
    }
    for (int f = 0; f < 2; f++) {
        kern_tensor_t x[2], y[2];
        for (int off = 0; off < 2; off++) {
            x[off] = dev_at(dt, 2, rd, hx, off);
            y[off] = dev_at(dt, 2, rd, hy, off);
            TS_OK(f ? kern_silu(GS, &x[off], &y[off]) : kern_gelu_tanh(GS, &x[off], &y[off]));
        }
        expect_same_raw(f ? "silu" : "gelu_tanh", &y[0], &y[1]);
    }
    const double tol = dt == KERN_F32 ? 1e-12 : 1e-5;
    for (int k = 0; k < 4; k++) {
        kern_tensor_t x[2], y[2], a[2], b[2];
        for (int off = 0; off < 2; off++) {
            x[off] = dev_at(dt, 2, rd, hx, off);
            y[off] = dev_at(dt, 2, rd, hy, off);
            a[off] = dev_at(dt, 1, d1, hg, off);
            b[off] = dev_at(dt, 1, d1, hs, off);
            if (k == 0) TS_OK(kern_layernorm_modulate(GS, &x[off], &a[off], &b[off], 1e-6f, &y[off]));
            if (k == 1) TS_OK(kern_layernorm(GS, &x[off], &a[off], &b[off], 1e-6f, &y[off]));
            if (k == 2) TS_OK(kern_rmsnorm(GS, &x[off], &a[off], 1e-6f, &y[off]));
            if (k == 3) TS_OK(kern_rmsnorm_rope3d(GS, &x[off], &a[off], 1e-6f, 12, 1, 2, 3));
        }
        static const char *names[4] = { "layernorm_modulate", "layernorm", "rmsnorm", "rmsnorm_rope3d" };
        if (k == 3) expect_close_raw(names[k], &x[0], &x[1], tol);
        else expect_close_raw(names[k], &y[0], &y[1], tol);
    }
}
END_TEST

/* RESIDUAL_NORM on the GPU: x and out bit for bit GATED_RESIDUAL then the
 * LayerNorm (modulated and affine, gated or not), on the 16-byte path
 * (aligned) and the scalar one (one element off), and near the CPU. */
START_TEST(test_residual_norm_is_bitwise_the_pair_on_both_paths_and_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    const int64_t R = 5, D = 1536, rd[2] = { R, D }, d1[1] = { D };
    const float *hx = hrand(dt, R * D, 2, 4), *hy = hrand(dt, R * D, -1, 1), *hg = hrand(dt, D, -1, 1);
    const float *h0 = hrand(dt, D, -1, 1), *h1 = hrand(dt, D, -1, 1);
    for (int off = 0; off < 2; off++)
        for (int gated = 0; gated < 2; gated++)
            for (int mod = 0; mod < 2; mod++) {
                kern_tensor_t x = dev_at(dt, 2, rd, hx, off), xu = dev_at(dt, 2, rd, hx, off);
                kern_tensor_t y = dev_at(dt, 2, rd, hy, off), g = dev_at(dt, 1, d1, hg, off);
                kern_tensor_t p0 = dev_at(dt, 1, d1, h0, off), p1 = dev_at(dt, 1, d1, h1, off);
                kern_tensor_t out = dev_at(dt, 2, rd, hy, off), u = dev_at(dt, 2, rd, hy, off);
                const kern_tensor_t *gp = gated ? &g : NULL;
                if (mod) TS_OK(kern_residual_layernorm_modulate(GS, &x, &y, gp, &p0, &p1, 1e-6f, &out));
                else TS_OK(kern_residual_layernorm(GS, &x, &y, gp, &p0, &p1, 1e-6f, &out));
                TS_OK(kern_gated_residual(GS, &xu, &y, gp));
                if (mod) TS_OK(kern_layernorm_modulate(GS, &xu, &p0, &p1, 1e-6f, &u));
                else TS_OK(kern_layernorm(GS, &xu, &p0, &p1, 1e-6f, &u));
                char what[96];
                snprintf(what, sizeof what, "residual_norm %s %s %s", off ? "scalar" : "16-byte",
                         gated ? "gated" : "plain", mod ? "modulate" : "affine");
                ck_assert_msg(memcmp(download_raw(&x), download_raw(&xu), kern_tensor_bytes(&x)) == 0,
                              "%s: x differs from gated_residual's", what);
                ck_assert_msg(memcmp(download_raw(&out), download_raw(&u), kern_tensor_bytes(&u)) == 0,
                              "%s: out differs from the unfused pair's", what);
            }
    pair_t x = P2(dt, R, D, 2, 4), y = P2(dt, R, D, -1, 1), g = P1(dt, D, -1, 1);
    pair_t sh = P1(dt, D, -1, 1), sc = P1(dt, D, -1, 1), out = P2(dt, R, D, 0, 0);
    TS_OK(kern_residual_layernorm_modulate(CS, &x.c, &y.c, &g.c, &sh.c, &sc.c, 1e-6f, &out.c));
    TS_OK(kern_residual_layernorm_modulate(GS, &x.g, &y.g, &g.g, &sh.g, &sc.g, 1e-6f, &out.g));
    expect_nmse("residual_layernorm_modulate vs cpu", dt, &out);
    if (dt == KERN_F32) expect_exact("residual_layernorm_modulate's x vs cpu", dt, &x);
    else expect_nmse("residual_layernorm_modulate's x vs cpu", dt, &x);
}
END_TEST

/* --- attention -------------------------------------------------------- */

static void attention_case(kern_dtype_t dt, int64_t nq, int64_t nk, int64_t H, int64_t d) {
    pair_t q = P2(dt, nq, H * d, -1, 1), k = P2(dt, nk, H * d, -1, 1);
    pair_t v = P2(dt, nk, H * d, -1, 1), o = P2(dt, nq, H * d, 0, 0);
    TS_OK(kern_attention(CS, &q.c, &k.c, &v.c, H, &o.c));
    TS_OK(kern_attention(GS, &q.g, &k.g, &v.g, H, &o.g));
    char what[96];
    snprintf(what, sizeof what, "attention nq=%lld nk=%lld heads=%lld d=%lld", (long long)nq,
             (long long)nk, (long long)H, (long long)d);
    expect_nmse(what, dt, &o);
}

/* Covers the three tile shapes (d <= 64, 128, 256), head dims that are not
 * multiples of 4 or 32, partial query and key tiles, one key, many key
 * tiles, and nq != nk (cross-attention). */
START_TEST(test_attention_matches_cpu_across_head_dims_and_ragged_tiles) {
    kern_dtype_t dt = dtype_of(_i);
    static const int64_t cases[][4] = {
        { 37, 53, 2, 16 }, { 70, 45, 3, 64 }, { 33, 77, 2, 128 }, { 20, 40, 1, 256 },
        { 5, 300, 2, 80 }, { 40, 33, 4, 6 }, { 1, 1, 1, 2 }, { 129, 1000, 2, 128 },
        { 64, 20, 12, 130 }, { 17, 9, 6, 64 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        attention_case(dt, cases[i][0], cases[i][1], cases[i][2], cases[i][3]);
}
END_TEST

/* Logits in the hundreds (e^100 overflows float): the online softmax must
 * rescale by the running max, not overflow. */
START_TEST(test_attention_with_large_logits_stays_finite_and_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t q = P2(dt, 48, 64, -10, 10), k = P2(dt, 200, 64, -10, 10);
    pair_t v = P2(dt, 200, 64, -1, 1), o = P2(dt, 48, 64, 0, 0);
    TS_OK(kern_attention(CS, &q.c, &k.c, &v.c, 1, &o.c));
    TS_OK(kern_attention(GS, &q.g, &k.g, &v.g, 1, &o.g));
    expect_nmse("attention with large logits", dt, &o);
}
END_TEST

/* The online kernel stops at head width 256 and says so; the stream
 * survives the refusal. kern_attention's rule sends such heads to the
 * decomposition, which has no width limit. */
START_TEST(test_attention_over_head_dim_256_runs_decomposed_and_the_fused_kernel_refuses_it) {
    kern_tensor_t q = gpu_tensor(KERN_F32, 2, (int64_t[]){ 4, 512 });
    kern_tensor_t o = gpu_tensor(KERN_F32, 2, (int64_t[]){ 4, 512 });
    reel_err_clear();
    kern_attn_opts_t fused = { KERN_ATTN_FUSED, 0, false };
    ck_assert_int_eq(kern_attention_ex(GS, &q, &q, &q, 1, &o, &fused), -1);
    ck_assert_msg(strstr(reel_err_text(), "attention") && strstr(reel_err_text(), "256"),
                  "message should name the op and the limit: '%s'", reel_err_text());
    pair_t a = P1(KERN_F32, 100, -1, 1), b = P1(KERN_F32, 100, -1, 1), y = P1(KERN_F32, 100, 0, 0);
    TS_OK(kern_add(CS, &a.c, &b.c, &y.c));
    TS_OK(kern_add(GS, &a.g, &b.g, &y.g));
    expect_nmse("add after a refused attention", KERN_F32, &y);
    for (int l = 0; l < 2; l++) {
        kern_dtype_t dt = dtype_of(l);
        ck_assert_int_eq(kern_attention_pick(40, 300, 512), KERN_ATTN_DECOMPOSED);
        attention_case(dt, 40, 300, 2, 512);
    }
}
END_TEST

/* Both GPU results as floats; NMSE of a against b. */
static double nmse_of(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? num / den : num;
}

/* The decomposition on CUDA (cuBLAS strided-batched GEMMs + softmax.cu)
 * against the CPU F32 result and against the online kernel on the same
 * inputs, at the NMSE tolerances of this suite. BF16 rounds P to BF16
 * before the second GEMM (the online kernel keeps it F32), an error of at
 * most 2^-9 of each weight, well inside 1e-3. Shapes: ragged query blocks
 * (a bound of 5 or 128 rows), keys not a multiple of 8, one key, d = 128,
 * 80 and 16, and a shape the rule itself sends to the decomposition. */
START_TEST(test_attention_decomposed_matches_cpu_and_the_online_kernel) {
    kern_dtype_t dt = dtype_of(_i);
    static const int64_t cases[][5] = { /* nq, nk, H, d, rows per block (0: default bound) */
        { 37, 53, 3, 64, 5 },   { 700, 1536, 2, 128, 128 }, { 70, 1, 4, 16, 16 },
        { 129, 1000, 2, 128, 0 }, { 600, 2048, 2, 128, 0 },  { 300, 777, 3, 80, 64 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t nq = cases[c][0], nk = cases[c][1], H = cases[c][2], d = cases[c][3];
        size_t pe = dt == KERN_F32 ? 4 : 6;
        kern_attn_opts_t dec = { KERN_ATTN_DECOMPOSED,
                                 (size_t)(((nk + 7) & ~7) * (int64_t)pe * H * cases[c][4]), false };
        kern_attn_opts_t fused = { KERN_ATTN_FUSED, 0, false };
        pair_t q = P2(dt, nq, H * d, -2, 2), k = P2(dt, nk, H * d, -1, 1);
        pair_t v = P2(dt, nk, H * d, -1, 1), o = P2(dt, nq, H * d, 0, 0);
        kern_tensor_t on = gpu_tensor(dt, 2, (int64_t[]){ nq, H * d });
        TS_OK(kern_attention(CS, &q.c, &k.c, &v.c, H, &o.c));
        TS_OK(kern_attention_ex(GS, &q.g, &k.g, &v.g, H, &o.g, &dec));
        TS_OK(kern_attention_ex(GS, &q.g, &k.g, &v.g, H, &on, &fused));
        char what[128];
        snprintf(what, sizeof what, "decomposed attention nq=%lld nk=%lld H=%lld d=%lld",
                 (long long)nq, (long long)nk, (long long)H, (long long)d);
        expect_nmse(what, dt, &o);
        double e = nmse_of(download(&o.g), download(&on), nq * H * d);
        ck_assert_msg(e <= nmse_tol(dt), "%s %s: NMSE %.3g against the online kernel > %.0e",
                      what, kern_dtype_name(dt), e, nmse_tol(dt));
    }
}
END_TEST

/* d = 128 attention captured into a CUDA graph, one call on each path (the
 * decomposition in 6 blocks of 128 query rows, the last one 60): every
 * replay is bit for bit the eager result, with o and the score scratch
 * poisoned before each replay. The eager run comes first: it reserves the
 * stream's scratch (no capture may grow it) and warms cuBLAS up. */
START_TEST(test_attention_d128_in_a_cuda_graph_replays_bitwise_equal_to_eager) {
    kern_dtype_t dt = dtype_of(_i);
    const int64_t H = 2, d = 128, nq = 700, nk = 1536, nqs = 300, nks = 200;
    size_t pe = dt == KERN_F32 ? 4 : 6;
    kern_attn_opts_t dec = { KERN_ATTN_DECOMPOSED, (size_t)(nk * (int64_t)pe * H * 128), false };
    kern_attn_plan_t plan;
    TS_OK(kern_attention_plan(KERN_BACKEND_CUDA, dt, nq, nk, H, d, &dec, &plan));
    ck_assert_int_eq(plan.rows, 128);
    ck_assert_int_eq(plan.blocks, 6);
    ck_assert_int_eq(kern_attention_pick(nqs, nks, d), KERN_ATTN_FUSED);
    pair_t q = P2(dt, nq, H * d, -2, 2), k = P2(dt, nk, H * d, -1, 1), v = P2(dt, nk, H * d, -1, 1);
    pair_t qs = P2(dt, nqs, H * d, -2, 2), ks = P2(dt, nks, H * d, -1, 1);
    pair_t vs = P2(dt, nks, H * d, -1, 1);
    kern_tensor_t o = gpu_tensor(dt, 2, (int64_t[]){ nq, H * d });
    kern_tensor_t os = gpu_tensor(dt, 2, (int64_t[]){ nqs, H * d });
    TS_OK(kern_attention_ex(GS, &q.g, &k.g, &v.g, H, &o, &dec));
    TS_OK(kern_attention(GS, &qs.g, &ks.g, &vs.g, H, &os));
    TS_OK(kern_stream_sync(GS));
    void *eo = download_raw(&o), *eos = download_raw(&os);

    TS_OK(kern_capture_begin(GS));
    TS_OK(kern_attention_ex(GS, &q.g, &k.g, &v.g, H, &o, &dec));
    TS_OK(kern_attention(GS, &qs.g, &ks.g, &vs.g, H, &os));
    kern_graph_t *gr = NULL;
    TS_OK(kern_capture_end(GS, &gr));
    own_graph(gr);
    ck_assert_msg(kern_graph_nodes(gr) >= (size_t)(3 * plan.blocks + 1), "%zu nodes",
                  kern_graph_nodes(gr));

    void *scratch = kern_stream_scratch(GS, plan.scratch_bytes);
    ck_assert_msg(scratch != NULL, "scratch: %s", reel_err_text());
    unsigned char *poison = hmalloc(plan.scratch_bytes);
    memset(poison, 0xff, plan.scratch_bytes);
    for (int rep = 0; rep < 2; rep++) {
        TS_OK(kern_copy_h2d(GS, kern_tensor_ptr(&o), poison, kern_tensor_bytes(&o)));
        TS_OK(kern_copy_h2d(GS, kern_tensor_ptr(&os), poison, kern_tensor_bytes(&os)));
        TS_OK(kern_copy_h2d(GS, scratch, poison, plan.scratch_bytes));
        TS_OK(kern_stream_sync(GS));
        TS_OK(kern_graph_replay(gr, GS));
        TS_OK(kern_stream_sync(GS));
        ck_assert_msg(memcmp(download_raw(&o), eo, kern_tensor_bytes(&o)) == 0,
                      "replay %d: decomposed attention differs from eager (%s)", rep,
                      kern_dtype_name(dt));
        ck_assert_msg(memcmp(download_raw(&os), eos, kern_tensor_bytes(&os)) == 0,
                      "replay %d: fused attention differs from eager (%s)", rep,
                      kern_dtype_name(dt));
    }
}
END_TEST

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Wan2.1-1.3B self-attention at 81 frames of 480×832: 32,760 tokens, 12
 * heads of 128, BF16, on the decomposition, forced (145 blocks of 227
 * query rows; AUTO takes cuDNN's SDPA where cuDNN loads, and gpu-check's
 * step 5 checks that one at this size). Rows spread over the
 * sequence, plus those at the block seams and the ragged end, are checked
 * against the CPU's F32 fused kernel on the same BF16-rounded values,
 * computed for those rows only.
 *
 * Tolerance per element: |o − ref| <= 2^-8·(|ref| + A), A = Σ_j p_j·|v_j|
 * (the CPU attention of |v|). Rounding P to BF16 moves each weight by at
 * most 2^-9 of itself, so o by at most 2^-9·A; rounding o moves it by at
 * most 2^-9·|o|; the F32 accumulations add ~1e-6 relative. The bound is
 * that sum, doubled, and scales with what the output is made of, so
 * outputs near 0 (cancelling values of v) are held to their own ulps
 * instead of a relative 1e-2 they cannot meet. Also NMSE <= 1e-4 over the
 * checked rows (expected ~1e-6). The online kernel runs once on the same
 * inputs for comparison (same checks); both timings are printed. */
START_TEST(test_wan_shaped_bf16_attention_matches_cpu_reference_on_sampled_rows) {
    const int64_t nq = 32760, nk = 32760, H = 12, d = 128, D = H * d;
    enum { R = 256 };
    kern_attn_plan_t plan;
    const kern_attn_opts_t decomposed = { KERN_ATTN_DECOMPOSED, 0, false };
    TS_OK(kern_attention_plan(KERN_BACKEND_CUDA, KERN_BF16, nq, nk, H, d, &decomposed, &plan));
    ck_assert_int_eq(plan.path, KERN_ATTN_DECOMPOSED);
    int64_t rows[R];
    const int64_t seams[] = { 0, 1, plan.rows - 1, plan.rows, 2 * plan.rows - 1, 2 * plan.rows,
                              plan.rows * (plan.blocks - 1) - 1, plan.rows * (plan.blocks - 1),
                              nq - 2, nq - 1 };
    const int ns = (int)(sizeof seams / sizeof seams[0]);
    for (int r = 0; r < R; r++)
        rows[r] = r < ns ? seams[r] : (int64_t)(r - ns) * (nq - 1) / (R - ns - 1);

    /* inputs: BF16 on the GPU, their exact F32 widening on the CPU */
    float *h = malloc((size_t)(nk * D) * sizeof(float));
    ck_assert_ptr_nonnull(h);
    kern_tensor_t qg = gpu_tensor(KERN_BF16, 2, (int64_t[]){ nq, D });
    kern_tensor_t kg = gpu_tensor(KERN_BF16, 2, (int64_t[]){ nk, D });
    kern_tensor_t vg = gpu_tensor(KERN_BF16, 2, (int64_t[]){ nk, D });
    kern_tensor_t og = gpu_tensor(KERN_BF16, 2, (int64_t[]){ nq, D });
    kern_tensor_t og2 = gpu_tensor(KERN_BF16, 2, (int64_t[]){ nq, D });
    kern_tensor_t qc = cpu_tensor(2, (int64_t[]){ R, D }), kc = cpu_tensor(2, (int64_t[]){ nk, D });
    kern_tensor_t vc = cpu_tensor(2, (int64_t[]){ nk, D }), va = cpu_tensor(2, (int64_t[]){ nk, D });
    kern_tensor_t oc = cpu_tensor(2, (int64_t[]){ R, D }), ac = cpu_tensor(2, (int64_t[]){ R, D });
    float *qcp = kern_tensor_ptr(&qc), *kcp = kern_tensor_ptr(&kc), *vcp = kern_tensor_ptr(&vc);
    float *vap = kern_tensor_ptr(&va);
    for (int64_t i = 0; i < nq * D; i++) h[i] = kern_bf16_to_f32(kern_f32_to_bf16(uniform(-4, 4)));
    upload(&qg, h);
    for (int r = 0; r < R; r++) memcpy(qcp + r * D, h + rows[r] * D, (size_t)D * sizeof(float));
    for (int64_t i = 0; i < nk * D; i++) h[i] = kern_bf16_to_f32(kern_f32_to_bf16(uniform(-1, 1)));
    upload(&kg, h);
    memcpy(kcp, h, (size_t)(nk * D) * sizeof(float));
    for (int64_t i = 0; i < nk * D; i++) h[i] = kern_bf16_to_f32(kern_f32_to_bf16(uniform(-1, 1)));
    upload(&vg, h);
    memcpy(vcp, h, (size_t)(nk * D) * sizeof(float));
    for (int64_t i = 0; i < nk * D; i++) vap[i] = fabsf(h[i]);
    free(h);

    kern_attn_opts_t fused = { KERN_ATTN_FUSED, 0, false };
    TS_OK(kern_attention_ex(CS, &qc, &kc, &vc, H, &oc, &fused));
    TS_OK(kern_attention_ex(CS, &qc, &kc, &va, H, &ac, &fused));

    TS_OK(kern_attention_ex(GS, &qg, &kg, &vg, H, &og, &decomposed)); /* warm-up: scratch, cuBLAS */
    TS_OK(kern_stream_sync(GS));
    double t0 = now_ms();
    TS_OK(kern_attention_ex(GS, &qg, &kg, &vg, H, &og, &decomposed));
    TS_OK(kern_stream_sync(GS));
    double t1 = now_ms();
    TS_OK(kern_attention_ex(GS, &qg, &kg, &vg, H, &og2, &fused));
    TS_OK(kern_stream_sync(GS));
    double t2 = now_ms();
    printf("test_cuda: wan attention 32760x12x128 bf16: decomposed %.1f ms (%lld blocks of %lld "
           "rows), online kernel %.1f ms\n", t1 - t0, (long long)plan.blocks,
           (long long)plan.rows, t2 - t1);

    const float *ref = kern_tensor_ptr(&oc), *mag = kern_tensor_ptr(&ac);
    for (int path = 0; path < 2; path++) {
        const char *name = path ? "online" : "decomposed";
        const float *got = download(path ? &og2 : &og);
        double num = 0, den = 0, worst = 0, wy = 0, wx = 0, wtol = 0;
        int64_t wr = -1, wc = -1;
        for (int r = 0; r < R; r++)
            for (int64_t c = 0; c < D; c++) {
                double y = got[rows[r] * D + c], x = ref[r * D + c];
                double tol = (1.0 / 256) * (fabs(x) + mag[r * D + c]);
                double ratio = fabs(y - x) / tol;
                if (!(ratio <= worst)) { /* NaN counts as the worst */
                    worst = isnan(ratio) ? INFINITY : ratio;
                    wr = rows[r], wc = c, wy = y, wx = x, wtol = tol;
                }
                num += (y - x) * (y - x);
                den += x * x;
            }
        ck_assert_msg(worst <= 1.0,
                      "%s: row %lld col %lld: %.6g vs reference %.6g, |err| %.3g > %.3g "
                      "(2^-8·(|ref| + Σp|v|))", name, (long long)wr, (long long)wc, wy, wx,
                      fabs(wy - wx), wtol);
        ck_assert_msg(num <= 1e-4 * den, "%s: NMSE %.3g over the checked rows > 1e-4", name,
                      num / den);
        printf("test_cuda: wan attention %s: NMSE %.3g, worst error %.2f of its bound\n", name,
               num / den, worst);
    }
}
END_TEST

/* --- rope3d ----------------------------------------------------------- */

/* Head dims exercising every split of d into frame/row/column parts:
 * d = 2 and 4 (q = 0: frame only), 10 (6/2/2), 16, 64, 128 (Wan). */
START_TEST(test_rope3d_matches_cpu_for_every_split_of_the_head) {
    kern_dtype_t dt = dtype_of(_i);
    static const int64_t cases[][5] = { /* heads, d, frames, rows, cols */
        { 3, 16, 2, 3, 5 }, { 2, 10, 3, 2, 4 }, { 2, 64, 2, 4, 6 },
        { 1, 4, 2, 2, 2 }, { 4, 2, 1, 3, 3 }, { 2, 128, 3, 5, 7 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t *c = cases[i];
        pair_t x = P2(dt, c[2] * c[3] * c[4], c[0] * c[1], -1, 1);
        TS_OK(kern_rope3d(CS, &x.c, c[0], c[2], c[3], c[4]));
        TS_OK(kern_rope3d(GS, &x.g, c[0], c[2], c[3], c[4]));
        char what[64];
        snprintf(what, sizeof what, "rope3d heads=%lld d=%lld", (long long)c[0], (long long)c[1]);
        expect_nmse(what, dt, &x);
    }
}
END_TEST

/* --- patchify / unpatchify (pure copies: exact) ----------------------- */

START_TEST(test_patchify_equals_cpu_exactly) {
    kern_dtype_t dt = dtype_of(_i);
    const int64_t Cc = 4, F = 3, H = 6, W = 8;
    pair_t lat = P4(dt, Cc, F, H, W, -1, 1), tok = P2(dt, F * (H / 2) * (W / 2), 4 * Cc, 0, 0);
    TS_OK(kern_patchify(CS, &lat.c, &tok.c));
    TS_OK(kern_patchify(GS, &lat.g, &tok.g));
    expect_exact("patchify", dt, &tok);
}
END_TEST

START_TEST(test_unpatchify_equals_cpu_exactly) {
    kern_dtype_t dt = dtype_of(_i);
    const int64_t Cc = 5, F = 2, H = 4, W = 10;
    pair_t tok = P2(dt, F * (H / 2) * (W / 2), 4 * Cc, -1, 1), lat = P4(dt, Cc, F, H, W, 0, 0);
    TS_OK(kern_unpatchify(CS, &tok.c, &lat.c));
    TS_OK(kern_unpatchify(GS, &tok.g, &lat.g));
    expect_exact("unpatchify", dt, &lat);
}
END_TEST

/* --- per-step ops ----------------------------------------------------- */

START_TEST(test_timestep_embed_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    const float sig[] = { 0.73f, 1.0f, 0.0f };
    const int64_t dims[] = { 256, 64, 2 };
    for (int k = 0; k < 3; k++) {
        pair_t s = scalars(1, &sig[k]), e = P1(dt, dims[k], 0, 0);
        TS_OK(kern_timestep_embed(CS, &s.c, &e.c));
        TS_OK(kern_timestep_embed(GS, &s.g, &e.g));
        expect_nmse("timestep_embed", dt, &e);
    }
}
END_TEST

START_TEST(test_cfg_combine_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t vc = P1(dt, 1000, -1, 1), vu = P1(dt, 1000, -1, 1), v = P1(dt, 1000, 0, 0);
    pair_t g = scalars(1, (const float[]){ 4.5f });
    TS_OK(kern_cfg_combine(CS, &vc.c, &vu.c, &g.c, &v.c));
    TS_OK(kern_cfg_combine(GS, &vc.g, &vu.g, &g.g, &v.g));
    expect_nmse("cfg_combine", dt, &v);
}
END_TEST

START_TEST(test_euler_update_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t x = P1(dt, 1000, -1, 1), v = P1(dt, 1000, -1, 1);
    pair_t s = scalars(2, (const float[]){ 0.8f, 0.75f });
    TS_OK(kern_euler_update(CS, &x.c, &v.c, &s.c));
    TS_OK(kern_euler_update(GS, &x.g, &v.g, &s.g));
    expect_nmse("euler", dt, &x);
}
END_TEST

/* The multistep solvers' fused update (UniPC, DPM++) on the GPU agrees
 * with the CPU's, latent and history both, for a UniPC corrector+predictor
 * step's coefficients and a timestep-at embedding of an integer t. */
START_TEST(test_multistep_update_and_timestep_at_match_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    pair_t x = P1(dt, 1000, -1, 1), v = P1(dt, 1000, -1, 1), h = P2(dt, 3, 1000, -1, 1);
    const float coef[16] = { -0.8f, 0.0f, 0.9f, -0.3f, 0.05f, 0.25f, 0.7f, 0.35f, -0.12f, 0.0f,
                             0, 0, 0, 0, 0, 937.0f };
    pair_t c = scalars(16, coef);
    TS_OK(kern_multistep_update(CS, &x.c, &v.c, &h.c, &c.c));
    TS_OK(kern_multistep_update(GS, &x.g, &v.g, &h.g, &c.g));
    expect_nmse("multistep latent", dt, &x);
    expect_nmse("multistep history", dt, &h);
    kern_tensor_t tc = kern_tensor_make(c.c.data, KERN_F32, c.c.device, 1, (const int64_t[]){ 1 }),
                  tg = kern_tensor_make(c.g.data, KERN_F32, c.g.device, 1, (const int64_t[]){ 1 });
    tc.offset = tg.offset = 15 * sizeof(float);
    pair_t e = P1(dt, 256, 0, 0);
    TS_OK(kern_timestep_embed_at(CS, &tc, &e.c));
    TS_OK(kern_timestep_embed_at(GS, &tg, &e.g));
    expect_nmse("timestep_embed_at", dt, &e);
}
END_TEST

/* The noise is Philox keyed by (seed, step, index) on both backends, so
 * the two agree element for element. Covers σ_i < 1, σ_i = 1 (σ' = σ_1)
 * and η = 0 (no drift correction). */
START_TEST(test_sde_update_matches_cpu_noise_and_all) {
    kern_dtype_t dt = dtype_of(_i);
    static const float sig[][3] = { { 0.8f, 0.7f, 0.95f }, { 1.0f, 0.9f, 0.95f }, { 0.5f, 0.4f, 0.95f } };
    static const float eta[] = { 0.7f, 0.7f, 0.0f };
    for (int k = 0; k < 3; k++) {
        pair_t x = P1(dt, 4099, -1, 1), v = P1(dt, 4099, -1, 1), s = scalars(3, sig[k]);
        TS_OK(kern_sde_update(CS, &x.c, &v.c, &s.c, eta[k], 1234567ull + (uint64_t)k, 7));
        TS_OK(kern_sde_update(GS, &x.g, &v.g, &s.g, eta[k], 1234567ull + (uint64_t)k, 7));
        expect_nmse("sde", dt, &x);
    }
    /* a σ row of 4 (a solver's grid): the Wan trainer's std, η·σ_1·σ_i */
    static const float g4[4] = { 0.99967f, 0.96394f, 0.96394f, 999.0f };
    pair_t x = P1(dt, 4099, -1, 1), v = P1(dt, 4099, -1, 1), s = scalars(4, g4);
    TS_OK(kern_sde_update(CS, &x.c, &v.c, &s.c, 1.0f, 99, 0));
    TS_OK(kern_sde_update(GS, &x.g, &v.g, &s.g, 1.0f, 99, 0));
    expect_nmse("sde on a solver's grid", dt, &x);
}
END_TEST

/* SDE_DEV reads eta, seed and step from device memory: a graph captured
 * once replays for new values written between replays, bitwise equal to
 * the by-value SDE launched eagerly on the GPU (which the test above holds
 * to the CPU). */
START_TEST(test_sde_dev_in_a_graph_replays_new_seeds_bitwise_equal_to_eager_sde) {
    kern_dtype_t dt = dtype_of(_i);
    static const float sig[3] = { 0.8f, 0.7f, 0.95f };
    float packed[4];
    kern_sde_params_pack(packed, 0.7f, 1, 0);
    pair_t x = P1(dt, 4099, -1, 1), v = P1(dt, 4099, -1, 1), s = scalars(3, sig), prm = scalars(4, packed);
    pair_t y = P1(dt, 4099, 0, 0); /* the eager by-value run, on the GPU only */
    void *x0 = download_raw(&x.g);
    kern_graph_t *gr = NULL;
    TS_OK(kern_capture_begin(GS));
    TS_OK(kern_sde_update_dev(GS, &x.g, &v.g, &s.g, &prm.g));
    TS_OK(kern_capture_end(GS, &gr));
    own_graph(gr);
    for (uint32_t k = 0; k < 3; k++) {
        uint64_t seed = 0x100000000ull * (k + 1) + 17;
        float eta = 0.3f + 0.2f * (float)k;
        /* eager by value into y, from the same start */
        TS_OK(kern_copy_h2d(GS, kern_tensor_ptr(&y.g), x0, kern_tensor_bytes(&x.g)));
        TS_OK(kern_sde_update(GS, &y.g, &v.g, &s.g, eta, seed, k));
        void *want = download_raw(&y.g);
        /* the graph, after writing the new values */
        TS_OK(kern_copy_h2d(GS, kern_tensor_ptr(&x.g), x0, kern_tensor_bytes(&x.g)));
        kern_sde_params_pack(packed, eta, seed, k);
        upload(&prm.g, packed);
        TS_OK(kern_graph_replay(gr, GS));
        void *got = download_raw(&x.g);
        ck_assert_msg(memcmp(got, want, kern_tensor_bytes(&x.g)) == 0, "replay %u != eager SDE", k);
    }
}
END_TEST

/* Writes tiny's random weights (seed) to a fresh temporary file, whose
 * name goes into path (a "/tmp/...-XXXXXX" template; the caller unlinks
 * it). */
static void tiny_weights_file(char *path, uint64_t seed) {
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    tdit_config_t cfg;
    TS_OK(tdit_config_builtin("tiny", &cfg));
    TS_OK(tdit_weights_init(&cfg, seed, path));
}

/* A finite F32 that BF16 rounds to an infinity (|x| >= 0x1.fefp127) is
 * refused by a BF16 model at load and at reload (before any resident
 * weight changes), naming the tensor; the largest that rounds down
 * loads, and an F32 model takes FLT_MAX as it is. */
START_TEST(test_weights_past_bf16_max_are_refused_by_a_bf16_model) {
    char path[] = "/tmp/reel-test-cuda-x-XXXXXX", big[64], edge[64];
    tiny_weights_file(path, 3);
    snprintf(big, sizeof big, "%s-fltmax", path);
    snprintf(edge, sizeof edge, "%s-edge", path);
    uint32_t u = 0x7f7f7fffu; /* rounds down to BF16's largest */
    float below;
    memcpy(&below, &u, 4);
    ts_weights_rewrite(path, big, "blocks.1.ffn.0.weight", -1, NULL, -FLT_MAX);
    ts_weights_rewrite(path, edge, "blocks.1.ffn.0.weight", -1, NULL, below);
    ck_assert_ptr_null(tdit_model_load_path(G, big, KERN_BF16));
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_msg(strstr(reel_err_text(), "blocks.1.ffn.0.weight holds a value past BF16's largest"), "message: %s",
                  reel_err_text());
    tdit_model_t *f32 = tdit_model_load_path(G, big, KERN_F32);
    TS_NEW(f32);
    tdit_model_destroy(&f32);
    tdit_model_t *m = tdit_model_load_path(G, edge, KERN_BF16);
    TS_NEW(m);
    size_t nb = tdit_model_bytes(m);
    void *before = malloc(nb), *after = malloc(nb);
    TS_OK(kern_copy_d2h(GS, before, tdit_model_weights(m), nb));
    TS_OK(kern_stream_sync(GS));
    st_file_t *f = st_open(big);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(tdit_model_reload(m, f), -1);
    ck_assert_msg(strstr(reel_err_text(), "blocks.1.ffn.0.weight holds a value past BF16's largest") &&
                      !strstr(reel_err_text(), "mixed"),
                  "message: %s", reel_err_text());
    TS_OK(kern_copy_d2h(GS, after, tdit_model_weights(m), nb));
    TS_OK(kern_stream_sync(GS));
    ck_assert_int_eq(memcmp(before, after, nb), 0);
    st_close(&f);
    free(before);
    free(after);
    tdit_model_destroy(&m);
    unlink(big);
    unlink(edge);
    unlink(path);
}
END_TEST

/* The tinydit loop through the capture cache on two CUDA streams: each
 * stream captures its own graph (after a bitwise verify), the next request
 * replays every step, replay equals the eager loop on the same device bit
 * for bit, and both agree with the CPU by NMSE. */
START_TEST(test_tinydit_through_the_capture_cache_on_two_cuda_streams_replays_bitwise) {
    kern_dtype_t dt = dtype_of(_i);
    char path[] = "/tmp/reel-test-cuda-w-XXXXXX";
    tiny_weights_file(path, 5);
    tdit_model_t *mg = tdit_model_load_path(G, path, dt), *mc = tdit_model_load_path(C, path, KERN_F32);
    ck_assert_msg(mg && mc, "%s", reel_err_text());
    cap_options_t o = cap_options_default();
    o.warmup = 1;
    o.audit_every = 2;
    cap_cache_t *cache = cap_cache_new(G, &o);
    TS_OK(tdit_register_weights(cache, mg, 1));
    kern_stream_t *s2 = kern_stream_new(G);
    ck_assert_ptr_nonnull(s2);
    const tdit_shape_t sh = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    enum { NL = 4 * 2 * 8 * 8, NC = 5 * 32 };
    static float lat[NL], ctx[NC], unc[NC], got[NL], ref[NL], cpu[NL];
    tdit_initial_latent(1, lat, NL);
    tdit_initial_latent(2, ctx, NC);
    tdit_initial_latent(3, unc, NC);
    for (int sde = 0; sde < 2; sde++) {
        tdit_loop_t p = { .steps = 6, .shift = 3.0, .guidance = 4.0f, .sde = sde, .eta = 0.7f, .seed = 9 };
        tdit_ws_t *wg = tdit_ws_new(mg, GS, &sh), *wc = tdit_ws_new(mc, CS, &sh);
        TS_OK(tdit_generate(mg, wg, GS, &p, lat, ctx, unc, ref, NULL));
        TS_OK(tdit_generate(mc, wc, CS, &p, lat, ctx, unc, cpu, NULL));
        tdit_ws_destroy(&wg);
        tdit_ws_destroy(&wc);
        kern_stream_t *streams[2] = { GS, s2 };
        for (int k = 0; k < 2; k++) {
            tdit_staging_t *stg = tdit_staging_new(mg, &sh);
            ck_assert_ptr_nonnull(stg);
            for (int r = 0; r < 2; r++) {
                tdit_run_stats_t st;
                memset(&st, 0, sizeof st);
                TS_OK(tdit_generate_cached(mg, cache, streams[k], stg, &sh, &p, lat, ctx, unc, got, &st));
                if (r == 0) ck_assert_int_ge(st.captured, 1);
                else ck_assert_int_eq(st.replayed, 6);
                ck_assert_msg(memcmp(got, ref, sizeof got) == 0, "%s stream %d request %d: cached != eager on the GPU",
                              sde ? "SDE" : "Euler", k, r);
            }
            tdit_staging_destroy(&stg);
        }
        double e = nmse_of(got, cpu, NL);
        ck_assert_msg(e <= (dt == KERN_F32 ? 1e-5 : 5e-3), "%s: CUDA vs CPU NMSE %g", sde ? "SDE" : "Euler", e);
    }
    cap_stats_t cs;
    cap_cache_stats(cache, &cs);
    ck_assert_uint_eq(cs.declines[CAP_DECLINE_VERIFY_MISMATCH] + cs.declines[CAP_DECLINE_AUDIT_MISMATCH] +
                          cs.declines[CAP_DECLINE_CAPTURE_FAILED], 0);
    ck_assert_uint_ge(cs.audits, 1);
    ck_assert(cap_cache_invariants(cache));
    cap_cache_destroy(&cache);
    kern_stream_destroy(&s2);
    tdit_model_destroy(&mg);
    tdit_model_destroy(&mc);
    unlink(path);
}
END_TEST

/* A batched group on the GPU (F32 and BF16), captured and replayed, is
 * sample for sample bitwise the single requests with its seeds: the GEMMs
 * run per sample with a single request's calls, so cuBLAS picks the same
 * algorithms. */
START_TEST(test_a_batched_group_on_cuda_is_bitwise_the_single_requests) {
    kern_dtype_t dt = dtype_of(_i);
    char path[] = "/tmp/reel-test-cuda-g-XXXXXX";
    tiny_weights_file(path, 5);
    tdit_model_t *mg = tdit_model_load_path(G, path, dt);
    TS_NEW(mg);
    cap_options_t o = cap_options_default();
    o.warmup = 1;
    cap_cache_t *cache = cap_cache_new(G, &o);
    TS_OK(tdit_register_weights(cache, mg, 1));
    const tdit_shape_t one = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER }, grp = { 2, 8, 8, 5, true, 4, false, false, TDIT_SOLVER_EULER };
    enum { NL = 4 * 2 * 8 * 8, NC = 5 * 32 };
    static float ctx[NC], unc[NC], gout[4 * NL], sout[NL];
    tdit_initial_latent(2, ctx, NC);
    tdit_initial_latent(3, unc, NC);
    const uint64_t seeds[4] = { 5, 6, 7, 5 };
    tdit_loop_t p = { .steps = 4, .shift = 3.0, .guidance = 4.0f, .sde = true, .eta = 0.7f };
    tdit_staging_t *stg = tdit_staging_new(mg, &grp);
    ck_assert_ptr_nonnull(stg);
    for (int r = 0; r < 3; r++) { /* warm-up, capture, replay */
        tdit_req_t *q = tdit_req_new_group(mg, GS, stg, &grp, &p, seeds, NULL, ctx, unc);
        TS_NEW(q);
        while (!tdit_req_done(q)) TS_OK(tdit_req_step(q, cache, GS, NULL));
        if (r == 2) ck_assert_int_eq(tdit_req_stats(q)->replayed, 4);
        TS_OK(tdit_req_read(q, GS, gout, 4 * NL));
        tdit_req_destroy(&q);
    }
    for (int b = 0; b < 4; b++) {
        tdit_loop_t q1 = p;
        q1.seed = seeds[b];
        TS_OK(tdit_generate_cached(mg, cache, GS, NULL, &one, &q1, NULL, ctx, unc, sout, NULL));
        ck_assert_msg(memcmp(gout + (size_t)b * NL, sout, sizeof sout) == 0, "%s sample %d: group != single",
                      dt == KERN_F32 ? "F32" : "BF16", b);
    }
    tdit_staging_destroy(&stg);
    cap_cache_destroy(&cache);
    tdit_model_destroy(&mg);
    unlink(path);
}
END_TEST

/* A mixed batch on CUDA (3 requests, each its own latent, contexts, σ and
 * guidance, one CFG Euler step), eager and replayed from its graph: each
 * sample bitwise the request stepped alone, whatever the merge probe
 * decided for the batch's GEMMs on this device (said on stdout). */
static void mixed_sample_inputs(int64_t b, float *lat, float *ctx, float *unc, float sig[3], size_t nl, size_t nc) {
    tdit_initial_latent(40 + (uint64_t)b, lat, nl);
    tdit_initial_latent(50 + (uint64_t)b, ctx, nc);
    tdit_initial_latent(60 + (uint64_t)b, unc, nc);
    sig[0] = 0.9f - 0.1f * (float)b, sig[1] = sig[0] - 0.05f * (float)(b + 1), sig[2] = 0.95f;
}

START_TEST(test_a_mixed_batch_on_cuda_is_bitwise_each_request_alone_eager_and_replayed) {
    kern_dtype_t dt = dtype_of(_i);
    char path[] = "/tmp/reel-test-cuda-m-XXXXXX";
    tiny_weights_file(path, 9);
    tdit_model_t *m = tdit_model_load_path(G, path, dt);
    TS_NEW(m);
    enum { B = 3, NL = 4 * 2 * 8 * 8, NC = 5 * 32 };
    const tdit_shape_t mix = { 2, 8, 8, 5, true, B, TDIT_SOLVER_EULER, true, TDIT_SOLVER_EULER }, one = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    static float lat[NL], ctx[NC], unc[NC], out[2][B][NL], alone[NL];
    float sig[3];
    tdit_ws_t *w = tdit_ws_new(m, GS, &mix);
    TS_NEW(w);
    kern_graph_t *g = NULL;
    for (int r = 0; r < 2; r++) { /* eager, then a captured graph replayed */
        for (int64_t b = 0; b < B; b++) {
            mixed_sample_inputs(b, lat, ctx, unc, sig, NL, NC);
            TS_OK(tdit_ws_bind_sample_latent(w, GS, b, lat, NL));
            TS_OK(tdit_ws_bind_sample(w, GS, b, ctx, unc, NC, sig, 2.0f + (float)b));
        }
        if (r == 0) TS_OK(tdit_step(m, w, GS));
        else {
            if (!g) {
                TS_OK(kern_capture_begin(GS));
                TS_OK(tdit_step(m, w, GS));
                TS_OK(kern_capture_end(GS, &g));
                for (int64_t b = 0; b < B; b++) { /* the capture ran nothing: bind again */
                    mixed_sample_inputs(b, lat, ctx, unc, sig, NL, NC);
                    TS_OK(tdit_ws_bind_sample_latent(w, GS, b, lat, NL));
                }
            }
            TS_OK(kern_graph_replay(g, GS));
        }
        for (int64_t b = 0; b < B; b++) TS_OK(tdit_ws_read_sample_latent(w, GS, b, out[r][b], NL));
    }
    printf("test_cuda: mixed batch %s: token GEMMs merged %s\n", kern_dtype_name(dt),
           tdit_gemm_merge_ok(G, dt, 32, B, 64, 64, false) ? "yes" : "no (sample by sample)");
    tdit_ws_t *w1 = tdit_ws_new(m, GS, &one);
    TS_NEW(w1);
    for (int64_t b = 0; b < B; b++) {
        mixed_sample_inputs(b, lat, ctx, unc, sig, NL, NC);
        TS_OK(tdit_ws_bind_latent(w1, GS, lat, NL));
        TS_OK(tdit_ws_bind_context(w1, GS, ctx, NC, false));
        TS_OK(tdit_ws_bind_context(w1, GS, unc, NC, true));
        TS_OK(tdit_ws_bind_step(w1, GS, sig, 2.0f + (float)b));
        TS_OK(tdit_step(m, w1, GS));
        TS_OK(tdit_ws_read_latent(w1, GS, alone, NL));
        ck_assert_msg(memcmp(out[0][b], alone, sizeof alone) == 0, "%s sample %lld: mixed eager != alone",
                      kern_dtype_name(dt), (long long)b);
        ck_assert_msg(memcmp(out[1][b], alone, sizeof alone) == 0, "%s sample %lld: mixed replay != alone",
                      kern_dtype_name(dt), (long long)b);
    }
    kern_graph_destroy(&g);
    tdit_ws_destroy(&w1);
    tdit_ws_destroy(&w);
    tdit_model_destroy(&m);
    unlink(path);
}
END_TEST

/* --- graphs ----------------------------------------------------------- */

/* A step-like chain of every capturable op plus a device copy, on one
 * stream. res and lat are updated in place and reset before each run. */
typedef struct {
    kern_tensor_t x, w, b, shift, scale, gate, res0, lat0, sig, g;
    kern_tensor_t h, ln, m, gl, o, res, v, lat, emb, rn, sl, ad, cp;
} chain_t;

#define CHAIN_OUTPUTS 13
#define CHAIN_LAUNCHES 14 /* 13 ops and one copy: at least one node each */

static kern_tensor_t *chain_output(chain_t *t, int i) {
    kern_tensor_t *out[CHAIN_OUTPUTS] = { &t->h, &t->ln, &t->m, &t->gl, &t->o, &t->res, &t->v,
                                          &t->lat, &t->emb, &t->rn, &t->sl, &t->ad, &t->cp };
    return out[i];
}

static const char *chain_output_name(int i) {
    static const char *names[CHAIN_OUTPUTS] = { "gemm", "layernorm", "modulate", "gelu+rope3d",
                                                "attention", "gated_residual", "cfg_combine",
                                                "euler", "timestep_embed", "rmsnorm", "silu",
                                                "add", "d2d copy" };
    return names[i];
}

static kern_tensor_t chain_rand(kern_dtype_t dt, int ndim, const int64_t *shape, float lo, float hi) {
    kern_tensor_t t = gpu_tensor(dt, ndim, shape);
    int64_t n = kern_tensor_numel(&t);
    float *h = hmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = uniform(lo, hi);
    upload(&t, h);
    return t;
}

/* 48 tokens = 2 frames x 4 rows x 6 cols, width 64 = 4 heads x 16. */
static void chain_init(chain_t *t, kern_dtype_t dt) {
    const int64_t tok[2] = { 48, 64 }, sq[2] = { 64, 64 }, row[1] = { 64 }, emb[1] = { 256 };
    t->x = chain_rand(dt, 2, tok, -1, 1);
    t->w = chain_rand(dt, 2, sq, -0.2f, 0.2f);
    t->b = chain_rand(dt, 1, row, -1, 1);
    t->shift = chain_rand(dt, 1, row, -1, 1);
    t->scale = chain_rand(dt, 1, row, -1, 1);
    t->gate = chain_rand(dt, 1, row, -1, 1);
    t->res0 = chain_rand(dt, 2, tok, -1, 1);
    t->lat0 = chain_rand(dt, 2, tok, -1, 1);
    t->sig = gpu_tensor(KERN_F32, 1, (int64_t[]){ 2 });
    t->g = gpu_tensor(KERN_F32, 1, (int64_t[]){ 1 });
    for (int i = 0; i < CHAIN_OUTPUTS; i++)
        *chain_output(t, i) = gpu_tensor(dt, i == 8 ? 1 : 2, i == 8 ? emb : tok);
}

static void chain_scalars(chain_t *t, float s0, float s1, float g) {
    upload(&t->sig, (const float[]){ s0, s1 });
    upload(&t->g, (const float[]){ g });
}

static int chain_run(chain_t *t) {
    if (kern_gemm(GS, &t->x, &t->w, &t->b, &t->h)) return -1;
    if (kern_layernorm(GS, &t->h, NULL, NULL, 1e-6f, &t->ln)) return -1;
    if (kern_modulate(GS, &t->ln, &t->shift, &t->scale, &t->m)) return -1;
    if (kern_gelu_tanh(GS, &t->m, &t->gl)) return -1;
    if (kern_rope3d(GS, &t->gl, 4, 2, 4, 6)) return -1;
    if (kern_attention(GS, &t->gl, &t->m, &t->h, 4, &t->o)) return -1;
    if (kern_gated_residual(GS, &t->res, &t->o, &t->gate)) return -1;
    if (kern_cfg_combine(GS, &t->o, &t->h, &t->g, &t->v)) return -1;
    if (kern_euler_update(GS, &t->lat, &t->v, &t->sig)) return -1;
    if (kern_timestep_embed(GS, &t->sig, &t->emb)) return -1;
    if (kern_rmsnorm(GS, &t->res, &t->scale, 1e-6f, &t->rn)) return -1;
    if (kern_silu(GS, &t->rn, &t->sl)) return -1;
    if (kern_add(GS, &t->sl, &t->v, &t->ad)) return -1;
    return kern_copy_d2d(GS, kern_tensor_ptr(&t->cp), kern_tensor_ptr(&t->ad),
                         kern_tensor_bytes(&t->ad));
}

/* Restores the in-place state and fills every other output with 0xff bytes
 * (NaN in F32 and BF16), so a run that skips an output cannot pass. */
static void chain_reset(chain_t *t) {
    size_t big = kern_tensor_bytes(&t->h);
    unsigned char *poison = hmalloc(big);
    memset(poison, 0xff, big);
    for (int i = 0; i < CHAIN_OUTPUTS; i++) {
        kern_tensor_t *o = chain_output(t, i);
        TS_OK(kern_copy_h2d(GS, kern_tensor_ptr(o), poison, kern_tensor_bytes(o)));
    }
    TS_OK(kern_copy_d2d(GS, kern_tensor_ptr(&t->res), kern_tensor_ptr(&t->res0), big));
    TS_OK(kern_copy_d2d(GS, kern_tensor_ptr(&t->lat), kern_tensor_ptr(&t->lat0), big));
    TS_OK(kern_stream_sync(GS));
}

static void chain_snapshot(chain_t *t, void *out[CHAIN_OUTPUTS]) {
    for (int i = 0; i < CHAIN_OUTPUTS; i++) out[i] = download_raw(chain_output(t, i));
}

static void expect_same_bits(chain_t *t, void *const a[CHAIN_OUTPUTS],
                             void *const b[CHAIN_OUTPUTS], const char *when) {
    for (int i = 0; i < CHAIN_OUTPUTS; i++)
        ck_assert_msg(memcmp(a[i], b[i], kern_tensor_bytes(chain_output(t, i))) == 0,
                      "%s: %s output of the replay differs from the eager run", when,
                      chain_output_name(i));
}

START_TEST(test_cuda_graph_replay_is_bitwise_equal_to_eager_and_reads_scalars_at_replay) {
    kern_dtype_t dt = dtype_of(_i);
    chain_t t;
    void *eager1[CHAIN_OUTPUTS], *replay1[CHAIN_OUTPUTS];
    void *eager2[CHAIN_OUTPUTS], *replay2[CHAIN_OUTPUTS];
    chain_init(&t, dt);

    chain_scalars(&t, 0.9f, 0.85f, 3.0f);
    chain_reset(&t);
    TS_OK(chain_run(&t)); /* also the warm-up: modules load and cuBLAS picks kernels */
    TS_OK(kern_stream_sync(GS));
    chain_snapshot(&t, eager1);

    chain_reset(&t);
    TS_OK(kern_capture_begin(GS));
    ck_assert(kern_stream_is_capturing(GS));
    TS_OK(chain_run(&t));
    kern_graph_t *gr = NULL;
    TS_OK(kern_capture_end(GS, &gr));
    own_graph(gr);
    ck_assert(!kern_stream_is_capturing(GS));
    ck_assert_msg(kern_graph_nodes(gr) >= CHAIN_LAUNCHES, "%zu nodes for %d launches",
                  kern_graph_nodes(gr), CHAIN_LAUNCHES);
    ck_assert_uint_gt(kern_graph_bytes(gr), 0);
    void *still = download_raw(&t.ad);
    unsigned char poison[8];
    memset(poison, 0xff, sizeof poison);
    ck_assert_msg(memcmp(still, poison, sizeof poison) == 0,
                  "capture ran the kernels instead of recording them");

    TS_OK(kern_graph_replay(gr, GS));
    TS_OK(kern_stream_sync(GS));
    chain_snapshot(&t, replay1);
    expect_same_bits(&t, eager1, replay1, "first replay");

    /* New σ and guidance in the same device buffers: the graph must see them. */
    chain_scalars(&t, 0.6f, 0.52f, 5.5f);
    chain_reset(&t);
    TS_OK(chain_run(&t));
    TS_OK(kern_stream_sync(GS));
    chain_snapshot(&t, eager2);
    ck_assert_msg(memcmp(eager1[7], eager2[7], kern_tensor_bytes(&t.lat)) != 0,
                  "euler ignored the new sigmas");
    ck_assert_msg(memcmp(eager1[8], eager2[8], kern_tensor_bytes(&t.emb)) != 0,
                  "timestep_embed ignored the new sigma");
    chain_reset(&t);
    TS_OK(kern_graph_replay(gr, GS));
    TS_OK(kern_stream_sync(GS));
    chain_snapshot(&t, replay2);
    expect_same_bits(&t, eager2, replay2, "replay after new scalars");
    ck_assert_uint_eq(kern_graph_replays(gr), 2);
}
END_TEST

START_TEST(test_sde_refuses_to_launch_on_a_capturing_cuda_stream_and_runs_eagerly_after) {
    pair_t x = P1(KERN_F32, 256, -1, 1), v = P1(KERN_F32, 256, -1, 1), y = P1(KERN_F32, 256, 0, 0);
    pair_t s = scalars(3, (const float[]){ 0.6f, 0.5f, 0.95f });
    TS_OK(kern_capture_begin(GS));
    TS_OK(kern_add(GS, &x.g, &v.g, &y.g));
    reel_err_clear();
    ck_assert_int_eq(kern_sde_update(GS, &x.g, &v.g, &s.g, 0.7f, 1, 0), -1);
    ck_assert_msg(strstr(reel_err_text(), "capturable") && strstr(reel_err_text(), "sde"),
                  "message should say the sde kernel is not capturable: '%s'", reel_err_text());
    kern_graph_t *gr = NULL;
    TS_OK(kern_capture_end(GS, &gr));
    own_graph(gr);
    ck_assert_uint_ge(kern_graph_nodes(gr), 1);

    TS_OK(kern_sde_update(CS, &x.c, &v.c, &s.c, 0.7f, 1, 0));
    TS_OK(kern_sde_update(GS, &x.g, &v.g, &s.g, 0.7f, 1, 0));
    expect_nmse("sde after a refused capture", KERN_F32, &x);
}
END_TEST

/* --- fused ops and cuBLASLt GEMMs ------------------------------------- */

/* GEMM_GELU (one cublasLtMatmul, GELU_BIAS or GELU epilogue) against the
 * CPU's GEMM then GELU_TANH, at this suite's NMSE tolerances (1e-6 F32,
 * 1e-3 BF16); shapes include K = 1, one row, a ragged 37×53×70, and a Wan
 * FFN slice (128 tokens, 8960 × 1536) in BF16 on tensor cores. */
START_TEST(test_gemm_gelu_with_and_without_bias_matches_cpu) {
    kern_dtype_t dt = dtype_of(_i);
    static const int64_t cases[][3] = {
        { 37, 53, 70 }, { 1, 64, 256 }, { 130, 96, 1 }, { 256, 1024, 384 }, { 128, 8960, 1536 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int bias = 0; bias < 2; bias++) {
            const int64_t M = cases[c][0], N = cases[c][1], K = cases[c][2];
            const float ws = 1.5f / sqrtf((float)K); /* pre-activations of order 1 */
            pair_t x = P2(dt, M, K, -1, 1), w = P2(dt, N, K, -ws, ws), b = P1(dt, N, -1, 1);
            pair_t y = P2(dt, M, N, 0, 0);
            TS_OK(kern_gemm_gelu(CS, &x.c, &w.c, bias ? &b.c : NULL, &y.c));
            TS_OK(kern_gemm_gelu(GS, &x.g, &w.g, bias ? &b.g : NULL, &y.g));
            char what[96];
            snprintf(what, sizeof what, "gemm_gelu M=%lld N=%lld K=%lld%s", (long long)M,
                     (long long)N, (long long)K, bias ? " +bias" : "");
            expect_nmse(what, dt, &y);
        }
}
END_TEST

static double gelu_tanh_ref(double u) {
    return 0.5 * u * (1.0 + tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)));
}

static double gelu_erf_ref(double u) { return 0.5 * u * (1.0 + erf(u / sqrt(2.0))); }

/* cuBLASLt's header calls its epilogue only "GELU". TINYDIT.md wants the
 * tanh form, which differs from the erf form by up to 4.7e-4 (at |u| near
 * 2.7). Here the GEMM is exact (K = 1, w = 1, bias 0, F32), so y is the
 * epilogue's GELU of u over [-6, 6], compared with both forms in double:
 * it must be nearer the tanh form (sum of squared errors), and within
 * 2^-10·(|u|/2) + 1e-6 of it everywhere (room for a hardware tanh
 * approximation, ~2^-11 relative). Both epilogues (GELU_BIAS and GELU) and
 * the distances are printed, so the device log says which form it is. */
START_TEST(test_cublaslt_gelu_epilogue_is_the_tanh_form_of_tinydit) {
    enum { M = 2401, N = 8 };
    float *u = hmalloc(M * sizeof(float)), *ones = hmalloc(N * sizeof(float));
    for (int i = 0; i < M; i++) u[i] = -6.0f + 12.0f * (float)i / (float)(M - 1);
    for (int j = 0; j < N; j++) ones[j] = 1.0f;
    pair_t x = pair_from(KERN_F32, 2, (int64_t[]){ M, 1 }, u);
    pair_t w = pair_from(KERN_F32, 2, (int64_t[]){ N, 1 }, ones);
    pair_t b = P1(KERN_F32, N, 0, 0), y = P2(KERN_F32, M, N, 0, 0);
    for (int bias = 0; bias < 2; bias++) {
        TS_OK(kern_gemm_gelu(GS, &x.g, &w.g, bias ? &b.g : NULL, &y.g));
        const float *got = download(&y.g);
        double sse_t = 0, sse_e = 0, max_t = 0, max_e = 0, worst = 0;
        int64_t wi = 0;
        for (int64_t i = 0; i < (int64_t)M * N; i++) {
            const double uu = u[i / N], et = got[i] - gelu_tanh_ref(uu);
            const double ee = got[i] - gelu_erf_ref(uu);
            const double tol = 0.5 * fabs(uu) / 1024.0 + 1e-6;
            sse_t += et * et;
            sse_e += ee * ee;
            if (fabs(et) > max_t) max_t = fabs(et);
            if (fabs(ee) > max_e) max_e = fabs(ee);
            if (!(fabs(et) / tol <= worst)) {
                worst = isnan(et) ? INFINITY : fabs(et) / tol;
                wi = i;
            }
        }
        printf("test_cuda: cuBLASLt %s epilogue: max |y - gelu_tanh| %.3g, max |y - gelu_erf| "
               "%.3g, SSE %.3g vs %.3g\n", bias ? "GELU_BIAS" : "GELU", max_t, max_e, sse_t, sse_e);
        ck_assert_msg(sse_t < sse_e, "the %s epilogue is nearer the erf GELU (SSE %.3g) than the "
                      "tanh GELU TINYDIT.md specifies (SSE %.3g)", bias ? "GELU_BIAS" : "GELU",
                      sse_e, sse_t);
        ck_assert_msg(worst <= 1.0, "u = %.6g: %.9g vs gelu_tanh %.9g, beyond 2^-10·|u|/2 + 1e-6",
                      (double)u[wi / N], (double)got[wi], gelu_tanh_ref(u[wi / N]));
    }
}
END_TEST

/* LN(x)·(1 + scale) + shift in one pass against the CPU's LAYERNORM then
 * MODULATE (NMSE 1e-6 F32, 1e-3 BF16), inputs on an offset of 3; and the
 * CUDA kernel in place gives the bits it gives out of place. */
START_TEST(test_layernorm_modulate_matches_cpu_and_in_place_gives_the_same_bits) {
    kern_dtype_t dt = dtype_of(_i);
    static const int64_t cases[][2] = { { 13, 67 }, { 4, 1536 }, { 3, 5 }, { 300, 384 } };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t rows = cases[c][0], D = cases[c][1];
        pair_t x = P2(dt, rows, D, 2, 4), sh = P1(dt, D, -1, 1), sc = P1(dt, D, -1, 1);
        pair_t y = P2(dt, rows, D, 0, 0);
        TS_OK(kern_layernorm(CS, &x.c, NULL, NULL, 1e-6f, &y.c));
        TS_OK(kern_modulate(CS, &y.c, &sh.c, &sc.c, &y.c));
        TS_OK(kern_layernorm_modulate(GS, &x.g, &sh.g, &sc.g, 1e-6f, &y.g));
        expect_nmse("layernorm_modulate", dt, &y);
        TS_OK(kern_layernorm_modulate(GS, &x.g, &sh.g, &sc.g, 1e-6f, &x.g));
        ck_assert_msg(memcmp(download_raw(&x.g), download_raw(&y.g), kern_tensor_bytes(&x.g)) == 0,
                      "layernorm_modulate with y == x differs from y != x (%s)",
                      kern_dtype_name(dt));
    }
}
END_TEST

/* RMSNorm over the whole row then 3-D RoPE per head, one kernel, against
 * the CPU's RMSNORM then ROPE3D (NMSE 1e-6 F32, 1e-3 BF16), for every split
 * of the head (d = 2, 4: frame only; 10: 6/2/2; 16, 64; Wan's 12 × 128) and
 * head groups that do and do not divide the block. */
START_TEST(test_rmsnorm_rope3d_matches_cpu_for_every_split_of_the_head) {
    kern_dtype_t dt = dtype_of(_i);
    static const int64_t cases[][5] = { /* heads, d, frames, rows, cols */
        { 3, 16, 2, 3, 5 }, { 2, 10, 3, 2, 4 }, { 2, 64, 2, 4, 6 }, { 1, 4, 2, 2, 2 },
        { 4, 2, 1, 3, 3 },  { 12, 128, 3, 5, 7 }, { 6, 96, 2, 3, 3 }, { 1, 600, 1, 2, 2 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t *c = cases[i], D = c[0] * c[1];
        pair_t x = P2(dt, c[2] * c[3] * c[4], D, -3, 3), g = P1(dt, D, -1.5f, 1.5f);
        TS_OK(kern_rmsnorm(CS, &x.c, &g.c, 1e-6f, &x.c));
        TS_OK(kern_rope3d(CS, &x.c, c[0], c[2], c[3], c[4]));
        TS_OK(kern_rmsnorm_rope3d(GS, &x.g, &g.g, 1e-6f, c[0], c[2], c[3], c[4]));
        char what[64];
        snprintf(what, sizeof what, "rmsnorm_rope3d heads=%lld d=%lld", (long long)c[0],
                 (long long)c[1]);
        expect_nmse(what, dt, &x);
    }
}
END_TEST

/* The step's fused launches in a CUDA graph: GEMM with and without bias
 * (cuBLASLt BIAS / DEFAULT epilogues), GEMM_GELU with and without bias,
 * LAYERNORM_MODULATE and RMSNORM_ROPE3D. The eager run plans every GEMM
 * shape; the capture records without running (outputs stay poisoned); every
 * replay, after poisoning the outputs and restoring q, gives the eager
 * bits. */
START_TEST(test_fused_ops_and_cublaslt_gemms_in_a_cuda_graph_replay_bitwise_equal_to_eager) {
    kern_dtype_t dt = dtype_of(_i);
    const int64_t T = 48, D = 64, Fd = 160, H = 4; /* 48 tokens = 2 x 4 x 6, heads of 16 */
    pair_t x = P2(dt, T, D, -1, 1), sh = P1(dt, D, -1, 1), sc = P1(dt, D, -1, 1);
    pair_t w1 = P2(dt, Fd, D, -0.2f, 0.2f), b1 = P1(dt, Fd, -1, 1);
    pair_t w2 = P2(dt, D, Fd, -0.1f, 0.1f), b2 = P1(dt, D, -1, 1), g = P1(dt, D, -1, 1);
    pair_t q0 = P2(dt, T, D, -2, 2);
    enum { OUTS = 6 };
    kern_tensor_t out[OUTS] = {
        gpu_tensor(dt, 2, (int64_t[]){ T, D }),  gpu_tensor(dt, 2, (int64_t[]){ T, Fd }),
        gpu_tensor(dt, 2, (int64_t[]){ T, Fd }), gpu_tensor(dt, 2, (int64_t[]){ T, D }),
        gpu_tensor(dt, 2, (int64_t[]){ T, D }),  gpu_tensor(dt, 2, (int64_t[]){ T, D }),
    };
    static const char *names[OUTS] = { "layernorm_modulate", "gemm_gelu +bias", "gemm_gelu",
                                       "gemm +bias", "gemm", "rmsnorm_rope3d" };
    size_t big = kern_tensor_bytes(&out[1]);
    unsigned char *poison = hmalloc(big);
    memset(poison, 0xff, big);
    void *eager[OUTS];
    kern_graph_t *gr = NULL;
    for (int pass = 0; pass < 4; pass++) { /* 0 eager, 1 capture, 2 and 3 replays */
        for (int i = 0; i < OUTS; i++)
            TS_OK(kern_copy_h2d(GS, kern_tensor_ptr(&out[i]), poison, kern_tensor_bytes(&out[i])));
        TS_OK(kern_copy_d2d(GS, kern_tensor_ptr(&out[5]), kern_tensor_ptr(&q0.g),
                         kern_tensor_bytes(&out[5])));
        TS_OK(kern_stream_sync(GS));
        if (pass >= 2) {
            TS_OK(kern_graph_replay(gr, GS));
        } else {
            if (pass == 1) TS_OK(kern_capture_begin(GS));
            TS_OK(kern_layernorm_modulate(GS, &x.g, &sh.g, &sc.g, 1e-6f, &out[0]));
            TS_OK(kern_gemm_gelu(GS, &out[0], &w1.g, &b1.g, &out[1]));
            TS_OK(kern_gemm_gelu(GS, &out[0], &w1.g, NULL, &out[2]));
            TS_OK(kern_gemm(GS, &out[1], &w2.g, &b2.g, &out[3]));
            TS_OK(kern_gemm(GS, &out[2], &w2.g, NULL, &out[4]));
            TS_OK(kern_rmsnorm_rope3d(GS, &out[5], &g.g, 1e-6f, H, 2, 4, 6));
            if (pass == 1) {
                TS_OK(kern_capture_end(GS, &gr));
                own_graph(gr);
                ck_assert_msg(kern_graph_nodes(gr) >= OUTS, "%zu nodes for %d launches",
                              kern_graph_nodes(gr), OUTS);
            }
        }
        TS_OK(kern_stream_sync(GS));
        for (int i = 0; i < OUTS; i++) {
            void *now = download_raw(&out[i]);
            if (pass == 0) eager[i] = now;
            else if (pass == 1)
                ck_assert_msg(memcmp(now, i == 5 ? download_raw(&q0.g) : (void *)poison,
                                     kern_tensor_bytes(&out[i])) == 0,
                              "capture ran %s instead of recording it", names[i]);
            else
                ck_assert_msg(memcmp(now, eager[i], kern_tensor_bytes(&out[i])) == 0,
                              "replay %d: %s differs from the eager run (%s)", pass - 1, names[i],
                              kern_dtype_name(dt));
        }
    }
}
END_TEST

/* A GEMM shape never run on the stream has no cuBLASLt plan, and none is
 * made inside a capture: the launch fails naming the shape, the capture
 * still ends, the stream works; once the shape ran eagerly it captures and
 * replays bit for bit. */
START_TEST(test_gemm_shape_first_seen_inside_a_capture_fails_naming_it_then_captures_after_eager) {
    pair_t x = P2(KERN_F32, 19, 29, -1, 1), w = P2(KERN_F32, 23, 29, -1, 1);
    pair_t b = P1(KERN_F32, 23, -1, 1), y = P2(KERN_F32, 19, 23, 0, 0);
    TS_OK(kern_capture_begin(GS));
    reel_err_clear();
    ck_assert_int_eq(kern_gemm(GS, &x.g, &w.g, &b.g, &y.g), -1);
    ck_assert_msg(strstr(reel_err_text(), "no cuBLASLt plan") && strstr(reel_err_text(), "M=19 N=23 K=29"),
                  "message should name the missing plan and the shape: '%s'", reel_err_text());
    kern_graph_t *gr = NULL;
    if (kern_capture_end(GS, &gr) == 0) kern_graph_destroy(&gr);
    ck_assert(!kern_stream_is_capturing(GS));
    TS_OK(kern_gemm(CS, &x.c, &w.c, &b.c, &y.c));
    TS_OK(kern_gemm(GS, &x.g, &w.g, &b.g, &y.g));
    expect_nmse("gemm after a refused capture", KERN_F32, &y);
    void *eager = download_raw(&y.g);
    TS_OK(kern_capture_begin(GS));
    TS_OK(kern_gemm(GS, &x.g, &w.g, &b.g, &y.g));
    TS_OK(kern_capture_end(GS, &gr));
    own_graph(gr);
    unsigned char *poison = hmalloc(kern_tensor_bytes(&y.g));
    memset(poison, 0xff, kern_tensor_bytes(&y.g));
    TS_OK(kern_copy_h2d(GS, kern_tensor_ptr(&y.g), poison, kern_tensor_bytes(&y.g)));
    TS_OK(kern_graph_replay(gr, GS));
    TS_OK(kern_stream_sync(GS));
    ck_assert_msg(memcmp(download_raw(&y.g), eager, kern_tensor_bytes(&y.g)) == 0,
                  "replayed gemm differs from eager");
}
END_TEST

/* 140 GEMM shapes through one stream's plan cache (128 plans): the oldest
 * are recycled and planned again when they come back, and every result
 * matches the CPU. */
START_TEST(test_gemm_plan_cache_recycles_its_oldest_plans_and_replans_them) {
    enum { MAXM = 140, NN = 16, KK = 24 };
    pair_t x = P2(KERN_F32, MAXM, KK, -1, 1), w = P2(KERN_F32, NN, KK, -1, 1);
    pair_t b = P1(KERN_F32, NN, -1, 1), y = P2(KERN_F32, MAXM, NN, 0, 0);
    for (int pass = 0; pass < 2; pass++)
        for (int64_t m = 1; m <= MAXM; m += pass ? 23 : 1) {
            const int64_t sx[2] = { m, KK }, sy[2] = { m, NN };
            kern_tensor_t xc = kern_tensor_make(x.c.data, KERN_F32, x.c.device, 2, sx);
            kern_tensor_t xg = kern_tensor_make(x.g.data, KERN_F32, x.g.device, 2, sx);
            kern_tensor_t yc = kern_tensor_make(y.c.data, KERN_F32, y.c.device, 2, sy);
            kern_tensor_t yg = kern_tensor_make(y.g.data, KERN_F32, y.g.device, 2, sy);
            TS_OK(kern_gemm(CS, &xc, &w.c, &b.c, &yc));
            TS_OK(kern_gemm(GS, &xg, &w.g, &b.g, &yg));
            pair_t p = { yc, yg };
            char what[48];
            snprintf(what, sizeof what, "gemm M=%lld (pass %d)", (long long)m, pass);
            expect_nmse(what, KERN_F32, &p);
        }
}
END_TEST

/* cuDNN's fused SDPA (KERN_ATTN_SDPA, BF16) is trusted only once it agrees
 * with the cuBLAS decomposition on the device: NMSE <= 1e-3 against the
 * decomposition on the same inputs and against the CPU F32 reference (the
 * two BF16 paths round P differently), over d = 64 and 128, nq != nk, a
 * single key, and a Wan-like 2048 × 2048 × 12 × 128; then the SDPA call in a
 * CUDA graph replays bit for bit equal to eager. Skipped, loudly, in builds
 * without cuDNN. */
#ifdef HAVE_CUDNN
int reel_cudnn_lazy_check(const char **reason); /* kernels/cuda/cudnn_lazy.c */
#endif

START_TEST(test_cudnn_sdpa_matches_the_cublas_decomposition_and_replays_bitwise) {
#ifndef HAVE_CUDNN
    printf("test_cuda: SKIP cudnn sdpa: built without cuDNN (no cudnn.h beside the toolkit)\n");
#else
    const char *why = NULL;
    if (reel_cudnn_lazy_check(&why) != 0) { /* opened on first use: a machine without it runs all else */
        printf("test_cuda: SKIP cudnn sdpa: %s\n", why ? why : "cuDNN could not be loaded");
        return;
    }
    static const int64_t cases[][4] = { /* nq, nk, H, d */
        { 256, 256, 2, 64 }, { 300, 77, 4, 128 }, { 64, 1, 2, 128 }, { 2048, 2048, 12, 128 },
    };
    kern_attn_opts_t sdpa = { KERN_ATTN_SDPA, 0, false }, dec = { KERN_ATTN_DECOMPOSED, 0, false };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t nq = cases[c][0], nk = cases[c][1], H = cases[c][2], d = cases[c][3];
        pair_t q = P2(KERN_BF16, nq, H * d, -2, 2), k = P2(KERN_BF16, nk, H * d, -1, 1);
        pair_t v = P2(KERN_BF16, nk, H * d, -1, 1), o = P2(KERN_BF16, nq, H * d, 0, 0);
        kern_tensor_t od = gpu_tensor(KERN_BF16, 2, (int64_t[]){ nq, H * d });
        TS_OK(kern_attention(CS, &q.c, &k.c, &v.c, H, &o.c));
        TS_OK(kern_attention_ex(GS, &q.g, &k.g, &v.g, H, &o.g, &sdpa));
        TS_OK(kern_attention_ex(GS, &q.g, &k.g, &v.g, H, &od, &dec));
        char what[96];
        snprintf(what, sizeof what, "cudnn sdpa nq=%lld nk=%lld H=%lld d=%lld", (long long)nq,
                 (long long)nk, (long long)H, (long long)d);
        expect_nmse(what, KERN_BF16, &o);
        double e = nmse_of(download(&o.g), download(&od), nq * H * d);
        printf("test_cuda: %s: NMSE %.3g against the cuBLAS decomposition\n", what, e);
        ck_assert_msg(e <= 1e-3, "%s: NMSE %.3g against the cuBLAS decomposition > 1e-3", what, e);
    }
    pair_t q = P2(KERN_BF16, 300, 512, -2, 2), k = P2(KERN_BF16, 200, 512, -1, 1);
    pair_t v = P2(KERN_BF16, 200, 512, -1, 1);
    kern_tensor_t o = gpu_tensor(KERN_BF16, 2, (int64_t[]){ 300, 512 });
    TS_OK(kern_attention_ex(GS, &q.g, &k.g, &v.g, 4, &o, &sdpa)); /* plans the shape */
    TS_OK(kern_stream_sync(GS));
    void *eager = download_raw(&o);
    TS_OK(kern_capture_begin(GS));
    TS_OK(kern_attention_ex(GS, &q.g, &k.g, &v.g, 4, &o, &sdpa));
    kern_graph_t *gr = NULL;
    TS_OK(kern_capture_end(GS, &gr));
    own_graph(gr);
    unsigned char *poison = hmalloc(kern_tensor_bytes(&o));
    memset(poison, 0xff, kern_tensor_bytes(&o));
    for (int rep = 0; rep < 2; rep++) {
        TS_OK(kern_copy_h2d(GS, kern_tensor_ptr(&o), poison, kern_tensor_bytes(&o)));
        TS_OK(kern_graph_replay(gr, GS));
        TS_OK(kern_stream_sync(GS));
        ck_assert_msg(memcmp(download_raw(&o), eager, kern_tensor_bytes(&o)) == 0,
                      "replay %d of cuDNN SDPA differs from eager", rep);
    }
#endif
}
END_TEST

/* --- registry --------------------------------------------------------- */

/* ATTENTION_SDPA is the exception: cuDNN's fused attention, BF16 only, in
 * builds with cuDNN only (never F32). */
/* A mixed batch's batch-wide ops on CUDA (tests/row_groups_check.h): each
 * bitwise the same CUDA op called group by group (loop: the 12 cases x
 * F32, BF16). */
static const char *const rg_cases[] = { "layernorm_modulate", "residual_layernorm_modulate", "residual_layernorm",
                                        "gated_residual", "add_repeat", "rmsnorm_rope3d", "attention",
                                        "attention_shared_kv", "timestep_embed", "cfg_combine", "euler",
                                        "patchify" };
START_TEST(test_row_group_ops_are_bitwise_each_group_alone_on_cuda) {
    char why[512];
    kern_dtype_t dt = dtype_of(_i % 2);
    const char *name = rg_cases[_i / 2];
    ck_assert_msg(rg_check(G, GS, dt, name, why, sizeof why) == 0, "%s %s: %s", name, kern_dtype_name(dt), why);
}
END_TEST

START_TEST(test_every_op_has_cuda_f32_and_bf16_kernels_and_only_sde_is_not_capturable) {
    const kern_dtype_t dts[2] = { KERN_F32, KERN_BF16 };
    for (int op = 0; op < KERN_OP_COUNT; op++)
        for (int k = 0; k < 2; k++) {
            const kern_impl_t *impl = kern_registry_lookup(op, KERN_BACKEND_CUDA, dts[k]);
            if (op == KERN_OP_ATTENTION_SDPA) {
#ifdef HAVE_CUDNN
                const bool want = dts[k] == KERN_BF16;
#else
                const bool want = false;
#endif
                ck_assert_msg((impl != NULL) == want, "attention_sdpa %s: registered is %d",
                              kern_dtype_name(dts[k]), impl != NULL);
                if (!impl) continue;
            }
            ck_assert_msg(impl != NULL, "no CUDA %s kernel for %s", kern_dtype_name(dts[k]),
                          kern_op_name(op));
            ck_assert_msg(impl->name && strncmp(impl->name, "cuda_", 5) == 0, "%s: name '%s'",
                          kern_op_name(op), impl->name ? impl->name : "(null)");
            ck_assert_msg(impl->args_size >= sizeof(kern_args_hdr_t), "%s: args_size %zu",
                          kern_op_name(op), impl->args_size);
            ck_assert_msg(impl->workspace_bytes == NULL, "%s: CUDA kernels use no scratch",
                          kern_op_name(op));
            ck_assert_msg(impl->capturable == (op != KERN_OP_SDE), "%s: capturable is %d",
                          kern_op_name(op), impl->capturable);
        }
}
END_TEST

static Suite *cuda_suite(void) {
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("cuda_vs_cpu");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_cuda_backend_names_its_device_and_sm_arch);
    tcase_add_test(tc, test_cuda_new_on_a_missing_ordinal_fails_with_a_one_line_reason);
    tcase_add_test(tc, test_alloc_and_free_account_every_byte);
    tcase_add_test(tc, test_copies_round_trip_host_device_device_host_bit_for_bit);
    tcase_add_test(tc, test_weights_past_bf16_max_are_refused_by_a_bf16_model);
    tcase_add_loop_test(tc, test_gemm_with_and_without_bias_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_grouped_gemm_on_cuda_matches_cpu_and_merges_only_where_bitwise, 0, 2);
    tcase_add_loop_test(tc, test_row_group_ops_are_bitwise_each_group_alone_on_cuda, 0, 24);
    tcase_add_loop_test(tc, test_layernorm_affine_and_plain_match_cpu, 0, 2);
    tcase_add_loop_test(tc, test_layernorm_in_place_gives_the_same_bits_as_out_of_place, 0, 2);
    tcase_add_loop_test(tc, test_rmsnorm_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_modulate_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_gated_residual_with_and_without_gate_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_add_matches_cpu_over_many_blocks, 0, 2);
    tcase_add_loop_test(tc, test_gelu_tanh_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_silu_matches_cpu_including_overflowing_exponentials, 0, 2);
    tcase_add_loop_test(tc, test_silu_in_place_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_the_16_byte_paths_match_the_scalar_paths, 0, 2);
    tcase_add_loop_test(tc, test_residual_norm_is_bitwise_the_pair_on_both_paths_and_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_attention_matches_cpu_across_head_dims_and_ragged_tiles, 0, 2);
    tcase_add_loop_test(tc, test_attention_with_large_logits_stays_finite_and_matches_cpu, 0, 2);
    tcase_add_test(tc, test_attention_over_head_dim_256_runs_decomposed_and_the_fused_kernel_refuses_it);
    tcase_add_loop_test(tc, test_attention_decomposed_matches_cpu_and_the_online_kernel, 0, 2);
    tcase_add_loop_test(tc, test_attention_d128_in_a_cuda_graph_replays_bitwise_equal_to_eager, 0, 2);
    tcase_add_test(tc, test_wan_shaped_bf16_attention_matches_cpu_reference_on_sampled_rows);
    tcase_add_loop_test(tc, test_rope3d_matches_cpu_for_every_split_of_the_head, 0, 2);
    tcase_add_loop_test(tc, test_patchify_equals_cpu_exactly, 0, 2);
    tcase_add_loop_test(tc, test_unpatchify_equals_cpu_exactly, 0, 2);
    tcase_add_loop_test(tc, test_timestep_embed_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_cfg_combine_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_euler_update_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, test_multistep_update_and_timestep_at_match_cpu, 0, 2);
    tcase_add_loop_test(tc, test_sde_update_matches_cpu_noise_and_all, 0, 2);
    tcase_add_loop_test(tc, test_sde_dev_in_a_graph_replays_new_seeds_bitwise_equal_to_eager_sde, 0, 2);
    tcase_add_loop_test(tc, test_cuda_graph_replay_is_bitwise_equal_to_eager_and_reads_scalars_at_replay, 0, 2);
    tcase_add_test(tc, test_sde_refuses_to_launch_on_a_capturing_cuda_stream_and_runs_eagerly_after);
    tcase_add_loop_test(tc, test_gemm_gelu_with_and_without_bias_matches_cpu, 0, 2);
    tcase_add_test(tc, test_cublaslt_gelu_epilogue_is_the_tanh_form_of_tinydit);
    tcase_add_loop_test(tc, test_layernorm_modulate_matches_cpu_and_in_place_gives_the_same_bits, 0, 2);
    tcase_add_loop_test(tc, test_rmsnorm_rope3d_matches_cpu_for_every_split_of_the_head, 0, 2);
    tcase_add_loop_test(tc, test_fused_ops_and_cublaslt_gemms_in_a_cuda_graph_replay_bitwise_equal_to_eager, 0, 2);
    tcase_add_test(tc, test_gemm_shape_first_seen_inside_a_capture_fails_naming_it_then_captures_after_eager);
    tcase_add_test(tc, test_gemm_plan_cache_recycles_its_oldest_plans_and_replans_them);
    tcase_add_test(tc, test_every_op_has_cuda_f32_and_bf16_kernels_and_only_sde_is_not_capturable);
    tcase_add_loop_test(tc, test_tinydit_through_the_capture_cache_on_two_cuda_streams_replays_bitwise, 0, 2);
    tcase_add_loop_test(tc, test_a_batched_group_on_cuda_is_bitwise_the_single_requests, 0, 2);
    tcase_add_loop_test(tc, test_a_mixed_batch_on_cuda_is_bitwise_each_request_alone_eager_and_replayed, 0, 2);
    suite_add_tcase(s, tc);
    /* The fused path (AUTO's on CUDA in BF16 where cuDNN loads): its own
     * case, so deploy/gpu-check.sh runs it as its own row (CK_RUN_CASE=cudnn). */
    TCase *dnn = tcase_create("cudnn");
    tcase_add_checked_fixture(dnn, setup, teardown);
    tcase_add_test(dnn, test_cudnn_sdpa_matches_the_cublas_decomposition_and_replays_bitwise);
    suite_add_tcase(s, dnn);
    return s;
}

int main(void) { return ts_run_cuda(cuda_suite(), "test_cuda"); }

#endif /* HAVE_CUDA */
