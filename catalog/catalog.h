/* catalog.h -- the SQLite catalog store: what was captured, replayed,
 * declined and evicted, which weight versions exist and which worker
 * applied which. Queries for reports are in catalog_query.h; reelctl draws
 * them (ctl/report.h).
 *
 * One writer (the broker's catalog thread) and any number of readers
 * (reelctl, sqlite3) at once: WAL mode, busy_timeout, writes batched in
 * BEGIN IMMEDIATE transactions, schema migrations by PRAGMA user_version
 * (schema/catalog.sql holds the current schema). Every function returns 0
 * or -1 with a message in reel_err_text() (SQLite's message included).
 * A cat_t is used by one thread at a time (its connection is opened
 * without SQLite's own lock: the broker hands its writer's to the catalog
 * thread, which alone uses it from then on). */
#ifndef REEL_CATALOG_CATALOG_H
#define REEL_CATALOG_CATALOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "catalog/catalog_records.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cat cat_t;

/* A process that writes much (the broker) calls this once in main, before
 * any thread starts and before any catalog is opened: it turns off
 * SQLite's process-wide memory statistics (a mutex per allocation). Safe
 * to skip; a call after SQLite has started does nothing. */
void cat_process_setup(void);

/* Opens (creating and migrating when writable) the catalog at path.
 * readonly: open an existing catalog for queries; NULL with a message if it
 * does not exist or its schema is newer than this build's. A new catalog
 * file is created 0600; "file:" URIs and symlinked paths are refused. */
cat_t *cat_open(const char *path, bool readonly);
/* Closes the catalog (an open batch is rolled back). Does nothing on NULL;
 * sets *c = NULL. */
void cat_close(cat_t **c);
/* Opens c's file again on a fresh connection and puts it in place of c's
 * (an open batch is rolled back): SQLite keeps a connection that once read
 * a header that was not a database's (a file written over, a torn copy
 * put back) failing with "file is not a database" after the header is
 * whole again, and only a new connection reads it. 0; -1 with a message,
 * c left as it was, when the file can not be opened (still unreadable). */
int cat_reopen(cat_t *c);
/* Adds the catalog at src_path (another broker's: a standby pair's
 * other one) to c, opened writable: requests it has that c has not (by
 * request id), its captures, evictions and audit rows, its summaries
 * added to c's (counts and seconds summed, maxima kept), and, for weight
 * versions, workers and artifacts, the more recent row of each. One
 * transaction; a source of a newer or an older schema (cat_open refuses
 * both read-only), with a table this build has no rule for, or c itself,
 * is refused. 0, or -1 with a message naming src_path (never c, which
 * may be a temporary union). */
int cat_merge(cat_t *c, const char *src_path);
/* The path it was opened with (for messages). */
const char *cat_path(const cat_t *c);
/* The schema version (user_version) this build writes. */
int cat_schema_version(void);

/* Write transactions: everything between begin and commit is one batch.
 * Rollback with no batch open does nothing. */
int cat_begin(cat_t *c);
int cat_commit(cat_t *c);
int cat_rollback(cat_t *c);
/* After a failed call: true when the failure is the store's and may pass
 * (disk full, I/O error, locked, out of memory, read-only for now, the
 * file unreadable -- not a database, corrupt -- for now), so the same
 * writes may succeed later; false when SQLite refused the record itself. */
bool cat_failure_transient(const cat_t *c);
/* After a failed call: true when it was only another connection holding
 * the lock (busy, locked): the connection is fine and a retry needs no
 * cat_reopen. */
bool cat_failure_busy(const cat_t *c);

/* ---- records (catalog/catalog_records.h defines each kind) ----------------- */

typedef enum {
#define CAT_KIND_ENUM(n, N, what) CAT_K_##N,
    CAT_RECORDS(CAT_KIND_ENUM)
#undef CAT_KIND_ENUM
    CAT_K_COUNT
} cat_kind_t;

/* cat_worker_seen_t, ...: one struct per kind, its fields as members. */
#define CAT_KIND_STRUCT(n, N, what) typedef struct { CAT_##N(CAT_F_MEMBER) } cat_##n##_t;
CAT_RECORDS(CAT_KIND_STRUCT)
#undef CAT_KIND_STRUCT

/* Any record: its kind and, in the member of that name, its fields. */
typedef struct {
    cat_kind_t kind;
    union {
#define CAT_KIND_MEMBER(n, N, what) cat_##n##_t n;
        CAT_RECORDS(CAT_KIND_MEMBER)
#undef CAT_KIND_MEMBER
    } u;
} cat_rec_t;

/* Writes one record (inside a batch, or as a batch of its own). Strings
 * are copied by SQLite. */
int cat_write(cat_t *c, const cat_rec_t *r);

/* The writers, one per kind, each cat_write of its fields in the order of
 * the kind's table: cat_worker_seen(c, worker, device, arch, streams,
 * budget, t), cat_replays(c, worker, key_hash, stream, count, t), ... */
#define CAT_KIND_WRITER(n, N, what) int cat_##n(cat_t *c CAT_##N(CAT_F_PARAM));
CAT_RECORDS(CAT_KIND_WRITER)
#undef CAT_KIND_WRITER

/* Retention (docs/OPERATIONS.md): in one transaction, deletes at most
 * `batch` of the oldest raw rows of each of requests, captures and
 * evictions that are older than `before` (UNIX seconds; 0: no age limit;
 * a capture is old once its last replay is) or past the newest `max_rows`
 * of their table (0: no cap). The summaries reports read (rollups, totals,
 * timeline, slowest requests), declines, versions, workers and the audit
 * trail are kept. Returns the rows deleted (0: nothing was due), or -1. */
int64_t cat_prune(cat_t *c, double before, int64_t max_rows, int batch);

/* The current version of each component: the newest in state "current",
 * i.e. applied by at least one worker (what a restarted broker resumes;
 * pending and failed versions are never resumed). Fills up to max entries,
 * by component name; returns how many, or -1. */
#define CAT_LORA_CONFIG_MAX 4096 /* the SYNC's lora_config, NUL included (MSG_LORA_CONFIG_MAX) */
typedef struct {
    char component[64];
    uint64_t version;
    char sha256[80];
    char source[1024];    /* a path, or "inline"; "" when cut */
    bool cut;             /* the source is longer than source holds: not usable (never
                           * handed out shortened; SYNC paths are at most 1023 bytes) */
    uint64_t base_version; /* > 0: a LoRA adapter on that base version (0: a full version) */
    char lora_config[CAT_LORA_CONFIG_MAX]; /* an adapter sent by upload: its config text ("" else,
                                            * and for one recorded before migration 13) */
} cat_version_t;
int cat_current_versions(cat_t *c, cat_version_t *out, int max);
/* Every version still "pending" (a sync no worker had applied yet), newest
 * first within each component: what a broker that stopped mid-sync left
 * (read before cat_weight_fail_pending settles them). Same returns. */
int cat_pending_versions(cat_t *c, cat_version_t *out, int max);
/* The reason a broker gives the versions it found pending at start
 * (cat_weight_fail_pending): interrupted, not refused by any worker. */
#define CAT_REASON_INTERRUPTED "the broker stopped before any worker applied it"
/* Versions failed for CAT_REASON_INTERRUPTED that are newer than their
 * component's newest current or superseded version: syncs a restart
 * interrupted that nothing settled since (a worker running one, or a
 * newer version). A broker that restarts again remembers them as it
 * does the pending ones. Newest first within each component. Same
 * returns. */
int cat_interrupted_versions(cat_t *c, cat_version_t *out, int max);
/* For each component whose current version (cat_current_versions) is a
 * LoRA adapter, the full version it is on (its base_version), when the
 * catalog has it as applied (current or superseded): what a worker that
 * joins below the base is sent first. Same returns. */
int cat_current_bases(cat_t *c, cat_version_t *out, int max);

#ifdef __cplusplus
}
#endif
#endif
