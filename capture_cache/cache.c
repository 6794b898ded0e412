/* cache.c -- the capture cache (see cache.h; its files: cache_impl.h):
 * create and destroy, weight components and their syncs, eviction, the
 * memory budget and LRU order, and the invariants checked after every
 * public call. */
#include "cache_impl.h"
#include "base/error.h"
#include "base/names.h"
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cap_cache_t *cap_cache_new(kern_backend_t *b, const cap_options_t *opt) {
    if (!b) { reel_fail(REEL_E_INVALID, "capture cache: no backend"); return NULL; }
    cap_options_t o = opt ? *opt : cap_options_default();
    if (o.warmup < 0) o.warmup = 2;
    if (o.warmup > 1000) { reel_fail(REEL_E_INVALID, "warmup %d is out of range (0..1000)", o.warmup); return NULL; }
    if (o.audit_every < 0) { reel_fail(REEL_E_INVALID, "audit_every %d is negative (0 turns audits off)", o.audit_every); return NULL; }
    if (o.policy != CAP_POLICY_EVICT && o.policy != CAP_POLICY_INPLACE) {
        reel_fail(REEL_E_INVALID, "unknown weight update policy %d", (int)o.policy);
        return NULL;
    }
    cap_cache_t *c = calloc(1, sizeof *c);
    if (!c) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    c->backend = b;
    c->opt = o;
    if (cap_lock_init(&c->lock, false) != 0) {
        free(c);
        return NULL;
    }
    if (cap_lock_init(&c->comp_lock, false) != 0) {
        cap_lock_destroy(&c->lock);
        free(c);
        return NULL;
    }
    CHECK_INVARIANTS(c);
    return c;
}

void cap_cache_destroy(cap_cache_t **cp) {
    if (!cp || !*cp) return;
    cap_cache_t *c = *cp;
    CHECK_INVARIANTS(c);
    evq_t q = { 0 };
    cap_lock(&c->lock);
    while (c->head) {
        assert(!c->head->in_use && "cap_cache_destroy during a dispatch");
        cap_evict(c, c->head, CAP_EVICT_SHUTDOWN, &q, NULL, 0, 0);
    }
    cap_unlock(&c->lock);
    cap_evq_flush(c, &q);
    cap_lock_destroy(&c->lock);
    cap_lock_destroy(&c->comp_lock);
    for (int i = 0; i < c->n_streams; i++) {
        cap_lock_destroy(&c->streams[i]->mu);
        free(c->streams[i]);
    }
    free(c->logged);
    free(c->streams);
    free(c);
    *cp = NULL;
}

int cap_component_register(cap_cache_t *c, const char *name, const void *base, size_t bytes,
                           uint64_t version) {
    int rc = 0;
    if (!c) return reel_fail(REEL_E_INVALID, "register component: no cache");
    /* Keys must be able to name it (cap_key_add_component). */
    if (!reel_name_valid(name, CAP_NAME_MAX))
        return reel_fail(REEL_E_INVALID, "bad component name '%s' (1..%d characters of [A-Za-z0-9_.:+-])", name ? name : "(null)",
                         CAP_NAME_MAX - 1);
    cap_lock(&c->lock);
    cap_lock(&c->comp_lock);
    if (cap_comp_find(c, name) >= 0) rc = reel_fail(REEL_E_STATE, "component '%s' is already registered", name);
    else if (c->n_comp == CAP_MAX_COMPONENTS) rc = reel_fail(REEL_E_LIMIT, "more than %d components", CAP_MAX_COMPONENTS);
    else {
        comp_t *k = &c->comp[c->n_comp];
        snprintf(k->name, sizeof k->name, "%s", name);
        k->base = base;
        k->bytes = bytes;
        k->version = version;
        k->generation = 1;
        c->n_comp++;
    }
    cap_unlock(&c->comp_lock);
    cap_unlock(&c->lock);
    CHECK_INVARIANTS(c);
    return rc;
}

/* Takes comp_lock only: program callbacks run under lock call it. */
int64_t cap_component_version(const cap_cache_t *c, const char *name) {
    if (!c || !name) return -1;
    cap_cache_t *m = (cap_cache_t *)c;
    cap_lock(&m->comp_lock);
    int i = cap_comp_find(c, name);
    int64_t v = i < 0 ? -1 : (int64_t)c->comp[i].version;
    cap_unlock(&m->comp_lock);
    return v;
}

/* The version of component name that key k names; 0 when it names none. */
static uint64_t key_comp_version(const cap_key_t *k, const char *name) {
    for (int i = 0; i < k->n_components; i++)
        if (!strcmp(k->components[i].name, name)) return k->components[i].version;
    return 0;
}

/* An inplace sync of component ci reached e: same addresses, new
 * contents. The entry is re-keyed to the component's version and verifies
 * its graph again on its next call (or after the capture in progress).
 * False, e untouched, when the new key's text does not fit. */
static bool rekey_inplace(cap_cache_t *c, entry_t *e, int ci, evq_t *q) {
    CAP_ASSERT_LOCKED(&c->lock);
    const comp_t *k = &c->comp[ci];
    const uint64_t from = key_comp_version(&e->key, k->name);
    /* The new key's text, whole, or no re-key: a version with more digits
     * can make it longer than a text holds, and a text cut short could be
     * another key's (the caller evicts the entry instead). */
    cap_key_t nk = e->key;
    char text[sizeof e->text];
    if (cap_key_set_version(&nk, k->name, k->version) != 0 || cap_key_text(&nk, false, text, sizeof text) < 0)
        return false;
    e->key = nk;
    memcpy(e->text, text, sizeof text);
    e->hash = cap_hash_text(e->text);
    cap_evq_push(q, CAP_EV_REKEY, 0, e, e->ws_bytes + e->graph_bytes, 0, 0, k->name, from, k->version);
    for (int i = 0; i < e->prog.n_components; i++)
        if (e->comp[i] == ci) e->comp_gen[i] = k->generation;
    if (e->state == ST_READY) e->state = ST_REVERIFY;
    /* in a call (capturing, verifying, auditing, warming up): whatever state
     * the call leaves, a graph it holds verifies again (capture_settle,
     * account) */
    if (e->in_use) e->reverify_pending = true;
    return true;
}

int cap_component_update(cap_cache_t *c, const char *name, const void *base, size_t bytes,
                         uint64_t new_version) {
    if (!c) return reel_fail(REEL_E_INVALID, "weight sync: no cache");
    return cap_component_update_policy(c, name, base, bytes, new_version, c->opt.policy);
}

int cap_component_update_policy(cap_cache_t *c, const char *name, const void *base, size_t bytes,
                                uint64_t new_version, cap_policy_t policy) {
    if (!c) return reel_fail(REEL_E_INVALID, "weight sync: no cache");
    if (!name) return reel_fail(REEL_E_INVALID, "weight sync: no component name");
    if (policy != CAP_POLICY_EVICT && policy != CAP_POLICY_INPLACE)
        return reel_fail(REEL_E_INVALID, "weight sync of %s: unknown policy %d (evict or inplace)", name, (int)policy);
    evq_t qq = { 0 }, *q = &qq;
    int n = 0;
    cap_lock(&c->lock);
    int ci = cap_comp_find(c, name);
    comp_t *k = ci >= 0 ? &c->comp[ci] : NULL;
    if (!k) n = reel_fail(REEL_E_NOT_FOUND, "weight sync: unknown component '%s'", name);
    else if (new_version <= k->version)
        n = reel_fail(REEL_E_INVALID, "weight sync: %s version %llu is not newer than the resident %llu", name,
                      (unsigned long long)new_version, (unsigned long long)k->version);
    else if (policy == CAP_POLICY_INPLACE && (base != k->base || bytes != k->bytes))
        n = reel_fail(REEL_E_INVALID, "weight sync: inplace policy needs %s at its resident address and size", name);
    if (n == 0) {
        uint64_t from = k->version;
        cap_lock(&c->comp_lock);
        k->version = new_version;
        cap_unlock(&c->comp_lock);
        k->generation++;
        k->base = base;
        k->bytes = bytes;
        entry_t *next;
        for (entry_t *e = c->head; e; e = next) {
            next = e->next;
            if (e->doomed || !cap_key_reads(&e->key, name)) continue;
            n++;
            /* In place only what ran on the resident version: an entry keyed
             * at another one (made before the component was registered)
             * would share its new key with the resident one's entry. */
            if (policy == CAP_POLICY_EVICT || key_comp_version(&e->key, name) != from ||
                !rekey_inplace(c, e, ci, q))
                cap_evict(c, e, CAP_EVICT_WEIGHT_SYNC, q, name, from, new_version);
        }
    }
    cap_unlock(&c->lock);
    cap_evq_flush(c, q);
    CHECK_INVARIANTS(c);
    return n;
}

int cap_evict_key(cap_cache_t *c, const cap_key_t *key, cap_evict_reason_t reason) {
    char text[CAP_KEY_TEXT_MAX];
    if (!c || !key) return reel_fail(REEL_E_INVALID, "evict key: no %s", c ? "key" : "cache");
    /* The other reasons are the cache's own: an event claiming one would lie. */
    if (reason != CAP_EVICT_EXPLICIT && reason != CAP_EVICT_SHAPE_CHANGE)
        return reel_fail(REEL_E_INVALID, "evict key: reason %d is not explicit or shape_change", (int)reason);
    if (cap_key_text(key, false, text, sizeof text) < 0) return -1;
    evq_t qq = { 0 }, *q = &qq;
    int n = 0;
    cap_lock(&c->lock);
    entry_t *next;
    for (entry_t *e = c->head; e; e = next) {
        next = e->next;
        if (!e->doomed && !strcmp(e->text, text)) {
            cap_evict(c, e, reason, q, NULL, 0, 0);
            n++;
        }
    }
    cap_unlock(&c->lock);
    cap_evq_flush(c, q);
    CHECK_INVARIANTS(c);
    return n;
}

int cap_cache_evict_all(cap_cache_t *c) {
    if (!c) return reel_fail(REEL_E_INVALID, "evict all: no cache");
    evq_t q = { 0 };
    int n = 0;
    cap_lock(&c->lock);
    entry_t *next;
    for (entry_t *e = c->head; e; e = next) {
        next = e->next;
        if (e->doomed) continue; /* evicted already; freed when its dispatch ends */
        cap_evict(c, e, CAP_EVICT_SHUTDOWN, &q, NULL, 0, 0);
        n++;
    }
    cap_unlock(&c->lock);
    cap_evq_flush(c, &q);
    CHECK_INVARIANTS(c);
    return n;
}

void cap_cache_stats(const cap_cache_t *c, cap_stats_t *out) {
    if (!out) return;
    if (!c) {
        memset(out, 0, sizeof *out);
        return;
    }
    cap_cache_t *m = (cap_cache_t *)c;
    cap_lock(&m->lock);
    *out = c->st;
    cap_unlock(&m->lock);
}

/* ---- eviction and the budget ---------------------------------------------- */

/* Evicts e with reason (or dooms it when a dispatch holds it). */
void cap_evict(cap_cache_t *c, entry_t *e, cap_evict_reason_t r, evq_t *q, const char *comp, uint64_t from,
               uint64_t to) {
    CAP_ASSERT_LOCKED(&c->lock);
    if (e->doomed) return; /* evicted already (counted then); freed when its dispatch ends */
    cap_evq_push(q, CAP_EV_EVICT, r, e, e->ws_bytes + e->graph_bytes, 0, 0, comp, from, to);
    c->st.evictions[r]++;
    /* A graph counts once published (admitted, its CAPTURE counted): one
     * still being verified when its entry goes (another thread's eviction
     * or sync) is destroyed by its capture, which never counts it. */
    if (!e->admitted) c->st.graphless_evictions[r]++;
    if (e->in_use) {
        e->doomed = true;
        e->doom_reason = r;
        return;
    }
    cap_entry_unlink(c, e);
    cap_entry_free(c, e);
}

/* Evicts every idle entry (lru): the last resort when a workspace of
 * `need` bytes (0: not known) cannot be allocated. Not for one larger than
 * all the memory its backend allocates from (the device's, or the host's
 * on the CPU), which freeing them could never make room for (a key of
 * 2^60 elements would otherwise cost every other key its graphs). True if
 * any was evicted. */
bool cap_evict_idle(cap_cache_t *c, evq_t *q, size_t need) {
    CAP_ASSERT_LOCKED(&c->lock);
    const size_t total = kern_backend_mem_total(c->backend);
    if (need == SIZE_MAX || (need && total && need > total)) return false;
    bool any = false;
    entry_t *next;
    for (entry_t *e = c->head; e; e = next) {
        next = e->next;
        if (e->in_use || e->doomed) continue;
        cap_evict(c, e, CAP_EVICT_LRU, q, NULL, 0, 0);
        any = true;
    }
    return any;
}

/* The budget arithmetic never adds to what is held: bytes_held <= the
 * budget (an invariant) and every idle entry's bytes are part of
 * bytes_held, so each comparison below subtracts from the budget instead,
 * and a need near SIZE_MAX (a budget of SIZE_MAX, a program's absurd
 * ws_bytes) is declined instead of wrapping into a small sum that fits.
 * With no budget the counters themselves bound it: an entry whose bytes
 * they could not add is declined, not counted modulo 2^64. */
bool cap_could_fit(const cap_cache_t *c, const entry_t *keep, size_t need) {
    CAP_ASSERT_LOCKED(&c->lock);
    if (!c->opt.budget_bytes) return need <= SIZE_MAX - c->st.bytes_held;
    size_t idle = 0;
    for (const entry_t *e = c->head; e; e = e->next)
        if (e != keep && !e->in_use && !e->doomed) idle += e->ws_bytes + e->graph_bytes;
    const size_t busy = c->st.bytes_held - idle; /* what no eviction can free */
    return busy <= c->opt.budget_bytes && need <= c->opt.budget_bytes - busy;
}

/* Evicts LRU entries other than keep (not in use) until `need` more bytes
 * fit the budget. True when they fit; false, nothing evicted, when they
 * could not even with every idle entry gone (cap_could_fit). */
bool cap_make_room(cap_cache_t *c, entry_t *keep, size_t need, evq_t *q) {
    CAP_ASSERT_LOCKED(&c->lock);
    /* Evict nothing unless evicting every idle entry would make it fit: a
     * graph that cannot fit anyway must not cost the other keys theirs. */
    if (!cap_could_fit(c, keep, need)) return false;
    if (!c->opt.budget_bytes) return true;
    while (need > c->opt.budget_bytes - c->st.bytes_held) {
        entry_t *victim = NULL;
        for (entry_t *e = c->head; e; e = e->next)
            if (e != keep && !e->in_use && !e->doomed) victim = e; /* last = least recent */
        if (!victim) return false;
        cap_evict(c, victim, CAP_EVICT_LRU, q, NULL, 0, 0);
    }
    return true;
}

/* The graph verified and fit: hold it. */
void cap_admit_graph(cap_cache_t *c, entry_t *e, size_t gb) {
    CAP_ASSERT_LOCKED(&c->lock);
    e->admitted = true;
    e->graph_bytes = gb;
    c->st.bytes_held += gb;
    c->st.graph_bytes += gb;
    c->st.graphs++;
}

/* ---- lookups -------------------------------------------------------------------- */

/* The slot of stream s, or -1 when the cache has none (never saw it, or
 * forgot it). */
int cap_stream_find(const cap_cache_t *c, const kern_stream_t *s) {
    CAP_ASSERT_LOCKED(&c->lock);
    for (int i = 0; i < c->n_streams; i++)
        if (c->streams[i]->s == s) return i;
    return -1;
}

/* The slot of stream s, made on first sight (a forgotten stream's slot is
 * given again: its mutex stays where it was); -1 with a message when out
 * of memory. */
int cap_stream_slot(cap_cache_t *c, kern_stream_t *s) {
    CAP_ASSERT_LOCKED(&c->lock);
    int i = cap_stream_find(c, s);
    if (i >= 0) return i;
    for (i = 0; i < c->n_streams; i++)
        if (!c->streams[i]->s) {
            c->streams[i]->s = s;
            return i;
        }
    if (c->n_streams == c->cap_streams) {
        int cap = c->cap_streams ? c->cap_streams * 2 : 8;
        stream_slot_t **n = realloc(c->streams, (size_t)cap * sizeof *n);
        if (!n) return reel_fail(REEL_E_NOMEM, "out of memory");
        c->streams = n;
        c->cap_streams = cap;
    }
    stream_slot_t *sl = calloc(1, sizeof *sl);
    if (!sl) return reel_fail(REEL_E_NOMEM, "out of memory");
    if (cap_lock_init(&sl->mu, true) != 0) {
        free(sl);
        return reel_fail(REEL_E_IO, "cannot create a stream lock");
    }
    sl->s = s;
    c->streams[c->n_streams] = sl;
    return c->n_streams++;
}

/* Evicts every entry of stream slot si (stream_gone) and gives the slot
 * up: the caller holds the slot's lock and is in no call on it, so no
 * entry of it is in use (only a call on a stream holds its entries).
 * Returns how many were evicted. */
int cap_stream_forget(cap_cache_t *c, int si, evq_t *q) {
    CAP_ASSERT_LOCKED(&c->lock);
    stream_slot_t *sl = c->streams[si];
    CAP_ASSERT_LOCKED(&sl->mu);
    assert(sl->depth == 0 && "a stream forgotten from a call on it");
    int n = 0;
    entry_t *next;
    for (entry_t *e = c->head; e; e = next) {
        next = e->next;
        if (e->stream_idx != si) continue;
        assert(!e->in_use && !e->doomed);
        cap_evict(c, e, CAP_EVICT_STREAM_GONE, q, NULL, 0, 0);
        n++;
    }
    sl->s = NULL;
    return n;
}

/* The index of component name, or -1. The table changes under both the
 * cache lock and comp_lock, so either one keeps it still. */
int cap_comp_find(const cap_cache_t *c, const char *name) {
    if (!cap_lock_mine(&c->comp_lock)) CAP_ASSERT_LOCKED(&c->lock);
    for (int i = 0; i < c->n_comp; i++)
        if (!strcmp(c->comp[i].name, name)) return i;
    return -1;
}

/* Resolves p's components into comp[]; -1 with a message. */
int cap_resolve_components(const cap_cache_t *c, const cap_program_t *p, int *comp) {
    CAP_ASSERT_LOCKED(&c->lock);
    if (p->n_inputs > CAP_MAX_INPUTS || p->n_components > CAP_MAX_COMPONENTS || p->n_inputs < 0 ||
        p->n_outputs < 0 || p->n_components < 0)
        return reel_fail(REEL_E_LIMIT, "program %s: too many inputs or components", p->name);
    for (int i = 0; i < p->n_components; i++) {
        comp[i] = cap_comp_find(c, p->components[i]);
        if (comp[i] < 0)
            return reel_fail(REEL_E_INVALID, "program %s reads weight component '%s', which is not registered", p->name,
                             p->components[i]);
    }
    return 0;
}

/* True when e was made for program p: the same table at the same address
 * (a table freed and another made at its address is another program). */
static bool same_program(const entry_t *e, const cap_program_t *p) {
    return e->prog_id == p && !memcmp(&e->prog, p, sizeof *p);
}

/* The live entry of (key text, s, p, user), or NULL. */
entry_t *cap_find(cap_cache_t *c, kern_stream_t *s, const cap_program_t *p, void *user, uint64_t hash,
                  const char *text) {
    CAP_ASSERT_LOCKED(&c->lock);
    for (entry_t *e = c->head; e; e = e->next)
        if (!e->doomed && e->hash == hash && e->stream == s && same_program(e, p) && e->user == user &&
            !strcmp(e->text, text))
            return e;
    return NULL;
}

/* True when every registered component the key names is at its registered
 * version. */
bool cap_versions_current(const cap_cache_t *c, const cap_key_t *k) {
    CAP_ASSERT_LOCKED(&c->lock);
    for (int i = 0; i < k->n_components; i++) {
        int ci = cap_comp_find(c, k->components[i].name);
        if (ci >= 0 && c->comp[ci].version != k->components[i].version) return false;
    }
    return true;
}

/* ---- invariants ---------------------------------------------------------------- */

#define INV(cond)                                                                              \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "capture cache invariant violated: %s (%s:%d)\n", #cond, __FILE__, \
                    __LINE__);                                                                 \
            return false;                                                                      \
        }                                                                                      \
    } while (0)

static bool invariants(const cap_cache_t *c) {
    CAP_ASSERT_LOCKED(&c->lock);
    size_t n = 0, ws = 0, gb = 0, graphs = 0;
    const entry_t *prev = NULL;
    for (const entry_t *e = c->head; e; prev = e, e = e->next) {
        INV(e->prev == prev);
        INV(!e->transient);
        INV(e->ws != NULL && e->prog_id != NULL);
        INV(e->stream_idx >= 0 && e->stream_idx < c->n_streams);
        INV(c->streams[e->stream_idx]->s == e->stream);
        INV(!e->doomed || e->in_use);              /* a doomed entry is freed on release */
        INV(!e->admitted || e->graph != NULL);
        INV(e->admitted || e->graph_bytes == 0);
        for (int i = 0; i < e->prog.n_components; i++) INV(e->comp[i] >= 0 && e->comp[i] < c->n_comp);
        if (!e->in_use) {
            /* Between calls a graph exists exactly when the entry may replay it. */
            INV((e->state == ST_READY || e->state == ST_REVERIFY) == (e->graph != NULL));
            INV(e->state != ST_DISABLED || cap_reason_permanent(e->disabled_reason) ||
                (e->disabled_reason == CAP_DECLINE_CAPTURE_FAILED && e->capture_fails >= CAP_CAPTURE_TRIES));
            INV(!e->reverify_pending);
        }
        if (n < 4096)
            for (const entry_t *f = e->next; f; f = f->next)
                INV(e->doomed || f->doomed ||
                    !(e->hash == f->hash && e->stream == f->stream && e->prog_id == f->prog_id &&
                      !memcmp(&e->prog, &f->prog, sizeof e->prog) && e->user == f->user &&
                      !strcmp(e->text, f->text)));
        n++;
        ws += e->ws_bytes;
        gb += e->graph_bytes;
        if (e->admitted) graphs++;
    }
    INV(n == c->st.entries);
    INV(ws == c->st.ws_bytes);
    INV(gb == c->st.graph_bytes);
    INV(graphs == c->st.graphs);
    INV(c->st.bytes_held == c->st.ws_bytes + c->st.graph_bytes);
    INV(!c->opt.budget_bytes || c->st.bytes_held <= c->opt.budget_bytes);
    for (int i = 0; i < c->n_streams; i++) {
        int busy = 0;
        for (const entry_t *e = c->head; e; e = e->next)
            if (e->in_use && e->stream_idx == i) busy++;
        INV(c->streams[i]->depth >= 0);
        INV(c->streams[i]->s || (c->streams[i]->depth == 0 && busy == 0)); /* forgotten: nothing of it left */
        INV(busy <= c->streams[i]->depth);     /* only a call on that stream holds its entries */
    }
    for (int i = 0; i < c->n_comp; i++) INV(c->comp[i].generation >= 1);
    return true;
}

bool cap_cache_invariants(const cap_cache_t *c) {
    if (!c) {
        fprintf(stderr, "capture cache invariant: no cache (NULL)\n");
        return false;
    }
    cap_cache_t *m = (cap_cache_t *)c;
    CAP_ASSERT_UNLOCKED(&c->lock); /* it is not recursive */
    cap_lock(&m->lock);
    bool ok = invariants(c);
    cap_unlock(&m->lock);
    return ok;
}
