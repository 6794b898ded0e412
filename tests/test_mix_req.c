/* test_mix_req.c -- requests stepped together in mixed batches
 * (model/tdit_program.h, tdit_mix_*): random mixes of requests, each at its
 * own point of its own loop (own seed, guidance, shift, step count, eta,
 * contexts), joining and leaving between steps, padded batches, CFG on and
 * off, Euler and SDE with recorded trajectories, means and log-probs: each
 * request's every output bitwise the same request stepped alone. Mixed
 * steps capture once per batch size and replay with any members. Padded
 * rows compute from zeros whoever held them before. What a mix refuses.
 * On the CPU with the tiny config. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/error.h"
#include "model/safetensors.h"
#include "model/tdit_program.h"
#include "tests/support.h"

static char dir[64], wpath[128], w2path[128];

static void setup_dir(void) {
    ts_mkdtemp(dir, sizeof dir, "test-mixreq");
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", dir);
    snprintf(w2path, sizeof w2path, "%s/w2.safetensors", dir);
    ts_tiny_weights(21, wpath);
    ts_tiny_weights(22, w2path);
}

static void teardown_dir(void) {
    if (ts_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
}

enum { NL = 4 * 2 * 8 * 8, NC = 5 * 32, K = 7, MAXSTEPS = 7 };

/* The σ grid SDE requests run on: Euler's, or (the grid tests) UniPC's. */
static tdit_solver_t g_grid = TDIT_SOLVER_EULER;

static tdit_shape_t one(bool cfg) { return (tdit_shape_t){ 2, 8, 8, 5, cfg, 1, TDIT_SOLVER_EULER, false, g_grid }; }

typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    tdit_model_t *m;
    cap_cache_t *c;   /* graphs on: the mixed steps capture and replay */
    cap_cache_t *ref; /* graphs off: each request alone, eager */
} fx_t;

static void quiet(void *u, int level, const char *msg) { (void)u; (void)level; (void)msg; }

static void fx_open(fx_t *f) {
    f->b = kern_backend_cpu_new();
    TS_NEW(f->b);
    f->s = kern_stream_new(f->b);
    TS_NEW(f->s);
    f->m = tdit_model_load_path(f->b, wpath, KERN_F32);
    TS_NEW(f->m);
    cap_options_t o = cap_options_default();
    o.log = quiet;
    f->c = cap_cache_new(f->b, &o);
    TS_NEW(f->c);
    o.graphs = false;
    f->ref = cap_cache_new(f->b, &o);
    TS_NEW(f->ref);
    TS_OK(tdit_register_weights(f->c, f->m, 1));
    TS_OK(tdit_register_weights(f->ref, f->m, 1));
}

static void fx_close(fx_t *f) {
    cap_cache_destroy(&f->c);
    cap_cache_destroy(&f->ref);
    tdit_model_destroy(&f->m);
    kern_stream_destroy(&f->s);
    ck_assert_uint_eq(kern_bytes_in_use(f->b), 0);
    kern_backend_destroy(&f->b);
}

/* Request k's inputs: everything its own. */
typedef struct {
    tdit_loop_t p;
    float ctx[NC], unc[NC];
    unsigned rec;
} spec_t;

static void spec(spec_t *sp, int k, bool sde, uint64_t salt) {
    memset(sp, 0, sizeof *sp);
    sp->p = (tdit_loop_t){ .steps = 3 + (int)((k + salt) % 5), .shift = 1.0 + 0.5 * (double)(k % 4),
                           .guidance = 1.5f + (float)k, .sde = sde, .eta = sde ? 0.3f + 0.1f * (float)(k % 3) : 0,
                           .seed = 1000 * salt + (uint64_t)k * 77, .solver = g_grid };
    ts_fill_uniform(sp->ctx, NC, salt * 31 + (uint64_t)k, -1, 1);
    ts_fill_uniform(sp->unc, NC, salt * 37 + (uint64_t)k, -1, 1);
    sp->rec = TDIT_REC_TRAJECTORY | (sde ? TDIT_REC_LOG_PROBS | TDIT_REC_MEANS : 0);
}

static tdit_req_t *start(fx_t *f, const spec_t *sp, bool cfg) {
    tdit_shape_t sh = one(cfg);
    tdit_req_t *r = tdit_req_new(f->m, f->s, &sh, &sp->p, NULL, sp->ctx, cfg ? sp->unc : NULL);
    TS_NEW(r);
    TS_OK(tdit_req_record(r, f->s, sp->rec));
    return r;
}

/* Every output of a (stepped alone) and b (stepped in mixes) agrees bit
 * for bit. */
static void same(fx_t *f, tdit_req_t *a, tdit_req_t *b, const spec_t *sp, int k) {
    static float xa[NL], xb[NL];
    TS_OK(tdit_req_read(a, f->s, xa, NL));
    TS_OK(tdit_req_read(b, f->s, xb, NL));
    ck_assert_msg(!memcmp(xa, xb, sizeof xa), "request %d: final latent differs from the request alone", k);
    size_t steps = (size_t)sp->p.steps;
    ck_assert_msg(!memcmp(tdit_req_trajectory(a), tdit_req_trajectory(b), (steps + 1) * NL * sizeof(float)),
                  "request %d: trajectory differs", k);
    if (sp->p.sde) {
        ck_assert_msg(!memcmp(tdit_req_means(a), tdit_req_means(b), steps * NL * sizeof(float)), "request %d: means differ", k);
        ck_assert_msg(!memcmp(tdit_req_log_probs(a), tdit_req_log_probs(b), steps * sizeof(float)),
                      "request %d: log-probs differ", k);
    }
    ck_assert_msg(!memcmp(tdit_req_versions(a), tdit_req_versions(b), steps * sizeof(uint64_t)), "request %d: versions", k);
    ck_assert_int_eq(tdit_req_stats(b)->steps, sp->p.steps);
    ck_assert_uint_eq(tdit_req_shard_hash(a), tdit_req_shard_hash(b)); /* its own key, not the batch's */
}

/* xorshift: the mix schedule */
static uint64_t rnd(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* K requests join one per round (two at a time from round 3), and each
 * round every active one steps once: in random chunks of 1..4, a chunk of
 * one alone or padded into a mix of 2, larger chunks in the mix of the
 * next size of 2, 4 (padded when short). Returns the mixed steps that
 * replayed. */
static int run_mixed(fx_t *f, bool cfg, bool sde, uint64_t salt) {
    spec_t sp[K];
    tdit_req_t *alone[K], *mixed[K] = { 0 };
    for (int k = 0; k < K; k++) {
        spec(&sp[k], k, sde, salt);
        alone[k] = start(f, &sp[k], cfg);
        while (!tdit_req_done(alone[k])) TS_OK(tdit_req_step(alone[k], f->ref, f->s, NULL));
    }
    tdit_shape_t sh = one(cfg);
    tdit_mix_t *m2 = tdit_mix_new(f->m, f->s, &sh, sde, 2), *m4 = tdit_mix_new(f->m, f->s, &sh, sde, 4);
    TS_NEW(m2);
    TS_NEW(m4);
    uint64_t x = 0x9e3779b97f4a7c15ull ^ salt;
    int joined = 0, finished = 0, replayed = 0, padded = 0, full = 0;
    for (int round = 0; finished < K; round++) {
        for (int j = 0; j < (round >= 3 ? 2 : 1) && joined < K; j++, joined++) mixed[joined] = start(f, &sp[joined], cfg);
        tdit_req_t *act[K];
        int n = 0;
        for (int k = 0; k < joined; k++)
            if (mixed[k] && !tdit_req_done(mixed[k])) act[n++] = mixed[k];
        for (int i = n - 1; i > 0; i--) { /* shuffle */
            int j = (int)(rnd(&x) % (uint64_t)(i + 1));
            tdit_req_t *t = act[i];
            act[i] = act[j];
            act[j] = t;
        }
        for (int at = 0; at < n;) {
            int c = 1 + (int)(rnd(&x) % 4);
            if (c > n - at) c = n - at;
            bool advanced = false;
            cap_result_t res;
            if (c == 1 && rnd(&x) % 2) {
                TS_OK(tdit_req_step(act[at], f->c, f->s, NULL));
            } else {
                tdit_mix_t *mx = c <= 2 ? m2 : m4;
                padded += c < tdit_mix_capacity(mx);
                full += c == tdit_mix_capacity(mx);
                ck_assert_msg(tdit_mix_step(mx, act + at, c, f->c, f->s, &res, &advanced) == 0, "mixed step: %s",
                              reel_err_text());
                ck_assert(advanced);
                replayed += res.ran == CAP_RAN_REPLAYED;
            }
            at += c;
        }
        for (int k = 0; k < joined; k++)
            if (mixed[k] && tdit_req_done(mixed[k])) {
                same(f, alone[k], mixed[k], &sp[k], k); /* it leaves while others go on */
                tdit_req_destroy(&mixed[k]);
                tdit_req_destroy(&alone[k]);
                finished++;
            }
    }
    ck_assert_msg(padded > 0 && full > 0, "the schedule ran padded (%d) and full (%d) batches", padded, full);
    tdit_mix_destroy(&m2);
    tdit_mix_destroy(&m4);
    return replayed;
}

/* The weights change between two rounds (a sync landing between steps):
 * new weights in place, version 2 in both caches. */
static void sync_weights(fx_t *f) {
    st_file_t *nf = st_open(w2path);
    TS_NEW(nf);
    TS_OK(tdit_model_reload(f->m, nf));
    st_close(&nf);
    ck_assert_int_ge(cap_component_update(f->c, TDIT_COMPONENT, tdit_model_weights(f->m), tdit_model_bytes(f->m), 2), 0);
    ck_assert_int_ge(cap_component_update(f->ref, TDIT_COMPONENT, tdit_model_weights(f->m), tdit_model_bytes(f->m), 2), 0);
}

/* Requests join and step in mixes of 2 and 4 as in run_mixed while each
 * one's twin steps alone in the same round; the weights change after
 * round `at`: requests mid-way run their first steps on v1 and the rest
 * on v2, in the batch as alone. */
static void run_sync(fx_t *f, bool cfg, bool sde, int at) {
    spec_t sp[K];
    tdit_req_t *alone[K] = { 0 }, *mixed[K] = { 0 };
    tdit_shape_t sh = one(cfg);
    tdit_mix_t *m4 = tdit_mix_new(f->m, f->s, &sh, sde, 4);
    TS_NEW(m4);
    int joined = 0, finished = 0, both = 0;
    for (int round = 0; finished < K; round++) {
        if (round == at) sync_weights(f);
        for (int j = 0; j < 2 && joined < K; j++, joined++) {
            spec(&sp[joined], joined, sde, 17);
            mixed[joined] = start(f, &sp[joined], cfg);
            alone[joined] = start(f, &sp[joined], cfg);
        }
        tdit_req_t *act[K];
        int n = 0;
        for (int k = 0; k < joined; k++)
            if (mixed[k] && !tdit_req_done(mixed[k])) {
                act[n++] = mixed[k];
                TS_OK(tdit_req_step(alone[k], f->ref, f->s, NULL));
            }
        for (int at2 = 0; at2 < n; at2 += 4) {
            bool adv;
            TS_OK(tdit_mix_step(m4, act + at2, n - at2 < 4 ? n - at2 : 4, f->c, f->s, NULL, &adv));
        }
        for (int k = 0; k < joined; k++)
            if (mixed[k] && tdit_req_done(mixed[k])) {
                const uint64_t *v = tdit_req_versions(mixed[k]);
                both += v[0] == 1 && v[sp[k].p.steps - 1] == 2;
                same(f, alone[k], mixed[k], &sp[k], k);
                tdit_req_destroy(&mixed[k]);
                tdit_req_destroy(&alone[k]);
                finished++;
            }
    }
    ck_assert_msg(both > 0, "some request ran on v1 then v2");
    tdit_mix_destroy(&m4);
}

START_TEST(test_a_sync_between_mixed_steps_is_bitwise_the_requests_alone_across_it) {
    fx_t f;
    fx_open(&f);
    run_sync(&f, _i & 1, _i & 2, 2);
    fx_close(&f);
}
END_TEST

START_TEST(test_requests_in_random_mixes_with_joins_and_leaves_are_each_bitwise_alone) {
    fx_t f;
    fx_open(&f);
    int replayed = 0;
    for (int v = 0; v < 4; v++) replayed += run_mixed(&f, v & 1, v & 2, 3 + (uint64_t)v);
    /* the same capture key serves any members: the mixes replayed */
    ck_assert_int_gt(replayed, 0);
    fx_close(&f);
}
END_TEST

/* SDE rollouts on UniPC's grid (each step's timestep bound beside its σ,
 * a row of 4 per member) mix as Euler's do: random mixes with joins and
 * leaves, CFG on and off, and a sync between steps, each request bitwise
 * alone; the mixed steps replay. */
START_TEST(test_sde_on_the_unipc_grid_in_random_mixes_and_across_a_sync_is_each_bitwise_alone) {
    g_grid = TDIT_SOLVER_UNIPC;
    fx_t f;
    fx_open(&f);
    int replayed = 0;
    for (int v = 0; v < 2; v++) replayed += run_mixed(&f, v & 1, true, 11 + (uint64_t)v);
    ck_assert_int_gt(replayed, 0);
    run_sync(&f, true, true, 2);
    fx_close(&f);
    g_grid = TDIT_SOLVER_EULER;
}
END_TEST

START_TEST(test_a_mixed_step_captures_once_per_batch_size_and_replays_for_new_members) {
    fx_t f;
    fx_open(&f);
    tdit_shape_t sh = one(true);
    tdit_mix_t *mx = tdit_mix_new(f.m, f.s, &sh, false, 3);
    TS_NEW(mx);
    int ran[3] = { 0 };
    /* four waves of three fresh requests, each run to its end in the mix */
    for (int wave = 0; wave < 4; wave++) {
        spec_t sp[3];
        tdit_req_t *r[3], *a[3];
        for (int k = 0; k < 3; k++) {
            spec(&sp[k], k + 3 * wave, false, 9);
            sp[k].p.steps = 4;
            r[k] = start(&f, &sp[k], true);
            a[k] = start(&f, &sp[k], true);
            while (!tdit_req_done(a[k])) TS_OK(tdit_req_step(a[k], f.ref, f.s, NULL));
        }
        for (int i = 0; i < 4; i++) {
            cap_result_t res;
            bool adv;
            TS_OK(tdit_mix_step(mx, r, 3, f.c, f.s, &res, &adv));
            ran[res.ran]++;
            if (wave > 0) ck_assert_int_eq(res.ran, CAP_RAN_REPLAYED);
        }
        for (int k = 0; k < 3; k++) {
            same(&f, a[k], r[k], &sp[k], k + 3 * wave);
            ck_assert_int_eq(tdit_req_stats(r[k])->replayed + tdit_req_stats(r[k])->captured + tdit_req_stats(r[k])->eager, 4);
            ck_assert_int_eq(tdit_req_stats(r[k])->batched, 4);  /* every step in the mix */
            ck_assert_int_eq(tdit_req_stats(a[k])->batched, 0);  /* its twin alone */
            tdit_req_destroy(&r[k]);
            tdit_req_destroy(&a[k]);
        }
    }
    ck_assert_int_eq(ran[CAP_RAN_CAPTURED], 1);
    ck_assert_int_eq(ran[CAP_RAN_REPLAYED], 16 - 1 - ran[CAP_RAN_EAGER]);
    tdit_mix_destroy(&mx);
    fx_close(&f);
}
END_TEST

/* A batch's padded rows compute from zeros, whoever held them before:
 * after two requests that stepped in rows 1 and 2 leave, a step of one
 * request padded to 3 rows is bitwise -- padding included -- the same
 * request's first step in a fresh batch (its padding zeros from the
 * start), never a step of the leavers' latents and contexts. CFG on, so
 * the unconditional contexts count too; Euler (_i 0) and SDE (_i 1). */
START_TEST(test_padded_rows_hold_zeros_not_what_requests_that_left_put_there) {
    const bool sde = _i == 1;
    fx_t f;
    fx_open(&f);
    tdit_shape_t sh = one(true);
    enum { B = 3 };
    static float want[B * NL], got[B * NL];
    spec_t sp[4];
    for (int k = 0; k < 4; k++) spec(&sp[k], k, sde, 41);
    /* the reference: request 0's first step in a fresh batch */
    tdit_mix_t *fresh = tdit_mix_new(f.m, f.s, &sh, sde, B);
    TS_NEW(fresh);
    tdit_req_t *r0 = start(&f, &sp[0], true);
    bool adv;
    TS_OK(tdit_mix_step(fresh, &r0, 1, f.c, f.s, NULL, &adv));
    TS_OK(tdit_mix_read(fresh, f.s, want, B * NL));
    /* a batch whose rows 1 and 2 held two requests for two steps */
    tdit_mix_t *used = tdit_mix_new(f.m, f.s, &sh, sde, B);
    TS_NEW(used);
    tdit_req_t *full[B] = { start(&f, &sp[3], true), start(&f, &sp[1], true), start(&f, &sp[2], true) };
    for (int i = 0; i < 2; i++) TS_OK(tdit_mix_step(used, full, B, f.c, f.s, NULL, &adv));
    tdit_req_t *twin = start(&f, &sp[0], true);
    TS_OK(tdit_mix_step(used, &twin, 1, f.c, f.s, NULL, &adv));
    TS_OK(tdit_mix_read(used, f.s, got, B * NL));
    for (int b = 0; b < B; b++)
        ck_assert_msg(!memcmp(got + b * NL, want + b * NL, NL * sizeof(float)),
                      "row %d of a batch whose padding requests left differs from a fresh batch's", b);
    ck_assert_int_eq(tdit_req_stats(twin)->padded_rows, B - 1);
    size_t n_bad = 1;
    ck_assert_int_eq(tdit_mix_read(used, f.s, got, n_bad), -1); /* not the batch's size */
    for (int k = 0; k < B; k++) tdit_req_destroy(&full[k]);
    tdit_req_destroy(&twin);
    tdit_req_destroy(&r0);
    tdit_mix_destroy(&used);
    tdit_mix_destroy(&fresh);
    fx_close(&f);
}
END_TEST

START_TEST(test_mixes_refuse_what_they_cannot_run_and_leave_the_requests_as_they_were) {
    fx_t f;
    fx_open(&f);
    tdit_shape_t sh = one(false), grp = one(false), ms = one(false), other = one(false), mix = one(false);
    grp.batch = 2;
    ms.solver = TDIT_SOLVER_UNIPC;
    other.height = 4;
    mix.batch = 2;
    mix.mixed = true;
    ck_assert_ptr_null(tdit_mix_new(f.m, f.s, &grp, false, 2));
    ck_assert_ptr_null(tdit_mix_new(f.m, f.s, &ms, false, 2));
    ck_assert_ptr_null(tdit_mix_new(f.m, f.s, &mix, false, 2));
    ck_assert_ptr_null(tdit_mix_new(f.m, f.s, &sh, false, 1));
    ck_assert_ptr_null(tdit_mix_new(f.m, f.s, &sh, false, TDIT_MAX_BATCH + 1));
    tdit_mix_t *mx = tdit_mix_new(f.m, f.s, &sh, false, 2);
    TS_NEW(mx);
    spec_t sp;
    spec(&sp, 1, false, 5);
    sp.p.steps = 2;
    tdit_req_t *r = start(&f, &sp, false), *r2 = start(&f, &sp, false);
    tdit_loop_t sde = sp.p;
    sde.sde = true;
    sde.eta = 0.5f;
    tdit_req_t *rs = tdit_req_new(f.m, f.s, &sh, &sde, NULL, sp.ctx, NULL);
    tdit_req_t *ro = tdit_req_new(f.m, f.s, &other, &sp.p, NULL, sp.ctx, NULL);
    tdit_loop_t two = sp.p;
    tdit_req_t *rg = tdit_req_new_group(f.m, f.s, NULL, &grp, &two, NULL, NULL, sp.ctx, NULL);
    TS_NEW(rs);
    TS_NEW(ro);
    TS_NEW(rg);
    ck_assert(tdit_mix_fits(mx, r));
    ck_assert(!tdit_mix_fits(mx, rs));
    ck_assert(!tdit_mix_fits(mx, ro));
    ck_assert(!tdit_mix_fits(mx, rg));
    ck_assert(!tdit_req_mixable(rg));
    ck_assert(tdit_req_same_class(r, r2));
    ck_assert(!tdit_req_same_class(r, rs));
    ck_assert(!tdit_req_same_class(r, ro));
    bool adv = true;
    tdit_req_t *bad[][3] = { { r, rs }, { r, ro }, { rg, r }, { r, r }, { r, r2, r2 } };
    int nbad[] = { 2, 2, 2, 2, 3 };
    for (size_t i = 0; i < sizeof nbad / sizeof nbad[0]; i++) {
        adv = true;
        ck_assert_int_eq(tdit_mix_step(mx, bad[i], nbad[i], f.c, f.s, NULL, &adv), -1);
        ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
        ck_assert_msg(!adv, "case %zu: refused, and nothing moved", i);
    }
    ck_assert_int_eq(tdit_req_steps_done(r), 0);
    ck_assert_int_eq(tdit_req_steps_done(r2), 0);
    /* a request that is done is refused too */
    tdit_req_t *pair[2] = { r, r2 };
    TS_OK(tdit_mix_step(mx, pair, 2, f.c, f.s, NULL, &adv));
    TS_OK(tdit_mix_step(mx, pair, 2, f.c, f.s, NULL, &adv));
    ck_assert(tdit_req_done(r));
    ck_assert_int_eq(tdit_mix_step(mx, pair, 2, f.c, f.s, NULL, &adv), -1);
    ck_assert(!adv);
    ck_assert_int_eq(tdit_mix_step(mx, pair, 0, f.c, f.s, NULL, &adv), -1);
    tdit_req_destroy(&r);
    tdit_req_destroy(&r2);
    tdit_req_destroy(&rs);
    tdit_req_destroy(&ro);
    tdit_req_destroy(&rg);
    tdit_mix_destroy(&mx);
    fx_close(&f);
}
END_TEST

/* The capture key of a mixed batch: its own (not a group's of B, nor one
 * of another size), and the program reads the same shape back from it. */
START_TEST(test_a_mixed_key_differs_from_a_group_key_and_refuses_multistep) {
    fx_t f;
    fx_open(&f);
    tdit_shape_t g = one(true), m = one(true), m3 = one(true), ms = one(true);
    g.batch = m.batch = 2;
    m.mixed = true;
    m3.batch = 3;
    m3.mixed = true;
    cap_key_t kg, km, km3, kms;
    TS_OK(tdit_step_key(f.m, &g, false, 1, &kg));
    TS_OK(tdit_step_key(f.m, &m, false, 1, &km));
    TS_OK(tdit_step_key(f.m, &m3, false, 1, &km3));
    ck_assert_uint_ne(cap_key_hash(&kg), cap_key_hash(&km));
    ck_assert_uint_ne(cap_key_hash(&km3), cap_key_hash(&km));
    ms.batch = 2;
    ms.mixed = true;
    ms.solver = TDIT_SOLVER_DPMPP;
    ck_assert_int_eq(tdit_step_key(f.m, &ms, false, 1, &kms), -1);
    ck_assert_int_eq(reel_err_code(), REEL_E_UNSUPPORTED);
    fx_close(&f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("mix_req");
    TCase *tc = tcase_create("mix");
    tcase_add_unchecked_fixture(tc, setup_dir, teardown_dir);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_requests_in_random_mixes_with_joins_and_leaves_are_each_bitwise_alone);
    tcase_add_test(tc, test_a_mixed_step_captures_once_per_batch_size_and_replays_for_new_members);
    tcase_add_test(tc, test_mixes_refuse_what_they_cannot_run_and_leave_the_requests_as_they_were);
    tcase_add_loop_test(tc, test_padded_rows_hold_zeros_not_what_requests_that_left_put_there, 0, 2);
    tcase_add_loop_test(tc, test_a_sync_between_mixed_steps_is_bitwise_the_requests_alone_across_it, 0, 4);
    tcase_add_test(tc, test_a_mixed_key_differs_from_a_group_key_and_refuses_multistep);
    tcase_add_test(tc, test_sde_on_the_unipc_grid_in_random_mixes_and_across_a_sync_is_each_bitwise_alone);
    suite_add_tcase(s, tc);
    return ts_run(s);
}
