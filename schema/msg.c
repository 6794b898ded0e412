/* msg.c -- typed messages (see msg.h): decoding, encoding and sending by
 * walking the field tables of msg_defs.c over a tokenized header. A
 * decoder visits each key of a map once and looks its row up in the
 * table; nothing is allocated per field (strings go into the struct,
 * arrays of entries into the message's arena). */
#include "schema/msg.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema/msg_defs.h"
#include "schema/wire_codec.h"

/* ---- types -------------------------------------------------------------------- */

msg_type_t msg_type(const wire_msg_t *m) {
    if (!m || !m->type) return MSG_UNKNOWN;
    for (int t = 0; t < MSG_UNKNOWN; t++)
        if (!strcmp(m->type, msg_descs[t].type)) return (msg_type_t)t;
    return MSG_UNKNOWN;
}

const char *msg_type_name(msg_type_t t) { return t >= 0 && t < MSG_UNKNOWN ? msg_descs[t].type : "?"; }

uint64_t msg_heartbeat_incoming(const wire_msg_t *m) {
    uint64_t in = 0;
    uint32_t at = m->has_head ? wire_tok_find(&m->tok, wire_msg_head(m), 0, "incoming") : 0;
    return at && wire_tok_u64(&m->tok, at, &in) ? in : 0;
}

int msg_recv(void *sock, bool router, int flags, wire_msg_t *m, wire_err_t *err) {
    return wire_recv_as(sock, router, flags, m, err, false);
}

/* ---- decoding ------------------------------------------------------------------ */

typedef struct {
    wire_msg_t *m;
    const wire_toks_t *tk;
    const void *h;            /* the header bytes */
    const wire_tok_t *v;      /* the tokens */
    const char *type;
    wire_err_t *err;
} dec_t;

/* A field's place, "key" or "outer.key" or "outer[3].key": a chain on the
 * stack, formatted only when an error names it, never on the way through. */
typedef struct path {
    const struct path *up; /* the enclosing field; NULL at the top */
    const char *key;       /* unused for an array element */
    long index;            /* an array element's index, or -1 for a key */
} path_t;

static size_t path_put(const path_t *p, char *buf, size_t len) {
    size_t n = p->up ? path_put(p->up, buf, len) : 0;
    if (n + 1 >= len) return n;
    int w = p->index >= 0 ? snprintf(buf + n, len - n, "[%ld]", p->index)
                          : snprintf(buf + n, len - n, "%s%.40s", n ? "." : "", p->key);
    return w < 0 ? n : n + (size_t)w;
}

static void path_text(const path_t *p, char *buf, size_t len) {
    buf[0] = '\0';
    path_put(p, buf, len);
}

static int bad(dec_t *d, const path_t *p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(dec_t *d, const path_t *p, const char *fmt, ...) {
    char what[200], where[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    path_text(p, where, sizeof where);
    wire_set_err(d->err, WIRE_E_BAD_REQUEST, "'%s' %s", where, what);
    return -1;
}

static int oom(dec_t *d) {
    wire_set_err(d->err, WIRE_E_INTERNAL, "%s: out of memory decoding", d->type);
    return -1;
}

#define AT(base, off, T) ((T *)((char *)(base) + (off)))

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* The string of token i, or NULL when it is not one. */
static const char *str_of(const dec_t *d, uint32_t i, size_t *len) {
    return d->v[i].kind == WV_STR ? wire_tok_str(d->tk, d->h, i, len) : NULL;
}

/* Copies string token i into buf[size] when it is 1..max characters of
 * the name alphabet (max 0: size-1). */
static bool take_name(const dec_t *d, uint32_t i, char *buf, size_t size, uint64_t max) {
    size_t n;
    const char *s = str_of(d, i, &n);
    if (!max || max > size - 1) max = size - 1;
    if (!s || n == 0 || n > max || memchr(s, 0, n)) return false; /* a NUL would cut the name short */
    memcpy(buf, s, n);
    buf[n] = '\0';
    return reel_name_valid(buf, size);
}

/* Copies string token i into buf[size] when it fits and holds no NUL. */
static bool take_text(const dec_t *d, uint32_t i, char *buf, size_t size) {
    size_t n;
    const char *s = str_of(d, i, &n);
    if (!s || n >= size || memchr(s, 0, n)) return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return true;
}

/* Parses 1..16 hex digits of token i. */
static bool take_hash(const dec_t *d, uint32_t i, uint64_t *out) {
    size_t n;
    const char *s = str_of(d, i, &n);
    if (!s || n == 0 || n > 16) return false;
    uint64_t x = 0;
    for (size_t k = 0; k < n; k++) {
        if (!is_hex(s[k])) return false;
        char c = s[k];
        x = x << 4 | (uint64_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    *out = x;
    return true;
}

static int dec_table(dec_t *d, const msg_table_t *tab, uint32_t map, void *out, const path_t *up);

/* True for the keys every header starts with (wire.c reads them). */
static bool envelope_key(const char *ks, size_t kl) {
#define IS(lit) (kl == sizeof(lit) - 1 && !memcmp(ks, lit, kl))
    return IS("type") || IS("id") || IS("proto") || IS("tensors");
#undef IS
}

/* The row of tab whose key is ks[0..kl), looked for from row `from` on
 * (wrapping): a message written in table order finds each key at the
 * first try. -1 when no row has it. */
static int msg_field_index(const msg_table_t *tab, const char *ks, size_t kl, int from) {
    for (int c = 0, r = from; c < tab->n; c++, r = r + 1 < tab->n ? r + 1 : 0) {
        const msg_field_t *f = &tab->f[r];
        if (f->klen == kl && ks[0] == f->key[0] && !memcmp(f->key, ks, kl)) return r;
    }
    return -1;
}


/* The capacity of a counts map member of `size` bytes. */
static int counts_cap(uint32_t size) {
    return (int)((size - offsetof(msg_counts_t, e)) / sizeof(msg_count_t));
}

static int dec_counts(dec_t *d, const msg_field_t *f, uint32_t i, void *base, const path_t *path) {
    int cap = counts_cap(f->size);
    int *n = AT(base, f->off, int);
    msg_count_t *e = AT(base, f->off + offsetof(msg_counts_t, e), msg_count_t);
    if (d->v[i].kind != WV_MAP) return bad(d, path, "must be a map of names to non-negative integers");
    if ((int)d->v[i].n > cap) return bad(d, path, "has more than %d entries", cap);
    for (uint32_t k = i + 1, j = 0; j < d->v[i].n; j++, k = d->v[k + 1].next) {
        if (!take_name(d, k, e[j].name, sizeof e[j].name, 0) || !wire_tok_u64(d->tk, k + 1, &e[j].n))
            return bad(d, path, "must be a map of names to non-negative integers");
    }
    *n = (int)d->v[i].n;
    return 0;
}

static int dec_texts(dec_t *d, const msg_field_t *f, uint32_t i, void *base, const path_t *path) {
    msg_texts_t *t = AT(base, f->off, msg_texts_t);
    if (d->v[i].kind != WV_MAP) return bad(d, path, "must be a map of names to strings");
    if (d->v[i].n > MSG_MAX_COMPONENTS) return bad(d, path, "has more than %d entries", MSG_MAX_COMPONENTS);
    for (uint32_t k = i + 1, j = 0; j < d->v[i].n; j++, k = d->v[k + 1].next) {
        if (!take_name(d, k, t->e[j].name, sizeof t->e[j].name, 0) ||
            !take_text(d, k + 1, t->e[j].text, sizeof t->e[j].text))
            return bad(d, path, "must be a map of names to strings of at most %zu bytes",
                       sizeof t->e[j].text - 1);
    }
    t->n = (int)d->v[i].n;
    return 0;
}

/* Arrays: hashes into a fixed array, names and structs into the arena. */
static int dec_array(dec_t *d, const msg_field_t *f, uint32_t i, void *base, const path_t *path) {
    if (d->v[i].kind != WV_ARR) return bad(d, path, "must be an array");
    uint32_t n = d->v[i].n;
    if (f->kind == FK_HASHES || f->kind == FK_U64S) {
        if (n > f->size / sizeof(uint64_t)) return bad(d, path, "has more than %zu entries", f->size / sizeof(uint64_t));
        if (n == 0 && (f->flags & F_NONEMPTY)) return bad(d, path, "must not be empty (leave it out instead)");
        for (uint32_t j = 0, k = i + 1; j < n; j++, k = d->v[k].next) {
            uint64_t *x = AT(base, f->off, uint64_t) + j;
            if (f->kind == FK_HASHES && !take_hash(d, k, x)) return bad(d, path, "must be an array of hex hashes");
            if (f->kind == FK_U64S && !wire_tok_u64(d->tk, k, x))
                return bad(d, path, "must be an array of non-negative integers");
        }
        *AT(base, f->off2, int) = (int)n;
        return 0;
    }
    size_t elem = f->kind == FK_NAMES ? MSG_NAME_MAX : f->sub->size;
    char *arr = n ? wire_msg_alloc(d->m, n * elem) : NULL;
    if (n && !arr) return oom(d);
    for (uint32_t j = 0, k = i + 1; j < n; j++, k = d->v[k].next) {
        if (f->kind == FK_NAMES) {
            if (!take_name(d, k, arr + j * elem, MSG_NAME_MAX, 0))
                return bad(d, path, "must be an array of names of [A-Za-z0-9_.:+-]");
            continue;
        }
        const path_t at = { path, "", (long)j };
        if (d->v[k].kind != WV_MAP) return bad(d, &at, "must be a map");
        if (dec_table(d, f->sub, k, arr + j * elem, &at) != 0) return -1;
    }
    *AT(base, f->off, void *) = arr;
    *AT(base, f->off2, size_t) = n;
    return 0;
}

/* Field f of base from its value token i. */
static int dec_field(dec_t *d, const msg_field_t *f, uint32_t i, void *base, const path_t *path) {
    size_t n;
    switch ((msg_kind_t)f->kind) {
    case FK_U64: {
        uint64_t *x = AT(base, f->off, uint64_t);
        if (!wire_tok_u64(d->tk, i, x)) return bad(d, path, "must be a non-negative integer");
        if (*x < f->lo || *x > f->hi)
            return bad(d, path, "must be in %llu..%llu (got %llu)", (unsigned long long)f->lo,
                       (unsigned long long)f->hi, (unsigned long long)*x);
        return 0;
    }
    case FK_I64:
        return wire_tok_i64(d->tk, i, AT(base, f->off, int64_t)) ? 0 : bad(d, path, "must be an integer");
    case FK_F64: {
        double *x = AT(base, f->off, double);
        return wire_tok_f64(d->tk, i, x) && isfinite(*x) ? 0 : bad(d, path, "must be a finite number");
    }
    case FK_BOOL:
        if (d->v[i].kind != WV_BOOL) return bad(d, path, "must be a boolean");
        *AT(base, f->off, bool) = d->v[i].v.b;
        return 0;
    case FK_NAME:
        return take_name(d, i, AT(base, f->off, char), f->size, f->hi)
                   ? 0
                   : bad(d, path, "must be 1..%llu characters of [A-Za-z0-9_.:+-]",
                         (unsigned long long)(f->hi ? f->hi : f->size - 1));
    case FK_TEXT:
        return take_text(d, i, AT(base, f->off, char), f->size)
                   ? 0
                   : bad(d, path, "must be a string of at most %u bytes without NUL", f->size - 1);
    case FK_SHA256: {
        char *s = AT(base, f->off, char);
        return take_text(d, i, s, f->size) && msg_sha256_valid(s) ? 0 : bad(d, path, "must be 64 hex digits");
    }
    case FK_HASH:
        return take_hash(d, i, AT(base, f->off, uint64_t)) ? 0 : bad(d, path, "must be 1..16 hex digits");
    case FK_STR: {
        const char *s = str_of(d, i, &n);
        if (!s || memchr(s, 0, n)) return bad(d, path, "must be a string without NUL");
        char *c = wire_msg_alloc(d->m, n + 1);
        if (!c) return oom(d);
        memcpy(c, s, n);
        *AT(base, f->off, const char *) = c;
        return 0;
    }
    case FK_SHAPE4: {
        int64_t *s = AT(base, f->off, int64_t);
        bool ok = d->v[i].kind == WV_ARR && d->v[i].n == 4;
        for (uint32_t j = 0, k = i + 1; ok && j < 4; j++, k = d->v[k].next) ok = wire_tok_i64(d->tk, k, &s[j]) && s[j] >= 0;
        return ok ? 0 : bad(d, path, "must be an array [C,F,H,W] of 4 non-negative integers");
    }
    case FK_COUNTS: return dec_counts(d, f, i, base, path);
    case FK_TEXTS: return dec_texts(d, f, i, base, path);
    case FK_HASHES:
    case FK_U64S:
    case FK_NAMES:
    case FK_STRUCTS: return dec_array(d, f, i, base, path);
    case FK_STRUCT: {
        if (d->v[i].kind != WV_MAP) return bad(d, path, "must be a map");
        return dec_table(d, f->sub, i, AT(base, f->off, void), path);
    }
    }
    return bad(d, path, "has a kind this decoder does not know");
}

/* Writes the defaults of tab's fields into out (already zeroed). */
static void defaults(const msg_table_t *tab, void *out) {
    for (int r = 0; r < tab->n; r++) {
        const msg_field_t *f = &tab->f[r];
        switch ((msg_kind_t)f->kind) {
        case FK_U64: *AT(out, f->off, uint64_t) = (uint64_t)f->def; break;
        case FK_I64: *AT(out, f->off, int64_t) = (int64_t)f->def; break;
        case FK_F64: *AT(out, f->off, double) = f->def; break;
        case FK_BOOL: *AT(out, f->off, bool) = f->def != 0; break;
        case FK_NAME:
        case FK_TEXT:
            if (f->sdef) snprintf(AT(out, f->off, char), f->size, "%s", f->sdef);
            break;
        case FK_STR: *AT(out, f->off, const char *) = ""; break;
        case FK_STRUCT: defaults(f->sub, AT(out, f->off, void)); break;
        default: break;
        }
    }
}

/* Decodes map token `map` into out (zeroed) by tab. Unknown keys are
 * skipped; every required row must be met. */
static int dec_table(dec_t *d, const msg_table_t *tab, uint32_t map, void *out, const path_t *up) {
    uint32_t seen = 0;
    defaults(tab, out);
    int r = 0; /* where the next key is looked for first: senders write fields in table order */
    for (uint32_t j = 0, k = map + 1; j < d->v[map].n; j++, k = d->v[k + 1].next) {
        size_t kl;
        const char *ks = wire_tok_str(d->tk, d->h, k, &kl);
        if (!up && envelope_key(ks, kl)) continue; /* read by wire.c */
        if ((r = msg_field_index(tab, ks, kl, r)) < 0) {
            r = 0;
            continue; /* not a field of this message: ignored */
        }
        const msg_field_t *f = &tab->f[r];
        const path_t at = { up, f->key, -1 };
        if (dec_field(d, f, k + 1, out, &at) != 0) return -1;
        seen |= 1u << r;
        r = r + 1 < tab->n ? r + 1 : 0;
    }
    for (int r = 0; r < tab->n; r++)
        if ((tab->f[r].flags & F_REQ) && !(seen & (1u << r))) {
            char where[160];
            const path_t at = { up, tab->f[r].key, -1 };
            path_text(&at, where, sizeof where);
            wire_set_err(d->err, WIRE_E_BAD_REQUEST, "missing '%s'", where);
            return -1;
        }
    return 0;
}

/* Hands the message's tensors to the body's slots (or list). */
static int dec_tensors(dec_t *d, const msg_desc_t *desc, void *body) {
    if (desc->any_tensors) {
        msg_sync_t *s = body;
        s->n_tensors = d->m->n_tensors;
        for (int i = 0; i < d->m->n_tensors; i++) s->tensors[i] = &d->m->t[i];
        return 0;
    }
    for (int i = 0; i < d->m->n_tensors; i++) {
        const wire_tensor_t *t = &d->m->t[i];
        const msg_slot_t *s = desc->slots;
        while (s && s->name && strcmp(s->name, t->name)) s++;
        if (!s || !s->name) {
            if (desc->slot_list)
                wire_set_err(d->err, WIRE_E_BAD_REQUEST, "unknown tensor '%s' (a %s carries %s only)", t->name,
                             desc->type, desc->slot_list);
            else
                wire_set_err(d->err, WIRE_E_BAD_REQUEST, "%s carries no tensors (got '%s')", desc->type, t->name);
            return -1;
        }
        *AT(body, s->off, const wire_tensor_t *) = t;
    }
    return 0;
}

int msg_decode(wire_msg_t *m, msg_type_t type, void *body, wire_err_t *err) {
    if (type < 0 || type >= MSG_UNKNOWN || !m->has_head) {
        wire_set_err(err, WIRE_E_INTERNAL, "msg_decode: no such message");
        return -1;
    }
    const msg_desc_t *desc = &msg_descs[type];
    dec_t d = { m, &m->tok, wire_msg_head(m), wire_toks_v(&m->tok), desc->type, err };
    if (desc->body) {
        memset(body, 0, desc->body->size);
        if (dec_table(&d, desc->body, 0, body, NULL) != 0) return -1;
    }
    if (dec_tensors(&d, desc, body) != 0) return -1;
    if (desc->after) desc->after(body, m);
    return 0;
}

/* ---- encoding ------------------------------------------------------------------- */

static void enc_table(wire_buf_t *w, const msg_table_t *tab, const void *in);

/* True when field f of in holds its default or nothing (F_OMIT). */
static bool empty(const msg_field_t *f, const void *in) {
    switch ((msg_kind_t)f->kind) {
    case FK_U64: return *AT(in, f->off, const uint64_t) == (uint64_t)f->def;
    case FK_I64: return *AT(in, f->off, const int64_t) == (int64_t)f->def;
    case FK_F64: return *AT(in, f->off, const double) == f->def;
    case FK_BOOL: return *AT(in, f->off, const bool) == (f->def != 0);
    case FK_NAME:
    case FK_TEXT:
    case FK_SHA256: return !*AT(in, f->off, const char);
    case FK_HASH: return !*AT(in, f->off, const uint64_t);
    case FK_STR: {
        const char *s = *AT(in, f->off, const char *const);
        return !s || !*s;
    }
    case FK_COUNTS:
    case FK_TEXTS: return *AT(in, f->off, const int) == 0;
    case FK_HASHES:
    case FK_U64S: return *AT(in, f->off2, const int) == 0;
    case FK_NAMES:
    case FK_STRUCTS: return *AT(in, f->off2, const size_t) == 0;
    case FK_SHAPE4:
    case FK_STRUCT: return false;
    }
    return false;
}

static void enc_field(wire_buf_t *w, const msg_field_t *f, const void *in) {
    switch ((msg_kind_t)f->kind) {
    case FK_U64: wire_put_u64(w, *AT(in, f->off, const uint64_t)); break;
    case FK_I64: wire_put_i64(w, *AT(in, f->off, const int64_t)); break;
    case FK_F64: wire_put_f64(w, *AT(in, f->off, const double)); break;
    case FK_BOOL: wire_put_bool(w, *AT(in, f->off, const bool)); break;
    case FK_NAME:
    case FK_TEXT:
    case FK_SHA256: /* within its member's size: a repaired (U+FFFD) text grows */
        wire_put_text(w, AT(in, f->off, const char), strnlen(AT(in, f->off, const char), f->size), f->size - 1);
        break;
    case FK_HASH: {
        char hex[17];
        wire_put_strn(w, msg_hex64(*AT(in, f->off, const uint64_t), hex), 16);
        break;
    }
    case FK_STR: wire_put_str(w, *AT(in, f->off, const char *const)); break;
    case FK_SHAPE4:
        wire_put_arr(w);
        for (int k = 0; k < 4; k++) wire_put_i64(w, AT(in, f->off, const int64_t)[k]);
        wire_put_end(w);
        break;
    case FK_COUNTS: {
        int n = *AT(in, f->off, const int), cap = counts_cap(f->size);
        const msg_count_t *e = AT(in, f->off + offsetof(msg_counts_t, e), const msg_count_t);
        wire_put_map(w);
        for (int k = 0; k < n && k < cap; k++) {
            wire_put_str(w, e[k].name);
            wire_put_u64(w, e[k].n);
        }
        wire_put_end(w);
        break;
    }
    case FK_TEXTS: {
        const msg_texts_t *t = AT(in, f->off, const msg_texts_t);
        wire_put_map(w);
        for (int k = 0; k < t->n && k < MSG_MAX_COMPONENTS; k++) {
            wire_put_str(w, t->e[k].name);
            wire_put_text(w, t->e[k].text, strnlen(t->e[k].text, sizeof t->e[k].text), sizeof t->e[k].text - 1);
        }
        wire_put_end(w);
        break;
    }
    case FK_HASHES: {
        int n = *AT(in, f->off2, const int);
        wire_put_arr(w);
        for (int k = 0; k < n && (size_t)k < f->size / sizeof(uint64_t); k++) {
            char hex[17];
            wire_put_strn(w, msg_hex64(AT(in, f->off, const uint64_t)[k], hex), 16);
        }
        wire_put_end(w);
        break;
    }
    case FK_U64S: {
        int n = *AT(in, f->off2, const int);
        wire_put_arr(w);
        for (int k = 0; k < n && (size_t)k < f->size / sizeof(uint64_t); k++)
            wire_put_u64(w, AT(in, f->off, const uint64_t)[k]);
        wire_put_end(w);
        break;
    }
    case FK_NAMES:
    case FK_STRUCTS: {
        const char *arr = *AT(in, f->off, const char *const);
        size_t n = *AT(in, f->off2, const size_t);
        size_t elem = f->kind == FK_NAMES ? MSG_NAME_MAX : f->sub->size;
        wire_put_arr(w);
        for (size_t k = 0; k < n; k++) {
            if (f->kind == FK_NAMES) {
                wire_put_str(w, arr + k * elem);
            } else {
                wire_put_map(w);
                enc_table(w, f->sub, arr + k * elem);
                wire_put_end(w);
            }
        }
        wire_put_end(w);
        break;
    }
    case FK_STRUCT:
        wire_put_map(w);
        enc_table(w, f->sub, AT(in, f->off, const void));
        wire_put_end(w);
        break;
    }
}

static void enc_table(wire_buf_t *w, const msg_table_t *tab, const void *in) {
    for (int r = 0; r < tab->n; r++) {
        const msg_field_t *f = &tab->f[r];
        if ((f->flags & F_OMIT) && empty(f, in)) continue;
        wire_put_strn(w, f->key, f->klen);
        enc_field(w, f, in);
    }
}

/* The tensors of body, in slot order (or list order). */
static int tensors_of(const msg_desc_t *desc, const void *body, const wire_tensor_t **t) {
    int n = 0;
    if (!body) return 0;
    if (desc->any_tensors) {
        const msg_sync_t *s = body;
        for (int i = 0; i < s->n_tensors && i < WIRE_MAX_TENSORS; i++) t[n++] = s->tensors[i];
        return n;
    }
    for (const msg_slot_t *s = desc->slots; s && s->name; s++) {
        const wire_tensor_t *x = *AT(body, s->off, const wire_tensor_t *const);
        if (x) t[n++] = x;
    }
    return n;
}

/* Encodes the whole header into w (initialized). The tensors go to t[],
 * their count is returned. */
static int encode(wire_buf_t *w, msg_type_t type, uint64_t id, const void *body, const wire_tensor_t **t) {
    const msg_desc_t *desc = &msg_descs[type];
    int n = tensors_of(desc, body, t);
    wire_put_envelope(w, desc->type, id, t, n);
    if (desc->body && body) enc_table(w, desc->body, body);
    wire_put_end(w);
    return n;
}

int msg_send(void *sock, const zmq_msg_t *identity, msg_type_t type, uint64_t id, const void *body,
             const wire_msg_t *share) {
    return msg_send_keep(sock, identity, type, id, body, share, NULL);
}

int msg_send_keep(void *sock, const zmq_msg_t *identity, msg_type_t type, uint64_t id, const void *body,
                  const wire_msg_t *share, wire_parts_t *keep) {
    if (type < 0 || type >= MSG_UNKNOWN || (msg_descs[type].body && !body)) {
        errno = EINVAL;
        return -1;
    }
    wire_buf_t w;
    const wire_tensor_t *t[WIRE_MAX_TENSORS];
    wire_buf_init(&w);
    int n = encode(&w, type, id, body, t);
    int rc = wire_send_buf_keep(sock, identity, &w, t, n, share, keep);
    int e = errno;
    wire_buf_free(&w);
    errno = e;
    return rc;
}

unsigned char *msg_encode(msg_type_t type, uint64_t id, const void *body, size_t *len) {
    if (type < 0 || type >= MSG_UNKNOWN || (msg_descs[type].body && !body)) return NULL;
    wire_buf_t w;
    const wire_tensor_t *t[WIRE_MAX_TENSORS];
    wire_buf_init(&w);
    encode(&w, type, id, body, t);
    unsigned char *out = w.failed ? NULL : malloc(w.n);
    if (out) {
        memcpy(out, w.p, w.n);
        *len = w.n;
    }
    wire_buf_free(&w);
    return out;
}

/* ---- forwarding ------------------------------------------------------------------ */

/* Whether the received entry with key ks[0..kl) goes on: the envelope's
 * proto and tensors do, type and id are written anew, set's keys replace
 * it, and otherwise only keys of tab (the fields of the type) go on. */
static bool forwarded(const msg_table_t *tab, const msg_set_t *set, int n_set, const char *ks, size_t kl,
                      int *hint) {
#define IS(lit) (kl == sizeof(lit) - 1 && !memcmp(ks, lit, kl))
    if (IS("proto") || IS("tensors")) return true;
    if (IS("type") || IS("id")) return false;
#undef IS
    for (int i = 0; i < n_set; i++)
        if (set[i].key[0] == ks[0] && !strncmp(set[i].key, ks, kl) && set[i].key[kl] == '\0') return false;
    int r = tab && kl ? msg_field_index(tab, ks, kl, *hint) : -1;
    if (r >= 0) *hint = r + 1 < tab->n ? r + 1 : 0;
    return r >= 0;
}

static void put_set(wire_buf_t *w, const msg_set_t *s) {
    char hex[17];
    wire_put_str(w, s->key);
    switch (s->kind) {
    case MSG_SET_U64: wire_put_u64(w, s->u); break;
    case MSG_SET_NAME: wire_put_str(w, s->s); break;
    case MSG_SET_HASH: wire_put_strn(w, msg_hex64(s->u, hex), 16); break;
    }
}

/* The header of m, patched (see msg_forward), into w. -1 when m's header
 * does not parse as the tokenizer said it would (a bug, not a peer). */
static int patch(wire_buf_t *w, const wire_msg_t *m, const msg_desc_t *desc, uint64_t id, const msg_set_t *set,
                 int n_set) {
    const unsigned char *h = wire_msg_head(m);
    size_t hn = zmq_msg_size((zmq_msg_t *)&m->head);
    const wire_tok_t *v = wire_toks_v(&m->tok);
    if (v[0].kind != WV_MAP || v[0].next != m->tok.n) return -1;
    int hint = 0;
    wire_put_map(w);
    /* An entry's bytes run from its key's start to the next key's (the
     * root map ends the header: no bytes after it). */
    for (uint32_t j = 0, k = 1; j < v[0].n; j++, k = v[k + 1].next) {
        size_t start = v[k].at, end = v[k + 1].next < m->tok.n ? v[v[k + 1].next].at : hn, kl;
        if (start >= end || end > hn) return -1;
        const char *ks = wire_tok_str(&m->tok, h, k, &kl);
        if (forwarded(desc->body, set, n_set, ks, kl, &hint)) wire_put_raw(w, h + start, end - start, 2);
    }
    wire_put_strn(w, "type", 4);
    wire_put_str(w, desc->type);
    wire_put_strn(w, "id", 2);
    wire_put_u64(w, id);
    for (int i = 0; i < n_set; i++) put_set(w, &set[i]);
    wire_put_end(w);
    return 0;
}

int msg_forward(void *sock, const zmq_msg_t *identity, const wire_msg_t *m, msg_type_t type, uint64_t id,
                const msg_set_t *set, int n_set) {
    return msg_forward_keep(sock, identity, m, type, id, set, n_set, NULL);
}

int msg_forward_keep(void *sock, const zmq_msg_t *identity, const wire_msg_t *m, msg_type_t type, uint64_t id,
                     const msg_set_t *set, int n_set, wire_parts_t *keep) {
    if (type < 0 || type >= MSG_UNKNOWN || !m || !m->has_head || n_set < 0 || n_set > MSG_SET_MAX ||
        (n_set && !set)) {
        errno = EINVAL;
        return -1;
    }
    for (int i = 0; i < n_set; i++)
        if (!set[i].key || (set[i].kind == MSG_SET_NAME && !set[i].s)) {
            errno = EINVAL;
            return -1;
        }
    wire_buf_t w;
    wire_buf_init(&w);
    const wire_tensor_t *t[WIRE_MAX_TENSORS];
    for (int i = 0; i < m->n_tensors; i++) t[i] = &m->t[i];
    int rc = -1;
    if (patch(&w, m, &msg_descs[type], id, set, n_set) != 0) errno = EINVAL;
    else rc = wire_send_buf_keep(sock, identity, &w, t, m->n_tensors, m, keep);
    int e = errno;
    wire_buf_free(&w);
    errno = e;
    return rc;
}

int msg_send_verror(void *sock, const zmq_msg_t *identity, uint64_t id, const char *code, const char *fmt,
                    va_list ap) {
    msg_error_t e;
    snprintf(e.code, sizeof e.code, "%s", code);
    vsnprintf(e.message, 1024, fmt, ap);
    return msg_error_send(sock, identity, id, &e);
}

int msg_send_error(void *sock, const zmq_msg_t *identity, uint64_t id, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = msg_send_verror(sock, identity, id, code, fmt, ap);
    va_end(ap);
    return rc;
}
