/* logbudget.c -- a peer's share of a daemon's log (see logbudget.h). */
#include "base/logbudget.h"

uint64_t reel_log_budget_expired(reel_log_budget_t *lb, int64_t now_ms) {
    if (now_ms - lb->window_ms < REEL_LOG_WINDOW_MS) return 0;
    uint64_t n = lb->suppressed;
    lb->window_ms = now_ms;
    lb->lines = 0;
    lb->suppressed = 0;
    return n;
}

bool reel_log_budget_take(reel_log_budget_t *lb, int64_t now_ms, uint64_t *left_out) {
    *left_out = reel_log_budget_expired(lb, now_ms);
    if (lb->lines >= REEL_LOG_BURST) {
        lb->suppressed++;
        return false;
    }
    lb->lines++;
    return true;
}
