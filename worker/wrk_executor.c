/* wrk_executor.c -- stream threads interleaving request steps (see
 * wrk_executor.h). */
#include "worker/wrk_executor.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels/error.h"
#include "worker/model/tdit_program.h"
#include "worker/wrk_pipe.h"

#define STG_POOL 8

typedef struct {
    wrk_exec_t *x;
    int idx;
    pthread_t th;
    bool started;
    kern_stream_t *ks;
    void *push;                  /* owned by the thread while it runs */
    pthread_mutex_t mu;          /* guards q_head/q_tail */
    pthread_cond_t cv;
    wrk_job_t *q_head, *q_tail;  /* submitted, not yet taken */
    atomic_int load;             /* jobs queued + active */
    /* Staging sets reused across requests, so a key's graph keeps reading
     * the contexts in place (pinned) from one request to the next. Only
     * this stream's thread touches them. */
    tdit_staging_t *pool[STG_POOL];
    bool busy[STG_POOL];
    uint64_t used[STG_POOL];     /* last take, for LRU replacement */
    uint64_t clock;
    int npool;
} stream_t;

struct wrk_exec {
    wrk_t *w;
    int n;
    stream_t *s;
};

/* ---- messages ------------------------------------------------------------ */

static void send_error(stream_t *st, const wrk_job_t *j, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(stream_t *st, const wrk_job_t *j, const char *code, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    wrk_log(st->x->w, "request %llu failed: %s", (unsigned long long)j->id, msg);
    if (wrk_pipe_send_error(st->push, j->epoch, j->id, code, msg) != 0)
        wrk_log(st->x->w, "stream %d: cannot queue ERROR: %s", st->idx, zmq_strerror(errno));
}

static void send_progress(stream_t *st, const wrk_job_t *j) {
    msg_progress_t p = { (uint64_t)tdit_req_steps_done(j->req), (uint64_t)tdit_req_steps(j->req) };
    if (wrk_pipe_send(st->push, j->epoch, MSG_PROGRESS, j->id, &p) != 0)
        wrk_log(st->x->w, "stream %d: cannot queue PROGRESS of request %llu", st->idx, (unsigned long long)j->id);
}

/* RESULT {worker, version, first_version, stats, key_hash} + latent. */
/* t = the F32 tensor `name` over data: shape `lead` (when > 0) then dims. */
static void tensor_of(wire_tensor_t *t, const char *name, int ndim, const int64_t *dims, int64_t lead,
                      const float *data) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = KERN_F32;
    int64_t n = 1;
    if (lead > 0) t->shape[t->ndim++] = lead;
    for (int d = 0; d < ndim; d++) t->shape[t->ndim++] = dims[d];
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    t->data = (void *)data;
    t->bytes = (size_t)n * sizeof(float);
}

/* The RESULT's version runs (always) and the rollout tensors the GEN asked
 * for (t[1..]); *sig and *runs are the caller's to free. -1 on OOM. */
static int result_extras(const wrk_job_t *j, msg_result_t *r, wire_tensor_t *t, float **sig,
                         msg_version_run_t **runs) {
    int steps = tdit_req_steps(j->req);
    const uint64_t *v = tdit_req_versions(j->req);
    if (!(*runs = calloc((size_t)steps, sizeof **runs))) return -1;
    size_t n = 0;
    for (int i = 0; i < steps; i++)
        if (!n || (*runs)[n - 1].version != v[i]) (*runs)[n++] = (msg_version_run_t){ (uint64_t)i, v[i] };
    r->version_runs = *runs;
    r->n_version_runs = n;
    int k = 1;
    if (tdit_req_trajectory(j->req)) {
        tensor_of(&t[k], "trajectory", 4, j->latent_shape, steps + 1, tdit_req_trajectory(j->req));
        r->trajectory = &t[k++];
    }
    if (tdit_req_means(j->req)) {
        tensor_of(&t[k], "means", 4, j->latent_shape, steps, tdit_req_means(j->req));
        r->means = &t[k++];
    }
    if (tdit_req_log_probs(j->req)) {
        int64_t one = steps;
        tensor_of(&t[k], "log_probs", 1, &one, 0, tdit_req_log_probs(j->req));
        r->log_probs = &t[k++];
        if (!(*sig = malloc(((size_t)steps + 1) * sizeof **sig))) return -1;
        for (int i = 0; i <= steps; i++) (*sig)[i] = (float)tdit_req_sigmas(j->req)[i];
        int64_t n1 = steps + 1;
        tensor_of(&t[k], "sigmas", 1, &n1, 0, *sig);
        r->sigmas = &t[k++];
    }
    return 0;
}

static void send_result(stream_t *st, wrk_job_t *j) {
    wrk_t *w = st->x->w;
    float *out = malloc(j->n_latent * sizeof *out);
    msg_result_t *r = calloc(1, sizeof *r);
    if (!out || !r) {
        send_error(st, j, WIRE_E_INTERNAL, "out of memory reading the result");
        goto out;
    }
    if (tdit_req_read(j->req, st->ks, out, j->n_latent) != 0) {
        send_error(st, j, WIRE_E_INTERNAL, "reading the result: %s", kern_error());
        goto out;
    }
    const tdit_run_stats_t *rs = tdit_req_stats(j->req);
    snprintf(r->worker, sizeof r->worker, "%s", w->opt->name);
    r->version = j->ran_version;
    r->first_version = j->first_version;
    r->stats.captured = (uint64_t)rs->captured;
    r->stats.replayed = (uint64_t)rs->replayed;
    r->stats.eager = (uint64_t)rs->eager;
    r->stats.seconds = rs->seconds;
    for (int i = 0; i < CAP_DECLINE_COUNT && r->stats.declines.n < MSG_MAX_COUNTS; i++) {
        if (!rs->declines[i]) continue;
        msg_count_t *c = &r->stats.declines.e[r->stats.declines.n++];
        snprintf(c->name, sizeof c->name, "%s", cap_reason_name((cap_reason_t)i));
        c->n = (uint64_t)rs->declines[i];
    }
    r->key_hash = tdit_req_shard_hash(j->req);
    wire_tensor_t t[5];
    float *sig = NULL;
    msg_version_run_t *runs = NULL;
    if (result_extras(j, r, t, &sig, &runs) != 0) {
        send_error(st, j, WIRE_E_INTERNAL, "out of memory building the RESULT");
        goto out;
    }
    tensor_of(&t[0], "latent", 4, j->latent_shape, 0, out);
    r->latent = &t[0];
    if (wrk_pipe_send(st->push, j->epoch, MSG_RESULT, j->id, r) != 0)
        wrk_log(w, "stream %d: cannot queue RESULT of request %llu: %s", st->idx, (unsigned long long)j->id,
                zmq_strerror(errno));
    free(sig);
    free(runs);
out:
    free(r);
    free(out);
}

/* ---- the stream loop ----------------------------------------------------- */

/* A free staging set of this shape (made on first need; when the pool is
 * full, an idle set of another shape, least recently used, makes way), or
 * NULL: the request then allocates its own. Device memory is allocated
 * only when a shape is new to this stream, never per request. */
static tdit_staging_t *take_staging(stream_t *st, const tdit_shape_t *sh) {
    for (int i = 0; i < st->npool; i++)
        if (!st->busy[i] && tdit_shape_equal(tdit_staging_shape(st->pool[i]), sh)) {
            st->busy[i] = true;
            st->used[i] = ++st->clock;
            return st->pool[i];
        }
    int slot = st->npool < STG_POOL ? st->npool : -1;
    if (slot < 0)
        for (int i = 0; i < st->npool; i++)
            if (!st->busy[i] && (slot < 0 || st->used[i] < st->used[slot])) slot = i;
    if (slot < 0) return NULL;
    tdit_staging_t *stg = tdit_staging_new(st->x->w->model, sh);
    if (!stg) return NULL;
    if (slot < st->npool) tdit_staging_destroy(&st->pool[slot]);
    else st->npool++;
    st->pool[slot] = stg;
    st->busy[slot] = true;
    st->used[slot] = ++st->clock;
    return stg;
}

/* Frees j, handing its staging set back to the pool. */
static void job_done(stream_t *st, wrk_job_t **jp) {
    wrk_job_t *j = *jp;
    if (j && j->counted) atomic_fetch_sub(&st->x->w->running, 1);
    if (j && j->stg)
        for (int i = 0; i < st->npool; i++)
            if (st->pool[i] == j->stg) st->busy[i] = false;
    wrk_job_free(jp);
}

/* Runs one step of j. Returns true when j is finished (done, failed or
 * abandoned) and must be freed. */
static bool step_once(stream_t *st, wrk_job_t *j) {
    wrk_t *w = st->x->w;
    if (j->epoch != atomic_load(&w->epoch)) return true; /* the broker no longer waits for it */
    if (!j->req) {
        if (atomic_load(&w->draining)) return false; /* held until the sync lands */
        atomic_fetch_add(&w->running, 1);
        j->counted = true;
        j->stg = take_staging(st, &j->shape);
        j->req = tdit_req_new_in(w->model, st->ks, j->stg, &j->shape, &j->loop, j->latent, j->context, j->uncond);
        if (j->req && j->rec && tdit_req_record(j->req, st->ks, j->rec) != 0) tdit_req_destroy(&j->req);
        if (!j->req) {
            send_error(st, j, WIRE_E_INTERNAL, "cannot start: %s", kern_error());
            return true;
        }
        /* Uploaded: the host copies are not needed any more. */
        free(j->latent);
        free(j->context);
        free(j->uncond);
        j->latent = j->context = j->uncond = NULL;
    }
    cap_result_t res;
    pthread_rwlock_rdlock(&w->step_lock);
    if (atomic_load(&w->fatal)) { /* a reload failed part-way: never step on mixed weights */
        pthread_rwlock_unlock(&w->step_lock);
        return true;
    }
    int rc = tdit_req_step(j->req, w->cache, st->ks, &res);
    /* Read under the same lock: the version this step ran on. */
    int64_t v = cap_component_version(w->cache, TDIT_COMPONENT);
    pthread_rwlock_unlock(&w->step_lock);
    if (rc != 0) {
        send_error(st, j, WIRE_E_INTERNAL, "step %d of %d failed: %s", tdit_req_steps_done(j->req) + 1,
                   tdit_req_steps(j->req), kern_error());
        return true;
    }
    j->ran_version = v < 0 ? 0 : (uint64_t)v;
    if (tdit_req_steps_done(j->req) == 1) j->first_version = j->ran_version;
    if (res.ran == CAP_RAN_REPLAYED) wrk_events_replay(w->events, tdit_req_key_hash(j->req), st->idx);
    if (j->progress) send_progress(st, j);
    if (!tdit_req_done(j->req)) return false;
    send_result(st, j);
    return true;
}

static void free_list(stream_t *st, wrk_job_t *j) {
    while (j) {
        wrk_job_t *next = j->next;
        job_done(st, &j);
        atomic_fetch_sub(&st->load, 1);
        j = next;
    }
}

static void *stream_main(void *arg) {
    stream_t *st = arg;
    wrk_t *w = st->x->w;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* signals are the main thread's */
    wrk_events_set_thread_stream(st->idx);

    wrk_job_t *active = NULL, **tail = &active;
    for (;;) {
        pthread_mutex_lock(&st->mu);
        while (!atomic_load(&w->stop) && !st->q_head && !active) pthread_cond_wait(&st->cv, &st->mu);
        if (st->q_head) { /* new jobs join the round at its end */
            *tail = st->q_head;
            tail = &st->q_tail->next;
            st->q_head = st->q_tail = NULL;
        }
        pthread_mutex_unlock(&st->mu);
        if (atomic_load(&w->stop)) break;
        /* One round: one step of every active job, in arrival order. */
        for (wrk_job_t **pp = &active; *pp && !atomic_load(&w->stop);) {
            wrk_job_t *j = *pp;
            if (step_once(st, j)) {
                *pp = j->next;
                j->next = NULL;
                job_done(st, &j);
                atomic_fetch_sub(&st->load, 1);
            } else {
                pp = &j->next;
            }
        }
        for (tail = &active; *tail; tail = &(*tail)->next) {}
        if (atomic_load(&w->draining)) { /* held requests: do not spin while a sync drains */
            struct timespec ts = { 0, 2 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
    }
    free_list(st, active);
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------- */

wrk_exec_t *wrk_exec_new(wrk_t *w) {
    wrk_exec_t *x = calloc(1, sizeof *x);
    if (!x) { kern_fail("out of memory"); return NULL; }
    x->w = w;
    x->s = calloc((size_t)w->opt->streams, sizeof *x->s);
    if (!x->s) { kern_fail("out of memory"); goto err; }
    for (int i = 0; i < w->opt->streams; i++) {
        stream_t *st = &x->s[i];
        st->x = x;
        st->idx = i;
        atomic_init(&st->load, 0);
        if (pthread_mutex_init(&st->mu, NULL) || pthread_cond_init(&st->cv, NULL)) {
            kern_fail("cannot create stream %d's lock", i);
            goto err;
        }
        x->n = i + 1;
        if (!(st->ks = kern_stream_new(w->backend))) goto err;
        if (!(st->push = wrk_pipe_push_new(w->zctx))) {
            kern_fail("stream %d: pipe: %s", i, zmq_strerror(errno));
            goto err;
        }
    }
    for (int i = 0; i < x->n; i++) {
        int e = pthread_create(&x->s[i].th, NULL, stream_main, &x->s[i]);
        if (e) {
            kern_fail("cannot start stream %d: %s", i, strerror(e));
            goto err;
        }
        x->s[i].started = true;
    }
    return x;
err:
    wrk_exec_destroy(&x);
    return NULL;
}

void wrk_exec_submit(wrk_exec_t *x, wrk_job_t *job) {
    stream_t *best = &x->s[0];
    for (int i = 1; i < x->n; i++)
        if (atomic_load(&x->s[i].load) < atomic_load(&best->load)) best = &x->s[i];
    job->next = NULL;
    atomic_fetch_add(&best->load, 1);
    pthread_mutex_lock(&best->mu);
    if (best->q_tail) best->q_tail->next = job;
    else best->q_head = job;
    best->q_tail = job;
    pthread_cond_signal(&best->cv);
    pthread_mutex_unlock(&best->mu);
}

int wrk_exec_inflight(wrk_exec_t *x) {
    int n = 0;
    for (int i = 0; i < x->n; i++) n += atomic_load(&x->s[i].load);
    return n;
}

void wrk_exec_stop(wrk_exec_t *x) {
    if (!x) return;
    atomic_store(&x->w->stop, true);
    for (int i = 0; i < x->n; i++) {
        stream_t *st = &x->s[i];
        pthread_mutex_lock(&st->mu);
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
    }
    for (int i = 0; i < x->n; i++) {
        stream_t *st = &x->s[i];
        if (st->started) pthread_join(st->th, NULL);
        st->started = false;
        free_list(st, st->q_head);
        st->q_head = st->q_tail = NULL;
        if (st->push) zmq_close(st->push);
        st->push = NULL;
    }
}

void wrk_exec_destroy(wrk_exec_t **xp) {
    if (!xp || !*xp) return;
    wrk_exec_t *x = *xp;
    wrk_exec_stop(x);
    for (int i = 0; i < x->n; i++) {
        stream_t *st = &x->s[i];
        for (int k = 0; k < st->npool; k++) tdit_staging_destroy(&st->pool[k]);
        kern_stream_destroy(&st->ks);
        pthread_cond_destroy(&st->cv);
        pthread_mutex_destroy(&st->mu);
    }
    free(x->s);
    free(x);
    *xp = NULL;
}
