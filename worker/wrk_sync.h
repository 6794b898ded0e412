/* wrk_sync.h -- weight syncs: SYNC from the broker, applied between steps.
 *
 * A sync thread takes SYNC messages in order. For each it checks the
 * component ("transformer") and version (not older than the applied one:
 * else SYNC_ACK ok=false "stale"), reads the weights (a path, or the
 * inline tensors written to a temporary safetensors file; a path only under
 * the weights roots, wrk_weights.h) and checks their sha256 (of the file's bytes / of the tensor frames concatenated in order:
 * else ok=false "sha256 mismatch") -- all before taking the step lock. Then,
 * under the write side of the step lock (steps in progress finish first):
 * tdit_model_reload, cap_component_update (evict drops the key's graphs,
 * inplace re-verifies them), and SYNC_ACK ok=true. A version equal to the
 * applied one with the same sha256 is acked ok=true without reloading (a
 * repeated SYNC), with another sha256 it is "stale".
 *
 * At most WRK_SYNC_WAITING_MAX SYNCs wait for the thread, and their
 * inline tensors are bounded: one past either is acked not ok at once
 * (wrk_syncer_submit), so a broker that sends SYNCs without end cannot
 * grow the worker's memory.
 *
 * A reload that failed part-way leaves mixed weights: the worker cannot
 * serve anything any more and sets wrk_t.fatal (the main thread exits 1, the
 * broker requeues its requests). */
#ifndef REEL_WORKER_WRK_SYNC_H
#define REEL_WORKER_WRK_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include "schema/msg.h"
#include "model/safetensors.h"
#include "model/tinydit.h"
#include "worker/wrk.h"
#include "worker/wrk_fetch.h"
#include "worker/wrk_weights.h"

/* The weights a SYNC carries, read and hashed (base/sha256.h). Checks
 * the fields msg_sync_decode does not (component must be "transformer";
 * exactly one of path, uploaded or tensors: msg_sync_validate). An
 * uploaded file is fetched from the broker through `fetch` (wrk_fetch.h;
 * NULL: refused), judged by its size like a path; one without Reel
 * metadata (a Wan2.1 release file sent as it is) must hold cfg's tensors
 * under Wan's or diffusers' names (wan_ckpt_adopt). A path -- a file, a
 * sharded index or a checkpoint folder, any layout wan_ckpt.h reads -- is
 * read as wrk_weights.h says: under `roots` only, no symlink or "..",
 * regular files, each judged by its header against cfg's model before it
 * is read once, hashed as it is read, the read stopping when *stop is
 * set. Returns 0 with *out open (st_close it; Reel names and metadata)
 * and hex set to the sha256 of what was read (the identity of the
 * checkpoint, wan_ckpt.h: a file's bytes, or an index's then its shards'
 * digests; or the inline tensor frames concatenated in order);
 * -1 with the error value: its message the text the ack carries (a bad
 * field said as it is: REEL_E_NOT_FOUND for another component,
 * REEL_E_INVALID; any file problem as one generic WRK_E_* text,
 * wrk_weights.h), its detail the reason, for the log only. `cfg`
 * supplies the metadata inline tensors lack. Does not compare the sha256
 * (the caller does: the version check decides what a mismatch means). */
int wrk_sync_read(const msg_sync_t *s, const tdit_config_t *cfg, const wrk_roots_t *roots,
                  const wrk_fetch_src_t *fetch, const atomic_bool *stop, st_file_t **out, char hex[65]);

typedef struct wrk_syncer wrk_syncer_t;

/* Starts the sync thread. initial_sha: hex sha256 of the weights loaded at
 * startup (the applied version's). NULL with a message in reel_err_text(). */
wrk_syncer_t *wrk_syncer_new(wrk_t *w, const char initial_sha[65]);
/* The SYNCs that may wait for the sync thread, the one it applies
 * included; and the one answer to a SYNC past them (wrk_syncer_submit). */
#define WRK_SYNC_WAITING_MAX 16
#define WRK_E_SYNC_BUSY "busy: too many SYNCs wait on this worker"
/* Queues SYNC m (heap-allocated; ownership taken: closed and freed by the
 * sync thread). One that finds WRK_SYNC_WAITING_MAX waiting, or SYNCs
 * waiting whose inline tensors with its own would pass twice the model in
 * F32, is not queued: acked not ok (WRK_E_SYNC_BUSY, the detail logged)
 * at once on `reply`, the main thread's socket to the broker, and freed.
 * The main thread's. Can't fail. */
void wrk_syncer_submit(wrk_syncer_t *s, wire_msg_t *m, void *reply);
/* Stops after the sync in progress (queued ones are dropped) and joins.
 * NULL-safe. */
void wrk_syncer_destroy(wrk_syncer_t **s);

#endif
