/* brk_log.h -- the broker's log (internal header): one line per notable
 * event on stderr, "reel-broker: ...", written whole so lines from the
 * catalog thread never interleave with the routing loop's. */
#ifndef REEL_BROKER_BRK_LOG_H
#define REEL_BROKER_BRK_LOG_H

#include "base/logbudget.h"

/* Writes "reel-broker: <fmt...>\n" to stderr. Can't fail (a line longer
 * than 1 KiB is cut). */
void brk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* As brk_log, within lb (a peer's share of the log: base/logbudget.h):
 * at most REEL_LOG_BURST lines a REEL_LOG_WINDOW_MS window; the rest are
 * counted, and the first line after the window says how many of `who`'s
 * were left out. So a worker that floods the broker with faulty messages
 * cannot fill its disk. Can't fail. */
void brk_log_limited(reel_log_budget_t *lb, const char *who, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
