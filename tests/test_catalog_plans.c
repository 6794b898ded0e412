/* test_catalog_plans.c -- the catalog's queries stay seeks as it grows
 * (schema 18). Every statement an operator command runs (reelctl why,
 * requests, evictions, stats, metrics, keys, versions, workers, artifacts,
 * report) and every statement the broker's writer runs (its records, the
 * versions it resumes at start, retention) is recorded as it runs -- a
 * trace on every SQLite connection -- and its plan read (EXPLAIN QUERY
 * PLAN): none may scan a table that grows with traffic or time, nor read
 * every row one worker ever had, unless `expected` lists that read with
 * why it stays bounded or is the report itself. A catalog built by the
 * migrations before schema 18 upgrades in place and keeps its rows, and
 * every report reads the same with or without schema 18's indexes.
 *
 * The catalog is a small busy day written the way the broker writes
 * (catalog writer, batches): workers whose graphs a weight sync evicts
 * and the next requests capture again under their new capture keys (the
 * key's lineage), two clients whose request ids repeat, the broker's ids,
 * failures, declines, a prewarm capture, a graph re-keyed in place, then
 * retention pruning its oldest raw rows. Plans depend on the schema, not
 * on the rows' number (no ANALYZE is ever run), so a small day shows the
 * plans a large one gets. */
#include "catalog/catalog.h"
#include "catalog/catalog_query.h"
#include "base/error.h"

#include <check.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/support.h"

extern const char *const cat_migrations[];
extern const int cat_n_migrations;

static char tmpdir[64];
static char dbpath[PATH_MAX];

static void make_tmpdir(void) {
    ts_mkdtemp(tmpdir, sizeof tmpdir, "catplans");
    snprintf(dbpath, sizeof dbpath, "%s/reel.db", tmpdir);
}

static void remove_tmpdir(void) { ts_rmtree(tmpdir); }

/* ---- the statements run, as they run ---------------------------------------- */

#define MAX_SEEN 512

/* Every distinct (command, statement) run while `running` names a command. */
static struct {
    char *command, *sql;
} seen[MAX_SEEN];
static int n_seen;
static const char *running; /* the command whose statements are recorded; NULL: none */

static void forget_seen(void) {
    for (int i = 0; i < n_seen; i++) {
        free(seen[i].command);
        free(seen[i].sql);
    }
    n_seen = 0;
}

static int on_statement(unsigned type, void *ctx, void *stmt, void *x) {
    (void)ctx, (void)x;
    const char *sql = type == SQLITE_TRACE_PROFILE ? sqlite3_sql(stmt) : NULL;
    if (!running || !sql) return 0;
    for (int i = 0; i < n_seen; i++)
        if (!strcmp(seen[i].command, running) && !strcmp(seen[i].sql, sql)) return 0;
    if (n_seen < MAX_SEEN) {
        seen[n_seen].command = strdup(running);
        seen[n_seen].sql = strdup(sql);
        n_seen++;
    }
    return 0;
}

/* Runs on every connection SQLite opens from here on (the catalog's own). */
static int trace_connection(sqlite3 *db, char **err, const void *api) {
    (void)err, (void)api;
    sqlite3_trace_v2(db, SQLITE_TRACE_PROFILE, on_statement, NULL);
    return SQLITE_OK;
}

static void trace_on(void) { ck_assert_int_eq(sqlite3_auto_extension((void (*)(void))trace_connection), SQLITE_OK); }

/* ---- a small busy day ------------------------------------------------------- */

#define DAY_WORKERS 4
#define DAY_KEYS 6      /* graphs per worker */
#define DAY_SYNC 240    /* requests between weight syncs */
#define DAY_T0 1.75e9
#define DAY_RATE 2.0    /* requests a second: the day spans hours */
#define DAY_BROKER_ID 1000000 /* the broker's ids start here: above every client's */

/* The capture key of graph k at weight version v: its text (with its
 * weights= part) and its hash. */
static void day_key(int k, unsigned v, char text[160], char hash[17]) {
    snprintf(text, 160, "reel-key/1 device=cpu arch=x model=tiny loop=euler inputs=latent:F32[4,%d] weights=transformer@%u"
             " graph=dtype:F32,cfg:cond,expert:-,sched:f32", k + 1, v);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *p = text; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
    snprintf(hash, 17, "%016llx", (unsigned long long)h);
}

static void day_worker(int w, char name[16]) { snprintf(name, 16, "w%d", w); }

/* Writes n requests of the day into the catalog at dbpath (new), with
 * their captures, replays, evictions, declines, syncs, an audit row and an
 * artifact, in the broker's batches. Request i is its client's (two
 * clients: ids repeat) id i / 2 + 1 and the broker's DAY_BROKER_ID + i;
 * its seconds differ from every other's. */
static void write_day(int n) {
    cat_t *c = cat_open(dbpath, false);
    TS_NEW(c);
    char text[160], hash[17], w[16];
    bool held[DAY_WORKERS * DAY_KEYS] = { false };
    unsigned v = 1;
    double t = DAY_T0;
    TS_OK(cat_begin(c));
    for (int i = 0; i < DAY_WORKERS; i++) {
        day_worker(i, w);
        TS_OK(cat_worker_seen(c, w, "cpu", "x", 1, 1 << 30, "b0", t));
        TS_OK(cat_worker_version(c, w, "transformer", v, true, NULL, t));
    }
    TS_OK(cat_weight_version(c, "transformer", v, "00", "uploaded", t));
    TS_OK(cat_weight_state(c, "transformer", v, "current", NULL));
    TS_OK(cat_artifact_seen(c, "art-1", "1", "matmul", "cuda", NULL, true, true, "loaded", NULL, t));
    TS_OK(cat_artifact_key(c, "w0", "art-1", "k", "promoted", NULL, 10, 10, 5, 0, 0, 4, 1.2, 0.1, 0, 0, t));
    for (int i = 0; i < n; i++) {
        t += 1.0 / DAY_RATE;
        if (i > 0 && i % DAY_SYNC == 0) { /* a sync: every graph evicted at the old version */
            v++;
            TS_OK(cat_weight_version(c, "transformer", v, "00", "uploaded", t));
            TS_OK(cat_audit(c, "trainer", "trainer", "sync", "transformer", v, "00", NULL, "accepted", t));
            for (int k = 0; k < DAY_WORKERS * DAY_KEYS; k++) {
                if (!held[k]) continue;
                day_worker(k / DAY_KEYS, w);
                day_key(k, v - 1, text, hash);
                TS_OK(cat_eviction(c, w, text, hash, 0, "weight_sync", "transformer", v - 1, v, v, t));
                held[k] = false;
            }
            for (int k = 0; k < DAY_WORKERS; k++) {
                day_worker(k, w);
                TS_OK(cat_worker_version(c, w, "transformer", v, true, NULL, t + 0.1));
            }
            TS_OK(cat_weight_state(c, "transformer", v, "current", NULL));
        }
        int k = (i * 7) % (DAY_WORKERS * DAY_KEYS);
        bool ok = i % 50 != 49, cap = ok && !held[k];
        day_worker(k / DAY_KEYS, w);
        day_key(k, v, text, hash);
        double secs = 0.5 + (i % 97) / 100.0 + i * 1e-6 + (cap ? 0.8 : 0);
        if (cap) {
            TS_OK(cat_capture(c, w, text, hash, 0, 4096, 12, 0.8, v, i < 3 ? "prewarm" : NULL, t));
            held[k] = true;
        }
        if (ok && i % 37 == 0) TS_OK(cat_decline(c, w, text, hash, "budget_exceeded", 1, t));
        int replayed = ok ? 8 - 3 * cap : 0;
        if (replayed) TS_OK(cat_replays(c, w, hash, 0, (uint64_t)replayed, v, t));
        char shard[17];
        snprintf(shard, sizeof shard, "%016x", 0xa000 + k);
        TS_OK(cat_request(c, (uint64_t)(i / 2 + 1), w, shard, v, 8, cap, replayed, cap ? 2 : 0, secs,
                          ok ? "ok" : "deadline", 0.01, 0.02, 0, 0, 0, ok ? hash : NULL, cap ? "warming_up=2" : NULL,
                          ok ? NULL : "deadline: no result", t - secs - 0.05, (uint64_t)(DAY_BROKER_ID + i), t));
        if (i % 500 == 499) {
            TS_OK(cat_commit(c));
            TS_OK(cat_begin(c));
        }
    }
    /* a graph re-keyed in place by a LoRA sync: its text under the new key, its replays on a placeholder */
    day_key(0, v + 1, text, hash);
    TS_OK(cat_key_text(c, hash, text, t));
    TS_OK(cat_replays(c, "w0", hash, 0, 3, v + 1, t));
    TS_OK(cat_commit(c));
    cat_close(&c);
}

/* ---- every operator command ------------------------------------------------- */

/* The requests `why` is asked about, read from the catalog at dbpath:
 * the newest (a client's id), the newest that ended ok, one from the
 * middle of what requests holds (and its worker), and, by the broker's id,
 * the newest that retention left among the slowest requests alone (else
 * one three quarters in). */
typedef struct {
    long long newest, newest_ok, middle, by_broker, slow;
    char worker[16];
    double since; /* the last hour of the day */
} day_ids_t;

static long long one_int(sqlite3 *db, const char *sql, long long none) {
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    long long v = sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL ? sqlite3_column_int64(s, 0)
                                                                                            : none;
    sqlite3_finalize(s);
    return v;
}

static day_ids_t day_ids(void) {
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    day_ids_t d = { 0 };
    d.newest = one_int(db, "SELECT id FROM requests ORDER BY rowid DESC LIMIT 1", -1);
    d.newest_ok = one_int(db, "SELECT id FROM requests r WHERE status = 'ok' AND NOT EXISTS (SELECT 1 FROM requests x"
                              " WHERE x.id = r.id AND x.rowid > r.rowid) ORDER BY rowid DESC LIMIT 1", -1);
    long long mid = one_int(db, "SELECT (min(rowid) + max(rowid)) / 2 FROM requests", -1), at;
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT id FROM requests WHERE rowid >= %lld AND status = 'ok' ORDER BY rowid LIMIT 1", mid);
    d.middle = one_int(db, sql, -1);
    snprintf(sql, sizeof sql, "SELECT rowid FROM requests WHERE rowid >= %lld AND status = 'ok' ORDER BY rowid LIMIT 1", mid);
    at = one_int(db, sql, -1);
    snprintf(sql, sizeof sql, "SELECT worker FROM requests WHERE rowid = %lld", at);
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    snprintf(d.worker, sizeof d.worker, "%s", (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    d.slow = one_int(db, "SELECT broker_id FROM slow_requests WHERE status = 'ok' AND broker_id NOT IN"
                         " (SELECT broker_id FROM requests WHERE broker_id IS NOT NULL) ORDER BY t DESC LIMIT 1", -1);
    d.by_broker = d.slow >= 0 ? d.slow
                              : one_int(db, "SELECT broker_id FROM requests WHERE status = 'ok' ORDER BY rowid DESC"
                                            " LIMIT 1 OFFSET (SELECT count(*) / 4 FROM requests)", -1);
    d.since = (double)one_int(db, "SELECT CAST(max(t) AS INTEGER) - 3600 FROM requests", 0);
    sqlite3_close(db);
    ck_assert(d.newest > 0 && d.newest_ok > 0 && d.middle > 0 && d.by_broker > 0);
    return d;
}

/* The reports reelctl prints, each as its JSON text (JSON_SORT_KEYS),
 * into out[] (caller frees each): `why` of each of day_ids' requests
 * (the middle one also on its worker), then every other report. */
#define N_REPORTS 16
static void operator_commands(cat_t *c, char *out[N_REPORTS]) {
    day_ids_t d = day_ids();
    struct {
        const char *command;
        json_t *j;
    } r[N_REPORTS];
    int i = 0;
#define RUN(name, call) (running = name, r[i].command = name, r[i].j = (call), running = NULL, i++)
    RUN("why", cat_query_why(c, d.newest, NULL));
    RUN("why", cat_query_why(c, d.newest_ok, NULL));
    RUN("why", cat_query_why(c, d.middle, NULL));
    RUN("why", cat_query_why(c, d.middle, d.worker));
    RUN("why", cat_query_why(c, d.by_broker, NULL));
    RUN("requests", cat_query_requests(c));
    RUN("evictions", cat_query_evictions(c));
    RUN("stats", cat_query_stats(c)); /* and `reelctl metrics` */
    RUN("keys", cat_query_keys(c));
    RUN("versions", cat_query_versions_recent(c, 11)); /* the table asks one more than it shows */
    RUN("versions --all", cat_query_versions(c));
    RUN("workers", cat_query_workers(c));
    RUN("artifacts report", cat_query_artifacts(c));
    RUN("report", cat_query_report(c, 0));
    RUN("report --since", cat_query_report(c, d.since));
    RUN("report --since", cat_query_report(c, d.since + 1800));
#undef RUN
    ck_assert_int_eq(i, N_REPORTS);
    for (i = 0; i < N_REPORTS; i++) {
        ck_assert_msg(r[i].j != NULL, "%s: %s", r[i].command, reel_err_text());
        out[i] = json_dumps(r[i].j, JSON_SORT_KEYS | JSON_COMPACT);
        ck_assert_ptr_nonnull(out[i]);
        json_decref(r[i].j);
    }
    /* a why of a request only the slowest requests still hold, after retention */
    if (d.slow >= 0) ck_assert_msg(strstr(out[4], "\"source\":\"slow_requests\""), "%.2000s", out[4]);
}

static void free_reports(char *out[N_REPORTS]) {
    for (int i = 0; i < N_REPORTS; i++) free(out[i]);
}

/* The day written (its statements recorded as "writer"), the broker's
 * reads at start ("broker start") and retention after the day
 * ("prune"). */
static void write_day_traced(int n) {
    cat_t *c = cat_open(dbpath, false); /* the migrations of a new catalog: not the writer's work */
    TS_NEW(c);
    cat_close(&c);
    running = "writer";
    write_day(n);
    running = NULL;
    c = cat_open(dbpath, false);
    TS_NEW(c);
    cat_version_t v[8];
    running = "broker start";
    ck_assert_int_ge(cat_pending_versions(c, v, 8), 0);
    ck_assert_int_ge(cat_interrupted_versions(c, v, 8), 0);
    ck_assert_int_ge(cat_current_versions(c, v, 8), 1);
    ck_assert_int_ge(cat_current_bases(c, v, 8), 0);
    /* a worker's new process: the graphs its old one held, recorded evicted */
    running = "writer";
    TS_OK(cat_worker_seen(c, "w1", "cpu", "x", 1, 1 << 30, "b1", DAY_T0 + n / DAY_RATE + 1));
    running = NULL;
    cat_close(&c);
}

/* ---- plans ------------------------------------------------------------------ */

/* Tables that grow with traffic or with time (never with the number of
 * workers or artifacts alone). */
static const char *const growing[] = { "requests", "captures", "evictions", "slow_requests", "audit",
                                       "weight_versions", "worker_versions", "declines", "key_texts",
                                       "rollups", "key_totals", "timeline", "eviction_hours" };

/* The reads of a growing table that are meant: bounded by a LIMIT or a
 * batch, or the whole table being what the report shows. A plan line of
 * `command` on `table` whose statement holds `sql` is one of them. */
static const struct {
    const char *command, *table, *sql, *why;
} expected[] = {
    { "requests", "requests", "ORDER BY rowid DESC LIMIT", "the 50 newest, backwards by rowid" },
    { "evictions", "evictions", "ORDER BY t DESC, id DESC LIMIT", "the 50 newest, backwards by evictions_by_time" },
    { "report", "requests", "ORDER BY rowid LIMIT 1", "the first row, by rowid" },
    { "report", "slow_requests", "WHERE t >= 0 ORDER BY seconds DESC LIMIT 20",
      "the 20 slowest of all time, backwards by slow_requests_by_seconds" },
    { "report", "requests", "FROM requests WHERE t >=", "raw rows while they are at most REPORT_RAW_MAX" },
    { "report", "captures", "FROM captures", "raw rows while the requests are at most REPORT_RAW_MAX" },
    { "report", "declines", "FROM declines", "declines by reason over all time: the report's own" },
    { "report", "key_totals", "FROM key_totals", "every key's totals: the report's own" },
    { "report", "captures", "origin = 'prewarm'", "the prewarm captures alone (captures_prewarms)" },
    { "report --since", "requests", "ORDER BY rowid LIMIT 1", "the first row, by rowid" },
    { "report --since", "requests", "FROM requests WHERE t >=", "raw rows while they are at most REPORT_RAW_MAX" },
    { "report --since", "captures", "FROM captures", "raw rows while the requests are at most REPORT_RAW_MAX" },
    { "report --since", "declines", "FROM declines", "declines over all time: the report's own" },
    { "report --since", "rollups", "FROM rollups WHERE hour >=",
      "by primary key order for the GROUP BY: 1.3-1.5x faster than rollups_by_hour at a day's size" },
    { "report --since", "captures", "origin = 'prewarm'", "the prewarm captures alone (captures_prewarms)" },
    { "stats", "key_totals", "FROM key_totals", "every key's totals summed per worker: the report's own" },
    { "stats", "declines", "FROM declines", "every decline counter summed per worker: the report's own" },
    { "keys", "key_totals", "FROM key_totals", "every key: the report's own" },
    { "keys", "declines", "FROM declines", "every key's declines: the report's own" },
    { "keys", "captures", "origin = 'prewarm'", "the prewarm captures alone (captures_prewarms)" },
    { "versions --all", "weight_versions", "FROM weight_versions", "every version: the report's own" },
    { "prune", "requests", "ORDER BY rowid LIMIT ?1", "the oldest rows, one batch" },
    { "prune", "captures", "ORDER BY rowid LIMIT ?1", "the oldest rows, one batch" },
    { "writer", "captures", "WITH last AS", "a restarted worker's every graph, once a restart" },
    { "writer", "evictions", "WITH last AS", "a restarted worker's every graph, once a restart" },
};

static bool is_growing(const char *table) {
    for (size_t i = 0; i < sizeof growing / sizeof *growing; i++)
        if (!strcmp(growing[i], table)) return true;
    return false;
}

static bool is_word(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_'; }

/* The table `name` (a plan line's: a table, an alias or a CTE) stands for
 * in sql: "FROM requests q" makes q requests. name itself when no alias
 * names it. */
static void table_of(const char *sql, const char *name, char *table, size_t len) {
    snprintf(table, len, "%s", name);
    static const char *const intro[] = { "FROM ", "JOIN " };
    for (size_t k = 0; k < 2; k++)
        for (const char *p = sql; (p = strstr(p, intro[k])); p++) {
            const char *a = p + 5, *b = a;
            while (is_word(*b)) b++;
            if (b == a || *b != ' ') continue;
            const char *x = b + 1;
            if (!strncmp(x, "AS ", 3)) x += 3;
            const char *y = x;
            while (is_word(*y)) y++;
            if ((size_t)(y - x) == strlen(name) && !strncmp(x, name, strlen(name)) && (size_t)(b - a) < len) {
                snprintf(table, len, "%.*s", (int)(b - a), a);
                return;
            }
        }
}

/* What is wrong with one plan line of sql, or NULL: a SCAN of a growing
 * table, an automatic index built over one (a scan too), or a SEARCH of
 * one by its worker alone (every row the worker ever had). */
static const char *wrong(const char *sql, const char *line, char *table, size_t len) {
    char name[64];
    bool scan = !strncmp(line, "SCAN ", 5), search = !strncmp(line, "SEARCH ", 7);
    if (!scan && !search) return NULL;
    if (sscanf(line + (scan ? 5 : 7), "%63s", name) != 1) return NULL;
    table_of(sql, name, table, len);
    if (!is_growing(table)) return NULL;
    if (scan) return "scans it";
    if (strstr(line, "AUTOMATIC")) return "builds an automatic index over it (a scan)";
    const char *k = strrchr(line, '(');
    if (k && !strcmp(k, "(worker=?)")) return "reads every row of the worker";
    return NULL;
}

static bool is_expected(const char *command, const char *table, const char *sql) {
    for (size_t i = 0; i < sizeof expected / sizeof *expected; i++)
        if (!strcmp(expected[i].command, command) && !strcmp(expected[i].table, table) && strstr(sql, expected[i].sql))
            return true;
    return false;
}

/* Every recorded statement's plan, on a connection of the test's own; the
 * lines that break the rule (and are not expected) as one text, "" when
 * none; *commands_seen: the distinct commands recorded. Caller frees. */
static char *plan_faults(int *n_statements) {
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(out);
    *n_statements = 0;
    for (int i = 0; i < n_seen; i++) {
        char *q = sqlite3_mprintf("EXPLAIN QUERY PLAN %s", seen[i].sql);
        sqlite3_stmt *e = NULL;
        int rc = sqlite3_prepare_v2(db, q, -1, &e, NULL);
        sqlite3_free(q);
        if (rc != SQLITE_OK) { /* BEGIN, COMMIT, PRAGMA and the like: no plan */
            sqlite3_finalize(e);
            continue;
        }
        (*n_statements)++;
        while (sqlite3_step(e) == SQLITE_ROW) {
            const char *line = (const char *)sqlite3_column_text(e, 3), *what;
            char table[64];
            if (line && (what = wrong(seen[i].sql, line, table, sizeof table)) &&
                !is_expected(seen[i].command, table, seen[i].sql))
                fprintf(out, "%s: %s %s (\"%s\") in: %.400s\n", seen[i].command, line, what, table, seen[i].sql);
        }
        sqlite3_finalize(e);
    }
    fclose(out);
    sqlite3_close(db);
    return buf;
}

/* Whether a statement of `command` was recorded. */
static bool recorded(const char *command) {
    for (int i = 0; i < n_seen; i++)
        if (!strcmp(seen[i].command, command)) return true;
    return false;
}

/* The day, its retention and every operator command before and after it,
 * their statements recorded. */
static void busy_day_with_every_command(void) {
    trace_on();
    write_day_traced(3000);
    char *out[N_REPORTS];
    cat_t *c = cat_open(dbpath, true);
    TS_NEW(c);
    operator_commands(c, out); /* the raw requests: the report reads them */
    free_reports(out);
    cat_close(&c);
    c = cat_open(dbpath, false);
    TS_NEW(c);
    running = "prune";
    ck_assert_int_gt(cat_prune(c, 0, 1000, 2000), 0); /* the report reads the summaries now */
    running = NULL;
    cat_close(&c);
    c = cat_open(dbpath, true);
    TS_NEW(c);
    operator_commands(c, out);
    free_reports(out);
    cat_close(&c);
}

/* ---- tests ------------------------------------------------------------------ */

/* Every plan of every operator command and of the writer seeks by a key
 * or reads a bounded range; the commands are all there. */
START_TEST(test_no_operator_or_writer_query_scans_a_growing_table_it_has_a_key_for) {
    busy_day_with_every_command();
    static const char *const commands[] = { "why", "requests", "evictions", "stats", "keys", "versions",
                                            "versions --all", "workers", "artifacts report", "report",
                                            "report --since", "writer", "broker start", "prune" };
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        ck_assert_msg(recorded(commands[i]), "no statement of %s was recorded", commands[i]);
    int n = 0;
    char *faults = plan_faults(&n);
    ck_assert_int_gt(n, 50);
    if (*faults) fprintf(stderr, "%s", faults); /* all of them; the message holds the first few */
    ck_assert_msg(!*faults, "plans that scan a growing table or a worker's every row:\n%.2000s", faults);
    free(faults);
    forget_seen();
}
END_TEST

/* The check above can fail: without schema 18's indexes `reelctl why`
 * reads whole tables again (requests by id, the lineage by worker), and
 * the check names each such plan. */
START_TEST(test_why_without_the_schema_18_indexes_fails_the_plan_check) {
    trace_on();
    write_day(600);
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    for (const char *m = cat_migrations[17]; (m = strstr(m, "CREATE INDEX IF NOT EXISTS "));) {
        m += strlen("CREATE INDEX IF NOT EXISTS ");
        char sql[128];
        snprintf(sql, sizeof sql, "DROP INDEX %.*s", (int)strcspn(m, " "), m);
        ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    }
    sqlite3_close(db);
    cat_t *c = cat_open(dbpath, true);
    TS_NEW(c);
    running = "why";
    json_t *j = cat_query_why(c, 120, NULL);
    running = NULL;
    ck_assert_msg(j != NULL, "%s", reel_err_text());
    json_decref(j);
    cat_close(&c);
    int n = 0;
    char *faults = plan_faults(&n);
    ck_assert_msg(strstr(faults, "why: SCAN requests scans it"), "faults: %.2000s", faults);
    ck_assert_msg(strstr(faults, "(\"captures\")") && strstr(faults, "(\"evictions\")"), "faults: %.2000s", faults);
    free(faults);
    forget_seen();
}
END_TEST

/* The one integer sql answers. */
static long long count_of(sqlite3 *db, const char *sql) {
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    ck_assert_msg(sqlite3_step(s) == SQLITE_ROW, "%s: %s", sql, sqlite3_errmsg(db));
    long long v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* The tables of a catalog and their row counts, as one text. */
static char *table_counts(sqlite3 *db) {
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name", -1,
                                        &s, NULL),
                     SQLITE_OK);
    while (sqlite3_step(s) == SQLITE_ROW) {
        char *q = sqlite3_mprintf("SELECT count(*) FROM \"%w\"", (const char *)sqlite3_column_text(s, 0));
        sqlite3_stmt *n = NULL;
        ck_assert_int_eq(sqlite3_prepare_v2(db, q, -1, &n, NULL), SQLITE_OK);
        ck_assert_int_eq(sqlite3_step(n), SQLITE_ROW);
        fprintf(out, "%s %lld\n", sqlite3_column_text(s, 0), (long long)sqlite3_column_int64(n, 0));
        sqlite3_finalize(n);
        sqlite3_free(q);
    }
    sqlite3_finalize(s);
    fclose(out);
    return buf;
}

/* A catalog the build before schema 18 made (the migrations 1 to 17 as
 * they shipped, a day's rows in them) is migrated in place by the first
 * writer that opens it: the indexes built over its rows, every row kept,
 * every report the same as on a catalog written at schema 18, and `why`
 * seeking by them at once. */
START_TEST(test_a_schema_17_catalog_upgrades_in_place_keeps_its_rows_and_reports_the_same) {
    const int n = 1200;
    write_day(n); /* the day at schema 18, at dbpath: what the reports must read */
    char today[PATH_MAX], old[PATH_MAX];
    snprintf(today, sizeof today, "%s", dbpath);
    snprintf(old, sizeof old, "%s/schema17.db", tmpdir);
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(old, &db), SQLITE_OK);
    for (int i = 0; i < 17; i++)
        ck_assert_msg(sqlite3_exec(db, cat_migrations[i], NULL, NULL, NULL) == SQLITE_OK, "migration %d: %s", i + 1,
                      sqlite3_errmsg(db));
    ck_assert_int_eq(sqlite3_exec(db, "PRAGMA user_version = 17", NULL, NULL, NULL), SQLITE_OK);
    /* the day's rows, column by column (the two schemas' tables are the same) */
    char *attach = sqlite3_mprintf("ATTACH DATABASE %Q AS day", today);
    ck_assert_int_eq(sqlite3_exec(db, attach, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_free(attach);
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT name FROM main.sqlite_master WHERE type = 'table'", -1, &s, NULL),
                     SQLITE_OK);
    while (sqlite3_step(s) == SQLITE_ROW) {
        char *q = sqlite3_mprintf("INSERT INTO main.\"%w\" SELECT * FROM day.\"%w\"", sqlite3_column_text(s, 0),
                                  sqlite3_column_text(s, 0));
        ck_assert_msg(sqlite3_exec(db, q, NULL, NULL, NULL) == SQLITE_OK, "%s: %s", q, sqlite3_errmsg(db));
        sqlite3_free(q);
    }
    sqlite3_finalize(s);
    ck_assert_int_eq(sqlite3_exec(db, "DETACH DATABASE day", NULL, NULL, NULL), SQLITE_OK);
    char *before = table_counts(db);
    ck_assert_int_eq(count_of(db, "SELECT count(*) FROM sqlite_master WHERE name = 'requests_by_id'"), 0);
    ck_assert_int_gt(count_of(db, "SELECT count(*) FROM requests"), n - 1);
    sqlite3_close(db);

    /* the reports of the day as written at schema 18 */
    char *want[N_REPORTS], *got[N_REPORTS];
    cat_t *c = cat_open(today, true);
    TS_NEW(c);
    operator_commands(c, want);
    cat_close(&c);

    snprintf(dbpath, sizeof dbpath, "%s", old);
    c = cat_open(dbpath, true); /* a reader does not migrate: the broker does */
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(reel_err_text(), "schema 17 is older"), "%s", reel_err_text());
    c = cat_open(dbpath, false);
    TS_NEW(c);
    cat_close(&c);
    ck_assert_int_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    ck_assert_int_eq(count_of(db, "PRAGMA user_version"), 18);
    int indexes = 0;
    for (const char *m = cat_migrations[17]; (m = strstr(m, "CREATE INDEX IF NOT EXISTS ")); indexes++) {
        m += strlen("CREATE INDEX IF NOT EXISTS ");
        char *q = sqlite3_mprintf("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = '%.*q'",
                                  (int)strcspn(m, " "), m);
        ck_assert_msg(count_of(db, q) == 1, "%s", q);
        sqlite3_free(q);
    }
    ck_assert_int_eq(indexes, 9);
    char *after = table_counts(db);
    sqlite3_close(db);
    ck_assert_str_eq(after, before);

    trace_on();
    c = cat_open(dbpath, true);
    TS_NEW(c);
    operator_commands(c, got);
    cat_close(&c);
    for (int i = 0; i < N_REPORTS; i++) ck_assert_msg(!strcmp(got[i], want[i]), "report %d differs:\n%.1500s\nvs\n%.1500s", i, got[i], want[i]);
    int k = 0;
    char *faults = plan_faults(&k);
    if (*faults) fprintf(stderr, "%s", faults);
    ck_assert_msg(!*faults, "plans after the upgrade:\n%.2000s", faults);
    free(faults);
    forget_seen();
    free_reports(want);
    free_reports(got);
    free(before);
    free(after);
}
END_TEST

/* The indexes change how rows are found, never which: every report reads
 * the same day the same with schema 18's indexes and without them. */
START_TEST(test_every_report_reads_the_same_with_and_without_the_schema_18_indexes) {
    const int n = 1500;
    write_day(n);
    char *with[N_REPORTS], *without[N_REPORTS];
    cat_t *c = cat_open(dbpath, true);
    TS_NEW(c);
    operator_commands(c, with);
    cat_close(&c);
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    int dropped = 0;
    for (const char *m = cat_migrations[17]; (m = strstr(m, "CREATE INDEX IF NOT EXISTS ")); dropped++) {
        m += strlen("CREATE INDEX IF NOT EXISTS ");
        char sql[128];
        snprintf(sql, sizeof sql, "DROP INDEX %.*s", (int)strcspn(m, " "), m);
        ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    }
    sqlite3_close(db);
    ck_assert_int_eq(dropped, 9);
    c = cat_open(dbpath, true);
    TS_NEW(c);
    operator_commands(c, without);
    cat_close(&c);
    for (int i = 0; i < N_REPORTS; i++)
        ck_assert_msg(!strcmp(with[i], without[i]), "report %d differs:\n%.1500s\nvs\n%.1500s", i, with[i], without[i]);
    /* and the day is not empty where it matters: why of the newest ok request found a history */
    ck_assert_msg(strstr(with[1], "\"evictions\":[{") != NULL, "%.2000s", with[1]);
    free_reports(with);
    free_reports(without);
}
END_TEST

static Suite *plans_suite(void) {
    Suite *s = suite_create("catalog_plans");
    TCase *tc = tcase_create("catalog_plans");
    tcase_add_checked_fixture(tc, make_tmpdir, remove_tmpdir);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_no_operator_or_writer_query_scans_a_growing_table_it_has_a_key_for);
    tcase_add_test(tc, test_why_without_the_schema_18_indexes_fails_the_plan_check);
    tcase_add_test(tc, test_a_schema_17_catalog_upgrades_in_place_keeps_its_rows_and_reports_the_same);
    tcase_add_test(tc, test_every_report_reads_the_same_with_and_without_the_schema_18_indexes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ts_run(plans_suite()); }
