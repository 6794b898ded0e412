/* wrk_invariants.c -- the executor's invariants (wrk_exec_state.h), in the
 * capture cache's style: each check names the first rule that does not
 * hold, through reel_fail (REEL_E_INTERNAL), so tests can corrupt a state
 * and read which. */
#include <stdlib.h>
#include "base/error.h"
#include "worker/wrk_exec_state.h"

#define INV(cond, ...)                                      \
    do {                                                    \
        if (!(cond)) return reel_fail(REEL_E_INTERNAL, __VA_ARGS__);         \
    } while (0)

int wrk_job_invariants(const wrk_job_t *j) {
    INV(j->n >= 1, "job %llu: %d samples", (unsigned long long)j->id, j->n);
    INV(j->at >= 0 && j->at <= j->n, "job %llu: its sub-batch starts at sample %d of %d", (unsigned long long)j->id,
        j->at, j->n);
    INV(j->chunk >= 0 && j->chunk <= j->n, "job %llu: batches of %d samples in a job of %d", (unsigned long long)j->id,
        j->chunk, j->n);
    INV(!j->req || j->counted, "job %llu: a request running but not counted in running", (unsigned long long)j->id);
    if (j->group) {
        const wrk_group_t *g = j->group;
        INV(j->base >= 0 && j->base + j->n <= g->n, "job %llu: a part holding samples %d..%d of a group of %d",
            (unsigned long long)j->id, j->base, j->base + j->n - 1, g->n);
    }
    return 0;
}

int wrk_group_invariants(const wrk_group_t *g) {
    INV(g->parts >= 1 && g->parts_left >= 0 && g->parts_left <= g->parts, "group: %d parts left of %d", g->parts_left,
        g->parts);
    INV(g->parts_ok >= 0 && g->parts_ok <= g->parts - g->parts_left, "group: %d parts ran well, but %d of %d finished",
        g->parts_ok, g->parts - g->parts_left, g->parts);
    INV(g->progress_done >= 0 && g->progress_done <= g->progress_total, "group: progress %d of %d", g->progress_done,
        g->progress_total);
    return 0;
}

int wrk_stream_invariants(const wrk_stream_t *st, int queued) {
    int n = 0;
    for (const wrk_job_t *j = st->active; j; j = j->next, n++) {
        if (wrk_job_invariants(j) != 0) return -1;
        if (!j->stg) continue;
        int slot = -1;
        for (int i = 0; i < st->npool; i++)
            if (st->pool[i] == j->stg) slot = i;
        /* A set of its own (the pool was full) is freed with the request; one
         * of the pool must be marked busy, or another job would take it. */
        INV(slot < 0 || st->busy[slot], "stream %d: job %llu runs in staging set %d, which is not marked busy",
            st->idx, (unsigned long long)j->id, slot);
        for (const wrk_job_t *k = j->next; k; k = k->next)
            INV(k->stg != j->stg, "stream %d: jobs %llu and %llu share a staging set", st->idx,
                (unsigned long long)j->id, (unsigned long long)k->id);
    }
    INV(n == st->nactive, "stream %d: %d jobs in the round, nactive says %d", st->idx, n, st->nactive);
    INV(st->npool >= 0 && st->npool <= WRK_STG_POOL, "stream %d: %d staging sets", st->idx, st->npool);
    for (int i = 0; i < st->npool; i++) {
        bool used = false;
        for (const wrk_job_t *j = st->active; j; j = j->next) used |= j->stg == st->pool[i];
        INV(!st->busy[i] || used, "stream %d: staging set %d is marked busy but no active job runs in it", st->idx, i);
        INV(st->used[i] <= st->clock, "stream %d: staging set %d taken after the clock", st->idx, i);
    }
    int load = atomic_load(&((wrk_stream_t *)st)->load);
    INV(load >= n + queued, "stream %d: load %d, but %d jobs active and %d queued", st->idx, load, n, queued);
    /* the prewarm list: what is left is counted, and every key left is one
     * a request could run on this stream */
    pthread_mutex_t *mu = &((wrk_stream_t *)st)->pw_mu;
    pthread_mutex_lock(mu);
    int at = st->pw_at, np = st->npw, left = atomic_load(&((wrk_stream_t *)st)->pw_left), bad = -1;
    for (int i = at; i < np && bad < 0; i++)
        if (st->pw[i].rows < 0 || st->pw[i].rows == 1 || (st->pw[i].rows >= 2 && tdit_shape_batch(&st->pw[i].shape) != 1) ||
            tdit_shape_validate(&st->pw[i].shape) != 0)
            bad = i;
    pthread_mutex_unlock(mu);
    INV(at >= 0 && at <= np && (np == 0 || st->pw), "stream %d: prewarm list at %d of %d", st->idx, at, np);
    INV(left == np - at, "stream %d: %d keys left to prewarm, the list says %d", st->idx, left, np - at);
    INV(bad < 0, "stream %d: prewarm key %d is no shape a request runs", st->idx, bad);
    return 0;
}

/* ---- the whole executor, paused --------------------------------------------- */

typedef struct {
    const wrk_job_t **jobs;
    int n, cap;
    int bad;                     /* a queued job that already started */
} seen_t;

static void see_queued(void *arg, void *item) {
    seen_t *s = arg;
    const wrk_job_t *j = item;
    if (j->req || j->counted) s->bad++;
    if (s->n < s->cap) s->jobs[s->n++] = j;
}

static int check_all(wrk_exec_t *x, seen_t *s) {
    for (int i = 0; i < x->n; i++) {
        wrk_stream_t *st = &x->s[i];
        int before = s->n;
        if (st->th) reel_thread_each(st->th, see_queued, s);
        INV(!s->bad, "stream %d: a queued job has started", i);
        int queued = s->n - before;
        for (const wrk_job_t *j = st->active; j && s->n < s->cap; j = j->next) s->jobs[s->n++] = j;
        if (wrk_stream_invariants(st, queued) != 0) return -1;
        int load = atomic_load(&st->load);
        INV(load == st->nactive + queued, "stream %d: load %d, but %d jobs active and %d queued", i, load,
            st->nactive, queued);
    }
    for (int k = 0; k < s->n; k++)
        if (wrk_job_invariants(s->jobs[k]) != 0) return -1;
    int running = 0;
    for (int k = 0; k < s->n; k++) {
        const wrk_job_t *j = s->jobs[k];
        if (!j->group) {
            running += j->counted;
            continue;
        }
        bool first = true; /* each group once, at its first part */
        for (int m = 0; m < k; m++) first &= s->jobs[m]->group != j->group;
        if (!first) continue;
        wrk_group_t *g = j->group;
        int alive = 0;
        for (int m = k; m < s->n; m++) alive += s->jobs[m]->group == g;
        pthread_mutex_lock(&g->mu);
        int left = g->parts_left, ok = wrk_group_invariants(g);
        bool started = g->started;
        pthread_mutex_unlock(&g->mu);
        if (ok != 0) return -1;
        INV(left == alive, "a group has %d parts left, but %d are on the streams", left, alive);
        if (started) running += left;
    }
    int r = atomic_load(&x->w->running);
    INV(r == running, "running is %d, but %d requests (and group parts) are running", r, running);
    return 0;
}

int wrk_exec_invariants(wrk_exec_t *x) {
    int cap = 0;
    for (int i = 0; i < x->n; i++) cap += atomic_load(&x->s[i].load);
    seen_t s = { calloc((size_t)cap + 1, sizeof *s.jobs), 0, cap, 0 };
    if (!s.jobs) return 0; /* out of memory: nothing checked, nothing wrong found */
    for (int i = 0; i < x->n; i++)
        if (x->s[i].th) reel_thread_pause(x->s[i].th);
    int rc = check_all(x, &s);
    for (int i = 0; i < x->n; i++)
        if (x->s[i].th) reel_thread_resume(x->s[i].th);
    free(s.jobs);
    return rc;
}
