/* stand_in.c -- a Git LFS pointer or an HTML page where a checkpoint
 * should be (see stand_in.h). */
#include "model/stand_in.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* The pointer's first line, by the spec (git-lfs docs/spec.md): "version
 * https://git-lfs.github.com/spec/v1"; older clients wrote
 * "https://hawser.github.com/spec/v1", so the key and the spec path are
 * what is matched. */
#define LFS_VERSION "version https://"
#define LFS_SPEC "/spec/v1"

/* Whether s[0..n) starts with the ASCII text p, ignoring case. */
static bool starts_nocase(const unsigned char *s, size_t n, const char *p) {
    size_t k = strlen(p);
    if (n < k) return false;
    for (size_t i = 0; i < k; i++)
        if (tolower(s[i]) != tolower((unsigned char)p[i])) return false;
    return true;
}

/* The "size N" line of an LFS pointer, or -1 when it has none in head. */
static long long lfs_size(const unsigned char *s, size_t n) {
    for (size_t i = 0; i + 6 < n; i++) {
        if ((i == 0 || s[i - 1] == '\n') && !memcmp(s + i, "size ", 5) && isdigit(s[i + 5])) {
            long long v = 0;
            for (size_t j = i + 5; j < n && isdigit(s[j]) && v < 1000000000000000LL; j++) v = v * 10 + (s[j] - '0');
            return v;
        }
    }
    return -1;
}

int stand_in_check(const char *origin, const void *head, size_t n) {
    const unsigned char *s = head;
    if (!s) return 0;
    if (n > STAND_IN_HEAD) n = STAND_IN_HEAD;
    const unsigned char *nl = memchr(s, '\n', n);
    size_t first = nl ? (size_t)(nl - s) : n;
    if (first > strlen(LFS_VERSION) && !memcmp(s, LFS_VERSION, strlen(LFS_VERSION)) &&
        memmem(s, first, LFS_SPEC, strlen(LFS_SPEC))) {
        long long size = lfs_size(s, n);
        if (size >= 0)
            return reel_fail(REEL_E_INVALID, "%s is a Git LFS pointer, not the file (run `git lfs pull` in its "
                             "repository; the file is %lld bytes)", origin, size);
        return reel_fail(REEL_E_INVALID, "%s is a Git LFS pointer, not the file (run `git lfs pull` in its repository)",
                         origin);
    }
    /* an HTML page: a UTF-8 BOM and white space may come before its tag */
    size_t i = n >= 3 && !memcmp(s, "\xef\xbb\xbf", 3) ? 3 : 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) i++;
    static const char *const tags[] = { "<!doctype html", "<html", "<head", "<!--" };
    for (size_t t = 0; t < sizeof tags / sizeof tags[0]; t++)
        if (starts_nocase(s + i, n - i, tags[t]))
            return reel_fail(REEL_E_INVALID, "%s is an HTML page, not the file (a download saved a web page under "
                             "its name, often a sign-in or error page: download the file itself, e.g. with "
                             "`huggingface-cli download` or `git lfs pull`)", origin);
    return 0;
}
