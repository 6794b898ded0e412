/* test_cache_locks.c -- the capture cache's lock checks (cache_impl.h): a
 * lock knows which thread holds it, nested holds of a recursive lock
 * included, and a cache function that needs the cache lock aborts when
 * called without it, rather than trusting a comment. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/error.h"
#include "capture_cache/cache_impl.h"
#include "tests/support.h"

static bool mine(void *l) { return cap_lock_mine(l); }

static bool mine_elsewhere(cap_lock_t *l) { return ts_on_other_thread(mine, l); }

START_TEST(test_a_lock_is_owned_by_the_thread_that_holds_it_and_no_other) {
#ifndef CAP_LOCK_CHECKS
    fprintf(stderr, "SKIP: built without lock checks (NDEBUG and no REEL_INVARIANTS)\n");
    return;
#else
    cap_lock_t l;
    ck_assert_int_eq(cap_lock_init(&l, false), 0);
    ck_assert(!cap_lock_mine(&l));
    cap_lock(&l);
    ck_assert(cap_lock_mine(&l));
    ck_assert(!mine_elsewhere(&l));
    cap_unlock(&l);
    ck_assert(!cap_lock_mine(&l));
    cap_lock_destroy(&l);
#endif
}
END_TEST

START_TEST(test_a_recursive_lock_stays_owned_until_its_last_release) {
#ifndef CAP_LOCK_CHECKS
    fprintf(stderr, "SKIP: built without lock checks (NDEBUG and no REEL_INVARIANTS)\n");
    return;
#else
    cap_lock_t l;
    ck_assert_int_eq(cap_lock_init(&l, true), 0);
    cap_lock(&l);
    ck_assert(cap_trylock(&l));
    cap_unlock(&l);
    ck_assert(cap_lock_mine(&l));
    ck_assert(!mine_elsewhere(&l));
    cap_unlock(&l);
    ck_assert(!cap_lock_mine(&l));
    cap_lock_destroy(&l);
#endif
}
END_TEST

/* Runs fn in a child process; true when it died of SIGABRT. */
static bool aborts(void (*fn)(void)) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* Keep the expected abort's message out of the test's output. */
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        fn();
        _exit(0);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static cap_cache_t *new_cache(kern_backend_t **b) {
    *b = kern_backend_cpu_new();
    cap_options_t o = cap_options_default();
    o.budget_bytes = 1 << 20;
    cap_cache_t *c = cap_cache_new(*b, &o);
    ck_assert_ptr_nonnull(c);
    return c;
}

static void make_room_unlocked(void) {
    kern_backend_t *b;
    cap_cache_t *c = new_cache(&b);
    evq_t q = { 0 };
    (void)cap_make_room(c, NULL, 4096, &q);
}

static void make_room_locked(void) {
    kern_backend_t *b;
    cap_cache_t *c = new_cache(&b);
    evq_t q = { 0 };
    cap_lock(&c->lock);
    bool fits = cap_make_room(c, NULL, 4096, &q);
    cap_unlock(&c->lock);
    cap_cache_destroy(&c);
    kern_backend_destroy(&b);
    if (!fits) abort();
}

static void flush_locked(void) {
    kern_backend_t *b;
    cap_cache_t *c = new_cache(&b);
    evq_t q = { 0 };
    cap_lock(&c->lock);
    cap_evq_flush(c, &q); /* events are delivered with no cache lock held */
}

START_TEST(test_a_function_that_needs_the_cache_lock_aborts_when_called_without_it) {
#ifndef CAP_LOCK_CHECKS
    fprintf(stderr, "SKIP: built without lock checks (NDEBUG and no REEL_INVARIANTS)\n");
    return;
#else
    ck_assert(aborts(make_room_unlocked));
    ck_assert(!aborts(make_room_locked));
    ck_assert(aborts(flush_locked));
#endif
}
END_TEST

int main(void) {
    Suite *su = suite_create("cache_locks");
    TCase *tc = tcase_create("locks");
    tcase_add_test(tc, test_a_lock_is_owned_by_the_thread_that_holds_it_and_no_other);
    tcase_add_test(tc, test_a_recursive_lock_stays_owned_until_its_last_release);
    tcase_add_test(tc, test_a_function_that_needs_the_cache_lock_aborts_when_called_without_it);
    suite_add_tcase(su, tc);
    return ts_run(su);
}
