/* test_broker_proc.c -- a real reel-broker process on real sockets, fed
 * malformed, truncated and oversized messages: each gets an ERROR with the
 * right code, and the broker keeps serving. (Process-level: skipped, with a
 * line saying so, in the sanitizer runs of the unit suites.) */
#include <check.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include "schema/msg.h"
#include "schema/wire.h"
#include "tests/support.h"

static pid_t broker_pid;
static void *ctx, *cli;
static char dir[64], cep[128], wep[128];
static int notify_fd = -1;   /* plays systemd: NOTIFY_SOCKET of the broker */
static const char *extra_flag, *extra_value; /* one more broker flag for a test case */

/* Starts the broker process on dir's endpoints and catalog. */
static void spawn(void) {
    char bin[256], db[128];
    snprintf(bin, sizeof bin, "%s/reel-broker", getenv("BUILD") ? getenv("BUILD") : "build");
    snprintf(db, sizeof db, "%s/c.db", dir);
    broker_pid = fork();
    if (broker_pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(126);
        execl(bin, bin, "--clients", cep, "--workers", wep, "--catalog", db, extra_flag, extra_value,
              (char *)NULL);
        _exit(127);
    }
}

static void start(void) {
    ts_mkdtemp(dir, sizeof dir, "test-brk");
    snprintf(cep, sizeof cep, "ipc://%s/c", dir);
    snprintf(wep, sizeof wep, "ipc://%s/w", dir);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/notify", dir);
    notify_fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    ck_assert_int_ge(notify_fd, 0);
    ck_assert_int_eq(bind(notify_fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = { 5, 0 };
    setsockopt(notify_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setenv("NOTIFY_SOCKET", sa.sun_path, 1);
    spawn();
    ctx = zmq_ctx_new();
    cli = zmq_socket(ctx, ZMQ_DEALER);
    wire_socket_limits(cli);
    int t = 5000;
    zmq_setsockopt(cli, ZMQ_RCVTIMEO, &t, sizeof t);
    zmq_connect(cli, cep);
}

static void stop(void) {
    if (notify_fd >= 0) close(notify_fd);
    notify_fd = -1;
    unsetenv("NOTIFY_SOCKET");
    zmq_close(cli);
    zmq_ctx_term(ctx);
    if (broker_pid > 0) {
        kill(broker_pid, SIGTERM);
        int st;
        waitpid(broker_pid, &st, 0);
    }
    if (ts_rmtree(dir)) fprintf(stderr, "could not remove %s\n", dir);
}

/* Sends raw frames (one header frame + n extra). */
static void send_raw(const void *hdr, size_t len, int extra) {
    ck_assert_int_ge(zmq_send(cli, hdr, len, extra ? ZMQ_SNDMORE : 0), 0);
    for (int i = 0; i < extra; i++) ck_assert_int_ge(zmq_send(cli, "abcd", 4, i + 1 < extra ? ZMQ_SNDMORE : 0), 0);
}

/* Receives one answer; returns its type and fills code. */
static const char *answer(wire_msg_t *m, char *code, size_t len) {
    wire_err_t err;
    int rc = wire_recv(cli, false, 0, m, &err);
    ck_assert_msg(rc == 0, "no (valid) answer from the broker: rc %d", rc);
    const char *c = wv_get_str(m->hdr, "code");
    snprintf(code, len, "%s", c ? c : "");
    return m->type;
}

static void expect_error(const char *want_code, const char *what) {
    wire_msg_t m;
    char code[32];
    const char *type = answer(&m, code, sizeof code);
    ck_assert_msg(!strcmp(type, "ERROR") && !strcmp(code, want_code), "%s: got %s %s, want ERROR %s", what,
                  type, code, want_code);
    wire_msg_close(&m);
}

static void expect_still_serving(void) {
    wire_val_t *h = wire_hdr("STATUS", 77);
    ck_assert_int_eq(wire_send(cli, NULL, h, NULL, 0), 0);
    wv_free(&h);
    wire_msg_t m;
    char code[32];
    const char *type = answer(&m, code, sizeof code);
    ck_assert_str_eq(type, "STATUS_REPLY");
    ck_assert_uint_eq(m.id, 77);
    wire_msg_close(&m);
}

static wire_val_t *good_gen(uint64_t id) {
    wire_val_t *h = wire_hdr("GEN", id), *ls = wv_arr();
    for (int i = 0; i < 4; i++) wv_push(ls, wv_u64(i ? 8 : 4));
    wv_set(h, "model", wv_str("tiny"));
    wv_set(h, "steps", wv_u64(2));
    wv_set(h, "latent_shape", ls);
    wv_set(h, "deadline_ms", wv_u64(300));
    return h;
}

static void send_gen(wire_val_t *h) {
    static float c[5 * 32];
    const int64_t cs[2] = { 5, 32 };
    wire_tensor_t t = ts_wire_tensor("context", KERN_F32, 2, cs, c, sizeof c);
    ck_assert_int_eq(wire_send(cli, NULL, h, &t, 1), 0);
    wv_free(&h);
}

START_TEST(test_malformed_truncated_and_oversized_messages_get_errors_and_broker_keeps_serving) {
    expect_still_serving();
    /* garbage bytes (0xc1 is never valid msgpack) */
    send_raw("\xc1\xad\xbe\xef", 4, 0);
    expect_error(WIRE_E_MALFORMED, "garbage");
    /* a map header claiming 2^32-1 entries in 5 bytes: refused before any allocation */
    send_raw("\xdf\xff\xff\xff\xff", 5, 0);
    expect_error(WIRE_E_TOO_LARGE, "huge map header");
    /* a truncated valid header */
    wire_val_t *h = good_gen(1);
    wv_set(h, "proto", wv_str(WIRE_PROTO));
    size_t len;
    unsigned char *enc = wire_encode_header(h, &len);
    wv_free(&h);
    send_raw(enc, len / 2, 0);
    expect_error(WIRE_E_MALFORMED, "truncated");
    /* declared tensors missing / an extra frame */
    send_raw(enc, len, 1);
    expect_error(WIRE_E_MALFORMED, "frame without a descriptor");
    free(enc);
    /* wrong protocol and unknown type */
    h = wv_map();
    wv_set(h, "proto", wv_str("reel/0"));
    wv_set(h, "type", wv_str("GEN"));
    enc = wire_encode_header(h, &len);
    wv_free(&h);
    send_raw(enc, len, 0);
    free(enc);
    expect_error(WIRE_E_PROTO, "wrong proto");
    h = wire_hdr("FROBNICATE", 5);
    wire_send(cli, NULL, h, NULL, 0);
    wv_free(&h);
    expect_error(WIRE_E_UNKNOWN, "unknown type");
    /* a header over the limit */
    char *big = malloc(WIRE_MAX_STR);
    memset(big, 'x', WIRE_MAX_STR - 1);
    big[WIRE_MAX_STR - 1] = 0;
    h = good_gen(6);
    for (int i = 0; i < 70; i++) {
        char k[16];
        snprintf(k, sizeof k, "pad%d", i);
        wv_set(h, k, wv_str(big));
    }
    enc = wire_encode_header(h, &len);
    wv_free(&h);
    send_raw(enc, len, 0);
    free(enc);
    expect_error(WIRE_E_TOO_LARGE, "oversized header");
    /* a GEN just under the limit is accepted: its unknown fields are
     * ignored and not forwarded, so the REQUEST always fits a worker */
    h = good_gen(7);
    for (int i = 0; i < 62; i++) {
        char k[16];
        snprintf(k, sizeof k, "pad%d", i);
        wv_set(h, k, wv_str(big));
    }
    for (int k = 0; k < 4; k++) { /* top up to ~200 bytes under the limit */
        enc = wire_encode_header(h, &len);
        free(enc);
        if (len + 200 + 64 >= (size_t)WIRE_MAX_HEADER) break;
        size_t want = (size_t)WIRE_MAX_HEADER - 200 - len - 16;
        if (want > WIRE_MAX_STR - 1) want = WIRE_MAX_STR - 1;
        big[want] = 0;
        char key[16];
        snprintf(key, sizeof key, "top%d", k);
        wv_set(h, key, wv_str(big));
        big[want] = 'x';
    }
    enc = wire_encode_header(h, &len);
    free(enc);
    ck_assert_uint_gt(len + 1024, WIRE_MAX_HEADER - 256);
    send_gen(h);
    expect_error(WIRE_E_NO_WORKER, "GEN with large unknown fields, accepted (no worker)");
    free(big);
    /* an error found while decoding still answers under the id read
     * before it: here a duplicate key after "id" */
    static const char dup[] = "\x85\xa2id\x29\xa4type\xa3GEN\xa5proto\xa6reel/1\xa1x\x01\xa1x\x02";
    send_raw(dup, sizeof dup - 1, 0);
    wire_msg_t m;
    char code[32];
    ck_assert_str_eq(answer(&m, code, sizeof code), "ERROR");
    ck_assert_str_eq(code, WIRE_E_MALFORMED);
    ck_assert_uint_eq(m.id, 41);
    wire_msg_close(&m);
    /* a GEN with bad fields */
    h = good_gen(8);
    wv_set(h, "steps", wv_u64(0));
    send_gen(h);
    expect_error(WIRE_E_BAD_REQUEST, "steps 0");
    /* still serving: status, and a good GEN is answered (no worker: no_worker) */
    expect_still_serving();
    send_gen(good_gen(9));
    expect_error(WIRE_E_NO_WORKER, "good GEN without workers");
}
END_TEST

/* Receives notifications until one starts with `want`; false on timeout. */
static bool notified(const char *want) {
    char buf[256];
    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(notify_fd, buf, sizeof buf - 1, 0);
        if (n < 0) return false;
        buf[n] = 0;
        if (!strncmp(buf, want, strlen(want))) return true;
    }
    return false;
}

START_TEST(test_broker_tells_systemd_ready_watchdog_and_stopping) {
    ck_assert_msg(notified("READY=1"), "no READY=1 on NOTIFY_SOCKET");
    expect_still_serving(); /* READY means serving */
    ck_assert_msg(notified("WATCHDOG=1"), "no WATCHDOG=1 while running");
    kill(broker_pid, SIGTERM);
    int st;
    waitpid(broker_pid, &st, 0);
    broker_pid = 0;
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "broker exit status %d", st);
    ck_assert_msg(notified("STOPPING=1"), "no STOPPING=1 on shutdown");
}
END_TEST

/* The boot id of the broker answering a STATUS (docs/PROTOCOL.md
 * "Delivery"): 0 when it names none. */
static uint64_t status_boot(void) {
    wire_val_t *h = wire_hdr("STATUS", 78);
    ck_assert_int_eq(wire_send(cli, NULL, h, NULL, 0), 0);
    wv_free(&h);
    wire_msg_t m;
    char code[32];
    ck_assert_str_eq(answer(&m, code, sizeof code), "STATUS_REPLY");
    ck_assert_uint_eq(m.id, 78);
    msg_status_reply_t *r = malloc(sizeof *r);
    wire_err_t err;
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(msg_status_reply_decode(&m, r, &err) == 0, "%s", err.message);
    uint64_t boot = r->boot;
    free(r);
    wire_msg_close(&m);
    return boot;
}

/* A STATUS_REPLY names the broker process: the same boot id for as long
 * as it runs, another once it was restarted (what tells a client its
 * requests were lost with the old one). */
START_TEST(test_status_names_a_boot_id_that_is_new_at_every_start) {
    uint64_t first = status_boot();
    ck_assert_uint_ne(first, 0);
    ck_assert_uint_eq(status_boot(), first);
    kill(broker_pid, SIGTERM);
    int st;
    waitpid(broker_pid, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "broker exit status %d", st);
    spawn(); /* the same endpoints: the client socket reconnects by itself */
    uint64_t second = status_boot();
    ck_assert_uint_ne(second, 0);
    ck_assert_uint_ne(second, first);
    ck_assert_uint_eq(status_boot(), second);
}
END_TEST

static void start_small_hold(void) {
    extra_flag = "--max-held-mb";
    extra_value = "1";
    start();
}

START_TEST(test_requests_beyond_the_held_bytes_limit_get_busy_not_memory) {
    /* No worker: accepted requests stay held until their deadline. */
    static float lat[4 * 4 * 64 * 64]; /* 256 KiB each */
    int busy = 0, held = 0;
    for (int i = 0; i < 8; i++) {
        wire_val_t *h = wire_hdr("GEN", 100 + (uint64_t)i), *ls = wv_arr();
        const int64_t shape[4] = { 4, 4, 64, 64 };
        for (int d = 0; d < 4; d++) wv_push(ls, wv_u64((uint64_t)shape[d]));
        wv_set(h, "model", wv_str("tiny"));
        wv_set(h, "steps", wv_u64(2));
        wv_set(h, "latent_shape", ls);
        wv_set(h, "deadline_ms", wv_u64(1500));
        static float c[5 * 32];
        const int64_t cs[2] = { 5, 32 };
        wire_tensor_t t[2] = { ts_wire_tensor("context", KERN_F32, 2, cs, c, sizeof c),
                               ts_wire_tensor("latent", KERN_F32, 4, shape, lat, sizeof lat) };
        ck_assert_int_eq(wire_send(cli, NULL, h, t, 2), 0);
        wv_free(&h);
    }
    /* 8 x 256 KiB against a 1 MiB limit: the first 3 are held (the 4th would
     * exceed it with the contexts), the rest are BUSY at once; the held ones
     * end with no_worker at their deadline. */
    for (int i = 0; i < 8; i++) {
        wire_msg_t m;
        char code[32];
        const char *type = answer(&m, code, sizeof code);
        if (!strcmp(type, "BUSY")) busy++;
        else if (!strcmp(type, "ERROR") && !strcmp(code, WIRE_E_NO_WORKER)) held++;
        else ck_abort_msg("unexpected answer %s %s", type, code);
        wire_msg_close(&m);
    }
    ck_assert_int_eq(held, 3);
    ck_assert_int_eq(busy, 5);
    expect_still_serving();
}
END_TEST

int main(void) {
    if (getenv("REEL_UNIT_ONLY")) {
        printf("test_broker_proc: SKIP: process-level test, run by the main suite only\n");
        return 0;
    }
    Suite *su = suite_create("broker_proc");
    TCase *tc = tcase_create("bad input");
    tcase_add_checked_fixture(tc, start, stop);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_malformed_truncated_and_oversized_messages_get_errors_and_broker_keeps_serving);
    tcase_add_test(tc, test_broker_tells_systemd_ready_watchdog_and_stopping);
    tcase_add_test(tc, test_status_names_a_boot_id_that_is_new_at_every_start);
    suite_add_tcase(su, tc);
    TCase *th = tcase_create("held bytes");
    tcase_add_checked_fixture(th, start_small_hold, stop);
    tcase_set_timeout(th, 60);
    tcase_add_test(th, test_requests_beyond_the_held_bytes_limit_get_busy_not_memory);
    suite_add_tcase(su, th);
    return ts_run(su);
}
