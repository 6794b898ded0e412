#!/bin/sh
# cli_cluster.sh -- process-level tests of the serving fabric: a real
# reel-broker and real reel-workers over ipc sockets, driven by reelctl,
# with CURVE on (docs/SECURITY.md): the broker's --keys, a key per worker,
# reelctl with a trainer's key from REEL_KEY/REEL_BROKER_KEY.
# Every wait is bounded; every process is killed on exit.
# Usage: cli_cluster.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-cluster.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
DB="$D/reel.db"
SUITE=cluster
. "$(dirname "$0")/lib_cli.sh"

K="$D/keys"
for k in "broker broker" "trainer trainer" "worker w1" "worker w2" "worker w3" "worker w4" "worker xd" "worker xs"; do
    set -- $k
    "$R" keys new --role "$1" --name "$2" --out "$K" >/dev/null 2>&1 || { echo "keys new $k failed"; exit 1; }
done
export REEL_KEY="$K/trainer.key" REEL_BROKER_KEY="$K/broker.pub"

start_broker() { # extra flags...
    # a restart appends to the log: wait for one more "ready" than before
    _ready=$(grep -c "reel-broker: ready" "$D/broker.log" 2>/dev/null)
    "$B/reel-broker" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 --keys "$K" "$@" \
        >>"$D/broker.log" 2>&1 &
    BROKER=$!
    PIDS="$PIDS $BROKER"
    wait_count "$D/broker.log" "reel-broker: ready" $((${_ready:-0} + 1)) 60
}


start_worker() { # name weights extra...
    n=$1; w=$2; shift 2
    before=$(grep -cE "worker $n ready" "$D/broker.log" 2>/dev/null)
    "$B/reel-worker" --broker "$WE" --name "$n" --weights "$w" --streams 2 --heartbeat-ms 200 \
        --key "$K/$n.key" --broker-key "$K/broker.pub" "$@" \
        >>"$D/$n.log" 2>&1 &
    eval "PID_$n=$!"
    PIDS="$PIDS $!"
    wait_count "$D/broker.log" "worker $n ready" $((before + 1)) 60
}

"$R" weights init --config tiny --seed 7 --out "$D/w1.safetensors" 2>/dev/null
"$R" weights init --config tiny --seed 8 --out "$D/w2.safetensors" 2>/dev/null
"$R" tensor rand --name latent --shape 4,2,8,8 --seed 1 --out "$D/lat.safetensors"
# lat32: the requests that must outlast their deadline (1.5 s, 20 s) on any
# machine: 10000 steps (MSG_MAX_STEPS) of tiny with CFG on it took 22 ms a
# step, 220 s, on the 2-core VM; on 4,2,16,16 it was 2.2 ms, 22 s, which a
# faster machine (or more cores for the 8 held) ends inside the 20 s
"$R" tensor rand --name latent --shape 4,2,32,32 --seed 4 --out "$D/lat32.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 3 --out "$D/unc.safetensors"
IN="--context $D/ctx.safetensors --uncond $D/unc.safetensors --cfg 4 --latent $D/lat.safetensors --shift 3"
GEN="$R gen --broker $CE --model tiny $IN --timeout-ms 60000 --quiet"

# The references: the same loops in one process, no broker.
"$R" run --weights "$D/w1.safetensors" $IN --steps 6 --out "$D/ref1.safetensors" 2>/dev/null
"$R" run --weights "$D/w2.safetensors" $IN --steps 6 --out "$D/ref2.safetensors" 2>/dev/null
"$R" run --weights "$D/w1.safetensors" $IN --steps 400 --out "$D/ref1_long.safetensors" 2>/dev/null

same() { "$R" tensor diff "$1" "$2" >/dev/null 2>&1; }
# status_field EXPR: a Python expression over the STATUS reply s, printed
status_field() {
    "$R" status --broker "$CE" --json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
try: s = json.load(sys.stdin)
except ValueError: sys.exit(0)
print('"$1"')' 2>/dev/null
}
# slots_of WORKER FIELD MIN: wait (bounded) until WORKER's FIELD in STATUS is at least MIN
slots_of() {
    for _i in $(seq 1 600); do
        [ "$(status_field 'int(any(w["name"] == "'"$1"'" and w["'"$2"'"] >= '"$3"' for w in s["workers"]))')" = 1 ] && return 0
        sleep 0.1
    done
    return 1
}
worker_of() { sed -n 's/.*worker \([a-z0-9]*\),.*/\1/p' "$1" | head -1; }

echo "== a broker and two workers"
start_broker --queue-max 64 || { bad "the broker starts"; finish; }
start_worker w1 "$D/w1.safetensors" || bad "w1 starts"
start_worker w2 "$D/w1.safetensors" || bad "w2 starts"

echo "== results through the broker are bitwise equal to reelctl run"
if $GEN --steps 6 --out "$D/o1.safetensors" 2>"$D/first.err" && same "$D/o1.safetensors" "$D/ref1.safetensors"; then
    ok "gen == run"; else bad "gen == run"; cat "$D/first.err"; fi

echo "== the same key keeps its worker"
first=$(worker_of "$D/first.err"); keep=yes
for i in 1 2 3 4; do
    $GEN --steps 6 --out "$D/o.safetensors" 2>"$D/same$i.err" || keep=no
    [ "$(worker_of "$D/same$i.err")" = "$first" ] || keep=no
done
[ -n "$first" ] && [ "$keep" = yes ] && ok "5 requests of one key all ran on $first" || bad "same key keeps its worker"
grep -q "replayed [1-9]" "$D/same4.err" && ok "a later request replays its graphs" || { bad "later requests replay"; cat "$D/same4.err"; }

echo "== a second worker under a live worker's name is dropped, and says what to check"
"$B/reel-worker" --broker "$WE" --name w1 --weights "$D/w1.safetensors" --streams 1 --heartbeat-ms 200 \
    --key "$K/w1.key" --broker-key "$K/broker.pub" >"$D/dup.log" 2>&1 &
DUP=$!
PIDS="$PIDS $DUP"
wait_for "$D/dup.log" "no answer to READY: the broker is not listening there, or another worker named 'w1' is connected" 60 &&
    ok "the duplicate w1 hears nothing and its log names the likely cause" || { bad "duplicate name"; show "$D/dup.log"; }
kill "$DUP" 2>/dev/null
reap "$DUP" 30
$GEN --steps 6 --out "$D/odup.safetensors" 2>"$D/dup.err" && same "$D/odup.safetensors" "$D/ref1.safetensors" &&
    ok "the live w1 and w2 serve on, bitwise" || { bad "serving after the duplicate"; cat "$D/dup.err"; }

echo "== a worker killed with requests in flight: none lost, none hanging"
other=w1; [ "$first" = w1 ] && other=w2
pids=""
for i in 1 2 3 4; do
    $GEN --steps 400 --out "$D/k$i.safetensors" 2>"$D/k$i.err" &
    pids="$pids $!"
done
# kill it once it runs some of them (its slots taken), not after a guess
slots_of "$first" inflight 1 || bad "$first takes requests before the kill"
eval "kill -9 \$PID_$first"
lost=0
for p in $pids; do reap "$p" 120 || lost=$((lost + 1)); done
allsame=yes
for i in 1 2 3 4; do same "$D/k$i.safetensors" "$D/ref1_long.safetensors" || allsame=no; done
[ "$lost" = 0 ] && [ "$allsame" = yes ] && ok "4 in-flight requests requeued and exact" || {
    bad "requests survive a killed worker (lost $lost, exact $allsame)"; cat "$D"/k*.err | tail -4; }
wait_for "$D/broker.log" "worker $first lost" 60 && ok "the broker noticed $first died" || bad "dead worker detected"
start_worker "$first" "$D/w1.safetensors" || bad "$first restarts"

echo "== a weight sync is a barrier; no request runs on stale weights"
if "$R" sync --broker "$CE" --version 2 --weights "$D/w2.safetensors" --timeout-ms 30000 2>"$D/s.err"; then
    grep -q "applied .*w1" "$D/s.err" && grep -q "applied .*w2" "$D/s.err" && ok "sync v2 applied by w1 and w2" || { bad "sync names both workers"; cat "$D/s.err"; }
else bad "sync v2 completes"; cat "$D/s.err"; fi
$GEN --steps 6 --out "$D/o2.safetensors" 2>"$D/aftersync.err"
grep -q "weights v2" "$D/aftersync.err" && same "$D/o2.safetensors" "$D/ref2.safetensors" && ok "the next request ran on v2, exactly" || { bad "request after sync on v2"; cat "$D/aftersync.err"; }
"$R" sync --broker "$CE" --version 2 --weights "$D/w2.safetensors" --timeout-ms 10000 2>"$D/s2.err"
grep -q "complete" "$D/s2.err" && ok "the same sync again is an ack (a trainer's retry)" || { bad "a resent sync acks"; cat "$D/s2.err"; }
"$R" sync --broker "$CE" --version 2 --weights "$D/w1.safetensors" --timeout-ms 10000 2>"$D/s2.err"
grep -q "stale_version" "$D/s2.err" && ok "the same version with other weights is refused" || { bad "duplicate sync refused"; cat "$D/s2.err"; }

echo "== a late-joining worker catches up before serving"
start_worker w3 "$D/w1.safetensors" || bad "w3 starts"
wait_for "$D/w3.log" "applied transformer v2" 60 && ok "w3 applied v2 at join" || bad "w3 catches up"
"$R" status --broker "$CE" --json >"$D/status.json" 2>&1
grep -q '"w3"' "$D/status.json" && ok "status lists w3" || { bad "status lists w3"; cat "$D/status.json"; }

echo "== malformed input gets an ERROR and the broker keeps serving"
"$R" gen --broker "$CE" --model nosuchmodel --context "$D/ctx.safetensors" --latent "$D/lat.safetensors" --steps 2 --timeout-ms 3000 --deadline-ms 1000 --out "$D/x.safetensors" --quiet 2>"$D/e.err"
grep -qE "no_worker|timeout" "$D/e.err" && ok "an unknown model is answered, not hung" || { bad "unknown model answered"; cat "$D/e.err"; }
$GEN --steps 6 --out "$D/o3.safetensors" 2>"$D/still.err" && same "$D/o3.safetensors" "$D/ref2.safetensors" && ok "still serving" || bad "still serving"

echo "== a request past its deadline is dropped by its worker between steps"
# 10000 steps of lat32, not of lat.safetensors: 3780 of those were done at
# the 1.5 s deadline on the 2-core VM; a machine 3x faster would end them all
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" --cfg 4 --shift 3 \
    --latent "$D/lat32.safetensors" --steps 10000 --deadline-ms 1500 --timeout-ms 15000 --quiet --out "$D/long.safetensors" 2>"$D/long.err"
grep -q "timeout" "$D/long.err" && ok "the client is answered timeout at its deadline" || { bad "long request timed out"; cat "$D/long.err"; }
dropped=""
for i in $(seq 1 50); do
    dropped=$(grep -h "dropped after [0-9]* of 10000 steps: past its deadline" "$D"/w*.log | head -1)
    [ -n "$dropped" ] && break
    sleep 0.1
done
[ -n "$dropped" ] && ok "its worker dropped it within 5 s, not after 10000 steps: ${dropped##*failed: }" ||
    { bad "the worker drops a request past its deadline"; tail -3 "$D"/w*.log; }

echo "== a restarted broker gets its workers back"
stop_proc "$BROKER" || bad "the broker stops on SIGTERM"
: >"$D/broker.log"
start_broker --queue-max 64 || bad "broker restarts"
wait_for "$D/broker.log" "worker w1 ready" 60 && wait_for "$D/broker.log" "worker w2 ready" 60 && ok "workers re-registered" || bad "workers re-register"
$GEN --steps 6 --out "$D/o4.safetensors" 2>"$D/restart.err" && ok "serving after the restart" || { bad "serving after restart"; cat "$D/restart.err"; }
grep -q "restored transformer v2 from the catalog" "$D/broker.log" && ok "the restarted broker resumed transformer v2 from the catalog" || bad "versions restored after restart"
start_worker w4 "$D/w1.safetensors" || bad "w4 starts"
wait_for "$D/w4.log" "applied transformer v2" 60 && ok "a worker joining the restarted broker is caught up to v2" || bad "catch-up after restart"
grep -q "weights v2" "$D/restart.err" && same "$D/o4.safetensors" "$D/ref2.safetensors" && ok "no request ran on stale weights after the restart" || { bad "v2 after restart"; cat "$D/restart.err"; }

echo "== BUSY under overload"
# One worker, a queue of one. Its slots and the queue are filled with
# requests far too long to finish (10000 steps of 16x larger latents,
# interleaved) that are dropped at their deadline; only once STATUS shows them all
# taken does the burst go out, so every request of the burst must be BUSY
# however slow or fast the machine is.
for n in w2 w3 w4; do eval "stop_proc \$PID_$n" || bad "$n stops on SIGTERM"; done
stop_proc "$BROKER" || bad "the broker stops on SIGTERM"
: >"$D/broker.log"
start_broker --queue-max 1 || bad "broker restarts with a tiny queue"
wait_for "$D/broker.log" "worker w1 ready" 60
nslots=$(status_field 'sum(w["max_inflight"] for w in s["workers"])')
pids=""
for i in $(seq 1 $((${nslots:-0} + 1))); do
    "$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" --cfg 4 \
        --latent "$D/lat32.safetensors" --steps 10000 --deadline-ms 20000 --timeout-ms 60000 --quiet \
        --out "$D/hold$i.safetensors" 2>"$D/hold$i.err" &
    pids="$pids $!"
done
full=no
for i in $(seq 1 600); do
    [ "$(status_field 'int(sum(w["inflight"] for w in s["workers"]) == '"${nslots:-0}"' and s["queue"] == 1)')" = 1 ] && { full=yes; break; }
    sleep 0.1
done
[ "${nslots:-0}" -ge 1 ] && [ "$full" = yes ] && ok "w1's $nslots slots and the queue of one are taken" || bad "slots and queue filled (slots ${nslots:-?})"
nb=0
for i in 1 2 3 4 5 6; do
    $GEN --steps 6 --out "$D/b$i.safetensors" 2>"$D/b$i.err"
    grep -q "busy" "$D/b$i.err" && nb=$((nb + 1))
done
[ "$nb" = 6 ] && ok "6 of 6 requests past a full queue answered BUSY at once" || { bad "BUSY under overload (busy $nb of 6)"; show "$D/b1.err"; }
nto=0
for p in $pids; do reap "$p" 120; done
for f in "$D"/hold*.err; do grep -q "timeout" "$f" && nto=$((nto + 1)); done
[ "$nto" = $((${nslots:-0} + 1)) ] && ok "the $nto held requests were answered timeout at their deadline" || { bad "held requests answered ($nto timeouts)"; show "$D/hold1.err"; }
$GEN --steps 6 --out "$D/b7.safetensors" 2>"$D/b7.err" && grep -q "weights v2" "$D/b7.err" && same "$D/b7.safetensors" "$D/ref2.safetensors" &&
    ok "once the queue drains the next request is served, exactly" || { bad "served after the overload"; show "$D/b7.err"; }

echo "== the catalog matches what the clients saw"
served=$(grep -lE "reelctl: gen .* via " "$D"/*.err | wc -l)
wait_sql "$DB" "select count(*) from requests where status='ok'" "$served" 60
"$R" requests --catalog "$DB" --json >"$D/req.json" 2>&1 && ok "reelctl requests reads the catalog while the broker writes" || bad "catalog readable"
"$R" stats --catalog "$DB" >"$D/stats.txt" 2>&1 && grep -qi "captures" "$D/stats.txt" && ok "reelctl stats" || { bad "reelctl stats"; cat "$D/stats.txt"; }
rows=$(/usr/bin/sqlite3 "$DB" "select count(*) from requests where status='ok'" 2>/dev/null || echo 0)
[ "$rows" = "$served" ] && ok "catalog has $rows ok requests for $served served gens" || bad "catalog requests ($rows) vs served ($served)"
# each ok request's row names its capture key (the one its worker's
# captures are recorded by: the join `reelctl why` makes) and why any of
# its steps ran eager
nokey=$(/usr/bin/sqlite3 "$DB" "select count(*) from requests where status='ok' and (capture_key is null or length(capture_key) <> 16)" 2>/dev/null || echo x)
[ "$nokey" = 0 ] && ok "every ok request row has its capture key" || bad "ok request rows without a capture key ($nokey)"
graphed=$(/usr/bin/sqlite3 "$DB" "select count(*) from requests where status='ok' and replayed + captured > 0" 2>/dev/null || echo 0)
joined="select count(*) from requests r where status='ok' and replayed + captured > 0 and exists (select 1 from captures c where c.worker = r.worker and c.key_hash = r.capture_key)"
[ "$graphed" -gt 0 ] && wait_sql "$DB" "$joined" "$graphed" 30 &&
    ok "the $graphed requests that ran a graph join their worker's captures by capture key" ||
    { bad "requests join captures ($(/usr/bin/sqlite3 "$DB" "$joined" 2>/dev/null) of $graphed)"; }
noreason=$(/usr/bin/sqlite3 "$DB" "select count(*) from requests where status='ok' and eager > 0 and eager_reasons is null" 2>/dev/null || echo x)
[ "$noreason" = 0 ] && /usr/bin/sqlite3 "$DB" "select eager_reasons from requests where eager > 0" 2>/dev/null | grep -q "=" &&
    ok "requests with eager steps say why (eager_reasons)" || bad "eager_reasons ($noreason rows without)"
wait_sql "$DB" "select count(*) from evictions where reason='weight_sync'" 1 60
ev=$(/usr/bin/sqlite3 "$DB" "select count(*) from evictions where reason='weight_sync'" 2>/dev/null || echo 0)
[ "$ev" -ge 1 ] && ok "weight_sync evictions recorded ($ev)" || bad "weight_sync evictions recorded"

echo "== a sync landing mid-request: --sync-mode drain keeps the request on one version, steps reports the mix"
mkdir -p "$D/x"
solo() { # mode tag steps: a broker with one worker in that sync mode; runs the scenario
    mode=$1; t=$2; n=$3
    "$B/reel-broker" --clients "ipc://$D/x/$t.c" --workers "ipc://$D/x/$t.w" --catalog "$D/x/$t.db" --keys "$K" \
        --heartbeat-ms 200 >"$D/x/$t.broker.log" 2>&1 &
    PIDS="$PIDS $!"
    wait_for "$D/x/$t.broker.log" "reel-broker: ready" 60 || return 1
    "$B/reel-worker" --broker "ipc://$D/x/$t.w" --name "$t" --weights "$D/w1.safetensors" --streams 1 \
        --key "$K/$t.key" --broker-key "$K/broker.pub" \
        --heartbeat-ms 200 --sync-mode "$mode" >"$D/x/$t.log" 2>&1 &
    PIDS="$PIDS $!"
    wait_for "$D/x/$t.broker.log" "worker $t ready" 60 || return 1
    "$R" gen --broker "ipc://$D/x/$t.c" --model tiny $IN --steps "$n" --timeout-ms 60000 --quiet \
        --out "$D/x/$t.safetensors" 2>"$D/x/$t.err" &
    g=$!
    # the sync is sent once the worker runs the request (its slot taken),
    # not after a guessed delay: a fast machine would finish first
    i=0
    while [ $i -lt 100 ] && ! "$R" status --json --broker "ipc://$D/x/$t.c" 2>/dev/null | grep -q '"inflight":1'; do
        sleep 0.05; i=$((i + 1))
    done
    "$R" sync --broker "ipc://$D/x/$t.c" --version 2 --weights "$D/w2.safetensors" --timeout-ms 60000 2>"$D/x/$t.sync"
    reap "$g" 120
}
solo drain xd 1500
"$R" run --weights "$D/w1.safetensors" $IN --steps 1500 --out "$D/ref1_1500.safetensors" 2>/dev/null
grep -q "weights v1," "$D/x/xd.err" && same "$D/x/xd.safetensors" "$D/ref1_1500.safetensors" && \
    ok "drain: the running request finished on v1 alone, exactly" || { bad "drain keeps one version"; cat "$D/x/xd.err" "$D/x/xd.sync"; }
grep -q "complete" "$D/x/xd.sync" && grep -q "draining 1 request" "$D/x/xd.log" && \
    ok "drain: the sync completed after the request drained" || { bad "drain sync completes"; cat "$D/x/xd.sync"; tail -3 "$D/x/xd.log"; }
solo steps xs 3000
grep -q "weights v1->v2" "$D/x/xs.err" && ok "steps: the mixed request says v1->v2" || { bad "steps reports the version mix"; cat "$D/x/xs.err"; }

finish
