/* logbudget.h -- a peer's share of a daemon's log: at most REEL_LOG_BURST
 * lines a REEL_LOG_WINDOW_MS window; the lines past it are counted, and
 * the count is said once the window is over. So a peer that floods a
 * daemon with messages it refuses, or repeats, cannot fill its disk (the
 * broker's workers and their READYs again, READYs, refusals by kind,
 * SYNC resends, GEN resends, requests' ends and uploads: broker/brk_log.h;
 * the worker's refused REQUESTs, the broker's ERRORs, its requests' ends
 * and start notes, and refused SYNCs: worker/wrk.h).
 * Pure: the caller passes the time and writes the lines; one budget is
 * one thread's. */
#ifndef REEL_BASE_LOGBUDGET_H
#define REEL_BASE_LOGBUDGET_H

#include <stdbool.h>
#include <stdint.h>

#define REEL_LOG_BURST 20         /* lines a budget may write a window */
#define REEL_LOG_WINDOW_MS 10000

typedef struct {
    int64_t window_ms;            /* start of the current window (monotonic ms) */
    unsigned lines;               /* written in it */
    uint64_t suppressed;          /* not written in it */
} reel_log_budget_t;              /* zero: a fresh budget */

/* Whether one more line may be written at now_ms (monotonic ms) within
 * lb; one that may not is counted in lb->suppressed. When now_ms starts a
 * new window, *left_out is the count of the lines the window before left
 * out (0: none), for the caller to say before its line. Can't fail. */
bool reel_log_budget_take(reel_log_budget_t *lb, int64_t now_ms, uint64_t *left_out);

/* The lines left out in a window that is over at now_ms, taken (a new
 * window starts): what a caller says when no line came after a flood
 * stopped. 0 when none were, or the window still runs. Can't fail. */
uint64_t reel_log_budget_expired(reel_log_budget_t *lb, int64_t now_ms);

#endif
