/* fuzz_clean.c -- libFuzzer harness: Wan's prompt cleaning (tok_clean:
 * ftfy's fixers, html.unescape twice, whitespace) on any bytes. Invalid
 * UTF-8 must be refused; anything accepted must come out as valid UTF-8
 * within the 4-fold bound `reelctl tokenize --clean` sizes its buffer by,
 * with no whitespace at either end and no run of two spaces. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "media/tokenizer.h"

/* Strict UTF-8, as Python decodes it: no overlong forms, no surrogates,
 * nothing past U+10FFFF. */
static int utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!k || i + k > n) return 0;
        uint32_t v = k == 1 ? c : c & (0x7F >> k);
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            v = v << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 3 && v < 0x800) || (k == 4 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF))
            return 0;
        i += k;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *in = malloc(size + 1);
    if (!in) return 0;
    memcpy(in, data, size);
    in[size] = '\0';
    size_t cap = strlen(in) * 4 + 16;
    char *out = malloc(cap);
    if (!out) abort();
    if (tok_clean(in, out, cap) == 0) {
        size_t n = strlen(out);
        if (!utf8_valid((const unsigned char *)out, n)) abort();
        if (n && (out[0] == ' ' || out[n - 1] == ' ')) abort();
        if (strstr(out, "  ")) abort();
    } else if (utf8_valid((const unsigned char *)in, strlen(in))) {
        abort(); /* valid UTF-8 within the bound must clean */
    }
    free(out);
    free(in);
    return 0;
}
