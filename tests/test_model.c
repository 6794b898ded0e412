/* test_model.c -- the tinydit model on the CPU backend: determinism, the
 * capturable step (CPU graph replay bitwise equal to eager), weight loading
 * errors and workspace binding errors. */
#include <check.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/ops_args.h"
#include <math.h>
#include "model/loop.h"
#include "model/tinydit.h"
#include "model/tdit_program.h"
#include "tests/support.h"

static char dir[64];
static char wpath[128];

static void setup_dir(void) {
    ts_mkdtemp(dir, sizeof dir, "test-model");
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", dir);
    ts_tiny_weights(11, wpath);
}

static void teardown_dir(void) {
    if (ts_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
}

typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    tdit_model_t *m;
    tdit_ws_t *ws;
    size_t n_lat, n_ctx;
    float *lat, *ctx, *unc;
} fx_t;

static void fx_open(fx_t *f, bool cfg) {
    memset(f, 0, sizeof *f);
    f->b = kern_backend_cpu_new();
    f->s = kern_stream_new(f->b);
    f->m = tdit_model_load_path(f->b, wpath, KERN_F32);
    TS_NEW(f->m);
    tdit_shape_t sh = { 2, 8, 8, 5, cfg, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    f->ws = tdit_ws_new(f->m, f->s, &sh);
    TS_NEW(f->ws);
    f->n_lat = 4 * 2 * 8 * 8;
    f->n_ctx = 5 * 32;
    f->lat = malloc(f->n_lat * sizeof(float));
    f->ctx = malloc(f->n_ctx * sizeof(float));
    f->unc = malloc(f->n_ctx * sizeof(float));
    tdit_initial_latent(1, f->lat, f->n_lat);
    tdit_initial_latent(2, f->ctx, f->n_ctx);
    tdit_initial_latent(3, f->unc, f->n_ctx);
}

static void fx_close(fx_t *f) {
    tdit_ws_destroy(&f->ws);
    tdit_model_destroy(&f->m);
    kern_stream_destroy(&f->s);
    ck_assert_uint_eq(kern_bytes_in_use(f->b), 0);
    kern_backend_destroy(&f->b);
    free(f->lat); free(f->ctx); free(f->unc);
}

static float *run_loop(fx_t *f, const tdit_loop_t *p, const float *lat) {
    float *out = malloc(f->n_lat * sizeof(float));
    int rc = tdit_generate(f->m, f->ws, f->s, p, lat, f->ctx, tdit_ws_shape(f->ws)->cfg ? f->unc : NULL,
                           out, NULL);
    TS_OK(rc);
    return out;
}

START_TEST(test_same_cfg_loop_twice_is_bitwise_equal) {
    fx_t f;
    fx_open(&f, true);
    tdit_loop_t p = { .steps = 3, .shift = 3.0, .guidance = 4.0f };
    float *a = run_loop(&f, &p, f.lat), *b = run_loop(&f, &p, f.lat);
    ck_assert_int_eq(memcmp(a, b, f.n_lat * sizeof(float)), 0);
    /* and the loop did something: the output is not the input */
    ck_assert_int_ne(memcmp(a, f.lat, f.n_lat * sizeof(float)), 0);
    free(a); free(b);
    fx_close(&f);
}
END_TEST

START_TEST(test_sde_loop_same_seed_equal_different_seed_differs) {
    fx_t f;
    fx_open(&f, false);
    tdit_loop_t p = { .steps = 3, .shift = 3.0, .sde = true, .eta = 0.7f, .seed = 5 };
    float *a = run_loop(&f, &p, f.lat), *b = run_loop(&f, &p, f.lat);
    p.seed = 6;
    float *c = run_loop(&f, &p, f.lat);
    ck_assert_int_eq(memcmp(a, b, f.n_lat * sizeof(float)), 0);
    ck_assert_int_ne(memcmp(a, c, f.n_lat * sizeof(float)), 0);
    free(a); free(b); free(c);
    fx_close(&f);
}
END_TEST

START_TEST(test_initial_latent_from_seed_is_deterministic_and_seed_dependent) {
    fx_t f;
    fx_open(&f, false);
    tdit_loop_t p = { .steps = 2, .shift = 2.0, .seed = 42 };
    float *a = run_loop(&f, &p, NULL), *b = run_loop(&f, &p, NULL);
    p.seed = 43;
    float *c = run_loop(&f, &p, NULL);
    ck_assert_int_eq(memcmp(a, b, f.n_lat * sizeof(float)), 0);
    ck_assert_int_ne(memcmp(a, c, f.n_lat * sizeof(float)), 0);
    free(a); free(b); free(c);
    fx_close(&f);
}
END_TEST

/* Binds step i of an N-step schedule into the workspace. */
static void bind_step(fx_t *f, const double *sig, int i, float g) {
    const float sv[3] = { (float)sig[i], (float)sig[i + 1], (float)sig[1] };
    ck_assert_int_eq(tdit_ws_bind_step(f->ws, f->s, sv, g), 0);
}

START_TEST(test_captured_cpu_step_replays_bitwise_equal_to_eager_over_a_cfg_loop) {
    enum { STEPS = 4 };
    fx_t f;
    fx_open(&f, true);
    double sig[STEPS + 1];
    tdit_schedule(STEPS, 3.0, sig);
    float *eager = malloc(f.n_lat * sizeof(float)), *replay = malloc(f.n_lat * sizeof(float));

    /* eager reference */
    ck_assert_int_eq(tdit_ws_bind_latent(f.ws, f.s, f.lat, f.n_lat), 0);
    ck_assert_int_eq(tdit_ws_bind_context(f.ws, f.s, f.ctx, f.n_ctx, false), 0);
    ck_assert_int_eq(tdit_ws_bind_context(f.ws, f.s, f.unc, f.n_ctx, true), 0);
    for (int i = 0; i < STEPS; i++) {
        bind_step(&f, sig, i, 4.0f);
        TS_OK(tdit_step(f.m, f.ws, f.s));
    }
    ck_assert_int_eq(tdit_ws_read_latent(f.ws, f.s, eager, f.n_lat), 0);

    /* capture one whole step (nothing runs while capturing), then replay it
     * for every step: the graph reads σ and g from the workspace. */
    ck_assert_int_eq(tdit_ws_bind_latent(f.ws, f.s, f.lat, f.n_lat), 0);
    kern_graph_t *g = NULL;
    ck_assert_int_eq(kern_capture_begin(f.s), 0);
    TS_OK(tdit_step(f.m, f.ws, f.s));
    ck_assert_int_eq(kern_capture_end(f.s, &g), 0);
    ck_assert_ptr_nonnull(g);
    float *after_capture = malloc(f.n_lat * sizeof(float));
    ck_assert_int_eq(tdit_ws_read_latent(f.ws, f.s, after_capture, f.n_lat), 0);
    ck_assert_msg(memcmp(after_capture, f.lat, f.n_lat * sizeof(float)) == 0,
                  "capture must record, not run");
    for (int i = 0; i < STEPS; i++) {
        bind_step(&f, sig, i, 4.0f);
        TS_OK(kern_graph_replay(g, f.s));
    }
    ck_assert_int_eq(tdit_ws_read_latent(f.ws, f.s, replay, f.n_lat), 0);
    ck_assert_uint_eq(kern_graph_replays(g), STEPS);
    /* tiny: the conditional pass, the unconditional one from its first
     * cross-attention's keys (step.c, pass_t), cfg, euler: 101 nodes */
    size_t nodes = kern_graph_nodes(g);
    printf("cpu graph: %zu nodes, %zu bytes, replayed %zu times\n", nodes, kern_graph_bytes(g),
           kern_graph_replays(g));
    ck_assert_uint_gt(nodes, 90);
    ck_assert_int_eq(memcmp(eager, replay, f.n_lat * sizeof(float)), 0);
    kern_graph_destroy(&g);
    free(eager); free(replay); free(after_capture);
    fx_close(&f);
}
END_TEST

/* A CFG step's unconditional pass starts from what the conditional pass
 * computed before the context mattered (step.c, pass_t). Its velocity
 * must be the very bits of two whole forward passes combined: for one
 * request, a group of two and a mixed batch of two (each its own context,
 * σ and guidance), Euler and UniPC (whose time embedding reads the
 * solver's timestep). Each step runs twice in a row: the second starts
 * from the first's leftovers in the workspace. */
static void check_cfg_velocity(fx_t *f, int64_t batch, bool mixed, tdit_solver_t solver) {
    tdit_shape_t sh = { 2, 8, 8, 5, true, batch, solver, mixed, TDIT_SOLVER_EULER };
    tdit_ws_t *ws = tdit_ws_new(f->m, f->s, &sh);
    TS_NEW(ws);
    const size_t nv = (size_t)batch * f->n_lat, nc = (size_t)(mixed ? batch : 1) * f->n_ctx;
    float *lat = malloc(nv * sizeof(float)), *ctx = malloc(nc * sizeof(float)), *unc = malloc(nc * sizeof(float));
    tdit_initial_latent(7, lat, nv);
    tdit_initial_latent(8, ctx, nc);
    tdit_initial_latent(9, unc, nc);
    for (int64_t b = 0; b < batch; b++) {
        const float sig[3] = { 0.9f - 0.1f * (float)b, 0.7f - 0.1f * (float)b, 0.9f };
        if (mixed) TS_OK(tdit_ws_bind_sample(ws, f->s, b, ctx + b * f->n_ctx, unc + b * f->n_ctx, f->n_ctx, sig,
                                             4.0f + (float)b));
        else if (b == 0) TS_OK(tdit_ws_bind_step(ws, f->s, sig, 4.0f));
    }
    if (!mixed) {
        TS_OK(tdit_ws_bind_context(ws, f->s, ctx, f->n_ctx, false));
        TS_OK(tdit_ws_bind_context(ws, f->s, unc, f->n_ctx, true));
    }
    if (tdit_solver_multistep(solver)) {
        float coef[KERN_MS_COEFS] = { 0 };
        coef[KERN_MS_T] = 812.0f;
        TS_OK(tdit_ws_bind_solver(ws, f->s, coef));
        TS_OK(tdit_ws_clear_history(ws, f->s));
    }
    const size_t bytes = nv * sizeof(float);
    float *step_v = malloc(bytes);
    for (int rep = 0; rep < 2; rep++) {
        TS_OK(tdit_ws_bind_latent(ws, f->s, lat, nv));
        TS_OK(tdit_solver_multistep(solver) ? tdit_step_multistep(f->m, ws, f->s) : tdit_step(f->m, ws, f->s));
        TS_OK(kern_stream_sync(f->s));
        memcpy(step_v, kern_tensor_ptr(tdit_ws_velocity(ws)), bytes);
        /* the reference: two whole passes on the same inputs, combined */
        TS_OK(tdit_ws_bind_latent(ws, f->s, lat, nv));
        kern_tensor_t *vt = tdit_ws_velocity(ws);
        void *bc = kern_alloc(f->b, bytes), *bu = kern_alloc(f->b, bytes), *bv = kern_alloc(f->b, bytes);
        ck_assert(bc && bu && bv);
        kern_tensor_t vc = kern_tensor_make(bc, KERN_F32, vt->device, vt->ndim, vt->shape);
        kern_tensor_t vu = kern_tensor_make(bu, KERN_F32, vt->device, vt->ndim, vt->shape);
        kern_tensor_t v = kern_tensor_make(bv, KERN_F32, vt->device, vt->ndim, vt->shape);
        TS_OK(tdit_forward(f->m, ws, f->s, tdit_ws_context(ws), &vc));
        TS_OK(tdit_forward(f->m, ws, f->s, tdit_ws_uncond(ws), &vu));
        TS_OK(mixed ? kern_cfg_combine_rows(f->s, &vc, &vu, tdit_ws_guidance(ws), &v)
                    : kern_cfg_combine(f->s, &vc, &vu, tdit_ws_guidance(ws), &v));
        TS_OK(kern_stream_sync(f->s));
        ck_assert_msg(memcmp(step_v, bv, bytes) == 0, "CFG velocity (batch %lld%s, %s, rep %d) differs from two "
                      "whole passes", (long long)batch, mixed ? " mixed" : "", tdit_solver_name(solver), rep);
        /* and the passes differ, so sharing could not hide behind equal contexts */
        ck_assert_int_ne(memcmp(bc, bu, bytes), 0);
        kern_free(f->b, bc); kern_free(f->b, bu); kern_free(f->b, bv);
    }
    free(step_v); free(lat); free(ctx); free(unc);
    tdit_ws_destroy(&ws);
}

START_TEST(test_cfg_step_velocity_is_bitwise_two_whole_passes) {
    fx_t f;
    fx_open(&f, true);
    check_cfg_velocity(&f, 1, false, TDIT_SOLVER_EULER);
    check_cfg_velocity(&f, 2, false, TDIT_SOLVER_EULER);
    check_cfg_velocity(&f, 2, true, TDIT_SOLVER_EULER);
    check_cfg_velocity(&f, 1, false, TDIT_SOLVER_UNIPC);
    fx_close(&f);
}
END_TEST

START_TEST(test_sde_step_refuses_capture_and_leaves_stream_usable) {
    fx_t f;
    fx_open(&f, false);
    ck_assert_int_eq(kern_capture_begin(f.s), 0);
    ck_assert_int_eq(tdit_step_sde(f.m, f.ws, f.s, 0.7f, 1, 0), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "not capturable"));
    kern_graph_t *g = NULL;
    ck_assert_int_eq(kern_capture_end(f.s, &g), 0);
    kern_graph_destroy(&g);
    tdit_loop_t p = { .steps = 1, .shift = 1.0, .sde = true, .eta = 0.5f, .seed = 1 };
    free(run_loop(&f, &p, f.lat));
    fx_close(&f);
}
END_TEST

START_TEST(test_bind_with_wrong_size_fails_clearly) {
    fx_t f;
    fx_open(&f, false);
    ck_assert_int_eq(tdit_ws_bind_latent(f.ws, f.s, f.lat, f.n_lat - 1), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "latent"));
    ck_assert_int_eq(tdit_ws_bind_context(f.ws, f.s, f.unc, f.n_ctx, true), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "uncond"));
    fx_close(&f);
}
END_TEST

static void rewrite_weights_as(const char *out, const char *victim, int ndim, const int64_t *shape, float poison) {
    ts_weights_rewrite(wpath, out, victim, ndim, shape, poison);
}

static void rewrite_weights(const char *out, const char *victim, int ndim, const int64_t *shape) {
    rewrite_weights_as(out, victim, ndim, shape, 0);
}

START_TEST(test_model_load_names_tensor_with_wrong_shape) {
    char p[160];
    snprintf(p, sizeof p, "%s/bad.safetensors", dir);
    rewrite_weights(p, "blocks.1.ffn.0.bias", 1, (const int64_t[]){ 7 });
    kern_backend_t *b = kern_backend_cpu_new();
    tdit_model_t *m = tdit_model_load_path(b, p, KERN_F32);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(reel_err_text(), "blocks.1.ffn.0.bias") != NULL, "message: %s", reel_err_text());
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    kern_backend_destroy(&b);
}
END_TEST

START_TEST(test_model_load_names_missing_tensor) {
    char p[160];
    snprintf(p, sizeof p, "%s/missing.safetensors", dir);
    rewrite_weights(p, "head.head.weight", 0, NULL);
    kern_backend_t *b = kern_backend_cpu_new();
    tdit_model_t *m = tdit_model_load_path(b, p, KERN_F32);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(reel_err_text(), "head.head.weight") != NULL, "message: %s", reel_err_text());
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    kern_backend_destroy(&b);
}
END_TEST

/* The weights' one allocation is what tdit_model_weights shows (the
 * capture cache registers it; a sync compares it): each tensor sits in a
 * 256-byte slot, and the rest of its slot is zeroed, not left as the
 * allocator had it. glibc fills what it hands out with a byte of the
 * test's choosing (M_PERTURB; the arena kept off mmap, which it does not
 * fill): two loads under different fills, and a reload, hold the same
 * bytes, and the last slot's tail is zero. The slots' tails were left as
 * they were: a first load with an adapter differed from a reload of it in
 * 38 padding floats once test_lora ran without fork. */
START_TEST(test_a_loaded_models_weights_hold_no_byte_the_allocator_left) {
    kern_backend_t *b = kern_backend_cpu_new();
    st_file_t *f = st_open(wpath);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(f);
    /* (ASan's allocator takes neither: there the loads are compared all
     * the same, and the plain build's run is the one with the fills) */
    const bool fills = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_PERTURB, 0x54) == 1;
    if (!fills) fprintf(stderr, "test_model: this allocator takes no M_PERTURB: loads compared without fills\n");
    unsigned char *first = NULL;
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        if (fills) mallopt(M_PERTURB, k ? 0x32 : 0x54); /* allocations filled with 0xab, then 0xcd */
        tdit_model_t *m = tdit_model_load(b, f, KERN_F32);
        ck_assert_ptr_nonnull(m);
        const unsigned char *w = tdit_model_weights(m);
        if (k == 0) {
            n = tdit_model_bytes(m);
            ck_assert_ptr_nonnull(first = malloc(n));
            memcpy(first, w, n);
        } else {
            ck_assert_uint_eq(tdit_model_bytes(m), n);
            ck_assert_msg(!memcmp(first, w, n), "two loads differ in their weights' bytes");
        }
        ck_assert_int_eq(tdit_model_reload(m, f), 0);
        ck_assert_msg(!memcmp(first, w, n), "a reload changed the weights' bytes");
        /* tiny's last tensor does not fill its slot, which ends the allocation */
        ck_assert_msg(w[n - 1] == 0 && w[n - 4] == 0, "the last slot's tail holds %02x", w[n - 1]);
        tdit_model_destroy(&m);
    }
    if (fills) {
        mallopt(M_PERTURB, 0);
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    }
    free(first);
    st_close(&f);
    kern_backend_destroy(&b);
}
END_TEST

START_TEST(test_config_from_metadata_matches_builtin_and_rejects_bad_sizes) {
    st_file_t *f = st_open(wpath);
    tdit_config_t a, b;
    ck_assert_int_eq(tdit_config_from_meta(f, &a), 0);
    ck_assert_int_eq(tdit_config_builtin("tiny", &b), 0);
    ck_assert_int_eq(memcmp(&a.dim, &b.dim, 7 * sizeof(int64_t)), 0);
    st_close(&f);
    ck_assert_int_eq(tdit_config_builtin("huge", &a), -1);
    b.heads = 5;
    ck_assert_int_eq(tdit_config_validate(&b), -1);
    ck_assert_int_eq(tdit_config_builtin("small", &a), 0);
    ck_assert_int_eq(tdit_config_params(&a) > 20000000, 1);
    /* a built-in's name on another model's widths is refused, naming both
     * (helper-75: a 64-wide file named wan2.1-14b registered as it); fewer
     * layers (a truncated variant) and an unknown name (a custom config)
     * are a file's own */
    static const struct { const char *name, *layers, *dim; bool ok; } cases[] = {
        { "wan2.1-14b", "2", "64", false }, { "tiny", "1", "64", true }, { "my-model", "2", "64", true },
        { "tiny", "2", "128", false },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[300];
        snprintf(path, sizeof path, "%s.meta%zu.safetensors", wpath, i);
        st_writer_t *w = st_writer_new();
        ck_assert_ptr_nonnull(w);
        const char *kv[][2] = { { "config", cases[i].name }, { "dim", cases[i].dim }, { "heads", "4" },
                                { "layers", cases[i].layers }, { "ffn_dim", "128" }, { "in_channels", "4" },
                                { "text_dim", "32" }, { "freq_dim", "256" } };
        for (size_t k = 0; k < 8; k++) ck_assert_int_eq(st_writer_meta(w, kv[k][0], kv[k][1]), 0);
        float one = 1;
        ck_assert_int_eq(st_writer_add_f32(w, "x", 1, (int64_t[]){ 1 }, &one), 0);
        ck_assert_int_eq(st_writer_save(w, path), 0);
        st_writer_destroy(&w);
        f = st_open(path);
        ck_assert_ptr_nonnull(f);
        int rc = tdit_config_from_meta(f, &a);
        ck_assert_msg(cases[i].ok ? rc == 0 : rc == -1 && strstr(reel_err_text(), "are another model's"), "%s: %s",
                      cases[i].name, reel_err_text());
        if (rc == 0) ck_assert_str_eq(a.name, cases[i].name);
        st_close(&f);
        unlink(path);
    }
}
END_TEST

/* A config's name is the model's name on the wire (READY, GEN): every
 * name the protocol admits (1..55 of [A-Za-z0-9_.:+-]) is kept whole; a
 * longer one, or one with other characters, is refused, never cut. */
START_TEST(test_config_names_are_model_names_kept_whole_or_refused) {
    const char *sizes = "\"dim\":64,\"heads\":2,\"layers\":1,\"ffn_dim\":128,\"in_channels\":4,"
                        "\"text_dim\":32,\"freq_dim\":32";
    char name[80], json[400];
    tdit_config_t c;
    for (int n = 1; n <= 56; n++) {
        memset(name, 'a', (size_t)n);
        name[n] = '\0';
        snprintf(json, sizeof json, "{\"name\":\"%s\",%s}", name, sizes);
        int rc = tdit_config_from_json(json, strlen(json), "test", &c);
        if (n <= 55) {
            ck_assert_msg(rc == 0, "%d bytes: %s", n, reel_err_text());
            ck_assert_str_eq(c.name, name);
        } else {
            ck_assert_int_eq(rc, -1);
            ck_assert_ptr_nonnull(strstr(reel_err_text(), "longer than 55"));
        }
    }
    const char *bad[] = { "", "a b", "x=y", "caf\u00e9" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(json, sizeof json, "{\"name\":\"%s\",%s}", bad[i], sizes);
        ck_assert_msg(tdit_config_from_json(json, strlen(json), "test", &c) == -1, "'%s' accepted", bad[i]);
    }
    snprintf(json, sizeof json, "{\"name\":7,%s}", sizes);
    ck_assert_int_eq(tdit_config_from_json(json, strlen(json), "test", &c), -1);
    snprintf(json, sizeof json, "{%s}", sizes); /* no name: "custom" */
    ck_assert_int_eq(tdit_config_from_json(json, strlen(json), "test", &c), 0);
    ck_assert_str_eq(c.name, "custom");
}
END_TEST

START_TEST(test_workspace_rejects_odd_latent_height) {
    kern_backend_t *b = kern_backend_cpu_new();
    kern_stream_t *s = kern_stream_new(b);
    tdit_model_t *m = tdit_model_load_path(b, wpath, KERN_F32);
    tdit_shape_t sh = { 1, 7, 8, 4, false, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    ck_assert_ptr_null(tdit_ws_new(m, s, &sh));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "even"));
    tdit_model_destroy(&m);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
}
END_TEST

START_TEST(test_schedule_endpoints_and_shift) {
    double s[5];
    tdit_schedule(4, 3.0, s);
    ck_assert_double_eq(s[0], 1.0);
    ck_assert_double_eq(s[4], 0.0);
    ck_assert_double_eq_tol(s[2], 0.75, 1e-15); /* 3·0.5/(1+2·0.5) */
}
END_TEST


/* The schedules Wan's schedulers set up (values from numpy's linspace and
 * the shift formula, as fm_solvers*.py compute them, for N = 4, shift 5):
 * UniPC starts at float32(0.999) shifted, DPM++ at 1; both end at 0 and
 * hand the transformer σ·1000 truncated. Euler is tdit_schedule. */
START_TEST(test_solver_schedules_are_wans) {
    double sg[5], ts[4], ref[5];
    tdit_solver_schedule(TDIT_SOLVER_UNIPC, 4, 5.0, sg, ts);
    const double us[4] = { 0.9997998476028442, 0.9372654557228088, 0.8330553770065308, 0.6246873736381531 };
    const double ut[4] = { 999, 937, 833, 624 };
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(sg[i] == us[i], "unipc sigma %d: %.17g", i, sg[i]);
        ck_assert_msg(ts[i] == ut[i], "unipc t %d: %.17g", i, ts[i]);
    }
    ck_assert_double_eq(sg[4], 0.0);
    tdit_solver_schedule(TDIT_SOLVER_DPMPP, 4, 5.0, sg, ts);
    const double ds[4] = { 1.0, 0.9375, 0.8333333134651184, 0.625 };
    const double dt[4] = { 1000, 937, 833, 625 };
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(sg[i] == ds[i], "dpm++ sigma %d: %.17g", i, sg[i]);
        ck_assert_msg(ts[i] == dt[i], "dpm++ t %d: %.17g", i, ts[i]);
    }
    ck_assert_double_eq(sg[4], 0.0);
    tdit_solver_schedule(TDIT_SOLVER_EULER, 4, 5.0, sg, ts);
    tdit_schedule(4, 5.0, ref);
    for (int i = 0; i <= 4; i++) ck_assert_double_eq(sg[i], ref[i]);
    for (int i = 0; i < 4; i++) ck_assert_double_eq(ts[i], 1000.0 * ref[i]);
    tdit_solver_t so;
    ck_assert_int_eq(tdit_solver_parse("dpm++", &so), 0);
    ck_assert_int_eq(so, TDIT_SOLVER_DPMPP);
    ck_assert_int_ne(tdit_solver_parse("ddim", &so), 0);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "unipc"));
}
END_TEST

/* A velocity field whose data prediction is exact (v = (x − d)/σ: every
 * x0 prediction is the data point d) is solved exactly by both solvers at
 * every step count and shift: the last step lands on d, as the exponential
 * integrators' formulas promise (and the first DPM++ step from σ = 1 is
 * x = σ_1·x + (1 − σ_1)·d). Runs the fused kernel itself, coefficients
 * from tdit_solver_coefs. */
START_TEST(test_multistep_solvers_are_exact_when_the_data_prediction_is) {
    kern_backend_t *b = kern_backend_cpu_new();
    kern_stream_t *s = kern_stream_new(b);
    enum { N = 257 };
    kern_tensor_t x = kern_tensor_alloc(b, KERN_F32, 1, (const int64_t[]){ N }),
                  v = kern_tensor_alloc(b, KERN_F32, 1, (const int64_t[]){ N }),
                  h = kern_tensor_alloc(b, KERN_F32, 2, (const int64_t[]){ 3, N }),
                  c = kern_tensor_alloc(b, KERN_F32, 1, (const int64_t[]){ 16 });
    float *xp = kern_tensor_ptr(&x), *vp = kern_tensor_ptr(&v), *hp = kern_tensor_ptr(&h), *cp = kern_tensor_ptr(&c);
    static float d[N];
    tdit_initial_latent(5, d, N);
    const int steps[] = { 1, 2, 3, 6, 11 };
    const double shifts[] = { 1.0, 3.0, 5.0 };
    for (int so = 0; so < 2; so++)
        for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++)
            for (size_t q = 0; q < sizeof shifts / sizeof shifts[0]; q++) {
                tdit_solver_t sv = so ? TDIT_SOLVER_DPMPP : TDIT_SOLVER_UNIPC;
                int n = steps[k];
                double sg[12], ts[11];
                tdit_solver_schedule(sv, n, shifts[q], sg, ts);
                tdit_initial_latent(9, xp, N); /* the noise */
                memset(hp, 0, 3 * N * sizeof *hp);
                for (int i = 0; i < n; i++) {
                    for (int j = 0; j < N; j++) vp[j] = (float)(((double)xp[j] - d[j]) / sg[i]);
                    tdit_solver_coefs(sv, n, sg, ts, i, cp);
                    ck_assert_int_eq(kern_multistep_update(s, &x, &v, &h, &c), 0);
                    if (sv == TDIT_SOLVER_DPMPP && i == 0 && n > 1) {
                        ck_assert_float_eq(cp[KERN_MS_DXC], (float)sg[1]);
                        ck_assert_float_eq_tol(cp[KERN_MS_DM], (float)(1.0 - sg[1]), 1e-7);
                    }
                }
                ck_assert_float_eq(cp[KERN_MS_DXC], 0.0f); /* the last step returns the data prediction */
                ck_assert_float_eq(cp[KERN_MS_DM], 1.0f);
                double err = 0;
                for (int j = 0; j < N; j++) err = fmax(err, fabs((double)xp[j] - d[j]));
                ck_assert_msg(err < 1e-5, "%s steps %d shift %g: max error %g", tdit_solver_name(sv), n, shifts[q], err);
            }
    kern_free(b, x.data);
    kern_free(b, v.data);
    kern_free(b, h.data);
    kern_free(b, c.data);
    kern_stream_destroy(&s);
    kern_backend_destroy(&b);
}
END_TEST


/* A NaN or an infinity in a weight is refused at load, naming the tensor;
 * a reload (a sync) of such a file leaves the resident weights as they
 * were: the check runs before any is copied. */
START_TEST(test_weights_with_nan_or_inf_are_refused_at_load_and_reload) {
    char p[160], q[160];
    snprintf(p, sizeof p, "%s/nan.safetensors", dir);
    snprintf(q, sizeof q, "%s/inf.safetensors", dir);
    rewrite_weights_as(p, "blocks.1.ffn.0.weight", -1, NULL, NAN);
    rewrite_weights_as(q, "blocks.0.modulation", -1, NULL, -INFINITY);
    kern_backend_t *b = kern_backend_cpu_new();
    ck_assert_ptr_null(tdit_model_load_path(b, p, KERN_F32));
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_msg(strstr(reel_err_text(), "blocks.1.ffn.0.weight holds a NaN"), "message: %s", reel_err_text());
    ck_assert_ptr_null(tdit_model_load_path(b, q, KERN_F32));
    ck_assert_msg(strstr(reel_err_text(), "blocks.0.modulation holds a NaN or an infinity"), "message: %s",
                  reel_err_text());
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    tdit_model_t *m = tdit_model_load_path(b, wpath, KERN_F32);
    TS_NEW(m);
    size_t nb = tdit_model_bytes(m);
    void *before = malloc(nb);
    memcpy(before, tdit_model_weights(m), nb);
    st_file_t *f = st_open(p);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(tdit_model_reload(m, f), -1);
    ck_assert_msg(strstr(reel_err_text(), "blocks.1.ffn.0.weight holds a NaN") &&
                      !strstr(reel_err_text(), "mixed"),
                  "message: %s", reel_err_text());
    ck_assert_int_eq(memcmp(before, tdit_model_weights(m), nb), 0);
    st_close(&f);
    free(before);
    tdit_model_destroy(&m);
    kern_backend_destroy(&b);
}
END_TEST

/* A loop whose values overflow (an SDE eta of 1e10) ends in an error,
 * never a result: eagerly and through the capture cache. */
START_TEST(test_overflowing_loop_is_an_error_not_a_result) {
    fx_t f;
    fx_open(&f, false);
    tdit_loop_t p = { .steps = 4, .shift = 3.0, .guidance = 1.0f, .sde = true, .eta = 1e10, .seed = 5 };
    float *out = malloc(f.n_lat * sizeof *out);
    ck_assert_int_eq(tdit_generate(f.m, f.ws, f.s, &p, f.lat, f.ctx, NULL, out, NULL), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_msg(strstr(reel_err_text(), "NaN or infinite values after 4 steps"), "message: %s", reel_err_text());
    cap_cache_t *c = cap_cache_new(f.b, NULL);
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(tdit_register_weights(c, f.m, 1), 0);
    tdit_shape_t sh = *tdit_ws_shape(f.ws);
    ck_assert_int_eq(tdit_generate_cached(f.m, c, f.s, NULL, &sh, &p, f.lat, f.ctx, NULL, out, NULL), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
    ck_assert_msg(strstr(reel_err_text(), "NaN or infinite values"), "message: %s", reel_err_text());
    p.eta = 0.7; /* the same loop at a usual eta: a result */
    ck_assert_int_eq(tdit_generate_cached(f.m, c, f.s, NULL, &sh, &p, f.lat, f.ctx, NULL, out, NULL), 0);
    ck_assert(kern_all_finite(out, f.n_lat, KERN_F32));
    cap_cache_destroy(&c);
    free(out);
    fx_close(&f);
}
END_TEST

/* Shifts far below 1 keep Euler's schedule finite (numpy's form divided
 * by 0 at σ = 1 once S − 1 rounded to −1); every shift from 2^-10 up is
 * numpy's form bit for bit. A multistep solver whose float32 sigmas
 * collapse (equal, or 0 or 1 where they must not be) is refused by
 * tdit_loop_validate, naming the sigma; usual shifts pass. */
START_TEST(test_extreme_shifts_give_finite_schedules_or_a_clear_refusal) {
    const double tiny[] = { 1e-30, 1e-300, 4.9e-324, 1e-12 };
    double sg[9], ts[8];
    for (size_t k = 0; k < sizeof tiny / sizeof tiny[0]; k++) {
        tdit_solver_schedule(TDIT_SOLVER_EULER, 8, tiny[k], sg, ts);
        ck_assert_double_eq(sg[0], 1.0);
        ck_assert_double_eq(sg[8], 0.0);
        for (int i = 0; i < 8; i++) {
            ck_assert_msg(isfinite(sg[i]) && isfinite(ts[i]) && sg[i + 1] <= sg[i], "shift %g sigma %d: %g",
                          tiny[k], i, sg[i]);
        }
        tdit_loop_t p = { .steps = 8, .shift = tiny[k], .guidance = 1.0f };
        ck_assert_int_eq(tdit_loop_validate(&p), 0);
    }
    const double usual[] = { 0x1p-10, 0.5, 1.0, 3.0, 5.0, 17.0 };
    for (size_t k = 0; k < sizeof usual / sizeof usual[0]; k++)
        for (int i = 0; i <= 16; i++) {
            double u = 1.0 - i / 16.0, S = usual[k];
            ck_assert(tdit_shift_sigma(S, u) == S * u / (1.0 + (S - 1.0) * u));
        }
    const tdit_solver_t ms[2] = { TDIT_SOLVER_UNIPC, TDIT_SOLVER_DPMPP };
    for (int k = 0; k < 2; k++) {
        tdit_loop_t p = { .steps = 4, .shift = 1e30, .guidance = 1.0f, .solver = ms[k] };
        ck_assert_int_eq(tdit_loop_validate(&p), -1);
        ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
        ck_assert_msg(strstr(reel_err_text(), "collapses the") && strstr(reel_err_text(), "sigma "), "message: %s",
                      reel_err_text());
        p.shift = 1e-50;
        ck_assert_int_eq(tdit_loop_validate(&p), -1);
        for (double s = 0.25; s <= 20; s *= 2) {
            p.shift = s;
            p.steps = 50;
            ck_assert_msg(tdit_loop_validate(&p) == 0, "%s shift %g: %s", tdit_solver_name(ms[k]), s,
                          reel_err_text());
        }
    }
}
END_TEST


int main(void) {
    Suite *su = suite_create("model");
    TCase *tc = tcase_create("tinydit");
    tcase_add_unchecked_fixture(tc, setup_dir, teardown_dir);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_same_cfg_loop_twice_is_bitwise_equal);
    tcase_add_test(tc, test_a_loaded_models_weights_hold_no_byte_the_allocator_left);
    tcase_add_test(tc, test_config_names_are_model_names_kept_whole_or_refused);
    tcase_add_test(tc, test_sde_loop_same_seed_equal_different_seed_differs);
    tcase_add_test(tc, test_initial_latent_from_seed_is_deterministic_and_seed_dependent);
    tcase_add_test(tc, test_captured_cpu_step_replays_bitwise_equal_to_eager_over_a_cfg_loop);
    tcase_add_test(tc, test_cfg_step_velocity_is_bitwise_two_whole_passes);
    tcase_add_test(tc, test_sde_step_refuses_capture_and_leaves_stream_usable);
    tcase_add_test(tc, test_bind_with_wrong_size_fails_clearly);
    tcase_add_test(tc, test_model_load_names_tensor_with_wrong_shape);
    tcase_add_test(tc, test_model_load_names_missing_tensor);
    tcase_add_test(tc, test_config_from_metadata_matches_builtin_and_rejects_bad_sizes);
    tcase_add_test(tc, test_workspace_rejects_odd_latent_height);
    tcase_add_test(tc, test_schedule_endpoints_and_shift);
    tcase_add_test(tc, test_solver_schedules_are_wans);
    tcase_add_test(tc, test_multistep_solvers_are_exact_when_the_data_prediction_is);
    tcase_add_test(tc, test_weights_with_nan_or_inf_are_refused_at_load_and_reload);
    tcase_add_test(tc, test_overflowing_loop_is_an_error_not_a_result);
    tcase_add_test(tc, test_extreme_shifts_give_finite_schedules_or_a_clear_refusal);
    suite_add_tcase(su, tc);
    return ts_run(su);
}
