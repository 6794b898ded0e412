/* brk_catq.c -- the catalog writer thread and its bounded queue (see
 * brk_catq.h). The routing loop only pushes; this thread alone touches
 * SQLite, in batches, so a slow disk delays the catalog, never a reply.
 *
 * A queued record is one allocation: the record (cat_rec_t, the union of
 * every kind of catalog/catalog_records.h) followed by copies of its
 * strings. The pushes are generated from the same tables as the writers,
 * and the thread hands each record to cat_write as it is. */
#include "broker/brk_catq.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/brk_log.h"
#include "base/error.h"

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
    cat_t *cat;                /* owned by the thread once started */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* CLOCK_MONOTONIC */
    /* guarded by mu: */
    cq_list_t kept, events;    /* kept records are never shed; events may be */
    size_t max_kept, max_events, worker_quota;
    cq_quota_t quota[CQ_QUOTAS];
    int n_quota;
    struct timespec oldest;    /* when the oldest record waiting was queued */
    uint64_t shed;             /* events not queued: their worker over its quota, or no room */
    uint64_t failures;         /* batches the store refused for now (retried) */
    uint64_t refused;          /* records SQLite refused outright (not retried) */
    uint64_t lost;             /* records given up at shutdown (the store never came back) */
    uint64_t batches;
    double retain_s;           /* retention: raw rows older than this go (0: kept) */
    int64_t max_rows;          /* ... or past this many per table (0: no cap) */
    struct timespec next_prune; /* when the next pruning transaction is due */
    uint64_t pruned;           /* raw rows pruned so far */
    uint64_t pruned_run;       /* ... in the current round (logged when it ends) */
    uint64_t prune_failures;
    bool stop;
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

/* ---- the lists (mu held) ------------------------------------------------------ */

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
        if (worth_logging(++refused)) brk_log("catalog: a record was refused: %s", kern_error());
    }
    if (cat_commit(q->cat) != 0) {
        if (cat_failure_transient(q->cat)) goto failed;
        /* The store refused what the batch adds up to for good (its
         * summaries): each record again as a batch of its own, so a bad
         * record costs itself, never the batch and the queue behind it. */
        brk_log("catalog: a batch was refused (%s); writing its records one by one", kern_error());
        cat_rollback(q->cat);
        refused = 0;
        for (cq_item_t *it = chain; it; it = it->next)
            if (cat_write(q->cat, &it->rec) != 0 && worth_logging(++refused))
                brk_log("catalog: a record was refused: %s", kern_error());
    }
    pthread_mutex_lock(&q->mu);
    q->refused += refused;
    pthread_mutex_unlock(&q->mu);
    return 0;
failed:
    cat_rollback(q->cat);
    return -1;
}

static bool retaining(const brk_catq_t *q) { return q->retain_s > 0 || q->max_rows > 0; }

static bool prune_due(const brk_catq_t *q) {
    if (!retaining(q)) return false;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > q->next_prune.tv_sec ||
           (now.tv_sec == q->next_prune.tv_sec && now.tv_nsec >= q->next_prune.tv_nsec);
}

static void prune_after(brk_catq_t *q, long ms) {
    clock_gettime(CLOCK_MONOTONIC, &q->next_prune);
    q->next_prune.tv_sec += ms / 1000;
    q->next_prune.tv_nsec += (ms % 1000) * 1000000L;
    if (q->next_prune.tv_nsec >= 1000000000L) {
        q->next_prune.tv_sec++;
        q->next_prune.tv_nsec -= 1000000000L;
    }
}

/* One pruning transaction (mu held; released while SQLite works). Once a
 * round deleted nothing more it is logged and the next waits
 * BRK_CATQ_PRUNE_MS; while rows are left the next is due at once (after
 * any batch waiting). */
static void prune_step(brk_catq_t *q) {
    double before = q->retain_s > 0 ? now_unix() - q->retain_s : 0;
    int64_t max_rows = q->max_rows;
    pthread_mutex_unlock(&q->mu);
    int64_t n = cat_prune(q->cat, before, max_rows, BRK_CATQ_PRUNE_BATCH);
    pthread_mutex_lock(&q->mu);
    if (n < 0) {
        if (worth_logging(++q->prune_failures)) brk_log("catalog: pruning failed: %s", kern_error());
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
}

/* Waits (mu held) until a batch is due: BRK_CATQ_BATCH records, the oldest
 * BRK_CATQ_WAIT_MS old, or a stop; with nothing queued, a pruning
 * transaction that falls due runs meanwhile. false when stopping with
 * nothing left. */
static bool await_batch(brk_catq_t *q) {
    while (!q->kept.n && !q->events.n && !q->stop) {
        if (prune_due(q)) prune_step(q);
        else if (retaining(q)) pthread_cond_timedwait(&q->cv, &q->mu, &q->next_prune);
        else pthread_cond_wait(&q->cv, &q->mu);
    }
    if (!q->kept.n && !q->events.n) return false;
    struct timespec due = q->oldest;
    due.tv_nsec += (long)BRK_CATQ_WAIT_MS * 1000000L;
    if (due.tv_nsec >= 1000000000L) {
        due.tv_sec += due.tv_nsec / 1000000000L;
        due.tv_nsec %= 1000000000L;
    }
    while (q->kept.n + q->events.n < BRK_CATQ_BATCH && !q->stop)
        if (pthread_cond_timedwait(&q->cv, &q->mu, &due) == ETIMEDOUT) break;
    return true;
}

/* Sleeps ms (mu held) unless a stop comes first. */
static void backoff(brk_catq_t *q, long ms) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    while (!q->stop && pthread_cond_timedwait(&q->cv, &q->mu, &t) != ETIMEDOUT) {}
}

/* A batch the store refused: back in front of its lists, kept records
 * first as they were taken. Then a pause that grows while the store stays
 * refusing (BRK_CATQ_RETRY_MS doubling to 16x), so a full disk costs a
 * few writes a second, not a spinning core. false when stopping and the
 * store has refused BRK_CATQ_STOP_TRIES times: the rest is given up. */
static bool requeue(brk_catq_t *q, cq_item_t *kept, size_t nk, cq_item_t *events, size_t ne, int *tries) {
    q->failures++;
    if (worth_logging(q->failures))
        brk_log("catalog: writing failed (%llu so far), %zu records kept for a retry: %s",
                (unsigned long long)q->failures, nk + ne + q->kept.n + q->events.n, kern_error());
    list_unshift(&q->events, events, chain_last(events), ne);
    list_unshift(&q->kept, kept, chain_last(kept), nk);
    ++*tries;
    if (q->stop && *tries >= BRK_CATQ_STOP_TRIES) return false;
    backoff(q, BRK_CATQ_RETRY_MS << (*tries < 5 ? *tries - 1 : 4));
    return true;
}

static void *writer_main(void *arg) {
    brk_catq_t *q = arg;
    int tries = 0;
    pthread_mutex_lock(&q->mu);
    while (await_batch(q)) {
        size_t nk, ne;
        /* kept records first: an event flood never delays a request's row */
        cq_item_t *kept = list_take(&q->kept, BRK_CATQ_BATCH_MAX, &nk);
        cq_item_t *events = list_take(&q->events, BRK_CATQ_BATCH_MAX - nk, &ne);
        if (q->kept.n || q->events.n) clock_gettime(CLOCK_MONOTONIC, &q->oldest); /* the rest waits from now */
        q->batches++;
        pthread_mutex_unlock(&q->mu);
        cq_item_t *chain = kept;
        cq_item_t *lk = chain_last(kept);
        if (lk) lk->next = events;
        else chain = events;
        int rc = write_batch(q, chain);
        if (lk) lk->next = NULL; /* the two lists apart again */
        pthread_mutex_lock(&q->mu);
        if (rc == 0) {
            tries = 0;
            for (cq_item_t *e = events; e; e = e->next) q->quota[e->quota].n--;
            pthread_mutex_unlock(&q->mu);
            free_chain(kept);
            free_chain(events);
            pthread_mutex_lock(&q->mu);
            /* Under steady load the queue is never empty: pruning takes
             * its turn between batches. */
            if (!q->stop && prune_due(q)) prune_step(q);
        } else if (!requeue(q, kept, nk, events, ne, &tries)) {
            break;
        }
    }
    q->lost = q->kept.n + q->events.n;
    cq_item_t *k = q->kept.head, *e = q->events.head;
    q->kept = q->events = (cq_list_t){ NULL, NULL, 0 };
    pthread_mutex_unlock(&q->mu);
    free_chain(k);
    free_chain(e);
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------------- */

static int init_sync(brk_catq_t *q) {
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca)) return -1;
    int bad = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) || pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (bad) return -1;
    if (pthread_mutex_init(&q->mu, NULL)) {
        pthread_cond_destroy(&q->cv);
        return -1;
    }
    return 0;
}

brk_catq_t *brk_catq_new(cat_t **cat, size_t max) {
    brk_catq_t *q = calloc(1, sizeof *q);
    if (!q) goto err;
    q->max_kept = q->max_events = max;
    q->worker_quota = max / 4 ? max / 4 : 1;
    if (!cat || !*cat) return q; /* no catalog: pushes are dropped */
    if (init_sync(q)) goto err;
    q->cat = *cat;
    if (pthread_create(&q->thread, NULL, writer_main, q)) {
        pthread_cond_destroy(&q->cv);
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
    if (q->cat) {
        pthread_mutex_lock(&q->mu);
        q->stop = true;
        pthread_cond_signal(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
        cat_close(&q->cat);
        pthread_cond_destroy(&q->cv);
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
    if (!q || !q->cat) return 0;
    pthread_mutex_lock(&q->mu);
    uint64_t x = *v;
    pthread_mutex_unlock(&q->mu);
    return x;
}

void brk_catq_retain(brk_catq_t *q, double retain_seconds, int64_t max_rows) {
    if (!q || !q->cat) return;
    pthread_mutex_lock(&q->mu);
    q->retain_s = retain_seconds > 0 ? retain_seconds : 0;
    q->max_rows = max_rows > 0 ? max_rows : 0;
    prune_after(q, 0);
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

uint64_t brk_catq_pruned(brk_catq_t *q) { return q ? read_locked(q, &q->pruned) : 0; }
uint64_t brk_catq_dropped(brk_catq_t *q) { return q ? read_locked(q, &q->shed) : 0; }
uint64_t brk_catq_batches(brk_catq_t *q) { return q ? read_locked(q, &q->batches) : 0; }
uint64_t brk_catq_failures(brk_catq_t *q) { return q ? read_locked(q, &q->failures) : 0; }
uint64_t brk_catq_refused(brk_catq_t *q) { return q ? read_locked(q, &q->refused) : 0; }

size_t brk_catq_pending(brk_catq_t *q) {
    if (!q || !q->cat) return 0;
    pthread_mutex_lock(&q->mu);
    size_t n = q->kept.n + q->events.n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

bool brk_catq_behind(brk_catq_t *q) {
    if (!q || !q->cat) return false;
    pthread_mutex_lock(&q->mu);
    bool behind = q->kept.n >= q->max_kept;
    pthread_mutex_unlock(&q->mu);
    return behind;
}

/* ---- pushing ------------------------------------------------------------------- */

/* Queues it (NULL: out of memory, counted as shed). A kept record always
 * queues (the loop stops admitting requests while brk_catq_behind); an
 * event is shed when its worker has worker_quota events waiting or the
 * events list is full. The writer is woken by the first record (to start
 * its clock) and by the one that makes a batch; the others only queue. */
static void enqueue(brk_catq_t *q, cq_item_t *it) {
    pthread_mutex_lock(&q->mu);
    bool ok = it != NULL;
    if (ok && is_event(it->rec.kind)) {
        int slot = quota_slot(q, event_worker(&it->rec));
        ok = q->quota[slot].n < q->worker_quota && q->events.n < q->max_events;
        if (ok) {
            it->quota = slot;
            q->quota[slot].n++;
            list_push(&q->events, it);
        }
    } else if (ok) {
        it->quota = -1;
        list_push(&q->kept, it);
    }
    if (ok) {
        size_t n = q->kept.n + q->events.n;
        if (n == 1) clock_gettime(CLOCK_MONOTONIC, &q->oldest);
        if (n == 1 || n == BRK_CATQ_BATCH) pthread_cond_signal(&q->cv);
        it = NULL;
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
