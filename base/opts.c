/* opts.c -- table-driven command lines (see opts.h). */
#include "base/opts.h"

#include <float.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/parse.h"

#define OPTS_MAX 64 /* rows one table may have (a programmer's limit) */

static bool takes_value(reel_opt_kind_t k) { return k != REEL_OPT_FLAG && k != REEL_OPT_HELP; }

/* What a bad value of row r was expected to be, into buf. */
static const char *expected(const reel_opt_t *r, char *buf, size_t len) {
    if (r->expect) return r->expect;
    switch (r->kind) {
    case REEL_OPT_INT:
    case REEL_OPT_I64: snprintf(buf, len, "%lld..%lld", r->lo, r->hi); break;
    case REEL_OPT_U64: snprintf(buf, len, "%llu..%llu", r->ulo, r->uhi); break;
    case REEL_OPT_DOUBLE:
    case REEL_OPT_FLOAT:
        if (r->dlo == r->dhi) snprintf(buf, len, "a number");
        else snprintf(buf, len, "a number in %g..%g", r->dlo, r->dhi);
        break;
    case REEL_OPT_CHOICE:
    case REEL_OPT_BOOL_CHOICE: {
        size_t k = 0, m = 0;
        while (r->choices[m]) m++;
        buf[0] = '\0';
        for (size_t i = 0; i < m; i++)
            k += (size_t)snprintf(buf + (k < len ? k : len), k < len ? len - k : 0, "%s%s",
                                  i == 0 ? "" : i + 1 == m ? " or " : ", ", r->choices[i]);
        break;
    }
    default: snprintf(buf, len, "a valid value"); break;
    }
    return buf;
}

/* Reads v by row r into dst. 0, or -1 with the error value set: the
 * row's "bad value" message, or a setter's own error (opts.h). The number
 * parsers' own wording is replaced by the row's: one message shape for
 * every option, and the one the scripts and operators know. */
static int store(const reel_opt_t *r, void *dst, const char *v) {
    char *p = (char *)dst + r->off;
    char what[80];
    snprintf(what, sizeof what, "--%s", r->name);
    int64_t i;
    uint64_t u;
    double d;
    bool ok = true;
    switch (r->kind) {
    case REEL_OPT_FLAG: *(bool *)p = true; break;
    case REEL_OPT_STRING: *(const char **)p = v; break;
    case REEL_OPT_INT:
        /* the row's range, cut to what an int holds */
        if ((ok = reel_parse_i64(v, r->lo > INT_MIN ? r->lo : INT_MIN, r->hi < INT_MAX ? r->hi : INT_MAX,
                                 what, &i) == 0))
            *(int *)p = (int)i;
        break;
    case REEL_OPT_I64:
        if ((ok = reel_parse_i64(v, r->lo, r->hi, what, &i) == 0)) *(int64_t *)p = i;
        break;
    case REEL_OPT_U64:
        if ((ok = reel_parse_u64(v, r->ulo, r->uhi, what, &u) == 0)) *(uint64_t *)p = u;
        break;
    case REEL_OPT_DOUBLE:
        if ((ok = reel_parse_f64(v, r->dlo != r->dhi ? r->dlo : -DBL_MAX, r->dlo != r->dhi ? r->dhi : DBL_MAX, what,
                                 &d) == 0))
            *(double *)p = d;
        break;
    case REEL_OPT_FLOAT:
        /* "any" is what a float holds: 1e300 would be stored as inf */
        if ((ok = reel_parse_f64(v, r->dlo != r->dhi ? r->dlo : -FLT_MAX, r->dlo != r->dhi ? r->dhi : FLT_MAX, what,
                                 &d) == 0))
            *(float *)p = (float)d;
        break;
    case REEL_OPT_CHOICE:
    case REEL_OPT_BOOL_CHOICE: {
        int k = 0;
        while (r->choices[k] && strcmp(r->choices[k], v)) k++;
        ok = r->choices[k] != NULL;
        if (ok && r->kind == REEL_OPT_CHOICE) *(int *)p = k;
        if (ok && r->kind == REEL_OPT_BOOL_CHOICE) *(bool *)p = k != 0;
        break;
    }
    case REEL_OPT_SET:
        reel_err_clear(); /* so that a setter which recorded nothing is told from one which did */
        ok = r->set(dst, v) == 0;
        if (!ok && !r->expect && reel_err_code() != REEL_OK) return -1; /* the setter said why */
        break;
    case REEL_OPT_HELP: break;
    }
    if (ok) return 0;
    char e[256];
    return reel_fail(REEL_E_INVALID, "%s: '%s' is a bad value: expected %s", what, v, expected(r, e, sizeof e));
}

int reel_opts_parse(const reel_opt_t *t, size_t n, void *dst, int argc, char **argv, int *rest) {
    /* a programmer's error: the table is the program's own */
    if (n > OPTS_MAX) return reel_fail(REEL_E_INTERNAL, "option table of %zu rows (at most %d)", n, OPTS_MAX);
    struct option longs[OPTS_MAX + 1];
    char shorts[2 * OPTS_MAX + 2];
    size_t ns = 0;
    shorts[ns++] = ':'; /* a missing value is ':', an unknown option '?' */
    for (size_t i = 0; i < n; i++) {
        longs[i] = (struct option){ t[i].name, takes_value(t[i].kind) ? required_argument : no_argument, NULL,
                                    256 + (int)i };
        if (t[i].short_name) {
            shorts[ns++] = t[i].short_name;
            if (takes_value(t[i].kind)) shorts[ns++] = ':';
        }
    }
    longs[n] = (struct option){ NULL, 0, NULL, 0 };
    shorts[ns] = '\0';
    opterr = 0; /* our own messages, one format */
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
        const reel_opt_t *r = NULL;
        if (c >= 256 && c < 256 + (int)n) r = &t[c - 256];
        for (size_t i = 0; !r && c > 0 && c < 256 && i < n; i++)
            if (t[i].short_name == c) r = &t[i];
        /* the command line's shape, not a value: *rest 0 says so (the
         * caller may show its usage) */
        if (c == ':' || !r) {
            if (rest) *rest = 0;
            return c == ':' ? reel_fail(REEL_E_INVALID, "option '%s' needs a value", argv[optind - 1])
                            : reel_fail(REEL_E_INVALID, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
        if (r->kind == REEL_OPT_HELP) return 1;
        if (store(r, dst, optarg) != 0) return -1;
    }
    if (rest) *rest = optind;
    return 0;
}

size_t reel_opts_usage(const reel_opt_t *t, size_t n, int col, char *buf, size_t len) {
    size_t k = strnlen(buf, len);
#define PUT(...) k += (size_t)snprintf(buf + (k < len ? k : len), k < len ? len - k : 0, __VA_ARGS__)
    for (size_t i = 0; i < n; i++) {
        if (!t[i].help) continue;
        char left[160];
        int m = snprintf(left, sizeof left, "  %s%c%s--%s%s%s", t[i].short_name ? "-" : "",
                         t[i].short_name ? t[i].short_name : ' ', t[i].short_name ? ", " : "", t[i].name,
                         t[i].arg ? " " : "", t[i].arg ? t[i].arg : "");
        if (!t[i].short_name) m = snprintf(left, sizeof left, "  --%s%s%s", t[i].name, t[i].arg ? " " : "",
                                           t[i].arg ? t[i].arg : "");
        PUT("%s%*s", left, m <= col - 2 ? col - m : 2, "");
        for (const char *h = t[i].help; *h;) {
            size_t l = strcspn(h, "\n");
            PUT("%.*s\n", (int)l, h);
            h += l;
            if (*h == '\n' && *++h) PUT("%*s", col, "");
        }
    }
#undef PUT
    return k;
}
