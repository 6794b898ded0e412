/* sde.cu -- SDE: one Flow-GRPO stochastic step over n elements (TINYDIT.md
 * "Guidance and schedule"), in double like the CPU, rounded once to T:
 *   Δ = σ₁ − σ₀, σ' = σ₀ (σ_1 = sigmas[2] when σ₀ = 1),
 *   std = η·√(σ₀ / (1 − σ')),
 *   x += (v + std²/(2σ₀)·(x + (1 − σ₀)·v))·Δ + std·√(−Δ)·ε,
 * ε = kern_philox_normal(seed, step, i) for element i, so the draw depends
 * on (seed, step, index) only. SDE is not capturable (seed and step are
 * baked into the launch; the registry refuses it while a stream captures);
 * SDE_DEV passes `params` and the kernel reads eta, seed and step there when
 * it runs, so a graph replays it for any of them. */
#include "cuda_device.cuh"
#include "../philox.h"

template <typename T>
__global__ void sde_kernel(T *x, const T *v, const float *sigmas, const float *params, T *mean, double eta,
                           uint32_t step, uint64_t seed, int64_t n, int grid) {
    if (params) { /* SDE_DEV: the values of this launch live in device memory */
        eta = (double)params[0];
        seed = (uint64_t)__float_as_uint(params[1]) | (uint64_t)__float_as_uint(params[2]) << 32;
        step = __float_as_uint(params[3]);
    }
    const double s0 = sigmas[0], s1 = sigmas[1], sfirst = sigmas[2];
    const double delta = s1 - s0;
    const double sp = s0 == 1.0 ? sfirst : s0;
    /* on a solver's grid: Flow-GRPO's Wan step, std = η·σ_1·σ₀ */
    const double sd = grid ? eta * sfirst * s0 : eta * sqrt(s0 / (1.0 - sp));
    /* As on the CPU: no drift correction when std is 0 (η = 0), so σ₀ = 0
     * with η = 0 is the Euler step rather than 0/0. */
    const double drift = sd == 0.0 ? 0.0 : sd * sd / (2.0 * s0);
    const double diffusion = sd * sqrt(-delta);
    KC_FOR(i, n) {
        double xi = kc_f32(x[i]), vi = kc_f32(v[i]);
        double eps = kern_philox_normal(seed, step, (uint64_t)i);
        double mu = xi + (vi + drift * (xi + (1.0 - s0) * vi)) * delta;
        x[i] = kc_store_f64<T>(mu + diffusion * eps);
        if (mean) mean[i] = kc_store_f64<T>(mu);
    }
}

template <typename T>
static int sde_launch(void *ctx, const void *args) {
    const kern_cuda_ctx_t *c = (const kern_cuda_ctx_t *)ctx;
    const kern_sde_args_t *a = (const kern_sde_args_t *)args;
    if (a->n <= 0) return 0;
    sde_kernel<T><<<kc_blocks(a->n, KC_THREADS), KC_THREADS, 0, c->stream>>>(
        (T *)a->x, (const T *)a->v, a->sigmas, a->params, (T *)a->mean, (double)a->eta, a->step, a->seed, a->n,
        a->grid);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_sde_f32(void *ctx, const void *args) {
    return sde_launch<float>(ctx, args);
}

extern "C" int kern_cuda_sde_bf16(void *ctx, const void *args) {
    return sde_launch<__nv_bfloat16>(ctx, args);
}

/* SDE_DEV: the same kernel, args.params set (capturable). */
extern "C" int kern_cuda_sde_dev_f32(void *ctx, const void *args) {
    return sde_launch<float>(ctx, args);
}

extern "C" int kern_cuda_sde_dev_bf16(void *ctx, const void *args) {
    return sde_launch<__nv_bfloat16>(ctx, args);
}
