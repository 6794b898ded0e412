/* cache_fixture.c -- the capture cache attack suites' fixture
 * (cache_fixture.h): backend, weights, cache, event recorder, checks. */
#include "tests/cache_fixture.h"

#include <check.h>
#include <pthread.h>

#include "base/error.h"
#include "tests/support.h"
#include "tests/synth_step.h"

/* ---- the backend, its stream and the weights --------------------------------------- */

void cfx_open(kern_backend_t **b, kern_stream_t **s) {
    *b = kern_backend_cpu_new();
    ck_assert_msg(*b != NULL, "cpu backend: %s", reel_err_text());
    *s = kern_stream_new(*b);
    ck_assert_msg(*s != NULL, "stream: %s", reel_err_text());
    cfx_event_hook = NULL;
    cfx_recs_clear();
}

void cfx_close(kern_backend_t **b, kern_stream_t **s, float *wa) {
    if (wa) kern_free(*b, wa);
    kern_stream_destroy(s);
    ck_assert_msg(kern_bytes_in_use(*b) == 0, "%zu backend bytes leaked", kern_bytes_in_use(*b));
    kern_backend_destroy(b);
}

float *cfx_weights_new(kern_backend_t *b, uint64_t *rng) {
    float *w = kern_alloc(b, SYNTH_W * sizeof(float));
    ck_assert_msg(w != NULL, "kern_alloc: %s", reel_err_text());
    synth_fill(rng, w, SYNTH_W, -1.f, 1.f);
    return w;
}

/* ---- the cache ------------------------------------------------------------------------ */

cap_options_t cfx_options(void) {
    cap_options_t o = cap_options_default();
    o.on_event = cfx_on_event;
    o.log = cfx_on_log;
    return o;
}

cap_cache_t *cfx_cache_new(kern_backend_t *b, const cap_options_t *o, float *wa) {
    cap_cache_t *c = cap_cache_new(b, o);
    ck_assert_msg(c != NULL, "cap_cache_new: %s", reel_err_text());
    TS_OK(cap_component_register(c, "wA", wa, SYNTH_W * sizeof(float), 1));
    return c;
}

cap_stats_t cfx_stats(const cap_cache_t *c) {
    cap_stats_t st;
    cap_cache_stats(c, &st);
    return st;
}

/* ---- the recorder ----------------------------------------------------------------------- */

static cfx_rec_t recs[CFX_MAX_REC];
static int n_recs, recs_lost;
static pthread_mutex_t rec_mu = PTHREAD_MUTEX_INITIALIZER;

void (*cfx_event_hook)(const cap_event_t *ev);

void cfx_on_event(void *user, const cap_event_t *ev) {
    (void)user;
    pthread_mutex_lock(&rec_mu);
    if (n_recs < CFX_MAX_REC) recs[n_recs++] = (cfx_rec_t){ ev->kind, ev->reason, ev->key_hash, ev->graph, ev->bytes };
    else recs_lost++;
    pthread_mutex_unlock(&rec_mu);
    if (cfx_event_hook) cfx_event_hook(ev);
}

void cfx_on_log(void *user, int level, const char *msg) {
    (void)user;
    (void)level;
    (void)msg;
}

void cfx_recs_clear(void) {
    pthread_mutex_lock(&rec_mu);
    n_recs = recs_lost = 0;
    pthread_mutex_unlock(&rec_mu);
}

int cfx_n_recs(void) {
    pthread_mutex_lock(&rec_mu);
    int n = n_recs;
    pthread_mutex_unlock(&rec_mu);
    return n;
}

cfx_rec_t cfx_rec(int i) {
    pthread_mutex_lock(&rec_mu);
    bool in = i >= 0 && i < n_recs;
    cfx_rec_t r = in ? recs[i] : (cfx_rec_t){ 0 };
    pthread_mutex_unlock(&rec_mu);
    ck_assert_msg(in, "event %d: only %d recorded", i, cfx_n_recs());
    return r;
}

int cfx_count_recs(cap_event_kind_t kind, int reason) {
    int n = 0;
    pthread_mutex_lock(&rec_mu);
    for (int i = 0; i < n_recs; i++)
        if (recs[i].kind == kind && (reason < 0 || recs[i].reason == reason)) n++;
    pthread_mutex_unlock(&rec_mu);
    return n;
}

void cfx_expect_graph_accounting(const cap_cache_t *c, const char *what) {
    cap_stats_t st = cfx_stats(c);
    ck_assert_msg(st.captures - cap_graph_evictions(&st, -1) == st.graphs,
                  "%s: captures %llu - graph evictions %llu != graphs held %zu", what,
                  (unsigned long long)st.captures, (unsigned long long)cap_graph_evictions(&st, -1), st.graphs);
    int caps = 0, graph_evicts = 0, graphless = 0, evicts = 0, lost;
    pthread_mutex_lock(&rec_mu);
    lost = recs_lost;
    for (int i = 0; i < n_recs; i++)
        if (recs[i].kind == CAP_EV_CAPTURE) {
            caps++;
        } else if (recs[i].kind == CAP_EV_EVICT) {
            evicts++;
            if (recs[i].graph) graph_evicts++;
            else graphless++;
        }
    pthread_mutex_unlock(&rec_mu);
    ck_assert_msg(lost == 0, "%s: %d events past the recorder's %d were lost", what, lost, CFX_MAX_REC);
    uint64_t ev_total = 0, gl_total = 0;
    for (int r = 0; r < CAP_EVICT_COUNT; r++) {
        ev_total += st.evictions[r];
        gl_total += st.graphless_evictions[r];
    }
    ck_assert_msg((uint64_t)caps == st.captures, "%s: %d CAPTURE events, %llu captures counted", what, caps,
                  (unsigned long long)st.captures);
    ck_assert_msg((uint64_t)evicts == ev_total && (uint64_t)graphless == gl_total,
                  "%s: %d EVICT events (%d graphless), counters say %llu (%llu graphless)", what, evicts, graphless,
                  (unsigned long long)ev_total, (unsigned long long)gl_total);
    ck_assert_msg((size_t)(caps - graph_evicts) == st.graphs, "%s: %d CAPTURE - %d graph EVICT events != %zu graphs",
                  what, caps, graph_evicts, st.graphs);
}

/* ---- how a call ran -------------------------------------------------------------------- */

const char *cfx_ran_name(cap_ran_t r) {
    return r == CAP_RAN_EAGER ? "eager" : r == CAP_RAN_CAPTURED ? "captured" : r == CAP_RAN_REPLAYED ? "replayed" : "?";
}

void cfx_expect_ran(cap_result_t res, cap_ran_t want, const char *what) {
    ck_assert_msg(res.ran == want, "%s: ran %s (reason %s), expected %s", what, cfx_ran_name(res.ran),
                  res.ran == CAP_RAN_EAGER ? cap_reason_name(res.reason) : "-", cfx_ran_name(want));
}

void cfx_expect_eager(cap_result_t res, cap_reason_t why, const char *what) {
    ck_assert_msg(res.ran == CAP_RAN_EAGER && res.reason == why, "%s: ran %s (reason %s), expected eager (%s)", what,
                  cfx_ran_name(res.ran), res.ran == CAP_RAN_EAGER ? cap_reason_name(res.reason) : "-",
                  cap_reason_name(why));
}
