/* bench.h -- what every benchmark of bench/ (and deploy/'s GPU timers)
 * measures with: a monotonic clock in seconds and the median of a sample. */
#ifndef REEL_BENCH_BENCH_H
#define REEL_BENCH_BENCH_H

#include <stdlib.h>
#include <time.h>

/* Monotonic seconds. */
static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort's order of doubles. */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (n >= 1); sorts v. */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
