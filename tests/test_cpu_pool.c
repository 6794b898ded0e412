/* test_cpu_pool.c -- the CPU backend's thread pool (kernels/cpu/cpu_pool.h):
 * every task runs exactly once, the caller returns only when all are done,
 * several callers (a worker's streams) share the pool at once, a task may
 * itself call cpu_par_for, the size follows kern_cpu_threads_set and
 * REEL_THREADS, a forked child gets a working pool, and an idle thread
 * watches for work only for its bounded while, and not at all while every
 * core is busy. Run under TSan by make tsan. */
#include <check.h>
#include <sched.h>
#include <dirent.h>
#include <time.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
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

/* Every pool size and task count, with idle threads that sleep at once,
 * watch for 50 us, and watch for 100 ms (a worker then takes the next job
 * while watching, and a caller sees its job end while watching). */
START_TEST(test_every_task_runs_once_for_every_pool_size_and_task_count) {
    static const int sizes[] = { 1, 2, 3, 8 };
    static const int64_t counts[] = { 0, 1, 2, 7, 64, 1000 };
    static const long spins[] = { 0, 50, 100000 };
    for (size_t w = 0; w < sizeof spins / sizeof spins[0]; w++)
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        cpu_pool_spin_set(spins[w], true); /* the path taken whatever the load */
        kern_cpu_threads_set(sizes[s]);
        ck_assert_int_eq(cpu_pool_threads(), sizes[s]);
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            count_ctx_t c = { calloc((size_t)counts[k] + 1, sizeof(int)), counts[k], 2000 };
            ck_assert_ptr_nonnull(c.hits);
            cpu_par_for(c.n, count_task, &c);
            char what[64];
            snprintf(what, sizeof what, "%d threads, %lld tasks, watch %ld us", sizes[s], (long long)counts[k],
                     spins[w]);
            expect_each_once(&c, what); /* read after return: every task is done */
            free(c.hits);
        }
    }
    cpu_pool_spin_set(-1, false);
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The state letter of thread tid of this process ('R' running or
 * runnable, 'S' asleep), or 0 if it cannot be read. */
static char thread_state(long tid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* after the name, which may hold spaces */
    return p && p[1] == ' ' ? p[2] : 0;
}

/* A thread of this process on the CPU (or waiting for it) but the caller
 * and the `skip` ones; 0 when none is. */
static long busy_thread(const long *skip, int nskip) {
    long self = (long)syscall(SYS_gettid), busy = 0;
    DIR *d = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            long tid = strtol(e->d_name, NULL, 10);
            bool skipped = tid == self;
            for (int i = 0; i < nskip; i++) skipped |= tid == skip[i];
            if (!skipped && thread_state(tid) == 'R') busy = tid;
        }
    closedir(d);
    return busy;
}

/* Waits (up to `limit` seconds) until every thread of this process but
 * the caller and the `skip` ones is off the CPU; the seconds it took, or
 * −1 with the last busy thread in *busy. */
static double wait_until_others_sleep(const long *skip, int nskip, double limit, long *busy) {
    double t0 = now_s();
    for (;;) {
        *busy = busy_thread(skip, nskip);
        double took = now_s() - t0;
        if (!*busy) return took;
        if (took > limit) return -1;
        sched_yield();
    }
}

/* An idle pool thread watches for the next job for its bounded while
 * (here 2 s, watching whatever the load): it is seen on the CPU after the
 * job, then asleep; nothing spins for good after work. */
START_TEST(test_idle_pool_threads_watch_then_fall_asleep) {
    kern_cpu_threads_set(2);
    cpu_pool_spin_set(2000000, true);
    count_ctx_t c = { calloc(64, sizeof(int)), 64, 20000 };
    ck_assert_ptr_nonnull(c.hits);
    cpu_par_for(c.n, count_task, &c);
    double t0 = now_s();
    expect_each_once(&c, "before the watch");
    /* watching: 0.1 s after the job (long past a thread's way to sleep)
     * some thread but this one is still on the CPU (or waiting for it);
     * looked at once at least, however late this thread gets the CPU */
    while (now_s() - t0 < 0.1) sched_yield();
    long busy = busy_thread(NULL, 0);
    while (!busy && now_s() - t0 < 1.5) busy = busy_thread(NULL, 0);
    ck_assert_msg(busy, "no pool thread on the CPU 0.1-1.5 s after the job (asked to watch 2 s)");
    double took = wait_until_others_sleep(NULL, 0, 30.0, &busy);
    ck_assert_msg(took >= 0, "thread %ld still on the CPU 30 s after the last job", busy);
    free(c.hits);
    cpu_pool_spin_set(-1, false);
    kern_cpu_threads_set(0);
}
END_TEST

typedef struct {
    int stop;
    long tid;
    int started;
} hog_t;

static void *hog_main(void *arg) {
    hog_t *h = arg;
    __atomic_store_n(&h->tid, (long)syscall(SYS_gettid), __ATOMIC_RELEASE);
    __atomic_store_n(&h->started, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&h->stop, __ATOMIC_RELAXED)) {
    }
    return NULL;
}

/* With more runnable threads than cores (a hog per core and one more),
 * idle pool threads sleep at once instead of watching: asked to watch for
 * 5 s, every one is asleep well before (they would hold a core the hogs
 * wait for). Skips where /proc/loadavg is unreadable (nothing to judge
 * the machine by: there the pool watches as if cores were free). */
START_TEST(test_idle_threads_sleep_at_once_while_every_core_is_busy) {
    FILE *la = fopen("/proc/loadavg", "r");
    if (!la) {
        fprintf(stderr, "SKIP idle-on-busy: /proc/loadavg unreadable\n");
        return;
    }
    fclose(la);
    cpu_set_t set; /* the cores the pool judges by: this process's */
    long cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if (cores > 255) {
        fprintf(stderr, "SKIP idle-on-busy: %ld cores would take %ld hog threads\n", cores, cores + 1);
        return;
    }
    int nh = (int)cores + 1;
    hog_t *h = calloc((size_t)nh, sizeof *h);
    pthread_t *th = calloc((size_t)nh, sizeof *th);
    long *tids = calloc((size_t)nh, sizeof *tids);
    ck_assert_ptr_nonnull(h);
    ck_assert_ptr_nonnull(th);
    ck_assert_ptr_nonnull(tids);
    for (int i = 0; i < nh; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, hog_main, &h[i]), 0);
    for (int i = 0; i < nh; i++) {
        while (!__atomic_load_n(&h[i].started, __ATOMIC_ACQUIRE)) sched_yield();
        tids[i] = __atomic_load_n(&h[i].tid, __ATOMIC_ACQUIRE);
    }
    kern_cpu_threads_set(3);
    cpu_pool_spin_set(5000000, false); /* also: the next watch reads the load afresh */
    count_ctx_t c = { calloc(64, sizeof(int)), 64, 20000 };
    ck_assert_ptr_nonnull(c.hits);
    cpu_par_for(c.n, count_task, &c);
    long busy;
    double took = wait_until_others_sleep(tids, nh, 2.5, &busy);
    for (int i = 0; i < nh; i++) __atomic_store_n(&h[i].stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < nh; i++) pthread_join(th[i], NULL);
    expect_each_once(&c, "beside the hogs");
    ck_assert_msg(took >= 0, "thread %ld still on the CPU 2.5 s after the job with every core busy "
                  "(it watched instead of sleeping)", busy);
    free(c.hits);
    free(h);
    free(th);
    free(tids);
    cpu_pool_spin_set(-1, false);
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
    tcase_add_test(tc, test_idle_pool_threads_watch_then_fall_asleep);
    tcase_add_test(tc, test_idle_threads_sleep_at_once_while_every_core_is_busy);
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
