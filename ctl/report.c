/* report.c -- reelctl's catalog reports (see report.h): the queries of
 * catalog/catalog_query.h drawn as JSON on one line, as a table whose
 * columns are listed here per report, or as Prometheus text. The table is
 * drawn from the same JSON, so the two forms can not disagree. */
#include "ctl/report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl/report_table.h"
#include "base/error.h"
#include "catalog/catalog_query.h"

/* A path the user gave that cannot be a catalog: missing, not a regular
 * file, or a file that is not SQLite (an empty file is an empty catalog). */
static int catalog_path_ok(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0)
        return reel_fail(REEL_E_NOT_FOUND, "catalog %s does not exist (use --catalog PATH or $REEL_CATALOG)", path);
    if (!S_ISREG(st.st_mode))
        return reel_fail(REEL_E_INVALID, "catalog %s: not a regular file (give the catalog's .db file)", path);
    if (st.st_size == 0) return 0;
    char head[16] = { 0 };
    FILE *f = fopen(path, "rb");
    if (!f) return reel_fail(REEL_E_IO, "catalog %s: %s", path, strerror(errno));
    size_t got = fread(head, 1, sizeof head, f);
    fclose(f);
    if (got != sizeof head || memcmp(head, "SQLite format 3", sizeof head) != 0)
        return reel_fail(REEL_E_INVALID, "catalog %s: not a SQLite database", path);
    return 0;
}

int ctl_catalog_open(const char *const *paths, int n, ctl_catalog_t *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n; i++)
        if (catalog_path_ok(paths[i]) != 0) return CTL_CATALOG_BAD_PATH;
    if (n == 1) {
        out->c = cat_open(paths[0], true);
        return out->c ? 0 : -1;
    }
    const char *dir = getenv("TMPDIR");
    snprintf(out->tmp, sizeof out->tmp, "%s/reel-union-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(out->tmp); /* 0600: catalogs hold the audit trail */
    if (fd < 0) {
        int e = errno;
        out->tmp[0] = '\0';
        return reel_fail(REEL_E_IO, "a temporary catalog for the union: %s", strerror(e));
    }
    close(fd);
    cat_t *u = cat_open(out->tmp, false);
    int rc = u ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++) rc = cat_merge(u, paths[i]);
    cat_close(&u);
    if (rc == 0 && !(out->c = cat_open(out->tmp, true))) rc = -1;
    if (rc != 0) ctl_catalog_close(out);
    return rc;
}

void ctl_catalog_close(ctl_catalog_t *cc) {
    cat_close(&cc->c);
    if (!cc->tmp[0]) return;
    char side[4200];
    unlink(cc->tmp);
    snprintf(side, sizeof side, "%s-wal", cc->tmp);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", cc->tmp);
    unlink(side);
    cc->tmp[0] = '\0';
}

typedef json_t *(*query_fn)(cat_t *c);

static int table(cat_t *c, FILE *out, const json_t *rows, const ctl_col_t *cols, size_t ncols) {
    char what[1100];
    snprintf(what, sizeof what, "catalog %s", cat_path(c));
    return ctl_table_print(what, out, rows, cols, ncols);
}

/* ret, or -1 with a message when out could not be written. */
static int flushed(cat_t *c, FILE *out, int ret) {
    if (ret == 0 && (fflush(out) != 0 || ferror(out)))
        ret = reel_fail(REEL_E_IO, "catalog %s: report: write failed: %s", cat_path(c), strerror(errno));
    return ret;
}

/* Prints a report as JSON on one line, or as a table of its rows. */
static int report(cat_t *c, query_fn query, bool json, FILE *out, const ctl_col_t *cols, size_t ncols) {
    json_t *root = query(c);
    if (!root) return -1;
    int ret;
    if (json) {
        char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(15));
        ret = text ? 0 : reel_fail(REEL_E_NOMEM, "catalog %s: report: cannot encode JSON", cat_path(c));
        if (text) fprintf(out, "%s\n", text);
        free(text);
    } else {
        ret = table(c, out, root, cols, ncols);
    }
    json_decref(root);
    return flushed(c, out, ret);
}


static const ctl_col_t stats_cols[] = {
    { "worker", "worker", CTL_F_TEXT, 32 },
    { "requests", "requests", CTL_F_NUM, 0 },
    { "captures", "captures", CTL_F_NUM, 0 },
    { "replays", "replays", CTL_F_NUM, 0 },
    { "hit_rate", "hit_rate", CTL_F_RATE, 0 },
    { "eager_breaks", "eager_breaks", CTL_F_NUM, 0 },
    { "declines_by_reason", "declines", CTL_F_MAP, 0 },
    { "evictions_by_reason", "evictions", CTL_F_MAP, 0 },
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

/* Kernel artifacts (docs/ARTIFACTS.md): one row per artifact id. */
static const ctl_col_t artifact_cols[] = {
    { "id", "artifact", CTL_F_TEXT, 32 },
    { "version", "version", CTL_F_TEXT, 12 },
    { "op", "op", CTL_F_TEXT, 0 },
    { "status", "status", CTL_F_TEXT, 0 },
    { "promoted", "promoted", CTL_F_NUM, 0 },
    { "demoted", "demoted", CTL_F_NUM, 0 },
    { "calls", "calls", CTL_F_NUM, 0 },
    { "parity_pass", "pass", CTL_F_NUM, 0 },
    { "parity_fail", "fail", CTL_F_NUM, 0 },
    { "fallbacks", "fallbacks", CTL_F_NUM, 0 },
    { "speedup", "speedup", CTL_F_SECS, 0 },
    { "speedup_sd", "sd", CTL_F_SECS, 0 },
    { "speedup_min", "key_min", CTL_F_SECS, 0 },
    { "speedup_max", "key_max", CTL_F_SECS, 0 },
    { "sync_timed", "sync_n", CTL_F_NUM, 0 },
    { "sync_ms", "sync_ms", CTL_F_SECS, 0 },
    { "last_seen", "last_seen", CTL_F_TIME, 0 },
    { "reason", "reason", CTL_F_TEXT, 60 },
};

/* One metric family over the artifact rows: HELP and TYPE once, then per
 * row one sample per (field, extra label) pair (label NULL: none), the
 * value an integer or a number. */
static void prom_artifact(FILE *out, const char *name, const char *type, const char *help,
                          json_t *rows, int n, const char *const *fields, const char *const *labels) {
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        for (int f = 0; f < n; f++) {
            fprintf(out, "%s{artifact=\"", name);
            prom_label(out, json_string_value(json_object_get(r, "id")));
            if (labels[f]) fprintf(out, "\",%s", labels[f]);
            json_t *v = json_object_get(r, fields[f]);
            if (json_is_integer(v)) fprintf(out, "\"} %lld\n", (long long)json_integer_value(v));
            else fprintf(out, "\"} %.6g\n", json_number_value(v));
        }
    }
}

int ctl_report_metrics(cat_t *c, FILE *out) {
    json_t *root = cat_query_stats(c);
    if (!root) return -1;
    json_t *rows = json_object_get(root, "workers");
    prom_counter(out, "reel_requests_total", "Requests that ended, by the worker that answered them (refused and failed ones too).",
                 rows, "requests");
    prom_counter(out, "reel_steps_total", "Denoising steps of finished requests, as they ran (a group in 2 parts runs each twice).", rows, "steps");
    prom_counter(out, "reel_replayed_steps_total", "Steps of finished requests served by graph replay.", rows,
                 "replayed_steps");
    prom_counter(out, "reel_captures_total", "Graphs captured and verified.", rows, "captures");
    prom_counter(out, "reel_replays_total", "Graph replays.", rows, "replays");
    prom_by_reason(out, "reel_declines_total", "Calls declined to eager, by reason.", rows, "declines_by_reason");
    prom_by_reason(out, "reel_evictions_total", "Graphs evicted, by reason.", rows, "evictions_by_reason");
    json_t *arts = json_object_get(root, "artifacts"); /* docs/ARTIFACTS.md */
    static const char *const calls[] = { "calls" }, *const fallbacks[] = { "fallbacks" },
                             *const speedup[] = { "speedup" }, *const none[] = { NULL },
                             *const spread[] = { "speedup_sd" }, *const sync_n[] = { "sync_timed" },
                             *const parity[] = { "parity_pass", "parity_fail" },
                             *const pf[] = { "result=\"pass", "result=\"fail" },
                             *const keys[] = { "promoted", "demoted" },
                             *const states[] = { "state=\"promoted", "state=\"demoted" };
    prom_artifact(out, "reel_artifact_calls_total", "counter",
                  "Launches of a kernel artifact (eager or captured), summed over its keys and workers.",
                  arts, 1, calls, none);
    prom_artifact(out, "reel_artifact_parity_total", "counter", "Parity comparisons, by result.", arts,
                  2, parity, pf);
    prom_artifact(out, "reel_artifact_fallbacks_total", "counter",
                  "Runtime failures of an artifact that ran the native kernel instead.", arts, 1,
                  fallbacks, none);
    prom_artifact(out, "reel_artifact_keys", "gauge", "Kernel keys where an artifact is promoted or demoted.",
                  arts, 2, keys, states);
    prom_artifact(out, "reel_artifact_speedup", "gauge",
                  "Native time over artifact time on the same inputs (shadow-timed calls; 0: none).",
                  arts, 1, speedup, none);
    prom_artifact(out, "reel_artifact_speedup_sd", "gauge",
                  "Standard deviation of the per-call speedup, pooled over every timed call.", arts, 1, spread,
                  none);
    prom_artifact(out, "reel_artifact_sync_timed_total", "counter",
                  "Artifact launches timed alone (--artifact-timing sync).", arts, 1, sync_n, none);
    json_decref(root);
    return flushed(c, out, 0);
}

int ctl_report_stats(cat_t *c, bool json, FILE *out) {
    if (json) return report(c, cat_query_stats, true, out, NULL, 0);
    json_t *root = cat_query_stats(c);
    if (!root) return -1;
    /* The table: one line per worker, then the overall line as "(all)". */
    json_t *rows = json_object_get(root, "workers"), *all = json_object_get(root, "overall");
    int ret;
    if (json_object_set_new(all, "worker", json_string("(all)")) != 0 || json_array_append(rows, all) != 0)
        ret = reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", cat_path(c));
    else
        ret = table(c, out, rows, stats_cols, CTL_NCOLS(stats_cols));
    json_t *arts = json_object_get(root, "artifacts");
    if (ret == 0 && json_array_size(arts) > 0) {
        fputc('\n', out);
        ret = table(c, out, arts, artifact_cols, CTL_NCOLS(artifact_cols));
    }
    json_decref(root);
    return flushed(c, out, ret);
}

int ctl_report_artifacts(cat_t *c, bool json, FILE *out) {
    static const ctl_col_t key_cols[] = {
        { "id", "artifact", CTL_F_TEXT, 28 },
        { "worker", "worker", CTL_F_TEXT, 20 },
        { "state", "state", CTL_F_TEXT, 0 },
        { "calls", "calls", CTL_F_NUM, 0 },
        { "parity_pass", "pass", CTL_F_NUM, 0 },
        { "parity_fail", "fail", CTL_F_NUM, 0 },
        { "fallbacks", "fallbacks", CTL_F_NUM, 0 },
        { "speedup", "speedup", CTL_F_SECS, 0 },
        { "speedup_sd", "sd", CTL_F_SECS, 0 },
        { "sync_timed", "sync_n", CTL_F_NUM, 0 },
        { "sync_ms", "sync_ms", CTL_F_SECS, 0 },
        { "key", "key", CTL_F_TEXT, 90 },
        { "reason", "reason", CTL_F_TEXT, 80 },
    };
    if (json) return report(c, cat_query_artifacts, true, out, NULL, 0);
    json_t *root = cat_query_artifacts(c);
    if (!root) return -1;
    int ret = table(c, out, json_object_get(root, "artifacts"), artifact_cols, CTL_NCOLS(artifact_cols));
    if (ret == 0) {
        fputc('\n', out);
        ret = table(c, out, json_object_get(root, "keys"), key_cols, CTL_NCOLS(key_cols));
    }
    json_decref(root);
    return flushed(c, out, ret);
}

int ctl_report_keys(cat_t *c, bool json, FILE *out) {
    static const ctl_col_t cols[] = {
        { "key_hash", "key_hash", CTL_F_TEXT, 16 },
        { "workers", "workers", CTL_F_LIST, 40 },
        { "captures", "captures", CTL_F_NUM, 0 },
        { "prewarms", "prewarmed", CTL_F_NUM, 0 },
        { "replays", "replays", CTL_F_NUM, 0 },
        { "declines", "declines", CTL_F_NUM, 0 },
        { "last_replay", "last_replay", CTL_F_TIME, 0 },
        { "key_text", "key_text", CTL_F_TEXT, 80 },
    };
    return report(c, cat_query_keys, json, out, cols, CTL_NCOLS(cols));
}

int ctl_report_evictions(cat_t *c, bool json, FILE *out) {
    static const ctl_col_t cols[] = {
        { "t", "time", CTL_F_TIME, 0 },
        { "worker", "worker", CTL_F_TEXT, 32 },
        { "stream", "stream", CTL_F_NUM, 0 },
        { "reason", "reason", CTL_F_TEXT, 0 },
        { "component", "component", CTL_F_TEXT, 24 },
        { "from_version", "from", CTL_F_NUM, 0 },
        { "to_version", "to", CTL_F_NUM, 0 },
        { "key_hash", "key_hash", CTL_F_TEXT, 16 },
        { "key_text", "key_text", CTL_F_TEXT, 80 },
    };
    return report(c, cat_query_evictions, json, out, cols, CTL_NCOLS(cols));
}

static int versions_limit; /* for the query below (reelctl is one thread) */
static bool versions_json; /* ... and whether it prints JSON: an adapter is an object there */
static json_t *versions_query(cat_t *c) {
    json_t *rows = cat_query_versions_recent(c, versions_limit), *r;
    size_t i;
    if (versions_json) /* the catalog keeps the adapter as JSON text: as JSON, it is an object */
        json_array_foreach(rows, i, r) {
            const char *text = json_string_value(json_object_get(r, "adapter"));
            json_t *obj = text ? json_loads(text, 0, NULL) : NULL;
            if (obj) json_object_set_new(r, "adapter", obj);
        }
    return rows;
}

int ctl_report_versions(cat_t *c, bool json, FILE *out) { return ctl_report_versions_recent(c, json, out, 0); }

int ctl_report_versions_recent(cat_t *c, bool json, FILE *out, int limit) {
    static const ctl_col_t cols[] = {
        { "component", "component", CTL_F_TEXT, 24 },
        { "version", "version", CTL_F_NUM, 0 },
        { "state", "state", CTL_F_TEXT, 0 },
        { "t", "published", CTL_F_TIME, 0 },
        { "sha256", "sha256", CTL_F_TEXT, 15 },
        { "applied", "applied_by", CTL_F_LIST, 60 },
        { "failed", "failed", CTL_F_LIST, 60 },
        { "source", "source", CTL_F_TEXT, 48 },
        { "base_version", "base", CTL_F_NUM, 0 },
        { "adapter", "adapter", CTL_F_TEXT, 60 },
        { "reason", "reason", CTL_F_TEXT, 60 },
    };
    versions_limit = limit;
    versions_json = json;
    if (json) return report(c, versions_query, json, out, cols, CTL_NCOLS(cols));
    /* One more than shown: a component that has it has older versions. */
    versions_limit = limit > 0 ? limit + 1 : 0;
    json_t *rows = versions_query(c), *shown = json_array();
    if (!rows || !shown) {
        json_decref(rows);
        json_decref(shown);
        return rows ? reel_fail(REEL_E_NOMEM, "catalog %s: report: out of memory", cat_path(c)) : -1;
    }
    size_t i, run = 0;
    json_t *r;
    const char *comp = NULL;
    bool more = false;
    json_array_foreach(rows, i, r) {
        const char *k = json_string_value(json_object_get(r, "component"));
        run = comp && k && !strcmp(comp, k) ? run + 1 : 1;
        comp = k;
        if (limit > 0 && run > (size_t)limit) more = true;
        else json_array_append(shown, r);
    }
    int ret = table(c, out, shown, cols, CTL_NCOLS(cols));
    if (ret == 0 && more) fprintf(out, "(the %d newest versions of each component; --all lists every one)\n", limit);
    if (ret == 0 && json_array_size(rows) == 0)
        fputs("(no sync yet: each worker serves the version it started with, its --weights-version, 1 by default;"
              " `reelctl workers` lists them)\n",
              out);
    json_decref(rows);
    json_decref(shown);
    return flushed(c, out, ret);
}

int ctl_report_workers(cat_t *c, bool json, FILE *out) {
    static const ctl_col_t cols[] = {
        { "name", "worker", CTL_F_TEXT, 32 },
        { "device", "device", CTL_F_TEXT, 32 },
        { "arch", "arch", CTL_F_TEXT, 0 },
        { "streams", "streams", CTL_F_NUM, 0 },
        { "budget", "budget", CTL_F_NUM, 0 },
        { "last_seen", "last_seen", CTL_F_TIME, 0 },
        { "gone_at", "gone_at", CTL_F_TIME, 0 },
        { "gone_reason", "gone_reason", CTL_F_TEXT, 32 },
        { "versions", "versions", CTL_F_MAP, 0 },
        { "lagging", "lagging", CTL_F_LIST, 80 },
    };
    return report(c, cat_query_workers, json, out, cols, CTL_NCOLS(cols));
}

int ctl_report_requests(cat_t *c, bool json, FILE *out) {
    static const ctl_col_t cols[] = {
        { "t", "time", CTL_F_TIME, 0 },
        { "id", "id", CTL_F_NUM, 0 },
        /* the broker's id: what a worker's log names (why takes either) */
        { "broker_id", "broker_id", CTL_F_NUM, 0 },
        { "worker", "worker", CTL_F_TEXT, 32 },
        { "version", "version", CTL_F_NUM, 0 },
        { "steps", "steps", CTL_F_NUM, 0 },
        { "captured", "captured", CTL_F_NUM, 0 },
        { "replayed", "replayed", CTL_F_NUM, 0 },
        { "eager", "eager", CTL_F_NUM, 0 },
        { "batched_steps", "batched", CTL_F_NUM, 0 },
        { "mean_batch", "batch", CTL_F_NUM, 0 },
        { "padded_rows", "padded", CTL_F_NUM, 0 },
        { "seconds", "seconds", CTL_F_SECS, 0 },
        { "encode_seconds", "encode", CTL_F_SECS, 0 },
        { "decode_seconds", "decode", CTL_F_SECS, 0 },
        { "status", "status", CTL_F_TEXT, 24 },
        { "key_hash", "key_hash", CTL_F_TEXT, 16 },
        { "capture_key", "capture_key", CTL_F_TEXT, 16 },
        { "eager_reasons", "eager_why", CTL_F_TEXT, 40 },
    };
    return report(c, cat_query_requests, json, out, cols, CTL_NCOLS(cols));
}
