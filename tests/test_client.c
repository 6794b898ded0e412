/* test_client.c -- the C client library (clients/c/client.h) against a
 * fake broker: a ROUTER socket in the test thread reads what the client
 * sends and answers as each test says, while reel_gen runs on a thread of
 * its own. Checked: the delivery rules of docs/PROTOCOL.md ("Delivery") --
 * a STATUS just before the GEN; a STATUS after every liveness period of
 * silence; the GEN sent again (same id, same client token) when a STATUS
 * goes unanswered, when another boot answers it, or when no boot was
 * learnt before one answers, and never when the same boot answers, when a
 * broker without a boot answers, or with liveness 0; the boot a RESULT
 * names kept for the next call (a restart between calls is no reason to
 * send again); reel_client_resends and the on_resend hook (silent_ms > 0
 * for silence, 0 for a new boot); a GEN given up on (its timeout) is
 * followed by a CANCEL of its id and token, an answered one by none.
 * And its sockets ("sockets"): the handshake watch runs only while a call
 * runs and reads its events as they come (an idle client whose
 * connection keeps failing, against a TCP port that hangs up every
 * connection, holds one socket and piles nothing up); a client made
 * reaches no broker before its first call; a socket whose key a ZAP
 * handler refused is replaced during the call (with backoff) and at the
 * next one, and a call waiting when the handler starts to admit the key
 * goes through.
 *
 * Assertions are on the messages the fake broker receives, never on time.
 * One thing time can do: on a loaded machine a reply of the fake broker
 * may reach the client after its liveness period (50 ms), and the client
 * then rightly resends for silence. The client's own account (its hook
 * says "silence", silent_ms > 0) marks such a try as disturbed, and the
 * test runs again (at most TRIES times); a resend the rules do not allow
 * (silent_ms 0 where no new boot answered) fails at once. */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clients/c/client.h"
#include "clients/c/client_int.h"
#include "net/keys.h"
#include "schema/msg.h"
#include "tests/support.h"

#define LIVENESS_MS 50
#define TRIES 3
#define BOOT_A 0x1111aaaa2222bbbbull
#define BOOT_B 0x3333cccc4444ddddull
#define LOG_MAX 64

static float g_ctx[5 * 32], g_lat[4 * 2 * 8 * 8];

/* What the on_resend hook was told, in order. */
typedef struct {
    pthread_mutex_t mu;
    int n;
    uint64_t id[LOG_MAX];
    int silent[LOG_MAX];
} resend_log_t;

typedef struct {
    char dir[64], ep[128];
    void *ctx, *router;
    reel_client_t *c;
    pthread_t th;
    bool running;
    /* the client thread's: reel_gen's return and what it left */
    int rc;
    wire_err_t err;
    float out[4 * 2 * 8 * 8];
    uint64_t resends;
    resend_log_t log;
    /* the fake broker's: what it received */
    zmq_msg_t who;     /* the client's routing identity */
    bool have_who;
    uint64_t gen_id, token;
    int gens, statuses;
    bool answered;     /* its RESULT went */
    uint64_t result_boot; /* the boot id the RESULT names (0: none, an older broker's) */
} fake_t;

enum { DONE = 0, DISTURBED = 1 };

static void on_resend(void *user, uint64_t id, int silent_ms) {
    resend_log_t *l = user;
    pthread_mutex_lock(&l->mu);
    if (l->n < LOG_MAX) {
        l->id[l->n] = id;
        l->silent[l->n] = silent_ms;
    }
    l->n++;
    pthread_mutex_unlock(&l->mu);
}

/* The silent_ms the hook got for resend k (0-based); -1 when it got none
 * (yet). The hook runs before the GEN is sent: once the fake broker has
 * a resend, its entry is there. */
static int silent_of(fake_t *f, int k) {
    pthread_mutex_lock(&f->log.mu);
    int s = k < f->log.n && k < LOG_MAX ? f->log.silent[k] : -1;
    pthread_mutex_unlock(&f->log.mu);
    return s;
}

/* A GEN of the tiny shape, 2 steps, context g_ctx. */
static void tiny_gen(reel_gen_t *g) {
    memset(g, 0, sizeof *g);
    g->model = "tiny";
    g->steps = 2;
    g->shift = g->cfg = 1.0;
    g->latent_shape[0] = 4;
    g->latent_shape[1] = 2;
    g->latent_shape[2] = g->latent_shape[3] = 8;
    g->context = g_ctx;
    g->ctx_shape[0] = 5;
    g->ctx_shape[1] = 32;
}

static void *client_main(void *p) {
    fake_t *f = p;
    reel_gen_t g;
    tiny_gen(&g);
    g.seed = 7;
    reel_gen_result_t res;
    f->rc = reel_gen(f->c, &g, f->out, &res, NULL, NULL, 20000, &f->err);
    f->resends = reel_client_resends(f->c);
    return NULL;
}

/* A fake broker and a client of it (liveness_ms; < 0: the client's own,
 * from the environment) whose reel_gen is running. */
static void fake_open(fake_t *f, int liveness_ms) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->log.mu, NULL);
    ts_mkdtemp(f->dir, sizeof f->dir, "test-client");
    snprintf(f->ep, sizeof f->ep, "ipc://%s/b", f->dir);
    ck_assert_ptr_nonnull(f->ctx = zmq_ctx_new());
    ck_assert_ptr_nonnull(f->router = zmq_socket(f->ctx, ZMQ_ROUTER));
    ck_assert_int_eq(wire_socket_limits(f->router), 0);
    int tmo = 5000;
    zmq_setsockopt(f->router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    ck_assert_int_eq(zmq_bind(f->router, f->ep), 0);
    TS_NEW(f->c = reel_client_new(f->ep));
    if (liveness_ms >= 0) reel_client_set_liveness(f->c, liveness_ms);
    reel_client_on_resend(f->c, on_resend, &f->log);
    ck_assert_int_eq(pthread_create(&f->th, NULL, client_main, f), 0);
    f->running = true;
}

/* The next message the client sent (within 5 s): a STATUS, or a GEN --
 * after the first, always the first one's id and client token. Its id in
 * *id. */
static msg_type_t next(fake_t *f, uint64_t *id) {
    wire_msg_t m;
    wire_err_t err;
    ck_assert_msg(msg_recv(f->router, true, 0, &m, &err) == 0, "nothing (readable) from the client within 5 s");
    if (!f->have_who) {
        zmq_msg_init(&f->who);
        ck_assert_int_eq(zmq_msg_copy(&f->who, &m.identity), 0);
        f->have_who = true;
    }
    msg_type_t t = msg_type(&m);
    if (id) *id = m.id;
    if (t == MSG_STATUS) {
        f->statuses++;
        ck_assert_int_eq(msg_decode(&m, MSG_STATUS, NULL, &err), 0);
        ck_assert_msg(!f->gens || m.id != f->gen_id, "a STATUS under the GEN's id");
    } else {
        ck_assert_msg(t == MSG_GEN, "the client sent %s", m.type);
        msg_gen_t g;
        ck_assert_msg(msg_gen_decode(&m, &g, &err) == 0, "%s", err.message);
        ck_assert_msg(g.client != 0, "a GEN without a client token");
        ck_assert_uint_eq(g.seed, 7);
        if (!f->gens) {
            f->gen_id = m.id;
            f->token = g.client;
        } else { /* the same request: its id and token */
            ck_assert_uint_eq(m.id, f->gen_id);
            ck_assert_uint_eq(g.client, f->token);
        }
        f->gens++;
    }
    wire_msg_close(&m);
    return t;
}

/* STATUS_REPLY to STATUS `id` of peer who on router, naming boot `boot`
 * (0: an older broker's, without one). */
static void reply_status_to(void *router, zmq_msg_t *who, uint64_t id, uint64_t boot) {
    msg_status_reply_t s;
    memset(&s, 0, sizeof s);
    s.boot = boot;
    ck_assert_int_eq(msg_send(router, who, MSG_STATUS_REPLY, id, &s, NULL), 0);
}

static void reply_status(fake_t *f, uint64_t id, uint64_t boot) { reply_status_to(f->router, &f->who, id, boot); }

/* The GEN's RESULT (latent g_lat), then reel_gen's return. */
static void finish(fake_t *f) {
    if (!f->answered && f->have_who) {
        msg_result_t r;
        memset(&r, 0, sizeof r);
        r.version = 1;
        r.boot = f->result_boot;
        const int64_t ls[4] = { 4, 2, 8, 8 };
        wire_tensor_t t = ts_wire_tensor("latent", KERN_F32, 4, ls, g_lat, sizeof g_lat);
        r.latent = &t;
        ck_assert_int_eq(msg_send(f->router, &f->who, MSG_RESULT, f->gen_id, &r, NULL), 0);
        f->answered = true;
    }
    if (f->running) pthread_join(f->th, NULL);
    f->running = false;
}

/* finish(), checking reel_gen got the RESULT; then reads the rest of what
 * the client sent before it got it: every GEN it counts as sent (1 +
 * its resends) reached the fake broker, and no other. */
static void finish_ok(fake_t *f) {
    finish(f);
    ck_assert_msg(f->rc == 0, "reel_gen: %d %s: %s", f->rc, f->err.code, f->err.message);
    ck_assert_mem_eq(f->out, g_lat, sizeof g_lat);
    while (f->gens < 1 + (int)f->resends) next(f, NULL);
    zmq_pollitem_t it = { f->router, 0, ZMQ_POLLIN, 0 };
    while (zmq_poll(&it, 1, 50) > 0) next(f, NULL);
    ck_assert_int_eq(f->gens, 1 + (int)f->resends);
    pthread_mutex_lock(&f->log.mu);
    ck_assert_int_eq(f->log.n, (int)f->resends); /* the hook saw every one */
    for (int k = 0; k < f->log.n && k < LOG_MAX; k++) ck_assert_uint_eq(f->log.id[k], f->gen_id);
    pthread_mutex_unlock(&f->log.mu);
}

static void fake_close(fake_t *f) {
    finish(f);
    reel_client_destroy(&f->c);
    if (f->have_who) zmq_msg_close(&f->who);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
    pthread_mutex_destroy(&f->log.mu);
    if (ts_rmtree(f->dir)) fprintf(stderr, "could not remove %s\n", f->dir);
}

/* A GEN where none was due (resend k): a resend for silence (a reply of
 * the fake broker came too late: the try is disturbed), or one the rules
 * do not allow (fails). */
static int unexpected_resend(fake_t *f, int k, const char *why) {
    int s = silent_of(f, k);
    ck_assert_msg(s > 0, "the GEN was sent again (silent_ms %d) %s", s, why);
    return DISTURBED;
}

/* Any resend for silence at all, from resend k on: a reply came too late. */
static bool silence_from(fake_t *f, int k) {
    for (int i = k; i < (int)f->resends; i++)
        if (silent_of(f, i) > 0) return true;
    return false;
}

/* The start of every GEN with a liveness: a STATUS, then the GEN. *ping:
 * the STATUS's id. */
static void status_then_gen(fake_t *f, uint64_t *ping) {
    uint64_t gid;
    ck_assert_msg(next(f, ping) == MSG_STATUS, "the client's first message is not a STATUS");
    ck_assert_msg(next(f, &gid) == MSG_GEN, "the client's second message is not the GEN");
    ck_assert_uint_ne(*ping, gid);
    ck_assert_int_eq(f->statuses, 1);
}

static void run(int (*scenario)(fake_t *), int liveness_ms, const char *name) {
    for (int k = 0; k < TRIES; k++) {
        fake_t *f = calloc(1, sizeof *f);
        ck_assert_ptr_nonnull(f);
        fake_open(f, liveness_ms);
        int r = scenario(f);
        fake_close(f);
        free(f);
        if (r == DONE) return;
        fprintf(stderr, "%s: try %d disturbed (a reply reached the client after its liveness period); again\n", name,
                k + 1);
    }
    ck_abort_msg("%s: all %d tries disturbed", name, TRIES);
}

/* ---- the scenarios ------------------------------------------------------------------ */

/* The broker answers the first STATUS (boot A), then nothing: the client
 * asks again (a STATUS) and, that unanswered too, sends the GEN again. */
static int silence(fake_t *f) {
    uint64_t ping, id;
    status_then_gen(f, &ping);
    reply_status(f, ping, BOOT_A);
    msg_type_t t = next(f, &id); /* silent from here on */
    if (t == MSG_GEN) return unexpected_resend(f, 0, "before a STATUS went unanswered");
    ck_assert_uint_ne(id, ping);
    ck_assert_int_eq(next(f, NULL), MSG_GEN); /* that STATUS unanswered: the GEN again */
    ck_assert_int_ge(silent_of(f, 0), LIVENESS_MS);
    finish_ok(f);
    ck_assert_uint_ge(f->resends, 1);
    for (int k = 0; k < (int)f->resends; k++) /* no new boot ever answered: each was for silence */
        ck_assert_int_gt(silent_of(f, k), 0);
    return DONE;
}

/* STATUSes answered by the same boot never resend; one answered by
 * another (a restarted broker) resends at once, silent_ms 0; the new boot
 * answering after that does not again. */
static int new_boot(fake_t *f) {
    uint64_t ping;
    status_then_gen(f, &ping);
    reply_status(f, ping, BOOT_A);
    for (int k = 0; k < 2; k++) { /* the same broker, still there */
        if (next(f, &ping) == MSG_GEN) return unexpected_resend(f, f->gens - 2, "though the same boot answered");
        reply_status(f, ping, BOOT_A);
    }
    if (next(f, &ping) == MSG_GEN) return unexpected_resend(f, f->gens - 2, "though the same boot answered");
    reply_status(f, ping, BOOT_B); /* another broker */
    ck_assert_int_eq(next(f, NULL), MSG_GEN);
    if (silent_of(f, f->gens - 2) > 0) return DISTURBED; /* a resend for silence crossed the reply */
    for (int k = 0; k < 2; k++) { /* the new broker, still there */
        if (next(f, &ping) == MSG_GEN) return unexpected_resend(f, f->gens - 2, "though the same new boot answered");
        reply_status(f, ping, BOOT_B);
    }
    finish_ok(f);
    if (silence_from(f, 0)) return DISTURBED;
    ck_assert_uint_eq(f->resends, 1);
    ck_assert_int_eq(silent_of(f, 0), 0);
    ck_assert_int_ge(f->statuses, 5);
    return DONE;
}

/* A broker that stops (SIGTERM: a restart, a deploy) answers the GEN
 * `shutdown`: not an answer. The client waits on, and when the broker
 * that comes back (another boot) answers its STATUS, sends the GEN again
 * there; its RESULT is the call's. (reel_gen used to return the ERROR:
 * every request in flight failed across a graceful restart.) */
static int shutdown_answer(fake_t *f) {
    uint64_t ping, id;
    status_then_gen(f, &ping);
    reply_status(f, ping, BOOT_A);
    ck_assert_int_eq(msg_send_error(f->router, &f->who, f->gen_id, WIRE_E_SHUTDOWN, "the broker is shutting down"), 0);
    ck_assert_msg(next(f, &id) == MSG_STATUS, "after `shutdown` the GEN went again before a broker answered");
    reply_status(f, id, BOOT_B); /* the broker that came back */
    ck_assert_int_eq(next(f, NULL), MSG_GEN);
    if (silent_of(f, 0) > 0) return DISTURBED; /* the reply came after a liveness period */
    finish_ok(f);
    if (silence_from(f, 0)) return DISTURBED;
    ck_assert_uint_eq(f->resends, 1);
    return DONE;
}

/* A broker without a boot (older than resends) is never resent to on its
 * word: its answers keep the GEN where it is. */
static int no_boot_broker(fake_t *f) {
    uint64_t ping;
    status_then_gen(f, &ping);
    reply_status(f, ping, 0);
    for (int k = 0; k < 3; k++) {
        if (next(f, &ping) == MSG_GEN)
            return unexpected_resend(f, f->gens - 2, "though a broker without boot answered");
        reply_status(f, ping, 0);
    }
    finish_ok(f);
    if (silence_from(f, 0)) return DISTURBED;
    ck_assert_uint_eq(f->resends, 0);
    return DONE;
}

/* The first STATUS unanswered: the GEN again for silence; when a later
 * STATUS is answered, the client had no boot to compare: it sends the GEN
 * once more (silent_ms 0), and not again while that boot answers. */
static int no_boot_learnt(fake_t *f) {
    uint64_t ping;
    status_then_gen(f, &ping);
    ck_assert_int_eq(next(f, NULL), MSG_GEN); /* the first STATUS unanswered */
    ck_assert_int_gt(silent_of(f, 0), 0);
    ck_assert_msg(next(f, &ping) == MSG_STATUS, "sent the GEN twice without asking in between");
    reply_status(f, ping, BOOT_A);
    ck_assert_int_eq(next(f, NULL), MSG_GEN);
    if (silent_of(f, f->gens - 2) > 0) return DISTURBED;
    for (int k = 0; k < 2; k++) {
        if (next(f, &ping) == MSG_GEN) return unexpected_resend(f, f->gens - 2, "though the boot it learnt answered");
        reply_status(f, ping, BOOT_A);
    }
    finish_ok(f);
    if (silence_from(f, 2)) return DISTURBED;
    ck_assert_uint_eq(f->resends, 2);
    ck_assert_int_gt(silent_of(f, 0), 0);
    ck_assert_int_eq(silent_of(f, 1), 0);
    return DONE;
}

/* Liveness 0: the GEN alone (still with its token), no STATUS however long
 * the broker is silent, never sent again. */
static int no_liveness(fake_t *f) {
    ck_assert_msg(next(f, NULL) == MSG_GEN, "with liveness 0 the first message is not the GEN");
    zmq_pollitem_t it = { f->router, 0, ZMQ_POLLIN, 0 };
    ck_assert_msg(zmq_poll(&it, 1, 4 * LIVENESS_MS) == 0, "with liveness 0 the client sent more than the GEN");
    finish_ok(f);
    ck_assert_int_eq(f->statuses, 0);
    ck_assert_uint_eq(f->resends, 0);
    return DONE;
}

/* A RESULT names the broker that answered (boot B, a broker restarted
 * since the client learnt boot A): the client's next call starts from B,
 * so its liveness STATUSes answered by B are the same broker, and the GEN
 * is not sent again. */
static int boot_from_result(fake_t *f) {
    uint64_t ping, id;
    status_then_gen(f, &ping);
    reply_status(f, ping, BOOT_A);
    f->result_boot = BOOT_B;
    finish_ok(f);
    if (f->resends) return DISTURBED; /* a resend for silence crossed the first call */
    /* the second call, on the same client */
    f->answered = false;
    f->gens = f->statuses = 0;
    f->result_boot = 0;
    ck_assert_int_eq(pthread_create(&f->th, NULL, client_main, f), 0);
    f->running = true;
    ck_assert_msg(next(f, &id) == MSG_GEN, "a STATUS before the second GEN: the boot was known");
    for (int k = 0; k < 2; k++) { /* silence, then the liveness STATUSes: answered by B */
        if (next(f, &ping) == MSG_GEN) return unexpected_resend(f, 0, "though the RESULT's boot answered");
        reply_status(f, ping, BOOT_B);
    }
    finish_ok(f);
    if (silence_from(f, 0)) return DISTURBED;
    ck_assert_uint_eq(f->resends, 0);
    return DONE;
}

/* A GEN given no timeout (0) waits by its deadline, as the Python
 * client's: at least 120 s, and its deadline_ms (0: the broker's 60 s) +
 * 5 s when longer, so a long request is not given up on before the broker
 * gives up on it. It used to wait 0 ms: a -1 "timeout" at once, for a
 * request the broker went on to run. */
typedef struct {
    reel_client_t *c;
    int rc;
    wire_err_t err;
} zero_wait_t;

static void *zero_wait_main(void *p) {
    zero_wait_t *z = p;
    reel_gen_t g;
    tiny_gen(&g);
    g.deadline_ms = 300000;
    float out[4 * 2 * 8 * 8];
    reel_gen_result_t res;
    z->rc = reel_gen(z->c, &g, out, &res, NULL, NULL, 0, &z->err);
    return NULL;
}

START_TEST(test_a_gen_given_no_timeout_waits_by_its_deadline) {
    ck_assert_int_eq(cli_gen_wait_ms(0, 0), 120000);
    ck_assert_int_eq(cli_gen_wait_ms(-5, 0), 120000);
    ck_assert_int_eq(cli_gen_wait_ms(0, 30000), 120000);
    ck_assert_int_eq(cli_gen_wait_ms(0, 200000), 205000);
    ck_assert_int_eq(cli_gen_wait_ms(0, UINT64_MAX - 1), INT_MAX);
    ck_assert_int_eq(cli_gen_wait_ms(7, 900000), 7);

    char dir[64], ep[128];
    ts_mkdtemp(dir, sizeof dir, "test-client-zero");
    snprintf(ep, sizeof ep, "ipc://%s/b", dir);
    void *ctx = zmq_ctx_new(), *router = zmq_socket(ctx, ZMQ_ROUTER);
    ck_assert_int_eq(wire_socket_limits(router), 0);
    int tmo = 10000;
    zmq_setsockopt(router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    ck_assert_int_eq(zmq_bind(router, ep), 0);
    zero_wait_t z = { 0 };
    TS_NEW(z.c = reel_client_new(ep));
    reel_client_set_liveness(z.c, 0); /* no STATUS: the GEN alone */
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, zero_wait_main, &z), 0);
    wire_msg_t m;
    wire_err_t e;
    ck_assert_int_eq(msg_recv(router, true, 0, &m, &e), 0);
    ck_assert_int_eq(msg_type(&m), MSG_GEN);
    /* answered after the GEN came: the call is still waiting for it */
    ck_assert_int_eq(msg_send(router, &m.identity, MSG_BUSY, m.id, &(msg_busy_t){ "full" }, NULL), 0);
    wire_msg_close(&m);
    pthread_join(th, NULL);
    ck_assert_msg(z.rc == 1 && !strcmp(z.err.code, WIRE_E_BUSY), "reel_gen with timeout 0: rc %d, %s: %s", z.rc,
                  z.err.code, z.err.message);
    reel_client_destroy(&z.c);
    zmq_close(router);
    zmq_ctx_term(ctx);
    ts_rmtree(dir);
}
END_TEST

/* reel_gen that gives up (its timeout, no answer) sends CANCEL for its
 * GEN, with the GEN's id and client token (docs/PROTOCOL.md
 * "Cancelling"); one that got its answer sends none. */
START_TEST(test_a_gen_that_times_out_is_cancelled_and_an_answered_one_is_not) {
    char dir[64], ep[128];
    ts_mkdtemp(dir, sizeof dir, "test-client-cancel");
    snprintf(ep, sizeof ep, "ipc://%s/b", dir);
    void *ctx = zmq_ctx_new(), *router = zmq_socket(ctx, ZMQ_ROUTER);
    ck_assert_int_eq(wire_socket_limits(router), 0);
    int tmo = 5000;
    zmq_setsockopt(router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    ck_assert_int_eq(zmq_bind(router, ep), 0);
    reel_client_t *c;
    TS_NEW(c = reel_client_new(ep));
    reel_client_set_liveness(c, 0); /* no STATUS: the GEN, then what follows it */
    reel_gen_t g;
    tiny_gen(&g);
    float out[4 * 2 * 8 * 8];
    reel_gen_result_t res;
    wire_err_t err;
    ck_assert_int_eq(reel_gen(c, &g, out, &res, NULL, NULL, 200, &err), -1);
    ck_assert_str_eq(err.code, WIRE_E_TIMEOUT);
    wire_msg_t m;
    wire_err_t e;
    msg_gen_t *gen = malloc(sizeof *gen);
    ck_assert_int_eq(msg_recv(router, true, 0, &m, &e), 0);
    ck_assert_int_eq(msg_type(&m), MSG_GEN);
    ck_assert_int_eq(msg_gen_decode(&m, gen, &e), 0);
    const uint64_t id = m.id, token = gen->client;
    ck_assert_uint_ne(token, 0);
    wire_msg_close(&m);
    ck_assert_int_eq(msg_recv(router, true, 0, &m, &e), 0);
    ck_assert_int_eq(msg_type(&m), MSG_CANCEL);
    msg_cancel_t x;
    ck_assert_int_eq(msg_cancel_decode(&m, &x, &e), 0);
    ck_assert_uint_eq(m.id, id);
    ck_assert_uint_eq(x.client, token);
    zmq_msg_t who;
    zmq_msg_init(&who);
    ck_assert_int_eq(zmq_msg_copy(&who, &m.identity), 0);
    wire_msg_close(&m);

    /* answered (an ERROR): no CANCEL. A STATUS after the call is the next
     * message, so nothing was sent between. */
    ck_assert_int_eq(msg_send(router, &who, MSG_BUSY, id + 1, &(msg_busy_t){ "full" }, NULL), 0);
    ck_assert_int_eq(reel_gen(c, &g, out, &res, NULL, NULL, 5000, &err), 1); /* BUSY, sent ahead under the next id */
    ck_assert_str_eq(err.code, WIRE_E_BUSY);
    ck_assert_int_eq(msg_recv(router, true, 0, &m, &e), 0);
    ck_assert_int_eq(msg_type(&m), MSG_GEN);
    ck_assert_uint_eq(m.id, id + 1);
    wire_msg_close(&m);
    reel_status_t *st = NULL;
    (void)reel_status(c, &st, 300, &err); /* no broker answers: it times out; the STATUS went */
    reel_status_free(&st);
    ck_assert_int_eq(msg_recv(router, true, 0, &m, &e), 0);
    ck_assert_msg(msg_type(&m) == MSG_STATUS, "after an answered GEN the client sent %s", m.type);
    wire_msg_close(&m);
    zmq_msg_close(&who);
    free(gen);
    reel_client_destroy(&c);
    zmq_close(router);
    zmq_ctx_term(ctx);
    ts_rmtree(dir);
}
END_TEST

/* A SYNC that timed out while the broker was down must not reach the
 * broker that comes back (helper-90 saw the Python client's applied
 * seconds after its caller was told it failed): the client drops what
 * its socket still held. No broker listens while reel_sync times out (a
 * connecting DEALER queues what it sends until one does); then a fake
 * binds the endpoint, and the first message the client's next call
 * brings is that call's STATUS, no SYNC before it. */
START_TEST(test_a_sync_that_timed_out_never_reaches_a_broker_that_comes_back) {
    char dir[64], ep[128];
    ts_mkdtemp(dir, sizeof dir, "test-client-ghost");
    snprintf(ep, sizeof ep, "ipc://%s/b", dir);
    void *ctx = zmq_ctx_new();
    reel_client_t *c;
    TS_NEW(c = reel_client_new(ep));
    reel_client_set_liveness(c, 0);
    reel_sync_result_t res;
    wire_err_t err;
    char sha[65];
    memset(sha, 'a', 64);
    sha[64] = '\0';
    ck_assert_int_eq(reel_sync(c, "transformer", 5, sha, "/w/x.safetensors", 0, &res, 300, &err), -1);
    ck_assert_str_eq(err.code, WIRE_E_TIMEOUT);
    void *router = zmq_socket(ctx, ZMQ_ROUTER); /* the broker, (back) on the endpoint */
    ck_assert_int_eq(wire_socket_limits(router), 0);
    int tmo = 5000;
    zmq_setsockopt(router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    ck_assert_int_eq(zmq_bind(router, ep), 0);
    reel_status_t *st = NULL;
    (void)reel_status(c, &st, 300, &err);
    reel_status_free(&st);
    wire_msg_t m;
    wire_err_t e;
    ck_assert_int_eq(msg_recv(router, true, 0, &m, &e), 0);
    ck_assert_msg(msg_type(&m) == MSG_STATUS, "the returning broker got %s first", m.type);
    wire_msg_close(&m);
    reel_client_destroy(&c);
    zmq_close(router);
    zmq_ctx_term(ctx);
    ts_rmtree(dir);
}
END_TEST

/* reel_client_interrupt (what reelctl gen's SIGINT handler calls) ends a
 * reel_gen waiting on a silent broker: -1 "interrupted", and its GEN is
 * cancelled; a later call returns "interrupted" at once. */
static void *gen_long(void *p) {
    fake_t *f = p;
    reel_gen_t g;
    tiny_gen(&g);
    reel_gen_result_t res;
    f->rc = reel_gen(f->c, &g, f->out, &res, NULL, NULL, 600000, &f->err);
    return NULL;
}

START_TEST(test_an_interrupted_gen_returns_interrupted_and_is_cancelled) {
    fake_t f;
    memset(&f, 0, sizeof f);
    ts_mkdtemp(f.dir, sizeof f.dir, "test-client-int");
    snprintf(f.ep, sizeof f.ep, "ipc://%s/b", f.dir);
    f.ctx = zmq_ctx_new();
    f.router = zmq_socket(f.ctx, ZMQ_ROUTER);
    ck_assert_int_eq(wire_socket_limits(f.router), 0);
    int tmo = 5000;
    zmq_setsockopt(f.router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    ck_assert_int_eq(zmq_bind(f.router, f.ep), 0);
    TS_NEW(f.c = reel_client_new(f.ep));
    reel_client_set_liveness(f.c, 0);
    ck_assert_int_eq(pthread_create(&f.th, NULL, gen_long, &f), 0);
    wire_msg_t m;
    wire_err_t e;
    ck_assert_int_eq(msg_recv(f.router, true, 0, &m, &e), 0); /* the GEN is out: the client waits */
    ck_assert_int_eq(msg_type(&m), MSG_GEN);
    const uint64_t id = m.id;
    wire_msg_close(&m);
    reel_client_interrupt(f.c);
    ck_assert_int_eq(pthread_join(f.th, NULL), 0);
    ck_assert_int_eq(f.rc, -1);
    ck_assert_str_eq(f.err.code, REEL_CLIENT_E_INTERRUPTED);
    ck_assert_int_eq(msg_recv(f.router, true, 0, &m, &e), 0);
    ck_assert_int_eq(msg_type(&m), MSG_CANCEL);
    ck_assert_uint_eq(m.id, id);
    wire_msg_close(&m);
    reel_status_t *st = NULL;
    wire_err_t err;
    ck_assert_int_eq(reel_status(f.c, &st, 600000, &err), -1); /* at once: not after 600 s */
    ck_assert_str_eq(err.code, REEL_CLIENT_E_INTERRUPTED);
    reel_client_destroy(&f.c);
    zmq_close(f.router);
    zmq_ctx_term(f.ctx);
    ts_rmtree(f.dir);
}
END_TEST

START_TEST(test_a_result_names_the_boot_the_next_call_starts_from) {
    run(boot_from_result, LIVENESS_MS, "boot from a result");
}
END_TEST

START_TEST(test_a_gen_goes_after_a_status_and_again_when_a_status_goes_unanswered) {
    run(silence, LIVENESS_MS, "silence");
}
END_TEST

START_TEST(test_a_gen_goes_again_when_another_boot_answers_and_not_when_the_same_one_does) {
    run(new_boot, LIVENESS_MS, "new boot");
}
END_TEST

START_TEST(test_a_gen_answered_shutdown_goes_again_to_the_broker_that_comes_back) {
    run(shutdown_answer, LIVENESS_MS, "shutdown");
}
END_TEST

START_TEST(test_a_broker_without_a_boot_is_never_resent_to_on_its_word) {
    run(no_boot_broker, LIVENESS_MS, "no boot");
}
END_TEST

START_TEST(test_a_boot_learnt_only_after_a_silence_resends_once_more) {
    run(no_boot_learnt, LIVENESS_MS, "no boot learnt");
}
END_TEST

START_TEST(test_liveness_0_sends_no_status_and_never_resends) {
    run(no_liveness, 0, "liveness 0");
    setenv("REEL_CLIENT_LIVENESS_MS", "0", 1); /* the same from the environment */
    run(no_liveness, -1, "REEL_CLIENT_LIVENESS_MS=0");
    unsetenv("REEL_CLIENT_LIVENESS_MS");
}
END_TEST

/* ---- the handshake watch, and sockets dead for good ---------------------------------- */

/* A TCP port that accepts every connection and closes it at once: a
 * broker that hangs up every handshake (one with keys, to a client
 * without). Counts them; waits for them (hangup_wait), never sleeps. */
typedef struct {
    int fd;
    char ep[64];
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long accepts;
} hangup_t;

static void *hangup_main(void *p) {
    hangup_t *h = p;
    for (;;) {
        int s = accept(h->fd, NULL, NULL);
        if (s < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return NULL; /* hangup_close shut it */
        }
        /* counted before the hang-up: a peer that sees its connection
         * closed finds it counted (the marker of the test below read the
         * count between the close and the count, under ASan) */
        pthread_mutex_lock(&h->mu);
        h->accepts++;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        close(s);
    }
}

static void hangup_open(hangup_t *h) {
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t n = sizeof a;
    ck_assert_int_ge(h->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), 0);
    ck_assert_int_eq(bind(h->fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(h->fd, 512), 0);
    ck_assert_int_eq(getsockname(h->fd, (struct sockaddr *)&a, &n), 0);
    snprintf(h->ep, sizeof h->ep, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
    ck_assert_int_eq(pthread_create(&h->th, NULL, hangup_main, h), 0);
}

/* Until n more connections were hung up; false after 60 s without them. */
static bool hangup_wait(hangup_t *h, long n) {
    struct timespec by;
    clock_gettime(CLOCK_REALTIME, &by);
    by.tv_sec += 60;
    pthread_mutex_lock(&h->mu);
    long want = h->accepts + n;
    while (h->accepts < want && pthread_cond_timedwait(&h->cv, &h->mu, &by) != ETIMEDOUT) {}
    bool got = h->accepts >= want;
    pthread_mutex_unlock(&h->mu);
    return got;
}

static void hangup_close(hangup_t *h) {
    shutdown(h->fd, SHUT_RDWR); /* accept() returns: the thread ends */
    pthread_join(h->th, NULL);
    close(h->fd);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

/* A reel_status run on a thread of its own. */
typedef struct {
    reel_client_t *c;
    int timeout_ms, rc;
    wire_err_t err;
    pthread_t th;
} bg_status_t;

static void *status_main(void *p) {
    bg_status_t *b = p;
    reel_status_t *s = NULL;
    b->rc = reel_status(b->c, &s, b->timeout_ms, &b->err);
    reel_status_free(&s);
    return NULL;
}

/* reel_client_new checked each endpoint of its list with a socket it
 * connected and closed at once: every client made, called or not, opened
 * a connection to its broker (and, with keys, a handshake the broker
 * refused or counted). The endpoints are checked without a socket now:
 * ten clients of a two-broker list made and destroyed reach nobody, and
 * the check still refuses what no connect could take (a port out of
 * range, which a connect took and retried for ever). A marker connection
 * made after them is hung up only once every connection queued before it
 * was accepted: the count then is exact, without waiting on time. */
START_TEST(test_a_client_made_reaches_no_broker_before_its_first_call) {
    hangup_t h;
    hangup_open(&h);
    char list[160];
    snprintf(list, sizeof list, "%s,%s", h.ep, h.ep);
    for (int i = 0; i < 10; i++) {
        reel_client_t *c;
        TS_NEW(c = reel_client_new(i % 2 ? list : h.ep));
        reel_client_destroy(&c); /* (zmq_ctx_term: whatever its threads connected is queued by now) */
    }
    struct sockaddr_in a = { .sin_family = AF_INET };
    socklen_t n = sizeof a;
    ck_assert_int_eq(getsockname(h.fd, (struct sockaddr *)&a, &n), 0);
    int m = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = { 30, 0 };
    ck_assert_int_eq(setsockopt(m, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    ck_assert_int_eq(connect(m, (struct sockaddr *)&a, sizeof a), 0);
    char byte;
    ck_assert_msg(recv(m, &byte, 1, 0) == 0, "the marker connection was not hung up");
    close(m);
    pthread_mutex_lock(&h.mu);
    long accepts = h.accepts;
    pthread_mutex_unlock(&h.mu);
    ck_assert_msg(accepts == 1, "%ld connections before the marker's: clients made reached the broker", accepts - 1);
    static const struct {
        const char *ep, *says;
    } bad[] = {
        { "tcp://127.0.0.1:70000", "port 70000 is not in 1..65535" },
        { "tcp://127.0.0.1", "expected tcp://HOST:PORT" },
        { "tcp://127.0.0.1:5555,udp://127.0.0.1:5555", "'udp://127.0.0.1:5555': expected tcp://HOST:PORT" },
        { "ipc://", "without a path" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        reel_client_t *c = reel_client_new(bad[i].ep);
        ck_assert_msg(c == NULL, "'%s' was taken", bad[i].ep);
        ck_assert_int_eq(reel_err_code(), REEL_E_INVALID);
        ck_assert_msg(strstr(reel_err_text(), bad[i].says), "'%s': %s", bad[i].ep, reel_err_text());
    }
    hangup_close(&h);
}
END_TEST

/* The client watched its socket's handshakes (libzmq's monitor, for the
 * hints of a timeout) from its creation until a handshake succeeded, its
 * event pipe unbounded: idle with a connection that kept failing (3
 * events a failed handshake; ~20 a second at libzmq's pace), it piled
 * them up (20,000 failed handshakes: 60,000 events, +7.5 MB). Now the
 * watch runs only while a call runs: nothing is read or held between
 * calls, and the next call still says why. */
START_TEST(test_an_idle_client_whose_handshakes_fail_holds_one_socket_piles_up_nothing_and_its_next_call_says_why) {
    const char *said = "the broker closed every handshake";
    hangup_t h;
    hangup_open(&h);
    reel_client_t *c;
    TS_NEW(c = reel_client_new(h.ep));
    reel_client_sockets_t k;
    reel_client_sockets(c, &k);
    ck_assert_int_eq(k.sockets, 0); /* nothing before the first call */
    reel_status_t *s = NULL;
    wire_err_t err;
    ck_assert_int_eq(reel_status(c, &s, 1000, &err), -1);
    ck_assert_str_eq(err.code, WIRE_E_TIMEOUT);
    ck_assert_msg(strstr(err.message, said), "the first call: %s", err.message);
    reel_client_sockets(c, &k);
    ck_assert_int_eq(k.sockets, 1); /* the watch ended with the call */
    const uint64_t seen = k.hs_events;
    ck_assert_uint_gt(seen, 0);
    ck_assert_msg(hangup_wait(&h, 30), "the client stopped trying to connect");
    reel_client_sockets(c, &k);
    ck_assert_msg(k.sockets == 1, "%d sockets held while idle: a watch whose events pile up", k.sockets);
    ck_assert_uint_eq(k.hs_events, seen);
    ck_assert_int_eq(reel_status(c, &s, 1000, &err), -1);
    ck_assert_str_eq(err.code, WIRE_E_TIMEOUT);
    ck_assert_msg(strstr(err.message, said), "the next call: %s", err.message);
    reel_client_sockets(c, &k);
    ck_assert_uint_gt(k.hs_events, seen); /* read by that call's own watch */
    ck_assert_int_eq(k.sockets, 1);
    ck_assert_uint_eq(k.fresh, 0); /* libzmq retries a hang-up itself: the socket is not dead */
    reel_client_destroy(&c);
    hangup_close(&h);
}
END_TEST

/* A call that waits long (a GEN's minute) read the events only at its
 * start and at its timeout: its watch's pipe grew meanwhile. Now they
 * are read as they come: a few at a time, however many come. */
START_TEST(test_a_call_reads_the_handshake_events_as_they_come) {
    hangup_t h;
    hangup_open(&h);
    bg_status_t b = { .timeout_ms = 60000 };
    TS_NEW(b.c = reel_client_new(h.ep));
    ck_assert_int_eq(pthread_create(&b.th, NULL, status_main, &b), 0);
    ck_assert_msg(hangup_wait(&h, 40), "the client stopped trying to connect");
    reel_client_interrupt(b.c);
    pthread_join(b.th, NULL);
    ck_assert_int_eq(b.rc, -1);
    ck_assert_str_eq(b.err.code, REEL_CLIENT_E_INTERRUPTED);
    reel_client_sockets_t k;
    reel_client_sockets(b.c, &k);
    ck_assert_int_eq(k.sockets, 1); /* the watch ended with the call */
    ck_assert_uint_ge(k.hs_events, 40); /* one a failed handshake at least (three, as libzmq goes) */
    ck_assert_msg(k.hs_read_most <= 32, "a backlog of %d events at one read", k.hs_read_most);
    reel_client_destroy(&b.c);
    hangup_close(&h);
}
END_TEST

/* A ZAP handler (RFC 27) on ctx: refuses every key (400) until `admit`,
 * then admits it (200). Counts the handshakes it was asked about. */
typedef struct {
    void *ctx;
    atomic_bool admit, stop;
    atomic_int asked;
    pthread_t th;
    bool bound;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} zap_t;

static void *zap_main(void *p) {
    zap_t *z = p;
    void *rep = zmq_socket(z->ctx, ZMQ_REP);
    int tmo = 50;
    zmq_setsockopt(rep, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    int rc = zmq_bind(rep, "inproc://zeromq.zap.01");
    pthread_mutex_lock(&z->mu);
    z->bound = rc == 0;
    pthread_cond_broadcast(&z->cv);
    pthread_mutex_unlock(&z->mu);
    while (rc == 0 && !atomic_load(&z->stop)) {
        zmq_msg_t f[16];
        int n = 0, more = 1;
        while (more && n < 16) {
            zmq_msg_init(&f[n]);
            if (zmq_msg_recv(&f[n], rep, 0) < 0) {
                zmq_msg_close(&f[n]);
                break;
            }
            more = zmq_msg_more(&f[n++]);
        }
        if (n >= 2 && !more) { /* version, request id, domain, address, identity, mechanism, key */
            atomic_fetch_add(&z->asked, 1);
            const char *code = atomic_load(&z->admit) ? "200" : "400";
            zmq_send(rep, "1.0", 3, ZMQ_SNDMORE);
            zmq_send(rep, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
            zmq_send(rep, code, 3, ZMQ_SNDMORE);
            zmq_send(rep, "", 0, ZMQ_SNDMORE);
            zmq_send(rep, "", 0, ZMQ_SNDMORE);
            zmq_send(rep, "", 0, 0);
        }
        for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    }
    zmq_close(rep);
    return NULL;
}

/* A fake broker with keys: a CURVE ROUTER at an ipc endpoint of dir, its
 * ZAP handler (zap_main) refusing every key until z->admit, and the key
 * files a client needs (dir/dave.key, dir/broker.pub). */
typedef struct {
    char dir[64], ep[128];
    zap_t *z;
    void *router;
} keyed_t;

static void keyed_open(keyed_t *k) {
    ts_mkdtemp(k->dir, sizeof k->dir, "test-client-zap");
    snprintf(k->ep, sizeof k->ep, "ipc://%s/b", k->dir);
    reel_key_t bk, ck;
    TS_OK(reel_key_new(k->dir, REEL_ROLE_BROKER, "broker", &bk));
    TS_OK(reel_key_new(k->dir, REEL_ROLE_CLIENT, "dave", &ck));
    zap_t *z = k->z = calloc(1, sizeof *z);
    ck_assert_ptr_nonnull(z);
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    ck_assert_ptr_nonnull(z->ctx = zmq_ctx_new());
    ck_assert_int_eq(pthread_create(&z->th, NULL, zap_main, z), 0);
    pthread_mutex_lock(&z->mu);
    while (!z->bound) pthread_cond_wait(&z->cv, &z->mu); /* (a failed bind fails below: no ZAP, no refusal) */
    pthread_mutex_unlock(&z->mu);
    k->router = zmq_socket(z->ctx, ZMQ_ROUTER);
    int one = 1, tmo = 10000;
    ck_assert_int_eq(wire_socket_limits(k->router), 0);
    zmq_setsockopt(k->router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    ck_assert_int_eq(zmq_setsockopt(k->router, ZMQ_CURVE_SERVER, &one, sizeof one), 0);
    ck_assert_int_eq(zmq_setsockopt(k->router, ZMQ_CURVE_SECRETKEY, bk.secret_key, 40), 0);
    ck_assert_int_eq(zmq_bind(k->router, k->ep), 0);
    explicit_bzero(&bk, sizeof bk);
    explicit_bzero(&ck, sizeof ck);
}

/* The fake broker answers the next STATUS it receives; false when none
 * came within the router's 10 s. */
static bool keyed_answer_status(keyed_t *k) {
    wire_msg_t m;
    wire_err_t e;
    if (msg_recv(k->router, true, 0, &m, &e) != 0) return false;
    bool status = msg_type(&m) == MSG_STATUS;
    msg_status_reply_t r;
    memset(&r, 0, sizeof r);
    if (status) ck_assert_int_eq(msg_send(k->router, &m.identity, MSG_STATUS_REPLY, m.id, &r, NULL), 0);
    wire_msg_close(&m);
    return status;
}

/* Until the ZAP handler was asked about n handshakes in all; false after
 * 10 s without them. */
static bool keyed_wait_asked(keyed_t *k, int n) {
    for (int i = 0; i < 1000 && atomic_load(&k->z->asked) < n; i++)
        nanosleep(&(struct timespec){ 0, 10 * 1000000L }, NULL);
    return atomic_load(&k->z->asked) >= n;
}

static void keyed_close(keyed_t *k) {
    zmq_close(k->router);
    atomic_store(&k->z->stop, true);
    pthread_join(k->z->th, NULL);
    zmq_ctx_term(k->z->ctx);
    pthread_cond_destroy(&k->z->cv);
    pthread_mutex_destroy(&k->z->mu);
    free(k->z);
    ts_rmtree(k->dir);
}

/* The ZAP handler refuses a key for good: libzmq never tries that
 * connection again, and the socket keeps no pipe (a call's send blocked
 * for ever there). A call on such a socket opens a fresh one (same
 * endpoint, same keys) after 100 ms, then after twice as long each time
 * up to a second: refused until its timeout, it says the key was
 * refused, having asked the broker a few times (not in a loop: about 5
 * handshakes in 2 s, where a busy retry makes hundreds); the next call
 * starts on a fresh socket too, and once the key is admitted it is
 * answered. (cli_security.sh does the same with reel-broker and reelctl
 * top.) */
START_TEST(test_a_client_refused_by_zap_tries_fresh_sockets_with_backoff_and_says_why) {
    keyed_t k;
    keyed_open(&k);
    bg_status_t b = { .timeout_ms = 2000 };
    TS_NEW(b.c = reel_client_new_keys(k.ep, ts_join(k.dir, "dave.key"), ts_join(k.dir, "broker.pub")));
    const char *said = "the broker refused this client's key at the handshake (ZAP status 400";
    reel_client_sockets_t s;
    uint64_t fresh = 0;
    for (int call = 0; call < 2; call++) {
        int asked = atomic_load(&k.z->asked);
        status_main(&b);
        ck_assert_int_eq(b.rc, -1);
        ck_assert_str_eq(b.err.code, WIRE_E_TIMEOUT);
        ck_assert_msg(strstr(b.err.message, said), "call %d: %s", call + 1, b.err.message);
        int n = atomic_load(&k.z->asked) - asked;
        ck_assert_msg(n >= 2 && n <= 8, "call %d: %d handshakes in 2 s (1 with no retry, hundreds in a loop)",
                      call + 1, n);
        reel_client_sockets(b.c, &s);
        ck_assert_uint_ge(s.fresh, fresh + (uint64_t)n - 1); /* each handshake but the first: a fresh socket */
        fresh = s.fresh;
        ck_assert_int_eq(s.sockets, 1); /* the watch ended with the call */
    }
    atomic_store(&k.z->admit, true); /* the key added and reloaded */
    b.timeout_ms = 30000;
    ck_assert_int_eq(pthread_create(&b.th, NULL, status_main, &b), 0);
    ck_assert_msg(keyed_answer_status(&k), "the client's third call never reached the broker");
    pthread_join(b.th, NULL);
    ck_assert_msg(b.rc == 0, "the call after the key was admitted: %s: %s", b.err.code, b.err.message);
    reel_client_sockets(b.c, &s);
    ck_assert_uint_eq(s.fresh, fresh + 1); /* call_begin's, for the socket refused at the last call */
    ck_assert_int_eq(s.sockets, 1); /* answered: no watch */
    reel_client_destroy(&b.c);
    keyed_close(&k);
}
END_TEST

/* A call already waiting when the key is admitted (an operator adds it and
 * reloads the broker) goes through: its socket, refused, was never tried
 * again during the call, and the call timed out with the key long
 * admitted. The call below waits up to 30 s; the key is admitted once the
 * broker has refused it twice (the call's second socket); the STATUS then
 * reaches the broker within a second or so, on a fresh socket. */
START_TEST(test_a_call_waiting_when_its_key_is_admitted_goes_through) {
    keyed_t k;
    keyed_open(&k);
    bg_status_t b = { .timeout_ms = 30000 };
    TS_NEW(b.c = reel_client_new_keys(k.ep, ts_join(k.dir, "dave.key"), ts_join(k.dir, "broker.pub")));
    ck_assert_int_eq(pthread_create(&b.th, NULL, status_main, &b), 0);
    bool twice = keyed_wait_asked(&k, 2);
    atomic_store(&k.z->admit, true);
    bool reached = keyed_answer_status(&k);
    pthread_join(b.th, NULL);
    ck_assert_msg(twice, "the waiting call tried no fresh socket after its key was refused (%d handshake)",
                  atomic_load(&k.z->asked));
    ck_assert_msg(reached, "the waiting call never reached the broker once its key was admitted");
    ck_assert_msg(b.rc == 0, "the waiting call: %s: %s", b.err.code, b.err.message);
    reel_client_sockets_t s;
    reel_client_sockets(b.c, &s);
    ck_assert_uint_ge(s.fresh, 2);
    ck_assert_int_eq(s.sockets, 1);
    reel_client_destroy(&b.c);
    keyed_close(&k);
}
END_TEST

/* A GEN waiting when its key is admitted reaches the broker too, and its
 * answer ends the call (with a liveness of 200 ms: the STATUS pings and
 * resends of call_live go on the fresh sockets as well). */
typedef struct {
    reel_client_t *c;
    int rc;
    wire_err_t err;
    pthread_t th;
} bg_gen_t;

static void *gen_main(void *p) {
    bg_gen_t *b = p;
    reel_gen_t g;
    tiny_gen(&g);
    float out[4 * 2 * 8 * 8];
    reel_gen_result_t res;
    b->rc = reel_gen(b->c, &g, out, &res, NULL, NULL, 30000, &b->err);
    return NULL;
}

START_TEST(test_a_gen_waiting_when_its_key_is_admitted_reaches_the_broker) {
    keyed_t k;
    keyed_open(&k);
    bg_gen_t b = { 0 };
    TS_NEW(b.c = reel_client_new_keys(k.ep, ts_join(k.dir, "dave.key"), ts_join(k.dir, "broker.pub")));
    reel_client_set_liveness(b.c, 200);
    ck_assert_int_eq(pthread_create(&b.th, NULL, gen_main, &b), 0);
    bool twice = keyed_wait_asked(&k, 2);
    atomic_store(&k.z->admit, true);
    int gens = 0, statuses = 0;
    for (int i = 0; i < 20 && !gens; i++) { /* STATUS pings answered; the GEN answered ERROR */
        wire_msg_t m;
        wire_err_t e;
        if (msg_recv(k.router, true, 0, &m, &e) != 0) break;
        if (msg_type(&m) == MSG_STATUS) {
            reply_status_to(k.router, &m.identity, m.id, BOOT_A);
            statuses++;
        } else if (msg_type(&m) == MSG_GEN) {
            ck_assert_int_eq(msg_send_error(k.router, &m.identity, m.id, WIRE_E_BAD_REQUEST, "GEN: answered"), 0);
            gens++;
        }
        wire_msg_close(&m);
    }
    pthread_join(b.th, NULL);
    ck_assert_msg(twice, "the waiting GEN tried no fresh socket after its key was refused");
    ck_assert_msg(gens == 1, "the GEN never reached the broker after the key was admitted (%d STATUS did)",
                  statuses);
    ck_assert_msg(b.rc == 1 && !strcmp(b.err.code, WIRE_E_BAD_REQUEST), "the GEN: %d %s: %s", b.rc, b.err.code,
                  b.err.message);
    reel_client_destroy(&b.c);
    keyed_close(&k);
}
END_TEST

/* ---- a round of many GENs (reel_gen_many) against the fake broker --------------------- */

#define ROUND_MAX 8
#define LAT_N (4 * 2 * 8 * 8)

/* A fake broker and a client whose reel_gen_many runs on a thread of its
 * own, over ROUND_MAX requests at most: request i has seed 100 + i, and
 * the fake answers each with the latent g_lat + seed (lat_of). */
typedef struct {
    char dir[64], ep[128];
    void *ctx, *router;
    reel_client_t *c;
    zmq_msg_t who;
    bool have_who;
    pthread_t th;
    bool running;
    reel_gen_item_t items[ROUND_MAX];
    float outs[ROUND_MAX][LAT_N];
    size_t n, failed;
    reel_gen_many_t o;
    int rc;
    wire_err_t err;
    /* what progress and done were told, on the client's thread (read after the join) */
    int progress_calls, progress_last, progress_total, progress_backwards;
    int done_calls;
    size_t done_order[2 * ROUND_MAX];
    bool done_latent_ok[ROUND_MAX];
} round_fake_t;

static void lat_of(uint64_t seed, float *out) {
    for (int j = 0; j < LAT_N; j++) out[j] = g_lat[j] + (float)seed;
}

static void round_progress(void *user, int done, int total) {
    round_fake_t *f = user;
    if (done < f->progress_last) f->progress_backwards++;
    f->progress_calls++;
    f->progress_last = done;
    f->progress_total = total;
}

static void round_done(void *user, size_t i, reel_gen_item_t *it, const float *latent) {
    round_fake_t *f = user;
    if (f->done_calls < 2 * ROUND_MAX) f->done_order[f->done_calls] = i;
    f->done_calls++;
    if (latent && it->rc == 0) {
        float want[LAT_N];
        lat_of(it->g.seed, want);
        f->done_latent_ok[i] = !memcmp(latent, want, sizeof want);
    }
}

static void *round_main(void *p) {
    round_fake_t *f = p;
    f->rc = reel_gen_many(f->c, f->items, f->n, &f->o, &f->failed, &f->err);
    return NULL;
}

/* n requests, window, timeout_ms, keep_going; the client's liveness
 * (0: no STATUS, only the GENs); the round started. */
static round_fake_t *round_open(size_t n, int window, int timeout_ms, bool keep_going, int liveness_ms) {
    round_fake_t *f = calloc(1, sizeof *f);
    ck_assert_ptr_nonnull(f);
    ts_mkdtemp(f->dir, sizeof f->dir, "test-client-round");
    snprintf(f->ep, sizeof f->ep, "ipc://%s/b", f->dir);
    ck_assert_ptr_nonnull(f->ctx = zmq_ctx_new());
    ck_assert_ptr_nonnull(f->router = zmq_socket(f->ctx, ZMQ_ROUTER));
    ck_assert_int_eq(wire_socket_limits(f->router), 0);
    int tmo = 10000;
    zmq_setsockopt(f->router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    ck_assert_int_eq(zmq_bind(f->router, f->ep), 0);
    TS_NEW(f->c = reel_client_new(f->ep));
    reel_client_set_liveness(f->c, liveness_ms);
    f->n = n;
    for (size_t i = 0; i < n; i++) {
        tiny_gen(&f->items[i].g);
        f->items[i].g.seed = 100 + i;
        f->items[i].out = f->outs[i];
    }
    f->o = (reel_gen_many_t){ .window = window, .timeout_ms = timeout_ms, .keep_going = keep_going,
                              .progress = round_progress, .done = round_done, .user = f };
    ck_assert_int_eq(pthread_create(&f->th, NULL, round_main, f), 0);
    f->running = true;
    return f;
}

/* The next message the client sent (within 10 s): its type, id, and for a
 * GEN its seed (each GEN carries the client's token and progress asked). */
static msg_type_t round_next(round_fake_t *f, uint64_t *id, uint64_t *seed) {
    wire_msg_t m;
    wire_err_t err;
    ck_assert_msg(msg_recv(f->router, true, 0, &m, &err) == 0, "nothing (readable) from the client within 10 s");
    if (!f->have_who) {
        zmq_msg_init(&f->who);
        ck_assert_int_eq(zmq_msg_copy(&f->who, &m.identity), 0);
        f->have_who = true;
    }
    msg_type_t t = msg_type(&m);
    *id = m.id;
    if (t == MSG_GEN) {
        msg_gen_t *g = malloc(sizeof *g);
        ck_assert_ptr_nonnull(g);
        ck_assert_msg(msg_gen_decode(&m, g, &err) == 0, "%s", err.message);
        ck_assert_uint_ne(g->client, 0);
        ck_assert_msg(g->progress, "a round with a progress function asks for PROGRESS");
        if (seed) *seed = g->seed;
        free(g);
    }
    wire_msg_close(&m);
    return t;
}

/* The next message, which must be a GEN: its id; *seed its seed. */
static uint64_t round_gen(round_fake_t *f, uint64_t *seed) {
    uint64_t id;
    msg_type_t t = round_next(f, &id, seed);
    ck_assert_msg(t == MSG_GEN, "the client sent %s, not a GEN", msg_type_name(t));
    return id;
}

/* Nothing comes from the client within ms (a silent broker's wait: what
 * must not be sent is not). */
static void round_quiet(round_fake_t *f, int ms, const char *why) {
    zmq_pollitem_t it = { f->router, 0, ZMQ_POLLIN, 0 };
    ck_assert_msg(zmq_poll(&it, 1, ms) == 0, "the client sent more %s", why);
}

/* A RESULT of GEN id (the latent of seed) from the broker of boot id boot
 * (0: none named). */
static void round_result_boot(round_fake_t *f, uint64_t id, uint64_t seed, uint64_t boot) {
    float lat[LAT_N];
    lat_of(seed, lat);
    msg_result_t r;
    memset(&r, 0, sizeof r);
    r.version = 1;
    r.boot = boot;
    const int64_t ls[4] = { 4, 2, 8, 8 };
    wire_tensor_t t = ts_wire_tensor("latent", KERN_F32, 4, ls, lat, sizeof lat);
    r.latent = &t;
    ck_assert_int_eq(msg_send(f->router, &f->who, MSG_RESULT, id, &r, NULL), 0);
}

static void round_result(round_fake_t *f, uint64_t id, uint64_t seed) { round_result_boot(f, id, seed, 0); }

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void round_progress_of(round_fake_t *f, uint64_t id, int step, int steps) {
    msg_progress_t p = { .step = (uint64_t)step, .steps = (uint64_t)steps };
    ck_assert_int_eq(msg_send(f->router, &f->who, MSG_PROGRESS, id, &p, NULL), 0);
}

static void round_error(round_fake_t *f, uint64_t id, const char *code, const char *text) {
    msg_error_t e;
    memset(&e, 0, sizeof e);
    snprintf(e.code, sizeof e.code, "%s", code);
    snprintf(e.message, sizeof e.message, "%s", text);
    ck_assert_int_eq(msg_send(f->router, &f->who, MSG_ERROR, id, &e, NULL), 0);
}

static void round_busy(round_fake_t *f, uint64_t id) {
    msg_busy_t b;
    memset(&b, 0, sizeof b);
    snprintf(b.message, sizeof b.message, "queue full (1 requests waiting)");
    ck_assert_int_eq(msg_send(f->router, &f->who, MSG_BUSY, id, &b, NULL), 0);
}

/* The next message must be a CANCEL of GEN id with the client's token. */
static void round_cancel(round_fake_t *f, uint64_t id) {
    uint64_t got;
    msg_type_t t = round_next(f, &got, NULL);
    ck_assert_msg(t == MSG_CANCEL, "the client sent %s, not a CANCEL", msg_type_name(t));
    ck_assert_uint_eq(got, id);
}

static void round_join(round_fake_t *f) {
    if (f->running) pthread_join(f->th, NULL);
    f->running = false;
}

/* Item i got its RESULT, bitwise the latent the fake sent for its seed. */
static void round_item_ok(round_fake_t *f, size_t i) {
    float want[LAT_N];
    ck_assert_msg(f->items[i].rc == 0, "requests[%zu]: rc %d %s: %s", i, f->items[i].rc, f->items[i].err.code,
                  f->items[i].err.message);
    lat_of(100 + i, want);
    ck_assert_mem_eq(f->outs[i], want, sizeof want);
    ck_assert_msg(f->done_latent_ok[i], "done was not given requests[%zu]'s latent", i);
}

static void round_close(round_fake_t *f) {
    round_join(f);
    reel_client_destroy(&f->c);
    if (f->have_who) zmq_msg_close(&f->who);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
    if (ts_rmtree(f->dir)) fprintf(stderr, "could not remove %s\n", f->dir);
    free(f);
}

/* Window 3 of 7 requests: 3 GENs go, then nothing until one is answered,
 * then exactly one more per answer, in the order given; each GEN its own
 * id; the results land in their items, whatever order they come in;
 * progress counts every request's steps (2 each: 14 in all) and never
 * goes back; the client holds one socket after it, as after any call. */
START_TEST(test_a_round_keeps_at_most_its_window_in_flight_and_sends_one_more_per_answer) {
    round_fake_t *f = round_open(7, 3, 20000, false, 0);
    uint64_t id[7], seed;
    for (int i = 0; i < 3; i++) {
        id[i] = round_gen(f, &seed);
        ck_assert_uint_eq(seed, 100 + (uint64_t)i); /* in the order given */
        for (int j = 0; j < i; j++) ck_assert_uint_ne(id[i], id[j]);
    }
    round_quiet(f, 200, "than its window of 3 before an answer");
    round_progress_of(f, id[1], 1, 2);
    round_result(f, id[1], 101); /* answered out of order */
    for (int i = 3; i < 7; i++) {
        id[i] = round_gen(f, &seed);
        ck_assert_uint_eq(seed, 100 + (uint64_t)i);
        round_quiet(f, 100, "than one GEN for one answer");
        int answer = i == 3 ? 0 : i == 4 ? 2 : i - 2; /* a request in flight */
        round_result(f, id[answer], 100 + (uint64_t)answer);
    }
    round_result(f, id[5], 105);
    round_result(f, id[6], 106);
    round_join(f);
    ck_assert_msg(f->rc == 0, "reel_gen_many: %d %s: %s", f->rc, f->err.code, f->err.message);
    ck_assert_uint_eq(f->failed, REEL_GEN_NO_INDEX);
    for (size_t i = 0; i < 7; i++) round_item_ok(f, i);
    ck_assert_int_eq(f->done_calls, 7);
    ck_assert_uint_eq(f->done_order[0], 1);
    ck_assert_int_eq(f->progress_total, 14);
    ck_assert_int_eq(f->progress_last, 14);
    ck_assert_int_eq(f->progress_backwards, 0);
    ck_assert_int_ge(f->progress_calls, 8); /* the PROGRESS, then one per RESULT */
    reel_client_sockets_t k;
    reel_client_sockets(f->c, &k);
    ck_assert_int_eq(k.sockets, 1); /* a round is a call: its handshake watch ended with it */
    round_close(f);
}
END_TEST

/* Window 4 of 6: two answered BUSY. They are not sent again at once (the
 * broker's queue is full: nothing goes until another is answered); the
 * window is then what the broker held of the round (2), one more with
 * each answer: the first answer sends the two BUSY ones again, first
 * BUSY first, as new GENs (new ids), before the rest. */
START_TEST(test_a_round_sends_a_busy_request_again_after_another_answer_with_the_window_shrunk) {
    round_fake_t *f = round_open(6, 4, 20000, false, 0);
    uint64_t id[4], seed, again[2];
    for (int i = 0; i < 4; i++) id[i] = round_gen(f, &seed);
    round_busy(f, id[3]);
    round_busy(f, id[2]);
    round_quiet(f, 200, "after a BUSY, before another answer");
    round_result(f, id[0], 100); /* window 2 + 1 = 3, 1 in flight: two go */
    again[0] = round_gen(f, &seed);
    ck_assert_uint_eq(seed, 103); /* the first BUSY first */
    again[1] = round_gen(f, &seed);
    ck_assert_uint_eq(seed, 102);
    round_quiet(f, 200, "than the window that shrank to 2 and grew by 1");
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++) ck_assert_uint_ne(again[k], id[j]); /* a new GEN */
    round_result(f, again[0], 103); /* window 4 (capped), 2 in flight: 4 and 5 go */
    uint64_t id4 = round_gen(f, &seed);
    ck_assert_uint_eq(seed, 104);
    uint64_t id5 = round_gen(f, &seed);
    ck_assert_uint_eq(seed, 105);
    round_result(f, id[1], 101);
    round_result(f, again[1], 102);
    round_result(f, id4, 104);
    round_result(f, id5, 105);
    round_join(f);
    ck_assert_msg(f->rc == 0, "reel_gen_many: %d %s: %s", f->rc, f->err.code, f->err.message);
    for (size_t i = 0; i < 6; i++) round_item_ok(f, i);
    ck_assert_int_eq(f->items[2].busy, 1);
    ck_assert_int_eq(f->items[3].busy, 1);
    ck_assert_int_eq(f->items[0].busy + f->items[1].busy + f->items[4].busy + f->items[5].busy, 0);
    round_close(f);
}
END_TEST

/* A BUSY with nothing else of the round in flight (the queue is full of
 * others' requests): that request fails "busy" with its index; the rest
 * is never sent, or with keep_going fails "busy" too, each told to done. */
START_TEST(test_a_busy_with_none_of_the_round_in_flight_fails_with_its_index) {
    for (int keep = 0; keep < 2; keep++) {
        round_fake_t *f = round_open(3, 1, 20000, keep, 0);
        uint64_t seed, id = round_gen(f, &seed);
        round_result(f, id, 100);
        id = round_gen(f, &seed);
        ck_assert_uint_eq(seed, 101);
        round_busy(f, id);
        round_join(f);
        ck_assert_int_eq(f->rc, 1);
        ck_assert_uint_eq(f->failed, 1);
        ck_assert_str_eq(f->err.code, WIRE_E_BUSY);
        round_item_ok(f, 0);
        ck_assert_int_eq(f->items[1].rc, 1);
        ck_assert_str_eq(f->items[1].err.code, WIRE_E_BUSY);
        ck_assert_int_eq(f->items[1].busy, 1);
        if (keep) {
            ck_assert_int_eq(f->items[2].rc, 1);
            ck_assert_str_eq(f->items[2].err.code, WIRE_E_BUSY);
            ck_assert_msg(strstr(f->items[2].err.message, "not sent"), "%s", f->items[2].err.message);
            ck_assert_int_eq(f->done_calls, 3);
        } else {
            ck_assert_int_eq(f->items[2].rc, -1);
            ck_assert_str_eq(f->items[2].err.code, REEL_CLIENT_E_NOT_SENT);
            ck_assert_int_eq(f->done_calls, 2);
        }
        round_quiet(f, 100, "after the round ended");
        round_close(f);
    }
}
END_TEST

/* An ERROR in the middle: the round fails with that request's index and
 * error; the one still in flight is cancelled (a CANCEL of its id), the
 * rest never sent. With keep_going the others all get their RESULTs, and
 * the call still says which one failed. */
START_TEST(test_an_error_in_the_middle_of_a_round_carries_its_index_and_cancels_the_rest_unless_keep_going) {
    round_fake_t *f = round_open(5, 2, 20000, false, 0);
    uint64_t seed, id0 = round_gen(f, &seed), id1 = round_gen(f, &seed);
    round_result(f, id0, 100);
    uint64_t id2 = round_gen(f, &seed);
    round_error(f, id1, WIRE_E_NO_WORKER, "no live worker serves model tiny");
    round_cancel(f, id2);
    round_join(f);
    ck_assert_int_eq(f->rc, 1);
    ck_assert_uint_eq(f->failed, 1);
    ck_assert_str_eq(f->err.code, WIRE_E_NO_WORKER);
    ck_assert_str_eq(f->err.message, "no live worker serves model tiny");
    round_item_ok(f, 0);
    ck_assert_int_eq(f->items[1].rc, 1);
    ck_assert_str_eq(f->items[1].err.code, WIRE_E_NO_WORKER);
    ck_assert_int_eq(f->items[2].rc, -1);
    ck_assert_str_eq(f->items[2].err.code, WIRE_E_CANCELLED);
    ck_assert_msg(strstr(f->items[2].err.message, "requests[1] failed"), "%s", f->items[2].err.message);
    for (size_t i = 3; i < 5; i++) ck_assert_str_eq(f->items[i].err.code, REEL_CLIENT_E_NOT_SENT);
    round_quiet(f, 100, "after the round ended");
    round_close(f);

    f = round_open(5, 2, 20000, true, 0);
    uint64_t ids[5];
    ids[0] = round_gen(f, &seed);
    ids[1] = round_gen(f, &seed);
    round_error(f, ids[1], WIRE_E_BAD_REQUEST, "GEN: bad");
    ids[2] = round_gen(f, &seed); /* the ERROR made room: the round goes on */
    ck_assert_uint_eq(seed, 102);
    round_result(f, ids[0], 100);
    ids[3] = round_gen(f, &seed);
    ck_assert_uint_eq(seed, 103);
    round_result(f, ids[2], 102);
    ids[4] = round_gen(f, &seed);
    ck_assert_uint_eq(seed, 104);
    round_result(f, ids[3], 103);
    round_result(f, ids[4], 104);
    round_join(f);
    ck_assert_int_eq(f->rc, 1);
    ck_assert_uint_eq(f->failed, 1);
    ck_assert_str_eq(f->err.code, WIRE_E_BAD_REQUEST);
    for (size_t i = 0; i < 5; i++)
        if (i != 1) round_item_ok(f, i);
    ck_assert_int_eq(f->done_calls, 5);
    round_close(f);
}
END_TEST

/* A request whose answer does not come within its timeout fails alone
 * ("timeout", its index in the message) and is cancelled; with
 * keep_going the others go on and get their RESULTs. */
START_TEST(test_a_request_past_its_timeout_fails_with_its_index_and_is_cancelled_while_the_others_go_on) {
    round_fake_t *f = round_open(3, 2, 1500, true, 0);
    uint64_t seed, id0 = round_gen(f, &seed), id1 = round_gen(f, &seed);
    round_result(f, id0, 100);
    uint64_t id2 = round_gen(f, &seed);
    round_result(f, id2, 102);
    round_cancel(f, id1); /* 1.5 s after its send */
    round_join(f);
    ck_assert_int_eq(f->rc, -1);
    ck_assert_uint_eq(f->failed, 1);
    ck_assert_str_eq(f->err.code, WIRE_E_TIMEOUT);
    ck_assert_msg(strstr(f->err.message, "requests[1]") && strstr(f->err.message, "1500 ms"), "%s", f->err.message);
    round_item_ok(f, 0);
    round_item_ok(f, 2);
    ck_assert_int_eq(f->items[1].rc, -1);
    ck_assert_int_eq(f->done_calls, 3);
    round_close(f);
}
END_TEST

/* Each request's timeout counts from its own send, not from the round's
 * start: window 1, timeout 3 s, the fake slow to answer each (2 s: a
 * request sent 2 s into the round still has its 3 s; counted from the
 * start it would be cancelled 1 s after its send, within the fake's
 * silence). The fake's silences are the scenario, a slow broker, and
 * each is a check that nothing comes meanwhile. */
START_TEST(test_each_request_s_timeout_counts_from_its_own_send) {
    round_fake_t *f = round_open(2, 1, 3000, false, 0);
    uint64_t seed, id0 = round_gen(f, &seed);
    round_quiet(f, 2000, "while the broker was slow to answer (a CANCEL too early?)");
    round_result(f, id0, 100);
    uint64_t id1 = round_gen(f, &seed);
    round_quiet(f, 2000, "while the broker was slow to answer the second (its timeout counted from the round's start?)");
    round_result(f, id1, 101);
    round_join(f);
    ck_assert_msg(f->rc == 0, "reel_gen_many: %d %s: %s", f->rc, f->err.code, f->err.message);
    round_item_ok(f, 0);
    round_item_ok(f, 1);
    round_close(f);
}
END_TEST

/* reel_client_interrupt ends a round: -1 "interrupted", no request's
 * index; every request in flight cancelled (a CANCEL of each), the rest
 * never sent. */
START_TEST(test_an_interrupted_round_cancels_every_request_in_flight) {
    round_fake_t *f = round_open(4, 2, 600000, true, 0);
    uint64_t seed, id0 = round_gen(f, &seed), id1 = round_gen(f, &seed);
    reel_client_interrupt(f->c);
    round_join(f);
    ck_assert_int_eq(f->rc, -1);
    ck_assert_str_eq(f->err.code, REEL_CLIENT_E_INTERRUPTED);
    ck_assert_uint_eq(f->failed, REEL_GEN_NO_INDEX);
    uint64_t a, b;
    ck_assert_int_eq(round_next(f, &a, NULL), MSG_CANCEL);
    ck_assert_int_eq(round_next(f, &b, NULL), MSG_CANCEL);
    ck_assert_msg((a == id0 && b == id1) || (a == id1 && b == id0), "CANCELs of %llu and %llu", (unsigned long long)a,
                  (unsigned long long)b);
    for (int i = 0; i < 2; i++) ck_assert_str_eq(f->items[i].err.code, REEL_CLIENT_E_INTERRUPTED);
    for (int i = 2; i < 4; i++) ck_assert_str_eq(f->items[i].err.code, REEL_CLIENT_E_NOT_SENT);
    ck_assert_int_eq(f->done_calls, 0);
    round_close(f);
}
END_TEST

/* A round's requests are checked before any is sent: one that cannot be
 * built fails the call with its index, and nothing reaches the broker. */
START_TEST(test_a_round_with_a_request_that_cannot_be_built_sends_nothing) {
    char dir[64], ep[128];
    ts_mkdtemp(dir, sizeof dir, "test-client-round-bad");
    snprintf(ep, sizeof ep, "ipc://%s/b", dir);
    void *ctx = zmq_ctx_new(), *router = zmq_socket(ctx, ZMQ_ROUTER);
    ck_assert_int_eq(zmq_bind(router, ep), 0);
    reel_client_t *c;
    TS_NEW(c = reel_client_new(ep));
    reel_gen_item_t items[3];
    memset(items, 0, sizeof items);
    float out[LAT_N];
    for (int i = 0; i < 3; i++) {
        tiny_gen(&items[i].g);
        items[i].out = out;
    }
    items[2].g.output = "video"; /* and no reel_decoded_t to return it in */
    size_t failed;
    wire_err_t err;
    ck_assert_int_eq(reel_gen_many(c, items, 3, NULL, &failed, &err), -1);
    ck_assert_uint_eq(failed, 2);
    ck_assert_str_eq(err.code, WIRE_E_BAD_REQUEST);
    ck_assert_msg(strstr(err.message, "requests[2]: "), "%s", err.message);
    reel_gen_many_t o = { .window = 1025 };
    ck_assert_int_eq(reel_gen_many(c, items, 2, &o, &failed, &err), -1);
    ck_assert_uint_eq(failed, REEL_GEN_NO_INDEX);
    ck_assert_str_eq(err.code, WIRE_E_BAD_REQUEST);
    reel_client_sockets_t k;
    reel_client_sockets(c, &k);
    ck_assert_int_eq(k.sockets, 0); /* no call began: no socket, nothing sent */
    zmq_pollitem_t it = { router, 0, ZMQ_POLLIN, 0 };
    ck_assert_int_eq(zmq_poll(&it, 1, 100), 0);
    reel_client_destroy(&c);
    zmq_close(router);
    zmq_ctx_term(ctx);
    ts_rmtree(dir);
}
END_TEST

/* A restarted broker (another boot answers the liveness STATUS) lost
 * every request in flight: each is sent again, with its id, as reel_gen's
 * one is; the round then completes. Resends for silence may come first
 * on a loaded machine (the fake's answers late): they send the same
 * GENs, so only the ids are checked. */
START_TEST(test_a_round_sends_every_request_in_flight_again_when_another_boot_answers) {
    round_fake_t *f = round_open(2, 2, 20000, false, LIVENESS_MS);
    uint64_t id, ping = 0, gens[2] = { 0 }, seed;
    int n_gens = 0;
    while (n_gens < 2 || !ping) { /* a STATUS first, then the two GENs */
        msg_type_t t = round_next(f, &id, &seed);
        if (t == MSG_STATUS) ping = ping ? ping : id;
        else if (n_gens < 2 && id != gens[0]) gens[n_gens++] = id;
    }
    reply_status_to(f->router, &f->who, ping, BOOT_A);
    bool again[2] = { false, false }, restarted = false;
    while (!again[0] || !again[1]) {
        msg_type_t t = round_next(f, &id, &seed);
        if (t == MSG_STATUS) {
            reply_status_to(f->router, &f->who, id, BOOT_B); /* a restarted broker answers */
            restarted = true;
        } else if (restarted) {
            ck_assert_int_eq(t, MSG_GEN);
            ck_assert_msg(id == gens[0] || id == gens[1], "a GEN sent again under a new id");
            again[id == gens[1]] = true;
        }
    }
    round_result(f, gens[0], 100);
    round_result(f, gens[1], 101);
    round_join(f);
    ck_assert_msg(f->rc == 0, "reel_gen_many: %d %s: %s", f->rc, f->err.code, f->err.message);
    round_item_ok(f, 0);
    round_item_ok(f, 1);
    ck_assert_uint_ge(reel_client_resends(f->c), 2);
    round_close(f);
}
END_TEST

/* A round waiting when its key is admitted goes through as reel_gen does:
 * its socket refused, every GEN in flight (sent on it and dropped there)
 * goes again on a fresh one (with backoff), and the requests the window
 * held back follow as answers come; the round completes, each request's
 * RESULT in its item (a liveness of 200 ms: the STATUS pings go on the
 * fresh sockets too). */
typedef struct {
    reel_client_t *c;
    reel_gen_item_t items[3];
    float outs[3][LAT_N];
    size_t failed;
    int rc;
    wire_err_t err;
    pthread_t th;
} bg_round_t;

static void *bg_round_main(void *p) {
    bg_round_t *b = p;
    for (size_t i = 0; i < 3; i++) {
        tiny_gen(&b->items[i].g);
        b->items[i].g.seed = 100 + i;
        b->items[i].out = b->outs[i];
    }
    reel_gen_many_t o = { .window = 2, .timeout_ms = 30000 };
    b->rc = reel_gen_many(b->c, b->items, 3, &o, &b->failed, &b->err);
    return NULL;
}

START_TEST(test_a_round_waiting_when_its_key_is_admitted_sends_its_requests_in_flight_again_and_completes) {
    keyed_t k;
    keyed_open(&k);
    bg_round_t *b = calloc(1, sizeof *b);
    ck_assert_ptr_nonnull(b);
    TS_NEW(b->c = reel_client_new_keys(k.ep, ts_join(k.dir, "dave.key"), ts_join(k.dir, "broker.pub")));
    reel_client_set_liveness(b->c, 200);
    ck_assert_int_eq(pthread_create(&b->th, NULL, bg_round_main, b), 0);
    bool twice = keyed_wait_asked(&k, 2);
    atomic_store(&k.z->admit, true);
    uint64_t answered[3] = { 0 };
    int n_answered = 0, statuses = 0;
    for (int i = 0; i < 60 && n_answered < 3; i++) { /* STATUS pings answered; each GEN's first copy a RESULT */
        wire_msg_t m;
        wire_err_t e;
        if (msg_recv(k.router, true, 0, &m, &e) != 0) break;
        if (msg_type(&m) == MSG_STATUS) {
            reply_status_to(k.router, &m.identity, m.id, BOOT_A);
            statuses++;
        } else if (msg_type(&m) == MSG_GEN) {
            bool seen = false;
            for (int j = 0; j < n_answered; j++) seen |= answered[j] == m.id;
            msg_gen_t *g = malloc(sizeof *g);
            ck_assert_ptr_nonnull(g);
            ck_assert_msg(msg_gen_decode(&m, g, &e) == 0, "%s", e.message);
            if (!seen) {
                float lat[LAT_N];
                lat_of(g->seed, lat);
                msg_result_t r;
                memset(&r, 0, sizeof r);
                r.version = 1;
                r.boot = BOOT_A;
                const int64_t ls[4] = { 4, 2, 8, 8 };
                wire_tensor_t t = ts_wire_tensor("latent", KERN_F32, 4, ls, lat, sizeof lat);
                r.latent = &t;
                ck_assert_int_eq(msg_send(k.router, &m.identity, MSG_RESULT, m.id, &r, NULL), 0);
                answered[n_answered++] = m.id;
            }
            free(g);
        }
        wire_msg_close(&m);
    }
    pthread_join(b->th, NULL);
    ck_assert_msg(twice, "the waiting round tried no fresh socket after its key was refused");
    ck_assert_msg(n_answered == 3, "%d of the round's 3 GENs reached the broker after the key was admitted "
                  "(%d STATUS did)", n_answered, statuses);
    ck_assert_msg(b->rc == 0, "reel_gen_many: %d %s: %s (requests[%zu])", b->rc, b->err.code, b->err.message,
                  b->failed);
    for (size_t i = 0; i < 3; i++) {
        float want[LAT_N];
        ck_assert_msg(b->items[i].rc == 0, "requests[%zu]: %s: %s", i, b->items[i].err.code,
                      b->items[i].err.message);
        lat_of(100 + i, want);
        ck_assert_mem_eq(b->outs[i], want, sizeof want);
    }
    reel_client_sockets_t s;
    reel_client_sockets(b->c, &s);
    ck_assert_uint_ge(s.fresh, 2);
    ck_assert_int_eq(s.sockets, 1);
    reel_client_destroy(&b->c);
    free(b);
    keyed_close(&k);
}
END_TEST

/* A broker restarted quicker than a liveness of silence: a GEN sent
 * before it is lost, one sent since is answered by the new broker, whose
 * RESULT names its boot. The lost one goes again then (its id), not after
 * a silence that the answers to the later ones never leave (a window
 * cycling through the new broker: the lost waited out their timeouts, the
 * window shrunk to those cycling). Liveness 5 s: the resend must come well
 * within it. */
START_TEST(test_a_round_sends_a_request_lost_to_a_restart_again_at_the_first_result_of_the_new_boot) {
    round_fake_t *f = round_open(4, 2, 20000, false, 5000);
    uint64_t id, ping = 0, gens[2] = { 0 }, seed;
    int n_gens = 0;
    while (n_gens < 2 || !ping) { /* a STATUS first, then the two GENs */
        msg_type_t t = round_next(f, &id, &seed);
        if (t == MSG_STATUS) ping = ping ? ping : id;
        else gens[n_gens++] = id;
    }
    reply_status_to(f->router, &f->who, ping, BOOT_A);
    round_result_boot(f, gens[0], 100, BOOT_A);
    uint64_t id2 = round_gen(f, &seed);
    ck_assert_uint_eq(seed, 102);
    /* the broker restarts: GEN gens[1] (seed 101) is lost; id2 reached the new one */
    round_result_boot(f, id2, 102, BOOT_B);
    uint64_t id3 = 0;
    bool again = false;
    int64_t by = mono_ms() + 2000;
    while (!again || !id3) {
        zmq_pollitem_t it = { f->router, 0, ZMQ_POLLIN, 0 };
        int64_t left = by - mono_ms();
        ck_assert_msg(left > 0 && zmq_poll(&it, 1, (long)left) == 1,
                      "GEN %llu, lost to the restart, not sent again within 2 s of the new broker's first RESULT",
                      (unsigned long long)gens[1]);
        msg_type_t t = round_next(f, &id, &seed);
        if (t != MSG_GEN) continue; /* (a STATUS of a slow machine's silence) */
        if (id == gens[1]) {
            ck_assert_uint_eq(seed, 101);
            again = true;
        } else {
            ck_assert_msg(!id3 && seed == 103, "GEN %llu of seed %llu", (unsigned long long)id,
                          (unsigned long long)seed);
            id3 = id;
        }
    }
    round_result_boot(f, gens[1], 101, BOOT_B);
    round_result_boot(f, id3, 103, BOOT_B);
    round_join(f);
    ck_assert_msg(f->rc == 0, "reel_gen_many: %d %s: %s", f->rc, f->err.code, f->err.message);
    for (size_t i = 0; i < 4; i++) round_item_ok(f, i);
    round_close(f);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("client");
    TCase *tc = tcase_create("delivery");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_a_gen_goes_after_a_status_and_again_when_a_status_goes_unanswered);
    tcase_add_test(tc, test_a_gen_that_times_out_is_cancelled_and_an_answered_one_is_not);
    tcase_add_test(tc, test_a_gen_given_no_timeout_waits_by_its_deadline);
    tcase_add_test(tc, test_a_sync_that_timed_out_never_reaches_a_broker_that_comes_back);
    tcase_add_test(tc, test_an_interrupted_gen_returns_interrupted_and_is_cancelled);
    tcase_add_test(tc, test_a_gen_goes_again_when_another_boot_answers_and_not_when_the_same_one_does);
    tcase_add_test(tc, test_a_broker_without_a_boot_is_never_resent_to_on_its_word);
    tcase_add_test(tc, test_a_gen_answered_shutdown_goes_again_to_the_broker_that_comes_back);
    tcase_add_test(tc, test_a_boot_learnt_only_after_a_silence_resends_once_more);
    tcase_add_test(tc, test_a_result_names_the_boot_the_next_call_starts_from);
    tcase_add_test(tc, test_liveness_0_sends_no_status_and_never_resends);
    suite_add_tcase(s, tc);
    tc = tcase_create("sockets");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_a_client_made_reaches_no_broker_before_its_first_call);
    tcase_add_test(tc, test_an_idle_client_whose_handshakes_fail_holds_one_socket_piles_up_nothing_and_its_next_call_says_why);
    tcase_add_test(tc, test_a_call_reads_the_handshake_events_as_they_come);
    tcase_add_test(tc, test_a_client_refused_by_zap_tries_fresh_sockets_with_backoff_and_says_why);
    tcase_add_test(tc, test_a_call_waiting_when_its_key_is_admitted_goes_through);
    tcase_add_test(tc, test_a_gen_waiting_when_its_key_is_admitted_reaches_the_broker);
    suite_add_tcase(s, tc);
    tc = tcase_create("round");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_a_round_keeps_at_most_its_window_in_flight_and_sends_one_more_per_answer);
    tcase_add_test(tc, test_a_round_sends_a_busy_request_again_after_another_answer_with_the_window_shrunk);
    tcase_add_test(tc, test_a_busy_with_none_of_the_round_in_flight_fails_with_its_index);
    tcase_add_test(tc, test_an_error_in_the_middle_of_a_round_carries_its_index_and_cancels_the_rest_unless_keep_going);
    tcase_add_test(tc, test_a_request_past_its_timeout_fails_with_its_index_and_is_cancelled_while_the_others_go_on);
    tcase_add_test(tc, test_each_request_s_timeout_counts_from_its_own_send);
    tcase_add_test(tc, test_an_interrupted_round_cancels_every_request_in_flight);
    tcase_add_test(tc, test_a_round_with_a_request_that_cannot_be_built_sends_nothing);
    tcase_add_test(tc, test_a_round_sends_every_request_in_flight_again_when_another_boot_answers);
    tcase_add_test(tc, test_a_round_waiting_when_its_key_is_admitted_sends_its_requests_in_flight_again_and_completes);
    tcase_add_test(tc, test_a_round_sends_a_request_lost_to_a_restart_again_at_the_first_result_of_the_new_boot);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    /* a plain connection to the fake broker, whatever the caller's environment */
    unsetenv("REEL_KEY");
    unsetenv("REEL_BROKER_KEY");
    unsetenv("REEL_CLIENT_LIVENESS_MS");
    ts_fill_uniform(g_ctx, sizeof g_ctx / sizeof g_ctx[0], 1, -1.f, 1.f);
    ts_fill_uniform(g_lat, sizeof g_lat / sizeof g_lat[0], 2, -1.f, 1.f);
    return ts_run(suite());
}
