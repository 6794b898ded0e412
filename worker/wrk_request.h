/* wrk_request.h -- a REQUEST from the broker, checked and copied into a job
 * a stream thread can run without touching the ZeroMQ message again.
 *
 * The checks are the protocol's own (msg_gen_validate, the same rules the
 * broker applies to the GEN) with this worker's model: its name, C ==
 * in_channels, T == text_dim, H and W multiples of the patch; then the
 * version: not above the applied one ("worker at vX, request needs vY").
 * Each failure is ERROR bad_request with a message naming the field. Pure:
 * no sockets, no threads. */
#ifndef REEL_WORKER_WRK_REQUEST_H
#define REEL_WORKER_WRK_REQUEST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "schema/msg.h"
#include "model/loop.h"
#include "model/tdit_program.h"
#include "model/tinydit.h"

#define WRK_PATCH 2              /* tinydit patchifies 2 x 2 */

/* What a CANCEL marks: one REQUEST the worker holds (wrk_hold_take, wrk.h),
 * shared by its job, the parts of a group split over streams, and the main
 * thread's table of held requests; the last of them to let go frees it. */
typedef struct wrk_hold {
    atomic_int refs;
    atomic_bool cancelled;       /* a CANCEL of its id came after it */
} wrk_hold_t;

/* Lets go of *h (NULL-safe; sets *h = NULL): the last holder frees it.
 * Can't fail. */
void wrk_hold_release(wrk_hold_t **h);

typedef struct wrk_job wrk_job_t;
typedef struct wrk_group wrk_group_t; /* wrk_executor.c: a group split over streams */
struct wrk_job {
    uint64_t id;                 /* the broker's request id */
    uint64_t epoch;              /* broker session it arrived in (see wrk.h) */
    wrk_hold_t *hold;            /* its mark for CANCELs (one reference); NULL: none came to mark it */
    uint64_t version;            /* the version it must run on (0: any) */
    int64_t deadline_at;         /* wrk_mono_ms() past which the broker no longer waits for it (0: none):
                                  * dropped then, between steps */
    bool progress;               /* send PROGRESS after each step */
    unsigned rec;                /* TDIT_REC_*: what the RESULT carries besides the latent */
    bool want_timesteps;         /* GEN return_timesteps: timesteps [N] in the RESULT */
    tdit_shape_t shape;          /* one sample's; .batch: the running sub-batch's samples */
    tdit_loop_t loop;
    int64_t latent_shape[4];     /* C, F, H, W */
    size_t n_latent;             /* C*F*H*W, one sample */
    float *latent;               /* host copies (owned); latent NULL: drawn from the seeds */
    float *context, *uncond;     /* uncond NULL without CFG; both NULL until a prompt is encoded */
    float input_abs[3];          /* the largest |x| of latent, context, uncond as sent (0: none), kept
                                  * after the copies are freed: an overflow's ERROR names the culprit */
    /* A GEN with a prompt (docs/PROTOCOL.md "Prompts and videos"): the
     * stream encodes them into context/uncond when the request starts. */
    char *prompt, *neg_prompt;   /* owned; neg_prompt NULL without guidance */
    char output[16];             /* "latent", "frames" or "video" */
    double encode_s, decode_s;   /* seconds spent encoding and decoding */
    /* A group (GEN n > 1): n samples of one prompt, run as batched steps
     * of `chunk` samples (fewer when the budget or memory demands), one
     * sub-batch after another; their outputs are gathered here, sample by
     * sample, for one RESULT. */
    int n;                       /* samples (1: a single request) */
    uint64_t seeds[MSG_MAX_GROUP]; /* sample i's seed: GEN seeds[i], or seed + i */
    int chunk;                   /* samples per batched step (0: not chosen yet) */
    int at;                      /* the running sub-batch's first sample */
    int batches;                 /* sub-batches finished */
    float *g_out, *g_traj, *g_means, *g_logp; /* [n][...] as the RESULT carries them */
    uint64_t *g_vers;            /* [n][steps]: the version of each sample's every step */
    tdit_run_stats_t g_stats;    /* the finished sub-batches' counts */
    wrk_group_t *group;          /* a part of a group split over streams (its outputs go there), or NULL */
    int base;                    /* ... holding the group's samples base .. base + n - 1 */
    bool ok;                     /* the part ran all its samples */
    /* executor state */
    tdit_req_t *req;
    bool pw_unasked;             /* req has not yet asked the prewarm list for its key (it asks at its
                                  * first step alone: one in a mixed batch captures no graph of its own) */
    tdit_staging_t *stg;         /* the stream's staging set it runs in (NULL: its own) */
    uint64_t ran_version;        /* transformer version of the last step */
    uint64_t first_version;      /* ... and of the first (a sync may land in between) */
    bool counted;                /* counted in wrk_t.running (started, not finished) */
    wrk_job_t *next;
    /* this round's turn (wrk_executor.c stream_round): ready to step, in
     * the round's ready list, then how its step went */
    wrk_job_t *rnext;
    enum { WRK_TURN_NONE, WRK_TURN_READY, WRK_TURN_STEPPED, WRK_TURN_FAILED } turn;
};

/* What clients learn of cfg (READY "configs", STATUS "models"). Can't fail. */
void wrk_model_info(const tdit_config_t *cfg, msg_model_t *out);

/* Milliseconds of CLOCK_MONOTONIC: the worker's clock (deadlines, heartbeats). */
int64_t wrk_mono_ms(void);

/* Whether request r may run here, before its tensors are copied: first
 * the protocol's and the model's rules (msg_gen_validate against cfg: its
 * bad_request or too_large answers, a latent of other channels say), then
 * the worker's own bound on a request's work (--max-tokens: a sample's
 * F x H/p x W/p tokens; 0 = none; a group's n samples and its steps are
 * not bounded by it). 0, or -1 with err set. */
int wrk_request_fits(const msg_gen_t *r, const tdit_config_t *cfg, int64_t max_tokens, wire_err_t *err);
/* The bytes wrk_job_from_request copies for r and its job keeps while it
 * is held (r passed wrk_request_fits): the latent as sent, each context
 * as the step reads it (padded to cfg's text_len rows, when it has one),
 * the prompts. What --max-held-mb bounds, known before any is copied.
 * Can't fail. */
size_t wrk_request_bytes(const msg_gen_t *r, const tdit_config_t *cfg);
/* The most wrk_request_bytes is for any request cfg's worker takes: a
 * GEN's tensors (MSG_MAX_GEN_BYTES, 256 MiB), plus what padding both
 * contexts to text_len adds, plus two prompts. Can't fail. */
size_t wrk_request_bytes_most(const tdit_config_t *cfg);
/* Checks REQUEST r (id: the broker's request id) against the served config
 * and the applied version and copies its tensors out of the frames.
 * Returns 0 with *out (caller frees with wrk_job_free), or -1 with *err
 * set (code bad_request, or internal on out-of-memory) and *out NULL. */
int wrk_job_from_request(const msg_gen_t *r, uint64_t id, const tdit_config_t *cfg, uint64_t applied_version,
                         wrk_job_t **out, wire_err_t *err);

/* Frees the job, its copies, its group outputs and its tdit_req, and lets
 * go of its hold. NULL-safe; sets *j = NULL. */
void wrk_job_free(wrk_job_t **j);

/* A key to capture before its requests come (--prewarm): the shape and
 * loop a request of it would run. */
typedef struct {
    tdit_shape_t shape;          /* batch: the GEN's n (a group's samples) */
    tdit_loop_t loop;
    uint64_t shard;              /* its shard hash, as the broker named it */
    int rows;                    /* 0: the key itself; >= 2: a mixed batch of that many rows of its
                                  * requests (a single Euler or SDE key, --max-batch > 1) */
} wrk_prewarm_t;
/* A PREWARM key as what this worker would run for it: -1 with err set
 * (bad_request) when it names another model, a latent of other channels,
 * contexts of another width or of another length than its text_len, a
 * shape the model refuses, or more tokens than max_tokens (> 0). */
int wrk_prewarm_from_key(const msg_prewarm_key_t *k, const tdit_config_t *cfg, int64_t max_tokens,
                         wrk_prewarm_t *out, wire_err_t *err);

/* Takes pw[i] out of the keys still to try, pw[at..), at <= i: it moves to
 * pw[at] and the keys between move up one, in their order (the broker
 * lists them hottest first, and the background prewarm goes on from the
 * hottest left). Returns the list's new start, at + 1. */
int wrk_prewarm_take(wrk_prewarm_t *pw, int at, int i);

#endif
