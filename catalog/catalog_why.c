/* catalog_why.c -- `reelctl why`: one finished request joined to its
 * graph's history (cat_query_why, catalog_query.h), inside one read
 * transaction.
 *
 * A request row names two hashes (docs/OPERATIONS.md, "Two kinds of key
 * hash"): key_hash, its shard, and capture_key, the key its worker's
 * captures, replays, declines and evictions are recorded by. A capture
 * key holds the weight version ("weights=transformer@2"), so a weight
 * sync gives the same graph a new key and the sync's eviction is recorded
 * under the old one: the history joins every key of the worker whose
 * text differs from the request's only in its weights (the key's
 * "lineage"), and marks the request's own key.
 *
 * Workers send their events in batches (reel-worker --events-ms, 200 ms
 * by default), after the RESULT of the step that caused them, and the
 * broker stamps rows when it gets them: the capture a request made itself
 * is stamped after the request's end. The history ends at the request's
 * end, except that a request that captured also finds its own capture up
 * to WHY_EVENT_LAG seconds later (marked after_end).
 *
 * The verdict is built only from rows found; each sentence names the
 * rows it rests on. */
#include "catalog/catalog_query.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "catalog/catalog_impl.h"

#define WHY_EVENT_LAG 5.0
#define WHY_HISTORY_MAX 50
#define WHY_STR_(x) #x
#define WHY_STR(x) WHY_STR_(x)

#define WEIGHTS(x)                                                                                 \
    "(CASE WHEN " CAT_HAS_WEIGHTS(x) " THEN substr(" x ", instr(" x ", ' weights=') + 9,"               \
    " instr(" x ", ' graph=') - instr(" x ", ' weights=') - 9) END)"

/* The parameters of the history's queries, bound from the request row
 * (hist_params): ?1 worker, ?2 capture key, ?3 its end (t), ?4 when its
 * work began (t - seconds - encode - decode), ?5 how far its own capture
 * is looked for (its end, or WHY_EVENT_LAG later when it captured), ?6
 * its id, ?7 its t as stored (to leave it out of its peers).
 *
 * LINEAGE: row a of `table` is the worker's row of the capture key or of its
 * lineage: two seeks, by (worker, key_hash) and by (worker, the key text
 * without its weights) -- schema 18's indexes; the lineage's expression
 * is the one they index. Written as one OR, SQLite read every row the
 * worker ever had, whatever the index (docs/BENCH.md, "Catalog after a
 * busy day"). */
#define LINEAGE(a, table)                                                                          \
    a ".rowid IN (SELECT rowid FROM " table " WHERE worker = ?1 AND key_hash = ?2"                  \
    " UNION ALL SELECT rowid FROM " table " WHERE worker = ?1 AND " CAT_KEY_BASE("key_text")       \
    " = (SELECT " CAT_KEY_BASE("key_text") " FROM key_texts WHERE key_hash = ?2))"

static const char find_sql[] =
    "SELECT t, id, worker, status, version, steps, captured, replayed, eager, eager_reasons, seconds,"
    " encode_seconds, decode_seconds, batched_steps, batch_rows, padded_rows,"
    " CASE WHEN batched_steps > 0 THEN round(1.0 * batch_rows / batched_steps, 2) END AS mean_batch,"
    " key_hash, capture_key, error, started, broker_id FROM requests WHERE id = ?1 AND (?2 IS NULL OR worker = ?2)"
    " AND (?3 IS NULL OR broker_id = ?3) ORDER BY rowid DESC LIMIT 1";
/* An id no client gave: the broker's id of a request (REQUEST's, the one
 * its worker's log names), unique to it. */
static const char by_broker_sql[] =
    "SELECT id, worker FROM (SELECT id, worker, t FROM requests WHERE broker_id = ?1 AND (?2 IS NULL OR worker = ?2)"
    " UNION ALL SELECT id, worker, t FROM slow_requests WHERE broker_id = ?1 AND (?2 IS NULL OR worker = ?2))"
    " ORDER BY t DESC LIMIT 1";
/* Retention keeps each hour's slowest requests when it prunes the raw
 * rows; they lack the time split and the batching (null, not 0). */
static const char find_slow_sql[] =
    "SELECT t, id, worker, status, version, steps, captured, replayed, eager, eager_reasons, seconds,"
    " NULL AS encode_seconds, NULL AS decode_seconds, NULL AS batched_steps, NULL AS batch_rows,"
    " NULL AS padded_rows, NULL AS mean_batch, key_hash, capture_key, error, started, broker_id FROM slow_requests"
    " WHERE id = ?1 AND (?2 IS NULL OR worker = ?2) AND (?3 IS NULL OR broker_id = ?3) ORDER BY t DESC LIMIT 1";
static const char count_sql[] =
    "SELECT (SELECT count(*) FROM requests WHERE id = ?1 AND (?2 IS NULL OR worker = ?2)) AS here,"
    " (SELECT count(*) FROM slow_requests WHERE id = ?1 AND (?2 IS NULL OR worker = ?2)) AS slow,"
    " coalesce(nullif((SELECT count(*) FROM requests WHERE id = ?1), 0),"
    " (SELECT count(*) FROM slow_requests WHERE id = ?1)) AS any";

static const char key_sql[] =
    "SELECT key_text, " WEIGHTS("key_text") " AS weights FROM key_texts WHERE key_hash = ?2";
#define CAPTURES_WHERE                                                                             \
    " FROM captures c WHERE c.placeholder = 0 AND " LINEAGE("c", "captures")                                    \
    " AND (c.t <= ?3 OR (c.key_hash = ?2 AND c.t >= ?4 AND c.t <= ?5))"
static const char captures_sql[] =
    "SELECT c.t AS t, c.key_hash AS key_hash, " WEIGHTS("c.key_text") " AS weights,"
    " c.key_hash = ?2 AS this_key, c.stream AS stream, c.origin AS origin,"
    " c.capture_seconds AS capture_seconds, c.replay_count AS replays, c.last_replay AS last_replay,"
    " c.t > ?3 AS after_end" CAPTURES_WHERE " ORDER BY c.t DESC, c.id DESC LIMIT " WHY_STR(WHY_HISTORY_MAX);
#define EVICTIONS_WHERE " FROM evictions e WHERE " LINEAGE("e", "evictions") " AND e.t <= ?3"
static const char evictions_sql[] =
    "SELECT e.t AS t, e.key_hash AS key_hash, " WEIGHTS("e.key_text") " AS weights,"
    " e.key_hash = ?2 AS this_key, e.stream AS stream, e.reason AS reason, nullif(e.component, '') AS component,"
    " CASE WHEN e.component <> '' THEN e.from_version END AS from_version,"
    " CASE WHEN e.component <> '' THEN e.to_version END AS to_version" EVICTIONS_WHERE
    " ORDER BY e.t DESC, e.id DESC LIMIT " WHY_STR(WHY_HISTORY_MAX);
/* first_capture and captures_before count the lineage's captures: a sync
 * that keeps graphs (a LoRA sync, --policy inplace) re-keys them in place
 * and records no capture under the new key, so the graph a request
 * replays may have been captured under an older key of the lineage. */
/* A capture is stamped when its worker's batch of events reaches the
 * broker, up to --events-ms after the RESULT of the request that made it:
 * a request of the key that ended before this one's start having captured
 * is a capture before it too (helper-78: a capture stamped late made the
 * requests that started between its RESULT and its stamp "new_key").
 * captures_before is the larger of the two counts, stamped or made (their
 * sum counted a capture both stamped and made before twice: helper-91). */
#define CAPTURING_REQUESTS                                                                         \
    " FROM requests q WHERE q.worker = ?1 AND q.capture_key = ?2 AND q.captured > 0 AND q.t < ?4"  \
    " AND NOT (q.id = ?6 AND q.t IS ?7)"
#define LINEAGE_CAPTURES " FROM captures c WHERE c.placeholder = 0 AND " LINEAGE("c", "captures")
static const char totals_sql[] =
    "SELECT (SELECT count(*)" CAPTURES_WHERE ") AS captures, (SELECT count(*)" EVICTIONS_WHERE ") AS evictions,"
    " (SELECT min(coalesce(a, b), coalesce(b, a)) FROM (SELECT (SELECT min(c.t)" LINEAGE_CAPTURES " AND c.t <= ?5)"
    " AS a, (SELECT min(q.t)" CAPTURING_REQUESTS ") AS b)) AS first_capture,"
    " max((SELECT count(*)" LINEAGE_CAPTURES " AND c.t < ?4), (SELECT coalesce(sum(q.captured), 0)"
    CAPTURING_REQUESTS ")) AS captures_before,"
    " (SELECT min(t) FROM captures WHERE worker = ?1 AND key_hash = ?2 AND placeholder = 0 AND t >= ?4"
    " AND t <= ?5) AS own_capture,"
    /* other requests of its key on its worker that captured while it ran
     * (another stream's): the catalog does not say whose capture is whose */
    " (SELECT count(*) FROM requests q WHERE q.worker = ?1 AND q.capture_key = ?2 AND q.captured > 0"
    " AND NOT (q.id = ?6 AND q.t IS ?7) AND q.t >= ?4 AND coalesce(q.started, q.t - q.seconds) <= ?3)"
    " AS capturing_beside";
/* The stamp of the request's last own capture: the captured-th capture of
 * its key on its worker from its start (?4) up to WHY_EVENT_LAG past its
 * end (?5), in order; bound as ?8 = captured. None when fewer came.
 * Captures of the key after that one are other requests' (helper-91: a
 * second capture 200 ms after this request's end, made by another
 * request, was shown as this one's own). */
static const char own_last_sql[] =
    "SELECT t FROM captures WHERE worker = ?1 AND key_hash = ?2 AND placeholder = 0 AND t >= ?4 AND t <= ?5"
    " ORDER BY t, id LIMIT 1 OFFSET ?8 - 1";
static const char declines_sql[] =
    "SELECT reason, count FROM declines WHERE worker = ?1 AND key_hash = ?2 ORDER BY reason";
/* The median of the other ok requests of the key on the worker: the
 * middle one, or the mean of the middle two. */
static const char peers_sql[] =
    "WITH p AS (SELECT seconds FROM requests WHERE worker = ?1 AND capture_key = ?2 AND status = 'ok'"
    " AND typeof(seconds) IN ('real', 'integer') AND NOT (id = ?6 AND t IS ?7)),"
    " n AS (SELECT count(*) AS n FROM p)"
    " SELECT (SELECT n FROM n) AS count, (SELECT avg(seconds) FROM (SELECT seconds FROM p ORDER BY seconds"
    " LIMIT 2 - (SELECT n FROM n) % 2 OFFSET ((SELECT n FROM n) - 1) / 2)) AS median_seconds";

static json_t *oom(cat_t *c) {
    reel_fail(REEL_E_NOMEM, "catalog %s: why: out of memory", cat_path(c));
    return NULL;
}

/* sql run with params (a JSON array: strings, integers, reals, nulls) bound
 * as ?1, ?2, ... as far as the statement has parameters; cat_q_collect's
 * rows in mode. NULL with a message on failure. */
static json_t *run(cat_t *c, const char *sql, const json_t *params, char mode) {
    sqlite3_stmt *s = cat_q_reader(c, sql);
    if (!s) return NULL;
    int n = sqlite3_bind_parameter_count(s), b = SQLITE_OK;
    for (int i = 0; i < n && b == SQLITE_OK; i++) {
        const json_t *v = json_array_get(params, (size_t)i);
        if (json_is_string(v)) b = cat_bind_text(s, i + 1, json_string_value(v));
        else if (json_is_integer(v)) b = sqlite3_bind_int64(s, i + 1, json_integer_value(v));
        else if (json_is_real(v)) b = sqlite3_bind_double(s, i + 1, json_real_value(v));
        else b = sqlite3_bind_null(s, i + 1);
    }
    json_t *rows = NULL;
    if (b != SQLITE_OK) cat_db_fail(c, "bind why query");
    else rows = cat_q_collect(c, s, mode);
    sqlite3_finalize(s);
    return rows;
}

/* The first row of run(sql), or an empty object when there is none; the
 * caller owns it. */
static json_t *run_one(cat_t *c, const char *sql, const json_t *params) {
    json_t *rows = run(c, sql, params, 'o');
    if (!rows) return NULL;
    json_t *r = json_array_get(rows, 0);
    r = r ? json_incref(r) : json_object();
    json_decref(rows);
    return r ? r : oom(c);
}

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static long long integer(const json_t *o, const char *k) {
    return (long long)json_integer_value(json_object_get(o, k));
}
static const char *text(const json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "-";
}

/* t as UTC ISO-8601 to the millisecond; "?" for what no time is (a
 * corrupt catalog may hold any double). */
static const char *when(double t, char buf[40]) {
    struct tm tm;
    if (!isfinite(t) || t < 0 || t > 1e12) return "?";
    long long all_ms = llround(t * 1000.0); /* rounded: 1011.1 is .100, not .099 */
    time_t secs = (time_t)(all_ms / 1000);
    unsigned ms = (unsigned)(all_ms % 1000);
    char day[24];
    if (!gmtime_r(&secs, &tm) || !strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm)) return "?";
    snprintf(buf, 40, "%.23s.%03uZ", day, ms);
    return buf;
}

/* Appends printf text to the verdict (cut, never overflowing). */
typedef struct {
    char s[1536];
    size_t n;
} say_t;
__attribute__((format(printf, 2, 3))) static void say(say_t *v, const char *fmt, ...) {
    if (v->n >= sizeof v->s - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(v->s + v->n, sizeof v->s - v->n, fmt, ap);
    va_end(ap);
    if (k > 0) v->n += (size_t)k < sizeof v->s - v->n ? (size_t)k : sizeof v->s - 1 - v->n;
}

/* "2 of its 6 steps ran eager (warming_up=2) and 1 was captured". */
static void say_paid(say_t *v, const json_t *r) {
    long long steps = integer(r, "steps"), eager = integer(r, "eager"), captured = integer(r, "captured");
    if (eager > 0) {
        say(v, "%lld of its %lld steps ran eager (%.200s)", eager, steps,
            json_is_string(json_object_get(r, "eager_reasons")) ? text(r, "eager_reasons") : "no reason reported");
        if (captured > 0) say(v, " and %lld %s captured", captured, captured == 1 ? "was" : "were");
    } else {
        say(v, "%lld of its %lld steps %s captured", captured, steps, captured == 1 ? "was" : "were");
    }
}

/* The eviction e as "weight_sync, transformer v1 -> v2". */
static void say_eviction(say_t *v, const json_t *e) {
    char at[40];
    say(v, "was evicted at %s (%.64s", when(num(e, "t"), at), text(e, "reason"));
    if (json_is_string(json_object_get(e, "component")))
        say(v, ", %.64s v%lld -> v%lld", text(e, "component"), integer(e, "from_version"), integer(e, "to_version"));
    say(v, ")");
}

/* Whether every reason r's eager steps give is one other than warmup. */
static bool declined_only(const json_t *r) {
    const char *why = json_string_value(json_object_get(r, "eager_reasons"));
    return why && *why && !strstr(why, "warming_up");
}

/* The verdict of root (kind and text) from its facts. */
static int verdict(cat_t *c, json_t *root) {
    const json_t *r = json_object_get(root, "request"), *tot = json_object_get(root, "totals"),
                 *peers = json_object_get(root, "peers");
    const char *worker = text(r, "worker"), *kind;
    say_t v = { .n = 0 };
    v.s[0] = '\0';
    char at[40];
    long long steps = integer(r, "steps"), eager = integer(r, "eager"), captured = integer(r, "captured"),
              replayed = integer(r, "replayed");
    double secs = num(r, "seconds");
    bool ok = json_is_string(json_object_get(r, "status")) && !strcmp(text(r, "status"), "ok");
    bool has_key = json_is_string(json_object_get(r, "capture_key"));
    const json_t *own = json_object_get(tot, "own_capture");
    bool own_found = captured > 0 && json_is_number(own);
    /* the newest eviction of the lineage up to the end, and whether the
     * key was captured again between it and this request's start */
    const json_t *evs = json_object_get(root, "evictions"), *caps = json_object_get(root, "captures");
    const json_t *ev = json_array_size(evs) ? json_array_get(evs, json_array_size(evs) - 1) : NULL;
    /* A worker sends its events in order: an eviction stamped after this
     * request's own capture came after it, and explains nothing here. */
    if (ev && own_found && num(ev, "t") > json_number_value(own)) ev = NULL;
    /* An eviction before any capture of the lineage dropped no graph: an
     * entry still warming up (its workspace) goes too when the budget makes
     * room, and the key was never captured, not evicted. */
    const json_t *first = json_object_get(tot, "first_capture");
    if (ev && !(json_is_number(first) && json_number_value(first) <= num(ev, "t"))) ev = NULL;
    bool recaptured_before = false;
    size_t i;
    const json_t *cp;
    json_array_foreach(caps, i, cp) { /* a capture of the lineage: a later sync may have re-keyed it in place */
        if (ev && num(cp, "t") > num(ev, "t") && num(cp, "t") < num(root, "started"))
            recaptured_before = true;
    }

    /* Requests of its key that captured on another stream while it ran: any
     * of the key's captures in its time may be theirs. */
    long long beside = integer(tot, "capturing_beside");
    /* what its own capture cost: the capture seconds of this key's
     * captures stamped with it (a worker's events come in batches, so
     * another stream's capture of the key may share the stamp: a range);
     * with requests capturing beside it, of all the key's captures from its
     * start to its own (a range) */
    double cap_lo = -1, cap_hi = -1;
    double upto = own_found && json_number_value(own) > num(root, "until") ? json_number_value(own) : num(root, "until");
    json_array_foreach(caps, i, cp) {
        if (!own_found || !json_is_true(json_object_get(cp, "this_key")) ||
            !json_is_number(json_object_get(cp, "capture_seconds")))
            continue;
        if (beside > 0 ? num(cp, "t") < num(root, "started") || num(cp, "t") > upto
                       : num(cp, "t") != json_number_value(own))
            continue;
        double x = num(cp, "capture_seconds");
        if (cap_lo < 0 || x < cap_lo) cap_lo = x;
        if (x > cap_hi) cap_hi = x;
    }

    if (!ok) {
        kind = "failed";
        say(&v, "failed: %.64s after %.3f s", text(r, "status"), secs);
        if (json_is_string(json_object_get(r, "error"))) say(&v, ": %.300s", text(r, "error"));
        if (!has_key) say(&v, " (no RESULT: the catalog holds no capture key for it)");
    } else if (!has_key) {
        kind = "no_capture_key";
        say(&v, "its worker reported no capture key (a worker or catalog from before schema 12): "
                "its graph's history can not be joined");
    } else if (eager > 0 || captured > 0) {
        if (ev && !recaptured_before) {
            kind = "evicted";
            say(&v, "its graph ");
            say_eviction(&v, ev);
            if (own_found && beside > 0)
                say(&v, " and captured again at %s, by this request or %lld of its key running beside it",
                    when(json_number_value(own), at), beside);
            else if (own_found) say(&v, " and captured again by this request at %s", when(json_number_value(own), at));
            else say(&v, " and not captured again before this request ended");
            if (strcmp(text(ev, "key_hash"), text(r, "capture_key")) &&
                json_is_string(json_object_get(ev, "weights")) && json_is_string(json_object_get(root, "weights")))
                say(&v, " (its key was weights=%.128s, now weights=%.128s)", text(ev, "weights"),
                    text(root, "weights"));
            say(&v, ": ");
            say_paid(&v, r);
        } else if (integer(tot, "captures_before") == 0 && eager > 0 && declined_only(r)) {
            /* eager for reasons other than warmup, its graph never captured before */
            kind = "declined";
            say_paid(&v, r);
            say(&v, ": declined, not warming up, and the catalog holds no capture of its graph on %.64s before "
                    "this request", worker);
            const char *why = json_string_value(json_object_get(r, "eager_reasons"));
            if (why && strstr(why, "budget_exceeded"))
                say(&v, " (budget_exceeded: the graph and its workspace did not fit the worker's --budget beside "
                        "what it held)");
        } else if (integer(tot, "captures_before") == 0) {
            kind = "new_key";
            say_paid(&v, r);
            say(&v, ": the key was new on %.64s", worker);
            if (json_is_number(first) && own_found && beside > 0)
                say(&v, " -- its first capture is at %s, by this request or %lld of its key running beside it --",
                    when(json_number_value(first), at), beside);
            else if (json_is_number(first))
                say(&v, " -- its first capture is at %s%s --", when(json_number_value(first), at),
                    own_found ? ", by this request" : "");
            else
                say(&v, " -- the catalog holds no capture of it there up to this request's end --");
            const char *why = json_string_value(json_object_get(r, "eager_reasons"));
            if (eager > 0 && why && strstr(why, "warming_up"))
                say(&v, " so its first requests run warmup steps before the graph is captured");
            else
                say(&v, " so this request paid for its graph");
        } else {
            kind = "eager";
            say_paid(&v, r);
            say(&v, " although the key had been captured on %.64s before (first at %s)", worker,
                when(json_number_value(first), at));
            if (integer(r, "batched_steps") > 0) /* (how many: the request's line above) */
                say(&v, "; a mixed batch's steps run under the batch's graph and key, not this one, and a batch's "
                        "warmup is recorded under its key");
        }
    } else if (replayed > 0) {
        double median = num(peers, "median_seconds"), ratio = num(peers, "ratio");
        long long n = integer(peers, "count");
        if (json_is_number(json_object_get(peers, "ratio")) && ratio >= 2) {
            kind = "replayed_slow";
            say(&v, "every step replayed, yet it took %.1fx the median of the %lld other ok requests of this key "
                    "on %.64s (%.3f s against %.3f s): the catalog records no capture, eviction or eager step "
                    "of it that explains this", ratio, n, worker, secs, median);
        } else {
            kind = "replayed";
            if (json_is_number(json_object_get(r, "seconds")))
                say(&v, "every step replayed: its %.3f s is the steps' own", secs);
            else
                say(&v, "every step replayed (the catalog holds no time for it)");
            if (n > 0 && json_is_number(json_object_get(peers, "median_seconds")))
                say(&v, " (the median of the %lld other ok requests of this key on %.64s is %.3f s)", n, worker,
                    median);
        }
    } else {
        kind = "no_steps";
        say(&v, "the catalog records none of its %lld steps as captured, replayed or eager", steps);
    }
    if (ok && cap_hi >= 0) {
        if (cap_hi > cap_lo) say(&v, "; capturing its graph took %.3f-%.3f s of its %.3f s", cap_lo, cap_hi, secs);
        else say(&v, "; capturing its graph took %.3f s of its %.3f s", cap_hi, secs);
    }
    if (ok && num(r, "encode_seconds") + num(r, "decode_seconds") > secs)
        say(&v, "; most of its time was outside the steps: encode %.3f s, decode %.3f s",
            num(r, "encode_seconds"), num(r, "decode_seconds"));
    if (ok && integer(r, "batched_steps") > 0)
        say(&v, "; %lld of its steps ran in mixed batches (mean %.2f requests, %lld padded rows)",
            integer(r, "batched_steps"), num(r, "mean_batch"), integer(r, "padded_rows"));
    json_t *j = json_pack("{s:s, s:s}", "kind", kind, "text", v.s);
    /* the text holds catalog strings cut at a byte count: a cut UTF-8
     * character makes it no JSON string; the kind alone then */
    if (!j) j = json_pack("{s:s, s:s}", "kind", kind, "text", "(not UTF-8)");
    if (!j || json_object_set_new(root, "verdict", j) != 0) {
        oom(c);
        return -1;
    }
    return 0;
}

/* The parameters of the history's queries (see LINEAGE). Its start is
 * the row's `started` (when the broker sent it to its worker); a row from
 * before migration 16 has none, and its end minus its seconds (the sum of
 * its own steps, encode and decode) stands in: later than its start when
 * its stream stepped other requests in between. */
static json_t *hist_params(const json_t *r, double *started) {
    double t = num(r, "t"), lag = integer(r, "captured") > 0 ? WHY_EVENT_LAG : 0;
    if (json_is_number(json_object_get(r, "started")) && num(r, "started") <= t)
        *started = num(r, "started");
    else
        *started = t - num(r, "seconds") - num(r, "encode_seconds") - num(r, "decode_seconds");
    if (!isfinite(*started)) *started = t;
    json_t *t_stored = json_object_get(r, "t");
    return json_pack("[O, O, f, f, f, O, O]", json_object_get(r, "worker"), json_object_get(r, "capture_key"),
                     isfinite(t) ? t : 0.0, *started, isfinite(t + lag) ? t + lag : 0.0, json_object_get(r, "id"),
                     t_stored ? t_stored : json_null());
}

/* History rows as the JSON gives them: oldest first (the queries take
 * the newest), this_key and after_end true or false (SQLite's 1 or 0).
 * -1 when out of memory. */
static int tidy(json_t *a) {
    size_t n = json_array_size(a);
    int bad = 0;
    for (size_t i = 0; i < n / 2; i++) {
        json_t *x = json_incref(json_array_get(a, i)), *y = json_incref(json_array_get(a, n - 1 - i));
        bad |= json_array_set_new(a, i, y);
        bad |= json_array_set_new(a, n - 1 - i, x);
    }
    static const char *const flags[] = { "this_key", "after_end" };
    json_t *r;
    json_array_foreach(a, n, r) {
        for (size_t k = 0; k < sizeof flags / sizeof *flags; k++)
            if (json_object_get(r, flags[k]))
                bad |= json_object_set_new(r, flags[k], json_boolean(integer(r, flags[k]) != 0));
    }
    return bad ? -1 : 0;
}

static json_t *build_why(cat_t *c, long long id, const char *worker) {
    json_t *find = json_pack("[I, s?]", (json_int_t)id, worker), *root = NULL, *params = NULL, *row = NULL,
           *counts = NULL;
    if (!find) return oom(c);
    const char *source = "requests";
    bool by_broker = false;
    if (!(counts = run_one(c, count_sql, find))) goto done;
    if (integer(counts, "any") == 0 && id > 0) { /* a broker's ids start above 0 */
        json_t *alt = run_one(c, by_broker_sql, find);
        if (!alt) goto done;
        if (json_is_integer(json_object_get(alt, "id"))) {
            json_t *f = json_pack("[O, O, I]", json_object_get(alt, "id"), json_object_get(alt, "worker"),
                                  (json_int_t)id);
            json_decref(alt);
            if (!f) {
                oom(c);
                goto done;
            }
            json_decref(find);
            find = f;
            by_broker = true;
        } else {
            json_decref(alt);
        }
    }
    if (!(row = run_one(c, find_sql, find))) goto done;
    if (json_object_size(row) == 0) {
        json_decref(row);
        source = "slow_requests";
        if (!(row = run_one(c, find_slow_sql, find))) goto done;
    }
    if (json_object_size(row) == 0) {
        long long any = integer(counts, "any");
        if (worker && any > 0)
            reel_fail(REEL_E_NOT_FOUND, "catalog %s: no request %lld on worker %.64s (%lld on other workers)",
                      cat_path(c), id, worker, any);
        else
            reel_fail(REEL_E_NOT_FOUND,
                      "catalog %s: no request %lld (a client's id, as `reelctl requests` shows it, or the broker's, as "
                      "a worker's log names it)",
                      cat_path(c), id);
        goto done;
    }
    double started;
    if (!(params = hist_params(row, &started))) {
        oom(c);
        goto done;
    }
    /* rows sharing its client's id (the broker's id is one request's) */
    long long matches = by_broker ? 1 : integer(counts, !strcmp(source, "requests") ? "here" : "slow");
    json_t *key = NULL, *caps = NULL, *evs = NULL, *tot = NULL, *decl = NULL, *peers = NULL;
    bool keyed = json_is_string(json_object_get(row, "capture_key"));
    if (keyed && integer(row, "captured") > 0) {
        /* its own captures reach no further than its last one: ?5 moves
         * back to that stamp (or to its end when it came before) */
        json_t *p8 = json_copy(params), *own = NULL;
        if (!p8 || json_array_append_new(p8, json_integer(integer(row, "captured"))) != 0) {
            json_decref(p8);
            oom(c);
            goto done;
        }
        own = run(c, own_last_sql, p8, 'o');
        json_decref(p8);
        if (!own) goto done;
        const json_t *last = json_object_get(json_array_get(own, 0), "t");
        if (json_is_number(last)) {
            double until = json_number_value(last), end = num(row, "t");
            json_array_set_new(params, 4, json_real(until > end ? until : end));
        }
        json_decref(own);
    }
    if (keyed) { /* a request without a capture key has no history to join */
        key = run_one(c, key_sql, params);
        caps = key ? run(c, captures_sql, params, 'o') : NULL;
        evs = caps ? run(c, evictions_sql, params, 'o') : NULL;
        tot = evs ? run_one(c, totals_sql, params) : NULL;
        decl = tot ? run(c, declines_sql, params, 'k') : NULL;
        peers = decl ? run_one(c, peers_sql, params) : NULL;
    } else {
        key = json_object(), caps = json_array(), evs = json_array(), tot = json_object(), decl = json_object();
        peers = json_pack("{s:i, s:n}", "count", 0, "median_seconds");
        if (!key || !caps || !evs || !tot || !decl || !peers) oom(c);
    }
    if (key && caps && evs && tot && decl && peers) {
        double median = num(peers, "median_seconds"), secs = num(row, "seconds");
        int bad = tidy(caps) | tidy(evs);
        bad |= json_object_set_new(peers, "ratio", json_is_number(json_object_get(peers, "median_seconds")) &&
                                      median > 0 && isfinite(secs) ? json_real(secs / median) : json_null());
        json_t *kt = json_object_get(key, "key_text"), *kw = json_object_get(key, "weights");
        root = json_pack("{s:O, s:s, s:I, s:b, s:f, s:f, s:O, s:O, s:O, s:O, s:O, s:O, s:O}", "request", row,
                         "source", source, "matches", (json_int_t)matches, "by_broker_id", by_broker, "started", started, "until", num(row, "t"),
                         "key_text", kt ? kt : json_null(), "weights", kw ? kw : json_null(), "captures", caps,
                         "evictions", evs, "totals", tot, "declines", decl, "peers", peers);
        if (bad || !root) oom(c);
        if (bad || !root || verdict(c, root) != 0) {
            json_decref(root);
            root = NULL;
        }
    }
    json_decref(key);
    json_decref(caps);
    json_decref(evs);
    json_decref(tot);
    json_decref(decl);
    json_decref(peers);
done:
    json_decref(find);
    json_decref(counts);
    json_decref(row);
    json_decref(params);
    return root;
}

json_t *cat_query_why(cat_t *c, long long id, const char *worker) {
    bool own_txn;
    if (cat_q_begin(c, &own_txn) != 0) return NULL;
    json_t *root = build_why(c, id, worker);
    cat_q_end(c, own_txn, root != NULL);
    return root;
}
