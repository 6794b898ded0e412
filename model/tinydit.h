/* tinydit.h -- the Wan2.1-style video DiT of ../shared/TINYDIT.md: configs,
 * resident weights, the capturable denoising step and the denoising loop.
 *
 * The step reads every per-step value (latent, σ_i, σ_{i+1}, contexts,
 * guidance scale) from a workspace (tdit_ws_t) whose buffers are allocated
 * once and never move; nothing per-step is passed by value. That is what
 * makes a step capturable: a graph recorded once replays correctly for any
 * step after the caller writes the new values into the workspace.
 *
 * Weights live in one component, "transformer", with a version counter that
 * later layers bump on a weight sync. */
#ifndef REEL_MODEL_TINYDIT_H
#define REEL_MODEL_TINYDIT_H

#include <stdbool.h>
#include <stdint.h>
#include "kernels/backend.h"
#include "base/tensor.h"
#include "model/safetensors.h"
#include "model/solver.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[56];        /* a model name: 1..55 of [A-Za-z0-9_.:+-] (docs/PROTOCOL.md) */
    int64_t dim;          /* D */
    int64_t heads;        /* H */
    int64_t layers;
    int64_t ffn_dim;      /* Fd */
    int64_t in_channels;  /* C */
    int64_t text_dim;     /* T */
    int64_t freq_dim;     /* sinusoid width, 256 */
    int64_t text_len;     /* Wan's text_len: contexts are padded with zero rows to it
                           * (512 for a Wan2.1 release); 0: none (Reel-native) */
} tdit_config_t;

/* The built-in configs ("tiny", "small", "wan2.1-1.3b", "wan2.1-14b"; the
 * table in tinydit.c is the one list): 0 with *out set, -1 with a message
 * naming them if unknown. Built-in configs have text_len 0. */
int tdit_config_builtin(const char *name, tdit_config_t *out);
/* The i-th built-in config's name, NULL past the last. Can't fail. */
const char *tdit_config_builtin_name(int i);
/* Checks sizes are positive, D % H == 0, head width even, freq even,
 * text_len in 0..65536. */
int tdit_config_validate(const tdit_config_t *c);
/* True when a and b describe the same network (every size; not the name,
 * not text_len). Can't fail. */
bool tdit_config_same_network(const tdit_config_t *a, const tdit_config_t *b);
/* The config in a weights file's __metadata__: either every size key
 * ("dim", "heads", "layers", "ffn_dim", "in_channels", "text_dim",
 * "freq_dim") or just "config" naming a built-in one; "text_len" is
 * optional (absent: 0). */
int tdit_config_from_meta(const st_file_t *f, tdit_config_t *out);
/* The same, from a header read without its data. */
int tdit_config_from_header(const st_header_t *h, tdit_config_t *out);
/* A config from JSON text {"name": ..., "dim": ..., "heads": ..., "layers":
 * ..., "ffn_dim": ..., "in_channels": ..., "text_dim": ..., "freq_dim": ...}
 * (name optional; "text_len" optional, 0 when absent), checked by
 * tdit_config_validate. `what` names the source in messages. 0, or -1
 * with a message. */
int tdit_config_from_json(const char *text, size_t len, const char *what, tdit_config_t *out);
/* Parameters in the network. */
int64_t tdit_config_params(const tdit_config_t *c);

/* One weight tensor of a config: its name (TINYDIT.md = Wan's model.py)
 * and shape. */
typedef struct {
    char name[80];
    int ndim;
    int64_t shape[KERN_MAX_DIMS];
} tdit_weight_t;
/* Every weight of c in file order (TINYDIT.md's list), malloc'd (free()
 * it), *n of them; NULL with a message when out of memory. */
tdit_weight_t *tdit_config_weights(const tdit_config_t *c, size_t *n);

/* Writes deterministic random weights for c to path (F32, config in
 * __metadata__, "text_len" too when nonzero; distributions in
 * docs/MODEL.md). 0, or -1 with a message. */
int tdit_weights_init(const tdit_config_t *c, uint64_t seed, const char *path);

typedef struct tdit_model tdit_model_t;

/* A change to weights as they are copied in from a file (a LoRA merge,
 * model/lora.h): `want` says which weights are copied (NULL: all; a
 * weight not wanted keeps its resident values), `adjust` may change the
 * F32 values of each one copied before they are stored (NULL: none). */
typedef struct {
    bool (*want)(void *user, const char *name);
    int (*adjust)(void *user, const char *name, float *w, int64_t numel);
    void *user;
} tdit_weight_edit_t;

/* Loads every weight of the config in f's metadata onto b in dtype
 * (KERN_F32 on the CPU; F32 or BF16 on CUDA). Checks each tensor's presence,
 * dtype and shape, and that it holds no NaN or infinity (after an edit);
 * the message names the first bad tensor. NULL on failure. */
tdit_model_t *tdit_model_load(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype);
/* As tdit_model_load, from a checkpoint path in any layout wan_ckpt.h
 * reads (a Reel file, a Wan2.1 release file or folder, a sharded index, a
 * diffusers folder or pipeline). */
tdit_model_t *tdit_model_load_path(kern_backend_t *b, const char *path, kern_dtype_t dtype);
void tdit_model_destroy(tdit_model_t **m);
const tdit_config_t *tdit_model_config(const tdit_model_t *m);
kern_backend_t *tdit_model_backend(const tdit_model_t *m);
kern_dtype_t tdit_model_dtype(const tdit_model_t *m);
/* Bytes of resident weights. */
size_t tdit_model_bytes(const tdit_model_t *m);
/* The one allocation holding every weight (component "transformer"). */
const void *tdit_model_weights(const tdit_model_t *m);
/* The weight tensors the forward pass reads, in file order, as they are
 * now (for identity checks): their count, and the i-th (NULL when i is out
 * of range). */
int tdit_model_n_tensors(const tdit_model_t *m);
const kern_tensor_t *tdit_model_tensor(const tdit_model_t *m, int i);
/* Moves every weight to a new allocation (same values) and frees the old
 * one, the way a resharding framework re-homes parameters, without any
 * version change. For tests of the replay checks. 0, or -1 with a message
 * (weights untouched). */
int tdit_model_relocate(tdit_model_t *m);
/* Copies the weights of f into the resident allocation, so every address
 * stays put (a weight sync). f must describe the same config and hold no
 * NaN or infinity: -1 with a message naming the first bad tensor
 * otherwise, the old weights intact unless a tensor was already copied
 * (only an edit's own overflow is found that late; the message says so). */
int tdit_model_reload(tdit_model_t *m, const st_file_t *f);
/* tdit_model_load and tdit_model_reload with an edit applied to the
 * weights on their way in (a NULL edit is none). */
tdit_model_t *tdit_model_load_edit(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype,
                                   const tdit_weight_edit_t *edit);
int tdit_model_reload_edit(tdit_model_t *m, const st_file_t *f, const tdit_weight_edit_t *edit);
/* tdit_model_load and tdit_model_reload_edit for a file whose values the
 * caller has already judged finite (the worker's wrk_weights_finite, at
 * start and before it takes its sync lock): no second pass over them. */
tdit_model_t *tdit_model_load_judged(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype);
int tdit_model_reload_judged(tdit_model_t *m, const st_file_t *f, const tdit_weight_edit_t *edit);

/* Shapes of one step: latent [C, frames, height, width], text tokens L;
 * with batch B > 1, B samples of one prompt (one context, one σ schedule,
 * each its own latent and SDE seed) run as one step over latent
 * [B, C, frames, height, width]. With `mixed`, the B samples are B
 * requests: each also its own context and uncond (rows [b·L, (b+1)·L) of
 * [B·L, T]), σ (row b of [B, 3]) and guidance (row b of [B, 1]), at any
 * point of its own loop; Euler and SDE steps only (a multistep mixed
 * batch is refused). Each sample's result is bitwise the same request
 * stepped alone (tdit_ws_bind_sample*). */
#define TDIT_MAX_BATCH 64
typedef struct {
    int64_t frames, height, width;
    int64_t text_len;
    bool cfg;               /* evaluate an unconditional branch too */
    int64_t batch;          /* samples; 0 and 1 both mean one (initializers may omit it) */
    tdit_solver_t solver;   /* the step's sampler: euler (0) for Euler and SDE steps; unipc or dpm++
                             * (multistep: coefficients and history in the workspace) */
    bool mixed;             /* the samples are different requests (see above) */
    tdit_solver_t grid;     /* euler (0): an Euler or SDE step's timestep is 1000·σ_i; unipc or dpm++ (with
                             * solver euler): an SDE loop on that solver's σ schedule, the transformer
                             * taking its integer timesteps, bound beside σ (a σ row of 4: σ_i,
                             * σ_{i+1}, σ_1, t_i; tdit_sigma_width) */
} tdit_shape_t;

/* The values of a step's σ row: 3 (σ_i, σ_{i+1}, σ_1), 4 with a grid (t_i). */
static inline int tdit_sigma_width(const tdit_shape_t *sh) { return sh->grid != TDIT_SOLVER_EULER ? 4 : 3; }

/* The samples a shape holds: batch, or 1 when batch is 0. */
static inline int64_t tdit_shape_batch(const tdit_shape_t *s) { return s->batch > 1 ? s->batch : 1; }

/* True when a and b describe the same shape (field by field: the struct
 * has padding, so never memcmp it). */
bool tdit_shape_equal(const tdit_shape_t *a, const tdit_shape_t *b);
/* Checks a shape: positive sizes, even height and width, bounded size,
 * batch in 0..TDIT_MAX_BATCH. -1 with a message naming the problem. */
int tdit_shape_validate(const tdit_shape_t *shape);

/* Token GEMMs of a batch (B > 1 samples of n token rows each): one GEMM
 * of B·n rows where that is bit for bit the B GEMMs of n rows a request
 * alone runs, asked once per shape by running both ways on random
 * operands (model/gemm_merge.c); the CPU in F32, CUDA in F32 and BF16
 * (there one strided-batched cuBLASLt matmul, asked on the device). The verdicts
 * are kept for the process; tdit_ws_new asks for its shape's GEMMs, so a
 * step (which may be captured, and then allocates nothing) finds them.
 * tdit_gemm_merge_ok: may a step merge a GEMM of K inputs to N outputs
 * (+ GELU)? REEL_GEMM_MERGE=0 in the environment, or the policy NEVER:
 * never. tdit_gemm_merge_probe asks afresh (for tests). */
enum { TDIT_MERGE_AUTO, TDIT_MERGE_NEVER };
bool tdit_gemm_merge_ok(kern_backend_t *b, kern_dtype_t dt, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu);
bool tdit_gemm_merge_probe(kern_backend_t *b, int64_t n, int64_t B, int64_t K, int64_t N, bool gelu);
void tdit_gemm_merge_set_policy(int policy);

/* The step workspace: address-stable buffers for one shape. Inputs are
 * written by the caller (tdit_ws_bind_*), the step updates `latent` in
 * place. */
typedef struct tdit_ws tdit_ws_t;

/* Allocates the workspace for shape on m's backend, including the scratch
 * its kernels need (sized from their workspace_bytes contracts and bound
 * to the stream only while a forward pass runs), so a workspace never
 * depends on memory the stream owns. s is unused. NULL with a message on a
 * bad shape or OOM. */
tdit_ws_t *tdit_ws_new(tdit_model_t *m, kern_stream_t *s, const tdit_shape_t *shape);
/* Frees *ws (NULL-safe) and sets it NULL. Reads nothing of its model,
 * which may already be gone: a capture cache frees a workspace when it
 * evicts the entry, whatever the order the caller destroys things in. */
void tdit_ws_destroy(tdit_ws_t **ws);
const tdit_shape_t *tdit_ws_shape(const tdit_ws_t *ws);
/* Bytes held by the workspace. */
size_t tdit_ws_bytes(const tdit_ws_t *ws);
/* Bytes tdit_ws_new would allocate for shape (0 on a bad shape). */
size_t tdit_ws_size(tdit_model_t *m, const tdit_shape_t *shape);
/* Device tensors of the workspace (for capture_cache and tests). */
kern_tensor_t *tdit_ws_latent(tdit_ws_t *ws);    /* [C,F,H,W]; [B,C,F,H,W] for a batch */
kern_tensor_t *tdit_ws_context(tdit_ws_t *ws);   /* [L,T] */
kern_tensor_t *tdit_ws_uncond(tdit_ws_t *ws);    /* [L,T]; data NULL without cfg */
kern_tensor_t *tdit_ws_sigmas(tdit_ws_t *ws);    /* F32 [3] = σ_i, σ_{i+1}, σ_1 (and t_i on a grid: tdit_sigma_width) */
kern_tensor_t *tdit_ws_guidance(tdit_ws_t *ws);  /* F32 [1] */
kern_tensor_t *tdit_ws_sde(tdit_ws_t *ws);       /* F32 [4]: eta, seed, step (kern_sde_params_pack); [B,4] for a batch */
kern_tensor_t *tdit_ws_mean(tdit_ws_t *ws);      /* the latent's shape: the last SDE step's mean μ */
kern_tensor_t *tdit_ws_velocity(tdit_ws_t *ws);  /* the latent's shape: the (combined) v */
kern_tensor_t *tdit_ws_solver(tdit_ws_t *ws);    /* F32 [16]: a multistep step's coefficients (KERN_MS_*) */
kern_tensor_t *tdit_ws_history(tdit_ws_t *ws);   /* [3, latent elements]: last corrected sample, last two
                                                  * data predictions; data NULL unless shape.solver is multistep */

/* Copies host F32 data into the workspace, ordered on s. Sizes are checked
 * against the workspace shape: -1 with a message if they do not fit. */
int tdit_ws_bind_latent(tdit_ws_t *ws, kern_stream_t *s, const float *x, size_t n);
int tdit_ws_bind_context(tdit_ws_t *ws, kern_stream_t *s, const float *ctx, size_t n, bool uncond);
/* sigmas: σ_i, σ_{i+1}, σ_1, and with a grid the step's timestep t_i
 * (tdit_sigma_width values). */
int tdit_ws_bind_step(tdit_ws_t *ws, kern_stream_t *s, const float *sigmas, float guidance);
int tdit_ws_read_latent(tdit_ws_t *ws, kern_stream_t *s, float *out, size_t n);
/* Sample b's own inputs and output in a batch (b < B; on a mixed
 * workspace also its context, uncond, σ and guidance): its latent
 * [C,F,H,W], its context and uncond [L,T] (uncond NULL without cfg), its
 * σ_i, σ_{i+1}, σ_1 and guidance. -1 with a message when b is out of
 * range or a size does not fit; the context, σ and guidance of a
 * workspace that is not mixed are the group's (tdit_ws_bind_context and
 * _step). */
int tdit_ws_bind_sample_latent(tdit_ws_t *ws, kern_stream_t *s, int64_t b, const float *x, size_t n);
int tdit_ws_read_sample_latent(tdit_ws_t *ws, kern_stream_t *s, int64_t b, float *out, size_t n);
int tdit_ws_bind_sample(tdit_ws_t *ws, kern_stream_t *s, int64_t b, const float *ctx, const float *uncond,
                        size_t n_ctx, const float *sigmas, float guidance);
/* Writes a multistep step's coefficients (KERN_MS_COEFS floats). -1 with
 * a message on a workspace without multistep. */
int tdit_ws_bind_solver(tdit_ws_t *ws, kern_stream_t *s, const float *coef);
/* Zeroes the history (before a request's first multistep step: the
 * coefficients of step 0 read none of it, and 0·x stays 0 only for finite
 * x). -1 with a message on a workspace without multistep. */
int tdit_ws_clear_history(tdit_ws_t *ws, kern_stream_t *s);

/* One velocity evaluation v(latent, 1000·σ_i) for `context` into v. */
int tdit_forward(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s,
                 const kern_tensor_t *context, kern_tensor_t *v);
/* One ODE denoising step: v (with CFG when the shape says so), then
 * latent += (σ_{i+1} − σ_i)·v. Capturable. */
int tdit_step(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s);
/* One SDE step (Flow-GRPO), noise keyed by (seed, step) given here: not
 * capturable. */
int tdit_step_sde(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s, float eta,
                  uint64_t seed, uint32_t step);
/* The same step reading eta, seed and step from the workspace's sde tensor
 * (written by the caller, kern_sde_params_pack) when it runs: capturable,
 * bitwise equal to tdit_step_sde with the same values; also writes the
 * step's mean μ to tdit_ws_mean. */
int tdit_step_sde_ws(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s);

/* One multistep solver step (UniPC, DPM++): v (with CFG when the shape
 * says so) at the timestep coef[KERN_MS_T], then the solver's update of the
 * latent and the history with the coefficients in the workspace
 * (tdit_ws_solver). Capturable. */
int tdit_step_multistep(tdit_model_t *m, tdit_ws_t *ws, kern_stream_t *s);

/* The flow-matching schedule: sigmas[0..steps] for shift S (computed in
 * double). sigmas must hold steps + 1 values. */
void tdit_schedule(int steps, double shift, double *sigmas);

#ifdef __cplusplus
}
#endif
#endif
