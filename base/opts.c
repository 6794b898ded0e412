/* opts.c -- table-driven command lines (see opts.h). */
#include "base/opts.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPTS_MAX 64 /* rows one table may have (a programmer's limit) */

static bool takes_value(reel_opt_kind_t k) { return k != REEL_OPT_FLAG && k != REEL_OPT_HELP; }

static bool parse_ll(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_ull(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *out) {
    if (!s || !*s || *s == '-' || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_d(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || (lo != hi && (v < lo || v > hi))) return false;
    *out = v;
    return true;
}

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

/* Stores value into dst by row r. 0, or -1 with err. */
static int store(const reel_opt_t *r, void *dst, const char *v, char *err, size_t len) {
    char *p = (char *)dst + r->off;
    long long ll;
    unsigned long long ull;
    double d;
    bool ok = true;
    err[0] = '\0';
    switch (r->kind) {
    case REEL_OPT_FLAG: *(bool *)p = true; break;
    case REEL_OPT_STRING: *(const char **)p = v; break;
    case REEL_OPT_INT:
        if ((ok = parse_ll(v, r->lo, r->hi, &ll))) *(int *)p = (int)ll;
        break;
    case REEL_OPT_I64:
        if ((ok = parse_ll(v, r->lo, r->hi, &ll))) *(int64_t *)p = (int64_t)ll;
        break;
    case REEL_OPT_U64:
        if ((ok = parse_ull(v, r->ulo, r->uhi, &ull))) *(uint64_t *)p = (uint64_t)ull;
        break;
    case REEL_OPT_DOUBLE:
        if ((ok = parse_d(v, r->dlo, r->dhi, &d))) *(double *)p = d;
        break;
    case REEL_OPT_FLOAT:
        if ((ok = parse_d(v, r->dlo, r->dhi, &d))) *(float *)p = (float)d;
        break;
    case REEL_OPT_CHOICE:
    case REEL_OPT_BOOL_CHOICE: {
        int i = 0;
        while (r->choices[i] && strcmp(r->choices[i], v)) i++;
        ok = r->choices[i] != NULL;
        if (ok && r->kind == REEL_OPT_CHOICE) *(int *)p = i;
        if (ok && r->kind == REEL_OPT_BOOL_CHOICE) *(bool *)p = i != 0;
        break;
    }
    case REEL_OPT_SET:
        ok = r->set(dst, v, err, len) == 0;
        if (!ok && err[0]) return -1; /* the setter said why */
        break;
    case REEL_OPT_HELP: break;
    }
    if (ok) return 0;
    char e[256];
    snprintf(err, len, "--%s: '%s' is a bad value: expected %s", r->name, v, expected(r, e, sizeof e));
    return -1;
}

int reel_opts_parse(const reel_opt_t *t, size_t n, void *dst, int argc, char **argv, int *rest, char *err,
                    size_t len) {
    /* programmer errors: the table is the program's own */
    if (n > OPTS_MAX) {
        snprintf(err, len, "option table of %zu rows (at most %d)", n, OPTS_MAX);
        return -1;
    }
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
        if (c == ':') {
            snprintf(err, len, "option '%s' needs a value", argv[optind - 1]);
            return -1;
        }
        if (!r) {
            snprintf(err, len, "unknown or incomplete option '%s'", argv[optind - 1]);
            return -1;
        }
        if (r->kind == REEL_OPT_HELP) return 1;
        if (store(r, dst, optarg, err, len) != 0) return -1;
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
