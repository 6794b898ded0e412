/* wire_buf.c -- the msgpack writer of Reel headers (see wire_codec.h).
 *
 * Every value is written in its shortest msgpack form. A container is
 * opened with a 5-byte placeholder header; the writer counts what goes in
 * and, on close, writes the real count in the shortest form and moves the
 * body up behind it, so callers never count entries by hand. Strings that
 * are not valid UTF-8 are written with each bad byte replaced by U+FFFD
 * (cut to WIRE_MAX_STR bytes): a header Reel sends is always readable by a
 * strict decoder, whatever bytes a peer sent that it echoes. */
#include "schema/wire_codec.h"

#include <stdlib.h>
#include <string.h>

void wire_buf_init(wire_buf_t *w) {
    w->p = w->inl;
    w->n = 0;
    w->cap = sizeof w->inl;
    w->failed = false;
    w->too_deep = false;
    w->depth = 0;
}

void wire_buf_free(wire_buf_t *w) {
    if (w->p != w->inl) free(w->p);
    wire_buf_init(w);
}

/* Room for k more bytes: a pointer to them, or NULL (failed set). */
static unsigned char *room(wire_buf_t *w, size_t k) {
    if (w->failed) return NULL;
    if (w->n + k > w->cap) {
        size_t cap = w->cap * 2 > w->n + k ? w->cap * 2 : w->n + k;
        unsigned char *p = w->p == w->inl ? malloc(cap) : realloc(w->p, cap);
        if (!p) {
            w->failed = true;
            return NULL;
        }
        if (w->p == w->inl) memcpy(p, w->inl, w->n);
        w->p = p;
        w->cap = cap;
    }
    unsigned char *at = w->p + w->n;
    w->n += k;
    return at;
}

/* One more value in the innermost open container. */
static void counted(wire_buf_t *w) {
    if (w->depth > 0) w->items[w->depth - 1]++;
}

static void put_be(unsigned char *at, uint64_t x, size_t n) {
    for (size_t i = 0; i < n; i++) at[i] = (unsigned char)(x >> (8 * (n - 1 - i)));
}

/* A type byte followed by an n-byte big-endian x. */
static void put_tagged(wire_buf_t *w, unsigned char tag, uint64_t x, size_t n) {
    unsigned char *at = room(w, 1 + n);
    if (!at) return;
    at[0] = tag;
    put_be(at + 1, x, n);
}

void wire_put_nil(wire_buf_t *w) {
    counted(w);
    put_tagged(w, 0xc0, 0, 0);
}

void wire_put_bool(wire_buf_t *w, bool b) {
    counted(w);
    put_tagged(w, b ? 0xc3 : 0xc2, 0, 0);
}

void wire_put_u64(wire_buf_t *w, uint64_t x) {
    counted(w);
    if (x <= 0x7f) put_tagged(w, (unsigned char)x, 0, 0);
    else if (x <= 0xff) put_tagged(w, 0xcc, x, 1);
    else if (x <= 0xffff) put_tagged(w, 0xcd, x, 2);
    else if (x <= 0xffffffffu) put_tagged(w, 0xce, x, 4);
    else put_tagged(w, 0xcf, x, 8);
}

void wire_put_i64(wire_buf_t *w, int64_t x) {
    if (x >= 0) {
        wire_put_u64(w, (uint64_t)x);
        return;
    }
    counted(w);
    if (x >= -32) put_tagged(w, (unsigned char)(int8_t)x, 0, 0);
    else if (x >= INT8_MIN) put_tagged(w, 0xd0, (uint64_t)x, 1);
    else if (x >= INT16_MIN) put_tagged(w, 0xd1, (uint64_t)x, 2);
    else if (x >= INT32_MIN) put_tagged(w, 0xd2, (uint64_t)x, 4);
    else put_tagged(w, 0xd3, (uint64_t)x, 8);
}

void wire_put_f64(wire_buf_t *w, double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    counted(w);
    put_tagged(w, 0xcb, bits, 8);
}

/* The length of the valid UTF-8 sequence at s[0..n), or 0 when the bytes
 * there are not one (overlong forms, surrogates and code points past
 * U+10FFFF included). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!len || len > n) return 0;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (c == 0xe0) lo = 0xa0;
    else if (c == 0xed) hi = 0x9f;
    else if (c == 0xf0) lo = 0x90;
    else if (c == 0xf4) hi = 0x8f;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

bool wire_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        /* ASCII eight bytes at a time: nearly every key and value is */
        uint64_t x;
        if (n - i >= 8 && (memcpy(&x, u + i, 8), !(x & 0x8080808080808080ull))) {
            i += 8;
            continue;
        }
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(u + i, n - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

static void put_str_header(wire_buf_t *w, size_t n) {
    if (n <= 31) put_tagged(w, (unsigned char)(0xa0 | n), 0, 0);
    else if (n <= 0xff) put_tagged(w, 0xd9, n, 1);
    else if (n <= 0xffff) put_tagged(w, 0xda, n, 2);
    else put_tagged(w, 0xdb, n, 4);
}

/* Writes s with every invalid byte as U+FFFD, at most max bytes, cut
 * between characters. */
static void put_repaired(wire_buf_t *w, const unsigned char *s, size_t n, size_t max) {
    static const unsigned char fffd[3] = { 0xef, 0xbf, 0xbd };
    size_t out = 0;
    for (size_t i = 0; i < n;) { /* the length first: the header precedes the bytes */
        size_t k = utf8_seq(s + i, n - i), add = k ? k : 3;
        if (out + add > max) break;
        out += add;
        i += k ? k : 1;
    }
    put_str_header(w, out);
    unsigned char *at = room(w, out);
    if (!at) return;
    for (size_t i = 0, o = 0; o < out;) {
        size_t k = utf8_seq(s + i, n - i);
        if (k) memcpy(at + o, s + i, k);
        else memcpy(at + o, fffd, 3);
        o += k ? k : 3;
        i += k ? k : 1;
    }
}

void wire_put_text(wire_buf_t *w, const char *s, size_t n, size_t max) {
    if (n <= max && wire_utf8_valid(s, n)) {
        wire_put_strn(w, s, n);
        return;
    }
    counted(w);
    put_repaired(w, (const unsigned char *)s, n, max < WIRE_MAX_STR ? max : WIRE_MAX_STR);
}

void wire_put_strn(wire_buf_t *w, const char *s, size_t n) {
    counted(w);
    if (!wire_utf8_valid(s, n)) {
        put_repaired(w, (const unsigned char *)s, n, WIRE_MAX_STR);
        return;
    }
    put_str_header(w, n);
    unsigned char *at = room(w, n);
    if (at && n) memcpy(at, s, n);
}

void wire_put_str(wire_buf_t *w, const char *s) { wire_put_strn(w, s ? s : "", s ? strlen(s) : 0); }

static void open_container(wire_buf_t *w, bool map) {
    counted(w);
    if (w->depth >= WIRE_MAX_DEPTH) {
        w->failed = w->too_deep = true; /* no receiver would accept it */
        return;
    }
    size_t at = w->n;
    if (!room(w, 5)) return;
    w->at[w->depth] = at;
    w->items[w->depth] = 0;
    w->map[w->depth] = map;
    w->depth++;
}

void wire_put_map(wire_buf_t *w) { open_container(w, true); }
void wire_put_arr(wire_buf_t *w) { open_container(w, false); }

void wire_put_raw(wire_buf_t *w, const void *p, size_t n, uint32_t values) {
    if (w->depth > 0) w->items[w->depth - 1] += values;
    unsigned char *at = room(w, n);
    if (at && n) memcpy(at, p, n);
}

void wire_put_end(wire_buf_t *w) {
    if (w->depth == 0) {
        w->failed = true;
        return;
    }
    int d = --w->depth;
    if (w->failed) return;
    bool map = w->map[d];
    uint32_t count = w->items[d];
    if (map && count % 2) {
        w->failed = true; /* a key without its value */
        return;
    }
    if (map) count /= 2;
    size_t at = w->at[d], body = at + 5, len = w->n - body, hl;
    unsigned char *h = w->p + at;
    if (count <= 15) {
        h[0] = (unsigned char)((map ? 0x80 : 0x90) | count);
        hl = 1;
    } else if (count <= 0xffff) {
        h[0] = map ? 0xde : 0xdc;
        put_be(h + 1, count, 2);
        hl = 3;
    } else {
        h[0] = map ? 0xdf : 0xdd;
        put_be(h + 1, count, 4);
        hl = 5;
    }
    if (hl < 5) memmove(h + hl, w->p + body, len);
    w->n -= 5 - hl;
}

void wire_put_tree(wire_buf_t *w, const wire_val_t *v) {
    switch (v->kind) {
    case WV_NIL: wire_put_nil(w); break;
    case WV_BOOL: wire_put_bool(w, v->as.b); break;
    case WV_INT: wire_put_i64(w, v->as.i); break;
    case WV_UINT: wire_put_u64(w, v->as.u); break;
    case WV_F64: wire_put_f64(w, v->as.f); break;
    case WV_STR: wire_put_strn(w, v->as.str.s, v->as.str.len); break;
    case WV_ARR:
    case WV_MAP:
        open_container(w, v->kind == WV_MAP);
        for (size_t i = 0; i < v->as.c.n && !w->failed; i++) {
            if (v->kind == WV_MAP) wire_put_str(w, v->as.c.k[i]);
            wire_put_tree(w, v->as.c.v[i]);
        }
        wire_put_end(w);
        break;
    }
}

void wire_put_tensors(wire_buf_t *w, const wire_tensor_t *const *t, int n) {
    wire_put_str(w, "tensors");
    wire_put_arr(w);
    for (int i = 0; i < n; i++) {
        wire_put_map(w);
        wire_put_str(w, "name");
        wire_put_str(w, t[i]->name);
        wire_put_str(w, "dtype");
        wire_put_str(w, wire_dtype_name(t[i]->dtype));
        wire_put_str(w, "shape");
        wire_put_arr(w);
        for (int k = 0; k < t[i]->ndim; k++) wire_put_u64(w, (uint64_t)t[i]->shape[k]);
        wire_put_end(w);
        wire_put_str(w, "bytes");
        wire_put_u64(w, t[i]->bytes);
        wire_put_end(w);
    }
    wire_put_end(w);
}

void wire_put_envelope(wire_buf_t *w, const char *type, uint64_t id, const wire_tensor_t *const *t,
                       int n) {
    wire_put_map(w);
    wire_put_str(w, "type");
    wire_put_str(w, type);
    wire_put_str(w, "id");
    wire_put_u64(w, id);
    wire_put_str(w, "proto");
    wire_put_str(w, WIRE_PROTO);
    wire_put_tensors(w, t, n);
}

unsigned char *wire_encode_header(const wire_val_t *hdr, size_t *len) {
    if (!hdr || !len) return NULL;
    wire_buf_t w;
    wire_buf_init(&w);
    wire_put_tree(&w, hdr);
    unsigned char *out = w.failed ? NULL : malloc(w.n ? w.n : 1);
    if (out) {
        memcpy(out, w.p, w.n);
        *len = w.n;
    }
    wire_buf_free(&w);
    return out;
}
