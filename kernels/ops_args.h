/* ops_args.h -- the argument block of every op, shared by the validating
 * wrappers (ops.c), the CPU kernels (cpu/) and the CUDA kernels (cuda/).
 *
 * Blocks hold resolved pointers (data + offset) and sizes only, so a recorded
 * launch is self-contained. All tensors of one op share its dtype, except
 * the per-step scalars (σ, guidance), which are always F32 in device memory:
 * a kernel reads them at run time, never a value baked at capture.
 * Every tensor is contiguous row-major.
 *
 * Row groups (ABI 3): a mixed batch (B requests in one step, issue 29)
 * stacks its samples' token rows, and some ops take every sample in one
 * launch. Where a block has `group` (rows per group, dividing rows; 0: one
 * group of all rows), row r belongs to group g = r / group, and a
 * per-row-group parameter p with stride p_stride (elements; 0: shared by
 * every group) is read at p + g·p_stride. A group's rows get exactly the
 * bits a launch over those rows alone with p + g·p_stride would give, on
 * every backend; every kernel of the op (built in or an artifact) honours
 * the fields. */
#ifndef REEL_KERNELS_OPS_ARGS_H
#define REEL_KERNELS_OPS_ARGS_H

#include <stdint.h>
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[M,N] = x[M,K] · w[N,K]ᵀ + bias[N]; bias may be NULL; y aliases neither
 * x nor w (BLAS forbids it). group: 0, or rows per group of a grouped GEMM
 * (kern_gemm_grouped; divides M): each group a GEMM of its own rows. The
 * CPU kernel computes every group exactly as a GEMM of its rows alone
 * (cpu/cpu_gemm_tiles.h); CUDA's is one strided-batched cuBLASLt matmul
 * over the groups, whose bits cuBLAS does not promise to be each group's
 * alone (model/gemm_merge.c asks, per shape, on the device). */
typedef struct {
    kern_args_hdr_t hdr;
    const void *x, *w, *bias;
    void *y;
    int64_t M, N, K;
    int64_t group;
} kern_gemm_args_t;

/* Row-wise over [rows, dim]. LAYERNORM: (x − mean)/√(var + eps), then
 * ·weight + bias when weight != NULL (bias may be NULL with a weight).
 * RMSNORM: x/√(mean(x²) + eps) · weight (weight required). y may equal x. */
typedef struct {
    kern_args_hdr_t hdr;
    const void *x, *weight, *bias;
    void *y;
    int64_t rows, dim;
    float eps;
} kern_norm_args_t;

/* y[r,i] = x[r,i]·(1 + scale[i]) + shift[i]; y may equal x. (No row
 * groups: the step runs MODULATE nowhere.) */
typedef struct {
    kern_args_hdr_t hdr;
    const void *x, *shift, *scale;
    void *y;
    int64_t rows, dim;
} kern_modulate_args_t;

/* x[r,i] += gate[i]·y[r,i], or x += y when gate is NULL; gate per row
 * group (see the top). */
typedef struct {
    kern_args_hdr_t hdr;
    void *x;
    const void *y, *gate;
    int64_t rows, dim;
    int64_t group, gate_stride;
} kern_residual_args_t;

/* ADD: y[i] = a[i % a_period] + b[i] over n elements (a_period 0: n, a
 * has n elements; else it divides n: a repeats, a batch's shared
 * parameters added to each sample's row); y may alias a or b. MUL: y =
 * a·b, a_period always 0. */
typedef struct {
    kern_args_hdr_t hdr;
    const void *a, *b;
    void *y;
    int64_t n;
    int64_t a_period;
} kern_binary_args_t;

/* GELU_TANH, SILU: y = f(x) over n elements (y may equal x). */
typedef struct {
    kern_args_hdr_t hdr;
    const void *x;
    void *y;
    int64_t n;
} kern_unary_args_t;

/* o[i, h·d:(h+1)·d] = softmax_j(q_i,h · k_j,hᵀ · scale) · v_j,h for each head
 * h. q, o: [nq, heads·head_dim]; k, v: [nk, heads·head_dim]. o must not
 * alias q, k or v. batch (0 or 1: one): that many independent attentions
 * stacked, sample b's q and o rows at b·nq, its k and v rows at b·nk, or
 * the same k and v for every sample when kv_shared; sample b gets exactly
 * the bits of a call over its rows alone. ATTENTION only (ATTENTION_SDPA's
 * and the decomposition's callers pass one sample at a time). */
typedef struct {
    kern_args_hdr_t hdr;
    const void *q, *k, *v;
    void *o;
    int64_t nq, nk, heads, head_dim;
    float scale;
    int64_t batch;
    bool kv_shared;
} kern_attention_args_t;

/* GEMM_BATCHED, for b < batch, row-major:
 *   c_b = alpha · a_b · b_bᵀ  (trans_b: b_b is [n, k])
 *   c_b = alpha · a_b · b_b   (else:    b_b is [k, n])
 * where a_b = a + b·stride_a is [m, k] with row stride lda, b_b likewise
 * (ldb, stride_b), c_b is [m, n] (ldc, stride_c); strides and leading dims
 * count elements. a and b have the op's dtype; c is F32 when c_f32, else
 * the op's dtype. Products accumulate in F32 and c is rounded once; c
 * aliases neither a nor b. Needs m, n, k, batch >= 1 (k = 0 is refused),
 * each leading dim at least its row's width, all within int. The decomposed
 * attention's two GEMMs (kernels/attention.c). */
typedef struct {
    kern_args_hdr_t hdr;
    const void *a, *b;
    void *c;
    int64_t batch, m, n, k;
    int64_t lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c;
    float alpha;
    bool trans_b, c_f32;
} kern_gemm_batched_args_t;

/* SOFTMAX, fused scale + row softmax over rows × n: with x_j = scale·s[r,j]
 * (F32, row stride lds) and m = max_j x_j,
 *   p[r, j] = e^(x_j − m) / Σ_j' e^(x_j' − m),
 * computed in F32 (CPU: the sum in double), rounded once to the op's dtype
 * (row stride ldp). p may equal s (F32, ldp = lds): each element is read
 * before it is written, by the same thread. n >= 1. */
typedef struct {
    kern_args_hdr_t hdr;
    const float *s;
    void *p;
    int64_t rows, n, lds, ldp;
    float scale;
} kern_softmax_args_t;

/* In place on x [frames·rows·cols, heads·head_dim], tokens in (f, h, w)
 * order; see TINYDIT.md "3-D RoPE" for the split of head_dim. */
typedef struct {
    kern_args_hdr_t hdr;
    void *x;
    int64_t heads, head_dim, frames, rows, cols;
} kern_rope3d_args_t;

/* GEMM_GELU takes kern_gemm_args_t: y = GELU_tanh(x·wᵀ + bias), bias may
 * be NULL. The CPU kernel is the GEMM kernel followed by the GELU_TANH
 * kernel's arithmetic over y, so it is bit for bit GEMM then GELU_TANH. */

/* LAYERNORM_MODULATE over [rows, dim]: y = LN(x)·(1 + scale) + shift, LN
 * without affine, scale and shift [dim]. y may equal x. The CPU kernel
 * rounds LN(x) to float before modulating, exactly as LAYERNORM then
 * MODULATE do. shift and scale per row group (the top). */
typedef struct {
    kern_args_hdr_t hdr;
    const void *x, *shift, *scale;
    void *y;
    int64_t rows, dim;
    float eps;
    int64_t group, shift_stride, scale_stride;
} kern_norm_modulate_args_t;

/* RESIDUAL_NORM over [rows, dim]: x += gate·y (x += y when gate is NULL),
 * then out = LN(x)·(1 + p1) + p0 when modulate (p0 the shift, p1 the
 * scale, both required), else LN(x)·p0 + p1 (p0 the weight, p1 the bias;
 * either may be NULL, p1 only with p0). GATED_RESIDUAL then
 * LAYERNORM_MODULATE or LAYERNORM in one pass over each row, bit for bit
 * the pair on every backend: the residual's sum is stored in x and LN reads
 * it as stored. out must not alias x or y. */
typedef struct {
    kern_args_hdr_t hdr;
    void *x;
    const void *y, *gate, *p0, *p1;
    void *out;
    int64_t rows, dim;
    float eps;
    bool modulate;
    int64_t group, gate_stride, p0_stride, p1_stride; /* row groups (the top) */
} kern_residual_norm_args_t;

/* RMSNORM_ROPE3D in place on x [frames·rows·cols, heads·head_dim]: each
 * row becomes x/√(mean(x²) + eps)·weight (the mean over the whole row, all
 * heads: TINYDIT.md), then every head of it turns by the 3-D RoPE of the
 * row's token. The CPU kernel rounds the normalised value to float before
 * rotating it, exactly as RMSNORM then ROPE3D do, and its scratch is the
 * ROPE3D kernel's (the same cos/sin table, the same size). batch (0 or 1:
 * one): x holds that many samples' tokens, batch·frames·rows·cols rows,
 * token t of a sample at row b·frames·rows·cols + t, turned by t's
 * RoPE. */
typedef struct {
    kern_args_hdr_t hdr;
    void *x;
    const void *weight;
    int64_t heads, head_dim, frames, rows, cols;
    float eps;
    int64_t batch;
} kern_rmsnorm_rope_args_t;

/* PATCHIFY: latent src [C,F,H,W] -> tokens dst [F·H/2·W/2, 4C], token
 * vector in (c, ph, pw) order. UNPATCHIFY: tokens src [N, 4C] in
 * (ph, pw, c) order -> latent dst [C,F,H,W]. Patch (1,2,2); H, W even. */
typedef struct {
    kern_args_hdr_t hdr;
    const void *src;
    void *dst;
    int64_t C, F, H, W;
    int64_t batch; /* 0 or 1: one; else src and dst hold that many samples, one after another */
} kern_patch_args_t;

/* emb[0..dim) = [cos(t·ω_j), sin(t·ω_j)], j < dim/2, ω_j = 10000^(−j/(dim/2)),
 * t = t_scale·sigma[0]; computed in double, rounded once. */
typedef struct {
    kern_args_hdr_t hdr;
    const float *sigma;
    void *emb;
    int64_t dim;
    float t_scale;
    int64_t rows, sigma_stride; /* rows (0 or 1: one) of emb, row r's t from sigma[r·sigma_stride] */
} kern_timestep_args_t;

/* v = vu + g[0]·(vc − vu) over n elements; with group (elements per
 * sample, dividing n), element i uses g[i / group]: each sample its own
 * guidance. */
typedef struct {
    kern_args_hdr_t hdr;
    const void *vc, *vu;
    const float *g;
    void *v;
    int64_t n;
    int64_t group;
} kern_cfg_args_t;

/* x += (sigmas[1] − sigmas[0])·v over n elements; with group (elements
 * per sample, dividing n), element i reads the sigmas at
 * sigmas + (i / group)·sigma_stride: each sample its own σ. */
typedef struct {
    kern_args_hdr_t hdr;
    void *x;
    const void *v;
    const float *sigmas;
    int64_t n;
    int64_t group, sigma_stride;
} kern_euler_args_t;

/* The coefficients of one multistep solver step (UniPC, DPM++), F32
 * [KERN_MS_COEFS] in device memory, indexed by KERN_MS_*; written by the
 * caller before each step, read by the kernel when it runs (capturable).
 * KERN_MS_T is the timestep the transformer sees (kern_timestep_embed_at). */
enum {
    KERN_MS_CM,   /* m = x + c_m·v: the data prediction x0 = x − σ_i·v */
    KERN_MS_CX, KERN_MS_CXL, KERN_MS_CP1, KERN_MS_CP2, KERN_MS_CCM, /* the corrector's xc */
    KERN_MS_DXC, KERN_MS_DM, KERN_MS_DP1, KERN_MS_DP2,              /* the predictor's x_{i+1} */
    KERN_MS_T = 15,
    KERN_MS_COEFS = 16
};
/* A multistep solver's update over n elements, every coefficient read from
 * device memory when it runs (KERN_MS_* index coef): with m = x + c_m·v,
 * xc = c_x·x + c_xl·h0 + c_p1·h1 + c_p2·h2 + c_cm·m (the corrector),
 * x ← d_xc·xc + d_m·m + d_p1·h1 + d_p2·h2 (the predictor), then
 * h0 ← xc, h2 ← h1, h1 ← m. h holds 3·n elements (h0, h1, h2). */
typedef struct {
    kern_args_hdr_t hdr;
    void *x;
    const void *v;
    void *h;
    const float *coef;
    int64_t n;
} kern_multistep_args_t;

/* Flow-GRPO SDE step (TINYDIT.md) over n elements. sigmas = {σ_i, σ_{i+1},
 * σ_1}; noise ε for element j is kern_philox_normal(seed, step, j). SDE
 * takes eta, step and seed from the fields (baked into a launch: not
 * capturable); SDE_DEV reads them from `params` in device memory when the
 * kernel runs (capturable: one graph serves every seed and step), laid out
 * by kern_sde_params_pack. */
typedef struct {
    kern_args_hdr_t hdr;
    void *x;
    const void *v;
    const float *sigmas;
    const float *params;     /* SDE_DEV: F32[4], see kern_sde_params_pack; NULL for SDE */
    void *mean;              /* SDE_DEV: where μ (x_{i+1} before the noise) goes; may be NULL */
    float eta;
    uint32_t step;
    uint64_t seed;
    int64_t n;
    int grid;                /* 0: std = η·√(σ_i/(1 − σ')) (Flow-GRPO's SD3 step); 1: std = η·σ_1·σ_i
                              * (its Wan step: σ_min + (σ_max − σ_min)·σ_i with σ_max = σ_1, σ_min = 0) */
} kern_sde_args_t;

/* ATTENTION_BIAS (T5's attention), for each head h and query i:
 *   o[i, h·d:(h+1)·d] = Σ_{j<nk_valid} softmax_j(scale·q_i,h·k_j,hᵀ + b_h(j − i))·v_j,h
 * with b_h(r) = rel[h·(nq + nk − 1) + r + nq − 1] (r = j − i runs from
 * −(nq − 1) to nk − 1), or 0 when rel is NULL. Keys j >= nk_valid are
 * masked out (weight exactly 0); 1 <= nk_valid <= nk. q, o [nq, heads·
 * head_dim], k, v [nk, heads·head_dim] in the op's dtype; rel is F32 in
 * device memory. o aliases none of the inputs. */
typedef struct {
    kern_args_hdr_t hdr;
    const void *q, *k, *v;
    const float *rel;
    void *o;
    int64_t nq, nk, nk_valid, heads, head_dim;
    float scale;
} kern_attention_bias_args_t;

/* MUL takes kern_binary_args_t: y = a·b over n elements (y may alias a or b). */

#ifdef __cplusplus
}
#endif
#endif
