/* wire.h -- the transport layer of Reel's wire protocol (docs/PROTOCOL.md),
 * used by every process. A message is one ZeroMQ multipart message:
 *
 *   [identity]   only on ROUTER sockets (added/removed by ZeroMQ routing)
 *   header       a msgpack map: "proto":"reel/1", "type", "id", fields...,
 *                "tensors": [{"name","dtype","shape","bytes"}, ...]
 *   tensor 0..n  raw little-endian bytes, one frame per declared tensor
 *
 * Tensors are never re-encoded inside msgpack. msgpack-c has no limits of
 * its own, so headers are read by our own bounded decoder
 * (schema/wire_codec.h), which enforces every limit *before* building
 * anything: header size, map and array counts checked against the bytes
 * present, nesting depth, string lengths, tensor count, and tensor bytes ==
 * product(shape) x dtype size == the frame's size. A bad message yields a
 * wire_err_t (code + message) and nothing else: the caller answers ERROR
 * and keeps serving.
 *
 * The fields of a message are read and written through schema/msg.h (one
 * typed struct per message type); daemons, the client library and reelctl
 * use only that. The value tree below (wire_val_t, wv_*, wire_recv's
 * m->hdr, wire_send) is the generic form of a header, kept for codec tests
 * and tools that must write arbitrary (or wrong) headers. */
#ifndef REEL_SCHEMA_WIRE_H
#define REEL_SCHEMA_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>
#include "base/error.h"
#include "base/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WIRE_PROTO "reel/1"
#define WIRE_MAX_FRAME ((int64_t)512 << 20)  /* ZMQ_MAXMSGSIZE on every socket */
#define WIRE_MAX_DIMS 6                      /* a tensor frame's dims: a group's trajectory [n,N+1,C,F,H,W] */
#define WIRE_MAX_HEADER (256 << 10)          /* header frame bytes */
#define WIRE_MAX_DEPTH 8                     /* nesting of maps/arrays */
#define WIRE_MAX_ITEMS 4096                  /* entries in one map or array */
#define WIRE_MAX_STR 4096                    /* bytes in one string */
#define WIRE_MAX_TENSORS 8

/* Error codes carried in ERROR messages ("code" field). */
#define WIRE_E_MALFORMED   "malformed"       /* not a valid message */
#define WIRE_E_TOO_LARGE   "too_large"       /* a limit exceeded */
#define WIRE_E_PROTO       "proto_mismatch"  /* missing/other "proto" */
#define WIRE_E_UNKNOWN     "unknown_type"    /* unknown "type" */
#define WIRE_E_BAD_REQUEST "bad_request"     /* fields missing or wrong */
#define WIRE_E_BUSY        "busy"
#define WIRE_E_STALE       "stale_version"   /* a sync not newer than the current */
#define WIRE_E_NO_WORKER   "no_worker"       /* nobody serves this model/version */
#define WIRE_E_WORKER_LOST "worker_lost"     /* died twice with the request */
#define WIRE_E_TIMEOUT     "timeout"
#define WIRE_E_CANCELLED   "cancelled"       /* its client sent CANCEL */
#define WIRE_E_STANDBY     "standby"         /* the standby of a pair: ask the other broker */
#define WIRE_E_SHUTDOWN    "shutdown"        /* the broker is stopping: send it again to the one that comes back */
#define WIRE_E_INTERNAL    "internal"
#define WIRE_E_FORBIDDEN   "forbidden"       /* the sender's key has a role that may not send it */

/* Whether code is one of the codes above (docs/PROTOCOL.md "Errors"): a
 * peer's ERROR naming another is not passed on as it is. */
bool wire_code_known(const char *code);

typedef struct {
    char code[24];
    char message[256];
} wire_err_t;

/* The one place a library error (base/error.h) becomes a protocol error:
 * invalid, not_found and unsupported are bad_request; limit is too_large;
 * state is busy; timeout is timeout; io, device, nomem and internal are
 * internal. */
const char *wire_err_code_of(reel_code_t code);
/* e from r: the code above and r's message, after `what` when given
 * ("UPLOAD: "). Cut to fit; never fails. */
void wire_err_from(wire_err_t *e, const reel_err_t *r, const char *what);

/* ---- values: the header tree ------------------------------------------- */

typedef enum { WV_NIL, WV_BOOL, WV_INT, WV_UINT, WV_F64, WV_STR, WV_ARR, WV_MAP } wire_kind_t;

typedef struct wire_val wire_val_t;
struct wire_val {
    wire_kind_t kind;
    union {
        bool b;
        int64_t i;
        uint64_t u;
        double f;
        struct { char *s; size_t len; } str;          /* NUL-terminated copy */
        struct { wire_val_t **v; char **k; size_t n, cap; } c; /* k only for maps */
    } as;
};

/* Constructors return NULL only on out-of-memory. */
wire_val_t *wv_map(void);
wire_val_t *wv_arr(void);
wire_val_t *wv_str(const char *s);
wire_val_t *wv_u64(uint64_t x);
wire_val_t *wv_i64(int64_t x);
wire_val_t *wv_f64(double x);
wire_val_t *wv_bool(bool b);
wire_val_t *wv_nil(void);
/* Sets map[key] = v (replacing), taking ownership of v (freed on failure).
 * Returns 0, or -1 on out-of-memory / not a map / v NULL. */
int wv_set(wire_val_t *map, const char *key, wire_val_t *v);
/* Appends v to an array, taking ownership (freed on failure). */
int wv_push(wire_val_t *arr, wire_val_t *v);
void wv_free(wire_val_t **v);

/* Lookups: NULL / false when absent or of another kind. Integers: a UINT
 * or non-negative INT reads as u64; an INT or a UINT <= INT64_MAX as i64;
 * F64 reads any number. */
const wire_val_t *wv_get(const wire_val_t *map, const char *key);
const char *wv_get_str(const wire_val_t *map, const char *key);
bool wv_get_u64(const wire_val_t *map, const char *key, uint64_t *out);
bool wv_get_i64(const wire_val_t *map, const char *key, int64_t *out);
bool wv_get_f64(const wire_val_t *map, const char *key, double *out);
bool wv_get_bool(const wire_val_t *map, const char *key, bool *out);
bool wv_as_u64(const wire_val_t *v, uint64_t *out);
bool wv_as_i64(const wire_val_t *v, int64_t *out);
bool wv_as_f64(const wire_val_t *v, double *out);
size_t wv_len(const wire_val_t *arr_or_map);            /* 0 for scalars */
const wire_val_t *wv_at(const wire_val_t *arr, size_t i);

/* ---- messages ------------------------------------------------------------ */

/* A tensor frame's dtype is a kernel dtype (F32, BF16, F16) or U8: raw
 * bytes, which only the chunks of weights by value carry (msg.h) and no
 * kernel ever sees. */
#define WIRE_U8 ((kern_dtype_t)KERN_DTYPE_COUNT)
/* Bytes per element, name, and parse, of the wire's dtypes (U8 included). */
size_t wire_dtype_size(kern_dtype_t dt);
const char *wire_dtype_name(kern_dtype_t dt);
int wire_dtype_parse(const char *name, kern_dtype_t *out);

typedef struct {
    char name[48];
    kern_dtype_t dtype;
    int ndim;
    int64_t shape[WIRE_MAX_DIMS];
    const void *data;    /* into the received frame (or the sender's memory) */
    size_t bytes;
} wire_tensor_t;

/* One token of a decoded header (schema/wire_codec.h): a value, in
 * document order; a container's entries follow it. */
typedef struct {
    uint32_t kind : 4;   /* wire_kind_t */
    uint32_t n : 28;     /* STR: bytes; ARR: entries; MAP: key/value pairs */
    uint32_t next;       /* index of the token after this value's subtree */
    uint32_t at;         /* offset in the header where the value's bytes start */
    union { bool b; int64_t i; uint64_t u; double f; uint32_t off; } v; /* STR: offset of its bytes */
} wire_tok_t;

#define WIRE_TOKS_INLINE 128 /* tokens held without an allocation (a GEN needs ~80) */

typedef struct {
    wire_tok_t *heap;    /* NULL while inl suffices */
    uint32_t n, cap;
    wire_tok_t inl[WIRE_TOKS_INLINE];
} wire_toks_t;

typedef struct wire_chunk wire_chunk_t;

/* A received message. Everything it points to (tokens, strings in the
 * header frame, tensor data, what msg_*_decode put in its arena) lives as
 * long as it is not closed. */
typedef struct {
    zmq_msg_t identity;  /* valid when has_identity */
    bool has_identity;
    zmq_msg_t head;      /* the header frame, valid when has_head */
    bool has_head;
    wire_toks_t tok;     /* the header, tokenized */
    wire_chunk_t *arena; /* what typed decoders allocated (msg.h) */
    wire_val_t *hdr;     /* the header as a value tree: wire_recv/wire_decode only */
    const char *type;    /* the "type" string (NUL-terminated; at most 71 bytes of it) */
    char type_buf[72];   /* its bytes; for a message refused as it was read, the type read first, if any */
    uint64_t id;         /* "id", 0 when absent */
    int n_tensors;
    wire_tensor_t t[WIRE_MAX_TENSORS];
    zmq_msg_t frame[WIRE_MAX_TENSORS];
} wire_msg_t;

/* Sets ZMQ_MAXMSGSIZE (WIRE_MAX_FRAME) and a zero linger on sock. */
int wire_socket_limits(void *sock);

/* The endpoint to give zmq_bind or zmq_connect for ep, written to out (n
 * bytes), with sock made ready for it: tcp://localhost:P becomes
 * tcp://127.0.0.1:P (ZeroMQ takes a bind's host for an interface name,
 * and there is no interface "localhost"), and a bracketed IPv6 host
 * (tcp://[::1]:P) turns the socket's ZMQ_IPV6 on (without it ZeroMQ binds
 * and connects to no IPv6 address). Anything else is copied as it is. -1
 * (errno) when out is too short or the option cannot be set. */
int wire_socket_endpoint(void *sock, const char *ep, char *out, size_t n);

/* Checks, without a socket, that ep is an endpoint a connect takes:
 * tcp://HOST:PORT (HOST a name, an IPv4 address or a bracketed IPv6
 * one, [::1] or [fe80::1%eth0]; PORT 1..65535; a source address may come
 * first, tcp://SRC;HOST:PORT), ipc://PATH (a path a Unix socket can hold:
 * at most 107 bytes) or inproc://NAME. A connect would make a connection
 * (and, with keys, a handshake) at once: a check that is not meant to
 * reach the peer must not connect. 0, or -1 with why (n bytes, without
 * the endpoint) set; can't fail otherwise. */
int wire_endpoint_check(const char *ep, char *why, size_t n);

/* For a daemon's main(), before its threads start: keeps the memory of
 * large frames (tensors, 4 MiB weight chunks) that ZeroMQ mallocs on its
 * I/O thread and another thread frees from being handed back to the
 * kernel after every frame (glibc trims a thread arena's top above 2x the
 * mmap threshold), so the next frame does not fault its pages in again:
 * one 4 KiB fault each, which on a VM cost as much as the copy (a by-value
 * sync of 100 MB: upload 0.24 -> 0.09 s, docs/BENCH.md). Frames up to 32
 * MiB come from the heap; up to 256 MiB of free top is kept. (reel-broker
 * sets its own trim threshold: --max-held-mb.) */
void wire_tune_malloc(void);

/* Receives one whole message (all parts) from sock; `router` means the
 * first part is a routing identity. Returns 0 with *m filled; 1 when the
 * message was malformed (all its parts consumed, *err set, m->identity
 * still valid when has_identity, m->id and m->type kept when they could be read, so
 * the caller can answer ERROR to the right request; call wire_msg_close
 * either way); -1 on a socket error or EAGAIN (errno set, nothing
 * consumed). flags as for zmq_msg_recv (ZMQ_DONTWAIT).
 * Decoding choices: bin/ext types are malformed (bytes travel as tensor
 * frames only); non-negative integers decode as WV_UINT, negative as
 * WV_INT; float32 widens to WV_F64; tensor names are unique.
 * wire_recv also builds m->hdr, the header as a value tree (tests and
 * tools); msg_recv (msg.h) is the same without it. */
int wire_recv(void *sock, bool router, int flags, wire_msg_t *m, wire_err_t *err);
/* Decodes an already-received multipart message (frames[0] = header, the
 * rest tensors) and builds m->hdr; takes ownership of the frames; resets
 * all of *m (has_identity included). 0, or 1 with *err set. */
int wire_decode(wire_msg_t *m, zmq_msg_t *frames, size_t n, wire_err_t *err);
/* Releases everything m holds and leaves it empty. NULL-safe. */
void wire_msg_close(wire_msg_t *m);
/* The type m's header names: m->type, or, for a message refused while its
 * header was read (wire_recv returned 1, m->type NULL), the root's "type"
 * string when it was read before the fault (a RESULT with trailing bytes
 * still says it is a RESULT); NULL when none was read. A refused message's
 * type is only what its sender claims: nothing in it was checked. */
static inline const char *wire_msg_type_read(const wire_msg_t *m) {
    return m->type ? m->type : m->type_buf[0] ? m->type_buf : NULL;
}
const wire_tensor_t *wire_msg_tensor(const wire_msg_t *m, const char *name);
/* n zeroed bytes that live as long as m (its arena; typed decoders use
 * it). NULL on out-of-memory. */
void *wire_msg_alloc(wire_msg_t *m, size_t n);

/* Sends hdr (a map; "proto" is added, "tensors" is written from t[]) and
 * the n tensors as frames, preceded by `identity` when non-NULL (ROUTER).
 * Tensor data is copied into the frames. 0, or -1 with errno (EINVAL for
 * what a receiver would refuse, EMSGSIZE over WIRE_MAX_HEADER); nothing is
 * sent then. hdr is not consumed. Tests and tools: daemons send typed
 * messages (msg.h). */
int wire_send(void *sock, const zmq_msg_t *identity, const wire_val_t *hdr,
              const wire_tensor_t *t, int n);
/* As wire_send with src's tensors, whose frames are shared, not copied
 * (ZeroMQ reference-counts them): how a broker forwards large tensors.
 * src keeps its frames and stays valid. */
int wire_forward(void *sock, const zmq_msg_t *identity, const wire_val_t *hdr, wire_msg_t *src);
/* A message built for a socket that could not take it yet (its peer's
 * queue full, the first part refused with EAGAIN: nothing of it went),
 * kept by its sender to send again (msg_send_keep, msg_forward_keep). Its
 * frames are its own: tensors shared from a received message are
 * reference-counted by ZeroMQ, so they outlive that message. Zeroed:
 * empty. */
typedef struct {
    zmq_msg_t part[2 + WIRE_MAX_TENSORS];
    int np;                      /* parts held; 0: empty */
} wire_parts_t;
/* Sends what p holds on sock without waiting (the socket's ZMQ_SNDTIMEO
 * decides: 0 for the daemons). 0: sent, p empty. -1 with errno EAGAIN:
 * the socket still cannot take it, p unchanged. -1 with another errno
 * (EHOSTUNREACH: a ROUTER_MANDATORY peer gone): dropped, p empty. An
 * empty p is 0. */
int wire_parts_send(void *sock, wire_parts_t *p);
/* The bytes p holds (every part). */
size_t wire_parts_bytes(const wire_parts_t *p);
/* Drops what p holds; p is empty after. Safe on an empty one. */
void wire_parts_close(wire_parts_t *p);

/* A header map {"type": type, "id": id} to add fields to. NULL on OOM. */
wire_val_t *wire_hdr(const char *type, uint64_t id);

/* Encodes hdr to msgpack bytes (malloc'd, *len set); for tests and fuzzing.
 * Strings are written as valid UTF-8. NULL on OOM or a value deeper than
 * WIRE_MAX_DEPTH. */
unsigned char *wire_encode_header(const wire_val_t *hdr, size_t *len);
/* Decodes msgpack header bytes into a value tree under the limits; NULL
 * with *err set. Never allocates more than a small multiple of len. */
wire_val_t *wire_decode_header(const void *buf, size_t len, wire_err_t *err);

#ifdef __cplusplus
}
#endif
#endif
