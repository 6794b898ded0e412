/* clock.h -- the clocks of Reel: monotonic time for durations and
 * deadlines, wall time (UNIX seconds) for what is recorded. */
#ifndef REEL_BASE_CLOCK_H
#define REEL_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic seconds (for durations). */
static inline double reel_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Monotonic milliseconds (for deadlines and poll timeouts). */
static inline int64_t reel_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wall-clock UNIX seconds (for rows and logs). */
static inline double reel_unix_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
