/* brk_requests.c -- GEN requests from acceptance to their one final reply.
 *
 * A GEN is validated, given its shard key and required weight version, and
 * sent as a REQUEST to the key's owner (rendezvous over eligible workers)
 * when the owner has a free slot; otherwise it waits in the bounded FIFO
 * (full: BUSY). Every reply goes back with the client's own id. A request
 * whose worker dies is requeued once and fails worker_lost on a second
 * loss; one past its deadline fails timeout (no_worker when nobody could
 * ever run it). A request that times out while running stays counted
 * against its worker (ABANDONED) until the worker answers, so a worker
 * never holds more than max_inflight. */
#include "broker/brk_broker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_log.h"
#include "kernels/error.h"

#define MAX_STEPS 10000
#define MAX_DIM ((int64_t)1 << 24)
#define MAX_GEN_BYTES ((uint64_t)256 << 20)
#define ABANDON_GRACE_MS 30000   /* how long a timed-out running request keeps its slot */

typedef struct {
    const char *model;
    uint64_t version, steps, deadline_ms;
    bool sde, progress;
    int64_t latent[4], context[2];
    bool cfg;
} gen_t;

/* ---- the request list ------------------------------------------------------- */

static void req_link(brk_t *b, brk_req_t *r) {
    r->prev = NULL;
    r->next = b->reqs;
    if (b->reqs) b->reqs->prev = r;
    b->reqs = r;
}

/* Unlinks and frees r (not in the queue: the caller removed it). */
static void req_free(brk_t *b, brk_req_t *r) {
    if (r->prev) r->prev->next = r->next;
    else b->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    b->held_bytes -= r->bytes;
    wire_msg_close(r->msg);
    free(r->msg);
    free(r);
}

static void queue_drop(brk_t *b, brk_req_t *r) {
    for (size_t i = 0; i < brk_queue_len(&b->queue); i++)
        if (brk_queue_at(&b->queue, i) == r) {
            brk_queue_remove(&b->queue, i);
            return;
        }
}

static brk_req_t *req_by_id(brk_t *b, uint64_t id) {
    for (brk_req_t *r = b->reqs; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

/* A catalog row for a request that ended without a RESULT. */
static void record_failure(brk_t *b, const brk_req_t *r, const char *worker, const char *status) {
    char hex[17];
    double secs = (double)(brk_now_ms() - r->accepted_ms) / 1000.0;
    brk_cq_request(b->cat, r->client_id, worker ? worker : "-", brk_hex(r->shard, hex),
                   r->required, r->steps, 0, 0, 0, secs, status);
}

/* ---- validation --------------------------------------------------------------- */

static bool opt_number(const wire_val_t *h, const char *k) {
    double d;
    return !wv_get(h, k) || wv_get_f64(h, k, &d);
}

/* Fills *g from a GEN. NULL when it is valid, else what is wrong. */
static const char *gen_parse(const wire_msg_t *m, gen_t *g) {
    const wire_val_t *h = m->hdr;
    memset(g, 0, sizeof *g);
    g->model = wv_get_str(h, "model");
    if (!g->model || !*g->model) return "\"model\" must be a non-empty string";
    if (wv_get(h, "version") && !wv_get_u64(h, "version", &g->version))
        return "\"version\" must be an unsigned integer";
    if (!wv_get_u64(h, "steps", &g->steps) || g->steps < 1 || g->steps > MAX_STEPS)
        return "\"steps\" must be an integer in 1..10000";
    if (wv_get(h, "deadline_ms") && !wv_get_u64(h, "deadline_ms", &g->deadline_ms))
        return "\"deadline_ms\" must be an unsigned integer";
    if (wv_get(h, "sde") && !wv_get_bool(h, "sde", &g->sde)) return "\"sde\" must be a bool";
    if (wv_get(h, "progress") && !wv_get_bool(h, "progress", &g->progress))
        return "\"progress\" must be a bool";
    if (!opt_number(h, "shift") || !opt_number(h, "cfg") || !opt_number(h, "eta"))
        return "\"shift\", \"cfg\" and \"eta\" must be numbers";
    uint64_t seed;
    if (wv_get(h, "seed") && !wv_get_u64(h, "seed", &seed))
        return "\"seed\" must be an unsigned integer";
    const wire_val_t *ls = wv_get(h, "latent_shape");
    if (!ls || ls->kind != WV_ARR || wv_len(ls) != 4)
        return "\"latent_shape\" must be an array of 4 integers [C,F,H,W]";
    uint64_t numel = 1;
    for (int i = 0; i < 4; i++) {
        if (!wv_as_i64(wv_at(ls, (size_t)i), &g->latent[i]) || g->latent[i] < 1 ||
            g->latent[i] > MAX_DIM)
            return "\"latent_shape\" entries must be positive integers";
        numel *= (uint64_t)g->latent[i];
        if (numel * sizeof(float) > (uint64_t)WIRE_MAX_FRAME)
            return "\"latent_shape\" is larger than a frame can carry";
    }
    const wire_tensor_t *ctx = wire_msg_tensor(m, "context");
    if (!ctx) return "tensor \"context\" missing";
    if (ctx->ndim != 2 || ctx->dtype != KERN_F32 || ctx->shape[0] < 1 || ctx->shape[1] < 1)
        return "tensor \"context\" must be a non-empty 2-D F32 [L,T]";
    g->context[0] = ctx->shape[0];
    g->context[1] = ctx->shape[1];
    const wire_tensor_t *unc = wire_msg_tensor(m, "uncond");
    if (unc && (unc->ndim != 2 || unc->dtype != KERN_F32 || unc->shape[0] != ctx->shape[0] ||
                unc->shape[1] != ctx->shape[1]))
        return "tensor \"uncond\" must be F32 with the shape of \"context\"";
    g->cfg = unc != NULL;
    const wire_tensor_t *lat = wire_msg_tensor(m, "latent");
    if (lat) {
        if (lat->ndim != 4 || lat->dtype != KERN_F32) return "tensor \"latent\" must be 4-D F32";
        for (int i = 0; i < 4; i++)
            if (lat->shape[i] != g->latent[i])
                return "tensor \"latent\" must have the shape \"latent_shape\" names";
    }
    /* A queued request holds its frames: bound what one may pin. */
    uint64_t total = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const char *n = m->t[i].name;
        if (strcmp(n, "context") && strcmp(n, "uncond") && strcmp(n, "latent"))
            return "unknown tensor (a GEN carries context, uncond and latent only)";
        total += m->t[i].bytes;
    }
    if (total > MAX_GEN_BYTES) return "tensors larger than a GEN may carry (256 MiB)";
    /* The REQUEST forwarded to a worker is this header plus "version": it
     * must still fit the header limit, or no worker could ever take it. */
    wire_val_t *fwd = brk_hdr_from(h, "REQUEST", UINT64_MAX);
    size_t len = 0;
    unsigned char *enc = fwd && !wv_set(fwd, "version", wv_u64(UINT64_MAX)) ? wire_encode_header(fwd, &len) : NULL;
    wv_free(&fwd);
    free(enc);
    if (!enc || len + 1024 > WIRE_MAX_HEADER) return "header too large to forward to a worker";
    return NULL;
}

/* ---- dispatch ------------------------------------------------------------------ */

/* Sends r to its owner when the owner has a free slot. true when sent. A
 * failed send makes that worker unroutable and the next owner is tried. */
static bool try_dispatch(brk_t *b, brk_req_t *r) {
    const brk_peer_t *peers[b->n_w ? b->n_w : 1];
    for (;;) {
        for (int i = 0; i < b->n_w; i++) peers[i] = &b->w[i]->route;
        int o = brk_owner(peers, b->n_w, r->shard, r->model, r->required);
        if (o < 0) return false;
        r->had_owner = true;
        brk_worker_t *w = b->w[o];
        if (w->route.inflight >= w->route.max_inflight) return false;
        wire_val_t *h = brk_hdr_from(r->msg->hdr, "REQUEST", r->id);
        if (!h || wv_set(h, "version", wv_u64(r->required)) < 0) {
            wv_free(&h);
            return false; /* out of memory: retried at the next pump */
        }
        int rc = brk_forward_to(b->workers, &w->ident, h, r->msg);
        int e = errno;
        wv_free(&h);
        if (rc < 0) {
            /* Only a transport failure says the worker is gone; a message
             * the codec refuses must not make every worker unroutable
             * (gen_parse keeps such requests out; this is the backstop). */
            if (e != EHOSTUNREACH && e != EAGAIN) {
                brk_log("cannot forward request %llu: %s", (unsigned long long)r->id, zmq_strerror(e));
                return false;
            }
            brk_worker_unreachable(b, w, "REQUEST");
            continue;
        }
        r->state = REQ_INFLIGHT;
        r->worker = w;
        w->route.inflight++;
        brk_keys_note(w->keys, &w->n_keys, r->shard);
        return true;
    }
}

void brk_pump(brk_t *b) {
    for (size_t i = 0; i < brk_queue_len(&b->queue);) {
        if (try_dispatch(b, brk_queue_at(&b->queue, i))) brk_queue_remove(&b->queue, i);
        else i++;
    }
}

void brk_on_gen(brk_t *b, wire_msg_t **mp) {
    wire_msg_t *m = *mp;
    gen_t g;
    const char *bad = gen_parse(m, &g);
    uint64_t shard = 0;
    if (!bad) {
        shard = brk_shard_hash(g.model, g.sde, g.latent, g.context, g.cfg);
        if (!shard) bad = kern_error();
    }
    if (bad) {
        wire_send_error(b->clients, &m->identity, m->id, WIRE_E_BAD_REQUEST, "GEN: %s", bad);
        return;
    }
    uint64_t bytes = 0;
    for (int i = 0; i < m->n_tensors; i++) bytes += m->t[i].bytes;
    if (b->held_bytes + bytes > b->opt.max_held_bytes) {
        /* Every accepted request holds its frames until answered: bound the
         * total, so a burst of large requests is refused, not an OOM. */
        wire_val_t *h = wire_hdr("BUSY", m->id);
        char msg[160];
        snprintf(msg, sizeof msg, "broker holds %llu MiB of request tensors (limit %llu MiB)",
                 (unsigned long long)(b->held_bytes >> 20), (unsigned long long)(b->opt.max_held_bytes >> 20));
        if (h && wv_set(h, "message", wv_str(msg)) == 0) wire_send(b->clients, &m->identity, h, NULL, 0);
        wv_free(&h);
        return;
    }
    brk_req_t *r = calloc(1, sizeof *r);
    if (!r) {
        wire_send_error(b->clients, &m->identity, m->id, WIRE_E_INTERNAL, "broker out of memory");
        return;
    }
    r->bytes = bytes;
    b->held_bytes += bytes;
    uint64_t current = brk_current_version(b, BRK_COMPONENT);
    r->id = b->next_id++;
    r->client_id = m->id;
    r->msg = m;
    snprintf(r->model, sizeof r->model, "%s", g.model);
    r->shard = shard;
    /* "version" is the oldest weights the request may run on: a trainer
     * asking for an older version than the current one may be served by a
     * worker that lags on the newest (brk_sync.c); without it, a request
     * needs the current version, so no worker that failed a sync runs it. */
    r->required = g.version ? g.version : current;
    r->steps = (int)g.steps;
    r->progress = g.progress;
    r->accepted_ms = brk_now_ms();
    uint64_t dl = g.deadline_ms ? g.deadline_ms : b->opt.request_deadline_ms;
    r->deadline_ms = r->accepted_ms + (int64_t)(dl > INT32_MAX ? INT32_MAX : dl);
    r->state = REQ_QUEUED;
    *mp = NULL;
    req_link(b, r);
    /* Older requests wait in the queue only while their owner is full or
     * missing, so sending a new one straight to a free owner keeps FIFO
     * order per owner. */
    if (try_dispatch(b, r)) return;
    if (brk_queue_push(&b->queue, r) < 0) {
        wire_val_t *h = wire_hdr("BUSY", r->client_id);
        char msg[128];
        snprintf(msg, sizeof msg, "queue full (%zu requests waiting)", b->queue.max);
        if (h && wv_set(h, "message", wv_str(msg)) == 0)
            wire_send(b->clients, &r->msg->identity, h, NULL, 0);
        wv_free(&h);
        req_free(b, r);
    }
}

/* ---- replies from workers ---------------------------------------------------------- */

static void forward_result(brk_t *b, brk_req_t *r, brk_worker_t *w, const wire_msg_t *m) {
    char hex[17];
    wire_val_t *h = brk_hdr_from(m->hdr, "RESULT", r->client_id);
    if (h && !wv_get(h, "worker")) wv_set(h, "worker", wv_str(w->route.name));
    if (h && !wv_get(h, "key_hash")) wv_set(h, "key_hash", wv_str(brk_hex(r->shard, hex)));
    if (!h || wire_forward(b->clients, &r->msg->identity, h, (wire_msg_t *)m) < 0)
        brk_log("request %llu: RESULT not delivered to its client (%s)",
                (unsigned long long)r->id, h ? zmq_strerror(errno) : "out of memory");
    wv_free(&h);

    const wire_val_t *st = wv_get(m->hdr, "stats");
    uint64_t version = r->required, cap = 0, rep = 0, eag = 0;
    double secs = 0;
    wv_get_u64(m->hdr, "version", &version);
    wv_get_u64(st, "captured", &cap);
    wv_get_u64(st, "replayed", &rep);
    wv_get_u64(st, "eager", &eag);
    if (!wv_get_f64(st, "seconds", &secs)) secs = (double)(brk_now_ms() - r->accepted_ms) / 1000.0;
    const char *kh = wv_get_str(m->hdr, "key_hash");
    brk_cq_request(b->cat, r->client_id, w->route.name, kh ? kh : brk_hex(r->shard, hex), version,
                   r->steps, (int)cap, (int)rep, (int)eag, secs, "ok");
}

void brk_on_reply(brk_t *b, brk_worker_t *w, wire_msg_t *m) {
    brk_req_t *r = req_by_id(b, m->id);
    bool progress = !strcmp(m->type, "PROGRESS");
    if (!r || r->worker != w) {
        if (!progress) {
            const char *code = wv_get_str(m->hdr, "code"), *text = wv_get_str(m->hdr, "message");
            brk_log("worker %s sent %s for unknown request %llu (discarded)%s%s%s%s",
                    w->route.name, m->type, (unsigned long long)m->id, code ? ": " : "",
                    code ? code : "", text ? ": " : "", text ? text : "");
        }
        return;
    }
    if (progress) {
        if (r->state != REQ_INFLIGHT || !r->progress) return;
        wire_val_t *h = brk_hdr_from(m->hdr, "PROGRESS", r->client_id);
        if (h) wire_send(b->clients, &r->msg->identity, h, NULL, 0);
        wv_free(&h);
        return;
    }
    w->route.inflight--;
    if (r->state == REQ_ABANDONED) {
        brk_log("late %s for request %llu from %s discarded (client already answered)", m->type,
                (unsigned long long)r->id, w->route.name);
    } else if (!strcmp(m->type, "RESULT")) {
        forward_result(b, r, w, m);
    } else {
        const char *code = wv_get_str(m->hdr, "code");
        const char *text = wv_get_str(m->hdr, "message");
        if (!code || !*code) code = WIRE_E_INTERNAL;
        wire_send_error(b->clients, &r->msg->identity, r->client_id, code, "%s",
                        text ? text : "worker error");
        record_failure(b, r, w->route.name, code);
    }
    req_free(b, r);
}

void brk_req_lost(brk_t *b, brk_req_t *r, const char *worker) {
    if (r->state == REQ_ABANDONED) {
        req_free(b, r);
        return;
    }
    r->worker = NULL;
    if (r->losses++ >= 1) {
        brk_log("request %llu failed: worker_lost (%s was the second worker to die with it)",
                (unsigned long long)r->id, worker);
        wire_send_error(b->clients, &r->msg->identity, r->client_id, WIRE_E_WORKER_LOST,
                        "worker %s died with the request (second loss)", worker);
        record_failure(b, r, worker, WIRE_E_WORKER_LOST);
        req_free(b, r);
        return;
    }
    r->state = REQ_QUEUED;
    if (brk_queue_push_front(&b->queue, r) < 0) {
        wire_send_error(b->clients, &r->msg->identity, r->client_id, WIRE_E_INTERNAL,
                        "broker out of memory requeueing after %s died", worker);
        record_failure(b, r, worker, WIRE_E_INTERNAL);
        req_free(b, r);
        return;
    }
    brk_log("request %llu requeued after losing %s", (unsigned long long)r->id, worker);
}

/* ---- deadlines and shutdown ------------------------------------------------------------ */

void brk_req_timers(brk_t *b, int64_t now) {
    for (brk_req_t *r = b->reqs, *next; r; r = next) {
        next = r->next;
        if (now < r->deadline_ms) continue;
        if (r->state == REQ_ABANDONED) {
            /* Its worker never answered, even late (a lost reply): free the
             * slot so the worker's capacity does not leak away. */
            brk_log("request %llu: no late answer from %s within %d ms; its slot is freed",
                    (unsigned long long)r->id, r->worker->route.name, ABANDON_GRACE_MS);
            r->worker->route.inflight--;
            req_free(b, r);
            brk_pump(b);
            continue;
        }
        long long waited = (long long)(now - r->accepted_ms);
        if (!r->had_owner) {
            wire_send_error(b->clients, &r->msg->identity, r->client_id, WIRE_E_NO_WORKER,
                            "no live worker serves model %s at %s version >= %llu (waited %lld ms)",
                            r->model, BRK_COMPONENT, (unsigned long long)r->required, waited);
            brk_log("request %llu failed: no_worker (model %s, version %llu)",
                    (unsigned long long)r->id, r->model, (unsigned long long)r->required);
        } else {
            wire_send_error(b->clients, &r->msg->identity, r->client_id, WIRE_E_TIMEOUT,
                            "no result within %lld ms (%s)", waited,
                            r->state == REQ_QUEUED ? "waiting for a slot" : "running");
            brk_log("request %llu failed: timeout (%s%s)", (unsigned long long)r->id,
                    r->state == REQ_QUEUED ? "queued" : "running on ",
                    r->state == REQ_QUEUED ? "" : r->worker->route.name);
        }
        record_failure(b, r, r->worker ? r->worker->route.name : NULL,
                       r->had_owner ? WIRE_E_TIMEOUT : WIRE_E_NO_WORKER);
        if (r->state == REQ_QUEUED) {
            queue_drop(b, r);
            req_free(b, r);
        } else {
            r->state = REQ_ABANDONED; /* its worker still holds the slot... */
            r->deadline_ms = now + ABANDON_GRACE_MS; /* ...for a while */
        }
    }
}

int64_t brk_req_next_deadline(const brk_t *b) {
    int64_t t = INT64_MAX;
    for (const brk_req_t *r = b->reqs; r; r = r->next)
        if (r->deadline_ms < t) t = r->deadline_ms;
    return t;
}

void brk_req_shutdown(brk_t *b) {
    while (b->reqs) {
        brk_req_t *r = b->reqs;
        if (r->state != REQ_ABANDONED)
            wire_send_error(b->clients, &r->msg->identity, r->client_id, WIRE_E_INTERNAL,
                            "broker shutting down");
        if (r->state == REQ_QUEUED) queue_drop(b, r);
        req_free(b, r);
    }
}
