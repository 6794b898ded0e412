/* tokenizer.c -- a prompt to token ids as Wan2.1's T5EncoderModel makes
 * them (media/tokenizer.h): Wan's prompt cleaning in C, then sentencepiece
 * through media/spm_shim.cc. The cleaning needs no library and is built
 * everywhere; without media support (-DREEL_NO_MEDIA) tok_open and
 * tok_encode fail with one line. */
#include "media/tokenizer.h"

#include "base/error.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#ifndef REEL_NO_MEDIA
#include "base/sha256.h"
#include "media/spm_shim.h"
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#endif

/* ---- a growable byte buffer -------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const void *p, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (b->n + n + 1 > cap) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_put_cp(sbuf_t *b, uint32_t cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | cp >> 6);
        u[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | cp >> 12);
        u[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xF0 | cp >> 18);
        u[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        u[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    sb_put(b, u, n);
}

/* ---- UTF-8 ------------------------------------------------------------------------ */

/* The code point at s[i] (i < len) into *cp: its length in bytes, or 0
 * when the bytes there are not strict UTF-8 (overlong forms, surrogates
 * and values above U+10FFFF are refused, as Python's decoder does). */
static size_t utf8_at(const unsigned char *s, size_t len, size_t i, uint32_t *cp) {
    unsigned c = s[i];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t n;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) n = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (len - i < n) return 0;
    for (size_t k = 1; k < n; k++) {
        if ((s[i + k] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i + k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

/* ---- html.unescape ----------------------------------------------------------------- */

typedef struct {
    const char *name, *utf8;
} entity_t;

static const entity_t entities[] = {
#include "media/html_entities.inc"
};
#define N_ENTITIES (sizeof entities / sizeof entities[0])

/* The replacement of the name s[0..n) (with its ';' when it has one), or
 * NULL when the HTML5 list does not hold it. */
static const char *entity_find(const char *s, size_t n) {
    size_t lo = 0, hi = N_ENTITIES;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strncmp(entities[mid].name, s, n);
        if (c == 0 && entities[mid].name[n] != '\0') c = 1; /* a longer name sorts after s */
        if (c == 0) return entities[mid].utf8;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Python's html._invalid_charrefs for 0x80..0x9F: Windows-1252, where the
 * five undefined bytes stand for themselves. */
static const uint16_t cp1252_80[32] = {
    0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
    0x2039, 0x0152, 0x008D, 0x017D, 0x008F, 0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
    0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178,
};

/* A numeric reference's value as Python's html.unescape writes it. */
static void put_charref(sbuf_t *b, uint32_t v) {
    if (v == 0) return sb_put_cp(b, 0xFFFD);
    if (v == 0x0D) return sb_put_cp(b, 0x0D);
    if (v >= 0x80 && v <= 0x9F) return sb_put_cp(b, cp1252_80[v - 0x80]);
    if ((v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) return sb_put_cp(b, 0xFFFD);
    bool invalid = (v >= 0x01 && v <= 0x08) || v == 0x0B || (v >= 0x0E && v <= 0x1F) ||
                   (v >= 0x7F && v <= 0x9F) || (v >= 0xFDD0 && v <= 0xFDEF) || (v & 0xFFFE) == 0xFFFE;
    if (!invalid) sb_put_cp(b, v);
}

static bool is_hex(unsigned char c) {
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

/* Python's html.unescape of valid UTF-8 s[0..len) into b: character
 * references matched as its pattern &(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|
 * [^\t\n\f <&#;]{1,32};?) does, left to right, never rescanning a
 * replacement; a name not in the list is replaced by its longest listed
 * prefix of at least 2 characters, or left as it is. */
static void html_unescape(const char *s, size_t len, sbuf_t *b) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        const char *amp = memchr(s + i, '&', len - i);
        size_t stop = amp ? (size_t)(amp - s) : len;
        sb_put(b, s + i, stop - i);
        if (!amp) break;
        i = stop + 1; /* after the '&' */
        if (i < len && u[i] == '#') {
            size_t j = i + 1;
            bool hex = j + 1 < len && (u[j] | 0x20) == 'x' && is_hex(u[j + 1]);
            if (hex) j++;
            if (j >= len || !(hex ? is_hex(u[j]) : (u[j] >= '0' && u[j] <= '9'))) {
                sb_put(b, "&", 1); /* no reference here: the '&' stays */
                continue;
            }
            uint32_t v = 0;
            for (; j < len && (hex ? is_hex(u[j]) : (u[j] >= '0' && u[j] <= '9')); j++) {
                unsigned d = u[j] <= '9' ? u[j] - '0' : (u[j] | 0x20) - 'a' + 10;
                v = v > 0x10FFFF ? v : v * (hex ? 16 : 10) + d; /* saturates above U+10FFFF */
            }
            if (j < len && u[j] == ';') j++;
            put_charref(b, v);
            i = j;
            continue;
        }
        /* a name: up to 32 code points outside \t \n \f space < & # ; */
        size_t off[34], ncp = 0, j = i;
        off[0] = i;
        while (j < len && ncp < 32) {
            uint32_t cp;
            size_t k = utf8_at(u, len, j, &cp);
            if (cp == '\t' || cp == '\n' || cp == '\f' || cp == ' ' || cp == '<' || cp == '&' || cp == '#' ||
                cp == ';')
                break;
            j += k;
            off[++ncp] = j;
        }
        if (ncp == 0) {
            sb_put(b, "&", 1);
            continue;
        }
        if (j < len && u[j] == ';') {
            j++;
            off[++ncp] = j;
        }
        const char *rep = entity_find(s + i, j - i);
        if (rep) {
            sb_put(b, rep, strlen(rep));
        } else {
            size_t x = ncp - 1;
            for (; x >= 2 && !(rep = entity_find(s + i, off[x] - i)); x--) {}
            if (rep && x >= 2) {
                sb_put(b, rep, strlen(rep));
                sb_put(b, s + off[x], j - off[x]);
            } else {
                sb_put(b, "&", 1);
                sb_put(b, s + i, j - i);
            }
        }
        i = j;
    }
}

/* ---- ftfy.fix_text (ftfy 6), the fixers that do not guess -------------------------- */

/* Wan's basic_clean runs ftfy.fix_text before html.unescape. fix_text
 * works line by line (each segment ends after a '\n'); from the first
 * segment holding a '<' on, it unescapes no HTML. Each segment is fixed
 * to a fixed point of: unescape_html, [fix_encoding: not done], the C1
 * controls as Windows-1252, Latin ligatures, character width, curly
 * quotes, line breaks, [surrogates: none in UTF-8], terminal escapes,
 * control characters, [NFC: left to sentencepiece's NFKC]. */

typedef struct {
    uint32_t cp;
    const char *utf8;
} cp_map_t;

static const cp_map_t ftfy_width[] = {
#define FTFY_WIDTH
#include "media/ftfy_tables.inc"
#undef FTFY_WIDTH
};

static const entity_t ftfy_upper[] = {
#define FTFY_UPPER
#include "media/ftfy_tables.inc"
#undef FTFY_UPPER
};

static const uint32_t ftfy_digits[][2] = {
#define FTFY_DIGITS
#include "media/ftfy_tables.inc"
#undef FTFY_DIGITS
};

/* ftfy's LIGATURES: Latin ligatures and digraphs, taken apart. */
static const cp_map_t ftfy_ligatures[] = {
    { 0x0132, "IJ" },          { 0x0133, "ij" },          { 0x0149, "\xCA\xBCn" },     { 0x01C4, "D\xC5\xBD" },
    { 0x01C5, "D\xC5\xBE" },   { 0x01C6, "d\xC5\xBE" },   { 0x01C7, "LJ" },            { 0x01C8, "Lj" },
    { 0x01C9, "lj" },          { 0x01CA, "NJ" },          { 0x01CB, "Nj" },            { 0x01CC, "nj" },
    { 0x01F1, "DZ" },          { 0x01F2, "Dz" },          { 0x01F3, "dz" },            { 0xFB00, "ff" },
    { 0xFB01, "fi" },          { 0xFB02, "fl" },          { 0xFB03, "ffi" },           { 0xFB04, "ffl" },
    { 0xFB05, "\xC5\xBFt" },   { 0xFB06, "st" },
};

/* The replacement of cp in a table sorted by code point, or NULL. */
static const char *cp_map_find(const cp_map_t *m, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m[mid].cp == cp) return m[mid].utf8;
        if (m[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* What \d matches in the stdlib `re` (Unicode category Nd). */
static bool is_nd(uint32_t cp) {
    size_t lo = 0, hi = sizeof ftfy_digits / sizeof ftfy_digits[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < ftfy_digits[mid][0]) hi = mid;
        else if (cp > ftfy_digits[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

static bool is_alnum_ascii(unsigned char c) {
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

/* ftfy's upper-case entity "NAME;" (s[0..n), its ';' included), or NULL. */
static const char *upper_find(const char *s, size_t n) {
    size_t lo = 0, hi = sizeof ftfy_upper / sizeof ftfy_upper[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strncmp(ftfy_upper[mid].name, s, n);
        if (c == 0 && ftfy_upper[mid].name[n] != '\0') c = 1;
        if (c == 0) return ftfy_upper[mid].utf8;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ftfy's unescape_html: each match of &#?[0-9A-Za-z]{1,24}; left to right.
 * A name with its ';' in the HTML5 list (or one of ftfy's upper-case
 * forms) becomes its character; a numeric reference becomes what
 * html.unescape makes of it unless that keeps a ';' (a reference not all
 * digits, or one to ';' itself); anything else stays. */
static void ftfy_unescape(const char *s, size_t len, sbuf_t *b) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        const char *amp = memchr(s + i, '&', len - i);
        size_t at = amp ? (size_t)(amp - s) : len;
        sb_put(b, s + i, at - i);
        if (!amp) break;
        size_t j = at + 1;
        bool num = j < len && u[j] == '#';
        if (num) j++;
        size_t k = j;
        while (k < len && k - j < 25 && is_alnum_ascii(u[k])) k++;
        if (k == j || k - j > 24 || k >= len || u[k] != ';') {
            sb_put(b, "&", 1); /* no match here: the scan goes on after the '&' */
            i = at + 1;
            continue;
        }
        const char *rep = NULL;
        sbuf_t ref = { 0 };
        if (!num) {
            rep = entity_find(s + j, k + 1 - j);
            if (!rep) rep = upper_find(s + j, k + 1 - j);
        } else {
            bool hex = (u[j] | 0x20) == 'x';
            size_t d = j + hex;
            bool all = d < k;
            uint32_t v = 0;
            for (size_t x = d; x < k && all; x++) {
                if (hex ? !is_hex(u[x]) : !(u[x] >= '0' && u[x] <= '9')) all = false;
                unsigned dv = u[x] <= '9' ? u[x] - '0' : (u[x] | 0x20) - 'a' + 10;
                v = v > 0x10FFFF ? v : v * (hex ? 16 : 10) + dv;
            }
            if (all && v != ';') {
                put_charref(&ref, v);
                rep = ref.oom ? NULL : ref.p ? ref.p : "";
            }
        }
        if (ref.oom) b->oom = true;
        if (rep) sb_put(b, rep, strlen(rep));
        else sb_put(b, s + at, k + 1 - at);
        free(ref.p);
        i = k + 1;
    }
}

/* One pass of the character fixers after unescape_html, in ftfy's order. */
static void ftfy_chars(const char *s, size_t len, sbuf_t *b) {
    const unsigned char *u = (const unsigned char *)s;
    sbuf_t t1 = { 0 }, t2 = { 0 };
    /* fix_c1_controls, fix_latin_ligatures, fix_character_width and
     * uncurl_quotes: each maps characters one by one, so one loop applies
     * them in that order (a ligature's letters are uncurled too: 'ŉ'). */
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = utf8_at(u, len, i, &cp);
        if (cp >= 0x80 && cp <= 0x9F) cp = cp1252_80[cp - 0x80];
        const char *rep = cp_map_find(ftfy_ligatures, sizeof ftfy_ligatures / sizeof ftfy_ligatures[0], cp);
        if (!rep) rep = cp_map_find(ftfy_width, sizeof ftfy_width / sizeof ftfy_width[0], cp);
        size_t rn = rep ? strlen(rep) : 0;
        for (size_t r = 0; r < (rep ? rn : 1);) {
            uint32_t c = cp;
            r += rep ? utf8_at((const unsigned char *)rep, rn, r, &c) : 1;
            if (c == 0x02BC || (c >= 0x2018 && c <= 0x201B)) c = '\'';
            else if (c >= 0x201C && c <= 0x201F) c = '"';
            sb_put_cp(&t1, c);
        }
        i += k;
    }
    /* fix_line_breaks */
    const unsigned char *v = (const unsigned char *)(t1.p ? t1.p : "");
    for (size_t i = 0; i < t1.n;) {
        uint32_t cp;
        size_t k = utf8_at(v, t1.n, i, &cp);
        if (cp == '\r' && i + 1 < t1.n && v[i + 1] == '\n') k = 2, cp = '\n';
        if (cp == '\r' || cp == 0x2028 || cp == 0x2029 || cp == 0x85) cp = '\n';
        sb_put_cp(&t2, cp);
        i += k;
    }
    /* remove_terminal_escapes: \033\[(\d|;)*[a-zA-Z]; remove_control_chars */
    const unsigned char *w = (const unsigned char *)(t2.p ? t2.p : "");
    for (size_t i = 0; i < t2.n;) {
        uint32_t cp;
        size_t k = utf8_at(w, t2.n, i, &cp);
        if (cp == 0x1B && i + 1 < t2.n && w[i + 1] == '[') {
            size_t j = i + 2;
            uint32_t c2 = 0;
            size_t k2 = 0;
            while (j < t2.n && (k2 = utf8_at(w, t2.n, j, &c2)) && (c2 == ';' || is_nd(c2))) j += k2;
            if (j < t2.n && ((w[j] | 0x20) >= 'a' && (w[j] | 0x20) <= 'z')) {
                i = j + 1;
                continue;
            }
        }
        bool control = cp <= 0x08 || cp == 0x0B || (cp >= 0x0E && cp <= 0x1F) || cp == 0x7F ||
                       (cp >= 0x206A && cp <= 0x206F) || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFC);
        if (!control) sb_put(b, w + i, k);
        i += k;
    }
    if (t1.oom || t2.oom) b->oom = true;
    free(t1.p);
    free(t2.p);
}

#define FTFY_MAX_PASSES 64 /* a fixed point comes in a few; the bound is for safety (ftfy has none:
                              * a reference escaped more than 64 times deep differs) */

/* ftfy.fix_text's deterministic part of valid UTF-8 s[0..len) into b. */
static void ftfy_fix(const char *s, size_t len, sbuf_t *b) {
    bool unescape = true;
    size_t pos = 0;
    while (pos < len && !b->oom) {
        const char *nl = memchr(s + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - s) + 1 : len;
        if (memchr(s + pos, '<', end - pos)) unescape = false; /* and stays off */
        sbuf_t cur = { 0 };
        sb_put(&cur, s + pos, end - pos);
        bool oom = cur.oom;
        for (int pass = 0; pass < FTFY_MAX_PASSES && !oom; pass++) {
            sbuf_t un = { 0 }, next = { 0 };
            const char *c = cur.p ? cur.p : ""; /* an empty buffer has no storage */
            if (unescape) ftfy_unescape(c, cur.n, &un);
            else sb_put(&un, c, cur.n);
            if (!un.oom) ftfy_chars(un.p ? un.p : "", un.n, &next);
            oom = un.oom || next.oom;
            free(un.p);
            bool same = !oom && next.n == cur.n && !memcmp(next.p ? next.p : "", c, cur.n);
            free(cur.p);
            cur = next;
            if (same) break;
        }
        if (oom) b->oom = true;
        else sb_put(b, cur.p ? cur.p : "", cur.n);
        free(cur.p);
        pos = end;
    }
}

/* ---- whitespace --------------------------------------------------------------------- */

/* What the `regex` module's \s matches in a str pattern (Wan's
 * tokenizers.py imports regex as re): Unicode White_Space. */
static bool is_regex_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* What Python's str.strip() removes (str.isspace): the same plus the
 * information separators U+001C..U+001F. */
static bool is_py_space(uint32_t c) { return is_regex_space(c) || (c >= 0x1C && c <= 0x1F); }

/* s[*a..*z) without Python-whitespace at either end. */
static void py_strip(const unsigned char *s, size_t *a, size_t *z) {
    uint32_t cp;
    while (*a < *z) {
        size_t k = utf8_at(s, *z, *a, &cp);
        if (!is_py_space(cp)) break;
        *a += k;
    }
    while (*z > *a) {
        size_t j = *z - 1;
        while (j > *a && (s[j] & 0xC0) == 0x80) j--;
        utf8_at(s, *z, j, &cp);
        if (!is_py_space(cp)) break;
        *z = j;
    }
}

/* The whole of Wan's cleaning into a malloc'd NUL-terminated string (*n
 * bytes); NULL with the error value set. */
static char *clean_alloc(const char *text, size_t *n) {
    size_t len = strlen(text);
    const unsigned char *u = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = utf8_at(u, len, i, &cp);
        if (!k) {
            reel_fail(REEL_E_INVALID, "prompt is not UTF-8 (a bad byte sequence at byte %zu)", i);
            return NULL;
        }
        i += k;
    }
    sbuf_t fixed = { 0 }, once = { 0 }, twice = { 0 }, out = { 0 };
    ftfy_fix(text, len, &fixed); /* ftfy.fix_text(text) */
    if (!fixed.oom) html_unescape(fixed.p ? fixed.p : "", fixed.n, &once); /* html.unescape(html.unescape(text)) */
    else once.oom = true;
    free(fixed.p);
    if (!once.oom) html_unescape(once.p ? once.p : "", once.n, &twice);
    free(once.p);
    if (!twice.oom) {
        const unsigned char *t = (const unsigned char *)(twice.p ? twice.p : "");
        size_t a = 0, z = twice.n;
        py_strip(t, &a, &z); /* basic_clean's strip */
        bool in_space = false;
        for (size_t i = a; i < z;) { /* re.sub(r'\s+', ' ', text) */
            uint32_t cp;
            size_t k = utf8_at(t, z, i, &cp);
            if (is_regex_space(cp)) {
                if (!in_space) sb_put(&out, " ", 1);
                in_space = true;
            } else {
                sb_put(&out, t + i, k);
                in_space = false;
            }
            i += k;
        }
        sb_put(&out, "", 0);
    }
    bool oom = twice.oom || out.oom;
    free(twice.p);
    if (oom) {
        free(out.p);
        reel_fail(REEL_E_NOMEM, "out of memory cleaning a prompt of %zu bytes", len);
        return NULL;
    }
    size_t a = 0, z = out.n; /* whitespace_clean's strip */
    py_strip((const unsigned char *)out.p, &a, &z);
    memmove(out.p, out.p + a, z - a);
    out.p[z - a] = '\0';
    *n = z - a;
    return out.p;
}

int tok_clean(const char *text, char *out, size_t cap) {
    if (strlen(text) > TOK_MAX_PROMPT_BYTES)
        return reel_fail(REEL_E_LIMIT, "prompt of %zu bytes is over the %d-byte limit", strlen(text),
                         TOK_MAX_PROMPT_BYTES);
    size_t n;
    char *c = clean_alloc(text, &n);
    if (!c) return -1;
    if (n + 1 > cap) {
        free(c);
        return reel_fail(REEL_E_LIMIT, "cleaned prompt of %zu bytes does not fit in %zu", n, cap);
    }
    memcpy(out, c, n + 1);
    free(c);
    return 0;
}

/* ---- the tokenizer ------------------------------------------------------------------ */

#ifdef REEL_NO_MEDIA

#define NO_MEDIA "built without media support (REEL_NO_MEDIA): no tokenizer"

tok_t *tok_open(const char *path) {
    (void)path;
    reel_fail(REEL_E_UNSUPPORTED, NO_MEDIA);
    return NULL;
}
void tok_close(tok_t **t) {
    if (t) *t = NULL;
}
int tok_vocab_size(const tok_t *t) { return (void)t, 0; }
int tok_eos_id(const tok_t *t) { return (void)t, -1; }
int tok_pad_id(const tok_t *t) { return (void)t, -1; }
const char *tok_identity(const tok_t *t) { return (void)t, ""; }
int tok_encode(const tok_t *t, const char *text, int max_len, int32_t *ids, int cap) {
    (void)t, (void)text, (void)max_len, (void)ids, (void)cap;
    return reel_fail(REEL_E_UNSUPPORTED, NO_MEDIA);
}

#else

struct tok {
    spm_shim_t *spm;
    char identity[8 + 65]; /* "sha256:" + hex */
};

tok_t *tok_open(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        reel_fail_errno(REEL_E_NOT_FOUND, errno, "tokenizer %s: cannot open", path);
        return NULL;
    }
    char *file = NULL;
    if (S_ISDIR(st.st_mode)) {
        if (asprintf(&file, "%s/spiece.model", path) < 0) {
            reel_fail(REEL_E_NOMEM, "out of memory");
            return NULL;
        }
        if (stat(file, &st) != 0) {
            free(file);
            char json[4096];
            bool has_json = snprintf(json, sizeof json, "%s/tokenizer.json", path) < (int)sizeof json &&
                            stat(json, &st) == 0;
            reel_fail(REEL_E_NOT_FOUND, "tokenizer %s: a folder without spiece.model%s%s%s", path,
                      has_json ? " (it holds tokenizer.json: " : "", has_json ? TOK_JSON_HINT : "",
                      has_json ? ")" : "");
            return NULL;
        }
    } else if (strlen(path) >= 5 && !strcmp(path + strlen(path) - 5, ".json")) {
        reel_fail(REEL_E_INVALID, "tokenizer %s: a JSON file, not a SentencePiece model: " TOK_JSON_HINT, path);
        return NULL;
    } else if (!(file = strdup(path))) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    char hex[65];
    tok_t *t = calloc(1, sizeof *t);
    if (!t) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto err;
    }
    if (!(t->spm = spm_shim_load(file))) goto err;
    if (spm_shim_eos_id(t->spm) < 0) {
        reel_fail(REEL_E_UNSUPPORTED, "tokenizer model %s has no end-of-sequence piece (T5 needs one)", file);
        goto err;
    }
    if (reel_sha256_file(file, hex)) goto err;
    snprintf(t->identity, sizeof t->identity, "sha256:%s", hex);
    free(file);
    return t;
err:
    free(file);
    tok_close(&t);
    return NULL;
}

void tok_close(tok_t **t) {
    if (!t || !*t) return;
    spm_shim_free(&(*t)->spm);
    free(*t);
    *t = NULL;
}

int tok_vocab_size(const tok_t *t) { return spm_shim_vocab_size(t->spm); }
int tok_eos_id(const tok_t *t) { return spm_shim_eos_id(t->spm); }
int tok_pad_id(const tok_t *t) { return spm_shim_pad_id(t->spm); }
const char *tok_identity(const tok_t *t) { return t->identity; }

int tok_encode(const tok_t *t, const char *text, int max_len, int32_t *ids, int cap) {
    if (max_len < 1) return reel_fail(REEL_E_INVALID, "max_len %d: at least 1 (the end-of-sequence id)", max_len);
    size_t len = strlen(text);
    if (len > TOK_MAX_PROMPT_BYTES)
        return reel_fail(REEL_E_LIMIT, "prompt of %zu bytes is over the %d-byte limit", len, TOK_MAX_PROMPT_BYTES);
    size_t n;
    char *c = clean_alloc(text, &n);
    if (!c) return -1;
    int32_t *v = NULL;
    size_t nv = 0;
    int rc = spm_shim_encode(t->spm, c, n, &v, &nv);
    free(c);
    if (rc) return -1;
    /* what the Hugging Face tokenizer gives with truncation: the pieces cut
     * to max_len - 1, then the end-of-sequence id */
    size_t keep = nv < (size_t)max_len - 1 ? nv : (size_t)max_len - 1;
    if (keep + 1 > (size_t)(cap > 0 ? cap : 0)) {
        free(v);
        return reel_fail(REEL_E_LIMIT, "%zu token ids do not fit in %d", keep + 1, cap);
    }
    if (keep) memcpy(ids, v, keep * sizeof *ids);
    ids[keep] = spm_shim_eos_id(t->spm);
    free(v);
    return (int)keep + 1;
}

#endif
