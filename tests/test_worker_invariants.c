/* test_worker_invariants.c -- the worker's invariant checkers
 * (worker/wrk_exec_state.h, worker/wrk_fetch_state.h): a sound state
 * passes, and each invariant, broken on purpose, is the one named. The
 * states are built by hand (no model, no threads but the executor test's
 * paused stream). The Makefile links the worker's objects, all but main. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include "base/error.h"
#include "worker/wrk_exec_state.h"
#include "worker/wrk_fetch_state.h"
#include "tests/support.h"

/* ck_assert that call fails naming `what`. */
#define ASSERT_NAMES(call, what)                                                                 \
    do {                                                                                         \
        reel_err_clear();                                                                      \
        ck_assert_int_eq((call), -1);                                                            \
        ck_assert_msg(strstr(reel_err_text(), (what)) != NULL, "expected '%s' in '%s'", (what),   \
                      reel_err_text());                                                             \
    } while (0)

static wrk_job_t job(uint64_t id, int n) {
    wrk_job_t j;
    memset(&j, 0, sizeof j);
    j.id = id;
    j.n = n;
    return j;
}

/* ---- jobs and groups --------------------------------------------------------- */

START_TEST(test_a_sound_job_passes_and_each_broken_job_rule_is_named) {
    wrk_job_t j = job(1, 4);
    j.chunk = 2;
    j.at = 2;
    ck_assert_int_eq(wrk_job_invariants(&j), 0);
    j.at = 5;
    ASSERT_NAMES(wrk_job_invariants(&j), "sub-batch starts at sample 5 of 4");
    j.at = 0;
    j.chunk = 8;
    ASSERT_NAMES(wrk_job_invariants(&j), "batches of 8 samples in a job of 4");
    j.chunk = 2;
    j.req = (tdit_req_t *)&j; /* never dereferenced */
    ASSERT_NAMES(wrk_job_invariants(&j), "running but not counted");
    j.counted = true;
    ck_assert_int_eq(wrk_job_invariants(&j), 0);
    j.req = NULL;
    j.n = 0;
    ASSERT_NAMES(wrk_job_invariants(&j), "0 samples");
}
END_TEST

START_TEST(test_a_part_outside_its_groups_samples_is_named) {
    wrk_group_t g;
    memset(&g, 0, sizeof g);
    g.parts = g.parts_left = 2;
    g.n = 4;
    wrk_job_t j = job(2, 2);
    j.group = &g;
    j.base = 2;
    ck_assert_int_eq(wrk_job_invariants(&j), 0);
    j.base = 3;
    ASSERT_NAMES(wrk_job_invariants(&j), "a part holding samples 3..4 of a group of 4");
}
END_TEST

START_TEST(test_group_counts_that_do_not_add_up_are_named) {
    wrk_group_t g;
    memset(&g, 0, sizeof g);
    g.parts = 3;
    g.parts_left = 1;
    g.parts_ok = 2;
    g.progress_done = 5;
    g.progress_total = 10;
    ck_assert_int_eq(wrk_group_invariants(&g), 0);
    g.parts_left = 4;
    ASSERT_NAMES(wrk_group_invariants(&g), "4 parts left of 3");
    g.parts_left = 2;
    ASSERT_NAMES(wrk_group_invariants(&g), "2 parts ran well, but 1 of 3 finished");
    g.parts_left = 1;
    g.progress_done = 11;
    ASSERT_NAMES(wrk_group_invariants(&g), "progress 11 of 10");
}
END_TEST

/* ---- a stream ----------------------------------------------------------------- */

/* Two active jobs, the first in pool slot 0, the second in a set of its
 * own; slot 1 idle. */
typedef struct {
    wrk_stream_t st;
    wrk_job_t a, b;
    char sets[3];                /* their addresses stand for staging sets */
} stream_fixture_t;

static void stream_fixture(stream_fixture_t *f) {
    memset(f, 0, sizeof *f);
    f->a = job(10, 1);
    f->b = job(11, 1);
    f->a.next = &f->b;
    f->a.stg = (tdit_staging_t *)&f->sets[0];
    f->b.stg = (tdit_staging_t *)&f->sets[2];
    f->st.active = &f->a;
    f->st.nactive = 2;
    f->st.npool = 2;
    f->st.pool[0] = (tdit_staging_t *)&f->sets[0];
    f->st.pool[1] = (tdit_staging_t *)&f->sets[1];
    f->st.busy[0] = true;
    f->st.used[0] = 2;
    f->st.used[1] = 1;
    f->st.clock = 2;
    atomic_init(&f->st.load, 3);
}

START_TEST(test_a_sound_stream_passes) {
    stream_fixture_t f;
    stream_fixture(&f);
    ck_assert_int_eq(wrk_stream_invariants(&f.st, 1), 0);
    ck_assert_int_eq(wrk_stream_invariants(&f.st, 0), 0); /* load counts a job on its way in too */
}
END_TEST

START_TEST(test_an_active_count_that_is_not_the_rounds_length_is_named) {
    stream_fixture_t f;
    stream_fixture(&f);
    f.st.nactive = 3;
    ASSERT_NAMES(wrk_stream_invariants(&f.st, 0), "2 jobs in the round, nactive says 3");
}
END_TEST

START_TEST(test_a_load_below_the_jobs_it_counts_is_named) {
    stream_fixture_t f;
    stream_fixture(&f);
    ASSERT_NAMES(wrk_stream_invariants(&f.st, 2), "load 3, but 2 jobs active and 2 queued");
}
END_TEST

START_TEST(test_a_staging_set_in_use_but_not_busy_is_named) {
    stream_fixture_t f;
    stream_fixture(&f);
    f.st.busy[0] = false;
    ASSERT_NAMES(wrk_stream_invariants(&f.st, 0), "runs in staging set 0, which is not marked busy");
}
END_TEST

START_TEST(test_a_busy_staging_set_no_job_runs_in_is_named) {
    stream_fixture_t f;
    stream_fixture(&f);
    f.st.busy[1] = true;
    ASSERT_NAMES(wrk_stream_invariants(&f.st, 0), "staging set 1 is marked busy but no active job runs in it");
}
END_TEST

START_TEST(test_two_jobs_sharing_a_staging_set_is_named) {
    stream_fixture_t f;
    stream_fixture(&f);
    f.b.stg = f.a.stg;
    ASSERT_NAMES(wrk_stream_invariants(&f.st, 0), "jobs 10 and 11 share a staging set");
}
END_TEST

START_TEST(test_a_broken_job_in_the_round_fails_the_stream) {
    stream_fixture_t f;
    stream_fixture(&f);
    f.b.at = 2;
    ASSERT_NAMES(wrk_stream_invariants(&f.st, 0), "job 11: its sub-batch starts at sample 2 of 1");
}
END_TEST

START_TEST(test_a_staging_set_taken_after_the_clock_is_named) {
    stream_fixture_t f;
    stream_fixture(&f);
    f.st.used[1] = 9;
    ASSERT_NAMES(wrk_stream_invariants(&f.st, 0), "staging set 1 taken after the clock");
}
END_TEST

/* ---- the whole executor, its stream thread paused ------------------------------ */

static atomic_int held_ran; /* items the test stream ran */

static void hold_run(void *user, void *item) {
    (void)user;
    (void)item;
    atomic_fetch_add(&held_ran, 1);
}

/* One stream whose thread never starts an item: the test pauses it for
 * the check, and the queued job stays queued. */
typedef struct {
    wrk_opts_t opt;
    wrk_t w;
    wrk_exec_t x;
    stream_fixture_t f;
    wrk_group_t g;
    wrk_job_t queued, part;
} exec_fixture_t;

static void exec_fixture(exec_fixture_t *e) {
    memset(e, 0, sizeof *e);
    e->w.opt = &e->opt;
    atomic_init(&e->w.running, 0);
    e->x.w = &e->w;
    e->x.n = 1;
    stream_fixture(&e->f);
    e->x.s = &e->f.st;
    e->f.st.x = &e->x;
    /* a: a single request running; b: a part of a started group of two,
     * whose other part is queued. */
    e->f.a.counted = true;
    e->f.a.req = (tdit_req_t *)&e->f.a;
    pthread_mutex_init(&e->g.mu, NULL);
    e->g.parts = e->g.parts_left = 2;
    e->g.n = 2;
    e->g.started = true;
    e->f.b.group = &e->g;
    e->f.b.counted = true;
    e->queued = job(12, 1);
    e->queued.group = &e->g;
    e->queued.base = 1;
    atomic_store(&e->w.running, 1 + 2);
    atomic_store(&held_ran, 0);
    reel_thread_opts_t o = { .name = "held", .run = hold_run };
    e->f.st.th = reel_thread_start(&o);
    ck_assert_ptr_nonnull(e->f.st.th);
    reel_thread_pause(e->f.st.th); /* between items from here on: the post only queues */
    ck_assert_int_eq(reel_thread_post(e->f.st.th, &e->queued), 0);
    atomic_store(&e->f.st.load, 3);
}

static void exec_fixture_done(exec_fixture_t *e) {
    ck_assert_int_eq(atomic_load(&held_ran), 0); /* the check saw the job queued, and left it there */
    reel_thread_resume(e->f.st.th); /* the check paused and resumed it again, nested in ours */
    reel_thread_stop(&e->f.st.th, REEL_THREAD_DISCARD); /* the queued job may run now: hold_run only counts */
    pthread_mutex_destroy(&e->g.mu);
}

/* The checker pauses the stream itself; ours holds it already. */
START_TEST(test_a_sound_executor_passes_with_its_stream_paused) {
    exec_fixture_t e;
    exec_fixture(&e);
    int rc = wrk_exec_invariants(&e.x);
    TS_OK(rc);
    exec_fixture_done(&e);
}
END_TEST

START_TEST(test_a_load_other_than_active_plus_queued_is_named) {
    exec_fixture_t e;
    exec_fixture(&e);
    atomic_store(&e.f.st.load, 4);
    ASSERT_NAMES(wrk_exec_invariants(&e.x), "stream 0: load 4, but 2 jobs active and 1 queued");
    exec_fixture_done(&e);
}
END_TEST

START_TEST(test_a_running_count_other_than_what_runs_is_named) {
    exec_fixture_t e;
    exec_fixture(&e);
    atomic_store(&e.w.running, 2);
    ASSERT_NAMES(wrk_exec_invariants(&e.x), "running is 2, but 3 requests");
    exec_fixture_done(&e);
}
END_TEST

START_TEST(test_a_group_whose_parts_left_are_not_its_live_parts_is_named) {
    exec_fixture_t e;
    exec_fixture(&e);
    e.g.parts = 3;
    e.g.parts_left = 3;
    ASSERT_NAMES(wrk_exec_invariants(&e.x), "a group has 3 parts left, but 2 are on the streams");
    exec_fixture_done(&e);
}
END_TEST

START_TEST(test_a_queued_job_that_already_started_is_named) {
    exec_fixture_t e;
    exec_fixture(&e);
    e.queued.counted = true;
    ASSERT_NAMES(wrk_exec_invariants(&e.x), "stream 0: a queued job has started");
    exec_fixture_done(&e);
}
END_TEST

/* ---- a fetch -------------------------------------------------------------------- */

/* 10 chunks of a file, 3 in: 8 bytes of length, a 100-byte header. */
typedef struct {
    wrk_fetch_t f;
    wrk_fetch_mem_t m;
    char hdr[100];
    unsigned char data[16];
    uint64_t done;
} fetch_fixture_t;

static void fetch_fixture(fetch_fixture_t *x) {
    memset(x, 0, sizeof *x);
    x->f.size = 10 * (uint64_t)MSG_CHUNK_MAX;
    x->done = 3 * (uint64_t)MSG_CHUNK_MAX;
    x->f.asked = x->done + WRK_FETCH_WINDOW * (uint64_t)MSG_CHUNK_MAX;
    x->m.hdr = x->hdr;
    x->m.data = x->data; /* never written: the checker reads sizes only */
    x->m.hlen = 100;
    x->m.dlen = x->f.size - 8 - 100;
    x->m.cap = (size_t)x->m.dlen;
}

START_TEST(test_a_sound_fetch_passes_before_and_after_its_header_came) {
    fetch_fixture_t x;
    fetch_fixture(&x);
    ck_assert_int_eq(wrk_fetch_invariants(&x.f, &x.m, x.done), 0);
    wrk_fetch_t f = { .size = UINT64_MAX, .asked = WRK_FETCH_WINDOW * (uint64_t)MSG_CHUNK_MAX };
    wrk_fetch_mem_t m;
    memset(&m, 0, sizeof m);
    ck_assert_int_eq(wrk_fetch_invariants(&f, &m, 0), 0); /* nothing came yet */
}
END_TEST

START_TEST(test_each_broken_fetch_rule_is_named) {
    fetch_fixture_t x;
    fetch_fixture(&x);
    ASSERT_NAMES(wrk_fetch_invariants(&x.f, &x.m, x.f.size + 1), "came of a");
    fetch_fixture(&x);
    x.f.asked = x.done - 1;
    ASSERT_NAMES(wrk_fetch_invariants(&x.f, &x.m, x.done), "behind the");
    fetch_fixture(&x);
    x.f.asked += 1;
    ASSERT_NAMES(wrk_fetch_invariants(&x.f, &x.m, x.done), "more than 4 chunks");
    fetch_fixture(&x);
    x.f.asked = 4;
    ASSERT_NAMES(wrk_fetch_invariants(&x.f, &x.m, 4), "buffers before the header's length came");
    fetch_fixture(&x);
    x.m.data = NULL;
    ASSERT_NAMES(wrk_fetch_invariants(&x.f, &x.m, x.done), "a buffer is missing");
    fetch_fixture(&x);
    x.m.hlen = 99;
    ASSERT_NAMES(wrk_fetch_invariants(&x.f, &x.m, x.done), "is not the file's size");
    fetch_fixture(&x);
    x.m.cap = (size_t)x.m.dlen - 1;
    ASSERT_NAMES(wrk_fetch_invariants(&x.f, &x.m, x.done), "-byte buffer for");
}
END_TEST

int main(void) {
    Suite *s = suite_create("worker_invariants");
    TCase *t = tcase_create("exec");
    tcase_add_test(t, test_a_sound_job_passes_and_each_broken_job_rule_is_named);
    tcase_add_test(t, test_a_part_outside_its_groups_samples_is_named);
    tcase_add_test(t, test_group_counts_that_do_not_add_up_are_named);
    tcase_add_test(t, test_a_sound_stream_passes);
    tcase_add_test(t, test_an_active_count_that_is_not_the_rounds_length_is_named);
    tcase_add_test(t, test_a_load_below_the_jobs_it_counts_is_named);
    tcase_add_test(t, test_a_staging_set_in_use_but_not_busy_is_named);
    tcase_add_test(t, test_a_busy_staging_set_no_job_runs_in_is_named);
    tcase_add_test(t, test_two_jobs_sharing_a_staging_set_is_named);
    tcase_add_test(t, test_a_broken_job_in_the_round_fails_the_stream);
    tcase_add_test(t, test_a_staging_set_taken_after_the_clock_is_named);
    tcase_add_test(t, test_a_sound_executor_passes_with_its_stream_paused);
    tcase_add_test(t, test_a_load_other_than_active_plus_queued_is_named);
    tcase_add_test(t, test_a_running_count_other_than_what_runs_is_named);
    tcase_add_test(t, test_a_group_whose_parts_left_are_not_its_live_parts_is_named);
    tcase_add_test(t, test_a_queued_job_that_already_started_is_named);
    suite_add_tcase(s, t);
    TCase *f = tcase_create("fetch");
    tcase_add_test(f, test_a_sound_fetch_passes_before_and_after_its_header_came);
    tcase_add_test(f, test_each_broken_fetch_rule_is_named);
    suite_add_tcase(s, f);
    return ts_run(s);
}
