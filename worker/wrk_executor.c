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
#include "base/error.h"
#include "model/tdit_program.h"
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

/* A group split over the streams (the CPU backend: a stream is a core's
 * thread): each part is a job of its own on its own stream, batched as a
 * group, writing its samples' outputs here; the part that finishes last
 * sends the one RESULT (or nothing, when a part failed: that part sent
 * the ERROR). Every part is bitwise the single requests of its seeds, so
 * the whole is too. */
struct wrk_group {
    pthread_mutex_t mu;
    int parts, parts_left, parts_ok;
    bool started;                /* counted in wrk_t.running, all parts at once */
    atomic_bool failed;          /* a part sent ERROR: the others stop */
    int n, steps;
    float *out, *traj, *means, *logp;
    uint64_t *vers;
    tdit_run_stats_t stats;
    uint64_t first_version, last_version;
    bool have_version;
    int progress_done, progress_total;
};

static void group_free(wrk_group_t *g) {
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    free(g->out);
    free(g->traj);
    free(g->means);
    free(g->logp);
    free(g->vers);
    free(g);
}

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


/* t = the F32 tensor `name` over data: shape lead[0..nlead) then dims. */
static void tensor_of(wire_tensor_t *t, const char *name, int nlead, const int64_t *lead, int ndim,
                      const int64_t *dims, const float *data) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = KERN_F32;
    int64_t n = 1;
    for (int d = 0; d < nlead; d++) t->shape[t->ndim++] = lead[d];
    for (int d = 0; d < ndim; d++) t->shape[t->ndim++] = dims[d];
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    t->data = (void *)data;
    t->bytes = (size_t)n * sizeof(float);
}

/* What a RESULT reports, from one request or a group's gathered
 * sub-batches: n samples, each's outputs in sample order. */
typedef struct {
    int n, steps;
    const float *out, *traj, *means, *logp;
    const uint64_t *vers;        /* [n][steps] */
    const tdit_run_stats_t *stats;
} outputs_t;

/* The RESULT's version runs (over the n×steps grid of (sample, step),
 * sample-major: one sample's steps for a single request) and the rollout
 * tensors the GEN asked for (t[1..]); *sig and *runs are the caller's to
 * free. A group's tensors gain a leading [n]. -1 on OOM. */
static int result_extras(const wrk_job_t *j, const outputs_t *o, msg_result_t *r, wire_tensor_t *t, float **sig,
                         msg_version_run_t **runs) {
    int steps = o->steps;
    size_t cells = (size_t)o->n * (size_t)steps;
    if (!(*runs = calloc(cells, sizeof **runs))) return -1;
    size_t n = 0;
    for (size_t i = 0; i < cells; i++)
        if (!n || (*runs)[n - 1].version != o->vers[i]) (*runs)[n++] = (msg_version_run_t){ (uint64_t)i, o->vers[i] };
    r->version_runs = *runs;
    r->n_version_runs = n;
    int nl = o->n > 1; /* a group: a leading [n] */
    int64_t g = o->n, lead[2] = { g, steps + 1 };
    int k = 1;
    if (o->traj) {
        tensor_of(&t[k], "trajectory", 1 + nl, nl ? lead : lead + 1, 4, j->latent_shape, o->traj);
        r->trajectory = &t[k++];
    }
    lead[1] = steps;
    if (o->means) {
        tensor_of(&t[k], "means", 1 + nl, nl ? lead : lead + 1, 4, j->latent_shape, o->means);
        r->means = &t[k++];
    }
    if (o->logp) {
        tensor_of(&t[k], "log_probs", 1 + nl, nl ? lead : lead + 1, 0, NULL, o->logp);
        r->log_probs = &t[k++];
        if (!(*sig = malloc(((size_t)steps + 1) * sizeof **sig))) return -1;
        for (int i = 0; i <= steps; i++) (*sig)[i] = (float)tdit_req_sigmas(j->req)[i];
        int64_t n1 = steps + 1;
        tensor_of(&t[k], "sigmas", 0, NULL, 1, &n1, *sig);
        r->sigmas = &t[k++];
    }
    return 0;
}

/* RESULT {worker, version, first_version, stats, key_hash, version_runs,
 * n, seeds} + latent and the rollout tensors asked for. */
static void send_outputs(stream_t *st, wrk_job_t *j, const outputs_t *o) {
    wrk_t *w = st->x->w;
    msg_result_t *r = calloc(1, sizeof *r);
    if (!r) {
        send_error(st, j, WIRE_E_INTERNAL, "out of memory building the RESULT");
        return;
    }
    const tdit_run_stats_t *rs = o->stats;
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
    if (o->n > 1) { /* the group's key, as the broker routed it: batch n, whatever batches ran */
        tdit_shape_t sh = j->shape;
        sh.batch = o->n;
        cap_key_t k;
        if (tdit_step_key(w->model, &sh, j->loop.sde, 0, &k) == 0) r->key_hash = cap_key_shard_hash(&k);
    }
    if (o->n > 1) { /* a part keeps the whole group's seeds, its own from base on */
        r->n = (uint64_t)o->n;
        r->n_seeds = o->n;
        memcpy(r->seeds, j->seeds, (size_t)o->n * sizeof *r->seeds);
    }
    wire_tensor_t t[5];
    float *sig = NULL;
    msg_version_run_t *runs = NULL;
    if (result_extras(j, o, r, t, &sig, &runs) != 0) {
        send_error(st, j, WIRE_E_INTERNAL, "out of memory building the RESULT");
        goto out;
    }
    int64_t g = o->n;
    tensor_of(&t[0], "latent", o->n > 1, &g, 4, j->latent_shape, o->out);
    r->latent = &t[0];
    if (wrk_pipe_send(st->push, j->epoch, MSG_RESULT, j->id, r) != 0)
        wrk_log(w, "stream %d: cannot queue RESULT of request %llu: %s", st->idx, (unsigned long long)j->id,
                zmq_strerror(errno));
out:
    free(sig);
    free(runs);
    free(r);
}

/* The RESULT of a single request, straight from its tdit_req. */
static void send_result(stream_t *st, wrk_job_t *j) {
    float *out = malloc(j->n_latent * sizeof *out);
    if (!out) {
        send_error(st, j, WIRE_E_INTERNAL, "out of memory reading the result");
        return;
    }
    if (tdit_req_read(j->req, st->ks, out, j->n_latent) != 0) {
        send_error(st, j, WIRE_E_INTERNAL, "reading the result: %s", kern_error());
        free(out);
        return;
    }
    outputs_t o = { 1, tdit_req_steps(j->req), out, tdit_req_trajectory(j->req), tdit_req_means(j->req),
                    tdit_req_log_probs(j->req), tdit_req_versions(j->req), tdit_req_stats(j->req) };
    send_outputs(st, j, &o);
    free(out);
}

/* A group's finished sub-batch: its samples' outputs copied into the
 * group's (allocated on the first), its counts added. -1 with a message. */
/* dst += src's counts (steps, outcomes, declines); seconds as the caller says. */
static void stats_add(tdit_run_stats_t *dst, const tdit_run_stats_t *src) {
    dst->steps += src->steps;
    dst->captured += src->captured;
    dst->replayed += src->replayed;
    dst->eager += src->eager;
    for (int i = 0; i < CAP_DECLINE_COUNT; i++) dst->declines[i] += src->declines[i];
}

static int gather(stream_t *st, wrk_job_t *j) {
    const tdit_req_t *q = j->req;
    size_t n = (size_t)j->n, nl = j->n_latent, steps = (size_t)tdit_req_steps(q), b = (size_t)tdit_req_batch(q);
    if (!j->group && !j->g_out) {
        if (!(j->g_out = malloc(n * nl * sizeof *j->g_out)) || !(j->g_vers = malloc(n * steps * sizeof *j->g_vers)) ||
            ((j->rec & TDIT_REC_TRAJECTORY) && !(j->g_traj = malloc(n * (steps + 1) * nl * sizeof *j->g_traj))) ||
            ((j->rec & TDIT_REC_MEANS) && !(j->g_means = malloc(n * steps * nl * sizeof *j->g_means))) ||
            ((j->rec & TDIT_REC_LOG_PROBS) && !(j->g_logp = malloc(n * steps * sizeof *j->g_logp))))
            return kern_fail("out of memory gathering a group of %zu", n);
    }
    /* A part writes straight into its group's buffers, at its samples. */
    wrk_group_t *gr = j->group;
    size_t at = (size_t)j->at + (gr ? (size_t)j->base : 0);
    float *out = gr ? gr->out : j->g_out, *tr = gr ? gr->traj : j->g_traj, *me = gr ? gr->means : j->g_means,
          *lp = gr ? gr->logp : j->g_logp;
    uint64_t *vers = gr ? gr->vers : j->g_vers;
    if (tdit_req_read(j->req, st->ks, out + at * nl, b * nl) != 0) return -1;
    /* The records are sample-major, as the group's: one copy each. */
    if (tr) memcpy(tr + at * (steps + 1) * nl, tdit_req_trajectory(q), b * (steps + 1) * nl * sizeof(float));
    if (me) memcpy(me + at * steps * nl, tdit_req_means(q), b * steps * nl * sizeof(float));
    if (lp) memcpy(lp + at * steps, tdit_req_log_probs(q), b * steps * sizeof(float));
    for (size_t k = 0; k < b; k++) memcpy(vers + (at + k) * steps, tdit_req_versions(q), steps * sizeof(uint64_t));
    stats_add(&j->g_stats, tdit_req_stats(q));
    j->g_stats.seconds += tdit_req_stats(q)->seconds; /* one sub-batch after another */
    return 0;
}

static void send_group_result(stream_t *st, wrk_job_t *j) {
    outputs_t o = { j->n, tdit_req_steps(j->req), j->g_out, j->g_traj, j->g_means, j->g_logp, j->g_vers,
                    &j->g_stats };
    send_outputs(st, j, &o);
}

/* The RESULT of a split group, sent by its last part j (which still holds
 * its tdit_req: the schedule and the key hash). The group's seeds are
 * j's from base 0 on: every part carries the whole group's seeds. */
static void send_split_result(stream_t *st, wrk_job_t *j, wrk_group_t *g) {
    j->first_version = g->first_version;
    j->ran_version = g->last_version;
    outputs_t o = { g->n, g->steps, g->out, g->traj, g->means, g->logp, g->vers, &g->stats };
    send_outputs(st, j, &o);
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

/* Hands j's staging set back to the pool. */
static void put_staging(stream_t *st, wrk_job_t *j) {
    if (j->stg)
        for (int i = 0; i < st->npool; i++)
            if (st->pool[i] == j->stg) st->busy[i] = false;
    j->stg = NULL;
}

/* Frees j, handing its staging set back to the pool. The last part of a
 * split group to finish sends the group's RESULT when every part ran
 * (and the broker still waits for it), then frees the group. */
static void job_done(stream_t *st, wrk_job_t **jp) {
    wrk_job_t *j = *jp;
    wrk_group_t *g = j ? j->group : NULL;
    if (j && !g && j->counted) atomic_fetch_sub(&st->x->w->running, 1);
    if (j) put_staging(st, j);
    if (g) {
        pthread_mutex_lock(&g->mu);
        /* Counted with its group when the group started, whether or not
         * this part ever ran a step. */
        if (g->started) atomic_fetch_sub(&st->x->w->running, 1);
        bool last = --g->parts_left == 0;
        if (j->ok) g->parts_ok++;
        bool send = last && g->parts_ok == g->parts && !atomic_load(&g->failed);
        pthread_mutex_unlock(&g->mu);
        if (send && j->epoch == atomic_load(&st->x->w->epoch)) send_split_result(st, j, g);
        if (last) group_free(g);
    }
    wrk_job_free(jp);
}

/* A group's samples per batched step: all of them when that workspace fits
 * the cache budget, else halved until it does (1 at worst). */
static int choose_chunk(const wrk_t *w, const wrk_job_t *j) {
    int b = j->n;
    while (b > 1 && w->opt->budget) {
        tdit_shape_t sh = j->shape;
        sh.batch = b;
        size_t need = tdit_ws_size(w->model, &sh);
        if (need && need <= w->opt->budget) break;
        b = (b + 1) / 2;
    }
    return b;
}

/* Starts j's request: the single request, or the group's next sub-batch
 * (chunk samples, or what is left). A sub-batch that cannot be set up
 * (device memory) is tried again at half the size. 0, or -1 with a
 * message. */
static int start_req(stream_t *st, wrk_job_t *j) {
    wrk_t *w = st->x->w;
    if (!j->chunk) {
        j->chunk = choose_chunk(w, j);
        if (j->group) { /* a part in several batches: more steps to report */
            pthread_mutex_lock(&j->group->mu);
            j->group->progress_total += ((j->n + j->chunk - 1) / j->chunk - 1) * j->loop.steps;
            pthread_mutex_unlock(&j->group->mu);
        }
        if (j->chunk < j->n)
            wrk_log(w, "request %llu: a group of %d runs in batches of %d (a batch of %d would not fit the %zu-byte budget)",
                    (unsigned long long)j->id, j->n, j->chunk, j->n, w->opt->budget);
    }
    for (;;) {
        int left = j->n - j->at, b = left < j->chunk ? left : j->chunk;
        j->shape.batch = b;
        put_staging(st, j);
        j->stg = take_staging(st, &j->shape);
        const float *lat = j->latent ? j->latent + (size_t)j->at * j->n_latent : NULL;
        j->req = tdit_req_new_group(w->model, st->ks, j->stg, &j->shape, &j->loop, j->seeds + j->base + j->at, lat,
                                    j->context, j->uncond);
        if (j->req && j->rec && tdit_req_record(j->req, st->ks, j->rec) != 0) tdit_req_destroy(&j->req);
        if (j->req) break;
        if (b == 1) return -1;
        j->chunk = (b + 1) / 2;
        if (j->group) { /* more batches to report */
            pthread_mutex_lock(&j->group->mu);
            j->group->progress_total += ((left + j->chunk - 1) / j->chunk - (left + b - 1) / b) * j->loop.steps;
            pthread_mutex_unlock(&j->group->mu);
        }
        wrk_log(w, "request %llu: a batch of %d samples cannot start (%s); batches of %d", (unsigned long long)j->id,
                b, kern_error(), j->chunk);
    }
    if (j->at + (int)tdit_req_batch(j->req) >= j->n) { /* the last start: the host copies are uploaded */
        free(j->latent);
        free(j->context);
        free(j->uncond);
        j->latent = j->context = j->uncond = NULL;
    }
    return 0;
}

/* PROGRESS over a group counts the batched steps of every sub-batch (of
 * every part of a split group: each part reports the group's count as it
 * steps; two parts' messages may arrive a step out of order). */
static void send_progress_job(stream_t *st, const wrk_job_t *j) {
    int steps = tdit_req_steps(j->req), b = (int)tdit_req_batch(j->req);
    int rest = j->n - j->at - b, more = rest > 0 ? (rest + j->chunk - 1) / j->chunk : 0;
    msg_progress_t p = { (uint64_t)(j->batches * steps + tdit_req_steps_done(j->req)),
                         (uint64_t)((j->batches + 1 + more) * steps) };
    if (j->group) {
        wrk_group_t *g = j->group;
        pthread_mutex_lock(&g->mu);
        g->progress_done++;
        if (g->progress_total < g->progress_done) g->progress_total = g->progress_done;
        p = (msg_progress_t){ (uint64_t)g->progress_done, (uint64_t)g->progress_total };
        pthread_mutex_unlock(&g->mu);
    }
    if (wrk_pipe_send(st->push, j->epoch, MSG_PROGRESS, j->id, &p) != 0)
        wrk_log(st->x->w, "stream %d: cannot queue PROGRESS of request %llu", st->idx, (unsigned long long)j->id);
}

/* j cannot go on: ERROR for its request, unless it is a part of a split
 * group whose other part already sent one (the others then stop). */
static void part_failed(stream_t *st, wrk_job_t *j, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void part_failed(stream_t *st, wrk_job_t *j, const char *code, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (j->group) {
        if (atomic_exchange(&j->group->failed, true)) return;
    }
    send_error(st, j, code, "%s", msg);
}

/* Runs one step of j. Returns true when j is finished (done, failed or
 * abandoned) and must be freed. */
static bool step_once(stream_t *st, wrk_job_t *j) {
    wrk_t *w = st->x->w;
    if (j->epoch != atomic_load(&w->epoch)) return true; /* the broker no longer waits for it */
    if (j->group && atomic_load(&j->group->failed)) return true; /* another part failed: its ERROR went out */
    if (j->deadline_at && wrk_mono_ms() > j->deadline_at) {
        /* The broker answered its client timeout: the rest of the steps
         * would be thrown away, and the worker is free for others now. */
        part_failed(st, j, WIRE_E_TIMEOUT, "dropped after %d of %d steps: past its deadline",
                    j->req ? tdit_req_steps_done(j->req) : 0, j->loop.steps);
        return true;
    }
    if (!j->req) {
        /* Held until the sync lands; a started group's next sub-batch is
         * not: the drain waits for it. A split group's parts start all at
         * once (counted together), so a drain never splits them across
         * two versions. */
        if (j->group && !j->counted) {
            wrk_group_t *g = j->group;
            pthread_mutex_lock(&g->mu);
            bool go = g->started || !atomic_load(&w->draining);
            if (go && !g->started) {
                /* The parts still to come through job_done: one already
                 * dropped (a new broker session) takes nothing off. */
                g->started = true;
                atomic_fetch_add(&w->running, g->parts_left);
            }
            pthread_mutex_unlock(&g->mu);
            if (!go) return false;
            j->counted = true; /* counted with its group */
        }
        if (!j->counted && atomic_load(&w->draining)) return false;
        if (!j->counted) atomic_fetch_add(&w->running, 1);
        j->counted = true;
        if (start_req(st, j) != 0) {
            part_failed(st, j, WIRE_E_INTERNAL, "cannot start: %s", kern_error());
            return true;
        }
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
        part_failed(st, j, WIRE_E_INTERNAL, "step %d of %d failed: %s", tdit_req_steps_done(j->req) + 1, tdit_req_steps(j->req),
                    kern_error());
        return true;
    }
    j->ran_version = v < 0 ? 0 : (uint64_t)v;
    if (tdit_req_steps_done(j->req) == 1 && j->at == 0) j->first_version = j->ran_version;
    if (res.ran == CAP_RAN_REPLAYED) wrk_events_replay(w->events, tdit_req_key_hash(j->req), st->idx);
    if (j->progress) send_progress_job(st, j);
    if (!tdit_req_done(j->req)) return false;
    if (j->n == 1 && !j->group) {
        send_result(st, j);
        return true;
    }
    if (gather(st, j) != 0) {
        part_failed(st, j, WIRE_E_INTERNAL, "gathering samples %d..%d: %s", j->base + j->at,
                    j->base + j->at + (int)tdit_req_batch(j->req) - 1, kern_error());
        return true;
    }
    j->at += (int)tdit_req_batch(j->req);
    if (j->at >= j->n) {
        if (!j->group) {
            send_group_result(st, j);
            return true;
        }
        /* A part: its counts into the group's; the last part sends (job_done). */
        wrk_group_t *g = j->group;
        const tdit_run_stats_t *a = &j->g_stats;
        pthread_mutex_lock(&g->mu);
        stats_add(&g->stats, a);
        if (a->seconds > g->stats.seconds) g->stats.seconds = a->seconds; /* the parts run side by side */
        if (!g->have_version || j->first_version < g->first_version) g->first_version = j->first_version;
        if (!g->have_version || j->ran_version > g->last_version) g->last_version = j->ran_version;
        g->have_version = true;
        pthread_mutex_unlock(&g->mu);
        j->ok = true;
        return true;
    }
    j->batches++;
    tdit_req_destroy(&j->req); /* the next round starts the next sub-batch */
    return false;
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
                /* Off the load before the RESULT goes out: a client's next
                 * request, sent on that RESULT, must see this stream free
                 * (else it lands on another stream, one whose graphs for
                 * its key may not exist yet). */
                atomic_fetch_sub(&st->load, 1);
                job_done(st, &j);
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

/* A copy of n floats (NULL for NULL); *ok false on OOM. */
static float *dup_f32(const float *src, size_t n, bool *ok) {
    if (!src) return NULL;
    float *d = malloc(n * sizeof *d);
    if (!d) *ok = false;
    else memcpy(d, src, n * sizeof *d);
    return d;
}

/* Splits group job j into parts, one per stream (at most one per sample),
 * each a contiguous run of samples. The parts, or NULL (out of memory: j
 * then runs whole, on one stream). */
static wrk_group_t *split_group(wrk_exec_t *x, wrk_job_t *j, wrk_job_t **parts, int *np) {
    int P = x->n < j->n ? x->n : j->n;
    size_t nl = j->n_latent, steps = (size_t)j->loop.steps, n = (size_t)j->n;
    size_t nc = (size_t)(j->shape.text_len * tdit_model_config(x->w->model)->text_dim);
    wrk_group_t *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_mutex_init(&g->mu, NULL);
    atomic_init(&g->failed, false);
    g->parts = g->parts_left = P;
    g->n = j->n;
    g->steps = j->loop.steps;
    g->progress_total = P * j->loop.steps;
    bool ok = (g->out = malloc(n * nl * sizeof *g->out)) && (g->vers = malloc(n * steps * sizeof *g->vers)) &&
              (!(j->rec & TDIT_REC_TRAJECTORY) || (g->traj = malloc(n * (steps + 1) * nl * sizeof *g->traj))) &&
              (!(j->rec & TDIT_REC_MEANS) || (g->means = malloc(n * steps * nl * sizeof *g->means))) &&
              (!(j->rec & TDIT_REC_LOG_PROBS) || (g->logp = malloc(n * steps * sizeof *g->logp)));
    int made = 0;
    for (int p = 0; ok && p < P; p++, made++) {
        int from = p * j->n / P, to = (p + 1) * j->n / P;
        wrk_job_t *c = calloc(1, sizeof *c);
        if (!c) { ok = false; break; }
        *c = *j;
        c->next = NULL;
        c->req = NULL;
        c->stg = NULL;
        c->g_out = c->g_traj = c->g_means = c->g_logp = NULL;
        c->g_vers = NULL;
        c->group = g;
        c->base = from;
        c->n = to - from;
        c->latent = dup_f32(j->latent ? j->latent + (size_t)from * nl : NULL, (size_t)c->n * nl, &ok);
        c->context = dup_f32(j->context, nc, &ok);
        c->uncond = dup_f32(j->uncond, nc, &ok);
        parts[p] = c;
        if (!ok) { made++; break; }
    }
    if (!ok) {
        for (int p = 0; p < made; p++) {
            parts[p]->group = NULL;
            wrk_job_free(&parts[p]);
        }
        group_free(g);
        return NULL;
    }
    *np = P;
    return g;
}

/* Onto stream `on` (0..n-1), or the least loaded one (-1). */
static void enqueue(wrk_exec_t *x, wrk_job_t *job, int on) {
    stream_t *best = &x->s[0];
    if (on >= 0 && on < x->n) best = &x->s[on];
    else
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

void wrk_exec_submit(wrk_exec_t *x, wrk_job_t *job) {
    /* On the CPU a stream is a thread, and a group's batched steps use one:
     * a group runs split over the streams, a part on each. */
    if (job->n > 1 && x->n > 1 && kern_backend_kind(x->w->backend) == KERN_BACKEND_CPU) {
        wrk_job_t *parts[WRK_MAX_STREAMS];
        int np = 0;
        if (split_group(x, job, parts, &np)) {
            wrk_job_free(&job);
            /* Split over every stream, part p runs on stream p, always:
             * each stream's graphs are its own, and the same group keeps
             * the same parts on the same streams, so its second run
             * replays every step. Fewer parts than streams: the least
             * loaded. */
            for (int p = 0; p < np; p++) enqueue(x, parts[p], np == x->n ? p : -1);
            return;
        }
    }
    enqueue(x, job, -1);
}

int wrk_exec_streams(const wrk_exec_t *x) { return x ? x->n : 0; }

int wrk_exec_stream_load(wrk_exec_t *x, int i) { return x && i >= 0 && i < x->n ? atomic_load(&x->s[i].load) : 0; }

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
