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
#include "schema/msg.h"

typedef struct {
    uint64_t epoch;                  /* 0: belongs to no session, always sent */
} wrk_pipe_tag_t;

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
 * was forwarded, 0 when dropped, -1 on EAGAIN or a socket error (errno).
 * flags as zmq_msg_recv. */
int wrk_pipe_forward(void *pull, void *out, uint64_t epoch, int flags);

#endif
