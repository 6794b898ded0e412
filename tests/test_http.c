/* test_http.c -- net/http.h: the metrics and health server on a real
 * loopback socket (requests written by hand, answers parsed here), the
 * exposition-text builders, the histogram, and bad addresses. */
#include <arpa/inet.h>
#include <check.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"
#include "net/http.h"
#include "tests/support.h"

/* One request to 127.0.0.1:port; the whole answer into buf (NUL-ended). */
static void ask(int port, const char *method, const char *path, char *buf, size_t len) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = { 5, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[256];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: x\r\n\r\n", method, path);
    ck_assert_int_eq(write(fd, req, (size_t)n), n);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(fd, buf + got, len - 1 - got)) > 0) got += (size_t)r;
    buf[got] = '\0';
    close(fd);
}

static int status_of(const char *answer) {
    int code = 0;
    ck_assert_int_eq(sscanf(answer, "HTTP/1.%*d %d", &code), 1);
    return code;
}

static const char *body_of(const char *answer) {
    const char *b = strstr(answer, "\r\n\r\n");
    ck_assert_ptr_nonnull(b);
    return b + 4;
}

START_TEST(test_serves_the_published_copy_and_health_by_state) {
    reel_http_t *h = reel_http_start("127.0.0.1:0");
    TS_NEW(h);
    int port = reel_http_port(h);
    ck_assert_int_gt(port, 0);
    static char a[65536];
    ask(port, "GET", "/healthz", a, sizeof a); /* nothing published yet */
    ck_assert_int_eq(status_of(a), 503);
    ck_assert_ptr_nonnull(strstr(body_of(a), "starting"));
    ask(port, "GET", "/metrics", a, sizeof a);
    ck_assert_int_eq(status_of(a), 503);
    const char *m = "# HELP x_total X.\n# TYPE x_total counter\nx_total 3\n";
    ck_assert_int_eq(reel_http_publish(h, m, strlen(m), true, false, "not registered"), 0);
    ask(port, "GET", "/metrics", a, sizeof a);
    ck_assert_int_eq(status_of(a), 200);
    ck_assert_str_eq(body_of(a), m);
    ck_assert_ptr_nonnull(strstr(a, "text/plain; version=0.0.4"));
    ask(port, "GET", "/healthz", a, sizeof a);
    ck_assert_int_eq(status_of(a), 200);
    ask(port, "GET", "/readyz", a, sizeof a);
    ck_assert_int_eq(status_of(a), 503);
    ck_assert_ptr_nonnull(strstr(body_of(a), "not registered"));
    ck_assert_int_eq(reel_http_publish(h, m, strlen(m), true, true, NULL), 0);
    ask(port, "GET", "/readyz", a, sizeof a);
    ck_assert_int_eq(status_of(a), 200);
    ck_assert_int_eq(reel_http_publish(h, m, strlen(m), false, true, "weights unusable"), 0);
    ask(port, "GET", "/healthz", a, sizeof a);
    ck_assert_int_eq(status_of(a), 503);
    ck_assert_ptr_nonnull(strstr(body_of(a), "weights unusable"));
    ask(port, "GET", "/nope", a, sizeof a);
    ck_assert_int_eq(status_of(a), 404);
    ask(port, "DELETE", "/metrics", a, sizeof a);
    ck_assert_int_eq(status_of(a), 405);
    ask(port, "HEAD", "/metrics", a, sizeof a);
    ck_assert_int_eq(status_of(a), 200);
    ck_assert_uint_ge(reel_http_scrapes(h), 3);
    /* a second server on the same port: refused, naming it */
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ck_assert_ptr_null(reel_http_start(addr));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), addr));
    reel_http_stop(&h);
    ck_assert_ptr_null(h);
    reel_http_stop(&h); /* NULL-safe */
}
END_TEST


/* A connected socket to 127.0.0.1:port (the test closes it). */
static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Clients that connect and say nothing, stop half-way through a request
 * line, ask for a large /metrics and never read it, send bytes that are
 * not HTTP, or a header of 100 KB: meanwhile and after, every scrape gets
 * the whole published text (the server polls its connections, none of
 * them can hold it up), and the hostile requests get an error or a close,
 * never a crash. */
START_TEST(test_slow_and_hostile_clients_do_not_stop_the_scrapes) {
    reel_http_t *h = reel_http_start("127.0.0.1:0");
    TS_NEW(h);
    int port = reel_http_port(h);
    /* ~1 MB of metrics: more than a socket buffer holds */
    size_t big = 1 << 20;
    char *m = malloc(big + 1);
    ck_assert_ptr_nonnull(m);
    size_t n = 0;
    for (int i = 0; n + 64 < big; i++) n += (size_t)snprintf(m + n, big - n, "x_total{i=\"%d\"} %d\n", i, i);
    ck_assert_int_eq(reel_http_publish(h, m, n, true, true, NULL), 0);
    int fds[24], k = 0;
    for (int i = 0; i < 8; i++) fds[k++] = dial(port); /* silent */
    for (int i = 0; i < 6; i++) {                      /* half a request line */
        fds[k] = dial(port);
        ck_assert_int_eq(write(fds[k++], "GET /metr", 9), 9);
    }
    for (int i = 0; i < 6; i++) { /* a big answer nobody reads */
        fds[k] = dial(port);
        const char *q = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        ck_assert_int_eq(write(fds[k++], q, strlen(q)), (ssize_t)strlen(q));
    }
    { /* not HTTP at all */
        fds[k] = dial(port);
        const char junk[] = "\x16\x03\x01\x00\xff\xfe garbage \r\n\r\n";
        ck_assert_int_eq(write(fds[k++], junk, sizeof junk - 1), (ssize_t)(sizeof junk - 1));
    }
    { /* a 100 KB header */
        fds[k] = dial(port);
        char *hdr = malloc(100 * 1024 + 64);
        ck_assert_ptr_nonnull(hdr);
        int hn = snprintf(hdr, 64, "GET /metrics HTTP/1.1\r\nX-Big: ");
        memset(hdr + hn, 'a', 100 * 1024);
        memcpy(hdr + hn + 100 * 1024, "\r\n\r\n", 4);
        ssize_t w = send(fds[k++], hdr, (size_t)hn + 100 * 1024 + 4, MSG_NOSIGNAL);
        ck_assert_int_gt(w, 0); /* the server may stop reading it part way */
        free(hdr);
    }
    static char a[(1 << 20) + 4096];
    for (int i = 0; i < 5; i++) {
        ask(port, "GET", "/metrics", a, sizeof a);
        ck_assert_int_eq(status_of(a), 200);
        ck_assert_uint_eq(strlen(body_of(a)), n);
        ck_assert_int_eq(memcmp(body_of(a), m, n), 0);
    }
    /* the 100 KB header got an error (or a close), not a body */
    char small[512];
    ssize_t r = recv(fds[k - 1], small, sizeof small - 1, MSG_DONTWAIT);
    if (r > 0) {
        small[r] = '\0';
        ck_assert_msg(status_of(small) >= 400, "a 100 KB header was answered: %s", small);
    }
    for (int i = 0; i < k; i++) close(fds[i]);
    ask(port, "GET", "/healthz", a, sizeof a);
    ck_assert_int_eq(status_of(a), 200);
    ck_assert_uint_ge(reel_http_scrapes(h), 5);
    reel_http_stop(&h);
    free(m);
}
END_TEST

START_TEST(test_bad_addresses_are_refused_naming_them) {
    static const char *bad[] = { "", "9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:x",
                                 "300.1.1.1:9", "[::1:9", "host.example:9" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(reel_http_start(bad[i]) == NULL, "accepted '%s'", bad[i]);
        TS_NEW(strstr(reel_err_text(), "--metrics"));
    }
    reel_http_t *h = reel_http_start("localhost:0");
    TS_NEW(h);
    reel_http_stop(&h);
}
END_TEST

START_TEST(test_text_builders_histogram_and_escaping) {
    reel_text_t t = { 0 };
    reel_prom_family(&t, "a_total", "counter", "A.");
    reel_prom_sample(&t, "a_total", "", 5);
    char esc[64];
    char lb[96];
    snprintf(lb, sizeof lb, "reason=\"%s\"", reel_prom_escape("q\"b\\n\nx", esc, sizeof esc));
    reel_prom_sample(&t, "a_total", lb, 1.5);
    reel_hist_t hs = { 0 };
    reel_hist_observe(&hs, 0.0001);  /* first bucket */
    reel_hist_observe(&hs, 0.003);   /* le 0.005 */
    reel_hist_observe(&hs, 1000);    /* +Inf only */
    reel_prom_hist(&t, "s", "ran=\"eager\"", &hs);
    ck_assert(!t.failed);
    ck_assert_ptr_nonnull(strstr(t.p, "# HELP a_total A.\n# TYPE a_total counter\na_total 5\n"));
    ck_assert_ptr_nonnull(strstr(t.p, "a_total{reason=\"q\\\"b\\\\n\\nx\"} 1.5\n"));
    ck_assert_ptr_nonnull(strstr(t.p, "s_bucket{ran=\"eager\",le=\"0.0005\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(t.p, "s_bucket{ran=\"eager\",le=\"0.005\"} 2\n"));
    ck_assert_ptr_nonnull(strstr(t.p, "s_bucket{ran=\"eager\",le=\"60\"} 2\n"));
    ck_assert_ptr_nonnull(strstr(t.p, "s_bucket{ran=\"eager\",le=\"+Inf\"} 3\n"));
    ck_assert_ptr_nonnull(strstr(t.p, "s_count{ran=\"eager\"} 3\n"));
    /* what Prometheus cannot read is never written: NaN/Inf samples are
     * spelled as the format says, a NaN duration is not observed */
    reel_prom_sample(&t, "n", "", NAN);
    reel_prom_sample(&t, "i", "", INFINITY);
    reel_prom_sample(&t, "f", "", 0.25);
    ck_assert_ptr_nonnull(strstr(t.p, "\nn NaN\n"));
    ck_assert_ptr_nonnull(strstr(t.p, "\ni +Inf\n"));
    ck_assert_ptr_nonnull(strstr(t.p, "\nf 0.25\n"));
    reel_hist_t h2 = { 0 };
    reel_hist_observe(&h2, NAN);
    reel_hist_observe(&h2, -1);
    ck_assert_uint_eq(h2.n, 1);
    ck_assert_uint_eq(h2.counts[0], 1);
    ck_assert(h2.sum == 0);
    ck_assert_str_eq(reel_prom_escape("x", esc, 0), "");
    /* long text grows the buffer */
    for (int i = 0; i < 2000; i++) reel_prom_sample(&t, "many", "", i);
    ck_assert(!t.failed && t.n == strlen(t.p));
    reel_text_free(&t);
    ck_assert_ptr_null(t.p);
}
END_TEST

int main(void) {
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("http");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_serves_the_published_copy_and_health_by_state);
    tcase_add_test(tc, test_slow_and_hostile_clients_do_not_stop_the_scrapes);
    tcase_add_test(tc, test_bad_addresses_are_refused_naming_them);
    tcase_add_test(tc, test_text_builders_histogram_and_escaping);
    suite_add_tcase(s, tc);
    return ts_run(s);
}
