/* brk_sync.h -- weight syncs (internal header): a trainer's SYNC, the
 * barrier that answers it, the current version of each component, and
 * what each worker was sent (catching workers up). Knows workers only as
 * the entries of b->w and sends through brk_msg; the loop tells it when a
 * worker registers, speaks again, acks or is dropped. */
#ifndef REEL_BROKER_BRK_SYNC_H
#define REEL_BROKER_BRK_SYNC_H

#include "broker/brk_broker.h"

/* The longest a SYNC barrier waits: a larger deadline_ms is clamped to it
 * (about 24.8 days; as GEN deadlines). */
#define BRK_SYNC_DEADLINE_MAX_MS ((uint64_t)INT32_MAX)

/* The kind of the log lines a trainer's resends of a SYNC write (b->
 * resend_log): "sync C vN resent ...", and, for the current version
 * when nobody lags, its barrier's end ("complete", "SYNC_DONE not
 * delivered"): at most REEL_LOG_BURST a REEL_LOG_WINDOW_MS window, the
 * rest counted ("SYNC resends: N more lines like the ones above ...").
 * The lines of a resend that retries a lagging worker are not in it: its
 * barrier's end is written as it is (each is a retry), the SYNC sent to
 * the worker within that worker's share (w->log, brk_broker.h). */
#define BRK_SYNC_RESENDS "SYNC resends"

/* A SYNC from a trainer at `from` (the sender brk_zap_sender names) with
 * id, decoded and validated (a path, no inline tensors). Answers the
 * trainer itself: SYNC_DONE when its barrier ends, ERROR (stale_version,
 * bad_request) now. Audited with the sender's key (brk_zap_audit); a
 * resend only the first time its key resends the version, the rest
 * counted into one row written later (brk_resends_t). */
void brk_sync_request(brk_t *b, const zmq_msg_t *from, uint64_t id, const msg_sync_t *s);
/* SYNC_ACK a (message id `id`) from worker w; an ack of a version w was
 * never sent, or one answering an earlier SYNC of the version than the
 * last sent to w (its id another), is logged and ignored. */
void brk_sync_ack(brk_t *b, brk_worker_t *w, uint64_t id, const msg_sync_ack_t *a);
/* w just registered: what it reported at READY counts as sent, every
 * barrier still waiting for it sends it its SYNC again (a worker drops
 * one whose session ended), and it is caught up. */
void brk_sync_joined(brk_t *b, brk_worker_t *w);
/* w spoke again after a send to it failed (brk_workers_heard): the SYNCs
 * barriers could not deliver to it are sent now, and it is caught up. A
 * send that fails again on its transport leaves it waiting for the next
 * time; one that fails otherwise fails its member ("SYNC could not be
 * sent: <error>"). */
void brk_sync_reachable(brk_t *b, brk_worker_t *w);
/* Sends w every current SYNC newer than what it has and was sent. One
 * that cannot be sent but for its transport (w stays routable) fails the
 * barrier members of w it was to reach ("SYNC could not be sent: <error>");
 * the caller settles the barriers. */
void brk_catch_up(brk_t *b, brk_worker_t *w);
/* Worker w is being dropped: its pending barrier entries fail "worker
 * lost" ("SYNC not delivered: the worker was lost (why) before it
 * registered again" where its SYNC never reached it); none when it is
 * dropped for a READY under its name (it registered again: those wait). */
void brk_sync_worker_lost(brk_t *b, const brk_worker_t *w);
/* Makes a sync recorded current in the catalog (by path) the component's
 * current one again: after a broker restart, late joiners are still caught
 * up, requests still need it and a resend of it is still an ack;
 * base_version > 0: a LoRA adapter on that base, its folder, or sent by
 * upload (path BRK_SOURCE_UPLOADED) with its config text lora_config. 0, or -1
 * with the error value (base/error.h): REEL_E_LIMIT past
 * BRK_MAX_COMPONENTS components, REEL_E_NOMEM. */
int brk_sync_restore(brk_t *b, const char *component, uint64_t version, const char *sha256, const char *path,
                     uint64_t base_version, const char *lora_config);
/* The full version (its path, or BRK_SOURCE_UPLOADED) that the restored
 * current adapter of component is on: sent first to a worker that joins
 * below it (brk_catch_up). 0, or -1 with the error value (REEL_E_STATE
 * when the current version is no adapter on it). */
int brk_sync_restore_base(brk_t *b, const char *component, uint64_t version, const char *sha256, const char *path);
/* A standby pair's takeover (brk_ha.c): the peer's current SYNC s, when
 * newer than this broker's, becomes the component's current one, recorded
 * current in the catalog with `why`. 1 when adopted, 0 when not newer, -1
 * with the error value (REEL_E_LIMIT, REEL_E_NOMEM). */
int brk_sync_adopt(brk_t *b, const msg_sync_t *s, const char *why);
/* Answers every trainer waiting on a barrier ERROR code ("<why> before
 * sync C vN completed"), fails the pending versions in the catalog and
 * frees the barriers; the current versions stay. */
void brk_sync_give_up(brk_t *b, const char *code, const char *why);
/* Fails the members of expired barriers ("timeout"; "SYNC not
 * delivered: the worker did not register again before the sync's
 * deadline" where the SYNC never reached the worker) and settles them. */
void brk_sync_timers(brk_t *b, int64_t now);
int64_t brk_sync_next_deadline(const brk_t *b);
/* The current version of component (0 before any applied sync). */
uint64_t brk_current_version(const brk_t *b, const char *component);
/* The full version the current version of component is on when that is
 * a LoRA adapter (its base_version), else 0: --weights-keep keeps it. */
uint64_t brk_current_base(const brk_t *b, const char *component);
/* Whether a SYNC of component's version is under way (pending, held or
 * running): its bytes may be fetched at any moment. */
bool brk_sync_under_way(const brk_t *b, const char *component, uint64_t version);
/* The sha256 of that SYNC (NULL: none under way). */
const char *brk_sync_under_way_sha(const brk_t *b, const char *component, uint64_t version);
/* Why w is behind the current version of component: NULL when it is not,
 * else a reason written into buf[0..len). */
const char *brk_sync_lag(const brk_t *b, const brk_worker_t *w, const char *component, char *buf, size_t len);
/* Answers every waiting trainer ERROR internal, fails pending versions in
 * the catalog, frees every barrier and current SYNC. */
void brk_sync_shutdown(brk_t *b);

#endif
