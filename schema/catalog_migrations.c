/* catalog_migrations.c -- the catalog's schema as its migrations, each the
 * SQL that takes PRAGMA user_version from i to i + 1 (catalog/catalog.c runs
 * them). Their text never changes once shipped: catalogs were built from
 * it. */
#include "schema/catalog_schema.h"

/* Migration i (0-based) takes user_version i to i + 1. Migration 1 is the
 * first schema as it shipped (its text never changes: catalogs were built
 * from it); later ones are ALTERs, and schema/catalog.sql holds their sum
 * (tests/test_catalog.c builds a catalog from each and compares the two).
 * Not static: the test reads them (they are not part of catalog.h's
 * contract). */
const char cat_schema_v1_sql[] =
    "-- catalog.sql -- the Reel catalog schema (PRAGMA user_version 1).\n"
    "-- catalog/catalog.c embeds this text verbatim as migration 1 and\n"
    "-- tests/test_catalog.c fails if the two differ. Times are UNIX seconds\n"
    "-- (REAL). Counters and versions are uint64 stored as SQLite INTEGER.\n"
    "\n"
    "-- Kernel/op artifacts built or checked on a backend.\n"
    "CREATE TABLE IF NOT EXISTS artifacts (\n"
    "    id      TEXT PRIMARY KEY,\n"
    "    op      TEXT NOT NULL,\n"
    "    backend TEXT NOT NULL,\n"
    "    sha256  TEXT,\n"
    "    status  TEXT NOT NULL,\n"
    "    reason  TEXT,\n"
    "    t       REAL NOT NULL\n"
    ");\n"
    "\n"
    "-- Every weight version the trainer published.\n"
    "CREATE TABLE IF NOT EXISTS weight_versions (\n"
    "    component TEXT NOT NULL,\n"
    "    version   INTEGER NOT NULL,\n"
    "    sha256    TEXT NOT NULL,\n"
    "    source    TEXT,\n"
    "    t         REAL NOT NULL,\n"
    "    PRIMARY KEY (component, version)\n"
    ");\n"
    "\n"
    "-- Workers that ever sent READY; gone_at is NULL while the worker is live.\n"
    "CREATE TABLE IF NOT EXISTS workers (\n"
    "    name        TEXT PRIMARY KEY,\n"
    "    device      TEXT,\n"
    "    arch        TEXT,\n"
    "    streams     INTEGER,\n"
    "    budget      INTEGER,\n"
    "    first_seen  REAL NOT NULL,\n"
    "    last_seen   REAL NOT NULL,\n"
    "    gone_at     REAL,\n"
    "    gone_reason TEXT\n"
    ");\n"
    "\n"
    "-- Which worker applied (ok = 1) or failed to apply which weight version;\n"
    "-- the latest outcome per (worker, component, version) wins.\n"
    "CREATE TABLE IF NOT EXISTS worker_versions (\n"
    "    worker    TEXT NOT NULL,\n"
    "    component TEXT NOT NULL,\n"
    "    version   INTEGER NOT NULL,\n"
    "    ok        INTEGER NOT NULL,\n"
    "    error     TEXT,\n"
    "    t         REAL NOT NULL,\n"
    "    PRIMARY KEY (worker, component, version)\n"
    ");\n"
    "\n"
    "-- One row per graph captured. placeholder = 1 marks a row made for replays\n"
    "-- whose capture was never reported, so that no replay is lost; it does not\n"
    "-- count as a capture.\n"
    "CREATE TABLE IF NOT EXISTS captures (\n"
    "    id              INTEGER PRIMARY KEY,\n"
    "    worker          TEXT NOT NULL,\n"
    "    stream          INTEGER NOT NULL,\n"
    "    key_text        TEXT,\n"
    "    key_hash        TEXT NOT NULL,\n"
    "    capture_seconds REAL NOT NULL DEFAULT 0,\n"
    "    bytes           INTEGER NOT NULL DEFAULT 0,\n"
    "    nodes           INTEGER NOT NULL DEFAULT 0,\n"
    "    replay_count    INTEGER NOT NULL DEFAULT 0,\n"
    "    last_replay     REAL,\n"
    "    placeholder     INTEGER NOT NULL DEFAULT 0,\n"
    "    t               REAL NOT NULL,\n"
    "    UNIQUE (worker, key_hash, stream, t)\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS captures_by_key ON captures (key_hash);\n"
    "\n"
    "CREATE TABLE IF NOT EXISTS evictions (\n"
    "    id           INTEGER PRIMARY KEY,\n"
    "    worker       TEXT NOT NULL,\n"
    "    key_text     TEXT,\n"
    "    key_hash     TEXT NOT NULL,\n"
    "    reason       TEXT NOT NULL,\n"
    "    component    TEXT,\n"
    "    from_version INTEGER,\n"
    "    to_version   INTEGER,\n"
    "    t            REAL NOT NULL\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS evictions_by_time ON evictions (t);\n"
    "CREATE INDEX IF NOT EXISTS evictions_by_worker ON evictions (worker, reason);\n"
    "\n"
    "-- Decline counters: one row per (worker, key, reason), count accumulates.\n"
    "CREATE TABLE IF NOT EXISTS declines (\n"
    "    worker   TEXT NOT NULL,\n"
    "    key_hash TEXT NOT NULL,\n"
    "    key_text TEXT,\n"
    "    reason   TEXT NOT NULL,\n"
    "    count    INTEGER NOT NULL DEFAULT 0,\n"
    "    last_t   REAL NOT NULL,\n"
    "    PRIMARY KEY (worker, key_hash, reason)\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS declines_by_key ON declines (key_hash);\n"
    "\n"
    "-- Finished requests as the client saw them; id is the client's request id\n"
    "-- (not unique across broker restarts, hence no constraint).\n"
    "CREATE TABLE IF NOT EXISTS requests (\n"
    "    id       INTEGER NOT NULL,\n"
    "    worker   TEXT NOT NULL,\n"
    "    key_hash TEXT,\n"
    "    version  INTEGER NOT NULL,\n"
    "    steps    INTEGER NOT NULL,\n"
    "    captured INTEGER NOT NULL,\n"
    "    replayed INTEGER NOT NULL,\n"
    "    eager    INTEGER NOT NULL,\n"
    "    seconds  REAL NOT NULL,\n"
    "    status   TEXT NOT NULL,\n"
    "    t        REAL NOT NULL\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS requests_by_time ON requests (t);\n"
    "CREATE INDEX IF NOT EXISTS requests_by_worker ON requests (worker);\n";

/* Migration 2: a published weight version has a state. It is 'pending'
 * until a worker applies it, then 'current' (the broker resumes it after a
 * restart) until a newer one becomes current ('superseded'); 'failed' when
 * no worker applied it, with the reason. Before this the broker took every
 * published version as current, even one nobody could load: existing rows
 * are classified by what the workers reported. */
const char cat_schema_v2_sql[] =
    "ALTER TABLE weight_versions ADD COLUMN state TEXT NOT NULL DEFAULT 'pending';\n"
    "ALTER TABLE weight_versions ADD COLUMN reason TEXT;\n"
    "UPDATE weight_versions SET state = 'failed', reason = 'no worker applied it'"
    " WHERE NOT EXISTS (SELECT 1 FROM worker_versions v WHERE v.component = weight_versions.component"
    " AND v.version = weight_versions.version AND v.ok = 1);\n"
    "UPDATE weight_versions SET state = 'current' WHERE state = 'pending' AND version ="
    " (SELECT max(version) FROM weight_versions w WHERE w.component = weight_versions.component"
    " AND w.state = 'pending');\n"
    "UPDATE weight_versions SET state = 'superseded' WHERE state = 'pending';\n";

/* Migration 3: the audit trail of SYNCs, with the key that sent each
 * (issue 10: only trainers may publish weights, and every attempt is
 * recorded). */
const char cat_schema_v3_sql[] =
    "-- Every SYNC a peer sent, whatever became of it: the trainer role's\n"
    "-- audit trail (docs/SECURITY.md). key_name and role are its CURVE key's\n"
    "-- ('-' and 'none' on a broker without keys); outcome is 'accepted',\n"
    "-- 'resend', 'refused: CODE: why' or 'denied: why'.\n"
    "CREATE TABLE IF NOT EXISTS audit (\n"
    "    id        INTEGER PRIMARY KEY,\n"
    "    key_name  TEXT NOT NULL,\n"
    "    role      TEXT NOT NULL,\n"
    "    action    TEXT NOT NULL,\n"
    "    component TEXT,\n"
    "    version   INTEGER,\n"
    "    sha256    TEXT,\n"
    "    path      TEXT,\n"
    "    outcome   TEXT NOT NULL,\n"
    "    t         REAL NOT NULL\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS audit_by_time ON audit (t);\n";

/* Migration 4: kernel artifacts (issue 12, docs/ARTIFACTS.md): each bundle
 * a worker scanned, with its version, verdict and when it was first and
 * last seen; and each artifact's state and counters per kernel key and
 * worker. */
const char cat_schema_v4_sql[] =
    "ALTER TABLE artifacts ADD COLUMN version TEXT;\n"
    "ALTER TABLE artifacts ADD COLUMN verified INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE artifacts ADD COLUMN enabled INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE artifacts ADD COLUMN first_seen REAL;\n"
    "ALTER TABLE artifacts ADD COLUMN last_seen REAL;\n"
    "-- An artifact at one kernel key on a worker (docs/ARTIFACTS.md): its\n"
    "-- state and reason, and its counters since that worker started (each\n"
    "-- report replaces the last). speedup: native/artifact over the timed calls.\n"
    "CREATE TABLE IF NOT EXISTS artifact_keys (\n"
    "    worker       TEXT NOT NULL,\n"
    "    id           TEXT NOT NULL,\n"
    "    key          TEXT NOT NULL,\n"
    "    state        TEXT NOT NULL,\n"
    "    reason       TEXT,\n"
    "    calls        INTEGER NOT NULL DEFAULT 0,\n"
    "    native_calls INTEGER NOT NULL DEFAULT 0,\n"
    "    parity_pass  INTEGER NOT NULL DEFAULT 0,\n"
    "    parity_fail  INTEGER NOT NULL DEFAULT 0,\n"
    "    fallbacks    INTEGER NOT NULL DEFAULT 0,\n"
    "    timed        INTEGER NOT NULL DEFAULT 0,\n"
    "    speedup      REAL NOT NULL DEFAULT 0,\n"
    "    speedup_sd   REAL NOT NULL DEFAULT 0,\n"
    "    t            REAL NOT NULL,\n"
    "    PRIMARY KEY (worker, id, key)\n"
    ");\n";

/* Migration 5: requests lose their two indexes, each a quarter of the
 * catalog writer's time per request (bench/bench_broker, docs/BENCH.md).
 * Rows are written in the order they were queued, which is the order of
 * their times, so "the most recent" is the highest rowids; the per-worker
 * counts of `reelctl report` scanned the whole worker index anyway (its
 * queries match "every worker or this one"), and scan the table now. */
const char cat_schema_v5_sql[] =
    "DROP INDEX IF EXISTS requests_by_time;\n"
    "DROP INDEX IF EXISTS requests_by_worker;\n";

/* Migration 6: an artifact key's --artifact-timing sync measurements (the
 * artifact's launches timed alone, and their seconds), beside the shadow
 * comparisons' speedup (docs/ARTIFACTS.md, "In the catalog"). */
const char cat_schema_v6_sql[] =
    "ALTER TABLE artifact_keys ADD COLUMN sync_timed INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE artifact_keys ADD COLUMN sync_s REAL NOT NULL DEFAULT 0;\n";

/* Migration 7 (issue 13): summaries a report reads instead of raw rows, so
 * that a report costs the same after months of history; raw rows may then
 * be pruned (`reel-broker --catalog-retain`, --catalog-max-rows) and the
 * summaries keep their counts. They are built here once from the rows an
 * older catalog holds (captures and replays at version 0: those rows do not
 * say it), and kept up to date by the writer (catalog_rollup.c). */
const char cat_schema_v7_sql[] =
    "-- Summaries (migration 7), kept up to date by the writer at each commit\n"
    "-- (catalog/catalog_rollup.c) so that reports read them, not the raw rows,\n"
    "-- and kept when retention prunes raw rows (docs/OPERATIONS.md). hour and\n"
    "-- minute: UNIX seconds / 3600 and / 60, rounded down. version: the weight\n"
    "-- version a request ran on; for captures, replays and evictions the\n"
    "-- worker's version when the broker got the event (an eviction with a\n"
    "-- to_version counts at it); 0 for rows summarised from catalogs older than\n"
    "-- schema 7.\n"
    "CREATE TABLE IF NOT EXISTS rollups (\n"
    "    worker          TEXT NOT NULL,\n"
    "    key_hash        TEXT NOT NULL,\n"
    "    version         INTEGER NOT NULL,\n"
    "    hour            INTEGER NOT NULL,\n"
    "    requests        INTEGER NOT NULL DEFAULT 0,\n"
    "    failed          INTEGER NOT NULL DEFAULT 0,\n"
    "    steps           INTEGER NOT NULL DEFAULT 0,\n"
    "    captured        INTEGER NOT NULL DEFAULT 0,\n"
    "    replayed        INTEGER NOT NULL DEFAULT 0,\n"
    "    eager           INTEGER NOT NULL DEFAULT 0,\n"
    "    seconds         REAL NOT NULL DEFAULT 0,\n"
    "    seconds_max     REAL NOT NULL DEFAULT 0,\n"
    "    captures        INTEGER NOT NULL DEFAULT 0,\n"
    "    capture_seconds REAL NOT NULL DEFAULT 0,\n"
    "    replays         INTEGER NOT NULL DEFAULT 0,\n"
    "    last_replay     REAL,\n"
    "    evictions       INTEGER NOT NULL DEFAULT 0,\n"
    "    PRIMARY KEY (worker, key_hash, version, hour)\n"
    ") WITHOUT ROWID;\n"
    "CREATE INDEX IF NOT EXISTS rollups_by_hour ON rollups (hour);\n"
    "\n"
    "-- The rollups of each (key, worker) over all time: what `reelctl stats`,\n"
    "-- `keys` and `metrics` read.\n"
    "CREATE TABLE IF NOT EXISTS key_totals (\n"
    "    key_hash        TEXT NOT NULL,\n"
    "    worker          TEXT NOT NULL,\n"
    "    requests        INTEGER NOT NULL DEFAULT 0,\n"
    "    failed          INTEGER NOT NULL DEFAULT 0,\n"
    "    steps           INTEGER NOT NULL DEFAULT 0,\n"
    "    captured        INTEGER NOT NULL DEFAULT 0,\n"
    "    replayed        INTEGER NOT NULL DEFAULT 0,\n"
    "    eager           INTEGER NOT NULL DEFAULT 0,\n"
    "    seconds         REAL NOT NULL DEFAULT 0,\n"
    "    seconds_max     REAL NOT NULL DEFAULT 0,\n"
    "    captures        INTEGER NOT NULL DEFAULT 0,\n"
    "    capture_seconds REAL NOT NULL DEFAULT 0,\n"
    "    replays         INTEGER NOT NULL DEFAULT 0,\n"
    "    last_replay     REAL,\n"
    "    evictions       INTEGER NOT NULL DEFAULT 0,\n"
    "    PRIMARY KEY (key_hash, worker)\n"
    ") WITHOUT ROWID;\n"
    "\n"
    "-- Evictions per worker and reason, over all time.\n"
    "CREATE TABLE IF NOT EXISTS eviction_reasons (\n"
    "    worker TEXT NOT NULL,\n"
    "    reason TEXT NOT NULL,\n"
    "    count  INTEGER NOT NULL DEFAULT 0,\n"
    "    PRIMARY KEY (worker, reason)\n"
    ") WITHOUT ROWID;\n"
    "\n"
    "-- Evictions per hour, worker and reason: the stats of a time range.\n"
    "CREATE TABLE IF NOT EXISTS eviction_hours (\n"
    "    hour   INTEGER NOT NULL,\n"
    "    worker TEXT NOT NULL,\n"
    "    reason TEXT NOT NULL,\n"
    "    count  INTEGER NOT NULL DEFAULT 0,\n"
    "    PRIMARY KEY (hour, worker, reason)\n"
    ") WITHOUT ROWID;\n"
    "\n"
    "-- The newest text of each capture key seen (captures, evictions, declines).\n"
    "CREATE TABLE IF NOT EXISTS key_texts (\n"
    "    key_hash TEXT PRIMARY KEY,\n"
    "    key_text TEXT NOT NULL,\n"
    "    t        REAL NOT NULL\n"
    ") WITHOUT ROWID;\n"
    "\n"
    "-- Everything per minute: the report's timeline (steps: those that ran).\n"
    "CREATE TABLE IF NOT EXISTS timeline (\n"
    "    minute    INTEGER PRIMARY KEY,\n"
    "    requests  INTEGER NOT NULL DEFAULT 0,\n"
    "    failed    INTEGER NOT NULL DEFAULT 0,\n"
    "    steps     INTEGER NOT NULL DEFAULT 0,\n"
    "    replayed  INTEGER NOT NULL DEFAULT 0,\n"
    "    seconds   REAL NOT NULL DEFAULT 0,\n"
    "    captures  INTEGER NOT NULL DEFAULT 0,\n"
    "    evictions INTEGER NOT NULL DEFAULT 0\n"
    ");\n"
    "\n"
    "-- The 20 slowest requests of each hour (a copy of their requests rows).\n"
    "CREATE TABLE IF NOT EXISTS slow_requests (\n"
    "    hour     INTEGER NOT NULL,\n"
    "    id       INTEGER NOT NULL,\n"
    "    worker   TEXT NOT NULL,\n"
    "    key_hash TEXT,\n"
    "    version  INTEGER NOT NULL,\n"
    "    steps    INTEGER NOT NULL,\n"
    "    captured INTEGER NOT NULL,\n"
    "    replayed INTEGER NOT NULL,\n"
    "    eager    INTEGER NOT NULL,\n"
    "    seconds  REAL NOT NULL,\n"
    "    status   TEXT NOT NULL,\n"
    "    t        REAL NOT NULL\n"
    ");\n"
    "CREATE INDEX IF NOT EXISTS slow_requests_by_hour ON slow_requests (hour, seconds);\n"
    "CREATE INDEX IF NOT EXISTS slow_requests_by_seconds ON slow_requests (seconds);\n"
    "\n"
    "-- `reelctl versions` looks up who applied each version; the report finds\n"
    "-- the sync after each.\n"
    "CREATE INDEX IF NOT EXISTS worker_versions_by_version ON worker_versions (component, version, ok, worker);\n"
    "CREATE INDEX IF NOT EXISTS weight_versions_by_time ON weight_versions (t);\n"
    "CREATE INDEX IF NOT EXISTS weight_versions_by_state ON weight_versions (state, component, version);\n"
    "\n"
    "-- The newest version each worker applied, per component: `reelctl workers`.\n"
    "CREATE TABLE IF NOT EXISTS worker_applied (\n"
    "    worker    TEXT NOT NULL,\n"
    "    component TEXT NOT NULL,\n"
    "    version   INTEGER NOT NULL,\n"
    "    PRIMARY KEY (worker, component)\n"
    ") WITHOUT ROWID;\n"
    "INSERT INTO rollups (worker, key_hash, version, hour, requests, failed, steps, captured, replayed, eager, seconds, seconds_max)\n"
    " SELECT worker, coalesce(key_hash, ''), version, CAST(t / 3600 AS INTEGER), count(*), sum(status <> 'ok'), sum(steps), sum(captured), sum(replayed), sum(eager), sum(seconds), max(seconds)\n"
    " FROM requests GROUP BY 1, 2, 3, 4;\n"
    "INSERT INTO rollups (worker, key_hash, version, hour, captures, capture_seconds, replays, last_replay)\n"
    " SELECT worker, key_hash, 0, CAST(t / 3600 AS INTEGER), sum(placeholder = 0), sum(CASE WHEN placeholder = 0 THEN capture_seconds ELSE 0 END), sum(replay_count), max(last_replay)\n"
    " FROM captures WHERE true GROUP BY 1, 2, 3, 4\n"
    " ON CONFLICT (worker, key_hash, version, hour) DO UPDATE SET captures = captures + excluded.captures, capture_seconds = capture_seconds + excluded.capture_seconds, replays = replays + excluded.replays, last_replay = excluded.last_replay;\n"
    "INSERT INTO rollups (worker, key_hash, version, hour, evictions)\n"
    " SELECT worker, key_hash, coalesce(to_version, 0), CAST(t / 3600 AS INTEGER), count(*)\n"
    " FROM evictions WHERE true GROUP BY 1, 2, 3, 4\n"
    " ON CONFLICT (worker, key_hash, version, hour) DO UPDATE SET evictions = evictions + excluded.evictions;\n"
    "INSERT INTO key_totals (key_hash, worker, requests, failed, steps, captured, replayed, eager, seconds, seconds_max, captures, capture_seconds, replays, last_replay, evictions)\n"
    " SELECT key_hash, worker, sum(requests), sum(failed), sum(steps), sum(captured), sum(replayed), sum(eager), sum(seconds), max(seconds_max), sum(captures), sum(capture_seconds), sum(replays), max(last_replay), sum(evictions)\n"
    " FROM rollups GROUP BY 1, 2;\n"
    "INSERT INTO worker_applied (worker, component, version) SELECT worker, component, max(version) FROM worker_versions WHERE ok = 1 GROUP BY 1, 2;\n"
    "INSERT INTO eviction_hours (hour, worker, reason, count) SELECT CAST(t / 3600 AS INTEGER), worker, reason, count(*) FROM evictions GROUP BY 1, 2, 3;\n"
    "INSERT INTO eviction_reasons (worker, reason, count) SELECT worker, reason, count(*) FROM evictions GROUP BY 1, 2;\n"
    "INSERT INTO key_texts (key_hash, key_text, t)\n"
    " SELECT key_hash, key_text, max(t) FROM (SELECT key_hash, key_text, t FROM captures WHERE key_text IS NOT NULL AND key_text <> ''\n"
    " UNION ALL SELECT key_hash, key_text, t FROM evictions WHERE key_text IS NOT NULL AND key_text <> ''\n"
    " UNION ALL SELECT key_hash, key_text, last_t FROM declines WHERE key_text IS NOT NULL AND key_text <> '') GROUP BY key_hash;\n"
    "INSERT INTO timeline (minute, requests, failed, steps, replayed, seconds)\n"
    " SELECT CAST(t / 60 AS INTEGER), count(*), sum(status <> 'ok'), sum(captured + replayed + eager), sum(replayed), sum(CASE WHEN status = 'ok' THEN seconds ELSE 0 END) FROM requests GROUP BY 1;\n"
    "INSERT INTO timeline (minute, captures)\n"
    " SELECT CAST(t / 60 AS INTEGER), count(*) FROM captures WHERE placeholder = 0 GROUP BY 1\n"
    " ON CONFLICT (minute) DO UPDATE SET captures = captures + excluded.captures;\n"
    "INSERT INTO timeline (minute, evictions)\n"
    " SELECT CAST(t / 60 AS INTEGER), count(*) FROM evictions WHERE true GROUP BY 1\n"
    " ON CONFLICT (minute) DO UPDATE SET evictions = evictions + excluded.evictions;\n"
    "INSERT INTO slow_requests (hour, id, worker, key_hash, version, steps, captured, replayed, eager, seconds, status, t)\n"
    " SELECT hour, id, worker, key_hash, version, steps, captured, replayed, eager, seconds, status, t FROM\n"
    " (SELECT CAST(t / 3600 AS INTEGER) AS hour, *, row_number() OVER (PARTITION BY CAST(t / 3600 AS INTEGER) ORDER BY seconds DESC, rowid) AS n FROM requests)\n"
    " WHERE n <= 20;\n";

/* Migration 8 (issue 26): where a request's time went besides the loop
 * (`seconds`): encoding its prompt and decoding its output, on the worker;
 * per request, and summed per minute in the timeline (reports read that). */
const char cat_schema_v8_sql[] =
    "ALTER TABLE requests ADD COLUMN encode_seconds REAL NOT NULL DEFAULT 0;\n"
    "ALTER TABLE requests ADD COLUMN decode_seconds REAL NOT NULL DEFAULT 0;\n"
    "ALTER TABLE timeline ADD COLUMN encode_seconds REAL NOT NULL DEFAULT 0;\n"
    "ALTER TABLE timeline ADD COLUMN decode_seconds REAL NOT NULL DEFAULT 0;\n";

/* Migration 9 (issue 27): a version may be a LoRA adapter on a base
 * version; the adapter a worker applied, as JSON. */
const char cat_schema_v9_sql[] =
    "ALTER TABLE weight_versions ADD COLUMN base_version INTEGER;\n"
    "ALTER TABLE weight_versions ADD COLUMN adapter TEXT;\n";

/* Migration 10 (issue 29): of a request's steps, those run in a mixed
 * batch with other requests. */
const char cat_schema_v10_sql[] = "ALTER TABLE requests ADD COLUMN batched_steps INTEGER NOT NULL DEFAULT 0;\n";

/* Migration 11 (issue 29): what asked for a capture: a request
 * ('demand') or a starting worker's prewarm ('prewarm'); the size and
 * padding of the mixed batches a request's steps ran in. */
const char cat_schema_v11_sql[] = "ALTER TABLE captures ADD COLUMN origin TEXT NOT NULL DEFAULT 'demand';\n"
                                  "ALTER TABLE requests ADD COLUMN batch_rows INTEGER NOT NULL DEFAULT 0;\n"
                                  "ALTER TABLE requests ADD COLUMN padded_rows INTEGER NOT NULL DEFAULT 0;\n";

/* Migration 12: a request's capture key (its last step's: what
 * captures, replays, declines and evictions are recorded by) and why its
 * eager steps ran eager, so `reelctl why` joins a request to its graph's
 * history; the slowest requests of each hour keep both. */
const char cat_schema_v12_sql[] = "ALTER TABLE requests ADD COLUMN capture_key TEXT;\n"
                                  "ALTER TABLE requests ADD COLUMN eager_reasons TEXT;\n"
                                  "ALTER TABLE slow_requests ADD COLUMN capture_key TEXT;\n"
                                  "ALTER TABLE slow_requests ADD COLUMN eager_reasons TEXT;\n";

/* Migration 13: an adapter sent by upload keeps its adapter_config.json
 * text (the SYNC's lora_config), so a restarted broker can send its SYNC
 * again; NULL for every other version. */
const char cat_schema_v13_sql[] = "ALTER TABLE weight_versions ADD COLUMN lora_config TEXT;\n";

/* Migration 14: why a request failed, as its client was told (the
 * ERROR's message; NULL for one that ended ok), in its row and among the
 * slowest requests kept, so `reelctl why` can say more than the code. */
const char cat_schema_v14_sql[] = "ALTER TABLE requests ADD COLUMN error TEXT;\n"
                                  "ALTER TABLE slow_requests ADD COLUMN error TEXT;\n";

/* Migration 15: the stream of the worker whose graph an eviction dropped
 * (each stream holds its own graph of a key, so one sync evicts a key once
 * per stream); NULL for rows from before it. */
const char cat_schema_v15_sql[] = "ALTER TABLE evictions ADD COLUMN stream INTEGER;\n";

/* Migration 16: when a request began (the broker sent it to the worker
 * that answered; UNIX seconds), which its end minus its seconds (the sum
 * of its own steps) is not when its stream stepped other requests too:
 * `reelctl why` tells the captures before it from its own by it. NULL for
 * rows from before it; the slowest requests keep it. And a worker's
 * process id (READY's boot), so a READY from a new process records the
 * graphs of the old one evicted ("worker_restarted"). */
const char cat_schema_v16_sql[] = "ALTER TABLE requests ADD COLUMN started REAL;\n"
                                  "ALTER TABLE slow_requests ADD COLUMN started REAL;\n"
                                  "ALTER TABLE workers ADD COLUMN boot TEXT;\n";

/* Migration 17: the broker's id of a request (REQUEST's id, the one its
 * worker's log names; the client's id is `id`), so `reelctl why` finds a
 * request by either; the slowest requests keep it. NULL for rows from
 * before it. */
const char cat_schema_v17_sql[] = "ALTER TABLE requests ADD COLUMN broker_id INTEGER;\n"
                                  "ALTER TABLE slow_requests ADD COLUMN broker_id INTEGER;\n";

/* Migration 18: the indexes `reelctl why` seeks by, so that it costs the
 * same after a busy day as after a quiet hour (docs/BENCH.md, "Catalog
 * after a busy day"; schema 5 had left requests without any). It finds a
 * request by the client's id or the broker's, in requests and in the
 * slowest requests retention keeps; the requests of its capture key on
 * its worker (those that captured before it, its peers' median); and its
 * graph's history on its worker: the captures and evictions of its
 * capture key and of the key's lineage, the key text without its
 * weights= part (the expression must stay the one catalog_impl.h's
 * CAT_KEY_BASE writes, or the query no longer matches the index and
 * scans the worker's rows: tests/test_catalog.c checks every operator
 * query's plan). `reelctl keys` counts each key's prewarm captures from
 * the prewarm rows alone (a partial index: demand captures, nearly all of
 * them, are not in it). */
#define M18_KEY_BASE                                                                                          \
    "(CASE WHEN instr(key_text, ' weights=') > 0 AND instr(key_text, ' graph=') > instr(key_text, ' weights=')" \
    " THEN substr(key_text, 1, instr(key_text, ' weights=') - 1) || substr(key_text, instr(key_text, ' graph='))" \
    " END)"
const char cat_schema_v18_sql[] =
    "CREATE INDEX IF NOT EXISTS requests_by_id ON requests (id);\n"
    "CREATE INDEX IF NOT EXISTS requests_by_broker_id ON requests (broker_id);\n"
    "CREATE INDEX IF NOT EXISTS requests_by_capture_key ON requests (capture_key, worker, t);\n"
    "CREATE INDEX IF NOT EXISTS slow_requests_by_id ON slow_requests (id);\n"
    "CREATE INDEX IF NOT EXISTS slow_requests_by_broker_id ON slow_requests (broker_id);\n"
    "CREATE INDEX IF NOT EXISTS captures_by_lineage ON captures (worker, " M18_KEY_BASE ");\n"
    "CREATE INDEX IF NOT EXISTS evictions_by_worker_key ON evictions (worker, key_hash);\n"
    "CREATE INDEX IF NOT EXISTS evictions_by_lineage ON evictions (worker, " M18_KEY_BASE ");\n"
    "CREATE INDEX IF NOT EXISTS captures_prewarms ON captures (key_hash) WHERE origin = 'prewarm' AND placeholder = 0;\n";
#undef M18_KEY_BASE

const char *const cat_migrations[] = { cat_schema_v1_sql, cat_schema_v2_sql, cat_schema_v3_sql,
                                       cat_schema_v4_sql, cat_schema_v5_sql, cat_schema_v6_sql,
                                       cat_schema_v7_sql, cat_schema_v8_sql, cat_schema_v9_sql,
                                       cat_schema_v10_sql, cat_schema_v11_sql, cat_schema_v12_sql,
                                       cat_schema_v13_sql, cat_schema_v14_sql, cat_schema_v15_sql,
                                       cat_schema_v16_sql, cat_schema_v17_sql, cat_schema_v18_sql };
const int cat_n_migrations = (int)(sizeof cat_migrations / sizeof cat_migrations[0]);
