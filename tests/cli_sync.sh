#!/bin/sh
# cli_sync.sh -- process-level tests of weight-sync state (docs/PROTOCOL.md,
# "Weight syncs"): a real reel-broker and real reel-workers over ipc
# sockets, driven by reelctl. A version becomes current only once a worker
# applied it; a sync nobody applied changes nothing, also across a broker
# restart; workers that failed a partly applied sync lag, visibly, and are
# caught up when they reconnect; resending a version is an ack.
# Every wait is bounded; every process is killed on exit.
# Usage: cli_sync.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-sync.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
DB="$D/reel.db"
SUITE=sync
. "$(dirname "$0")/lib_cli.sh"

# wait_sql SQL EXPECTED SECONDS: the catalog is written by a thread in
# batches, so a fact shows up shortly after the reply that caused it.
wait_sql() {
    i=0
    while [ $i -lt $(($3 * 10)) ]; do
        [ "$(/usr/bin/sqlite3 "$DB" "$1" 2>/dev/null)" = "$2" ] && return 0
        sleep 0.1; i=$((i + 1))
    done
    echo "  (catalog: '$1' is '$(/usr/bin/sqlite3 "$DB" "$1" 2>&1)', expected '$2')"
    return 1
}

start_broker() {
    # a restart appends to the log: wait for one more "ready" than before
    _ready=$(grep -c "reel-broker: ready" "$D/broker.log" 2>/dev/null)
    "$B/reel-broker" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 \
        --sync-deadline-ms 10000 >>"$D/broker.log" 2>&1 &
    BROKER=$!
    PIDS="$PIDS $BROKER"
    wait_count "$D/broker.log" "reel-broker: ready" $((${_ready:-0} + 1)) 60
}

start_worker() { # name weights
    before=$(grep -cE "worker $1 ready" "$D/broker.log" 2>/dev/null)
    "$B/reel-worker" --broker "$WE" --name "$1" --weights "$2" --streams 1 --heartbeat-ms 200 \
        >>"$D/$1.log" 2>&1 &
    eval "PID_$1=$!"
    PIDS="$PIDS $!"
    wait_count "$D/broker.log" "worker $1 ready" $((before + 1)) 60
}

sync_v() { # version weights out: reelctl sync, its stderr to out, its exit status kept
    "$R" sync --broker "$CE" --version "$1" --weights "$2" --timeout-ms 20000 2>"$3"
}
status() { "$R" status --broker "$CE" "$@" 2>&1; }

# Weights: three tiny versions, a file that is valid safetensors but no
# transformer (every worker refuses it), and a model of another shape that
# a tiny sync can not be loaded into (the worker holding it refuses).
for s in 1 2 3; do "$R" weights init --config tiny --seed $((6 + s)) --out "$D/w$s.safetensors" 2>/dev/null; done
"$R" tensor rand --name junk --shape 4,4 --seed 5 --out "$D/bad.safetensors"
printf '{"name":"tinyb","dim":64,"heads":4,"layers":1,"ffn_dim":128,"in_channels":4,"text_dim":32,"freq_dim":256}\n' >"$D/tinyb.json"
"$R" weights init --config "$D/tinyb.json" --seed 4 --out "$D/odd.safetensors" 2>/dev/null
"$R" tensor rand --name latent --shape 4,1,8,8 --seed 1 --out "$D/lat.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
IN="--context $D/ctx.safetensors --latent $D/lat.safetensors --steps 2 --shift 3"
"$R" run --weights "$D/w2.safetensors" $IN --out "$D/ref2.safetensors" 2>/dev/null
"$R" run --weights "$D/w3.safetensors" $IN --out "$D/ref3.safetensors" 2>/dev/null
"$R" run --weights "$D/odd.safetensors" $IN --out "$D/refodd.safetensors" 2>/dev/null
gen() { # model out [extra flags]: reelctl gen, stderr to out.err
    m=$1; o=$2; shift 2
    "$R" gen --broker "$CE" --model "$m" $IN --timeout-ms 20000 --quiet --out "$o.safetensors" "$@" 2>"$o.err"
}
same() { "$R" tensor diff "$1" "$2" >/dev/null 2>&1; }

echo "== a sync with no live worker is not a version"
start_broker || { bad "the broker starts"; finish; }
"$R" versions --catalog "$DB" >"$D/versions0.txt" 2>&1 && grep -q "^(none)$" "$D/versions0.txt" &&
    grep -q "^(no sync yet: each worker serves the version it started with" "$D/versions0.txt" &&
    ok "reelctl versions before any sync: none, and where the workers' versions are" ||
    { bad "reelctl versions before any sync"; show "$D/versions0.txt"; }
if sync_v 2 "$D/w2.safetensors" "$D/s0.err"; then bad "a sync nobody applied exits non-zero"; show "$D/s0.err"
else grep -q "FAILED, no live worker" "$D/s0.err" && ok "sync v2 with no worker: FAILED, exit 1" || { bad "no-worker sync says why"; show "$D/s0.err"; }; fi
status --json >"$D/st0.json"
grep -q '"versions":{}' "$D/st0.json" && ok "the broker has no current version after it" || { bad "no current version"; show "$D/st0.json"; }
wait_sql "select state from weight_versions where version = 2" "failed" 60 && ok "the catalog marks v2 failed" || bad "v2 failed in the catalog"

echo "== the same version published again, with workers, becomes current"
start_worker a1 "$D/w1.safetensors" || bad "a1 starts"
start_worker a2 "$D/w1.safetensors" || bad "a2 starts"
echo "== the workers' startup version (1) published with other weights: stale, not taken on its number"
if sync_v 1 "$D/w2.safetensors" "$D/s1s.err"; then bad "a sync of v1 with other weights exits non-zero"; show "$D/s1s.err"
else
    grep -q "FAILED, no worker applied it" "$D/s1s.err" && grep -q "a1:stale" "$D/s1s.err" && grep -q "a2:stale" "$D/s1s.err" &&
        ok "sync v1 with other weights than the workers' v1: exit 1, each worker says stale" ||
        { bad "sync v1 with other weights"; show "$D/s1s.err"; }
fi
grep -q '"versions":{}' "$(status --json >"$D/st1s.json"; echo "$D/st1s.json")" &&
    ok "no current version after it" || { bad "no current version after the stale v1"; show "$D/st1s.json"; }
if sync_v 1 "$D/w1.safetensors" "$D/s1w.err" && grep -q "complete; applied a1,a2" "$D/s1w.err"; then
    ok "sync v1 with the very weights they run: complete (asked, not taken on its number)"
else bad "sync v1 with the same weights completes"; show "$D/s1w.err"; fi
! grep -q "applied transformer v1" "$D/a1.log" && ok "nothing read or loaded again for it" || { bad "a1 reloaded v1"; show "$D/a1.log"; }
if sync_v 2 "$D/w2.safetensors" "$D/s1.err" && grep -q "complete" "$D/s1.err"; then ok "sync v2 complete on a1 and a2"
else bad "sync v2 completes"; show "$D/s1.err"; fi
wait_sql "select state from weight_versions where version = 2" "current" 60 && ok "the catalog marks v2 current" || bad "v2 current in the catalog"

echo "== a sync every worker rejects changes nothing"
if sync_v 3 "$D/bad.safetensors" "$D/s2.err"; then bad "a rejected sync exits non-zero"; show "$D/s2.err"
else
    grep -q "FAILED, no worker applied it" "$D/s2.err" && grep -q "a1:bad_weights: not weights of this worker.s model" "$D/s2.err" &&
        grep -q "a2:bad_weights: not weights of this worker.s model" "$D/s2.err" &&
        ok "sync v3 (not a transformer): exit 1, FAILED, each worker's reason printed" || { bad "rejected sync reports reasons"; show "$D/s2.err"; }
fi
status --json >"$D/st1.json"
grep -q '"versions":{"transformer":2}' "$D/st1.json" && grep -q '"pending":{}' "$D/st1.json" &&
    ok "the broker's current version stays v2" || { bad "current stays v2"; show "$D/st1.json"; }
grep -q '"lagging":{"transformer"' "$D/st1.json" && { bad "nobody lags behind a failed version"; show "$D/st1.json"; } || ok "no worker shows as lagging"
gen tiny "$D/g1" && grep -q "weights v2" "$D/g1.err" && same "$D/g1.safetensors" "$D/ref2.safetensors" &&
    ok "GEN still served, on v2, exactly" || { bad "GEN after a rejected sync (no_worker before the fix)"; show "$D/g1.err"; }
wait_sql "select state || ':' || (reason like 'no worker applied it: a1 (bad_weights: not weights%a2 (%') from weight_versions where version = 3" "failed:1" 60 &&
    ok "the catalog marks v3 failed with each worker's reason" || bad "v3 failed in the catalog"
"$R" versions --catalog "$DB" >"$D/versions.txt" 2>&1
grep -E "^transformer +3 +failed" "$D/versions.txt" >/dev/null && grep -E "^transformer +2 +current" "$D/versions.txt" >/dev/null &&
    ok "reelctl versions: v3 failed, v2 current" || { bad "reelctl versions shows states"; show "$D/versions.txt"; }
start_worker a3 "$D/w1.safetensors" || bad "a3 starts"
wait_for "$D/a3.log" "applied transformer v2" 60 && sleep 0.3 &&
    ! grep -qE "(to|transformer) v3" "$D/a3.log" && ok "a late joiner is caught up to v2, never sent v3" || { bad "late joiner gets v2 only"; show "$D/a3.log"; }

echo "== a broker restart after the rejected sync resumes v2, not v3"
restart_broker() {
    stop_proc "$BROKER" || bad "the broker stops on SIGTERM"
    cat "$D/broker.log" >>"$D/broker.old.log"; : >"$D/broker.log"
    start_broker
}
restart_broker || bad "the broker restarts"
grep -q "restored transformer v2 from the catalog" "$D/broker.log" && ok "restored v2, the current version" || { bad "v2 restored"; show "$D/broker.log"; }
for w in a1 a2 a3; do wait_for "$D/broker.log" "worker $w ready" 60 || bad "$w re-registers"; done
sleep 0.3
! grep -q "transformer v3" "$D/broker.log" && ok "no worker is sent the rejected v3 again" || { bad "v3 not resent after the restart"; show "$D/broker.log"; }
gen tiny "$D/g1r" && grep -q "weights v2" "$D/g1r.err" && same "$D/g1r.safetensors" "$D/ref2.safetensors" &&
    ok "GEN served on v2 after the restart" || { bad "GEN after the restart (no_worker before the fix)"; show "$D/g1r.err"; }

echo "== resending a version is an ack, not stale_version"
if sync_v 2 "$D/w2.safetensors" "$D/s3.err" && grep -q "complete; applied a1,a2,a3" "$D/s3.err"; then
    ok "sync v2 again (same sha256): complete"; else bad "resend of the current version acks"; show "$D/s3.err"; fi
sync_v 2 "$D/w3.safetensors" "$D/s4.err"
grep -q "stale_version: SYNC: transformer v2 is current with other weights" "$D/s4.err" &&
    ok "v2 with other weights: stale_version" || { bad "same version, other sha256 refused"; show "$D/s4.err"; }
sync_v 3 "$D/bad.safetensors" "$D/s5.err"
grep -q "FAILED, no worker applied it" "$D/s5.err" && ok "a failed version may be published again (and fails again)" || { bad "failed version republished"; show "$D/s5.err"; }

echo "== partly applied: the failed worker lags, visibly, and serves only what asks for its version"
start_worker odd "$D/odd.safetensors" || bad "odd starts"
wait_for "$D/broker.log" "worker odd failed transformer v2" 60 || bad "odd is sent v2 at READY"
if sync_v 4 "$D/w3.safetensors" "$D/s6.err"; then bad "a partly applied sync exits non-zero"; show "$D/s6.err"
else
    grep -q "INCOMPLETE (it is current" "$D/s6.err" && grep -q "applied a1,a2,a3" "$D/s6.err" &&
        grep -q "odd:bad_weights: not weights of this worker.s model" "$D/s6.err" &&
        ok "sync v4: exit 1, applied by a1-a3, odd's reason printed" || { bad "partial sync reported"; show "$D/s6.err"; }
fi
grep -qE "sync to v4 (refused|failed): bad_weights: .*[(].*(config tiny|data bytes)" "$D/odd.log" &&
    ok "the detail stays in odd's log; the trainer got the generic reason" || { bad "the detail in the worker log"; show "$D/odd.log"; }
status >"$D/st2.txt"
grep -q "transformer v4" "$D/st2.txt" && grep -E "^odd .* v1 .*lagging: v4: bad_weights: not weights of this worker.s model" "$D/st2.txt" >/dev/null &&
    grep -E "^a1 .* v4 .* ok$" "$D/st2.txt" >/dev/null &&
    ok "reelctl status: v4 current, odd lagging with its reason" || { bad "status shows the lagging worker"; show "$D/st2.txt"; }
wait_sql "select count(*) from worker_versions where worker = 'odd' and version = 4 and ok = 0" "1" 60
"$R" workers --catalog "$DB" --json >"$D/workers.json" 2>&1
grep -q '"name":"odd".*"lagging":\[{"component":"transformer","version":4,"reason":"bad_weights: not weights of this worker.s model"}\]' "$D/workers.json" &&
    ok "reelctl workers: odd lagging on v4 with its reason" || { bad "reelctl workers shows lagging"; show "$D/workers.json"; }
gen tinyb "$D/g2" --deadline-ms 800
grep -q "no_worker" "$D/g2.err" && ok "a request needing v4 never reaches the lagging worker" || { bad "lagging worker gets no v4 requests"; show "$D/g2.err"; }
gen tinyb "$D/g3" --weights-version 1 && grep -q "worker odd, weights v1" "$D/g3.err" && same "$D/g3.safetensors" "$D/refodd.safetensors" &&
    ok "a request asking for v1 is served by it, on v1" || { bad "lagging worker serves what asks for its version"; show "$D/g3.err"; }
gen tiny "$D/g4" && grep -q "weights v4" "$D/g4.err" && same "$D/g4.safetensors" "$D/ref3.safetensors" &&
    ok "requests without a version run on v4" || { bad "GEN on v4"; show "$D/g4.err"; }

echo "== resending a partly applied version retries the lagging worker"
sent=$(grep -c "sync transformer v4 sent to odd" "$D/broker.log")
others=$(grep -c "sync transformer v4 sent to a" "$D/broker.log")
sync_v 4 "$D/w3.safetensors" "$D/s7.err"
grep -q "stale_version" "$D/s7.err" && bad "a resend is not stale_version" || ok "sync v4 again: no stale_version"
grep -q "applied a1,a2,a3; failed odd:bad_weights" "$D/s7.err" && [ "$(grep -c "sync transformer v4 sent to odd" "$D/broker.log")" = $((sent + 1)) ] &&
    [ "$(grep -c "sync transformer v4 sent to a" "$D/broker.log")" = "$others" ] &&
    ok "only odd was sent v4 again, and its reason came back" || { bad "resend retries lagging workers only"; show "$D/s7.err"; }

echo "== a broker restart resumes the current version only"
restart_broker || bad "the broker restarts"
grep -q "restored transformer v4 from the catalog" "$D/broker.log" && ok "restored v4 (current), not a failed version" || { bad "restore the current version"; show "$D/broker.log"; }
for w in a1 a2 a3 odd; do wait_for "$D/broker.log" "worker $w ready" 60 || bad "$w re-registers"; done
wait_for "$D/broker.log" "worker odd failed transformer v4" 60 && ok "odd, reconnecting, is sent v4 again" || bad "odd caught up after the restart"
! grep -qE "transformer v3|v2 sent" "$D/broker.log" && ok "nobody is sent the failed v3 (or the old v2)" || { bad "no failed sync resent"; show "$D/broker.log"; }
status >"$D/st3.txt"
grep -E "^odd .*lagging: v4: bad_weights" "$D/st3.txt" >/dev/null && ok "still lagging, with the reason, after the restart" || { bad "lag after restart"; show "$D/st3.txt"; }
gen tiny "$D/g5" && grep -q "weights v4" "$D/g5.err" && same "$D/g5.safetensors" "$D/ref3.safetensors" &&
    ok "serving v4 after the restart" || { bad "GEN after restart"; show "$D/g5.err"; }
sync_v 4 "$D/w3.safetensors" "$D/s8.err"
! grep -q "stale_version" "$D/s8.err" && grep -q "applied a1,a2,a3" "$D/s8.err" && ok "resending v4 after the restart is still an ack" || { bad "resend after restart"; show "$D/s8.err"; }

echo "== the lagging worker, fixed and reconnected, is caught up"
eval "kill -9 \$PID_odd"
wait_for "$D/broker.log" "worker odd lost" 60 || bad "odd's death noticed"
start_worker odd "$D/w1.safetensors" || bad "odd restarts with tiny weights"
wait_for "$D/odd.log" "applied transformer v4" 60 && ok "odd applied v4 at READY" || bad "odd catches up"
status >"$D/st4.txt"
grep -E "^odd .* v4 .* ok$" "$D/st4.txt" >/dev/null && ok "odd no longer lagging" || { bad "odd caught up in status"; show "$D/st4.txt"; }
wait_sql "select ok from worker_versions where worker = 'odd' and version = 4" "1" 60
"$R" workers --catalog "$DB" --json >"$D/workers2.json" 2>&1
grep -q '"name":"odd".*"lagging":\[\]' "$D/workers2.json" && ok "reelctl workers: odd not lagging" || { bad "catalog shows odd caught up"; show "$D/workers2.json"; }

# diverged V VALUE WHAT REASON: w3 with its last float set to VALUE, synced
# as v V: every worker refuses it with REASON, and the cluster still serves
# v4 exactly
diverged() {
    cp "$D/w3.safetensors" "$D/div$1.safetensors"
    /usr/bin/python3 -c 'import sys, struct; f = open(sys.argv[1], "r+b"); f.seek(-4, 2); f.write(struct.pack("<f", float(sys.argv[2])))' \
        "$D/div$1.safetensors" "$2"
    if sync_v "$1" "$D/div$1.safetensors" "$D/sdiv$1.err"; then bad "a sync of $3 exits non-zero"; show "$D/sdiv$1.err"
    else
        grep -q "FAILED, no worker applied it" "$D/sdiv$1.err" && grep -q "a1:bad_weights: $4" "$D/sdiv$1.err" &&
            ok "sync v$1 of $3: FAILED, each worker says $4" || { bad "sync of $3 refused"; show "$D/sdiv$1.err"; }
    fi
    gen tiny "$D/gdiv$1" && grep -q "weights v4" "$D/gdiv$1.err" && same "$D/gdiv$1.safetensors" "$D/ref3.safetensors" &&
        ok "still serving v4, exactly, after the sync of $3" || { bad "GEN after a sync of $3"; show "$D/gdiv$1.err"; }
}
echo "== weights holding a NaN (a diverged trainer) are refused by every worker"
diverged 5 nan "a NaN" "NaN or infinite values"
grep -qE "sync to v5 refused: bad_weights: NaN or infinite values [(]tensor .* holds NaN or infinite values[)]" "$D/a1.log" &&
    ok "a1's log names the tensor" || { bad "NaN tensor named"; show "$D/a1.log"; }
echo "== finite weights past 2^24 (a trainer diverging, not yet at infinity) are refused too"
diverged 6 1e18 "values 1e18" "values of 2^24 or more"

echo "== a SYNC whose broker session ends before it is applied is dropped, and sent again on the new one"
# A drain-mode worker holds the SYNC while a long request runs; the broker
# stops answering (SIGSTOP) until the worker gives up on the session and
# registers again. The worker must not apply what it got on the old
# session (that broker may have failed the sync); the broker, still
# waiting for its ack, sends it again, and the sync completes.
C2="ipc://$D/c2"; W2="ipc://$D/w2e"
cli_broker "$D/broker2.log" --clients "$C2" --workers "$W2" --catalog "" --heartbeat-ms 200 --sync-deadline-ms 60000 ||
    bad "a second broker starts"
BROKER2=$BROKER
cli_worker dr "$D/broker2.log" "$D/dr.log" --broker "$W2" --weights "$D/w1.safetensors" --streams 1 \
    --sync-mode drain --heartbeat-ms 200 || bad "the drain worker registers"
# long_gen SEED TIMEOUT_MS: a GEN of 10,000 steps on dr in the background
# (LONG), its client cancelling it after TIMEOUT_MS; returns once dr runs it
long_gen() {
    "$R" gen --broker "$C2" --model tiny --context "$D/ctx.safetensors" --size 8x32x32 --steps 10000 --seed "$1" \
        --timeout-ms "$2" --quiet --out "$D/long$1.safetensors" 2>"$D/long$1.err" &
    LONG=$!
    PIDS="$PIDS $LONG"
    _i=0
    while ! "$R" status --broker "$C2" 2>/dev/null | grep -qE "^dr .* 1/[0-9]+ "; do
        _i=$((_i + 1))
        [ $_i -lt 1200 ] || { bad "dr runs the long GEN (seed $1)"; show "$D/long$1.err"; return 1; }
        sleep 0.05
    done
}
long_gen 3 8000
"$R" sync --broker "$C2" --version 2 --weights "$D/w2.safetensors" --timeout-ms 60000 >"$D/sdr.out" 2>"$D/sdr.err" &
SP=$!
PIDS="$PIDS $SP"
if wait_for "$D/dr.log" "draining 1 request.s. before applying v2" 60; then
    kill -STOP "$BROKER2"
    wait_for "$D/dr.log" "reconnecting" 60 || bad "the worker gives up on the silent broker"
    kill -CONT "$BROKER2"
else
    bad "the drain worker holds the SYNC while its request runs"; show "$D/dr.log"
fi
wait "$SP"; rc=$?
# (the worker drops it once its drain ends: its old session's request
# stops at its next step, after the sync's answer may have come)
wait_for "$D/dr.log" "sync to v2 abandoned: the broker session it came in ended before it was applied" 60 &&
    ok "the worker dropped the SYNC of its old session" || { bad "old session's SYNC dropped"; show "$D/dr.log"; }
# Which way it goes depends on what the broker reads first once it runs
# again: the worker's new READY (it sends the SYNC again: complete), or
# its heartbeat to the closed connection failing (worker lost: the sync
# fails). Either way the worker's weights must be what the sync says.
"$R" gen --broker "$C2" --model tiny $IN --timeout-ms 20000 --quiet --out "$D/gdr.safetensors" 2>"$D/gdr.err" ||
    { bad "GEN after the sync"; show "$D/gdr.err"; }
if [ "$rc" = 0 ]; then
    grep -q "complete; applied dr" "$D/sdr.err" && [ "$(grep -c "applied transformer v2" "$D/dr.log")" = 1 ] &&
        grep -q "sync transformer v2 sent again to dr: it registered again before answering" "$D/broker2.log" &&
        grep -q "weights v2" "$D/gdr.err" && same "$D/gdr.safetensors" "$D/ref2.safetensors" &&
        ok "complete: sent again on the new session, applied once, served exactly" ||
        { bad "the sync sent again"; show "$D/sdr.err" "$D/dr.log" "$D/broker2.log" "$D/gdr.err"; }
else
    grep -q "FAILED" "$D/sdr.err" && ! grep -q "applied transformer v2" "$D/dr.log" &&
        grep -q "weights v1" "$D/gdr.err" &&
        ok "failed (worker lost): nothing changed, the worker still serves v1 (exit $rc)" ||
        { bad "a failed sync the worker applied anyway (exit $rc)"; show "$D/sdr.err" "$D/dr.log" "$D/broker2.log" "$D/gdr.err"; }
fi
kill "$LONG" 2>/dev/null

echo "== a drain longer than the sync's deadline: failed, then current once the worker applies it"
# The sync fails on its deadline while the drain-mode worker still waits
# for its request; the worker applies it when the request ends (cancelled
# by its client), and its late ok makes the version current: the broker
# and the worker agree on what is served.
# dr free first: the last section's long GEN (its client killed) runs on
# until its deadline, and long_gen's "dr 1/N" must be this one's, not that one
_i=0
while ! "$R" status --broker "$C2" 2>/dev/null | grep -qE "^dr .* 0/[0-9]+ "; do
    _i=$((_i + 1))
    [ $_i -lt 1200 ] || { bad "dr ends the last long GEN"; break; }
    sleep 0.05
done
long_gen 4 6000
"$R" sync --broker "$C2" --version 3 --weights "$D/w3.safetensors" --deadline-ms 1000 --timeout-ms 30000 \
    >"$D/sdl.out" 2>"$D/sdl.err"
rc=$?
[ "$rc" != 0 ] && grep -q "FAILED" "$D/sdl.err" && grep -q "dr:timeout" "$D/sdl.err" &&
    ok "sync v3 with a 1 s deadline while dr drains: FAILED, dr timeout (exit $rc)" ||
    { bad "the sync past its deadline (exit $rc)"; show "$D/sdl.err"; }
wait_for "$D/broker2.log" "transformer v3 is current again: applied by dr after its sync ran out of time" 60 &&
    "$R" status --broker "$C2" 2>&1 | grep -qE "transformer v3" &&
    "$R" gen --broker "$C2" --model tiny $IN --timeout-ms 20000 --quiet --out "$D/gdl.safetensors" 2>"$D/gdl.err" &&
    grep -q "weights v3" "$D/gdl.err" && same "$D/gdl.safetensors" "$D/ref3.safetensors" &&
    ok "dr applied it when its drain ended: v3 is current, and served exactly" ||
    { bad "a late apply after the deadline"; show "$D/broker2.log" "$D/dr.log" "$D/gdl.err"; }
kill "$LONG" 2>/dev/null

finish
