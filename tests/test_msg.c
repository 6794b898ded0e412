/* test_msg.c -- the typed messages of schema/msg.h against docs/PROTOCOL.md:
 * every message type survives encode and decode; absent fields take the
 * documented defaults; field types, unknown fields, required fields and
 * tensors are checked as the page says; the limits of a GEN (with and
 * without a model); the id a bad message is still answered under; which
 * failures are too_large and which malformed; sha256 case; strings sent
 * are valid UTF-8; the encoder writes what msgpack-c writes and reads; a
 * GEN decodes without touching the heap. */
#include <check.h>
#include <malloc.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema/msg.h"
#include "schema/wire_codec.h"
#include "tests/support.h"

/* ---- helpers ------------------------------------------------------------------ */

/* A message as received: header bytes p[0..n) and the tensors t[0..nt). */
static void receive(wire_msg_t *m, const void *p, size_t n, const wire_tensor_t *t, int nt) {
    zmq_msg_t f[1 + WIRE_MAX_TENSORS];
    zmq_msg_init_size(&f[0], n);
    memcpy(zmq_msg_data(&f[0]), p, n);
    for (int i = 0; i < nt; i++) {
        zmq_msg_init_size(&f[1 + i], t[i].bytes);
        if (t[i].bytes) memcpy(zmq_msg_data(&f[1 + i]), t[i].data, t[i].bytes);
    }
    wire_err_t err;
    ck_assert_msg(wire_decode_as(m, f, (size_t)(1 + nt), &err, false) == 0, "%s: %s", err.code, err.message);
}

/* Encodes body as type and receives it back into m. */
static void round_trip(wire_msg_t *m, msg_type_t type, uint64_t id, const void *body, const wire_tensor_t *t,
                       int nt) {
    size_t len = 0;
    unsigned char *b = msg_encode(type, id, body, &len);
    ck_assert_ptr_nonnull(b);
    receive(m, b, len, t, nt);
    free(b);
    ck_assert_str_eq(m->type, msg_type_name(type));
    ck_assert_int_eq(msg_type(m), type);
    ck_assert_uint_eq(m->id, id);
}

/* Receives the header the tree h encodes (tests write wrong headers so). */
static void receive_tree(wire_msg_t *m, wire_val_t *h, const wire_tensor_t *t, int nt) {
    wire_val_t *tensors = wv_arr();
    for (int i = 0; i < nt; i++) {
        wire_val_t *d = wv_map(), *shape = wv_arr();
        for (int k = 0; k < t[i].ndim; k++) wv_push(shape, wv_u64((uint64_t)t[i].shape[k]));
        wv_set(d, "name", wv_str(t[i].name));
        wv_set(d, "dtype", wv_str(wire_dtype_name(t[i].dtype)));
        wv_set(d, "shape", shape);
        wv_set(d, "bytes", wv_u64(t[i].bytes));
        wv_push(tensors, d);
    }
    wv_set(h, "proto", wv_str(WIRE_PROTO));
    wv_set(h, "tensors", tensors);
    size_t len;
    unsigned char *b = wire_encode_header(h, &len);
    wv_free(&h);
    ck_assert_ptr_nonnull(b);
    receive(m, b, len, t, nt);
    free(b);
}

static wire_tensor_t tensor(const char *name, kern_dtype_t dt, int ndim, const int64_t *shape, const void *data) {
    size_t n = kern_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return ts_wire_tensor(name, dt, ndim, shape, data, n);
}

static float g_ctx[5 * 32], g_unc[5 * 32], g_lat[4 * 2 * 8 * 8];
static const int64_t CTX[2] = { 5, 32 }, LAT[4] = { 4, 2, 8, 8 };

/* The GEN header fields every test starts from (a tree, to break). */
static wire_val_t *gen_tree(uint64_t id) {
    wire_val_t *h = wire_hdr("GEN", id), *ls = wv_arr();
    for (int i = 0; i < 4; i++) wv_push(ls, wv_u64((uint64_t)LAT[i]));
    wv_set(h, "model", wv_str("tiny"));
    wv_set(h, "steps", wv_u64(6));
    wv_set(h, "latent_shape", ls);
    return h;
}

/* Decodes GEN tree h (with a context) expecting a refusal whose code is
 * code and whose message holds want. */
static void expect_gen_refused(wire_val_t *h, const char *code, const char *want) {
    wire_tensor_t t = tensor("context", KERN_F32, 2, CTX, g_ctx);
    wire_msg_t m;
    receive_tree(&m, h, &t, 1);
    msg_gen_t g;
    wire_err_t err;
    int rc = msg_gen_decode(&m, &g, &err);
    if (rc == 0) rc = msg_gen_validate(&g, NULL, &err);
    ck_assert_int_eq(rc, -1);
    ck_assert_str_eq(err.code, code);
    ck_assert_msg(strstr(err.message, want), "'%s' lacks '%s'", err.message, want);
    wire_msg_close(&m);
}

static msg_model_t tiny_model(void) {
    msg_model_t t = { "tiny", 4, 32, 2, 2, 0 };
    return t;
}

/* ---- every type round-trips ------------------------------------------------------- */

START_TEST(test_every_type_has_its_name_and_a_bodyless_one_round_trips) {
    for (int t = 0; t < MSG_UNKNOWN; t++) ck_assert_str_ne(msg_type_name((msg_type_t)t), "?");
    ck_assert_str_eq(msg_type_name(MSG_UNKNOWN), "?");
    wire_msg_t m;
    const msg_type_t bare[] = { MSG_STATUS, MSG_HEARTBEAT, MSG_DISCONNECT, MSG_RECONNECT };
    for (size_t i = 0; i < sizeof bare / sizeof bare[0]; i++) {
        round_trip(&m, bare[i], 5, NULL, NULL, 0);
        wire_err_t err;
        ck_assert_int_eq(msg_decode(&m, bare[i], NULL, &err), 0);
        wire_msg_close(&m);
    }
}
END_TEST

START_TEST(test_gen_and_request_round_trip_with_every_field_and_tensor) {
    msg_gen_t g = { 0 }, back;
    snprintf(g.model, sizeof g.model, "tiny");
    g.version = 3;
    g.steps = 7;
    g.shift = 3.5;
    g.cfg = 4.25;
    g.sde = true;
    g.eta = 0.5;
    g.seed = UINT64_MAX;
    g.progress = true;
    g.deadline_ms = 1234;
    memcpy(g.latent_shape, LAT, sizeof LAT);
    wire_tensor_t t[3] = { tensor("context", KERN_F32, 2, CTX, g_ctx), tensor("uncond", KERN_F32, 2, CTX, g_unc),
                           tensor("latent", KERN_F32, 4, LAT, g_lat) };
    g.context = &t[0];
    g.uncond = &t[1];
    g.latent = &t[2];
    for (int type = MSG_GEN; type <= MSG_REQUEST; type++) {
        wire_msg_t m;
        wire_err_t err;
        round_trip(&m, (msg_type_t)type, 42, &g, t, 3);
        ck_assert_int_eq(msg_decode(&m, (msg_type_t)type, &back, &err), 0);
        ck_assert_str_eq(back.model, "tiny");
        ck_assert_uint_eq(back.version, 3);
        ck_assert_uint_eq(back.steps, 7);
        ck_assert(back.shift == 3.5 && back.cfg == 4.25 && back.eta == 0.5);
        ck_assert(back.sde && back.progress);
        ck_assert_uint_eq(back.seed, UINT64_MAX);
        ck_assert_uint_eq(back.deadline_ms, 1234);
        ck_assert_mem_eq(back.latent_shape, LAT, sizeof LAT);
        ck_assert_str_eq(back.context->name, "context");
        ck_assert_str_eq(back.uncond->name, "uncond");
        ck_assert_mem_eq(back.latent->data, g_lat, sizeof g_lat);
        ck_assert_int_eq(msg_gen_validate(&back, NULL, &err), 0);
        msg_model_t tiny = tiny_model();
        ck_assert_int_eq(msg_gen_validate(&back, &tiny, &err), 0);
        wire_msg_close(&m);
    }
}
END_TEST

START_TEST(test_result_progress_error_and_busy_round_trip) {
    msg_result_t r = { 0 }, rb;
    snprintf(r.worker, sizeof r.worker, "w1");
    r.version = 5;
    r.first_version = 4;
    r.stats.captured = 1;
    r.stats.replayed = 5;
    r.stats.eager = 2;
    r.stats.seconds = 0.125;
    r.stats.declines.n = 2;
    snprintf(r.stats.declines.e[0].name, MSG_NAME_MAX, "warming_up");
    r.stats.declines.e[0].n = 2;
    snprintf(r.stats.declines.e[1].name, MSG_NAME_MAX, "a_reason_from_the_future");
    r.stats.declines.e[1].n = 1;
    r.key_hash = 0xb6d4e43bdf155e32ull;
    wire_tensor_t t = tensor("latent", KERN_F32, 4, LAT, g_lat);
    r.latent = &t;
    wire_msg_t m;
    wire_err_t err;
    round_trip(&m, MSG_RESULT, 9, &r, &t, 1);
    ck_assert_int_eq(msg_result_decode(&m, &rb, &err), 0);
    ck_assert_str_eq(rb.worker, "w1");
    ck_assert_uint_eq(rb.version, 5);
    ck_assert_uint_eq(rb.first_version, 4);
    ck_assert_uint_eq(rb.stats.replayed, 5);
    ck_assert(rb.stats.seconds == 0.125);
    ck_assert_int_eq(rb.stats.declines.n, 2);
    ck_assert_str_eq(rb.stats.declines.e[1].name, "a_reason_from_the_future"); /* unknown names kept */
    ck_assert_uint_eq(rb.key_hash, 0xb6d4e43bdf155e32ull);
    ck_assert_ptr_nonnull(rb.latent);
    ck_assert(wire_tok_is(&m.tok, wire_msg_head(&m), wire_tok_find(&m.tok, wire_msg_head(&m), 0, "key_hash"),
                          "b6d4e43bdf155e32")); /* 16 lowercase hex digits on the wire */
    wire_msg_close(&m);

    msg_progress_t p = { 3, 10, 0, 0 }, pb;
    round_trip(&m, MSG_PROGRESS, 9, &p, NULL, 0);
    ck_assert_int_eq(msg_progress_decode(&m, &pb, &err), 0);
    ck_assert_uint_eq(pb.step, 3);
    ck_assert_uint_eq(pb.steps, 10);
    ck_assert_uint_eq(pb.decode_frames, 0);
    ck_assert_uint_eq(wire_tok_find(&m.tok, wire_msg_head(&m), 0, "decoded"), 0); /* absent when 0 */
    wire_msg_close(&m);
    /* a decode's progress: every step done, frames decoded of all */
    msg_progress_t d = { 10, 10, 2, 3 };
    round_trip(&m, MSG_PROGRESS, 9, &d, NULL, 0);
    ck_assert_int_eq(msg_progress_decode(&m, &pb, &err), 0);
    ck_assert_uint_eq(pb.decoded, 2);
    ck_assert_uint_eq(pb.decode_frames, 3);
    wire_msg_close(&m);

    msg_error_t e = { "no_worker", "nobody serves tiny" }, eb;
    round_trip(&m, MSG_ERROR, 9, &e, NULL, 0);
    ck_assert_int_eq(msg_error_decode(&m, &eb, &err), 0);
    ck_assert_str_eq(eb.code, "no_worker");
    ck_assert_str_eq(eb.message, "nobody serves tiny");
    wire_msg_close(&m);

    msg_busy_t busy = { "queue full" }, bb;
    round_trip(&m, MSG_BUSY, 9, &busy, NULL, 0);
    ck_assert_int_eq(msg_busy_decode(&m, &bb, &err), 0);
    ck_assert_str_eq(bb.message, "queue full");
    wire_msg_close(&m);
}
END_TEST

/* CANCEL: the GEN's id, and its client token when there is one (absent
 * when 0); a client that is not a hash, or a tensor, is refused. */
START_TEST(test_cancel_round_trips_and_refuses_what_it_cannot_carry) {
    wire_msg_t m;
    wire_err_t err;
    msg_cancel_t c = { .client = 0xa1b2c3d4e5f60718ull }, cb;
    round_trip(&m, MSG_CANCEL, 77, &c, NULL, 0);
    ck_assert_str_eq(msg_type_name(MSG_CANCEL), "CANCEL");
    ck_assert_int_eq(msg_cancel_decode(&m, &cb, &err), 0);
    ck_assert_uint_eq(cb.client, 0xa1b2c3d4e5f60718ull);
    wire_msg_close(&m);
    msg_cancel_t none = { 0 };
    size_t len = 0;
    unsigned char *b = msg_encode(MSG_CANCEL, 5, &none, &len);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_null(memmem(b, len, "client", 6)); /* a token of 0 is left out */
    receive(&m, b, len, NULL, 0);
    free(b);
    cb.client = 99;
    ck_assert_int_eq(msg_cancel_decode(&m, &cb, &err), 0);
    ck_assert_uint_eq(cb.client, 0);
    ck_assert_uint_eq(m.id, 5);
    wire_msg_close(&m);

    wire_val_t *h = wv_map();
    wv_set(h, "type", wv_str("CANCEL"));
    wv_set(h, "id", wv_u64(7));
    wv_set(h, "client", wv_u64(12)); /* a number, not the hash's 16 hex digits */
    receive_tree(&m, h, NULL, 0);
    ck_assert_int_eq(msg_cancel_decode(&m, &cb, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.message, "client"));
    wire_msg_close(&m);

    h = wv_map();
    wv_set(h, "type", wv_str("CANCEL"));
    wv_set(h, "id", wv_u64(8));
    wire_tensor_t x = { .name = "x", .dtype = KERN_F32, .ndim = 1, .shape = { 1 }, .bytes = 4, .data = "\0\0\0" };
    receive_tree(&m, h, &x, 1);
    ck_assert_int_eq(msg_cancel_decode(&m, &cb, &err), -1);
    ck_assert_str_eq(err.code, WIRE_E_BAD_REQUEST);
    wire_msg_close(&m);
}
END_TEST

START_TEST(test_sync_messages_round_trip) {
    msg_sync_t s = { 0 }, sb;
    snprintf(s.component, sizeof s.component, "transformer");
    s.version = 2;
    memset(s.sha256, 'a', 64);
    snprintf(s.path, sizeof s.path, "/w/v2.safetensors");
    s.deadline_ms = 500;
    wire_msg_t m;
    wire_err_t err;
    round_trip(&m, MSG_SYNC, 4, &s, NULL, 0);
    ck_assert_int_eq(msg_sync_decode(&m, &sb, &err), 0);
    ck_assert_str_eq(sb.path, "/w/v2.safetensors");
    ck_assert_str_eq(sb.sha256, s.sha256);
    ck_assert_uint_eq(sb.deadline_ms, 500);
    ck_assert_int_eq(sb.n_tensors, 0);
    ck_assert_int_eq(msg_sync_validate(&sb, false, &err), 0);
    wire_msg_close(&m);

    char applied[2][MSG_NAME_MAX] = { "w0", "w2" };
    msg_failure_t failed[1] = { { "w1", "sha256 mismatch" } };
    msg_sync_done_t d = { "transformer", 2, applied, 2, failed, 1, false, 2 }, db;
    round_trip(&m, MSG_SYNC_DONE, 4, &d, NULL, 0);
    ck_assert_int_eq(msg_sync_done_decode(&m, &db, &err), 0);
    ck_assert_uint_eq(db.n_applied, 2);
    ck_assert_str_eq(db.applied[1], "w2");
    ck_assert_uint_eq(db.n_failed, 1);
    ck_assert_str_eq(db.failed[0].reason, "sha256 mismatch");
    ck_assert(!db.complete);
    ck_assert_uint_eq(db.current, 2);
    wire_msg_close(&m);

    msg_sync_ack_t a = { .component = "transformer", .version = 2, .ok = false, .error = "stale" }, ab;
    round_trip(&m, MSG_SYNC_ACK, 4, &a, NULL, 0);
    ck_assert_int_eq(msg_sync_ack_decode(&m, &ab, &err), 0);
    ck_assert(!ab.ok);
    ck_assert_str_eq(ab.error, "stale");
    ck_assert_str_eq(ab.adapter, "");
    wire_msg_close(&m);
    msg_sync_ack_t la = { .component = "transformer", .version = 3, .ok = true, .adapter = "{\"rank\":4}" };
    round_trip(&m, MSG_SYNC_ACK, 5, &la, NULL, 0);
    ck_assert_int_eq(msg_sync_ack_decode(&m, &ab, &err), 0);
    ck_assert(ab.ok);
    ck_assert_str_eq(ab.adapter, "{\"rank\":4}");
    wire_msg_close(&m);
}
END_TEST

START_TEST(test_worker_messages_round_trip) {
    char models[1][MSG_NAME_MAX] = { "tiny" };
    msg_model_t cfg = tiny_model();
    msg_ready_t r = { 0 }, rb;
    snprintf(r.name, sizeof r.name, "w0");
    snprintf(r.device, sizeof r.device, "cpu");
    snprintf(r.arch, sizeof r.arch, "cpu-avx2");
    r.streams = 2;
    r.budget = 1 << 30;
    r.max_inflight = 8;
    r.models = models;
    r.n_models = 1;
    r.versions.n = 1;
    snprintf(r.versions.e[0].name, MSG_NAME_MAX, "transformer");
    r.versions.e[0].n = 3;
    r.configs = &cfg;
    r.n_configs = 1;
    wire_msg_t m;
    wire_err_t err;
    round_trip(&m, MSG_READY, 0, &r, NULL, 0);
    ck_assert_int_eq(msg_ready_decode(&m, &rb, &err), 0);
    ck_assert_int_eq(msg_ready_validate(&rb, &err), 0);
    ck_assert_str_eq(rb.arch, "cpu-avx2");
    ck_assert_uint_eq(rb.max_inflight, 8);
    ck_assert_str_eq(rb.models[0], "tiny");
    ck_assert_uint_eq(rb.versions.e[0].n, 3);
    ck_assert_uint_eq(rb.n_configs, 1);
    ck_assert_uint_eq(rb.configs[0].text_dim, 32);
    wire_msg_close(&m);

    msg_event_t ev[2];
    memset(ev, 0, sizeof ev);
    snprintf(ev[0].kind, sizeof ev[0].kind, "capture");
    ev[0].key = "reel-key/1 model=tinydit:tiny";
    ev[0].key_hash = 0xa;
    ev[0].stream = 1;
    ev[0].bytes = 4096;
    ev[0].count = 1;
    snprintf(ev[1].kind, sizeof ev[1].kind, "evict");
    snprintf(ev[1].reason, sizeof ev[1].reason, "weight_sync");
    snprintf(ev[1].component, sizeof ev[1].component, "transformer");
    ev[1].key = "";
    ev[1].key_hash = 0xb;
    ev[1].stream = -1;
    ev[1].from = 1;
    ev[1].to = 2;
    ev[1].count = 1;
    msg_events_t e = { ev, 2, 7 }, eb;
    round_trip(&m, MSG_EVENTS, 0, &e, NULL, 0);
    ck_assert_int_eq(msg_events_decode(&m, &eb, &err), 0);
    ck_assert_uint_eq(eb.n_events, 2);
    ck_assert_uint_eq(eb.dropped, 7);
    ck_assert_str_eq(eb.events[0].key, "reel-key/1 model=tinydit:tiny");
    ck_assert_uint_eq(eb.events[0].bytes, 4096);
    ck_assert_int_eq(eb.events[1].stream, -1);
    ck_assert_str_eq(eb.events[1].component, "transformer");
    ck_assert_uint_eq(eb.events[1].to, 2);
    ck_assert_str_eq(eb.events[1].key, "");
    wire_msg_close(&m);
}
END_TEST

START_TEST(test_status_reply_round_trips_with_workers_lagging_keys_and_models) {
    msg_worker_status_t w[1];
    memset(w, 0, sizeof w);
    snprintf(w[0].name, MSG_NAME_MAX, "w0");
    snprintf(w[0].device, sizeof w[0].device, "cpu");
    snprintf(w[0].arch, sizeof w[0].arch, "x");
    w[0].streams = 2;
    w[0].max_inflight = 8;
    w[0].routable = false;
    w[0].lagging.n = 1;
    snprintf(w[0].lagging.e[0].name, MSG_NAME_MAX, "transformer");
    snprintf(w[0].lagging.e[0].text, sizeof w[0].lagging.e[0].text, "v4: sha256 mismatch");
    w[0].n_keys = 2;
    w[0].keys[0] = 1;
    w[0].keys[1] = UINT64_MAX;
    w[0].alive_ms = 99;
    msg_model_t cfg = tiny_model();
    msg_status_reply_t s = { 0 }, sb;
    s.workers = w;
    s.n_workers = 1;
    s.queue = 1;
    s.queue_max = 64;
    s.versions.n = 1;
    snprintf(s.versions.e[0].name, MSG_NAME_MAX, "transformer");
    s.versions.e[0].n = 4;
    s.malformed = 3;
    s.models = &cfg;
    s.n_models = 1;
    msg_refused_peer_t refused = { "client", "rTZ6iQ{wu%}D{M2Hk0Y3jY5owHIM^hnF<a)^$}4e", "", "localhost:0:0:22825",
                                   "key rTZ6iQ{wu%}D... is not in the allowlist", 7, 1045 };
    s.auth_refused = 9;
    s.auth_refused_peers = 2;
    s.auth_refused_recent = &refused;
    s.n_auth_refused_recent = 1;
    wire_msg_t m;
    wire_err_t err;
    round_trip(&m, MSG_STATUS_REPLY, 77, &s, NULL, 0);
    ck_assert_int_eq(msg_status_reply_decode(&m, &sb, &err), 0);
    ck_assert_uint_eq(sb.n_workers, 1);
    ck_assert(!sb.workers[0].routable);
    ck_assert_str_eq(sb.workers[0].lagging.e[0].text, "v4: sha256 mismatch");
    ck_assert_int_eq(sb.workers[0].n_keys, 2);
    ck_assert_uint_eq(sb.workers[0].keys[1], UINT64_MAX);
    ck_assert_int_eq(sb.pending.n, 0);
    ck_assert_uint_eq(sb.malformed, 3);
    ck_assert_uint_eq(sb.auth_refused, 9);
    ck_assert_uint_eq(sb.auth_refused_peers, 2);
    ck_assert_uint_eq(sb.n_auth_refused_recent, 1);
    ck_assert_str_eq(sb.auth_refused_recent[0].key, refused.key);
    ck_assert_str_eq(sb.auth_refused_recent[0].name, "");
    ck_assert_str_eq(sb.auth_refused_recent[0].address, "localhost:0:0:22825");
    ck_assert_str_eq(sb.auth_refused_recent[0].why, refused.why);
    ck_assert_uint_eq(sb.auth_refused_recent[0].count, 7);
    ck_assert_uint_eq(sb.auth_refused_recent[0].ago_ms, 1045);
    ck_assert_uint_eq(sb.models[0].in_channels, 4);
    ck_assert_uint_eq(sb.models[0].patch, 2);
    wire_msg_close(&m);
}
END_TEST

/* Encodes body as type (with the tensors t) and receives it back into m
 * with its header as a value tree: what was written, field by field. */
static void round_trip_tree(wire_msg_t *m, msg_type_t type, uint64_t id, const void *body, const wire_tensor_t *t,
                            int nt) {
    size_t len = 0;
    unsigned char *b = msg_encode(type, id, body, &len);
    ck_assert_ptr_nonnull(b);
    zmq_msg_t f[1 + WIRE_MAX_TENSORS];
    zmq_msg_init_size(&f[0], len);
    memcpy(zmq_msg_data(&f[0]), b, len);
    free(b);
    for (int i = 0; i < nt; i++) {
        zmq_msg_init_size(&f[1 + i], t[i].bytes);
        if (t[i].bytes) memcpy(zmq_msg_data(&f[1 + i]), t[i].data, t[i].bytes);
    }
    wire_err_t err;
    ck_assert_msg(wire_decode_as(m, f, (size_t)(1 + nt), &err, true) == 0, "%s: %s", err.code, err.message);
    ck_assert_ptr_nonnull(m->hdr);
}

/* Delivery (docs/PROTOCOL.md): a GEN's `client` token and a STATUS_REPLY's
 * `boot` are hashes (16 hex digits on the wire), both optional: 0 is
 * "none", never written, and what an older peer's message decodes as. */
START_TEST(test_a_gen_client_token_and_a_status_reply_boot_round_trip_and_are_absent_as_0) {
    wire_tensor_t t = tensor("context", KERN_F32, 2, CTX, g_ctx);
    msg_gen_t g = { 0 }, back;
    snprintf(g.model, sizeof g.model, "tiny");
    g.steps = 2;
    g.shift = g.cfg = 1.0;
    g.eta = 0.7;
    memcpy(g.latent_shape, LAT, sizeof LAT);
    g.context = &t;
    const uint64_t tokens[] = { 0xfedcba9876543210ull, 1, UINT64_MAX, 0 };
    for (size_t k = 0; k < sizeof tokens / sizeof tokens[0]; k++) {
        g.client = tokens[k];
        for (int type = MSG_GEN; type <= MSG_REQUEST; type++) { /* a REQUEST carries it on as well */
            wire_msg_t m;
            wire_err_t err;
            round_trip_tree(&m, (msg_type_t)type, 5, &g, &t, 1);
            const char *hex = wv_get_str(m.hdr, "client");
            if (tokens[k]) {
                char want[17];
                ck_assert_ptr_nonnull(hex);
                ck_assert_str_eq(hex, msg_hex64(tokens[k], want));
            } else {
                ck_assert_msg(wv_get(m.hdr, "client") == NULL, "a GEN without a token wrote 'client'");
            }
            memset(&back, 0xa5, sizeof back);
            ck_assert_int_eq(msg_decode(&m, (msg_type_t)type, &back, &err), 0);
            ck_assert_uint_eq(back.client, tokens[k]);
            ck_assert_int_eq(msg_gen_validate(&back, NULL, &err), 0);
            wire_msg_close(&m);
        }
    }
    /* written by hand: fewer digits and capitals read as the number; an
     * older client's GEN (no 'client') is token 0 */
    wire_val_t *h = gen_tree(6);
    wv_set(h, "client", wv_str("ABC"));
    wire_msg_t m;
    wire_err_t err;
    receive_tree(&m, h, &t, 1);
    ck_assert_int_eq(msg_gen_decode(&m, &back, &err), 0);
    ck_assert_uint_eq(back.client, 0xabc);
    wire_msg_close(&m);
    receive_tree(&m, gen_tree(7), &t, 1);
    memset(&back, 0xa5, sizeof back);
    ck_assert_int_eq(msg_gen_decode(&m, &back, &err), 0);
    ck_assert_uint_eq(back.client, 0);
    wire_msg_close(&m);
    /* anything but 1..16 hex digits is refused */
    wire_val_t *bad[] = { wv_str("xyz"), wv_str("12g4"), wv_str(""), wv_str("0123456789abcdef0"), wv_u64(5),
                          wv_str("-1") };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        h = gen_tree(8);
        wv_set(h, "client", bad[k]);
        expect_gen_refused(h, "bad_request", "'client' must be 1..16 hex digits");
    }

    msg_status_reply_t s = { 0 }, sb;
    const uint64_t boots[] = { 0x0123456789abcdefull, UINT64_MAX, 0 };
    for (size_t k = 0; k < sizeof boots / sizeof boots[0]; k++) {
        s.boot = boots[k];
        round_trip_tree(&m, MSG_STATUS_REPLY, 9, &s, NULL, 0);
        if (boots[k]) {
            char want[17];
            ck_assert_str_eq(wv_get_str(m.hdr, "boot"), msg_hex64(boots[k], want));
        } else {
            ck_assert_msg(wv_get(m.hdr, "boot") == NULL, "a STATUS_REPLY without a boot wrote 'boot'");
        }
        memset(&sb, 0xa5, sizeof sb);
        ck_assert_int_eq(msg_status_reply_decode(&m, &sb, &err), 0);
        ck_assert_uint_eq(sb.boot, boots[k]); /* an older broker's (no 'boot'): 0 */
        wire_msg_close(&m);
    }
}
END_TEST

/* ---- defaults, types, unknown and required fields ----------------------------------- */

START_TEST(test_absent_optional_fields_take_the_documented_defaults) {
    wire_tensor_t t = tensor("context", KERN_F32, 2, CTX, g_ctx);
    wire_msg_t m;
    wire_err_t err;
    receive_tree(&m, gen_tree(1), &t, 1);
    msg_gen_t g;
    ck_assert_int_eq(msg_gen_decode(&m, &g, &err), 0);
    ck_assert_uint_eq(g.version, 0);
    ck_assert(g.shift == 1.0 && g.cfg == 1.0 && g.eta == 0.7);
    ck_assert(!g.sde && !g.progress);
    ck_assert_uint_eq(g.seed, 0);
    ck_assert_uint_eq(g.deadline_ms, 0);
    ck_assert_ptr_null(g.uncond);
    ck_assert_ptr_null(g.latent);
    wire_msg_close(&m);

    wire_val_t *h = wire_hdr("RESULT", 2);
    wv_set(h, "version", wv_u64(6));
    wv_set(h, "stats", wv_map());
    receive_tree(&m, h, NULL, 0);
    msg_result_t r;
    ck_assert_int_eq(msg_result_decode(&m, &r, &err), 0);
    ck_assert_uint_eq(r.first_version, 6); /* defaults to version */
    wire_msg_close(&m);
    /* a RESULT says which weights it ran on and how: version and stats are required */
    for (int k = 0; k < 2; k++) {
        h = wire_hdr("RESULT", 3);
        if (k) wv_set(h, "version", wv_u64(6));
        else wv_set(h, "stats", wv_map());
        receive_tree(&m, h, NULL, 0);
        ck_assert_int_eq(msg_result_decode(&m, &r, &err), -1);
        ck_assert_ptr_nonnull(strstr(err.message, k ? "missing 'stats'" : "missing 'version'"));
        wire_msg_close(&m);
    }

    h = wire_hdr("READY", 0);
    wire_val_t *models = wv_arr();
    wv_push(models, wv_str("tiny"));
    wv_set(h, "name", wv_str("w0"));
    wv_set(h, "models", models);
    receive_tree(&m, h, NULL, 0);
    msg_ready_t rd;
    ck_assert_int_eq(msg_ready_decode(&m, &rd, &err), 0);
    ck_assert_uint_eq(rd.streams, 1);
    ck_assert_uint_eq(rd.max_inflight, 0);
    ck_assert_str_eq(rd.device, "?");
    ck_assert_str_eq(rd.arch, "?");
    wire_msg_close(&m);

    h = wire_hdr("EVENTS", 0);
    wire_val_t *evs = wv_arr(), *ev = wv_map();
    wv_set(ev, "kind", wv_str("decline"));
    wv_set(ev, "key_hash", wv_str("a"));
    wv_push(evs, ev);
    wv_set(h, "events", evs);
    receive_tree(&m, h, NULL, 0);
    msg_events_t e;
    ck_assert_int_eq(msg_events_decode(&m, &e, &err), 0);
    ck_assert_uint_eq(e.events[0].count, 1);
    ck_assert_uint_eq(e.events[0].key_hash, 0xa);
    ck_assert_str_eq(e.events[0].key, "");
    wire_msg_close(&m);
}
END_TEST

START_TEST(test_field_types_are_checked_as_documented) {
    /* integers: any msgpack integer format; never a float, a string or nil */
    wire_val_t *h = gen_tree(1);
    wv_set(h, "steps", wv_f64(6.0));
    expect_gen_refused(h, "bad_request", "'steps' must be a non-negative integer");
    h = gen_tree(1);
    wv_set(h, "steps", wv_i64(-3));
    expect_gen_refused(h, "bad_request", "'steps' must be a non-negative integer");
    h = gen_tree(1);
    wv_set(h, "seed", wv_nil());
    expect_gen_refused(h, "bad_request", "'seed' must be a non-negative integer");
    h = gen_tree(1);
    wv_set(h, "steps", wv_u64(10001));
    expect_gen_refused(h, "bad_request", "'steps' must be in 1..10000 (got 10001)");
    /* booleans: true or false only */
    h = gen_tree(1);
    wv_set(h, "sde", wv_u64(1));
    expect_gen_refused(h, "bad_request", "'sde' must be a boolean");
    /* numbers: a float or an integer, finite */
    h = gen_tree(1);
    wv_set(h, "cfg", wv_str("high"));
    expect_gen_refused(h, "bad_request", "'cfg' must be a finite number");
    h = gen_tree(1);
    wv_set(h, "shift", wv_f64(1.0 / 0.0));
    expect_gen_refused(h, "bad_request", "'shift' must be a finite number");
    /* names: the alphabet, at most 55 characters for a model */
    h = gen_tree(1);
    wv_set(h, "model", wv_str("tiny model=x"));
    expect_gen_refused(h, "bad_request", "'model' must be 1..55 characters of [A-Za-z0-9_.:+-]");
    /* a NUL inside or at the end of a name is refused, not cut there */
    h = gen_tree(1);
    wv_set(h, "model", wv_strn("ti\0ny", 5));
    expect_gen_refused(h, "bad_request", "'model' must be 1..55 characters of [A-Za-z0-9_.:+-]");
    h = gen_tree(1);
    wv_set(h, "model", wv_strn("tiny\0", 5));
    expect_gen_refused(h, "bad_request", "'model' must be 1..55 characters of [A-Za-z0-9_.:+-]");
    /* latent_shape: exactly 4 non-negative integers */
    h = gen_tree(1);
    wv_set(h, "latent_shape", wv_u64(4));
    expect_gen_refused(h, "bad_request", "'latent_shape' must be an array [C,F,H,W]");

    /* an integer is a number, and any integer format is an integer */
    wire_tensor_t t = tensor("context", KERN_F32, 2, CTX, g_ctx);
    h = gen_tree(1);
    wv_set(h, "shift", wv_u64(3));
    wv_set(h, "seed", wv_i64(5)); /* written as a positive int64: read as unsigned */
    wire_msg_t m;
    wire_err_t err;
    receive_tree(&m, h, &t, 1);
    msg_gen_t g;
    ck_assert_int_eq(msg_gen_decode(&m, &g, &err), 0);
    ck_assert(g.shift == 3.0);
    ck_assert_uint_eq(g.seed, 5);
    wire_msg_close(&m);
}
END_TEST

START_TEST(test_unknown_fields_are_ignored_at_every_level) {
    wire_val_t *h = wire_hdr("RESULT", 3), *stats = wv_map(), *extra = wv_map();
    wv_set(stats, "replayed", wv_u64(4));
    wv_set(stats, "gpu_joules", wv_f64(1.5));
    wv_set(extra, "nested", wv_arr());
    wv_set(h, "stats", stats);
    wv_set(h, "a_future_field", extra);
    wv_set(h, "version", wv_u64(1));
    wire_tensor_t t = tensor("latent", KERN_F32, 4, LAT, g_lat);
    wire_msg_t m;
    wire_err_t err;
    receive_tree(&m, h, &t, 1);
    msg_result_t r;
    ck_assert_int_eq(msg_result_decode(&m, &r, &err), 0);
    ck_assert_uint_eq(r.stats.replayed, 4);
    wire_msg_close(&m);
}
END_TEST

/* The decoder looks for each key where the previous one was found, so a
 * sender writing fields in the table's order finds each at once; any other
 * order, with unknown fields between, must decode and forward the same. */
START_TEST(test_fields_in_any_order_decode_and_forward_the_same) {
    static const char *const keys[] = { "model", "version", "steps", "shift", "cfg", "sde", "eta", "seed",
                                        "progress", "deadline_ms", "latent_shape" };
    enum { NK = sizeof keys / sizeof keys[0] };
    void *ctx = zmq_ctx_new(), *a = zmq_socket(ctx, ZMQ_PAIR), *b = zmq_socket(ctx, ZMQ_PAIR);
    ck_assert_int_eq(zmq_bind(a, "inproc://order"), 0);
    ck_assert_int_eq(zmq_connect(b, "inproc://order"), 0);
    msg_gen_t first;
    for (int order = 0; order < 3; order++) {
        wire_val_t *h = wire_hdr("GEN", 9);
        for (int j = 0; j < NK; j++) {
            /* 0: table order; 1: reversed; 2: odd ones first, unknowns between */
            int i = order == 0 ? j : order == 1 ? NK - 1 - j : (2 * j + 1 < NK ? 2 * j + 1 : 2 * (j - NK / 2));
            const char *k = keys[i];
            if (order == 2) {
                char unk[32];
                snprintf(unk, sizeof unk, "x_%s", k);
                wv_set(h, unk, wv_u64((uint64_t)j));
            }
            if (!strcmp(k, "model")) wv_set(h, k, wv_str("tiny"));
            else if (!strcmp(k, "latent_shape")) {
                wire_val_t *ls = wv_arr();
                for (int d = 0; d < 4; d++) wv_push(ls, wv_u64((uint64_t)LAT[d]));
                wv_set(h, k, ls);
            } else if (!strcmp(k, "sde") || !strcmp(k, "progress")) wv_set(h, k, wv_bool(true));
            else if (!strcmp(k, "shift") || !strcmp(k, "cfg") || !strcmp(k, "eta")) wv_set(h, k, wv_f64(0.5));
            else wv_set(h, k, wv_u64(3));
        }
        wire_tensor_t t = tensor("context", KERN_F32, 2, CTX, g_ctx);
        wire_msg_t m, req;
        receive_tree(&m, h, &t, 1);
        msg_gen_t g, r;
        wire_err_t err;
        ck_assert_msg(msg_gen_decode(&m, &g, &err) == 0, "order %d: %s", order, err.message);
        ck_assert_str_eq(g.model, "tiny");
        ck_assert(g.sde && g.progress);
        ck_assert_uint_eq(g.steps, 3);
        ck_assert_uint_eq(g.seed, 3);
        ck_assert_uint_eq(g.deadline_ms, 3);
        ck_assert(g.shift == 0.5 && g.cfg == 0.5 && g.eta == 0.5);
        ck_assert_mem_eq(g.latent_shape, LAT, sizeof g.latent_shape);
        if (order == 0) first = g;
        else ck_assert_uint_eq(g.version, first.version);
        /* forwarded: every known field goes on, no unknown one does */
        msg_set_t v = { "version", MSG_SET_U64, 4, NULL };
        ck_assert_int_eq(msg_forward(a, NULL, &m, MSG_REQUEST, 5, &v, 1), 0);
        ck_assert_int_eq(msg_recv(b, false, 0, &req, &err), 0);
        ck_assert_int_eq(msg_request_decode(&req, &r, &err), 0);
        ck_assert_uint_eq(r.version, 4);
        ck_assert_uint_eq(r.seed, 3);
        ck_assert(r.sde && r.progress && r.eta == 0.5);
        const void *hb = zmq_msg_data(&req.head);
        for (int i = 0; i < NK; i++) {
            char unk[32];
            snprintf(unk, sizeof unk, "x_%s", keys[i]);
            ck_assert_uint_eq(wire_tok_find(&req.tok, hb, 0, unk), 0);
            ck_assert_uint_ne(wire_tok_find(&req.tok, hb, 0, keys[i]), 0);
        }
        wire_msg_close(&m);
        wire_msg_close(&req);
    }
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
}
END_TEST

/* Weights by value: UPLOAD and FETCH_DATA carry raw bytes as a U8 chunk
 * (the one dtype no kernel sees), round trip exactly, and a chunk in any
 * other dtype, of more than MSG_CHUNK_MAX bytes or past the file's size is
 * refused; a GEN carrying a U8 context is refused too. */
START_TEST(test_upload_and_fetch_data_carry_u8_chunks_and_nothing_else_does) {
    static unsigned char bytes[37];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)(i * 7);
    wire_tensor_t t = msg_chunk(bytes, sizeof bytes);
    msg_upload_t u, back;
    memset(&u, 0, sizeof u);
    snprintf(u.component, sizeof u.component, "transformer");
    u.version = 9;
    memset(u.sha256, 'c', 64);
    u.size = 100;
    u.offset = 63;
    u.chunk = &t;
    void *ctx = zmq_ctx_new(), *a = zmq_socket(ctx, ZMQ_PAIR), *b = zmq_socket(ctx, ZMQ_PAIR);
    ck_assert_int_eq(zmq_bind(a, "inproc://u8"), 0);
    ck_assert_int_eq(zmq_connect(b, "inproc://u8"), 0);
    ck_assert_int_eq(msg_upload_send(a, NULL, 4, &u), 0);
    wire_msg_t m;
    wire_err_t err;
    ck_assert_int_eq(msg_recv(b, false, 0, &m, &err), 0);
    ck_assert_int_eq(msg_upload_decode(&m, &back, &err), 0);
    ck_assert_int_eq(msg_upload_validate(&back, &err), 0);
    ck_assert_uint_eq(back.offset, 63);
    ck_assert_uint_eq(back.size, 100);
    ck_assert_int_eq(back.chunk->dtype, WIRE_U8);
    ck_assert_uint_eq(back.chunk->bytes, sizeof bytes);
    ck_assert_mem_eq(back.chunk->data, bytes, sizeof bytes);
    back.offset = 64; /* 64 + 37 > 100 */
    ck_assert_int_eq(msg_upload_validate(&back, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.message, "past 'size'"));
    wire_msg_close(&m);
    /* F32 where bytes go */
    float f4[4] = { 0 };
    wire_tensor_t ft = t;
    ft.dtype = KERN_F32;
    ft.shape[0] = 4;
    ft.data = f4;
    ft.bytes = sizeof f4;
    u.chunk = &ft;
    ck_assert_int_eq(msg_upload_send(a, NULL, 5, &u), 0);
    ck_assert_int_eq(msg_recv(b, false, 0, &m, &err), 0);
    ck_assert_int_eq(msg_upload_decode(&m, &back, &err), 0);
    ck_assert_int_eq(msg_upload_validate(&back, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.message, "U8"));
    wire_msg_close(&m);
    /* a U8 context in a GEN */
    wire_val_t *h = gen_tree(6);
    wire_tensor_t c8 = t;
    snprintf(c8.name, sizeof c8.name, "context");
    c8.ndim = 2;
    c8.shape[0] = 1;
    c8.shape[1] = sizeof bytes;
    receive_tree(&m, h, &c8, 1);
    msg_gen_t g;
    int rc = msg_gen_decode(&m, &g, &err);
    if (rc == 0) rc = msg_gen_validate(&g, NULL, &err);
    ck_assert_int_eq(rc, -1);
    wire_msg_close(&m);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
}
END_TEST

START_TEST(test_missing_required_fields_are_named_with_their_path) {
    wire_val_t *h = wire_hdr("GEN", 1), *ls = wv_arr();
    for (int i = 0; i < 4; i++) wv_push(ls, wv_u64((uint64_t)LAT[i]));
    wv_set(h, "model", wv_str("tiny"));
    wv_set(h, "latent_shape", ls);
    expect_gen_refused(h, "bad_request", "missing 'steps'");

    h = wire_hdr("STATUS_REPLY", 1);
    wire_val_t *ws = wv_arr(), *w = wv_map();
    wv_set(w, "streams", wv_u64(1));
    wv_push(ws, w);
    wv_set(h, "workers", ws);
    wire_msg_t m;
    wire_err_t err;
    receive_tree(&m, h, NULL, 0);
    msg_status_reply_t r;
    ck_assert_int_eq(msg_status_reply_decode(&m, &r, &err), -1);
    ck_assert_str_eq(err.code, "bad_request");
    ck_assert_str_eq(err.message, "missing 'workers[0].name'");
    wire_msg_close(&m);

    h = wire_hdr("SYNC_ACK", 1);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(2));
    receive_tree(&m, h, NULL, 0);
    msg_sync_ack_t a;
    ck_assert_int_eq(msg_sync_ack_decode(&m, &a, &err), -1);
    ck_assert_str_eq(err.message, "missing 'ok'");
    wire_msg_close(&m);
}
END_TEST

START_TEST(test_a_type_carries_only_its_own_tensors) {
    wire_tensor_t t = tensor("context", KERN_F32, 2, CTX, g_ctx), extra = tensor("mask", KERN_F32, 2, CTX, g_unc);
    wire_msg_t m;
    wire_err_t err;
    receive_tree(&m, wire_hdr("STATUS", 3), &t, 1);
    ck_assert_int_eq(msg_decode(&m, MSG_STATUS, NULL, &err), -1);
    ck_assert_str_eq(err.code, "bad_request");
    ck_assert_str_eq(err.message, "STATUS carries no tensors (got 'context')");
    wire_msg_close(&m);

    wire_tensor_t two[2] = { t, extra };
    receive_tree(&m, gen_tree(4), two, 2);
    msg_gen_t g;
    ck_assert_int_eq(msg_gen_decode(&m, &g, &err), -1);
    ck_assert_str_eq(err.message, "unknown tensor 'mask' (a GEN carries context, uncond and latent only)");
    wire_msg_close(&m);

    /* a SYNC takes any names (inline weights), which validation then refuses
     * where the broker only syncs by path */
    wire_val_t *h = wire_hdr("SYNC", 5);
    wv_set(h, "component", wv_str("transformer"));
    wv_set(h, "version", wv_u64(2));
    wv_set(h, "sha256", wv_str("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"));
    receive_tree(&m, h, &extra, 1);
    msg_sync_t s;
    ck_assert_int_eq(msg_sync_decode(&m, &s, &err), 0);
    ck_assert_int_eq(s.n_tensors, 1);
    ck_assert_str_eq(s.tensors[0]->name, "mask");
    ck_assert_int_eq(msg_sync_validate(&s, true, &err), 0);
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.message, "inline tensors"));
    snprintf(s.path, sizeof s.path, "/w.safetensors");
    ck_assert_int_eq(msg_sync_validate(&s, true, &err), -1);
    ck_assert_str_eq(err.message, "give one of 'path', 'uploaded' and inline tensors");
    /* where inline tensors are no option, no message offers them */
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.message, "'path'"));
    ck_assert_ptr_nonnull(strstr(err.message, "'uploaded'"));
    s.n_tensors = 0;
    s.path[0] = 0;
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), -1);
    ck_assert_str_eq(err.message, "neither 'path' nor 'uploaded' given");
    ck_assert_int_eq(msg_sync_validate(&s, true, &err), -1);
    ck_assert_str_eq(err.message, "neither 'path', 'uploaded' nor inline tensors given");
    s.path[0] = '/';
    s.uploaded = true;
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), -1);
    ck_assert_str_eq(err.message, "give one of 'path' and 'uploaded'");
    s.uploaded = false;
    s.n_tensors = 1; /* back as decoded, for the close */
    wire_msg_close(&m);
}
END_TEST

/* base_version makes a SYNC a LoRA adapter (docs/PROTOCOL.md, "LoRA
 * adapters"): by path, by value with its config, or neither (the base
 * again); never inline, never both, the config only with an upload. */
START_TEST(test_an_adapter_sync_goes_by_path_by_value_with_its_config_or_is_the_base_again) {
    wire_err_t err;
    msg_sync_t s;
    memset(&s, 0, sizeof s);
    snprintf(s.component, sizeof s.component, "transformer");
    s.version = 5;
    s.base_version = 2;
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), 0); /* the base again */
    snprintf(s.path, sizeof s.path, "/w/adapter");
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), 0);
    s.uploaded = true;
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), -1); /* both */
    s.path[0] = '\0';
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), -1); /* uploaded without its config */
    ck_assert_ptr_nonnull(strstr(err.message, "lora_config"));
    snprintf(s.lora_config, sizeof s.lora_config, "{\"r\": 4}");
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), 0);
    s.uploaded = false;
    snprintf(s.path, sizeof s.path, "/w/adapter");
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), -1); /* a config with a path */
    s.lora_config[0] = '\0';
    s.base_version = 5;
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), -1); /* the base must be older */
    ck_assert_ptr_nonnull(strstr(err.message, "must be below"));
    s.base_version = 0;
    snprintf(s.lora_config, sizeof s.lora_config, "{}");
    ck_assert_int_eq(msg_sync_validate(&s, false, &err), -1); /* a config without base_version */
}
END_TEST

/* ---- the limits of a GEN ------------------------------------------------------------ */

/* A valid GEN on the tiny shapes, to break one field at a time. */
static msg_gen_t good_gen(wire_tensor_t t[3]) {
    msg_gen_t g;
    memset(&g, 0, sizeof g);
    snprintf(g.model, sizeof g.model, "tiny");
    g.steps = 2;
    g.shift = g.cfg = 1.0;
    g.eta = 0.7;
    memcpy(g.latent_shape, LAT, sizeof LAT);
    t[0] = tensor("context", KERN_F32, 2, CTX, g_ctx);
    t[1] = tensor("uncond", KERN_F32, 2, CTX, g_unc);
    t[2] = tensor("latent", KERN_F32, 4, LAT, g_lat);
    g.context = &t[0];
    g.uncond = &t[1];
    g.latent = &t[2];
    return g;
}

static void expect_invalid(const msg_gen_t *g, const msg_model_t *model, const char *code, const char *want) {
    wire_err_t err;
    ck_assert_int_eq(msg_gen_validate(g, model, &err), -1);
    ck_assert_str_eq(err.code, code);
    ck_assert_msg(strstr(err.message, want), "'%s' lacks '%s'", err.message, want);
}

/* Prompts and decoded outputs (issue 26): prompt, negative_prompt and
 * output round-trip; a prompt replaces context (never both, uncond never
 * with it, negative_prompt never without it); output is one of three
 * names; text must be UTF-8 and bounded; a model without text_len takes
 * no prompt; a RESULT's frames/video must be what the GEN asked for. */
START_TEST(test_a_prompt_gen_round_trips_and_its_text_rules_hold) {
    wire_tensor_t t[3];
    msg_gen_t g = good_gen(t), back;
    g.context = g.uncond = NULL;
    g.prompt = "a cat on a skateboard, \xe5\x8a\xa8\xe7\x94\xbb";
    g.negative_prompt = "blurry";
    g.cfg = 5.0;
    snprintf(g.output, sizeof g.output, "frames");
    msg_model_t wan = tiny_model();
    wan.text_len = 16;
    wire_err_t err;
    ck_assert_int_eq(msg_gen_validate(&g, &wan, &err), 0);
    ck_assert(msg_gen_guided(&g));
    ck_assert(msg_gen_decodes(&g));
    wire_msg_t m;
    round_trip(&m, MSG_GEN, 9, &g, &t[2], 1);
    ck_assert_int_eq(msg_gen_decode(&m, &back, &err), 0);
    ck_assert_str_eq(back.prompt, g.prompt);
    ck_assert_str_eq(back.negative_prompt, "blurry");
    ck_assert_str_eq(msg_gen_output(&back), "frames");
    ck_assert_ptr_null(back.context);
    ck_assert_int_eq(msg_gen_validate(&back, &wan, &err), 0);
    wire_msg_close(&m);
    /* absent: output latent, no prompt, nothing on the wire */
    msg_gen_t plain = good_gen(t);
    round_trip(&m, MSG_GEN, 10, &plain, t, 3);
    ck_assert_uint_eq(wire_tok_find(&m.tok, wire_msg_head(&m), 0, "output"), 0);
    ck_assert_uint_eq(wire_tok_find(&m.tok, wire_msg_head(&m), 0, "prompt"), 0);
    ck_assert_int_eq(msg_gen_decode(&m, &back, &err), 0);
    ck_assert_str_eq(msg_gen_output(&back), "latent");
    ck_assert(!msg_gen_decodes(&back));
    wire_msg_close(&m);
    /* guidance with a prompt: cfg != 1 */
    g.cfg = 1.0;
    ck_assert(!msg_gen_guided(&g));
    g.cfg = 5.0;
    /* the rules */
    msg_gen_t b = g;
    b.context = &t[0];
    expect_invalid(&b, NULL, "bad_request", "give a 'prompt' or a tensor 'context', not both");
    b = g;
    b.uncond = &t[1];
    expect_invalid(&b, NULL, "bad_request", "with a 'prompt', give 'negative_prompt'");
    b = good_gen(t);
    b.negative_prompt = "x";
    expect_invalid(&b, NULL, "bad_request", "'negative_prompt' needs a 'prompt'");
    b = g;
    snprintf(b.output, sizeof b.output, "gif");
    expect_invalid(&b, NULL, "bad_request", "'output' must be latent, frames or video (got 'gif')");
    b = g;
    b.prompt = "\xff\xfe bad";
    expect_invalid(&b, NULL, "bad_request", "'prompt' is not UTF-8");
    b.prompt = "over\xc0\xaflong";
    expect_invalid(&b, NULL, "bad_request", "'prompt' is not UTF-8");
    b.prompt = "bell\x07";
    expect_invalid(&b, NULL, "bad_request", "control characters");
    b.prompt = "del\x7f";
    expect_invalid(&b, NULL, "bad_request", "control characters");
    b.prompt = "next line \xc2\x85 (C1)";
    expect_invalid(&b, NULL, "bad_request", "control characters");
    b.prompt = "surrogate \xed\xa0\x80";
    expect_invalid(&b, NULL, "bad_request", "'prompt' is not UTF-8");
    /* what is text: tab, newline, CR, a no-break space (U+00A0, just past
     * C1), a CJK ideograph and an emoji */
    ck_assert(msg_text_ok("tab\tnew\nline\r"));
    ck_assert(msg_text_ok("nbsp\xc2\xa0 \xe7\x8c\xab \xf0\x9f\x90\x88"));
    ck_assert(!msg_text_ok("\xc2\x9f"));
    ck_assert(!msg_text_ok("\x1b[31m"));
    static char big[MSG_MAX_PROMPT_BYTES + 2];
    memset(big, 'a', sizeof big - 1);
    b.prompt = big;
    expect_invalid(&b, NULL, "bad_request", "'prompt' is 4097 bytes, longer than 4096");
    b = g;
    expect_invalid(&b, &(msg_model_t){ "tiny", 4, 32, 2, 2, 0 }, "bad_request", "model tiny takes no 'prompt'");
    b = g;
    b.context = NULL;
    b.prompt = b.negative_prompt = NULL;
    expect_invalid(&b, NULL, "bad_request", "missing tensor 'context' F32[L,T] (or a 'prompt')");
    b = g;
    b.n = 2;
    snprintf(b.output, sizeof b.output, "video");
    expect_invalid(&b, NULL, "bad_request", "a group (n > 1) asks for 'frames'");
    b = g;
    b.latent = NULL;
    b.latent_shape[1] = 64; /* 253 frames of 512 x 512 x 3: 190 MiB; fine. Wider: too large */
    b.latent_shape[2] = b.latent_shape[3] = 256;
    expect_invalid(&b, NULL, "too_large", "decoded video(s)");
    /* RESULT: frames of the decoded shape, and only when asked */
    static uint8_t px[5 * 64 * 64 * 3];
    const int64_t fshape[4] = { 5, 64, 64, 3 }, bad_shape[4] = { 5, 64, 64, 4 };
    static float lat[4 * 2 * 8 * 8];
    wire_tensor_t lt = tensor("latent", KERN_F32, 4, LAT, lat), ft = tensor("frames", WIRE_U8, 4, fshape, px);
    msg_result_t r;
    memset(&r, 0, sizeof r);
    r.version = 1;
    r.latent = &lt;
    r.frames = &ft;
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), 0);
    wire_tensor_t bt = tensor("frames", WIRE_U8, 4, bad_shape, px);
    r.frames = &bt;
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), -1);
    ck_assert_msg(strstr(err.message, "expected U8[5,64,64,3]"), "%s", err.message);
    r.frames = NULL;
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), -1);
    r.frames = &ft;
    msg_gen_t lat_only = good_gen(t);
    ck_assert_int_eq(msg_result_check(&r, &lat_only, 1, &err), -1);
    ck_assert_msg(strstr(err.message, "frames, which the request did not ask for"), "%s", err.message);
    /* a video is a non-empty U8 byte string */
    snprintf(g.output, sizeof g.output, "video");
    const int64_t vlen[1] = { 5 };
    wire_tensor_t vt = tensor("video", WIRE_U8, 1, vlen, px);
    r.frames = NULL;
    r.video = &vt;
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), 0);
    r.video = NULL;
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), -1);
}
END_TEST

/* Values no loop may return or run on: a RESULT whose latent, log_probs
 * or sigmas hold a NaN or an infinity is refused (internal, naming the
 * tensor: a worker's fault; the large trajectory and means are the
 * worker's to judge); log-probs with an eta
 * that is 0 as the float the step reads (1e-50) are bad_request, where
 * the smallest float eta passes. */
START_TEST(test_a_result_of_nan_or_inf_and_log_probs_at_a_float_zero_eta_are_refused) {
    wire_tensor_t t[3];
    msg_gen_t g = good_gen(t);
    g.sde = true;
    g.return_log_probs = true;
    g.return_trajectory = true;
    g.eta = 1e-50;
    expect_invalid(&g, NULL, "bad_request", "'return_log_probs' and 'return_means' need 'sde' with 'eta' > 0");
    g.eta = 1.5e-45; /* the smallest float above 0 */
    wire_err_t err;
    ck_assert_int_eq(msg_gen_validate(&g, NULL, &err), 0);
    static float lat[4 * 2 * 8 * 8], traj[3 * 4 * 2 * 8 * 8], lp[2], sg[3], ts[3];
    const int64_t tshape[5] = { 3, 4, 2, 8, 8 }, lshape[1] = { 2 }, sshape[1] = { 3 };
    wire_tensor_t lt = tensor("latent", KERN_F32, 4, LAT, lat), tt = tensor("trajectory", KERN_F32, 5, tshape, traj),
                  pt = tensor("log_probs", KERN_F32, 1, lshape, lp), st = tensor("sigmas", KERN_F32, 1, sshape, sg),
                  tst = tensor("timesteps", KERN_F32, 1, lshape, ts);
    msg_result_t r;
    memset(&r, 0, sizeof r);
    r.version = 1;
    r.latent = &lt;
    r.trajectory = &tt;
    r.log_probs = &pt;
    r.sigmas = &st;
    g.return_timesteps = true;
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), 0); /* timesteps absent: an older worker */
    r.timesteps = &tst;
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), 0);
    /* timesteps are [N] beside the sigmas, not N + 1, and never without log-probs asked */
    wire_tensor_t long_ts = tensor("timesteps", KERN_F32, 1, sshape, ts);
    r.timesteps = &long_ts;
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), -1);
    ck_assert_msg(strstr(err.message, "timesteps"), "%s", err.message);
    r.timesteps = &tst;
    g.return_timesteps = false; /* not asked for: a worker's fault (an older broker would not know the tensor) */
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), -1);
    ck_assert_msg(strstr(err.message, "timesteps"), "%s", err.message);
    g.return_timesteps = true;
    struct { float *at; const char *name; float v; } bad[] = {
        { &lat[77], "latent holds NaN", NAN }, { &lat[511], "latent holds NaN", INFINITY },
        { &lp[1], "log_probs holds NaN", -INFINITY }, { &sg[0], "sigmas holds NaN", NAN },
        { &ts[1], "timesteps holds NaN", INFINITY },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        *bad[i].at = bad[i].v;
        ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), -1);
        ck_assert_str_eq(err.code, "internal");
        ck_assert_msg(strstr(err.message, bad[i].name), "'%s' lacks '%s'", err.message, bad[i].name);
        *bad[i].at = 0;
    }
    lat[5] = 3e38f; /* finite, however large: the worker's to judge */
    ck_assert_int_eq(msg_result_check(&r, &g, 1, &err), 0);
}
END_TEST

/* Groups: n and seeds round-trip (GEN and RESULT), n absent is 1, a
 * group's latent is [n,C,F,H,W], and every bad group is refused with the
 * field named. */
static float g_lat3[3 * 4 * 2 * 8 * 8];

START_TEST(test_a_group_round_trips_and_every_bad_group_is_refused) {
    wire_tensor_t t[3];
    msg_gen_t g = good_gen(t), back;
    const int64_t lat3[5] = { 3, 4, 2, 8, 8 };
    t[2] = tensor("latent", KERN_F32, 5, lat3, g_lat3);
    g.n = 3;
    g.n_seeds = 3;
    g.seeds[0] = 7;
    g.seeds[1] = UINT64_MAX;
    g.seeds[2] = 0;
    msg_model_t tiny = tiny_model();
    wire_err_t err;
    ck_assert_int_eq(msg_gen_validate(&g, &tiny, &err), 0);
    wire_msg_t m;
    round_trip(&m, MSG_GEN, 4, &g, t, 3);
    ck_assert_int_eq(msg_gen_decode(&m, &back, &err), 0);
    ck_assert_uint_eq(back.n, 3);
    ck_assert_uint_eq(msg_gen_n(&back), 3);
    ck_assert_int_eq(back.n_seeds, 3);
    ck_assert_uint_eq(back.seeds[0], 7);
    ck_assert_uint_eq(back.seeds[1], UINT64_MAX);
    ck_assert_uint_eq(back.seeds[2], 0);
    ck_assert_int_eq(back.latent->ndim, 5);
    ck_assert_int_eq(msg_gen_validate(&back, &tiny, &err), 0);
    wire_msg_close(&m);
    /* no n: one sample, and nothing on the wire */
    msg_gen_t one = good_gen(t);
    t[2] = tensor("latent", KERN_F32, 4, LAT, g_lat);
    round_trip(&m, MSG_GEN, 5, &one, t, 3);
    ck_assert_uint_eq(wire_tok_find(&m.tok, wire_msg_head(&m), 0, "n"), 0);
    ck_assert_uint_eq(wire_tok_find(&m.tok, wire_msg_head(&m), 0, "seeds"), 0);
    ck_assert_int_eq(msg_gen_decode(&m, &back, &err), 0);
    ck_assert_uint_eq(msg_gen_n(&back), 1);
    ck_assert_int_eq(back.n_seeds, 0);
    wire_msg_close(&m);
    /* bad groups */
    g = good_gen(t);
    g.n = 3;
    expect_invalid(&g, NULL, "bad_request", "tensor 'latent' is F32[4,2,8,8], expected F32[3,4,2,8,8] (n, latent_shape)");
    const int64_t lat2[5] = { 2, 4, 2, 8, 8 };
    t[2] = tensor("latent", KERN_F32, 5, lat2, g_lat3);
    expect_invalid(&g, NULL, "bad_request", "expected F32[3,4,2,8,8]");
    g.latent = NULL;
    g.n_seeds = 2;
    expect_invalid(&g, NULL, "bad_request", "'seeds' has 2 entries, 'n' is 3");
    g.n_seeds = 0;
    ck_assert_int_eq(msg_gen_validate(&g, &tiny, &err), 0);
    g.return_trajectory = true; /* 3 x 10001 latents of 16 MiB: no frame holds them */
    g.steps = 10000;
    g.latent_shape[1] = 64;
    g.latent_shape[2] = 64;
    g.latent_shape[3] = 256;
    expect_invalid(&g, NULL, "too_large", "such latents exceed");
    g.return_trajectory = false;
    g.latent_shape[0] = 16; /* 16 MiB a sample, 64 of them: 1 GiB */
    g.latent_shape[1] = 16;
    g.n = 64;
    expect_invalid(&g, NULL, "too_large", "64 latents of this shape exceed 256 MiB");
    /* on the wire: n outside 1..64, seeds not integers, too many seeds */
    wire_val_t *h = gen_tree(9);
    wv_set(h, "n", wv_u64(65));
    expect_gen_refused(h, "bad_request", "'n' must be in 1..64 (got 65)");
    h = gen_tree(9);
    wv_set(h, "n", wv_u64(0));
    expect_gen_refused(h, "bad_request", "'n' must be in 1..64 (got 0)");
    h = gen_tree(9);
    wire_val_t *sd = wv_arr();
    wv_push(sd, wv_str("7"));
    wv_set(h, "seeds", sd);
    expect_gen_refused(h, "bad_request", "'seeds' must be an array of non-negative integers");
    h = gen_tree(9);
    sd = wv_arr();
    for (int i = 0; i < 65; i++) wv_push(sd, wv_u64((uint64_t)i));
    wv_set(h, "seeds", sd);
    wv_set(h, "n", wv_u64(64));
    expect_gen_refused(h, "bad_request", "'seeds' has more than 64 entries");
    h = gen_tree(9); /* [] is not "no seeds": exactly n of them, or leave it out */
    wv_set(h, "seeds", wv_arr());
    wv_set(h, "n", wv_u64(2));
    expect_gen_refused(h, "bad_request", "'seeds' must not be empty");
    /* RESULT: n and seeds echoed */
    msg_result_t r = { 0 }, rb;
    snprintf(r.worker, sizeof r.worker, "w1");
    r.n = 2;
    r.n_seeds = 2;
    r.seeds[0] = 5;
    r.seeds[1] = 6;
    const int64_t lat2b[5] = { 2, 4, 2, 8, 8 };
    wire_tensor_t lt = tensor("latent", KERN_F32, 5, lat2b, g_lat3);
    r.latent = &lt;
    round_trip(&m, MSG_RESULT, 10, &r, &lt, 1);
    ck_assert_int_eq(msg_result_decode(&m, &rb, &err), 0);
    ck_assert_uint_eq(rb.n, 2);
    ck_assert_int_eq(rb.n_seeds, 2);
    ck_assert_uint_eq(rb.seeds[1], 6);
    ck_assert_int_eq(rb.latent->ndim, 5);
    wire_msg_close(&m);
}
END_TEST

START_TEST(test_latent_shape_and_context_limits_hold_with_and_without_a_model) {
    wire_tensor_t t[3];
    msg_model_t tiny = tiny_model();
    msg_gen_t g = good_gen(t);
    wire_err_t err;
    ck_assert_int_eq(msg_gen_validate(&g, &tiny, &err), 0);
    g.latent = NULL;
    g.latent_shape[3] = 0;
    expect_invalid(&g, NULL, "bad_request", "'latent_shape' W must be in 1..65536 (got 0)");
    g.latent_shape[3] = 65537;
    expect_invalid(&g, NULL, "bad_request", "'latent_shape' W must be in 1..65536");
    g.latent_shape[1] = 4096;
    g.latent_shape[2] = 4096;
    g.latent_shape[3] = 2;
    expect_invalid(&g, NULL, "bad_request", "F x H x W must be at most 16777216");
    g.latent_shape[1] = 16;
    g.latent_shape[2] = 1024;
    g.latent_shape[3] = 1024;
    g.latent_shape[0] = 16; /* 2^24 positions x 16 channels x 4 bytes: 1 GiB */
    expect_invalid(&g, NULL, "bad_request", "makes a latent over 256 MiB");
    /* with the model: C, T and the patch grid */
    g = good_gen(t);
    g.latent = NULL;
    g.latent_shape[0] = 3;
    ck_assert_int_eq(msg_gen_validate(&g, NULL, &err), 0);
    expect_invalid(&g, &tiny, "bad_request", "latent has 3 channels, model tiny expects 4");
    g = good_gen(t);
    g.latent = NULL;
    g.latent_shape[2] = 7;
    ck_assert_int_eq(msg_gen_validate(&g, NULL, &err), 0);
    expect_invalid(&g, &tiny, "bad_request", "height and width must be multiples of 2");
    const int64_t wide[2] = { 5, 16 }, none[2] = { 0, 32 };
    g = good_gen(t);
    g.uncond = NULL;
    t[0] = tensor("context", KERN_F32, 2, wide, g_ctx);
    ck_assert_int_eq(msg_gen_validate(&g, NULL, &err), 0);
    expect_invalid(&g, &tiny, "bad_request", "context width 16, model tiny expects text_dim 32");
    t[0] = tensor("context", KERN_F32, 2, none, g_ctx);
    expect_invalid(&g, NULL, "bad_request", "L and T must be in 1..65536");
    g = good_gen(t);
    g.context = NULL;
    expect_invalid(&g, NULL, "bad_request", "missing tensor 'context'");
    g = good_gen(t);
    t[1] = tensor("uncond", KERN_F32, 2, wide, g_unc);
    expect_invalid(&g, NULL, "bad_request", "tensor 'uncond' is F32[5,16], expected the context's F32[5,32]");
    g = good_gen(t);
    snprintf(g.model, sizeof g.model, "small");
    expect_invalid(&g, &tiny, "bad_request", "model 'small' is not served here");
    /* more tensor bytes than a GEN may carry: too_large, not bad_request */
    g = good_gen(t);
    t[2].bytes = MSG_MAX_GEN_BYTES; /* validation reads sizes, never data */
    expect_invalid(&g, NULL, "too_large", "more than a GEN may carry (256 MiB)");
    g = good_gen(t);
    g.shift = 0;
    expect_invalid(&g, NULL, "bad_request", "'shift' must be > 0");
    g = good_gen(t);
    g.sde = true;
    g.eta = -1;
    expect_invalid(&g, NULL, "bad_request", "'eta' must be >= 0");
}
END_TEST

/* ---- the id, and too_large vs malformed ---------------------------------------------------- */

/* Decodes raw header bytes; returns the code, *id the id it is answered with. */
static const char *decode_raw(const void *p, size_t n, uint64_t *id) {
    static wire_err_t err;
    wire_msg_t m;
    zmq_msg_t f;
    zmq_msg_init_size(&f, n);
    memcpy(zmq_msg_data(&f), p, n);
    int rc = wire_decode_as(&m, &f, 1, &err, false);
    *id = m.id;
    wire_msg_close(&m);
    return rc ? err.code : "ok";
}

START_TEST(test_an_error_found_while_decoding_echoes_the_id_read_before_it) {
    uint64_t id = 0;
    /* {"id": 41, "type": "GEN", "x": 1, "x": 2}: the duplicate comes after the id */
    static const char dup[] = "\x84\xa2id\x29\xa4type\xa3GEN\xa1x\x01\xa1x\x02";
    ck_assert_str_eq(decode_raw(dup, sizeof dup - 1, &id), "malformed");
    ck_assert_uint_eq(id, 41);
    /* {"x": 1, "x": 2, "id": 41}: a map's keys are compared once it is
     * read, so the id was read before the duplicate was found */
    static const char after[] = "\x83\xa1x\x01\xa1x\x02\xa2id\x29";
    ck_assert_str_eq(decode_raw(after, sizeof after - 1, &id), "malformed");
    ck_assert_uint_eq(id, 41);
    /* {"x": <bin>, "id": 41}: the decoder stops at the bin, before the id */
    static const char late[] = "\x82\xa1x\xc4\x01\x00\xa2id\x29";
    ck_assert_str_eq(decode_raw(late, sizeof late - 1, &id), "malformed");
    ck_assert_uint_eq(id, 0);
    /* {"id": -1}: not an unsigned integer, so there is none to echo */
    static const char neg[] = "\x81\xa2id\xff";
    ck_assert_str_eq(decode_raw(neg, sizeof neg - 1, &id), "malformed");
    ck_assert_uint_eq(id, 0);
    /* a string over the limit after the id: too_large, under the id */
    unsigned char big[16 + WIRE_MAX_STR + 8];
    size_t n = 0;
    memcpy(big, "\x82\xa2id\x07\xa1s\xda", 8);
    n = 8;
    big[n++] = (WIRE_MAX_STR + 1) >> 8;
    big[n++] = (WIRE_MAX_STR + 1) & 0xff;
    memset(big + n, 'x', WIRE_MAX_STR + 1);
    n += WIRE_MAX_STR + 1;
    ck_assert_str_eq(decode_raw(big, n, &id), "too_large");
    ck_assert_uint_eq(id, 7);
}
END_TEST

START_TEST(test_too_large_is_a_limit_exceeded_and_malformed_bytes_that_are_not_a_message) {
    uint64_t id;
    static const struct {
        const char *bytes;
        size_t n;
        const char *code;
    } cases[] = {
        { "\xdf\xff\xff\xff\xff", 5, "too_large" },              /* more entries than WIRE_MAX_ITEMS */
        { "\x81\xa1x\x91\x91\x91\x91\x91\x91\x91\x91\xc0", 13, "too_large" }, /* nesting 9 */
        { "\x81\xa1x\xdc\x00\x10", 6, "malformed" },            /* 16 entries in 0 bytes */
        { "\x81\xa1x", 3, "malformed" },                          /* truncated */
        { "\x81\xa1x\xc4\x01\x00", 6, "malformed" },              /* bin */
        { "\x81\x01\x02", 3, "malformed" },                       /* a key that is not a string */
        { "\x91\xc0", 2, "malformed" },                           /* not a map */
        { "\x80\xc0", 2, "malformed" },                           /* trailing bytes */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(!strcmp(decode_raw(cases[i].bytes, cases[i].n, &id), cases[i].code), "case %zu: want %s", i,
                      cases[i].code);
}
END_TEST

/* ---- sha256, UTF-8, interop ------------------------------------------------------------------ */

START_TEST(test_sha256_is_64_hex_digits_in_either_case) {
    ck_assert(msg_sha256_valid("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    ck_assert(msg_sha256_valid("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"));
    ck_assert(msg_sha256_valid("Ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015aD"));
    ck_assert(!msg_sha256_valid("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a"));
    ck_assert(!msg_sha256_valid("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015add"));
    ck_assert(!msg_sha256_valid("ga7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    ck_assert(!msg_sha256_valid(NULL));
}
END_TEST

START_TEST(test_strings_sent_are_valid_utf8_with_invalid_bytes_replaced) {
    void *ctx = zmq_ctx_new(), *a = zmq_socket(ctx, ZMQ_PAIR), *b = zmq_socket(ctx, ZMQ_PAIR);
    ck_assert_int_eq(zmq_bind(a, "inproc://utf8"), 0);
    ck_assert_int_eq(zmq_connect(b, "inproc://utf8"), 0);
    /* what a broker echoes: a type name cut in the middle of a character,
     * a lone continuation byte, an overlong NUL, a surrogate */
    ck_assert_int_eq(msg_send_error(a, NULL, 3, "unknown_type", "type '%.2s' x\x80y \xc0\x80 \xed\xa0\x80", "\xc3\xa9\xc3\xa9"), 0);
    wire_msg_t m;
    wire_err_t err;
    ck_assert_int_eq(msg_recv(b, false, 0, &m, &err), 0);
    msg_error_t e;
    ck_assert_int_eq(msg_error_decode(&m, &e, &err), 0);
    ck_assert(wire_utf8_valid(e.message, strlen(e.message)));
    ck_assert_str_eq(e.message, "type '\xc3\xa9' x\xef\xbf\xbdy \xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    wire_msg_close(&m);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
    /* valid UTF-8 passes untouched, 4-byte characters included */
    ck_assert(wire_utf8_valid("\xf0\x9f\x99\x82 ok", 7));
    ck_assert(!wire_utf8_valid("\xf4\x90\x80\x80", 4)); /* past U+10FFFF */
}
END_TEST

/* The writer's integers and strings are byte for byte what msgpack-c's
 * packer writes (both pick the shortest form). */
START_TEST(test_the_writer_writes_what_msgpack_c_writes) {
    static const int64_t ints[] = { 0, 1, 127, 128, 255, 256, 65535, 65536, 4294967295ll, 4294967296ll, INT64_MAX,
                                    -1, -32, -33, -128, -129, -32768, -32769, INT32_MIN, (int64_t)INT32_MIN - 1,
                                    INT64_MIN };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        wire_buf_t w;
        wire_buf_init(&w);
        wire_put_i64(&w, ints[i]);
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_int64(&pk, ints[i]);
        ck_assert_msg(w.n == sb.size && !memcmp(w.p, sb.data, sb.size), "%lld", (long long)ints[i]);
        msgpack_sbuffer_destroy(&sb);
        wire_buf_free(&w);
    }
    for (size_t len = 0; len < 70000; len = len ? len * 3 : 1) {
        char *s = malloc(len + 1);
        memset(s, 'a', len);
        wire_buf_t w;
        wire_buf_init(&w);
        wire_put_strn(&w, s, len);
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_str(&pk, len);
        msgpack_pack_str_body(&pk, s, len);
        ck_assert_msg(w.n == sb.size && !memcmp(w.p, sb.data, sb.size), "string of %zu", len);
        msgpack_sbuffer_destroy(&sb);
        wire_buf_free(&w);
        free(s);
    }
}
END_TEST

/* msgpack-c reads what msg_encode writes: the same fields, shortest forms. */
START_TEST(test_msgpack_c_reads_an_encoded_status_reply) {
    msg_worker_status_t w[20];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 20; i++) snprintf(w[i].name, MSG_NAME_MAX, "w%d", i);
    msg_status_reply_t s = { 0 };
    s.workers = w;
    s.n_workers = 20; /* an array past 15 entries: array16 */
    s.queue_max = 64;
    size_t len;
    unsigned char *b = msg_encode(MSG_STATUS_REPLY, 1, &s, &len);
    ck_assert_ptr_nonnull(b);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    ck_assert_int_eq(msgpack_unpack_next(&u, (const char *)b, len, &off), MSGPACK_UNPACK_SUCCESS);
    ck_assert_uint_eq(off, len);
    msgpack_object o = u.data;
    ck_assert_int_eq(o.type, MSGPACK_OBJECT_MAP);
    bool found = false;
    for (uint32_t i = 0; i < o.via.map.size; i++) {
        msgpack_object k = o.via.map.ptr[i].key, v = o.via.map.ptr[i].val;
        if (k.via.str.size == 7 && !memcmp(k.via.str.ptr, "workers", 7)) {
            ck_assert_int_eq(v.type, MSGPACK_OBJECT_ARRAY);
            ck_assert_uint_eq(v.via.array.size, 20);
            found = true;
        }
    }
    ck_assert(found);
    msgpack_unpacked_destroy(&u);
    free(b);
}
END_TEST

/* ---- no allocation per field ------------------------------------------------------------------ */

START_TEST(test_a_gen_decodes_and_validates_without_touching_the_heap) {
    wire_tensor_t t[3] = { tensor("context", KERN_F32, 2, CTX, g_ctx), tensor("uncond", KERN_F32, 2, CTX, g_unc),
                           tensor("latent", KERN_F32, 4, LAT, g_lat) };
    msg_gen_t g = { 0 };
    snprintf(g.model, sizeof g.model, "tiny");
    g.steps = 6;
    g.shift = g.cfg = 1;
    memcpy(g.latent_shape, LAT, sizeof LAT);
    g.context = &t[0];
    g.uncond = &t[1];
    g.latent = &t[2];
    size_t len;
    unsigned char *b = msg_encode(MSG_GEN, 1, &g, &len);
    ck_assert_ptr_nonnull(b);
    wire_msg_t *m = calloc(1, sizeof *m);
    zmq_msg_t f[4];
    zmq_msg_init_size(&f[0], len);
    memcpy(zmq_msg_data(&f[0]), b, len);
    for (int i = 0; i < 3; i++) {
        zmq_msg_init_size(&f[1 + i], t[i].bytes);
        memcpy(zmq_msg_data(&f[1 + i]), t[i].data, t[i].bytes);
    }
    free(b);
    wire_err_t err;
    msg_gen_t back;
    struct mallinfo2 before = mallinfo2();
    int rc = wire_decode_as(m, f, 4, &err, false);
    int rc2 = rc ? -1 : msg_gen_decode(m, &back, &err);
    int rc3 = rc2 ? -1 : msg_gen_validate(&back, NULL, &err);
    struct mallinfo2 after = mallinfo2();
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(rc2, 0);
    ck_assert_int_eq(rc3, 0);
    ck_assert_uint_eq(after.uordblks, before.uordblks); /* nothing allocated, nothing freed */
    ck_assert_uint_le(m->tok.n, WIRE_TOKS_INLINE);
    wire_msg_close(m);
    free(m);
}
END_TEST


/* ---- forwarding without re-encoding ------------------------------------------------ */

START_TEST(test_a_forwarded_gen_is_the_request_with_new_id_and_version_and_without_unknown_fields) {
    void *ctx = zmq_ctx_new(), *a = zmq_socket(ctx, ZMQ_PAIR), *b = zmq_socket(ctx, ZMQ_PAIR);
    ck_assert_int_eq(zmq_bind(a, "inproc://fwd"), 0);
    ck_assert_int_eq(zmq_connect(b, "inproc://fwd"), 0);
    /* a GEN as a client wrote it: fields in its own order, one this
     * protocol does not know, a version to be replaced */
    wire_val_t *h = gen_tree(7);
    wv_set(h, "from_a_newer_client", wv_str("x"));
    wv_set(h, "version", wv_u64(2));
    wv_set(h, "seed", wv_u64(99));
    wire_tensor_t t[2] = { tensor("context", KERN_F32, 2, CTX, g_ctx), tensor("latent", KERN_F32, 4, LAT, g_lat) };
    wire_msg_t gen, req;
    receive_tree(&gen, h, t, 2);
    msg_gen_t g, r;
    wire_err_t err;
    ck_assert_int_eq(msg_gen_decode(&gen, &g, &err), 0);
    msg_set_t version = { "version", MSG_SET_U64, 5, NULL };
    ck_assert_int_eq(msg_forward(a, NULL, &gen, MSG_REQUEST, 1234, &version, 1), 0);
    ck_assert_int_eq(msg_recv(b, false, 0, &req, &err), 0);
    ck_assert_int_eq(msg_type(&req), MSG_REQUEST);
    ck_assert_uint_eq(req.id, 1234);
    ck_assert_int_eq(msg_request_decode(&req, &r, &err), 0);
    ck_assert_uint_eq(r.version, 5);
    ck_assert_uint_eq(r.seed, 99);
    ck_assert_str_eq(r.model, g.model);
    ck_assert_uint_eq(r.steps, g.steps);
    ck_assert_mem_eq(r.latent_shape, g.latent_shape, sizeof g.latent_shape);
    ck_assert_mem_eq(r.latent->data, g_lat, sizeof g_lat);
    ck_assert_uint_eq(r.context->bytes, sizeof g_ctx);
    const void *hb = zmq_msg_data(&req.head);
    ck_assert_uint_eq(wire_tok_find(&req.tok, hb, 0, "from_a_newer_client"), 0);
    ck_assert_uint_ne(wire_tok_find(&req.tok, hb, 0, "proto"), 0);
    /* the rest of the header is the received bytes: a second forward of
     * the forwarded message with the same patch is the same message */
    wire_msg_t again;
    ck_assert_int_eq(msg_forward(a, NULL, &req, MSG_REQUEST, 1234, &version, 1), 0);
    ck_assert_int_eq(msg_recv(b, false, 0, &again, &err), 0);
    ck_assert_uint_eq(zmq_msg_size(&again.head), zmq_msg_size(&req.head));
    ck_assert_mem_eq(zmq_msg_data(&again.head), hb, zmq_msg_size(&req.head));
    /* a name and a hash are written as such */
    msg_result_t res = { 0 }, back;
    snprintf(res.worker, sizeof res.worker, "w9");
    res.version = 3;
    wire_tensor_t lt = tensor("latent", KERN_F32, 4, LAT, g_lat);
    res.latent = &lt;
    wire_msg_t m1, m2;
    msg_result_t blank = res;
    blank.worker[0] = '\0';
    ck_assert_int_eq(msg_result_send(a, NULL, 8, &blank), 0);
    ck_assert_int_eq(msg_recv(b, false, 0, &m1, &err), 0);
    msg_set_t set[2] = { { "worker", MSG_SET_NAME, 0, "w9" }, { "key_hash", MSG_SET_HASH, 0xabcull, NULL } };
    ck_assert_int_eq(msg_forward(a, NULL, &m1, MSG_RESULT, 77, set, 2), 0);
    ck_assert_int_eq(msg_recv(b, false, 0, &m2, &err), 0);
    ck_assert_int_eq(msg_result_decode(&m2, &back, &err), 0);
    ck_assert_uint_eq(m2.id, 77);
    ck_assert_str_eq(back.worker, "w9");
    ck_assert_uint_eq(back.key_hash, 0xabc);
    ck_assert_uint_eq(back.version, 3);
    ck_assert_mem_eq(back.latent->data, g_lat, sizeof g_lat);
    ck_assert_int_eq(msg_forward(a, NULL, &m1, MSG_RESULT, 77, set, MSG_SET_MAX + 1), -1);
    wire_msg_close(&gen);
    wire_msg_close(&req);
    wire_msg_close(&again);
    wire_msg_close(&m1);
    wire_msg_close(&m2);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
}
END_TEST

START_TEST(test_skipping_a_value_lands_where_the_tokenizer_ends_it_and_its_token_starts) {
    /* every format a header may hold, nested, and strings, arrays and maps
     * that take 16-bit lengths */
    wire_val_t *h = gen_tree(3), *arr = wv_arr(), *map = wv_map();
    char *big = malloc(4001); /* str16; a header holds no longer string */
    memset(big, 'b', 4000);
    big[4000] = '\0';
    wv_set(h, "big", wv_str(big));
    for (int i = 0; i < 20; i++) wv_push(arr, i % 2 ? wv_i64(-100000 * i) : wv_f64(i / 3.0));
    for (int i = 0; i < 20; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        wv_set(map, k, i % 3 ? wv_nil() : wv_bool(i & 1));
    }
    wv_set(h, "arr", arr);
    wv_set(h, "map", map);
    wv_set(h, "u", wv_u64(UINT64_MAX));
    free(big);
    size_t len;
    unsigned char *b = wire_encode_header(h, &len);
    wv_free(&h);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(wire_skip(b, len, 0), len);
    wire_toks_t tk;
    memset(&tk, 0, sizeof tk);
    wire_err_t err;
    ck_assert_int_eq(wire_tokenize(b, len, &tk, NULL, NULL, 0, &err), 0);
    /* entry by entry, each key and value ends where the next begins */
    size_t at = wire_map_header_len(b, len);
    ck_assert_uint_gt(at, 0);
    const wire_tok_t *v = wire_toks_v(&tk);
    for (uint32_t j = 0, k = 1; j < v[0].n; j++, k = v[k + 1].next) {
        size_t kl;
        const char *ks = wire_tok_str(&tk, b, k, &kl);
        ck_assert_uint_eq(v[k].at, at); /* the token knows where its bytes start */
        size_t key_end = wire_skip(b, len, at);
        ck_assert_uint_eq(key_end, (size_t)(ks - (const char *)b) + kl);
        ck_assert_uint_eq(v[k + 1].at, key_end);
        at = wire_skip(b, len, key_end);
        ck_assert_uint_gt(at, key_end);
    }
    ck_assert_uint_eq(at, len);
    /* and every token, nested ones included, starts where skipping the
     * values before it in document order ends */
    for (uint32_t i = 0; i + 1 < tk.n; i++) {
        if (v[i].kind == WV_ARR || v[i].kind == WV_MAP) continue; /* its first entry starts after its header */
        ck_assert_uint_eq(wire_skip(b, len, v[i].at), v[i + 1].at);
    }
    ck_assert_uint_eq(wire_skip(b, len - 1, 0), 0); /* cut short */
    wire_toks_free(&tk);
    free(b);
}
END_TEST

/* ---- prewarm ------------------------------------------------------------------------ */

/* A PREWARM key's header map: every required field, one left out by name. */
static wire_val_t *prewarm_key_tree(const char *omit) {
    wire_val_t *k = wv_map(), *ls = wv_arr();
    for (int i = 0; i < 4; i++) wv_push(ls, wv_u64((uint64_t)LAT[i]));
    wv_set(k, "model", wv_str("tiny"));
    if (strcmp(omit, "latent_shape")) wv_set(k, "latent_shape", ls);
    else wv_free(&ls);
    if (strcmp(omit, "text_len")) wv_set(k, "text_len", wv_u64(5));
    wv_set(k, "text_dim", wv_u64(32));
    if (strcmp(omit, "key_hash")) wv_set(k, "key_hash", wv_str("b6d4e43bdf155e32"));
    return k;
}

/* Two keys, every field set, come back as they went; the list validates. */
/* PEER (a standby pair): its state, role, term and the current SYNCs go
 * whole; a state or role missing is refused. */
START_TEST(test_a_peer_round_trips_with_its_current_syncs_and_needs_its_state) {
    msg_sync_t sy[2];
    memset(sy, 0, sizeof sy);
    snprintf(sy[0].component, sizeof sy[0].component, "transformer");
    sy[0].version = 7;
    memset(sy[0].sha256, 'a', 64);
    snprintf(sy[0].path, sizeof sy[0].path, "/w/v7.safetensors");
    snprintf(sy[1].component, sizeof sy[1].component, "vae");
    sy[1].version = 3;
    memset(sy[1].sha256, 'b', 64);
    sy[1].uploaded = true;
    sy[1].base_version = 2;
    snprintf(sy[1].lora_config, sizeof sy[1].lora_config, "{\"r\": 8}");
    msg_peer_t p, pb;
    memset(&p, 0, sizeof p);
    snprintf(p.state, sizeof p.state, "active");
    snprintf(p.role, sizeof p.role, "backup");
    p.term = 12;
    p.boot = 0x1234abcdull;
    snprintf(p.clients, sizeof p.clients, "tcp://10.0.0.2:5555");
    p.syncs = sy;
    p.n_syncs = 2;
    wire_msg_t m;
    wire_err_t err;
    round_trip(&m, MSG_PEER, 0, &p, NULL, 0);
    ck_assert_str_eq(msg_type_name(MSG_PEER), "PEER");
    ck_assert_int_eq(msg_peer_decode(&m, &pb, &err), 0);
    ck_assert_str_eq(pb.state, "active");
    ck_assert_str_eq(pb.role, "backup");
    ck_assert_uint_eq(pb.term, 12);
    ck_assert_uint_eq(pb.boot, 0x1234abcdull);
    ck_assert_str_eq(pb.clients, "tcp://10.0.0.2:5555");
    ck_assert_uint_eq(pb.n_syncs, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_str_eq(pb.syncs[i].component, sy[i].component);
        ck_assert_uint_eq(pb.syncs[i].version, sy[i].version);
        ck_assert_str_eq(pb.syncs[i].sha256, sy[i].sha256);
        ck_assert_str_eq(pb.syncs[i].path, sy[i].path);
        ck_assert(pb.syncs[i].uploaded == sy[i].uploaded);
        ck_assert_uint_eq(pb.syncs[i].base_version, sy[i].base_version);
        ck_assert_str_eq(pb.syncs[i].lora_config, sy[i].lora_config);
    }
    wire_msg_close(&m);
    /* a standby sends no syncs; its term may be 0 */
    msg_peer_t q;
    memset(&q, 0, sizeof q);
    snprintf(q.state, sizeof q.state, "standby");
    snprintf(q.role, sizeof q.role, "primary");
    round_trip(&m, MSG_PEER, 0, &q, NULL, 0);
    ck_assert_int_eq(msg_peer_decode(&m, &pb, &err), 0);
    ck_assert_uint_eq(pb.n_syncs, 0);
    ck_assert_uint_eq(pb.term, 0);
    wire_msg_close(&m);
    /* an empty state: refused at decode, naming it */
    q.state[0] = '\0';
    round_trip(&m, MSG_PEER, 0, &q, NULL, 0);
    ck_assert_int_eq(msg_peer_decode(&m, &pb, &err), -1);
    ck_assert_str_eq(err.code, WIRE_E_BAD_REQUEST);
    ck_assert_ptr_nonnull(strstr(err.message, "state"));
    wire_msg_close(&m);
}
END_TEST

START_TEST(test_a_prewarm_round_trips_with_every_field_of_each_key) {
    msg_prewarm_key_t k[2];
    memset(k, 0, sizeof k);
    snprintf(k[0].model, sizeof k[0].model, "tiny");
    memcpy(k[0].latent_shape, LAT, sizeof LAT);
    k[0].text_len = 5;
    k[0].text_dim = 32;
    k[0].cfg = true;
    k[0].n = 4;
    snprintf(k[0].solver, sizeof k[0].solver, "unipc");
    k[0].key_hash = 0xb6d4e43bdf155e32ull;
    k[0].requests = 17;
    snprintf(k[1].model, sizeof k[1].model, "wan2.1-t2v-1.3b");
    const int64_t lat1[4] = { 16, 21, 60, 104 };
    memcpy(k[1].latent_shape, lat1, sizeof lat1);
    k[1].text_len = 512;
    k[1].text_dim = 4096;
    k[1].cfg = false;
    k[1].n = 1;
    snprintf(k[1].solver, sizeof k[1].solver, "euler");
    k[1].sde = true;
    k[1].key_hash = UINT64_MAX;
    k[1].requests = 1;
    msg_prewarm_t p = { k, 2 }, pb;
    wire_msg_t m;
    wire_err_t err;
    round_trip(&m, MSG_PREWARM, 9, &p, NULL, 0);
    ck_assert_str_eq(msg_type_name(MSG_PREWARM), "PREWARM");
    ck_assert_int_eq(msg_prewarm_decode(&m, &pb, &err), 0);
    ck_assert_int_eq(msg_prewarm_validate(&pb, &err), 0);
    ck_assert_uint_eq(pb.n_keys, 2);
    for (int i = 0; i < 2; i++) {
        const msg_prewarm_key_t *a = &k[i], *b = &pb.keys[i];
        ck_assert_str_eq(b->model, a->model);
        ck_assert_mem_eq(b->latent_shape, a->latent_shape, sizeof a->latent_shape);
        ck_assert_uint_eq(b->text_len, a->text_len);
        ck_assert_uint_eq(b->text_dim, a->text_dim);
        ck_assert(b->cfg == a->cfg);
        ck_assert_uint_eq(b->n, a->n);
        ck_assert_str_eq(b->solver, a->solver);
        ck_assert(b->sde == a->sde);
        ck_assert_uint_eq(b->key_hash, a->key_hash);
        ck_assert_uint_eq(b->requests, a->requests);
    }
    wire_msg_close(&m);
    /* an empty list is a PREWARM too (the broker's "none of yours is hot") */
    msg_prewarm_t none = { NULL, 0 };
    round_trip(&m, MSG_PREWARM, 10, &none, NULL, 0);
    ck_assert_int_eq(msg_prewarm_decode(&m, &pb, &err), 0);
    ck_assert_uint_eq(pb.n_keys, 0);
    ck_assert_int_eq(msg_prewarm_validate(&pb, &err), 0);
    wire_msg_close(&m);
}
END_TEST

/* Optional fields left out take their defaults (n 1, solver "" for
 * euler, no sde, no cfg, requests 0); key_hash, latent_shape and
 * text_len are required, named with their path. */
START_TEST(test_a_prewarm_key_takes_defaults_and_needs_its_hash_shape_and_text_len) {
    wire_val_t *h = wire_hdr("PREWARM", 3), *keys = wv_arr();
    wv_push(keys, prewarm_key_tree(""));
    wv_set(h, "keys", keys);
    wire_msg_t m;
    wire_err_t err;
    receive_tree(&m, h, NULL, 0);
    msg_prewarm_t p;
    ck_assert_int_eq(msg_prewarm_decode(&m, &p, &err), 0);
    ck_assert_uint_eq(p.n_keys, 1);
    ck_assert_str_eq(p.keys[0].model, "tiny");
    ck_assert_mem_eq(p.keys[0].latent_shape, LAT, sizeof LAT);
    ck_assert_uint_eq(p.keys[0].text_len, 5);
    ck_assert_uint_eq(p.keys[0].text_dim, 32);
    ck_assert_uint_eq(p.keys[0].key_hash, 0xb6d4e43bdf155e32ull);
    ck_assert_uint_eq(p.keys[0].n, 1);
    ck_assert_str_eq(p.keys[0].solver, "");
    ck_assert(!p.keys[0].sde);
    ck_assert(!p.keys[0].cfg);
    ck_assert_uint_eq(p.keys[0].requests, 0);
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), 0);
    wire_msg_close(&m);

    static const char *required[] = { "key_hash", "latent_shape", "text_len" };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        h = wire_hdr("PREWARM", 4);
        keys = wv_arr();
        wv_push(keys, prewarm_key_tree(""));
        wv_push(keys, prewarm_key_tree(required[i]));
        wv_set(h, "keys", keys);
        receive_tree(&m, h, NULL, 0);
        ck_assert_int_eq(msg_prewarm_decode(&m, &p, &err), -1);
        ck_assert_str_eq(err.code, "bad_request");
        char want[64];
        snprintf(want, sizeof want, "missing 'keys[1].%s'", required[i]);
        ck_assert_str_eq(err.message, want);
        wire_msg_close(&m);
    }
    /* the list itself is required */
    receive_tree(&m, wire_hdr("PREWARM", 5), NULL, 0);
    ck_assert_int_eq(msg_prewarm_decode(&m, &p, &err), -1);
    ck_assert_str_eq(err.message, "missing 'keys'");
    wire_msg_close(&m);
}
END_TEST

/* Validation: at most MSG_MAX_PREWARM keys, a known solver (with sde:
 * the grid it runs on), a latent shape a GEN could have. */
START_TEST(test_a_prewarm_of_too_many_keys_an_unknown_solver_or_a_bad_shape_is_refused_and_sde_on_a_grid_is_taken) {
    static msg_prewarm_key_t k[MSG_MAX_PREWARM + 1];
    memset(k, 0, sizeof k);
    for (int i = 0; i <= MSG_MAX_PREWARM; i++) {
        snprintf(k[i].model, sizeof k[i].model, "tiny");
        memcpy(k[i].latent_shape, LAT, sizeof LAT);
        k[i].text_len = 5;
        k[i].text_dim = 32;
        k[i].n = 1;
        k[i].key_hash = (uint64_t)i + 1;
    }
    wire_err_t err;
    msg_prewarm_t p = { k, MSG_MAX_PREWARM };
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), 0);
    p.n_keys = MSG_MAX_PREWARM + 1;
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), -1);
    ck_assert_str_eq(err.code, "bad_request");
    ck_assert_msg(strstr(err.message, "at most 64 keys (got 65)"), "%s", err.message);

    p.n_keys = 3;
    static const char *good[] = { "", "euler", "unipc", "dpm++" };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(k[2].solver, sizeof k[2].solver, "%s", good[i]);
        ck_assert_msg(msg_prewarm_validate(&p, &err) == 0, "solver '%s': %s", good[i], err.message);
    }
    snprintf(k[2].solver, sizeof k[2].solver, "ddim");
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), -1);
    ck_assert_str_eq(err.code, "bad_request");
    ck_assert_msg(strstr(err.message, "'keys' 2: 'solver' must be euler, unipc or dpm++ (got 'ddim')"), "%s",
                  err.message);

    k[2].sde = true;
    k[2].solver[0] = '\0';
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), 0); /* sde: Euler's */
    snprintf(k[2].solver, sizeof k[2].solver, "euler");
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), 0);
    snprintf(k[2].solver, sizeof k[2].solver, "unipc"); /* sde on UniPC's grid */
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), 0);
    snprintf(k[2].solver, sizeof k[2].solver, "dpm++");
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), 0);
    k[2].sde = false;
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), 0);

    k[1].latent_shape[3] = 0;
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), -1);
    ck_assert_str_eq(err.code, "bad_request");
    ck_assert_msg(strstr(err.message, "'latent_shape' W must be in 1..65536 (got 0)"), "%s", err.message);
    k[1].latent_shape[3] = LAT[3];
    k[1].latent_shape[1] = 4096;
    k[1].latent_shape[2] = 4096;
    k[1].latent_shape[3] = 2;
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), -1);
    ck_assert_msg(strstr(err.message, "F x H x W must be at most 16777216"), "%s", err.message);
    memcpy(k[1].latent_shape, LAT, sizeof LAT);
    ck_assert_int_eq(msg_prewarm_validate(&p, &err), 0);
}
END_TEST

/* READY's "prewarm": how many hot keys a worker asks for, 0..64; absent 0. */
START_TEST(test_ready_prewarm_round_trips_and_more_than_64_is_refused_at_decode) {
    char models[1][MSG_NAME_MAX] = { "tiny" };
    msg_ready_t r = { 0 }, rb;
    snprintf(r.name, sizeof r.name, "w0");
    r.streams = 1;
    r.models = models;
    r.n_models = 1;
    wire_msg_t m;
    wire_err_t err;
    const uint64_t asks[] = { 0, 8, MSG_MAX_PREWARM };
    for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++) {
        r.prewarm = asks[i];
        round_trip(&m, MSG_READY, 0, &r, NULL, 0);
        ck_assert_int_eq(msg_ready_decode(&m, &rb, &err), 0);
        ck_assert_int_eq(msg_ready_validate(&rb, &err), 0);
        ck_assert_uint_eq(rb.prewarm, asks[i]);
        wire_msg_close(&m);
    }
    for (uint64_t v = MSG_MAX_PREWARM; v <= MSG_MAX_PREWARM + 1; v++) {
        wire_val_t *h = wire_hdr("READY", 0), *ms = wv_arr();
        wv_push(ms, wv_str("tiny"));
        wv_set(h, "name", wv_str("w0"));
        wv_set(h, "models", ms);
        wv_set(h, "prewarm", wv_u64(v));
        receive_tree(&m, h, NULL, 0);
        int rc = msg_ready_decode(&m, &rb, &err);
        if (v == MSG_MAX_PREWARM) {
            ck_assert_int_eq(rc, 0);
            ck_assert_uint_eq(rb.prewarm, MSG_MAX_PREWARM);
        } else {
            ck_assert_int_eq(rc, -1);
            ck_assert_str_eq(err.code, "bad_request");
            ck_assert_msg(strstr(err.message, "'prewarm' must be in 0..64 (got 65)"), "%s", err.message);
        }
        wire_msg_close(&m);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("msg");
    TCase *t = tcase_create("round trips");
    tcase_add_test(t, test_every_type_has_its_name_and_a_bodyless_one_round_trips);
    tcase_add_test(t, test_gen_and_request_round_trip_with_every_field_and_tensor);
    tcase_add_test(t, test_result_progress_error_and_busy_round_trip);
    tcase_add_test(t, test_cancel_round_trips_and_refuses_what_it_cannot_carry);
    tcase_add_test(t, test_sync_messages_round_trip);
    tcase_add_test(t, test_an_adapter_sync_goes_by_path_by_value_with_its_config_or_is_the_base_again);
    tcase_add_test(t, test_worker_messages_round_trip);
    tcase_add_test(t, test_status_reply_round_trips_with_workers_lagging_keys_and_models);
    tcase_add_test(t, test_a_gen_client_token_and_a_status_reply_boot_round_trip_and_are_absent_as_0);
    tcase_add_test(t, test_a_prewarm_round_trips_with_every_field_of_each_key);
    tcase_add_test(t, test_a_peer_round_trips_with_its_current_syncs_and_needs_its_state);
    tcase_add_test(t, test_ready_prewarm_round_trips_and_more_than_64_is_refused_at_decode);
    suite_add_tcase(s, t);
    t = tcase_create("fields");
    tcase_add_test(t, test_absent_optional_fields_take_the_documented_defaults);
    tcase_add_test(t, test_field_types_are_checked_as_documented);
    tcase_add_test(t, test_unknown_fields_are_ignored_at_every_level);
    tcase_add_test(t, test_fields_in_any_order_decode_and_forward_the_same);
    tcase_add_test(t, test_upload_and_fetch_data_carry_u8_chunks_and_nothing_else_does);
    tcase_add_test(t, test_missing_required_fields_are_named_with_their_path);
    tcase_add_test(t, test_a_type_carries_only_its_own_tensors);
    tcase_add_test(t, test_latent_shape_and_context_limits_hold_with_and_without_a_model);
    tcase_add_test(t, test_a_group_round_trips_and_every_bad_group_is_refused);
    tcase_add_test(t, test_a_prewarm_key_takes_defaults_and_needs_its_hash_shape_and_text_len);
    tcase_add_test(t, test_a_prewarm_of_too_many_keys_an_unknown_solver_or_a_bad_shape_is_refused_and_sde_on_a_grid_is_taken);
    suite_add_tcase(s, t);
    t = tcase_create("errors and interop");
    tcase_add_test(t, test_an_error_found_while_decoding_echoes_the_id_read_before_it);
    tcase_add_test(t, test_too_large_is_a_limit_exceeded_and_malformed_bytes_that_are_not_a_message);
    tcase_add_test(t, test_sha256_is_64_hex_digits_in_either_case);
    tcase_add_test(t, test_strings_sent_are_valid_utf8_with_invalid_bytes_replaced);
    tcase_add_test(t, test_the_writer_writes_what_msgpack_c_writes);
    tcase_add_test(t, test_msgpack_c_reads_an_encoded_status_reply);
    tcase_add_test(t, test_a_gen_decodes_and_validates_without_touching_the_heap);
    tcase_add_test(t, test_a_forwarded_gen_is_the_request_with_new_id_and_version_and_without_unknown_fields);
    tcase_add_test(t, test_skipping_a_value_lands_where_the_tokenizer_ends_it_and_its_token_starts);
    tcase_add_test(t, test_a_prompt_gen_round_trips_and_its_text_rules_hold);
    tcase_add_test(t, test_a_result_of_nan_or_inf_and_log_probs_at_a_float_zero_eta_are_refused);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return ts_run(suite());
}
