/* cache_dispatch.c -- cap_dispatch, phase by phase: the call's stream lock
 * (lock_stream), its entry (acquire: found, admitted, or a transient one),
 * the path (decide, after check_replay's checks), the path run
 * (cache_paths.c), a kernel artifact decided meanwhile (artifact_decided),
 * the accounting and the entry's release (account). One dispatch_t
 * carries the call through them. */
#include "cache_impl.h"
#include "kernels/artifacts.h"
#include "base/clock.h"
#include "base/error.h"
#include <stdio.h>
#include <string.h>

/* This thread's dispatches. A re-entrant one (depth > 0) must not wait for
 * another stream's lock. One made while this thread captures
 * (cap_this_thread_captures) is refused before it takes any lock: the
 * capture holds the device lock shared, and other threads free device
 * memory and destroy graphs (which take it exclusive) while holding the
 * cache lock, so waiting for the cache lock here could deadlock; nor may a
 * capturing thread allocate a workspace or destroy a graph
 * (kernels/backend.h). */
static __thread struct {
    int depth;              /* cap_dispatch calls in progress */
    kern_stream_t *s;       /* the innermost one's stream, whose lock is held */
} tl;

static size_t sat_add(size_t a, size_t b);
static size_t snap_bytes(const dispatch_t *d);

/* A new entry for the call, made with the cache lock down (it is held on
 * entry and on return). When the workspace cannot be allocated (out of
 * memory, host or device), the idle entries' device memory is given back
 * and the allocation tried once more; not for any other refusal (a
 * workspace without a slot, a key it cannot hold, one over a limit):
 * freeing memory would not change that, and every other key's graphs would
 * go for nothing; nor for a workspace no memory could hold
 * (cap_evict_idle). NULL with a message. */
static entry_t *make_entry(dispatch_t *d, int si, const int *comp, const char *text, uint64_t hash) {
    cap_cache_t *c = d->c;
    CAP_ASSERT_LOCKED(&c->lock);
    cap_unlock(&c->lock);
    reel_err_clear(); /* a NULL without a code of its own is no reason to evict */
    entry_t *e = cap_entry_make(c, d->s, si, d->p, d->user, d->call->key, hash, text, comp);
    cap_lock(&c->lock);
    const reel_code_t why = reel_err_code();
    if (e || (why != REEL_E_NOMEM && why != REEL_E_DEVICE)) return e;
    const size_t need = d->p->ws_size ? sat_add(d->p->ws_size(d->user, d->call->key), snap_bytes(d)) : 0;
    if (!cap_evict_idle(c, &d->q, need)) return e;
    cap_unlock(&c->lock);
    e = cap_entry_make(c, d->s, si, d->p, d->user, d->call->key, hash, text, comp);
    cap_lock(&c->lock);
    return e;
}

static size_t sat_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

/* The bytes of a tensor of signature g; SIZE_MAX past size_t. */
static size_t sig_bytes(const cap_sig_t *g) {
    size_t n = kern_dtype_size(g->dtype);
    for (int i = 0; i < g->ndim; i++)
        if (g->shape[i] < 0 || __builtin_mul_overflow(n, (size_t)g->shape[i], &n)) return SIZE_MAX;
    return n;
}

/* What a new entry for the call will hold beside its workspace: the
 * cache's copy of each input for verify, rounded as cap_entry_make rounds
 * it. Sized from the key's declared inputs, as the workspace is, not from
 * the call's tensors: a call whose tensors do not match its key is refused
 * (shape_mismatch) after its entry is made, and must not have evicted
 * other keys' graphs for tensors it was never going to be given room for. */
static size_t snap_bytes(const dispatch_t *d) {
    size_t n = 0;
    for (int i = 0; i < d->p->n_inputs; i++) {
        size_t b = i < d->call->key->n_inputs ? sig_bytes(&d->call->key->inputs[i])
                                              : kern_tensor_bytes(&d->call->inputs[i]);
        if (b > SIZE_MAX - 255 || __builtin_add_overflow(n, (b + 255) & ~(size_t)255, &n)) return SIZE_MAX;
    }
    return n;
}

/* Finds the call's entry, or admits a new one; a busy entry, a new one the
 * budget cannot hold, or a call already declined (d->reason set) gives a
 * transient entry instead (d->reason says why). The cache lock is held,
 * and dropped and retaken around the workspace allocation. -1 with a
 * message when no workspace can be made. */
static int acquire(dispatch_t *d, int si, const int *comp, const char *text, uint64_t hash) {
    cap_cache_t *c = d->c;
    CAP_ASSERT_LOCKED(&c->lock);
    d->e = d->reason == CAP_DECLINE_COUNT ? cap_find(c, d->s, d->p, d->user, hash, text) : NULL;
    if (d->e && d->e->in_use) {
        d->reason = CAP_DECLINE_ENTRY_BUSY;
        d->e = NULL;
    } else if (!d->e && d->reason == CAP_DECLINE_COUNT && d->p->ws_size &&
               !cap_make_room(c, NULL, sat_add(d->p->ws_size(d->user, d->call->key), snap_bytes(d)), &d->q)) {
        d->reason = CAP_DECLINE_BUDGET_EXCEEDED;
    }
    if (d->e) return 0;
    entry_t *e = make_entry(d, si, comp, text, hash);
    if (!e) return -1;
    /* A sync may have landed while the lock was down: an entry of the old
     * version would be re-keyed onto the live one by the next in-place sync. */
    if (d->reason == CAP_DECLINE_COUNT && !cap_versions_current(c, d->call->key)) d->reason = CAP_DECLINE_WEIGHTS_MOVED;
    if (d->reason == CAP_DECLINE_COUNT && cap_make_room(c, NULL, e->ws_bytes, &d->q)) {
        cap_entry_admit(c, e);
    } else {
        e->transient = true;
        if (d->reason == CAP_DECLINE_COUNT) d->reason = CAP_DECLINE_BUDGET_EXCEEDED;
    }
    d->e = e;
    return 0;
}

/* Runs the call eagerly in a transient entry and frees it. The cache lock
 * is held; it is released on return. */
static int run_transient(dispatch_t *d, double t0) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    CAP_ASSERT_LOCKED(&c->lock);
    c->st.transient_runs++;
    cap_unlock(&c->lock);
    int rc = cap_run_eager(e, d->s, d->call, &d->acct);
    cap_lock(&c->lock);
    c->st.bind_bytes_copied += d->acct.copied;
    if (rc == 0) {
        double dt = reel_mono_s() - t0;
        c->st.eager_runs++;
        c->st.eager_seconds += dt;
        reel_hist_observe(&c->st.eager_hist, dt);
        cap_declined(c, e, d->reason, &d->q, d->logbuf, sizeof d->logbuf);
    }
    d->sl->depth--;
    cap_unlock(&c->lock);
    cap_entry_free(c, e);
    d->ran = CAP_RAN_EAGER;
    return rc;
}

/* The checks a READY (or REVERIFY) entry passes before it may replay; sets
 * d->reason on the first miss and repairs the entry for what follows. */
static void check_replay(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    const cap_call_t *call = d->call;
    CAP_ASSERT_LOCKED(&c->lock);
    for (int i = 0; i < d->p->n_inputs; i++)
        if (e->pinned[i] && !cap_same_ident(&e->ident[i], &call->inputs[i])) {
            /* Never read the old address. The input does not stay put, so
             * stop pinning it: the next call captures again, copying it. */
            d->reason = CAP_DECLINE_PINNED_INPUT_MOVED;
            e->ident_stable[i] = false;
        }
    if (d->reason == CAP_DECLINE_PINNED_INPUT_MOVED) {
        cap_unpin_and_recapture(c, e, -1, &d->q);
        return;
    }
    if (!cap_consts_equal(e, call)) {
        d->reason = CAP_DECLINE_CONSTANT_CHANGED;
        return;
    }
    bool moved = false;
    for (int i = 0; i < d->p->n_components; i++) {
        const comp_t *k = &c->comp[e->comp[i]];
        if (k->base != e->comp_base[i] || k->generation != e->comp_gen[i]) moved = true;
    }
    if (moved || !cap_weights_same(c, e)) {
        /* The graph baked weights that are no longer where it reads: drop
         * it (never replay it again) and learn again. */
        d->reason = CAP_DECLINE_WEIGHTS_MOVED;
        cap_entry_retire_graph(c, e, &d->q);
        e->state = cap_warm_state(c);
        e->warm = 0;
        return;
    }
    if (cap_output_aliases_pin(e, call)) {
        d->reason = CAP_DECLINE_MUTABLE_OUTPUT;
        return;
    }
    if (kern_graph_stream(e->graph) != d->s) {
        /* A graph baked its stream's scratch and cuBLAS workspace. */
        d->reason = CAP_DECLINE_WRONG_STREAM;
        cap_unpin_and_recapture(c, e, -1, &d->q);
    }
}

/* Chooses the path of the call from the entry's state, under the cache
 * lock (syncs read and write entry states under it). */
static void decide(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    CAP_ASSERT_LOCKED(&c->lock);
    d->path = P_EAGER;
    if (d->call->not_capturable) d->reason = CAP_DECLINE_NOT_CAPTURABLE;
    else if (d->call->override || !c->opt.graphs) d->reason = CAP_DECLINE_OVERRIDE;
    else switch (e->state) {
    case ST_DISABLED:
        d->reason = e->disabled_reason;
        break;
    case ST_WARMUP:
        /* A prewarm skips the rest of warmup: nothing is pinned (no
         * address was seen twice), so any later call's inputs fit. */
        if (d->call->prewarm) d->path = P_CAPTURE;
        else d->reason = CAP_DECLINE_WARMING_UP;
        break;
    case ST_BUDGET:
        /* again once its graph would fit, idle entries evicted (as a new
         * key's workspace would evict them) */
        if (cap_could_fit(c, e, e->budget_need))
            d->path = P_CAPTURE;
        else
            d->reason = CAP_DECLINE_BUDGET_EXCEEDED;
        break;
    case ST_CAPTURE:
        d->path = P_CAPTURE;
        break;
    case ST_READY:
    case ST_REVERIFY:
        check_replay(d);
        if (d->reason != CAP_DECLINE_COUNT) break;
        if (e->state == ST_REVERIFY) {
            d->path = P_REVERIFY;
        } else if (c->opt.audit_every > 0 && ++e->since_audit >= (uint64_t)c->opt.audit_every) {
            e->since_audit = 0;
            d->path = P_AUDIT;
        } else {
            d->path = P_REPLAY;
        }
        break;
    }
}

/* A kernel artifact's parity gate (kernels/artifacts.h) decided during
 * this call, on this thread: a demotion means the native result was served
 * (reason artifact_parity). A graph captured or checked in this call may
 * hold launches from before the decision, and its verify may have failed
 * for that alone: it is dropped and the entry captures again on its next
 * call, never disabled for it (a decision is not a capture fault). */
static void artifact_decided(dispatch_t *d, uint64_t promoted0, uint64_t demoted0) {
    uint64_t promoted, demoted;
    kern_artifacts_thread_decisions(&promoted, &demoted);
    if (promoted == promoted0 && demoted == demoted0) return;
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    cap_lock(&c->lock);
    bool graph_path = d->path == P_CAPTURE || d->path == P_REVERIFY || d->path == P_AUDIT;
    if (graph_path && !e->doomed &&
        (e->graph || (e->state == ST_DISABLED && e->disabled_reason == CAP_DECLINE_VERIFY_MISMATCH)))
        cap_unpin_and_recapture(c, e, -1, &d->q);
    if (graph_path && d->ran != CAP_RAN_EAGER) {
        /* The call serves its eager run's result: count it so (account). */
        d->ran = CAP_RAN_EAGER;
    }
    if (d->ran == CAP_RAN_EAGER && (demoted != demoted0 || graph_path))
        d->reason = CAP_DECLINE_ARTIFACT_PARITY;
    cap_unlock(&c->lock);
}

/* Counts the call and releases the entry (freeing it if it was evicted
 * meanwhile). Takes the lock. */
static void account(dispatch_t *d, int rc, double t0) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    cap_lock(&c->lock);
    double dt = reel_mono_s() - t0;
    c->st.bind_bytes_copied += d->acct.copied;
    c->st.bind_bytes_pinned += d->acct.pinned;
    if (rc == 0) {
        if (d->ran == CAP_RAN_EAGER) {
            c->st.eager_runs++;
            c->st.eager_seconds += dt;
            reel_hist_observe(&c->st.eager_hist, dt);
            cap_declined(c, e, d->reason, &d->q, d->logbuf, sizeof d->logbuf);
        } else if (d->ran == CAP_RAN_REPLAYED) {
            /* An audited or re-verified replay too: the step was served by
             * the graph (its time includes the eager run checked against
             * it). */
            c->st.replays++;
            c->st.replay_seconds += dt;
            reel_hist_observe(&c->st.replay_hist, dt);
        }
    }
    if (e->reverify_pending) { /* an inplace sync landed during the call (capture_settle took a capture's) */
        if (e->state == ST_READY) e->state = ST_REVERIFY;
        e->reverify_pending = false;
    }
    e->in_use = false;
    if (e->doomed) {
        cap_entry_unlink(c, e);
        cap_entry_free(c, e);
    }
    d->sl->depth--;
    cap_unlock(&c->lock);
}

/* The call's first phase, under the cache lock: counts it, resolves its
 * components, acquires its entry (d->e) and checks its inputs fit. 0 with
 * the lock held; -1 with a message, the lock released and nothing held. */
static int begin(dispatch_t *d, int si, const char *text, uint64_t hash) {
    cap_cache_t *c = d->c;
    int comp[CAP_MAX_COMPONENTS] = { 0 };
    cap_lock(&c->lock);
    d->sl = c->streams[si];
    CAP_ASSERT_LOCKED(&d->sl->mu); /* calls on one stream are serialized */
    d->sl->depth++;
    c->st.calls++;
    /* A key for another version than the resident one must get no entry:
     * an inplace sync would re-key an entry of the old version onto it. */
    if (d->reason == CAP_DECLINE_COUNT && !cap_versions_current(c, d->call->key))
        d->reason = CAP_DECLINE_WEIGHTS_MOVED;
    if (cap_resolve_components(c, d->p, comp) != 0 || acquire(d, si, comp, text, hash) != 0) {
        d->sl->depth--;
        cap_unlock(&c->lock);
        return -1;
    }
    if (cap_check_inputs(d->e, d->call) != 0) {
        c->st.declines[CAP_DECLINE_SHAPE_MISMATCH]++;
        cap_evq_push(&d->q, CAP_EV_DECLINE, CAP_DECLINE_SHAPE_MISMATCH, d->e, 0, 0, 0, NULL, 0, 0);
        d->sl->depth--;
        cap_unlock(&c->lock);
        if (d->e->transient) cap_entry_free(c, d->e);
        return -1;
    }
    return 0;
}

/* One call on stream slot si, whose lock this thread holds: begin (the
 * entry), decide the path, run it, account. */
static int dispatch_locked(dispatch_t *d, int si, const char *text, uint64_t hash, double t0) {
    cap_cache_t *c = d->c;
    int rc = 0;
    if (begin(d, si, text, hash) != 0) return -1;
    d->acct = (call_acct_t){ 0, 0, t0 };
    if (d->e->transient) return run_transient(d, t0);
    d->e->in_use = true;
    cap_entry_unlink(c, d->e);
    cap_entry_push_front(c, d->e);
    decide(d);
    cap_unlock(&c->lock);
    uint64_t promoted, demoted;
    kern_artifacts_thread_decisions(&promoted, &demoted);
    switch (d->path) {
    case P_EAGER: rc = cap_path_eager(d); break;
    case P_CAPTURE: rc = cap_path_capture(d); break;
    case P_REVERIFY:
    case P_AUDIT: rc = cap_path_verify(d); break;
    case P_REPLAY: rc = cap_path_replay(d); break;
    }
    artifact_decided(d, promoted, demoted);
    account(d, rc, t0);
    return rc;
}

/* Checks the program table and the call before anything reads them: -1
 * with a message, never a crash on a NULL a caller passed. A capture bakes
 * at most CAP_MAX_CONSTS constants and compares their names on replay;
 * inputs and outputs live on the backend's device or the host (cache.h). */
static int check_call(const cap_cache_t *c, const cap_program_t *p, const cap_call_t *call) {
    const char *pn = p->name ? p->name : "(unnamed)";
    if (!p->ws_new || !p->ws_free || !p->ws_bytes || !p->input || !p->output || !p->launch)
        return reel_fail(REEL_E_INVALID, "dispatch: program %s lacks one of ws_new, ws_free, ws_bytes, input, output "
                         "and launch", pn);
    if (p->n_inputs < 0 || p->n_inputs > CAP_MAX_INPUTS || p->n_outputs < 0 || p->n_components < 0 ||
        p->n_components > CAP_MAX_COMPONENTS)
        return reel_fail(REEL_E_INVALID, "dispatch: program %s has %d inputs, %d outputs and %d components (0..%d "
                         "inputs, 0..%d components)", pn, p->n_inputs, p->n_outputs, p->n_components, CAP_MAX_INPUTS,
                         CAP_MAX_COMPONENTS);
    for (int i = 0; i < p->n_components; i++)
        if (!p->components[i]) return reel_fail(REEL_E_INVALID, "dispatch: program %s: component %d has no name", pn, i);
    if (!call->key) return reel_fail(REEL_E_INVALID, "dispatch: a call without a key");
    if ((p->n_inputs > 0 && !call->inputs) || (p->n_outputs > 0 && !call->outputs))
        return reel_fail(REEL_E_INVALID, "dispatch: program %s takes %d inputs and %d outputs; the call has %s", pn,
                         p->n_inputs, p->n_outputs, p->n_inputs > 0 && !call->inputs ? "no inputs" : "no outputs");
    const int dev = kern_backend_device(c->backend);
    for (int i = 0; i < p->n_inputs; i++)
        if (call->inputs[i].device != dev && call->inputs[i].device != KERN_DEVICE_HOST)
            return reel_fail(REEL_E_INVALID, "dispatch: input %d of %s is on device %d; this cache's backend is on %d "
                             "(or the host)", i, pn, call->inputs[i].device, dev);
    /* An output is written by the copy-out, a device-to-device copy from the
     * workspace: a destination on another device is no more the backend's
     * to write than such an input is its to read. */
    for (int i = 0; i < p->n_outputs; i++)
        if (call->outputs[i].device != dev && call->outputs[i].device != KERN_DEVICE_HOST)
            return reel_fail(REEL_E_INVALID, "dispatch: output %d of %s is on device %d; this cache's backend is on %d "
                             "(or the host)", i, pn, call->outputs[i].device, dev);
    if (call->n_consts < 0 || call->n_consts > CAP_MAX_CONSTS)
        return reel_fail(REEL_E_INVALID, "dispatch: %d constants (a call has 0..%d)", call->n_consts, CAP_MAX_CONSTS);
    if (call->n_consts > 0 && !call->consts) return reel_fail(REEL_E_INVALID, "dispatch: %d constants and no array", call->n_consts);
    for (int i = 0; i < call->n_consts; i++)
        if (!memchr(call->consts[i].name, 0, sizeof call->consts[i].name))
            return reel_fail(REEL_E_INVALID, "dispatch: the name of constant %d is not terminated", i);
    return 0;
}

/* True when slot sl still belongs to stream s: a cap_forget_stream that
 * ran while a call waited for the slot's lock gave the slot up (and maybe
 * to another stream). */
static bool slot_is(cap_cache_t *c, const stream_slot_t *sl, const kern_stream_t *s) {
    cap_lock(&c->lock);
    bool ours = sl->s == s;
    cap_unlock(&c->lock);
    return ours;
}

/* Takes the lock of the call's stream: its slot (index in *si), or NULL
 * with a message. Calls on one stream are serialized, so two threads sharing a
 * stream never bind, replay or copy out of one workspace at the same time.
 * A re-entrant dispatch only tries the lock: waiting could deadlock (this
 * thread's launch waiting for stream B while B's owner's launch waits for
 * this thread's stream). If B is busy the call moves to the outer call's
 * stream, whose lock this thread holds, and declines entry_busy (a
 * transient workspace; a stream is never used by two threads at once). */
static stream_slot_t *lock_stream(dispatch_t *d, int *si) {
    cap_cache_t *c = d->c;
    bool nested = tl.depth > 0;
    stream_slot_t *sl, *osl;
    int oi;
    for (;;) {
        cap_lock(&c->lock);
        *si = cap_stream_slot(c, d->s);
        oi = nested && kern_stream_backend(tl.s) == c->backend ? cap_stream_slot(c, tl.s) : -1;
        sl = *si >= 0 ? c->streams[*si] : NULL;
        osl = oi >= 0 ? c->streams[oi] : NULL;
        cap_unlock(&c->lock);
        if (!sl) return NULL;
        bool got = nested ? cap_trylock(&sl->mu) : (cap_lock(&sl->mu), true);
        if (!got) break;
        if (slot_is(c, sl, d->s)) return sl;
        cap_unlock(&sl->mu); /* forgotten meanwhile: the stream is a new one now */
    }
    /* The outer call's stream is this thread's (its lock held, so no
     * forget of it can run): it needs no such check. */
    if (!osl || !cap_trylock(&osl->mu)) {
        reel_fail(REEL_E_STATE, "re-entrant dispatch: stream %d is busy on another thread and the outer call's stream "
                  "cannot serve it", *si);
        return NULL;
    }
    d->s = tl.s;
    d->reason = CAP_DECLINE_ENTRY_BUSY;
    *si = oi;
    return osl;
}

int cap_forget_stream(cap_cache_t *c, kern_stream_t *s) {
    if (!c || !s) return reel_fail(REEL_E_INVALID, "forget stream: no %s", c ? "stream" : "cache");
    /* From a launch it would wait for its own stream's lock (recursive:
     * taken, with the call's entry in use) or for another's while holding
     * one (the deadlock Threads rules out); a capture may not free. */
    if (tl.depth > 0)
        return reel_fail(REEL_E_STATE, "forget stream: called from a dispatch (a step's launch may not forget a "
                         "stream)");
    if (cap_this_thread_captures()) return reel_fail(REEL_E_STATE, "forget stream while this thread captures a step");
    evq_t q = { 0 };
    int n = 0;
    cap_lock(&c->lock);
    int si = cap_stream_find(c, s);
    stream_slot_t *sl = si >= 0 ? c->streams[si] : NULL;
    cap_unlock(&c->lock);
    if (!sl) return 0;
    cap_lock(&sl->mu); /* a call on s in progress ends first */
    cap_lock(&c->lock);
    if (sl->s == s) n = cap_stream_forget(c, si, &q); /* else another thread forgot it meanwhile */
    cap_unlock(&c->lock);
    cap_unlock(&sl->mu);
    cap_evq_flush(c, &q);
    CHECK_INVARIANTS(c);
    return n;
}

int cap_dispatch(cap_cache_t *c, kern_stream_t *s, const cap_program_t *p, void *user,
                 const cap_call_t *call, cap_result_t *res) {
    char text[CAP_KEY_TEXT_MAX];
    double t0 = reel_mono_s();
    if (!c || !s || !p || !call)
        return reel_fail(REEL_E_INVALID, "dispatch: no %s", !c ? "cache" : !s ? "stream" : !p ? "program" : "call");
    if (cap_this_thread_captures())
        return reel_fail(REEL_E_STATE, "dispatch while this thread captures a step (a step may not dispatch from a launch "
                         "being captured; the call may be made again outside the capture)");
    if (kern_stream_backend(s) != c->backend) return reel_fail(REEL_E_INVALID, "dispatch: stream of another backend");
    if (check_call(c, p, call) != 0 || cap_key_text(call->key, false, text, sizeof text) < 0) return -1;
    uint64_t hash = cap_hash_text(text);
    dispatch_t dd = { .c = c, .s = s, .p = p, .user = user, .call = call, .reason = CAP_DECLINE_COUNT,
                      .ran = CAP_RAN_EAGER },
               *d = &dd;
    int si;
    stream_slot_t *sl = lock_stream(d, &si);
    if (!sl) return -1;
    int rc;
    if (kern_stream_is_capturing(d->s))
        rc = reel_fail(REEL_E_INVALID, "dispatch on a stream that is capturing (a step may not dispatch from its launch)");
    else {
        /* Kernel artifacts are judged per capture key (kernels/artifacts.h). */
        uint64_t scope = kern_artifacts_set_scope(hash);
        kern_stream_t *outer = tl.s;
        tl.depth++;
        tl.s = d->s;
        rc = dispatch_locked(d, si, text, hash, t0);
        tl.depth--;
        tl.s = outer;
        kern_artifacts_set_scope(scope);
    }
    cap_unlock(&sl->mu);
    if (d->logbuf[0]) cap_log(c, 2, d->logbuf);
    cap_evq_flush(c, &d->q);
    if (res && rc == 0) {
        res->ran = d->ran;
        res->reason = d->ran == CAP_RAN_EAGER ? d->reason : CAP_DECLINE_COUNT;
    }
    CHECK_INVARIANTS(c);
    return rc;
}
