/* brk_requests.c -- GEN requests from acceptance to their one final reply.
 *
 * A GEN (decoded and validated by the loop) is given its shard key and
 * required weight version, and
 * sent as a REQUEST to the key's owner (rendezvous over eligible workers)
 * when the owner has a free slot; otherwise it waits in the bounded queue
 * (full: BUSY; more tensor bytes than the broker may ever hold: too_large),
 * from which senders take turns for free slots (brk_pump). A CANCEL ends
 * a waiting request at once and a running one at its worker's next step.
 * Every reply goes back with the client's own id. A request
 * whose worker dies is requeued once and fails worker_lost on a second
 * loss; one past its deadline fails timeout (no_worker when nobody could
 * ever run it). A request that times out while running stays counted
 * against its worker (ABANDONED) until the worker answers, so a worker
 * never holds more than max_inflight. */
#include "broker/brk_requests.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "broker/brk_log.h"
#include "broker/brk_deliver.h"
#include "broker/brk_msg.h"
#include "base/error.h"

#define ABANDON_GRACE_MS 30000   /* how long a timed-out running request keeps its slot */

/* ---- the request list ------------------------------------------------------- */

static brk_req_t **bucket(brk_t *b, uint64_t id) { return &b->by_id[id % BRK_ID_BUCKETS]; }
static brk_req_t **client_bucket(brk_t *b, uint64_t client, uint64_t id) {
    return &b->by_client[brk_client_bucket(client, id)];
}

static void client_unlink(brk_t *b, brk_req_t *r) {
    if (!r->client) return;
    brk_req_t **h = client_bucket(b, r->client, r->client_id);
    while (*h && *h != r) h = &(*h)->ck_next;
    if (*h) *h = r->ck_next;
    r->client = 0;
}

static void req_link(brk_t *b, brk_req_t *r) {
    r->prev = NULL;
    r->next = b->reqs;
    if (b->reqs) b->reqs->prev = r;
    b->reqs = r;
    brk_req_t **h = bucket(b, r->id);
    r->id_next = *h;
    *h = r;
    if (r->client) {
        h = client_bucket(b, r->client, r->client_id);
        r->ck_next = *h;
        *h = r;
    }
}

/* Unlinks and frees r (not in the queue: the caller removed it). */
static void req_free(brk_t *b, brk_req_t *r) {
    if (r->prev) r->prev->next = r->next;
    else b->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    brk_req_t **h = bucket(b, r->id);
    while (*h != r) h = &(*h)->id_next;
    *h = r->id_next;
    client_unlink(b, r);
    b->held_bytes -= r->bytes;
    brk_msg_free(b, r->msg);
    brk_req_release(b, r);
}

static void queue_drop(brk_t *b, brk_req_t *r) {
    for (size_t i = 0; i < brk_queue_len(&b->queue); i++)
        if (brk_queue_at(&b->queue, i) == r) {
            brk_queue_remove(&b->queue, i);
            return;
        }
}

static brk_req_t *req_by_id(brk_t *b, uint64_t id) {
    for (brk_req_t *r = *bucket(b, id); r; r = r->id_next)
        if (r->id == id) return r;
    return NULL;
}

/* A RESULT's declines as the catalog keeps them, "warmup=2,budget=1" (in
 * the RESULT's order; a name that would not fit whole is left out), or
 * NULL when there are none. */
static const char *eager_reasons(const msg_counts_t *d, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->n; i++) {
        if (!d->e[i].n) continue;
        int k = snprintf(buf + at, cap - at, "%s%s=%" PRIu64, at ? "," : "", d->e[i].name, d->e[i].n);
        if (k < 0 || (size_t)k >= cap - at) {
            buf[at] = '\0';
            break;
        }
        at += (size_t)k;
    }
    return at ? buf : NULL;
}

/* When r began, in UNIX seconds, for its catalog row: when it was last
 * sent to a worker, else when the broker accepted it. */
static double started_at(const brk_req_t *r) {
    return brk_unix_of(r->dispatched_ms ? r->dispatched_ms : r->accepted_ms);
}

/* A catalog row for a request that ended without a RESULT: status its
 * ERROR's code, why its message (what the client was told). */
static void record_failure(brk_t *b, const brk_req_t *r, const char *worker, const char *status, const char *why) {
    char hex[17];
    double secs = (double)(brk_now_ms() - r->accepted_ms) / 1000.0;
    brk_metrics_request(&b->metrics, status, secs);
    brk_cq_request(b->cat, r->client_id, worker ? worker : "-", msg_hex64(r->shard, hex),
                   r->required, r->steps, 0, 0, 0, secs, status, 0.0, 0.0, 0, 0, 0, NULL, NULL, why, started_at(r), r->id);
}

/* The client's identity: its held GEN keeps it. */
#define CLIENT(r) (&(r)->msg->identity)

/* ---- dispatch ------------------------------------------------------------------ */

/* Of the n peers (indexes idx into b->w), those whose --max-tokens takes
 * a sample of r, moved to the front; n itself when none does, so the
 * owner answers too_large, saying its bound, rather than the request
 * waiting its deadline out. So workers of several --max-tokens serve every
 * shape one of them can (a shape too large for its key's owner goes to
 * the owner among those it fits). */
static int fitting(const brk_t *b, const brk_req_t *r, const brk_peer_t **peers, int *idx, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        const brk_worker_t *w = b->w[idx[i]];
        /* only a worker that could own it counts as one it fits (one of
         * another model, or behind its version, would leave it no owner) */
        if (!brk_peer_eligible(peers[i], r->model, r->required)) continue;
        if (!brk_worker_fits(w, r->model, r->gen.latent_shape)) continue;
        const brk_peer_t *p = peers[i];
        int j = idx[i];
        peers[i] = peers[k], idx[i] = idx[k];
        peers[k] = p, idx[k] = j;
        k++;
    }
    return k ? k : n;
}

/* Sends r to its owner when the owner has a free slot. true when sent. A
 * failed send makes that worker unroutable and the next owner is tried.
 * The workers' route.applying must be noted first (brk_note_applying:
 * once per pass, as dispatching changes no barrier). */
static bool try_dispatch(brk_t *b, brk_req_t *r) {
    const brk_peer_t *all[b->n_w ? b->n_w : 1], *peers[b->n_w ? b->n_w : 1];
    int idx[b->n_w ? b->n_w : 1];
    for (;;) {
        for (int i = 0; i < b->n_w; i++) all[i] = &b->w[i]->route;
        /* Only workers that run its loop kind (a solver they announced). */
        int n = brk_peers_able(all, b->n_w, r->needs, peers, idx);
        n = fitting(b, r, peers, idx, n);
        int o = brk_owner(peers, n, r->shard, r->model, r->required);
        if (o < 0) return false;
        r->had_owner = true;
        brk_worker_t *w = b->w[idx[o]];
        if (w->route.inflight >= w->route.max_inflight) return false;
        if (!brk_peer_has(&w->route, r->required)) return false; /* its owner is applying the version: wait */
        /* The REQUEST is the client's GEN, patched: the broker's id, the
         * version it needs and the ms the broker still waits for it (a
         * worker drops it past them); its bytes and tensor frames go as
         * received. */
        int64_t left = r->deadline_ms - brk_now_ms();
        msg_set_t set[2] = { { "version", MSG_SET_U64, r->required, NULL },
                             { "deadline_ms", MSG_SET_U64, left > 1 ? (uint64_t)left : 1, NULL } };
        uint64_t bytes = 0;
        for (int i = 0; i < r->msg->n_tensors; i++) bytes += r->msg->t[i].bytes;
        /* a large one: the worker is told first (nothing else reaches it
         * until this has), and is given as long to answer */
        if (bytes >= MSG_HEADS_UP_BYTES) (void)brk_send_heads_up(b->workers, &w->ident, bytes);
        if (brk_worker_forward(b, w, r->msg, MSG_REQUEST, r->id, set, 2) != 0) {
            if (w->route.routable) return false; /* not the worker's fault: retried at the next pump */
            continue;                            /* it is gone: the next owner */
        }
        /* its time to arrive and as long again to be handled (no
         * heartbeats from the worker meanwhile), after any large one before
         * it; only for a worker heard within its liveness of when this
         * message was taken up (checking a large GEN takes a while, no
         * worker's silence): one already silent gets no more time by
         * being sent more */
        const int64_t now = brk_now_ms();
        const int64_t since = b->handling_ms && b->handling_ms < now ? b->handling_ms : now;
        if (bytes >= MSG_HEADS_UP_BYTES && since - w->seen_ms <= (int64_t)b->opt.heartbeat_ms * b->opt.liveness) {
            const int64_t from = w->quiet_until_ms > now ? w->quiet_until_ms : now;
            w->quiet_until_ms = from + 2 * (int64_t)(bytes / MSG_SLOW_BYTES_PER_MS);
        }
        r->state = REQ_INFLIGHT;
        r->worker = w;
        r->dispatched_ms = brk_now_ms();
        b->last_sender = r->sender;
        reel_hist_observe(&b->metrics.queue_wait_s, (double)(brk_now_ms() - r->accepted_ms) / 1000.0);
        w->route.inflight++;
        brk_keys_note(w->keys, &w->n_keys, r->shard);
        return true;
    }
}

/* Whether some worker has a free slot. */
static bool any_room(const brk_t *b) {
    for (int i = 0; i < b->n_w; i++)
        if (b->w[i]->route.inflight < b->w[i]->route.max_inflight) return true;
    return false;
}

/* The sender a request takes its turn as: its client token, else its
 * connection's routing id (FNV-1a; never 0). */
static uint64_t sender_of(const brk_req_t *r) {
    if (r->client) return r->client;
    const unsigned char *p = zmq_msg_data((zmq_msg_t *)CLIENT(r));
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0, n = zmq_msg_size((zmq_msg_t *)CLIENT(r)); i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h ? h : 1;
}

typedef struct {
    uint64_t who;   /* a sender (0: a free slot) */
    uint32_t count; /* its requests running, and waiting so far */
} sender_count_t;

/* who's slot of tab (cap a power of two, never full), taken if new. */
static size_t sender_slot(sender_count_t *tab, size_t cap, uint64_t who) {
    size_t s = (size_t)(who * 0x9e3779b97f4a7c15ull) & (cap - 1);
    while (tab[s].who && tab[s].who != who) s = (s + 1) & (cap - 1);
    tab[s].who = who;
    return s;
}

typedef struct {
    uint32_t turn; /* requests of its sender that run, or wait ahead of it */
    uint32_t last; /* 1: its sender's request was the last dispatched */
    uint32_t at;   /* its place in the queue */
} turn_t;

static int by_turn(const void *a, const void *b) {
    const turn_t *x = a, *y = b;
    if (x->turn != y->turn) return x->turn < y->turn ? -1 : 1;
    if (x->last != y->last) return x->last < y->last ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* The FIFO pass, when the turns cannot be had (out of memory). */
static void pump_fifo(brk_t *b) {
    for (size_t i = 0; i < brk_queue_len(&b->queue);) {
        if (try_dispatch(b, brk_queue_at(&b->queue, i))) brk_queue_remove(&b->queue, i);
        else i++;
    }
}

/* Senders take turns: a free slot goes to the waiting request whose sender
 * has the fewest requests running and waiting ahead of it; among equals,
 * not the sender served last (its request just ended: the others' turn),
 * then the oldest. So a client that queued many GENs does not hold back
 * one that sent a single GEN after them; each sender's own requests still
 * go in the order they came. Each request can still only go to its key's
 * owner (affinity is kept: docs/PROTOCOL.md "Routing"). */
void brk_pump(brk_t *b) {
    const size_t n = brk_queue_len(&b->queue);
    if (!n) return;
    brk_note_applying(b);
    if (!any_room(b)) { /* nothing can go: the pass only notes which requests have an owner (had_owner) */
        pump_fifo(b);
        return;
    }
    size_t live = 0;
    for (const brk_req_t *r = b->reqs; r; r = r->next) live++;
    size_t cap = 16;
    while (cap < 2 * live) cap <<= 1;
    sender_count_t *tab = calloc(cap, sizeof *tab);
    turn_t *ord = malloc(n * sizeof *ord);
    if (!tab || !ord || n > UINT32_MAX) {
        free(tab);
        free(ord);
        pump_fifo(b);
        return;
    }
    /* (every live request's sender fits: cap >= 2 x live) */
    for (const brk_req_t *r = b->reqs; r; r = r->next)
        if (r->state != REQ_QUEUED) /* running (abandoned too: its slot is still taken) */
            tab[sender_slot(tab, cap, r->sender)].count++;
    for (size_t i = 0; i < n; i++) {
        const uint64_t who = ((brk_req_t *)brk_queue_at(&b->queue, i))->sender;
        size_t s = sender_slot(tab, cap, who);
        ord[i] = (turn_t){ tab[s].count++, who == b->last_sender, (uint32_t)i };
    }
    qsort(ord, n, sizeof *ord, by_turn);
    bool sent = false;
    for (size_t k = 0; k < n; k++) {
        brk_req_t *r = brk_queue_at(&b->queue, ord[k].at);
        if (!try_dispatch(b, r)) continue;
        brk_queue_at(&b->queue, ord[k].at) = NULL; /* (compacted below) */
        sent = true;
        /* (no break when the slots run out: every request is offered, so
         * each one whose owner exists notes it, had_owner, as before) */
    }
    if (sent) brk_queue_compact(&b->queue);
    free(tab);
    free(ord);
}

/* The queue is full and r, just accepted, does not fit. The sender with
 * the most requests waiting gives up its newest waiting one when it has at
 * least two more waiting than r's sender: that request leaves the queue
 * (returned, to be answered BUSY, as if it had come now) and r takes its
 * place. So one client flooding a full queue cannot keep every other
 * client out: the queue's places even out between the senders that want
 * them (one more each time, never back and forth), while a sender alone
 * may still fill it. NULL when no request gives way (or out of memory);
 * else *had and *mine are the two senders' counts before the swap. */
static brk_req_t *make_way(brk_t *b, const brk_req_t *r, uint32_t *had, uint32_t *mine_out) {
    const size_t n = brk_queue_len(&b->queue);
    size_t cap = 16;
    while (cap < 2 * (n + 1)) cap <<= 1;
    sender_count_t *tab = calloc(cap, sizeof *tab);
    if (!tab) return NULL;
    size_t most = SIZE_MAX; /* the slot of the sender with the most waiting (the first to reach it) */
    for (size_t i = 0; i < n; i++) {
        const brk_req_t *q = brk_queue_at(&b->queue, i);
        const size_t at = sender_slot(tab, cap, q->sender);
        tab[at].count++;
        if (most == SIZE_MAX || tab[at].count > tab[most].count) most = at;
    }
    const uint32_t mine = tab[sender_slot(tab, cap, r->sender)].count;
    brk_req_t *v = NULL;
    if (most != SIZE_MAX && tab[most].who != r->sender && tab[most].count >= mine + 2) {
        *had = tab[most].count;
        *mine_out = mine;
        size_t at = n;
        uint64_t newest = 0;
        for (size_t i = 0; i < n; i++) { /* its newest: the highest id (a requeued one sits at the front) */
            const brk_req_t *q = brk_queue_at(&b->queue, i);
            if (q->sender == tab[most].who && q->id > newest) newest = q->id, at = i;
        }
        if (at < n) v = brk_queue_remove(&b->queue, at);
    }
    free(tab);
    return v;
}

static void send_busy(brk_t *b, const zmq_msg_t *to, uint64_t id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_busy(brk_t *b, const zmq_msg_t *to, uint64_t id, const char *fmt, ...) {
    msg_busy_t busy;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(busy.message, 256, fmt, ap);
    va_end(ap);
    (void)brk_client_send(b, to, MSG_BUSY, id, &busy, NULL); /* (counted when dropped) */
    b->metrics.busy++;
}

/* The text_len a live worker announced for model (0: none, or no worker
 * announced one): its workers pad every context to it, so every prompt
 * length shares one key and one graph, and routing must say so too. */
static const msg_model_t *model_config(const brk_t *b, const char *model) {
    for (int i = 0; i < b->n_w; i++)
        for (int c = 0; c < b->w[i]->n_configs; c++)
            if (!strcmp(b->w[i]->configs[c].name, model)) return &b->w[i]->configs[c];
    return NULL;
}
static int64_t model_text_len(const brk_t *b, const char *model) {
    const msg_model_t *c = model_config(b, model);
    return c ? (int64_t)c->text_len : 0;
}

/* The context shape a prompt GEN shards with: [text_len, text_dim] of the
 * model as its workers announced it (the worker pads the encoded prompt to
 * text_len, so every prompt shares one key). false when the broker cannot
 * know it, with the client answered. */
static bool prompt_context(brk_t *b, const wire_msg_t *m, const msg_gen_t *g, int64_t ctx[2]) {
    const msg_model_t *c = model_config(b, g->model);
    if (c && c->text_len > 0 && c->text_dim > 0) {
        ctx[0] = (int64_t)c->text_len;
        ctx[1] = (int64_t)c->text_dim;
        return true;
    }
    bool announced = false; /* by a worker that sent no config for it (not reel-worker) */
    for (int i = 0; i < b->n_w && !c && !announced; i++)
        if (!b->w[i]->dead)
        for (int k = 0; k < b->w[i]->route.n_models; k++) announced |= !strcmp(b->w[i]->route.models[k], g->model);
    if (c)
        brk_error_to(b, false, &m->identity, m->id, WIRE_E_BAD_REQUEST,
                     "GEN: model %s takes no 'prompt': its config has no text_len (send a 'context')", g->model);
    else if (announced)
        brk_error_to(b, false, &m->identity, m->id, WIRE_E_BAD_REQUEST,
                     "GEN: model %s takes no 'prompt' here: its workers announce no config for it, so its text_len "
                     "is unknown (send a 'context')", g->model);
    else
        brk_error_to(b, false, &m->identity, m->id, WIRE_E_NO_WORKER,
                     "no live worker announces model %s, so a 'prompt' cannot be placed yet (its text_len is unknown)",
                     g->model);
    return false;
}

static bool same_tensor(const wire_tensor_t *a, const wire_tensor_t *b) {
    if (!a || !b) return a == b;
    return a->dtype == b->dtype && a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof a->shape) &&
           a->bytes == b->bytes && (a->bytes == 0 || !memcmp(a->data, b->data, a->bytes));
}

static bool same_str(const char *a, const char *b) { return !strcmp(a ? a : "", b ? b : ""); }

/* Sample i's seed as the worker takes it: seeds[i], else seed + i. */
static uint64_t sample_seed(const msg_gen_t *g, uint64_t i) { return g->n_seeds ? g->seeds[i] : g->seed + i; }

/* Whether g asks for what o asks, field by field as the worker reads them:
 * a default spelled out is the default (solver "euler", output "latent",
 * with n = 1 seeds [seed]), and what a request ignores is not compared
 * (eta without sde, cfg without uncond or prompt: docs/PROTOCOL.md GEN).
 * A resend may change only its deadline and whether it wants PROGRESS.
 * Returns NULL when it asks the same, else the first field that differs,
 * named as on the wire, so the refused sender learns what it changed. */
static const char *differing_field(const msg_gen_t *o, const msg_gen_t *g) {
    const uint64_t n = msg_gen_n(o);
    if (strcmp(o->model, g->model)) return "model";
    if (o->version != g->version) return "version";
    if (o->steps != g->steps) return "steps";
    if (o->sde != g->sde) return "sde";
    if (n != msg_gen_n(g)) return "n";
    if (memcmp(o->latent_shape, g->latent_shape, sizeof o->latent_shape)) return "latent_shape";
    for (uint64_t i = 0; i < n; i++)
        if (sample_seed(o, i) != sample_seed(g, i)) return g->n_seeds ? "seeds" : "seed";
    /* doubles compared by bits: a NaN never passed the checks, and -0 is not 0 to a client that sent it */
    const bool guided = o->uncond || (o->prompt && o->prompt[0]);
    if (memcmp(&o->shift, &g->shift, sizeof o->shift)) return "shift";
    if (guided && memcmp(&o->cfg, &g->cfg, sizeof o->cfg)) return "cfg";
    if (o->sde && memcmp(&o->eta, &g->eta, sizeof o->eta)) return "eta";
    if (strcmp(msg_gen_solver(o), msg_gen_solver(g))) return "solver";
    if (strcmp(msg_gen_output(o), msg_gen_output(g))) return "output";
    if (!same_str(o->prompt, g->prompt)) return "prompt";
    if (!same_str(o->negative_prompt, g->negative_prompt)) return "negative_prompt";
    if (o->return_trajectory != g->return_trajectory) return "return_trajectory";
    if (o->return_log_probs != g->return_log_probs) return "return_log_probs";
    if (o->return_means != g->return_means) return "return_means";
    if (o->return_timesteps != g->return_timesteps) return "return_timesteps";
    if (!same_tensor(o->context, g->context)) return "context";
    if (!same_tensor(o->uncond, g->uncond)) return "uncond";
    if (!same_tensor(o->latent, g->latent)) return "latent";
    return NULL;
}

/* A GEN resent (same client token and id) while its request is live: the
 * client lost the broker, or its answer, and asks again (a new socket,
 * perhaps). The request's answers go to the sender of the resend from now
 * on; nothing runs twice. True when m was such a resend (answered, or
 * attached); false when it is a new request. A request already abandoned
 * (answered timeout) leaves the index: the resend is a new request. */
static bool resent(brk_t *b, const wire_msg_t *m, const msg_gen_t *g) {
    if (!g->client) return false;
    brk_req_t *r = *client_bucket(b, g->client, m->id);
    while (r && (r->client != g->client || r->client_id != m->id)) r = r->ck_next;
    if (!r) return false;
    if (r->state == REQ_ABANDONED) {
        client_unlink(b, r);
        return false;
    }
    const char *differs = differing_field(&r->gen, g);
    if (differs) {
        brk_error_to(b, false, &m->identity, m->id, WIRE_E_BAD_REQUEST,
                     "GEN: id %" PRIu64 " of client %016" PRIx64 " names a live request that is not this one "
                     "(its '%s' differs; only deadline_ms and progress may)", m->id, g->client, differs);
        return true;
    }
    zmq_msg_t to;
    if (zmq_msg_init(&to) == 0 && zmq_msg_copy(&to, (zmq_msg_t *)&m->identity) == 0) {
        zmq_msg_close(&r->msg->identity);
        r->msg->identity = to;
    } else {
        zmq_msg_close(&to);
    }
    b->resends++;
    /* (a client resending in a loop: within its kind's budget) */
    brk_log_kind(&b->request_log, BRK_GEN_RESENDS,
                 "GEN %" PRIu64 " of client %016" PRIx64 " resent while request %" PRIu64 " %s: its answer goes to the "
                 "resend", m->id, g->client, r->id, r->state == REQ_QUEUED ? "waits" : "runs");
    return true;
}

void brk_req_accept(brk_t *b, wire_msg_t **mp, const msg_gen_t *g, uint64_t current) {
    wire_msg_t *m = *mp;
    if (resent(b, m, g)) return;
    int64_t ctx[2] = { 0, 0 };
    int64_t tl = model_text_len(b, g->model);
    bool prompt = g->prompt && *g->prompt;
    if (prompt && !prompt_context(b, m, g, ctx)) return;
    if (!prompt) {
        ctx[0] = g->context->shape[0];
        ctx[1] = g->context->shape[1];
    }
    if (!prompt && tl > 0) {
        if (ctx[0] > tl || (g->uncond && g->uncond->shape[0] > tl)) {
            /* named as a field error is (docs/PROTOCOL.md): the client
             * must tell a long negative context from a long context */
            const wire_tensor_t *over = ctx[0] > tl ? g->context : g->uncond;
            brk_error_to(b, false, &m->identity, m->id, WIRE_E_BAD_REQUEST,
                         "GEN: tensor '%s' has %" PRId64 " rows: model %s pads contexts to text_len %" PRId64
                         " and takes at most that many", over->name, over->shape[0], g->model, tl);
            return;
        }
        ctx[0] = tl;
    }
    uint64_t shard = brk_shard_hash_memo(&b->shard_memo, g->model, brk_loop_kind(g->sde, msg_gen_solver(g)), g->latent_shape, ctx, msg_gen_guided(g),
                                         (int64_t)msg_gen_n(g));
    if (!shard) {
        brk_error_from(b, false, &m->identity, m->id, reel_err(), NULL); /* invalid: bad_request */
        return;
    }
    uint64_t bytes = 0;
    for (int i = 0; i < m->n_tensors; i++) bytes += m->t[i].bytes;
    /* Every accepted request holds its frames until answered: bound the
     * total, so a burst of large requests is refused, not an OOM. One that
     * could never fit is too_large (BUSY would invite a retry in vain). */
    if (bytes > b->opt.max_held_bytes) {
        brk_error_to(b, false, &m->identity, m->id, WIRE_E_TOO_LARGE,
                       "tensors of %llu bytes, more than the broker holds at once (%llu bytes, --max-held-mb)",
                       (unsigned long long)bytes, (unsigned long long)b->opt.max_held_bytes);
        return;
    }
    /* Every request leaves a row in the catalog, and rows are never
     * dropped: while the writer is that far behind (a slow or full disk),
     * new work waits for it. */
    if (brk_catq_behind(b->cat)) {
        send_busy(b, &m->identity, m->id, "the catalog is behind: %zu records wait to be written",
                  brk_catq_pending(b->cat));
        return;
    }
    if (b->held_bytes + bytes > b->opt.max_held_bytes) {
        send_busy(b, &m->identity, m->id, "broker holds %.1f MiB of request tensors, and this one's %.1f MiB would "
                  "pass the limit (%.1f MiB)", (double)b->held_bytes / 1048576.0, (double)bytes / 1048576.0,
                  (double)b->opt.max_held_bytes / 1048576.0);
        return;
    }
    brk_req_t *r = brk_req_new(b);
    if (!r) {
        brk_error_to(b, false, &m->identity, m->id, WIRE_E_INTERNAL, "broker out of memory");
        return;
    }
    r->bytes = bytes;
    b->held_bytes += bytes;
    r->id = b->next_id++;
    r->client_id = m->id;
    r->client = g->client;
    r->msg = m;
    r->sender = sender_of(r);
    r->gen = *g;
    size_t ml = strnlen(g->model, sizeof r->model - 1); /* validated: a name that fits */
    memcpy(r->model, g->model, ml);
    r->model[ml] = '\0';
    r->shard = shard;
    r->loop = brk_loop_kind(g->sde, msg_gen_solver(g));
    r->needs = 1u << r->loop | (g->prompt && *g->prompt ? 1u << BRK_CAP_PROMPT : 0u) |
               (msg_gen_decodes(g) ? 1u << BRK_CAP_DECODE : 0u);
    {
        /* its key heats up: what a starting worker captures first (prewarm) */
        brk_hot_key_t hk = { .hash = shard, .cfg = msg_gen_guided(g), .loop = r->loop, .needs = r->needs,
                             .n = (int64_t)msg_gen_n(g) };
        memcpy(hk.model, r->model, sizeof hk.model);
        memcpy(hk.latent, g->latent_shape, sizeof hk.latent);
        memcpy(hk.context, ctx, sizeof hk.context);
        brk_hot_note(&b->hot, &hk, brk_now_ms());
    }
    /* "version" is the oldest weights the request may run on: a trainer
     * asking for an older version than the current one may be served by a
     * worker that lags on the newest (brk_sync.c); without it, a request
     * needs the current version, so no worker that failed a sync runs it. */
    r->required = g->version ? g->version : current;
    r->steps = (int)g->steps;
    r->progress = g->progress;
    r->accepted_ms = brk_now_ms();
    uint64_t dl = g->deadline_ms ? g->deadline_ms : b->opt.request_deadline_ms;
    r->deadline_ms = r->accepted_ms + (int64_t)(dl > INT32_MAX ? INT32_MAX : dl);
    r->state = REQ_QUEUED;
    *mp = NULL;
    req_link(b, r);
    /* Older requests wait in the queue only while their owner is full or
     * missing, so sending a new one straight to a free owner passes none
     * of them (brk_pump gives a freed slot its turn). */
    brk_note_applying(b);
    if (try_dispatch(b, r)) return;
    if (brk_queue_push(&b->queue, r) == 0) return;
    uint32_t had = 0, mine = 0;
    /* (only a queue exactly full: requeued requests can hold it past
     * --queue-max, and then one place given up would not make room) */
    brk_req_t *v = brk_queue_len(&b->queue) == b->queue.max ? make_way(b, r, &had, &mine) : NULL;
    if (v) {
        brk_log_kind(&b->request_log, BRK_REQUEST_ENDS,
                     "request %llu gives its place in the full queue (%zu waiting) to request %llu: its sender has "
                     "%u waiting, the newcomer's %u",
                     (unsigned long long)v->id, b->queue.max, (unsigned long long)r->id, had, mine);
        send_busy(b, CLIENT(v), v->client_id,
                  "queue full (%zu requests waiting): this request, the newest of the client with the most "
                  "waiting (%u), gave its place to a request of a client with fewer (%u)",
                  b->queue.max, had, mine);
        b->queue_displaced++;
        req_free(b, v);
        if (brk_queue_push(&b->queue, r) == 0) return;
    }
    send_busy(b, CLIENT(r), r->client_id, "queue full (%zu requests waiting)", b->queue.max);
    req_free(b, r);
}

/* ---- replies from workers ---------------------------------------------------------- */

/* The request w holds under the broker's id, or NULL (logged: a reply
 * to a request w does not hold is dropped). */
static brk_req_t *held_by(brk_t *b, brk_worker_t *w, uint64_t id, msg_type_t type, const char *detail) {
    brk_req_t *r = req_by_id(b, id);
    if (r && r->worker == w) return r;
    /* (a split group's last PROGRESS may come after its RESULT: no fault) */
    if (type != MSG_PROGRESS)
        BRK_WORKER_REFUSED(b, w, "worker %s sent %s for unknown request %llu (discarded)%s%s", w->route.name,
                           msg_type_name(type), (unsigned long long)id, detail ? ": " : "", detail ? detail : "");
    return NULL;
}

/* A final reply came: the slot is free; an abandoned request (its client
 * answered already) is only freed. true when the client still waits. */
static bool settle_slot(brk_t *b, brk_worker_t *w, brk_req_t *r, msg_type_t type) {
    w->route.inflight--;
    if (r->state != REQ_ABANDONED) return true;
    brk_log_kind(&b->request_log, BRK_REQUEST_ENDS,
                 "late %s for request %llu from %s discarded (client already answered)", msg_type_name(type),
                 (unsigned long long)r->id, w->route.name);
    req_free(b, r);
    return false;
}

void brk_req_progress(brk_t *b, brk_worker_t *w, uint64_t id, const msg_progress_t *p) {
    brk_req_t *r = held_by(b, w, id, MSG_PROGRESS, NULL);
    if (!r || r->state != REQ_INFLIGHT || !r->progress) return;
    /* Never backwards within a run: the parts of a group split over a
     * worker's streams each report the group's count, and two of their
     * messages can arrive in either order; the older one is dropped, and so
     * is the same count with no larger total (a part's last step arriving
     * after another part's first decode message).
     * (A requeued request runs again from its first step: req_lost resets
     * this, and its PROGRESS counts again from 1.) */
    /* Never past its end: a count a client could not make sense of (step
     * beyond steps, frames decoded beyond those it decodes) is dropped. */
    /* Nor a total the request could not have: more steps than n x its
     * steps (a group's batches, each counted), more frames than n x its
     * latent frames. A count pinned at 2^64 - 1 would otherwise be
     * forwarded and leave every later one "backwards". */
    /* (and no frames at all for a GEN that decodes nothing) */
    const uint64_t n = msg_gen_n(&r->gen),
                   frames = msg_gen_decodes(&r->gen) && r->gen.latent_shape[1] > 0 ? (uint64_t)r->gen.latent_shape[1] : 0;
    if (p->step > p->steps || p->decoded > p->decode_frames || p->steps > n * r->gen.steps ||
        p->decode_frames > n * frames) {
        BRK_WORKER_REFUSED(b, w, "worker %s sent PROGRESS %llu of %llu (%llu of %llu frames) for request %llu: past "
                           "its end, dropped", w->route.name, (unsigned long long)p->step,
                           (unsigned long long)p->steps, (unsigned long long)p->decoded,
                           (unsigned long long)p->decode_frames, (unsigned long long)id);
        return;
    }
    const uint64_t at = p->step + p->decoded, of = p->steps + p->decode_frames;
    if (at < r->progress_at || (at == r->progress_at && of <= r->progress_of)) return;
    r->progress_at = at;
    r->progress_of = of;
    (void)brk_client_send(b, CLIENT(r), MSG_PROGRESS, r->client_id, p, NULL); /* (counted when dropped) */
}

void brk_req_result(brk_t *b, brk_worker_t *w, uint64_t id, msg_result_t *res, const wire_msg_t *m) {
    brk_req_t *r = held_by(b, w, id, MSG_RESULT, NULL);
    if (!r) return;
    wire_err_t bad;
    if (r->state != REQ_ABANDONED && msg_result_check(res, &r->gen, r->required, &bad) != 0) {
        /* A RESULT a client could not use ends the request as the worker's fault. */
        msg_error_t e;
        memset(&e, 0, sizeof e);
        BRK_WORKER_REFUSED(b, w, "worker %s sent a bad RESULT (%s)", w->route.name, bad.message);
        snprintf(e.code, sizeof e.code, "%s", WIRE_E_INTERNAL);
        /* bad.message may already name the type (a field error: "RESULT: ...") */
        const char *why = strncmp(bad.message, "RESULT: ", 8) ? bad.message : bad.message + 8;
        snprintf(e.message, sizeof e.message, "worker %s sent a bad RESULT: %s", w->route.name, why);
        brk_req_error(b, w, id, &e);
        return;
    }
    if (!settle_slot(b, w, r, MSG_RESULT)) return;
    /* The client gets the worker's RESULT as sent, with its own id, the
     * worker it ran on (the name it registered: a RESULT naming another is
     * corrected), the key hash when the worker left it out, and this broker's
     * boot id: a client that kept an older one (its broker restarted
     * between its calls) learns it here, not from a liveness STATUS that
     * would make it send a live GEN again. */
    msg_set_t set[3];
    int n = 0;
    if (b->boot) set[n++] = (msg_set_t){ "boot", MSG_SET_HASH, b->boot, NULL };
    if (strcmp(res->worker, w->route.name)) {
        snprintf(res->worker, sizeof res->worker, "%s", w->route.name);
        set[n++] = (msg_set_t){ "worker", MSG_SET_NAME, 0, res->worker };
    }
    if (!res->key_hash) {
        res->key_hash = r->shard;
        set[n++] = (msg_set_t){ "key_hash", MSG_SET_HASH, r->shard, NULL };
    }
    /* (held when the client's queue is full: brk_deliver.h) */
    (void)brk_client_forward(b, CLIENT(r), m, MSG_RESULT, r->client_id, set, n);
    brk_metrics_request(&b->metrics, "ok", (double)(brk_now_ms() - r->accepted_ms) / 1000.0);
    b->metrics.steps_replayed += res->stats.replayed;
    b->metrics.steps_eager += res->stats.eager;
    b->metrics.steps_captured += res->stats.captured;
    if (r->gen.prompt && *r->gen.prompt) reel_hist_observe(&b->metrics.encode_s, res->encode_seconds);
    if (msg_gen_decodes(&r->gen)) reel_hist_observe(&b->metrics.decode_s, res->decode_seconds);
    char hex[17];
    double secs = res->stats.seconds ? res->stats.seconds : (double)(brk_now_ms() - r->accepted_ms) / 1000.0;
    char ckey[17], why[256];
    brk_cq_request(b->cat, r->client_id, w->route.name, msg_hex64(res->key_hash, hex), res->version, r->steps,
                   res->stats.captured, res->stats.replayed, res->stats.eager, secs, "ok", res->encode_seconds,
                   res->decode_seconds, res->stats.batched, res->stats.batch_rows, res->stats.padded_rows, res->stats.capture_key ? msg_hex64(res->stats.capture_key, ckey) : NULL,
                   eager_reasons(&res->stats.declines, why, sizeof why), NULL, started_at(r), r->id);
    req_free(b, r);
}

/* e as the client gets it: a code that is not one of docs/PROTOCOL.md's,
 * or `standby` or `shutdown` (a broker's words: they would send a pair's
 * client to the other broker, or have a client wait for another broker),
 * is `internal`, the message naming the worker's code
 * (printable bytes only) -- clients switch on the code, and the metrics'
 * outcome labels and the catalog's statuses stay the documented set. */
static const msg_error_t *worker_error(const brk_worker_t *w, const msg_error_t *e, msg_error_t *out) {
    if (wire_code_known(e->code) && strcmp(e->code, WIRE_E_STANDBY) && strcmp(e->code, WIRE_E_SHUTDOWN)) return e;
    char code[sizeof e->code];
    size_t i = 0;
    for (; e->code[i] && i < sizeof code - 1; i++)
        code[i] = e->code[i] >= 0x20 && e->code[i] < 0x7f && e->code[i] != '\'' ? e->code[i] : '?';
    code[i] = '\0';
    snprintf(out->code, sizeof out->code, "%s", WIRE_E_INTERNAL);
    snprintf(out->message, sizeof out->message, "worker %s answered with the code '%s', not one of the protocol's: %.*s",
             w->route.name, code, (int)(sizeof out->message / 2), e->message);
    return out;
}

void brk_req_error(brk_t *b, brk_worker_t *w, uint64_t id, const msg_error_t *we) {
    msg_error_t fixed;
    const msg_error_t *e = worker_error(w, we, &fixed);
    char detail[300];
    snprintf(detail, sizeof detail, "%s: %.256s", e->code, e->message);
    brk_req_t *r = held_by(b, w, id, MSG_ERROR, detail);
    if (!r) return;
    if (!strcmp(e->code, WIRE_E_UNKNOWN)) {
        /* About a message the worker does not know (a CANCEL to a worker
         * older than it), never the request's answer: it still runs it,
         * and its slot stays taken until that answer comes. */
        brk_log_limited(&w->log, w->route.name, "worker %s: %s (request %llu runs on)", w->route.name, detail,
                        (unsigned long long)id);
        return;
    }
    if (!settle_slot(b, w, r, MSG_ERROR)) return;
    (void)brk_client_send(b, CLIENT(r), MSG_ERROR, r->client_id, e, NULL); /* (held when its queue is full) */
    record_failure(b, r, w->route.name, e->code, e->message);
    req_free(b, r);
}

/* A request held by a worker that died: requeue once, or ERROR
 * worker_lost. */
static void req_lost(brk_t *b, brk_req_t *r, const char *worker) {
    if (r->state == REQ_ABANDONED) {
        req_free(b, r);
        return;
    }
    r->worker = NULL;
    r->progress_at = r->progress_of = 0;
    if (r->losses++ >= 1) {
        brk_log_kind(&b->request_log, BRK_REQUEST_ENDS,
                     "request %llu failed: worker_lost (%s was the second worker to die with it)",
                     (unsigned long long)r->id, worker);
        char why[160];
        snprintf(why, sizeof why, "worker %s died with the request (second loss)", worker);
        brk_error_to(b, false, CLIENT(r), r->client_id, WIRE_E_WORKER_LOST, "%s", why);
        record_failure(b, r, worker, WIRE_E_WORKER_LOST, why);
        req_free(b, r);
        return;
    }
    r->state = REQ_QUEUED;
    if (brk_queue_push_front(&b->queue, r) < 0) {
        brk_error_to(b, false, CLIENT(r), r->client_id, WIRE_E_INTERNAL,
                       "broker out of memory requeueing after %s died", worker);
        record_failure(b, r, worker, WIRE_E_INTERNAL, "broker out of memory requeueing after its worker died");
        req_free(b, r);
        return;
    }
    brk_log_kind(&b->request_log, BRK_REQUEST_ENDS, "request %llu requeued after losing %s",
                 (unsigned long long)r->id, worker);
    b->metrics.requeues++;
}

void brk_req_worker_lost(brk_t *b, const brk_worker_t *w) {
    for (brk_req_t *r = b->reqs, *next; r; r = next) {
        next = r->next;
        if (r->worker == w) req_lost(b, r, w->route.name);
    }
}

/* ---- cancels ---------------------------------------------------------------------------- */

/* Whether two routing identities are the same connection's. */
static bool same_identity(const zmq_msg_t *a, const zmq_msg_t *b) {
    size_t n = zmq_msg_size((zmq_msg_t *)a);
    return n == zmq_msg_size((zmq_msg_t *)b) && !memcmp(zmq_msg_data((zmq_msg_t *)a), zmq_msg_data((zmq_msg_t *)b), n);
}

/* The live request a CANCEL names: with a client token, the GEN of that
 * token and id (from any connection: a resend's rule); without, the GEN
 * of that id the same connection holds. NULL when none is live. */
static brk_req_t *cancel_target(brk_t *b, const wire_msg_t *m, uint64_t client) {
    if (client) {
        for (brk_req_t *r = *client_bucket(b, client, m->id); r; r = r->ck_next)
            if (r->client == client && r->client_id == m->id) return r;
        return NULL;
    }
    for (brk_req_t *r = b->reqs; r; r = r->next)
        if (r->client_id == m->id && r->state != REQ_ABANDONED && same_identity(CLIENT(r), &m->identity)) return r;
    return NULL;
}

void brk_req_cancel(brk_t *b, const wire_msg_t *m, const msg_cancel_t *c) {
    brk_req_t *r = cancel_target(b, m, c->client);
    if (!r || r->state == REQ_ABANDONED) {
        b->cancels_unknown++;
        return; /* answered already, or never sent: its one final reply went, or goes, as it would */
    }
    const bool queued = r->state == REQ_QUEUED;
    long long waited = (long long)(brk_now_ms() - r->accepted_ms);
    char why[160];
    snprintf(why, sizeof why, "cancelled by its client after %lld ms (%s)", waited,
             queued ? "it had not started" : "its worker stops it at its next step");
    brk_error_to(b, false, CLIENT(r), r->client_id, WIRE_E_CANCELLED, "%s", why);
    record_failure(b, r, queued ? NULL : r->worker->route.name, WIRE_E_CANCELLED, why);
    b->cancels++;
    if (queued) {
        brk_log_kind(&b->request_log, BRK_REQUEST_ENDS, "request %llu cancelled by its client while queued",
                     (unsigned long long)r->id);
        queue_drop(b, r);
        req_free(b, r);
        return;
    }
    /* Running: the worker drops it before its next step and answers; that
     * late answer frees the slot, as a timed-out request's does. */
    brk_log_kind(&b->request_log, BRK_REQUEST_ENDS, "request %llu cancelled by its client while running on %s",
                 (unsigned long long)r->id, r->worker->route.name);
    msg_cancel_t none = { 0 };
    if (brk_worker_send(b, r->worker, MSG_CANCEL, r->id, &none, NULL) != 0) brk_undelivered(b, "CANCEL");
    client_unlink(b, r);
    r->state = REQ_ABANDONED;
    /* Its slot is freed by the worker's answer; failing that (a CANCEL
     * lost, a worker older than CANCEL, a request a sync drain holds), no
     * sooner than a grace past its own deadline, by which the worker drops
     * it anyway: never while the worker may still run it. */
    int64_t now = brk_now_ms();
    r->deadline_ms = (r->deadline_ms > now ? r->deadline_ms : now) + ABANDON_GRACE_MS;
}

/* ---- deadlines and shutdown ------------------------------------------------------------ */

void brk_req_timers(brk_t *b, int64_t now) {
    for (brk_req_t *r = b->reqs, *next; r; r = next) {
        next = r->next;
        if (now < r->deadline_ms) continue;
        if (r->state == REQ_ABANDONED) {
            /* Its worker never answered, even late (a lost reply): free the
             * slot so the worker's capacity does not leak away. */
            brk_log_kind(&b->request_log, BRK_REQUEST_ENDS,
                         "request %llu: no late answer from %s by %d ms past its deadline; its slot is freed",
                         (unsigned long long)r->id, r->worker->route.name, ABANDON_GRACE_MS);
            r->worker->route.inflight--;
            req_free(b, r);
            brk_pump(b);
            continue;
        }
        long long waited = (long long)(now - r->accepted_ms);
        char why[512];
        if (!r->had_owner) {
            const char *solver = msg_gen_solver(&r->gen);
            bool named = strcmp(solver, "euler") != 0;
            bool text = r->needs & 1u << BRK_CAP_PROMPT, vae = r->needs & 1u << BRK_CAP_DECODE;
            char at[64] = ""; /* (no version asked before any sync: any) */
            if (r->required)
                snprintf(at, sizeof at, " at %s version >= %llu", BRK_COMPONENT, (unsigned long long)r->required);
            snprintf(why, sizeof why, "no live worker serves model %s%s%s%s%s%s%s%s (waited %lld ms)",
                     r->model, at, named ? " with solver " : "",
                     named && r->gen.sde ? "sde-" : "", named ? solver : "",
                     named ? " (a worker older than solvers runs Euler only, and one older than sde-unipc and "
                             "sde-dpm++ no SDE rollout on those grids)" : "",
                     text ? " with a text encoder (for the 'prompt')" : "",
                     vae ? " with a VAE (for output frames or video)" : "", waited);
            brk_error_to(b, false, CLIENT(r), r->client_id, WIRE_E_NO_WORKER, "%s", why);
            brk_log_kind(&b->request_log, BRK_REQUEST_ENDS, "request %llu failed: no_worker (model %s, version %llu)",
                         (unsigned long long)r->id, r->model, (unsigned long long)r->required);
        } else {
            /* the deadline as given, and the time it took the loop to see it
             * pass; the broker knows it sent a request, not whether its
             * worker started it (a drain-mode worker holds it while a sync
             * waits) */
            char where[96];
            if (r->state == REQ_QUEUED) snprintf(where, sizeof where, "waiting for a slot");
            else snprintf(where, sizeof where, "sent to %.63s, no answer yet", r->worker->route.name);
            snprintf(why, sizeof why, "no result within its deadline of %lld ms (%s; failed after %lld ms)",
                     (long long)(r->deadline_ms - r->accepted_ms), where, waited);
            brk_error_to(b, false, CLIENT(r), r->client_id, WIRE_E_TIMEOUT, "%s", why);
            brk_log_kind(&b->request_log, BRK_REQUEST_ENDS, "request %llu failed: timeout (%s%s)",
                         (unsigned long long)r->id, r->state == REQ_QUEUED ? "queued" : "running on ",
                         r->state == REQ_QUEUED ? "" : r->worker->route.name);
        }
        record_failure(b, r, r->worker ? r->worker->route.name : NULL,
                       r->had_owner ? WIRE_E_TIMEOUT : WIRE_E_NO_WORKER, why);
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

/* Stopping (SIGTERM, SIGINT): every request held is answered `shutdown`
 * -- not a failure: the client libraries wait for the broker that comes
 * back (a new boot id) and send it again there, as after a crash
 * (docs/PROTOCOL.md "Delivery"); one stopped for good leaves them to
 * their timeouts. Nothing goes to the catalog: the next broker records
 * what it runs. */
void brk_req_shutdown(brk_t *b) {
    brk_req_give_up(b, WIRE_E_SHUTDOWN, "the broker is shutting down before it ran this request to its end: send it "
                    "again to the broker that comes back (the client libraries do, until their timeout)");
}

void brk_req_give_up(brk_t *b, const char *code, const char *why) {
    while (b->reqs) {
        brk_req_t *r = b->reqs;
        if (r->state != REQ_ABANDONED) brk_error_to(b, false, CLIENT(r), r->client_id, code, "%s", why);
        /* a step-down's requests are in this catalog, as given up (a
         * shutdown's never were: the restarted broker runs them again) */
        if (strcmp(code, WIRE_E_SHUTDOWN) && r->state != REQ_ABANDONED) /* (abandoned: recorded when answered) */
            record_failure(b, r, r->worker ? r->worker->route.name : NULL, code, why);
        if (r->state == REQ_QUEUED) queue_drop(b, r);
        req_free(b, r);
    }
}
