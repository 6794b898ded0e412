/* wrk_running.c -- wrk_t.running with a condition variable: the sync
 * drain sleeps until the last running request finishes (or the worker
 * stops) instead of polling, and wakes the streams when it ends. */
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
    if (pthread_mutex_init(&w->cancel_mu, NULL) != 0) {
        pthread_mutex_destroy(&w->samples_mu);
        pthread_cond_destroy(&w->idle_cv);
        pthread_mutex_destroy(&w->idle_mu);
        return reel_fail(REEL_E_IO, "cannot create the cancels' lock");
    }
    return 0;
}

void wrk_shared_fini(wrk_t *w) {
    pthread_mutex_destroy(&w->cancel_mu);
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

#define WRK_CANCELS (sizeof ((wrk_t *)0)->cancels / sizeof ((wrk_t *)0)->cancels[0])

void wrk_cancel_note(wrk_t *w, uint64_t id) {
    pthread_mutex_lock(&w->cancel_mu);
    uint64_t n = atomic_load(&w->n_cancels);
    w->cancels[n % WRK_CANCELS].epoch = atomic_load(&w->epoch);
    w->cancels[n % WRK_CANCELS].id = id;
    w->cancels[n % WRK_CANCELS].taken = w->requests_taken;
    atomic_store(&w->n_cancels, n + 1);
    pthread_mutex_unlock(&w->cancel_mu);
    /* A stream with only held requests (a drain) sleeps until the drain
     * ends: woken now, it drops a cancelled one at once (the drain hook
     * wakes every stream; a round that finds nothing to do costs nothing). */
    pthread_mutex_lock(&w->idle_mu);
    if (w->drain_ended) w->drain_ended(w->drain_arg);
    pthread_mutex_unlock(&w->idle_mu);
}

bool wrk_cancelled(wrk_t *w, uint64_t epoch, uint64_t id, uint64_t taken) {
    if (!atomic_load(&w->n_cancels)) return false;
    bool hit = false;
    pthread_mutex_lock(&w->cancel_mu);
    uint64_t n = atomic_load(&w->n_cancels);
    for (uint64_t i = 0; i < n && i < WRK_CANCELS && !hit; i++)
        hit = w->cancels[i].id == id && w->cancels[i].epoch == epoch && taken <= w->cancels[i].taken;
    pthread_mutex_unlock(&w->cancel_mu);
    return hit;
}
