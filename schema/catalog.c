/* catalog.c -- the SQLite catalog (see catalog.h): one writer connection in
 * the broker, any number of read-only connections in reelctl or sqlite3.
 *
 * WAL mode lets readers and the writer run at once: a reader sees the last
 * committed batch, never half of one, and never makes the writer wait.
 * Writes start with BEGIN IMMEDIATE so the write lock is taken up front and
 * a batch can not fail half-way with SQLITE_BUSY_SNAPSHOT. The schema is
 * migrated by PRAGMA user_version inside one transaction; a catalog newer
 * than this build is refused rather than written with an old idea of it.
 *
 * Reports are built as JSON (jansson) first; the table for people is drawn
 * from that same JSON, so the two forms can not disagree. Each report reads
 * one snapshot (a read transaction) so its totals add up.
 *
 * Hit rate, per worker and overall: replayed steps / all steps of the
 * finished requests (requests table). Where there are no requests it falls
 * back to replays / (replays + captures + declines) from the capture and
 * decline counters; "hit_rate_from" says which ("requests", "captures", or
 * null with hit_rate null when there is nothing to divide by). Eager breaks
 * are declines for "not_capturable" and "override".
 *
 * uint64 values (versions, budgets, byte counts) are stored as SQLite's
 * signed 64-bit INTEGER; values above INT64_MAX come back negative in
 * reports. */
#include "schema/catalog.h"
#include "kernels/error.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CAT_BUSY_TIMEOUT_MS 5000
#define CAT_RECENT_LIMIT 50
#define CAT_STR_(x) #x
#define CAT_STR(x) CAT_STR_(x)

/* Migration i (0-based) takes user_version i to i + 1. Migration 1 is the
 * first schema as it shipped (its text never changes: catalogs were built
 * from it); later ones are ALTERs, and schema/catalog.sql holds their sum
 * (tests/test_catalog.c builds a catalog from each and compares the two).
 * Not static: the test reads them (they are not part of catalog.h's
 * contract). */
const char cat_schema_v1_sql[] =
    "-- catalog.sql -- the Reel catalog schema (PRAGMA user_version 1).\n"
    "-- schema/catalog.c embeds this text verbatim as migration 1 and\n"
    "-- tests/test_catalog.c fails if the two differ. Times are UNIX seconds\n"
    "-- (REAL). Counters and versions are uint64 stored as SQLite INTEGER.\n"
    "\n"
    "-- Kernel/op artifacts built or checked on a backend.\n"
    "CREATE TABLE IF NOT EXISTS artifacts (\n"
    "    id      TEXT PRIMARY KEY,\n"
    "    op      TEXT NOT NULL,\n"
    "    backend TEXT NOT NULL,\n"
    "    sha256  TEXT,\n"
    "    status  TEXT NOT NULL,\n"
    "    reason  TEXT,\n"
    "    t       REAL NOT NULL\n"
    ");\n"
    "\n"
    "-- Every weight version the trainer published.\n"
    "CREATE TABLE IF NOT EXISTS weight_versions (\n"
    "    component TEXT NOT NULL,\n"
    "    version   INTEGER NOT NULL,\n"
    "    sha256    TEXT NOT NULL,\n"
    "    source    TEXT,\n"
    "    t         REAL NOT NULL,\n"
    "    PRIMARY KEY (component, version)\n"
    ");\n"
    "\n"
    "-- Workers that ever sent READY; gone_at is NULL while the worker is live.\n"
    "CREATE TABLE IF NOT EXISTS workers (\n"
    "    name        TEXT PRIMARY KEY,\n"
    "    device      TEXT,\n"
    "    arch        TEXT,\n"
    "    streams     INTEGER,\n"
    "    budget      INTEGER,\n"
    "    first_seen  REAL NOT NULL,\n"
    "    last_seen   REAL NOT NULL,\n"
    "    gone_at     REAL,\n"
    "    gone_reason TEXT\n"
    ");\n"
    "\n"
    "-- Which worker applied (ok = 1) or failed to apply which weight version;\n"
    "-- the latest outcome per (worker, component, version) wins.\n"
    "CREATE TABLE IF NOT EXISTS worker_versions (\n"
    "    worker    TEXT NOT NULL,\n"
    "    component TEXT NOT NULL,\n"
    "    version   INTEGER NOT NULL,\n"
    "    ok        INTEGER NOT NULL,\n"
    "    error     TEXT,\n"
    "    t         REAL NOT NULL,\n"
    "    PRIMARY KEY (worker, component, version)\n"
    ");\n"
    "\n"
    "-- One row per graph captured. placeholder = 1 marks a row made for replays\n"
    "-- whose capture was never reported, so that no replay is lost; it does not\n"
    "-- count as a capture.\n"
    "CREATE TABLE IF NOT EXISTS captures (\n"
    "    id              INTEGER PRIMARY KEY,\n"
    "    worker          TEXT NOT NULL,\n"
    "    stream          INTEGER NOT NULL,\n"
    "    key_text        TEXT,\n"
    "    key_hash        TEXT NOT NULL,\n"
    "    capture_seconds REAL NOT NULL DEFAULT 0,\n"
    "    bytes           INTEGER NOT NULL DEFAULT 0,\n"
    "    nodes           INTEGER NOT NULL DEFAULT 0,\n"
    "    replay_count    INTEGER NOT NULL DEFAULT 0,\n"
    "    last_replay     REAL,\n"
    "    placeholder     INTEGER NOT NULL DEFAULT 0,\n"
    "    t               REAL NOT NULL,\n"
    "    UNIQUE (worker, key_hash, stream, t)\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS captures_by_key ON captures (key_hash);\n"
    "\n"
    "CREATE TABLE IF NOT EXISTS evictions (\n"
    "    id           INTEGER PRIMARY KEY,\n"
    "    worker       TEXT NOT NULL,\n"
    "    key_text     TEXT,\n"
    "    key_hash     TEXT NOT NULL,\n"
    "    reason       TEXT NOT NULL,\n"
    "    component    TEXT,\n"
    "    from_version INTEGER,\n"
    "    to_version   INTEGER,\n"
    "    t            REAL NOT NULL\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS evictions_by_time ON evictions (t);\n"
    "CREATE INDEX IF NOT EXISTS evictions_by_worker ON evictions (worker, reason);\n"
    "\n"
    "-- Decline counters: one row per (worker, key, reason), count accumulates.\n"
    "CREATE TABLE IF NOT EXISTS declines (\n"
    "    worker   TEXT NOT NULL,\n"
    "    key_hash TEXT NOT NULL,\n"
    "    key_text TEXT,\n"
    "    reason   TEXT NOT NULL,\n"
    "    count    INTEGER NOT NULL DEFAULT 0,\n"
    "    last_t   REAL NOT NULL,\n"
    "    PRIMARY KEY (worker, key_hash, reason)\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS declines_by_key ON declines (key_hash);\n"
    "\n"
    "-- Finished requests as the client saw them; id is the client's request id\n"
    "-- (not unique across broker restarts, hence no constraint).\n"
    "CREATE TABLE IF NOT EXISTS requests (\n"
    "    id       INTEGER NOT NULL,\n"
    "    worker   TEXT NOT NULL,\n"
    "    key_hash TEXT,\n"
    "    version  INTEGER NOT NULL,\n"
    "    steps    INTEGER NOT NULL,\n"
    "    captured INTEGER NOT NULL,\n"
    "    replayed INTEGER NOT NULL,\n"
    "    eager    INTEGER NOT NULL,\n"
    "    seconds  REAL NOT NULL,\n"
    "    status   TEXT NOT NULL,\n"
    "    t        REAL NOT NULL\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS requests_by_time ON requests (t);\n"
    "CREATE INDEX IF NOT EXISTS requests_by_worker ON requests (worker);\n";

/* Migration 2: a published weight version has a state. It is 'pending'
 * until a worker applies it, then 'current' (the broker resumes it after a
 * restart) until a newer one becomes current ('superseded'); 'failed' when
 * no worker applied it, with the reason. Before this the broker took every
 * published version as current, even one nobody could load: existing rows
 * are classified by what the workers reported. */
const char cat_schema_v2_sql[] =
    "ALTER TABLE weight_versions ADD COLUMN state TEXT NOT NULL DEFAULT 'pending';\n"
    "ALTER TABLE weight_versions ADD COLUMN reason TEXT;\n"
    "UPDATE weight_versions SET state = 'failed', reason = 'no worker applied it'"
    " WHERE NOT EXISTS (SELECT 1 FROM worker_versions v WHERE v.component = weight_versions.component"
    " AND v.version = weight_versions.version AND v.ok = 1);\n"
    "UPDATE weight_versions SET state = 'current' WHERE state = 'pending' AND version ="
    " (SELECT max(version) FROM weight_versions w WHERE w.component = weight_versions.component"
    " AND w.state = 'pending');\n"
    "UPDATE weight_versions SET state = 'superseded' WHERE state = 'pending';\n";

static const char *const migrations[] = { cat_schema_v1_sql, cat_schema_v2_sql };
#define CAT_SCHEMA_VERSION ((int)(sizeof migrations / sizeof migrations[0]))

int cat_schema_version(void) { return CAT_SCHEMA_VERSION; }

/* The writers' statements, prepared on first use and kept for the life of
 * the connection (the catalog thread runs them thousands of times). */
enum {
    ST_WORKER_SEEN,
    ST_WORKER_GONE,
    ST_WEIGHT_VERSION,
    ST_WEIGHT_STATE,
    ST_WEIGHT_SUPERSEDE,
    ST_WEIGHT_FAIL_PENDING,
    ST_WORKER_VERSION,
    ST_CAPTURE,
    ST_REPLAYS_ADD,
    ST_REPLAYS_NEW,
    ST_EVICTION,
    ST_DECLINE,
    ST_REQUEST,
    ST_ARTIFACT,
    ST_COUNT
};

static const char *const writer_sql[ST_COUNT] = {
    [ST_WORKER_SEEN] =
        "INSERT INTO workers (name, device, arch, streams, budget, first_seen, last_seen)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)"
        " ON CONFLICT (name) DO UPDATE SET device = excluded.device, arch = excluded.arch,"
        " streams = excluded.streams, budget = excluded.budget,"
        " first_seen = min(first_seen, excluded.first_seen),"
        " last_seen = max(last_seen, excluded.last_seen),"
        /* seen after it went: live again; a late, older READY leaves it gone */
        " gone_reason = CASE WHEN gone_at > excluded.last_seen THEN gone_reason END,"
        " gone_at = CASE WHEN gone_at > excluded.last_seen THEN gone_at END",
    [ST_WORKER_GONE] =
        "INSERT INTO workers (name, first_seen, last_seen, gone_at, gone_reason)"
        " VALUES (?1, ?3, ?3, ?3, ?2)"
        " ON CONFLICT (name) DO UPDATE SET gone_at = excluded.gone_at,"
        " gone_reason = excluded.gone_reason",
    [ST_WEIGHT_VERSION] =
        "INSERT INTO weight_versions (component, version, sha256, source, t)"
        " VALUES (?1, ?2, ?3, ?4, ?5)"
        /* published again after it failed: a new attempt, pending again */
        " ON CONFLICT (component, version) DO UPDATE SET sha256 = excluded.sha256,"
        " source = coalesce(excluded.source, source), t = excluded.t, state = 'pending',"
        " reason = NULL",
    [ST_WEIGHT_STATE] =
        "UPDATE weight_versions SET state = ?3, reason = ?4 WHERE component = ?1 AND version = ?2",
    [ST_WEIGHT_SUPERSEDE] =
        "UPDATE weight_versions SET state = 'superseded'"
        " WHERE component = ?1 AND version < ?2 AND state = 'current'",
    [ST_WEIGHT_FAIL_PENDING] =
        "UPDATE weight_versions SET state = 'failed', reason = ?1 WHERE state = 'pending'",
    [ST_WORKER_VERSION] =
        "INSERT INTO worker_versions (worker, component, version, ok, error, t)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
        " ON CONFLICT (worker, component, version) DO UPDATE SET ok = excluded.ok,"
        " error = excluded.error, t = excluded.t",
    [ST_CAPTURE] =
        "INSERT INTO captures (worker, stream, key_text, key_hash, capture_seconds, bytes, nodes, t)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
        " ON CONFLICT (worker, key_hash, stream, t) DO UPDATE SET key_text = excluded.key_text,"
        " capture_seconds = excluded.capture_seconds, bytes = excluded.bytes,"
        " nodes = excluded.nodes, placeholder = 0",
    [ST_REPLAYS_ADD] =
        "UPDATE captures SET replay_count = replay_count + ?4,"
        " last_replay = max(coalesce(last_replay, ?5), ?5)"
        " WHERE id = (SELECT id FROM captures WHERE worker = ?1 AND key_hash = ?2 AND stream = ?3"
        " ORDER BY t DESC, id DESC LIMIT 1)",
    [ST_REPLAYS_NEW] =
        "INSERT INTO captures (worker, key_hash, stream, replay_count, last_replay, placeholder, t)"
        " VALUES (?1, ?2, ?3, ?4, ?5, 1, ?5)",
    [ST_EVICTION] =
        "INSERT INTO evictions (worker, key_text, key_hash, reason, component, from_version,"
        " to_version, t) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [ST_DECLINE] =
        "INSERT INTO declines (worker, key_hash, key_text, reason, count, last_t)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
        " ON CONFLICT (worker, key_hash, reason) DO UPDATE SET count = count + excluded.count,"
        " last_t = max(last_t, excluded.last_t), key_text = coalesce(excluded.key_text, key_text)",
    [ST_REQUEST] =
        "INSERT INTO requests (id, worker, key_hash, version, steps, captured, replayed, eager,"
        " seconds, status, t) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    [ST_ARTIFACT] =
        "INSERT INTO artifacts (id, op, backend, sha256, status, reason, t)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
        " ON CONFLICT (id) DO UPDATE SET op = excluded.op, backend = excluded.backend,"
        " sha256 = excluded.sha256, status = excluded.status, reason = excluded.reason,"
        " t = excluded.t",
};

struct cat {
    sqlite3 *db;
    char *path;
    bool readonly;
    sqlite3_stmt *st[ST_COUNT];
};

/* Records "catalog PATH: what: sqlite's message" and returns -1. */
static int db_fail(const cat_t *c, const char *what) {
    return kern_fail("catalog %s: %s: %s", c->path, what, sqlite3_errmsg(c->db));
}

static int exec(cat_t *c, const char *sql, const char *what) {
    char *msg = NULL;
    if (sqlite3_exec(c->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        kern_fail("catalog %s: %s: %s", c->path, what, msg ? msg : sqlite3_errmsg(c->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

/* Reads an integer PRAGMA (or any one-integer query) into *out. */
static int query_int(cat_t *c, const char *sql, int *out) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK) return db_fail(c, sql);
    int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW) {
        db_fail(c, sql);
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
        return db_fail(c, "journal_mode=WAL");
    int rc = sqlite3_step(s);
    const char *mode = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(s, 0) : NULL;
    int ret = 0;
    if (!mode) ret = db_fail(c, "journal_mode=WAL");
    else if (strcmp(mode, "wal") != 0)
        ret = kern_fail("catalog %s: WAL is not available here (journal_mode is %s)", c->path, mode);
    sqlite3_finalize(s);
    return ret;
}

static int schema_newer(const cat_t *c, int v) {
    return kern_fail("%s: catalog schema %d is newer than this build's %d", c->path, v,
                     CAT_SCHEMA_VERSION);
}

/* Brings user_version up to CAT_SCHEMA_VERSION in one transaction: either
 * every step applies or none does. Does nothing on a current catalog. */
static int migrate(cat_t *c) {
    if (exec(c, "BEGIN IMMEDIATE", "begin migration") != 0) return -1;
    int v;
    if (query_int(c, "PRAGMA user_version", &v) != 0) goto err;
    if (v > CAT_SCHEMA_VERSION) {
        schema_newer(c, v);
        goto err;
    }
    for (int i = v; i < CAT_SCHEMA_VERSION; i++) {
        char what[64];
        snprintf(what, sizeof what, "migration to schema %d", i + 1);
        if (exec(c, migrations[i], what) != 0) goto err;
    }
    if (v < CAT_SCHEMA_VERSION) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", CAT_SCHEMA_VERSION);
        if (exec(c, sql, "set user_version") != 0) goto err;
    }
    if (exec(c, "COMMIT", "commit migration") != 0) goto err;
    return 0;
err:
    sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

static int check_readable_schema(cat_t *c) {
    int v;
    if (query_int(c, "PRAGMA user_version", &v) != 0) return -1;
    if (v > CAT_SCHEMA_VERSION) return schema_newer(c, v);
    if (v == 0) return kern_fail("catalog %s: not a Reel catalog (no schema; user_version 0)", c->path);
    if (v < CAT_SCHEMA_VERSION)
        return kern_fail("catalog %s: schema %d is older than this build's %d; the broker "
                         "migrates it when it opens it", c->path, v, CAT_SCHEMA_VERSION);
    return 0;
}

cat_t *cat_open(const char *path, bool readonly) {
    if (!path || !*path) {
        kern_fail("catalog: empty path");
        return NULL;
    }
    /* SQLite's CANTOPEN says neither which file nor why; say both. */
    if (readonly && access(path, F_OK) != 0) {
        kern_fail("catalog %s: cannot open read-only: %s", path, strerror(errno));
        return NULL;
    }
    /* Debian's SQLite interprets "file:" URIs (query parameters can change
     * modes and VFS); a catalog is a plain path. */
    if (!strncmp(path, "file:", 5)) {
        kern_fail("catalog %s: SQLite URIs are not accepted; give a plain file path", path);
        return NULL;
    }
    /* The catalog holds the audit trail: create it readable by its owner
     * only (SQLite gives its -wal and -shm files the same mode). */
    if (!readonly) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
            kern_fail("catalog %s: cannot open: %s", path, strerror(errno));
            return NULL;
        }
        close(fd);
    }
    cat_t *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        kern_fail("catalog %s: out of memory", path);
        goto err;
    }
    c->readonly = readonly;
    int flags = (readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) |
                SQLITE_OPEN_NOFOLLOW;
    if (sqlite3_open_v2(path, &c->db, flags, NULL) != SQLITE_OK) {
        if (c->db) db_fail(c, "open");
        else kern_fail("catalog %s: open: out of memory", path);
        goto err;
    }
    sqlite3_busy_timeout(c->db, CAT_BUSY_TIMEOUT_MS);
    if (readonly) {
        if (check_readable_schema(c) != 0) goto err;
        return c;
    }
    if (enable_wal(c) != 0) goto err;
    if (exec(c, "PRAGMA synchronous=NORMAL", "synchronous=NORMAL") != 0) goto err;
    if (exec(c, "PRAGMA foreign_keys=OFF", "foreign_keys=OFF") != 0) goto err;
    if (migrate(c) != 0) goto err;
    return c;
err:
    cat_close(&c);
    return NULL;
}

void cat_close(cat_t **cp) {
    if (!cp || !*cp) return;
    cat_t *c = *cp;
    for (int i = 0; i < ST_COUNT; i++) sqlite3_finalize(c->st[i]);
    /* An open batch is rolled back by SQLite on close. */
    sqlite3_close(c->db);
    free(c->path);
    free(c);
    *cp = NULL;
}

int cat_begin(cat_t *c) { return exec(c, "BEGIN IMMEDIATE", "begin"); }
int cat_commit(cat_t *c) { return exec(c, "COMMIT", "commit"); }

/* Idempotent: with no batch open there is nothing to undo. */
int cat_rollback(cat_t *c) {
    if (sqlite3_get_autocommit(c->db)) return 0;
    return exec(c, "ROLLBACK", "rollback");
}

/* ---- writers --------------------------------------------------------- */

/* The cached statement `which`, prepared on first use; NULL with a message. */
static sqlite3_stmt *writer(cat_t *c, int which) {
    if (c->readonly) {
        kern_fail("catalog %s: opened read-only; cannot write", c->path);
        return NULL;
    }
    if (!c->st[which] && sqlite3_prepare_v3(c->db, writer_sql[which], -1, SQLITE_PREPARE_PERSISTENT,
                                            &c->st[which], NULL) != SQLITE_OK) {
        db_fail(c, "prepare");
        c->st[which] = NULL;
    }
    return c->st[which];
}

/* Binding helpers: each returns a SQLite result code; callers OR them and
 * only compare the total with SQLITE_OK. */
static int bind_text(sqlite3_stmt *s, int i, const char *v) {
    return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(s, i);
}
static int bind_u64(sqlite3_stmt *s, int i, uint64_t v) {
    return sqlite3_bind_int64(s, i, (sqlite3_int64)v);
}

/* Steps a bound writer once and leaves it reset for the next call. */
static int run(cat_t *c, sqlite3_stmt *s, int bind_rc, const char *what) {
    int ret = 0;
    if (bind_rc != SQLITE_OK) ret = db_fail(c, what);
    else if (sqlite3_step(s) != SQLITE_DONE) ret = db_fail(c, what);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return ret;
}

int cat_worker_seen(cat_t *c, const char *worker, const char *device, const char *arch,
                    int streams, uint64_t budget, double t) {
    sqlite3_stmt *s = writer(c, ST_WORKER_SEEN);
    if (!s) return -1;
    int b = bind_text(s, 1, worker) | bind_text(s, 2, device) | bind_text(s, 3, arch) |
            sqlite3_bind_int(s, 4, streams) | bind_u64(s, 5, budget) | sqlite3_bind_double(s, 6, t);
    return run(c, s, b, "worker seen");
}

int cat_worker_gone(cat_t *c, const char *worker, const char *why, double t) {
    sqlite3_stmt *s = writer(c, ST_WORKER_GONE);
    if (!s) return -1;
    int b = bind_text(s, 1, worker) | bind_text(s, 2, why) | sqlite3_bind_double(s, 3, t);
    return run(c, s, b, "worker gone");
}

int cat_weight_version(cat_t *c, const char *component, uint64_t version, const char *sha256,
                       const char *source, double t) {
    sqlite3_stmt *s = writer(c, ST_WEIGHT_VERSION);
    if (!s) return -1;
    int b = bind_text(s, 1, component) | bind_u64(s, 2, version) | bind_text(s, 3, sha256) |
            bind_text(s, 4, source) | sqlite3_bind_double(s, 5, t);
    return run(c, s, b, "weight version");
}

int cat_weight_state(cat_t *c, const char *component, uint64_t version, const char *state,
                     const char *reason) {
    if (!state || (strcmp(state, "current") && strcmp(state, "failed") && strcmp(state, "superseded") &&
                   strcmp(state, "pending")))
        return kern_fail("catalog %s: unknown weight version state '%s'", c->path, state ? state : "(null)");
    sqlite3_stmt *s = writer(c, ST_WEIGHT_STATE);
    if (!s) return -1;
    int b = bind_text(s, 1, component) | bind_u64(s, 2, version) | bind_text(s, 3, state) |
            bind_text(s, 4, reason);
    if (run(c, s, b, "weight version state") != 0) return -1;
    /* One current version per component: the one the broker resumes. */
    if (strcmp(state, "current")) return 0;
    if (!(s = writer(c, ST_WEIGHT_SUPERSEDE))) return -1;
    b = bind_text(s, 1, component) | bind_u64(s, 2, version);
    return run(c, s, b, "supersede older versions");
}

int cat_weight_fail_pending(cat_t *c, const char *reason) {
    sqlite3_stmt *s = writer(c, ST_WEIGHT_FAIL_PENDING);
    if (!s) return -1;
    return run(c, s, bind_text(s, 1, reason), "fail pending versions");
}

int cat_current_versions(cat_t *c, cat_version_t *out, int max) {
    sqlite3_stmt *q = NULL;
    const char *sql = "SELECT component, version, coalesce(sha256, ''), coalesce(source, '') "
                      "FROM weight_versions w WHERE state = 'current' AND version = "
                      "(SELECT max(version) FROM weight_versions WHERE component = w.component"
                      " AND state = 'current') ORDER BY component";
    if (sqlite3_prepare_v2(c->db, sql, -1, &q, NULL) != SQLITE_OK) return db_fail(c, "current versions");
    int n = 0, rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW && n < max) {
        cat_version_t *v = &out[n++];
        snprintf(v->component, sizeof v->component, "%s", (const char *)sqlite3_column_text(q, 0));
        v->version = (uint64_t)sqlite3_column_int64(q, 1);
        snprintf(v->sha256, sizeof v->sha256, "%s", (const char *)sqlite3_column_text(q, 2));
        snprintf(v->source, sizeof v->source, "%s", (const char *)sqlite3_column_text(q, 3));
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        sqlite3_finalize(q);
        return db_fail(c, "current versions");
    }
    sqlite3_finalize(q);
    return n;
}

int cat_worker_version(cat_t *c, const char *worker, const char *component, uint64_t version,
                       bool ok, const char *error, double t) {
    sqlite3_stmt *s = writer(c, ST_WORKER_VERSION);
    if (!s) return -1;
    int b = bind_text(s, 1, worker) | bind_text(s, 2, component) | bind_u64(s, 3, version) |
            sqlite3_bind_int(s, 4, ok ? 1 : 0) | bind_text(s, 5, error) | sqlite3_bind_double(s, 6, t);
    return run(c, s, b, "worker version");
}

int cat_capture(cat_t *c, const char *worker, const char *key_text, const char *key_hash,
                int stream, uint64_t bytes, uint64_t nodes, double seconds, double t) {
    sqlite3_stmt *s = writer(c, ST_CAPTURE);
    if (!s) return -1;
    int b = bind_text(s, 1, worker) | sqlite3_bind_int(s, 2, stream) | bind_text(s, 3, key_text) |
            bind_text(s, 4, key_hash) | sqlite3_bind_double(s, 5, seconds) | bind_u64(s, 6, bytes) |
            bind_u64(s, 7, nodes) | sqlite3_bind_double(s, 8, t);
    return run(c, s, b, "capture");
}

/* Replays land on the newest capture of (worker, key, stream). A replay
 * whose capture was never reported (a lost message, a catalog created after
 * the worker started) gets a placeholder row so the count is not lost. */
int cat_replays(cat_t *c, const char *worker, const char *key_hash, int stream, uint64_t count,
                double t) {
    sqlite3_stmt *s = writer(c, ST_REPLAYS_ADD);
    if (!s) return -1;
    int b = bind_text(s, 1, worker) | bind_text(s, 2, key_hash) | sqlite3_bind_int(s, 3, stream) |
            bind_u64(s, 4, count) | sqlite3_bind_double(s, 5, t);
    if (run(c, s, b, "replays") != 0) return -1;
    if (sqlite3_changes(c->db) > 0) return 0;
    if (!(s = writer(c, ST_REPLAYS_NEW))) return -1;
    b = bind_text(s, 1, worker) | bind_text(s, 2, key_hash) | sqlite3_bind_int(s, 3, stream) |
        bind_u64(s, 4, count) | sqlite3_bind_double(s, 5, t);
    return run(c, s, b, "replays without a capture");
}

int cat_eviction(cat_t *c, const char *worker, const char *key_text, const char *key_hash,
                 const char *reason, const char *component, uint64_t from_version,
                 uint64_t to_version, double t) {
    sqlite3_stmt *s = writer(c, ST_EVICTION);
    if (!s) return -1;
    int b = bind_text(s, 1, worker) | bind_text(s, 2, key_text) | bind_text(s, 3, key_hash) |
            bind_text(s, 4, reason) | bind_text(s, 5, component) | bind_u64(s, 6, from_version) |
            bind_u64(s, 7, to_version) | sqlite3_bind_double(s, 8, t);
    return run(c, s, b, "eviction");
}

int cat_decline(cat_t *c, const char *worker, const char *key_text, const char *key_hash,
                const char *reason, uint64_t count, double t) {
    sqlite3_stmt *s = writer(c, ST_DECLINE);
    if (!s) return -1;
    int b = bind_text(s, 1, worker) | bind_text(s, 2, key_hash) | bind_text(s, 3, key_text) |
            bind_text(s, 4, reason) | bind_u64(s, 5, count) | sqlite3_bind_double(s, 6, t);
    return run(c, s, b, "decline");
}

int cat_request(cat_t *c, uint64_t id, const char *worker, const char *key_hash, uint64_t version,
                int steps, int captured, int replayed, int eager, double seconds, const char *status,
                double t) {
    sqlite3_stmt *s = writer(c, ST_REQUEST);
    if (!s) return -1;
    int b = bind_u64(s, 1, id) | bind_text(s, 2, worker) | bind_text(s, 3, key_hash) |
            bind_u64(s, 4, version) | sqlite3_bind_int(s, 5, steps) | sqlite3_bind_int(s, 6, captured) |
            sqlite3_bind_int(s, 7, replayed) | sqlite3_bind_int(s, 8, eager) |
            sqlite3_bind_double(s, 9, seconds) | bind_text(s, 10, status) | sqlite3_bind_double(s, 11, t);
    return run(c, s, b, "request");
}

int cat_artifact(cat_t *c, const char *id, const char *op, const char *backend, const char *sha256,
                 const char *status, const char *reason, double t) {
    sqlite3_stmt *s = writer(c, ST_ARTIFACT);
    if (!s) return -1;
    int b = bind_text(s, 1, id) | bind_text(s, 2, op) | bind_text(s, 3, backend) |
            bind_text(s, 4, sha256) | bind_text(s, 5, status) | bind_text(s, 6, reason) |
            sqlite3_bind_double(s, 7, t);
    return run(c, s, b, "artifact");
}

/* ---- reports: queries to JSON ----------------------------------------- */

static sqlite3_stmt *reader(cat_t *c, const char *sql) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK) {
        db_fail(c, "prepare report");
        sqlite3_finalize(s);
        return NULL;
    }
    return s;
}

/* A JSON string of n bytes. jansson takes UTF-8 only; key texts and worker
 * names come from the network, so bytes that are not UTF-8 become '?'
 * rather than failing the whole report. */
static json_t *json_text(const char *p, size_t n) {
    json_t *j = json_stringn(p, n);
    if (j) return j;
    char *q = malloc(n + 1);
    if (!q) return NULL;
    for (size_t i = 0; i < n; i++) q[i] = (unsigned char)p[i] < 0x80 ? p[i] : '?';
    j = json_stringn(q, n);
    free(q);
    return j;
}

static json_t *column_json(sqlite3_stmt *s, int i) {
    switch (sqlite3_column_type(s, i)) {
    case SQLITE_INTEGER: return json_integer(sqlite3_column_int64(s, i));
    case SQLITE_FLOAT: return json_real(sqlite3_column_double(s, i));
    case SQLITE_TEXT:
    case SQLITE_BLOB: {
        const char *p = (const char *)sqlite3_column_text(s, i);
        return p ? json_text(p, (size_t)sqlite3_column_bytes(s, i)) : json_null();
    }
    default: return json_null();
    }
}

/* Steps s to the end. mode 'o': each row an object keyed by column name
 * (the queries' aliases are the JSON keys); 'v': the first column of each
 * row; 'k': one object mapping column 0 to column 1. Resets s (bindings
 * stay). NULL with a message on failure. */
static json_t *collect(cat_t *c, sqlite3_stmt *s, char mode) {
    json_t *all = mode == 'k' ? json_object() : json_array();
    if (!all) goto oom;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int n = sqlite3_column_count(s);
        json_t *item;
        if (mode == 'o') {
            if (!(item = json_object())) goto oom;
            for (int i = 0; i < n; i++) {
                json_t *v = column_json(s, i);
                if (!v || json_object_set_new(item, sqlite3_column_name(s, i), v) != 0) {
                    json_decref(item);
                    goto oom;
                }
            }
            if (json_array_append_new(all, item) != 0) goto oom;
        } else if (mode == 'v') {
            if (!(item = column_json(s, 0)) || json_array_append_new(all, item) != 0) goto oom;
        } else {
            json_t *key = column_json(s, 0);
            const char *k = json_is_string(key) ? json_string_value(key) : "?";
            int bad = !key || !(item = column_json(s, 1)) || json_object_set_new(all, k, item) != 0;
            json_decref(key);
            if (bad) goto oom;
        }
    }
    if (rc != SQLITE_DONE) {
        db_fail(c, "report query");
        json_decref(all);
        sqlite3_reset(s);
        return NULL;
    }
    sqlite3_reset(s);
    return all;
oom:
    kern_fail("catalog %s: report: out of memory", c->path);
    json_decref(all);
    sqlite3_reset(s);
    return NULL;
}

/* A whole query with no parameters, as an array of row objects. */
static json_t *query_rows(cat_t *c, const char *sql) {
    sqlite3_stmt *s = reader(c, sql);
    if (!s) return NULL;
    json_t *rows = collect(c, s, 'o');
    sqlite3_finalize(s);
    return rows;
}

/* Runs sub (bound to `key` of each row, as ?1 and, when key2 is set, ?2)
 * once per row of rows and stores what it collects as row[field]. */
static int attach(cat_t *c, json_t *rows, const char *sql, const char *key, const char *key2,
                  char mode, const char *field) {
    sqlite3_stmt *s = reader(c, sql);
    if (!s) return -1;
    size_t i;
    json_t *row;
    int ret = 0;
    json_array_foreach(rows, i, row) {
        const char *keys[2] = { key, key2 };
        int b = SQLITE_OK;
        for (int k = 0; k < 2 && keys[k]; k++) {
            json_t *v = json_object_get(row, keys[k]);
            if (json_is_string(v)) b |= bind_text(s, k + 1, json_string_value(v));
            else if (json_is_integer(v)) b |= sqlite3_bind_int64(s, k + 1, json_integer_value(v));
            else b |= sqlite3_bind_null(s, k + 1);
        }
        json_t *got = b == SQLITE_OK ? collect(c, s, mode) : NULL;
        if (b != SQLITE_OK) db_fail(c, "bind report query");
        if (!got || json_object_set_new(row, field, got) != 0) {
            ret = -1;
            break;
        }
    }
    sqlite3_finalize(s);
    return ret;
}

/* ---- reports: JSON to tables ------------------------------------------ */

typedef enum {
    F_TEXT,   /* as is */
    F_NUM,    /* integer, right-aligned */
    F_RATE,   /* fraction as a percentage */
    F_SECS,   /* seconds, 3 decimals */
    F_TIME,   /* UNIX time as UTC ISO-8601 */
    F_LIST,   /* array joined with ',' (objects: their values joined with ':') */
    F_MAP,    /* object as k=v,k=v */
} fmt_t;

typedef struct {
    const char *key;   /* field of the row object */
    const char *head;  /* column header */
    fmt_t fmt;
    int max;           /* longer cells are cut with "..."; 0: never */
} col_t;

/* A growable string; every append is checked once, at the end, via ok. */
typedef struct { char *p; size_t n, cap; bool ok; } buf_t;

static void buf_add(buf_t *b, const char *s, size_t n) {
    if (!b->ok) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->ok = false;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void buf_str(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }

static void buf_scalar(buf_t *b, const json_t *v, fmt_t f) {
    char tmp[64];
    if (!v || json_is_null(v)) {
        buf_str(b, "-");
    } else if (json_is_string(v)) {
        buf_add(b, json_string_value(v), json_string_length(v));
    } else if (json_is_boolean(v)) {
        buf_str(b, json_is_true(v) ? "yes" : "no");
    } else if (f == F_TIME && json_is_number(v)) {
        double t = json_number_value(v);
        /* Converting a NaN, an infinity or a value beyond time_t is UB: check
         * first (a corrupt or hostile catalog may hold any double). */
        bool ok = isfinite(t) && t > -1e15 && t < 1e15;
        time_t secs = ok ? (time_t)floor(t) : 0;
        struct tm tm;
        if (ok && gmtime_r(&secs, &tm) && strftime(tmp, sizeof tmp, "%Y-%m-%dT%H:%M:%SZ", &tm))
            buf_str(b, tmp);
        else buf_str(b, "?");
    } else if (f == F_RATE && json_is_number(v)) {
        snprintf(tmp, sizeof tmp, "%.1f%%", 100.0 * json_number_value(v));
        buf_str(b, tmp);
    } else if (f == F_SECS && json_is_number(v)) {
        snprintf(tmp, sizeof tmp, "%.3f", json_number_value(v));
        buf_str(b, tmp);
    } else if (json_is_integer(v)) {
        snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        buf_str(b, tmp);
    } else if (json_is_real(v)) {
        snprintf(tmp, sizeof tmp, "%g", json_real_value(v));
        buf_str(b, tmp);
    } else {
        buf_str(b, "?");
    }
}

/* The text of one cell: control characters (a key text with a newline
 * would break the table) become '?', and long cells are cut. */
static char *cell(const json_t *row, const col_t *col) {
    buf_t b = { .ok = true };
    const json_t *v = json_object_get(row, col->key);
    if (col->fmt == F_LIST && json_is_array(v)) {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) {
            if (i) buf_str(&b, ",");
            if (json_is_object(e)) {
                const char *k;
                const json_t *ev;
                int j = 0;
                json_object_foreach((json_t *)e, k, ev) {
                    if (j++) buf_str(&b, ":");
                    buf_scalar(&b, ev, F_TEXT);
                }
            } else {
                buf_scalar(&b, e, F_TEXT);
            }
        }
        if (json_array_size(v) == 0) buf_str(&b, "-");
    } else if (col->fmt == F_MAP && json_is_object(v)) {
        const char *k;
        const json_t *ev;
        int j = 0;
        json_object_foreach((json_t *)v, k, ev) {
            if (j++) buf_str(&b, ",");
            buf_str(&b, k);
            buf_str(&b, "=");
            buf_scalar(&b, ev, F_TEXT);
        }
        if (!j) buf_str(&b, "-");
    } else {
        buf_scalar(&b, v, col->fmt);
    }
    if (!b.ok) {
        free(b.p);
        return NULL;
    }
    for (size_t i = 0; i < b.n; i++)
        if ((unsigned char)b.p[i] < 0x20 || b.p[i] == 0x7f) b.p[i] = '?';
    if (col->max > 3 && b.n > (size_t)col->max) {
        size_t cut = (size_t)col->max - 3;
        while (cut > 0 && ((unsigned char)b.p[cut] & 0xc0) == 0x80) cut--; /* whole UTF-8 only */
        memcpy(b.p + cut, "...", 4);
    }
    return b.p;
}

static bool right_aligned(fmt_t f) { return f == F_NUM || f == F_RATE || f == F_SECS; }

/* Prints rows (an array of objects) as a table: a header line, then one
 * line per row, columns two spaces apart, numbers right-aligned. */
static int print_table(cat_t *c, FILE *out, const json_t *rows, const col_t *cols, size_t ncols) {
    size_t nrows = json_array_size(rows);
    char **cells = calloc(nrows * ncols + 1, sizeof *cells);
    size_t *width = calloc(ncols, sizeof *width);
    int ret = -1;
    if (!cells || !width) goto out;
    for (size_t j = 0; j < ncols; j++) width[j] = strlen(cols[j].head);
    for (size_t i = 0; i < nrows; i++)
        for (size_t j = 0; j < ncols; j++) {
            char *s = cells[i * ncols + j] = cell(json_array_get(rows, i), &cols[j]);
            if (!s) goto out;
            if (strlen(s) > width[j]) width[j] = strlen(s);
        }
    for (size_t i = 0; i <= nrows; i++) {
        for (size_t j = 0; j < ncols; j++) {
            const char *s = i == 0 ? cols[j].head : cells[(i - 1) * ncols + j];
            int w = (int)width[j];
            bool last = j + 1 == ncols;
            if (right_aligned(cols[j].fmt)) fprintf(out, "%*s", w, s);
            else if (last) fputs(s, out);
            else fprintf(out, "%-*s", w, s);
            fputs(last ? "\n" : "  ", out);
        }
    }
    if (nrows == 0) fputs("(none)\n", out);
    ret = 0;
out:
    if (ret != 0) kern_fail("catalog %s: report: out of memory", c->path);
    if (cells)
        for (size_t i = 0; i < nrows * ncols; i++) free(cells[i]);
    free(cells);
    free(width);
    return ret;
}

/* ---- reports ---------------------------------------------------------- */

typedef json_t *(*build_fn)(cat_t *c);

/* Builds a report inside one read transaction, so that the totals of one
 * report agree with each other. On the writer's connection inside a batch
 * it reads the batch as it stands. NULL with a message on failure. */
static json_t *snapshot(cat_t *c, build_fn build) {
    bool own_txn = sqlite3_get_autocommit(c->db);
    if (own_txn && exec(c, "BEGIN", "begin report") != 0) return NULL;
    json_t *root = build(c);
    if (own_txn) sqlite3_exec(c->db, root ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
    return root;
}

/* ret, or -1 with a message when out could not be written. */
static int flushed(cat_t *c, FILE *out, int ret) {
    if (ret == 0 && (fflush(out) != 0 || ferror(out)))
        ret = kern_fail("catalog %s: report: write failed: %s", c->path, strerror(errno));
    return ret;
}

/* Prints a report as JSON on one line, or as a table of its rows. */
static int report(cat_t *c, build_fn build, bool json, FILE *out, const col_t *cols, size_t ncols) {
    json_t *root = snapshot(c, build);
    if (!root) return -1;
    int ret;
    if (json) {
        char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(15));
        ret = text ? 0 : kern_fail("catalog %s: report: cannot encode JSON", c->path);
        if (text) fprintf(out, "%s\n", text);
        free(text);
    } else {
        ret = print_table(c, out, root, cols, ncols);
    }
    json_decref(root);
    return flushed(c, out, ret);
}

#define NCOLS(a) (sizeof(a) / sizeof((a)[0]))

/* stats: {"overall": S, "workers": [S + {"worker"}]}, S as below. ?1 is the
 * worker, or NULL for everyone. */
static const char stats_counts_sql[] =
    "SELECT"
    " (SELECT count(*) FROM requests WHERE ?1 IS NULL OR worker = ?1) AS requests,"
    " (SELECT count(*) FROM captures WHERE placeholder = 0 AND (?1 IS NULL OR worker = ?1))"
    "   AS captures,"
    " (SELECT coalesce(sum(replay_count), 0) FROM captures WHERE ?1 IS NULL OR worker = ?1)"
    "   AS replays,"
    " (SELECT coalesce(sum(steps), 0) FROM requests WHERE ?1 IS NULL OR worker = ?1) AS steps,"
    " (SELECT coalesce(sum(replayed), 0) FROM requests WHERE ?1 IS NULL OR worker = ?1)"
    "   AS replayed_steps,"
    " (SELECT coalesce(sum(count), 0) FROM declines WHERE (?1 IS NULL OR worker = ?1)"
    "   AND reason IN ('not_capturable', 'override')) AS eager_breaks,"
    " (SELECT coalesce(sum(count), 0) FROM declines WHERE ?1 IS NULL OR worker = ?1) AS declines,"
    " (SELECT count(*) FROM evictions WHERE ?1 IS NULL OR worker = ?1) AS evictions";

static int stats_scope(cat_t *c, sqlite3_stmt *q[3], const char *worker, json_t **out) {
    *out = NULL;
    for (int i = 0; i < 3; i++)
        if (bind_text(q[i], 1, worker) != SQLITE_OK) return db_fail(c, "bind stats");
    json_t *rows = collect(c, q[0], 'o');
    if (!rows) return -1;
    json_t *s = json_incref(json_array_get(rows, 0));
    json_decref(rows);
    if (!s) return db_fail(c, "stats");
    json_int_t requests = json_integer_value(json_object_get(s, "requests"));
    json_int_t steps = json_integer_value(json_object_get(s, "steps"));
    json_int_t replayed = json_integer_value(json_object_get(s, "replayed_steps"));
    json_int_t captures = json_integer_value(json_object_get(s, "captures"));
    json_int_t replays = json_integer_value(json_object_get(s, "replays"));
    json_int_t declines = json_integer_value(json_object_get(s, "declines"));
    json_t *rate = json_null(), *from = json_null();
    if (requests > 0 && steps > 0) {
        rate = json_real((double)replayed / (double)steps);
        from = json_string("requests");
    } else if (requests == 0 && (double)replays + (double)captures + (double)declines > 0) {
        /* In double: a damaged catalog's counts can overflow an integer sum. */
        rate = json_real((double)replays / ((double)replays + (double)captures + (double)declines));
        from = json_string("captures");
    }
    json_t *dec = collect(c, q[1], 'k'), *ev = dec ? collect(c, q[2], 'k') : NULL;
    int bad = !rate || !from || !dec || !ev;
    bad |= json_object_set_new(s, "hit_rate", rate) != 0;
    bad |= json_object_set_new(s, "hit_rate_from", from) != 0;
    bad |= json_object_set_new(s, "declines_by_reason", dec) != 0;
    bad |= json_object_set_new(s, "evictions_by_reason", ev) != 0;
    if (bad) {
        json_decref(s);
        return dec && ev ? kern_fail("catalog %s: report: out of memory", c->path) : -1;
    }
    *out = s;
    return 0;
}

static json_t *build_stats(cat_t *c) {
    sqlite3_stmt *q[3] = {
        reader(c, stats_counts_sql),
        reader(c, "SELECT reason, sum(count) FROM declines WHERE ?1 IS NULL OR worker = ?1"
                  " GROUP BY reason ORDER BY reason"),
        reader(c, "SELECT reason, count(*) FROM evictions WHERE ?1 IS NULL OR worker = ?1"
                  " GROUP BY reason ORDER BY reason"),
    };
    json_t *root = NULL, *workers = NULL, *overall = NULL;
    if (!q[0] || !q[1] || !q[2]) goto done;
    workers = query_rows(c, "SELECT name AS worker FROM workers UNION SELECT worker FROM captures"
                            " UNION SELECT worker FROM declines UNION SELECT worker FROM evictions"
                            " UNION SELECT worker FROM requests ORDER BY 1");
    if (!workers) goto done;
    size_t i;
    json_t *w;
    json_array_foreach(workers, i, w) {
        json_t *s;
        if (stats_scope(c, q, json_string_value(json_object_get(w, "worker")), &s) != 0) goto done;
        if (json_object_update(w, s) != 0) {
            json_decref(s);
            kern_fail("catalog %s: report: out of memory", c->path);
            goto done;
        }
        json_decref(s);
    }
    if (stats_scope(c, q, NULL, &overall) != 0) goto done;
    root = json_pack("{s:o, s:O}", "overall", overall, "workers", workers);
    overall = NULL;
    if (!root) kern_fail("catalog %s: report: out of memory", c->path);
done:
    for (int k = 0; k < 3; k++) sqlite3_finalize(q[k]);
    json_decref(workers);
    json_decref(overall);
    return root;
}

static const col_t stats_cols[] = {
    { "worker", "worker", F_TEXT, 32 },
    { "requests", "requests", F_NUM, 0 },
    { "captures", "captures", F_NUM, 0 },
    { "replays", "replays", F_NUM, 0 },
    { "hit_rate", "hit_rate", F_RATE, 0 },
    { "eager_breaks", "eager_breaks", F_NUM, 0 },
    { "declines_by_reason", "declines", F_MAP, 0 },
    { "evictions_by_reason", "evictions", F_MAP, 0 },
};

/* Prometheus text for one label value: backslash, quote and newline
 * escaped; a missing value (a NULL in a damaged catalog) is "". */
static void prom_label(FILE *out, const char *v) {
    for (; v && *v; v++) {
        if (*v == '\\' || *v == '"') fprintf(out, "\\%c", *v);
        else if (*v == '\n') fputs("\\n", out);
        else fputc(*v, out);
    }
}

static void prom_counter(FILE *out, const char *name, const char *help, json_t *rows, const char *field) {
    fprintf(out, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        fprintf(out, "%s{worker=\"", name);
        prom_label(out, json_string_value(json_object_get(r, "worker")));
        fprintf(out, "\"} %lld\n", (long long)json_integer_value(json_object_get(r, field)));
    }
}

static void prom_by_reason(FILE *out, const char *name, const char *help, json_t *rows, const char *field) {
    fprintf(out, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const char *reason;
        json_t *v;
        json_object_foreach(json_object_get(r, field), reason, v) {
            fprintf(out, "%s{worker=\"", name);
            prom_label(out, json_string_value(json_object_get(r, "worker")));
            fputs("\",reason=\"", out);
            prom_label(out, reason);
            fprintf(out, "\"} %lld\n", (long long)json_integer_value(v));
        }
    }
}

int cat_report_metrics(cat_t *c, FILE *out) {
    json_t *root = snapshot(c, build_stats);
    if (!root) return -1;
    json_t *rows = json_object_get(root, "workers");
    prom_counter(out, "reel_requests_total", "Requests finished, by the worker that ran them.", rows, "requests");
    prom_counter(out, "reel_steps_total", "Denoising steps of finished requests.", rows, "steps");
    prom_counter(out, "reel_replayed_steps_total", "Steps of finished requests served by graph replay.", rows,
                 "replayed_steps");
    prom_counter(out, "reel_captures_total", "Graphs captured and verified.", rows, "captures");
    prom_counter(out, "reel_replays_total", "Graph replays.", rows, "replays");
    prom_by_reason(out, "reel_declines_total", "Calls declined to eager, by reason.", rows, "declines_by_reason");
    prom_by_reason(out, "reel_evictions_total", "Graphs evicted, by reason.", rows, "evictions_by_reason");
    json_decref(root);
    return flushed(c, out, 0);
}

int cat_report_stats(cat_t *c, bool json, FILE *out) {
    if (json) return report(c, build_stats, true, out, NULL, 0);
    json_t *root = snapshot(c, build_stats);
    if (!root) return -1;
    /* The table: one line per worker, then the overall line as "(all)". */
    json_t *rows = json_object_get(root, "workers"), *all = json_object_get(root, "overall");
    int ret;
    if (json_object_set_new(all, "worker", json_string("(all)")) != 0 || json_array_append(rows, all) != 0)
        ret = kern_fail("catalog %s: report: out of memory", c->path);
    else
        ret = print_table(c, out, rows, stats_cols, NCOLS(stats_cols));
    json_decref(root);
    return flushed(c, out, ret);
}

/* keys: one object per key hash seen in captures or declines, most
 * replayed first. */
static json_t *build_keys(cat_t *c) {
    json_t *rows = query_rows(c,
        "WITH k AS (SELECT key_hash FROM captures UNION SELECT key_hash FROM declines)"
        " SELECT k.key_hash AS key_hash,"
        " coalesce((SELECT key_text FROM captures WHERE key_hash = k.key_hash AND key_text IS NOT NULL"
        "   ORDER BY t DESC LIMIT 1), (SELECT key_text FROM declines WHERE key_hash = k.key_hash"
        "   AND key_text IS NOT NULL ORDER BY last_t DESC LIMIT 1)) AS key_text,"
        " (SELECT count(*) FROM captures WHERE key_hash = k.key_hash AND placeholder = 0) AS captures,"
        " (SELECT coalesce(sum(replay_count), 0) FROM captures WHERE key_hash = k.key_hash) AS replays,"
        " (SELECT coalesce(sum(count), 0) FROM declines WHERE key_hash = k.key_hash) AS declines,"
        " (SELECT max(last_replay) FROM captures WHERE key_hash = k.key_hash) AS last_replay"
        " FROM k ORDER BY replays DESC, key_hash");
    if (rows && attach(c, rows, "SELECT worker FROM captures WHERE key_hash = ?1 UNION"
                                " SELECT worker FROM declines WHERE key_hash = ?1 ORDER BY 1",
                       "key_hash", NULL, 'v', "workers") != 0) {
        json_decref(rows);
        return NULL;
    }
    return rows;
}

int cat_report_keys(cat_t *c, bool json, FILE *out) {
    static const col_t cols[] = {
        { "key_hash", "key_hash", F_TEXT, 16 },
        { "workers", "workers", F_LIST, 40 },
        { "captures", "captures", F_NUM, 0 },
        { "replays", "replays", F_NUM, 0 },
        { "declines", "declines", F_NUM, 0 },
        { "last_replay", "last_replay", F_TIME, 0 },
        { "key_text", "key_text", F_TEXT, 80 },
    };
    return report(c, build_keys, json, out, cols, NCOLS(cols));
}

static json_t *build_evictions(cat_t *c) {
    return query_rows(c,
        "SELECT t, worker, reason, component, from_version, to_version, key_hash, key_text"
        " FROM evictions ORDER BY t DESC, id DESC LIMIT " CAT_STR(CAT_RECENT_LIMIT));
}

int cat_report_evictions(cat_t *c, bool json, FILE *out) {
    static const col_t cols[] = {
        { "t", "time", F_TIME, 0 },
        { "worker", "worker", F_TEXT, 32 },
        { "reason", "reason", F_TEXT, 0 },
        { "component", "component", F_TEXT, 24 },
        { "from_version", "from", F_NUM, 0 },
        { "to_version", "to", F_NUM, 0 },
        { "key_hash", "key_hash", F_TEXT, 16 },
        { "key_text", "key_text", F_TEXT, 80 },
    };
    return report(c, build_evictions, json, out, cols, NCOLS(cols));
}

/* versions: every published version, newest first per component, with its
 * state (pending, current, superseded, failed and why), the workers that
 * applied it and those that failed to (and why). */
static json_t *build_versions(cat_t *c) {
    json_t *rows = query_rows(c, "SELECT component, version, state, reason, sha256, source, t"
                                 " FROM weight_versions ORDER BY component, version DESC");
    if (rows && (attach(c, rows, "SELECT worker FROM worker_versions WHERE component = ?1"
                                 " AND version = ?2 AND ok = 1 ORDER BY worker",
                        "component", "version", 'v', "applied") != 0 ||
                 attach(c, rows, "SELECT worker, error FROM worker_versions WHERE component = ?1"
                                 " AND version = ?2 AND ok = 0 ORDER BY worker",
                        "component", "version", 'o', "failed") != 0)) {
        json_decref(rows);
        return NULL;
    }
    return rows;
}

int cat_report_versions(cat_t *c, bool json, FILE *out) {
    static const col_t cols[] = {
        { "component", "component", F_TEXT, 24 },
        { "version", "version", F_NUM, 0 },
        { "state", "state", F_TEXT, 0 },
        { "t", "published", F_TIME, 0 },
        { "sha256", "sha256", F_TEXT, 15 },
        { "applied", "applied_by", F_LIST, 60 },
        { "failed", "failed", F_LIST, 60 },
        { "source", "source", F_TEXT, 48 },
        { "reason", "reason", F_TEXT, 60 },
    };
    return report(c, build_versions, json, out, cols, NCOLS(cols));
}

/* workers: each worker with its newest applied version per component and,
 * while it is live, each component whose current version it has not
 * applied ("lagging": the version and why: its error for that version, or
 * "not applied" while it has reported nothing). */
static json_t *build_workers(cat_t *c) {
    json_t *rows = query_rows(c, "SELECT name, device, arch, streams, budget, first_seen, last_seen,"
                                 " gone_at, gone_reason FROM workers ORDER BY name");
    if (rows && (attach(c, rows, "SELECT component, max(version) FROM worker_versions"
                                 " WHERE worker = ?1 AND ok = 1 GROUP BY component ORDER BY component",
                        "name", NULL, 'k', "versions") != 0 ||
                 attach(c, rows,
                        "SELECT w.component AS component, w.version AS version,"
                        " coalesce((SELECT error FROM worker_versions e WHERE e.worker = ?1"
                        " AND e.component = w.component AND e.version = w.version AND e.ok = 0),"
                        " 'not applied') AS reason"
                        " FROM weight_versions w WHERE w.state = 'current'"
                        " AND w.version = (SELECT max(version) FROM weight_versions"
                        " WHERE component = w.component AND state = 'current')"
                        " AND EXISTS (SELECT 1 FROM workers WHERE name = ?1 AND gone_at IS NULL)"
                        " AND coalesce((SELECT max(version) FROM worker_versions a WHERE a.worker = ?1"
                        " AND a.component = w.component AND a.ok = 1), 0) < w.version"
                        " ORDER BY w.component",
                        "name", NULL, 'o', "lagging") != 0)) {
        json_decref(rows);
        return NULL;
    }
    return rows;
}

int cat_report_workers(cat_t *c, bool json, FILE *out) {
    static const col_t cols[] = {
        { "name", "worker", F_TEXT, 32 },
        { "device", "device", F_TEXT, 32 },
        { "arch", "arch", F_TEXT, 0 },
        { "streams", "streams", F_NUM, 0 },
        { "budget", "budget", F_NUM, 0 },
        { "last_seen", "last_seen", F_TIME, 0 },
        { "gone_at", "gone_at", F_TIME, 0 },
        { "gone_reason", "gone_reason", F_TEXT, 32 },
        { "versions", "versions", F_MAP, 0 },
        { "lagging", "lagging", F_LIST, 80 },
    };
    return report(c, build_workers, json, out, cols, NCOLS(cols));
}

static json_t *build_requests(cat_t *c) {
    return query_rows(c,
        "SELECT t, id, worker, version, steps, captured, replayed, eager, seconds, status, key_hash"
        " FROM requests ORDER BY t DESC, rowid DESC LIMIT " CAT_STR(CAT_RECENT_LIMIT));
}

int cat_report_requests(cat_t *c, bool json, FILE *out) {
    static const col_t cols[] = {
        { "t", "time", F_TIME, 0 },
        { "id", "id", F_NUM, 0 },
        { "worker", "worker", F_TEXT, 32 },
        { "version", "version", F_NUM, 0 },
        { "steps", "steps", F_NUM, 0 },
        { "captured", "captured", F_NUM, 0 },
        { "replayed", "replayed", F_NUM, 0 },
        { "eager", "eager", F_NUM, 0 },
        { "seconds", "seconds", F_SECS, 0 },
        { "status", "status", F_TEXT, 24 },
        { "key_hash", "key_hash", F_TEXT, 16 },
    };
    return report(c, build_requests, json, out, cols, NCOLS(cols));
}
