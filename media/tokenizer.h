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
 * The cleaning, exactly (Wan's tokenizers.py: basic_clean, which imports
 * ftfy and `regex as re`): ftfy.fix_text; html.unescape twice; str.strip();
 * re.sub(r'\s+', ' '); str.strip().
 * - ftfy.fix_text is ftfy 6's with its defaults, less two steps (below):
 *   it works per line (a segment ends after '\n'), and
 *   from the first line holding a '<' on it unescapes no HTML; each line
 *   is fixed to a fixed point of: unescape_html (&#?[0-9A-Za-z]{1,24};
 *   only: HTML5 names with ';', ftfy's upper-case forms such as &NTILDE;,
 *   numeric references that html.unescape decodes whole and not to ';'),
 *   C1 controls (U+0080..U+009F) read as Windows-1252, Latin ligatures
 *   and digraphs taken apart (ftfy's list), half/full-width forms and
 *   U+3000 to their NFKC forms, curly quotes (U+02BC, U+2018..U+201F) to
 *   ' and ", line breaks (CR LF, CR, U+2028, U+2029, U+0085) to LF, ANSI
 *   terminal escapes (ESC [ digits-or-';' letter) removed, and control
 *   characters (U+0000..U+0008, U+000B, U+000E..U+001F, U+007F,
 *   U+206A..U+206F, U+FEFF, U+FFF9..U+FFFC) removed. Tables from Python's
 *   own data: media/ftfy_tables.inc (media/gen_ftfy_tables.py).
 * - NOT done of ftfy: fix_encoding (the mojibake repair, which runs only
 *   on text its badness heuristic flags, e.g. "cafÃ©"), and NFC (the
 *   sentencepiece model's NFKC normaliser covers it for the ids, except
 *   for canonical singletons that would complete an HTML reference, such
 *   as U+037E for ';'). A prompt with mojibake may tokenize differently
 *   from Wan2.1's; every other prompt tokenizes the same.
 * - html.unescape is Python's: numeric references (&#NNN; &#xHH;, the ';'
 *   optional, Python's replacements for 0, CR, 0x80..0x9F (Windows-1252),
 *   surrogates and values past U+10FFFF (U+FFFD), and the control and
 *   non-character values it drops), and the full HTML5 list of 2231 named
 *   references (media/html_entities.inc, generated from Python's
 *   html.entities.html5 by media/gen_html_entities.py), with and without
 *   ';', a name not in the list replaced by its longest listed prefix.
 * - \s is the `regex` module's: Unicode White_Space (\t \n \v \f \r,
 *   space, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F,
 *   U+205F, U+3000). strip() is Python's str.strip: the same set plus
 *   U+001C..U+001F (which the stdlib `re` would also collapse; `regex`
 *   does not, so Reel does not).
 * Encoding is libsentencepiece's (its model's own normaliser included), the
 * algorithm the Hugging Face "slow" T5 tokenizer runs; Wan's fast tokenizer
 * is a conversion of the same model.
 *
 * Built without media support (-DREEL_NO_MEDIA) tok_open and tok_encode
 * fail with "built without media support"; tok_clean, which needs no
 * library, works in every build.
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

/* The longest prompt tok_clean and tok_encode take, in bytes (REEL_E_LIMIT
 * past it). */
#define TOK_MAX_PROMPT_BYTES (1 << 20)

/* Opens a SentencePiece model: PATH is the `spiece.model` file itself or a
 * folder holding it (a release's `google/umt5-xxl/`). NULL with the error
 * value set: REEL_E_NOT_FOUND (no such path, a folder without
 * spiece.model), REEL_E_INVALID (not a SentencePiece model),
 * REEL_E_UNSUPPORTED (a model without an end-of-sequence piece, or a
 * build without media support), REEL_E_IO, REEL_E_NOMEM. */
tok_t *tok_open(const char *path);
/* Said wherever a tokenizer folder holds Hugging Face's tokenizer.json but
 * no spiece.model (a diffusers pipeline's tokenizer/ may): what Reel reads
 * instead. */
#define TOK_JSON_HINT "Reel reads the SentencePiece spiece.model that google/umt5-xxl ships, not tokenizer.json"

/* NULL-safe; *t = NULL after. */
void tok_close(tok_t **t);

/* Pieces in the model's vocabulary; its end-of-sequence id (>= 0); its
 * padding id (-1 when the model defines none; umT5's is 0). Can't fail. */
int tok_vocab_size(const tok_t *t);
int tok_eos_id(const tok_t *t);
int tok_pad_id(const tok_t *t);
/* "sha256:<hex>" of the model file's bytes: the tokenizer's identity in
 * cache keys and logs. Can't fail. */
const char *tok_identity(const tok_t *t);

/* Wan's prompt cleaning into out (cap bytes, NUL-terminated): -1 when it
 * does not fit (REEL_E_LIMIT, also past TOK_MAX_PROMPT_BYTES) or the text
 * is not UTF-8 (REEL_E_INVALID: strict, no overlong forms or surrogates). */
int tok_clean(const char *text, char *out, size_t cap);

/* ids of the cleaned prompt plus the end-of-sequence id, at most max_len
 * (>= 1) of them, into ids[cap]. Returns the count (>= 1; 1, the
 * end-of-sequence id alone, for an empty prompt or max_len 1), or -1:
 * REEL_E_INVALID (max_len < 1, text not UTF-8), REEL_E_LIMIT (the count
 * is over cap, or the prompt past TOK_MAX_PROMPT_BYTES), REEL_E_NOMEM,
 * REEL_E_UNSUPPORTED (no media support). */
int tok_encode(const tok_t *t, const char *text, int max_len, int32_t *ids, int cap);

#ifdef __cplusplus
}
#endif
#endif
