/* cpu_pool.h -- the CPU backend's one thread pool: every parallel kernel
 * (the GEMMs' column slices, attention's heads) runs its tasks here, and
 * OpenBLAS runs single-threaded inside them.
 *
 * Why one pool: OpenBLAS's own threads spin and yield between calls, and a
 * worker's stream threads each drive GEMMs; with more busy threads than
 * cores they took a third of a step's time in sched_yield (issue 31's
 * profile). Here a thread with no task watches for the next one for at
 * most REEL_POOL_SPIN_US (50 us; only while the machine's runnable threads
 * do not outnumber its cores) and then sleeps on a condition variable, the
 * caller of cpu_par_for runs tasks itself (so nesting or a pool of one can
 * never deadlock), and several callers (streams) share the same threads.
 *
 * Size: kern_cpu_threads_set (reel-worker --threads), else REEL_THREADS,
 * else the cores this process may run on (its affinity mask). A kernel's
 * task split may depend on the size, but never its results: each task
 * computes a fixed part of the output the same way whoever runs it. */
#ifndef REEL_KERNELS_CPU_POOL_H
#define REEL_KERNELS_CPU_POOL_H

#include <stdbool.h>
#include <stdint.h>

typedef void (*cpu_task_fn)(void *ctx, int64_t task);

/* Runs fn(ctx, t) for every t in [0, n), on the pool's threads and the
 * calling thread, and returns when all have returned. Tasks must not fail
 * (check before) and must not depend on which thread runs them. n <= 1 or a
 * pool of one runs them in order on the caller. */
void cpu_par_for(int64_t n, cpu_task_fn fn, void *ctx);

/* Rows [r0, r1) of a row-wise kernel. */
typedef void (*cpu_rows_fn)(void *ctx, int64_t r0, int64_t r1);

/* Runs fn over rows [0, rows) in contiguous chunks on the pool, one chunk
 * per thread when rows·width (the elements touched) is large enough to pay
 * for it, else all on the caller. For kernels whose rows are independent:
 * the chunks change nothing in the results. */
void cpu_par_rows(int64_t rows, int64_t width, cpu_rows_fn fn, void *ctx);

/* Sets OpenBLAS single-threaded and stops its own threads (ops_gemm.c):
 * the pool shares out the work. Called as every process linking it
 * starts, and when a CPU backend is made. Cannot fail. */
void kern_cpu_blas_single(void);

/* The GEMMs run with their tiles cut for idle threads (ops_gemm.c) since
 * the process started, and the (tile, split) shapes OpenBLAS said yes and
 * no to. For tests and benchmarks; cannot fail. */
void kern_cpu_gemm_split_stats(uint64_t *runs, int *yes, int *no);
/* Forgets OpenBLAS's answers, so the next GEMMs ask again. For tests;
 * cannot fail. */
void kern_cpu_gemm_split_forget(void);
/* The same for attention's whole-row blocks cut for idle threads
 * (ops_attention.c). */
void kern_cpu_attention_cut_stats(uint64_t *runs, int *yes, int *no);
void kern_cpu_attention_cut_forget(void);

/* How long (microseconds, at most 10 s) an idle pool thread watches for
 * work before it sleeps; 0 never watches; negative: back to
 * REEL_POOL_SPIN_US, else 50. always: watch whatever the machine's load
 * (else only while runnable threads do not outnumber the cores). Also
 * forgets the load, so the next watch reads it afresh. For tests and
 * benchmarks; cannot fail. */
void cpu_pool_spin_set(long us, bool always);

/* The pool's size: threads that may run one cpu_par_for's tasks, the
 * caller included (>= 1). */
int cpu_pool_threads(void);

#endif
