/* brk_metrics.h -- the broker's live metrics and health (issue 13,
 * docs/OPERATIONS.md "Metrics and health"): with --metrics ADDR:PORT, the
 * Prometheus text rendered from the counters (brk_counters.h) and the
 * broker's state every REEL_HTTP_PUBLISH_MS, served by net/http.h.
 * The loop calls brk_metrics_publish; main starts and stops it. */
#ifndef REEL_BROKER_BRK_METRICS_H
#define REEL_BROKER_BRK_METRICS_H

#include "broker/brk_broker.h"

/* Starts the HTTP server (0 without --metrics; -1 with a message when it
 * cannot serve there). */
int brk_metrics_start(brk_t *b);
/* Renders and publishes, at most every REEL_HTTP_PUBLISH_MS. */
void brk_metrics_publish(brk_t *b, int64_t now);
void brk_metrics_stop(brk_t *b);

#endif
