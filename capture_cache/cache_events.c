/* cache_events.c -- what the capture cache reports: the names of reasons
 * and policies, events (queued under the lock, delivered after it), logs,
 * and declines (counted, each (reason, key) logged once). */
#include "cache_impl.h"
#include "base/error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names ----------------------------------------------------------------- */

static const char *reason_names[CAP_DECLINE_COUNT] = {
    "warming_up", "not_capturable", "override", "shape_mismatch", "pinned_input_moved",
    "constant_changed", "weights_moved", "verify_mismatch", "capture_failed",
    "budget_exceeded", "backend_unavailable", "mutable_output", "entry_busy", "mutable_input",
    "audit_mismatch", "wrong_stream", "artifact_parity",
};
static const char *evict_names[CAP_EVICT_COUNT] = {
    "weight_sync", "lru", "shape_change", "explicit", "shutdown", "audit_mismatch", "dropped",
    "stream_gone",
};

const char *cap_reason_name(cap_reason_t r) {
    return (unsigned)r < CAP_DECLINE_COUNT ? reason_names[r] : "?";
}
const char *cap_evict_reason_name(cap_evict_reason_t r) {
    return (unsigned)r < CAP_EVICT_COUNT ? evict_names[r] : "?";
}
const char *cap_capture_origin_name(int origin) {
    return origin == CAP_CAPTURE_DEMAND ? "demand" : origin == CAP_CAPTURE_PREWARM ? "prewarm" : "?";
}
const char *cap_policy_name(cap_policy_t p) {
    return p == CAP_POLICY_EVICT ? "evict" : p == CAP_POLICY_INPLACE ? "inplace" : "?";
}
int cap_policy_parse(const char *s, cap_policy_t *out) {
    if (!s || !out) return reel_fail(REEL_E_INVALID, "policy: no %s", s ? "destination" : "name");
    if (!strcmp(s, "evict")) *out = CAP_POLICY_EVICT;
    else if (!strcmp(s, "inplace")) *out = CAP_POLICY_INPLACE;
    else return reel_fail(REEL_E_INVALID, "unknown weight update policy '%s' (expected evict or inplace)", s);
    return 0;
}
bool cap_reason_permanent(cap_reason_t r) {
    return r == CAP_DECLINE_VERIFY_MISMATCH || r == CAP_DECLINE_BACKEND_UNAVAILABLE;
}

cap_options_t cap_options_default(void) {
    cap_options_t o;
    memset(&o, 0, sizeof o);
    o.warmup = 2;
    o.policy = CAP_POLICY_EVICT;
    o.graphs = true;
    o.pin_inputs = true;
    o.check_weights = true;
    o.audit_every = 0;
    return o;
}

/* ---- events and logs ---------------------------------------------------------- */

void cap_evq_push(evq_t *q, cap_event_kind_t kind, int reason, const entry_t *e, size_t bytes, size_t nodes,
                  double secs, const char *comp, uint64_t from, uint64_t to) {
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 8;
        queued_t *n = realloc(q->q, cap * sizeof *n);
        if (!n) { q->lost = true; return; }
        q->q = n;
        q->cap = cap;
    }
    queued_t *x = &q->q[q->n++];
    memset(&x->ev, 0, sizeof x->ev);
    x->ev.kind = kind;
    x->ev.reason = reason;
    snprintf(x->text, sizeof x->text, "%s", e->text);
    x->ev.key_hash = e->hash;
    x->ev.stream = e->stream_idx;
    x->ev.bytes = bytes;
    x->ev.nodes = nodes;
    x->ev.seconds = secs;
    if (comp) snprintf(x->comp, sizeof x->comp, "%s", comp);
    else x->comp[0] = 0;
    x->ev.from_version = from;
    x->ev.to_version = to;
    x->ev.graph = kind == CAP_EV_EVICT && e->admitted; /* published: its CAPTURE came before (cap_evict) */
}

void cap_evq_flush(cap_cache_t *c, evq_t *q) {
    CAP_ASSERT_UNLOCKED(&c->lock); /* cache.h: on_event runs with no cache lock held */
    for (size_t i = 0; i < q->n; i++) {
        q->q[i].ev.key_text = q->q[i].text;
        q->q[i].ev.component = q->q[i].comp[0] ? q->q[i].comp : NULL;
        if (c->opt.on_event) c->opt.on_event(c->opt.event_user, &q->q[i].ev);
    }
    if (q->lost) cap_log(c, 2, "capture cache: out of memory queueing events; some were not delivered");
    free(q->q);
    memset(q, 0, sizeof *q);
}

void cap_log(cap_cache_t *c, int level, const char *msg) {
    CAP_ASSERT_UNLOCKED(&c->lock); /* the callback may call the cache */
    if (c->opt.log) c->opt.log(c->opt.log_user, level, msg);
    else if (level >= 2) fprintf(stderr, "reel: warning: %s\n", msg);
}

/* True the first time (hash, reason) is seen (or seen again after
 * CAP_LOGGED_WAYS newer pairs of its set pushed it out: cache_impl.h). */
static bool first_time(cap_cache_t *c, uint64_t hash, cap_reason_t r) {
    CAP_ASSERT_LOCKED(&c->lock);
    if (!c->logged && !(c->logged = calloc((size_t)CAP_LOGGED_SETS * CAP_LOGGED_WAYS, sizeof *c->logged)))
        return true; /* log again rather than never */
    uint64_t mix = (hash ^ ((uint64_t)r + 1) * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
    logged_t *set = c->logged + (size_t)(mix >> 54) % CAP_LOGGED_SETS * CAP_LOGGED_WAYS;
    int w = 0;
    while (w < CAP_LOGGED_WAYS - 1 && !(set[w].used && set[w].hash == hash && set[w].reason == (int)r)) w++;
    bool seen = set[w].used && set[w].hash == hash && set[w].reason == (int)r;
    memmove(set + 1, set, (size_t)w * sizeof *set); /* to the front; the last way drops out when new */
    set[0] = (logged_t){ hash, (int)r, true };
    return !seen;
}

void cap_declined(cap_cache_t *c, entry_t *e, cap_reason_t r, evq_t *q, char *logbuf, size_t loglen) {
    CAP_ASSERT_LOCKED(&c->lock);
    c->st.declines[r]++;
    cap_evq_push(q, CAP_EV_DECLINE, r, e, 0, 0, 0, NULL, 0, 0);
    bool gone = cap_reason_permanent(r) || (r == CAP_DECLINE_CAPTURE_FAILED && e->state == ST_DISABLED);
    /* A retried capture failure is logged again once it becomes permanent. */
    bool now_gone = gone && r == CAP_DECLINE_CAPTURE_FAILED && !e->told_permanent;
    if (now_gone) e->told_permanent = true;
    if (r != CAP_DECLINE_WARMING_UP && (first_time(c, e->hash, r) || now_gone))
        snprintf(logbuf, loglen, "capture declined (%s%s) for %s; further declines for this reason "
                 "and key are counted, not logged", cap_reason_name(r),
                 gone ? ", permanent: the key runs eagerly from now on"
                 : r == CAP_DECLINE_CAPTURE_FAILED ? ", will retry" : "", e->text);
}
