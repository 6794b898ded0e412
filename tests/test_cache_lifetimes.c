/* test_cache_lifetimes.c -- a capture-cache entry outlives its model and its
 * program table: every path that frees an entry (another model's weight
 * sync, the budget, a failed allocation, an explicit eviction, the cache's
 * destruction) frees it without reaching into either. Run under ASan
 * (make asan) these tests fail on any read of the freed model or table. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/error.h"
#include "kernels/ops.h"
#include "model/tdit_program.h"
#include "tests/support.h"

static char dir[64], w1[128], w2[128];

static void setup_dir(void) {
    strcpy(dir, "/tmp/reel-test-lt.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(w1, sizeof w1, "%s/w1.safetensors", dir);
    snprintf(w2, sizeof w2, "%s/w2.safetensors", dir);
    ts_tiny_weights(11, w1);
    ts_tiny_weights(12, w2);
}

static void teardown_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

enum { NL = 4 * 2 * 8 * 8, NC = 5 * 32 };
static const tdit_shape_t SHAPE = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
static const tdit_loop_t LOOP = { .steps = 4, .shift = 3.0, .guidance = 4.0f };

typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    cap_cache_t *c;
    float lat[NL], ctx[NC], unc[NC];
    int evicts[CAP_EVICT_COUNT];
} fx_t;

static void on_event(void *u, const cap_event_t *ev) {
    fx_t *f = u;
    if (ev->kind == CAP_EV_EVICT) f->evicts[ev->reason]++;
}

static void quiet(void *u, int level, const char *msg) { (void)u; (void)level; (void)msg; }

static fx_t *fx_open(size_t budget) {
    fx_t *f = calloc(1, sizeof *f);
    ck_assert_ptr_nonnull(f);
    f->b = kern_backend_cpu_new();
    f->s = kern_stream_new(f->b);
    cap_options_t o = cap_options_default();
    o.budget_bytes = budget;
    o.on_event = on_event;
    o.event_user = f;
    o.log = quiet;
    f->c = cap_cache_new(f->b, &o);
    ck_assert_ptr_nonnull(f->c);
    tdit_initial_latent(1, f->lat, NL);
    tdit_initial_latent(2, f->ctx, NC);
    tdit_initial_latent(3, f->unc, NC);
    return f;
}

/* Frees what is left; every byte of the backend must be back. */
static void fx_close(fx_t *f) {
    cap_cache_destroy(&f->c);
    kern_stream_destroy(&f->s);
    ck_assert_uint_eq(kern_bytes_in_use(f->b), 0);
    kern_backend_destroy(&f->b);
    free(f);
}

static tdit_model_t *load(fx_t *f, const char *path) {
    tdit_model_t *m = tdit_model_load_path(f->b, path, KERN_F32);
    TS_NEW(m);
    return m;
}

/* One request of m through the cache, in buffers of its own. */
static void run_cached(fx_t *f, tdit_model_t *m, float *out, tdit_run_stats_t *st) {
    memset(st, 0, sizeof *st);
    int rc = tdit_generate_cached(m, f->c, f->s, NULL, &SHAPE, &LOOP, f->lat, f->ctx, f->unc, out, st);
    TS_OK(rc);
}

/* The pure eager loop of m (no cache). */
static void run_eager(fx_t *f, tdit_model_t *m, float *out) {
    tdit_ws_t *ws = tdit_ws_new(m, f->s, &SHAPE);
    ck_assert_ptr_nonnull(ws);
    TS_OK(tdit_generate(m, ws, f->s, &LOOP, f->lat, f->ctx, f->unc, out, NULL));
    tdit_ws_destroy(&ws);
}

/* Model A (weights w1, version 1) runs one request: the cache holds its
 * entry and graph. Returns A; *key is the key of A's step. */
static tdit_model_t *model_a_with_an_entry(fx_t *f, cap_key_t *key) {
    tdit_model_t *a = load(f, w1);
    ck_assert_int_eq(tdit_register_weights(f->c, a, 1), 0);
    static float out[NL];
    tdit_run_stats_t st;
    run_cached(f, a, out, &st);
    ck_assert_int_eq(st.captured, 1);
    TS_OK(tdit_step_key(a, &SHAPE, false, 1, key));
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_eq(cs.entries, 1);
    ck_assert_uint_eq(cs.graphs, 1);
    return a;
}

/* ---- a second kind of program sharing the cache --------------------------- */

/* A toy step (y = x + x) whose workspace claims `claim` bytes of the
 * budget; it keeps its backend, so it frees itself without its user. */
typedef struct {
    size_t claim;
    int fail_allocs;        /* ws_new fails this many times first */
} toy_user_t;

typedef struct {
    kern_backend_t *b;
    kern_tensor_t x, y;
    size_t claim;
} toy_ws_t;

enum { TOY_ROWS = 4, TOY_COLS = 8 };

static void toy_ws_free(void *user, void *ws_) {
    (void)user;
    toy_ws_t *ws = ws_;
    if (!ws) return;
    kern_free(ws->b, ws->x.data);
    kern_free(ws->b, ws->y.data);
    free(ws);
}

static void *toy_ws_new(void *user, const cap_key_t *key, kern_stream_t *s) {
    toy_user_t *u = user;
    (void)key;
    if (u->fail_allocs > 0) {
        u->fail_allocs--;
        reel_fail(REEL_E_NOMEM, "simulated: out of device memory");
        return NULL;
    }
    toy_ws_t *ws = calloc(1, sizeof *ws);
    ck_assert_ptr_nonnull(ws);
    ws->b = kern_stream_backend(s);
    ws->claim = u->claim;
    const int64_t shape[2] = { TOY_ROWS, TOY_COLS };
    ws->x = kern_tensor_alloc(ws->b, KERN_F32, 2, shape);
    ws->y = kern_tensor_alloc(ws->b, KERN_F32, 2, shape);
    ck_assert(ws->x.data && ws->y.data);
    return ws;
}

static size_t toy_ws_size(void *user, const cap_key_t *key) {
    (void)key;
    return ((toy_user_t *)user)->claim;
}

static size_t toy_ws_bytes(void *user, const void *ws) {
    (void)user;
    return ((const toy_ws_t *)ws)->claim;
}

static kern_tensor_t *toy_input(void *user, void *ws, int i) {
    (void)user;
    (void)i;
    return &((toy_ws_t *)ws)->x;
}

static kern_tensor_t *toy_output(void *user, void *ws, int i) {
    (void)user;
    (void)i;
    return &((toy_ws_t *)ws)->y;
}

static int toy_launch(void *user, void *ws_, const cap_const_t *k, int n, kern_stream_t *s) {
    (void)user;
    (void)k;
    (void)n;
    toy_ws_t *ws = ws_;
    return kern_add(s, &ws->x, &ws->x, &ws->y);
}

static const cap_program_t TOY = {
    .name = "toy", .n_inputs = 1, .n_outputs = 1, .pinnable = { false },
    .ws_new = toy_ws_new, .ws_size = toy_ws_size, .ws_free = toy_ws_free, .ws_bytes = toy_ws_bytes,
    .input = toy_input, .output = toy_output, .launch = toy_launch,
    .n_components = 1, .components = { "toy" },
};

static cap_key_t toy_key(fx_t *f) {
    cap_key_t k;
    memset(&k, 0, sizeof k);
    snprintf(k.device, sizeof k.device, "%s", kern_backend_device_name(f->b));
    snprintf(k.arch, sizeof k.arch, "%s", kern_backend_arch(f->b));
    snprintf(k.model, sizeof k.model, "toy");
    snprintf(k.loop, sizeof k.loop, "euler");
    const int64_t shape[2] = { TOY_ROWS, TOY_COLS };
    TS_OK(cap_key_add_input(&k, "latent", KERN_F32, 2, shape));
    TS_OK(cap_key_add_component(&k, "toy", 1));
    k.graph.dtype = KERN_F32;
    snprintf(k.graph.cfg, sizeof k.graph.cfg, "cond");
    snprintf(k.graph.expert, sizeof k.graph.expert, "-");
    snprintf(k.graph.sched, sizeof k.graph.sched, "f32");
    return k;
}

static float toy_weights[1];

/* One call of program p for user u; checks y = 2x. */
static void toy_call(fx_t *f, const cap_program_t *p, toy_user_t *u, cap_result_t *res) {
    cap_key_t key = toy_key(f);
    float x[TOY_ROWS * TOY_COLS], y[TOY_ROWS * TOY_COLS];
    for (int i = 0; i < TOY_ROWS * TOY_COLS; i++) x[i] = (float)i - 3.5f;
    const int64_t shape[2] = { TOY_ROWS, TOY_COLS };
    kern_tensor_t in = kern_tensor_make(x, KERN_F32, KERN_DEVICE_HOST, 2, shape);
    kern_tensor_t out = kern_tensor_make(y, KERN_F32, KERN_DEVICE_HOST, 2, shape);
    cap_call_t call = { .key = &key, .inputs = &in, .outputs = &out };
    TS_OK(cap_dispatch(f->c, f->s, p, u, &call, res));
    for (int i = 0; i < TOY_ROWS * TOY_COLS; i++) ck_assert_float_eq(y[i], 2.f * x[i]);
}

static void register_toy(fx_t *f) {
    ck_assert_msg(cap_component_register(f->c, "toy", toy_weights, sizeof toy_weights, 1) == 0, "%s",
                  reel_err_text());
}

/* ---- the tests -------------------------------------------------------------- */

START_TEST(test_model_destroyed_before_a_weight_sync_to_another_model_leaves_the_cache_intact) {
    fx_t *f = fx_open(0);
    cap_key_t ka;
    tdit_model_t *a = model_a_with_an_entry(f, &ka);
    tdit_model_destroy(&a);
    /* Model B takes over the component: the sync evicts A's entry, whose
     * workspace must free itself without A. */
    tdit_model_t *b = load(f, w2);
    int n = cap_component_update(f->c, TDIT_COMPONENT, tdit_model_weights(b), tdit_model_bytes(b), 2);
    ck_assert_msg(n == 1, "entries affected: %d (%s)", n, reel_err_text());
    ck_assert_int_eq(f->evicts[CAP_EVICT_WEIGHT_SYNC], 1);
    ck_assert(cap_cache_invariants(f->c));
    /* B is served from the same cache, exactly as pure eager. */
    static float got[NL], want[NL];
    tdit_run_stats_t st;
    run_cached(f, b, got, &st);
    ck_assert_int_eq(st.captured, 1);
    run_eager(f, b, want);
    ck_assert_int_eq(memcmp(got, want, sizeof got), 0);
    cap_cache_destroy(&f->c);
    tdit_model_destroy(&b);
    fx_close(f);
}
END_TEST

START_TEST(test_model_destroyed_before_the_cache_frees_its_entries_at_cache_destroy) {
    fx_t *f = fx_open(0);
    cap_key_t ka;
    tdit_model_t *a = model_a_with_an_entry(f, &ka);
    tdit_model_destroy(&a);
    cap_cache_destroy(&f->c);
    ck_assert_int_eq(f->evicts[CAP_EVICT_SHUTDOWN], 1);
    fx_close(f); /* every workspace byte back */
}
END_TEST

START_TEST(test_model_destroyed_before_its_key_is_evicted_frees_its_entry) {
    fx_t *f = fx_open(0);
    cap_key_t ka;
    tdit_model_t *a = model_a_with_an_entry(f, &ka);
    tdit_model_destroy(&a);
    ck_assert_int_eq(cap_evict_key(f->c, &ka, CAP_EVICT_EXPLICIT), 1);
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_eq(cs.entries, 0);
    ck_assert_uint_eq(cs.bytes_held, 0);
    ck_assert_uint_eq(kern_bytes_in_use(f->b), 0);
    fx_close(f);
}
END_TEST

START_TEST(test_model_destroyed_before_another_programs_admission_is_evicted_for_budget) {
    enum { BUDGET = 64 << 20 };
    fx_t *f = fx_open(BUDGET);
    cap_key_t ka;
    tdit_model_t *a = model_a_with_an_entry(f, &ka);
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_gt(cs.bytes_held, 1024);
    tdit_model_destroy(&a);
    /* A program of another model claims all but 1 KiB of the budget: only
     * evicting A's idle entry makes room. */
    register_toy(f);
    toy_user_t u = { .claim = BUDGET - 1024 };
    cap_result_t res;
    toy_call(f, &TOY, &u, &res);
    ck_assert_int_eq(f->evicts[CAP_EVICT_LRU], 1);
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_eq(cs.entries, 1);
    ck_assert_uint_ge(cs.bytes_held, BUDGET - 1024); /* the toy's claim, plus its input's copy */
    ck_assert_uint_le(cs.bytes_held, BUDGET);
    ck_assert(cap_cache_invariants(f->c));
    fx_close(f);
}
END_TEST

START_TEST(test_model_destroyed_before_another_programs_failed_allocation_is_evicted_to_retry) {
    fx_t *f = fx_open(0);
    cap_key_t ka;
    tdit_model_t *a = model_a_with_an_entry(f, &ka);
    tdit_model_destroy(&a);
    /* The first workspace allocation fails: the cache gives back the idle
     * entries' memory (A's) and retries once. */
    register_toy(f);
    toy_user_t u = { .claim = 4096, .fail_allocs = 1 };
    cap_result_t res;
    toy_call(f, &TOY, &u, &res);
    ck_assert_int_eq(u.fail_allocs, 0);
    ck_assert_int_eq(f->evicts[CAP_EVICT_LRU], 1);
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_eq(cs.entries, 1);
    fx_close(f);
}
END_TEST

/* A workspace no memory could hold (one byte past all the backend's
 * memory: the host's physical memory on the CPU) fails its allocation;
 * freeing the other keys' graphs could never make room for it, so none is
 * evicted and nothing is retried. */
START_TEST(test_a_failed_allocation_no_memory_could_hold_evicts_no_other_keys_graph) {
    fx_t *f = fx_open(0);
    cap_key_t ka;
    tdit_model_t *a = model_a_with_an_entry(f, &ka);
    register_toy(f);
    const size_t total = kern_backend_mem_total(f->b);
    ck_assert_uint_gt(total, (size_t)1 << 26); /* the host's: at least 64 MiB, and known */
    toy_user_t u = { .claim = total + 1, .fail_allocs = 2 };
    cap_key_t key = toy_key(f);
    float x[TOY_ROWS * TOY_COLS] = { 0 }, y[TOY_ROWS * TOY_COLS];
    const int64_t shape[2] = { TOY_ROWS, TOY_COLS };
    kern_tensor_t in = kern_tensor_make(x, KERN_F32, KERN_DEVICE_HOST, 2, shape);
    kern_tensor_t out = kern_tensor_make(y, KERN_F32, KERN_DEVICE_HOST, 2, shape);
    cap_call_t call = { .key = &key, .inputs = &in, .outputs = &out };
    cap_result_t res;
    ck_assert_int_eq(cap_dispatch(f->c, f->s, &TOY, &u, &call, &res), -1);
    ck_assert_msg(strstr(reel_err_text(), "simulated: out of device memory"), "%s", reel_err_text());
    ck_assert_int_eq(u.fail_allocs, 1); /* tried once, not again after evicting */
    ck_assert_int_eq(f->evicts[CAP_EVICT_LRU], 0);
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_eq(cs.graphs, 1); /* A's graph kept */
    ck_assert(cap_cache_invariants(f->c));
    tdit_model_destroy(&a);
    fx_close(f);
}
END_TEST

START_TEST(test_program_table_freed_after_its_calls_leaves_entries_that_free_themselves) {
    fx_t *f = fx_open(0);
    register_toy(f);
    cap_program_t *p = malloc(sizeof *p);
    ck_assert_ptr_nonnull(p);
    memcpy(p, &TOY, sizeof *p);
    toy_user_t *u = calloc(1, sizeof *u);
    ck_assert_ptr_nonnull(u);
    u->claim = 4096;
    cap_result_t res;
    for (int i = 0; i < 3; i++) toy_call(f, p, u, &res);
    ck_assert_int_eq(res.ran, CAP_RAN_CAPTURED);
    /* The table and the user go first; the entry (workspace and graph)
     * stays until evicted, and the checks walk it meanwhile. */
    free(p);
    free(u);
    ck_assert(cap_cache_invariants(f->c));
    cap_key_t k = toy_key(f);
    ck_assert_int_eq(cap_evict_key(f->c, &k, CAP_EVICT_EXPLICIT), 1);
    ck_assert_uint_eq(kern_bytes_in_use(f->b), 0);
    fx_close(f);
}
END_TEST

/* One case per test, so CK_RUN_CASE runs one alone. */
static void add(Suite *su, const char *name, const TTest *t) {
    TCase *tc = tcase_create(name);
    tcase_add_unchecked_fixture(tc, setup_dir, teardown_dir);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t);
    suite_add_tcase(su, tc);
}

int main(void) {
    Suite *su = suite_create("cache_lifetimes");
    add(su, "sync", test_model_destroyed_before_a_weight_sync_to_another_model_leaves_the_cache_intact);
    add(su, "destroy", test_model_destroyed_before_the_cache_frees_its_entries_at_cache_destroy);
    add(su, "evict_key", test_model_destroyed_before_its_key_is_evicted_frees_its_entry);
    add(su, "budget", test_model_destroyed_before_another_programs_admission_is_evicted_for_budget);
    add(su, "alloc_retry", test_model_destroyed_before_another_programs_failed_allocation_is_evicted_to_retry);
    add(su, "alloc_hopeless", test_a_failed_allocation_no_memory_could_hold_evicts_no_other_keys_graph);
    add(su, "program", test_program_table_freed_after_its_calls_leaves_entries_that_free_themselves);
    return ts_run(su);
}
