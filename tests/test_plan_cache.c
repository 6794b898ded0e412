/* test_plan_cache.c -- the per-stream cache of library plans by shape
 * (kernels/plan_cache.h), as cuDNN's SDPA uses it: a shape's plan is made
 * once and found again, each stream keeps its own, the least recently used
 * plan is the one recycled (and freed exactly once), no plan is made while
 * a capture runs (code state, naming the shape, so the fused attention does
 * not fall back for it), and a failed make loses nothing. All on the CPU:
 * the plans here are counters. */
#include "kernels/plan_cache.h"
#include "base/error.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include "tests/support.h"

typedef struct {
    int made, freed, fail_next;
    int64_t last_freed_nq;
} counts_t;

static int make(void *ctx, const kern_plan_shape_t *sh, void **plan) {
    counts_t *k = ctx;
    if (k->fail_next) {
        k->fail_next = 0;
        return reel_fail(REEL_E_DEVICE, "fake cuDNN: no engine config for nq=%lld", (long long)sh->nq);
    }
    kern_plan_shape_t *p = malloc(sizeof *p);
    ck_assert_ptr_nonnull(p);
    *p = *sh;
    k->made++;
    *plan = p;
    return 0;
}

static void release(void *ctx, void *plan) {
    counts_t *k = ctx;
    k->freed++;
    k->last_freed_nq = ((kern_plan_shape_t *)plan)->nq;
    free(plan);
}

static kern_plan_shape_t shape(int64_t nq) { return (kern_plan_shape_t){ nq, 4096, 12, 128 }; }

START_TEST(test_a_shape_is_made_once_and_found_again_per_stream) {
    counts_t k = { 0 };
    kern_plan_cache_t *s1 = kern_plan_cache_new(8, release, &k), *s2 = kern_plan_cache_new(8, release, &k);
    ck_assert(s1 && s2);
    void *a = NULL, *b = NULL, *c = NULL;
    kern_plan_shape_t sh = shape(100);
    TS_OK(kern_plan_cache_get(s1, &sh, false, make, &k, &a));
    TS_OK(kern_plan_cache_get(s1, &sh, false, make, &k, &b));
    ck_assert_ptr_eq(a, b);
    ck_assert_int_eq(k.made, 1);
    /* every field of the shape counts */
    kern_plan_shape_t other[4] = { { 100, 4095, 12, 128 }, { 100, 4096, 11, 128 }, { 100, 4096, 12, 64 }, shape(101) };
    for (int i = 0; i < 4; i++) {
        TS_OK(kern_plan_cache_get(s1, &other[i], false, make, &k, &c));
        ck_assert_ptr_ne(c, a);
    }
    ck_assert_int_eq(k.made, 5);
    /* another stream makes its own */
    TS_OK(kern_plan_cache_get(s2, &sh, false, make, &k, &c));
    ck_assert_ptr_ne(c, a);
    ck_assert_int_eq(k.made, 6);
    ck_assert_int_eq(kern_plan_cache_size(s2), 1);
    kern_plan_cache_destroy(&s1);
    kern_plan_cache_destroy(&s2);
    ck_assert_ptr_null(s1);
    ck_assert_int_eq(k.freed, k.made);
    kern_plan_cache_destroy(&s1); /* NULL is fine */
}
END_TEST

START_TEST(test_when_full_the_least_recently_used_plan_is_recycled) {
    counts_t k = { 0 };
    kern_plan_cache_t *c = kern_plan_cache_new(3, release, &k);
    void *p = NULL;
    for (int64_t nq = 1; nq <= 3; nq++) {
        kern_plan_shape_t sh = shape(nq);
        TS_OK(kern_plan_cache_get(c, &sh, false, make, &k, &p));
    }
    kern_plan_shape_t s1 = shape(1), s4 = shape(4), s2 = shape(2);
    TS_OK(kern_plan_cache_get(c, &s1, false, make, &k, &p)); /* 1 used again: 2 is now the oldest */
    TS_OK(kern_plan_cache_get(c, &s4, false, make, &k, &p));
    ck_assert_int_eq(k.freed, 1);
    ck_assert_int_eq(k.last_freed_nq, 2);
    ck_assert_int_eq(kern_plan_cache_size(c), 3);
    TS_OK(kern_plan_cache_get(c, &s1, false, make, &k, &p)); /* still there */
    ck_assert_int_eq(k.made, 4);
    TS_OK(kern_plan_cache_get(c, &s2, false, make, &k, &p)); /* made again, 3 recycled */
    ck_assert_int_eq(k.made, 5);
    ck_assert_int_eq(k.last_freed_nq, 3);
    kern_plan_cache_destroy(&c);
    ck_assert_int_eq(k.freed, 5);
}
END_TEST

START_TEST(test_no_plan_is_made_inside_a_capture_but_a_cached_one_serves_it) {
    counts_t k = { 0 };
    kern_plan_cache_t *c = kern_plan_cache_new(2, release, &k);
    void *p = NULL, *q = NULL;
    kern_plan_shape_t sh = shape(32760);
    reel_err_clear();
    ck_assert_int_eq(kern_plan_cache_get(c, &sh, true, make, &k, &p), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_STATE);
    ck_assert_msg(strstr(reel_err_text(), "nq=32760 nk=4096 heads=12 d=128") &&
                  strstr(reel_err_text(), "run the shape eagerly"), "'%s'", reel_err_text());
    ck_assert_int_eq(k.made, 0);
    ck_assert_int_eq(kern_plan_cache_size(c), 0);
    TS_OK(kern_plan_cache_get(c, &sh, false, make, &k, &p)); /* the eager run makes it */
    TS_OK(kern_plan_cache_get(c, &sh, true, make, &k, &q));  /* the capture finds it */
    ck_assert_ptr_eq(p, q);
    ck_assert_int_eq(k.made, 1);
    kern_plan_cache_destroy(&c);
}
END_TEST

START_TEST(test_a_failed_make_caches_nothing_and_keeps_what_was_there) {
    counts_t k = { 0 };
    kern_plan_cache_t *c = kern_plan_cache_new(1, release, &k);
    void *p = NULL, *q = NULL;
    kern_plan_shape_t a = shape(7), b = shape(8);
    TS_OK(kern_plan_cache_get(c, &a, false, make, &k, &p));
    k.fail_next = 1;
    ck_assert_int_eq(kern_plan_cache_get(c, &b, false, make, &k, &q), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_DEVICE);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "fake cuDNN: no engine config for nq=8"));
    ck_assert_int_eq(k.freed, 0); /* the full cache's one plan was not given up for nothing */
    TS_OK(kern_plan_cache_get(c, &a, false, make, &k, &q));
    ck_assert_ptr_eq(p, q);
    ck_assert_int_eq(k.made, 1);
    kern_plan_cache_destroy(&c);
    ck_assert_int_eq(k.freed, 1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("plan_cache");
    TCase *tc = tcase_create("plan_cache");
    tcase_add_test(tc, test_a_shape_is_made_once_and_found_again_per_stream);
    tcase_add_test(tc, test_when_full_the_least_recently_used_plan_is_recycled);
    tcase_add_test(tc, test_no_plan_is_made_inside_a_capture_but_a_cached_one_serves_it);
    tcase_add_test(tc, test_a_failed_make_caches_nothing_and_keeps_what_was_there);
    suite_add_tcase(s, tc);
    return ts_run(s);
}
