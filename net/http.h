/* http.h -- a daemon's live metrics and health over HTTP (issue 13,
 * docs/OPERATIONS.md "Metrics and health"), served by libmicrohttpd on
 * its own thread: GET /metrics (Prometheus text exposition format 0.0.4),
 * /healthz and /readyz.
 *
 * The daemon's state belongs to its own thread, so the HTTP thread never
 * reads it: the owner renders the metrics text and its health into the
 * server now and then (reel_http_publish, every REEL_HTTP_PUBLISH_MS or
 * so), and a scrape gets the latest copy. /healthz answers 200 "ok" while
 * the owner publishes (its loop runs: a publish within REEL_HTTP_STALE_MS)
 * and healthy; 503 with the reason otherwise. /readyz answers 200 when
 * also ready (a broker with its sockets bound; a worker registered with
 * its broker), 503 with the reason otherwise. Anything else is 404; a
 * method other than GET or HEAD is 405.
 *
 * Built without libmicrohttpd (REEL_NO_HTTP: the GPU bundle, docs/GPU.md),
 * reel_http_start fails saying so. Convention: NULL / -1 with a message in
 * base/error.h. */
#ifndef REEL_NET_HTTP_H
#define REEL_NET_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/metrics.h" /* the text the owner renders */

#define REEL_HTTP_PUBLISH_MS 500   /* how often owners render their metrics */
#define REEL_HTTP_STALE_MS 10000   /* /healthz fails when no publish came for this long */

typedef struct reel_http reel_http_t;

/* Parses "ADDR:PORT" (IPv4 dotted quad, "localhost", or "[::1]"-style IPv6;
 * port 1..65535) and starts serving there. NULL with a message naming
 * the address on a bad one, or when the port cannot be bound. */
reel_http_t *reel_http_start(const char *addr_port);
/* The port actually bound (useful with port 0 in tests: any free one). */
int reel_http_port(const reel_http_t *h);
/* Replaces what is served: the metrics text (len bytes, copied), whether
 * the daemon is healthy and ready, and why not (NULL or "" when it is). */
int reel_http_publish(reel_http_t *h, const char *metrics, size_t len, bool healthy, bool ready,
                      const char *why);
/* Stops serving and frees; NULL-safe; sets *h = NULL. */
void reel_http_stop(reel_http_t **h);
/* Scrapes served since start (for tests and the daemon's log). */
uint64_t reel_http_scrapes(const reel_http_t *h);

#endif
