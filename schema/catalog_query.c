/* catalog_query.c -- the report queries (see catalog_query.h): each report
 * is built as JSON from SQL, inside one read transaction so its totals add
 * up. Drawing them (tables, JSON text, Prometheus text) is reelctl's job
 * (ctl/report.c).
 *
 * Hit rate, per worker and overall: replayed steps / all steps of the
 * finished requests (requests table). Where there are no requests it falls
 * back to replays / (replays + captures + declines) from the capture and
 * decline counters; "hit_rate_from" says which ("requests", "captures", or
 * null with hit_rate null when there is nothing to divide by). Eager breaks
 * are declines for "not_capturable" and "override". */
#include "schema/catalog_query.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/error.h"
#include "schema/catalog_impl.h"

#define CAT_RECENT_LIMIT 50
#define CAT_STR_(x) #x
#define CAT_STR(x) CAT_STR_(x)

static sqlite3_stmt *reader(cat_t *c, const char *sql) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK) {
        cat_db_fail(c, "prepare report");
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
        cat_db_fail(c, "report query");
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
            if (json_is_string(v)) b |= cat_bind_text(s, k + 1, json_string_value(v));
            else if (json_is_integer(v)) b |= sqlite3_bind_int64(s, k + 1, json_integer_value(v));
            else b |= sqlite3_bind_null(s, k + 1);
        }
        json_t *got = b == SQLITE_OK ? collect(c, s, mode) : NULL;
        if (b != SQLITE_OK) cat_db_fail(c, "bind report query");
        if (!got || json_object_set_new(row, field, got) != 0) {
            ret = -1;
            break;
        }
    }
    sqlite3_finalize(s);
    return ret;
}

typedef json_t *(*build_fn)(cat_t *c);

/* Builds a report inside one read transaction, so that the totals of one
 * report agree with each other. On the writer's connection inside a batch
 * it reads the batch as it stands. NULL with a message on failure. */
static json_t *snapshot(cat_t *c, build_fn build) {
    bool own_txn = sqlite3_get_autocommit(c->db);
    if (own_txn && cat_exec(c, "BEGIN", "begin report") != 0) return NULL;
    json_t *root = build(c);
    if (own_txn) sqlite3_exec(c->db, root ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
    return root;
}

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
        if (cat_bind_text(q[i], 1, worker) != SQLITE_OK) return cat_db_fail(c, "bind stats");
    json_t *rows = collect(c, q[0], 'o');
    if (!rows) return -1;
    json_t *s = json_incref(json_array_get(rows, 0));
    json_decref(rows);
    if (!s) return cat_db_fail(c, "stats");
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

/* Per artifact id (docs/ARTIFACTS.md): the bundle as last reported and its
 * kernel keys summed over every worker; speedup is the mean of the keys'
 * speedups weighted by their timed calls (0 when none was timed), and its
 * spread: speedup_sd pooled over every timed call (from each key's mean,
 * sd and count: pool_spread), speedup_min/max the extremes of the keys'
 * speedups; sync_timed/sync_ms: --artifact-timing sync, the launches timed
 * alone and their mean in ms. */
static const char artifact_totals_sql[] =
    "SELECT a.id AS id, a.version AS version, a.op AS op, a.backend AS backend,"
    " a.status AS status, a.verified AS verified, a.enabled AS enabled, a.sha256 AS sha256,"
    " a.reason AS reason, a.first_seen AS first_seen, a.last_seen AS last_seen,"
    " count(k.key) AS keys, coalesce(sum(k.state = 'promoted'), 0) AS promoted,"
    " coalesce(sum(k.state = 'demoted'), 0) AS demoted, coalesce(sum(k.calls), 0) AS calls,"
    " coalesce(sum(k.native_calls), 0) AS native_calls,"
    " coalesce(sum(k.parity_pass), 0) AS parity_pass, coalesce(sum(k.parity_fail), 0) AS parity_fail,"
    " coalesce(sum(k.fallbacks), 0) AS fallbacks, coalesce(sum(k.timed), 0) AS timed,"
    " CASE WHEN sum(k.timed) > 0 THEN sum(k.speedup * k.timed) / sum(k.timed) ELSE 0.0 END AS speedup,"
    " coalesce(sum(CASE WHEN k.timed > 1 THEN (k.timed - 1) * k.speedup_sd * k.speedup_sd END), 0.0) AS _ss_within,"
    " coalesce(sum(k.timed * k.speedup * k.speedup), 0.0) AS _ss_means,"
    " coalesce(min(CASE WHEN k.timed > 0 THEN k.speedup END), 0.0) AS speedup_min,"
    " coalesce(max(CASE WHEN k.timed > 0 THEN k.speedup END), 0.0) AS speedup_max,"
    " coalesce(sum(k.sync_timed), 0) AS sync_timed,"
    " CASE WHEN sum(k.sync_timed) > 0 THEN 1000.0 * sum(k.sync_s) / sum(k.sync_timed) ELSE 0.0 END AS sync_ms"
    " FROM artifacts a LEFT JOIN artifact_keys k ON k.id = a.id GROUP BY a.id ORDER BY a.id";

/* speedup_sd of each artifact_totals_sql row, pooled from its keys:
 * Σ(n-1)s² within keys plus Σn·m² - N·M² between them, over N - 1; the
 * helper sums are removed. */
static void pool_spread(json_t *arts) {
    size_t i;
    json_t *r;
    json_array_foreach(arts, i, r) {
        double n = (double)json_integer_value(json_object_get(r, "timed"));
        double m = json_number_value(json_object_get(r, "speedup"));
        double ss = json_number_value(json_object_get(r, "_ss_within")) +
                    json_number_value(json_object_get(r, "_ss_means")) - n * m * m;
        double sd = n > 1 && ss > 0 ? sqrt(ss / (n - 1)) : 0;
        json_object_del(r, "_ss_within");
        json_object_del(r, "_ss_means");
        json_object_set_new(r, "speedup_sd", json_real(sd));
    }
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
    json_t *arts = query_rows(c, artifact_totals_sql); /* docs/ARTIFACTS.md */
    if (!arts) goto done;
    pool_spread(arts);
    root = json_pack("{s:o, s:O, s:o}", "overall", overall, "workers", workers, "artifacts", arts);
    overall = NULL;
    if (!root) kern_fail("catalog %s: report: out of memory", c->path);
done:
    for (int k = 0; k < 3; k++) sqlite3_finalize(q[k]);
    json_decref(workers);
    json_decref(overall);
    return root;
}

/* artifacts: {"artifacts": [totals per id], "keys": [every (worker, id,
 * key) row]}. */
static json_t *build_artifacts(cat_t *c) {
    json_t *arts = query_rows(c, artifact_totals_sql), *keys = NULL, *root = NULL;
    if (arts) {
        pool_spread(arts);
        keys = query_rows(c, "SELECT worker, id, key, state, reason, calls, native_calls,"
                             " parity_pass, parity_fail, fallbacks, timed, speedup, speedup_sd, sync_timed,"
                             " CASE WHEN sync_timed > 0 THEN 1000.0 * sync_s / sync_timed ELSE 0.0 END AS sync_ms, t"
                             " FROM artifact_keys ORDER BY id, worker, key");
    }
    if (arts && keys && !(root = json_pack("{s:O, s:O}", "artifacts", arts, "keys", keys)))
        kern_fail("catalog %s: report: out of memory", c->path);
    json_decref(arts);
    json_decref(keys);
    return root;
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

static json_t *build_evictions(cat_t *c) {
    return query_rows(c,
        "SELECT t, worker, reason, component, from_version, to_version, key_hash, key_text"
        " FROM evictions ORDER BY t DESC, id DESC LIMIT " CAT_STR(CAT_RECENT_LIMIT));
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

static json_t *build_requests(cat_t *c) {
    return query_rows(c,
        "SELECT t, id, worker, version, steps, captured, replayed, eager, seconds, status, key_hash"
        " FROM requests ORDER BY rowid DESC LIMIT " CAT_STR(CAT_RECENT_LIMIT));
}

/* report: what `reelctl report --html` draws (ctl/report_html.c), from
 * rows at or after report_since: the time range, a timeline of REPORT_BUCKETS
 * buckets (requests, their steps and replayed steps), the weight syncs
 * with the captures and evictions between each and the next, declines by
 * reason, the stats, the keys, the workers, and the slowest requests.
 * report_since is set by cat_query_report for the build below (reelctl is
 * one thread). */
#define REPORT_BUCKETS 60
static double report_since;

static json_t *build_report(cat_t *c) {
    char sql[1600];
    double since = report_since;
    snprintf(sql, sizeof sql,
             "SELECT coalesce(min(t), 0) AS t0, coalesce(max(t), 0) AS t1, count(*) AS requests FROM requests"
             " WHERE t >= %.17g", since);
    json_t *range = query_rows(c, sql), *root = NULL;
    if (!range) return NULL;
    json_t *r0 = json_array_get(range, 0);
    double t0 = json_number_value(json_object_get(r0, "t0")), t1 = json_number_value(json_object_get(r0, "t1"));
    double w = t1 > t0 ? (t1 - t0) / REPORT_BUCKETS : 1;
    snprintf(sql, sizeof sql,
             "SELECT min(CAST((t - %.17g) / %.17g AS INTEGER), %d) AS bucket, count(*) AS requests,"
             " coalesce(sum(replayed), 0) AS replayed, coalesce(sum(captured + replayed + eager), 0) AS steps,"
             " coalesce(sum(status <> 'ok'), 0) AS failed"
             " FROM requests WHERE t >= %.17g GROUP BY bucket ORDER BY bucket", t0, w, REPORT_BUCKETS - 1, since);
    json_t *timeline = query_rows(c, sql);
    snprintf(sql, sizeof sql,
             "SELECT w.component AS component, w.version AS version, w.t AS t, w.state AS state,"
             " (SELECT count(*) FROM captures c WHERE c.placeholder = 0 AND c.t >= w.t AND c.t < coalesce("
             "   (SELECT min(t) FROM weight_versions n WHERE n.t > w.t), 1e300)) AS captures,"
             " (SELECT count(*) FROM evictions e WHERE e.t >= w.t AND e.t < coalesce("
             "   (SELECT min(t) FROM weight_versions n WHERE n.t > w.t), 1e300)) AS evictions"
             " FROM weight_versions w WHERE w.t >= %.17g ORDER BY w.t", since);
    json_t *syncs = query_rows(c, sql);
    snprintf(sql, sizeof sql,
             "SELECT (SELECT count(*) FROM captures WHERE placeholder = 0 AND t >= %.17g AND t < coalesce("
             " (SELECT min(t) FROM weight_versions WHERE t >= %.17g), 1e300)) AS captures,"
             " (SELECT count(*) FROM evictions WHERE t >= %.17g AND t < coalesce("
             " (SELECT min(t) FROM weight_versions WHERE t >= %.17g), 1e300)) AS evictions",
             since, since, since, since);
    json_t *before = query_rows(c, sql);
    json_t *declines = query_rows(c, "SELECT reason, sum(count) AS count FROM declines GROUP BY reason"
                                     " ORDER BY count DESC, reason");
    snprintf(sql, sizeof sql,
             "SELECT t, id, worker, key_hash, version, steps, captured, replayed, eager, seconds, status"
             " FROM requests WHERE t >= %.17g ORDER BY seconds DESC LIMIT 20", since);
    json_t *slowest = query_rows(c, sql);
    json_t *stats = build_stats(c), *keys = build_keys(c), *workers = build_workers(c);
    if (timeline && syncs && before && declines && slowest && stats && keys && workers) {
        root = json_pack("{s:f, s:f, s:f, s:f, s:i, s:O, s:O, s:O, s:O, s:O, s:O, s:O, s:O, s:O}", "since", since,
                         "t0", t0, "t1", t1, "bucket_seconds", w, "buckets", REPORT_BUCKETS, "requests",
                         json_object_get(r0, "requests"), "timeline", timeline, "syncs", syncs, "before_first_sync",
                         json_array_get(before, 0), "declines", declines, "slowest", slowest, "stats", stats,
                         "keys", keys, "workers", workers);
        if (!root) kern_fail("catalog %s: report: out of memory", c->path);
    }
    json_decref(range);
    json_decref(timeline);
    json_decref(syncs);
    json_decref(before);
    json_decref(declines);
    json_decref(slowest);
    json_decref(stats);
    json_decref(keys);
    json_decref(workers);
    return root;
}

/* ---- the queries -------------------------------------------------------- */

json_t *cat_query_stats(cat_t *c) { return snapshot(c, build_stats); }
json_t *cat_query_keys(cat_t *c) { return snapshot(c, build_keys); }
json_t *cat_query_evictions(cat_t *c) { return snapshot(c, build_evictions); }
json_t *cat_query_versions(cat_t *c) { return snapshot(c, build_versions); }
json_t *cat_query_workers(cat_t *c) { return snapshot(c, build_workers); }
json_t *cat_query_requests(cat_t *c) { return snapshot(c, build_requests); }
json_t *cat_query_artifacts(cat_t *c) { return snapshot(c, build_artifacts); }
json_t *cat_query_report(cat_t *c, double since) {
    report_since = since;
    return snapshot(c, build_report);
}
