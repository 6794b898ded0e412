/* metrics.c -- the Prometheus text exposition helpers and the fixed-bucket
 * histogram (base/metrics.h). */
#include "base/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- text ------------------------------------------------------------------------ */

void reel_text_printf(reel_text_t *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = t->cap - t->n;
        int w = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? room : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            t->failed = true;
            return;
        }
        if (t->p && (size_t)w < room) {
            t->n += (size_t)w;
            return;
        }
        size_t cap = t->cap ? t->cap : 4096;
        while (cap - t->n <= (size_t)w) cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->failed = true;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
}

void reel_text_free(reel_text_t *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

void reel_prom_family(reel_text_t *t, const char *name, const char *type, const char *help) {
    reel_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void reel_prom_sample(reel_text_t *t, const char *name, const char *labels, double value) {
    /* integers print as integers; the format reads both */
    char v[64];
    if (isfinite(value) && fabs(value) < 9e15 && value == trunc(value)) snprintf(v, sizeof v, "%lld", (long long)value);
    else if (isnan(value)) snprintf(v, sizeof v, "NaN");
    else if (isinf(value)) snprintf(v, sizeof v, "%s", value > 0 ? "+Inf" : "-Inf");
    else snprintf(v, sizeof v, "%.17g", value);
    if (labels && labels[0]) reel_text_printf(t, "%s{%s} %s\n", name, labels, v);
    else reel_text_printf(t, "%s %s\n", name, v);
}

const char *reel_prom_escape(const char *in, char *out, size_t len) {
    if (!len) return "";
    size_t o = 0;
    for (const char *p = in ? in : ""; *p && o + 3 < len; p++) {
        if (*p == '\\' || *p == '"') {
            out[o++] = '\\';
            out[o++] = *p;
        } else if (*p == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
    return out;
}

static const double hist_bounds[REEL_HIST_N] = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,   0.5,   1,      2.5,   5,    10,    30,   60 };

void reel_hist_observe(reel_hist_t *h, double s) {
    if (!isfinite(s)) return; /* a NaN would poison _sum for good */
    if (s < 0) s = 0;
    int i = 0;
    while (i < REEL_HIST_N && s > hist_bounds[i]) i++;
    h->counts[i]++;
    h->sum += s;
    h->n++;
}

void reel_prom_hist(reel_text_t *t, const char *name, const char *labels, const reel_hist_t *h) {
    const char *sep = labels && labels[0] ? "," : "";
    const char *lb = labels ? labels : "";
    uint64_t cum = 0;
    for (int i = 0; i <= REEL_HIST_N; i++) {
        cum += h->counts[i];
        if (i < REEL_HIST_N) reel_text_printf(t, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, lb, sep, hist_bounds[i],
                                              (unsigned long long)cum);
        else reel_text_printf(t, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, lb, sep, (unsigned long long)cum);
    }
    if (lb[0]) {
        reel_text_printf(t, "%s_sum{%s} %.17g\n%s_count{%s} %llu\n", name, lb, h->sum, name, lb,
                         (unsigned long long)h->n);
    } else {
        reel_text_printf(t, "%s_sum %.17g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
    }
}

