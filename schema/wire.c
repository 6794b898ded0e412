/* wire.c -- Reel's wire codec (see wire.h and docs/PROTOCOL.md).
 *
 * Encoding goes through msgpack-c's packer. Decoding does NOT use
 * msgpack_unpack: msgpack-c allocates count x 24 bytes for an array or map
 * header before looking at the bytes behind it (5 bytes can ask for ~96 GB)
 * and reports deep nesting as NOMEM. Headers are untrusted, so they are
 * decoded here by a small recursive-descent parser that checks every count,
 * length and depth against the limits and against the bytes actually left
 * *before* allocating, and builds wire_val_t directly.
 *
 * Decoding decisions (documented for other implementations):
 *   - bin8/16/32, ext and the never-used 0xc1 are malformed: the protocol
 *     carries bytes only as tensor frames, never inside msgpack.
 *   - float32 widens exactly to WV_F64; we always encode float64.
 *   - every non-negative integer decodes as WV_UINT and every negative one
 *     as WV_INT, whatever format carried it (the lookups accept both).
 *   - map keys must be strings without NUL bytes; duplicate keys are
 *     malformed. String values may hold NULs (str.len is exact).
 *   - the root must be a map, with no bytes after it. */
#include "schema/wire.h"

#include <errno.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* ---- errors -------------------------------------------------------------- */

static void set_err(wire_err_t *err, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(wire_err_t *err, const char *code, const char *fmt, ...) {
    if (!err) return;
    snprintf(err->code, sizeof err->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

/* ---- values -------------------------------------------------------------- */

static wire_val_t *wv_new(wire_kind_t kind) {
    wire_val_t *v = calloc(1, sizeof *v);
    if (v) v->kind = kind;
    return v;
}

wire_val_t *wv_map(void) { return wv_new(WV_MAP); }
wire_val_t *wv_arr(void) { return wv_new(WV_ARR); }

/* A value owning a NUL-terminated copy of s[0..len). NULL on OOM. */
static wire_val_t *wv_strn(const char *s, size_t len) {
    wire_val_t *v = wv_new(WV_STR);
    if (!v) return NULL;
    v->as.str.s = malloc(len + 1);
    if (!v->as.str.s) {
        free(v);
        return NULL;
    }
    if (len) memcpy(v->as.str.s, s, len);
    v->as.str.s[len] = '\0';
    v->as.str.len = len;
    return v;
}

/* NULL on OOM, and for s == NULL (so wv_set(m, k, wv_str(NULL)) fails). */
wire_val_t *wv_str(const char *s) { return s ? wv_strn(s, strlen(s)) : NULL; }

wire_val_t *wv_u64(uint64_t x) {
    wire_val_t *v = wv_new(WV_UINT);
    if (v) v->as.u = x;
    return v;
}

wire_val_t *wv_i64(int64_t x) {
    wire_val_t *v = wv_new(WV_INT);
    if (v) v->as.i = x;
    return v;
}

wire_val_t *wv_f64(double x) {
    wire_val_t *v = wv_new(WV_F64);
    if (v) v->as.f = x;
    return v;
}

wire_val_t *wv_bool(bool b) {
    wire_val_t *v = wv_new(WV_BOOL);
    if (v) v->as.b = b;
    return v;
}

wire_val_t *wv_nil(void) { return wv_new(WV_NIL); }

void wv_free(wire_val_t **vp) {
    if (!vp || !*vp) return;
    wire_val_t *v = *vp;
    if (v->kind == WV_STR) {
        free(v->as.str.s);
    } else if (v->kind == WV_ARR || v->kind == WV_MAP) {
        for (size_t i = 0; i < v->as.c.n; i++) {
            wv_free(&v->as.c.v[i]);
            if (v->as.c.k) free(v->as.c.k[i]);
        }
        free(v->as.c.v);
        free(v->as.c.k);
    }
    free(v);
    *vp = NULL;
}

/* Makes room for one more entry. -1 on OOM (container unchanged). */
static int wv_grow(wire_val_t *c) {
    if (c->as.c.n < c->as.c.cap) return 0;
    size_t cap = c->as.c.cap ? c->as.c.cap * 2 : 4;
    wire_val_t **v = realloc(c->as.c.v, cap * sizeof *v);
    if (!v) return -1;
    c->as.c.v = v;
    if (c->kind == WV_MAP) {
        char **k = realloc(c->as.c.k, cap * sizeof *k);
        if (!k) return -1; /* v grew but cap did not: harmless */
        c->as.c.k = k;
    }
    c->as.c.cap = cap;
    return 0;
}

static ssize_t map_find(const wire_val_t *map, const char *key) {
    for (size_t i = 0; i < map->as.c.n; i++)
        if (!strcmp(map->as.c.k[i], key)) return (ssize_t)i;
    return -1;
}

int wv_set(wire_val_t *map, const char *key, wire_val_t *v) {
    if (!v) return -1;
    if (!map || map->kind != WV_MAP || !key) goto err;
    ssize_t at = map_find(map, key);
    if (at >= 0) {
        wv_free(&map->as.c.v[at]);
        map->as.c.v[at] = v;
        return 0;
    }
    char *k = strdup(key);
    if (!k) goto err;
    if (wv_grow(map) < 0) {
        free(k);
        goto err;
    }
    map->as.c.k[map->as.c.n] = k;
    map->as.c.v[map->as.c.n++] = v;
    return 0;
err:
    wv_free(&v);
    return -1;
}

int wv_push(wire_val_t *arr, wire_val_t *v) {
    if (!v) return -1;
    if (!arr || arr->kind != WV_ARR || wv_grow(arr) < 0) {
        wv_free(&v);
        return -1;
    }
    arr->as.c.v[arr->as.c.n++] = v;
    return 0;
}

const wire_val_t *wv_get(const wire_val_t *map, const char *key) {
    if (!map || map->kind != WV_MAP || !key) return NULL;
    ssize_t at = map_find(map, key);
    return at < 0 ? NULL : map->as.c.v[at];
}

const char *wv_get_str(const wire_val_t *map, const char *key) {
    const wire_val_t *v = wv_get(map, key);
    return v && v->kind == WV_STR ? v->as.str.s : NULL;
}

bool wv_as_u64(const wire_val_t *v, uint64_t *out) {
    if (!v) return false;
    if (v->kind == WV_UINT) {
        *out = v->as.u;
        return true;
    }
    if (v->kind == WV_INT && v->as.i >= 0) {
        *out = (uint64_t)v->as.i;
        return true;
    }
    return false;
}

bool wv_as_i64(const wire_val_t *v, int64_t *out) {
    if (!v) return false;
    if (v->kind == WV_INT) {
        *out = v->as.i;
        return true;
    }
    if (v->kind == WV_UINT && v->as.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)v->as.u;
        return true;
    }
    return false;
}

bool wv_as_f64(const wire_val_t *v, double *out) {
    if (!v) return false;
    switch (v->kind) {
    case WV_F64: *out = v->as.f; return true;
    case WV_INT: *out = (double)v->as.i; return true;
    case WV_UINT: *out = (double)v->as.u; return true;
    default: return false;
    }
}

bool wv_get_u64(const wire_val_t *map, const char *key, uint64_t *out) {
    return wv_as_u64(wv_get(map, key), out);
}

bool wv_get_i64(const wire_val_t *map, const char *key, int64_t *out) {
    return wv_as_i64(wv_get(map, key), out);
}

bool wv_get_f64(const wire_val_t *map, const char *key, double *out) {
    return wv_as_f64(wv_get(map, key), out);
}

bool wv_get_bool(const wire_val_t *map, const char *key, bool *out) {
    const wire_val_t *v = wv_get(map, key);
    if (!v || v->kind != WV_BOOL) return false;
    *out = v->as.b;
    return true;
}

size_t wv_len(const wire_val_t *v) {
    return v && (v->kind == WV_ARR || v->kind == WV_MAP) ? v->as.c.n : 0;
}

/* Arrays only: NULL for a map, a scalar or i out of range. */
const wire_val_t *wv_at(const wire_val_t *arr, size_t i) {
    if (!arr || arr->kind != WV_ARR || i >= arr->as.c.n) return NULL;
    return arr->as.c.v[i];
}

/* ---- encoding ------------------------------------------------------------ */

static int pack_str(msgpack_packer *pk, const char *s, size_t len) {
    if (msgpack_pack_str(pk, len) < 0) return -1;
    return msgpack_pack_str_body(pk, s, len);
}

/* Packs v, whose containers start at nesting level depth+1. -1 on OOM or
 * when a container would sit deeper than WIRE_MAX_DEPTH. */
static int pack_val(msgpack_packer *pk, const wire_val_t *v, int depth) {
    switch (v->kind) {
    case WV_NIL: return msgpack_pack_nil(pk);
    case WV_BOOL: return v->as.b ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    case WV_INT: return msgpack_pack_int64(pk, v->as.i);
    case WV_UINT: return msgpack_pack_uint64(pk, v->as.u);
    case WV_F64: return msgpack_pack_double(pk, v->as.f);
    case WV_STR: return pack_str(pk, v->as.str.s, v->as.str.len);
    case WV_ARR:
        if (depth + 1 > WIRE_MAX_DEPTH) return -1;
        if (msgpack_pack_array(pk, v->as.c.n) < 0) return -1;
        for (size_t i = 0; i < v->as.c.n; i++)
            if (pack_val(pk, v->as.c.v[i], depth + 1) < 0) return -1;
        return 0;
    case WV_MAP:
        if (depth + 1 > WIRE_MAX_DEPTH) return -1;
        if (msgpack_pack_map(pk, v->as.c.n) < 0) return -1;
        for (size_t i = 0; i < v->as.c.n; i++) {
            if (pack_str(pk, v->as.c.k[i], strlen(v->as.c.k[i])) < 0) return -1;
            if (pack_val(pk, v->as.c.v[i], depth + 1) < 0) return -1;
        }
        return 0;
    }
    return -1;
}

unsigned char *wire_encode_header(const wire_val_t *hdr, size_t *len) {
    if (!hdr || !len) return NULL;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (pack_val(&pk, hdr, 0) < 0) {
        msgpack_sbuffer_destroy(&sb);
        return NULL;
    }
    size_t n = sb.size; /* release() zeroes sb */
    unsigned char *out = (unsigned char *)msgpack_sbuffer_release(&sb);
    if (out) *len = n;
    return out;
}

/* ---- decoding ------------------------------------------------------------ */

typedef struct {
    const unsigned char *p, *end;
    wire_err_t *err;
} dec_t;

static size_t dec_left(const dec_t *d) { return (size_t)(d->end - d->p); }

/* Reads an n-byte big-endian unsigned integer. false (err set) if
 * truncated. */
static bool dec_be(dec_t *d, size_t n, uint64_t *out) {
    if (dec_left(d) < n) {
        set_err(d->err, WIRE_E_MALFORMED, "truncated header");
        return false;
    }
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) x = x << 8 | d->p[i];
    d->p += n;
    *out = x;
    return true;
}

static wire_val_t *dec_oom(dec_t *d) {
    set_err(d->err, WIRE_E_INTERNAL, "out of memory decoding header");
    return NULL;
}

/* A string body of len bytes at d->p (len already read). */
static wire_val_t *dec_str(dec_t *d, uint64_t len) {
    if (len > WIRE_MAX_STR) {
        set_err(d->err, WIRE_E_TOO_LARGE, "string of %llu bytes (max %d)",
                (unsigned long long)len, WIRE_MAX_STR);
        return NULL;
    }
    if (len > dec_left(d)) {
        set_err(d->err, WIRE_E_MALFORMED, "truncated string");
        return NULL;
    }
    wire_val_t *v = wv_strn((const char *)d->p, (size_t)len);
    if (!v) return dec_oom(d);
    d->p += len;
    return v;
}

static int cmp_keys(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* True when the n keys are distinct; O(n log n) so a 4096-entry map cannot
 * be turned into a quadratic CPU cost. -1 on OOM. */
static int keys_distinct(char **k, size_t n) {
    if (n < 2) return 1;
    char **s = malloc(n * sizeof *s);
    if (!s) return -1;
    memcpy(s, k, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_keys);
    int ok = 1;
    for (size_t i = 1; i < n && ok; i++)
        if (!strcmp(s[i - 1], s[i])) ok = 0;
    free(s);
    return ok;
}

static wire_val_t *dec_val(dec_t *d, int depth);

/* A container of `count` entries whose header was just read. The count is
 * checked against the limit and against the bytes left (an element needs at
 * least one byte, a map entry two) before anything is allocated. */
static wire_val_t *dec_container(dec_t *d, bool is_map, uint64_t count, int depth) {
    if (depth + 1 > WIRE_MAX_DEPTH) {
        set_err(d->err, WIRE_E_TOO_LARGE, "nesting deeper than %d", WIRE_MAX_DEPTH);
        return NULL;
    }
    if (count > WIRE_MAX_ITEMS) {
        set_err(d->err, WIRE_E_TOO_LARGE, "%s of %llu entries (max %d)",
                is_map ? "map" : "array", (unsigned long long)count, WIRE_MAX_ITEMS);
        return NULL;
    }
    if (count * (is_map ? 2 : 1) > dec_left(d)) {
        set_err(d->err, WIRE_E_MALFORMED, "%s of %llu entries in %zu bytes",
                is_map ? "map" : "array", (unsigned long long)count, dec_left(d));
        return NULL;
    }
    wire_val_t *c = wv_new(is_map ? WV_MAP : WV_ARR);
    if (!c) return dec_oom(d);
    if (count) {
        c->as.c.v = calloc((size_t)count, sizeof *c->as.c.v);
        if (is_map) c->as.c.k = calloc((size_t)count, sizeof *c->as.c.k);
        if (!c->as.c.v || (is_map && !c->as.c.k)) goto oom;
        c->as.c.cap = (size_t)count;
    }
    for (size_t i = 0; i < count; i++) {
        if (is_map) {
            /* peek, so a container posing as a key is never built */
            unsigned char kb = dec_left(d) ? *d->p : 0xc0;
            if ((kb & 0xe0) != 0xa0 && (kb < 0xd9 || kb > 0xdb)) {
                set_err(d->err, WIRE_E_MALFORMED, "map key is not a string");
                goto fail;
            }
            wire_val_t *key = dec_val(d, depth + 1);
            if (!key) goto fail;
            if (strlen(key->as.str.s) != key->as.str.len) {
                set_err(d->err, WIRE_E_MALFORMED, "map key holds a NUL byte");
                wv_free(&key);
                goto fail;
            }
            c->as.c.k[i] = key->as.str.s; /* steal the copy */
            key->as.str.s = NULL;
            wv_free(&key);
        }
        wire_val_t *v = dec_val(d, depth + 1);
        if (!v) {
            /* keep n consistent: a stolen key without value is freed here */
            if (is_map) {
                free(c->as.c.k[i]);
                c->as.c.k[i] = NULL;
            }
            goto fail;
        }
        c->as.c.v[i] = v;
        c->as.c.n = i + 1;
    }
    if (is_map) {
        int r = keys_distinct(c->as.c.k, c->as.c.n);
        if (r < 0) goto oom;
        if (!r) {
            set_err(d->err, WIRE_E_MALFORMED, "duplicate map key");
            goto fail;
        }
    }
    return c;
oom:
    dec_oom(d);
fail:
    wv_free(&c);
    return NULL;
}

/* Decodes one value; `depth` containers enclose it. NULL with d->err set. */
static wire_val_t *dec_val(dec_t *d, int depth) {
    uint64_t x;
    if (!dec_left(d)) {
        set_err(d->err, WIRE_E_MALFORMED, "truncated header");
        return NULL;
    }
    unsigned char b = *d->p++;
    if ((b & 0xf0) == 0x80) return dec_container(d, true, b & 0x0f, depth);
    if ((b & 0xf0) == 0x90) return dec_container(d, false, b & 0x0f, depth);
    if ((b & 0xe0) == 0xa0) return dec_str(d, b & 0x1f);
    wire_val_t *v = NULL;
    if (b <= 0x7f) {
        v = wv_u64(b);
    } else if (b >= 0xe0) {
        v = wv_i64((int8_t)b);
    } else switch (b) {
    case 0xc0: v = wv_new(WV_NIL); break;
    case 0xc2: v = wv_bool(false); break;
    case 0xc3: v = wv_bool(true); break;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        if (!dec_be(d, (size_t)1 << (b - 0xcc), &x)) return NULL;
        v = wv_u64(x);
        break;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        size_t n = (size_t)1 << (b - 0xd0);
        if (!dec_be(d, n, &x)) return NULL;
        if (n < 8 && (x >> (8 * n - 1)) & 1) x |= ~(uint64_t)0 << (8 * n); /* sign-extend */
        int64_t i = (int64_t)x;
        v = i >= 0 ? wv_u64((uint64_t)i) : wv_i64(i);
        break;
    }
    case 0xca: {
        if (!dec_be(d, 4, &x)) return NULL;
        uint32_t u = (uint32_t)x;
        float f;
        memcpy(&f, &u, sizeof f);
        v = wv_f64((double)f);
        break;
    }
    case 0xcb: {
        if (!dec_be(d, 8, &x)) return NULL;
        double f;
        memcpy(&f, &x, sizeof f);
        v = wv_f64(f);
        break;
    }
    case 0xd9: case 0xda: case 0xdb:
        if (!dec_be(d, (size_t)1 << (b - 0xd9), &x)) return NULL;
        return dec_str(d, x);
    case 0xdc: case 0xdd:
        if (!dec_be(d, b == 0xdc ? 2 : 4, &x)) return NULL;
        return dec_container(d, false, x, depth);
    case 0xde: case 0xdf:
        if (!dec_be(d, b == 0xde ? 2 : 4, &x)) return NULL;
        return dec_container(d, true, x, depth);
    case 0xc4: case 0xc5: case 0xc6:
        set_err(d->err, WIRE_E_MALFORMED, "bin values are not allowed in a header");
        return NULL;
    default: /* 0xc1, ext 0xc7-0xc9 and fixext 0xd4-0xd8 */
        set_err(d->err, WIRE_E_MALFORMED, "unsupported msgpack type 0x%02x", b);
        return NULL;
    }
    return v ? v : dec_oom(d);
}

wire_val_t *wire_decode_header(const void *buf, size_t len, wire_err_t *err) {
    if (len > WIRE_MAX_HEADER) {
        set_err(err, WIRE_E_TOO_LARGE, "header of %zu bytes (max %d)", len, WIRE_MAX_HEADER);
        return NULL;
    }
    const unsigned char *p = buf;
    if (!len || !p) {
        set_err(err, WIRE_E_MALFORMED, "empty header");
        return NULL;
    }
    if (!((p[0] & 0xf0) == 0x80 || p[0] == 0xde || p[0] == 0xdf)) {
        set_err(err, WIRE_E_MALFORMED, "header is not a map");
        return NULL;
    }
    dec_t d = {p, p + len, err};
    wire_val_t *v = dec_val(&d, 0);
    if (!v) return NULL;
    if (d.p != d.end) {
        set_err(err, WIRE_E_MALFORMED, "%zu trailing bytes after the header", dec_left(&d));
        wv_free(&v);
    }
    return v;
}

/* ---- messages ------------------------------------------------------------ */

static void msg_reset(wire_msg_t *m) {
    m->hdr = NULL;
    m->type = NULL;
    m->id = 0;
    m->n_tensors = 0;
    memset(m->t, 0, sizeof m->t);
}

void wire_msg_close(wire_msg_t *m) {
    if (!m) return;
    wv_free(&m->hdr);
    for (int i = 0; i < m->n_tensors && i < WIRE_MAX_TENSORS; i++) zmq_msg_close(&m->frame[i]);
    if (m->has_identity) zmq_msg_close(&m->identity);
    m->has_identity = false;
    msg_reset(m);
}

const wire_tensor_t *wire_msg_tensor(const wire_msg_t *m, const char *name) {
    if (!m || !name) return NULL;
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

/* Fills *t from descriptor i. 1 with *err set when it is bad. */
static int parse_tensor(const wire_val_t *dv, int i, wire_tensor_t *t, wire_err_t *err) {
    if (!dv || dv->kind != WV_MAP) {
        set_err(err, WIRE_E_MALFORMED, "tensor %d: descriptor is not a map", i);
        return 1;
    }
    const wire_val_t *name = wv_get(dv, "name");
    if (!name || name->kind != WV_STR || name->as.str.len == 0 ||
        name->as.str.len >= sizeof t->name || strlen(name->as.str.s) != name->as.str.len) {
        set_err(err, WIRE_E_MALFORMED, "tensor %d: \"name\" must be a string of 1..%zu bytes",
                i, sizeof t->name - 1);
        return 1;
    }
    memcpy(t->name, name->as.str.s, name->as.str.len + 1);
    const char *dt = wv_get_str(dv, "dtype");
    if (!dt || kern_dtype_parse(dt, &t->dtype) < 0) {
        set_err(err, WIRE_E_MALFORMED, "tensor '%s': unknown dtype", t->name);
        return 1;
    }
    const wire_val_t *shape = wv_get(dv, "shape");
    if (!shape || shape->kind != WV_ARR) {
        set_err(err, WIRE_E_MALFORMED, "tensor '%s': \"shape\" is not an array", t->name);
        return 1;
    }
    if (wv_len(shape) > KERN_MAX_DIMS) {
        set_err(err, WIRE_E_TOO_LARGE, "tensor '%s': %zu dims (max %d)", t->name,
                wv_len(shape), KERN_MAX_DIMS);
        return 1;
    }
    t->ndim = (int)wv_len(shape);
    uint64_t numel = 1;
    for (int k = 0; k < t->ndim; k++) {
        int64_t dim;
        if (!wv_as_i64(wv_at(shape, (size_t)k), &dim) || dim < 0) {
            set_err(err, WIRE_E_MALFORMED, "tensor '%s': dim %d is not a non-negative integer",
                    t->name, k);
            return 1;
        }
        t->shape[k] = dim;
        if (__builtin_mul_overflow(numel, (uint64_t)dim, &numel)) {
            set_err(err, WIRE_E_MALFORMED, "tensor '%s': element count overflows", t->name);
            return 1;
        }
    }
    uint64_t want, bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)kern_dtype_size(t->dtype), &want)) {
        set_err(err, WIRE_E_MALFORMED, "tensor '%s': byte size overflows", t->name);
        return 1;
    }
    if (!wv_get_u64(dv, "bytes", &bytes)) {
        set_err(err, WIRE_E_MALFORMED, "tensor '%s': \"bytes\" missing", t->name);
        return 1;
    }
    if (bytes != want) {
        set_err(err, WIRE_E_MALFORMED, "tensor '%s': bytes %llu != %llu (shape x dtype)",
                t->name, (unsigned long long)bytes, (unsigned long long)want);
        return 1;
    }
    t->bytes = (size_t)bytes;
    return 0;
}

/* Decodes frames[0..n_kept) of a message that had n_total frames (those
 * past n_kept were already closed: they only count). Takes ownership of
 * the kept frames; on success the tensor frames move into m->frame. */
static int decode_frames(wire_msg_t *m, zmq_msg_t *frames, size_t n_kept, size_t n_total,
                         wire_err_t *err) {
    int rc = 1;
    size_t done = 0; /* frames[0..done) no longer ours to close */
    msg_reset(m);
    if (n_total == 0) {
        set_err(err, WIRE_E_MALFORMED, "message without a header frame");
        goto out;
    }
    m->hdr = wire_decode_header(zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0]), err);
    zmq_msg_close(&frames[0]); /* the tree holds copies of every string */
    done = 1;
    if (!m->hdr) goto out;

    /* The id first: a rejected request is still answered under its id,
     * which is how the client matches the ERROR to what it sent. */
    const wire_val_t *id = wv_get(m->hdr, "id");
    if (id && !wv_as_u64(id, &m->id)) {
        set_err(err, WIRE_E_MALFORMED, "\"id\" is not an unsigned integer");
        goto out;
    }
    const char *proto = wv_get_str(m->hdr, "proto");
    if (!proto || strcmp(proto, WIRE_PROTO)) {
        set_err(err, WIRE_E_PROTO, "proto %s%.64s%s, want \"" WIRE_PROTO "\"",
                proto ? "\"" : "", proto ? proto : "missing", proto ? "\"" : "");
        goto out;
    }
    m->type = wv_get_str(m->hdr, "type");
    if (!m->type) {
        set_err(err, WIRE_E_MALFORMED, "\"type\" missing or not a string");
        goto out;
    }
    const wire_val_t *desc = wv_get(m->hdr, "tensors");
    if (desc && desc->kind != WV_ARR) {
        set_err(err, WIRE_E_MALFORMED, "\"tensors\" is not an array");
        goto out;
    }
    size_t n_desc = wv_len(desc), n_frames = n_total - 1;
    if (n_desc > WIRE_MAX_TENSORS || n_frames > WIRE_MAX_TENSORS) {
        set_err(err, WIRE_E_TOO_LARGE, "%zu tensors (max %d)",
                n_desc > n_frames ? n_desc : n_frames, WIRE_MAX_TENSORS);
        goto out;
    }
    if (n_desc != n_frames) {
        set_err(err, WIRE_E_MALFORMED, "%zu tensors declared but %zu frames sent", n_desc,
                n_frames);
        goto out;
    }
    for (size_t i = 0; i < n_desc; i++) {
        wire_tensor_t *t = &m->t[i];
        if (parse_tensor(wv_at(desc, i), (int)i, t, err)) goto out;
        /* wire_msg_tensor looks tensors up by name: keep names unambiguous */
        for (size_t j = 0; j < i; j++)
            if (!strcmp(m->t[j].name, t->name)) {
                set_err(err, WIRE_E_MALFORMED, "tensor '%s' declared twice", t->name);
                goto out;
            }
        size_t fsz = zmq_msg_size(&frames[1 + i]);
        if (fsz != t->bytes) {
            set_err(err, WIRE_E_MALFORMED, "tensor '%s': %zu bytes declared, frame has %zu",
                    t->name, t->bytes, fsz);
            goto out;
        }
    }
    for (size_t i = 0; i < n_desc; i++) {
        zmq_msg_init(&m->frame[i]);
        zmq_msg_move(&m->frame[i], &frames[1 + i]);
        zmq_msg_close(&frames[1 + i]); /* now empty */
        /* data is taken after the move: small messages live inside zmq_msg_t */
        m->t[i].data = zmq_msg_data(&m->frame[i]);
    }
    m->n_tensors = (int)n_desc;
    done = n_kept;
    rc = 0;
out:
    for (size_t i = done; i < n_kept; i++) zmq_msg_close(&frames[i]);
    if (rc) {
        uint64_t keep_id = m->id;
        wv_free(&m->hdr);
        msg_reset(m);
        m->id = keep_id;
    }
    return rc;
}

/* wire_decode resets the whole of *m, has_identity included: a caller with
 * an identity attaches it after. */
int wire_decode(wire_msg_t *m, zmq_msg_t *frames, size_t n, wire_err_t *err) {
    m->has_identity = false;
    size_t keep = n <= 1 + WIRE_MAX_TENSORS ? n : 1 + WIRE_MAX_TENSORS;
    for (size_t i = keep; i < n; i++) zmq_msg_close(&frames[i]);
    return decode_frames(m, frames, keep, n, err);
}

/* Receives one part, retrying EINTR when `retry` (inside a multipart
 * message the rest is already queued). -1 with errno on failure. */
static int recv_part(void *sock, zmq_msg_t *msg, int flags, bool retry) {
    for (;;) {
        if (zmq_msg_recv(msg, sock, flags) >= 0) return 0;
        if (!(retry && errno == EINTR)) return -1;
    }
}

int wire_recv(void *sock, bool router, int flags, wire_msg_t *m, wire_err_t *err) {
    memset(m, 0, sizeof *m);
    zmq_msg_t frames[1 + WIRE_MAX_TENSORS];
    size_t kept = 0, total = 0;
    zmq_msg_t *first = router ? &m->identity : &frames[0];
    zmq_msg_init(first);
    if (recv_part(sock, first, flags, false) < 0) {
        int e = errno;
        zmq_msg_close(first);
        errno = e;
        return -1;
    }
    bool more = zmq_msg_more(first);
    if (router) {
        m->has_identity = true;
    } else {
        kept = total = 1;
    }
    /* Drain every remaining part, even of a bad message, so the next recv
     * starts at a message boundary. Parts past the tensor limit are only
     * counted. */
    while (more) {
        zmq_msg_t spill;
        zmq_msg_t *part = kept < 1 + WIRE_MAX_TENSORS ? &frames[kept] : &spill;
        zmq_msg_init(part);
        if (recv_part(sock, part, flags & ~ZMQ_DONTWAIT, true) < 0) {
            int e = errno;
            zmq_msg_close(part);
            for (size_t i = 0; i < kept; i++) zmq_msg_close(&frames[i]);
            wire_msg_close(m);
            errno = e;
            return -1;
        }
        more = zmq_msg_more(part);
        if (part == &spill) zmq_msg_close(&spill);
        else kept++;
        total++;
    }
    /* decode_frames leaves the identity alone */
    return decode_frames(m, frames, kept, total, err);
}

int wire_socket_limits(void *sock) {
    int64_t max = WIRE_MAX_FRAME;
    int linger = 0;
    if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max, sizeof max) < 0) return -1;
    return zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
}

wire_val_t *wire_hdr(const char *type, uint64_t id) {
    wire_val_t *h = wv_map();
    if (!h) return NULL;
    if (wv_set(h, "type", wv_str(type)) < 0 || wv_set(h, "id", wv_u64(id)) < 0) {
        wv_free(&h);
        return NULL;
    }
    return h;
}

/* A sender-side check: what the receiver would reject is not sent. */
static bool tensor_ok(const wire_tensor_t *t) {
    if (t->ndim < 0 || t->ndim > KERN_MAX_DIMS || t->dtype < 0 ||
        t->dtype >= KERN_DTYPE_COUNT)
        return false;
    size_t nl = strnlen(t->name, sizeof t->name);
    if (nl == 0 || nl == sizeof t->name) return false;
    uint64_t numel = 1;
    for (int k = 0; k < t->ndim; k++)
        if (t->shape[k] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[k], &numel))
            return false;
    uint64_t want;
    if (__builtin_mul_overflow(numel, (uint64_t)kern_dtype_size(t->dtype), &want)) return false;
    return want == t->bytes && (t->bytes == 0 || t->data);
}

/* True when v's containers nest at most WIRE_MAX_DEPTH deep, counting the
 * `depth` that already enclose it. */
static bool depth_ok(const wire_val_t *v, int depth) {
    if (v->kind != WV_ARR && v->kind != WV_MAP) return true;
    if (depth + 1 > WIRE_MAX_DEPTH) return false;
    for (size_t i = 0; i < v->as.c.n; i++)
        if (!depth_ok(v->as.c.v[i], depth + 1)) return false;
    return true;
}

/* Packs the caller's map minus "proto"/"tensors", then those two. */
static int pack_wire_header(msgpack_packer *pk, const wire_val_t *hdr,
                            const wire_tensor_t *t, int n) {
    size_t keep = 0;
    for (size_t i = 0; i < hdr->as.c.n; i++)
        if (strcmp(hdr->as.c.k[i], "proto") && strcmp(hdr->as.c.k[i], "tensors")) keep++;
    if (msgpack_pack_map(pk, keep + 2) < 0) return -1;
    for (size_t i = 0; i < hdr->as.c.n; i++) {
        const char *k = hdr->as.c.k[i];
        if (!strcmp(k, "proto") || !strcmp(k, "tensors")) continue;
        if (pack_str(pk, k, strlen(k)) < 0 || pack_val(pk, hdr->as.c.v[i], 1) < 0) return -1;
    }
    if (pack_str(pk, "proto", 5) < 0 || pack_str(pk, WIRE_PROTO, strlen(WIRE_PROTO)) < 0)
        return -1;
    if (pack_str(pk, "tensors", 7) < 0 || msgpack_pack_array(pk, (size_t)n) < 0) return -1;
    for (int i = 0; i < n; i++) {
        const char *dt = kern_dtype_name(t[i].dtype);
        if (msgpack_pack_map(pk, 4) < 0 || pack_str(pk, "name", 4) < 0 ||
            pack_str(pk, t[i].name, strlen(t[i].name)) < 0 || pack_str(pk, "dtype", 5) < 0 ||
            pack_str(pk, dt, strlen(dt)) < 0 || pack_str(pk, "shape", 5) < 0 ||
            msgpack_pack_array(pk, (size_t)t[i].ndim) < 0)
            return -1;
        for (int k = 0; k < t[i].ndim; k++)
            if (msgpack_pack_uint64(pk, (uint64_t)t[i].shape[k]) < 0) return -1;
        if (pack_str(pk, "bytes", 5) < 0 || msgpack_pack_uint64(pk, t[i].bytes) < 0) return -1;
    }
    return 0;
}

/* Sends one part; parts after the first retry EINTR (ZeroMQ queues a
 * multipart message atomically, so only the first part can block). */
static int send_part(void *sock, zmq_msg_t *msg, int flags, bool retry) {
    for (;;) {
        if (zmq_msg_send(msg, sock, flags) >= 0) return 0;
        if (!(retry && errno == EINTR)) return -1;
    }
}

/* Every part is built before the first is sent, so an allocation failure
 * never leaves half a message queued. */
/* wire_send and wire_forward: frames NULL copies each tensor's data into
 * a new frame; otherwise frames[i] is shared (zmq_msg_copy: reference
 * counted, no copy of the bytes). */
static int send_impl(void *sock, const zmq_msg_t *identity, const wire_val_t *hdr,
                     const wire_tensor_t *t, int n, zmq_msg_t *frames) {
    if (!hdr || hdr->kind != WV_MAP || n < 0 || n > WIRE_MAX_TENSORS || (n && !t)) {
        errno = EINVAL;
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (!tensor_ok(&t[i])) {
            errno = EINVAL;
            return -1;
        }
    zmq_msg_t parts[2 + WIRE_MAX_TENSORS];
    int np = 0, sent = 0, e = 0;

    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (!depth_ok(hdr, 0)) {
        e = EINVAL;
        goto out;
    }
    if (pack_wire_header(&pk, hdr, t, n) < 0) {
        e = ENOMEM;
        goto out;
    }
    if (sb.size > WIRE_MAX_HEADER) {
        e = EMSGSIZE;
        goto out;
    }
    if (identity) {
        zmq_msg_t *id = (zmq_msg_t *)identity; /* zmq's getters are not const */
        size_t sz = zmq_msg_size(id);
        if (zmq_msg_init_size(&parts[np], sz) < 0) goto zerr;
        memcpy(zmq_msg_data(&parts[np]), zmq_msg_data(id), sz);
        np++;
    }
    if (zmq_msg_init_size(&parts[np], sb.size) < 0) goto zerr;
    memcpy(zmq_msg_data(&parts[np]), sb.data, sb.size);
    np++;
    for (int i = 0; i < n; i++) {
        if (frames) {
            if (zmq_msg_init(&parts[np]) < 0 || zmq_msg_copy(&parts[np], &frames[i]) < 0) goto zerr;
        } else {
            if (zmq_msg_init_size(&parts[np], t[i].bytes) < 0) goto zerr;
            if (t[i].bytes) memcpy(zmq_msg_data(&parts[np]), t[i].data, t[i].bytes);
        }
        np++;
    }
    for (sent = 0; sent < np; sent++)
        if (send_part(sock, &parts[sent], sent + 1 < np ? ZMQ_SNDMORE : 0, sent > 0) < 0)
            goto zerr;
    goto out; /* a sent part belongs to zmq */
zerr:
    e = errno;
out:
    for (int i = sent; i < np; i++) zmq_msg_close(&parts[i]);
    msgpack_sbuffer_destroy(&sb);
    if (e) {
        errno = e;
        return -1;
    }
    return 0;
}

int wire_send(void *sock, const zmq_msg_t *identity, const wire_val_t *hdr,
              const wire_tensor_t *t, int n) {
    return send_impl(sock, identity, hdr, t, n, NULL);
}

int wire_forward(void *sock, const zmq_msg_t *identity, const wire_val_t *hdr, wire_msg_t *src) {
    return send_impl(sock, identity, hdr, src->t, src->n_tensors, src->frame);
}

int wire_send_error(void *sock, const zmq_msg_t *identity, uint64_t id, const char *code,
                    const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    wire_val_t *h = wire_hdr("ERROR", id);
    if (!h || wv_set(h, "code", wv_str(code)) < 0 || wv_set(h, "message", wv_str(text)) < 0) {
        wv_free(&h);
        errno = ENOMEM;
        return -1;
    }
    int rc = wire_send(sock, identity, h, NULL, 0);
    int e = errno;
    wv_free(&h);
    errno = e;
    return rc;
}
