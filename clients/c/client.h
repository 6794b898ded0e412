/* client.h -- a small client of the Reel broker (docs/PROTOCOL.md), used by
 * reelctl and linkable by trainers and services: generate, sync weights,
 * ask for status. One client = one DEALER socket, opened at its first
 * call; not thread-safe (one thread per client). Every call has a
 * client-side deadline, sends included, so nothing hangs when the broker
 * is gone (or never admits this client's key). */
#ifndef REEL_CLIENTS_C_CLIENT_H
#define REEL_CLIENTS_C_CLIENT_H

#include <stdbool.h>
#include <stdint.h>
#include "schema/msg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct reel_client reel_client_t;

/* A client of the broker's client endpoint, with CURVE when keys are
 * given: key_file (this client's NAME.key, a client or trainer key) and
 * broker_key (the broker's broker.pub), each NULL to take $REEL_KEY /
 * $REEL_BROKER_KEY; neither anywhere: a plain connection (a broker with
 * keys never answers it, and calls time out). NULL with a message in
 * an error (base/error.h) on a bad endpoint (each of a list is checked
 * here, without a socket: wire_endpoint_check; nothing reaches a broker
 * before the first call) or unusable keys (one without the other, an
 * unreadable file, a worker's key).
 *
 * The socket is opened at the first call (a call that cannot make it
 * fails with err code "internal"). Until the broker first answers on it,
 * each call watches its handshakes (libzmq's socket monitor: two more
 * sockets, for the call only), so that a timeout says why the broker
 * never answered: a key it refused (ZAP), CURVE on one side only, a
 * broker key that is not its own, nothing listening at the endpoint. The
 * events are read as they come and only that verdict is kept: a client
 * idle between calls holds one socket and piles nothing up, however often
 * its connection fails meanwhile. A socket that is dead for good is
 * replaced by a fresh one (same endpoint, same keys): one whose handshake
 * the broker refused in a way libzmq never retries (a key not in its
 * allowlist, a mechanism mismatch), during the call that saw it refused
 * (after 100 ms, then twice as long each time up to once a second, until
 * the call's deadline: what the call sent goes again on the fresh one)
 * and at the next call, so a key added later (and the broker reloaded,
 * docs/SECURITY.md) lets a call already waiting through, and is admitted
 * at the client's next call; and one on which a message could not be
 * sent before its call's deadline (no connection will take it), at the
 * next call. A call that times out refused still says the key was
 * refused. reel_client_sockets's `fresh` counts them all. */
reel_client_t *reel_client_new_keys(const char *endpoint, const char *key_file, const char *broker_key);
/* reel_client_new_keys(endpoint, NULL, NULL): keys from the environment. */
reel_client_t *reel_client_new(const char *endpoint);
void reel_client_destroy(reel_client_t **c);

/* A GEN carries this client's token (random, nonzero, for the client's
 * lifetime), and a STATUS goes just before the client's first GEN (its
 * answer's boot id names the broker that got the GEN; later GENs compare
 * with the boot id last seen, from a STATUS or from the boot a RESULT
 * names). While it waits for the answer, the client
 * asks for STATUS after every `liveness_ms` without a message; when that
 * goes unanswered for `liveness_ms` too (the broker died, or is stuck), or
 * another broker answers it (a new boot id: a restart), it sends the GEN
 * again, with its id and token: a broker that still holds the request
 * answers it once (to the resend); a restarted one runs it again, with the
 * same result (docs/PROTOCOL.md "Delivery"). Default 3000 ms, or
 * $REEL_CLIENT_LIVENESS_MS; 0: never resend. */
void reel_client_set_liveness(reel_client_t *c, int liveness_ms);
/* Ends the call in progress on c (from a signal handler: it only sets a
 * flag, async-signal-safe): the call returns -1 with err code
 * "interrupted" within about 100 ms, and a GEN it was waiting for is
 * cancelled as on a timeout (docs/PROTOCOL.md "Cancelling"). Every later
 * call returns "interrupted" at once. reelctl gen calls it on SIGINT and
 * SIGTERM. */
void reel_client_interrupt(reel_client_t *c);
#define REEL_CLIENT_E_INTERRUPTED "interrupted" /* err code of a call reel_client_interrupt ended */
/* An endpoint list "A,B" (reel_client_new_keys) is a standby pair
 * (docs/PROTOCOL.md "A standby broker"): the client talks to one at a
 * time and moves to the other when the one it talks to answers a GEN,
 * SYNC or UPLOAD with ERROR standby, or stays silent for the liveness
 * (the STATUS above unanswered); what was unanswered goes again there,
 * as after a restart. Both brokers of a pair share one key pair (one
 * broker_key). The moves over the client's lifetime, and the endpoint it
 * talks to now: */
uint64_t reel_client_switches(const reel_client_t *c);
const char *reel_client_endpoint(const reel_client_t *c);
/* What c holds, for tests and a long-lived program's checks: */
typedef struct {
    int sockets;                /* ZeroMQ sockets now: 0 before the first call, 1 between calls, 3 while a call
                                 * watches the handshakes of a socket the broker has not answered on yet */
    uint64_t hs_events;         /* handshake events read, over c's lifetime (each folded into the verdict) */
    int hs_read_most;           /* the most of them read at once: they are read as they come, not piled up */
    uint64_t fresh;             /* sockets opened in place of a dead one (above), during calls or at their
                                 * start, over c's lifetime */
} reel_client_sockets_t;
void reel_client_sockets(const reel_client_t *c, reel_client_sockets_t *out);
/* GENs this client sent again (above), over its lifetime. */
uint64_t reel_client_resends(const reel_client_t *c);
/* fn(user, id, silent_ms) as a GEN is sent again (NULL: none): silent_ms
 * without an answer to it or a STATUS, 0 when another broker (a new boot
 * id) answered the STATUS, or -1 when the broker answered ERROR standby
 * (a standby pair: it goes to the other broker). */
typedef void (*reel_resend_fn)(void *user, uint64_t id, int silent_ms);
void reel_client_on_resend(reel_client_t *c, reel_resend_fn fn, void *user);

typedef struct {
    const char *model;          /* config name served by the workers */
    uint64_t version;           /* transformer version wanted, 0 = current */
    int steps;
    double shift, cfg, eta;
    bool sde;
    const char *solver;         /* NULL or "euler": Euler; "unipc", "dpm++" (with sde: the grid of its SDE steps) */
    uint64_t seed;
    int n;                      /* 0 or 1: one sample; 2..64: a group of n samples of this prompt */
    const uint64_t *seeds;      /* NULL, or n seeds (a group); none: seed + i */
    int64_t latent_shape[4];    /* C, F, H, W (one sample's) */
    const float *latent;        /* NULL: drawn from the seeds by the worker; n·C·F·H·W for a group */
    const float *context;       /* [ctx_shape] */
    int64_t ctx_shape[2];       /* L, T */
    const float *uncond;        /* NULL: no CFG */
    int64_t unc_rows;           /* uncond's L; 0: the context's (another L only for models with text_len) */
    bool progress;
    uint64_t deadline_ms;       /* broker-side deadline, 0 = broker default */
    struct reel_rollout *rollout; /* non-NULL: the rollout outputs it asks for are returned here */
    const char *prompt;         /* non-NULL: sent instead of context (the worker encodes it) */
    const char *negative_prompt;/* with prompt and cfg != 1 (NULL: Wan's default) */
    const char *output;         /* NULL or "latent"; "frames" or "video": needs decoded */
    struct reel_decoded *decoded; /* where frames / the video / the seconds are returned */
} reel_gen_t;

/* A GEN's decoded output (output "frames" or "video") and the worker's
 * encode and decode seconds: copies, freed by reel_decoded_free. */
typedef struct reel_decoded {
    uint8_t *frames;            /* [F',H',W',3] ([n,...] for a group), or NULL */
    int frames_ndim;
    int64_t frames_shape[5];
    size_t frames_bytes;
    uint8_t *video;             /* the MP4's bytes, or NULL */
    size_t video_bytes;
    double encode_seconds, decode_seconds;
} reel_decoded_t;

void reel_decoded_free(reel_decoded_t *d);

/* The rollout outputs of a GEN (docs/PROTOCOL.md, return_*): the caller
 * sets what it wants; reel_gen fills the rest with copies (freed by
 * reel_rollout_free). A tensor the RESULT did not carry stays NULL with
 * its shape zeroed. */
typedef struct reel_rollout {
    bool want_trajectory, want_log_probs, want_means, want_timesteps;
    int n;                      /* samples: every shape below but sigmas' has a leading [n] when n > 1 */
    float *trajectory;          /* [N+1, C, F, H, W]: x_0 .. x_N */
    int64_t trajectory_shape[6];
    float *log_probs;           /* [N] */
    float *sigmas;              /* [N+1] */
    float *timesteps;           /* [N]: each step's t as the transformer took it (NULL from an older worker) */
    int64_t steps;              /* N (0 when neither came) */
    float *means;               /* [N, C, F, H, W] */
    int64_t means_shape[6];
    int n_runs;                 /* the weight version of each step: runs of steps */
    uint64_t run_from[16], run_version[16];
} reel_rollout_t;

void reel_rollout_free(reel_rollout_t *r);

typedef struct {
    char worker[64];
    uint64_t version;           /* weights of the last step */
    uint64_t first_version;     /* ... of the first (differs if a sync landed in between) */
    int captured, replayed, eager;
    int batched;                /* of the steps, those run batched with other requests */
    int batch_rows;             /* the requests in those batches, summed (mean size: batch_rows / batched) */
    int padded_rows;            /* the padding rows of those batches, summed */
    double seconds;
    char key_hash[24];          /* the shard hash the broker routed by */
    char capture_key[24];       /* the capture key of its last step ("" from an older worker) */
    char declines[256];         /* "warming_up=2,override=1" */
} reel_gen_result_t;

/* Called on each PROGRESS: steps done of steps; for a GEN whose output is
 * decoded, the decode's latent frames are counted after the steps (done =
 * steps + frames decoded, of steps + the frames to decode: the total grows
 * when the decode starts). */
typedef void (*reel_progress_fn)(void *user, int step, int steps);

/* Runs one generation (n samples of a group: one GEN). out receives
 * n·C·F·H·W floats, sample after sample. Returns 0 on RESULT;
 * 1 when the broker answered ERROR or BUSY (err->code "busy" for BUSY);
 * -1 when no answer came within timeout_ms or the transport failed (err
 * code "timeout" / "internal"). timeout_ms <= 0 waits the larger of 120 s
 * and g->deadline_ms (0: the broker's default, 60 s) + 5 s. On "timeout" it sends CANCEL for the GEN
 * (docs/PROTOCOL.md "Cancelling"): the cluster stops it rather than run
 * it to its deadline for nobody. */
int reel_gen(reel_client_t *c, const reel_gen_t *g, float *out, reel_gen_result_t *res,
             reel_progress_fn progress, void *user, int timeout_ms, wire_err_t *err);

/* ---- a round of many GENs (reel_gen_many) ---- */

/* One request of a round, and what became of it. */
typedef struct {
    reel_gen_t g;               /* the request, as reel_gen takes it (g.progress is the round's: see below) */
    float *out;                 /* NULL, or where its latent goes: n·C·F·H·W floats, as reel_gen's out */
    /* set by reel_gen_many: */
    int rc;                     /* 0: its RESULT came; 1: ERROR or BUSY; -1: timeout, transport, not sent */
    wire_err_t err;             /* rc != 0: why (codes below) */
    reel_gen_result_t res;      /* rc == 0: as reel_gen's */
    int busy;                   /* BUSY answers it got (each sent again later, as a new GEN) */
} reel_gen_item_t;

#define REEL_CLIENT_E_NOT_SENT "not_sent" /* err code of a request the round never sent (it ended first) */
#define REEL_GEN_NO_INDEX ((size_t)-1)    /* *failed of a failure that is no request's (an interrupt) */

/* fn(user, index, item, latent) as request `index` ends with its own
 * outcome: its RESULT (item->rc 0; latent: its n·C·F·H·W floats, valid
 * during the call only, whether or not item->out is set), or its ERROR,
 * its timeout (no answer in time, or its GEN not sent in time: no
 * connection took it, and the round ends) or a BUSY it is not sent again
 * after (latent NULL; with keep_going that is also every request still to
 * send then, failed "busy"). Not for a request the round's end cancelled
 * or never sent. */
typedef void (*reel_gen_done_fn)(void *user, size_t index, reel_gen_item_t *item, const float *latent);

/* How reel_gen_many runs its round. */
typedef struct {
    int window;                 /* at most this many in flight (sent, not answered), 1..1024; 0: 16 */
    int timeout_ms;             /* each request's wait for its answer, from its own send; 0: reel_gen's
                                 * (the larger of 120 s and its deadline_ms, 0: 60 s, + 5 s) */
    bool keep_going;            /* a request's failure is its item's alone and the others go on (Python's
                                 * return_exceptions); false: the first failure ends the round */
    reel_progress_fn progress;  /* NULL, or (user, done, total) over all the requests (below) */
    reel_gen_done_fn done;      /* NULL, or as each request ends (above) */
    void *user;                 /* progress's and done's */
} reel_gen_many_t;

/* Runs n requests on c's one connection (clients/python's Client.gen_many:
 * a trainer's round, or a list of prompts), each as reel_gen runs it
 * alone (its RESULT bitwise reel_gen's for the same request; a group, g.n
 * > 1, is one GEN). Every request is built before any is sent: one that
 * cannot be (reel_gen's bad_request) fails the call, nothing sent.
 *
 * At most o->window are in flight at once; the next goes as one is
 * answered, so a round of any size neither fills the broker's queue nor
 * waits in it. A request answered BUSY (the broker's queue or its held
 * bytes full, nothing started) goes again, as a new GEN, once another of
 * the round is answered, before those not sent yet; after a BUSY no more
 * are in flight than the broker then held of the round (at least 1), and
 * one more with each answer after it, up to the window. With none of the
 * round left in flight a BUSY is that request's failure (with keep_going,
 * also that of every request still to send, "not sent" in its message).
 * Each request waits at most o->timeout_ms for its answer, from its own
 * send; one that waits longer fails with "timeout" and is cancelled
 * (docs/PROTOCOL.md "Cancelling"). A lost or restarted broker, or a
 * standby pair's move, sends every request in flight again, as reel_gen's
 * (reel_client_set_liveness, on_resend: once per request sent again); a
 * restart is also seen at the first RESULT the new broker sends (its boot
 * id), when the answers to requests sent since leave no silence.
 *
 * A request's failure (ERROR, a BUSY as above, its timeout, a RESULT that
 * cannot be read) without keep_going ends the round: the requests in
 * flight are cancelled (their err code "cancelled"), the rest never sent
 * ("not_sent"). reel_client_interrupt ends it the same way ("interrupted"
 * for those in flight). progress (when set) gets done and total over all
 * the requests, each counted as reel_gen's progress counts it (its steps,
 * then a decoded output's latent frames), its GENs asking for PROGRESS
 * whatever g.progress says; none of them when it is NULL. progress and
 * done run inside the call, on its thread: they must not call c, but for
 * reel_client_interrupt (a flag: the round then ends as above).
 *
 * Returns 0 when every request got its RESULT. Otherwise the rc of the
 * failure that ended the round (without keep_going), or of the first
 * failed request in the list (with it): 1 for an ERROR or BUSY, -1 for a
 * timeout, an interrupt or a transport failure; err is that failure's
 * (the request's own err) and *failed (when not NULL) its index, or
 * REEL_GEN_NO_INDEX for one that is no request's (an interrupt, a lost
 * connection). A bad o (window past 1024, a negative timeout): -1,
 * "bad_request", nothing sent. Every item's rc, err and res say what
 * became of it. */
int reel_gen_many(reel_client_t *c, reel_gen_item_t *items, size_t n, const reel_gen_many_t *o, size_t *failed,
                  wire_err_t *err);

typedef struct {
    bool complete;
    char applied[4096];         /* "w1,w2" */
    char failed[16384];         /* "w3:timeout,w4:bad_adapter: ..." (each worker's reason whole, up to
                                 * 512 bytes; "..." ends a list that did not fit) */
} reel_sync_result_t;

/* Publishes a weight sync by path (readable by the workers), or, with path
 * NULL, of the version uploaded to the broker before (reel_upload); sha256
 * is the hex digest of the file. Return values as reel_gen. */
int reel_sync(reel_client_t *c, const char *component, uint64_t version, const char *sha256,
              const char *path, uint64_t deadline_ms, reel_sync_result_t *res, int timeout_ms,
              wire_err_t *err);

/* reel_sync of a LoRA adapter: `version` is base_version (a full version
 * the workers hold) with the PEFT adapter folder at path (as the workers
 * see it) merged in, sha256 the digest of its adapter_model.safetensors;
 * path "" or NULL: the base itself again (sha256: the base's). Workers
 * keep every captured graph (docs/PROTOCOL.md, "LoRA adapters"). */
int reel_sync_adapter(reel_client_t *c, const char *component, uint64_t version, uint64_t base_version,
                      const char *sha256, const char *path, uint64_t deadline_ms, reel_sync_result_t *res,
                      int timeout_ms, wire_err_t *err);

/* Sends the file at path to the broker as `version` of component (UPLOAD
 * chunks of MSG_CHUNK_MAX bytes, REEL_UPLOAD_WINDOW of them in flight),
 * resuming where the broker's copy ends; sha256 is the file's digest (the
 * broker checks it). progress, when not NULL, gets bytes sent and the
 * size. 0 once the broker holds all of it; 1 on ERROR or BUSY; -1 on
 * timeout (timeout_ms without an answer) or a local failure. */
#define REEL_UPLOAD_WINDOW 4
typedef void (*reel_bytes_fn)(void *user, uint64_t done, uint64_t size);
int reel_upload(reel_client_t *c, const char *component, uint64_t version, const char *sha256, const char *path,
                reel_bytes_fn progress, void *user, int timeout_ms, wire_err_t *err);

/* reel_upload and reel_sync by value at once: the SYNC goes as soon as the
 * broker holds the upload's first chunk, so workers fetch each chunk while
 * the later ones still come, instead of after the last (docs/PROTOCOL.md,
 * "Weights by value"). progress as reel_upload's; res, timeout_ms (per
 * answer awaited) and the return values as reel_sync's. An upload that
 * fails after the SYNC went (its bytes hash to another digest, or it is
 * replaced) fails the workers' fetches: nothing of it is applied. */
int reel_publish(reel_client_t *c, const char *component, uint64_t version, const char *sha256, const char *path,
                 uint64_t deadline_ms, reel_bytes_fn progress, void *user, reel_sync_result_t *res, int timeout_ms,
                 wire_err_t *err);

/* reel_publish of a LoRA adapter: its adapter_model.safetensors at path
 * uploaded, config the text of its adapter_config.json (at most
 * MSG_LORA_CONFIG_MAX - 1 bytes), merged by the workers into
 * base_version (docs/PROTOCOL.md, "LoRA adapters"). */
int reel_publish_adapter(reel_client_t *c, const char *component, uint64_t version, uint64_t base_version,
                         const char *sha256, const char *path, const char *config, uint64_t deadline_ms,
                         reel_bytes_fn progress, void *user, reel_sync_result_t *res, int timeout_ms, wire_err_t *err);

/* A STATUS_REPLY and the message its strings and arrays live in. */
typedef struct reel_status reel_status_t;

/* STATUS: *out receives the reply (free with reel_status_free). Return
 * values as reel_gen. */
int reel_status(reel_client_t *c, reel_status_t **out, int timeout_ms, wire_err_t *err);
/* The decoded reply of s. */
const msg_status_reply_t *reel_status_reply(const reel_status_t *s);
/* Frees s; NULL-safe; sets *s = NULL. */
void reel_status_free(reel_status_t **s);

#ifdef __cplusplus
}
#endif
#endif
