/* fuzz_spiece.c -- libFuzzer harness: a tokenizer model file a user brings
 * (a release's spiece.model, `--tokenizer PATH`), as any bytes. tok_open
 * must refuse what libsentencepiece cannot read with an error, never
 * abort; a model it accepts must encode prompts (plain, empty, non-ASCII,
 * long) into ids within its vocabulary, ending in its end-of-sequence id,
 * or refuse them with an error. The input is written to a file of its own
 * under /dev/shm for each run (libsentencepiece reads a path). Seeds: two
 * small models trained with Debian's spm_train (unigram and BPE, identity
 * normalisation, so a few hundred bytes each), on four lines of English
 * repeated three times:
 *   spm_train --input=corpus.txt --model_prefix=unigram --vocab_size=60
 *     --model_type=unigram --normalization_rule_name=identity --pad_id=0
 *     --eos_id=1 --unk_id=2 --bos_id=-1 --hard_vocab_limit=false
 * and the same with --model_type=bpe. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "media/tokenizer.h"

static char model_path[80];

static void path_gone(void) { (void)unlink(model_path); }

static const char *model_file(void) {
    if (model_path[0]) return model_path;
    struct stat sb;
    snprintf(model_path, sizeof model_path, "%s/reel-fuzz-spiece-%ld.model",
             stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp", (long)getpid());
    atexit(path_gone);
    return model_path;
}

static void encode_checked(const tok_t *t, const char *text) {
    int32_t ids[64];
    int vocab = tok_vocab_size(t), eos = tok_eos_id(t);
    int n = tok_encode(t, text, 64, ids, 64);
    if (n < 0) return; /* refused with an error: allowed */
    if (n < 1 || n > 64) abort();
    if (ids[n - 1] != eos) abort();
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 20) return 0;
    const char *path = model_file();
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f) != 0) abort();
    tok_t *t = tok_open(path);
    if (!t) return 0; /* refused with an error */
    if (tok_vocab_size(t) <= 0 || tok_eos_id(t) < 0 || tok_eos_id(t) >= tok_vocab_size(t)) abort();
    encode_checked(t, "a cat walks on the grass");
    encode_checked(t, "");
    encode_checked(t, "\xe4\xb8\x80\xe5\x8f\xaa\xe7\x8c\xab \xc3\xa9t\xc3\xa9 \xf0\x9f\x90\x88");
    encode_checked(t, "the quick brown fox jumps over the lazy dog, again and again and again and again and "
                      "again and again and again and again and again and again and again and again");
    tok_close(&t);
    return 0;
}
