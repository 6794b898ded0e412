/* brk_workers.h -- the workers the broker knows (internal header),
 * Majordomo-style: READY registers one, any message proves it alive,
 * HEARTBEAT goes out every interval, one silent for `liveness` intervals
 * (or that says DISCONNECT) is marked dead; the loop drops dead workers
 * (brk_loop.c) and asks the other modules to let go of them first. */
#ifndef REEL_BROKER_BRK_WORKERS_H
#define REEL_BROKER_BRK_WORKERS_H

#include "broker/brk_broker.h"

/* Whether the READY of worker `name` being handled is refused: 0 when it
 * is not (the name is bound to the sender's key when it was free); -1
 * with a REEL_E_INVALID error (base/error.h) when a live worker other
 * than `self` is registered under the name, or another key holds it
 * (brk_zap.h). */
int brk_workers_refuse(brk_t *b, const char *name, const brk_worker_t *self);
/* Registers the worker that sent READY r (decoded and validated) from
 * identity. again: the shares of the log of the registration it replaces
 * (a READY again: a restart), which it keeps, its "ready" line within
 * again->again_log; NULL for a worker that joins. NULL on out-of-memory
 * (nothing changed). */
brk_worker_t *brk_workers_add(brk_t *b, const zmq_msg_t *identity, const msg_ready_t *r,
                              const brk_worker_shares_t *again);
/* The name a worker's READYs again are summed up under in the log
 * ("NAME READYs again"), in buf. Returns buf. Can't fail. */
const char *brk_workers_again_who(const brk_worker_t *w, char *buf, size_t len);
/* brk_log_summary of every worker's shares of the log. Can't fail. */
void brk_workers_log_summaries(brk_t *b);
/* w spoke: it is alive, and routable again if a send had failed. true when
 * it just became routable again (it may have missed syncs). */
bool brk_workers_heard(brk_t *b, brk_worker_t *w);
/* EVENTS from w: one catalog record per entry; entries of an unknown kind
 * or without a key hash are skipped and counted in one log line. */
void brk_workers_events(brk_t *b, brk_worker_t *w, const msg_events_t *ev);
/* EVENTS from a worker connection the broker does not know (it restarted,
 * or it expired the worker): a copy kept until that connection's READY
 * (brk_workers_adopt_events), at most BRK_ORPHANS messages for at most
 * brk_orphan_ms; the rest counted lost. Can't fail (out of memory: lost). */
void brk_workers_keep_events(brk_t *b, const zmq_msg_t *identity, const msg_events_t *ev);
/* w just registered: the events its connection sent before, recorded as
 * its own, in the order they came. */
void brk_workers_adopt_events(brk_t *b, brk_worker_t *w);
/* Frees every kept event (shutdown). */
void brk_workers_free_events(brk_t *b);
/* Sends HEARTBEAT to every worker when due; marks silent ones dead, and
 * those whose key left the allowlist (a reload); sends the PREWARMs due
 * (current: the transformer's current version, brk_workers_prewarm's). */
void brk_workers_timers(brk_t *b, int64_t now, uint64_t current);
/* w's PREWARM, once, when its READY asked (`prewarm` K): the K hottest
 * keys it owns now (brk_hot.h), sent once the syncs it was sent on joining
 * are answered (so it captures on the version it will serve); called at
 * READY and SYNC_ACK, before requests are routed to it (so the PREWARM
 * comes first), and by the timers. An empty list goes too. Owning is
 * judged at `current`, the transformer's current version (what a GEN
 * naming no version needs; the loop passes brk_current_version's). */
void brk_workers_prewarm(brk_t *b, brk_worker_t *w, int64_t now, uint64_t current);
/* Index of a dead worker in b->w, or -1 when none is. */
int brk_workers_next_dead(const brk_t *b);
/* Takes worker i out of b->w (the catalog hears why) and returns it; the
 * caller frees it once nothing points to it. Its loss is logged, after the
 * counts of the lines its shares of the log left out (said now: they go
 * with it), but for a restart's ("restarted"): the READY again says that
 * one, within the shares the new registration keeps. */
brk_worker_t *brk_workers_unlink(brk_t *b, int i);

#endif
