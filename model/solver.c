/* solver.c -- schedules and per-step coefficients of the samplers (see
 * solver.h and docs/MODEL.md). The formulas are the published ones: UniPC
 * (Zhao et al. 2023, B(h) = e^h − 1, "bh2") in its data-prediction form,
 * and DPM-Solver++(2M) (Lu et al. 2022, midpoint), both over the flow
 * parametrisation α = 1 − σ, λ = log α − log σ; the schedules and the
 * order rules are Wan2.1's (wan/utils/fm_solvers*.py as text2video.py sets
 * them up). Every solver step is written as one linear combination of the
 * sample, the data prediction m = x − σ_i·v and the history, so one fused
 * kernel runs it. */
#include "solver.h"
#include "base/error.h"
#include "kernels/ops_args.h"
#include <math.h>
#include <string.h>

static const char *const names[TDIT_SOLVER_COUNT] = { "euler", "unipc", "dpm++" };

const char *tdit_solver_name(tdit_solver_t s) {
    return (unsigned)s < TDIT_SOLVER_COUNT ? names[s] : "?";
}

int tdit_solver_parse(const char *name, tdit_solver_t *out) {
    for (int i = 0; name && i < TDIT_SOLVER_COUNT; i++)
        if (!strcmp(name, names[i])) {
            *out = (tdit_solver_t)i;
            return 0;
        }
    return reel_fail(REEL_E_INVALID, "unknown solver '%s' (euler, unipc or dpm++)", name ? name : "(null)");
}

bool tdit_solver_multistep(tdit_solver_t s) { return s == TDIT_SOLVER_UNIPC || s == TDIT_SOLVER_DPMPP; }

/* numpy.linspace(start, stop, n + 1)[i] for i < n: i·step + start with
 * step = (stop − start)/n, each rounded as numpy rounds it. */
static double linspace_at(double start, double stop, int n, int i) {
    double step = (stop - start) / (double)n;
    double y = (double)i * step;
    return y + start;
}

/* The shifted sigma σ' = S·σ/(1 + (S − 1)·σ), in double as numpy does.
 * For a tiny S that form cancels (S − 1 rounds towards −1, and at σ = 1
 * the denominator is 0 for S below 2^-53: σ' infinite, the loop all NaN);
 * below 2^-10 the equal form S·σ/((1 − σ) + S·σ) is used, exact at σ = 1.
 * Every shift in use (1 to 20) takes numpy's form, bit for bit. */
double tdit_shift_sigma(double shift, double s) {
    double num = shift * s;
    double den = shift < 0x1p-10 ? (1.0 - s) + num : 1.0 + (shift - 1.0) * s;
    return num / den;
}

void tdit_solver_schedule(tdit_solver_t s, int steps, double shift, double *sig, double *ts) {
    if (s == TDIT_SOLVER_EULER) {
        for (int i = 0; i <= steps; i++) {
            double u = 1.0 - (double)i / steps;
            sig[i] = tdit_shift_sigma(shift, u);
        }
        for (int i = 0; i < steps; i++) ts[i] = 1000.0 * sig[i];
        return;
    }
    /* UniPC: set_timesteps(N, shift) spaces N sigmas from the training
     * schedule's σ_max = float32(1 − 1/1000) down to σ_min = 0 (endpoint
     * dropped), then shifts them. DPM++: get_sampling_sigmas spaces N from
     * 1 down to 0 (endpoint dropped) and shifts them; the scheduler's own
     * shift is 1 (identity). Both append a final σ = 0, hold the sigmas as
     * float32 and hand the transformer σ·1000 truncated to an int64. */
    double start = s == TDIT_SOLVER_UNIPC ? (double)(float)(1.0 - 1.0 / 1000.0) : 1.0;
    for (int i = 0; i < steps; i++) {
        double v = tdit_shift_sigma(shift, linspace_at(start, 0.0, steps, i));
        ts[i] = trunc(v * 1000.0);
        sig[i] = (double)(float)v;
    }
    sig[steps] = 0.0;
}

/* λ(σ) = log(1 − σ) − log σ: +inf at σ = 0, −inf at σ = 1. */
static double lambda_of(double sigma) { return log(1.0 - sigma) - log(sigma); }

/* UniPC's order at step i: 2, less at the start (one earlier data
 * prediction after one step) and on the last step (lower_order_final). */
static int unipc_order(int steps, int i) {
    int p = 2;
    if (steps - i < p) p = steps - i;
    if (i + 1 < p) p = i + 1;
    return p;
}

/* The UniPC step: corrector UniC (for i > 0, of the order the previous
 * predictor used) on the sample x_i with the data predictions
 * m_{i-2}, m_{i-1} (h2, h1) and m_i, then the predictor UniP to σ_{i+1}. */
static void unipc_coefs(int steps, const double *sg, int i, float *c) {
    if (i == 0) {
        c[KERN_MS_CX] = 1.0f;
    } else {
        int q = unipc_order(steps, i - 1);
        double st = sg[i], s0 = sg[i - 1], at = 1.0 - st;
        double h = lambda_of(st) - lambda_of(s0), hh = -h;
        double hphi1 = expm1(hh), bh = expm1(hh);
        /* b_k = h·φ_{k+1}(h)·k!/B(h) by the recurrence h_phi_k. */
        double hphik = hphi1 / hh - 1.0, fact = 1.0, b[2] = { 0, 0 };
        for (int k = 1; k <= q; k++) {
            b[k - 1] = hphik * fact / bh;
            fact *= (double)(k + 1);
            hphik = hphik / hh - 1.0 / fact;
        }
        double rho_last, rho0 = 0, rk = 1;
        if (q == 1) {
            rho_last = 0.5;
        } else {
            /* [1 1; r_k 1]·ρ = b */
            rk = (lambda_of(sg[i - 2]) - lambda_of(s0)) / h;
            rho0 = (b[0] - b[1]) / (1.0 - rk);
            rho_last = b[0] - rho0;
        }
        /* xc = σ_t/σ_s0·x_last − α_t·hφ1·m_{i−1} − α_t·B·(ρ0·(m_{i−2} − m_{i−1})/r_k + ρ_last·(m_i − m_{i−1})) */
        double ab = at * bh;
        c[KERN_MS_CXL] = (float)(st / s0);
        c[KERN_MS_CP1] = (float)(-at * hphi1 + ab * rho_last + (q == 2 ? ab * rho0 / rk : 0.0));
        c[KERN_MS_CP2] = (float)(q == 2 ? -ab * rho0 / rk : 0.0);
        c[KERN_MS_CCM] = (float)(-ab * rho_last);
    }
    int p = unipc_order(steps, i);
    double st = sg[i + 1], s0 = sg[i], at = 1.0 - st;
    double h = lambda_of(st) - lambda_of(s0), hh = -h;
    double hphi1 = expm1(hh), bh = expm1(hh);
    /* x_{i+1} = σ_t/σ_s0·xc − α_t·hφ1·m_i − α_t·B·½·(m_{i−1} − m_i)/r_1 */
    c[KERN_MS_DXC] = (float)(st / s0);
    double dm = -at * hphi1, dp1 = 0.0;
    if (p == 2) {
        double r1 = (lambda_of(sg[i - 1]) - lambda_of(s0)) / h;
        dm += at * bh * 0.5 / r1;
        dp1 = -at * bh * 0.5 / r1;
    }
    c[KERN_MS_DM] = (float)dm;
    c[KERN_MS_DP1] = (float)dp1;
}

/* DPM-Solver++: first order on the first step and on the last (final σ 0),
 * second order (multistep, midpoint) between. No corrector. */
static void dpmpp_coefs(int steps, const double *sg, int i, float *c) {
    c[KERN_MS_CX] = 1.0f;
    double st = sg[i + 1], s0 = sg[i], at = 1.0 - st;
    double h = lambda_of(st) - lambda_of(s0);
    double e = at * (exp(-h) - 1.0);
    double dm = -e, dp1 = 0.0;
    if (i > 0 && i < steps - 1) {
        /* D1 = (m_i − m_{i−1})/r0, r0 = h_0/h; x −= ½·e·D1. At i = 1 from
         * σ_0 = 1, h_0 is infinite and D1 vanishes, as in the scheduler. */
        double r0 = (lambda_of(s0) - lambda_of(sg[i - 1])) / h;
        double k = 0.5 * e * (1.0 / r0);
        dm -= k;
        dp1 = k;
    }
    c[KERN_MS_DXC] = (float)(st / s0);
    c[KERN_MS_DM] = (float)dm;
    c[KERN_MS_DP1] = (float)dp1;
}

void tdit_solver_coefs(tdit_solver_t s, int steps, const double *sg, const double *ts, int i, float coef[16]) {
    memset(coef, 0, KERN_MS_COEFS * sizeof *coef);
    coef[KERN_MS_CM] = (float)-sg[i];
    coef[KERN_MS_T] = (float)ts[i];
    if (s == TDIT_SOLVER_UNIPC) unipc_coefs(steps, sg, i, coef);
    else if (s == TDIT_SOLVER_DPMPP) dpmpp_coefs(steps, sg, i, coef);
}
