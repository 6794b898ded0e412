/* brk_upload.h -- weights by value (internal header; docs/PROTOCOL.md,
 * "Weights by value"). A trainer with no filesystem shared with the
 * workers sends a safetensors file to the broker in UPLOAD chunks; the
 * broker writes it under --weights-dir as it comes, hashing it, and keeps
 * it when all of it came and its sha256 is the one announced. A SYNC with
 * "uploaded" then names it, and workers FETCH it back in chunks.
 *
 * Files: DIR/.COMPONENT-vVERSION.part while it comes (a new file, or a
 * spare written over: DIR/.spare-N, a removed version's data file kept
 * for that; its old bytes are never served, and its tail is cut at the
 * end), then DIR/COMPONENT-vVERSION.safetensors beside
 * DIR/COMPONENT-vVERSION.sha256 (its digest, written after the file is
 * renamed, not synced to disk: a file without its .sha256 was never
 * complete and is not served; one a power loss left torn is caught by
 * the workers' sha256 check). Chunks must come in order: one at any
 * other offset is not written, and the UPLOAD_ACK says where to go on,
 * so an interrupted upload resumes where the broker's copy ends (while
 * the broker runs: a .part found at startup is removed). At most
 * BRK_UPLOADS_MAX uploads are open at once; each holds at most 6 chunks
 * in memory (the one coming, 4 waiting for its hashing thread and the one
 * it hashes: the sha256 is taken off the routing thread, in order; the
 * last chunk's digest is waited for, a few ms).
 *
 * A leaf module: the loop calls the first two, brk_sync asks the third.
 * Its files, one per phase, are listed in brk_upload_int.h. */
#ifndef REEL_BROKER_BRK_UPLOAD_H
#define REEL_BROKER_BRK_UPLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include "broker/brk_broker.h"

#define BRK_UPLOADS_MAX 4
#define BRK_FETCH_PARKED_MAX 4096  /* FETCHes waiting for an upload's bytes, per upload (4 per worker) */
#define BRK_UPLOAD_IDLE_MS 600000  /* an open upload with no chunk for this long is given up */
#define BRK_UPLOAD_STALE_MS 60000  /* ... or for this long when a new upload needs its slot */
/* The log's kind (brk_log_kind, b->request_log) of the lines an upload
 * writes as it ends or stalls: a trainer's uploads in a loop, or its
 * retries of a chunk that cannot be written, are one line each. */
#define BRK_UPLOAD_LINES "uploads"
#define BRK_SOURCE_UPLOADED "uploaded" /* a version's source in the catalog when it came by UPLOAD */

/* For tests: uploads hash on the routing thread, as when an upload's
 * hashing thread cannot start (false: they start one). */
extern bool brk_upload_no_hash_thread;

/* One UPLOAD chunk from `from` (a trainer: the loop checked the role):
 * written, answered UPLOAD_ACK, or refused ERROR. m: the message u was
 * decoded from (NULL: none): a FETCH waiting for exactly this chunk is
 * answered with its frame, shared with ZeroMQ (no read back, no copy).
 * from NULL: a chunk of the active broker's copy (brk_ha_copy.c), taken
 * as a trainer's, answered to no one (its refusals are logged; the
 * caller reads brk_upload_progress and brk_upload_stored after). */
void brk_upload_chunk(brk_t *b, const zmq_msg_t *from, uint64_t id, const msg_upload_t *u, const wire_msg_t *m);
/* True with *received when an upload of exactly these bytes is open. */
bool brk_upload_progress(brk_t *b, const char *component, uint64_t version, const char *sha256, uint64_t *received);
/* Gives up the open upload of exactly these bytes, if any (its .part
 * removed, FETCHes waiting on it answered ERROR). */
void brk_upload_drop(brk_t *b, const char *component, uint64_t version, const char *sha256);
/* One FETCH from `from`: FETCH_DATA or ERROR. worker_side: on the worker
 * socket (a version still coming is served as its bytes come); else on
 * the client socket, from the peer broker of a pair copying what it
 * would serve after a takeover: stored versions only. */
void brk_upload_fetch(brk_t *b, bool worker_side, const zmq_msg_t *from, uint64_t id, const msg_fetch_t *f);
/* True when version `version` of component is stored complete with this
 * sha256 (either case); else false with why as the thread's error value
 * (base/error.h): REEL_E_UNSUPPORTED without a weights dir,
 * REEL_E_NOT_FOUND when the version is not stored, REEL_E_INVALID when it
 * is stored with other weights (each answered bad_request; an UPLOAD of
 * other weights is stale_version). */
bool brk_upload_stored(brk_t *b, const char *component, uint64_t version, const char *sha256);
/* The same, or an upload of exactly these bytes is in progress: a SYNC
 * may name it before its last chunk came, and workers' FETCHes of bytes
 * still to come wait for them (answered ERROR if the upload fails).
 * False with why as above; REEL_E_INVALID when other bytes are coming. */
bool brk_upload_held(brk_t *b, const char *component, uint64_t version, const char *sha256);
/* Retention (--weights-keep N): component's current version is now
 * `current`; the files of uploaded versions older than it are removed but
 * for the N-1 newest (versions newer than current, pending or coming, are
 * never touched), and but for `base` (0: none), the full version a current
 * LoRA adapter is on, kept besides. Nothing with N = 0. The last two data files removed
 * are kept as spares the next uploads write over: on this project's VMs
 * writing 1.2 GB into a new file cost 2.2 CPU-s, over an old one 0.12
 * (docs/BENCH.md). */
void brk_upload_prune(brk_t *b, const char *component, uint64_t current, uint64_t base);
/* Gives up uploads that had no chunk for BRK_UPLOAD_IDLE_MS (their .part
 * removed, FETCHes waiting on them answered ERROR). */
void brk_upload_timers(brk_t *b, int64_t now);
/* Removes the .part files a previous run left (startup) and frees what
 * open uploads hold (shutdown: their .part files are removed too). */
void brk_upload_start(brk_t *b);
void brk_upload_stop(brk_t *b);
/* The upload slots' invariants (brk_check.h): 0, or -1 with the first
 * broken one as a REEL_E_INTERNAL error (base/error.h). Takes and
 * releases the upload and hashing locks; reads the state only. */
int brk_upload_check(const brk_t *b);

#endif
