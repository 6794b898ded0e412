/* safetensors.h -- reads and writes safetensors files (weights, latents, contexts).
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON mapping
 * tensor name -> {"dtype", "shape", "data_offsets"} (plus an optional
 * "__metadata__" object of strings), then the data buffer. The reader holds
 * the whole file in memory and validates every entry before returning, so
 * a st_file_t that exists never points outside its own buffer. Only F32,
 * BF16 and F16 tensors are accepted; a file holding any other dtype is
 * rejected as a whole. Every failure returns -1 / NULL and leaves a message
 * in reel_err_text() naming the file and, where one is involved, the tensor. */
#ifndef REEL_MODEL_SAFETENSORS_H
#define REEL_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest header accepted; anything bigger is a corrupt length field. */
#define ST_MAX_HEADER_BYTES ((uint64_t)100 * 1024 * 1024)
/* Tensors a file may hold: Wan2.1-14B has about 1,100, its T5 about 250; a
 * header of a million empty entries cost seconds and gigabytes to check. */
#define ST_MAX_TENSORS ((size_t)1 << 17)

typedef struct st_file st_file_t;

/* One tensor of an open file. Every pointer is owned by the st_file_t and
 * lives until st_close(). `data` sits data_offsets[0] bytes into a malloc'd
 * data buffer, so it is aligned for its dtype only when that offset is a
 * multiple of the element size. Files keep tensors back to back (st_writer
 * in insertion order), so an odd-length BF16 tensor ahead of an F32 one
 * misaligns it: read through st_read_f32() or memcpy unless the layout is
 * known. */
typedef struct {
    const char *name;
    kern_dtype_t dtype;
    int ndim;                        /* 0..KERN_MAX_DIMS; 0 is a scalar */
    int64_t shape[KERN_MAX_DIMS];
    const void *data;
    size_t nbytes;                   /* numel * kern_dtype_size(dtype) */
} st_tensor_t;

/* Reads and validates the whole file at `path` (opened without blocking:
 * a FIFO, a device or anything but a regular file is refused). Returns a
 * new handle the caller frees with st_close(), or NULL with a reel_err_text()
 * message that names the path and the problem (I/O error, truncation, bad
 * header, bad entry). */
st_file_t *st_open(const char *path);
/* Called with every chunk st_open_fd reads, in file order (the length
 * field, the header, the data): the whole file passes through it exactly
 * once, so a digest taken here is of the bytes loaded. Nonzero stops the
 * read (st_open_fd fails: "reading stopped"). */
typedef int (*st_read_hook_t)(void *user, const void *chunk, size_t len);
/* As st_open, from the file open at fd, read with pread from offset 0 (the
 * descriptor's offset is not used); `path` names it in messages. Anything
 * but a regular file is refused before a byte is read (a FIFO or a device
 * could block or never end). hook (NULL: none) sees every chunk, at most
 * 4 MiB each. fd stays open (the caller's). */
st_file_t *st_open_fd(int fd, const char *path, st_read_hook_t hook, void *user);

/* What a file's header says, read without its data. */
typedef struct {
    uint64_t header_len;   /* bytes of JSON after the length field */
    uint64_t data_len;     /* bytes after the header: the data buffer */
    uint64_t data_end;     /* where the last tensor's bytes end (<= data_len) */
    uint64_t bytes;        /* the tensors' bytes, summed */
    size_t count;          /* tensors */
} st_probe_t;
/* Reads the length field and the header of the file open at fd (pread
 * from 0) and checks them against the file's size as st_open does (a
 * regular file, every entry's dtype, shape and offsets inside the data
 * buffer), without reading the data: so a file can be judged by its size
 * before anything hashes or loads it. 0 with *out filled, or -1 with a
 * message naming path. */
int st_probe_fd(int fd, const char *path, st_probe_t *out);

/* One tensor of a header read without its data (st_header_t). */
typedef struct {
    const char *name;                /* owned by the header */
    kern_dtype_t dtype;
    int ndim;
    int64_t shape[KERN_MAX_DIMS];
    uint64_t begin;                  /* where its bytes start in the data buffer */
    size_t nbytes;                   /* numel * kern_dtype_size(dtype) */
} st_entry_t;

/* A file's length field and header, read and checked as st_open checks
 * them (every entry's dtype, shape and offsets inside the data buffer the
 * file's size leaves; no two entries sharing a byte), without its data:
 * so a caller can judge a file (names, shapes, size) before reading the
 * data, and read the data where it wants it (st_header_read_data). */
typedef struct st_header st_header_t;
/* Reads the length field and the header of the file open at fd (pread
 * from 0; a regular file only), handing both to hook (NULL: none) in file
 * order, as st_open_fd does. Returns the header (st_header_free), or NULL
 * with a message naming path. */
st_header_t *st_header_read(int fd, const char *path, st_read_hook_t hook, void *user);
/* Reads the data buffer of the file h was read from (fd, the bytes after
 * the header) into dst, which holds st_header_data_len(h) bytes, handing
 * every chunk (at most 4 MiB) to hook after the header's: so a digest
 * taken by the hook over both calls is of the whole file. dst NULL: the
 * bytes go only to the hook (hashing without keeping). -1 with a message
 * naming path on an I/O error, a file whose size changed since its header
 * was read, or a hook that says stop ("reading stopped"). */
int st_header_read_data(const st_header_t *h, int fd, const char *path, void *dst, st_read_hook_t hook, void *user);
/* Entries in data order (ascending begin); NULL when i is out of range. */
size_t st_header_count(const st_header_t *h);
const st_entry_t *st_header_at(const st_header_t *h, size_t i);
/* The "__metadata__" value for key, or NULL (no metadata, or no such key). */
const char *st_header_meta(const st_header_t *h, const char *key);
/* The header's JSON text (hlen bytes) as read, for st_adopt. */
const char *st_header_text(const st_header_t *h, size_t *hlen);
/* Bytes after the header in the file (the data buffer, gaps included). */
uint64_t st_header_data_len(const st_header_t *h);
/* Frees *h and sets *h = NULL; NULL-safe. Can't fail. */
void st_header_free(st_header_t **h);

/* As st_open, over `len` bytes at `buf`, which are copied (the caller keeps
 * buf). Messages name the source as "safetensors buffer". */
st_file_t *st_parse(const void *buf, size_t len);
/* As st_open, over a file already in memory in two parts: the header's
 * hlen JSON bytes (the caller keeps hdr) and the data buffer, malloc'd,
 * dlen bytes, which the result owns (freed on failure too): no copy of
 * the data. Checks every entry as st_open does; messages name origin. */
st_file_t *st_adopt(const char *origin, const char *hdr, size_t hlen, unsigned char *data, size_t dlen);
/* The data buffer of f, taken from it (free() it, or reuse it): f's
 * tensors must not be read after. NULL for a file without data. */
unsigned char *st_take_data(st_file_t *f);
/* What f's messages name it (its path, or the origin given). Owned by f. */
const char *st_origin(const st_file_t *f);
/* Bytes in f's data buffer (gaps included). Can't fail. */
size_t st_data_len(const st_file_t *f);
/* Where tensor t (one of f's, from st_at or st_find) starts in f's data
 * buffer. Can't fail. */
uint64_t st_offset(const st_file_t *f, const st_tensor_t *t);
/* Writes f whole to path as st_writer_save writes (atomically, header
 * padded to 8 bytes, tensors back to back in data order, its
 * "__metadata__" kept), straight from f's buffer: no copy of the data.
 * 0, or -1 with a message naming the path (path untouched). */
int st_save(const st_file_t *f, const char *path);
/* Frees *f and everything it owns and sets *f = NULL. Does nothing when f
 * or *f is NULL. Can't fail. */
void st_close(st_file_t **f);

/* Number of tensors. Can't fail. */
size_t st_count(const st_file_t *f);
/* Tensor i (0 <= i < st_count), in the order of their data in the file
 * (ascending data_offsets[0]); NULL when i is out of range. Owned by f. */
const st_tensor_t *st_at(const st_file_t *f, size_t i);
/* The tensor called `name`, or NULL if there is none (no message is
 * recorded: absence is an answer, not a failure). Owned by f. */
const st_tensor_t *st_find(const st_file_t *f, const char *name);
/* The "__metadata__" value for `key`, or NULL when absent. Owned by f. */
const char *st_meta(const st_file_t *f, const char *key);

/* Reads tensor `name` widened to float32 into dst, which must hold numel
 * floats. When ndim >= 0 the tensor's shape must equal shape[0..ndim)
 * exactly; when ndim < 0 (shape may be NULL) any shape is accepted. Returns
 * 0, or -1 with dst untouched and a message naming the tensor: missing
 * tensor, wrong rank or shape ("w: shape [3,4], expected [128,64]"), or an
 * unsupported dtype. */
int st_read_f32(const st_file_t *f, const char *name, int ndim,
                const int64_t *shape, float *dst);

typedef struct st_writer st_writer_t;

/* An empty writer; NULL with a message when out of memory. The caller
 * frees it with st_writer_destroy(). */
st_writer_t *st_writer_new(void);
/* Frees *w and its copies of tensors and metadata and sets *w = NULL. Does
 * nothing when w or *w is NULL. Can't fail. */
void st_writer_destroy(st_writer_t **w);
/* Adds tensor `name` (a UTF-8 string other than "__metadata__") of dtype dt
 * (F32, BF16 or F16) and shape shape[0..ndim); data holds numel elements
 * of dt in host (little-endian) order and is copied, so the caller keeps
 * it. Returns 0, or -1 with the writer unchanged and a message naming the
 * tensor on a duplicate name, a bad shape (ndim outside 0..KERN_MAX_DIMS,
 * a negative dim, a byte size that overflows) or out of memory. */
int st_writer_add(st_writer_t *w, const char *name, kern_dtype_t dt, int ndim,
                  const int64_t *shape, const void *data);
/* st_writer_add with dt = KERN_F32. */
int st_writer_add_f32(st_writer_t *w, const char *name, int ndim,
                      const int64_t *shape, const float *data);
/* Sets "__metadata__"[key] = value (both UTF-8, copied; a later call with
 * the same key replaces the value). Returns 0, or -1 with a message naming
 * the key on invalid UTF-8 or out of memory. */
int st_writer_meta(st_writer_t *w, const char *key, const char *value);
/* Writes the file atomically: to "<path>.tmp", fsync, then rename over
 * path, so readers see the old file or the whole new one. Tensors are laid
 * out back to back in insertion order; the header is padded with spaces to
 * a multiple of 8 bytes so the data buffer starts 8-byte aligned, as the
 * reference implementation does. Returns 0, or -1 with a message naming
 * the path on an I/O error (the .tmp file is removed, path is untouched).
 * The writer is unchanged and may be saved again. */
int st_writer_save(st_writer_t *w, const char *path);

#ifdef __cplusplus
}
#endif
#endif
