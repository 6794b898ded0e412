/* key.h -- the capture key: what a graph depends on, in one canonical text
 * form and a 64-bit hash of it, computed by the same code everywhere.
 *
 * A key names: device and arch, model, loop kind, the shape signature (each
 * input's name, dtype and shape, in the program's input order), the
 * resident version of every weight component the step reads, and graph_key
 * (compute dtype, CFG branch set, expert, scheduler precision).
 *
 *   reel-key/1 device=cpu arch=cpu-avx2 model=tinydit:tiny loop=euler
 *   inputs=latent:F32[4,2,8,8],context:F32[5,32],uncond:F32[5,32]
 *   weights=transformer@3 graph=dtype:F32,cfg:cond+uncond,expert:-,sched:f32
 *
 * (one line; components sorted by name). The shard form drops device, arch
 * and weight versions: it is what the broker hashes to pick a worker, so a
 * key keeps its worker across weight syncs. Hash: FNV-1a 64 of the text. */
#ifndef REEL_CAPTURE_KEY_H
#define REEL_CAPTURE_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "base/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CAP_MAX_INPUTS 8
#define CAP_MAX_COMPONENTS 8
#define CAP_NAME_MAX 48
#define CAP_MODEL_MAX 64 /* "tinydit:" and a model name of up to 55 bytes (docs/PROTOCOL.md) */
#define CAP_KEY_TEXT_MAX 1024

typedef struct {
    char name[CAP_NAME_MAX];
    kern_dtype_t dtype;
    int ndim;
    int64_t shape[KERN_MAX_DIMS];
} cap_sig_t;

typedef struct {
    char name[CAP_NAME_MAX];
    uint64_t version;
} cap_component_ver_t;

typedef struct {
    char device[32];              /* "cpu", "cuda:0" */
    char arch[32];                /* "cpu-avx2", "sm_90" */
    char model[CAP_MODEL_MAX];    /* "tinydit:small" */
    char loop[24];                /* "euler", "sde", "unipc", "dpm++", "sde-unipc", ... */
    int n_inputs;
    cap_sig_t inputs[CAP_MAX_INPUTS];
    int n_components;
    cap_component_ver_t components[CAP_MAX_COMPONENTS];
    struct {
        kern_dtype_t dtype;       /* compute dtype */
        char cfg[24];             /* "cond" or "cond+uncond" */
        char expert[24];          /* "-" when the model has one */
        char sched[8];            /* scheduler precision, "f32" */
    } graph;
} cap_key_t;

/* Adds an input signature / component to k. -1 with a message when full or
 * a name is empty, too long or contains a character outside [A-Za-z0-9_.:+-]
 * (names must not be able to forge the text form), or for an input whose
 * dtype is not a kern_dtype_t, whose ndim is outside 0..KERN_MAX_DIMS, or
 * which has a negative dim or a byte size past INT64_MAX. */
int cap_key_add_input(cap_key_t *k, const char *name, kern_dtype_t dt, int ndim, const int64_t *shape);
int cap_key_add_component(cap_key_t *k, const char *name, uint64_t version);
/* Sets the version of component `name`; -1 if k does not read it. */
int cap_key_set_version(cap_key_t *k, const char *name, uint64_t version);
/* True when k reads component `name` (any version). */
bool cap_key_reads(const cap_key_t *k, const char *name);

/* Writes the canonical text (full form, or the shard form when shard is
 * true) into buf; returns its length, or -1 (message set) if it would not
 * fit in len bytes or a field is invalid: every field, inputs, components
 * and graph dtype included, is checked as the add functions check it, so a
 * key written directly into the struct cannot forge the text form. */
int cap_key_text(const cap_key_t *k, bool shard, char *buf, size_t len);
/* FNV-1a 64 of the full text / of the shard text; 0 if the text is invalid
 * (0 is never a valid hash: it is remapped to 1). */
uint64_t cap_key_hash(const cap_key_t *k);
uint64_t cap_key_shard_hash(const cap_key_t *k);
/* FNV-1a 64 of any string / of n bytes, with the same remapping. */
uint64_t cap_hash_text(const char *s);
uint64_t cap_hash_bytes(const void *p, size_t n);

/* The key of one step of a denoising loop, built the same way by the broker
 * (from a request) and the worker (from its model): model "tinydit:small",
 * loop "euler", "sde", "unipc" or "dpm++", inputs latent [C,F,H,W] and
 * context [L,T] of dtype dt, sigmas F32[3], guidance F32[1], and uncond
 * [L,T] when cfg; "sde" adds sde F32[4], "unipc" and "dpm++" (the multistep
 * solvers) solver F32[16] and history [3, latent elements] of dt; the
 * grid loops "euler-unipc", "sde-unipc", "euler-dpm++" and "sde-dpm++"
 * (Euler or SDE steps on that solver's σ schedule) take sigmas F32[4] (the
 * step's timestep beside its σ) and are otherwise "euler" or "sde"; component
 * `component` at `version`; graph dtype dt, cfg "cond" or "cond+uncond",
 * expert "-", sched "f32". device/arch may be "" for shard hashing only.
 * -1 with a message when a field does not fit. */
int cap_key_denoise(cap_key_t *k, const char *device, const char *arch, const char *model,
                    const char *loop, kern_dtype_t dt, const int64_t latent[4],
                    const int64_t context[2], bool cfg, const char *component, uint64_t version);
/* The same for a batch of `batch` samples of one prompt (1..CAP_MAX_BATCH)
 * run as one step: latent [B,C,F,H,W] and, for "sde", sde F32 [B,4]; every
 * other input as above. batch 1 is exactly cap_key_denoise. */
#define CAP_MAX_BATCH 64
int cap_key_denoise_batch(cap_key_t *k, const char *device, const char *arch, const char *model,
                          const char *loop, kern_dtype_t dt, int64_t batch, const int64_t latent[4],
                          const int64_t context[2], bool cfg, const char *component, uint64_t version);
/* A mixed batch of `batch` different requests (2..CAP_MAX_BATCH) of one
 * single-request key run as one step: as cap_key_denoise_batch, but every
 * sample has its own σ (sigmas F32 [B,3], [B,4] on a grid), guidance (F32 [B,1]) and
 * context and uncond (rows b·L.. of [B·L,T]; `context` is one sample's
 * [L,T]). Euler and SDE loops only: -1 (UNSUPPORTED) for a multistep one. */
int cap_key_denoise_mixed(cap_key_t *k, const char *device, const char *arch, const char *model,
                          const char *loop, kern_dtype_t dt, int64_t batch, const int64_t latent[4],
                          const int64_t context[2], bool cfg, const char *component, uint64_t version);

#ifdef __cplusplus
}
#endif
#endif
