/* cache_entry.c -- capture cache entries: one per (key, stream, program,
 * user), owning its workspace (scratch included) and verify's copy of the
 * inputs; binding a call's inputs into it (copied, or read in place when
 * pinned), copying its outputs out, the identities of the weights its
 * graph bakes in, and an eager run. An entry keeps a copy of its
 * program's table and calls back with its user only during a dispatch
 * that passed that user: it may be freed after both are gone (cache.h,
 * Lifetimes). */
#include "cache_impl.h"
#include "base/error.h"
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the entry list -------------------------------------------------------- */

void cap_entry_unlink(cap_cache_t *c, entry_t *e) {
    CAP_ASSERT_LOCKED(&c->lock);
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    e->prev = e->next = NULL;
}

void cap_entry_push_front(cap_cache_t *c, entry_t *e) {
    CAP_ASSERT_LOCKED(&c->lock);
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    c->head = e;
}

/* Destroys e's graph and gives back its bytes. An entry with a graph is
 * listed (a transient one never holds one), so the lock is held. */
void cap_entry_drop_graph(cap_cache_t *c, entry_t *e) {
    if (!e->graph) return;
    CAP_ASSERT_LOCKED(&c->lock);
    kern_graph_destroy(&e->graph);
    if (e->admitted) {
        c->st.bytes_held -= e->graph_bytes;
        c->st.graph_bytes -= e->graph_bytes;
        c->st.graphs--;
    }
    e->admitted = false;
    e->graph_bytes = 0;
}

/* Frees e (not in use, not linked) from what it holds: its program's table
 * copy and its workspace, never its user's memory (cache.h, Lifetimes). A
 * listed entry has its bytes accounted (the lock is held); a transient one
 * is its caller's alone. */
void cap_entry_free(cap_cache_t *c, entry_t *e) {
    assert(!e->transient || !e->graph);
    if (!e->transient) CAP_ASSERT_LOCKED(&c->lock);
    cap_entry_drop_graph(c, e);
    for (int i = 0; i < e->prog.n_inputs; i++) *e->prog.input(e->user, e->ws, i) = e->static_in[i];
    e->prog.ws_free(e->user, e->ws);
    kern_free(c->backend, e->snap);
    if (!e->transient) {
        c->st.bytes_held -= e->ws_bytes;
        c->st.ws_bytes -= e->ws_bytes;
        c->st.entries--;
    }
    free(e->wid);
    free(e->wid_now);
    free(e);
}

/* ---- an entry's life ------------------------------------------------------- */

/* A new entry for (key, s, p, user) with its own workspace, not linked and
 * not accounted; made without the cache lock (ws_new may take long, and
 * may call cap_component_update). NULL with a message. */
entry_t *cap_entry_make(cap_cache_t *c, kern_stream_t *s, int sidx, const cap_program_t *p, void *user,
                        const cap_key_t *key, uint64_t hash, const char *text, const int *comp) {
    CAP_ASSERT_UNLOCKED(&c->lock);
    entry_t *e = calloc(1, sizeof *e);
    if (!e) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    e->ws = p->ws_new(user, key, s);
    if (!e->ws) { free(e); return NULL; }
    /* Every slot is read through these from here on: a NULL one fails the
     * call here, never a dereference later. */
    for (int i = 0; i < p->n_inputs + p->n_outputs; i++) {
        bool in = i < p->n_inputs;
        if (in ? p->input(user, e->ws, i) : p->output(user, e->ws, i - p->n_inputs)) continue;
        reel_fail(REEL_E_INVALID, "program %s: its workspace has no %s slot %d", p->name ? p->name : "(unnamed)",
                  in ? "input" : "output", in ? i : i - p->n_inputs);
        p->ws_free(user, e->ws);
        free(e);
        return NULL;
    }
    e->key = *key;
    snprintf(e->text, sizeof e->text, "%s", text);
    e->hash = hash;
    e->stream = s;
    e->stream_idx = sidx;
    e->prog_id = p;
    memcpy(&e->prog, p, sizeof e->prog);
    e->user = user;
    memcpy(e->comp, comp, sizeof e->comp);
    e->ws_bytes = p->ws_bytes(user, e->ws);
    size_t snap = 0;
    for (int i = 0; i < p->n_inputs; i++) {
        e->static_in[i] = *p->input(user, e->ws, i);
        e->ident_stable[i] = p->pinnable[i] && c->opt.pin_inputs;
        snap += (kern_tensor_bytes(&e->static_in[i]) + 255) & ~(size_t)255;
    }
    if (!(e->snap = kern_alloc(c->backend, snap))) {
        p->ws_free(user, e->ws);
        free(e);
        return NULL;
    }
    /* ws_bytes is the program's word: a sum past size_t stays SIZE_MAX (an
     * entry no budget holds: cap_make_room declines it), never wraps. */
    e->ws_bytes = e->ws_bytes > SIZE_MAX - snap ? SIZE_MAX : e->ws_bytes + snap;
    e->state = cap_warm_state(c);
    return e;
}

/* Links e into the list and accounts its workspace. */
void cap_entry_admit(cap_cache_t *c, entry_t *e) {
    CAP_ASSERT_LOCKED(&c->lock);
    c->st.bytes_held += e->ws_bytes;
    c->st.ws_bytes += e->ws_bytes;
    c->st.entries++;
    cap_entry_push_front(c, e);
}

/* The entry stops reading input i in place and captures again (copying
 * it) on its next call. */
void cap_entry_retire_graph(cap_cache_t *c, entry_t *e, evq_t *q) {
    CAP_ASSERT_LOCKED(&c->lock);
    if (!e->graph) return;
    if (!e->doomed) { /* a doomed entry's eviction counted its graph already */
        cap_evq_push(q, CAP_EV_EVICT, CAP_EVICT_DROPPED, e, e->graph_bytes, 0, 0, NULL, 0, 0);
        c->st.evictions[CAP_EVICT_DROPPED]++;
    }
    cap_entry_drop_graph(c, e);
}

void cap_unpin_and_recapture(cap_cache_t *c, entry_t *e, int i, evq_t *q) {
    CAP_ASSERT_LOCKED(&c->lock);
    cap_entry_retire_graph(c, e, q);
    if (i >= 0) e->ident_stable[i] = false;
    memset(e->pinned, 0, sizeof e->pinned);
    e->state = ST_CAPTURE;
}

/* ---- binding ------------------------------------------------------------------- */

bool cap_same_ident(const kern_tensor_t *a, const kern_tensor_t *b) {
    if (a->data != b->data || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->device != b->device)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d]) return false;
    return true;
}

/* Checks every input against its static slot: -1 with a message if one
 * does not fit. */
int cap_check_inputs(const entry_t *e, const cap_call_t *call) {
    for (int i = 0; i < e->prog.n_inputs; i++) {
        const kern_tensor_t *in = &call->inputs[i], *st = &e->static_in[i];
        if (!kern_tensor_same_shape(in, st)) {
            char a[96], b[96];
            const char *name = i < e->key.n_inputs ? e->key.inputs[i].name : "?";
            return reel_fail(REEL_E_INVALID, "bind: input %d '%s' is %s; the static workspace holds %s (nothing is resized)",
                             i, name, kern_tensor_describe(in, a, sizeof a), kern_tensor_describe(st, b, sizeof b));
        }
        if (!in->data) return reel_fail(REEL_E_INVALID, "bind: input %d has no data", i);
    }
    return 0;
}

/* Copies src (any strides on the host; contiguous on a device) into the
 * contiguous static tensor dst. */
static int copy_into(kern_stream_t *s, const kern_tensor_t *dst, const kern_tensor_t *src) {
    size_t bytes = kern_tensor_bytes(dst);
    if (kern_tensor_is_contiguous(src)) {
        if (src->device == KERN_DEVICE_HOST && dst->device != KERN_DEVICE_HOST)
            return kern_copy_h2d(s, kern_tensor_ptr(dst), kern_tensor_ptr(src), bytes);
        return kern_copy_d2d(s, kern_tensor_ptr(dst), kern_tensor_ptr(src), bytes);
    }
    if (src->device != KERN_DEVICE_HOST || dst->device != KERN_DEVICE_HOST)
        return reel_fail(REEL_E_INVALID, "bind: a non-contiguous input must be on the host");
    /* Strided gather on the host, element by element. */
    if (kern_stream_sync(s) != 0) return -1;
    size_t es = kern_dtype_size(src->dtype);
    int64_t n = kern_tensor_numel(src), idx[KERN_MAX_DIMS] = { 0 };
    char *out = kern_tensor_ptr(dst);
    const char *in = kern_tensor_ptr(src);
    for (int64_t j = 0; j < n; j++) {
        int64_t off = 0;
        for (int d = 0; d < src->ndim; d++) off += idx[d] * src->stride[d];
        memcpy(out + (size_t)j * es, in + off * (int64_t)es, es);
        for (int d = src->ndim - 1; d >= 0; d--) {
            if (++idx[d] < src->shape[d]) break;
            idx[d] = 0;
        }
    }
    return 0;
}

/* Points every slot at its static buffer (or, for pinned inputs when
 * use_pins, at the caller's tensor) and copies what is not read in place. */
int cap_bind(entry_t *e, kern_stream_t *s, const cap_call_t *call, bool use_pins, uint64_t *copied,
             uint64_t *pinned) {
    for (int i = 0; i < e->prog.n_inputs; i++) {
        kern_tensor_t *slot = e->prog.input(e->user, e->ws, i);
        size_t bytes = kern_tensor_bytes(&e->static_in[i]);
        if (use_pins && e->pinned[i]) {
            *slot = call->inputs[i];
            *pinned += bytes;
            continue;
        }
        *slot = e->static_in[i];
        if (copy_into(s, slot, &call->inputs[i]) != 0) return -1;
        *copied += bytes;
    }
    return 0;
}

int cap_copy_out(entry_t *e, kern_stream_t *s, const cap_call_t *call) {
    for (int i = 0; i < e->prog.n_outputs; i++) {
        const kern_tensor_t *src = e->prog.output(e->user, e->ws, i), *dst = &call->outputs[i];
        if (dst->dtype != src->dtype || kern_tensor_numel(dst) != kern_tensor_numel(src) ||
            !kern_tensor_is_contiguous(dst) || !dst->data) {
            char a[96], b[96];
            return reel_fail(REEL_E_INVALID, "copy-out: output %d destination is %s%s, the step writes %s", i,
                             kern_tensor_describe(dst, a, sizeof a),
                             !dst->data ? " with no data" : !kern_tensor_is_contiguous(dst) ? " (strided: it must be contiguous)" : "",
                             kern_tensor_describe(src, b, sizeof b));
        }
        size_t bytes = kern_tensor_bytes(src);
        int rc = dst->device == KERN_DEVICE_HOST && src->device != KERN_DEVICE_HOST
                     ? kern_copy_d2h(s, kern_tensor_ptr(dst), kern_tensor_ptr(src), bytes)
                     : kern_copy_d2d(s, kern_tensor_ptr(dst), kern_tensor_ptr(src), bytes);
        if (rc != 0) return -1;
    }
    return kern_stream_sync(s);
}

bool cap_consts_equal(const entry_t *e, const cap_call_t *call) {
    if (call->n_consts != e->n_consts) return false;
    for (int i = 0; i < e->n_consts; i++) {
        const cap_const_t *a = &e->consts[i], *b = &call->consts[i];
        if (strcmp(a->name, b->name) || a->type != b->type) return false;
        if (a->type == CAP_CONST_I64 ? a->v.i != b->v.i : memcmp(&a->v.f, &b->v.f, sizeof a->v.f))
            return false;
    }
    return true;
}

/* True when some output destination overlaps an input read in place. */
bool cap_output_aliases_pin(const entry_t *e, const cap_call_t *call) {
    for (int o = 0; o < e->prog.n_outputs; o++) {
        const char *d0 = kern_tensor_ptr(&call->outputs[o]);
        const char *d1 = d0 + kern_tensor_bytes(&call->outputs[o]);
        for (int i = 0; i < e->prog.n_inputs; i++) {
            if (!e->pinned[i]) continue;
            const char *p0 = kern_tensor_ptr(&call->inputs[i]);
            const char *p1 = p0 + kern_tensor_bytes(&call->inputs[i]);
            if (d0 < p1 && p0 < d1) return true;
        }
    }
    return false;
}

/* ---- weight identity ---------------------------------------------------------- */

/* Records the weight buffers the graph bakes in (the program's listing
 * now). 0, or -1 with a message. */
int cap_weights_record(entry_t *e) {
    const cap_program_t *p = &e->prog;
    e->n_wid = 0;
    if (!p->weights) return 0;
    int n = p->weights(e->user, NULL, 0);
    if (n < 0) return -1;
    cap_weight_t *w = calloc((size_t)n + 1, sizeof *w), *now = calloc((size_t)n + 1, sizeof *now);
    if (!w || !now) {
        free(w);
        free(now);
        return reel_fail(REEL_E_NOMEM, "out of memory recording weight identities");
    }
    if (p->weights(e->user, w, n) != n) {
        free(w);
        free(now);
        return reel_fail(REEL_E_INVALID, "program %s listed a different number of weights twice in a row", p->name);
    }
    for (int i = 0; i < n; i++)
        if (w[i].component < 0 || w[i].component >= p->n_components) {
            int bad = w[i].component;
            free(w);
            free(now);
            return reel_fail(REEL_E_INVALID, "program %s: weight %d names component %d, outside its %d components",
                             p->name, i, bad, p->n_components);
        }
    free(e->wid);
    free(e->wid_now);
    e->wid = w;
    e->wid_now = now;
    e->n_wid = n;
    return 0;
}

cap_weight_t cap_weight_of(const kern_tensor_t *t, int component) {
    /* Rank, shape and strides mixed word by word (a model lists every
     * tensor on every replay: a few multiplies each); never 0. */
    const int nd = t->ndim < 0 ? 0 : t->ndim > KERN_MAX_DIMS ? KERN_MAX_DIMS : t->ndim;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)t->ndim;
    for (int d = 0; d < 2 * nd; d++) {
        h = (h ^ (uint64_t)(d < nd ? t->shape[d] : t->stride[d - nd])) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return (cap_weight_t){ kern_tensor_ptr(t), kern_tensor_bytes(t), t->dtype, component, h ? h : 1 };
}

/* True while every weight buffer the graph read is still where, as large,
 * of the dtype and laid out as it was at capture (and no buffer was
 * added). */
bool cap_weights_same(const cap_cache_t *c, entry_t *e) {
    const cap_program_t *p = &e->prog;
    if (!p->weights || !c->opt.check_weights) return true;
    if (!e->wid_now) return false;
    int n = p->weights(e->user, e->wid_now, e->n_wid + 1);
    if (n != e->n_wid) return false;
    for (int i = 0; i < n; i++) {
        const cap_weight_t *a = &e->wid[i], *b = &e->wid_now[i];
        if (a->addr != b->addr || a->bytes != b->bytes || a->dtype != b->dtype || a->component != b->component ||
            a->layout != b->layout)
            return false;
    }
    return true;
}

/* ---- an eager run ---------------------------------------------------------------- */

/* Binds every input as a copy and launches: an eager run never reads a
 * caller's tensor in place, so a step that writes its inputs (legal for
 * copied ones) never writes the caller's buffer. */
int cap_launch_eager(entry_t *e, kern_stream_t *s, const cap_call_t *call, call_acct_t *a) {
    if (cap_bind(e, s, call, false, &a->copied, &a->pinned) != 0) return -1;
    return e->prog.launch(e->user, e->ws, call->consts, call->n_consts, s);
}

int cap_run_eager(entry_t *e, kern_stream_t *s, const cap_call_t *call, call_acct_t *a) {
    if (cap_launch_eager(e, s, call, a) != 0) return -1;
    return cap_copy_out(e, s, call);
}
