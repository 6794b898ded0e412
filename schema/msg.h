/* msg.h -- Reel's messages (docs/PROTOCOL.md), one typed struct each, in
 * the style of CZMQ's zproto: every message type has a struct, a decoder
 * that fills it from a received wire message, and an encoder/sender that
 * writes it; requests that carry rules (GEN, SYNC, READY) have a validator.
 * The client library, the broker, the worker and reelctl read and write
 * messages only through this header; nothing outside schema/ sees msgpack
 * or the value tree of wire.h.
 *
 * Every key name, field type, default and limit of the protocol is written
 * once, in schema/msg_defs.c, and the page states the same.
 *
 * Decoding (msg_<type>_decode) takes a message received with msg_recv (or
 * wire_recv) and
 *   - reads every known field, checking its type and its limits: a field
 *     that is missing, of the wrong type or out of range is ERROR
 *     bad_request naming it ("GEN: 'steps' must be in 1..10000 (got 0)");
 *   - fills absent optional fields with their defaults;
 *   - ignores unknown fields (msg_forward drops unknown top-level ones);
 *   - checks the tensors against the names the type carries (bad_request
 *     for another name, or for tensors on a type that carries none).
 * It never allocates per field: strings are copied into the struct's
 * fixed buffers; arrays of entries and long strings go to the message's
 * arena (wire_msg_alloc) and live as long as the message. Pointers in a
 * decoded struct (tensors included) point into the message: do not close
 * it while the struct is in use.
 *
 * Encoding/sending writes the envelope ("type", "id", "proto", "tensors")
 * and every field (optional empty ones may be left out); strings are made
 * valid UTF-8 on the way out. Tensor pointers name what goes in the frames.
 *
 * All functions: 0 on success; -1 with *err (decoders, validators) or errno
 * (senders) set. */
#ifndef REEL_SCHEMA_MSG_H
#define REEL_SCHEMA_MSG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "schema/wire.h"
#include "base/names.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- limits (docs/PROTOCOL.md) ------------------------------------------- */

#define MSG_NAME_MAX 64                  /* names: 1..63 of [A-Za-z0-9_.:+-] (incl. NUL) */
#define MSG_MODEL_NAME_MAX 56            /* model names: 1..55 ("tinydit:" prefixes them in keys) */
#define MSG_TEXT_MAX (WIRE_MAX_STR + 1)  /* free text: error messages, paths */
#define MSG_REASON_MAX 512               /* an ack's error, a failure reason */
#define MSG_MAX_STEPS 10000
#define MSG_MAX_DIM 65536                /* each of C, F, H, W and of L, T */
#define MSG_MAX_FHW ((int64_t)1 << 24)   /* F x H x W */
#define MSG_MAX_GEN_BYTES ((uint64_t)256 << 20) /* a GEN's tensors; also C·F·H·W·4 */
#define MSG_MAX_GROUP 64                        /* samples of one GEN ("n") */
#define MSG_MAX_BATCH_ROWS 64                   /* rows of one batched step (a worker's --max-batch at most) */
#define MSG_MAX_STREAMS 1024
#define MSG_MAX_INFLIGHT 65536
#define MSG_MAX_MODELS 16                /* models one worker serves */
#define MSG_MAX_COMPONENTS 8             /* weight components one worker reports */
#define MSG_MAX_COUNTS 32                /* reasons in RESULT stats.declines */
#define MSG_KEYS_RECENT 32               /* shard keys STATUS lists per worker */
#define MSG_MAX_PREWARM 64               /* keys one PREWARM carries (READY "prewarm" at most) */
#define MSG_VERSION_MAX ((uint64_t)INT64_MAX) /* weight versions: [1, 2^63) (0: none/current) */
#define MSG_HA_NAME_MAX 16              /* a standby pair's state and role names (PEER) */
#define MSG_PATH_MAX 1024                /* a SYNC path: at most 1023 bytes (incl. NUL) */

/* ---- message types ----------------------------------------------------------- */

/* X(TYPE, name, body struct or void): every message of the protocol. */
#define MSG_TYPES(X)                                  \
    X(GEN, gen, msg_gen_t)                            \
    X(REQUEST, request, msg_gen_t)                    \
    X(PROGRESS, progress, msg_progress_t)             \
    X(RESULT, result, msg_result_t)                   \
    X(ERROR, error, msg_error_t)                      \
    X(BUSY, busy, msg_busy_t)                         \
    X(SYNC, sync, msg_sync_t)                         \
    X(SYNC_DONE, sync_done, msg_sync_done_t)          \
    X(SYNC_ACK, sync_ack, msg_sync_ack_t)             \
    X(STATUS, status, void)                           \
    X(STATUS_REPLY, status_reply, msg_status_reply_t) \
    X(READY, ready, msg_ready_t)                      \
    X(HEARTBEAT, heartbeat, void)                     \
    X(DISCONNECT, disconnect, void)                   \
    X(RECONNECT, reconnect, void)                     \
    X(EVENTS, events, msg_events_t)                   \
    X(UPLOAD, upload, msg_upload_t)                   \
    X(UPLOAD_ACK, upload_ack, msg_upload_ack_t)       \
    X(FETCH, fetch, msg_fetch_t)                      \
    X(FETCH_DATA, fetch_data, msg_fetch_data_t)      \
    X(PREWARM, prewarm, msg_prewarm_t)                \
    X(PEER, peer, msg_peer_t)                         \
    X(CANCEL, cancel, msg_cancel_t)

typedef enum {
#define MSG_ENUM(T, n, S) MSG_##T,
    MSG_TYPES(MSG_ENUM)
#undef MSG_ENUM
    MSG_UNKNOWN,
} msg_type_t;

/* The type of a received message (MSG_UNKNOWN for a type not above). */
msg_type_t msg_type(const wire_msg_t *m);
/* "GEN", ...; "?" for MSG_UNKNOWN. */
const char *msg_type_name(msg_type_t t);

/* ---- bodies ------------------------------------------------------------------ */

/* GEN (client -> broker) and REQUEST (broker -> worker, the GEN's fields;
 * version then is the version the broker requires). */
typedef struct {
    char model[MSG_NAME_MAX];    /* required: a model name (1..55) */
    uint64_t version;            /* the oldest transformer version it may run on; 0: current */
    uint64_t steps;              /* required: 1..10000 */
    double shift;                /* 1.0; > 0 */
    double cfg;                  /* 1.0; used with uncond */
    bool sde;                    /* false */
    double eta;                  /* 0.7; >= 0 when sde */
    char solver[16];             /* "" (absent): "euler"; or "unipc", "dpm++" (with sde: the grid its SDE steps run on) */
    uint64_t seed;               /* 0 */
    bool progress;               /* false */
    uint64_t deadline_ms;        /* 0: the broker's default */
    int64_t latent_shape[4];     /* required: C, F, H, W */
    bool return_trajectory;      /* false: RESULT carries trajectory [N+1,C,F,H,W] */
    bool return_log_probs;       /* false: RESULT carries log_probs [N], sigmas [N+1] (SDE, eta > 0) */
    bool return_means;           /* false: RESULT carries means [N,C,F,H,W] (SDE, eta > 0) */
    bool return_timesteps;       /* false: RESULT carries timesteps [N] (an older broker drops the field, so
                                  * its workers never send a tensor it would not know) */
    uint64_t n;                  /* samples of this prompt, 1..MSG_MAX_GROUP (a group when > 1); 0: absent, 1 */
    uint64_t seeds[MSG_MAX_GROUP]; /* each sample's seed; none: seed + i */
    int n_seeds;                 /* 0, or n */
    const wire_tensor_t *context, *uncond, *latent; /* context (or prompt) required; latent [n,C,F,H,W] when n > 1 */
    const char *prompt;          /* "" (absent): the client sends context; else the worker encodes it */
    const char *negative_prompt; /* "" (absent): with a prompt and cfg != 1, Wan's default negative prompt */
    char output[16];             /* "" (absent): "latent"; or "frames", "video" (decoded by the worker's VAE) */
    uint64_t client;             /* 0 (absent); else the sender's token, one per client for its lifetime: a
                                  * GEN resent with the same client and id while the first is live is the
                                  * same request (docs/PROTOCOL.md "Delivery") */
} msg_gen_t;

/* The GEN's output: "latent" when absent. Can't fail. */
const char *msg_gen_output(const msg_gen_t *g);
/* True when the GEN asks for a decoded output ("frames" or "video"). */
bool msg_gen_decodes(const msg_gen_t *g);
/* True when the GEN runs with guidance: it sends uncond, or it sends a
 * prompt with cfg != 1 (the negative prompt, given or Wan's default, is
 * encoded by the worker). Can't fail. */
bool msg_gen_guided(const msg_gen_t *g);
/* A broker's HEARTBEAT to a worker may carry "incoming": the bytes of the
 * REQUEST that follows it on the connection. The worker then waits for it
 * beyond its liveness, MSG_SLOW_BYTES_PER_MS a millisecond of it (32
 * MiB/s: a 256 MiB GEN, 8 s), since nothing else reaches it until that
 * message has (one connection keeps order); the broker gives the worker as
 * long again to answer before it takes its silence for death. Sent before
 * REQUESTs of MSG_HEADS_UP_BYTES or more. */
#define MSG_SLOW_BYTES_PER_MS ((uint64_t)32 * 1024 * 1024 / 1000)
#define MSG_HEADS_UP_BYTES ((uint64_t)1 << 20)

/* A received HEARTBEAT's "incoming" (0 when absent or not a uint). */
uint64_t msg_heartbeat_incoming(const wire_msg_t *m);

/* Longest prompt or negative prompt, in bytes: the wire's longest string
 * (a longer one is refused too_large while the message is read). umT5's
 * 512 tokens are about 2 KiB of English or CJK text. */
#define MSG_MAX_PROMPT_BYTES WIRE_MAX_STR
/* The video a latent of F x H x W decodes to (Wan2.1's VAE): 1 + 4(F-1)
 * frames of 8H x 8W. */
#define MSG_VAE_TIME 4
#define MSG_VAE_SPACE 8

/* The GEN's solver: "euler" when absent. Can't fail. */
const char *msg_gen_solver(const msg_gen_t *g);

/* PROGRESS */
typedef struct {
    uint64_t step, steps;
    /* After the last step of a GEN whose output is decoded: latent frames
     * decoded so far, of decode_frames (both 0, absent, otherwise). */
    uint64_t decoded, decode_frames;
} msg_progress_t;

typedef struct {
    char name[MSG_NAME_MAX];
    uint64_t n;
} msg_count_t;

/* A map of names to counts: declines by reason, versions by component. */
typedef struct {
    int n;
    msg_count_t e[MSG_MAX_COUNTS];
} msg_counts_t;

typedef struct {
    int n;
    msg_count_t e[MSG_MAX_COMPONENTS];
} msg_versions_t;

typedef struct {
    uint64_t captured, replayed, eager;
    msg_counts_t declines;       /* by reason name; names a reader does not know are kept */
    double seconds;
    uint64_t batched;            /* steps run in a mixed batch with other requests (0: none; omitted) */
    uint64_t batch_rows;         /* the requests in each of those batches, summed (0: omitted) */
    uint64_t padded_rows;        /* the padding rows of those batches, summed (0: omitted) */
    uint64_t capture_key;        /* the capture key hash of its last step (0: unknown; omitted) */
} msg_stats_t;

/* Steps from `from` (0-based) on, up to the next run's, ran on `version`. */
typedef struct {
    uint64_t from, version;
} msg_version_run_t;

/* RESULT */
typedef struct {
    char worker[MSG_NAME_MAX];
    uint64_t version;            /* weights of the last step */
    uint64_t first_version;      /* ... of the first; defaults to version */
    msg_stats_t stats;
    uint64_t key_hash;           /* the shard hash; 0 when absent */
    uint64_t boot;               /* the answering broker's boot id (it sets it; 0: absent) */
    const msg_version_run_t *version_runs; /* the version of every step, as runs */
    size_t n_version_runs;
    const wire_tensor_t *latent;
    const wire_tensor_t *trajectory, *log_probs, *sigmas, *means; /* when asked */
    const wire_tensor_t *timesteps; /* [N] with sigmas: each step's t as the transformer took it (absent from an
                                     * older worker) */
    const wire_tensor_t *frames; /* output "frames": U8 [F',H',W',3] ([n,...] for a group) */
    const wire_tensor_t *video;  /* output "video": U8 [bytes], an MP4 (a group: sample 0's... see PROTOCOL.md) */
    double encode_seconds, decode_seconds; /* time spent encoding the prompt(s) and decoding (0: none) */
    uint64_t n;                  /* 0 (absent) or 1; a group's n: every tensor above but sigmas gains a leading [n] */
    uint64_t seeds[MSG_MAX_GROUP]; /* a group's seeds, in sample order (none for n = 1) */
    int n_seeds;
} msg_result_t;

/* ERROR */
typedef struct {
    char code[32];
    char message[MSG_TEXT_MAX];
} msg_error_t;

/* BUSY */
typedef struct {
    char message[MSG_TEXT_MAX];
} msg_busy_t;

/* CANCEL (client -> broker: the GEN of the same "id", from the same
 * connection or of the same client token; broker -> worker: the broker's
 * request id). No reply of its own: the GEN's one final reply says. */
typedef struct {
    uint64_t client;             /* the GEN's client token (absent, 0: none: the sender's own GEN) */
} msg_cancel_t;

/* SYNC (trainer -> broker, broker -> worker) */
#define MSG_LORA_CONFIG_MAX 4096       /* bytes of an uploaded adapter's config, NUL included */
typedef struct {
    char component[MSG_NAME_MAX];  /* required */
    uint64_t version;              /* required */
    char sha256[65];               /* required: 64 hex digits, either case */
    char path[MSG_PATH_MAX];       /* "" when none; at most 1023 bytes */
    uint64_t deadline_ms;          /* 0: the broker's default */
    bool uploaded;                 /* the file was sent to the broker (UPLOAD): workers FETCH it */
    /* > 0: this version is version `base_version` (a full version the
     * worker holds as its base) with the LoRA adapter at `path` merged in
     * (sha256: of its adapter_model.safetensors), or, with no path, the
     * base itself again (sha256: the base's). 0: a full version. */
    uint64_t base_version;
    /* With base_version and uploaded: the adapter's adapter_config.json
     * (its adapter_model.safetensors is the uploaded file). */
    char lora_config[MSG_LORA_CONFIG_MAX];
    uint64_t client;               /* 0 (absent); else the sender's token (as GEN's): a standby pair's
                                    * standby knows a trainer that came back after trying the other */
    int n_tensors;                 /* inline weights (any names) */
    const wire_tensor_t *tensors[WIRE_MAX_TENSORS];
} msg_sync_t;

/* Weights by value (docs/PROTOCOL.md, "Weights by value"): chunks of a
 * safetensors file, its bytes in U8 tensor frames named "chunk". */
#define MSG_CHUNK_MAX ((uint64_t)4 << 20)           /* bytes in one chunk */
#define MSG_UPLOAD_MAX ((uint64_t)64 << 30)         /* bytes in one uploaded file */

/* UPLOAD (trainer -> broker): bytes [offset, offset + chunk) of the file
 * that will be `version` of `component`. */
typedef struct {
    char component[MSG_NAME_MAX];
    uint64_t version;
    char sha256[65];               /* of the whole file */
    uint64_t size;                 /* of the whole file */
    uint64_t offset;
    uint64_t client;               /* 0 (absent); else the sender's token (SYNC's) */
    const wire_tensor_t *chunk;    /* U8 [n], 1 <= n <= MSG_CHUNK_MAX */
} msg_upload_t;

/* UPLOAD_ACK (broker -> trainer): how much of the file the broker holds;
 * the next chunk goes at `received`. `complete`: all of it, hashed and
 * matching, stored: a SYNC with "uploaded" may name it now. */
typedef struct {
    char component[MSG_NAME_MAX];
    uint64_t version;
    uint64_t received;
    bool complete;
} msg_upload_ack_t;

/* FETCH (worker -> broker): up to `max` bytes of an uploaded file from
 * `offset` on. Any connection with a worker key may ask. */
typedef struct {
    char component[MSG_NAME_MAX];
    uint64_t version;
    char sha256[65];
    uint64_t offset;
    uint64_t max;                  /* 0: MSG_CHUNK_MAX */
} msg_fetch_t;

/* FETCH_DATA (broker -> worker): bytes [offset, offset + chunk). */
typedef struct {
    char component[MSG_NAME_MAX];
    uint64_t version;
    uint64_t offset;
    uint64_t size;                 /* of the whole file */
    const wire_tensor_t *chunk;    /* U8 [n]; n = 0 only past the end */
} msg_fetch_data_t;

typedef struct {
    char worker[MSG_NAME_MAX];
    char reason[MSG_REASON_MAX];
} msg_failure_t;

/* SYNC_DONE */
typedef struct {
    char component[MSG_NAME_MAX];
    uint64_t version;
    const char (*applied)[MSG_NAME_MAX];
    size_t n_applied;
    const msg_failure_t *failed;
    size_t n_failed;
    bool complete;
    uint64_t current;
} msg_sync_done_t;

/* SYNC_ACK */
typedef struct {
    char component[MSG_NAME_MAX];  /* required */
    uint64_t version;              /* required */
    bool ok;                       /* required */
    char error[MSG_REASON_MAX];    /* "" when ok */
    char adapter[MSG_REASON_MAX];  /* ok of a LoRA sync: the adapter applied, as JSON (rank, alpha, ...) */
} msg_sync_ack_t;

/* What a client needs to know of a model to send it a fitting GEN. */
typedef struct {
    char name[MSG_NAME_MAX];
    uint64_t in_channels;        /* C of latent_shape */
    uint64_t text_dim;           /* T of context */
    uint64_t patch;              /* H and W are multiples of it */
    uint64_t layers;
    uint64_t text_len;           /* 0: any L; else contexts of at most text_len rows, padded to it (Wan) */
} msg_model_t;

/* READY */
typedef struct {
    char name[MSG_NAME_MAX];       /* required */
    char device[32], arch[32];     /* "?" when absent */
    uint64_t streams;              /* 1; 1..1024 */
    uint64_t budget;               /* 0 */
    uint64_t max_inflight;         /* 0 (= streams); else 1..65536 */
    const char (*models)[MSG_NAME_MAX]; /* required, at most 16 */
    size_t n_models;
    msg_versions_t versions;
    const msg_model_t *configs;    /* the config of each model (optional) */
    size_t n_configs;
    const char (*solvers)[MSG_NAME_MAX]; /* the GEN solvers it runs besides euler (optional; absent:
                                          * euler only: a worker older than `solver`) */
    size_t n_solvers;
    char text_encoder[MSG_NAME_MAX]; /* "" (absent): no text encoder; else its config name: takes GEN prompt */
    char vae[MSG_NAME_MAX];          /* "" (absent): no VAE; else its config name: takes GEN output frames/video */
    uint64_t prewarm;                /* 0 (absent); else 1..MSG_MAX_PREWARM: the hot keys it will own that
                                      * it asks for (PREWARM) to capture before their requests come */
    uint64_t max_tokens;             /* 0 (absent): no bound; else its --max-tokens: a sample of more tokens
                                      * goes to another worker when one can take it */
    uint64_t boot;                   /* 0 (absent, an older worker); else its process's id, new at every
                                      * start: a READY of a known name with another boot is a restart */
} msg_ready_t;

/* PREWARM (broker -> worker): the keys a starting worker is expected to
 * serve that were hot lately, hottest first: each as the shapes a GEN of
 * it has (what its capture key is made of; docs/PROTOCOL.md "Routing"). */
typedef struct {
    char model[MSG_NAME_MAX];    /* required */
    int64_t latent_shape[4];     /* required: [C, F, H, W] */
    uint64_t text_len;           /* required: context rows L (the key's, after padding) */
    uint64_t text_dim;           /* required: T */
    bool cfg;                    /* an unconditional branch too */
    uint64_t n;                  /* samples (1: a single request; a group's n) */
    char solver[16];             /* "euler" (default), "unipc" or "dpm++" */
    bool sde;
    uint64_t key_hash;           /* required: its shard hash */
    uint64_t requests;           /* requests of it the broker routed lately (decayed count), 0 */
} msg_prewarm_key_t;

typedef struct {
    const msg_prewarm_key_t *keys;
    size_t n_keys;
} msg_prewarm_t;

/* PEER (broker <-> broker, a standby pair: docs/PROTOCOL.md "A standby
 * broker"): what the sender is, sent to the other broker's client endpoint
 * every heartbeat. */
typedef struct {
    char state[MSG_HA_NAME_MAX]; /* required: "active", "standby" or "starting" */
    char role[MSG_HA_NAME_MAX];  /* required: "primary" or "backup" */
    uint64_t term;               /* required: takeovers so far (the higher term wins two actives) */
    uint64_t boot;               /* the sender process's id (STATUS_REPLY boot) */
    char clients[MSG_PATH_MAX];  /* "" or the sender's client endpoint, as its clients are told */
    const msg_sync_t *syncs;     /* each component's current SYNC at the sender (active) */
    size_t n_syncs;
} msg_peer_t;

/* EVENTS entries */
typedef struct {
    char kind[16];               /* "capture", "decline", "evict", "replays" ("" when absent) */
    char reason[MSG_NAME_MAX];
    const char *key;             /* capture key text ("" when absent) */
    uint64_t key_hash;           /* 0 when absent */
    int64_t stream;
    uint64_t bytes, nodes;
    double seconds;
    char component[MSG_NAME_MAX];
    uint64_t from, to;
    uint64_t count;              /* 1 */
    /* kind "artifact" (a bundle the worker scanned; component = its id,
     * reason = verified/loaded/refused, detail = why refused) and
     * "artifact_key" (an artifact at one kernel key; component = its id,
     * key = the kernel key, reason = its state, detail = why, count =
     * calls): docs/ARTIFACTS.md. Empty / 0 for the other kinds. */
    char version[MSG_NAME_MAX];
    char op[MSG_NAME_MAX];
    char backend[MSG_NAME_MAX];
    char sha256[65];             /* the bundle's object, "" when unknown */
    bool verified, enabled;
    char detail[256];
    uint64_t native, pass, fail, fallbacks, timed;
    double speedup, speedup_sd;  /* native/artifact over the timed calls */
    uint64_t sync_timed;         /* --artifact-timing sync: launches timed alone */
    double sync_s;               /* their seconds, summed */
} msg_event_t;

/* EVENTS */
typedef struct {
    const msg_event_t *events;
    size_t n_events;
    uint64_t dropped;
} msg_events_t;

typedef struct {
    char name[MSG_NAME_MAX];
    char text[192];
} msg_text_t;

typedef struct {
    int n;
    msg_text_t e[MSG_MAX_COMPONENTS];
} msg_texts_t;

/* One worker in STATUS_REPLY. */
typedef struct {
    char name[MSG_NAME_MAX], device[32], arch[32];
    char text_encoder[MSG_NAME_MAX], vae[MSG_NAME_MAX]; /* its READY's, absent ("") when none: prompts in, videos out */
    uint64_t streams, inflight, max_inflight;
    bool routable;
    msg_versions_t versions;
    msg_texts_t lagging;         /* component -> why it is behind the current version */
    int n_keys;
    uint64_t keys[MSG_KEYS_RECENT];
    uint64_t alive_ms;
} msg_worker_status_t;

/* One peer whose handshake the broker refused (STATUS_REPLY
 * auth_refused_recent). */
#define MSG_REFUSED_KEY_MAX 41   /* a z85 public key and its NUL */
#define MSG_REFUSED_ADDR_MAX 48  /* an IPv6 address, or localhost:UID:GID:PID, and its NUL */
#define MSG_REFUSED_WHY_MAX 128
typedef struct {
    char socket[8];                    /* "client" or "worker" */
    char key[MSG_REFUSED_KEY_MAX];     /* its public key (z85); "" when refused before the key was read */
    char name[MSG_NAME_MAX];           /* the key's name when the allowlist has it (another role's); "" */
    char address[MSG_REFUSED_ADDR_MAX];/* its address as ZAP gives it (tcp: an IP address; ipc:
                                        * localhost:UID:GID:PID, its process); "" when not known */
    char why[MSG_REFUSED_WHY_MAX];     /* the reason of its last refusal */
    uint64_t count;                    /* its handshakes refused */
    uint64_t ago_ms;                   /* since the last of them */
} msg_refused_peer_t;

/* STATUS_REPLY */
typedef struct {
    const msg_worker_status_t *workers;
    size_t n_workers;
    uint64_t queue, queue_max;
    msg_versions_t versions;     /* current version per component */
    msg_versions_t pending;      /* newest version nobody applied yet */
    uint64_t malformed, catalog_dropped;
    uint64_t worker_refused;     /* registered workers' messages refused or dropped for what they said
                                  * (optional: absent while 0, and from an older broker) */
    uint64_t catalog_failures;   /* catalog batches the store refused for now (retried) */
    uint64_t catalog_pending;    /* catalog records waiting to be written */
    uint64_t undelivered;        /* messages a peer could not take (queue full or gone): dropped */
    uint64_t progress_dropped;   /* PROGRESS a client could not take (optional: absent while 0, and from
                                  * an older broker, which counted them in undelivered) */
    uint64_t replies_suppressed; /* answers to bad messages not sent (over the peer's budget) */
    uint64_t auth_refused;       /* CURVE handshakes the broker's key check refused */
    uint64_t auth_refused_peers; /* ... the peers they came from (optional: 0 from an older broker) */
    const msg_refused_peer_t *auth_refused_recent; /* the peers refused most recently, the latest first */
    size_t n_auth_refused_recent;
    /* since the broker started (optional: 0 from an older broker): requests
     * answered RESULT and ERROR, and the steps of the RESULTs by how they ran */
    uint64_t requests_ok, requests_failed;
    uint64_t steps_replayed, steps_eager, steps_captured;
    const msg_model_t *models;   /* each model a live worker serves, with its config */
    size_t n_models;
    uint64_t boot;               /* this broker process's id, new at every start (0: an older broker): a
                                  * client that sees it change knows its requests were lost */
    /* A broker of a standby pair (all "" / 0 for a broker alone): its
     * state ("active"; a standby answers only STATUS from clients), role,
     * term, and what it last heard of its peer ("active", "standby",
     * "starting", or "silent" past the peer timeout). */
    char ha_state[MSG_HA_NAME_MAX], ha_role[MSG_HA_NAME_MAX], ha_peer[MSG_HA_NAME_MAX];
    uint64_t ha_term;
} msg_status_reply_t;

/* ---- receiving, decoding, sending --------------------------------------------- */

/* wire_recv without the value tree: how daemons receive. */
int msg_recv(void *sock, bool router, int flags, wire_msg_t *m, wire_err_t *err);

/* Decodes m as a message of `type` into *body (the struct of that type;
 * NULL for types without a body). -1 with *err (bad_request, or internal
 * on out-of-memory); *body is then unspecified. */
int msg_decode(wire_msg_t *m, msg_type_t type, void *body, wire_err_t *err);
/* Sends a message of `type` with id and *body (NULL: no body) to sock,
 * preceded by identity when non-NULL. A tensor of body that is one of
 * share->t[] goes out as a reference to share's frame (no copy); others
 * are copied. -1 with errno (EINVAL: the body breaks a limit a receiver
 * checks; EMSGSIZE: too large; others from ZeroMQ); nothing was sent then. */
int msg_send(void *sock, const zmq_msg_t *identity, msg_type_t type, uint64_t id, const void *body,
             const wire_msg_t *share);
/* As msg_send, keeping a message the socket cannot take at once: with
 * keep (empty) given, a message whose first part sock refuses with EAGAIN
 * (a ROUTER_MANDATORY peer's queue full: nothing went) is built into
 * *keep, which the caller owns (wire_parts_send, wire_parts_close), and
 * -1 EAGAIN returned; sock NULL only builds it into *keep (0). keep NULL
 * is msg_send. */
int msg_send_keep(void *sock, const zmq_msg_t *identity, msg_type_t type, uint64_t id, const void *body,
                  const wire_msg_t *share, wire_parts_t *keep);
/* The header bytes msg_send would send (malloc'd, *len set): tests. NULL
 * on out-of-memory or a body no receiver would take. */
unsigned char *msg_encode(msg_type_t type, uint64_t id, const void *body, size_t *len);

/* A field msg_forward writes into the header it forwards. */
typedef enum { MSG_SET_U64, MSG_SET_NAME, MSG_SET_HASH } msg_set_kind_t;
typedef struct {
    const char *key;
    msg_set_kind_t kind;
    uint64_t u;                  /* U64; HASH (written as 16 hex digits) */
    const char *s;               /* NAME */
} msg_set_t;
#define MSG_SET_MAX 4

/* Sends the received message m on as a message of `type` with `id`,
 * preceded by identity when non-NULL, without decoding and encoding it
 * again: the entries of its header are copied byte for byte, except
 * "type" and "id" (written anew), the n_set (<= MSG_SET_MAX) fields of set
 * (written instead of any received ones), and top-level keys `type` does
 * not know (dropped: a worker sees no field the broker did not read). A
 * known field goes on whole, as received. Every tensor frame of m goes on
 * by reference, in order. Use it on a message m that decoded as `type`
 * (the broker's GEN -> REQUEST and RESULT -> RESULT). -1 with errno
 * (EINVAL: m is not a received header or set is bad; others as msg_send). */
int msg_forward(void *sock, const zmq_msg_t *identity, const wire_msg_t *m, msg_type_t type, uint64_t id,
                const msg_set_t *set, int n_set);
/* As msg_forward, keeping what sock cannot take at once as msg_send_keep. */
int msg_forward_keep(void *sock, const zmq_msg_t *identity, const wire_msg_t *m, msg_type_t type, uint64_t id,
                     const msg_set_t *set, int n_set, wire_parts_t *keep);

/* ERROR {id, code, message}, message formatted (at most 1023 bytes). */
int msg_send_error(void *sock, const zmq_msg_t *identity, uint64_t id, const char *code,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
int msg_send_verror(void *sock, const zmq_msg_t *identity, uint64_t id, const char *code, const char *fmt,
                    va_list ap) __attribute__((format(printf, 5, 0)));

#define MSG_TYPED_void(T, n)
#define MSG_TYPED_BODY(T, n, S)                                                                     \
    static inline int msg_##n##_decode(wire_msg_t *m, S *out, wire_err_t *err) {                   \
        return msg_decode(m, MSG_##T, out, err);                                                    \
    }                                                                                               \
    static inline int msg_##n##_send(void *sock, const zmq_msg_t *to, uint64_t id, const S *x) {   \
        return msg_send(sock, to, MSG_##T, id, x, NULL);                                            \
    }                                                                                               \
    static inline int msg_##n##_forward(void *sock, const zmq_msg_t *to, uint64_t id, const S *x,  \
                                        const wire_msg_t *share) {                                  \
        return msg_send(sock, to, MSG_##T, id, x, share);                                           \
    }
#define MSG_TYPED_msg_gen_t(T, n) MSG_TYPED_BODY(T, n, msg_gen_t)
#define MSG_TYPED_msg_progress_t(T, n) MSG_TYPED_BODY(T, n, msg_progress_t)
#define MSG_TYPED_msg_result_t(T, n) MSG_TYPED_BODY(T, n, msg_result_t)
#define MSG_TYPED_msg_error_t(T, n) MSG_TYPED_BODY(T, n, msg_error_t)
#define MSG_TYPED_msg_busy_t(T, n) MSG_TYPED_BODY(T, n, msg_busy_t)
#define MSG_TYPED_msg_sync_t(T, n) MSG_TYPED_BODY(T, n, msg_sync_t)
#define MSG_TYPED_msg_sync_done_t(T, n) MSG_TYPED_BODY(T, n, msg_sync_done_t)
#define MSG_TYPED_msg_sync_ack_t(T, n) MSG_TYPED_BODY(T, n, msg_sync_ack_t)
#define MSG_TYPED_msg_status_reply_t(T, n) MSG_TYPED_BODY(T, n, msg_status_reply_t)
#define MSG_TYPED_msg_ready_t(T, n) MSG_TYPED_BODY(T, n, msg_ready_t)
#define MSG_TYPED_msg_events_t(T, n) MSG_TYPED_BODY(T, n, msg_events_t)
#define MSG_TYPED_msg_upload_t(T, n) MSG_TYPED_BODY(T, n, msg_upload_t)
#define MSG_TYPED_msg_upload_ack_t(T, n) MSG_TYPED_BODY(T, n, msg_upload_ack_t)
#define MSG_TYPED_msg_fetch_t(T, n) MSG_TYPED_BODY(T, n, msg_fetch_t)
#define MSG_TYPED_msg_fetch_data_t(T, n) MSG_TYPED_BODY(T, n, msg_fetch_data_t)
#define MSG_TYPED_msg_prewarm_t(T, n) MSG_TYPED_BODY(T, n, msg_prewarm_t)
#define MSG_TYPED_msg_peer_t(T, n) MSG_TYPED_BODY(T, n, msg_peer_t)
#define MSG_TYPED_msg_cancel_t(T, n) MSG_TYPED_BODY(T, n, msg_cancel_t)
/* msg_gen_decode, msg_gen_send, msg_gen_forward, ... for every type with a
 * body; types without one use msg_send(sock, to, MSG_X, id, NULL, NULL). */
#define MSG_TYPED(T, n, S) MSG_TYPED_##S(T, n)
MSG_TYPES(MSG_TYPED)
#undef MSG_TYPED

/* ---- validation: the rules beyond one field ------------------------------------- */

/* GEN/REQUEST: the tensors (context F32 [L,T] required; uncond F32 of the
 * context's shape; latent F32 of latent_shape), latent_shape (each of C,
 * F, H, W in 1..65536, F·H·W <= 2^24, C·F·H·W·4 <= 256 MiB), L and T in
 * 1..65536, shift > 0, cfg finite as a float, eta >= 0 with sde, and, when
 * model is not NULL, the model: name, C == in_channels, T == text_dim, H
 * and W multiples of patch. bad_request; too_large for tensors over 256
 * MiB. */
int msg_gen_validate(const msg_gen_t *g, const msg_model_t *model, wire_err_t *err);
/* The samples a GEN asks for: n, or 1 when absent. */
static inline uint64_t msg_gen_n(const msg_gen_t *g) { return g->n > 1 ? g->n : 1; }
/* A worker's RESULT against the GEN it answers (docs/PROTOCOL.md, GEN and
 * RESULT): version at least `required` (and 1), first_version no newer;
 * `latent` and exactly the rollout tensors asked for, F32 of their
 * shapes (a group's with its leading [n]); a group's n and seeds, none
 * for one sample; version runs from 0, in order, inside the n x N grid;
 * stats no more than the n x N steps ran (captured + replayed + eager,
 * batched, the declines; batch_rows and padded_rows at most
 * MSG_MAX_BATCH_ROWS a batched step), seconds not negative.
 * 0, or -1 with err naming the fault (code internal: the worker broke). */
int msg_result_check(const msg_result_t *r, const msg_gen_t *g, uint64_t required, wire_err_t *err);
/* SYNC: exactly one of path, uploaded and inline tensors (inline only
 * when inline_ok; the messages offer them only then). bad_request. */
int msg_sync_validate(const msg_sync_t *s, bool inline_ok, wire_err_t *err);
/* READY: at most 16 models, each a model name, configs only of them. */
int msg_ready_validate(const msg_ready_t *r, wire_err_t *err);
/* PREWARM: at most MSG_MAX_PREWARM keys, each a latent shape GEN would
 * take, a known solver (with sde: its grid), n 1..MSG_MAX_GROUP. */
int msg_prewarm_validate(const msg_prewarm_t *p, wire_err_t *err);
/* The "chunk" tensor of UPLOAD and FETCH_DATA: n bytes at p as U8 [n]. */
wire_tensor_t msg_chunk(const void *p, size_t n);
/* A chunk: U8, one dimension, 1..MSG_CHUNK_MAX bytes, inside `size`. */
int msg_upload_validate(const msg_upload_t *u, wire_err_t *err);
/* As upload, and an empty chunk (a fetch past the end) allowed. */
int msg_fetch_data_validate(const msg_fetch_data_t *f, wire_err_t *err);

/* ---- shared helpers --------------------------------------------------------------- */

/* True when s is 64 hex digits (either case). */
bool msg_sha256_valid(const char *s);
/* A GEN's text (prompt, negative_prompt): UTF-8 (no overlong forms or
 * surrogates) with no control characters but tab, newline and CR (C0,
 * DEL and C1 refused). reelctl run and gen check their --prompt with it
 * too, so a prompt one takes the other takes. */
bool msg_text_ok(const char *s);
/* "%016x" of h into buf, the form of every hash on the wire. Returns buf. */
char *msg_hex64(uint64_t h, char buf[17]);

#ifdef __cplusplus
}
#endif
#endif
