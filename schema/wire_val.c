/* wire_val.c -- the value tree of a header (wire.h): constructors,
 * lookups and the internals the decoder uses to build one. Tests and tools
 * write arbitrary headers with it; daemons never see it (msg.h). */
#include "schema/wire_codec.h"

#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

static wire_val_t *wv_new(wire_kind_t kind) {
    wire_val_t *v = calloc(1, sizeof *v);
    if (v) v->kind = kind;
    return v;
}

wire_val_t *wv_map(void) { return wv_new(WV_MAP); }
wire_val_t *wv_arr(void) { return wv_new(WV_ARR); }

/* A value owning a NUL-terminated copy of s[0..len). NULL on OOM. */
wire_val_t *wv_strn(const char *s, size_t len) {
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

wire_val_t *wv_container(bool map, size_t n) {
    wire_val_t *c = wv_new(map ? WV_MAP : WV_ARR);
    if (!c || !n) return c;
    c->as.c.v = calloc(n, sizeof *c->as.c.v);
    if (map) c->as.c.k = calloc(n, sizeof *c->as.c.k);
    if (!c->as.c.v || (map && !c->as.c.k)) {
        wv_free(&c);
        return NULL;
    }
    c->as.c.cap = n;
    return c;
}

int wv_append(wire_val_t *c, const char *key, wire_val_t *v) {
    char *k = NULL;
    if (!v || !c || (c->kind == WV_MAP) != (key != NULL) || (key && !(k = strdup(key))) ||
        wv_grow(c) < 0) {
        free(k);
        wv_free(&v);
        return -1;
    }
    if (k) c->as.c.k[c->as.c.n] = k;
    c->as.c.v[c->as.c.n++] = v;
    return 0;
}
