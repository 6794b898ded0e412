/* brk_zap.c -- CURVE, the ZAP handler, roles and worker-name bindings (see
 * brk_zap.h). The handler thread answers every ZAP request it reads (a REP
 * socket must), 200 only for a CURVE key in the allowlist with a role the
 * socket's domain takes, 400 for anything else. */
#include "broker/brk_zap.h"
#include "broker/brk_deliver.h"
#include "broker/brk_msg.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "broker/brk_log.h"
#include "broker/brk_refused.h"
#include "base/error.h"

#define ZAP_POLL_MS 100        /* how soon the handler notices a stop */
#define ZAP_FRAMES_MAX 8       /* a CURVE request has 7 */

/* A worker name and the key that holds it. */
typedef struct {
    char name[BRK_NAME_MAX];
    char key[REEL_KEY_Z85];
    uint64_t used;                 /* when its key last registered it (brk_zap.bind_clock) */
} binding_t;

struct brk_zap {
    void *ctx;
    void *rep;                     /* the handler's socket: its thread only */
    int sigfd;                     /* SIGHUP */
    pthread_t th;
    bool started;
    atomic_bool quit;
    char *keys_dir;
    reel_key_t self;               /* the broker's pair */
    reel_key_t peer;               /* the other broker of a standby pair: the same (public) key */
    bool has_peer;

    pthread_mutex_t mu;            /* guards ring (the pointer and what it points to) */
    reel_keyring_t *ring;

    _Atomic uint64_t refused;      /* handshakes refused (handler thread, and the loop's monitor) */
    brk_refused_t peers;           /* ... the peers they came from (both threads: its own mutex) */
    bool peers_init;
    uint64_t dropped;              /* messages of keys no longer allowed (loop thread) */
    void *mon[2];                  /* the client and worker sockets' handshake failures (loop thread) */
    binding_t *bind;               /* loop thread only */
    int n_bind, cap_bind;
    uint64_t bind_clock;           /* counts the READYs bound */
    brk_who_t cur;                 /* the sender of the message being handled (loop thread) */
};

/* The first ten, then one in a thousand: a peer knocking with a wrong key
 * in a loop must not flood the log. (A refused handshake is logged by its
 * peer's count instead: brk_refused_note.) */
static bool worth_logging(uint64_t n) { return n <= 10 || n % 1000 == 0; }

/* CLOCK_MONOTONIC in ms: the refused peers' last-seen times. */
static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the allowlist, as both threads see it --------------------------------- */

/* Copies the allowlist entry of key into *out. false when there is none. */
static bool lookup(brk_zap_t *z, const char *key, reel_key_t *out) {
    if (z->has_peer && !strcmp(key, z->peer.public_key)) { /* set before the handler starts; never changed */
        *out = z->peer;
        return true;
    }
    pthread_mutex_lock(&z->mu);
    const reel_key_t *k = reel_keyring_find(z->ring, key);
    if (k) *out = *k;
    pthread_mutex_unlock(&z->mu);
    return k != NULL;
}

static bool role_fits(reel_role_t r, bool worker_side) {
    /* a broker key on the client socket: only the peer's (the keyring skips broker keys) */
    return worker_side ? r == REEL_ROLE_WORKER
                       : (r == REEL_ROLE_CLIENT || r == REEL_ROLE_TRAINER || r == REEL_ROLE_BROKER);
}

int brk_zap_reload(brk_zap_t *z) {
    reel_keyring_t *fresh = reel_keyring_load(z->keys_dir);
    if (!fresh) return -1;
    pthread_mutex_lock(&z->mu);
    reel_keyring_t *old = z->ring;
    z->ring = fresh;
    pthread_mutex_unlock(&z->mu);
    reel_keyring_destroy(&old);
    return 0;
}

size_t brk_zap_keys(brk_zap_t *z) {
    if (!z) return 0;
    pthread_mutex_lock(&z->mu);
    size_t n = reel_keyring_count(z->ring);
    pthread_mutex_unlock(&z->mu);
    return n;
}

uint64_t brk_zap_refused(brk_zap_t *z) { return z ? atomic_load(&z->refused) : 0; }
uint64_t brk_zap_refused_peers(brk_zap_t *z) { return z ? brk_refused_peers(&z->peers) : 0; }
size_t brk_zap_refused_recent(brk_zap_t *z, msg_refused_peer_t *out, size_t max) {
    return z ? brk_refused_recent(&z->peers, out, max, mono_ms()) : 0;
}
uint64_t brk_zap_dropped(brk_zap_t *z) { return z ? z->dropped : 0; }

/* ---- the handler thread ---------------------------------------------------------- */

static int send_part(void *s, const void *p, size_t n, bool more) {
    return zmq_send(s, p, n, more ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
}

static bool frame_is(zmq_msg_t *f, const char *s) {
    size_t n = strlen(s);
    return zmq_msg_size(f) == n && !memcmp(zmq_msg_data(f), s, n);
}

/* Copies frame f as text (cut to len - 1 bytes, non-printing bytes as '?'). */
static void frame_text(zmq_msg_t *f, char *buf, size_t len) {
    size_t n = zmq_msg_size(f) < len - 1 ? zmq_msg_size(f) : len - 1;
    const unsigned char *p = zmq_msg_data(f);
    for (size_t i = 0; i < n; i++) buf[i] = p[i] >= 0x20 && p[i] < 0x7f ? (char)p[i] : '?';
    buf[n] = '\0';
}

/* Decides one request of n frames (the first min(n, ZAP_FRAMES_MAX) in
 * f): 0 with the user id when the peer is admitted; -1 with why as the
 * thread's error value (the status text), REEL_E_INVALID when it is not a
 * ZAP request at all (status 500), another code when the peer is refused
 * (400). A refusal is logged. */
static int decide(brk_zap_t *z, zmq_msg_t *f, int n, char *user) {
    char addr[64] = "?", domain[32] = "?";
    user[0] = '\0';
    if (n >= 4) frame_text(&f[3], addr, sizeof addr);
    if (n >= 3) frame_text(&f[2], domain, sizeof domain);
    bool workers = n >= 3 && frame_is(&f[2], BRK_ZAP_WORKERS);
    reel_key_t k;
    char z85[REEL_KEY_Z85] = "", name[REEL_KEY_NAME_MAX] = "";
    if (n < 6 || !frame_is(&f[0], "1.0")) {
        reel_fail(REEL_E_INVALID, "not a ZAP 1.0 request");
    } else if (!workers && !frame_is(&f[2], BRK_ZAP_CLIENTS)) {
        reel_fail(REEL_E_NOT_FOUND, "unknown domain");
    } else if (!frame_is(&f[5], "CURVE") || n != 7 || zmq_msg_size(&f[6]) != 32) {
        reel_fail(REEL_E_UNSUPPORTED, "not a CURVE handshake");
    } else if (!zmq_z85_encode(z85, zmq_msg_data(&f[6]), 32) || !lookup(z, z85, &k)) {
        reel_fail(REEL_E_NOT_FOUND, "key %.12s... is not in the allowlist", z85);
    } else if (!role_fits(k.role, workers)) {
        snprintf(name, sizeof name, "%s", k.name);
        reel_fail(REEL_E_UNSUPPORTED, "key %s is a %s key", k.name, reel_role_name(k.role));
    } else {
        snprintf(user, REEL_KEY_Z85, "%s", z85);
        return 0;
    }
    uint64_t r = atomic_fetch_add(&z->refused, 1) + 1, mine;
    /* Logged by peer: each one's first refusal (while the peers are few),
     * then each 1000th of it; one peer that retries does not use up the
     * log for the others. */
    if (brk_refused_note(&z->peers, workers, z85, name, addr, reel_err()->msg, mono_ms(), &mine))
        brk_log("refused a peer on the %s socket from %s: %s (%llu of its handshakes, %llu refused so far from %llu "
                "peers)", workers ? "worker" : !strcmp(domain, BRK_ZAP_CLIENTS) ? "client" : domain, addr,
                reel_err()->msg, (unsigned long long)mine, (unsigned long long)r,
                (unsigned long long)brk_refused_peers(&z->peers));
    return -1;
}

/* Reads one request and answers it. -1 on ETERM (the context is ending). */
static int handle_one(brk_zap_t *z) {
    zmq_msg_t f[ZAP_FRAMES_MAX];
    int n = 0, total = 0, more = 1, rc = 0;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, z->rep, 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&part);
            for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
            return e == ETERM ? -1 : 0;
        }
        more = zmq_msg_more(&part);
        total++;
        if (n < ZAP_FRAMES_MAX) f[n++] = part;
        else zmq_msg_close(&part); /* a longer request is refused: decide() sees the count */
    }
    char user[REEL_KEY_Z85];
    /* The one place a decision becomes a ZAP reply: 200 "OK", or the
     * refusal's message with 500 for what is not a ZAP request, else 400. */
    bool admitted = decide(z, f, total, user) == 0;
    const char *code = admitted ? "200" : reel_err_code() == REEL_E_INVALID ? "500" : "400";
    const char *text = admitted ? "OK" : reel_err()->msg;
    /* version, request id (echoed), status code, status text, user id, metadata */
    if (send_part(z->rep, "1.0", 3, true) < 0 ||
        send_part(z->rep, n >= 2 ? zmq_msg_data(&f[1]) : "", n >= 2 ? zmq_msg_size(&f[1]) : 0, true) < 0 ||
        send_part(z->rep, code, 3, true) < 0 || send_part(z->rep, text, strlen(text), true) < 0 ||
        send_part(z->rep, user, strlen(user), true) < 0 || send_part(z->rep, "", 0, false) < 0)
        rc = zmq_errno() == ETERM ? -1 : 0;
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    return rc;
}

static void *zap_main(void *arg) {
    brk_zap_t *z = arg;
    zmq_pollitem_t it[2] = {
        { z->rep, 0, ZMQ_POLLIN, 0 },
        { NULL, z->sigfd, ZMQ_POLLIN, 0 },
    };
    while (!atomic_load(&z->quit)) {
        int rc = zmq_poll(it, 2, ZAP_POLL_MS);
        if (rc < 0) {
            if (zmq_errno() == ETERM) break;
            continue;
        }
        if (it[1].revents & ZMQ_POLLIN) {
            struct signalfd_siginfo si;
            while (read(z->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {}
            size_t before = brk_zap_keys(z);
            if (brk_zap_reload(z) == 0)
                brk_log("SIGHUP: keys reloaded from %s: %zu key%s (were %zu)", z->keys_dir, brk_zap_keys(z),
                        brk_zap_keys(z) == 1 ? "" : "s", before);
            else
                brk_log("SIGHUP: keys NOT reloaded, the %zu loaded before stay: %s", before, reel_err_text());
        }
        if (it[0].revents & ZMQ_POLLIN)
            for (int i = 0; i < 64; i++) {
                if (handle_one(z) < 0) return NULL;
                zmq_pollitem_t more = { z->rep, 0, ZMQ_POLLIN, 0 };
                if (zmq_poll(&more, 1, 0) <= 0) break;
            }
    }
    return NULL;
}

brk_zap_t *brk_zap_new(void *ctx, const char *keys_dir, const char *key_file, bool pair) {
    brk_zap_t *z = calloc(1, sizeof *z);
    if (!z) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        return NULL;
    }
    z->ctx = ctx;
    z->sigfd = -1;
    atomic_init(&z->quit, false);
    atomic_init(&z->refused, 0);
    bool mu = pthread_mutex_init(&z->mu, NULL) == 0;
    if (!mu) {
        reel_fail(REEL_E_IO, "cannot create a mutex");
        goto err;
    }
    if (brk_refused_init(&z->peers) != 0) goto err;
    z->peers_init = true;
    if (!zmq_has("curve")) {
        reel_fail(REEL_E_UNSUPPORTED, "this libzmq has no CURVE (built without libsodium)");
        goto err;
    }
    if (!(z->keys_dir = strdup(keys_dir))) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto err;
    }
    if (reel_key_read(key_file, true, &z->self) != 0) goto err;
    if (z->self.role != REEL_ROLE_BROKER) {
        reel_fail(REEL_E_INVALID, "%s: a %s key, not the broker's (reelctl keys new --role broker)", key_file,
                  reel_role_name(z->self.role));
        goto err;
    }
    if (pair) { /* a standby pair shares the broker's key pair: the peer connects with it */
        z->peer = z->self;
        explicit_bzero(z->peer.secret_key, sizeof z->peer.secret_key);
        z->has_peer = true;
    }
    if (!(z->ring = reel_keyring_load(keys_dir))) goto err;
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    if ((z->sigfd = signalfd(-1, &hup, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) {
        reel_fail(REEL_E_IO, "signalfd: %s", strerror(errno));
        goto err;
    }
    /* Bound before any CURVE socket exists: no handshake is ever made
     * without it. */
    int linger = 0;
    if (!(z->rep = zmq_socket(ctx, ZMQ_REP)) || zmq_setsockopt(z->rep, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(z->rep, BRK_ZAP_ENDPOINT) != 0) {
        reel_fail(REEL_E_IO, "cannot bind the ZAP handler at %s: %s", BRK_ZAP_ENDPOINT, zmq_strerror(zmq_errno()));
        goto err;
    }
    int e = pthread_create(&z->th, NULL, zap_main, z);
    if (e) {
        reel_fail(REEL_E_IO, "cannot start the ZAP handler: %s", strerror(e));
        goto err;
    }
    z->started = true;
    return z;
err:
    if (!mu) {
        free(z);
        return NULL;
    }
    brk_zap_destroy(&z);
    return NULL;
}

void brk_zap_destroy(brk_zap_t **zp) {
    if (!zp || !*zp) return;
    brk_zap_t *z = *zp;
    atomic_store(&z->quit, true);
    if (z->started) pthread_join(z->th, NULL);
    if (z->rep) zmq_close(z->rep);
    for (int i = 0; i < 2; i++)
        if (z->mon[i]) zmq_close(z->mon[i]);
    if (z->sigfd >= 0) close(z->sigfd);
    reel_keyring_destroy(&z->ring);
    pthread_mutex_destroy(&z->mu);
    if (z->peers_init) brk_refused_fini(&z->peers);
    explicit_bzero(&z->self, sizeof z->self);
    free(z->bind);
    free(z->keys_dir);
    free(z);
    *zp = NULL;
}

int brk_zap_server(brk_zap_t *z, void *sock, bool worker_side) {
    int one = 1;
    const char *domain = worker_side ? BRK_ZAP_WORKERS : BRK_ZAP_CLIENTS;
    if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, z->self.secret_key, 40) != 0)
        return reel_fail(REEL_E_IO, "cannot make the %s socket a CURVE server: %s", worker_side ? "worker" : "client",
                         zmq_strerror(zmq_errno()));
    /* A peer whose HELLO does not decrypt (it holds another broker's
     * public key), or that speaks no CURVE, fails before any ZAP request:
     * only the socket's monitor hears of it. (A keyless peer often sees
     * the mismatch first and hangs up before the broker reads its
     * mechanism: then libzmq reports nothing to count.) */
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://reel-handshakes-%s-%p", worker_side ? "workers" : "clients", (void *)z);
    int zero = 0;
    void *m = NULL;
    /* The events' pipe has no high-water mark: libzmq's IO thread sends
     * each event with a blocking send, and a full pipe (a flood of bad
     * handshakes while the loop is busy) would stall every socket. The
     * monitor is stopped before this reader closes (brk_main's stop_all). */
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0 || !(m = zmq_socket(z->ctx, ZMQ_PAIR)) ||
        zmq_setsockopt(m, ZMQ_LINGER, &zero, sizeof zero) != 0 || zmq_setsockopt(m, ZMQ_RCVHWM, &zero, sizeof zero) != 0 ||
        zmq_connect(m, ep) != 0) {
        int e = zmq_errno();
        (void)zmq_socket_monitor(sock, NULL, 0);
        if (m) zmq_close(m);
        return reel_fail(REEL_E_IO, "cannot watch the %s socket's handshakes: %s", worker_side ? "worker" : "client",
                         zmq_strerror(e));
    }
    z->mon[worker_side] = m;
    return 0;
}

void *brk_zap_monitor(brk_zap_t *z, bool worker_side) { return z ? z->mon[worker_side] : NULL; }

/* Why a handshake failed, in words an operator can act on. */
static const char *handshake_why(uint32_t value) {
    switch (value) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "not CURVE (a peer without keys: REEL_KEY / --key unset?)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "its CURVE handshake does not decrypt (it holds another broker's public key?)";
    default: return "a malformed handshake";
    }
}

void brk_zap_monitor_read(brk_zap_t *z, bool worker_side) {
    void *m = brk_zap_monitor(z, worker_side);
    for (int budget = 0; m && budget < 64; budget++) { /* the rest at the next poll */
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, m, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        char where[128] = "?";
        if (zmq_msg_more(&ev)) {
            zmq_msg_init(&addr);
            if (zmq_msg_recv(&addr, m, 0) >= 0) frame_text(&addr, where, sizeof where);
            zmq_msg_close(&addr);
        }
        uint16_t id = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&id, zmq_msg_data(&ev), 2);
            memcpy(&value, (const char *)zmq_msg_data(&ev) + 2, 4);
        }
        zmq_msg_close(&ev);
        if (id != ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) continue;
        uint64_t r = atomic_fetch_add(&z->refused, 1) + 1, mine;
        /* no key read, and the event names the broker's endpoint, not the
         * peer's: one peer per socket and reason (a keyless peer retries
         * every 100 ms: logged at its first and each 1000th) */
        if (brk_refused_note(&z->peers, worker_side, "", "", "", handshake_why(value), mono_ms(), &mine))
            brk_log("refused a peer on the %s socket (%s): %s (%llu such handshakes, %llu refused so far from %llu "
                    "peers)", worker_side ? "worker" : "client", where, handshake_why(value), (unsigned long long)mine,
                    (unsigned long long)r, (unsigned long long)brk_refused_peers(&z->peers));
    }
}

/* ---- the loop's side -------------------------------------------------------------- */

int brk_zap_who(brk_zap_t *z, bool worker_side, const zmq_msg_t *frame, brk_who_t *who) {
    memset(who, 0, sizeof *who);
    if (!z) {
        who->name[0] = '-'; /* every message passes here: no printf */
        return 0;
    }
    const char *uid = frame ? zmq_msg_gets((zmq_msg_t *)frame, "User-Id") : NULL;
    reel_key_t k;
    if (!uid || !lookup(z, uid, &k) || !role_fits(k.role, worker_side)) return -1;
    who->role = k.role;
    snprintf(who->name, sizeof who->name, "%s", k.name);
    snprintf(who->key, sizeof who->key, "%s", k.public_key);
    return 0;
}

bool brk_zap_worker_allowed(brk_zap_t *z, const char *public_key) {
    reel_key_t k;
    if (!z || !public_key || !public_key[0]) return true;
    return lookup(z, public_key, &k) && k.role == REEL_ROLE_WORKER;
}

/* What a role may send on the client socket: everything but SYNC, which
 * only a trainer may (and every peer of a broker without keys). */
static bool may_send(reel_role_t r, msg_type_t t) {
    return (t != MSG_SYNC && t != MSG_UPLOAD) || r == REEL_ROLE_TRAINER || r == REEL_ROLE_NONE;
}

void brk_zap_audit(brk_t *b, const brk_who_t *who, const char *action, const msg_sync_t *s, const char *outcome) {
    brk_cq_audit(b->cat, who->name, reel_role_name(who->role), action, s ? s->component : NULL, s ? s->version : 0,
                 s ? s->sha256 : NULL, s ? s->path : NULL, outcome);
    brk_log("audit: %s by %s (%s): %s v%llu sha256 %.16s path %s: %s", action, who->name, reel_role_name(who->role),
            s ? s->component : "?", s ? (unsigned long long)s->version : 0ull, s ? s->sha256 : "?",
            s ? s->path : "?", outcome);
}

/* One audit record of SYNC m from who, with what it asked when it reads. */
static void audit(brk_t *b, const brk_who_t *who, wire_msg_t *m, const char *outcome) {
    msg_sync_t *s = calloc(1, sizeof *s);
    wire_err_t err;
    bool read = s && msg_sync_decode(m, s, &err) == 0;
    brk_zap_audit(b, who, "sync", read ? s : NULL, outcome);
    free(s);
}

void brk_zap_sender(brk_zap_t *z, brk_who_t *who) {
    if (z) {
        *who = z->cur;
        return;
    }
    memset(who, 0, sizeof *who);
    snprintf(who->name, sizeof who->name, "-");
}

bool brk_zap_admit(brk_t *b, bool worker_side, wire_msg_t *m, const wire_err_t *bad) {
    brk_zap_t *z = b->zap;
    brk_who_t who;
    /* The header frame: libzmq 4.3 attaches a message's properties to the
     * routing id frame only when it is read without a poll first. */
    const zmq_msg_t *frame = m->has_head ? &m->head : m->has_identity ? &m->identity : NULL;
    if (z) memset(&z->cur, 0, sizeof z->cur);
    if (brk_zap_who(z, worker_side, frame, &who) != 0) {
        z->dropped++;
        if (worth_logging(z->dropped))
            brk_log("dropped a message on the %s socket from a key no longer allowed (%llu so far)",
                    worker_side ? "worker" : "client", (unsigned long long)z->dropped);
        return false;
    }
    if (z) z->cur = who;
    /* The pair's own messages (PEER, and FETCH on this socket: the
     * standby copying uploads) come from the broker key, which sends
     * nothing else but STATUS. */
    bool pair_msg = msg_type(m) == MSG_PEER || msg_type(m) == MSG_FETCH;
    if (!worker_side && pair_msg != (who.role == REEL_ROLE_BROKER) && who.role != REEL_ROLE_NONE &&
        msg_type(m) != MSG_STATUS) {
        if (m->has_identity && brk_reply_allowed(b, &m->identity)) {
            if (who.role == REEL_ROLE_BROKER)
                brk_error_to(b, false, &m->identity, m->id, BRK_E_FORBIDDEN,
                             "the peer broker's key sends PEER, FETCH and STATUS only");
            else
                brk_error_to(b, false, &m->identity, m->id, BRK_E_FORBIDDEN,
                             "%s: only the peer broker (the broker's own key) may send it on the client socket",
                             msg_type(m) == MSG_PEER ? "PEER" : "FETCH");
        }
        return false;
    }
    /* A forbidden SYNC or UPLOAD is logged, audited and answered within
     * the peer's budget for answers to bad messages (brk_reply_allowed:
     * 20 at once, then 10 a second); past it, only counted
     * (replies_suppressed). A client key that floods them would
     * otherwise write a log line (with its path: up to 1 KiB) and a kept
     * audit row, never pruned, for every message: 20,000 in 0.13 s wrote
     * 22 MB of log and 18 MB of audit rows. */
    if (!worker_side && msg_type(m) == MSG_UPLOAD && !may_send(who.role, MSG_UPLOAD)) {
        if (m->has_identity && !brk_reply_allowed(b, &m->identity)) return false;
        brk_log("UPLOAD from %s refused: a %s key may not publish weights", who.name, reel_role_name(who.role));
        brk_cq_audit(b->cat, who.name, reel_role_name(who.role), "upload", NULL, 0, NULL, NULL,
                     "denied: not a trainer key");
        if (m->has_identity)
            brk_error_to(b, false, &m->identity, m->id, BRK_E_FORBIDDEN,
                         "UPLOAD: the %s role may not publish weights (a trainer key may)", reel_role_name(who.role));
        return false;
    }
    if (worker_side || msg_type(m) != MSG_SYNC) return true;
    char outcome[300];
    if (!may_send(who.role, MSG_SYNC)) {
        if (m->has_identity && !brk_reply_allowed(b, &m->identity)) return false;
        snprintf(outcome, sizeof outcome, "denied: a %s key may not publish weights", reel_role_name(who.role));
        brk_log("SYNC from %s refused: %s", who.name, outcome + 8);
        audit(b, &who, m, outcome);
        if (m->has_identity)
            brk_error_to(b, false, &m->identity, m->id, BRK_E_FORBIDDEN,
                           "SYNC: the %s role may not publish weights (a trainer key may)", reel_role_name(who.role));
        return false;
    }
    /* A SYNC refused for its fields is audited with its answer, within
     * the peer's budget (the loop answers it: brk_reply_allowed); past
     * it, only counted, as a forbidden one. */
    if (m->has_identity && !brk_reply_budget_left(b, &m->identity)) return true;
    if (bad) {
        snprintf(outcome, sizeof outcome, "refused: %s: %s", bad->code, bad->message);
        audit(b, &who, m, outcome);
        return true;
    }
    msg_sync_t *s = malloc(sizeof *s);
    wire_err_t err;
    if (!s || msg_sync_decode(m, s, &err) != 0 || msg_sync_validate(s, false, &err) != 0) {
        snprintf(outcome, sizeof outcome, "refused: %s: %s", s ? err.code : WIRE_E_INTERNAL,
                 s ? err.message : "out of memory");
        audit(b, &who, m, outcome);
    }
    free(s);
    return true;
}

int brk_zap_bind_worker(brk_zap_t *z, const char *name, char *key_out, bool (*live)(void *arg, const char *name),
                        void *arg) {
    key_out[0] = '\0';
    if (!z) return 0;
    const brk_who_t who = z->cur;
    if (who.role != REEL_ROLE_WORKER) return -1;
    snprintf(key_out, REEL_KEY_Z85, "%s", who.key);
    const uint64_t now = ++z->bind_clock;
    for (int i = 0; i < z->n_bind; i++) {
        binding_t *bd = &z->bind[i];
        if (strcmp(bd->name, name)) continue;
        if (!strcmp(bd->key, who.key)) {
            bd->used = now;
            return 0;
        }
        /* A key that left the allowlist lets go of its names (below). */
        if (brk_zap_worker_allowed(z, bd->key)) return -1;
        break;
    }
    /* Bound by the allowlist: the names of keys that left it are let go,
     * and a key holds at most BRK_ZAP_NAMES_PER_KEY. Past that, a new name
     * takes the place of the one of its names it registered least
     * recently, one no live worker has first: each READY under a new
     * name would otherwise keep a binding for the broker's life. Only the
     * key's own names go, so no key loses a name to another's READYs. */
    int keep = 0, mine = 0, oldest = -1;
    bool oldest_live = true;
    for (int i = 0; i < z->n_bind; i++) {
        if (!strcmp(z->bind[i].name, name) || !brk_zap_worker_allowed(z, z->bind[i].key)) continue;
        if (keep != i) z->bind[keep] = z->bind[i];
        const binding_t *bd = &z->bind[keep];
        if (!strcmp(bd->key, who.key)) {
            bool l = live && live(arg, bd->name);
            if (oldest < 0 || (oldest_live && !l) ||
                (oldest_live == l && bd->used < z->bind[oldest].used)) {
                oldest = keep;
                oldest_live = l;
            }
            mine++;
        }
        keep++;
    }
    z->n_bind = keep;
    if (mine >= BRK_ZAP_NAMES_PER_KEY) {
        brk_log("worker key %s holds %d worker names: %s%s, the one it registered least recently, is let go for %s",
                who.name, mine, z->bind[oldest].name, oldest_live ? " (a live worker's)" : "", name);
        if (oldest != --z->n_bind) z->bind[oldest] = z->bind[z->n_bind];
    }
    if (z->n_bind == z->cap_bind) {
        int cap = z->cap_bind ? z->cap_bind * 2 : 16;
        binding_t *nb = realloc(z->bind, (size_t)cap * sizeof *nb);
        if (!nb) return -1;
        z->bind = nb;
        z->cap_bind = cap;
    }
    binding_t *bd = &z->bind[z->n_bind++];
    snprintf(bd->name, sizeof bd->name, "%s", name);
    snprintf(bd->key, sizeof bd->key, "%s", who.key);
    bd->used = now;
    return 0;
}
