/* catalog_db.c -- the SQLite helpers every catalog file uses (see
 * catalog_impl.h): a failure's message, a statement without rows, a text
 * binding. The bottom of catalog/: it calls nothing else in the folder, so
 * the store (catalog.c), the summaries (catalog_rollup.c), retention
 * (catalog_prune.c) and the queries (catalog_query.c) can all use it
 * without calling one another in a circle. */
#include "catalog/catalog_impl.h"

#include "base/error.h"

int cat_db_fail(const cat_t *c, const char *what) {
    return reel_fail(REEL_E_IO, "catalog %s: %s: %s", c->path, what, sqlite3_errmsg(c->db));
}

int cat_exec(cat_t *c, const char *sql, const char *what) {
    char *msg = NULL;
    if (sqlite3_exec(c->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        reel_fail(REEL_E_IO, "catalog %s: %s: %s", c->path, what, msg ? msg : sqlite3_errmsg(c->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

int cat_bind_text(sqlite3_stmt *s, int i, const char *v) {
    return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(s, i);
}
