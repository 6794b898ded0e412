/* brk_ha.c -- a standby pair (brk_ha.h): the state, the PEER each broker
 * sends the other, the fencing rule, taking over and stepping down. */
#include "broker/brk_ha.h"
#include "broker/brk_ha_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "broker/brk_log.h"
#include "broker/brk_deliver.h"
#include "broker/brk_msg.h"
#include "broker/brk_requests.h"
#include "broker/brk_sync.h"
#include "base/error.h"
#include "net/keys.h"

static uint64_t mix(uint64_t h, uint64_t x) { return (h ^ x) * 0x100000001b3ull; }

static uint64_t mix_text(uint64_t h, const char *s) {
    for (; *s; s++) h = mix(h, (unsigned char)*s);
    return mix(h, 0xff);
}

uint64_t brk_ha_key_gen(const msg_gen_t *g, uint64_t id) {
    return g->client ? mix(mix(0xcbf29ce484222325ull, g->client), id) | 1 : 0;
}

uint64_t brk_ha_key_weights(uint64_t client, const char *component, uint64_t version, const char *sha256) {
    if (!client) return 0;
    return mix(mix(mix_text(mix_text(0x84222325cbf29ce4ull, component), sha256), version), client) | 1;
}

/* Whether key was answered standby within the last `within` ms on a
 * connection other than `conn` (its routing id's hash): the client moved
 * away and came back. Notes (key, conn) now either way. */
static bool came_back(struct brk_ha *h, uint64_t key, uint64_t conn, int64_t now, int64_t within) {
    if (!key) return false;
    bool back = false, noted = false;
    for (int i = 0; i < BRK_HA_REFUSED; i++) {
        if (h->refused[i].key != key || now - h->refused[i].at > within) continue;
        if (h->refused[i].conn != conn) back = true;
        else noted = true;
    }
    if (!noted) {
        h->refused[h->next_refused].key = key;
        h->refused[h->next_refused].conn = conn;
        h->refused[h->next_refused].at = now;
        h->next_refused = (h->next_refused + 1) % BRK_HA_REFUSED;
    }
    return back;
}

static uint64_t conn_of(const wire_msg_t *m) {
    if (!m->has_identity) return 0;
    const unsigned char *p = zmq_msg_data((zmq_msg_t *)&m->identity);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < zmq_msg_size((zmq_msg_t *)&m->identity); i++) h = mix(h, p[i]);
    return h | 1;
}

static const char *const names[] = { "starting", "active", "standby" };

const char *brk_ha_name(brk_ha_state_t s) { return (unsigned)s < 3 ? names[s] : "?"; }

int brk_ha_parse(const char *text) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(text, names[i])) return i;
    return -1;
}

brk_ha_state_t brk_ha_next(const brk_ha_view_t *v) {
    if (v->state == BRK_HA_ACTIVE) {
        /* Two actives: the higher term keeps it, the primary at the same term. */
        if (v->peer_heard && v->peer == BRK_HA_ACTIVE &&
            (v->peer_term > v->term || (v->peer_term == v->term && !v->primary)))
            return BRK_HA_STANDBY;
        return BRK_HA_ACTIVE;
    }
    if (v->peer_heard) {
        if (v->peer == BRK_HA_ACTIVE) return BRK_HA_STANDBY;
        /* Neither serves: the primary takes it (the backup waits for it). */
        if (v->primary && (v->peer == BRK_HA_STANDBY || v->state == BRK_HA_STARTING)) return BRK_HA_ACTIVE;
        return BRK_HA_STANDBY;
    }
    if (v->peer_silent) return v->client_asks ? BRK_HA_ACTIVE : BRK_HA_STANDBY;
    return v->state;
}

/* ---- the view, the transitions --------------------------------------------------- */

static brk_ha_view_t view(const brk_t *b, int64_t now, bool client_asks) {
    const struct brk_ha *h = b->ha;
    brk_ha_view_t v = { .state = h->state, .primary = h->primary, .term = h->term, .client_asks = client_asks };
    v.peer_heard = h->seen_ms && now - h->seen_ms < h->timeout_ms;
    /* Both given the same --role (a mistake, warned about): the older
     * process (the lower boot id) acts as the primary, so the rules still
     * pick one active broker. */
    if (v.peer_heard && h->peer_primary == h->primary) v.primary = b->boot < h->peer_boot;
    v.peer = h->peer;
    v.peer_term = h->peer_term;
    v.peer_silent = !v.peer_heard && now - (h->seen_ms ? h->seen_ms : h->started_ms) >= h->timeout_ms;
    return v;
}

static void send_peer(brk_t *b, int64_t now);

/* The peer's current versions, newer than ours, become ours: workers that
 * join are caught up to them and requests need them (the catalog records
 * each as current, taken over from the peer). */
static void adopt_syncs(brk_t *b) {
    struct brk_ha *h = b->ha;
    for (int i = 0; i < h->n_syncs; i++) {
        char why[160];
        snprintf(why, sizeof why, "current at the peer broker (term %" PRIu64 ") when this one took over", h->peer_term);
        int rc = brk_sync_adopt(b, &h->syncs[i], why);
        if (rc < 0)
            brk_log("takeover: %s v%" PRIu64 " not adopted: %s", h->syncs[i].component, h->syncs[i].version,
                    reel_err_text());
        else if (rc > 0)
            brk_log("takeover: %s v%" PRIu64 " is current (the peer's)", h->syncs[i].component, h->syncs[i].version);
    }
}

static void become_active(brk_t *b, int64_t now, const char *why) {
    struct brk_ha *h = b->ha;
    h->term = (h->term > h->peer_term ? h->term : h->peer_term) + 1;
    h->state = BRK_HA_ACTIVE;
    b->active_ms = now; /* the workers move here now: a SYNC before they do is held for them */
    brk_log("active (term %" PRIu64 "): %s", h->term, why);
    brk_ha_copy_stop(b, "this broker took over");
    adopt_syncs(b);
    send_peer(b, now); /* the peer learns it at once */
}

/* Active no more: whatever it holds is answered standby (clients send it
 * again to the other broker: a result is the same wherever it is
 * computed), and its workers are told to go there. */
static void step_down(brk_t *b, int64_t now, const char *why) {
    struct brk_ha *h = b->ha;
    h->state = BRK_HA_STANDBY;
    brk_log("standby: %s", why);
    brk_ha_copy_stop(b, "this broker stepped down");
    char msg[256];
    snprintf(msg, sizeof msg, "this broker stepped down to standby (%s): send it to the other broker", why);
    brk_req_give_up(b, WIRE_E_STANDBY, msg);
    brk_sync_give_up(b, WIRE_E_STANDBY, msg);
    for (int i = 0; i < b->n_w; i++) {
        brk_worker_t *w = b->w[i];
        if (w->dead) continue;
        brk_send_error(b->workers, &w->ident, 0, WIRE_E_STANDBY, "%s", msg);
        w->dead = true;
        w->dead_why = "standby";
    }
    send_peer(b, now);
}

static void apply(brk_t *b, int64_t now, brk_ha_state_t next, const char *why) {
    struct brk_ha *h = b->ha;
    if (next == h->state) return;
    if (next == BRK_HA_ACTIVE) become_active(b, now, why);
    else if (h->state == BRK_HA_ACTIVE) step_down(b, now, why);
    else {
        h->state = next;
        brk_log("%s: %s", brk_ha_name(next), why);
    }
}

/* ---- PEER ---------------------------------------------------------------------------- */

static void send_peer(brk_t *b, int64_t now) {
    struct brk_ha *h = b->ha;
    msg_peer_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.state, sizeof p.state, "%s", brk_ha_name(h->state));
    snprintf(p.role, sizeof p.role, "%s", h->primary ? "primary" : "backup");
    p.term = h->term;
    p.boot = b->boot;
    snprintf(p.clients, sizeof p.clients, "%s", b->opt.clients);
    msg_sync_t syncs[BRK_HA_SYNCS];
    /* (a standby's too: what it made current while it was active, which
     * the active one may not have heard: brk_ha_peer). An adapter's base
     * first: the peer adopts them in order and keeps it as the base
     * (docs/PROTOCOL.md, "A worker below the base"), and copies its file. */
    for (int i = 0; i < b->n_cur; i++) {
        if (b->cur[i].sync && b->cur[i].base) syncs[p.n_syncs++] = *b->cur[i].base;
        if (b->cur[i].sync) syncs[p.n_syncs++] = *b->cur[i].sync;
    }
    p.syncs = syncs;
    /* Never waits (ZMQ_SNDTIMEO 0): a peer that is not there misses it. */
    (void)msg_peer_send(h->sock, NULL, 0, &p);
    h->next_send_ms = now + b->opt.heartbeat_ms;
}

void brk_ha_peer(brk_t *b, const wire_msg_t *m, const msg_peer_t *p) {
    (void)m;
    struct brk_ha *h = b->ha;
    if (!h) {
        static int64_t logged;
        int64_t now = brk_now_ms();
        if (!logged || now - logged >= 60000) { /* it comes every heartbeat */
            logged = now;
            brk_log("a PEER came, but this broker has no --peer: ignored (is another broker configured with this "
                    "one as its peer?)");
        }
        return;
    }
    int st = brk_ha_parse(p->state);
    if (st < 0) {
        brk_log_kind(&b->refused_log, "PEER refused", "PEER with an unknown state '%.32s': ignored", p->state);
        return;
    }
    bool peer_primary = !strcmp(p->role, "primary");
    int64_t now = brk_now_ms();
    if (peer_primary == h->primary && (!h->role_warned_ms || now - h->role_warned_ms >= 60000)) {
        h->role_warned_ms = now;
        brk_log("warning: the peer says it is the %s too: give the two brokers different --role (meanwhile the "
                "older process acts as the primary)", p->role);
    }
    h->peer_primary = peer_primary;
    if (!h->seen_ms || now - h->seen_ms >= h->timeout_ms)
        brk_log("peer heard: %s, term %" PRIu64 " (%s)", p->state, p->term, p->clients[0] ? p->clients : "?");
    h->seen_ms = now;
    h->silence_logged = false;
    h->peer = (brk_ha_state_t)st;
    h->peer_term = p->term;
    h->peer_boot = p->boot;
    h->n_syncs = 0;
    for (size_t i = 0; i < p->n_syncs && h->n_syncs < BRK_HA_SYNCS; i++) {
        msg_sync_t *s = &h->syncs[h->n_syncs++];
        *s = p->syncs[i];
        s->n_tensors = 0;
        memset(s->tensors, 0, sizeof s->tensors);
    }
    char why[128];
    snprintf(why, sizeof why, "the peer is %s at term %" PRIu64, p->state, p->term);
    brk_ha_view_t v = view(b, now, false);
    brk_ha_state_t next = brk_ha_next(&v);
    if (h->state == BRK_HA_ACTIVE && next == BRK_HA_ACTIVE) {
        /* This one stays active: versions the other made current that
         * this one never heard of stay current here (the workers that
         * applied them come here): made while both were active (a
         * partition; the other may have stepped down before this one
         * heard it active), or just before the other died (its last
         * PEER lost), announced when it is back as the standby. */
        for (int i = 0; i < h->n_syncs; i++) {
            char r[160];
            snprintf(r, sizeof r, "current at the peer broker (term %" PRIu64 ", %s now), which this one had not heard",
                     p->term, p->state);
            if (brk_sync_adopt(b, &h->syncs[i], r) > 0)
                brk_log("%s v%" PRIu64 " is current: the peer (%s, term %" PRIu64 ") made it so and this broker had "
                        "not heard it", h->syncs[i].component, h->syncs[i].version, p->state, p->term);
        }
    }
    apply(b, now, next, why);
    brk_ha_copy_consider(b, now); /* the uploaded versions this one lacks, from the peer */
}

/* ---- clients and workers of a standby -------------------------------------------------- */

bool brk_ha_active(const brk_t *b) { return !b->ha || b->ha->state == BRK_HA_ACTIVE; }

bool brk_ha_client(brk_t *b, const wire_msg_t *m, uint64_t key) {
    struct brk_ha *h = b->ha;
    if (!h || h->state == BRK_HA_ACTIVE) return true;
    int64_t now = brk_now_ms();
    /* back within a few peer timeouts: a client's round over the pair */
    bool back = came_back(h, key, conn_of(m), now, 10 * h->timeout_ms + 60000);
    brk_ha_view_t v = view(b, now, back);
    if (brk_ha_next(&v) == BRK_HA_ACTIVE) {
        char why[160];
        snprintf(why, sizeof why, "a client's %s came back and the peer has been silent for %" PRId64 " ms", m->type,
                 now - (h->seen_ms ? h->seen_ms : h->started_ms));
        become_active(b, now, why);
        return true;
    }
    if (m->has_identity && brk_reply_allowed(b, &m->identity)) {
        if (v.peer_heard && h->peer == BRK_HA_ACTIVE)
            brk_error_to(b, false, &m->identity, m->id, WIRE_E_STANDBY,
                         "%s: this broker is the standby; the active one is %s", m->type,
                         b->opt.peer); /* (where this broker reaches it: the peer's own may be a wildcard bind) */
        else
            brk_error_to(b, false, &m->identity, m->id, WIRE_E_STANDBY,
                         "%s: this broker is %s and its peer was heard %" PRId64 " ms ago (it takes over after %" PRId64
                         " ms of silence)",
                         m->type, brk_ha_name(h->state), h->seen_ms ? now - h->seen_ms : now - h->started_ms,
                         h->timeout_ms);
    }
    return false;
}

void brk_ha_worker(brk_t *b, const wire_msg_t *m) {
    if (msg_type(m) != MSG_READY || !m->has_identity || !brk_reply_allowed(b, &m->identity)) return;
    const struct brk_ha *h = b->ha;
    brk_error_to(b, true, &m->identity, m->id, WIRE_E_STANDBY, "this broker is %s; the active one is %s (clients at %s)",
                 brk_ha_name(h->state), h->peer == BRK_HA_ACTIVE ? "its peer" : "not known yet", b->opt.peer);
}

void brk_ha_timers(brk_t *b, int64_t now) {
    struct brk_ha *h = b->ha;
    if (!h) return;
    brk_ha_copy_timers(b, now);
    brk_ha_view_t v = view(b, now, false);
    if (v.peer_silent && !h->silence_logged) {
        h->silence_logged = true;
        if (h->seen_ms)
            brk_log("peer silent for %" PRId64 " ms (it was %s); %s", now - h->seen_ms, brk_ha_name(h->peer),
                    h->state == BRK_HA_ACTIVE ? "still active" : "a client's request now makes this one active");
        else
            brk_log("peer not heard in %" PRId64 " ms since start; %s", now - h->started_ms,
                    h->state == BRK_HA_ACTIVE ? "still active" : "a client's request now makes this one active");
    }
    apply(b, now, brk_ha_next(&v), v.peer_silent ? "the peer is silent" : "the peer's state");
    if (now >= h->next_send_ms) send_peer(b, now);
}

void *brk_ha_socket(const brk_t *b) { return b->ha ? b->ha->sock : NULL; }

void brk_ha_answers(brk_t *b) {
    struct brk_ha *h = b->ha;
    wire_msg_t *m = h ? brk_msg_new(b) : NULL;
    if (!m) return; /* (no memory: read at the next poll) */
    /* The copy's answers; anything else (an older peer's ERROR
     * unknown_type to a PEER) is read so it does not pile up, and dropped. */
    for (int i = 0; i < 64; i++) {
        wire_err_t err;
        int rc = msg_recv(h->sock, false, ZMQ_DONTWAIT, m, &err);
        if (rc < 0) break;
        if (rc == 0) brk_ha_copy_answer(b, m);
        wire_msg_close(m);
    }
    brk_msg_free(b, m);
}

int64_t brk_ha_next_wake(const brk_t *b) { return b->ha ? b->ha->next_send_ms : INT64_MAX; }

void brk_ha_status(const brk_t *b, msg_status_reply_t *r) {
    const struct brk_ha *h = b->ha;
    if (!h) return;
    int64_t now = brk_now_ms();
    snprintf(r->ha_state, sizeof r->ha_state, "%s", brk_ha_name(h->state));
    snprintf(r->ha_role, sizeof r->ha_role, "%s", h->primary ? "primary" : "backup");
    r->ha_term = h->term;
    bool heard = h->seen_ms && now - h->seen_ms < h->timeout_ms;
    snprintf(r->ha_peer, sizeof r->ha_peer, "%s", heard ? brk_ha_name(h->peer) : "silent");
}

/* ---- start, stop ------------------------------------------------------------------------ */

int brk_ha_start(brk_t *b) {
    if (!b->opt.peer) return 0;
    struct brk_ha *h = calloc(1, sizeof *h);
    msg_sync_t *syncs = calloc(BRK_HA_SYNCS, sizeof *syncs);
    if (!h || !syncs) {
        free(h);
        free(syncs);
        return reel_fail(REEL_E_NOMEM, "out of memory");
    }
    h->syncs = syncs;
    h->primary = b->opt.primary;
    h->state = BRK_HA_STARTING;
    h->timeout_ms = b->opt.peer_timeout_ms ? (int64_t)b->opt.peer_timeout_ms
                                           : (int64_t)b->opt.heartbeat_ms * b->opt.liveness;
    h->started_ms = brk_now_ms();
    h->next_send_ms = h->started_ms;
    b->ha = h;
    reel_curve_t curve;
    memset(&curve, 0, sizeof curve);
    if (b->opt.keys) {
        /* (curve is zeroed on every path below) The pair shares one key pair: this broker's is the client's key
         * and, public, the server's (docs/SECURITY.md "A standby pair"). */
        char own[4096];
        if (b->opt.key) snprintf(own, sizeof own, "%s", b->opt.key);
        else snprintf(own, sizeof own, "%s/broker.key", b->opt.keys);
        if (reel_key_read(own, true, &curve.self) != 0) {
            explicit_bzero(&curve, sizeof curve);
            goto err;
        }
        curve.on = true;
        snprintf(curve.server_key, sizeof curve.server_key, "%s", curve.self.public_key);
    }
    int zero = 0;
    h->sock = zmq_socket(b->ctx, ZMQ_DEALER);
    /* Nothing queued while the peer is away (ZMQ_IMMEDIATE), and little
     * while it is slow: a PEER is only worth its latest state, and an old
     * one delivered late would tell a restarted peer what is no longer so.
     * Room for the standby's copy window (small FETCHes) beside them. */
    int one = 1, few = 4 + BRK_HA_COPY_WINDOW;
    char pep[1024];
    if (!h->sock || wire_socket_limits(h->sock) != 0 || zmq_setsockopt(h->sock, ZMQ_SNDTIMEO, &zero, sizeof zero) ||
        zmq_setsockopt(h->sock, ZMQ_IMMEDIATE, &one, sizeof one) || zmq_setsockopt(h->sock, ZMQ_SNDHWM, &few, sizeof few) ||
        reel_curve_apply(h->sock, &curve) != 0 || wire_socket_endpoint(h->sock, b->opt.peer, pep, sizeof pep) != 0 ||
        zmq_connect(h->sock, pep) != 0) {
        explicit_bzero(&curve, sizeof curve);
        reel_fail(REEL_E_IO, "cannot connect to the peer broker '%s': %s", b->opt.peer, zmq_strerror(zmq_errno()));
        goto err;
    }
    explicit_bzero(&curve, sizeof curve);
    brk_log("one of a pair: %s, peer %s; starting (peer timeout %" PRId64 " ms)", h->primary ? "primary" : "backup",
            b->opt.peer, h->timeout_ms);
    return 0;
err:
    brk_ha_stop(b);
    return -1;
}

void brk_ha_stop(brk_t *b) {
    struct brk_ha *h = b->ha;
    if (!h) return;
    if (h->sock) zmq_close(h->sock);
    free(h->syncs);
    free(h);
    b->ha = NULL;
}
