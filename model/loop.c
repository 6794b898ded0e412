/* loop.c -- the denoising loop (see loop.h). */
#include "loop.h"
#include "base/error.h"
#include "base/tensor.h"
#include "kernels/ops_args.h"
#include "kernels/philox.h"
#include <math.h>
#include <stdlib.h>
#include <time.h>

/* A multistep solver divides by the gaps between λ(σ) = log((1 − σ)/σ) of
 * its float32 sigmas: an extreme shift (or many steps with a large one)
 * rounds two of them equal, or one to 1 or to 0, and the loop's output
 * would be NaN. Refused up front, naming the sigma. */
static int schedule_usable(const tdit_loop_t *p) {
    if (p->solver == TDIT_SOLVER_EULER) return 0; /* dt = 0 is harmless, and σ is double */
    double *sig = malloc(2 * ((size_t)p->steps + 1) * sizeof *sig);
    if (!sig) return reel_fail(REEL_E_NOMEM, "out of memory checking the schedule");
    tdit_solver_schedule(p->solver, p->steps, p->shift, sig, sig + p->steps + 1);
    int bad = -1; /* DPM++ starts at σ_0 = 1 by design; UniPC below it */
    for (int i = 0; i < p->steps && bad < 0; i++) {
        bool top_ok = i == 0 && p->solver == TDIT_SOLVER_DPMPP;
        if (!(sig[i] > 0) || sig[i] > 1 || (sig[i] == 1 && !top_ok) || (i > 0 && !(sig[i] < sig[i - 1]))) bad = i;
    }
    double v = bad >= 0 ? sig[bad] : 0;
    free(sig);
    if (bad < 0) return 0;
    return reel_fail(REEL_E_INVALID,
                     "shift %g collapses the %s schedule of %d steps: sigma %d is %.9g as float32 (its sigmas must "
                     "lie strictly between 0 and 1 and decrease; use a shift nearer 1)",
                     p->shift, tdit_solver_name(p->solver), p->steps, bad, v);
}

int tdit_loop_validate(const tdit_loop_t *p) {
    if (p->steps < 1 || p->steps > 10000) return reel_fail(REEL_E_INVALID, "steps must be in 1..10000 (got %d)", p->steps);
    if (!(p->shift > 0) || !isfinite(p->shift)) return reel_fail(REEL_E_INVALID, "shift must be finite and > 0");
    if (!isfinite(p->guidance)) return reel_fail(REEL_E_INVALID, "guidance scale must be finite");
    if (p->sde && (!(p->eta >= 0) || !isfinite(p->eta))) return reel_fail(REEL_E_INVALID, "eta must be finite and >= 0");
    if ((unsigned)p->solver >= TDIT_SOLVER_COUNT) return reel_fail(REEL_E_INVALID, "unknown solver %d", (int)p->solver);
    return schedule_usable(p);
}

void tdit_initial_latent(uint64_t seed, float *x, size_t n) {
    for (size_t j = 0; j < n; j++) x[j] = kern_philox_normal(seed, 0xffffffffu, j);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tdit_result_finite(const float *out, size_t n, int steps) {
    /* A loop whose values overflowed (a guidance scale, shift or eta far
     * past what the model steps, weights that overflow) ends in NaN or
     * infinity: that is an error to its caller, never a result. */
    if (kern_all_finite(out, n, KERN_F32)) return 0;
    return reel_fail(REEL_E_INVALID,
                     "the loop's result holds NaN or infinite values after %d steps: its guidance scale, shift or "
                     "eta (or the weights) overflow the model; nothing was returned",
                     steps);
}

int tdit_generate(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s, const tdit_loop_t *p,
                  const float *latent, const float *context, const float *uncond,
                  float *out, tdit_loop_stats_t *stats) {
    if (tdit_loop_validate(p) != 0) return -1;
    const tdit_shape_t *sh = tdit_ws_shape(ws);
    const tdit_config_t *c = tdit_model_config(m);
    if (sh->cfg != (uncond != NULL))
        return reel_fail(REEL_E_INVALID, sh->cfg ? "CFG workspace needs an unconditional context"
                                 : "unconditional context given to a workspace without CFG");
    size_t n_lat = (size_t)(c->in_channels * sh->frames * sh->height * sh->width);
    size_t n_ctx = (size_t)(sh->text_len * c->text_dim);
    tdit_shape_t want = *sh;
    tdit_loop_shape(p, &want);
    bool ms = tdit_solver_multistep(want.solver);
    if (sh->solver != want.solver || sh->grid != want.grid)
        return reel_fail(REEL_E_INVALID, "solver %s%s runs in a workspace made for %s (grid %s)", p->sde ? "sde on " : "",
                         tdit_solver_name(p->solver), tdit_solver_name(sh->solver), tdit_solver_name(sh->grid));
    double *sig = malloc(((size_t)p->steps + 1) * 2 * sizeof *sig), *ts = sig ? sig + p->steps + 1 : NULL;
    float *init = latent ? NULL : malloc(n_lat * sizeof *init);
    int rc = -1;
    if (!sig || (!latent && !init)) { reel_fail(REEL_E_NOMEM, "out of memory"); goto out; }
    if (!latent) {
        tdit_initial_latent(p->seed, init, n_lat);
        latent = init;
    }
    if (tdit_ws_bind_latent(ws, s, latent, n_lat) || tdit_ws_bind_context(ws, s, context, n_ctx, false) ||
        (uncond && tdit_ws_bind_context(ws, s, uncond, n_ctx, true)) || (ms && tdit_ws_clear_history(ws, s)))
        goto out;
    tdit_solver_schedule(p->solver, p->steps, p->shift, sig, ts);
    double t0 = now();
    for (int i = 0; i < p->steps; i++) {
        const float sv[4] = { (float)sig[i], (float)sig[i + 1], (float)sig[1], (float)ts[i] }; /* t_i: a grid's */
        if (tdit_ws_bind_step(ws, s, sv, p->guidance) != 0) goto out;
        int r;
        if (ms) {
            float coef[KERN_MS_COEFS];
            tdit_solver_coefs(p->solver, p->steps, sig, ts, i, coef);
            r = tdit_ws_bind_solver(ws, s, coef) || tdit_step_multistep(m, ws, s);
        } else {
            r = p->sde ? tdit_step_sde(m, ws, s, p->eta, p->seed, (uint32_t)i) : tdit_step(m, ws, s);
        }
        if (r != 0) goto out;
        if (stats) { stats->steps_run++; stats->steps_eager++; }
    }
    if (kern_stream_sync(s) != 0) goto out;
    if (stats) stats->seconds += now() - t0;
    if (tdit_ws_read_latent(ws, s, out, n_lat) != 0 || tdit_result_finite(out, n_lat, p->steps) != 0) goto out;
    rc = 0;
out:
    free(sig);
    free(init);
    return rc;
}
