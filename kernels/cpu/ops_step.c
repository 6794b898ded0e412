/* ops_step.c -- the per-step ops that read σ or the guidance scale from
 * memory when they run: timestep embedding, CFG combine, Euler and the
 * Flow-GRPO SDE update, on the CPU.
 *
 * Reading the scalars at run time (never at launch) is what lets one
 * captured step replay for every σ of a schedule. The SDE update comes
 * twice: SDE with eta, seed and step in its launch (not capturable: a graph
 * would bake them) and SDE_DEV reading them from device memory at run time
 * (capturable: the counter-based noise needs nothing else). */
#include "../ops_args.h"
#include "../philox.h"
#include "cpu_arith.h"
#include <math.h>
#include <string.h>

/* emb = [cos(t·ω_j), sin(t·ω_j)], t = t_scale·σ, all in double, rounded once.
 * Cannot fail. */
static int timestep_embed_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_timestep_args_t *a = args;
    int64_t h = a->dim / 2;
    const double *om = cpu_freq_cached(h); /* NULL: computed here */
    for (int64_t r = 0; r < (a->rows > 1 ? a->rows : 1); r++) { /* row r: its own σ */
        float *emb = (float *)a->emb + r * a->dim;
        double t = (double)a->t_scale * (double)a->sigma[r * a->sigma_stride];
        for (int64_t j = 0; j < h; j++) {
            double th = t * (om ? om[j] : cpu_freq(j, h));
            emb[j] = (float)cos(th);
            emb[h + j] = (float)sin(th);
        }
    }
    return 0;
}

/* v = vu + g·(vc − vu) in float; v may alias vc or vu. Cannot fail. */
static int cfg_combine_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_cfg_args_t *a = args;
    const float *vc = a->vc, *vu = a->vu;
    float *v = a->v;
    const int64_t per = a->group > 0 ? a->group : a->n; /* a sample's elements */
    for (int64_t i0 = 0; i0 < a->n; i0 += per) {
        const float g = a->g[i0 / per];
        for (int64_t i = i0; i < i0 + per; i++) v[i] = vu[i] + g * (vc[i] - vu[i]);
    }
    return 0;
}

/* x += (σ₁ − σ₀)·v, the difference taken once in float. Cannot fail. */
static int euler_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_euler_args_t *a = args;
    float *x = a->x;
    const float *v = a->v;
    const int64_t per = a->group > 0 ? a->group : a->n; /* a sample's elements */
    for (int64_t i0 = 0; i0 < a->n; i0 += per) {
        const float *sg = a->sigmas + i0 / per * a->sigma_stride;
        const float delta = sg[1] - sg[0];
        for (int64_t i = i0; i < i0 + per; i++) x[i] += delta * v[i];
    }
    return 0;
}

/* One multistep solver step (kern_multistep_args_t), per element in
 * double: element-wise, so x and h are updated in place. Cannot fail. */
static int multistep_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_multistep_args_t *a = args;
    float *x = a->x, *h0 = a->h, *h1 = h0 + a->n, *h2 = h1 + a->n;
    const float *v = a->v, *c = a->coef;
    for (int64_t i = 0; i < a->n; i++) {
        double xi = x[i], p1 = h1[i], p2 = h2[i];
        double m = (double)(float)(xi + (double)c[KERN_MS_CM] * (double)v[i]);
        double xc = (double)(float)((double)c[KERN_MS_CX] * xi + (double)c[KERN_MS_CXL] * (double)h0[i] +
                                    (double)c[KERN_MS_CP1] * p1 + (double)c[KERN_MS_CP2] * p2 +
                                    (double)c[KERN_MS_CCM] * m);
        x[i] = (float)((double)c[KERN_MS_DXC] * xc + (double)c[KERN_MS_DM] * m + (double)c[KERN_MS_DP1] * p1 +
                       (double)c[KERN_MS_DP2] * p2);
        h0[i] = (float)xc;
        h2[i] = (float)p1;
        h1[i] = (float)m;
    }
    return 0;
}

/* x ← x + (v + std²/(2σ_i)·(x + (1 − σ_i)·v))·Δ + std·√(−Δ)·ε per element,
 * in double, with std = η·√(σ_i/(1 − σ')), σ' = σ_1 when σ_i = 1, else σ_i
 * (on a solver's grid, a->grid: std = η·σ_1·σ_i, Flow-GRPO's Wan step).
 * The drift correction std²/(2σ_i) is taken as 0 when std is 0 (η = 0), so
 * σ_i = 0 with η = 0 degrades to Euler instead of 0/0. A schedule with
 * σ' = 1 or Δ > 0 is outside the method and yields inf/NaN, as the formula
 * does. Cannot fail. */
static void sde_apply(const kern_sde_args_t *a, float eta, uint64_t seed, uint32_t step) {
    float *x = a->x;
    const float *v = a->v;
    double si = a->sigmas[0], sn = a->sigmas[1], s1 = a->sigmas[2];
    double delta = sn - si;
    double sp = si == 1.0 ? s1 : si;
    double std = a->grid ? (double)eta * s1 * si : (double)eta * sqrt(si / (1.0 - sp));
    double drift = std == 0.0 ? 0.0 : std * std / (2.0 * si);
    double noise = std * sqrt(-delta);
    float *mean = a->mean;
    for (int64_t j = 0; j < a->n; j++) {
        double xj = x[j], vj = v[j];
        double eps = kern_philox_normal(seed, step, (uint64_t)j);
        double mu = xj + (vj + drift * (xj + (1.0 - si) * vj)) * delta;
        x[j] = (float)(mu + noise * eps);
        if (mean) mean[j] = (float)mu;
    }
}

static int sde_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_sde_args_t *a = args;
    sde_apply(a, a->eta, a->seed, a->step);
    return 0;
}

/* eta, seed and step read from device memory now, not from the launch. */
static int sde_dev_f32(void *ctx, const void *args) {
    (void)ctx;
    const kern_sde_args_t *a = args;
    uint32_t bits[3];
    memcpy(bits, &a->params[1], sizeof bits);
    sde_apply(a, a->params[0], (uint64_t)bits[0] | (uint64_t)bits[1] << 32, bits[2]);
    return 0;
}

/* This file's kernels, in registration order; none can fail to be
 * listed (a full registry table is the registry's to report). */
static const kern_impl_t kernels[] = {
    { .op = KERN_OP_TIMESTEP_EMBED, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "timestep_embed_cpu", .fn = timestep_embed_f32,
      .args_size = sizeof(kern_timestep_args_t), .capturable = true },
    { .op = KERN_OP_CFG_COMBINE, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "cfg_combine_cpu", .fn = cfg_combine_f32,
      .args_size = sizeof(kern_cfg_args_t), .capturable = true },
    { .op = KERN_OP_EULER, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "euler_cpu", .fn = euler_f32,
      .args_size = sizeof(kern_euler_args_t), .capturable = true },
    { .op = KERN_OP_MULTISTEP, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "multistep_cpu", .fn = multistep_f32,
      .args_size = sizeof(kern_multistep_args_t), .capturable = true },
    { .op = KERN_OP_SDE, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "sde_cpu", .fn = sde_f32,
      .args_size = sizeof(kern_sde_args_t), .capturable = false },
    { .op = KERN_OP_SDE_DEV, .backend = KERN_BACKEND_CPU, .dtype = KERN_F32,
      .name = "sde_dev_cpu", .fn = sde_dev_f32,
      .args_size = sizeof(kern_sde_args_t), .capturable = true },
};

size_t kern_cpu_step_kernels(const kern_impl_t **out) {
    *out = kernels;
    return sizeof kernels / sizeof kernels[0];
}
