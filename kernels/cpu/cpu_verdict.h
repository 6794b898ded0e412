/* cpu_verdict.h -- answers OpenBLAS gave about its own bits, kept for the
 * process: whether a cut of some work (a GEMM tile into sub-tiles,
 * attention's query block into smaller ones) computes the very bits of
 * the whole (ops_gemm.c, ops_attention.c). Such an answer is a property
 * of OpenBLAS's kernels on this CPU, so it is asked once per shape, on
 * random operands, outside graph replays, and kept here. A table holds
 * up to 256 answers; a full one keeps no more (the caller then answers
 * no: never cut on a guess). Thread-safe. */
#ifndef REEL_KERNELS_CPU_VERDICT_H
#define REEL_KERNELS_CPU_VERDICT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CPU_VERDICT_KEY 8
#define CPU_VERDICTS 256
/* Pools of fewer threads never cut a GEMM's tiles or attention's blocks
 * (ops_gemm.c, ops_attention.c): their tiles keep them busy, and the cost
 * model alone would cut a job of 1, 3 or 5 tiles on 2 threads (small's
 * 256 x 64 output projection) and of 1, 2, 4 or 7 on 3. */
#define CPU_CUT_MIN_THREADS 4

typedef struct {
    int64_t key[CPU_VERDICT_KEY];
    bool ok;
} cpu_verdict_t;

typedef struct {
    pthread_mutex_t mu;
    int n;
    cpu_verdict_t v[CPU_VERDICTS];
} cpu_verdicts_t;

#define CPU_VERDICTS_INIT { PTHREAD_MUTEX_INITIALIZER, 0, { { { 0 }, false } } }

/* The answer kept for key: 1 yes, 0 no, -1 none yet. */
int cpu_verdict_find(cpu_verdicts_t *t, const int64_t key[CPU_VERDICT_KEY]);

/* Keeps ok for key unless an answer is kept already (two threads may ask
 * at once: the first answer stays); returns the answer kept, false when
 * the table is full. */
bool cpu_verdict_keep(cpu_verdicts_t *t, const int64_t key[CPU_VERDICT_KEY], bool ok);

/* Answers kept, yes and no. */
void cpu_verdict_count(cpu_verdicts_t *t, int *yes, int *no);

/* Forgets every answer (tests). */
void cpu_verdict_forget(cpu_verdicts_t *t);

/* Whether key's cut keeps the bits: the kept answer, else (not while a
 * graph replays: unknown then counts as no) probe(ctx) asked now, outside
 * the lock (two threads may ask the same and get the same answer), and
 * kept. probe returns 1 yes, 0 no, -1 could not ask (kept as nothing). */
bool cpu_verdict_ask(cpu_verdicts_t *t, const int64_t key[CPU_VERDICT_KEY], int (*probe)(const void *ctx),
                     const void *ctx);

/* Whether a job of `items` tiles or blocks on a pool of T threads is worth
 * cutting at all: a pool of at least CPU_CUT_MIN_THREADS with more than a
 * quarter of them idle. */
static inline bool cpu_cut_wanted(int64_t items, int T) {
    return T >= CPU_CUT_MIN_THREADS && items < 4 * (int64_t)T;
}

/* Tile-times of `items` items cut f ways (1, 2, 4 or 8) on T threads,
 * each halving counted a tenth dearer (a part packs its operands again:
 * measured 0-10% per halving at small's shapes). A cut is taken when it
 * costs under 0.95 of the best before it. */
static inline double cpu_cut_cost(int64_t items, int64_t f, int T) {
    int halvings = f >= 8 ? 3 : f >= 4 ? 2 : f >= 2 ? 1 : 0;
    return (double)((items * f + T - 1) / T) / (double)f * (1.0 + 0.1 * halvings);
}

/* kern_graph_replay marks its thread (+1 as it starts, -1 as it ends):
 * while it replays, the kernels it runs ask OpenBLAS nothing new (a
 * captured step allocates nothing), and cpu_replaying says so. */
void cpu_replay_mark(int delta);
bool cpu_replaying(void);

/* n floats uniform in [-1, 1) from *seed (xorshift64, advanced): the
 * probes' operands. */
static inline void cpu_fill_random(float *p, size_t n, uint64_t *seed) {
    uint64_t s = *seed;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = (float)((double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
    *seed = s;
}

#endif
