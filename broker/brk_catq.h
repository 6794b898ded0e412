/* brk_catq.h -- the broker's catalog writer (internal header): one thread
 * that owns the SQLite catalog and a bounded queue the routing loop pushes
 * records into, so routing never waits on SQLite.
 *
 * Group commit: the thread sleeps until BRK_CATQ_BATCH records wait or the
 * oldest has waited BRK_CATQ_WAIT_MS, then writes what is queued (up to
 * BRK_CATQ_BATCH_MAX records) in one cat_begin/cat_commit transaction:
 * never one commit per record, and a record reaches SQLite at most about
 * BRK_CATQ_WAIT_MS after its push. Pushes never block on the database.
 *
 * Two lists. Kept records -- requests, weight versions and their states,
 * workers seen and gone, SYNC audits -- are never dropped: they always
 * queue, and the loop stops admitting requests (BUSY) while `max` of them
 * wait (brk_catq_behind). Events from workers -- captures, replays,
 * evictions, declines, artifact reports -- come in floods: each worker may
 * have max/4 of them waiting and the list max; past that an event is shed
 * and counted (brk_catq_dropped). A batch takes kept records first.
 *
 * A batch the store refuses for now (disk full, I/O error, locked, the
 * file unreadable: see cat_failure_transient) is rolled back and queued
 * again in front, and the writer pauses (BRK_CATQ_RETRY_MS, doubling to
 * 16x) before it retries -- on a fresh connection unless only a lock held
 * elsewhere refused it (cat_reopen: SQLite keeps a connection that read a
 * broken header failing after the file is mended) -- so the broker keeps
 * routing while the disk is full or the file is written over, and the
 * rows land when the store takes them again. A record SQLite refuses outright is skipped and counted.
 * At shutdown the writer tries BRK_CATQ_STOP_TRIES times, then gives up
 * and logs how many records it could not write. With retention on
 * (brk_catq_retain), the same thread prunes old raw rows in small
 * transactions between its batches.
 *
 * Every push copies its strings; NULL TEXT strings are stored as "", empty
 * OPT strings as NULL (catalog/catalog_records.h). */
#ifndef REEL_BROKER_BRK_CATQ_H
#define REEL_BROKER_BRK_CATQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog/catalog.h"

#define BRK_CATQ_BATCH 1024      /* records that wake the writer at once (256 cost 10% more CPU a record) */
#define BRK_CATQ_WAIT_MS 20      /* the longest a record waits for its batch */
#define BRK_CATQ_BATCH_MAX 4096  /* records in one transaction */
#define BRK_CATQ_MAX 100000      /* kept records before BUSY; events waiting at most */
#define BRK_CATQ_RETRY_MS 250    /* the first pause after the store refused a batch */
#define BRK_CATQ_STOP_TRIES 3    /* tries left to a refused batch once stopping */
#define BRK_CATQ_PRUNE_BATCH 2000 /* raw rows per table deleted in one pruning transaction */
#define BRK_CATQ_PRUNE_MS 10000  /* between pruning rounds once nothing was left to prune */

typedef struct brk_catq brk_catq_t;

/* Starts the writer thread on cat, taking ownership of it (closed by
 * destroy). cat NULL: a queue whose pushes are dropped silently (no
 * catalog). NULL on out-of-memory or when the thread cannot start (cat is
 * closed then). */
brk_catq_t *brk_catq_new(cat_t **cat, size_t max);
/* Writes everything still queued, stops the thread, closes the catalog.
 * Does nothing on NULL; sets *q = NULL. */
void brk_catq_destroy(brk_catq_t **q);
/* Retention (docs/OPERATIONS.md): from now on the writer prunes raw rows
 * older than retain_seconds (0: none) or past max_rows per table (0: no
 * cap), BRK_CATQ_PRUNE_BATCH rows per table per transaction: at most one
 * such transaction after each batch (a record waits at most one), or
 * while nothing is queued, until nothing is left, then again every
 * BRK_CATQ_PRUNE_MS. Does nothing without a catalog. */
void brk_catq_retain(brk_catq_t *q, double retain_seconds, int64_t max_rows);
/* Raw rows pruned so far. */
uint64_t brk_catq_pruned(brk_catq_t *q);
/* Events shed (their worker over its quota, the list full, or out of
 * memory). Kept records are never shed. */
uint64_t brk_catq_dropped(brk_catq_t *q);
/* Batches (transactions) attempted so far. */
uint64_t brk_catq_batches(brk_catq_t *q);
/* Batches the store refused for now (each queued again and retried). */
uint64_t brk_catq_failures(brk_catq_t *q);
/* Records SQLite refused outright (skipped). */
uint64_t brk_catq_refused(brk_catq_t *q);
/* Records waiting to be written. */
size_t brk_catq_pending(brk_catq_t *q);
/* True while `max` kept records wait: the loop answers new requests BUSY
 * until the writer catches up. */
bool brk_catq_behind(brk_catq_t *q);

/* One push per record kind, brk_cq_<kind>(q, fields...): the writer
 * cat_<kind>'s parameters without the catalog and the time, which is taken
 * at the push. brk_cq_worker_seen(q, worker, device, arch, streams,
 * budget), brk_cq_request(q, id, worker, key_hash, version, steps,
 * captured, replayed, eager, seconds, status), ... None can fail from the
 * caller's point of view. */
#define BRK_CQ_PUSH_DECL(n, N, what) void brk_cq_##n(brk_catq_t *q CAT_##N(CAT_F_QPARAM));
CAT_RECORDS(BRK_CQ_PUSH_DECL)
#undef BRK_CQ_PUSH_DECL

#endif
