/* t5.h -- the umT5 text encoder as Wan2.1 runs it (wan/modules/t5.py).
 *
 * token embedding; `layers` blocks of
 *   x += o(attn(q(n1), k(n1), v(n1)) + pos_bias, mask)   n1 = T5-RMSNorm(x)·norm1
 *   x += fc2(fc1(n2) · gelu_tanh(gate(n2)))             n2 = T5-RMSNorm(x)·norm2
 * then the final norm. Attention has no 1/√d scaling; each layer has its
 * own bidirectional relative-position bias (buckets, max distance; Wan's
 * umt5 has shared_pos = False), added to the scores before the softmax,
 * and the padding mask removes padded keys. T5's RMS norm: x·rsqrt(mean(x²)
 * + 1e-6)·w, in F32. Dropout is absent (inference).
 *
 * Weights are read from a st_file_t (a `.pth` through model/pth.h, or a
 * safetensors copy) under the names Wan's T5Encoder state dict has:
 * token_embedding.weight, blocks.N.norm1.weight, blocks.N.attn.{q,k,v,o}.weight,
 * blocks.N.norm2.weight, blocks.N.ffn.gate.0.weight, blocks.N.ffn.fc1.weight,
 * blocks.N.ffn.fc2.weight, blocks.N.pos_embedding.embedding.weight, norm.weight.
 *
 * Convention: 0 on success, -1 with a message in reel_err_text();
 * constructors return NULL with a message. */
#ifndef REEL_MODEL_T5_H
#define REEL_MODEL_T5_H

#include <stdint.h>
#include "kernels/backend.h"
#include "base/tensor.h"
#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[32];
    int64_t vocab;      /* 256384 for umt5-xxl */
    int64_t dim;        /* 4096 */
    int64_t dim_attn;   /* 4096 (heads · head width) */
    int64_t dim_ffn;    /* 10240 */
    int64_t heads;      /* 64 */
    int64_t layers;     /* 24 */
    int64_t buckets;    /* 32 */
    int64_t max_dist;   /* 128 */
} t5_config_t;

/* "umt5-xxl" (Wan2.1's), "t5-tiny" and "t5-small" (for tests and the
 * demo): 0 with *out set, -1 naming the known ones. */
int t5_config_builtin(const char *name, t5_config_t *out);
/* The config of a checkpoint from its tensor shapes (the release ships
 * none): vocab and dim from the embedding, dim_attn from q, dim_ffn from
 * fc1, heads and buckets from the position embedding, layers by counting
 * blocks; max_dist 128. Every tensor's shape is then checked against it,
 * and a tensor no umT5 encoder has (a decoder's, a misspelt one, a layer
 * after a gap) is refused; -1 with a message naming the file and tensor.
 * name: the built-in config the shapes equal, else "custom". */
int t5_config_from_weights(const st_file_t *f, t5_config_t *out);
/* 0 when c is a config the encoder runs: sizes >= 1, vocab within int32,
 * dim_attn a multiple of heads, buckets >= 4 and max_dist > buckets/4
 * (the log buckets need both); -1 with a message naming c otherwise. */
int t5_config_validate(const t5_config_t *c);
/* The bidirectional relative-position bucket of offset rel = key − query
 * (T5RelativeEmbedding._relative_position_bucket with bidirectional=True):
 * half the buckets for rel > 0; within a half, |rel| itself below
 * max_exact = buckets/4, else max_exact + ⌊log(|rel|/max_exact) /
 * log(max_dist/max_exact) · (buckets/2 − max_exact)⌋ capped at buckets/2 − 1,
 * in float32 as torch computes it (the truncation at exact boundaries,
 * |rel| = 16 for 32 buckets, depends on that). A config t5_config_validate
 * accepts; can't fail. */
int64_t t5_bucket(int64_t rel, int64_t buckets, int64_t max_dist);

typedef struct t5_model t5_model_t;
/* Loads f's weights onto backend b in dtype: F32 (any stored dtype is
 * widened: the CPU backend's choice, and the reference), or BF16 (stored
 * F32 weights rounded once) where the backend has BF16 kernels of every op
 * the encoder runs (CUDA), activations then in BF16 too. The position
 * embeddings stay on the host in F32 (a few KB) and become each encode's
 * bias tables. NULL with a message naming a missing or misshapen tensor,
 * or an unsupported dtype on b. b must outlive the model. */
t5_model_t *t5_model_load(kern_backend_t *b, const st_file_t *f, kern_dtype_t dtype);
void t5_model_destroy(t5_model_t **m);
const t5_config_t *t5_model_config(const t5_model_t *m);
/* Device bytes the model holds. */
size_t t5_model_bytes(const t5_model_t *m);
/* The dtype its weights and activations are held in (t5_model_load's). */
kern_dtype_t t5_model_dtype(const t5_model_t *m);

/* Encodes ids[0..n) (tok_encode's result; each < vocab) into out[n·dim]
 * (host F32): the context of a prompt of real length n. pad_to >= n runs
 * the encoder at that length with the padding masked, as Wan runs it at
 * text_len; the real rows are the same up to rounding. pad_to 0: n.
 * Padding rows hold token 0 (Wan's pad id). n and pad_to at most 65,536.
 * -1 with a message (out untouched) on an id outside 0..vocab−1, n < 1,
 * pad_to in 1..n−1, or a failing op; s is synchronised either way. */
int t5_encode(t5_model_t *m, kern_stream_t *s, const int32_t *ids, int64_t n, int64_t pad_to,
              float *out);

/* Writes random weights of config c under the release's names (F32, or
 * BF16 as the release stores them) to a safetensors file: what tests and
 * the demo encode with. */
int t5_weights_init(const t5_config_t *c, uint64_t seed, kern_dtype_t dtype, const char *path);

#ifdef __cplusplus
}
#endif
#endif
