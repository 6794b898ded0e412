/* pth.c -- PyTorch `.pth` checkpoints read without unpickling (see pth.h).
 *
 * Three stages, each trusting nothing the one before has not checked:
 * the zip container (every entry stored, inside the file, apart from every
 * other, its local header agreeing with the central directory), the
 * pickle in `<root>/data.pkl` (a small stack machine that knows only the
 * opcodes and the handful of globals a saved state dict needs, so nothing
 * in the file is ever called), and the tensors (each view checked against
 * its storage record before a byte is copied). The data buffer handed to
 * st_adopt is allocated once and filled straight from the file: an 11 GB
 * checkpoint is never held twice. CRCs are not checked: no bound depends
 * on them, and a checksum pass over 11 GB would cost more than the load. */
#include "model/pth.h"
#include "model/stand_in.h"
#include "base/error.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pth.c assumes a little-endian host (torch stores little-endian storages)"
#endif

/* ---- little-endian fields ----------------------------------------------- */

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Grows *p (elements of size elem, *cap of them) to hold need; -1 with a
 * message on overflow or out of memory. */
static int grow(void *pp, size_t *cap, size_t need, size_t elem, const char *origin) {
    void **p = pp;
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2 / elem) return reel_fail(REEL_E_NOMEM, "%s: out of memory", origin);
        n *= 2;
    }
    void *q = realloc(*p, n * elem);
    if (!q) return reel_fail(REEL_E_NOMEM, "%s: out of memory", origin);
    *p = q;
    *cap = n;
    return 0;
}

/* Up to 64 bytes of s for a message, anything unprintable as '?'. */
static const char *printable(const unsigned char *s, size_t n, char *buf, size_t len) {
    size_t m = n < 64 ? n : 64;
    if (m >= len) m = len - 1;
    for (size_t i = 0; i < m; i++) buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    buf[m] = '\0';
    return buf;
}

/* ---- the archive's bytes: a file (pread) or a buffer ---------------------- */

typedef struct {
    const char *origin;
    int fd;                       /* -1: the bytes are at mem */
    const unsigned char *mem;
    uint64_t size;
} src_t;

/* Reads n bytes at off into dst; -1 with a message when the range is not
 * inside the source or the file cannot be read. */
static int src_read(const src_t *s, uint64_t off, void *dst, size_t n) {
    if (off > s->size || n > s->size - off)
        return reel_fail(REEL_E_INVALID, "%s: read of %zu bytes at %llu runs past the end (%llu bytes)",
                         s->origin, n, (unsigned long long)off, (unsigned long long)s->size);
    if (s->fd < 0) {
        if (n) memcpy(dst, s->mem + off, n);
        return 0;
    }
    unsigned char *p = dst;
    while (n) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t r = pread(s->fd, p, chunk, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return reel_fail_errno(REEL_E_IO, errno, "%s: read failed", s->origin);
        if (r == 0) return reel_fail(REEL_E_IO, "%s: file shrank while being read", s->origin);
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return 0;
}

/* ---- zip container ------------------------------------------------------ */

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_Z64_EOCD 0x06064b50u
#define SIG_Z64_LOCATOR 0x07064b50u
#define SIG_DESCRIPTOR 0x08074b50u
#define LOCAL_LEN 30
#define CENTRAL_LEN 46
#define EOCD_LEN 22
#define Z64_LOCATOR_LEN 20
#define Z64_EOCD_LEN 56
#define FLAG_ENCRYPTED 0x0001u
#define FLAG_DESCRIPTOR 0x0008u   /* sizes and CRC follow the data (torch sets it) */
#define MAX_CENTRAL_BYTES ((uint64_t)64 << 20)
#define U32_MAX_FIELD 0xffffffffu
#define LOCAL_HEADER_MAX (LOCAL_LEN + 2 * 65535)  /* fixed part, name, extra */

typedef struct {
    char *name;        /* NUL-terminated copy of the central directory's name */
    size_t name_len;
    uint64_t local;    /* the local header's offset */
    uint64_t size;     /* stored bytes (stored: compressed == uncompressed) */
    uint32_t crc;
    uint16_t flags, method;
    uint64_t data;     /* where the bytes start, once the local header is read */
    uint64_t end;      /* the end of what the entry occupies (a lower bound
                        * until the local header is read) */
} zent_t;

typedef struct {
    zent_t *e;
    size_t n;
    zent_t **by_name;  /* sorted by name, for lookups */
    uint64_t cd_start; /* entries must end at or before it */
    char root[256];    /* the folder every record sits in ("archive") */
} zip_t;

static void zip_free(zip_t *z) {
    for (size_t i = 0; i < z->n; i++) free(z->e[i].name);
    free(z->e);
    free(z->by_name);
    memset(z, 0, sizeof *z);
}

/* Where the end-of-central-directory record starts (*at); the record's
 * comment must reach exactly to the end of the file. */
static int find_eocd(const src_t *s, uint64_t *at) {
    size_t tail = s->size < EOCD_LEN + 65535 ? (size_t)s->size : EOCD_LEN + 65535;
    unsigned char *b = malloc(tail ? tail : 1);
    if (!b) return reel_fail(REEL_E_NOMEM, "%s: out of memory", s->origin);
    int rc = src_read(s, s->size - tail, b, tail);
    for (size_t i = tail >= EOCD_LEN ? tail - EOCD_LEN + 1 : 0; rc == 0 && i-- > 0;)
        if (le(b + i, 4) == SIG_EOCD && i + EOCD_LEN + le(b + i + 20, 2) == tail) {
            *at = s->size - tail + i;
            free(b);
            return 0;
        }
    free(b);
    if (rc != 0) return -1;
    return reel_fail(REEL_E_INVALID, "%s: no zip end-of-central-directory record: truncated, or not a "
                     "zip archive", s->origin);
}

/* The ZIP64 end-of-central-directory record the locator before eocd
 * points at: the central directory's offset, size and entry count. */
static int read_z64_eocd(const src_t *s, uint64_t eocd, uint64_t *cd, uint64_t *cd_len, uint64_t *count,
                         uint64_t *limit) {
    unsigned char loc[Z64_LOCATOR_LEN], r[Z64_EOCD_LEN];
    if (src_read(s, eocd - Z64_LOCATOR_LEN, loc, sizeof loc) != 0) return -1;
    uint64_t at = le(loc + 8, 8);
    if (at > eocd - Z64_LOCATOR_LEN || eocd - Z64_LOCATOR_LEN - at < Z64_EOCD_LEN)
        return reel_fail(REEL_E_INVALID, "%s: zip64 end-of-central-directory locator points outside the "
                         "file (offset %llu)", s->origin, (unsigned long long)at);
    if (src_read(s, at, r, sizeof r) != 0) return -1;
    if (le(r, 4) != SIG_Z64_EOCD)
        return reel_fail(REEL_E_INVALID, "%s: no zip64 end-of-central-directory record at offset %llu",
                         s->origin, (unsigned long long)at);
    if (le(r + 16, 4) != 0 || le(r + 20, 4) != 0)
        return reel_fail(REEL_E_UNSUPPORTED, "%s: multi-disk zip archives are not supported", s->origin);
    *count = le(r + 32, 8);
    *cd_len = le(r + 40, 8);
    *cd = le(r + 48, 8);
    *limit = at;
    return 0;
}

/* Fills z->cd_start and reads the central directory (malloc'd, *len bytes)
 * and its entry count from the end records, ZIP64 ones included. */
static int read_central(const src_t *s, zip_t *z, unsigned char **cd, size_t *len, uint64_t *count) {
    uint64_t eocd = 0, off = 0, n = 0, limit = 0;
    unsigned char r[EOCD_LEN];
    if (find_eocd(s, &eocd) != 0 || src_read(s, eocd, r, sizeof r) != 0) return -1;
    unsigned char sig[4];
    if (eocd >= Z64_LOCATOR_LEN && src_read(s, eocd - Z64_LOCATOR_LEN, sig, 4) == 0 &&
        le(sig, 4) == SIG_Z64_LOCATOR) {
        if (read_z64_eocd(s, eocd, &off, &n, count, &limit) != 0) return -1;
    } else {
        if (le(r + 4, 2) != 0 || le(r + 6, 2) != 0)
            return reel_fail(REEL_E_UNSUPPORTED, "%s: multi-disk zip archives are not supported", s->origin);
        *count = le(r + 10, 2);
        n = le(r + 12, 4);
        off = le(r + 16, 4);
        limit = eocd;
    }
    if (off > limit || n > limit - off)
        return reel_fail(REEL_E_INVALID, "%s: zip central directory (%llu bytes at %llu) reaches past the end "
                         "of the file: truncated?", s->origin, (unsigned long long)n, (unsigned long long)off);
    if (n > MAX_CENTRAL_BYTES)
        return reel_fail(REEL_E_LIMIT, "%s: zip central directory of %llu bytes is over the %llu-byte limit",
                         s->origin, (unsigned long long)n, (unsigned long long)MAX_CENTRAL_BYTES);
    if (*count > n / CENTRAL_LEN)
        return reel_fail(REEL_E_INVALID, "%s: zip central directory of %llu bytes cannot hold %llu entries",
                         s->origin, (unsigned long long)n, (unsigned long long)*count);
    z->cd_start = off;
    *len = (size_t)n;
    if (!(*cd = malloc(n ? n : 1))) return reel_fail(REEL_E_NOMEM, "%s: out of memory", s->origin);
    return src_read(s, off, *cd, *len);
}

/* The ZIP64 extra field (id 1) of extra[0..n): the 64-bit values of the
 * fields whose 32-bit value was 0xffffffff, in the order the format fixes
 * (uncompressed, compressed, local header offset). 1 when there is one. */
static int z64_extra(const unsigned char *x, size_t n, uint64_t *const want[3], int *present) {
    *present = 0;
    for (size_t i = 0; i + 4 <= n;) {
        size_t id = le(x + i, 2), len = le(x + i + 2, 2);
        if (len > n - i - 4) return -1;
        if (id == 1) {
            const unsigned char *v = x + i + 4;
            *present = 1;
            for (int k = 0; k < 3; k++) {
                if (!want[k]) continue;
                if (len < 8) return -1;
                *want[k] = le(v, 8);
                v += 8;
                len -= 8;
            }
            return 0;
        }
        i += 4 + len;
    }
    for (int k = 0; k < 3; k++)
        if (want[k]) return -1;
    return 0;
}

static const char *method_name(unsigned m) {
    switch (m) {
    case 8: return "deflate";
    case 9: return "deflate64";
    case 12: return "bzip2";
    case 14: return "lzma";
    case 93: return "zstd";
    case 95: return "xz";
    default: return "an unknown method";
    }
}

/* What torch writes: stored, not encrypted, one size. */
static int check_stored(const char *origin, const zent_t *e, uint64_t comp) {
    if (e->flags & FLAG_ENCRYPTED)
        return reel_fail(REEL_E_UNSUPPORTED, "%s: zip entry %s is encrypted", origin, e->name);
    if (e->method != 0)
        return reel_fail(REEL_E_UNSUPPORTED, "%s: zip entry %s is compressed (%s, method %u); torch.save "
                         "stores entries uncompressed", origin, e->name, method_name(e->method), e->method);
    if (comp != e->size)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s is stored but its sizes disagree (%llu, %llu)",
                         origin, e->name, (unsigned long long)comp, (unsigned long long)e->size);
    return 0;
}

/* One central directory record at p (avail bytes) into e; *used its length. */
static int parse_central_entry(const char *origin, const unsigned char *p, size_t avail, zent_t *e,
                               size_t *used) {
    if (avail < CENTRAL_LEN || le(p, 4) != SIG_CENTRAL)
        return reel_fail(REEL_E_INVALID, "%s: zip central directory is corrupt", origin);
    size_t nl = le(p + 28, 2), xl = le(p + 30, 2), cl = le(p + 32, 2);
    if (nl + xl + cl > avail - CENTRAL_LEN)
        return reel_fail(REEL_E_INVALID, "%s: zip central directory record runs past the directory", origin);
    if (nl == 0 || memchr(p + CENTRAL_LEN, 0, nl))
        return reel_fail(REEL_E_INVALID, "%s: zip entry with an empty name or a NUL in it", origin);
    if (!(e->name = strndup((const char *)p + CENTRAL_LEN, nl)))
        return reel_fail(REEL_E_NOMEM, "%s: out of memory", origin);
    e->name_len = nl;
    e->flags = (uint16_t)le(p + 8, 2);
    e->method = (uint16_t)le(p + 10, 2);
    e->crc = (uint32_t)le(p + 16, 4);
    uint64_t comp = le(p + 20, 4), size = le(p + 24, 4), local = le(p + 42, 4);
    uint64_t *want[3] = {size == U32_MAX_FIELD ? &size : NULL, comp == U32_MAX_FIELD ? &comp : NULL,
                         local == U32_MAX_FIELD ? &local : NULL};
    int z64;
    if (z64_extra(p + CENTRAL_LEN + nl, xl, want, &z64) != 0)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s: zip64 extra field missing or short", origin, e->name);
    e->size = size;
    e->local = local;
    *used = CENTRAL_LEN + nl + xl + cl;
    return check_stored(origin, e, comp);
}

/* Where e's data would end (its local header counted with the central
 * name length and no extra field); -1 when that reaches past limit. */
static int entry_lower_end(const src_t *s, const zip_t *z, zent_t *e) {
    uint64_t head = LOCAL_LEN + (uint64_t)e->name_len;
    if (e->local > z->cd_start || head > z->cd_start - e->local || e->size > z->cd_start - e->local - head) {
        if (e->local > s->size || e->size > s->size - e->local)
            return reel_fail(REEL_E_INVALID, "%s: zip entry %s declares %llu bytes at offset %llu, past the end of "
                             "the file (%llu bytes): truncated?", s->origin, e->name, (unsigned long long)e->size,
                             (unsigned long long)e->local, (unsigned long long)s->size);
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s (%llu bytes at offset %llu) runs into the central "
                         "directory at %llu", s->origin, e->name, (unsigned long long)e->size,
                         (unsigned long long)e->local, (unsigned long long)z->cd_start);
    }
    e->end = e->local + head + e->size;
    return 0;
}

static int cmp_local(const void *a, const void *b) {
    const zent_t *x = *(zent_t *const *)a, *y = *(zent_t *const *)b;
    return x->local < y->local ? -1 : x->local > y->local;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(zent_t *const *)a)->name, (*(zent_t *const *)b)->name);
}

/* No two entries share a byte (so no record can be read as another's). */
static int check_overlap(const char *origin, const zip_t *z) {
    zent_t **v = malloc((z->n ? z->n : 1) * sizeof *v);
    if (!v) return reel_fail(REEL_E_NOMEM, "%s: out of memory", origin);
    for (size_t i = 0; i < z->n; i++) v[i] = &z->e[i];
    qsort(v, z->n, sizeof *v, cmp_local);
    int rc = 0;
    for (size_t i = 1; i < z->n && rc == 0; i++)
        if (v[i]->local < v[i - 1]->end)
            rc = reel_fail(REEL_E_INVALID, "%s: zip entries %s and %s overlap", origin, v[i - 1]->name, v[i]->name);
    free(v);
    return rc;
}

/* The data descriptor after e's data (torch's writer sets bit 3 and
 * writes the sizes there): it must agree with the central directory. */
static int check_descriptor(const src_t *s, zent_t *e, int z64) {
    unsigned char d[24];
    size_t len = z64 ? 24 : 16;
    if (e->end > s->size || len > s->size - e->end || src_read(s, e->end, d, len) != 0)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s: data descriptor past the end of the file", s->origin,
                         e->name);
    int w = z64 ? 8 : 4;
    if (le(d, 4) != SIG_DESCRIPTOR || le(d + 4, 4) != e->crc || le(d + 8, w) != e->size ||
        le(d + 8 + w, w) != e->size)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s: data descriptor disagrees with the central directory",
                         s->origin, e->name);
    e->end += len;
    return 0;
}

/* Without a descriptor the local header carries CRC and sizes itself
 * (0xffffffff: in its zip64 extra field). */
static int check_local_sizes(const char *origin, const zent_t *e, const unsigned char *h, const unsigned char *x,
                             size_t xl) {
    uint64_t comp = le(h + 18, 4), size = le(h + 22, 4);
    uint64_t *want[3] = {size == U32_MAX_FIELD ? &size : NULL, comp == U32_MAX_FIELD ? &comp : NULL, NULL};
    int z64;
    if (z64_extra(x, xl, want, &z64) != 0)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s: local zip64 extra field missing or short", origin,
                         e->name);
    if (le(h + 14, 4) != e->crc || comp != e->size || size != e->size)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s: local header (size %llu, crc %08llx) disagrees with "
                         "the central directory (size %llu, crc %08x)", origin, e->name, (unsigned long long)size,
                         (unsigned long long)le(h + 14, 4), (unsigned long long)e->size, e->crc);
    return 0;
}

/* Reads e's local header into h (LOCAL_HEADER_MAX bytes): the same name, method and flags as the central
 * directory, then its sizes (or its data descriptor) the same too. */
static int read_local(const src_t *s, zent_t *e, unsigned char *h) {
    if (src_read(s, e->local, h, LOCAL_LEN) != 0 || le(h, 4) != SIG_LOCAL)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s: no local header at offset %llu", s->origin, e->name,
                         (unsigned long long)e->local);
    size_t nl = le(h + 26, 2), xl = le(h + 28, 2);
    if (src_read(s, e->local + LOCAL_LEN, h + LOCAL_LEN, nl + xl) != 0) return -1;
    char nb[80];
    if (nl != e->name_len || memcmp(h + LOCAL_LEN, e->name, nl) != 0)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s: local header names it \"%s\"", s->origin, e->name,
                         printable(h + LOCAL_LEN, nl, nb, sizeof nb));
    unsigned lflags = (unsigned)le(h + 6, 2), lmethod = (unsigned)le(h + 8, 2);
    if (lmethod != e->method || ((lflags ^ e->flags) & (FLAG_ENCRYPTED | FLAG_DESCRIPTOR)))
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s: local header (method %u, flags %04x) disagrees with "
                         "the central directory (method %u, flags %04x)", s->origin, e->name, lmethod, lflags,
                         e->method, e->flags);
    const unsigned char *x = h + LOCAL_LEN + nl;
    e->data = e->local + LOCAL_LEN + nl + xl;
    e->end = e->data + e->size;
    if (!(e->flags & FLAG_DESCRIPTOR)) return check_local_sizes(s->origin, e, h, x, xl);
    uint64_t *none[3] = {NULL, NULL, NULL};
    int z64;
    if (z64_extra(x, xl, none, &z64) != 0)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s: local extra fields are corrupt", s->origin, e->name);
    return check_descriptor(s, e, z64);
}

/* Every entry ends before the central directory, and none overlaps another. */
static int check_extents(const src_t *s, const zip_t *z) {
    for (size_t i = 0; i < z->n; i++)
        if (z->e[i].end > z->cd_start)
            return reel_fail(REEL_E_INVALID, "%s: zip entry %s runs into the central directory at %llu", s->origin,
                             z->e[i].name, (unsigned long long)z->cd_start);
    return check_overlap(s->origin, z);
}

/* The name index, refusing two entries of one name, and the root folder
 * (the first entry's, as torch's reader takes it). */
static int index_names(const char *origin, zip_t *z) {
    if (z->n == 0) return reel_fail(REEL_E_INVALID, "%s: zip archive holds no entries", origin);
    const char *slash = strchr(z->e[0].name, '/');
    size_t rl = slash ? (size_t)(slash - z->e[0].name) : 0;
    if (!slash || rl >= sizeof z->root)
        return reel_fail(REEL_E_INVALID, "%s: zip entry %s is not in a folder; not a torch.save archive", origin,
                         z->e[0].name);
    memcpy(z->root, z->e[0].name, rl);
    z->root[rl] = '\0';
    if (!(z->by_name = malloc(z->n * sizeof *z->by_name)))
        return reel_fail(REEL_E_NOMEM, "%s: out of memory", origin);
    for (size_t i = 0; i < z->n; i++) z->by_name[i] = &z->e[i];
    qsort(z->by_name, z->n, sizeof *z->by_name, cmp_name);
    for (size_t i = 1; i < z->n; i++)
        if (!strcmp(z->by_name[i]->name, z->by_name[i - 1]->name))
            return reel_fail(REEL_E_INVALID, "%s: two zip entries named %s", origin, z->by_name[i]->name);
    return 0;
}

/* Parses the central directory's records into z->e. */
static int parse_entries(const char *origin, zip_t *z, const unsigned char *cd, size_t len, uint64_t count) {
    if (!(z->e = calloc(count ? count : 1, sizeof *z->e))) return reel_fail(REEL_E_NOMEM, "%s: out of memory", origin);
    size_t at = 0;
    for (uint64_t i = 0; i < count; i++) {
        size_t used = 0;
        z->n++;
        if (parse_central_entry(origin, cd + at, len - at, &z->e[i], &used) != 0) return -1;
        at += used;
    }
    return 0;
}

/* Reads and checks the whole container (not the records' bytes). */
static int zip_open(const src_t *s, zip_t *z) {
    unsigned char *cd = NULL;
    size_t len = 0;
    uint64_t count = 0;
    int rc = read_central(s, z, &cd, &len, &count);
    if (rc == 0) rc = parse_entries(s->origin, z, cd, len, count);
    free(cd);
    for (size_t i = 0; rc == 0 && i < z->n; i++) rc = entry_lower_end(s, z, &z->e[i]);
    /* Overlap first, from the central directory alone: a local header
     * inside another entry's bytes is then never read as one. */
    if (rc == 0) rc = check_overlap(s->origin, z);
    unsigned char *h = rc == 0 ? malloc(LOCAL_HEADER_MAX) : NULL;
    if (rc == 0 && !h) rc = reel_fail(REEL_E_NOMEM, "%s: out of memory", s->origin);
    for (size_t i = 0; rc == 0 && i < z->n; i++) rc = read_local(s, &z->e[i], h);
    free(h);
    if (rc == 0) rc = check_extents(s, z);
    if (rc == 0) rc = index_names(s->origin, z);
    return rc;
}

/* The record <root>/<rel>, or NULL. */
static const zent_t *zip_find(const zip_t *z, const char *rel) {
    char name[512];
    int n = snprintf(name, sizeof name, "%s/%s", z->root, rel);
    if (n < 0 || (size_t)n >= sizeof name) return NULL;
    zent_t key = {.name = name}, *kp = &key;
    zent_t **hit = bsearch(&kp, z->by_name, z->n, sizeof *z->by_name, cmp_name);
    return hit ? *hit : NULL;
}

/* ---- pickle ------------------------------------------------------------- */

typedef enum { PV_NONE, PV_BOOL, PV_INT, PV_STR, PV_TUPLE, PV_LIST, PV_DICT, PV_GLOBAL, PV_STORAGE, PV_TENSOR } pv_kind_t;

static const char *const PV_NAMES[] = {"None", "a bool", "an int", "a str", "a tuple", "a list", "a dict", "a global",
                                       "a storage", "a tensor"};

/* The globals a state dict needs; nothing else is ever named. */
typedef enum { G_ORDERED_DICT, G_REBUILD_TENSOR, G_REBUILD_PARAMETER, G_STORAGE } global_t;

typedef struct {
    pv_kind_t kind;
    int64_t i;               /* INT, BOOL; GLOBAL: a global_t; STORAGE: numel; TENSOR: index into tensors */
    const unsigned char *s;  /* STR (into the pickle); STORAGE: its key */
    size_t n;
    kern_dtype_t dtype;      /* GLOBAL G_STORAGE, STORAGE */
    uint32_t *items;         /* TUPLE, LIST; DICT: key, value, key, value ... */
    size_t count, cap;
} pv_t;

/* Objects one pickle may make: a state dict of thousands of tensors makes
 * tens of thousands; the cap keeps a hostile pickle's memory bounded. */
#define PK_MAX_OBJECTS ((size_t)1 << 22)

typedef struct {
    uint32_t storage;        /* a PV_STORAGE node */
    int64_t offset;
    int ndim;
    int64_t shape[KERN_MAX_DIMS], stride[KERN_MAX_DIMS];
} pt_tensor_t;

typedef struct {
    const char *origin;
    const unsigned char *p;
    size_t len, pos, op_at;
    int done;
    pv_t *v;
    size_t nv, capv;
    uint32_t *stack;
    size_t ns, caps;
    size_t *marks;
    size_t nm, capm;
    uint32_t *memo;          /* node + 1; 0: unset */
    size_t nmemo, capmemo;
    pt_tensor_t *t;
    size_t nt, capt;
} pk_t;

static void pk_free(pk_t *k) {
    for (size_t i = 0; i < k->nv; i++) free(k->v[i].items);
    free(k->v);
    free(k->stack);
    free(k->marks);
    free(k->memo);
    free(k->t);
}

static int pk_bad(pk_t *k, const char *what) {
    return reel_fail(REEL_E_INVALID, "%s: data.pkl: %s (opcode at byte %zu)", k->origin, what, k->op_at);
}

/* n bytes of operand at *p; -1 when the pickle ends first. */
static int pk_take(pk_t *k, size_t n, const unsigned char **p) {
    if (n > k->len - k->pos) return pk_bad(k, "pickle ends inside an opcode");
    *p = k->p + k->pos;
    k->pos += n;
    return 0;
}

static int pk_take_uint(pk_t *k, int n, uint64_t *v) {
    const unsigned char *p = NULL;
    if (pk_take(k, (size_t)n, &p) != 0) return -1;
    *v = le(p, n);
    return 0;
}

/* A new node of kind; its index in *at. */
static int pk_new(pk_t *k, pv_kind_t kind, uint32_t *at) {
    if (k->nv >= PK_MAX_OBJECTS) return pk_bad(k, "more objects than a state dict holds");
    if (grow(&k->v, &k->capv, k->nv + 1, sizeof *k->v, k->origin) != 0) return -1;
    memset(&k->v[k->nv], 0, sizeof k->v[k->nv]);
    k->v[k->nv].kind = kind;
    *at = (uint32_t)k->nv++;
    return 0;
}

static int pk_push(pk_t *k, uint32_t node) {
    if (grow(&k->stack, &k->caps, k->ns + 1, sizeof *k->stack, k->origin) != 0) return -1;
    k->stack[k->ns++] = node;
    return 0;
}

/* A new node of kind, pushed; its index in *at (NULL: not wanted). */
static int pk_push_new(pk_t *k, pv_kind_t kind, uint32_t *at) {
    uint32_t n = 0;
    if (pk_new(k, kind, &n) != 0 || pk_push(k, n) != 0) return -1;
    if (at) *at = n;
    return 0;
}

/* Pops the top of the stack (not below the innermost mark). */
static int pk_pop(pk_t *k, uint32_t *node) {
    size_t floor = k->nm ? k->marks[k->nm - 1] : 0;
    if (k->ns <= floor) return pk_bad(k, "stack underflow");
    *node = k->stack[--k->ns];
    return 0;
}

static int pk_top(pk_t *k, uint32_t *node) {
    if (pk_pop(k, node) != 0) return -1;
    k->ns++;
    return 0;
}

/* Pops the innermost mark; *from: where the items above it start. */
static int pk_pop_mark(pk_t *k, size_t *from) {
    if (k->nm == 0) return pk_bad(k, "no mark on the stack");
    *from = k->marks[--k->nm];
    return 0;
}

static int pv_append(pk_t *k, uint32_t node, uint32_t item) {
    pv_t *v = &k->v[node];
    if (grow(&v->items, &v->cap, v->count + 1, sizeof *v->items, k->origin) != 0) return -1;
    v->items[v->count++] = item;
    return 0;
}

/* A container of kind over stack[from..ns), which it replaces. */
static int pk_collect(pk_t *k, pv_kind_t kind, size_t from) {
    uint32_t n = 0;
    if (pk_new(k, kind, &n) != 0) return -1;
    for (size_t i = from; i < k->ns; i++)
        if (pv_append(k, n, k->stack[i]) != 0) return -1;
    k->ns = from;
    return pk_push(k, n);
}

/* ---- opcodes: each reads its operands and leaves the stack as pickle does */

static int op_proto(pk_t *k) {
    uint64_t v = 0;
    if (pk_take_uint(k, 1, &v) != 0) return -1;
    return v <= 5 ? 0 : pk_bad(k, "unknown pickle protocol");
}

static int op_frame(pk_t *k) {
    uint64_t v = 0;
    return pk_take_uint(k, 8, &v); /* a frame is a length hint; its opcodes follow inline */
}

static int op_stop(pk_t *k) {
    k->done = 1;
    return 0;
}

static int op_empty_dict(pk_t *k) { return pk_push_new(k, PV_DICT, NULL); }
static int op_empty_list(pk_t *k) { return pk_push_new(k, PV_LIST, NULL); }
static int op_empty_tuple(pk_t *k) { return pk_push_new(k, PV_TUPLE, NULL); }
static int op_none(pk_t *k) { return pk_push_new(k, PV_NONE, NULL); }

static int push_int(pk_t *k, pv_kind_t kind, int64_t v) {
    uint32_t n = 0;
    if (pk_push_new(k, kind, &n) != 0) return -1;
    k->v[n].i = v;
    return 0;
}

static int op_true(pk_t *k) { return push_int(k, PV_BOOL, 1); }
static int op_false(pk_t *k) { return push_int(k, PV_BOOL, 0); }

static int op_mark(pk_t *k) {
    if (grow(&k->marks, &k->capm, k->nm + 1, sizeof *k->marks, k->origin) != 0) return -1;
    k->marks[k->nm++] = k->ns;
    return 0;
}

static int push_str(pk_t *k, int lenbytes) {
    uint64_t n = 0;
    const unsigned char *p = NULL;
    uint32_t node = 0;
    if (pk_take_uint(k, lenbytes, &n) != 0) return -1;
    if (n > k->len - k->pos) return pk_bad(k, "string runs past the end of the pickle");
    if (pk_take(k, (size_t)n, &p) != 0 || pk_push_new(k, PV_STR, &node) != 0) return -1;
    k->v[node].s = p;
    k->v[node].n = (size_t)n;
    return 0;
}

static int op_binunicode(pk_t *k) { return push_str(k, 4); }
static int op_short_binunicode(pk_t *k) { return push_str(k, 1); }
static int op_binunicode8(pk_t *k) { return push_str(k, 8); }

static int op_binint1(pk_t *k) {
    uint64_t v = 0;
    return pk_take_uint(k, 1, &v) != 0 ? -1 : push_int(k, PV_INT, (int64_t)v);
}

static int op_binint2(pk_t *k) {
    uint64_t v = 0;
    return pk_take_uint(k, 2, &v) != 0 ? -1 : push_int(k, PV_INT, (int64_t)v);
}

static int op_binint(pk_t *k) {
    uint64_t v = 0;
    return pk_take_uint(k, 4, &v) != 0 ? -1 : push_int(k, PV_INT, (int64_t)(int32_t)(uint32_t)v);
}

/* LONG1: n bytes of little-endian two's complement; up to 8 fit. */
static int op_long1(pk_t *k) {
    uint64_t n = 0, v = 0;
    if (pk_take_uint(k, 1, &n) != 0) return -1;
    if (n > 8) return pk_bad(k, "integer wider than 64 bits");
    if (pk_take_uint(k, (int)n, &v) != 0) return -1;
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~(uint64_t)0 << (8 * n);
    return push_int(k, PV_INT, (int64_t)v);
}

static int pop_tuple(pk_t *k, size_t n) {
    if (k->ns < n || (k->nm && k->ns - n < k->marks[k->nm - 1])) return pk_bad(k, "stack underflow");
    return pk_collect(k, PV_TUPLE, k->ns - n);
}

static int op_tuple1(pk_t *k) { return pop_tuple(k, 1); }
static int op_tuple2(pk_t *k) { return pop_tuple(k, 2); }
static int op_tuple3(pk_t *k) { return pop_tuple(k, 3); }

static int op_tuple(pk_t *k) {
    size_t from = 0;
    return pk_pop_mark(k, &from) != 0 ? -1 : pk_collect(k, PV_TUPLE, from);
}

static int memo_put(pk_t *k, uint64_t idx) {
    uint32_t top = 0;
    if (pk_top(k, &top) != 0) return -1;
    /* Python numbers memo entries from 0 as it stores them: an index
     * beyond the objects made so far is not from a pickler. */
    if (idx > k->nv) return pk_bad(k, "memo index out of range");
    if (grow(&k->memo, &k->capmemo, (size_t)idx + 1, sizeof *k->memo, k->origin) != 0) return -1;
    while (k->nmemo <= idx) k->memo[k->nmemo++] = 0;
    k->memo[idx] = top + 1;
    return 0;
}

static int op_binput(pk_t *k) {
    uint64_t i = 0;
    return pk_take_uint(k, 1, &i) != 0 ? -1 : memo_put(k, i);
}

static int op_long_binput(pk_t *k) {
    uint64_t i = 0;
    return pk_take_uint(k, 4, &i) != 0 ? -1 : memo_put(k, i);
}

static int op_memoize(pk_t *k) { return memo_put(k, k->nmemo); }

static int memo_get(pk_t *k, uint64_t idx) {
    if (idx >= k->nmemo || k->memo[idx] == 0) return pk_bad(k, "memo index not set");
    return pk_push(k, k->memo[idx] - 1);
}

static int op_binget(pk_t *k) {
    uint64_t i = 0;
    return pk_take_uint(k, 1, &i) != 0 ? -1 : memo_get(k, i);
}

static int op_long_binget(pk_t *k) {
    uint64_t i = 0;
    return pk_take_uint(k, 4, &i) != 0 ? -1 : memo_get(k, i);
}

typedef struct {
    const char *module, *name;
    global_t id;
    kern_dtype_t dtype;
} allowed_t;

static const allowed_t ALLOWED[] = {
    {"collections", "OrderedDict", G_ORDERED_DICT, KERN_F32},
    {"torch._utils", "_rebuild_tensor_v2", G_REBUILD_TENSOR, KERN_F32},
    {"torch._utils", "_rebuild_parameter", G_REBUILD_PARAMETER, KERN_F32},
    {"torch", "FloatStorage", G_STORAGE, KERN_F32},
    {"torch", "BFloat16Storage", G_STORAGE, KERN_BF16},
    {"torch", "HalfStorage", G_STORAGE, KERN_F16},
};

static int span_is(const unsigned char *s, size_t n, const char *lit) {
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

/* Pushes global module.name when it is on the allowlist; refuses it by
 * name otherwise, before anything could use it. */
static int push_global(pk_t *k, const unsigned char *mod, size_t ml, const unsigned char *name, size_t nl) {
    for (size_t i = 0; i < sizeof ALLOWED / sizeof ALLOWED[0]; i++)
        if (span_is(mod, ml, ALLOWED[i].module) && span_is(name, nl, ALLOWED[i].name)) {
            uint32_t n = 0;
            if (pk_push_new(k, PV_GLOBAL, &n) != 0) return -1;
            k->v[n].i = ALLOWED[i].id;
            k->v[n].dtype = ALLOWED[i].dtype;
            return 0;
        }
    char mb[80], nb[80];
    printable(mod, ml, mb, sizeof mb);
    printable(name, nl, nb, sizeof nb);
    if (span_is(mod, ml, "torch") && nl > 7 && span_is(name + nl - 7, 7, "Storage"))
        return reel_fail(REEL_E_UNSUPPORTED, "%s: data.pkl: storage type torch.%s is not supported: Reel reads "
                         "F32, BF16 and F16 (torch.FloatStorage, BFloat16Storage, HalfStorage)", k->origin, nb);
    return reel_fail(REEL_E_INVALID, "%s: data.pkl: global %s.%s is not allowed (a state dict of tensors needs "
                     "only collections.OrderedDict, torch._utils._rebuild_tensor_v2 and _rebuild_parameter, and "
                     "torch.{Float,BFloat16,Half}Storage); nothing was run", k->origin, mb, nb);
}

/* A newline-terminated operand of GLOBAL. */
static int take_line(pk_t *k, const unsigned char **s, size_t *n) {
    const unsigned char *nl = memchr(k->p + k->pos, '\n', k->len - k->pos);
    if (!nl) return pk_bad(k, "pickle ends inside GLOBAL");
    *s = k->p + k->pos;
    *n = (size_t)(nl - *s);
    k->pos += *n + 1;
    return 0;
}

static int op_global(pk_t *k) {
    const unsigned char *m, *n;
    size_t ml, nl;
    if (take_line(k, &m, &ml) != 0 || take_line(k, &n, &nl) != 0) return -1;
    return push_global(k, m, ml, n, nl);
}

static int op_stack_global(pk_t *k) {
    uint32_t name = 0, mod = 0;
    if (pk_pop(k, &name) != 0 || pk_pop(k, &mod) != 0) return -1;
    if (k->v[name].kind != PV_STR || k->v[mod].kind != PV_STR) return pk_bad(k, "STACK_GLOBAL of a non-string");
    return push_global(k, k->v[mod].s, k->v[mod].n, k->v[name].s, k->v[name].n);
}

/* items[i] of a tuple node, which must be of kind. */
static int item_of(pk_t *k, uint32_t tuple, size_t i, pv_kind_t kind, uint32_t *out) {
    uint32_t n = k->v[tuple].items[i];
    if (k->v[n].kind != kind) {
        char msg[96];
        snprintf(msg, sizeof msg, "argument %zu is %s where %s belongs", i, PV_NAMES[k->v[n].kind],
                 PV_NAMES[kind]);
        return pk_bad(k, msg);
    }
    *out = n;
    return 0;
}

/* BINPERSID: torch's ('storage', storage type, key, location, numel). */
static int op_binpersid(pk_t *k) {
    uint32_t pid = 0, x = 0, type = 0, key = 0, numel = 0;
    if (pk_pop(k, &pid) != 0) return -1;
    if (k->v[pid].kind != PV_TUPLE || k->v[pid].count != 5) return pk_bad(k, "persistent id is not a 5-tuple");
    if (item_of(k, pid, 0, PV_STR, &x) != 0 || item_of(k, pid, 1, PV_GLOBAL, &type) != 0 ||
        item_of(k, pid, 2, PV_STR, &key) != 0 || item_of(k, pid, 3, PV_STR, &x) != 0 ||
        item_of(k, pid, 4, PV_INT, &numel) != 0)
        return -1;
    if (!span_is(k->v[k->v[pid].items[0]].s, k->v[k->v[pid].items[0]].n, "storage"))
        return pk_bad(k, "persistent id is not a storage");
    if (k->v[type].i != G_STORAGE) return pk_bad(k, "persistent id's type is not a storage type");
    if (k->v[numel].i < 0) return pk_bad(k, "storage of negative size");
    uint32_t n = 0;
    if (pk_push_new(k, PV_STORAGE, &n) != 0) return -1;
    k->v[n].dtype = k->v[type].dtype;
    k->v[n].s = k->v[key].s;
    k->v[n].n = k->v[key].n;
    k->v[n].i = k->v[numel].i;
    return 0;
}

/* A tuple of at most KERN_MAX_DIMS non-negative ints into out; *n its length. */
static int int_tuple(pk_t *k, uint32_t node, int64_t *out, int *n) {
    const pv_t *t = &k->v[node];
    if (t->count > KERN_MAX_DIMS) return pk_bad(k, "tensor of more dims than Reel supports");
    for (size_t i = 0; i < t->count; i++) {
        const pv_t *e = &k->v[t->items[i]];
        if (e->kind != PV_INT || e->i < 0) return pk_bad(k, "size or stride that is not a non-negative int");
        out[i] = e->i;
    }
    *n = (int)t->count;
    return 0;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
 * backward_hooks[, metadata]) -> a tensor node. */
static int rebuild_tensor(pk_t *k, uint32_t args) {
    uint32_t st = 0, off = 0, size = 0, stride = 0, x = 0;
    size_t c = k->v[args].count;
    if (c != 6 && c != 7) return pk_bad(k, "_rebuild_tensor_v2 takes 6 or 7 arguments");
    if (item_of(k, args, 0, PV_STORAGE, &st) != 0 || item_of(k, args, 1, PV_INT, &off) != 0 ||
        item_of(k, args, 2, PV_TUPLE, &size) != 0 || item_of(k, args, 3, PV_TUPLE, &stride) != 0 ||
        item_of(k, args, 4, PV_BOOL, &x) != 0 || item_of(k, args, 5, PV_DICT, &x) != 0 ||
        (c == 7 && item_of(k, args, 6, PV_DICT, &x) != 0))
        return -1;
    if (grow(&k->t, &k->capt, k->nt + 1, sizeof *k->t, k->origin) != 0) return -1;
    pt_tensor_t *t = &k->t[k->nt];
    int ns;
    t->storage = st;
    t->offset = k->v[off].i;
    if (t->offset < 0) return pk_bad(k, "negative storage offset");
    if (int_tuple(k, size, t->shape, &t->ndim) != 0 || int_tuple(k, stride, t->stride, &ns) != 0) return -1;
    if (ns != t->ndim) return pk_bad(k, "size and stride of different lengths");
    uint32_t n = 0;
    if (pk_push_new(k, PV_TENSOR, &n) != 0) return -1;
    k->v[n].i = (int64_t)k->nt++;
    return 0;
}

/* _rebuild_parameter(tensor, requires_grad, backward_hooks) -> the tensor. */
static int rebuild_parameter(pk_t *k, uint32_t args) {
    uint32_t t = 0, x = 0;
    if (k->v[args].count != 3) return pk_bad(k, "_rebuild_parameter takes 3 arguments");
    if (item_of(k, args, 0, PV_TENSOR, &t) != 0 || item_of(k, args, 1, PV_BOOL, &x) != 0 ||
        item_of(k, args, 2, PV_DICT, &x) != 0)
        return -1;
    return pk_push(k, t);
}

static int op_reduce(pk_t *k) {
    uint32_t args = 0, fn = 0;
    if (pk_pop(k, &args) != 0 || pk_pop(k, &fn) != 0) return -1;
    if (k->v[fn].kind != PV_GLOBAL) return pk_bad(k, "REDUCE of something not callable");
    if (k->v[args].kind != PV_TUPLE) return pk_bad(k, "REDUCE with arguments that are not a tuple");
    switch ((global_t)k->v[fn].i) {
    case G_ORDERED_DICT:
        if (k->v[args].count != 0) return pk_bad(k, "OrderedDict called with arguments");
        return pk_push_new(k, PV_DICT, NULL);
    case G_REBUILD_TENSOR: return rebuild_tensor(k, args);
    case G_REBUILD_PARAMETER: return rebuild_parameter(k, args);
    case G_STORAGE: break;
    }
    return pk_bad(k, "a storage type is called");
}

/* BUILD: a state dict's `_metadata` attribute (a dict set on the
 * OrderedDict) is accepted and dropped; nothing else has state. */
static int op_build(pk_t *k) {
    uint32_t state = 0, obj = 0;
    if (pk_pop(k, &state) != 0 || pk_top(k, &obj) != 0) return -1;
    if (k->v[obj].kind != PV_DICT || (k->v[state].kind != PV_DICT && k->v[state].kind != PV_NONE))
        return pk_bad(k, "BUILD of something other than a dict");
    return 0;
}

/* Sets items stack[from..ns) (key, value pairs) into the dict below them. */
static int set_items(pk_t *k, size_t from) {
    if ((k->ns - from) % 2) return pk_bad(k, "SETITEMS of an odd number of items");
    if (from == 0 || (k->nm && from <= k->marks[k->nm - 1])) return pk_bad(k, "stack underflow");
    uint32_t d = k->stack[from - 1];
    if (k->v[d].kind != PV_DICT) return pk_bad(k, "SETITEM on something other than a dict");
    for (size_t i = from; i < k->ns; i++)
        if (pv_append(k, d, k->stack[i]) != 0) return -1;
    k->ns = from;
    return 0;
}

static int op_setitem(pk_t *k) {
    if (k->ns < 2 || (k->nm && k->ns - 2 < k->marks[k->nm - 1])) return pk_bad(k, "stack underflow");
    return set_items(k, k->ns - 2);
}

static int op_setitems(pk_t *k) {
    size_t from = 0;
    return pk_pop_mark(k, &from) != 0 ? -1 : set_items(k, from);
}

/* Appends stack[from..ns) to the list below them. */
static int append_items(pk_t *k, size_t from) {
    if (from == 0 || (k->nm && from <= k->marks[k->nm - 1])) return pk_bad(k, "stack underflow");
    uint32_t l = k->stack[from - 1];
    if (k->v[l].kind != PV_LIST) return pk_bad(k, "APPEND to something other than a list");
    for (size_t i = from; i < k->ns; i++)
        if (pv_append(k, l, k->stack[i]) != 0) return -1;
    k->ns = from;
    return 0;
}

static int op_append(pk_t *k) {
    if (k->ns < 1) return pk_bad(k, "stack underflow");
    return append_items(k, k->ns - 1);
}

static int op_appends(pk_t *k) {
    size_t from = 0;
    return pk_pop_mark(k, &from) != 0 ? -1 : append_items(k, from);
}

typedef struct {
    const char *name;
    int (*run)(pk_t *k);   /* NULL: a pickle opcode no saved state dict uses */
} opcode_t;

static const opcode_t OPCODES[256] = {
    [0x80] = {"PROTO", op_proto},          [0x95] = {"FRAME", op_frame},
    ['.'] = {"STOP", op_stop},             ['}'] = {"EMPTY_DICT", op_empty_dict},
    [']'] = {"EMPTY_LIST", op_empty_list}, [')'] = {"EMPTY_TUPLE", op_empty_tuple},
    ['N'] = {"NONE", op_none},             [0x88] = {"NEWTRUE", op_true},
    [0x89] = {"NEWFALSE", op_false},       ['('] = {"MARK", op_mark},
    ['X'] = {"BINUNICODE", op_binunicode}, [0x8c] = {"SHORT_BINUNICODE", op_short_binunicode},
    [0x8d] = {"BINUNICODE8", op_binunicode8},
    ['K'] = {"BININT1", op_binint1},       ['M'] = {"BININT2", op_binint2},
    ['J'] = {"BININT", op_binint},         [0x8a] = {"LONG1", op_long1},
    [0x85] = {"TUPLE1", op_tuple1},        [0x86] = {"TUPLE2", op_tuple2},
    [0x87] = {"TUPLE3", op_tuple3},        ['t'] = {"TUPLE", op_tuple},
    ['q'] = {"BINPUT", op_binput},         ['r'] = {"LONG_BINPUT", op_long_binput},
    [0x94] = {"MEMOIZE", op_memoize},      ['h'] = {"BINGET", op_binget},
    ['j'] = {"LONG_BINGET", op_long_binget},
    ['c'] = {"GLOBAL", op_global},         [0x93] = {"STACK_GLOBAL", op_stack_global},
    ['Q'] = {"BINPERSID", op_binpersid},   ['R'] = {"REDUCE", op_reduce},
    ['b'] = {"BUILD", op_build},           ['s'] = {"SETITEM", op_setitem},
    ['u'] = {"SETITEMS", op_setitems},     ['a'] = {"APPEND", op_append},
    ['e'] = {"APPENDS", op_appends},
    /* Known to pickle, never written for a state dict: refused by name. */
    ['i'] = {"INST", NULL},                ['o'] = {"OBJ", NULL},
    [0x81] = {"NEWOBJ", NULL},             [0x92] = {"NEWOBJ_EX", NULL},
    ['P'] = {"PERSID", NULL},              ['p'] = {"PUT", NULL},
    ['g'] = {"GET", NULL},                 ['I'] = {"INT", NULL},
    ['L'] = {"LONG", NULL},                [0x8b] = {"LONG4", NULL},
    ['F'] = {"FLOAT", NULL},               ['G'] = {"BINFLOAT", NULL},
    ['S'] = {"STRING", NULL},              ['T'] = {"BINSTRING", NULL},
    ['U'] = {"SHORT_BINSTRING", NULL},     ['V'] = {"UNICODE", NULL},
    ['B'] = {"BINBYTES", NULL},            ['C'] = {"SHORT_BINBYTES", NULL},
    [0x8e] = {"BINBYTES8", NULL},          [0x96] = {"BYTEARRAY8", NULL},
    [0x82] = {"EXT1", NULL},               [0x83] = {"EXT2", NULL},
    [0x84] = {"EXT4", NULL},               ['l'] = {"LIST", NULL},
    ['d'] = {"DICT", NULL},                [0x8f] = {"EMPTY_SET", NULL},
    [0x90] = {"ADDITEMS", NULL},           [0x91] = {"FROZENSET", NULL},
    ['0'] = {"POP", NULL},                 ['1'] = {"POP_MARK", NULL},
    ['2'] = {"DUP", NULL},                 [0x97] = {"NEXT_BUFFER", NULL},
    [0x98] = {"READONLY_BUFFER", NULL},
};

/* Runs the pickle p[0..len) up to STOP. */
static int pk_run(pk_t *k, const char *origin, const unsigned char *p, size_t len) {
    k->origin = origin;
    k->p = p;
    k->len = len;
    while (!k->done) {
        if (k->pos >= k->len) return pk_bad(k, "pickle ends without STOP");
        k->op_at = k->pos;
        unsigned op = k->p[k->pos++];
        const opcode_t *o = &OPCODES[op];
        if (!o->name)
            return reel_fail(REEL_E_INVALID, "%s: data.pkl: unknown pickle opcode 0x%02x at byte %zu", origin, op,
                             k->op_at);
        if (!o->run)
            return reel_fail(REEL_E_UNSUPPORTED, "%s: data.pkl: pickle opcode 0x%02x (%s) at byte %zu is not one "
                             "torch.save writes for a state dict", origin, op, o->name, k->op_at);
        if (o->run(k) != 0) return -1;
    }
    return 0;
}

/* ---- from the pickle's dict to a safetensors header and data ----------- */

typedef struct {
    char *name;
    const pt_tensor_t *t;
    const pv_t *storage;
    const zent_t *rec;
    uint64_t numel, begin, nbytes;
} item_t;

typedef struct {
    item_t *it;
    size_t n;
    uint64_t total;
} plan_t;

static void plan_free(plan_t *p) {
    for (size_t i = 0; i < p->n; i++) free(p->it[i].name);
    free(p->it);
}

/* The pickle's result: a dict of str keys and tensor values, in order. */
static int collect_items(const pk_t *k, plan_t *p) {
    if (k->ns != 1) return reel_fail(REEL_E_INVALID, "%s: data.pkl: %zu objects left at STOP", k->origin, k->ns);
    const pv_t *d = &k->v[k->stack[0]];
    if (d->kind != PV_DICT)
        return reel_fail(REEL_E_INVALID, "%s: data.pkl: the top-level object is %s, not a dict of tensors",
                         k->origin, PV_NAMES[d->kind]);
    if (!(p->it = calloc(d->count / 2 + 1, sizeof *p->it))) return reel_fail(REEL_E_NOMEM, "%s: out of memory", k->origin);
    for (size_t i = 0; i + 1 < d->count; i += 2) {
        const pv_t *key = &k->v[d->items[i]], *val = &k->v[d->items[i + 1]];
        char kb[80];
        if (key->kind != PV_STR || memchr(key->s, 0, key->n))
            return reel_fail(REEL_E_INVALID, "%s: data.pkl: a key of the state dict is %s, not a name", k->origin,
                             PV_NAMES[key->kind]);
        if (val->kind != PV_TENSOR)
            return reel_fail(REEL_E_INVALID, "%s: data.pkl: \"%s\" is %s, not a tensor", k->origin,
                             printable(key->s, key->n, kb, sizeof kb), PV_NAMES[val->kind]);
        item_t *it = &p->it[p->n++];
        if (!(it->name = strndup((const char *)key->s, key->n))) return reel_fail(REEL_E_NOMEM, "%s: out of memory", k->origin);
        it->t = &k->t[val->i];
        it->storage = &k->v[it->t->storage];
    }
    return 0;
}

/* The largest element index t reads (+1), and its element count; -1 on
 * overflow. Empty views read nothing (*reach = offset). */
static int view_reach(const pt_tensor_t *t, uint64_t *reach, uint64_t *numel) {
    uint64_t n = 1, last = (uint64_t)t->offset, step;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(n, (uint64_t)t->shape[d], &n)) return -1;
    *numel = n;
    if (n == 0) {
        *reach = last;
        return 0;
    }
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow((uint64_t)(t->shape[d] - 1), (uint64_t)t->stride[d], &step) ||
            __builtin_add_overflow(last, step, &last))
            return -1;
    return __builtin_add_overflow(last, 1, reach) ? -1 : 0;
}

/* Finds it's storage record and checks the view against it. */
static int resolve_item(const char *origin, const zip_t *z, item_t *it) {
    const pv_t *s = it->storage;
    char key[80], rel[96];
    printable(s->s, s->n, key, sizeof key);
    snprintf(rel, sizeof rel, "data/%s", key);
    size_t es = kern_dtype_size(s->dtype);
    if (!span_is(s->s, s->n, key) || !(it->rec = zip_find(z, rel)))
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": no record %s/%s for its storage", origin, it->name,
                         z->root, rel);
    if ((uint64_t)s->i > UINT64_MAX / es || it->rec->size != (uint64_t)s->i * es)
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": record %s holds %llu bytes, but its storage is %lld "
                         "elements of %s", origin, it->name, it->rec->name, (unsigned long long)it->rec->size,
                         (long long)s->i, kern_dtype_name(s->dtype));
    uint64_t reach = 0;
    if (view_reach(it->t, &reach, &it->numel) != 0 || it->numel > UINT64_MAX / es)
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": its shape, stride and offset %lld reach past 2^64 "
                         "elements (its storage has %lld)", origin, it->name, (long long)it->t->offset,
                         (long long)s->i);
    if (reach > (uint64_t)s->i)
        return reel_fail(REEL_E_INVALID, "%s: tensor \"%s\": storage too small: %lld elements, but its shape, "
                         "stride and offset %lld need %llu", origin, it->name, (long long)s->i,
                         (long long)it->t->offset, (unsigned long long)reach);
    it->nbytes = it->numel * es;
    return 0;
}

/* Lays the tensors out back to back, each 64-byte aligned. Stride-0
 * views (expanded dims) could ask for any number of bytes from a tiny
 * storage; a real checkpoint's tensors are its storages, so the total may
 * not pass twice the archive's size (plus 1 MiB). */
static int layout(const src_t *s, plan_t *p) {
    uint64_t at = 0, cap = s->size * 2 + ((uint64_t)1 << 20);
    for (size_t i = 0; i < p->n; i++) {
        at = (at + 63) & ~(uint64_t)63;
        p->it[i].begin = at;
        if (__builtin_add_overflow(at, p->it[i].nbytes, &at) || at > cap)
            return reel_fail(REEL_E_LIMIT, "%s: tensor \"%s\": the tensors come to more than twice the archive's "
                             "%llu bytes (expanded views?)", s->origin, p->it[i].name, (unsigned long long)s->size);
    }
    p->total = at;
    return 0;
}

static json_t *entry_json(const item_t *it) {
    json_t *shape = json_array();
    for (int d = 0; shape && d < it->t->ndim; d++)
        if (json_array_append_new(shape, json_integer(it->t->shape[d])) != 0) {
            json_decref(shape);
            return NULL;
        }
    if (!shape) return NULL;
    return json_pack("{s:s, s:o, s:[I,I]}", "dtype", kern_dtype_name(it->storage->dtype), "shape", shape,
                     "data_offsets", (json_int_t)it->begin, (json_int_t)(it->begin + it->nbytes));
}

/* The safetensors header for the plan (malloc'd text, *len bytes). */
static char *header_text(const char *origin, const plan_t *p, size_t *len) {
    json_t *root = json_object();
    char *text = NULL;
    for (size_t i = 0; root && i < p->n; i++) {
        const char *name = p->it[i].name;
        if (!strcmp(name, "__metadata__") || json_object_get(root, name)) {
            reel_fail(REEL_E_INVALID, "%s: data.pkl: key \"%s\" is %s", origin, name,
                      strcmp(name, "__metadata__") ? "set twice" : "reserved");
            goto out;
        }
        json_t *e = entry_json(&p->it[i]);
        if (!e || json_object_set_new(root, name, e) != 0) {
            reel_fail(REEL_E_INVALID, "%s: tensor name \"%s\" is not valid UTF-8 (or out of memory)", origin, name);
            goto out;
        }
    }
    if (!root || !(text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        reel_fail(REEL_E_NOMEM, "%s: out of memory building the header", origin);
    else
        *len = strlen(text);
out:
    json_decref(root);
    return text;
}

/* A 1 MiB window over one storage record, for gathering strided views. */
#define WINDOW_BYTES ((size_t)1 << 20)
typedef struct {
    const src_t *src;
    uint64_t lo, hi;          /* the record's bytes in the source */
    unsigned char *buf;
    uint64_t at, n;           /* what buf holds */
} window_t;

static int window_get(window_t *w, uint64_t off, size_t es, unsigned char *dst) {
    if (off < w->at || off + es > w->at + w->n) {
        w->at = off;
        w->n = w->hi - off < WINDOW_BYTES ? w->hi - off : WINDOW_BYTES;
        if (src_read(w->src, w->at, w->buf, (size_t)w->n) != 0) return -1;
    }
    memcpy(dst, w->buf + (off - w->at), es);
    return 0;
}

/* Copies a strided view element by element, in row-major order. */
static int gather(const src_t *s, const item_t *it, unsigned char *dst) {
    size_t es = kern_dtype_size(it->storage->dtype);
    window_t w = {.src = s, .lo = it->rec->data, .hi = it->rec->data + it->rec->size};
    if (!(w.buf = malloc(WINDOW_BYTES))) return reel_fail(REEL_E_NOMEM, "%s: out of memory", s->origin);
    int64_t idx[KERN_MAX_DIMS] = {0};
    const pt_tensor_t *t = it->t;
    int rc = 0;
    for (uint64_t n = 0; n < it->numel && rc == 0; n++) {
        uint64_t e = (uint64_t)t->offset;
        for (int d = 0; d < t->ndim; d++) e += (uint64_t)idx[d] * (uint64_t)t->stride[d];
        rc = window_get(&w, w.lo + e * es, es, dst + n * es);
        for (int d = t->ndim - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
    }
    free(w.buf);
    return rc;
}

static int is_contiguous(const pt_tensor_t *t) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != want) return 0;
        want *= t->shape[d];
    }
    return 1;
}

static int copy_item(const src_t *s, const item_t *it, unsigned char *data) {
    if (it->numel == 0) return 0;
    if (!is_contiguous(it->t)) return gather(s, it, data + it->begin);
    size_t es = kern_dtype_size(it->storage->dtype);
    return src_read(s, it->rec->data + (uint64_t)it->t->offset * es, data + it->begin, (size_t)it->nbytes);
}

/* Reads <root>/data.pkl whole (malloc'd). */
static unsigned char *read_pickle(const src_t *s, const zip_t *z, size_t *len) {
    const zent_t *e = zip_find(z, "data.pkl");
    unsigned char *p = NULL;
    if (!e)
        reel_fail(REEL_E_INVALID, "%s: no record %s/data.pkl; not a torch.save checkpoint", s->origin, z->root);
    else if (e->size > PTH_MAX_PICKLE_BYTES)
        reel_fail(REEL_E_LIMIT, "%s: data.pkl is %llu bytes, over the %zu-byte limit", s->origin,
                  (unsigned long long)e->size, PTH_MAX_PICKLE_BYTES);
    else if (!(p = malloc(e->size ? e->size : 1)))
        reel_fail(REEL_E_NOMEM, "%s: out of memory", s->origin);
    else if (src_read(s, e->data, p, (size_t)e->size) != 0) {
        free(p);
        p = NULL;
    }
    *len = e ? (size_t)e->size : 0;
    return p;
}

/* The plan for the pickle's dict: every tensor resolved and laid out. */
static int make_plan(const src_t *s, const zip_t *z, const pk_t *k, plan_t *p) {
    if (collect_items(k, p) != 0) return -1;
    for (size_t i = 0; i < p->n; i++)
        if (resolve_item(s->origin, z, &p->it[i]) != 0) return -1;
    return layout(s, p);
}

/* Fills the one data buffer from the records and hands it to st_adopt. */
static st_file_t *materialize(const src_t *s, const plan_t *p) {
    size_t hlen;
    char *hdr = header_text(s->origin, p, &hlen);
    if (!hdr) return NULL;
    unsigned char *data = calloc(p->total ? p->total : 1, 1);
    if (!data) {
        free(hdr);
        reel_fail(REEL_E_NOMEM, "%s: out of memory for %llu bytes of tensors", s->origin,
                  (unsigned long long)p->total);
        return NULL;
    }
    for (size_t i = 0; i < p->n; i++)
        if (copy_item(s, &p->it[i], data) != 0) {
            free(data);
            free(hdr);
            return NULL;
        }
    st_file_t *f = st_adopt(s->origin, hdr, hlen, data, (size_t)p->total);
    free(hdr);
    return f;
}

static st_file_t *load_src(const src_t *s) {
    /* a Git LFS pointer or a saved web page is named as one (stand_in.h),
     * not as a zip without its end record */
    unsigned char head[STAND_IN_HEAD];
    size_t hn = s->size < sizeof head ? (size_t)s->size : sizeof head;
    if (src_read(s, 0, head, hn) != 0 || stand_in_check(s->origin, head, hn) != 0) return NULL;
    zip_t z = {0};
    pk_t k = {0};
    plan_t p = {0};
    unsigned char *pkl = NULL;
    size_t plen = 0;
    st_file_t *f = NULL;
    if (zip_open(s, &z) == 0 && (pkl = read_pickle(s, &z, &plen)) && pk_run(&k, s->origin, pkl, plen) == 0 &&
        make_plan(s, &z, &k, &p) == 0)
        f = materialize(s, &p);
    plan_free(&p);
    pk_free(&k);
    free(pkl);
    zip_free(&z);
    return f;
}

/* ---- public ------------------------------------------------------------- */

st_file_t *pth_parse(const void *buf, size_t len, const char *origin) {
    assert(origin && (buf || len == 0));
    src_t s = {.origin = origin, .fd = -1, .mem = buf, .size = len};
    return load_src(&s);
}

st_file_t *pth_load(const char *path) {
    assert(path);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        reel_fail_errno(errno == ENOENT ? REEL_E_NOT_FOUND : REEL_E_IO, errno, "%s: cannot open", path);
        return NULL;
    }
    struct stat sb;
    st_file_t *f = NULL;
    if (fstat(fd, &sb) != 0)
        reel_fail_errno(REEL_E_IO, errno, "%s: cannot stat", path);
    else if (!S_ISREG(sb.st_mode))
        reel_fail(REEL_E_INVALID, "%s: not a regular file", path);
    else {
        src_t s = {.origin = path, .fd = fd, .size = (uint64_t)sb.st_size};
        f = load_src(&s);
    }
    close(fd);
    return f;
}

bool pth_sniff(const void *head, size_t n) {
    return head && n >= 4 && memcmp(head, "PK\3\4", 4) == 0;
}

st_file_t *weights_open_any(const char *path) {
    assert(path);
    unsigned char head[4];
    ssize_t r = -1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    /* Anything but a regular file goes to st_open, which refuses it. */
    if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) r = pread(fd, head, sizeof head, 0);
    if (fd >= 0) close(fd);
    return r == 4 && pth_sniff(head, 4) ? pth_load(path) : st_open(path);
}
