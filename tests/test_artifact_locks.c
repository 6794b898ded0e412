/* test_artifact_locks.c -- the artifact store's lock checks
 * (kernels/artifact_impl.h): a set's mutex knows which thread holds it,
 * and the promises the comments used to make -- no kernel runs under the
 * set's mutex, the installed set changes only under the install lock, the
 * mutex is released only by its holder, never taken twice and never held
 * while its set is destroyed -- abort when broken instead of being
 * trusted. Each broken promise runs in a child process (its own fork, so
 * CK_FORK=no runs work too). */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "base/error.h"
#include "kernels/artifact_impl.h"
#include "kernels/ops.h"
#include "tests/support.h"

#ifdef ART_LOCK_CHECKS
static const bool checks = true;
#else
static const bool checks = false;
#endif
/* The checks compile to nothing in release builds: nothing to prove there. */
#define SKIP_WITHOUT_CHECKS()                                                                     \
    do {                                                                                          \
        if (!checks) {                                                                            \
            fprintf(stderr, "SKIP: built without lock checks (NDEBUG and no REEL_INVARIANTS)\n"); \
            return;                                                                               \
        }                                                                                         \
    } while (0)

static char dir[64];

static void setup(void) { ts_mkdtemp(dir, sizeof dir, "test-artlock"); }

static void teardown(void) {
    if (ts_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
}

/* A set scanned from an empty root: no bundle, but a real mutex. */
static kern_artifacts_t *empty_set(void) {
    kern_artifacts_t *set = kern_artifacts_scan(dir);
    TS_NEW(set);
    return set;
}

/* Runs fn in a child process; true when it died of SIGABRT. A check that
 * fails to fire where a deadlock would follow ends in SIGALRM instead. */
static bool aborts(void (*fn)(void)) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* Keep the expected abort's message out of the test's output. */
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        alarm(20);
        fn();
        _exit(0);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

/* ---- ownership ------------------------------------------------------------------ */

static bool mine(void *set) { return reel_owner_mine(&((kern_artifacts_t *)set)->mu_owner); }

static bool mine_elsewhere(kern_artifacts_t *set) { return ts_on_other_thread(mine, set); }

START_TEST(test_the_set_mutex_is_owned_by_the_thread_that_holds_it_and_no_other) {
    SKIP_WITHOUT_CHECKS();
    kern_artifacts_t *set = empty_set();
    ck_assert(!reel_owner_mine(&set->mu_owner));
    art_lock(set);
    ck_assert(reel_owner_mine(&set->mu_owner));
    ck_assert(!mine_elsewhere(set));
    art_unlock(set);
    ck_assert(!reel_owner_mine(&set->mu_owner));
    kern_artifacts_destroy(&set);
}
END_TEST

/* ---- no kernel runs under the set's mutex ------------------------------------------ */

/* One GEMM + GELU through an installed (empty) set: kern_dispatch calls the
 * set's hook, which is where a kernel is about to run. */
static void launch(bool holding) {
    kern_artifacts_t *set = empty_set();
    if (kern_artifacts_install(set, KERN_ART_TIMING_OFF) != 0) _exit(4);
    kern_backend_t *b = kern_backend_cpu_new();
    kern_stream_t *s = kern_stream_new(b);
    if (!b || !s) _exit(5);
    kern_tensor_t x = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ 4, 8 });
    kern_tensor_t w = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ 6, 8 });
    kern_tensor_t bias = kern_tensor_alloc(b, KERN_F32, 1, (int64_t[]){ 6 });
    kern_tensor_t y = kern_tensor_alloc(b, KERN_F32, 2, (int64_t[]){ 4, 6 });
    memset(x.data, 0, kern_tensor_bytes(&x));
    memset(w.data, 0, kern_tensor_bytes(&w));
    memset(bias.data, 0, kern_tensor_bytes(&bias));
    if (holding) art_lock(set);
    int rc = kern_gemm_gelu(s, &x, &w, &bias, &y);
    if (holding) art_unlock(set);
    kern_free(b, x.data);
    kern_free(b, w.data);
    kern_free(b, bias.data);
    kern_free(b, y.data);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
    kern_artifacts_destroy(&set);
    if (rc != 0) _exit(6);
}

static void launch_holding_the_set_mutex(void) { launch(true); }
static void launch_without_it(void) { launch(false); }

START_TEST(test_a_launch_under_the_set_mutex_aborts_instead_of_running_a_kernel_under_it) {
    SKIP_WITHOUT_CHECKS();
    ck_assert(!aborts(launch_without_it));
    ck_assert(aborts(launch_holding_the_set_mutex));
}
END_TEST

/* ---- the install lock ------------------------------------------------------------ */

static void set_installed_without_the_install_lock(void) {
    kern_artifacts_t *set = empty_set();
    art_run_set_installed(set);
}

static void set_installed_under_the_install_lock(void) {
    kern_artifacts_t *set = empty_set();
    art_install_lock();
    art_run_set_installed(set);
    art_run_set_installed(NULL);
    art_install_unlock();
    kern_artifacts_destroy(&set);
}

START_TEST(test_changing_the_installed_set_without_the_install_lock_aborts) {
    SKIP_WITHOUT_CHECKS();
    ck_assert(!aborts(set_installed_under_the_install_lock));
    ck_assert(aborts(set_installed_without_the_install_lock));
}
END_TEST

/* ---- misuse of the set's mutex ------------------------------------------------------ */

static void lock_twice(void) {
    kern_artifacts_t *set = empty_set();
    art_lock(set);
    art_lock(set); /* without the check: a deadlock, then SIGALRM */
}

static void unlock_unheld(void) {
    kern_artifacts_t *set = empty_set();
    art_unlock(set);
}

static void destroy_held(void) {
    kern_artifacts_t *set = empty_set();
    art_lock(set);
    kern_artifacts_destroy(&set);
}

START_TEST(test_taking_the_set_mutex_twice_releasing_it_unheld_or_destroying_the_set_under_it_aborts) {
    SKIP_WITHOUT_CHECKS();
    ck_assert(aborts(lock_twice));
    ck_assert(aborts(unlock_unheld));
    ck_assert(aborts(destroy_held));
}
END_TEST

int main(void) {
    Suite *su = suite_create("artifact_locks");
    TCase *tc = tcase_create("locks");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_the_set_mutex_is_owned_by_the_thread_that_holds_it_and_no_other);
    tcase_add_test(tc, test_a_launch_under_the_set_mutex_aborts_instead_of_running_a_kernel_under_it);
    tcase_add_test(tc, test_changing_the_installed_set_without_the_install_lock_aborts);
    tcase_add_test(tc, test_taking_the_set_mutex_twice_releasing_it_unheld_or_destroying_the_set_under_it_aborts);
    suite_add_tcase(su, tc);
    return ts_run(su);
}
