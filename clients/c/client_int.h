/* client_int.h -- what client.c shares with client_many.c (reel_gen_many),
 * not part of the client's API: the live wait of docs/PROTOCOL.md
 * "Delivery" over any number of messages in flight, one GEN built from a
 * reel_gen_t and its RESULT taken. reel_gen and reel_gen_many run the same
 * code for each: one request alone, or many on one connection. */
#ifndef REEL_CLIENTS_C_CLIENT_INT_H
#define REEL_CLIENTS_C_CLIENT_INT_H

#include <stddef.h>
#include <stdint.h>
#include "client.h"

/* Monotonic milliseconds. Can't fail. */
int64_t cli_now_ms(void);
/* err's code and its message from fmt. Can't fail (a long message is cut). */
void cli_set_err(wire_err_t *err, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* What a timeout adds about c's handshakes ("" when nothing; c's buffer,
 * valid until the next call of it). */
const char *cli_handshake_hint(reel_client_t *c);
/* A new request id of c (unique for c's lifetime). */
uint64_t cli_new_id(reel_client_t *c);

/* Every call's start and end: c's socket (opened at the first call, or
 * fresh in place of a dead one) and its handshake watch while the broker
 * has not answered on it (client.h, reel_client_sockets). cli_call_begin:
 * 0, or -1 with err ("internal") when no socket can be made; a call that
 * began ends with cli_call_end, whatever happened between. */
int cli_call_begin(reel_client_t *c, wire_err_t *err);
void cli_call_end(reel_client_t *c);
/* ERROR or BUSY m: 1 with err its code ("busy" for BUSY) and message (m
 * is left open); any other message: 0. */
int cli_answer_is_error(wire_msg_t *m, wire_err_t *err);

/* fn(user, id, done, total) as a PROGRESS of request id comes: its steps
 * done, then a decoded output's latent frames (done = steps + frames
 * decoded, of steps + frames to decode: the total grows when the decode
 * starts). */
typedef void (*cli_progress_fn)(void *user, uint64_t id, int done, int total);

/* A message a live wait sends again, the same request, when its broker was
 * lost (a GEN: the same id and client token; a SYNC: idempotent). body
 * stays valid while the wait runs. */
typedef struct {
    msg_type_t type;
    uint64_t id;
    const void *body;
} cli_live_msg_t;

/* What a live wait knows between its cli_live_next calls (a round of
 * several keeps one): the broker the messages reached and the STATUS out
 * to it. Set by cli_live_begin. */
typedef struct {
    uint64_t ping;          /* the last liveness STATUS sent (0: none); its answer's boot names the broker */
    uint64_t boot;          /* the boot id of the broker the messages reached (0: not known) */
    bool asked;             /* ping is out, not answered */
    bool first;             /* ... and it is the one sent just before the messages */
    bool resent;            /* the messages went again after ping was sent */
    int standbys;           /* ERROR standby answers (a standby pair still choosing) */
} cli_live_t;

/* The start of a live wait, before its first message is sent: with a
 * liveness and no boot id known yet, a STATUS (its answer names the broker
 * that got the messages sent next). 0, or -1 with err as send_msg's:
 * "timeout" (could not be sent by deadline), "interrupted", "internal". */
int cli_live_begin(reel_client_t *c, cli_live_t *st, int64_t deadline, wire_err_t *err);
/* Sends one message of a live wait by deadline (the socket never blocks).
 * A socket the broker refused for good while the send waits is replaced
 * (client.h, reel_client_new_keys) and the message goes on the fresh one;
 * the next cli_live_next sends again every message sent on the old one.
 * 0, or -1 with err as cli_live_begin. */
int cli_live_send(reel_client_t *c, const cli_live_msg_t *m, int64_t deadline, wire_err_t *err);
/* The next answer to one of msgs[0..n) (n >= 1; all sent), in *m (m->id
 * says which; the caller closes it): a RESULT, SYNC_DONE, ERROR or BUSY.
 * PROGRESS of them goes to fn (NULL: dropped). Meanwhile: after every
 * liveness_ms of silence a STATUS; when it goes unanswered for liveness_ms
 * too, or another broker answers it (a new boot id: a restart), every
 * message of msgs is sent again (and when a RESULT names another boot than
 * the one they reached, every one but its own); with a standby pair, an ERROR standby to
 * one of them or that silence moves c to the other broker, where every one
 * goes again (client.h, reel_client_set_liveness). Each message sent again
 * counts in reel_client_resends and goes to the on_resend hook. A socket
 * the broker refused for good (its handshake: a key not admitted) is
 * replaced with backoff while the wait runs, and every message of msgs
 * goes again on the fresh one, a STATUS first with a liveness (not
 * resends: nothing reached a broker); deadline is unchanged. -1 with
 * err: "timeout" at deadline (nothing answered in time: the messages are
 * still out), "interrupted", "internal" (a send or a move that failed). */
int cli_live_next(reel_client_t *c, cli_live_t *st, const cli_live_msg_t *msgs, int n, int64_t deadline,
                  wire_msg_t *m, cli_progress_fn fn, void *user, wire_err_t *err);

/* The GEN that g asks for, into m (c's client token in it), its tensors
 * described in t[3] (pointing at g's arrays, not copied: g's arrays and t
 * stay valid while m is sent); *nl the floats of its latent (n·C·F·H·W).
 * 0, or -1 with err "bad_request" (a group's seeds past MSG_MAX_GROUP, a
 * decoded output without a reel_decoded_t). */
int cli_gen_message(reel_client_t *c, const reel_gen_t *g, msg_gen_t *m, wire_tensor_t t[3], size_t *nl,
                    wire_err_t *err);
/* The answer a (a RESULT; not closed here) to g's GEN, whose latent holds
 * nl floats: the latent copied into out (NULL: not copied), *latent (NULL:
 * not set) pointed at it inside a (valid while a is open), the summary
 * into res (NULL: none), and the rollout and decoded outputs g asks for
 * into g->rollout and g->decoded. 0, or -1 with err: "malformed" (not a
 * RESULT, a latent of the wrong size), "internal" (out of memory). */
int cli_gen_take(const reel_gen_t *g, size_t nl, wire_msg_t *a, float *out, reel_gen_result_t *res,
                 const float **latent, wire_err_t *err);
/* A CANCEL of GEN id (docs/PROTOCOL.md "Cancelling"), never waiting:
 * best effort (a broker that is gone takes nothing); its answer, if any,
 * is a late one no later wait takes. */
void cli_cancel_gen(reel_client_t *c, uint64_t id);

/* A GEN's wait for its answer, from its send: timeout_ms when > 0; else
 * the larger of CLI_GEN_WAIT_MIN_MS and its deadline_ms (0: the broker's
 * default, 60 s) + 5 s, as the Python client's, so a request given a long
 * deadline is not given up on before the broker gives up on it. */
#define CLI_GEN_WAIT_MIN_MS 120000
int cli_gen_wait_ms(int timeout_ms, uint64_t deadline_ms);

#endif
