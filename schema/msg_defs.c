/* msg_defs.c -- every message of docs/PROTOCOL.md as data: for each body
 * struct of msg.h, one row per field (key, kind, required or default,
 * range), the tensors each type carries, and the rules that span fields
 * (msg_*_validate). This is the one place where a key is spelled and a
 * default or a limit is chosen; msg.c walks it to decode and encode.
 *
 * A row names its member with the member's type (OFF below): a row whose
 * kind does not match its member's type does not compile. */
#include "schema/msg_defs.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "schema/wire_codec.h"

/* The offset of member m of S, which must have type T. */
#define OFF(S, m, T) _Generic((((S *)0)->m), T: offsetof(S, m))
#define SZ(S, m) sizeof(((S *)0)->m)
#define ROWS(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define TABLE(name, rows, S) static const msg_table_t name = { rows, ROWS(rows), sizeof(S) }

#define R_U64(S, m, k, fl, l, h, d) \
    { .key = k, .klen = sizeof(k) - 1, .kind = FK_U64, .flags = fl, .off = OFF(S, m, uint64_t), .size = SZ(S, m), .lo = l, .hi = h, .def = d }
#define R_I64(S, m, k, fl, d) { .key = k, .klen = sizeof(k) - 1, .kind = FK_I64, .flags = fl, .off = OFF(S, m, int64_t), .size = SZ(S, m), .def = d }
#define R_F64(S, m, k, fl, d) { .key = k, .klen = sizeof(k) - 1, .kind = FK_F64, .flags = fl, .off = OFF(S, m, double), .size = SZ(S, m), .def = d }
#define R_BOOL(S, m, k, fl, d) { .key = k, .klen = sizeof(k) - 1, .kind = FK_BOOL, .flags = fl, .off = OFF(S, m, bool), .size = SZ(S, m), .def = d }
/* max: the longest name allowed (0: what the buffer holds) */
#define R_NAME(S, m, k, fl, max, sd) \
    { .key = k, .klen = sizeof(k) - 1, .kind = FK_NAME, .flags = fl, .off = OFF(S, m, char *), .size = SZ(S, m), .hi = max, .sdef = sd }
#define R_TEXT(S, m, k, fl, sd) { .key = k, .klen = sizeof(k) - 1, .kind = FK_TEXT, .flags = fl, .off = OFF(S, m, char *), .size = SZ(S, m), .sdef = sd }
#define R_SHA(S, m, k, fl) { .key = k, .klen = sizeof(k) - 1, .kind = FK_SHA256, .flags = fl, .off = OFF(S, m, char *), .size = SZ(S, m) }
#define R_HASH(S, m, k, fl) { .key = k, .klen = sizeof(k) - 1, .kind = FK_HASH, .flags = fl, .off = OFF(S, m, uint64_t), .size = SZ(S, m) }
#define R_STR(S, m, k, fl) { .key = k, .klen = sizeof(k) - 1, .kind = FK_STR, .flags = fl, .off = OFF(S, m, const char *), .size = SZ(S, m) }
#define R_SHAPE4(S, m, k, fl) { .key = k, .klen = sizeof(k) - 1, .kind = FK_SHAPE4, .flags = fl, .off = OFF(S, m, int64_t *), .size = SZ(S, m) }
#define R_COUNTS(S, m, k, fl)                                                                      \
    { .key = k, .klen = sizeof(k) - 1, .kind = FK_COUNTS, .flags = fl,                                                     \
      .off = _Generic((((S *)0)->m), msg_counts_t: offsetof(S, m), msg_versions_t: offsetof(S, m)), \
      .size = SZ(S, m) }
#define R_TEXTS(S, m, k, fl) { .key = k, .klen = sizeof(k) - 1, .kind = FK_TEXTS, .flags = fl, .off = OFF(S, m, msg_texts_t), .size = SZ(S, m) }
#define R_HASHES(S, m, cnt, k, fl) \
    { .key = k, .klen = sizeof(k) - 1, .kind = FK_HASHES, .flags = fl, .off = OFF(S, m, uint64_t *), .size = SZ(S, m), .off2 = OFF(S, cnt, int) }
#define R_U64S(S, m, cnt, k, fl) \
    { .key = k, .klen = sizeof(k) - 1, .kind = FK_U64S, .flags = fl, .off = OFF(S, m, uint64_t *), .size = SZ(S, m), .off2 = OFF(S, cnt, int) }
#define R_NAMES(S, m, cnt, k, fl)                                                                        \
    { .key = k, .klen = sizeof(k) - 1, .kind = FK_NAMES, .flags = fl, .off = OFF(S, m, const char(*)[MSG_NAME_MAX]), .size = SZ(S, m), \
      .off2 = OFF(S, cnt, size_t) }
#define R_STRUCT(S, m, T, k, fl, tab) \
    { .key = k, .klen = sizeof(k) - 1, .kind = FK_STRUCT, .flags = fl, .off = OFF(S, m, T), .size = SZ(S, m), .sub = &tab }
#define R_STRUCTS(S, m, cnt, T, k, fl, tab)                                                          \
    { .key = k, .klen = sizeof(k) - 1, .kind = FK_STRUCTS, .flags = fl, .off = OFF(S, m, const T *), .size = SZ(S, m),      \
      .off2 = OFF(S, cnt, size_t), .sub = &tab }

_Static_assert(offsetof(msg_counts_t, e) == offsetof(msg_versions_t, e), "count maps share a layout");

/* ---- GEN and REQUEST -------------------------------------------------------------- */

static const msg_field_t gen_rows[] = {
    R_NAME(msg_gen_t, model, "model", F_REQ, MSG_MODEL_NAME_MAX - 1, NULL),
    R_U64(msg_gen_t, version, "version", 0, 0, MSG_VERSION_MAX, 0),
    R_U64(msg_gen_t, steps, "steps", F_REQ, 1, MSG_MAX_STEPS, 0),
    R_F64(msg_gen_t, shift, "shift", 0, 1.0),
    R_F64(msg_gen_t, cfg, "cfg", 0, 1.0),
    R_BOOL(msg_gen_t, sde, "sde", 0, false),
    R_F64(msg_gen_t, eta, "eta", 0, 0.7),
    R_NAME(msg_gen_t, solver, "solver", F_OMIT, 15, NULL),
    R_U64(msg_gen_t, seed, "seed", 0, 0, UINT64_MAX, 0),
    R_BOOL(msg_gen_t, progress, "progress", 0, false),
    R_U64(msg_gen_t, deadline_ms, "deadline_ms", 0, 0, UINT64_MAX, 0),
    R_SHAPE4(msg_gen_t, latent_shape, "latent_shape", F_REQ),
    R_BOOL(msg_gen_t, return_trajectory, "return_trajectory", F_OMIT, false),
    R_BOOL(msg_gen_t, return_log_probs, "return_log_probs", F_OMIT, false),
    R_BOOL(msg_gen_t, return_means, "return_means", F_OMIT, false),
    R_BOOL(msg_gen_t, return_timesteps, "return_timesteps", F_OMIT, false),
    R_U64(msg_gen_t, n, "n", F_OMIT, 1, MSG_MAX_GROUP, 0), /* absent (0 in the struct): 1 */
    R_U64S(msg_gen_t, seeds, n_seeds, "seeds", F_OMIT | F_NONEMPTY),
    R_STR(msg_gen_t, prompt, "prompt", F_OMIT),
    R_STR(msg_gen_t, negative_prompt, "negative_prompt", F_OMIT),
    R_NAME(msg_gen_t, output, "output", F_OMIT, 15, NULL),
    R_HASH(msg_gen_t, client, "client", F_OMIT),
};
TABLE(gen_tab, gen_rows, msg_gen_t);

static const msg_slot_t gen_slots[] = {
    { "context", offsetof(msg_gen_t, context) },
    { "uncond", offsetof(msg_gen_t, uncond) },
    { "latent", offsetof(msg_gen_t, latent) },
    { NULL, 0 },
};

/* ---- replies ----------------------------------------------------------------------- */

static const msg_field_t progress_rows[] = {
    R_U64(msg_progress_t, step, "step", 0, 0, UINT64_MAX, 0),
    R_U64(msg_progress_t, steps, "steps", 0, 0, UINT64_MAX, 0),
    R_U64(msg_progress_t, decoded, "decoded", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_progress_t, decode_frames, "decode_frames", F_OMIT, 0, UINT64_MAX, 0),
};
TABLE(progress_tab, progress_rows, msg_progress_t);

static const msg_field_t stats_rows[] = {
    R_U64(msg_stats_t, captured, "captured", 0, 0, UINT64_MAX, 0),
    R_U64(msg_stats_t, replayed, "replayed", 0, 0, UINT64_MAX, 0),
    R_U64(msg_stats_t, eager, "eager", 0, 0, UINT64_MAX, 0),
    R_COUNTS(msg_stats_t, declines, "declines", 0),
    R_F64(msg_stats_t, seconds, "seconds", 0, 0),
    R_U64(msg_stats_t, batched, "batched", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_stats_t, batch_rows, "batch_rows", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_stats_t, padded_rows, "padded_rows", F_OMIT, 0, UINT64_MAX, 0),
    R_HASH(msg_stats_t, capture_key, "capture_key", F_OMIT),
};
TABLE(stats_tab, stats_rows, msg_stats_t);

static const msg_field_t version_run_rows[] = {
    R_U64(msg_version_run_t, from, "from", F_REQ, 0, UINT64_MAX, 0),
    R_U64(msg_version_run_t, version, "version", F_REQ, 0, MSG_VERSION_MAX, 0),
};
TABLE(version_run_tab, version_run_rows, msg_version_run_t);

static const msg_field_t result_rows[] = {
    R_NAME(msg_result_t, worker, "worker", F_OMIT, 0, NULL),
    R_U64(msg_result_t, version, "version", F_REQ, 0, MSG_VERSION_MAX, 0),
    R_U64(msg_result_t, first_version, "first_version", 0, 0, MSG_VERSION_MAX, 0),
    R_STRUCT(msg_result_t, stats, msg_stats_t, "stats", F_REQ, stats_tab),
    R_HASH(msg_result_t, key_hash, "key_hash", F_OMIT),
    R_HASH(msg_result_t, boot, "boot", F_OMIT),
    R_STRUCTS(msg_result_t, version_runs, n_version_runs, msg_version_run_t, "version_runs", F_OMIT,
              version_run_tab),
    R_U64(msg_result_t, n, "n", F_OMIT, 1, MSG_MAX_GROUP, 0),
    R_U64S(msg_result_t, seeds, n_seeds, "seeds", F_OMIT),
    R_F64(msg_result_t, encode_seconds, "encode_seconds", F_OMIT, 0),
    R_F64(msg_result_t, decode_seconds, "decode_seconds", F_OMIT, 0),
};
TABLE(result_tab, result_rows, msg_result_t);

static const msg_slot_t result_slots[] = {
    { "latent", offsetof(msg_result_t, latent) },
    { "trajectory", offsetof(msg_result_t, trajectory) },
    { "log_probs", offsetof(msg_result_t, log_probs) },
    { "sigmas", offsetof(msg_result_t, sigmas) },
    { "timesteps", offsetof(msg_result_t, timesteps) },
    { "means", offsetof(msg_result_t, means) },
    { "frames", offsetof(msg_result_t, frames) },
    { "video", offsetof(msg_result_t, video) },
    { NULL, 0 },
};

/* first_version defaults to version: a worker that never saw a sync land
 * mid-request need not say it twice. */
static void result_after(void *body, const wire_msg_t *m) {
    msg_result_t *r = body;
    if (!wire_tok_find(&m->tok, wire_msg_head(m), 0, "first_version")) r->first_version = r->version;
}

static const msg_field_t error_rows[] = {
    R_TEXT(msg_error_t, code, "code", 0, WIRE_E_INTERNAL),
    R_TEXT(msg_error_t, message, "message", 0, ""),
};
TABLE(error_tab, error_rows, msg_error_t);

static const msg_field_t busy_rows[] = {
    R_TEXT(msg_busy_t, message, "message", 0, ""),
};
TABLE(busy_tab, busy_rows, msg_busy_t);

static const msg_field_t cancel_rows[] = {
    R_HASH(msg_cancel_t, client, "client", F_OMIT),
};
TABLE(cancel_tab, cancel_rows, msg_cancel_t);

/* ---- syncs ------------------------------------------------------------------------- */

static const msg_field_t sync_rows[] = {
    R_NAME(msg_sync_t, component, "component", F_REQ, 0, NULL),
    R_U64(msg_sync_t, version, "version", F_REQ, 1, MSG_VERSION_MAX, 0),
    R_SHA(msg_sync_t, sha256, "sha256", F_REQ),
    R_TEXT(msg_sync_t, path, "path", F_OMIT, ""),
    R_U64(msg_sync_t, deadline_ms, "deadline_ms", F_OMIT, 0, UINT64_MAX, 0),
    R_BOOL(msg_sync_t, uploaded, "uploaded", F_OMIT, false),
    R_U64(msg_sync_t, base_version, "base_version", F_OMIT, 0, MSG_VERSION_MAX, 0),
    R_TEXT(msg_sync_t, lora_config, "lora_config", F_OMIT, ""),
    R_HASH(msg_sync_t, client, "client", F_OMIT),
};
TABLE(sync_tab, sync_rows, msg_sync_t);

/* ---- weights by value --------------------------------------------------------------- */

static const msg_field_t upload_rows[] = {
    R_NAME(msg_upload_t, component, "component", F_REQ, 0, NULL),
    R_U64(msg_upload_t, version, "version", F_REQ, 1, MSG_VERSION_MAX, 0),
    R_SHA(msg_upload_t, sha256, "sha256", F_REQ),
    R_U64(msg_upload_t, size, "size", F_REQ, 1, MSG_UPLOAD_MAX, 0),
    R_U64(msg_upload_t, offset, "offset", F_REQ, 0, MSG_UPLOAD_MAX, 0),
    R_HASH(msg_upload_t, client, "client", F_OMIT),
};
TABLE(upload_tab, upload_rows, msg_upload_t);

static const msg_slot_t upload_slots[] = { { "chunk", offsetof(msg_upload_t, chunk) }, { NULL, 0 } };

static const msg_field_t upload_ack_rows[] = {
    R_NAME(msg_upload_ack_t, component, "component", F_REQ, 0, NULL),
    R_U64(msg_upload_ack_t, version, "version", F_REQ, 1, MSG_VERSION_MAX, 0),
    R_U64(msg_upload_ack_t, received, "received", 0, 0, MSG_UPLOAD_MAX, 0),
    R_BOOL(msg_upload_ack_t, complete, "complete", 0, false),
};
TABLE(upload_ack_tab, upload_ack_rows, msg_upload_ack_t);

static const msg_field_t fetch_rows[] = {
    R_NAME(msg_fetch_t, component, "component", F_REQ, 0, NULL),
    R_U64(msg_fetch_t, version, "version", F_REQ, 1, MSG_VERSION_MAX, 0),
    R_SHA(msg_fetch_t, sha256, "sha256", F_REQ),
    R_U64(msg_fetch_t, offset, "offset", 0, 0, MSG_UPLOAD_MAX, 0),
    R_U64(msg_fetch_t, max, "max", F_OMIT, 0, MSG_CHUNK_MAX, 0),
};
TABLE(fetch_tab, fetch_rows, msg_fetch_t);

static const msg_field_t fetch_data_rows[] = {
    R_NAME(msg_fetch_data_t, component, "component", F_REQ, 0, NULL),
    R_U64(msg_fetch_data_t, version, "version", F_REQ, 1, MSG_VERSION_MAX, 0),
    R_U64(msg_fetch_data_t, offset, "offset", 0, 0, MSG_UPLOAD_MAX, 0),
    R_U64(msg_fetch_data_t, size, "size", 0, 0, MSG_UPLOAD_MAX, 0),
};
TABLE(fetch_data_tab, fetch_data_rows, msg_fetch_data_t);

static const msg_slot_t fetch_data_slots[] = { { "chunk", offsetof(msg_fetch_data_t, chunk) }, { NULL, 0 } };

static const msg_field_t failure_rows[] = {
    R_NAME(msg_failure_t, worker, "worker", F_REQ, 0, NULL),
    R_TEXT(msg_failure_t, reason, "reason", 0, ""),
};
TABLE(failure_tab, failure_rows, msg_failure_t);

static const msg_field_t sync_done_rows[] = {
    R_NAME(msg_sync_done_t, component, "component", F_REQ, 0, NULL),
    R_U64(msg_sync_done_t, version, "version", F_REQ, 0, MSG_VERSION_MAX, 0),
    R_NAMES(msg_sync_done_t, applied, n_applied, "applied", 0),
    R_STRUCTS(msg_sync_done_t, failed, n_failed, msg_failure_t, "failed", 0, failure_tab),
    R_BOOL(msg_sync_done_t, complete, "complete", 0, false),
    R_U64(msg_sync_done_t, current, "current", 0, 0, MSG_VERSION_MAX, 0),
};
TABLE(sync_done_tab, sync_done_rows, msg_sync_done_t);

static const msg_field_t sync_ack_rows[] = {
    R_NAME(msg_sync_ack_t, component, "component", F_REQ, 0, NULL),
    R_U64(msg_sync_ack_t, version, "version", F_REQ, 0, MSG_VERSION_MAX, 0),
    R_BOOL(msg_sync_ack_t, ok, "ok", F_REQ, false),
    R_TEXT(msg_sync_ack_t, error, "error", F_OMIT, ""),
    R_TEXT(msg_sync_ack_t, adapter, "adapter", F_OMIT, ""),
};
TABLE(sync_ack_tab, sync_ack_rows, msg_sync_ack_t);

/* ---- workers ------------------------------------------------------------------------ */

static const msg_field_t model_rows[] = {
    R_NAME(msg_model_t, name, "name", F_REQ, MSG_MODEL_NAME_MAX - 1, NULL),
    R_U64(msg_model_t, in_channels, "in_channels", 0, 0, MSG_MAX_DIM, 0),
    R_U64(msg_model_t, text_dim, "text_dim", 0, 0, MSG_MAX_DIM, 0),
    R_U64(msg_model_t, patch, "patch", 0, 0, MSG_MAX_DIM, 1),
    R_U64(msg_model_t, layers, "layers", 0, 0, UINT32_MAX, 0),
    R_U64(msg_model_t, text_len, "text_len", F_OMIT, 0, 65536, 0),
};
TABLE(model_tab, model_rows, msg_model_t);

static const msg_field_t ready_rows[] = {
    R_NAME(msg_ready_t, name, "name", F_REQ, 0, NULL),
    R_TEXT(msg_ready_t, device, "device", 0, "?"),
    R_TEXT(msg_ready_t, arch, "arch", 0, "?"),
    R_U64(msg_ready_t, streams, "streams", 0, 1, MSG_MAX_STREAMS, 1),
    R_U64(msg_ready_t, budget, "budget", 0, 0, UINT64_MAX, 0),
    R_U64(msg_ready_t, max_inflight, "max_inflight", F_OMIT, 1, MSG_MAX_INFLIGHT, 0),
    R_NAMES(msg_ready_t, models, n_models, "models", F_REQ),
    R_COUNTS(msg_ready_t, versions, "versions", 0),
    R_STRUCTS(msg_ready_t, configs, n_configs, msg_model_t, "configs", F_OMIT, model_tab),
    R_NAMES(msg_ready_t, solvers, n_solvers, "solvers", F_OMIT),
    R_NAME(msg_ready_t, text_encoder, "text_encoder", F_OMIT, 0, NULL),
    R_NAME(msg_ready_t, vae, "vae", F_OMIT, 0, NULL),
    R_U64(msg_ready_t, prewarm, "prewarm", F_OMIT, 0, MSG_MAX_PREWARM, 0),
    R_U64(msg_ready_t, max_tokens, "max_tokens", F_OMIT, 0, (uint64_t)1 << 24, 0),
    R_HASH(msg_ready_t, boot, "boot", F_OMIT),
};
TABLE(ready_tab, ready_rows, msg_ready_t);

static const msg_field_t event_rows[] = {
    R_TEXT(msg_event_t, kind, "kind", 0, ""),
    R_NAME(msg_event_t, reason, "reason", F_OMIT, 0, NULL),
    R_STR(msg_event_t, key, "key", F_OMIT),
    R_HASH(msg_event_t, key_hash, "key_hash", 0),
    R_I64(msg_event_t, stream, "stream", 0, 0),
    R_U64(msg_event_t, bytes, "bytes", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_event_t, nodes, "nodes", F_OMIT, 0, UINT64_MAX, 0),
    R_F64(msg_event_t, seconds, "seconds", F_OMIT, 0),
    R_NAME(msg_event_t, component, "component", F_OMIT, 0, NULL),
    R_U64(msg_event_t, from, "from", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_event_t, to, "to", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_event_t, count, "count", F_OMIT, 0, UINT64_MAX, 1),
    R_NAME(msg_event_t, version, "version", F_OMIT, 0, NULL),
    R_NAME(msg_event_t, op, "op", F_OMIT, 0, NULL),
    R_NAME(msg_event_t, backend, "backend", F_OMIT, 0, NULL),
    R_SHA(msg_event_t, sha256, "sha256", F_OMIT),
    R_BOOL(msg_event_t, verified, "verified", F_OMIT, false),
    R_BOOL(msg_event_t, enabled, "enabled", F_OMIT, false),
    R_TEXT(msg_event_t, detail, "detail", F_OMIT, ""),
    R_U64(msg_event_t, native, "native", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_event_t, pass, "pass", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_event_t, fail, "fail", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_event_t, fallbacks, "fallbacks", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_event_t, timed, "timed", F_OMIT, 0, UINT64_MAX, 0),
    R_F64(msg_event_t, speedup, "speedup", F_OMIT, 0),
    R_F64(msg_event_t, speedup_sd, "speedup_sd", F_OMIT, 0),
    R_U64(msg_event_t, sync_timed, "sync_timed", F_OMIT, 0, UINT64_MAX, 0),
    R_F64(msg_event_t, sync_s, "sync_s", F_OMIT, 0),
};
TABLE(event_tab, event_rows, msg_event_t);

static const msg_field_t events_rows[] = {
    R_STRUCTS(msg_events_t, events, n_events, msg_event_t, "events", 0, event_tab),
    R_U64(msg_events_t, dropped, "dropped", F_OMIT, 0, UINT64_MAX, 0),
};
TABLE(events_tab, events_rows, msg_events_t);

static const msg_field_t prewarm_key_rows[] = {
    R_NAME(msg_prewarm_key_t, model, "model", F_REQ, MSG_MODEL_NAME_MAX - 1, NULL),
    R_SHAPE4(msg_prewarm_key_t, latent_shape, "latent_shape", F_REQ),
    R_U64(msg_prewarm_key_t, text_len, "text_len", F_REQ, 1, MSG_MAX_DIM, 0),
    R_U64(msg_prewarm_key_t, text_dim, "text_dim", F_REQ, 1, MSG_MAX_DIM, 0),
    R_BOOL(msg_prewarm_key_t, cfg, "cfg", 0, false),
    R_U64(msg_prewarm_key_t, n, "n", 0, 1, MSG_MAX_GROUP, 1),
    R_NAME(msg_prewarm_key_t, solver, "solver", F_OMIT, 15, NULL),
    R_BOOL(msg_prewarm_key_t, sde, "sde", 0, false),
    R_HASH(msg_prewarm_key_t, key_hash, "key_hash", F_REQ),
    R_U64(msg_prewarm_key_t, requests, "requests", F_OMIT, 0, UINT64_MAX, 0),
};
TABLE(prewarm_key_tab, prewarm_key_rows, msg_prewarm_key_t);

static const msg_field_t prewarm_rows[] = {
    R_STRUCTS(msg_prewarm_t, keys, n_keys, msg_prewarm_key_t, "keys", F_REQ, prewarm_key_tab),
};
TABLE(prewarm_tab, prewarm_rows, msg_prewarm_t);

/* ---- a standby pair ------------------------------------------------------------------ */

static const msg_field_t peer_rows[] = {
    R_NAME(msg_peer_t, state, "state", F_REQ, MSG_HA_NAME_MAX - 1, NULL),
    R_NAME(msg_peer_t, role, "role", F_REQ, MSG_HA_NAME_MAX - 1, NULL),
    R_U64(msg_peer_t, term, "term", F_REQ, 0, UINT64_MAX, 0),
    R_HASH(msg_peer_t, boot, "boot", F_OMIT),
    R_TEXT(msg_peer_t, clients, "clients", F_OMIT, ""),
    R_STRUCTS(msg_peer_t, syncs, n_syncs, msg_sync_t, "syncs", F_OMIT, sync_tab),
};
TABLE(peer_tab, peer_rows, msg_peer_t);

/* ---- status ------------------------------------------------------------------------- */

static const msg_field_t worker_rows[] = {
    R_NAME(msg_worker_status_t, name, "name", F_REQ, 0, NULL),
    R_TEXT(msg_worker_status_t, device, "device", 0, "?"),
    R_TEXT(msg_worker_status_t, arch, "arch", 0, "?"),
    R_NAME(msg_worker_status_t, text_encoder, "text_encoder", F_OMIT, 0, NULL),
    R_NAME(msg_worker_status_t, vae, "vae", F_OMIT, 0, NULL),
    R_U64(msg_worker_status_t, streams, "streams", 0, 0, UINT64_MAX, 0),
    R_U64(msg_worker_status_t, inflight, "inflight", 0, 0, UINT64_MAX, 0),
    R_U64(msg_worker_status_t, max_inflight, "max_inflight", 0, 0, UINT64_MAX, 0),
    R_BOOL(msg_worker_status_t, routable, "routable", 0, true),
    R_COUNTS(msg_worker_status_t, versions, "versions", 0),
    R_TEXTS(msg_worker_status_t, lagging, "lagging", 0),
    R_HASHES(msg_worker_status_t, keys, n_keys, "keys", 0),
    R_U64(msg_worker_status_t, alive_ms, "alive_ms", 0, 0, UINT64_MAX, 0),
};
TABLE(worker_tab, worker_rows, msg_worker_status_t);

static const msg_field_t refused_peer_rows[] = {
    R_TEXT(msg_refused_peer_t, socket, "socket", 0, ""),
    R_TEXT(msg_refused_peer_t, key, "key", 0, ""),
    R_TEXT(msg_refused_peer_t, name, "name", F_OMIT, ""),
    R_TEXT(msg_refused_peer_t, address, "address", 0, ""),
    R_TEXT(msg_refused_peer_t, why, "why", 0, ""),
    R_U64(msg_refused_peer_t, count, "count", 0, 0, UINT64_MAX, 0),
    R_U64(msg_refused_peer_t, ago_ms, "ago_ms", 0, 0, UINT64_MAX, 0),
};
TABLE(refused_peer_tab, refused_peer_rows, msg_refused_peer_t);

static const msg_field_t status_reply_rows[] = {
    R_STRUCTS(msg_status_reply_t, workers, n_workers, msg_worker_status_t, "workers", 0, worker_tab),
    R_U64(msg_status_reply_t, queue, "queue", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, queue_max, "queue_max", 0, 0, UINT64_MAX, 0),
    R_COUNTS(msg_status_reply_t, versions, "versions", 0),
    R_COUNTS(msg_status_reply_t, pending, "pending", 0),
    R_U64(msg_status_reply_t, malformed, "malformed", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, worker_refused, "worker_refused", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, catalog_dropped, "catalog_dropped", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, catalog_failures, "catalog_failures", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, catalog_pending, "catalog_pending", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, undelivered, "undelivered", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, progress_dropped, "progress_dropped", F_OMIT, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, replies_suppressed, "replies_suppressed", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, auth_refused, "auth_refused", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, auth_refused_peers, "auth_refused_peers", F_OMIT, 0, UINT64_MAX, 0),
    R_STRUCTS(msg_status_reply_t, auth_refused_recent, n_auth_refused_recent, msg_refused_peer_t,
              "auth_refused_recent", F_OMIT, refused_peer_tab),
    R_U64(msg_status_reply_t, requests_ok, "requests_ok", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, requests_failed, "requests_failed", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, steps_replayed, "steps_replayed", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, steps_eager, "steps_eager", 0, 0, UINT64_MAX, 0),
    R_U64(msg_status_reply_t, steps_captured, "steps_captured", 0, 0, UINT64_MAX, 0),
    R_STRUCTS(msg_status_reply_t, models, n_models, msg_model_t, "models", 0, model_tab),
    R_HASH(msg_status_reply_t, boot, "boot", F_OMIT),
    R_NAME(msg_status_reply_t, ha_state, "ha_state", F_OMIT, MSG_HA_NAME_MAX - 1, ""),
    R_NAME(msg_status_reply_t, ha_role, "ha_role", F_OMIT, MSG_HA_NAME_MAX - 1, ""),
    R_U64(msg_status_reply_t, ha_term, "ha_term", F_OMIT, 0, UINT64_MAX, 0),
    R_NAME(msg_status_reply_t, ha_peer, "ha_peer", F_OMIT, MSG_HA_NAME_MAX - 1, ""),
};
TABLE(status_reply_tab, status_reply_rows, msg_status_reply_t);

/* ---- the types ------------------------------------------------------------------------ */

#define GEN_TENSORS "context, uncond and latent"

const msg_desc_t msg_descs[MSG_UNKNOWN] = {
    [MSG_GEN] = { "GEN", &gen_tab, gen_slots, GEN_TENSORS, false, NULL },
    [MSG_REQUEST] = { "REQUEST", &gen_tab, gen_slots, GEN_TENSORS, false, NULL },
    [MSG_PROGRESS] = { "PROGRESS", &progress_tab, NULL, NULL, false, NULL },
    [MSG_RESULT] = { "RESULT", &result_tab, result_slots,
                     "latent, trajectory, log_probs, sigmas, timesteps, means, frames and video", false, result_after },
    [MSG_ERROR] = { "ERROR", &error_tab, NULL, NULL, false, NULL },
    [MSG_BUSY] = { "BUSY", &busy_tab, NULL, NULL, false, NULL },
    [MSG_SYNC] = { "SYNC", &sync_tab, NULL, NULL, true, NULL },
    [MSG_SYNC_DONE] = { "SYNC_DONE", &sync_done_tab, NULL, NULL, false, NULL },
    [MSG_SYNC_ACK] = { "SYNC_ACK", &sync_ack_tab, NULL, NULL, false, NULL },
    [MSG_STATUS] = { "STATUS", NULL, NULL, NULL, false, NULL },
    [MSG_STATUS_REPLY] = { "STATUS_REPLY", &status_reply_tab, NULL, NULL, false, NULL },
    [MSG_READY] = { "READY", &ready_tab, NULL, NULL, false, NULL },
    [MSG_HEARTBEAT] = { "HEARTBEAT", NULL, NULL, NULL, false, NULL },
    [MSG_DISCONNECT] = { "DISCONNECT", NULL, NULL, NULL, false, NULL },
    [MSG_RECONNECT] = { "RECONNECT", NULL, NULL, NULL, false, NULL },
    [MSG_EVENTS] = { "EVENTS", &events_tab, NULL, NULL, false, NULL },
    [MSG_UPLOAD] = { "UPLOAD", &upload_tab, upload_slots, "chunk", false, NULL },
    [MSG_UPLOAD_ACK] = { "UPLOAD_ACK", &upload_ack_tab, NULL, NULL, false, NULL },
    [MSG_FETCH] = { "FETCH", &fetch_tab, NULL, NULL, false, NULL },
    [MSG_FETCH_DATA] = { "FETCH_DATA", &fetch_data_tab, fetch_data_slots, "chunk", false, NULL },
    [MSG_PREWARM] = { "PREWARM", &prewarm_tab, NULL, NULL, false, NULL },
    [MSG_PEER] = { "PEER", &peer_tab, NULL, NULL, false, NULL },
    [MSG_CANCEL] = { "CANCEL", &cancel_tab, NULL, NULL, false, NULL },
};

/* ---- rules across fields ---------------------------------------------------------------- */

static int refuse(wire_err_t *err, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(wire_err_t *err, const char *code, const char *fmt, ...) {
    char text[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    wire_set_err(err, code, "%s", text);
    return -1;
}

/* "F32[5,32]": a tensor's dtype and shape, for messages. */
static const char *shape_text(const wire_tensor_t *t, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "%s", wire_dtype_name(t->dtype)); /* U8 too */
    if (n < len) kern_shape_text(t->ndim, t->shape, buf + n, len - n);
    return buf;
}

static bool is_f32(const wire_tensor_t *t, int ndim) { return t->dtype == KERN_F32 && t->ndim == ndim; }

/* latent_shape on its own: each entry, F·H·W, and the latent's bytes. */
static int latent_shape_ok(const int64_t *ls, wire_err_t *err) {
    static const char dims[] = "CFHW";
    for (int i = 0; i < 4; i++)
        if (ls[i] < 1 || ls[i] > MSG_MAX_DIM)
            return refuse(err, WIRE_E_BAD_REQUEST, "'latent_shape' %c must be in 1..%d (got %" PRId64 ")", dims[i],
                          MSG_MAX_DIM, ls[i]);
    if (ls[1] * ls[2] * ls[3] > MSG_MAX_FHW)
        return refuse(err, WIRE_E_BAD_REQUEST, "'latent_shape' F x H x W must be at most %" PRId64 " (got %" PRId64 ")",
                      MSG_MAX_FHW, ls[1] * ls[2] * ls[3]);
    if ((uint64_t)(ls[0] * ls[1] * ls[2] * ls[3]) * sizeof(float) > MSG_MAX_GEN_BYTES)
        return refuse(err, WIRE_E_BAD_REQUEST, "'latent_shape' makes a latent over %llu MiB",
                      (unsigned long long)(MSG_MAX_GEN_BYTES >> 20));
    return 0;
}

bool msg_text_ok(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int n = *p < 0x80 ? 0 : (*p & 0xE0) == 0xC0 ? 1 : (*p & 0xF0) == 0xE0 ? 2 : (*p & 0xF8) == 0xF0 ? 3 : -1;
        if (n < 0 || (n == 1 && *p < 0xC2) || (n == 3 && *p > 0xF4)) return false;
        if (n == 0 && ((*p < 0x20 && *p != '\t' && *p != '\n' && *p != '\r') || *p == 0x7f)) return false;
        if (n == 1 && *p == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F) return false; /* C1 controls U+0080..U+009F */
        uint32_t c = n == 0 ? *p : *p & (0x3F >> n);
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80) return false;
            c = c << 6 | (p[i] & 0x3F);
        }
        if ((n == 2 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) || (n == 3 && (c < 0x10000 || c > 0x10FFFF)))
            return false;
        p += n + 1;
    }
    return true;
}

/* prompt / negative_prompt / output: the text form of a GEN. */
static int gen_text_ok(const msg_gen_t *g, wire_err_t *err) {
    const char *out = msg_gen_output(g);
    if (strcmp(out, "latent") && strcmp(out, "frames") && strcmp(out, "video"))
        return refuse(err, WIRE_E_BAD_REQUEST, "'output' must be latent, frames or video (got '%s')", out);
    const char *texts[2] = { g->prompt, g->negative_prompt }, *names[2] = { "prompt", "negative_prompt" };
    for (int i = 0; i < 2; i++) {
        if (!texts[i] || !*texts[i]) continue;
        if (strlen(texts[i]) > MSG_MAX_PROMPT_BYTES)
            return refuse(err, WIRE_E_BAD_REQUEST, "'%s' is %zu bytes, longer than %d", names[i], strlen(texts[i]),
                          MSG_MAX_PROMPT_BYTES);
        if (!msg_text_ok(texts[i]))
            return refuse(err, WIRE_E_BAD_REQUEST, "'%s' is not UTF-8 text (or holds control characters)", names[i]);
    }
    if (!strcmp(out, "video") && msg_gen_n(g) > 1)
        return refuse(err, WIRE_E_BAD_REQUEST, "output 'video' is one MP4 of one sample; a group (n > 1) asks for 'frames'");
    bool prompt = g->prompt && *g->prompt;
    if (prompt && g->context)
        return refuse(err, WIRE_E_BAD_REQUEST, "give a 'prompt' or a tensor 'context', not both");
    if (prompt && g->uncond)
        return refuse(err, WIRE_E_BAD_REQUEST, "tensor 'uncond' goes with a 'context'; with a 'prompt', give 'negative_prompt'");
    if (!prompt && g->negative_prompt && *g->negative_prompt)
        return refuse(err, WIRE_E_BAD_REQUEST, "'negative_prompt' needs a 'prompt' (with a 'context', send tensor 'uncond')");
    return 0;
}

/* The tensors against each other and latent_shape. */
static int gen_tensors_ok(const msg_gen_t *g, const msg_model_t *model, wire_err_t *err) {
    const wire_tensor_t *ctx = g->context, *unc = g->uncond, *lat = g->latent;
    char d[96], w[96];
    if (g->prompt && *g->prompt) {
        /* the worker encodes it: nothing of the context to check here */
    } else if (!ctx || !is_f32(ctx, 2)) {
        if (model) snprintf(w, sizeof w, "F32[L,%" PRIu64 "]", model->text_dim);
        else snprintf(w, sizeof w, "F32[L,T]");
        if (!ctx) return refuse(err, WIRE_E_BAD_REQUEST, "missing tensor 'context' %s (or a 'prompt')", w);
        return refuse(err, WIRE_E_BAD_REQUEST, "tensor 'context' is %s, expected %s", shape_text(ctx, d, sizeof d), w);
    }
    if (ctx && (ctx->shape[0] < 1 || ctx->shape[0] > MSG_MAX_DIM || ctx->shape[1] < 1 || ctx->shape[1] > MSG_MAX_DIM))
        return refuse(err, WIRE_E_BAD_REQUEST, "tensor 'context' is %s: L and T must be in 1..%d",
                      shape_text(ctx, d, sizeof d), MSG_MAX_DIM);
    /* A model that pads contexts to text_len (Wan) takes the negative
     * prompt at its own length; any other needs the context's shape. Without
     * the model (the broker), only the width is checked here. */
    bool own_len = !model || model->text_len > 0;
    if (ctx && unc && (!is_f32(unc, 2) || (!own_len && unc->shape[0] != ctx->shape[0]) || unc->shape[1] != ctx->shape[1] ||
                unc->shape[0] < 1 || unc->shape[0] > MSG_MAX_DIM))
        return refuse(err, WIRE_E_BAD_REQUEST, "tensor 'uncond' is %s, expected the context's %s%s",
                      shape_text(unc, d, sizeof d), shape_text(ctx, w, sizeof w),
                      own_len ? " (or another L: the model pads both to its text_len)" : "");
    if (lat) {
        /* One sample: [C,F,H,W]; a group of n: [n,C,F,H,W]. */
        uint64_t n = msg_gen_n(g);
        int lead = n > 1;
        bool same = is_f32(lat, 4 + lead) && (!lead || (uint64_t)lat->shape[0] == n);
        for (int i = 0; same && i < 4; i++) same = lat->shape[lead + i] == g->latent_shape[i];
        if (!same) {
            char lead_text[24] = "";
            if (lead) snprintf(lead_text, sizeof lead_text, "%" PRIu64 ",", n);
            return refuse(err, WIRE_E_BAD_REQUEST,
                          "tensor 'latent' is %s, expected F32[%s%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] (%slatent_shape)",
                          shape_text(lat, d, sizeof d), lead_text, g->latent_shape[0], g->latent_shape[1],
                          g->latent_shape[2], g->latent_shape[3], lead ? "n, " : "");
        }
    }
    return 0;
}

/* The model's own constraints: its name, C, T and the patch grid. */
static int gen_fits_model(const msg_gen_t *g, const msg_model_t *model, wire_err_t *err) {
    const int64_t *ls = g->latent_shape;
    if (strcmp(g->model, model->name))
        return refuse(err, WIRE_E_BAD_REQUEST, "model '%s' is not served here (this worker serves '%s')", g->model,
                      model->name);
    if ((uint64_t)ls[0] != model->in_channels)
        return refuse(err, WIRE_E_BAD_REQUEST, "latent has %" PRId64 " channels, model %s expects %" PRIu64, ls[0],
                      model->name, model->in_channels);
    if (g->prompt && *g->prompt && !model->text_len)
        return refuse(err, WIRE_E_BAD_REQUEST, "model %s takes no 'prompt': its config has no text_len (send a 'context')",
                      model->name);
    if (g->context && (uint64_t)g->context->shape[1] != model->text_dim)
        return refuse(err, WIRE_E_BAD_REQUEST, "context width %" PRId64 ", model %s expects text_dim %" PRIu64,
                      g->context->shape[1], model->name, model->text_dim);
    /* Wan pads every context with zero rows to text_len: a longer one has
     * no place (its tail would be cut, as Wan's T5 truncates the prompt). */
    for (int u = 0; u < 2 && model->text_len; u++) {
        const wire_tensor_t *c = u ? g->uncond : g->context;
        if (c && (uint64_t)c->shape[0] > model->text_len)
            return refuse(err, WIRE_E_BAD_REQUEST, "%s has %" PRId64 " rows, model %s pads contexts to text_len %" PRIu64
                          " and takes at most that many", c->name, c->shape[0], model->name, model->text_len);
    }
    uint64_t p = model->patch ? model->patch : 1;
    if ((uint64_t)ls[2] % p || (uint64_t)ls[3] % p)
        return refuse(err, WIRE_E_BAD_REQUEST,
                      "latent height and width must be multiples of %" PRIu64 ", the patch size of model %s (got H=%" PRId64
                      " W=%" PRId64 ")", p, model->name, ls[2], ls[3]);
    return 0;
}

const char *msg_gen_solver(const msg_gen_t *g) { return g->solver[0] ? g->solver : "euler"; }
const char *msg_gen_output(const msg_gen_t *g) { return g->output[0] ? g->output : "latent"; }
bool msg_gen_decodes(const msg_gen_t *g) { return g->output[0] && strcmp(g->output, "latent") != 0; }
bool msg_gen_guided(const msg_gen_t *g) { return g->uncond || (g->prompt && *g->prompt && g->cfg != 1.0); }

int msg_gen_validate(const msg_gen_t *g, const msg_model_t *model, wire_err_t *err) {
    uint64_t bytes = 0;
    const wire_tensor_t *t[3] = { g->context, g->uncond, g->latent };
    for (int i = 0; i < 3; i++) bytes += t[i] ? t[i]->bytes : 0;
    /* A queued request holds its frames: bound what one may pin. */
    if (bytes > MSG_MAX_GEN_BYTES)
        return refuse(err, WIRE_E_TOO_LARGE, "tensors of %llu bytes, more than a GEN may carry (%llu MiB)",
                      (unsigned long long)bytes, (unsigned long long)(MSG_MAX_GEN_BYTES >> 20));
    if (latent_shape_ok(g->latent_shape, err)) return -1;
    if (gen_text_ok(g, err)) return -1;
    if (g->n_seeds && (uint64_t)g->n_seeds != msg_gen_n(g))
        return refuse(err, WIRE_E_BAD_REQUEST, "'seeds' has %d entries, 'n' is %" PRIu64 " (give one seed per sample, or none)",
                      g->n_seeds, msg_gen_n(g));
    if (gen_tensors_ok(g, model, err)) return -1;
    if (!(g->shift > 0)) return refuse(err, WIRE_E_BAD_REQUEST, "'shift' must be > 0 (got %g)", g->shift);
    if (fabs(g->cfg) > FLT_MAX) return refuse(err, WIRE_E_BAD_REQUEST, "'cfg' must fit a float (got %g)", g->cfg);
    if (g->sde && !(g->eta >= 0 && g->eta <= FLT_MAX))
        return refuse(err, WIRE_E_BAD_REQUEST, "'eta' must be >= 0 and fit a float (got %g)", g->eta);
    const char *solver = msg_gen_solver(g);
    if (strcmp(solver, "euler") && strcmp(solver, "unipc") && strcmp(solver, "dpm++"))
        return refuse(err, WIRE_E_BAD_REQUEST, "'solver' must be euler, unipc or dpm++ (got '%s')", solver);
    /* A log-probability needs noise: an SDE step with eta > 0. */
    /* (as the float the step reads it: 1e-50 is 0 there) */
    if ((g->return_log_probs || g->return_means) && !(g->sde && (float)g->eta > 0))
        return refuse(err, WIRE_E_BAD_REQUEST, "'return_log_probs' and 'return_means' need 'sde' with 'eta' > 0 "
                      "(as a float32: at least 1.4e-45)");
    /* The RESULT's frames must fit what a receiver accepts (one frame each). */
    uint64_t lat = (uint64_t)(g->latent_shape[0] * g->latent_shape[1] * g->latent_shape[2] * g->latent_shape[3]) *
                   sizeof(float) * msg_gen_n(g);
    if (lat > MSG_MAX_GEN_BYTES)
        return refuse(err, WIRE_E_TOO_LARGE, "%" PRIu64 " latents of this shape exceed %llu MiB", msg_gen_n(g),
                      (unsigned long long)(MSG_MAX_GEN_BYTES >> 20));
    if ((g->return_trajectory && lat * (g->steps + 1) > (uint64_t)WIRE_MAX_FRAME) ||
        (g->return_means && lat * g->steps > (uint64_t)WIRE_MAX_FRAME))
        return refuse(err, WIRE_E_TOO_LARGE, "a trajectory or means of %llu steps of %" PRIu64 " such latents exceed %llu MiB",
                      (unsigned long long)g->steps, msg_gen_n(g), (unsigned long long)(WIRE_MAX_FRAME >> 20));
    /* Decoded: n videos of 1 + 4(F-1) frames of 8H x 8W x 3 bytes in one frame. */
    uint64_t vframes = 1 + MSG_VAE_TIME * (uint64_t)(g->latent_shape[1] - 1);
    uint64_t vbytes = vframes * MSG_VAE_SPACE * (uint64_t)g->latent_shape[2] * MSG_VAE_SPACE *
                      (uint64_t)g->latent_shape[3] * 3 * msg_gen_n(g);
    if (msg_gen_decodes(g) && vbytes > (uint64_t)WIRE_MAX_FRAME)
        return refuse(err, WIRE_E_TOO_LARGE, "%" PRIu64 " decoded video(s) of this latent shape are %" PRIu64
                      " MiB of frames, more than a RESULT carries (%llu MiB)", msg_gen_n(g), vbytes >> 20,
                      (unsigned long long)(WIRE_MAX_FRAME >> 20));
    return model ? gen_fits_model(g, model, err) : 0;
}

/* t is F32 of [lead..., shape...] (nl leading dims, then ns of shape). */
static bool shape_is(const wire_tensor_t *t, int nl, const int64_t *lead, int ns, const int64_t *shape) {
    if (!t || t->dtype != KERN_F32 || t->ndim != nl + ns) return false;
    for (int d = 0; d < nl; d++)
        if (t->shape[d] != lead[d]) return false;
    for (int d = 0; d < ns; d++)
        if (t->shape[nl + d] != shape[d]) return false;
    return true;
}

static const char *describe(const wire_tensor_t *t, char *buf, size_t len) {
    return t ? shape_text(t, buf, len) : "absent";
}

/* A RESULT's frames / video against the GEN's output. */
static int decoded_ok(const msg_result_t *r, const msg_gen_t *g, wire_err_t *err) {
    const char *out = msg_gen_output(g);
    bool frames = !strcmp(out, "frames"), video = !strcmp(out, "video");
    char a[96];
    if ((r->frames && !frames) || (r->video && !video))
        return refuse(err, WIRE_E_INTERNAL, "RESULT: %s, which the request did not ask for", r->frames ? "frames" : "video");
    if (video && (!r->video || r->video->dtype != WIRE_U8 || r->video->ndim != 1 || r->video->bytes == 0))
        return refuse(err, WIRE_E_INTERNAL, "RESULT: video is %s, not the U8 bytes of an MP4", describe(r->video, a, sizeof a));
    if (!frames) return 0;
    uint64_t n = msg_gen_n(g);
    int nl = n > 1;
    int64_t want[5] = { (int64_t)n, 1 + MSG_VAE_TIME * (g->latent_shape[1] - 1), MSG_VAE_SPACE * g->latent_shape[2],
                        MSG_VAE_SPACE * g->latent_shape[3], 3 };
    bool same = r->frames && r->frames->dtype == WIRE_U8 && r->frames->ndim == 4 + nl;
    for (int d = 0; same && d < 4 + nl; d++) same = r->frames->shape[d] == want[d + !nl];
    if (!same)
        return refuse(err, WIRE_E_INTERNAL, "RESULT: frames is %s, expected U8[%s%" PRId64 ",%" PRId64 ",%" PRId64 ",3]",
                      describe(r->frames, a, sizeof a), nl ? "n," : "", want[1], want[2], want[3]);
    return 0;
}

/* A RESULT's stats against the n x N steps its request could run: every
 * step runs once, captured, replayed or eager (a group's sub-batches and
 * the parts it is split into each count their own batched steps, at most
 * one per sample), an eager one under one decline reason; a batched step
 * has at most MSG_MAX_BATCH_ROWS rows, padding included. Counts past
 * that (2^64 - 1, say) would reach the client, STATUS steps_* and the
 * catalog as if they ran. */
static int stats_ok(const msg_stats_t *s, uint64_t steps, wire_err_t *err) {
    uint64_t declined = 0;
    for (int i = 0; i < s->declines.n; i++) {
        if (s->declines.e[i].n > steps)
            return refuse(err, WIRE_E_INTERNAL, "RESULT: stats.declines.%s %" PRIu64 ", more than the %" PRIu64
                          " steps its request runs", s->declines.e[i].name, s->declines.e[i].n, steps);
        declined += s->declines.e[i].n; /* (at most 32 of <= 2^20 each: no overflow) */
    }
    if (s->captured > steps || s->replayed > steps || s->eager > steps ||
        s->captured + s->replayed + s->eager > steps || s->batched > steps || declined > steps)
        return refuse(err, WIRE_E_INTERNAL, "RESULT: stats count %" PRIu64 " captured, %" PRIu64 " replayed, %" PRIu64
                      " eager, %" PRIu64 " batched and %" PRIu64 " declined steps, more than the %" PRIu64
                      " its request runs", s->captured, s->replayed, s->eager, s->batched, declined, steps);
    if (s->batch_rows > s->batched * MSG_MAX_BATCH_ROWS || s->padded_rows > s->batched * MSG_MAX_BATCH_ROWS)
        return refuse(err, WIRE_E_INTERNAL, "RESULT: stats count %" PRIu64 " batch rows and %" PRIu64 " padded rows "
                      "in %" PRIu64 " batched steps, more than %d a step", s->batch_rows, s->padded_rows, s->batched,
                      MSG_MAX_BATCH_ROWS);
    if (s->seconds < 0)
        return refuse(err, WIRE_E_INTERNAL, "RESULT: stats.seconds %g is negative", s->seconds);
    return 0;
}

int msg_result_check(const msg_result_t *r, const msg_gen_t *g, uint64_t required, wire_err_t *err) {
    uint64_t n = msg_gen_n(g), N = g->steps;
    bool group = n > 1;
    int nl = group ? 1 : 0;
    int64_t lead[2] = { (int64_t)n, (int64_t)N + 1 }, lead2[2] = { (int64_t)n, (int64_t)N };
    char a[96];
    if (r->version < 1 || r->version < required)
        return refuse(err, WIRE_E_INTERNAL, "RESULT: version %" PRIu64 ", the request needs at least %" PRIu64,
                      r->version, required > 1 ? required : 1);
    if (r->first_version > r->version)
        return refuse(err, WIRE_E_INTERNAL, "RESULT: first_version %" PRIu64 " is newer than version %" PRIu64,
                      r->first_version, r->version);
    if (!shape_is(r->latent, nl, lead, 4, g->latent_shape))
        return refuse(err, WIRE_E_INTERNAL, "RESULT: latent is %s, the request's is %s[%s%" PRId64 ",%" PRId64
                      ",%" PRId64 ",%" PRId64 "]", describe(r->latent, a, sizeof a), "F32", group ? "n," : "",
                      g->latent_shape[0], g->latent_shape[1], g->latent_shape[2], g->latent_shape[3]);
    struct { const char *name; const wire_tensor_t *t; bool asked; int nl; const int64_t *lead; int ns;
             const int64_t *shape; } want[] = {
        { "trajectory", r->trajectory, g->return_trajectory, 1 + nl, group ? lead : lead + 1, 4, g->latent_shape },
        { "means", r->means, g->return_means, 1 + nl, group ? lead2 : lead2 + 1, 4, g->latent_shape },
        { "log_probs", r->log_probs, g->return_log_probs, nl, lead2, 1, &lead2[1] },
        { "sigmas", r->sigmas, g->return_log_probs, 0, NULL, 1, &lead[1] },
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        if (!want[i].asked && want[i].t)
            return refuse(err, WIRE_E_INTERNAL, "RESULT: %s, which the request did not ask for", want[i].name);
        if (want[i].asked && !shape_is(want[i].t, want[i].nl, want[i].lead, want[i].ns, want[i].shape))
            return refuse(err, WIRE_E_INTERNAL, "RESULT: %s is %s, not of the request's shape", want[i].name,
                          describe(want[i].t, a, sizeof a));
    }
    /* timesteps [N] when asked; an older worker sends none */
    if (r->timesteps && !(g->return_timesteps && shape_is(r->timesteps, 0, NULL, 1, &lead2[1])))
        return refuse(err, WIRE_E_INTERNAL, "RESULT: timesteps %s, which the request did not ask for as [N]",
                      describe(r->timesteps, a, sizeof a));
    /* Never a result of NaN or infinity (a worker judges all of its own;
     * this is the backstop for one that did not: the latent, log_probs and
     * sigmas; a rollout's trajectory and means, up to N + 1 latents, stay
     * the worker's to judge, off the broker's one event-loop thread) */
    const wire_tensor_t *vals[] = { r->latent, r->log_probs, r->sigmas, r->timesteps };
    const char *names[] = { "latent", "log_probs", "sigmas", "timesteps" };
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++)
        if (vals[i] && !kern_all_finite(vals[i]->data, vals[i]->bytes / sizeof(float), KERN_F32))
            return refuse(err, WIRE_E_INTERNAL, "RESULT: %s holds NaN or infinite values", names[i]);
    if (decoded_ok(r, g, err)) return -1;
    if (group ? r->n != n || (uint64_t)r->n_seeds != n : r->n > 1 || r->n_seeds != 0)
        return refuse(err, WIRE_E_INTERNAL, "RESULT: n %" PRIu64 " with %d seeds, the request asked for %" PRIu64
                      " sample(s)", r->n, r->n_seeds, n);
    for (size_t i = 0; i < r->n_version_runs; i++) {
        const msg_version_run_t *v = &r->version_runs[i];
        if ((i == 0 && v->from != 0) || (i > 0 && v->from <= v[-1].from) || v->from >= n * N || v->version < 1)
            return refuse(err, WIRE_E_INTERNAL, "RESULT: version_runs[%zu] (from %" PRIu64 ", version %" PRIu64
                          ") is not a run of its %" PRIu64 " x %" PRIu64 " steps", i, v->from, v->version, n, N);
    }
    return stats_ok(&r->stats, n * N, err);
}

int msg_sync_validate(const msg_sync_t *s, bool inline_ok, wire_err_t *err) {
    /* Bounded where every store of it holds it whole (the catalog's too). */
    if (strlen(s->path) > MSG_PATH_MAX - 1)
        return refuse(err, WIRE_E_BAD_REQUEST, "'path' is %zu bytes, longer than %d", strlen(s->path), MSG_PATH_MAX - 1);
    int sources = (s->path[0] != 0) + (s->n_tensors > 0) + s->uploaded;
    if (s->base_version) {
        /* An adapter on a base the workers hold, or that base again. */
        if (s->base_version >= s->version)
            return refuse(err, WIRE_E_BAD_REQUEST, "'base_version' %" PRIu64 " must be below 'version' %" PRIu64,
                          s->base_version, s->version);
        if (s->n_tensors > 0 || sources > 1)
            return refuse(err, WIRE_E_BAD_REQUEST, "an adapter goes by 'path' (its PEFT folder) or 'uploaded' "
                          "(its adapter_model.safetensors, with 'lora_config'), or with neither for the base itself");
        if (s->uploaded != (s->lora_config[0] != 0))
            return refuse(err, WIRE_E_BAD_REQUEST, "'lora_config' (the adapter_config.json text) goes with "
                          "'uploaded', and only with it");
        return 0;
    }
    if (s->lora_config[0]) return refuse(err, WIRE_E_BAD_REQUEST, "'lora_config' needs 'base_version'");
    /* A message carries at most 8 tensors and a model has more: workers
     * reload whole models from a file. (Said first where inline tensors
     * are not an option, so no message offers them.) */
    if (s->n_tensors > 0 && !inline_ok)
        return refuse(err, WIRE_E_BAD_REQUEST, "inline tensors: a SYNC names its weights by 'path' (a safetensors "
                      "file the workers can read) or 'uploaded'");
    if (sources > 1)
        return refuse(err, WIRE_E_BAD_REQUEST, inline_ok ? "give one of 'path', 'uploaded' and inline tensors"
                                                         : "give one of 'path' and 'uploaded'");
    if (sources == 0)
        return refuse(err, WIRE_E_BAD_REQUEST, inline_ok ? "neither 'path', 'uploaded' nor inline tensors given"
                                                         : "neither 'path' nor 'uploaded' given");
    return 0;
}

wire_tensor_t msg_chunk(const void *p, size_t n) {
    wire_tensor_t t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "chunk");
    t.dtype = WIRE_U8;
    t.ndim = 1;
    t.shape[0] = (int64_t)n;
    t.data = p;
    t.bytes = n;
    return t;
}

/* A chunk is a U8 tensor of 1..MSG_CHUNK_MAX bytes (0 allowed where
 * empty_ok: FETCH_DATA past the end). */
static int chunk_ok(const wire_tensor_t *c, bool empty_ok, wire_err_t *err) {
    if (!c) return refuse(err, WIRE_E_BAD_REQUEST, "no 'chunk' tensor");
    if (c->dtype != WIRE_U8 || c->ndim != 1)
        return refuse(err, WIRE_E_BAD_REQUEST, "'chunk' must be a U8 tensor of one dimension");
    if ((!empty_ok && c->bytes == 0) || c->bytes > MSG_CHUNK_MAX)
        return refuse(err, WIRE_E_BAD_REQUEST, "'chunk' must hold 1..%" PRIu64 " bytes (got %zu)", MSG_CHUNK_MAX,
                      c->bytes);
    return 0;
}

int msg_upload_validate(const msg_upload_t *u, wire_err_t *err) {
    if (chunk_ok(u->chunk, false, err) != 0) return -1;
    if (u->offset + u->chunk->bytes > u->size)
        return refuse(err, WIRE_E_BAD_REQUEST, "the chunk at %" PRIu64 " of %zu bytes ends past 'size' %" PRIu64,
                      u->offset, u->chunk->bytes, u->size);
    return 0;
}

int msg_fetch_data_validate(const msg_fetch_data_t *f, wire_err_t *err) {
    if (chunk_ok(f->chunk, true, err) != 0) return -1;
    if (f->offset + f->chunk->bytes > f->size)
        return refuse(err, WIRE_E_BAD_REQUEST, "the chunk at %" PRIu64 " ends past 'size' %" PRIu64, f->offset, f->size);
    return 0;
}

int msg_ready_validate(const msg_ready_t *r, wire_err_t *err) {
    for (int i = 0; i < r->versions.n; i++)
        if (r->versions.e[i].n > MSG_VERSION_MAX)
            return refuse(err, WIRE_E_BAD_REQUEST, "'versions' %s must be in 0..%" PRIu64 " (got %" PRIu64 ")",
                          r->versions.e[i].name, MSG_VERSION_MAX, r->versions.e[i].n);
    if (r->n_models > MSG_MAX_MODELS)
        return refuse(err, WIRE_E_BAD_REQUEST, "'models' must list at most %d models", MSG_MAX_MODELS);
    for (size_t i = 0; i < r->n_models; i++)
        if (strlen(r->models[i]) > MSG_MODEL_NAME_MAX - 1)
            return refuse(err, WIRE_E_BAD_REQUEST, "'models' names are at most %d characters", MSG_MODEL_NAME_MAX - 1);
    for (size_t i = 0; i < r->n_configs; i++) {
        bool listed = false;
        for (size_t j = 0; j < r->n_models && !listed; j++) listed = !strcmp(r->configs[i].name, r->models[j]);
        if (!listed) return refuse(err, WIRE_E_BAD_REQUEST, "'configs' names model '%s', not in 'models'", r->configs[i].name);
    }
    return 0;
}

int msg_prewarm_validate(const msg_prewarm_t *p, wire_err_t *err) {
    if (p->n_keys > MSG_MAX_PREWARM)
        return refuse(err, WIRE_E_BAD_REQUEST, "'keys' must list at most %d keys (got %zu)", MSG_MAX_PREWARM, p->n_keys);
    for (size_t i = 0; i < p->n_keys; i++) {
        const msg_prewarm_key_t *k = &p->keys[i];
        if (latent_shape_ok(k->latent_shape, err) != 0) return -1;
        const char *solver = k->solver[0] ? k->solver : "euler";
        if (strcmp(solver, "euler") && strcmp(solver, "unipc") && strcmp(solver, "dpm++"))
            return refuse(err, WIRE_E_BAD_REQUEST, "'keys' %zu: 'solver' must be euler, unipc or dpm++ (got '%s')", i,
                          solver);
    }
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------- */

bool msg_sha256_valid(const char *s) {
    if (!s || strnlen(s, 65) != 64) return false;
    for (int i = 0; i < 64; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
    }
    return true;
}

/* By hand: the broker writes one per request, and snprintf costs more
 * than everything else it does with the hash. */
char *msg_hex64(uint64_t h, char buf[17]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--, h >>= 4) buf[i] = digits[h & 15];
    buf[16] = '\0';
    return buf;
}
