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
#include "base/tensor.h"

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
/* Row groups (ops_args.h): where a parameter below is "per row group" it
 * is [D], shared by every row, or a 2-D view [G, D] (unit column stride,
 * any row stride: say each sample's row of a batch's modulation), and then
 * x's rows are G equal groups, group g using the view's row g: bit for bit
 * the op over each group's rows alone with that row as its [D]. One launch
 * for the whole batch: what a mixed batch's step uses (model/step.c). */

/* x += gate·y (gate per row group, or NULL for x += y). */
int kern_gated_residual(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *y,
                        const kern_tensor_t *gate);
/* y = a + b, same element count. */
int kern_add(kern_stream_t *s, const kern_tensor_t *a, const kern_tensor_t *b, kern_tensor_t *y);
/* y[i] = a[i mod numel(a)] + b[i]: a repeated over b, whose element count
 * is a multiple of a's (a batch's shared parameters added to each sample's
 * row); the same sums as kern_add over each repeat. y must not overlap a
 * when a repeats. */
int kern_add_repeat(kern_stream_t *s, const kern_tensor_t *a, const kern_tensor_t *b, kern_tensor_t *y);
int kern_gelu_tanh(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y);
int kern_silu(kern_stream_t *s, const kern_tensor_t *x, kern_tensor_t *y);
/* q [Nq, H·d], k, v [Nk, H·d] -> o [Nq, H·d], scale 1/√d, by the path
 * kern_attention_choose takes (see below). Its scratch (the
 * kern_attention_scratch_bytes of its sizes) comes from the scratch bound
 * to s, else from s's arena. */
int kern_attention(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                   const kern_tensor_t *v, int64_t heads, kern_tensor_t *o);
/* batch independent attentions: q, o [batch·Nq, H·d], sample b's rows at
 * b·Nq; k, v [batch·Nk, H·d] (sample b's at b·Nk) or, kv_shared, [Nk, H·d]
 * for every sample (a group's shared text). Sample b's o is bitwise
 * kern_attention over its rows alone. Where the path is FUSED, one launch
 * for the batch; SDPA and the decomposition run sample by sample. */
int kern_attention_batch(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                         const kern_tensor_t *v, int64_t heads, kern_tensor_t *o, int64_t batch, bool kv_shared);

/* Attention runs one of two ways:
 * - FUSED: the backend's one-launch kernel (CUDA: online softmax in
 *   registers, F32 SIMT, no scratch, head widths up to 256; CPU,
 *   cpu/cpu_attn.h: direct up to 64 keys and head width, whole rows of
 *   scores below 2^20 scores per head, flash-style beyond, at any width).
 * - DECOMPOSED: the same on every backend, written once at the op level
 *   (kernels/attention.c) over two backend primitives. Heads are batched
 *   and queries taken in blocks sized so one block's scores fit a memory
 *   bound; per block: S = Q·Kᵀ by one strided-batched GEMM (F32
 *   accumulation, S stored F32), P = softmax(scale·S) by one fused row
 *   kernel (P in the op's dtype; in place for F32), O = P·V by a second
 *   batched GEMM written straight into o's head slices. On CUDA the GEMMs
 *   are cuBLAS strided-batched (tensor cores for BF16).
 * Both are capturable and deterministic: the plan depends only on the
 * sizes, the dtype, the backend kind and the bound, never on timing.
 *
 * A third path runs only when asked for by name (opts->path): SDPA, a
 * library's fused flash attention, one launch, no scratch of ours. On CUDA
 * that is cuDNN's SDPA_FWD operation (backend graph API, cuDNN >= 9.13),
 * BF16 only, present when Reel was built with cuDNN (HAVE_CUDNN: the
 * Makefile finds cudnn.h); on the CPU it is the FUSED kernel, the reference
 * it is checked against. kern_attention_pick never returns it; AUTO takes
 * it on CUDA in BF16 wherever cuDNN loads (kern_attention_choose below;
 * REEL_ATTN=decomposed turns it off). tests/test_cuda.c compares it with
 * the cuBLAS decomposition on a device (it has not yet run on one: the
 * first GPU session's deploy/gpu-check.sh says whether it holds). */
typedef enum {
    KERN_ATTN_AUTO = 0,   /* kern_attention_pick decides */
    KERN_ATTN_FUSED,
    KERN_ATTN_DECOMPOSED,
    KERN_ATTN_SDPA,       /* by name only: cuDNN's fused SDPA on CUDA (see above) */
} kern_attn_path_t;

/* The pick rule (CUDA's, and every backend's in decomposed mode; on the
 * CPU in F32, AUTO takes the CPU's own kernel at every size:
 * kern_attention_choose): DECOMPOSED when one head's score matrix holds at least
 * KERN_ATTN_DECOMPOSE_MIN_SCORES scores (nq·nk >= 2^20, i.e. 4 MiB of F32)
 * or the head is wider than KERN_ATTN_FUSED_MAX_HEAD_DIM (the CUDA fused
 * kernel's limit); FUSED otherwise. Small attentions stay one launch with
 * little or no scratch; long ones go to GEMMs (tensor cores on CUDA, where
 * the fused kernel's F32 SIMT math would dominate the step). Can't fail. */
#define KERN_ATTN_DECOMPOSE_MIN_SCORES ((int64_t)1 << 20)
#define KERN_ATTN_FUSED_MAX_HEAD_DIM 256
kern_attn_path_t kern_attention_pick(int64_t nq, int64_t nk, int64_t head_dim);

/* Which attention AUTO runs on CUDA in BF16 (REEL_ATTN, or the worker's
 * --attention): auto and fused take cuDNN's fused SDPA wherever it is
 * ready (a CUDA backend came up, sm_80 or newer, and cuDNN loaded: the
 * backend says so through kern_attention_set_sdpa_ready) and the head fits
 * it (head_dim <= KERN_ATTN_SDPA_MAX_HEAD_DIM, a multiple of 8); anything
 * else, and decomposed, keeps kern_attention_pick's rule (the reference,
 * and the fallback). fused differs from auto only in that a fallback is
 * reported as a warning. The CPU in F32: its own kernel at every size
 * (decomposed mode: the pick rule). Every other backend and dtype: the
 * pick rule. */
typedef enum { KERN_ATTN_MODE_AUTO = 0, KERN_ATTN_MODE_FUSED, KERN_ATTN_MODE_DECOMPOSED } kern_attn_mode_t;
#define KERN_ATTN_SDPA_MAX_HEAD_DIM 128
/* "auto", "fused", "decomposed" into *out; -1 with a message otherwise. */
int kern_attention_mode_parse(const char *s, kern_attn_mode_t *out);
const char *kern_attention_mode_name(kern_attn_mode_t m);
/* The mode in force: the last kern_attention_set_mode, else $REEL_ATTN
 * (read once; an unknown value is auto, reported by
 * kern_attention_describe), else auto. */
kern_attn_mode_t kern_attention_mode(void);
void kern_attention_set_mode(kern_attn_mode_t m);
/* Forgets the mode set or read: the next kern_attention_mode reads
 * $REEL_ATTN again (for a process that changed it; tests). */
void kern_attention_mode_reload(void);
/* Whether the fused SDPA can run in this process, and if not why (copied;
 * NULL: no reason). Set by the CUDA backend when it comes up. */
void kern_attention_set_sdpa_ready(bool ready, const char *why);
/* Whether it can, and why not (copied into why[0..len)). */
bool kern_attention_sdpa_state(char *why, size_t len);
/* Whether $REEL_ATTN held a value that is not a mode. */
bool kern_attention_env_bad(void);
/* A fused SDPA that fails when it runs (cuDNN has no plan for the shape,
 * or its execution fails), where AUTO chose it or opts->fallback allows:
 * the shape (nq, nk, head_dim) is remembered as failed, the failure is
 * logged once per shape with cuDNN's own message, and the call runs the
 * decomposition instead, within KERN_ATTN_FALLBACK_BYTES of scratch (which
 * the plan of such a call reserves beside SDPA's). Every later call of
 * that shape then takes the decomposition, and kern_attention_choose says
 * why. kern_attention_sdpa_fail records one (msg copied; true the first
 * time for the shape), _failed tells whether a shape failed and copies the
 * first message, _fallbacks counts the calls that fell back, and _forget
 * clears the record (tests; a process that changed its cuDNN). */
#define KERN_ATTN_FALLBACK_BYTES ((size_t)128 << 20)
bool kern_attention_sdpa_fail(int64_t nq, int64_t nk, int64_t head_dim, const char *msg);
bool kern_attention_sdpa_failed(int64_t nq, int64_t nk, int64_t head_dim, char *why, size_t len);
uint64_t kern_attention_sdpa_fallbacks(void);
void kern_attention_sdpa_forget(void);
/* The path AUTO takes for these sizes on bk in dt, and why (a static
 * string, or the calling thread's copy of the backend's reason, valid
 * until its next call). Can't fail. */
kern_attn_path_t kern_attention_choose(kern_backend_kind_t bk, kern_dtype_t dt, int64_t nq, int64_t nk,
                                       int64_t head_dim, const char **why);
/* One line for a log or a metric label: the mode, what AUTO takes for
 * Wan's self-attention head (head_dim 128) on bk in dt, and why. */
void kern_attention_describe(kern_backend_kind_t bk, kern_dtype_t dt, char *buf, size_t len);

/* Memory bound of one block of scores (and probabilities) when the caller
 * gives none: 16 MiB on the CPU (cache-sized blocks), 512 MiB on CUDA
 * (fewer, larger GEMMs; ~227 query rows × 12 heads at Wan's 32,760 keys). */
#define KERN_ATTN_BLOCK_BYTES_CPU ((size_t)16 << 20)
#define KERN_ATTN_BLOCK_BYTES_CUDA ((size_t)512 << 20)

typedef struct {
    kern_attn_path_t path; /* AUTO: kern_attention_pick */
    size_t block_bytes;    /* DECOMPOSED memory bound; 0: the backend default */
    bool fallback;         /* SDPA: a failure runs the decomposition (AUTO's SDPA always may) */
} kern_attn_opts_t;

/* How an attention of given sizes will run. For DECOMPOSED: heads are
 * taken `heads` at a time (the last group may be smaller) and queries
 * `rows` at a time (the last block may be smaller); S holds heads·rows
 * rows of `ld` floats (ld = nk rounded up to 8), P the same rows in the
 * op's dtype after S (F32: P is S, probs_bytes 0). scratch_bytes <= the
 * bound whenever one head's row of scores fits it (else one row of one
 * head: the least the decomposition can use). For FUSED and SDPA: rows,
 * heads, ld are 0 and scratch_bytes is the kernel's workspace contract. */
typedef struct {
    kern_attn_path_t path;  /* FUSED, DECOMPOSED or SDPA, never AUTO */
    int64_t rows, heads, ld;
    int64_t blocks;         /* DECOMPOSED: ⌈H/heads⌉·⌈nq/rows⌉ blocks, 3 launches each */
    size_t scores_bytes, probs_bytes, scratch_bytes;
    bool fallback;          /* SDPA: may fall back; scratch_bytes covers the decomposition's too */
} kern_attn_plan_t;

/* Fills *plan for attention on backend bk in dtype dt (opts NULL: AUTO,
 * default bound). Returns -1 with a message on sizes < 1 (nk, heads,
 * head_dim; nq may be 0) or beyond the GEMMs' int range, or when no kernel
 * of the chosen path exists for (bk, dt). */
int kern_attention_plan(kern_backend_kind_t bk, kern_dtype_t dt, int64_t nq, int64_t nk,
                        int64_t heads, int64_t head_dim, const kern_attn_opts_t *opts,
                        kern_attn_plan_t *plan);
/* Scratch bytes kern_attention needs at these sizes (AUTO, default bound):
 * what a step workspace reserves for it. 0 when it needs none or when
 * kern_attention_plan fails (the launch then reports why). */
size_t kern_attention_scratch_bytes(kern_backend_kind_t bk, kern_dtype_t dt, int64_t nq,
                                    int64_t nk, int64_t heads, int64_t head_dim);
/* kern_attention with a forced path and/or bound (opts NULL: as
 * kern_attention). Same failures, plus those of kern_attention_plan; on a
 * failure partway through DECOMPOSED, o may be partly written. */
int kern_attention_ex(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                      const kern_tensor_t *v, int64_t heads, kern_tensor_t *o,
                      const kern_attn_opts_t *opts);
/* In place on x [F·Hp·Wp, H·d]. */
int kern_rope3d(kern_stream_t *s, kern_tensor_t *x, int64_t heads, int64_t frames,
                int64_t rows, int64_t cols);

/* Fused ops: each computes what a sequence of the ops above computes, in
 * one launch and fewer passes over memory. On the CPU each is bit for bit
 * the unfused sequence (the reference the crosscheck and every bitwise test
 * rely on); on CUDA each rounds once to the storage type and matches the
 * CPU within the F32/BF16 tolerances of tests/test_cuda.c. Same checks and
 * failures as the unfused ops.
 *
 * y[M,N] = GELU_tanh(x[M,K]·w[N,K]ᵀ + bias[N]); bias may be NULL. Equals
 * kern_gemm then kern_gelu_tanh on y. CUDA: one cublasLtMatmul with the
 * GELU_BIAS (or GELU) epilogue; kern_gemm runs the BIAS (or DEFAULT) one. */
int kern_gemm_gelu(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *w,
                   const kern_tensor_t *bias, kern_tensor_t *y);
/* A grouped GEMM (GELU-tanh after it with gelu): x's rows are groups of
 * `group` rows (a batch's samples stacked; group divides them), each
 * group's rows of y the GEMM of its rows. On the CPU one launch whose
 * tiles cut each group as the GEMM alone would (cpu/cpu_gemm_tiles.h),
 * sharing the pool: bitwise what kern_gemm (kern_gemm_gelu) gives each
 * group alone, as long as OpenBLAS's sums depend only on a call's operands
 * and shape. On CUDA one strided-batched cuBLASLt matmul (the same w and
 * bias for every group), whose bits cuBLAS does not promise equal to the
 * per-group calls'. A caller that needs each group's own bits asks first
 * (tdit_gemm_merge_ok, model/gemm_merge.c, compares both on the device).
 * Fails as kern_gemm does, and when group is < 1 or does not divide x's
 * rows. */
int kern_gemm_grouped(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *w,
                      const kern_tensor_t *bias, kern_tensor_t *y, int64_t group, bool gelu);
/* y = LN(x)·(1 + scale) + shift over the last dim, LN without affine;
 * shift, scale per row group; y may equal x. Equals kern_layernorm(x, NULL, NULL,
 * eps, y) then kern_modulate(y, shift, scale, y). */
int kern_layernorm_modulate(kern_stream_t *s, const kern_tensor_t *x, const kern_tensor_t *shift,
                            const kern_tensor_t *scale, float eps, kern_tensor_t *y);
/* In place on x [F·Hp·Wp, H·d]: RMSNorm over the whole row with weight [H·d]
 * (TINYDIT.md: q and k are normalised over the full width D), then 3-D RoPE
 * per head. Equals kern_rmsnorm(x, weight, eps, x) then kern_rope3d. Its
 * scratch is kern_rope3d's at the same sizes. x may hold B samples'
 * tokens, [B·F·Hp·Wp, H·d]: each sample's as a call over its rows alone. */
/* x += gate·y (gate NULL: x += y), then out = LN(x)·(1 + scale) + shift:
 * kern_gated_residual then kern_layernorm_modulate, bit for bit, in one
 * pass over each row. gate, shift and scale per row group. out must not
 * alias x or y. */
int kern_residual_layernorm_modulate(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *y,
                                     const kern_tensor_t *gate, const kern_tensor_t *shift,
                                     const kern_tensor_t *scale, float eps, kern_tensor_t *out);
/* x += gate·y (gate NULL: x += y), then out = LN(x)·weight + bias (weight,
 * bias optional as kern_layernorm's, [D]): kern_gated_residual then
 * kern_layernorm, bit for bit, in one pass over each row. gate per row
 * group. */
int kern_residual_layernorm(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *y,
                            const kern_tensor_t *gate, const kern_tensor_t *weight,
                            const kern_tensor_t *bias, float eps, kern_tensor_t *out);
int kern_rmsnorm_rope3d(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *weight,
                        float eps, int64_t heads, int64_t frames, int64_t rows, int64_t cols);
/* latent [C,F,H,W] -> tokens [F·H/2·W/2, 4C]; or B samples at once,
 * latent [B,C,F,H,W] -> tokens [B·F·H/2·W/2, 4C] (exact copies either way). */
int kern_patchify(kern_stream_t *s, const kern_tensor_t *latent, kern_tensor_t *tokens);
/* tokens [N, 4C] -> latent [C,F,H,W]; or [B·N, 4C] -> [B,C,F,H,W]. */
int kern_unpatchify(kern_stream_t *s, const kern_tensor_t *tokens, kern_tensor_t *latent);
/* emb [dim] (or [1, dim]) = sinusoid(1000·sigma[0]); sigma F32 with ≥1 element. */
int kern_timestep_embed(kern_stream_t *s, const kern_tensor_t *sigma, kern_tensor_t *emb);
/* emb [S, dim], row r = sinusoid(1000·sigmas[r, 0]); sigmas F32 [S, k]
 * (a mixed batch's σ rows): bitwise kern_timestep_embed row by row. */
int kern_timestep_embed_rows(kern_stream_t *s, const kern_tensor_t *sigmas, kern_tensor_t *emb);
/* v = vu + g·(vc − vu); g F32 [1]. */
int kern_cfg_combine(kern_stream_t *s, const kern_tensor_t *vc, const kern_tensor_t *vu,
                     const kern_tensor_t *g, kern_tensor_t *v);
/* The same for S samples of equal size in one launch, sample b with g[b]
 * (g F32 of S elements, dividing the count): bitwise kern_cfg_combine per
 * sample. */
int kern_cfg_combine_rows(kern_stream_t *s, const kern_tensor_t *vc, const kern_tensor_t *vu,
                          const kern_tensor_t *g, kern_tensor_t *v);
/* x += (sigmas[1] − sigmas[0])·v; sigmas F32 [≥2]. */
int kern_euler_update(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                      const kern_tensor_t *sigmas);
/* The same for S samples of equal size in one launch, sample b with row b
 * of sigmas F32 [S, k >= 2]: bitwise kern_euler_update per sample. */
int kern_euler_update_rows(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                           const kern_tensor_t *sigmas);
/* Flow-GRPO SDE step; sigmas F32 [3] = {σ_i, σ_{i+1}, σ_1}: its SD3 step,
 * std = η·√(σ_i/(1 − σ')), σ' = σ_1 at σ_i = 1, else σ_i. A row of 4
 * (σ_i, σ_{i+1}, σ_1, t_i: a solver's grid, model/tinydit.h) takes its Wan
 * step, std = η·σ_1·σ_i (σ_min + (σ_max − σ_min)·σ_i with σ_max = σ_1 and
 * the grid's last σ_min = 0; η = 1 is the trainer's). eta, seed and step are
 * launch values: not capturable. */
int kern_sde_update(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                    const kern_tensor_t *sigmas, float eta, uint64_t seed, uint32_t step);
/* The same step with eta, seed and step read from params (F32 [4] in device
 * memory, written by the caller before each launch with the values of
 * kern_sde_params_pack) when the kernel runs: capturable, so one captured
 * step replays for every seed, step and eta. Bitwise equal to
 * kern_sde_update with the same values. */
int kern_sde_update_dev(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                        const kern_tensor_t *sigmas, const kern_tensor_t *params);
/* As kern_sde_update_dev, also writing the step's mean μ (the update before
 * its noise: x_{i+1} = μ + std·√(−Δ)·ε) into mean, shaped and typed like x:
 * what a Flow-GRPO trainer's log-probabilities need. */
int kern_sde_update_dev_mean(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v,
                             const kern_tensor_t *sigmas, const kern_tensor_t *params, kern_tensor_t *mean);
/* params[0] = eta; params[1], params[2] = the low and high 32 bits of seed
 * and params[3] = step, each stored as the bit pattern of a float (read
 * back bit for bit; never used as numbers). Can't fail. */
void kern_sde_params_pack(float params[4], float eta, uint64_t seed, uint32_t step);

/* KERN_MS_* (kernels/ops_args.h) index a multistep step's coefficients. */
/* x ← predictor(corrector(x, history), m), history shifted: see
 * kern_multistep_args_t. x, v: one dtype, n elements each; h: 3·n of it
 * (h0 the last corrected sample, h1 and h2 the last two data
 * predictions); coef F32 [KERN_MS_COEFS]. Arithmetic in double; m and
 * the corrected sample are rounded to the dtype before they are used (the
 * values the history keeps), x_{i+1} once when stored. -1 with a message
 * on a bad tensor. */
int kern_multistep_update(kern_stream_t *s, kern_tensor_t *x, const kern_tensor_t *v, kern_tensor_t *h,
                          const kern_tensor_t *coef);
/* emb = sinusoid(t) with t = at[0] itself (no 1000·σ scaling): the
 * timestep a multistep solver's schedule hands the transformer. */
int kern_timestep_embed_at(kern_stream_t *s, const kern_tensor_t *at, kern_tensor_t *emb);
/* emb [S, dim], row r = sinusoid(rows[r, col]) itself (no scaling): each
 * row's own timestep, column col of F32 [S, k] (col < k). */
int kern_timestep_embed_rows_at(kern_stream_t *s, const kern_tensor_t *rows, int64_t col, kern_tensor_t *emb);

/* Text-encoder ops (kernels/text_ops.c; the umT5 encoder, model/t5.h).
 *
 * Attention with an additive relative-position bias and a key mask, as T5
 * runs it: for each head h and query i, with r = j − i,
 *   o_i,h = Σ_{j < nk_valid} softmax_j(scale·q_i,h·k_j,h + rel[h, r + nq − 1])·v_j,h
 * q, o [Nq, H·d], k, v [Nk, H·d] in one dtype; rel F32 [H, Nq + Nk − 1]
 * (a bias that depends only on the offset j − i, so T5's [H, Nq, Nk] bias
 * costs 1/Nq of its memory), or NULL for none; keys at and after
 * nk_valid (1..Nk) are masked: they get weight exactly 0, as T5's
 * finfo.min fill gives. T5 passes scale 1 (no 1/√d). Scores and softmax in
 * F32 (the CPU's sum in double). CPU scratch: a block of scores, bounded
 * as kern_attention's. CUDA: one block per (query, head), the row of
 * scores in shared memory: nk_valid + head_dim <= 12,000 or the launch is
 * refused (REEL_E_LIMIT). -1 with a message naming the op and tensor. */
int kern_attention_bias(kern_stream_t *s, const kern_tensor_t *q, const kern_tensor_t *k,
                        const kern_tensor_t *v, const kern_tensor_t *rel, int64_t heads,
                        int64_t nk_valid, float scale, kern_tensor_t *o);
/* y = a·b elementwise, same element count, one dtype; y may alias a or b. */
int kern_mul(kern_stream_t *s, const kern_tensor_t *a, const kern_tensor_t *b, kern_tensor_t *y);

#ifdef __cplusplus
}
#endif
#endif
