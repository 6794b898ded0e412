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

/* One request joined to its graph's history (`reelctl why`;
 * catalog_why.c): the newest row of requests whose client id is `id` (on
 * `worker` when not NULL), else of slow_requests (what retention keeps).
 * {request (the row; started: t less its seconds, encode and decode),
 * source ("requests" or "slow_requests"), matches (rows with that id
 * there), until (its end), key_text and weights (its capture key's text
 * from key_texts and the text's weight versions, or null), captures and
 * evictions (oldest first, the newest 50 of each: the worker's rows of
 * its capture key and of the same key at other weight versions, up to
 * its end; its own capture up to 5 s later, after_end, since workers
 * send events in batches; this_key marks its own key), totals {captures,
 * evictions (all such rows), first_capture, captures_before (of its own
 * key before its work began), own_capture}, declines {reason: count} of
 * its key on the worker, peers {count, median_seconds, ratio: the other
 * ok requests of its key on the worker}, verdict {kind, text}}. kind:
 * failed, no_capture_key, evicted (the graph was evicted before it and
 * it paid to capture again), new_key (no capture of its key on the
 * worker before it), eager (eager or capturing steps though the key was
 * captured before), replayed, replayed_slow (every step replayed, at 2x
 * its peers' median or more), no_steps. A request without a capture key
 * has no history (empty lists). NULL with REEL_E_NOT_FOUND when no row
 * has the id, else with the catalog's error. */
json_t *cat_query_why(cat_t *c, long long id, const char *worker);

/* What `reelctl report --html` draws, from the rows at or after `since`
 * (UNIX seconds; 0 = all): {since, t0, t1 (the requests' time range),
 * bucket_seconds, buckets, requests, timeline [{bucket, requests,
 * replayed, steps, failed}], syncs [{component, version, t, state,
 * captures, evictions (between it and the next sync)}], before_first_sync
 * {captures, evictions}, declines [{reason, count}], slowest [the 20
 * slowest requests], stats, keys, workers (as their own queries)}. */
json_t *cat_query_report(cat_t *c, double since);

#endif
