/* brk_metrics.h -- the broker's live metrics and health (issue 13,
 * docs/OPERATIONS.md "Metrics and health"): counters the routing thread
 * keeps as requests, BUSYs, requeues and syncs end, and, with --metrics
 * ADDR:PORT, the Prometheus text rendered from them and from the broker's
 * state every REEL_HTTP_PUBLISH_MS and served by schema/http.h. Labels
 * are bounded: outcome (an error code, at most BRK_OUTCOMES_MAX of them),
 * state, result, component; never a key or a request id. */
#ifndef REEL_BROKER_BRK_METRICS_H
#define REEL_BROKER_BRK_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include "schema/http.h"

#define BRK_OUTCOMES_MAX 24

typedef struct {
    char outcome[BRK_OUTCOMES_MAX][32];  /* "ok", or the ERROR code */
    uint64_t requests[BRK_OUTCOMES_MAX];
    int n_outcomes;
    uint64_t busy, requeues;
    uint64_t steps_replayed, steps_eager, steps_captured; /* of the RESULTs, by how they ran */
    uint64_t syncs_complete, syncs_incomplete, syncs_failed;
    reel_hist_t request_s, queue_wait_s, sync_s;
    reel_http_t *http;
    int64_t next_publish_ms;
} brk_metrics_t;

/* A request ended: outcome "ok" or its ERROR code; seconds since accepted. */
void brk_metrics_request(brk_metrics_t *m, const char *outcome, double seconds);
/* A barrier ended; seconds since the SYNC came. */
void brk_metrics_sync(brk_metrics_t *m, bool complete, bool applied, double seconds);

#endif
