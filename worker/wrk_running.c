/* wrk_running.c -- wrk_t.running with a condition variable: the sync
 * drain sleeps until the last running request finishes (or the worker
 * stops) instead of polling, and wakes the streams when it ends; and the
 * requests held, which CANCELs mark. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include "base/error.h"
#include "worker/wrk.h"

int wrk_shared_init(wrk_t *w) {
    if (pthread_mutex_init(&w->idle_mu, NULL) != 0) return reel_fail(REEL_E_IO, "cannot create the drain lock");
    if (pthread_cond_init(&w->idle_cv, NULL) != 0) {
        pthread_mutex_destroy(&w->idle_mu);
        return reel_fail(REEL_E_IO, "cannot create the drain condition");
    }
    if (pthread_mutex_init(&w->samples_mu, NULL) != 0) {
        pthread_cond_destroy(&w->idle_cv);
        pthread_mutex_destroy(&w->idle_mu);
        return reel_fail(REEL_E_IO, "cannot create the step counters' lock");
    }
    if (pthread_mutex_init(&w->streams_log_mu, NULL) != 0) {
        pthread_mutex_destroy(&w->samples_mu);
        pthread_cond_destroy(&w->idle_cv);
        pthread_mutex_destroy(&w->idle_mu);
        return reel_fail(REEL_E_IO, "cannot create the request ends' log lock");
    }
    return 0;
}

void wrk_shared_fini(wrk_t *w) {
    for (size_t i = 0; i < w->n_held; i++) wrk_hold_release(&w->held[i].hold); /* a job still alive keeps its own */
    free(w->held);
    w->held = NULL;
    w->n_held = w->cap_held = 0;
    w->held_bytes = 0;
    pthread_mutex_destroy(&w->streams_log_mu);
    pthread_mutex_destroy(&w->samples_mu);
    pthread_cond_destroy(&w->idle_cv);
    pthread_mutex_destroy(&w->idle_mu);
}

void wrk_running_add(wrk_t *w, int n) { atomic_fetch_add(&w->running, n); }

void wrk_count_step(wrk_t *w, int64_t samples) {
    int i = 0;
    while (i < WRK_SAMPLE_BUCKETS && samples > wrk_step_sample_bound(i)) i++;
    pthread_mutex_lock(&w->samples_mu);
    w->step_samples[i]++;
    w->step_samples_sum += (uint64_t)samples;
    pthread_mutex_unlock(&w->samples_mu);
}

void wrk_step_samples_read(wrk_t *w, uint64_t counts[WRK_SAMPLE_BUCKETS + 1], uint64_t *sum) {
    pthread_mutex_lock(&w->samples_mu);
    memcpy(counts, w->step_samples, sizeof w->step_samples);
    *sum = w->step_samples_sum;
    pthread_mutex_unlock(&w->samples_mu);
}

/* The broadcast is under idle_mu, after the decrement: a drain that saw
 * running > 0 under idle_mu is already waiting, so it cannot miss it. */
void wrk_running_done(wrk_t *w) {
    if (atomic_fetch_sub(&w->running, 1) != 1) return;
    pthread_mutex_lock(&w->idle_mu);
    pthread_cond_broadcast(&w->idle_cv);
    pthread_mutex_unlock(&w->idle_mu);
}

void wrk_stop(wrk_t *w) {
    atomic_store(&w->stop, true);
    pthread_mutex_lock(&w->idle_mu);
    pthread_cond_broadcast(&w->idle_cv);
    pthread_mutex_unlock(&w->idle_mu);
}

void wrk_wait_drained(wrk_t *w) {
    pthread_mutex_lock(&w->idle_mu);
    while (atomic_load(&w->running) > 0 && !atomic_load(&w->stop)) pthread_cond_wait(&w->idle_cv, &w->idle_mu);
    pthread_mutex_unlock(&w->idle_mu);
}

void wrk_drain_hook(wrk_t *w, void (*fn)(void *arg), void *arg) {
    pthread_mutex_lock(&w->idle_mu);
    w->drain_ended = fn;
    w->drain_arg = arg;
    pthread_mutex_unlock(&w->idle_mu);
}

/* The hook runs under idle_mu: wrk_drain_hook(NULL) returns only once no
 * call of it is in progress, so the streams it wakes still exist. */
void wrk_drain_end(wrk_t *w) {
    atomic_store(&w->draining, false);
    pthread_mutex_lock(&w->idle_mu);
    if (w->drain_ended) w->drain_ended(w->drain_arg);
    pthread_mutex_unlock(&w->idle_mu);
}

/* Drops the held requests whose job ended: only the table holds them.
 * Their bytes leave the sum here and nowhere else, once each: an entry
 * is dropped once, whichever way its job ended (a RESULT, an ERROR, a
 * CANCEL, a deadline, an older session's abandon, a stop). */
static void held_prune(wrk_t *w) {
    size_t keep = 0;
    for (size_t i = 0; i < w->n_held; i++) {
        if (atomic_load(&w->held[i].hold->refs) == 1) {
            assert(w->held_bytes >= w->held[i].bytes);
            w->held_bytes -= w->held[i].bytes;
            wrk_hold_release(&w->held[i].hold);
        } else {
            w->held[keep++] = w->held[i];
        }
    }
    w->n_held = keep;
}

size_t wrk_holds(wrk_t *w) {
    held_prune(w);
    return w->n_held;
}

size_t wrk_held_bytes(wrk_t *w) {
    held_prune(w);
    return w->held_bytes;
}

int wrk_hold_take(wrk_t *w, wrk_job_t *j, size_t bytes) {
    held_prune(w);
    if (w->n_held == w->cap_held) {
        size_t cap = w->cap_held ? 2 * w->cap_held : 16;
        struct wrk_held *p = realloc(w->held, cap * sizeof *p);
        if (!p) return reel_fail(REEL_E_NOMEM, "out of memory holding request %llu", (unsigned long long)j->id);
        w->held = p;
        w->cap_held = cap;
    }
    wrk_hold_t *h = malloc(sizeof *h);
    if (!h) return reel_fail(REEL_E_NOMEM, "out of memory holding request %llu", (unsigned long long)j->id);
    atomic_init(&h->refs, 2); /* the table's and the job's */
    atomic_init(&h->cancelled, false);
    w->held[w->n_held++] = (struct wrk_held){ j->epoch, j->id, h, bytes };
    w->held_bytes += bytes;
    j->hold = h;
    return 0;
}

size_t wrk_cancel_note(wrk_t *w, uint64_t id) {
    held_prune(w);
    uint64_t epoch = atomic_load(&w->epoch);
    size_t marked = 0;
    for (size_t i = 0; i < w->n_held; i++)
        if (w->held[i].id == id && w->held[i].epoch == epoch) {
            atomic_store(&w->held[i].hold->cancelled, true);
            marked++;
        }
    if (!marked) return 0;
    /* A stream with only held requests (a drain) sleeps until the drain
     * ends: woken now, it drops a cancelled one at once (the drain hook
     * wakes every stream; a round that finds nothing to do costs nothing). */
    pthread_mutex_lock(&w->idle_mu);
    if (w->drain_ended) w->drain_ended(w->drain_arg);
    pthread_mutex_unlock(&w->idle_mu);
    return marked;
}

bool wrk_cancelled(const wrk_job_t *j) { return j->hold && atomic_load(&j->hold->cancelled); }
