/* brk_counters.h -- the counters the routing thread keeps as requests,
 * BUSYs, requeues and syncs end (a part of brk_t; the functions are
 * brk_metrics.c's), for the live metrics of brk_metrics.h and STATUS.
 * Labels are bounded: outcome (an error code, at most BRK_OUTCOMES_MAX of
 * them); never a key or a request id. */
#ifndef REEL_BROKER_BRK_COUNTERS_H
#define REEL_BROKER_BRK_COUNTERS_H

#include <stdbool.h>
#include <stdint.h>
#include "net/http.h"

#define BRK_OUTCOMES_MAX 24

/* Why a worker was dropped: its brk_worker_t.dead_why. */
enum { BRK_LOST_EXPIRED, BRK_LOST_DISCONNECT, BRK_LOST_RESTARTED, BRK_LOST_OTHER };
/* The BRK_LOST_* of a dead_why text (NULL: other). */
int brk_metrics_lost_kind(const char *why);

typedef struct {
    char outcome[BRK_OUTCOMES_MAX][32];  /* "ok", the ERROR code ([a-z0-9_]), or "other" */
    uint64_t requests[BRK_OUTCOMES_MAX];
    int n_outcomes;
    uint64_t busy, requeues;
    uint64_t workers_lost[4];        /* dropped, by BRK_LOST_* (why it died) */
    uint64_t steps_replayed, steps_eager, steps_captured; /* of the RESULTs, by how they ran */
    uint64_t syncs_complete, syncs_incomplete, syncs_failed;
    reel_hist_t request_s, queue_wait_s, sync_s;
    reel_hist_t encode_s, decode_s;  /* RESULTs that encoded a prompt / decoded an output: the worker's seconds */
    reel_http_t *http;
    int64_t next_publish_ms;
} brk_metrics_t;

/* A request ended: outcome "ok" or its ERROR code; seconds since accepted. */
void brk_metrics_request(brk_metrics_t *m, const char *outcome, double seconds);
/* A barrier ended; seconds since the SYNC came. */
void brk_metrics_sync(brk_metrics_t *m, bool complete, bool applied, double seconds);

#endif
