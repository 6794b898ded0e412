/* test_cpu_pool.c -- the CPU backend's thread pool (kernels/cpu/cpu_pool.h):
 * every task runs exactly once, the caller returns only when all are done,
 * several callers (a worker's streams) share the pool at once, a task may
 * itself call cpu_par_for, the size follows kern_cpu_threads_set and
 * REEL_THREADS, and a forked child gets a working pool. Run under TSan by
 * make tsan. */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_pool.h"

typedef struct {
    int *hits;  /* per task, incremented atomically */
    int64_t n;
    int64_t delay; /* busy-work iterations per task, so tasks overlap */
} count_ctx_t;

static void count_task(void *ctx, int64_t t) {
    count_ctx_t *c = ctx;
    volatile int64_t sink = 0;
    for (int64_t i = 0; i < c->delay; i++) sink += i;
    __atomic_fetch_add(&c->hits[t], 1, __ATOMIC_RELAXED);
}

static void expect_each_once(const count_ctx_t *c, const char *what) {
    for (int64_t t = 0; t < c->n; t++)
        ck_assert_msg(__atomic_load_n(&c->hits[t], __ATOMIC_RELAXED) == 1, "%s: task %lld ran %d times", what,
                      (long long)t, c->hits[t]);
}

START_TEST(test_every_task_runs_once_for_every_pool_size_and_task_count) {
    static const int sizes[] = { 1, 2, 3, 8 };
    static const int64_t counts[] = { 0, 1, 2, 7, 64, 1000 };
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        kern_cpu_threads_set(sizes[s]);
        ck_assert_int_eq(cpu_pool_threads(), sizes[s]);
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            count_ctx_t c = { calloc((size_t)counts[k] + 1, sizeof(int)), counts[k], 2000 };
            ck_assert_ptr_nonnull(c.hits);
            cpu_par_for(c.n, count_task, &c);
            char what[64];
            snprintf(what, sizeof what, "%d threads, %lld tasks", sizes[s], (long long)counts[k]);
            expect_each_once(&c, what); /* read after return: every task is done */
            free(c.hits);
        }
    }
    kern_cpu_threads_set(0);
}
END_TEST

typedef struct {
    int rounds;
    int failures;
} caller_t;

static void *caller_main(void *arg) {
    caller_t *me = arg;
    for (int r = 0; r < me->rounds; r++) {
        int64_t n = 1 + (r * 7) % 40;
        count_ctx_t c = { calloc((size_t)n, sizeof(int)), n, 500 };
        if (!c.hits) {
            me->failures++;
            continue;
        }
        cpu_par_for(n, count_task, &c);
        for (int64_t t = 0; t < n; t++)
            if (c.hits[t] != 1) me->failures++;
        free(c.hits);
    }
    return NULL;
}

/* Four callers at once (a worker's streams), each checking its own jobs:
 * no task lost, none run twice, no job returned early. */
START_TEST(test_concurrent_callers_share_the_pool_and_each_gets_all_its_tasks) {
    kern_cpu_threads_set(3);
    enum { CALLERS = 4 };
    pthread_t th[CALLERS];
    caller_t c[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        c[i] = (caller_t){ 200, 0 };
        ck_assert_int_eq(pthread_create(&th[i], NULL, caller_main, &c[i]), 0);
    }
    for (int i = 0; i < CALLERS; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(c[i].failures == 0, "caller %d: %d tasks lost or run twice", i, c[i].failures);
    }
    kern_cpu_threads_set(0);
}
END_TEST

typedef struct {
    int *hits;
} nest_ctx_t;

static void inner_task(void *ctx, int64_t t) {
    int *hits = ctx;
    __atomic_fetch_add(&hits[t], 1, __ATOMIC_RELAXED);
}

static void outer_task(void *ctx, int64_t t) {
    nest_ctx_t *c = ctx;
    cpu_par_for(5, inner_task, c->hits + t * 5);
}

/* A task that calls cpu_par_for runs its inner tasks too (the caller works
 * its own job): no deadlock with every thread inside an outer task. */
START_TEST(test_a_task_may_call_par_for_without_deadlock) {
    kern_cpu_threads_set(2);
    nest_ctx_t c = { calloc(6 * 5, sizeof(int)) };
    ck_assert_ptr_nonnull(c.hits);
    cpu_par_for(6, outer_task, &c);
    for (int i = 0; i < 30; i++) ck_assert_msg(c.hits[i] == 1, "inner task %d ran %d times", i, c.hits[i]);
    free(c.hits);
    kern_cpu_threads_set(0);
}
END_TEST

/* REEL_THREADS sets the default; a bad value falls back to the cores; an
 * explicit size wins until reset with 0. */
START_TEST(test_the_size_follows_reel_threads_and_the_setter) {
    setenv("REEL_THREADS", "5", 1);
    kern_cpu_threads_set(0);
    ck_assert_int_eq(kern_cpu_threads(), 5);
    kern_cpu_threads_set(2);
    ck_assert_int_eq(kern_cpu_threads(), 2);
    setenv("REEL_THREADS", "lots", 1);
    kern_cpu_threads_set(0);
    int cores = kern_cpu_threads();
    ck_assert_msg(cores >= 1 && cores <= 256, "default size %d", cores);
    setenv("REEL_THREADS", "0", 1);
    kern_cpu_threads_set(0);
    ck_assert_int_eq(kern_cpu_threads(), cores);
    kern_cpu_threads_set(100000);
    ck_assert_int_eq(kern_cpu_threads(), 256);
    unsetenv("REEL_THREADS");
    kern_cpu_threads_set(0);
}
END_TEST

/* A child forked after the pool started (its workers are not copied) runs
 * a parallel job to the end on workers of its own, and the parent's pool
 * still works after the fork. */
START_TEST(test_a_forked_child_gets_a_working_pool) {
    kern_cpu_threads_set(3);
    count_ctx_t c = { calloc(50, sizeof(int)), 50, 2000 };
    ck_assert_ptr_nonnull(c.hits);
    cpu_par_for(c.n, count_task, &c); /* workers started */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
#ifdef __SANITIZE_THREAD__
        kern_cpu_threads_set(1); /* TSan cannot start threads after a multi-threaded fork */
#endif
        memset(c.hits, 0, 50 * sizeof(int));
        cpu_par_for(c.n, count_task, &c);
        for (int t = 0; t < 50; t++)
            if (c.hits[t] != 1) _exit(1);
        _exit(0);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's job did not complete (status %d)", st);
    memset(c.hits, 0, 50 * sizeof(int));
    cpu_par_for(c.n, count_task, &c);
    expect_each_once(&c, "parent after fork");
    free(c.hits);
    kern_cpu_threads_set(0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cpu_pool");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_every_task_runs_once_for_every_pool_size_and_task_count);
    tcase_add_test(tc, test_concurrent_callers_share_the_pool_and_each_gets_all_its_tasks);
    tcase_add_test(tc, test_a_task_may_call_par_for_without_deadlock);
    tcase_add_test(tc, test_the_size_follows_reel_threads_and_the_setter);
    tcase_add_test(tc, test_a_forked_child_gets_a_working_pool);
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
