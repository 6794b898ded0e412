/* wrk_executor.c -- stream threads interleaving request steps (see
 * wrk_executor.h). */
#include "worker/wrk_executor.h"
#include "model/t2v.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/clock.h"
#include "base/error.h"
#include "model/tdit_program.h"
#include "worker/wrk_exec_state.h"
#include "worker/wrk_pipe.h"

/* The group's lock; its invariants are checked on release. */
static void glock(wrk_group_t *g) {
    pthread_mutex_lock(&g->mu);
    reel_owner_set(&g->owner);
}

static void gunlock(wrk_group_t *g) {
    WRK_CHECK(wrk_group_invariants(g));
    reel_owner_clear(&g->owner);
    pthread_mutex_unlock(&g->mu);
}

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

static void send_error(wrk_stream_t *st, const wrk_job_t *j, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(wrk_stream_t *st, const wrk_job_t *j, const char *code, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* (a broker that cancels, or lets expire, what it sends in a loop: within their share) */
    wrk_log_ended(st->x->w, "request %llu failed: %s", (unsigned long long)j->id, msg);
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

/* t = the U8 tensor `name` of shape dims[0..ndim) over data. */
static void u8_tensor_of(wire_tensor_t *t, const char *name, int ndim, const int64_t *dims, const uint8_t *data) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = WIRE_U8;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (t->shape[t->ndim++] = dims[d]);
    t->data = (void *)data;
    t->bytes = (size_t)n;
}

/* What a RESULT reports, from one request or a group's gathered
 * sub-batches: n samples, each's outputs in sample order. */
typedef struct {
    int n, steps;
    const float *out, *traj, *means, *logp;
    const uint64_t *vers;        /* [n][steps] */
    const tdit_run_stats_t *stats;
} outputs_t;

/* j's loop overflowed (its `what` would hold NaN or infinity): whose
 * fault, as an ERROR. The request's when one of its values is far past
 * what a model steps (a guidance scale beyond ±1e3, a shift outside
 * 1e-3..1e3, an SDE eta above 10, an input tensor with |x| above 1e4):
 * bad_request naming it. Otherwise the weights' it ran on: internal,
 * naming their version (a fine request is not blamed). */
static void overflowed(const wrk_job_t *j, const char *what, char code[24], char *msg, size_t len) {
    const tdit_loop_t *p = &j->loop;
    int at = snprintf(msg, len, "the loop's %s holds NaN or infinite values after %d steps", what, p->steps);
    at = at < 0 ? 0 : at >= (int)len ? (int)len - 1 : at;
    float lat = j->input_abs[0], ctx = j->input_abs[1], unc = j->input_abs[2];
    snprintf(code, 24, "%s", WIRE_E_BAD_REQUEST);
    if (j->shape.cfg && fabsf(p->guidance) > 1e3f)
        snprintf(msg + at, len - (size_t)at, ": its guidance scale %g is far past what a model steps", p->guidance);
    else if (!(p->shift >= 1e-3 && p->shift <= 1e3))
        snprintf(msg + at, len - (size_t)at, ": its shift %g is far from what a model steps (1 to 20)", p->shift);
    else if (p->sde && p->eta > 10)
        snprintf(msg + at, len - (size_t)at, ": its eta %g is far past what an SDE steps (0 to 1)", p->eta);
    else if (lat > 1e4f || ctx > 1e4f || unc > 1e4f)
        snprintf(msg + at, len - (size_t)at, ": its %s holds values up to %g, far past what a model steps",
                 lat > 1e4f ? "latent" : ctx > 1e4f ? "context" : "uncond", lat > 1e4f ? lat : ctx > 1e4f ? ctx : unc);
    else if (!strcmp(what, "decoded video")) {
        snprintf(code, 24, "%s", WIRE_E_INTERNAL);
        snprintf(msg + at, len - (size_t)at,
                 " though the request's values are usual: the VAE's weights, or the transformer's it ran on (v%llu), "
                 "overflow",
                 (unsigned long long)j->ran_version);
    } else {
        snprintf(code, 24, "%s", WIRE_E_INTERNAL);
        snprintf(msg + at, len - (size_t)at,
                 " though the request's values are usual: the weights it ran on (transformer v%llu) overflow the "
                 "model",
                 (unsigned long long)j->ran_version);
    }
}

/* The RESULT's version runs (over the n×steps grid of (sample, step),
 * sample-major: one sample's steps for a single request) and the rollout
 * tensors the GEN asked for (t[1..]); *sig and *runs are the caller's to
 * free. A group's tensors gain a leading [n]. -1 on OOM. */
static int result_extras(const wrk_job_t *j, const outputs_t *o, msg_result_t *r, wire_tensor_t *t, float **sig,
                         float **ts, msg_version_run_t **runs) {
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
    if (j->want_timesteps) { /* each step's t as the transformer took it */
        if (!(*ts = malloc((size_t)(steps ? steps : 1) * sizeof **ts))) return -1;
        for (int i = 0; i < steps; i++) (*ts)[i] = (float)tdit_req_timestep(j->req, i);
        int64_t nt = steps;
        tensor_of(&t[k], "timesteps", 0, NULL, 1, &nt, *ts);
        r->timesteps = &t[k++];
    }
    return 0;
}

/* After each decoded latent frame: PROGRESS when asked (every step done,
 * `decoded` of `decode_frames` latent frames, docs/PROTOCOL.md), and
 * whether to stop -- the request was cancelled, is past its deadline, or
 * its broker session ended: the rest of the decode would be thrown away
 * and would hold the VAE from the next request. */
typedef struct {
    wrk_stream_t *st;
    const wrk_job_t *j;
    uint64_t steps;
    int stop; /* why it stopped: 0, or WHY_* below */
    int64_t done, total;
} decode_progress_t;

enum { WHY_GONE = 1, WHY_CANCELLED, WHY_DEADLINE };

static int decode_progress(void *user, int64_t done, int64_t total) {
    decode_progress_t *d = user;
    wrk_t *w = d->st->x->w;
    const wrk_job_t *j = d->j;
    d->done = done;
    d->total = total;
    if (j->progress) {
        msg_progress_t p = { d->steps, d->steps, (uint64_t)done, (uint64_t)total };
        if (wrk_pipe_send(d->st->push, j->epoch, MSG_PROGRESS, j->id, &p) != 0)
            wrk_log(w, "stream %d: cannot queue PROGRESS of request %llu", d->st->idx, (unsigned long long)j->id);
    }
    if (done >= total) return 0; /* decoded: nothing left to save */
    if (j->epoch != atomic_load(&w->epoch)) d->stop = WHY_GONE;
    else if (wrk_cancelled(j)) d->stop = WHY_CANCELLED;
    else if (j->deadline_at && wrk_mono_ms() > j->deadline_at) d->stop = WHY_DEADLINE;
    return d->stop;
}

/* The decoded output the GEN asked for (frames, or an MP4) into t[0] and
 * r, with the seconds it took; *frames and *mp4 are the caller's to free.
 * 0 when none was asked; -1 with the ERROR sent. */
static int decoded(wrk_stream_t *st, wrk_job_t *j, const outputs_t *o, msg_result_t *r, wire_tensor_t *t,
                   uint8_t **frames, uint8_t **mp4) {
    bool video = !strcmp(j->output, "video");
    if (!video && strcmp(j->output, "frames")) return 0;
    wrk_t *w = st->x->w;
    size_t len = 0;
    double t0 = reel_mono_s();
    decode_progress_t dp = { st, j, 0, 0, 0, 0 };
    if (j->progress) { /* the loop's steps, all done: the decode's frames follow */
        if (j->group) {
            glock(j->group);
            dp.steps = j->group->progress_total;
            gunlock(j->group);
        } else {
            dp.steps = (uint64_t)((j->n + j->chunk - 1) / (j->chunk ? j->chunk : 1)) * (uint64_t)j->loop.steps;
        }
    }
    if (t2v_vae_decode_progress(w->vae, o->out, o->n, j->latent_shape, frames, video ? mp4 : NULL, &len,
                                decode_progress, &dp) != 0) {
        if (dp.stop == WHY_GONE) { /* the broker no longer waits for it */
        } else if (dp.stop == WHY_CANCELLED) { /* as abandoned(): this ERROR frees its slot at the broker */
            send_error(st, j, WIRE_E_CANCELLED, "cancelled by its client while its output decoded (after %lld of %lld "
                       "latent frames)", (long long)dp.done, (long long)dp.total);
        } else if (dp.stop == WHY_DEADLINE) {
            send_error(st, j, WIRE_E_TIMEOUT, "dropped while its output decoded (after %lld of %lld latent frames): "
                       "past its deadline", (long long)dp.done, (long long)dp.total);
        } else if (strstr(reel_err()->msg, VAE_E_NONFINITE)) { /* the loop's latent is finite: whose values overflowed */
            char code[24], msg[240];
            overflowed(j, "decoded video", code, msg, sizeof msg);
            send_error(st, j, code, "%s", msg);
        } else {
            send_error(st, j, WIRE_E_INTERNAL, "decoding the latent: %s", reel_err_text());
        }
        return -1;
    }
    r->decode_seconds = reel_mono_s() - t0;
    int64_t n1 = (int64_t)len;
    int64_t dims[5] = { o->n, 1 + 4 * (j->latent_shape[1] - 1), 8 * j->latent_shape[2], 8 * j->latent_shape[3], 3 };
    if (video) {
        u8_tensor_of(t, "video", 1, &n1, *mp4);
        r->video = t;
    } else {
        u8_tensor_of(t, "frames", o->n > 1 ? 5 : 4, o->n > 1 ? dims : dims + 1, *frames);
        r->frames = t;
    }
    return 0;
}

/* RESULT {worker, version, first_version, stats, key_hash, version_runs,
 * n, seeds} + latent and the rollout tensors asked for. */
static void send_outputs(wrk_stream_t *st, wrk_job_t *j, const outputs_t *o) {
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
    r->stats.batched = (uint64_t)rs->batched;
    r->stats.batch_rows = (uint64_t)rs->batch_rows;
    r->stats.padded_rows = (uint64_t)rs->padded_rows;
    r->stats.capture_key = tdit_req_key_hash(j->req);
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
    /* The latent was judged as it was read (tdit_req_read); the rollout
     * records must be finite too, or the RESULT would carry garbage. */
    size_t nl = (size_t)o->n * j->n_latent, steps = (size_t)o->steps;
    const char *bad = o->traj && !kern_all_finite(o->traj, nl * (steps + 1), KERN_F32)   ? "trajectory"
                      : o->means && !kern_all_finite(o->means, nl * steps, KERN_F32)     ? "means tensor"
                      : o->logp && !kern_all_finite(o->logp, (size_t)o->n * steps, KERN_F32) ? "log_probs tensor"
                                                                                           : NULL;
    if (bad) {
        char code[24], msg[240];
        overflowed(j, bad, code, msg, sizeof msg);
        send_error(st, j, code, "%s", msg);
        free(r);
        return;
    }
    wire_tensor_t t[8];
    float *sig = NULL, *tsteps = NULL;
    uint8_t *frames = NULL, *mp4 = NULL;
    msg_version_run_t *runs = NULL;
    if (result_extras(j, o, r, t, &sig, &tsteps, &runs) != 0) {
        send_error(st, j, WIRE_E_INTERNAL, "out of memory building the RESULT");
        goto out;
    }
    int64_t g = o->n;
    tensor_of(&t[0], "latent", o->n > 1, &g, 4, j->latent_shape, o->out);
    r->latent = &t[0];
    if (decoded(st, j, o, r, &t[6], &frames, &mp4) != 0) goto out;
    r->encode_seconds = j->encode_s;
    if (wrk_pipe_send(st->push, j->epoch, MSG_RESULT, j->id, r) != 0)
        wrk_log(w, "stream %d: cannot queue RESULT of request %llu: %s", st->idx, (unsigned long long)j->id,
                zmq_strerror(errno));
out:
    free(sig);
    free(tsteps);
    free(frames);
    free(mp4);
    free(runs);
    free(r);
}

/* The RESULT of a single request, straight from its tdit_req. */
static void send_result(wrk_stream_t *st, wrk_job_t *j) {
    float *out = malloc(j->n_latent * sizeof *out);
    if (!out) {
        send_error(st, j, WIRE_E_INTERNAL, "out of memory reading the result");
        return;
    }
    if (tdit_req_read(j->req, st->ks, out, j->n_latent) != 0) {
        char code[24], msg[240];
        if (reel_err_code() == REEL_E_INVALID) { /* the loop overflowed (tdit_req_read) */
            overflowed(j, "result", code, msg, sizeof msg);
            send_error(st, j, code, "%s", msg);
        } else {
            send_error(st, j, WIRE_E_INTERNAL, "reading the result: %s", reel_err_text());
        }
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
    dst->batched += src->batched;
    dst->batch_rows += src->batch_rows;
    dst->padded_rows += src->padded_rows;
    for (int i = 0; i < CAP_DECLINE_COUNT; i++) dst->declines[i] += src->declines[i];
}

static int gather(wrk_stream_t *st, wrk_job_t *j) {
    const tdit_req_t *q = j->req;
    size_t n = (size_t)j->n, nl = j->n_latent, steps = (size_t)tdit_req_steps(q), b = (size_t)tdit_req_batch(q);
    if (!j->group && !j->g_out) {
        if (!(j->g_out = malloc(n * nl * sizeof *j->g_out)) || !(j->g_vers = malloc(n * steps * sizeof *j->g_vers)) ||
            ((j->rec & TDIT_REC_TRAJECTORY) && !(j->g_traj = malloc(n * (steps + 1) * nl * sizeof *j->g_traj))) ||
            ((j->rec & TDIT_REC_MEANS) && !(j->g_means = malloc(n * steps * nl * sizeof *j->g_means))) ||
            ((j->rec & TDIT_REC_LOG_PROBS) && !(j->g_logp = malloc(n * steps * sizeof *j->g_logp))))
            return reel_fail(REEL_E_NOMEM, "out of memory gathering a group of %zu", n);
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

static void send_group_result(wrk_stream_t *st, wrk_job_t *j) {
    outputs_t o = { j->n, tdit_req_steps(j->req), j->g_out, j->g_traj, j->g_means, j->g_logp, j->g_vers,
                    &j->g_stats };
    send_outputs(st, j, &o);
}

/* The RESULT of a split group, sent by its last part j (which still holds
 * its tdit_req: the schedule and the key hash). The group's seeds are
 * j's from base 0 on: every part carries the whole group's seeds. */
static void send_split_result(wrk_stream_t *st, wrk_job_t *j, wrk_group_t *g) {
    if (j->progress) {
        /* The group's last count, again, ahead of its RESULT on this
         * stream's pipe: another part's last PROGRESS went through another
         * stream's pipe and could reach the broker after the RESULT (and be
         * dropped there, the client left short of the total). The broker
         * drops the count when it has it already. */
        glock(g);
        msg_progress_t p = { (uint64_t)g->progress_done, (uint64_t)g->progress_total, 0, 0 };
        gunlock(g);
        if (wrk_pipe_send(st->push, j->epoch, MSG_PROGRESS, j->id, &p) != 0)
            wrk_log(st->x->w, "stream %d: cannot queue PROGRESS of request %llu", st->idx, (unsigned long long)j->id);
    }
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
static tdit_staging_t *take_staging(wrk_stream_t *st, const tdit_shape_t *sh) {
    for (int i = 0; i < st->npool; i++)
        if (!st->busy[i] && tdit_shape_equal(tdit_staging_shape(st->pool[i]), sh)) {
            st->busy[i] = true;
            st->used[i] = ++st->clock;
            return st->pool[i];
        }
    int slot = st->npool < WRK_STG_POOL ? st->npool : -1;
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

/* Hands staging set stg (taken by take_staging; NULL: none) back. */
static void release_staging(wrk_stream_t *st, tdit_staging_t *stg) {
    if (stg)
        for (int i = 0; i < st->npool; i++)
            if (st->pool[i] == stg) st->busy[i] = false;
}

/* Hands j's staging set back to the pool. */
static void put_staging(wrk_stream_t *st, wrk_job_t *j) {
    release_staging(st, j->stg);
    j->stg = NULL;
}

/* Frees j, handing its staging set back to the pool. The last part of a
 * split group to finish sends the group's RESULT when every part ran
 * (and the broker still waits for it), then frees the group. */
static void job_done(wrk_stream_t *st, wrk_job_t **jp) {
    wrk_job_t *j = *jp;
    wrk_group_t *g = j ? j->group : NULL;
    if (j && !g && j->counted) wrk_running_done(st->x->w);
    if (j) put_staging(st, j);
    if (g) {
        glock(g);
        /* Counted with its group when the group started, whether or not
         * this part ever ran a step. */
        if (g->started) wrk_running_done(st->x->w);
        bool last = --g->parts_left == 0;
        if (j->ok) g->parts_ok++;
        bool send = last && g->parts_ok == g->parts && !atomic_load(&g->failed);
        gunlock(g);
        if (send && j->epoch == atomic_load(&st->x->w->epoch)) send_split_result(st, j, g);
        if (last) group_free(g);
    }
    wrk_job_free(jp);
}

/* The most samples of shape one step may hold: --max-tokens bounds a
 * step's tokens, so one sample alone may have them all, and a batch of n
 * costs n of them (a deadline is looked at between steps only: without
 * this, one legal group of large samples held its stream for minutes). */
static int rows_cap(const wrk_t *w, const tdit_shape_t *shape) {
    int64_t tokens = shape->frames * (shape->height / WRK_PATCH) * (shape->width / WRK_PATCH);
    if (w->opt->max_tokens <= 0 || tokens <= 0) return TDIT_MAX_BATCH;
    int64_t c = w->opt->max_tokens / tokens;
    return c < 1 ? 1 : c > TDIT_MAX_BATCH ? TDIT_MAX_BATCH : (int)c;
}

/* A group's samples per batched step: all n of them when their tokens
 * stay within --max-tokens and that workspace fits the cache budget, else
 * halved until they do (1 at worst). */
static int chunk_for(const wrk_t *w, const tdit_shape_t *shape, int n) {
    int b = n, cap = rows_cap(w, shape);
    while (b > cap) b = (b + 1) / 2;
    while (b > 1 && w->opt->budget) {
        tdit_shape_t sh = *shape;
        sh.batch = b;
        size_t need = tdit_ws_size(w->model, &sh);
        if (need && need <= w->opt->budget) break;
        b = (b + 1) / 2;
    }
    return b;
}

static int choose_chunk(const wrk_t *w, const wrk_job_t *j) { return chunk_for(w, &j->shape, j->n); }

/* When r's shape and loop kind is a key still to prewarm on st: takes it
 * off the list and marks r a prewarm (this step, its first alone,
 * captures at once, skipping warmup: the key is hot). Asked just before
 * r's first step alone, not when r starts: a request that steps in mixed
 * batches captures no graph of its key, so the key stays on the list for
 * the background prewarm. True when taken. */
static bool claim(wrk_stream_t *st, const tdit_req_t *r, int rows, uint64_t *shard_out);

static bool prewarm_claim(wrk_stream_t *st, tdit_req_t *r) {
    uint64_t shard;
    if (!claim(st, r, 0, &shard)) return false;
    tdit_req_set_prewarm(r, true);
    wrk_log(st->x->w, "stream %d: a request of key %016llx came before its prewarm: its first step captures",
            st->idx, (unsigned long long)shard);
    return true;
}

/* Takes the listed key of r's shape and loop kind, as itself (rows 0) or
 * as a mixed batch of `rows` rows, off st's prewarm list. True when it
 * was there (*shard_out: its shard hash). */
static bool claim(wrk_stream_t *st, const tdit_req_t *r, int rows, uint64_t *shard_out) {
    if (atomic_load(&st->pw_left) == 0) return false;
    bool got = false;
    uint64_t shard = 0;
    pthread_mutex_lock(&st->pw_mu);
    for (int i = st->pw_at; i < st->npw && !got; i++) {
        wrk_prewarm_t *p = &st->pw[i];
        if (p->rows != rows || !tdit_shape_equal(&p->shape, tdit_req_shape(r)) || p->loop.sde != tdit_req_loop(r)->sde)
            continue;
        shard = p->shard;
        st->pw_at = wrk_prewarm_take(st->pw, st->pw_at, i); /* the rest kept in order, hottest first */
        atomic_store(&st->pw_left, st->npw - st->pw_at);
        got = true;
    }
    pthread_mutex_unlock(&st->pw_mu);
    *shard_out = shard;
    return got;
}

/* Starts j's request: the single request, or the group's next sub-batch
 * (chunk samples, or what is left). A sub-batch that cannot be set up
 * (device memory) is tried again at half the size. 0, or -1 with a
 * message. */
static int start_req(wrk_stream_t *st, wrk_job_t *j) {
    wrk_t *w = st->x->w;
    if (!j->chunk) {
        j->chunk = choose_chunk(w, j);
        if (j->group) { /* a part in several batches: more steps to report */
            glock(j->group);
            j->group->progress_total += ((j->n + j->chunk - 1) / j->chunk - 1) * j->loop.steps;
            gunlock(j->group);
        }
        if (j->chunk < j->n && j->n > rows_cap(w, &j->shape))
            wrk_log_noted(w,
                          "request %llu: a group of %d runs in batches of %d (a batch's tokens stay within "
                          "--max-tokens %lld)",
                          (unsigned long long)j->id, j->n, j->chunk, (long long)w->opt->max_tokens);
        else if (j->chunk < j->n)
            wrk_log_noted(w,
                          "request %llu: a group of %d runs in batches of %d (a batch of %d would not fit the "
                          "%zu-byte budget)",
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
        if (j->req) {
            j->pw_unasked = true; /* prewarm_claim, at its first step alone */
            break;
        }
        if (b == 1) return -1;
        j->chunk = (b + 1) / 2;
        if (j->group) { /* more batches to report */
            glock(j->group);
            j->group->progress_total += ((left + j->chunk - 1) / j->chunk - (left + b - 1) / b) * j->loop.steps;
            gunlock(j->group);
        }
        wrk_log_noted(w, "request %llu: a batch of %d samples cannot start (%s); batches of %d",
                      (unsigned long long)j->id, b, reel_err_text(), j->chunk);
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
 * steps; two parts' messages may arrive a step out of order, and the
 * broker forwards only a count past the last one, brk_req_progress). */
static void send_progress_job(wrk_stream_t *st, const wrk_job_t *j) {
    int steps = tdit_req_steps(j->req), b = (int)tdit_req_batch(j->req);
    int rest = j->n - j->at - b, more = rest > 0 ? (rest + j->chunk - 1) / j->chunk : 0;
    msg_progress_t p = { (uint64_t)(j->batches * steps + tdit_req_steps_done(j->req)),
                         (uint64_t)((j->batches + 1 + more) * steps), 0, 0 };
    if (j->group) {
        wrk_group_t *g = j->group;
        glock(g);
        g->progress_done++;
        if (g->progress_total < g->progress_done) g->progress_total = g->progress_done;
        p = (msg_progress_t){ (uint64_t)g->progress_done, (uint64_t)g->progress_total, 0, 0 };
        gunlock(g);
    }
    if (wrk_pipe_send(st->push, j->epoch, MSG_PROGRESS, j->id, &p) != 0)
        wrk_log(st->x->w, "stream %d: cannot queue PROGRESS of request %llu", st->idx, (unsigned long long)j->id);
}

/* j cannot go on: ERROR for its request, unless it is a part of a split
 * group whose other part already sent one (the others then stop). */
static void part_failed(wrk_stream_t *st, wrk_job_t *j, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void part_failed(wrk_stream_t *st, wrk_job_t *j, const char *code, const char *fmt, ...) {
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

/* What one turn of a job in the round did. */
typedef enum {
    STEP_RAN,                    /* stepped (or started): it goes on next round */
    STEP_HELD,                   /* not started: a drain holds new requests */
    STEP_DONE,                   /* finished, failed or abandoned: free it */
} step_t;

/* True when j is over before its step: its broker session ended, another
 * part of its group failed (that part's ERROR went out), or its deadline
 * passed (ERROR timeout sent). */
static bool abandoned(wrk_stream_t *st, wrk_job_t *j) {
    wrk_t *w = st->x->w;
    if (j->epoch != atomic_load(&w->epoch)) return true; /* the broker no longer waits for it */
    if (j->group && atomic_load(&j->group->failed)) {
        /* the part that failed sent the group's one ERROR and logged why */
        wrk_log_ended(w, "stream %d: request %llu: samples %d..%d stop after %d of %d steps: another part of the "
                      "group failed",
                      st->idx, (unsigned long long)j->id, j->base, j->base + j->n - 1,
                      j->req ? tdit_req_steps_done(j->req) : 0, j->loop.steps);
        return true;
    }
    if (wrk_cancelled(j)) {
        /* The broker answered its client already: nothing more is sent
         * for it but this ERROR, which frees its slot there. */
        part_failed(st, j, WIRE_E_CANCELLED, "cancelled by its client after %d of %d steps",
                    j->req ? tdit_req_steps_done(j->req) : 0, j->loop.steps);
        return true;
    }
    if (j->deadline_at && wrk_mono_ms() > j->deadline_at) {
        /* The broker answered its client timeout: the rest of the steps
         * would be thrown away, and the worker is free for others now. */
        part_failed(st, j, WIRE_E_TIMEOUT, "dropped after %d of %d steps: past its deadline",
                    j->req ? tdit_req_steps_done(j->req) : 0, j->loop.steps);
        return true;
    }
    return false;
}

/* The contexts of j's prompt (and, guided, its negative prompt), padded
 * to text_len, by the worker's text encoder on this stream. */
static int encode_prompts(wrk_stream_t *st, wrk_job_t *j) {
    wrk_t *w = st->x->w;
    int64_t rows;
    double t0 = reel_mono_s();
    if (t2v_text_context(w->text, j->prompt, &j->context, &rows) != 0 ||
        (j->neg_prompt && t2v_text_context(w->text, j->neg_prompt, &j->uncond, &rows) != 0))
        return -1;
    j->encode_s = reel_mono_s() - t0;
    return 0;
}

/* j has no request running: counts it in wrk_t.running unless a drain
 * holds it, then starts its request (or its next sub-batch). Held until
 * the sync lands; a started group's next sub-batch is not: the drain waits
 * for it. A split group's parts start all at once (counted together), so
 * a drain never splits them across two versions. STEP_DONE when it cannot
 * start (ERROR sent). */
static step_t admit(wrk_stream_t *st, wrk_job_t *j) {
    wrk_t *w = st->x->w;
    if (j->group && !j->counted) {
        wrk_group_t *g = j->group;
        glock(g);
        bool go = g->started || !atomic_load(&w->draining);
        if (go && !g->started) {
            /* The parts still to come through job_done: one already
             * dropped (a new broker session) takes nothing off. */
            g->started = true;
            wrk_running_add(w, g->parts_left);
        }
        gunlock(g);
        if (!go) return STEP_HELD;
        j->counted = true; /* counted with its group */
    }
    if (!j->counted && atomic_load(&w->draining)) return STEP_HELD;
    if (!j->counted) wrk_running_add(w, 1);
    j->counted = true;
    if (j->prompt && !j->context && encode_prompts(st, j) != 0) {
        part_failed(st, j, reel_err_code() == REEL_E_INVALID ? WIRE_E_BAD_REQUEST : WIRE_E_INTERNAL,
                    "cannot encode the prompt: %s", reel_err_text());
        return STEP_DONE;
    }
    if (start_req(st, j) != 0) {
        part_failed(st, j, WIRE_E_INTERNAL, "cannot start: %s", reel_err_text());
        return STEP_DONE;
    }
    return STEP_RAN;
}

/* ---- what batching costs (--batching auto) ------------------------------ */

/* The stream's costs for requests of r's kind: kept, or a fresh entry in
 * place of the oldest. */
static wrk_batch_cost_t *cost_of(wrk_stream_t *st, const tdit_req_t *r) {
    const tdit_shape_t *sh = tdit_req_shape(r);
    bool sde = tdit_req_loop(r)->sde;
    for (int i = 0; i < st->ncost; i++)
        if (st->cost[i].sde == sde && tdit_shape_equal(&st->cost[i].one, sh)) return &st->cost[i];
    int at = st->ncost < WRK_MIX_POOL ? st->ncost++ : st->cost_next++ % WRK_MIX_POOL;
    st->cost[at] = (wrk_batch_cost_t){ .one = *sh, .sde = sde };
    return &st->cost[at];
}

/* A request's step took s seconds, alone or (its share) in a mixed step. */
static void cost_note(wrk_batch_cost_t *c, bool mixed, double s) {
    double *avg = mixed ? &c->mixed_s : &c->alone_s;
    int *n = mixed ? &c->n_mixed : &c->n_alone;
    *avg = *n ? 0.8 * *avg + 0.2 * s : s;
    if (*n < 1000) (*n)++;
}

#define WRK_BATCH_LEARN 3      /* steps of each way before choosing */
#define WRK_BATCH_EXPLORE 16   /* then one turn in this many the other way, to follow changes */

/* Whether requests of c's kind that can share a step should (auto): each
 * way measured a few times first, then the cheaper per request, the other
 * way now and then so a change (load, sizes) is seen. */
static bool cost_says_batch(wrk_batch_cost_t *c) {
    c->turns++;
    if (c->n_alone < WRK_BATCH_LEARN) return false;
    if (c->n_mixed < WRK_BATCH_LEARN) return true;
    bool better = c->mixed_s < c->alone_s;
    return c->turns % WRK_BATCH_EXPLORE == 0 ? !better : better;
}

/* What follows a step of j's request that ran on version v (alone or in
 * a mixed batch): the version, PROGRESS. */
static void after_step(wrk_stream_t *st, wrk_job_t *j, int64_t v) {
    j->ran_version = v < 0 ? 0 : (uint64_t)v;
    if (tdit_req_steps_done(j->req) == 1 && j->at == 0) j->first_version = j->ran_version;
    if (j->progress) send_progress_job(st, j);
}

/* One step of j's request under the read side of the step lock, and what
 * it tells: the version it ran on, a replay, PROGRESS. 0, or -1 when j is
 * over (the step failed: ERROR sent; or the weights are unusable). */
static int step_locked(wrk_stream_t *st, wrk_job_t *j) {
    wrk_t *w = st->x->w;
    cap_result_t res;
    if (j->pw_unasked) { /* a hot key's request before its prewarm: this step captures at once */
        j->pw_unasked = false;
        prewarm_claim(st, j->req);
    }
    pthread_rwlock_rdlock(&w->step_lock);
    if (atomic_load(&w->fatal)) { /* a reload failed part-way: never step on mixed weights */
        pthread_rwlock_unlock(&w->step_lock);
        return -1;
    }
    double t0 = reel_mono_s();
    int rc = tdit_req_step(j->req, w->cache, st->ks, &res);
    tdit_req_set_prewarm(j->req, false); /* (prewarm_claim) this step only */
    double dt = reel_mono_s() - t0;
    /* Read under the same lock: the version this step ran on. */
    int64_t v = cap_component_version(w->cache, TDIT_COMPONENT);
    pthread_rwlock_unlock(&w->step_lock);
    /* what a step alone costs, for --batching auto to weigh (only where it batches) */
    if (rc == 0 && res.ran != CAP_RAN_CAPTURED && w->opt->max_batch > 1 && !w->opt->batch_always &&
        tdit_req_batch(j->req) == 1 &&
        !tdit_solver_multistep(tdit_req_shape(j->req)->solver))
        cost_note(cost_of(st, j->req), false, dt);
    if (rc != 0) {
        part_failed(st, j, WIRE_E_INTERNAL, "step %d of %d failed: %s", tdit_req_steps_done(j->req) + 1, tdit_req_steps(j->req),
                    reel_err_text());
        return -1;
    }
    wrk_count_step(w, tdit_req_batch(j->req));
    if (res.ran == CAP_RAN_REPLAYED) wrk_events_replay(w->events, tdit_req_key_hash(j->req), st->idx);
    after_step(st, j, v);
    return 0;
}

/* ---- mixed batches ---------------------------------------------------------- */

/* (the broker refuses a RESULT counting more rows a batched step than
 * MSG_MAX_BATCH_ROWS: schema/msg.h) */
_Static_assert(TDIT_MAX_BATCH <= MSG_MAX_BATCH_ROWS, "a mixed step's rows must stay within what a RESULT may count");

/* The rows a batch of n runs as: n (--batch-sizes exact), else the next
 * power of two, at most --max-batch. */
static int batch_rows(const wrk_t *w, int n) {
    if (w->opt->batch_exact) return n;
    int b = 2;
    while (b < n) b *= 2;
    return b < w->opt->max_batch ? b : w->opt->max_batch;
}

/* The stream's batch buffers for requests like r, `rows` rows: one it
 * has, or a new one in place of the least recently used. NULL with a
 * message (out of memory: the caller steps them alone). */
static tdit_mix_t *mix_for(wrk_stream_t *st, const tdit_req_t *r, int rows, bool sde) {
    wrk_t *w = st->x->w;
    int lru = 0;
    for (int i = 0; i < st->nmix; i++) {
        if (tdit_mix_capacity(st->mix[i]) == rows && tdit_mix_fits(st->mix[i], r)) {
            st->mix_used[i] = ++st->clock;
            return st->mix[i];
        }
        if (st->mix_used[i] < st->mix_used[lru]) lru = i;
    }
    int at = st->nmix < WRK_MIX_POOL ? st->nmix : lru;
    tdit_shape_t one = *tdit_req_shape(r);
    tdit_mix_t *x = tdit_mix_new(w->model, st->ks, &one, sde, rows);
    if (!x) return NULL;
    if (at < st->nmix) tdit_mix_destroy(&st->mix[at]);
    else st->nmix++;
    st->mix[at] = x;
    st->mix_used[at] = ++st->clock;
    return x;
}

/* One step of each of jobs[0..n) (n >= 2, each request mixable, all of one
 * kind) as one mixed step. Each job's turn: STEPPED, or FAILED (ERROR
 * sent). When the batch cannot run and nobody moved (no buffers, or the
 * step refused before it ran), each steps alone instead. */
static void step_mixed(wrk_stream_t *st, wrk_job_t **jobs, int n) {
    wrk_t *w = st->x->w;
    tdit_req_t *reqs[TDIT_MAX_BATCH];
    for (int i = 0; i < n; i++) reqs[i] = jobs[i]->req;
    int rows = batch_rows(w, n);
    tdit_mix_t *x = mix_for(st, reqs[0], rows, tdit_req_loop(reqs[0])->sde);
    bool advanced = false;
    int rc = -1;
    cap_result_t res;
    int64_t v = 0;
    if (x) {
        uint64_t shard;
        if (claim(st, reqs[0], rows, &shard)) { /* a batch of a hot key before its prewarm: captures at once */
            tdit_mix_set_prewarm(x, true);
            wrk_log(w, "stream %d: a batch of %d of key %016llx came before its prewarm: its step captures", st->idx,
                    rows, (unsigned long long)shard);
        }
        pthread_rwlock_rdlock(&w->step_lock);
        if (atomic_load(&w->fatal)) {
            pthread_rwlock_unlock(&w->step_lock);
            tdit_mix_set_prewarm(x, false);
            for (int i = 0; i < n; i++) jobs[i]->turn = WRK_TURN_FAILED;
            return;
        }
        double t0 = reel_mono_s();
        rc = tdit_mix_step(x, reqs, n, w->cache, st->ks, &res, &advanced);
        tdit_mix_set_prewarm(x, false);
        double dt = reel_mono_s() - t0;
        v = cap_component_version(w->cache, TDIT_COMPONENT);
        pthread_rwlock_unlock(&w->step_lock);
        if (rc == 0 && res.ran != CAP_RAN_CAPTURED && !w->opt->batch_always)
            cost_note(cost_of(st, reqs[0]), true, dt / n);
    }
    if (rc != 0 && !advanced) {
        wrk_log(w, "stream %d: a batch of %d could not run (%s); each steps alone", st->idx, n, reel_err_text());
        for (int i = 0; i < n; i++) jobs[i]->turn = step_locked(st, jobs[i]) == 0 ? WRK_TURN_STEPPED : WRK_TURN_FAILED;
        return;
    }
    if (rc != 0) {
        for (int i = 0; i < n; i++) {
            part_failed(st, jobs[i], WIRE_E_INTERNAL, "step %d of %d (in a batch of %d) failed: %s",
                        tdit_req_steps_done(jobs[i]->req) + 1, tdit_req_steps(jobs[i]->req), n, reel_err_text());
            jobs[i]->turn = WRK_TURN_FAILED;
        }
        return;
    }
    wrk_count_step(w, n);
    atomic_fetch_add(&w->mixed_steps, 1);
    atomic_fetch_add(&w->padded_rows, (uint64_t)(rows - n));
    /* one replay of the batch's graph, under its key (each member's
     * tdit_req_key_hash is now that key), not one per member */
    if (res.ran == CAP_RAN_REPLAYED) wrk_events_replay(w->events, tdit_req_key_hash(reqs[0]), st->idx);
    for (int i = 0; i < n; i++) {
        after_step(st, jobs[i], v);
        jobs[i]->turn = WRK_TURN_STEPPED;
    }
}

/* Steps every READY job of the round's ready list once: the mixable ones
 * of one kind together, --max-batch at a time, in arrival order; the rest
 * alone. */
static void step_ready(wrk_stream_t *st, wrk_job_t *ready) {
    wrk_t *w = st->x->w;
    for (wrk_job_t *j = ready; j; j = j->rnext) {
        if (j->turn != WRK_TURN_READY) continue;
        wrk_job_t *batch[TDIT_MAX_BATCH];
        int n = 0;
        if (w->opt->max_batch > 1 && tdit_req_mixable(j->req)) {
            /* rows (padding included) within --max-tokens, as a group's */
            int cap = rows_cap(w, tdit_req_shape(j->req));
            batch[n++] = j;
            for (wrk_job_t *k = j->rnext; k && n < w->opt->max_batch; k = k->rnext)
                if (k->turn == WRK_TURN_READY && tdit_req_mixable(k->req) && tdit_req_same_class(j->req, k->req) &&
                    batch_rows(w, n + 1) <= cap)
                    batch[n++] = k;
        }
        if (n >= 2 && (w->opt->batch_always || cost_says_batch(cost_of(st, j->req)))) {
            step_mixed(st, batch, n);
            continue;
        }
        /* alone: j, and (when a batch was declined) the others of its kind in their turn */
        j->turn = step_locked(st, j) == 0 ? WRK_TURN_STEPPED : WRK_TURN_FAILED;
        for (int i = 1; i < n; i++)
            batch[i]->turn = step_locked(st, batch[i]) == 0 ? WRK_TURN_STEPPED : WRK_TURN_FAILED;
    }
}

/* A part that ran all its samples: its counts into the group's; the last
 * part sends (job_done). */
static void part_into_group(wrk_job_t *j) {
    wrk_group_t *g = j->group;
    const tdit_run_stats_t *a = &j->g_stats;
    glock(g);
    stats_add(&g->stats, a);
    if (a->seconds > g->stats.seconds) g->stats.seconds = a->seconds; /* the parts run side by side */
    if (!g->have_version || j->first_version < g->first_version) g->first_version = j->first_version;
    if (!g->have_version || j->ran_version > g->last_version) g->last_version = j->ran_version;
    g->have_version = true;
    gunlock(g);
    j->ok = true;
}

/* j's request ran its last step: the RESULT of a single request, or the
 * sub-batch's samples gathered (the group's RESULT after its last). True
 * when j is over; false when its next sub-batch starts next round. */
static bool finish_req(wrk_stream_t *st, wrk_job_t *j) {
    if (j->n == 1 && !j->group) {
        send_result(st, j);
        return true;
    }
    if (gather(st, j) != 0) {
        if (reel_err_code() == REEL_E_INVALID) { /* the loop overflowed (tdit_req_read) */
            char code[24], msg[240];
            overflowed(j, "result", code, msg, sizeof msg);
            part_failed(st, j, code, "samples %d..%d: %s", j->base + j->at,
                        j->base + j->at + (int)tdit_req_batch(j->req) - 1, msg);
            return true;
        }
        part_failed(st, j, WIRE_E_INTERNAL, "gathering samples %d..%d: %s", j->base + j->at,
                    j->base + j->at + (int)tdit_req_batch(j->req) - 1, reel_err_text());
        return true;
    }
    j->at += (int)tdit_req_batch(j->req);
    if (j->at >= j->n) {
        if (j->group) part_into_group(j);
        else send_group_result(st, j);
        return true;
    }
    j->batches++;
    tdit_req_destroy(&j->req); /* the next round starts the next sub-batch */
    return false;
}

/* j's turn in the round, before any step: over (DONE), held (HELD), or
 * ready to step (RAN: its request is running). */
static step_t step_prepare(wrk_stream_t *st, wrk_job_t *j) {
    if (abandoned(st, j)) return STEP_DONE;
    if (!j->req) return admit(st, j);
    return STEP_RAN;
}

/* j stepped (or failed to): what follows. */
static step_t step_finish(wrk_stream_t *st, wrk_job_t *j) {
    if (j->turn == WRK_TURN_FAILED) return STEP_DONE;
    if (!tdit_req_done(j->req)) return STEP_RAN;
    return finish_req(st, j) ? STEP_DONE : STEP_RAN;
}

/* ---- prewarm ------------------------------------------------------------------ */

/* Captures key p on this stream: one step of a request of its shape, with
 * zero contexts, asking the cache to capture at once. Its outputs are
 * never read; the capture (or why there was none) is logged, and the
 * cache reports it (EVENTS: a capture with reason "prewarm"). */
static void prewarm_one(wrk_stream_t *st, const wrk_prewarm_t *p) {
    wrk_t *w = st->x->w;
    const tdit_config_t *cfg = tdit_model_config(w->model);
    size_t nc = (size_t)p->shape.text_len * (size_t)cfg->text_dim;
    float *ctx = calloc(nc ? nc : 1, sizeof *ctx), *unc = p->shape.cfg ? calloc(nc ? nc : 1, sizeof *unc) : NULL;
    uint64_t seeds[TDIT_MAX_BATCH] = { 0 };
    tdit_staging_t *stg = NULL;
    tdit_req_t *r = NULL;
    cap_result_t res = { CAP_RAN_EAGER, CAP_DECLINE_COUNT };
    int rc = -1;
    double t0 = reel_mono_s();
    if (!ctx || (p->shape.cfg && !unc)) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto out;
    }
    stg = take_staging(st, &p->shape);
    if (!(r = tdit_req_new_group(w->model, st->ks, stg, &p->shape, &p->loop, seeds, NULL, ctx, unc))) goto out;
    tdit_mix_t *x = NULL;
    /* a mixed batch: the stream's own buffers for that size (a real batch
     * steps in them later), one zero request in it, the rest padding */
    if (p->rows >= 2 && !(x = mix_for(st, r, p->rows, p->loop.sde))) goto out;
    if (x) tdit_mix_set_prewarm(x, true);
    else tdit_req_set_prewarm(r, true);
    pthread_rwlock_rdlock(&w->step_lock);
    if (atomic_load(&w->fatal)) {
        reel_fail(REEL_E_STATE, "the weights are unusable");
    } else if (x) {
        bool advanced;
        rc = tdit_mix_step(x, &r, 1, w->cache, st->ks, &res, &advanced);
    } else {
        rc = tdit_req_step(r, w->cache, st->ks, &res);
    }
    pthread_rwlock_unlock(&w->step_lock);
    if (x) tdit_mix_set_prewarm(x, false);
out:
    if (rc != 0)
        wrk_log(w, "stream %d: prewarm of key %016llx failed: %s", st->idx, (unsigned long long)p->shard,
                reel_err_text());
    else if (res.ran == CAP_RAN_CAPTURED)
        wrk_log(w, "stream %d: prewarmed key %016llx (%s %lld) in %.3f s", st->idx, (unsigned long long)p->shard,
                p->rows ? "a mixed batch of" : "batch", (long long)(p->rows ? p->rows : tdit_shape_batch(&p->shape)),
                reel_mono_s() - t0);
    else if (res.ran == CAP_RAN_REPLAYED)
        wrk_log(w, "stream %d: key %016llx was captured already", st->idx, (unsigned long long)p->shard);
    else
        wrk_log(w, "stream %d: prewarm of key %016llx ran eager: %s", st->idx, (unsigned long long)p->shard,
                cap_reason_name(res.reason));
    tdit_req_destroy(&r);
    release_staging(st, stg);
    free(ctx);
    free(unc);
}

/* Tries the next key to prewarm, unless a drain holds requests (the sync
 * it waits for would evict the capture). True when one was tried. */
static bool prewarm_next(wrk_stream_t *st) {
    wrk_t *w = st->x->w;
    if (atomic_load(&st->pw_left) == 0 || atomic_load(&w->draining) || atomic_load(&w->stop)) return false;
    wrk_prewarm_t p;
    pthread_mutex_lock(&st->pw_mu);
    bool have = st->pw_at < st->npw;
    if (have) {
        p = st->pw[st->pw_at++];
        atomic_store(&st->pw_left, st->npw - st->pw_at);
    }
    pthread_mutex_unlock(&st->pw_mu);
    if (have) prewarm_one(st, &p);
    return have;
}

/* The batch a request of p's shape runs with on stream i: a group is split
 * over the streams on the CPU (wrk_exec_submit: part i, or one sample each
 * when it has fewer samples than streams), and runs in sub-batches that
 * fit the budget (chunk_for). */
static int64_t prewarm_batch(const wrk_exec_t *x, const wrk_prewarm_t *p, int i) {
    int n = (int)tdit_shape_batch(&p->shape);
    if (n > 1 && x->n > 1 && kern_backend_kind(x->w->backend) == KERN_BACKEND_CPU)
        n = x->n <= n ? (i + 1) * n / x->n - i * n / x->n : 1;
    return chunk_for(x->w, &p->shape, n);
}

/* The sizes of the mixed batches requests like p's run in (--max-batch >
 * 1; a single Euler or SDE request): the ladder's rungs 2, 4, ... up to
 * --max-batch, or every size 2..--max-batch with --batch-sizes exact.
 * The count written to rows. */
static int prewarm_rows(const wrk_t *w, const wrk_prewarm_t *p, int rows[TDIT_MAX_BATCH]) {
    int n = 0;
    if (w->opt->max_batch < 2 || tdit_shape_batch(&p->shape) != 1 || tdit_solver_multistep(p->shape.solver)) return 0;
    int cap = rows_cap(w, &p->shape); /* no batch step_ready would not form (--max-tokens, */
    if (cap > w->opt->max_inflight) cap = w->opt->max_inflight; /* and the requests the worker may hold) */
    for (int b = 2; b <= w->opt->max_batch && b <= cap; b++)
        if (batch_rows(w, b) == b) rows[n++] = b;
    return n;
}

int wrk_exec_prewarm(wrk_exec_t *x, const wrk_prewarm_t *p, int n) {
    if (!x || n <= 0) return 0;
    wrk_prewarm_t *lists[WRK_MAX_STREAMS] = { 0 };
    /* every key first, hottest first; then the mixed batches of each */
    int rows[MSG_MAX_PREWARM][TDIT_MAX_BATCH], nrows[MSG_MAX_PREWARM], total = n;
    for (int k = 0; k < n && k < MSG_MAX_PREWARM; k++) total += nrows[k] = prewarm_rows(x->w, &p[k], rows[k]);
    if (n > MSG_MAX_PREWARM) return reel_fail(REEL_E_INVALID, "%d keys to prewarm (at most %d)", n, MSG_MAX_PREWARM);
    for (int i = 0; i < x->n; i++) {
        if (!(lists[i] = malloc((size_t)total * sizeof *lists[i]))) {
            for (int k = 0; k < i; k++) free(lists[k]);
            return reel_fail(REEL_E_NOMEM, "out of memory");
        }
        int at = 0;
        for (int k = 0; k < n; k++) {
            lists[i][at] = p[k];
            lists[i][at].rows = 0;
            lists[i][at++].shape.batch = prewarm_batch(x, &p[k], i);
        }
        for (int k = 0; k < n; k++)
            for (int r = 0; r < nrows[k]; r++) {
                lists[i][at] = p[k];
                lists[i][at].shape.batch = 1;
                lists[i][at++].rows = rows[k][r];
            }
    }
    n = total;
    for (int i = 0; i < x->n; i++) {
        wrk_stream_t *st = &x->s[i];
        pthread_mutex_lock(&st->pw_mu);
        wrk_prewarm_t *old = st->pw;
        st->pw = lists[i];
        st->npw = n;
        st->pw_at = 0;
        atomic_store(&st->pw_left, n);
        pthread_mutex_unlock(&st->pw_mu);
        free(old);
        if (st->th) reel_thread_wake(st->th);
    }
    return 0;
}

int wrk_exec_prewarm_left(wrk_exec_t *x) {
    int n = 0;
    for (int i = 0; x && i < x->n; i++) n += atomic_load(&x->s[i].pw_left);
    return n;
}

/* ---- the stream thread (base/thread.h) ------------------------------------- */

/* A job ends: off the load, then freed (its RESULT, a split group's, may
 * go out in job_done). */
static void job_end(wrk_stream_t *st, wrk_job_t *j) {
    atomic_fetch_sub(&st->load, 1);
    job_done(st, &j);
}

static void stream_enter(void *arg) {
    wrk_stream_t *st = arg;
    wrk_events_set_thread_stream(st->idx);
}

/* A submitted job joins the round at its end. */
static void stream_take(void *arg, void *item) {
    wrk_stream_t *st = arg;
    wrk_job_t *j = item, **tail = &st->active;
    while (*tail) tail = &(*tail)->next;
    j->next = NULL;
    *tail = j;
    st->nactive++;
    WRK_CHECK(wrk_stream_invariants(st, (int)reel_thread_backlog(st->th) - 1)); /* j still counts in the backlog */
}

/* One round: one step of every active job, in arrival order. Returns when
 * to come back (reel_thread_t's idle): at once while a job stepped or
 * ended; when only held jobs are left, at the nearest of their deadlines,
 * or on a post or the drain's end (wrk_drain_end wakes the streams); on a
 * post when none is left or the worker stops. */
static int64_t stream_round(void *arg) {
    wrk_stream_t *st = arg;
    wrk_t *w = st->x->w;
    if (!st->active) /* (the first call comes before st->th is set) */
        return prewarm_next(st) && !atomic_load(&w->stop) ? 0 : -1;
    bool moved = false;
    int64_t due = 0;             /* the nearest deadline of a held job; 0: none */
    /* 1: who steps: jobs over leave, held ones wait, the rest are ready */
    wrk_job_t *ready = NULL, **rtail = &ready;
    for (wrk_job_t **pp = &st->active; *pp && !atomic_load(&w->stop);) {
        wrk_job_t *j = *pp;
        j->turn = WRK_TURN_NONE;
        step_t r = step_prepare(st, j);
        if (r == STEP_DONE) {
            *pp = j->next;
            j->next = NULL;
            st->nactive--;
            job_end(st, j);
            moved = true;
            continue;
        }
        if (r == STEP_RAN) {
            j->turn = WRK_TURN_READY;
            j->rnext = NULL;
            *rtail = j;
            rtail = &j->rnext;
        } else if (j->deadline_at && (!due || j->deadline_at < due)) {
            due = j->deadline_at;
        }
        pp = &j->next;
    }
    /* 2: one step each, batched where they can share one */
    if (ready && !atomic_load(&w->stop)) step_ready(st, ready);
    /* 3: what follows, in arrival order */
    for (wrk_job_t **pp = &st->active; *pp;) {
        wrk_job_t *j = *pp;
        if (j->turn != WRK_TURN_STEPPED && j->turn != WRK_TURN_FAILED) {
            pp = &j->next;
            continue;
        }
        moved = true;
        step_t r = step_finish(st, j);
        j->turn = WRK_TURN_NONE;
        if (r == STEP_DONE) {
            *pp = j->next;
            j->next = NULL;
            st->nactive--;
            /* Off the load before the RESULT goes out: a client's next
             * request, sent on that RESULT, must see this stream free
             * (else it lands on another stream, one whose graphs for
             * its key may not exist yet). */
            job_end(st, j);
            continue;
        }
        pp = &j->next;
    }
    WRK_CHECK(wrk_stream_invariants(st, (int)reel_thread_backlog(st->th)));
    /* A key to prewarm in a round where no request stepped: requests never
     * wait for a prewarm. (A request of a key still on the list captures
     * at its own first step: prewarm_claim.) */
    if (!ready && prewarm_next(st)) moved = true;
    if (atomic_load(&w->stop)) return -1;
    if (!st->active) return moved ? 0 : -1;
    if (moved) return 0;
    if (!due) return -1;
    int64_t ms = due + 1 - wrk_mono_ms(); /* dropped once past it */
    return ms > 0 ? ms : 0;
}

/* The thread's last act: what is still in the round ends with it. */
static void stream_leave(void *arg) {
    wrk_stream_t *st = arg;
    while (st->active) {
        wrk_job_t *j = st->active;
        st->active = j->next;
        st->nactive--;
        job_end(st, j);
    }
}

/* A job that never joined the round (a stop, or a post that failed). */
static void stream_discard(void *arg, void *item) { job_end(arg, item); }

/* The drain ended: held jobs may start. */
static void wake_streams(void *arg) {
    wrk_exec_t *x = arg;
    for (int i = 0; i < x->n; i++)
        if (x->s[i].th) reel_thread_wake(x->s[i].th);
}

/* ---- lifecycle ----------------------------------------------------------- */

wrk_exec_t *wrk_exec_new(wrk_t *w) {
    wrk_exec_t *x = calloc(1, sizeof *x);
    if (!x) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    x->w = w;
    x->s = calloc((size_t)w->opt->streams, sizeof *x->s);
    if (!x->s) { reel_fail(REEL_E_NOMEM, "out of memory"); goto err; }
    for (int i = 0; i < w->opt->streams; i++) {
        wrk_stream_t *st = &x->s[i];
        st->x = x;
        st->idx = i;
        atomic_init(&st->load, 0);
        pthread_mutex_init(&st->pw_mu, NULL);
        atomic_init(&st->pw_left, 0);
        x->n = i + 1;
        if (!(st->ks = kern_stream_new(w->backend))) goto err;
        if (!(st->push = wrk_pipe_push_new(w->zctx))) {
            reel_fail(REEL_E_IO, "stream %d: pipe: %s", i, zmq_strerror(errno));
            goto err;
        }
    }
    for (int i = 0; i < x->n; i++) {
        char name[32];
        snprintf(name, sizeof name, "stream %d", i);
        reel_thread_opts_t o = { .name = name, .user = &x->s[i], .run = stream_take, .idle = stream_round,
                                 .discard = stream_discard, .enter = stream_enter, .leave = stream_leave,
                                 .block_signals = true /* signals are the main thread's */ };
        if (!(x->s[i].th = reel_thread_start(&o))) goto err;
    }
    wrk_drain_hook(w, wake_streams, x);
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
    pthread_mutex_init(&g->mu, NULL); /* g is calloc'd: owner nobody */
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
        if (c->hold) atomic_fetch_add(&c->hold->refs, 1); /* each part holds it (freed: wrk_job_free) */
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
        c->prompt = c->neg_prompt = NULL; /* each part its own copies (encoded once: the cache) */
        if ((j->prompt && !(c->prompt = strdup(j->prompt))) || (j->neg_prompt && !(c->neg_prompt = strdup(j->neg_prompt))))
            ok = false;
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
    wrk_stream_t *best = &x->s[0];
    if (on >= 0 && on < x->n) best = &x->s[on];
    else
        for (int i = 1; i < x->n; i++)
            if (atomic_load(&x->s[i].load) < atomic_load(&best->load)) best = &x->s[i];
    job->next = NULL;
    uint64_t id = job->id;
    atomic_fetch_add(&best->load, 1); /* before the post: the load never counts short */
    if (reel_thread_post(best->th, job) != 0) /* the job was ended (stream_discard) */
        wrk_log(x->w, "stream %d: %s; request %llu not run", best->idx, reel_err_text(), (unsigned long long)id);
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
            WRK_CHECK(wrk_exec_invariants(x));
            return;
        }
    }
    enqueue(x, job, -1);
    WRK_CHECK(wrk_exec_invariants(x));
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
    wrk_drain_hook(x->w, NULL, NULL); /* the sync thread wakes no stream from now on */
    wrk_stop(x->w);
    for (int i = 0; i < x->n; i++) {
        wrk_stream_t *st = &x->s[i];
        reel_thread_stop(&st->th, REEL_THREAD_DISCARD); /* the round ends at the step in progress */
        if (st->push) zmq_close(st->push);
        st->push = NULL;
    }
}

void wrk_exec_destroy(wrk_exec_t **xp) {
    if (!xp || !*xp) return;
    wrk_exec_t *x = *xp;
    wrk_exec_stop(x);
    for (int i = 0; i < x->n; i++) {
        wrk_stream_t *st = &x->s[i];
        for (int k = 0; k < st->npool; k++) tdit_staging_destroy(&st->pool[k]);
        for (int k = 0; k < st->nmix; k++) tdit_mix_destroy(&st->mix[k]);
        /* A cache that outlives the streams must forget each before it
         * goes (cache.h, Lifetimes): its graphs were captured on it, and a
         * stream made later at its address must not be handed its entries.
         * The streams are stopped: no step runs on them. */
        if (st->ks && x->w->cache && cap_forget_stream(x->w->cache, st->ks) < 0)
            wrk_log(x->w, "stream %d: %s", i, reel_err_text());
        kern_stream_destroy(&st->ks);
        free(st->pw);
        pthread_mutex_destroy(&st->pw_mu);
    }
    free(x->s);
    free(x);
    *xp = NULL;
}
