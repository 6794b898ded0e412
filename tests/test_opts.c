/* test_opts.c -- base/opts: the table-driven option parser the daemons and
 * reelctl run share. Each kind stores its value where its row says, a value
 * out of range or of the wrong form is refused naming the option and the
 * value, an unknown option and a missing value are refused by name (all
 * through the error value, base/error.h), a help row stops parsing, and
 * usage lines line up at their column. */
#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "base/opts.h"
#include "base/parse.h"
#include "tests/support.h"

typedef struct {
    bool flag, bf;
    int n, pick;
    int64_t big;
    uint64_t u;
    double d;
    float f;
    const char *s;
    int sets;
} o_t;

static int set_even(void *dst, const char *v) {
    if (strlen(v) % 2) return -1; /* records nothing */
    ((o_t *)dst)->sets++;
    return 0;
}
static int set_says(void *dst, const char *v) {
    (void)dst;
    return reel_fail(REEL_E_NOT_FOUND, "--says: nothing like '%s'", v);
}
/* Fails through a helper that words its own error; the row's expect wins. */
static int set_odd(void *dst, const char *v) {
    int n;
    if (reel_parse_int(v, 1, 99, "--odd", &n) || n % 2 == 0) return -1;
    ((o_t *)dst)->sets++;
    return 0;
}
/* Records nothing and its row has no expect: the generic message. */
static int set_mute(void *dst, const char *v) {
    (void)dst, (void)v;
    return -1;
}

static const char *const colours[] = { "red", "green", "blue", NULL };
static const char *const onoff[] = { "off", "on", NULL };

#define O(f) offsetof(o_t, f)
static const reel_opt_t rows[] = {
    { .name = "flag", .short_name = 'f', .kind = REEL_OPT_FLAG, .off = O(flag), .help = "a flag" },
    { .name = "n", .short_name = 'n', .kind = REEL_OPT_INT, .off = O(n), .lo = 1, .hi = 10, .arg = "N",
      .help = "a count\nof things" },
    { .name = "big", .kind = REEL_OPT_I64, .off = O(big), .lo = -5, .hi = (long long)1 << 40, .arg = "N" },
    { .name = "u", .kind = REEL_OPT_U64, .off = O(u), .ulo = 0, .uhi = UINT64_MAX, .arg = "U" },
    { .name = "d", .kind = REEL_OPT_DOUBLE, .off = O(d), .dlo = 0, .dhi = 1 },
    { .name = "f", .kind = REEL_OPT_FLOAT, .off = O(f) },
    { .name = "s", .kind = REEL_OPT_STRING, .off = O(s), .arg = "A-VERY-LONG-METAVAR-NAME", .help = "text" },
    { .name = "colour", .kind = REEL_OPT_CHOICE, .off = O(pick), .choices = colours },
    { .name = "onoff", .kind = REEL_OPT_BOOL_CHOICE, .off = O(bf), .choices = onoff },
    { .name = "even", .kind = REEL_OPT_SET, .set = set_even, .expect = "an even length" },
    { .name = "says", .kind = REEL_OPT_SET, .set = set_says },
    { .name = "odd", .kind = REEL_OPT_SET, .set = set_odd, .expect = "an odd number below 100" },
    { .name = "mute", .kind = REEL_OPT_SET, .set = set_mute },
    { .name = "help", .short_name = 'h', .kind = REEL_OPT_HELP },
};
#define N (sizeof rows / sizeof rows[0])

static int rest;

/* The message of the failure a parse leaves (base/error.h). */
static const char *msg(void) { return reel_err()->msg; }

static int parse(o_t *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    reel_err_clear();
    return reel_opts_parse(rows, N, o, argc, argv, &rest);
}
#define PARSE(o, ...) parse(o, (int)(sizeof (char *[]){ "prog", __VA_ARGS__ } / sizeof(char *)), (char *[]){ "prog", __VA_ARGS__, NULL })

START_TEST(test_each_kind_stores_its_value_where_its_row_says) {
    o_t o;
    ck_assert_int_eq(PARSE(&o, "-f", "--n", "7", "--big=-5", "--u", "18446744073709551615", "--d", "0.5", "--f",
                           "2.5", "--s", "x y", "--colour", "blue", "--onoff", "on", "--even", "ab", "--even", "cdef"),
                     0);
    ck_assert(o.flag);
    ck_assert_int_eq(o.n, 7);
    ck_assert_int_eq(o.big, -5);
    ck_assert_uint_eq(o.u, UINT64_MAX);
    ck_assert_double_eq(o.d, 0.5);
    ck_assert_float_eq(o.f, 2.5f);
    ck_assert_str_eq(o.s, "x y");
    ck_assert_int_eq(o.pick, 2);
    ck_assert(o.bf);
    ck_assert_int_eq(o.sets, 2);
    ck_assert_int_eq(rest, 21);
}
END_TEST

START_TEST(test_short_letters_prefixes_and_arguments_after_options_parse_as_getopt_long_does) {
    o_t o;
    ck_assert_int_eq(PARSE(&o, "-n", "3", "file", "--col", "red", "--", "--flag"), 0);
    ck_assert_int_eq(o.n, 3);
    ck_assert_int_eq(o.pick, 0);
    ck_assert(!o.flag); /* after "--": an argument */
    ck_assert_int_eq(rest, 6); /* permuted: "file" and "--flag" follow the options and "--" */
}
END_TEST

START_TEST(test_values_out_of_range_or_of_the_wrong_form_name_the_option_and_the_value) {
    o_t o;
    ck_assert_int_eq(PARSE(&o, "--n", "11"), -1);
    ck_assert_str_eq(msg(), "--n: '11' is a bad value: expected 1..10");
    ck_assert_int_eq(PARSE(&o, "--n", " 5"), -1); /* no leading space */
    ck_assert_int_eq(PARSE(&o, "--n", "5x"), -1);
    ck_assert_int_eq(PARSE(&o, "--big", "-6"), -1);
    ck_assert_int_eq(PARSE(&o, "--u", "-1"), -1);
    ck_assert_str_eq(msg(), "--u: '-1' is a bad value: expected 0..18446744073709551615");
    ck_assert_int_eq(PARSE(&o, "--u", "18446744073709551616"), -1);
    ck_assert_int_eq(PARSE(&o, "--d", "1.5"), -1);
    ck_assert_str_eq(msg(), "--d: '1.5' is a bad value: expected a number in 0..1");
    ck_assert_int_eq(PARSE(&o, "--f", "inf"), -1);
    ck_assert_int_eq(PARSE(&o, "--colour", "pink"), -1);
    ck_assert_str_eq(msg(), "--colour: 'pink' is a bad value: expected red, green or blue");
    ck_assert_int_eq(PARSE(&o, "--onoff", "maybe"), -1);
    ck_assert_str_eq(msg(), "--onoff: 'maybe' is a bad value: expected off or on");
    ck_assert_int_eq(PARSE(&o, "--even", "abc"), -1);
    ck_assert_str_eq(msg(), "--even: 'abc' is a bad value: expected an even length");
    ck_assert_int_eq(PARSE(&o, "--says", "hi"), -1); /* a setter's own error, its code kept */
    ck_assert_str_eq(msg(), "--says: nothing like 'hi'");
    ck_assert_int_eq(reel_err_code(), REEL_E_NOT_FOUND);
    ck_assert_int_eq(PARSE(&o, "--odd", "x"), -1); /* the helper's wording gives way to the row's */
    ck_assert_str_eq(msg(), "--odd: 'x' is a bad value: expected an odd number below 100");
    ck_assert_int_eq(PARSE(&o, "--odd", "4"), -1);
    ck_assert_str_eq(msg(), "--odd: '4' is a bad value: expected an odd number below 100");
    ck_assert_int_eq(PARSE(&o, "--odd", "5", "--mute", "x"), -1);
    ck_assert_int_eq(o.sets, 1);
    ck_assert_str_eq(msg(), "--mute: 'x' is a bad value: expected a valid value");
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
}
END_TEST

/* base/parse.h reads every number: the whole text, no '+', no space, and
 * a float's "any" is what a float holds (1e300 was stored as inf). */
START_TEST(test_numbers_are_read_whole_by_the_one_number_parser_and_refused_as_invalid) {
    o_t o;
    ck_assert_int_eq(PARSE(&o, "--n", "+5"), -1);
    ck_assert_str_eq(msg(), "--n: '+5' is a bad value: expected 1..10");
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_int_eq(PARSE(&o, "--u", "+1"), -1);
    ck_assert_int_eq(PARSE(&o, "--d", " 0.5"), -1);
    ck_assert_int_eq(PARSE(&o, "--d", ""), -1);
    ck_assert_str_eq(msg(), "--d: '' is a bad value: expected a number in 0..1");
    ck_assert_int_eq(PARSE(&o, "--f", "1e300"), -1);
    ck_assert_str_eq(msg(), "--f: '1e300' is a bad value: expected a number");
    ck_assert_int_eq(PARSE(&o, "--f", "-1e30", "--d", "1", "--big", "1099511627776"), 0);
    ck_assert_float_eq(o.f, -1e30f);
    ck_assert_double_eq(o.d, 1);
    ck_assert_int_eq(o.big, (int64_t)1 << 40);
    ck_assert_int_eq(PARSE(&o, "--big", "1099511627777"), -1);
    ck_assert_str_eq(msg(), "--big: '1099511627777' is a bad value: expected -5..1099511627776");
}
END_TEST

START_TEST(test_an_unknown_option_and_a_missing_value_are_refused_by_name) {
    o_t o;
    ck_assert_int_eq(PARSE(&o, "--frobnicate"), -1);
    ck_assert_str_eq(msg(), "unknown or incomplete option '--frobnicate'");
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_int_eq(PARSE(&o, "--flag=1"), -1); /* a flag takes no value */
    ck_assert_str_eq(msg(), "unknown or incomplete option '--flag=1'");
    ck_assert_int_eq(PARSE(&o, "-f", "--n"), -1);
    ck_assert_str_eq(msg(), "option '--n' needs a value");
    ck_assert_int_eq(PARSE(&o, "-n"), -1);
    ck_assert_str_eq(msg(), "option '-n' needs a value");
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
}
END_TEST

/* A caller shows its usage for the command line's shape, not for a value
 * (whose message says what was expected): *rest tells the two apart. */
START_TEST(test_rest_is_0_after_an_unknown_option_or_a_missing_value_and_kept_after_a_bad_value) {
    o_t o;
    rest = 99;
    ck_assert_int_eq(PARSE(&o, "--n", "3", "--frobnicate"), -1);
    ck_assert_int_eq(rest, 0);
    rest = 99;
    ck_assert_int_eq(PARSE(&o, "-f", "--n"), -1);
    ck_assert_int_eq(rest, 0);
    rest = 99;
    ck_assert_int_eq(PARSE(&o, "--n", "11"), -1);
    ck_assert_int_eq(rest, 99);
    ck_assert_int_eq(PARSE(&o, "--says", "hi"), -1); /* a setter's refusal is a value's too */
    ck_assert_int_eq(rest, 99);
}
END_TEST

START_TEST(test_help_stops_parsing_and_returns_1) {
    o_t o;
    ck_assert_int_eq(PARSE(&o, "--n", "2", "-h", "--bogus"), 1);
    ck_assert_int_eq(o.n, 2);
    ck_assert_int_eq(PARSE(&o, "--bogus", "--help"), -1); /* an error before it still counts */
}
END_TEST

START_TEST(test_usage_lines_up_help_at_its_column_and_leaves_out_rows_without_help) {
    char buf[1024] = "usage: prog\n";
    size_t need = reel_opts_usage(rows, N, 16, buf, sizeof buf);
    ck_assert_str_eq(buf, "usage: prog\n"
                          "  -f, --flag    a flag\n"
                          "  -n, --n N     a count\n"
                          "                of things\n"
                          "  --s A-VERY-LONG-METAVAR-NAME  text\n");
    ck_assert_uint_eq(need, strlen(buf));
    char small[20] = "";
    ck_assert_uint_eq(reel_opts_usage(rows, N, 16, small, sizeof small), need - strlen("usage: prog\n"));
    ck_assert_uint_eq(strlen(small), sizeof small - 1); /* cut, ended */
}
END_TEST

int main(void) {
    Suite *s = suite_create("opts");
    TCase *tc = tcase_create("opts");
    tcase_add_test(tc, test_each_kind_stores_its_value_where_its_row_says);
    tcase_add_test(tc, test_short_letters_prefixes_and_arguments_after_options_parse_as_getopt_long_does);
    tcase_add_test(tc, test_values_out_of_range_or_of_the_wrong_form_name_the_option_and_the_value);
    tcase_add_test(tc, test_numbers_are_read_whole_by_the_one_number_parser_and_refused_as_invalid);
    tcase_add_test(tc, test_an_unknown_option_and_a_missing_value_are_refused_by_name);
    tcase_add_test(tc, test_rest_is_0_after_an_unknown_option_or_a_missing_value_and_kept_after_a_bad_value);
    tcase_add_test(tc, test_help_stops_parsing_and_returns_1);
    tcase_add_test(tc, test_usage_lines_up_help_at_its_column_and_leaves_out_rows_without_help);
    suite_add_tcase(s, tc);
    return ts_run(s);
}
