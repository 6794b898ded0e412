/* brk_log.h -- the broker's log (internal header): one line per notable
 * event on stderr, "reel-broker: ...", written whole so lines from the
 * catalog thread never interleave with the routing loop's. */
#ifndef REEL_BROKER_BRK_LOG_H
#define REEL_BROKER_BRK_LOG_H

/* Writes "reel-broker: <fmt...>\n" to stderr. Can't fail (a line longer
 * than 1 KiB is cut). */
void brk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
