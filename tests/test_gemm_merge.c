/* test_gemm_merge.c -- may a batch's token GEMMs run as one
 * (model/gemm_merge.c)? The verdict of the probe holds for operands it
 * never saw: for token counts small and large, batches of 2 to 8 and the
 * tiny and small configs' GEMM shapes, one grouped GEMM over B·n rows is
 * bitwise the B GEMMs of n rows exactly when the probe said so, on values
 * drawn here; and on the CPU the grouped GEMM is bitwise its groups alone
 * at every shape (its tiles are theirs), so every shape merges. The policy
 * NEVER, BF16 and single samples never merge. (That a
 * batch step is bitwise its requests alone, merged or not: test_mix_req,
 * test_mixed_batch, test_tdit_cache.) */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/error.h"
#include "kernels/ops.h"
#include "model/tinydit.h"
#include "tests/support.h"

/* merged vs per-sample on values from seed: true when bitwise equal */
static bool same_here(kern_backend_t *b, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu, uint64_t seed) {
    kern_stream_t *s = kern_stream_new(b);
    TS_NEW(s);
    size_t nx = (size_t)(B * n * K), nw = (size_t)(N * K), ny = (size_t)(B * n * N);
    float *hx = malloc(nx * 4), *hw = malloc(nw * 4), *hb = malloc((size_t)N * 4), *r1 = malloc(ny * 4),
          *r2 = malloc(ny * 4);
    ts_fill_uniform(hx, nx, seed, -3, 3);
    ts_fill_uniform(hw, nw, seed + 1, -0.5f, 0.5f);
    ts_fill_uniform(hb, (size_t)N, seed + 2, -1, 1);
    kern_tensor_t x = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ B * n, K });
    kern_tensor_t w = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ N, K });
    kern_tensor_t bias = kern_tensor_alloc(b, KERN_F32, 1, (const int64_t[]){ N });
    kern_tensor_t y1 = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ B * n, N });
    kern_tensor_t y2 = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ B * n, N });
    TS_OK(kern_copy_h2d(s, kern_tensor_ptr(&x), hx, nx * 4));
    TS_OK(kern_copy_h2d(s, kern_tensor_ptr(&w), hw, nw * 4));
    TS_OK(kern_copy_h2d(s, kern_tensor_ptr(&bias), hb, (size_t)N * 4));
    TS_OK(kern_gemm_grouped(s, &x, &w, &bias, &y1, n, gelu));
    for (int64_t i = 0; i < B; i++) {
        kern_tensor_t xb = kern_tensor_make(x.data, KERN_F32, x.device, 2, (const int64_t[]){ n, K });
        kern_tensor_t yb = kern_tensor_make(y2.data, KERN_F32, y2.device, 2, (const int64_t[]){ n, N });
        xb.offset = x.offset + (size_t)(i * n * K) * 4;
        yb.offset = y2.offset + (size_t)(i * n * N) * 4;
        TS_OK(gelu ? kern_gemm_gelu(s, &xb, &w, &bias, &yb) : kern_gemm(s, &xb, &w, &bias, &yb));
    }
    TS_OK(kern_copy_d2h(s, r1, kern_tensor_ptr(&y1), ny * 4));
    TS_OK(kern_copy_d2h(s, r2, kern_tensor_ptr(&y2), ny * 4));
    TS_OK(kern_stream_sync(s));
    bool eq = !memcmp(r1, r2, ny * 4);
    kern_free(b, x.data);
    kern_free(b, w.data);
    kern_free(b, bias.data);
    kern_free(b, y1.data);
    kern_free(b, y2.data);
    free(hx);
    free(hw);
    free(hb);
    free(r1);
    free(r2);
    kern_stream_destroy(&s);
    return eq;
}

START_TEST(test_the_probe_verdict_holds_for_operands_it_never_saw) {
    kern_backend_t *b = kern_backend_cpu_new();
    TS_NEW(b);
    /* (K, N, gelu): tiny's and small's token GEMMs */
    static const int64_t kn[][3] = { { 16, 64, 0 }, { 64, 64, 0 }, { 64, 128, 1 }, { 128, 64, 0 }, { 64, 16, 0 },
                                     { 64, 384, 0 }, { 384, 384, 0 }, { 384, 1024, 1 }, { 1024, 384, 0 } };
    static const int64_t ns[] = { 5, 16, 32, 64, 128 }, bs[] = { 2, 3, 8 };
    int yes = 0, no = 0;
    /* Each merging shape is checked on new operands of 2 seeds; under a
     * sanitizer (make asan/tsan: races and memory, not the verdicts, which
     * the plain suite checks in full) on 1, said below. */
    size_t step_n = 1, step_b = 1; /* every n and B; under TSan every other */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    const uint64_t seeds = 1;
    fprintf(stderr, "test_gemm_merge: a sanitizer build: each shape on new operands of 1 seed (the plain suite: 2)\n");
#else
    const uint64_t seeds = 2;
#endif
#if defined(__SANITIZE_THREAD__)
    step_n = step_b = 2;
    fprintf(stderr, "test_gemm_merge: a TSan build: n 5, 32, 128 and B 2, 8 (the plain suite: every n and B)\n");
#endif
    for (size_t i = 0; i < sizeof kn / sizeof kn[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j += step_n)
            for (size_t k = 0; k < sizeof bs / sizeof bs[0]; k += step_b) {
                bool v = tdit_gemm_merge_probe(b, ns[j], bs[k], kn[i][0], kn[i][1], kn[i][2]);
                bool ok = tdit_gemm_merge_ok(b, KERN_F32, ns[j], bs[k], kn[i][0], kn[i][1], kn[i][2]);
                ck_assert_msg(v == ok, "the kept verdict is the probe's");
                for (uint64_t seed = 100; seed < 100 + seeds; seed++)
                    ck_assert_msg(!v || same_here(b, ns[j], bs[k], kn[i][0], kn[i][1], kn[i][2], seed),
                                  "n %lld B %lld K %lld N %lld: probed bitwise, differs on new operands",
                                  (long long)ns[j], (long long)bs[k], (long long)kn[i][0], (long long)kn[i][1]);
                yes += v;
                no += !v;
            }
    fprintf(stderr, "test_gemm_merge: %d shapes merge bitwise here, %d do not\n", yes, no);
    ck_assert_msg(no == 0, "%d shapes do not merge: a grouped GEMM's tiles are its groups' own calls", no);
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    kern_backend_destroy(&b);
}
END_TEST

/* Groups large enough to be cut in tiles (300 rows = 256 + 44, 1,536
 * columns in 128s, 8,960 in the FFN), on pools of 1, 2 and 3 threads: each
 * group's rows are its GEMM alone, bit for bit, GELU or not. */
START_TEST(test_a_grouped_gemm_is_bitwise_its_groups_alone_when_tiled_on_any_pool) {
    kern_backend_t *b = kern_backend_cpu_new();
    TS_NEW(b);
    static const int64_t shapes[][5] = { /* n, B, K, N, gelu */
        { 300, 2, 256, 1536, 0 }, { 300, 3, 1536, 256, 1 }, { 64, 4, 1536, 1536, 0 }, { 1024, 2, 64, 8960, 1 } };
    static const int threads[] = { 1, 2, 3 };
    size_t nshapes = sizeof shapes / sizeof shapes[0];
#if defined(__SANITIZE_THREAD__)
    /* TSan looks for races, which the three smaller shapes' tiles on every
     * pool exercise alike; the FFN shape (2,048 x 8,960 outputs, 90% of the
     * elements) took most of make test's TSan phase. The plain and ASan
     * suites run all four. */
    nshapes = 3;
    fprintf(stderr, "test_gemm_merge: a TSan build: the three smaller tiled shapes (the plain suite: all four)\n");
#endif
    for (size_t i = 0; i < nshapes; i++)
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            kern_cpu_threads_set(threads[t]);
            ck_assert_msg(same_here(b, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], 7 + t),
                          "n %lld B %lld K %lld N %lld on %d threads: a group differs from its GEMM alone",
                          (long long)shapes[i][0], (long long)shapes[i][1], (long long)shapes[i][2],
                          (long long)shapes[i][3], threads[t]);
        }
    kern_cpu_threads_set(0);
    kern_backend_destroy(&b);
}
END_TEST

/* Groups that do not divide the rows, or of no rows, are refused with a
 * message naming the op; y is not written. */
START_TEST(test_a_grouped_gemm_refuses_groups_that_do_not_divide_its_rows) {
    kern_backend_t *b = kern_backend_cpu_new();
    TS_NEW(b);
    kern_stream_t *s = kern_stream_new(b);
    kern_tensor_t x = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ 10, 4 });
    kern_tensor_t w = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ 3, 4 });
    kern_tensor_t y = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ 10, 3 });
    memset(x.data, 0, 160);
    memset(w.data, 0, 48);
    memset(y.data, 0x7f, 120);
    ck_assert_int_eq(kern_gemm_grouped(s, &x, &w, NULL, &y, 3, false), -1);
    ck_assert_msg(strstr(reel_err_text(), "gemm: groups of 3 rows do not divide x's 10 rows"), "%s", reel_err_text());
    ck_assert_int_eq(kern_gemm_grouped(s, &x, &w, NULL, &y, 0, true), -1);
    ck_assert_msg(strstr(reel_err_text(), "gemm_gelu: groups of 0 rows"), "%s", reel_err_text());
    ck_assert_int_eq(((unsigned char *)y.data)[0], 0x7f);
    TS_OK(kern_gemm_grouped(s, &x, &w, NULL, &y, 5, false));
    TS_OK(kern_stream_sync(s));
    ck_assert(((float *)y.data)[0] == 0.0f);
    kern_free(b, x.data);
    kern_free(b, w.data);
    kern_free(b, y.data);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
}
END_TEST

START_TEST(test_never_bf16_and_single_samples_do_not_merge) {
    kern_backend_t *b = kern_backend_cpu_new();
    TS_NEW(b);
    ck_assert(!tdit_gemm_merge_ok(b, KERN_F32, 64, 1, 64, 64, false));
    ck_assert(!tdit_gemm_merge_ok(b, KERN_BF16, 64, 4, 64, 64, false));
    ck_assert(!tdit_gemm_merge_probe(b, 64, 1, 64, 64, false));
    tdit_gemm_merge_set_policy(TDIT_MERGE_NEVER);
    for (int64_t n = 16; n <= 256; n *= 2) ck_assert(!tdit_gemm_merge_ok(b, KERN_F32, n, 4, 64, 64, false));
    tdit_gemm_merge_set_policy(TDIT_MERGE_AUTO);
    kern_backend_destroy(&b);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gemm_merge");
    TCase *tc = tcase_create("merge");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_the_probe_verdict_holds_for_operands_it_never_saw);
    tcase_add_test(tc, test_never_bf16_and_single_samples_do_not_merge);
    tcase_add_test(tc, test_a_grouped_gemm_is_bitwise_its_groups_alone_when_tiled_on_any_pool);
    tcase_add_test(tc, test_a_grouped_gemm_refuses_groups_that_do_not_divide_its_rows);
    suite_add_tcase(s, tc);
    return ts_run(s);
}
