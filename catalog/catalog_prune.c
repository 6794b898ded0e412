/* catalog_prune.c -- retention: the pruning of raw rows (cat_prune,
 * catalog.h; docs/OPERATIONS.md).
 *
 * Pruning deletes the oldest raw rows (requests, captures, evictions) in
 * batches of a bounded size, so a writer that prunes between its batches
 * holds the write lock for milliseconds, never for a whole table. It runs
 * in a batch of its own (cat_begin / cat_commit, catalog.c), above the
 * summaries, which its deletes never touch. */
#include "catalog/catalog_impl.h"

#include <stdio.h>

#include "base/error.h"

/* The one integer sql answers (0 for no row); -1 on failure. */
static int one_int(cat_t *c, const char *sql, int64_t *out) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK) return cat_db_fail(c, "prune");
    int rc = sqlite3_step(s);
    *out = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_finalize(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : cat_db_fail(c, "prune");
}

/* Runs a DELETE bound to ?1 = limit, ?2 = before; adds the rows it deleted. */
static int del(cat_t *c, const char *sql, int64_t limit, double before, int64_t *deleted) {
    if (limit <= 0) return 0;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK) return cat_db_fail(c, "prune");
    sqlite3_bind_int64(s, 1, limit);
    if (sqlite3_bind_parameter_count(s) >= 2) sqlite3_bind_double(s, 2, before);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return cat_db_fail(c, "prune");
    *deleted += sqlite3_changes(c->db);
    return 0;
}

/* The raw tables pruned, each in the order its rows were written (rowid),
 * which is the order of their times: requests and captures go in as they
 * happen, so the oldest rows are the first rowids; evictions by their time
 * index. By age: rows written before the cutoff (a graph captured before
 * it loses its raw row even while it is replayed: its later replays land
 * on a placeholder row, and the summaries count them either way). By
 * count: the rows before the newest max_rows rowids. */
static const struct {
    const char *table, *by_age;
} raw[] = {
    { "requests", "DELETE FROM requests WHERE rowid IN (SELECT rowid FROM requests ORDER BY rowid LIMIT ?1)"
                  " AND t < ?2" },
    { "captures", "DELETE FROM captures WHERE rowid IN (SELECT rowid FROM captures ORDER BY rowid LIMIT ?1)"
                  " AND t < ?2" },
    { "evictions", "DELETE FROM evictions WHERE rowid IN (SELECT rowid FROM evictions WHERE t < ?2"
                   " ORDER BY t LIMIT ?1)" },
};

int64_t cat_prune(cat_t *c, double before, int64_t max_rows, int batch) {
    if (c->readonly) return reel_fail(REEL_E_STATE, "catalog %s: opened read-only; cannot prune", c->path);
    if (batch <= 0 || (before <= 0 && max_rows <= 0)) return 0;
    if (cat_begin(c) != 0) return -1;
    int64_t deleted = 0;
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        int64_t left = batch;
        if (before > 0) {
            int64_t d = 0;
            if (del(c, raw[i].by_age, left, before, &d) != 0) goto err;
            deleted += d;
            left -= d;
        }
        if (max_rows > 0 && left > 0) {
            /* The rows before the newest max_rows rowids (rowids only grow:
             * a seek, not a count of the table; where rows were deleted in
             * the middle a little under max_rows may stay). */
            char sql[256];
            int64_t newest = 0;
            snprintf(sql, sizeof sql, "SELECT coalesce((SELECT max(rowid) FROM %s), 0)", raw[i].table);
            if (one_int(c, sql, &newest) != 0) goto err;
            snprintf(sql, sizeof sql,
                     "DELETE FROM %s WHERE rowid IN (SELECT rowid FROM %s WHERE rowid <= %lld ORDER BY rowid LIMIT ?1)",
                     raw[i].table, raw[i].table, (long long)(newest - max_rows));
            if (newest > max_rows && del(c, sql, left, 0, &deleted) != 0) goto err;
        }
    }
    if (cat_commit(c) != 0) goto err;
    return deleted;
err:
    cat_rollback(c);
    return -1;
}
