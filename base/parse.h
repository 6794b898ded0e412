/* parse.h -- the one way Reel reads a number from text (options, config
 * values, headers): all of the text, decimal, in a range, or an error.
 *
 * Each returns 0 and sets *out, or returns -1 with a REEL_E_INVALID error
 * (base/error.h) naming `what` (an option, a field: "--port") and the
 * text, and leaves *out unchanged. Refused: NULL or empty text, leading
 * or trailing space, a '+' sign, a '-' on an unsigned value, junk after
 * the number, overflow, and values outside [lo, hi]. */
#ifndef REEL_BASE_PARSE_H
#define REEL_BASE_PARSE_H

#include <stdint.h>

int reel_parse_i64(const char *s, int64_t lo, int64_t hi, const char *what, int64_t *out);
int reel_parse_u64(const char *s, uint64_t lo, uint64_t hi, const char *what, uint64_t *out);
/* An int in [lo, hi] (a convenience over reel_parse_i64). */
int reel_parse_int(const char *s, int lo, int hi, const char *what, int *out);
/* A finite decimal or exponent number ("0.5", "1e-3") in [lo, hi]; "nan"
 * and "inf" are refused. */
int reel_parse_f64(const char *s, double lo, double hi, const char *what, double *out);
/* A byte count: digits with an optional unit K, M, G or T (powers of
 * 1024), optionally followed by "iB" or "B" ("64G", "512MiB", "4096",
 * "100B"), case-insensitive, at most max. */
int reel_parse_bytes(const char *s, uint64_t max, const char *what, uint64_t *out);

#endif
