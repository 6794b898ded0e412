/* client.c -- the broker client (see client.h). */
#include "client.h"
#include "client_int.h"
#include "base/error.h"
#include "net/keys.h"
#include <limits.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <time.h>

#define MAX_BROKERS 4

struct reel_client {
    void *ctx;
    void *sock;                 /* the DEALER: NULL until the first call (cli_call_begin opens it) */
    void *mon;                  /* the reader of sock's handshake watch (libzmq's monitor): only while a call
                                 * runs, until the broker answered on sock; NULL otherwise */
    uint64_t mon_seq;
    bool in_call;               /* a call runs: a socket opened now is watched from before its connect */
    bool answered;              /* the broker answered on sock (or its handshake succeeded): no watch again */
    bool unsendable;            /* a send on sock waited out its deadline (no pipe: see cli_call_begin) */
    int hs_kind;                /* the verdict: the last handshake failure seen (HS_*), HS_NONE after a success */
    uint32_t hs_value;          /* its event value (a ZAP status code, a protocol error) */
    bool hs_inherited;          /* the verdict is an earlier socket's (same endpoint): sock's first word replaces it */
    uint64_t hs_events;         /* handshake events read, over the client's life (none is kept) */
    int hs_most;                /* ... the most at one read */
    uint64_t reopens;           /* fresh sockets opened for a dead one (cli_call_begin, refresh_refused) */
    int64_t retry_at;           /* when a call replaces its socket refused for good (0: not due) */
    int retry_ms;               /* ... the wait before the next such socket (backoff, per call) */
    bool refreshed;             /* the call's socket was replaced so: what it awaits goes again */
    int64_t shut_at;            /* when, in this call, a broker answered `shutdown` (0: none) */
    char hint[400];             /* what a timeout adds: why the broker never let this client in */
    char eps[MAX_BROKERS][256]; /* the endpoint list: a broker, or a standby pair */
    int n_eps, at;              /* ... and the one sock is connected to */
    reel_curve_t curve;         /* kept for the sockets of a switch (zeroed at destroy) */
    uint64_t switches;          /* moves to another endpoint of the list */
    uint64_t next_id;
    uint64_t token;             /* GEN "client": names this client's requests to a resend */
    bool cancelled;             /* a CANCEL went: closing lingers a moment so it leaves */
    atomic_int interrupted;     /* reel_client_interrupt: every wait ends (lock-free: signal-safe) */
    int liveness_ms;            /* silence before a STATUS ping, and before a resend; 0: off */
    uint64_t resends;
    uint64_t boot;              /* the broker's boot id last seen (0: none yet) */
    reel_resend_fn on_resend;
    void *resend_user;
};

#define LIVENESS_DEFAULT_MS 3000
/* A call whose socket the broker refused for good tries a fresh one
 * after 100 ms, then after twice as long each time, up to once a second:
 * an operator who adds the key (and reloads the broker) sees the waiting
 * call go through within a second, and a refused client costs the broker
 * one handshake a second at most. */
#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 1000
/* await_want's answer when the call's socket was replaced by a fresh one
 * (its handshake refused for good): nothing reached a broker on the old
 * one, and the caller sends again what it awaits. */
#define AWAIT_REFRESHED (-2)

void reel_client_interrupt(reel_client_t *c) {
    if (c) atomic_store_explicit(&c->interrupted, 1, memory_order_relaxed);
}

void reel_client_set_liveness(reel_client_t *c, int liveness_ms) { c->liveness_ms = liveness_ms > 0 ? liveness_ms : 0; }
uint64_t reel_client_resends(const reel_client_t *c) { return c->resends; }
void reel_client_on_resend(reel_client_t *c, reel_resend_fn fn, void *user) {
    c->on_resend = fn;
    c->resend_user = user;
}

reel_client_t *reel_client_new(const char *endpoint) { return reel_client_new_keys(endpoint, NULL, NULL); }

/* HS_REFUSED: connection attempts failed and none succeeded since (no
 * broker listening at the endpoint: a tcp connect refused, an ipc path
 * with nothing bound) */
enum { HS_NONE, HS_AUTH, HS_MECHANISM, HS_CLOSED, HS_REFUSED };

/* A verdict after which libzmq never connects that socket again: a key
 * the broker's ZAP handler refused, a mechanism mismatch (protocol errors:
 * libzmq ends the connection's session instead of reconnecting). The
 * socket then has no pipe: nothing it sends leaves, nothing is answered,
 * even once the broker would admit it (a key added and reloaded). */
static bool hs_final(int kind) { return kind == HS_AUTH || kind == HS_MECHANISM; }

/* Stops sock's monitor, then closes its reader mon: in that order.
 * libzmq's IO thread sends each event to the monitor's PAIR with a
 * blocking send: a reader closed while the socket still reports would
 * leave that send, and the IO thread, waiting for ever (no socket of the
 * context is then connected or reaped: a client that switches sockets
 * ran out of them, "Too many open files"). */
static void unwatch(void *sock, void *mon) {
    if (sock) (void)zmq_socket_monitor(sock, NULL, 0); /* (none running: nothing to stop) */
    if (mon) zmq_close(mon);
}

/* A socket and its monitor, closed together (the monitor stopped first). */
static void close_pair(void *sock, void *mon) {
    unwatch(sock, mon);
    if (sock) zmq_close(sock);
}

/* A watch of sock's handshakes: the PAIR reading its monitor's events, or
 * NULL when libzmq gives none (best effort: diagnostics only). A broker
 * that refuses this client's key, or speaks no CURVE, or cannot read its
 * HELLO, never answers, and a timeout is all the caller would see.
 *
 * A watch runs only while a call runs (cli_call_begin, cli_call_end), until the
 * broker's first answer on sock; its events are read as they come (the
 * waits poll it) into one verdict (hs_kind) and not kept. An idle client
 * whose connection keeps failing (nothing listening: ~7 events a second;
 * a broker that hangs up every handshake: ~20) thus piles nothing up and
 * holds one socket, not three. */
static void *watch(reel_client_t *c, void *sock) {
    char ep[80];
    snprintf(ep, sizeof ep, "inproc://reel-client-handshakes-%p-%llu", (void *)c, (unsigned long long)++c->mon_seq);
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED) != 0)
        return NULL;
    int zero = 0;
    void *m = zmq_socket(c->ctx, ZMQ_PAIR);
    /* no high-water mark on the events: the IO thread would block on a
     * full pipe; what bounds the pipe is reading it as events come, and
     * the watch's end with the call */
    if (!m || zmq_setsockopt(m, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(m, ZMQ_RCVHWM, &zero, sizeof zero) != 0 || zmq_connect(m, ep) != 0) {
        unwatch(sock, m);
        return NULL;
    }
    return m;
}

/* The broker answered on c->sock (or its handshake succeeded): no hint to
 * give, and the watch ends for the socket's life (one socket, not three:
 * a context holds 1023). */
static void heard(reel_client_t *c) {
    c->answered = true;
    c->hs_kind = HS_NONE;
    c->hs_inherited = false;
    unwatch(c->sock, c->mon);
    c->mon = NULL;
}

/* Reads the watch's events so far into the verdict c->hs_kind (each is
 * read as it comes while a call waits, the rest when it ends). */
static void read_handshakes(reel_client_t *c) {
    int n = 0;
    for (; c->mon && n < 1024; n++) {
        zmq_msg_t ev;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            break;
        }
        uint16_t id = 0;
        uint32_t v = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&id, zmq_msg_data(&ev), 2);
            memcpy(&v, (const char *)zmq_msg_data(&ev) + 2, 4);
        }
        bool more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) { /* the endpoint */
            zmq_msg_t a;
            zmq_msg_init(&a);
            (void)zmq_msg_recv(&a, c->mon, 0);
            zmq_msg_close(&a);
        }
        c->hs_events++;
        if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            heard(c);
            n++;
            break;
        } else if (id == ZMQ_EVENT_CONNECT_RETRIED) {
            /* a handshake's failure says more, but not an earlier socket's */
            if (c->hs_kind == HS_NONE || c->hs_inherited) c->hs_kind = HS_REFUSED, c->hs_inherited = false;
        } else if (id == ZMQ_EVENT_CONNECTED) {
            if (c->hs_kind == HS_REFUSED) c->hs_kind = HS_NONE, c->hs_inherited = false;
        } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            c->hs_kind = HS_AUTH, c->hs_value = v, c->hs_inherited = false;
        else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && v == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            c->hs_kind = HS_MECHANISM, c->hs_inherited = false;
        else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            c->hs_kind = HS_CLOSED, c->hs_value = v, c->hs_inherited = false;
    }
    if (n > c->hs_most) c->hs_most = n;
}

/* The hint a timeout adds ("" when none). */
const char *cli_handshake_hint(reel_client_t *c) {
    read_handshakes(c);
    c->hint[0] = '\0';
    if (c->hs_kind == HS_AUTH)
        snprintf(c->hint, sizeof c->hint, "; the broker refused this client's key at the handshake (ZAP status %u: a "
                 "key not in its allowlist, or one of another role: docs/SECURITY.md)", (unsigned)c->hs_value);
    else if (c->hs_kind == HS_MECHANISM)
        snprintf(c->hint, sizeof c->hint, "%s", c->curve.on
                 ? "; the handshake failed: this client has CURVE keys and the broker runs without any"
                 : "; the handshake failed: the broker requires CURVE keys and this client has none (set REEL_KEY "
                   "and REEL_BROKER_KEY, or --key and --broker-key: docs/SECURITY.md)");
    else if (c->hs_kind == HS_CLOSED && c->curve.on)
        snprintf(c->hint, sizeof c->hint, "; the broker closed every CURVE handshake: the broker key given "
                 "(--broker-key or REEL_BROKER_KEY) is probably not its public key");
    else if (c->hs_kind == HS_REFUSED)
        snprintf(c->hint, sizeof c->hint, "; nothing accepted a connection at %.200s (is a broker running there? "
                 "--broker names it)", c->eps[c->at]);
    else if (c->hs_kind == HS_CLOSED) /* a keyless broker takes a keyless client: one that requires keys hangs up first */
        snprintf(c->hint, sizeof c->hint, "; the broker closed every handshake: it probably requires CURVE keys and "
                 "this client has none (set REEL_KEY and REEL_BROKER_KEY, or --key and --broker-key: "
                 "docs/SECURITY.md)");
    if (c->in_call && c->shut_at) {
        size_t at = strlen(c->hint);
        snprintf(c->hint + at, sizeof c->hint - at, "; the broker said it was shutting down %lld ms ago and none has "
                 "answered since (the request goes again to the one that comes back)",
                 (long long)(cli_now_ms() - c->shut_at));
    }
    return c->hint;
}

/* Replaces c->sock with a new DEALER connected to c->eps[at], watched
 * from before its connect while a call runs, and closes the old one (its
 * watch stopped first; what it held unsent is dropped: linger 0). A
 * socket to the same endpoint inherits the verdict (its own first event
 * replaces it: a socket replaced outside a watch keeps why the last one
 * failed); one to another endpoint starts with none. Sends on it never
 * block (SNDTIMEO 0: send_msg waits, by a deadline). -1 with the error
 * value, the old socket kept as it was. */
static int replace_socket(reel_client_t *c, int at) {
    void *s = zmq_socket(c->ctx, ZMQ_DEALER), *m = NULL;
    if (!s) return reel_fail(REEL_E_IO, "cannot make a socket: %s", zmq_strerror(zmq_errno()));
    if (reel_curve_apply(s, &c->curve) != 0) {
        zmq_close(s);
        return -1;
    }
    char ep[1024];
    int zero = 0;
    if (wire_socket_limits(s) != 0 || zmq_setsockopt(s, ZMQ_SNDTIMEO, &zero, sizeof zero) != 0 ||
        wire_socket_endpoint(s, c->eps[at], ep, sizeof ep) != 0)
        goto err;
    if (c->in_call) m = watch(c, s); /* before the connect: no event of it is missed */
    if (zmq_connect(s, ep) != 0) goto err;
    close_pair(c->sock, c->mon);
    if (at != c->at) c->hs_kind = HS_NONE;
    c->hs_inherited = c->hs_kind != HS_NONE;
    c->sock = s;
    c->mon = m;
    c->at = at;
    c->answered = c->unsendable = false;
    return 0;
err:;
    const int e = zmq_errno(); /* a malformed or unknown endpoint is the caller's input */
    reel_fail(e == EINVAL || e == EPROTONOSUPPORT || e == ENOCOMPATPROTO || e == ENAMETOOLONG ? REEL_E_INVALID
                                                                                             : REEL_E_IO,
              "cannot connect to broker '%s': %s", c->eps[at], zmq_strerror(e));
    close_pair(s, m);
    return -1;
}

/* Moves to the next endpoint of the list (a standby pair's other broker):
 * a new socket, nothing of the old one's queue kept, no boot id known. */
static int switch_broker(reel_client_t *c) {
    if (c->n_eps < 2) return 0;
    if (replace_socket(c, (c->at + 1) % c->n_eps) != 0) return -1; /* (checked at creation: unlikely) the old stays */
    c->boot = 0;
    c->switches++;
    return 0;
}

/* A fresh socket to the same broker, the old one closed with what it
 * still held unsent (its linger is 0): after a SYNC or an upload that
 * timed out or was interrupted, so that it never reaches a broker that
 * comes back later, applying a sync the caller was told failed. The old
 * socket stays if no new one can be made. */
static void forget_unsent(reel_client_t *c) {
    if (replace_socket(c, c->at) == 0) c->boot = 0;
}

/* After a sync's or an upload's call: one that ended without the
 * broker's answer (a timeout, an interruption, a send or a file that
 * failed midway) leaves nothing queued. */
static int sync_ended(reel_client_t *c, int rc) {
    if (rc < 0) forget_unsent(c);
    return rc;
}

/* Before each call (reel_gen, reel_status, ...): c's socket, opened at the
 * first call; and a fresh one (same endpoint, same keys) in place of one
 * that is dead for good: its handshake refused in a way libzmq never
 * retries (hs_final: a key the broker did not admit then may be admitted
 * since, by a reload), or a send on it that waited out its deadline (no
 * pipe: its connection ended so, whatever the watch saw or missed; or a
 * queue full of what no broker took, dropped with it). Then the socket's
 * watch, while the broker has not answered on it. 0; -1 with err
 * ("internal") when no socket can be made at the first call (a dead one
 * that cannot be replaced stays: the call then times out, saying why). */
int cli_call_begin(reel_client_t *c, wire_err_t *err) {
    c->in_call = true;
    c->shut_at = 0;
    c->retry_at = 0;
    c->retry_ms = RETRY_MIN_MS;
    c->refreshed = false;
    if (!c->sock || c->unsendable || hs_final(c->hs_kind)) {
        bool again = c->sock != NULL;
        if (replace_socket(c, c->at) != 0) {
            if (!c->sock) {
                snprintf(err->code, sizeof err->code, "%s", WIRE_E_INTERNAL);
                snprintf(err->message, sizeof err->message, "%s", reel_err_text());
                c->in_call = false;
                return -1;
            }
        } else if (again) {
            c->reopens++;
            c->boot = 0;
        }
    }
    if (!c->mon && !c->answered) c->mon = watch(c, c->sock);
    return 0;
}

/* After each call: its watch ends, what it saw read into the verdict
 * first (kept for the next call's hint and cli_call_begin). */
void cli_call_end(reel_client_t *c) {
    read_handshakes(c);
    unwatch(c->sock, c->mon);
    c->mon = NULL;
    c->in_call = false;
}

uint64_t reel_client_switches(const reel_client_t *c) { return c->switches; }

const char *reel_client_endpoint(const reel_client_t *c) { return c->eps[c->at]; }

void reel_client_sockets(const reel_client_t *c, reel_client_sockets_t *out) {
    memset(out, 0, sizeof *out);
    out->sockets = (c->sock ? 1 : 0) + (c->mon ? 2 : 0); /* a watch: libzmq's PAIR and its reader */
    out->hs_events = c->hs_events;
    out->hs_read_most = c->hs_most;
    out->fresh = c->reopens;
}

reel_client_t *reel_client_new_keys(const char *endpoint, const char *key_file, const char *broker_key) {
    reel_curve_t curve;
    if (reel_curve_resolve(key_file, broker_key, 1u << REEL_ROLE_CLIENT | 1u << REEL_ROLE_TRAINER, &curve) != 0)
        return NULL;
    reel_client_t *c = calloc(1, sizeof *c);
    if (!c) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    c->curve = curve;
    explicit_bzero(&curve, sizeof curve);
    for (const char *p = endpoint;;) { /* "A" or "A,B": a broker, or a standby pair */
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof c->eps[0] || c->n_eps == MAX_BROKERS) {
            reel_fail(REEL_E_INVALID, "broker endpoint list '%s': 1 to %d endpoints separated by commas", endpoint,
                      MAX_BROKERS);
            reel_client_destroy(&c);
            return NULL;
        }
        memcpy(c->eps[c->n_eps], p, n);
        c->eps[c->n_eps][n] = '\0';
        /* every endpoint of the list is checked now, not at the first call
         * or move, and without a socket: a connect would reach the broker
         * (a handshake it counts, with keys) for a client that may never
         * call; the socket the calls use is opened at the first (call_begin) */
        char why[200];
        if (wire_endpoint_check(c->eps[c->n_eps], why, sizeof why) != 0) {
            reel_fail(REEL_E_INVALID, "broker endpoint '%s': %s", c->eps[c->n_eps], why);
            reel_client_destroy(&c);
            return NULL;
        }
        c->n_eps++;
        if (!p[n]) break;
        p += n + 1;
    }
    c->ctx = zmq_ctx_new();
    if (!c->ctx) {
        reel_fail(REEL_E_IO, "cannot make a ZeroMQ context: %s", zmq_strerror(zmq_errno()));
        reel_client_destroy(&c);
        return NULL;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->next_id = ((uint64_t)ts.tv_nsec << 16) ^ (uint64_t)ts.tv_sec; /* ids unique per client */
    c->next_id &= 0x7fffffffffffull;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &c->token, sizeof c->token) != (ssize_t)sizeof c->token) /* unlikely: still unique enough */
        c->token = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 16);
    if (fd >= 0) close(fd);
    if (!c->token) c->token = 1;
    const char *lv = getenv("REEL_CLIENT_LIVENESS_MS");
    c->liveness_ms = lv && *lv ? atoi(lv) : LIVENESS_DEFAULT_MS;
    if (c->liveness_ms < 0) c->liveness_ms = 0;
    return c;
}

void reel_client_destroy(reel_client_t **cp) {
    if (!cp || !*cp) return;
    if ((*cp)->sock && (*cp)->cancelled) { /* a CANCEL still queued goes out, within 500 ms */
        int linger = 500;
        (void)zmq_setsockopt((*cp)->sock, ZMQ_LINGER, &linger, sizeof linger);
    }
    close_pair((*cp)->sock, (*cp)->mon);
    if ((*cp)->ctx) zmq_ctx_term((*cp)->ctx);
    explicit_bzero(&(*cp)->curve, sizeof (*cp)->curve);
    free(*cp);
    *cp = NULL;
}

int64_t cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cli_set_err(wire_err_t *err, const char *code, const char *fmt, ...) {
    snprintf(err->code, sizeof err->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

/* While a call waits: when the broker refused the handshake of the call's
 * socket for good (hs_final, this socket's own verdict: libzmq never tries
 * it again, and what was sent on it is dropped), a fresh socket (same
 * endpoint, same keys) once the backoff has passed (RETRY_MIN_MS doubling
 * to RETRY_MAX_MS), so that a key the broker admits meanwhile (added and
 * reloaded) lets the waiting call through. The fresh socket inherits the
 * verdict (a timeout still says the key was refused) until its own
 * handshake ends. true, with c->refreshed set, when it replaced the
 * socket; false otherwise (one that cannot be made is tried again after
 * the backoff). */
static bool refresh_refused(reel_client_t *c) {
    if (!c->in_call || c->answered || !hs_final(c->hs_kind) || c->hs_inherited) {
        c->retry_at = 0;
        return false;
    }
    int64_t now = cli_now_ms();
    if (!c->retry_at) c->retry_at = now + c->retry_ms; /* the refusal just seen: the backoff starts */
    if (now < c->retry_at) return false;
    c->retry_ms = c->retry_ms * 2 < RETRY_MAX_MS ? c->retry_ms * 2 : RETRY_MAX_MS;
    c->retry_at = 0;
    if (replace_socket(c, c->at) != 0) {
        c->retry_at = now + c->retry_ms;
        return false;
    }
    c->reopens++;
    c->boot = 0;
    c->refreshed = true;
    return true;
}

/* Sends a message on c->sock (share: as msg_send's) by the deadline,
 * reading the watch's events while it waits for room: the socket never
 * blocks (SNDTIMEO 0), since a DEALER whose connection libzmq ended for
 * good (its handshake refused) has no pipe, and a blocking send waited
 * for ever there, past every timeout and interrupt. A socket the broker
 * refused for good while it waits is replaced (refresh_refused) and the
 * message goes on the fresh one (c->refreshed tells the caller's next
 * await that what went on the old one is lost). A deadline already
 * past: one try. 0; -1 with err: "timeout" (the socket is then replaced
 * at the next call: cli_call_begin), "interrupted", or "internal". */
static int send_msg(reel_client_t *c, msg_type_t type, uint64_t id, const void *body, const wire_msg_t *share,
                    int64_t deadline, wire_err_t *err) {
    for (;;) {
        if (msg_send(c->sock, NULL, type, id, body, share) == 0) return 0;
        if (errno != EAGAIN && errno != EINTR) {
            cli_set_err(err, WIRE_E_INTERNAL, "send: %s", zmq_strerror(errno));
            return -1;
        }
        for (;;) { /* room in the socket's pipe; encoded again only then */
            if (atomic_load_explicit(&c->interrupted, memory_order_relaxed)) {
                cli_set_err(err, REEL_CLIENT_E_INTERRUPTED, "interrupted before the message could be sent");
                return -1;
            }
            int64_t left = deadline - cli_now_ms();
            if (left <= 0) {
                c->unsendable = true;
                cli_set_err(err, WIRE_E_TIMEOUT, "could not send to %s in time: no connection to it%s", c->eps[c->at],
                        cli_handshake_hint(c));
                return -1;
            }
            zmq_pollitem_t it[2] = { { c->sock, 0, ZMQ_POLLOUT, 0 }, { c->mon, 0, ZMQ_POLLIN, 0 } };
            int rc = zmq_poll(it, c->mon ? 2 : 1, left < 100 ? (long)left : 100); /* an interrupt: within 100 ms */
            if (rc < 0 && errno != EINTR) {
                cli_set_err(err, WIRE_E_INTERNAL, "poll: %s", zmq_strerror(errno));
                return -1;
            }
            if (rc > 0 && c->mon && (it[1].revents & ZMQ_POLLIN)) read_handshakes(c);
            if (rc > 0 && (it[0].revents & ZMQ_POLLOUT)) break;
            if (refresh_refused(c)) break; /* no pipe ever again on the old one: the fresh one's */
        }
    }
}

/* The ids a wait takes answers for: up to three of its own (0: none), and
 * those of msgs[0..n_msgs) (a live wait's messages). */
typedef struct {
    uint64_t ids[3];
    const cli_live_msg_t *msgs;
    int n_msgs;
} want_t;

static bool wanted(const want_t *w, uint64_t id) {
    if (!id) return false;
    for (int i = 0; i < 3; i++)
        if (w->ids[i] == id) return true;
    for (int i = 0; i < w->n_msgs; i++)
        if (w->msgs[i].id == id) return true;
    return false;
}

/* Waits for the next message answering an id of w, skipping the others
 * (late answers to earlier calls) and malformed ones; each PROGRESS of
 * those ids goes to fn (NULL: dropped). 0 with *m filled (m->id says
 * which), -1 with err: "timeout" at the deadline, "interrupted",
 * "internal"; or AWAIT_REFRESHED when the call's socket was refused for
 * good and replaced (here or by a send since the last wait:
 * refresh_refused): the caller sends again what it awaits, on the fresh
 * socket, by its own deadline. */
static int await_want(reel_client_t *c, const want_t *w, int64_t deadline, wire_msg_t *m, cli_progress_fn fn,
                      void *user, wire_err_t *err) {
    read_handshakes(c);
    for (;;) {
        if (atomic_load_explicit(&c->interrupted, memory_order_relaxed)) {
            cli_set_err(err, REEL_CLIENT_E_INTERRUPTED, "interrupted before the broker answered");
            return -1;
        }
        int64_t left = deadline - cli_now_ms();
        if (left <= 0) {
            cli_set_err(err, WIRE_E_TIMEOUT, "no answer from the broker in time%s", cli_handshake_hint(c));
            return -1;
        }
        if (refresh_refused(c) || c->refreshed) {
            c->refreshed = false;
            cli_set_err(err, WIRE_E_TIMEOUT, "the broker refused this client's socket: sent again on a fresh one");
            return AWAIT_REFRESHED;
        }
        /* a signal between the check above and the poll is seen within
         * 100 ms: the wait is cut into such slices; the watch's events
         * are read as they come */
        zmq_pollitem_t it[2] = { { c->sock, 0, ZMQ_POLLIN, 0 }, { c->mon, 0, ZMQ_POLLIN, 0 } };
        int rc = zmq_poll(it, c->mon ? 2 : 1, left < 100 ? (long)left : 100);
        if (rc < 0) {
            if (errno == EINTR) continue;
            cli_set_err(err, WIRE_E_INTERNAL, "poll: %s", zmq_strerror(errno));
            return -1;
        }
        if (rc == 0) continue;
        if (c->mon && (it[1].revents & ZMQ_POLLIN)) read_handshakes(c);
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        wire_err_t e;
        rc = msg_recv(c->sock, false, ZMQ_DONTWAIT, m, &e);
        if (rc < 0) continue;
        if (!c->answered) heard(c); /* the broker answered: its handshake succeeded, the watch ends */
        if (rc == 1 || !wanted(w, m->id)) { /* malformed: not ours to trust; or stale */
            wire_msg_close(m);
            continue;
        }
        if (msg_type(m) == MSG_PROGRESS) {
            msg_progress_t p;
            /* the decode's frames continue the steps: one bar over both */
            if (fn && msg_progress_decode(m, &p, &e) == 0)
                fn(user, m->id, (int)(p.step + p.decoded), (int)(p.steps + p.decode_frames));
            wire_msg_close(m);
            continue;
        }
        return 0;
    }
}

/* A single call's progress function, as await_want passes it on. */
typedef struct {
    reel_progress_fn fn;
    void *user;
} one_progress_t;

static void one_progress(void *user, uint64_t id, int done, int total) {
    const one_progress_t *p = user;
    (void)id;
    p->fn(p->user, done, total);
}

/* Waits for the message answering `id` (or id2, id3: 0 = none; m->id
 * says which), as await_want (AWAIT_REFRESHED included); PROGRESS is
 * passed to fn. */
static int await3(reel_client_t *c, uint64_t id, uint64_t id2, uint64_t id3, int64_t deadline, wire_msg_t *m,
                  reel_progress_fn fn, void *user, wire_err_t *err) {
    const want_t w = { { id, id2, id3 }, NULL, 0 };
    one_progress_t p = { fn, user };
    return await_want(c, &w, deadline, m, fn ? one_progress : NULL, &p, err);
}

/* The answer to id, as await3 (AWAIT_REFRESHED included). */
static int await(reel_client_t *c, uint64_t id, int64_t deadline, wire_msg_t *m, reel_progress_fn fn, void *user,
                 wire_err_t *err) {
    return await3(c, id, 0, 0, deadline, m, fn, user, err);
}

/* ERROR/BUSY -> 1 with err set; else 0. */
int cli_answer_is_error(wire_msg_t *m, wire_err_t *err) {
    msg_type_t t = msg_type(m);
    if (t != MSG_BUSY && t != MSG_ERROR) return 0;
    union {
        msg_error_t error;
        msg_busy_t busy;
    } *a = malloc(sizeof *a);
    wire_err_t why;
    if (!a) {
        cli_set_err(err, WIRE_E_INTERNAL, "out of memory");
    } else if (t == MSG_BUSY ? msg_busy_decode(m, &a->busy, &why) : msg_error_decode(m, &a->error, &why)) {
        cli_set_err(err, WIRE_E_MALFORMED, "unreadable %s: %s", m->type, why.message);
    } else if (t == MSG_BUSY) {
        cli_set_err(err, WIRE_E_BUSY, "%s", a->busy.message[0] ? a->busy.message : "broker busy");
    } else {
        cli_set_err(err, a->error.code, "%s", a->error.message);
    }
    free(a);
    return 1;
}

/* Sends a message of `type` (id, body) and waits for the answer to it: 0
 * with *m holding it, 1 when the broker answered ERROR or BUSY (err set),
 * -1 on transport failure or timeout (err set). A socket refused for good
 * meanwhile is replaced, and the message goes again on the fresh one (it
 * reached no broker: not a resend). */
static int call(reel_client_t *c, msg_type_t type, uint64_t id, const void *body, int timeout_ms,
                reel_progress_fn fn, void *user, wire_msg_t *m, wire_err_t *err) {
    int64_t deadline = cli_now_ms() + timeout_ms;
    for (;;) {
        if (send_msg(c, type, id, body, NULL, deadline, err) != 0) return -1;
        int rc = await(c, id, deadline, m, fn, user, err);
        if (rc == AWAIT_REFRESHED) continue;
        if (rc != 0) return -1;
        break;
    }
    if (cli_answer_is_error(m, err)) {
        wire_msg_close(m);
        return 1;
    }
    return 0;
}

/* After a round of standby answers (a pair still choosing): 200 ms, or
 * what is left before end. */
static void standby_pause(int64_t end) {
    int64_t pause = end - cli_now_ms() < 200 ? end - cli_now_ms() : 200;
    if (pause > 0) nanosleep(&(struct timespec){ 0, (long)pause * 1000000L }, NULL);
}

/* True when m is ERROR with this code. */
static bool is_error(wire_msg_t *m, const char *code) {
    if (msg_type(m) != MSG_ERROR) return false;
    msg_error_t *e = malloc(sizeof *e);
    wire_err_t why;
    bool yes = e && msg_error_decode(m, e, &why) == 0 && !strcmp(e->code, code);
    free(e);
    return yes;
}

/* True when m is ERROR standby: the standby of a pair answered. */
static bool is_standby(wire_msg_t *m) { return is_error(m, WIRE_E_STANDBY); }

/* The boot id in a STATUS_REPLY m, or in a RESULT m (the broker that
 * answered it sets it); 0: none, or unreadable. */
static uint64_t boot_of(wire_msg_t *m) {
    wire_err_t e;
    uint64_t boot = 0;
    if (msg_type(m) == MSG_STATUS_REPLY) {
        msg_status_reply_t *r = malloc(sizeof *r);
        boot = r && msg_status_reply_decode(m, r, &e) == 0 ? r->boot : 0;
        free(r);
    } else if (msg_type(m) == MSG_RESULT) {
        msg_result_t *r = malloc(sizeof *r);
        boot = r && msg_result_decode(m, r, &e) == 0 ? r->boot : 0;
        free(r);
    }
    return boot;
}

int cli_live_begin(reel_client_t *c, cli_live_t *st, int64_t deadline, wire_err_t *err) {
    memset(st, 0, sizeof *st);
    st->boot = c->boot;
    /* The broker's boot id, known from an earlier call or learnt now: a
     * STATUS just before the first message (the first call only). Known,
     * a restart before the messages got there only costs a resend the new
     * broker attaches. */
    if (!c->liveness_ms || c->boot) return 0;
    st->ping = ++c->next_id;
    st->asked = st->first = true;
    return send_msg(c, MSG_STATUS, st->ping, NULL, NULL, deadline, err);
}

int cli_live_send(reel_client_t *c, const cli_live_msg_t *m, int64_t deadline, wire_err_t *err) {
    return send_msg(c, m->type, m->id, m->body, NULL, deadline, err);
}

/* Every message of msgs but the one of id `skip` (0: none) again (the
 * same requests), each told to the on_resend hook with silent_ms first. 0,
 * or -1 with err as send_msg. */
static int resend_all(reel_client_t *c, cli_live_t *st, const cli_live_msg_t *msgs, int n, uint64_t skip,
                      int silent_ms, int64_t deadline, wire_err_t *err) {
    st->resent = true;
    for (int i = 0; i < n; i++) {
        if (skip && msgs[i].id == skip) continue;
        c->resends++;
        if (c->on_resend) c->on_resend(c->resend_user, msgs[i].id, silent_ms);
        if (send_msg(c, msgs[i].type, msgs[i].id, msgs[i].body, NULL, deadline, err) != 0) return -1;
    }
    return 0;
}

/* After the call's socket was refused for good and replaced
 * (AWAIT_REFRESHED): nothing sent on the old one reached a broker, and the
 * wait begins again on the fresh one: with a liveness a STATUS first (no
 * boot id is known there: its answer names the broker), then every
 * message of msgs. Not resends (neither counted nor told to the hook).
 * 0, or -1 with err as send_msg. */
static int live_refreshed(reel_client_t *c, cli_live_t *st, const cli_live_msg_t *msgs, int n, int64_t deadline,
                          wire_err_t *err) {
    st->boot = c->boot;
    st->asked = st->first = st->resent = false;
    st->ping = 0;
    if (c->liveness_ms) {
        st->ping = ++c->next_id;
        if (send_msg(c, MSG_STATUS, st->ping, NULL, NULL, deadline, err) != 0) return -1;
        st->asked = st->first = true;
    }
    for (int i = 0; i < n; i++)
        if (send_msg(c, msgs[i].type, msgs[i].id, msgs[i].body, NULL, deadline, err) != 0) return -1;
    return 0;
}

/* The messages are sent so that a lost broker does not lose them: a
 * STATUS went just before them (cli_live_begin: the broker that answers it
 * is the one they reached, its boot id); after every liveness_ms of
 * silence a STATUS again. They are sent again (same ids; a GEN with the
 * same token, which a broker that holds it only attaches; a SYNC, which is
 * idempotent: docs/PROTOCOL.md "Weight syncs") when that STATUS is not
 * answered within liveness_ms (the broker is gone or stuck), or is
 * answered by another broker (a new boot id: a restart lost them), or
 * when no boot id was learnt. A socket the broker refused for good is
 * replaced meanwhile (with backoff: refresh_refused) and they go again on
 * the fresh one (live_refreshed). */
int cli_live_next(reel_client_t *c, cli_live_t *st, const cli_live_msg_t *msgs, int n, int64_t deadline,
                  wire_msg_t *m, cli_progress_fn fn, void *user, wire_err_t *err) {
    if (!c->liveness_ms) {
        /* no resends on silence; a standby's answer still moves a pair's client on */
        const want_t w = { { 0 }, msgs, n };
        for (;;) {
            int rc = await_want(c, &w, deadline, m, fn, user, err);
            if (rc == AWAIT_REFRESHED) {
                if (live_refreshed(c, st, msgs, n, deadline, err) != 0) return -1;
                continue;
            }
            if (rc != 0) return -1;
            if (c->n_eps < 2 || cli_now_ms() >= deadline || !is_standby(m)) return 0;
            wire_msg_close(m);
            if (++st->standbys % c->n_eps == 0) standby_pause(deadline);
            if (switch_broker(c) != 0) {
                cli_set_err(err, WIRE_E_INTERNAL, "%s", reel_err_text());
                return -1;
            }
            if (resend_all(c, st, msgs, n, 0, -1, deadline, err) != 0) return -1;
        }
    }
    for (;;) {
        int silent = 0; /* why they are sent again: ms without an answer, 0: another broker answered, -1: a standby */
        int64_t until = cli_now_ms() + c->liveness_ms;
        const want_t w = { { st->ping }, msgs, n };
        int rc = await_want(c, &w, until < deadline ? until : deadline, m, fn, user, err);
        if (rc == AWAIT_REFRESHED) {
            if (live_refreshed(c, st, msgs, n, deadline, err) != 0) return -1;
            continue;
        }
        if (rc == 0) {
            if (m->id != st->ping && c->n_eps > 1 && is_standby(m)) {
                /* The standby of a pair: the other broker serves. After
                 * a round of standbys (a pair still choosing), a pause. */
                wire_msg_close(m);
                if (++st->standbys % c->n_eps == 0) standby_pause(deadline);
                if (cli_now_ms() >= deadline) {
                    cli_set_err(err, WIRE_E_TIMEOUT, "no answer from the broker in time: every broker is the standby");
                    return -1;
                }
                silent = -1;
                goto again;
            }
            if (m->id != st->ping && is_error(m, WIRE_E_SHUTDOWN)) {
                /* The broker is stopping (a restart, a deploy): not an
                 * answer. It goes silent, or another boot answers the next
                 * STATUS: the messages go again there, as after a crash
                 * (docs/PROTOCOL.md "Delivery"). A pair's other broker is
                 * asked at once. */
                wire_msg_close(m);
                if (!c->shut_at) c->shut_at = cli_now_ms();
                if (c->n_eps > 1) {
                    silent = 0;
                    goto again;
                }
                continue;
            }
            if (m->id != st->ping) { /* an answer; a RESULT names the broker's boot id for the next call (a
                                      * restart between calls is then no cause to send a GEN again) */
                uint64_t b = boot_of(m);
                if (b) c->boot = b;
                if (b && st->boot && b != st->boot && n > 1) {
                    /* Another broker than the one the others reached (a
                     * restart quicker than a liveness of silence) answered
                     * one sent since: the others it never got go again
                     * now. The answers to those sent since may never
                     * leave the silence a STATUS waits for, and those lost
                     * would wait out their timeouts. (A send that fails
                     * here fails the next wait: this answer is kept.) */
                    wire_err_t e;
                    st->boot = b;
                    (void)resend_all(c, st, msgs, n, m->id, 0, deadline, &e);
                }
                return 0;
            }
            uint64_t now_boot = boot_of(m);
            wire_msg_close(m);
            st->asked = false;
            bool was_first = st->first;
            st->first = false;
            if (was_first && now_boot) {
                st->boot = c->boot = now_boot; /* the broker that holds the messages */
                continue;
            }
            /* the same broker: it still runs (a broker that names no boot
             * is older than resends: it is never sent one on its word) */
            if (!now_boot || (!was_first && now_boot == st->boot)) continue;
            if (!st->boot && st->resent) { /* a late answer: the resend went after it, to this broker */
                st->boot = c->boot = now_boot;
                continue;
            }
            st->boot = c->boot = now_boot; /* another broker (a restart lost them), or none known: send again */
        } else {
            if (strcmp(err->code, WIRE_E_TIMEOUT)) return -1;
            if (cli_now_ms() >= deadline) {
                /* the deadline came while a broker was asked: what the
                 * others answered still says why (a busy machine's pair of
                 * standbys answers slowly, and the last move's answer was
                 * late) */
                if (c->n_eps > 1 && st->standbys >= c->n_eps)
                    cli_set_err(err, WIRE_E_TIMEOUT,
                                "no answer from the broker in time: every broker is the standby (%d answers "
                                "standby, the last broker asked none in time)",
                                st->standbys);
                return -1;
            }
            if (!st->asked) { /* silent for liveness_ms: is it there? */
                st->ping = ++c->next_id;
                if (send_msg(c, MSG_STATUS, st->ping, NULL, NULL, deadline, err) != 0) return -1;
                st->asked = true;
                st->first = false;
                st->resent = false;
                continue;
            }
            /* that STATUS went unanswered for liveness_ms too (the one sent
             * with the messages: for liveness_ms): gone or stuck */
            silent = st->first ? c->liveness_ms : 2 * c->liveness_ms;
            st->asked = false;
            st->first = false;
            if (c->n_eps > 1) goto again; /* a standby pair: the other broker */
        }
        /* the messages again, as the same requests (the socket reconnects by itself) */
        if (0) {
        again:
            /* to the next broker of the list, a STATUS first (its boot id) */
            if (switch_broker(c) != 0) {
                cli_set_err(err, WIRE_E_INTERNAL, "%s", reel_err_text());
                return -1;
            }
            st->ping = ++c->next_id;
            if (send_msg(c, MSG_STATUS, st->ping, NULL, NULL, deadline, err) != 0) return -1;
            st->asked = st->first = true;
            st->boot = 0;
            st->resent = false;
        }
        if (resend_all(c, st, msgs, n, 0, silent, deadline, err) != 0) return -1;
    }
}

/* call() for a GEN or a SYNC, sent so that a lost broker does not lose
 * it (cli_live_next). 0 with *m the answer, 1 on ERROR or BUSY, -1 as
 * cli_live_next (err set). */
static int call_live(reel_client_t *c, msg_type_t type, uint64_t id, const void *g, int timeout_ms,
                     reel_progress_fn fn, void *user, wire_msg_t *m, wire_err_t *err) {
    int64_t deadline = cli_now_ms() + timeout_ms;
    const cli_live_msg_t one = { type, id, g };
    cli_live_t st;
    one_progress_t p = { fn, user };
    if (cli_live_begin(c, &st, deadline, err) != 0 || cli_live_send(c, &one, deadline, err) != 0 ||
        cli_live_next(c, &st, &one, 1, deadline, m, fn ? one_progress : NULL, &p, err) != 0)
        return -1;
    if (cli_answer_is_error(m, err)) {
        wire_msg_close(m);
        return 1;
    }
    return 0;
}

/* A RESULT's summary for the caller. */
static void result_summary(const msg_result_t *r, reel_gen_result_t *res) {
    memset(res, 0, sizeof *res);
    snprintf(res->worker, sizeof res->worker, "%s", r->worker[0] ? r->worker : "?");
    if (r->key_hash) msg_hex64(r->key_hash, res->key_hash);
    if (r->stats.capture_key) msg_hex64(r->stats.capture_key, res->capture_key);
    res->version = r->version;
    res->first_version = r->first_version;
    res->captured = (int)r->stats.captured;
    res->replayed = (int)r->stats.replayed;
    res->batched = (int)r->stats.batched;
    res->batch_rows = (int)r->stats.batch_rows;
    res->padded_rows = (int)r->stats.padded_rows;
    res->eager = (int)r->stats.eager;
    res->seconds = r->stats.seconds;
    size_t off = 0;
    for (int i = 0; i < r->stats.declines.n; i++) {
        const msg_count_t *d = &r->stats.declines.e[i];
        int w = snprintf(res->declines + off, sizeof res->declines - off, "%s%s=%llu", off ? "," : "", d->name,
                         (unsigned long long)d->n);
        if (w < 0 || (size_t)w >= sizeof res->declines - off) break;
        off += (size_t)w;
    }
}

void reel_rollout_free(reel_rollout_t *r) {
    if (!r) return;
    free(r->trajectory);
    free(r->log_probs);
    free(r->sigmas);
    free(r->timesteps);
    free(r->means);
    r->trajectory = r->log_probs = r->sigmas = r->timesteps = r->means = NULL;
}

/* A copy of tensor t's floats into *dst, its shape into shape[] (ndim
 * dims expected). 0 when t is NULL (nothing asked or sent); -1 when it is
 * not F32 of that rank or memory runs out. */
static int take_f32(const wire_tensor_t *t, int ndim, float **dst, int64_t *shape) {
    if (!t) return 0;
    if (t->dtype != KERN_F32 || t->ndim != ndim) return -1;
    if (!(*dst = malloc(t->bytes ? t->bytes : 1))) return -1;
    memcpy(*dst, t->data, t->bytes);
    if (shape) memcpy(shape, t->shape, (size_t)ndim * sizeof *shape);
    return 0;
}

/* The rollout outputs of RESULT r into ro (what was asked). */
static int take_rollout(const msg_result_t *r, int n, reel_rollout_t *ro, wire_err_t *err) {
    int64_t n1[2] = { 0 }, n2[1] = { 0 }, n3[1] = { 0 };
    int g = n > 1; /* a group: a leading [n] */
    reel_rollout_free(ro);
    memset(ro->trajectory_shape, 0, sizeof ro->trajectory_shape);
    memset(ro->means_shape, 0, sizeof ro->means_shape);
    ro->steps = 0;
    if (take_f32(r->trajectory, 5 + g, &ro->trajectory, ro->trajectory_shape) ||
        take_f32(r->log_probs, 1 + g, &ro->log_probs, n1) || take_f32(r->sigmas, 1, &ro->sigmas, n2) ||
        take_f32(r->timesteps, 1, &ro->timesteps, n3) ||
        take_f32(r->means, 5 + g, &ro->means, ro->means_shape)) {
        reel_rollout_free(ro);
        cli_set_err(err, WIRE_E_MALFORMED, "RESULT rollout tensors of the wrong kind, or out of memory");
        return -1;
    }
    ro->n = n;
    ro->steps = n1[g] ? n1[g] : ro->trajectory_shape[g] ? ro->trajectory_shape[g] - 1 : 0;
    ro->n_runs = 0;
    for (size_t i = 0; i < r->n_version_runs && ro->n_runs < 16; i++, ro->n_runs++) {
        ro->run_from[ro->n_runs] = r->version_runs[i].from;
        ro->run_version[ro->n_runs] = r->version_runs[i].version;
    }
    return 0;
}

void reel_decoded_free(reel_decoded_t *d) {
    if (!d) return;
    free(d->frames);
    free(d->video);
    memset(d, 0, sizeof *d);
}

/* The RESULT's frames / video copied into d (checked against the GEN by
 * msg_result_decode's caller: the broker), with the seconds. */
static int take_decoded(const msg_result_t *r, reel_decoded_t *d, wire_err_t *err) {
    memset(d, 0, sizeof *d);
    d->encode_seconds = r->encode_seconds;
    d->decode_seconds = r->decode_seconds;
    const wire_tensor_t *src[2] = { r->frames, r->video };
    uint8_t **dst[2] = { &d->frames, &d->video };
    size_t *len[2] = { &d->frames_bytes, &d->video_bytes };
    for (int i = 0; i < 2; i++) {
        if (!src[i]) continue;
        if (src[i]->dtype != WIRE_U8 || !(*dst[i] = malloc(src[i]->bytes ? src[i]->bytes : 1))) {
            reel_decoded_free(d);
            cli_set_err(err, src[i]->dtype != WIRE_U8 ? WIRE_E_MALFORMED : WIRE_E_INTERNAL, "RESULT %s %s", src[i]->name,
                    src[i]->dtype != WIRE_U8 ? "is not U8" : "does not fit in memory");
            return -1;
        }
        memcpy(*dst[i], src[i]->data, src[i]->bytes);
        *len[i] = src[i]->bytes;
    }
    if (r->frames) {
        d->frames_ndim = r->frames->ndim;
        memcpy(d->frames_shape, r->frames->shape, (size_t)r->frames->ndim * sizeof(int64_t));
    }
    return 0;
}

uint64_t cli_new_id(reel_client_t *c) { return ++c->next_id; }

int cli_gen_message(reel_client_t *c, const reel_gen_t *g, msg_gen_t *m, wire_tensor_t t[3], size_t *nl,
                    wire_err_t *err) {
    memset(m, 0, sizeof *m);
    snprintf(m->model, sizeof m->model, "%s", g->model);
    m->version = g->version;
    m->steps = (uint64_t)g->steps;
    m->shift = g->shift;
    m->cfg = g->cfg;
    m->sde = g->sde;
    if (g->solver && strcmp(g->solver, "euler")) snprintf(m->solver, sizeof m->solver, "%s", g->solver);
    m->eta = g->eta;
    m->seed = g->seed;
    int n = g->n > 1 ? g->n : 1;
    m->n = (uint64_t)n;
    if (g->seeds) {
        if (n > MSG_MAX_GROUP) {
            cli_set_err(err, WIRE_E_BAD_REQUEST, "a group has at most %d samples (n = %d)", MSG_MAX_GROUP, n);
            return -1;
        }
        memcpy(m->seeds, g->seeds, (size_t)n * sizeof *m->seeds);
        m->n_seeds = n;
    }
    m->progress = g->progress;
    m->deadline_ms = g->deadline_ms;
    if (g->rollout) {
        m->return_trajectory = g->rollout->want_trajectory;
        m->return_log_probs = g->rollout->want_log_probs;
        m->return_means = g->rollout->want_means;
        m->return_timesteps = g->rollout->want_timesteps;
    }
    memcpy(m->latent_shape, g->latent_shape, sizeof m->latent_shape);
    m->prompt = g->prompt;
    m->negative_prompt = g->negative_prompt;
    if (g->output && strcmp(g->output, "latent")) snprintf(m->output, sizeof m->output, "%s", g->output);
    if (msg_gen_decodes(m) && !g->decoded) {
        cli_set_err(err, WIRE_E_BAD_REQUEST, "output %s needs a reel_decoded_t to return it in", g->output);
        return -1;
    }
    memset(t, 0, 3 * sizeof *t);
    *nl = (size_t)(g->latent_shape[0] * g->latent_shape[1] * g->latent_shape[2] * g->latent_shape[3]) * (size_t)n;
    size_t nc = (size_t)(g->ctx_shape[0] * g->ctx_shape[1]);
    const float *src[3] = { g->context, g->uncond, g->latent };
    const char *names[3] = { "context", "uncond", "latent" };
    const wire_tensor_t **slot[3] = { &m->context, &m->uncond, &m->latent };
    for (int i = 0; i < 3; i++) {
        if (!src[i]) continue;
        wire_tensor_t *x = &t[i];
        snprintf(x->name, sizeof x->name, "%s", names[i]);
        x->dtype = KERN_F32;
        if (i == 2 && n > 1) { /* a group's latents: [n,C,F,H,W] */
            x->ndim = 5;
            x->shape[0] = n;
            memcpy(x->shape + 1, g->latent_shape, 4 * sizeof(int64_t));
        } else {
            x->ndim = i == 2 ? 4 : 2;
            memcpy(x->shape, i == 2 ? g->latent_shape : g->ctx_shape, (size_t)x->ndim * sizeof(int64_t));
        }
        size_t ne = i == 2 ? *nl : nc;
        if (i == 1 && g->unc_rows > 0) { /* a negative prompt of its own length (models with text_len) */
            x->shape[0] = g->unc_rows;
            ne = (size_t)(g->unc_rows * g->ctx_shape[1]);
        }
        x->data = src[i];
        x->bytes = ne * sizeof(float);
        *slot[i] = x;
    }
    m->client = c->token;
    return 0;
}

void cli_cancel_gen(reel_client_t *c, uint64_t id) {
    /* The socket never blocks: a broker that is gone takes nothing. */
    msg_cancel_t cancel = { .client = c->token };
    if (msg_send(c->sock, NULL, MSG_CANCEL, id, &cancel, NULL) == 0) c->cancelled = true;
}

int cli_gen_take(const reel_gen_t *g, size_t nl, wire_msg_t *a, float *out, reel_gen_result_t *res,
                 const float **latent, wire_err_t *err) {
    msg_result_t r;
    wire_err_t why;
    if (msg_type(a) != MSG_RESULT || msg_result_decode(a, &r, &why) != 0) {
        cli_set_err(err, WIRE_E_MALFORMED, "unexpected answer %s%s%s", a->type,
                    msg_type(a) == MSG_RESULT ? ": " : "", msg_type(a) == MSG_RESULT ? why.message : "");
        return -1;
    }
    if (!r.latent || r.latent->dtype != KERN_F32 || r.latent->bytes != nl * sizeof(float)) {
        cli_set_err(err, WIRE_E_MALFORMED, "RESULT latent %s", r.latent ? "of the wrong size" : "missing");
        return -1;
    }
    if (out) memcpy(out, r.latent->data, r.latent->bytes);
    if (latent) *latent = r.latent->data;
    if (res) result_summary(&r, res);
    int n = g->n > 1 ? g->n : 1;
    if (g->rollout && take_rollout(&r, n, g->rollout, err) != 0) return -1;
    if (g->decoded && take_decoded(&r, g->decoded, err) != 0) return -1;
    return 0;
}

int cli_gen_wait_ms(int timeout_ms, uint64_t deadline_ms) {
    if (timeout_ms > 0) return timeout_ms;
    uint64_t d = deadline_ms ? deadline_ms : 60000;
    if (d > INT_MAX - 5000) return INT_MAX;
    return d + 5000 < CLI_GEN_WAIT_MIN_MS ? CLI_GEN_WAIT_MIN_MS : (int)(d + 5000);
}

int reel_gen(reel_client_t *c, const reel_gen_t *g, float *out, reel_gen_result_t *res,
             reel_progress_fn progress, void *user, int timeout_ms, wire_err_t *err) {
    uint64_t id = cli_new_id(c);
    msg_gen_t m;
    wire_tensor_t t[3];
    size_t nl;
    if (cli_gen_message(c, g, &m, t, &nl, err) != 0) return -1;
    wire_msg_t a;
    if (cli_call_begin(c, err) != 0) return -1;
    int rc = call_live(c, MSG_GEN, id, &m, cli_gen_wait_ms(timeout_ms, m.deadline_ms), progress, user, &a, err);
    /* Given up on: the broker stops it (docs/PROTOCOL.md "Cancelling")
     * rather than run it to its deadline for nobody. */
    if (rc < 0 && (!strcmp(err->code, WIRE_E_TIMEOUT) || !strcmp(err->code, REEL_CLIENT_E_INTERRUPTED)))
        cli_cancel_gen(c, id);
    cli_call_end(c);
    if (rc != 0) return rc;
    rc = cli_gen_take(g, nl, &a, out, res, NULL, err);
    wire_msg_close(&a);
    return rc;
}

/* A chunk buffer handed to ZeroMQ to send without a copy: zmq gives it
 * back (chunk_sent, on its I/O thread) once the bytes are on the socket.
 * The upload keeps REEL_UPLOAD_WINDOW + 1 of them, allocated once: a
 * fresh 4 MiB buffer per chunk (ZeroMQ's own copy of it) faulted its
 * pages in anew each time, which cost the trainer as much as the copy. A
 * buffer still in ZeroMQ when the upload ends (its socket has not sent
 * it) is ORPHANED and freed by chunk_sent instead. */
enum { BUF_FREE, BUF_IN_ZMQ, BUF_ORPHANED };
typedef struct {
    atomic_int state;
    unsigned char p[];
} chunk_buf_t;

static void chunk_sent(void *data, void *hint) {
    (void)data;
    chunk_buf_t *b = hint;
    int expect = BUF_IN_ZMQ;
    if (!atomic_compare_exchange_strong(&b->state, &expect, BUF_FREE)) free(b); /* orphaned */
}

/* Sends the chunk of fd at offset (at most MSG_CHUNK_MAX bytes) from buf as
 * UPLOAD `id`, by the deadline; *sent its bytes. 0, or -1 with err. u->chunk points at
 * this call's frame only while it runs: it is cleared before returning. */
static int send_chunk(reel_client_t *c, uint64_t id, msg_upload_t *u, int fd, chunk_buf_t *buf, uint64_t offset,
                      uint64_t *sent, int64_t deadline, wire_err_t *err) {
    uint64_t n = u->size - offset < MSG_CHUNK_MAX ? u->size - offset : MSG_CHUNK_MAX;
    ssize_t got = pread(fd, buf->p, n, (off_t)offset);
    if (got != (ssize_t)n) {
        cli_set_err(err, WIRE_E_INTERNAL, "reading the weights: %s", got < 0 ? strerror(errno) : "the file shrank");
        return -1;
    }
    wire_msg_t *sh = calloc(1, sizeof *sh);
    if (!sh) {
        cli_set_err(err, WIRE_E_INTERNAL, "out of memory");
        return -1;
    }
    atomic_store(&buf->state, BUF_IN_ZMQ);
    if (zmq_msg_init_data(&sh->frame[0], buf->p, n, chunk_sent, buf) != 0) {
        atomic_store(&buf->state, BUF_FREE);
        free(sh);
        cli_set_err(err, WIRE_E_INTERNAL, "zmq_msg_init_data: %s", zmq_strerror(errno));
        return -1;
    }
    sh->n_tensors = 1;
    sh->t[0] = msg_chunk(buf->p, n);
    u->offset = offset;
    u->client = c->token; /* a standby pair's standby knows this trainer when it comes back */
    u->chunk = &sh->t[0];
    int rc = send_msg(c, MSG_UPLOAD, id, u, sh, deadline, err);
    u->chunk = NULL;
    zmq_msg_close(&sh->frame[0]); /* ours; zmq holds its own while it sends (chunk_sent when done) */
    free(sh);
    if (rc != 0) return -1;
    *sent = n;
    return 0;
}

/* An upload in flight (reel_upload, reel_publish). ends[]: where each
 * chunk in flight ends, in the order sent; the broker answers each in
 * that order. `ignore`: answers still to come for chunks sent past a gap
 * (the broker wrote none of them). */
#define UPLOAD_BUFS (REEL_UPLOAD_WINDOW + 1)
typedef struct {
    int fd;
    chunk_buf_t *buf[UPLOAD_BUFS];
    msg_upload_t u;
    uint64_t id, next, received, ends[REEL_UPLOAD_WINDOW];
    int n_ends, ignore;
    bool complete;
    reel_bytes_fn progress;
    void *user;
} upload_t;

static int upload_open(reel_client_t *c, upload_t *p, const char *component, uint64_t version, const char *sha256,
                       const char *path, reel_bytes_fn progress, void *user, wire_err_t *err) {
    memset(p, 0, sizeof *p);
    struct stat st;
    p->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (p->fd < 0 || fstat(p->fd, &st) != 0 || st.st_size <= 0) {
        cli_set_err(err, WIRE_E_BAD_REQUEST, "%s: %s", path, p->fd < 0 ? strerror(errno) : "empty or unreadable");
        if (p->fd >= 0) close(p->fd);
        return -1;
    }
    for (int i = 0; i < UPLOAD_BUFS; i++) {
        if (!(p->buf[i] = malloc(sizeof *p->buf[i] + MSG_CHUNK_MAX))) {
            cli_set_err(err, WIRE_E_INTERNAL, "out of memory");
            while (i--) free(p->buf[i]);
            close(p->fd);
            return -1;
        }
        atomic_init(&p->buf[i]->state, BUF_FREE);
    }
    snprintf(p->u.component, sizeof p->u.component, "%s", component);
    p->u.version = version;
    snprintf(p->u.sha256, sizeof p->u.sha256, "%s", sha256);
    p->u.size = (uint64_t)st.st_size;
    p->id = ++c->next_id;
    p->progress = progress;
    p->user = user;
    return 0;
}

static void upload_close(upload_t *p) {
    for (int i = 0; i < UPLOAD_BUFS; i++) {
        int expect = BUF_IN_ZMQ; /* still queued in zmq: chunk_sent frees it */
        if (!atomic_compare_exchange_strong(&p->buf[i]->state, &expect, BUF_ORPHANED)) free(p->buf[i]);
    }
    close(p->fd);
}

/* A buffer zmq gave back; NULL (err) when none came back within timeout_ms:
 * every chunk acked was sent, so one is normally free at once. */
static chunk_buf_t *free_buf(upload_t *p, int timeout_ms, wire_err_t *err) {
    int64_t deadline = cli_now_ms() + timeout_ms;
    for (;;) {
        for (int i = 0; i < UPLOAD_BUFS; i++)
            if (atomic_load(&p->buf[i]->state) == BUF_FREE) return p->buf[i];
        if (cli_now_ms() > deadline) {
            cli_set_err(err, WIRE_E_TIMEOUT, "the chunks sent are not leaving the socket");
            return NULL;
        }
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
    }
}

/* Sends chunks while the window has room. 0, or -1 with err. */
static int upload_fill(reel_client_t *c, upload_t *p, int timeout_ms, wire_err_t *err) {
    while (!p->complete && p->next < p->u.size && p->n_ends + p->ignore < REEL_UPLOAD_WINDOW) {
        uint64_t sent = 0;
        chunk_buf_t *b = free_buf(p, timeout_ms, err);
        if (!b || send_chunk(c, p->id, &p->u, p->fd, b, p->next, &sent, cli_now_ms() + timeout_ms, err) != 0) return -1;
        p->next += sent;
        p->ends[p->n_ends++] = p->next;
    }
    return 0;
}

/* After the call's socket was refused for good and replaced
 * (AWAIT_REFRESHED): the chunks in flight reached no broker, and the
 * upload goes on from the last byte the broker acknowledged. */
static void upload_restart(upload_t *p) {
    p->next = p->received;
    p->n_ends = 0;
    p->ignore = 0;
}

/* The broker's answer a to p->id (closed here): 0 going on (p->complete
 * once the broker holds it all), 1 on ERROR or BUSY, -1 malformed (err). */
static int upload_answer(upload_t *p, wire_msg_t *a, wire_err_t *err) {
    if (cli_answer_is_error(a, err)) {
        wire_msg_close(a);
        return 1;
    }
    msg_upload_ack_t k;
    wire_err_t why;
    int bad = msg_type(a) != MSG_UPLOAD_ACK || msg_upload_ack_decode(a, &k, &why) != 0;
    wire_msg_close(a);
    if (bad || k.received > p->u.size) {
        cli_set_err(err, WIRE_E_MALFORMED, "unexpected answer to UPLOAD");
        return -1;
    }
    if (k.complete) {
        p->complete = true;
        p->received = p->u.size;
        if (p->progress) p->progress(p->user, p->u.size, p->u.size);
        return 0;
    }
    if (p->ignore) {
        p->ignore--;
        return 0;
    }
    if (p->n_ends == 0) return 0; /* an answer to nothing in flight: not ours */
    uint64_t want = p->ends[0];
    memmove(p->ends, p->ends + 1, (size_t)--p->n_ends * sizeof *p->ends);
    if (k.received != want) {
        /* Not written (a resume: the broker's copy ends elsewhere): go on
         * from where it ends; the chunks behind this one were not written
         * either, and their answers are skipped. */
        p->next = k.received;
        p->ignore = p->n_ends;
        p->n_ends = 0;
    }
    p->received = k.received;
    if (p->progress) p->progress(p->user, k.received, p->u.size);
    return 0;
}

int reel_upload(reel_client_t *c, const char *component, uint64_t version, const char *sha256, const char *path,
                reel_bytes_fn progress, void *user, int timeout_ms, wire_err_t *err) {
    upload_t p;
    if (upload_open(c, &p, component, version, sha256, path, progress, user, err) != 0) return -1;
    if (cli_call_begin(c, err) != 0) {
        upload_close(&p);
        return -1;
    }
    int rc = 0;
    int64_t answer_by = cli_now_ms() + timeout_ms; /* timeout_ms per answer awaited */
    while (rc == 0 && !p.complete) {
        wire_msg_t a;
        if (upload_fill(c, &p, timeout_ms, err) != 0) {
            rc = -1;
            break;
        }
        int r = await(c, p.id, answer_by, &a, NULL, NULL, err);
        if (r == AWAIT_REFRESHED) {
            upload_restart(&p);
            continue;
        }
        if (r != 0) {
            rc = -1;
            break;
        }
        answer_by = cli_now_ms() + timeout_ms;
        rc = upload_answer(&p, &a, err);
    }
    upload_close(&p);
    rc = sync_ended(c, rc);
    cli_call_end(c);
    return rc;
}

static msg_sync_t *sync_message(uint64_t client, const char *component, uint64_t version, const char *sha256, const char *path,
                                uint64_t deadline_ms, wire_err_t *err) {
    msg_sync_t *s = calloc(1, sizeof *s);
    if (!s) {
        cli_set_err(err, WIRE_E_INTERNAL, "out of memory");
        return NULL;
    }
    snprintf(s->component, sizeof s->component, "%s", component);
    s->version = version;
    snprintf(s->sha256, sizeof s->sha256, "%s", sha256);
    if (path) snprintf(s->path, sizeof s->path, "%s", path);
    else s->uploaded = true;
    s->deadline_ms = deadline_ms;
    s->client = client; /* a standby pair's standby knows this trainer when it comes back */
    return s;
}

/* The SYNC_DONE a (closed here) into res. 0, or -1 malformed. */
static int sync_done(wire_msg_t *a, reel_sync_result_t *res, wire_err_t *err) {
    msg_sync_done_t d;
    wire_err_t why;
    if (msg_type(a) != MSG_SYNC_DONE || msg_sync_done_decode(a, &d, &why) != 0) {
        cli_set_err(err, WIRE_E_MALFORMED, "unexpected answer %s", a->type);
        wire_msg_close(a);
        return -1;
    }
    if (res) {
        res->complete = d.complete;
        size_t off = 0;
        res->applied[0] = res->failed[0] = '\0';
        for (size_t i = 0; i < d.n_applied; i++) {
            int w = snprintf(res->applied + off, sizeof res->applied - off, "%s%s", off ? "," : "", d.applied[i]);
            if (w < 0 || (size_t)w >= sizeof res->applied - off) {
                snprintf(res->applied + off, sizeof res->applied - off, "%s...", off ? "," : "");
                break;
            }
            off += (size_t)w;
        }
        off = 0;
        for (size_t i = 0; i < d.n_failed; i++) {
            int w = snprintf(res->failed + off, sizeof res->failed - off, "%s%s:%s", off ? "," : "",
                             d.failed[i].worker, d.failed[i].reason);
            if (w < 0 || (size_t)w >= sizeof res->failed - off) { /* said, not dropped in silence */
                snprintf(res->failed + off, sizeof res->failed - off, "%s...", off ? "," : "");
                break;
            }
            off += (size_t)w;
        }
    }
    wire_msg_close(a);
    return 0;
}

static int publish(reel_client_t *c, msg_sync_t *s, const char *path, reel_bytes_fn progress, void *user,
                   reel_sync_result_t *res, int timeout_ms, wire_err_t *err);

int reel_publish(reel_client_t *c, const char *component, uint64_t version, const char *sha256, const char *path,
                 uint64_t deadline_ms, reel_bytes_fn progress, void *user, reel_sync_result_t *res, int timeout_ms,
                 wire_err_t *err) {
    msg_sync_t *s = sync_message(c->token, component, version, sha256, NULL, deadline_ms, err);
    if (!s) return -1;
    return publish(c, s, path, progress, user, res, timeout_ms, err);
}

int reel_publish_adapter(reel_client_t *c, const char *component, uint64_t version, uint64_t base_version,
                         const char *sha256, const char *path, const char *config, uint64_t deadline_ms,
                         reel_bytes_fn progress, void *user, reel_sync_result_t *res, int timeout_ms, wire_err_t *err) {
    if (strlen(config) >= MSG_LORA_CONFIG_MAX) {
        cli_set_err(err, WIRE_E_BAD_REQUEST, "the adapter's config is %zu bytes, more than %d", strlen(config),
                MSG_LORA_CONFIG_MAX - 1);
        return -1;
    }
    msg_sync_t *s = sync_message(c->token, component, version, sha256, NULL, deadline_ms, err);
    if (!s) return -1;
    s->base_version = base_version;
    snprintf(s->lora_config, sizeof s->lora_config, "%s", config);
    return publish(c, s, path, progress, user, res, timeout_ms, err);
}

/* One attempt of publish(): the upload from where the broker's copy ends,
 * and the SYNC unless its answer came (*synced) in an earlier one. With
 * liveness on, a broker silent for liveness_ms is asked for STATUS; one
 * that does not answer within liveness_ms more, or answers with another
 * boot id (a restart), ends the attempt with *lost set, for publish() to
 * make another (the upload resumes, the SYNC goes again: idempotent). */
typedef struct {
    bool synced;        /* the SYNC's answer came */
    bool lost;          /* the attempt ended on a lost or restarted broker */
    int silent_ms;      /* ... after this long without an answer (0: another broker answered) */
    uint64_t sent_id;   /* the last SYNC's id */
    int64_t heard;      /* when the broker last answered anything */
    int64_t began;      /* when this attempt began */
    int64_t refused;    /* a pair: since when every attempt was answered standby (0: none) */
    int rounds;         /* attempts answered standby */
} publish_state_t;

static int publish_attempt(reel_client_t *c, const msg_sync_t *s, const char *path, reel_bytes_fn progress,
                           void *user, reel_sync_result_t *res, int timeout_ms, publish_state_t *st,
                           wire_err_t *err) {
    upload_t p;
    bool *synced = &st->synced;
    st->lost = false;
    st->began = cli_now_ms();
    if (upload_open(c, &p, s->component, s->version, s->sha256, path, progress, user, err) != 0) return -1;
    uint64_t sid = 0;
    /* the broker this attempt talks to: its boot id, asked first when unknown */
    uint64_t ping = c->liveness_ms && !c->boot ? ++c->next_id : 0;
    bool first = ping != 0;
    int64_t answer_by = cli_now_ms() + timeout_ms, ping_by = 0;
    if (ping && send_msg(c, MSG_STATUS, ping, NULL, NULL, answer_by, err) != 0) {
        upload_close(&p);
        return -1;
    }
    int rc = 0;
    for (;;) {
        if (upload_fill(c, &p, timeout_ms, err) != 0) {
            rc = -1;
            break;
        }
        /* The SYNC goes once the broker holds an upload of these bytes:
         * its workers fetch what came and wait for the rest. */
        if (!sid && !*synced && (p.received > 0 || p.complete)) {
            sid = st->sent_id = ++c->next_id;
            if (send_msg(c, MSG_SYNC, sid, s, NULL, answer_by, err) != 0) {
                rc = -1;
                break;
            }
        }
        if (*synced && p.complete) break;
        wire_msg_t a;
        /* the first STATUS waits for the answer's timeout; with a pair, a
         * liveness (the other broker may be the one that answers) */
        int64_t first_by = c->n_eps > 1 && c->liveness_ms ? st->began + c->liveness_ms : answer_by;
        int64_t until = ping ? (first ? first_by : ping_by) : c->liveness_ms ? cli_now_ms() + c->liveness_ms : answer_by;
        if (until > answer_by) until = answer_by;
        int r = await3(c, p.complete ? sid : p.id, p.complete || *synced ? 0 : sid, ping, until, &a, NULL, NULL, err);
        if (r == AWAIT_REFRESHED) {
            /* the socket was refused for good and replaced: what went on it
             * reached no broker; the attempt begins again on the fresh one
             * (a STATUS first when asked for one: no boot id known there) */
            upload_restart(&p);
            if (sid && !*synced) sid = 0; /* the SYNC goes again once the broker holds bytes */
            ping = c->liveness_ms ? ++c->next_id : 0;
            first = ping != 0;
            st->began = cli_now_ms();
            if (ping && send_msg(c, MSG_STATUS, ping, NULL, NULL, answer_by, err) != 0) {
                rc = -1;
                break;
            }
            continue;
        }
        if (r != 0) {
            if (strcmp(err->code, WIRE_E_TIMEOUT) || cli_now_ms() >= answer_by) {
                rc = -1;
                break;
            }
            if (ping && first && c->n_eps > 1) { /* a pair's broker silent from the start: the other */
                st->lost = true;
                st->silent_ms = c->liveness_ms;
                rc = -1;
                break;
            }
            if (!ping) { /* silent for liveness_ms: is it there? */
                ping = ++c->next_id;
                ping_by = cli_now_ms() + c->liveness_ms;
                if (send_msg(c, MSG_STATUS, ping, NULL, NULL, answer_by, err) != 0) {
                    rc = -1;
                    break;
                }
                continue;
            }
            st->lost = true; /* that STATUS unanswered too: gone or stuck */
            st->silent_ms = 2 * c->liveness_ms;
            rc = -1;
            break;
        }
        st->heard = cli_now_ms();
        if (ping && a.id == ping) {
            uint64_t boot = boot_of(&a);
            wire_msg_close(&a);
            ping = 0;
            if (first || !c->boot) { /* the broker this attempt began with */
                first = false;
                if (boot) c->boot = boot;
                continue;
            }
            if (boot && boot != c->boot) { /* another broker: a restart lost what was in flight */
                c->boot = boot;
                st->lost = true;
                st->silent_ms = 0;
                rc = -1;
                break;
            }
            continue;
        }
        answer_by = cli_now_ms() + timeout_ms; /* timeout_ms per answer awaited */
        if (sid && a.id == sid) {
            if (cli_answer_is_error(&a, err)) { /* refused: the upload stops here (resumable) */
                wire_msg_close(&a);
                rc = 1;
                break;
            }
            /* Answered before the last chunk went (no live worker, or every
             * worker failed early): the upload still completes, so the
             * broker holds the version and no slot is left open. */
            if ((rc = sync_done(&a, res, err)) != 0) break;
            *synced = true;
            if (p.complete) break;
            continue;
        }
        if ((rc = upload_answer(&p, &a, err)) != 0) break;
        if (*synced && p.complete) break;
    }
    if (rc == 1 && c->n_eps > 1 && !strcmp(err->code, WIRE_E_STANDBY)) {
        st->lost = true; /* the standby of a pair: the upload goes to the other broker */
        st->silent_ms = -1;
        if (!st->refused) st->refused = cli_now_ms();
        rc = -1;
    } else if (rc == 1 && c->liveness_ms && !strcmp(err->code, WIRE_E_SHUTDOWN)) {
        st->lost = true; /* the broker is stopping: the attempt goes again to the one that comes back */
        st->silent_ms = 0;
        if (!c->shut_at) c->shut_at = cli_now_ms();
        rc = -1;
    } else if (rc == 0 || rc == 1) {
        st->refused = 0;
    }
    upload_close(&p);
    return rc;
}

/* Uploads path and sends SYNC s (freed here) with its first chunk; a lost
 * or restarted broker (publish_attempt) costs another attempt, which
 * resumes the upload where the broker's copy ends, while timeout_ms has
 * not passed without an answer. */
static int publish(reel_client_t *c, msg_sync_t *s, const char *path, reel_bytes_fn progress, void *user,
                   reel_sync_result_t *res, int timeout_ms, wire_err_t *err) {
    publish_state_t st = { .heard = cli_now_ms() };
    int rc;
    if (cli_call_begin(c, err) != 0) {
        free(s);
        return -1;
    }
    for (;;) {
        rc = publish_attempt(c, s, path, progress, user, res, timeout_ms, &st, err);
        if (!st.lost) break;
        if (st.refused) { /* every broker a standby: bounded, with a pause a round */
            if (cli_now_ms() - st.refused >= timeout_ms) {
                st.lost = false;
                cli_set_err(err, WIRE_E_STANDBY, "every broker of the pair answered standby for %d ms", timeout_ms);
                rc = 1;
                break;
            }
            if (++st.rounds % c->n_eps == 0) standby_pause(cli_now_ms() + 200);
        }
        /* No chunk goes again before a broker answers a STATUS: chunks sent
         * to nobody would only queue in the socket (megabytes an attempt).
         * A broker gone for good, silent for timeout_ms, ends it. */
        bool back = false;
        while (!back && cli_now_ms() - st.heard < timeout_ms) {
            /* a standby pair: the other broker, then each in turn */
            if (c->n_eps > 1 && switch_broker(c) != 0) break;
            uint64_t ping = ++c->next_id;
            wire_msg_t a;
            wire_err_t e;
            int wait_ms = c->liveness_ms ? c->liveness_ms : (timeout_ms < 3000 ? timeout_ms : 3000);
            int64_t by = cli_now_ms() + wait_ms;
            if (send_msg(c, MSG_STATUS, ping, NULL, NULL, by, &e) != 0) break;
            if (await(c, ping, by, &a, NULL, NULL, &e) == 0) {
                uint64_t boot = boot_of(&a);
                wire_msg_close(&a);
                if (boot) c->boot = boot;
                st.heard = cli_now_ms();
                back = true;
            }
        }
        if (!back) break;
        c->resends++;
        if (c->on_resend) c->on_resend(c->resend_user, st.sent_id, st.silent_ms);
    }
    if (st.lost) cli_set_err(err, WIRE_E_TIMEOUT, "no answer from the broker within %d ms%s", timeout_ms, cli_handshake_hint(c));
    free(s);
    rc = sync_ended(c, rc);
    cli_call_end(c);
    return rc;
}

int reel_sync(reel_client_t *c, const char *component, uint64_t version, const char *sha256,
              const char *path, uint64_t deadline_ms, reel_sync_result_t *res, int timeout_ms,
              wire_err_t *err) {
    uint64_t id = ++c->next_id;
    msg_sync_t *s = sync_message(c->token, component, version, sha256, path, deadline_ms, err);
    if (!s) return -1;
    wire_msg_t a;
    if (cli_call_begin(c, err) != 0) {
        free(s);
        return -1;
    }
    int rc = sync_ended(c, call_live(c, MSG_SYNC, id, s, timeout_ms, NULL, NULL, &a, err));
    cli_call_end(c);
    free(s);
    if (rc != 0) return rc;
    return sync_done(&a, res, err);
}

int reel_sync_adapter(reel_client_t *c, const char *component, uint64_t version, uint64_t base_version,
                      const char *sha256, const char *path, uint64_t deadline_ms, reel_sync_result_t *res,
                      int timeout_ms, wire_err_t *err) {
    uint64_t id = ++c->next_id;
    msg_sync_t *s = sync_message(c->token, component, version, sha256, path ? path : "", deadline_ms, err);
    if (!s) return -1;
    s->base_version = base_version;
    wire_msg_t a;
    if (cli_call_begin(c, err) != 0) {
        free(s);
        return -1;
    }
    int rc = sync_ended(c, call_live(c, MSG_SYNC, id, s, timeout_ms, NULL, NULL, &a, err));
    cli_call_end(c);
    free(s);
    if (rc != 0) return rc;
    return sync_done(&a, res, err);
}

struct reel_status {
    wire_msg_t m;
    msg_status_reply_t r;
};

/* One STATUS to the broker sock is connected to: 0 with *out, else as call(). */
static int status_once(reel_client_t *c, reel_status_t **out, int timeout_ms, wire_err_t *err) {
    uint64_t id = ++c->next_id;
    *out = NULL;
    reel_status_t *s = calloc(1, sizeof *s);
    if (!s) {
        cli_set_err(err, WIRE_E_INTERNAL, "out of memory");
        return -1;
    }
    int rc = call(c, MSG_STATUS, id, NULL, timeout_ms, NULL, NULL, &s->m, err);
    if (rc != 0) {
        free(s);
        return rc;
    }
    wire_err_t why;
    if (msg_type(&s->m) != MSG_STATUS_REPLY || msg_status_reply_decode(&s->m, &s->r, &why) != 0) {
        cli_set_err(err, WIRE_E_MALFORMED, "unexpected answer %s", s->m.type);
        reel_status_free(&s);
        return -1;
    }
    *out = s;
    return 0;
}

/* With a standby pair: the active broker's STATUS, else the first that
 * answers (a standby's says so in ha_state); each tried for its share of
 * timeout_ms. */
static int status_call(reel_client_t *c, reel_status_t **out, int timeout_ms, wire_err_t *err) {
    if (c->n_eps < 2) return status_once(c, out, timeout_ms, err);
    reel_status_t *best = NULL;
    int best_at = 0, rc = -1;
    int share = timeout_ms / c->n_eps > 0 ? timeout_ms / c->n_eps : 1;
    for (int k = 0; k < c->n_eps; k++) {
        if (k > 0 && switch_broker(c) != 0) {
            cli_set_err(err, WIRE_E_INTERNAL, "%s", reel_err_text());
            break;
        }
        reel_status_t *s;
        wire_err_t e;
        int r = status_once(c, &s, share, &e);
        if (r != 0) {
            if (!best) { *err = e; rc = r; }
            continue;
        }
        if (!s->r.ha_state[0] || !strcmp(s->r.ha_state, "active")) {
            reel_status_free(&best);
            *out = s;
            return 0;
        }
        if (!best) { best = s; best_at = c->at; } else reel_status_free(&s);
    }
    if (!best) return rc;
    while (c->at != best_at && switch_broker(c) == 0) {} /* stay with the one that answered */
    *out = best;
    return 0;
}

int reel_status(reel_client_t *c, reel_status_t **out, int timeout_ms, wire_err_t *err) {
    *out = NULL;
    if (cli_call_begin(c, err) != 0) return -1;
    int rc = status_call(c, out, timeout_ms, err);
    cli_call_end(c);
    return rc;
}

const msg_status_reply_t *reel_status_reply(const reel_status_t *s) { return &s->r; }

void reel_status_free(reel_status_t **sp) {
    if (!sp || !*sp) return;
    wire_msg_close(&(*sp)->m);
    free(*sp);
    *sp = NULL;
}
