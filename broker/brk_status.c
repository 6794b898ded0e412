/* brk_status.c -- STATUS_REPLY (docs/PROTOCOL.md): every worker with its
 * capacity, applied versions and the shard keys most recently routed to
 * it, the queue, and the current version of every component. Two extra
 * counters (malformed messages, catalog records dropped) ride along:
 * unknown fields are ignored by readers. */
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

static wire_val_t *worker_entry(const brk_worker_t *w, int64_t now) {
    wire_val_t *e = wv_map(), *vers = wv_map(), *keys = wv_arr();
    bool ok = e && vers && keys;
    for (int i = 0; ok && i < w->route.n_versions; i++)
        ok = wv_set(vers, w->route.versions[i].name, wv_u64(w->route.versions[i].version)) == 0;
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
    ok = put(e, "keys", keys, ok);
    keys = NULL;
    ok = put(e, "alive_ms", wv_u64((uint64_t)(now - w->ready_ms)), ok);
    if (!ok) wv_free(&e);
    return e;
}

void brk_on_status(brk_t *b, const wire_msg_t *m) {
    int64_t now = brk_now_ms();
    wire_val_t *h = wire_hdr("STATUS_REPLY", m->id);
    wire_val_t *ws = wv_arr(), *vers = wv_map();
    bool ok = h && ws && vers;
    for (int i = 0; ok && i < b->n_w; i++)
        ok = wv_push(ws, worker_entry(b->w[i], now)) == 0;
    for (int i = 0; ok && i < b->n_cur; i++)
        ok = wv_set(vers, b->cur[i].component, wv_u64(b->cur[i].version)) == 0;
    ok = put(h, "workers", ws, ok);
    ws = NULL;
    ok = put(h, "queue", wv_u64(brk_queue_len(&b->queue)), ok);
    ok = put(h, "queue_max", wv_u64(b->queue.max), ok);
    ok = put(h, "versions", vers, ok);
    vers = NULL;
    ok = put(h, "malformed", wv_u64(b->malformed), ok);
    ok = put(h, "catalog_dropped", wv_u64(brk_catq_dropped(b->cat)), ok);
    if (!ok)
        wire_send_error(b->clients, &m->identity, m->id, WIRE_E_INTERNAL, "broker out of memory");
    else if (wire_send(b->clients, &m->identity, h, NULL, 0) < 0)
        brk_log("STATUS_REPLY not delivered: %s", zmq_strerror(zmq_errno()));
    wv_free(&h);
}
