/* catalog_query.c -- the report queries (see catalog_query.h): each report
 * is built as JSON from SQL, inside one read transaction so its totals add
 * up. Drawing them (tables, JSON text, Prometheus text) is reelctl's job
 * (ctl/report.c).
 *
 * Hit rate, per worker and overall: replayed steps / all steps of the
 * finished requests (requests table), both counted as they ran (captured +
 * replayed + eager: a group split into two parts runs each step twice,
 * the timeline's count too), so it never passes 1. Where there are no requests it falls
 * back to replays / (replays + captures + declines) from the capture and
 * decline counters; "hit_rate_from" says which ("requests", "captures", or
 * null with hit_rate null when there is nothing to divide by). Eager breaks
 * are declines for "not_capturable" and "override". */
#include "catalog/catalog_query.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "catalog/catalog_impl.h"

#define CAT_RECENT_LIMIT 50
#define CAT_STR_(x) #x
#define CAT_STR(x) CAT_STR_(x)

sqlite3_stmt *cat_q_reader(cat_t *c, const char *sql) {
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
    case SQLITE_FLOAT: { /* JSON holds no infinity (a corrupt or hostile catalog may): null, shown as "-" */
        double v = sqlite3_column_double(s, i);
        return isfinite(v) ? json_real(v) : json_null();
    }
    case SQLITE_TEXT:
    case SQLITE_BLOB: {
        const char *p = (const char *)sqlite3_column_text(s, i);
        return p ? json_text(p, (size_t)sqlite3_column_bytes(s, i)) : json_null();
    }
    default: return json_null();
    }
}

/* Steps s to the end (catalog_impl.h). */
json_t *cat_q_collect(cat_t *c, sqlite3_stmt *s, char mode) {
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
    reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", c->path);
    json_decref(all);
    sqlite3_reset(s);
    return NULL;
}

/* A whole query with no parameters, as an array of row objects. */
static json_t *query_rows(cat_t *c, const char *sql) {
    sqlite3_stmt *s = cat_q_reader(c, sql);
    if (!s) return NULL;
    json_t *rows = cat_q_collect(c, s, 'o');
    sqlite3_finalize(s);
    return rows;
}

/* Runs sub (bound to `key` of each row, as ?1 and, when key2 is set, ?2)
 * once per row of rows and stores what it collects as row[field]. */
static int attach(cat_t *c, json_t *rows, const char *sql, const char *key, const char *key2,
                  char mode, const char *field) {
    sqlite3_stmt *s = cat_q_reader(c, sql);
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
        json_t *got = b == SQLITE_OK ? cat_q_collect(c, s, mode) : NULL;
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
int cat_q_begin(cat_t *c, bool *own_txn) {
    *own_txn = sqlite3_get_autocommit(c->db);
    if (*own_txn) return cat_exec(c, "BEGIN", "begin report");
    /* Inside a batch: its summaries as they stand, too. */
    return cat_roll_flush(c);
}

void cat_q_end(cat_t *c, bool own_txn, bool ok) {
    if (own_txn) sqlite3_exec(c->db, ok ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
}

static json_t *snapshot(cat_t *c, build_fn build) {
    bool own_txn;
    if (cat_q_begin(c, &own_txn) != 0) return NULL;
    json_t *root = build(c);
    cat_q_end(c, own_txn, root != NULL);
    return root;
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

/* stats: {"overall": S, "workers": [S + {"worker"}]}, S = {requests,
 * captures, replays, steps, replayed_steps, eager_breaks, declines,
 * evictions, hit_rate, hit_rate_from, declines_by_reason,
 * evictions_by_reason}, from the summaries (never the raw rows): `totals`
 * is key_totals or rollups summed over a time range, `reasons` the
 * evictions per (worker, reason) of the same range; declines are their
 * counters over all time. */
#define STATS_SQL                                                                                  \
    "WITH t AS (SELECT worker, sum(requests) AS requests, sum(captures) AS captures,"              \
    " sum(replays) AS replays, sum(captured + replayed + eager) AS steps,"                          \
    " sum(replayed) AS replayed_steps FROM %s"                                                     \
    " GROUP BY worker),"                                                                           \
    " d AS (SELECT worker, sum(count) AS declines, sum(CASE WHEN reason IN ('not_capturable',"     \
    " 'override') THEN count ELSE 0 END) AS eager_breaks FROM declines GROUP BY worker),"          \
    " e AS (SELECT worker, sum(count) AS evictions FROM %s GROUP BY worker),"                      \
    " w AS (SELECT name AS worker FROM workers UNION SELECT worker FROM t UNION SELECT worker"     \
    " FROM d UNION SELECT worker FROM e)"                                                           \
    " SELECT w.worker AS worker, coalesce(t.requests, 0) AS requests,"                             \
    " coalesce(t.captures, 0) AS captures, coalesce(t.replays, 0) AS replays,"                     \
    " coalesce(t.steps, 0) AS steps, coalesce(t.replayed_steps, 0) AS replayed_steps,"             \
    " coalesce(d.eager_breaks, 0) AS eager_breaks, coalesce(d.declines, 0) AS declines,"           \
    " coalesce(e.evictions, 0) AS evictions FROM w LEFT JOIN t ON t.worker = w.worker"             \
    " LEFT JOIN d ON d.worker = w.worker LEFT JOIN e ON e.worker = w.worker ORDER BY w.worker"

static const char *const stats_counters[] = { "requests", "captures", "replays", "steps", "replayed_steps",
                                              "eager_breaks", "declines", "evictions" };

/* Sets hit_rate and hit_rate_from of a stats scope from its counters. */
static int hit_rate(json_t *s) {
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
    int bad = !rate || !from;
    bad |= json_object_set_new(s, "hit_rate", rate) != 0;
    bad |= json_object_set_new(s, "hit_rate_from", from) != 0;
    return bad ? -1 : 0;
}

/* Adds counter `name` of src into dst (integers; a sum in double would lose
 * counts past 2^53), saturating: a corrupt or hostile catalog's counts may
 * be anything, and their sum must not overflow. */
_Static_assert(sizeof(json_int_t) == sizeof(long long), "json_int_t is long long");
static int add_count(json_t *dst, const char *name, json_int_t v) {
    json_t *old = json_object_get(dst, name);
    json_int_t sum;
    if (__builtin_add_overflow(json_integer_value(old), v, &sum)) sum = v > 0 ? LLONG_MAX : LLONG_MIN;
    return json_object_set_new(dst, name, json_integer(sum));
}

/* rows of (worker, reason, n) into each worker's field and the overall's. */
static int by_reason(cat_t *c, const char *sql, json_t *by_worker, json_t *overall, const char *field) {
    json_t *rows = query_rows(c, sql);
    if (!rows) return -1;
    size_t i;
    json_t *r;
    int bad = 0;
    json_array_foreach(rows, i, r) {
        const char *reason = json_string_value(json_object_get(r, "reason"));
        json_int_t n = json_integer_value(json_object_get(r, "n"));
        json_t *w = json_object_get(by_worker, json_string_value(json_object_get(r, "worker")));
        if (!reason) continue;
        if (w) bad |= add_count(json_object_get(w, field), reason, n);
        bad |= add_count(json_object_get(overall, field), reason, n);
    }
    json_decref(rows);
    return bad ? reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", c->path) : 0;
}

static json_t *build_stats_from(cat_t *c, const char *totals, const char *reasons) {
    char sql[2048];
    snprintf(sql, sizeof sql, STATS_SQL, totals, reasons);
    json_t *workers = query_rows(c, sql), *overall = json_object(), *index = json_object(), *root = NULL;
    if (!workers || !overall || !index) goto done;
    int bad = 0;
    for (size_t k = 0; k < sizeof stats_counters / sizeof *stats_counters; k++)
        bad |= json_object_set_new(overall, stats_counters[k], json_integer(0));
    size_t i;
    json_t *w;
    json_array_foreach(workers, i, w) {
        for (size_t k = 0; k < sizeof stats_counters / sizeof *stats_counters; k++)
            bad |= add_count(overall, stats_counters[k], json_integer_value(json_object_get(w, stats_counters[k])));
        bad |= json_object_set_new(w, "declines_by_reason", json_object());
        bad |= json_object_set_new(w, "evictions_by_reason", json_object());
        const char *name = json_string_value(json_object_get(w, "worker"));
        if (name) bad |= json_object_set(index, name, w);
    }
    bad |= json_object_set_new(overall, "declines_by_reason", json_object());
    bad |= json_object_set_new(overall, "evictions_by_reason", json_object());
    if (bad) {
        reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", c->path);
        goto done;
    }
    if (by_reason(c, "SELECT worker, reason, sum(count) AS n FROM declines GROUP BY worker, reason"
                     " ORDER BY worker, reason", index, overall, "declines_by_reason") != 0)
        goto done;
    snprintf(sql, sizeof sql, "SELECT worker, reason, sum(count) AS n FROM %s GROUP BY worker, reason"
                              " ORDER BY worker, reason", reasons);
    if (by_reason(c, sql, index, overall, "evictions_by_reason") != 0) goto done;
    json_array_foreach(workers, i, w) bad |= hit_rate(w);
    bad |= hit_rate(overall);
    json_t *arts = bad ? NULL : query_rows(c, artifact_totals_sql); /* docs/ARTIFACTS.md */
    if (!arts) {
        if (bad) reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", c->path);
        goto done;
    }
    pool_spread(arts);
    root = json_pack("{s:O, s:O, s:o}", "overall", overall, "workers", workers, "artifacts", arts);
    if (!root) reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", c->path);
done:
    json_decref(workers);
    json_decref(overall);
    json_decref(index);
    return root;
}

static json_t *build_stats(cat_t *c) { return build_stats_from(c, "key_totals", "eviction_reasons"); }

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
        reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", c->path);
    json_decref(arts);
    json_decref(keys);
    return root;
}

/* keys: one object per key hash seen in captures or declines, most
 * replayed first, from the summaries (`totals` as for stats; declines over
 * all time); the workers of each key in one pass, not a query per key. */
static json_t *build_keys_from(cat_t *c, const char *totals) {
    char sql[1536];
    snprintf(sql, sizeof sql,
             "WITH k AS (SELECT key_hash, sum(captures) AS captures, sum(replays) AS replays,"
             " max(last_replay) AS last_replay FROM %s GROUP BY key_hash"
             " HAVING sum(captures) + sum(replays) > 0),"
             " d AS (SELECT key_hash, sum(count) AS declines FROM declines GROUP BY key_hash),"
             " p AS (SELECT key_hash, count(*) AS prewarms FROM captures WHERE origin = 'prewarm'"
             " AND placeholder = 0 GROUP BY key_hash),"
             " a AS (SELECT key_hash FROM k UNION SELECT key_hash FROM d)"
             " SELECT a.key_hash AS key_hash, x.key_text AS key_text, coalesce(k.captures, 0) AS captures,"
             " coalesce(p.prewarms, 0) AS prewarms,"
             " coalesce(k.replays, 0) AS replays, coalesce(d.declines, 0) AS declines,"
             " k.last_replay AS last_replay FROM a LEFT JOIN k ON k.key_hash = a.key_hash"
             " LEFT JOIN d ON d.key_hash = a.key_hash LEFT JOIN p ON p.key_hash = a.key_hash"
             " LEFT JOIN key_texts x ON x.key_hash = a.key_hash"
             " ORDER BY replays DESC, a.key_hash", totals);
    json_t *rows = query_rows(c, sql), *index = json_object(), *pairs = NULL;
    int bad = !rows || !index;
    size_t i;
    json_t *r;
    if (!bad) {
        json_array_foreach(rows, i, r) {
            bad |= json_object_set_new(r, "workers", json_array());
            const char *h = json_string_value(json_object_get(r, "key_hash"));
            if (h) bad |= json_object_set(index, h, r);
        }
        snprintf(sql, sizeof sql,
                 "SELECT key_hash, worker FROM %s WHERE captures + replays > 0 UNION"
                 " SELECT key_hash, worker FROM declines ORDER BY 1, 2", totals);
        if (!bad && !(pairs = query_rows(c, sql))) goto fail;
        json_array_foreach(pairs, i, r) {
            json_t *k = json_object_get(index, json_string_value(json_object_get(r, "key_hash")));
            if (k) bad |= json_array_append(json_object_get(k, "workers"), json_object_get(r, "worker"));
        }
    }
    if (bad) {
        if (rows) reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", c->path);
        goto fail;
    }
    json_decref(index);
    json_decref(pairs);
    return rows;
fail:
    json_decref(rows);
    json_decref(index);
    json_decref(pairs);
    return NULL;
}

static json_t *build_keys(cat_t *c) { return build_keys_from(c, "key_totals"); }

static json_t *build_evictions(cat_t *c) {
    return query_rows(c,
        /* A component and its versions only for an eviction a sync caused;
         * the others were stored '' and 0: null ("-" in the table). */
        "SELECT t, worker, stream, reason, nullif(component, '') AS component,"
        " CASE WHEN component <> '' THEN from_version END AS from_version,"
        " CASE WHEN component <> '' THEN to_version END AS to_version, key_hash, key_text"
        " FROM evictions ORDER BY t DESC, id DESC LIMIT " CAT_STR(CAT_RECENT_LIMIT));
}

/* versions: every published version, newest first per component, with its
 * state (pending, current, superseded, failed and why), the workers that
 * applied it and those that failed to (and why); a LoRA version back to
 * its base (`--lora none`, no file) has source "(its base)". */
static int versions_limit; /* set by cat_query_versions_recent for the build below */

/* The newest `versions_limit` of each component are found by seeks:
 * each component by the next one after the last (the primary key's
 * order), then its newest versions; a window over every version read the
 * whole table, which grows by one row a sync (0.16 s for 100,000
 * versions). */
#define VERSION_COLUMNS                                                                            \
    "w.component AS component, w.version AS version, w.state AS state, w.reason AS reason,"        \
    " w.sha256 AS sha256, CASE WHEN coalesce(w.source, '') = '' AND w.base_version IS NOT NULL"    \
    " THEN '(its base)' ELSE w.source END AS source, w.t AS t, w.base_version AS base_version,"    \
    " w.adapter AS adapter"

static json_t *build_versions(cat_t *c) {
    char sql[1024];
    if (versions_limit > 0)
        snprintf(sql, sizeof sql,
                 "WITH RECURSIVE comp(c) AS (SELECT min(component) FROM weight_versions UNION ALL"
                 " SELECT (SELECT min(component) FROM weight_versions WHERE component > comp.c) FROM comp"
                 " WHERE comp.c IS NOT NULL)"
                 " SELECT " VERSION_COLUMNS " FROM comp JOIN weight_versions w ON w.component = comp.c"
                 " AND w.version IN (SELECT version FROM weight_versions WHERE component = comp.c"
                 " ORDER BY version DESC LIMIT %d) ORDER BY w.component, w.version DESC", versions_limit);
    else
        snprintf(sql, sizeof sql, "SELECT " VERSION_COLUMNS " FROM weight_versions w ORDER BY w.component, w.version DESC");
    json_t *rows = query_rows(c, sql);
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
    if (rows && (attach(c, rows, "SELECT component, version FROM worker_applied WHERE worker = ?1"
                                 " ORDER BY component",
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
                        " AND coalesce((SELECT version FROM worker_applied a WHERE a.worker = ?1"
                        " AND a.component = w.component), 0) < w.version"
                        " ORDER BY w.component",
                        "name", NULL, 'o', "lagging") != 0)) {
        json_decref(rows);
        return NULL;
    }
    return rows;
}

static json_t *build_requests(cat_t *c) {
    return query_rows(c,
        "SELECT t, id, worker, version, steps, captured, replayed, eager, batched_steps,"
        " CASE WHEN batched_steps > 0 THEN round(1.0 * batch_rows / batched_steps, 2) END AS mean_batch,"
        " padded_rows, seconds, encode_seconds,"
        " decode_seconds, status, key_hash, capture_key, eager_reasons, broker_id FROM requests ORDER BY rowid DESC"
        " LIMIT "
        CAT_STR(CAT_RECENT_LIMIT));
}

/* report: what `reelctl report --html` draws (ctl/report_html.c), from
 * rows at or after report_since: the time range, a timeline of REPORT_BUCKETS
 * buckets (requests, their steps and replayed steps), the weight syncs
 * with the captures and evictions between each and the next, declines by
 * reason, the stats, the keys, the workers, and the slowest requests.
 * report_since is set by cat_query_report for the build below (reelctl is
 * one thread).
 *
 * Its source ("source" in the JSON): while the raw requests are few
 * (REPORT_RAW_MAX) and reach back to the start of the range, the raw rows,
 * to the second; otherwise the summaries: the timeline per minute, each
 * hour's slowest requests, and the captures and evictions per sync counted
 * per minute. The stats and keys of a range (since > 0) are the rollups of
 * its hours (from the hour `since` falls in); declines are counted over
 * all time either way. */
#define REPORT_BUCKETS 60
#define REPORT_RAW_MAX 20000
static double report_since;

/* The captures and evictions of each applied sync (component, version, t,
 * state: current or superseded) and those before the first: raw rows in
 * time windows, or the timeline's minutes. A sync no worker applied
 * (failed) or not yet applied (pending) changed no weights: it is no sync
 * here (those are listed apart with their state, unapplied_sql). */
#define APPLIED "state IN ('current', 'superseded')"
static const char syncs_raw_sql[] =
    "SELECT w.component AS component, w.version AS version, w.t AS t, w.state AS state,"
    " (SELECT count(*) FROM captures c WHERE c.placeholder = 0 AND c.t >= w.t AND c.t < coalesce("
    "   (SELECT min(t) FROM weight_versions n WHERE n.t > w.t AND n." APPLIED "), 1e300)) AS captures,"
    " (SELECT count(*) FROM evictions e WHERE e.t >= w.t AND e.t < coalesce("
    "   (SELECT min(t) FROM weight_versions n WHERE n.t > w.t AND n." APPLIED "), 1e300)) AS evictions"
    " FROM weight_versions w WHERE w.t >= %.17g AND w." APPLIED " ORDER BY w.t";
static const char before_raw_sql[] =
    "SELECT (SELECT count(*) FROM captures WHERE placeholder = 0 AND t >= %1$.17g AND t < coalesce("
    " (SELECT min(t) FROM weight_versions WHERE t >= %1$.17g AND " APPLIED "), 1e300)) AS captures,"
    " (SELECT count(*) FROM evictions WHERE t >= %1$.17g AND t < coalesce("
    " (SELECT min(t) FROM weight_versions WHERE t >= %1$.17g AND " APPLIED "), 1e300)) AS evictions";
static const char syncs_sum_sql[] =
    "SELECT w.component AS component, w.version AS version, w.t AS t, w.state AS state,"
    " (SELECT coalesce(sum(captures), 0) FROM timeline WHERE minute >= CAST(w.t / 60 AS INTEGER) AND minute <"
    "   coalesce((SELECT CAST(min(t) / 60 AS INTEGER) FROM weight_versions n WHERE n.t > w.t AND n." APPLIED "),"
    "   9000000000000000)) AS captures,"
    " (SELECT coalesce(sum(evictions), 0) FROM timeline WHERE minute >= CAST(w.t / 60 AS INTEGER) AND minute <"
    "   coalesce((SELECT CAST(min(t) / 60 AS INTEGER) FROM weight_versions n WHERE n.t > w.t AND n." APPLIED "),"
    "   9000000000000000)) AS evictions"
    " FROM weight_versions w WHERE w.t >= %.17g AND w." APPLIED " ORDER BY w.t";
static const char before_sum_sql[] =
    "SELECT coalesce(sum(captures), 0) AS captures, coalesce(sum(evictions), 0) AS evictions FROM timeline"
    " WHERE minute >= %lld AND minute < coalesce((SELECT CAST(min(t) / 60 AS INTEGER) FROM weight_versions"
    " WHERE t >= %.17g AND " APPLIED "), 9000000000000000)";
static const char unapplied_sql[] =
    "SELECT component, version, t, state, coalesce(reason, '') AS reason FROM weight_versions"
    " WHERE t >= %.17g AND NOT " APPLIED " ORDER BY t";
#undef APPLIED

static json_t *build_report(cat_t *c) {
    char sql[1600];
    double since = report_since;
    /* A since past any time a catalog holds (up to 1e300 from --since)
     * is a minute past every row, never minute 0 (everything). */
    long long m_since = !(since > 0) ? 0 : since < 9e15 ? (long long)(since / 60) : (long long)(9e15 / 60);
    json_t *range = NULL, *timeline = NULL, *syncs = NULL, *before = NULL, *declines = NULL, *slowest = NULL,
           *unapplied = NULL, *stats = NULL, *keys = NULL, *workers = NULL, *split = NULL, *root = NULL;
    snprintf(sql, sizeof sql,
             /* max and min as subqueries of their own: each is one seek
              * (in one SELECT together they scan the table) */
             "SELECT coalesce((SELECT max(rowid) FROM requests) - (SELECT min(rowid) FROM requests) + 1, 0) AS span,"
             " (SELECT t FROM requests ORDER BY rowid LIMIT 1) AS first_t,"
             " (SELECT min(minute) FROM timeline WHERE minute >= %lld AND requests > 0) AS first_minute",
             m_since);
    json_t *probe = query_rows(c, sql);
    if (!probe) return NULL;
    json_t *p0 = json_array_get(probe, 0), *first_minute = json_object_get(p0, "first_minute"),
           *first_t = json_object_get(p0, "first_t");
    bool raw = json_integer_value(json_object_get(p0, "span")) <= REPORT_RAW_MAX &&
               (json_is_null(first_minute) ||
                (json_is_number(first_t) && json_number_value(first_t) / 60 < (double)json_integer_value(first_minute) + 1));
    json_decref(probe);

    double t0, t1;
    if (raw) {
        snprintf(sql, sizeof sql,
                 "SELECT coalesce(min(t), 0) AS t0, coalesce(max(t), 0) AS t1, count(*) AS requests FROM requests"
                 " WHERE t >= %.17g", since);
        if (!(range = query_rows(c, sql))) goto done;
        t0 = json_number_value(json_object_get(json_array_get(range, 0), "t0"));
        t1 = json_number_value(json_object_get(json_array_get(range, 0), "t1"));
    } else {
        snprintf(sql, sizeof sql,
                 "SELECT coalesce(min(minute), 0) * 60.0 AS t0, coalesce(max(minute) + 1, 0) * 60.0 AS t1,"
                 " coalesce(sum(requests), 0) AS requests FROM timeline WHERE minute >= %lld AND requests > 0",
                 m_since);
        if (!(range = query_rows(c, sql))) goto done;
        t0 = json_number_value(json_object_get(json_array_get(range, 0), "t0"));
        t1 = json_number_value(json_object_get(json_array_get(range, 0), "t1"));
    }
    json_t *r0 = json_array_get(range, 0);
    double w = t1 > t0 ? (t1 - t0) / REPORT_BUCKETS : 1;
    if (raw)
        snprintf(sql, sizeof sql,
                 "SELECT min(CAST((t - %.17g) / %.17g AS INTEGER), %d) AS bucket, count(*) AS requests,"
                 " coalesce(sum(replayed), 0) AS replayed, coalesce(sum(captured + replayed + eager), 0) AS steps,"
                 " coalesce(sum(status <> 'ok'), 0) AS failed"
                 " FROM requests WHERE t >= %.17g GROUP BY bucket ORDER BY bucket", t0, w, REPORT_BUCKETS - 1,
                 since);
    else
        snprintf(sql, sizeof sql,
                 "SELECT min(CAST((minute * 60.0 - %.17g) / %.17g AS INTEGER), %d) AS bucket,"
                 " sum(requests) AS requests, sum(replayed) AS replayed, sum(steps) AS steps, sum(failed) AS failed"
                 " FROM timeline WHERE minute >= %lld AND requests > 0 GROUP BY bucket ORDER BY bucket", t0, w,
                 REPORT_BUCKETS - 1, m_since);
    timeline = query_rows(c, sql);
    /* where the workers' time went: the loops, encoding prompts, decoding
     * outputs; the seconds of a request that failed are the broker's wait
     * for it, no worker's loop (the timeline sums only ok ones) */
    if (raw)
        snprintf(sql, sizeof sql, "SELECT coalesce(sum(CASE WHEN status = 'ok' THEN seconds END), 0) AS loop_seconds, coalesce(sum(encode_seconds), 0)"
                 " AS encode_seconds, coalesce(sum(decode_seconds), 0) AS decode_seconds FROM requests WHERE t >= %.17g",
                 since);
    else
        snprintf(sql, sizeof sql, "SELECT coalesce(sum(seconds), 0) AS loop_seconds, coalesce(sum(encode_seconds), 0)"
                 " AS encode_seconds, coalesce(sum(decode_seconds), 0) AS decode_seconds FROM timeline"
                 " WHERE minute >= %lld", m_since);
    split = query_rows(c, sql);
    snprintf(sql, sizeof sql, raw ? syncs_raw_sql : syncs_sum_sql, since);
    syncs = query_rows(c, sql);
    snprintf(sql, sizeof sql, unapplied_sql, since);
    unapplied = query_rows(c, sql);
    if (raw) snprintf(sql, sizeof sql, before_raw_sql, since);
    else snprintf(sql, sizeof sql, before_sum_sql, m_since, since);
    before = query_rows(c, sql);
    declines = query_rows(c, "SELECT reason, sum(count) AS count FROM declines GROUP BY reason"
                             " ORDER BY count DESC, reason");
    if (raw || !(since > 0))
        snprintf(sql, sizeof sql,
                 "SELECT t, id, worker, key_hash, version, steps, captured, replayed, eager, seconds, status"
                 " FROM %s WHERE t >= %.17g ORDER BY seconds DESC LIMIT 20", raw ? "requests" : "slow_requests",
                 since);
    else /* the hours of the range by slow_requests_by_hour, then sorted (+seconds: not every hour's rows in
          * slow_requests_by_seconds' order until 20 of the range turn up); rowid DESC: that index's order
          * among equal seconds */
        snprintf(sql, sizeof sql,
                 "SELECT t, id, worker, key_hash, version, steps, captured, replayed, eager, seconds, status"
                 " FROM slow_requests WHERE hour >= %lld AND t >= %.17g ORDER BY +seconds DESC, rowid DESC LIMIT 20",
                 m_since / 60, since);
    slowest = query_rows(c, sql);
    if (since > 0) {
        char totals[512], reasons[256];
        snprintf(totals, sizeof totals,
                 "(SELECT worker, key_hash, sum(requests) AS requests, sum(captures) AS captures,"
                 " sum(replays) AS replays, sum(steps) AS steps, sum(captured) AS captured,"
                 " sum(replayed) AS replayed, sum(eager) AS eager, max(last_replay) AS last_replay FROM rollups WHERE hour >= %lld GROUP BY worker, key_hash)",
                 m_since / 60);
        snprintf(reasons, sizeof reasons,
                 "(SELECT worker, reason, sum(count) AS count FROM eviction_hours WHERE hour >= %lld"
                 " GROUP BY worker, reason)", m_since / 60);
        stats = build_stats_from(c, totals, reasons);
        keys = build_keys_from(c, totals);
    } else {
        stats = build_stats(c);
        keys = build_keys(c);
    }
    workers = build_workers(c);
    if (timeline && syncs && unapplied && before && declines && slowest && stats && keys && workers && split) {
        root = json_pack("{s:f, s:f, s:f, s:f, s:i, s:O, s:s, s:O, s:O, s:O, s:O, s:O, s:O, s:O, s:O}", "since",
                         since, "t0", t0, "t1", t1, "bucket_seconds", w, "buckets", REPORT_BUCKETS, "requests",
                         json_object_get(r0, "requests"), "source", raw ? "requests" : "summaries", "timeline",
                         timeline, "syncs", syncs, "before_first_sync", json_array_get(before, 0), "declines",
                         declines, "slowest", slowest, "stats", stats, "keys", keys, "workers", workers);
        if (root && (json_object_set(root, "time_split", json_array_get(split, 0)) != 0 ||
                     json_object_set(root, "unapplied_syncs", unapplied) != 0)) {
            json_decref(root);
            root = NULL;
        }
        if (!root) reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", c->path);
    }
done:
    json_decref(range);
    json_decref(timeline);
    json_decref(syncs);
    json_decref(unapplied);
    json_decref(before);
    json_decref(declines);
    json_decref(slowest);
    json_decref(stats);
    json_decref(keys);
    json_decref(workers);
    json_decref(split);
    return root;
}

/* ---- the queries -------------------------------------------------------- */

json_t *cat_query_stats(cat_t *c) { return snapshot(c, build_stats); }
json_t *cat_query_keys(cat_t *c) { return snapshot(c, build_keys); }
json_t *cat_query_evictions(cat_t *c) { return snapshot(c, build_evictions); }
json_t *cat_query_versions(cat_t *c) { return cat_query_versions_recent(c, 0); }
json_t *cat_query_versions_recent(cat_t *c, int limit) {
    versions_limit = limit > 0 ? limit : 0;
    return snapshot(c, build_versions);
}
json_t *cat_query_workers(cat_t *c) { return snapshot(c, build_workers); }
json_t *cat_query_requests(cat_t *c) { return snapshot(c, build_requests); }
json_t *cat_query_artifacts(cat_t *c) { return snapshot(c, build_artifacts); }
json_t *cat_query_report(cat_t *c, double since) {
    report_since = since;
    return snapshot(c, build_report);
}
