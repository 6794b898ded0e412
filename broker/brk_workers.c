/* brk_workers.c -- the worker side of the broker, Majordomo-style: READY
 * registers a worker, any message proves it alive, HEARTBEAT goes out every
 * interval, a worker silent for `liveness` intervals (or one that says
 * DISCONNECT) is dropped and its in-flight requests are requeued once. A
 * message from a worker the broker does not know is answered RECONNECT.
 *
 * A send that fails (ZMQ_ROUTER_MANDATORY: the peer's pipe is gone, or its
 * queue stayed full past the send timeout) does not drop the worker: it
 * stops being routable until it speaks again, and is dropped only when
 * it stays silent past liveness. A worker that reconnects in time keeps
 * its in-flight work. */
#include "broker/brk_broker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_log.h"

brk_worker_t *brk_worker_find(brk_t *b, const zmq_msg_t *identity) {
    brk_ident_t id;
    brk_ident_from(&id, identity);
    for (int i = 0; i < b->n_w; i++)
        if (b->w[i]->ident.n == id.n && !memcmp(b->w[i]->ident.b, id.b, id.n)) return b->w[i];
    return NULL;
}

brk_worker_t *brk_worker_named(brk_t *b, const char *name) {
    for (int i = 0; i < b->n_w; i++)
        if (!strcmp(b->w[i]->route.name, name)) return b->w[i];
    return NULL;
}

/* Names reach logs, keys of STATUS and the rendezvous hash: the capture
 * key's alphabet keeps them printable and unambiguous. */
static bool valid_name(const char *s, size_t max) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= max) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-' || c == '+'))
            return false;
    }
    return true;
}

brk_wsync_t *brk_worker_sync(brk_worker_t *w, const char *component, bool create) {
    for (int i = 0; i < w->n_syncs; i++)
        if (!strcmp(w->syncs[i].component, component)) return &w->syncs[i];
    if (!create || w->n_syncs >= BRK_MAX_COMPONENTS) return NULL;
    brk_wsync_t *ws = &w->syncs[w->n_syncs++];
    memset(ws, 0, sizeof *ws);
    snprintf(ws->component, sizeof ws->component, "%s", component);
    return ws;
}

void brk_worker_unreachable(brk_t *b, brk_worker_t *w, const char *what) {
    (void)b;
    if (!w->route.routable) return;
    w->route.routable = false;
    brk_log("worker %s unreachable (%s send failed: %s)", w->route.name, what, zmq_strerror(errno));
}

int brk_sync_send(brk_t *b, brk_worker_t *w, const char *component, uint64_t version,
                  uint64_t sync_id, wire_msg_t *msg) {
    if (!w->route.routable) return -1;
    wire_val_t *h = brk_hdr_from(msg->hdr, "SYNC", sync_id);
    if (!h) {
        brk_log("out of memory forwarding %s v%llu to %s", component, (unsigned long long)version,
                w->route.name);
        return -1;
    }
    int rc = brk_forward_to(b->workers, &w->ident, h, msg);
    wv_free(&h);
    if (rc < 0) {
        if (errno == EHOSTUNREACH || errno == EAGAIN) brk_worker_unreachable(b, w, "SYNC");
        else brk_log("cannot forward %s v%llu to %s: %s", component, (unsigned long long)version,
                     w->route.name, zmq_strerror(errno));
        return -1;
    }
    brk_wsync_t *ws = brk_worker_sync(w, component, true);
    if (ws && version >= ws->sent) {
        ws->sent = version;
        ws->waiting = true;
    }
    brk_log("sync %s v%llu sent to %s", component, (unsigned long long)version, w->route.name);
    return 0;
}

/* Only what w was never sent: a version it failed is sent again when it
 * reconnects (READY: a new registration) or when the trainer resends it,
 * not each time it speaks, which would retry a broken file in a loop. */
void brk_catch_up(brk_t *b, brk_worker_t *w) {
    for (int i = 0; i < b->n_cur && w->route.routable; i++) {
        const brk_current_t *c = &b->cur[i];
        if (!c->msg) continue;
        const brk_wsync_t *ws = brk_worker_sync(w, c->component, false);
        if (c->version <= brk_peer_version(&w->route, c->component) || (ws && c->version <= ws->sent))
            continue;
        brk_sync_send(b, w, c->component, c->version, c->sync_id, c->msg);
    }
}

/* READY: validates the worker's description, registers it, catches it up
 * on weight versions. A READY from an identity already registered means
 * the worker restarted: the old registration is dropped first (its
 * in-flight work is gone with the old process). */
static void on_ready(brk_t *b, brk_worker_t *old, wire_msg_t *m) {
    brk_ident_t id;
    brk_ident_from(&id, &m->identity);
    const wire_val_t *h = m->hdr;
    const char *name = wv_get_str(h, "name");
    const char *device = wv_get_str(h, "device");
    const char *arch = wv_get_str(h, "arch");
    uint64_t streams = 1, budget = 0, max_inflight = 0;
    const wire_val_t *models = wv_get(h, "models");
    const wire_val_t *versions = wv_get(h, "versions");
    const char *bad = NULL;
    if (!valid_name(name, BRK_NAME_MAX)) bad = "\"name\" must be 1..63 characters of [A-Za-z0-9_.:+-]";
    else if (device && strlen(device) >= sizeof old->device) bad = "\"device\" is too long";
    else if (arch && strlen(arch) >= sizeof old->arch) bad = "\"arch\" is too long";
    else if (wv_get(h, "streams") && (!wv_get_u64(h, "streams", &streams) || streams < 1 || streams > 1024))
        bad = "\"streams\" must be 1..1024";
    else if (wv_get(h, "budget") && !wv_get_u64(h, "budget", &budget))
        bad = "\"budget\" must be an unsigned integer";
    else if (wv_get(h, "max_inflight") &&
             (!wv_get_u64(h, "max_inflight", &max_inflight) || max_inflight < 1 || max_inflight > 65536))
        bad = "\"max_inflight\" must be 1..65536";
    else if (!models || models->kind != WV_ARR || wv_len(models) > BRK_MAX_MODELS)
        bad = "\"models\" must be an array of at most 16 names";
    else if (versions && (versions->kind != WV_MAP || wv_len(versions) > BRK_MAX_COMPONENTS))
        bad = "\"versions\" must be a map of at most 8 components";
    for (size_t i = 0; !bad && i < wv_len(models); i++) {
        const wire_val_t *v = wv_at(models, i);
        if (!v || v->kind != WV_STR || !valid_name(v->as.str.s, BRK_NAME_MAX - 8))
            bad = "\"models\" entries must be names of [A-Za-z0-9_.:+-]";
    }
    for (size_t i = 0; !bad && i < wv_len(versions); i++) {
        uint64_t v;
        if (!valid_name(versions->as.c.k[i], BRK_NAME_MAX) || !wv_as_u64(versions->as.c.v[i], &v))
            bad = "\"versions\" must map component names to unsigned versions";
    }
    if (bad) {
        brk_log("READY refused: %s", bad);
        brk_send_error_to(b->workers, &id, m->id, WIRE_E_BAD_REQUEST, "READY: %s", bad);
        return;
    }
    brk_worker_t *same = brk_worker_named(b, name);
    if (same && same != old) {
        brk_log("READY refused: worker name %s is taken by a live worker", name);
        brk_send_error_to(b->workers, &id, m->id, WIRE_E_BAD_REQUEST,
                          "READY: worker name %s is taken by a live worker", name);
        return;
    }
    if (old) {
        old->dead = true;
        old->dead_why = "restarted";
        brk_reap(b);
    }
    if (b->n_w == b->cap_w) {
        int cap = b->cap_w ? b->cap_w * 2 : 8;
        brk_worker_t **nw = realloc(b->w, (size_t)cap * sizeof *nw);
        if (!nw) goto oom;
        b->w = nw;
        b->cap_w = cap;
    }
    brk_worker_t *w = calloc(1, sizeof *w);
    if (!w) goto oom;
    snprintf(w->route.name, sizeof w->route.name, "%s", name);
    w->route.routable = true;
    w->route.max_inflight = max_inflight ? (int)max_inflight : (int)streams;
    for (size_t i = 0; i < wv_len(models); i++)
        snprintf(w->route.models[w->route.n_models++], BRK_NAME_MAX, "%s", wv_at(models, i)->as.str.s);
    for (size_t i = 0; i < wv_len(versions); i++) {
        uint64_t v = 0;
        wv_as_u64(versions->as.c.v[i], &v);
        brk_peer_set_version(&w->route, versions->as.c.k[i], v);
        brk_wsync_t *ws = brk_worker_sync(w, versions->as.c.k[i], true);
        if (ws) ws->sent = v;
    }
    w->ident = id;
    snprintf(w->device, sizeof w->device, "%s", device ? device : "?");
    snprintf(w->arch, sizeof w->arch, "%s", arch ? arch : "?");
    w->streams = (int)streams;
    w->budget = budget;
    w->ready_ms = w->seen_ms = brk_now_ms();
    b->w[b->n_w++] = w;

    brk_log("worker %s ready (%s, %d stream%s)", w->route.name, w->device, w->streams,
            w->streams == 1 ? "" : "s");
    brk_cq_worker_seen(b->cat, w->route.name, w->device, w->arch, w->streams, w->budget);
    for (int i = 0; i < w->route.n_versions; i++)
        brk_cq_worker_version(b->cat, w->route.name, w->route.versions[i].name,
                              w->route.versions[i].version, true, NULL);
    brk_catch_up(b, w);
    return;
oom:
    brk_log("out of memory registering worker %s", name);
    brk_send_error_to(b->workers, &id, m->id, WIRE_E_INTERNAL, "READY: broker out of memory");
}

/* EVENTS: each entry becomes one catalog record; entries of an unknown
 * kind or without a key hash are skipped and counted in one log line. */
static void on_events(brk_t *b, brk_worker_t *w, const wire_msg_t *m) {
    const wire_val_t *ev = wv_get(m->hdr, "events");
    size_t skipped = 0;
    for (size_t i = 0; i < wv_len(ev); i++) {
        const wire_val_t *e = wv_at(ev, i);
        const char *kind = wv_get_str(e, "kind");
        const char *hash = wv_get_str(e, "key_hash");
        if (!kind || !hash) {
            skipped++;
            continue;
        }
        const char *key = wv_get_str(e, "key"), *reason = wv_get_str(e, "reason");
        const char *comp = wv_get_str(e, "component");
        uint64_t stream = 0, bytes = 0, nodes = 0, count = 1, from = 0, to = 0;
        double seconds = 0;
        wv_get_u64(e, "stream", &stream);
        wv_get_u64(e, "bytes", &bytes);
        wv_get_u64(e, "nodes", &nodes);
        wv_get_u64(e, "count", &count);
        wv_get_u64(e, "from", &from);
        wv_get_u64(e, "to", &to);
        wv_get_f64(e, "seconds", &seconds);
        const char *wn = w->route.name;
        if (!strcmp(kind, "capture"))
            brk_cq_capture(b->cat, wn, key, hash, (int)stream, bytes, nodes, seconds);
        else if (!strcmp(kind, "decline") && reason)
            brk_cq_decline(b->cat, wn, key, hash, reason, count);
        else if (!strcmp(kind, "evict") && reason)
            brk_cq_eviction(b->cat, wn, key, hash, reason, comp, from, to);
        else if (!strcmp(kind, "replays"))
            brk_cq_replays(b->cat, wn, hash, (int)stream, count);
        else
            skipped++;
    }
    if (ev && ev->kind != WV_ARR) skipped = 1;
    if (skipped) brk_log("worker %s: %zu bad EVENTS entr%s skipped", w->route.name, skipped,
                         skipped == 1 ? "y" : "ies");
}

void brk_on_worker_msg(brk_t *b, wire_msg_t *m) {
    brk_worker_t *w = brk_worker_find(b, &m->identity);
    const char *t = m->type;
    if (!strcmp(t, "READY")) {
        on_ready(b, w, m);
        return;
    }
    if (!w) {
        if (!strcmp(t, "DISCONNECT")) return; /* already forgotten */
        brk_ident_t id;
        brk_ident_from(&id, &m->identity);
        wire_val_t *h = wire_hdr("RECONNECT", 0);
        if (h && brk_send_to(b->workers, &id, h, NULL, 0) == 0)
            brk_log("unknown worker sent %s: told to RECONNECT", t);
        wv_free(&h);
        return;
    }
    w->seen_ms = brk_now_ms();
    if (!w->route.routable && !w->dead) {
        w->route.routable = true;
        brk_log("worker %s reachable again", w->route.name);
        brk_catch_up(b, w);
    }
    if (!strcmp(t, "HEARTBEAT")) return;
    if (!strcmp(t, "DISCONNECT")) {
        w->dead = true;
        w->dead_why = "disconnect";
    } else if (!strcmp(t, "PROGRESS") || !strcmp(t, "RESULT") || !strcmp(t, "ERROR")) {
        brk_on_reply(b, w, m);
    } else if (!strcmp(t, "SYNC_ACK")) {
        brk_on_sync_ack(b, w, m);
    } else if (!strcmp(t, "EVENTS")) {
        on_events(b, w, m);
    } else {
        brk_send_error_to(b->workers, &w->ident, m->id, WIRE_E_UNKNOWN,
                          "unknown message type '%.64s' on the worker socket", t);
    }
}

void brk_worker_timers(brk_t *b, int64_t now) {
    if (now >= b->next_heartbeat_ms) {
        b->next_heartbeat_ms = now + b->opt.heartbeat_ms;
        wire_val_t *h = wire_hdr("HEARTBEAT", 0);
        for (int i = 0; h && i < b->n_w; i++) {
            brk_worker_t *w = b->w[i];
            if (w->dead) continue;
            if (brk_send_to(b->workers, &w->ident, h, NULL, 0) < 0)
                brk_worker_unreachable(b, w, "HEARTBEAT");
        }
        wv_free(&h);
    }
    int64_t silent_max = (int64_t)b->opt.heartbeat_ms * b->opt.liveness;
    for (int i = 0; i < b->n_w; i++) {
        brk_worker_t *w = b->w[i];
        if (!w->dead && now - w->seen_ms > silent_max) {
            w->dead = true;
            w->dead_why = "expired";
        }
    }
}

/* Drops worker i: the catalog hears why, barriers count it as lost, its
 * in-flight requests are requeued (once) or failed, abandoned ones (their
 * client already answered) are freed. */
static void drop(brk_t *b, int i) {
    brk_worker_t *w = b->w[i];
    memmove(b->w + i, b->w + i + 1, (size_t)(b->n_w - i - 1) * sizeof *b->w);
    b->n_w--;
    brk_log("worker %s lost (%s)", w->route.name, w->dead_why ? w->dead_why : "?");
    brk_cq_worker_gone(b->cat, w->route.name, w->dead_why);
    brk_sync_worker_lost(b, w->route.name);
    for (brk_req_t *r = b->reqs, *next; r; r = next) {
        next = r->next;
        if (r->worker == w) brk_req_lost(b, r, w->route.name);
    }
    free(w);
}

int brk_reap(brk_t *b) {
    int dropped = 0;
    for (int i = 0; i < b->n_w;) {
        if (b->w[i]->dead) {
            drop(b, i);
            dropped++;
        } else {
            i++;
        }
    }
    return dropped;
}
