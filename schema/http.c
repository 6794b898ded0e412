/* http.c -- live metrics and health over HTTP (see http.h). */
#include "schema/http.h"

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

#include "kernels/error.h"

#ifndef REEL_NO_HTTP
#include <microhttpd.h>
#endif

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- text ------------------------------------------------------------------------ */

void reel_text_printf(reel_text_t *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = t->cap - t->n;
        int w = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? room : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            t->failed = true;
            return;
        }
        if (t->p && (size_t)w < room) {
            t->n += (size_t)w;
            return;
        }
        size_t cap = t->cap ? t->cap : 4096;
        while (cap - t->n <= (size_t)w) cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->failed = true;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
}

void reel_text_free(reel_text_t *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

void reel_prom_family(reel_text_t *t, const char *name, const char *type, const char *help) {
    reel_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void reel_prom_sample(reel_text_t *t, const char *name, const char *labels, double value) {
    /* integers print as integers; the format reads both */
    char v[64];
    if (isfinite(value) && fabs(value) < 9e15 && value == trunc(value)) snprintf(v, sizeof v, "%lld", (long long)value);
    else if (isnan(value)) snprintf(v, sizeof v, "NaN");
    else if (isinf(value)) snprintf(v, sizeof v, "%s", value > 0 ? "+Inf" : "-Inf");
    else snprintf(v, sizeof v, "%.17g", value);
    if (labels && labels[0]) reel_text_printf(t, "%s{%s} %s\n", name, labels, v);
    else reel_text_printf(t, "%s %s\n", name, v);
}

const char *reel_prom_escape(const char *in, char *out, size_t len) {
    if (!len) return "";
    size_t o = 0;
    for (const char *p = in ? in : ""; *p && o + 3 < len; p++) {
        if (*p == '\\' || *p == '"') {
            out[o++] = '\\';
            out[o++] = *p;
        } else if (*p == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
    return out;
}

static const double hist_bounds[REEL_HIST_N] = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,   0.5,   1,      2.5,   5,    10,    30,   60 };

void reel_hist_observe(reel_hist_t *h, double s) {
    if (!isfinite(s)) return; /* a NaN would poison _sum for good */
    if (s < 0) s = 0;
    int i = 0;
    while (i < REEL_HIST_N && s > hist_bounds[i]) i++;
    h->counts[i]++;
    h->sum += s;
    h->n++;
}

void reel_prom_hist(reel_text_t *t, const char *name, const char *labels, const reel_hist_t *h) {
    const char *sep = labels && labels[0] ? "," : "";
    const char *lb = labels ? labels : "";
    uint64_t cum = 0;
    for (int i = 0; i <= REEL_HIST_N; i++) {
        cum += h->counts[i];
        if (i < REEL_HIST_N) reel_text_printf(t, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, lb, sep, hist_bounds[i],
                                              (unsigned long long)cum);
        else reel_text_printf(t, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, lb, sep, (unsigned long long)cum);
    }
    if (lb[0]) {
        reel_text_printf(t, "%s_sum{%s} %.17g\n%s_count{%s} %llu\n", name, lb, h->sum, name, lb,
                         (unsigned long long)h->n);
    } else {
        reel_text_printf(t, "%s_sum %.17g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->n);
    }
}

/* ---- the server ------------------------------------------------------------------- */

#ifdef REEL_NO_HTTP

reel_http_t *reel_http_start(const char *addr_port) {
    kern_fail("--metrics %s: this build has no HTTP server (built without libmicrohttpd)", addr_port);
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
    bool live = h->published && mono_ms() - h->published_ms <= REEL_HTTP_STALE_MS;
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
    if (!s || !colon || colon == s || !colon[1]) return kern_fail("--metrics '%s': not ADDR:PORT", s ? s : "");
    char host[64];
    size_t hl = (size_t)(colon - s);
    if (hl >= sizeof host) return kern_fail("--metrics '%s': address too long", s);
    memcpy(host, s, hl);
    host[hl] = '\0';
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno || *end || port < 0 || port > 65535) return kern_fail("--metrics '%s': bad port", s);
    memset(ss, 0, sizeof *ss);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        host[hl - 1] = '\0';
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1) return kern_fail("--metrics '%s': bad IPv6 address", s);
        *len = sizeof *a;
        return 0;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1) return kern_fail("--metrics '%s': bad IPv4 address", s);
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
        kern_fail("out of memory");
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
        kern_fail("--metrics %s: cannot serve HTTP there (address in use, or not this host's)", addr_port);
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
    if (!copy) return kern_fail("out of memory");
    if (len) memcpy(copy, metrics, len);
    pthread_mutex_lock(&h->mu);
    free(h->metrics);
    h->metrics = copy;
    h->len = len;
    h->healthy = healthy;
    h->ready = ready;
    snprintf(h->why, sizeof h->why, "%s", why ? why : "");
    h->published = true;
    h->published_ms = mono_ms();
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
