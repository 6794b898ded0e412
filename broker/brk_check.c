/* brk_check.c -- the broker's invariants (see brk_check.h): read-only
 * walks over the requests, workers, barriers and upload slots, stopping at
 * the first one broken. */
#include "broker/brk_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "broker/brk_deliver.h"
#include "broker/brk_upload.h"

/* An invariant broken is a bug: REEL_E_INTERNAL. */
#define BROKEN(...) return reel_fail(REEL_E_INTERNAL, __VA_ARGS__)

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

static int worker_index(const brk_t *b, const brk_worker_t *w) {
    for (int i = 0; i < b->n_w; i++)
        if (b->w[i] == w) return i;
    return -1;
}

/* ---- requests ------------------------------------------------------------------ */

/* The live-request list, its id buckets and held_bytes; n_out: how many. */
static int check_list(const brk_t *b, size_t *n_out) {
    size_t n = 0;
    uint64_t bytes = 0;
    const brk_req_t *prev = NULL;
    /* a cycle in the list breaks a prev link, so this walk ends */
    for (const brk_req_t *r = b->reqs; r; prev = r, r = r->next, n++) {
        if (r->prev != prev)
            BROKEN("requests list: request %llu's prev is not the one before it", (unsigned long long)r->id);
        if (!r->msg) BROKEN("request %llu holds no message", (unsigned long long)r->id);
        if (r->id == 0 || r->id >= b->next_id)
            BROKEN("request %llu: an id the broker never gave (next %llu)", (unsigned long long)r->id,
                   (unsigned long long)b->next_id);
        bytes += r->bytes;
    }
    if (bytes != b->held_bytes)
        BROKEN("held_bytes is %llu, the live requests hold %llu", (unsigned long long)b->held_bytes,
               (unsigned long long)bytes);
    size_t in_buckets = 0;
    for (int i = 0; i < BRK_ID_BUCKETS; i++)
        for (const brk_req_t *e = b->by_id[i]; e; e = e->id_next) {
            if (++in_buckets > n) BROKEN("id buckets hold more than the %zu live requests", n);
            if (e->id % BRK_ID_BUCKETS != (uint64_t)i)
                BROKEN("id buckets: request %llu is in bucket %d", (unsigned long long)e->id, i);
        }
    if (in_buckets != n) BROKEN("id buckets hold %zu requests, the list %zu", in_buckets, n);
    /* as many in the buckets as in the list, none past n: each one found
     * in its bucket makes them the same set */
    for (const brk_req_t *r = b->reqs; r; r = r->next) {
        const brk_req_t *e = b->by_id[r->id % BRK_ID_BUCKETS];
        while (e && e != r) e = e->id_next;
        if (!e) BROKEN("id buckets: request %llu is not in its bucket", (unsigned long long)r->id);
    }
    /* the client index: exactly the live requests with a token, no two
     * with the same (client, client id) */
    size_t with_token = 0, in_index = 0;
    for (const brk_req_t *r = b->reqs; r; r = r->next) with_token += r->client != 0;
    for (int i = 0; i < BRK_ID_BUCKETS; i++)
        for (const brk_req_t *e = b->by_client[i]; e; e = e->ck_next) {
            if (++in_index > with_token) BROKEN("client index holds more than the %zu requests with a token", with_token);
            if (!e->client) BROKEN("client index: request %llu has no token", (unsigned long long)e->id);
            if (brk_client_bucket(e->client, e->client_id) != (unsigned)i)
                BROKEN("client index: request %llu is in bucket %d, not its own", (unsigned long long)e->id, i);
            for (const brk_req_t *f = e->ck_next; f; f = f->ck_next)
                if (f->client == e->client && f->client_id == e->client_id)
                    BROKEN("client index: requests %llu and %llu are both client id %llu", (unsigned long long)e->id,
                           (unsigned long long)f->id, (unsigned long long)e->client_id);
        }
    if (in_index != with_token) BROKEN("client index holds %zu requests, %zu have a token", in_index, with_token);
    *n_out = n;
    return 0;
}

/* Each request's state against the queue and its worker. */
static int check_states(const brk_t *b, size_t n) {
    size_t queued = 0;
    for (const brk_req_t *r = b->reqs; r; r = r->next) {
        switch (r->state) {
        case REQ_QUEUED:
            queued++;
            if (r->worker) BROKEN("request %llu is queued but names worker %s", (unsigned long long)r->id, r->worker->route.name);
            break;
        case REQ_INFLIGHT:
        case REQ_ABANDONED:
            if (!r->worker || worker_index(b, r->worker) < 0)
                BROKEN("request %llu is %s on a worker that is not registered", (unsigned long long)r->id,
                       r->state == REQ_INFLIGHT ? "in flight" : "abandoned");
            break;
        default: BROKEN("request %llu has state %d", (unsigned long long)r->id, (int)r->state);
        }
    }
    size_t q = brk_queue_len(&b->queue);
    if (q != queued) BROKEN("the queue holds %zu requests, %zu are queued", q, queued);
    if (q == 0) return 0;
    /* every queue entry a live QUEUED request, none twice: sorted copies */
    const void **live = malloc(n * sizeof *live), **inq = malloc(q * sizeof *inq);
    if (!live || !inq) { /* out of memory: this part is skipped */
        free(live);
        free(inq);
        return 0;
    }
    size_t k = 0;
    for (const brk_req_t *r = b->reqs; r; r = r->next) live[k++] = r;
    for (size_t i = 0; i < q; i++) inq[i] = brk_queue_at(&b->queue, i);
    qsort(live, n, sizeof *live, cmp_ptr);
    qsort(inq, q, sizeof *inq, cmp_ptr);
    int rc = 0;
    for (size_t i = 0; i < q && rc == 0; i++) {
        const brk_req_t *const *hit = bsearch(&inq[i], live, n, sizeof *live, cmp_ptr);
        if (!hit) {
            rc = reel_fail(REEL_E_INTERNAL, "the queue holds a request that is not live");
        } else if ((*hit)->state != REQ_QUEUED) {
            rc = reel_fail(REEL_E_INTERNAL, "the queue holds request %llu, which is not queued",
                           (unsigned long long)(*hit)->id);
        } else if (i > 0 && inq[i] == inq[i - 1]) {
            rc = reel_fail(REEL_E_INTERNAL, "the queue holds request %llu twice", (unsigned long long)(*hit)->id);
        }
    }
    free(live);
    free(inq);
    return rc;
}

/* ---- workers ---------------------------------------------------------------------- */

static int check_workers(const brk_t *b) {
    if (b->n_w < 0 || b->n_w > b->cap_w) BROKEN("%d workers in an array of %d", b->n_w, b->cap_w);
    for (int i = 0; i < b->n_w; i++) {
        const brk_worker_t *w = b->w[i];
        if (!w) BROKEN("worker slot %d is empty", i);
        if (w->dead) BROKEN("worker %s is dead (%s) but still registered", w->route.name, w->dead_why ? w->dead_why : "?");
        if (w->n_syncs < 0 || w->n_syncs > BRK_MAX_COMPONENTS || w->n_keys < 0 || w->n_keys > BRK_KEYS_RECENT ||
            w->n_configs < 0 || w->n_configs > BRK_MAX_MODELS || w->route.n_versions < 0 ||
            w->route.n_versions > BRK_MAX_COMPONENTS || w->route.n_models < 0 || w->route.n_models > BRK_MAX_MODELS)
            BROKEN("worker %s: a count past its array", w->route.name);
        for (int j = 0; j < i; j++) {
            if (!strcmp(b->w[j]->route.name, w->route.name)) BROKEN("two workers are named %s", w->route.name);
            if (b->w[j]->ident.n == w->ident.n && !memcmp(b->w[j]->ident.b, w->ident.b, w->ident.n))
                BROKEN("workers %s and %s share a routing identity", b->w[j]->route.name, w->route.name);
        }
        int held = 0;
        for (const brk_req_t *r = b->reqs; r; r = r->next) held += r->worker == w;
        if (held != w->route.inflight)
            BROKEN("worker %s: inflight is %d, it holds %d requests", w->route.name, w->route.inflight, held);
        if (w->route.inflight > w->route.max_inflight)
            BROKEN("worker %s: inflight %d past its max_inflight %d", w->route.name, w->route.inflight,
                   w->route.max_inflight);
    }
    return 0;
}

/* ---- syncs ------------------------------------------------------------------------- */

static const brk_worker_t *named(const brk_t *b, const char *name) {
    for (int i = 0; i < b->n_w; i++)
        if (!strcmp(b->w[i]->route.name, name)) return b->w[i];
    return NULL;
}

static int check_barrier(const brk_t *b, const brk_barrier_t *s) {
    const char *c = s->component;
    unsigned long long v = (unsigned long long)s->version;
    if (s->n_trainers < 1 || !s->trainers) BROKEN("barrier %s v%llu answers no trainer", c, v);
    if (s->n_trainers > BRK_SYNC_TRAINERS_MAX)
        BROKEN("barrier %s v%llu answers %d trainers, past %d", c, v, s->n_trainers, BRK_SYNC_TRAINERS_MAX);
    if (s->n < 0 || (s->n > 0 && !s->m)) BROKEN("barrier %s v%llu: %d members and no array", c, v, s->n);
    if (s->sync && (s->sync->version != s->version || strcmp(s->sync->component, c)))
        BROKEN("barrier %s v%llu holds the SYNC of %s v%llu", c, v, s->sync->component,
               (unsigned long long)s->sync->version);
    for (const brk_barrier_t *t = s->next; t; t = t->next)
        if (t->version == s->version && !strcmp(t->component, c)) BROKEN("two barriers for %s v%llu", c, v);
    bool waiting = false;
    for (int i = 0; i < s->n; i++) {
        const brk_member_t *mb = &s->m[i];
        if (mb->state != BRK_MEMBER_WAITING && mb->state != BRK_MEMBER_APPLIED && mb->state != BRK_MEMBER_FAILED)
            BROKEN("barrier %s v%llu: member %s has state %d", c, v, mb->worker, mb->state);
        for (int j = 0; j < i; j++)
            if (!strcmp(s->m[j].worker, mb->worker)) BROKEN("barrier %s v%llu lists worker %s twice", c, v, mb->worker);
        if (mb->undelivered && mb->state != BRK_MEMBER_WAITING)
            BROKEN("barrier %s v%llu: member %s is undelivered in state %d", c, v, mb->worker, mb->state);
        if (mb->state != BRK_MEMBER_WAITING) continue;
        waiting = true;
        /* a worker dropped fails its entries first (brk_sync_worker_lost) */
        const brk_worker_t *w = named(b, mb->worker);
        if (!w) BROKEN("barrier %s v%llu waits for worker %s, which is not registered", c, v, mb->worker);
        /* (one whose SYNC could not be sent waits for it to come back) */
        for (int k = 0; k < w->n_syncs && !mb->undelivered; k++)
            if (!strcmp(w->syncs[k].component, c) && w->syncs[k].sent < s->version)
                BROKEN("barrier %s v%llu waits for worker %s, which was sent only v%llu", c, v, mb->worker,
                       (unsigned long long)w->syncs[k].sent);
    }
    /* (a held barrier waits for workers that have not registered yet: a
     * resend of a sync a broker restart interrupted, until hold_until_ms) */
    if (s->hold && s->hold_until_ms <= 0) BROKEN("barrier %s v%llu is held with no end", c, v);
    if (!waiting && !s->hold) BROKEN("barrier %s v%llu waits for nobody but was not answered", c, v);
    return 0;
}

static int check_syncs(const brk_t *b) {
    if (b->n_cur < 0 || b->n_cur > BRK_MAX_COMPONENTS) BROKEN("%d current components", b->n_cur);
    for (int i = 0; i < b->n_cur; i++) {
        const brk_current_t *c = &b->cur[i];
        for (int j = 0; j < i; j++)
            if (!strcmp(b->cur[j].component, c->component)) BROKEN("component %s is current twice", c->component);
        if ((c->version == 0) != (c->sync == NULL))
            BROKEN("current %s is v%llu %s a SYNC", c->component, (unsigned long long)c->version,
                   c->sync ? "with" : "without");
        if (c->sync && (c->sync->version != c->version || strcmp(c->sync->component, c->component)))
            BROKEN("current %s v%llu holds the SYNC of %s v%llu", c->component, (unsigned long long)c->version,
                   c->sync->component, (unsigned long long)c->sync->version);
    }
    for (const brk_barrier_t *s = b->barriers; s; s = s->next)
        if (check_barrier(b, s)) return -1;
    return 0;
}

/* ---- all of it ----------------------------------------------------------------------- */

int brk_check(const brk_t *b) {
    size_t n = 0;
    if (check_list(b, &n) || check_states(b, n) || check_workers(b) || check_syncs(b) || brk_upload_check(b) ||
        brk_deliver_check(b))
        return -1;
    return 0;
}

void brk_check_or_die(const brk_t *b, const char *where) {
    if (brk_check(b) == 0) return;
    fprintf(stderr, "broker invariant violated after %s: %s\n", where, reel_err_text());
    fflush(stderr);
    abort();
}
