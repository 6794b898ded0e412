/* report_why.c -- `reelctl why`'s output (report.h, ctl_report_why): the
 * request, its keys, its graph's history on its worker, its peers and the
 * verdict of cat_query_why, for people, or that query as JSON on one line.
 *
 * Every string from the catalog (names and key texts come from the
 * network) is printed with its control characters as '?', as the tables
 * of report_table.c print them, so a key text can not move the cursor or
 * forge a line. */
#include "ctl/report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "catalog/catalog_query.h"
#include "ctl/report_table.h"

/* s with control characters as '?'; "-" for a missing string. */
static void put(FILE *out, const json_t *v) {
    const char *s = json_string_value(v);
    if (!s) {
        fputc('-', out);
        return;
    }
    for (size_t i = 0, n = json_string_length(v); i < n; i++)
        fputc((unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i], out);
}

/* True when o's string k is val. */
static bool is(const json_t *o, const char *k, const char *val) {
    const char *s = json_string_value(json_object_get(o, k));
    return s && !strcmp(s, val);
}

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static long long integer(const json_t *o, const char *k) {
    return (long long)json_integer_value(json_object_get(o, k));
}

/* A number of seconds, or "-" where the catalog holds none. */
static void put_secs(FILE *out, const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    if (json_is_number(v)) fprintf(out, "%.3f s", json_number_value(v));
    else fputc('-', out);
}

/* t as UTC ISO-8601 to the millisecond ("?" for no time a clock gives). */
static void put_time(FILE *out, double t) {
    struct tm tm;
    bool ok = isfinite(t) && t >= 0 && t <= 1e12;
    long long all_ms = ok ? llround(t * 1000.0) : 0; /* rounded: 1011.1 is .100, not .099 */
    time_t secs = (time_t)(all_ms / 1000);
    char day[24];
    if (!ok || !gmtime_r(&secs, &tm) || !strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm)) {
        fputc('?', out);
        return;
    }
    fprintf(out, "%s.%03uZ", day, (unsigned)(all_ms % 1000));
}

/* Adds "time" (to the millisecond; rows stamped after the request's end
 * say so) to each history row, for the tables. */
static int label_rows(json_t *rows) {
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        char *text = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&text, &len);
        if (!m) return -1;
        put_time(m, num(r, "t"));
        if (json_is_true(json_object_get(r, "after_end"))) fputs(" (after its end)", m);
        fclose(m);
        int bad = !text || json_object_set_new(r, "time", json_string(text)) != 0;
        free(text);
        if (bad) return -1;
    }
    return 0;
}

static const ctl_col_t capture_cols[] = {
    { "time", "time", CTL_F_TEXT, 0 },
    { "this_key", "its_key", CTL_F_TEXT, 0 },
    { "key_hash", "key_hash", CTL_F_TEXT, 16 },
    { "weights", "weights", CTL_F_TEXT, 40 },
    { "stream", "stream", CTL_F_NUM, 0 },
    { "origin", "origin", CTL_F_TEXT, 8 },
    { "capture_seconds", "capture_s", CTL_F_SECS, 0 },
    { "replays", "replays", CTL_F_NUM, 0 },
    { "last_replay", "last_replay", CTL_F_TIME, 0 },
};
static const ctl_col_t eviction_cols[] = {
    { "time", "time", CTL_F_TEXT, 0 },
    { "this_key", "its_key", CTL_F_TEXT, 0 },
    { "key_hash", "key_hash", CTL_F_TEXT, 16 },
    { "weights", "weights", CTL_F_TEXT, 40 },
    { "stream", "stream", CTL_F_NUM, 0 },
    { "reason", "reason", CTL_F_TEXT, 24 },
    { "component", "component", CTL_F_TEXT, 24 },
    { "from_version", "from", CTL_F_NUM, 0 },
    { "to_version", "to", CTL_F_NUM, 0 },
};

static void put_request(FILE *out, const json_t *root) {
    const json_t *r = json_object_get(root, "request");
    fprintf(out, "request %lld", integer(r, "id"));
    /* the broker's id, the one its worker's log names */
    if (integer(r, "broker_id") > 0) fprintf(out, " (the broker's %lld)", integer(r, "broker_id"));
    fputs(" on ", out);
    put(out, json_object_get(r, "worker"));
    fputs(": ", out);
    put(out, json_object_get(r, "status"));
    fputs(", ended ", out);
    put_time(out, num(r, "t"));
    fputc('\n', out);
    long long matches = integer(root, "matches");
    if (matches > 1)
        fprintf(out, "  (the newest of %lld rows with this id: ids restart with their client; --worker NAME picks"
                     " a worker's)\n", matches);
    if (is(root, "source", "slow_requests"))
        fputs("  (from the slowest requests of its hour: retention pruned its raw row)\n", out);
    /* A request with no RESULT reported no step counts: its zeros are not
     * "ran nothing" (a cancelled or timed-out one ran steps), and its
     * version is the one it needed. */
    if (!is(r, "status", "ok") && !json_is_string(json_object_get(r, "capture_key")) && integer(r, "captured") == 0 &&
        integer(r, "replayed") == 0 && integer(r, "eager") == 0)
        fprintf(out, "  weights v%lld needed; %lld steps asked: no RESULT, so the steps its worker ran (if any) are"
                     " not in the catalog",
                integer(r, "version"), integer(r, "steps"));
    else
        fprintf(out, "  weights v%lld; %lld steps: %lld captured, %lld replayed, %lld eager", integer(r, "version"),
                integer(r, "steps"), integer(r, "captured"), integer(r, "replayed"), integer(r, "eager"));
    if (json_is_string(json_object_get(r, "eager_reasons"))) {
        fputs(" (", out);
        put(out, json_object_get(r, "eager_reasons"));
        fputc(')', out);
    }
    if (integer(r, "batched_steps") > 0)
        fprintf(out, "; %lld batched (mean batch %.2f, %lld padded rows)", integer(r, "batched_steps"),
                num(r, "mean_batch"), integer(r, "padded_rows"));
    fputs("\n  ", out);
    put_secs(out, r, "seconds");
    fputs(is(r, "status", "ok") ? " in the steps" : " waited by the broker", out);
    fputs("; encode ", out);
    put_secs(out, r, "encode_seconds");
    fputs(", decode ", out);
    put_secs(out, r, "decode_seconds");
    fputs("\n  shard key    ", out);
    put(out, json_object_get(r, "key_hash"));
    fputs("\n  capture key  ", out);
    put(out, json_object_get(r, "capture_key"));
    if (json_is_string(json_object_get(root, "weights"))) {
        fputs("  (weights ", out);
        put(out, json_object_get(root, "weights"));
        fputc(')', out);
    }
    fputs("\n  key text     ", out);
    put(out, json_object_get(root, "key_text"));
    fputc('\n', out);
}

static int put_history(cat_t *c, FILE *out, json_t *root) {
    const json_t *r = json_object_get(root, "request"), *tot = json_object_get(root, "totals");
    char what[1100];
    snprintf(what, sizeof what, "catalog %s", cat_path(c));
    json_t *caps = json_object_get(root, "captures"), *evs = json_object_get(root, "evictions");
    if (label_rows(caps) != 0 || label_rows(evs) != 0)
        return reel_fail(REEL_E_NOMEM, "catalog %s: why: out of memory", cat_path(c));
    fputs("\ncaptures of its graph on ", out);
    put(out, json_object_get(r, "worker"));
    fprintf(out, " up to its end (this key and its other weight versions; %zu of %lld):\n", json_array_size(caps),
            integer(tot, "captures"));
    if (ctl_table_print(what, out, caps, capture_cols, CTL_NCOLS(capture_cols)) != 0) return -1;
    size_t i;
    const json_t *cp;
    json_array_foreach(caps, i, cp) {
        if (json_is_true(json_object_get(cp, "after_end"))) {
            fputs("(after its end: its own capture, which a worker reports with its next batch of events)\n", out);
            break;
        }
    }
    fprintf(out, "\nevictions of its graph up to its end (%zu of %lld):\n", json_array_size(evs),
            integer(tot, "evictions"));
    if (ctl_table_print(what, out, evs, eviction_cols, CTL_NCOLS(eviction_cols)) != 0) return -1;
    const json_t *decl = json_object_get(root, "declines");
    if (json_object_size(decl) > 0) {
        fputs("\ndeclines of its key on its worker (all time):", out);
        const char *k;
        const json_t *v;
        int j = 0;
        json_object_foreach((json_t *)decl, k, v) {
            fputs(j++ ? ", " : " ", out);
            json_t *name = json_string(k);
            put(out, name);
            json_decref(name);
            fprintf(out, "=%lld", (long long)json_integer_value(v));
        }
        fputc('\n', out);
    }
    const json_t *p = json_object_get(root, "peers");
    long long n = integer(p, "count");
    fputs("\nother ok requests of its key on ", out);
    put(out, json_object_get(r, "worker"));
    if (n > 0 && json_is_number(json_object_get(p, "median_seconds"))) {
        fprintf(out, ": %lld, median %.3f s", n, num(p, "median_seconds"));
        if (json_is_number(json_object_get(p, "ratio"))) fprintf(out, "; this one %.2fx", num(p, "ratio"));
        fputc('\n', out);
    } else {
        fputs(": none\n", out);
    }
    return 0;
}

int ctl_report_why(cat_t *c, long long id, const char *worker, bool json, FILE *out) {
    json_t *root = cat_query_why(c, id, worker);
    if (!root) return -1;
    int ret = 0;
    if (json) {
        char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(15));
        if (text) fprintf(out, "%s\n", text);
        else ret = reel_fail(REEL_E_NOMEM, "catalog %s: why: cannot encode JSON", cat_path(c));
        free(text);
    } else {
        put_request(out, root);
        if (json_is_string(json_object_get(json_object_get(root, "request"), "capture_key")))
            ret = put_history(c, out, root);
        if (ret == 0) {
            fputs("\nverdict: ", out);
            put(out, json_object_get(json_object_get(root, "verdict"), "text"));
            fputc('\n', out);
        }
    }
    json_decref(root);
    if (ret == 0 && (fflush(out) != 0 || ferror(out)))
        ret = reel_fail(REEL_E_IO, "catalog %s: why: write failed: %s", cat_path(c), strerror(errno));
    return ret;
}
