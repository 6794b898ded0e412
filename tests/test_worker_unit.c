/* test_worker_unit.c -- the pure pieces of reel-worker: command line, event
 * aggregation into EVENTS maps, REQUEST checking, sha256 and reading the
 * weights a SYNC carries. The Makefile links the worker's objects into this
 * test, all but wrk_main.o (main). The socket loop itself is covered by the
 * process-level cluster tests (tests/cli_cluster.sh). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdarg.h>
#include <unistd.h>
#include "worker/wrk.h"
#include "worker/wrk_events.h"
#include "worker/wrk_opts.h"
#include "worker/wrk_pipe.h"
#include "worker/wrk_request.h"
#include "worker/wrk_sync.h"

/* ---- command line ---------------------------------------------------------- */

static int parse(wrk_opts_t *o, char *err, ...) {
    char *argv[32] = { "reel-worker" };
    int argc = 1;
    va_list ap;
    va_start(ap, err);
    for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 31;) argv[argc++] = a;
    va_end(ap);
    return wrk_opts_parse(argc, argv, o, err, 256);
}

START_TEST(test_options_default_to_the_documented_values) {
    wrk_opts_t o;
    char err[256];
    ck_assert_int_eq(parse(&o, err, "--name", "w0", "--weights", "w.st", NULL), 0);
    ck_assert_str_eq(o.broker, "tcp://127.0.0.1:5556");
    ck_assert_int_eq(o.streams, 2);
    ck_assert_int_eq(o.max_inflight, 8);
    ck_assert_uint_eq(o.weights_version, 1);
    ck_assert_uint_eq(o.budget, 0);
    ck_assert_int_eq(o.policy, CAP_POLICY_EVICT);
    ck_assert_int_eq(o.backend, KERN_BACKEND_CPU);
    ck_assert_int_eq(o.warmup, 2);
    ck_assert_int_eq(o.heartbeat_ms, 1000);
    ck_assert_int_eq(o.liveness, 3);
    ck_assert_int_eq(o.events_ms, 200);
    ck_assert_int_eq(parse(&o, err, "--name", "w0", "--weights", "w.st", "--streams", "3", "--budget", "512M",
                           "--policy", "inplace", NULL), 0);
    ck_assert_int_eq(o.max_inflight, 12);
    ck_assert_uint_eq(o.budget, (size_t)512 << 20);
    ck_assert_int_eq(o.policy, CAP_POLICY_INPLACE);
}
END_TEST

START_TEST(test_unknown_flags_and_missing_required_options_are_usage_errors) {
    wrk_opts_t o;
    char err[256];
    ck_assert_int_eq(parse(&o, err, "--name", "w0", "--weights", "w.st", "--frobnicate", NULL), -1);
    ck_assert_ptr_nonnull(strstr(err, "--frobnicate"));
    ck_assert_int_eq(parse(&o, err, "--weights", "w.st", NULL), -1);
    ck_assert_ptr_nonnull(strstr(err, "--name"));
    ck_assert_int_eq(parse(&o, err, "--name", "w0", NULL), -1);
    ck_assert_ptr_nonnull(strstr(err, "--weights"));
    ck_assert_int_eq(parse(&o, err, "--name", "w 0", "--weights", "w.st", NULL), -1);
    ck_assert_int_eq(parse(&o, err, "--name", "w0", "--weights", "w.st", "--streams", "0", NULL), -1);
    ck_assert_int_eq(parse(&o, err, "--name", "w0", "--weights", "w.st", "--policy", "lazy", NULL), -1);
    ck_assert_int_eq(parse(&o, err, "--name", "w0", "--weights", "w.st", "--backend", "tpu", NULL), -1);
    ck_assert_int_eq(parse(&o, err, "--name", "w0", "--weights", "w.st", "--budget", "12Q", NULL), -1);
    ck_assert_int_eq(parse(&o, err, "--name", "w0", "--weights", "w.st", "--streams", NULL), -1);
}
END_TEST

START_TEST(test_byte_counts_take_binary_suffixes_and_reject_junk) {
    size_t b = 7;
    ck_assert_int_eq(wrk_parse_bytes("0", &b), 0);
    ck_assert_uint_eq(b, 0);
    ck_assert_int_eq(wrk_parse_bytes("1048576", &b), 0);
    ck_assert_uint_eq(b, 1048576);
    ck_assert_int_eq(wrk_parse_bytes("4k", &b), 0);
    ck_assert_uint_eq(b, 4096);
    ck_assert_int_eq(wrk_parse_bytes("512M", &b), 0);
    ck_assert_uint_eq(b, (size_t)512 << 20);
    ck_assert_int_eq(wrk_parse_bytes("2GiB", &b), 0);
    ck_assert_uint_eq(b, (size_t)2 << 30);
    ck_assert_int_eq(wrk_parse_bytes("3GB", &b), 0);
    ck_assert_uint_eq(b, (size_t)3 << 30);
    b = 7;
    ck_assert_int_eq(wrk_parse_bytes("", &b), -1);
    ck_assert_int_eq(wrk_parse_bytes("-1", &b), -1);
    ck_assert_int_eq(wrk_parse_bytes("1.5G", &b), -1);
    ck_assert_int_eq(wrk_parse_bytes("G", &b), -1);
    ck_assert_int_eq(wrk_parse_bytes("99999999999999999999", &b), -1);
    ck_assert_int_eq(wrk_parse_bytes("17179869184G", &b), -1);   /* 2^34 GiB overflows */
    ck_assert_uint_eq(b, 7);
}
END_TEST

/* ---- events ----------------------------------------------------------------- */

static cap_event_t ev_of(cap_event_kind_t kind, int reason, uint64_t hash, int stream) {
    cap_event_t e;
    memset(&e, 0, sizeof e);
    e.kind = kind;
    e.reason = reason;
    e.key_hash = hash;
    e.key_text = hash == 0xa ? "reel-key/1 model=tinydit:tiny A" : "reel-key/1 model=tinydit:tiny B";
    e.stream = stream;
    return e;
}

static void decline(wrk_events_t *b, uint64_t hash, cap_reason_t r) {
    cap_event_t e = ev_of(CAP_EV_DECLINE, r, hash, 0);
    wrk_events_on_cache(b, &e);
}

static const char *kind_at(const wire_val_t *arr, size_t i) { return wv_get_str(wv_at(arr, i), "kind"); }
static uint64_t u64_at(const wire_val_t *arr, size_t i, const char *k) {
    uint64_t v = 0;
    ck_assert(wv_get_u64(wv_at(arr, i), k, &v));
    return v;
}

START_TEST(test_repeated_declines_of_a_key_and_reason_become_one_event_with_a_count) {
    wrk_events_t *b = wrk_events_new(64);
    for (int i = 0; i < 5; i++) decline(b, 0xa, CAP_DECLINE_WARMING_UP);
    decline(b, 0xb, CAP_DECLINE_WARMING_UP);        /* another key in between does not split */
    decline(b, 0xa, CAP_DECLINE_WARMING_UP);
    decline(b, 0xa, CAP_DECLINE_PINNED_INPUT_MOVED); /* another reason is its own entry */
    ck_assert(wrk_events_pending(b));
    uint64_t dropped = 9;
    wire_val_t *arr = wrk_events_take(b, 100, &dropped);
    ck_assert_ptr_nonnull(arr);
    ck_assert_uint_eq(dropped, 0);
    ck_assert_uint_eq(wv_len(arr), 3);
    ck_assert_str_eq(kind_at(arr, 0), "decline");
    ck_assert_str_eq(wv_get_str(wv_at(arr, 0), "reason"), "warming_up");
    ck_assert_str_eq(wv_get_str(wv_at(arr, 0), "key_hash"), "000000000000000a");
    ck_assert_str_eq(wv_get_str(wv_at(arr, 0), "key"), "reel-key/1 model=tinydit:tiny A");
    ck_assert_uint_eq(u64_at(arr, 0, "count"), 6);
    ck_assert_str_eq(wv_get_str(wv_at(arr, 1), "key_hash"), "000000000000000b");
    ck_assert_uint_eq(u64_at(arr, 1, "count"), 1);
    ck_assert_str_eq(wv_get_str(wv_at(arr, 2), "reason"), "pinned_input_moved");
    ck_assert_uint_eq(u64_at(arr, 2, "count"), 1);
    wv_free(&arr);
    ck_assert(!wrk_events_pending(b));
    ck_assert_ptr_null(wrk_events_take(b, 100, NULL));
    wrk_events_destroy(&b);
    ck_assert_ptr_null(b);
}
END_TEST

START_TEST(test_a_capture_between_declines_keeps_the_key_lifecycle_in_order) {
    wrk_events_t *b = wrk_events_new(64);
    decline(b, 0xa, CAP_DECLINE_WARMING_UP);
    decline(b, 0xa, CAP_DECLINE_WARMING_UP);
    cap_event_t c = ev_of(CAP_EV_CAPTURE, 0, 0xa, 0);
    c.bytes = 4096;
    c.nodes = 321;
    c.seconds = 0.25;
    wrk_events_on_cache(b, &c);
    decline(b, 0xa, CAP_DECLINE_WARMING_UP);
    cap_event_t ev = ev_of(CAP_EV_EVICT, CAP_EVICT_WEIGHT_SYNC, 0xa, 0);
    ev.component = "transformer";
    ev.from_version = 1;
    ev.to_version = 2;
    ev.bytes = 4096;
    wrk_events_on_cache(b, &ev);
    wire_val_t *arr = wrk_events_take(b, 100, NULL);
    ck_assert_uint_eq(wv_len(arr), 4);
    ck_assert_str_eq(kind_at(arr, 0), "decline");
    ck_assert_uint_eq(u64_at(arr, 0, "count"), 2);
    ck_assert_str_eq(kind_at(arr, 1), "capture");
    ck_assert_uint_eq(u64_at(arr, 1, "bytes"), 4096);
    ck_assert_uint_eq(u64_at(arr, 1, "nodes"), 321);
    double s = 0;
    ck_assert(wv_get_f64(wv_at(arr, 1), "seconds", &s));
    ck_assert(s == 0.25);
    ck_assert_str_eq(kind_at(arr, 2), "decline");
    ck_assert_uint_eq(u64_at(arr, 2, "count"), 1);
    ck_assert_str_eq(kind_at(arr, 3), "evict");
    ck_assert_str_eq(wv_get_str(wv_at(arr, 3), "reason"), "weight_sync");
    ck_assert_str_eq(wv_get_str(wv_at(arr, 3), "component"), "transformer");
    ck_assert_uint_eq(u64_at(arr, 3, "from"), 1);
    ck_assert_uint_eq(u64_at(arr, 3, "to"), 2);
    wv_free(&arr);
    wrk_events_destroy(&b);
}
END_TEST

START_TEST(test_replays_are_counted_per_key_and_stream) {
    wrk_events_t *b = wrk_events_new(64);
    for (int i = 0; i < 7; i++) wrk_events_replay(b, 0xa, 0);
    for (int i = 0; i < 3; i++) wrk_events_replay(b, 0xa, 1);
    wrk_events_replay(b, 0xb, 0);
    wire_val_t *arr = wrk_events_take(b, 100, NULL);
    ck_assert_uint_eq(wv_len(arr), 3);
    for (size_t i = 0; i < 3; i++) ck_assert_str_eq(kind_at(arr, i), "replays");
    int64_t s0 = -1, s1 = -1;
    ck_assert(wv_get_i64(wv_at(arr, 0), "stream", &s0));
    ck_assert(wv_get_i64(wv_at(arr, 1), "stream", &s1));
    ck_assert_int_eq(s0, 0);
    ck_assert_int_eq(s1, 1);
    ck_assert_uint_eq(u64_at(arr, 0, "count"), 7);
    ck_assert_uint_eq(u64_at(arr, 1, "count"), 3);
    ck_assert_uint_eq(u64_at(arr, 2, "count"), 1);
    wv_free(&arr);
    /* counters restart after a take */
    wrk_events_replay(b, 0xa, 0);
    arr = wrk_events_take(b, 100, NULL);
    ck_assert_uint_eq(wv_len(arr), 1);
    ck_assert_uint_eq(u64_at(arr, 0, "count"), 1);
    wv_free(&arr);
    wrk_events_destroy(&b);
}
END_TEST

START_TEST(test_events_report_the_worker_stream_numbers_not_the_cache_order) {
    wrk_events_t *b = wrk_events_new(64);
    /* The cache met worker stream 1 first (its number 0), then stream 0. */
    wrk_events_set_thread_stream(1);
    cap_event_t c = ev_of(CAP_EV_CAPTURE, 0, 0xa, 0);
    wrk_events_on_cache(b, &c);
    wrk_events_set_thread_stream(0);
    c = ev_of(CAP_EV_CAPTURE, 0, 0xb, 1);
    wrk_events_on_cache(b, &c);
    /* An eviction delivered on another thread is translated too. */
    wrk_events_set_thread_stream(-1);
    cap_event_t e = ev_of(CAP_EV_EVICT, CAP_EVICT_LRU, 0xa, 0);
    wrk_events_on_cache(b, &e);
    wire_val_t *arr = wrk_events_take(b, 100, NULL);
    ck_assert_uint_eq(wv_len(arr), 3);
    int64_t s[3];
    for (size_t i = 0; i < 3; i++) ck_assert(wv_get_i64(wv_at(arr, i), "stream", &s[i]));
    ck_assert_int_eq(s[0], 1);
    ck_assert_int_eq(s[1], 0);
    ck_assert_int_eq(s[2], 1);
    ck_assert_str_eq(wv_get_str(wv_at(arr, 2), "reason"), "lru");
    ck_assert_ptr_null(wv_get(wv_at(arr, 2), "component"));
    wv_free(&arr);
    wrk_events_destroy(&b);
}
END_TEST

START_TEST(test_a_full_event_buffer_drops_and_counts_instead_of_growing) {
    wrk_events_t *b = wrk_events_new(4);
    for (uint64_t h = 1; h <= 6; h++) decline(b, h, CAP_DECLINE_WARMING_UP);
    decline(b, 1, CAP_DECLINE_WARMING_UP); /* merges: costs no room */
    uint64_t dropped = 0;
    wire_val_t *arr = wrk_events_take(b, 3, &dropped);
    ck_assert_uint_eq(dropped, 2);
    ck_assert_uint_eq(wv_len(arr), 3);            /* at most `max` per message */
    ck_assert_uint_eq(u64_at(arr, 0, "count"), 2);
    wv_free(&arr);
    arr = wrk_events_take(b, 3, &dropped);
    ck_assert_uint_eq(dropped, 0);
    ck_assert_uint_eq(wv_len(arr), 1);
    ck_assert_str_eq(wv_get_str(wv_at(arr, 0), "key_hash"), "0000000000000004");
    wv_free(&arr);
    wrk_events_destroy(&b);
}
END_TEST

START_TEST(test_an_events_batch_encodes_within_the_wire_limits) {
    wrk_events_t *b = wrk_events_new(4096);
    char key[CAP_KEY_TEXT_MAX];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = 0;
    for (uint64_t h = 1; h <= 300; h++) {
        cap_event_t c = ev_of(CAP_EV_CAPTURE, 0, h, 0);
        c.key_text = key; /* the longest key text there can be */
        wrk_events_on_cache(b, &c);
    }
    wire_val_t *arr = wrk_events_take(b, WRK_EVENTS_PER_MSG, NULL);
    wire_val_t *h = wire_hdr("EVENTS", 0);
    ck_assert_int_eq(wv_set(h, "events", arr), 0);
    size_t len = 0;
    unsigned char *bytes = wire_encode_header(h, &len);
    ck_assert_ptr_nonnull(bytes);
    ck_assert_uint_le(len, WIRE_MAX_HEADER);
    wire_err_t err;
    wire_val_t *back = wire_decode_header(bytes, len, &err);
    ck_assert_msg(back != NULL, "%s: %s", err.code, err.message);
    ck_assert_uint_eq(wv_len(wv_get(back, "events")), WRK_EVENTS_PER_MSG);
    wv_free(&back);
    free(bytes);
    wv_free(&h);
    wrk_events_destroy(&b);
}
END_TEST

/* ---- REQUEST checking ---------------------------------------------------------- */

static tdit_config_t tiny;
static float ctx_buf[5 * 32], unc_buf[5 * 32], lat_buf[4 * 2 * 8 * 8];

static void add_tensor(wire_msg_t *m, const char *name, kern_dtype_t dt, int ndim, const int64_t *shape, const void *data) {
    wire_tensor_t *t = &m->t[m->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    size_t n = kern_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t->data = data;
    t->bytes = n;
}

/* A good CFG request for the tiny model: latent [4,2,8,8], context [5,32]. */
static void good_request(wire_msg_t *m) {
    memset(m, 0, sizeof *m);
    m->hdr = wire_hdr("REQUEST", 42);
    m->type = "REQUEST";
    m->id = 42;
    wv_set(m->hdr, "model", wv_str("tiny"));
    wv_set(m->hdr, "version", wv_u64(1));
    wv_set(m->hdr, "steps", wv_u64(6));
    wv_set(m->hdr, "shift", wv_f64(3.0));
    wv_set(m->hdr, "cfg", wv_f64(5.0));
    wv_set(m->hdr, "seed", wv_u64(11));
    wv_set(m->hdr, "progress", wv_bool(true));
    wire_val_t *ls = wv_arr();
    const uint64_t l[4] = { 4, 2, 8, 8 };
    for (int i = 0; i < 4; i++) wv_push(ls, wv_u64(l[i]));
    wv_set(m->hdr, "latent_shape", ls);
    const int64_t cs[2] = { 5, 32 }, lsh[4] = { 4, 2, 8, 8 };
    for (size_t i = 0; i < 5 * 32; i++) ctx_buf[i] = (float)i, unc_buf[i] = -(float)i;
    add_tensor(m, "context", KERN_F32, 2, cs, ctx_buf);
    add_tensor(m, "uncond", KERN_F32, 2, cs, unc_buf);
    add_tensor(m, "latent", KERN_F32, 4, lsh, lat_buf);
}

static void set_latent_shape(wire_msg_t *m, uint64_t c, uint64_t f, uint64_t h, uint64_t w) {
    wire_val_t *ls = wv_arr();
    wv_push(ls, wv_u64(c));
    wv_push(ls, wv_u64(f));
    wv_push(ls, wv_u64(h));
    wv_push(ls, wv_u64(w));
    wv_set(m->hdr, "latent_shape", ls);
}

static void drop_tensor(wire_msg_t *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->t[i].name, name)) {
            memmove(&m->t[i], &m->t[i + 1], (size_t)(m->n_tensors - i - 1) * sizeof m->t[0]);
            m->n_tensors--;
            return;
        }
}

/* Runs the check, expecting a bad_request whose message contains `want`. */
static void expect_refused(wire_msg_t *m, uint64_t applied, const char *want) {
    wrk_job_t *j = (wrk_job_t *)1;
    wire_err_t err;
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(wrk_job_from_request(m, &tiny, applied, &j, &err), -1);
    ck_assert_ptr_null(j);
    ck_assert_str_eq(err.code, "bad_request");
    ck_assert_msg(strstr(err.message, want) != NULL, "message '%s' lacks '%s'", err.message, want);
    wv_free(&m->hdr);
}

static void setup_tiny(void) { ck_assert_int_eq(tdit_config_builtin("tiny", &tiny), 0); }

START_TEST(test_a_good_request_becomes_a_job_with_copies_of_its_tensors) {
    wire_msg_t m;
    good_request(&m);
    wrk_job_t *j = NULL;
    wire_err_t err;
    ck_assert_int_eq(wrk_job_from_request(&m, &tiny, 1, &j, &err), 0);
    ck_assert_uint_eq(j->id, 42);
    ck_assert_int_eq(j->loop.steps, 6);
    ck_assert(j->loop.shift == 3.0);
    ck_assert(j->loop.guidance == 5.0f);
    ck_assert(!j->loop.sde);
    ck_assert_uint_eq(j->loop.seed, 11);
    ck_assert(j->progress);
    ck_assert(j->shape.cfg);
    ck_assert_int_eq(j->shape.frames, 2);
    ck_assert_int_eq(j->shape.height, 8);
    ck_assert_int_eq(j->shape.width, 8);
    ck_assert_int_eq(j->shape.text_len, 5);
    ck_assert_uint_eq(j->n_latent, 4 * 2 * 8 * 8);
    ck_assert_ptr_ne(j->context, ctx_buf); /* copies: the frames go away */
    ck_assert_mem_eq(j->context, ctx_buf, sizeof ctx_buf);
    ck_assert_mem_eq(j->uncond, unc_buf, sizeof unc_buf);
    ck_assert_ptr_nonnull(j->latent);
    wrk_job_free(&j);
    ck_assert_ptr_null(j);
    wv_free(&m.hdr);

    /* Without uncond: no CFG; without latent: drawn from the seed. */
    good_request(&m);
    drop_tensor(&m, "uncond");
    drop_tensor(&m, "latent");
    ck_assert_int_eq(wrk_job_from_request(&m, &tiny, 1, &j, &err), 0);
    ck_assert(!j->shape.cfg);
    ck_assert_ptr_null(j->uncond);
    ck_assert_ptr_null(j->latent);
    wrk_job_free(&j);
    wv_free(&m.hdr);
}
END_TEST

START_TEST(test_a_latent_with_the_wrong_channel_count_is_refused) {
    wire_msg_t m;
    good_request(&m);
    drop_tensor(&m, "latent");
    set_latent_shape(&m, 3, 2, 8, 8);
    expect_refused(&m, 1, "latent has 3 channels, model tiny expects 4");
}
END_TEST

START_TEST(test_a_context_of_the_wrong_text_width_is_refused) {
    wire_msg_t m;
    good_request(&m);
    drop_tensor(&m, "uncond");
    const int64_t cs[2] = { 5, 16 };
    drop_tensor(&m, "context");
    add_tensor(&m, "context", KERN_F32, 2, cs, ctx_buf);
    expect_refused(&m, 1, "context width 16, model tiny expects text_dim 32");
}
END_TEST

START_TEST(test_steps_outside_1_to_10000_or_missing_are_refused) {
    wire_msg_t m;
    good_request(&m);
    wv_set(m.hdr, "steps", wv_u64(0));
    expect_refused(&m, 1, "'steps' must be in 1..10000 (got 0)");
    good_request(&m);
    wv_set(m.hdr, "steps", wv_u64(10001));
    expect_refused(&m, 1, "'steps' must be in 1..10000 (got 10001)");
    good_request(&m);
    wv_set(m.hdr, "steps", wv_i64(-3));
    expect_refused(&m, 1, "'steps' must be a non-negative integer");
    good_request(&m);
    wv_set(m.hdr, "steps", wv_str("six"));
    expect_refused(&m, 1, "'steps' must be a non-negative integer");
    good_request(&m);
    wire_val_t *h = wire_hdr("REQUEST", 42); /* rebuilt without "steps" */
    for (size_t i = 0; i < m.hdr->as.c.n; i++)
        if (strcmp(m.hdr->as.c.k[i], "steps") && strcmp(m.hdr->as.c.k[i], "type") && strcmp(m.hdr->as.c.k[i], "id")) {
            wire_val_t *v = m.hdr->as.c.v[i];
            m.hdr->as.c.v[i] = wv_u64(0);
            wv_set(h, m.hdr->as.c.k[i], v);
        }
    wv_free(&m.hdr);
    m.hdr = h;
    expect_refused(&m, 1, "missing 'steps'");
}
END_TEST

START_TEST(test_a_request_without_context_is_refused) {
    wire_msg_t m;
    good_request(&m);
    drop_tensor(&m, "context");
    expect_refused(&m, 1, "missing tensor 'context'");
}
END_TEST

START_TEST(test_tensors_of_the_wrong_dtype_or_shape_are_refused) {
    wire_msg_t m;
    const int64_t cs[2] = { 5, 32 }, cs4[2] = { 4, 32 }, lbad[4] = { 4, 2, 8, 6 };
    static uint16_t half[5 * 32];
    good_request(&m);
    drop_tensor(&m, "context");
    add_tensor(&m, "context", KERN_BF16, 2, cs, half);
    expect_refused(&m, 1, "tensor 'context' is BF16[5,32], expected F32[L,32]");
    good_request(&m);
    drop_tensor(&m, "uncond");
    add_tensor(&m, "uncond", KERN_F32, 2, cs4, unc_buf);
    expect_refused(&m, 1, "tensor 'uncond' is F32[4,32], expected the context's F32[5,32]");
    good_request(&m);
    drop_tensor(&m, "latent");
    add_tensor(&m, "latent", KERN_F32, 4, lbad, lat_buf);
    expect_refused(&m, 1, "tensor 'latent' is F32[4,2,8,6], expected F32[4,2,8,8]");
    good_request(&m);
    drop_tensor(&m, "latent");
    set_latent_shape(&m, 4, 2, 7, 8);
    expect_refused(&m, 1, "height, width even");
    good_request(&m);
    wv_set(m.hdr, "latent_shape", wv_u64(4));
    expect_refused(&m, 1, "'latent_shape' must be an array [C,F,H,W]");
}
END_TEST

START_TEST(test_another_model_or_a_newer_version_is_refused) {
    wire_msg_t m;
    good_request(&m);
    wv_set(m.hdr, "model", wv_str("small"));
    expect_refused(&m, 1, "model 'small' is not served here");
    good_request(&m);
    wv_set(m.hdr, "version", wv_u64(3));
    expect_refused(&m, 2, "worker at v2, request needs v3");
    good_request(&m);
    wv_set(m.hdr, "shift", wv_f64(-1));
    expect_refused(&m, 1, "'shift' must be > 0");
    good_request(&m);
    wv_set(m.hdr, "cfg", wv_str("high"));
    expect_refused(&m, 1, "'cfg' must be a finite number");
}
END_TEST

/* ---- sha256 and SYNC weights ---------------------------------------------------- */

#define SHA_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define SHA_EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

START_TEST(test_sha256_of_abc_matches_the_fips_180_2_digest) {
    char hex[65];
    wrk_sha256_hex("abc", 3, hex);
    ck_assert_str_eq(hex, SHA_ABC);
    wrk_sha256_hex("", 0, hex);
    ck_assert_str_eq(hex, SHA_EMPTY);
    char path[] = "/tmp/reel-test-sha-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "abc", 3), 3);
    ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
    ck_assert_int_eq(wrk_sha256_fd(fd, hex), 0);
    ck_assert_str_eq(hex, SHA_ABC);
    close(fd);
    unlink(path);
    ck_assert(wrk_sha256_valid(SHA_ABC));
    ck_assert(wrk_sha256_valid("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"));
    ck_assert(!wrk_sha256_valid("abc"));
    ck_assert(!wrk_sha256_valid("zz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    ck_assert(!wrk_sha256_valid(NULL));
}
END_TEST

static void sync_msg(wire_msg_t *m, const char *component, const char *sha, const char *path) {
    memset(m, 0, sizeof *m);
    m->hdr = wire_hdr("SYNC", 9);
    m->type = "SYNC";
    m->id = 9;
    if (component) wv_set(m->hdr, "component", wv_str(component));
    wv_set(m->hdr, "version", wv_u64(2));
    if (sha) wv_set(m->hdr, "sha256", wv_str(sha));
    if (path) wv_set(m->hdr, "path", wv_str(path));
}

START_TEST(test_sync_weights_by_path_are_hashed_over_the_file_bytes) {
    char path[] = "/tmp/reel-test-sync-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    st_writer_t *w = st_writer_new();
    const int64_t sh[1] = { 3 };
    const float x[3] = { 1, 2, 3 };
    ck_assert_int_eq(st_writer_add_f32(w, "x", 1, sh, x), 0);
    ck_assert_int_eq(st_writer_save(w, path), 0);
    st_writer_destroy(&w);
    char want[65], hex[65], err[256];
    fd = open(path, O_RDONLY);
    ck_assert_int_eq(wrk_sha256_fd(fd, want), 0);
    close(fd);

    wire_msg_t m;
    sync_msg(&m, "transformer", SHA_ABC, path);
    st_file_t *f = NULL;
    ck_assert_int_eq(wrk_sync_read(&m, &tiny, &f, hex, err, sizeof err), 0);
    ck_assert_str_eq(hex, want);
    ck_assert_ptr_nonnull(st_find(f, "x"));
    st_close(&f);
    wv_free(&m.hdr);
    unlink(path);

    sync_msg(&m, "transformer", SHA_ABC, "/nonexistent/w.safetensors");
    ck_assert_int_eq(wrk_sync_read(&m, &tiny, &f, hex, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "cannot open /nonexistent/w.safetensors"));
    wv_free(&m.hdr);
}
END_TEST

START_TEST(test_inline_sync_weights_are_hashed_over_the_frames_in_order) {
    static const float a[4] = { 1, 2, 3, 4 };
    static const uint16_t b[2] = { 0x3f80, 0x4000 };
    const int64_t sa[2] = { 2, 2 }, sb[1] = { 2 };
    wire_msg_t m;
    sync_msg(&m, "transformer", SHA_ABC, NULL);
    add_tensor(&m, "blocks.0.a", KERN_F32, 2, sa, a);
    add_tensor(&m, "blocks.0.b", KERN_BF16, 1, sb, b);
    unsigned char cat[sizeof a + sizeof b];
    memcpy(cat, a, sizeof a);
    memcpy(cat + sizeof a, b, sizeof b);
    char want[65], hex[65], err[256];
    wrk_sha256_hex(cat, sizeof cat, want);
    st_file_t *f = NULL;
    ck_assert_int_eq(wrk_sync_read(&m, &tiny, &f, hex, err, sizeof err), 0);
    ck_assert_str_eq(hex, want);
    const st_tensor_t *t = st_find(f, "blocks.0.b");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->dtype, KERN_BF16);
    ck_assert_mem_eq(t->data, b, sizeof b);
    ck_assert_str_eq(st_meta(f, "config"), "tiny");
    tdit_config_t c;
    ck_assert_int_eq(tdit_config_from_meta(f, &c), 0); /* what tdit_model_reload reads */
    ck_assert_int_eq(c.dim, tiny.dim);
    st_close(&f);
    wv_free(&m.hdr);
}
END_TEST

START_TEST(test_a_sync_with_bad_fields_is_refused_with_a_reason) {
    wire_msg_t m;
    st_file_t *f = NULL;
    char hex[65], err[256];
    sync_msg(&m, "vae", SHA_ABC, "/tmp/x");
    ck_assert_int_eq(wrk_sync_read(&m, &tiny, &f, hex, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "unknown component 'vae'"));
    wv_free(&m.hdr);
    sync_msg(&m, "transformer", "abc", "/tmp/x");
    ck_assert_int_eq(wrk_sync_read(&m, &tiny, &f, hex, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "64 hex digits"));
    wv_free(&m.hdr);
    sync_msg(&m, "transformer", SHA_ABC, NULL);
    ck_assert_int_eq(wrk_sync_read(&m, &tiny, &f, hex, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "neither"));
    wv_free(&m.hdr);
    static const float a[1] = { 1 };
    const int64_t sa[1] = { 1 };
    sync_msg(&m, "transformer", SHA_ABC, "/tmp/x");
    add_tensor(&m, "a", KERN_F32, 1, sa, a);
    ck_assert_int_eq(wrk_sync_read(&m, &tiny, &f, hex, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "both"));
    ck_assert_ptr_null(f);
    wv_free(&m.hdr);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("worker_unit");
    TCase *t = tcase_create("opts");
    tcase_add_test(t, test_options_default_to_the_documented_values);
    tcase_add_test(t, test_unknown_flags_and_missing_required_options_are_usage_errors);
    tcase_add_test(t, test_byte_counts_take_binary_suffixes_and_reject_junk);
    suite_add_tcase(s, t);
    t = tcase_create("events");
    tcase_add_test(t, test_repeated_declines_of_a_key_and_reason_become_one_event_with_a_count);
    tcase_add_test(t, test_a_capture_between_declines_keeps_the_key_lifecycle_in_order);
    tcase_add_test(t, test_replays_are_counted_per_key_and_stream);
    tcase_add_test(t, test_events_report_the_worker_stream_numbers_not_the_cache_order);
    tcase_add_test(t, test_a_full_event_buffer_drops_and_counts_instead_of_growing);
    tcase_add_test(t, test_an_events_batch_encodes_within_the_wire_limits);
    suite_add_tcase(s, t);
    t = tcase_create("request");
    tcase_add_checked_fixture(t, setup_tiny, NULL);
    tcase_add_test(t, test_a_good_request_becomes_a_job_with_copies_of_its_tensors);
    tcase_add_test(t, test_a_latent_with_the_wrong_channel_count_is_refused);
    tcase_add_test(t, test_a_context_of_the_wrong_text_width_is_refused);
    tcase_add_test(t, test_steps_outside_1_to_10000_or_missing_are_refused);
    tcase_add_test(t, test_a_request_without_context_is_refused);
    tcase_add_test(t, test_tensors_of_the_wrong_dtype_or_shape_are_refused);
    tcase_add_test(t, test_another_model_or_a_newer_version_is_refused);
    suite_add_tcase(s, t);
    t = tcase_create("sync");
    tcase_add_checked_fixture(t, setup_tiny, NULL);
    tcase_add_test(t, test_sha256_of_abc_matches_the_fips_180_2_digest);
    tcase_add_test(t, test_sync_weights_by_path_are_hashed_over_the_file_bytes);
    tcase_add_test(t, test_inline_sync_weights_are_hashed_over_the_frames_in_order);
    tcase_add_test(t, test_a_sync_with_bad_fields_is_refused_with_a_reason);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
