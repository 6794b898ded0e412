/* cpu_pool.c -- the CPU backend's thread pool (cpu_pool.h).
 *
 * One mutex guards everything: the list of jobs with tasks left to claim,
 * each job's claim and done counts, and the size. Tasks are coarse (a
 * GEMM's column slice, a head of attention: tens of microseconds at
 * least), so a lock per claim costs nothing measurable. Workers start on
 * the first parallel call, one fewer than the size (the caller is one),
 * live as long as the process, and sleep (after a short watch, below)
 * whenever no job has a task left.
 * A job lives on its caller's stack: it leaves the list when its last task
 * is claimed, and the caller returns only when every task is done, so no
 * worker touches a job after that. */
#include "cpu_pool.h"
#include "../backend.h"
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#define POOL_MAX 256

typedef struct job {
    cpu_task_fn fn;
    void *ctx;
    int64_t n, next, done;
    int helpers, max_helpers; /* workers on it now; at most size − 1 */
    struct job *link;
} job_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER; /* a job was posted */
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER; /* a job's last task finished */
static job_t *jobs;    /* jobs with unclaimed tasks, oldest first */
static int size;       /* 0: not read yet */
static int workers;    /* started */
static int busy;       /* workers on a job now */
static int sleepers;   /* workers waiting on work_cv */
static int watchers;   /* workers watching `posted` */
static int unclaimed;  /* of them, those no post has counted on yet (<= watchers) */
static unsigned posted; /* jobs posted so far (atomic: watched without mu) */
static long spin_ns = -1; /* how long an idle thread watches for work before it sleeps; −1 unread */
static bool spin_always;  /* atomic: watch whatever the load (cpu_pool_spin_set, for tests) */
static bool atfork_set;

#define SPIN_US_DEFAULT 50
#define LOAD_EVERY_NS 10000000L
static long load_at;      /* atomic: when /proc/loadavg was last read */
static int load_x16 = -1; /* atomic: runnable threads × 16, the estimate; −1 unknown */
static int load_cores;    /* atomic: cores this process may use; 0 unread */

static int cores_allowed(void);

/* Under mu: cpu_pool_spin_set's, else REEL_POOL_SPIN_US, else the default. */
static long spin_locked(void) {
    if (spin_ns < 0) {
        const char *e = getenv("REEL_POOL_SPIN_US");
        char *end;
        long us = e && *e ? strtol(e, &end, 10) : -1;
        spin_ns = (e && *e && *end == '\0' && us >= 0 && us <= 10000000 ? us : SPIN_US_DEFAULT) * 1000L;
    }
    return spin_ns;
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Runnable threads on the machine now (/proc/loadavg's fourth field:
 * every process's, ours included); 0 if it cannot be read. */
static int runnable_now(void) {
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[128];
    ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got <= 0) return 0;
    buf[got] = '\0';
    double l1, l5, l15;
    int running = 0;
    return sscanf(buf, "%lf %lf %lf %d/", &l1, &l5, &l15, &running) == 4 && running > 0 ? running : 0;
}

/* Whether the machine has a core to spare for a watching thread: the
 * runnable threads, sampled at most once per 10 ms by whichever thread
 * asks, against the cores this process may use. A sample above the
 * estimate replaces it (contention is believed at once); one below moves
 * it a quarter of the way (a core is free once it has stayed free). With
 * more runnable threads than cores a watcher would hold a core another
 * thread waits for, so idle threads then sleep at once. Where
 * /proc/loadavg cannot be read the cores are taken as free. */
static bool cores_to_spare(void) {
    if (__atomic_load_n(&spin_always, __ATOMIC_RELAXED)) return true;
    long now = now_ns(), at = __atomic_load_n(&load_at, __ATOMIC_RELAXED);
    int l = __atomic_load_n(&load_x16, __ATOMIC_ACQUIRE); /* >= 0: load_cores is set */
    /* never read yet: every asker reads (none may watch on a guess); due:
     * one of them does */
    if (l < 0 || (now - at >= LOAD_EVERY_NS &&
                  __atomic_compare_exchange_n(&load_at, &at, now, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))) {
        if (!__atomic_load_n(&load_cores, __ATOMIC_RELAXED))
            __atomic_store_n(&load_cores, cores_allowed(), __ATOMIC_RELAXED);
        int x = runnable_now() * 16; /* 0: unreadable, taken as free */
        int old = __atomic_load_n(&load_x16, __ATOMIC_RELAXED);
        l = old < 0 || x > old ? x : (3 * old + x) / 4;
        __atomic_store_n(&load_x16, l, __ATOMIC_RELEASE);
        __atomic_store_n(&load_at, now, __ATOMIC_RELAXED);
    }
    int c = __atomic_load_n(&load_cores, __ATOMIC_RELAXED);
    return c <= 0 || l <= c * 16 + 8;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Watches *v without mu for up to ns while it still reads `was`; true
 * when it moved. */
static bool spin_while_same(const unsigned *v, unsigned was, long ns) {
    long end = now_ns() + ns;
    for (unsigned i = 1;; i++) {
        if (__atomic_load_n(v, __ATOMIC_ACQUIRE) != was) return true;
        cpu_relax();
        if (i % 64 == 0 && now_ns() > end) return false;
    }
}

/* Watches *done without mu for up to ns while it is below n. */
static void spin_until_done(const int64_t *done, int64_t n, long ns) {
    long end = now_ns() + ns;
    for (unsigned i = 1;; i++) {
        if (__atomic_load_n(done, __ATOMIC_ACQUIRE) >= n) return;
        cpu_relax();
        if (i % 64 == 0 && now_ns() > end) return;
    }
}

/* The cores this process may run on. */
static int cores_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int clamp_size(long n) { return n < 1 ? 1 : n > POOL_MAX ? POOL_MAX : (int)n; }

/* Under mu. */
static int size_locked(void) {
    if (size == 0) {
        const char *e = getenv("REEL_THREADS");
        char *end;
        long n = e && *e ? strtol(e, &end, 10) : 0;
        size = clamp_size(e && *e && *end == '\0' && n > 0 ? n : cores_allowed());
    }
    return size;
}

/* fork: mu is held across it (prepare), so the child's copy is in a known
 * state; the child, whose only thread is the forking one, has no workers
 * and no jobs, and starts its own workers when it needs them. */
static void before_fork(void) { pthread_mutex_lock(&mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&mu); }
static void after_fork_child(void) {
    pthread_cond_init(&work_cv, NULL);
    pthread_cond_init(&done_cv, NULL);
    jobs = NULL;
    workers = busy = sleepers = watchers = unclaimed = 0;
    pthread_mutex_unlock(&mu);
}

static void unlink_job(job_t *j) {
    for (job_t **p = &jobs; *p; p = &(*p)->link)
        if (*p == j) {
            *p = j->link;
            return;
        }
}

/* Claims a task of j (under mu); the last claim takes j off the list. */
static int64_t claim(job_t *j) {
    int64_t t = j->next++;
    if (j->next == j->n) unlink_job(j);
    return t;
}

/* Runs task t of j outside the lock and counts it done; returns with mu held. */
static void run_task(job_t *j, int64_t t) {
    pthread_mutex_unlock(&mu);
    j->fn(j->ctx, t);
    pthread_mutex_lock(&mu);
    if (__atomic_add_fetch(&j->done, 1, __ATOMIC_RELEASE) == j->n) pthread_cond_broadcast(&done_cv);
}

static void *worker_main(void *arg) {
    (void)arg;
    bool spun = false;
    pthread_mutex_lock(&mu);
    for (;;) {
        /* at most size − 1 workers busy in all: a pool made smaller keeps
         * its extra threads asleep */
        job_t *j = busy < size_locked() - 1 ? jobs : NULL;
        while (j && j->helpers >= j->max_helpers) j = j->link;
        if (!j) {
            long ns = spin_locked();
            if (!spun && ns > 0) { /* a step's next job comes within microseconds */
                unsigned seen = posted;
                watchers++;
                unclaimed++;
                pthread_mutex_unlock(&mu);
                /* the load is read outside mu; a watch that saw a post
                 * (even one another thread took) may watch again */
                bool moved = cores_to_spare() && spin_while_same(&posted, seen, ns);
                pthread_mutex_lock(&mu);
                watchers--;
                if (unclaimed > watchers) unclaimed = watchers;
                spun = !moved;
                continue;
            }
            spun = false;
            sleepers++;
            pthread_cond_wait(&work_cv, &mu);
            sleepers--;
            continue;
        }
        spun = false;
        /* every touch of j is under mu, and its caller returns only after
         * taking mu and seeing every task done: j is valid here */
        j->helpers++;
        busy++;
        while (j->next < j->n) run_task(j, claim(j));
        busy--;
        j->helpers--;
    }
    return NULL;
}

/* Starts workers up to size − 1 (under mu); one that cannot start is not a
 * failure: the caller and the others run its share. */
static void grow_locked(void) {
    if (!atfork_set) {
        pthread_atfork(before_fork, after_fork_parent, after_fork_child);
        atfork_set = true;
    }
    /* Signals are the main thread's; a fault (SIGSEGV and the like) must
     * still reach its handler (ASan's report) on the thread that faults. */
    sigset_t all, old;
    sigfillset(&all);
    static const int faults[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS };
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&all, faults[i]);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    while (workers < size - 1) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &at, worker_main, NULL);
        pthread_attr_destroy(&at);
        if (rc != 0) break;
        workers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void cpu_par_for(int64_t n, cpu_task_fn fn, void *ctx) {
    if (n <= 0) return;
    pthread_mutex_lock(&mu);
    int sz = size_locked();
    if (n == 1 || sz == 1) {
        pthread_mutex_unlock(&mu);
        for (int64_t t = 0; t < n; t++) fn(ctx, t);
        return;
    }
    if (workers < sz - 1) grow_locked();
    job_t j = { .fn = fn, .ctx = ctx, .n = n, .max_helpers = sz - 1 };
    job_t **tail = &jobs;
    while (*tail) tail = &(*tail)->link;
    *tail = &j;
    __atomic_add_fetch(&posted, 1, __ATOMIC_RELEASE);
    /* helpers wanted, less the watchers no earlier post counted on (they
     * see `posted` move), the rest from the sleepers */
    int wake = (int)(n - 1 < sz - 1 ? n - 1 : sz - 1);
    int counted = wake < unclaimed ? wake : unclaimed;
    unclaimed -= counted;
    wake -= counted;
    if (wake > sleepers) wake = sleepers;
    for (int i = 0; i < wake; i++) pthread_cond_signal(&work_cv);
    while (j.next < j.n) run_task(&j, claim(&j));
    if (j.done < j.n) {
        long ns = spin_locked();
        if (ns > 0) {
            pthread_mutex_unlock(&mu);
            if (cores_to_spare()) spin_until_done(&j.done, j.n, ns);
            pthread_mutex_lock(&mu);
        }
        while (j.done < j.n) pthread_cond_wait(&done_cv, &mu);
    }
    pthread_mutex_unlock(&mu);
}

#define ROWS_PAR_ELEMS ((int64_t)1 << 15) /* elements below which rows stay on the caller */

typedef struct {
    cpu_rows_fn fn;
    void *ctx;
    int64_t rows, chunks;
} rows_job_t;

static void rows_task(void *ctx, int64_t t) {
    const rows_job_t *j = ctx;
    j->fn(j->ctx, j->rows * t / j->chunks, j->rows * (t + 1) / j->chunks);
}

void cpu_par_rows(int64_t rows, int64_t width, cpu_rows_fn fn, void *ctx) {
    if (rows <= 0) return;
    int64_t chunks = rows * (width > 0 ? width : 1) < ROWS_PAR_ELEMS ? 1 : cpu_pool_threads();
    if (chunks > rows) chunks = rows;
    if (chunks <= 1) {
        fn(ctx, 0, rows);
        return;
    }
    rows_job_t j = { fn, ctx, rows, chunks };
    cpu_par_for(chunks, rows_task, &j);
}

int cpu_pool_threads(void) {
    pthread_mutex_lock(&mu);
    int n = size_locked();
    pthread_mutex_unlock(&mu);
    return n;
}

void kern_cpu_threads_set(int n) {
    pthread_mutex_lock(&mu);
    size = 0;
    if (n > 0) size = clamp_size(n);
    else size_locked(); /* back to REEL_THREADS or the cores */
    pthread_mutex_unlock(&mu);
}

int kern_cpu_threads(void) { return cpu_pool_threads(); }

void cpu_pool_spin_set(long us, bool always) {
    pthread_mutex_lock(&mu);
    spin_ns = us < 0 ? -1 : (us > 10000000 ? 10000000 : us) * 1000L;
    __atomic_store_n(&spin_always, always, __ATOMIC_RELAXED);
    __atomic_store_n(&load_x16, -1, __ATOMIC_RELAXED);
    __atomic_store_n(&load_at, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&mu);
}
