/* brk_sync.c -- weight syncs. A trainer's SYNC is checked (fields, a version
 * newer than the current and any pending one), recorded in the catalog as
 * pending and forwarded to every live worker; a barrier then waits for the
 * workers live at that moment and answers SYNC_DONE once each has acked
 * (ok or not), died, or the deadline passed.
 *
 * A version becomes its component's current one only when a live worker
 * has applied it (the first ok ack): only then do GENs without "version"
 * need it, are late joiners sent it after READY, and does the catalog mark
 * it current (what a restarted broker resumes). A sync that no worker
 * applied changes nothing: the previous current SYNC stays, the catalog
 * marks the version failed with the workers' reasons, nobody is caught up
 * to it, and the trainer's SYNC_DONE (complete false) lists each reason.
 * Otherwise every GEN would be refused no_worker after a bad file, forever.
 *
 * Partly applied: the version is current, and a worker that failed it is
 * lagging. Requests needing the new version no longer reach it
 * (brk_peer_eligible reads the acked version, and, while a barrier waits
 * for its ack, the version it applies: brk_note_applying); it still serves requests
 * whose "version" it has; STATUS says why it lags; it is sent the version
 * again when it reconnects (READY) or when the trainer resends the SYNC.
 *
 * Resending the current or a pending version with the same sha256 is an
 * ack, not stale_version, so a trainer can retry after a timeout: a
 * pending one joins the running barrier (same SYNC_DONE); the current one
 * gets a new barrier that retries the lagging workers (complete at once
 * when none lags). The same version with other weights is stale_version.
 *
 * A broker that stopped mid-sync leaves the version pending in the
 * catalog; the next one marks it failed at start but remembers it
 * (brk_interrupted_t): a worker that registers running it applied it after
 * all, so it becomes current again (with a catalog row saying so), and a
 * trainer's resend of it (the client libraries resend a SYNC whose broker
 * went silent or restarted) is held for the workers to register instead
 * of failing at once with no live worker.
 *
 * A SYNC that cannot be delivered (the worker's connection is gone, as
 * between two of its broker sessions, or its queue is full) does not fail
 * its member: the barrier waits for that worker to register again or
 * speak again, when it is sent again, and fails the member only when the
 * worker is dropped (liveness) or the deadline passes ("SYNC not
 * delivered: ..."). A worker between sessions is not a worker that
 * refused, and its trainer must not be told so. A send that fails for
 * another reason (the codec refused the message, out of memory) leaves
 * the worker routable and nothing to send it again: its member fails at
 * once, "SYNC could not be sent: <error>".
 *
 * Only a trainer may SYNC (brk_zap.c refuses the others before they get
 * here); every SYNC that gets here is audited with its key's name and
 * what became of it, but for resends: each key's first resend of a
 * version is audited, the rest are counted and audited as one row per
 * key when the barrier ends or the version stops being current
 * (brk_resends_t). A deadline is clamped to BRK_SYNC_DEADLINE_MAX_MS,
 * and a worker's ack counts only for a version it was sent. */
#include "broker/brk_sync.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "broker/brk_log.h"
#include "broker/brk_deliver.h"
#include "broker/brk_msg.h"
#include "broker/brk_upload.h"
#include "broker/brk_zap.h"
#include "base/error.h"

enum { M_WAITING = BRK_MEMBER_WAITING, M_APPLIED = BRK_MEMBER_APPLIED, M_FAILED = BRK_MEMBER_FAILED };

static const brk_current_t *find_current(const brk_t *b, const char *component) {
    for (int i = 0; i < b->n_cur; i++)
        if (!strcmp(b->cur[i].component, component)) return &b->cur[i];
    return NULL;
}

uint64_t brk_current_version(const brk_t *b, const char *component) {
    const brk_current_t *c = find_current(b, component);
    return c ? c->version : 0;
}

uint64_t brk_current_base(const brk_t *b, const char *component) {
    const brk_current_t *c = find_current(b, component);
    return c && c->sync ? c->sync->base_version : 0;
}

static brk_current_t *current_slot(brk_t *b, const char *component) {
    for (int i = 0; i < b->n_cur; i++)
        if (!strcmp(b->cur[i].component, component)) return &b->cur[i];
    if (b->n_cur >= BRK_MAX_COMPONENTS) return NULL;
    brk_current_t *c = &b->cur[b->n_cur++];
    memset(c, 0, sizeof *c);
    snprintf(c->component, sizeof c->component, "%s", component);
    return c;
}

static void free_sync(msg_sync_t **sp) {
    free(*sp);
    *sp = NULL;
}

/* Notes a resend by who in tally t: true when it is who's first (audit
 * it), false when it is only counted. Can't fail. */
static bool resend_first(brk_resends_t *t, const brk_who_t *who) {
    for (int i = 0; i < t->n; i++)
        if (t->by[i].role == (int)who->role && !strcmp(t->by[i].name, who->name)) {
            t->by[i].more++;
            return false;
        }
    if (t->n == BRK_SYNC_RESENDERS) {
        t->others++;
        return false;
    }
    brk_resender_t *r = &t->by[t->n++];
    snprintf(r->name, sizeof r->name, "%s", who->name);
    r->role = (int)who->role;
    r->more = 0;
    return true;
}

/* Audits what tally t counted of resends of (component, version, sha256)
 * -- its SYNC s when known, for its path -- one row per key that resent
 * it more than once ("resend: N more while <phase>"), and empties t. */
static void resends_end(brk_t *b, brk_resends_t *t, const char *component, uint64_t version, const char *sha256,
                        const msg_sync_t *s, const char *phase) {
    msg_sync_t *known = NULL;
    for (int i = 0; i <= t->n; i++) {
        uint64_t more = i < t->n ? t->by[i].more : t->others;
        if (!more) continue;
        if (!s && !known) { /* (a barrier of a version current once, superseded since: no path kept) */
            if (!(known = calloc(1, sizeof *known))) {
                brk_log("sync %s v%llu: out of memory: %llu resends not audited", component,
                        (unsigned long long)version, (unsigned long long)more);
                continue;
            }
            snprintf(known->component, sizeof known->component, "%s", component);
            known->version = version;
            snprintf(known->sha256, sizeof known->sha256, "%s", sha256);
        }
        brk_who_t who;
        memset(&who, 0, sizeof who);
        char outcome[160];
        if (i < t->n) {
            snprintf(who.name, sizeof who.name, "%s", t->by[i].name);
            who.role = (reel_role_t)t->by[i].role;
            snprintf(outcome, sizeof outcome, "resend: %llu more while %s", (unsigned long long)more, phase);
        } else {
            snprintf(who.name, sizeof who.name, "*");
            who.role = REEL_ROLE_TRAINER; /* several keys: only one with keys names more than one */
            snprintf(outcome, sizeof outcome, "resend: %llu more while %s, by keys past the first %d that resent it",
                     (unsigned long long)more, phase, BRK_SYNC_RESENDERS);
        }
        brk_zap_audit(b, &who, "sync", s ? s : known, outcome);
    }
    free(known);
    memset(t, 0, sizeof *t);
}

/* cur's version stops being current (a newer one replaces it, or the
 * broker stops): its resends are audited. */
static void current_ends(brk_t *b, brk_current_t *cur) {
    if (cur->version)
        resends_end(b, &cur->resent, cur->component, cur->version, cur->sha256, cur->sync, "it was current");
}

static brk_barrier_t *barrier_of(brk_t *b, const char *component, uint64_t version) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next)
        if (s->version == version && !strcmp(s->component, component)) return s;
    return NULL;
}

bool brk_sync_under_way(const brk_t *b, const char *component, uint64_t version) {
    return barrier_of((brk_t *)b, component, version) != NULL;
}

const char *brk_sync_under_way_sha(const brk_t *b, const char *component, uint64_t version) {
    const brk_barrier_t *s = barrier_of((brk_t *)b, component, version);
    return s ? s->sha256 : NULL;
}

/* The newest version of component still pending (0: none). */
static uint64_t newest_pending(const brk_t *b, const char *component) {
    uint64_t v = 0;
    for (const brk_barrier_t *s = b->barriers; s; s = s->next)
        if (s->sync && s->version > v && !strcmp(s->component, component)) v = s->version;
    return v;
}

/* w's sync progress on component (created when create is set). NULL when
 * there is none (or no room: components are capped at BRK_MAX_COMPONENTS). */
static brk_wsync_t *worker_sync(brk_worker_t *w, const char *component, bool create) {
    for (int i = 0; i < w->n_syncs; i++)
        if (!strcmp(w->syncs[i].component, component)) return &w->syncs[i];
    if (!create || w->n_syncs >= BRK_MAX_COMPONENTS) return NULL;
    brk_wsync_t *ws = &w->syncs[w->n_syncs++];
    memset(ws, 0, sizeof *ws);
    snprintf(ws->component, sizeof ws->component, "%s", component);
    return ws;
}

static const brk_wsync_t *wsync_of(const brk_worker_t *w, const char *component) {
    return worker_sync((brk_worker_t *)w, component, false);
}

/* Whether version is one of the last BRK_SENT_KEPT ws was sent (or its
 * worker reported at READY). */
static bool was_sent(const brk_wsync_t *ws, uint64_t version) {
    for (unsigned i = 0; i < ws->n_sent && i < BRK_SENT_KEPT; i++)
        if (ws->sent_v[i] == version) return true;
    return false;
}

static void note_sent(brk_wsync_t *ws, uint64_t version) {
    if (was_sent(ws, version)) return;
    ws->sent_v[ws->n_sent++ % BRK_SENT_KEPT] = version;
}

/* The index of (component, version) among the syncs a broker restart
 * interrupted, or -1. */
static int interrupted_at(const brk_t *b, const char *component, uint64_t version) {
    for (int i = 0; i < b->n_interrupted; i++)
        if (b->interrupted[i].version == version && !strcmp(b->interrupted[i].component, component)) return i;
    return -1;
}

/* Forwards SYNC s (broker id sync_id) to w and notes it sent and awaiting
 * its ack. 0, or -1 with the failure logged: w was unreachable already,
 * or is marked so now when its pipe is gone or full (a transport
 * failure); any other failure (the codec refused it, out of memory)
 * leaves w routable, with errno saying why (not_sent tells them apart). */
static int sync_send(brk_t *b, brk_worker_t *w, uint64_t sync_id, const msg_sync_t *s) {
    if (!w->route.routable || brk_worker_send(b, w, MSG_SYNC, sync_id, s, NULL) != 0) return -1;
    brk_wsync_t *ws = worker_sync(w, s->component, true);
    if (ws) note_sent(ws, s->version); /* (a base sent after its adapter too) */
    if (ws && s->version >= ws->sent) {
        ws->sent = s->version;
        ws->sent_id = sync_id;
        ws->waiting = true;
    }
    /* (within w's share: its READY again, or its word after it was
     * unreachable, sends it a catch-up or a barrier's SYNC again) */
    brk_log_limited(&w->log, w->route.name, "sync %s v%llu sent to %s", s->component, (unsigned long long)s->version,
                    w->route.name);
    return 0;
}

/* The full SYNC adapter SYNC a is on, as the broker holds it now (the
 * component's current version, or the base its current adapter keeps),
 * with its broker id in *id; NULL when a is no adapter or the broker
 * holds no SYNC of its base. */
static const msg_sync_t *held_base(const brk_t *b, const msg_sync_t *a, uint64_t *id) {
    const brk_current_t *c = a->base_version ? find_current(b, a->component) : NULL;
    if (!c) return NULL;
    if (c->sync && !c->sync->base_version && c->version == a->base_version) {
        *id = c->sync_id;
        return c->sync;
    }
    if (c->base && c->base->version == a->base_version) {
        *id = c->base_id;
        return c->base;
    }
    return NULL;
}

/* sync_send of s, an adapter's base first when w neither runs it nor was
 * sent it on this session: the worker applies SYNCs in order, and
 * refuses an adapter on a base it does not run. -1 (s not sent) as
 * sync_send's, when the base's send failed too. */
static int sync_send_on_base(brk_t *b, brk_worker_t *w, uint64_t sync_id, const msg_sync_t *s) {
    const brk_wsync_t *ws = wsync_of(w, s->component);
    uint64_t base_id = 0;
    const msg_sync_t *base = brk_peer_version(&w->route, s->component) < s->base_version &&
                                     !(ws && ws->sent >= s->base_version)
                                 ? held_base(b, s, &base_id)
                                 : NULL;
    if (base && sync_send(b, w, base_id, base) != 0) return -1;
    return sync_send(b, w, sync_id, s);
}

static void catch_up_not_sent(brk_t *b, const brk_worker_t *w, const char *component, uint64_t version, int e);

/* Only what w was never sent: a version it failed is sent again when it
 * reconnects (READY: a new registration) or when the trainer resends it,
 * not each time it speaks, which would retry a broken file in a loop. An
 * adapter on a base w does not run goes after its base (sync_send_on_base).
 * A send that fails but for its transport fails the barrier members of w
 * that waited for this SYNC to reach it (catch_up_not_sent). */
void brk_catch_up(brk_t *b, brk_worker_t *w) {
    for (int i = 0; i < b->n_cur && w->route.routable; i++) {
        const brk_current_t *c = &b->cur[i];
        if (!c->sync) continue;
        const brk_wsync_t *ws = wsync_of(w, c->component);
        uint64_t at = brk_peer_version(&w->route, c->component);
        if (c->version <= at || (ws && c->version <= ws->sent)) continue;
        if (sync_send_on_base(b, w, c->sync_id, c->sync) != 0 && w->route.routable)
            catch_up_not_sent(b, w, c->component, c->version, errno);
    }
}

static void promote(brk_t *b, brk_barrier_t *s, const char *by);
static void add_member(brk_t *b, brk_barrier_t *s, brk_worker_t *w, uint64_t sync_id, const msg_sync_t *sync);
static brk_member_t *member(brk_barrier_t *s, const char *worker);
static void member_failed(brk_t *b, brk_barrier_t *s, brk_member_t *mb, const char *reason);
static bool runs_already(const brk_t *b, const brk_barrier_t *s, const brk_worker_t *w);
static void settle_barriers(brk_t *b);
static void undelivered(brk_worker_t *w, const brk_barrier_t *s, brk_member_t *mb, const char *when);
static void not_sent(brk_t *b, brk_barrier_t *s, brk_member_t *mb, brk_worker_t *w, int e, const char *when);

/* A LoRA adapter's base in the catalog, and the config of one sent by
 * upload (its SYNC is made again from them after a restart). */
static void record_base(brk_t *b, const msg_sync_t *s) {
    if (s->base_version)
        brk_cq_weight_base(b->cat, s->component, s->version, s->base_version, s->uploaded ? s->lora_config : NULL);
}

/* Worker w registered: it joins every held barrier (a resend of an
 * interrupted sync waiting for workers), and a version of an interrupted
 * sync it runs becomes current again, applied by it. */
static void rejoin_interrupted(brk_t *b, brk_worker_t *w) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        /* pending (its own SYNC), or a resend of the current version */
        const brk_current_t *c = s->sync ? NULL : find_current(b, s->component);
        const msg_sync_t *sync = s->sync ? s->sync : c && c->version == s->version ? c->sync : NULL;
        if (!s->hold || !sync || member(s, w->route.name)) continue;
        brk_member_t *m = realloc(s->m, (size_t)(s->n + 1) * sizeof *m);
        if (!m) {
            brk_log("sync %s v%llu: out of memory: worker %s not added", s->component,
                    (unsigned long long)s->version, w->route.name);
            continue;
        }
        s->m = m;
        add_member(b, s, w, s->sync_id, sync);
        if (s->sync && s->m[s->n - 1].state == M_APPLIED) promote(b, s, w->route.name);
    }
    for (int i = 0; i < b->n_interrupted;) {
        brk_interrupted_t *e = &b->interrupted[i];
        uint64_t cv = brk_current_version(b, e->component);
        if (e->version <= cv) { /* current (a held barrier promoted it) or older: settled */
            b->interrupted[i] = b->interrupted[--b->n_interrupted];
            continue;
        }
        if (brk_peer_version(&w->route, e->component) != e->version || barrier_of(b, e->component, e->version)) {
            i++;
            continue;
        }
        /* Applied, and the ack lost with the previous broker: current again. */
        if (brk_sync_restore(b, e->component, e->version, e->sha256, e->source, e->base_version, e->lora_config) != 0) {
            brk_log("cannot make %s v%llu current again: %s", e->component, (unsigned long long)e->version,
                    reel_err_text());
            i++;
            continue;
        }
        char why[256];
        if (e->timed_out)
            snprintf(why, sizeof why, "applied by %s after its sync ran out of time (it had failed)", w->route.name);
        else
            snprintf(why, sizeof why, "applied by %s, sent by the broker before a restart", w->route.name);
        brk_cq_worker_version(b->cat, w->route.name, e->component, e->version, true, NULL);
        brk_cq_weight_state(b->cat, e->component, e->version, "current", why);
        brk_log("%s v%llu is current again: %s", e->component, (unsigned long long)e->version, why);
        brk_upload_prune(b, e->component, e->version, brk_current_base(b, e->component));
        for (int k = 0; k < b->n_w; k++)
            if (!b->w[k]->dead && b->w[k] != w) brk_catch_up(b, b->w[k]);
        b->interrupted[i] = b->interrupted[--b->n_interrupted];
    }
    settle_barriers(b);
}

/* Whether a SYNC of s's version or a newer one went to w (on this
 * session) and its ack has not come: its ok acks s too. */
static bool ws_covers(const brk_worker_t *w, const brk_barrier_t *s) {
    const brk_wsync_t *ws = wsync_of(w, s->component);
    return ws && ws->waiting && ws->sent >= s->version;
}

/* Worker w registered again (all: a worker drops a SYNC whose broker
 * session ended before it applied it, and the broker may have failed that
 * sync, so each barrier still waiting for it sends it again on this
 * session), or speaks again after sends to it failed (all false: only the
 * SYNCs that never reached it). One the worker runs already is answered
 * at once. A barrier of a version no longer current (a newer one is) has
 * no SYNC of its own to send: the newer one the catch-up sends covers it
 * (its ok acks every older barrier), and deliveries_noted says whether it
 * went. A send that fails again leaves the member waiting, undelivered,
 * when w is unreachable (transport); any other failure fails it (not_sent). */
static void resend_waiting(brk_t *b, brk_worker_t *w, bool all) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        brk_member_t *mb = member(s, w->route.name);
        if (!mb || mb->state != M_WAITING || (!all && !mb->undelivered)) continue;
        const brk_current_t *c = s->sync ? NULL : find_current(b, s->component);
        const msg_sync_t *sync = s->sync ? s->sync : c && c->version == s->version ? c->sync : NULL;
        if (runs_already(b, s, w)) {
            mb->state = M_APPLIED;
            mb->undelivered = false;
            if (s->sync) promote(b, s, w->route.name);
        } else if (!sync) {
            mb->undelivered = true; /* until the catch-up's newer SYNC goes (deliveries_noted) */
        } else if (ws_covers(w, s)) {
            mb->undelivered = false; /* a newer SYNC sent just before covers it: its ok acks this one */
        } else if (sync_send_on_base(b, w, s->sync_id, sync) != 0) {
            /* (an adapter's base first: it may have missed the base's catch-up while away) */
            not_sent(b, s, mb, w, errno, all ? "after it registered again" : "after it spoke again");
        } else {
            mb->undelivered = false;
            brk_log_limited(&w->log, w->route.name, "sync %s v%llu sent again to %s: it %s before answering",
                            s->component, (unsigned long long)s->version, w->route.name,
                            all ? "registered again" : "was unreachable when the sync was sent");
        }
    }
}

/* After w was caught up: a member of w waiting undelivered on a barrier
 * whose version (or a newer one) has since been sent to w awaits that
 * SYNC's ack now. */
static void deliveries_noted(brk_t *b, brk_worker_t *w) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        brk_member_t *mb = member(s, w->route.name);
        if (mb && mb->state == M_WAITING && mb->undelivered && ws_covers(w, s)) mb->undelivered = false;
    }
}

void brk_sync_joined(brk_t *b, brk_worker_t *w) {
    for (int i = 0; i < w->route.n_versions; i++) {
        brk_wsync_t *ws = worker_sync(w, w->route.versions[i].name, true);
        if (ws) {
            ws->sent = w->route.versions[i].version;
            ws->sent_id = 0;
            note_sent(ws, ws->sent);
        }
    }
    resend_waiting(b, w, true);
    rejoin_interrupted(b, w);
    brk_catch_up(b, w);
    deliveries_noted(b, w);
    settle_barriers(b); /* (the catch-up may have failed a member) */
}

void brk_sync_reachable(brk_t *b, brk_worker_t *w) {
    resend_waiting(b, w, false);
    brk_catch_up(b, w);
    deliveries_noted(b, w);
    settle_barriers(b); /* (one it runs already may have ended) */
}

const char *brk_sync_lag(const brk_t *b, const brk_worker_t *w, const char *component, char *buf,
                         size_t len) {
    uint64_t cv = brk_current_version(b, component);
    if (!cv || brk_peer_version(&w->route, component) >= cv) return NULL;
    const brk_wsync_t *ws = wsync_of(w, component);
    if (ws && ws->waiting && ws->sent >= cv)
        snprintf(buf, len, "applying v%llu", (unsigned long long)cv);
    else if (ws && ws->why[0] && ws->failed >= cv)
        snprintf(buf, len, "v%llu: %s", (unsigned long long)ws->failed, ws->why);
    else if (!w->route.routable)
        snprintf(buf, len, "v%llu not sent: unreachable", (unsigned long long)cv);
    else
        snprintf(buf, len, "v%llu not sent yet", (unsigned long long)cv);
    return buf;
}

static int cmp_member(const void *a, const void *b) {
    return strcmp(((const brk_member_t *)a)->worker, ((const brk_member_t *)b)->worker);
}

/* Writes "a,b" (applied) or "a (why), b (why)" (failed) into buf; "-" when
 * there are none. */
static void list_members(const brk_barrier_t *s, int state, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < s->n && n < len; i++) {
        if (s->m[i].state != state) continue;
        if (state == M_APPLIED)
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? "," : "", s->m[i].worker);
        else
            n += (size_t)snprintf(buf + n, len - n, "%s%s (%s)", n ? ", " : "", s->m[i].worker,
                                  s->m[i].reason);
    }
    if (!buf[0]) snprintf(buf, len, "-");
}

/* Sends SYNC_DONE of barrier s to every trainer waiting on it. */
static void send_done(brk_t *b, const brk_barrier_t *s, bool complete) {
    msg_sync_done_t d;
    memset(&d, 0, sizeof d);
    char(*applied)[MSG_NAME_MAX] = calloc((size_t)(s->n ? s->n : 1), sizeof *applied);
    msg_failure_t *failed = calloc((size_t)(s->n ? s->n : 1), sizeof *failed);
    for (int i = 0; applied && failed && i < s->n; i++) {
        if (s->m[i].state == M_APPLIED) {
            snprintf(applied[d.n_applied++], MSG_NAME_MAX, "%s", s->m[i].worker);
        } else {
            msg_failure_t *f = &failed[d.n_failed++];
            snprintf(f->worker, sizeof f->worker, "%s", s->m[i].worker);
            snprintf(f->reason, sizeof f->reason, "%s", s->m[i].reason);
        }
    }
    snprintf(d.component, sizeof d.component, "%s", s->component);
    d.version = s->version;
    d.applied = applied;
    d.failed = failed;
    d.complete = complete;
    /* "current" tells the trainer whether its version took effect at all
     * (it is this version, or a newer one, once some worker applied it). */
    d.current = brk_current_version(b, s->component);
    for (int t = 0; t < s->n_trainers; t++) {
        const brk_trainer_t *to = &s->trainers[t];
        if (applied && failed && brk_client_send_ident(b, &to->ident, MSG_SYNC_DONE, to->id, &d) == 0) continue;
        if (s->resend_only) /* (a trainer that resends in a loop and never reads: one each) */
            brk_log_limited(&b->resend_log, BRK_SYNC_RESENDS, "sync %s v%llu: SYNC_DONE not delivered", s->component,
                            (unsigned long long)s->version);
        else
            brk_log("sync %s v%llu: SYNC_DONE not delivered", s->component, (unsigned long long)s->version);
    }
    free(applied);
    free(failed);
}

/* A failed barrier s with members that ran out of time (no ack within the
 * deadline): they still hold its SYNC and may apply it later (a drain
 * longer than the deadline, a slow read). Kept as a version a worker may
 * still run, as a restart's interrupted ones are: its late ok makes it
 * current (rejoin_interrupted), so the cluster never serves a version its
 * broker does not know. */
static void keep_timed_out(brk_t *b, const brk_barrier_t *s) {
    bool late = false;
    for (int i = 0; i < s->n && !late; i++) late = s->m[i].state == M_FAILED && !strcmp(s->m[i].reason, "timeout");
    if (!late || !s->sync || s->sync->n_tensors > 0 || interrupted_at(b, s->component, s->version) >= 0) return;
    if (b->n_interrupted == BRK_MAX_INTERRUPTED) { /* the oldest goes */
        memmove(b->interrupted, b->interrupted + 1, (BRK_MAX_INTERRUPTED - 1) * sizeof *b->interrupted);
        b->n_interrupted--;
    }
    brk_interrupted_t *e = &b->interrupted[b->n_interrupted++];
    memset(e, 0, sizeof *e);
    snprintf(e->component, sizeof e->component, "%s", s->component);
    e->version = s->version;
    snprintf(e->sha256, sizeof e->sha256, "%s", s->sha256);
    snprintf(e->source, sizeof e->source, "%s", s->sync->uploaded ? BRK_SOURCE_UPLOADED : s->sync->path);
    e->base_version = s->sync->base_version;
    if (s->sync->uploaded) snprintf(e->lora_config, sizeof e->lora_config, "%s", s->sync->lora_config);
    e->timed_out = true;
}

/* Settles the catalog state of a version that never became current,
 * answers every trainer, and frees s (already unlinked). */
static void finish(brk_t *b, brk_barrier_t *s) {
    int failed = 0, applied = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->m[i].state == M_APPLIED) applied++;
        else failed++;
    }
    char a[2048], f[4096];
    list_members(s, M_APPLIED, a, sizeof a);
    list_members(s, M_FAILED, f, sizeof f);
    uint64_t cur = brk_current_version(b, s->component);
    if (s->sync) {
        /* Still pending: no worker applied it before a newer version became
         * current (superseded), or none applied it at all (failed). */
        char reason[4200];
        if (applied)
            snprintf(reason, sizeof reason, "applied after v%llu became current", (unsigned long long)cur);
        else if (s->n == 0)
            snprintf(reason, sizeof reason, "no live worker");
        else
            snprintf(reason, sizeof reason, "no worker applied it: %s", f);
        brk_cq_weight_state(b->cat, s->component, s->version, applied ? "superseded" : "failed", reason);
        if (!applied)
            brk_log("sync %s v%llu failed, nothing changed (%s stays v%llu): %s", s->component,
                    (unsigned long long)s->version, s->component, (unsigned long long)cur, reason);
        if (!applied) keep_timed_out(b, s);
    }
    resends_end(b, &s->resent, s->component, s->version, s->sha256, s->sync, "its barrier ran");
    free_sync(&s->sync);
    /* With no live worker nothing was applied: not complete (a trainer
     * waiting on the barrier must not take silence for success). */
    bool complete = failed == 0 && s->n > 0;
    send_done(b, s, complete);
    brk_metrics_sync(&b->metrics, complete, applied > 0, (double)(brk_now_ms() - s->accepted_ms) / 1000.0);
    const char *how = complete ? "complete" : applied ? "incomplete" : "failed";
    if (s->resend_only)
        brk_log_limited(&b->resend_log, BRK_SYNC_RESENDS, "sync %s v%llu %s (applied %s; failed %s)", s->component,
                        (unsigned long long)s->version, how, a, f);
    else
        brk_log("sync %s v%llu %s (applied %s; failed %s)", s->component, (unsigned long long)s->version, how, a, f);
    free(s->trainers);
    free(s->m);
    free(s);
}

/* When the workers of a restart (or of a takeover) have all had time to
 * register: two worker liveness periods after this broker started or
 * became active (each notices and registers within one). */
static int64_t rejoin_end(const brk_t *b) {
    return b->active_ms + 2 * (int64_t)b->opt.heartbeat_ms * b->opt.liveness;
}

/* Finishes every barrier nobody is waiting on any more. */
static void settle_barriers(brk_t *b) {
    int64_t now = brk_now_ms();
    for (brk_barrier_t **p = &b->barriers; *p;) {
        brk_barrier_t *s = *p;
        bool waiting = false, live = false;
        for (int i = 0; i < s->n && !waiting; i++) {
            waiting = s->m[i].state == M_WAITING;
            live = live || s->m[i].state == M_APPLIED;
        }
        /* held for workers to register while none has applied it or waits on
         * it (one that registered and was lost does not end the hold), and
         * in any case until the restart's workers have all had time to
         * register: the first to come back must not end it for the rest */
        waiting = waiting || (s->hold && (!live || now < rejoin_end(b)));
        if (waiting) {
            p = &s->next;
        } else {
            *p = s->next;
            finish(b, s);
        }
    }
}

/* cur's sync is about to be replaced by next: the full SYNC an adapter
 * is on is kept as cur->base (the one replaced, when next is an adapter
 * on it; the one kept already, when next is another adapter on the same
 * base); every other SYNC is freed. */
static void keep_base(brk_current_t *cur, const msg_sync_t *next) {
    msg_sync_t *old = cur->sync;
    cur->sync = NULL;
    uint64_t on = next ? next->base_version : 0;
    if (on && old && !old->base_version && old->version == on) {
        free_sync(&cur->base);
        cur->base = old;
        cur->base_id = cur->sync_id;
        return;
    }
    free_sync(&old);
    if (!on || !cur->base || cur->base->version != on) free_sync(&cur->base);
}

/* A worker applied pending barrier s's version: it becomes the component's
 * current one, unless a newer one already is. */
static void promote(brk_t *b, brk_barrier_t *s, const char *by) {
    brk_current_t *cur = s->sync ? current_slot(b, s->component) : NULL;
    if (!cur || s->version <= cur->version) return;
    current_ends(b, cur);
    keep_base(cur, s->sync);
    cur->sync = s->sync;
    s->sync = NULL;
    cur->version = s->version;
    snprintf(cur->sha256, sizeof cur->sha256, "%s", s->sha256);
    cur->sync_id = s->sync_id;
    brk_cq_weight_state(b->cat, s->component, s->version, "current", NULL);
    brk_log("%s v%llu is current (applied by %s)", s->component, (unsigned long long)s->version, by);
    brk_upload_prune(b, s->component, s->version, brk_current_base(b, s->component));
    /* Workers that joined while it was pending are sent it now. */
    for (int i = 0; i < b->n_w; i++)
        if (!b->w[i]->dead) brk_catch_up(b, b->w[i]);
}

/* A barrier for (component, version) answering trainer `id` at `from`,
 * with room for every registered worker. NULL on out-of-memory. */
static brk_barrier_t *barrier_new(brk_t *b, const char *component, uint64_t version, const char *sha256,
                                  const zmq_msg_t *from, uint64_t id, uint64_t deadline) {
    brk_barrier_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->trainers = calloc(1, sizeof *s->trainers);
    s->m = calloc((size_t)(b->n_w ? b->n_w : 1), sizeof *s->m);
    if (!s->trainers || !s->m) {
        free(s->trainers);
        free(s->m);
        free(s);
        return NULL;
    }
    snprintf(s->component, sizeof s->component, "%s", component);
    s->version = version;
    snprintf(s->sha256, sizeof s->sha256, "%s", sha256);
    brk_ident_from(&s->trainers[0].ident, from);
    s->trainers[0].id = id;
    s->n_trainers = 1;
    uint64_t dl = deadline ? deadline : b->opt.sync_deadline_ms;
    s->wait_ms = (int64_t)(dl > BRK_SYNC_DEADLINE_MAX_MS ? BRK_SYNC_DEADLINE_MAX_MS : dl);
    s->accepted_ms = brk_now_ms();
    s->deadline_ms = brk_now_ms() + s->wait_ms;
    return s;
}

/* Whether a worker that reports s's version runs s's weights as far as
 * this broker knows: the version is the current one, or one a restart
 * interrupted, under the same sha256. Otherwise its number may name other
 * weights (the ones it started with: `--weights-version`, 1 by default,
 * or a version this broker failed) and only the worker can tell. */
static bool version_known(const brk_t *b, const brk_barrier_t *s) {
    const brk_current_t *c = find_current(b, s->component);
    if (c && c->version == s->version && !strcasecmp(c->sha256, s->sha256)) return true;
    int k = interrupted_at(b, s->component, s->version);
    return k >= 0 && !strcasecmp(b->interrupted[k].sha256, s->sha256);
}

/* Whether w runs s's version already: a newer one, or this one as known. */
static bool runs_already(const brk_t *b, const brk_barrier_t *s, const brk_worker_t *w) {
    uint64_t v = brk_peer_version(&w->route, s->component);
    return v > s->version || (v == s->version && version_known(b, s));
}

/* Adds w to s: applied when it runs the version already, else waiting for
 * the ack of a SYNC sent now (msg), or of one already on its way (a retry
 * does not make it load the file twice); waiting undelivered when w is
 * unreachable (sent again when w registers or speaks again); failed when
 * the send fails otherwise (not_sent).
 * A worker at the very version the broker cannot vouch for is sent the
 * SYNC: READY carries no sha256, and only the worker can tell whether it
 * runs these weights (ok, at once, nothing read) or other weights under
 * that number (stale). */
static void add_member(brk_t *b, brk_barrier_t *s, brk_worker_t *w, uint64_t sync_id,
                       const msg_sync_t *sync) {
    brk_member_t *mb = &s->m[s->n++];
    snprintf(mb->worker, sizeof mb->worker, "%s", w->route.name);
    const brk_wsync_t *ws = wsync_of(w, s->component);
    if (runs_already(b, s, w)) {
        mb->state = M_APPLIED;
    } else if (ws && ws->waiting && ws->sent >= s->version) {
        mb->state = M_WAITING;
    } else if (sync_send(b, w, sync_id, sync) == 0) {
        mb->state = M_WAITING;
    } else {
        mb->state = M_WAITING;
        not_sent(b, s, mb, w, errno, "when the sync began");
    }
}

/* mb's SYNC could not be sent `when`: it waits for the worker to come back
 * (resend_waiting) rather than failing now: a worker between two broker
 * sessions (its connection gone while it registers again) did not refuse
 * anything. The deadline, or the worker's loss, ends the wait. */
static void undelivered(brk_worker_t *w, const brk_barrier_t *s, brk_member_t *mb, const char *when) {
    mb->undelivered = true;
    /* (within w's share: each time it speaks while its queue stays full) */
    brk_log_limited(&w->log, w->route.name,
                    "sync %s v%llu: SYNC not delivered to %s %s (unreachable): waiting for it to register or speak "
                    "again, until the deadline", s->component, (unsigned long long)s->version, mb->worker, when);
}

/* Writes the reason of a member whose SYNC could not be sent for errno e. */
static void not_sent_reason(char *buf, size_t len, int e) {
    snprintf(buf, len, "SYNC could not be sent: %s", zmq_strerror(e));
}

/* Waiting member mb of w could not be sent s's SYNC `when` (errno e): a
 * transport failure (w unreachable: its connection gone or its queue
 * full, brk_worker_send) waits undelivered; any other (the codec refused
 * the message, out of memory) fails mb now with e's reason. w stays
 * routable then, so nothing would send it again, and failing it only at
 * the deadline, "not delivered: the worker did not register again",
 * would name the wrong cause. The caller settles the barrier. */
static void not_sent(brk_t *b, brk_barrier_t *s, brk_member_t *mb, brk_worker_t *w, int e, const char *when) {
    if (!w->route.routable) {
        undelivered(w, s, mb, when);
        return;
    }
    char why[MSG_REASON_MAX];
    not_sent_reason(why, sizeof why, e);
    brk_log("sync %s v%llu: SYNC could not be sent to %s %s (%s): failed, not waited for", s->component,
            (unsigned long long)s->version, mb->worker, when, zmq_strerror(e));
    member_failed(b, s, mb, why);
}

/* brk_catch_up could not send w component's `version` (or its base) for
 * errno e, w still routable: the members of w waiting undelivered on a
 * barrier of that version or an older one (whose own SYNC is gone: the
 * catch-up's was to cover them, deliveries_noted) fail as not_sent's.
 * The caller settles the barriers. */
static void catch_up_not_sent(brk_t *b, const brk_worker_t *w, const char *component, uint64_t version, int e) {
    char why[MSG_REASON_MAX];
    not_sent_reason(why, sizeof why, e);
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        if (s->version > version || strcmp(s->component, component)) continue;
        brk_member_t *mb = member(s, w->route.name);
        if (!mb || mb->state != M_WAITING || !mb->undelivered) continue;
        brk_log("sync %s v%llu: the catch-up's SYNC (v%llu) could not be sent to %s (%s): failed, not waited for",
                s->component, (unsigned long long)s->version, (unsigned long long)version, mb->worker,
                zmq_strerror(e));
        member_failed(b, s, mb, why);
    }
}

/* Where workers may not have registered (again) yet: the resend
 * of a sync a broker restart interrupted (held to its deadline), or any
 * SYNC in this broker's first moments as active, after its start or a
 * takeover (held for two worker liveness periods: a restart's workers
 * notice and register within one). Workers that register join it
 * (rejoin_interrupted). */
static void maybe_hold(brk_t *b, brk_barrier_t *s) {
    int64_t end = rejoin_end(b), now = brk_now_ms();
    int k = s->sync ? interrupted_at(b, s->component, s->version) : -1;
    if (k >= 0 && !b->interrupted[k].timed_out) {
        s->hold = true;
        s->hold_until_ms = s->deadline_ms;
        brk_log("sync %s v%llu was interrupted by a broker restart: held for workers to register (up to %lld ms)",
                s->component, (unsigned long long)s->version, (long long)s->wait_ms);
    } else if (now < end) {
        /* workers may still be on their way (all of them, or the rest) */
        s->hold = true;
        s->hold_until_ms = end < s->deadline_ms ? end : s->deadline_ms;
        brk_log("sync %s v%llu: %d worker(s) registered %lld ms after the broker started or took over: held for "
                "workers to register (up to %lld ms)", s->component, (unsigned long long)s->version, s->n,
                (long long)(now - b->active_ms), (long long)(s->hold_until_ms - now));
    }
}

/* The trainer repeats a SYNC the broker has (same version and sha256):
 * the running barrier answers it too, or, for the current version, a new
 * barrier retries every worker that lags. */
static void on_resend(brk_t *b, const zmq_msg_t *from, uint64_t id, brk_barrier_t *running, brk_current_t *cur,
                      uint64_t deadline) {
    if (running) {
        brk_ident_t who;
        brk_ident_from(&who, from);
        for (int k = 0; k < running->n_trainers; k++)
            if (running->trainers[k].id == id && brk_ident_eq(&running->trainers[k].ident, &who))
                return; /* the same SYNC again: its one answer comes with the barrier's */
        if (running->n_trainers >= BRK_SYNC_TRAINERS_MAX) {
            brk_error_to(b, false, from, id, WIRE_E_BUSY, "SYNC: %d resends of %s v%llu already wait for its "
                         "barrier, the most it answers: ask again once it ends", BRK_SYNC_TRAINERS_MAX,
                         running->component, (unsigned long long)running->version);
            return;
        }
        brk_trainer_t *t = realloc(running->trainers, (size_t)(running->n_trainers + 1) * sizeof *t);
        if (!t) {
            brk_error_to(b, false, from, id, WIRE_E_INTERNAL, "broker out of memory");
            return;
        }
        running->trainers = t;
        t[running->n_trainers].ident = who;
        t[running->n_trainers++].id = id;
        brk_log_limited(&b->resend_log, BRK_SYNC_RESENDS, "sync %s v%llu resent while its barrier runs: answered "
                        "with it", running->component, (unsigned long long)running->version);
        return;
    }
    brk_barrier_t *s = barrier_new(b, cur->component, cur->version, cur->sha256, from, id, deadline);
    if (!s) {
        brk_error_to(b, false, from, id, WIRE_E_INTERNAL, "broker out of memory");
        return;
    }
    s->sync_id = cur->sync_id;
    int retried = 0;
    for (int i = 0; i < b->n_w; i++) {
        if (b->w[i]->dead) continue;
        add_member(b, s, b->w[i], cur->sync_id, cur->sync);
        retried += s->m[s->n - 1].state != M_APPLIED;
    }
    if (s->n > 1) qsort(s->m, (size_t)s->n, sizeof *s->m, cmp_member);
    s->next = b->barriers;
    b->barriers = s;
    brk_log_limited(&b->resend_log, BRK_SYNC_RESENDS, "sync %s v%llu resent (current): %d lagging worker%s retried",
                    s->component, (unsigned long long)s->version, retried, retried == 1 ? "" : "s");
    maybe_hold(b, s);
    /* Nobody lags: it ends at once, complete, and a trainer that resends
     * in a loop gets a SYNC_DONE each (the protocol), but its lines come
     * out of the resends' budget. */
    s->resend_only = retried == 0 && !s->hold;
    settle_barriers(b);
}

/* Whether SYNC m can be accepted: 0, or -1 with why as the thread's error
 * value: REEL_E_STATE when it is not newer than the version current or
 * pending (answered stale_version), another code when it is refused
 * bad_request (one that maps to it: wire_err_code_of). *running / *cur
 * receive the barrier or current version it repeats, *resend whether it
 * is a resend (same version and sha256). */
static int refusal(brk_t *b, const msg_sync_t *m, brk_barrier_t **running, brk_current_t **cur, bool *resend) {
    const char *comp = m->component;
    uint64_t version = m->version, cv = brk_current_version(b, comp), pv = newest_pending(b, comp);
    const char *known_sha = NULL;
    *running = barrier_of(b, comp, version);
    *cur = NULL;
    if (*running) known_sha = (*running)->sha256;
    else if (version && version == cv) known_sha = (*cur = current_slot(b, comp))->sha256;
    /* sha256 compares either case: it names the same bytes. */
    *resend = known_sha && !strcasecmp(m->sha256, known_sha);
    uint64_t floor = cv > pv ? cv : pv;
    if (!brk_component_served(comp)) return -1; /* unsupported */
    if (!*resend && version <= floor) {
        if (known_sha)
            return reel_fail(REEL_E_STATE, "%s v%llu is %s with other weights (sha256 %.16s...)", comp,
                             (unsigned long long)version, *running && (*running)->sync ? "pending" : "current",
                             known_sha);
        if (pv > cv && version <= pv)
            return reel_fail(REEL_E_STATE, "%s version %llu is not newer than v%llu, still pending", comp,
                             (unsigned long long)version, (unsigned long long)pv);
        return reel_fail(REEL_E_STATE, "%s version %llu is not newer than the current version %llu", comp,
                         (unsigned long long)version, (unsigned long long)cv);
    }
    /* Weights by value: the broker must hold that file (brk_upload.h; its
     * reasons are unsupported, not_found or invalid: bad_request). */
    if (!*resend && m->uploaded && !brk_upload_held(b, comp, version, m->sha256)) return -1;
    /* The slot is taken now so that promotion can not fail later. Over a
     * bound, but answered bad_request as always (not too_large): the
     * trainer can do nothing but name a component already known. */
    if (!*resend && !current_slot(b, comp))
        return reel_fail(REEL_E_UNSUPPORTED, "more than %d weight components", BRK_MAX_COMPONENTS);
    return 0;
}

void brk_sync_request(brk_t *b, const zmq_msg_t *from, uint64_t id, const msg_sync_t *m) {
    char outcome[600];
    brk_barrier_t *running;
    brk_current_t *cur;
    bool resend;
    brk_who_t who; /* the loop admitted it: its key is allowed */
    brk_zap_sender(b->zap, &who);
    if (refusal(b, m, &running, &cur, &resend) != 0) {
        const reel_err_t e = *reel_err(); /* a copy: the audit may fail on its own */
        /* stale_version has no library code of its own: the one code
         * refusal gives only for it (REEL_E_STATE) is answered so here */
        const char *code = e.code == REEL_E_STATE ? WIRE_E_STALE : wire_err_code_of(e.code);
        /* logged, audited and answered within the peer's budget for
         * answers to bad messages (as a forbidden SYNC is: brk_zap.c);
         * past it only counted (replies_suppressed): a trainer key that
         * repeats a refused SYNC wrote a line and a kept row for each */
        if (!brk_reply_allowed(b, from)) return;
        brk_log_kind(&b->refused_log, "SYNC refused", "SYNC refused: %s", e.msg);
        snprintf(outcome, sizeof outcome, "refused: %s: %s", code, e.msg);
        brk_zap_audit(b, &who, "sync", m, outcome);
        brk_error_to(b, false, from, id, code, "SYNC: %s", e.msg);
        return;
    }
    if (!resend) {
        brk_zap_audit(b, &who, "sync", m, "accepted");
    } else {
        /* A trainer resends a SYNC until it is answered (or in a loop):
         * each key's first resend of the version is audited, the rest
         * counted (brk_resends_t), while it is current on the component,
         * else on its barrier (refusal found one). */
        brk_current_t *c = (brk_current_t *)find_current(b, m->component);
        if (resend_first(c && c->version == m->version ? &c->resent : &running->resent, &who))
            brk_zap_audit(b, &who, "sync", m, "resend");
    }
    if (resend) {
        on_resend(b, from, id, running, cur, m->deadline_ms);
        return;
    }
    brk_barrier_t *s = barrier_new(b, m->component, m->version, m->sha256, from, id, m->deadline_ms);
    msg_sync_t *kept = s ? malloc(sizeof *kept) : NULL;
    if (!kept) {
        if (s) {
            free(s->trainers);
            free(s->m);
            free(s);
        }
        brk_error_to(b, false, from, id, WIRE_E_INTERNAL, "broker out of memory");
        return;
    }
    *kept = *m;
    kept->n_tensors = 0; /* syncs go by path: the loop refused inline tensors */
    /* A file still coming: the deadline counts from its last chunk (the
     * workers wait for it; the upload's time is the trainer's). */
    if (m->uploaded && !brk_upload_stored(b, m->component, m->version, m->sha256))
        s->deadline_ms = INT64_MAX;
    /* Its source in the catalog: the path, or "uploaded" (restored as such). */
    brk_cq_weight_version(b->cat, m->component, m->version, m->sha256, m->uploaded ? BRK_SOURCE_UPLOADED : m->path);
    record_base(b, m);
    s->sync = kept;
    s->sync_id = b->next_id++;
    s->next = b->barriers;
    b->barriers = s;
    brk_log("sync %s v%llu accepted (%s), pending until a worker applies it", s->component,
            (unsigned long long)s->version, m->uploaded ? "uploaded to the broker" : m->path);
    const char *first = NULL;
    for (int i = 0; i < b->n_w; i++) {
        if (b->w[i]->dead) continue;
        add_member(b, s, b->w[i], s->sync_id, s->sync);
        if (s->m[s->n - 1].state == M_APPLIED && !first) first = b->w[i]->route.name;
    }
    if (s->n > 1) qsort(s->m, (size_t)s->n, sizeof *s->m, cmp_member);
    maybe_hold(b, s);
    /* a worker that already runs this version (it said so at READY) applied it */
    if (first) promote(b, s, first);
    settle_barriers(b);
}

static brk_member_t *member(brk_barrier_t *s, const char *worker) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->m[i].worker, worker)) return &s->m[i];
    return NULL;
}

void brk_sync_ack(brk_t *b, brk_worker_t *w, uint64_t id, const msg_sync_ack_t *a) {
    const char *comp = a->component, *err = a->error[0] ? a->error : "failed";
    uint64_t version = a->version;
    bool ok = a->ok;
    brk_wsync_t *ws = worker_sync(w, comp, true);
    /* The ack of an interrupted sync (sent by the broker before a restart,
     * applied after this worker registered here at the version before): it
     * was sent, by that broker; taken, and the version made current again
     * below (rejoin_interrupted). */
    bool late = ok && ws && !was_sent(ws, version) && interrupted_at(b, comp, version) >= 0;
    if (late) {
        brk_log("worker %s applied %s v%llu, sent by the broker before a restart", w->route.name, comp,
                (unsigned long long)version);
        if (version > ws->sent) {
            ws->sent = version;
            ws->sent_id = 0;
        }
        note_sent(ws, version);
    }
    /* A worker applies only what it was sent: an ack of a version it never
     * got (2^63-1, say) would make it eligible for every request; one older
     * than the last it was sent, but never sent (v3 when v5 was), would
     * record it at that version. */
    if (!ws || !was_sent(ws, version)) {
        BRK_WORKER_REFUSED(b, w, "worker %s acked %s v%llu, which it was never sent: ignored", w->route.name, comp,
                           (unsigned long long)version);
        return;
    }
    /* The answer to an earlier SYNC of this version (sent by this broker
     * before, or by the one before a restart, whose fetch then failed with
     * it) is not the answer to the last: that one comes in turn. An ack
     * without an id (0) is taken as it is. */
    if (id && ws->sent_id && version == ws->sent && id != ws->sent_id) {
        brk_log_limited(&w->log, w->route.name,
                "worker %s answered an earlier SYNC of %s v%llu (id %llu, the last is %llu): %s, ignored", w->route.name, comp, (unsigned long long)version, (unsigned long long)id,
                (unsigned long long)ws->sent_id, ok ? "applied" : err);
        return;
    }
    /* An ack that changes nothing (of the version w is recorded at, or
     * newer, or of the one it failed already) is a repeat: its line comes
     * out of w's share (a worker that acked in a loop wrote one each). */
    const bool again = ok ? version <= brk_peer_version(&w->route, comp) : ws->failed == version;
    brk_cq_worker_version(b->cat, w->route.name, comp, version, ok, ok ? NULL : err);
    if (ok && a->adapter[0]) brk_cq_weight_adapter(b->cat, comp, version, a->adapter);
    if (ws && version >= ws->sent) ws->waiting = false;
    if (ok) {
        if (version > brk_peer_version(&w->route, comp) &&
            brk_peer_set_version(&w->route, comp, version) < 0)
            brk_log("worker %s: more than %d components, %s not tracked", w->route.name,
                    BRK_MAX_COMPONENTS, comp);
        if (ws && version >= ws->failed) {
            ws->failed = 0;
            ws->why[0] = '\0';
        }
        if (again)
            brk_log_limited(&w->log, w->route.name, "worker %s applied %s v%llu", w->route.name, comp,
                            (unsigned long long)version);
        else
            brk_log("worker %s applied %s v%llu", w->route.name, comp, (unsigned long long)version);
    } else {
        if (ws && version > brk_peer_version(&w->route, comp)) {
            ws->failed = version;
            snprintf(ws->why, sizeof ws->why, "%.127s", err);
        }
        if (again)
            brk_log_limited(&w->log, w->route.name, "worker %s failed %s v%llu: %s", w->route.name, comp,
                            (unsigned long long)version, err);
        else
            brk_log("worker %s failed %s v%llu: %s", w->route.name, comp, (unsigned long long)version, err);
    }
    brk_barrier_t *mine = NULL;
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        if (strcmp(s->component, comp)) continue;
        if (s->version == version) mine = s;
        brk_member_t *mb = member(s, w->route.name);
        if (!mb || mb->state != M_WAITING) continue;
        if (ok && version >= s->version) {
            mb->state = M_APPLIED;
            mb->undelivered = false;
        } else if (!ok && version == s->version) {
            mb->state = M_FAILED;
            mb->undelivered = false;
            snprintf(mb->reason, sizeof mb->reason, "%s", err);
        }
    }
    if (ok && mine) promote(b, mine, w->route.name);
    /* a restart's interrupted sync, or one this broker failed on its
     * deadline, that this worker applied after all: current now */
    if (late || (ok && !mine && interrupted_at(b, comp, version) >= 0)) rejoin_interrupted(b, w); /* settles too */
    settle_barriers(b);
}

/* Records that worker `name` did not apply s's version (the catalog keeps
 * the newest outcome per worker and version: a later ack replaces it). */
static void member_failed(brk_t *b, brk_barrier_t *s, brk_member_t *mb, const char *reason) {
    mb->state = M_FAILED;
    mb->undelivered = false;
    snprintf(mb->reason, sizeof mb->reason, "%s", reason);
    brk_cq_worker_version(b->cat, mb->worker, s->component, s->version, false, reason);
}

void brk_sync_worker_lost(brk_t *b, const brk_worker_t *w) {
    /* A worker that registered again (a READY under its live name) is
     * here at once: its barriers keep waiting for it and send it the SYNC
     * again (resend_waiting, from brk_sync_joined). */
    if (w->dead_why && !strcmp(w->dead_why, "restarted")) return;
    char why[MSG_REASON_MAX];
    snprintf(why, sizeof why, "SYNC not delivered: the worker was lost (%s) before it registered again",
             w->dead_why ? w->dead_why : "dropped");
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        brk_member_t *mb = member(s, w->route.name);
        if (mb && mb->state == M_WAITING) member_failed(b, s, mb, mb->undelivered ? why : "worker lost");
    }
    settle_barriers(b);
}

void brk_sync_timers(brk_t *b, int64_t now) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        /* A SYNC that named an upload still coming: its deadline starts
         * when the upload ends (stored, refused or given up). */
        if (s->deadline_ms == INT64_MAX && !(brk_upload_held(b, s->component, s->version, s->sha256) &&
                                             !brk_upload_stored(b, s->component, s->version, s->sha256)))
            s->deadline_ms = now + s->wait_ms;
        if (s->hold && now >= s->hold_until_ms) s->hold = false;
        if (now < s->deadline_ms) continue;
        s->hold = false;
        for (int i = 0; i < s->n; i++) {
            if (s->m[i].state != M_WAITING) continue;
            if (s->m[i].undelivered) { /* never sent: nothing of it can arrive late (keep_timed_out) */
                member_failed(b, s, &s->m[i],
                              "SYNC not delivered: the worker did not register again before the sync's deadline");
                continue;
            }
            member_failed(b, s, &s->m[i], "timeout");
            brk_worker_t *w = brk_worker_named(b, s->m[i].worker);
            brk_wsync_t *ws = w ? worker_sync(w, s->component, false) : NULL;
            /* Its ack may still come; until then a trainer's retry sends it
             * again rather than waiting on it. */
            if (ws && ws->sent <= s->version) {
                ws->waiting = false;
                ws->failed = s->version;
                snprintf(ws->why, sizeof ws->why, "no ack within the sync deadline");
            }
        }
    }
    settle_barriers(b);
}

int64_t brk_sync_next_deadline(const brk_t *b) {
    int64_t t = INT64_MAX;
    for (const brk_barrier_t *s = b->barriers; s; s = s->next) {
        if (s->deadline_ms < t) t = s->deadline_ms;
        if (s->hold && s->hold_until_ms < t) t = s->hold_until_ms;
        /* a held barrier a worker applied settles when the rejoin window ends */
        if (s->hold && brk_now_ms() < rejoin_end(b) && rejoin_end(b) < t) t = rejoin_end(b);
    }
    return t;
}

void brk_sync_shutdown(brk_t *b) {
    /* (its versions stay pending in the catalog: the broker that comes
     * back resumes them, and a trainer's SYNC sent again attaches) */
    brk_sync_give_up(b, WIRE_E_SHUTDOWN, "the broker is shutting down (send the SYNC again to the broker that comes "
                     "back: it resumes the version)");
    for (int i = 0; i < b->n_cur; i++) {
        current_ends(b, &b->cur[i]);
        free_sync(&b->cur[i].sync);
        free_sync(&b->cur[i].base);
    }
}

void brk_sync_give_up(brk_t *b, const char *code, const char *why) {
    while (b->barriers) {
        brk_barrier_t *s = b->barriers;
        b->barriers = s->next;
        for (int t = 0; t < s->n_trainers; t++)
            brk_error_to_ident(b, &s->trainers[t].ident, s->trainers[t].id, code,
                           "%s before sync %s v%llu completed", why, s->component, (unsigned long long)s->version);
        if (s->sync && strcmp(code, WIRE_E_SHUTDOWN)) {
            char reason[300];
            snprintf(reason, sizeof reason, "%s before any worker applied it", why);
            brk_cq_weight_state(b->cat, s->component, s->version, "failed", reason);
        }
        resends_end(b, &s->resent, s->component, s->version, s->sha256, s->sync, "its barrier ran");
        free_sync(&s->sync);
        free(s->trainers);
        free(s->m);
        free(s);
    }
}

int brk_sync_adopt(brk_t *b, const msg_sync_t *s, const char *why) {
    if (s->version <= brk_current_version(b, s->component)) {
        /* the full version this broker's current adapter is on, which
         * it had not seen become current: kept as its base */
        brk_current_t *cur = current_slot(b, s->component);
        if (cur && cur->sync && !cur->base && !s->base_version && cur->sync->base_version == s->version) {
            msg_sync_t *c = malloc(sizeof *c);
            if (!c) return reel_fail(REEL_E_NOMEM, "out of memory");
            *c = *s;
            c->n_tensors = 0;
            memset(c->tensors, 0, sizeof c->tensors);
            c->deadline_ms = 0;
            cur->base = c;
            cur->base_id = b->next_id++;
        }
        return 0;
    }
    brk_current_t *cur = current_slot(b, s->component);
    if (!cur) return reel_fail(REEL_E_LIMIT, "more than %d weight components", BRK_MAX_COMPONENTS);
    msg_sync_t *c = malloc(sizeof *c);
    if (!c) return reel_fail(REEL_E_NOMEM, "out of memory");
    *c = *s;
    c->n_tensors = 0;
    memset(c->tensors, 0, sizeof c->tensors);
    c->deadline_ms = 0;
    current_ends(b, cur);
    keep_base(cur, c);
    cur->sync = c;
    cur->version = s->version;
    snprintf(cur->sha256, sizeof cur->sha256, "%s", s->sha256);
    cur->sync_id = b->next_id++;
    brk_cq_weight_version(b->cat, s->component, s->version, s->sha256, s->uploaded ? BRK_SOURCE_UPLOADED : s->path);
    record_base(b, s);
    brk_cq_weight_state(b->cat, s->component, s->version, "current", why);
    return 1;
}

int brk_sync_restore(brk_t *b, const char *component, uint64_t version, const char *sha256, const char *path,
                     uint64_t base_version, const char *lora_config) {
    brk_current_t *cur = current_slot(b, component);
    if (!cur) return reel_fail(REEL_E_LIMIT, "more than %d weight components", BRK_MAX_COMPONENTS);
    msg_sync_t *s = calloc(1, sizeof *s);
    if (!s) return reel_fail(REEL_E_NOMEM, "out of memory");
    snprintf(s->component, sizeof s->component, "%s", component);
    s->version = version;
    snprintf(s->sha256, sizeof s->sha256, "%s", sha256);
    if (!strcmp(path, BRK_SOURCE_UPLOADED)) s->uploaded = true; /* workers fetch it from the broker again */
    else snprintf(s->path, sizeof s->path, "%s", path);
    s->base_version = base_version; /* a LoRA adapter on its base: its folder, or uploaded with its config */
    if (s->uploaded && lora_config) snprintf(s->lora_config, sizeof s->lora_config, "%s", lora_config);
    current_ends(b, cur);
    keep_base(cur, s);
    cur->sync = s;
    cur->version = version;
    snprintf(cur->sha256, sizeof cur->sha256, "%s", sha256);
    cur->sync_id = b->next_id++;
    return 0;
}

int brk_sync_restore_base(brk_t *b, const char *component, uint64_t version, const char *sha256, const char *path) {
    brk_current_t *cur = current_slot(b, component);
    if (!cur || !cur->sync || cur->sync->base_version != version)
        return reel_fail(REEL_E_STATE, "%s v%llu is not the current adapter's base", component,
                         (unsigned long long)version);
    msg_sync_t *s = calloc(1, sizeof *s);
    if (!s) return reel_fail(REEL_E_NOMEM, "out of memory");
    snprintf(s->component, sizeof s->component, "%s", component);
    s->version = version;
    snprintf(s->sha256, sizeof s->sha256, "%s", sha256);
    if (!strcmp(path, BRK_SOURCE_UPLOADED)) s->uploaded = true;
    else snprintf(s->path, sizeof s->path, "%s", path);
    free_sync(&cur->base);
    cur->base = s;
    cur->base_id = b->next_id++;
    return 0;
}
