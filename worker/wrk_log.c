/* wrk_log.c -- the worker's one log line format: "reel-worker NAME: msg". */
#include <stdarg.h>
#include <stdio.h>
#include "worker/wrk.h"

void wrk_log(const wrk_t *w, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* One fprintf: lines from several threads do not interleave. */
    fprintf(stderr, "reel-worker %s: %s\n", w && w->opt && w->opt->name ? w->opt->name : "?", msg);
}
