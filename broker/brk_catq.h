/* brk_catq.h -- the broker's catalog writer (internal header): one thread
 * that owns the SQLite catalog and a bounded queue the routing loop pushes
 * small records into, so routing never waits on SQLite.
 *
 * The thread takes everything queued (up to BRK_CATQ_BATCH records) into
 * one cat_begin/cat_commit batch, then waits for more. Pushes never block
 * on the database: when the queue holds `max` records a push drops its
 * record and counts it (logged once). Every push copies its strings; NULL
 * strings are stored as "". */
#ifndef REEL_BROKER_BRK_CATQ_H
#define REEL_BROKER_BRK_CATQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "schema/catalog.h"

#define BRK_CATQ_BATCH 512
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

/* One push per catalog writer (schema/catalog.h); the time is taken at the
 * push. None can fail from the caller's point of view. */
void brk_cq_worker_seen(brk_catq_t *q, const char *worker, const char *device, const char *arch,
                        int streams, uint64_t budget);
void brk_cq_worker_gone(brk_catq_t *q, const char *worker, const char *why);
void brk_cq_weight_version(brk_catq_t *q, const char *component, uint64_t version,
                           const char *sha256, const char *source);
/* cat_weight_state; reason NULL or "" stores none. */
void brk_cq_weight_state(brk_catq_t *q, const char *component, uint64_t version,
                         const char *state, const char *reason);
void brk_cq_worker_version(brk_catq_t *q, const char *worker, const char *component,
                           uint64_t version, bool ok, const char *error);
void brk_cq_capture(brk_catq_t *q, const char *worker, const char *key_text, const char *key_hash,
                    int stream, uint64_t bytes, uint64_t nodes, double seconds);
void brk_cq_replays(brk_catq_t *q, const char *worker, const char *key_hash, int stream,
                    uint64_t count);
void brk_cq_eviction(brk_catq_t *q, const char *worker, const char *key_text,
                     const char *key_hash, const char *reason, const char *component,
                     uint64_t from_version, uint64_t to_version);
void brk_cq_decline(brk_catq_t *q, const char *worker, const char *key_text, const char *key_hash,
                    const char *reason, uint64_t count);
void brk_cq_request(brk_catq_t *q, uint64_t id, const char *worker, const char *key_hash,
                    uint64_t version, int steps, int captured, int replayed, int eager,
                    double seconds, const char *status);

#endif
