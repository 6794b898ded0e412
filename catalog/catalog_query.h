/* catalog_query.h -- the catalog's reports as data: each query reads one
 * snapshot of the catalog (a read transaction, so its totals agree with
 * each other; on the writer's connection inside a batch, the batch as it
 * stands) and returns it as JSON (jansson), the form reelctl prints as
 * JSON, as a table (ctl/report.h) or as Prometheus text.
 *
 * Every query returns a new reference the caller json_decref()s, or NULL
 * with a message in reel_err_text() (SQLite's, or out of memory). Strings that
 * are not UTF-8 (key texts and names come from the network) come back with
 * '?' for each byte >= 0x80. */
#ifndef REEL_CATALOG_CATALOG_QUERY_H
#define REEL_CATALOG_CATALOG_QUERY_H

#include <jansson.h>

#include "catalog/catalog.h"

/* {"overall": S, "workers": [S + {"worker"}], "artifacts": [as in
 * cat_query_artifacts]}, S = {requests, captures,
 * replays, steps, replayed_steps, eager_breaks, declines, evictions,
 * hit_rate, hit_rate_from, declines_by_reason, evictions_by_reason}. */
json_t *cat_query_stats(cat_t *c);
/* [{key_hash, key_text, captures, prewarms (captures a prewarm made), replays, declines, last_replay,
 * workers}], most replayed first. */
json_t *cat_query_keys(cat_t *c);
/* The 50 newest evictions, newest first. */
json_t *cat_query_evictions(cat_t *c);
/* Every published version, newest first per component, with its state,
 * reason, the workers that applied it and those that failed to (and why). */
json_t *cat_query_versions(cat_t *c);
/* The same, the `limit` newest versions of each component only (0: all). */
json_t *cat_query_versions_recent(cat_t *c, int limit);
/* Each worker with its newest applied version per component and, while it
 * is live, each component whose current version it has not applied
 * ("lagging", with its error or "not applied"). */
json_t *cat_query_workers(cat_t *c);
/* The 50 newest finished requests, newest first. */
json_t *cat_query_requests(cat_t *c);
/* Kernel artifacts (docs/ARTIFACTS.md): {"artifacts": [{id, version, op,
 * backend, status, verified, enabled, sha256, reason, first_seen,
 * last_seen, keys, promoted, demoted, calls, native_calls, parity_pass,
 * parity_fail, fallbacks, timed, speedup}], "keys": [{worker, id, key,
 * state, reason, calls, native_calls, parity_pass, parity_fail, fallbacks,
 * timed, speedup, speedup_sd, t}]}; speedup per artifact: its keys'
 * speedups weighted by their timed calls. cat_query_stats carries the
 * same "artifacts" array. */
json_t *cat_query_artifacts(cat_t *c);

/* What `reelctl report --html` draws, from the rows at or after `since`
 * (UNIX seconds; 0 = all): {since, t0, t1 (the requests' time range),
 * bucket_seconds, buckets, requests, timeline [{bucket, requests,
 * replayed, steps, failed}], syncs [{component, version, t, state,
 * captures, evictions (between it and the next sync)}], before_first_sync
 * {captures, evictions}, declines [{reason, count}], slowest [the 20
 * slowest requests], stats, keys, workers (as their own queries)}. */
json_t *cat_query_report(cat_t *c, double since);

#endif
