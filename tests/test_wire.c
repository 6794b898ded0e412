/* test_wire.c -- the wire codec: a round trip for every message type of
 * docs/PROTOCOL.md, one rejection per limit and per kind of malformed
 * header, and a randomized decoder run.
 *
 * Messages travel over real ZeroMQ sockets on inproc:// (a PAIR pair, and
 * a ROUTER with a DEALER whose routing id is "peer-1"). Bad messages are
 * sent as raw parts; after each one the test sends a good message on the
 * same socket and receives it intact, which proves wire_recv consumed every
 * part of the bad one, and on the ROUTER it answers the bad one with ERROR
 * through the identity wire_recv kept. Bad headers are built with
 * msgpack-c's packer (which happily writes duplicate keys, ext values and
 * non-string keys) or by hand for the absurd counts. Run under ASan: a
 * decoder that trusted a count of 2^32-1 would abort there on the huge
 * allocation. */
#include "schema/wire.h"
#include "schema/msg.h"
#include "schema/wire_codec.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tests/support.h"

/* ---- sockets ------------------------------------------------------------- */

static void *ctx;
static void *pair_a, *pair_b;       /* PAIR <-> PAIR */
static void *router, *dealer;       /* ROUTER <-> DEALER "peer-1" */
static int endpoint_seq;

static void *new_socket(int type) {
    void *s = zmq_socket(ctx, type);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(wire_socket_limits(s), 0);
    int timeout = 5000; /* a lost message fails the test instead of hanging it */
    ck_assert_int_eq(zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof timeout), 0);
    ck_assert_int_eq(zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout, sizeof timeout), 0);
    return s;
}

static void sockets_up(void) {
    ctx = zmq_ctx_new();
    ck_assert_ptr_nonnull(ctx);
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://wire-pair-%d", endpoint_seq);
    pair_a = new_socket(ZMQ_PAIR);
    pair_b = new_socket(ZMQ_PAIR);
    ck_assert_int_eq(zmq_bind(pair_a, ep), 0);
    ck_assert_int_eq(zmq_connect(pair_b, ep), 0);
    snprintf(ep, sizeof ep, "inproc://wire-router-%d", endpoint_seq++);
    router = new_socket(ZMQ_ROUTER);
    dealer = new_socket(ZMQ_DEALER);
    ck_assert_int_eq(zmq_setsockopt(dealer, ZMQ_ROUTING_ID, "peer-1", 6), 0);
    ck_assert_int_eq(zmq_bind(router, ep), 0);
    ck_assert_int_eq(zmq_connect(dealer, ep), 0);
}

static void sockets_down(void) {
    zmq_close(pair_a);
    zmq_close(pair_b);
    zmq_close(router);
    zmq_close(dealer);
    zmq_ctx_term(ctx);
}

/* ---- building values ----------------------------------------------------- */

static void set(wire_val_t *map, const char *key, wire_val_t *v) {
    ck_assert_int_eq(wv_set(map, key, v), 0);
}

static void push(wire_val_t *arr, wire_val_t *v) { ck_assert_int_eq(wv_push(arr, v), 0); }

static wire_val_t *hdr(const char *type, uint64_t id) {
    wire_val_t *h = wire_hdr(type, id);
    ck_assert_ptr_nonnull(h);
    return h;
}

static wire_val_t *str_arr(int n, const char *const *s) {
    wire_val_t *a = wv_arr();
    for (int i = 0; i < n; i++) push(a, wv_str(s[i]));
    return a;
}

static wire_val_t *u64_arr(int n, const uint64_t *x) {
    wire_val_t *a = wv_arr();
    for (int i = 0; i < n; i++) push(a, wv_u64(x[i]));
    return a;
}

/* Structural equality; kinds must match exactly (the tests build every
 * non-negative integer as a u64, which is what the decoder yields). */
static bool val_equal(const wire_val_t *a, const wire_val_t *b) {
    if (!a || !b || a->kind != b->kind) return false;
    switch (a->kind) {
    case WV_NIL: return true;
    case WV_BOOL: return a->as.b == b->as.b;
    case WV_INT: return a->as.i == b->as.i;
    case WV_UINT: return a->as.u == b->as.u;
    case WV_F64: return memcmp(&a->as.f, &b->as.f, sizeof a->as.f) == 0;
    case WV_STR:
        return a->as.str.len == b->as.str.len &&
               !memcmp(a->as.str.s, b->as.str.s, a->as.str.len) &&
               b->as.str.s[b->as.str.len] == '\0';
    case WV_ARR:
    case WV_MAP:
        if (a->as.c.n != b->as.c.n) return false;
        for (size_t i = 0; i < a->as.c.n; i++) {
            if (a->kind == WV_MAP && strcmp(a->as.c.k[i], b->as.c.k[i])) return false;
            if (!val_equal(a->as.c.v[i], b->as.c.v[i])) return false;
        }
        return true;
    }
    return false;
}

/* Every field the sender put is in the received header, equal, plus
 * exactly "proto" and "tensors". */
static void assert_header_survived(const wire_val_t *sent, const wire_val_t *got) {
    ck_assert_int_eq(got->kind, WV_MAP);
    for (size_t i = 0; i < sent->as.c.n; i++) {
        const wire_val_t *g = wv_get(got, sent->as.c.k[i]);
        ck_assert_msg(g != NULL, "field %s lost", sent->as.c.k[i]);
        ck_assert_msg(val_equal(sent->as.c.v[i], g), "field %s changed", sent->as.c.k[i]);
    }
    ck_assert_str_eq(wv_get_str(got, "proto"), WIRE_PROTO);
    ck_assert_ptr_nonnull(wv_get(got, "tensors"));
    ck_assert_uint_eq(wv_len(got), wv_len(sent) + 2);
}

/* ---- tensors ------------------------------------------------------------- */

typedef struct {
    wire_tensor_t t;
    unsigned char *buf;
} owned_tensor_t;

/* A tensor of the given shape filled with a pattern that depends on seed. */
static owned_tensor_t make_tensor(const char *name, kern_dtype_t dt, int ndim,
                                  const int64_t *shape, unsigned seed) {
    owned_tensor_t o;
    memset(&o, 0, sizeof o);
    snprintf(o.t.name, sizeof o.t.name, "%s", name);
    o.t.dtype = dt;
    o.t.ndim = ndim;
    size_t numel = 1;
    for (int k = 0; k < ndim; k++) {
        o.t.shape[k] = shape[k];
        numel *= (size_t)shape[k];
    }
    o.t.bytes = numel * kern_dtype_size(dt);
    o.buf = malloc(o.t.bytes ? o.t.bytes : 1);
    ck_assert_ptr_nonnull(o.buf);
    for (size_t i = 0; i < o.t.bytes; i++) o.buf[i] = (unsigned char)(i * 131u + seed * 7u + 1u);
    o.t.data = o.buf;
    return o;
}

static void assert_tensor_survived(const wire_msg_t *m, const wire_tensor_t *sent) {
    const wire_tensor_t *g = wire_msg_tensor(m, sent->name);
    ck_assert_msg(g != NULL, "tensor %s lost", sent->name);
    ck_assert_int_eq(g->dtype, sent->dtype);
    ck_assert_int_eq(g->ndim, sent->ndim);
    for (int k = 0; k < sent->ndim; k++) ck_assert_int_eq(g->shape[k], sent->shape[k]);
    ck_assert_uint_eq(g->bytes, sent->bytes);
    if (sent->bytes) ck_assert_int_eq(memcmp(g->data, sent->data, sent->bytes), 0);
}

/* ---- sending and receiving ---------------------------------------------- */

typedef enum { VIA_PAIR, TO_ROUTER, FROM_ROUTER } route_t;

/* Sends h + tensors along `route`, receives it, asserts everything
 * survived; returns the received message (caller closes). */
static wire_msg_t round_trip(route_t route, const wire_val_t *h, const owned_tensor_t *ot,
                             int n) {
    wire_tensor_t t[WIRE_MAX_TENSORS] = {0};
    for (int i = 0; i < n; i++) t[i] = ot[i].t;
    wire_msg_t m;
    wire_err_t err = {{0}, {0}};
    int rc;
    if (route == VIA_PAIR) {
        ck_assert_int_eq(wire_send(pair_a, NULL, h, t, n), 0);
        rc = wire_recv(pair_b, false, 0, &m, &err);
    } else if (route == TO_ROUTER) {
        ck_assert_int_eq(wire_send(dealer, NULL, h, t, n), 0);
        rc = wire_recv(router, true, 0, &m, &err);
    } else {
        /* the router learns the dealer's identity from a first message */
        wire_val_t *hello = hdr("HEARTBEAT", 0);
        ck_assert_int_eq(wire_send(dealer, NULL, hello, NULL, 0), 0);
        wv_free(&hello);
        wire_msg_t in;
        ck_assert_int_eq(wire_recv(router, true, 0, &in, &err), 0);
        ck_assert(in.has_identity);
        ck_assert_int_eq(wire_send(router, &in.identity, h, t, n), 0);
        wire_msg_close(&in);
        rc = wire_recv(dealer, false, 0, &m, &err);
    }
    ck_assert_msg(rc == 0, "recv rc %d: %s %s", rc, err.code, err.message);
    if (route == TO_ROUTER) {
        ck_assert(m.has_identity);
        ck_assert_uint_eq(zmq_msg_size(&m.identity), 6);
        ck_assert_int_eq(memcmp(zmq_msg_data(&m.identity), "peer-1", 6), 0);
    } else {
        ck_assert(!m.has_identity);
    }
    assert_header_survived(h, m.hdr);
    ck_assert_str_eq(m.type, wv_get_str(h, "type"));
    uint64_t id = 0;
    wv_get_u64(h, "id", &id);
    ck_assert_uint_eq(m.id, id);
    ck_assert_int_eq(m.n_tensors, n);
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(m.t[i].name, ot[i].t.name); /* order kept */
        assert_tensor_survived(&m, &ot[i].t);
    }
    return m;
}

static void free_tensors(owned_tensor_t *ot, int n) {
    for (int i = 0; i < n; i++) free(ot[i].buf);
}

/* Sends raw parts (each part: pointer + size) as one message. */
typedef struct {
    const void *p;
    size_t n;
} part_t;

static void send_raw(void *sock, const part_t *parts, int n) {
    for (int i = 0; i < n; i++)
        ck_assert_int_ge(zmq_send(sock, parts[i].p, parts[i].n, i + 1 < n ? ZMQ_SNDMORE : 0), 0);
}

/* A good message sent right after a bad one arrives intact. */
static void assert_next_message_intact(void *tx, void *rx, bool router_rx) {
    wire_val_t *h = hdr("HEARTBEAT", 424242);
    set(h, "marker", wv_str("after the bad one"));
    int64_t shape[2] = {3, 5};
    owned_tensor_t ot = make_tensor("probe", KERN_F32, 2, shape, 9);
    ck_assert_int_eq(wire_send(tx, NULL, h, &ot.t, 1), 0);
    wire_msg_t m;
    wire_err_t err;
    int rc = wire_recv(rx, router_rx, 0, &m, &err);
    ck_assert_msg(rc == 0, "good message after a bad one: %s %s", err.code, err.message);
    ck_assert_str_eq(m.type, "HEARTBEAT");
    ck_assert_uint_eq(m.id, 424242);
    ck_assert_str_eq(wv_get_str(m.hdr, "marker"), "after the bad one");
    assert_tensor_survived(&m, &ot.t);
    wire_msg_close(&m);
    wv_free(&h);
    free(ot.buf);
}

/* The raw message is rejected with `code` on a PAIR and on a ROUTER; on
 * the ROUTER the identity survives and carries an ERROR reply back; on
 * both, the next message on the socket is received intact. */
static void assert_rejected(const part_t *parts, int n, const char *code) {
    wire_msg_t m;
    wire_err_t err = {{0}, {0}};

    send_raw(pair_a, parts, n);
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 1);
    ck_assert_msg(!strcmp(err.code, code), "want %s, got %s (%s)", code, err.code, err.message);
    ck_assert(err.message[0] != '\0');
    ck_assert_ptr_null(m.hdr);
    ck_assert_int_eq(m.n_tensors, 0);
    wire_msg_close(&m);
    assert_next_message_intact(pair_a, pair_b, false);

    memset(&err, 0, sizeof err);
    send_raw(dealer, parts, n);
    ck_assert_int_eq(wire_recv(router, true, 0, &m, &err), 1);
    ck_assert_str_eq(err.code, code);
    ck_assert(m.has_identity);
    ck_assert_uint_eq(zmq_msg_size(&m.identity), 6);
    ck_assert_int_eq(memcmp(zmq_msg_data(&m.identity), "peer-1", 6), 0);
    ck_assert_int_eq(msg_send_error(router, &m.identity, 0, err.code, "%s", err.message), 0);
    wire_msg_close(&m);
    wire_msg_t reply;
    ck_assert_int_eq(wire_recv(dealer, false, 0, &reply, &err), 0);
    ck_assert_str_eq(reply.type, "ERROR");
    ck_assert_str_eq(wv_get_str(reply.hdr, "code"), code);
    wire_msg_close(&reply);
    assert_next_message_intact(dealer, router, true);
}

/* ---- raw headers --------------------------------------------------------- */

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} raw_t;

static void raw_init(raw_t *r) {
    msgpack_sbuffer_init(&r->sb);
    msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}

static void raw_str(raw_t *r, const char *s) {
    msgpack_pack_str(&r->pk, strlen(s));
    msgpack_pack_str_body(&r->pk, s, strlen(s));
}

static void raw_kv_str(raw_t *r, const char *k, const char *v) {
    raw_str(r, k);
    raw_str(r, v);
}

/* One tensor descriptor with a free hand on every field. */
typedef struct {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[8];
    uint64_t bytes;
} desc_t;

/* {"proto":"reel/1","type":"GEN","id":7,"tensors":[descs]} */
static void raw_gen_header(raw_t *r, const desc_t *d, int n) {
    raw_init(r);
    msgpack_pack_map(&r->pk, 4);
    raw_kv_str(r, "proto", WIRE_PROTO);
    raw_kv_str(r, "type", "GEN");
    raw_str(r, "id");
    msgpack_pack_uint64(&r->pk, 7);
    raw_str(r, "tensors");
    msgpack_pack_array(&r->pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        msgpack_pack_map(&r->pk, 4);
        raw_kv_str(r, "name", d[i].name);
        raw_kv_str(r, "dtype", d[i].dtype);
        raw_str(r, "shape");
        msgpack_pack_array(&r->pk, (size_t)d[i].ndim);
        for (int k = 0; k < d[i].ndim; k++) msgpack_pack_int64(&r->pk, d[i].shape[k]);
        raw_str(r, "bytes");
        msgpack_pack_uint64(&r->pk, d[i].bytes);
    }
}

/* Sends the GEN header with descriptors d and frames of the given sizes
 * (zero-filled) and asserts the rejection. */
static void assert_tensors_rejected(const desc_t *d, int n_desc, const size_t *frame_sizes,
                                    int n_frames, const char *code) {
    raw_t r;
    raw_gen_header(&r, d, n_desc);
    part_t parts[1 + 16];
    ck_assert_int_le(n_frames, 16);
    static unsigned char zeros[4096];
    parts[0] = (part_t){r.sb.data, r.sb.size};
    for (int i = 0; i < n_frames; i++) {
        ck_assert_uint_le(frame_sizes[i], sizeof zeros);
        parts[1 + i] = (part_t){zeros, frame_sizes[i]};
    }
    assert_rejected(parts, 1 + n_frames, code);
    msgpack_sbuffer_destroy(&r.sb);
}

/* Decodes bytes directly and over both sockets, expecting `code`. */
static void assert_header_rejected(const void *p, size_t n, const char *code) {
    wire_err_t err = {{0}, {0}};
    wire_val_t *v = wire_decode_header(p, n, &err);
    ck_assert_msg(v == NULL, "decoded what should fail with %s", code);
    ck_assert_msg(!strcmp(err.code, code), "want %s, got %s (%s)", code, err.code, err.message);
    part_t part = {p, n};
    assert_rejected(&part, 1, code);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- round trips, one per message type ----------------------------------- */

/* Fields of GEN / REQUEST. */
static void add_gen_fields(wire_val_t *h) {
    const uint64_t latent_shape[4] = {4, 3, 8, 8};
    set(h, "model", wv_str("small"));
    set(h, "version", wv_u64(3));
    set(h, "steps", wv_u64(20));
    set(h, "shift", wv_f64(3.0));
    set(h, "cfg", wv_f64(4.5));
    set(h, "sde", wv_bool(true));
    set(h, "eta", wv_f64(0.25));
    set(h, "seed", wv_u64(UINT64_MAX));
    set(h, "latent_shape", u64_arr(4, latent_shape));
    set(h, "progress", wv_bool(false));
    set(h, "deadline_ms", wv_u64(60000));
}

static int gen_tensors(owned_tensor_t *ot) {
    const int64_t ctx_shape[2] = {7, 16}, lat_shape[4] = {4, 3, 8, 8};
    ot[0] = make_tensor("context", KERN_F32, 2, ctx_shape, 1);
    ot[1] = make_tensor("uncond", KERN_F32, 2, ctx_shape, 2);
    ot[2] = make_tensor("latent", KERN_F32, 4, lat_shape, 3);
    return 3;
}

/* wire_endpoint_check takes, without a socket, the endpoints a connect
 * takes (each good one is given to zmq_connect too: the check is no
 * stricter than ZeroMQ), and refuses, saying why, what none could reach:
 * some ZeroMQ refuses as well, some it would take and retry for ever (a
 * port out of 1..65535, a port that is not a number after its digits). */
START_TEST(test_endpoints_are_checked_without_a_socket) {
    static const char *good[] = {
        "tcp://127.0.0.1:5555", "tcp://localhost:1", "tcp://broker-1.example_net.com:65535", "tcp://[::1]:5555",
        "tcp://[fe80::1%lo]:5555", "tcp://lo:0;[::1]:5555", "tcp://127.0.0.1:0;127.0.0.1:5555", "ipc:///tmp/x.sock",
        "ipc://@reel-abstract", "inproc://reel-x",
    };
    char why[200];
    void *ctx = zmq_ctx_new();
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        ck_assert_msg(wire_endpoint_check(good[i], why, sizeof why) == 0, "%s: %s", good[i], why);
        void *d = zmq_socket(ctx, ZMQ_DEALER);
        char ep[256];
        ck_assert_int_eq(wire_socket_limits(d), 0);
        ck_assert_int_eq(wire_socket_endpoint(d, good[i], ep, sizeof ep), 0);
        ck_assert_msg(zmq_connect(d, ep) == 0, "ZeroMQ refuses %s: %s", good[i], zmq_strerror(zmq_errno()));
        zmq_close(d);
    }
    zmq_ctx_term(ctx);
    char long_ipc[160] = "ipc:///tmp/";
    memset(long_ipc + strlen(long_ipc), 'x', 108 - 5); /* a path of 108 bytes: one more than sun_path holds */
    const struct {
        const char *ep, *says;
    } bad[] = {
        { "", "expected tcp://HOST:PORT" },           { "tcp://", "expected tcp://HOST:PORT" },
        { "tcp://:5555", "expected" },                { "tcp://host:", "the port must be a number" },
        { "tcp://host:0", "port 0 is not in 1..65535" }, { "tcp://host:65536", "port 65536 is not in" },
        { "tcp://host:99999999999999", "port 999999999999 is not in" },
        { "tcp://host:5555x", "the port must be a number" }, { "tcp://host:*", "the port must be a number" },
        { "tcp://[::1:5555", "expected" },            { "tcp://[zz]:1", "expected" },
        { "tcp://[]:1", "expected" },                 { "tcp://ho st:1", "expected" },
        { "tcp://-host:1", "expected" },              { "tcp://;host:1", "a source address" },
        { "ws://host:1", "expected" },                { "TCP://host:1", "expected" },
        { "ipc://", "without a path" },               { "ipc://@", "without a path" },
        { long_ipc, "an ipc path of 108 bytes, more than a socket path holds (107)" },
        { "inproc://", "without a name" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        ck_assert_msg(wire_endpoint_check(bad[i].ep, why, sizeof why) == -1, "'%s' was taken", bad[i].ep);
        ck_assert_msg(strstr(why, bad[i].says), "'%s': %s", bad[i].ep, why);
    }
}
END_TEST

/* wire_socket_endpoint: tcp://localhost binds (ZeroMQ alone takes it for
 * an interface name and fails), a bracketed IPv6 host gets ZMQ_IPV6, and
 * anything else passes as it is; a short buffer is an error, not a cut
 * endpoint. A real bind and connect over each, where the machine has
 * IPv6 loopback, and a connect from a source address to an IPv6 peer. */
START_TEST(test_socket_endpoints_by_name_bind_and_connect) {
    void *ctx = zmq_ctx_new();
    void *r = zmq_socket(ctx, ZMQ_ROUTER), *d = zmq_socket(ctx, ZMQ_DEALER);
    char ep[128], got[128];
    int v6 = -1;
    size_t len = sizeof v6;
    ck_assert_int_eq(wire_socket_endpoint(r, "tcp://localhost:*", ep, sizeof ep), 0);
    ck_assert_str_eq(ep, "tcp://127.0.0.1:*");
    ck_assert_int_eq(zmq_getsockopt(r, ZMQ_IPV6, &v6, &len), 0);
    ck_assert_int_eq(v6, 0);
    ck_assert_int_eq(zmq_bind(r, ep), 0);
    len = sizeof got;
    ck_assert_int_eq(zmq_getsockopt(r, ZMQ_LAST_ENDPOINT, got, &len), 0);
    const char *port = strrchr(got, ':');
    char byname[128];
    snprintf(byname, sizeof byname, "tcp://localhost%s", port);
    ck_assert_int_eq(wire_socket_endpoint(d, byname, ep, sizeof ep), 0);
    ck_assert_int_eq(zmq_connect(d, ep), 0);
    ck_assert_int_eq(zmq_send(d, "hi", 2, 0), 2);
    char id[64], buf[8];
    ck_assert_int_ge(zmq_recv(r, id, sizeof id, 0), 1);
    ck_assert_int_eq(zmq_recv(r, buf, sizeof buf, 0), 2);
    ck_assert_int_eq(wire_socket_endpoint(d, "ipc:///tmp/x.sock", ep, sizeof ep), 0);
    ck_assert_str_eq(ep, "ipc:///tmp/x.sock");
    ck_assert_int_eq(wire_socket_endpoint(d, "tcp://127.0.0.1:5555", ep, 8), -1);
    ck_assert_int_eq(errno, ENAMETOOLONG);
    zmq_close(r);
    zmq_close(d);
    /* IPv6 loopback: the option on, then a bind and a round trip */
    r = zmq_socket(ctx, ZMQ_ROUTER);
    d = zmq_socket(ctx, ZMQ_DEALER);
    ck_assert_int_eq(wire_socket_endpoint(r, "tcp://[::1]:*", ep, sizeof ep), 0);
    ck_assert_str_eq(ep, "tcp://[::1]:*");
    len = sizeof v6;
    ck_assert_int_eq(zmq_getsockopt(r, ZMQ_IPV6, &v6, &len), 0);
    ck_assert_int_eq(v6, 1);
    if (zmq_bind(r, ep) == 0) {
        len = sizeof got;
        ck_assert_int_eq(zmq_getsockopt(r, ZMQ_LAST_ENDPOINT, got, &len), 0);
        ck_assert_int_eq(wire_socket_endpoint(d, got, ep, sizeof ep), 0);
        ck_assert_int_eq(zmq_connect(d, ep), 0);
        ck_assert_int_eq(zmq_send(d, "v6", 2, 0), 2);
        ck_assert_int_ge(zmq_recv(r, id, sizeof id, 0), 1);
        ck_assert_int_eq(zmq_recv(r, buf, sizeof buf, 0), 2);
        /* from a source address (ZeroMQ's "tcp://SOURCE;PEER"): the
         * bracketed peer after the ';' needs ZMQ_IPV6 as well */
        void *d2 = zmq_socket(ctx, ZMQ_DEALER);
        char src[160];
        snprintf(src, sizeof src, "tcp://lo:0;%s", got + 6);
        ck_assert_int_eq(wire_socket_endpoint(d2, src, ep, sizeof ep), 0);
        len = sizeof v6;
        ck_assert_int_eq(zmq_getsockopt(d2, ZMQ_IPV6, &v6, &len), 0);
        ck_assert_int_eq(v6, 1);
        ck_assert_int_eq(zmq_connect(d2, ep), 0);
        ck_assert_int_eq(zmq_send(d2, "v6", 2, 0), 2);
        ck_assert_int_ge(zmq_recv(r, id, sizeof id, 0), 1);
        ck_assert_int_eq(zmq_recv(r, buf, sizeof buf, 0), 2);
        zmq_close(d2);
    } else {
        fprintf(stderr, "test_wire: SKIP the IPv6 round trip: this machine cannot bind [::1] (%s)\n",
                zmq_strerror(zmq_errno()));
    }
    zmq_close(r);
    zmq_close(d);
    zmq_ctx_term(ctx);
}
END_TEST

START_TEST(test_gen_with_context_uncond_and_latent_survives_dealer_to_router)
{
    wire_val_t *h = hdr("GEN", 11);
    add_gen_fields(h);
    owned_tensor_t ot[3];
    int n = gen_tensors(ot);
    wire_msg_t m = round_trip(TO_ROUTER, h, ot, n);
    double cfg;
    bool sde;
    uint64_t seed;
    ck_assert(wv_get_f64(m.hdr, "cfg", &cfg) && cfg == 4.5);
    ck_assert(wv_get_bool(m.hdr, "sde", &sde) && sde);
    ck_assert(wv_get_u64(m.hdr, "seed", &seed) && seed == UINT64_MAX);
    ck_assert_uint_eq(wv_len(wv_get(m.hdr, "latent_shape")), 4);
    ck_assert_str_eq(m.t[0].name, "context");
    ck_assert_int_eq(m.t[0].shape[1], 16);
    ck_assert_ptr_null(wire_msg_tensor(&m, "absent"));
    wire_msg_close(&m);
    wire_msg_close(&m); /* idempotent */
    wv_free(&h);
    free_tensors(ot, n);
}
END_TEST

START_TEST(test_request_carries_the_gen_fields_and_tensors_router_to_worker)
{
    wire_val_t *h = hdr("REQUEST", 900001);
    add_gen_fields(h);
    owned_tensor_t ot[3];
    int n = gen_tensors(ot);
    wire_msg_t m = round_trip(FROM_ROUTER, h, ot, n);
    ck_assert_str_eq(wv_get_str(m.hdr, "model"), "small");
    wire_msg_close(&m);
    wv_free(&h);
    free_tensors(ot, n);
}
END_TEST

START_TEST(test_progress_survives_both_directions)
{
    wire_val_t *h = hdr("PROGRESS", 5);
    set(h, "step", wv_u64(3));
    set(h, "steps", wv_u64(20));
    wire_msg_t m = round_trip(FROM_ROUTER, h, NULL, 0);
    uint64_t step;
    ck_assert(wv_get_u64(m.hdr, "step", &step) && step == 3);
    wire_msg_close(&m);
    m = round_trip(TO_ROUTER, h, NULL, 0);
    wire_msg_close(&m);
    wv_free(&h);
}
END_TEST

START_TEST(test_result_with_nested_stats_and_latent_survives)
{
    wire_val_t *h = hdr("RESULT", 12);
    set(h, "worker", wv_str("gpu-0"));
    set(h, "version", wv_u64(4));
    wire_val_t *stats = wv_map();
    set(stats, "captured", wv_u64(2));
    set(stats, "replayed", wv_u64(38));
    set(stats, "eager", wv_u64(0));
    wire_val_t *declines = wv_map();
    set(declines, "shape_changed", wv_u64(1));
    set(declines, "pinned_moved", wv_u64(2));
    set(stats, "declines", declines);
    set(stats, "seconds", wv_f64(1.0 / 3.0));
    set(h, "stats", stats);
    set(h, "key_hash", wv_str("9f86d081884c7d65"));
    const int64_t lat_shape[4] = {4, 3, 8, 8};
    owned_tensor_t ot = make_tensor("latent", KERN_F32, 4, lat_shape, 4);
    wire_msg_t m = round_trip(FROM_ROUTER, h, &ot, 1);
    const wire_val_t *s = wv_get(m.hdr, "stats");
    uint64_t pm;
    double secs;
    ck_assert(wv_get_u64(wv_get(s, "declines"), "pinned_moved", &pm) && pm == 2);
    ck_assert(wv_get_f64(s, "seconds", &secs) && secs == 1.0 / 3.0);
    wire_msg_close(&m);
    m = round_trip(TO_ROUTER, h, &ot, 1); /* worker -> broker too */
    wire_msg_close(&m);
    wv_free(&h);
    free(ot.buf);
}
END_TEST

START_TEST(test_busy_survives)
{
    wire_val_t *h = hdr("BUSY", 13);
    set(h, "message", wv_str("queue full (64)"));
    wire_msg_t m = round_trip(FROM_ROUTER, h, NULL, 0);
    ck_assert_str_eq(wv_get_str(m.hdr, "message"), "queue full (64)");
    wire_msg_close(&m);
    wv_free(&h);
}
END_TEST

START_TEST(test_sync_by_path_survives)
{
    wire_val_t *h = hdr("SYNC", 2);
    set(h, "component", wv_str("transformer"));
    set(h, "version", wv_u64(5));
    set(h, "sha256", wv_str("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    set(h, "path", wv_str("/var/lib/reel/weights/transformer-5.safetensors"));
    set(h, "deadline_ms", wv_u64(30000));
    wire_msg_t m = round_trip(TO_ROUTER, h, NULL, 0);
    ck_assert_str_eq(wv_get_str(m.hdr, "path"), "/var/lib/reel/weights/transformer-5.safetensors");
    wire_msg_close(&m);
    m = round_trip(FROM_ROUTER, h, NULL, 0);
    wire_msg_close(&m);
    wv_free(&h);
}
END_TEST

START_TEST(test_sync_inline_with_bf16_f16_and_scalar_weights_survives)
{
    wire_val_t *h = hdr("SYNC", 3);
    set(h, "component", wv_str("transformer"));
    set(h, "version", wv_u64(6));
    set(h, "sha256", wv_str("00ff"));
    set(h, "deadline_ms", wv_u64(0));
    const int64_t s1[1] = {33}, s2[2] = {5, 7}, s0[1] = {0};
    owned_tensor_t ot[5] = {
        make_tensor("blocks.0.attn.qkv.weight", KERN_BF16, 2, s2, 5),
        make_tensor("blocks.0.attn.qkv.bias", KERN_F16, 1, s1, 6),
        make_tensor("final.norm.weight", KERN_F32, 1, s1, 7),
        make_tensor("scale", KERN_F32, 0, NULL, 8),   /* a scalar: shape [] */
        make_tensor("empty", KERN_F32, 1, s0, 9),     /* zero elements */
    };
    wire_msg_t m = round_trip(FROM_ROUTER, h, ot, 5);
    ck_assert_int_eq(m.t[3].ndim, 0);
    ck_assert_uint_eq(m.t[3].bytes, 4);
    ck_assert_uint_eq(m.t[4].bytes, 0);
    wire_msg_close(&m);
    m = round_trip(TO_ROUTER, h, ot, 5);
    wire_msg_close(&m);
    wv_free(&h);
    free_tensors(ot, 5);
}
END_TEST

START_TEST(test_sync_done_with_applied_and_failed_arrays_survives)
{
    wire_val_t *h = hdr("SYNC_DONE", 3);
    set(h, "component", wv_str("transformer"));
    set(h, "version", wv_u64(6));
    const char *applied[] = {"gpu-0", "gpu-1"};
    set(h, "applied", str_arr(2, applied));
    wire_val_t *failed = wv_arr();
    for (int i = 0; i < 2; i++) {
        wire_val_t *f = wv_map();
        set(f, "worker", wv_str(i ? "gpu-3" : "gpu-2"));
        set(f, "reason", wv_str(i ? "sha256 mismatch" : "timeout"));
        push(failed, f);
    }
    set(h, "failed", failed);
    set(h, "complete", wv_bool(false));
    wire_msg_t m = round_trip(FROM_ROUTER, h, NULL, 0);
    const wire_val_t *f = wv_get(m.hdr, "failed");
    ck_assert_uint_eq(wv_len(f), 2);
    ck_assert_str_eq(wv_get_str(wv_at(f, 1), "reason"), "sha256 mismatch");
    bool complete = true;
    ck_assert(wv_get_bool(m.hdr, "complete", &complete) && !complete);
    wire_msg_close(&m);
    wv_free(&h);
}
END_TEST

START_TEST(test_status_survives)
{
    wire_val_t *h = hdr("STATUS", 14);
    wire_msg_t m = round_trip(TO_ROUTER, h, NULL, 0);
    ck_assert_str_eq(m.type, "STATUS");
    wire_msg_close(&m);
    wv_free(&h);
}
END_TEST

static wire_val_t *versions_map(uint64_t v) {
    wire_val_t *vm = wv_map();
    set(vm, "transformer", wv_u64(v));
    set(vm, "vae", wv_u64(1));
    return vm;
}

START_TEST(test_status_reply_with_nested_workers_survives)
{
    wire_val_t *h = hdr("STATUS_REPLY", 14);
    wire_val_t *workers = wv_arr();
    for (int i = 0; i < 3; i++) {
        wire_val_t *w = wv_map();
        char name[16];
        snprintf(name, sizeof name, "gpu-%d", i);
        set(w, "name", wv_str(name));
        set(w, "device", wv_str("NVIDIA H200"));
        set(w, "arch", wv_str("sm_90"));
        set(w, "streams", wv_u64(2));
        set(w, "inflight", wv_u64((uint64_t)i));
        set(w, "max_inflight", wv_u64(4));
        set(w, "versions", versions_map(5));
        const char *keys[] = {"0123abcd", "fedc9876"};
        set(w, "keys", str_arr(i, keys));
        set(w, "alive_ms", wv_u64(1500));
        push(workers, w);
    }
    set(h, "workers", workers);
    set(h, "queue", wv_u64(0));
    set(h, "queue_max", wv_u64(64));
    set(h, "versions", versions_map(5));
    wire_msg_t m = round_trip(FROM_ROUTER, h, NULL, 0);
    const wire_val_t *w2 = wv_at(wv_get(m.hdr, "workers"), 2);
    uint64_t tv;
    ck_assert(wv_get_u64(wv_get(w2, "versions"), "transformer", &tv) && tv == 5);
    ck_assert_str_eq(wv_at(wv_get(w2, "keys"), 1)->as.str.s, "fedc9876");
    wire_msg_close(&m);
    wv_free(&h);
}
END_TEST

START_TEST(test_ready_with_versions_map_and_models_array_survives)
{
    wire_val_t *h = hdr("READY", 0);
    set(h, "name", wv_str("gpu-0"));
    set(h, "device", wv_str("cpu"));
    set(h, "arch", wv_str("x86_64"));
    set(h, "streams", wv_u64(1));
    set(h, "budget", wv_u64((uint64_t)80 << 30));
    set(h, "max_inflight", wv_u64(2));
    const char *models[] = {"small", "base"};
    set(h, "models", str_arr(2, models));
    set(h, "versions", versions_map(0));
    wire_msg_t m = round_trip(TO_ROUTER, h, NULL, 0);
    uint64_t budget;
    ck_assert(wv_get_u64(m.hdr, "budget", &budget) && budget == (uint64_t)80 << 30);
    ck_assert_str_eq(wv_at(wv_get(m.hdr, "models"), 1)->as.str.s, "base");
    wire_msg_close(&m);
    wv_free(&h);
}
END_TEST

START_TEST(test_heartbeat_disconnect_and_reconnect_survive)
{
    const struct { const char *type; route_t route; } cases[] = {
        {"HEARTBEAT", TO_ROUTER}, {"HEARTBEAT", FROM_ROUTER},
        {"DISCONNECT", TO_ROUTER}, {"RECONNECT", FROM_ROUTER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wire_val_t *h = hdr(cases[i].type, 0);
        wire_msg_t m = round_trip(cases[i].route, h, NULL, 0);
        ck_assert_str_eq(m.type, cases[i].type);
        wire_msg_close(&m);
        wv_free(&h);
    }
}
END_TEST

START_TEST(test_sync_ack_ok_and_failed_survive)
{
    for (int ok = 0; ok < 2; ok++) {
        wire_val_t *h = hdr("SYNC_ACK", 3);
        set(h, "component", wv_str("transformer"));
        set(h, "version", wv_u64(6));
        set(h, "ok", wv_bool(ok));
        if (!ok) set(h, "error", wv_str("sha256 mismatch: got 00, want ff"));
        wire_msg_t m = round_trip(TO_ROUTER, h, NULL, 0);
        bool got;
        ck_assert(wv_get_bool(m.hdr, "ok", &got) && got == (bool)ok);
        wire_msg_close(&m);
        wv_free(&h);
    }
}
END_TEST

START_TEST(test_events_with_an_array_of_event_maps_survives)
{
    wire_val_t *h = hdr("EVENTS", 0);
    wire_val_t *events = wv_arr();
    const char *kinds[] = {"capture", "decline", "evict", "replays"};
    for (int i = 0; i < 4; i++) {
        wire_val_t *e = wv_map();
        set(e, "kind", wv_str(kinds[i]));
        set(e, "reason", wv_str(i == 1 ? "shape_changed" : ""));
        set(e, "key", wv_str("denoise/tinydit:small/euler"));
        set(e, "key_hash", wv_str("9f86d081884c7d65"));
        set(e, "stream", wv_u64(1));
        set(e, "bytes", wv_u64(123456789));
        set(e, "nodes", wv_u64(412));
        set(e, "seconds", wv_f64(0.125));
        set(e, "component", wv_str("transformer"));
        set(e, "from", wv_u64(4));
        set(e, "to", wv_u64(5));
        set(e, "count", wv_u64(40));
        push(events, e);
    }
    set(h, "events", events);
    wire_msg_t m = round_trip(TO_ROUTER, h, NULL, 0);
    const wire_val_t *ev = wv_get(m.hdr, "events");
    ck_assert_uint_eq(wv_len(ev), 4);
    ck_assert_str_eq(wv_get_str(wv_at(ev, 3), "kind"), "replays");
    wire_msg_close(&m);
    wv_free(&h);
}
END_TEST

START_TEST(test_error_survives_and_send_error_formats_its_message)
{
    wire_val_t *h = hdr("ERROR", 15);
    set(h, "code", wv_str(WIRE_E_NO_WORKER));
    set(h, "message", wv_str("nobody serves model 'huge' at version 9"));
    wire_msg_t m = round_trip(FROM_ROUTER, h, NULL, 0);
    wire_msg_close(&m);
    m = round_trip(TO_ROUTER, h, NULL, 0);
    wire_msg_close(&m);
    wv_free(&h);

    wire_err_t err;
    ck_assert_int_eq(msg_send_error(pair_a, NULL, 77, WIRE_E_BUSY, "queue %d/%d", 64, 64), 0);
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 0);
    ck_assert_str_eq(m.type, "ERROR");
    ck_assert_uint_eq(m.id, 77);
    ck_assert_str_eq(wv_get_str(m.hdr, "code"), WIRE_E_BUSY);
    ck_assert_str_eq(wv_get_str(m.hdr, "message"), "queue 64/64");
    wire_msg_close(&m);
}
END_TEST

/* ---- values and encoding ------------------------------------------------- */

/* ---- values, lookups and encoding --------------------------------------- */

/* The API has no nil constructor; WV_NIL is 0 and wv_free frees with free(). */
static wire_val_t *nil_val(void) {
    wire_val_t *v = calloc(1, sizeof *v);
    ck_assert_ptr_nonnull(v);
    return v;
}

static wire_val_t *encode_decode(const wire_val_t *v) {
    size_t len = 0;
    unsigned char *b = wire_encode_header(v, &len);
    ck_assert_ptr_nonnull(b);
    wire_err_t err;
    wire_val_t *d = wire_decode_header(b, len, &err);
    ck_assert_msg(d != NULL, "%s: %s", err.code, err.message);
    free(b);
    return d;
}

START_TEST(test_every_scalar_kind_and_format_boundary_survives_encoding)
{
    wire_val_t *h = wv_map();
    set(h, "nil", nil_val());
    set(h, "t", wv_bool(true));
    set(h, "f", wv_bool(false));
    const int64_t negs[] = {-1, -32, -33, -128, -129, -32768, -32769, INT32_MIN,
                            (int64_t)INT32_MIN - 1, INT64_MIN};
    const uint64_t poss[] = {0, 127, 128, 255, 256, 65535, 65536, UINT32_MAX,
                             (uint64_t)UINT32_MAX + 1, (uint64_t)INT64_MAX + 1, UINT64_MAX};
    wire_val_t *ints = wv_arr();
    for (size_t i = 0; i < sizeof negs / sizeof negs[0]; i++) push(ints, wv_i64(negs[i]));
    for (size_t i = 0; i < sizeof poss / sizeof poss[0]; i++) push(ints, wv_u64(poss[i]));
    set(h, "ints", ints);
    const double fs[] = {0.0, -0.0, 1.5, -1e300, 1e-310, INFINITY, -INFINITY, NAN};
    wire_val_t *floats = wv_arr();
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) push(floats, wv_f64(fs[i]));
    set(h, "floats", floats);
    static char big[WIRE_MAX_STR + 1];
    const size_t lens[] = {0, 1, 31, 32, 255, 256, WIRE_MAX_STR};
    wire_val_t *strs = wv_arr();
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        memset(big, 'a' + (int)i, lens[i]);
        big[lens[i]] = '\0';
        push(strs, wv_str(big));
    }
    set(h, "strs", strs);
    set(h, "empty_arr", wv_arr());
    set(h, "empty_map", wv_map());
    wire_val_t *d = encode_decode(h);
    ck_assert(val_equal(h, d));
    wv_free(&d);
    wv_free(&h);
    wv_free(&h); /* NULL-safe */
}
END_TEST

START_TEST(test_integer_formats_decode_by_sign_and_float32_widens_exactly)
{
    /* {"a": int8 5, "b": int64 -2, "c": uint16 300, "d": float32 0.1f,
     *  "e": int16 -300, "f": str8 "x\0y"} */
    const unsigned char b[] = {0x86, 0xa1, 'a', 0xd0, 0x05, 0xa1, 'b', 0xd3, 0xff, 0xff, 0xff,
                               0xff, 0xff, 0xff, 0xff, 0xfe, 0xa1, 'c', 0xcd, 0x01, 0x2c,
                               0xa1, 'd', 0xca, 0x3d, 0xcc, 0xcc, 0xcd, 0xa1, 'e', 0xd1, 0xfe,
                               0xd4, 0xa1, 'f', 0xd9, 0x03, 'x', 0x00, 'y'};
    wire_err_t err;
    wire_val_t *v = wire_decode_header(b, sizeof b, &err);
    ck_assert_msg(v != NULL, "%s", err.message);
    ck_assert_int_eq(wv_get(v, "a")->kind, WV_UINT);
    ck_assert_uint_eq(wv_get(v, "a")->as.u, 5);
    ck_assert_int_eq(wv_get(v, "b")->kind, WV_INT);
    ck_assert_int_eq(wv_get(v, "b")->as.i, -2);
    ck_assert_uint_eq(wv_get(v, "c")->as.u, 300);
    ck_assert_int_eq(wv_get(v, "d")->kind, WV_F64);
    ck_assert(wv_get(v, "d")->as.f == (double)0.1f);
    ck_assert_int_eq(wv_get(v, "e")->as.i, -300);
    ck_assert_uint_eq(wv_get(v, "f")->as.str.len, 3); /* NULs kept in values */
    ck_assert_int_eq(memcmp(wv_get(v, "f")->as.str.s, "x\0y", 4), 0);
    wv_free(&v);
}
END_TEST

START_TEST(test_lookups_convert_integers_as_documented_and_refuse_other_kinds)
{
    wire_val_t *h = wv_map();
    set(h, "neg", wv_i64(-5));
    set(h, "pos_int", wv_i64(5));
    set(h, "huge", wv_u64(UINT64_MAX));
    set(h, "small", wv_u64(9));
    set(h, "f", wv_f64(2.5));
    set(h, "s", wv_str("x"));
    set(h, "b", wv_bool(true));
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    bool b = false;
    ck_assert(!wv_get_u64(h, "neg", &u));
    ck_assert(wv_get_u64(h, "pos_int", &u) && u == 5);
    ck_assert(wv_get_i64(h, "neg", &i) && i == -5);
    ck_assert(!wv_get_i64(h, "huge", &i));
    ck_assert(wv_get_i64(h, "small", &i) && i == 9);
    ck_assert(wv_get_f64(h, "neg", &f) && f == -5.0);
    ck_assert(wv_get_f64(h, "huge", &f) && f == (double)UINT64_MAX);
    ck_assert(wv_get_f64(h, "f", &f) && f == 2.5);
    ck_assert(!wv_get_u64(h, "f", &u));
    ck_assert(!wv_get_i64(h, "s", &i));
    ck_assert(!wv_get_f64(h, "b", &f));
    ck_assert(!wv_get_bool(h, "small", &b));
    ck_assert(wv_get_bool(h, "b", &b) && b);
    ck_assert_ptr_null(wv_get_str(h, "small"));
    ck_assert_ptr_null(wv_get(h, "absent"));
    ck_assert_ptr_null(wv_get(wv_get(h, "s"), "x")); /* not a map */
    ck_assert_ptr_null(wv_get(NULL, "x"));
    ck_assert_uint_eq(wv_len(wv_get(h, "s")), 0);
    ck_assert_uint_eq(wv_len(NULL), 0);
    ck_assert_uint_eq(wv_len(h), 7);
    ck_assert_ptr_null(wv_at(h, 0)); /* maps are not indexed */
    wire_val_t *a = wv_arr();
    push(a, wv_u64(1));
    ck_assert_ptr_nonnull(wv_at(a, 0));
    ck_assert_ptr_null(wv_at(a, 1));
    ck_assert(!wv_as_u64(NULL, &u));
    wv_free(&a);
    wv_free(&h);
}
END_TEST

START_TEST(test_wv_set_replaces_an_existing_key_and_frees_v_on_failure)
{
    wire_val_t *h = wv_map();
    set(h, "a", wv_u64(1));
    set(h, "b", wv_u64(2));
    set(h, "a", wv_str("replaced"));
    ck_assert_uint_eq(wv_len(h), 2);
    ck_assert_str_eq(wv_get_str(h, "a"), "replaced");
    ck_assert_str_eq(h->as.c.k[0], "a"); /* position kept */
    wire_val_t *arr = wv_arr();
    /* ASan's leak check proves these v are freed on failure */
    ck_assert_int_eq(wv_set(arr, "k", wv_u64(1)), -1);
    ck_assert_int_eq(wv_set(NULL, "k", wv_u64(1)), -1);
    ck_assert_int_eq(wv_set(h, "k", NULL), -1);
    ck_assert_int_eq(wv_push(h, wv_u64(1)), -1);
    ck_assert_int_eq(wv_push(arr, NULL), -1);
    for (int i = 0; i < 100; i++) push(arr, wv_i64(-i)); /* growth */
    ck_assert_uint_eq(wv_len(arr), 100);
    ck_assert_int_eq(wv_at(arr, 99)->as.i, -99);
    ck_assert_ptr_null(wv_str(NULL));
    wv_free(&arr);
    wv_free(&h);
    ck_assert_ptr_null(h);
}
END_TEST

START_TEST(test_wire_forward_shares_frames_and_leaves_the_source_intact)
{
    wire_val_t *h = hdr("GEN", 3);
    const int64_t shape[2] = {64, 1024}; /* 256 KiB: a "long" zmq message, shared by reference */
    owned_tensor_t ot = make_tensor("latent", KERN_F32, 2, shape, 7);
    ck_assert_int_eq(wire_send(pair_a, NULL, h, &ot.t, 1), 0);
    wire_msg_t m;
    wire_err_t err;
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 0);
    wire_val_t *fh = hdr("REQUEST", 9);
    ck_assert_int_eq(wire_forward(pair_b, NULL, fh, &m), 0); /* back the other way */
    ck_assert_int_eq(wire_forward(pair_b, NULL, fh, &m), 0); /* twice: the source is reusable */
    for (int k = 0; k < 2; k++) {
        wire_msg_t f;
        ck_assert_int_eq(wire_recv(pair_a, false, 0, &f, &err), 0);
        ck_assert_str_eq(f.type, "REQUEST");
        ck_assert_uint_eq(f.id, 9);
        assert_tensor_survived(&f, &ot.t);
        wire_msg_close(&f);
    }
    assert_tensor_survived(&m, &ot.t); /* the source still holds its bytes */
    wire_msg_close(&m);
    wv_free(&fh);
    wv_free(&h);
    free(ot.buf);
}
END_TEST

START_TEST(test_wire_send_leaves_hdr_alone_and_writes_its_own_proto_and_tensors)
{
    wire_val_t *h = hdr("GEN", 1);
    set(h, "proto", wv_str("evil/9"));
    set(h, "tensors", wv_u64(5));
    set(h, "model", wv_str("small"));
    size_t len0;
    unsigned char *before = wire_encode_header(h, &len0);
    const int64_t shape[1] = {4};
    owned_tensor_t ot = make_tensor("context", KERN_F32, 1, shape, 1);
    ck_assert_int_eq(wire_send(pair_a, NULL, h, &ot.t, 1), 0);
    size_t len1;
    unsigned char *after = wire_encode_header(h, &len1);
    ck_assert_uint_eq(len0, len1);
    ck_assert_int_eq(memcmp(before, after, len0), 0);
    wire_msg_t m;
    wire_err_t err;
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 0);
    ck_assert_str_eq(wv_get_str(m.hdr, "proto"), WIRE_PROTO);
    ck_assert_uint_eq(wv_len(wv_get(m.hdr, "tensors")), 1);
    ck_assert_str_eq(wv_get_str(m.hdr, "model"), "small");
    ck_assert_uint_eq(wv_len(m.hdr), 5); /* type id model proto tensors */
    assert_tensor_survived(&m, &ot.t);
    wire_msg_close(&m);
    free(before);
    free(after);
    free(ot.buf);
    wv_free(&h);
}
END_TEST

/* A chain of `depth` arrays with a nil at the bottom. */
static wire_val_t *nested_arrays(int depth) {
    wire_val_t *v = nil_val();
    for (int i = 0; i < depth; i++) {
        wire_val_t *a = wv_arr();
        push(a, v);
        v = a;
    }
    return v;
}

START_TEST(test_encoder_and_send_refuse_values_deeper_than_max_depth)
{
    size_t len;
    wire_val_t *ok = hdr("HEARTBEAT", 1);
    set(ok, "n", nested_arrays(WIRE_MAX_DEPTH - 1)); /* root map + 7 = 8 */
    unsigned char *b = wire_encode_header(ok, &len);
    ck_assert_ptr_nonnull(b);
    free(b);
    wire_msg_t m = round_trip(VIA_PAIR, ok, NULL, 0);
    wire_msg_close(&m);

    wire_val_t *deep = hdr("HEARTBEAT", 2);
    set(deep, "n", nested_arrays(WIRE_MAX_DEPTH));
    ck_assert_ptr_null(wire_encode_header(deep, &len));
    errno = 0;
    ck_assert_int_eq(wire_send(pair_a, NULL, deep, NULL, 0), -1);
    ck_assert_int_eq(errno, EINVAL);
    assert_next_message_intact(pair_a, pair_b, false); /* nothing was sent */
    wv_free(&deep);
    wv_free(&ok);
}
END_TEST

START_TEST(test_wire_send_refuses_what_a_receiver_would_reject)
{
    wire_val_t *h = hdr("SYNC", 1);
    const int64_t shape[2] = {2, 3};
    owned_tensor_t ot = make_tensor("w", KERN_F32, 2, shape, 1);
    wire_tensor_t t[WIRE_MAX_TENSORS + 1];
    for (int i = 0; i <= WIRE_MAX_TENSORS; i++) {
        t[i] = ot.t;
        snprintf(t[i].name, sizeof t[i].name, "w%d", i);
    }
    errno = 0;
    ck_assert_int_eq(wire_send(pair_a, NULL, h, t, WIRE_MAX_TENSORS + 1), -1);
    ck_assert_int_eq(errno, EINVAL);
    t[0].bytes = 20; /* != 2 x 3 x 4 */
    ck_assert_int_eq(wire_send(pair_a, NULL, h, t, 1), -1);
    ck_assert_int_eq(errno, EINVAL);
    t[0].bytes = 24;
    t[0].shape[1] = -3;
    ck_assert_int_eq(wire_send(pair_a, NULL, h, t, 1), -1);
    t[0] = ot.t;
    t[0].ndim = KERN_MAX_DIMS + 1;
    ck_assert_int_eq(wire_send(pair_a, NULL, h, t, 1), -1);
    wire_val_t *arr = wv_arr();
    ck_assert_int_eq(wire_send(pair_a, NULL, arr, NULL, 0), -1); /* not a map */
    wv_free(&arr);
    /* a header over WIRE_MAX_HEADER */
    static char big[WIRE_MAX_STR + 1];
    memset(big, 'x', WIRE_MAX_STR);
    for (int i = 0; i < WIRE_MAX_HEADER / WIRE_MAX_STR + 1; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        set(h, k, wv_str(big));
    }
    ck_assert_int_eq(wire_send(pair_a, NULL, h, NULL, 0), -1);
    ck_assert_int_eq(errno, EMSGSIZE);
    assert_next_message_intact(pair_a, pair_b, false); /* nothing was sent */
    free(ot.buf);
    wv_free(&h);
}
END_TEST

START_TEST(test_recv_without_a_message_and_dontwait_returns_minus_one_eagain)
{
    wire_msg_t m;
    wire_err_t err;
    errno = 0;
    ck_assert_int_eq(wire_recv(pair_b, false, ZMQ_DONTWAIT, &m, &err), -1);
    ck_assert_int_eq(errno, EAGAIN);
    wire_msg_close(&m); /* safe after -1 */
    ck_assert_int_eq(wire_recv(router, true, ZMQ_DONTWAIT, &m, &err), -1);
    ck_assert_int_eq(errno, EAGAIN);
    ck_assert(!m.has_identity);
    assert_next_message_intact(pair_a, pair_b, false);
}
END_TEST

static void frame_of(zmq_msg_t *f, const void *p, size_t n) {
    ck_assert_int_eq(zmq_msg_init_size(f, n), 0);
    if (n) memcpy(zmq_msg_data(f), p, n);
}

START_TEST(test_wire_decode_takes_frames_already_received)
{
    desc_t d[2] = {{"context", "F32", 2, {2, 2}, 16}, {"latent", "BF16", 1, {3}, 6}};
    raw_t r;
    raw_gen_header(&r, d, 2);
    const float ctxv[4] = {1, 2, 3, 4};
    const uint16_t lat[3] = {0x3f80, 0x4000, 0x4040};
    zmq_msg_t f[3];
    frame_of(&f[0], r.sb.data, r.sb.size);
    frame_of(&f[1], ctxv, sizeof ctxv);
    frame_of(&f[2], lat, sizeof lat);
    wire_msg_t m;
    m.has_identity = true; /* garbage from the caller: wire_decode resets it */
    wire_err_t err;
    ck_assert_int_eq(wire_decode(&m, f, 3, &err), 0);
    ck_assert(!m.has_identity);
    ck_assert_str_eq(m.type, "GEN");
    ck_assert_uint_eq(m.id, 7);
    ck_assert_int_eq(memcmp(wire_msg_tensor(&m, "context")->data, ctxv, sizeof ctxv), 0);
    ck_assert_int_eq(memcmp(wire_msg_tensor(&m, "latent")->data, lat, sizeof lat), 0);
    ck_assert_int_eq(wire_msg_tensor(&m, "latent")->dtype, KERN_BF16);
    wire_msg_close(&m);

    /* too many frames: all of them are closed (ASan would see the leak) */
    zmq_msg_t many[12];
    frame_of(&many[0], r.sb.data, r.sb.size);
    for (int i = 1; i < 12; i++) frame_of(&many[i], ctxv, sizeof ctxv);
    ck_assert_int_eq(wire_decode(&m, many, 12, &err), 1);
    ck_assert_str_eq(err.code, WIRE_E_TOO_LARGE);
    wire_msg_close(&m);
    ck_assert_int_eq(wire_decode(&m, many, 0, &err), 1);
    ck_assert_str_eq(err.code, WIRE_E_MALFORMED);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

/* ---- limits -------------------------------------------------------------- */

/* A valid header of exactly `size` bytes (size >= 64): full strings
 * plus one padding string whose length is adjusted until it fits. */
static unsigned char *header_of_size(size_t size, size_t *len) {
    size_t nfull = (size - 64) / (WIRE_MAX_STR + 16);
    long pad = 0;
    static char s[WIRE_MAX_STR + 1];
    memset(s, 'p', WIRE_MAX_STR);
    for (int tries = 0; tries < 8; tries++) {
        raw_t r;
        raw_init(&r);
        msgpack_pack_map(&r.pk, 3 + nfull);
        raw_kv_str(&r, "proto", WIRE_PROTO);
        raw_kv_str(&r, "type", "HEARTBEAT");
        for (size_t i = 0; i < nfull; i++) {
            char k[24];
            snprintf(k, sizeof k, "k%05zu", i);
            raw_str(&r, k);
            msgpack_pack_str(&r.pk, WIRE_MAX_STR);
            msgpack_pack_str_body(&r.pk, s, WIRE_MAX_STR);
        }
        raw_str(&r, "pad");
        msgpack_pack_str(&r.pk, (size_t)pad);
        msgpack_pack_str_body(&r.pk, s, (size_t)pad);
        if (r.sb.size == size) {
            *len = r.sb.size;
            return (unsigned char *)msgpack_sbuffer_release(&r.sb);
        }
        pad += (long)size - (long)r.sb.size; /* a format change may overshoot: retry */
        msgpack_sbuffer_destroy(&r.sb);
        ck_assert(pad >= 0 && pad <= WIRE_MAX_STR);
    }
    ck_abort_msg("no header of exactly %zu bytes", size);
    return NULL;
}

START_TEST(test_header_over_max_header_is_too_large_and_one_at_the_limit_decodes)
{
    size_t len;
    unsigned char *b = header_of_size(WIRE_MAX_HEADER, &len);
    ck_assert_uint_eq(len, WIRE_MAX_HEADER);
    wire_err_t err;
    wire_val_t *v = wire_decode_header(b, len, &err);
    ck_assert_msg(v != NULL, "%s", err.message);
    wv_free(&v);
    part_t p = {b, len};
    send_raw(pair_a, &p, 1);
    wire_msg_t m;
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 0);
    wire_msg_close(&m);
    free(b);

    b = header_of_size(WIRE_MAX_HEADER + 1, &len);
    ck_assert_uint_eq(len, WIRE_MAX_HEADER + 1);
    assert_header_rejected(b, len, WIRE_E_TOO_LARGE);
    free(b);
}
END_TEST

START_TEST(test_array_declaring_2_pow_32_minus_1_elements_in_5_bytes_is_rejected_without_allocating)
{
    /* {"a": array32(0xffffffff)} and a map32 header of 0xffffffff entries */
    const unsigned char arr[] = {0x81, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff};
    const unsigned char map[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    double t0 = now_s();
    for (int i = 0; i < 1000; i++) {
        wire_err_t err;
        ck_assert_ptr_null(wire_decode_header(arr, sizeof arr, &err));
        ck_assert_str_eq(err.code, WIRE_E_TOO_LARGE);
        ck_assert_ptr_null(wire_decode_header(map, sizeof map, &err));
        ck_assert_str_eq(err.code, WIRE_E_TOO_LARGE);
    }
    ck_assert_msg(now_s() - t0 < 0.5, "2000 rejections took %.3f s", now_s() - t0);
    assert_header_rejected(arr, sizeof arr, WIRE_E_TOO_LARGE);
    assert_header_rejected(map, sizeof map, WIRE_E_TOO_LARGE);
}
END_TEST

START_TEST(test_map_or_array_claiming_more_entries_than_bytes_left_is_malformed)
{
    /* {"a": map16 of 16 entries followed by 3 bytes} */
    const unsigned char m16[] = {0x81, 0xa1, 'a', 0xde, 0x00, 0x10, 0xa1, 'x', 0xc0};
    assert_header_rejected(m16, sizeof m16, WIRE_E_MALFORMED);
    /* refused at the map header, before any entry is decoded or any room
     * for 16 entries allocated (a later "truncated" would come too late) */
    wire_err_t err;
    ck_assert_ptr_null(wire_decode_header(m16, sizeof m16, &err));
    ck_assert_msg(strstr(err.message, "16 entries in 3 bytes"), "%s", err.message);
    /* a fixmap of 5 entries with 5 bytes left: each entry needs 2 */
    const unsigned char fm[] = {0x81, 0xa1, 'a', 0x85, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0};
    assert_header_rejected(fm, sizeof fm, WIRE_E_MALFORMED);
    /* array16 of 4096 (within WIRE_MAX_ITEMS) with 1 byte left */
    const unsigned char a16[] = {0x81, 0xa1, 'a', 0xdc, 0x10, 0x00, 0xc0};
    assert_header_rejected(a16, sizeof a16, WIRE_E_MALFORMED);
}
END_TEST

/* {"a": array16 of n nils} */
static unsigned char *array_of_nils(size_t n, size_t *len) {
    unsigned char *b = malloc(6 + n);
    ck_assert_ptr_nonnull(b);
    const unsigned char head[] = {0x81, 0xa1, 'a', 0xdc, (unsigned char)(n >> 8),
                                  (unsigned char)n};
    memcpy(b, head, sizeof head);
    memset(b + 6, 0xc0, n);
    *len = 6 + n;
    return b;
}

START_TEST(test_more_than_max_items_is_too_large_and_max_items_decodes)
{
    size_t len;
    unsigned char *b = array_of_nils(WIRE_MAX_ITEMS, &len);
    wire_err_t err;
    wire_val_t *v = wire_decode_header(b, len, &err);
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(wv_len(wv_get(v, "a")), WIRE_MAX_ITEMS);
    wv_free(&v);
    free(b);
    b = array_of_nils(WIRE_MAX_ITEMS + 1, &len);
    assert_header_rejected(b, len, WIRE_E_TOO_LARGE);
    free(b);
}
END_TEST

/* {"proto","type","n": `arrays` nested arrays} */
static void raw_nested(raw_t *r, int arrays) {
    raw_init(r);
    msgpack_pack_map(&r->pk, 3);
    raw_kv_str(r, "proto", WIRE_PROTO);
    raw_kv_str(r, "type", "HEARTBEAT");
    raw_str(r, "n");
    for (int i = 0; i < arrays; i++) msgpack_pack_array(&r->pk, 1);
    msgpack_pack_nil(&r->pk);
}

START_TEST(test_nesting_deeper_than_max_depth_is_too_large)
{
    raw_t r;
    raw_nested(&r, WIRE_MAX_DEPTH - 1); /* the root map makes it WIRE_MAX_DEPTH */
    part_t p = {r.sb.data, r.sb.size};
    send_raw(pair_a, &p, 1);
    wire_msg_t m;
    wire_err_t err;
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 0);
    wire_msg_close(&m);
    msgpack_sbuffer_destroy(&r.sb);
    raw_nested(&r, WIRE_MAX_DEPTH);
    assert_header_rejected(r.sb.data, r.sb.size, WIRE_E_TOO_LARGE);
    msgpack_sbuffer_destroy(&r.sb);
    /* far deeper than msgpack-c's own limit of 32: no stack trouble either */
    raw_nested(&r, 10000);
    assert_header_rejected(r.sb.data, r.sb.size, WIRE_E_TOO_LARGE);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

START_TEST(test_string_longer_than_max_str_is_too_large_as_value_or_key)
{
    static char s[WIRE_MAX_STR + 2];
    memset(s, 'z', sizeof s - 1);
    for (int as_key = 0; as_key < 2; as_key++)
        for (size_t n = WIRE_MAX_STR; n <= WIRE_MAX_STR + 1; n++) {
            raw_t r;
            raw_init(&r);
            msgpack_pack_map(&r.pk, 3);
            raw_kv_str(&r, "proto", WIRE_PROTO);
            raw_kv_str(&r, "type", "HEARTBEAT");
            msgpack_pack_str(&r.pk, as_key ? n : 1);
            msgpack_pack_str_body(&r.pk, s, as_key ? n : 1);
            msgpack_pack_str(&r.pk, as_key ? 1 : n);
            msgpack_pack_str_body(&r.pk, s, as_key ? 1 : n);
            if (n == WIRE_MAX_STR) {
                wire_err_t err;
                wire_val_t *v = wire_decode_header(r.sb.data, r.sb.size, &err);
                ck_assert_ptr_nonnull(v);
                wv_free(&v);
            } else {
                assert_header_rejected(r.sb.data, r.sb.size, WIRE_E_TOO_LARGE);
            }
            msgpack_sbuffer_destroy(&r.sb);
        }
    /* str32 claiming 4 GiB in 5 bytes */
    const unsigned char huge[] = {0x81, 0xa1, 'a', 0xdb, 0xff, 0xff, 0xff, 0xff};
    assert_header_rejected(huge, sizeof huge, WIRE_E_TOO_LARGE);
}
END_TEST

START_TEST(test_more_than_max_tensors_is_too_large)
{
    desc_t d[12];
    size_t sizes[12];
    char names[12][16];
    for (int i = 0; i < 12; i++) {
        snprintf(names[i], sizeof names[i], "t%d", i);
        d[i] = (desc_t){names[i], "F32", 1, {2}, 8};
        sizes[i] = 8;
    }
    assert_tensors_rejected(d, WIRE_MAX_TENSORS + 1, sizes, WIRE_MAX_TENSORS + 1,
                            WIRE_E_TOO_LARGE);
    assert_tensors_rejected(d, 12, sizes, 12, WIRE_E_TOO_LARGE); /* past wire_recv's slots */
    assert_tensors_rejected(d, 0, sizes, 12, WIRE_E_TOO_LARGE);
}
END_TEST

START_TEST(test_tensor_bytes_not_numel_times_dtype_size_is_malformed)
{
    desc_t d = {"latent", "F32", 2, {2, 3}, 20};
    size_t sz = 20;
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
    d = (desc_t){"latent", "BF16", 2, {2, 3}, 24}; /* F32's size, not BF16's */
    sz = 24;
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
}
END_TEST

START_TEST(test_declared_bytes_not_the_frame_size_is_malformed)
{
    desc_t d = {"latent", "F32", 2, {2, 3}, 24};
    size_t sz = 20;
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
    sz = 28;
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
}
END_TEST

START_TEST(test_frame_count_not_matching_declared_tensors_is_malformed_both_ways)
{
    desc_t d[2] = {{"a", "F32", 1, {2}, 8}, {"b", "F32", 1, {2}, 8}};
    size_t sizes[3] = {8, 8, 8};
    assert_tensors_rejected(d, 2, sizes, 1, WIRE_E_MALFORMED); /* fewer */
    assert_tensors_rejected(d, 2, sizes, 0, WIRE_E_MALFORMED);
    assert_tensors_rejected(d, 1, sizes, 2, WIRE_E_MALFORMED); /* more */
    assert_tensors_rejected(d, 2, sizes, 3, WIRE_E_MALFORMED);
    /* no "tensors" key at all, one frame */
    raw_t r;
    raw_init(&r);
    msgpack_pack_map(&r.pk, 2);
    raw_kv_str(&r, "proto", WIRE_PROTO);
    raw_kv_str(&r, "type", "HEARTBEAT");
    part_t parts[2] = {{r.sb.data, r.sb.size}, {"abcd", 4}};
    assert_rejected(parts, 2, WIRE_E_MALFORMED);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

START_TEST(test_shape_with_more_than_max_dims_is_too_large)
{
    desc_t d = {"x", "F32", WIRE_MAX_DIMS + 1, {1, 1, 1, 1, 1, 1, 2}, 8};
    size_t sz = 8;
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_TOO_LARGE);
    d = (desc_t){"x", "F32", WIRE_MAX_DIMS, {1, 1, 1, 1, 1, 2}, 8}; /* 6 is fine: a group's trajectory */
    raw_t r;
    raw_gen_header(&r, &d, 1);
    part_t parts[2] = {{r.sb.data, r.sb.size}, {"12345678", 8}};
    send_raw(pair_a, parts, 2);
    wire_msg_t m;
    wire_err_t err;
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 0);
    ck_assert_int_eq(m.t[0].ndim, WIRE_MAX_DIMS);
    wire_msg_close(&m);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

START_TEST(test_negative_dim_is_malformed)
{
    desc_t d = {"x", "F32", 2, {-2, -3}, 24};
    size_t sz = 24;
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
    d = (desc_t){"x", "F32", 2, {INT64_MIN, 0}, 0};
    sz = 0;
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
}
END_TEST

START_TEST(test_element_or_byte_count_overflow_is_malformed)
{
    size_t sz = 0;
    desc_t d = {"x", "F32", 3, {(int64_t)1 << 32, (int64_t)1 << 32, 2}, 0};
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
    d = (desc_t){"x", "F32", 1, {(int64_t)1 << 62}, 0}; /* numel fits, x4 does not */
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
    d = (desc_t){"x", "F32", 2, {INT64_MAX, 0}, 0}; /* a zero makes it fine */
    raw_t r;
    raw_gen_header(&r, &d, 1);
    part_t parts[2] = {{r.sb.data, r.sb.size}, {"", 0}};
    send_raw(pair_a, parts, 2);
    wire_msg_t m;
    wire_err_t err;
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 0);
    ck_assert_uint_eq(m.t[0].bytes, 0);
    wire_msg_close(&m);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

START_TEST(test_unknown_dtype_is_malformed)
{
    size_t sz = 8;
    desc_t d = {"x", "F64", 1, {1}, 8};
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
    d = (desc_t){"x", "f32", 1, {2}, 8};
    assert_tensors_rejected(&d, 1, &sz, 1, WIRE_E_MALFORMED);
}
END_TEST

START_TEST(test_bad_tensor_names_and_descriptors_are_malformed)
{
    size_t sizes[2] = {8, 8};
    char long_name[49];
    memset(long_name, 'n', 48);
    long_name[48] = '\0';
    desc_t d[2] = {{"", "F32", 1, {2}, 8}, {"b", "F32", 1, {2}, 8}};
    assert_tensors_rejected(d, 1, sizes, 1, WIRE_E_MALFORMED); /* empty */
    d[0].name = long_name;
    assert_tensors_rejected(d, 1, sizes, 1, WIRE_E_MALFORMED); /* 48 bytes */
    long_name[47] = '\0';
    d[0].name = long_name; /* 47 bytes is the most that fits */
    raw_t r;
    raw_gen_header(&r, d, 1);
    part_t ok[2] = {{r.sb.data, r.sb.size}, {"12345678", 8}};
    send_raw(pair_a, ok, 2);
    wire_msg_t m;
    wire_err_t err;
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 0);
    ck_assert_str_eq(m.t[0].name, long_name);
    wire_msg_close(&m);
    msgpack_sbuffer_destroy(&r.sb);
    d[0].name = "b";
    assert_tensors_rejected(d, 2, sizes, 2, WIRE_E_MALFORMED); /* duplicate name */

    /* "tensors" not an array; a descriptor not a map; "bytes" missing */
    for (int c = 0; c < 3; c++) {
        raw_init(&r);
        msgpack_pack_map(&r.pk, 3);
        raw_kv_str(&r, "proto", WIRE_PROTO);
        raw_kv_str(&r, "type", "GEN");
        raw_str(&r, "tensors");
        if (c == 0) {
            raw_str(&r, "context");
        } else if (c == 1) {
            msgpack_pack_array(&r.pk, 1);
            raw_str(&r, "context");
        } else {
            msgpack_pack_array(&r.pk, 1);
            msgpack_pack_map(&r.pk, 3);
            raw_kv_str(&r, "name", "context");
            raw_kv_str(&r, "dtype", "F32");
            raw_str(&r, "shape");
            msgpack_pack_array(&r.pk, 1);
            msgpack_pack_uint64(&r.pk, 2);
        }
        part_t parts[2] = {{r.sb.data, r.sb.size}, {"12345678", 8}};
        assert_rejected(parts, c == 0 ? 1 : 2, WIRE_E_MALFORMED);
        msgpack_sbuffer_destroy(&r.sb);
    }
}
END_TEST

START_TEST(test_rejected_message_keeps_its_id_and_identity_so_the_error_can_answer_it)
{
    desc_t d = {"latent", "F32", 2, {2, 3}, 24};
    raw_t r;
    raw_gen_header(&r, &d, 1); /* id 7 */
    part_t parts[2] = {{r.sb.data, r.sb.size}, {"short", 5}};
    send_raw(dealer, parts, 2);
    wire_msg_t m;
    wire_err_t err;
    ck_assert_int_eq(wire_recv(router, true, 0, &m, &err), 1);
    ck_assert_uint_eq(m.id, 7);
    ck_assert(m.has_identity);
    ck_assert_int_eq(msg_send_error(router, &m.identity, m.id, err.code, "%s", err.message), 0);
    wire_msg_close(&m);
    ck_assert_int_eq(wire_recv(dealer, false, 0, &m, &err), 0);
    ck_assert_str_eq(m.type, "ERROR");
    ck_assert_uint_eq(m.id, 7);
    ck_assert_str_eq(wv_get_str(m.hdr, "code"), WIRE_E_MALFORMED);
    ck_assert_ptr_nonnull(strstr(wv_get_str(m.hdr, "message"), "latent"));
    wire_msg_close(&m);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

/* A type with a NUL in it is no type: malformed, not answered as "STA". */
START_TEST(test_a_type_with_a_nul_byte_is_malformed)
{
    raw_t r;
    raw_init(&r); /* a type with a NUL in it is no type: malformed, not "STA" */
    msgpack_pack_map(&r.pk, 2);
    raw_kv_str(&r, "proto", "reel/1");
    raw_str(&r, "type");
    msgpack_pack_str(&r.pk, 7);
    msgpack_pack_str_body(&r.pk, "STA\0TUS", 7);
    part_t nul = {r.sb.data, r.sb.size};
    assert_rejected(&nul, 1, WIRE_E_MALFORMED);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

/* A proto quoted up to its NUL would read as the one wanted ("proto
 * "reel/1", want "reel/1""): the message says a NUL is there instead. */
START_TEST(test_a_proto_with_a_nul_byte_is_named_for_its_nul_not_quoted_as_reel_1)
{
    raw_t r;
    raw_init(&r);
    msgpack_pack_map(&r.pk, 2);
    raw_str(&r, "proto");
    msgpack_pack_str(&r.pk, 8);
    msgpack_pack_str_body(&r.pk, "reel/1\0x", 8);
    raw_kv_str(&r, "type", "STATUS");
    part_t p = {r.sb.data, r.sb.size};
    assert_rejected(&p, 1, WIRE_E_PROTO);
    send_raw(pair_a, &p, 1);
    wire_msg_t m;
    wire_err_t err = {{0}, {0}};
    ck_assert_int_eq(wire_recv(pair_b, false, 0, &m, &err), 1);
    ck_assert_str_eq(err.code, WIRE_E_PROTO);
    ck_assert_msg(strstr(err.message, "NUL") != NULL, "message: %s", err.message);
    ck_assert_msg(strstr(err.message, "proto \"reel/1\"") == NULL, "message: %s", err.message);
    wire_msg_close(&m);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

START_TEST(test_missing_or_wrong_proto_is_proto_mismatch)
{
    raw_t r;
    raw_init(&r);
    msgpack_pack_map(&r.pk, 1);
    raw_kv_str(&r, "type", "GEN");
    part_t missing = {r.sb.data, r.sb.size};
    assert_rejected(&missing, 1, WIRE_E_PROTO);
    msgpack_sbuffer_destroy(&r.sb);
    const char *wrong[] = {"reel/2", "reel/1 ", "REEL/1", ""};
    for (int i = 0; i < 4; i++) {
        raw_init(&r);
        msgpack_pack_map(&r.pk, 2);
        raw_kv_str(&r, "proto", wrong[i]);
        raw_kv_str(&r, "type", "GEN");
        part_t p = {r.sb.data, r.sb.size};
        assert_rejected(&p, 1, WIRE_E_PROTO);
        msgpack_sbuffer_destroy(&r.sb);
    }
    raw_init(&r); /* proto of another kind */
    msgpack_pack_map(&r.pk, 2);
    raw_str(&r, "proto");
    msgpack_pack_uint64(&r.pk, 1);
    raw_kv_str(&r, "type", "GEN");
    part_t p = {r.sb.data, r.sb.size};
    assert_rejected(&p, 1, WIRE_E_PROTO);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

START_TEST(test_missing_or_non_string_type_and_non_uint_id_are_malformed)
{
    for (int c = 0; c < 4; c++) {
        raw_t r;
        raw_init(&r);
        msgpack_pack_map(&r.pk, c < 2 ? 1 + c : 3);
        raw_kv_str(&r, "proto", WIRE_PROTO);
        if (c == 1) {
            raw_str(&r, "type");
            msgpack_pack_uint64(&r.pk, 3);
        } else if (c >= 2) {
            raw_kv_str(&r, "type", "GEN");
            raw_str(&r, "id");
            if (c == 2) msgpack_pack_int64(&r.pk, -1);
            else raw_str(&r, "7");
        }
        part_t p = {r.sb.data, r.sb.size};
        assert_rejected(&p, 1, WIRE_E_MALFORMED);
        msgpack_sbuffer_destroy(&r.sb);
    }
}
END_TEST

START_TEST(test_non_map_or_empty_header_is_malformed)
{
    const unsigned char arr[] = {0x92, 0xa5, 'p', 'r', 'o', 't', 'o', 0xc0};
    assert_header_rejected(arr, sizeof arr, WIRE_E_MALFORMED);
    const unsigned char str[] = {0xa3, 'G', 'E', 'N'};
    assert_header_rejected(str, sizeof str, WIRE_E_MALFORMED);
    const unsigned char nil[] = {0xc0};
    assert_header_rejected(nil, sizeof nil, WIRE_E_MALFORMED);
    assert_header_rejected("", 0, WIRE_E_MALFORMED);
    const char json[] = "{\"proto\":\"reel/1\",\"type\":\"GEN\"}";
    assert_header_rejected(json, sizeof json - 1, WIRE_E_MALFORMED);
}
END_TEST

/* 0xc1 is the one byte MessagePack never uses: a header that starts with
 * it is not MessagePack at all, not a value other than a map (a reader
 * looking for the fault would look at the wrong thing); inside a header
 * it is named the same way, with where it stands. A root of another type
 * is still "not a map". */
START_TEST(test_a_header_of_byte_0xc1_is_not_messagepack_rather_than_not_a_map)
{
    const unsigned char *cases[] = { (const unsigned char *)"\xc1", (const unsigned char *)"\xc1\x80" };
    const size_t lens[] = { 1, 2 };
    for (int i = 0; i < 2; i++) {
        wire_err_t err = {{0}, {0}};
        ck_assert_ptr_null(wire_decode_header(cases[i], lens[i], &err));
        ck_assert_str_eq(err.code, WIRE_E_MALFORMED);
        ck_assert_msg(strstr(err.message, "not MessagePack") && strstr(err.message, "offset 0") &&
                      !strstr(err.message, "not a map"), "case %d: %s", i, err.message);
    }
    const unsigned char inner[] = {0x81, 0xa1, 'x', 0xc1};
    wire_err_t err = {{0}, {0}};
    ck_assert_ptr_null(wire_decode_header(inner, sizeof inner, &err));
    ck_assert_str_eq(err.code, WIRE_E_MALFORMED);
    ck_assert_msg(strstr(err.message, "not MessagePack") && strstr(err.message, "offset 3"), "%s", err.message);
    const unsigned char arr[] = {0x91, 0xc0};
    ck_assert_ptr_null(wire_decode_header(arr, sizeof arr, &err));
    ck_assert_msg(strstr(err.message, "not a map"), "%s", err.message);
}
END_TEST

/* A rich valid header (with tensor descriptors) as bytes. */
static unsigned char *rich_header(size_t *len) {
    wire_val_t *h = hdr("STATUS_REPLY", 99);
    wire_val_t *workers = wv_arr();
    for (int i = 0; i < 2; i++) {
        wire_val_t *w = wv_map();
        set(w, "name", wv_str(i ? "gpu-1" : "gpu-0"));
        set(w, "versions", versions_map(3));
        const char *keys[] = {"00ff", "ff00"};
        set(w, "keys", str_arr(2, keys));
        set(w, "alive_ms", wv_u64(70000));
        set(w, "load", wv_f64(0.5));
        set(w, "delta", wv_i64(-70000));
        push(workers, w);
    }
    set(h, "workers", workers);
    set(h, "proto", wv_str(WIRE_PROTO));
    wire_val_t *tensors = wv_arr();
    wire_val_t *t = wv_map();
    set(t, "name", wv_str("latent"));
    set(t, "dtype", wv_str("F32"));
    const uint64_t shape[2] = {2, 3};
    set(t, "shape", u64_arr(2, shape));
    set(t, "bytes", wv_u64(24));
    push(tensors, t);
    set(h, "tensors", tensors);
    unsigned char *b = wire_encode_header(h, len);
    ck_assert_ptr_nonnull(b);
    wv_free(&h);
    return b;
}

START_TEST(test_every_prefix_of_a_valid_header_fails_cleanly)
{
    size_t len;
    unsigned char *b = rich_header(&len);
    wire_err_t err;
    wire_val_t *v = wire_decode_header(b, len, &err);
    ck_assert_ptr_nonnull(v);
    wv_free(&v);
    for (size_t n = 0; n < len; n++) {
        /* a copy of exactly n bytes, so ASan sees any read past the end */
        unsigned char *p = malloc(n ? n : 1);
        memcpy(p, b, n);
        ck_assert_msg(wire_decode_header(p, n, &err) == NULL, "prefix %zu decoded", n);
        ck_assert_str_eq(err.code, WIRE_E_MALFORMED);
        if (n % 16 == 0) assert_header_rejected(p, n, WIRE_E_MALFORMED);
        free(p);
    }
    free(b);
}
END_TEST

START_TEST(test_trailing_bytes_after_the_header_are_malformed)
{
    size_t len;
    unsigned char *b = rich_header(&len);
    unsigned char *p = malloc(len + 1);
    memcpy(p, b, len);
    p[len] = 0xc0;
    assert_header_rejected(p, len + 1, WIRE_E_MALFORMED);
    free(p);
    free(b);
}
END_TEST

START_TEST(test_duplicate_keys_are_malformed_at_any_level)
{
    raw_t r;
    raw_init(&r);
    msgpack_pack_map(&r.pk, 3);
    raw_kv_str(&r, "proto", WIRE_PROTO);
    raw_kv_str(&r, "type", "GEN");
    raw_kv_str(&r, "type", "STATUS");
    assert_header_rejected(r.sb.data, r.sb.size, WIRE_E_MALFORMED);
    msgpack_sbuffer_destroy(&r.sb);
    raw_init(&r);
    msgpack_pack_map(&r.pk, 3);
    raw_kv_str(&r, "proto", WIRE_PROTO);
    raw_kv_str(&r, "type", "GEN");
    raw_str(&r, "stats");
    msgpack_pack_map(&r.pk, 3);
    raw_kv_str(&r, "a", "1");
    raw_kv_str(&r, "b", "2");
    raw_kv_str(&r, "a", "3");
    assert_header_rejected(r.sb.data, r.sb.size, WIRE_E_MALFORMED);
    msgpack_sbuffer_destroy(&r.sb);
}
END_TEST

/* {"proto", "type", then n-2 keys k0..} with the key of entry `dup` (when
 * >= 2) equal to the key of entry `of`. */
static void raw_wide_map(raw_t *r, int n, int dup, int of) {
    raw_init(r);
    msgpack_pack_map(&r->pk, (size_t)n);
    raw_kv_str(r, "proto", WIRE_PROTO);
    raw_kv_str(r, "type", "GEN");
    for (int i = 2; i < n; i++) {
        char k[16];
        if (i == dup && of < 2) snprintf(k, sizeof k, "%s", of == 0 ? "proto" : "type");
        else snprintf(k, sizeof k, "k%d", i == dup ? of : i);
        raw_str(r, k);
        msgpack_pack_uint64(&r->pk, (uint64_t)i);
    }
}

/* The check runs pairwise in small maps, sorted on the stack up to 64
 * keys and sorted in a heap buffer past that: each size finds a duplicate
 * wherever it sits, and passes a map without one. */
START_TEST(test_duplicate_keys_are_found_in_maps_of_every_size) {
    static const int sizes[] = { 2, 3, 16, 17, 40, 64, 65, 300, 4096 };
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int n = sizes[s];
        raw_t r;
        raw_wide_map(&r, n, -1, -1);
        wire_err_t err = {{0}, {0}};
        wire_val_t *v = wire_decode_header(r.sb.data, r.sb.size, &err);
        ck_assert_msg(v != NULL, "%d distinct keys refused: %s", n, err.message);
        ck_assert_uint_eq(wv_len(v), (size_t)n);
        wv_free(&v);
        msgpack_sbuffer_destroy(&r.sb);
        if (n < 3) continue;
        const int dups[][2] = { { 2, 0 }, { n - 1, 1 }, { n - 1, 2 }, { n / 2 + 1, n / 2 } };
        for (int d = 0; d < 4; d++) {
            if (dups[d][0] <= dups[d][1] && dups[d][1] >= 2) continue;
            raw_wide_map(&r, n, dups[d][0], dups[d][1]);
            wire_err_t e2 = {{0}, {0}};
            v = wire_decode_header(r.sb.data, r.sb.size, &e2);
            ck_assert_msg(v == NULL, "%d keys, entry %d repeating entry %d: accepted", n, dups[d][0], dups[d][1]);
            ck_assert_str_eq(e2.code, WIRE_E_MALFORMED);
            msgpack_sbuffer_destroy(&r.sb);
        }
    }
}
END_TEST

START_TEST(test_non_string_or_nul_bearing_map_keys_are_malformed)
{
    raw_t r;
    raw_init(&r);
    msgpack_pack_map(&r.pk, 3);
    raw_kv_str(&r, "proto", WIRE_PROTO);
    raw_kv_str(&r, "type", "GEN");
    msgpack_pack_uint64(&r.pk, 1);
    msgpack_pack_nil(&r.pk);
    assert_header_rejected(r.sb.data, r.sb.size, WIRE_E_MALFORMED);
    msgpack_sbuffer_destroy(&r.sb);
    raw_init(&r);
    msgpack_pack_map(&r.pk, 3);
    raw_kv_str(&r, "proto", WIRE_PROTO);
    raw_kv_str(&r, "type", "GEN");
    msgpack_pack_str(&r.pk, 3);
    msgpack_pack_str_body(&r.pk, "a\0b", 3);
    msgpack_pack_nil(&r.pk);
    assert_header_rejected(r.sb.data, r.sb.size, WIRE_E_MALFORMED);
    msgpack_sbuffer_destroy(&r.sb);
    /* an array as a key */
    const unsigned char arrkey[] = {0x81, 0x91, 0xa1, 'a', 0xc0};
    assert_header_rejected(arrkey, sizeof arrkey, WIRE_E_MALFORMED);
}
END_TEST

START_TEST(test_ext_bin_and_reserved_types_are_malformed)
{
    for (int c = 0; c < 4; c++) {
        raw_t r;
        raw_init(&r);
        msgpack_pack_map(&r.pk, 3);
        raw_kv_str(&r, "proto", WIRE_PROTO);
        raw_kv_str(&r, "type", "GEN");
        raw_str(&r, "x");
        if (c == 0) {
            msgpack_pack_ext(&r.pk, 1, 7); /* fixext1 */
            msgpack_pack_ext_body(&r.pk, "a", 1);
        } else if (c == 1) {
            msgpack_pack_ext(&r.pk, 3, -1); /* ext8 (timestamp type) */
            msgpack_pack_ext_body(&r.pk, "abc", 3);
        } else if (c == 2) {
            msgpack_pack_bin(&r.pk, 4);
            msgpack_pack_bin_body(&r.pk, "abcd", 4);
        } else {
            const char reserved = (char)0xc1;
            msgpack_sbuffer_write(&r.sb, &reserved, 1);
        }
        assert_header_rejected(r.sb.data, r.sb.size, WIRE_E_MALFORMED);
        msgpack_sbuffer_destroy(&r.sb);
    }
}
END_TEST

/* ---- randomized ---------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* True when every string of v (keys too) is valid UTF-8. */
static bool all_utf8(const wire_val_t *v) {
    if (v->kind == WV_STR) return wire_utf8_valid(v->as.str.s, v->as.str.len);
    if (v->kind != WV_ARR && v->kind != WV_MAP) return true;
    for (size_t i = 0; i < v->as.c.n; i++) {
        if (v->kind == WV_MAP && !wire_utf8_valid(v->as.c.k[i], strlen(v->as.c.k[i]))) return false;
        if (!all_utf8(v->as.c.v[i])) return false;
    }
    return true;
}

/* Decodes buf (an exact-size copy); a success must re-encode and decode to
 * the same tree (see below for strings that are not UTF-8), a failure must
 * carry a known code. */
static int fuzz_one(const unsigned char *buf, size_t n) {
    unsigned char *p = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(p);
    if (n) memcpy(p, buf, n);
    wire_err_t err = {{0}, {0}};
    wire_val_t *v = wire_decode_header(p, n, &err);
    free(p);
    if (!v) {
        ck_assert_msg(!strcmp(err.code, WIRE_E_MALFORMED) || !strcmp(err.code, WIRE_E_TOO_LARGE),
                      "unexpected code %s", err.code);
        ck_assert(err.message[0] != '\0');
        return 0;
    }
    ck_assert_int_eq(v->kind, WV_MAP);
    /* What was read is written back the same, but for strings that are
     * not UTF-8: those come back repaired, and stay so. */
    wire_val_t *again = encode_decode(v);
    if (all_utf8(v)) ck_assert(val_equal(v, again));
    ck_assert(all_utf8(again));
    wire_val_t *twice = encode_decode(again);
    ck_assert(val_equal(again, twice));
    wv_free(&twice);
    wv_free(&again);
    wv_free(&v);
    return 1;
}

/* A random value tree whose containers nest at most `room` deep. */
static wire_val_t *random_tree(int room) {
    int kind = (int)(rng() % (room > 0 ? 8 : 6));
    char s[40];
    switch (kind) {
    case 0: return nil_val();
    case 1: return wv_bool(rng() & 1);
    case 2: return wv_i64(-(int64_t)((rng() >> 1) >> (rng() % 63)) - 1); /* < 0 */
    case 3: return wv_u64(rng() >> (rng() % 64));
    case 4: {
        double f = (double)(int64_t)rng() / (double)(rng() | 1);
        return wv_f64(f);
    }
    case 5:
        snprintf(s, sizeof s, "%llx", (unsigned long long)(rng() >> (rng() % 64)));
        return wv_str(s);
    case 6: {
        wire_val_t *a = wv_arr();
        for (int n = (int)(rng() % 5); n > 0; n--) push(a, random_tree(room - 1));
        return a;
    }
    default: {
        wire_val_t *m = wv_map();
        for (int n = (int)(rng() % 5); n > 0; n--) {
            snprintf(s, sizeof s, "k%d", (int)(rng() % 8));
            set(m, s, random_tree(room - 1)); /* a repeated key replaces */
        }
        return m;
    }
    }
}

START_TEST(test_random_bytes_and_mutated_headers_never_crash_the_decoder)
{
    unsigned char buf[1024];
    int decoded = 0;
    for (int i = 0; i < 2000; i++) {
        size_t n = rng() % 300;
        for (size_t k = 0; k < n; k++) buf[k] = (unsigned char)rng();
        if (n && i % 2) buf[0] = (unsigned char)(0x80 | (rng() & 0x0f)); /* a map, often */
        decoded += fuzz_one(buf, n);
    }
    /* random valid trees round-trip exactly */
    for (int i = 0; i < 500; i++) {
        wire_val_t *m = wv_map();
        for (int n = (int)(rng() % 6); n > 0; n--) {
            char k[8];
            snprintf(k, sizeof k, "f%d", (int)(rng() % 10));
            set(m, k, random_tree(WIRE_MAX_DEPTH - 1));
        }
        wire_val_t *d = encode_decode(m);
        ck_assert(val_equal(m, d));
        wv_free(&d);
        wv_free(&m);
    }
    size_t len;
    unsigned char *good = rich_header(&len);
    ck_assert_uint_lt(len, sizeof buf / 2);
    int mutated_decoded = 0;
    for (int i = 0; i < 2000; i++) {
        size_t n = len;
        memcpy(buf, good, len);
        int ops = 1 + (int)(rng() % 4);
        for (int o = 0; o < ops && n; o++) {
            size_t at = rng() % n;
            switch (rng() % 6) {
            case 0: buf[at] ^= (unsigned char)(1u << (rng() % 8)); break;
            case 1: buf[at] = (unsigned char)rng(); break;
            case 2: /* an interesting byte: counts, lengths, types */
                buf[at] = (unsigned char[]){0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0,
                                            0xc1, 0xc4, 0xca, 0xcb, 0xd3, 0xd9, 0xdc, 0xdd, 0xde,
                                            0xdf, 0xff}[rng() % 20];
                break;
            case 3: /* insert a byte */
                if (n + 1 < sizeof buf) {
                    memmove(buf + at + 1, buf + at, n - at);
                    buf[at] = (unsigned char)rng();
                    n++;
                }
                break;
            case 4: /* delete a byte */
                memmove(buf + at, buf + at + 1, n - at - 1);
                n--;
                break;
            default: n = at; /* truncate */
            }
        }
        mutated_decoded += fuzz_one(buf, n);

        /* and through the whole-message path, with the original frame */
        zmq_msg_t f[2];
        frame_of(&f[0], buf, n);
        frame_of(&f[1], "012345678901234567890123", 24);
        wire_msg_t m;
        wire_err_t err;
        int rc = wire_decode(&m, f, 2, &err);
        ck_assert(rc == 0 || rc == 1);
        if (rc == 0) ck_assert_ptr_nonnull(m.type);
        wire_msg_close(&m);
    }
    ck_assert_int_gt(mutated_decoded, 0); /* the mutations are not all fatal */
    (void)decoded;
    free(good);
}
END_TEST

/* ---- runner -------------------------------------------------------------- */

START_TEST(test_library_errors_become_protocol_errors_in_one_place) {
    static const struct { reel_code_t c; const char *wire; } map[] = {
        { REEL_E_INVALID, WIRE_E_BAD_REQUEST }, { REEL_E_NOT_FOUND, WIRE_E_BAD_REQUEST },
        { REEL_E_UNSUPPORTED, WIRE_E_BAD_REQUEST }, { REEL_E_LIMIT, WIRE_E_TOO_LARGE },
        { REEL_E_STATE, WIRE_E_BUSY }, { REEL_E_TIMEOUT, WIRE_E_TIMEOUT }, { REEL_E_IO, WIRE_E_INTERNAL },
        { REEL_E_DEVICE, WIRE_E_INTERNAL }, { REEL_E_NOMEM, WIRE_E_INTERNAL }, { REEL_E_INTERNAL, WIRE_E_INTERNAL },
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        ck_assert_str_eq(wire_err_code_of(map[i].c), map[i].wire);
    reel_fail_detail(REEL_E_LIMIT, "disk detail stays in the log", "v3 is larger than %d bytes", 10);
    wire_err_t e;
    wire_err_from(&e, reel_err(), "UPLOAD: ");
    ck_assert_str_eq(e.code, WIRE_E_TOO_LARGE);
    ck_assert_str_eq(e.message, "UPLOAD: v3 is larger than 10 bytes");
    /* a long message is cut to the frame's field, never overrun */
    char big[600];
    memset(big, 'm', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    reel_fail(REEL_E_INVALID, "%s", big);
    wire_err_from(&e, reel_err(), NULL);
    ck_assert_str_eq(e.code, WIRE_E_BAD_REQUEST);
    ck_assert_uint_eq(strlen(e.message), sizeof e.message - 1);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("wire");
    TCase *rt = tcase_create("round_trips");
    tcase_add_checked_fixture(rt, sockets_up, sockets_down);
    tcase_add_test(rt, test_gen_with_context_uncond_and_latent_survives_dealer_to_router);
    tcase_add_test(rt, test_request_carries_the_gen_fields_and_tensors_router_to_worker);
    tcase_add_test(rt, test_progress_survives_both_directions);
    tcase_add_test(rt, test_result_with_nested_stats_and_latent_survives);
    tcase_add_test(rt, test_busy_survives);
    tcase_add_test(rt, test_sync_by_path_survives);
    tcase_add_test(rt, test_sync_inline_with_bf16_f16_and_scalar_weights_survives);
    tcase_add_test(rt, test_sync_done_with_applied_and_failed_arrays_survives);
    tcase_add_test(rt, test_status_survives);
    tcase_add_test(rt, test_status_reply_with_nested_workers_survives);
    tcase_add_test(rt, test_ready_with_versions_map_and_models_array_survives);
    tcase_add_test(rt, test_heartbeat_disconnect_and_reconnect_survive);
    tcase_add_test(rt, test_sync_ack_ok_and_failed_survive);
    tcase_add_test(rt, test_events_with_an_array_of_event_maps_survives);
    tcase_add_test(rt, test_error_survives_and_send_error_formats_its_message);
    suite_add_tcase(s, rt);

    TCase *val = tcase_create("values");
    tcase_add_checked_fixture(val, sockets_up, sockets_down);
    tcase_add_test(val, test_every_scalar_kind_and_format_boundary_survives_encoding);
    tcase_add_test(val, test_integer_formats_decode_by_sign_and_float32_widens_exactly);
    tcase_add_test(val, test_lookups_convert_integers_as_documented_and_refuse_other_kinds);
    tcase_add_test(val, test_wv_set_replaces_an_existing_key_and_frees_v_on_failure);
    tcase_add_test(val, test_wire_send_leaves_hdr_alone_and_writes_its_own_proto_and_tensors);
    tcase_add_test(val, test_wire_forward_shares_frames_and_leaves_the_source_intact);
    tcase_add_test(val, test_encoder_and_send_refuse_values_deeper_than_max_depth);
    tcase_add_test(val, test_wire_send_refuses_what_a_receiver_would_reject);
    tcase_add_test(val, test_recv_without_a_message_and_dontwait_returns_minus_one_eagain);
    tcase_add_test(val, test_wire_decode_takes_frames_already_received);
    suite_add_tcase(s, val);

    TCase *lim = tcase_create("limits_and_malformed");
    tcase_add_checked_fixture(lim, sockets_up, sockets_down);
    tcase_set_timeout(lim, 30);
    tcase_add_test(lim, test_header_over_max_header_is_too_large_and_one_at_the_limit_decodes);
    tcase_add_test(lim, test_array_declaring_2_pow_32_minus_1_elements_in_5_bytes_is_rejected_without_allocating);
    tcase_add_test(lim, test_map_or_array_claiming_more_entries_than_bytes_left_is_malformed);
    tcase_add_test(lim, test_more_than_max_items_is_too_large_and_max_items_decodes);
    tcase_add_test(lim, test_nesting_deeper_than_max_depth_is_too_large);
    tcase_add_test(lim, test_string_longer_than_max_str_is_too_large_as_value_or_key);
    tcase_add_test(lim, test_more_than_max_tensors_is_too_large);
    tcase_add_test(lim, test_tensor_bytes_not_numel_times_dtype_size_is_malformed);
    tcase_add_test(lim, test_declared_bytes_not_the_frame_size_is_malformed);
    tcase_add_test(lim, test_frame_count_not_matching_declared_tensors_is_malformed_both_ways);
    tcase_add_test(lim, test_shape_with_more_than_max_dims_is_too_large);
    tcase_add_test(lim, test_negative_dim_is_malformed);
    tcase_add_test(lim, test_element_or_byte_count_overflow_is_malformed);
    tcase_add_test(lim, test_unknown_dtype_is_malformed);
    tcase_add_test(lim, test_bad_tensor_names_and_descriptors_are_malformed);
    tcase_add_test(lim, test_rejected_message_keeps_its_id_and_identity_so_the_error_can_answer_it);
    tcase_add_test(lim, test_missing_or_wrong_proto_is_proto_mismatch);
    tcase_add_test(lim, test_a_proto_with_a_nul_byte_is_named_for_its_nul_not_quoted_as_reel_1);
    tcase_add_test(lim, test_a_type_with_a_nul_byte_is_malformed);
    tcase_add_test(lim, test_missing_or_non_string_type_and_non_uint_id_are_malformed);
    tcase_add_test(lim, test_non_map_or_empty_header_is_malformed);
    tcase_add_test(lim, test_a_header_of_byte_0xc1_is_not_messagepack_rather_than_not_a_map);
    tcase_add_test(lim, test_every_prefix_of_a_valid_header_fails_cleanly);
    tcase_add_test(lim, test_trailing_bytes_after_the_header_are_malformed);
    tcase_add_test(lim, test_duplicate_keys_are_malformed_at_any_level);
    tcase_add_test(lim, test_duplicate_keys_are_found_in_maps_of_every_size);
    tcase_add_test(lim, test_non_string_or_nul_bearing_map_keys_are_malformed);
    tcase_add_test(lim, test_ext_bin_and_reserved_types_are_malformed);
    tcase_add_test(lim, test_library_errors_become_protocol_errors_in_one_place);
    tcase_add_test(lim, test_random_bytes_and_mutated_headers_never_crash_the_decoder);
    tcase_add_test(lim, test_socket_endpoints_by_name_bind_and_connect);
    tcase_add_test(lim, test_endpoints_are_checked_without_a_socket);
    suite_add_tcase(s, lim);
    return s;
}

int main(void) {
    return ts_run(suite());
}
