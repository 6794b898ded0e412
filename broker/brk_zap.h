/* brk_zap.h -- who may talk to the broker (internal header): CURVE on both
 * ROUTERs, and a ZAP handler (ZeroMQ RFC 27) that admits a peer only when
 * its public key is in the allowlist (`--keys DIR`, net/keys.h) with a
 * role that socket takes: client or trainer on the client socket, worker
 * on the worker socket. It fails closed: libzmq admits any CURVE client
 * that knows the server key when no handler is bound, so the handler is
 * bound before any socket, its failure is fatal, and a handshake it does
 * not answer never completes.
 *
 * The handler runs on its own thread (it owns the inproc REP socket and a
 * signalfd): SIGHUP reloads the allowlist there, whole or not at all.
 * The routing loop asks, for every message, who sent it (the ZAP User-Id
 * is the sender's public key, looked up in the allowlist as it is now):
 * a key removed by a reload is no longer heard, even on a connection
 * made before. The allowlist is the one thing both threads read; a mutex
 * guards the pointer, a reload swaps it.
 *
 * What each role may send is one table here (docs/SECURITY.md): only a
 * trainer may SYNC (weight uploads included). Every SYNC is audited in
 * the catalog with its key's name, whatever the answer.
 *
 * A worker's name is bound to the first key that registers it, for the
 * broker's life or until that key leaves the allowlist or registers
 * BRK_ZAP_NAMES_PER_KEY other names after it: another key claiming it is
 * refused (no handover, at the socket either).
 *
 * Without keys (b->zap NULL) every peer is admitted with role "none" and
 * may send anything, as before keys existed: brk_opts allows that only on
 * loopback and ipc endpoints, or with --insecure. */
#ifndef REEL_BROKER_BRK_ZAP_H
#define REEL_BROKER_BRK_ZAP_H

#include <stdbool.h>
#include <stdint.h>

#include "broker/brk_broker.h"
#include "net/keys.h"

#define BRK_ZAP_ENDPOINT "inproc://zeromq.zap.01" /* where libzmq sends ZAP requests */
#define BRK_ZAP_CLIENTS "reel-clients"            /* ZAP domain of the client socket */
#define BRK_ZAP_WORKERS "reel-workers"            /* ... of the worker socket */
#define BRK_E_FORBIDDEN WIRE_E_FORBIDDEN /* ERROR code: the role may not send that */

typedef struct brk_zap brk_zap_t;

/* Who sent a message. */
typedef struct {
    reel_role_t role;                 /* REEL_ROLE_NONE without keys */
    char name[REEL_KEY_NAME_MAX];     /* the key's name; "-" without keys */
    char key[REEL_KEY_Z85];           /* its public key (z85); "" without keys */
} brk_who_t;

/* Loads the allowlist from keys_dir and the broker's own pair from
 * key_file (role broker) (with pair, one of a standby pair: the other
 * broker, which shares that key pair, is admitted on the client socket
 * with the broker role, for PEER and STATUS only), binds the ZAP handler
 * in ctx and starts its
 * thread. Call before any socket of ctx binds, with SIGHUP blocked in
 * every thread (the handler takes it through a signalfd). NULL with the
 * error value (base/error.h) on any failure: the broker must not start. */
brk_zap_t *brk_zap_new(void *ctx, const char *keys_dir, const char *key_file, bool pair);
/* Stops the handler and closes its socket (before zmq_ctx_term); frees.
 * NULL-safe; sets *z = NULL. */
void brk_zap_destroy(brk_zap_t **z);
/* Makes sock (not yet bound) a CURVE server with the broker's key in the
 * client or worker ZAP domain. 0, or -1 with a REEL_E_IO error. */
int brk_zap_server(brk_zap_t *z, void *sock, bool worker_side);
/* The socket the loop polls for the client or worker socket's failed
 * handshakes (NULL without keys or before brk_zap_server), and what it
 * does when it is readable: a peer without CURVE, or whose handshake does
 * not decrypt, never reaches the ZAP handler; each is counted as refused
 * and logged as the handler's refusals are (loop thread). */
void *brk_zap_monitor(brk_zap_t *z, bool worker_side);
void brk_zap_monitor_read(brk_zap_t *z, bool worker_side);
/* Reads the allowlist again: 0 with it swapped in, -1 with the error
 * value (base/error.h) and the old one kept (a half-read directory never
 * replaces a whole one). */
int brk_zap_reload(brk_zap_t *z);
/* Keys in the allowlist now. */
size_t brk_zap_keys(brk_zap_t *z);
/* Handshakes refused, and messages dropped because their key left the
 * allowlist, since the start. */
uint64_t brk_zap_refused(brk_zap_t *z);
uint64_t brk_zap_dropped(brk_zap_t *z);
/* The peers those handshakes came from (broker/brk_refused.h: a key from
 * an address on one socket), since the start; and the ones refused most
 * recently, the latest first, at most max (BRK_REFUSED_PEERS kept) into
 * out: how many. z NULL: 0. */
uint64_t brk_zap_refused_peers(brk_zap_t *z);
size_t brk_zap_refused_recent(brk_zap_t *z, msg_refused_peer_t *out, size_t max);

/* Who sent the message whose header frame is `frame` (not the identity
 * frame: after a zmq_poll, libzmq 4.3 leaves it without properties),
 * on the worker or client socket: 0 with *who filled; -1 when the sender
 * is not admitted now (no User-Id, a key no longer in the allowlist, or
 * one of a role that socket does not take). z NULL: 0, role none. */
int brk_zap_who(brk_zap_t *z, bool worker_side, const zmq_msg_t *frame, brk_who_t *who);
/* True when the key public_key is still allowed as a worker (z NULL or
 * key "": true). */
bool brk_zap_worker_allowed(brk_zap_t *z, const char *public_key);

/* The loop's gate, for every message it received: m decoded, or
 * malformed with `bad` its fault (NULL otherwise). true when it may be
 * handled. A message whose sender is not admitted any more is dropped
 * (counted; logged, the first ten then one in a thousand). A SYNC is
 * audited here when the broker will refuse it (bad fields, or a role that
 * may not send it: answered ERROR forbidden); brk_sync audits the others
 * with their outcome. */
bool brk_zap_admit(brk_t *b, bool worker_side, wire_msg_t *m, const wire_err_t *bad);

/* Records that `who` asked `action` ("sync") of s (NULL when it could not
 * be read) and what became of it (outcome: "accepted", "resend",
 * "refused: CODE: why", "denied: why"): one catalog audit row and one log
 * line. Can't fail from the caller's view. */
void brk_zap_audit(brk_t *b, const brk_who_t *who, const char *action, const msg_sync_t *s, const char *outcome);

/* Who sent the message the loop is handling now (brk_zap_admit let it
 * through): its key's name, role and public key. z NULL: role none, name
 * "-". Can't fail. */
void brk_zap_sender(brk_zap_t *z, brk_who_t *who);

/* Binds worker `name` to the key that sent the READY being handled;
 * key_out (REEL_KEY_Z85 bytes) receives that key. 0 when the name is free
 * or already that key's; -1 when another key, still in the allowlist,
 * holds it (or out of memory). A key holds at most BRK_ZAP_NAMES_PER_KEY
 * names: a new one past that lets go of the one it registered least
 * recently, preferring one for which live(arg, name) is false (live NULL:
 * none is live); the names of keys no longer in the allowlist are let go
 * too. Without keys: 0, key_out "". */
#define BRK_ZAP_NAMES_PER_KEY 16
int brk_zap_bind_worker(brk_zap_t *z, const char *name, char *key_out, bool (*live)(void *arg, const char *name),
                        void *arg);

#endif
