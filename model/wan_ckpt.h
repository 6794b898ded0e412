/* wan_ckpt.h -- Wan2.1 checkpoints as they are published, read as Reel's
 * own weights files (docs/MODEL.md, "Which Wan releases load").
 *
 * A checkpoint is named by one path: a safetensors file, a sharded index
 * (*.safetensors.index.json) or a folder holding either. Layouts:
 *   reel                a safetensors file whose __metadata__ holds Reel's
 *                       config keys (tinydit.h: tdit_config_from_meta);
 *   wan-original        diffusion_pytorch_model.safetensors without them and
 *                       Wan's config.json beside it (dim, num_heads, ...);
 *   wan-sharded         an index whose weight_map names the shard of every
 *                       tensor, shards beside it, Wan's config.json;
 *   diffusers           WanTransformer3DModel's config.json and its file (or
 *                       index and shards), tensors under diffusers' names
 *                       (condition_embedder.*, attn1.to_q, scale_shift_table..);
 *   diffusers-pipeline  a pipeline root: model_index.json and transformer/
 *                       holding the diffusers layout.
 * F32, BF16 and F16 tensors in any of them. Whatever the layout, the
 * result is an st_file_t that looks like a Reel file: the tensors under
 * Reel's names (TINYDIT.md's list, which is Wan's model.py), exactly the
 * model's, and __metadata__ with the config keys (text_len included), so
 * tdit_model_load and tdit_model_reload take it as they take Reel's own.
 *
 * What is refused, with a message naming what was found: anything but a
 * text-to-video DiT of this family (model_type i2v, flf2v, vace; in_dim !=
 * out_dim; image-embedding tensors: img_emb.*, condition_embedder.
 * image_embedder.*, k_img, v_img, add_k_proj; another class name), a
 * config Reel computes differently (patch size, eps, qk or cross-attention
 * norms), missing tensors, tensors in two shards, tensors of no Wan2.1
 * T2V transformer, wrong shapes, a shard the index names outside the
 * checkpoint's folder ("../x", "a/b") or missing.
 *
 * Reading: every file is opened relative to the checkpoint's folder
 * (openat; with nofollow, no symlink is followed anywhere, as a sync a peer
 * named requires), a regular file only, without blocking. Every file's
 * header is read and judged first (names, shapes, config, total size)
 * before any data is read; then each file's data is read once, straight
 * into one buffer the st_file_t owns (no copy), and every byte is hashed
 * as it is read.
 *
 * Identity (what a sync announces as its sha256; docs/PROTOCOL.md): for a
 * checkpoint of one file, the sha256 of that file's bytes (config.json is
 * judged, not hashed); for one given through an index, the sha256 of the
 * index file's bytes followed by the 32-byte sha256 of each shard's bytes,
 * shards in byte order of their names.
 *
 * Every failure returns -1 / NULL with the error value (base/error.h): a
 * message naming the file and, where one is involved, the tensor and the
 * shard, and a code that says what kind of failure it was, so a worker can
 * answer a generic reason:
 *   REEL_E_NOT_FOUND    a file missing (the checkpoint, a shard, transformer/);
 *   REEL_E_IO           a file there but unreadable (permissions, a read error);
 *   REEL_E_INVALID      a file malformed or not allowed: not a regular file,
 *                       not safetensors, a bad config.json or index, a
 *                       symlink with nofollow, no checkpoint in a folder;
 *   REEL_E_LIMIT        a path, config.json, index or shard count over its bound;
 *   REEL_E_NOMEM        out of memory;
 *   REEL_E_UNSUPPORTED  a checkpoint, but not of the model wanted: foreign,
 *                       another config, sizes or tensors;
 *   REEL_E_STATE        opts.stop was set while reading. */
#ifndef REEL_MODEL_WAN_CKPT_H
#define REEL_MODEL_WAN_CKPT_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"
#include "model/tinydit.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    WAN_LAYOUT_REEL = 0,
    WAN_LAYOUT_ORIGINAL,
    WAN_LAYOUT_SHARDED,
    WAN_LAYOUT_DIFFUSERS,
    WAN_LAYOUT_PIPELINE,
} wan_layout_t;

/* "reel", "wan-original", "wan-sharded", "diffusers", "diffusers-pipeline". */
const char *wan_layout_name(wan_layout_t l);

typedef struct {
    bool nofollow;                /* no symlink followed anywhere (a sync a peer named) */
    bool no_data;                 /* hash every byte but keep no data: wan_ckpt_file is NULL (inspect) */
    const tdit_config_t *expect;  /* the network it must be (a worker's model), and the config of a
                                   * file that carries none (no Reel metadata, no config.json); NULL: none */
    uint64_t max_data;            /* most data bytes over all files, and with it, too few bytes to hold
                                   * the model (less than half) is refused; 0: every parameter in F32,
                                   * no lower bound */
    const atomic_bool *stop;      /* checked between 4 MiB chunks; NULL: never */
} wan_opts_t;

/* A file of a checkpoint (a shard, or the one file). */
typedef struct {
    char name[PATH_MAX];          /* relative to the path given ("transformer/x.safetensors" in a
                                   * pipeline; the file's own name when a file was given) */
    uint64_t bytes;               /* its size */
    char sha256[65];              /* of its bytes, lowercase hex */
} wan_file_t;

/* What a checkpoint holds. */
typedef struct {
    size_t tensors;                   /* Reel's (a Reel file: every tensor in it) */
    int64_t parameters;               /* of the config */
    size_t dtype_count[KERN_DTYPE_COUNT]; /* tensors per dtype */
    uint64_t tensor_bytes;            /* the tensors' bytes */
    uint64_t file_bytes;              /* the safetensors files' sizes (index and config.json not counted) */
} wan_summary_t;

typedef struct wan_ckpt wan_ckpt_t;

/* Opens the checkpoint at path (a file, an index or a folder), reads and
 * judges it as the header comment says. o NULL: defaults (symlinks
 * followed, data kept, no expectation). Returns it (wan_ckpt_destroy), or
 * NULL with the error value (its code the kind, as above). */
wan_ckpt_t *wan_ckpt_open(const char *path, const wan_opts_t *o);
/* As wan_ckpt_open, for the entry `name` (a file or a folder; one plain
 * component) of the open directory dirfd, or the directory itself when
 * name is NULL or "". dirfd stays the caller's. `shown` names the
 * checkpoint in messages (the path as given). */
wan_ckpt_t *wan_ckpt_openat(int dirfd, const char *name, const char *shown, const wan_opts_t *o);
/* Frees *c (and its file unless taken) and sets *c = NULL; NULL-safe. */
void wan_ckpt_destroy(wan_ckpt_t **c);

/* The weights, Reel names and metadata (owned by c; NULL with no_data). */
const st_file_t *wan_ckpt_file(const wan_ckpt_t *c);
/* The weights, handed over (st_close them); c keeps nothing. NULL with
 * no_data or when taken already. */
st_file_t *wan_ckpt_take(wan_ckpt_t *c);
/* Its config (text_len set from Wan's config.json; 512 for diffusers). */
const tdit_config_t *wan_ckpt_config(const wan_ckpt_t *c);
wan_layout_t wan_ckpt_layout(const wan_ckpt_t *c);
/* The identity a sync announces (lowercase hex, see above). */
const char *wan_ckpt_identity(const wan_ckpt_t *c);
/* The safetensors files read, in the order of their names; the index
 * (NULL when none was read). */
size_t wan_ckpt_n_files(const wan_ckpt_t *c);
const wan_file_t *wan_ckpt_file_at(const wan_ckpt_t *c, size_t i);
const wan_file_t *wan_ckpt_index(const wan_ckpt_t *c);
void wan_ckpt_summary(const wan_ckpt_t *c, wan_summary_t *out);

/* The checkpoint at path loaded with the defaults, handed over as one
 * st_file_t (st_close it): what `reelctl run --weights` and
 * tdit_model_load_path take. NULL with a message. */
st_file_t *wan_ckpt_load(const char *path);

/* A file already in memory (an upload fetched from the broker) made a
 * Reel file: a Reel file stays as it is; one without Reel metadata must
 * hold exactly cfg's tensors under Wan's or diffusers' names, which it
 * gets under Reel's names with cfg as its metadata, over the same data
 * buffer (no copy). 0 with *f replaced, or -1 with *f closed and a
 * message naming the tensor: REEL_E_UNSUPPORTED (not cfg's model),
 * REEL_E_INVALID when cfg is NULL and there is no config to judge it by,
 * REEL_E_NOMEM. */
int wan_ckpt_adopt(st_file_t **f, const tdit_config_t *cfg);

/* Writes the checkpoint at path as one Reel file at out_path (Reel names,
 * the config with text_len in __metadata__, dtypes kept), atomically as
 * st_writer_save does. 0, or -1 with a message (out_path untouched). */
int wan_ckpt_pack(const char *path, const char *out_path);

/* What `reelctl sync` announces for the checkpoint at path, read whole
 * and judged first (as a worker would, without a running model):
 *   by path (upload false): path = the realpath of what was given (file,
 *   index or folder: a worker reads it the same way), sha256 = its
 *   identity;
 *   by upload: a checkpoint of one file sends that file (path = its
 *   realpath, sha256 = its bytes'); any other is packed into one Reel file
 *   in a new temporary folder (wan_sync_source_done removes it), and the
 *   identity announced is the packed file's.
 * One safetensors file this side cannot judge (no Reel metadata and no
 * config.json beside it: its config is the running model's) goes as it
 * is, path its realpath and sha256 its bytes': each worker judges it. */
typedef struct {
    char path[PATH_MAX];
    char sha256[65];
    char tmpdir[PATH_MAX];        /* "" unless packed */
} wan_sync_source_t;
int wan_sync_source(const char *path, bool upload, wan_sync_source_t *out);
/* Removes what wan_sync_source packed, if anything. NULL-safe; can't fail. */
void wan_sync_source_done(wan_sync_source_t *s);

#ifdef __cplusplus
}
#endif
#endif
