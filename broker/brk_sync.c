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
 * (brk_peer_eligible reads the acked version); it still serves requests
 * whose "version" it has; STATUS says why it lags; it is sent the version
 * again when it reconnects (READY) or when the trainer resends the SYNC.
 *
 * Resending the current or a pending version with the same sha256 is an
 * ack, not stale_version, so a trainer can retry after a timeout: a
 * pending one joins the running barrier (same SYNC_DONE); the current one
 * gets a new barrier that retries the lagging workers (complete at once
 * when none lags). The same version with other weights is stale_version. */
#include "broker/brk_broker.h"
#include "kernels/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "broker/brk_log.h"

enum { M_WAITING, M_APPLIED, M_FAILED };

static const brk_current_t *find_current(const brk_t *b, const char *component) {
    for (int i = 0; i < b->n_cur; i++)
        if (!strcmp(b->cur[i].component, component)) return &b->cur[i];
    return NULL;
}

uint64_t brk_current_version(const brk_t *b, const char *component) {
    const brk_current_t *c = find_current(b, component);
    return c ? c->version : 0;
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

static void free_msg(wire_msg_t **mp) {
    if (!*mp) return;
    wire_msg_close(*mp);
    free(*mp);
    *mp = NULL;
}

static brk_barrier_t *barrier_of(brk_t *b, const char *component, uint64_t version) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next)
        if (s->version == version && !strcmp(s->component, component)) return s;
    return NULL;
}

/* The newest version of component still pending (0: none). */
static uint64_t newest_pending(const brk_t *b, const char *component) {
    uint64_t v = 0;
    for (const brk_barrier_t *s = b->barriers; s; s = s->next)
        if (s->msg && s->version > v && !strcmp(s->component, component)) v = s->version;
    return v;
}

static const brk_wsync_t *wsync_of(const brk_worker_t *w, const char *component) {
    for (int i = 0; i < w->n_syncs; i++)
        if (!strcmp(w->syncs[i].component, component)) return &w->syncs[i];
    return NULL;
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

/* SYNC_DONE of barrier s for the trainer's request `id`. NULL on
 * out-of-memory. */
static wire_val_t *done_hdr(const brk_t *b, const brk_barrier_t *s, uint64_t id, bool complete) {
    wire_val_t *h = wire_hdr("SYNC_DONE", id);
    wire_val_t *applied = wv_arr(), *fails = wv_arr();
    bool ok = h && applied && fails;
    for (int i = 0; ok && i < s->n; i++) {
        if (s->m[i].state == M_APPLIED) {
            ok = wv_push(applied, wv_str(s->m[i].worker)) == 0;
        } else {
            wire_val_t *f = wv_map();
            ok = f && wv_set(f, "worker", wv_str(s->m[i].worker)) == 0 &&
                 wv_set(f, "reason", wv_str(s->m[i].reason)) == 0;
            ok = wv_push(fails, f) == 0 && ok;
        }
    }
    ok = ok && wv_set(h, "component", wv_str(s->component)) == 0 &&
         wv_set(h, "version", wv_u64(s->version)) == 0;
    if (ok) {
        ok = wv_set(h, "applied", applied) == 0;
        applied = NULL;
    }
    if (ok) {
        ok = wv_set(h, "failed", fails) == 0;
        fails = NULL;
    }
    /* "current" tells the trainer whether its version took effect at all
     * (it is this version, or a newer one, once some worker applied it). */
    ok = ok && wv_set(h, "complete", wv_bool(complete)) == 0 &&
         wv_set(h, "current", wv_u64(brk_current_version(b, s->component))) == 0;
    wv_free(&applied);
    wv_free(&fails);
    if (!ok) wv_free(&h);
    return h;
}

/* Settles the catalog state of a version that never became current,
 * answers every trainer, and frees s (already unlinked). */
static void finish(brk_t *b, brk_barrier_t *s) {
    int failed = 0, applied = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->m[i].state == M_APPLIED) applied++;
        else failed++;
    }
    char a[512], f[512];
    list_members(s, M_APPLIED, a, sizeof a);
    list_members(s, M_FAILED, f, sizeof f);
    uint64_t cur = brk_current_version(b, s->component);
    if (s->msg) {
        /* Still pending: no worker applied it before a newer version became
         * current (superseded), or none applied it at all (failed). */
        char why[600];
        if (applied)
            snprintf(why, sizeof why, "applied after v%llu became current", (unsigned long long)cur);
        else if (s->n == 0)
            snprintf(why, sizeof why, "no live worker");
        else
            snprintf(why, sizeof why, "no worker applied it: %s", f);
        brk_cq_weight_state(b->cat, s->component, s->version, applied ? "superseded" : "failed", why);
        if (!applied)
            brk_log("sync %s v%llu failed, nothing changed (%s stays v%llu): %s", s->component,
                    (unsigned long long)s->version, s->component, (unsigned long long)cur, why);
        free_msg(&s->msg);
    }
    /* With no live worker nothing was applied: not complete (a trainer
     * waiting on the barrier must not take silence for success). */
    bool complete = failed == 0 && s->n > 0;
    for (int t = 0; t < s->n_trainers; t++) {
        wire_val_t *h = done_hdr(b, s, s->trainers[t].id, complete);
        if (!h || brk_send_to(b->clients, &s->trainers[t].ident, h, NULL, 0) < 0)
            brk_log("sync %s v%llu: SYNC_DONE not delivered", s->component,
                    (unsigned long long)s->version);
        wv_free(&h);
    }
    brk_log("sync %s v%llu %s (applied %s; failed %s)", s->component,
            (unsigned long long)s->version, complete ? "complete" : "incomplete", a, f);
    free(s->trainers);
    free(s->m);
    free(s);
}

/* Finishes every barrier nobody is waiting on any more. */
static void settle_barriers(brk_t *b) {
    for (brk_barrier_t **p = &b->barriers; *p;) {
        brk_barrier_t *s = *p;
        bool waiting = false;
        for (int i = 0; i < s->n && !waiting; i++) waiting = s->m[i].state == M_WAITING;
        if (waiting) {
            p = &s->next;
        } else {
            *p = s->next;
            finish(b, s);
        }
    }
}

/* A worker applied pending barrier s's version: it becomes the component's
 * current one, unless a newer one already is. */
static void promote(brk_t *b, brk_barrier_t *s, const char *by) {
    brk_current_t *cur = s->msg ? current_slot(b, s->component) : NULL;
    if (!cur || s->version <= cur->version) return;
    free_msg(&cur->msg);
    cur->msg = s->msg;
    s->msg = NULL;
    cur->version = s->version;
    snprintf(cur->sha256, sizeof cur->sha256, "%s", s->sha256);
    cur->sync_id = s->sync_id;
    brk_cq_weight_state(b->cat, s->component, s->version, "current", NULL);
    brk_log("%s v%llu is current (applied by %s)", s->component, (unsigned long long)s->version, by);
    /* Workers that joined while it was pending are sent it now. */
    for (int i = 0; i < b->n_w; i++)
        if (!b->w[i]->dead) brk_catch_up(b, b->w[i]);
}

/* A barrier for (component, version) answering trainer `id` at `from`,
 * with room for every registered worker. NULL on out-of-memory. */
static brk_barrier_t *barrier_new(brk_t *b, const char *component, uint64_t version,
                                  const char *sha256, const wire_msg_t *from, uint64_t deadline) {
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
    brk_ident_from(&s->trainers[0].ident, &from->identity);
    s->trainers[0].id = from->id;
    s->n_trainers = 1;
    s->deadline_ms = brk_now_ms() + (int64_t)(deadline ? deadline : b->opt.sync_deadline_ms);
    return s;
}

/* Adds w to s: applied when it runs the version already, else waiting for
 * the ack of a SYNC sent now (msg), or of one already on its way (a retry
 * does not make it load the file twice); failed when it cannot be sent. */
static void add_member(brk_t *b, brk_barrier_t *s, brk_worker_t *w, uint64_t sync_id,
                       wire_msg_t *msg) {
    brk_member_t *mb = &s->m[s->n++];
    snprintf(mb->worker, sizeof mb->worker, "%s", w->route.name);
    const brk_wsync_t *ws = wsync_of(w, s->component);
    if (brk_peer_version(&w->route, s->component) >= s->version) {
        mb->state = M_APPLIED;
    } else if (ws && ws->waiting && ws->sent >= s->version) {
        mb->state = M_WAITING;
    } else if (brk_sync_send(b, w, s->component, s->version, sync_id, msg) == 0) {
        mb->state = M_WAITING;
    } else {
        mb->state = M_FAILED;
        snprintf(mb->reason, sizeof mb->reason, "unreachable: SYNC not delivered");
    }
}

/* The trainer repeats a SYNC the broker has (same version and sha256):
 * the running barrier answers it too, or, for the current version, a new
 * barrier retries every worker that lags. */
static void on_resend(brk_t *b, const wire_msg_t *m, brk_barrier_t *running, brk_current_t *cur,
                      uint64_t deadline) {
    if (running) {
        brk_trainer_t *t = realloc(running->trainers, (size_t)(running->n_trainers + 1) * sizeof *t);
        if (!t) {
            wire_send_error(b->clients, &m->identity, m->id, WIRE_E_INTERNAL, "broker out of memory");
            return;
        }
        running->trainers = t;
        brk_ident_from(&t[running->n_trainers].ident, &m->identity);
        t[running->n_trainers++].id = m->id;
        brk_log("sync %s v%llu resent while its barrier runs: answered with it", running->component,
                (unsigned long long)running->version);
        return;
    }
    brk_barrier_t *s = barrier_new(b, cur->component, cur->version, cur->sha256, m, deadline);
    if (!s) {
        wire_send_error(b->clients, &m->identity, m->id, WIRE_E_INTERNAL, "broker out of memory");
        return;
    }
    s->sync_id = cur->sync_id;
    int retried = 0;
    for (int i = 0; i < b->n_w; i++) {
        if (b->w[i]->dead) continue;
        add_member(b, s, b->w[i], cur->sync_id, cur->msg);
        retried += s->m[s->n - 1].state != M_APPLIED;
    }
    if (s->n > 1) qsort(s->m, (size_t)s->n, sizeof *s->m, cmp_member);
    s->next = b->barriers;
    b->barriers = s;
    brk_log("sync %s v%llu resent (current): %d lagging worker%s retried", s->component,
            (unsigned long long)s->version, retried, retried == 1 ? "" : "s");
    settle_barriers(b);
}

void brk_on_sync(brk_t *b, wire_msg_t **mp) {
    wire_msg_t *m = *mp;
    const wire_val_t *h = m->hdr;
    const char *comp = wv_get_str(h, "component");
    const char *sha = wv_get_str(h, "sha256");
    const char *path = wv_get_str(h, "path");
    uint64_t version = 0, deadline = 0;
    char why[256];
    brk_sync_verdict_t v = BRK_SYNC_BAD;
    brk_barrier_t *running = NULL;
    brk_current_t *cur = NULL;
    bool resend = false;
    if (!wv_get_u64(h, "version", &version)) snprintf(why, sizeof why, "\"version\" must be an unsigned integer");
    else if (wv_get(h, "path") && !path) snprintf(why, sizeof why, "\"path\" must be a string");
    else if (wv_get(h, "deadline_ms") && !wv_get_u64(h, "deadline_ms", &deadline))
        snprintf(why, sizeof why, "\"deadline_ms\" must be an unsigned integer");
    else {
        /* The version this SYNC repeats, if any: a running barrier's (pending,
         * or current and still waiting) or the current one. */
        const char *known_sha = NULL;
        uint64_t cv = comp ? brk_current_version(b, comp) : 0;
        uint64_t pv = comp ? newest_pending(b, comp) : 0;
        if (comp && (running = barrier_of(b, comp, version)) != NULL) known_sha = running->sha256;
        else if (comp && version && version == cv) known_sha = (cur = current_slot(b, comp))->sha256;
        resend = known_sha && sha && !strcasecmp(sha, known_sha);
        /* A resend passes the same checks as a new SYNC but the "newer" one. */
        v = brk_sync_check(comp, version, resend ? version - 1 : (cv > pv ? cv : pv), sha,
                           path && *path, m->n_tensors, why, sizeof why);
        if (v == BRK_SYNC_STALE && known_sha)
            snprintf(why, sizeof why, "%s v%llu is %s with other weights (sha256 %.16s...)", comp,
                     (unsigned long long)version, running && running->msg ? "pending" : "current",
                     known_sha);
        else if (v == BRK_SYNC_STALE && pv > cv && version <= pv)
            snprintf(why, sizeof why, "%s version %llu is not newer than v%llu, still pending", comp,
                     (unsigned long long)version, (unsigned long long)pv);
    }
    if (v == BRK_SYNC_OK && strcmp(comp, BRK_COMPONENT) != 0) {
        v = BRK_SYNC_BAD;
        snprintf(why, sizeof why, "workers serve component \"%s\" only, not \"%s\"", BRK_COMPONENT, comp);
    }
    if (v == BRK_SYNC_OK && m->n_tensors > 0) {
        /* A message carries at most 8 tensors and a model has more: reel-worker
         * reloads whole models from a file, so refuse what no worker can apply
         * rather than record a version nobody will ever reach. */
        v = BRK_SYNC_BAD;
        snprintf(why, sizeof why, "inline tensors: workers sync by \"path\" only (a safetensors file they can read)");
    }
    if (v == BRK_SYNC_OK && !resend) { /* it is forwarded (and kept for late joiners): it must fit */
        wire_val_t *fwd = brk_hdr_from(h, "SYNC", UINT64_MAX);
        size_t len = 0;
        unsigned char *enc = fwd ? wire_encode_header(fwd, &len) : NULL;
        wv_free(&fwd);
        free(enc);
        if (!enc || len + 1024 > WIRE_MAX_HEADER) {
            v = BRK_SYNC_BAD;
            snprintf(why, sizeof why, "header too large to forward to the workers");
        }
    }
    /* The slot is taken now so that promotion can not fail later. */
    if (v == BRK_SYNC_OK && !resend && !current_slot(b, comp)) {
        v = BRK_SYNC_BAD;
        snprintf(why, sizeof why, "more than %d weight components", BRK_MAX_COMPONENTS);
    }
    if (v != BRK_SYNC_OK) {
        brk_log("SYNC refused: %s", why);
        wire_send_error(b->clients, &m->identity, m->id,
                        v == BRK_SYNC_STALE ? WIRE_E_STALE : WIRE_E_BAD_REQUEST, "SYNC: %s", why);
        return;
    }
    if (resend) {
        on_resend(b, m, running, cur, deadline);
        return;
    }
    brk_barrier_t *s = barrier_new(b, comp, version, sha, m, deadline);
    if (!s) {
        wire_send_error(b->clients, &m->identity, m->id, WIRE_E_INTERNAL, "broker out of memory");
        return;
    }
    brk_cq_weight_version(b->cat, comp, version, sha, path && *path ? path : "inline");
    s->msg = m;
    s->sync_id = b->next_id++;
    *mp = NULL;
    s->next = b->barriers;
    b->barriers = s;
    brk_log("sync %s v%llu accepted (%s), pending until a worker applies it", s->component,
            (unsigned long long)version, path && *path ? path : "inline tensors");
    const char *first = NULL;
    for (int i = 0; i < b->n_w; i++) {
        if (b->w[i]->dead) continue;
        add_member(b, s, b->w[i], s->sync_id, s->msg);
        if (s->m[s->n - 1].state == M_APPLIED && !first) first = b->w[i]->route.name;
    }
    if (s->n > 1) qsort(s->m, (size_t)s->n, sizeof *s->m, cmp_member);
    /* a worker that already runs this version (it said so at READY) applied it */
    if (first) promote(b, s, first);
    settle_barriers(b);
}

static brk_member_t *member(brk_barrier_t *s, const char *worker) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->m[i].worker, worker)) return &s->m[i];
    return NULL;
}

void brk_on_sync_ack(brk_t *b, brk_worker_t *w, const wire_msg_t *m) {
    const char *comp = wv_get_str(m->hdr, "component");
    const char *err = wv_get_str(m->hdr, "error");
    uint64_t version = 0;
    bool ok = false;
    if (!comp || !wv_get_u64(m->hdr, "version", &version) || !wv_get_bool(m->hdr, "ok", &ok)) {
        brk_log("worker %s sent a SYNC_ACK without component, version or ok (ignored)",
                w->route.name);
        brk_send_error_to(b->workers, &w->ident, m->id, WIRE_E_BAD_REQUEST,
                          "SYNC_ACK needs \"component\", \"version\" and \"ok\"");
        return;
    }
    if (!err || !*err) err = "failed";
    brk_cq_worker_version(b->cat, w->route.name, comp, version, ok, ok ? NULL : err);
    brk_wsync_t *ws = brk_worker_sync(w, comp, true);
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
        brk_log("worker %s applied %s v%llu", w->route.name, comp, (unsigned long long)version);
    } else {
        if (ws && version > brk_peer_version(&w->route, comp)) {
            ws->failed = version;
            snprintf(ws->why, sizeof ws->why, "%s", err);
        }
        brk_log("worker %s failed %s v%llu: %s", w->route.name, comp, (unsigned long long)version,
                err);
    }
    brk_barrier_t *mine = NULL;
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        if (strcmp(s->component, comp)) continue;
        if (s->version == version) mine = s;
        brk_member_t *mb = member(s, w->route.name);
        if (!mb || mb->state != M_WAITING) continue;
        if (ok && version >= s->version) {
            mb->state = M_APPLIED;
        } else if (!ok && version == s->version) {
            mb->state = M_FAILED;
            snprintf(mb->reason, sizeof mb->reason, "%s", err);
        }
    }
    if (ok && mine) promote(b, mine, w->route.name);
    settle_barriers(b);
}

/* Records that worker `name` did not apply s's version (the catalog keeps
 * the newest outcome per worker and version: a later ack replaces it). */
static void member_failed(brk_t *b, brk_barrier_t *s, brk_member_t *mb, const char *reason) {
    mb->state = M_FAILED;
    snprintf(mb->reason, sizeof mb->reason, "%s", reason);
    brk_cq_worker_version(b->cat, mb->worker, s->component, s->version, false, reason);
}

void brk_sync_worker_lost(brk_t *b, const char *worker) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        brk_member_t *mb = member(s, worker);
        if (mb && mb->state == M_WAITING) member_failed(b, s, mb, "worker lost");
    }
    settle_barriers(b);
}

void brk_sync_timers(brk_t *b, int64_t now) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        if (now < s->deadline_ms) continue;
        for (int i = 0; i < s->n; i++) {
            if (s->m[i].state != M_WAITING) continue;
            member_failed(b, s, &s->m[i], "timeout");
            brk_worker_t *w = brk_worker_named(b, s->m[i].worker);
            brk_wsync_t *ws = w ? brk_worker_sync(w, s->component, false) : NULL;
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
    for (const brk_barrier_t *s = b->barriers; s; s = s->next)
        if (s->deadline_ms < t) t = s->deadline_ms;
    return t;
}

void brk_sync_shutdown(brk_t *b) {
    while (b->barriers) {
        brk_barrier_t *s = b->barriers;
        b->barriers = s->next;
        for (int t = 0; t < s->n_trainers; t++)
            brk_send_error_to(b->clients, &s->trainers[t].ident, s->trainers[t].id, WIRE_E_INTERNAL,
                              "broker shutting down before sync %s v%llu completed", s->component,
                              (unsigned long long)s->version);
        if (s->msg) {
            brk_cq_weight_state(b->cat, s->component, s->version, "failed",
                                "broker shut down before any worker applied it");
            free_msg(&s->msg);
        }
        free(s->trainers);
        free(s->m);
        free(s);
    }
    for (int i = 0; i < b->n_cur; i++) free_msg(&b->cur[i].msg);
}

int brk_sync_restore(brk_t *b, const char *component, uint64_t version, const char *sha256,
                     const char *path) {
    brk_current_t *cur = current_slot(b, component);
    if (!cur) return kern_fail("more than %d weight components", BRK_MAX_COMPONENTS);
    wire_msg_t *m = calloc(1, sizeof *m);
    wire_val_t *h = wire_hdr("SYNC", 0);
    if (!m || !h || wv_set(h, "component", wv_str(component)) || wv_set(h, "version", wv_u64(version)) ||
        wv_set(h, "sha256", wv_str(sha256)) || wv_set(h, "path", wv_str(path))) {
        free(m);
        wv_free(&h);
        return kern_fail("out of memory");
    }
    m->hdr = h;
    m->type = wv_get_str(h, "type");
    free_msg(&cur->msg);
    cur->msg = m;
    cur->version = version;
    snprintf(cur->sha256, sizeof cur->sha256, "%s", sha256);
    cur->sync_id = b->next_id++;
    return 0;
}
