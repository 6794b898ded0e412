/* ops.h -- the ops of the denoiser, validated and dispatched to the kernel
 * registered for the stream's backend and the tensors' dtype.
 *
 * Each wrapper checks dtype, shape, contiguity and device of its tensors and
 * returns -1 with a message naming the op and the offending tensor; on
 * success the op is launched on s (recorded when s is capturing). All
 * tensors are contiguous and live on the stream's device. Per-step scalars
 * (sigma, g) are F32 tensors in device memory, read when the kernel runs. */
#ifndef REEL_KERNELS_OPS_H
#define REEL_KERNELS_OPS_H

#include "backend.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[M,N] = x[M,K]·w[N,K]ᵀ + bias[N]; bias may be NULL. */
int kern_gemm(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *w,
              const kern_tensor_t *bias, kern_tensor_t *y);
/* Over the last dim of x [.., D]; weight/bias [D] or NULL (no affine). */
int kern_layernorm(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *weight,
                   const kern_tensor_t *bias, float eps, kern_tensor_t *y);
/* Over the last dim; weight [D] required. */
int kern_rmsnorm(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *weight,
                 float eps, kern_tensor_t *y);
/* y = x·(1 + scale) + shift; shift, scale [D]; x, y [.., D]. */
int kern_modulate(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *shift,
                  const kern_tensor_t *scale, kern_tensor_t *y);
/* x += gate·y (gate [D], or NULL for x += y). */
int kern_gated_residual(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *y,
                        const kern_tensor_t *gate);
/* y = a + b, same element count. */
int kern_add(kern_stream_t *s, const kern_tensor_t *a, const kern_tensor_t *b, kern_tensor_t *y);
int kern_gelu_tanh(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y);
int kern_silu(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y);
/* q [Nq, H·d], k, v [Nk, H·d] -> o [Nq, H·d], scale 1/√d. The CUDA kernel
 * takes head widths up to 256 (it says so when asked for more). */
int kern_attention(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                   const kern_tensor_t *v, int64_t heads, kern_tensor_t *o);
/* In place on x [F·Hp·Wp, H·d]. */
int kern_rope3d(kern_stream_t *s, kern_tensor_t *x, int64_t heads, int64_t frames,
                int64_t rows, int64_t cols);
/* latent [C,F,H,W] -> tokens [F·H/2·W/2, 4C]. */
int kern_patchify(kern_stream_t *s, const kern_tensor_t *latent, kern_tensor_t *tokens);
/* tokens [N, 4C] -> latent [C,F,H,W]. */
int kern_unpatchify(kern_stream_t *s, const kern_tensor_t *tokens, kern_tensor_t *latent);
/* emb [dim] (or [1, dim]) = sinusoid(1000·sigma[0]); sigma F32 with ≥1 element. */
int kern_timestep_embed(kern_stream_t *s, const kern_tensor_t *sigma, kern_tensor_t *emb);
/* v = vu + g·(vc − vu); g F32 [1]. */
int kern_cfg_combine(kern_stream_t *s, const kern_tensor_t *vc, const kern_tensor_t *vu,
                     const kern_tensor_t *g, kern_tensor_t *v);
/* x += (sigmas[1] − sigmas[0])·v; sigmas F32 [≥2]. */
int kern_euler_update(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                      const kern_tensor_t *sigmas);
/* Flow-GRPO SDE step; sigmas F32 [3] = {σ_i, σ_{i+1}, σ_1}. Not capturable. */
int kern_sde_update(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                    const kern_tensor_t *sigmas, float eta, uint64_t seed, uint32_t step);

#ifdef __cplusplus
}
#endif
#endif
