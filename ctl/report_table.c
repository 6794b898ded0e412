/* report_table.c -- drawing JSON rows as a table (see report_table.h). */
#include "ctl/report_table.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"

/* A growable string; every append is checked once, at the end, via ok. */
typedef struct { char *p; size_t n, cap; bool ok; } buf_t;

static void buf_add(buf_t *b, const char *s, size_t n) {
    if (!b->ok) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->ok = false;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void buf_str(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }

static void buf_scalar(buf_t *b, const json_t *v, ctl_fmt_t f) {
    char tmp[64];
    if (!v || json_is_null(v)) {
        buf_str(b, "-");
    } else if (json_is_string(v)) {
        buf_add(b, json_string_value(v), json_string_length(v));
    } else if (json_is_boolean(v)) {
        buf_str(b, json_is_true(v) ? "yes" : "no");
    } else if (f == CTL_F_TIME && json_is_number(v)) {
        double t = json_number_value(v);
        /* Converting a NaN, an infinity or a value beyond time_t is UB: check
         * first (a corrupt or hostile catalog may hold any double). */
        bool ok = isfinite(t) && t > -1e15 && t < 1e15;
        time_t secs = ok ? (time_t)floor(t) : 0;
        struct tm tm;
        if (ok && gmtime_r(&secs, &tm) && strftime(tmp, sizeof tmp, "%Y-%m-%dT%H:%M:%SZ", &tm))
            buf_str(b, tmp);
        else buf_str(b, "?");
    } else if (f == CTL_F_RATE && json_is_number(v)) {
        snprintf(tmp, sizeof tmp, "%.1f%%", 100.0 * json_number_value(v));
        buf_str(b, tmp);
    } else if (f == CTL_F_SECS && json_is_number(v)) {
        snprintf(tmp, sizeof tmp, "%.3f", json_number_value(v));
        buf_str(b, tmp);
    } else if (json_is_integer(v)) {
        snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        buf_str(b, tmp);
    } else if (json_is_real(v)) {
        snprintf(tmp, sizeof tmp, "%g", json_real_value(v));
        buf_str(b, tmp);
    } else {
        buf_str(b, "?");
    }
}

/* The text of one cell: control characters (a key text with a newline
 * would break the table) become '?', and long cells are cut. */
static char *cell(const json_t *row, const ctl_col_t *col) {
    buf_t b = { .ok = true };
    const json_t *v = json_object_get(row, col->key);
    if (col->fmt == CTL_F_LIST && json_is_array(v)) {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) {
            if (i) buf_str(&b, ",");
            if (json_is_object(e)) {
                const char *k;
                const json_t *ev;
                int j = 0;
                json_object_foreach((json_t *)e, k, ev) {
                    if (j++) buf_str(&b, ":");
                    buf_scalar(&b, ev, CTL_F_TEXT);
                }
            } else {
                buf_scalar(&b, e, CTL_F_TEXT);
            }
        }
        if (json_array_size(v) == 0) buf_str(&b, "-");
    } else if (col->fmt == CTL_F_MAP && json_is_object(v)) {
        const char *k;
        const json_t *ev;
        int j = 0;
        json_object_foreach((json_t *)v, k, ev) {
            if (j++) buf_str(&b, ",");
            buf_str(&b, k);
            buf_str(&b, "=");
            buf_scalar(&b, ev, CTL_F_TEXT);
        }
        if (!j) buf_str(&b, "-");
    } else {
        buf_scalar(&b, v, col->fmt);
    }
    if (!b.ok) {
        free(b.p);
        return NULL;
    }
    for (size_t i = 0; i < b.n; i++)
        if ((unsigned char)b.p[i] < 0x20 || b.p[i] == 0x7f) b.p[i] = '?';
    if (col->max > 3 && b.n > (size_t)col->max) {
        size_t cut = (size_t)col->max - 3;
        while (cut > 0 && ((unsigned char)b.p[cut] & 0xc0) == 0x80) cut--; /* whole UTF-8 only */
        memcpy(b.p + cut, "...", 4);
    }
    return b.p;
}

static bool right_aligned(ctl_fmt_t f) { return f == CTL_F_NUM || f == CTL_F_RATE || f == CTL_F_SECS; }

int ctl_table_print(const char *what, FILE *out, const json_t *rows, const ctl_col_t *cols, size_t ncols) {
    size_t nrows = json_array_size(rows);
    char **cells = calloc(nrows * ncols + 1, sizeof *cells);
    size_t *width = calloc(ncols, sizeof *width);
    int ret = -1;
    if (!cells || !width) goto out;
    for (size_t j = 0; j < ncols; j++) width[j] = strlen(cols[j].head);
    for (size_t i = 0; i < nrows; i++)
        for (size_t j = 0; j < ncols; j++) {
            char *s = cells[i * ncols + j] = cell(json_array_get(rows, i), &cols[j]);
            if (!s) goto out;
            if (strlen(s) > width[j]) width[j] = strlen(s);
        }
    for (size_t i = 0; i <= nrows; i++) {
        for (size_t j = 0; j < ncols; j++) {
            const char *s = i == 0 ? cols[j].head : cells[(i - 1) * ncols + j];
            int w = (int)width[j];
            bool last = j + 1 == ncols;
            if (right_aligned(cols[j].fmt)) fprintf(out, "%*s", w, s);
            else if (last) fputs(s, out);
            else fprintf(out, "%-*s", w, s);
            fputs(last ? "\n" : "  ", out);
        }
    }
    if (nrows == 0) fputs("(none)\n", out);
    ret = 0;
out:
    if (ret != 0) reel_fail(REEL_E_NOMEM, "%s: report: out of memory", what);
    if (cells)
        for (size_t i = 0; i < nrows * ncols; i++) free(cells[i]);
    free(cells);
    free(width);
    return ret;
}

