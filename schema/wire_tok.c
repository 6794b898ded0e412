/* wire_tok.c -- the bounded msgpack decoder of Reel headers (see
 * wire_codec.h). msgpack_unpack is never used on untrusted bytes: it
 * allocates count x 24 bytes for an array or map header before looking at
 * the bytes behind it (5 bytes can ask for ~96 GB) and reports deep nesting
 * as NOMEM. This parser checks every count, length and depth against the
 * limits and against the bytes actually left *before* it stores anything,
 * and stores tokens in one growing array: no allocation per value.
 *
 * Decoding decisions (documented for other implementations):
 *   - bin8/16/32, ext and the never-used 0xc1 are malformed: the protocol
 *     carries bytes only as tensor frames, never inside msgpack.
 *   - float32 widens exactly to a double; we always encode float64.
 *   - every non-negative integer decodes as WV_UINT and every negative one
 *     as WV_INT, whatever format carried it.
 *   - map keys must be strings without NUL bytes; duplicate keys are
 *     malformed at any level. String values may hold any bytes.
 *   - the root must be a map, with no bytes after it. */
#include "schema/wire_codec.h"

#include <stdlib.h>
#include <string.h>

#define BAD_TOK UINT32_MAX
#define PAIRWISE_KEYS 16 /* maps up to this size check keys pairwise */
#define STACK_KEYS 64    /* larger maps sort their keys in a stack buffer up to this size */
/* The one byte MessagePack never uses, wherever it stands. */
#define NOT_MSGPACK "header is not MessagePack: byte 0xc1 (never used by MessagePack) at offset %zu"

typedef struct {
    const char *s;
    uint32_t n;
} wkey_t;

typedef struct {
    const unsigned char *base, *p, *end;
    wire_toks_t *t;
    wire_err_t *err;
    uint64_t *id;
    char *type;        /* the root's "type" as read (type_cap bytes), or NULL */
    size_t type_cap;
    wkey_t *keys;      /* scratch for large maps, grown once per header */
    size_t keys_cap;
    wire_tok_t *v;     /* t's token array (inline or heap), and its capacity */
    uint32_t cap;
    uint32_t start;    /* where the value being read starts (its token's `at`) */
} tk_t;

static size_t left(const tk_t *d) { return (size_t)(d->end - d->p); }

static wire_tok_t *toks(wire_toks_t *t) { return t->heap ? t->heap : t->inl; }

void wire_toks_free(wire_toks_t *t) {
    free(t->heap);
    t->heap = NULL;
    t->n = 0;
    t->cap = 0;
}

/* Doubles the token array (moving it to the heap). false on out-of-memory. */
static __attribute__((noinline)) bool grow(tk_t *d) {
    wire_toks_t *t = d->t;
    uint32_t ncap = d->cap * 2;
    wire_tok_t *v = t->heap ? realloc(t->heap, ncap * sizeof *v) : malloc(ncap * sizeof *v);
    if (!v) {
        wire_set_err(d->err, WIRE_E_INTERNAL, "out of memory decoding header");
        return false;
    }
    if (!t->heap) memcpy(v, t->inl, sizeof t->inl);
    t->heap = d->v = v;
    t->cap = d->cap = ncap;
    return true;
}

/* Appends a token; its index, or BAD_TOK on out-of-memory. */
static inline uint32_t push(tk_t *d, wire_kind_t kind, uint32_t n) {
    wire_toks_t *t = d->t;
    if (t->n == d->cap && !grow(d)) return BAD_TOK;
    wire_tok_t *k = &d->v[t->n];
    k->kind = kind;
    k->n = n;
    k->next = t->n + 1;
    k->at = d->start;
    k->v.u = 0;
    return t->n++;
}

/* Reads an n-byte big-endian unsigned integer. false (err set) if
 * truncated. */
static bool be(tk_t *d, size_t n, uint64_t *out) {
    if (left(d) < n) {
        wire_set_err(d->err, WIRE_E_MALFORMED, "truncated header");
        return false;
    }
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) x = x << 8 | d->p[i];
    d->p += n;
    *out = x;
    return true;
}

/* A string body of len bytes at d->p (its header already read). */
static uint32_t tk_str(tk_t *d, uint64_t len) {
    if (len > WIRE_MAX_STR) {
        wire_set_err(d->err, WIRE_E_TOO_LARGE, "string of %llu bytes (max %d)",
                     (unsigned long long)len, WIRE_MAX_STR);
        return BAD_TOK;
    }
    if (len > left(d)) {
        wire_set_err(d->err, WIRE_E_MALFORMED, "truncated string");
        return BAD_TOK;
    }
    uint32_t i = push(d, WV_STR, (uint32_t)len);
    if (i == BAD_TOK) return i;
    d->v[i].v.off = (uint32_t)(d->p - d->base);
    d->p += len;
    return i;
}

static int cmp_keys(const void *a, const void *b) {
    const wkey_t *x = a, *y = b;
    int c = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static bool same_key(const wkey_t *a, const wkey_t *b) {
    /* most keys differ in length or first byte: no call for those */
    return a->n == b->n && (a->n == 0 || (a->s[0] == b->s[0] && !memcmp(a->s, b->s, a->n)));
}

/* True when the keys of map token m are distinct: for small maps a bit
 * per key, compared pairwise only where bits meet; sorted (O(n log n)) for
 * large ones, so a 4096-entry map cannot be turned into a quadratic CPU
 * cost. -1 on out-of-memory. */
static int keys_distinct(tk_t *d, uint32_t m) {
    const wire_tok_t *v = d->v;
    uint32_t n = v[m].n;
    if (n < 2) return 1;
    wkey_t small[STACK_KEYS], *k = small;
    if (n > STACK_KEYS) {
        if (d->keys_cap < n) {
            wkey_t *nk = realloc(d->keys, n * sizeof *nk);
            if (!nk) return -1;
            d->keys = nk;
            d->keys_cap = n;
        }
        k = d->keys;
    }
    for (uint32_t i = 0, at = m + 1; i < n; i++, at = v[at + 1].next) {
        k[i].s = (const char *)d->base + v[at].v.off;
        k[i].n = v[at].n;
    }
    if (n <= PAIRWISE_KEYS) {
        /* Each key marks a bit for its length and first and last bytes:
         * only a key whose bit is already set is compared with the keys
         * before it (a header's keys rarely share one). */
        uint64_t seen[4] = { 0, 0, 0, 0 };
        for (uint32_t i = 0; i < n; i++) {
            unsigned b = k[i].n ? (k[i].n * 37u + (unsigned char)k[i].s[0] * 5u +
                                   (unsigned char)k[i].s[k[i].n - 1]) & 255u
                                : 0u;
            uint64_t bit = (uint64_t)1 << (b & 63u);
            if (seen[b >> 6] & bit)
                for (uint32_t j = 0; j < i; j++)
                    if (same_key(&k[i], &k[j])) return 0;
            seen[b >> 6] |= bit;
        }
        return 1;
    }
    qsort(k, n, sizeof *k, cmp_keys);
    for (uint32_t i = 1; i < n; i++)
        if (same_key(&k[i - 1], &k[i])) return 0;
    return 1;
}

static uint32_t tk_val(tk_t *d, int depth);

/* Whether the 8 bytes of x hold a zero byte. */
static inline bool zero_byte(uint64_t x) { return ((x - 0x0101010101010101ull) & ~x & 0x8080808080808080ull) != 0; }

/* Whether s[0..n) holds a NUL byte, where s + room is the end of the
 * header: eight bytes at a time (keys are short: no call). A tail shorter
 * than eight is read as eight when the header goes on that far, the bytes
 * past it set to 0xff. */
static bool has_nul(const unsigned char *s, uint32_t n, size_t room) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, s + i, 8);
        if (zero_byte(x)) return true;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (i < n && room - i >= 8) {
        uint64_t x;
        memcpy(&x, s + i, 8);
        return zero_byte(x | ~(uint64_t)0 << (8 * (n - i))); /* (n - i < 8: the shift is defined) */
    }
#endif
    for (; i < n; i++)
        if (!s[i]) return true;
    return false;
}

/* A map key: a string without NUL bytes (peeked first, so a container
 * posing as a key is never parsed). */
static uint32_t tk_key(tk_t *d, int depth) {
    unsigned char kb = left(d) ? *d->p : 0xc0;
    if ((kb & 0xe0) != 0xa0 && (kb < 0xd9 || kb > 0xdb)) {
        wire_set_err(d->err, WIRE_E_MALFORMED, "map key is not a string");
        return BAD_TOK;
    }
    uint32_t k = tk_val(d, depth);
    if (k == BAD_TOK) return k;
    const wire_tok_t *t = &d->v[k];
    if (has_nul(d->base + t->v.off, t->n, (size_t)(d->end - (d->base + t->v.off)))) {
        wire_set_err(d->err, WIRE_E_MALFORMED, "map key holds a NUL byte");
        return BAD_TOK;
    }
    return k;
}

/* A container of `count` entries whose header was just read. The count is
 * checked against the limit and against the bytes left (an element needs at
 * least one byte, a map entry two) before anything is stored. */
static uint32_t tk_container(tk_t *d, bool is_map, uint64_t count, int depth) {
    if (depth + 1 > WIRE_MAX_DEPTH) {
        wire_set_err(d->err, WIRE_E_TOO_LARGE, "nesting deeper than %d", WIRE_MAX_DEPTH);
        return BAD_TOK;
    }
    if (count > WIRE_MAX_ITEMS) {
        wire_set_err(d->err, WIRE_E_TOO_LARGE, "%s of %llu entries (max %d)", is_map ? "map" : "array",
                     (unsigned long long)count, WIRE_MAX_ITEMS);
        return BAD_TOK;
    }
    if (count * (is_map ? 2 : 1) > left(d)) {
        wire_set_err(d->err, WIRE_E_MALFORMED, "%s of %llu entries in %zu bytes",
                     is_map ? "map" : "array", (unsigned long long)count, left(d));
        return BAD_TOK;
    }
    uint32_t c = push(d, is_map ? WV_MAP : WV_ARR, (uint32_t)count);
    if (c == BAD_TOK) return c;
    for (uint64_t i = 0; i < count; i++) {
        uint32_t k = is_map ? tk_key(d, depth + 1) : 0;
        if (k == BAD_TOK) return k;
        uint32_t v = tk_val(d, depth + 1);
        if (v == BAD_TOK) return v;
        /* The root's id and type, as soon as they are read: a message
         * refused for what comes after them is still answered under its
         * id, and told apart by its type (a worker's unreadable RESULT
         * still ends its request). */
        const wire_tok_t *vt = &d->v[v];
        if (is_map && depth == 0 && d->id && vt->kind == WV_UINT) {
            const wire_tok_t *kt = &d->v[k];
            if (kt->n == 2 && d->base[kt->v.off] == 'i' && d->base[kt->v.off + 1] == 'd') *d->id = vt->v.u;
        }
        if (is_map && depth == 0 && d->type && vt->kind == WV_STR) {
            const wire_tok_t *kt = &d->v[k];
            const char *s = (const char *)d->base + vt->v.off;
            if (kt->n == 4 && !memcmp(d->base + kt->v.off, "type", 4) && !memchr(s, '\0', vt->n)) {
                size_t n = vt->n < d->type_cap ? vt->n : d->type_cap - 1;
                memcpy(d->type, s, n);
                d->type[n] = '\0';
            }
        }
    }
    d->v[c].next = d->t->n;
    if (is_map) {
        int r = keys_distinct(d, c);
        if (r <= 0) {
            if (r < 0) wire_set_err(d->err, WIRE_E_INTERNAL, "out of memory decoding header");
            else wire_set_err(d->err, WIRE_E_MALFORMED, "duplicate map key");
            return BAD_TOK;
        }
    }
    return c;
}

/* A scalar token holding x. */
static uint32_t tk_scalar(tk_t *d, wire_kind_t kind, uint64_t bits) {
    uint32_t i = push(d, kind, 0);
    if (i != BAD_TOK) d->v[i].v.u = bits;
    return i;
}

static uint32_t tk_int(tk_t *d, int64_t x) {
    return x >= 0 ? tk_scalar(d, WV_UINT, (uint64_t)x) : tk_scalar(d, WV_INT, (uint64_t)x);
}

static uint32_t tk_double(tk_t *d, double f) {
    uint64_t bits;
    memcpy(&bits, &f, sizeof bits);
    return tk_scalar(d, WV_F64, bits);
}

/* One value; `depth` containers enclose it. BAD_TOK with d->err set. */
static uint32_t tk_val(tk_t *d, int depth) {
    uint64_t x;
    if (!left(d)) {
        wire_set_err(d->err, WIRE_E_MALFORMED, "truncated header");
        return BAD_TOK;
    }
    d->start = (uint32_t)(d->p - d->base); /* pushed with the token, before any inner value */
    unsigned char b = *d->p++;
    if ((b & 0xf0) == 0x80) return tk_container(d, true, b & 0x0f, depth);
    if ((b & 0xf0) == 0x90) return tk_container(d, false, b & 0x0f, depth);
    if ((b & 0xe0) == 0xa0) return tk_str(d, b & 0x1f);
    if (b <= 0x7f) return tk_scalar(d, WV_UINT, b);
    if (b >= 0xe0) return tk_int(d, (int8_t)b);
    switch (b) {
    case 0xc0: return tk_scalar(d, WV_NIL, 0);
    case 0xc2: return tk_scalar(d, WV_BOOL, 0);
    case 0xc3: return tk_scalar(d, WV_BOOL, 1);
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        if (!be(d, (size_t)1 << (b - 0xcc), &x)) return BAD_TOK;
        return tk_scalar(d, WV_UINT, x);
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        size_t n = (size_t)1 << (b - 0xd0);
        if (!be(d, n, &x)) return BAD_TOK;
        if (n < 8 && (x >> (8 * n - 1)) & 1) x |= ~(uint64_t)0 << (8 * n); /* sign-extend */
        return tk_int(d, (int64_t)x);
    }
    case 0xca: {
        if (!be(d, 4, &x)) return BAD_TOK;
        uint32_t u = (uint32_t)x;
        float f;
        memcpy(&f, &u, sizeof f);
        return tk_double(d, (double)f);
    }
    case 0xcb: {
        if (!be(d, 8, &x)) return BAD_TOK;
        double f;
        memcpy(&f, &x, sizeof f);
        return tk_double(d, f);
    }
    case 0xd9: case 0xda: case 0xdb:
        if (!be(d, (size_t)1 << (b - 0xd9), &x)) return BAD_TOK;
        return tk_str(d, x);
    case 0xdc: case 0xdd:
        if (!be(d, b == 0xdc ? 2 : 4, &x)) return BAD_TOK;
        return tk_container(d, false, x, depth);
    case 0xde: case 0xdf:
        if (!be(d, b == 0xde ? 2 : 4, &x)) return BAD_TOK;
        return tk_container(d, true, x, depth);
    case 0xc4: case 0xc5: case 0xc6:
        wire_set_err(d->err, WIRE_E_MALFORMED, "bin values are not allowed in a header");
        return BAD_TOK;
    case 0xc1:
        wire_set_err(d->err, WIRE_E_MALFORMED, NOT_MSGPACK, (size_t)(d->p - 1 - d->base));
        return BAD_TOK;
    default: /* ext 0xc7-0xc9 and fixext 0xd4-0xd8 */
        wire_set_err(d->err, WIRE_E_MALFORMED, "ext values (type 0x%02x) are not allowed in a header", b);
        return BAD_TOK;
    }
}

int wire_tokenize(const void *buf, size_t len, wire_toks_t *t, uint64_t *id, char *type, size_t type_cap,
                  wire_err_t *err) {
    t->n = 0;
    if (len > WIRE_MAX_HEADER) {
        wire_set_err(err, WIRE_E_TOO_LARGE, "header of %zu bytes (max %d)", len, WIRE_MAX_HEADER);
        return -1;
    }
    const unsigned char *p = buf;
    if (!len || !p) {
        wire_set_err(err, WIRE_E_MALFORMED, "empty header");
        return -1;
    }
    if (p[0] == 0xc1) { /* no MessagePack value starts so: not "a value other than a map" */
        wire_set_err(err, WIRE_E_MALFORMED, NOT_MSGPACK, (size_t)0);
        return -1;
    }
    if (!((p[0] & 0xf0) == 0x80 || p[0] == 0xde || p[0] == 0xdf)) {
        wire_set_err(err, WIRE_E_MALFORMED, "header is not a map");
        return -1;
    }
    tk_t d = { p, p, p + len, t, err, id, type_cap ? type : NULL, type_cap, NULL, 0, toks(t),
               t->heap ? t->cap : WIRE_TOKS_INLINE, 0 };
    uint32_t root = tk_val(&d, 0);
    free(d.keys);
    if (root == BAD_TOK) return -1;
    if (d.p != d.end) {
        wire_set_err(err, WIRE_E_MALFORMED, "%zu trailing bytes after the header", left(&d));
        return -1;
    }
    return 0;
}

/* ---- reading tokens ----------------------------------------------------------- */

bool wire_tok_is(const wire_toks_t *t, const void *buf, uint32_t i, const char *s) {
    const wire_tok_t *k = &wire_toks_v(t)[i];
    size_t n = strlen(s);
    return k->kind == WV_STR && k->n == n && !memcmp((const char *)buf + k->v.off, s, n);
}

uint32_t wire_tok_find(const wire_toks_t *t, const void *buf, uint32_t map, const char *s) {
    const wire_tok_t *v = wire_toks_v(t);
    if (v[map].kind != WV_MAP) return 0;
    for (uint32_t i = 0, k = map + 1; i < v[map].n; i++, k = v[k + 1].next)
        if (wire_tok_is(t, buf, k, s)) return k + 1;
    return 0;
}

bool wire_tok_u64(const wire_toks_t *t, uint32_t i, uint64_t *out) {
    const wire_tok_t *k = &wire_toks_v(t)[i];
    if (k->kind != WV_UINT) return false; /* a negative integer decodes as WV_INT */
    *out = k->v.u;
    return true;
}

bool wire_tok_i64(const wire_toks_t *t, uint32_t i, int64_t *out) {
    const wire_tok_t *k = &wire_toks_v(t)[i];
    if (k->kind == WV_INT) *out = k->v.i;
    else if (k->kind == WV_UINT && k->v.u <= (uint64_t)INT64_MAX) *out = (int64_t)k->v.u;
    else return false;
    return true;
}

bool wire_tok_f64(const wire_toks_t *t, uint32_t i, double *out) {
    const wire_tok_t *k = &wire_toks_v(t)[i];
    switch (k->kind) {
    case WV_F64: *out = k->v.f; return true;
    case WV_INT: *out = (double)k->v.i; return true;
    case WV_UINT: *out = (double)k->v.u; return true;
    default: return false;
    }
}

wire_val_t *wire_tok_tree(const wire_toks_t *t, const void *buf, uint32_t i) {
    const wire_tok_t *k = &wire_toks_v(t)[i];
    switch (k->kind) {
    case WV_NIL: return wv_nil();
    case WV_BOOL: return wv_bool(k->v.b);
    case WV_INT: return wv_i64(k->v.i);
    case WV_UINT: return wv_u64(k->v.u);
    case WV_F64: return wv_f64(k->v.f);
    case WV_STR: return wv_strn((const char *)buf + k->v.off, k->n);
    case WV_ARR:
    case WV_MAP: {
        bool map = k->kind == WV_MAP;
        wire_val_t *c = wv_container(map, k->n);
        for (uint32_t j = 0, at = i + 1; c && j < k->n; j++) {
            const char *key = NULL;
            char kbuf[WIRE_MAX_STR + 1];
            if (map) {
                const wire_tok_t *kt = &wire_toks_v(t)[at];
                memcpy(kbuf, (const char *)buf + kt->v.off, kt->n);
                kbuf[kt->n] = '\0';
                key = kbuf;
                at++;
            }
            if (wv_append(c, key, wire_tok_tree(t, buf, at)) < 0) wv_free(&c);
            at = wire_toks_v(t)[at].next;
        }
        return c;
    }
    }
    return NULL;
}

/* ---- skipping values ---------------------------------------------------------- */

static uint64_t be_at(const unsigned char *p, size_t k) {
    uint64_t x = 0;
    for (size_t i = 0; i < k; i++) x = x << 8 | p[i];
    return x;
}

size_t wire_map_header_len(const unsigned char *p, size_t n) {
    if (n >= 1 && (p[0] & 0xf0) == 0x80) return 1;
    if (n >= 3 && p[0] == 0xde) return 3;
    if (n >= 5 && p[0] == 0xdf) return 5;
    return 0;
}

/* Values still to skip are counted, not recursed into: a container adds
 * its entries (a map two per entry) to the count. */
size_t wire_skip(const unsigned char *p, size_t n, size_t at) {
    uint64_t pending = 1;
    while (pending--) {
        if (at >= n) return 0;
        unsigned b = p[at++];
        size_t k = 0;        /* bytes of length or count after the type byte */
        uint64_t len = 0;    /* payload bytes after those */
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) continue;
        if ((b & 0xf0) == 0x80) {
            pending += 2 * (uint64_t)(b & 0x0f);
            continue;
        }
        if ((b & 0xf0) == 0x90) {
            pending += b & 0x0f;
            continue;
        }
        if ((b & 0xe0) == 0xa0) len = b & 0x1f;
        else if (b >= 0xcc && b <= 0xcf) len = (uint64_t)1 << (b - 0xcc);
        else if (b >= 0xd0 && b <= 0xd3) len = (uint64_t)1 << (b - 0xd0);
        else if (b == 0xca || b == 0xcb) len = b == 0xca ? 4 : 8;
        else if (b >= 0xd9 && b <= 0xdb) k = (size_t)1 << (b - 0xd9);
        else if (b == 0xdc || b == 0xde) k = 2;
        else if (b == 0xdd || b == 0xdf) k = 4;
        else return 0; /* bin, ext: never in an accepted header */
        if (k) {
            if (k > n - at) return 0;
            uint64_t x = be_at(p + at, k);
            at += k;
            if (b >= 0xdc) {
                pending += b >= 0xde ? 2 * x : x;
                continue;
            }
            len = x;
        }
        if (len > n - at) return 0;
        at += (size_t)len;
    }
    return at;
}
