/* brk_refused.h -- the peers whose handshake the broker refused, each
 * counted once (internal header). STATUS auth_refused counts handshakes:
 * one client that knocks again and again (a Reel client whose key was
 * refused tries a fresh socket up to once a second while a call waits)
 * makes it thousands. This table says how many peers they came from and
 * which: a peer is a public key from an address (as ZAP gives it: over
 * ipc, localhost:UID:GID:PID, the peer's process) on one socket; a
 * handshake that failed before the broker read a key (no CURVE, a HELLO
 * that does not decrypt) names neither, so those count as one peer per
 * socket and reason.
 *
 * The memory is bounded against a peer that cycles keys: the table holds
 * the BRK_REFUSED_PEERS seen most recently, and the one seen least
 * recently makes room for a new one. `peers` counts every peer the table
 * took in: exact while no more than BRK_REFUSED_PEERS peers were refused,
 * and past that a peer that fell out and came back counts again (an upper
 * bound; a flood of new keys shows as a count that keeps growing).
 *
 * Thread-safe (a mutex): the ZAP handler's thread notes the refusals it
 * makes, the loop thread those its sockets' monitors report, and reads. */
#ifndef REEL_BROKER_BRK_REFUSED_H
#define REEL_BROKER_BRK_REFUSED_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "schema/msg.h"

#define BRK_REFUSED_PEERS 32 /* the peers remembered (STATUS auth_refused_recent lists them) */

typedef struct {
    bool worker_side;
    char key[MSG_REFUSED_KEY_MAX];   /* z85; "" when refused before the key was read */
    char name[MSG_NAME_MAX];         /* the key's allowlist name (a key of another role), else "" */
    char address[MSG_REFUSED_ADDR_MAX];
    char why[MSG_REFUSED_WHY_MAX];
    uint64_t count;
    int64_t last_ms;                 /* CLOCK_MONOTONIC of its last refusal */
} brk_refused_peer_t;

typedef struct {
    pthread_mutex_t mu;
    brk_refused_peer_t e[BRK_REFUSED_PEERS];
    int n;
    uint64_t peers;                  /* peers taken in since the start */
} brk_refused_t;

/* An empty table. 0, or -1 with the error value when no mutex can be made
 * (nothing to release then). */
int brk_refused_init(brk_refused_t *t);
/* Releases the mutex. Call once, after the last note. */
void brk_refused_fini(brk_refused_t *t);

/* Notes one refused handshake of the peer (key, address) on the worker or
 * client socket; key and address "" (or NULL) when unknown, name the
 * key's allowlist name or ""; why the reason, kept as the latest (a
 * peer with no key is told apart by it). Texts too long are cut. Returns
 * true when the refusal is worth a log line: a peer new to the table while
 * the peers so far are few (the first ten, then one in a thousand: a peer
 * cycling keys must not flood the log), or the 1000th, 2000th, ...
 * refusal of one peer. *peer_count (NULL: not wanted) receives this peer's
 * refusals so far. Can't fail. */
bool brk_refused_note(brk_refused_t *t, bool worker_side, const char *key, const char *name, const char *address,
                      const char *why, int64_t now_ms, uint64_t *peer_count);

/* Peers taken in since the start (see above). */
uint64_t brk_refused_peers(brk_refused_t *t);

/* The peers remembered, the most recent first, as STATUS lists them: at
 * most max into out, with ago_ms against now_ms. Returns how many. */
size_t brk_refused_recent(brk_refused_t *t, msg_refused_peer_t *out, size_t max, int64_t now_ms);

#endif
