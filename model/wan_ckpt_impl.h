/* wan_ckpt_impl.h -- what wan_ckpt.c and wan_names.c share: the model's
 * tensors looked up under Wan's or diffusers' names, and config.json read.
 * Nothing outside model includes it. */
#ifndef REEL_MODEL_WAN_CKPT_IMPL_H
#define REEL_MODEL_WAN_CKPT_IMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "model/wan_ckpt.h"

#define WAN_TEXT_LEN 512   /* Wan2.1 T2V's text_len; diffusers' WanPipeline pads to it too */
#define WAN_DNAME 112      /* longest diffusers name Reel derives, with room */

/* The error recorded on this thread (by safetensors, the sha256 hook, a
 * config) made a file problem as wan_ckpt.h's codes say: REEL_E_STATE
 * when stopped, else its own code unless that says "not this model" or
 * "not now" (REEL_E_UNSUPPORTED, REEL_E_STATE), which a file that cannot
 * be read is not: REEL_E_INVALID. Message and detail kept; returns -1. */
int wan_file_problem(bool stopped);
/* The code of a file that cannot be opened or read with errno e:
 * REEL_E_NOT_FOUND (ENOENT), REEL_E_INVALID (a symlink refused: ELOOP,
 * ENOTDIR), REEL_E_NOMEM, else REEL_E_IO. */
reel_code_t wan_errno_code(int e);

/* A plain file name: one component, not "." or "..". */
bool wan_plain_name(const char *s);
bool wan_ends_with(const char *s, const char *suffix);

typedef enum { NAMES_ANY = 0, NAMES_WAN, NAMES_DIFFUSERS } names_t;

/* One tensor as a file holds it, wherever its bytes are. */
typedef struct {
    const char *name;
    kern_dtype_t dtype;
    int ndim;
    int64_t shape[KERN_MAX_DIMS];
    uint64_t begin;          /* in the one data buffer */
    size_t nbytes;
    size_t part;             /* which file */
} item_t;

typedef struct {
    const char *name;
    size_t idx;
} wkey_t;

/* The model's weights, found by name as a checkpoint's tensors come. */
typedef struct {
    tdit_weight_t *w;
    size_t n;
    char (*dname)[WAN_DNAME];
    wkey_t *wan, *diff;       /* sorted by name */
    const item_t **slot;     /* per weight: where it was found; NULL before */
    names_t names;           /* the naming seen so far */
    const char *named_by;    /* the first tensor that set it */
    bool reel;               /* a Reel file: other tensors pass, as they always did */
} match_t;

/* The tables of config c's weights; reel: a Reel file (only Reel's names,
 * other tensors pass as they always did). 0, or -1 with a message. */
int wan_match_init(match_t *m, const tdit_config_t *c, bool reel);
void wan_match_free(match_t *m);
/* Records one tensor of file `where` (part_name[it->part] names its file);
 * -1 with REEL_E_UNSUPPORTED on a tensor that is not the model's (foreign:
 * an image embedding..., or unknown), a second copy, a mixed naming or a
 * wrong shape. it must live as long as m. */
int wan_match_add(match_t *m, const item_t *it, const char *where, const char *const *part_name);
/* -1 (REEL_E_UNSUPPORTED) naming the first weight no file held, else 0. */
int wan_match_missing(const match_t *m, const char *where);
/* A Reel header over every weight found (after wan_match_missing): c as
 * __metadata__, Reel's names, each tensor where its item says. Malloc'd
 * JSON text of *len bytes, or NULL with a message. */
char *wan_reel_header(const match_t *m, const tdit_config_t *c, wan_layout_t layout, size_t *len);
wan_layout_t wan_layout_by_names(names_t names, bool sharded, bool pipeline);

/* The config of config.json j, Wan's own or diffusers' (*diffusers says
 * which), named after the built-in config of its network ("custom" else).
 * -1 with REEL_E_INVALID (malformed) or REEL_E_UNSUPPORTED (a model Reel
 * does not serve) and a message naming `where`. */
int wan_json_config(const json_t *j, const char *where, tdit_config_t *c, bool *diffusers);

#endif
