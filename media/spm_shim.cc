// spm_shim.cc -- the C face of sentencepiece::SentencePieceProcessor
// (media/spm_shim.h): load a model, encode to ids, the special ids. The
// only C++ in Reel; every exception is caught here and becomes the error
// value of base/error.h, so C callers see 0 / -1 / NULL as everywhere else.
#include "media/spm_shim.h"

#include "base/error.h"

#include <sentencepiece_processor.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <sys/stat.h>
#include <vector>

struct spm_shim {
    sentencepiece::SentencePieceProcessor sp;
};

extern "C" spm_shim_t *spm_shim_load(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        reel_fail_errno(REEL_E_NOT_FOUND, errno, "tokenizer model %s: cannot open", path);
        return nullptr;
    }
    if (!S_ISREG(st.st_mode)) {
        reel_fail(REEL_E_INVALID, "tokenizer model %s: not a regular file", path);
        return nullptr;
    }
    spm_shim_t *s = nullptr;
    try {
        s = new spm_shim_t;
        const auto status = s->sp.Load(path);
        if (!status.ok()) {
            reel_fail_detail(REEL_E_INVALID, status.ToString().c_str(),
                             "tokenizer model %s: not a SentencePiece model", path);
            delete s;
            return nullptr;
        }
        return s;
    } catch (const std::bad_alloc &) {
        delete s;
        reel_fail(REEL_E_NOMEM, "tokenizer model %s: out of memory", path);
    } catch (const std::exception &e) {
        delete s;
        reel_fail_detail(REEL_E_INVALID, e.what(), "tokenizer model %s: sentencepiece failed to load it", path);
    } catch (...) {
        delete s;
        reel_fail(REEL_E_INTERNAL, "tokenizer model %s: sentencepiece threw an unknown exception", path);
    }
    return nullptr;
}

extern "C" void spm_shim_free(spm_shim_t **s) {
    if (!s || !*s) return;
    try {
        delete *s;
    } catch (...) { /* a destructor that throws: nothing to recover, the memory is gone */
    }
    *s = nullptr;
}

extern "C" int spm_shim_vocab_size(const spm_shim_t *s) { return s->sp.GetPieceSize(); }
extern "C" int spm_shim_eos_id(const spm_shim_t *s) { return s->sp.eos_id(); }
extern "C" int spm_shim_pad_id(const spm_shim_t *s) { return s->sp.pad_id(); }
extern "C" int spm_shim_unk_id(const spm_shim_t *s) { return s->sp.unk_id(); }

extern "C" int spm_shim_encode(const spm_shim_t *s, const char *text, size_t len, int32_t **ids, size_t *n) {
    *ids = nullptr;
    *n = 0;
    try {
        std::vector<int> v;
        const auto status = s->sp.Encode(std::string(text, len), &v);
        if (!status.ok())
            return reel_fail_detail(REEL_E_INVALID, status.ToString().c_str(), "sentencepiece could not encode the prompt");
        if (v.empty()) return 0;
        int32_t *out = static_cast<int32_t *>(std::malloc(v.size() * sizeof *out));
        if (!out) return reel_fail(REEL_E_NOMEM, "out of memory encoding a prompt of %zu bytes", len);
        for (size_t i = 0; i < v.size(); i++) out[i] = v[i];
        *ids = out;
        *n = v.size();
        return 0;
    } catch (const std::bad_alloc &) {
        return reel_fail(REEL_E_NOMEM, "out of memory encoding a prompt of %zu bytes", len);
    } catch (const std::exception &e) {
        return reel_fail_detail(REEL_E_INVALID, e.what(), "sentencepiece could not encode the prompt");
    } catch (...) {
        return reel_fail(REEL_E_INTERNAL, "sentencepiece threw an unknown exception encoding the prompt");
    }
}
