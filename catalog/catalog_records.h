/* catalog_records.h -- every kind of record the catalog is written with,
 * each defined once: its fields and the statement that stores it.
 * Included by catalog.h; from these tables come the writer cat_<kind>(),
 * its struct cat_<kind>_t in the union cat_rec_t, the SQLite binding
 * (catalog.c) and the broker's queue push brk_cq_<kind>() (broker/
 * brk_catq.c). A new kind is a new pair of lines here and a row in
 * CAT_RECORDS: nothing else is written by hand.
 *
 * CAT_<KIND>(F) lists the fields as F(TYPE, member), in the order of the
 * writer's parameters; field i is the statement's parameter ?i. TYPE is
 *   TEXT  const char *   a NULL binds NULL; the broker's queue stores it as ""
 *   OPT   const char *   optional text: NULL or "" binds NULL
 *   INT   int
 *   U64   uint64_t       stored as SQLite's signed 64-bit INTEGER
 *   F64   double
 *   BOOL  bool           stored as 0 or 1
 *   TIME  double         UNIX seconds; the queue takes it at the push, so a
 *                        brk_cq_<kind>() has every parameter but this one
 * CAT_SQL_<KIND> is the statement, prepared once per connection. */
#ifndef REEL_CATALOG_CATALOG_RECORDS_H
#define REEL_CATALOG_CATALOG_RECORDS_H

/* X(kind, KIND, what): `what` names the record in error messages. */
#define CAT_RECORDS(X)                                       \
    X(worker_seen, WORKER_SEEN, "worker seen")               \
    X(worker_gone, WORKER_GONE, "worker gone")               \
    X(worker_heard, WORKER_HEARD, "worker heard")             \
    X(weight_version, WEIGHT_VERSION, "weight version")      \
    X(weight_state, WEIGHT_STATE, "weight version state")    \
    X(weight_base, WEIGHT_BASE, "weight version base")       \
    X(weight_adapter, WEIGHT_ADAPTER, "weight version adapter") \
    X(weight_fail_pending, WEIGHT_FAIL_PENDING, "fail pending versions") \
    X(worker_version, WORKER_VERSION, "worker version")      \
    X(capture, CAPTURE, "capture")                           \
    X(replays, REPLAYS, "replays")                           \
    X(eviction, EVICTION, "eviction")                        \
    X(decline, DECLINE, "decline")                           \
    X(request, REQUEST, "request")                           \
    X(artifact, ARTIFACT, "artifact")                        \
    X(audit, AUDIT, "audit")                                 \
    X(artifact_seen, ARTIFACT_SEEN, "artifact seen")         \
    X(artifact_key, ARTIFACT_KEY, "artifact key")                 \
    X(key_text, KEY_TEXT, "key text")

/* A worker sent READY: live again if it had gone (unless this READY is
 * older than its going). boot is its process's id (16 hex digits; NULL
 * from a worker older than it): a READY with another boot than the one
 * recorded is a new process, whose graphs its old one's are not
 * (cat_write records them evicted, reason "worker_restarted"). */
#define CAT_WORKER_SEEN(F) \
    F(TEXT, worker) F(TEXT, device) F(TEXT, arch) F(INT, streams) F(U64, budget) F(OPT, boot) F(TIME, t)
#define CAT_SQL_WORKER_SEEN                                                                        \
    "INSERT INTO workers (name, device, arch, streams, budget, boot, first_seen, last_seen)"       \
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)"                                                     \
    " ON CONFLICT (name) DO UPDATE SET device = excluded.device, arch = excluded.arch,"            \
    " streams = excluded.streams, budget = excluded.budget, boot = excluded.boot,"                 \
    " first_seen = min(first_seen, excluded.first_seen),"                                          \
    " last_seen = max(last_seen, excluded.last_seen),"                                             \
    " gone_reason = CASE WHEN gone_at > excluded.last_seen THEN gone_reason END,"                  \
    " gone_at = CASE WHEN gone_at > excluded.last_seen THEN gone_at END"

/* A worker was dropped, and why. */
#define CAT_WORKER_GONE(F) F(TEXT, worker) F(TEXT, why) F(TIME, t)
#define CAT_SQL_WORKER_GONE                                                                        \
    "INSERT INTO workers (name, first_seen, last_seen, gone_at, gone_reason)"                      \
    " VALUES (?1, ?3, ?3, ?3, ?2)"                                                                 \
    " ON CONFLICT (name) DO UPDATE SET gone_at = excluded.gone_at,"                                \
    " gone_reason = excluded.gone_reason"

/* A live worker was heard at `heard` (UNIX seconds): last_seen moves on
 * (never back). The broker records it at most once a minute per worker
 * (BRK_HEARD_EVERY_MS) and when the worker leaves, so last_seen says when
 * it was last heard, within a minute, not when it sent READY. */
#define CAT_WORKER_HEARD(F) F(TEXT, worker) F(F64, heard)
#define CAT_SQL_WORKER_HEARD "UPDATE workers SET last_seen = max(last_seen, ?2) WHERE name = ?1"

/* A weight version the trainer published, recorded 'pending' (publishing
 * a version again, after it failed, starts it over: pending, reason
 * cleared, and no base, adapter or config left from the refused one: a
 * LoRA version's base is recorded after it, CAT_WEIGHT_BASE). */
#define CAT_WEIGHT_VERSION(F) \
    F(TEXT, component) F(U64, version) F(TEXT, sha256) F(TEXT, source) F(TIME, t)
#define CAT_SQL_WEIGHT_VERSION                                                                     \
    "INSERT INTO weight_versions (component, version, sha256, source, t)"                          \
    " VALUES (?1, ?2, ?3, ?4, ?5)"                                                                 \
    " ON CONFLICT (component, version) DO UPDATE SET sha256 = excluded.sha256,"                    \
    " source = coalesce(excluded.source, source), t = excluded.t, state = 'pending',"              \
    " reason = NULL, base_version = NULL, adapter = NULL, lora_config = NULL"

/* A published version that is a LoRA adapter on base_version; one sent
 * by upload with its adapter_config.json text (lora_config), which a
 * restarted broker needs to send the SYNC again. */
#define CAT_WEIGHT_BASE(F) F(TEXT, component) F(U64, version) F(U64, base_version) F(OPT, lora_config)
#define CAT_SQL_WEIGHT_BASE \
    "UPDATE weight_versions SET base_version = ?3, lora_config = ?4, adapter = NULL" \
    " WHERE component = ?1 AND version = ?2"

/* The adapter a worker applied as that version (JSON: rank, alpha,
 * rslora, scale, targets, modules, bytes, sha256, layout). */
#define CAT_WEIGHT_ADAPTER(F) F(TEXT, component) F(U64, version) F(TEXT, adapter)
#define CAT_SQL_WEIGHT_ADAPTER \
    "UPDATE weight_versions SET adapter = ?3 WHERE component = ?1 AND version = ?2"

/* The state of a recorded version: "pending", "current" (a worker applied
 * it; older current versions of the component become "superseded"),
 * "superseded" or "failed" (no worker applied it; reason says why).
 * Unknown states are refused (-1, nothing written). Setting the state of a
 * version never recorded changes nothing. */
#define CAT_WEIGHT_STATE(F) F(TEXT, component) F(U64, version) F(TEXT, state) F(OPT, reason)
#define CAT_SQL_WEIGHT_STATE \
    "UPDATE weight_versions SET state = ?3, reason = ?4 WHERE component = ?1 AND version = ?2"

/* Every pending version fails with reason: a broker that starts finds
 * those its previous run published and never saw applied. */
#define CAT_WEIGHT_FAIL_PENDING(F) F(TEXT, reason)
#define CAT_SQL_WEIGHT_FAIL_PENDING \
    "UPDATE weight_versions SET state = 'failed', reason = ?1 WHERE state = 'pending'"

/* A worker applied (ok) or failed to apply a version; the latest outcome
 * per (worker, component, version) wins. */
#define CAT_WORKER_VERSION(F) \
    F(TEXT, worker) F(TEXT, component) F(U64, version) F(BOOL, ok) F(OPT, error) F(TIME, t)
#define CAT_SQL_WORKER_VERSION                                                                     \
    "INSERT INTO worker_versions (worker, component, version, ok, error, t)"                       \
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6)"                                                             \
    " ON CONFLICT (worker, component, version) DO UPDATE SET ok = excluded.ok,"                    \
    " error = excluded.error, t = excluded.t"

/* A graph captured and verified. version: the weight version the worker
 * ran when the broker got the event (the summaries' version; not a column
 * of captures). origin: "demand" (NULL: the same) or "prewarm" (a capture
 * a starting worker made before any request of the key: --prewarm). The same capture reported twice is one capture: the
 * second changes nothing (it only turns a placeholder row into a capture). */
#define CAT_CAPTURE(F)                                                                             \
    F(TEXT, worker) F(TEXT, key_text) F(TEXT, key_hash) F(INT, stream) F(U64, bytes) F(U64, nodes) \
    F(F64, seconds) F(U64, version) F(OPT, origin) F(TIME, t)
#define CAT_SQL_CAPTURE                                                                            \
    "INSERT INTO captures (worker, stream, key_text, key_hash, capture_seconds, bytes, nodes,"     \
    " origin, t) VALUES (?1, ?4, ?2, ?3, ?7, ?5, ?6, coalesce(?9, 'demand'), ?10)"                 \
    " ON CONFLICT (worker, key_hash, stream, t) DO UPDATE SET key_text = excluded.key_text,"       \
    " capture_seconds = excluded.capture_seconds, bytes = excluded.bytes,"                         \
    " nodes = excluded.nodes, origin = excluded.origin, placeholder = 0 WHERE placeholder = 1"

/* A capture key's text, by its hash: what a graph re-keyed in place by a
 * sync is known by from then on (it is not captured again, so no capture
 * row brings its new key's text); the newer text of a hash wins. */
#define CAT_KEY_TEXT(F) F(TEXT, key_hash) F(TEXT, key_text) F(TIME, t)
#define CAT_SQL_KEY_TEXT                                                                           \
    "INSERT INTO key_texts (key_hash, key_text, t) VALUES (?1, ?2, ?3)"                            \
    " ON CONFLICT (key_hash) DO UPDATE SET key_text = excluded.key_text, t = excluded.t"           \
    " WHERE excluded.t >= key_texts.t"

/* `count` more replays of the newest capture of (worker, key_hash,
 * stream). Replays whose capture was never reported (a lost message, a
 * catalog created after the worker started) get a placeholder capture
 * (CAT_SQL_REPLAYS_NEW) so the count is not lost. */
#define CAT_REPLAYS(F) \
    F(TEXT, worker) F(TEXT, key_hash) F(INT, stream) F(U64, count) F(U64, version) F(TIME, t)
#define CAT_SQL_REPLAYS                                                                            \
    "UPDATE captures SET replay_count = replay_count + ?4,"                                        \
    " last_replay = max(coalesce(last_replay, ?6), ?6)"                                            \
    " WHERE id = (SELECT id FROM captures WHERE worker = ?1 AND key_hash = ?2 AND stream = ?3"     \
    " ORDER BY t DESC, id DESC LIMIT 1)"

/* A graph evicted, and why. version: as for a capture; the summaries
 * count the eviction at to_version when it is set (the sync that caused
 * it), else at version. */
#define CAT_EVICTION(F)                                                                            \
    F(TEXT, worker) F(TEXT, key_text) F(TEXT, key_hash) F(INT, stream) F(TEXT, reason)             \
    F(TEXT, component) F(U64, from_version) F(U64, to_version) F(U64, version) F(TIME, t)
#define CAT_SQL_EVICTION                                                                           \
    "INSERT INTO evictions (worker, key_text, key_hash, stream, reason, component, from_version,"  \
    " to_version, t) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?10)"

/* `count` more declines of `reason` for (worker, key_hash). */
#define CAT_DECLINE(F) \
    F(TEXT, worker) F(TEXT, key_text) F(TEXT, key_hash) F(TEXT, reason) F(U64, count) F(TIME, t)
#define CAT_SQL_DECLINE                                                                            \
    "INSERT INTO declines (worker, key_hash, key_text, reason, count, last_t)"                     \
    " VALUES (?1, ?3, ?2, ?4, ?5, ?6)"                                                             \
    " ON CONFLICT (worker, key_hash, reason) DO UPDATE SET count = count + excluded.count,"        \
    " last_t = max(last_t, excluded.last_t), key_text = coalesce(excluded.key_text, key_text)"

/* One finished request, as the client saw it. Of its steps, batched_steps
 * ran in a mixed batch with other requests: batch_rows sums the requests
 * of those batches (their mean size: batch_rows / batched_steps),
 * padded_rows the padding rows they computed and threw away. capture_key
 * is the capture key hash its last step ran under (the key captures,
 * replays, declines and evictions are recorded by; NULL for a request
 * without a RESULT), eager_reasons why its eager steps ran eager
 * ("warming_up=2,budget_exceeded=1"; NULL when none did), error why a
 * failed one failed (its ERROR's message; NULL for an ok one). seconds is
 * the sum of its own steps (and its encode and decode) as its worker
 * timed them, not the time between its start and its end (its stream
 * also steps other requests in between); started is when the broker sent
 * it to the worker that answered (UNIX seconds; when it accepted it, for
 * one that never reached a worker; NaN, stored NULL: unknown); broker_id
 * is the broker's id of it (REQUEST's id, the one its worker's log
 * names; id is the client's). */
#define CAT_REQUEST(F)                                                                             \
    F(U64, id) F(TEXT, worker) F(TEXT, key_hash) F(U64, version) F(INT, steps) F(U64, captured)    \
    F(U64, replayed) F(U64, eager) F(F64, seconds) F(TEXT, status) F(F64, encode_seconds)           \
    F(F64, decode_seconds) F(U64, batched_steps) F(U64, batch_rows) F(U64, padded_rows)             \
    F(OPT, capture_key) F(OPT, eager_reasons) F(OPT, error) F(F64, started) F(U64, broker_id) F(TIME, t)
#define CAT_SQL_REQUEST                                                                            \
    "INSERT INTO requests (id, worker, key_hash, version, steps, captured, replayed, eager,"       \
    " seconds, status, encode_seconds, decode_seconds, batched_steps, batch_rows, padded_rows,"    \
    " capture_key, eager_reasons, error, started, broker_id, t)"                                  \
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20," \
    " ?21)"

/* A kernel artifact built or checked on a backend. */
#define CAT_ARTIFACT(F)                                                                            \
    F(TEXT, id) F(TEXT, op) F(TEXT, backend) F(TEXT, sha256) F(TEXT, status) F(TEXT, reason)       \
    F(TIME, t)
#define CAT_SQL_ARTIFACT                                                                           \
    "INSERT INTO artifacts (id, op, backend, sha256, status, reason, t)"                           \
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"                                                         \
    " ON CONFLICT (id) DO UPDATE SET op = excluded.op, backend = excluded.backend,"                \
    " sha256 = excluded.sha256, status = excluded.status, reason = excluded.reason,"               \
    " t = excluded.t"

/* A kernel bundle a worker scanned (docs/ARTIFACTS.md): status "verified",
 * "loaded" or "refused" (reason says why); the newest report of an id wins
 * but first_seen and last_seen span them all. */
#define CAT_ARTIFACT_SEEN(F)                                                                       \
    F(TEXT, id) F(TEXT, version) F(TEXT, op) F(TEXT, backend) F(OPT, sha256) F(BOOL, verified)     \
    F(BOOL, enabled) F(TEXT, status) F(OPT, reason) F(TIME, t)
#define CAT_SQL_ARTIFACT_SEEN                                                                      \
    "INSERT INTO artifacts (id, op, backend, sha256, status, reason, t, version, verified,"        \
    " enabled, first_seen, last_seen) VALUES (?1, ?3, ?4, ?5, ?8, ?9, ?10, ?2, ?6, ?7, ?10, ?10)"  \
    " ON CONFLICT (id) DO UPDATE SET op = excluded.op, backend = excluded.backend,"                \
    " sha256 = excluded.sha256, status = excluded.status, reason = excluded.reason,"               \
    " t = excluded.t, version = excluded.version, verified = excluded.verified,"                   \
    " enabled = excluded.enabled,"                                                                 \
    " first_seen = min(coalesce(first_seen, excluded.first_seen), excluded.first_seen),"           \
    " last_seen = max(coalesce(last_seen, excluded.last_seen), excluded.last_seen)"

/* An artifact at one kernel key on a worker: its state ("undecided",
 * "promoted", "demoted", "failed", "ineligible"), why, and its counters
 * since that worker started; each report replaces the last (speedup is
 * native/artifact over the timed calls, 0 when none was timed). */
#define CAT_ARTIFACT_KEY(F)                                                                        \
    F(TEXT, worker) F(TEXT, id) F(TEXT, key) F(TEXT, state) F(OPT, reason) F(U64, calls)           \
    F(U64, native_calls) F(U64, parity_pass) F(U64, parity_fail) F(U64, fallbacks) F(U64, timed)   \
    F(F64, speedup) F(F64, speedup_sd) F(U64, sync_timed) F(F64, sync_s) F(TIME, t)
#define CAT_SQL_ARTIFACT_KEY                                                                       \
    "INSERT INTO artifact_keys (worker, id, key, state, reason, calls, native_calls, parity_pass," \
    " parity_fail, fallbacks, timed, speedup, speedup_sd, sync_timed, sync_s, t)"                  \
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"              \
    " ON CONFLICT (worker, id, key) DO UPDATE SET state = excluded.state,"                         \
    " reason = excluded.reason, calls = excluded.calls, native_calls = excluded.native_calls,"      \
    " parity_pass = excluded.parity_pass, parity_fail = excluded.parity_fail,"                     \
    " fallbacks = excluded.fallbacks, timed = excluded.timed, speedup = excluded.speedup,"         \
    " speedup_sd = excluded.speedup_sd, sync_timed = excluded.sync_timed, sync_s = excluded.sync_s,"   \
    " t = excluded.t"

/* A SYNC a peer sent, whatever became of it: the trainer role's audit
 * trail (docs/SECURITY.md). key_name and role: its CURVE key's ("-" and
 * "none" on a broker without keys; "*" for the resends of keys past
 * the first 4 to resend a version); outcome: "accepted", "resend",
 * "resend: N more while ..." (a key's resends after its first, counted:
 * broker/brk_sync.c), "refused: CODE: why" or "denied: why". */
#define CAT_AUDIT(F)                                                                               \
    F(TEXT, key_name) F(TEXT, role) F(TEXT, action) F(OPT, component) F(U64, version)             \
    F(OPT, sha256) F(OPT, path) F(TEXT, outcome) F(TIME, t)
#define CAT_SQL_AUDIT                                                                              \
    "INSERT INTO audit (key_name, role, action, component, version, sha256, path, outcome, t)"    \
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"

/* The C type of each field type. */
#define CAT_CTYPE_TEXT const char *
#define CAT_CTYPE_OPT const char *
#define CAT_CTYPE_INT int
#define CAT_CTYPE_U64 uint64_t
#define CAT_CTYPE_F64 double
#define CAT_CTYPE_BOOL bool
#define CAT_CTYPE_TIME double

/* Field expanders: a struct member; ", type name" for a parameter list
 * (CAT_QPARAM leaves out the time, which the queue takes itself); a
 * member assigned from the parameter of its name. */
#define CAT_F_MEMBER(T, m) CAT_CTYPE_##T m;
#define CAT_F_PARAM(T, m) , CAT_CTYPE_##T m
#define CAT_F_QPARAM(T, m) CAT_QPARAM_##T(m)
#define CAT_QPARAM_TEXT(m) , const char *m
#define CAT_QPARAM_OPT(m) , const char *m
#define CAT_QPARAM_INT(m) , int m
#define CAT_QPARAM_U64(m) , uint64_t m
#define CAT_QPARAM_F64(m) , double m
#define CAT_QPARAM_BOOL(m) , bool m
#define CAT_QPARAM_TIME(m)
#define CAT_F_ASSIGN(T, m) x->m = m;

#endif
