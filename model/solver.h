/* solver.h -- the samplers a denoising loop can run: Euler (Reel's own
 * schedule), and Wan2.1's flow UniPC and DPM-Solver++ multistep solvers
 * with the sigma schedules and timesteps wan/text2video.py sets up for
 * them (docs/MODEL.md, "Samplers").
 *
 * A multistep step is one fused update (kern_multistep_update) whose
 * coefficients this module computes on the host, per step, in double,
 * from the schedule: the step reads them (and the timestep the transformer
 * sees) from the workspace, and keeps its history (the last corrected
 * sample and the last two data predictions) there, so every step of every
 * solver captures once per key and replays. */
#ifndef REEL_MODEL_SOLVER_H
#define REEL_MODEL_SOLVER_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TDIT_SOLVER_EULER = 0,  /* Reel's flow-matching Euler (the default) */
    TDIT_SOLVER_UNIPC,      /* Wan's FlowUniPCMultistepScheduler: order 2, bh2, predictor-corrector */
    TDIT_SOLVER_DPMPP,      /* Wan's FlowDPMSolverMultistepScheduler: dpmsolver++, order 2, midpoint */
    TDIT_SOLVER_COUNT
} tdit_solver_t;

/* "euler", "unipc", "dpm++"; "?" out of range. Can't fail. */
const char *tdit_solver_name(tdit_solver_t s);
/* The solver called name (exactly one of the names above). 0, or -1 with
 * a message listing the names. */
int tdit_solver_parse(const char *name, tdit_solver_t *out);
/* True for the solvers that keep history (UniPC, DPM++). */
bool tdit_solver_multistep(tdit_solver_t s);

/* The shifted sigma S·σ/(1 + (S − 1)·σ) of Wan's schedulers, in double,
 * numpy's form bit for bit; for S below 2^-10 the equal form
 * S·σ/((1 − σ) + S·σ), which does not cancel (at σ = 1 numpy's divides
 * by 0 once S − 1 rounds to −1). */
double tdit_shift_sigma(double shift, double sigma);

/* The solver's schedule for `steps` steps and shift: sigmas[0..steps]
 * (sigmas[steps] = 0) as the solver uses them (for UniPC and DPM++ the
 * float32 values Wan's schedulers hold, widened), and timesteps[0..steps-1],
 * what the transformer is given at each step (Euler: 1000·σ_i; UniPC and
 * DPM++: the int64 Wan truncates σ_i·1000 to). Can't fail for steps >= 1
 * and shift > 0 (tdit_loop_validate). */
void tdit_solver_schedule(tdit_solver_t s, int steps, double shift, double *sigmas, double *timesteps);

/* The coefficients of step i (0 <= i < steps) of a multistep solver, as
 * KERN_MS_* (kernels/ops_args.h) with coef[KERN_MS_T] = timesteps[i],
 * from the schedule of tdit_solver_schedule. Unused slots are 0. Can't
 * fail. */
void tdit_solver_coefs(tdit_solver_t s, int steps, const double *sigmas, const double *timesteps, int i,
                       float coef[16]);

#ifdef __cplusplus
}
#endif
#endif
