/* opts.h -- table-driven command lines: each program describes its options
 * as rows (long name, short letter, kind, where the value goes, its range,
 * usage text), and one parser, built on getopt_long, reads argv into the
 * program's options struct. Every value is checked here; a bad one is an
 * error naming the option and the value, never a clamp.
 *
 * Syntax is getopt_long's: --name VALUE, --name=VALUE, unambiguous
 * prefixes of a long name, -c VALUE for a short letter, options and
 * arguments in any order, "--" ending the options. */
#ifndef REEL_BASE_OPTS_H
#define REEL_BASE_OPTS_H

#include <stddef.h>

typedef enum {
    REEL_OPT_FLAG,   /* bool at off: set true; takes no value */
    /* The numbers are read by base/parse.h: all of the text, no space
     * and no '+' sign. */
    REEL_OPT_INT,    /* int at off: a decimal in [lo, hi] */
    REEL_OPT_I64,    /* int64_t at off: the same */
    REEL_OPT_U64,    /* uint64_t at off: a decimal in [ulo, uhi] (no '-') */
    REEL_OPT_DOUBLE, /* double at off: a finite number in [dlo, dhi] (dlo == dhi: any) */
    REEL_OPT_FLOAT,  /* float at off: the same (dlo == dhi: any a float holds) */
    REEL_OPT_STRING, /* const char * at off: the value itself (it points into argv) */
    REEL_OPT_CHOICE, /* int at off: the index of the value in choices (NULL-terminated) */
    REEL_OPT_BOOL_CHOICE, /* bool at off: choices[0] is false, choices[1] true */
    REEL_OPT_SET,    /* set(dst, value) does it; takes a value */
    REEL_OPT_HELP,   /* parsing stops there: reel_opts_parse returns 1; no value */
} reel_opt_kind_t;

typedef struct {
    const char *name;         /* long name, without "--" */
    char short_name;          /* 0: none */
    reel_opt_kind_t kind;
    size_t off;               /* offsetof the field in the options struct */
    long long lo, hi;         /* INT, I64 */
    unsigned long long ulo, uhi; /* U64 */
    double dlo, dhi;          /* DOUBLE, FLOAT */
    const char *const *choices; /* CHOICE, BOOL_CHOICE */
    /* SET: 0, or -1 with the error value set (base/error.h). The option
     * fails with the setter's error when the row has no expect and the
     * setter recorded one, else with the row's "bad value" message: a
     * setter may fail through a helper (reel_parse_*) whose wording the
     * row's expect replaces. */
    int (*set)(void *dst, const char *value);
    const char *expect;       /* what a bad value was expected to be, for the message;
                               * NULL: said from the range or the choices */
    const char *arg;          /* usage: the value's name ("N", "DIR") */
    const char *help;         /* usage: lines separated by '\n'; NULL: not listed */
} reel_opt_t;

/* Parses argv[1..argc) against rows t[0..n) into dst (whose defaults the
 * caller set). Returns 0 when every option was read (*rest: the index of
 * the first argument that is not an option; the caller decides whether
 * any may follow); 1 when a REEL_OPT_HELP row was met (the options after
 * it are not read); -1 with a REEL_E_INVALID error (base/error.h) whose
 * message is one line naming the option and, for a bad value, the value:
 * "unknown or incomplete option '--x'", "option '--x' needs a value",
 * "--x: 'v' is a bad value: expected ..." (or a setter's own error, see
 * set); for the first two, the command line's shape rather than a value,
 * *rest is set to 0 (a caller may show its usage then; after a bad value
 * it is left as it was). A table of more than 64 rows fails
 * REEL_E_INTERNAL. Options read before a failure stay stored in dst.
 * Resets getopt's state (optind) first. Keeps pointers into argv. */
int reel_opts_parse(const reel_opt_t *t, size_t n, void *dst, int argc, char **argv, int *rest);

/* Appends the usage lines of the rows that have help to buf (NUL-ended,
 * cut at len): "  -c, --name ARG" then the help at column col (two spaces
 * after a longer left part), continuation lines indented to col. Returns
 * the length the whole text needs (as snprintf). Can't fail. */
size_t reel_opts_usage(const reel_opt_t *t, size_t n, int col, char *buf, size_t len);

#endif
