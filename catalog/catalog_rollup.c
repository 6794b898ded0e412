/* catalog_rollup.c -- the summaries reports read (migration 7, see
 * catalog.sql).
 *
 * cat_write hands every record whose row went in to cat_roll_add, which
 * adds it to deltas kept in memory, one per summary row it touches: per
 * (worker, key, version, hour) for rollups and key_totals, per minute for
 * the timeline, per (worker, reason) for eviction_reasons, per key for
 * key_texts. cat_commit applies them (cat_roll_flush: one upsert per delta,
 * not per record) inside the batch's transaction, so a summary and the raw
 * rows it counts commit together or not at all; a rollback drops them.
 * The slowest requests of each hour are kept as they come (slow_add): a
 * request slower than the hour's 20th goes in and the fastest goes out.
 * Pruning the raw rows is catalog_prune.c's. */
#include "catalog/catalog_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define SLOW_PER_HOUR 20

typedef struct {
    int64_t requests, failed, steps, captured, replayed, eager, captures, replays, evictions;
    double seconds, seconds_max, capture_seconds;
    double encode_seconds, decode_seconds; /* MINUTE */
    double last_replay; /* < 0: none */
} roll_sums_t;

enum { R_ROLL, R_MINUTE, R_REASON, R_TEXT };

typedef struct {
    int kind;
    char *a, *b;       /* ROLL: worker, key_hash; REASON: worker, reason; TEXT: key_hash, its text */
    uint64_t version;  /* ROLL */
    int64_t slot;      /* ROLL, REASON: hour; MINUTE: minute */
    double t;          /* TEXT: when the text was seen */
    uint64_t hash;
    roll_sums_t s;
} roll_ent_t;

enum { S_ROLL, S_TOTAL, S_MINUTE, S_REASON, S_REASON_HOUR, S_TEXT, S_SLOW_LOAD, S_SLOW_ADD, S_SLOW_TRIM, S_COUNT };

#define ROLL_SUMS                                                                                   \
    " requests = requests + excluded.requests, failed = failed + excluded.failed,"                  \
    " steps = steps + excluded.steps, captured = captured + excluded.captured,"                      \
    " replayed = replayed + excluded.replayed, eager = eager + excluded.eager,"                      \
    " seconds = seconds + excluded.seconds, seconds_max = max(seconds_max, excluded.seconds_max),"  \
    " captures = captures + excluded.captures,"                                                     \
    " capture_seconds = capture_seconds + excluded.capture_seconds,"                                \
    " replays = replays + excluded.replays,"                                                        \
    " last_replay = max(coalesce(last_replay, excluded.last_replay),"                               \
    " coalesce(excluded.last_replay, last_replay)), evictions = evictions + excluded.evictions"

static const char *const roll_sql[S_COUNT] = {
    [S_ROLL] = "INSERT INTO rollups (worker, key_hash, version, hour, requests, failed, steps, captured,"
               " replayed, eager, seconds, seconds_max, captures, capture_seconds, replays, last_replay,"
               " evictions) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,"
               " ?16, ?17) ON CONFLICT (worker, key_hash, version, hour) DO UPDATE SET" ROLL_SUMS,
    [S_TOTAL] = "INSERT INTO key_totals (worker, key_hash, requests, failed, steps, captured, replayed,"
                " eager, seconds, seconds_max, captures, capture_seconds, replays, last_replay, evictions)"
                " VALUES (?1, ?2, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
                " ON CONFLICT (key_hash, worker) DO UPDATE SET" ROLL_SUMS,
    [S_MINUTE] = "INSERT INTO timeline (minute, requests, failed, steps, replayed, seconds, captures,"
                 " evictions, encode_seconds, decode_seconds) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
                 " ON CONFLICT (minute) DO UPDATE SET"
                 " requests = requests + excluded.requests, failed = failed + excluded.failed,"
                 " steps = steps + excluded.steps, replayed = replayed + excluded.replayed,"
                 " seconds = seconds + excluded.seconds, captures = captures + excluded.captures,"
                 " evictions = evictions + excluded.evictions,"
                 " encode_seconds = encode_seconds + excluded.encode_seconds,"
                 " decode_seconds = decode_seconds + excluded.decode_seconds",
    [S_REASON] = "INSERT INTO eviction_reasons (worker, reason, count) VALUES (?1, ?2, ?3)"
                 " ON CONFLICT (worker, reason) DO UPDATE SET count = count + excluded.count",
    [S_REASON_HOUR] = "INSERT INTO eviction_hours (hour, worker, reason, count) VALUES (?4, ?1, ?2, ?3)"
                      " ON CONFLICT (hour, worker, reason) DO UPDATE SET count = count + excluded.count",
    [S_TEXT] = "INSERT INTO key_texts (key_hash, key_text, t) VALUES (?1, ?2, ?3)"
               " ON CONFLICT (key_hash) DO UPDATE SET key_text = excluded.key_text, t = excluded.t"
               " WHERE excluded.t >= key_texts.t",
    [S_SLOW_LOAD] = "SELECT count(*), min(seconds) FROM slow_requests WHERE hour = ?1",
    [S_SLOW_ADD] = "INSERT INTO slow_requests (hour, id, worker, key_hash, version, steps, captured,"
                   " replayed, eager, seconds, status, t, capture_key, eager_reasons, error, started, broker_id)"
                   " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    [S_SLOW_TRIM] = "DELETE FROM slow_requests WHERE rowid = (SELECT rowid FROM slow_requests"
                    " WHERE hour = ?1 ORDER BY seconds, rowid LIMIT 1)",
};

struct cat_roll {
    roll_ent_t **slots; /* open addressing; cap is a power of two */
    size_t cap, n;
    bool failed;        /* a delta was lost (out of memory): the batch must not commit */
    roll_ent_t *last[R_TEXT]; /* per kind, the delta ent returned last (a run of requests shares one) */
    sqlite3_stmt *st[S_COUNT];
    /* the slowest requests of slow_hour: how many are kept and the fastest of them */
    bool slow_known;
    int64_t slow_hour;
    int64_t slow_n;
    double slow_min;
};

static sqlite3_stmt *stmt(cat_t *c, int which) {
    struct cat_roll *r = c->roll;
    if (!r->st[which] &&
        sqlite3_prepare_v3(c->db, roll_sql[which], -1, SQLITE_PREPARE_PERSISTENT, &r->st[which], NULL) != SQLITE_OK) {
        cat_db_fail(c, "prepare summaries");
        r->st[which] = NULL;
    }
    return r->st[which];
}

/* Steps s once (DONE expected) and leaves it reset. */
static int step_done(cat_t *c, sqlite3_stmt *s, int bound, const char *what) {
    int ret = 0;
    if (bound != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE) ret = cat_db_fail(c, what);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return ret;
}

/* ---- deltas ------------------------------------------------------------------ */

static uint64_t mix(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t ent_hash(int kind, const char *a, const char *b, uint64_t version, int64_t slot) {
    uint64_t h = 0xcbf29ce484222325ULL;
    h = mix(h, &kind, sizeof kind);
    h = mix(h, a, strlen(a) + 1);
    if (b) h = mix(h, b, strlen(b) + 1);
    h = mix(h, &version, sizeof version);
    return mix(h, &slot, sizeof slot);
}

static bool ent_is(const roll_ent_t *e, uint64_t hash, int kind, const char *a, const char *b, uint64_t version,
                   int64_t slot) {
    return e->hash == hash && e->kind == kind && e->version == version && e->slot == slot && !strcmp(e->a, a) &&
           (kind == R_TEXT || !strcmp(e->b ? e->b : "", b ? b : ""));
}

static void ent_free(roll_ent_t *e) {
    if (!e) return;
    free(e->a);
    free(e->b);
    free(e);
}

static bool grow(struct cat_roll *r) {
    size_t cap = r->cap ? r->cap * 2 : 256;
    roll_ent_t **slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < r->cap; i++) {
        roll_ent_t *e = r->slots[i];
        if (!e) continue;
        size_t j = (size_t)e->hash & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = e;
    }
    free(r->slots);
    r->slots = slots;
    r->cap = cap;
    return true;
}

/* The delta of (kind, a, b, version, slot), made empty when new; NULL (and
 * the batch marked failed) when out of memory. For R_TEXT the key is a
 * alone and b is the value. */
static roll_ent_t *ent(cat_t *c, int kind, const char *a, const char *b, uint64_t version, int64_t slot) {
    struct cat_roll *r = c->roll;
    a = a ? a : "";
    /* the delta of the record before, without hashing the key again */
    roll_ent_t *p = kind < R_TEXT ? r->last[kind] : NULL;
    if (p && p->version == version && p->slot == slot && !strcmp(p->a, a) && !strcmp(p->b, b ? b : "")) return p;
    uint64_t h = ent_hash(kind, a, kind == R_TEXT ? NULL : (b ? b : ""), version, slot);
    if (r->cap) {
        for (size_t j = (size_t)h & (r->cap - 1); r->slots[j]; j = (j + 1) & (r->cap - 1))
            if (ent_is(r->slots[j], h, kind, a, b, version, slot)) {
                if (kind < R_TEXT) r->last[kind] = r->slots[j];
                return r->slots[j];
            }
    }
    if ((r->n + 1) * 2 > r->cap && !grow(r)) goto oom;
    if (kind != R_TEXT && !b) b = ""; /* a NULL key_hash is stored as "" (NOT NULL columns) */
    roll_ent_t *e = calloc(1, sizeof *e);
    if (!e || !(e->a = strdup(a)) || (b && !(e->b = strdup(b)))) {
        ent_free(e);
        goto oom;
    }
    e->kind = kind;
    e->version = version;
    e->slot = slot;
    e->hash = h;
    e->s.last_replay = -1;
    e->t = -INFINITY;
    size_t j = (size_t)h & (r->cap - 1);
    while (r->slots[j]) j = (j + 1) & (r->cap - 1);
    r->slots[j] = e;
    r->n++;
    if (kind < R_TEXT) r->last[kind] = e;
    return e;
oom:
    r->failed = true;
    reel_fail(REEL_E_NOMEM, "catalog %s: summaries: out of memory", c->path);
    return NULL;
}

/* An hour or minute number: UNIX seconds / width, truncated as SQLite's
 * CAST(t / width AS INTEGER) does; times that are not a real instant go to 0. */
static int64_t slot_of(double t, double width) {
    return isfinite(t) && t > 0 && t < 9e15 ? (int64_t)(t / width) : 0;
}

/* A duration for sums: what is not a finite, non-negative number counts 0. */
static double dur(double s) { return isfinite(s) && s > 0 ? s : 0; }

static void text_seen(cat_t *c, const char *key_hash, const char *text, double t) {
    if (!text || !*text || !key_hash) return;
    roll_ent_t *e = ent(c, R_TEXT, key_hash, NULL, 0, 0);
    if (!e || !(t >= e->t)) return;
    char *dup = strdup(text);
    if (!dup) {
        c->roll->failed = true;
        reel_fail(REEL_E_NOMEM, "catalog %s: summaries: out of memory", c->path);
        return;
    }
    free(e->b);
    e->b = dup;
    e->t = t;
}

/* Keeps a request among its hour's SLOW_PER_HOUR slowest when it is one. */
static int slow_add(cat_t *c, const cat_request_t *q) {
    struct cat_roll *r = c->roll;
    int64_t hour = slot_of(q->t, 3600);
    double secs = isfinite(q->seconds) ? q->seconds : 0;
    sqlite3_stmt *s;
    if (!r->slow_known || r->slow_hour != hour) {
        if (!(s = stmt(c, S_SLOW_LOAD))) return -1;
        sqlite3_bind_int64(s, 1, hour);
        if (sqlite3_step(s) != SQLITE_ROW) {
            sqlite3_reset(s);
            return cat_db_fail(c, "slowest requests");
        }
        r->slow_n = sqlite3_column_int64(s, 0);
        r->slow_min = sqlite3_column_type(s, 1) == SQLITE_NULL ? INFINITY : sqlite3_column_double(s, 1);
        sqlite3_reset(s);
        r->slow_known = true;
        r->slow_hour = hour;
    }
    if (r->slow_n >= SLOW_PER_HOUR && !(secs > r->slow_min)) return 0;
    r->slow_known = false; /* reloaded next time, whatever happens below */
    if (!(s = stmt(c, S_SLOW_ADD))) return -1;
    int b = sqlite3_bind_int64(s, 1, hour) | sqlite3_bind_int64(s, 2, (sqlite3_int64)q->id) |
            cat_bind_text(s, 3, q->worker) | cat_bind_text(s, 4, q->key_hash) |
            sqlite3_bind_int64(s, 5, (sqlite3_int64)q->version) | sqlite3_bind_int(s, 6, q->steps) |
            sqlite3_bind_int(s, 7, q->captured) | sqlite3_bind_int(s, 8, q->replayed) |
            sqlite3_bind_int(s, 9, q->eager) | sqlite3_bind_double(s, 10, secs) |
            cat_bind_text(s, 11, q->status) | sqlite3_bind_double(s, 12, q->t) |
            cat_bind_text(s, 13, q->capture_key && *q->capture_key ? q->capture_key : NULL) |
            cat_bind_text(s, 14, q->eager_reasons && *q->eager_reasons ? q->eager_reasons : NULL) |
            cat_bind_text(s, 15, q->error && *q->error ? q->error : NULL) |
            (isfinite(q->started) ? sqlite3_bind_double(s, 16, q->started) : sqlite3_bind_null(s, 16)) |
            sqlite3_bind_int64(s, 17, (sqlite3_int64)q->broker_id);
    if (step_done(c, s, b, "slowest requests") != 0) return -1;
    if (r->slow_n + 1 > SLOW_PER_HOUR) {
        if (!(s = stmt(c, S_SLOW_TRIM))) return -1;
        if (step_done(c, s, sqlite3_bind_int64(s, 1, hour), "slowest requests") != 0) return -1;
    }
    return 0;
}

int cat_roll_add(cat_t *c, const cat_rec_t *rec) {
    if (!c->roll && !(c->roll = calloc(1, sizeof *c->roll)))
        return reel_fail(REEL_E_NOMEM, "catalog %s: summaries: out of memory", c->path);
    roll_ent_t *e, *m;
    switch (rec->kind) {
    case CAT_K_REQUEST: {
        const cat_request_t *q = &rec->u.request;
        if (!(e = ent(c, R_ROLL, q->worker, q->key_hash, q->version, slot_of(q->t, 3600))) ||
            !(m = ent(c, R_MINUTE, "", NULL, 0, slot_of(q->t, 60))))
            return -1;
        bool failed = !q->status || strcmp(q->status, "ok") != 0;
        e->s.requests++;
        e->s.failed += failed;
        e->s.steps += q->steps;
        e->s.captured += q->captured;
        e->s.replayed += q->replayed;
        e->s.eager += q->eager;
        e->s.seconds += dur(q->seconds);
        e->s.seconds_max = fmax(e->s.seconds_max, dur(q->seconds));
        m->s.requests++;
        m->s.failed += failed;
        m->s.steps += (int64_t)q->captured + q->replayed + q->eager; /* the steps that ran */
        m->s.replayed += q->replayed;
        /* The timeline's seconds are the workers' loops: a failed
         * request's are the broker's wait for it (brk_requests.c), not a
         * worker's time. */
        if (!failed) m->s.seconds += dur(q->seconds);
        m->s.encode_seconds += dur(q->encode_seconds);
        m->s.decode_seconds += dur(q->decode_seconds);
        return slow_add(c, q);
    }
    case CAT_K_CAPTURE: {
        const cat_capture_t *x = &rec->u.capture;
        if (!(e = ent(c, R_ROLL, x->worker, x->key_hash, x->version, slot_of(x->t, 3600))) ||
            !(m = ent(c, R_MINUTE, "", NULL, 0, slot_of(x->t, 60))))
            return -1;
        e->s.captures++;
        e->s.capture_seconds += dur(x->seconds);
        m->s.captures++;
        text_seen(c, x->key_hash, x->key_text, x->t);
        break;
    }
    case CAT_K_REPLAYS: {
        const cat_replays_t *x = &rec->u.replays;
        if (!(e = ent(c, R_ROLL, x->worker, x->key_hash, x->version, slot_of(x->t, 3600)))) return -1;
        e->s.replays += (int64_t)x->count;
        if (isfinite(x->t)) e->s.last_replay = fmax(e->s.last_replay, x->t);
        break;
    }
    case CAT_K_EVICTION: {
        const cat_eviction_t *x = &rec->u.eviction;
        uint64_t v = x->to_version ? x->to_version : x->version;
        roll_ent_t *why;
        if (!(e = ent(c, R_ROLL, x->worker, x->key_hash, v, slot_of(x->t, 3600))) ||
            !(m = ent(c, R_MINUTE, "", NULL, 0, slot_of(x->t, 60))) ||
            !(why = ent(c, R_REASON, x->worker, x->reason, 0, slot_of(x->t, 3600))))
            return -1;
        e->s.evictions++;
        m->s.evictions++;
        why->s.evictions++;
        text_seen(c, x->key_hash, x->key_text, x->t);
        break;
    }
    case CAT_K_DECLINE: {
        const cat_decline_t *x = &rec->u.decline;
        text_seen(c, x->key_hash, x->key_text, x->t);
        break;
    }
    default: break;
    }
    return c->roll->failed ? -1 : 0;
}

/* Binds a delta's sums as ?5..?17 (the rollups and key_totals statements). */
static int bind_sums(sqlite3_stmt *s, const roll_sums_t *x) {
    return sqlite3_bind_int64(s, 5, x->requests) | sqlite3_bind_int64(s, 6, x->failed) |
           sqlite3_bind_int64(s, 7, x->steps) | sqlite3_bind_int64(s, 8, x->captured) |
           sqlite3_bind_int64(s, 9, x->replayed) | sqlite3_bind_int64(s, 10, x->eager) |
           sqlite3_bind_double(s, 11, x->seconds) | sqlite3_bind_double(s, 12, x->seconds_max) |
           sqlite3_bind_int64(s, 13, x->captures) | sqlite3_bind_double(s, 14, x->capture_seconds) |
           sqlite3_bind_int64(s, 15, x->replays) |
           (x->last_replay >= 0 ? sqlite3_bind_double(s, 16, x->last_replay) : sqlite3_bind_null(s, 16)) |
           sqlite3_bind_int64(s, 17, x->evictions);
}

static int flush_one(cat_t *c, const roll_ent_t *e) {
    sqlite3_stmt *s;
    switch (e->kind) {
    case R_ROLL:
        for (int w = S_ROLL; w <= S_TOTAL; w++) {
            if (!(s = stmt(c, w))) return -1;
            int b = cat_bind_text(s, 1, e->a) | cat_bind_text(s, 2, e->b) |
                    sqlite3_bind_int64(s, 3, (sqlite3_int64)e->version) | sqlite3_bind_int64(s, 4, e->slot) |
                    bind_sums(s, &e->s);
            if (step_done(c, s, b, w == S_ROLL ? "rollups" : "key totals") != 0) return -1;
        }
        return 0;
    case R_MINUTE:
        if (!(s = stmt(c, S_MINUTE))) return -1;
        return step_done(c, s,
                         sqlite3_bind_int64(s, 1, e->slot) | sqlite3_bind_int64(s, 2, e->s.requests) |
                             sqlite3_bind_int64(s, 3, e->s.failed) | sqlite3_bind_int64(s, 4, e->s.steps) |
                             sqlite3_bind_int64(s, 5, e->s.replayed) | sqlite3_bind_double(s, 6, e->s.seconds) |
                             sqlite3_bind_int64(s, 7, e->s.captures) | sqlite3_bind_int64(s, 8, e->s.evictions) |
                             sqlite3_bind_double(s, 9, e->s.encode_seconds) |
                             sqlite3_bind_double(s, 10, e->s.decode_seconds),
                         "timeline");
    case R_REASON: /* all time, and per hour */
        for (int w = S_REASON; w <= S_REASON_HOUR; w++) {
            if (!(s = stmt(c, w))) return -1;
            int b = cat_bind_text(s, 1, e->a) | cat_bind_text(s, 2, e->b) | sqlite3_bind_int64(s, 3, e->s.evictions) |
                    (w == S_REASON_HOUR ? sqlite3_bind_int64(s, 4, e->slot) : SQLITE_OK);
            if (step_done(c, s, b, "eviction reasons") != 0) return -1;
        }
        return 0;
    case R_TEXT:
        if (!(s = stmt(c, S_TEXT))) return -1;
        return step_done(c, s,
                         cat_bind_text(s, 1, e->a) | cat_bind_text(s, 2, e->b) | sqlite3_bind_double(s, 3, e->t),
                         "key texts");
    default: return 0;
    }
}

/* Empties the deltas (kept: the table, for the next batch). */
static void clear(struct cat_roll *r) {
    for (size_t i = 0; i < r->cap; i++) {
        ent_free(r->slots[i]);
        r->slots[i] = NULL;
    }
    memset(r->last, 0, sizeof r->last);
    r->n = 0;
    r->failed = false;
}

int cat_roll_flush(cat_t *c) {
    struct cat_roll *r = c->roll;
    if (!r || (!r->n && !r->failed)) return 0;
    if (r->failed) return reel_fail(REEL_E_NOMEM, "catalog %s: summaries: a batch lost a delta (out of memory)", c->path);
    for (size_t i = 0; i < r->cap; i++)
        if (r->slots[i] && flush_one(c, r->slots[i]) != 0) return -1;
    clear(r);
    return 0;
}

void cat_roll_reset(cat_t *c) {
    if (!c->roll) return;
    clear(c->roll);
    c->roll->slow_known = false; /* its rows may have been rolled back */
}

bool cat_roll_failed(const cat_t *c) { return c->roll && c->roll->failed; }

void cat_roll_free(cat_t *c) {
    struct cat_roll *r = c->roll;
    if (!r) return;
    clear(r);
    free(r->slots);
    for (int i = 0; i < S_COUNT; i++) sqlite3_finalize(r->st[i]);
    free(r);
    c->roll = NULL;
}
