/* names.h -- the one rule for names in Reel: worker, model, component and
 * key names, the fields of a capture key, artifact ids, the names of the
 * protocol. A name is 1..max-1 characters of [A-Za-z0-9_.:+-]: safe in a
 * log line, a file name, a capture key's text and a Prometheus label. */
#ifndef REEL_BASE_NAMES_H
#define REEL_BASE_NAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* True when c may appear in a name. */
static inline bool reel_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == ':' || c == '-' || c == '+';
}

/* True when s (NUL-terminated within max bytes) is a name of at most
 * max-1 characters. NULL is not a name. */
static inline bool reel_name_valid(const char *s, size_t max) {
    size_t n = s ? strnlen(s, max) : 0;
    if (n == 0 || n >= max) return false;
    for (size_t i = 0; i < n; i++)
        if (!reel_name_char(s[i])) return false;
    return true;
}

#endif
