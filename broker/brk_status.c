/* brk_status.c -- STATUS_REPLY (docs/PROTOCOL.md). Built from the state
 * as it is; the one thing it asks another module is why a worker lags
 * (brk_sync_lag). */
#include "broker/brk_ha.h"
#include "broker/brk_status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_log.h"
#include "broker/brk_deliver.h"
#include "broker/brk_msg.h"
#include "broker/brk_refused.h"
#include "broker/brk_zap.h"
#include "broker/brk_sync.h"

static void worker_entry(const brk_t *b, const brk_worker_t *w, int64_t now, msg_worker_status_t *e) {
    snprintf(e->name, sizeof e->name, "%s", w->route.name);
    snprintf(e->device, sizeof e->device, "%s", w->device);
    snprintf(e->arch, sizeof e->arch, "%s", w->arch);
    snprintf(e->text_encoder, sizeof e->text_encoder, "%s", w->text_encoder);
    snprintf(e->vae, sizeof e->vae, "%s", w->vae);
    e->streams = (uint64_t)w->streams;
    e->inflight = (uint64_t)w->route.inflight;
    e->max_inflight = (uint64_t)w->route.max_inflight;
    e->routable = w->route.routable;
    for (int i = 0; i < w->route.n_versions && e->versions.n < MSG_MAX_COMPONENTS; i++) {
        msg_count_t *v = &e->versions.e[e->versions.n++];
        snprintf(v->name, sizeof v->name, "%s", w->route.versions[i].name);
        v->n = w->route.versions[i].version;
    }
    for (int i = 0; i < b->n_cur && e->lagging.n < MSG_MAX_COMPONENTS; i++) {
        msg_text_t *l = &e->lagging.e[e->lagging.n];
        if (!brk_sync_lag(b, w, b->cur[i].component, l->text, sizeof l->text)) continue;
        snprintf(l->name, sizeof l->name, "%s", b->cur[i].component);
        e->lagging.n++;
    }
    for (int i = 0; i < w->n_keys && i < MSG_KEYS_RECENT; i++) e->keys[e->n_keys++] = w->keys[i];
    e->alive_ms = (uint64_t)(now - w->ready_ms);
}

/* Adds (or raises) component's version in v. */
static void note_version(msg_versions_t *v, const char *component, uint64_t version) {
    for (int i = 0; i < v->n; i++)
        if (!strcmp(v->e[i].name, component)) {
            if (version > v->e[i].n) v->e[i].n = version;
            return;
        }
    if (v->n >= MSG_MAX_COMPONENTS) return;
    snprintf(v->e[v->n].name, sizeof v->e[v->n].name, "%s", component);
    v->e[v->n++].n = version;
}

/* Each model a live worker serves, once, with the config it announced
 * (zeros when none did). */
static size_t models_of(const brk_t *b, msg_model_t *out, size_t cap) {
    size_t n = 0;
    for (int i = 0; i < b->n_w; i++) {
        const brk_worker_t *w = b->w[i];
        for (int j = 0; j < w->route.n_models; j++) {
            const char *name = w->route.models[j];
            size_t k = 0;
            while (k < n && strcmp(out[k].name, name)) k++;
            if (k == n) {
                if (n == cap) continue;
                memset(&out[n], 0, sizeof out[n]);
                snprintf(out[n++].name, sizeof out[0].name, "%s", name);
            }
            for (int c = 0; c < w->n_configs && !out[k].in_channels; c++)
                if (!strcmp(w->configs[c].name, name)) out[k] = w->configs[c];
        }
    }
    return n;
}

void brk_status_reply(brk_t *b, const zmq_msg_t *to, uint64_t id) {
    int64_t now = brk_now_ms();
    size_t cap_models = (size_t)b->n_w * BRK_MAX_MODELS + 1;
    msg_status_reply_t *r = calloc(1, sizeof *r);
    msg_worker_status_t *ws = calloc((size_t)b->n_w + 1, sizeof *ws);
    msg_model_t *models = calloc(cap_models, sizeof *models);
    msg_refused_peer_t *refused = calloc(BRK_REFUSED_PEERS, sizeof *refused);
    if (!r || !ws || !models || !refused) {
        brk_error_to(b, false, to, id, WIRE_E_INTERNAL, "broker out of memory");
        goto out;
    }
    for (int i = 0; i < b->n_w; i++) worker_entry(b, b->w[i], now, &ws[i]);
    r->workers = ws;
    r->n_workers = (size_t)b->n_w;
    r->queue = brk_queue_len(&b->queue);
    r->queue_max = b->queue.max;
    r->boot = b->boot;
    brk_ha_status(b, r);
    for (int i = 0; i < b->n_cur; i++)
        if (b->cur[i].version) /* a component whose only sync is pending has none yet */
            note_version(&r->versions, b->cur[i].component, b->cur[i].version);
    for (const brk_barrier_t *s = b->barriers; s; s = s->next)
        if (s->sync) note_version(&r->pending, s->component, s->version);
    r->malformed = b->malformed;
    r->worker_refused = b->worker_refused;
    r->catalog_dropped = brk_catq_dropped(b->cat) + b->orphan_events_lost + b->worker_events_lost;
    r->catalog_failures = brk_catq_failures(b->cat);
    r->catalog_pending = brk_catq_pending(b->cat);
    r->undelivered = b->undelivered;
    r->progress_dropped = b->progress_dropped;
    r->replies_suppressed = b->replies_suppressed;
    r->auth_refused = brk_zap_refused(b->zap);
    r->auth_refused_peers = brk_zap_refused_peers(b->zap);
    r->n_auth_refused_recent = brk_zap_refused_recent(b->zap, refused, BRK_REFUSED_PEERS);
    r->auth_refused_recent = refused;
    for (int i = 0; i < b->metrics.n_outcomes; i++) {
        if (!strcmp(b->metrics.outcome[i], "ok")) r->requests_ok += b->metrics.requests[i];
        else r->requests_failed += b->metrics.requests[i];
    }
    r->steps_replayed = b->metrics.steps_replayed;
    r->steps_eager = b->metrics.steps_eager;
    r->steps_captured = b->metrics.steps_captured;
    r->models = models;
    r->n_models = models_of(b, models, cap_models);
    (void)brk_client_send(b, to, MSG_STATUS_REPLY, id, r, NULL); /* (held when its queue is full) */
out:
    free(r);
    free(ws);
    free(models);
    free(refused);
}
