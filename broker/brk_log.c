/* brk_log.c -- one whole line per event on stderr (see brk_log.h). */
#include "broker/brk_log.h"

#include <assert.h>
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

static void say_left_out(const char *who, uint64_t left_out) {
    brk_log("%s: %llu more lines like the ones above were left out of the log (at most %d a %d s window)", who,
            (unsigned long long)left_out, REEL_LOG_BURST, REEL_LOG_WINDOW_MS / 1000);
}

static void vlimited(reel_log_budget_t *lb, const char *who, const char *fmt, va_list ap) {
    uint64_t left_out = 0;
    bool write = reel_log_budget_take(lb, reel_mono_ms(), &left_out);
    if (left_out) say_left_out(who, left_out);
    if (write) vlog(fmt, ap);
}

void brk_log_limited(reel_log_budget_t *lb, const char *who, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlimited(lb, who, fmt, ap);
    va_end(ap);
}

void brk_log_summary(reel_log_budget_t *lb, const char *who) {
    uint64_t left_out = lb->suppressed ? reel_log_budget_expired(lb, reel_mono_ms()) : 0;
    if (left_out) say_left_out(who, left_out);
}

void brk_log_flush(reel_log_budget_t *lb, const char *who) {
    if (lb->suppressed) say_left_out(who, lb->suppressed);
    *lb = (reel_log_budget_t){ 0 };
}

void brk_log_kind(brk_log_kinds_t *t, const char *kind, const char *fmt, ...) {
    int i = 0;
    while (i < t->n && strcmp(t->kind[i], kind)) i++;
    if (i == t->n) {
        assert(t->n < BRK_LOG_KINDS); /* a kind is a literal of the code: room for all of them */
        if (t->n == BRK_LOG_KINDS) i = BRK_LOG_KINDS - 1; /* (NDEBUG: shares the last one's budget) */
        else t->kind[t->n++] = kind;
    }
    va_list ap;
    va_start(ap, fmt);
    vlimited(&t->lb[i], kind, fmt, ap);
    va_end(ap);
}

void brk_log_kinds_summary(brk_log_kinds_t *t) {
    for (int i = 0; i < t->n; i++) brk_log_summary(&t->lb[i], t->kind[i]);
}
