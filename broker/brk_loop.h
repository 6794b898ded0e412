/* brk_loop.h -- the broker's routing loop (internal header). */
#ifndef REEL_BROKER_BRK_LOOP_H
#define REEL_BROKER_BRK_LOOP_H

#include <signal.h>

#include "broker/brk_broker.h"

/* Handles one message received (msg_recv returned rc, with *err when rc
 * is 1) on the worker socket (worker_side) or the client socket: a bad one
 * is counted and answered ERROR; a good one is decoded and dispatched to
 * its module, or answered ERROR when its fields are wrong. Then the broker
 * settles: dead workers are dropped (their work requeued) and queued
 * requests that can run are sent. A module that keeps the message takes
 * *mp (sets it NULL); the caller closes and frees what is left. */
void brk_handle(brk_t *b, bool worker_side, wire_msg_t **mp, int rc, const wire_err_t *err);
/* Drops every dead worker: its barrier entries fail, its requests are
 * requeued or failed, then it is freed. Returns how many were dropped. */
int brk_reap(brk_t *b);
/* Runs until *stop becomes nonzero (a signal). 0 on a clean stop, -1 when
 * polling failed (message logged). */
int brk_run(brk_t *b, volatile sig_atomic_t *stop);


#endif
