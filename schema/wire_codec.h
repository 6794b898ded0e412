/* wire_codec.h -- the msgpack reader and writer under wire.h and msg.h
 * (internal to schema/: nothing outside it includes this header).
 *
 * Reading: wire_tokenize checks a whole header against every limit of
 * docs/PROTOCOL.md (size, nesting, entries, string lengths, key rules,
 * duplicate keys, no bin/ext, no trailing bytes) and lays it out as a flat
 * array of tokens in document order, without one allocation per value:
 * the tokens grow in one array (inline for small headers), strings stay in
 * the header frame and tokens point at them. A container's token is
 * followed by its entries (a map's by key, value, key, value...), and every
 * token knows where its subtree ends, so skipping a value is O(1).
 *
 * Writing: wire_buf_t appends msgpack to a buffer (inline for small
 * headers). Containers are opened and closed; their entry counts are kept
 * by the writer and their headers patched to the shortest form on close.
 * Strings are written as valid UTF-8 (invalid bytes become U+FFFD), so
 * every header Reel sends can be read by a strict decoder. */
#ifndef REEL_SCHEMA_WIRE_CODEC_H
#define REEL_SCHEMA_WIRE_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "schema/wire.h"

/* ---- tokens --------------------------------------------------------------- */

/* wire_tok_t, wire_toks_t: see wire.h (the received message holds them). */

/* The token array of t (inline or heap). */
static inline const wire_tok_t *wire_toks_v(const wire_toks_t *t) {
    return t->heap ? t->heap : t->inl;
}

/* Tokenizes len bytes at buf (a header: the root must be a map) into
 * toks (reset first; its storage is reused). 0, or -1 with *err set
 * (too_large or malformed; internal on out-of-memory). *id receives the
 * root's "id" when it was read before any error (else it is untouched),
 * so a bad message can still be answered under its id; type (type_cap
 * bytes, NULL: not wanted) the root's "type" string likewise, NUL
 * terminated and cut to fit (one holding a NUL is not taken), so a bad
 * message can still be told apart by what it says it is. */
int wire_tokenize(const void *buf, size_t len, wire_toks_t *toks, uint64_t *id, char *type, size_t type_cap,
                  wire_err_t *err);
/* Frees the heap part of toks; it stays usable (empty). */
void wire_toks_free(wire_toks_t *toks);

/* The bytes of string token i (not NUL-terminated), *len set. */
static inline const char *wire_tok_str(const wire_toks_t *t, const void *buf, uint32_t i, size_t *len) {
    const wire_tok_t *k = &wire_toks_v(t)[i];
    *len = k->n;
    return (const char *)buf + k->v.off;
}
/* True when string token i equals the NUL-terminated s. */
bool wire_tok_is(const wire_toks_t *t, const void *buf, uint32_t i, const char *s);
/* In map token `map`, the value token of key s: its index, or 0 (the root
 * is token 0 and never a value) when absent. */
uint32_t wire_tok_find(const wire_toks_t *t, const void *buf, uint32_t map, const char *s);
/* Reads token i as an unsigned / signed integer / number. false when it
 * is of another kind (or out of range). A number is any integer or float. */
bool wire_tok_u64(const wire_toks_t *t, uint32_t i, uint64_t *out);
bool wire_tok_i64(const wire_toks_t *t, uint32_t i, int64_t *out);
bool wire_tok_f64(const wire_toks_t *t, uint32_t i, double *out);

/* The offset just past the msgpack value that starts at `at` in the n
 * bytes at p, or 0 when it does not end within them. For headers
 * wire_tokenize accepted (the formats it knows); no allocation, no
 * recursion: how a forwarder finds an entry's bytes to copy them. */
size_t wire_skip(const unsigned char *p, size_t n, size_t at);
/* The size of the root map's own header at p (1, 3 or 5 bytes), 0 when
 * p[0..n) does not start with a map. */
size_t wire_map_header_len(const unsigned char *p, size_t n);

/* Value-tree internals (wire_val.c): a string of n bytes (may hold NULs);
 * a container with room for n entries; appending without the duplicate
 * lookup of wv_set (key NULL for arrays), taking ownership of v (freed on
 * failure). */
wire_val_t *wv_strn(const char *s, size_t n);
wire_val_t *wv_container(bool map, size_t n);
int wv_append(wire_val_t *c, const char *key, wire_val_t *v);

/* Builds the value tree of token i (tests and tools). NULL on OOM. */
wire_val_t *wire_tok_tree(const wire_toks_t *t, const void *buf, uint32_t i);

/* ---- the writer ----------------------------------------------------------- */

#define WIRE_BUF_INLINE 1024

typedef struct {
    unsigned char *p;                    /* inl or heap */
    size_t n, cap;
    bool failed;                         /* out of memory, or containers misused */
    bool too_deep;                       /* failed: deeper than WIRE_MAX_DEPTH */
    int depth;                           /* open containers */
    size_t at[WIRE_MAX_DEPTH + 1];       /* where each open container's header is */
    uint32_t items[WIRE_MAX_DEPTH + 1];  /* values written into it (keys count) */
    bool map[WIRE_MAX_DEPTH + 1];
    unsigned char inl[WIRE_BUF_INLINE];
} wire_buf_t;

void wire_buf_init(wire_buf_t *w);
void wire_buf_free(wire_buf_t *w);
/* Writers: each counts as one value of the open container. Failures are
 * sticky in w->failed (checked once at the end). */
void wire_put_nil(wire_buf_t *w);
void wire_put_bool(wire_buf_t *w, bool b);
void wire_put_u64(wire_buf_t *w, uint64_t x);
void wire_put_i64(wire_buf_t *w, int64_t x);
void wire_put_f64(wire_buf_t *w, double x);
/* n bytes of s as a string, made valid UTF-8 (invalid bytes -> U+FFFD). */
void wire_put_strn(wire_buf_t *w, const char *s, size_t n);
void wire_put_str(wire_buf_t *w, const char *s); /* NULL writes "" */
void wire_put_map(wire_buf_t *w);
void wire_put_arr(wire_buf_t *w);
/* Appends n bytes of ready msgpack holding `values` values (a map entry
 * is two) to the open container. */
void wire_put_raw(wire_buf_t *w, const void *p, size_t n, uint32_t values);
/* Closes the innermost container, writing its count. */
void wire_put_end(wire_buf_t *w);
/* Writes the value tree v (depth counts the containers around it). */
void wire_put_tree(wire_buf_t *w, const wire_val_t *v);

/* "tensors": the n descriptors of t, in order. */
void wire_put_tensors(wire_buf_t *w, const wire_tensor_t *const *t, int n);
/* The envelope every header starts with: opens the root map and writes
 * "type", "id" and "proto", then the n tensor descriptors ("tensors").
 * The caller writes the fields and closes the root with wire_put_end. */
void wire_put_envelope(wire_buf_t *w, const char *type, uint64_t id, const wire_tensor_t *const *t,
                       int n);

/* s[0..n) as a string of at most max bytes (and WIRE_MAX_STR): invalid
 * UTF-8 bytes written as U+FFFD, cut between characters. A field of a
 * bounded size (a text of at most 31 bytes) is written within it, so a
 * peer's bytes the broker echoes (a worker's arch, its sync error) never
 * come out longer than a receiver takes. */
void wire_put_text(wire_buf_t *w, const char *s, size_t n, size_t max);

/* True when the n bytes at s are valid UTF-8. */
bool wire_utf8_valid(const char *s, size_t n);

/* ---- sending ---------------------------------------------------------------- */

/* Sends the encoded header hdr (hdr->failed: -1 with EINVAL when too
 * deep, else ENOMEM; over WIRE_MAX_HEADER: -1 EMSGSIZE) and the n tensors t[i] as frames,
 * preceded by identity when non-NULL. A tensor whose descriptor lies in
 * share->t[] goes out as a reference to share's frame (no copy); the
 * others are copied. Every part is built before the first is sent. 0, or
 * -1 with errno. */
int wire_send_buf(void *sock, const zmq_msg_t *identity, const wire_buf_t *hdr,
                  const wire_tensor_t *const *t, int n, const wire_msg_t *share);
/* As wire_send_buf, keeping a message sock cannot take at once: when keep
 * is not NULL (and empty) and the first part is refused with EAGAIN
 * (nothing went), the built parts move into *keep and -1 EAGAIN is
 * returned; sock NULL only builds the message into *keep (0). keep NULL
 * is wire_send_buf. */
int wire_send_buf_keep(void *sock, const zmq_msg_t *identity, const wire_buf_t *hdr,
                       const wire_tensor_t *const *t, int n, const wire_msg_t *share, wire_parts_t *keep);

/* Receives one message (see wire_recv); builds m->hdr only when `tree`. */
int wire_recv_as(void *sock, bool router, int flags, wire_msg_t *m, wire_err_t *err, bool tree);
/* As wire_decode; builds m->hdr only when `tree`. */
int wire_decode_as(wire_msg_t *m, zmq_msg_t *frames, size_t n, wire_err_t *err, bool tree);

/* The header bytes of a received message. */
static inline const void *wire_msg_head(const wire_msg_t *m) {
    return zmq_msg_data((zmq_msg_t *)&m->head);
}

/* Sets *err (err may be NULL); wire_types.c. */
void wire_set_err(wire_err_t *err, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
