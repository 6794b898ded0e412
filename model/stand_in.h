/* stand_in.h -- files that stand where a checkpoint should be: a Git LFS
 * pointer (what `git clone` without git-lfs leaves in place of every large
 * file of a Hugging Face repository) or an HTML page (a download that
 * saved the site's sign-in or error page under the file's name).
 *
 * Every reader of a .safetensors or .pth file (model/safetensors.c,
 * model/pth.c, and so the DiT, its shards, the text encoder, the VAE and a
 * LoRA adapter) passes the file's first bytes here before judging them as
 * its format, so the user is told what the file is and how to get the real
 * one instead of "header length ... is absurd". */
#ifndef REEL_MODEL_STAND_IN_H
#define REEL_MODEL_STAND_IN_H

#include <stddef.h>

/* How many leading bytes stand_in_check wants to see (fewer when the file
 * is shorter). */
#define STAND_IN_HEAD 256

/* Judges the first n bytes of the file `origin` (head; n may be less than
 * STAND_IN_HEAD). 0 when they are neither a Git LFS pointer nor an HTML
 * page; else -1 with a REEL_E_INVALID error naming origin and what to do:
 * "X is a Git LFS pointer, not the file (run `git lfs pull` in its
 * repository; the file is N bytes)" or "X is an HTML page, not the file
 * (...)". Can't fail otherwise. */
int stand_in_check(const char *origin, const void *head, size_t n);

#endif
