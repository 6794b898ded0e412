/* wrk_log.c -- the worker's one log line format: "reel-worker NAME: msg",
 * and the share of the log the broker's refused messages may write. */
#include <stdarg.h>
#include <stdio.h>
#include "base/clock.h"
#include "worker/wrk.h"

#define REFUSED_WHO "refused messages"

static void vlog(const wrk_t *w, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* One fprintf: lines from several threads do not interleave. */
    fprintf(stderr, "reel-worker %s: %s\n", w && w->opt && w->opt->name ? w->opt->name : "?", msg);
}

void wrk_log(const wrk_t *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(w, fmt, ap);
    va_end(ap);
}

static void say_left_out(const wrk_t *w, uint64_t n) {
    wrk_log(w, "%s: %llu more lines like the ones above were left out of the log (at most %d a %d s window)",
            REFUSED_WHO, (unsigned long long)n, REEL_LOG_BURST, REEL_LOG_WINDOW_MS / 1000);
}

void wrk_log_refused(wrk_t *w, const char *fmt, ...) {
    uint64_t left_out = 0;
    bool write = reel_log_budget_take(&w->refused_log, reel_mono_ms(), &left_out);
    if (left_out) say_left_out(w, left_out);
    if (!write) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(w, fmt, ap);
    va_end(ap);
}

void wrk_log_refused_tick(wrk_t *w) {
    uint64_t left_out = reel_log_budget_expired(&w->refused_log, reel_mono_ms());
    if (left_out) say_left_out(w, left_out);
}
