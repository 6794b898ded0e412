/* parse.c -- numbers from text, whole and in range (base/parse.h). */
#include "base/parse.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* The text an error quotes: cut so a long argument cannot flood a message. */
#define QUOTE(s) (int)(strlen(s) > 64 ? 64 : strlen(s)), (s)

/* NULL, empty, a leading space or sign other than '-' (when allowed):
 * strto* would skip or accept what an option should refuse. */
static int start_ok(const char *s, int allow_minus) {
    if (!s || !*s) return 0;
    if (*s == '-') return allow_minus && (isdigit((unsigned char)s[1]) || s[1] == '.');
    return isdigit((unsigned char)*s) || *s == '.';
}

int reel_parse_i64(const char *s, int64_t lo, int64_t hi, const char *what, int64_t *out) {
    if (!start_ok(s, 1))
        return reel_fail(REEL_E_INVALID, "%s: '%.*s' is not an integer", what, QUOTE(s ? s : ""));
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end) return reel_fail(REEL_E_INVALID, "%s: '%.*s' is not an integer", what, QUOTE(s));
    if (errno == ERANGE || v < lo || v > hi)
        return reel_fail(REEL_E_INVALID, "%s: %.*s is out of range [%" PRId64 ", %" PRId64 "]", what, QUOTE(s), lo,
                         hi);
    *out = v;
    return 0;
}

int reel_parse_u64(const char *s, uint64_t lo, uint64_t hi, const char *what, uint64_t *out) {
    if (!start_ok(s, 0) || *s == '.')
        return reel_fail(REEL_E_INVALID, "%s: '%.*s' is not a non-negative integer", what, QUOTE(s ? s : ""));
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end) return reel_fail(REEL_E_INVALID, "%s: '%.*s' is not a non-negative integer", what, QUOTE(s));
    if (errno == ERANGE || v < lo || v > hi)
        return reel_fail(REEL_E_INVALID, "%s: %.*s is out of range [%" PRIu64 ", %" PRIu64 "]", what, QUOTE(s), lo,
                         hi);
    *out = v;
    return 0;
}

int reel_parse_int(const char *s, int lo, int hi, const char *what, int *out) {
    int64_t v;
    if (reel_parse_i64(s, lo, hi, what, &v)) return -1;
    *out = (int)v;
    return 0;
}

int reel_parse_f64(const char *s, double lo, double hi, const char *what, double *out) {
    if (!start_ok(s, 1)) return reel_fail(REEL_E_INVALID, "%s: '%.*s' is not a number", what, QUOTE(s ? s : ""));
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || !isfinite(v)) return reel_fail(REEL_E_INVALID, "%s: '%.*s' is not a finite number", what, QUOTE(s));
    if (v < lo || v > hi) return reel_fail(REEL_E_INVALID, "%s: %.*s is out of range [%g, %g]", what, QUOTE(s), lo, hi);
    *out = v;
    return 0;
}

int reel_parse_bytes(const char *s, uint64_t max, const char *what, uint64_t *out) {
    if (!s || !isdigit((unsigned char)*s))
        return reel_fail(REEL_E_INVALID, "%s: '%.*s' is not a byte count (like 4096, 512M or 64GiB)", what,
                         QUOTE(s ? s : ""));
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;
    switch (tolower((unsigned char)*end)) {
    case 'k': shift = 10; end++; break;
    case 'm': shift = 20; end++; break;
    case 'g': shift = 30; end++; break;
    case 't': shift = 40; end++; break;
    default: break;
    }
    if (shift && (!strcmp(end, "iB") || !strcmp(end, "ib"))) end += 2;
    else if (*end == 'B' || *end == 'b') end++;
    if (*end)
        return reel_fail(REEL_E_INVALID, "%s: '%.*s' is not a byte count (like 4096, 512M or 64GiB)", what,
                         QUOTE(s));
    if (errno == ERANGE || (shift && v > (UINT64_MAX >> shift)) || (v << shift) > max)
        return reel_fail(REEL_E_INVALID, "%s: %.*s is more than %" PRIu64 " bytes", what, QUOTE(s), max);
    *out = (uint64_t)v << shift;
    return 0;
}
