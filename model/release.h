/* release.h -- the parts of a Wan2.1 release folder, found by their release
 * names (docs/MODEL.md "Which releases load").
 *
 * A Wan2.1-T2V folder holds, beside the DiT (model/wan_ckpt.h reads it):
 *   models_t5_umt5-xxl-enc-bf16.pth   the umT5-XXL text encoder (model/t5.h)
 *   google/umt5-xxl/spiece.model      its tokenizer (media/tokenizer.h)
 *   Wan2.1_VAE.pth                    the VAE (model/vae.h)
 * Safetensors copies load as well: the same names with .safetensors (and
 * any models_t5_*.pth / .safetensors for the encoder). A diffusers
 * pipeline (Wan-AI/Wan2.1-T2V-*-Diffusers: model_index.json) holds them as
 *   text_encoder/   transformers' UMT5EncoderModel (model/hf_parts.h)
 *   tokenizer/spiece.model
 *   vae/            diffusers' AutoencoderKLWan (model/hf_parts.h)
 * (the Wan names win where a folder holds both). */
#ifndef REEL_MODEL_RELEASE_H
#define REEL_MODEL_RELEASE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#define RELEASE_T5_NAME "models_t5_umt5-xxl-enc-bf16.pth"
#define RELEASE_TOKENIZER_DIR "google/umt5-xxl"
#define RELEASE_VAE_NAME "Wan2.1_VAE.pth"
#define RELEASE_DIFFUSERS_T5 "text_encoder"
#define RELEASE_DIFFUSERS_TOKENIZER "tokenizer"
#define RELEASE_DIFFUSERS_VAE "vae"

typedef struct {
    char t5[PATH_MAX];          /* "" when the folder has none */
    char tokenizer[PATH_MAX];   /* the folder holding spiece.model, or "" */
    char vae[PATH_MAX];         /* "" when none */
    bool pipeline;              /* dir is a diffusers pipeline root */
} release_parts_t;

/* Fills *out with the parts dir holds (each "" when absent). -1 with a
 * message when dir is not a readable directory. */
int release_find(const char *dir, release_parts_t *out);

/* dir without its trailing slashes ("/" stays): in buf (PATH_MAX bytes)
 * when it had any, else dir itself. The paths release_find finds and the
 * folder its callers name then read "DIR/NAME", not "DIR//NAME", for a
 * folder given as "DIR/". */
const char *release_dir(const char *dir, char *buf);

/* What p, found in dir by release_find, lacks for a text encoder, for a
 * message: for each of the text encoder and the tokenizer it has not, the
 * path looked at and the file expected ("no tokenizer: DIR/google/umt5-xxl/
 * has no spiece.model"), and, where the pipeline's tokenizer/ holds
 * tokenizer.json alone, that Reel reads the spiece.model google/umt5-xxl
 * ships. Writes "" when p has both. Can't fail (cut at len). */
void release_text_missing(const char *dir, const release_parts_t *p, char *out, size_t len);

/* A diffusers pipeline's sampler, from ROOT/scheduler/scheduler_config.json
 * (diffusers' save_pretrained of the pipeline's scheduler), as a prompt
 * run's defaults (docs/MODEL.md "Reproducing Wan2.1's generate.py"):
 *   UniPCMultistepScheduler with use_flow_sigmas      unipc, its flow_shift
 *   DPMSolverMultistepScheduler, algorithm_type       dpm++, its flow_shift
 *     dpmsolver++ (diffusers' default), use_flow_sigmas
 *   FlowMatchEulerDiscreteScheduler                   euler, its shift
 *                                                     (not with use_dynamic_shifting)
 * anything else gives neither, and `note` says why. Only UniPC can step
 * as diffusers does (to float32 rounding of its first sigma): its config
 * is checked key by key against what Reel's unipc runs (prediction_type
 * flow_prediction, solver_order 2, bh2, ...; a key the file leaves out
 * is diffusers' default), and `unlike` names each key that differs.
 * DPM++ and Euler always step Wan's sigmas, not diffusers' (`unlike`
 * says how), and name their differing keys likewise. */
typedef struct {
    bool found;                 /* the file is there */
    char path[PATH_MAX];        /* ROOT/scheduler/scheduler_config.json */
    char class_name[64];        /* its _class_name ("" when it has none) */
    const char *solver;         /* "unipc", "euler", "dpm++"; NULL: none taken */
    double shift;               /* > 0; NAN: none taken */
    char note[256];             /* why solver or shift was not taken; "" when both were */
    char unlike[768];           /* how the solver taken steps otherwise than diffusers would; "" when it does not */
} release_sched_t;

/* Reads dir's scheduler config into *out when dir is a pipeline root (p
 * from release_find) that has one (else out->found is false: 0). 0, or -1
 * with a REEL_E_INVALID error naming the file: unreadable (strerror's
 * reason), a directory or other non-file, not JSON (where), not an
 * object, or a shift that is not a number > 0. */
int release_sched_read(const char *dir, const release_parts_t *p, release_sched_t *out);

#endif
