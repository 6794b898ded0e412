/* loop.h -- the denoising loop over tdit_step: schedule, CFG, Euler or SDE,
 * initial latent from the request or drawn from the seed.
 *
 * The loop is the single place that writes per-step values (σ_i, σ_{i+1},
 * σ_1, guidance) into the workspace before each step, so every step reads
 * them from memory: the step stays capturable. */
#ifndef REEL_MODEL_LOOP_H
#define REEL_MODEL_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include "model/solver.h"
#include "model/tinydit.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int steps;          /* N >= 1 */
    double shift;       /* S > 0 */
    float guidance;     /* g, used when the shape has cfg */
    bool sde;           /* Flow-GRPO SDE steps instead of Euler */
    float eta;          /* SDE noise level a */
    uint64_t seed;      /* SDE noise and the initial latent when none is given */
    tdit_solver_t solver; /* euler (0, the default), unipc or dpm++; with sde: the σ schedule and
                          * timesteps the SDE steps run on (tdit_loop_shape) */
} tdit_loop_t;

typedef struct {
    int steps_run;
    int steps_eager;
    double seconds;     /* wall time of the steps, host clock */
} tdit_loop_stats_t;

/* Validates p: -1 with a message naming the bad field. */
int tdit_loop_validate(const tdit_loop_t *p);

/* The step shape's sampler for loop p: a multistep solver runs its own
 * steps (solver = it, grid euler); an SDE loop runs Flow-GRPO's SDE step,
 * on the Euler schedule (solver and grid euler) or on a multistep
 * solver's σ schedule and timesteps (solver euler, grid = it: what
 * Flow-GRPO's Wan trainer rolls out with Wan's UniPC scheduler). */
static inline void tdit_loop_shape(const tdit_loop_t *p, tdit_shape_t *sh) {
    const bool grid = p->sde && tdit_solver_multistep(p->solver);
    sh->solver = grid ? TDIT_SOLVER_EULER : p->solver;
    sh->grid = grid ? p->solver : TDIT_SOLVER_EULER;
}

/* Draws the initial latent from seed: x[j] = philox_normal(seed, 0xffffffff, j). */
void tdit_initial_latent(uint64_t seed, float *x, size_t n);

/* 0 when the n floats of a loop's result (after `steps` steps) are all
 * finite, else -1 (REEL_E_INVALID, "the loop's result holds NaN or
 * infinite values ..."): every path that returns a result checks it. */
int tdit_result_finite(const float *out, size_t n, int steps);

/* Runs p's loop for ws's shape: binds latent (or draws it from p->seed when
 * latent is NULL) and contexts, then p->steps steps. Writes the final latent
 * to out (C·F·H·W floats). uncond is required iff the shape has cfg.
 * Returns 0, or -1 with a message (a result of NaN or infinity is one:
 * tdit_result_finite) (the workspace may then hold a partial
 * result; nothing else is changed). stats may be NULL. */
int tdit_generate(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s, const tdit_loop_t *p,
                  const float *latent, const float *context, const float *uncond,
                  float *out, tdit_loop_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif
