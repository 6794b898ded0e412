/* metrics.h -- what every layer may use to count and expose: a growable
 * text buffer, the Prometheus text exposition format 0.0.4 (families,
 * samples, escaped labels) and a histogram of seconds with fixed buckets.
 * Owned by one thread each; none of these can fail loudly (an out-of-memory
 * text is marked failed). The HTTP server that serves the text is
 * net/http.h. */
#ifndef REEL_BASE_METRICS_H
#define REEL_BASE_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable text buffer the render functions append to. */
typedef struct {
    char *p;
    size_t n, cap;
    bool failed;                 /* out of memory: the text is incomplete */
} reel_text_t;

void reel_text_printf(reel_text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void reel_text_free(reel_text_t *t);

/* # HELP and # TYPE lines of a family. */
void reel_prom_family(reel_text_t *t, const char *name, const char *type, const char *help);
/* One sample: name{labels} value; labels is "" or `a="x",b="y"` (values
 * already escaped: reel_prom_escape). */
void reel_prom_sample(reel_text_t *t, const char *name, const char *labels, double value);
/* Escapes a label value (backslash, quote, newline) into out (len bytes). */
const char *reel_prom_escape(const char *in, char *out, size_t len);

/* A histogram of seconds with fixed buckets (REEL_HIST_BOUNDS: 0.5 ms ..
 * 60 s), owned by one thread. */
#define REEL_HIST_N 16
typedef struct {
    uint64_t counts[REEL_HIST_N + 1];  /* the last: above every bound (+Inf) */
    double sum;
    uint64_t n;
} reel_hist_t;
void reel_hist_observe(reel_hist_t *h, double seconds);
/* The family's samples (_bucket cumulative with le, _sum, _count), with
 * extra labels ("" or `a="x"`). The family line is the caller's. */
void reel_prom_hist(reel_text_t *t, const char *name, const char *labels, const reel_hist_t *h);

#endif
