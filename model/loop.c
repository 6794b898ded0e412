/* loop.c -- the denoising loop (see loop.h). */
#include "loop.h"
#include "base/error.h"
#include "kernels/ops_args.h"
#include "kernels/philox.h"
#include <math.h>
#include <stdlib.h>
#include <time.h>

int tdit_loop_validate(const tdit_loop_t *p) {
    if (p->steps < 1 || p->steps > 10000) return reel_fail(REEL_E_INVALID, "steps must be in 1..10000 (got %d)", p->steps);
    if (!(p->shift > 0) || !isfinite(p->shift)) return reel_fail(REEL_E_INVALID, "shift must be finite and > 0");
    if (!isfinite(p->guidance)) return reel_fail(REEL_E_INVALID, "guidance scale must be finite");
    if (p->sde && (!(p->eta >= 0) || !isfinite(p->eta))) return reel_fail(REEL_E_INVALID, "eta must be finite and >= 0");
    if ((unsigned)p->solver >= TDIT_SOLVER_COUNT) return reel_fail(REEL_E_INVALID, "unknown solver %d", (int)p->solver);
    if (p->sde && p->solver != TDIT_SOLVER_EULER)
        return reel_fail(REEL_E_INVALID, "solver %s cannot run SDE steps (sde rollouts use their own sampler)",
                         tdit_solver_name(p->solver));
    return 0;
}

void tdit_initial_latent(uint64_t seed, float *x, size_t n) {
    for (size_t j = 0; j < n; j++) x[j] = kern_philox_normal(seed, 0xffffffffu, j);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    bool ms = tdit_solver_multistep(p->solver);
    if (sh->solver != p->solver)
        return reel_fail(REEL_E_INVALID, "solver %s runs in a workspace made for %s", tdit_solver_name(p->solver),
                         tdit_solver_name(sh->solver));
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
        const float sv[3] = { (float)sig[i], (float)sig[i + 1], (float)sig[1] };
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
    rc = tdit_ws_read_latent(ws, s, out, n_lat);
out:
    free(sig);
    free(init);
    return rc;
}
