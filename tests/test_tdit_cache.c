/* test_tdit_cache.c -- the tinydit denoising loop through capture_cache on
 * the CPU backend: capture once, replay the rest, bitwise equal to pure
 * eager; SDE steps captured and replayed for every seed; weight syncs under
 * both policies. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/error.h"
#include "model/tdit_program.h"
#include "tests/support.h"

static char dir[64], w1[128], w2[128];

static void setup_dir(void) {
    ts_mkdtemp(dir, sizeof dir, "test-tc");
    snprintf(w1, sizeof w1, "%s/w1.safetensors", dir);
    snprintf(w2, sizeof w2, "%s/w2.safetensors", dir);
    ts_tiny_weights(11, w1);
    ts_tiny_weights(12, w2);
}

static void teardown_dir(void) {
    if (ts_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
}

enum { NL = 4 * 2 * 8 * 8, NC = 5 * 32 };
static const tdit_shape_t SHAPE_CFG = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };

typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    tdit_model_t *m;
    cap_cache_t *c;
    tdit_staging_t *stg;
    float lat[NL], ctx[NC], unc[NC];
    int evicts[CAP_EVICT_COUNT];
} fx_t;

static void on_event(void *u, const cap_event_t *ev) {
    fx_t *f = u;
    if (ev->kind == CAP_EV_EVICT) f->evicts[ev->reason]++;
}

static void quiet(void *u, int level, const char *msg) { (void)u; (void)level; (void)msg; }

static fx_t *fx_open(cap_policy_t policy) {
    fx_t *f = calloc(1, sizeof *f);
    f->b = kern_backend_cpu_new();
    f->s = kern_stream_new(f->b);
    f->m = tdit_model_load_path(f->b, w1, KERN_F32);
    TS_NEW(f->m);
    cap_options_t o = cap_options_default();
    o.policy = policy;
    o.on_event = on_event;
    o.event_user = f;
    o.log = quiet;
    f->c = cap_cache_new(f->b, &o);
    ck_assert_int_eq(tdit_register_weights(f->c, f->m, 1), 0);
    f->stg = tdit_staging_new(f->m, &SHAPE_CFG);
    ck_assert_ptr_nonnull(f->stg);
    tdit_initial_latent(1, f->lat, NL);
    tdit_initial_latent(2, f->ctx, NC);
    tdit_initial_latent(3, f->unc, NC);
    return f;
}

static void fx_close(fx_t *f) {
    cap_cache_destroy(&f->c);
    tdit_staging_destroy(&f->stg);
    tdit_model_destroy(&f->m);
    kern_stream_destroy(&f->s);
    ck_assert_uint_eq(kern_bytes_in_use(f->b), 0);
    kern_backend_destroy(&f->b);
    free(f);
}

/* The pure eager loop (no cache at all) with m's current weights. */
static void eager(fx_t *f, const tdit_loop_t *p, float *out) {
    tdit_ws_t *ws = tdit_ws_new(f->m, f->s, &SHAPE_CFG);
    TS_OK(tdit_generate(f->m, ws, f->s, p, f->lat, f->ctx, f->unc, out, NULL));
    tdit_ws_destroy(&ws);
}

static void cached_in(fx_t *f, tdit_staging_t *stg, const tdit_loop_t *p, float *out, tdit_run_stats_t *st) {
    memset(st, 0, sizeof *st);
    int rc = tdit_generate_cached(f->m, f->c, f->s, stg, &SHAPE_CFG, p, f->lat, f->ctx, f->unc, out, st);
    TS_OK(rc);
}

static void cached(fx_t *f, const tdit_loop_t *p, float *out, tdit_run_stats_t *st) {
    cached_in(f, f->stg, p, out, st);
}

START_TEST(test_cached_cfg_loop_captures_once_replays_rest_bitwise_equal_to_pure_eager) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_loop_t p = { .steps = 7, .shift = 3.0, .guidance = 4.0f };
    static float a[NL], b[NL];
    tdit_run_stats_t st;
    cached(f, &p, a, &st);
    eager(f, &p, b);
    ck_assert_int_eq(st.declines[CAP_DECLINE_WARMING_UP], 2);
    ck_assert_int_eq(st.captured, 1);
    ck_assert_int_eq(st.replayed, 4);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    fx_close(f);
}
END_TEST

START_TEST(test_second_request_through_same_staging_replays_every_step) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_loop_t p = { .steps = 4, .shift = 3.0, .guidance = 4.0f };
    static float a[NL], b[NL];
    tdit_run_stats_t st;
    cached(f, &p, a, &st);
    cached(f, &p, b, &st);
    ck_assert_int_eq(st.replayed, 4);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_gt(cs.bind_bytes_pinned, 0); /* contexts read in place */
    fx_close(f);
}
END_TEST

START_TEST(test_request_in_new_buffers_declines_moved_pin_then_recaptures_exactly) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_loop_t p = { .steps = 5, .shift = 3.0, .guidance = 4.0f };
    static float a[NL], b[NL];
    tdit_run_stats_t st;
    cached(f, &p, a, &st);
    tdit_staging_t *other = tdit_staging_new(f->m, &SHAPE_CFG); /* surely other addresses */
    cached_in(f, other, &p, b, &st);
    ck_assert_int_eq(st.declines[CAP_DECLINE_PINNED_INPUT_MOVED], 1);
    ck_assert_int_eq(st.captured, 1);
    ck_assert_int_eq(st.replayed, 3);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    /* the contexts are no longer pinned: a third place replays every step */
    tdit_staging_destroy(&other);
    tdit_staging_t *third = tdit_staging_new(f->m, &SHAPE_CFG);
    cached_in(f, third, &p, b, &st);
    ck_assert_int_eq(st.replayed, 5);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    tdit_staging_destroy(&third);
    fx_close(f);
}
END_TEST

START_TEST(test_sde_steps_capture_once_and_replay_for_every_seed_bitwise_equal_to_eager_sde) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_loop_t p = { .steps = 5, .shift = 3.0, .guidance = 4.0f, .sde = true, .eta = 0.7f, .seed = 9 };
    static float a[NL], b[NL];
    tdit_run_stats_t st;
    cached(f, &p, a, &st);
    eager(f, &p, b);
    ck_assert_int_eq(st.declines[CAP_DECLINE_NOT_CAPTURABLE], 0);
    ck_assert_int_eq(st.declines[CAP_DECLINE_WARMING_UP], 2);
    ck_assert_int_eq(st.captured, 1);
    ck_assert_int_eq(st.replayed, 2);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    /* Another seed, another eta: the same graph replays every step (eta,
     * seed and step are read from the workspace), and stays exact. */
    for (int k = 0; k < 3; k++) {
        p.seed = 100 + (uint64_t)k;
        p.eta = 0.3f + 0.2f * (float)k;
        cached(f, &p, a, &st);
        eager(f, &p, b);
        ck_assert_int_eq(st.replayed, 5);
        ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    }
    /* And the Euler key of the same shape is a different graph. */
    tdit_loop_t e = { .steps = 4, .shift = 3.0, .guidance = 4.0f };
    cached(f, &e, a, &st);
    ck_assert_int_eq(st.declines[CAP_DECLINE_WARMING_UP], 2);
    eager(f, &e, b);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    fx_close(f);
}
END_TEST

static void sync_to_w2(fx_t *f) {
    st_file_t *nf = st_open(w2);
    ck_assert_ptr_nonnull(nf);
    TS_OK(tdit_model_reload(f->m, nf));
    st_close(&nf);
    int n = cap_component_update(f->c, TDIT_COMPONENT, tdit_model_weights(f->m), tdit_model_bytes(f->m), 2);
    ck_assert_msg(n == 1, "entries affected: %d (%s)", n, reel_err_text());
}

START_TEST(test_weight_sync_evict_policy_drops_graph_and_recaptures_with_new_weights) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_loop_t p = { .steps = 4, .shift = 3.0, .guidance = 4.0f };
    static float a[NL], b[NL];
    tdit_run_stats_t st;
    cached(f, &p, a, &st);
    sync_to_w2(f);
    ck_assert_int_eq(f->evicts[CAP_EVICT_WEIGHT_SYNC], 1);
    cached(f, &p, a, &st);
    ck_assert_int_eq(st.declines[CAP_DECLINE_WARMING_UP], 2);
    ck_assert_int_eq(st.captured, 1);
    eager(f, &p, b);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    fx_close(f);
}
END_TEST

START_TEST(test_weight_sync_inplace_policy_keeps_graph_and_reverifies) {
    fx_t *f = fx_open(CAP_POLICY_INPLACE);
    tdit_loop_t p = { .steps = 4, .shift = 3.0, .guidance = 4.0f };
    static float a[NL], b[NL];
    tdit_run_stats_t st;
    cached(f, &p, a, &st);
    sync_to_w2(f);
    ck_assert_int_eq(f->evicts[CAP_EVICT_WEIGHT_SYNC], 0);
    cached(f, &p, a, &st);
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_eq(cs.captures, 1);        /* never recaptured */
    ck_assert_uint_eq(cs.reverifies, 1);
    eager(f, &p, b);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    fx_close(f);
}
END_TEST

START_TEST(test_stale_weight_version_is_refused) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    ck_assert_int_eq(cap_component_update(f->c, TDIT_COMPONENT, tdit_model_weights(f->m), tdit_model_bytes(f->m), 1), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "not newer"));
    fx_close(f);
}
END_TEST

/* How many of m's tensors hold, bitwise, the bytes of a tensor of file
 * path with the same shape (F32 files: every tensor of a CPU model is read
 * straight into its place in the arena). */
static int tensors_from(const tdit_model_t *m, const char *path) {
    st_file_t *f = st_open(path);
    ck_assert_ptr_nonnull(f);
    int n = 0;
    for (int i = 0; i < tdit_model_n_tensors(m); i++) {
        const kern_tensor_t *t = tdit_model_tensor(m, i);
        for (size_t j = 0; j < st_count(f); j++) {
            const st_tensor_t *e = st_at(f, j);
            if (e->nbytes != kern_tensor_bytes(t)) continue;
            if (!memcmp(e->data, kern_tensor_ptr(t), e->nbytes)) {
                n++;
                break;
            }
        }
    }
    st_close(&f);
    return n;
}

/* A reload puts the new file's bytes in every tensor (and the load the
 * first file's): none keeps an old value. */
START_TEST(test_reload_puts_every_tensor_of_the_new_file_in_place) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    int n = tdit_model_n_tensors(f->m);
    ck_assert_int_gt(n, 10);
    ck_assert_int_eq(tensors_from(f->m, w1), n);
    ck_assert_int_lt(tensors_from(f->m, w2), n); /* w2 differs from w1 */
    st_file_t *nf = st_open(w2);
    ck_assert_ptr_nonnull(nf);
    TS_OK(tdit_model_reload(f->m, nf));
    st_close(&nf);
    ck_assert_int_eq(tensors_from(f->m, w2), n);
    ck_assert_int_lt(tensors_from(f->m, w1), n);
    fx_close(f);
}
END_TEST

START_TEST(test_reload_with_other_config_fails_and_keeps_weights) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    char p2[160];
    snprintf(p2, sizeof p2, "%s/small.safetensors", dir);
    tdit_config_t c;
    tdit_config_builtin("small", &c);
    c.layers = 1;
    ck_assert_int_eq(tdit_weights_init(&c, 1, p2), 0);
    st_file_t *nf = st_open(p2);
    tdit_loop_t p = { .steps = 2, .shift = 3.0, .guidance = 4.0f };
    static float a[NL], b[NL];
    eager(f, &p, a);
    ck_assert_int_eq(tdit_model_reload(f->m, nf), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "does not match"));
    eager(f, &p, b);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    st_close(&nf);
    fx_close(f);
}
END_TEST


/* One request run step by step with everything recorded. */
static tdit_req_t *recorded(fx_t *f, const tdit_loop_t *p, tdit_run_stats_t *st) {
    tdit_req_t *r = tdit_req_new_in(f->m, f->s, f->stg, &SHAPE_CFG, p, f->lat, f->ctx, f->unc);
    TS_NEW(r);
    ck_assert_msg(tdit_req_record(r, f->s, TDIT_REC_TRAJECTORY | TDIT_REC_LOG_PROBS | TDIT_REC_MEANS) == 0, "%s",
                  reel_err_text());
    while (!tdit_req_done(r)) ck_assert_msg(tdit_req_step(r, f->c, f->s, NULL) == 0, "%s", reel_err_text());
    *st = *tdit_req_stats(r);
    return r;
}

START_TEST(test_a_recorded_sde_rollout_is_the_same_replayed_or_eager_and_its_log_probs_follow_its_means) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_loop_t p = { .steps = 5, .shift = 3.0, .guidance = 4.0f, .sde = true, .eta = 0.7f, .seed = 4 };
    tdit_run_stats_t s1, s2;
    tdit_req_t *a = recorded(f, &p, &s1), *b = recorded(f, &p, &s2);
    ck_assert_int_eq(s2.replayed, 5); /* the second one entirely from the graph */
    ck_assert_int_lt(s1.replayed, 5);
    const size_t n = NL;
    ck_assert_int_eq(memcmp(tdit_req_trajectory(a), tdit_req_trajectory(b), 6 * n * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(tdit_req_means(a), tdit_req_means(b), 5 * n * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(tdit_req_log_probs(a), tdit_req_log_probs(b), 5 * sizeof(float)), 0);
    static float e[NL];
    eager(f, &p, e);
    ck_assert_int_eq(memcmp(tdit_req_trajectory(a) + 5 * n, e, sizeof e), 0);
    ck_assert_int_eq(memcmp(tdit_req_trajectory(a), f->lat, sizeof f->lat), 0);
    /* x_{i+1} = μ_i + s_i·ε with ε ~ N(0, 1): the log-probability is about
     * −log s_i − log √(2π) − 1/2 (within sampling noise over 512 values). */
    const double *sig = tdit_req_sigmas(a);
    for (int i = 0; i < 5; i++) {
        double si = (float)sig[i], sn = (float)sig[i + 1], sp = si == 1.0 ? (float)sig[1] : si;
        double sd = 0.7 * sqrt(si / (1.0 - sp)) * sqrt(si - sn);
        double expect = -log(sd) - 0.5 * log(2.0 * M_PI) - 0.5;
        ck_assert_msg(fabs(tdit_req_log_probs(a)[i] - expect) < 0.2, "step %d: log p %g, expected about %g", i,
                      (double)tdit_req_log_probs(a)[i], expect);
        ck_assert_uint_eq(tdit_req_versions(a)[i], 1);
    }
    tdit_req_destroy(&a);
    tdit_req_destroy(&b);
    fx_close(f);
}
END_TEST

/* Runs one request (a group when sh->batch > 1) through f's cache to the
 * end, recording everything an SDE loop can record; latent drawn from the
 * seeds. */
static tdit_req_t *run_req(fx_t *f, tdit_staging_t *stg, const tdit_shape_t *sh, const tdit_loop_t *p,
                           const uint64_t *seeds, tdit_run_stats_t *st) {
    tdit_req_t *r = tdit_req_new_group(f->m, f->s, stg, sh, p, seeds, NULL, f->ctx, sh->cfg ? f->unc : NULL);
    TS_NEW(r);
    unsigned what = TDIT_REC_TRAJECTORY | (p->sde ? TDIT_REC_LOG_PROBS | TDIT_REC_MEANS : 0);
    TS_OK(tdit_req_record(r, f->s, what));
    while (!tdit_req_done(r)) ck_assert_msg(tdit_req_step(r, f->c, f->s, NULL) == 0, "%s", reel_err_text());
    if (st) *st = *tdit_req_stats(r);
    return r;
}

/* A group of B samples in one batched step, captured and replayed, is
 * sample for sample bitwise the B single requests with the same seeds:
 * final latent, every latent of the trajectory, the SDE means and the
 * log-probabilities; with and without CFG, Euler and SDE. */
START_TEST(test_a_batched_group_is_bitwise_the_single_requests_with_its_seeds) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    const int steps = 4;
    const uint64_t seeds[3] = { 7, 900, 7 }; /* a repeated seed gives the same sample twice */
    for (int v = 0; v < 4; v++) {
        bool cfg = v & 1, sde = v & 2;
        tdit_shape_t one = { 2, 8, 8, 5, cfg, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER }, grp = one;
        grp.batch = 3;
        tdit_loop_t p = { .steps = steps, .shift = 3.0, .guidance = 4.0f, .sde = sde, .eta = 0.8f };
        tdit_run_stats_t st1, st2;
        tdit_staging_t *stg = tdit_staging_new(f->m, &grp); /* the group's buffers stay put: contexts pin */
        ck_assert_ptr_nonnull(stg);
        tdit_req_t *g1 = run_req(f, stg, &grp, &p, seeds, &st1), *g2 = run_req(f, stg, &grp, &p, seeds, &st2);
        ck_assert_int_eq(tdit_req_batch(g1), 3);
        ck_assert_int_eq(st2.replayed, steps); /* the second group entirely from its graph */
        ck_assert_int_eq(st1.captured + st2.captured, 1);
        const size_t n = NL, traj = (size_t)(steps + 1) * n;
        ck_assert_int_eq(memcmp(tdit_req_trajectory(g1), tdit_req_trajectory(g2), 3 * traj * sizeof(float)), 0);
        static float fin[3 * NL];
        ck_assert_int_eq(tdit_req_read(g1, f->s, fin, 3 * n), 0);
        for (int b = 0; b < 3; b++) {
            tdit_loop_t q = p;
            q.seed = seeds[b];
            tdit_req_t *r = run_req(f, NULL, &one, &q, NULL, NULL);
            ck_assert_msg(memcmp(tdit_req_trajectory(g1) + (size_t)b * traj, tdit_req_trajectory(r),
                                 traj * sizeof(float)) == 0, "cfg %d sde %d sample %d: trajectory differs", cfg, sde, b);
            ck_assert_int_eq(memcmp(fin + (size_t)b * n, tdit_req_trajectory(r) + (size_t)steps * n, n * sizeof(float)), 0);
            if (sde) {
                ck_assert_int_eq(memcmp(tdit_req_means(g1) + (size_t)b * steps * n, tdit_req_means(r),
                                        (size_t)steps * n * sizeof(float)), 0);
                ck_assert_int_eq(memcmp(tdit_req_log_probs(g1) + (size_t)b * steps, tdit_req_log_probs(r),
                                        (size_t)steps * sizeof(float)), 0);
            }
            tdit_req_destroy(&r);
        }
        /* Different seeds, different samples; the repeated seed, the same. */
        ck_assert_int_ne(memcmp(fin, fin + n, n * sizeof(float)), 0);
        ck_assert_int_eq(memcmp(fin, fin + 2 * n, n * sizeof(float)), 0);
        tdit_req_destroy(&g1);
        tdit_req_destroy(&g2);
        tdit_staging_destroy(&stg);
    }
    fx_close(f);
}
END_TEST

/* Without seeds, sample b uses seed + b; a group key differs from the
 * single key and from another batch size, so their graphs never mix. */
START_TEST(test_a_group_without_seeds_uses_seed_plus_index_and_has_its_own_key) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_shape_t one = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER }, g2 = one, g4 = one;
    g2.batch = 2;
    g4.batch = 4;
    tdit_loop_t p = { .steps = 2, .shift = 3.0, .guidance = 4.0f, .sde = true, .eta = 0.7f, .seed = 40 };
    tdit_req_t *g = run_req(f, NULL, &g4, &p, NULL, NULL);
    for (int b = 0; b < 4; b++) ck_assert_uint_eq(tdit_req_seeds(g)[b], 40 + (uint64_t)b);
    tdit_loop_t q = p;
    q.seed = 43;
    tdit_req_t *r = run_req(f, NULL, &one, &q, NULL, NULL);
    ck_assert_int_eq(memcmp(tdit_req_trajectory(g) + 3 * 3 * (size_t)NL, tdit_req_trajectory(r), 3 * NL * sizeof(float)), 0);
    cap_key_t k1, k2, k4;
    ck_assert_int_eq(tdit_step_key(f->m, &one, true, 1, &k1), 0);
    ck_assert_int_eq(tdit_step_key(f->m, &g2, true, 1, &k2), 0);
    ck_assert_int_eq(tdit_step_key(f->m, &g4, true, 1, &k4), 0);
    ck_assert_uint_ne(cap_key_shard_hash(&k1), cap_key_shard_hash(&k2));
    ck_assert_uint_ne(cap_key_shard_hash(&k2), cap_key_shard_hash(&k4));
    ck_assert_int_eq(k4.inputs[0].ndim, 5);
    ck_assert_int_eq(k4.inputs[0].shape[0], 4);
    /* batch 0 and 1 are the same single shape and key */
    tdit_shape_t zero = one;
    zero.batch = 0;
    ck_assert(tdit_shape_equal(&zero, &one));
    ck_assert_int_eq(tdit_step_key(f->m, &zero, true, 1, &k2), 0);
    ck_assert_uint_eq(cap_key_hash(&k1), cap_key_hash(&k2));
    /* out of range */
    tdit_shape_t big = one;
    big.batch = TDIT_MAX_BATCH + 1;
    ck_assert_int_eq(tdit_shape_validate(&big), -1);
    ck_assert_ptr_null(tdit_req_new_group(f->m, f->s, NULL, &big, &p, NULL, NULL, f->ctx, f->unc));
    tdit_req_destroy(&g);
    tdit_req_destroy(&r);
    fx_close(f);
}
END_TEST

START_TEST(test_log_probs_of_an_euler_loop_are_refused) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_loop_t p = { .steps = 2, .shift = 3.0, .guidance = 4.0f };
    tdit_req_t *r = tdit_req_new_in(f->m, f->s, f->stg, &SHAPE_CFG, &p, f->lat, f->ctx, f->unc);
    ck_assert_int_eq(tdit_req_record(r, f->s, TDIT_REC_LOG_PROBS), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "eta > 0"));
    ck_assert_int_eq(tdit_req_record(r, f->s, TDIT_REC_TRAJECTORY), 0);
    tdit_req_destroy(&r);
    fx_close(f);
}
END_TEST

/* ---- any mix of shapes on one stream (issue 7) ------------------------------- */

/* The pure eager loop for any shape, with m's current weights. */
static void eager_shape(fx_t *f, const tdit_shape_t *sh, const tdit_loop_t *p, const float *lat,
                        const float *ctx, const float *unc, float *out) {
    tdit_ws_t *ws = tdit_ws_new(f->m, f->s, sh);
    TS_NEW(ws);
    ck_assert_msg(tdit_generate(f->m, ws, f->s, p, lat, ctx, sh->cfg ? unc : NULL, out, NULL) == 0, "%s",
                  reel_err_text());
    tdit_ws_destroy(&ws);
}

typedef struct { int64_t F, H, W, L; bool cfg, sde; } mix_t;

/* Growing, shrinking and interleaved shapes, CFG on and off, Euler and SDE,
 * each shape repeated later so graphs of every size stay alive side by side
 * on the one stream and replay after other shapes were captured. */
static const mix_t MIX[] = {
    { 1, 4, 4, 3, false, false }, { 2, 8, 8, 5, true, false },  { 1, 16, 16, 7, true, false },
    { 1, 4, 4, 3, false, false }, { 3, 8, 12, 2, false, false }, { 2, 8, 8, 5, true, true },
    { 1, 16, 16, 7, true, false }, { 1, 2, 2, 1, true, false },  { 2, 8, 8, 5, true, false },
    { 3, 8, 12, 2, false, false }, { 1, 4, 4, 3, false, true },  { 1, 2, 2, 1, true, false },
    { 4, 16, 8, 9, false, false }, { 1, 16, 16, 7, true, false }, { 4, 16, 8, 9, false, false },
};

static void run_mix(fx_t *f, const mix_t *mx, int n, int reps, int *replayed_out) {
    int replayed = 0;
    for (int rep = 0; rep < reps; rep++)
        for (int i = 0; i < n; i++) {
            const mix_t *m = &mx[i];
            tdit_shape_t sh = { m->F, m->H, m->W, m->L, m->cfg, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
            size_t nl = (size_t)(4 * m->F * m->H * m->W), nc = (size_t)(m->L * 32);
            float *lat = malloc(nl * 4), *ctx = malloc(nc * 4), *unc = malloc(nc * 4);
            float *a = malloc(nl * 4), *b = malloc(nl * 4);
            tdit_initial_latent(100 + (uint64_t)i, lat, nl);
            tdit_initial_latent(200 + (uint64_t)i + (uint64_t)rep, ctx, nc);
            tdit_initial_latent(300 + (uint64_t)i, unc, nc);
            tdit_loop_t p = { .steps = 3 + i % 3, .shift = 3.0, .guidance = m->cfg ? 4.0f : 1.0f,
                              .sde = m->sde, .eta = 0.7f, .seed = (uint64_t)i };
            tdit_run_stats_t st;
            memset(&st, 0, sizeof st);
            int rc = tdit_generate_cached(f->m, f->c, f->s, NULL, &sh, &p, lat, ctx, m->cfg ? unc : NULL, a, &st);
            ck_assert_msg(rc == 0, "request %d (rep %d, F=%lld H=%lld W=%lld L=%lld cfg=%d sde=%d): %s", i, rep,
                          (long long)m->F, (long long)m->H, (long long)m->W, (long long)m->L, m->cfg, m->sde,
                          reel_err_text());
            eager_shape(f, &sh, &p, lat, ctx, unc, b);
            ck_assert_msg(memcmp(a, b, nl * 4) == 0, "request %d (rep %d) differs from pure eager", i, rep);
            replayed += st.replayed;
            free(lat); free(ctx); free(unc); free(a); free(b);
        }
    *replayed_out = replayed;
}


/* ---- multistep solvers (UniPC, DPM++) --------------------------------------- */

static const tdit_solver_t MS_SOLVERS[2] = { TDIT_SOLVER_UNIPC, TDIT_SOLVER_DPMPP };

/* Every UniPC and DPM++ step is one captured graph replayed for the rest of
 * the loop, bitwise equal to the pure eager loop; a second request of the
 * key replays every step. Each solver has its own key (loop "unipc" or
 * "dpm++": what an operator reads in the catalog), and Euler's stays
 * apart. CFG on and off. */
START_TEST(test_multistep_solvers_capture_once_replay_rest_bitwise_equal_to_pure_eager) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    for (int v = 0; v < 4; v++) {
        bool cfg = v & 1;
        tdit_solver_t so = MS_SOLVERS[v >> 1];
        tdit_shape_t sh = { 2, 8, 8, 5, cfg, 1, so, false, TDIT_SOLVER_EULER };
        tdit_loop_t p = { .steps = 6, .shift = 5.0, .guidance = 5.0f, .solver = so };
        static float a[NL], b[NL], c[NL];
        tdit_staging_t *stg = tdit_staging_new(f->m, &sh);
        ck_assert_ptr_nonnull(stg);
        tdit_run_stats_t st1, st2;
        memset(&st1, 0, sizeof st1);
        memset(&st2, 0, sizeof st2);
        ck_assert_msg(tdit_generate_cached(f->m, f->c, f->s, stg, &sh, &p, f->lat, f->ctx, cfg ? f->unc : NULL, a,
                                           &st1) == 0, "%s", reel_err_text());
        ck_assert_msg(tdit_generate_cached(f->m, f->c, f->s, stg, &sh, &p, f->lat, f->ctx, cfg ? f->unc : NULL, b,
                                           &st2) == 0, "%s", reel_err_text());
        eager_shape(f, &sh, &p, f->lat, f->ctx, f->unc, c);
        ck_assert_msg(memcmp(a, c, sizeof a) == 0, "%s cfg %d: captured loop differs from eager", tdit_solver_name(so), cfg);
        ck_assert_int_eq(memcmp(b, c, sizeof b), 0);
        ck_assert_int_eq(st1.captured, 1);
        ck_assert_int_eq(st1.replayed, 3);
        ck_assert_int_eq(st2.replayed, 6);
        cap_key_t k;
        ck_assert_int_eq(tdit_step_key(f->m, &sh, false, 1, &k), 0);
        ck_assert_str_eq(k.loop, tdit_solver_name(so));
        /* The result is not the input, and not Euler's. */
        tdit_shape_t esh = sh;
        esh.solver = TDIT_SOLVER_EULER;
        tdit_loop_t ep = p;
        ep.solver = TDIT_SOLVER_EULER;
        eager_shape(f, &esh, &ep, f->lat, f->ctx, f->unc, b);
        ck_assert_int_ne(memcmp(b, c, sizeof b), 0);
        ck_assert_int_ne(memcmp(f->lat, c, sizeof c), 0);
        tdit_staging_destroy(&stg);
    }
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_eq(cs.graphs, 4); /* {unipc, dpm++} x {cfg, no cfg} */
    fx_close(f);
}
END_TEST

/* Requests whose steps interleave on one stream and one graph each keep
 * their own history (it lives in the request's buffers, copied in and out
 * of the shared workspace): each ends bitwise where it ends alone. */
START_TEST(test_interleaved_multistep_requests_keep_their_own_history) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_shape_t sh = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_UNIPC, false, TDIT_SOLVER_EULER }, shd = sh;
    shd.solver = TDIT_SOLVER_DPMPP;
    tdit_loop_t pa = { .steps = 5, .shift = 3.0, .guidance = 4.0f, .solver = TDIT_SOLVER_UNIPC, .seed = 1 };
    tdit_loop_t pb = { .steps = 7, .shift = 5.0, .guidance = 2.0f, .solver = TDIT_SOLVER_DPMPP, .seed = 2 };
    tdit_loop_t pc = { .steps = 4, .shift = 1.0, .guidance = 6.0f, .solver = TDIT_SOLVER_UNIPC, .seed = 3 };
    const tdit_loop_t *ps[3] = { &pa, &pb, &pc };
    const tdit_shape_t *shs[3] = { &sh, &shd, &sh };
    tdit_req_t *r[3];
    for (int i = 0; i < 3; i++) {
        r[i] = tdit_req_new_group(f->m, f->s, NULL, shs[i], ps[i], NULL, NULL, f->ctx, f->unc);
        TS_NEW(r[i]);
    }
    for (bool any = true; any;) {
        any = false;
        for (int i = 0; i < 3; i++)
            if (!tdit_req_done(r[i])) {
                TS_OK(tdit_req_step(r[i], f->c, f->s, NULL));
                any = true;
            }
    }
    for (int i = 0; i < 3; i++) {
        static float got[NL], want[NL], lat[NL];
        ck_assert_int_eq(tdit_req_read(r[i], f->s, got, NL), 0);
        tdit_initial_latent(ps[i]->seed, lat, NL);
        eager_shape(f, shs[i], ps[i], lat, f->ctx, f->unc, want);
        ck_assert_msg(memcmp(got, want, sizeof got) == 0, "request %d differs from its loop alone", i);
        tdit_req_destroy(&r[i]);
    }
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_gt(cs.replays, 0);
    fx_close(f);
}
END_TEST

/* A group of B samples under UniPC and DPM++ (one batched step, the
 * coefficients shared, each sample's history its own rows) is sample for
 * sample bitwise the single requests with its seeds, captured once and
 * replayed; with CFG. */
START_TEST(test_a_batched_multistep_group_is_bitwise_the_single_requests) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    const uint64_t seeds[3] = { 4, 77, 4 };
    for (int so = 0; so < 2; so++) {
        tdit_solver_t sv = MS_SOLVERS[so];
        tdit_shape_t one = { 2, 8, 8, 5, true, 1, sv, false, TDIT_SOLVER_EULER }, grp = one;
        grp.batch = 3;
        tdit_loop_t p = { .steps = 5, .shift = 5.0, .guidance = 5.0f, .solver = sv };
        tdit_staging_t *stg = tdit_staging_new(f->m, &grp);
        ck_assert_ptr_nonnull(stg);
        tdit_run_stats_t st1, st2;
        tdit_req_t *g1 = run_req(f, stg, &grp, &p, seeds, &st1), *g2 = run_req(f, stg, &grp, &p, seeds, &st2);
        ck_assert_int_eq(st1.captured, 1);
        ck_assert_int_eq(st2.replayed, 5);
        static float a[3 * NL], b[3 * NL];
        ck_assert_int_eq(tdit_req_read(g1, f->s, a, 3 * NL), 0);
        ck_assert_int_eq(tdit_req_read(g2, f->s, b, 3 * NL), 0);
        ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
        for (int i = 0; i < 3; i++) {
            static float lat[NL], want[NL];
            tdit_initial_latent(seeds[i], lat, NL);
            eager_shape(f, &one, &p, lat, f->ctx, f->unc, want);
            ck_assert_msg(memcmp(a + (size_t)i * NL, want, sizeof want) == 0, "%s sample %d differs from its single loop",
                          tdit_solver_name(sv), i);
        }
        ck_assert_int_ne(memcmp(a, a + NL, NL * sizeof(float)), 0);
        tdit_req_destroy(&g1);
        tdit_req_destroy(&g2);
        tdit_staging_destroy(&stg);
    }
    fx_close(f);
}
END_TEST

/* A solver runs in a shape made for it (its key, its workspace), and an
 * SDE loop naming a multistep solver in a shape of that solver's grid
 * (Euler's sampler), never in the solver's own: each mismatch with a
 * message, nothing run. */
START_TEST(test_solver_and_shape_mismatches_are_refused) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_shape_t ms = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_UNIPC, false, TDIT_SOLVER_EULER }, plain = ms;
    plain.solver = TDIT_SOLVER_EULER;
    tdit_loop_t p = { .steps = 3, .shift = 3.0, .guidance = 4.0f, .solver = TDIT_SOLVER_UNIPC };
    ck_assert_ptr_null(tdit_req_new_group(f->m, f->s, NULL, &plain, &p, NULL, NULL, f->ctx, f->unc));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "made for euler"));
    p.solver = TDIT_SOLVER_EULER;
    ck_assert_ptr_null(tdit_req_new_group(f->m, f->s, NULL, &ms, &p, NULL, NULL, f->ctx, f->unc));
    p.solver = TDIT_SOLVER_DPMPP;
    ck_assert_ptr_null(tdit_req_new_group(f->m, f->s, NULL, &ms, &p, NULL, NULL, f->ctx, f->unc));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "made for unipc"));
    ms.solver = TDIT_SOLVER_DPMPP;
    p.sde = true;
    p.eta = 0.7f;
    TS_OK(tdit_loop_validate(&p)); /* SDE steps on DPM++'s grid */
    ck_assert_ptr_null(tdit_req_new_group(f->m, f->s, NULL, &ms, &p, NULL, NULL, f->ctx, f->unc));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "sde on dpm++ runs in a shape made for dpm++"));
    ck_assert_ptr_null(tdit_req_new_group(f->m, f->s, NULL, &plain, &p, NULL, NULL, f->ctx, f->unc));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "(grid euler)")); /* Euler's grid is not DPM++'s */
    tdit_shape_t grid = plain;
    tdit_loop_shape(&p, &grid);
    ck_assert_int_eq(grid.solver, TDIT_SOLVER_EULER);
    ck_assert_int_eq(grid.grid, TDIT_SOLVER_DPMPP);
    tdit_req_t *r = tdit_req_new_group(f->m, f->s, NULL, &grid, &p, NULL, NULL, f->ctx, f->unc);
    TS_NEW(r);
    tdit_req_destroy(&r);
    /* a grid under a multistep solver's own steps is no shape */
    grid.solver = TDIT_SOLVER_UNIPC;
    ck_assert_int_ne(tdit_shape_validate(&grid), 0);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "grid is for Euler and SDE steps"));
    fx_close(f);
}
END_TEST

START_TEST(test_any_mix_of_shapes_cfg_and_sde_on_one_stream_is_served_bitwise_equal_to_eager) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    int replayed = 0;
    run_mix(f, MIX, (int)(sizeof MIX / sizeof MIX[0]), 2, &replayed);
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    /* Every Euler shape captured and its graph stayed alive beside the others. */
    ck_assert_uint_ge(cs.graphs, 6);
    ck_assert_int_gt(replayed, 20);
    ck_assert_uint_eq(cs.declines[CAP_DECLINE_SHAPE_MISMATCH], 0);
    ck_assert(cap_cache_invariants(f->c));
    fx_close(f);
}
END_TEST

START_TEST(test_mixed_shapes_under_a_small_budget_evict_or_run_eager_but_never_fail) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    cap_cache_destroy(&f->c);
    cap_options_t o = cap_options_default();
    o.log = quiet;
    /* Room for about one mid-size entry: big ones run in transient workspaces. */
    tdit_shape_t mid = { 2, 8, 8, 5, true, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    o.budget_bytes = tdit_ws_size(f->m, &mid) + 64 * 1024;
    f->c = cap_cache_new(f->b, &o);
    ck_assert_int_eq(tdit_register_weights(f->c, f->m, 1), 0);
    int replayed = 0;
    run_mix(f, MIX, (int)(sizeof MIX / sizeof MIX[0]), 1, &replayed);
    cap_stats_t cs;
    cap_cache_stats(f->c, &cs);
    ck_assert_uint_le(cs.bytes_held, o.budget_bytes);
    ck_assert_uint_gt(cs.evictions[CAP_EVICT_LRU] + cs.declines[CAP_DECLINE_BUDGET_EXCEEDED], 0);
    ck_assert(cap_cache_invariants(f->c));
    fx_close(f);
}
END_TEST

START_TEST(test_weights_relocated_without_a_sync_decline_weights_moved_and_match_eager) {
    fx_t *f = fx_open(CAP_POLICY_EVICT);
    tdit_loop_t p = { .steps = 5, .shift = 3.0, .guidance = 4.0f };
    static float a[NL], b[NL];
    tdit_run_stats_t st;
    cached(f, &p, a, &st);
    ck_assert_int_eq(st.captured, 1);
    /* Re-home every weight and free the old block, with no versioned update:
     * a replay would read freed memory (ASan) or stale weights. */
    const void *old = tdit_model_weights(f->m);
    TS_OK(tdit_model_relocate(f->m));
    ck_assert_ptr_ne(tdit_model_weights(f->m), old);
    cached(f, &p, a, &st);
    ck_assert_int_eq(st.declines[CAP_DECLINE_WEIGHTS_MOVED], 1);
    eager(f, &p, b);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    /* It learns the new residence: warmup, capture, replays, still exact. */
    cached(f, &p, a, &st);
    ck_assert_int_eq(st.replayed, 5);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    fx_close(f);
}
END_TEST

int main(void) {
    Suite *su = suite_create("tdit_cache");
    TCase *tc = tcase_create("loop");
    tcase_add_unchecked_fixture(tc, setup_dir, teardown_dir);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cached_cfg_loop_captures_once_replays_rest_bitwise_equal_to_pure_eager);
    tcase_add_test(tc, test_second_request_through_same_staging_replays_every_step);
    tcase_add_test(tc, test_request_in_new_buffers_declines_moved_pin_then_recaptures_exactly);
    tcase_add_test(tc, test_sde_steps_capture_once_and_replay_for_every_seed_bitwise_equal_to_eager_sde);
    tcase_add_test(tc, test_weight_sync_evict_policy_drops_graph_and_recaptures_with_new_weights);
    tcase_add_test(tc, test_weight_sync_inplace_policy_keeps_graph_and_reverifies);
    tcase_add_test(tc, test_stale_weight_version_is_refused);
    tcase_add_test(tc, test_reload_with_other_config_fails_and_keeps_weights);
    tcase_add_test(tc, test_reload_puts_every_tensor_of_the_new_file_in_place);
    tcase_add_test(tc, test_any_mix_of_shapes_cfg_and_sde_on_one_stream_is_served_bitwise_equal_to_eager);
    tcase_add_test(tc, test_mixed_shapes_under_a_small_budget_evict_or_run_eager_but_never_fail);
    tcase_add_test(tc, test_weights_relocated_without_a_sync_decline_weights_moved_and_match_eager);
    tcase_add_test(tc, test_a_recorded_sde_rollout_is_the_same_replayed_or_eager_and_its_log_probs_follow_its_means);
    tcase_add_test(tc, test_log_probs_of_an_euler_loop_are_refused);
    tcase_add_test(tc, test_a_batched_group_is_bitwise_the_single_requests_with_its_seeds);
    tcase_add_test(tc, test_a_group_without_seeds_uses_seed_plus_index_and_has_its_own_key);
    tcase_add_test(tc, test_multistep_solvers_capture_once_replay_rest_bitwise_equal_to_pure_eager);
    tcase_add_test(tc, test_interleaved_multistep_requests_keep_their_own_history);
    tcase_add_test(tc, test_a_batched_multistep_group_is_bitwise_the_single_requests);
    tcase_add_test(tc, test_solver_and_shape_mismatches_are_refused);
    suite_add_tcase(su, tc);
    return ts_run(su);
}
