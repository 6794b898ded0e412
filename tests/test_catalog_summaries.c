/* test_catalog_summaries.c -- the catalog's summaries (schema 7: rollups,
 * key totals, eviction reasons, key texts, the timeline, each hour's
 * slowest requests) and the pruning of raw rows (cat_prune).
 *
 * The summaries are checked against the raw rows they summarise, with SQL
 * on a connection of the test's own, after a random workload written the
 * ways the broker writes (batches, some rolled back, single records, a
 * capture reported twice); the reports that read them are checked against
 * counts the workload kept itself. Pruning is checked to remove only what
 * is old or past the cap, a bounded number of rows per call, and to leave
 * every report's totals as they were. */
#include "catalog/catalog.h"
#include "catalog/catalog_query.h"
#include "base/error.h"

#include <check.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tests/support.h"

extern const char *const cat_migrations[];

static char tmpdir[64];
static char dbpath[PATH_MAX];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/reel_test_sum_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(dbpath, sizeof dbpath, "%s/reel.db", tmpdir);
}

static void remove_tmpdir(void) {
    if (tmpdir[0]) nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}


static cat_t *open_ok(bool readonly) {
    cat_t *c = cat_open(dbpath, readonly);
    ck_assert_msg(c != NULL, "cat_open: %s", reel_err_text());
    return c;
}

static sqlite3 *raw_open(void) {
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    return db;
}

static long long raw_int(sqlite3 *db, const char *sql) {
    sqlite3_stmt *s = NULL;
    ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    ck_assert_msg(sqlite3_step(s) == SQLITE_ROW, "%s: %s", sql, sqlite3_errmsg(db));
    long long v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

static void raw_exec(sqlite3 *db, const char *sql) {
    char *msg = NULL;
    ck_assert_msg(sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK, "%s: %s", sql, msg ? msg : "?");
}

/* Rows of query a not in query b, and of b not in a: 0 when they agree. */
static long long differ(sqlite3 *db, const char *a, const char *b) {
    char *sql = NULL;
    ck_assert_int_ge(asprintf(&sql, "SELECT (SELECT count(*) FROM (%s EXCEPT %s)) + (SELECT count(*) FROM (%s EXCEPT %s))",
                              a, b, b, a), 0);
    long long n = raw_int(db, sql);
    free(sql);
    return n;
}

static json_int_t jint(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "'%s' is not an integer", key);
    return json_integer_value(v);
}

/* ---- a random workload, and what it should sum to ------------------------------ */

#define NW 3
#define NK 4
#define NV 3

static const char *const workers[NW] = { "w0", "w1", "w2" };
static const char *const keys[NK] = { "00000000000000a0", "00000000000000a1", "00000000000000a2",
                                      "00000000000000a3" };

typedef struct {
    long long requests, captures, replays, evictions, steps, replayed;
} sums_t;

typedef struct {
    uint64_t rng;
    double t;
    uint64_t id;
    sums_t all, by_worker[NW];
    long long captures_at[NV + 1]; /* captures per version */
} load_t;

static uint64_t rnd(load_t *l) {
    l->rng = l->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return l->rng >> 33;
}

/* One record, written; counted in `into` (NULL: not counted, it will be
 * rolled back). */
static void one_record(cat_t *c, load_t *l, sums_t *into_w, sums_t *into_all, long long *cap_at) {
    int w = (int)(rnd(l) % NW), k = (int)(rnd(l) % NK);
    uint64_t v = 1 + rnd(l) % NV;
    l->t += (double)(rnd(l) % 20000) / 1000.0; /* about 10 s apart: hours go by */
    char text[64];
    snprintf(text, sizeof text, "dit step %s at %.3f", keys[k], l->t);
    int kind = (int)(rnd(l) % 10);
    if (kind < 5) {
        int steps = 4, cap = (int)(rnd(l) % 2), rep = steps - cap - (int)(rnd(l) % 2);
        double secs = 0.001 * (double)(rnd(l) % 100000) + 1e-7 * (double)(l->id % 1000);
        bool ok = rnd(l) % 10 != 0;
        TS_OK(cat_request(c, ++l->id, workers[w], keys[k], v, steps, cap, rep, steps - cap - rep, secs, ok ? "ok" : "timeout", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0,
                       l->t));
        if (into_w) {
            into_w[w].requests++, into_all->requests++;
            into_w[w].steps += steps, into_all->steps += steps;
            into_w[w].replayed += rep, into_all->replayed += rep;
        }
    } else if (kind < 7) {
        TS_OK(cat_capture(c, workers[w], text, keys[k], 0, 100, 10, 0.5, v, NULL, l->t));
        if (into_w) into_w[w].captures++, into_all->captures++, cap_at[v]++;
    } else if (kind < 9) {
        uint64_t n = 1 + rnd(l) % 5;
        TS_OK(cat_replays(c, workers[w], keys[k], 0, n, v, l->t));
        if (into_w) into_w[w].replays += (long long)n, into_all->replays += (long long)n;
    } else {
        bool sync = rnd(l) % 2;
        TS_OK(cat_eviction(c, workers[w], text, keys[k], 0, sync ? "weight_sync" : "lru", sync ? "transformer" : NULL,
                        sync ? v : 0, sync ? v + 1 : 0, v, l->t));
        if (into_w) into_w[w].evictions++, into_all->evictions++;
    }
}

/* Batches of 1..40 records (every 5th rolled back, so not counted), single
 * records outside a batch, and a capture reported twice. */
static void workload(cat_t *c, load_t *l, int batches) {
    for (int b = 0; b < batches; b++) {
        bool rollback = b % 5 == 4;
        if (b % 7 == 3) { /* a record of its own */
            one_record(c, l, l->by_worker, &l->all, l->captures_at);
            continue;
        }
        TS_OK(cat_begin(c));
        int n = 1 + (int)(rnd(l) % 40);
        sums_t junk_w[NW], junk;
        long long junk_cap[NV + 1];
        for (int i = 0; i < n; i++)
            one_record(c, l, rollback ? junk_w : l->by_worker, rollback ? &junk : &l->all,
                       rollback ? junk_cap : l->captures_at);
        if (rollback) TS_OK(cat_rollback(c));
        else TS_OK(cat_commit(c));
    }
    /* The same capture twice (a resent EVENTS): one capture. */
    l->t += 1;
    TS_OK(cat_capture(c, "w0", "dup", keys[0], 0, 1, 1, 0.1, 1, NULL, l->t));
    TS_OK(cat_capture(c, "w0", "dup", keys[0], 0, 1, 1, 0.1, 1, NULL, l->t));
    l->by_worker[0].captures++, l->all.captures++, l->captures_at[1]++;
}

/* Every summary against the raw rows it summarises. */
static void check_summaries_match_raw(sqlite3 *db) {
    /* Requests carry their version: the rollups match them exactly. */
    ck_assert_int_eq(differ(db,
        "SELECT worker, key_hash, version, CAST(t / 3600 AS INTEGER), count(*), sum(status <> 'ok'), sum(steps),"
        " sum(captured), sum(replayed), sum(eager), round(sum(seconds), 6), max(seconds) FROM requests GROUP BY 1, 2, 3, 4",
        "SELECT worker, key_hash, version, hour, requests, failed, steps, captured, replayed, eager, round(seconds, 6),"
        " seconds_max FROM rollups WHERE requests > 0"), 0);
    /* Captures and evictions per (worker, key, hour), over versions. */
    ck_assert_int_eq(differ(db,
        "SELECT worker, key_hash, CAST(t / 3600 AS INTEGER), count(*) FROM captures WHERE placeholder = 0 GROUP BY 1, 2, 3",
        "SELECT worker, key_hash, hour, sum(captures) FROM rollups GROUP BY 1, 2, 3 HAVING sum(captures) > 0"), 0);
    ck_assert_int_eq(differ(db,
        "SELECT worker, key_hash, CAST(t / 3600 AS INTEGER), count(*) FROM evictions GROUP BY 1, 2, 3",
        "SELECT worker, key_hash, hour, sum(evictions) FROM rollups GROUP BY 1, 2, 3 HAVING sum(evictions) > 0"), 0);
    /* Replays land on the capture row, not at their own hour: per (worker, key). */
    ck_assert_int_eq(differ(db,
        "SELECT worker, key_hash, sum(replay_count), max(last_replay) FROM captures GROUP BY 1, 2 HAVING sum(replay_count) > 0",
        "SELECT worker, key_hash, sum(replays), max(last_replay) FROM rollups GROUP BY 1, 2 HAVING sum(replays) > 0"), 0);
    /* key_totals are the rollups summed over version and hour. */
    ck_assert_int_eq(differ(db,
        "SELECT key_hash, worker, sum(requests), sum(failed), sum(steps), sum(captured), sum(replayed), sum(eager),"
        " round(sum(seconds), 6), max(seconds_max), sum(captures), sum(replays), max(last_replay), sum(evictions)"
        " FROM rollups GROUP BY 1, 2",
        "SELECT key_hash, worker, requests, failed, steps, captured, replayed, eager, round(seconds, 6), seconds_max,"
        " captures, replays, last_replay, evictions FROM key_totals"), 0);
    ck_assert_int_eq(differ(db, "SELECT worker, reason, count(*) FROM evictions GROUP BY 1, 2",
                            "SELECT worker, reason, count FROM eviction_reasons"), 0);
    /* The timeline per minute. */
    ck_assert_int_eq(differ(db,
        "SELECT CAST(t / 60 AS INTEGER), count(*), sum(status <> 'ok'), sum(captured + replayed + eager),"
        " sum(replayed) FROM requests GROUP BY 1",
        "SELECT minute, requests, failed, steps, replayed FROM timeline WHERE requests > 0"), 0);
    ck_assert_int_eq(differ(db, "SELECT CAST(t / 60 AS INTEGER), count(*) FROM captures WHERE placeholder = 0 GROUP BY 1",
                            "SELECT minute, captures FROM timeline WHERE captures > 0"), 0);
    ck_assert_int_eq(differ(db, "SELECT CAST(t / 60 AS INTEGER), count(*) FROM evictions GROUP BY 1",
                            "SELECT minute, evictions FROM timeline WHERE evictions > 0"), 0);
    /* Each hour's 20 slowest requests (the workload's durations differ). */
    ck_assert_int_eq(differ(db,
        "SELECT id, worker, seconds FROM (SELECT *, row_number() OVER (PARTITION BY CAST(t / 3600 AS INTEGER)"
        " ORDER BY seconds DESC) AS n FROM requests) WHERE n <= 20",
        "SELECT id, worker, seconds FROM slow_requests"), 0);
    /* The newest text of each key, from whichever table saw it last. */
    ck_assert_int_eq(differ(db,
        "SELECT key_hash, key_text FROM (SELECT key_hash, key_text, t, row_number() OVER (PARTITION BY key_hash"
        " ORDER BY t DESC) AS n FROM (SELECT key_hash, key_text, t FROM captures UNION ALL SELECT key_hash, key_text, t"
        " FROM evictions UNION ALL SELECT key_hash, key_text, last_t FROM declines) WHERE key_text <> '') WHERE n = 1",
        "SELECT key_hash, key_text FROM key_texts"), 0);
}

static void check_stats(cat_t *c, const load_t *l) {
    json_t *st = cat_query_stats(c);
    TS_NEW(st);
    const sums_t *want[NW + 1];
    json_t *got[NW + 1];
    for (int w = 0; w < NW; w++) {
        want[w] = &l->by_worker[w];
        got[w] = NULL;
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(st, "workers"), i, r)
            if (!strcmp(json_string_value(json_object_get(r, "worker")), workers[w])) got[w] = r;
        ck_assert_msg(got[w] != NULL, "no stats row for %s", workers[w]);
    }
    want[NW] = &l->all;
    got[NW] = json_object_get(st, "overall");
    for (int w = 0; w <= NW; w++) {
        ck_assert_int_eq(jint(got[w], "requests"), want[w]->requests);
        ck_assert_int_eq(jint(got[w], "captures"), want[w]->captures);
        ck_assert_int_eq(jint(got[w], "replays"), want[w]->replays);
        ck_assert_int_eq(jint(got[w], "evictions"), want[w]->evictions);
        ck_assert_int_eq(jint(got[w], "steps"), want[w]->steps);
        ck_assert_int_eq(jint(got[w], "replayed_steps"), want[w]->replayed);
        json_int_t by = 0;
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(got[w], "evictions_by_reason"), k, v) by += json_integer_value(v);
        ck_assert_int_eq(by, want[w]->evictions);
        double rate = json_number_value(json_object_get(got[w], "hit_rate"));
        if (want[w]->steps) ck_assert_double_eq_tol(rate, (double)want[w]->replayed / (double)want[w]->steps, 1e-12);
    }
    json_decref(st);
}

/* ---- tests ---------------------------------------------------------------------- */

/* The summaries agree with the raw rows after batches, rollbacks, single
 * records and a duplicate capture; the stats read from them agree with the
 * workload's own counts; the version of each capture is the one written. */
START_TEST(test_summaries_match_raw_rows_after_batches_rollbacks_and_a_duplicate_capture) {
    cat_t *c = open_ok(false);
    load_t l = { .rng = 12345, .t = 1.7e9 };
    workload(c, &l, 300);
    cat_close(&c);
    sqlite3 *db = raw_open();
    ck_assert_int_ge(raw_int(db, "SELECT count(DISTINCT hour) FROM rollups"), 3); /* hours did go by */
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM requests"), l.all.requests);
    check_summaries_match_raw(db);
    for (int v = 1; v <= NV; v++) {
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT coalesce(sum(captures), 0) FROM rollups WHERE version = %d", v);
        ck_assert_int_eq(raw_int(db, sql), l.captures_at[v]);
    }
    sqlite3_close(db);
    c = open_ok(true);
    check_stats(c, &l);
    cat_close(&c);
}
END_TEST

/* A report on the writer's connection inside a batch sees the batch's
 * summaries as they stand (as it sees its raw rows); a rollback then drops
 * both. */
START_TEST(test_report_inside_a_batch_sees_its_summaries_and_rollback_drops_them) {
    cat_t *c = open_ok(false);
    TS_OK(cat_request(c, 1, "w0", keys[0], 1, 4, 0, 4, 0, 0.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1.7e9));
    TS_OK(cat_begin(c));
    TS_OK(cat_request(c, 2, "w0", keys[0], 1, 4, 0, 4, 0, 0.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1.7e9 + 1));
    TS_OK(cat_capture(c, "w0", "t", keys[1], 0, 1, 1, 0.1, 1, NULL, 1.7e9 + 2));
    json_t *st = cat_query_stats(c);
    ck_assert_int_eq(jint(json_object_get(st, "overall"), "requests"), 2);
    ck_assert_int_eq(jint(json_object_get(st, "overall"), "captures"), 1);
    json_decref(st);
    TS_OK(cat_request(c, 3, "w0", keys[0], 1, 4, 0, 4, 0, 0.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1.7e9 + 3));
    TS_OK(cat_rollback(c));
    st = cat_query_stats(c);
    ck_assert_int_eq(jint(json_object_get(st, "overall"), "requests"), 1);
    ck_assert_int_eq(jint(json_object_get(st, "overall"), "captures"), 0);
    json_decref(st);
    cat_close(&c);
    sqlite3 *db = raw_open();
    check_summaries_match_raw(db);
    sqlite3_close(db);
}
END_TEST

/* Raw rows older than the cutoff go, a bounded number per call, until none
 * is left; newer rows, the summaries, versions, workers and the audit trail
 * stay, and every report reads the same totals as before. */
START_TEST(test_prune_by_age_removes_old_raw_rows_in_bounded_batches_and_reports_keep_totals) {
    cat_t *c = open_ok(false);
    load_t l = { .rng = 99, .t = 1.7e9 };
    workload(c, &l, 200);
    TS_OK(cat_weight_version(c, "transformer", 2, "aa", "/w/2", 1.7e9));
    TS_OK(cat_audit(c, "alice", "trainer", "sync", "transformer", 2, "aa", "/w/2", "accepted", 1.7e9));
    TS_OK(cat_worker_seen(c, "w0", "cpu", "x86", 1, 0, NULL, 1.7e9));
    json_t *before = cat_query_stats(c), *keys_before = cat_query_keys(c);
    double cutoff = 1.7e9 + (l.t - 1.7e9) / 2;
    sqlite3 *db = raw_open();
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM requests WHERE t < %.17g", cutoff);
    long long old_req = raw_int(db, sql);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM requests WHERE t >= %.17g", cutoff);
    long long new_req = raw_int(db, sql);
    ck_assert_int_gt(old_req, 100);
    int calls = 0;
    int64_t n, total = 0;
    while ((n = cat_prune(c, cutoff, 0, 25)) > 0) {
        ck_assert_int_le(n, 3 * 25); /* at most a batch per table */
        total += n;
        ck_assert_int_lt(++calls, 1000);
    }
    TS_OK(n);
    ck_assert_int_gt(calls, 4);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM requests WHERE t < %.17g", cutoff);
    ck_assert_int_eq(raw_int(db, sql), 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM requests WHERE t >= %.17g", cutoff);
    ck_assert_int_eq(raw_int(db, sql), new_req);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM captures WHERE t < %.17g", cutoff);
    ck_assert_int_eq(raw_int(db, sql), 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM evictions WHERE t < %.17g", cutoff);
    ck_assert_int_eq(raw_int(db, sql), 0);
    ck_assert_int_ge(total, old_req);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM audit"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM weight_versions"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM workers"), 1);
    sqlite3_close(db);
    json_t *after = cat_query_stats(c), *keys_after = cat_query_keys(c);
    ck_assert_msg(json_equal(json_object_get(before, "overall"), json_object_get(after, "overall")),
                  "stats changed by pruning");
    ck_assert_msg(json_equal(keys_before, keys_after), "keys changed by pruning");
    /* The report has lost its early raw rows: it reads the summaries. */
    json_t *r = cat_query_report(c, 0);
    TS_NEW(r);
    ck_assert_str_eq(json_string_value(json_object_get(r, "source")), "summaries");
    ck_assert_int_eq(jint(r, "requests"), l.all.requests);
    json_int_t in_buckets = 0;
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(r, "timeline"), i, b) in_buckets += jint(b, "requests");
    ck_assert_int_eq(in_buckets, l.all.requests);
    ck_assert_uint_eq(json_array_size(json_object_get(r, "slowest")), 20);
    json_decref(r);
    json_decref(before);
    json_decref(after);
    json_decref(keys_before);
    json_decref(keys_after);
    cat_close(&c);
}
END_TEST

/* With a row cap, each raw table keeps its newest max_rows rows. */
START_TEST(test_prune_by_row_cap_keeps_the_newest_rows_of_each_table) {
    cat_t *c = open_ok(false);
    TS_OK(cat_begin(c));
    for (int i = 0; i < 500; i++) {
        TS_OK(cat_request(c, (uint64_t)i, "w0", keys[i % NK], 1, 4, 0, 4, 0, 0.01 * i, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1.7e9 + i));
        TS_OK(cat_eviction(c, "w0", "t", keys[i % NK], 0, "lru", NULL, 0, 0, 1, 1.7e9 + i));
    }
    TS_OK(cat_commit(c));
    int64_t n;
    while ((n = cat_prune(c, 0, 120, 50)) > 0) ck_assert_int_le(n, 150);
    TS_OK(n);
    cat_close(&c);
    sqlite3 *db = raw_open();
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM requests"), 120);
    ck_assert_int_eq(raw_int(db, "SELECT min(id) FROM requests"), 380);
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM evictions"), 120);
    ck_assert_int_eq(raw_int(db, "SELECT CAST(min(t) - 1.7e9 AS INTEGER) FROM evictions"), 380);
    ck_assert_int_eq(raw_int(db, "SELECT sum(requests) FROM key_totals"), 500);
    ck_assert_int_eq(raw_int(db, "SELECT sum(count) FROM eviction_reasons"), 500);
    sqlite3_close(db);
    c = open_ok(true);
    ck_assert_int_eq(cat_prune(c, 1, 0, 10), -1); /* a read-only catalog is not pruned */
    ck_assert_ptr_nonnull(strstr(reel_err_text(), "read-only"));
    cat_close(&c);
}
END_TEST

/* A catalog written before schema 7 gets its summaries built from its raw
 * rows when it is opened for writing; the reports then read the same
 * totals the rows hold. */
START_TEST(test_migration_7_builds_the_summaries_of_an_older_catalog) {
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    for (int i = 0; i < 6; i++) raw_exec(db, cat_migrations[i]);
    raw_exec(db, "PRAGMA user_version = 6");
    raw_exec(db,
             "INSERT INTO requests (id, worker, key_hash, version, steps, captured, replayed, eager, seconds, status, t)"
             " VALUES (1, 'w0', 'k1', 3, 4, 1, 3, 0, 0.5, 'ok', 7200.5), (2, 'w0', 'k1', 3, 4, 0, 4, 0, 0.25, 'ok', 7260),"
             " (3, 'w1', 'k2', 3, 4, 0, 0, 4, 2.0, 'timeout', 10900);"
             "INSERT INTO captures (worker, stream, key_text, key_hash, replay_count, last_replay, placeholder, t)"
             " VALUES ('w0', 0, 'text k1', 'k1', 7, 7300, 0, 7200), ('w1', 0, NULL, 'k2', 2, 10950, 1, 10950);"
             "INSERT INTO evictions (worker, key_text, key_hash, reason, component, from_version, to_version, t)"
             " VALUES ('w0', 'text k1', 'k1', 'weight_sync', 'transformer', 3, 4, 11000);"
             "INSERT INTO worker_versions (worker, component, version, ok, error, t)"
             " VALUES ('w0', 'transformer', 3, 1, NULL, 1), ('w0', 'transformer', 4, 0, 'bad', 2),"
             " ('w1', 'transformer', 2, 1, NULL, 3);"
             "INSERT INTO declines (worker, key_hash, key_text, reason, count, last_t)"
             " VALUES ('w1', 'k3', 'text k3', 'not_capturable', 5, 11001);");
    sqlite3_close(db);
    cat_t *c = open_ok(false);
    cat_close(&c);
    db = raw_open();
    check_summaries_match_raw(db);
    ck_assert_int_eq(raw_int(db, "SELECT evictions FROM rollups WHERE version = 4"), 1); /* at its to_version */
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM key_texts WHERE key_hash = 'k3' AND key_text = 'text k3'"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT version FROM worker_applied WHERE worker = 'w0'"), 3);
    ck_assert_int_eq(raw_int(db, "SELECT version FROM worker_applied WHERE worker = 'w1'"), 2);
    sqlite3_close(db);
    c = open_ok(true);
    json_t *st = cat_query_stats(c);
    json_t *all = json_object_get(st, "overall");
    ck_assert_int_eq(jint(all, "requests"), 3);
    ck_assert_int_eq(jint(all, "captures"), 1);
    ck_assert_int_eq(jint(all, "replays"), 9);
    ck_assert_int_eq(jint(all, "evictions"), 1);
    ck_assert_int_eq(jint(all, "declines"), 5);
    ck_assert_int_eq(jint(all, "eager_breaks"), 5);
    ck_assert_double_eq_tol(json_number_value(json_object_get(all, "hit_rate")), 7.0 / 12.0, 1e-12);
    json_decref(st);
    json_t *k = cat_query_keys(c);
    ck_assert_uint_eq(json_array_size(k), 3);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(k, 0), "key_hash")), "k1");
    ck_assert_int_eq(jint(json_array_get(k, 0), "replays"), 7);
    json_decref(k);
    cat_close(&c);
}
END_TEST

/* The report's --since slices the stats and keys by the rollups' hours. */
START_TEST(test_report_since_counts_stats_and_keys_from_the_hours_in_range) {
    cat_t *c = open_ok(false);
    double h0 = 3600.0 * 500000;
    for (int i = 0; i < 6; i++) TS_OK(cat_request(c, (uint64_t)i, "w0", keys[0], 1, 4, 0, 4, 0, 0.1, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, h0 + 10 + i));
    TS_OK(cat_capture(c, "w0", "t0", keys[0], 0, 1, 1, 0.1, 1, NULL, h0 + 20));
    for (int i = 0; i < 4; i++)
        TS_OK(cat_request(c, (uint64_t)(10 + i), "w1", keys[1], 1, 4, 1, 3, 0, 0.1, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, h0 + 7200 + i));
    TS_OK(cat_capture(c, "w1", "t1", keys[1], 0, 1, 1, 0.1, 1, NULL, h0 + 7210));
    json_t *r = cat_query_report(c, h0 + 7200);
    TS_NEW(r);
    json_t *all = json_object_get(json_object_get(r, "stats"), "overall");
    ck_assert_int_eq(jint(all, "requests"), 4);
    ck_assert_int_eq(jint(all, "captures"), 1);
    ck_assert_uint_eq(json_array_size(json_object_get(r, "keys")), 1);
    json_decref(r);
    r = cat_query_report(c, 0);
    ck_assert_int_eq(jint(json_object_get(json_object_get(r, "stats"), "overall"), "requests"), 10);
    ck_assert_str_eq(json_string_value(json_object_get(r, "source")), "requests");
    json_decref(r);
    cat_close(&c);
}
END_TEST


/* The newest version each worker applied (worker_applied, what `reelctl
 * workers` reads) follows the outcomes as they come, out of order, and
 * falls back to the newest still applied when one turns failed; it always
 * equals the max over worker_versions. */
START_TEST(test_worker_applied_follows_outcomes_and_a_failed_version_gives_way) {
    cat_t *c = open_ok(false);
    sqlite3 *db = raw_open();
    const char *same = "SELECT count(*) FROM (SELECT worker, component, max(version) FROM worker_versions WHERE ok = 1"
                       " GROUP BY 1, 2 EXCEPT SELECT * FROM worker_applied)";
    const char *back = "SELECT count(*) FROM (SELECT * FROM worker_applied EXCEPT SELECT worker, component, max(version)"
                       " FROM worker_versions WHERE ok = 1 GROUP BY 1, 2)";
    struct { uint64_t v; bool ok; long long want; } steps[] = {
        { 1, true, 1 }, { 3, true, 3 }, { 2, true, 3 }, { 3, false, 2 }, { 3, true, 3 },
        { 2, false, 3 }, { 3, false, 1 }, { 1, false, -1 },
    };
    TS_OK(cat_worker_seen(c, "w0", "cpu", "x86", 1, 0, NULL, 1));
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        TS_OK(cat_worker_version(c, "w0", "transformer", steps[i].v, steps[i].ok, steps[i].ok ? NULL : "bad", 10.0 + i));
        TS_OK(cat_worker_version(c, "w1", "vae", 7, true, NULL, 10.0 + i)); /* another worker and component */
        ck_assert_int_eq(raw_int(db, same), 0);
        ck_assert_int_eq(raw_int(db, back), 0);
        json_t *w = cat_query_workers(c);
        json_t *v = json_object_get(json_object_get(json_array_get(w, 0), "versions"), "transformer");
        if (steps[i].want < 0) ck_assert_msg(v == NULL, "step %zu: a version where none is applied", i);
        else ck_assert_msg(json_integer_value(v) == steps[i].want, "step %zu: %lld, want %lld", i,
                           (long long)json_integer_value(v), steps[i].want);
        json_decref(w);
    }
    sqlite3_close(db);
    cat_close(&c);
}
END_TEST


/* A request without a key hash is stored (the column takes NULL) and
 * counted under the empty key. */
START_TEST(test_a_request_without_a_key_hash_is_stored_and_counted) {
    cat_t *c = open_ok(false);
    TS_OK(cat_request(c, 1, "w0", NULL, 1, 4, 0, 4, 0, 0.5, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, 1.7e9));
    json_t *st = cat_query_stats(c);
    ck_assert_int_eq(jint(json_object_get(st, "overall"), "requests"), 1);
    json_decref(st);
    cat_close(&c);
    sqlite3 *db = raw_open();
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM requests WHERE key_hash IS NULL"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT requests FROM key_totals WHERE key_hash = ''"), 1);
    sqlite3_close(db);
}
END_TEST

/* Graphs captured before the cutoff go from the raw table by age even
 * while they are still replayed (before, 2,000 such rows in front kept
 * every older row from being pruned); their later replays land on a
 * placeholder row and the summaries count every replay. */
START_TEST(test_prune_by_age_is_not_stopped_by_graphs_still_replayed) {
    cat_t *c = open_ok(false);
    char key[17];
    TS_OK(cat_begin(c));
    for (int i = 0; i < 3000; i++) { /* captured early, replayed until now */
        snprintf(key, sizeof key, "%016x", i);
        TS_OK(cat_capture(c, "w0", "t", key, 0, 1, 1, 0.1, 1, NULL, 1000.0 + i));
        TS_OK(cat_replays(c, "w0", key, 0, 2, 1, 9.0e5));
    }
    for (int i = 0; i < 5000; i++) { /* captured and evicted long ago */
        snprintf(key, sizeof key, "%016x", 100000 + i);
        TS_OK(cat_capture(c, "w1", "t", key, 0, 1, 1, 0.1, 1, NULL, 5000.0 + i));
    }
    TS_OK(cat_commit(c));
    int64_t n;
    while ((n = cat_prune(c, 8.0e5, 0, 2000)) > 0) {}
    TS_OK(n);
    sqlite3 *db = raw_open();
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures WHERE t < 8.0e5"), 0);
    TS_OK(cat_replays(c, "w0", "0000000000000000", 0, 3, 1, 9.5e5)); /* a graph still live */
    ck_assert_int_eq(raw_int(db, "SELECT count(*) FROM captures WHERE placeholder = 1"), 1);
    ck_assert_int_eq(raw_int(db, "SELECT sum(replays) FROM key_totals"), 3000 * 2 + 3);
    ck_assert_int_eq(raw_int(db, "SELECT sum(captures) FROM key_totals"), 8000);
    sqlite3_close(db);
    cat_close(&c);
}
END_TEST

/* The stats of a range count evictions, by reason too, from the summaries:
 * pruning the raw evictions does not change them. */
START_TEST(test_report_since_counts_evictions_from_the_summaries_after_pruning) {
    cat_t *c = open_ok(false);
    double h0 = 3600.0 * 500000;
    for (int i = 0; i < 10; i++) {
        TS_OK(cat_eviction(c, "w0", "t", keys[0], 0, i % 2 ? "lru" : "weight_sync", NULL, 0, 0, 1, h0 + 3600.0 * i));
        TS_OK(cat_request(c, (uint64_t)i, "w0", keys[0], 1, 4, 0, 4, 0, 0.1, "ok", 0.0, 0.0, 0, 0, 0, NULL, NULL, NULL, NAN, 0, h0 + 3600.0 * i + 1));
    }
    json_t *before = cat_query_report(c, h0 + 3600.0 * 4);
    json_t *all = json_object_get(json_object_get(before, "stats"), "overall");
    ck_assert_int_eq(jint(all, "evictions"), 6);
    ck_assert_int_eq(jint(json_object_get(all, "evictions_by_reason"), "lru"), 3);
    int64_t n;
    while ((n = cat_prune(c, h0 + 3600.0 * 8, 0, 3)) > 0) {}
    TS_OK(n);
    json_t *after = cat_query_report(c, h0 + 3600.0 * 4);
    ck_assert_msg(json_equal(json_object_get(before, "stats"), json_object_get(after, "stats")),
                  "the stats of the range changed when raw rows were pruned");
    json_decref(before);
    json_decref(after);
    cat_close(&c);
}
END_TEST

static Suite *summaries_suite(void) {
    Suite *s = suite_create("catalog_summaries");
    TCase *tc = tcase_create("summaries");
    tcase_add_checked_fixture(tc, make_tmpdir, remove_tmpdir);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_summaries_match_raw_rows_after_batches_rollbacks_and_a_duplicate_capture);
    tcase_add_test(tc, test_report_inside_a_batch_sees_its_summaries_and_rollback_drops_them);
    tcase_add_test(tc, test_prune_by_age_removes_old_raw_rows_in_bounded_batches_and_reports_keep_totals);
    tcase_add_test(tc, test_prune_by_row_cap_keeps_the_newest_rows_of_each_table);
    tcase_add_test(tc, test_migration_7_builds_the_summaries_of_an_older_catalog);
    tcase_add_test(tc, test_report_since_counts_stats_and_keys_from_the_hours_in_range);
    tcase_add_test(tc, test_worker_applied_follows_outcomes_and_a_failed_version_gives_way);
    tcase_add_test(tc, test_a_request_without_a_key_hash_is_stored_and_counted);
    tcase_add_test(tc, test_prune_by_age_is_not_stopped_by_graphs_still_replayed);
    tcase_add_test(tc, test_report_since_counts_evictions_from_the_summaries_after_pruning);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return ts_run(summaries_suite());
}
