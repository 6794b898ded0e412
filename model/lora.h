/* lora.h -- LoRA adapters as trainers save them (PEFT), applied to the
 * transformer's Linears by merging: W = W_base + s·B·A.
 *
 * An adapter is a PEFT folder: `adapter_config.json` (peft_type "LORA",
 * r, lora_alpha, use_rslora, target_modules) and
 * `adapter_model.safetensors` (or PEFT's older `adapter_model.bin`, read
 * by the restricted .pth reader, model/pth.h), with per target
 * `lora_A.weight` [r, in] and `lora_B.weight` [out, r], F32, BF16 or F16.
 * Keys name the target in the layouts Reel reads:
 *   Wan's:      base_model.model.blocks.N.self_attn.q.lora_A.weight
 *   diffusers': transformer.blocks.N.attn1.to_q.lora_A.weight
 *   kohya's:    lora_unet_blocks_N_self_attn_q.lora_down.weight
 * (the prefixes base_model.model., transformer. and diffusion_model. are
 * accepted, or none; PEFT's in-memory adapter name ".default" too;
 * lora_down / lora_up for lora_A / lora_B, with a module's ".alpha", as
 * ComfyUI's and musubi-tuner's Wan LoRAs have them). Without an
 * adapter_config.json (diffusers' save_lora_weights writes none; ComfyUI's
 * files are one safetensors) the config is the file's (lora_parse). A
 * target is one of the blocks' Linears: self_attn/attn1 and
 * cross_attn/attn2 q, k, v, o (to_q, to_k, to_v, to_out.0) and the FFN's
 * ffn.0 / ffn.2 (ffn.net.0.proj / ffn.net.2), or one of the Linears
 * outside the blocks: text_embedding.0 / .2, time_embedding.0 / .2,
 * time_projection.1 and head.head (diffusers' condition_embedder.
 * text_embedder.linear_1 / _2, time_embedder.linear_1 / _2, time_proj and
 * proj_out). The scale is s = lora_alpha / r, or lora_alpha / sqrt(r)
 * with use_rslora, per module with rank_pattern / alpha_pattern (the
 * first key matching the module's name gives its r, alpha).
 *
 * Full differences, as ComfyUI, diffusers and lightx2v's / CausVid's Wan
 * LoRAs carry them: `X.diff` adds to weight X.weight (X itself for a
 * modulation), `X.diff_b` to X.bias and `X.diff_m` to X.modulation,
 * unscaled, for any weight of the model X names (a norm's weight, a
 * Linear's bias, the patch embedding's); PEFT's `lora_bias` (a
 * `lora_B.bias` key) adds s times itself to the Linear's bias.
 *
 * DoRA (PEFT's use_dora: true, a `lora_magnitude_vector` [out] per
 * target): W = (m / ||V||_row) ⊙ V with V = W_base + s·B·A, the norm of
 * each output row, as PEFT's Linear.merge (lora_merge_into).
 *
 * Refused by name, nothing changed: kohya's / LyCORIS' DoRA (.dora_scale
 * keys), a DoRA magnitude without use_dora, a missing or wrong-sized one,
 * one without its lora_A / lora_B, DoRA with lora_bias or a .diff on the
 * same weight, bias training (bias other than "none", a base bias key),
 * modules_to_save, a rank_pattern / alpha_pattern key that is no regex
 * Reel reads (PEFT's Python re keys, matched against each module's name as
 * PEFT saw it, are compiled as POSIX ERE: docs/MODEL.md), fan_in_fan_out, a rank
 * above LORA_MAX_RANK, a peft_type other than LORA, a low-rank key that
 * names no Linear (an unknown target), an A without its B, ranks that
 * disagree with r, non-finite values, and (lora_check) a target the
 * model does not have or whose shape differs.
 *
 * Merging never subtracts a previous adapter: the weights are always
 * recomputed from the exact base (tdit_model_reload_edit with
 * lora_edit), so any number of syncs leaves no drift.
 *
 * Convention: 0 on success, -1 with a message in reel_err_text();
 * constructors return NULL with a message. */
#ifndef REEL_MODEL_LORA_H
#define REEL_MODEL_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"
#include "model/tinydit.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LORA_MAX_RANK 256
#define LORA_MAX_TARGETS 4096
#define LORA_CONFIG_MAX (64 << 10) /* bytes of adapter_config.json */
#define LORA_MAX_DELTA 1e37         /* lora_check refuses a merge that could add more (F32 ends at 3.4e38) */

typedef struct lora lora_t;

#define LORA_DIFF_MAX_DIMS 5 /* the patch embedding's [dim, C, 1, 2, 2] */

/* One weight the adapter changes: by a low-rank product (a Linear's
 * weight: a and b), by a full difference (d: a .diff, .diff_b or PEFT's
 * lora_B.bias), or both (ΔW = s·B·A + d_scale·d). */
typedef struct {
    char weight[80];        /* the base weight it changes, Reel's (= Wan's) name: blocks.3.self_attn.q.weight */
    int64_t out, in, rank;  /* of the low-rank part; rank 0: none */
    const float *a;         /* [rank, in] */
    const float *b;         /* [out, rank] */
    float scale;            /* s of this target: ΔW = s·B·A */
    double alpha;           /* its module's alpha key (has_alpha), kohya's and ComfyUI's */
    bool has_alpha;
    const float *d;         /* the full difference, the weight's own shape, or NULL */
    int d_ndim;
    int64_t d_shape[LORA_DIFF_MAX_DIMS], d_numel;
    float d_scale;          /* 1 for .diff / .diff_b; the module's s for a lora_B.bias */
    char d_scale_of[80];    /* a lora_B.bias: the Linear weight whose s it takes; "" otherwise */
    const float *m;         /* DoRA: PEFT's lora_magnitude_vector, [out], or NULL (plain LoRA) */
    int64_t m_len;
} lora_target_t;

/* Where the adapter at path keeps its files: weights (a folder's
 * adapter_model.safetensors, adapter_model.bin or diffusers'
 * pytorch_lora_weights.safetensors; else path itself) and cfg, the
 * adapter_config.json in the folder or beside the file, "" when there is
 * none. 0, or -1 naming what is missing. */
int lora_locate(const char *path, char *cfg, char *weights, size_t len);
/* Whether path is a LoRA adapter rather than a model's weights: a folder
 * with an adapter_config.json, or weights (a folder's or the file named)
 * whose tensors have LoRA names. Never fails. */
bool lora_is_adapter(const char *path);
/* Reads the adapter at path (lora_locate). NULL with a message naming
 * what is refused. */
lora_t *lora_open(const char *path);
/* The same from an adapter_config.json's text (config_name names it in
 * messages) and the weights file's tensors (copied: f may be closed
 * after), with sha256 (may be NULL) as its identity. A config without r
 * ("{}": no adapter_config.json) takes the weights file's own: diffusers'
 * lora_adapter_metadata when it has one, else each target's rank from its
 * matrices and its scale alpha / rank, alpha its module's ".alpha" key or,
 * without one, its rank (s = 1 whatever the ranks, as ComfyUI and
 * diffusers since its #14409 load such a file; older diffusers scale a
 * module of rank r_m by the first module's rank over r_m:
 * docs/MODEL.md "LoRA adapters"). */
lora_t *lora_parse(const char *config, size_t config_len, const char *config_name, const st_file_t *f,
                   const char *sha256);
void lora_close(lora_t **l);

/* Whether rank_pattern / alpha_pattern key `key` (a Python re pattern)
 * matches module name `module` as PEFT matches them,
 * re.match(rf"(.*\.)?({key})$", module), read as lora_open reads keys: 1
 * or 0, or -1 with a message naming the key where lora_open refuses it
 * (for tests and tools). */
int lora_pattern_match(const char *key, const char *module);
/* How many times reading l ran a rank_pattern / alpha_pattern regex over
 * a module's name (for tests): a key that is a module's name (plain
 * characters, '.' and escaped punctuation) is compared without one, and a
 * module's name is matched once, not once per matrix. */
long lora_regex_runs(const lora_t *l);

/* 0 when every target is a weight of c with the shape the adapter needs
 * ([out, in] for a low-rank part, the difference's own) and no merge could leave F32's range (lora_max_delta below
 * LORA_MAX_DELTA, and each target's unscaled B·A too: r·max|B|·max|A|,
 * which the merge forms before its scale), else -1 naming the first
 * problem. */
int lora_check(const lora_t *l, const tdit_config_t *c);

int lora_rank(const lora_t *l);           /* r of the config */
double lora_alpha(const lora_t *l);
bool lora_rslora(const lora_t *l);
float lora_scale(const lora_t *l);        /* s */
const char *lora_layout(const lora_t *l); /* "wan" or "diffusers" (the keys' names) */
const char *lora_sha256(const lora_t *l); /* of the weights file's bytes */
size_t lora_bytes(const lora_t *l);       /* of the A, B and difference tensors as stored */
int lora_n_targets(const lora_t *l);
const lora_target_t *lora_target(const lora_t *l, int i);
/* The target changing weight `name`, or NULL. */
const lora_target_t *lora_find(const lora_t *l, const char *name);

/* The largest value any target can add to a weight: |s|·r·max|B|·max|A|
 * plus |d_scale|·max|d|, over the targets, and a DoRA target's max|m| (no
 * value of its merged rows is above it) (an upper bound; a merge stays
 * finite below F32's range minus the base's values). */
double lora_max_delta(const lora_t *l);

/* DoRA's merge needs the base: 0 when every DoRA target merges onto the
 * base's values (base, the model's weights file) with every row's norm
 * above 0 and a finite factor, else -1 naming the weight and row (what
 * lora_merge_into would refuse part-way through a reload). Reads each
 * DoRA target's weight once; 0 at once for a plain LoRA. */
int lora_check_merge(const lora_t *l, const st_file_t *base);

/* A one-line JSON of the adapter (rank, alpha, rslora, scale, targets,
 * diffs, modules: at most 192 bytes of them, then ",+N more", bytes,
 * sha256, layout, config) into buf: what the worker reports and the
 * catalog records. 0, or -1 when it does not fit. */
int lora_describe(const lora_t *l, char *buf, size_t len);

/* W += s·B·A (then, DoRA, each row i times m_i / ||row i||), then W +=
 * d_scale·d, for w the F32 values of weight `name`;
 * a weight the adapter does not target is left as it is. 0, or -1 on a
 * count of values the target does not have, or a DoRA row whose norm is 0
 * or whose factor is not finite. */
int lora_merge_into(const lora_t *l, const char *name, float *w, int64_t numel);

/* The edit tdit_model_load_edit / tdit_model_reload_edit take: every
 * weight from the base file, each target merged (targets_only: only the
 * targets are copied, the rest of the resident weights being the same
 * base already). */
tdit_weight_edit_t lora_edit(const lora_t *l, bool targets_only);

#ifdef __cplusplus
}
#endif
#endif
