/* tokenizer.h -- a prompt to token ids, as Wan2.1's T5EncoderModel makes them.
 *
 * Wan2.1 tokenizes with google/umt5-xxl (HuggingfaceTokenizer, clean=
 * 'whitespace', add_special_tokens=True, padding to text_len, truncation).
 * Reel reads the same release folder's `spiece.model` with libsentencepiece:
 * the prompt is cleaned as Wan's whitespace_clean does (basic_clean, then
 * runs of whitespace to one space, stripped), encoded to pieces, the
 * end-of-sequence id appended, and the ids truncated to max_len with the
 * end-of-sequence id kept last (what the Hugging Face tokenizer gives with
 * truncation=True). No padding: the caller's real length is the count.
 *
 * Convention: 0 / a count on success, -1 with a message in reel_err_text();
 * constructors return NULL with a message. */
#ifndef REEL_MEDIA_TOKENIZER_H
#define REEL_MEDIA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tok tok_t;

/* Opens a SentencePiece model: PATH is the `spiece.model` file itself or a
 * folder holding it (a release's `google/umt5-xxl/`). */
tok_t *tok_open(const char *path);
void tok_close(tok_t **t);

/* Pieces in the model's vocabulary. Can't fail. */
int tok_vocab_size(const tok_t *t);
int tok_eos_id(const tok_t *t);
int tok_pad_id(const tok_t *t);
/* "sha256:<hex>" of the model file's bytes: the tokenizer's identity in
 * cache keys and logs. Can't fail. */
const char *tok_identity(const tok_t *t);

/* Wan's prompt cleaning into out (cap bytes, NUL-terminated): -1 when it
 * does not fit or the text is not UTF-8. */
int tok_clean(const char *text, char *out, size_t cap);

/* ids of the cleaned prompt plus the end-of-sequence id, at most max_len
 * (>= 1) of them, into ids[cap]. Returns the count (>= 1). */
int tok_encode(const tok_t *t, const char *text, int max_len, int32_t *ids, int cap);

#ifdef __cplusplus
}
#endif
#endif
