/* test_backend_threads.c -- the device lock and stream rules of
 * kernels/backend.h, on the CPU backend (which follows the same rules as
 * CUDA so they are tested here): a capture holds the device lock shared,
 * allocation, free, stream creation and graph destruction hold it
 * exclusive, a capturing thread cannot allocate and its frees are deferred,
 * a graph replays only on the stream that captured it, and a request
 * creates no stream of its own. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "model/tdit_program.h"
#include "tests/support.h"

static void nap_ms(int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* A few element-wise launches on s over x (n floats), so a capture records
 * something. */
static void launches(kern_stream_t *s, float *x, int64_t n) {
    kern_tensor_t t = kern_tensor_make(x, KERN_F32, KERN_DEVICE_HOST, 1, &n);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(kern_silu(s, &t, &t), 0);
}

START_TEST(test_a_capturing_thread_cannot_allocate_and_its_frees_wait_for_the_capture_end) {
    kern_backend_t *b = kern_backend_cpu_new();
    kern_stream_t *s = kern_stream_new(b);
    float *x = kern_alloc(b, 64 * sizeof(float));
    void *victim = kern_alloc(b, 1 << 20);
    ck_assert_ptr_nonnull(x);
    ck_assert_ptr_nonnull(victim);
    memset(x, 0, 64 * sizeof(float));
    size_t before = kern_bytes_in_use(b);

    ck_assert_int_eq(kern_capture_begin(s), 0);
    ck_assert_int_eq(kern_backend_captures_active(b), 1);
    launches(s, x, 64);
    /* Allocating would invalidate the capture (or deadlock): refused. */
    ck_assert_ptr_null(kern_alloc(b, 128));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "captures a graph"));
    ck_assert_ptr_null(kern_stream_new(b));
    /* Freeing is deferred: the memory is still accounted until the end. */
    kern_free(b, victim);
    ck_assert_uint_eq(kern_bytes_in_use(b), before);
    kern_graph_t *g = NULL;
    TS_OK(kern_capture_end(s, &g));
    ck_assert_int_eq(kern_backend_captures_active(b), 0);
    ck_assert_uint_eq(kern_bytes_in_use(b), before - (1 << 20));
    /* And the thread may allocate again. */
    void *again = kern_alloc(b, 128);
    ck_assert_ptr_nonnull(again);
    kern_free(b, again);
    kern_graph_destroy(&g);
    kern_free(b, x);
    kern_stream_destroy(&s);
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    kern_backend_destroy(&b);
}
END_TEST

/* Thread A captures and dawdles inside the capture; thread B frees while A
 * is capturing. B's free may only return after A's capture ended. */
typedef struct {
    kern_backend_t *b;
    kern_stream_t *s;
    float *x;
    atomic_int capturing, ended;
    int rc;
} cap_thread_t;

static void *capture_slowly(void *arg) {
    cap_thread_t *t = arg;
    if (kern_capture_begin(t->s) != 0) { t->rc = -1; return NULL; }
    atomic_store(&t->capturing, 1);
    int64_t n = 64;
    kern_tensor_t x = kern_tensor_make(t->x, KERN_F32, KERN_DEVICE_HOST, 1, &n);
    for (int i = 0; i < 20; i++) {
        if (kern_silu(t->s, &x, &x) != 0) t->rc = -1;
        nap_ms(5); /* a long capture: any free elsewhere must wait for it */
    }
    atomic_store(&t->ended, 1);
    kern_graph_t *g = NULL;
    if (kern_capture_end(t->s, &g) != 0) t->rc = -1;
    kern_graph_destroy(&g);
    return NULL;
}

START_TEST(test_a_free_on_another_thread_waits_until_the_capture_in_progress_ends) {
    kern_backend_t *b = kern_backend_cpu_new();
    cap_thread_t t = { .b = b, .s = kern_stream_new(b), .x = kern_alloc(b, 64 * sizeof(float)) };
    memset(t.x, 0, 64 * sizeof(float));
    void *victim = kern_alloc(b, 4096);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, capture_slowly, &t), 0);
    while (!atomic_load(&t.capturing)) nap_ms(1);
    kern_free(b, victim);           /* blocks until the capture ends */
    int ended_when_freed = atomic_load(&t.ended);
    void *p = kern_alloc(b, 4096);  /* likewise */
    ck_assert_ptr_nonnull(p);
    kern_free(b, p);
    pthread_join(th, NULL);
    ck_assert_int_eq(t.rc, 0);
    ck_assert_msg(ended_when_freed, "kern_free returned while another thread's capture was in progress");
    kern_free(b, t.x);
    kern_stream_destroy(&t.s);
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    kern_backend_destroy(&b);
}
END_TEST

/* Two threads capture and replay on their own streams while a third
 * allocates, frees and makes streams; the backend asserts inside every
 * exclusive section that no capture is active, and TSan (make tsan) checks
 * the rest. */
typedef struct {
    kern_backend_t *b;
    int rounds;
    int rc;
} stress_t;

static void *stress_capture(void *arg) {
    stress_t *st = arg;
    kern_stream_t *s = kern_stream_new(st->b);
    float *x = kern_alloc(st->b, 256 * sizeof(float));
    if (!s || !x) { st->rc = -1; return NULL; }
    memset(x, 0, 256 * sizeof(float));
    int64_t n = 256;
    kern_tensor_t t = kern_tensor_make(x, KERN_F32, KERN_DEVICE_HOST, 1, &n);
    for (int r = 0; r < st->rounds; r++) {
        kern_graph_t *g = NULL;
        if (kern_capture_begin(s) != 0 || kern_silu(s, &t, &t) != 0 || kern_capture_end(s, &g) != 0 ||
            kern_graph_replay(g, s) != 0)
            st->rc = -1;
        kern_graph_destroy(&g);
    }
    kern_free(st->b, x);
    kern_stream_destroy(&s);
    return NULL;
}

static void *stress_alloc(void *arg) {
    stress_t *st = arg;
    for (int r = 0; r < st->rounds; r++) {
        void *p = kern_alloc(st->b, 1024 + (size_t)r);
        kern_stream_t *s = (r % 8) ? NULL : kern_stream_new(st->b);
        if (!p) st->rc = -1;
        kern_free(st->b, p);
        kern_stream_destroy(&s);
    }
    return NULL;
}

START_TEST(test_two_threads_capturing_while_a_third_allocates_and_frees_never_overlap) {
    kern_backend_t *b = kern_backend_cpu_new();
    stress_t a = { b, 300, 0 }, c = { b, 300, 0 }, f = { b, 600, 0 };
    pthread_t t1, t2, t3;
    ck_assert_int_eq(pthread_create(&t1, NULL, stress_capture, &a), 0);
    ck_assert_int_eq(pthread_create(&t2, NULL, stress_capture, &c), 0);
    ck_assert_int_eq(pthread_create(&t3, NULL, stress_alloc, &f), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    pthread_join(t3, NULL);
    ck_assert_int_eq(a.rc, 0);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_int_eq(f.rc, 0);
    ck_assert_int_eq(kern_backend_captures_active(b), 0);
    ck_assert_uint_eq(kern_backend_streams_alive(b), 0);
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    kern_backend_destroy(&b);
}
END_TEST

START_TEST(test_a_graph_replayed_on_another_stream_is_refused) {
    kern_backend_t *b = kern_backend_cpu_new();
    kern_stream_t *s1 = kern_stream_new(b), *s2 = kern_stream_new(b);
    float *x = kern_alloc(b, 64 * sizeof(float));
    memset(x, 0, 64 * sizeof(float));
    kern_graph_t *g = NULL;
    ck_assert_int_eq(kern_capture_begin(s1), 0);
    launches(s1, x, 64);
    ck_assert_int_eq(kern_capture_end(s1, &g), 0);
    ck_assert_ptr_eq(kern_graph_stream(g), s1);
    ck_assert_int_eq(kern_graph_replay(g, s2), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "other than the one that captured it"));
    ck_assert_uint_eq(kern_graph_replays(g), 0);
    ck_assert_int_eq(kern_graph_replay(g, s1), 0);
    kern_graph_destroy(&g);
    kern_free(b, x);
    kern_stream_destroy(&s1);
    kern_stream_destroy(&s2);
    kern_backend_destroy(&b);
}
END_TEST

START_TEST(test_a_request_uploads_on_the_callers_stream_and_creates_no_stream) {
    char dir[] = "/tmp/reel-test-bt.XXXXXX", path[96];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    ts_tiny_weights(3, path);
    kern_backend_t *b = kern_backend_cpu_new();
    tdit_model_t *m = tdit_model_load_path(b, path, KERN_F32);
    TS_NEW(m);
    kern_stream_t *s = kern_stream_new(b);
    cap_cache_t *c = cap_cache_new(b, NULL);
    ck_assert_int_eq(tdit_register_weights(c, m, 1), 0);
    tdit_shape_t sh = { 1, 4, 4, 3, false, 1, TDIT_SOLVER_EULER, false, TDIT_SOLVER_EULER };
    static float lat[4 * 16], ctx[3 * 32];
    tdit_initial_latent(1, lat, 64);
    tdit_initial_latent(2, ctx, 96);
    tdit_loop_t p = { .steps = 4, .shift = 3.0, .guidance = 1.0f };
    size_t streams = kern_backend_streams_alive(b);
    for (int r = 0; r < 3; r++) {
        tdit_req_t *q = tdit_req_new(m, s, &sh, &p, lat, ctx, NULL);
        TS_NEW(q);
        while (!tdit_req_done(q)) {
            TS_OK(tdit_req_step(q, c, s, NULL));
            ck_assert_uint_eq(kern_backend_streams_alive(b), streams);
        }
        tdit_req_destroy(&q);
    }
    ck_assert_uint_eq(kern_backend_streams_alive(b), streams);
    cap_cache_destroy(&c);
    kern_stream_destroy(&s);
    tdit_model_destroy(&m);
    ck_assert_uint_eq(kern_bytes_in_use(b), 0);
    kern_backend_destroy(&b);
    unlink(path);
    rmdir(dir);
}
END_TEST

int main(void) {
    Suite *su = suite_create("backend_threads");
    TCase *tc = tcase_create("device_lock");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_a_capturing_thread_cannot_allocate_and_its_frees_wait_for_the_capture_end);
    tcase_add_test(tc, test_a_free_on_another_thread_waits_until_the_capture_in_progress_ends);
    tcase_add_test(tc, test_two_threads_capturing_while_a_third_allocates_and_frees_never_overlap);
    tcase_add_test(tc, test_a_graph_replayed_on_another_stream_is_refused);
    tcase_add_test(tc, test_a_request_uploads_on_the_callers_stream_and_creates_no_stream);
    suite_add_tcase(su, tc);
    return ts_run(su);
}
