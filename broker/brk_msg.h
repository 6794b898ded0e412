/* brk_msg.h -- the broker's leaf helpers (internal header): the clock,
 * routing identities, typed sends to an identity, and finding a worker by
 * identity or name. Every module may use them; they use no module. */
#ifndef REEL_BROKER_BRK_MSG_H
#define REEL_BROKER_BRK_MSG_H

#include "broker/brk_broker.h"
#include "base/error.h"

/* Monotonic milliseconds. */
int64_t brk_now_ms(void);
/* UNIX seconds of the monotonic ms t (a time this process saw). */
double brk_unix_of(int64_t t);
/* Copies a routing identity (at most BRK_IDENT_MAX bytes). */
void brk_ident_from(brk_ident_t *id, const zmq_msg_t *msg);
/* Whether a and b are the same routing identity. */
bool brk_ident_eq(const brk_ident_t *a, const brk_ident_t *b);
/* A HEARTBEAT carrying "incoming" = bytes: the REQUEST that follows is
 * that large (msg.h, MSG_SLOW_BYTES_PER_MS). -1 (errno) when not sent. */
int brk_send_heads_up(void *sock, const brk_ident_t *to, uint64_t bytes);
/* msg_send to identity `to` on sock. 0, or -1 with errno. */
int brk_send(void *sock, const brk_ident_t *to, msg_type_t type, uint64_t id, const void *body,
             const wire_msg_t *share);
/* ERROR {id, code, message} to `to`. 0, or -1 with errno. */
int brk_send_error(void *sock, const brk_ident_t *to, uint64_t id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Counts a message that could not be handed to a peer: its queue is full
 * (sends never wait: ZMQ_SNDTIMEO 0; a client's answers are held first,
 * brk_deliver.h) or it is gone (ZMQ_ROUTER_MANDATORY). The first few are
 * logged with `what` and errno's text, then one in a thousand. */
void brk_undelivered(brk_t *b, const char *what);
/* Whether a peer may be answered about a bad message it sent: true while
 * its budget lasts (BRK_REPLY_BURST at once, BRK_REPLY_RATE per second);
 * otherwise the answer is counted in replies_suppressed and not sent, so
 * a peer flooding junk costs the broker no more than reading it. */
bool brk_reply_allowed(brk_t *b, const zmq_msg_t *identity);
/* Whether brk_reply_allowed would say true now, nothing taken: what goes
 * with the answer (a refused SYNC's audit) is written only when it will
 * be sent. */
bool brk_reply_budget_left(brk_t *b, const zmq_msg_t *identity);

/* A message struct to receive into (each is ~4 KB, past malloc's fast
 * bins: an accepted GEN keeps one until answered, and they are reused
 * rather than allocated per request). NULL when out of memory. */
wire_msg_t *brk_msg_new(brk_t *b);
/* Closes m and keeps it for reuse (or frees it). NULL is a no-op. */
void brk_msg_free(brk_t *b, wire_msg_t *m);
/* A zeroed request struct (~1 KB: calloc takes glibc's arena, not its
 * per-thread cache, for every one), reused from those freed; NULL when
 * out of memory. brk_req_release keeps r for reuse (or frees it). */
brk_req_t *brk_req_new(brk_t *b);
void brk_req_release(brk_t *b, brk_req_t *r);
/* Frees the kept message and request structs (shutdown). */
void brk_msg_pool_free(brk_t *b);

/* The registered worker with this identity / name, or NULL. */
brk_worker_t *brk_worker_find(brk_t *b, const zmq_msg_t *identity);
brk_worker_t *brk_worker_named(brk_t *b, const char *name);
/* Sends to worker w (what: the message, for the log). A transport failure
 * -- its pipe is gone or full (sends never wait) -- makes w
 * unroutable until it speaks again; any failure is logged. 0, or -1 with
 * errno. */
int brk_worker_send(brk_t *b, brk_worker_t *w, msg_type_t type, uint64_t id, const void *body,
                    const wire_msg_t *share);
/* As brk_worker_send, forwarding the received m as `type` (msg_forward). */
int brk_worker_forward(brk_t *b, brk_worker_t *w, const wire_msg_t *m, msg_type_t type, uint64_t id,
                       const msg_set_t *set, int n_set);
/* Marks w unroutable (it stays registered until it speaks again or
 * expires), logged within w's share of the log (w->log). */
void brk_worker_unreachable(brk_worker_t *w, const char *what);

#endif
