/* catalog.h -- the SQLite catalog: what was captured, replayed, declined and
 * evicted, which weight versions exist and which worker applied which.
 *
 * One writer (the broker's catalog thread) and any number of readers
 * (reelctl, sqlite3) at once: WAL mode, busy_timeout, writes batched in
 * BEGIN IMMEDIATE transactions, schema migrations by PRAGMA user_version
 * (schema/catalog.sql holds the current schema). Every function returns 0
 * or -1 with a message in kern_error() (SQLite's message included). */
#ifndef REEL_SCHEMA_CATALOG_H
#define REEL_SCHEMA_CATALOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cat cat_t;

/* Opens (creating and migrating when writable) the catalog at path.
 * readonly: open an existing catalog for queries; NULL with a message if it
 * does not exist or its schema is newer than this build's. */
cat_t *cat_open(const char *path, bool readonly);
void cat_close(cat_t **c);
/* The schema version (user_version) this build writes. */
int cat_schema_version(void);

/* Write transactions: everything between begin and commit is one batch. */
int cat_begin(cat_t *c);
int cat_commit(cat_t *c);
int cat_rollback(cat_t *c);

/* Writers. `t` is a UNIX time in seconds (double). Strings are copied. */
int cat_worker_seen(cat_t *c, const char *worker, const char *device, const char *arch,
                    int streams, uint64_t budget, double t);
int cat_worker_gone(cat_t *c, const char *worker, const char *why, double t);
/* A weight version the trainer published, recorded 'pending' (publishing a
 * version again, after it failed, starts it over: pending, reason cleared). */
int cat_weight_version(cat_t *c, const char *component, uint64_t version, const char *sha256,
                       const char *source, double t);
/* Sets the state of a recorded version: "pending", "current" (a worker
 * applied it; older current versions of the component become
 * "superseded"), "superseded" or "failed" (no worker applied it; reason
 * says why). Unknown states are refused (-1, nothing written). Setting the
 * state of a version never recorded changes nothing. */
int cat_weight_state(cat_t *c, const char *component, uint64_t version, const char *state,
                     const char *reason);
/* Marks every pending version failed with reason: a broker that starts
 * finds those its previous run published and never saw applied. */
int cat_weight_fail_pending(cat_t *c, const char *reason);
int cat_worker_version(cat_t *c, const char *worker, const char *component, uint64_t version,
                       bool ok, const char *error, double t);
int cat_capture(cat_t *c, const char *worker, const char *key_text, const char *key_hash,
                int stream, uint64_t bytes, uint64_t nodes, double seconds, double t);
/* Adds `count` replays to the capture of (worker, key_hash, stream). */
int cat_replays(cat_t *c, const char *worker, const char *key_hash, int stream, uint64_t count,
                double t);
int cat_eviction(cat_t *c, const char *worker, const char *key_text, const char *key_hash,
                 const char *reason, const char *component, uint64_t from_version,
                 uint64_t to_version, double t);
/* Adds `count` declines of `reason` for (worker, key_hash). */
int cat_decline(cat_t *c, const char *worker, const char *key_text, const char *key_hash,
                const char *reason, uint64_t count, double t);
/* One finished request, as the client saw it. */
int cat_request(cat_t *c, uint64_t id, const char *worker, const char *key_hash, uint64_t version,
                int steps, int captured, int replayed, int eager, double seconds, const char *status,
                double t);
int cat_artifact(cat_t *c, const char *id, const char *op, const char *backend, const char *sha256,
                 const char *status, const char *reason, double t);

/* The current version of each component: the newest in state "current",
 * i.e. applied by at least one worker (what a restarted broker resumes;
 * pending and failed versions are never resumed). Fills up to max entries,
 * by component name; returns how many, or -1. */
typedef struct {
    char component[64];
    uint64_t version;
    char sha256[80];
    char source[1024];    /* a path, or "inline" */
} cat_version_t;
int cat_current_versions(cat_t *c, cat_version_t *out, int max);

/* Reports for operators, to out: a table for people, or JSON (--json). */
int cat_report_stats(cat_t *c, bool json, FILE *out);     /* per worker + overall */
int cat_report_keys(cat_t *c, bool json, FILE *out);
int cat_report_evictions(cat_t *c, bool json, FILE *out);
int cat_report_versions(cat_t *c, bool json, FILE *out);
int cat_report_workers(cat_t *c, bool json, FILE *out);
int cat_report_requests(cat_t *c, bool json, FILE *out);
/* The same counters as stats in the Prometheus text format (counters end
 * in _total; labels worker and reason only: no per-key cardinality). */
int cat_report_metrics(cat_t *c, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
