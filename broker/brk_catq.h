/* brk_catq.h -- the broker's catalog writer (internal header): one thread
 * that owns the SQLite catalog and a bounded queue the routing loop pushes
 * records into, so routing never waits on SQLite.
 *
 * Group commit: the thread sleeps until BRK_CATQ_BATCH records wait or the
 * oldest has waited BRK_CATQ_WAIT_MS, then writes everything queued (up to
 * BRK_CATQ_BATCH_MAX records) in one cat_begin/cat_commit transaction:
 * never one commit per record, and a record reaches SQLite at most about
 * BRK_CATQ_WAIT_MS after its push. Pushes never block on the database:
 * when the queue holds `max` records a push drops its record and counts it
 * (logged once). Every push copies its strings; NULL TEXT strings are
 * stored as "", empty OPT strings as NULL (schema/catalog_records.h). */
#ifndef REEL_BROKER_BRK_CATQ_H
#define REEL_BROKER_BRK_CATQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "schema/catalog.h"

#define BRK_CATQ_BATCH 256       /* records that wake the writer at once */
#define BRK_CATQ_WAIT_MS 20      /* the longest a record waits for its batch */
#define BRK_CATQ_BATCH_MAX 4096  /* records in one transaction */
#define BRK_CATQ_MAX 100000

typedef struct brk_catq brk_catq_t;

/* Starts the writer thread on cat, taking ownership of it (closed by
 * destroy). cat NULL: a queue whose pushes are dropped silently (no
 * catalog). NULL on out-of-memory or when the thread cannot start (cat is
 * closed then). */
brk_catq_t *brk_catq_new(cat_t **cat, size_t max);
/* Writes everything still queued, stops the thread, closes the catalog.
 * Does nothing on NULL; sets *q = NULL. */
void brk_catq_destroy(brk_catq_t **q);
/* Records dropped because the queue was full (or out of memory). */
uint64_t brk_catq_dropped(brk_catq_t *q);
/* Batches (transactions) written so far. */
uint64_t brk_catq_batches(brk_catq_t *q);

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
