/* test_capture_adversarial.c -- an outside evaluator's battery against the
 * capture cache (capture_cache/cache.h, docs/CAPTURE.md), on the CPU
 * backend: every test tries to make a replay return something an eager run
 * of the same inputs would not, or to corrupt or leak the cache's state,
 * and asserts what the doc promises (where it is silent, what a serious
 * tool must do; each such test says so).
 *
 * The step under test is tests/synth_step.h's (test_capture_cache.c's too):
 *     y = latent + context;  y += w · latent     (w: component "wA")
 * latent is copied, context pinnable, y the one output. This suite's hooks
 * count launches, inject faults and run a per-user hook at the top of every
 * launch (eager or captured; never during a replay, which runs the recorded
 * kernels only), so a test can land an eviction or a failure at a chosen
 * point of a call. Every output is compared bitwise with the plain step run
 * once on a fresh workspace outside any cache, the call's constant (where
 * the step adds one) added on the host. Teardown checks that no backend
 * memory is left allocated. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "capture_cache/cache.h"
#include "capture_cache/key.h"
#include "kernels/backend.h"
#include "kernels/backend_impl.h" /* kern_stream_launch: the fault kernel */
#include "tests/cache_fixture.h"
#include "tests/support.h"
#include "tests/synth_step.h"

#define MAXN (64 * 64)      /* the most floats a tensor of the step holds */

/* ---- the step's hooks ------------------------------------------------------ */

typedef struct user user_t;
typedef void (*hook_fn)(user_t *u, kern_stream_t *s);

struct user {
    synth_user_t step;          /* first: the weights (backend memory) and ADV_HOOKS */
    hook_fn hook;               /* at the top of each launch; NULL: none */
    int capture_fail_after;     /* > 0: a capture fails after recording that many kernels */
    atomic_int replay_fail;     /* n > 0: the n-th next execution of fail_kernel fails (eager or
                                 * replayed; a capture only records it) */
    bool add_const;             /* y += the call's constant 0 (the references add it themselves) */
    int ws_fail_code;           /* != 0: ws_new fails with this code (once) */
    atomic_int launches, capturing_launches;
};
_Static_assert(offsetof(user_t, step) == 0, "the step reads its synth_user_t at the user's address");

static user_t *adv_user(synth_user_t *su) { return (user_t *)su; }

typedef struct { atomic_int *flag; } fail_args_t;

/* Counts *flag down while it is > 0 and fails the execution that takes it
 * to 0: what a kernel fault at run time looks like, in a replay as in an
 * eager run. */
static int fail_kernel(void *ctx, const void *args) {
    (void)ctx;
    const fail_args_t *a = args;
    int v = atomic_load(a->flag);
    while (v > 0 && !atomic_compare_exchange_weak(a->flag, &v, v - 1)) {
    }
    return v == 1 ? reel_fail(REEL_E_DEVICE, "injected kernel fault") : 0;
}

static int adv_ws_new(synth_user_t *su) {
    user_t *u = adv_user(su);
    if (!u->ws_fail_code) return 0;
    int code = u->ws_fail_code;
    u->ws_fail_code = 0;
    return reel_fail((reel_code_t)code, "injected workspace failure");
}

/* Counts the launch, runs the user's hook, then the fault kernel (recorded
 * by a capture, so a replay can fault too). */
static int adv_before_add(synth_user_t *su, const synth_launch_t *l) {
    user_t *u = adv_user(su);
    u->launches++;
    if (kern_stream_is_capturing(l->s)) u->capturing_launches++;
    if (u->hook) u->hook(u, l->s);
    fail_args_t fa = { &u->replay_fail };
    return kern_stream_launch(l->s, fail_kernel, &fa, sizeof fa);
}

static int adv_after_add(synth_user_t *su, const synth_launch_t *l) {
    user_t *u = adv_user(su);
    if (kern_stream_is_capturing(l->s) && u->capture_fail_after > 0) {
        /* Midway: kernels were recorded, and the capture is left open. */
        u->capture_fail_after = 0;
        return reel_fail(REEL_E_DEVICE, "injected: the capture failed midway");
    }
    return 0;
}

static int adv_after_residual(synth_user_t *su, const synth_launch_t *l) {
    return adv_user(su)->add_const ? synth_add_const(l) : 0;
}

static const synth_hooks_t ADV_HOOKS = {
    .ws_new = adv_ws_new,                 /* ws_fail_code */
    .before_add = adv_before_add,         /* launch counts, the user's hook, the fault kernel */
    .after_add = adv_after_add,           /* capture_fail_after */
    .after_residual = adv_after_residual, /* add_const */
};

/* u as a fresh user of the step reading weights w: no hook, no fault. */
static void user_init(user_t *u, float *w) {
    memset(u, 0, sizeof *u);
    u->step = (synth_user_t){ .w = w, .hooks = &ADV_HOOKS };
}

static const cap_program_t PROG = {
    .name = "adv", .n_inputs = 2, .n_outputs = 1, .pinnable = { false, true },
    .ws_new = synth_ws_new, .ws_free = synth_ws_free, .ws_bytes = synth_ws_bytes,
    .input = synth_input, .output = synth_output, .launch = synth_launch,
    .n_components = 1, .components = { "wA" }, .weights = synth_weights,
};

/* The same step stating its workspace size before allocating it. */
static const cap_program_t PROG_SIZED = {
    .name = "adv_sized", .n_inputs = 2, .n_outputs = 1, .pinnable = { false, true },
    .ws_new = synth_ws_new, .ws_size = synth_ws_size, .ws_free = synth_ws_free, .ws_bytes = synth_ws_bytes,
    .input = synth_input, .output = synth_output, .launch = synth_launch,
    .n_components = 1, .components = { "wA" }, .weights = synth_weights,
};

/* ---- fixture -------------------------------------------------------------- */

#define MAX_STREAMS 8
static kern_backend_t *B;
static kern_stream_t *S;
static kern_stream_t *XS[MAX_STREAMS];
static cap_cache_t *C;
static float *WA;
static user_t U;
static uint64_t rng;

/* Uniform in [-1, 1): every value this suite draws. */
static void fill_st(uint64_t *st, float *p, size_t n) { synth_fill(st, p, n, -1.f, 1.f); }
static void fill(float *p, size_t n) { fill_st(&rng, p, n); }

static kern_stream_t *extra_stream(void) {
    for (int i = 0; i < MAX_STREAMS; i++)
        if (!XS[i]) {
            XS[i] = kern_stream_new(B);
            ck_assert_msg(XS[i] != NULL, "stream: %s", reel_err_text());
            return XS[i];
        }
    ck_abort_msg("too many streams");
    return NULL;
}

static void setup(void) {
    cfx_open(&B, &S);
    memset(XS, 0, sizeof XS);
    C = NULL;
    rng = 0xad5e75a1ull;
    WA = cfx_weights_new(B, &rng);
    user_init(&U, WA);
}

static void teardown(void) {
    cap_cache_destroy(&C);
    for (int i = 0; i < MAX_STREAMS; i++) kern_stream_destroy(&XS[i]);
    cfx_close(&B, &S, WA);
}

/* ---- keys and calls ----------------------------------------------------------- */

/* The step's key for model: latent and context [rows, cols], "wA" at version 1. */
static cap_key_t make_key(const char *model, int64_t rows, int64_t cols) {
    return synth_key(B, model, rows, cols, "wA", 1);
}

typedef struct {
    const cap_program_t *prog;
    user_t *u;
    cap_key_t key;
    int64_t rows, cols, n;
    float x[MAXN], ctx[MAXN], out[MAXN];
    kern_tensor_t in[2], out_t;
    cap_const_t consts[1];
    int n_consts;
    bool prewarm;
} req_t;

static void req_init(req_t *r, user_t *u, const char *model, int64_t rows, int64_t cols) {
    memset(r, 0, sizeof *r);
    ck_assert_int_le(rows * cols, MAXN);
    r->prog = &PROG;
    r->u = u;
    r->key = make_key(model, rows, cols);
    r->rows = rows;
    r->cols = cols;
    r->n = rows * cols;
    fill(r->x, (size_t)r->n);
    fill(r->ctx, (size_t)r->n);
    r->in[0] = synth_host_tensor(r->x, rows, cols);
    r->in[1] = synth_host_tensor(r->ctx, rows, cols);
    r->out_t = synth_host_tensor(r->out, rows, cols);
}

static int req_try_on(cap_cache_t *c, kern_stream_t *s, req_t *r, cap_result_t *res) {
    cap_call_t call = { .key = &r->key, .inputs = r->in, .outputs = &r->out_t, .consts = r->consts,
                        .n_consts = r->n_consts, .prewarm = r->prewarm };
    res->ran = (cap_ran_t)-1;
    res->reason = CAP_DECLINE_COUNT;
    if (r->out_t.data == r->out) memset(r->out, 0xff, sizeof r->out); /* NaN: a call that writes nothing shows */
    return cap_dispatch(c, s, r->prog, r->u, &call, res);
}

static cap_result_t call_on(kern_stream_t *s, req_t *r) {
    cap_result_t res;
    int rc = req_try_on(C, s, r, &res);
    ck_assert_msg(rc == 0, "cap_dispatch: %s", reel_err_text());
    return res;
}
static cap_result_t call(req_t *r) { return call_on(S, r); }

/* Each evaluates its call once. */
#define EXPECT_RAN(res, want, what) cfx_expect_ran((res), (want), (what))
#define EXPECT_EAGER(res, why, what) cfx_expect_eager((res), (why), (what))

/* The pure eager result of the step on (x, ctx) with weights w, run on
 * stream s: synth_reference (the plain step outside any cache, none of this
 * suite's hooks; consts[0], when n_consts > 0, added on the host). */
static void eager_ref_on(kern_stream_t *s, const float *w, const cap_key_t *key, const float *x, const float *ctx,
                         const cap_const_t *consts, int n_consts, float *out) {
    ck_assert_msg(synth_reference(w, s, key, x, ctx, consts, n_consts, out) == 0, "reference: %s",
                  reel_err_text());
}

/* a and b (n floats each) are bitwise equal. */
static bool same_bits(const float *a, const float *b, int64_t n) { return synth_first_diff(a, b, n) < 0; }

/* r's output is bitwise the pure eager run on its current inputs (read
 * through their views), or the test fails. xs/cs: the inputs as they were
 * when the call was made (NULL: read them now). */
static void expect_eager_bits_of(req_t *r, const float *xs, const float *cs, const char *what, int i) {
    static float x[MAXN], c[MAXN], want[MAXN];
    if (!xs) { synth_gather(&r->in[0], x); xs = x; }
    if (!cs) { synth_gather(&r->in[1], c); cs = c; }
    eager_ref_on(S, r->u->step.w, &r->key, xs, cs, r->consts, r->u->add_const ? r->n_consts : 0, want);
    const float *got = kern_tensor_ptr(&r->out_t);
    int64_t j = synth_first_diff(got, want, r->n);
    ck_assert_msg(j < 0, "%s %d: element %lld is %.9g, pure eager gives %.9g", what, i,
                  (long long)j, (double)got[j], (double)want[j]);
}
static void expect_eager_bits(req_t *r, const char *what, int i) { expect_eager_bits_of(r, NULL, NULL, what, i); }

/* How call i of a new key runs under the default warmup (2 eager calls):
 * eager, eager, captured, then replayed. */
static cap_ran_t ran_at(int i) { return i < 2 ? CAP_RAN_EAGER : i == 2 ? CAP_RAN_CAPTURED : CAP_RAN_REPLAYED; }

/* Warmup (2 calls), capture, one replay; new latent values each call. */
static void warm_capture_replay(req_t *r) {
    for (int i = 0; i < 4; i++) {
        fill(r->x, (size_t)r->n);
        cap_result_t res = call(r);
        if (i < 2) EXPECT_EAGER(res, CAP_DECLINE_WARMING_UP, "warmup");
        else EXPECT_RAN(res, ran_at(i), "warm_capture_replay");
        expect_eager_bits(r, "warm_capture_replay", i);
    }
}

/* n calls of r, each with new latent values, each bitwise the pure eager
 * run (however the cache served it). */
static void calls_give_eager_bits(req_t *r, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        fill(r->x, (size_t)r->n);
        call(r);
        expect_eager_bits(r, what, i);
    }
}

/* n calls of r, each with new latent values, each a replay of r's graph
 * and bitwise the pure eager run. */
static void replays_give_eager_bits(req_t *r, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        fill(r->x, (size_t)r->n);
        EXPECT_RAN(call(r), CAP_RAN_REPLAYED, what);
        expect_eager_bits(r, what, i);
    }
}

/* r's calls carry one constant, name, of type (its value: r->consts[0].v). */
static void req_one_const(req_t *r, const char *name, cap_const_type_t type) {
    r->n_consts = 1;
    snprintf(r->consts[0].name, sizeof r->consts[0].name, "%s", name);
    r->consts[0].type = type;
}

/* One entry's bytes and one graph's, measured on a scratch cache. */
static void probe_sizes(int64_t rows, int64_t cols, size_t *entry, size_t *graph) {
    cap_options_t o = cfx_options();
    o.on_event = NULL;
    cap_cache_t *saved = C;
    C = cfx_cache_new(B, &o, WA);
    req_t *r = malloc(sizeof *r);
    user_t pu;
    user_init(&pu, WA);
    req_init(r, &pu, "adv:probe", rows, cols);
    warm_capture_replay(r);
    cap_stats_t st = cfx_stats(C);
    *entry = st.ws_bytes;
    *graph = st.graph_bytes;
    cap_cache_destroy(&C);
    C = saved;
    free(r);
    ck_assert_uint_gt(*entry, 0);
    ck_assert_uint_gt(*graph, 0);
}

/* ==== 1. inputs that change under the same key ================================== */

/* Doc: "bind never resizes: an input whose dtype or shape differs from the
 * static slot makes the call fail ... (counted shape_mismatch)". An input
 * whose bytes would fit (same byte size, other dtype or dims) must never be
 * reinterpreted, and the graph must survive for the right calls. */
START_TEST(test_input_whose_dtype_shape_or_rank_changed_under_its_key_is_refused_never_reinterpreted) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "adv:shape", 8, 8);
    warm_capture_replay(&r);
    int64_t s416[2] = { 4, 16 }, s881[3] = { 8, 8, 1 }, s8x16[2] = { 8, 16 }, s64[1] = { 64 };
    kern_tensor_t bad[5] = {
        kern_tensor_make(r.ctx, KERN_F32, KERN_DEVICE_HOST, 2, s416),   /* same numel, other dims */
        kern_tensor_make(r.ctx, KERN_F32, KERN_DEVICE_HOST, 3, s881),   /* same numel, other rank */
        kern_tensor_make(r.ctx, KERN_BF16, KERN_DEVICE_HOST, 2, s8x16), /* same bytes, other dtype */
        kern_tensor_make(r.ctx, KERN_F32, KERN_DEVICE_HOST, 1, s64),
        kern_tensor_make(r.ctx, KERN_F16, KERN_DEVICE_HOST, 2, s8x16),
    };
    for (int k = 0; k < 5; k++)
        for (int which = 0; which < 2; which++) { /* the copied latent and the pinned context */
            kern_tensor_t keep = r.in[which];
            r.in[which] = bad[k];
            r.in[which].data = which ? (void *)r.ctx : (void *)r.x;
            cap_result_t res;
            ck_assert_msg(req_try_on(C, S, &r, &res) != 0, "bad input %d in slot %d was accepted", k, which);
            r.in[which] = keep;
            ck_assert_msg(r.out[0] != r.out[0], "a refused call wrote its output"); /* still the NaN fill */
        }
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.declines[CAP_DECLINE_SHAPE_MISMATCH], 10);
    ck_assert_uint_eq(st.entries, 1);
    ck_assert_uint_eq(st.captures, 1);
    /* The graph is intact for the calls its key declares. */
    replays_give_eager_bits(&r, 3, "after the refusals");
    cfx_expect_graph_accounting(C, "shape refusals");
}
END_TEST

/* A copied input may come with any strides on the host (transposed,
 * reversed, broadcast): the graph replays its values, never its layout. */
START_TEST(test_copied_input_with_changing_strides_replays_its_values_not_its_layout) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    static float big[4 * 64 * 64];
    req_init(&r, &U, "adv:strides", 8, 8);
    warm_capture_replay(&r);
    fill(big, sizeof big / sizeof big[0]);
    kern_tensor_t plain = r.in[0];
    for (int v = 0; v < 5; v++) {
        kern_tensor_t t = plain;
        t.data = big;
        t.offset = 0;
        switch (v) {
        case 0: t.stride[0] = 1; t.stride[1] = 8; break;                      /* transposed */
        case 1: t.stride[0] = 64; t.stride[1] = 2; break;                     /* every other column of a wide buffer */
        case 2: t.stride[0] = 0; t.stride[1] = 1; break;                      /* one row broadcast */
        case 3: t.offset = 56 * sizeof(float); t.stride[0] = -8; t.stride[1] = 1; break; /* rows reversed */
        case 4: t.offset = 100 * sizeof(float); t.stride[0] = 8; t.stride[1] = 1; break; /* contiguous at an offset */
        }
        r.in[0] = t;
        cap_result_t res = call(&r);
        EXPECT_RAN(res, CAP_RAN_REPLAYED, "strided latent");
        expect_eager_bits(&r, "strided latent", v);
    }
    r.in[0] = plain;
    cfx_expect_graph_accounting(C, "strides");
}
END_TEST

/* ==== 2. pinned inputs ========================================================= */

/* A pinned buffer freed and another allocated at the same address: the
 * graph reads the address, so it computes with the new contents (what an
 * eager run of those contents gives); a view of the same address that is
 * not the pinned layout (offset, strides) is never read as the old one. */
START_TEST(test_pinned_buffer_refilled_at_the_same_address_replays_the_new_contents) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "adv:pinreuse", 8, 8);
    warm_capture_replay(&r);
    ck_assert_uint_gt(cfx_stats(C).bind_bytes_pinned, 0); /* context is read in place */
    /* "free" and "reallocate" at the same address: new contents, incl. values the old ones never had */
    for (int i = 0; i < 4; i++) {
        fill(r.ctx, (size_t)r.n);
        if (i == 2) for (int j = 0; j < r.n; j++) r.ctx[j] = j % 2 ? INFINITY : -0.f;
        EXPECT_RAN(call(&r), CAP_RAN_REPLAYED, "refilled pin");
        expect_eager_bits(&r, "refilled pin", i);
    }
    /* The same bytes seen through another layout at the same base address. */
    kern_tensor_t pinned = r.in[1];
    kern_tensor_t tr = pinned;
    tr.stride[0] = 1;
    tr.stride[1] = 8;
    r.in[1] = tr;
    EXPECT_EAGER(call(&r), CAP_DECLINE_PINNED_INPUT_MOVED, "transposed pin");
    expect_eager_bits(&r, "transposed pin", 0);
    /* data one float lower, offset 1: the same first byte, another identity (conservative) */
    r.in[1] = pinned;
    r.in[1].data = r.ctx - 1;
    r.in[1].offset = sizeof(float);
    call(&r);
    expect_eager_bits(&r, "re-based pin", 0);
    r.in[1] = pinned;
    for (int i = 0; i < 3; i++) {
        fill(r.ctx, (size_t)r.n);
        call(&r);
        expect_eager_bits(&r, "back home", i);
    }
    cfx_expect_graph_accounting(C, "pin reuse");
}
END_TEST

/* ==== 3. aliasing ============================================================== */

/* Outputs aliasing inputs: the latent updated in place (out == latent, the
 * denoising loop's own pattern), the output written over the pinned context
 * (doc: mutable_output, never replayed over it), and a partial overlap.
 * Each step must equal the eager loop on the same sequence. */
START_TEST(test_outputs_aliasing_inputs_equal_an_eager_loop) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    static float x[MAXN], c[MAXN];
    /* (a) out == latent: x_{t+1} = step(x_t) */
    req_init(&r, &U, "adv:alias-x", 8, 8);
    r.out_t = synth_host_tensor(r.x, 8, 8);
    for (int i = 0; i < 8; i++) {
        memcpy(x, r.x, sizeof x);
        memcpy(c, r.ctx, sizeof c);
        EXPECT_RAN(call(&r), ran_at(i), "in-place latent step");
        expect_eager_bits_of(&r, x, c, "in-place latent step", i);
        for (int j = 0; j < r.n; j++) r.x[j] *= 0.5f; /* keep it bounded */
    }
    /* (b) out == the pinned context: from the first such call on, the
     * context changes under the graph every step. */
    req_init(&r, &U, "adv:alias-ctx", 8, 8);
    warm_capture_replay(&r);
    r.out_t = synth_host_tensor(r.ctx, 8, 8);
    for (int i = 0; i < 6; i++) {
        memcpy(x, r.x, sizeof x);
        memcpy(c, r.ctx, sizeof c);
        cap_result_t res = call(&r);
        if (i == 0) EXPECT_EAGER(res, CAP_DECLINE_MUTABLE_OUTPUT, "output over the pinned context");
        expect_eager_bits_of(&r, x, c, "output-over-context step", i);
        for (int j = 0; j < r.n; j++) r.ctx[j] *= 0.5f;
    }
    /* (c) the output overlaps the context's second half and the latent's first */
    req_init(&r, &U, "adv:alias-part", 4, 8);
    static float shared[96];
    fill(shared, 96);
    r.in[0] = synth_host_tensor(shared + 32, 4, 8); /* latent: [32, 64) */
    r.in[1] = synth_host_tensor(shared, 4, 8);      /* context: [0, 32) */
    r.out_t = synth_host_tensor(shared + 16, 4, 8); /* output: [16, 48) */
    for (int i = 0; i < 8; i++) {
        memcpy(x, shared + 32, 32 * sizeof(float));
        memcpy(c, shared, 32 * sizeof(float));
        call(&r);
        expect_eager_bits_of(&r, x, c, "partially aliased step", i); /* the output: shared + 16, r.n = 32 */
        for (int j = 0; j < 96; j++) shared[j] *= 0.5f;
    }
    ck_assert(cap_cache_invariants(C));
    cfx_expect_graph_accounting(C, "aliasing");
}
END_TEST

/* ==== 4. weights ================================================================ */

/* Doc ("What the cache cannot see"): weights rewritten in place without a
 * versioned update are a caller error, but a graph reads addresses, so it
 * computes with the new values exactly as eager would; an audit therefore
 * finds nothing. Checked: every replay equals eager on the new weights,
 * audits run and pass, no decline. */
START_TEST(test_weights_rewritten_in_place_without_a_sync_replay_as_eager_would_and_audits_pass) {
    cap_options_t o = cfx_options();
    o.audit_every = 2;
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "adv:inplace-nosync", 8, 8);
    warm_capture_replay(&r);
    for (int i = 0; i < 10; i++) {
        fill(WA, SYNTH_W); /* behind the cache's back */
        if (i == 5) for (int j = 0; j < SYNTH_W; j++) WA[j] = j % 3 ? NAN : -INFINITY;
        fill(r.x, (size_t)r.n);
        EXPECT_RAN(call(&r), CAP_RAN_REPLAYED, "replay after a silent rewrite");
        expect_eager_bits(&r, "silent weights", i);
    }
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_ge(st.audits, 5);
    ck_assert_uint_eq(st.declines[CAP_DECLINE_AUDIT_MISMATCH], 0);
    ck_assert_uint_eq(st.captures, 1);
}
END_TEST

/* ==== 5. special values and constants ============================================= */

/* NaN (several payloads, both signs), ±Inf, -0 and subnormals in the
 * inputs, at warmup, at capture (verify compares bits: NaN must not make it
 * refuse) and at replay; a NaN constant replays as that NaN, while -0.0
 * after +0.0 or another NaN payload is another constant (bits differ). */
START_TEST(test_nan_inf_signed_zero_and_subnormal_values_replay_bitwise) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "adv:nan", 8, 8);
    U.add_const = true;
    req_one_const(&r, "shift", CAP_CONST_F64);
    r.consts[0].v.f = 0.0;
    const uint32_t specials[] = { 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fc12345u, 0x7f800000u, 0xff800000u,
                                  0x80000000u, 0x00000001u, 0x807fffffu, 0x3f800000u };
    for (int i = 0; i < 6; i++) {
        fill(r.x, (size_t)r.n);
        for (int j = 0; j < r.n; j += 3) memcpy(&r.x[j], &specials[(j / 3 + i) % 10], 4);
        for (int j = 1; j < r.n; j += 5) memcpy(&r.ctx[j], &specials[(j + i) % 10], 4);
        EXPECT_RAN(call(&r), ran_at(i), "special values");
        expect_eager_bits(&r, "special values", i);
    }
    /* -0.0 is not +0.0 to a constant check */
    r.consts[0].v.f = -0.0;
    EXPECT_EAGER(call(&r), CAP_DECLINE_CONSTANT_CHANGED, "-0.0 after +0.0");
    expect_eager_bits(&r, "-0.0 const", 0);
    /* a NaN constant: captured by a new key (the graph bakes constants per key) */
    static req_t q;
    req_init(&q, &U, "adv:nan-const", 8, 8);
    req_one_const(&q, "shift", CAP_CONST_F64);
    uint64_t nan1 = 0x7ff8000000000001ull, nan2 = 0x7ff8000000000002ull;
    memcpy(&q.consts[0].v.f, &nan1, 8);
    for (int i = 0; i < 5; i++) {
        EXPECT_RAN(call(&q), ran_at(i), "nan const");
        expect_eager_bits(&q, "nan const", i);
    }
    memcpy(&q.consts[0].v.f, &nan2, 8);
    EXPECT_EAGER(call(&q), CAP_DECLINE_CONSTANT_CHANGED, "another NaN payload");
    ck_assert_uint_eq(cfx_stats(C).declines[CAP_DECLINE_VERIFY_MISMATCH], 0);
}
END_TEST

/* r's constant shows in every element of the step's result on its current
 * inputs: the reference with it and the reference without it differ
 * bitwise everywhere (so a result that dropped it, or carries another
 * value, cannot pass for it). */
static void expect_constant_changes_every_element(req_t *r, const char *what) {
    static float with[MAXN], without[MAXN];
    eager_ref_on(S, r->u->step.w, &r->key, r->x, r->ctx, r->consts, r->n_consts, with);
    eager_ref_on(S, r->u->step.w, &r->key, r->x, r->ctx, NULL, 0, without);
    for (int64_t j = 0; j < r->n; j++)
        ck_assert_msg(memcmp(&with[j], &without[j], sizeof(float)) != 0,
                      "%s: element %lld is %.9g with the constant and without it", what, (long long)j,
                      (double)with[j]);
}

/* Doc ("a call whose constants differ from the ones its entry's graph
 * baked declines constant_changed and runs eager; the graph stays for
 * calls with the baked values"), with constants that change every value,
 * against a reference that adds the call's own constant on the host: key a
 * bakes 1.5 and its captured and replayed calls give +1.5; a with 2.5
 * gives +2.5 (eager, twice: no capture for the new value), then 1.5
 * replays again; key b bakes 2.5 and replays +2.5 beside a's graph. Each
 * call's bits are checked before its path, so a cache that let a changed
 * constant through to the old graph fails on the values it returns. */
START_TEST(test_a_changed_constant_gives_its_own_value_never_the_one_a_graph_baked) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t a, b;
    req_init(&a, &U, "adv:const-a", 8, 8);
    req_init(&b, &U, "adv:const-b", 8, 8);
    U.add_const = true;
    req_one_const(&a, "shift", CAP_CONST_F64);
    req_one_const(&b, "shift", CAP_CONST_F64);
    a.consts[0].v.f = 1.5;
    b.consts[0].v.f = 2.5;
    expect_constant_changes_every_element(&a, "1.5");
    expect_constant_changes_every_element(&b, "2.5");
    for (int i = 0; i < 4; i++) {
        fill(a.x, (size_t)a.n);
        cap_result_t res = call(&a);
        expect_eager_bits(&a, "a, 1.5", i);
        EXPECT_RAN(res, ran_at(i), "a, 1.5");
    }
    a.consts[0].v.f = 2.5;
    for (int i = 0; i < 2; i++) {
        fill(a.x, (size_t)a.n);
        cap_result_t res = call(&a);
        expect_eager_bits(&a, "a, 2.5 (its graph baked 1.5)", i);
        EXPECT_EAGER(res, CAP_DECLINE_CONSTANT_CHANGED, "a, 2.5 (its graph baked 1.5)");
    }
    a.consts[0].v.f = 1.5;
    replays_give_eager_bits(&a, 1, "a, 1.5 again");
    for (int i = 0; i < 4; i++) {
        fill(b.x, (size_t)b.n);
        cap_result_t res = call(&b);
        expect_eager_bits(&b, "b, 2.5", i);
        EXPECT_RAN(res, ran_at(i), "b, 2.5");
    }
    replays_give_eager_bits(&a, 2, "a, 1.5 beside b");
    replays_give_eager_bits(&b, 2, "b, 2.5 beside a");
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.captures, 2);
    ck_assert_uint_eq(st.declines[CAP_DECLINE_CONSTANT_CHANGED], 2);
    ck_assert_uint_eq(st.declines[CAP_DECLINE_VERIFY_MISMATCH], 0);
}
END_TEST

/* ==== 6. keys ===================================================================== */

/* Two keys that differ in any one field are two texts, two hashes and two
 * entries (a hash collision cannot be crafted cheaply for FNV-1a 64, so the
 * lookup's full-text compare is checked instead: the entries stay apart
 * even when one field deep in the text differs); a key whose text would
 * not fit is refused, never cut short onto another key's text. */
START_TEST(test_keys_differing_in_one_field_never_share_an_entry_and_an_overlong_key_is_refused) {
    cap_options_t o = cfx_options();
    o.warmup = 0;
    C = cfx_cache_new(B, &o, WA);
    enum { NV = 10 };
    static req_t r[NV];
    char text[NV][CAP_KEY_TEXT_MAX];
    for (int v = 0; v < NV; v++) {
        req_init(&r[v], &U, "adv:keys", 8, 8);
        cap_key_t *k = &r[v].key;
        switch (v) {
        case 1: snprintf(k->arch, sizeof k->arch, "%s-x", kern_backend_arch(B)); break;
        case 2: snprintf(k->model, sizeof k->model, "adv:keyz"); break;
        case 3: snprintf(k->loop, sizeof k->loop, "sde"); break;
        case 4: snprintf(k->inputs[1].name, sizeof k->inputs[1].name, "uncond"); break;
        case 5: snprintf(k->graph.cfg, sizeof k->graph.cfg, "cond+uncond"); break;
        case 6: snprintf(k->graph.expert, sizeof k->graph.expert, "high"); break;
        case 7: snprintf(k->graph.sched, sizeof k->graph.sched, "f64"); break;
        case 8: k->graph.dtype = KERN_BF16; break;
        case 9: snprintf(k->device, sizeof k->device, "cpu2"); break;
        }
        ck_assert_int_gt(cap_key_text(k, false, text[v], sizeof text[v]), 0);
        for (int u = 0; u < v; u++) {
            ck_assert_str_ne(text[u], text[v]);
            ck_assert_uint_ne(cap_key_hash(&r[u].key), cap_key_hash(&r[v].key));
        }
    }
    for (int v = 0; v < NV; v++) {
        EXPECT_RAN(call(&r[v]), CAP_RAN_CAPTURED, "each key captures its own graph");
        expect_eager_bits(&r[v], "per-key", v);
    }
    ck_assert_uint_eq(cfx_stats(C).entries, NV);
    /* An overlong key: 8 inputs with 47-character names and 5 dims each. */
    static req_t big;
    req_init(&big, &U, "adv:keys", 8, 8);
    memset(big.key.model, 'm', sizeof big.key.model - 1);
    memset(big.key.graph.cfg, 'c', sizeof big.key.graph.cfg - 1);
    memset(big.key.graph.expert, 'e', sizeof big.key.graph.expert - 1);
    for (int i = 2; i < CAP_MAX_INPUTS; i++) {
        char name[CAP_NAME_MAX];
        memset(name, 'a' + i, CAP_NAME_MAX - 1);
        name[CAP_NAME_MAX - 1] = 0;
        int64_t sh[5] = { 0, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX }; /* 0 bytes: a valid signature */
        TS_OK(cap_key_add_input(&big.key, name, KERN_F32, 5, sh));
    }
    char buf[CAP_KEY_TEXT_MAX];
    ck_assert_int_lt(cap_key_text(&big.key, false, buf, sizeof buf), 0);
    cap_result_t res;
    ck_assert_int_ne(req_try_on(C, S, &big, &res), 0);
    ck_assert_uint_eq(cfx_stats(C).entries, NV);
}
END_TEST

/* ==== 7. the budget ================================================================ */

/* Budget 0 is unlimited (doc: "0 = unlimited"): 64 keys all keep their graphs. */
START_TEST(test_budget_zero_is_unlimited) {
    cap_options_t o = cfx_options();
    o.budget_bytes = 0;
    o.warmup = 0;
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "adv:b0", 8, 8);
    for (int k = 0; k < 64; k++) {
        snprintf(r.key.model, sizeof r.key.model, "adv:b0-%d", k);
        EXPECT_RAN(call(&r), CAP_RAN_CAPTURED, "unlimited");
    }
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.graphs, 64);
    ck_assert_uint_eq(st.evictions[CAP_EVICT_LRU], 0);
}
END_TEST

/* Budget exactly one entry and its graph: a key captures and replays; a
 * second key evicts it (lru) and every call of both stays bitwise right,
 * never over the budget. */
START_TEST(test_budget_of_exactly_one_graph_alternating_keys_stay_correct) {
    size_t ent, g;
    probe_sizes(8, 8, &ent, &g);
    cap_options_t o = cfx_options();
    o.budget_bytes = ent + g;
    C = cfx_cache_new(B, &o, WA);
    static req_t a, b;
    req_init(&a, &U, "adv:one-a", 8, 8);
    req_init(&b, &U, "adv:one-b", 8, 8);
    warm_capture_replay(&a);
    ck_assert_uint_eq(cfx_stats(C).bytes_held, o.budget_bytes);
    for (int i = 0; i < 12; i++) {
        req_t *r = (i / 3) % 2 ? &a : &b;
        fill(r->x, (size_t)r->n);
        call(r);
        expect_eager_bits(r, "alternating", i);
        cap_stats_t st = cfx_stats(C);
        ck_assert_uint_le(st.bytes_held, o.budget_bytes);
        ck_assert_uint_le(st.entries, 1);
    }
    ck_assert_uint_gt(cfx_stats(C).evictions[CAP_EVICT_LRU], 0);
    cfx_expect_graph_accounting(C, "one-graph budget");
}
END_TEST

/* Budget below any workspace: every call runs in a transient workspace
 * (budget_exceeded), nothing is held and nothing leaks. */
START_TEST(test_budget_below_any_workspace_runs_every_call_transient) {
    cap_options_t o = cfx_options();
    o.budget_bytes = 16;
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "adv:tiny-budget", 8, 8);
    size_t base = kern_bytes_in_use(B);
    for (int i = 0; i < 6; i++) {
        r.prog = i % 2 ? &PROG_SIZED : &PROG; /* admitted before (ws_size) or after the allocation */
        fill(r.x, (size_t)r.n);
        EXPECT_EAGER(call(&r), CAP_DECLINE_BUDGET_EXCEEDED, "tiny budget");
        expect_eager_bits(&r, "tiny budget", i);
        ck_assert_uint_eq(kern_bytes_in_use(B), base);
    }
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.bytes_held, 0);
    ck_assert_uint_eq(st.entries, 0);
    ck_assert_uint_eq(st.transient_runs, 6);
}
END_TEST

/* Budget that holds the workspace but never the graph: the capture is
 * tried once, refused (budget_exceeded), and not tried again on every call
 * (doc: "captures again on a later call once its graph would fit"): one
 * capturing launch in all, every call bitwise eager. */
START_TEST(test_budget_that_holds_the_workspace_but_not_the_graph_captures_once_then_stays_eager) {
    size_t ent, g;
    probe_sizes(8, 8, &ent, &g);
    cap_options_t o = cfx_options();
    o.budget_bytes = ent + g - 1;
    C = cfx_cache_new(B, &o, WA);
    static req_t r;
    req_init(&r, &U, "adv:no-graph-room", 8, 8);
    for (int i = 0; i < 10; i++) {
        fill(r.x, (size_t)r.n);
        cap_result_t res = call(&r);
        if (i < 2) EXPECT_EAGER(res, CAP_DECLINE_WARMING_UP, "warmup");
        else EXPECT_EAGER(res, CAP_DECLINE_BUDGET_EXCEEDED, "no room for the graph");
        expect_eager_bits(&r, "no graph room", i);
    }
    ck_assert_int_eq(U.capturing_launches, 1);
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.captures, 0);
    ck_assert_uint_eq(st.graphs, 0);
    ck_assert_uint_le(st.bytes_held, o.budget_bytes);
}
END_TEST

/* Thousands of distinct keys through a budget of K entries: entries and
 * bytes stay bounded, every eviction takes the least recently used entry
 * (tracked by a model LRU here), a hot key touched every other call keeps
 * its one graph, and backend memory returns to its start. */
START_TEST(test_thousands_of_keys_evict_in_lru_order_and_memory_stays_bounded) {
    size_t ent, g;
    probe_sizes(4, 4, &ent, &g);
    enum { K = 8, NKEYS = 1500 };
    cap_options_t o = cfx_options();
    o.budget_bytes = K * (ent + g);
    o.warmup = 1;
    C = cfx_cache_new(B, &o, WA);
    size_t base = kern_bytes_in_use(B);
    static req_t hot, cold;
    req_init(&hot, &U, "adv:hot", 4, 4);
    req_init(&cold, &U, "adv:cold", 4, 4);
    /* the model: hashes of live entries, most recent first */
    uint64_t lru[64 * K];
    int n_lru = 0;
    int hot_replays = 0;
    for (int i = 0; i < NKEYS; i++) {
        req_t *r = i % 2 ? &cold : &hot;
        if (r == &cold) snprintf(cold.key.model, sizeof cold.key.model, "adv:cold-%d", i);
        uint64_t h = cap_key_hash(&r->key);
        int before = cfx_n_recs();
        fill(r->x, (size_t)r->n);
        cap_result_t res = call(r);
        if (r == &hot && res.ran == CAP_RAN_REPLAYED) hot_replays++;
        expect_eager_bits(r, "lru", i);
        /* the evictions this call made: each the model's least recent entry */
        for (int e = before; e < cfx_n_recs(); e++) {
            cfx_rec_t ev = cfx_rec(e);
            if (ev.kind != CAP_EV_EVICT) continue;
            ck_assert_int_eq(ev.reason, CAP_EVICT_LRU);
            ck_assert_int_gt(n_lru, 0);
            ck_assert_msg(ev.hash == lru[n_lru - 1], "call %d evicted an entry that was not the least recent", i);
            n_lru--;
        }
        int at = -1;
        for (int j = 0; j < n_lru; j++)
            if (lru[j] == h) at = j;
        if (at < 0) at = n_lru++;
        ck_assert_int_le(n_lru, 64 * K);
        memmove(lru + 1, lru, (size_t)at * sizeof lru[0]);
        lru[0] = h;
        cap_stats_t st = cfx_stats(C);
        ck_assert_uint_le(st.bytes_held, o.budget_bytes);
        ck_assert_uint_eq(st.entries, (size_t)n_lru);
        if (i % 100 == 0) ck_assert(cap_cache_invariants(C));
        if (cfx_n_recs() > CFX_MAX_REC - 64) cfx_recs_clear(); /* only this call's events are read */
    }
    ck_assert_int_ge(hot_replays, NKEYS / 2 - 3);
    cap_cache_evict_all(C);
    ck_assert_uint_eq(kern_bytes_in_use(B), base);
}
END_TEST

/* ==== 8. eviction landing in a call ================================================ */

static cap_key_t *g_victim;
static int g_evict_rc;
static bool g_seen_capture;

static void *evict_main(void *a) {
    (void)a;
    g_evict_rc = cap_evict_key(C, g_victim, CAP_EVICT_EXPLICIT);
    return NULL;
}

/* At the first launch after a capturing one: verify's eager run, when the
 * graph is made but not yet published. */
static void hook_evict_in_verify(user_t *u, kern_stream_t *s) {
    if (kern_stream_is_capturing(s)) {
        g_seen_capture = true;
        return;
    }
    if (!g_seen_capture) return;
    u->hook = NULL;
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, evict_main, NULL), 0);
    pthread_join(t, NULL);
}

/* An eviction (another thread's cap_evict_key) landing while a capture
 * verifies: the graph never published must not be counted as a graph
 * evicted: captures - graph evictions stays the graphs held (doc, "Decline
 * reasons and events"), in the counters and in the events. */
START_TEST(test_eviction_during_verify_is_not_counted_as_the_eviction_of_a_graph) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r, other;
    req_init(&other, &U, "adv:verify-other", 8, 8);
    warm_capture_replay(&other); /* a graph held, so the count can go wrong both ways */
    req_init(&r, &U, "adv:verify-evict", 8, 8);
    for (int i = 0; i < 2; i++) call(&r);
    g_victim = &r.key;
    g_seen_capture = false;
    U.hook = hook_evict_in_verify;
    cap_result_t res = call(&r);
    U.hook = NULL;
    ck_assert_int_eq(g_evict_rc, 1);
    ck_assert_int_eq(res.ran, CAP_RAN_EAGER);
    expect_eager_bits(&r, "evicted in verify", 0);
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.graphs, 1);
    ck_assert_uint_eq(st.entries, 1);
    ck_assert_msg(st.graphless_evictions[CAP_EVICT_EXPLICIT] == 1,
                  "the entry evicted mid-verify held no published graph, but the eviction was counted as a graph's");
    cfx_expect_graph_accounting(C, "eviction during verify");
    /* and the key starts over cleanly */
    calls_give_eager_bits(&r, 4, "after");
    cfx_expect_graph_accounting(C, "after the eviction during verify");
}
END_TEST

/* ==== 9. threads =================================================================== */

#define NT 3
typedef struct {
    kern_stream_t *s;
    user_t u;
    req_t r;
    int calls, bad, failed, replays;
    bool captured;
    pthread_barrier_t *go;
    atomic_bool *stop;
} thr_t;

static void *replayer_main(void *arg) {
    thr_t *t = arg;
    static _Thread_local float want[MAXN];
    pthread_barrier_wait(t->go);
    for (int i = 0; i < t->calls; i++) {
        fill_st(&(uint64_t){ (uint64_t)i * 7919u + (uint64_t)(uintptr_t)t }, t->r.x, (size_t)t->r.n);
        cap_result_t res;
        if (req_try_on(C, t->s, &t->r, &res) != 0) {
            t->failed++;
            continue;
        }
        if (res.ran == CAP_RAN_REPLAYED) t->replays++;
        /* the reference on this thread's own stream */
        if (synth_reference(t->u.step.w, t->s, &t->r.key, t->r.x, t->r.ctx, NULL, 0, want) != 0) {
            t->failed++;
            continue;
        }
        if (!same_bits(t->r.out, want, t->r.n)) t->bad++;
    }
    atomic_store(t->stop, true);
    return NULL;
}

/* Evictions of the replayers' keys (cap_evict_key) and budget pressure
 * from a stream of cold keys, both on other threads, land while replays run
 * on their own streams: no replay reads a freed workspace (ASan/TSan), every
 * result is bitwise eager, the invariants hold. */
START_TEST(test_evictions_racing_replays_on_other_streams_never_corrupt_a_result) {
    size_t ent, g;
    probe_sizes(8, 8, &ent, &g);
    cap_options_t o = cfx_options();
    o.warmup = 1;
    o.budget_bytes = (NT + 2) * (ent + g);
    C = cfx_cache_new(B, &o, WA);
    static thr_t t[NT];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, NT + 1);
    atomic_bool stop = false;
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].s = extra_stream();
        user_init(&t[i].u, WA);
        req_init(&t[i].r, &t[i].u, "adv:race", 8, 8);
        t[i].r.key = make_key(i == 0 ? "adv:race-a" : "adv:race-shared", 8, 8);
        t[i].calls = 150;
        t[i].go = &go;
        t[i].stop = &stop;
        ck_assert_int_eq(pthread_create(&th[i], NULL, replayer_main, &t[i]), 0);
    }
    pthread_barrier_wait(&go);
    /* This thread: evict the shared key now and then, and push cold keys
     * through the budget on stream S. */
    static req_t cold;
    user_t cu;
    user_init(&cu, WA);
    req_init(&cold, &cu, "adv:race-cold", 8, 8);
    cap_key_t shared = make_key("adv:race-shared", 8, 8);
    int evicted = 0;
    for (int i = 0; !atomic_load(&stop) && i < 4000; i++) {
        if (i % 3 == 0) {
            int n = cap_evict_key(C, &shared, CAP_EVICT_EXPLICIT);
            ck_assert_int_ge(n, 0);
            evicted += n;
        } else {
            snprintf(cold.key.model, sizeof cold.key.model, "adv:race-cold-%d", i % 7);
            call(&cold);
        }
        sched_yield();
    }
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < NT; i++) {
        ck_assert_msg(t[i].failed == 0, "thread %d: %d calls failed", i, t[i].failed);
        ck_assert_msg(t[i].bad == 0, "thread %d: %d results differ from eager", i, t[i].bad);
    }
    ck_assert(cap_cache_invariants(C));
    ck_assert_uint_le(cfx_stats(C).bytes_held, o.budget_bytes);
    cfx_expect_graph_accounting(C, "racing evictions");
}
END_TEST

static void *capturer_main(void *arg) {
    thr_t *t = arg;
    pthread_barrier_wait(t->go);
    cap_result_t res;
    if (req_try_on(C, t->s, &t->r, &res) != 0) t->failed++;
    else if (res.ran == CAP_RAN_CAPTURED) t->captured = true;
    for (int i = 0; i < 5; i++) {
        if (req_try_on(C, t->s, &t->r, &res) != 0) t->failed++;
        else if (res.ran == CAP_RAN_REPLAYED) t->replays++;
    }
    return NULL;
}

/* N streams capture the same key at the same moment (warmup 0, one
 * barrier): each stream gets its own entry and graph, all verify, all
 * replay bitwise; then N threads on ONE stream: exactly one capture. */
START_TEST(test_streams_capturing_the_same_key_at_once_each_get_a_verified_graph) {
    cap_options_t o = cfx_options();
    o.warmup = 0;
    C = cfx_cache_new(B, &o, WA);
    static thr_t t[NT];
    static float want[MAXN];
    pthread_barrier_t go;
    for (int round = 0; round < 2; round++) {
        bool one_stream = round == 1;
        kern_stream_t *shared = extra_stream();
        pthread_barrier_init(&go, NULL, NT);
        pthread_t th[NT];
        for (int i = 0; i < NT; i++) {
            memset(&t[i], 0, sizeof t[i]);
            t[i].s = one_stream ? shared : extra_stream();
            req_init(&t[i].r, &U, one_stream ? "adv:cap1" : "adv:capN", 8, 8);
            t[i].go = &go;
            ck_assert_int_eq(pthread_create(&th[i], NULL, capturer_main, &t[i]), 0);
        }
        for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&go);
        int captured = 0;
        for (int i = 0; i < NT; i++) {
            ck_assert_int_eq(t[i].failed, 0);
            if (t[i].captured) captured++;
            ck_assert_int_eq(t[i].replays, 5);
            eager_ref_on(S, WA, &t[i].r.key, t[i].r.x, t[i].r.ctx, NULL, 0, want);
            ck_assert_msg(same_bits(t[i].r.out, want, t[i].r.n), "round %d thread %d differs from eager", round, i);
        }
        ck_assert_int_eq(captured, one_stream ? 1 : NT);
    }
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.captures, NT + 1);
    ck_assert_uint_eq(st.declines[CAP_DECLINE_VERIFY_MISMATCH], 0);
    ck_assert(cap_cache_invariants(C));
}
END_TEST

/* ==== 10. failures midway ============================================================ */

/* A capture that fails after recording kernels, a workspace that cannot be
 * allocated (out of memory: idle entries are given back and it is tried
 * once more; any other failure: nothing evicted), a kernel fault during a
 * replay and during an eager run: each call either fails with -1 or
 * serves eager bits, nothing leaks, and the next calls are right. */
START_TEST(test_failures_midway_leave_nothing_half_made) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    size_t base = kern_bytes_in_use(B);
    static req_t r, idle;
    req_init(&idle, &U, "adv:fail-idle", 8, 8);
    warm_capture_replay(&idle);
    req_init(&r, &U, "adv:fail", 8, 8);
    for (int i = 0; i < 2; i++) call(&r);
    /* capture fails midway (kernels recorded, capture left open): eager served, retried */
    U.capture_fail_after = 1;
    EXPECT_EAGER(call(&r), CAP_DECLINE_CAPTURE_FAILED, "capture failed midway");
    expect_eager_bits(&r, "capture failed midway", 0);
    ck_assert(!kern_stream_is_capturing(S));
    EXPECT_RAN(call(&r), CAP_RAN_CAPTURED, "retried capture");
    expect_eager_bits(&r, "retried capture", 0);
    /* a kernel fault during a replay: the call fails; the graph still serves the next one */
    atomic_store(&U.replay_fail, 1);
    cap_result_t res;
    ck_assert_int_ne(req_try_on(C, S, &r, &res), 0);
    replays_give_eager_bits(&r, 2, "after a replay fault");
    /* a kernel fault in the eager warmup of a new key */
    static req_t w;
    req_init(&w, &U, "adv:fail-warm", 8, 8);
    atomic_store(&U.replay_fail, 1);
    ck_assert_int_ne(req_try_on(C, S, &w, &res), 0);
    /* faults inside verify: the replay's, then the eager run's */
    for (int f = 0; f < 2; f++) {
        static req_t v;
        req_init(&v, &U, f ? "adv:fail-verify-eager" : "adv:fail-verify-replay", 8, 8);
        for (int i = 0; i < 2; i++) call(&v);
        /* the first fail_kernel run in this call is verify's replay (a capture
         * only records), the second its eager run */
        atomic_store(&U.replay_fail, f + 1);
        int rc = req_try_on(C, S, &v, &res);
        atomic_store(&U.replay_fail, 0);
        ck_assert(rc != 0 || res.ran == CAP_RAN_EAGER);
        ck_assert(cap_cache_invariants(C));
        calls_give_eager_bits(&v, 3, "after a verify fault");
    }
    /* a workspace refused for a reason memory would not change: no idle entry evicted */
    static req_t n;
    req_init(&n, &U, "adv:fail-ws", 8, 8);
    size_t entries = cfx_stats(C).entries;
    U.ws_fail_code = REEL_E_INVALID;
    ck_assert_int_ne(req_try_on(C, S, &n, &res), 0);
    ck_assert_uint_eq(cfx_stats(C).entries, entries);
    ck_assert_uint_eq(cfx_stats(C).evictions[CAP_EVICT_LRU], 0);
    /* out of memory: the idle entries go and the allocation is tried once more */
    U.ws_fail_code = REEL_E_NOMEM;
    EXPECT_EAGER(call(&n), CAP_DECLINE_WARMING_UP, "after an out-of-memory workspace");
    expect_eager_bits(&n, "after oom", 0);
    ck_assert_uint_gt(cfx_stats(C).evictions[CAP_EVICT_LRU], 0);
    ck_assert(cap_cache_invariants(C));
    cfx_expect_graph_accounting(C, "failures");
    cap_cache_evict_all(C);
    ck_assert_uint_eq(kern_bytes_in_use(B), base);
}
END_TEST

/* ==== 11. re-entrancy from callbacks =================================================== */

static req_t *g_cb_req;
static int g_cb_calls, g_cb_rc;
static void cb_reenter(const cap_event_t *ev) {
    if (ev->kind != CAP_EV_CAPTURE || g_cb_calls > 0) return;
    g_cb_calls++;
    /* from the event of a capture: evict that very key, and dispatch another */
    g_cb_rc = cap_evict_key(C, g_victim, CAP_EVICT_EXPLICIT);
    cap_result_t res;
    if (req_try_on(C, S, g_cb_req, &res) != 0) g_cb_rc = -100;
}

/* Doc: "Callbacks run with no cache lock held" and may call back into the
 * cache. An on_event that evicts the key whose CAPTURE it is being told of,
 * and dispatches another key, deadlocks nothing and leaves a consistent
 * cache; the evicted key starts over and serves eager bits. */
START_TEST(test_an_event_callback_may_evict_and_dispatch) {
    cap_options_t o = cfx_options();
    C = cfx_cache_new(B, &o, WA);
    static req_t r, other;
    req_init(&r, &U, "adv:cb", 8, 8);
    req_init(&other, &U, "adv:cb-other", 8, 8);
    g_victim = &r.key;
    g_cb_req = &other;
    g_cb_calls = 0;
    cfx_event_hook = cb_reenter;
    calls_give_eager_bits(&r, 3, "callback");
    cfx_event_hook = NULL;
    ck_assert_int_eq(g_cb_calls, 1);
    ck_assert_int_eq(g_cb_rc, 1);
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_eq(st.graphs, 0);
    expect_eager_bits(&other, "dispatched from the callback", 0);
    ck_assert(cap_cache_invariants(C));
    warm_capture_replay(&r);
    cfx_expect_graph_accounting(C, "callbacks");
}
END_TEST

/* ==== 12. random operations: the accounting promise =================================== */

/* A seeded random mix on one thread: calls of several keys (new values,
 * contexts moving, constants changing, kernel faults), syncs under both
 * policies, evictions by key, evictions landing in verify, audits. After
 * every op: the invariants hold and captures - graph evictions is the
 * graphs held, by counters and by events (doc, "Decline reasons and
 * events"); every served call is bitwise eager. */
START_TEST(test_random_operations_keep_every_call_bitwise_and_the_graph_accounting_exact) {
    size_t ent, g;
    probe_sizes(8, 8, &ent, &g);
    cap_options_t o = cfx_options();
    o.audit_every = 3;
    o.budget_bytes = 4 * (ent + g);
    C = cfx_cache_new(B, &o, WA);
    enum { NR = 6, OPS = 1500 };
    static req_t r[NR];
    static float ctx_alt[NR][MAXN];
    uint64_t ver = 1;
    for (int i = 0; i < NR; i++) {
        char m[32];
        snprintf(m, sizeof m, "adv:rand-%d", i);
        req_init(&r[i], &U, m, i < 3 ? 8 : 4, 8);
        U.add_const = true;
        req_one_const(&r[i], "k", CAP_CONST_I64);
        r[i].n_consts = i % 2; /* every other key has the constant */
    }
    uint64_t st_rng = 0xfeedbeef5eedull;
    static float xs[MAXN], cs[MAXN];
    for (int op = 0; op < OPS; op++) {
        unsigned pick = (unsigned)(ts_splitmix64(&st_rng) % 100);
        if (pick < 85) {
            req_t *q = &r[ts_splitmix64(&st_rng) % NR];
            unsigned f = (unsigned)(ts_splitmix64(&st_rng) % 100);
            bool injected = false;
            if (f < 4) { /* the context moves (same values) */
                float *to = q->in[1].data == q->ctx ? ctx_alt[q - r] : q->ctx;
                memcpy(to, kern_tensor_ptr(&q->in[1]), (size_t)q->n * sizeof(float));
                q->in[1] = synth_host_tensor(to, q->rows, q->cols);
            } else if (f < 12) {
                fill_st(&st_rng, kern_tensor_ptr(&q->in[1]), (size_t)q->n);
            } else if (f < 15 && q->n_consts) {
                q->consts[0].v.i = (int64_t)(ts_splitmix64(&st_rng) % 3);
            } else if (f < 17) {
                atomic_store(&U.replay_fail, 1);
                injected = true;
            } else if (f < 19) {
                g_victim = &q->key;
                g_seen_capture = false;
                U.hook = hook_evict_in_verify; /* fires only if this call captures */
            }
            fill_st(&st_rng, q->x, (size_t)q->n);
            memcpy(xs, q->x, (size_t)q->n * sizeof(float));
            synth_gather(&q->in[1], cs);
            cap_result_t res;
            int rc = req_try_on(C, S, q, &res);
            U.hook = NULL;
            bool faulted = atomic_exchange(&U.replay_fail, 0) == 0 && injected;
            if (rc == 0) expect_eager_bits_of(q, xs, cs, "random op", op);
            else ck_assert_msg(faulted, "op %d: dispatch failed without a fault: %s", op, reel_err_text());
        } else if (pick < 92) {
            fill_st(&st_rng, WA, SYNTH_W);
            cap_policy_t pol = ts_splitmix64(&st_rng) % 2 ? CAP_POLICY_INPLACE : CAP_POLICY_EVICT;
            ck_assert_int_ge(cap_component_update_policy(C, "wA", WA, SYNTH_W * sizeof(float), ++ver, pol), 0);
            for (int i = 0; i < NR; i++) TS_OK(cap_key_set_version(&r[i].key, "wA", ver));
        } else {
            req_t *q = &r[ts_splitmix64(&st_rng) % NR];
            ck_assert_int_ge(cap_evict_key(C, &q->key, CAP_EVICT_EXPLICIT), 0);
        }
        ck_assert_msg(cap_cache_invariants(C), "op %d broke an invariant", op);
        char what[32];
        snprintf(what, sizeof what, "op %d", op);
        cfx_expect_graph_accounting(C, what);
    }
    cap_stats_t st = cfx_stats(C);
    ck_assert_uint_gt(st.captures, 10);
    ck_assert_uint_gt(st.replays, 100);
    ck_assert_uint_gt(st.audits, 10);
    ck_assert_uint_gt(st.evictions[CAP_EVICT_LRU], 0);
    ck_assert_uint_gt(st.declines[CAP_DECLINE_PINNED_INPUT_MOVED], 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("capture_adversarial");
    TCase *tc = tcase_create("adversarial");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_input_whose_dtype_shape_or_rank_changed_under_its_key_is_refused_never_reinterpreted);
    tcase_add_test(tc, test_copied_input_with_changing_strides_replays_its_values_not_its_layout);
    tcase_add_test(tc, test_pinned_buffer_refilled_at_the_same_address_replays_the_new_contents);
    tcase_add_test(tc, test_outputs_aliasing_inputs_equal_an_eager_loop);
    tcase_add_test(tc, test_weights_rewritten_in_place_without_a_sync_replay_as_eager_would_and_audits_pass);
    tcase_add_test(tc, test_nan_inf_signed_zero_and_subnormal_values_replay_bitwise);
    tcase_add_test(tc, test_a_changed_constant_gives_its_own_value_never_the_one_a_graph_baked);
    tcase_add_test(tc, test_keys_differing_in_one_field_never_share_an_entry_and_an_overlong_key_is_refused);
    tcase_add_test(tc, test_budget_zero_is_unlimited);
    tcase_add_test(tc, test_budget_of_exactly_one_graph_alternating_keys_stay_correct);
    tcase_add_test(tc, test_budget_below_any_workspace_runs_every_call_transient);
    tcase_add_test(tc, test_budget_that_holds_the_workspace_but_not_the_graph_captures_once_then_stays_eager);
    tcase_add_test(tc, test_thousands_of_keys_evict_in_lru_order_and_memory_stays_bounded);
    tcase_add_test(tc, test_eviction_during_verify_is_not_counted_as_the_eviction_of_a_graph);
    tcase_add_test(tc, test_evictions_racing_replays_on_other_streams_never_corrupt_a_result);
    tcase_add_test(tc, test_streams_capturing_the_same_key_at_once_each_get_a_verified_graph);
    tcase_add_test(tc, test_failures_midway_leave_nothing_half_made);
    tcase_add_test(tc, test_an_event_callback_may_evict_and_dispatch);
    tcase_add_test(tc, test_random_operations_keep_every_call_bitwise_and_the_graph_accounting_exact);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(suite()); }
