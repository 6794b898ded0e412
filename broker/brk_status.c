/* brk_status.c -- STATUS_REPLY (docs/PROTOCOL.md): every worker with its
 * capacity, applied versions, the components it lags on (and why) and the
 * shard keys most recently routed to it, the queue, the current version of
 * every component and the versions still pending. Two extra counters
 * (malformed messages, catalog records dropped) ride along: unknown fields
 * are ignored by readers. */
#include "broker/brk_broker.h"

#include <stdio.h>

#include "broker/brk_log.h"

/* Sets map[k] = v; false once anything failed (v is freed by wv_set). */
static bool put(wire_val_t *map, const char *k, wire_val_t *v, bool ok) {
    if (!ok) {
        wv_free(&v);
        return false;
    }
    return wv_set(map, k, v) == 0;
}

static wire_val_t *worker_entry(const brk_t *b, const brk_worker_t *w, int64_t now) {
    wire_val_t *e = wv_map(), *vers = wv_map(), *keys = wv_arr(), *lag = wv_map();
    bool ok = e && vers && keys && lag;
    for (int i = 0; ok && i < w->route.n_versions; i++)
        ok = wv_set(vers, w->route.versions[i].name, wv_u64(w->route.versions[i].version)) == 0;
    for (int i = 0; ok && i < b->n_cur; i++) {
        char why[192];
        if (brk_sync_lag(b, w, b->cur[i].component, why, sizeof why))
            ok = wv_set(lag, b->cur[i].component, wv_str(why)) == 0;
    }
    for (int i = 0; ok && i < w->n_keys; i++) {
        char hex[17];
        ok = wv_push(keys, wv_str(brk_hex(w->keys[i], hex))) == 0;
    }
    ok = put(e, "name", wv_str(w->route.name), ok);
    ok = put(e, "device", wv_str(w->device), ok);
    ok = put(e, "arch", wv_str(w->arch), ok);
    ok = put(e, "streams", wv_u64((uint64_t)w->streams), ok);
    ok = put(e, "inflight", wv_u64((uint64_t)w->route.inflight), ok);
    ok = put(e, "max_inflight", wv_u64((uint64_t)w->route.max_inflight), ok);
    ok = put(e, "routable", wv_bool(w->route.routable), ok);
    ok = put(e, "versions", vers, ok);
    vers = NULL;
    ok = put(e, "lagging", lag, ok);
    lag = NULL;
    ok = put(e, "keys", keys, ok);
    keys = NULL;
    ok = put(e, "alive_ms", wv_u64((uint64_t)(now - w->ready_ms)), ok);
    if (!ok) wv_free(&e);
    return e;
}

void brk_on_status(brk_t *b, const wire_msg_t *m) {
    int64_t now = brk_now_ms();
    wire_val_t *h = wire_hdr("STATUS_REPLY", m->id);
    wire_val_t *ws = wv_arr(), *vers = wv_map(), *pend = wv_map();
    bool ok = h && ws && vers && pend;
    for (int i = 0; ok && i < b->n_w; i++)
        ok = wv_push(ws, worker_entry(b, b->w[i], now)) == 0;
    for (int i = 0; ok && i < b->n_cur; i++)
        if (b->cur[i].version) /* a component whose only sync is pending has none yet */
            ok = wv_set(vers, b->cur[i].component, wv_u64(b->cur[i].version)) == 0;
    for (const brk_barrier_t *s = b->barriers; ok && s; s = s->next) {
        uint64_t have = 0;
        if (s->msg && (!wv_get_u64(pend, s->component, &have) || s->version > have))
            ok = wv_set(pend, s->component, wv_u64(s->version)) == 0;
    }
    ok = put(h, "workers", ws, ok);
    ws = NULL;
    ok = put(h, "queue", wv_u64(brk_queue_len(&b->queue)), ok);
    ok = put(h, "queue_max", wv_u64(b->queue.max), ok);
    ok = put(h, "versions", vers, ok);
    vers = NULL;
    ok = put(h, "pending", pend, ok);
    pend = NULL;
    ok = put(h, "malformed", wv_u64(b->malformed), ok);
    ok = put(h, "catalog_dropped", wv_u64(brk_catq_dropped(b->cat)), ok);
    if (!ok)
        wire_send_error(b->clients, &m->identity, m->id, WIRE_E_INTERNAL, "broker out of memory");
    else if (wire_send(b->clients, &m->identity, h, NULL, 0) < 0)
        brk_log("STATUS_REPLY not delivered: %s", zmq_strerror(zmq_errno()));
    wv_free(&h);
}
