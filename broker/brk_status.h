/* brk_status.h -- STATUS_REPLY (internal header). */
#ifndef REEL_BROKER_BRK_STATUS_H
#define REEL_BROKER_BRK_STATUS_H

#include "broker/brk_broker.h"

/* Answers STATUS id from identity `to`: every worker (capacity, applied
 * versions, what it lags on and why, its recent shard keys), the queue,
 * the current and pending versions, the counters, and each model a live
 * worker serves with its config. */
void brk_status_reply(brk_t *b, const zmq_msg_t *to, uint64_t id);

#endif
