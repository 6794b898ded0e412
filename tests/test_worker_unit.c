/* test_worker_unit.c -- the pure pieces of reel-worker: command line, event
 * aggregation into EVENTS entries (sent through the codec and read back),
 * REQUEST checking against the worker's model, and reading the weights a
 * SYNC carries. The Makefile links the worker's objects into this
 * test, all but wrk_main.o (main). The socket loop itself is covered by the
 * process-level cluster tests (tests/cli_cluster.sh). */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdarg.h>
#include <unistd.h>
#include "base/error.h"
#include "base/sha256.h"
#include "worker/wrk.h"
#include "worker/wrk_events.h"
#include "worker/wrk_fetch.h"
#include "worker/wrk_opts.h"
#include "worker/wrk_pipe.h"
#include "worker/wrk_request.h"
#include "worker/wrk_sync.h"
#include "worker/wrk_weights.h"
#include "model/t2v.h"
#include "model/wan_ckpt.h"
#include "base/parse.h"
#include "tests/support.h"

/* ---- command line ---------------------------------------------------------- */

static int parse(wrk_opts_t *o, ...) {
    char *argv[32] = { "reel-worker" };
    int argc = 1;
    va_list ap;
    va_start(ap, o);
    for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 31;) argv[argc++] = a;
    va_end(ap);
    return wrk_opts_parse(argc, argv, o);
}

START_TEST(test_options_default_to_the_documented_values) {
    wrk_opts_t o;
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", NULL), 0);
    ck_assert_str_eq(o.broker, "tcp://127.0.0.1:5556");
    ck_assert_int_eq(o.streams, 2);
    ck_assert_int_eq(o.max_batch, 1); /* the CPU's: batching asked for */
    ck_assert(!o.batch_exact);
    ck_assert(!o.batch_always);
    ck_assert_int_eq(o.blas_threads, 0);
    ck_assert_int_eq(o.threads, 0);
    ck_assert_int_eq(o.max_inflight, 8); /* streams x max(4, max_batch) */
    ck_assert_uint_eq(o.weights_version, 1);
    ck_assert_uint_eq(o.budget, 0);
    ck_assert_int_eq(o.policy, CAP_POLICY_EVICT);
    ck_assert_int_eq(o.backend, KERN_BACKEND_CPU);
    ck_assert_int_eq(o.warmup, 2);
    ck_assert_int_eq(o.heartbeat_ms, 1000);
    ck_assert_int_eq(o.liveness, 3);
    ck_assert_int_eq(o.events_ms, 200);
    ck_assert_int_eq(o.max_tokens, 65536);
    ck_assert_int_eq(o.max_held_mb, -1); /* the worker's, from its model and max_inflight */
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--max-held-mb", "0", NULL), 0);
    ck_assert_int_eq(o.max_held_mb, 0);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--max-held-mb", "-1", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--max-held-mb", "2G", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--streams", "3", "--budget", "512M",
                      "--policy", "inplace", "--max-tokens", "0", "--max-held-mb", "640", NULL), 0);
    ck_assert_int_eq(o.max_held_mb, 640);
    ck_assert_int_eq(o.max_tokens, 0);
    ck_assert_int_eq(o.max_inflight, 12);
    ck_assert_uint_eq(o.budget, (size_t)512 << 20);
    ck_assert_int_eq(o.policy, CAP_POLICY_INPLACE);
    /* batching off: 4 per stream; exact sizes; bounds */
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--streams", "3", "--max-batch", "1",
                           "--batch-sizes", "exact", NULL), 0);
    ck_assert_int_eq(o.max_batch, 1);
    ck_assert(o.batch_exact);
    ck_assert_int_eq(o.max_inflight, 12);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--max-batch", "16", NULL), 0);
    ck_assert_int_eq(o.max_inflight, 32);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--backend", "cuda", NULL), 0);
    ck_assert_int_eq(o.max_batch, 8); /* CUDA batches by default */
    ck_assert_int_eq(o.max_inflight, 16);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--max-batch", "0", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--max-batch", "65", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--batch-sizes", "pow2", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--batching", "always", "--blas-threads", "-1",
                           NULL), 0);
    ck_assert(o.batch_always);
    ck_assert_int_eq(o.blas_threads, -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--batching", "never", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--blas-threads", "-2", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--threads", "3", NULL), 0);
    ck_assert_int_eq(o.threads, 3);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--threads", "-1", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--threads", "257", NULL), -1);
}
END_TEST

/* A request that claims a listed key takes it to the front of what is
 * left; the others keep their order (hottest first), so the background
 * prewarm goes on from the hottest key left, not from the one a swap would
 * have moved into the claimed key's place. */
START_TEST(test_a_claimed_prewarm_key_leaves_the_rest_in_order) {
    wrk_prewarm_t pw[6];
    memset(pw, 0, sizeof pw);
    for (int i = 0; i < 6; i++) pw[i].shard = (uint64_t)(i + 1);
    int at = wrk_prewarm_take(pw, 0, 3); /* key 4 claimed before any prewarm */
    ck_assert_int_eq(at, 1);
    static const uint64_t want1[6] = { 4, 1, 2, 3, 5, 6 };
    for (int i = 0; i < 6; i++) ck_assert_uint_eq(pw[i].shard, want1[i]);
    at = wrk_prewarm_take(pw, at, at); /* the background takes the hottest left: key 1 */
    ck_assert_int_eq(at, 2);
    at = wrk_prewarm_take(pw, at, 5); /* key 6, the coldest, claimed */
    static const uint64_t want2[6] = { 4, 1, 6, 2, 3, 5 };
    for (int i = 0; i < 6; i++) ck_assert_uint_eq(pw[i].shard, want2[i]);
    ck_assert_int_eq(at, 3);
    at = wrk_prewarm_take(pw, at, 5); /* the last one */
    static const uint64_t want3[6] = { 4, 1, 6, 5, 2, 3 };
    for (int i = 0; i < 6; i++) ck_assert_uint_eq(pw[i].shard, want3[i]);
    ck_assert_int_eq(at, 4);
}
END_TEST

/* --prewarm K: 8 by default, 0 turns it off, at most MSG_MAX_PREWARM (64). */
START_TEST(test_prewarm_takes_0_to_64_keys_and_defaults_to_8) {
    wrk_opts_t o;
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", NULL), 0);
    ck_assert_int_eq(o.prewarm, 8);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--prewarm", "0", NULL), 0);
    ck_assert_int_eq(o.prewarm, 0);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--prewarm", "64", NULL), 0);
    ck_assert_int_eq(o.prewarm, MSG_MAX_PREWARM);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--prewarm", "65", NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "--prewarm"));
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--prewarm", "-1", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--prewarm", "some", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--prewarm", NULL), -1);
}
END_TEST

START_TEST(test_unknown_flags_and_missing_required_options_are_usage_errors) {
    wrk_opts_t o;
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--frobnicate", NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "--frobnicate"));
    ck_assert_int_eq(parse(&o, "--weights", "w.st", NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "--name"));
    ck_assert_int_eq(parse(&o, "--name", "w0", NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "--weights"));
    ck_assert_int_eq(parse(&o, "--name", "w 0", "--weights", "w.st", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--streams", "0", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--policy", "lazy", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--backend", "tpu", NULL), -1);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--budget", "12Q", NULL), -1);
    /* the row's wording, not reel_parse_bytes's (base/opts.h) */
    ck_assert_str_eq(reel_err()->msg, "--budget: '12Q' is a bad value: expected bytes with an optional K/M/G suffix");
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--streams", NULL), -1);
}
END_TEST

START_TEST(test_byte_counts_take_binary_suffixes_and_reject_junk) {
    /* --budget is read by base/parse.h's reel_parse_bytes */
    static const struct { const char *s; uint64_t v; } good[] = {
        { "0", 0 }, { "1048576", 1048576 }, { "4k", 4096 }, { "512M", 512ull << 20 },
        { "2GiB", 2ull << 30 }, { "3GB", 3ull << 30 },
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t b = 7;
        ck_assert_msg(reel_parse_bytes(good[i].s, SIZE_MAX, "--budget", &b) == 0, "%s: %s", good[i].s, reel_err_text());
        ck_assert(b == good[i].v);
    }
    static const char *bad[] = { "", "-1", "1.5G", "G", "99999999999999999999", "17179869184G" /* 2^34 GiB */ };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t b = 7;
        ck_assert_msg(reel_parse_bytes(bad[i], SIZE_MAX, "--budget", &b) == -1, "'%s' was accepted", bad[i]);
        ck_assert(b == 7);
    }
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

/* What the broker would read: the taken entries encoded as EVENTS and
 * decoded again. */
typedef struct {
    wire_msg_t m;
    msg_events_t ev;
} taken_t;

static taken_t *take(wrk_events_t *b, size_t max, uint64_t *dropped) {
    msg_events_t ev = { NULL, 0, 0 };
    msg_event_t *arr = wrk_events_take(b, max, &ev.n_events, &ev.dropped);
    if (dropped) *dropped = ev.dropped;
    if (!arr) return NULL;
    ev.events = arr;
    size_t len = 0;
    unsigned char *bytes = msg_encode(MSG_EVENTS, 0, &ev, &len);
    free(arr);
    ck_assert_ptr_nonnull(bytes);
    ck_assert_uint_le(len, WIRE_MAX_HEADER);
    taken_t *t = calloc(1, sizeof *t);
    zmq_msg_t f;
    zmq_msg_init_size(&f, len);
    memcpy(zmq_msg_data(&f), bytes, len);
    free(bytes);
    wire_err_t err;
    ck_assert_msg(wire_decode(&t->m, &f, 1, &err) == 0, "%s", err.message);
    ck_assert_msg(msg_events_decode(&t->m, &t->ev, &err) == 0, "%s", err.message);
    return t;
}

static void untake(taken_t **t) {
    wire_msg_close(&(*t)->m);
    free(*t);
    *t = NULL;
}

#define EV(t, i) (&(t)->ev.events[(i)])

START_TEST(test_repeated_declines_of_a_key_and_reason_become_one_event_with_a_count) {
    wrk_events_t *b = wrk_events_new(64);
    for (int i = 0; i < 5; i++) decline(b, 0xa, CAP_DECLINE_WARMING_UP);
    decline(b, 0xb, CAP_DECLINE_WARMING_UP);        /* another key in between does not split */
    decline(b, 0xa, CAP_DECLINE_WARMING_UP);
    decline(b, 0xa, CAP_DECLINE_PINNED_INPUT_MOVED); /* another reason is its own entry */
    ck_assert(wrk_events_pending(b));
    uint64_t dropped = 9;
    taken_t *t = take(b, 100, &dropped);
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(dropped, 0);
    ck_assert_uint_eq(t->ev.n_events, 3);
    ck_assert_str_eq(EV(t, 0)->kind, "decline");
    ck_assert_str_eq(EV(t, 0)->reason, "warming_up");
    ck_assert_uint_eq(EV(t, 0)->key_hash, 0xa);
    ck_assert_str_eq(EV(t, 0)->key, "reel-key/1 model=tinydit:tiny A");
    ck_assert_uint_eq(EV(t, 0)->count, 6);
    ck_assert_uint_eq(EV(t, 1)->key_hash, 0xb);
    ck_assert_uint_eq(EV(t, 1)->count, 1);
    ck_assert_str_eq(EV(t, 2)->reason, "pinned_input_moved");
    ck_assert_uint_eq(EV(t, 2)->count, 1);
    untake(&t);
    ck_assert(!wrk_events_pending(b));
    ck_assert_ptr_null(take(b, 100, NULL));
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
    ev.graph = true;
    wrk_events_on_cache(b, &ev);
    taken_t *t = take(b, 100, NULL);
    ck_assert_uint_eq(t->ev.n_events, 4);
    ck_assert_str_eq(EV(t, 0)->kind, "decline");
    ck_assert_uint_eq(EV(t, 0)->count, 2);
    ck_assert_str_eq(EV(t, 1)->kind, "capture");
    ck_assert_uint_eq(EV(t, 1)->bytes, 4096);
    ck_assert_uint_eq(EV(t, 1)->nodes, 321);
    ck_assert(EV(t, 1)->seconds == 0.25);
    ck_assert_str_eq(EV(t, 2)->kind, "decline");
    ck_assert_uint_eq(EV(t, 2)->count, 1);
    ck_assert_str_eq(EV(t, 3)->kind, "evict");
    ck_assert_str_eq(EV(t, 3)->reason, "weight_sync");
    ck_assert_str_eq(EV(t, 3)->component, "transformer");
    ck_assert_uint_eq(EV(t, 3)->from, 1);
    ck_assert_uint_eq(EV(t, 3)->to, 2);
    untake(&t);
    wrk_events_destroy(&b);
}
END_TEST

/* A capture's EVENTS entry says what asked for it: "demand" after a
 * warmup, "prewarm" when a PREWARM key was captured before its requests
 * (the broker's catalog records it as the capture's origin). */
START_TEST(test_a_capture_event_says_whether_a_demand_or_a_prewarm_asked_for_it) {
    wrk_events_t *b = wrk_events_new(64);
    cap_event_t p = ev_of(CAP_EV_CAPTURE, CAP_CAPTURE_PREWARM, 0xa, 0);
    cap_event_t d = ev_of(CAP_EV_CAPTURE, CAP_CAPTURE_DEMAND, 0xb, 0);
    wrk_events_on_cache(b, &p);
    wrk_events_on_cache(b, &d);
    taken_t *t = take(b, 100, NULL);
    ck_assert_uint_eq(t->ev.n_events, 2);
    ck_assert_str_eq(EV(t, 0)->kind, "capture");
    ck_assert_uint_eq(EV(t, 0)->key_hash, 0xa);
    ck_assert_str_eq(EV(t, 0)->reason, "prewarm");
    ck_assert_str_eq(EV(t, 1)->kind, "capture");
    ck_assert_uint_eq(EV(t, 1)->key_hash, 0xb);
    ck_assert_str_eq(EV(t, 1)->reason, "demand");
    untake(&t);
    wrk_events_destroy(&b);
}
END_TEST

START_TEST(test_replays_are_counted_per_key_and_stream) {
    wrk_events_t *b = wrk_events_new(64);
    for (int i = 0; i < 7; i++) wrk_events_replay(b, 0xa, 0);
    for (int i = 0; i < 3; i++) wrk_events_replay(b, 0xa, 1);
    wrk_events_replay(b, 0xb, 0);
    taken_t *t = take(b, 100, NULL);
    ck_assert_uint_eq(t->ev.n_events, 3);
    for (size_t i = 0; i < 3; i++) ck_assert_str_eq(EV(t, i)->kind, "replays");
    ck_assert_int_eq(EV(t, 0)->stream, 0);
    ck_assert_int_eq(EV(t, 1)->stream, 1);
    ck_assert_uint_eq(EV(t, 0)->count, 7);
    ck_assert_uint_eq(EV(t, 1)->count, 3);
    ck_assert_uint_eq(EV(t, 2)->count, 1);
    untake(&t);
    /* counters restart after a take */
    wrk_events_replay(b, 0xa, 0);
    t = take(b, 100, NULL);
    ck_assert_uint_eq(t->ev.n_events, 1);
    ck_assert_uint_eq(EV(t, 0)->count, 1);
    untake(&t);
    wrk_events_destroy(&b);
}
END_TEST

/* The catalog's evictions are graphs': an entry evicted while warming up
 * (or one that only ran eager) held none, and is not sent, so a worker's
 * captures minus evictions in the catalog is the graphs it holds. */
START_TEST(test_an_entry_evicted_without_a_graph_is_not_reported) {
    wrk_events_t *b = wrk_events_new(64);
    decline(b, 0xa, CAP_DECLINE_WARMING_UP);
    cap_event_t ev = ev_of(CAP_EV_EVICT, CAP_EVICT_WEIGHT_SYNC, 0xa, 0);
    ev.graph = false;
    wrk_events_on_cache(b, &ev);
    cap_event_t c = ev_of(CAP_EV_CAPTURE, 0, 0xb, 0);
    wrk_events_on_cache(b, &c);
    cap_event_t g = ev_of(CAP_EV_EVICT, CAP_EVICT_SHUTDOWN, 0xb, 0);
    g.graph = true;
    wrk_events_on_cache(b, &g);
    taken_t *t = take(b, 100, NULL);
    ck_assert_uint_eq(t->ev.n_events, 3);
    ck_assert_str_eq(EV(t, 0)->kind, "decline");
    ck_assert_str_eq(EV(t, 1)->kind, "capture");
    ck_assert_str_eq(EV(t, 2)->kind, "evict");
    ck_assert_str_eq(EV(t, 2)->reason, "shutdown");
    ck_assert_uint_eq(EV(t, 2)->key_hash, 0xb);
    untake(&t);
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
    e.graph = true;
    wrk_events_on_cache(b, &e);
    taken_t *t = take(b, 100, NULL);
    ck_assert_uint_eq(t->ev.n_events, 3);
    ck_assert_int_eq(EV(t, 0)->stream, 1);
    ck_assert_int_eq(EV(t, 1)->stream, 0);
    ck_assert_int_eq(EV(t, 2)->stream, 1);
    ck_assert_str_eq(EV(t, 2)->reason, "lru");
    ck_assert_str_eq(EV(t, 2)->component, "");
    untake(&t);
    wrk_events_destroy(&b);
}
END_TEST

START_TEST(test_a_full_event_buffer_drops_and_counts_instead_of_growing) {
    wrk_events_t *b = wrk_events_new(4);
    for (uint64_t h = 1; h <= 6; h++) decline(b, h, CAP_DECLINE_WARMING_UP);
    decline(b, 1, CAP_DECLINE_WARMING_UP); /* merges: costs no room */
    uint64_t dropped = 0;
    taken_t *t = take(b, 3, &dropped);
    ck_assert_uint_eq(dropped, 2);
    ck_assert_uint_eq(t->ev.n_events, 3);            /* at most `max` per message */
    ck_assert_uint_eq(EV(t, 0)->count, 2);
    untake(&t);
    t = take(b, 3, &dropped);
    ck_assert_uint_eq(dropped, 0);
    ck_assert_uint_eq(t->ev.n_events, 1);
    ck_assert_uint_eq(EV(t, 0)->key_hash, 4);
    untake(&t);
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
    taken_t *t = take(b, WRK_EVENTS_PER_MSG, NULL); /* take() checks the header limit */
    ck_assert_uint_eq(t->ev.n_events, WRK_EVENTS_PER_MSG);
    ck_assert_str_eq(EV(t, 0)->key, key);
    untake(&t);
    wrk_events_destroy(&b);
}
END_TEST

/* A link to a broker whose connection holds 2 messages (the broker's
 * receive HWM 1, read at its bind, and the worker's send HWM 1), the
 * worker's DEALER never waiting, as the worker's is (SNDTIMEO 0). */
static void small_link(void *zctx, const char *ep, void **broker, void **dealer) {
    int one = 1, zero = 0;
    *broker = zmq_socket(zctx, ZMQ_ROUTER);
    *dealer = zmq_socket(zctx, ZMQ_DEALER);
    zmq_setsockopt(*broker, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(*dealer, ZMQ_SNDHWM, &one, sizeof one);
    zmq_setsockopt(*dealer, ZMQ_SNDTIMEO, &zero, sizeof zero);
    ck_assert_int_eq(zmq_bind(*broker, ep), 0);
    ck_assert_int_eq(zmq_connect(*dealer, ep), 0);
}

/* Reads the EVENTS waiting at the broker's end, adding up their entries
 * and `dropped`. */
static void broker_reads(void *broker, uint64_t *entries, uint64_t *dropped) {
    zmq_pollitem_t it = { broker, 0, ZMQ_POLLIN, 0 };
    while (zmq_poll(&it, 1, 0) > 0) {
        wire_msg_t m;
        wire_err_t err;
        msg_events_t ev;
        memset(&m, 0, sizeof m);
        ck_assert_int_eq(msg_recv(broker, true, 0, &m, &err), 0);
        ck_assert_int_eq(msg_events_decode(&m, &ev, &err), 0);
        *entries += ev.n_events;
        *dropped += ev.dropped;
        wire_msg_close(&m);
    }
}

static void captures(wrk_events_t *b, uint64_t n) {
    for (uint64_t h = 1; h <= n; h++) {
        cap_event_t c = ev_of(CAP_EV_CAPTURE, 0, h, 0);
        wrk_events_on_cache(b, &c);
    }
}

/* The broker's connection full (the broker stalled, or busy with a flood
 * of PROGRESS): the EVENTS it cannot take is held and goes first once it
 * can, and nothing more is taken meanwhile. Before, the events taken for
 * it were lost, counted nowhere: captures missing from the catalog. */
START_TEST(test_events_the_brokers_full_connection_cannot_take_are_held_and_sent_later) {
    void *zctx = zmq_ctx_new(), *broker, *dealer;
    small_link(zctx, "inproc://events-full", &broker, &dealer);
    wrk_events_t *b = wrk_events_new(4096);
    captures(b, 5 * WRK_EVENTS_PER_MSG);
    wrk_events_held_t held;
    memset(&held, 0, sizeof held);
    ck_assert_int_eq(wrk_events_flush(b, dealer, &held, 64), 1); /* two went, the third is held */
    ck_assert_int_gt(held.parts.np, 0);
    ck_assert_uint_eq(held.entries, WRK_EVENTS_PER_MSG);
    ck_assert_int_eq(wrk_events_flush(b, dealer, &held, 64), 1); /* still full: it keeps its place */
    ck_assert_uint_eq(held.entries, WRK_EVENTS_PER_MSG);
    uint64_t entries = 0, dropped = 0;
    /* the broker reads; each flush goes on from where it stopped (ZeroMQ
     * tells the DEALER of the room through its own commands: bounded) */
    int rc = 1;
    for (int i = 0; i < 2000 && (rc != 0 || held.parts.np); i++) {
        broker_reads(broker, &entries, &dropped);
        rc = wrk_events_flush(b, dealer, &held, 64);
        if (rc != 0) zmq_poll(NULL, 0, 1);
    }
    ck_assert_int_eq(rc, 0);
    for (int i = 0; i < 2000 && entries < 5 * WRK_EVENTS_PER_MSG; i++) {
        broker_reads(broker, &entries, &dropped);
        if (entries < 5 * WRK_EVENTS_PER_MSG) zmq_poll(NULL, 0, 1);
    }
    ck_assert_uint_eq(entries, 5 * WRK_EVENTS_PER_MSG);
    ck_assert_uint_eq(dropped, 0);
    wrk_events_held_clear(&held);
    wrk_events_destroy(&b);
    zmq_close(dealer);
    zmq_close(broker);
    zmq_ctx_term(zctx);
}
END_TEST

/* An EVENTS that can never be sent (the link is going away) is counted:
 * its entries, and the `dropped` it carried, are reported as dropped by
 * the next EVENTS, so the broker's catalog_dropped says what is missing. */
START_TEST(test_events_that_cannot_be_sent_are_counted_as_dropped) {
    void *zctx = zmq_ctx_new();
    void *dealer = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(dealer, ZMQ_SNDTIMEO, &zero, sizeof zero);
    wrk_events_t *b = wrk_events_new(4096);
    captures(b, 3 * WRK_EVENTS_PER_MSG);
    wrk_events_held_t held;
    memset(&held, 0, sizeof held);
    /* no broker yet: the first is held */
    ck_assert_int_eq(wrk_events_flush(b, dealer, &held, 64), 1);
    ck_assert_uint_eq(held.entries, WRK_EVENTS_PER_MSG);
    zmq_ctx_shutdown(zctx); /* every send fails (ETERM) once the socket reads its stop command */
    for (int i = 0; i < 2000 && held.parts.np; i++)
        if (wrk_events_flush(b, dealer, &held, 64) == 1 && held.parts.np) zmq_poll(NULL, 0, 1);
    ck_assert_int_eq(held.parts.np, 0); /* lost: its 128 counted */
    /* the next one, taken and refused at once: its own entries and the
     * `dropped` it carried are counted again */
    ck_assert_int_eq(wrk_events_flush(b, dealer, &held, 64), 1);
    ck_assert_int_eq(held.parts.np, 0);
    uint64_t dropped = 0;
    taken_t *t = take(b, WRK_EVENTS_PER_MSG, &dropped);
    ck_assert_uint_eq(dropped, 2 * WRK_EVENTS_PER_MSG);
    ck_assert_uint_eq(t->ev.n_events, WRK_EVENTS_PER_MSG); /* the third still waits */
    untake(&t);
    wrk_events_destroy(&b);
    zmq_close(dealer);
    zmq_ctx_term(zctx);
}
END_TEST

/* ---- REQUEST checking ---------------------------------------------------------- */

static tdit_config_t tiny;
static float ctx_buf[5 * 32], unc_buf[5 * 32], lat_buf[4 * 2 * 8 * 8];
static wire_tensor_t t_ctx, t_unc, t_lat;

static void tensor(wire_tensor_t *t, const char *name, kern_dtype_t dt, int ndim, const int64_t *shape, const void *data) {
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
static void good_request(msg_gen_t *g) {
    memset(g, 0, sizeof *g);
    snprintf(g->model, sizeof g->model, "tiny");
    g->version = 1;
    g->steps = 6;
    g->shift = 3.0;
    g->cfg = 5.0;
    g->eta = 0.7;
    g->seed = 11;
    g->progress = true;
    const int64_t l[4] = { 4, 2, 8, 8 }, cs[2] = { 5, 32 };
    memcpy(g->latent_shape, l, sizeof l);
    for (size_t i = 0; i < 5 * 32; i++) ctx_buf[i] = (float)i, unc_buf[i] = -(float)i;
    tensor(&t_ctx, "context", KERN_F32, 2, cs, ctx_buf);
    tensor(&t_unc, "uncond", KERN_F32, 2, cs, unc_buf);
    tensor(&t_lat, "latent", KERN_F32, 4, l, lat_buf);
    g->context = &t_ctx;
    g->uncond = &t_unc;
    g->latent = &t_lat;
}

static void set_latent_shape(msg_gen_t *g, int64_t c, int64_t f, int64_t h, int64_t w) {
    g->latent_shape[0] = c;
    g->latent_shape[1] = f;
    g->latent_shape[2] = h;
    g->latent_shape[3] = w;
}

/* Runs the check, expecting a bad_request whose message contains `want`. */
static void expect_refused(const msg_gen_t *g, uint64_t applied, const char *want) {
    wrk_job_t *j = (wrk_job_t *)1;
    wire_err_t err;
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(wrk_job_from_request(g, 42, &tiny, applied, &j, &err), -1);
    ck_assert_ptr_null(j);
    ck_assert_str_eq(err.code, "bad_request");
    ck_assert_msg(strstr(err.message, want) != NULL, "message '%s' lacks '%s'", err.message, want);
}

static void setup_tiny(void) { ck_assert_int_eq(tdit_config_builtin("tiny", &tiny), 0); }

START_TEST(test_a_good_request_becomes_a_job_with_copies_of_its_tensors) {
    msg_gen_t g;
    good_request(&g);
    wrk_job_t *j = NULL;
    wire_err_t err;
    ck_assert_int_eq(wrk_job_from_request(&g, 42, &tiny, 1, &j, &err), 0);
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

    /* Without uncond: no CFG; without latent: drawn from the seed. */
    good_request(&g);
    g.uncond = NULL;
    g.latent = NULL;
    ck_assert_int_eq(wrk_job_from_request(&g, 42, &tiny, 1, &j, &err), 0);
    ck_assert(!j->shape.cfg);
    ck_assert_ptr_null(j->uncond);
    ck_assert_ptr_null(j->latent);
    ck_assert_int_eq(j->deadline_at, 0); /* no deadline_ms: none */
    wrk_job_free(&j);

    /* deadline_ms (what the broker still waits): dropped past it */
    good_request(&g);
    g.deadline_ms = 5000;
    int64_t t0 = wrk_mono_ms();
    ck_assert_int_eq(wrk_job_from_request(&g, 42, &tiny, 1, &j, &err), 0);
    ck_assert_int_ge(j->deadline_at, t0 + 5000);
    ck_assert_int_le(j->deadline_at, wrk_mono_ms() + 5000);
    wrk_job_free(&j);
}
END_TEST

/* With a config's text_len (Wan: 512; here 12), the context and the
 * negative prompt are each padded with zero rows to it, whatever either's
 * own length: a prompt already text_len rows long beside a 3-row negative
 * prompt, and the other way round; longer than text_len is bad_request;
 * the job's shape is text_len rows, and the solver reaches the job. */
START_TEST(test_contexts_are_each_padded_to_text_len_whatever_their_lengths) {
    tdit_config_t wan = tiny;
    wan.text_len = 12;
    static float c12[12 * 32], u3[3 * 32], u13[13 * 32];
    for (size_t i = 0; i < 12 * 32; i++) c12[i] = 1.0f + (float)i;
    for (size_t i = 0; i < 3 * 32; i++) u3[i] = -1.0f - (float)i;
    const int64_t s12[2] = { 12, 32 }, s3[2] = { 3, 32 }, s13[2] = { 13, 32 };
    wire_tensor_t tc, tu;
    for (int flip = 0; flip < 2; flip++) {
        msg_gen_t g;
        good_request(&g);
        tensor(&tc, "context", KERN_F32, 2, flip ? s3 : s12, flip ? u3 : c12);
        tensor(&tu, "uncond", KERN_F32, 2, flip ? s12 : s3, flip ? c12 : u3);
        g.context = &tc;
        g.uncond = &tu;
        snprintf(g.solver, sizeof g.solver, "unipc");
        wrk_job_t *j = NULL;
        wire_err_t err;
        ck_assert_msg(wrk_job_from_request(&g, 42, &wan, 1, &j, &err) == 0, "%s", err.message);
        ck_assert_int_eq(j->shape.text_len, 12);
        ck_assert_int_eq(j->shape.solver, TDIT_SOLVER_UNIPC);
        ck_assert_int_eq(j->loop.solver, TDIT_SOLVER_UNIPC);
        const float *full = flip ? j->uncond : j->context, *shortp = flip ? j->context : j->uncond;
        ck_assert_mem_eq(full, c12, sizeof c12);
        ck_assert_mem_eq(shortp, u3, sizeof u3);
        for (size_t i = 3 * 32; i < 12 * 32; i++) ck_assert_msg(shortp[i] == 0.0f, "row %zu not zero", i / 32);
        wrk_job_free(&j);
    }
    msg_gen_t g;
    good_request(&g);
    tensor(&tu, "uncond", KERN_F32, 2, s13, u13);
    g.uncond = &tu;
    wrk_job_t *j = (wrk_job_t *)1;
    wire_err_t err;
    ck_assert_int_eq(wrk_job_from_request(&g, 42, &wan, 1, &j, &err), -1);
    ck_assert_ptr_null(j);
    ck_assert_ptr_nonnull(strstr(err.message, "text_len 12"));
    /* Without text_len a negative prompt of another length is refused. */
    good_request(&g);
    tensor(&tu, "uncond", KERN_F32, 2, s3, u3);
    g.uncond = &tu;
    expect_refused(&g, 1, "expected the context's");
}
END_TEST

/* A group: n samples, seeds given or seed + i, the latents [n,...] copied
 * whole; a bad group is refused like any bad request. */
START_TEST(test_a_group_request_becomes_one_job_of_n_samples) {
    static float lat3[3 * 4 * 2 * 8 * 8];
    for (size_t i = 0; i < sizeof lat3 / sizeof lat3[0]; i++) lat3[i] = (float)i;
    msg_gen_t g;
    good_request(&g);
    wire_tensor_t t3;
    const int64_t l3[5] = { 3, 4, 2, 8, 8 };
    tensor(&t3, "latent", KERN_F32, 5, l3, lat3);
    g.latent = &t3;
    g.n = 3;
    g.n_seeds = 3;
    g.seeds[0] = 40;
    g.seeds[1] = 7;
    g.seeds[2] = 40;
    wrk_job_t *j = NULL;
    wire_err_t err;
    ck_assert_msg(wrk_job_from_request(&g, 42, &tiny, 1, &j, &err) == 0, "%s", err.message);
    ck_assert_int_eq(j->n, 3);
    ck_assert_uint_eq(j->seeds[0], 40);
    ck_assert_uint_eq(j->seeds[1], 7);
    ck_assert_uint_eq(j->seeds[2], 40);
    ck_assert_uint_eq(j->n_latent, 4 * 2 * 8 * 8); /* one sample's */
    ck_assert_mem_eq(j->latent, lat3, sizeof lat3);
    wrk_job_free(&j);
    /* no seeds: seed + i */
    g.n_seeds = 0;
    g.latent = NULL;
    ck_assert_int_eq(wrk_job_from_request(&g, 42, &tiny, 1, &j, &err), 0);
    for (int i = 0; i < 3; i++) ck_assert_uint_eq(j->seeds[i], 11 + (uint64_t)i);
    wrk_job_free(&j);
    /* no n: one sample */
    good_request(&g);
    ck_assert_int_eq(wrk_job_from_request(&g, 42, &tiny, 1, &j, &err), 0);
    ck_assert_int_eq(j->n, 1);
    ck_assert_uint_eq(j->seeds[0], 11);
    wrk_job_free(&j);
    /* bad groups */
    good_request(&g);
    g.n = 2; /* the latent is one sample's */
    expect_refused(&g, 1, "expected F32[2,4,2,8,8]");
    g.latent = NULL;
    g.n_seeds = 1;
    expect_refused(&g, 1, "'seeds' has 1 entries, 'n' is 2");
}
END_TEST

START_TEST(test_a_latent_with_the_wrong_channel_count_is_refused) {
    msg_gen_t g;
    good_request(&g);
    g.latent = NULL;
    set_latent_shape(&g, 3, 2, 8, 8);
    expect_refused(&g, 1, "latent has 3 channels, model tiny expects 4");
}
END_TEST

START_TEST(test_a_context_of_the_wrong_text_width_is_refused) {
    msg_gen_t g;
    good_request(&g);
    g.uncond = NULL;
    const int64_t cs[2] = { 5, 16 };
    tensor(&t_ctx, "context", KERN_F32, 2, cs, ctx_buf);
    expect_refused(&g, 1, "context width 16, model tiny expects text_dim 32");
}
END_TEST

START_TEST(test_a_request_without_context_is_refused) {
    msg_gen_t g;
    good_request(&g);
    g.context = NULL;
    expect_refused(&g, 1, "missing tensor 'context'");
}
END_TEST

START_TEST(test_tensors_of_the_wrong_dtype_or_shape_are_refused) {
    msg_gen_t g;
    const int64_t cs[2] = { 5, 32 }, cs4[2] = { 4, 32 }, lbad[4] = { 4, 2, 8, 6 };
    static uint16_t half[5 * 32];
    good_request(&g);
    tensor(&t_ctx, "context", KERN_BF16, 2, cs, half);
    expect_refused(&g, 1, "tensor 'context' is BF16[5,32], expected F32[L,32]");
    good_request(&g);
    tensor(&t_unc, "uncond", KERN_F32, 2, cs4, unc_buf);
    expect_refused(&g, 1, "tensor 'uncond' is F32[4,32], expected the context's F32[5,32]");
    good_request(&g);
    tensor(&t_lat, "latent", KERN_F32, 4, lbad, lat_buf);
    expect_refused(&g, 1, "tensor 'latent' is F32[4,2,8,6], expected F32[4,2,8,8]");
    good_request(&g);
    g.latent = NULL;
    set_latent_shape(&g, 4, 2, 7, 8);
    expect_refused(&g, 1, "height and width must be multiples of 2");
}
END_TEST

/* NaN or an infinity anywhere in the prompt or the latent is refused by
 * name (it would come back as a NaN latent, served as a success); the
 * largest finite float is not. */
START_TEST(test_a_nan_or_infinite_input_is_refused_by_name) {
    msg_gen_t g;
    const float bads[3] = { NAN, INFINITY, -INFINITY };
    for (int k = 0; k < 3; k++) {
        good_request(&g);
        float *buf = k == 0 ? ctx_buf : k == 1 ? unc_buf : lat_buf;
        const char *name = k == 0 ? "context" : k == 1 ? "uncond" : "latent";
        float keep = buf[7];
        buf[7] = bads[k];
        char want[64];
        snprintf(want, sizeof want, "tensor '%s' holds NaN or infinite values", name);
        expect_refused(&g, 1, want);
        buf[7] = FLT_MAX;
        wrk_job_t *j = NULL;
        wire_err_t err;
        ck_assert_int_eq(wrk_job_from_request(&g, 42, &tiny, 1, &j, &err), 0);
        wrk_job_free(&j);
        buf[7] = keep;
    }
    /* the check itself, at every alignment and dtype */
    unsigned char raw[4 * 9 + 3];
    for (int off = 0; off < 4; off++) {
        float f[9] = { 0, -0.0f, 1e-45f, FLT_MAX, -FLT_MAX, 1, 2, 3, 4 };
        memcpy(raw + off, f, sizeof f);
        ck_assert(kern_all_finite(raw + off, 9, KERN_F32));
        f[8] = NAN;
        memcpy(raw + off, f, sizeof f);
        ck_assert(!kern_all_finite(raw + off, 9, KERN_F32));
    }
    const uint16_t bf_ok[3] = { 0x7f7f, 0xff7f, 0x0001 }, bf_inf[2] = { 0x3f80, 0x7f80 }, h_nan[2] = { 0x3c00, 0x7e00 },
                   h_ok[2] = { 0x7bff, 0xfbff };
    ck_assert(kern_all_finite(bf_ok, 3, KERN_BF16));
    ck_assert(!kern_all_finite(bf_inf, 2, KERN_BF16));
    ck_assert(!kern_all_finite(h_nan, 2, KERN_F16));
    ck_assert(kern_all_finite(h_ok, 2, KERN_F16));
}
END_TEST

START_TEST(test_another_model_a_newer_version_or_a_bad_loop_is_refused) {
    msg_gen_t g;
    good_request(&g);
    snprintf(g.model, sizeof g.model, "small");
    expect_refused(&g, 1, "model 'small' is not served here");
    good_request(&g);
    g.version = 3;
    expect_refused(&g, 2, "worker at v2, request needs v3");
    good_request(&g);
    g.shift = -1;
    expect_refused(&g, 1, "'shift' must be > 0");
    good_request(&g);
    g.cfg = 1e300;
    expect_refused(&g, 1, "'cfg' must fit a float");
}
END_TEST

/* A request the protocol allows but whose sample has more tokens than
 * --max-tokens (F x H/2 x W/2) is too_large (handle_request asks this
 * before it makes a job): a
 * step cannot be stopped half-way (4 x 32 x 512 x 512 is 2 Mi tokens, a
 * worker held for hours); at the limit it is taken; 0 lifts the limit.
 * (No latent tensor: the worker draws it from the seed.) */
START_TEST(test_a_sample_of_more_tokens_than_max_tokens_is_too_large) {
    msg_gen_t g;
    good_request(&g);
    g.latent = NULL;
    wire_err_t err;
    set_latent_shape(&g, 4, 32, 512, 512);
    ck_assert_int_eq(wrk_request_fits(&g, &tiny, 65536, &err), -1);
    ck_assert_str_eq(err.code, "too_large");
    ck_assert_msg(strstr(err.message, "2097152 tokens") && strstr(err.message, "--max-tokens 65536"), "%s",
                  err.message);
    ck_assert_int_eq(wrk_request_fits(&g, &tiny, 0, &err), 0);
    set_latent_shape(&g, 4, 16, 128, 128); /* 16 x 64 x 64 = 65536: at the limit */
    ck_assert_int_eq(wrk_request_fits(&g, &tiny, 65536, &err), 0);
    set_latent_shape(&g, 4, 17, 128, 128);
    ck_assert_int_eq(wrk_request_fits(&g, &tiny, 65536, &err), -1);
    ck_assert_str_eq(err.code, "too_large");
    set_latent_shape(&g, 4, INT64_MAX, INT64_MAX, 8); /* not a shape: the validation says so, no overflow */
    ck_assert_int_eq(wrk_request_fits(&g, &tiny, 65536, &err), -1);
    ck_assert_str_eq(err.code, "bad_request");
}
END_TEST

/* A request that breaks the model's rules and --max-tokens both is
 * answered for the model's (docs/PROTOCOL.md: the fields come before the
 * worker's own bounds): a latent of 16 channels for the 4-channel tiny
 * model is wrong on every worker, its token count only on this one. It
 * was blamed on its tokens. */
START_TEST(test_a_latent_of_the_wrong_channels_and_too_many_tokens_is_refused_for_its_channels) {
    msg_gen_t g;
    good_request(&g);
    g.latent = NULL;
    wire_err_t err;
    set_latent_shape(&g, 16, 16, 256, 256); /* 16 x 128 x 128 = 262144 tokens, a 64 MiB latent */
    ck_assert_int_eq(wrk_request_fits(&g, &tiny, 65536, &err), -1);
    ck_assert_str_eq(err.code, "bad_request");
    ck_assert_msg(strstr(err.message, "16 channels") && !strstr(err.message, "tokens"), "%s", err.message);
    set_latent_shape(&g, 16, 2, 8, 8); /* within --max-tokens: the same answer */
    ck_assert_int_eq(wrk_request_fits(&g, &tiny, 65536, &err), -1);
    ck_assert_str_eq(err.code, "bad_request");
    ck_assert_msg(strstr(err.message, "16 channels"), "%s", err.message);
}
END_TEST

/* "version" is a floor: a worker at a newer version runs the request. */
START_TEST(test_a_request_for_an_older_version_runs_on_a_newer_worker) {
    msg_gen_t g;
    good_request(&g);
    g.version = 2;
    wrk_job_t *j = NULL;
    wire_err_t err;
    ck_assert_int_eq(wrk_job_from_request(&g, 42, &tiny, 5, &j, &err), 0);
    ck_assert_uint_eq(j->version, 2);
    wrk_job_free(&j);
}
END_TEST

/* ---- prewarm keys ------------------------------------------------------------ */

/* A PREWARM key for the tiny model: latent [4,2,8,8], contexts [5,32], CFG. */
static msg_prewarm_key_t good_key(void) {
    msg_prewarm_key_t k;
    memset(&k, 0, sizeof k);
    snprintf(k.model, sizeof k.model, "tiny");
    const int64_t l[4] = { 4, 2, 8, 8 };
    memcpy(k.latent_shape, l, sizeof l);
    k.text_len = 5;
    k.text_dim = 32;
    k.cfg = true;
    k.n = 1;
    k.key_hash = 0xb6d4e43bdf155e32ull;
    return k;
}

/* Expects k refused with code `code` and a message holding `want`. */
static void expect_key_refused(const msg_prewarm_key_t *k, const tdit_config_t *cfg, int64_t max_tokens,
                               const char *code, const char *want) {
    wrk_prewarm_t p;
    wire_err_t err;
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(wrk_prewarm_from_key(k, cfg, max_tokens, &p, &err), -1);
    ck_assert_str_eq(err.code, code);
    ck_assert_msg(strstr(err.message, want) != NULL, "message '%s' lacks '%s'", err.message, want);
}

/* A job held as handle_request holds one: its id, its session, the
 * tensor bytes copied for it. */
static wrk_job_t *held_job_of(wrk_t *w, uint64_t id, size_t bytes) {
    wrk_job_t *j = calloc(1, sizeof *j);
    ck_assert_ptr_nonnull(j);
    j->id = id;
    j->epoch = atomic_load(&w->epoch);
    ck_assert_int_eq(wrk_hold_take(w, j, bytes), 0);
    return j;
}

static wrk_job_t *held_job(wrk_t *w, uint64_t id) { return held_job_of(w, id, 0); }

/* A CANCEL names only a REQUEST that came before it (one connection keeps
 * order): one of an id the worker does not hold is ignored, as
 * docs/PROTOCOL.md says, and a REQUEST of that id afterwards runs. Before,
 * the note waited in the ring and stopped that later REQUEST before its
 * first step (tests/cli_adversarial_peers.sh, a fake broker). A second
 * REQUEST of a cancelled id runs too; the first stays cancelled. */
START_TEST(test_a_cancel_stops_only_the_requests_of_its_id_taken_before_it) {
    wrk_t *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(wrk_shared_init(w), 0);
    atomic_init(&w->epoch, 1);
    ck_assert_uint_eq(wrk_cancel_note(w, 7), 0); /* before any REQUEST of id 7: nothing to mark */
    wrk_job_t *later = held_job(w, 7), *other = held_job(w, 8); /* REQUEST 7 comes after it */
    ck_assert_msg(!wrk_cancelled(later), "a CANCEL stopped a REQUEST that came after it");
    ck_assert_uint_eq(wrk_cancel_note(w, 7), 1); /* now it names that one */
    ck_assert(wrk_cancelled(later));
    wrk_job_t *again = held_job(w, 7); /* the same id again, after the CANCEL */
    ck_assert(!wrk_cancelled(again));
    ck_assert(!wrk_cancelled(other)); /* another id */
    atomic_store(&w->epoch, 2);
    ck_assert_uint_eq(wrk_cancel_note(w, 8), 0); /* another session's CANCEL of id 8 */
    ck_assert(!wrk_cancelled(other));
    wrk_job_free(&later);
    wrk_job_free(&other);
    wrk_job_free(&again);
    wrk_shared_fini(w);
    free(w);
}
END_TEST

/* The worker keeps only CANCELs of requests it holds, on the request
 * itself: a broker's flood of CANCELs of ids it does not hold marks
 * nothing, keeps nothing, and cannot push out a held request's mark.
 * Before, the last 256 CANCELs were kept in a ring, and 256 of unknown
 * ids after a real one evicted it before its stream looked: the request
 * ran on to its RESULT. A held request's entry goes once its job (and
 * every part of a split group) let go. */
START_TEST(test_a_flood_of_cancels_of_ids_not_held_never_undoes_a_real_one) {
    wrk_t *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(wrk_shared_init(w), 0);
    atomic_init(&w->epoch, 1);
    wrk_job_t *j = held_job(w, 7);
    ck_assert_uint_eq(wrk_cancel_note(w, 7), 1);
    for (uint64_t k = 0; k < 100000; k++) ck_assert_uint_eq(wrk_cancel_note(w, 1000000 + k), 0);
    ck_assert_msg(wrk_cancelled(j), "a flood of CANCELs of ids not held undid a real one");
    ck_assert_uint_eq(w->n_held, 1); /* nothing of the flood kept */
    /* a split group's parts share the mark: the entry stays until the last lets go */
    wrk_job_t *part = calloc(1, sizeof *part);
    ck_assert_ptr_nonnull(part);
    *part = *j;
    atomic_fetch_add(&part->hold->refs, 1); /* as split_group does */
    wrk_job_free(&j);
    ck_assert_uint_eq(wrk_cancel_note(w, 7), 1);
    ck_assert(wrk_cancelled(part));
    wrk_job_free(&part);
    ck_assert_uint_eq(wrk_cancel_note(w, 7), 0); /* answered: no longer held */
    ck_assert_uint_eq(w->n_held, 0);
    wrk_shared_fini(w);
    free(w);
}
END_TEST

/* What bounds a broker's REQUESTs (handle_request refuses one past 4 x
 * --max-inflight): every request held, of this session or an earlier one
 * still ending its step, counts until its job, and every part of a split
 * group, let go; one that ended counts no more. */
START_TEST(test_the_holds_count_every_session_until_each_job_and_its_parts_let_go) {
    wrk_t *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(wrk_shared_init(w), 0);
    atomic_init(&w->epoch, 1);
    ck_assert_uint_eq(wrk_holds(w), 0);
    wrk_job_t *a = held_job(w, 1), *b = held_job(w, 2);
    atomic_store(&w->epoch, 2); /* a new broker session: the old ones still hold their tensors */
    wrk_job_t *c = held_job(w, 1);
    ck_assert_uint_eq(wrk_holds(w), 3);
    wrk_job_t *part = calloc(1, sizeof *part);
    ck_assert_ptr_nonnull(part);
    *part = *b;
    atomic_fetch_add(&part->hold->refs, 1); /* as split_group does */
    wrk_job_free(&a);
    wrk_job_free(&b);
    ck_assert_uint_eq(wrk_holds(w), 2); /* b's other part still runs */
    wrk_job_free(&part);
    ck_assert_uint_eq(wrk_holds(w), 1);
    wrk_job_free(&c);
    ck_assert_uint_eq(wrk_holds(w), 0);
    wrk_shared_fini(w);
    free(w);
}
END_TEST

/* --max-held-mb bounds the tensor bytes held REQUESTs keep: each entry's
 * bytes count from its REQUEST until its job, and every part of a split
 * group, let go, of this session or an earlier one; then they leave the
 * sum once, whichever way the job ended. Before, the worker counted only
 * requests, 4 x --max-inflight of them, each up to 256 MiB. */
START_TEST(test_the_held_bytes_leave_the_sum_once_when_each_job_and_its_parts_let_go) {
    wrk_t *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(wrk_shared_init(w), 0);
    atomic_init(&w->epoch, 1);
    ck_assert_uint_eq(wrk_held_bytes(w), 0);
    wrk_job_t *a = held_job_of(w, 1, 100), *b = held_job_of(w, 2, 2000);
    atomic_store(&w->epoch, 2); /* a new broker session: the old ones still keep theirs */
    wrk_job_t *c = held_job_of(w, 1, 30000);
    ck_assert_uint_eq(wrk_held_bytes(w), 32100);
    wrk_job_t *part = calloc(1, sizeof *part);
    ck_assert_ptr_nonnull(part);
    *part = *b;
    atomic_fetch_add(&part->hold->refs, 1); /* as split_group does */
    ck_assert_uint_eq(wrk_cancel_note(w, 1), 1); /* c cancelled: it keeps its bytes until its job ends */
    ck_assert_uint_eq(wrk_held_bytes(w), 32100);
    wrk_job_free(&a);
    wrk_job_free(&b);
    ck_assert_uint_eq(wrk_held_bytes(w), 32000); /* b's other part still runs */
    ck_assert_uint_eq(wrk_held_bytes(w), 32000); /* asking again takes nothing twice */
    wrk_job_free(&part);
    ck_assert_uint_eq(wrk_holds(w), 1);
    ck_assert_uint_eq(wrk_held_bytes(w), 30000);
    wrk_job_free(&c);
    ck_assert_uint_eq(wrk_held_bytes(w), 0);
    ck_assert_uint_eq(wrk_holds(w), 0);
    /* a job still running at the end: fini lets go of the table's share */
    wrk_job_t *d = held_job_of(w, 3, 7);
    ck_assert_uint_eq(wrk_held_bytes(w), 7);
    wrk_shared_fini(w);
    ck_assert_uint_eq(w->held_bytes, 0);
    wrk_job_free(&d);
    free(w);
}
END_TEST

/* What a REQUEST would keep is known before any of it is copied, and is
 * what wrk_job_from_request copies: the latent as sent (a group's n),
 * each context as the step reads it (padded to text_len rows when the
 * config has one), a prompt's text. The most any request keeps is a
 * GEN's 256 MiB plus that padding and two prompts. */
START_TEST(test_a_request_keeps_what_its_job_copies_known_before_the_copy) {
    msg_gen_t g;
    good_request(&g); /* tiny: context, uncond [5,32], latent [4,2,8,8] */
    wrk_job_t *j = NULL;
    wire_err_t err;
    ck_assert_int_eq(wrk_job_from_request(&g, 42, &tiny, 1, &j, &err), 0);
    size_t copied = (2 * (size_t)j->shape.text_len * 32 + j->n_latent) * sizeof(float);
    ck_assert_uint_eq(wrk_request_bytes(&g, &tiny), copied);
    ck_assert_uint_eq(copied, 2 * 640 + 2048);
    wrk_job_free(&j);
    g.uncond = NULL;
    g.latent = NULL;
    ck_assert_uint_eq(wrk_request_bytes(&g, &tiny), 640);
    /* padded to text_len 12: 12 rows each, whatever was sent */
    tdit_config_t wan = tiny;
    wan.text_len = 12;
    good_request(&g);
    ck_assert_int_eq(wrk_job_from_request(&g, 42, &wan, 1, &j, &err), 0);
    copied = (2 * (size_t)j->shape.text_len * 32 + j->n_latent) * sizeof(float);
    ck_assert_uint_eq(wrk_request_bytes(&g, &wan), copied);
    ck_assert_uint_eq(copied, 2 * 12 * 32 * 4 + 2048);
    wrk_job_free(&j);
    /* a group's latents, all n */
    static float lat3[3 * 4 * 2 * 8 * 8];
    wire_tensor_t t3;
    const int64_t l3[5] = { 3, 4, 2, 8, 8 };
    tensor(&t3, "latent", KERN_F32, 5, l3, lat3);
    good_request(&g);
    g.latent = &t3;
    g.n = 3;
    ck_assert_uint_eq(wrk_request_bytes(&g, &tiny), 2 * 640 + sizeof lat3);
    /* a prompt: its text, and Wan's negative prompt when guided */
    good_request(&g);
    g.context = g.uncond = NULL;
    g.latent = NULL;
    g.prompt = "a cat";
    g.cfg = 1.0;
    ck_assert_uint_eq(wrk_request_bytes(&g, &wan), 6);
    g.cfg = 5.0;
    g.negative_prompt = "dull";
    ck_assert_uint_eq(wrk_request_bytes(&g, &wan), 6 + 5);
    ck_assert_msg(wrk_job_from_request(&g, 42, &wan, 1, &j, &err) == 0, "%s", err.message);
    ck_assert_uint_eq(strlen(j->prompt) + 1 + strlen(j->neg_prompt) + 1, 6 + 5);
    wrk_job_free(&j);
    g.negative_prompt = ""; /* Wan's own */
    ck_assert_uint_eq(wrk_request_bytes(&g, &wan), 6 + strlen(T2V_WAN_NEG_PROMPT) + 1);
    /* the most: a GEN's tensors, the padding of two contexts, two prompts */
    ck_assert_uint_ge(wrk_request_bytes_most(&tiny), (size_t)MSG_MAX_GEN_BYTES);
    ck_assert_uint_le(wrk_request_bytes_most(&tiny), (size_t)MSG_MAX_GEN_BYTES + 2 * (MSG_MAX_PROMPT_BYTES + 1));
    ck_assert_uint_eq(wrk_request_bytes_most(&wan), wrk_request_bytes_most(&tiny) + 2 * 12 * 32 * 4);
}
END_TEST

/* A key this worker can run becomes the shape and loop a request of it
 * would: F, H, W, the context rows, cfg, batch n, the solver (sde an
 * Euler loop), and the broker's shard hash. */
START_TEST(test_a_prewarm_key_becomes_the_shape_and_loop_its_requests_run) {
    msg_prewarm_key_t k = good_key();
    k.n = 4;
    snprintf(k.solver, sizeof k.solver, "unipc");
    wrk_prewarm_t p;
    wire_err_t err;
    ck_assert_int_eq(wrk_prewarm_from_key(&k, &tiny, 65536, &p, &err), 0);
    ck_assert_int_eq(p.shape.frames, 2);
    ck_assert_int_eq(p.shape.height, 8);
    ck_assert_int_eq(p.shape.width, 8);
    ck_assert_int_eq(p.shape.text_len, 5);
    ck_assert(p.shape.cfg);
    ck_assert_int_eq(p.shape.batch, 4);
    ck_assert_int_eq(p.shape.solver, TDIT_SOLVER_UNIPC);
    ck_assert(!p.shape.mixed);
    ck_assert_int_eq(p.loop.solver, TDIT_SOLVER_UNIPC);
    ck_assert(!p.loop.sde);
    ck_assert_int_eq(tdit_loop_validate(&p.loop), 0);
    ck_assert_int_eq(tdit_shape_validate(&p.shape), 0);
    ck_assert_uint_eq(p.shard, 0xb6d4e43bdf155e32ull);

    /* one sample, no CFG, SDE (solver left out: Euler's) */
    k = good_key();
    k.cfg = false;
    k.sde = true;
    k.key_hash = 7;
    ck_assert_int_eq(wrk_prewarm_from_key(&k, &tiny, 65536, &p, &err), 0);
    ck_assert_int_eq(p.shape.batch, 1);
    ck_assert(!p.shape.cfg);
    ck_assert_int_eq(p.shape.solver, TDIT_SOLVER_EULER);
    ck_assert(p.loop.sde);
    ck_assert_int_eq(p.loop.solver, TDIT_SOLVER_EULER);
    ck_assert_uint_eq(p.shard, 7);
    k = good_key();
    snprintf(k.solver, sizeof k.solver, "dpm++");
    ck_assert_int_eq(wrk_prewarm_from_key(&k, &tiny, 0, &p, &err), 0);
    ck_assert_int_eq(p.shape.solver, TDIT_SOLVER_DPMPP);
    ck_assert_int_eq(p.loop.solver, TDIT_SOLVER_DPMPP);
    snprintf(k.solver, sizeof k.solver, "euler");
    ck_assert_int_eq(wrk_prewarm_from_key(&k, &tiny, 0, &p, &err), 0);
    ck_assert_int_eq(p.shape.solver, TDIT_SOLVER_EULER);

    /* a config with text_len (Wan's 512; here 12): the key's rows are it */
    tdit_config_t wan = tiny;
    wan.text_len = 12;
    k = good_key();
    k.text_len = 12;
    ck_assert_int_eq(wrk_prewarm_from_key(&k, &wan, 65536, &p, &err), 0);
    ck_assert_int_eq(p.shape.text_len, 12);
}
END_TEST

/* A key of another model, latent channels, context width or length, a
 * shape the model refuses (odd height), an unknown solver or sde with a
 * multistep one is bad_request; more tokens than --max-tokens too_large. */
START_TEST(test_a_prewarm_key_this_worker_cannot_run_is_refused_with_a_reason) {
    msg_prewarm_key_t k = good_key();
    snprintf(k.model, sizeof k.model, "small");
    expect_key_refused(&k, &tiny, 65536, "bad_request", "model small is not this worker's (tiny)");
    k = good_key();
    k.latent_shape[0] = 3;
    expect_key_refused(&k, &tiny, 65536, "bad_request", "a latent of 3 channels; model tiny takes 4");
    k = good_key();
    k.text_dim = 16;
    expect_key_refused(&k, &tiny, 65536, "bad_request", "contexts 16 wide; model tiny takes 32");
    tdit_config_t wan = tiny;
    wan.text_len = 12;
    k = good_key(); /* 5 rows */
    expect_key_refused(&k, &wan, 65536, "bad_request", "contexts of 5 rows; model tiny pads them to 12");
    k.text_len = 13;
    expect_key_refused(&k, &wan, 65536, "bad_request", "contexts of 13 rows; model tiny pads them to 12");
    k = good_key();
    k.latent_shape[2] = 7;
    expect_key_refused(&k, &tiny, 65536, "bad_request", "height, width even");
    k = good_key();
    k.latent_shape[3] = 0;
    expect_key_refused(&k, &tiny, 65536, "bad_request", "latent_shape is not a shape");
    k = good_key();
    snprintf(k.solver, sizeof k.solver, "ddim");
    expect_key_refused(&k, &tiny, 65536, "bad_request", "unknown solver 'ddim'");
    /* sde with unipc: SDE steps on UniPC's grid (Euler's sampler, the grid's timesteps) */
    snprintf(k.solver, sizeof k.solver, "unipc");
    k.sde = true;
    {
        wrk_prewarm_t gp;
        wire_err_t gerr;
        ck_assert_msg(wrk_prewarm_from_key(&k, &tiny, 65536, &gp, &gerr) == 0, "%s", gerr.message);
        ck_assert_int_eq(gp.shape.solver, TDIT_SOLVER_EULER);
        ck_assert_int_eq(gp.shape.grid, TDIT_SOLVER_UNIPC);
        ck_assert(gp.loop.sde);
        ck_assert_int_eq(gp.loop.solver, TDIT_SOLVER_UNIPC);
    }

    /* tokens F x H/2 x W/2: 16 x 64 x 64 = 65536 at the limit, 17 frames over */
    wrk_prewarm_t p;
    wire_err_t err;
    k = good_key();
    k.latent_shape[1] = 16, k.latent_shape[2] = 128, k.latent_shape[3] = 128;
    ck_assert_int_eq(wrk_prewarm_from_key(&k, &tiny, 65536, &p, &err), 0);
    k.latent_shape[1] = 17;
    expect_key_refused(&k, &tiny, 65536, "too_large", "a sample of 69632 tokens, more than --max-tokens 65536");
    ck_assert_int_eq(wrk_prewarm_from_key(&k, &tiny, 0, &p, &err), 0); /* 0: no limit */
}
END_TEST

/* ---- sha256 and SYNC weights ---------------------------------------------------- */

#define SHA_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define SHA_EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

START_TEST(test_sha256_of_abc_matches_the_fips_180_2_digest_whole_in_parts_and_from_a_file) {
    char hex[65];
    reel_sha256_buf("abc", 3, hex);
    ck_assert_str_eq(hex, SHA_ABC);
    reel_sha256_buf("", 0, hex);
    ck_assert_str_eq(hex, SHA_EMPTY);
    char path[] = "/tmp/reel-test-sha-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "abc", 3), 3);
    ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
    ck_assert_int_eq(reel_sha256_fd(fd, hex), 0);
    ck_assert_str_eq(hex, SHA_ABC);
    close(fd);
    ck_assert_int_eq(reel_sha256_file(path, hex), 0);
    ck_assert_str_eq(hex, SHA_ABC);
    const void *parts[2] = { "a", "bc" };
    const size_t lens[2] = { 1, 2 };
    reel_sha256_parts(parts, lens, 2, hex);
    ck_assert_str_eq(hex, SHA_ABC);
    ck_assert_int_eq(reel_sha256_file("/nonexistent/x", hex), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "/nonexistent/x"));
    unlink(path);
}
END_TEST

static wire_tensor_t sync_t[2];

static void sync_msg(msg_sync_t *m, const char *component, const char *sha, const char *path) {
    memset(m, 0, sizeof *m);
    snprintf(m->component, sizeof m->component, "%s", component);
    m->version = 2;
    snprintf(m->sha256, sizeof m->sha256, "%s", sha);
    if (path) snprintf(m->path, sizeof m->path, "%s", path);
}

static void add_tensor(msg_sync_t *m, const char *name, kern_dtype_t dt, int ndim, const int64_t *shape, const void *data) {
    tensor(&sync_t[m->n_tensors], name, dt, ndim, shape, data);
    m->tensors[m->n_tensors] = &sync_t[m->n_tensors];
    m->n_tensors++;
}

/* A weights root of its own per test (the fixture), and what a read said:
 * the answer (the error value's message) and the detail for the log. */
static char root[64];
static wrk_roots_t roots;
static char wire[MSG_REASON_MAX], detail[512];
static atomic_bool stop_flag;

static void setup_root(void) {
    setup_tiny();
    ts_mkdtemp(root, sizeof root, "test-root");
    memset(&roots, 0, sizeof roots);
    ck_assert_int_eq(wrk_roots_add(&roots, root), 0);
    atomic_store(&stop_flag, false);
}

static void teardown_root(void) {
    ck_assert_int_eq(ts_rmtree(root), 0);
}

static const char *in_root(const char *name) {
    static char p[4][256];
    static int i;
    i = (i + 1) % 4;
    snprintf(p[i], sizeof p[i], "%s/%s", root, name);
    return p[i];
}

/* wrk_sync_read of m under the test's root. */
static int sread(const msg_sync_t *m, st_file_t **f, char hex[65]) {
    reel_err_clear();
    int rc = wrk_sync_read(m, &tiny, &roots, NULL, &stop_flag, f, hex);
    snprintf(wire, sizeof wire, "%s", rc == 0 ? "" : reel_err()->msg);
    snprintf(detail, sizeof detail, "%s", rc == 0 ? "" : reel_err()->detail);
    return rc;
}

/* SYNC of `path`, read under the root: what the ack would carry. */
static const char *sync_answer(const char *path) {
    msg_sync_t m;
    st_file_t *f = NULL;
    char hex[65];
    sync_msg(&m, "transformer", SHA_ABC, path);
    int rc = sread(&m, &f, hex);
    st_close(&f);
    return rc == 0 ? "ok" : wire;
}

START_TEST(test_sync_weights_by_path_are_hashed_over_the_file_bytes) {
    const char *path = in_root("w.safetensors");
    ck_assert_int_eq(tdit_weights_init(&tiny, 7, path), 0);
    char want[65], hex[65];
    ck_assert_int_eq(reel_sha256_file(path, want), 0);

    msg_sync_t m;
    sync_msg(&m, "transformer", SHA_ABC, path);
    st_file_t *f = NULL;
    ck_assert_msg(sread(&m, &f, hex) == 0, "%s", detail);
    ck_assert_str_eq(hex, want);
    ck_assert_str_eq(st_meta(f, "config"), "tiny");
    st_close(&f);

    sync_msg(&m, "transformer", SHA_ABC, "/nonexistent/w.safetensors");
    ck_assert_int_eq(sread(&m, &f, hex), -1);
    ck_assert_str_eq(wire, WRK_E_PATH);
    ck_assert_ptr_nonnull(strstr(detail, "/nonexistent/w.safetensors")); /* the log says which */
}
END_TEST

START_TEST(test_a_path_outside_the_weights_directories_is_refused_by_its_text_alone) {
    /* Before: "/etc/passwd: header length 8386093285548486514 is absurd"
     * went back to the trainer: the file's first eight bytes. */
    ck_assert_str_eq(sync_answer("/etc/passwd"), WRK_E_PATH);
    ck_assert_str_eq(sync_answer("relative/w.safetensors"), WRK_E_PATH);
    ck_assert_str_eq(sync_answer(root), WRK_E_PATH); /* the root itself is no file */
    char p[300];
    snprintf(p, sizeof p, "%s/../../etc/passwd", root);
    ck_assert_str_eq(sync_answer(p), WRK_E_PATH);
    snprintf(p, sizeof p, "%s/./w.safetensors", root);
    ck_assert_str_eq(sync_answer(p), WRK_E_PATH);
    snprintf(p, sizeof p, "%s//w.safetensors", root);
    ck_assert_str_eq(sync_answer(p), WRK_E_PATH);
    snprintf(p, sizeof p, "%sx/w.safetensors", root); /* a sibling sharing the prefix */
    ck_assert_str_eq(sync_answer(p), WRK_E_PATH);
    ck_assert_ptr_null(strstr(wire, "root:"));
}
END_TEST

START_TEST(test_a_symlink_anywhere_below_a_root_is_never_followed) {
    ck_assert_int_eq(tdit_weights_init(&tiny, 7, in_root("real.safetensors")), 0);
    ck_assert_int_eq(symlink("/etc/passwd", in_root("passwd.safetensors")), 0);
    ck_assert_int_eq(symlink(in_root("real.safetensors"), in_root("alias.safetensors")), 0);
    ck_assert_int_eq(symlink("/etc", in_root("etc")), 0);
    ck_assert_int_eq(mkdir(in_root("sub"), 0700), 0);
    ck_assert_int_eq(symlink(root, in_root("sub/up")), 0);
    ck_assert_str_eq(sync_answer(in_root("passwd.safetensors")), WRK_E_FILE);
    ck_assert_ptr_nonnull(strstr(detail, "symlinks are not followed"));
    ck_assert_str_eq(sync_answer(in_root("alias.safetensors")), WRK_E_FILE); /* even to a good file */
    ck_assert_str_eq(sync_answer(in_root("etc/passwd")), WRK_E_FILE);
    ck_assert_str_eq(sync_answer(in_root("sub/up/real.safetensors")), WRK_E_FILE);
    ck_assert_str_eq(sync_answer(in_root("real.safetensors")), "ok");
    /* A root named through a symlink is the operator's choice: it works. */
    char via[128];
    snprintf(via, sizeof via, "%s-link", root);
    unlink(via);
    ck_assert_int_eq(symlink(root, via), 0);
    wrk_roots_t r2;
    memset(&r2, 0, sizeof r2);
    ck_assert_int_eq(wrk_roots_add(&r2, via), 0);
    char p[200], hex[65];
    snprintf(p, sizeof p, "%s/real.safetensors", via);
    msg_sync_t m;
    st_file_t *f = NULL;
    sync_msg(&m, "transformer", SHA_ABC, p);
    ck_assert_int_eq(wrk_sync_read(&m, &tiny, &r2, NULL, NULL, &f, hex), 0);
    st_close(&f);
    unlink(via);
}
END_TEST

START_TEST(test_a_fifo_or_a_device_below_a_root_is_refused_without_blocking) {
    /* Before: the sync thread blocked in open() on the FIFO for good, and
     * SIGTERM could not stop the worker. */
    ck_assert_int_eq(mkfifo(in_root("fifo.safetensors"), 0600), 0);
    ck_assert_int_eq(symlink("/dev/zero", in_root("zero.safetensors")), 0);
    time_t t0 = time(NULL);
    ck_assert_str_eq(sync_answer(in_root("fifo.safetensors")), WRK_E_FILE);
    ck_assert_ptr_nonnull(strstr(detail, "not a regular file"));
    ck_assert_str_eq(sync_answer(in_root("zero.safetensors")), WRK_E_FILE);
    ck_assert_str_eq(sync_answer("/dev/zero"), WRK_E_PATH);
    ck_assert_int_le(time(NULL) - t0, 1);
}
END_TEST

START_TEST(test_missing_unreadable_and_junk_files_get_one_answer_that_tells_nothing) {
    FILE *fp = fopen(in_root("passwd.safetensors"), "w");
    ck_assert_ptr_nonnull(fp);
    fputs("root:x:0:0:root:/root:/bin/bash\n", fp);
    fclose(fp);
    ck_assert_int_eq(mkdir(in_root("dir.safetensors"), 0700), 0);
    const char *names[] = { "missing.safetensors", "passwd.safetensors", "dir.safetensors" };
    for (size_t i = 0; i < 3; i++) {
        ck_assert_str_eq(sync_answer(in_root(names[i])), WRK_E_FILE);
        ck_assert_ptr_null(strstr(wire, "root"));
        ck_assert_ptr_null(strstr(wire, names[i]));
    }
}
END_TEST

/* A file with a valid header for a tiny model whose data is `data_len`
 * bytes, made sparse (nothing written past the header). */
static void sparse_weights(const char *path, uint64_t data_len) {
    int64_t n = tdit_config_params(&tiny);
    char hdr[256];
    int hl = snprintf(hdr, sizeof hdr, "{\"w\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[0,%llu]}}",
                      (long long)(data_len / 4), (unsigned long long)(data_len / 4 * 4));
    (void)n;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    ck_assert_int_eq(write(fd, len8, 8), 8);
    ck_assert_int_eq(write(fd, hdr, (size_t)hl), hl);
    ck_assert_int_eq(ftruncate(fd, (off_t)(8 + (uint64_t)hl + data_len)), 0);
    close(fd);
}

START_TEST(test_a_huge_sparse_file_is_refused_by_its_size_before_a_byte_is_hashed) {
    /* Before: a 50 GiB sparse file was hashed whole (a core for minutes)
     * and every later sync timed out behind it. */
    sparse_weights(in_root("huge.safetensors"), (uint64_t)50 << 30);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ck_assert_str_eq(sync_answer(in_root("huge.safetensors")), WRK_E_MODEL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    ck_assert_ptr_nonnull(strstr(detail, "more than the model's"));
    /* Judged by the size, not hashed: milliseconds. The bound is 10 s, not
     * 0.5 s, so that a busy machine under TSan cannot stall it past; hashing
     * 50 GiB (sha256 at a few GB/s at best) takes longer than that. */
    ck_assert_int_lt((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000, 10000);
    /* ...and one too small to hold the model, too. */
    sparse_weights(in_root("small.safetensors"), 64);
    ck_assert_str_eq(sync_answer(in_root("small.safetensors")), WRK_E_MODEL);
    /* A header longer than the file. */
    int fd = open(in_root("short.safetensors"), O_WRONLY | O_CREAT, 0600);
    ck_assert_int_eq(write(fd, "\xff\xff\x00\x00\x00\x00\x00\x00{}", 10), 10);
    close(fd);
    ck_assert_str_eq(sync_answer(in_root("short.safetensors")), WRK_E_FILE);
}
END_TEST

/* The tiny weights as a Wan2.1 release sharded in two, in folder rel of
 * the root: Wan's names, no Reel metadata, the index, Wan's config.json
 * (config NULL: none; else its text). */
static void write_release(const char *rel, const char *config) {
    char src_path[256], p[300], idx[8192] = "{\"weight_map\":{";
    snprintf(src_path, sizeof src_path, "%s", in_root("release-src.safetensors"));
    if (access(src_path, F_OK) != 0) ck_assert_int_eq(tdit_weights_init(&tiny, 7, src_path), 0);
    ck_assert_int_eq(mkdir(in_root(rel), 0700), 0);
    st_file_t *src = st_open(src_path);
    ck_assert_ptr_nonnull(src);
    st_writer_t *w[2] = { st_writer_new(), st_writer_new() };
    size_t n = st_count(src);
    for (size_t i = 0; i < n; i++) {
        const st_tensor_t *t = st_at(src, i);
        int s = i < n / 2 ? 0 : 1;
        ck_assert_int_eq(st_writer_add(w[s], t->name, t->dtype, t->ndim, t->shape, t->data), 0);
        snprintf(idx + strlen(idx), sizeof idx - strlen(idx), "%s\"%s\":\"part-%d.safetensors\"", i ? "," : "",
                 t->name, s + 1);
    }
    strcat(idx, "}}");
    for (int s = 0; s < 2; s++) {
        snprintf(p, sizeof p, "%s/%s/part-%d.safetensors", root, rel, s + 1);
        ck_assert_int_eq(st_writer_save(w[s], p), 0);
        st_writer_destroy(&w[s]);
    }
    snprintf(p, sizeof p, "%s/%s/diffusion_pytorch_model.safetensors.index.json", root, rel);
    FILE *f = fopen(p, "w");
    fputs(idx, f);
    fclose(f);
    if (config) {
        snprintf(p, sizeof p, "%s/%s/config.json", root, rel);
        f = fopen(p, "w");
        fputs(config, f);
        fclose(f);
    }
    st_close(&src);
}

static const char *tiny_wan_config =
    "{\"_class_name\":\"WanModel\",\"dim\":64,\"eps\":1e-06,\"ffn_dim\":128,\"freq_dim\":256,\"in_dim\":4,"
    "\"model_type\":\"t2v\",\"num_heads\":4,\"num_layers\":2,\"out_dim\":4,\"text_dim\":32,\"text_len\":512}";

START_TEST(test_a_sync_by_path_may_name_a_release_folder_or_its_index_judged_like_a_file) {
    write_release("rel", tiny_wan_config);
    wan_ckpt_t *c = wan_ckpt_open(in_root("rel"), &(wan_opts_t){ .no_data = true });
    TS_NEW(c);
    const char *paths[] = { in_root("rel"), in_root("rel/diffusion_pytorch_model.safetensors.index.json") };
    for (int i = 0; i < 2; i++) {
        msg_sync_t m;
        st_file_t *f = NULL;
        char hex[65];
        sync_msg(&m, "transformer", SHA_ABC, paths[i]);
        ck_assert_msg(sread(&m, &f, hex) == 0, "%s: %s (%s)", paths[i], detail, wire);
        ck_assert_str_eq(hex, wan_ckpt_identity(c)); /* the index's bytes, then each shard's digest */
        ck_assert_str_eq(st_meta(f, "config"), "tiny");
        ck_assert_str_eq(st_meta(f, "text_len"), "512");
        ck_assert_ptr_nonnull(st_find(f, "blocks.1.cross_attn.norm_k.weight"));
        ck_assert_int_eq(wrk_weights_finite(f), 0);
        st_close(&f);
    }
    wan_ckpt_destroy(&c);
    /* one shard alone is not the model; a raw whole file without config.json
     * is judged against the running one */
    ck_assert_str_eq(sync_answer(in_root("rel/part-1.safetensors")), WRK_E_MODEL);
    ck_assert_ptr_nonnull(strstr(detail, "missing tensor"));
    ck_assert_int_eq(mkdir(in_root("raw"), 0700), 0);
    st_file_t *src = st_open(in_root("release-src.safetensors"));
    st_writer_t *w = st_writer_new();
    for (size_t i = 0; i < st_count(src); i++) {
        const st_tensor_t *t = st_at(src, i);
        st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    ck_assert_int_eq(st_writer_save(w, in_root("raw/diffusion_pytorch_model.safetensors")), 0);
    st_writer_destroy(&w);
    st_close(&src);
    ck_assert_str_eq(sync_answer(in_root("raw")), "ok");
    ck_assert_str_eq(sync_answer(in_root("raw/diffusion_pytorch_model.safetensors")), "ok");
}
END_TEST

START_TEST(test_a_release_folder_is_read_under_the_roots_rules_shard_by_shard) {
    /* a shard through a symlink, even to a good file below the root */
    write_release("link", tiny_wan_config);
    ck_assert_int_eq(rename(in_root("link/part-2.safetensors"), in_root("part-2.safetensors")), 0);
    ck_assert_int_eq(symlink(in_root("part-2.safetensors"), in_root("link/part-2.safetensors")), 0);
    ck_assert_str_eq(sync_answer(in_root("link")), WRK_E_FILE);
    ck_assert_ptr_nonnull(strstr(detail, "symlinks are not followed"));
    /* config.json through a symlink */
    write_release("cfglink", NULL);
    FILE *f = fopen(in_root("config.json"), "w");
    fputs(tiny_wan_config, f);
    fclose(f);
    ck_assert_int_eq(symlink(in_root("config.json"), in_root("cfglink/config.json")), 0);
    ck_assert_str_eq(sync_answer(in_root("cfglink")), WRK_E_FILE);
    /* a folder reached through a symlink */
    ck_assert_int_eq(symlink(in_root("link"), in_root("alias")), 0);
    ck_assert_str_eq(sync_answer(in_root("alias")), WRK_E_FILE);
    /* an index reaching out of its folder */
    write_release("out", tiny_wan_config);
    f = fopen(in_root("out/diffusion_pytorch_model.safetensors.index.json"), "w");
    fputs("{\"weight_map\":{\"patch_embedding.weight\":\"../release-src.safetensors\"}}", f);
    fclose(f);
    ck_assert_str_eq(sync_answer(in_root("out")), WRK_E_FILE);
    ck_assert_ptr_nonnull(strstr(detail, "not a file in the index's folder"));
    ck_assert_ptr_null(strstr(wire, "release-src"));
}
END_TEST

START_TEST(test_a_release_of_another_model_is_not_weights_of_this_worker) {
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s", tiny_wan_config);
    memcpy(strstr(cfg, "\"t2v\""), "\"i2v\"", 5);
    write_release("i2v", cfg);
    ck_assert_str_eq(sync_answer(in_root("i2v")), WRK_E_MODEL);
    ck_assert_ptr_nonnull(strstr(detail, "model_type 'i2v'"));
    snprintf(cfg, sizeof cfg, "%s", tiny_wan_config);
    memcpy(strstr(cfg, "\"num_layers\":2"), "\"num_layers\":3", 14);
    write_release("deeper", cfg);
    ck_assert_str_eq(sync_answer(in_root("deeper")), WRK_E_MODEL);
    ck_assert_ptr_nonnull(strstr(detail, "does not match the resident tiny"));
    ck_assert_int_eq(mkdir(in_root("nothing"), 0700), 0);
    ck_assert_str_eq(sync_answer(in_root("nothing")), WRK_E_FILE);
}
END_TEST

static void *stop_later(void *arg) {
    (void)arg;
    struct timespec ts = { 0, 50 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    atomic_store(&stop_flag, true);
    return NULL;
}

START_TEST(test_a_stop_ends_a_weights_read_within_a_chunk) {
    /* No size bound here (as for --weights at startup): a 1 GiB read
     * that the worker's stop must cut short. */
    sparse_weights(in_root("big.safetensors"), (uint64_t)1 << 30);
    int fd = open(in_root("big.safetensors"), O_RDONLY);
    ck_assert_int_ge(fd, 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, stop_later, NULL), 0);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    char hex[65];
    st_file_t *f = wrk_weights_read(fd, "big.safetensors", 0, &stop_flag, hex);
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(th, NULL);
    close(fd);
    ck_assert_ptr_null(f);
    ck_assert_str_eq(reel_err()->msg, WRK_E_STOPPED);
    ck_assert_int_eq(reel_err_code(), REEL_E_STATE);
    /* A bound only against a hang: wall time is no measure under the
     * sanitizers (TSan took 2 s here to map the 1 GiB buffer alone). */
    ck_assert_int_lt((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000, 60000);
    /* Stopped before the read starts: the first chunk's hook ends it. */
    atomic_store(&stop_flag, true);
    fd = open(in_root("big.safetensors"), O_RDONLY);
    ck_assert_int_ge(fd, 0);
    reel_err_clear();
    f = wrk_weights_read(fd, "big.safetensors", 0, &stop_flag, hex);
    close(fd);
    ck_assert_ptr_null(f);
    ck_assert_str_eq(reel_err()->msg, WRK_E_STOPPED);
}
END_TEST

START_TEST(test_inline_sync_weights_are_hashed_over_the_frames_in_order) {
    static const float a[4] = { 1, 2, 3, 4 };
    static const uint16_t b[2] = { 0x3f80, 0x4000 };
    const int64_t sa[2] = { 2, 2 }, sb[1] = { 2 };
    msg_sync_t m;
    sync_msg(&m, "transformer", SHA_ABC, NULL);
    add_tensor(&m, "blocks.0.a", KERN_F32, 2, sa, a);
    add_tensor(&m, "blocks.0.b", KERN_BF16, 1, sb, b);
    unsigned char cat[sizeof a + sizeof b];
    memcpy(cat, a, sizeof a);
    memcpy(cat + sizeof a, b, sizeof b);
    char want[65], hex[65];
    reel_sha256_buf(cat, sizeof cat, want);
    st_file_t *f = NULL;
    ck_assert_int_eq(sread(&m, &f, hex), 0);
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
}
END_TEST

START_TEST(test_a_sync_with_bad_fields_is_refused_with_a_reason) {
    msg_sync_t m;
    st_file_t *f = NULL;
    char hex[65];
    sync_msg(&m, "vae", SHA_ABC, "/tmp/x");
    ck_assert_int_eq(sread(&m, &f, hex), -1);
    ck_assert_ptr_nonnull(strstr(wire, "unknown component 'vae'"));
    sync_msg(&m, "transformer", SHA_ABC, NULL);
    ck_assert_int_eq(sread(&m, &f, hex), -1);
    ck_assert_ptr_nonnull(strstr(wire, "neither"));
    static const float a[1] = { 1 };
    const int64_t sa[1] = { 1 };
    sync_msg(&m, "transformer", SHA_ABC, "/tmp/x");
    add_tensor(&m, "a", KERN_F32, 1, sa, a);
    ck_assert_int_eq(sread(&m, &f, hex), -1);
    ck_assert_ptr_nonnull(strstr(wire, "give one of"));
    ck_assert_ptr_null(f);
}
END_TEST

START_TEST(test_weights_directories_and_keys_are_options) {
    wrk_opts_t o;
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--weights-dir", "/srv/a", "--weights-dir",
                      "/srv/b", "--key", "w0.key", "--broker-key", "broker.pub", NULL), 0);
    ck_assert_int_eq(o.n_weights_dirs, 2);
    ck_assert_str_eq(o.weights_dirs[1], "/srv/b");
    ck_assert_str_eq(o.key, "w0.key");
    ck_assert_str_eq(o.broker_key, "broker.pub");
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--weights-dir", "rel", NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "absolute"));
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", NULL), 0);
    ck_assert_int_eq(o.n_weights_dirs, 0); /* run() then roots at the directory of --weights */
    ck_assert_ptr_null(o.key);
}
END_TEST

/* --no-fallback makes an unusable CUDA device an exit instead of the CPU;
 * it means nothing without --backend cuda, so it is refused there. */
START_TEST(test_no_fallback_is_an_option_of_the_cuda_backend_only) {
    wrk_opts_t o;
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", NULL), 0);
    ck_assert(!o.no_fallback);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--backend", "cuda", "--no-fallback", NULL), 0);
    ck_assert(o.no_fallback);
    ck_assert_int_eq(o.backend, KERN_BACKEND_CUDA);
    ck_assert_int_eq(parse(&o, "--name", "w0", "--weights", "w.st", "--no-fallback", NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err()->msg, "--backend cuda"));
}
END_TEST

/* ---- weights by value: a fetch that resumes ------------------------------------ */

/* A safetensors file of one F32 tensor of n floats, in memory (malloc'd). */
static unsigned char *st_bytes(size_t n, size_t *len) {
    char hdr[128];
    int hl = snprintf(hdr, sizeof hdr, "{\"w\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}", n,
                      n * 4);
    while (hl % 8) hdr[hl++] = ' ';
    *len = 8 + (size_t)hl + n * 4;
    unsigned char *b = malloc(*len);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, (size_t)hl);
    float *f = (float *)(b + 8 + hl);
    for (size_t i = 0; i < n; i++) f[i] = (float)(i % 1000) * 0.5f;
    return b;
}

typedef struct {
    wrk_fetch_src_t src;
    msg_sync_t m;
    atomic_bool stop, done;
    uint64_t max_data;           /* the model's data bytes; 0: no limit */
    st_file_t *out;
    char hex[65], wire[REEL_ERR_MSG], err[REEL_ERR_DETAIL];
} fetch_job_t;

static void *fetch_thread(void *arg) {
    fetch_job_t *j = arg;
    j->out = wrk_fetch(&j->src, &j->m, j->max_data, &j->stop, j->hex);
    if (!j->out) { /* the error value is this thread's */
        snprintf(j->wire, sizeof j->wire, "%s", reel_err()->msg);
        snprintf(j->err, sizeof j->err, "%s", reel_err()->detail);
    }
    atomic_store(&j->done, true);
    return NULL;
}

/* Starts *j's fetch of v2 of file (len bytes, by its sha256) from the
 * broker at ep on its own thread (*th). */
static void fetch_start(fetch_job_t *j, pthread_t *th, void *ctx, const char *ep, const unsigned char *file, size_t len,
                        uint64_t max_data, unsigned *reasked) {
    memset(j, 0, sizeof *j);
    j->src = (wrk_fetch_src_t){ ctx, ep, NULL, NULL, reasked };
    snprintf(j->m.component, sizeof j->m.component, "transformer");
    j->m.version = 2;
    j->m.uploaded = true;
    reel_sha256_buf(file, len, j->m.sha256);
    j->max_data = max_data;
    atomic_init(&j->stop, false);
    atomic_init(&j->done, false);
    ck_assert_int_eq(pthread_create(th, NULL, fetch_thread, j), 0);
}

/* Closes the fake broker's socket and context and removes dir (and its
 * ipc socket file "b"). */
/* A fake broker: a folder made from the template dir, a ROUTER bound at
 * ipc://DIR/b (its endpoint in ep), in a context of its own (*ctx). Closed
 * by fake_broker_close. */
static void *fake_broker_open(char *dir, char *ep, size_t ep_len, void **ctx) {
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(ep, ep_len, "ipc://%s/b", dir);
    ck_assert_ptr_nonnull(*ctx = zmq_ctx_new());
    void *r = zmq_socket(*ctx, ZMQ_ROUTER);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(zmq_bind(r, ep), 0);
    return r;
}

static void fake_broker_close(void *r, void *ctx, const char *dir) {
    int zero = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(r);
    zmq_ctx_term(ctx);
    char sock[96];
    snprintf(sock, sizeof sock, "%s/b", dir);
    unlink(sock);
    rmdir(dir);
}

/* The next FETCH on a fake broker's ROUTER within ms: 1 with *q and the
 * asker's routing id in *who (zmq_msg_close it), 0 when none came. */
static int next_fetch(void *r, int ms, msg_fetch_t *q, zmq_msg_t *who, uint64_t *id) {
    zmq_pollitem_t it = { r, 0, ZMQ_POLLIN, 0 };
    if (zmq_poll(&it, 1, ms) <= 0) return 0;
    wire_msg_t m;
    wire_err_t e;
    ck_assert_int_eq(msg_recv(r, true, 0, &m, &e), 0);
    ck_assert_str_eq(m.type, "FETCH");
    ck_assert_int_eq(msg_fetch_decode(&m, q, &e), 0);
    *id = m.id;
    zmq_msg_init(who);
    zmq_msg_copy(who, &m.identity);
    wire_msg_close(&m);
    return 1;
}

/* The fake broker's FETCH_DATA of file[offset, offset + 4 MiB). */
static void answer_fetch(void *r, zmq_msg_t *who, uint64_t id, const unsigned char *file, size_t len,
                         uint64_t offset) {
    size_t n = offset >= len ? 0 : len - offset < MSG_CHUNK_MAX ? len - offset : MSG_CHUNK_MAX;
    wire_tensor_t t = msg_chunk(file + (offset < len ? offset : len), n);
    msg_fetch_data_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.component, sizeof d.component, "transformer");
    d.version = 2;
    d.offset = offset;
    d.size = len;
    d.chunk = &t;
    ck_assert_int_eq(msg_send(r, who, MSG_FETCH_DATA, id, &d, NULL), 0);
}

/* A broker that dies with FETCHes in flight and comes back at the same
 * endpoint: the worker's fetch hears nothing for WRK_FETCH_RESEND_MS,
 * asks again for the chunk it needs next (not the file from its start),
 * fills its window again from the answer on, drops a chunk answered
 * twice, and ends with the whole file, its sha256 right. */
/* The pipe's forward: a message whose tensors are a MiB or more goes after
 * a HEARTBEAT saying how large (nothing else of the worker's reaches the
 * broker until it has: docs/PROTOCOL.md "incoming"); a small one goes
 * bare; either arrives whole and unchanged. */
START_TEST(test_a_large_message_from_the_streams_is_announced_to_the_broker) {
    void *zctx = zmq_ctx_new();
    void *pull = wrk_pipe_pull_new(zctx), *push = wrk_pipe_push_new(zctx);
    void *router = zmq_socket(zctx, ZMQ_ROUTER), *out = zmq_socket(zctx, ZMQ_DEALER);
    ck_assert_ptr_nonnull(pull);
    ck_assert_ptr_nonnull(push);
    ck_assert_int_eq(zmq_bind(router, "inproc://heads-up"), 0);
    ck_assert_int_eq(zmq_connect(out, "inproc://heads-up"), 0);
    const size_t sizes[2] = { 1000, (size_t)2 << 20 };
    for (int k = 0; k < 2; k++) {
        char *big = calloc(1, sizes[k]);
        ck_assert_ptr_nonnull(big);
        big[sizes[k] - 1] = 42;
        wrk_pipe_tag_t tag = { 0 };
        ck_assert_int_eq(zmq_send(push, &tag, sizeof tag, ZMQ_SNDMORE), (int)sizeof tag);
        ck_assert_int_eq(zmq_send(push, "head", 4, ZMQ_SNDMORE), 4);
        ck_assert_int_eq(zmq_send(push, big, sizes[k], 0), (int)sizes[k]);
        ck_assert_int_eq(wrk_pipe_forward(pull, out, 1, 0, NULL), 1);
        wire_msg_t m;
        wire_err_t err;
        memset(&m, 0, sizeof m);
        if (k == 1) { /* first the announcement */
            ck_assert_int_eq(msg_recv(router, true, 0, &m, &err), 0);
            ck_assert_str_eq(m.type, "HEARTBEAT");
            ck_assert_uint_eq(msg_heartbeat_incoming(&m), sizes[k]);
            wire_msg_close(&m);
        }
        zmq_msg_t f;
        zmq_msg_init(&f);
        ck_assert_int_ge(zmq_msg_recv(&f, router, 0), 1); /* the routing id */
        ck_assert_int_eq(zmq_msg_recv(&f, router, 0), 4);
        ck_assert(!memcmp(zmq_msg_data(&f), "head", 4));
        ck_assert_int_eq(zmq_msg_recv(&f, router, 0), (int)sizes[k]);
        ck_assert_int_eq(((char *)zmq_msg_data(&f))[sizes[k] - 1], 42);
        ck_assert(!zmq_msg_more(&f));
        zmq_msg_close(&f);
        free(big);
    }
    zmq_close(push);
    zmq_close(pull);
    zmq_close(router);
    zmq_close(out);
    zmq_ctx_term(zctx);
}
END_TEST

START_TEST(test_a_fetch_resumes_where_it_stopped_when_the_broker_comes_back) {
    char dir[] = "/tmp/reel-fetch.XXXXXX", ep[64];
    void *ctx, *r = fake_broker_open(dir, ep, sizeof ep, &ctx);
    size_t len;
    unsigned char *file = st_bytes((size_t)5 << 20, &len); /* 20 MiB: 6 chunks */
    fetch_job_t j;
    unsigned reasked = 99;
    pthread_t th;
    fetch_start(&j, &th, ctx, ep, file, len, 0, &reasked);
    /* the first broker: the window of 4 comes; it answers the second
     * before the first (dropped: not the chunk needed next, though the
     * first to come), then the first, and dies */
    msg_fetch_t q;
    zmq_msg_t who;
    uint64_t id, offs[4];
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(next_fetch(r, 5000, &q, &who, &id), 1);
        offs[i] = q.offset;
        if (i == 0) {
            answer_fetch(r, &who, id, file, len, MSG_CHUNK_MAX);
            answer_fetch(r, &who, id, file, len, q.offset);
        }
        zmq_msg_close(&who);
    }
    ck_assert_uint_eq(offs[0], 0);
    ck_assert_uint_eq(offs[3], 3 * MSG_CHUNK_MAX);
    /* the answer to chunk 0 asked for chunk 4 */
    ck_assert_int_eq(next_fetch(r, 5000, &q, &who, &id), 1);
    ck_assert_uint_eq(q.offset, 4 * MSG_CHUNK_MAX);
    zmq_msg_close(&who);
    int zero = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(r);
    /* the broker back at the same endpoint: the first FETCH it hears is
     * the chunk the file needs next, asked again */
    r = zmq_socket(ctx, ZMQ_ROUTER);
    ck_assert_int_eq(zmq_bind(r, ep), 0);
    ck_assert_int_eq(next_fetch(r, WRK_FETCH_RESEND_MS + 5000, &q, &who, &id), 1);
    ck_assert_uint_eq(q.offset, MSG_CHUNK_MAX);
    answer_fetch(r, &who, id, file, len, q.offset);
    answer_fetch(r, &who, id, file, len, q.offset); /* twice: the second is dropped */
    zmq_msg_close(&who);
    /* then its window again, each FETCH answered, to the end: nothing
     * from the start again (a slow run, under a sanitizer, may ask again
     * for a chunk whose answer is late: that is allowed) */
    uint64_t lowest = UINT64_MAX;
    int asked = 0;
    while (!atomic_load(&j.done) && next_fetch(r, 3000, &q, &who, &id)) {
        if (q.offset < lowest) lowest = q.offset;
        asked++;
        answer_fetch(r, &who, id, file, len, q.offset);
        zmq_msg_close(&who);
    }
    ck_assert_uint_ge(lowest, MSG_CHUNK_MAX);
    pthread_join(th, NULL);
    ck_assert_msg(j.out != NULL, "%s (%s)", j.err, j.wire);
    ck_assert_str_eq(j.hex, j.m.sha256);
    ck_assert_uint_ge(reasked, 1);
    ck_assert_int_ge(asked, 4); /* chunks 2..5 */
    const st_tensor_t *t = st_find(j.out, "w");
    ck_assert_ptr_nonnull(t);
    ck_assert(memcmp(t->data, file + len - ((size_t)5 << 22), (size_t)5 << 22) == 0);
    st_close(&j.out);
    fake_broker_close(r, ctx, dir);
    free(file);
}
END_TEST

/* A broker that holds too many of the connection's answers on their way
 * answers a FETCH ERROR busy (docs/PROTOCOL.md "Weights by value": ask
 * again later): the fetch asks again for the chunk it needs next and ends
 * with the whole file. It used to fail at the first busy ("the broker
 * answered busy"), so a sync by value failed on a busy broker. */
START_TEST(test_a_fetch_answered_busy_asks_again_and_completes) {
    char dir[] = "/tmp/reel-fetch-busy.XXXXXX", ep[64];
    void *ctx, *r = fake_broker_open(dir, ep, sizeof ep, &ctx);
    size_t len;
    unsigned char *file = st_bytes((size_t)3 << 20, &len); /* 12 MiB: 4 chunks */
    fetch_job_t j;
    unsigned reasked = 99;
    pthread_t th;
    fetch_start(&j, &th, ctx, ep, file, len, 0, &reasked);
    msg_fetch_t q;
    zmq_msg_t who;
    uint64_t id;
    int n = 0, busy = 0;
    while (!atomic_load(&j.done) && next_fetch(r, 5000, &q, &who, &id)) {
        if (n++ < 2) { /* the first two: busy */
            ck_assert_int_eq(msg_send_error(r, &who, id, WIRE_E_BUSY, "too many answers on their way"), 0);
            busy++;
        } else {
            answer_fetch(r, &who, id, file, len, q.offset);
        }
        zmq_msg_close(&who);
    }
    pthread_join(th, NULL);
    ck_assert_int_eq(busy, 2);
    ck_assert_msg(j.out != NULL, "%s (%s)", j.err, j.wire);
    ck_assert_str_eq(j.hex, j.m.sha256);
    ck_assert_uint_ge(reasked, 1);
    st_close(&j.out);
    fake_broker_close(r, ctx, dir);
    free(file);
}
END_TEST

/* An uploaded file is judged as one read by path: more data than the
 * model holds (here 4 bytes more, beside a header that fits) is refused
 * with the generic "not weights of this worker's model" as soon as the
 * first chunk told the header's length, the rest never asked for past
 * the first window; a file that fits is taken whole. */
START_TEST(test_an_uploaded_file_with_more_data_than_the_model_is_refused_at_its_header) {
    char dir[] = "/tmp/reel-fetch-max.XXXXXX", ep[64];
    void *ctx, *r = fake_broker_open(dir, ep, sizeof ep, &ctx);
    size_t len, n = (size_t)3 << 20; /* 12 MiB of data: 3 chunks and a bit */
    unsigned char *file = st_bytes(n, &len);
    for (int fits = 0; fits < 2; fits++) {
        fetch_job_t j;
        pthread_t th;
        fetch_start(&j, &th, ctx, ep, file, len, fits ? n * 4 : n * 4 - 4, NULL);
        msg_fetch_t q;
        zmq_msg_t who;
        uint64_t id;
        int asked = 0;
        while (!atomic_load(&j.done) && next_fetch(r, 3000, &q, &who, &id)) {
            asked++;
            answer_fetch(r, &who, id, file, len, q.offset);
            zmq_msg_close(&who);
        }
        pthread_join(th, NULL);
        if (fits) {
            ck_assert_msg(j.out != NULL, "%s (%s)", j.err, j.wire);
            ck_assert_str_eq(j.hex, j.m.sha256);
            st_close(&j.out);
        } else {
            ck_assert_ptr_null(j.out);
            ck_assert_str_eq(j.wire, WRK_E_MODEL);
            ck_assert_msg(strstr(j.err, "more than the model's"), "%s", j.err);
            ck_assert_int_le(asked, WRK_FETCH_WINDOW);
        }
    }
    fake_broker_close(r, ctx, dir);
    free(file);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("worker_unit");
    TCase *t = tcase_create("opts");
    tcase_add_test(t, test_options_default_to_the_documented_values);
    tcase_add_test(t, test_unknown_flags_and_missing_required_options_are_usage_errors);
    tcase_add_test(t, test_byte_counts_take_binary_suffixes_and_reject_junk);
    tcase_add_test(t, test_weights_directories_and_keys_are_options);
    tcase_add_test(t, test_no_fallback_is_an_option_of_the_cuda_backend_only);
    tcase_add_test(t, test_prewarm_takes_0_to_64_keys_and_defaults_to_8);
    tcase_add_test(t, test_a_claimed_prewarm_key_leaves_the_rest_in_order);
    suite_add_tcase(s, t);
    t = tcase_create("events");
    tcase_add_test(t, test_repeated_declines_of_a_key_and_reason_become_one_event_with_a_count);
    tcase_add_test(t, test_a_capture_between_declines_keeps_the_key_lifecycle_in_order);
    tcase_add_test(t, test_a_capture_event_says_whether_a_demand_or_a_prewarm_asked_for_it);
    tcase_add_test(t, test_replays_are_counted_per_key_and_stream);
    tcase_add_test(t, test_events_report_the_worker_stream_numbers_not_the_cache_order);
    tcase_add_test(t, test_an_entry_evicted_without_a_graph_is_not_reported);
    tcase_add_test(t, test_a_full_event_buffer_drops_and_counts_instead_of_growing);
    tcase_add_test(t, test_events_the_brokers_full_connection_cannot_take_are_held_and_sent_later);
    tcase_add_test(t, test_events_that_cannot_be_sent_are_counted_as_dropped);
    tcase_add_test(t, test_an_events_batch_encodes_within_the_wire_limits);
    suite_add_tcase(s, t);
    t = tcase_create("request");
    tcase_add_checked_fixture(t, setup_tiny, NULL);
    tcase_add_test(t, test_a_good_request_becomes_a_job_with_copies_of_its_tensors);
    tcase_add_test(t, test_a_request_keeps_what_its_job_copies_known_before_the_copy);
    tcase_add_test(t, test_contexts_are_each_padded_to_text_len_whatever_their_lengths);
    tcase_add_test(t, test_a_group_request_becomes_one_job_of_n_samples);
    tcase_add_test(t, test_a_latent_with_the_wrong_channel_count_is_refused);
    tcase_add_test(t, test_a_context_of_the_wrong_text_width_is_refused);
    tcase_add_test(t, test_a_request_without_context_is_refused);
    tcase_add_test(t, test_tensors_of_the_wrong_dtype_or_shape_are_refused);
    tcase_add_test(t, test_another_model_a_newer_version_or_a_bad_loop_is_refused);
    tcase_add_test(t, test_a_request_for_an_older_version_runs_on_a_newer_worker);
    tcase_add_test(t, test_a_sample_of_more_tokens_than_max_tokens_is_too_large);
    tcase_add_test(t, test_a_latent_of_the_wrong_channels_and_too_many_tokens_is_refused_for_its_channels);
    tcase_add_test(t, test_a_nan_or_infinite_input_is_refused_by_name);
    tcase_add_test(t, test_a_prewarm_key_becomes_the_shape_and_loop_its_requests_run);
    tcase_add_test(t, test_a_prewarm_key_this_worker_cannot_run_is_refused_with_a_reason);
    tcase_add_test(t, test_a_cancel_stops_only_the_requests_of_its_id_taken_before_it);
    tcase_add_test(t, test_a_flood_of_cancels_of_ids_not_held_never_undoes_a_real_one);
    tcase_add_test(t, test_the_holds_count_every_session_until_each_job_and_its_parts_let_go);
    tcase_add_test(t, test_the_held_bytes_leave_the_sum_once_when_each_job_and_its_parts_let_go);
    suite_add_tcase(s, t);
    t = tcase_create("sync");
    tcase_add_checked_fixture(t, setup_root, teardown_root);
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_sha256_of_abc_matches_the_fips_180_2_digest_whole_in_parts_and_from_a_file);
    tcase_add_test(t, test_sync_weights_by_path_are_hashed_over_the_file_bytes);
    tcase_add_test(t, test_inline_sync_weights_are_hashed_over_the_frames_in_order);
    tcase_add_test(t, test_a_sync_with_bad_fields_is_refused_with_a_reason);
    tcase_add_test(t, test_a_path_outside_the_weights_directories_is_refused_by_its_text_alone);
    tcase_add_test(t, test_a_symlink_anywhere_below_a_root_is_never_followed);
    tcase_add_test(t, test_a_fifo_or_a_device_below_a_root_is_refused_without_blocking);
    tcase_add_test(t, test_missing_unreadable_and_junk_files_get_one_answer_that_tells_nothing);
    tcase_add_test(t, test_a_huge_sparse_file_is_refused_by_its_size_before_a_byte_is_hashed);
    tcase_add_test(t, test_a_stop_ends_a_weights_read_within_a_chunk);
    tcase_add_test(t, test_a_sync_by_path_may_name_a_release_folder_or_its_index_judged_like_a_file);
    tcase_add_test(t, test_a_release_folder_is_read_under_the_roots_rules_shard_by_shard);
    tcase_add_test(t, test_a_release_of_another_model_is_not_weights_of_this_worker);
    suite_add_tcase(s, t);
    t = tcase_create("fetch");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_a_fetch_resumes_where_it_stopped_when_the_broker_comes_back);
    tcase_add_test(t, test_a_fetch_answered_busy_asks_again_and_completes);
    tcase_add_test(t, test_an_uploaded_file_with_more_data_than_the_model_is_refused_at_its_header);
    tcase_add_test(t, test_a_large_message_from_the_streams_is_announced_to_the_broker);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return ts_run(suite());
}
