/* spm_shim.h -- the C face of libsentencepiece (media/spm_shim.cc, the one
 * C++ file of Reel), for media/tokenizer.c only.
 *
 * Every C++ exception is caught inside the shim and becomes a failure with
 * the error value of base/error.h set: nothing C++ crosses into C. Built
 * with -DREEL_NO_MEDIA the shim is not compiled and nothing calls it. */
#ifndef REEL_MEDIA_SPM_SHIM_H
#define REEL_MEDIA_SPM_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spm_shim spm_shim_t;

/* Loads the SentencePiece model file at path. NULL with the error value
 * set: REEL_E_NOT_FOUND for a missing file, REEL_E_INVALID for a file
 * sentencepiece cannot read as a model (its status text as the detail),
 * REEL_E_NOMEM. */
spm_shim_t *spm_shim_load(const char *path);
/* NULL-safe; *s = NULL after. */
void spm_shim_free(spm_shim_t **s);

/* The model's piece count and special ids (-1 where the model has none).
 * Can't fail. */
int spm_shim_vocab_size(const spm_shim_t *s);
int spm_shim_eos_id(const spm_shim_t *s);
int spm_shim_pad_id(const spm_shim_t *s);
int spm_shim_unk_id(const spm_shim_t *s);

/* The ids of text[0..len) (sentencepiece's own normalisation applied, no
 * special ids added) into a malloc'd array *ids of *n (the caller frees;
 * *ids may be NULL when *n is 0). 0, or -1 with the error value set
 * (REEL_E_INVALID with sentencepiece's status text, REEL_E_NOMEM). */
int spm_shim_encode(const spm_shim_t *s, const char *text, size_t len, int32_t **ids, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
