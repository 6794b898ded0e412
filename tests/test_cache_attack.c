/* test_cache_attack.c -- the capture cache (capture_cache/cache.h,
 * docs/CAPTURE.md) under attack, on the CPU backend: what an attacker or
 * an unlucky operator does that the other suites (test_capture_cache,
 * test_capture_adversarial, test_cache_lifetimes) do not -- evictions,
 * syncs and shutdowns landing while a replay or a capture is in progress
 * on another thread, budgets that one graph cannot fit beside others,
 * sizes whose sum would wrap past SIZE_MAX, streams that go away,
 * pinned inputs that change shape or buffer under a replay, weights that
 * change under a graph, and every field of a key, down to the tinydit
 * step's own keys. Every output is compared bit for bit with the plain
 * step run once outside any cache (tests/synth_step.h).
 *
 * The step is synth_step's: y = latent + context; y += w · latent (w:
 * component "wA"); latent copied, context pinnable. This suite's hooks add
 * a gate kernel to every launch: recorded by a capture, it runs in every
 * replay too, and while armed it holds the launch (eager or replayed) until
 * the test releases it, so an eviction or a sync lands at a known point of
 * a call on another thread. Waits are for events, each bounded. Teardown
 * checks that no backend memory is left allocated. */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "capture_cache/cache.h"
#include "capture_cache/key.h"
#include "kernels/backend.h"
#include "kernels/backend_impl.h" /* kern_stream_launch: the gate kernel */
#include "model/tdit_program.h"
#include "model/tinydit.h"
#include "tests/cache_fixture.h"
#include "tests/support.h"
#include "tests/synth_step.h"

#define ROWS 8
#define COLS 8
#define N (ROWS * COLS)

/* ---- the gate: a kernel that holds a launch while armed ---------------------- */

typedef struct {
    atomic_bool armed;     /* the next execution of the gate kernel holds */
    atomic_int entered;    /* executions held so far */
    atomic_bool released;  /* lets a held execution go on */
} gate_t;

static gate_t G;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits (yielding) until *flag is true, at most 20 s: false on time out. */
static bool wait_true(atomic_bool *flag) {
    double end = now_s() + 20;
    while (!atomic_load(flag))
        if (now_s() > end) return false;
        else sched_yield();
    return true;
}

static bool wait_at_least(atomic_int *v, int n) {
    double end = now_s() + 20;
    while (atomic_load(v) < n)
        if (now_s() > end) return false;
        else sched_yield();
    return true;
}

typedef struct { gate_t *g; } gate_args_t;

static int gate_kernel(void *ctx, const void *args) {
    (void)ctx;
    gate_t *g = ((const gate_args_t *)args)->g;
    bool armed = true;
    if (!atomic_compare_exchange_strong(&g->armed, &armed, false)) return 0;
    atomic_fetch_add(&g->entered, 1);
    if (!wait_true(&g->released)) return reel_fail(REEL_E_STATE, "gate: never released");
    return 0;
}

/* ---- the step's hooks ------------------------------------------------------------ */

static cap_cache_t *C; /* the cache under attack (the fixture's) */

typedef struct user user_t;
struct user {
    synth_user_t step;                  /* first: the step reads it at the user's address */
    void (*on_capture)(user_t *u);      /* at a capturing launch (once: cleared before it runs) */
    atomic_int capturing_launches;
    kern_stream_t *forget_at_launch;    /* set: the next launch forgets it (cleared before) */
    int forget_rc;
    char forget_err[256];
};
_Static_assert(offsetof(user_t, step) == 0, "the step reads its synth_user_t at the user's address");

static int hook_before_add(synth_user_t *su, const synth_launch_t *l) {
    user_t *u = (user_t *)su;
    if (kern_stream_is_capturing(l->s)) {
        u->capturing_launches++;
        void (*f)(user_t *) = u->on_capture;
        u->on_capture = NULL;
        if (f) f(u);
    }
    if (u->forget_at_launch) {
        kern_stream_t *t = u->forget_at_launch;
        u->forget_at_launch = NULL;
        u->forget_rc = cap_forget_stream(C, t);
        snprintf(u->forget_err, sizeof u->forget_err, "%s", u->forget_rc < 0 ? reel_err_text() : "");
    }
    gate_args_t a = { &G };
    return kern_stream_launch(l->s, gate_kernel, &a, sizeof a);
}

static const synth_hooks_t HOOKS = { .before_add = hook_before_add };

static const cap_program_t PROG = {
    .name = "attack", .n_inputs = 2, .n_outputs = 1, .pinnable = { false, true },
    .ws_new = synth_ws_new, .ws_size = synth_ws_size, .ws_free = synth_ws_free, .ws_bytes = synth_ws_bytes,
    .input = synth_input, .output = synth_output, .launch = synth_launch,
    .n_components = 1, .components = { "wA" }, .weights = synth_weights,
};

/* ---- fixture ------------------------------------------------------------------------ */

static kern_backend_t *B;
static kern_stream_t *S;
static float *WA;
static user_t U;
static uint64_t rng;

static void fill(float *p, size_t n) { synth_fill(&rng, p, n, -1.f, 1.f); }

static void user_init(user_t *u, float *w) {
    memset(u, 0, sizeof *u);
    u->step = (synth_user_t){ .w = w, .hooks = &HOOKS };
}

static void setup(void) {
    cfx_open(&B, &S);
    C = NULL;
    rng = 0xa77ac4ull;
    memset(&G, 0, sizeof G);
    WA = cfx_weights_new(B, &rng);
    user_init(&U, WA);
}

static void teardown(void) {
    atomic_store(&G.released, true); /* a failed test never leaves a launch held */
    cap_cache_destroy(&C);
    cfx_close(&B, &S, WA);
}

/* ---- calls ---------------------------------------------------------------------------- */

typedef struct {
    const cap_program_t *prog;
    user_t *u;
    cap_key_t key;
    float x[N], ctx[N], out[N];
    kern_tensor_t in[2], out_t;
} req_t;

static void req_init(req_t *r, user_t *u, const char *model) {
    memset(r, 0, sizeof *r);
    r->prog = &PROG;
    r->u = u;
    r->key = synth_key(B, model, ROWS, COLS, "wA", 1);
    fill(r->x, N);
    fill(r->ctx, N);
    r->in[0] = synth_host_tensor(r->x, ROWS, COLS);
    r->in[1] = synth_host_tensor(r->ctx, ROWS, COLS);
    r->out_t = synth_host_tensor(r->out, ROWS, COLS);
}

static int req_try_on(kern_stream_t *s, req_t *r, cap_result_t *res) {
    cap_call_t call = { .key = &r->key, .inputs = r->in, .outputs = &r->out_t };
    res->ran = (cap_ran_t)-1;
    res->reason = CAP_DECLINE_COUNT;
    memset(r->out, 0xff, sizeof r->out); /* NaN: a call that writes nothing shows */
    return cap_dispatch(C, s, r->prog, r->u, &call, res);
}

static cap_result_t call_on(kern_stream_t *s, req_t *r) {
    cap_result_t res;
    ck_assert_msg(req_try_on(s, r, &res) == 0, "cap_dispatch: %s", reel_err_text());
    return res;
}
static cap_result_t call(req_t *r) { return call_on(S, r); }

/* r's output is bitwise the plain step on r's current inputs with weights w. */
static void expect_bits_w(const req_t *r, const float *w, const char *what, int i) {
    float x[N], c[N], want[N];
    synth_gather(&r->in[0], x);
    synth_gather(&r->in[1], c);
    ck_assert_msg(synth_reference(w, S, &r->key, x, c, NULL, 0, want) == 0, "reference: %s", reel_err_text());
    int64_t j = synth_first_diff(r->out, want, N);
    ck_assert_msg(j < 0, "%s %d: element %lld is %.9g, the plain step gives %.9g", what, i, (long long)j,
                  (double)r->out[j], (double)want[j]);
}
static void expect_bits(const req_t *r, const char *what, int i) { expect_bits_w(r, r->u->step.w, what, i); }

/* Warmup (2 calls), capture, one replay; new latent values each call. */
static void warm_capture_replay_on(kern_stream_t *s, req_t *r) {
    for (int i = 0; i < 4; i++) {
        fill(r->x, N);
        cap_result_t res = call_on(s, r);
        if (i < 2) cfx_expect_eager(res, CAP_DECLINE_WARMING_UP, "warmup");
        else cfx_expect_ran(res, i == 2 ? CAP_RAN_CAPTURED : CAP_RAN_REPLAYED, "warm, capture, replay");
        expect_bits(r, "warm, capture, replay", i);
    }
}
static void warm_capture_replay(req_t *r) { warm_capture_replay_on(S, r); }

/* ---- a call held in its replay on another thread ------------------------------------ */

typedef struct {
    kern_stream_t *s;
    req_t *r;
    cap_result_t res;
    int rc;
    char err[256];
} held_t;

static void *held_main(void *arg) {
    held_t *h = arg;
    h->rc = req_try_on(h->s, h->r, &h->res);
    if (h->rc != 0) snprintf(h->err, sizeof h->err, "%s", reel_err_text());
    return NULL;
}

/* Starts r's next call on a thread and returns once its launch (a replay,
 * for an entry READY) holds at the gate. */
static void hold_call(pthread_t *t, held_t *h, kern_stream_t *s, req_t *r) {
    memset(h, 0, sizeof *h);
    h->s = s;
    h->r = r;
    atomic_store(&G.released, false);
    int before = atomic_load(&G.entered);
    atomic_store(&G.armed, true);
    ck_assert_int_eq(pthread_create(t, NULL, held_main, h), 0);
    ck_assert_msg(wait_at_least(&G.entered, before + 1), "the call never reached its gate");
}

static void release_call(pthread_t t, held_t *h) {
    atomic_store(&G.released, true);
    pthread_join(t, NULL);
    ck_assert_msg(h->rc == 0, "the held call failed: %s", h->err);
}

/* ==== 1. evictions, syncs and shutdown landing in a replay ======================== */

/* An explicit eviction of a key whose graph another thread is replaying
 * (held mid-replay): the eviction is counted and told at once, the entry
 * and its graph stay until that replay ends (never freed under it: ASan),
 * the held call's result is the step's, and then nothing is left. A
 * second eviction, an evict-all and a weight sync meanwhile find it
 * evicted already and count it once. */
START_TEST(test_an_eviction_landing_mid_replay_frees_the_graph_only_after_the_replay_ends) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "attack:midreplay");
    warm_capture_replay(&r);
    pthread_t t;
    held_t h;
    fill(r.x, N);
    hold_call(&t, &h, S, &r);
    ck_assert_int_eq(cap_evict_key(C, &r.key, CAP_EVICT_EXPLICIT), 1);
    ck_assert_int_eq(cap_evict_key(C, &r.key, CAP_EVICT_EXPLICIT), 0);
    ck_assert_int_eq(cap_cache_evict_all(C), 0);
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.entries, 1);        /* still held by the replay */
    ck_assert_uint_eq(st.graphs, 1);
    ck_assert_uint_eq(st.evictions[CAP_EVICT_EXPLICIT], 1);
    ck_assert_uint_eq(st.evictions[CAP_EVICT_SHUTDOWN], 0);
    ck_assert_int_eq(cfx_count_recs(CAP_EV_EVICT, CAP_EVICT_EXPLICIT), 1);
    ck_assert(cap_cache_invariants(C));
    release_call(t, &h);
    cfx_expect_ran(h.res, CAP_RAN_REPLAYED, "the held replay");
    expect_bits(&r, "the held replay", 0);
    st = cfx_stats(C);
    ck_assert_uint_eq(st.entries, 0);
    ck_assert_uint_eq(st.graphs, 0);
    ck_assert_uint_eq(st.bytes_held, 0);
    ck_assert_int_eq(cfx_count_recs(CAP_EV_EVICT, -1), 1);
    cfx_expect_graph_accounting(C, "evicted mid-replay");
    /* the key starts over */
    warm_capture_replay(&r);
    cfx_expect_graph_accounting(C, "after");
}
END_TEST

/* A weight sync (evict policy) landing while another thread replays a
 * graph that reads the component: the entry is evicted (weight_sync,
 * once), the replay in progress finishes on the weights it started with,
 * and the next call, under the new version, never replays the old graph:
 * it warms up, captures and replays against the new weights, bitwise. */
START_TEST(test_an_evicting_sync_landing_mid_replay_never_lets_the_old_graph_serve_the_new_version) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "attack:syncreplay");
    warm_capture_replay(&r);
    float *w2 = kern_alloc(B, SYNTH_W * sizeof(float));
    ck_assert_ptr_nonnull(w2);
    fill(w2, SYNTH_W);
    pthread_t t;
    held_t h;
    fill(r.x, N);
    hold_call(&t, &h, S, &r);
    ck_assert_int_eq(cap_component_update(C, "wA", w2, SYNTH_W * sizeof(float), 2), 1);
    ck_assert_uint_eq(cfx_stats(C).evictions[CAP_EVICT_WEIGHT_SYNC], 1);
    release_call(t, &h);
    cfx_expect_ran(h.res, CAP_RAN_REPLAYED, "the held replay");
    expect_bits(&r, "the held replay (old weights)", 0);
    ck_assert_uint_eq(cfx_stats(C).entries, 0);
    U.step.w = w2;
    ck_assert_int_eq(cap_key_set_version(&r.key, "wA", 2), 0);
    warm_capture_replay(&r);
    ck_assert_uint_eq(cfx_stats(C).captures, 2);
    cfx_expect_graph_accounting(C, "sync mid-replay");
    cap_cache_destroy(&C);
    kern_free(B, w2);
}
END_TEST

/* ==== 2. syncs landing in a capture ================================================== */

static float *g_sync_base;
static uint64_t g_sync_to;
static cap_policy_t g_sync_policy;
static int g_sync_rc;

static void *sync_main(void *a) {
    (void)a;
    g_sync_rc = cap_component_update_policy(C, "wA", g_sync_base, SYNTH_W * sizeof(float), g_sync_to, g_sync_policy);
    return NULL;
}

/* Runs the sync on another thread (a capturing thread may not free). */
static void sync_during_capture(user_t *u) {
    (void)u;
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, sync_main, NULL), 0);
    pthread_join(t, NULL);
}

/* An in-place sync (a LoRA merge: new values in the resident buffers)
 * landing while a capture records: the graph may be published, but it
 * must verify again on its next call -- under its new key -- before it
 * replays; every result is the step's on the weights its call ran on. */
START_TEST(test_an_inplace_sync_landing_mid_capture_makes_the_next_call_reverify_before_any_replay) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "attack:synccapture");
    for (int i = 0; i < 2; i++) call(&r);
    g_sync_base = WA;
    g_sync_to = 2;
    g_sync_policy = CAP_POLICY_INPLACE;
    U.on_capture = sync_during_capture;
    fill(r.x, N);
    cap_result_t res = call(&r);
    ck_assert_int_eq(g_sync_rc, 1);
    ck_assert_int_eq(U.capturing_launches, 1);
    cfx_expect_ran(res, CAP_RAN_CAPTURED, "the capturing call");
    expect_bits(&r, "the capturing call", 0);
    /* the new weights, in place, as the sync said */
    fill(WA, SYNTH_W);
    ck_assert_int_eq(cap_key_set_version(&r.key, "wA", 2), 0);
    uint64_t reverifies = cfx_stats(C).reverifies;
    fill(r.x, N);
    res = call(&r);
    expect_bits(&r, "first call after the sync", 0);
    ck_assert_msg(cfx_stats(C).reverifies == reverifies + 1,
                  "a graph captured across an in-place sync served a call without verifying again");
    cfx_expect_ran(res, CAP_RAN_REPLAYED, "the re-verified call");
    for (int i = 0; i < 4; i++) {
        fill(r.x, N);
        call(&r);
        expect_bits(&r, "after the sync", i);
    }
    cfx_expect_graph_accounting(C, "inplace sync mid-capture");
}
END_TEST

/* The same with an evicting sync: the entry goes, the capture's graph is
 * never published (no CAPTURE event), the call serves its eager result,
 * and the key under the new version starts over. */
START_TEST(test_an_evicting_sync_landing_mid_capture_publishes_nothing) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "attack:evictcapture");
    for (int i = 0; i < 2; i++) call(&r);
    g_sync_base = WA;
    g_sync_to = 2;
    g_sync_policy = CAP_POLICY_EVICT;
    U.on_capture = sync_during_capture;
    fill(r.x, N);
    cap_result_t res = call(&r);
    ck_assert_int_eq(g_sync_rc, 1);
    cfx_expect_eager(res, CAP_DECLINE_WEIGHTS_MOVED, "the capturing call");
    expect_bits(&r, "the capturing call", 0);
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.captures, 0);
    ck_assert_uint_eq(st.entries, 0);
    ck_assert_int_eq(cfx_count_recs(CAP_EV_CAPTURE, -1), 0);
    ck_assert_uint_eq(st.graphless_evictions[CAP_EVICT_WEIGHT_SYNC], 1);
    ck_assert_int_eq(cap_key_set_version(&r.key, "wA", 2), 0);
    warm_capture_replay(&r);
    cfx_expect_graph_accounting(C, "evicting sync mid-capture");
}
END_TEST

/* ==== 3. outputs and pinned inputs the caller got wrong ============================== */

/* A capturing call whose output has no data (NULL) while an input is read
 * in place: the call fails with a message naming the output, touching no
 * memory through the NULL (UBSan: no arithmetic on it), and the key's
 * next good call is served bitwise. */
START_TEST(test_an_output_without_data_is_refused_with_a_message_and_the_key_still_serves) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "attack:nulloutput");
    for (int i = 0; i < 2; i++) call(&r);
    kern_tensor_t good = r.out_t;
    r.out_t.data = NULL;
    cap_result_t res;
    ck_assert_int_ne(req_try_on(S, &r, &res), 0);
    ck_assert_msg(strstr(reel_err_text(), "output"), "error: %s", reel_err_text());
    r.out_t = good;
    for (int i = 0; i < 3; i++) {
        fill(r.x, N);
        call(&r);
        expect_bits(&r, "after the refusal", i);
    }
    r.out_t.data = NULL;
    ck_assert_int_ne(req_try_on(S, &r, &res), 0); /* a replaying call too */
    r.out_t = good;
    cfx_expect_graph_accounting(C, "null output");
}
END_TEST

/* A replay given its pinned input at another shape (same bytes) is
 * refused, never reinterpreted; given it in another buffer it declines
 * pinned_input_moved and reads the new buffer, never the old address; the
 * key then serves every call bitwise. */
START_TEST(test_a_pinned_input_of_another_shape_or_buffer_never_reaches_the_graph) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "attack:pinshape");
    warm_capture_replay(&r);
    kern_tensor_t pinned = r.in[1];
    r.in[1] = synth_host_tensor(r.ctx, COLS, ROWS);
    r.in[1].shape[0] = N / 2;
    r.in[1].shape[1] = 2;
    r.in[1].stride[0] = 2;
    cap_result_t res;
    ck_assert_int_ne(req_try_on(S, &r, &res), 0);
    r.in[1] = pinned;
    static float other[N];
    memcpy(other, r.ctx, sizeof other);
    other[5] += 1.0f;
    r.in[1] = synth_host_tensor(other, ROWS, COLS);
    cfx_expect_eager(call(&r), CAP_DECLINE_PINNED_INPUT_MOVED, "context in another buffer");
    expect_bits(&r, "context in another buffer", 0);
    for (int i = 0; i < 4; i++) {
        fill(other, N);
        fill(r.x, N);
        call(&r);
        expect_bits(&r, "context in its new buffer", i);
    }
    cfx_expect_graph_accounting(C, "pinned input shape and buffer");
}
END_TEST

/* ==== 4. the budget ==================================================================== */

/* One entry's bytes and one graph's, measured on a scratch cache. */
static void probe_sizes(size_t *entry, size_t *graph) {
    cap_options_t o = cfx_options();
    o.on_event = NULL;
    cap_cache_t *saved = C;
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    user_t pu;
    user_init(&pu, WA);
    req_init(&r, &pu, "attack:probe");
    warm_capture_replay(&r);
    cap_stats_t st = cfx_stats(C);
    *entry = st.ws_bytes;
    *graph = st.graph_bytes;
    cap_cache_destroy(&C);
    C = saved;
    ck_assert_uint_gt(*entry, 0);
    ck_assert_uint_gt(*graph, 0);
}

/* A budget of one byte: every call runs transient (budget_exceeded),
 * bitwise, nothing is held, no capture or eviction is ever told. */
START_TEST(test_a_one_byte_budget_serves_every_call_transient_and_holds_nothing) {
    cap_options_t o = cfx_options();
    o.budget_bytes = 1;
    o.warmup = 0;
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "attack:onebyte");
    size_t base = kern_bytes_in_use(B);
    for (int i = 0; i < 5; i++) {
        fill(r.x, N);
        cfx_expect_eager(call(&r), CAP_DECLINE_BUDGET_EXCEEDED, "one byte");
        expect_bits(&r, "one byte", i);
        ck_assert_uint_eq(kern_bytes_in_use(B), base);
    }
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.entries + st.graphs + st.bytes_held, 0);
    ck_assert_uint_eq(st.declines[CAP_DECLINE_BUDGET_EXCEEDED], 5);
    ck_assert_int_eq(cfx_count_recs(CAP_EV_CAPTURE, -1) + cfx_count_recs(CAP_EV_EVICT, -1), 0);
    ck_assert_int_eq(cfx_count_recs(CAP_EV_DECLINE, CAP_DECLINE_BUDGET_EXCEEDED), 5);
}
END_TEST

/* A budget that holds two entries and one graph: the first key's graph is
 * held; a second key's workspace fits beside it but its graph only fits
 * once the first key's entry goes -- the least recent, the one eviction
 * made, told as a graph's -- so the budget always holds, and both keys
 * stay bitwise as they take turns. */
START_TEST(test_a_graph_that_cannot_fit_beside_others_evicts_only_what_makes_it_fit) {
    size_t ent, g;
    probe_sizes(&ent, &g);
    cap_options_t o = cfx_options();
    o.budget_bytes = 2 * ent + g;
    C = cfx_cache_new(B, &o, WA);
    static req_t a, b;
    req_init(&a, &U, "attack:fit-a");
    req_init(&b, &U, "attack:fit-b");
    warm_capture_replay(&a);
    for (int i = 0; i < 2; i++) call(&b); /* warm b beside a's graph */
    ck_assert_uint_eq(cfx_stats(C).entries, 2);
    fill(b.x, N);
    cfx_expect_ran(call(&b), CAP_RAN_CAPTURED, "b captures by evicting a");
    expect_bits(&b, "b", 0);
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.evictions[CAP_EVICT_LRU], 1);
    ck_assert_uint_le(st.bytes_held, o.budget_bytes);
    ck_assert_uint_eq(st.graphs, 1);
    for (int i = 0; i < cfx_n_recs(); i++) {
        cfx_rec_t e = cfx_rec(i);
        if (e.kind == CAP_EV_EVICT)
            ck_assert_msg(e.hash == cap_key_hash(&a.key) && e.graph, "the eviction was not a's graph");
    }
    cfx_expect_graph_accounting(C, "fit");
    /* a starts over beside b's graph, and b keeps replaying meanwhile */
    for (int i = 0; i < 6; i++) {
        fill(a.x, N);
        call(&a);
        expect_bits(&a, "a again", i);
        fill(b.x, N);
        call(&b);
        expect_bits(&b, "b beside a", i);
        ck_assert_uint_le(cfx_stats(C).bytes_held, o.budget_bytes);
    }
    cfx_expect_graph_accounting(C, "fit, both keys");
}
END_TEST


/* The step with a workspace that reports g_huge_ws bytes: ws_bytes is the
 * program's word, and the cache counts what it says (no ws_size: it
 * measures after the allocation). */
static size_t g_huge_ws;

static size_t huge_ws_bytes(void *user, const void *ws) {
    (void)user;
    (void)ws;
    return g_huge_ws;
}

static const cap_program_t HUGE_PROG = {
    .name = "attack-huge", .n_inputs = 2, .n_outputs = 1, .pinnable = { false, true },
    .ws_new = synth_ws_new, .ws_free = synth_ws_free, .ws_bytes = huge_ws_bytes,
    .input = synth_input, .output = synth_output, .launch = synth_launch,
    .n_components = 1, .components = { "wA" }, .weights = synth_weights,
};

/* A budget of SIZE_MAX (what --budget accepts) and two keys whose
 * workspaces each report more than half the address space: together they
 * exceed it, so each key's entry makes room by evicting the other's (lru)
 * -- the byte count is never added past SIZE_MAX into a small sum that
 * seems to fit both. Every call is the step's, bitwise. */
START_TEST(test_two_entries_whose_bytes_overflow_size_t_never_share_a_size_max_budget) {
    cap_options_t o = cfx_options();
    o.budget_bytes = SIZE_MAX;
    C = cfx_cache_new(B, &o, WA);
    g_huge_ws = SIZE_MAX / 2 + 1;
    static req_t a, b;
    req_init(&a, &U, "attack:huge-a");
    req_init(&b, &U, "attack:huge-b");
    a.prog = b.prog = &HUGE_PROG;
    for (int i = 0; i < 6; i++) {
        req_t *r = i % 2 ? &b : &a;
        fill(r->x, N);
        call(r);
        expect_bits(r, "huge workspaces taking turns", i);
        cap_stats_t st = cfx_stats(C);
        ck_assert_msg(st.entries == 1 && st.bytes_held >= g_huge_ws,
                      "call %d: %zu entries holding %zu bytes: the count wrapped past SIZE_MAX", i, st.entries,
                      st.bytes_held);
        ck_assert_uint_eq(st.evictions[CAP_EVICT_LRU], (uint64_t)i);
        ck_assert(cap_cache_invariants(C));
    }
}
END_TEST

/* Without a budget the counters still bound what is held: a second entry
 * whose bytes could not be added to the first's is declined
 * budget_exceeded and served in a transient workspace, never counted
 * modulo 2^64; the first keeps its entry and captures. */
START_TEST(test_without_a_budget_an_entry_whose_bytes_the_count_cannot_hold_declines_budget_exceeded) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    g_huge_ws = SIZE_MAX / 2 + 1;
    static req_t a, b;
    req_init(&a, &U, "attack:nobudget-a");
    req_init(&b, &U, "attack:nobudget-b");
    a.prog = b.prog = &HUGE_PROG;
    warm_capture_replay(&a);
    for (int i = 0; i < 3; i++) {
        fill(b.x, N);
        cfx_expect_eager(call(&b), CAP_DECLINE_BUDGET_EXCEEDED, "the second huge entry");
        expect_bits(&b, "the second huge entry", i);
        cap_stats_t st = cfx_stats(C);
        ck_assert_uint_eq(st.entries, 1);
        ck_assert_uint_ge(st.bytes_held, g_huge_ws);
    }
    fill(a.x, N);
    cfx_expect_ran(call(&a), CAP_RAN_REPLAYED, "the first huge entry after the declines");
    expect_bits(&a, "the first huge entry after the declines", 0);
    ck_assert_uint_eq(cfx_stats(C).evictions[CAP_EVICT_LRU], 0);
}
END_TEST

/* A budget of SIZE_MAX with a replay held on one stream (its entry in use:
 * no eviction can free it) and, on another stream, a key whose workspace
 * reports nearly SIZE_MAX bytes: the held bytes plus that wrap past
 * SIZE_MAX to less than the budget; the call must decline
 * budget_exceeded (a transient workspace), not be admitted. */
START_TEST(test_a_need_that_wraps_past_size_max_beside_a_busy_entry_declines_budget_exceeded) {
    cap_options_t o = cfx_options();
    o.budget_bytes = SIZE_MAX;
    C = cfx_cache_new(B, &o, WA);
    kern_stream_t *s2 = kern_stream_new(B);
    ck_assert_ptr_nonnull(s2);
    static req_t a, b;
    req_init(&a, &U, "attack:busy-a");
    req_init(&b, &U, "attack:busy-b");
    b.prog = &HUGE_PROG;
    warm_capture_replay(&a);
    const size_t held = cfx_stats(C).bytes_held;
    ck_assert_uint_ge(held, 2 * 2 * sizeof b.x); /* b's own copy of its inputs must not saturate the sum */
    g_huge_ws = SIZE_MAX - held / 2;
    pthread_t t;
    held_t h;
    fill(a.x, N);
    hold_call(&t, &h, S, &a);
    for (int i = 0; i < 2; i++) {
        fill(b.x, N);
        cfx_expect_eager(call_on(s2, &b), CAP_DECLINE_BUDGET_EXCEEDED, "a need past SIZE_MAX beside a busy entry");
        expect_bits(&b, "a need past SIZE_MAX beside a busy entry", i);
        cap_stats_t st = cfx_stats(C);
        ck_assert_uint_eq(st.entries, 1);
        ck_assert_uint_eq(st.bytes_held, held);
    }
    release_call(t, &h);
    cfx_expect_ran(h.res, CAP_RAN_REPLAYED, "the held replay");
    expect_bits(&a, "the held replay", 0);
    ck_assert_uint_eq(cfx_stats(C).evictions[CAP_EVICT_LRU], 0);
    cap_cache_destroy(&C);
    kern_stream_destroy(&s2);
}
END_TEST

/* ==== 5. keys: what a graph depends on ============================================== */

/* Every field of a capture key enters its text and its hash: a key that
 * differs from another in any one of them (any input's name, dtype, rank
 * or any dim; a component's name or version; device, arch, model, loop,
 * or any graph field) never finds the other's entry. */
START_TEST(test_every_field_of_a_capture_key_changes_its_text_and_hash) {
    cap_key_t base = synth_key(B, "attack:fields", ROWS, COLS, "wA", 1);
    TS_OK(cap_key_add_component(&base, "wB", 7));
    enum { NV = 24 };
    char text[NV][CAP_KEY_TEXT_MAX];
    uint64_t hash[NV];
    for (int v = 0; v < NV; v++) {
        cap_key_t k = base;
        switch (v) {
        case 0: break;
        case 1: snprintf(k.device, sizeof k.device, "cpu1"); break;
        case 2: snprintf(k.arch, sizeof k.arch, "cpu-x86"); break;
        case 3: snprintf(k.model, sizeof k.model, "attack:fieldz"); break;
        case 4: snprintf(k.loop, sizeof k.loop, "sde"); break;
        case 5: snprintf(k.inputs[0].name, sizeof k.inputs[0].name, "latenT"); break;
        case 6: k.inputs[0].dtype = KERN_BF16; break;
        case 7: k.inputs[0].dtype = KERN_F16; break;
        case 8: k.inputs[0].ndim = 3; k.inputs[0].shape[2] = 1; break;
        case 9: k.inputs[0].shape[0] = ROWS + 1; break;
        case 10: k.inputs[0].shape[1] = COLS - 1; break;
        case 11: k.inputs[1].shape[0] = ROWS * 2; k.inputs[1].shape[1] = COLS / 2; break;
        case 12: k.inputs[1].dtype = KERN_BF16; break;
        case 13: k.n_inputs = 1; break;
        case 14: k.components[0].version = 2; break;
        case 15: k.components[1].version = 8; break;
        case 16: snprintf(k.components[1].name, sizeof k.components[1].name, "wC"); break;
        case 17: k.n_components = 1; break;
        case 18: k.graph.dtype = KERN_BF16; break;
        case 19: snprintf(k.graph.cfg, sizeof k.graph.cfg, "cond+uncond"); break;
        case 20: snprintf(k.graph.expert, sizeof k.graph.expert, "low"); break;
        case 21: snprintf(k.graph.sched, sizeof k.graph.sched, "f64"); break;
        case 22: { /* the two inputs swapped: the program's order is part of the key */
            cap_sig_t t = k.inputs[0];
            k.inputs[0] = k.inputs[1];
            k.inputs[1] = t;
            snprintf(k.inputs[0].name, sizeof k.inputs[0].name, "latent");
            snprintf(k.inputs[1].name, sizeof k.inputs[1].name, "context");
            k.inputs[0].shape[0] = 4;
            k.inputs[0].shape[1] = 16;
            break;
        }
        case 23: k.inputs[0].ndim = 0; break;
        }
        ck_assert_msg(cap_key_text(&k, false, text[v], sizeof text[v]) > 0, "variant %d: %s", v, reel_err_text());
        hash[v] = cap_key_hash(&k);
        for (int u = 0; u < v; u++)
            ck_assert_msg(strcmp(text[u], text[v]) && hash[u] != hash[v], "variants %d and %d share a key: %s", u, v,
                          text[v]);
    }
}
END_TEST

/* Every step shape and loop the tinydit model runs (CFG or not, Euler,
 * SDE, UniPC, DPM++ and SDE on their grids, a sample, a group or a mixed
 * batch, any latent and context size) has a key of its own, and the
 * workspace the cache makes from that key is the one for that very shape:
 * a graph is never captured on a workspace of another step, nor replayed
 * for a step it was not captured for. */
START_TEST(test_every_tinydit_step_shape_and_loop_has_its_own_key_and_its_own_workspace) {
    char dir[64], path[128];
    ts_mkdtemp(dir, sizeof dir, "attack-keys");
    snprintf(path, sizeof path, "%s/tiny.safetensors", dir);
    ts_tiny_weights(3, path);
    tdit_model_t *m = tdit_model_load_path(B, path, KERN_F32);
    ck_assert_msg(m != NULL, "model: %s", reel_err_text());
    enum { MAXK = 2048 };
    static char texts[MAXK][CAP_KEY_TEXT_MAX];
    int n = 0;
    const tdit_solver_t sol[5][2] = { { TDIT_SOLVER_EULER, TDIT_SOLVER_EULER }, { TDIT_SOLVER_UNIPC, TDIT_SOLVER_EULER },
                                      { TDIT_SOLVER_DPMPP, TDIT_SOLVER_EULER }, { TDIT_SOLVER_EULER, TDIT_SOLVER_UNIPC },
                                      { TDIT_SOLVER_EULER, TDIT_SOLVER_DPMPP } };
    const int64_t hw[2][2] = { { 4, 4 }, { 4, 6 } };
    for (int cfg = 0; cfg < 2; cfg++)
        for (int sde = 0; sde < 2; sde++)
            for (int so = 0; so < 5; so++)
                for (int64_t batch = 1; batch <= 4; batch *= 2)
                    for (int mixed = 0; mixed < 2; mixed++)
                        for (int64_t L = 3; L <= 5; L += 2)
                            for (int64_t F = 1; F <= 2; F++)
                                for (int h = 0; h < 2; h++) {
                                    tdit_shape_t sh = { .frames = F, .height = hw[h][0], .width = hw[h][1],
                                                        .text_len = L, .cfg = cfg, .batch = batch,
                                                        .solver = sol[so][0], .mixed = mixed, .grid = sol[so][1] };
                                    if (tdit_shape_validate(&sh) != 0) continue;
                                    if (sde && tdit_solver_multistep(sh.solver)) continue; /* no such step */
                                    cap_key_t k;
                                    if (tdit_step_key(m, &sh, sde, 1, &k) != 0) continue;
                                    ck_assert_int_lt(n, MAXK);
                                    ck_assert_int_gt(cap_key_text(&k, false, texts[n], sizeof texts[n]), 0);
                                    for (int u = 0; u < n; u++)
                                        ck_assert_msg(strcmp(texts[u], texts[n]) != 0,
                                                      "two steps share a key: %s", texts[n]);
                                    const cap_program_t *p = tdit_solver_multistep(sh.solver) ? tdit_program_ms(cfg)
                                                                                              : tdit_program(cfg, sde);
                                    ck_assert_int_eq(p->ws_size(m, &k), tdit_ws_size(m, &sh));
                                    void *ws = p->ws_new(m, &k, S);
                                    ck_assert_msg(ws != NULL, "workspace of %s: %s", texts[n], reel_err_text());
                                    ck_assert_msg(tdit_shape_equal(tdit_ws_shape(ws), &sh),
                                                  "the workspace made from %s is another step's", texts[n]);
                                    for (int i = 0; i < p->n_inputs; i++) {
                                        const kern_tensor_t *slot = p->input(m, ws, i);
                                        ck_assert_msg(i < k.n_inputs && slot->dtype == k.inputs[i].dtype &&
                                                          slot->ndim == k.inputs[i].ndim &&
                                                          !memcmp(slot->shape, k.inputs[i].shape,
                                                                  (size_t)slot->ndim * sizeof slot->shape[0]),
                                                      "%s: input %d's slot is not what the key declares", texts[n], i);
                                    }
                                    p->ws_free(m, ws);
                                    n++;
                                }
    ck_assert_int_gt(n, 100);
    tdit_model_destroy(&m);
    ts_rmtree(dir);
}
END_TEST

/* ==== 6. weights re-laid-out under a graph ============================================ */

/* A step that reads a weight matrix through its layout: y = W·x with W a
 * [MV, MV] tensor the user holds, its shape and strides read when the
 * step launches (as every kernel reads its operands' layout), baked into
 * the argument block a capture records. */
#define MV 8

typedef struct {
    kern_tensor_t w;            /* the weight, in backend memory; its layout may change */
} mv_user_t;

typedef struct {
    kern_backend_t *b;
    kern_tensor_t x, y;
} mv_ws_t;

typedef struct {
    const float *w, *x;
    float *y;
    int64_t rows, cols, s0, s1;
} mv_args_t;

static int mv_kernel(void *ctx, const void *args) {
    (void)ctx;
    const mv_args_t *a = args;
    for (int64_t i = 0; i < a->rows; i++) {
        float acc = 0;
        for (int64_t j = 0; j < a->cols; j++) acc += a->w[i * a->s0 + j * a->s1] * a->x[j];
        a->y[i] = acc;
    }
    return 0;
}

static void *mv_ws_new(void *user, const cap_key_t *key, kern_stream_t *s) {
    (void)user;
    (void)key;
    mv_ws_t *ws = calloc(1, sizeof *ws);
    if (!ws) return NULL;
    ws->b = kern_stream_backend(s);
    int64_t n = MV;
    ws->x = kern_tensor_alloc(ws->b, KERN_F32, 1, &n);
    ws->y = kern_tensor_alloc(ws->b, KERN_F32, 1, &n);
    return ws;
}

static void mv_ws_free(void *user, void *ws_) {
    (void)user;
    mv_ws_t *ws = ws_;
    kern_free(ws->b, ws->x.data);
    kern_free(ws->b, ws->y.data);
    free(ws);
}

static size_t mv_ws_bytes(void *user, const void *ws) {
    (void)user;
    (void)ws;
    return 2 * MV * sizeof(float);
}

static kern_tensor_t *mv_input(void *user, void *ws, int i) {
    (void)user;
    (void)i;
    return &((mv_ws_t *)ws)->x;
}

static kern_tensor_t *mv_output(void *user, void *ws, int i) {
    (void)user;
    (void)i;
    return &((mv_ws_t *)ws)->y;
}

static int mv_launch(void *user, void *ws_, const cap_const_t *k, int n, kern_stream_t *s) {
    (void)k;
    (void)n;
    const mv_user_t *u = user;
    mv_ws_t *ws = ws_;
    mv_args_t a = { kern_tensor_ptr(&u->w), kern_tensor_ptr(&ws->x), kern_tensor_ptr(&ws->y), u->w.shape[0],
                    u->w.shape[1], u->w.stride[0], u->w.stride[1] };
    return kern_stream_launch(s, mv_kernel, &a, sizeof a);
}

static int mv_weights(void *user, cap_weight_t *out, int max) {
    const mv_user_t *u = user;
    if (max >= 1) out[0] = cap_weight_of(&u->w, 0);
    return 1;
}

static const cap_program_t MV_PROG = {
    .name = "matvec", .n_inputs = 1, .n_outputs = 1, .pinnable = { false },
    .ws_new = mv_ws_new, .ws_free = mv_ws_free, .ws_bytes = mv_ws_bytes, .input = mv_input, .output = mv_output,
    .launch = mv_launch, .n_components = 1, .components = { "wA" }, .weights = mv_weights,
};

/* A weight re-laid-out in place without a versioned update -- the same
 * address, bytes and dtype, another layout (here transposed: a framework
 * switching a matrix to the layout another kernel prefers) -- is a weight
 * the graph no longer reads as eager does: the replay must decline
 * weights_moved and the call give what eager gives on the new layout
 * (cache.h: "weights freed, moved or re-laid-out"), never the old
 * layout's product. */
START_TEST(test_a_weight_re_laid_out_at_the_same_address_declines_weights_moved_never_replays_the_old_layout) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    mv_user_t u;
    int64_t wshape[2] = { MV, MV };
    u.w = kern_tensor_alloc(B, KERN_F32, 2, wshape);
    ck_assert_ptr_nonnull(u.w.data);
    fill(u.w.data, MV * MV);
    cap_key_t key;
    memset(&key, 0, sizeof key);
    snprintf(key.device, sizeof key.device, "%s", kern_backend_device_name(B));
    snprintf(key.arch, sizeof key.arch, "%s", kern_backend_arch(B));
    snprintf(key.model, sizeof key.model, "attack:matvec");
    snprintf(key.loop, sizeof key.loop, "euler");
    int64_t n = MV;
    TS_OK(cap_key_add_input(&key, "latent", KERN_F32, 1, &n));
    TS_OK(cap_key_add_component(&key, "wA", 1));
    key.graph.dtype = KERN_F32;
    snprintf(key.graph.cfg, sizeof key.graph.cfg, "cond");
    snprintf(key.graph.expert, sizeof key.graph.expert, "-");
    snprintf(key.graph.sched, sizeof key.graph.sched, "f32");
    float x[MV], y[MV], want[MV];
    kern_tensor_t in = kern_tensor_make(x, KERN_F32, KERN_DEVICE_HOST, 1, &n);
    kern_tensor_t out = kern_tensor_make(y, KERN_F32, KERN_DEVICE_HOST, 1, &n);
    cap_call_t c = { .key = &key, .inputs = &in, .outputs = &out };
    for (int i = 0; i < 8; i++) {
        if (i == 4) { /* transposed in place: the same bytes read the other way */
            u.w.stride[0] = 1;
            u.w.stride[1] = MV;
        }
        fill(x, MV);
        cap_result_t res;
        TS_OK(cap_dispatch(C, S, &MV_PROG, &u, &c, &res));
        mv_args_t a = { kern_tensor_ptr(&u.w), x, want, MV, MV, u.w.stride[0], u.w.stride[1] };
        ck_assert_int_eq(mv_kernel(NULL, &a), 0);
        ck_assert_msg(synth_first_diff(y, want, MV) < 0, "call %d (ran %s): y is not W·x for W as it is laid out now",
                      i, cfx_ran_name(res.ran));
        if (i == 4) cfx_expect_eager(res, CAP_DECLINE_WEIGHTS_MOVED, "the first call after the re-layout");
    }
    ck_assert_uint_eq(cfx_stats(C).captures, 2); /* again, on the new layout */
    cfx_expect_graph_accounting(C, "re-laid-out weight");
    cap_cache_destroy(&C);
    kern_free(B, u.w.data);
}
END_TEST

/* ==== 7. streams going away ============================================================ */

/* The stream_gone evictions recorded are n, one of them a graph's (for
 * key hash h_graph; none when h_graph is 0), the others of key h_none. */
static void expect_stream_gone(int n, uint64_t h_graph, uint64_t h_none, const char *what) {
    int got = 0, graphs = 0;
    for (int i = 0; i < cfx_n_recs(); i++) {
        cfx_rec_t e = cfx_rec(i);
        if (e.kind != CAP_EV_EVICT || e.reason != CAP_EVICT_STREAM_GONE) continue;
        got++;
        graphs += e.graph;
        ck_assert_msg(e.hash == (e.graph ? h_graph : h_none), "%s: a stream_gone eviction of another key", what);
    }
    ck_assert_msg(got == n, "%s: %d stream_gone evictions, expected %d", what, got, n);
    ck_assert_msg(graphs == (h_graph ? 1 : 0), "%s: %d of them told a graph", what, graphs);
}

/* A stream the cache holds a graph and a warming entry of is forgotten
 * (cap_forget_stream) and then destroyed: both entries go (stream_gone,
 * one a graph's), so the stream's destruction finds no graph of it alive
 * (the backend asserts that); another stream's graph stays and replays.
 * A stream made next -- at the dead one's address, as the allocator
 * often gives it -- is a new stream to the cache: its keys warm up and
 * capture on it, never finding the dead stream's entries. */
START_TEST(test_a_forgotten_stream_can_be_destroyed_and_a_stream_made_after_it_starts_afresh) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    kern_stream_t *s2 = kern_stream_new(B);
    ck_assert_ptr_nonnull(s2);
    static req_t a, b, w;
    req_init(&a, &U, "attack:stay");
    req_init(&b, &U, "attack:gone");
    req_init(&w, &U, "attack:gone-warming");
    warm_capture_replay(&a);
    warm_capture_replay_on(s2, &b);
    for (int i = 0; i < 2; i++) cfx_expect_eager(call_on(s2, &w), CAP_DECLINE_WARMING_UP, "w on s2");
    ck_assert_int_eq(cap_forget_stream(C, s2), 2);
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.entries, 1);
    ck_assert_uint_eq(st.graphs, 1);
    ck_assert_uint_eq(st.evictions[CAP_EVICT_STREAM_GONE], 2);
    ck_assert_uint_eq(st.graphless_evictions[CAP_EVICT_STREAM_GONE], 1);
    expect_stream_gone(2, cap_key_hash(&b.key), cap_key_hash(&w.key), "forget s2");
    cfx_expect_graph_accounting(C, "forget s2");
    ck_assert_str_eq(cap_evict_reason_name(CAP_EVICT_STREAM_GONE), "stream_gone");
    ck_assert_int_eq(cap_forget_stream(C, s2), 0); /* forgotten already */
    kern_stream_destroy(&s2);
    fill(a.x, N);
    cfx_expect_ran(call(&a), CAP_RAN_REPLAYED, "the other stream's graph");
    expect_bits(&a, "the other stream's graph", 0);
    kern_stream_t *s3 = kern_stream_new(B);
    ck_assert_ptr_nonnull(s3);
    ck_assert_int_eq(cap_forget_stream(C, s3), 0); /* never seen */
    for (int i = 0; i < 2; i++) {
        fill(w.x, N);
        cfx_expect_eager(call_on(s3, &w), CAP_DECLINE_WARMING_UP, "w on the new stream");
        expect_bits(&w, "w on the new stream", i);
    }
    fill(w.x, N);
    cfx_expect_ran(call_on(s3, &w), CAP_RAN_CAPTURED, "w's third call on the new stream");
    expect_bits(&w, "w's third call on the new stream", 0);
    warm_capture_replay_on(s3, &b);
    ck_assert(cap_cache_invariants(C));
    cfx_expect_graph_accounting(C, "the new stream");
    ck_assert_int_eq(cap_forget_stream(C, s3), 2);
    kern_stream_destroy(&s3);
    ck_assert_uint_eq(cfx_stats(C).entries, 1);
}
END_TEST

/* The cache knows a stream by its address, so a stream forgotten and then
 * used again stands for a new stream made at a dead one's address
 * (deterministically: no allocator involved): its key warms up and
 * captures again; the old graph, baked for the stream as it was, never
 * replays. */
START_TEST(test_a_stream_used_again_after_it_was_forgotten_never_replays_its_old_graph) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    kern_stream_t *s2 = kern_stream_new(B);
    ck_assert_ptr_nonnull(s2);
    static req_t b;
    req_init(&b, &U, "attack:again");
    warm_capture_replay_on(s2, &b);
    ck_assert_int_eq(cap_forget_stream(C, s2), 1);
    ck_assert_uint_eq(cfx_stats(C).bytes_held, 0);
    warm_capture_replay_on(s2, &b); /* warming_up twice, then a capture: never the old graph */
    ck_assert_uint_eq(cfx_stats(C).captures, 2);
    cfx_expect_graph_accounting(C, "used again");
    cap_cache_destroy(&C);
    kern_stream_destroy(&s2);
}
END_TEST

static kern_stream_t *g_forget_s;
static atomic_bool g_forget_started;
static int g_forget_rc;

static void *forget_main(void *arg) {
    (void)arg;
    atomic_store(&g_forget_started, true);
    g_forget_rc = cap_forget_stream(C, g_forget_s);
    return NULL;
}

/* A stream forgotten while another thread's replay on it is held
 * mid-graph: the forget waits for the stream as a dispatch would, so the
 * replay ends on its own entry and graph (never freed under it: ASan; the
 * invariants, checked after each call in ASan and TSan builds, see no
 * entry of a stream given up), its result the step's; then the entry goes
 * (stream_gone, a graph) and the stream can be destroyed. */
START_TEST(test_forgetting_a_stream_waits_for_a_replay_held_on_it) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    kern_stream_t *s2 = kern_stream_new(B);
    ck_assert_ptr_nonnull(s2);
    static req_t b;
    req_init(&b, &U, "attack:forget-held");
    warm_capture_replay_on(s2, &b);
    pthread_t t, f;
    held_t h;
    fill(b.x, N);
    hold_call(&t, &h, s2, &b);
    g_forget_s = s2;
    atomic_store(&g_forget_started, false);
    g_forget_rc = -2;
    ck_assert_int_eq(pthread_create(&f, NULL, forget_main, NULL), 0);
    ck_assert(wait_true(&g_forget_started));
    release_call(t, &h);
    pthread_join(f, NULL);
    ck_assert_int_eq(g_forget_rc, 1);
    cfx_expect_ran(h.res, CAP_RAN_REPLAYED, "the held replay");
    expect_bits(&b, "the held replay", 0);
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.entries + st.graphs + st.bytes_held, 0);
    expect_stream_gone(1, cap_key_hash(&b.key), 0, "forget held");
    cfx_expect_graph_accounting(C, "forget held");
    kern_stream_destroy(&s2);
}
END_TEST

/* What cap_forget_stream refuses, changing nothing: a NULL cache or
 * stream, and a forget from a step's launch (it would wait for its own
 * stream, or for another while holding one). The stream it named keeps
 * its graph. */
START_TEST(test_forget_stream_refuses_a_null_cache_or_stream_and_a_call_from_a_launch) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    kern_stream_t *s2 = kern_stream_new(B);
    ck_assert_ptr_nonnull(s2);
    reel_err_clear();
    ck_assert_int_eq(cap_forget_stream(NULL, S), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "cache"));
    ck_assert_int_eq(cap_forget_stream(C, NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "stream"));
    static req_t a, b;
    req_init(&a, &U, "attack:forget-launch-a");
    req_init(&b, &U, "attack:forget-launch-b");
    warm_capture_replay_on(s2, &b);
    for (int k = 0; k < 2; k++) { /* another stream's, then the launch's own */
        U.forget_at_launch = k == 0 ? s2 : S;
        U.forget_rc = 0;
        fill(a.x, N);
        call(&a);
        expect_bits(&a, "a call whose launch forgets a stream", k);
        ck_assert_msg(U.forget_rc == -1 && strstr(U.forget_err, "from a dispatch"), "forget from a launch: %d (%s)",
                      U.forget_rc, U.forget_err);
    }
    ck_assert_uint_eq(cfx_stats(C).evictions[CAP_EVICT_STREAM_GONE], 0);
    fill(b.x, N);
    cfx_expect_ran(call_on(s2, &b), CAP_RAN_REPLAYED, "s2's graph after the refusals");
    expect_bits(&b, "s2's graph after the refusals", 0);
    cap_cache_destroy(&C);
    kern_stream_destroy(&s2);
}
END_TEST

/* ==== the suite ============================================================================ */

static Suite *suite(void) {
    Suite *s = suite_create("cache_attack");
    TCase *tc = tcase_create("attack");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_an_eviction_landing_mid_replay_frees_the_graph_only_after_the_replay_ends);
    tcase_add_test(tc, test_an_evicting_sync_landing_mid_replay_never_lets_the_old_graph_serve_the_new_version);
    tcase_add_test(tc, test_an_inplace_sync_landing_mid_capture_makes_the_next_call_reverify_before_any_replay);
    tcase_add_test(tc, test_an_evicting_sync_landing_mid_capture_publishes_nothing);
    tcase_add_test(tc, test_an_output_without_data_is_refused_with_a_message_and_the_key_still_serves);
    tcase_add_test(tc, test_a_pinned_input_of_another_shape_or_buffer_never_reaches_the_graph);
    tcase_add_test(tc, test_a_one_byte_budget_serves_every_call_transient_and_holds_nothing);
    tcase_add_test(tc, test_a_graph_that_cannot_fit_beside_others_evicts_only_what_makes_it_fit);
    tcase_add_test(tc, test_two_entries_whose_bytes_overflow_size_t_never_share_a_size_max_budget);
    tcase_add_test(tc, test_without_a_budget_an_entry_whose_bytes_the_count_cannot_hold_declines_budget_exceeded);
    tcase_add_test(tc, test_a_need_that_wraps_past_size_max_beside_a_busy_entry_declines_budget_exceeded);
    tcase_add_test(tc, test_every_field_of_a_capture_key_changes_its_text_and_hash);
    tcase_add_test(tc, test_every_tinydit_step_shape_and_loop_has_its_own_key_and_its_own_workspace);
    tcase_add_test(tc, test_a_weight_re_laid_out_at_the_same_address_declines_weights_moved_never_replays_the_old_layout);
    tcase_add_test(tc, test_a_forgotten_stream_can_be_destroyed_and_a_stream_made_after_it_starts_afresh);
    tcase_add_test(tc, test_a_stream_used_again_after_it_was_forgotten_never_replays_its_old_graph);
    tcase_add_test(tc, test_forgetting_a_stream_waits_for_a_replay_held_on_it);
    tcase_add_test(tc, test_forget_stream_refuses_a_null_cache_or_stream_and_a_call_from_a_launch);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(suite()); }
