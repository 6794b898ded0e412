/* t2v.h -- the text encoder and VAE around the DiT: a GEN's prompt in, its
 * decoded frames or video out (issue 26, docs/PROTOCOL.md "Prompts and
 * videos").
 *
 * The text side holds a tokenizer (media/tokenizer.h) and a T5 encoder
 * (model/t5.h) on the worker's backend, and an LRU cache of encoded
 * prompts keyed by (encoder identity, text) within a byte bound. The VAE
 * side holds Wan's decoder (model/vae.h). Each side runs one call at a time
 * (its own lock): a worker's stream threads share them; `reelctl run`
 * uses them too. Both are optional: a worker
 * without them announces neither and the broker routes it no prompt and no
 * decoded output.
 *
 * Convention: 0 on success, -1 with a message in reel_err_text(). */
#ifndef REEL_MODEL_T2V_H
#define REEL_MODEL_T2V_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"
#include "model/vae.h"

typedef struct t2v_text t2v_text_t;
typedef struct t2v_vae t2v_vae_t;

/* Wan2.1's default negative prompt (wan/configs/shared_config.py's
 * sample_neg_prompt): encoded when a guided prompt GEN gives none. */
extern const char T2V_WAN_NEG_PROMPT[];

/* Loads the T5 weights at t5_path (a .pth or safetensors file) and the
 * tokenizer at tok_path (spiece.model or its folder) onto b. The encoder's
 * width must be text_dim (the DiT's); text_len (> 0) is where contexts are
 * truncated and padded. cache_bytes bounds the encoded prompts kept. */
t2v_text_t *t2v_text_new(kern_backend_t *b, const char *t5_path, const char *tok_path, int64_t text_len,
                         int64_t text_dim, size_t cache_bytes);
void t2v_text_destroy(t2v_text_t **t);
/* The encoder's config name (READY text_encoder). */
const char *t2v_text_name(const t2v_text_t *t);
/* Device bytes of the encoder's weights. */
size_t t2v_text_bytes(const t2v_text_t *t);
/* The context of text: encoded (or found in the cache), cut to its real
 * length, padded with zero rows to text_len, into a malloc'd [text_len,
 * text_dim] F32 buffer (*out; the caller frees). *rows: the real length.
 * Runs on the encoder's own stream (a stream that captured graphs cannot
 * grow its scratch), under its lock. */
int t2v_text_context(t2v_text_t *t, const char *text, float **out, int64_t *rows);
/* Cache counters, for logs and tests. */
typedef struct { uint64_t hits, misses, evictions; size_t bytes, entries; } t2v_text_stats_t;
void t2v_text_stats(t2v_text_t *t, t2v_text_stats_t *out);

/* Loads the VAE at path (a .pth or safetensors file) onto b; its z_dim
 * must be the DiT's in_channels. */
t2v_vae_t *t2v_vae_new(kern_backend_t *b, const char *path, int64_t in_channels);
void t2v_vae_destroy(t2v_vae_t **v);
const char *t2v_vae_name(const t2v_vae_t *v);
size_t t2v_vae_bytes(const t2v_vae_t *v);
/* Decodes n latents [n][C,F,H,W] (host F32) to frames [n][F',H',W',3]
 * (uint8, malloc'd into *frames; F' = 1+4(F-1), H' = 8H, W' = 8W) and,
 * when mp4 is not NULL (n must be 1), also an MP4 of them (*mp4, *mp4_len;
 * malloc'd). Runs on the VAE's own stream, under its lock. */
int t2v_vae_decode(t2v_vae_t *v, const float *latents, int n, const int64_t shape[4],
                   uint8_t **frames, uint8_t **mp4, size_t *mp4_len);
/* The same, calling progress(user, done, total) after each latent frame of
 * each sample (total: n·F). */
int t2v_vae_decode_progress(t2v_vae_t *v, const float *latents, int n, const int64_t shape[4], uint8_t **frames,
                            uint8_t **mp4, size_t *mp4_len, vae_progress_fn progress, void *user);

#endif
