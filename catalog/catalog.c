/* catalog.c -- the catalog store (see catalog.h): opening, migrating and
 * writing. One writer connection in the broker, any number of read-only
 * connections in reelctl or sqlite3.
 *
 * WAL mode lets readers and the writer run at once: a reader sees the last
 * committed batch, never half of one, and never makes the writer wait.
 * Writes start with BEGIN IMMEDIATE so the write lock is taken up front and
 * a batch can not fail half-way with SQLITE_BUSY_SNAPSHOT. The schema is
 * migrated by PRAGMA user_version inside one transaction; a catalog newer
 * than this build is refused rather than written with an old idea of it.
 *
 * Every record kind is written by one function, cat_write: the kind's
 * statement (catalog/catalog_records.h), its fields bound in order as ?1,
 * ?2, ..., and for two kinds a second statement after it (a version made
 * current supersedes the older current ones; replays with no capture to
 * land on get a placeholder capture).
 *
 * uint64 values (versions, budgets, byte counts) are stored as SQLite's
 * signed 64-bit INTEGER; values above INT64_MAX come back negative in
 * reports. */
#include "catalog/catalog_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"

#define CAT_BUSY_TIMEOUT_MS 5000

int cat_schema_version(void) { return cat_n_migrations; }

void cat_process_setup(void) {
    /* SQLite's memory statistics take a process-wide mutex on every
     * allocation; nothing here reads them. SQLITE_MISUSE once SQLite has
     * started (a second call, or a caller that opened a database before):
     * then its default stays, which is only slower. */
    (void)sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

const char *cat_path(const cat_t *c) { return c ? c->path : "(none)"; }

/* ---- opening and migrating ---------------------------------------------- */

/* Reads an integer PRAGMA (or any one-integer query) into *out. */
static int query_int(cat_t *c, const char *sql, int *out) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK) return cat_db_fail(c, sql);
    int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW) {
        cat_db_fail(c, sql);
        sqlite3_finalize(s);
        return -1;
    }
    *out = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    return 0;
}

/* WAL is what lets people read while the broker writes; a filesystem that
 * can not do it (network mounts) is an error, not a silent fallback. */
static int enable_wal(cat_t *c) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, "PRAGMA journal_mode=WAL", -1, &s, NULL) != SQLITE_OK)
        return cat_db_fail(c, "journal_mode=WAL");
    int rc = sqlite3_step(s);
    const char *mode = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(s, 0) : NULL;
    int ret = 0;
    if (!mode) ret = cat_db_fail(c, "journal_mode=WAL");
    else if (strcmp(mode, "wal") != 0)
        ret = reel_fail(REEL_E_INVALID, "catalog %s: WAL is not available here (journal_mode is %s)", c->path, mode);
    sqlite3_finalize(s);
    return ret;
}

static int schema_newer(const cat_t *c, int v) {
    return reel_fail(REEL_E_INVALID, "%s: catalog schema %d is newer than this build's %d", c->path, v,
                     cat_n_migrations);
}

/* Brings user_version up to cat_n_migrations in one transaction: either
 * every step applies or none does. Does nothing on a current catalog. */
static int migrate(cat_t *c) {
    if (cat_exec(c, "BEGIN IMMEDIATE", "begin migration") != 0) return -1;
    int v;
    if (query_int(c, "PRAGMA user_version", &v) != 0) goto err;
    if (v > cat_n_migrations) {
        schema_newer(c, v);
        goto err;
    }
    int others = 0; /* a file with tables but no Reel schema is someone else's: never written into */
    if (v == 0 && query_int(c, "SELECT count(*) FROM sqlite_master", &others) != 0) goto err;
    if (others > 0) {
        reel_fail(REEL_E_INVALID, "catalog %s: not a Reel catalog (it holds %d other schema objects and no Reel schema): "
                  "give a new or a Reel catalog file", c->path, others);
        goto err;
    }
    for (int i = v; i < cat_n_migrations; i++) {
        char what[64];
        snprintf(what, sizeof what, "migration to schema %d", i + 1);
        if (cat_exec(c, cat_migrations[i], what) != 0) goto err;
    }
    if (v < cat_n_migrations) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", cat_n_migrations);
        if (cat_exec(c, sql, "set user_version") != 0) goto err;
    }
    if (cat_exec(c, "COMMIT", "commit migration") != 0) goto err;
    return 0;
err:
    sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

static int check_readable_schema(cat_t *c) {
    int v;
    if (query_int(c, "PRAGMA user_version", &v) != 0) return -1;
    if (v > cat_n_migrations) return schema_newer(c, v);
    if (v == 0) return reel_fail(REEL_E_INVALID, "catalog %s: not a Reel catalog (no schema; user_version 0)", c->path);
    if (v < cat_n_migrations)
        return reel_fail(REEL_E_INVALID, "catalog %s: schema %d is older than this build's %d; the broker "
                         "migrates it when it opens it", c->path, v, cat_n_migrations);
    return 0;
}

cat_t *cat_open(const char *path, bool readonly) {
    if (!path || !*path) {
        reel_fail(REEL_E_INVALID, "catalog: empty path");
        return NULL;
    }
    /* SQLite's CANTOPEN says neither which file nor why; say both. */
    if (readonly && access(path, F_OK) != 0) {
        reel_fail(REEL_E_IO, "catalog %s: cannot open read-only: %s", path, strerror(errno));
        return NULL;
    }
    /* A FIFO would block SQLite's open (reelctl hung), a device or a
     * directory fails obscurely: a catalog is a regular file. */
    struct stat ps;
    if (lstat(path, &ps) == 0 && !S_ISREG(ps.st_mode)) {
        reel_fail(REEL_E_INVALID, "catalog %s: not a regular file", path);
        return NULL;
    }
    /* Debian's SQLite interprets "file:" URIs (query parameters can change
     * modes and VFS); a catalog is a plain path. */
    if (!strncmp(path, "file:", 5)) {
        reel_fail(REEL_E_INVALID, "catalog %s: SQLite URIs are not accepted; give a plain file path", path);
        return NULL;
    }
    /* The catalog holds the audit trail: create it readable by its owner
     * only (SQLite gives its -wal and -shm files the same mode). Only a
     * file that is not there is opened here: close() of any descriptor of
     * a file drops every POSIX lock this process holds on it, and a
     * connection still open on it (cat_reopen's old one) would lose its
     * locks -- its close then takes itself for the last one and deletes
     * the WAL the new connection writes into. */
    bool created = false; /* by this call: removed again, while still empty, when the open fails */
    if (!readonly && lstat(path, &ps) != 0 && errno == ENOENT) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
            reel_fail(REEL_E_IO, "catalog %s: cannot open: %s", path, strerror(errno));
            return NULL;
        }
        close(fd);
        created = true;
    } else if (!readonly && access(path, R_OK | W_OK) != 0) {
        reel_fail(REEL_E_IO, "catalog %s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    cat_t *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        reel_fail(REEL_E_NOMEM, "catalog %s: out of memory", path);
        goto err;
    }
    c->readonly = readonly;
    /* NOMUTEX: a cat_t is one thread's at a time (catalog.h), so SQLite's
     * own lock around every call on the connection is not needed */
    int flags = (readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) |
                SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(path, &c->db, flags, NULL) != SQLITE_OK) {
        if (c->db) cat_db_fail(c, "open");
        else reel_fail(REEL_E_NOMEM, "catalog %s: open: out of memory", path);
        goto err;
    }
    sqlite3_busy_timeout(c->db, CAT_BUSY_TIMEOUT_MS);
    if (readonly) {
        if (check_readable_schema(c) != 0) goto err;
        return c;
    }
    if (enable_wal(c) != 0) goto err;
    if (cat_exec(c, "PRAGMA synchronous=NORMAL", "synchronous=NORMAL") != 0) goto err;
    if (cat_exec(c, "PRAGMA foreign_keys=OFF", "foreign_keys=OFF") != 0) goto err;
    /* the writer's page cache: 32 MiB, not SQLite's 2 MiB (each request
     * goes in at a random page of the capture-key index: docs/BENCH.md
     * "Catalog after a busy day"); readers keep the default */
    if (cat_exec(c, "PRAGMA cache_size=-32768", "cache_size") != 0) goto err;
    if (migrate(c) != 0) goto err;
    return c;
err:
    cat_close(&c);
    /* (a full disk, say: no empty catalog file is left for the next start
     * to take for one; the error says why) */
    if (created && stat(path, &ps) == 0 && S_ISREG(ps.st_mode) && ps.st_size == 0) unlink(path);
    return NULL;
}

void cat_close(cat_t **cp) {
    if (!cp || !*cp) return;
    cat_t *c = *cp;
    for (int i = 0; i < CAT_ST_COUNT; i++) sqlite3_finalize(c->st[i]);
    cat_roll_free(c);
    /* An open batch is rolled back by SQLite on close. */
    sqlite3_close(c->db);
    free(c->path);
    free(c);
    *cp = NULL;
}

int cat_reopen(cat_t *c) {
    if (c->readonly) return reel_fail(REEL_E_INVALID, "catalog %s: opened read-only; not reopened", c->path);
    cat_t *fresh = cat_open(c->path, false);
    if (!fresh) return -1;
    /* The old connection's statements and summaries go with it; the
     * caller's handle stays the same. */
    cat_t old = *c;
    *c = *fresh;
    *fresh = old;
    cat_close(&fresh);
    return 0;
}

int cat_begin(cat_t *c) {
    if (cat_exec(c, "BEGIN IMMEDIATE", "begin") != 0) return -1; /* a batch already open keeps its deltas */
    cat_roll_reset(c);
    return 0;
}

/* The batch's summaries go in before it commits (catalog_rollup.c). */
int cat_commit(cat_t *c) {
    if (cat_roll_flush(c) != 0) return -1;
    return cat_exec(c, "COMMIT", "commit");
}

bool cat_failure_transient(const cat_t *c) {
    if (cat_roll_failed(c)) return true; /* out of memory: the batch again, later */
    switch (sqlite3_errcode(c->db) & 0xff) {
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_CANTOPEN:
    case SQLITE_NOMEM:
    case SQLITE_READONLY:
    case SQLITE_PROTOCOL:
    case SQLITE_NOTADB:  /* the file written over for now: a reopened connection reads it again */
    case SQLITE_CORRUPT: /* the store's, never the record's: keep the rows until it is mended */
        return true;
    default:
        return false;
    }
}

bool cat_failure_busy(const cat_t *c) {
    int rc = sqlite3_errcode(c->db) & 0xff;
    return !cat_roll_failed(c) && (rc == SQLITE_BUSY || rc == SQLITE_LOCKED);
}

/* Idempotent: with no batch open there is nothing to undo. */
int cat_rollback(cat_t *c) {
    cat_roll_reset(c);
    if (sqlite3_get_autocommit(c->db)) return 0;
    return cat_exec(c, "ROLLBACK", "rollback");
}

/* ---- writing records ------------------------------------------------------ */

static const struct {
    const char *sql;
    const char *what;
} statements[CAT_ST_COUNT] = {
#define CAT_KIND_STATEMENT(n, N, what) [CAT_K_##N] = { CAT_SQL_##N, what },
    CAT_RECORDS(CAT_KIND_STATEMENT)
#undef CAT_KIND_STATEMENT
    /* One current version per component: the one the broker resumes. */
    [CAT_ST_SUPERSEDE] = { "UPDATE weight_versions SET state = 'superseded'"
                           " WHERE component = ?1 AND version < ?2 AND state = 'current'",
                           "supersede older versions" },
    /* worker_applied: the newest version a worker applied (ok), kept as
     * outcomes come; a version that turned failed gives way to the newest
     * one still applied. */
    [CAT_ST_APPLIED] = { "INSERT INTO worker_applied (worker, component, version) VALUES (?1, ?2, ?3)"
                         " ON CONFLICT (worker, component) DO UPDATE SET version = max(version, excluded.version)",
                         "applied version" },
    [CAT_ST_UNAPPLIED] = { "DELETE FROM worker_applied WHERE worker = ?1 AND component = ?2 AND version = ?3",
                           "applied version" },
    [CAT_ST_REAPPLIED] = { "INSERT INTO worker_applied (worker, component, version) SELECT worker, component,"
                           " max(version) FROM worker_versions WHERE worker = ?1 AND component = ?2 AND ok = 1"
                           " GROUP BY worker, component ON CONFLICT (worker, component) DO NOTHING",
                           "applied version" },
    [CAT_ST_REPLAYS_NEW] = { "INSERT INTO captures (worker, key_hash, stream, replay_count, last_replay,"
                             " placeholder, t) VALUES (?1, ?2, ?3, ?4, ?6, 1, ?6)",
                             "replays without a capture" },
};

/* The cached statement `which`, prepared on first use; NULL with a message. */
static sqlite3_stmt *writer(cat_t *c, int which) {
    if (c->readonly) {
        reel_fail(REEL_E_IO, "catalog %s: opened read-only; cannot write", c->path);
        return NULL;
    }
    if (!c->st[which] && sqlite3_prepare_v3(c->db, statements[which].sql, -1, SQLITE_PREPARE_PERSISTENT,
                                            &c->st[which], NULL) != SQLITE_OK) {
        cat_db_fail(c, "prepare");
        c->st[which] = NULL;
    }
    return c->st[which];
}

/* Binding by field type: each returns a SQLite result code (the callers OR
 * them and compare the total with SQLITE_OK). A string is bound in place
 * (SQLITE_STATIC: the record outlives the step, and every parameter is
 * bound again before the statement's next step, so a pointer left bound
 * after it is never read), not copied: the catalog writer binds ~6
 * strings a request. */
static int bind_TEXT(sqlite3_stmt *s, int i, const char *v) {
    return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(s, i);
}
static int bind_OPT(sqlite3_stmt *s, int i, const char *v) { return bind_TEXT(s, i, v && *v ? v : NULL); }
static int bind_INT(sqlite3_stmt *s, int i, int v) { return sqlite3_bind_int(s, i, v); }
static int bind_U64(sqlite3_stmt *s, int i, uint64_t v) { return sqlite3_bind_int64(s, i, (sqlite3_int64)v); }
static int bind_F64(sqlite3_stmt *s, int i, double v) { return sqlite3_bind_double(s, i, v); }
static int bind_BOOL(sqlite3_stmt *s, int i, bool v) { return sqlite3_bind_int(s, i, v ? 1 : 0); }
static int bind_TIME(sqlite3_stmt *s, int i, double v) { return sqlite3_bind_double(s, i, v); }

/* Binds the fields of r in order as ?1, ?2, ...; a statement with fewer
 * parameters (the extra ones) takes the first of them. *all: whether
 * every parameter of s got a field. */
#define CAT_F_BIND(T, m) if (++i <= np) rc |= bind_##T(s, i, x->m);
static int bind(sqlite3_stmt *s, const cat_rec_t *r, bool *all) {
    int i = 0, rc = SQLITE_OK, np = sqlite3_bind_parameter_count(s);
    switch (r->kind) {
#define CAT_KIND_BIND(n, N, what)          \
    case CAT_K_##N: {                      \
        const cat_##n##_t *x = &r->u.n;    \
        CAT_##N(CAT_F_BIND)                \
        break;                             \
    }
        CAT_RECORDS(CAT_KIND_BIND)
#undef CAT_KIND_BIND
    case CAT_K_COUNT: break;
    }
    *all = i >= np;
    return rc;
}
#undef CAT_F_BIND

/* Runs statement `which` bound to r once and leaves it reset. (Its
 * bindings are cleared only when a parameter had no field: each run binds
 * every one again, sqlite3_clear_bindings was ~2% of a request's row.) */
static int run(cat_t *c, int which, const cat_rec_t *r) {
    sqlite3_stmt *s = writer(c, which);
    if (!s) return -1;
    int ret = 0;
    bool all = false;
    if (bind(s, r, &all) != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE) ret = cat_db_fail(c, statements[which].what);
    sqlite3_reset(s);
    if (!all) sqlite3_clear_bindings(s);
    return ret;
}

static bool known_state(const char *state) {
    return state && (!strcmp(state, "current") || !strcmp(state, "failed") || !strcmp(state, "superseded") ||
                     !strcmp(state, "pending"));
}

static int write_one(cat_t *c, const cat_rec_t *r);

/* The weights version a key text names ("... weights=transformer@3 ..."),
 * else 0. */
static uint64_t key_version(const char *text) {
    const char *w = text ? strstr(text, " weights=") : NULL, *at = w ? strchr(w, '@') : NULL;
    return at ? strtoull(at + 1, NULL, 10) : 0;
}

typedef struct {
    char *key_text, *key_hash;
    int stream;
} live_graph_t;

/* A READY of a known worker from a new process (another boot than the one
 * recorded): the graphs its old process held -- each (key, stream)'s
 * newest capture with no eviction since -- went with it (a SIGKILL, a
 * crash: a clean stop reports its own "shutdown" evictions first). Each
 * is recorded evicted, reason "worker_restarted", so the graphs held
 * (captures minus evictions) and `reelctl why` stay true. */
static int restarted_evictions(cat_t *c, const cat_worker_seen_t *x, double t) {
    if (!x->boot || !*x->boot) return 0;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, "SELECT boot FROM workers WHERE name = ?1", -1, &s, NULL) != SQLITE_OK)
        return cat_db_fail(c, "worker boot");
    cat_bind_text(s, 1, x->worker);
    bool restarted = sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) == SQLITE_TEXT &&
                     strcmp((const char *)sqlite3_column_text(s, 0), x->boot) != 0;
    sqlite3_finalize(s);
    if (!restarted) return 0;
    /* Each (key, stream)'s newest capture and newest eviction, grouped
     * once: evictions have no index by key, and a NOT EXISTS per capture
     * scanned all of the worker's evictions (minutes on the writer thread
     * for a worker with 100k of each: helper-77). */
    /* A graph is its key's lineage (the key text without its weights): a
     * sync that keeps graphs re-keys them in place with no capture under
     * the new key, so a graph captured at v2 and evicted under its v3 key
     * is gone (helper-78: it was recorded restarted too, and one recaptured
     * at v3 twice). */
    /* The key a graph had last is its lineage's newest row: a capture, or
     * the placeholder row its replays made under the key a sync re-keyed
     * it to (whose text key_texts has, from the worker's rekey event). A
     * graph captured at v2, re-keyed to v3 by a LoRA sync and replayed
     * there was held as the v3 graph: it is recorded evicted under its v3
     * key, at v3, as a clean stop's `shutdown` rows are (it was recorded
     * under its v2 key, counted at v2). Placeholders with no text stay
     * out, as before. */
#define LIVE_GRAPH_OF(text, hash) "coalesce(" CAT_KEY_BASE(text) ", " hash ")"
#define LIVE_TEXT(x) "coalesce(" x "key_text, k.key_text)"
#define LIVE_JOIN(x) " LEFT JOIN key_texts k ON " x "placeholder = 1 AND k.key_hash = " x "key_hash"
    static const char live_sql[] =
        "WITH last AS (SELECT max(c.id) AS id FROM captures c" LIVE_JOIN("c.")
        " WHERE c.worker = ?1 AND (c.placeholder = 0 OR k.key_text IS NOT NULL)"
        " GROUP BY " LIVE_GRAPH_OF(LIVE_TEXT("c."), "c.key_hash") ", c.stream),"
        " ev AS (SELECT " LIVE_GRAPH_OF("key_text", "key_hash") " AS g, stream, max(t) AS t FROM evictions"
        " WHERE worker = ?1 GROUP BY g, stream)"
        " SELECT " LIVE_TEXT("c.") ", c.key_hash, c.stream FROM last JOIN captures c ON c.id = last.id" LIVE_JOIN("c.")
        " WHERE c.t <= ?2 AND NOT EXISTS (SELECT 1 FROM ev WHERE ev.g = " LIVE_GRAPH_OF(LIVE_TEXT("c."), "c.key_hash")
        " AND (ev.stream = c.stream OR ev.stream IS NULL) AND ev.t >= c.t)";
#undef LIVE_GRAPH_OF
#undef LIVE_TEXT
#undef LIVE_JOIN
    if (sqlite3_prepare_v2(c->db, live_sql, -1, &s, NULL) != SQLITE_OK) return cat_db_fail(c, "graphs held");
    cat_bind_text(s, 1, x->worker);
    sqlite3_bind_double(s, 2, t);
    live_graph_t *g = NULL;
    size_t n = 0, cap = 0;
    int rc = 0, step;
    while ((step = sqlite3_step(s)) == SQLITE_ROW) { /* all read before any is written */
        if (n == cap) {
            live_graph_t *m = realloc(g, (cap = cap ? 2 * cap : 16) * sizeof *g);
            if (!m) { rc = reel_fail(REEL_E_NOMEM, "catalog %s: out of memory", c->path); break; }
            g = m;
        }
        const char *kt = (const char *)sqlite3_column_text(s, 0), *kh = (const char *)sqlite3_column_text(s, 1);
        g[n].key_text = kt ? strdup(kt) : NULL;
        g[n].key_hash = kh ? strdup(kh) : NULL;
        g[n].stream = sqlite3_column_int(s, 2);
        if (!g[n].key_hash || (kt && !g[n].key_text)) {
            free(g[n].key_text);
            free(g[n].key_hash);
            rc = reel_fail(REEL_E_NOMEM, "catalog %s: out of memory", c->path);
            break;
        }
        n++;
    }
    if (rc == 0 && step != SQLITE_DONE) rc = cat_db_fail(c, "graphs held");
    sqlite3_finalize(s);
    /* a key text without weights (or none): the version the worker last
     * applied, as its captures were counted at */
    uint64_t applied = 0;
    if (rc == 0 && n && sqlite3_prepare_v2(c->db, "SELECT max(version) FROM worker_applied WHERE worker = ?1", -1, &s,
                                           NULL) == SQLITE_OK) {
        cat_bind_text(s, 1, x->worker);
        if (sqlite3_step(s) == SQLITE_ROW) applied = (uint64_t)sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
    }
    for (size_t i = 0; i < n; i++) {
        cat_rec_t e = { .kind = CAT_K_EVICTION };
        e.u.eviction = (cat_eviction_t){ .worker = x->worker, .key_text = g[i].key_text ? g[i].key_text : "",
                                         .key_hash = g[i].key_hash, .stream = g[i].stream,
                                         .reason = "worker_restarted", .component = "",
                                         .version = key_version(g[i].key_text) ? key_version(g[i].key_text)
                                                                                : applied,
                                         .t = t };
        if (rc == 0) rc = write_one(c, &e);
        free(g[i].key_text);
        free(g[i].key_hash);
    }
    free(g);
    return rc;
}

/* The record's statements, then its share of the summaries: a capture
 * that changed nothing (reported before) counts once. */
static int write_one(cat_t *c, const cat_rec_t *r) {
    const char *state = r->u.weight_state.state;
    if (r->kind == CAT_K_WORKER_SEEN && restarted_evictions(c, &r->u.worker_seen, r->u.worker_seen.t) != 0)
        return -1;
    if (run(c, (int)r->kind, r) != 0) return -1;
    if (r->kind == CAT_K_WEIGHT_STATE && !strcmp(state, "current")) return run(c, CAT_ST_SUPERSEDE, r);
    if (r->kind == CAT_K_WORKER_VERSION) {
        if (r->u.worker_version.ok) return run(c, CAT_ST_APPLIED, r);
        if (run(c, CAT_ST_UNAPPLIED, r) != 0) return -1;
        return sqlite3_changes(c->db) ? run(c, CAT_ST_REAPPLIED, r) : 0;
    }
    if (r->kind == CAT_K_CAPTURE && sqlite3_changes(c->db) == 0) return 0;
    if (r->kind == CAT_K_REPLAYS && sqlite3_changes(c->db) == 0 && run(c, CAT_ST_REPLAYS_NEW, r) != 0) return -1;
    return cat_roll_add(c, r);
}

int cat_write(cat_t *c, const cat_rec_t *r) {
    if (r->kind < 0 || r->kind >= CAT_K_COUNT) return reel_fail(REEL_E_NOT_FOUND, "catalog %s: no such record kind", c->path);
    const char *state = r->u.weight_state.state;
    if (r->kind == CAT_K_WEIGHT_STATE && !known_state(state))
        return reel_fail(REEL_E_INVALID, "catalog %s: unknown weight version state '%s'", c->path, state ? state : "(null)");
    if (c->readonly) return reel_fail(REEL_E_IO, "catalog %s: opened read-only; cannot write", c->path);
    /* Outside a batch the record is a batch of its own, summaries and all. */
    if (!sqlite3_get_autocommit(c->db)) return write_one(c, r);
    if (cat_begin(c) != 0) return -1;
    if (write_one(c, r) != 0 || cat_commit(c) != 0) {
        cat_rollback(c);
        return -1;
    }
    return 0;
}

/* cat_worker_seen(c, ...) and the rest: each fills its record and writes it. */
#define CAT_KIND_WRITER(n, N, what)                  \
    int cat_##n(cat_t *c CAT_##N(CAT_F_PARAM)) {     \
        cat_rec_t r = { .kind = CAT_K_##N };         \
        cat_##n##_t *x = &r.u.n;                     \
        CAT_##N(CAT_F_ASSIGN)                        \
        return cat_write(c, &r);                     \
    }
CAT_RECORDS(CAT_KIND_WRITER)
#undef CAT_KIND_WRITER

/* ---- reading back what the broker resumes --------------------------------- */

/* The rows of sql (component, version, sha256, source, base_version,
 * lora_config) into out. */
static int versions_of(cat_t *c, const char *sql, const char *what, cat_version_t *out, int max) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(c->db, sql, -1, &q, NULL) != SQLITE_OK) return cat_db_fail(c, what);
    int n = 0, rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW && n < max) {
        cat_version_t *v = &out[n++];
        snprintf(v->component, sizeof v->component, "%s", (const char *)sqlite3_column_text(q, 0));
        v->version = (uint64_t)sqlite3_column_int64(q, 1);
        snprintf(v->sha256, sizeof v->sha256, "%s", (const char *)sqlite3_column_text(q, 2));
        const char *src = (const char *)sqlite3_column_text(q, 3);
        v->cut = (size_t)sqlite3_column_bytes(q, 3) >= sizeof v->source;
        snprintf(v->source, sizeof v->source, "%s", v->cut ? "" : src);
        v->base_version = (uint64_t)sqlite3_column_int64(q, 4);
        /* longer than a SYNC carries: not this broker's (left empty: not resumed) */
        const char *cfg = (const char *)sqlite3_column_text(q, 5);
        snprintf(v->lora_config, sizeof v->lora_config, "%s",
                 (size_t)sqlite3_column_bytes(q, 5) < sizeof v->lora_config ? cfg : "");
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        sqlite3_finalize(q);
        return cat_db_fail(c, what);
    }
    sqlite3_finalize(q);
    return n;
}

int cat_current_versions(cat_t *c, cat_version_t *out, int max) {
    return versions_of(c,
                       "SELECT component, version, coalesce(sha256, ''), coalesce(source, ''), coalesce(base_version, 0), "
                       "coalesce(lora_config, '') "
                       "FROM weight_versions w WHERE state = 'current' AND version = "
                       "(SELECT max(version) FROM weight_versions WHERE component = w.component"
                       " AND state = 'current') ORDER BY component",
                       "current versions", out, max);
}

int cat_interrupted_versions(cat_t *c, cat_version_t *out, int max) {
    return versions_of(c,
                       "SELECT component, version, coalesce(sha256, ''), coalesce(source, ''), coalesce(base_version, 0), "
                       "coalesce(lora_config, '') "
                       "FROM weight_versions w WHERE state = 'failed' AND reason = '" CAT_REASON_INTERRUPTED "' "
                       "AND version > coalesce((SELECT max(version) FROM weight_versions WHERE component = "
                       "w.component AND state IN ('current', 'superseded')), 0) ORDER BY component, version DESC",
                       "interrupted versions", out, max);
}

int cat_current_bases(cat_t *c, cat_version_t *out, int max) {
    return versions_of(c,
                       "SELECT b.component, b.version, coalesce(b.sha256, ''), coalesce(b.source, ''), 0, '' "
                       "FROM weight_versions w JOIN weight_versions b ON b.component = w.component "
                       "AND b.version = w.base_version WHERE w.state = 'current' AND w.version = "
                       "(SELECT max(version) FROM weight_versions WHERE component = w.component"
                       " AND state = 'current') AND coalesce(b.base_version, 0) = 0"
                       " AND b.state IN ('current', 'superseded') ORDER BY b.component",
                       "the current adapters' bases", out, max);
}

int cat_pending_versions(cat_t *c, cat_version_t *out, int max) {
    return versions_of(c,
                       "SELECT component, version, coalesce(sha256, ''), coalesce(source, ''), coalesce(base_version, 0), "
                       "coalesce(lora_config, '') "
                       "FROM weight_versions WHERE state = 'pending' ORDER BY component, version DESC",
                       "pending versions", out, max);
}

