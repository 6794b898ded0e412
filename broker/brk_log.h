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
/* The line brk_log_limited owes: once lb's window has ended with lines
 * left out, "who: N more lines like the ones above ..." now (the loop's
 * timers call it, so a flood that stops is still summed up), and a new
 * window. Can't fail. */
void brk_log_summary(reel_log_budget_t *lb, const char *who);
/* As brk_log_summary, whether or not lb's window has ended: for a budget
 * about to go (a worker dropped), whose count would be lost. Can't fail. */
void brk_log_flush(reel_log_budget_t *lb, const char *who);

/* The lines peers' refused messages write, by kind (a literal naming
 * the refusal: "SYNC refused", "answer not held", ...): each kind has its
 * own budget, so one flood neither fills the log nor hides another
 * kind's first lines. Kinds come from the code, never from a peer:
 * BRK_LOG_KINDS is room for all of them. */
#define BRK_LOG_KINDS 16
typedef struct {
    const char *kind[BRK_LOG_KINDS];
    reel_log_budget_t lb[BRK_LOG_KINDS];
    int n;
} brk_log_kinds_t;

/* As brk_log_limited, within kind's budget in t. Can't fail. */
void brk_log_kind(brk_log_kinds_t *t, const char *kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* brk_log_summary of every kind in t. Can't fail. */
void brk_log_kinds_summary(brk_log_kinds_t *t);

#endif
