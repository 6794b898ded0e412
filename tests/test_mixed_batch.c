/* test_mixed_batch.c -- a mixed batch (model/tinydit.h, shape.mixed): B
 * different requests in one step, each with its own latent, context and
 * uncond, σ (any point of its own schedule) and guidance, and each
 * sample's result bitwise the same request stepped alone, with CFG and
 * without, Euler and SDE (a seed per sample), eagerly and as a captured
 * graph replayed with new inputs; what it refuses. On the CPU with the
 * tiny config. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/error.h"
#include "kernels/ops.h"
#include "model/tinydit.h"
#include "tests/support.h"

static char dir[64];
static char wpath[128];

static void setup_dir(void) {
    ts_mkdtemp(dir, sizeof dir, "test-mixed");
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", dir);
    ts_tiny_weights(5, wpath);
}

static void teardown_dir(void) {
    if (ts_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
}

enum { F = 2, HH = 8, WW = 8, L = 5, C = 4, T = 32, NLAT = C * F * HH * WW, NCTX = L * T, MAXB = 5 };

/* One request's inputs for one step. */
typedef struct {
    float lat[NLAT], ctx[NCTX], unc[NCTX];
    float sig[3], guidance;
    float sde[4];
} req_t;

static void draw(req_t *r, uint64_t seed) {
    ts_fill_uniform(r->lat, NLAT, seed, -1, 1);
    ts_fill_uniform(r->ctx, NCTX, seed + 1, -1, 1);
    ts_fill_uniform(r->unc, NCTX, seed + 2, -1, 1);
    double sched[11];
    tdit_schedule(10, 1.0 + (double)(seed % 5), sched);
    int i = (int)(seed % 10);
    r->sig[0] = (float)sched[i];
    r->sig[1] = (float)sched[i + 1];
    r->sig[2] = (float)sched[1];
    r->guidance = 1.0f + (float)(seed % 7);
    kern_sde_params_pack(r->sde, 0.5f + 0.1f * (float)(seed % 3), seed * 7919, (uint32_t)i);
}

typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    tdit_model_t *m;
} fx_t;

static void fx_open(fx_t *f) {
    f->b = kern_backend_cpu_new();
    TS_NEW(f->b);
    f->s = kern_stream_new(f->b);
    TS_NEW(f->s);
    f->m = tdit_model_load_path(f->b, wpath, KERN_F32);
    TS_NEW(f->m);
}

static void fx_close(fx_t *f) {
    tdit_model_destroy(&f->m);
    kern_stream_destroy(&f->s);
    ck_assert_uint_eq(kern_bytes_in_use(f->b), 0);
    kern_backend_destroy(&f->b);
}

static tdit_shape_t shape(bool cfg, int64_t batch, bool mixed) {
    return (tdit_shape_t){ F, HH, WW, L, cfg, batch, TDIT_SOLVER_EULER, mixed, TDIT_SOLVER_EULER };
}

/* r stepped alone (B = 1): its latent after one Euler (sde: SDE) step. */
static void alone(fx_t *f, const req_t *r, bool cfg, bool sde, float *out) {
    tdit_shape_t sh = shape(cfg, 1, false);
    tdit_ws_t *ws = tdit_ws_new(f->m, f->s, &sh);
    TS_NEW(ws);
    TS_OK(tdit_ws_bind_latent(ws, f->s, r->lat, NLAT));
    TS_OK(tdit_ws_bind_context(ws, f->s, r->ctx, NCTX, false));
    if (cfg) TS_OK(tdit_ws_bind_context(ws, f->s, r->unc, NCTX, true));
    TS_OK(tdit_ws_bind_step(ws, f->s, r->sig, r->guidance));
    if (sde) {
        TS_OK(kern_copy_h2d(f->s, kern_tensor_ptr(tdit_ws_sde(ws)), r->sde, sizeof r->sde));
        TS_OK(tdit_step_sde_ws(f->m, ws, f->s));
    } else {
        TS_OK(tdit_step(f->m, ws, f->s));
    }
    TS_OK(tdit_ws_read_latent(ws, f->s, out, NLAT));
    tdit_ws_destroy(&ws);
}

static void bind_all(fx_t *f, tdit_ws_t *ws, const req_t *r, int B, bool cfg, bool sde) {
    for (int b = 0; b < B; b++) {
        TS_OK(tdit_ws_bind_sample_latent(ws, f->s, b, r[b].lat, NLAT));
        TS_OK(tdit_ws_bind_sample(ws, f->s, b, r[b].ctx, cfg ? r[b].unc : NULL, NCTX, r[b].sig, r[b].guidance));
        if (sde) {
            kern_tensor_t p = kern_tensor_row(tdit_ws_sde(ws), b);
            TS_OK(kern_copy_h2d(f->s, kern_tensor_ptr(&p), r[b].sde, sizeof r[b].sde));
        }
    }
    TS_OK(kern_stream_sync(f->s));
}

static void expect_alone(fx_t *f, tdit_ws_t *ws, const req_t *r, int B, bool cfg, bool sde, const char *what) {
    float got[NLAT], want[NLAT];
    for (int b = 0; b < B; b++) {
        TS_OK(tdit_ws_read_sample_latent(ws, f->s, b, got, NLAT));
        alone(f, &r[b], cfg, sde, want);
        ck_assert_msg(memcmp(got, want, sizeof got) == 0,
                      "%s: sample %d of %d (σ %.4f, guidance %.1f) differs from the request stepped alone "
                      "(max |diff| %g)", what, b, B, (double)r[b].sig[0], (double)r[b].guidance,
                      ts_max_abs_diff(got, want, NLAT));
    }
}

/* Random mixes: sizes 2..5, requests at different points of different
 * schedules with different guidance, CFG on and off, Euler and SDE. */
START_TEST(test_each_sample_of_a_mixed_batch_is_bitwise_the_request_alone) {
    fx_t f;
    fx_open(&f);
    static req_t r[MAXB];
    for (int trial = 0; trial < 8; trial++) {
        const int B = 2 + trial % 4;
        const bool cfg = trial % 2 == 0, sde = trial % 3 == 2;
        for (int b = 0; b < B; b++) draw(&r[b], 100u * (uint64_t)trial + 13u * (uint64_t)b + 1u);
        tdit_shape_t sh = shape(cfg, B, true);
        tdit_ws_t *ws = tdit_ws_new(f.m, f.s, &sh);
        TS_NEW(ws);
        bind_all(&f, ws, r, B, cfg, sde);
        TS_OK(sde ? tdit_step_sde_ws(f.m, ws, f.s) : tdit_step(f.m, ws, f.s));
        char what[64];
        snprintf(what, sizeof what, "trial %d (B %d, %s, %s)", trial, B, cfg ? "CFG" : "no CFG", sde ? "SDE" : "Euler");
        expect_alone(&f, ws, r, B, cfg, sde, what);
        tdit_ws_destroy(&ws);
    }
    fx_close(&f);
}
END_TEST

/* One capture of a mixed step serves any mix: replayed with other
 * requests bound (other σ, guidance, contexts), each sample is still
 * bitwise its request alone. */
START_TEST(test_a_captured_mixed_step_replays_any_mix_bitwise) {
    fx_t f;
    fx_open(&f);
    static req_t r[3];
    const int B = 3;
    for (int b = 0; b < B; b++) draw(&r[b], 500u + (uint64_t)b);
    tdit_shape_t sh = shape(true, B, true);
    tdit_ws_t *ws = tdit_ws_new(f.m, f.s, &sh);
    TS_NEW(ws);
    bind_all(&f, ws, r, B, true, false);
    TS_OK(tdit_step(f.m, ws, f.s)); /* eager first (the CPU's rope table, the warm-up) */
    bind_all(&f, ws, r, B, true, false);
    kern_graph_t *g = NULL;
    TS_OK(kern_capture_begin(f.s));
    TS_OK(tdit_step(f.m, ws, f.s));
    TS_OK(kern_capture_end(f.s, &g));
    for (int round = 0; round < 3; round++) {
        for (int b = 0; b < B; b++) draw(&r[b], 600u + 10u * (uint64_t)round + (uint64_t)b);
        bind_all(&f, ws, r, B, true, false);
        TS_OK(kern_graph_replay(g, f.s));
        TS_OK(kern_stream_sync(f.s));
        char what[48];
        snprintf(what, sizeof what, "replay %d", round);
        expect_alone(&f, ws, r, B, true, false, what);
    }
    kern_graph_destroy(&g);
    tdit_ws_destroy(&ws);
    fx_close(&f);
}
END_TEST

START_TEST(test_mixed_batches_refuse_what_they_cannot_do) {
    fx_t f;
    fx_open(&f);
    tdit_shape_t ms = shape(true, 2, true);
    ms.solver = TDIT_SOLVER_UNIPC;
    reel_err_clear();
    ck_assert_int_eq(tdit_shape_validate(&ms), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "mixed batch"));
    tdit_shape_t sh = shape(true, 2, true), grp = shape(true, 2, false);
    ck_assert(!tdit_shape_equal(&sh, &grp)); /* a mixed key is not a group's */
    tdit_ws_t *ws = tdit_ws_new(f.m, f.s, &sh), *gw = tdit_ws_new(f.m, f.s, &grp);
    TS_NEW(ws);
    TS_NEW(gw);
    static req_t r;
    draw(&r, 9);
    ck_assert_int_eq(tdit_ws_bind_step(ws, f.s, r.sig, r.guidance), -1); /* a mixed batch binds per sample */
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "tdit_ws_bind_sample"));
    ck_assert_int_eq(tdit_ws_bind_sample(gw, f.s, 0, r.ctx, r.unc, NCTX, r.sig, r.guidance), -1); /* a group shares */
    ck_assert_int_eq(tdit_ws_bind_sample(ws, f.s, 2, r.ctx, r.unc, NCTX, r.sig, r.guidance), -1); /* out of range */
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "sample 2 of a batch of 2"));
    ck_assert_int_eq(tdit_ws_bind_sample(ws, f.s, 0, r.ctx, NULL, NCTX, r.sig, r.guidance), -1); /* CFG, no uncond */
    ck_assert_int_eq(tdit_ws_bind_sample(ws, f.s, 0, r.ctx, r.unc, NCTX - 1, r.sig, r.guidance), -1); /* short */
    ck_assert_int_eq(tdit_ws_bind_sample_latent(ws, f.s, -1, r.lat, NLAT), -1);
    ck_assert_int_eq(tdit_ws_bind_sample_latent(ws, f.s, 0, r.lat, NLAT + 1), -1);
    float out[NLAT];
    ck_assert_int_eq(tdit_ws_read_sample_latent(ws, f.s, 5, out, NLAT), -1);
    tdit_ws_destroy(&ws);
    tdit_ws_destroy(&gw);
    fx_close(&f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("mixed_batch");
    TCase *tc = tcase_create("mixed_batch");
    tcase_add_unchecked_fixture(tc, setup_dir, teardown_dir);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_each_sample_of_a_mixed_batch_is_bitwise_the_request_alone);
    tcase_add_test(tc, test_a_captured_mixed_step_replays_any_mix_bitwise);
    tcase_add_test(tc, test_mixed_batches_refuse_what_they_cannot_do);
    suite_add_tcase(s, tc);
    return ts_run(s);
}
