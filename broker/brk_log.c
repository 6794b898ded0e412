/* brk_log.c -- one whole line per event on stderr (see brk_log.h). */
#include "broker/brk_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"

static void vlog(const char *fmt, va_list ap) {
    char line[1024];
    int n = snprintf(line, sizeof line, "reel-broker: ");
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    fwrite(line, 1, len, stderr); /* one call: stdio locks the stream around it */
}

void brk_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void brk_log_limited(reel_log_budget_t *lb, const char *who, const char *fmt, ...) {
    uint64_t left_out = 0;
    bool write = reel_log_budget_take(lb, reel_mono_ms(), &left_out);
    if (left_out)
        brk_log("%s: %llu more lines like the ones above were left out of the log (at most %d a %d s window)", who,
                (unsigned long long)left_out, REEL_LOG_BURST, REEL_LOG_WINDOW_MS / 1000);
    if (!write) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}
