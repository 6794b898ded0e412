/* sha256.h -- the one SHA-256 of Reel (OpenSSL's libcrypto underneath): weights
 * files are named by their digest in SYNC (docs/PROTOCOL.md: 64 hex
 * digits; Reel writes lowercase and compares either case), and workers
 * check what they load against it. The broker hashes only the files
 * trainers upload to it (broker/brk_upload.h); a SYNC by path it checks
 * for form alone (msg_sha256_valid). */
#ifndef REEL_BASE_SHA256_H
#define REEL_BASE_SHA256_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Lowercase hex digest of the concatenation of the n buffers p[i] of
 * len[i] bytes into hex (65 bytes). Can't fail. */
void reel_sha256_parts(const void *const *p, const size_t *len, int n, char hex[65]);
/* Of one buffer. Can't fail. */
void reel_sha256_buf(const void *p, size_t len, char hex[65]);
/* Of everything readable from fd, from its current offset. 0, or -1 with
 * an error value (base/error.h). */
int reel_sha256_fd(int fd, char hex[65]);
/* Of a file. 0, or -1 with an error naming it (base/error.h). */
int reel_sha256_file(const char *path, char hex[65]);

/* A digest fed piece by piece (bytes hashed as they are read elsewhere).
 * new: NULL on out-of-memory; update can't fail; final writes the digest
 * and frees *h (NULL-safe: *h = NULL after either). */
typedef struct reel_sha256 reel_sha256_t;
reel_sha256_t *reel_sha256_new(void);
void reel_sha256_update(reel_sha256_t *h, const void *p, size_t len);
void reel_sha256_final(reel_sha256_t **h, char hex[65]);
void reel_sha256_free(reel_sha256_t **h);

/* A file hashed as it is read, stoppable within a chunk: the state a
 * reader's per-chunk hook (model/safetensors.h, st_read_hook_t) is handed
 * as its user pointer. The caller owns h (new, then final or free). */
typedef struct {
    reel_sha256_t *h;          /* the digest the chunks feed */
    const atomic_bool *stop;   /* NULL: never stops */
    bool stopped;              /* a chunk was refused because *stop was set */
} reel_sha256_hook_t;
/* The hook: feeds the n bytes at p to ((reel_sha256_hook_t *)user)->h and
 * returns 0; when *stop is set it hashes nothing, sets stopped and returns
 * -1 (the reader then fails, and the caller tells a stop by `stopped`). */
int reel_sha256_hook(void *user, const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
