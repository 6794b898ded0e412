/* hf_parts.h -- a text encoder's or a VAE's weights as either release
 * publishes them (docs/MODEL.md "Which releases load").
 *
 * Wan2.1's own release keeps them as models_t5_umt5-xxl-enc-bf16.pth and
 * Wan2.1_VAE.pth, under the names model/t5.h and model/vae.h read. Its
 * diffusers release (Wan-AI/Wan2.1-T2V-*-Diffusers) keeps them as
 * text_encoder/ (transformers' UMT5EncoderModel: sharded safetensors and
 * model.safetensors.index.json, names such as
 * encoder.block.N.layer.1.DenseReluDense.wi_0.weight) and vae/
 * (AutoencoderKLWan: diffusion_pytorch_model.safetensors, names renamed by
 * convert_vae of diffusers' scripts/convert_wan_to_diffusers.py). Both
 * open here as one st_file_t under Wan's names, so the models load either
 * alike and compute the same bits from the same values. */
#ifndef REEL_MODEL_HF_PARTS_H
#define REEL_MODEL_HF_PARTS_H

#include <stddef.h>

#include "model/safetensors.h"

typedef enum { HF_PART_T5, HF_PART_VAE } hf_part_t;

/* The weights of part `kind` at path: a file (.pth or .safetensors, as
 * weights_open_any), an index (*.safetensors.index.json: its weight_map's
 * shards, beside it) or a folder holding one (diffusers' text_encoder/ or
 * vae/: model.safetensors.index.json, diffusion_pytorch_model.safetensors.
 * index.json, model.safetensors or diffusion_pytorch_model.safetensors, in
 * that order). Names in transformers' UMT5 or diffusers' VAE form are
 * renamed to Wan's (the rest are left as they are, for the model's own
 * checks to name). NULL with a message naming the path otherwise. */
st_file_t *hf_part_open(const char *path, hf_part_t kind);

/* Appends to this thread's error, when it names a tensor f renamed, the
 * name the file itself gives it ("(in the file: decoder.conv1.weight is
 * decoder.conv_in.weight)"): a loader's message about a renamed file
 * names what the user can find in it. Keeps the code; does nothing
 * otherwise. */
void hf_part_explain(const st_file_t *f);

/* Wan's name for `name` of part `kind` into out (len bytes): 1 renamed, 0
 * already Wan's or unknown (out = name). UMT5's shared.weight and its
 * tied encoder.embed_tokens.weight both name token_embedding.weight
 * (hf_part_open keeps shared.weight when a file holds both). */
int hf_part_wan_name(hf_part_t kind, const char *name, char *out, size_t len);

#endif
