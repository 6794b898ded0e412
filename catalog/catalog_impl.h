/* catalog_impl.h -- what the catalog's own files share (internal to
 * catalog/: catalog_db.c, the SQLite helpers; catalog_rollup.c, the
 * summaries; catalog.c, the store; catalog_prune.c, retention;
 * catalog_query.c, the report queries; catalog_why.c, one request joined
 * to its graph's history; catalog_merge.c, the union of two catalogs --
 * each calls only the ones before it). The schema it migrates to is schema/catalog_schema.h. */
#ifndef REEL_CATALOG_CATALOG_IMPL_H
#define REEL_CATALOG_CATALOG_IMPL_H

#include <jansson.h>
#include <sqlite3.h>
#include <stdbool.h>

#include "catalog/catalog.h"
#include "schema/catalog_schema.h"

/* The writers' statements: one per record kind, then the extra ones a
 * kind runs after its own (catalog.c). Each is prepared on first use and
 * kept for the life of the connection. */
enum { CAT_ST_SUPERSEDE = CAT_K_COUNT, CAT_ST_REPLAYS_NEW, CAT_ST_APPLIED, CAT_ST_UNAPPLIED, CAT_ST_REAPPLIED,
       CAT_ST_COUNT };

struct cat {
    sqlite3 *db;
    char *path;
    bool readonly;
    sqlite3_stmt *st[CAT_ST_COUNT];
    struct cat_roll *roll;  /* the summaries' deltas of the open batch (catalog_rollup.c) */
};

/* The summaries (catalog_rollup.c). cat_roll_add: a record whose row went
 * in adds to the deltas (the slowest requests are written at once); -1
 * when it could not (the batch must then not commit: cat_roll_flush
 * fails). cat_roll_flush: the deltas written, inside the open
 * transaction, and emptied. cat_roll_reset: the deltas dropped (a
 * rollback). cat_roll_failed: a delta was lost in this batch.
 * cat_roll_free: at close. */
int cat_roll_add(cat_t *c, const cat_rec_t *r);
int cat_roll_flush(cat_t *c);
void cat_roll_reset(cat_t *c);
bool cat_roll_failed(const cat_t *c);
void cat_roll_free(cat_t *c);

/* The SQLite helpers (catalog_db.c).
 * Records "catalog PATH: what: sqlite's message" and returns -1. */
int cat_db_fail(const cat_t *c, const char *what);
/* Runs sql (no rows); -1 with "catalog PATH: what: ..." on failure. */
int cat_exec(cat_t *c, const char *sql, const char *what);
/* Binds v to parameter i: NULL binds NULL. A SQLite result code. */
int cat_bind_text(sqlite3_stmt *s, int i, const char *v);

/* The report helpers (catalog_query.c) the queries of other files share.
 * cat_q_reader: sql prepared, or NULL with "catalog PATH: prepare report:
 * ..." set. cat_q_collect: steps s to the end; mode 'o': each row an
 * object keyed by column name (the queries' aliases are the JSON keys),
 * 'v': the first column of each row, 'k': one object mapping column 0 to
 * column 1; strings that are not UTF-8 get '?' for each byte >= 0x80, a
 * non-finite REAL is null. Resets s (bindings stay); NULL with a message
 * on failure. cat_q_begin: opens the read transaction one report reads
 * (inside a writer's batch: the batch as it stands, its summaries
 * flushed); *own_txn says whether cat_q_end must close it. 0, or -1 with
 * a message. cat_q_end: commits (ok) or rolls back what cat_q_begin
 * opened; cannot fail. */
sqlite3_stmt *cat_q_reader(cat_t *c, const char *sql);
json_t *cat_q_collect(cat_t *c, sqlite3_stmt *s, char mode);
int cat_q_begin(cat_t *c, bool *own_txn);
void cat_q_end(cat_t *c, bool own_txn, bool ok);

/* A key text without its weight versions (NULL when it has none): the
 * same graph at every version. WEIGHTS: the versions alone. */
#define CAT_HAS_WEIGHTS(x) "instr(" x ", ' weights=') > 0 AND instr(" x ", ' graph=') > instr(" x ", ' weights=')"
#define CAT_KEY_BASE(x)                                                                                    \
    "(CASE WHEN " CAT_HAS_WEIGHTS(x) " THEN substr(" x ", 1, instr(" x ", ' weights=') - 1)"            \
    " || substr(" x ", instr(" x ", ' graph=')) END)"

#endif
