/* brk_sync.c -- weight syncs: a trainer's SYNC is checked (newer version,
 * sha256, a payload), recorded in the catalog, kept whole as the current
 * SYNC of its component (late joiners get it after READY), and forwarded
 * to every live worker. A barrier then waits for the workers live at that
 * moment: SYNC_DONE goes back when each has acked (ok or not), died, or
 * the deadline passed. Requests needing the new version reach a worker
 * only after its ok ack (brk_peer_eligible reads the acked version). */
#include "broker/brk_broker.h"
#include "kernels/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_log.h"

enum { M_WAITING, M_APPLIED, M_FAILED };

uint64_t brk_current_version(const brk_t *b, const char *component) {
    for (int i = 0; i < b->n_cur; i++)
        if (!strcmp(b->cur[i].component, component)) return b->cur[i].version;
    return 0;
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

static int cmp_member(const void *a, const void *b) {
    return strcmp(((const brk_member_t *)a)->worker, ((const brk_member_t *)b)->worker);
}

/* Appends "a,b" (applied) or "a (why), b (why)" (failed) to buf; "-" when
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

/* Answers the trainer and frees s (already unlinked). */
static void finish(brk_t *b, brk_barrier_t *s) {
    int failed = 0;
    wire_val_t *h = wire_hdr("SYNC_DONE", s->trainer_id);
    wire_val_t *applied = wv_arr(), *fails = wv_arr();
    for (int i = 0; i < s->n; i++) {
        if (s->m[i].state == M_APPLIED) {
            wv_push(applied, wv_str(s->m[i].worker));
        } else {
            failed++;
            wire_val_t *f = wv_map();
            wv_set(f, "worker", wv_str(s->m[i].worker));
            wv_set(f, "reason", wv_str(s->m[i].reason));
            wv_push(fails, f);
        }
    }
    bool ok = h && wv_set(h, "component", wv_str(s->component)) == 0 &&
              wv_set(h, "version", wv_u64(s->version)) == 0 && wv_set(h, "applied", applied) == 0;
    applied = NULL;
    ok = ok && wv_set(h, "failed", fails) == 0;
    fails = NULL;
    /* With no live worker nothing was applied: not complete (a trainer
     * waiting on the barrier must not take silence for success). */
    bool complete = failed == 0 && s->n > 0;
    ok = ok && wv_set(h, "complete", wv_bool(complete)) == 0;
    if (!ok || brk_send_to(b->clients, &s->trainer, h, NULL, 0) < 0)
        brk_log("sync %s v%llu: SYNC_DONE not delivered", s->component,
                (unsigned long long)s->version);
    wv_free(&h);
    wv_free(&applied);
    wv_free(&fails);
    char a[512], f[512];
    list_members(s, M_APPLIED, a, sizeof a);
    list_members(s, M_FAILED, f, sizeof f);
    brk_log("sync %s v%llu %s (applied %s; failed %s)", s->component,
            (unsigned long long)s->version, failed == 0 && s->n > 0 ? "complete" : "incomplete", a, f);
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

void brk_on_sync(brk_t *b, wire_msg_t **mp) {
    wire_msg_t *m = *mp;
    const wire_val_t *h = m->hdr;
    const char *comp = wv_get_str(h, "component");
    const char *sha = wv_get_str(h, "sha256");
    const char *path = wv_get_str(h, "path");
    uint64_t version = 0, deadline = 0;
    char why[256];
    brk_sync_verdict_t v = BRK_SYNC_BAD;
    if (!wv_get_u64(h, "version", &version)) snprintf(why, sizeof why, "\"version\" must be an unsigned integer");
    else if (wv_get(h, "path") && !path) snprintf(why, sizeof why, "\"path\" must be a string");
    else if (wv_get(h, "deadline_ms") && !wv_get_u64(h, "deadline_ms", &deadline))
        snprintf(why, sizeof why, "\"deadline_ms\" must be an unsigned integer");
    else
        v = brk_sync_check(comp, version, comp ? brk_current_version(b, comp) : 0, sha,
                           path && *path, m->n_tensors, why, sizeof why);
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
    if (v == BRK_SYNC_OK) { /* it is forwarded (and stored for late joiners): it must fit */
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
    brk_current_t *cur = v == BRK_SYNC_OK ? current_slot(b, comp) : NULL;
    if (v == BRK_SYNC_OK && !cur) {
        v = BRK_SYNC_BAD;
        snprintf(why, sizeof why, "more than %d weight components", BRK_MAX_COMPONENTS);
    }
    if (v != BRK_SYNC_OK) {
        brk_log("SYNC refused: %s", why);
        wire_send_error(b->clients, &m->identity, m->id,
                        v == BRK_SYNC_STALE ? WIRE_E_STALE : WIRE_E_BAD_REQUEST, "SYNC: %s", why);
        return;
    }
    brk_barrier_t *s = calloc(1, sizeof *s);
    if (s && b->n_w) s->m = calloc((size_t)b->n_w, sizeof *s->m);
    if (!s || (b->n_w && !s->m)) {
        if (s) free(s);
        wire_send_error(b->clients, &m->identity, m->id, WIRE_E_INTERNAL, "broker out of memory");
        return;
    }
    brk_cq_weight_version(b->cat, comp, version, sha, path && *path ? path : "inline");
    /* The component's previous SYNC is no longer anyone's catch-up. */
    if (cur->msg) {
        wire_msg_close(cur->msg);
        free(cur->msg);
    }
    cur->msg = m;
    cur->version = version;
    cur->sync_id = b->next_id++;
    *mp = NULL;

    snprintf(s->component, sizeof s->component, "%s", cur->component);
    s->version = version;
    s->trainer_id = m->id;
    brk_ident_from(&s->trainer, &m->identity);
    s->deadline_ms = brk_now_ms() + (int64_t)(deadline ? deadline : b->opt.sync_deadline_ms);
    for (int i = 0; i < b->n_w; i++) {
        brk_worker_t *w = b->w[i];
        if (w->dead) continue;
        brk_member_t *mb = &s->m[s->n++];
        snprintf(mb->worker, sizeof mb->worker, "%s", w->route.name);
        /* a worker that already runs this version (it said so at READY) has nothing to ack */
        mb->state = brk_peer_version(&w->route, s->component) >= version ? M_APPLIED : M_WAITING;
    }
    if (s->n > 1) qsort(s->m, (size_t)s->n, sizeof *s->m, cmp_member);
    s->next = b->barriers;
    b->barriers = s;
    brk_log("sync %s v%llu accepted (%s), waiting for %d worker%s", s->component,
            (unsigned long long)version, path && *path ? path : "inline tensors", s->n,
            s->n == 1 ? "" : "s");
    for (int i = 0; i < b->n_w; i++)
        if (!b->w[i]->dead) brk_catch_up(b, b->w[i]);
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
    if (ok) {
        if (version > brk_peer_version(&w->route, comp) &&
            brk_peer_set_version(&w->route, comp, version) < 0)
            brk_log("worker %s: more than %d components, %s not tracked", w->route.name,
                    BRK_MAX_COMPONENTS, comp);
        brk_log("worker %s applied %s v%llu", w->route.name, comp, (unsigned long long)version);
    } else {
        brk_log("worker %s failed %s v%llu: %s", w->route.name, comp, (unsigned long long)version,
                err);
    }
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        if (strcmp(s->component, comp)) continue;
        brk_member_t *mb = member(s, w->route.name);
        if (!mb || mb->state != M_WAITING) continue;
        if (ok && version >= s->version) {
            mb->state = M_APPLIED;
        } else if (!ok && version == s->version) {
            mb->state = M_FAILED;
            snprintf(mb->reason, sizeof mb->reason, "%s", err);
        }
    }
    settle_barriers(b);
}

void brk_sync_worker_lost(brk_t *b, const char *worker) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        brk_member_t *mb = member(s, worker);
        if (mb && mb->state == M_WAITING) {
            mb->state = M_FAILED;
            snprintf(mb->reason, sizeof mb->reason, "worker lost");
        }
    }
    settle_barriers(b);
}

void brk_sync_timers(brk_t *b, int64_t now) {
    for (brk_barrier_t *s = b->barriers; s; s = s->next) {
        if (now < s->deadline_ms) continue;
        for (int i = 0; i < s->n; i++)
            if (s->m[i].state == M_WAITING) {
                s->m[i].state = M_FAILED;
                snprintf(s->m[i].reason, sizeof s->m[i].reason, "timeout");
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
        brk_send_error_to(b->clients, &s->trainer, s->trainer_id, WIRE_E_INTERNAL,
                          "broker shutting down before sync %s v%llu completed", s->component,
                          (unsigned long long)s->version);
        free(s->m);
        free(s);
    }
    for (int i = 0; i < b->n_cur; i++) {
        if (b->cur[i].msg) {
            wire_msg_close(b->cur[i].msg);
            free(b->cur[i].msg);
            b->cur[i].msg = NULL;
        }
    }
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
    if (cur->msg) {
        wire_msg_close(cur->msg);
        free(cur->msg);
    }
    cur->msg = m;
    cur->version = version;
    cur->sync_id = b->next_id++;
    return 0;
}
