/* test_catalog.c -- the SQLite catalog: migrations by user_version, batches
 * that readers see whole or not at all, readers that run beside the writer
 * (two connections, and a forked writer process), the replay/decline
 * counters, every report in table and JSON form, and strings that look like
 * SQL stored verbatim.
 *
 * Each test gets a fresh mkdtemp() directory, removed by the unchecked
 * fixture even when the test fails. Facts are checked through the reports
 * (parsed with jansson) and, where the report does not show them, through
 * a raw sqlite3 connection. */
#include "ctl/report.h"
#include "catalog/catalog.h"
#include "catalog/catalog_query.h"
#include "base/error.h"

#include <check.h>
#include <sys/stat.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/support.h"

/* The migrations as catalog.c embeds them (not in catalog.h: tests only):
 * 1 is the schema catalogs were first built with. */
extern const char cat_schema_v1_sql[], cat_schema_v2_sql[], cat_schema_v3_sql[], cat_schema_v4_sql[];

static char rootdir[64];      /* per test case, made and removed by the parent */
static char tmpdir[128];      /* per test, inside rootdir */
static char dbpath[PATH_MAX];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path); /* best effort: keep going */
    return 0;
}

static void remove_tree(const char *dir) {
    if (dir[0]) nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Unchecked (runs in the parent even under CK_FORK=yes), so the whole tree
 * goes away even when a test fails half-way. */
static void make_rootdir(void) {
    snprintf(rootdir, sizeof rootdir, "/tmp/reel_test_cat_XXXXXX");
    if (!mkdtemp(rootdir)) {
        perror("mkdtemp");
        exit(2);
    }
}

static void remove_rootdir(void) { remove_tree(rootdir); }

/* Checked: a fresh directory, hence a fresh catalog path, for every test. */
static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s/t_XXXXXX", rootdir);
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(dbpath, sizeof dbpath, "%s/reel.db", tmpdir);
}

static void remove_tmpdir(void) { remove_tree(tmpdir); }

/* ---- helpers ---------------------------------------------------------- */

static cat_t *open_ok(bool readonly) {
    cat_t *c = cat_open(dbpath, readonly);
    ck_assert_msg(c != NULL, "cat_open(%s, %d): %s", dbpath, readonly, reel_err_text());
    return c;
}

/* The catalog at dbpath with its raw request rows pruned (what retention
 * does), opened read-only: a report must then read the summaries. */
static cat_t *reopened_without_raw_requests(void) {
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "DELETE FROM requests", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    return open_ok(true);
}


typedef int (*report_fn)(cat_t *c, bool json, FILE *out);

/* The report as text (caller frees). */
static char *report_text(cat_t *c, report_fn fn, bool json) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    int rc = fn(c, json, f);
    fclose(f);
    ck_assert_msg(rc == 0, "report: %s", reel_err_text());
    return buf;
}

/* The report as parsed JSON; also checks it is exactly one line. */
static json_t *report_json(cat_t *c, report_fn fn) {
    char *text = report_text(c, fn, true);
    size_t n = strlen(text);
    ck_assert_msg(n > 0 && text[n - 1] == '\n' && strchr(text, '\n') == text + n - 1,
                  "JSON report is not one line: %s", text);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    ck_assert_msg(j != NULL, "invalid JSON (%s): %s", je.text, text);
    free(text);
    return j;
}

static json_int_t jint(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "'%s' is not an integer", key);
    return json_integer_value(v);
}

static const char *jstr(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_string(v), "'%s' is not a string", key);
    return json_string_value(v);
}

/* The element of array arr whose `key` is the string `val`. */
static json_t *find(const json_t *arr, const char *key, const char *val) {
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        const json_t *v = json_object_get(e, key);
        if (json_is_string(v) && strcmp(json_string_value(v), val) == 0) return e;
    }
    ck_abort_msg("no element with %s = %s", key, val);
    return NULL;
}

/* A raw SQLite connection of our own, to look behind the API. */
static sqlite3 *raw_open(bool readonly) {
    sqlite3 *db = NULL;
    int flags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, flags, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    return db;
}

static void raw_exec(sqlite3 *db, const char *sql) {
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, msg ? msg : "?");
}

static long long raw_int(sqlite3 *db, const char *sql) {
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    ck_assert_msg(sqlite3_step(s) == SQLITE_ROW, "%s: %s", sql, sqlite3_errmsg(db));
    long long v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* Overall captures as a (readonly) connection sees them now. */
static json_int_t captures_seen(cat_t *c) {
    json_t *j = report_json(c, ctl_report_stats);
    json_int_t n = jint(json_object_get(j, "overall"), "captures");
    json_decref(j);
    return n;
}

static void capture(cat_t *c, const char *worker, const char *key, int stream, double t) {
    char text[64];
    snprintf(text, sizeof text, "text-of-%s", key);
    TS_OK(cat_capture(c, worker, text, key, stream, 4096, 12, 0.25, 1, NULL, t));
}

/* ---- migrations and opening -------------------------------------------- */

START_TEST(test_migration_creates_schema_on_new_file_and_sets_user_version) {
    ck_assert_int_ge(cat_schema_version(), 1);
    cat_t *c = open_ok(false);
    cat_close(&c);
    ck_assert_ptr_null(c);
    cat_close(&c); /* idempotent */

    sqlite3 *db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "PRAGMA user_version"), cat_schema_version());
    sqlite3_stmt *s;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    ck_assert_str_eq((const char *)sqlite3_column_text(s, 0), "wal");
    sqlite3_finalize(s);
    static const char *tables[] = { "artifacts", "weight_versions", "workers", "worker_versions",
                                    "captures", "evictions", "declines", "requests",
                                    "artifact_keys" };
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        char sql[160];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '%s'",
                 tables[i]);
        ck_assert_msg(raw_int(db, sql) == 1, "table %s missing", tables[i]);
    }
    ck_assert_int_ge(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE type = 'index'"
                                 " AND name NOT LIKE 'sqlite_autoindex%'"), 4);
    sqlite3_close(db);
}
END_TEST

START_TEST(test_reopening_existing_catalog_keeps_rows_and_does_not_remigrate) {
    cat_t *c = open_ok(false);
    capture(c, "w1", "k1", 0, 100);
    cat_close(&c);

    /* Were migration 1 run again, CREATE INDEX IF NOT EXISTS would bring
     * this index back. */
    sqlite3 *db = raw_open(false);
    raw_exec(db, "DROP INDEX captures_by_key");
    sqlite3_close(db);

    c = open_ok(false);
    capture(c, "w1", "k2", 0, 101);
    cat_close(&c);

    db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures"), 2);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE name = 'captures_by_key'"), 0);
    ck_assert_int_eq(raw_int(db, "PRAGMA user_version"), cat_schema_version());
    sqlite3_close(db);
}
END_TEST

START_TEST(test_newer_user_version_is_refused_with_clear_message) {
    cat_t *c = open_ok(false);
    cat_close(&c);
    int newer = cat_schema_version() + 1;
    sqlite3 *db = raw_open(false);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", newer);
    raw_exec(db, sql);
    sqlite3_close(db);

    char want[128];
    snprintf(want, sizeof want, "catalog schema %d is newer than this build's %d", newer,
             cat_schema_version());
    for (int ro = 0; ro < 2; ro++) {
        reel_err_clear();
        c = cat_open(dbpath, ro);
        ck_assert_ptr_null(c);
        ck_assert_msg(strstr(reel_err_text(), want) != NULL, "message: %s", reel_err_text());
        ck_assert_msg(strstr(reel_err_text(), dbpath) != NULL, "message lacks the path: %s", reel_err_text());
    }
    db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "PRAGMA user_version"), newer); /* left alone */
    sqlite3_close(db);
}
END_TEST

/* Another application's SQLite file is never taken for a catalog (the
 * broker would have added its tables to it), and a FIFO, a directory or
 * a symlink at the path is refused at once (a FIFO made reelctl hang). */
START_TEST(test_a_foreign_database_or_a_non_file_is_refused_untouched) {
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL), SQLITE_OK);
    raw_exec(db, "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)");
    sqlite3_close(db);
    for (int ro = 0; ro < 2; ro++) {
        reel_err_clear();
        ck_assert_ptr_null(cat_open(dbpath, ro));
        ck_assert_msg(strstr(reel_err_text(), "not a Reel catalog"), "%s", reel_err_text());
    }
    db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM sqlite_master"), 1); /* left alone */
    ck_assert_int_eq(raw_int(db, "PRAGMA user_version"), 0);
    sqlite3_close(db);
    char fifo[600], dir[600], link[600];
    snprintf(fifo, sizeof fifo, "%s/fifo.db", tmpdir);
    snprintf(dir, sizeof dir, "%s/dir.db", tmpdir);
    snprintf(link, sizeof link, "%s/link.db", tmpdir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(symlink(dbpath, link), 0);
    const char *paths[] = { fifo, dir, link };
    for (int i = 0; i < 3; i++)
        for (int ro = 0; ro < 2; ro++) {
            reel_err_clear();
            ck_assert_ptr_null(cat_open(paths[i], ro));
            ck_assert_msg(strstr(reel_err_text(), "not a regular file"), "%s: %s", paths[i], reel_err_text());
        }
}
END_TEST

START_TEST(test_readonly_open_of_missing_file_fails_naming_the_path) {
    reel_err_clear();
    ck_assert_ptr_null(cat_open(dbpath, true));
    ck_assert_msg(strstr(reel_err_text(), dbpath) != NULL, "message: %s", reel_err_text());
    ck_assert_int_ne(access(dbpath, F_OK), 0); /* nothing was created */
}
END_TEST

/* A catalog that cannot be written (a full disk; here a child process
 * whose files may not grow: RLIMIT_FSIZE 0) fails to open with the
 * reason, and leaves no empty file behind for the next start to take for
 * a catalog; an existing empty file it did not create stays. */
START_TEST(test_a_new_catalog_that_cannot_be_written_leaves_no_empty_file) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG instead */
        struct rlimit lim = { 0, 0 };
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(10);
        cat_t *c = cat_open(dbpath, false);
        if (c) _exit(11);
        if (access(dbpath, F_OK) == 0) _exit(12); /* created, failed, left behind */
        int fd = open(dbpath, O_WRONLY | O_CREAT | O_EXCL, 0600); /* not ours: it stays */
        if (fd < 0) _exit(13);
        close(fd);
        if (cat_open(dbpath, false)) _exit(14);
        _exit(access(dbpath, F_OK) == 0 ? 0 : 15);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: exit %d (10 setrlimit, 11 opened, "
                  "12 empty file left, 13 create, 14 opened the empty file, 15 removed a file it did not create)",
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}
END_TEST

START_TEST(test_readonly_catalog_refuses_writes_with_message) {
    cat_t *w = open_ok(false);
    cat_close(&w);
    cat_t *r = open_ok(true);
    reel_err_clear();
    ck_assert_int_eq(cat_capture(r, "w", "t", "k", 0, 1, 1, 0.1, 1, NULL, 1), -1);
    ck_assert_msg(strstr(reel_err_text(), "read-only") != NULL, "message: %s", reel_err_text());
    cat_close(&r);
}
END_TEST

/* Every table's columns (name, type, not null, default, key position) and
 * every index's columns, as one text: two schemas that print the same
 * accept and return the same rows. */
static char *schema_text(sqlite3 *db) {
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(out);
    sqlite3_stmt *objs;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT type, name FROM sqlite_master WHERE type IN"
                                            " ('table', 'index') ORDER BY type, name", -1, &objs, NULL),
                     SQLITE_OK);
    while (sqlite3_step(objs) == SQLITE_ROW) {
        const char *type = (const char *)sqlite3_column_text(objs, 0);
        const char *name = (const char *)sqlite3_column_text(objs, 1);
        char sql[256];
        snprintf(sql, sizeof sql, "PRAGMA %s_info('%s')", strcmp(type, "table") ? "index" : "table", name);
        fprintf(out, "%s %s:", type, name);
        sqlite3_stmt *cols;
        ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &cols, NULL), SQLITE_OK);
        while (sqlite3_step(cols) == SQLITE_ROW) {
            fputs(" (", out);
            for (int i = 0; i < sqlite3_column_count(cols); i++) {
                const unsigned char *v = sqlite3_column_text(cols, i);
                fprintf(out, "%s%s", i ? "|" : "", v ? (const char *)v : "NULL");
            }
            fputc(')', out);
        }
        sqlite3_finalize(cols);
        fputc('\n', out);
    }
    sqlite3_finalize(objs);
    fclose(out);
    return buf;
}

START_TEST(test_catalog_sql_file_builds_the_schema_the_migrations_build) {
    FILE *f = fopen("schema/catalog.sql", "rb");
    ck_assert_msg(f != NULL, "schema/catalog.sql not found: run the tests from the repository root");
    char *sql = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&sql, &len);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, n, m);
    fclose(f);
    fclose(m);
    char names[32];
    snprintf(names, sizeof names, "PRAGMA user_version %d", cat_schema_version());
    ck_assert_ptr_nonnull(strstr(sql, names)); /* the header names the version */

    cat_t *c = open_ok(false); /* migrations 1..N */
    cat_close(&c);
    sqlite3 *migrated = raw_open(true), *file = NULL;
    ck_assert_int_eq(sqlite3_open(":memory:", &file), SQLITE_OK);
    raw_exec(file, sql);
    char *a = schema_text(migrated), *b = schema_text(file);
    ck_assert_msg(strcmp(a, b) == 0, "schema/catalog.sql and the migrations differ:\n%s\nvs\n%s", b, a);
    ck_assert_ptr_nonnull(strstr(a, "table weight_versions:"));
    free(a);
    free(b);
    free(sql);
    sqlite3_close(migrated);
    sqlite3_close(file);
}
END_TEST

/* Every SYNC is a row of the audit trail, with its key's name, in order;
 * and a version whose path does not fit cat_version_t is flagged cut,
 * never handed out shortened. */
START_TEST(test_audit_rows_keep_who_asked_what_and_a_long_source_is_flagged_cut) {
    cat_t *c = open_ok(false);
    ck_assert_int_eq(cat_audit(c, "alice", "trainer", "sync", "transformer", 2, "aa", "/w/2", "accepted", 10), 0);
    ck_assert_int_eq(cat_audit(c, "bob", "client", "sync", NULL, 0, NULL, NULL, "denied: a client key", 11), 0);
    char *longp = malloc(2000);
    memset(longp, 'x', 1999);
    longp[0] = '/';
    longp[1999] = '\0';
    ck_assert_int_eq(cat_weight_version(c, "transformer", 3, "cc", longp, 12), 0);
    ck_assert_int_eq(cat_weight_state(c, "transformer", 3, "current", NULL), 0);
    cat_version_t v[1];
    ck_assert_int_eq(cat_current_versions(c, v, 1), 1);
    ck_assert(v[0].cut);
    ck_assert_uint_eq(v[0].version, 3);
    free(longp);
    cat_close(&c);
    sqlite3 *db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM audit WHERE key_name = 'alice' AND role = 'trainer'"
                                 " AND version = 2 AND path = '/w/2' AND outcome = 'accepted'"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM audit WHERE key_name = 'bob' AND component IS NULL"), 1);
    sqlite3_close(db);
}
END_TEST

/* A LoRA version keeps its base, and one sent by upload its config text
 * (migration 13): what a restarted broker needs to send its SYNC again.
 * A full version and an adapter by path read "" for the config,
 * recording a version's base again replaces an older config, and a
 * version number published again as a full version keeps nothing of the
 * adapter it was before. */
START_TEST(test_lora_versions_keep_base_and_an_uploaded_adapters_config_for_a_restart) {
    cat_t *c = open_ok(false);
    const char *cfg = "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q\", \"k\"]}";
    TS_OK(cat_weight_version(c, "transformer", 5, "aa", "/w/base", 1));
    TS_OK(cat_weight_version(c, "transformer", 6, "bb", "/w/lora", 2));
    TS_OK(cat_weight_base(c, "transformer", 6, 5, NULL));
    TS_OK(cat_weight_version(c, "vae", 7, "cc", "uploaded", 3));
    TS_OK(cat_weight_base(c, "vae", 7, 2, "{\"r\": 1}"));
    TS_OK(cat_weight_base(c, "vae", 7, 3, cfg)); /* sent again: the newest base and config */
    TS_OK(cat_weight_state(c, "transformer", 5, "current", NULL));
    TS_OK(cat_weight_state(c, "transformer", 6, "current", NULL));
    TS_OK(cat_weight_state(c, "vae", 7, "current", NULL));
    cat_version_t v[3];
    ck_assert_int_eq(cat_current_versions(c, v, 3), 2);
    ck_assert_str_eq(v[0].component, "transformer");
    ck_assert_uint_eq(v[0].version, 6);
    ck_assert_uint_eq(v[0].base_version, 5);
    ck_assert_str_eq(v[0].lora_config, "");
    ck_assert_str_eq(v[1].component, "vae");
    ck_assert_uint_eq(v[1].base_version, 3);
    ck_assert_str_eq(v[1].source, "uploaded");
    ck_assert_str_eq(v[1].lora_config, cfg);
    /* pending ones (a broker that stopped mid-sync) carry it too */
    TS_OK(cat_weight_version(c, "vae", 8, "dd", "uploaded", 4));
    TS_OK(cat_weight_base(c, "vae", 8, 3, cfg));
    ck_assert_int_eq(cat_pending_versions(c, v, 3), 1);
    ck_assert_uint_eq(v[0].version, 8);
    ck_assert_str_eq(v[0].lora_config, cfg);
    /* v8 refused, then its number published again as a full version: no
     * base, adapter or config of the refused adapter is left on it */
    TS_OK(cat_weight_adapter(c, "vae", 8, "{\"rank\": 1}"));
    TS_OK(cat_weight_state(c, "vae", 8, "failed", "refused"));
    TS_OK(cat_weight_version(c, "vae", 8, "ee", "/w/full", 5));
    TS_OK(cat_weight_state(c, "vae", 8, "current", NULL));
    ck_assert_int_eq(cat_current_versions(c, v, 3), 2);
    ck_assert_uint_eq(v[1].version, 8);
    ck_assert_uint_eq(v[1].base_version, 0);
    ck_assert_str_eq(v[1].lora_config, "");
    ck_assert_str_eq(v[1].source, "/w/full");
    cat_close(&c);
    sqlite3 *db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM weight_versions WHERE component = 'vae' AND version = 8"
                                 " AND base_version IS NULL AND adapter IS NULL AND lora_config IS NULL"), 1);
    sqlite3_close(db);
}
END_TEST

/* Migration 5 drops the two indexes of requests (each cost a quarter of the
 * writer's time per request); the newest requests are still listed first,
 * by rowid, in a catalog migrated from schema 4 and in a new one. */
START_TEST(test_migration_5_drops_the_request_indexes_and_recent_requests_stay_newest_first) {
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    raw_exec(db, cat_schema_v1_sql);
    raw_exec(db, cat_schema_v2_sql);
    raw_exec(db, cat_schema_v3_sql);
    raw_exec(db, cat_schema_v4_sql);
    raw_exec(db, "PRAGMA user_version = 4");
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'requests_by_%'"), 2);
    raw_exec(db, "INSERT INTO requests (id, worker, version, steps, captured, replayed, eager, seconds,"
                 " status, t) VALUES (1, 'w0', 1, 4, 1, 3, 0, 0.5, 'ok', 10), (2, 'w1', 1, 4, 0, 4, 0, 0.25,"
                 " 'ok', 11)");
    sqlite3_close(db);
    cat_t *c = open_ok(false);
    ck_assert_int_eq(cat_request(c, 3, "w0", "00000000000000aa", 1, 4, 0, 4, 0, 0.1, "ok", 0.5, 0.25, 0, 0, 0, NULL, NULL, NULL, NAN, 7000003, 12), 0);
    json_t *rows = cat_query_requests(c);
    ck_assert_ptr_nonnull(rows);
    ck_assert_uint_eq(json_array_size(rows), 3);
    /* migration 17: the broker's id of the new row (the one its worker's
     * log names), null for the old ones */
    ck_assert_int_eq(jint(json_array_get(rows, 0), "broker_id"), 7000003);
    ck_assert(json_is_null(json_object_get(json_array_get(rows, 2), "broker_id")));
    /* migration 8: the new row keeps its encode and decode seconds, the old ones read 0 */
    ck_assert_double_eq(json_real_value(json_object_get(json_array_get(rows, 0), "encode_seconds")), 0.5);
    ck_assert_double_eq(json_real_value(json_object_get(json_array_get(rows, 0), "decode_seconds")), 0.25);
    ck_assert_double_eq(json_number_value(json_object_get(json_array_get(rows, 2), "encode_seconds")), 0.0);
    for (size_t i = 0; i < 3; i++) ck_assert_int_eq(jint(json_array_get(rows, i), "id"), 3 - (json_int_t)i);
    json_decref(rows);
    cat_close(&c);
    db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "PRAGMA user_version"), cat_schema_version());
    /* (schema 18 indexes requests again, by what `reelctl why` seeks: not these) */
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE name IN ('requests_by_time',"
                                 " 'requests_by_worker')"), 0);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM requests"), 3);
    sqlite3_close(db);
}
END_TEST

/* A request row's step counts are stored whole, whatever uint a worker's
 * RESULT carried (the broker bounds them by the request's steps; the
 * catalog does not rely on it). Before, they went through an int: 3e9
 * captured steps read back negative. */
START_TEST(test_a_request_rows_counts_are_stored_whole_past_int) {
    cat_t *c = open_ok(false);
    const uint64_t big = 3000000000u, bigger = (uint64_t)1 << 40;
    ck_assert_int_eq(cat_request(c, 1, "w0", "00000000000000aa", 1, 4, big, big + 1, big + 2, 0.1, "ok", 0.0, 0.0,
                                 bigger, bigger + 1, bigger + 2, NULL, NULL, NULL, NAN, 0, 12), 0);
    cat_close(&c);
    sqlite3 *db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT captured FROM requests"), (long long)big);
    ck_assert_int_eq(raw_int(db, "SELECT replayed FROM requests"), (long long)big + 1);
    ck_assert_int_eq(raw_int(db, "SELECT eager FROM requests"), (long long)big + 2);
    ck_assert_int_eq(raw_int(db, "SELECT batched_steps FROM requests"), (long long)bigger);
    ck_assert_int_eq(raw_int(db, "SELECT batch_rows FROM requests"), (long long)bigger + 1);
    ck_assert_int_eq(raw_int(db, "SELECT padded_rows FROM requests"), (long long)bigger + 2);
    sqlite3_close(db);
}
END_TEST

/* Migration 15 adds the stream of an eviction: rows written before it read
 * null (and "-" in the table), new rows their stream. */
START_TEST(test_migration_15_evictions_before_it_have_no_stream) {
    extern const char *const cat_migrations[];
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    for (int i = 0; i < 14; i++) raw_exec(db, cat_migrations[i]);
    raw_exec(db, "PRAGMA user_version = 14");
    raw_exec(db, "INSERT INTO evictions (worker, key_text, key_hash, reason, component, from_version,"
                 " to_version, t) VALUES ('w0', 'k', 'k1', 'lru', '', 0, 0, 10)");
    sqlite3_close(db);
    cat_t *c = open_ok(false);
    TS_OK(cat_eviction(c, "w0", "k", "k1", 1, "weight_sync", "transformer", 1, 2, 2, 20));
    json_t *j = cat_query_evictions(c);
    ck_assert_ptr_nonnull(j);
    ck_assert_uint_eq(json_array_size(j), 2);
    ck_assert_int_eq(jint(json_array_get(j, 0), "stream"), 1);
    ck_assert(json_is_null(json_object_get(json_array_get(j, 1), "stream")));
    json_decref(j);
    char *t = report_text(c, ctl_report_evictions, false);
    char *line = strstr(t, " w0 ");
    ck_assert_msg(line && strstr(line + 1, " w0 "), "table: %s", t);
    char row[256], stream[32];
    line = strstr(line + 1, " w0 "); /* the older row */
    snprintf(row, sizeof row, "%.*s", (int)strcspn(line, "\n"), line);
    ck_assert_msg(sscanf(row, " w0 %31s lru", stream) == 1 && !strcmp(stream, "-"), "the old row: %s", row);
    free(t);
    cat_close(&c);
}
END_TEST

/* A catalog written by a broker before migration 2 (every published
 * version taken as current, a bad one included) is classified by what the
 * workers reported: the bad one is not resumed after the upgrade. */
START_TEST(test_migration_2_marks_versions_no_worker_applied_failed_and_keeps_the_newest_applied_current) {
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    raw_exec(db, cat_schema_v1_sql);
    raw_exec(db, "PRAGMA user_version = 1");
    raw_exec(db, "INSERT INTO weight_versions (component, version, sha256, source, t) VALUES"
                 " ('transformer', 1, 'aa', '/w/1', 1), ('transformer', 2, 'bb', '/w/2', 2),"
                 " ('transformer', 3, 'cc', '/w/bad', 3)");
    raw_exec(db, "INSERT INTO worker_versions (worker, component, version, ok, error, t) VALUES"
                 " ('w1', 'transformer', 1, 1, NULL, 1), ('w1', 'transformer', 2, 1, NULL, 2),"
                 " ('w1', 'transformer', 3, 0, 'not a transformer', 3)");
    sqlite3_close(db);

    cat_t *c = open_ok(false);
    cat_version_t v[2];
    ck_assert_int_eq(cat_current_versions(c, v, 2), 1);
    ck_assert_uint_eq(v[0].version, 2); /* not 3: nobody could load it */
    cat_close(&c);
    db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "PRAGMA user_version"), cat_schema_version());
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM weight_versions WHERE version = 1 AND state = 'superseded'"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM weight_versions WHERE version = 2 AND state = 'current'"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM weight_versions WHERE version = 3 AND state = 'failed'"
                                 " AND reason = 'no worker applied it'"), 1);
    sqlite3_close(db);
}
END_TEST

/* ---- transactions and concurrent readers ------------------------------ */

START_TEST(test_batch_is_visible_to_readonly_connection_only_after_commit) {
    cat_t *w = open_ok(false);
    cat_t *r = open_ok(true);
    TS_OK(cat_begin(w));
    for (int i = 0; i < 3; i++) capture(w, "w1", "k", i, 100 + i);
    TS_OK(cat_decline(w, "w1", "t", "k", "override", 1, 100));
    ck_assert_int_eq(captures_seen(r), 0);
    ck_assert_int_eq(captures_seen(w), 3); /* the writer sees its own batch */
    TS_OK(cat_commit(w));
    ck_assert_int_eq(captures_seen(r), 3);

    /* A rolled-back batch is never seen. */
    TS_OK(cat_begin(w));
    capture(w, "w1", "k", 9, 200);
    TS_OK(cat_rollback(w));
    TS_OK(cat_rollback(w)); /* nothing open: no-op */
    ck_assert_int_eq(captures_seen(r), 3);
    cat_close(&r);
    cat_close(&w);
}
END_TEST

START_TEST(test_reader_opened_during_write_transaction_reads_and_never_blocks_writer) {
    cat_t *w = open_ok(false);
    capture(w, "w1", "k", 0, 1);
    TS_OK(cat_begin(w));
    capture(w, "w1", "k", 1, 2);

    /* Opened while the writer holds its transaction open. */
    cat_t *r = open_ok(true);
    ck_assert_int_eq(captures_seen(r), 1);

    /* A reader in the middle of a read transaction does not stop the
     * commit, and keeps its snapshot until it ends. */
    sqlite3 *db = raw_open(true);
    raw_exec(db, "BEGIN");
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures"), 1);
    sqlite3_busy_timeout(db, 0);
    TS_OK(cat_commit(w));
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures"), 1);
    raw_exec(db, "COMMIT");
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures"), 2);
    ck_assert_int_eq(captures_seen(r), 2);

    /* And the writer can start the next batch while the reader reads. */
    raw_exec(db, "BEGIN");
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures"), 2);
    TS_OK(cat_begin(w));
    capture(w, "w1", "k", 2, 3);
    TS_OK(cat_commit(w));
    raw_exec(db, "COMMIT");
    sqlite3_close(db);
    ck_assert_int_eq(captures_seen(r), 3);
    cat_close(&r);
    cat_close(&w);
}
END_TEST

static void child_fail(const char *what) {
    fprintf(stderr, "child: %s: %s\n", what, reel_err_text());
    _exit(1);
}

/* The writer as another process: opens its own connection after fork
 * (SQLite connections must not cross fork), writes a batch, tells the
 * parent it holds the open transaction, commits when the parent has read
 * (with its own read transaction still open), and exits. */
static void forked_writer(int ready_fd, int go_fd) {
    cat_t *c = cat_open(dbpath, false);
    if (!c) child_fail("open");
    if (cat_begin(c) != 0) child_fail("begin");
    for (int i = 0; i < 5; i++)
        if (cat_capture(c, "child", "text", "kc", i, 1, 1, 0.1, 1, NULL, 500 + i) != 0) child_fail("capture");
    if (write(ready_fd, "r", 1) != 1) child_fail("write pipe");
    char b;
    if (read(go_fd, &b, 1) != 1) child_fail("read pipe");
    if (cat_commit(c) != 0) child_fail("commit");
    cat_close(&c);
    _exit(0);
}

START_TEST(test_forked_writer_commits_while_parent_reads) {
    cat_t *w = open_ok(false); /* creates the schema */
    capture(w, "parent", "kp", 0, 1);
    cat_close(&w);

    int ready[2], go[2];
    ck_assert_int_eq(pipe(ready), 0);
    ck_assert_int_eq(pipe(go), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        forked_writer(ready[1], go[0]);
    }
    close(ready[1]);
    close(go[0]);
    char b;
    ck_assert_int_eq(read(ready[0], &b, 1), 1);

    /* The child holds an open write transaction: a reader opens and reads. */
    cat_t *r = open_ok(true);
    ck_assert_int_eq(captures_seen(r), 1);
    sqlite3 *db = raw_open(true);
    raw_exec(db, "BEGIN");
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures"), 1);

    /* The child commits while this read transaction is still open. */
    ck_assert_int_eq(write(go[1], "g", 1), 1);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child writer failed");
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures"), 1); /* our snapshot */
    raw_exec(db, "COMMIT");
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures WHERE worker = 'child'"), 5);
    sqlite3_close(db);
    ck_assert_int_eq(captures_seen(r), 6);
    cat_close(&r);
    close(ready[0]);
    close(go[1]);
}
END_TEST

/* ---- counters ----------------------------------------------------------- */

START_TEST(test_replays_accumulate_on_newest_capture_of_worker_key_and_stream) {
    cat_t *c = open_ok(false);
    capture(c, "w1", "k", 0, 100);
    capture(c, "w1", "k", 0, 200); /* newest for stream 0 */
    capture(c, "w1", "k", 1, 150);
    capture(c, "w2", "k", 0, 300); /* another worker */
    TS_OK(cat_replays(c, "w1", "k", 0, 4, 1, 250));
    TS_OK(cat_replays(c, "w1", "k", 0, 6, 1, 260));
    TS_OK(cat_replays(c, "w1", "k", 1, 1, 1, 270));
    cat_close(&c);

    sqlite3 *db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT replay_count FROM captures WHERE worker = 'w1' AND stream = 0 AND t = 200"), 10);
    ck_assert_int_eq(raw_int(db, "SELECT last_replay FROM captures WHERE worker = 'w1' AND stream = 0 AND t = 200"), 260);
    ck_assert_int_eq(raw_int(db, "SELECT replay_count FROM captures WHERE worker = 'w1' AND stream = 0 AND t = 100"), 0);
    ck_assert_int_eq(raw_int(db, "SELECT replay_count FROM captures WHERE worker = 'w1' AND stream = 1"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT replay_count FROM captures WHERE worker = 'w2'"), 0);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures"), 4); /* none created */
    sqlite3_close(db);
}
END_TEST

START_TEST(test_replays_without_a_capture_create_a_placeholder_row_and_are_not_lost) {
    cat_t *c = open_ok(false);
    TS_OK(cat_replays(c, "w1", "lost", 2, 5, 1, 100));
    TS_OK(cat_replays(c, "w1", "lost", 2, 3, 1, 110)); /* lands on the same row */
    json_t *j = report_json(c, ctl_report_stats);
    json_t *all = json_object_get(j, "overall");
    ck_assert_int_eq(jint(all, "captures"), 0); /* a placeholder is not a capture */
    ck_assert_int_eq(jint(all, "replays"), 8);
    json_decref(j);
    cat_close(&c);

    sqlite3 *db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT replay_count FROM captures WHERE worker = 'w1' AND key_hash = 'lost'"
                                 " AND stream = 2 AND capture_seconds = 0 AND placeholder = 1"), 8);
    sqlite3_close(db);
}
END_TEST

START_TEST(test_decline_upserts_count_per_worker_key_and_reason) {
    cat_t *c = open_ok(false);
    TS_OK(cat_decline(c, "w1", "t", "k", "override", 2, 100));
    TS_OK(cat_decline(c, "w1", "t", "k", "override", 3, 90));
    TS_OK(cat_decline(c, "w1", "t", "k", "shape_mismatch", 1, 95));
    TS_OK(cat_decline(c, "w2", "t", "k", "override", 7, 96));
    cat_close(&c);
    sqlite3 *db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM declines"), 3);
    ck_assert_int_eq(raw_int(db, "SELECT count FROM declines WHERE worker = 'w1' AND reason = 'override'"), 5);
    ck_assert_int_eq(raw_int(db, "SELECT last_t FROM declines WHERE worker = 'w1' AND reason = 'override'"), 100);
    ck_assert_int_eq(raw_int(db, "SELECT count FROM declines WHERE worker = 'w2'"), 7);
    sqlite3_close(db);
}
END_TEST

START_TEST(test_worker_seen_again_after_gone_is_live_and_keeps_first_seen) {
    cat_t *c = open_ok(false);
    TS_OK(cat_worker_seen(c, "w1", "cpu", "x86_64", 2, 1 << 20, NULL, 100));
    TS_OK(cat_worker_gone(c, "w1", "missed heartbeats", 150));
    json_t *j = report_json(c, ctl_report_workers);
    json_t *w = find(j, "name", "w1");
    ck_assert_str_eq(jstr(w, "gone_reason"), "missed heartbeats");
    json_decref(j);
    TS_OK(cat_worker_seen(c, "w1", "cuda:0", "sm_90", 4, 1 << 21, NULL, 200));
    j = report_json(c, ctl_report_workers);
    w = find(j, "name", "w1");
    ck_assert(json_is_null(json_object_get(w, "gone_at")));
    ck_assert_str_eq(jstr(w, "device"), "cuda:0");
    ck_assert_int_eq(json_number_value(json_object_get(w, "first_seen")), 100);
    ck_assert_int_eq(json_number_value(json_object_get(w, "last_seen")), 200);
    json_decref(j);
    cat_close(&c);
}
END_TEST

/* ---- reports ------------------------------------------------------------ */

/* Two workers: w1 with 3 captures, 10 replays, requests of 20 steps of which
 * 10 replayed; w2 with declines and evictions only. */
static void write_facts(cat_t *c) {
    TS_OK(cat_begin(c));
    TS_OK(cat_worker_seen(c, "w1", "cuda:0", "sm_90", 2, (uint64_t)8 << 30, NULL, 1000));
    TS_OK(cat_worker_seen(c, "w2", "cpu", "x86_64", 1, 1u << 30, NULL, 1001));
    TS_OK(cat_worker_gone(c, "w2", "missed heartbeats", 1500));
    TS_OK(cat_weight_version(c, "dit", 1, "aa11", "/w/v1.safetensors", 1002));
    TS_OK(cat_weight_version(c, "dit", 2, "bb22", "inline", 1100));
    TS_OK(cat_worker_version(c, "w1", "dit", 1, true, NULL, 1003));
    TS_OK(cat_worker_version(c, "w2", "dit", 1, true, NULL, 1004));
    TS_OK(cat_worker_version(c, "w1", "dit", 2, true, NULL, 1101));
    TS_OK(cat_worker_version(c, "w2", "dit", 2, false, "sha256 mismatch", 1102));
    TS_OK(cat_capture(c, "w1", "dit step 64x64", "k1", 0, 1000, 10, 0.5, 1, NULL, 1010));
    TS_OK(cat_capture(c, "w1", "dit step 64x64", "k1", 1, 1000, 10, 0.5, 1, NULL, 1011));
    TS_OK(cat_capture(c, "w1", "dit step 32x32", "k2", 0, 500, 8, 0.25, 1, NULL, 1012));
    TS_OK(cat_replays(c, "w1", "k1", 0, 6, 1, 1020));
    TS_OK(cat_replays(c, "w1", "k1", 1, 3, 1, 1021));
    TS_OK(cat_replays(c, "w1", "k2", 0, 1, 1, 1022));
    TS_OK(cat_request(c, 1, "w1", "k1", 2, 12, 2, 8, 2, 1.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1030));
    TS_OK(cat_request(c, 2, "w1", "k2", 2, 8, 1, 2, 5, 0.75, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1031));
    TS_OK(cat_decline(c, "w2", "dit step 16x16", "k3", "not_capturable", 2, 1040));
    TS_OK(cat_decline(c, "w2", "dit step 16x16", "k3", "override", 1, 1041));
    TS_OK(cat_decline(c, "w2", "dit step 16x16", "k3", "shape_mismatch", 4, 1042));
    TS_OK(cat_eviction(c, "w2", "dit step 16x16", "k3", 0, "lru", NULL, 0, 0, 1, 1050));
    TS_OK(cat_eviction(c, "w1", "dit step 64x64", "k1", 0, "weight_sync", "dit", 1, 2, 1, 1100));
    TS_OK(cat_eviction(c, "w1", "dit step 32x32", "k2", 1, "weight_sync", "dit", 1, 2, 1, 1101));
    TS_OK(cat_artifact(c, "matmul-cuda", "matmul", "cuda", "cc33", "ok", NULL, 1060));
    TS_OK(cat_commit(c));
}

/* cat_merge: the union of two brokers' catalogs. A second catalog holds
 * other requests of the same workers and keys, and a newer state of a
 * version: the union counts each request once and adds the summaries. */
START_TEST(test_merged_catalogs_hold_each_request_once_and_add_their_summaries) {
    cat_t *w = open_ok(false);
    write_facts(w); /* requests 1, 2 (20 steps), 3 captures, 10 replays, 3 evictions */
    cat_close(&w);
    char other[4200], uni[4200];
    snprintf(other, sizeof other, "%s/other.db", tmpdir);
    snprintf(uni, sizeof uni, "%s/union.db", tmpdir);
    cat_t *o = cat_open(other, false);
    ck_assert_ptr_nonnull(o);
    TS_OK(cat_begin(o));
    TS_OK(cat_worker_seen(o, "w1", "cuda:0", "sm_90", 2, (uint64_t)8 << 30, NULL, 2000));
    TS_OK(cat_weight_version(o, "dit", 2, "bb22", "inline", 2001));
    TS_OK(cat_weight_state(o, "dit", 2, "current", "current at the peer broker when this one took over"));
    TS_OK(cat_capture(o, "w1", "dit step 64x64", "k1", 0, 1000, 10, 0.5, 1, NULL, 2010));
    TS_OK(cat_replays(o, "w1", "k1", 0, 4, 1, 2020));
    TS_OK(cat_request(o, 2, "w1", "k2", 2, 8, 1, 2, 5, 0.75, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1031)); /* the same request */
    TS_OK(cat_request(o, 9, "w1", "k1", 2, 6, 0, 6, 0, 0.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 2030));
    TS_OK(cat_commit(o));
    cat_close(&o);

    cat_t *u = cat_open(uni, false);
    ck_assert_ptr_nonnull(u);
    TS_OK(cat_merge(u, dbpath));
    TS_OK(cat_merge(u, other));
    ck_assert_int_eq(cat_merge(u, uni), -1); /* not into itself */
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "into itself"));
    ck_assert_int_eq(cat_merge(u, "/nonexistent/x.db"), -1);
    cat_close(&u);
    u = cat_open(uni, true);
    ck_assert_ptr_nonnull(u);
    json_t *rq = report_json(u, ctl_report_requests);
    ck_assert_int_eq((int)json_array_size(rq), 3); /* 1, 2 and 9: request 2 once */
    json_decref(rq);
    json_t *st = report_json(u, ctl_report_stats);
    json_t *w1 = find(json_object_get(st, "workers"), "worker", "w1");
    ck_assert_int_eq(jint(w1, "captures"), 4);
    ck_assert_int_eq(jint(w1, "replays"), 14);
    ck_assert_int_eq(jint(w1, "evictions"), 2);
    json_decref(st);
    json_t *vs = report_json(u, ctl_report_versions);
    json_t *v2 = find(vs, "state", "current");
    ck_assert_ptr_nonnull(v2);
    ck_assert_int_eq(jint(v2, "version"), 2);
    ck_assert_str_eq(jstr(v2, "reason"), "current at the peer broker when this one took over"); /* the newer row */
    json_decref(vs);
    cat_close(&u);
    /* a read-only catalog takes nothing in */
    u = cat_open(uni, true);
    ck_assert_int_eq(cat_merge(u, other), -1);
    cat_close(&u);
}
END_TEST

/* A source catalog of an older schema is refused, as cat_open refuses it
 * read-only (merged, its requests were dropped and its declines added),
 * and every refusal names the file given, never the union it goes into
 * (reelctl's is a temporary file the user never named). */
START_TEST(test_a_merge_refuses_an_older_schema_and_names_the_source_file_in_its_errors) {
    cat_t *w = open_ok(false);
    write_facts(w);
    cat_close(&w);
    char old[4200], junk[4200], uni[4200], sql[64];
    snprintf(old, sizeof old, "%s/old.db", tmpdir);
    snprintf(junk, sizeof junk, "%s/junk.db", tmpdir);
    snprintf(uni, sizeof uni, "%s/union.db", tmpdir);
    cat_t *o = cat_open(old, false);
    ck_assert_ptr_nonnull(o);
    TS_OK(cat_decline(o, "w1", "k", "k1", "warming_up", 5, 1000));
    cat_close(&o);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(old, &db), SQLITE_OK);
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", cat_schema_version() - 1);
    ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    FILE *f = fopen(junk, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 64; i++) fputs("this is not a database, ", f);
    fclose(f);

    cat_t *u = cat_open(uni, false);
    ck_assert_ptr_nonnull(u);
    TS_OK(cat_merge(u, dbpath));
    ck_assert_ptr_null(cat_open(old, true)); /* alone: refused */
    ck_assert_int_eq(cat_merge(u, old), -1);  /* in a union: refused the same way */
    ck_assert_msg(strstr(reel_err_text(), old) && strstr(reel_err_text(), "is older than this build's"), "%s",
                  reel_err_text());
    ck_assert_int_eq(cat_merge(u, junk), -1);
    ck_assert_msg(strstr(reel_err_text(), junk) && !strstr(reel_err_text(), uni), "%s", reel_err_text());
    cat_close(&u);
    ck_assert_int_eq(sqlite3_open(uni, &db), SQLITE_OK); /* nothing of the old one came in */
    sqlite3_stmt *q;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT count(*) FROM declines WHERE reason = 'warming_up'", -1, &q, NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(q), SQLITE_ROW);
    ck_assert_int_eq(sqlite3_column_int(q, 0), 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
}
END_TEST

/* A group run in two parts (a CPU worker's two streams) runs each of its
 * 4 steps twice: its row says steps 4 and 8 steps by how they ran. The
 * hit rate counts steps as they ran on both sides, so it stays <= 1. */
START_TEST(test_hit_rate_counts_a_group_in_parts_as_its_steps_ran) {
    cat_t *w = open_ok(false);
    TS_OK(cat_begin(w));
    TS_OK(cat_worker_seen(w, "wg", "cpu", "cpu-avx512", 2, 0, NULL, 1000));
    TS_OK(cat_request(w, 1, "wg", "kg", 1, 4, 1, 6, 1, 0.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1001));
    TS_OK(cat_request(w, 2, "wg", "kg", 1, 4, 0, 8, 0, 0.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1002));
    TS_OK(cat_commit(w));
    cat_t *c = open_ok(true);
    json_t *j = report_json(c, ctl_report_stats);
    json_t *wg = find(json_object_get(j, "workers"), "worker", "wg");
    ck_assert_int_eq(jint(wg, "steps"), 16);
    ck_assert_int_eq(jint(wg, "replayed_steps"), 14);
    ck_assert_double_eq_tol(json_real_value(json_object_get(wg, "hit_rate")), 14.0 / 16.0, 1e-12);
    ck_assert_double_eq_tol(json_real_value(json_object_get(json_object_get(j, "overall"), "hit_rate")), 14.0 / 16.0,
                            1e-12);
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_stats_report_counts_captures_replays_hit_rate_breaks_and_reasons) {
    cat_t *w = open_ok(false);
    write_facts(w);
    cat_t *c = open_ok(true);
    json_t *j = report_json(c, ctl_report_stats);

    json_t *w1 = find(json_object_get(j, "workers"), "worker", "w1");
    ck_assert_int_eq(jint(w1, "captures"), 3);
    ck_assert_int_eq(jint(w1, "replays"), 10);
    ck_assert_int_eq(jint(w1, "requests"), 2);
    ck_assert_int_eq(jint(w1, "steps"), 20);
    ck_assert_int_eq(jint(w1, "replayed_steps"), 10);
    ck_assert_double_eq_tol(json_real_value(json_object_get(w1, "hit_rate")), 0.5, 1e-12);
    ck_assert_str_eq(jstr(w1, "hit_rate_from"), "requests");
    ck_assert_int_eq(jint(json_object_get(w1, "evictions_by_reason"), "weight_sync"), 2);

    /* w2 has no requests: replays / (replays + captures + declines) = 0/7. */
    json_t *w2 = find(json_object_get(j, "workers"), "worker", "w2");
    ck_assert_int_eq(jint(w2, "eager_breaks"), 3);
    ck_assert_int_eq(jint(w2, "declines"), 7);
    ck_assert_double_eq_tol(json_real_value(json_object_get(w2, "hit_rate")), 0.0, 1e-12);
    ck_assert_str_eq(jstr(w2, "hit_rate_from"), "captures");
    json_t *dec = json_object_get(w2, "declines_by_reason");
    ck_assert_int_eq(jint(dec, "not_capturable"), 2);
    ck_assert_int_eq(jint(dec, "override"), 1);
    ck_assert_int_eq(jint(dec, "shape_mismatch"), 4);
    ck_assert_int_eq(jint(json_object_get(w2, "evictions_by_reason"), "lru"), 1);

    json_t *all = json_object_get(j, "overall");
    ck_assert_int_eq(jint(all, "captures"), 3);
    ck_assert_int_eq(jint(all, "replays"), 10);
    ck_assert_int_eq(jint(all, "eager_breaks"), 3);
    ck_assert_int_eq(jint(all, "evictions"), 3);
    ck_assert_double_eq_tol(json_real_value(json_object_get(all, "hit_rate")), 0.5, 1e-12);
    json_decref(j);

    char *t = report_text(c, ctl_report_stats, false);
    ck_assert_msg(strncmp(t, "worker ", 7) == 0 && strstr(t, "captures") && strstr(t, "hit_rate"),
                  "header: %s", t);
    ck_assert_msg(strstr(t, "50.0%") && strstr(t, "(all)") && strstr(t, "shape_mismatch=4") &&
                      strstr(t, "weight_sync=2"), "table: %s", t);
    free(t);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_stats_hit_rate_falls_back_to_capture_counters_without_requests) {
    cat_t *c = open_ok(false);
    for (int i = 0; i < 3; i++) capture(c, "w1", "k", i, 10 + i);
    TS_OK(cat_replays(c, "w1", "k", 0, 10, 1, 20));
    TS_OK(cat_decline(c, "w1", "t", "k", "warming_up", 2, 21));
    json_t *j = report_json(c, ctl_report_stats);
    json_t *all = json_object_get(j, "overall");
    ck_assert_int_eq(jint(all, "captures"), 3);
    ck_assert_int_eq(jint(all, "replays"), 10);
    ck_assert_double_eq_tol(json_real_value(json_object_get(all, "hit_rate")), 10.0 / 15.0, 1e-12);
    ck_assert_str_eq(jstr(all, "hit_rate_from"), "captures");
    json_decref(j);
    cat_close(&c);
}
END_TEST

START_TEST(test_keys_report_lists_each_key_with_workers_captures_and_replays) {
    cat_t *w = open_ok(false);
    write_facts(w);
    TS_OK(cat_capture(w, "w2", "dit step 64x64", "k1", 0, 1000, 10, 0.5, 1, NULL, 1200));
    cat_t *c = open_ok(true);
    json_t *j = report_json(c, ctl_report_keys);
    ck_assert_int_eq(json_array_size(j), 3);
    json_t *k1 = json_array_get(j, 0); /* most replayed first */
    ck_assert_str_eq(jstr(k1, "key_hash"), "k1");
    ck_assert_int_eq(jint(k1, "captures"), 3);
    ck_assert_int_eq(jint(k1, "replays"), 9);
    ck_assert_int_eq(json_number_value(json_object_get(k1, "last_replay")), 1021);
    json_t *ws = json_object_get(k1, "workers");
    ck_assert_int_eq(json_array_size(ws), 2);
    ck_assert_str_eq(json_string_value(json_array_get(ws, 0)), "w1");
    ck_assert_str_eq(json_string_value(json_array_get(ws, 1)), "w2");
    json_t *k3 = find(j, "key_hash", "k3");
    ck_assert_str_eq(jstr(k3, "key_text"), "dit step 16x16"); /* from the declines */
    ck_assert_int_eq(jint(k3, "declines"), 7);
    ck_assert(json_is_null(json_object_get(k3, "last_replay")));
    json_decref(j);

    char *t = report_text(c, ctl_report_keys, false);
    ck_assert_msg(strncmp(t, "key_hash", 8) == 0 && strstr(t, "dit step 64x64") && strstr(t, "w1,w2"),
                  "table: %s", t);
    free(t);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_evictions_report_is_newest_first_and_limited_to_50) {
    cat_t *w = open_ok(false);
    write_facts(w);
    cat_t *c = open_ok(true);
    json_t *j = report_json(c, ctl_report_evictions);
    ck_assert_int_eq(json_array_size(j), 3);
    json_t *e = json_array_get(j, 0);
    ck_assert_str_eq(jstr(e, "key_hash"), "k2");
    ck_assert_int_eq(jint(e, "stream"), 1); /* which stream's graph it was */
    ck_assert_int_eq(jint(json_array_get(j, 1), "stream"), 0);
    ck_assert_str_eq(jstr(e, "reason"), "weight_sync");
    ck_assert_str_eq(jstr(e, "component"), "dit");
    ck_assert_int_eq(jint(e, "from_version"), 1);
    ck_assert_int_eq(jint(e, "to_version"), 2);
    json_t *lru = json_array_get(j, 2);
    ck_assert_str_eq(jstr(lru, "reason"), "lru");
    /* an eviction no sync caused has no component nor versions: null, not '' and 0 */
    ck_assert(json_is_null(json_object_get(lru, "component")));
    ck_assert(json_is_null(json_object_get(lru, "from_version")));
    ck_assert(json_is_null(json_object_get(lru, "to_version")));
    json_decref(j);
    char *t = report_text(c, ctl_report_evictions, false);
    ck_assert_msg(strncmp(t, "time", 4) == 0 && strstr(t, "weight_sync") && strstr(t, "1970-01-01T00:18:21Z"),
                  "table: %s", t);
    /* the table shows them as "-": "lru  -  -  -", never "from 0 to 0" */
    char *line = strstr(t, " lru ");
    ck_assert_msg(line != NULL, "table: %s", t);
    char row[256], comp[32], from[32], to[32];
    snprintf(row, sizeof row, "%.*s", (int)strcspn(line, "\n"), line);
    ck_assert_msg(sscanf(row, " lru %31s %31s %31s", comp, from, to) == 3 && !strcmp(comp, "-") &&
                      !strcmp(from, "-") && !strcmp(to, "-"),
                  "an lru row: %s", row);
    free(t);

    TS_OK(cat_begin(w));
    for (int i = 0; i < 60; i++) TS_OK(cat_eviction(w, "w1", "t", "kx", 0, "lru", NULL, 0, 0, 1, 2000 + i));
    TS_OK(cat_commit(w));
    j = report_json(c, ctl_report_evictions);
    ck_assert_int_eq(json_array_size(j), 50);
    ck_assert_int_eq(json_number_value(json_object_get(json_array_get(j, 0), "t")), 2059);
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_metrics_are_prometheus_counters_by_worker_and_reason) {
    cat_t *w = open_ok(false);
    write_facts(w);
    TS_OK(cat_begin(w));
    TS_OK(cat_decline(w, "we\"ird\\", "k", "k9", "override", 1, 2000)); /* a label that needs escaping */
    TS_OK(cat_commit(w));
    cat_t *c = open_ok(true);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_int_eq(ctl_report_metrics(c, f), 0);
    fclose(f);
    const char *want[] = {
        "# TYPE reel_requests_total counter\n",
        "reel_requests_total{worker=\"w1\"} 2\n",
        "reel_steps_total{worker=\"w1\"} 20\n",
        "reel_replayed_steps_total{worker=\"w1\"} 10\n",
        "reel_captures_total{worker=\"w1\"} 3\n",
        "reel_replays_total{worker=\"w1\"} 10\n",
        "reel_declines_total{worker=\"w2\",reason=\"not_capturable\"} 2\n",
        "reel_declines_total{worker=\"w2\",reason=\"shape_mismatch\"} 4\n",
        "reel_evictions_total{worker=\"w1\",reason=\"weight_sync\"} 2\n",
        "reel_declines_total{worker=\"we\\\"ird\\\\\",reason=\"override\"} 1\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(buf, want[i]) != NULL, "missing: %s\nin:\n%s", want[i], buf);
    ck_assert_ptr_null(strstr(buf, "k1")); /* no per-key labels */
    free(buf);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_current_versions_are_the_newest_applied_never_pending_or_failed) {
    cat_t *w = open_ok(false);
    ck_assert_int_eq(cat_begin(w), 0);
    TS_OK(cat_weight_version(w, "transformer", 1, "aa", "/w/v1.safetensors", 1.0));
    TS_OK(cat_weight_version(w, "transformer", 3, "cc", "/w/v3.safetensors", 3.0));
    TS_OK(cat_weight_version(w, "transformer", 2, "bb", "/w/v2.safetensors", 4.0));
    TS_OK(cat_weight_version(w, "vae", 7, "dd", "inline", 2.0));
    ck_assert_int_eq(cat_commit(w), 0);
    cat_version_t v[4];
    ck_assert_int_eq(cat_current_versions(w, v, 4), 0); /* published is not applied */

    TS_OK(cat_weight_state(w, "transformer", 1, "current", NULL));
    TS_OK(cat_weight_state(w, "transformer", 2, "current", NULL));
    TS_OK(cat_weight_state(w, "transformer", 3, "failed", "no worker applied it: w1 (not a transformer)"));
    TS_OK(cat_weight_state(w, "vae", 7, "current", NULL));
    int n = cat_current_versions(w, v, 4);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(v[0].component, "transformer"); /* by name */
    ck_assert_uint_eq(v[0].version, 2);               /* the newest applied, not the newest published */
    ck_assert_str_eq(v[0].sha256, "bb");
    ck_assert_str_eq(v[0].source, "/w/v2.safetensors");
    ck_assert_str_eq(v[1].component, "vae");
    ck_assert_str_eq(v[1].source, "inline");
    ck_assert_int_eq(cat_current_versions(w, v, 1), 1); /* max respected */

    reel_err_clear();
    ck_assert_int_eq(cat_weight_state(w, "transformer", 2, "bogus", NULL), -1);
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "bogus"));

    /* v3 published again (a fixed file): pending, its old reason gone;
     * then the broker restarts before anyone applied it. */
    TS_OK(cat_weight_version(w, "transformer", 3, "c2", "/w/v3b.safetensors", 5.0));
    /* what the restarting broker reads first: the interrupted syncs */
    ck_assert_int_eq(cat_pending_versions(w, v, 4), 1);
    ck_assert_str_eq(v[0].component, "transformer");
    ck_assert_uint_eq(v[0].version, 3);
    ck_assert_str_eq(v[0].sha256, "c2");
    ck_assert_str_eq(v[0].source, "/w/v3b.safetensors");
    TS_OK(cat_weight_fail_pending(w, "the broker stopped before any worker applied it"));
    ck_assert_int_eq(cat_pending_versions(w, v, 4), 0); /* failed now: nothing pending */
    cat_t *r = open_ok(true);
    json_t *j = report_json(r, ctl_report_versions);
    json_t *v1 = json_array_get(j, 2), *v2 = json_array_get(j, 1), *v3 = json_array_get(j, 0);
    ck_assert_str_eq(jstr(v1, "state"), "superseded"); /* one current per component */
    ck_assert_str_eq(jstr(v2, "state"), "current");
    ck_assert(json_is_null(json_object_get(v2, "reason")));
    ck_assert_str_eq(jstr(v3, "state"), "failed");
    ck_assert_str_eq(jstr(v3, "sha256"), "c2");
    ck_assert_str_eq(jstr(v3, "reason"), "the broker stopped before any worker applied it");
    json_decref(j);
    char *t = report_text(r, ctl_report_versions, false);
    ck_assert_msg(strstr(t, "state") && strstr(t, "superseded") && strstr(t, "the broker stopped"), "table: %s", t);
    free(t);
    cat_close(&r);
    ck_assert_int_eq(cat_current_versions(w, v, 4), 2);
    ck_assert_uint_eq(v[0].version, 2);

    /* A second restart: v3, failed as interrupted and newer than current
     * v2, is still one (the catalog remembers it, not the first broker's
     * memory); a version failed for another reason is not. */
    TS_OK(cat_weight_version(w, "transformer", 4, "d4", "/w/v4.safetensors", 6.0));
    TS_OK(cat_weight_state(w, "transformer", 4, "failed", "no worker applied it: w1 (sha256 mismatch)"));
    ck_assert_int_eq(cat_interrupted_versions(w, v, 4), 1);
    ck_assert_str_eq(v[0].component, "transformer");
    ck_assert_uint_eq(v[0].version, 3);
    ck_assert_str_eq(v[0].sha256, "c2");
    ck_assert_str_eq(v[0].source, "/w/v3b.safetensors");
    ck_assert_int_eq(cat_interrupted_versions(w, v, 0), 0); /* max respected */
    /* settled by a newer current version: no longer interrupted */
    TS_OK(cat_weight_version(w, "transformer", 5, "e5", "/w/v5.safetensors", 7.0));
    TS_OK(cat_weight_state(w, "transformer", 5, "current", NULL));
    ck_assert_int_eq(cat_interrupted_versions(w, v, 4), 0);
    cat_close(&w);
}
END_TEST

START_TEST(test_versions_report_lists_which_workers_applied_each_version) {
    cat_t *w = open_ok(false);
    write_facts(w);
    cat_t *c = open_ok(true);
    json_t *j = report_json(c, ctl_report_versions);
    ck_assert_int_eq(json_array_size(j), 2);
    json_t *v2 = json_array_get(j, 0); /* newest first */
    ck_assert_int_eq(jint(v2, "version"), 2);
    ck_assert_str_eq(jstr(v2, "sha256"), "bb22");
    ck_assert_int_eq(json_array_size(json_object_get(v2, "applied")), 1);
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(v2, "applied"), 0)), "w1");
    json_t *failed = json_array_get(json_object_get(v2, "failed"), 0);
    ck_assert_str_eq(jstr(failed, "worker"), "w2");
    ck_assert_str_eq(jstr(failed, "error"), "sha256 mismatch");
    json_t *v1 = json_array_get(j, 1);
    ck_assert_int_eq(json_array_size(json_object_get(v1, "applied")), 2);
    json_decref(j);
    char *t = report_text(c, ctl_report_versions, false);
    ck_assert_msg(strncmp(t, "component", 9) == 0 && strstr(t, "w1,w2") && strstr(t, "w2:sha256 mismatch"),
                  "table: %s", t);
    free(t);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_workers_report_shows_last_seen_gone_and_applied_versions) {
    cat_t *w = open_ok(false);
    write_facts(w);
    cat_t *c = open_ok(true);
    json_t *j = report_json(c, ctl_report_workers);
    ck_assert_int_eq(json_array_size(j), 2);
    json_t *w1 = find(j, "name", "w1");
    ck_assert_str_eq(jstr(w1, "device"), "cuda:0");
    ck_assert_int_eq(jint(w1, "streams"), 2);
    ck_assert_int_eq(jint(w1, "budget"), 8ll << 30);
    ck_assert(json_is_null(json_object_get(w1, "gone_at")));
    ck_assert_int_eq(jint(json_object_get(w1, "versions"), "dit"), 2);
    json_t *w2 = find(j, "name", "w2");
    ck_assert_int_eq(json_number_value(json_object_get(w2, "gone_at")), 1500);
    ck_assert_str_eq(jstr(w2, "gone_reason"), "missed heartbeats");
    ck_assert_int_eq(jint(json_object_get(w2, "versions"), "dit"), 1); /* v2 failed there */
    json_decref(j);
    char *t = report_text(c, ctl_report_workers, false);
    ck_assert_msg(strncmp(t, "worker", 6) == 0 && strstr(t, "missed heartbeats") && strstr(t, "dit=2"),
                  "table: %s", t);
    free(t);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_workers_report_shows_live_workers_behind_the_current_version_with_their_reason) {
    cat_t *w = open_ok(false);
    TS_OK(cat_begin(w));
    const char *names[] = { "up", "failed", "silent", "gone" };
    for (int i = 0; i < 4; i++) TS_OK(cat_worker_seen(w, names[i], "cpu", "x86_64", 1, 0, NULL, 10 + i));
    TS_OK(cat_worker_gone(w, "gone", "expired", 50));
    TS_OK(cat_weight_version(w, "transformer", 2, "bb", "/w/2", 20));
    TS_OK(cat_weight_version(w, "transformer", 3, "cc", "/w/3", 30));
    for (int i = 0; i < 4; i++) TS_OK(cat_worker_version(w, names[i], "transformer", 2, true, NULL, 21));
    TS_OK(cat_worker_version(w, "up", "transformer", 3, true, NULL, 31));
    TS_OK(cat_worker_version(w, "failed", "transformer", 3, false, "config tiny does not match", 31));
    TS_OK(cat_worker_version(w, "gone", "transformer", 3, false, "timeout", 31));
    TS_OK(cat_commit(w));
    cat_t *c = open_ok(true);
    json_t *j = report_json(c, ctl_report_workers);
    /* v3 still pending: nobody lags behind a version that is not current */
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(json_array_size(json_object_get(find(j, "name", names[i]), "lagging")), 0);
    json_decref(j);

    TS_OK(cat_weight_state(w, "transformer", 2, "current", NULL));
    TS_OK(cat_weight_state(w, "transformer", 3, "current", NULL));
    j = report_json(c, ctl_report_workers);
    ck_assert_int_eq(json_array_size(json_object_get(find(j, "name", "up"), "lagging")), 0);
    ck_assert_int_eq(json_array_size(json_object_get(find(j, "name", "gone"), "lagging")), 0);
    json_t *lag = json_array_get(json_object_get(find(j, "name", "failed"), "lagging"), 0);
    ck_assert_str_eq(jstr(lag, "component"), "transformer");
    ck_assert_int_eq(jint(lag, "version"), 3);
    ck_assert_str_eq(jstr(lag, "reason"), "config tiny does not match");
    lag = json_array_get(json_object_get(find(j, "name", "silent"), "lagging"), 0);
    ck_assert_str_eq(jstr(lag, "reason"), "not applied");
    json_decref(j);
    char *t = report_text(c, ctl_report_workers, false);
    ck_assert_msg(strstr(t, "lagging") && strstr(t, "transformer:3:config tiny does not match"), "table: %s", t);
    free(t);

    /* caught up later (a reconnect): no longer lagging */
    TS_OK(cat_worker_version(w, "failed", "transformer", 3, true, NULL, 40));
    j = report_json(c, ctl_report_workers);
    ck_assert_int_eq(json_array_size(json_object_get(find(j, "name", "failed"), "lagging")), 0);
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_requests_report_is_newest_first_with_step_counts) {
    cat_t *w = open_ok(false);
    write_facts(w);
    cat_t *c = open_ok(true);
    json_t *j = report_json(c, ctl_report_requests);
    ck_assert_int_eq(json_array_size(j), 2);
    json_t *r = json_array_get(j, 0);
    ck_assert_int_eq(jint(r, "id"), 2);
    ck_assert_int_eq(jint(r, "steps"), 8);
    ck_assert_int_eq(jint(r, "replayed"), 2);
    ck_assert_int_eq(jint(r, "eager"), 5);
    ck_assert_str_eq(jstr(r, "status"), "ok");
    ck_assert_double_eq_tol(json_real_value(json_object_get(r, "seconds")), 0.75, 1e-12);
    json_decref(j);
    char *t = report_text(c, ctl_report_requests, false);
    ck_assert_msg(strncmp(t, "time", 4) == 0 && strstr(t, "0.750") && strstr(t, "1.500"), "table: %s", t);
    free(t);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_every_report_on_empty_catalog_is_valid_json_and_a_header) {
    cat_t *w = open_ok(false);
    cat_t *c = open_ok(true);
    report_fn fns[] = { ctl_report_stats, ctl_report_keys, ctl_report_evictions,
                        ctl_report_versions, ctl_report_workers, ctl_report_requests };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        json_t *j = report_json(c, fns[i]);
        json_decref(j);
        char *t = report_text(c, fns[i], false);
        ck_assert_msg(strchr(t, '\n') != NULL && t[0] != '\n', "table: %s", t);
        free(t);
    }
    json_t *j = report_json(c, ctl_report_stats);
    ck_assert(json_is_null(json_object_get(json_object_get(j, "overall"), "hit_rate")));
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_table_columns_are_aligned_under_their_headers) {
    cat_t *w = open_ok(false);
    write_facts(w);
    char *t = report_text(w, ctl_report_requests, false);
    /* Right-aligned "steps": every line ends that column at the same place. */
    char *header = t, *nl = strchr(t, '\n');
    ck_assert_ptr_nonnull(nl);
    const char *h = strstr(header, "steps");
    ck_assert_ptr_nonnull(h);
    size_t end = (size_t)(h - header) + strlen("steps");
    for (char *line = nl + 1; *line; line = strchr(line, '\n') + 1) {
        ck_assert_ptr_nonnull(strchr(line, '\n'));
        ck_assert_msg(line[end - 1] != ' ' && line[end] == ' ', "misaligned: %s", t);
    }
    free(t);
    cat_close(&w);
}
END_TEST

/* An artifact's spread over its keys (docs/ARTIFACTS.md, "In the
 * catalog"): the speedup weighted by timed calls, its standard deviation
 * pooled from each key's mean, deviation and count (here: keys of 3 calls
 * at 1.0, 1.2, 1.4 and 2 calls at 2.0 exactly: sd of {1.0, 1.2, 1.4, 2.0,
 * 2.0}), the keys' extremes, and the --artifact-timing sync launches and
 * their mean; the text table and the metrics say the same. */
START_TEST(test_artifact_report_pools_the_speedup_spread_and_reports_sync_timing) {
    cat_t *c = open_ok(false);
    TS_OK(cat_artifact_seen(c, "a1", "1", "gemm_gelu", "cpu", NULL, true, true, "loaded", NULL, 1));
    TS_OK(cat_artifact_key(c, "w1", "a1", "k1 @01", "promoted", NULL, 3, 0, 1, 0, 0, 3, 1.2, 0.2, 4, 0.002, 2));
    TS_OK(cat_artifact_key(c, "w2", "a1", "k1 @02", "promoted", NULL, 2, 0, 1, 0, 0, 2, 2.0, 0.0, 6, 0.009, 3));
    cat_close(&c);
    c = open_ok(true);
    json_t *j = report_json(c, ctl_report_artifacts);
    json_t *a = json_array_get(json_object_get(j, "artifacts"), 0);
    double calls[] = { 1.0, 1.2, 1.4, 2.0, 2.0 }, mean = 0, ss = 0;
    for (int i = 0; i < 5; i++) mean += calls[i] / 5;
    for (int i = 0; i < 5; i++) ss += (calls[i] - mean) * (calls[i] - mean);
    ck_assert_double_eq_tol(json_number_value(json_object_get(a, "speedup")), mean, 1e-9);
    ck_assert_double_eq_tol(json_number_value(json_object_get(a, "speedup_sd")), sqrt(ss / 4), 1e-9);
    ck_assert_double_eq_tol(json_number_value(json_object_get(a, "speedup_min")), 1.2, 1e-12);
    ck_assert_double_eq_tol(json_number_value(json_object_get(a, "speedup_max")), 2.0, 1e-12);
    ck_assert_int_eq(jint(a, "sync_timed"), 10);
    ck_assert_double_eq_tol(json_number_value(json_object_get(a, "sync_ms")), 1.1, 1e-9); /* 11 ms / 10 */
    ck_assert_ptr_null(json_object_get(a, "_ss_within")); /* the helper sums are not reported */
    json_t *keys = json_object_get(j, "keys");
    ck_assert_uint_eq(json_array_size(keys), 2);
    ck_assert_double_eq_tol(json_number_value(json_object_get(json_array_get(keys, 0), "sync_ms")), 0.5, 1e-9);
    json_decref(j);
    char *text = report_text(c, ctl_report_stats, false);
    ck_assert_msg(strstr(text, "sync_ms") && strstr(text, "key_max"), "%s", text);
    free(text);
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_int_eq(ctl_report_metrics(c, f), 0);
    fclose(f);
    ck_assert_msg(strstr(text, "reel_artifact_sync_timed_total{artifact=\"a1\"} 10"), "%s", text);
    ck_assert_msg(strstr(text, "reel_artifact_speedup_sd{artifact=\"a1\"}"), "%s", text);
    free(text);
    cat_close(&c);
}
END_TEST

/* The HTML report's data (cat_query_report): the timeline's buckets add
 * up to the requests in range, each sync carries the captures and
 * evictions between it and the next, --since narrows the range. */
START_TEST(test_report_query_buckets_requests_and_splits_captures_by_sync) {
    cat_t *c = open_ok(false);
    TS_OK(cat_capture(c, "w1", "k", "k1", 0, 1, 1, 0.1, 1, NULL, 1005));          /* before the first sync */
    TS_OK(cat_weight_version(c, "transformer", 2, "aa", "/w/v2", 1010));
    TS_OK(cat_weight_state(c, "transformer", 2, "current", NULL));
    TS_OK(cat_eviction(c, "w1", "k", "k1", 0, "weight_sync", "transformer", 1, 2, 1, 1011));
    TS_OK(cat_capture(c, "w1", "k", "k1", 0, 1, 1, 0.1, 1, NULL, 1012));
    /* a sync no worker applied moves no weights: no sync of the report's */
    TS_OK(cat_weight_version(c, "transformer", 5, "cc", "/w/v5", 1012.5));
    TS_OK(cat_weight_state(c, "transformer", 5, "failed", "no worker applied it"));
    TS_OK(cat_capture(c, "w1", "k", "k2", 0, 1, 1, 0.1, 1, NULL, 1013));
    TS_OK(cat_weight_version(c, "transformer", 3, "bb", "/w/v3", 1020));
    TS_OK(cat_weight_state(c, "transformer", 3, "current", NULL));
    TS_OK(cat_eviction(c, "w1", "k", "k1", 0, "weight_sync", "transformer", 2, 3, 1, 1021));
    for (int i = 0; i < 10; i++)
        TS_OK(cat_request(c, (uint64_t)i, "w1", "k1", 2, 4, i == 0, i == 0 ? 1 : 4, i == 0 ? 2 : 0, 0.01 * (i + 1),
                       i == 9 ? "timeout" : "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1000 + 3 * i));
    cat_close(&c);
    c = open_ok(true);
    json_t *r = cat_query_report(c, 0);
    TS_NEW(r);
    ck_assert_int_eq(jint(r, "requests"), 10);
    json_int_t reqs = 0, steps = 0, replayed = 0, failed = 0;
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(r, "timeline"), i, b) {
        reqs += jint(b, "requests");
        steps += jint(b, "steps");
        replayed += jint(b, "replayed");
        failed += jint(b, "failed");
        ck_assert(jint(b, "bucket") >= 0 && jint(b, "bucket") < 60);
    }
    ck_assert_int_eq(reqs, 10);
    ck_assert_int_eq(steps, 40);
    ck_assert_int_eq(replayed, 1 + 9 * 4);
    ck_assert_int_eq(failed, 1);
    json_t *syncs = json_object_get(r, "syncs");
    ck_assert_uint_eq(json_array_size(syncs), 2);
    ck_assert_int_eq(jint(json_array_get(syncs, 0), "captures"), 2);
    ck_assert_int_eq(jint(json_array_get(syncs, 0), "evictions"), 1);
    ck_assert_int_eq(jint(json_array_get(syncs, 1), "captures"), 0);
    ck_assert_int_eq(jint(json_array_get(syncs, 1), "evictions"), 1);
    ck_assert_int_eq(jint(json_object_get(r, "before_first_sync"), "captures"), 1);
    json_t *unapplied = json_object_get(r, "unapplied_syncs");
    ck_assert_uint_eq(json_array_size(unapplied), 1);
    ck_assert_int_eq(jint(json_array_get(unapplied, 0), "version"), 5);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(unapplied, 0), "state")), "failed");
    json_t *slow = json_object_get(r, "slowest");
    ck_assert_double_eq_tol(json_number_value(json_object_get(json_array_get(slow, 0), "seconds")), 0.1, 1e-9);
    json_decref(r);
    r = cat_query_report(c, 1015); /* the requests from t = 1015: i = 5..9 */
    ck_assert_int_eq(jint(r, "requests"), 5);
    ck_assert_uint_eq(json_array_size(json_object_get(r, "syncs")), 1);
    json_decref(r);
    cat_close(&c);
    /* From the summaries (raw requests pruned) the same syncs. */
    c = reopened_without_raw_requests();
    r = cat_query_report(c, 0);
    TS_NEW(r);
    ck_assert_str_eq(json_string_value(json_object_get(r, "source")), "summaries");
    syncs = json_object_get(r, "syncs");
    ck_assert_uint_eq(json_array_size(syncs), 2);
    /* per minute: v2's minute holds the capture at 1005 too; the failed v5 splits nothing */
    ck_assert_int_eq(jint(json_array_get(syncs, 0), "captures"), 3);
    ck_assert_uint_eq(json_array_size(json_object_get(r, "unapplied_syncs")), 1);
    json_decref(r);
    cat_close(&c);
}
END_TEST

static double jnum(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* A failed request's seconds are the broker's wait for it (no worker ran
 * its loop): "where the workers' time went" sums the loops of the ok
 * requests only, read from the raw rows and from the timeline alike. */
START_TEST(test_report_worker_time_counts_only_the_loops_of_requests_that_ended_ok) {
    cat_t *c = open_ok(false);
    TS_OK(cat_begin(c));
    for (int i = 0; i < 4; i++)
        TS_OK(cat_request(c, (uint64_t)i, "w1", "k1", 2, 4, 0, 4, 0, 0.5, "ok", 0.25, 0.125, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1000 + i));
    TS_OK(cat_request(c, 9, "-", "k1", 0, 4, 0, 0, 0, 30.0, "timeout", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1010));
    TS_OK(cat_request(c, 10, "w1", "k1", 0, 4, 0, 0, 0, 7.0, "worker_lost", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1011));
    TS_OK(cat_commit(c));
    cat_close(&c);
    c = open_ok(true);
    json_t *r = cat_query_report(c, 0);
    TS_NEW(r);
    ck_assert_str_eq(json_string_value(json_object_get(r, "source")), "requests");
    json_t *split = json_object_get(r, "time_split");
    ck_assert_double_eq_tol(jnum(split, "loop_seconds"), 2.0, 1e-9);
    ck_assert_double_eq_tol(jnum(split, "encode_seconds"), 1.0, 1e-9);
    json_decref(r);
    cat_close(&c);
    /* The raw rows pruned: the report reads the timeline. */
    c = reopened_without_raw_requests();
    r = cat_query_report(c, 0);
    TS_NEW(r);
    ck_assert_str_eq(json_string_value(json_object_get(r, "source")), "summaries");
    ck_assert_double_eq_tol(jnum(json_object_get(r, "time_split"), "loop_seconds"), 2.0, 1e-9);
    ck_assert_int_eq(jint(r, "requests"), 6);
    json_decref(r);
    cat_close(&c);
}
END_TEST

/* The requests another process counts: sqlite3(1) opens, reads and
 * closes (its close checkpoints and deletes the WAL when it finds no other
 * process holding the file). Not a fork of this one: a child inherits
 * this process's SQLite lock bookkeeping and would see what it sees. */
static int count_in_child(void) {
    char cmd[PATH_MAX + 96];
    snprintf(cmd, sizeof cmd, "/usr/bin/sqlite3 '%s' 'SELECT count(*) FROM requests'", dbpath);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int n = -1;
    if (fscanf(p, "%d", &n) != 1) n = -1;
    ck_assert_int_eq(pclose(p), 0);
    return n;
}

/* cat_reopen puts a fresh connection in place while the old one is still
 * open: opening must not drop this process's POSIX locks on the file (a
 * close() of any descriptor of it would), or another process's reader
 * takes itself for the last connection at its close and deletes the WAL
 * the writer goes on writing into, unseen by everyone else. */
START_TEST(test_a_reopened_catalog_writes_what_other_processes_read) {
    cat_t *c = open_ok(false);
    TS_OK(cat_request(c, 1, "w1", "k1", 1, 2, 0, 2, 0, 0.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1000));
    TS_OK(cat_reopen(c));
    ck_assert_int_eq(count_in_child(), 1);
    for (int i = 2; i <= 3; i++)
        TS_OK(cat_request(c, (uint64_t)i, "w1", "k1", 1, 2, 0, 2, 0, 0.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1000 + i));
    ck_assert_int_eq(count_in_child(), 3);
    cat_close(&c);
    c = open_ok(true);
    ck_assert_int_eq(cat_reopen(c), -1); /* read-only: refused, c as it was */
    cat_close(&c);
}
END_TEST

START_TEST(test_sql_looking_strings_are_stored_verbatim) {
    static const char *worker = "w'; DROP TABLE captures; --";
    static const char *text = "key \"with\" 'quotes'; DELETE FROM declines; /* */";
    static const char *hash = "h'||'x";
    cat_t *c = open_ok(false);
    TS_OK(cat_worker_seen(c, worker, "dev'ice", "a;b", 1, 1, "b'oot", 1));
    TS_OK(cat_capture(c, worker, text, hash, 0, 1, 1, 0.1, 1, NULL, 2));
    TS_OK(cat_replays(c, worker, hash, 0, 2, 1, 3));
    TS_OK(cat_decline(c, worker, text, hash, "override'); --", 1, 4));
    TS_OK(cat_eviction(c, worker, text, hash, 0, "lru", "c'omp", 0, 1, 1, 5));
    TS_OK(cat_request(c, 7, worker, hash, 1, 2, 1, 1, 0, 0.1, "o'k", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 6));
    TS_OK(cat_artifact(c, "a'; --", "op", "cpu", NULL, "ok", NULL, 7));
    TS_OK(cat_audit(c, "k'; DROP TABLE audit; --", "trainer", "sync", "c'omp", 1, NULL, "/w/'x", "o'k", 8));
    TS_OK(cat_artifact_seen(c, "a'; DROP TABLE artifacts; --", "1", "op", "cpu", NULL, true, false, "v'd", "r'", 9));
    TS_OK(cat_artifact_key(c, worker, "a'; --", "k'ey", "s'", "r'", 1, 2, 3, 4, 5, 6, 1.5, 0.1, 7, 0.25, 10));
    cat_close(&c);

    sqlite3 *db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table'"), 18);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM artifact_keys WHERE key = 'k''ey'"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM audit WHERE path = '/w/''x'"), 1);
    sqlite3_stmt *s;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT worker, key_text, key_hash, replay_count FROM captures",
                                        -1, &s, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    ck_assert_str_eq((const char *)sqlite3_column_text(s, 0), worker);
    ck_assert_str_eq((const char *)sqlite3_column_text(s, 1), text);
    ck_assert_str_eq((const char *)sqlite3_column_text(s, 2), hash);
    ck_assert_int_eq(sqlite3_column_int(s, 3), 2);
    sqlite3_finalize(s);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM declines"), 1);
    sqlite3_close(db);

    c = open_ok(true);
    json_t *j = report_json(c, ctl_report_keys);
    json_t *k = json_array_get(j, 0);
    ck_assert_str_eq(jstr(k, "key_text"), text);
    ck_assert_str_eq(jstr(k, "key_hash"), hash);
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(k, "workers"), 0)), worker);
    json_decref(j);
    j = report_json(c, ctl_report_stats);
    json_t *w = find(json_object_get(j, "workers"), "worker", worker);
    ck_assert_int_eq(jint(json_object_get(w, "declines_by_reason"), "override'); --"), 1);
    json_decref(j);
    cat_close(&c);
}
END_TEST

START_TEST(test_control_characters_and_non_utf8_do_not_break_reports) {
    cat_t *c = open_ok(false);
    TS_OK(cat_capture(c, "w1", "line\none\ttab \xff\xfe", "k", 0, 1, 1, 0.1, 1, NULL, 1));
    json_t *j = report_json(c, ctl_report_keys); /* still valid JSON */
    ck_assert_ptr_nonnull(strstr(jstr(json_array_get(j, 0), "key_text"), "line\none"));
    json_decref(j);
    char *t = report_text(c, ctl_report_keys, false);
    int lines = 0;
    for (char *p = t; *p; p++) lines += *p == '\n';
    ck_assert_int_eq(lines, 2); /* header + one row: the newline was masked */
    free(t);
    cat_close(&c);
}
END_TEST

START_TEST(test_a_new_catalog_is_readable_by_its_owner_only) {
    cat_t *c = open_ok(false);
    cat_close(&c);
    struct stat sb;
    ck_assert_int_eq(stat(dbpath, &sb), 0);
    ck_assert_msg((sb.st_mode & 0777) == 0600, "catalog mode %o, want 600", (unsigned)(sb.st_mode & 0777));
}
END_TEST

START_TEST(test_sqlite_uris_and_symlinked_catalogs_are_refused) {
    char uri[4200];
    snprintf(uri, sizeof uri, "file:%s?mode=memory", dbpath);
    ck_assert_ptr_null(cat_open(uri, false));
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "URIs are not accepted"));
    char target[4200], link[4200];
    snprintf(target, sizeof target, "%s/elsewhere.db", tmpdir);
    snprintf(link, sizeof link, "%s/link.db", tmpdir);
    FILE *f = fopen(target, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(symlink(target, link), 0);
    ck_assert_ptr_null(cat_open(link, false));
    ck_assert_ptr_null(cat_open(link, true));
}
END_TEST


/* `reelctl versions` lists the newest `limit` versions of each component
 * (a footer says older ones are left out); the query without a limit, and
 * --json with one, agree on what they list. */
START_TEST(test_versions_report_lists_the_newest_of_each_component_and_says_when_it_cut) {
    cat_t *c = open_ok(false);
    for (int v = 1; v <= 15; v++) TS_OK(cat_weight_version(c, "transformer", (uint64_t)v, "aa", "/w", 100 + v));
    for (int v = 1; v <= 3; v++) TS_OK(cat_weight_version(c, "vae", (uint64_t)v, "bb", "/v", 200 + v));
    json_t *all = cat_query_versions(c), *some = cat_query_versions_recent(c, 10);
    ck_assert_uint_eq(json_array_size(all), 18);
    ck_assert_uint_eq(json_array_size(some), 13);
    ck_assert_int_eq(jint(json_array_get(some, 0), "version"), 15);
    ck_assert_int_eq(jint(json_array_get(some, 9), "version"), 6);
    ck_assert_str_eq(jstr(json_array_get(some, 10), "component"), "vae");
    json_decref(all);
    json_decref(some);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_int_eq(ctl_report_versions_recent(c, false, f, 10), 0);
    fclose(f);
    ck_assert_msg(strstr(buf, "the 10 newest versions of each component; --all lists every one"), "%s", buf);
    ck_assert_ptr_null(strstr(buf, "transformer  5 ")); /* cut */
    free(buf);
    f = open_memstream(&buf, &len);
    ck_assert_int_eq(ctl_report_versions_recent(c, false, f, 20), 0);
    fclose(f);
    ck_assert_ptr_null(strstr(buf, "--all")); /* nothing left out: no footer */
    free(buf);
    f = open_memstream(&buf, &len);
    ck_assert_int_eq(ctl_report_versions_recent(c, false, f, 15), 0); /* exactly 15: none left out */
    fclose(f);
    ck_assert_ptr_null(strstr(buf, "--all"));
    ck_assert_ptr_nonnull(strstr(buf, "transformer"));
    free(buf);
    cat_close(&c);
}
END_TEST

/* ---- reelctl why ---------------------------------------------------------- */

/* A key text at weight version v: the same graph at every v, as a worker
 * keys it (capture_cache/key.h). */
#define WHY_KEY(v) "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler" \
    " inputs=latent:F32[4,2,8,8] weights=transformer@" v " graph=dtype:F32,cfg:cond,expert:-,sched:f32"
#define WHY_A1 "00000000000000a1" /* the key at v1 */
#define WHY_A2 "00000000000000a2" /* the same graph at v2 */
#define WHY_SHARD "5555555555555555"

/* The broker's id of the history's requests (REQUEST's, the one a
 * worker's log names): no client's id. */
#define WHY_BROKER_ID(id) (7000000u + (uint64_t)(id))

/* One ok request of w's capture key ck ending at t. */
static void why_request(cat_t *c, uint64_t id, const char *w, uint64_t version, int captured, int replayed,
                        int eager, double seconds, const char *ck, const char *why, double t) {
    TS_OK(cat_request(c, id, w, WHY_SHARD, version, captured + replayed + eager, captured, replayed, eager, seconds,
                      "ok", 0.01, 0.02, 0, 0, 0, ck, why, NULL, NAN, WHY_BROKER_ID(id), t));
}

/* The history the why tests read: on w0 the key is captured by its first
 * request (its capture reaches the broker after the request's end, as
 * workers send events in batches), replayed, evicted by a sync to v2 and
 * captured again at v2 by the next request; another key on w0 and the
 * same key on w1 must stay out of w0's history; request 2's id comes back
 * on w1 (ids restart with their client); request 5 failed. */
static void write_why_history(cat_t *c) {
    why_request(c, 1, "w0", 1, 1, 3, 2, 0.5, WHY_A1, "warming_up=2", 1000.0);
    TS_OK(cat_capture(c, "w0", WHY_KEY("1"), WHY_A1, 0, 4096, 12, 0.05, 1, NULL, 1000.2));
    TS_OK(cat_decline(c, "w0", WHY_KEY("1"), WHY_A1, "warming_up", 2, 1000.2));
    TS_OK(cat_capture(c, "w0", "reel-key/1 other graph", "00000000000000b1", 0, 1, 1, 0.1, 1, NULL, 1000.5));
    TS_OK(cat_capture(c, "w1", WHY_KEY("1"), WHY_A1, 0, 1, 1, 0.1, 1, NULL, 1000.6));
    why_request(c, 2, "w0", 1, 0, 6, 0, 0.1, WHY_A1, NULL, 1001.0);
    why_request(c, 3, "w0", 1, 0, 6, 0, 0.12, WHY_A1, NULL, 1002.0);
    why_request(c, 4, "w0", 1, 0, 6, 0, 0.9, WHY_A1, NULL, 1003.0);
    TS_OK(cat_request(c, 5, "w0", WHY_SHARD, 1, 6, 0, 0, 0, 3.0, "timeout", 0, 0, 0, 0, 0, NULL, NULL,
                      "no result within 3000 ms (running)", NAN, 0, 1004.0));
    why_request(c, 8, "w0", 1, 0, 6, 0, 0.2, WHY_A1, NULL, 1005.0);
    why_request(c, 10, "w0", 1, 0, 4, 2, 0.3, WHY_A1, "budget_exceeded=2", 1006.0);
    TS_OK(cat_eviction(c, "w0", WHY_KEY("1"), WHY_A1, 1, "weight_sync", "transformer", 1, 2, 2, 1010.0));
    why_request(c, 6, "w0", 2, 1, 3, 2, 0.6, WHY_A2, "warming_up=2", 1011.0);
    TS_OK(cat_capture(c, "w0", WHY_KEY("2"), WHY_A2, 0, 4096, 12, 0.05, 2, NULL, 1011.1));
    why_request(c, 2, "w1", 1, 0, 6, 0, 0.1, WHY_A1, NULL, 1012.0);
    why_request(c, 9, "w0", 2, 0, 6, 0, 0.3, WHY_A2, NULL, 1013.0);
    why_request(c, 11, "w0", 2, 0, 6, 0, 0.5, WHY_A2, NULL, 1014.0);
}

static json_t *why_ok(cat_t *c, long long id, const char *worker) {
    json_t *j = cat_query_why(c, id, worker);
    ck_assert_msg(j != NULL, "why %lld: %s", id, reel_err_text());
    return j;
}

static const char *why_kind(const json_t *j) { return jstr(json_object_get(j, "verdict"), "kind"); }
static const char *why_text(const json_t *j) { return jstr(json_object_get(j, "verdict"), "text"); }

START_TEST(test_why_the_first_request_of_a_key_ran_warmup_and_made_its_first_capture) {
    cat_t *w = open_ok(false);
    write_why_history(w);
    cat_t *c = open_ok(true);
    json_t *j = why_ok(c, 1, NULL);
    ck_assert_str_eq(why_kind(j), "new_key");
    /* its own capture, reported 0.2 s after its end; not w0's other key,
     * not w1's capture of the same key */
    json_t *caps = json_object_get(j, "captures");
    ck_assert_uint_eq(json_array_size(caps), 1);
    ck_assert_str_eq(jstr(json_array_get(caps, 0), "key_hash"), WHY_A1);
    ck_assert(json_is_true(json_object_get(json_array_get(caps, 0), "this_key")));
    ck_assert(json_is_true(json_object_get(json_array_get(caps, 0), "after_end")));
    ck_assert_uint_eq(json_array_size(json_object_get(j, "evictions")), 0);
    ck_assert_str_eq(jstr(j, "weights"), "transformer@1");
    ck_assert_int_eq(jint(json_object_get(j, "declines"), "warming_up"), 2);
    const char *t = why_text(j);
    ck_assert_msg(strstr(t, "2 of its 6 steps ran eager (warming_up=2) and 1 was captured: the key was new on w0") &&
                      strstr(t, "first capture is at 1970-01-01T00:16:40.200Z, by this request") &&
                      strstr(t, "warmup steps before the graph is captured") &&
                      strstr(t, "; capturing its graph took 0.050 s of its 0.500 s"),
                  "%s", t);
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

/* Requests of one key that share their stream's steps (concurrent, as
 * the demo's own load is): a request's seconds are the sum of its own
 * steps, so its end minus them falls after captures it made itself or
 * ran its warmup before. Its row's `started` (when the broker sent it to
 * its worker) is its start: the request that captured the key, and its
 * peer that ran warmup steps beside it, both find the key new (helper-72:
 * both were told "eager although captured before"); a row without
 * `started` (before migration 16) keeps the old estimate. */
START_TEST(test_why_concurrent_requests_of_a_new_key_are_new_key_from_their_started) {
#define WHY_C1 "00000000000000c1"
#define WHY_KEY_C "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler" \
    " inputs=latent:F32[4,2,16,16] weights=transformer@1 graph=dtype:F32,cfg:cond,expert:-,sched:f32"
    cat_t *w = open_ok(false);
    /* A: sent at 2000, ran 2 warmup steps, captured (stamped 2006), ended 2010 after 2.2 s of its own steps */
    TS_OK(cat_request(w, 20, "w0", WHY_SHARD, 1, 6, 1, 3, 2, 2.2, "ok", 0.01, 0.02, 0, 0, 0, WHY_C1, "warming_up=2",
                      NULL, 2000.0, 0, 2010.0));
    /* B: sent at 2000.5, its 2 warmup steps before A's capture, then replayed; ended 2009 */
    TS_OK(cat_request(w, 21, "w0", WHY_SHARD, 1, 4, 0, 2, 2, 1.5, "ok", 0.01, 0.02, 0, 0, 0, WHY_C1, "warming_up=2",
                      NULL, 2000.5, 0, 2009.0));
    TS_OK(cat_capture(w, "w0", WHY_KEY_C, WHY_C1, 0, 4096, 12, 0.8, 1, NULL, 2006.0));
    /* C: the same as B, from before migration 16 (no started): the old estimate, 2009 - 1.53 */
    TS_OK(cat_request(w, 22, "w0", WHY_SHARD, 1, 4, 0, 2, 2, 1.5, "ok", 0.01, 0.02, 0, 0, 0, WHY_C1, "warming_up=2",
                      NULL, NAN, 0, 2009.0));
    cat_t *c = open_ok(true);
    json_t *j = why_ok(c, 20, NULL);
    ck_assert_msg(!strcmp(why_kind(j), "new_key") && strstr(why_text(j), "by this request"), "%s: %s", why_kind(j),
                  why_text(j));
    ck_assert_double_eq(jnum(j, "started"), 2000.0);
    json_decref(j);
    j = why_ok(c, 21, NULL);
    ck_assert_msg(!strcmp(why_kind(j), "new_key") && strstr(why_text(j), "warmup steps before the graph is captured"),
                  "%s: %s", why_kind(j), why_text(j));
    json_decref(j);
    j = why_ok(c, 22, NULL);
    ck_assert_str_eq(why_kind(j), "eager");
    ck_assert_double_eq_tol(jnum(j, "started"), 2009.0 - 1.53, 1e-9);
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
#undef WHY_C1
#undef WHY_KEY_C
}
END_TEST

/* A request's own captures are as many as it made (helper-91: every
 * capture of the key within 5 s after its end was listed as "its own",
 * and captures_before added the captures stamped before a request to the
 * capturing requests that ended before it, counting one capture twice).
 * P (sent 3000, ended 3001) captured 1, stamped 3001.1; Q (sent 3001.15,
 * ended 3001.25) captured the key again, stamped 3001.3 (a dropped graph
 * captured anew). P lists 3001.1 only; Q lists both, its own after its
 * end; R (sent 3002) counts 2 captures before it, not 4. */
START_TEST(test_why_lists_as_a_requests_own_only_the_captures_it_made) {
#define WHY_F1 "00000000000000f1"
#define WHY_KEY_F "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler" \
    " inputs=latent:F32[4,2,8,16] weights=transformer@1 graph=dtype:F32,cfg:cond,expert:-,sched:f32"
    cat_t *w = open_ok(false);
    TS_OK(cat_request(w, 30, "w0", WHY_SHARD, 1, 4, 1, 1, 2, 0.9, "ok", 0.0, 0.0, 0, 0, 0, WHY_F1, "warming_up=2",
                      NULL, 3000.0, 0, 3001.0));
    TS_OK(cat_capture(w, "w0", WHY_KEY_F, WHY_F1, 0, 4096, 12, 0.1, 1, NULL, 3001.1));
    TS_OK(cat_request(w, 31, "w0", WHY_SHARD, 1, 4, 1, 3, 0, 0.1, "ok", 0.0, 0.0, 0, 0, 0, WHY_F1, NULL, NULL,
                      3001.15, 0, 3001.25));
    TS_OK(cat_capture(w, "w0", WHY_KEY_F, WHY_F1, 0, 4096, 12, 0.1, 1, NULL, 3001.3));
    TS_OK(cat_request(w, 32, "w0", WHY_SHARD, 1, 4, 0, 4, 0, 0.1, "ok", 0.0, 0.0, 0, 0, 0, WHY_F1, NULL, NULL,
                      3002.0, 0, 3002.1));
    cat_t *c = open_ok(true);
    json_t *j = why_ok(c, 30, NULL);
    json_t *caps = json_object_get(j, "captures");
    ck_assert_uint_eq(json_array_size(caps), 1);
    ck_assert_double_eq(jnum(json_array_get(caps, 0), "t"), 3001.1);
    ck_assert(json_is_true(json_object_get(json_array_get(caps, 0), "after_end")));
    json_decref(j);
    j = why_ok(c, 31, NULL);
    caps = json_object_get(j, "captures");
    ck_assert_uint_eq(json_array_size(caps), 2); /* P's, before its end, and its own after it */
    ck_assert(json_is_false(json_object_get(json_array_get(caps, 0), "after_end")));
    ck_assert(json_is_true(json_object_get(json_array_get(caps, 1), "after_end")));
    json_decref(j);
    j = why_ok(c, 32, NULL);
    ck_assert_int_eq(jint(json_object_get(j, "totals"), "captures_before"), 2);
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
#undef WHY_F1
#undef WHY_KEY_F
}
END_TEST

/* A request on worker "wd" of key kh, sent at started, ending at t. */
static void why_at(cat_t *c, uint64_t id, const char *kh, uint64_t version, int captured, int replayed, int eager,
                   int batched, const char *why, double started, double t) {
    TS_OK(cat_request(c, id, "wd", WHY_SHARD, version, captured + replayed + eager, captured, replayed, eager, 0.5,
                      "ok", 0.0, 0.0, batched, batched ? 2 * batched : 0, 0, kh, why, NULL, started, 0, t));
}

/* helper-74's ground truth against the verdicts:
 * - an eviction before any capture of the key dropped a warming entry,
 *   not a graph: the key is new, not "evicted";
 * - steps declined for budget_exceeded alone, the key never captured: the
 *   verdict says declined and names --budget, not "the key was new ... so
 *   this request paid for its graph";
 * - a sync that keeps graphs (a LoRA sync) re-keys them in place, with no
 *   capture under the new key: a request of the new key counts the
 *   lineage's captures (before: "new_key"), and a recapture at v2 after a
 *   v1 -> v2 eviction, re-keyed to v3, is a recapture (before: "evicted
 *   ... not captured again");
 * - eager steps of a request that also ran in mixed batches say so. */
START_TEST(test_why_verdicts_hold_for_warming_evictions_budget_declines_and_rekeyed_graphs) {
#define KD(v) "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler inputs=latent:F32[4,1,2,2] weights=transformer@" v " graph=g"
#define KE "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler inputs=latent:F32[4,1,2,4] weights=transformer@1 graph=g"
#define KG(v) "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler inputs=latent:F32[4,1,4,4] weights=transformer@" v " graph=g"
    cat_t *w = open_ok(false);
    /* D: its warming entry evicted (lru) at 2990, never captured */
    TS_OK(cat_key_text(w, "00000000000000d1", KD("1"), 2900));
    TS_OK(cat_eviction(w, "wd", KD("1"), "00000000000000d1", 0, "lru", "", 0, 0, 1, 2990));
    why_at(w, 40, "00000000000000d1", 1, 0, 0, 6, 0, "warming_up=6", 2980, 3000);
    /* E: every step budget_exceeded, never captured */
    TS_OK(cat_key_text(w, "00000000000000e1", KE, 2900));
    why_at(w, 41, "00000000000000e1", 1, 0, 0, 6, 0, "budget_exceeded=6", 3000, 3010);
    /* G: captured at v1, evicted by the sync to v2, captured again at v2,
     * re-keyed in place to v3 by a LoRA sync (its text only) */
    TS_OK(cat_capture(w, "wd", KG("1"), "00000000000000a7", 0, 4096, 12, 0.05, 1, NULL, 3400));
    TS_OK(cat_eviction(w, "wd", KG("1"), "00000000000000a7", 0, "weight_sync", "transformer", 1, 2, 1, 3500));
    TS_OK(cat_capture(w, "wd", KG("2"), "00000000000000b7", 0, 4096, 12, 0.05, 2, NULL, 3501));
    TS_OK(cat_key_text(w, "00000000000000c7", KG("3"), 3600));
    why_at(w, 42, "00000000000000c7", 3, 0, 5, 1, 0, "pinned_input_moved=1", 3700, 3710);
    why_at(w, 43, "00000000000000c7", 3, 0, 4, 2, 3, "warming_up=2", 3720, 3730);
    /* H: request 44 captured it and ended at 3800; its capture reached the
     * catalog late, stamped 3802; request 45 started at 3800.5 (after 44's
     * RESULT) and ran 2 steps eager: captured before it, not new_key */
    TS_OK(cat_key_text(w, "00000000000000c8", KD("9"), 3700));
    why_at(w, 44, "00000000000000c8", 1, 1, 3, 2, 0, "warming_up=2", 3790, 3800);
    why_at(w, 45, "00000000000000c8", 1, 0, 4, 2, 0, "pinned_input_moved=2", 3800.5, 3801.5);
    TS_OK(cat_capture(w, "wd", KD("9"), "00000000000000c8", 0, 4096, 12, 0.05, 1, NULL, 3802));
    cat_t *c = open_ok(true);
    json_t *j = why_ok(c, 45, NULL);
    ck_assert_msg(!strcmp(why_kind(j), "eager"), "%s: %s", why_kind(j), why_text(j));
    json_decref(j);
    j = why_ok(c, 44, NULL); /* and 44 itself: still the key's first, by this request */
    ck_assert_msg(!strcmp(why_kind(j), "new_key") && strstr(why_text(j), "by this request"), "%s: %s", why_kind(j),
                  why_text(j));
    json_decref(j);
    j = why_ok(c, 40, NULL);
    ck_assert_msg(!strcmp(why_kind(j), "new_key"), "%s: %s", why_kind(j), why_text(j));
    json_decref(j);
    j = why_ok(c, 41, NULL);
    ck_assert_msg(!strcmp(why_kind(j), "declined") && strstr(why_text(j), "--budget"), "%s: %s", why_kind(j),
                  why_text(j));
    json_decref(j);
    j = why_ok(c, 42, NULL);
    ck_assert_msg(!strcmp(why_kind(j), "eager") && strstr(why_text(j), "captured on wd before"), "%s: %s",
                  why_kind(j), why_text(j));
    ck_assert_int_eq(jint(json_object_get(j, "totals"), "captures_before"), 2);
    json_decref(j);
    j = why_ok(c, 43, NULL);
    ck_assert_msg(!strcmp(why_kind(j), "eager") && strstr(why_text(j), "warmup is recorded under its key"),
                  "%s: %s", why_kind(j), why_text(j));
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
#undef KD
#undef KE
#undef KG
}
END_TEST

/* A worker killed (SIGKILL, a crash) and started again sends its READY
 * with a new boot: the graphs its old process held -- captures with no
 * eviction since, per stream -- are recorded evicted, reason
 * "worker_restarted", once; a READY of the same boot (a broker restart)
 * and one with no boot (an older worker) record none. `why` then tells
 * the warmup after it (helper-74: "eager although captured before"). */
START_TEST(test_a_worker_process_restart_evicts_the_graphs_its_old_process_held) {
#define KR "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler inputs=latent:F32[4,3,2,2] weights=transformer@1 graph=g"
    cat_t *w = open_ok(false);
    TS_OK(cat_worker_seen(w, "wr", "cpu", "x86_64", 2, 0, "00000000000000aa", 100));
    TS_OK(cat_capture(w, "wr", KR, "00000000000000f1", 0, 4096, 12, 0.05, 1, NULL, 110));
    TS_OK(cat_capture(w, "wr", KR, "00000000000000f1", 1, 4096, 12, 0.05, 1, NULL, 111));
    TS_OK(cat_capture(w, "wr", "reel-key/1 other", "00000000000000f2", 0, 4096, 12, 0.05, 1, NULL, 112));
    TS_OK(cat_eviction(w, "wr", "reel-key/1 other", "00000000000000f2", 0, "lru", "", 0, 0, 1, 113));
    TS_OK(cat_worker_seen(w, "wr", "cpu", "x86_64", 2, 0, "00000000000000aa", 200)); /* a broker restart */
    TS_OK(cat_worker_seen(w, "wr", "cpu", "x86_64", 2, 0, "00000000000000bb", 300)); /* a new process */
    TS_OK(cat_worker_seen(w, "wr", "cpu", "x86_64", 2, 0, "00000000000000bb", 301)); /* again: nothing left */
    TS_OK(cat_request(w, 50, "wr", WHY_SHARD, 1, 6, 1, 3, 2, 0.5, "ok", 0.0, 0.0, 0, 0, 0, "00000000000000f1",
                      "warming_up=2", NULL, 310, 0, 320));
    TS_OK(cat_worker_seen(w, "wr", "cpu", "x86_64", 2, 0, NULL, 400));               /* an older worker */
    TS_OK(cat_capture(w, "wr", KR, "00000000000000f1", 0, 4096, 12, 0.05, 1, NULL, 410));
    TS_OK(cat_worker_seen(w, "wr", "cpu", "x86_64", 2, 0, "00000000000000cc", 500)); /* its boot unknown */
    /* a graph is its key's lineage (helper-78): on wq, one captured at v2 and
     * re-keyed in place to v3 (no capture under v3) was stopped cleanly
     * under its v3 key; another was dropped at v2 and captured again at v3.
     * A new process: one graph was held (the second), recorded once. */
#define KQ(v) "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler inputs=latent:F32[4,5,2,2] weights=transformer@" v " graph=g"
#define KS(v) "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler inputs=latent:F32[4,6,2,2] weights=transformer@" v " graph=g"
    TS_OK(cat_worker_seen(w, "wq", "cpu", "x86_64", 1, 0, "00000000000000a1", 600));
    TS_OK(cat_capture(w, "wq", KQ("2"), "00000000000000e2", 0, 4096, 12, 0.05, 2, NULL, 610));
    TS_OK(cat_eviction(w, "wq", KQ("3"), "00000000000000e3", 0, "shutdown", "", 0, 0, 3, 650));
    TS_OK(cat_capture(w, "wq", KS("2"), "00000000000000f2", 0, 4096, 12, 0.05, 2, NULL, 611));
    TS_OK(cat_eviction(w, "wq", KS("2"), "00000000000000f2", 0, "dropped", "", 0, 0, 2, 620));
    TS_OK(cat_capture(w, "wq", KS("3"), "00000000000000f3", 0, 4096, 12, 0.05, 3, NULL, 630));
    TS_OK(cat_worker_seen(w, "wq", "cpu", "x86_64", 1, 0, "00000000000000a2", 700));
    /* on wl, a graph captured at v2 and re-keyed in place to v3 by a LoRA
     * sync (its rekey event: the v3 key's text; its replays since: a
     * placeholder row under the v3 key), then SIGKILLed: the graph the old
     * process held was the v3 one -- as a clean stop records it (w0's
     * `shutdown` rows in opprobe's day) -- so it is recorded evicted under
     * the v3 key, counted at v3 (it was recorded under the v2 key, at v2) */
#define KL(v) "reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler inputs=latent:F32[4,7,2,2] weights=transformer@" v " graph=g"
    TS_OK(cat_worker_seen(w, "wl", "cpu", "x86_64", 1, 0, "00000000000000b1", 800));
    TS_OK(cat_capture(w, "wl", KL("2"), "00000000000000d2", 0, 4096, 12, 0.05, 2, NULL, 810));
    TS_OK(cat_replays(w, "wl", "00000000000000d2", 0, 3, 2, 815));
    TS_OK(cat_key_text(w, "00000000000000d3", KL("3"), 820));
    TS_OK(cat_replays(w, "wl", "00000000000000d3", 0, 4, 3, 830));
    TS_OK(cat_worker_seen(w, "wl", "cpu", "x86_64", 1, 0, "00000000000000b2", 900));
#undef KQ
#undef KS
    cat_close(&w);
    sqlite3 *db = raw_open(true);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM evictions WHERE worker = 'wr' AND reason = 'worker_restarted'"),
                     2);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM evictions WHERE reason = 'worker_restarted' AND t = 300"
                                 " AND key_hash = '00000000000000f1' AND stream IN (0, 1)"), 2);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM eviction_reasons WHERE reason = 'worker_restarted'"
                                 " AND count = 2"), 1); /* the summaries count them too */
    ck_assert_int_eq(raw_int(db, "SELECT sum(evictions) FROM rollups WHERE key_hash = '00000000000000f1'"
                                 " AND version = 1"), 2); /* at the version of the graphs' key */
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM evictions WHERE worker = 'wq' AND reason = 'worker_restarted'"),
                     1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM evictions WHERE worker = 'wq' AND reason = 'worker_restarted'"
                                 " AND key_hash = '00000000000000f3'"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM evictions WHERE worker = 'wl' AND reason = 'worker_restarted'"),
                     1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM evictions WHERE worker = 'wl' AND reason = 'worker_restarted'"
                                 " AND key_hash = '00000000000000d3' AND key_text = '" KL("3") "' AND t = 900"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM rollups WHERE worker = 'wl' AND evictions = 1"
                                 " AND key_hash = '00000000000000d3' AND version = 3"), 1);
#undef KL
    sqlite3_close(db);
    cat_t *c = open_ok(true);
    json_t *j = why_ok(c, 50, NULL);
    ck_assert_msg(!strcmp(why_kind(j), "evicted") && strstr(why_text(j), "worker_restarted"), "%s: %s",
                  why_kind(j), why_text(j));
    json_decref(j);
    cat_close(&c);
#undef KR
}
END_TEST

/* The median of the other ok requests of the key on the worker: even and
 * odd counts, the request itself and other keys' and workers' left out. */
START_TEST(test_why_a_replayed_request_is_compared_with_the_median_of_its_keys_other_requests) {
    cat_t *w = open_ok(false);
    write_why_history(w);
    cat_t *c = open_ok(true);
    /* id 2 twice: the newest is w1's; --worker w0 picks the older */
    json_t *j = why_ok(c, 2, NULL);
    ck_assert_str_eq(jstr(json_object_get(j, "request"), "worker"), "w1");
    ck_assert_int_eq(jint(j, "matches"), 2);
    json_decref(j);
    j = why_ok(c, 2, "w0");
    ck_assert_int_eq(jint(j, "matches"), 1);
    ck_assert_str_eq(why_kind(j), "replayed");
    ck_assert_msg(strstr(why_text(j), "every step replayed: its 0.100 s is the steps' own"), "%s", why_text(j));
    json_t *p = json_object_get(j, "peers");
    /* 1, 3, 4, 8, 10: 0.5 0.12 0.9 0.2 0.3 -> 0.3 */
    ck_assert_int_eq(jint(p, "count"), 5);
    ck_assert_double_eq_tol(json_number_value(json_object_get(p, "median_seconds")), 0.3, 1e-12);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "captures")), 1); /* before its end: the v1 capture */
    json_decref(j);
    /* request 4: 0.9 s against 1, 2, 3, 8, 10 (0.5 0.1 0.12 0.2 0.3: 0.2) */
    j = why_ok(c, 4, NULL);
    ck_assert_str_eq(why_kind(j), "replayed_slow");
    ck_assert_double_eq_tol(json_number_value(json_object_get(json_object_get(j, "peers"), "ratio")), 4.5, 1e-9);
    json_decref(j);
    /* v2's requests (6, 9, 11): 9 against 6 and 11, an even count */
    j = why_ok(c, 9, NULL);
    ck_assert_int_eq(jint(json_object_get(j, "peers"), "count"), 2);
    ck_assert_double_eq_tol(json_number_value(json_object_get(json_object_get(j, "peers"), "median_seconds")), 0.55,
                            1e-12);
    json_decref(j);
    /* request 10 against 1, 2, 3, 4 and 8 */
    j = why_ok(c, 10, NULL);
    ck_assert_str_eq(why_kind(j), "eager"); /* eager though the key was captured before */
    ck_assert_int_eq(jint(json_object_get(j, "peers"), "count"), 5);
    /* 0.5 0.1 0.12 0.9 0.2 -> 0.2 */
    ck_assert_double_eq_tol(json_number_value(json_object_get(json_object_get(j, "peers"), "median_seconds")), 0.2,
                            1e-12);
    ck_assert_msg(strstr(why_text(j), "budget_exceeded=2) although the key had been captured on w0 before"), "%s",
                  why_text(j));
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

START_TEST(test_why_a_request_after_a_sync_finds_the_eviction_of_its_graph_at_the_old_version) {
    cat_t *w = open_ok(false);
    write_why_history(w);
    cat_t *c = open_ok(true);
    json_t *j = why_ok(c, 6, NULL);
    ck_assert_str_eq(why_kind(j), "evicted");
    json_t *evs = json_object_get(j, "evictions"), *caps = json_object_get(j, "captures");
    ck_assert_uint_eq(json_array_size(evs), 1);
    json_t *e = json_array_get(evs, 0);
    ck_assert_str_eq(jstr(e, "key_hash"), WHY_A1); /* the graph at v1: another capture key */
    ck_assert(json_is_false(json_object_get(e, "this_key")));
    ck_assert_int_eq(jint(e, "stream"), 1);
    ck_assert_str_eq(jstr(e, "reason"), "weight_sync");
    ck_assert_int_eq(jint(e, "from_version"), 1);
    ck_assert_int_eq(jint(e, "to_version"), 2);
    /* the v1 capture and its own v2 one, oldest first; not the other key's */
    ck_assert_uint_eq(json_array_size(caps), 2);
    ck_assert_str_eq(jstr(json_array_get(caps, 0), "key_hash"), WHY_A1);
    ck_assert_str_eq(jstr(json_array_get(caps, 1), "key_hash"), WHY_A2);
    /* captures of its graph before it, the key's lineage (the v1 capture): the eviction explains its warmup */
    ck_assert_int_eq(jint(json_object_get(j, "totals"), "captures_before"), 1);
    const char *t = why_text(j);
    ck_assert_msg(strstr(t, "its graph was evicted at 1970-01-01T00:16:50.000Z (weight_sync, transformer v1 -> v2)"
                            " and captured again by this request at 1970-01-01T00:16:51.100Z") &&
                      strstr(t, "weights=transformer@1, now weights=transformer@2") &&
                      strstr(t, "; capturing its graph took 0.050 s of its"),
                  "%s", t);
    json_decref(j);
    /* a request of the v1 key before the sync: the later eviction is no
     * part of its history */
    j = why_ok(c, 8, NULL);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "evictions")), 0);
    json_decref(j);
    cat_close(&c);
    cat_close(&w);
}
END_TEST

/* ... and what its client was told (the ERROR's message, schema 14). */
START_TEST(test_why_a_failed_request_says_it_had_no_result_and_an_unknown_id_is_not_found) {
    cat_t *w = open_ok(false);
    write_why_history(w);
    cat_t *c = open_ok(true);
    json_t *j = why_ok(c, 5, NULL);
    ck_assert_str_eq(why_kind(j), "failed");
    ck_assert_str_eq(why_text(j), "failed: timeout after 3.000 s: no result within 3000 ms (running) (no RESULT: the "
                                  "catalog holds no capture key for it)");
    ck_assert_uint_eq(json_array_size(json_object_get(j, "captures")), 0);
    json_decref(j);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_int_eq(ctl_report_why(c, 5, NULL, false, f), 0);
    fclose(f);
    ck_assert_msg(strstr(buf, "verdict: failed: timeout") && !strstr(buf, "captures of its graph"), "%s", buf);
    free(buf);
    ck_assert_ptr_null(cat_query_why(c, 999, NULL));
    ck_assert_int_eq(reel_err_code(), REEL_E_NOT_FOUND);
    ck_assert_msg(strstr(reel_err_text(), "no request 999"), "%s", reel_err_text());
    ck_assert_ptr_null(cat_query_why(c, 1, "w9"));
    ck_assert_int_eq(reel_err_code(), REEL_E_NOT_FOUND);
    ck_assert_msg(strstr(reel_err_text(), "no request 1 on worker w9 (1 on other workers)"), "%s", reel_err_text());
    cat_close(&c);
    cat_close(&w);
}
END_TEST

/* Two requests of one key on two streams of w0 at once, each capturing its
 * own graph (helper-110, make demo): the catalog does not say which capture
 * is whose, so why says "by this request or 1 of its key running beside
 * it" and gives the range of those captures' seconds; a request of the key
 * alone later says "by this request". */
START_TEST(test_why_does_not_credit_a_request_with_a_capture_another_stream_may_have_made) {
    cat_t *c = open_ok(false);
    const char *k = "00000000000000c7";
    TS_OK(cat_request(c, 21, "w0", WHY_SHARD, 1, 6, 1, 3, 2, 0.9, "ok", 0, 0, 0, 0, 0, k, "warming_up=2", NULL,
                      2000.0, 0, 2001.0));
    TS_OK(cat_request(c, 22, "w0", WHY_SHARD, 1, 6, 1, 3, 2, 1.0, "ok", 0, 0, 0, 0, 0, k, "warming_up=2", NULL,
                      2000.1, 0, 2001.2));
    TS_OK(cat_capture(c, "w0", WHY_KEY("1") " c7", k, 0, 4096, 12, 0.3, 1, NULL, 2000.5));
    TS_OK(cat_capture(c, "w0", WHY_KEY("1") " c7", k, 1, 4096, 12, 0.6, 1, NULL, 2000.7));
    json_t *j = why_ok(c, 21, NULL);
    ck_assert_str_eq(why_kind(j), "new_key");
    ck_assert_msg(strstr(why_text(j), "by this request or 1 of its key running beside it") &&
                      strstr(why_text(j), "capturing its graph took 0.300-0.600 s"),
                  "%s", why_text(j));
    json_decref(j);
    /* alone: its capture is its own */
    TS_OK(cat_request(c, 23, "w0", WHY_SHARD, 1, 6, 1, 3, 2, 0.4, "ok", 0, 0, 0, 0, 0, "00000000000000c8",
                      "warming_up=2", NULL, 3000.0, 0, 3001.0));
    TS_OK(cat_capture(c, "w0", WHY_KEY("1") " c8", "00000000000000c8", 0, 4096, 12, 0.2, 1, NULL, 3000.5));
    j = why_ok(c, 23, NULL);
    ck_assert_msg(strstr(why_text(j), ", by this request --") && !strstr(why_text(j), "beside") &&
                      strstr(why_text(j), "capturing its graph took 0.200 s"),
                  "%s", why_text(j));
    json_decref(j);
    cat_close(&c);
}
END_TEST

/* Retention prunes raw requests but keeps each hour's slowest: why reads
 * those, and says the time split is unknown (null), not 0. */
START_TEST(test_why_reads_the_slowest_requests_once_retention_pruned_the_raw_row) {
    cat_t *w = open_ok(false);
    write_why_history(w);
    cat_close(&w);
    cat_t *c = reopened_without_raw_requests();
    json_t *j = why_ok(c, 4, NULL);
    ck_assert_str_eq(jstr(j, "source"), "slow_requests");
    ck_assert(json_is_null(json_object_get(json_object_get(j, "request"), "encode_seconds")));
    ck_assert_str_eq(jstr(json_object_get(j, "request"), "capture_key"), WHY_A1);
    ck_assert(!json_is_true(json_object_get(j, "by_broker_id")));
    json_decref(j);
    /* ... and by the broker's id, which the slowest requests keep */
    j = why_ok(c, (long long)WHY_BROKER_ID(4), NULL);
    ck_assert_str_eq(jstr(j, "source"), "slow_requests");
    ck_assert(json_is_true(json_object_get(j, "by_broker_id")));
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "request"), "id")), 4);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "request"), "broker_id")),
                     (json_int_t)WHY_BROKER_ID(4));
    json_decref(j);
    cat_close(&c);
}
END_TEST

/* Key texts and names come from the network: the text output masks their
 * control characters, and the JSON stays one valid line. */
START_TEST(test_why_masks_control_characters_of_the_catalog) {
    cat_t *c = open_ok(false);
    TS_OK(cat_request(c, 7, "w\x1b[2J", WHY_SHARD, 1, 2, 1, 0, 1, 0.1, "ok", 0, 0, 0, 0, 0, "00000000000000c1",
                      "warm\nup=1", NULL, NAN, 0, 1000.0));
    TS_OK(cat_capture(c, "w\x1b[2J", "reel-key/1 x\r\nforged weights=t@1 graph=\xff", "00000000000000c1", 0, 1, 1,
                      0.1, 1, NULL, 1000.1));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_int_eq(ctl_report_why(c, 7, NULL, false, f), 0);
    fclose(f);
    for (char *p = buf; *p; p++) ck_assert_msg((unsigned char)*p >= 0x20 || *p == '\n', "control byte in %s", buf);
    ck_assert_ptr_null(strstr(buf, "\nforged"));
    ck_assert_ptr_nonnull(strstr(buf, "warm?up=1"));
    free(buf);
    buf = NULL;
    f = open_memstream(&buf, &len);
    ck_assert_int_eq(ctl_report_why(c, 7, NULL, true, f), 0);
    fclose(f);
    json_error_t je;
    json_t *j = json_loads(buf, 0, &je);
    ck_assert_msg(j && strchr(buf, '\n') == buf + len - 1, "%s: %s", je.text, buf);
    json_decref(j);
    free(buf);
    cat_close(&c);
}
END_TEST

static Suite *catalog_suite(void) {
    Suite *s = suite_create("catalog");
    TCase *tc = tcase_create("catalog");
    tcase_add_unchecked_fixture(tc, make_rootdir, remove_rootdir);
    tcase_add_checked_fixture(tc, make_tmpdir, remove_tmpdir);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_migration_creates_schema_on_new_file_and_sets_user_version);
    tcase_add_test(tc, test_reopening_existing_catalog_keeps_rows_and_does_not_remigrate);
    tcase_add_test(tc, test_newer_user_version_is_refused_with_clear_message);
    tcase_add_test(tc, test_migration_15_evictions_before_it_have_no_stream);
    tcase_add_test(tc, test_a_request_rows_counts_are_stored_whole_past_int);
    tcase_add_test(tc, test_readonly_open_of_missing_file_fails_naming_the_path);
    tcase_add_test(tc, test_a_foreign_database_or_a_non_file_is_refused_untouched);
    tcase_add_test(tc, test_readonly_catalog_refuses_writes_with_message);
    tcase_add_test(tc, test_a_new_catalog_that_cannot_be_written_leaves_no_empty_file);
    tcase_add_test(tc, test_catalog_sql_file_builds_the_schema_the_migrations_build);
    tcase_add_test(tc, test_migration_2_marks_versions_no_worker_applied_failed_and_keeps_the_newest_applied_current);
    tcase_add_test(tc, test_migration_5_drops_the_request_indexes_and_recent_requests_stay_newest_first);
    tcase_add_test(tc, test_audit_rows_keep_who_asked_what_and_a_long_source_is_flagged_cut);
    tcase_add_test(tc, test_lora_versions_keep_base_and_an_uploaded_adapters_config_for_a_restart);
    tcase_add_test(tc, test_batch_is_visible_to_readonly_connection_only_after_commit);
    tcase_add_test(tc, test_reader_opened_during_write_transaction_reads_and_never_blocks_writer);
    tcase_add_test(tc, test_forked_writer_commits_while_parent_reads);
    tcase_add_test(tc, test_replays_accumulate_on_newest_capture_of_worker_key_and_stream);
    tcase_add_test(tc, test_replays_without_a_capture_create_a_placeholder_row_and_are_not_lost);
    tcase_add_test(tc, test_decline_upserts_count_per_worker_key_and_reason);
    tcase_add_test(tc, test_worker_seen_again_after_gone_is_live_and_keeps_first_seen);
    tcase_add_test(tc, test_stats_report_counts_captures_replays_hit_rate_breaks_and_reasons);
    tcase_add_test(tc, test_hit_rate_counts_a_group_in_parts_as_its_steps_ran);
    tcase_add_test(tc, test_stats_hit_rate_falls_back_to_capture_counters_without_requests);
    tcase_add_test(tc, test_keys_report_lists_each_key_with_workers_captures_and_replays);
    tcase_add_test(tc, test_evictions_report_is_newest_first_and_limited_to_50);
    tcase_add_test(tc, test_current_versions_are_the_newest_applied_never_pending_or_failed);
    tcase_add_test(tc, test_metrics_are_prometheus_counters_by_worker_and_reason);
    tcase_add_test(tc, test_versions_report_lists_which_workers_applied_each_version);
    tcase_add_test(tc, test_versions_report_lists_the_newest_of_each_component_and_says_when_it_cut);
    tcase_add_test(tc, test_workers_report_shows_last_seen_gone_and_applied_versions);
    tcase_add_test(tc, test_workers_report_shows_live_workers_behind_the_current_version_with_their_reason);
    tcase_add_test(tc, test_requests_report_is_newest_first_with_step_counts);
    tcase_add_test(tc, test_every_report_on_empty_catalog_is_valid_json_and_a_header);
    tcase_add_test(tc, test_table_columns_are_aligned_under_their_headers);
    tcase_add_test(tc, test_sql_looking_strings_are_stored_verbatim);
    tcase_add_test(tc, test_artifact_report_pools_the_speedup_spread_and_reports_sync_timing);
    tcase_add_test(tc, test_report_query_buckets_requests_and_splits_captures_by_sync);
    tcase_add_test(tc, test_report_worker_time_counts_only_the_loops_of_requests_that_ended_ok);
    tcase_add_test(tc, test_a_reopened_catalog_writes_what_other_processes_read);
    tcase_add_test(tc, test_control_characters_and_non_utf8_do_not_break_reports);
    tcase_add_test(tc, test_a_new_catalog_is_readable_by_its_owner_only);
    tcase_add_test(tc, test_sqlite_uris_and_symlinked_catalogs_are_refused);
    tcase_add_test(tc, test_merged_catalogs_hold_each_request_once_and_add_their_summaries);
    tcase_add_test(tc, test_a_merge_refuses_an_older_schema_and_names_the_source_file_in_its_errors);
    tcase_add_test(tc, test_why_the_first_request_of_a_key_ran_warmup_and_made_its_first_capture);
    tcase_add_test(tc, test_why_concurrent_requests_of_a_new_key_are_new_key_from_their_started);
    tcase_add_test(tc, test_why_lists_as_a_requests_own_only_the_captures_it_made);
    tcase_add_test(tc, test_why_verdicts_hold_for_warming_evictions_budget_declines_and_rekeyed_graphs);
    tcase_add_test(tc, test_a_worker_process_restart_evicts_the_graphs_its_old_process_held);
    tcase_add_test(tc, test_why_a_replayed_request_is_compared_with_the_median_of_its_keys_other_requests);
    tcase_add_test(tc, test_why_a_request_after_a_sync_finds_the_eviction_of_its_graph_at_the_old_version);
    tcase_add_test(tc, test_why_a_failed_request_says_it_had_no_result_and_an_unknown_id_is_not_found);
    tcase_add_test(tc, test_why_reads_the_slowest_requests_once_retention_pruned_the_raw_row);
    tcase_add_test(tc, test_why_does_not_credit_a_request_with_a_capture_another_stream_may_have_made);
    tcase_add_test(tc, test_why_masks_control_characters_of_the_catalog);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return ts_run(catalog_suite());
}
