-- catalog.sql -- the Reel catalog schema (PRAGMA user_version 18): the sum
-- of the migrations catalog/catalog.c runs (1: these tables; 2: the state
-- and reason of weight versions; 3: the audit trail of SYNCs; 4: kernel
-- artifacts seen and their kernel keys; 5: requests without indexes:
-- rows go in in time order, so the newest are the highest rowids; 6: an
-- artifact key's --artifact-timing sync columns, after t as ALTER TABLE
-- puts them; 7: the summaries reports read; 8 to 18 at the end of this file).
-- tests/test_catalog.c fails if a catalog
-- built from this file and one built by the migrations differ. Times are
-- UNIX seconds (REAL). Counters and versions are uint64 stored as SQLite
-- INTEGER.

-- Kernel/op artifacts built or checked on a backend; the kernel bundles
-- workers scanned (docs/ARTIFACTS.md): status 'verified', 'loaded' or
-- 'refused' (reason says why), first and last seen.
CREATE TABLE IF NOT EXISTS artifacts (
    id         TEXT PRIMARY KEY,
    op         TEXT NOT NULL,
    backend    TEXT NOT NULL,
    sha256     TEXT,
    status     TEXT NOT NULL,
    reason     TEXT,
    t          REAL NOT NULL,
    version    TEXT,
    verified   INTEGER NOT NULL DEFAULT 0,
    enabled    INTEGER NOT NULL DEFAULT 0,
    first_seen REAL,
    last_seen  REAL
);

-- An artifact at one kernel key on a worker (docs/ARTIFACTS.md): its
-- state and reason, and its counters since that worker started (each
-- report replaces the last). speedup: native/artifact over the timed calls.
CREATE TABLE IF NOT EXISTS artifact_keys (
    worker       TEXT NOT NULL,
    id           TEXT NOT NULL,
    key          TEXT NOT NULL,
    state        TEXT NOT NULL,
    reason       TEXT,
    calls        INTEGER NOT NULL DEFAULT 0,
    native_calls INTEGER NOT NULL DEFAULT 0,
    parity_pass  INTEGER NOT NULL DEFAULT 0,
    parity_fail  INTEGER NOT NULL DEFAULT 0,
    fallbacks    INTEGER NOT NULL DEFAULT 0,
    timed        INTEGER NOT NULL DEFAULT 0,
    speedup      REAL NOT NULL DEFAULT 0,
    speedup_sd   REAL NOT NULL DEFAULT 0,
    t            REAL NOT NULL,
    sync_timed   INTEGER NOT NULL DEFAULT 0,
    sync_s       REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (worker, id, key)
);

-- Every weight version the trainer published. state: 'pending' until a
-- worker applies it, then 'current' (what a restarted broker resumes) until
-- a newer version becomes current ('superseded'); 'failed' when no worker
-- applied it (reason says why; the broker's current version did not move).
CREATE TABLE IF NOT EXISTS weight_versions (
    component TEXT NOT NULL,
    version   INTEGER NOT NULL,
    sha256    TEXT NOT NULL,
    source    TEXT,
    t         REAL NOT NULL,
    state     TEXT NOT NULL DEFAULT 'pending',
    reason    TEXT,
    PRIMARY KEY (component, version)
);

-- Workers that ever sent READY; gone_at is NULL while the worker is live.
-- last_seen: when the broker last heard it (READY, then at most once a
-- minute while it lives, and at its leaving).
CREATE TABLE IF NOT EXISTS workers (
    name        TEXT PRIMARY KEY,
    device      TEXT,
    arch        TEXT,
    streams     INTEGER,
    budget      INTEGER,
    first_seen  REAL NOT NULL,
    last_seen   REAL NOT NULL,
    gone_at     REAL,
    gone_reason TEXT
);

-- Which worker applied (ok = 1) or failed to apply which weight version;
-- the latest outcome per (worker, component, version) wins.
CREATE TABLE IF NOT EXISTS worker_versions (
    worker    TEXT NOT NULL,
    component TEXT NOT NULL,
    version   INTEGER NOT NULL,
    ok        INTEGER NOT NULL,
    error     TEXT,
    t         REAL NOT NULL,
    PRIMARY KEY (worker, component, version)
);

-- One row per graph captured. placeholder = 1 marks a row made for replays
-- whose capture was never reported, so that no replay is lost; it does not
-- count as a capture.
CREATE TABLE IF NOT EXISTS captures (
    id              INTEGER PRIMARY KEY,
    worker          TEXT NOT NULL,
    stream          INTEGER NOT NULL,
    key_text        TEXT,
    key_hash        TEXT NOT NULL,
    capture_seconds REAL NOT NULL DEFAULT 0,
    bytes           INTEGER NOT NULL DEFAULT 0,
    nodes           INTEGER NOT NULL DEFAULT 0,
    replay_count    INTEGER NOT NULL DEFAULT 0,
    last_replay     REAL,
    placeholder     INTEGER NOT NULL DEFAULT 0,
    t               REAL NOT NULL,
    UNIQUE (worker, key_hash, stream, t)
);
CREATE INDEX IF NOT EXISTS captures_by_key ON captures (key_hash);

CREATE TABLE IF NOT EXISTS evictions (
    id           INTEGER PRIMARY KEY,
    worker       TEXT NOT NULL,
    key_text     TEXT,
    key_hash     TEXT NOT NULL,
    reason       TEXT NOT NULL,
    component    TEXT,
    from_version INTEGER,
    to_version   INTEGER,
    t            REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS evictions_by_time ON evictions (t);
CREATE INDEX IF NOT EXISTS evictions_by_worker ON evictions (worker, reason);

-- Decline counters: one row per (worker, key, reason), count accumulates.
CREATE TABLE IF NOT EXISTS declines (
    worker   TEXT NOT NULL,
    key_hash TEXT NOT NULL,
    key_text TEXT,
    reason   TEXT NOT NULL,
    count    INTEGER NOT NULL DEFAULT 0,
    last_t   REAL NOT NULL,
    PRIMARY KEY (worker, key_hash, reason)
);
CREATE INDEX IF NOT EXISTS declines_by_key ON declines (key_hash);

-- Finished requests as the client saw them; id is the client's request id
-- (not unique across broker restarts, hence no constraint).
CREATE TABLE IF NOT EXISTS requests (
    id       INTEGER NOT NULL,
    worker   TEXT NOT NULL,
    key_hash TEXT,
    version  INTEGER NOT NULL,
    steps    INTEGER NOT NULL,
    captured INTEGER NOT NULL,
    replayed INTEGER NOT NULL,
    eager    INTEGER NOT NULL,
    seconds  REAL NOT NULL,
    status   TEXT NOT NULL,
    t        REAL NOT NULL
);

-- Every SYNC a peer sent, whatever became of it: the trainer role's
-- audit trail (docs/SECURITY.md). key_name and role are its CURVE key's
-- ('-' and 'none' on a broker without keys); outcome is 'accepted',
-- 'resend', 'refused: CODE: why' or 'denied: why'.
CREATE TABLE IF NOT EXISTS audit (
    id        INTEGER PRIMARY KEY,
    key_name  TEXT NOT NULL,
    role      TEXT NOT NULL,
    action    TEXT NOT NULL,
    component TEXT,
    version   INTEGER,
    sha256    TEXT,
    path      TEXT,
    outcome   TEXT NOT NULL,
    t         REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (t);

-- Summaries (migration 7), kept up to date by the writer at each commit
-- (catalog/catalog_rollup.c) so that reports read them, not the raw rows,
-- and kept when retention prunes raw rows (docs/OPERATIONS.md). hour and
-- minute: UNIX seconds / 3600 and / 60, rounded down. version: the weight
-- version a request ran on; for captures, replays and evictions the
-- worker's version when the broker got the event (an eviction with a
-- to_version counts at it); 0 for rows summarised from catalogs older than
-- schema 7.
CREATE TABLE IF NOT EXISTS rollups (
    worker          TEXT NOT NULL,
    key_hash        TEXT NOT NULL,
    version         INTEGER NOT NULL,
    hour            INTEGER NOT NULL,
    requests        INTEGER NOT NULL DEFAULT 0,
    failed          INTEGER NOT NULL DEFAULT 0,
    steps           INTEGER NOT NULL DEFAULT 0,
    captured        INTEGER NOT NULL DEFAULT 0,
    replayed        INTEGER NOT NULL DEFAULT 0,
    eager           INTEGER NOT NULL DEFAULT 0,
    seconds         REAL NOT NULL DEFAULT 0,
    seconds_max     REAL NOT NULL DEFAULT 0,
    captures        INTEGER NOT NULL DEFAULT 0,
    capture_seconds REAL NOT NULL DEFAULT 0,
    replays         INTEGER NOT NULL DEFAULT 0,
    last_replay     REAL,
    evictions       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (worker, key_hash, version, hour)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rollups_by_hour ON rollups (hour);

-- The rollups of each (key, worker) over all time: what `reelctl stats`,
-- `keys` and `metrics` read.
CREATE TABLE IF NOT EXISTS key_totals (
    key_hash        TEXT NOT NULL,
    worker          TEXT NOT NULL,
    requests        INTEGER NOT NULL DEFAULT 0,
    failed          INTEGER NOT NULL DEFAULT 0,
    steps           INTEGER NOT NULL DEFAULT 0,
    captured        INTEGER NOT NULL DEFAULT 0,
    replayed        INTEGER NOT NULL DEFAULT 0,
    eager           INTEGER NOT NULL DEFAULT 0,
    seconds         REAL NOT NULL DEFAULT 0,
    seconds_max     REAL NOT NULL DEFAULT 0,
    captures        INTEGER NOT NULL DEFAULT 0,
    capture_seconds REAL NOT NULL DEFAULT 0,
    replays         INTEGER NOT NULL DEFAULT 0,
    last_replay     REAL,
    evictions       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_hash, worker)
) WITHOUT ROWID;

-- Evictions per worker and reason, over all time.
CREATE TABLE IF NOT EXISTS eviction_reasons (
    worker TEXT NOT NULL,
    reason TEXT NOT NULL,
    count  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (worker, reason)
) WITHOUT ROWID;

-- Evictions per hour, worker and reason: the stats of a time range.
CREATE TABLE IF NOT EXISTS eviction_hours (
    hour   INTEGER NOT NULL,
    worker TEXT NOT NULL,
    reason TEXT NOT NULL,
    count  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, worker, reason)
) WITHOUT ROWID;

-- The newest text of each capture key seen (captures, evictions, declines).
CREATE TABLE IF NOT EXISTS key_texts (
    key_hash TEXT PRIMARY KEY,
    key_text TEXT NOT NULL,
    t        REAL NOT NULL
) WITHOUT ROWID;

-- Everything per minute: the report's timeline (steps: those that ran).
CREATE TABLE IF NOT EXISTS timeline (
    minute    INTEGER PRIMARY KEY,
    requests  INTEGER NOT NULL DEFAULT 0,
    failed    INTEGER NOT NULL DEFAULT 0,
    steps     INTEGER NOT NULL DEFAULT 0,
    replayed  INTEGER NOT NULL DEFAULT 0,
    seconds   REAL NOT NULL DEFAULT 0,
    captures  INTEGER NOT NULL DEFAULT 0,
    evictions INTEGER NOT NULL DEFAULT 0
);

-- The 20 slowest requests of each hour (a copy of their requests rows).
CREATE TABLE IF NOT EXISTS slow_requests (
    hour     INTEGER NOT NULL,
    id       INTEGER NOT NULL,
    worker   TEXT NOT NULL,
    key_hash TEXT,
    version  INTEGER NOT NULL,
    steps    INTEGER NOT NULL,
    captured INTEGER NOT NULL,
    replayed INTEGER NOT NULL,
    eager    INTEGER NOT NULL,
    seconds  REAL NOT NULL,
    status   TEXT NOT NULL,
    t        REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS slow_requests_by_hour ON slow_requests (hour, seconds);
CREATE INDEX IF NOT EXISTS slow_requests_by_seconds ON slow_requests (seconds);

-- `reelctl versions` looks up who applied each version; the report finds
-- the sync after each.
CREATE INDEX IF NOT EXISTS worker_versions_by_version ON worker_versions (component, version, ok, worker);
CREATE INDEX IF NOT EXISTS weight_versions_by_time ON weight_versions (t);
CREATE INDEX IF NOT EXISTS weight_versions_by_state ON weight_versions (state, component, version);

-- The newest version each worker applied, per component: `reelctl workers`.
CREATE TABLE IF NOT EXISTS worker_applied (
    worker    TEXT NOT NULL,
    component TEXT NOT NULL,
    version   INTEGER NOT NULL,
    PRIMARY KEY (worker, component)
) WITHOUT ROWID;

-- Migration 8: where a request's time went besides the loop (`seconds`):
-- the worker encoding its prompt and decoding its output; per request and
-- summed per minute in the timeline.
ALTER TABLE requests ADD COLUMN encode_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN decode_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE timeline ADD COLUMN encode_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE timeline ADD COLUMN decode_seconds REAL NOT NULL DEFAULT 0;

-- Migration 9: a version may be a LoRA adapter on a base version
-- (base_version), and the adapter a worker applied as it, as JSON (rank,
-- alpha, rslora, scale, targets, modules, bytes, sha256, layout).
ALTER TABLE weight_versions ADD COLUMN base_version INTEGER;
ALTER TABLE weight_versions ADD COLUMN adapter TEXT;

-- Migration 10: of a request's steps, those run in a mixed batch with
-- other requests (reel-worker --max-batch; docs/CAPTURE.md).
ALTER TABLE requests ADD COLUMN batched_steps INTEGER NOT NULL DEFAULT 0;

-- Migration 11: what asked for a capture: a request ('demand') or a
-- starting worker's prewarm of a key hot lately ('prewarm', reel-worker
-- --prewarm; docs/CAPTURE.md); of a request's batched steps, the requests
-- in those batches summed (batch_rows: their mean size is batch_rows /
-- batched_steps) and the padding rows computed and thrown away.
ALTER TABLE captures ADD COLUMN origin TEXT NOT NULL DEFAULT 'demand';
ALTER TABLE requests ADD COLUMN batch_rows INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN padded_rows INTEGER NOT NULL DEFAULT 0;

-- Migration 12: a request's capture key (the hash its last step's graph
-- is recorded by in captures, replays, declines and evictions; NULL for a
-- request that ended without a RESULT) and why its eager steps ran eager
-- ("warming_up=2,budget_exceeded=1"; NULL when none did): `reelctl why` joins a
-- request to its graph's history. The slowest requests keep both.
ALTER TABLE requests ADD COLUMN capture_key TEXT;
ALTER TABLE requests ADD COLUMN eager_reasons TEXT;
ALTER TABLE slow_requests ADD COLUMN capture_key TEXT;
ALTER TABLE slow_requests ADD COLUMN eager_reasons TEXT;

-- Migration 13: a LoRA adapter sent by upload keeps its
-- adapter_config.json text (the SYNC's lora_config; NULL for every other
-- version), so a restarted broker can send its SYNC to workers again.
ALTER TABLE weight_versions ADD COLUMN lora_config TEXT;

-- Migration 14: why a request failed, as its client was told (the
-- ERROR's message; NULL for one that ended ok), in its row and among the
-- slowest requests kept: `reelctl why` says it.
ALTER TABLE requests ADD COLUMN error TEXT;
ALTER TABLE slow_requests ADD COLUMN error TEXT;

-- Migration 15: the stream of the worker whose graph an eviction dropped
-- (each stream holds its own graph of a key, so one sync evicts a key once
-- per stream: `reelctl evictions` tells the rows apart); NULL for rows
-- from before it.
ALTER TABLE evictions ADD COLUMN stream INTEGER;

-- Migration 16: when a request began (the broker sent it to the worker
-- that answered; UNIX seconds; NULL for rows from before it): its seconds
-- are the sum of its own steps, so its end minus them is not its start
-- when its stream stepped other requests too. `reelctl why` tells the
-- captures before it from its own by it; the slowest requests keep it.
ALTER TABLE requests ADD COLUMN started REAL;
ALTER TABLE slow_requests ADD COLUMN started REAL;
-- ... and the worker process's id (READY's boot; NULL from an older
-- worker): a READY from a new process of a known worker records the graphs
-- its old process held evicted, reason 'worker_restarted'.
ALTER TABLE workers ADD COLUMN boot TEXT;

-- Migration 17: the broker's id of a request (REQUEST's id, the one its
-- worker's log names; `id` is the client's), so `reelctl why` finds a
-- request by either; the slowest requests keep it. NULL for rows from
-- before it.
ALTER TABLE requests ADD COLUMN broker_id INTEGER;
ALTER TABLE slow_requests ADD COLUMN broker_id INTEGER;

-- Migration 18: the indexes `reelctl why` seeks by, so that it costs the
-- same after a busy day as after a quiet hour: a request by the client's
-- id or the broker's (in requests and among the slowest requests kept),
-- the requests of its capture key on its worker, and its graph's history
-- on its worker: the captures and evictions of its capture key and of its
-- lineage (the key text without its weights= part; the expression is the
-- one catalog/catalog_impl.h's CAT_KEY_BASE writes). `reelctl keys`
-- counts prewarm captures from a partial index of them alone.
CREATE INDEX IF NOT EXISTS requests_by_id ON requests (id);
CREATE INDEX IF NOT EXISTS requests_by_broker_id ON requests (broker_id);
CREATE INDEX IF NOT EXISTS requests_by_capture_key ON requests (capture_key, worker, t);
CREATE INDEX IF NOT EXISTS slow_requests_by_id ON slow_requests (id);
CREATE INDEX IF NOT EXISTS slow_requests_by_broker_id ON slow_requests (broker_id);
CREATE INDEX IF NOT EXISTS captures_by_lineage ON captures (worker, (CASE WHEN instr(key_text, ' weights=') > 0
    AND instr(key_text, ' graph=') > instr(key_text, ' weights=') THEN substr(key_text, 1, instr(key_text, ' weights=') - 1)
    || substr(key_text, instr(key_text, ' graph=')) END));
CREATE INDEX IF NOT EXISTS evictions_by_worker_key ON evictions (worker, key_hash);
CREATE INDEX IF NOT EXISTS evictions_by_lineage ON evictions (worker, (CASE WHEN instr(key_text, ' weights=') > 0
    AND instr(key_text, ' graph=') > instr(key_text, ' weights=') THEN substr(key_text, 1, instr(key_text, ' weights=') - 1)
    || substr(key_text, instr(key_text, ' graph=')) END));
CREATE INDEX IF NOT EXISTS captures_prewarms ON captures (key_hash) WHERE origin = 'prewarm' AND placeholder = 0;
