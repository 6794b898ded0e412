/* brk_log.c -- one whole line per event on stderr (see brk_log.h). */
#include "broker/brk_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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

void brk_log_limited(brk_log_budget_t *lb, const char *who, const char *fmt, ...) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    if (now - lb->window_ms >= BRK_LOG_WINDOW_MS) {
        if (lb->suppressed)
            brk_log("%s: %llu more lines like the ones above were left out of the log (at most %d a %d s window)",
                    who, lb->suppressed, BRK_LOG_BURST, BRK_LOG_WINDOW_MS / 1000);
        lb->window_ms = now;
        lb->lines = 0;
        lb->suppressed = 0;
    }
    if (lb->lines >= BRK_LOG_BURST) {
        lb->suppressed++;
        return;
    }
    lb->lines++;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}
