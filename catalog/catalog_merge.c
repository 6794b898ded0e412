/* catalog_merge.c -- the union of catalogs (catalog.h, cat_merge): the
 * two brokers of a standby pair each keep their own; a report over both
 * reads their union, written into a catalog of its own. */
#include "catalog/catalog_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "base/error.h"

/* How a table's rows join those already in the destination. */
typedef enum {
    M_BY_ID,  /* rows of a request: those whose id is not there yet (one request, one row) */
    M_NEW_ID, /* events with an INTEGER PRIMARY KEY id of their own: every row, a new id */
    M_ADD,    /* summaries: counts and seconds added on the same key, maxima kept */
    M_NEWER,  /* one row per key: the more recent one (tcol) wins */
    M_KEEP,   /* one row per key: the first one kept */
} merge_t;

static const struct {
    const char *table;
    merge_t how;
    const char *key;  /* the conflict target (M_ADD, M_NEWER, M_KEEP) */
    const char *tcol; /* M_NEWER: the time column */
} RULES[] = {
    { "requests", M_BY_ID, NULL, NULL },
    { "slow_requests", M_BY_ID, NULL, NULL },
    { "captures", M_NEW_ID, NULL, NULL },
    { "evictions", M_NEW_ID, NULL, NULL },
    { "audit", M_NEW_ID, NULL, NULL },
    { "rollups", M_ADD, "worker, key_hash, version, hour", NULL },
    { "key_totals", M_ADD, "key_hash, worker", NULL },
    { "eviction_reasons", M_ADD, "worker, reason", NULL },
    { "eviction_hours", M_ADD, "hour, worker, reason", NULL },
    { "timeline", M_ADD, "minute", NULL },
    { "declines", M_ADD, "worker, key_hash, reason", NULL },
    { "weight_versions", M_NEWER, "component, version", "t" },
    { "worker_versions", M_NEWER, "worker, component, version", "t" },
    { "workers", M_NEWER, "name", "last_seen" },
    { "artifacts", M_NEWER, "id", "t" },
    { "artifact_keys", M_NEWER, "worker, id, key", "t" },
    { "key_texts", M_KEEP, "key_hash", NULL },
    { "worker_applied", M_KEEP, "worker, component", NULL },
};
#define N_RULES (sizeof RULES / sizeof RULES[0])

/* A growing SQL text. */
typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} sql_t;

static void put(sql_t *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sql_t *q, const char *fmt, ...) {
    if (q->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(q->s ? q->s + q->n : NULL, q->s ? q->cap - q->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { q->oom = true; return; }
        if (q->s && q->n + (size_t)k < q->cap) { q->n += (size_t)k; return; }
        size_t cap = (q->cap + (size_t)k + 1) * 2;
        char *s = realloc(q->s, cap);
        if (!s) { q->oom = true; return; }
        q->s = s;
        q->cap = cap;
        if (q->n == 0) q->s[0] = '\0';
    }
}

static bool in_key(const char *key, const char *col) {
    if (!key) return false;
    size_t n = strlen(col);
    for (const char *p = key; (p = strstr(p, col)); p += n) {
        bool start = p == key || p[-1] == ' ' || p[-1] == ',';
        bool end = p[n] == '\0' || p[n] == ',';
        if (start && end) return true;
    }
    return false;
}

/* A SQLite failure while merging src into c, named by src (the file the
 * user gave; c may be a temporary union of reelctl's): "catalog SRC:
 * merge: what: sqlite's message". Returns -1. */
static int merge_fail(const cat_t *c, const char *src, const char *what, const char *msg) {
    return reel_fail(REEL_E_IO, "catalog %s: merge: %s: %s", src, what, msg ? msg : sqlite3_errmsg(c->db));
}

/* Runs sql (no rows); -1 with merge_fail's message. */
static int merge_exec(cat_t *c, const char *src, const char *sql, const char *what) {
    char *msg = NULL;
    if (sqlite3_exec(c->db, sql, NULL, NULL, &msg) == SQLITE_OK) return 0;
    merge_fail(c, src, what, msg);
    sqlite3_free(msg);
    return -1;
}

/* The columns table has in both schemas ("main" and "src"), in main's
 * order, into cols[] (at most 64). -1 on a SQLite failure. */
static int shared_columns(cat_t *c, const char *src, const char *table, char cols[][64], bool pk_int[], int *n) {
    *n = 0;
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT m.name, m.pk, lower(m.type) FROM pragma_table_info(?1, 'main') AS m "
                              "JOIN pragma_table_info(?1, 'src') AS s ON s.name = m.name ORDER BY m.cid");
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(c->db, sql, -1, &st, NULL) != SQLITE_OK) return merge_fail(c, src, "columns", NULL);
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && *n < 64) {
        snprintf(cols[*n], 64, "%s", (const char *)sqlite3_column_text(st, 0));
        const char *type = (const char *)sqlite3_column_text(st, 2);
        pk_int[*n] = sqlite3_column_int(st, 1) == 1 && type && !strcmp(type, "integer");
        (*n)++;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : merge_fail(c, src, "columns", NULL);
}

/* How a summary column combines: a maximum, the first non-NULL text, or a sum. */
static void add_rule(sql_t *q, const char *col) {
    size_t n = strlen(col);
    if ((n > 4 && !strcmp(col + n - 4, "_max")) || !strcmp(col, "last_replay") || !strcmp(col, "last_t") ||
        !strcmp(col, "t"))
        put(q, "%s = max(coalesce(%s, excluded.%s), coalesce(excluded.%s, %s))", col, col, col, col, col);
    else if (!strcmp(col, "key_text"))
        put(q, "%s = coalesce(%s, excluded.%s)", col, col, col);
    else
        put(q, "%s = %s + excluded.%s", col, col, col);
}

static int merge_table(cat_t *c, const char *src, int r) {
    char cols[64][64];
    bool pk_int[64];
    int n;
    if (shared_columns(c, src, RULES[r].table, cols, pk_int, &n) != 0) return -1;
    if (n == 0) return 0; /* a table the source does not have (a summary it never wrote) */
    const merge_t how = RULES[r].how;
    sql_t q = { 0 };
    char list[4096] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        if (how == M_NEW_ID && pk_int[i]) continue; /* its own id here */
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", cols[i]);
    }
    if (used >= sizeof list)
        return reel_fail(REEL_E_LIMIT, "catalog %s: merge: table %s has too many columns", src, RULES[r].table);
    const char *t = RULES[r].table;
    switch (how) {
    case M_BY_ID:
        /* one row per request: an answered one ('ok') over one given up
         * (a standby that stepped down answered it 'standby', and the
         * other broker ran it) */
        put(&q,
            "DELETE FROM main.%s WHERE status != 'ok' AND id IN (SELECT id FROM src.%s WHERE status = 'ok'); "
            "INSERT INTO main.%s (%s) SELECT %s FROM src.%s WHERE id NOT IN (SELECT id FROM main.%s)",
            t, t, t, list, list, t, t);
        break;
    case M_NEW_ID:
        put(&q, "INSERT OR IGNORE INTO main.%s (%s) SELECT %s FROM src.%s", t, list, list, t);
        break;
    case M_KEEP:
        put(&q, "INSERT OR IGNORE INTO main.%s (%s) SELECT %s FROM src.%s", t, list, list, t);
        break;
    case M_ADD:
    case M_NEWER: {
        put(&q, "INSERT INTO main.%s (%s) SELECT %s FROM src.%s WHERE true ON CONFLICT (%s) DO UPDATE SET ", t, list,
            list, t, RULES[r].key);
        bool first = true;
        for (int i = 0; i < n; i++) {
            if (in_key(RULES[r].key, cols[i])) continue;
            if (!first) put(&q, ", ");
            first = false;
            if (how == M_ADD) add_rule(&q, cols[i]);
            else put(&q, "%s = excluded.%s", cols[i], cols[i]);
        }
        if (first) { /* nothing but the key: keep */
            free(q.s);
            q = (sql_t){ 0 };
            put(&q, "INSERT OR IGNORE INTO main.%s (%s) SELECT %s FROM src.%s", t, list, list, t);
        } else if (how == M_NEWER) {
            put(&q, " WHERE excluded.%s > %s.%s", RULES[r].tcol, t, RULES[r].tcol);
        }
        break;
    }
    }
    if (q.oom) {
        free(q.s);
        return reel_fail(REEL_E_NOMEM, "out of memory");
    }
    char what[96];
    snprintf(what, sizeof what, "table %s", t);
    int rc = merge_exec(c, src, q.s, what);
    free(q.s);
    return rc;
}

int cat_merge(cat_t *c, const char *src_path) {
    if (c->readonly) return reel_fail(REEL_E_INVALID, "catalog %s: opened read-only: nothing can be merged in", c->path);
    if (!src_path || !*src_path || access(src_path, R_OK) != 0)
        return reel_fail(REEL_E_NOT_FOUND, "catalog %s: cannot read it", src_path ? src_path : "(none)");
    if (!strncmp(src_path, "file:", 5))
        return reel_fail(REEL_E_INVALID, "catalog %s: SQLite URIs are not accepted; give a plain file path", src_path);
    struct stat a, b;
    if (stat(src_path, &a) == 0 && stat(c->path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return reel_fail(REEL_E_INVALID, "catalog %s: merging a catalog into itself", src_path);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(c->db, "ATTACH DATABASE ?1 AS src", -1, &st, NULL) != SQLITE_OK)
        return merge_fail(c, src_path, "attach", NULL);
    sqlite3_bind_text(st, 1, src_path, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return merge_fail(c, src_path, "attach", NULL);
    int ret = -1, v = -1;
    /* A catalog of a newer Reel has tables and meanings this one does not
     * know; one of an older Reel lacks columns and summaries this one's
     * rules and reports rely on (its requests would be dropped, its
     * declines added): both refused, as cat_open refuses them read-only. */
    if (sqlite3_prepare_v2(c->db, "PRAGMA src.user_version", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    if (v < 0) {
        merge_fail(c, src_path, "its schema version", NULL);
        goto out;
    }
    if (v > cat_schema_version()) {
        reel_fail(REEL_E_INVALID, "catalog %s: schema %d is newer than this build's %d", src_path, v,
                  cat_schema_version());
        goto out;
    }
    if (v == 0) {
        reel_fail(REEL_E_INVALID, "catalog %s: not a Reel catalog (no schema; user_version 0)", src_path);
        goto out;
    }
    if (v < cat_schema_version()) {
        reel_fail(REEL_E_INVALID, "catalog %s: schema %d is older than this build's %d; the broker migrates it "
                  "when it opens it", src_path, v, cat_schema_version());
        goto out;
    }
    /* Every table of the source must have a rule: none is silently left out. */
    if (sqlite3_prepare_v2(c->db, "SELECT name FROM src.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
                           -1, &st, NULL) != SQLITE_OK) {
        merge_fail(c, src_path, "its tables", NULL);
        goto out;
    }
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        size_t k = 0;
        while (k < N_RULES && strcmp(RULES[k].table, name)) k++;
        if (k == N_RULES) {
            reel_fail(REEL_E_UNSUPPORTED, "catalog %s: table %s has no merge rule", src_path, name);
            sqlite3_finalize(st);
            goto out;
        }
    }
    sqlite3_finalize(st);
    if (merge_exec(c, src_path, "BEGIN IMMEDIATE", "begin") != 0) goto out;
    for (size_t r = 0; r < N_RULES; r++)
        if (merge_table(c, src_path, (int)r) != 0) {
            sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL); /* the failure's message stays */
            goto out;
        }
    if (merge_exec(c, src_path, "COMMIT", "commit") != 0) goto out;
    ret = 0;
out:
    if (ret == 0) ret = merge_exec(c, src_path, "DETACH DATABASE src", "detach");
    else sqlite3_exec(c->db, "DETACH DATABASE src", NULL, NULL, NULL); /* the failure's message stays */
    return ret;
}
