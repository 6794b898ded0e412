/* wrk_pipe.h -- the inproc pipe from stream and sync threads to the main
 * thread. Each producer owns a PUSH socket (ZeroMQ sockets are never shared
 * between threads); the main thread owns the PULL and forwards each message
 * to the broker unchanged, minus a first frame that only the pipe uses:
 *
 *   [ wrk_pipe_tag_t ][ header ][ tensor frames... ]   (a wire message)
 *
 * The tag carries the broker session (epoch) the message belongs to, so the
 * main thread drops what a stream finished for a session that is gone.
 * Neither side has a high-water mark: producers never block on the main
 * thread, and what can queue is bounded by the requests in flight. */
#ifndef REEL_WORKER_WRK_PIPE_H
#define REEL_WORKER_WRK_PIPE_H

#include <stdint.h>
#include <zmq.h>
#include "schema/msg.h"

typedef struct {
    uint64_t epoch;                  /* 0: belongs to no session, always sent */
    uint32_t droppable;              /* 1: lost when the broker's connection is full (PROGRESS: the
                                      * next one says more); 0: held until it takes it */
} wrk_pipe_tag_t;

/* A message the broker's connection could not take when it was
 * forwarded (its queue full: the broker stalled, or busy reading a
 * flood of PROGRESS), kept to be sent when it can (wrk_pipe_retry): a
 * RESULT or ERROR lost there would leave its request waiting at the
 * broker for an answer that never comes, until its deadline. Zeroed:
 * nothing held. */
typedef struct {
    zmq_msg_t part[2 + WIRE_MAX_TENSORS];
    int np;                          /* parts held; 0: none */
    uint64_t epoch;                  /* its tag's */
} wrk_pipe_held_t;

/* A PUSH socket connected to the pipe. NULL with errno. */
void *wrk_pipe_push_new(void *zctx);
/* The PULL socket, bound. NULL with errno. */
void *wrk_pipe_pull_new(void *zctx);
/* Sends tag + message (as msg_send: type, id, body). 0, or -1 with errno. */
int wrk_pipe_send(void *push, uint64_t epoch, msg_type_t type, uint64_t id, const void *body);
/* Sends ERROR {id, code, message} through the pipe. */
int wrk_pipe_send_error(void *push, uint64_t epoch, uint64_t id, const char *code, const char *message);
/* Receives one pipe message and sends it on `out` (may be NULL: dropped),
 * unless its epoch is neither 0 nor `epoch` (dropped). Returns 1 when one
 * was forwarded, 0 when dropped, 2 when `out` could not take it now and
 * it went into `held` (a message not droppable, with held given and empty;
 * without held it is dropped: 0), -1 on EAGAIN or a socket error (errno).
 * flags as zmq_msg_recv. While a message is held the caller forwards
 * nothing else (the broker's order stays the streams' order) and calls
 * wrk_pipe_retry when `out` can take more. */
int wrk_pipe_forward(void *pull, void *out, uint64_t epoch, int flags, wrk_pipe_held_t *held);
/* Sends what `held` holds on `out` now, if it can. 1 when nothing is held
 * any more (sent; or dropped: its epoch is neither 0 nor `epoch`, or a
 * socket error other than EAGAIN), 0 when it is still held. */
int wrk_pipe_retry(wrk_pipe_held_t *held, void *out, uint64_t epoch);
/* Drops what `held` holds (a connection that ended: its session's
 * requests are the broker's to requeue). Safe on an empty one. */
void wrk_pipe_held_clear(wrk_pipe_held_t *held);

#endif
