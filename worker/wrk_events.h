/* wrk_events.h -- the worker's event buffer: what the capture cache reports
 * (captures, declines, evictions) and the replayed steps the executor counts,
 * batched into EVENTS messages (docs/PROTOCOL.md) by the main thread.
 *
 * Declines arrive once per eager call, so they are aggregated: a decline
 * merges into the pending entry with the same (key_hash, reason) unless a
 * capture or eviction of that key came after it (the order of a key's
 * lifecycle is kept). Replays are only counted, per (key_hash, stream), and
 * emitted as {kind "replays", count}. The buffer is bounded: past its limit
 * events are dropped and counted, never allowed to grow without end while
 * the broker is away. wrk_events_flush sends them: an EVENTS the broker's
 * connection cannot take is held, one that cannot be sent is counted
 * dropped too (the next EVENTS' `dropped` says so).
 *
 * Streams in events are the worker's stream numbers. The cache numbers
 * streams in the order it first sees them; the map between the two is
 * learned from captures and declines, which the cache delivers on the thread
 * of the stream the entry belongs to (wrk_events_set_thread_stream).
 *
 * Threads: every function may be called from any thread (one mutex). */
#ifndef REEL_WORKER_WRK_EVENTS_H
#define REEL_WORKER_WRK_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "capture_cache/cache.h"
#include "schema/msg.h"

#define WRK_EVENTS_PER_MSG 128   /* keeps an EVENTS header far below 256 KiB */

typedef struct wrk_events wrk_events_t;

/* A buffer holding at most max_pending entries (events + replay counters).
 * NULL on out-of-memory. */
wrk_events_t *wrk_events_new(size_t max_pending);
void wrk_events_destroy(wrk_events_t **e);

/* Declares the worker stream number of the calling thread (-1: none). */
void wrk_events_set_thread_stream(int stream);

/* The cap_options_t.on_event callback; user is the wrk_events_t. Can't fail
 * (an event that does not fit is counted as dropped). */
void wrk_events_on_cache(void *user, const cap_event_t *ev);

/* Queues one EVENTS entry as it is (its key string copied), in order with
 * the cache's events: the artifact entries of docs/ARTIFACTS.md. Can't
 * fail (counted as dropped when it does not fit). */
void wrk_events_push(wrk_events_t *e, const msg_event_t *ev);

/* Counts one replayed step of key_hash on worker stream `stream`. */
void wrk_events_replay(wrk_events_t *e, uint64_t key_hash, int stream);

/* True when something is waiting to be sent. */
bool wrk_events_pending(wrk_events_t *e);

/* Removes up to max entries and returns them as EVENTS entries (oldest
 * first; replay counters after the events), *n of them, in one block the
 * caller frees (their key strings live in it too). NULL when nothing is
 * pending or on out-of-memory (the entries then stay). *dropped (may be
 * NULL) receives and resets the count of events dropped since the last
 * call. */
msg_event_t *wrk_events_take(wrk_events_t *e, size_t max, size_t *n, uint64_t *dropped);

/* An EVENTS message the broker's connection could not take yet (its
 * queue full: the broker stalled or busy), kept to go first at the next
 * flush. Zeroed: none. */
typedef struct {
    wire_parts_t parts;
    uint64_t entries;            /* the events it carries, and those its `dropped` reports */
} wrk_events_held_t;

/* Sends what is pending on `out` (the DEALER to the broker), at most
 * max_msgs EVENTS of WRK_EVENTS_PER_MSG entries, never waiting. What is
 * held goes first; a message `out` cannot take now is held (and nothing
 * more is taken meanwhile: the buffer keeps what waits, bounded, counting
 * what does not fit as dropped); a message that cannot be sent for any
 * other reason is lost, and its entries counted as dropped, so the next
 * EVENTS' `dropped` reports them. 0 when nothing waits any more, 1 when
 * something still does (held, or more pending than max_msgs). */
int wrk_events_flush(wrk_events_t *e, void *out, wrk_events_held_t *held, int max_msgs);
/* Drops what held holds (the worker stops). Safe on an empty one. */
void wrk_events_held_clear(wrk_events_held_t *held);

#endif
