/* brk_catq.c -- the catalog writer thread and its bounded queue (see
 * brk_catq.h). The routing loop only pushes; this thread alone touches
 * SQLite, in batches, so a slow disk delays the catalog, never a reply.
 *
 * The thread is a base/thread.h worker: a push posts the record, `run`
 * moves it onto the thread's own lists (kept, events), `idle` writes a
 * batch when one is due, prunes when that is due, and answers how long
 * until the next due time (the batch window, a retry's pause, the next
 * pruning round); a draining stop runs every record posted, and `leave`
 * writes what is left. What the pushes and the readers share with the
 * thread -- the counts behind the bounds, the quotas, the counters, the
 * retention settings -- sits under one mutex here. A push wakes the thread
 * only when it starts the batch clock (the first record waiting) or
 * completes a batch (BRK_CATQ_BATCH waiting); the others are posted quiet,
 * so a steady stream costs a wake per batch, not one per record.
 *
 * A queued record is one allocation: the record (cat_rec_t, the union of
 * every kind of catalog/catalog_records.h) followed by copies of its
 * strings. The pushes are generated from the same tables as the writers,
 * and the thread hands each record to cat_write as it is. */
#include "broker/brk_catq.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/thread.h"
#include "broker/brk_log.h"

typedef struct cq_item {
    struct cq_item *next;
    int quota;                 /* events: its worker's slot in quota[]; -1 for kept records */
    cat_rec_t rec;             /* its strings point after the item */
} cq_item_t;

typedef struct {
    cq_item_t *head, *tail;
    size_t n;
} cq_list_t;

/* Events queued per worker (a worker past its quota is shed, not the others). */
typedef struct {
    char worker[64];
    size_t n;
} cq_quota_t;

#define CQ_QUOTAS 64               /* workers tracked; later ones share the last slot */

struct brk_catq {
    reel_thread_t *th;         /* the writer; NULL without a catalog */
    pthread_mutex_t mu;
    /* guarded by mu (pushes, readers and the writer): */
    size_t n_kept, n_events;   /* records pushed and not taken into a batch (a refused batch counts again) */
    size_t max_kept, max_events, worker_quota;
    cq_quota_t quota[CQ_QUOTAS]; /* events pushed and not yet written, per worker */
    int n_quota;
    struct timespec oldest;    /* when the oldest record waiting was queued */
    uint64_t shed;             /* events not queued: their worker over its quota, or no room */
    uint64_t failures;         /* batches the store refused for now (retried) */
    uint64_t refused;          /* records SQLite refused outright (not retried) */
    uint64_t batches;
    double retain_s;           /* retention: raw rows older than this go (0: kept) */
    int64_t max_rows;          /* ... or past this many per table (0: no cap) */
    struct timespec next_prune; /* when the next pruning transaction is due */
    uint64_t pruned;           /* raw rows pruned so far */
    /* the writer thread's alone (destroy reads `lost` after the join): */
    cat_t *cat;
    cq_list_t kept, events;    /* records run took, waiting for a batch; kept ones are never shed */
    int tries;                 /* refusals in a row of the batch in front */
    bool busy;                 /* the last refusal was a lock held elsewhere (read before its rollback) */
    struct timespec retry_at;  /* tries > 0: no batch before this */
    uint64_t pruned_run;       /* raw rows pruned in the current round (logged when it ends) */
    uint64_t prune_failures;
    uint64_t lost;             /* records given up at shutdown (the store never came back) */
};

static double now_unix(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The first few and then one in a thousand: a broken disk must not flood
 * the log. */
static bool worth_logging(uint64_t n) { return n <= 5 || n % 1000 == 0; }

static bool is_event(cat_kind_t k) {
    return k == CAT_K_CAPTURE || k == CAT_K_REPLAYS || k == CAT_K_EVICTION || k == CAT_K_DECLINE ||
           k == CAT_K_ARTIFACT_SEEN || k == CAT_K_ARTIFACT_KEY;
}

/* The worker an event is about ("" for the artifacts a worker scanned). */
static const char *event_worker(const cat_rec_t *r) {
    switch (r->kind) {
    case CAT_K_CAPTURE: return r->u.capture.worker;
    case CAT_K_REPLAYS: return r->u.replays.worker;
    case CAT_K_EVICTION: return r->u.eviction.worker;
    case CAT_K_DECLINE: return r->u.decline.worker;
    case CAT_K_ARTIFACT_KEY: return r->u.artifact_key.worker;
    default: return "";
    }
}

/* ---- the lists (the writer's) and the quotas (mu held) ------------------------ */

static void list_push(cq_list_t *l, cq_item_t *it) {
    it->next = NULL;
    if (l->tail) l->tail->next = it;
    else l->head = it;
    l->tail = it;
    l->n++;
}

/* Puts chain (n items, in order) back in front of l. */
static void list_unshift(cq_list_t *l, cq_item_t *chain, cq_item_t *last, size_t n) {
    if (!chain) return;
    last->next = l->head;
    if (!l->head) l->tail = last;
    l->head = chain;
    l->n += n;
}

/* Takes up to max items off the front of l; *n gets how many. */
static cq_item_t *list_take(cq_list_t *l, size_t max, size_t *n) {
    cq_item_t *chain = l->head, *last = chain;
    *n = 0;
    if (!chain || !max) return NULL;
    *n = 1;
    while (last->next && *n < max) {
        last = last->next;
        (*n)++;
    }
    l->head = last->next;
    if (!l->head) l->tail = NULL;
    last->next = NULL;
    l->n -= *n;
    return chain;
}

static cq_item_t *chain_last(cq_item_t *c) {
    while (c && c->next) c = c->next;
    return c;
}

static int quota_slot(brk_catq_t *q, const char *worker) {
    for (int i = 0; i < q->n_quota; i++)
        if (!strcmp(q->quota[i].worker, worker)) return i;
    if (q->n_quota == CQ_QUOTAS) return CQ_QUOTAS - 1;
    cq_quota_t *s = &q->quota[q->n_quota];
    snprintf(s->worker, sizeof s->worker, "%s", worker);
    s->n = 0;
    return q->n_quota++;
}

static void free_chain(cq_item_t *c) {
    while (c) {
        cq_item_t *next = c->next;
        free(c);
        c = next;
    }
}

static struct timespec mono_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t;
}

static struct timespec mono_after(struct timespec t, long ms) {
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static bool reached(const struct timespec *now, const struct timespec *t) {
    return now->tv_sec > t->tv_sec || (now->tv_sec == t->tv_sec && now->tv_nsec >= t->tv_nsec);
}

/* Milliseconds from now to t, rounded up so that idle never answers 0 ("at
 * once") for a time not yet reached. */
static int64_t ms_until(const struct timespec *now, const struct timespec *t) {
    int64_t ns = (int64_t)(t->tv_sec - now->tv_sec) * 1000000000 + (t->tv_nsec - now->tv_nsec);
    int64_t ms = (ns + 999999) / 1000000;
    return ms > 0 ? ms : 1;
}

/* ---- the writer thread ------------------------------------------------------ */

/* Writes chain in one transaction. 0; -1 when the store refused it for now
 * (nothing of it is kept: the caller queues it again). A record SQLite
 * refuses outright is skipped and counted. */
static int write_batch(brk_catq_t *q, cq_item_t *chain) {
    uint64_t refused = 0;
    if (cat_begin(q->cat) != 0) goto failed;
    for (cq_item_t *it = chain; it; it = it->next) {
        if (cat_write(q->cat, &it->rec) == 0) continue;
        if (cat_failure_transient(q->cat)) goto failed;
        if (worth_logging(++refused)) brk_log("catalog: a record was refused: %s", reel_err_text());
    }
    if (cat_commit(q->cat) != 0) {
        if (cat_failure_transient(q->cat)) goto failed;
        /* The store refused what the batch adds up to for good (its
         * summaries): each record again as a batch of its own, so a bad
         * record costs itself, never the batch and the queue behind it. */
        brk_log("catalog: a batch was refused (%s); writing its records one by one", reel_err_text());
        cat_rollback(q->cat);
        refused = 0;
        for (cq_item_t *it = chain; it; it = it->next)
            if (cat_write(q->cat, &it->rec) != 0 && worth_logging(++refused))
                brk_log("catalog: a record was refused: %s", reel_err_text());
    }
    pthread_mutex_lock(&q->mu);
    q->refused += refused;
    pthread_mutex_unlock(&q->mu);
    return 0;
failed:
    q->busy = cat_failure_busy(q->cat); /* the rollback clears what the failure said */
    cat_rollback(q->cat);
    return -1;
}

/* Takes the next batch off the lists -- up to BRK_CATQ_BATCH_MAX records,
 * kept ones first, so an event flood never delays a request's row -- and
 * writes it in one transaction. 0 when written (its records freed); -1
 * when the store refused it for now: it is back in front of its lists as
 * it was taken, counted and logged, and tries has gone up by one. */
static int write_next(brk_catq_t *q) {
    size_t nk, ne;
    cq_item_t *kept = list_take(&q->kept, BRK_CATQ_BATCH_MAX, &nk);
    cq_item_t *events = list_take(&q->events, BRK_CATQ_BATCH_MAX - nk, &ne);
    pthread_mutex_lock(&q->mu);
    q->n_kept -= nk;
    q->n_events -= ne;
    if (q->n_kept || q->n_events) q->oldest = mono_now(); /* the rest waits from now */
    q->batches++;
    pthread_mutex_unlock(&q->mu);
    cq_item_t *lk = chain_last(kept);
    if (lk) lk->next = events;
    int rc = write_batch(q, lk ? kept : events);
    if (lk) lk->next = NULL; /* the two lists apart again */
    pthread_mutex_lock(&q->mu);
    if (rc == 0) {
        for (cq_item_t *e = events; e; e = e->next) q->quota[e->quota].n--;
        pthread_mutex_unlock(&q->mu);
        free_chain(kept);
        free_chain(events);
        q->tries = 0;
        return 0;
    }
    q->n_kept += nk;
    q->n_events += ne;
    q->failures++;
    if (worth_logging(q->failures))
        brk_log("catalog: writing failed (%llu so far), %zu records kept for a retry: %s",
                (unsigned long long)q->failures, q->n_kept + q->n_events, reel_err_text());
    bool log = worth_logging(q->failures);
    pthread_mutex_unlock(&q->mu);
    list_unshift(&q->events, events, chain_last(events), ne);
    list_unshift(&q->kept, kept, lk, nk);
    q->tries++;
    /* Anything but a lock held elsewhere may have left the connection
     * unusable for good (SQLite keeps a WAL connection that read a header
     * that was not a database's failing after the file is mended): the
     * retry goes on a fresh one. Until the file opens again the old one
     * stays, and the next refusal tries once more. */
    if (!q->busy && cat_reopen(q->cat) != 0 && log)
        brk_log("catalog: opening the catalog again failed: %s", reel_err_text());
    return -1;
}

/* (mu held) */
static bool retaining(const brk_catq_t *q) { return q->retain_s > 0 || q->max_rows > 0; }

/* (mu held) */
static void prune_after(brk_catq_t *q, long ms) { q->next_prune = mono_after(mono_now(), ms); }

/* One pruning transaction. Once a round deleted nothing more it is logged
 * and the next waits BRK_CATQ_PRUNE_MS; while rows are left the next is
 * due at once (after any batch waiting). */
static void prune_step(brk_catq_t *q) {
    pthread_mutex_lock(&q->mu);
    double before = q->retain_s > 0 ? now_unix() - q->retain_s : 0;
    int64_t max_rows = q->max_rows;
    pthread_mutex_unlock(&q->mu);
    int64_t n = cat_prune(q->cat, before, max_rows, BRK_CATQ_PRUNE_BATCH);
    pthread_mutex_lock(&q->mu);
    if (n < 0) {
        if (worth_logging(++q->prune_failures)) brk_log("catalog: pruning failed: %s", reel_err_text());
        prune_after(q, BRK_CATQ_PRUNE_MS);
    } else if (n > 0) {
        q->pruned += (uint64_t)n;
        q->pruned_run += (uint64_t)n;
        prune_after(q, 0);
    } else {
        if (q->pruned_run)
            brk_log("catalog: pruned %llu raw rows (older than the retention or past the row cap)",
                    (unsigned long long)q->pruned_run);
        q->pruned_run = 0;
        prune_after(q, BRK_CATQ_PRUNE_MS);
    }
    pthread_mutex_unlock(&q->mu);
}

/* True when retention is on and its next transaction is due. */
static bool prune_due(brk_catq_t *q, const struct timespec *now, struct timespec *next) {
    pthread_mutex_lock(&q->mu);
    bool on = retaining(q), due = on && reached(now, &q->next_prune);
    if (next) *next = on ? q->next_prune : (struct timespec){ -1, 0 };
    pthread_mutex_unlock(&q->mu);
    return due;
}

/* Takes a pushed record onto the lists; idle decides when it is written. */
static void writer_run(void *arg, void *item) {
    brk_catq_t *q = arg;
    cq_item_t *it = item;
    list_push(it->quota < 0 ? &q->kept : &q->events, it);
}

/* Between records (every record pushed so far is on the lists): the batch
 * once it is due -- BRK_CATQ_BATCH records waiting or the oldest
 * BRK_CATQ_WAIT_MS old, and no refused batch's pause running (a refusal
 * pauses BRK_CATQ_RETRY_MS, doubling to 16x, so a full disk costs a few
 * writes a second, not a spinning core) -- then at most one pruning
 * transaction; with nothing waiting, pruning while it is due. Returns the
 * milliseconds to the next due time, 0 for at once, -1 for none (until a
 * push or brk_catq_retain). Can't fail: what fails is retried or counted. */
static int64_t writer_idle(void *arg) {
    brk_catq_t *q = arg;
    struct timespec now = mono_now(), next;
    if (!q->kept.n && !q->events.n) {
        if (prune_due(q, &now, &next)) {
            prune_step(q);
            return 0;
        }
        return next.tv_sec < 0 ? -1 : ms_until(&now, &next);
    }
    if (q->tries && !reached(&now, &q->retry_at)) return ms_until(&now, &q->retry_at);
    pthread_mutex_lock(&q->mu);
    struct timespec due = mono_after(q->oldest, BRK_CATQ_WAIT_MS);
    pthread_mutex_unlock(&q->mu);
    if (q->kept.n + q->events.n < BRK_CATQ_BATCH && !reached(&now, &due)) return ms_until(&now, &due);
    if (write_next(q) != 0) {
        q->retry_at = mono_after(mono_now(), (long)BRK_CATQ_RETRY_MS << (q->tries < 5 ? q->tries - 1 : 4));
        return 0;
    }
    /* Under steady load the lists are never empty: pruning takes its turn
     * between batches (not once stopping: leave writes what is left). q->th
     * is set: a batch needs a push, and pushes come after brk_catq_new. */
    now = mono_now();
    if (!reel_thread_stopping(q->th) && prune_due(q, &now, NULL)) prune_step(q);
    return 0;
}

/* The last thing on the thread, once a draining stop has run every record
 * pushed: writes what is left, batch after batch, without pausing. A
 * batch the store keeps refusing is given up with the rest after
 * BRK_CATQ_STOP_TRIES refusals in a row (refusals before the stop count):
 * `lost`, which destroy logs. */
static void writer_leave(void *arg) {
    brk_catq_t *q = arg;
    while (q->kept.n || q->events.n)
        if (write_next(q) != 0 && q->tries >= BRK_CATQ_STOP_TRIES) break;
    q->lost = q->kept.n + q->events.n;
    free_chain(q->kept.head);
    free_chain(q->events.head);
    q->kept = q->events = (cq_list_t){ NULL, NULL, 0 };
    pthread_mutex_lock(&q->mu);
    q->n_kept = q->n_events = 0;
    pthread_mutex_unlock(&q->mu);
}

/* A record whose post failed (out of memory); enqueue, which holds mu,
 * uncounts it. */
static void writer_discard(void *arg, void *item) {
    (void)arg;
    free(item);
}

/* ---- lifecycle ----------------------------------------------------------------- */

brk_catq_t *brk_catq_new(cat_t **cat, size_t max) {
    brk_catq_t *q = calloc(1, sizeof *q);
    if (!q) goto err;
    q->max_kept = q->max_events = max;
    q->worker_quota = max / 4 ? max / 4 : 1;
    if (!cat || !*cat) return q; /* no catalog: pushes are dropped */
    if (pthread_mutex_init(&q->mu, NULL)) goto err;
    q->cat = *cat;
    reel_thread_opts_t o = { .name = "catalog",
                             .user = q,
                             .run = writer_run,
                             .idle = writer_idle,
                             .discard = writer_discard,
                             .leave = writer_leave,
                             .block_signals = true /* signals are the routing thread's */ };
    q->th = reel_thread_start(&o);
    if (!q->th) {
        pthread_mutex_destroy(&q->mu);
        goto err;
    }
    *cat = NULL;
    return q;
err:
    free(q);
    if (cat) cat_close(cat);
    return NULL;
}

void brk_catq_destroy(brk_catq_t **qp) {
    if (!qp || !*qp) return;
    brk_catq_t *q = *qp;
    if (q->th) {
        reel_thread_stop(&q->th, REEL_THREAD_DRAIN); /* every record pushed reaches the lists; leave writes them */
        cat_close(&q->cat);
        pthread_mutex_destroy(&q->mu);
        if (q->shed) brk_log("catalog: %llu events shed (their worker over its quota)", (unsigned long long)q->shed);
        if (q->lost)
            brk_log("catalog: %llu records could not be written before the exit (the store kept refusing them)",
                    (unsigned long long)q->lost);
    }
    free(q);
    *qp = NULL;
}

static uint64_t read_locked(brk_catq_t *q, const uint64_t *v) {
    if (!q || !q->th) return 0;
    pthread_mutex_lock(&q->mu);
    uint64_t x = *v;
    pthread_mutex_unlock(&q->mu);
    return x;
}

void brk_catq_retain(brk_catq_t *q, double retain_seconds, int64_t max_rows) {
    if (!q || !q->th) return;
    pthread_mutex_lock(&q->mu);
    q->retain_s = retain_seconds > 0 ? retain_seconds : 0;
    q->max_rows = max_rows > 0 ? max_rows : 0;
    prune_after(q, 0);
    pthread_mutex_unlock(&q->mu);
    reel_thread_wake(q->th);
}

uint64_t brk_catq_pruned(brk_catq_t *q) { return q ? read_locked(q, &q->pruned) : 0; }
uint64_t brk_catq_dropped(brk_catq_t *q) { return q ? read_locked(q, &q->shed) : 0; }
uint64_t brk_catq_batches(brk_catq_t *q) { return q ? read_locked(q, &q->batches) : 0; }
uint64_t brk_catq_failures(brk_catq_t *q) { return q ? read_locked(q, &q->failures) : 0; }
uint64_t brk_catq_refused(brk_catq_t *q) { return q ? read_locked(q, &q->refused) : 0; }

size_t brk_catq_pending(brk_catq_t *q) {
    if (!q || !q->th) return 0;
    pthread_mutex_lock(&q->mu);
    size_t n = q->n_kept + q->n_events;
    pthread_mutex_unlock(&q->mu);
    return n;
}

bool brk_catq_behind(brk_catq_t *q) {
    if (!q || !q->th) return false;
    pthread_mutex_lock(&q->mu);
    bool behind = q->n_kept >= q->max_kept;
    pthread_mutex_unlock(&q->mu);
    return behind;
}

/* ---- pushing ------------------------------------------------------------------- */

/* Counts it and posts it to the writer (NULL: out of memory, counted as
 * shed). A kept record always queues (the loop stops admitting requests
 * while brk_catq_behind); an event is shed when its worker has
 * worker_quota events waiting or max_events wait. The post wakes the
 * writer for the first record waiting (to start its clock) and for the one
 * that makes a batch; the others are quiet. It is made under mu, so that
 * the counts are the records on the writer's lists and in its queue: a
 * push that finds none waiting is the one that wakes it, and no record
 * sits in the queue of a writer asleep with no due time. */
static void enqueue(brk_catq_t *q, cq_item_t *it) {
    pthread_mutex_lock(&q->mu);
    bool ok = it != NULL;
    if (ok && is_event(it->rec.kind)) {
        int slot = quota_slot(q, event_worker(&it->rec));
        ok = q->quota[slot].n < q->worker_quota && q->n_events < q->max_events;
        if (ok) {
            it->quota = slot;
            q->quota[slot].n++;
            q->n_events++;
        }
    } else if (ok) {
        it->quota = -1;
        q->n_kept++;
    }
    if (ok) {
        size_t n = q->n_kept + q->n_events;
        int slot = it->quota;
        if (n == 1) q->oldest = mono_now();
        int rc = n == 1 || n == BRK_CATQ_BATCH ? reel_thread_post(q->th, it) : reel_thread_post_quiet(q->th, it);
        it = NULL; /* the writer's, or freed by writer_discard */
        if (rc != 0) {
            if (slot < 0) {
                q->n_kept--;
            } else {
                q->n_events--;
                q->quota[slot].n--;
            }
            if (worth_logging(++q->shed))
                brk_log("catalog: a record was shed (%llu so far): %s", (unsigned long long)q->shed, reel_err_text());
        }
    } else if (worth_logging(++q->shed)) {
        brk_log("catalog: an event was shed (%llu so far): its worker has %zu events waiting to be written",
                (unsigned long long)q->shed, q->worker_quota);
    }
    pthread_mutex_unlock(&q->mu);
    free(it);
}

/* Copies string *s to p and points *s at the copy; returns where the next
 * one goes. */
static char *copy_str(const char **s, char *p) {
    if (!*s) return p;
    size_t n = strlen(*s) + 1;
    memcpy(p, *s, n);
    *s = p;
    return p + n;
}

/* Per field type: taking the parameter into the record (and counting the
 * bytes its string needs), then copying the string into the item. */
#define CQ_F_SET(T, m) CQ_SET_##T(m)
#define CQ_SET_TEXT(m) x->m = m ? m : ""; extra += strlen(x->m) + 1;
#define CQ_SET_OPT(m) x->m = m && *m ? m : NULL; extra += x->m ? strlen(x->m) + 1 : 0;
#define CQ_SET_INT(m) x->m = m;
#define CQ_SET_U64(m) x->m = m;
#define CQ_SET_F64(m) x->m = m;
#define CQ_SET_BOOL(m) x->m = m;
#define CQ_SET_TIME(m) x->m = now_unix();
#define CQ_F_COPY(T, m) CQ_COPY_##T(m)
#define CQ_COPY_TEXT(m) p = copy_str(&x->m, p);
#define CQ_COPY_OPT(m) p = copy_str(&x->m, p);
#define CQ_COPY_INT(m)
#define CQ_COPY_U64(m)
#define CQ_COPY_F64(m)
#define CQ_COPY_BOOL(m)
#define CQ_COPY_TIME(m)

#define BRK_CQ_PUSH(n, N, what)                                 \
    void brk_cq_##n(brk_catq_t *q CAT_##N(CAT_F_QPARAM)) {      \
        if (!q || !q->cat) return;                              \
        cat_rec_t r = { .kind = CAT_K_##N };                    \
        cat_##n##_t *x = &r.u.n;                                \
        size_t extra = 0;                                       \
        CAT_##N(CQ_F_SET)                                       \
        cq_item_t *it = malloc(sizeof *it + extra);             \
        if (it) {                                               \
            it->rec = r;                                        \
            x = &it->rec.u.n;                                   \
            char *p = (char *)(it + 1);                         \
            CAT_##N(CQ_F_COPY)                                  \
            (void)p;                                            \
        }                                                       \
        enqueue(q, it);                                         \
    }
CAT_RECORDS(BRK_CQ_PUSH)
#undef BRK_CQ_PUSH
