/* wrk_log.c -- the worker's one log line format: "reel-worker NAME: msg",
 * and the shares of the log the broker's refused messages, its ERRORs, the
 * requests that end without a RESULT, the notes of a request's start and
 * the SYNCs refused may write (one budget each). */
#include <stdarg.h>
#include <stdio.h>
#include "base/clock.h"
#include "worker/wrk.h"

#define REFUSED_WHO "refused messages"
#define ERRORS_WHO "broker ERRORs"
#define ENDED_WHO "request ends"
#define NOTED_WHO "request notes"
#define SYNC_WHO "sync refusals"

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

static void say_left_out(const wrk_t *w, const char *who, uint64_t n) {
    wrk_log(w, "%s: %llu more lines like the ones above were left out of the log (at most %d a %d s window)", who,
            (unsigned long long)n, REEL_LOG_BURST, REEL_LOG_WINDOW_MS / 1000);
}

static void vlimited(wrk_t *w, reel_log_budget_t *lb, const char *who, const char *fmt, va_list ap) {
    uint64_t left_out = 0;
    bool write = reel_log_budget_take(lb, reel_mono_ms(), &left_out);
    if (left_out) say_left_out(w, who, left_out);
    if (write) vlog(w, fmt, ap);
}

void wrk_log_refused(wrk_t *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlimited(w, &w->refused_log, REFUSED_WHO, fmt, ap);
    va_end(ap);
}

void wrk_log_said(wrk_t *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlimited(w, &w->said_log, ERRORS_WHO, fmt, ap);
    va_end(ap);
}

/* vlimited for a budget any thread writes: under w->streams_log_mu. */
static void vlocked(wrk_t *w, reel_log_budget_t *lb, const char *who, const char *fmt, va_list ap) {
    pthread_mutex_lock(&w->streams_log_mu);
    vlimited(w, lb, who, fmt, ap);
    pthread_mutex_unlock(&w->streams_log_mu);
}

void wrk_log_ended(wrk_t *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlocked(w, &w->ended_log, ENDED_WHO, fmt, ap);
    va_end(ap);
}

void wrk_log_noted(wrk_t *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlocked(w, &w->noted_log, NOTED_WHO, fmt, ap);
    va_end(ap);
}

void wrk_log_sync_refused(wrk_t *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlocked(w, &w->sync_log, SYNC_WHO, fmt, ap);
    va_end(ap);
}

static void tick(wrk_t *w, reel_log_budget_t *lb, const char *who) {
    uint64_t left_out = reel_log_budget_expired(lb, reel_mono_ms());
    if (left_out) say_left_out(w, who, left_out);
}

void wrk_log_budgets_tick(wrk_t *w) {
    tick(w, &w->refused_log, REFUSED_WHO);
    tick(w, &w->said_log, ERRORS_WHO);
    pthread_mutex_lock(&w->streams_log_mu);
    tick(w, &w->ended_log, ENDED_WHO);
    tick(w, &w->noted_log, NOTED_WHO);
    tick(w, &w->sync_log, SYNC_WHO);
    pthread_mutex_unlock(&w->streams_log_mu);
}
