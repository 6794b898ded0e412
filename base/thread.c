/* thread.c -- one worker thread and its queue (see thread.h). One mutex
 * guards the queue and the thread's state; the thread sleeps on `wake`
 * (an item, a wake, a resume or a stop), pausers on `between` (the thread
 * left a callback). Timed waits use CLOCK_MONOTONIC. */
#include "base/thread.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/error.h"

typedef struct node {
    void *item;
    struct node *next;
} node_t;

struct reel_thread {
    reel_thread_opts_t o;
    char name[64];
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t wake;         /* to the thread: an item, a wake, a resume, a stop */
    pthread_cond_t between;      /* to pausers: the thread left a callback */
    node_t *head, *tail;
    size_t backlog;              /* queued + the item in progress */
    int paused;                  /* pauses not yet resumed */
    bool busy;                   /* inside run or idle */
    bool idle_due;               /* call idle before sleeping */
    bool stopping, drain;
};

static void *thread_main(void *arg) {
    reel_thread_t *t = arg;
    if (t->o.block_signals) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
    }
    if (t->o.enter) t->o.enter(t->o.user);
    struct timespec due;         /* when idle wants its next call */
    bool timed = false;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        if (t->paused && !t->stopping) {
            pthread_cond_wait(&t->wake, &t->mu);
            continue;
        }
        if (t->head && (!t->stopping || t->drain)) {
            node_t *n = t->head;
            t->head = n->next;
            if (!t->head) t->tail = NULL;
            t->busy = true;
            pthread_mutex_unlock(&t->mu);
            t->o.run(t->o.user, n->item);
            free(n);
            pthread_mutex_lock(&t->mu);
            t->busy = false;
            t->backlog--;
            t->idle_due = t->o.idle != NULL;
            pthread_cond_broadcast(&t->between);
            continue;
        }
        if (t->stopping) break;
        if (!t->idle_due && timed) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec > due.tv_sec || (now.tv_sec == due.tv_sec && now.tv_nsec >= due.tv_nsec))
                t->idle_due = true;
        }
        if (t->idle_due) {
            t->idle_due = false;
            t->busy = true;
            pthread_mutex_unlock(&t->mu);
            int64_t ms = t->o.idle(t->o.user);
            pthread_mutex_lock(&t->mu);
            t->busy = false;
            pthread_cond_broadcast(&t->between);
            timed = ms > 0;
            if (ms == 0) t->idle_due = true;
            if (timed) {
                clock_gettime(CLOCK_MONOTONIC, &due);
                due.tv_sec += (time_t)(ms / 1000);
                due.tv_nsec += (long)(ms % 1000) * 1000000L;
                if (due.tv_nsec >= 1000000000L) {
                    due.tv_sec++;
                    due.tv_nsec -= 1000000000L;
                }
            }
            continue;
        }
        if (timed) pthread_cond_timedwait(&t->wake, &t->mu, &due);
        else pthread_cond_wait(&t->wake, &t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    if (t->o.leave) t->o.leave(t->o.user);
    return NULL;
}

reel_thread_t *reel_thread_start(const reel_thread_opts_t *opts) {
    assert(opts && opts->run);
    reel_thread_t *t = calloc(1, sizeof *t);
    if (!t) {
        reel_fail(REEL_E_NOMEM, "thread %s: out of memory", opts->name ? opts->name : "");
        return NULL;
    }
    t->o = *opts;
    snprintf(t->name, sizeof t->name, "%s", opts->name ? opts->name : "thread");
    t->o.name = t->name;
    t->idle_due = opts->idle != NULL;
    bool mu = false, wake = false, between = false;
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) goto err;
    if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&t->wake, &ca) == 0) wake = true;
    pthread_condattr_destroy(&ca);
    if (!wake || !(mu = pthread_mutex_init(&t->mu, NULL) == 0) ||
        !(between = pthread_cond_init(&t->between, NULL) == 0))
        goto err;
    int e = pthread_create(&t->th, NULL, thread_main, t);
    if (e != 0) {
        reel_fail(REEL_E_IO, "cannot start thread %s: %s", t->name, strerror(e));
        goto out;
    }
    char os[16];
    memcpy(os, t->name, sizeof os - 1);
    os[sizeof os - 1] = '\0';
    (void)pthread_setname_np(t->th, os); /* a name in top and gdb; nothing depends on it */
    return t;
err:
    reel_fail(REEL_E_IO, "thread %s: cannot create its lock", t->name);
out:
    if (between) pthread_cond_destroy(&t->between);
    if (mu) pthread_mutex_destroy(&t->mu);
    if (wake) pthread_cond_destroy(&t->wake);
    free(t);
    return NULL;
}

static int post(reel_thread_t *t, void *item, bool wake) {
    node_t *n = malloc(sizeof *n);
    pthread_mutex_lock(&t->mu);
    bool stopping = t->stopping;
    if (n && !stopping) {
        n->item = item;
        n->next = NULL;
        if (t->tail) t->tail->next = n;
        else t->head = n;
        t->tail = n;
        t->backlog++;
        if (wake) pthread_cond_signal(&t->wake);
    }
    pthread_mutex_unlock(&t->mu);
    if (n && !stopping) return 0;
    free(n);
    if (t->o.discard) t->o.discard(t->o.user, item);
    return reel_fail(stopping ? REEL_E_STATE : REEL_E_NOMEM, "thread %s: %s; item dropped", t->name,
                     stopping ? "stopping" : "out of memory");
}

int reel_thread_post(reel_thread_t *t, void *item) { return post(t, item, true); }

int reel_thread_post_quiet(reel_thread_t *t, void *item) { return post(t, item, false); }

void reel_thread_wake(reel_thread_t *t) {
    pthread_mutex_lock(&t->mu);
    t->idle_due = t->o.idle != NULL;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->mu);
}

void reel_thread_pause(reel_thread_t *t) {
    assert(!pthread_equal(pthread_self(), t->th));
    pthread_mutex_lock(&t->mu);
    t->paused++;
    while (t->busy) pthread_cond_wait(&t->between, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

void reel_thread_resume(reel_thread_t *t) {
    pthread_mutex_lock(&t->mu);
    assert(t->paused > 0);
    if (--t->paused == 0) pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->mu);
}

void reel_thread_each(reel_thread_t *t, void (*fn)(void *arg, void *item), void *arg) {
    pthread_mutex_lock(&t->mu);
    assert(t->paused > 0 && !t->busy);
    for (node_t *n = t->head; n; n = n->next) fn(arg, n->item);
    pthread_mutex_unlock(&t->mu);
}

bool reel_thread_stopping(reel_thread_t *t) {
    pthread_mutex_lock(&t->mu);
    bool s = t->stopping;
    pthread_mutex_unlock(&t->mu);
    return s;
}

size_t reel_thread_backlog(reel_thread_t *t) {
    pthread_mutex_lock(&t->mu);
    size_t n = t->backlog;
    pthread_mutex_unlock(&t->mu);
    return n;
}

void reel_thread_stop(reel_thread_t **tp, reel_thread_stop_t how) {
    if (!tp || !*tp) return;
    reel_thread_t *t = *tp;
    assert(!pthread_equal(pthread_self(), t->th));
    pthread_mutex_lock(&t->mu);
    assert(t->paused == 0);
    t->stopping = true;
    t->drain = how == REEL_THREAD_DRAIN;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->th, NULL);
    for (node_t *n = t->head, *next; n; n = next) { /* DISCARD: what never ran */
        next = n->next;
        if (t->o.discard) t->o.discard(t->o.user, n->item);
        free(n);
    }
    pthread_cond_destroy(&t->between);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->mu);
    free(t);
    *tp = NULL;
}

/* ---- lock owners ----------------------------------------------------------- */

static _Thread_local char self_tag; /* its address names the thread */

uintptr_t reel_thread_self(void) { return (uintptr_t)&self_tag; }

void reel_owner_set(reel_owner_t *o) { atomic_store_explicit(&o->id, reel_thread_self(), memory_order_relaxed); }

void reel_owner_clear(reel_owner_t *o) { atomic_store_explicit(&o->id, 0, memory_order_relaxed); }

bool reel_owner_mine(const reel_owner_t *o) {
    return atomic_load_explicit(&o->id, memory_order_relaxed) == reel_thread_self();
}
