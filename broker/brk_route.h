/* brk_route.h -- the pure pieces of the broker's routing (internal header):
 * rendezvous scores, which workers may run a request, which of them owns
 * its shard key, the bounded FIFO of waiting requests and the recent-keys
 * list of a worker.
 *
 * Nothing here touches a socket, a clock or the catalog, so every rule can
 * be unit-tested (tests/test_broker_unit.c). A key's owner among live
 * workers is the one with the highest brk_rendezvous_score(key, name): a
 * worker leaving moves only its own keys, and they come back when it
 * rejoins (docs/PROTOCOL.md, "Routing"). */
#ifndef REEL_BROKER_BRK_ROUTE_H
#define REEL_BROKER_BRK_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "schema/msg.h"

/* The protocol's limits (schema/msg.h), as routing knows them. */
#define BRK_NAME_MAX MSG_NAME_MAX             /* worker, model and component names */
#define BRK_MAX_MODELS MSG_MAX_MODELS         /* models one worker serves */
#define BRK_MAX_COMPONENTS MSG_MAX_COMPONENTS /* weight components one worker reports */
#define BRK_KEYS_RECENT MSG_KEYS_RECENT       /* shard keys remembered per worker */
#define BRK_COMPONENT "transformer" /* the component a GEN's version names */

/* True when workers serve component comp (a SYNC or an UPLOAD of another
 * could never be applied); else false with a REEL_E_UNSUPPORTED error
 * (base/error.h) naming both. */
bool brk_component_served(const char *comp);

/* ---- hashing ------------------------------------------------------------- */

/* The splitmix64 finaliser: a bijective 64-bit mix. Can't fail. */
uint64_t brk_splitmix64(uint64_t x);
/* Rendezvous weight of worker `name` for shard key `shard_hash`:
 * splitmix64(shard_hash ^ cap_hash_text(name)), cap_hash_text being
 * FNV-1a 64 with 0 read as 1 (capture_cache/key.h). Can't fail. */
uint64_t brk_rendezvous_score(uint64_t shard_hash, const char *name);

/* The loop kind of a GEN's steps, as its capture key names it: SDE_UNIPC
 * and SDE_DPMPP are SDE steps on that solver's σ grid ("sde-unipc"). */
enum { BRK_LOOP_EULER = 0, BRK_LOOP_SDE = 1, BRK_LOOP_UNIPC = 2, BRK_LOOP_DPMPP = 3, BRK_LOOP_SDE_UNIPC = 4,
       BRK_LOOP_SDE_DPMPP = 5 };
/* A GEN's loop kind from its sde flag and solver name ("" or "euler":
 * Euler; "unipc", "dpm++"). Can't fail. */
int brk_loop_kind(bool sde, const char *solver);

/* The shard hash of a GEN (docs/CAPTURE.md, shard form): cap_key_denoise
 * with model "tinydit:<model>", loop "euler", "sde", "unipc" or "dpm++"
 * (loop is a BRK_LOOP_*), dtype F32, the
 * latent and context shapes, cfg = uncond present, the GEN's batch n (a
 * group of n > 1 samples runs as one batched step: cap_key_denoise_batch),
 * component "transformer" at version 0, hashed without device, arch or
 * versions. Returns 0 (never a valid hash) with a REEL_E_INVALID error
 * (base/error.h: the GEN is refused bad_request with its message) when a
 * field does not fit the key (a model name empty, too long, or with
 * characters outside [A-Za-z0-9_.:+-]). */
uint64_t brk_shard_hash(const char *model, int loop, const int64_t latent[4],
                        const int64_t context[2], bool cfg, int64_t batch);

/* The shard hashes of recent inputs: requests of one model and shapes
 * (a trainer's batch, a client's retries) share one, and building the key
 * text costs more than the rest of routing a request. Direct-mapped by
 * the inputs; a zeroed memo is empty. */
#define BRK_SHARD_MEMO 16
typedef struct {
    char model[BRK_NAME_MAX];    /* "" in an empty slot */
    int loop;
    bool cfg;
    int64_t latent[4], context[2];
    int64_t batch;
    uint64_t hash;
} brk_shard_memo_slot_t;
typedef struct {
    brk_shard_memo_slot_t slot[BRK_SHARD_MEMO];
} brk_shard_memo_t;
/* brk_shard_hash, looked up in memo first and stored there when it is
 * valid (0 is never stored: failures are computed again, with their
 * message). */
uint64_t brk_shard_hash_memo(brk_shard_memo_t *memo, const char *model, int loop, const int64_t latent[4],
                             const int64_t context[2], bool cfg, int64_t batch);

/* ---- workers as routing sees them ------------------------------------------ */

typedef struct {
    char name[BRK_NAME_MAX];
    uint64_t version;
} brk_version_t;

/* What routing needs to know about one worker. `routable` is false while
 * the worker is known but cannot take work (a send to it failed). */
typedef struct {
    char name[BRK_NAME_MAX];
    bool routable;
    int inflight, max_inflight;
    int n_models;
    char models[BRK_MAX_MODELS][BRK_NAME_MAX];
    int n_versions;
    brk_version_t versions[BRK_MAX_COMPONENTS];  /* applied (acked) versions */
    unsigned loops;                 /* bit BRK_LOOP_*: the loop kinds it runs (euler and sde always; the
                                     * solvers its READY listed); bit BRK_CAP_*: what else it can do */
    uint64_t applying;              /* a BRK_COMPONENT version a sync barrier waits for it to ack (0: none):
                                     * it owns what it will own at that version, and is sent nothing that
                                     * needs it before it has applied it (brk_peer_eligible) */
} brk_peer_t;

/* The applied version of component `comp` (0 when never reported). */
uint64_t brk_peer_version(const brk_peer_t *p, const char *comp);
/* Records that p runs `comp` at `version`. -1 when p already reports
 * BRK_MAX_COMPONENTS others (p unaltered). */
int brk_peer_set_version(brk_peer_t *p, const char *comp, uint64_t version);
/* The loops bits of a READY's solvers list: euler and sde, and each of
 * "unipc", "dpm++", "sde-unipc", "sde-dpm++" named. Can't fail. */
unsigned brk_loops_from(const char (*solvers)[MSG_NAME_MAX], size_t n);
/* Peers of peers[0..n) that run loop kind `loop` into out (their indexes
 * in idx): a GEN's owner is chosen among them, so a GEN naming a solver
 * never lands on a worker that would run Euler instead. Returns the count.
 * Can't fail. */
int brk_peers_running(const brk_peer_t *const *peers, int n, int loop, const brk_peer_t **out, int *idx);
/* What a worker can do besides its loops, as bits of brk_peer_t.loops
 * beside the BRK_LOOP_* ones: encode a GEN's prompt (its READY named a
 * text_encoder) and decode its output to frames or a video (a vae). */
enum { BRK_CAP_PROMPT = 8, BRK_CAP_DECODE = 9 };
/* The capability bits of a READY's text_encoder and vae ("" : none). Can't fail. */
unsigned brk_caps_from(const char *text_encoder, const char *vae);
/* Peers of peers[0..n) whose loops bits hold every bit of needs (1u <<
 * BRK_LOOP_* | 1u << BRK_CAP_*) into out (indexes in idx); the count.
 * brk_peers_running is this with one loop bit. Can't fail. */
int brk_peers_able(const brk_peer_t *const *peers, int n, unsigned needs, const brk_peer_t **out, int *idx);
/* True when p lists `model`. */
bool brk_peer_serves(const brk_peer_t *p, const char *model);
/* True when p may own a request for `model` needing transformer weights
 * at `required` or newer: routable, serves the model, and applied >=
 * required or applying a version >= required. Neither capacity (inflight)
 * nor a sync under way is part of eligibility: a busy owner, or one still
 * applying the version, keeps its keys and the request waits for it
 * (brk_peer_has says whether it can be sent now), so a key keeps its
 * worker across a sync instead of going, for the seconds between the
 * first worker's ack and its own, to whichever worker acked first. */
bool brk_peer_eligible(const brk_peer_t *p, const char *model, uint64_t required);
/* True when p has applied transformer weights at `required` or newer: a
 * request needing them can be sent to it. */
bool brk_peer_has(const brk_peer_t *p, uint64_t required);
/* Index in peers[0..n) of the owner of shard_hash: the eligible worker with
 * the highest rendezvous score (ties, astronomically rare, go to the lower
 * name so the order of peers never matters). -1 when none is eligible. */
int brk_owner(const brk_peer_t *const *peers, int n, uint64_t shard_hash, const char *model,
              uint64_t required);

/* ---- the bounded queue ----------------------------------------------------- */

/* A FIFO of pointers that admits new items up to `max`; requeued items
 * (already accepted once) go to the front and may exceed it. */
typedef struct {
    void **v;
    size_t n, cap, max;
} brk_queue_t;

/* Sets up an empty queue admitting max items. -1 on out-of-memory. */
int brk_queue_init(brk_queue_t *q, size_t max);
/* Frees the array (not the items). Safe on a zeroed or freed queue. */
void brk_queue_free(brk_queue_t *q);
/* Appends item. -1 when the queue holds max items already (the caller
 * answers BUSY), q unaltered. */
int brk_queue_push(brk_queue_t *q, void *item);
/* Puts item first, growing past max if needed. -1 on out-of-memory. */
int brk_queue_push_front(brk_queue_t *q, void *item);
/* Removes and returns item i (< n), keeping the order of the others. */
void *brk_queue_remove(brk_queue_t *q, size_t i);
/* Removes every NULL item, keeping the order of the others. */
void brk_queue_compact(brk_queue_t *q);
#define brk_queue_len(q) ((q)->n)
#define brk_queue_at(q, i) ((q)->v[(i)])

/* ---- recent keys ------------------------------------------------------------ */

/* Notes that shard key h was routed to a worker whose recent keys are
 * keys[0..*n), most recent first: h moves (or is inserted) to the front,
 * the list keeps at most BRK_KEYS_RECENT distinct keys. Can't fail. */
void brk_keys_note(uint64_t keys[BRK_KEYS_RECENT], int *n, uint64_t h);

#endif
