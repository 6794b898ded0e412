/* http.c -- live metrics and health over HTTP (see http.h). */
#include "net/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/clock.h"
#include "base/parse.h"
#include "base/error.h"

#ifndef REEL_NO_HTTP
#include <microhttpd.h>
#endif

/* ---- the server ------------------------------------------------------------------- */

#ifdef REEL_NO_HTTP

reel_http_t *reel_http_start(const char *addr_port) {
    reel_fail(REEL_E_UNSUPPORTED, "--metrics %s: this build has no HTTP server (built without libmicrohttpd)", addr_port);
    return NULL;
}
int reel_http_port(const reel_http_t *h) { (void)h; return 0; }
int reel_http_publish(reel_http_t *h, const char *m, size_t len, bool healthy, bool ready, const char *why) {
    (void)h, (void)m, (void)len, (void)healthy, (void)ready, (void)why;
    return -1;
}
void reel_http_stop(reel_http_t **h) { if (h) *h = NULL; }
uint64_t reel_http_scrapes(const reel_http_t *h) { (void)h; return 0; }

#else

struct reel_http {
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;          /* what follows */
    char *metrics;
    size_t len;
    bool healthy, ready, published;
    char why[256];
    int64_t published_ms;
    atomic_uint_fast64_t scrapes;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                             size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version, (void)upload;
    reel_http_t *h = cls;
    static int first;
    if (!*state) { /* the headers: answer on the next call, with any body read */
        *state = &first;
        return MHD_YES;
    }
    if (*upload_size) { /* a body: ignored */
        *upload_size = 0;
        return MHD_YES;
    }
    const char *text = "text/plain; charset=utf-8";
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, text, "GET or HEAD only\n", 17);
    pthread_mutex_lock(&h->mu);
    bool live = h->published && reel_mono_ms() - h->published_ms <= REEL_HTTP_STALE_MS;
    enum MHD_Result rc;
    if (!strcmp(url, "/metrics")) {
        atomic_fetch_add(&h->scrapes, 1);
        if (!h->published) rc = reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, text, "no metrics yet\n", 15);
        else rc = reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", h->metrics, h->len);
    } else if (!strcmp(url, "/healthz") || !strcmp(url, "/readyz")) {
        bool ok = live && h->healthy && (url[1] == 'h' || h->ready);
        char body[320];
        int n = snprintf(body, sizeof body, "%s\n",
                         ok ? "ok"
                         : !h->published ? "starting"
                         : !live         ? "stalled: the daemon's loop has not published for 10 s"
                         : h->why[0]     ? h->why
                                         : "not ready");
        rc = reply(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text, body,
                   n < (int)sizeof body ? (size_t)n : sizeof body - 1);
    } else {
        rc = reply(c, MHD_HTTP_NOT_FOUND, text, "not found: /metrics, /healthz, /readyz\n", 39);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* "ADDR:PORT" into a socket address. 0, or -1 with a message. */
static int parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len) {
    const char *colon = strrchr(s ? s : "", ':');
    if (!s || !colon || colon == s || !colon[1]) return reel_fail(REEL_E_INVALID, "--metrics '%s': not ADDR:PORT", s ? s : "");
    char host[64];
    size_t hl = (size_t)(colon - s);
    if (hl >= sizeof host) return reel_fail(REEL_E_LIMIT, "--metrics '%s': address too long", s);
    memcpy(host, s, hl);
    host[hl] = '\0';
    int port;
    if (reel_parse_int(colon + 1, 0, 65535, "--metrics port", &port) != 0)
        return reel_fail(REEL_E_INVALID, "--metrics '%s': bad port", s);
    memset(ss, 0, sizeof *ss);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        host[hl - 1] = '\0';
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1) return reel_fail(REEL_E_INVALID, "--metrics '%s': bad IPv6 address", s);
        *len = sizeof *a;
        return 0;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1) return reel_fail(REEL_E_INVALID, "--metrics '%s': bad IPv4 address", s);
    *len = sizeof *a;
    return 0;
}

reel_http_t *reel_http_start(const char *addr_port) {
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    if (parse_addr(addr_port, &ss, &sl) != 0) return NULL;
    reel_http_t *h = calloc(1, sizeof *h);
    if (!h || pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h);
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    /* AUTO: epoll or poll, not select (a broker's sockets can pass FD_SETSIZE) */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)10, MHD_OPTION_END);
    if (!h->d) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        reel_fail(REEL_E_IO, "--metrics %s: cannot serve HTTP there (address in use, or not this host's)", addr_port);
        return NULL;
    }
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = i ? (int)i->port : 0;
    return h;
}

int reel_http_port(const reel_http_t *h) { return h ? h->port : 0; }

uint64_t reel_http_scrapes(const reel_http_t *h) { return h ? atomic_load(&((reel_http_t *)h)->scrapes) : 0; }

int reel_http_publish(reel_http_t *h, const char *metrics, size_t len, bool healthy, bool ready,
                      const char *why) {
    char *copy = malloc(len ? len : 1);
    if (!copy) return reel_fail(REEL_E_NOMEM, "out of memory");
    if (len) memcpy(copy, metrics, len);
    pthread_mutex_lock(&h->mu);
    free(h->metrics);
    h->metrics = copy;
    h->len = len;
    h->healthy = healthy;
    h->ready = ready;
    snprintf(h->why, sizeof h->why, "%s", why ? why : "");
    h->published = true;
    h->published_ms = reel_mono_ms();
    pthread_mutex_unlock(&h->mu);
    return 0;
}

void reel_http_stop(reel_http_t **hp) {
    if (!hp || !*hp) return;
    reel_http_t *h = *hp;
    MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    free(h->metrics);
    free(h);
    *hp = NULL;
}

#endif
