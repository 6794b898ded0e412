/* brk_workers.c -- the workers the broker knows (see brk_workers.h).
 *
 * A send that fails (ZMQ_ROUTER_MANDATORY: the peer's pipe is gone, or its
 * queue is full: sends never wait) does not drop the worker: it
 * stops being routable until it speaks again, and is dropped only when
 * it stays silent past liveness. A worker that reconnects in time keeps
 * its in-flight work. With keys, a worker's name is bound to its key
 * (brk_zap.h) and a worker whose key a reload removed is dropped. */
#include "broker/brk_workers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "broker/brk_log.h"
#include "broker/brk_msg.h"
#include "broker/brk_zap.h"

/* Whether a live worker has the name (brk_zap_bind_worker). */
static bool name_live(void *arg, const char *name) {
    const brk_worker_t *w = brk_worker_named(arg, name);
    return w && !w->dead;
}

int brk_workers_refuse(brk_t *b, const char *name, const brk_worker_t *self) {
    const brk_worker_t *same = brk_worker_named(b, name);
    char key[REEL_KEY_Z85];
    /* invalid, not state: a READY naming a name it cannot have is answered
     * bad_request, and waiting would not make it the worker's */
    if (same && same != self) return reel_fail(REEL_E_INVALID, "worker name %s is taken by a live worker", name);
    if (brk_zap_bind_worker(b->zap, name, key, name_live, b) != 0)
        return reel_fail(REEL_E_INVALID, "worker name %s is bound to another worker key", name);
    return 0;
}

const char *brk_workers_again_who(const brk_worker_t *w, char *buf, size_t len) {
    snprintf(buf, len, "%s READYs again", w->route.name);
    return buf;
}

void brk_workers_log_summaries(brk_t *b) {
    char who[BRK_NAME_MAX + 16];
    for (int i = 0; i < b->n_w; i++) {
        brk_log_summary(&b->w[i]->log, b->w[i]->route.name);
        brk_log_summary(&b->w[i]->again_log, brk_workers_again_who(b->w[i], who, sizeof who));
    }
}

brk_worker_t *brk_workers_add(brk_t *b, const zmq_msg_t *identity, const msg_ready_t *r,
                              const brk_worker_shares_t *again) {
    if (b->n_w == b->cap_w) {
        int cap = b->cap_w ? b->cap_w * 2 : 8;
        brk_worker_t **nw = realloc(b->w, (size_t)cap * sizeof *nw);
        if (!nw) return NULL;
        b->w = nw;
        b->cap_w = cap;
    }
    brk_worker_t *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    snprintf(w->route.name, sizeof w->route.name, "%s", r->name);
    w->route.routable = true;
    w->route.max_inflight = r->max_inflight ? (int)r->max_inflight : (int)r->streams;
    for (size_t i = 0; i < r->n_models && i < BRK_MAX_MODELS; i++)
        snprintf(w->route.models[w->route.n_models++], BRK_NAME_MAX, "%s", r->models[i]);
    for (size_t i = 0; i < r->n_configs && i < BRK_MAX_MODELS; i++) w->configs[w->n_configs++] = r->configs[i];
    w->route.loops = brk_loops_from(r->solvers, r->n_solvers) | brk_caps_from(r->text_encoder, r->vae);
    /* What it runs already: routing trusts it, and no sync it has is sent
     * again (brk_sync.c keeps w->syncs). */
    for (int i = 0; i < r->versions.n; i++) brk_peer_set_version(&w->route, r->versions.e[i].name, r->versions.e[i].n);
    brk_ident_from(&w->ident, identity);
    brk_who_t who; /* the READY's sender */
    brk_zap_sender(b->zap, &who);
    snprintf(w->key, sizeof w->key, "%s", who.key);
    snprintf(w->device, sizeof w->device, "%s", r->device);
    snprintf(w->arch, sizeof w->arch, "%s", r->arch);
    snprintf(w->text_encoder, sizeof w->text_encoder, "%s", r->text_encoder);
    snprintf(w->vae, sizeof w->vae, "%s", r->vae);
    w->streams = (int)r->streams;
    w->budget = r->budget;
    w->ready_ms = w->seen_ms = w->heard_ms = brk_now_ms(); /* worker_seen sets last_seen */
    w->prewarm_want = (int)r->prewarm;
    w->max_tokens = (int64_t)r->max_tokens;
    b->w[b->n_w++] = w;

    if (again) { /* a worker that sends READY in a loop: within its READYs again's share */
        char who[BRK_NAME_MAX + 16];
        w->log = again->log;
        w->again_log = again->again_log;
        brk_log_limited(&w->again_log, brk_workers_again_who(w, who, sizeof who), "worker %s ready (%s, %d stream%s)",
                        w->route.name, w->device, w->streams, w->streams == 1 ? "" : "s");
    } else {
        brk_log("worker %s ready (%s, %d stream%s)", w->route.name, w->device, w->streams, w->streams == 1 ? "" : "s");
    }
    char boot[17];
    brk_cq_worker_seen(b->cat, w->route.name, w->device, w->arch, w->streams, w->budget,
                       r->boot ? msg_hex64(r->boot, boot) : NULL);
    for (int i = 0; i < w->route.n_versions; i++)
        brk_cq_worker_version(b->cat, w->route.name, w->route.versions[i].name, w->route.versions[i].version, true,
                              NULL);
    return w;
}


bool brk_workers_heard(brk_t *b, brk_worker_t *w) {
    w->seen_ms = brk_now_ms();
    /* The catalog's last_seen: at a bounded rate, not per message. */
    if (w->seen_ms - w->heard_ms >= BRK_HEARD_EVERY_MS) {
        w->heard_ms = w->seen_ms;
        brk_cq_worker_heard(b->cat, w->route.name, brk_unix_of(w->seen_ms));
    }
    if (w->route.routable || w->dead) return false;
    w->route.routable = true;
    brk_log_limited(&w->log, w->route.name, "worker %s reachable again", w->route.name);
    return true;
}

void brk_workers_events(brk_t *b, brk_worker_t *w, const msg_events_t *ev) {
    size_t skipped = 0;
    char hash[17];
    const char *wn = w->route.name;
    if (ev->dropped) { /* they never reach the catalog either: STATUS catalog_dropped says so */
        b->worker_events_lost += ev->dropped;
        brk_log_limited(&w->log, wn, "worker %s lost %llu event%s (past its buffer, or in an EVENTS it could not "
                        "send): not in the catalog", wn, (unsigned long long)ev->dropped, ev->dropped == 1 ? "" : "s");
    }
    /* The catalog's summaries count captures, replays and evictions at the
     * weight version the worker runs now. */
    uint64_t version = brk_peer_version(&w->route, BRK_COMPONENT);
    for (size_t i = 0; i < ev->n_events; i++) {
        const msg_event_t *e = &ev->events[i];
        if (!e->kind[0] || !e->key_hash) {
            skipped++;
            continue;
        }
        msg_hex64(e->key_hash, hash);
        if (!strcmp(e->kind, "capture"))
            brk_cq_capture(b->cat, wn, e->key, hash, (int)e->stream, e->bytes, e->nodes, e->seconds, version,
                           !strcmp(e->reason, "prewarm") ? "prewarm" : "demand");
        else if (!strcmp(e->kind, "decline") && e->reason[0])
            brk_cq_decline(b->cat, wn, e->key, hash, e->reason, e->count);
        else if (!strcmp(e->kind, "evict") && e->reason[0])
            brk_cq_eviction(b->cat, wn, e->key, hash, (int)e->stream, e->reason, e->component, e->from, e->to,
                            version);
        else if (!strcmp(e->kind, "rekey") && e->key && e->key[0]) /* a graph kept under its new key */
            brk_cq_key_text(b->cat, hash, e->key);
        else if (!strcmp(e->kind, "replays"))
            brk_cq_replays(b->cat, wn, hash, (int)e->stream, e->count, version);
        else if (!strcmp(e->kind, "artifact") && e->component[0]) /* docs/ARTIFACTS.md */
            brk_cq_artifact_seen(b->cat, e->component, e->version, e->op, e->backend, e->sha256,
                                 e->verified, e->enabled, e->reason, e->detail);
        else if (!strcmp(e->kind, "artifact_key") && e->component[0] && e->key[0])
            brk_cq_artifact_key(b->cat, wn, e->component, e->key, e->reason, e->detail, e->count,
                                e->native, e->pass, e->fail, e->fallbacks, e->timed, e->speedup,
                                e->speedup_sd, e->sync_timed, e->sync_s);
        else
            skipped++;
    }
    if (skipped)
        brk_log_limited(&w->log, wn, "worker %s: %zu bad EVENTS entr%s skipped", wn, skipped, skipped == 1 ? "y" : "ies");
}

/* ---- EVENTS before READY ------------------------------------------------------ */

/* A worker's events reach a broker that does not know it when the broker
 * restarted (the worker's connection comes back by itself and sends on
 * before the worker hears RECONNECT) or expired the worker after a stall.
 * Answered RECONNECT, it sends READY next on the same connection (one
 * connection keeps order), so its EVENTS are kept until then and recorded
 * as the worker's: the captures, replays and evictions that happened while
 * the broker was away still reach the catalog (before, they were dropped,
 * and the catalog's captures minus evictions no longer gave the graphs
 * held). They are matched by routing identity, which a worker sets to its
 * name: a worker restarted under the same name adopts what its last
 * process sent (events of a worker of that name; the catalog counts them
 * at the version the new process runs, as it counts every event at the
 * version its worker runs when it arrives). A connection that sends no
 * READY within brk_orphan_ms (a stranger without keys, a worker gone)
 * loses them; so does a connection past BRK_ORPHANS_EACH messages (its
 * oldest first) and, past BRK_ORPHANS in all, the connection with the
 * most; all counted (STATUS catalog_dropped) and logged within a budget. */
#define BRK_ORPHANS 64
#define BRK_ORPHANS_EACH 16 /* of one connection: one peer cannot push out the others' */

typedef struct brk_orphan {
    brk_ident_t ident;
    int64_t at_ms;
    msg_event_t *ev; /* n copies; their key texts after them in the same block */
    size_t n;
} brk_orphan_t;

/* Twice a worker's liveness (default 6 s), at least 10 s: a RECONNECTed
 * worker answers READY at once. */
static int64_t brk_orphan_ms(const brk_t *b) {
    int64_t ms = 2 * (int64_t)b->opt.heartbeat_ms * (b->opt.liveness > 0 ? b->opt.liveness : 1);
    return ms > 10000 ? ms : 10000;
}

static void orphan_drop(brk_t *b, int i, const char *why) {
    brk_orphan_t *o = &b->orphans[i];
    b->orphan_events_lost += o->n;
    brk_log_limited(&b->orphan_log, "EVENTS", "%zu worker event%s from an unregistered connection not recorded: %s",
                    o->n, o->n == 1 ? "" : "s", why);
    free(o->ev);
    memmove(o, o + 1, (size_t)(b->n_orphans - i - 1) * sizeof *o);
    b->n_orphans--;
}

/* The kept message to give up for one of id's: id's own oldest when it
 * has its share, else the oldest of the connection with the most kept
 * (a flood from one peer, or many, pushes out its own first). */
static int orphan_victim(const brk_t *b, const brk_ident_t *id) {
    int mine = 0, first_mine = -1;
    for (int i = 0; i < b->n_orphans; i++)
        if (brk_ident_eq(&b->orphans[i].ident, id) && mine++ == 0) first_mine = i;
    if (mine >= BRK_ORPHANS_EACH) return first_mine;
    if (b->n_orphans < BRK_ORPHANS) return -1;
    int best = 0, best_n = 0;
    for (int i = 0; i < b->n_orphans; i++) {
        int n = 0;
        for (int j = 0; j < b->n_orphans; j++) n += brk_ident_eq(&b->orphans[j].ident, &b->orphans[i].ident);
        if (n > best_n) best = i, best_n = n; /* (the first of a connection is its oldest) */
    }
    return best;
}

void brk_workers_keep_events(brk_t *b, const zmq_msg_t *identity, const msg_events_t *ev) {
    b->worker_events_lost += ev->dropped; /* (lost whoever sent them; what it kept is adopted with dropped 0) */
    if (!ev->n_events) return;
    if (!b->orphans && !(b->orphans = calloc(BRK_ORPHANS, sizeof *b->orphans))) {
        b->orphan_events_lost += ev->n_events;
        return;
    }
    brk_ident_t id;
    brk_ident_from(&id, identity);
    int victim = orphan_victim(b, &id);
    if (victim >= 0) orphan_drop(b, victim, "too many wait for their worker's READY");
    size_t keys = 0;
    for (size_t i = 0; i < ev->n_events; i++) keys += strlen(ev->events[i].key ? ev->events[i].key : "") + 1;
    msg_event_t *c = malloc(ev->n_events * sizeof *c + keys);
    if (!c) {
        b->orphan_events_lost += ev->n_events;
        return;
    }
    char *k = (char *)(c + ev->n_events);
    for (size_t i = 0; i < ev->n_events; i++) {
        c[i] = ev->events[i];
        const char *key = ev->events[i].key ? ev->events[i].key : "";
        size_t n = strlen(key) + 1;
        memcpy(k, key, n);
        c[i].key = k;
        k += n;
    }
    brk_orphan_t *o = &b->orphans[b->n_orphans++];
    o->ident = id;
    o->at_ms = brk_now_ms();
    o->ev = c;
    o->n = ev->n_events;
}

void brk_workers_adopt_events(brk_t *b, brk_worker_t *w) {
    size_t n = 0;
    for (int i = 0; i < b->n_orphans;) {
        brk_orphan_t *o = &b->orphans[i];
        if (!brk_ident_eq(&o->ident, &w->ident)) {
            i++;
            continue;
        }
        const msg_events_t ev = { o->ev, o->n, 0 };
        brk_workers_events(b, w, &ev);
        n += o->n;
        free(o->ev);
        memmove(o, o + 1, (size_t)(b->n_orphans - i - 1) * sizeof *o);
        b->n_orphans--;
    }
    if (n) brk_log("worker %s: %zu event%s it sent before its READY recorded", w->route.name, n, n == 1 ? "" : "s");
}

void brk_workers_free_events(brk_t *b) {
    for (int i = 0; i < b->n_orphans; i++) free(b->orphans[i].ev);
    free(b->orphans);
    b->orphans = NULL;
    b->n_orphans = 0;
}

/* Keys heated by at least one request within about a half-life. */
#define PREWARM_MIN_HEAT 0.5

static const char *loop_solver(int loop) {
    return loop == BRK_LOOP_UNIPC || loop == BRK_LOOP_SDE_UNIPC   ? "unipc"
           : loop == BRK_LOOP_DPMPP || loop == BRK_LOOP_SDE_DPMPP ? "dpm++"
                                                                  : "euler";
}

/* brk_hot_owned's test: peer i (of the live workers in `ctx`) takes k. */
static bool hot_fits(void *ctx, int i, const brk_hot_key_t *k) {
    brk_worker_t *const *live = ctx;
    return brk_worker_fits(live[i], k->model, k->latent);
}

void brk_workers_prewarm(brk_t *b, brk_worker_t *w, int64_t now, uint64_t current) {
    if (!w->prewarm_want || w->prewarm_sent || w->dead || !w->route.routable) return;
    for (int i = 0; i < w->n_syncs; i++)
        if (w->syncs[i].waiting) return;
    const brk_peer_t *peers[b->n_w ? b->n_w : 1];
    brk_worker_t *live[b->n_w ? b->n_w : 1];
    int n = 0, self = -1;
    brk_note_applying(b); /* a peer applying the version in a barrier owns its keys at it */
    for (int i = 0; i < b->n_w; i++) {
        if (b->w[i]->dead) continue;
        if (b->w[i] == w) self = n;
        live[n] = b->w[i];
        peers[n++] = &b->w[i]->route;
    }
    const brk_hot_key_t *hot[MSG_MAX_PREWARM];
    int want = w->prewarm_want < MSG_MAX_PREWARM ? w->prewarm_want : MSG_MAX_PREWARM;
    /* as a GEN naming no version needs: the current one (a worker behind
     * it, its sync failed, is sent no keys: none would be routed to it) */
    int k = brk_hot_owned(&b->hot, now, peers, n, self, current, PREWARM_MIN_HEAT,
                          hot_fits, live, hot, want);
    msg_prewarm_key_t keys[MSG_MAX_PREWARM];
    for (int i = 0; i < k; i++) {
        msg_prewarm_key_t *x = &keys[i];
        memset(x, 0, sizeof *x);
        snprintf(x->model, sizeof x->model, "%s", hot[i]->model);
        memcpy(x->latent_shape, hot[i]->latent, sizeof x->latent_shape);
        x->text_len = (uint64_t)hot[i]->context[0];
        x->text_dim = (uint64_t)hot[i]->context[1];
        x->cfg = hot[i]->cfg;
        x->n = hot[i]->n > 1 ? (uint64_t)hot[i]->n : 1;
        snprintf(x->solver, sizeof x->solver, "%s", loop_solver(hot[i]->loop));
        x->sde = hot[i]->loop == BRK_LOOP_SDE || hot[i]->loop == BRK_LOOP_SDE_UNIPC || hot[i]->loop == BRK_LOOP_SDE_DPMPP;
        x->key_hash = hot[i]->hash;
        double heat = brk_hot_heat(hot[i], now);
        x->requests = heat < 1 ? 1 : (uint64_t)(heat + 0.5);
    }
    msg_prewarm_t p = { keys, (size_t)k };
    if (brk_worker_send(b, w, MSG_PREWARM, 0, &p, NULL) != 0) return; /* unreachable: again when it speaks */
    w->prewarm_sent = true;
    b->prewarm_keys_sent += (uint64_t)k;
    /* once a registration: a READY again (in a loop) asks again */
    brk_log_limited(&w->log, w->route.name, "worker %s: PREWARM with %d of the %d hot key%s it owns asked",
                    w->route.name, k, w->prewarm_want, w->prewarm_want == 1 ? "" : "s");
}

void brk_workers_timers(brk_t *b, int64_t now, uint64_t current) {
    for (int i = 0; i < b->n_w; i++) brk_workers_prewarm(b, b->w[i], now, current);
    while (b->n_orphans && now - b->orphans[0].at_ms > brk_orphan_ms(b))
        orphan_drop(b, 0, "no READY came on their connection");
    if (now >= b->next_heartbeat_ms) {
        b->next_heartbeat_ms = now + b->opt.heartbeat_ms;
        for (int i = 0; i < b->n_w; i++) {
            brk_worker_t *w = b->w[i];
            if (w->dead) continue;
            if (brk_send(b->workers, &w->ident, MSG_HEARTBEAT, 0, NULL, NULL) < 0)
                brk_worker_unreachable(w, "HEARTBEAT");
        }
    }
    int64_t silent_max = (int64_t)b->opt.heartbeat_ms * b->opt.liveness;
    for (int i = 0; i < b->n_w; i++) {
        brk_worker_t *w = b->w[i];
        if (!w->dead && now - w->seen_ms > silent_max && now >= w->quiet_until_ms) {
            w->dead = true;
            w->dead_why = "expired";
        } else if (!w->dead && !brk_zap_worker_allowed(b->zap, w->key)) {
            /* Its messages are dropped already; route nothing more to it. */
            w->dead = true;
            w->dead_why = "key revoked";
        }
    }
}

int brk_workers_next_dead(const brk_t *b) {
    for (int i = 0; i < b->n_w; i++)
        if (b->w[i]->dead) return i;
    return -1;
}

brk_worker_t *brk_workers_unlink(brk_t *b, int i) {
    brk_worker_t *w = b->w[i];
    memmove(b->w + i, b->w + i + 1, (size_t)(b->n_w - i - 1) * sizeof *b->w);
    b->n_w--;
    if (!w->dead_why || strcmp(w->dead_why, "restarted")) {
        char who[BRK_NAME_MAX + 16];
        brk_log_flush(&w->log, w->route.name);
        brk_log_flush(&w->again_log, brk_workers_again_who(w, who, sizeof who));
        brk_log("worker %s lost (%s)", w->route.name, w->dead_why ? w->dead_why : "?");
    }
    brk_cq_worker_heard(b->cat, w->route.name, brk_unix_of(w->seen_ms)); /* its last message, however recent */
    brk_cq_worker_gone(b->cat, w->route.name, w->dead_why);
    return w;
}
