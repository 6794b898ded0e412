/* brk_requests.h -- GEN requests from acceptance to their one final reply
 * (internal header). Knows workers only as routing peers (b->w) and sends
 * through brk_msg; the loop hands it what it needs of the syncs (the
 * current version) and of dead workers. */
#ifndef REEL_BROKER_BRK_REQUESTS_H
#define REEL_BROKER_BRK_REQUESTS_H

#include "broker/brk_broker.h"

/* The kinds of the lines clients' requests write (b->request_log,
 * brk_log_kind): at most REEL_LOG_BURST of each a REEL_LOG_WINDOW_MS
 * window, the rest counted ("KIND: N more lines like the ones above ...",
 * said by the loop's timers once the window ends). A client that resends
 * a live GEN, or sends GENs it cancels or lets expire, in a loop wrote a
 * line for each one. Each is still answered as docs/PROTOCOL.md says, and
 * what ended a request is in the catalog and the metrics whatever the log
 * left out.
 * BRK_GEN_RESENDS: "GEN N of client C resent while request R runs".
 * BRK_REQUEST_ENDS: a request's end or loss: cancelled (queued, or
 * running, and then its worker's late answer discarded), failed no_worker
 * or timeout, its place in a full queue given up, requeued or failed
 * worker_lost when its worker dies, its slot freed without a late answer. */
#define BRK_GEN_RESENDS "GEN resends"
#define BRK_REQUEST_ENDS "request ends"

/* A GEN from a client, g decoded and validated (it points into *mp).
 * current: the transformer version a GEN without "version" needs. Takes
 * ownership of *mp when it keeps the request (sets *mp = NULL); answers
 * the client itself otherwise (too_large, BUSY, ERROR). */
void brk_req_accept(brk_t *b, wire_msg_t **mp, const msg_gen_t *g, uint64_t current);
/* PROGRESS / RESULT / ERROR from worker w about request id (the broker's
 * id). A reply to a request w does not hold is logged and dropped. r
 * points into m, whose tensor frames go to the client by reference. */
void brk_req_progress(brk_t *b, brk_worker_t *w, uint64_t id, const msg_progress_t *p);
void brk_req_result(brk_t *b, brk_worker_t *w, uint64_t id, msg_result_t *r, const wire_msg_t *m);
void brk_req_error(brk_t *b, brk_worker_t *w, uint64_t id, const msg_error_t *e);
/* A client's CANCEL: the GEN it names (the sender's of id m->id, or
 * client c->client's) is answered ERROR cancelled now and recorded so;
 * queued, it is dropped; running, its worker is sent CANCEL and its slot
 * stays taken until the worker answers (or ABANDON_GRACE_MS). A CANCEL
 * naming no live request is counted and otherwise ignored. */
void brk_req_cancel(brk_t *b, const wire_msg_t *m, const msg_cancel_t *c);
/* Sends queued requests whose owner has room, oldest first. */
void brk_pump(brk_t *b);
/* Worker w is being dropped: each request it held is requeued once, or
 * answered ERROR worker_lost on a second loss; abandoned ones are freed. */
void brk_req_worker_lost(brk_t *b, const brk_worker_t *w);
/* Answers expired requests (timeout / no_worker). */
void brk_req_timers(brk_t *b, int64_t now);
/* Answers every request ERROR internal (shutdown) and frees them all. */
/* Answers every live request ERROR code (why) and forgets it (a standby
 * pair's broker stepping down: brk_ha.c; each recorded in the catalog
 * with status `code`, unless code is internal: a shutdown's). */
void brk_req_give_up(brk_t *b, const char *code, const char *why);
void brk_req_shutdown(brk_t *b);
/* Earliest request deadline (INT64_MAX when none). */
int64_t brk_req_next_deadline(const brk_t *b);

#endif
