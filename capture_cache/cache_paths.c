/* cache_paths.c -- the paths a capture cache call runs once its entry and
 * path are chosen (cache_dispatch.c): eager (learning, in warmup, which
 * inputs stay put), capture (record, verify bitwise against eager, publish
 * or refuse), re-verify or audit (replay and eager, compared), replay. */
#include "cache_impl.h"
#include "base/clock.h"
#include "base/error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Set while this thread is between capture begin and end: a dispatch
 * made then is refused (cache.h, Threads). */
static __thread bool capturing;

bool cap_this_thread_captures(void) { return capturing; }

/* ---- verify: replay against eager, bitwise ----------------------------------- */

/* Where verify keeps input i's copy, inside e->snap. */
static void *snap_of(const entry_t *e, int i) {
    size_t off = 0;
    for (int j = 0; j < i; j++) off += (kern_tensor_bytes(&e->static_in[j]) + 255) & ~(size_t)255;
    return (char *)e->snap + off;
}

/* Host copies of every output, for a bitwise comparison. */
static int outputs_to_host(entry_t *e, kern_stream_t *s, unsigned char **buf, size_t *len) {
    size_t total = 0;
    for (int i = 0; i < e->prog.n_outputs; i++) total += kern_tensor_bytes(e->prog.output(e->user, e->ws, i));
    unsigned char *h = malloc(total ? total : 1);
    if (!h) return reel_fail(REEL_E_NOMEM, "out of memory");
    size_t off = 0;
    for (int i = 0; i < e->prog.n_outputs; i++) {
        const kern_tensor_t *t = e->prog.output(e->user, e->ws, i);
        size_t b = kern_tensor_bytes(t);
        if (kern_copy_d2h(s, h + off, kern_tensor_ptr(t), b) != 0) { free(h); return -1; }
        off += b;
    }
    if (kern_stream_sync(s) != 0) { free(h); return -1; }
    *buf = h;
    *len = total;
    return 0;
}

/* Compares each pinned input with its host snapshot; one that changed is
 * restored from it and, if *bad is still -1, named in *bad. 0, or -1 on
 * failure. */
static int pinned_check(entry_t *e, kern_stream_t *s, const cap_call_t *call, unsigned char **hsnap, int *bad) {
    for (int i = 0; i < e->prog.n_inputs; i++) {
        if (!hsnap[i]) continue;
        size_t bytes = kern_tensor_bytes(&call->inputs[i]);
        unsigned char *now = malloc(bytes ? bytes : 1);
        if (!now) return reel_fail(REEL_E_NOMEM, "out of memory");
        int rc = kern_copy_d2h(s, now, kern_tensor_ptr(&call->inputs[i]), bytes);
        if (rc == 0) rc = kern_stream_sync(s);
        bool changed = rc == 0 && memcmp(now, hsnap[i], bytes) != 0;
        free(now);
        if (rc != 0) return -1;
        if (!changed) continue;
        if (*bad < 0) *bad = i;
        if (kern_copy_h2d(s, kern_tensor_ptr(&call->inputs[i]), hsnap[i], bytes) != 0 || kern_stream_sync(s) != 0)
            return -1;
    }
    return 0;
}

/* Replays e's graph once and runs eager on the same inputs. Returns 1 when
 * every output is bitwise equal and no input read in place changed; 0 when
 * the outputs differ; 2 when the step wrote a pinned input (*bad names the
 * first; every pinned input is restored, as eager, which copies them, would
 * leave them); -1 on failure. Leaves the workspace as the eager run left it
 * (the call's correct result). Slots must be bound. */
static int verify(entry_t *e, kern_stream_t *s, const cap_call_t *call, int *bad) {
    void *snap[CAP_MAX_INPUTS] = { 0 };
    unsigned char *hsnap[CAP_MAX_INPUTS] = { 0 };
    unsigned char *ha = NULL, *hb = NULL;
    size_t la = 0, lb = 0;
    int rc = -1;
    *bad = -1;
    /* Snapshot every input: copied ones because the step may update them in
     * place (legal), pinned ones to prove it does not write them. */
    for (int i = 0; i < e->prog.n_inputs; i++) {
        if (e->pinned[i]) {
            size_t bytes = kern_tensor_bytes(&call->inputs[i]);
            if (!(hsnap[i] = malloc(bytes ? bytes : 1))) { reel_fail(REEL_E_NOMEM, "out of memory"); goto out; }
            if (kern_copy_d2h(s, hsnap[i], kern_tensor_ptr(&call->inputs[i]), bytes) != 0) goto out;
            continue;
        }
        size_t bytes = kern_tensor_bytes(&e->static_in[i]);
        snap[i] = snap_of(e, i);
        if (kern_copy_d2d(s, snap[i], kern_tensor_ptr(&e->static_in[i]), bytes) != 0) goto out;
    }
    if (kern_stream_sync(s) != 0) goto out;
    if (kern_graph_replay(e->graph, s) != 0 || outputs_to_host(e, s, &ha, &la) != 0) goto out;
    if (pinned_check(e, s, call, hsnap, bad) != 0) goto out;
    for (int i = 0; i < e->prog.n_inputs; i++)
        if (snap[i] && kern_copy_d2d(s, kern_tensor_ptr(&e->static_in[i]), snap[i],
                                     kern_tensor_bytes(&e->static_in[i])) != 0)
            goto out;
    if (e->prog.launch(e->user, e->ws, call->consts, call->n_consts, s) != 0) goto out;
    if (outputs_to_host(e, s, &hb, &lb) != 0) goto out;
    if (pinned_check(e, s, call, hsnap, bad) != 0) goto out;
    rc = *bad >= 0 ? 2 : la == lb && memcmp(ha, hb, la) == 0;
out:
    if (kern_stream_sync(s) != 0) rc = -1;
    for (int i = 0; i < e->prog.n_inputs; i++) free(hsnap[i]);
    free(ha);
    free(hb);
    return rc;
}

/* ---- capture ------------------------------------------------------------------ */

/* The verified graph g of e is held if the budget has room for it (LRU
 * entries are evicted to make it): true when held, its capture counted
 * and queued as an event. An entry evicted while it captured (another
 * thread's sync, evict or shutdown: doomed, freed when this call ends)
 * holds nothing and makes no room: false, *doomed set. */
static bool publish(cap_cache_t *c, entry_t *e, kern_graph_t *g, bool prewarm, evq_t *q, double t0, double *secs,
                    bool *doomed) {
    size_t gb = kern_graph_bytes(g);
    cap_lock(&c->lock);
    *doomed = e->doomed;
    if (*doomed) {
        cap_unlock(&c->lock);
        return false;
    }
    bool fits = cap_make_room(c, e, gb, q);
    if (fits) {
        cap_admit_graph(c, e, gb);
        c->st.captures++;
        if (prewarm) c->st.prewarm_captures++;
        c->st.verifies++;
        *secs = reel_mono_s() - t0;
        c->st.capture_seconds += *secs;
        reel_hist_observe(&c->st.capture_hist, *secs);
        cap_evq_push(q, CAP_EV_CAPTURE, prewarm ? CAP_CAPTURE_PREWARM : CAP_CAPTURE_DEMAND, e, gb + e->ws_bytes, kern_graph_nodes(g), *secs, NULL, 0, 0);
    }
    cap_unlock(&c->lock);
    if (!fits) e->budget_need = gb;
    return fits;
}

/* Logs a failed capture of e (or its preparation); returns 1 (nothing ran).
 * e's key text is read under the lock: an in-place sync re-keys it there. */
static int capture_failed(cap_cache_t *c, const entry_t *e) {
    char msg[CAP_KEY_TEXT_MAX + 560], text[CAP_KEY_TEXT_MAX];
    CAP_ASSERT_UNLOCKED(&c->lock); /* and no capture open: the device lock is not held either */
    cap_lock(&c->lock);
    snprintf(text, sizeof text, "%s", e->text);
    cap_unlock(&c->lock);
    snprintf(msg, sizeof msg, "capture of %s failed: %.500s", text, reel_err_text());
    cap_log(c, 2, msg);
    return 1;
}

/* Captures e's step (slots bound with pins). On success e->graph is set and
 * admitted, and the workspace holds the verified eager result. On a refusal
 * after verify returns 0 with *why set (and *bad for mutable_input); the
 * workspace holds the eager result. Returns 1 with *why set when nothing
 * ran (the capture or its preparation failed): the caller runs the step.
 * -1 when verify itself fails. */
static int capture(cap_cache_t *c, entry_t *e, kern_stream_t *s, const cap_call_t *call,
                   cap_reason_t *why, int *bad, evq_t *q, double *secs) {
    double t0 = reel_mono_s();
    kern_graph_t *g = NULL;
    *why = CAP_DECLINE_COUNT;
    if (cap_weights_record(e) != 0) {
        *why = CAP_DECLINE_CAPTURE_FAILED;
        return capture_failed(c, e);
    }
    if (kern_capture_begin(s) != 0) {
        /* a backend that cannot capture, for good; anything else (out of
         * memory, a device error, a capture open elsewhere) is retried */
        if (reel_err_code() == REEL_E_UNSUPPORTED) {
            *why = CAP_DECLINE_BACKEND_UNAVAILABLE;
            return 1;
        }
        *why = CAP_DECLINE_CAPTURE_FAILED;
        return capture_failed(c, e);
    }
    capturing = true;
    int lrc = e->prog.launch(e->user, e->ws, call->consts, call->n_consts, s);
    int erc = kern_capture_end(s, &g);
    capturing = false;
    if (lrc != 0 || erc != 0) {
        kern_graph_destroy(&g);
        *why = CAP_DECLINE_CAPTURE_FAILED;
        return capture_failed(c, e);
    }
    e->graph = g;
    int v = verify(e, s, call, bad);
    bool doomed = false;
    if (v == 1 && publish(c, e, g, call->prewarm, q, t0, secs, &doomed)) return 0;
    e->graph = NULL;
    kern_graph_destroy(&g);
    if (v < 0) return -1;
    *why = v == 0 ? CAP_DECLINE_VERIFY_MISMATCH : v == 2 ? CAP_DECLINE_MUTABLE_INPUT : CAP_DECLINE_BUDGET_EXCEEDED;
    /* evicted meanwhile: by a sync, its weights moved; else the graph
     * was dropped as for a budget that had no room for it */
    if (doomed && e->doom_reason == CAP_EVICT_WEIGHT_SYNC) *why = CAP_DECLINE_WEIGHTS_MOVED;
    return 0; /* the workspace holds the eager result */
}

/* ---- the paths ------------------------------------------------------------------ */

/* An eager call; in warmup it also learns which pinnable inputs stay put. */
int cap_path_eager(dispatch_t *d) {
    entry_t *e = d->e;
    if (e->state == ST_WARMUP && d->reason == CAP_DECLINE_WARMING_UP) {
        for (int i = 0; i < d->p->n_inputs; i++) {
            if (!e->ident_stable[i]) continue;
            if (e->warm > 0 && !cap_same_ident(&e->ident[i], &d->call->inputs[i])) e->ident_stable[i] = false;
            e->ident[i] = d->call->inputs[i];
        }
        if (++e->warm >= d->c->opt.warmup) {
            cap_lock(&d->c->lock); /* state is read under the lock by syncs */
            e->state = ST_CAPTURE;
            cap_unlock(&d->c->lock);
        }
    }
    return cap_run_eager(e, d->s, d->call, &d->acct);
}

/* Chooses what the capture reads in place and what it bakes. */
static void prepare_capture(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    const cap_call_t *call = d->call;
    for (int i = 0; i < d->p->n_inputs; i++)
        e->pinned[i] = !call->prewarm && e->ident_stable[i] && e->warm > 0 &&
                       cap_same_ident(&e->ident[i], &call->inputs[i]) &&
                       call->inputs[i].device == kern_backend_device(c->backend) &&
                       kern_tensor_is_contiguous(&call->inputs[i]);
    if (cap_output_aliases_pin(e, call)) memset(e->pinned, 0, sizeof e->pinned);
    for (int i = 0; i < d->p->n_inputs; i++)
        if (e->pinned[i]) e->ident[i] = call->inputs[i];
    e->n_consts = call->n_consts; /* 0..CAP_MAX_CONSTS: check_call */
    if (e->n_consts > 0) memcpy(e->consts, call->consts, (size_t)e->n_consts * sizeof *e->consts);
    cap_lock(&c->lock);
    for (int i = 0; i < d->p->n_components; i++) {
        e->comp_base[i] = c->comp[e->comp[i]].base;
        e->comp_gen[i] = c->comp[e->comp[i]].generation;
    }
    cap_unlock(&c->lock);
}

static void capture_settle(dispatch_t *d, cap_reason_t why, int bad);

/* Warmup done: capture, verify, and publish or refuse the graph. */
int cap_path_capture(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    cap_reason_t why = CAP_DECLINE_COUNT;
    double secs = 0;
    int bad = -1;
    prepare_capture(d);
    call_acct_t pins = { 0, 0, 0 };
    int rc = cap_bind(e, d->s, d->call, true, &pins.copied, &pins.pinned);
    if (rc == 0) rc = capture(c, e, d->s, d->call, &why, &bad, &d->q, &secs);
    if (rc == 1) rc = cap_launch_eager(e, d->s, d->call, &d->acct); /* the slots may point at pinned inputs */
    else {
        d->acct.copied += pins.copied;
        d->acct.pinned += pins.pinned;
    }
    if (rc != 0) return rc;
    capture_settle(d, why, bad);
    return cap_copy_out(e, d->s, d->call);
}

/* The entry's state follows its capture (why: COUNT when the graph was
 * published), whatever copy-out does next: a published graph must be owned
 * by a READY entry. */
static void capture_settle(dispatch_t *d, cap_reason_t why, int bad) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    cap_lock(&c->lock);
    if (why == CAP_DECLINE_COUNT) {
        e->state = e->reverify_pending ? ST_REVERIFY : ST_READY;
        e->since_audit = 0;
        e->capture_fails = 0; /* a capture that works: later failures count afresh */
        if (e->reverify_pending)
            for (int i = 0; i < d->p->n_components; i++) e->comp_gen[i] = c->comp[e->comp[i]].generation;
        d->ran = CAP_RAN_CAPTURED;
    } else if (why == CAP_DECLINE_MUTABLE_INPUT) {
        d->reason = why;
        cap_unpin_and_recapture(c, e, bad, &d->q);
    } else if (why == CAP_DECLINE_CAPTURE_FAILED && ++e->capture_fails < CAP_CAPTURE_TRIES) {
        /* Often transient (another thread invalidated a CUDA capture): try
         * again on the next call. */
        d->reason = why;
        memset(e->pinned, 0, sizeof e->pinned);
        e->state = ST_CAPTURE;
    } else {
        d->reason = why;
        e->state = why == CAP_DECLINE_BUDGET_EXCEEDED ? ST_BUDGET : ST_DISABLED;
        e->disabled_reason = why;
        memset(e->pinned, 0, sizeof e->pinned);
    }
    e->reverify_pending = false;
    cap_unlock(&c->lock);
}

/* A re-verification after an inplace sync, or a runtime audit: replay and
 * eager on the same inputs, the eager result kept. */
int cap_path_verify(dispatch_t *d) {
    cap_cache_t *c = d->c;
    entry_t *e = d->e;
    int bad = -1;
    int rc = cap_bind(e, d->s, d->call, true, &d->acct.copied, &d->acct.pinned);
    int v = rc == 0 ? verify(e, d->s, d->call, &bad) : -1;
    if (v < 0) rc = -1;
    if (rc == 0) rc = cap_copy_out(e, d->s, d->call);
    cap_lock(&c->lock);
    if (d->path == P_REVERIFY) c->st.reverifies++;
    else c->st.audits++;
    if (v == 1) {
        e->state = ST_READY;
        d->ran = CAP_RAN_REPLAYED; /* counted with its time by account */
    } else if (v == 2) {
        d->reason = CAP_DECLINE_MUTABLE_INPUT;
        cap_unpin_and_recapture(c, e, bad, &d->q);
    } else if (v == 0 && d->path == P_REVERIFY) {
        cap_entry_retire_graph(c, e, &d->q);
        e->state = ST_DISABLED;
        e->disabled_reason = d->reason = CAP_DECLINE_VERIFY_MISMATCH;
    } else if (v == 0) {
        /* Something the graph baked in changed and no check saw it: the
         * entry cannot be trusted; the call keeps the eager result. */
        d->reason = CAP_DECLINE_AUDIT_MISMATCH;
        cap_evict(c, e, CAP_EVICT_AUDIT_MISMATCH, &d->q, NULL, 0, 0); /* its event: workspace and graph */
        cap_entry_drop_graph(c, e);
    }
    cap_unlock(&c->lock);
    return rc;
}

int cap_path_replay(dispatch_t *d) {
    int rc = cap_bind(d->e, d->s, d->call, true, &d->acct.copied, &d->acct.pinned);
    if (rc == 0) rc = kern_graph_replay(d->e->graph, d->s);
    if (rc == 0) rc = cap_copy_out(d->e, d->s, d->call);
    d->ran = CAP_RAN_REPLAYED;
    return rc;
}
