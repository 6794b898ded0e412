/* cache_fixture.h -- the fixture the capture cache's attack suites share
 * (test_capture_adversarial.c, test_cache_attack.c): the CPU backend and
 * stream a test runs on, the resident weights of component "wA", a cache
 * with that component registered and an event recorder attached, and the
 * checks those suites make of what the cache did.
 *
 * The recorder keeps the events of every cache made with cfx_options, from
 * any thread (under its own lock), up to CFX_MAX_REC; any past that are
 * counted as lost, and cfx_expect_graph_accounting fails on them rather
 * than compare counters with an incomplete record. The recorder is one per
 * process, cleared by cfx_open (each test's setup).
 *
 * Helpers that can fail fail the running test (ck_assert). */
#ifndef REEL_TESTS_CACHE_FIXTURE_H
#define REEL_TESTS_CACHE_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "capture_cache/cache.h"
#include "kernels/backend.h"

/* ---- the backend, its stream and the weights --------------------------------------- */

/* A CPU backend and one stream on it into *b and *s; clears the recorder
 * and its hook. */
void cfx_open(kern_backend_t **b, kern_stream_t **s);
/* Frees wa (NULL: none), destroys *s, then fails the test if *b still has
 * bytes allocated (a leak), and destroys *b. The caller destroys its caches
 * and other streams first (a cache's graphs pin their streams). */
void cfx_close(kern_backend_t **b, kern_stream_t **s, float *wa);
/* Component "wA"'s resident weights: SYNTH_W floats of b's memory, uniform
 * in [-1, 1) from the splitmix64 state *rng (advanced). Freed by cfx_close. */
float *cfx_weights_new(kern_backend_t *b, uint64_t *rng);

/* ---- the cache ------------------------------------------------------------------------ */

/* cap_options_default with the recorder attached (events and log). */
cap_options_t cfx_options(void);
/* A cache on b with options o and component "wA" registered at version 1,
 * resident at wa (SYNTH_W floats). */
cap_cache_t *cfx_cache_new(kern_backend_t *b, const cap_options_t *o, float *wa);
/* c's counters now. */
cap_stats_t cfx_stats(const cap_cache_t *c);

/* ---- the recorder ----------------------------------------------------------------------- */

#define CFX_MAX_REC 8192

/* One event as recorded. */
typedef struct {
    cap_event_kind_t kind;
    int reason;
    uint64_t hash; /* the key's */
    bool graph;
    size_t bytes;
} cfx_rec_t;

/* The options' callbacks: cfx_on_event records ev (or counts it lost),
 * then calls cfx_event_hook; cfx_on_log drops every line. */
void cfx_on_event(void *user, const cap_event_t *ev);
void cfx_on_log(void *user, int level, const char *msg);
/* Called by cfx_on_event after recording, on the cache's thread and with
 * no lock of the recorder held (so it may call back into the cache); NULL:
 * none. Set while no other thread dispatches. */
extern void (*cfx_event_hook)(const cap_event_t *ev);

/* Forgets every event recorded (and the count of those lost). */
void cfx_recs_clear(void);
/* Events recorded so far. */
int cfx_n_recs(void);
/* Event i (0 <= i < cfx_n_recs()), in the order told. */
cfx_rec_t cfx_rec(int i);
/* Events of kind (and reason; < 0: any) recorded so far. */
int cfx_count_recs(cap_event_kind_t kind, int reason);

/* captures - graph evictions is the graphs c holds (docs/CAPTURE.md,
 * "Decline reasons and events"), by the counters and by the events alike;
 * and the CAPTURE and EVICT events recorded are the captures and evictions
 * (graphless ones too) the counters hold. Fails the test, naming what,
 * when not, or when events were lost. */
void cfx_expect_graph_accounting(const cap_cache_t *c, const char *what);

/* ---- how a call ran -------------------------------------------------------------------- */

/* "eager", "captured", "replayed" ("?" for anything else). */
const char *cfx_ran_name(cap_ran_t r);
/* res ran as want; else fails the test naming what (and the decline
 * reason, when it ran eager). */
void cfx_expect_ran(cap_result_t res, cap_ran_t want, const char *what);
/* res ran eager, declined for why; else fails the test naming what. */
void cfx_expect_eager(cap_result_t res, cap_reason_t why, const char *what);

#endif
