/* brk_catq.c -- the catalog writer thread and its bounded queue (see
 * brk_catq.h). The routing loop only pushes; this thread alone touches
 * SQLite, in batches, so a slow disk delays the catalog, never a reply. */
#include "broker/brk_catq.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/brk_log.h"
#include "kernels/error.h"

typedef enum {
    CQ_WORKER_SEEN,
    CQ_WORKER_GONE,
    CQ_WEIGHT_VERSION,
    CQ_WEIGHT_STATE,
    CQ_WORKER_VERSION,
    CQ_CAPTURE,
    CQ_REPLAYS,
    CQ_EVICTION,
    CQ_DECLINE,
    CQ_REQUEST,
} cq_kind_t;

#define CQ_STRS 6

/* One record. Its strings live in the same allocation, after the struct,
 * so a record is one malloc and one free. */
typedef struct cq_item {
    struct cq_item *next;
    cq_kind_t kind;
    double t;
    const char *s[CQ_STRS];
    uint64_t u[3];
    int i[4];
    double d;
    bool b;
} cq_item_t;

struct brk_catq {
    cat_t *cat;               /* owned by the thread once started */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cq_item_t *head, *tail;   /* guarded by mu */
    size_t n, max;            /* guarded by mu */
    uint64_t dropped;         /* guarded by mu */
    bool stop;                /* guarded by mu */
    uint64_t errors;          /* writer thread only */
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

static int apply(cat_t *c, const cq_item_t *it) {
    const char *const *s = it->s;
    switch (it->kind) {
    case CQ_WORKER_SEEN:
        return cat_worker_seen(c, s[0], s[1], s[2], it->i[0], it->u[0], it->t);
    case CQ_WORKER_GONE: return cat_worker_gone(c, s[0], s[1], it->t);
    case CQ_WEIGHT_VERSION: return cat_weight_version(c, s[0], it->u[0], s[1], s[2], it->t);
    case CQ_WEIGHT_STATE: return cat_weight_state(c, s[0], it->u[0], s[1], s[2][0] ? s[2] : NULL);
    case CQ_WORKER_VERSION:
        return cat_worker_version(c, s[0], s[1], it->u[0], it->b, it->b ? NULL : s[2], it->t);
    case CQ_CAPTURE:
        return cat_capture(c, s[0], s[1], s[2], it->i[0], it->u[0], it->u[1], it->d, it->t);
    case CQ_REPLAYS: return cat_replays(c, s[0], s[1], it->i[0], it->u[0], it->t);
    case CQ_EVICTION:
        return cat_eviction(c, s[0], s[1], s[2], s[3], s[4], it->u[0], it->u[1], it->t);
    case CQ_DECLINE: return cat_decline(c, s[0], s[1], s[2], s[3], it->u[0], it->t);
    case CQ_REQUEST:
        return cat_request(c, it->u[0], s[0], s[1], it->u[1], it->i[0], it->i[1], it->i[2],
                           it->i[3], it->d, s[2], it->t);
    }
    return 0;
}

static void write_batch(brk_catq_t *q, cq_item_t *chain) {
    bool open = cat_begin(q->cat) == 0;
    if (!open) report_error(q, "begin");
    for (cq_item_t *it = chain; it; it = it->next)
        if (open && apply(q->cat, it) < 0) report_error(q, "insert");
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

static void *writer_main(void *arg) {
    brk_catq_t *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
        if (!q->head) break; /* stopping and drained */
        cq_item_t *chain = q->head, *last = chain;
        size_t taken = 1;
        while (last->next && taken < BRK_CATQ_BATCH) {
            last = last->next;
            taken++;
        }
        q->head = last->next;
        if (!q->head) q->tail = NULL;
        last->next = NULL;
        q->n -= taken;
        pthread_mutex_unlock(&q->mu);
        write_batch(q, chain);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

brk_catq_t *brk_catq_new(cat_t **cat, size_t max) {
    brk_catq_t *q = calloc(1, sizeof *q);
    if (!q) goto err;
    q->max = max;
    if (!cat || !*cat) return q; /* no catalog: pushes are dropped */
    if (pthread_mutex_init(&q->mu, NULL)) goto err;
    if (pthread_cond_init(&q->cv, NULL)) {
        pthread_mutex_destroy(&q->mu);
        goto err;
    }
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

uint64_t brk_catq_dropped(brk_catq_t *q) {
    if (!q || !q->cat) return 0;
    pthread_mutex_lock(&q->mu);
    uint64_t d = q->dropped;
    pthread_mutex_unlock(&q->mu);
    return d;
}

/* Copies tmpl and its n strings into one allocation and queues it. A full
 * queue or no memory drops the record and counts it. */
static void push(brk_catq_t *q, const cq_item_t *tmpl, int n, ...) {
    if (!q || !q->cat) return;
    const char *src[CQ_STRS];
    size_t len[CQ_STRS], total = sizeof(cq_item_t);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        src[i] = va_arg(ap, const char *);
        if (!src[i]) src[i] = "";
        len[i] = strlen(src[i]) + 1;
        total += len[i];
    }
    va_end(ap);

    cq_item_t *it = NULL;
    pthread_mutex_lock(&q->mu);
    bool full = q->n >= q->max;
    pthread_mutex_unlock(&q->mu);
    if (!full) it = malloc(total);
    if (it) {
        *it = *tmpl;
        it->next = NULL;
        it->t = now_unix();
        char *p = (char *)(it + 1);
        for (int i = 0; i < n; i++) {
            memcpy(p, src[i], len[i]);
            it->s[i] = p;
            p += len[i];
        }
    }
    pthread_mutex_lock(&q->mu);
    if (it && q->n < q->max) {
        if (q->tail) q->tail->next = it;
        else q->head = it;
        q->tail = it;
        q->n++;
        pthread_cond_signal(&q->cv);
        it = NULL;
    } else if (q->dropped++ == 0) {
        brk_log("catalog: queue full (%zu records): dropping records until the writer catches up",
                q->max);
    }
    pthread_mutex_unlock(&q->mu);
    free(it);
}

void brk_cq_worker_seen(brk_catq_t *q, const char *worker, const char *device, const char *arch,
                        int streams, uint64_t budget) {
    cq_item_t t = { .kind = CQ_WORKER_SEEN, .i = { streams }, .u = { budget } };
    push(q, &t, 3, worker, device, arch);
}

void brk_cq_worker_gone(brk_catq_t *q, const char *worker, const char *why) {
    cq_item_t t = { .kind = CQ_WORKER_GONE };
    push(q, &t, 2, worker, why);
}

void brk_cq_weight_version(brk_catq_t *q, const char *component, uint64_t version,
                           const char *sha256, const char *source) {
    cq_item_t t = { .kind = CQ_WEIGHT_VERSION, .u = { version } };
    push(q, &t, 3, component, sha256, source);
}

void brk_cq_weight_state(brk_catq_t *q, const char *component, uint64_t version,
                         const char *state, const char *reason) {
    cq_item_t t = { .kind = CQ_WEIGHT_STATE, .u = { version } };
    push(q, &t, 3, component, state, reason);
}

void brk_cq_worker_version(brk_catq_t *q, const char *worker, const char *component,
                           uint64_t version, bool ok, const char *error) {
    cq_item_t t = { .kind = CQ_WORKER_VERSION, .u = { version }, .b = ok };
    push(q, &t, 3, worker, component, error);
}

void brk_cq_capture(brk_catq_t *q, const char *worker, const char *key_text, const char *key_hash,
                    int stream, uint64_t bytes, uint64_t nodes, double seconds) {
    cq_item_t t = { .kind = CQ_CAPTURE, .i = { stream }, .u = { bytes, nodes }, .d = seconds };
    push(q, &t, 3, worker, key_text, key_hash);
}

void brk_cq_replays(brk_catq_t *q, const char *worker, const char *key_hash, int stream,
                    uint64_t count) {
    cq_item_t t = { .kind = CQ_REPLAYS, .i = { stream }, .u = { count } };
    push(q, &t, 2, worker, key_hash);
}

void brk_cq_eviction(brk_catq_t *q, const char *worker, const char *key_text,
                     const char *key_hash, const char *reason, const char *component,
                     uint64_t from_version, uint64_t to_version) {
    cq_item_t t = { .kind = CQ_EVICTION, .u = { from_version, to_version } };
    push(q, &t, 5, worker, key_text, key_hash, reason, component);
}

void brk_cq_decline(brk_catq_t *q, const char *worker, const char *key_text, const char *key_hash,
                    const char *reason, uint64_t count) {
    cq_item_t t = { .kind = CQ_DECLINE, .u = { count } };
    push(q, &t, 4, worker, key_text, key_hash, reason);
}

void brk_cq_request(brk_catq_t *q, uint64_t id, const char *worker, const char *key_hash,
                    uint64_t version, int steps, int captured, int replayed, int eager,
                    double seconds, const char *status) {
    cq_item_t t = { .kind = CQ_REQUEST,
                    .u = { id, version },
                    .i = { steps, captured, replayed, eager },
                    .d = seconds };
    push(q, &t, 3, worker, key_hash, status);
}
