/* brk_catq.c -- the catalog writer thread and its bounded queue (see
 * brk_catq.h). The routing loop only pushes; this thread alone touches
 * SQLite, in batches, so a slow disk delays the catalog, never a reply.
 *
 * A queued record is one allocation: the record (cat_rec_t, the union of
 * every kind of schema/catalog_records.h) followed by copies of its
 * strings. The pushes are generated from the same tables as the writers,
 * and the thread hands each record to cat_write as it is. */
#include "broker/brk_catq.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/brk_log.h"
#include "kernels/error.h"

typedef struct cq_item {
    struct cq_item *next;
    cat_rec_t rec;             /* its strings point after the item */
} cq_item_t;

struct brk_catq {
    cat_t *cat;                /* owned by the thread once started */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* CLOCK_MONOTONIC */
    cq_item_t *head, *tail;    /* guarded by mu */
    size_t n, max;             /* guarded by mu */
    struct timespec oldest;    /* guarded by mu: when the head was queued */
    uint64_t dropped;          /* guarded by mu */
    uint64_t batches;          /* guarded by mu */
    bool stop;                 /* guarded by mu */
    uint64_t errors;           /* writer thread only */
};

static double now_unix(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The first few failures and then one in a thousand: a broken disk must
 * not flood the log. */
static void report_error(brk_catq_t *q, const char *what) {
    q->errors++;
    if (q->errors <= 5 || q->errors % 1000 == 0)
        brk_log("catalog: %s failed (%llu so far): %s", what, (unsigned long long)q->errors,
                kern_error());
}

/* ---- the writer thread ------------------------------------------------------ */

static void write_batch(brk_catq_t *q, cq_item_t *chain) {
    bool open = cat_begin(q->cat) == 0;
    if (!open) report_error(q, "begin");
    for (cq_item_t *it = chain; it; it = it->next)
        if (open && cat_write(q->cat, &it->rec) < 0) report_error(q, "insert");
    if (open && cat_commit(q->cat) < 0) {
        report_error(q, "commit");
        cat_rollback(q->cat);
    }
    while (chain) {
        cq_item_t *next = chain->next;
        free(chain);
        chain = next;
    }
}

/* Waits (mu held) until a batch is due: BRK_CATQ_BATCH records, the oldest
 * BRK_CATQ_WAIT_MS old, or a stop. false when stopping with nothing left. */
static bool await_batch(brk_catq_t *q) {
    while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
    if (!q->head) return false;
    struct timespec due = q->oldest;
    due.tv_nsec += (long)BRK_CATQ_WAIT_MS * 1000000L;
    if (due.tv_nsec >= 1000000000L) {
        due.tv_sec += due.tv_nsec / 1000000000L;
        due.tv_nsec %= 1000000000L;
    }
    while (q->n < BRK_CATQ_BATCH && !q->stop)
        if (pthread_cond_timedwait(&q->cv, &q->mu, &due) == ETIMEDOUT) break;
    return true;
}

static void *writer_main(void *arg) {
    brk_catq_t *q = arg;
    pthread_mutex_lock(&q->mu);
    while (await_batch(q)) {
        cq_item_t *chain = q->head, *last = chain;
        size_t taken = 1;
        while (last->next && taken < BRK_CATQ_BATCH_MAX) {
            last = last->next;
            taken++;
        }
        q->head = last->next;
        if (!q->head) q->tail = NULL;
        else clock_gettime(CLOCK_MONOTONIC, &q->oldest); /* the rest waits from now */
        last->next = NULL;
        q->n -= taken;
        q->batches++;
        pthread_mutex_unlock(&q->mu);
        write_batch(q, chain);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
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
    q->max = max;
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
        if (q->dropped)
            brk_log("catalog: %llu records dropped (queue full)", (unsigned long long)q->dropped);
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

uint64_t brk_catq_dropped(brk_catq_t *q) { return q ? read_locked(q, &q->dropped) : 0; }
uint64_t brk_catq_batches(brk_catq_t *q) { return q ? read_locked(q, &q->batches) : 0; }

/* ---- pushing ------------------------------------------------------------------- */

/* Queues it (NULL: out of memory), or drops and counts it when the queue
 * is full. The writer is woken by the first record (to start its clock)
 * and by the one that makes a batch; the others only queue. */
static void enqueue(brk_catq_t *q, cq_item_t *it) {
    pthread_mutex_lock(&q->mu);
    if (it && q->n < q->max) {
        it->next = NULL;
        if (q->tail) q->tail->next = it;
        else {
            q->head = it;
            clock_gettime(CLOCK_MONOTONIC, &q->oldest);
        }
        q->tail = it;
        if (++q->n == 1 || q->n == BRK_CATQ_BATCH) pthread_cond_signal(&q->cv);
        it = NULL;
    } else if (q->dropped++ == 0) {
        brk_log("catalog: queue full (%zu records): dropping records until the writer catches up", q->max);
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
