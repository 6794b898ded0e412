/* test_base.c -- base/: the error value (code, public message, detail;
 * per thread; converted to an exit status) and the one number parser
 * (whole text, decimal, in range, the error naming the option). */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "base/logbudget.h"
#include "base/parse.h"
#include "base/tensor.h"
#include <math.h>
#include <stdbool.h>
#include "tests/support.h"

START_TEST(test_a_failure_records_code_message_and_detail_and_returns_minus_one) {
    reel_err_clear();
    ck_assert_int_eq(reel_err_code(), REEL_OK);
    ck_assert_int_eq(reel_fail(REEL_E_NOT_FOUND, "unknown worker '%s'", "w9"), -1);
    ck_assert_int_eq(reel_err()->code, REEL_E_NOT_FOUND);
    ck_assert_str_eq(reel_err()->msg, "unknown worker 'w9'");
    ck_assert_str_eq(reel_err()->detail, "");
    ck_assert_str_eq(reel_err_text(), "unknown worker 'w9'");
    ck_assert_int_eq(reel_fail_detail(REEL_E_IO, "/var/lib/reel/x.db: disk I/O error", "catalog write failed"), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_IO);
    ck_assert_str_eq(reel_err()->msg, "catalog write failed");
    ck_assert_str_eq(reel_err()->detail, "/var/lib/reel/x.db: disk I/O error");
    ck_assert_str_eq(reel_err_text(), "catalog write failed (/var/lib/reel/x.db: disk I/O error)");
    reel_err_clear();
    ck_assert_int_eq(reel_err_code(), REEL_OK);
    ck_assert_str_eq(reel_err_text(), "");
}
END_TEST

START_TEST(test_errno_goes_to_the_detail_and_enomem_becomes_nomem) {
    ck_assert_int_eq(reel_fail_errno(REEL_E_IO, ENOENT, "cannot open the weights"), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_IO);
    ck_assert_str_eq(reel_err()->msg, "cannot open the weights");
    ck_assert_str_eq(reel_err()->detail, strerror(ENOENT));
    reel_fail_errno(REEL_E_IO, ENOMEM, "reading");
    ck_assert_int_eq(reel_err_code(), REEL_E_NOMEM);
}
END_TEST

START_TEST(test_a_prefix_adds_context_and_keeps_code_and_detail) {
    reel_fail_detail(REEL_E_INVALID, "offset 12", "bad header");
    ck_assert_int_eq(reel_fail_prefix("loading %s: ", "w.safetensors"), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_str_eq(reel_err()->msg, "loading w.safetensors: bad header");
    ck_assert_str_eq(reel_err()->detail, "offset 12");
    /* a message built from the previous one (the retired idiom) is safe */
    reel_fail(REEL_E_STATE, "outer: %s", reel_err()->msg);
    ck_assert_str_eq(reel_err()->msg, "outer: loading w.safetensors: bad header");
}
END_TEST

START_TEST(test_long_messages_are_cut_never_overrun) {
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    reel_fail_detail(REEL_E_INVALID, big, "%s", big);
    ck_assert_uint_eq(strlen(reel_err()->msg), REEL_ERR_MSG - 1);
    ck_assert_uint_eq(strlen(reel_err()->detail), REEL_ERR_DETAIL - 1);
    ck_assert_uint_eq(strlen(reel_err_text()), REEL_ERR_MSG - 1 + REEL_ERR_DETAIL - 1 + 3);
    reel_fail_prefix("%s", big);
    ck_assert_uint_eq(strlen(reel_err()->msg), REEL_ERR_MSG - 1);
}
END_TEST

static void *other_thread(void *arg) {
    (void)arg;
    /* a new thread starts with no error and its failures stay its own */
    int clean = reel_err_code() == REEL_OK && reel_err()->msg[0] == '\0';
    reel_fail(REEL_E_TIMEOUT, "other");
    return (void *)(intptr_t)clean;
}

START_TEST(test_each_thread_has_its_own_error_value) {
    reel_fail(REEL_E_LIMIT, "mine");
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, other_thread, NULL), 0);
    void *clean;
    ck_assert_int_eq(pthread_join(t, &clean), 0);
    ck_assert_msg((intptr_t)clean, "a new thread saw another thread's error");
    ck_assert_int_eq(reel_err_code(), REEL_E_LIMIT);
    ck_assert_str_eq(reel_err()->msg, "mine");
}
END_TEST

START_TEST(test_codes_have_names_and_exit_statuses) {
    ck_assert_str_eq(reel_code_name(REEL_E_INVALID), "invalid");
    ck_assert_str_eq(reel_code_name(REEL_E_NOT_FOUND), "not_found");
    ck_assert_str_eq(reel_code_name(REEL_E_INTERNAL), "internal");
    ck_assert_str_eq(reel_code_name((reel_code_t)99), "?");
    ck_assert_int_eq(reel_exit_status(REEL_OK), 0);
    ck_assert_int_eq(reel_exit_status(REEL_E_INVALID), 2);
    ck_assert_int_eq(reel_exit_status(REEL_E_NOT_FOUND), 2);
    ck_assert_int_eq(reel_exit_status(REEL_E_IO), 1);
    ck_assert_int_eq(reel_exit_status(REEL_E_DEVICE), 1);
    ck_assert_int_eq(reel_exit_status(REEL_E_INTERNAL), 1);
    /* a code out of range is recorded as internal, never as ok */
    reel_fail((reel_code_t)0, "no code given");
    ck_assert_int_eq(reel_err_code(), REEL_E_INTERNAL);
}
END_TEST

START_TEST(test_integers_parse_whole_and_in_range) {
    int64_t v = 7;
    ck_assert_int_eq(reel_parse_i64("-42", -100, 100, "--x", &v), 0);
    ck_assert_int_eq(v, -42);
    ck_assert_int_eq(reel_parse_i64("9223372036854775807", INT64_MIN, INT64_MAX, "--x", &v), 0);
    ck_assert(v == INT64_MAX);
    int i = 0;
    ck_assert_int_eq(reel_parse_int("65535", 1, 65535, "--port", &i), 0);
    ck_assert_int_eq(i, 65535);
    uint64_t u = 0;
    ck_assert_int_eq(reel_parse_u64("18446744073709551615", 0, UINT64_MAX, "--n", &u), 0);
    ck_assert(u == UINT64_MAX);
}
END_TEST

START_TEST(test_every_malformed_integer_is_refused_naming_the_option_and_the_text) {
    static const char *bad[] = { "", " 5", "5 ", "+5", "5x", "0x10", "1e3", "1.5", "-", "--5", "five" };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int64_t v = 123;
        reel_err_clear();
        ck_assert_msg(reel_parse_i64(bad[k], -1000, 1000, "--steps", &v) == -1, "'%s' was accepted", bad[k]);
        ck_assert_int_eq(v, 123);
        ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
        ck_assert_msg(strstr(reel_err()->msg, "--steps") != NULL, "%s", reel_err()->msg);
    }
    int64_t v;
    ck_assert_int_eq(reel_parse_i64(NULL, 0, 1, "--steps", &v), -1);
    /* overflow and range say so */
    ck_assert_int_eq(reel_parse_i64("99999999999999999999", INT64_MIN, INT64_MAX, "--steps", &v), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "out of range"));
    ck_assert_int_eq(reel_parse_i64("1001", -1000, 1000, "--steps", &v), -1);
    ck_assert_str_eq(reel_err()->msg, "--steps: 1001 is out of range [-1000, 1000]");
    int i;
    ck_assert_int_eq(reel_parse_int("2147483648", 0, 2147483647, "--n", &i), -1);
    uint64_t u;
    ck_assert_int_eq(reel_parse_u64("-1", 0, 10, "--n", &u), -1);
    ck_assert_int_eq(reel_parse_u64("18446744073709551616", 0, UINT64_MAX, "--n", &u), -1);
    ck_assert_int_eq(reel_parse_u64("0", 1, 10, "--n", &u), -1);
    /* a long argument is quoted cut short */
    char longarg[300];
    memset(longarg, '7', sizeof longarg - 1);
    longarg[sizeof longarg - 1] = 'z';
    longarg[sizeof longarg - 1] = '\0';
    longarg[200] = 'z';
    ck_assert_int_eq(reel_parse_u64(longarg, 0, 10, "--n", &u), -1);
    ck_assert_uint_lt(strlen(reel_err()->msg), 120);
}
END_TEST

START_TEST(test_floats_parse_finite_and_in_range) {
    double d = 0;
    ck_assert_int_eq(reel_parse_f64("0.5", 0, 1, "--eta", &d), 0);
    ck_assert(d == 0.5);
    ck_assert_int_eq(reel_parse_f64("1e-3", 0, 1, "--eta", &d), 0);
    ck_assert(d == 1e-3);
    ck_assert_int_eq(reel_parse_f64("-.25", -1, 1, "--x", &d), 0);
    ck_assert(d == -0.25);
    static const char *bad[] = { "", "nan", "inf", "-inf", "1e999", " 1", "1 ", "+1", "0.5x", "2" };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        double v = 9;
        ck_assert_msg(reel_parse_f64(bad[k], 0, 1, "--eta", &v) == -1, "'%s' was accepted", bad[k]);
        ck_assert(v == 9);
        ck_assert_ptr_nonnull(strstr(reel_err()->msg, "--eta"));
    }
}
END_TEST

START_TEST(test_byte_counts_take_units_and_refuse_junk_and_overflow) {
    uint64_t b = 0;
    ck_assert_int_eq(reel_parse_bytes("4096", UINT64_MAX, "--budget", &b), 0);
    ck_assert(b == 4096);
    ck_assert_int_eq(reel_parse_bytes("512M", UINT64_MAX, "--budget", &b), 0);
    ck_assert(b == 512ull << 20);
    ck_assert_int_eq(reel_parse_bytes("64GiB", UINT64_MAX, "--budget", &b), 0);
    ck_assert(b == 64ull << 30);
    ck_assert_int_eq(reel_parse_bytes("2tb", UINT64_MAX, "--budget", &b), 0);
    ck_assert(b == 2ull << 40);
    ck_assert_int_eq(reel_parse_bytes("100B", UINT64_MAX, "--budget", &b), 0);
    ck_assert(b == 100);
    static const char *bad[] = { "", "G", "-1G", "1X", "1GiBx", "1 G", "99999999999T", "18446744073709551616" };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        uint64_t v = 5;
        ck_assert_msg(reel_parse_bytes(bad[k], UINT64_MAX, "--budget", &v) == -1, "'%s' was accepted", bad[k]);
        ck_assert(v == 5);
    }
    ck_assert_int_eq(reel_parse_bytes("2G", 1ull << 30, "--budget", &b), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "more than"));
}
END_TEST

/* kern_all_finite and kern_all_below over F32, BF16 and F16: every value
 * just below 2^e passes, 2^e itself and NaN or infinity do not, at any
 * position and alignment; F16 cannot hold 2^16, so only its NaN and
 * infinity fail e = 24. */
START_TEST(test_value_scans_find_nan_inf_and_magnitudes_of_two_to_the_e) {
    unsigned char buf[4 * 37 + 3];
    float f[37];
    for (int i = 0; i < 37; i++) f[i] = (i % 2 ? -1.0f : 1.0f) * (float)i * 0.5f;
    for (int off = 0; off < 3; off++) {
        memcpy(buf + off, f, sizeof f);
        ck_assert(kern_all_finite(buf + off, 37, KERN_F32));
        ck_assert(kern_all_below(buf + off, 37, KERN_F32, 5)); /* |x| <= 18 < 32 */
        ck_assert(!kern_all_below(buf + off, 37, KERN_F32, 4)); /* 18 >= 16 */
        const float probe[] = { 0x1p24f, -0x1p24f, 0x1.fffffep23f, NAN, INFINITY, 1e18f, 3e38f };
        const bool below[] = { false, false, true, false, false, false, false };
        for (size_t k = 0; k < sizeof probe / sizeof *probe; k++) {
            float g[37];
            memcpy(g, f, sizeof g);
            g[k * 5] = probe[k];
            memcpy(buf + off, g, sizeof g);
            ck_assert_msg(kern_all_below(buf + off, 37, KERN_F32, 24) == below[k], "F32 %g", (double)probe[k]);
            ck_assert(kern_all_finite(buf + off, 37, KERN_F32) == isfinite(probe[k]));
            uint16_t h[37];
            for (int i = 0; i < 37; i++) h[i] = kern_f32_to_bf16(g[i]);
            memcpy(buf + off, h, sizeof h);
            /* 0x1.fffffep23 rounds to 2^24 in BF16 */
            bool bb = below[k] && probe[k] != 0x1.fffffep23f;
            ck_assert_msg(kern_all_below(buf + off, 37, KERN_BF16, 24) == bb, "BF16 %g", (double)probe[k]);
        }
    }
    uint16_t h16[4] = { 0x3c00, 0x7bff, 0xfbff, 0x0001 }; /* 1, 65504, -65504, a subnormal */
    ck_assert(kern_all_below(h16, 4, KERN_F16, 24));
    ck_assert(kern_all_below(h16, 4, KERN_F16, 16));
    ck_assert(!kern_all_below(h16, 4, KERN_F16, 15));
    h16[2] = 0x7c00; /* infinity */
    ck_assert(!kern_all_below(h16, 4, KERN_F16, 24));
    ck_assert(!kern_all_finite(h16, 4, KERN_F16));
}
END_TEST

/* The scans' reference: each value's exponent field read one at a time. */
static bool ref_reaches(const unsigned char *b, size_t n, kern_dtype_t dt, unsigned lim) {
    for (size_t i = 0; i < n; i++) {
        unsigned field;
        if (dt == KERN_F32) {
            uint32_t w;
            memcpy(&w, b + 4 * i, 4);
            field = (w >> 23) & 0xffu;
        } else {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            field = dt == KERN_BF16 ? (h >> 7) & 0xffu : (h >> 10) & 0x1fu;
        }
        if (field >= lim) return true;
    }
    return false;
}

/* The scans go by blocks (vector code, an early exit per block) and a
 * tail: against the one-at-a-time reference, for every length up to 3
 * blocks and some past, every position of one value at or past the
 * bound (in a block, its tail, at a block's edge), each dtype, each
 * alignment, random finite values around it and every exponent bound. */
START_TEST(test_value_scans_agree_with_a_value_at_a_time_at_every_length_and_position) {
    enum { MAXN = 260 };
    static unsigned char buf[4 * MAXN + 3];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    const kern_dtype_t dts[] = { KERN_F32, KERN_BF16, KERN_F16 };
    long checked = 0;
    for (size_t d = 0; d < 3; d++) {
        const kern_dtype_t dt = dts[d];
        const size_t es = kern_dtype_size(dt);
        const unsigned top = dt == KERN_F16 ? 31 : 255, bias = dt == KERN_F16 ? 15 : 127;
        for (size_t n = 0; n <= MAXN; n += n < 140 ? 1 : 7) {
            const size_t off = n % 3;
            unsigned char *b = buf + off;
            /* finite values with fields below bias + 3 (|x| < 8) */
            for (size_t i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                uint32_t bits = (uint32_t)(r >> 32), field = (uint32_t)(r >> 24) % (bias + 3);
                if (dt == KERN_F32) {
                    uint32_t w = (bits & 0x807fffffu) | (field << 23);
                    memcpy(b + 4 * i, &w, 4);
                } else {
                    uint16_t h = dt == KERN_BF16 ? (uint16_t)((bits & 0x807fu) | (field << 7))
                                                 : (uint16_t)((bits & 0x83ffu) | (field << 10));
                    memcpy(b + 2 * i, &h, 2);
                }
            }
            /* each position gets a value of field f in turn, f past the
             * random ones: bias + 3 .. top (infinity and NaN at top) */
            for (size_t at = 0; at < n; at += (n < 20 || at % 64 >= 62 || at % 64 <= 1 || at + 2 >= n) ? 1 : 13) {
                unsigned char keep[4];
                memcpy(keep, b + es * at, es);
                const unsigned fs[] = { bias + 3, bias + 4, (bias + top) / 2, top - 1, top };
                for (size_t q = 0; q < sizeof fs / sizeof *fs; q++) {
                    const unsigned f = fs[q];
                    if (dt == KERN_F32) {
                        uint32_t w = (f << 23) | (uint32_t)(at & 1 ? 0x80000001u : 0u);
                        memcpy(b + 4 * at, &w, 4);
                    } else {
                        uint16_t h = (uint16_t)(dt == KERN_BF16 ? f << 7 : f << 10) | (uint16_t)(at & 1 ? 0x8001u : 0u);
                        memcpy(b + 2 * at, &h, 2);
                    }
                    ck_assert_msg(kern_all_finite(b, n, dt) == !ref_reaches(b, n, dt, top),
                                  "finite: %s n %zu at %zu field %u", kern_dtype_name(dt), n, at, f);
                    /* the bounds at the value's field, one either side, and far ones */
                    const int fe = (int)f - (int)bias;
                    const int es_[] = { 0, 3, fe - 1, fe, fe + 1, 24, 127 };
                    for (size_t k = 0; k < sizeof es_ / sizeof *es_; k++) {
                        const int e = es_[k];
                        if (e < 0 || e > 127) continue;
                        unsigned lim = dt == KERN_F16 ? (bias + (unsigned)e < 31 ? bias + (unsigned)e : 31) : bias + (unsigned)e;
                        ck_assert_msg(kern_all_below(b, n, dt, e) == !ref_reaches(b, n, dt, lim),
                                      "below 2^%d: %s n %zu at %zu field %u", e, kern_dtype_name(dt), n, at, f);
                        checked++;
                    }
                }
                memcpy(b + es * at, keep, es);
            }
            ck_assert(kern_all_finite(b, n, dt));
            for (int e = 0; e < 128; e++) {
                unsigned lim = dt == KERN_F16 ? (bias + (unsigned)e < 31 ? bias + (unsigned)e : 31) : bias + (unsigned)e;
                ck_assert(kern_all_below(b, n, dt, e) == !ref_reaches(b, n, dt, lim));
            }
        }
    }
    ck_assert(checked > 20000);
}
END_TEST

/* A peer's share of a log (the broker's workers, the worker's refused
 * messages): REEL_LOG_BURST lines a window, the rest counted; the count is
 * handed over once, when the window is over -- to the next line, or to a
 * tick that finds the window over with no line since (a flood that
 * stopped) -- and a new window starts with a fresh burst. */
START_TEST(test_a_log_budget_writes_a_burst_a_window_and_counts_the_rest_once) {
    reel_log_budget_t lb = { 0 };
    uint64_t left = 99;
    const int64_t t0 = 1000000;
    for (int i = 0; i < REEL_LOG_BURST; i++) {
        ck_assert(reel_log_budget_take(&lb, t0 + i, &left));
        ck_assert_uint_eq(left, 0);
    }
    for (int i = 0; i < 1000; i++) ck_assert(!reel_log_budget_take(&lb, t0 + 100, &left));
    ck_assert_uint_eq(lb.suppressed, 1000);
    ck_assert_uint_eq(reel_log_budget_expired(&lb, t0 + REEL_LOG_WINDOW_MS - 1), 0); /* the window still runs */
    ck_assert(!reel_log_budget_take(&lb, t0 + REEL_LOG_WINDOW_MS - 1, &left));
    ck_assert_uint_eq(left, 0);
    /* the next line after the window: it may be written, after the count */
    ck_assert(reel_log_budget_take(&lb, t0 + REEL_LOG_WINDOW_MS, &left));
    ck_assert_uint_eq(left, 1001);
    for (int i = 1; i < REEL_LOG_BURST; i++) ck_assert(reel_log_budget_take(&lb, t0 + REEL_LOG_WINDOW_MS, &left));
    ck_assert(!reel_log_budget_take(&lb, t0 + REEL_LOG_WINDOW_MS, &left));
    ck_assert(!reel_log_budget_take(&lb, t0 + REEL_LOG_WINDOW_MS, &left));
    /* no line after the flood: the tick hands the count over, once */
    ck_assert_uint_eq(reel_log_budget_expired(&lb, t0 + 2 * REEL_LOG_WINDOW_MS), 2);
    ck_assert_uint_eq(reel_log_budget_expired(&lb, t0 + 3 * REEL_LOG_WINDOW_MS), 0);
    ck_assert(reel_log_budget_take(&lb, t0 + 3 * REEL_LOG_WINDOW_MS, &left));
    ck_assert_uint_eq(left, 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("base");
    TCase *e = tcase_create("error");
    tcase_add_test(e, test_a_failure_records_code_message_and_detail_and_returns_minus_one);
    tcase_add_test(e, test_errno_goes_to_the_detail_and_enomem_becomes_nomem);
    tcase_add_test(e, test_a_prefix_adds_context_and_keeps_code_and_detail);
    tcase_add_test(e, test_long_messages_are_cut_never_overrun);
    tcase_add_test(e, test_each_thread_has_its_own_error_value);
    tcase_add_test(e, test_codes_have_names_and_exit_statuses);
    suite_add_tcase(s, e);
    TCase *p = tcase_create("parse");
    tcase_add_test(p, test_integers_parse_whole_and_in_range);
    tcase_add_test(p, test_every_malformed_integer_is_refused_naming_the_option_and_the_text);
    tcase_add_test(p, test_floats_parse_finite_and_in_range);
    tcase_add_test(p, test_byte_counts_take_units_and_refuse_junk_and_overflow);
    suite_add_tcase(s, p);
    TCase *v = tcase_create("values");
    tcase_add_test(v, test_value_scans_find_nan_inf_and_magnitudes_of_two_to_the_e);
    tcase_add_test(v, test_value_scans_agree_with_a_value_at_a_time_at_every_length_and_position);
    suite_add_tcase(s, v);
    TCase *l = tcase_create("log");
    tcase_add_test(l, test_a_log_budget_writes_a_burst_a_window_and_counts_the_rest_once);
    suite_add_tcase(s, l);
    return s;
}

int main(void) {
    return ts_run(suite());
}
