/* tdit_program.h -- the tinydit denoising step as a capture_cache program,
 * and the denoising loop run through a capture cache.
 *
 * Inputs, in key order: 0 latent [C,F,H,W] (copied), 1 sigmas F32 [3] ([4] on a solver's grid: t_i after σ_1)
 * (copied), 2 guidance F32 [1] (copied), 3 context [L,T] (pinnable),
 * 4 uncond [L,T] (pinnable; CFG only), then for SDE steps sde F32 [4] (eta,
 * seed, step; copied), for multistep steps (shape.solver unipc or dpm++)
 * solver F32 [16] and history [3, latent elements] (copied in and out). A batch of B samples (tdit_shape_t.batch) has latent
 * [B,C,F,H,W] and sde F32 [B,4], batch B in its key. Output 0: the updated latent. The step reads weight
 * component "transformer" (the model's one allocation). */
#ifndef REEL_MODEL_TDIT_PROGRAM_H
#define REEL_MODEL_TDIT_PROGRAM_H

#include "capture_cache/cache.h"
#include "model/loop.h"
#include "model/tinydit.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TDIT_COMPONENT "transformer"

/* The program for the CFG (5 inputs) or plain (4 inputs) step, Euler or SDE
 * (one more input: eta, seed and step, F32 [4], kern_sde_params_pack). Its
 * `user` is the tdit_model_t. Both kinds are capturable. */
const cap_program_t *tdit_program(bool cfg, bool sde);
/* The multistep step (UniPC, DPM++: tdit_step_multistep): inputs as above,
 * then solver F32 [16] and history [3, latent elements] (both copied);
 * outputs the latent and the history. */
const cap_program_t *tdit_program_ms(bool cfg);
/* The key's loop kind: the solver's name ("unipc", "dpm++") for a
 * multistep shape, else "sde" or "euler", on a grid "sde-unipc",
 * "euler-unipc", "sde-dpm++" or "euler-dpm++". Can't fail. */
const char *tdit_step_loop(const tdit_shape_t *shape, bool sde);

/* The capture key of one step of m on backend b for shape; `version` is the
 * resident version of the transformer weights. -1 with a message when a
 * field does not fit the key. */
int tdit_step_key(const tdit_model_t *m, const tdit_shape_t *shape, bool sde, uint64_t version,
                  cap_key_t *out);

/* Registers m's weights with c as component "transformer" at version. */
int tdit_register_weights(cap_cache_t *c, const tdit_model_t *m, uint64_t version);

typedef struct {
    int steps, captured, replayed, eager;
    int declines[CAP_DECLINE_COUNT];
    double seconds;
    int batched;           /* of the steps, those run in a mixed batch with other requests */
    int batch_rows;        /* the requests in each of those batches, summed */
    int padded_rows;       /* the padding rows of those batches, summed */
} tdit_run_stats_t;

/* Request staging buffers on the device for one shape: where a request's
 * latent, per-step scalars and contexts live while it runs. Reused across
 * requests on one stream, they stay put, so the graph reads the contexts in
 * place (pinned) instead of copying them every step. NULL with a message. */
typedef struct tdit_staging tdit_staging_t;
tdit_staging_t *tdit_staging_new(tdit_model_t *m, const tdit_shape_t *shape);
/* The shape stg was made for. */
const tdit_shape_t *tdit_staging_shape(const tdit_staging_t *stg);
void tdit_staging_destroy(tdit_staging_t **st);

/* The loop of loop.h, each step dispatched through c on stream s. stg holds
 * the request (NULL: temporary buffers for this call only; their addresses
 * differ from the last request's, so pinned inputs re-learn). Writes the
 * final latent to out; stats may be NULL. 0, or -1 with a message. */
int tdit_generate_cached(tdit_model_t *m, cap_cache_t *c, kern_stream_t *s, tdit_staging_t *stg,
                         const tdit_shape_t *shape, const tdit_loop_t *p, const float *latent,
                         const float *context, const float *uncond, float *out,
                         tdit_run_stats_t *stats);
/* The same, calling progress(user, done, steps) after each step (progress
 * may be NULL). */
int tdit_generate_cached_progress(tdit_model_t *m, cap_cache_t *c, kern_stream_t *s, tdit_staging_t *stg,
                                  const tdit_shape_t *shape, const tdit_loop_t *p, const float *latent,
                                  const float *context, const float *uncond, float *out,
                                  tdit_run_stats_t *stats, void (*progress)(void *user, int done, int steps),
                                  void *user);

/* One request as a sequence of steps, for executors that interleave the
 * steps of several requests on a stream. The request owns its staging
 * buffers (latent, per-step scalars, contexts, uploaded once). Each step
 * builds its capture key with the transformer version registered in the
 * cache at that moment, so a weight sync between steps is honoured. */
typedef struct tdit_req tdit_req_t;

/* Validates p and the shape, uploads the inputs on s, the caller's stream
 * (latent NULL: drawn from p->seed); nothing creates a stream per request.
 * NULL with a message. */
tdit_req_t *tdit_req_new(tdit_model_t *m, kern_stream_t *s, const tdit_shape_t *shape, const tdit_loop_t *p,
                         const float *latent, const float *context, const float *uncond);
/* As tdit_req_new, but the request runs in stg (made for the same shape),
 * which the caller keeps across requests so inputs read in place stay put.
 * The request does not own stg; give stg to one request at a time. */
tdit_req_t *tdit_req_new_in(tdit_model_t *m, kern_stream_t *s, tdit_staging_t *stg, const tdit_shape_t *shape,
                            const tdit_loop_t *p, const float *latent, const float *context,
                            const float *uncond);
/* A group: shape->batch = B samples of one prompt in one batched step,
 * sample b with SDE seed (and, latent NULL, initial latent drawn from)
 * seeds[b], or p->seed + b when seeds is NULL; latent, when given, is
 * [B,C,F,H,W]. Each sample's result is bitwise the single request with its
 * seed. tdit_req_new_in is this with seeds NULL. */
tdit_req_t *tdit_req_new_group(tdit_model_t *m, kern_stream_t *s, tdit_staging_t *stg, const tdit_shape_t *shape,
                               const tdit_loop_t *p, const uint64_t *seeds, const float *latent,
                               const float *context, const float *uncond);
void tdit_req_destroy(tdit_req_t **r);
/* Marks r a prewarm: each of its steps asks the cache to capture its key
 * at once, skipping warmup (cap_call_t.prewarm), so a later request of the
 * same key replays from its first step. For a request whose inputs do not
 * matter (zeros): its results are never read. */
void tdit_req_set_prewarm(tdit_req_t *r, bool on);
/* Runs the next step through c on s; res may be NULL. -1 with a message. */
int tdit_req_step(tdit_req_t *r, cap_cache_t *c, kern_stream_t *s, cap_result_t *res);
int tdit_req_steps_done(const tdit_req_t *r);
int tdit_req_steps(const tdit_req_t *r);
bool tdit_req_done(const tdit_req_t *r);
/* The capture key hash (full) of the graph the last step ran under (the
 * request's own key, or its mixed batch's: tdit_mix_step), and the shard
 * hash of the request's own key (what the broker routes it by). */
uint64_t tdit_req_key_hash(const tdit_req_t *r);
uint64_t tdit_req_shard_hash(const tdit_req_t *r);
/* Per-request counts (steps, captured, replayed, eager, declines). */
const tdit_run_stats_t *tdit_req_stats(const tdit_req_t *r);
/* What a request keeps as its steps run, for RL trainers. */
enum {
    TDIT_REC_TRAJECTORY = 1,  /* every latent x_0 ... x_N */
    TDIT_REC_LOG_PROBS = 2,   /* each SDE step's Flow-GRPO log-probability (TINYDIT.md) */
    TDIT_REC_MEANS = 4,       /* each SDE step's mean μ_i */
};
/* Asks r to keep `what` (TDIT_REC_*) on the host; call before its first
 * step (x_0 is read now, on s). -1 with a message: log-probabilities and
 * means need an SDE loop with eta > 0; out of memory. */
int tdit_req_record(tdit_req_t *r, kern_stream_t *s, unsigned what);
/* What was kept (NULL when not asked): [B][steps+1][C·F·H·W],
 * [B][steps][C·F·H·W], [B][steps] (B = 1 for a single request); the
 * schedule σ_0 ... σ_N; the version each step ran on. */
const float *tdit_req_trajectory(const tdit_req_t *r);
const float *tdit_req_means(const tdit_req_t *r);
const float *tdit_req_log_probs(const tdit_req_t *r);
const double *tdit_req_sigmas(const tdit_req_t *r);
/* Step i's timestep as the transformer took it: 1000·σ_i of the F32 σ_i
 * on Euler's grid (in double), else the solver's integer t_i. */
double tdit_req_timestep(const tdit_req_t *r, int i);
const uint64_t *tdit_req_versions(const tdit_req_t *r);
/* The shape and loop r runs. */
const tdit_shape_t *tdit_req_shape(const tdit_req_t *r);
const tdit_loop_t *tdit_req_loop(const tdit_req_t *r);
/* The samples B and each one's seed. */
int64_t tdit_req_batch(const tdit_req_t *r);
const uint64_t *tdit_req_seeds(const tdit_req_t *r);
/* Copies the current latent (B·C·F·H·W floats) to out, ordered on s. */
int tdit_req_read(tdit_req_t *r, kern_stream_t *s, float *out, size_t n);

/* ---- mixed batches: different requests in one step ----------------------
 * Requests of one kind (tdit_req_same_class: one model, shape and loop
 * kind, Euler or SDE; each a single sample) may step together: each at its
 * own point of its own loop, with its own σ schedule, guidance, seed, eta
 * and contexts. Their step runs as one batch of B rows (the shape's
 * `mixed`, key cap_key_denoise_mixed), n <= B of them holding requests and
 * the rest padding (zeros: whatever requests held those rows before); each
 * request's step is bitwise the step it would have run alone, and
 * everything that follows a step (records, versions, counts) is the same
 * too. */
typedef struct tdit_mix tdit_mix_t;

/* True when r can step in a mixed batch: one sample, not a multistep
 * solver, steps left. */
bool tdit_req_mixable(const tdit_req_t *r);
/* True when a and b may share a mixed batch. */
bool tdit_req_same_class(const tdit_req_t *a, const tdit_req_t *b);

/* The buffers of a batch of B (2..TDIT_MAX_BATCH) rows for requests of
 * shape `one` (a single, Euler or SDE) and loop kind sde; zeroed on s.
 * NULL with a message. */
tdit_mix_t *tdit_mix_new(tdit_model_t *m, kern_stream_t *s, const tdit_shape_t *one, bool sde, int64_t B);
void tdit_mix_destroy(tdit_mix_t **x);
int64_t tdit_mix_capacity(const tdit_mix_t *x);
/* True when r may be a row of x (tdit_req_mixable and of x's kind). */
bool tdit_mix_fits(const tdit_mix_t *x, const tdit_req_t *r);
/* The next step of each of reqs[0..n), 1 <= n <= capacity, distinct, each
 * fitting x, as one step through c on s (rows n.. padded). 0; or -1 with a
 * message, *advanced false when no request moved (the caller may step them
 * alone), true when they did and are now in an unknown state. res (may be
 * NULL): how the batch's step ran, which every member counts as its own. */
int tdit_mix_step(tdit_mix_t *x, tdit_req_t *const *reqs, int n, cap_cache_t *c, kern_stream_t *s,
                  cap_result_t *res, bool *advanced);
/* Marks x's steps prewarm calls (as tdit_req_set_prewarm): a batch of its
 * size captures at once, skipping warmup. */
void tdit_mix_set_prewarm(tdit_mix_t *x, bool on);
/* The batch's latent, all B rows as the last step left them (a padded
 * row: what the step computed from zeros with row 0's σ, guidance and SDE
 * parameters), into out[n] as F32: for tests and debugging. 0, or -1 with
 * a message (n is not the batch's element count, or a copy failed). */
int tdit_mix_read(tdit_mix_t *x, kern_stream_t *s, float *out, size_t n);

#ifdef __cplusplus
}
#endif
#endif
