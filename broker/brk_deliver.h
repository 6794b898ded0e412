/* brk_deliver.h -- the broker's sends to clients (internal header): an
 * answer a client's connection cannot take now is held and sent when it
 * can, in order; only PROGRESS is lost to a full queue.
 *
 * The broker never waits on a peer (ZMQ_SNDTIMEO 0, ZMQ_ROUTER_MANDATORY:
 * a send to a full queue fails at once with EAGAIN). A client's queue is
 * full for a moment when a burst of PROGRESS fills it -- a broker that
 * stalled forwarding what its workers sent meanwhile, or a client busy
 * elsewhere while its request steps -- and a RESULT dropped there left
 * the client waiting its whole timeout for a request that ran (its
 * liveness STATUS meets the same broker: it never resends). So every
 * message to a client but PROGRESS that finds its queue full is held:
 * kept, in the order sent, for that client alone, and sent by
 * brk_deliver_retry as the queue takes it. While a client has anything
 * held its PROGRESS are dropped (the next says more) and its later
 * answers wait behind. A PROGRESS not sent (as above, or to a client
 * that is gone) is counted in `progress_dropped`. Dropped, each counted
 * in `undelivered` (brk_undelivered): any other message to a client that
 * is gone (EHOSTUNREACH), and the held answers of a client that took none
 * of them for BRK_HELD_MS (stuck, or gone without its connection
 * closing), or that would pass BRK_HELD_PER_CLIENT messages or, all
 * clients together, --max-held-mb of bytes (a second budget beside the
 * requests' tensors): a client that never reads must not pin memory.
 *
 * The worker socket keeps its own rule (brk_worker_send: a worker that
 * cannot take a message is made unroutable). One thread, the loop's. */
#ifndef REEL_BROKER_BRK_DELIVER_H
#define REEL_BROKER_BRK_DELIVER_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "broker/brk_broker.h"
#include "base/error.h"

#define BRK_HELD_MS 30000         /* a client that takes none of its held answers this long loses them */
#define BRK_HELD_PER_CLIENT 1024  /* answers held for one client at most */
#define BRK_HELD_RETRY_MS 5       /* while any are held the loop wakes this often to send them */

/* A message of `type` with id and *body to the client whose routing
 * identity is `to` (as msg_send; share: tensors sent by reference). 0
 * when sent or held; -1 with errno when dropped (a PROGRESS counted in
 * progress_dropped; anything else undelivered: a client gone, the bounds
 * above, or a body the codec refuses). Never waits. */
int brk_client_send(brk_t *b, const zmq_msg_t *to, msg_type_t type, uint64_t id, const void *body,
                    const wire_msg_t *share);
/* The same to a routing identity kept as a brk_ident_t (a trainer's). */
int brk_client_send_ident(brk_t *b, const brk_ident_t *to, msg_type_t type, uint64_t id, const void *body);
/* As brk_client_send, forwarding the received m as `type` (msg_forward:
 * its tensor frames by reference, so a held RESULT keeps them alive). */
int brk_client_forward(brk_t *b, const zmq_msg_t *to, const wire_msg_t *m, msg_type_t type, uint64_t id,
                       const msg_set_t *set, int n_set);

/* ERROR {id, code, message} to identity `to` on the worker or client
 * socket, never waiting: a client's is held as above; a failure is
 * counted (brk_undelivered). to NULL (no one asked: a copy from the peer
 * broker) logs it instead. */
void brk_error_to(brk_t *b, bool worker_side, const zmq_msg_t *to, uint64_t id, const char *code,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The same for a failure a broker function reported (base/error.h): the
 * one place the broker turns an error value into an ERROR. Its code is
 * wire_err_code_of(r->code), its message `what` ("UPLOAD: "; NULL: none)
 * then r's message (never its detail: that is for the log). */
void brk_error_from(brk_t *b, bool worker_side, const zmq_msg_t *to, uint64_t id, const reel_err_t *r,
                    const char *what);
/* ERROR to a routing identity kept as a brk_ident_t, as brk_error_to. */
void brk_error_to_ident(brk_t *b, const brk_ident_t *to, uint64_t id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Sends what is held, each client's in order, as far as its queue takes
 * it; drops (counted) the held answers of a client gone or silent past
 * BRK_HELD_MS at `now`. The loop calls it every pass. Can't fail. */
void brk_deliver_retry(brk_t *b, int64_t now);
/* When the loop must wake next to retry: now + BRK_HELD_RETRY_MS while
 * anything is held, else INT64_MAX. */
int64_t brk_deliver_next_wake(const brk_t *b, int64_t now);
/* One last try to send what is held, then drops the rest (counted): the
 * broker stops. Safe when nothing is held. */
void brk_deliver_stop(brk_t *b);
/* The held lists' invariants: each client listed once with at least one
 * answer, counts and bytes adding up to answers_held and
 * answers_held_bytes. 0, or -1 with a REEL_E_INTERNAL error naming the
 * first broken (brk_check). */
int brk_deliver_check(const brk_t *b);

#endif
