/* vae.h -- Wan2.1's VAE decoder (wan/modules/vae.py): latents to video.
 *
 * z [z_dim, F, H, W] (the DiT's output) is un-normalised with the
 * per-channel latent mean and std (z/ (1/std) + mean: Wan's scale), passed
 * through conv2 (a 1x1x1 causal conv), then decoded one latent frame at a
 * time, exactly as upstream: causal 3-D convolutions that keep a per-chunk
 * feature cache (the last 2 frames of each conv's input), RMS norms over
 * channels (F.normalize · √C · gamma + bias), SiLU, residual blocks, the
 * single-head middle attention per frame, the up-sampling blocks (upsample3d
 * first runs a time conv to 2C channels whose halves become two frames, on
 * every chunk but the first; then, as upsample2d, nearest 2x in space and a
 * 3x3 conv to C/2), the head, and a clamp to [-1, 1]. Memory
 * stays bounded by one chunk. The video has 1+4(F-1) frames of 8H x 8W.
 *
 * On the backend, channels-last ([T, H, W, C] activations): convs are
 * kern_conv3d_causal (kernels/ops_video.h: IM2COL3D + GEMM in bounded
 * column blocks), channel norms kern_rmsnorm rows, the attention
 * kern_attention with one head. F32 only. docs/MODEL.md "VAE decoder". 
 *
 * The latent mean and std: Wan's published 16 values when z_dim is 16 (or
 * the file's "latents_mean"/"latents_std" metadata, JSON arrays, when
 * present); 0 and 1 for other test sizes without metadata.
 *
 * Weights under the names of Wan's WanVAE_ state dict (Wan2.1_VAE.pth:
 * conv2.*, decoder.conv1.*, decoder.middle.*, decoder.upsamples.*,
 * decoder.head.*; the encoder's tensors are present and ignored).
 *
 * Convention: 0 on success, -1 with a message in reel_err_text();
 * constructors return NULL with a message. */
#ifndef REEL_MODEL_VAE_H
#define REEL_MODEL_VAE_H

#include <stdint.h>
#include "kernels/backend.h"
#include "base/tensor.h"
#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[32];
    int64_t dim;        /* 96 for Wan2.1 */
    int64_t z_dim;      /* 16 */
    int64_t dim_mult[4];/* 1, 2, 4, 4 */
    int64_t num_res_blocks; /* 2 */
} vae_config_t;

/* "wan2.1" (dim 96, z_dim 16) and "vae-tiny" (small sizes, z_dim 4, for
 * tests and the demo): 0 with *out set, -1 naming the known ones. */
int vae_config_builtin(const char *name, vae_config_t *out);
/* The i-th built-in config's name (i from 0), NULL past the last: for
 * messages and usage. Can't fail. */
const char *vae_config_builtin_name(int i);
/* 0 when c is a config this decoder runs: dim 1..4096, z_dim 1..64,
 * dim_mult 1,2,4,4 and 2 residual blocks (Wan2.1's structure); -1 with a
 * message naming c otherwise. */
int vae_config_validate(const vae_config_t *c);
/* The config of a checkpoint from its tensor shapes: decoder.conv1.weight
 * [4·dim, z_dim, 3, 3, 3]; the name of the built-in of that dim and z_dim,
 * else "custom". -1 with a message naming the file when that tensor is
 * missing or misshapen, or the blocks are not Wan2.1's. */
int vae_config_from_weights(const st_file_t *f, vae_config_t *out);

/* Frames of video a latent of F frames decodes to: 1 + 4(F-1). */
static inline int64_t vae_video_frames(int64_t latent_frames) { return 1 + 4 * (latent_frames - 1); }

typedef struct vae_model vae_model_t;
/* The decoder of f (config from vae_config_from_weights) on backend b,
 * weights widened to F32 and copied to the device (f may be closed after).
 * dtype is the compute dtype: only KERN_F32 (anything else: NULL,
 * REEL_E_UNSUPPORTED). NULL with a message naming the file and tensor on a
 * missing or misshapen tensor, a NaN or infinity in one, malformed
 * latents_mean/latents_std metadata, or out of memory. */
vae_model_t *vae_model_load(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype);
/* Frees the weights; NULL and *m NULL are fine; sets *m = NULL. */
void vae_model_destroy(vae_model_t **m);
const vae_config_t *vae_model_config(const vae_model_t *m);
/* Device bytes the weights hold. */
size_t vae_model_bytes(const vae_model_t *m);

/* Decodes latent [z_dim, F, H, W] (host F32) into video [3, 1+4(F-1), 8H,
 * 8W] (host F32, in [-1, 1]). progress, when not NULL, is called after each
 * latent frame (done of total); a nonzero return stops the decode there
 * (its caller's request was cancelled): -1 with REEL_E_STATE and
 * VAE_E_STOPPED in the message. s must be a stream of the model's backend;
 * the decode is synchronous (it returns with video written). Device memory
 * for one chunk (activations, column block, caches) is allocated on entry
 * and freed before return. The causal caches live in the model: one
 * decode at a time per model. -1 with a message on sizes out of range (F 1..
 * 100000, H and W 1..4096), a latent whose values decode to NaN or
 * infinity (too large for the VAE: REEL_E_INVALID), a failed allocation or
 * launch; video is then partly written. */
/* What vae_decode's message says of a latent that decodes to NaN or
 * infinity (a caller tells that failure from the others by it). */
#define VAE_E_NONFINITE "decodes to NaN or infinite values"
/* ... and of one its progress callback stopped. */
#define VAE_E_STOPPED "decode stopped"
/* vae_decode's size check alone, before the caller sizes its video: 0,
 * or -1 with a message (REEL_E_INVALID). */
int vae_latent_check(const vae_model_t *m, int64_t F, int64_t H, int64_t W);
typedef int (*vae_progress_fn)(void *user, int64_t done, int64_t total);
int vae_decode(vae_model_t *m, kern_stream_t *s, const float *latent, int64_t F, int64_t H, int64_t W,
               float *video, vae_progress_fn progress, void *user);

/* Random weights of config c under the release's names (the decoder's
 * and conv2's; F32) to a safetensors file: for tests and the demo. Conv
 * weights N(0, 1/fan_in), gammas 1 + 0.1·N(0,1), biases 0.05·N(0,1), tensor
 * i from Philox stream (seed, i). -1 with a message on an invalid config
 * or an I/O error (path untouched). */
int vae_weights_init(const vae_config_t *c, uint64_t seed, const char *path);

#ifdef __cplusplus
}
#endif
#endif
