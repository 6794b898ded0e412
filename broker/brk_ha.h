/* brk_ha.h -- a standby pair (internal header): two brokers, one active
 * and one standby, each sending the other a PEER every heartbeat (to the
 * other's client endpoint), after zguide's Binary Star. docs/PROTOCOL.md
 * "A standby broker" and docs/OPERATIONS.md "Two brokers" state the rules;
 * brk_ha_next is them, as a pure function (tests/test_broker_unit.c).
 *
 * The fencing rule: a broker serves (GEN, SYNC, UPLOAD; workers) only
 * while active. A standby becomes active only (a) when its peer says it
 * is standby too and this one is the primary, or (b) when its peer has
 * been silent for the peer timeout AND a client sends it again a GEN,
 * SYNC or UPLOAD it answered ERROR standby before: that client tried the
 * other broker and found it gone. A cut between the two brokers alone,
 * the active one still answering its clients, never makes a second
 * active broker. Two actives (the
 * old one came back after a full partition) are resolved by the term
 * (takeovers counted across the pair): the lower term, or the backup at
 * the same term, steps down. */
#ifndef REEL_BROKER_BRK_HA_H
#define REEL_BROKER_BRK_HA_H

#include "broker/brk_broker.h"

typedef enum {
    BRK_HA_STARTING, /* started, not yet heard its peer nor past the timeout */
    BRK_HA_ACTIVE,
    BRK_HA_STANDBY,
} brk_ha_state_t;

/* What brk_ha_next decides from. */
typedef struct {
    brk_ha_state_t state;
    bool primary;            /* --role primary */
    uint64_t term;
    bool peer_heard;         /* a PEER came within the peer timeout */
    brk_ha_state_t peer;     /* its state, when heard */
    uint64_t peer_term;
    bool peer_silent;        /* nothing from the peer for the timeout (since start when never heard) */
    bool client_asks;        /* a GEN, SYNC or UPLOAD from a client is at hand */
} brk_ha_view_t;

/* The state the rules give for v (the term grows by one on becoming
 * active: brk_ha_t does that). Pure. */
brk_ha_state_t brk_ha_next(const brk_ha_view_t *v);
/* "starting", "active", "standby". */
const char *brk_ha_name(brk_ha_state_t s);
/* The state named by text; -1 for another name. */
int brk_ha_parse(const char *text);

/* Sets the pair up from b->opt (--peer, --role, --peer-timeout-ms):
 * b->ha stays NULL for a broker alone. 0, or -1 with the error value. */
int brk_ha_start(brk_t *b);
void brk_ha_stop(brk_t *b);
/* True while b serves requests, syncs and workers (always alone). */
bool brk_ha_active(const brk_t *b);
/* A GEN, SYNC or UPLOAD from a client, named by `key` (brk_ha_key_*; 0:
 * none): true when b serves it (active, or it took over now by the
 * rules); else false, answered ERROR standby. A standby whose peer is
 * silent takes over only for a request it already refused once, sent
 * again by the same client (its token) on another connection: that client
 * moved to the other broker (a new socket each move) and came back. A
 * client that found the active one never comes back, so a cut between
 * the two brokers alone never makes this one active; another chunk of an
 * upload, or a resend on the same connection, is no comeback. */
bool brk_ha_client(brk_t *b, const wire_msg_t *m, uint64_t key);
/* The key of a GEN: its client token and id (0 without a token). */
uint64_t brk_ha_key_gen(const msg_gen_t *g, uint64_t id);
/* The key of a SYNC or UPLOAD: its client token and (component, version,
 * sha256) (0 without a token: never a comeback). */
uint64_t brk_ha_key_weights(uint64_t client, const char *component, uint64_t version, const char *sha256);
/* A message on the worker socket while not active: a READY is answered
 * ERROR standby (the worker tries the other broker), others dropped. */
void brk_ha_worker(brk_t *b, const wire_msg_t *m);
/* A PEER from the other broker. */
void brk_ha_peer(brk_t *b, const wire_msg_t *m, const msg_peer_t *p);
/* Sends the PEER when due; takes the peer's silence into account. */
void brk_ha_timers(brk_t *b, int64_t now);
/* The DEALER to the peer, for the loop's poll (NULL alone), and the
 * answers waiting on it read (the standby's copies, brk_ha_copy.c). */
void *brk_ha_socket(const brk_t *b);
void brk_ha_answers(brk_t *b);
/* When brk_ha_timers has a PEER to send (INT64_MAX alone). */
int64_t brk_ha_next_wake(const brk_t *b);
/* STATUS_REPLY's ha_* fields (left empty alone). */
void brk_ha_status(const brk_t *b, msg_status_reply_t *r);

#endif
