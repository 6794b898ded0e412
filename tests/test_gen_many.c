/* test_gen_many.c -- reel_gen_many (clients/c/client.h) against a real
 * reel-broker and a CPU reel-worker ($BUILD, default build/) on ipc
 * sockets: a round's results are bitwise those of reel_gen for the same
 * requests (plain, guided, UniPC, SDE, a group); the broker never holds
 * more of a round than its window (its STATUS, sampled while the round
 * runs: queue + requests on workers), where a round with a larger window
 * is seen past it; a broker with a queue of 1 and a worker with one slot
 * answers BUSY, and every request still ends with its RESULT; a request
 * the broker refuses in the middle fails with its index; one that waits
 * past its timeout fails alone with its index. Every wait is for an
 * event (the daemons' sd_notify READY, the worker in STATUS), bounded.
 * (Process-level: skipped, with a line saying so, in the sanitizer runs
 * of the unit suites; run the binary of a sanitizer build by hand, with
 * BUILD naming a build of the daemons, to check the client under it.) */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clients/c/client.h"
#include "tests/support.h"

#define MAXN 16
#define STEPS_TIMEOUT_MS 120000

typedef struct {
    char dir[64], cep[128], wep[128];
    pid_t broker, worker;
} cluster_t;

static float g_ctx[2][5 * 32], g_unc[5 * 32];

/* A notify socket (the daemon's $NOTIFY_SOCKET) at dir/name. */
static int notify_socket(const char *dir, const char *name, char *path, size_t len) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%s", dir, name);
    snprintf(path, len, "%s", sa.sun_path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = { 60, 0 }; /* a loaded machine starts a daemon slowly */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Starts bin (argv, NULL-ended) with $NOTIFY_SOCKET at dir/name, its
 * output in dir/name.log; returns once it said READY=1 (within 60 s). */
static pid_t spawn_ready(const char *dir, const char *name, char *const argv[]) {
    char sock[108], log[128];
    int fd = notify_socket(dir, name, sock, sizeof sock);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("NOTIFY_SOCKET", sock, 1);
        if (!freopen(log, "w", stderr) || !freopen(log, "a", stdout)) _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    char buf[256];
    bool ready = false;
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n < 0) break;
        buf[n] = '\0';
        if (strstr(buf, "READY=1")) {
            ready = true;
            break;
        }
    }
    close(fd);
    ck_assert_msg(ready, "%s never said READY (see %s)", argv[0], log);
    return pid;
}

/* A broker (with extra flag pairs broker_args, NULL-ended) and one CPU
 * worker of tiny (worker_args likewise), the worker listed routable in
 * the broker's STATUS. */
static void cluster_start(cluster_t *k, const char *const *broker_args, const char *const *worker_args) {
    memset(k, 0, sizeof *k);
    ts_mkdtemp(k->dir, sizeof k->dir, "test-gen-many");
    snprintf(k->cep, sizeof k->cep, "ipc://%s/c", k->dir);
    snprintf(k->wep, sizeof k->wep, "ipc://%s/w", k->dir);
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char bbin[256], wbin[256], db[128], weights[128];
    snprintf(bbin, sizeof bbin, "%s/reel-broker", build);
    snprintf(wbin, sizeof wbin, "%s/reel-worker", build);
    snprintf(db, sizeof db, "%s/reel.db", k->dir);
    snprintf(weights, sizeof weights, "%s/w.safetensors", k->dir);
    ts_tiny_weights(7, weights);
    char *ba[24] = { bbin, "--clients", k->cep, "--workers", k->wep, "--catalog", db, "--heartbeat-ms", "200" };
    int n = 9;
    for (int i = 0; broker_args && broker_args[i] && n < 23; i++) ba[n++] = (char *)broker_args[i];
    ba[n] = NULL;
    k->broker = spawn_ready(k->dir, "broker", ba);
    char *wa[24] = { wbin, "--name", "w1", "--weights", weights, "--broker", k->wep, "--heartbeat-ms", "200" };
    n = 9;
    for (int i = 0; worker_args && worker_args[i] && n < 23; i++) wa[n++] = (char *)worker_args[i];
    wa[n] = NULL;
    k->worker = spawn_ready(k->dir, "worker", wa);
    /* the broker has the worker once its READY came: STATUS says so */
    reel_client_t *c;
    TS_NEW(c = reel_client_new(k->cep));
    bool listed = false;
    for (int tries = 0; tries < 600 && !listed; tries++) {
        reel_status_t *s = NULL;
        wire_err_t err;
        if (reel_status(c, &s, 5000, &err) == 0) {
            const msg_status_reply_t *r = reel_status_reply(s);
            listed = r->n_workers == 1 && r->workers[0].routable;
        }
        reel_status_free(&s);
        if (!listed) usleep(100 * 1000); /* the worker's READY on its way to the broker */
    }
    reel_client_destroy(&c);
    ck_assert_msg(listed, "the worker never showed in the broker's STATUS");
}

static void stop_pid(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int st;
    waitpid(pid, &st, 0);
}

static void cluster_stop(cluster_t *k) {
    stop_pid(k->worker);
    stop_pid(k->broker);
    if (ts_rmtree(k->dir)) fprintf(stderr, "could not remove %s\n", k->dir);
}

/* A request of tiny: a latent of 4 channels, 2 frames of hw x hw, drawn
 * from seed; context g_ctx[ctx] (5x32); steps Euler steps, no guidance. */
static void tiny(reel_gen_t *g, int ctx, uint64_t seed, int steps, int hw) {
    memset(g, 0, sizeof *g);
    g->model = "tiny";
    g->steps = steps;
    g->shift = g->cfg = 1.0;
    g->eta = 0.7;
    g->seed = seed;
    g->latent_shape[0] = 4;
    g->latent_shape[1] = 2;
    g->latent_shape[2] = g->latent_shape[3] = hw;
    g->context = g_ctx[ctx];
    g->ctx_shape[0] = 5;
    g->ctx_shape[1] = 32;
}

static size_t floats_of(const reel_gen_t *g) {
    return (size_t)(g->latent_shape[0] * g->latent_shape[1] * g->latent_shape[2] * g->latent_shape[3]) *
           (size_t)(g->n > 1 ? g->n : 1);
}

/* What the hooks saw. */
typedef struct {
    int done_calls, progress_last, progress_total, progress_backwards;
} seen_t;

static void seen_progress(void *user, int done, int total) {
    seen_t *s = user;
    if (done < s->progress_last) s->progress_backwards++;
    s->progress_last = done;
    s->progress_total = total;
}

static void seen_done(void *user, size_t i, reel_gen_item_t *it, const float *latent) {
    seen_t *s = user;
    (void)i;
    (void)it;
    (void)latent;
    s->done_calls++;
}

/* items[i].out: room for its latent (freed by free_outs). */
static void alloc_outs(reel_gen_item_t *items, size_t n) {
    for (size_t i = 0; i < n; i++) ck_assert_ptr_nonnull(items[i].out = malloc(floats_of(&items[i].g) * sizeof(float)));
}

static void free_outs(reel_gen_item_t *items, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(items[i].out);
        items[i].out = NULL;
    }
}

/* Item i's latent is bitwise what reel_gen returns for its request. */
static void same_as_reel_gen(reel_client_t *c, const reel_gen_item_t *it, size_t i) {
    size_t nf = floats_of(&it->g);
    float *want = malloc(nf * sizeof *want);
    ck_assert_ptr_nonnull(want);
    reel_gen_result_t res;
    wire_err_t err;
    int rc = reel_gen(c, &it->g, want, &res, NULL, NULL, STEPS_TIMEOUT_MS, &err);
    ck_assert_msg(rc == 0, "reel_gen of requests[%zu]: %s: %s", i, err.code, err.message);
    ck_assert_msg(it->rc == 0, "requests[%zu]: %d %s: %s", i, it->rc, it->err.code, it->err.message);
    ck_assert_msg(!memcmp(it->out, want, nf * sizeof *want), "requests[%zu] differs from its reel_gen", i);
    free(want);
}

/* A round of different requests -- plain, guided, UniPC, a group of 3,
 * SDE, another shift and step count -- gives each exactly what reel_gen
 * gives it alone; progress ends at the sum of their steps (a group's
 * counted once, as its PROGRESS counts them), done ran once for each. */
START_TEST(test_a_round_s_results_are_bitwise_those_of_reel_gen_for_each_request) {
    cluster_t k;
    cluster_start(&k, NULL, NULL);
    reel_client_t *c;
    TS_NEW(c = reel_client_new(k.cep));
    static const uint64_t group_seeds[3] = { 7, 8, 9 };
    reel_gen_item_t items[6];
    memset(items, 0, sizeof items);
    tiny(&items[0].g, 0, 1, 3, 8);
    tiny(&items[1].g, 1, 2, 5, 8);
    items[1].g.uncond = g_unc;
    items[1].g.cfg = 3.0;
    tiny(&items[2].g, 0, 3, 3, 8);
    items[2].g.solver = "unipc";
    tiny(&items[3].g, 1, 0, 3, 8);
    items[3].g.n = 3;
    items[3].g.seeds = group_seeds;
    tiny(&items[4].g, 0, 4, 2, 8);
    items[4].g.sde = true;
    tiny(&items[5].g, 1, 5, 4, 8);
    items[5].g.shift = 2.0;
    alloc_outs(items, 6);
    seen_t seen = { 0 };
    reel_gen_many_t o = { .window = 3, .timeout_ms = STEPS_TIMEOUT_MS, .progress = seen_progress, .done = seen_done,
                          .user = &seen };
    size_t failed;
    wire_err_t err;
    int rc = reel_gen_many(c, items, 6, &o, &failed, &err);
    ck_assert_msg(rc == 0, "reel_gen_many: %d, requests[%zu]: %s: %s", rc, failed, err.code, err.message);
    ck_assert_uint_eq(failed, REEL_GEN_NO_INDEX);
    for (size_t i = 0; i < 6; i++) same_as_reel_gen(c, &items[i], i);
    ck_assert_int_eq(seen.done_calls, 6);
    ck_assert_int_eq(seen.progress_total, 3 + 5 + 3 + 3 + 2 + 4);
    ck_assert_int_eq(seen.progress_last, seen.progress_total);
    ck_assert_int_eq(seen.progress_backwards, 0);
    ck_assert_str_eq(items[3].res.worker, "w1");
    free_outs(items, 6);
    reel_client_destroy(&c);
    cluster_stop(&k);
}
END_TEST

/* A second client sampling the broker's STATUS while a round runs: the
 * most of the round the broker held at once (queued + on workers). */
typedef struct {
    const char *ep;
    atomic_bool stop;
    int most, samples;
} sampler_t;

static void *sample_main(void *p) {
    sampler_t *s = p;
    reel_client_t *c = reel_client_new(s->ep);
    while (c && !atomic_load(&s->stop)) {
        reel_status_t *st = NULL;
        wire_err_t err;
        if (reel_status(c, &st, 5000, &err) == 0) {
            const msg_status_reply_t *r = reel_status_reply(st);
            int held = (int)r->queue;
            for (size_t i = 0; i < r->n_workers; i++) held += (int)r->workers[i].inflight;
            if (held > s->most) s->most = held;
            s->samples++;
        }
        reel_status_free(&st);
        /* a sample each 2 ms: the broker and the worker keep the CPU (a
         * round's requests are held for a hundred ms and more) */
        nanosleep(&(struct timespec){ 0, 2000000 }, NULL);
    }
    reel_client_destroy(&c);
    return NULL;
}

/* The most a round of 12 requests (window w) had the broker hold at once. */
static int most_held(reel_client_t *c, const char *ep, int window) {
    reel_gen_item_t items[12];
    memset(items, 0, sizeof items);
    for (int i = 0; i < 12; i++) tiny(&items[i].g, i % 2, 100 + (uint64_t)i, 300, 16);
    alloc_outs(items, 12);
    sampler_t s = { .ep = ep };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, sample_main, &s), 0);
    reel_gen_many_t o = { .window = window, .timeout_ms = STEPS_TIMEOUT_MS };
    size_t failed;
    wire_err_t err;
    int rc = reel_gen_many(c, items, 12, &o, &failed, &err);
    atomic_store(&s.stop, true);
    pthread_join(th, NULL);
    ck_assert_msg(rc == 0, "reel_gen_many (window %d): %d, requests[%zu]: %s: %s", window, rc, failed, err.code,
                  err.message);
    ck_assert_int_gt(s.samples, 0);
    free_outs(items, 12);
    fprintf(stderr, "window %d: the broker held at most %d of the round (%d STATUS samples)\n", window, s.most,
            s.samples);
    return s.most;
}

/* The broker never holds more of a round than its window (3 of 12, on a
 * worker that takes 8 at once); the same round with window 12 is seen
 * holding more than 3, so the sampling would see a window exceeded. */
START_TEST(test_the_broker_never_holds_more_of_a_round_than_its_window) {
    cluster_t k;
    cluster_start(&k, NULL, NULL);
    reel_client_t *c;
    TS_NEW(c = reel_client_new(k.cep));
    int most = most_held(c, k.cep, 3);
    ck_assert_msg(most <= 3, "the broker held %d requests of a round with window 3", most);
    ck_assert_msg(most >= 2, "the sampling saw at most %d of the round in flight: it saw too little to judge", most);
    most = most_held(c, k.cep, 12);
    ck_assert_msg(most > 3, "with window 12 the sampling saw at most %d held: it could not see a window exceeded",
                  most);
    reel_client_destroy(&c);
    cluster_stop(&k);
}
END_TEST

/* A broker that queues 1 and a worker that runs 1: a round of 6 sent at
 * once (window 6) is answered BUSY for most of them; each goes again
 * after another answer, and all 6 end with their RESULTs, bitwise
 * reel_gen's. */
START_TEST(test_a_round_against_a_full_queue_is_answered_busy_and_still_completes) {
    static const char *const bargs[] = { "--queue-max", "1", NULL };
    static const char *const wargs[] = { "--streams", "1", "--max-inflight", "1", NULL };
    cluster_t k;
    cluster_start(&k, bargs, wargs);
    reel_client_t *c;
    TS_NEW(c = reel_client_new(k.cep));
    reel_gen_item_t items[6];
    memset(items, 0, sizeof items);
    for (int i = 0; i < 6; i++) tiny(&items[i].g, i % 2, 200 + (uint64_t)i, 40, 8);
    alloc_outs(items, 6);
    reel_gen_many_t o = { .window = 6, .timeout_ms = STEPS_TIMEOUT_MS };
    size_t failed;
    wire_err_t err;
    int rc = reel_gen_many(c, items, 6, &o, &failed, &err);
    ck_assert_msg(rc == 0, "reel_gen_many: %d, requests[%zu]: %s: %s", rc, failed, err.code, err.message);
    int busy = 0;
    for (int i = 0; i < 6; i++) busy += items[i].busy;
    fprintf(stderr, "queue 1, one slot: %d BUSY answers over the round of 6\n", busy);
    ck_assert_msg(busy >= 4, "only %d BUSY answers: 6 sent at once to a broker that holds 2", busy);
    for (size_t i = 0; i < 6; i++) same_as_reel_gen(c, &items[i], i);
    free_outs(items, 6);
    reel_client_destroy(&c);
    cluster_stop(&k);
}
END_TEST

/* A request the broker refuses (a latent of 3 channels for a model of 4)
 * in the middle of a round: the round fails with its index and the
 * broker's error; those after it not yet answered are cancelled or never
 * sent. With keep_going
 * the others all end with their RESULTs, bitwise reel_gen's. */
START_TEST(test_a_request_refused_in_the_middle_of_a_round_fails_with_its_index) {
    cluster_t k;
    cluster_start(&k, NULL, NULL);
    reel_client_t *c;
    TS_NEW(c = reel_client_new(k.cep));
    for (int keep = 0; keep < 2; keep++) {
        reel_gen_item_t items[5];
        memset(items, 0, sizeof items);
        for (int i = 0; i < 5; i++) tiny(&items[i].g, 0, 300 + (uint64_t)i, 3, 8);
        items[2].g.latent_shape[0] = 3;
        alloc_outs(items, 5);
        reel_gen_many_t o = { .window = 2, .timeout_ms = STEPS_TIMEOUT_MS, .keep_going = keep };
        size_t failed;
        wire_err_t err;
        int rc = reel_gen_many(c, items, 5, &o, &failed, &err);
        ck_assert_int_eq(rc, 1);
        ck_assert_uint_eq(failed, 2);
        ck_assert_str_eq(err.code, WIRE_E_BAD_REQUEST);
        ck_assert_int_eq(items[2].rc, 1);
        ck_assert_str_eq(items[2].err.code, WIRE_E_BAD_REQUEST);
        /* without keep_going: a request answered before the ERROR came has
         * its RESULT, one in flight then is cancelled, the rest not sent */
        int ended = 0;
        for (size_t i = 0; i < 5; i++) {
            if (i == 2) continue;
            if (keep || items[i].rc == 0) {
                same_as_reel_gen(c, &items[i], i);
                continue;
            }
            ck_assert_msg(!strcmp(items[i].err.code, WIRE_E_CANCELLED) ||
                          !strcmp(items[i].err.code, REEL_CLIENT_E_NOT_SENT), "requests[%zu]: %s: %s", i,
                          items[i].err.code, items[i].err.message);
            ended++;
        }
        if (!keep) ck_assert_int_ge(ended, 1); /* request 4 at least: the window is 2 */
        free_outs(items, 5);
    }
    reel_client_destroy(&c);
    cluster_stop(&k);
}
END_TEST

/* A request that runs past its timeout (10000 steps of 2x16x16: seconds;
 * its timeout 1.5 s) fails alone, "timeout" with its index, while the
 * short ones of the round get their RESULTs (keep_going). */
START_TEST(test_a_request_past_its_timeout_fails_alone_with_its_index) {
    cluster_t k;
    cluster_start(&k, NULL, NULL);
    reel_client_t *c;
    TS_NEW(c = reel_client_new(k.cep));
    reel_gen_item_t items[3];
    memset(items, 0, sizeof items);
    tiny(&items[0].g, 0, 400, 3, 8);
    tiny(&items[1].g, 1, 401, 10000, 16);
    tiny(&items[2].g, 0, 402, 3, 8);
    alloc_outs(items, 3);
    reel_gen_many_t o = { .window = 3, .timeout_ms = 1500, .keep_going = true };
    size_t failed;
    wire_err_t err;
    int rc = reel_gen_many(c, items, 3, &o, &failed, &err);
    ck_assert_int_eq(rc, -1);
    ck_assert_uint_eq(failed, 1);
    ck_assert_str_eq(err.code, WIRE_E_TIMEOUT);
    ck_assert_msg(strstr(err.message, "requests[1]"), "%s", err.message);
    ck_assert_int_eq(items[1].rc, -1);
    same_as_reel_gen(c, &items[0], 0);
    same_as_reel_gen(c, &items[2], 2);
    free_outs(items, 3);
    reel_client_destroy(&c);
    cluster_stop(&k);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("gen_many");
    TCase *tc = tcase_create("cluster");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_a_round_s_results_are_bitwise_those_of_reel_gen_for_each_request);
    tcase_add_test(tc, test_the_broker_never_holds_more_of_a_round_than_its_window);
    tcase_add_test(tc, test_a_round_against_a_full_queue_is_answered_busy_and_still_completes);
    tcase_add_test(tc, test_a_request_refused_in_the_middle_of_a_round_fails_with_its_index);
    tcase_add_test(tc, test_a_request_past_its_timeout_fails_alone_with_its_index);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    if (getenv("REEL_UNIT_ONLY")) {
        printf("test_gen_many: SKIP: process-level test, run by the main suite only\n");
        return 0;
    }
    unsetenv("REEL_KEY");
    unsetenv("REEL_BROKER_KEY");
    unsetenv("REEL_CLIENT_LIVENESS_MS");
    signal(SIGPIPE, SIG_IGN);
    ts_fill_uniform(g_ctx[0], 5 * 32, 11, -1.f, 1.f);
    ts_fill_uniform(g_ctx[1], 5 * 32, 12, -1.f, 1.f);
    ts_fill_uniform(g_unc, 5 * 32, 13, -1.f, 1.f);
    return ts_run(suite());
}
