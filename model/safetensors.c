/* safetensors.c -- safetensors reader and writer (see safetensors.h).
 *
 * The reader trusts nothing in the file: every length, offset and dim is
 * checked against the bytes actually held before a pointer is formed, so a
 * corrupt or hostile file yields a message, never an out-of-bounds read.
 * The header JSON is kept alive (jansson tree) because tensor names and
 * metadata strings point into it. */
#include "model/safetensors.h"
#include "model/stand_in.h"
#include "base/error.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Tensor bytes are handed out (and taken in) in host order; the format is
 * little-endian, and no byte swapping is done. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define ST_BUFFER_ORIGIN "safetensors buffer"

struct st_file {
    char *origin;          /* path, or ST_BUFFER_ORIGIN; prefixes messages */
    json_t *root;          /* owns every name and metadata string */
    json_t *meta;          /* borrowed from root; NULL when absent */
    unsigned char *data;   /* the data buffer (everything after the header) */
    size_t data_len;
    st_tensor_t *tensors;  /* sorted by data offset */
    size_t count;
};

/* ---- small helpers ---------------------------------------------------- */

static uint64_t load_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void store_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* numel * elem_size of a shape whose dims are known to be >= 0; -1 when
 * the product does not fit an int64 (file offsets are int64 in JSON). */
static int shape_bytes(int ndim, const int64_t *shape, size_t elem_size,
                       int64_t *out) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    if (n > INT64_MAX / (int64_t)elem_size) return -1;
    *out = n * (int64_t)elem_size;
    return 0;
}

/* Dtype names the format defines that Reel does not read, so the message
 * can say "unsupported" rather than "unknown". */
static int is_safetensors_dtype(const char *s) {
    static const char *const names[] = {
        "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16",
        "I32", "U32", "F64", "I64", "U64",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i])) return 1;
    return 0;
}

/* ---- reader ----------------------------------------------------------- */

/* Checks the header length field against what the file holds. */
static int check_header_len(const char *origin, uint64_t total, uint64_t hlen) {
    /* The length field's bytes are the file's first: a PyTorch checkpoint
     * (torch.save's zip, "PK\3\4", or its older pickle, 0x80 0x02) is
     * named as one, not as a corrupt safetensors file. */
    if (hlen > ST_MAX_HEADER_BYTES && ((hlen & 0xffffffffu) == 0x04034b50u || (hlen & 0xffffu) == 0x0280u))
        return reel_fail(REEL_E_INVALID, "%s: a PyTorch checkpoint (torch.save), not safetensors: this path reads "
                         "safetensors (a Wan2.1 DiT ships as diffusion_pytorch_model*.safetensors; a release's "
                         ".pth files are its text encoder and VAE, read by --t5 and --vae)", origin);
    if (hlen > ST_MAX_HEADER_BYTES)
        return reel_fail(REEL_E_INVALID, "%s: header length %llu is absurd (limit %llu bytes); "
                         "not a safetensors file or corrupt",
                         origin, (unsigned long long)hlen,
                         (unsigned long long)ST_MAX_HEADER_BYTES);
    if (hlen > total - 8)
        return reel_fail(REEL_E_INVALID, "%s: header length %llu runs past the end of the "
                         "file (%llu bytes after the length field); truncated?",
                         origin, (unsigned long long)hlen,
                         (unsigned long long)(total - 8));
    return 0;
}

static int check_min_len(const char *origin, uint64_t total) {
    if (total < 8)
        return reel_fail(REEL_E_INVALID, "%s: file is %llu bytes, shorter than the 8-byte "
                         "header length; truncated or not safetensors",
                         origin, (unsigned long long)total);
    return 0;
}

/* Reads a non-negative JSON integer; -1 (no message) when e is not one. */
static int json_nonneg(const json_t *e, int64_t *out) {
    if (!json_is_integer(e)) return -1;
    json_int_t v = json_integer_value(e);
    if (v < 0) return -1;
    *out = (int64_t)v;
    return 0;
}

/* Fills t (all but its data pointer) and *at (where its bytes begin) from
 * header entry e, checking it against a data buffer of data_len bytes. */
static int check_entry(const char *o, size_t data_len, const char *name, const json_t *e,
                       st_tensor_t *t, int64_t *at) {
    if (!json_is_object(e))
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": entry is not a JSON object", o, name);

    const json_t *jd = json_object_get(e, "dtype");
    const json_t *js = json_object_get(e, "shape");
    const json_t *jo = json_object_get(e, "data_offsets");
    if (!jd) return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": missing \"dtype\"", o, name);
    if (!js) return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": missing \"shape\"", o, name);
    if (!jo) return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": missing \"data_offsets\"", o, name);

    if (!json_is_string(jd))
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": \"dtype\" is not a string", o, name);
    const char *ds = json_string_value(jd);
    if (kern_dtype_parse(ds, &t->dtype) != 0) {
        if (is_safetensors_dtype(ds))
            return reel_fail(REEL_E_UNSUPPORTED, "%s: tensor \"%s\": unsupported dtype %s "
                             "(Reel reads F32, BF16, F16)", o, name, ds);
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": unknown dtype \"%s\"", o, name, ds);
    }

    if (!json_is_array(js))
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": \"shape\" is not an array", o, name);
    size_t nd = json_array_size(js);
    if (nd > KERN_MAX_DIMS)
        return reel_fail(REEL_E_LIMIT, "%s: tensor \"%s\": %zu dims, more than the %d supported",
                         o, name, nd, KERN_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++)
        if (json_nonneg(json_array_get(js, i), &t->shape[i]) != 0)
            return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": shape[%zu] is not a "
                             "non-negative integer", o, name, i);
    int64_t want;
    if (shape_bytes(t->ndim, t->shape, kern_dtype_size(t->dtype), &want) != 0) {
        char sb[128];
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": shape %s of %s overflows a 64-bit "
                         "byte count", o, name,
                         kern_shape_text(t->ndim, t->shape, sb, sizeof sb), ds);
    }

    int64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        json_nonneg(json_array_get(jo, 0), &begin) != 0 ||
        json_nonneg(json_array_get(jo, 1), &end) != 0)
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": \"data_offsets\" is not "
                         "[begin, end] of non-negative integers", o, name);
    if (begin > end)
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": data_offsets [%lld,%lld] end "
                         "before they begin", o, name, (long long)begin,
                         (long long)end);
    if ((uint64_t)end > data_len)
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": data_offsets [%lld,%lld] run past "
                         "the %zu-byte data buffer", o, name, (long long)begin,
                         (long long)end, data_len);
    if (end - begin != want) {
        char sb[128];
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": data_offsets [%lld,%lld] span %lld "
                         "bytes, but %s %s needs %lld", o, name, (long long)begin,
                         (long long)end, (long long)(end - begin), ds,
                         kern_shape_text(t->ndim, t->shape, sb, sizeof sb),
                         (long long)want);
    }
    t->name = name;
    t->data = NULL;
    t->nbytes = (size_t)want;
    *at = begin;
    return 0;
}

/* Fills t from header entry e, checking it against the data buffer. */
static int parse_entry(const st_file_t *f, const char *name, const json_t *e,
                       st_tensor_t *t) {
    int64_t begin;
    if (check_entry(f->origin, f->data_len, name, e, t, &begin) != 0) return -1;
    t->data = f->data + begin;
    return 0;
}

static int cmp_by_offset(const void *a, const void *b) {
    const st_tensor_t *x = a, *y = b;
    const unsigned char *px = x->data, *py = y->data;
    if (px != py) return px < py ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Byte ranges may leave gaps but never share a byte. Empty tensors occupy
 * nothing, so they overlap nothing. Requires tensors sorted by offset. */
static int check_overlap(const st_file_t *f) {
    const st_tensor_t *reach = NULL;  /* the non-empty range ending last */
    for (size_t i = 0; i < f->count; i++) {
        const st_tensor_t *t = &f->tensors[i];
        if (t->nbytes == 0) continue;
        const unsigned char *b = t->data;
        if (reach && b < (const unsigned char *)reach->data + reach->nbytes)
            return reel_fail(REEL_E_INVALID, "%s: tensors \"%s\" [%td,%td] and \"%s\" [%td,%td] "
                             "overlap", f->origin, reach->name,
                             (const unsigned char *)reach->data - f->data,
                             (const unsigned char *)reach->data - f->data +
                                 (ptrdiff_t)reach->nbytes,
                             t->name, b - f->data,
                             b - f->data + (ptrdiff_t)t->nbytes);
        if (!reach || b + t->nbytes >
                          (const unsigned char *)reach->data + reach->nbytes)
            reach = t;
    }
    return 0;
}

static int parse_metadata(const char *origin, const json_t *m) {
    if (!json_is_object(m))
        return reel_fail(REEL_E_INVALID, "%s: \"__metadata__\" is not a JSON object", origin);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)m, k, v)
        if (!json_is_string(v))
            return reel_fail(REEL_E_INVALID, "%s: \"__metadata__\" value for \"%s\" is not a "
                             "string", origin, k);
    return 0;
}

/* Parses header text into a JSON object, the messages st_open gives. */
static json_t *load_header_json(const char *origin, const char *hdr, size_t hlen) {
    json_error_t je;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_duplicate_key)
            reel_fail(REEL_E_INVALID, "%s: duplicate tensor name in header: %s", origin, je.text);
        else
            reel_fail(REEL_E_INVALID, "%s: header is not valid JSON: %s (line %d, column %d)",
                      origin, je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        reel_fail(REEL_E_INVALID, "%s: header is not a JSON object", origin);
        json_decref(root);
        return NULL;
    }
    return root;
}

/* Builds a file from the header bytes and the data buffer. Takes ownership
 * of data (freed on failure too); hdr is only read. */
static st_file_t *parse_parts(const char *origin, const char *hdr, size_t hlen,
                              unsigned char *data, size_t dlen) {
    st_file_t *f = calloc(1, sizeof *f);
    if (!f) {
        free(data);
        reel_fail(REEL_E_NOMEM, "%s: out of memory", origin);
        return NULL;
    }
    f->data = data;
    f->data_len = dlen;
    f->origin = strdup(origin);
    if (!f->origin) {
        reel_fail(REEL_E_NOMEM, "%s: out of memory", origin);
        goto err;
    }

    if (!(f->root = load_header_json(origin, hdr, hlen))) goto err;

    size_t n = json_object_size(f->root);
    f->meta = json_object_get(f->root, "__metadata__");
    if (f->meta) {
        if (parse_metadata(origin, f->meta) != 0) goto err;
        n--;
    }
    if (n > ST_MAX_TENSORS) {
        reel_fail(REEL_E_LIMIT, "%s: %zu tensors (at most %zu)", origin, n, ST_MAX_TENSORS);
        goto err;
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        reel_fail(REEL_E_NOMEM, "%s: out of memory for %zu tensors", origin, n);
        goto err;
    }
    const char *name;
    const json_t *e;
    json_object_foreach(f->root, name, e) {
        if (e == f->meta) continue;
        if (parse_entry(f, name, e, &f->tensors[f->count]) != 0) goto err;
        f->count++;
    }
    assert(f->count == n);
    qsort(f->tensors, f->count, sizeof *f->tensors, cmp_by_offset);
    if (check_overlap(f) != 0) goto err;
    return f;

err:
    st_close(&f);
    return NULL;
}

st_file_t *st_adopt(const char *origin, const char *hdr, size_t hlen, unsigned char *data, size_t dlen) {
    assert(origin && (hdr || hlen == 0));
    return parse_parts(origin, hdr, hlen, data, dlen);
}

unsigned char *st_take_data(st_file_t *f) {
    assert(f);
    unsigned char *d = f->data;
    f->data = NULL;
    return d;
}

st_file_t *st_parse(const void *buf, size_t len) {
    const unsigned char *p = buf;
    assert(buf || len == 0);
    if (stand_in_check(ST_BUFFER_ORIGIN, buf, len) != 0 || check_min_len(ST_BUFFER_ORIGIN, len) != 0) return NULL;
    uint64_t hlen = load_le64(p);
    if (check_header_len(ST_BUFFER_ORIGIN, len, hlen) != 0) return NULL;
    size_t dlen = len - 8 - (size_t)hlen;
    /* A separate malloc'd copy keeps offset-0 tensors maximally aligned. */
    unsigned char *data = malloc(dlen ? dlen : 1);
    if (!data) {
        reel_fail(REEL_E_NOMEM, "%s: out of memory for %zu data bytes", ST_BUFFER_ORIGIN, dlen);
        return NULL;
    }
    if (dlen) memcpy(data, p + 8 + hlen, dlen);
    return parse_parts(ST_BUFFER_ORIGIN, (const char *)p + 8, (size_t)hlen,
                       data, dlen);
}

/* Reads exactly len bytes at offset *off (advanced), handing every chunk
 * to hook (when set) in file order; -1 with a message on an error, an
 * early end of file, or a hook that says stop. */
static int read_at(int fd, const char *path, void *buf, size_t len, uint64_t *off,
                   st_read_hook_t hook, void *user) {
    unsigned char *p = buf;
    while (len) {
        /* Chunks small enough that a hook asked to stop is heard promptly. */
        size_t chunk = len > ((size_t)4 << 20) ? ((size_t)4 << 20) : len;
        ssize_t r = pread(fd, p, chunk, (off_t)*off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return reel_fail(REEL_E_IO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0) return reel_fail(REEL_E_IO, "%s: file shrank while being read", path);
        if (hook && hook(user, p, (size_t)r) != 0) return reel_fail(REEL_E_INVALID, "%s: reading stopped", path);
        p += r;
        *off += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

/* fstat: a regular file, at least the length field; *total its size. */
static int regular_size(int fd, const char *path, uint64_t *total) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) return reel_fail(REEL_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    /* A FIFO or a device has no size to check and may never end. */
    if (!S_ISREG(sb.st_mode)) return reel_fail(REEL_E_INVALID, "%s: not a regular file", path);
    *total = (uint64_t)sb.st_size;
    /* a Git LFS pointer or a saved web page is named as one (stand_in.h);
     * this read is no part of the file's stream a hook sees */
    unsigned char head[STAND_IN_HEAD];
    size_t want = *total < sizeof head ? (size_t)*total : sizeof head;
    ssize_t r = want ? pread(fd, head, want, 0) : 0;
    if (r > 0 && stand_in_check(path, head, (size_t)r) != 0) return -1;
    return check_min_len(path, *total);
}

/* ---- headers read without their data ----------------------------------- */

struct st_header {
    char *text;            /* the header's JSON, as read */
    size_t hlen;
    uint64_t total;        /* the file's size when the header was read */
    uint64_t data_len;
    json_t *root;          /* owns every name and metadata string */
    json_t *meta;          /* borrowed from root; NULL when absent */
    st_entry_t *e;         /* sorted by begin */
    size_t count;
};

static int cmp_entry(const void *a, const void *b) {
    const st_entry_t *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* As check_overlap, over offsets. Requires entries sorted by begin. */
static int check_entries_overlap(const char *origin, const st_entry_t *e, size_t n) {
    const st_entry_t *reach = NULL;
    for (size_t i = 0; i < n; i++) {
        if (e[i].nbytes == 0) continue;
        if (reach && e[i].begin < reach->begin + reach->nbytes)
            return reel_fail(REEL_E_INVALID, "%s: tensors \"%s\" [%llu,%llu] and \"%s\" [%llu,%llu] overlap", origin, reach->name,
                             (unsigned long long)reach->begin, (unsigned long long)(reach->begin + reach->nbytes),
                             e[i].name, (unsigned long long)e[i].begin,
                             (unsigned long long)(e[i].begin + e[i].nbytes));
        if (!reach || e[i].begin + e[i].nbytes > reach->begin + reach->nbytes) reach = &e[i];
    }
    return 0;
}

void st_header_free(st_header_t **hp) {
    if (!hp || !*hp) return;
    st_header_t *h = *hp;
    free(h->text);
    free(h->e);
    json_decref(h->root);
    free(h);
    *hp = NULL;
}

st_header_t *st_header_read(int fd, const char *path, st_read_hook_t hook, void *user) {
    assert(path);
    uint64_t total, off = 0;
    if (regular_size(fd, path, &total) != 0) return NULL;
    unsigned char lenbuf[8];
    if (read_at(fd, path, lenbuf, sizeof lenbuf, &off, hook, user) != 0) return NULL;
    uint64_t hlen = load_le64(lenbuf);
    if (check_header_len(path, total, hlen) != 0) return NULL;
    st_header_t *h = calloc(1, sizeof *h);
    if (!h || !(h->text = malloc(hlen ? (size_t)hlen : 1))) {
        free(h);
        reel_fail(REEL_E_NOMEM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)hlen);
        return NULL;
    }
    h->hlen = (size_t)hlen;
    h->total = total;
    h->data_len = total - 8 - hlen;
    if (read_at(fd, path, h->text, h->hlen, &off, hook, user) != 0) goto err;
    if (!(h->root = load_header_json(path, h->text, h->hlen))) goto err;
    size_t n = json_object_size(h->root);
    h->meta = json_object_get(h->root, "__metadata__");
    if (h->meta) {
        if (parse_metadata(path, h->meta) != 0) goto err;
        n--;
    }
    if (n > ST_MAX_TENSORS) {
        reel_fail(REEL_E_LIMIT, "%s: %zu tensors (at most %zu)", path, n, ST_MAX_TENSORS);
        goto err;
    }
    if (!(h->e = calloc(n ? n : 1, sizeof *h->e))) {
        reel_fail(REEL_E_NOMEM, "%s: out of memory for %zu tensors", path, n);
        goto err;
    }
    const char *name;
    const json_t *v;
    json_object_foreach(h->root, name, v) {
        if (v == h->meta) continue;
        st_tensor_t t;
        int64_t begin;
        if (check_entry(path, (size_t)h->data_len, name, v, &t, &begin) != 0) goto err;
        st_entry_t *e = &h->e[h->count++];
        e->name = name;
        e->dtype = t.dtype;
        e->ndim = t.ndim;
        memcpy(e->shape, t.shape, sizeof e->shape);
        e->begin = (uint64_t)begin;
        e->nbytes = t.nbytes;
    }
    qsort(h->e, h->count, sizeof *h->e, cmp_entry);
    if (check_entries_overlap(path, h->e, h->count) != 0) goto err;
    return h;
err:
    st_header_free(&h);
    return NULL;
}

int st_header_read_data(const st_header_t *h, int fd, const char *path, void *dst, st_read_hook_t hook, void *user) {
    assert(h && path);
    struct stat sb;
    if (fstat(fd, &sb) != 0) return reel_fail(REEL_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    if ((uint64_t)sb.st_size != h->total)
        return reel_fail(REEL_E_IO, "%s: changed size while being read (%llu bytes, %llu when its header was read)", path,
                         (unsigned long long)sb.st_size, (unsigned long long)h->total);
    if (h->data_len > SIZE_MAX) return reel_fail(REEL_E_INVALID, "%s: %llu data bytes do not fit in memory", path,
                                                 (unsigned long long)h->data_len);
    uint64_t off = 8 + h->hlen;
    if (dst) return read_at(fd, path, dst, (size_t)h->data_len, &off, hook, user);
    /* Hashing without keeping: through one scratch chunk. */
    size_t chunk = (size_t)4 << 20;
    unsigned char *buf = malloc(chunk);
    if (!buf) return reel_fail(REEL_E_NOMEM, "%s: out of memory", path);
    int rc = 0;
    for (uint64_t left = h->data_len; rc == 0 && left;) {
        size_t n = left < chunk ? (size_t)left : chunk;
        rc = read_at(fd, path, buf, n, &off, hook, user);
        left -= n;
    }
    free(buf);
    return rc;
}

size_t st_header_count(const st_header_t *h) {
    assert(h);
    return h->count;
}

const st_entry_t *st_header_at(const st_header_t *h, size_t i) {
    assert(h);
    return i < h->count ? &h->e[i] : NULL;
}

const char *st_header_meta(const st_header_t *h, const char *key) {
    assert(h && key);
    return h->meta ? json_string_value(json_object_get(h->meta, key)) : NULL;
}

const char *st_header_text(const st_header_t *h, size_t *hlen) {
    assert(h && hlen);
    *hlen = h->hlen;
    return h->text;
}

uint64_t st_header_data_len(const st_header_t *h) {
    assert(h);
    return h->data_len;
}

int st_probe_fd(int fd, const char *path, st_probe_t *out) {
    assert(path && out);
    memset(out, 0, sizeof *out);
    st_header_t *h = st_header_read(fd, path, NULL, NULL);
    if (!h) return -1;
    out->header_len = h->hlen;
    out->data_len = h->data_len;
    out->count = h->count;
    for (size_t i = 0; i < h->count; i++) {
        out->bytes += h->e[i].nbytes;
        if (h->e[i].begin + h->e[i].nbytes > out->data_end) out->data_end = h->e[i].begin + h->e[i].nbytes;
    }
    st_header_free(&h);
    return 0;
}

st_file_t *st_open_fd(int fd, const char *path, st_read_hook_t hook, void *user) {
    assert(path);
    char *hdr = NULL;
    unsigned char *data = NULL;
    uint64_t total, off = 0;
    if (regular_size(fd, path, &total) != 0) return NULL;
    unsigned char lenbuf[8];
    if (read_at(fd, path, lenbuf, sizeof lenbuf, &off, hook, user) != 0) return NULL;
    uint64_t hlen = load_le64(lenbuf);
    if (check_header_len(path, total, hlen) != 0) return NULL;
    if (total > SIZE_MAX) {
        reel_fail(REEL_E_INVALID, "%s: %llu bytes do not fit in memory", path,
                  (unsigned long long)total);
        return NULL;
    }
    size_t dlen = (size_t)(total - 8 - hlen);
    /* Header and data are read into separate buffers so the data starts
     * malloc-aligned without holding the file twice. */
    hdr = malloc(hlen ? (size_t)hlen : 1);
    data = malloc(dlen ? dlen : 1);
    if (!hdr || !data) {
        reel_fail(REEL_E_NOMEM, "%s: out of memory for %llu bytes", path,
                  (unsigned long long)total);
        goto err;
    }
    if (read_at(fd, path, hdr, (size_t)hlen, &off, hook, user) != 0) goto err;
    if (read_at(fd, path, data, dlen, &off, hook, user) != 0) goto err;
    st_file_t *f = parse_parts(path, hdr, (size_t)hlen, data, dlen);
    free(hdr);
    return f;

err:
    free(hdr);
    free(data);
    return NULL;
}

st_file_t *st_open(const char *path) {
    assert(path);
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; st_open_fd
     * then refuses anything but a regular file. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        reel_fail(REEL_E_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    st_file_t *f = st_open_fd(fd, path, NULL, NULL);
    close(fd);
    return f;
}

void st_close(st_file_t **f) {
    if (!f || !*f) return;
    st_file_t *x = *f;
    free(x->tensors);
    json_decref(x->root);
    free(x->data);
    free(x->origin);
    free(x);
    *f = NULL;
}

const char *st_origin(const st_file_t *f) {
    assert(f);
    return f->origin;
}

size_t st_data_len(const st_file_t *f) {
    assert(f);
    return f->data_len;
}

uint64_t st_offset(const st_file_t *f, const st_tensor_t *t) {
    assert(f && t && (t->nbytes == 0 || (const unsigned char *)t->data >= f->data));
    return (uint64_t)((const unsigned char *)t->data - f->data);
}

size_t st_count(const st_file_t *f) {
    assert(f);
    return f->count;
}

const st_tensor_t *st_at(const st_file_t *f, size_t i) {
    assert(f);
    return i < f->count ? &f->tensors[i] : NULL;
}

const st_tensor_t *st_find(const st_file_t *f, const char *name) {
    assert(f && name);
    for (size_t i = 0; i < f->count; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *st_meta(const st_file_t *f, const char *key) {
    assert(f && key);
    return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

int st_read_f32(const st_file_t *f, const char *name, int ndim,
                const int64_t *shape, float *dst) {
    assert(f && name && (ndim <= 0 || shape));
    const st_tensor_t *t = st_find(f, name);
    if (!t) return reel_fail(REEL_E_NOT_FOUND, "%s: %s: no such tensor", f->origin, name);
    if (ndim >= 0) {
        int same = t->ndim == ndim;
        for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
        if (!same) {
            char got[128], want[128];
            return reel_fail(REEL_E_INVALID, "%s: %s: shape %s, expected %s", f->origin, name,
                             kern_shape_text(t->ndim, t->shape, got, sizeof got),
                             kern_shape_text(ndim, shape, want, sizeof want));
        }
    }
    size_t n = t->nbytes / kern_dtype_size(t->dtype);
    const unsigned char *p = t->data;
    assert(dst || n == 0);
    /* memcpy per element: p need not be aligned (see safetensors.h). */
    switch (t->dtype) {
    case KERN_F32:
        if (n) memcpy(dst, p, n * sizeof *dst);
        return 0;
    case KERN_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = kern_bf16_to_f32(h);
        }
        return 0;
    case KERN_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = kern_f16_to_f32(h);
        }
        return 0;
    default:
        return reel_fail(REEL_E_UNSUPPORTED, "%s: %s: unsupported dtype %s", f->origin, name,
                         kern_dtype_name(t->dtype));
    }
}

/* ---- writer ----------------------------------------------------------- */

typedef struct {
    char *name;
    kern_dtype_t dtype;
    int ndim;
    int64_t shape[KERN_MAX_DIMS];
    void *data;
    size_t nbytes;
} wr_entry_t;

struct st_writer {
    wr_entry_t *v;
    size_t n, cap;
    int64_t total;   /* sum of nbytes; kept <= INT64_MAX for JSON offsets */
    json_t *meta;    /* object of strings, in insertion order */
};

st_writer_t *st_writer_new(void) {
    st_writer_t *w = calloc(1, sizeof *w);
    if (!w) goto err;
    w->meta = json_object();
    if (!w->meta) goto err;
    return w;
err:
    st_writer_destroy(&w);
    reel_fail(REEL_E_NOMEM, "st_writer_new: out of memory");
    return NULL;
}

void st_writer_destroy(st_writer_t **w) {
    if (!w || !*w) return;
    st_writer_t *x = *w;
    for (size_t i = 0; i < x->n; i++) {
        free(x->v[i].name);
        free(x->v[i].data);
    }
    free(x->v);
    json_decref(x->meta);
    free(x);
    *w = NULL;
}

/* jansson refuses strings that are not UTF-8; ask it now rather than fail
 * at save time, far from the caller that passed the bad name. */
static int is_utf8(const char *s) {
    json_t *j = json_string(s);
    if (!j) return 0;
    json_decref(j);
    return 1;
}

int st_writer_add(st_writer_t *w, const char *name, kern_dtype_t dt, int ndim,
                  const int64_t *shape, const void *data) {
    assert(w && name);
    if (!strcmp(name, "__metadata__") || !is_utf8(name))
        return reel_fail(REEL_E_INVALID, "st_writer_add: \"%s\" is not a usable tensor name", name);
    if ((int)dt < 0 || dt >= KERN_DTYPE_COUNT)
        return reel_fail(REEL_E_INVALID, "st_writer_add: %s: dtype %d is not F32, BF16 or F16",
                         name, (int)dt);
    if (ndim < 0 || ndim > KERN_MAX_DIMS)
        return reel_fail(REEL_E_INVALID, "st_writer_add: %s: %d dims, expected 0..%d", name,
                         ndim, KERN_MAX_DIMS);
    assert(shape || ndim == 0);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return reel_fail(REEL_E_INVALID, "st_writer_add: %s: shape[%d] = %lld is negative",
                             name, i, (long long)shape[i]);
    int64_t nb;
    if (shape_bytes(ndim, shape, kern_dtype_size(dt), &nb) != 0 ||
        nb > INT64_MAX - w->total || (uint64_t)nb > SIZE_MAX) {
        char sb[128];
        return reel_fail(REEL_E_LIMIT, "st_writer_add: %s: shape %s is too large", name,
                         kern_shape_text(ndim, shape, sb, sizeof sb));
    }
    assert(data || nb == 0);
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->v[i].name, name))
            return reel_fail(REEL_E_INVALID, "st_writer_add: %s: duplicate tensor name", name);

    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        wr_entry_t *v = realloc(w->v, cap * sizeof *v);
        if (!v) return reel_fail(REEL_E_NOMEM, "st_writer_add: %s: out of memory", name);
        w->v = v;
        w->cap = cap;
    }
    wr_entry_t *e = &w->v[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    e->data = malloc(nb ? (size_t)nb : 1);
    if (!e->name || !e->data) {
        free(e->name);
        free(e->data);
        return reel_fail(REEL_E_NOMEM, "st_writer_add: %s: out of memory for %lld bytes",
                         name, (long long)nb);
    }
    if (nb) memcpy(e->data, data, (size_t)nb);
    e->dtype = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = (size_t)nb;
    w->total += nb;
    w->n++;
    return 0;
}

int st_writer_add_f32(st_writer_t *w, const char *name, int ndim,
                      const int64_t *shape, const float *data) {
    return st_writer_add(w, name, KERN_F32, ndim, shape, data);
}

int st_writer_meta(st_writer_t *w, const char *key, const char *value) {
    assert(w && key && value);
    json_t *v = json_string(value);
    if (!v)
        return reel_fail(REEL_E_INVALID, "st_writer_meta: value for \"%s\" is not valid UTF-8", key);
    /* json_object_set_new steals v even when it fails. */
    if (json_object_set_new(w->meta, key, v) != 0)
        return reel_fail(REEL_E_INVALID, "st_writer_meta: key \"%s\" is not valid UTF-8 "
                         "(or out of memory)", key);
    return 0;
}

/* The header JSON, padded with spaces to a multiple of 8 bytes; malloc'd,
 * length in *len. NULL with a message on failure. */
static char *dump_header(const json_t *root, size_t *len) {
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER), *out = NULL;
    size_t n = s ? strlen(s) : 0, padded = (n + 7) & ~(size_t)7;
    if (s && (out = malloc(padded ? padded : 1))) {
        memcpy(out, s, n);
        memset(out + n, ' ', padded - n);
        *len = padded;
    } else {
        reel_fail(REEL_E_NOMEM, "st_writer_save: out of memory building the header");
    }
    free(s);
    return out;
}

static char *build_header(const st_writer_t *w, size_t *len) {
    json_t *root = json_object();
    char *out = NULL;
    if (!root) goto oom;
    if (json_object_size(w->meta) &&
        json_object_set(root, "__metadata__", w->meta) != 0)
        goto oom;
    int64_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        const wr_entry_t *e = &w->v[i];
        json_t *shape = json_array();
        if (!shape) goto oom;
        for (int d = 0; d < e->ndim; d++)
            if (json_array_append_new(shape, json_integer(e->shape[d])) != 0) {
                json_decref(shape);
                goto oom;
            }
        /* "o" steals shape, on failure too. */
        json_t *entry = json_pack("{s:s, s:o, s:[I,I]}",
                                  "dtype", kern_dtype_name(e->dtype),
                                  "shape", shape,
                                  "data_offsets", (json_int_t)off,
                                  (json_int_t)(off + (int64_t)e->nbytes));
        if (!entry || json_object_set_new(root, e->name, entry) != 0) goto oom;
        off += (int64_t)e->nbytes;
    }
    out = dump_header(root, len);
    json_decref(root);
    return out;
oom:
    json_decref(root);
    reel_fail(REEL_E_NOMEM, "st_writer_save: out of memory building the header");
    return NULL;
}

static int write_full(int fd, const char *path, const void *buf, size_t len) {
    const unsigned char *p = buf;
    while (len) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t r = write(fd, p, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return reel_fail(REEL_E_IO, "%s: write failed: %s", path, strerror(errno));
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

/* Makes the rename itself durable. Best effort: a filesystem that cannot
 * fsync a directory still got a complete file. */
static void sync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path))
                      : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

/* Writes the length field, hdr and the n parts to path atomically (see
 * st_writer_save). */
static int save_parts(const char *path, const char *hdr, size_t hlen, const void *const *part, const size_t *plen,
                      size_t n) {
    /* The file goes in by rename: what stands at path is replaced, so only
     * a regular file may (a device, a FIFO or a symlink run over as root
     * would be lost: /dev/null turned into a file). */
    struct stat ps;
    if (lstat(path, &ps) == 0 && !S_ISREG(ps.st_mode))
        return reel_fail(REEL_E_INVALID, "%s: exists and is not a regular file (a device, FIFO, directory or symlink is never "
                         "replaced)", path);
    size_t plen_path = strlen(path);
    char *tmp = malloc(plen_path + 5);
    if (!tmp) return reel_fail(REEL_E_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, plen_path);
    memcpy(tmp + plen_path, ".tmp", 5);

    int rc = -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        reel_fail(REEL_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    unsigned char lenbuf[8];
    store_le64(lenbuf, hlen);
    if (write_full(fd, tmp, lenbuf, sizeof lenbuf) != 0 ||
        write_full(fd, tmp, hdr, hlen) != 0)
        goto fail;
    for (size_t i = 0; i < n; i++)
        if (write_full(fd, tmp, part[i], plen[i]) != 0) goto fail;
    if (fsync(fd) != 0) {
        reel_fail(REEL_E_IO, "%s: fsync failed: %s", tmp, strerror(errno));
        goto fail;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        reel_fail(REEL_E_IO, "%s: close failed: %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        reel_fail(REEL_E_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
        goto fail;
    }
    sync_parent_dir(path);
    rc = 0;
    goto out;

fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
out:
    free(tmp);
    return rc;
}

int st_writer_save(st_writer_t *w, const char *path) {
    assert(w && path);
    struct stat ps;
    if (lstat(path, &ps) == 0 && !S_ISREG(ps.st_mode))
        return reel_fail(REEL_E_INVALID, "%s: exists and is not a regular file (a device, FIFO, directory or symlink is never "
                         "replaced)", path);
    size_t hlen;
    char *hdr = build_header(w, &hlen);
    if (!hdr) return -1;
    const void **part = malloc((w->n ? w->n : 1) * sizeof *part);
    size_t *plen = malloc((w->n ? w->n : 1) * sizeof *plen);
    int rc = -1;
    if (!part || !plen) {
        reel_fail(REEL_E_NOMEM, "%s: out of memory", path);
    } else {
        for (size_t i = 0; i < w->n; i++) {
            part[i] = w->v[i].data;
            plen[i] = w->v[i].nbytes;
        }
        rc = save_parts(path, hdr, hlen, part, plen, w->n);
    }
    free(part);
    free(plen);
    free(hdr);
    return rc;
}

int st_save(const st_file_t *f, const char *path) {
    assert(f && path);
    json_t *root = json_object();
    const void **part = malloc((f->count ? f->count : 1) * sizeof *part);
    size_t *plen = malloc((f->count ? f->count : 1) * sizeof *plen);
    char *hdr = NULL;
    size_t hlen = 0;
    int rc = -1;
    if (!root || !part || !plen || (f->meta && json_object_set(root, "__metadata__", f->meta) != 0)) goto oom;
    int64_t off = 0;
    for (size_t i = 0; i < f->count; i++) { /* data order: tensors back to back */
        const st_tensor_t *t = &f->tensors[i];
        json_t *shape = json_array();
        if (!shape) goto oom;
        for (int d = 0; d < t->ndim; d++)
            if (json_array_append_new(shape, json_integer(t->shape[d])) != 0) {
                json_decref(shape);
                goto oom;
            }
        json_t *entry = json_pack("{s:s, s:o, s:[I,I]}", "dtype", kern_dtype_name(t->dtype), "shape", shape,
                                  "data_offsets", (json_int_t)off, (json_int_t)(off + (int64_t)t->nbytes));
        if (!entry || json_object_set_new(root, t->name, entry) != 0) goto oom;
        part[i] = t->data;
        plen[i] = t->nbytes;
        off += (int64_t)t->nbytes;
    }
    if (!(hdr = dump_header(root, &hlen))) goto out;
    rc = save_parts(path, hdr, hlen, part, plen, f->count);
    goto out;
oom:
    reel_fail(REEL_E_NOMEM, "%s: out of memory building the header", path);
out:
    json_decref(root);
    free(part);
    free(plen);
    free(hdr);
    return rc;
}
