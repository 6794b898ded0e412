/* wrk_weights.h -- reading a weights file a peer named (a SYNC's path),
 * so that no peer can make the worker read what it should not, block on
 * it, burn a core on it, or learn anything about it.
 *
 *   - Only under the weights roots (--weights-dir, or the directory of
 *     --weights): the path must be absolute, name a root, and go down from
 *     it through plain components; each is opened with openat and
 *     O_NOFOLLOW, so no symlink and no ".." leads out (or anywhere).
 *   - Regular files only: the file is opened O_NONBLOCK (a FIFO does not
 *     wait for a writer) and fstat'ed before a byte is read.
 *   - Judged by its size first: its header must fit the file
 *     (st_probe_fd) and its data the model (at most every parameter in
 *     F32), before anything hashes or loads it.
 *   - Read once: the bytes are hashed as they are loaded (st_open_fd's
 *     hook), and the read stops within one chunk (4 MiB) of the worker
 *     stopping.
 *   - What goes back over the wire is one of the generic texts below; the
 *     detail (the path, errno, what the header said) is only logged. */
#ifndef REEL_WORKER_WRK_WEIGHTS_H
#define REEL_WORKER_WRK_WEIGHTS_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "model/safetensors.h"
#include "model/tinydit.h"

#define WRK_MAX_ROOTS 8

/* The errors a peer sees (SYNC_ACK "error"), whatever the detail. Every
 * function below that fails leaves one of them as the error value's
 * message (reel_err()->msg: what the ack carries) and the specific reason
 * (the path, errno, what the header said) as its detail, for the log
 * only (reel_err_text()). */
#define WRK_E_PATH "bad_weights: path not under the worker's weights directories"
#define WRK_E_FILE "bad_weights: not a safetensors file"
#define WRK_E_MODEL "bad_weights: not weights of this worker's model"
#define WRK_E_STOPPED "worker stopping"
#define WRK_E_NONFINITE "bad_weights: NaN or infinite values"
#define WRK_E_DIVERGED "bad_weights: values of 2^24 or more"
#define WRK_WEIGHT_EXP 24        /* a weight's |x| must stay below 2^24 (1.7e7) */
#define WRK_E_NO_LORA "bad_adapter: this worker takes no LoRA syncs (start it with --lora)"
#define WRK_E_BASE "bad_adapter: its base version is not this worker's base"

/* Records a refusal: code, `answer` (what the peer is told) as the
 * message and the printf-formatted reason as the detail. Returns -1. */
int wrk_refuse(reel_code_t code, const char *answer, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The failure model/wan_ckpt.h just recorded, made the answer a peer
 * gets: WRK_E_STOPPED for REEL_E_STATE, WRK_E_MODEL for
 * REEL_E_UNSUPPORTED, WRK_E_FILE for anything else; its code kept, its
 * text the detail. Returns -1. */
int wrk_weights_refused(void);

/* 0 when every tensor of f holds finite values only, each of magnitude
 * below 2^WRK_WEIGHT_EXP, else -1 (REEL_E_INVALID, WRK_E_NONFINITE or
 * WRK_E_DIVERGED) with the first tensor that does not named in the
 * detail: a diverged trainer's weights are refused, not served (every GEN
 * would come back NaN; no trained DiT's weight comes near 2^24). */
int wrk_weights_finite(const st_file_t *f);

/* Where a worker may read weights from. */
typedef struct {
    int n;
    char given[WRK_MAX_ROOTS][PATH_MAX];  /* as configured (a path may name a root through it) */
    char real[WRK_MAX_ROOTS][PATH_MAX];   /* its realpath: what is opened */
} wrk_roots_t;

/* Adds the directory dir (it must exist) as a root. 0, or -1 with a
 * message in reel_err_text() (missing, not a directory, more than
 * WRK_MAX_ROOTS). */
int wrk_roots_add(wrk_roots_t *r, const char *dir);
/* Adds the directory holding file (the default root: where --weights is). */
int wrk_roots_add_dir_of(wrk_roots_t *r, const char *file);

/* Opens path for reading when it is a regular file under a root reached
 * without a symlink or "..". Returns the descriptor (O_RDONLY|O_NONBLOCK,
 * the caller closes it), or -1 with the message WRK_E_PATH (the path
 * itself is not allowed: this depends on the text alone; REEL_E_INVALID,
 * REEL_E_LIMIT) or WRK_E_FILE (anything found on disk: missing, a
 * symlink, a FIFO, unreadable: one answer, so the answer tells nothing of
 * what is there; REEL_E_NOT_FOUND, REEL_E_INVALID, REEL_E_IO). */
int wrk_weights_open(const wrk_roots_t *r, const char *path);

/* The directory holding the last component of path, reached as
 * wrk_weights_open reaches a file (under a root, every directory opened
 * with O_NOFOLLOW); *last points at that component inside path. The
 * descriptor (the caller closes it), or -1 as wrk_weights_open. */
int wrk_weights_open_dir(const wrk_roots_t *r, const char *path, const char **last);

/* Reads the checkpoint at path in any layout model/wan_ckpt.h reads
 * (a Reel file, a Wan2.1 release file or folder, a sharded index or its
 * folder, a diffusers folder or pipeline root). r NULL: the operator's
 * path (--weights; symlinks followed); else a peer's: under the roots as
 * above, and every file of the checkpoint below the directory reached,
 * none through a symlink. Every file is judged by its header first
 * (against expect: the running model, whose config also stands in for a
 * file that carries none; and by size: at most max_data bytes of data
 * and, with max_data, at least half of it in tensors), then read once and
 * hashed as read; stop (NULL: never) ends the read within a chunk. Returns
 * the weights under Reel's names with the config in their metadata, hex
 * the identity a sync announces (wan_ckpt.h), or NULL with the message
 * WRK_E_PATH (as wrk_weights_open), or, as wrk_weights_refused says,
 * WRK_E_FILE, WRK_E_MODEL or WRK_E_STOPPED. */
st_file_t *wrk_weights_load(const wrk_roots_t *r, const char *path, const tdit_config_t *expect, uint64_t max_data,
                            const atomic_bool *stop, char hex[65]);

/* Reads the weights file open at fd, judged first by its size: its
 * header must fit the file, and its data be at most max_data bytes (0: no
 * bound); then it is read once, hashed as it is read (hex), and parsed.
 * stop (NULL: never) is checked between chunks. Returns the file, or NULL
 * with the message WRK_E_FILE (its code safetensors'), WRK_E_MODEL
 * (REEL_E_UNSUPPORTED: sizes no file of the model has) or WRK_E_STOPPED
 * (REEL_E_STATE). */
st_file_t *wrk_weights_read(int fd, const char *path, uint64_t max_data, const atomic_bool *stop, char hex[65]);
/* wrk_weights_read for a LoRA adapter's weights: at most max_data bytes
 * of data, however few (an adapter is a sliver of the model). */
st_file_t *wrk_adapter_read(int fd, const char *path, uint64_t max_data, const atomic_bool *stop, char hex[65]);

#endif
