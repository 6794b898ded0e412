/* test_thread.c -- base/thread.h: items run in posting order, a pause holds
 * the thread between items until resumed, a stop drains or discards what
 * is queued, many posters lose nothing, idle is called again on a wake,
 * quiet posts run at the next wake, and lock owners are known. Every wait here waits for the event it needs
 * (a condition variable, or the thread's own state); no sleeps. */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "base/error.h"
#include "base/thread.h"
#include "tests/support.h"

/* What the callbacks saw. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ran[20000];              /* the items, in the order run took them */
    int nran, ndiscarded, idle_calls;
    atomic_bool in_run, held;    /* held: the test says the thread is paused now */
    atomic_int violations;       /* run while held */
    bool gate_open;              /* item GATED waits for it */
    bool started;                /* item GATED is in run */
} seen_t;

#define GATED (-1)

static void seen_init(seen_t *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
}

static void seen_fini(seen_t *s) {
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

static void *item_of(int v) { return (void *)(intptr_t)v; }

static void run_item(void *user, void *item) {
    seen_t *s = user;
    int v = (int)(intptr_t)item;
    atomic_store(&s->in_run, true);
    if (atomic_load(&s->held)) atomic_fetch_add(&s->violations, 1);
    pthread_mutex_lock(&s->mu);
    if (v == GATED) {
        s->started = true;
        pthread_cond_broadcast(&s->cv);
        while (!s->gate_open) pthread_cond_wait(&s->cv, &s->mu);
    }
    s->ran[s->nran++] = v;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    atomic_store(&s->in_run, false);
}

static void discard_item(void *user, void *item) {
    (void)item;
    seen_t *s = user;
    pthread_mutex_lock(&s->mu);
    s->ndiscarded++;
    pthread_mutex_unlock(&s->mu);
}

static int64_t idle_count(void *user) {
    seen_t *s = user;
    pthread_mutex_lock(&s->mu);
    s->idle_calls++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return -1; /* until a post or a wake */
}

static reel_thread_t *start(seen_t *s, bool with_idle) {
    reel_thread_opts_t o = { .name = "test", .user = s, .run = run_item, .discard = discard_item,
                             .idle = with_idle ? idle_count : NULL, .block_signals = true };
    reel_thread_t *t = reel_thread_start(&o);
    TS_NEW(t);
    return t;
}

static void wait_started(seen_t *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->started) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void open_gate(seen_t *s) {
    pthread_mutex_lock(&s->mu);
    s->gate_open = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void wait_ran(seen_t *s, int n) {
    pthread_mutex_lock(&s->mu);
    while (s->nran < n) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

START_TEST(test_items_run_in_the_order_they_were_posted) {
    seen_t s;
    seen_init(&s);
    reel_thread_t *t = start(&s, false);
    for (int i = 0; i < 1000; i++) ck_assert_int_eq(reel_thread_post(t, item_of(i)), 0);
    reel_thread_stop(&t, REEL_THREAD_DRAIN);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(s.nran, 1000);
    for (int i = 0; i < 1000; i++) ck_assert_int_eq(s.ran[i], i);
    ck_assert_int_eq(s.ndiscarded, 0);
    seen_fini(&s);
}
END_TEST

typedef struct {
    reel_thread_t *t;
    seen_t *s;
    atomic_bool returned;
    bool in_run_at_return;
} pauser_t;

static void *pause_main(void *arg) {
    pauser_t *p = arg;
    reel_thread_pause(p->t);
    p->in_run_at_return = atomic_load(&p->s->in_run);
    atomic_store(&p->returned, true);
    return NULL;
}

static void see_each(void *arg, void *item) {
    int *next = arg;
    ck_assert_int_eq((int)(intptr_t)item, *next);
    (*next)++;
}

START_TEST(test_pause_waits_for_the_item_in_progress_and_holds_the_thread_until_resume) {
    seen_t s;
    seen_init(&s);
    reel_thread_t *t = start(&s, false);
    ck_assert_int_eq(reel_thread_post(t, item_of(GATED)), 0);
    wait_started(&s);
    /* The item is inside run: a pause must wait for it to return. */
    pauser_t p = { t, &s, false, false };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, pause_main, &p), 0);
    ck_assert(!atomic_load(&p.returned)); /* run cannot have returned: the gate is shut */
    open_gate(&s);
    pthread_join(th, NULL);
    ck_assert(!p.in_run_at_return);
    ck_assert_int_eq(s.nran, 1);
    /* Held: what is posted now queues, and nothing runs until resume. */
    atomic_store(&s.held, true);
    for (int i = 0; i < 100; i++) {
        ck_assert_int_eq(reel_thread_post(t, item_of(i)), 0);
        sched_yield();
    }
    ck_assert_uint_eq(reel_thread_backlog(t), 100);
    int next = 0;
    reel_thread_each(t, see_each, &next); /* the queue, oldest first */
    ck_assert_int_eq(next, 100);
    pthread_mutex_lock(&s.mu);
    ck_assert_int_eq(s.nran, 1);
    pthread_mutex_unlock(&s.mu);
    atomic_store(&s.held, false);
    reel_thread_resume(t);
    wait_ran(&s, 101);
    ck_assert_int_eq(atomic_load(&s.violations), 0);
    for (int i = 0; i < 100; i++) ck_assert_int_eq(s.ran[i + 1], i);
    reel_thread_stop(&t, REEL_THREAD_DRAIN);
    seen_fini(&s);
}
END_TEST

START_TEST(test_pauses_nest_and_the_thread_goes_on_after_the_last_resume) {
    seen_t s;
    seen_init(&s);
    reel_thread_t *t = start(&s, false);
    reel_thread_pause(t);
    reel_thread_pause(t);
    atomic_store(&s.held, true);
    ck_assert_int_eq(reel_thread_post(t, item_of(7)), 0);
    reel_thread_resume(t); /* one pause still holds it */
    for (int i = 0; i < 100; i++) sched_yield();
    ck_assert_uint_eq(reel_thread_backlog(t), 1);
    atomic_store(&s.held, false);
    reel_thread_resume(t);
    wait_ran(&s, 1);
    ck_assert_int_eq(atomic_load(&s.violations), 0);
    /* run has recorded the item but may not have returned yet: a pause
     * waits until the thread is between items, where it is counted done */
    reel_thread_pause(t);
    ck_assert_uint_eq(reel_thread_backlog(t), 0);
    reel_thread_resume(t);
    reel_thread_stop(&t, REEL_THREAD_DRAIN);
    seen_fini(&s);
}
END_TEST

typedef struct {
    reel_thread_t **t;
    reel_thread_stop_t how;
} stopper_t;

static void *stop_main(void *arg) {
    stopper_t *st = arg;
    reel_thread_stop(st->t, st->how);
    return NULL;
}

/* Stops from another thread while the gated item runs with 9 queued
 * behind it; the stop is seen before the gate opens. */
static void stop_with_pending(seen_t *s, reel_thread_stop_t how) {
    reel_thread_t *t = start(s, false);
    reel_thread_t *keep = t;
    ck_assert_int_eq(reel_thread_post(t, item_of(GATED)), 0);
    wait_started(s);
    for (int i = 1; i <= 9; i++) ck_assert_int_eq(reel_thread_post(t, item_of(i)), 0);
    stopper_t st = { &t, how };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, stop_main, &st), 0);
    while (!reel_thread_stopping(keep)) sched_yield(); /* the join waits for the gate: keep lives */
    /* A post once the stop began is refused, and its item discarded. */
    ck_assert_int_eq(reel_thread_post(keep, item_of(99)), -1);
    open_gate(s);
    pthread_join(th, NULL);
    ck_assert_ptr_null(t);
}

START_TEST(test_a_discarding_stop_ends_after_the_item_in_progress_and_discards_the_queued_ones) {
    seen_t s;
    seen_init(&s);
    stop_with_pending(&s, REEL_THREAD_DISCARD);
    ck_assert_int_eq(s.nran, 1);
    ck_assert_int_eq(s.ran[0], GATED);
    ck_assert_int_eq(s.ndiscarded, 10); /* 9 queued + the refused post */
    seen_fini(&s);
}
END_TEST

START_TEST(test_a_draining_stop_runs_every_queued_item_first) {
    seen_t s;
    seen_init(&s);
    stop_with_pending(&s, REEL_THREAD_DRAIN);
    ck_assert_int_eq(s.nran, 10);
    for (int i = 1; i <= 9; i++) ck_assert_int_eq(s.ran[i], i);
    ck_assert_int_eq(s.ndiscarded, 1); /* the refused post */
    seen_fini(&s);
}
END_TEST

#define POSTERS 8
#define PER_POSTER 2000

typedef struct {
    reel_thread_t *t;
    int who;
} poster_t;

static void *post_main(void *arg) {
    poster_t *p = arg;
    for (int i = 0; i < PER_POSTER; i++) ck_assert_int_eq(reel_thread_post(p->t, item_of(p->who * PER_POSTER + i)), 0);
    return NULL;
}

START_TEST(test_many_posters_lose_nothing_and_each_posters_items_keep_their_order) {
    seen_t s;
    seen_init(&s);
    reel_thread_t *t = start(&s, false);
    pthread_t th[POSTERS];
    poster_t p[POSTERS];
    for (int i = 0; i < POSTERS; i++) {
        p[i] = (poster_t){ t, i };
        ck_assert_int_eq(pthread_create(&th[i], NULL, post_main, &p[i]), 0);
    }
    for (int i = 0; i < POSTERS; i++) pthread_join(th[i], NULL);
    reel_thread_stop(&t, REEL_THREAD_DRAIN);
    ck_assert_int_eq(s.nran, POSTERS * PER_POSTER);
    int last[POSTERS];
    for (int i = 0; i < POSTERS; i++) last[i] = -1;
    for (int k = 0; k < s.nran; k++) {
        int who = s.ran[k] / PER_POSTER, seq = s.ran[k] % PER_POSTER;
        ck_assert_int_eq(seq, last[who] + 1);
        last[who] = seq;
    }
    seen_fini(&s);
}
END_TEST

START_TEST(test_idle_runs_at_start_after_items_and_on_a_wake_but_not_by_itself) {
    seen_t s;
    seen_init(&s);
    reel_thread_t *t = start(&s, true);
    pthread_mutex_lock(&s.mu);
    while (s.idle_calls < 1) pthread_cond_wait(&s.cv, &s.mu); /* at start */
    pthread_mutex_unlock(&s.mu);
    ck_assert_int_eq(reel_thread_post(t, item_of(1)), 0);
    pthread_mutex_lock(&s.mu);
    while (s.idle_calls < 2) pthread_cond_wait(&s.cv, &s.mu); /* after the item */
    ck_assert_int_eq(s.nran, 1);
    pthread_mutex_unlock(&s.mu);
    reel_thread_wake(t);
    pthread_mutex_lock(&s.mu);
    while (s.idle_calls < 3) pthread_cond_wait(&s.cv, &s.mu); /* on the wake */
    pthread_mutex_unlock(&s.mu);
    /* idle asked to wait for a post: paused, the thread is between calls
     * and the count cannot move. */
    reel_thread_pause(t);
    pthread_mutex_lock(&s.mu);
    ck_assert_int_eq(s.idle_calls, 3);
    pthread_mutex_unlock(&s.mu);
    reel_thread_resume(t);
    reel_thread_stop(&t, REEL_THREAD_DISCARD);
    ck_assert_int_eq(s.idle_calls, 3);
    seen_fini(&s);
}
END_TEST

/* A quiet post does not wake the thread; its items wait for the next wake
 * (here reel_thread_wake, then a post) and run in posting order, with the
 * posts around them; a draining stop runs the ones no wake reached. */
START_TEST(test_quiet_posts_run_in_order_at_the_next_wake_and_a_draining_stop_runs_them) {
    seen_t s;
    seen_init(&s);
    reel_thread_t *t = start(&s, true);
    for (int i = 0; i < 100; i++) ck_assert_int_eq(reel_thread_post_quiet(t, item_of(i)), 0);
    reel_thread_wake(t);
    wait_ran(&s, 100);
    for (int i = 100; i < 199; i++) ck_assert_int_eq(reel_thread_post_quiet(t, item_of(i)), 0);
    ck_assert_int_eq(reel_thread_post(t, item_of(199)), 0);
    wait_ran(&s, 200);
    for (int i = 200; i < 300; i++) ck_assert_int_eq(reel_thread_post_quiet(t, item_of(i)), 0);
    reel_thread_stop(&t, REEL_THREAD_DRAIN);
    ck_assert_int_eq(s.nran, 300);
    for (int i = 0; i < 300; i++) ck_assert_int_eq(s.ran[i], i);
    ck_assert_int_eq(s.ndiscarded, 0);
    seen_fini(&s);
}
END_TEST

static int64_t idle_again(void *user) {
    seen_t *s = user;
    pthread_mutex_lock(&s->mu);
    int n = ++s->idle_calls;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return n < 5 ? 0 : n < 7 ? 1 : -1; /* at once, then after 1 ms, then only on a post */
}

START_TEST(test_idle_is_called_again_when_it_asks_for_it_at_once_or_after_a_while) {
    seen_t s;
    seen_init(&s);
    reel_thread_opts_t o = { .name = "idle", .user = &s, .run = run_item, .idle = idle_again };
    reel_thread_t *t = reel_thread_start(&o);
    ck_assert_ptr_nonnull(t);
    pthread_mutex_lock(&s.mu);
    while (s.idle_calls < 7) pthread_cond_wait(&s.cv, &s.mu);
    pthread_mutex_unlock(&s.mu);
    reel_thread_stop(&t, REEL_THREAD_DISCARD);
    ck_assert_int_eq(s.idle_calls, 7);
    seen_fini(&s);
}
END_TEST

START_TEST(test_stopping_a_null_thread_does_nothing) {
    reel_thread_t *t = NULL;
    reel_thread_stop(&t, REEL_THREAD_DRAIN);
    reel_thread_stop(NULL, REEL_THREAD_DISCARD);
    ck_assert_ptr_null(t);
}
END_TEST

typedef struct {
    reel_owner_t *o;
    bool mine;
} other_t;

static void *other_main(void *arg) {
    other_t *x = arg;
    x->mine = reel_owner_mine(x->o);
    return NULL;
}

START_TEST(test_a_lock_owner_is_the_thread_that_set_it_and_nobody_after_clear) {
    reel_owner_t o = { 0 };
    ck_assert(!reel_owner_mine(&o));
    reel_owner_set(&o);
    ck_assert(reel_owner_mine(&o));
    other_t x = { &o, true };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, other_main, &x), 0);
    pthread_join(th, NULL);
    ck_assert(!x.mine);
    reel_owner_clear(&o);
    ck_assert(!reel_owner_mine(&o));
}
END_TEST

int main(void) {
    Suite *s = suite_create("thread");
    TCase *t = tcase_create("thread");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_items_run_in_the_order_they_were_posted);
    tcase_add_test(t, test_pause_waits_for_the_item_in_progress_and_holds_the_thread_until_resume);
    tcase_add_test(t, test_pauses_nest_and_the_thread_goes_on_after_the_last_resume);
    tcase_add_test(t, test_a_discarding_stop_ends_after_the_item_in_progress_and_discards_the_queued_ones);
    tcase_add_test(t, test_a_draining_stop_runs_every_queued_item_first);
    tcase_add_test(t, test_many_posters_lose_nothing_and_each_posters_items_keep_their_order);
    tcase_add_test(t, test_idle_runs_at_start_after_items_and_on_a_wake_but_not_by_itself);
    tcase_add_test(t, test_idle_is_called_again_when_it_asks_for_it_at_once_or_after_a_while);
    tcase_add_test(t, test_quiet_posts_run_in_order_at_the_next_wake_and_a_draining_stop_runs_them);
    tcase_add_test(t, test_stopping_a_null_thread_does_nothing);
    tcase_add_test(t, test_a_lock_owner_is_the_thread_that_set_it_and_nobody_after_clear);
    suite_add_tcase(s, t);
    return ts_run(s);
}
