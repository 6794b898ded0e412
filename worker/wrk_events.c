/* wrk_events.c -- the worker's event buffer (see wrk_events.h). Entries are
 * kept as plain structs and turned into EVENTS entries only when taken, so
 * the callback the cache runs between steps does little more than a copy. */
#include "worker/wrk_events.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/thread.h"

#define MAP_MAX 256   /* cache stream numbers we translate; others pass through */

typedef struct {
    cap_event_kind_t kind;
    const char *reason;          /* static name from capture_cache */
    char *key;                   /* owned */
    uint64_t key_hash;
    int stream;
    size_t bytes, nodes;
    double seconds;
    char component[CAP_NAME_MAX];
    uint64_t from, to;
    uint64_t count;              /* declines merged into this entry */
    msg_event_t *raw;            /* owned: an entry pushed whole (wrk_events_push) */
} entry_t;

typedef struct {
    uint64_t key_hash;
    int stream;
    uint64_t count;
} replays_t;

struct wrk_events {
    pthread_mutex_t mu;
    reel_owner_t owner;          /* who holds mu (lock(), unlock()) */
    size_t max;                  /* n_ev + n_rep never exceeds it */
    entry_t *ev;
    size_t n_ev;
    replays_t *rep;
    size_t n_rep;
    uint64_t dropped;
    int map[MAP_MAX];            /* cache stream number -> worker stream, -1 unknown */
};

static _Thread_local int tl_stream = -1;

void wrk_events_set_thread_stream(int stream) { tl_stream = stream; }

wrk_events_t *wrk_events_new(size_t max_pending) {
    wrk_events_t *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    if (max_pending == 0) max_pending = 1;
    e->max = max_pending;
    e->ev = calloc(max_pending, sizeof *e->ev);
    e->rep = calloc(max_pending, sizeof *e->rep);
    if (!e->ev || !e->rep || pthread_mutex_init(&e->mu, NULL) != 0) goto err;
    for (int i = 0; i < MAP_MAX; i++) e->map[i] = -1;
    return e;
err:
    free(e->ev);
    free(e->rep);
    free(e);
    return NULL;
}

void wrk_events_destroy(wrk_events_t **ep) {
    if (!ep || !*ep) return;
    wrk_events_t *e = *ep;
    for (size_t i = 0; i < e->n_ev; i++) free(e->ev[i].key), free(e->ev[i].raw);
    free(e->ev);
    free(e->rep);
    pthread_mutex_destroy(&e->mu);
    free(e);
    *ep = NULL;
}

static void lock(wrk_events_t *e) {
    pthread_mutex_lock(&e->mu);
    reel_owner_set(&e->owner);
}

static void unlock(wrk_events_t *e) {
    reel_owner_clear(&e->owner);
    pthread_mutex_unlock(&e->mu);
}

static bool full(const wrk_events_t *e) { return e->n_ev + e->n_rep >= e->max; }

/* The worker stream of cache stream s. */
static int translate(const wrk_events_t *e, int s) {
    assert(reel_owner_mine(&e->owner));
    if (s >= 0 && s < MAP_MAX && e->map[s] >= 0) return e->map[s];
    return s;
}

/* The pending decline of (hash, reason) that a new one may merge into, or
 * NULL when a capture or eviction of the key came after it (or none is
 * pending). */
static entry_t *merge_target(wrk_events_t *e, uint64_t hash, const char *reason) {
    assert(reel_owner_mine(&e->owner));
    for (size_t i = e->n_ev; i-- > 0;) {
        entry_t *x = &e->ev[i];
        if (x->key_hash != hash) continue;
        if (x->kind != CAP_EV_DECLINE) return NULL;
        if (x->reason == reason || !strcmp(x->reason, reason)) return x;
    }
    return NULL;
}

void wrk_events_on_cache(void *user, const cap_event_t *ev) {
    wrk_events_t *e = user;
    if (!e || !ev) return;
    /* The catalog's evictions are graphs' (captures minus evictions is
     * the graphs held): an entry evicted while warming up, or whose steps
     * only ran eager, freed a workspace alone. */
    if (ev->kind == CAP_EV_EVICT && !ev->graph) return;
    lock(e);
    /* Captures and declines are delivered on the thread of the entry's own
     * stream: that is where the two numberings meet. */
    if (tl_stream >= 0 && ev->stream >= 0 && ev->stream < MAP_MAX &&
        (ev->kind == CAP_EV_CAPTURE || ev->kind == CAP_EV_DECLINE))
        e->map[ev->stream] = tl_stream;
    const char *reason = ev->kind == CAP_EV_EVICT     ? cap_evict_reason_name((cap_evict_reason_t)ev->reason)
                         : ev->kind == CAP_EV_DECLINE ? cap_reason_name((cap_reason_t)ev->reason)
                         : ev->kind == CAP_EV_CAPTURE ? cap_capture_origin_name(ev->reason)
                                                      : NULL; /* a re-key has none */
    if (ev->kind == CAP_EV_DECLINE) {
        entry_t *m = merge_target(e, ev->key_hash, reason);
        if (m) {
            m->count++;
            goto out;
        }
    }
    if (full(e)) {
        e->dropped++;
        goto out;
    }
    entry_t *x = &e->ev[e->n_ev];
    memset(x, 0, sizeof *x);
    x->key = strdup(ev->key_text ? ev->key_text : "");
    if (!x->key) {
        e->dropped++;
        goto out;
    }
    x->kind = ev->kind;
    x->reason = reason;
    x->key_hash = ev->key_hash;
    x->stream = translate(e, ev->stream);
    x->bytes = ev->bytes;
    x->nodes = ev->nodes;
    x->seconds = ev->seconds;
    if (ev->component) snprintf(x->component, sizeof x->component, "%s", ev->component);
    x->from = ev->from_version;
    x->to = ev->to_version;
    x->count = 1;
    e->n_ev++;
out:
    unlock(e);
}

void wrk_events_push(wrk_events_t *e, const msg_event_t *ev) {
    if (!e || !ev) return;
    char *key = strdup(ev->key ? ev->key : "");
    msg_event_t *raw = malloc(sizeof *raw);
    lock(e);
    if (!key || !raw || full(e)) {
        e->dropped++;
        free(key);
        free(raw);
    } else {
        *raw = *ev;
        entry_t *x = &e->ev[e->n_ev++];
        memset(x, 0, sizeof *x);
        x->kind = CAP_EV_CAPTURE; /* never a decline: nothing merges into it */
        x->key = key;
        x->key_hash = ev->key_hash;
        x->raw = raw;
    }
    unlock(e);
}

void wrk_events_replay(wrk_events_t *e, uint64_t key_hash, int stream) {
    if (!e) return;
    lock(e);
    size_t i;
    for (i = 0; i < e->n_rep; i++)
        if (e->rep[i].key_hash == key_hash && e->rep[i].stream == stream) break;
    if (i < e->n_rep) e->rep[i].count++;
    else if (full(e)) e->dropped++;
    else e->rep[e->n_rep++] = (replays_t){ key_hash, stream, 1 };
    unlock(e);
}

bool wrk_events_pending(wrk_events_t *e) {
    lock(e);
    bool p = e->n_ev + e->n_rep > 0 || e->dropped > 0;
    unlock(e);
    return p;
}

/* One event as an EVENTS entry; its key is copied to *keys (advanced). */
static void entry_event(const entry_t *x, msg_event_t *ev, char **keys) {
    static const char *kinds[] = { "capture", "decline", "evict", "rekey" };
    size_t kl = strlen(x->key) + 1;
    memcpy(*keys, x->key, kl);
    if (x->raw) {
        *ev = *x->raw;
        ev->key = *keys;
        *keys += kl;
        return;
    }
    memset(ev, 0, sizeof *ev);
    snprintf(ev->kind, sizeof ev->kind, "%s", kinds[x->kind]);
    ev->key = *keys;
    *keys += kl;
    ev->key_hash = x->key_hash;
    ev->count = 1;
    switch (x->kind) {
    case CAP_EV_CAPTURE:
        if (x->reason) snprintf(ev->reason, sizeof ev->reason, "%s", x->reason); /* demand or prewarm */
        ev->stream = x->stream;
        ev->bytes = x->bytes;
        ev->nodes = x->nodes;
        ev->seconds = x->seconds;
        break;
    case CAP_EV_DECLINE:
        snprintf(ev->reason, sizeof ev->reason, "%s", x->reason);
        ev->count = x->count;
        break;
    case CAP_EV_REKEY: /* the graph kept under its new key: no reason, the sync's versions */
        ev->stream = x->stream;
        ev->bytes = x->bytes;
        snprintf(ev->component, sizeof ev->component, "%s", x->component);
        ev->from = x->from;
        ev->to = x->to;
        break;
    case CAP_EV_EVICT:
        snprintf(ev->reason, sizeof ev->reason, "%s", x->reason);
        ev->stream = x->stream;
        ev->bytes = x->bytes;
        if (x->component[0]) {
            snprintf(ev->component, sizeof ev->component, "%s", x->component);
            ev->from = x->from;
            ev->to = x->to;
        }
        break;
    }
}

msg_event_t *wrk_events_take(wrk_events_t *e, size_t max, size_t *n, uint64_t *dropped) {
    lock(e);
    if (dropped) {
        *dropped = e->dropped;
        e->dropped = 0;
    }
    size_t n_ev = e->n_ev < max ? e->n_ev : max;
    size_t n_rep = e->n_rep < max - n_ev ? e->n_rep : max - n_ev;
    size_t key_bytes = 1; /* replay counters share one "" */
    for (size_t i = 0; i < n_ev; i++) key_bytes += strlen(e->ev[i].key) + 1;
    msg_event_t *out = NULL;
    *n = 0;
    if (n_ev + n_rep == 0 || !(out = malloc((n_ev + n_rep) * sizeof *out + key_bytes))) goto out;
    char *keys = (char *)(out + n_ev + n_rep);
    for (size_t i = 0; i < n_ev; i++) entry_event(&e->ev[i], &out[i], &keys);
    *keys = '\0';
    for (size_t i = 0; i < n_rep; i++) {
        msg_event_t *ev = &out[n_ev + i];
        memset(ev, 0, sizeof *ev);
        snprintf(ev->kind, sizeof ev->kind, "replays");
        ev->key = keys;
        ev->key_hash = e->rep[i].key_hash;
        ev->stream = e->rep[i].stream;
        ev->count = e->rep[i].count;
    }
    *n = n_ev + n_rep;
    for (size_t i = 0; i < n_ev; i++) free(e->ev[i].key), free(e->ev[i].raw);
    memmove(e->ev, e->ev + n_ev, (e->n_ev - n_ev) * sizeof *e->ev);
    e->n_ev -= n_ev;
    memmove(e->rep, e->rep + n_rep, (e->n_rep - n_rep) * sizeof *e->rep);
    e->n_rep -= n_rep;
out:
    unlock(e);
    return out;
}

/* n entries that never reached the broker: reported as dropped. */
static void lost(wrk_events_t *e, uint64_t n) {
    if (!n) return;
    lock(e);
    e->dropped += n;
    unlock(e);
}

void wrk_events_held_clear(wrk_events_held_t *held) {
    wire_parts_close(&held->parts);
    held->entries = 0;
}

int wrk_events_flush(wrk_events_t *e, void *out, wrk_events_held_t *held, int max_msgs) {
    if (held->parts.np) {
        if (wire_parts_send(out, &held->parts) != 0) {
            if (errno == EAGAIN) return 1; /* still full: it keeps its place */
            lost(e, held->entries);        /* (wire_parts_send dropped it) */
            held->entries = 0;
            return wrk_events_pending(e) ? 1 : 0;
        }
        held->entries = 0;
    }
    for (int i = 0; i < max_msgs && wrk_events_pending(e); i++) {
        msg_events_t ev = { NULL, 0, 0 };
        msg_event_t *taken = wrk_events_take(e, WRK_EVENTS_PER_MSG, &ev.n_events, &ev.dropped);
        if (!taken && !ev.dropped) break; /* out of memory: the entries stay */
        ev.events = taken;
        int rc = msg_send_keep(out, NULL, MSG_EVENTS, 0, &ev, NULL, &held->parts);
        int err = errno;
        free(taken);
        if (rc == 0) continue;
        if (err == EAGAIN && held->parts.np) { /* the broker's queue is full: this one goes first next time */
            held->entries = ev.n_events + ev.dropped;
            return 1;
        }
        lost(e, ev.n_events + ev.dropped);
        break;
    }
    return wrk_events_pending(e) ? 1 : 0;
}
