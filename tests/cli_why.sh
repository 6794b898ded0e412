#!/bin/sh
# cli_why.sh -- `reelctl why` on a catalog a real broker wrote: a
# reel-broker and a CPU reel-worker over ipc sockets, a tiny model. The
# first GENs of a key run warmup steps and capture its graph, the next ones
# replay it; a weight sync evicts the graph and the next GEN captures it
# again at the new version; a GEN nobody can serve fails. `why` must say
# each of these from the catalog's rows, in text and JSON, and refuse an
# unknown id, a missing catalog and an older schema.
# Every wait is bounded; every process is killed on exit.
# Usage: cli_why.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-why.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
DB="$D/reel.db"
SUITE=why
. "$(dirname "$0")/lib_cli.sh"
PY=/usr/bin/python3
q() { /usr/bin/sqlite3 "$DB" "$1" 2>/dev/null; }

"$R" weights init --config tiny --seed 7 --out "$D/w1.safetensors" 2>/dev/null
"$R" weights init --config tiny --seed 8 --out "$D/w2.safetensors" 2>/dev/null
"$R" tensor rand --name latent --shape 4,2,8,8 --seed 1 --out "$D/lat.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
gen() { # out: one GEN of the key, its stderr to out.err
    "$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --latent "$D/lat.safetensors" --steps 6 \
        --shift 3 --timeout-ms 30000 --quiet --out "$1.safetensors" 2>"$1.err"
}

echo "== a broker, a worker, GENs of one key, a sync, one more GEN"
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 ||
    { bad "the broker starts"; finish; }
cli_worker w0 "$D/broker.log" "$D/w0.log" --broker "$WE" --weights "$D/w1.safetensors" --streams 1 \
    --heartbeat-ms 200 || { bad "the worker starts"; finish; }
served=0
for i in 1 2 3 4; do gen "$D/g$i" && served=$((served + 1)); done
[ "$served" = 4 ] && grep -q "eager 2: warming_up=2" "$D/g1.err" && grep -q "replayed 6" "$D/g4.err" &&
    ok "4 GENs: the first ran warmup steps, the last replayed every step" || { bad "the GENs before the sync"; show "$D/g1.err" "$D/g4.err"; }
# the capture reaches the catalog after the first request's row: wait for
# it, and for the sync's eviction before the next GEN, so that each row
# is stamped in the order it happened
wait_sql "$DB" "select count(*) from captures where placeholder = 0" 1 30 || bad "the capture reaches the catalog"
"$R" sync --broker "$CE" --version 2 --weights "$D/w2.safetensors" --timeout-ms 30000 2>"$D/sync.err" &&
    ok "sync v2 applied" || { bad "sync v2"; show "$D/sync.err"; }
wait_sql "$DB" "select count(*) from evictions where reason = 'weight_sync'" 1 30 || bad "the sync's eviction reaches the catalog"
gen "$D/g5" && grep -q "weights v2" "$D/g5.err" && ok "a GEN after the sync ran on v2" || { bad "the GEN after the sync"; show "$D/g5.err"; }
"$R" gen --broker "$CE" --model nosuchmodel --context "$D/ctx.safetensors" --latent "$D/lat.safetensors" --steps 2 \
    --timeout-ms 3000 --deadline-ms 1000 --quiet --out "$D/x.safetensors" 2>"$D/fail.err"
wait_sql "$DB" "select count(*) from requests where status = 'ok'" 5 30 || bad "5 ok requests in the catalog"
wait_sql "$DB" "select count(*) from requests where status <> 'ok'" 1 30 || bad "the failed request in the catalog"
wait_sql "$DB" "select count(*) from captures where placeholder = 0" 2 30 || bad "the v2 capture reaches the catalog"

first=$(q "select id from requests where status = 'ok' order by rowid limit 1")
replayed=$(q "select id from requests where status = 'ok' order by rowid limit 1 offset 3")
after=$(q "select id from requests where status = 'ok' order by rowid desc limit 1")
failed=$(q "select id from requests where status <> 'ok' order by rowid desc limit 1")

why() { # tag id [flags]: reelctl why, its stdout to tag.out, stderr to tag.err; its exit status
    _t=$1; _id=$2; shift 2
    "$R" why "$_id" --catalog "$DB" "$@" >"$D/$_t.out" 2>"$D/$_t.err"
}

echo "== why the first request: warmup on a new key"
why first "$first"; rc=$?
sed 's/^/  | /' "$D/first.out"
[ "$rc" = 0 ] && grep -q "^verdict: 2 of its 6 steps ran eager (warming_up=2) and 1 was captured: the key was new on w0 -- its first capture is at .*, by this request -- so its first requests run warmup steps before the graph is captured; capturing its graph took [0-9.]* s of its [0-9.]* s$" "$D/first.out" &&
    ok "the first request: eager warmup steps, the key new on w0, captured by it" || { bad "why the first request (exit $rc)"; show "$D/first.out" "$D/first.err"; }
grep -q "^  capture key  $(q "select capture_key from requests where id = $first")  (weights transformer@1)$" "$D/first.out" &&
    grep -q "^  shard key    $(q "select key_hash from requests where id = $first")$" "$D/first.out" &&
    grep -q "^  key text     reel-key/1 .*weights=transformer@1 " "$D/first.out" &&
    ok "it names its shard key, its capture key and the key's text" || { bad "the keys of the first request"; show "$D/first.out"; }

echo "== why a replayed request: the steps' own time, against its key's median"
why replayed "$replayed"; rc=$?
# (at 2x its peers' median or more, as a busy machine can make a 1 ms
# request, the verdict is replayed_slow: which one is the machine's timing)
[ "$rc" = 0 ] && grep -Eq "^verdict: every step replayed(: its [0-9.]+ s is the steps' own \(the median of the 3 other ok requests of this key on w0 is [0-9.]+ s\)|, yet it took [0-9.]+x the median of the 3 other ok requests of this key on w0 .*)$" "$D/replayed.out" &&
    grep -Eq "^other ok requests of its key on w0: 3, median [0-9.]+ s; this one [0-9.]+x$" "$D/replayed.out" &&
    ok "a replayed request: every step replayed, compared with its 3 peers" || { bad "why a replayed request (exit $rc)"; show "$D/replayed.out" "$D/replayed.err"; }

echo "== why the request after the sync: its graph evicted, captured again"
why after "$after"; rc=$?
sed 's/^/  | /' "$D/after.out"
[ "$rc" = 0 ] && grep -q "^verdict: its graph was evicted at .* (weight_sync, transformer v1 -> v2) and captured again by this request at .* (its key was weights=transformer@1, now weights=transformer@2): 2 of its 6 steps ran eager (warming_up=2) and 1 was captured; capturing its graph took [0-9.]* s of its [0-9.]* s$" "$D/after.out" &&
    ok "the request after the sync: evicted by weight_sync v1 -> v2, captured again by it" || { bad "why the request after the sync (exit $rc)"; show "$D/after.out" "$D/after.err"; }
grep -Eq "^20[0-9-]+T[0-9:.]+Z +no +[0-9a-f]{16} +transformer@1 +[0-9]+ +weight_sync +transformer +1 +2$" "$D/after.out" &&
    ok "its history lists the sync's eviction of the v1 key" || { bad "the eviction in the history"; show "$D/after.out"; }

echo "== why a failed request"
why failed "$failed"; rc=$?
[ "$rc" = 0 ] && grep -Eq "^verdict: failed: [a-z_]+ after [0-9.]+ s: .+ \(no RESULT: the catalog holds no capture key for it\)$" "$D/failed.out" &&
    grep -qF "$(sed -n 's/^reelctl: gen: [a-z_]*: //p' "$D/fail.err" | head -1)" "$D/failed.out" &&
    ok "a failed request: what its client was told, no RESULT, no capture key" || { bad "why a failed request (exit $rc)"; show "$D/failed.out" "$D/failed.err"; }
# its step counts are not "0 captured, 0 replayed, 0 eager": a request
# without a RESULT reported none, though a cancelled or timed-out one ran
# steps (opprobe: 1742 of 10000 steps ran before a cancel)
grep -Eq "^  weights v[0-9]+ needed; 2 steps asked: no RESULT, so the steps its worker ran \(if any\) are not in the catalog$" "$D/failed.out" &&
    ! grep -q "0 captured, 0 replayed, 0 eager" "$D/failed.out" &&
    ok "a failed request: its steps asked, not counted as 0 captured/replayed/eager" || { bad "the steps line of a failed request"; show "$D/failed.out"; }

echo "== --json: one object with the same facts"
why json "$after" --json; rc=$?
[ "$rc" = 0 ] && $PY -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["verdict"]["kind"] == "evicted", d["verdict"]
assert d["request"]["worker"] == "w0" and d["request"]["version"] == 2, d["request"]
assert [e["reason"] for e in d["evictions"]] == ["weight_sync"], d["evictions"]
assert any(c["this_key"] for c in d["captures"]), d["captures"]
' "$D/json.out" && ok "--json parses, its verdict and rows the text's" || { bad "--json (exit $rc)"; show "$D/json.out" "$D/json.err"; }
why wjson "$first" --json --worker w0 && $PY -c 'import json, sys; json.load(open(sys.argv[1]))' "$D/wjson.out" &&
    ok "--worker w0 finds it on w0" || { bad "--worker w0"; show "$D/wjson.err"; }

echo "== the id a worker's log names (the broker's) finds the request too"
# a GEN the worker drops past its deadline: its log says "request <the
# broker's id> failed"; the catalog's id is the client's
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 8x32x32 --steps 10000 \
    --deadline-ms 1500 --timeout-ms 30000 --out "$D/late.safetensors" 2>"$D/late.err"
# the broker knows it sent the request, not that its worker started it
# (the worker's own drop, a step later, wins only when the broker's loop
# was held up past it)
grep -Eq "timeout: (no result within its deadline of 1500 ms \(sent to w0, no answer yet; failed after [0-9]+ ms\)|dropped after [0-9]+ of 10000 steps)" \
    "$D/late.err" && ! grep -q "(running" "$D/late.err" &&
    ok "a GEN past its deadline: its client told it was sent to w0, no answer yet" ||
    { bad "the timeout's message"; show "$D/late.err"; }
wait_for "$D/w0.log" "request [0-9]* failed: dropped after" 30 &&
    bid=$(sed -n 's/.*request \([0-9]*\) failed: dropped after.*/\1/p' "$D/w0.log" | tail -1)
# the broker's writer commits its row up to BRK_CATQ_WAIT_MS after the
# client's ERROR (more on a busy machine): wait for it, not for the log
wait_sql "$DB" "select count(*) from requests where status = 'timeout' and broker_id is not null" 1 30 ||
    bad "the timed-out request's row reaches the catalog"
cid=$(q "SELECT id FROM requests WHERE status = 'timeout' ORDER BY rowid DESC LIMIT 1")
why late "${bid:-0}"; rc=$?
[ "$rc" = 0 ] && [ -n "$cid" ] && [ "$cid" != "${bid:-}" ] &&
    grep -q "^request $cid (the broker's $bid) on w0: timeout" "$D/late.out" &&
    ok "why <the id w0's log names> is request $cid, the client's id, on w0" ||
    { bad "why by the broker's id '${bid:-}' (exit $rc, client id '$cid')"; show "$D/late.out" "$D/late.err"; }
why latej "${bid:-0}" --json; rc=$?
[ "$rc" = 0 ] && $PY -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["by_broker_id"] is True and d["matches"] == 1, d
assert d["request"]["broker_id"] == int(sys.argv[2]) and d["request"]["id"] == int(sys.argv[3]), d["request"]
' "$D/latej.out" "${bid:-0}" "${cid:-0}" && ok "--json: by_broker_id, and the row's broker_id" ||
    { bad "--json by the broker's id (exit $rc)"; show "$D/latej.out" "$D/latej.err"; }
# reelctl requests shows both ids: the one an operator reads in a worker's
# log (the broker's) finds its row in the table, beside the client's
"$R" requests --catalog "$DB" >"$D/req.out" 2>"$D/req.err"; rc=$?
[ "$rc" = 0 ] && head -1 "$D/req.out" | grep -Eq "^ *time +id +broker_id +worker " &&
    [ -n "${bid:-}" ] && grep -Eq "^20[0-9-]+T[0-9:]+Z +$cid +$bid +w0 .* timeout( |$)" "$D/req.out" &&
    [ "$(grep -c " $bid " "$D/req.out")" = 1 ] &&
    ok "reelctl requests: a broker_id column beside id; the timed-out row holds w0's $bid" ||
    { bad "requests' broker_id column (exit $rc, broker id '${bid:-}', client id '$cid')"; show "$D/req.out" "$D/req.err"; }
why latew "${bid:-0}" --worker w9; rc=$?
[ "$rc" = 2 ] && ok "the broker's id on another worker: not found (exit 2)" || { bad "--worker w9 by broker id (exit $rc)"; show "$D/latew.err"; }

echo "== refusals"
why unknown 987654321; rc=$?
[ "$rc" = 2 ] && grep -q "^reelctl: catalog .*: no request 987654321 " "$D/unknown.err" &&
    ok "an unknown id: exit 2 with a message" || { bad "an unknown id (exit $rc)"; show "$D/unknown.err"; }
why other "$first" --worker w9; rc=$?
[ "$rc" = 2 ] && grep -q "no request $first on worker w9 (1 on other workers)" "$D/other.err" &&
    ok "an id on no such worker: exit 2, says where it is" || { bad "--worker w9 (exit $rc)"; show "$D/other.err"; }
why bad 12x; rc=$?
[ "$rc" = 2 ] && grep -q "ID" "$D/bad.err" && ok "an ID that is no number: exit 2" || { bad "a bad ID (exit $rc)"; show "$D/bad.err"; }
"$R" why 1 --catalog "$D/none.db" >/dev/null 2>"$D/none.err"; rc=$?
[ "$rc" = 2 ] && grep -q "does not exist" "$D/none.err" && ok "a missing catalog: exit 2" || { bad "a missing catalog (exit $rc)"; show "$D/none.err"; }
# every row knows when it began: the broker sent it at or after it was
# accepted, before its end, and not before its own steps could run
bad_rows=$(q "SELECT count(*) FROM requests WHERE started IS NULL OR started > t OR started < t - 600 OR (status = 'ok' AND t - started < seconds - encode_seconds - decode_seconds - 0.05)")
[ "$bad_rows" = 0 ] && ok "every request row has started: at most its end, at least its own steps before it" ||
    { bad "requests.started: $bad_rows bad rows"; q "SELECT id, started, t, seconds FROM requests" | head -5; }
stop_proc "$BROKER" || bad "the broker stops"
cp "$DB" "$D/old.db" && /usr/bin/sqlite3 "$D/old.db" "PRAGMA user_version = 11"
"$R" why "$first" --catalog "$D/old.db" >/dev/null 2>"$D/old.err"; rc=$?
[ "$rc" = 1 ] && grep -qE "schema 11 is older than this build's [0-9]+" "$D/old.err" &&
    ok "a catalog older than schema 12: exit 1, as every catalog report" || { bad "an older catalog (exit $rc)"; show "$D/old.err"; }

finish
