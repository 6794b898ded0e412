/* ctl.h -- shared pieces of reelctl's subcommands.
 *
 * Each cmd_* returns 0 when it did its job; CTL_NO when it ran and its
 * answer is no, already said on its output (tensor diff: the tensors
 * differ; sync: not every worker applied it; artifacts verify: a bundle
 * was refused; top: the broker did not answer the last view); or -1 with
 * the error value of base/error.h set. Only reelctl's main prints that
 * value ("reelctl: <message>" on stderr) and turns its code into the exit
 * status (reel_exit_status): 2 for what the user can fix in the command
 * line or the input files (invalid, not_found, unsupported, limit), 1 for
 * a failure at run time (io, device, nomem, timeout, state, internal). */
#ifndef REEL_CTL_H
#define REEL_CTL_H

#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include "base/error.h"
#include "schema/msg.h"
#include "model/tinydit.h"

/* The command ran and its answer is no (see above): exit status 1. */
#define CTL_NO 1

int cmd_weights(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_kernels(int argc, char **argv);
int cmd_artifacts(int argc, char **argv);
int cmd_tensor(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_sync(int argc, char **argv);
#define DEFAULT_BROKER "tcp://127.0.0.1:5555" /* reelctl's --broker when none is given */
int cmd_status(int argc, char **argv);
int cmd_top(int argc, char **argv);
/* From a STATUS_REPLY (cmd_gen.c): the version of `name` in v (0 when
 * absent; *found, when not NULL, says which), and why worker w lags on
 * `component` (NULL when it does not). */
uint64_t ctl_version_of(const msg_versions_t *v, const char *name, bool *found);
const char *ctl_lag_of(const msg_worker_status_t *w, const char *component);
int cmd_report(int argc, char **argv);
/* The broker's live counters (STATUS_REPLY) in the Prometheus text format
 * on out: `reelctl metrics --broker EP`. 0, or -1 with the error value
 * set (the broker's own error as ctl_fail_wire says it). */
int ctl_broker_metrics(const char *broker, FILE *out);
int cmd_catalog(int argc, char **argv);
int cmd_why(int argc, char **argv);        /* why ID (cmd_why.c) */
int cmd_keys(int argc, char **argv);       /* keys new (cmd_keys.c) */
int cmd_tokenize(int argc, char **argv);   /* tokenize (cmd_text.c) */
int cmd_plan(int argc, char **argv);       /* plan (cmd_plan.c) */
int cmd_video(int argc, char **argv);      /* video probe (cmd_text.c) */
int cmd_encode(int argc, char **argv);     /* encode: ids through the umT5 encoder (cmd_encode.c) */
int cmd_decode(int argc, char **argv);     /* decode (cmd_decode.c) */
int cmd_weights_init_vae(int argc, char **argv); /* weights init-vae (cmd_decode.c) */

/* ---- the usage text (usage.c) ---- */

/* `reelctl --help`: every command's entry, in sections, on out. Can't fail. */
void ctl_usage_all(FILE *out);
/* The usage of one command on out: key names it as the overview does
 * ("gen", "weights init-t5", "keys new", "requests"; "weights inspect" and
 * "weights info" the same), or a group ("weights", "tensor"): a synopsis
 * line, its entries of the overview, then its options with their
 * defaults; a group's subcommands' entries. false, nothing printed, for a
 * key the usage does not know. */
bool ctl_usage_print(const char *key, FILE *out);
/* `reelctl CMD [SUB] ... --help`: ctl_usage_print of "CMD SUB" where that
 * is a subcommand, else of CMD. false as ctl_usage_print. */
bool ctl_usage_help(int argc, char **argv, FILE *out);
/* A command line cmd cannot read (an unknown option, one without its
 * value): a REEL_E_INVALID error of fmt's text (exit 2), and main prints
 * cmd's usage (ctl_usage_print; cmd is copied) on stderr before it. -1. */
int ctl_fail_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The cmd of the last ctl_fail_usage; NULL when none. */
const char *ctl_usage_wanted(void);

/* ---- the helpers every subcommand uses (ctl_common.c) ---- */

/* This thread's failure, reported as reelctl has always reported it: the
 * text of fmt (NULL: none; a prefix like "%s: ") in front of its message,
 * its detail kept, and its code kept when that gives the same exit status
 * as code, else code. Where a library calls a failure invalid that
 * reelctl has always counted a runtime failure (exit 1), or the reverse,
 * the exit status stays. Returns -1. */
int ctl_fail_as(reel_code_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A request the broker (or the way to it) failed, as the error value:
 * "<fmt's text>: <e's code>: <e's message>", exit status 1 whatever the
 * broker's code (timeout for "timeout"; state when it was busy, had no
 * worker, a stale version or lost the worker; io otherwise). -1. */
int ctl_fail_wire(const wire_err_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads tensor `name` of safetensors file `path` widened to F32; it must
 * have rank ndim; its shape goes to shape. NULL with the error value set,
 * its code one of exit status 2 (invalid, not_found, limit), also for NaN
 * or infinite values (a model input is judged as a worker judges it). The
 * caller frees. */
float *ctl_read_tensor(const char *path, const char *name, int ndim, int64_t *shape);
/* Parses "FxHxW" into out: three integers in 1..MSG_MAX_DIM with F x H x
 * W at most MSG_MAX_FHW (what a GEN's latent may be). 0, or -1 with a
 * REEL_E_INVALID error naming `what` (the option) and the text. */
int ctl_size_parse(const char *s, const char *what, int64_t out[3]);
/* --size as `run` and `gen` both take it: a latent FxHxW (into latent, as
 * ctl_size_parse; pixels set to 0), or Wan's pixel form W*H ("832*480",
 * generate.py's --size; each 8..524288 and a multiple of 16) into pixels,
 * the latent then made by ctl_size_finish. 0, or -1 with a
 * REEL_E_INVALID error naming `what` and saying both forms. */
int ctl_size_parse_any(const char *s, const char *what, int64_t latent[3], int64_t pixels[2]);
/* After the options: a pixel size (pixels[0] != 0) becomes the latent
 * Wan's VAE gives frame_num frames of it (0: 81, generate.py's default):
 * F = (frame_num - 1)/4 + 1, H/8, W/8, within a GEN's limits; frame_num
 * without a pixel size is refused. 0, or -1 with a REEL_E_INVALID error. */
int ctl_size_finish(int64_t latent[3], const int64_t pixels[2], int frame_num);
/* --prompt and --negative-prompt (either may be NULL) by a GEN's text rule
 * (msg_text_ok), so a prompt `run` takes `gen` takes; an empty --prompt is
 * refused by both (CTL_EMPTY_PROMPT; an empty --negative-prompt is Wan's
 * default). 0, or -1 with a REEL_E_INVALID error naming the option. */
int ctl_prompts_check(const char *prompt, const char *negative);
/* One request of a `gen --prompts FILE` file (gen_prompts.c). */
typedef struct {
    int line;                   /* its line in the file, from 1 */
    char *prompt;               /* its prompt (never empty) */
    char *negative;             /* a JSON line's negative_prompt; NULL: none given */
    bool has_seed;              /* a JSON line gave its seed ... */
    uint64_t seed;              /* ... this one */
} ctl_prompt_line_t;
#define CTL_PROMPTS_MAX 100000             /* requests a --prompts file may hold */
#define CTL_PROMPTS_MAX_BYTES (64 << 20)   /* and its size */
/* Reads the --prompts file at path: one request per line (a CRLF file
 * too; a UTF-8 byte order mark at its start is skipped, a UTF-16 file
 * refused); a blank line (spaces and tabs only) is none; a line whose first
 * non-blank byte is '{' is a JSON object {"prompt": TEXT, "seed": N,
 * "negative_prompt": TEXT} (prompt required; no other key); any other line
 * is the prompt as it stands. Each text by a GEN's rule, as --prompt's
 * (ctl_prompts_check): not empty, at most MSG_MAX_PROMPT_BYTES, UTF-8
 * without control characters but tab, no NUL byte; no CR inside a line
 * (a file of CR line ends would be one request). 0 with *lines (n of
 * them, at least 1; free with ctl_prompt_lines_free), or -1 with the
 * error value naming the file and the line: not_found (no file), limit
 * (more than CTL_PROMPTS_MAX requests or CTL_PROMPTS_MAX_BYTES), invalid
 * (a bad line, no request at all), io, nomem. */
int ctl_prompt_lines(const char *path, ctl_prompt_line_t **lines, size_t *n);
/* Frees what ctl_prompt_lines returned; NULL-safe. */
void ctl_prompt_lines_free(ctl_prompt_line_t *lines, size_t n);
/* Why an empty --prompt is refused, and how to get what it would mean in
 * Wan2.1 (the end-of-sequence token alone): the Python client's message
 * says the same (clients/python/reel/client.py). */
#define CTL_EMPTY_PROMPT                                                                                          \
    "--prompt is empty: a GEN reads an empty prompt as none (docs/PROTOCOL.md), so run and gen refuse it alike; " \
    "for Wan2.1's empty-prompt context (the end-of-sequence token alone) write it with reelctl encode --t5 T5 "   \
    "--tokenizer PATH --prompt '' -o C.safetensors and give --context C.safetensors"
/* What `run --prompt` and `gen --prompt` take for a sampling flag not
 * given: Wan2.1's generate.py text-to-video defaults (--sample_solver
 * unipc, sample_steps 50, sample_shift 5.0, sample_guide_scale 5.0), so
 * a prompt alone samples as Wan does (docs/MODEL.md, "Samplers"). */
#define CTL_WAN_T2V_SOLVER "unipc"
#define CTL_WAN_T2V_STEPS 50
#define CTL_WAN_T2V_SHIFT 5.0
#define CTL_WAN_T2V_CFG 5.0
/* Fills what a prompt run was not given with those defaults: steps < 0,
 * shift NaN, cfg when !*have_cfg (then set), and the solver when
 * !solver_given and not sde: returned (NULL: keep the run's). took[len]
 * names what was filled (" --solver unipc --steps 50 ..."; "" for none). */
const char *ctl_wan_t2v_fill(bool solver_given, bool sde, int *steps, double *shift, bool *have_cfg, double *cfg,
                             char *took, size_t len);
/* The note on stderr naming the defaults a prompt run took ("" when it
 * took none): piped (NULL or "": none), those it took from the file
 * `from` (a diffusers pipeline's scheduler config), first, then Wan's. */
void ctl_wan_defaults_note(const char *cmd, const char *took, const char *piped, const char *from);
/* Wan2.1's generate.py spellings that `run` and `gen` take as their own
 * flags' aliases (the same meaning): --sample_solver (--solver),
 * --sample_steps (--steps), --sample_shift (--shift), --sample_guide_scale
 * (--cfg), --base_seed (--seed), --negative_prompt (--negative-prompt).
 * ctl_base_seed reads --base_seed into *seed: a non-negative integer; -1,
 * generate.py's "draw a random seed", is refused naming --seed. 0, or -1
 * with a REEL_E_INVALID error. */
int ctl_base_seed(const char *v, uint64_t *seed);
/* A generate.py flag with no alias here (--ckpt_dir, --save_file, --task):
 * -1 with a REEL_E_INVALID error naming Reel's way, `reel` ("--weights
 * DIR"). */
int ctl_wan_flag_refused(const char *flag, const char *reel);
/* A model config from a JSON file {"name": ..., "dim": ..., ...} (at most
 * 64 KiB). 0, or -1 with the error value set. */
int ctl_config_from_json(const char *path, tdit_config_t *c);
/* Monotonic seconds. */
double ctl_now(void);
/* A progress bar on stderr when it is a terminal ("\r[####....] what 3/8",
 * a newline at done == total); nothing otherwise. */
void ctl_progress(const char *what, int64_t done, int64_t total);
/* Refuses an output path that would replace one of the command's inputs:
 * after out, pairs of (option name, path; NULL: not given), ended by a
 * NULL option name. An input file is matched as the same file (links
 * followed); an input folder (a release, an adapter) by an existing file
 * below it named like a checkpoint, config or tokenizer (.safetensors,
 * .pth, .pt, .bin, .json, .model). 0, or -1 with a REEL_E_INVALID error
 * naming both. */
int ctl_out_spares(const char *out, ...) __attribute__((sentinel));
/* Whether path ends in ext (".mp4") after at least one character. */
bool ctl_has_ext(const char *path, const char *ext);
/* 0 when the folder out would be written in exists (a bare name: the
 * current one); else -1 with a REEL_E_INVALID error naming it, before any
 * work is done for a file that could not be written. */
int ctl_out_folder(const char *out);
/* 0 when path is absent or a regular file; else -1 with a REEL_E_INVALID
 * error naming it: a device, FIFO, directory or symlink is never replaced
 * (the rule of st_writer_save). Checked before any work, and again as
 * each output is written. */
int ctl_out_file(const char *path);
/* Writes n bytes to path (replaced whole, through a temporary file; a
 * path that is not a regular file is refused, ctl_out_file). 0, or -1 with
 * an IO error naming the path. */
int ctl_write_bytes(const char *path, const void *p, size_t n);
/* Writes uint8 data of shape[0..ndim) as a NumPy .npy file (format 1.0,
 * '|u1', C order): what `np.load` reads. 0 or -1 as ctl_write_bytes. */
int ctl_write_npy_u8(const char *path, const uint8_t *data, int ndim, const int64_t *shape);
/* True when stderr is a terminal. */
bool ctl_tty(void);

#endif
