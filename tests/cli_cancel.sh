#!/bin/sh
# cli_cancel.sh -- CANCEL (docs/PROTOCOL.md "Cancelling") with a real
# reel-broker and a CPU reel-worker over ipc: a running GEN is answered
# ERROR cancelled at once and its worker drops it before its next step; a
# queued one never starts; only its own connection, or its client token,
# names it; unknown, answered and malformed CANCELs; clients take turns
# for the one slot (another client's GEN before a queue's rest); a full
# queue (--queue-max 8) makes way for another client's GEN, the flooding
# client's newest waiting one answered BUSY; the Python client and
# reelctl gen cancel what they give up on (a timeout; reelctl gen's
# SIGINT, exit 130); the catalog records each as
# cancelled; a member of a mixed batch (--max-batch 4) cancelled mid-loop
# leaves the others' latents bitwise `reelctl run` of each alone; a group
# split over two streams stops in both parts; a GEN a --sync-mode drain
# holds is dropped at once when cancelled, not when the drain ends.
# tests/cancel_driver.py drives the sockets. Every wait is
# bounded; every process is killed on exit.
# Usage: cli_cancel.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d /tmp/reel-cancel.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
DB="$D/reel.db"
SUITE=cancel
. "$(dirname "$0")/lib_cli.sh"
q() { /usr/bin/sqlite3 "$DB" "$1" 2>/dev/null; }

"$R" weights init --config tiny --seed 7 --out "$D/w1.safetensors" 2>/dev/null
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"

echo "== a broker, a worker with one slot"
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 --queue-max 8 ||
    { bad "the broker starts"; finish; }
cli_worker w0 "$D/broker.log" "$D/w0.log" --broker "$WE" --weights "$D/w1.safetensors" --streams 1 \
    --max-inflight 1 --heartbeat-ms 200 || { bad "the worker starts"; finish; }

echo "== raw CANCELs, and the Python client's"
timeout -k 5 660 /usr/bin/python3 "$HERE/cancel_driver.py" --endpoint "$CE" --python-path "$HERE/../clients/python" \
    >"$D/driver.out" 2>&1
py_checks "$D/driver.out" $?

wait_sql "$DB" "select count(*) from requests where id in (32, 33, 34, 35, 41) and status = 'ok'" 5 60 || bad "the five turn rows reach the catalog"
order=$(q "select group_concat(id, ' ') from (select id from requests where id in (32, 33, 34, 35, 41) and status = 'ok' order by rowid)")
[ "$order" = "41 32 33 34 35" ] && ok "clients take turns: y's GEN ran before c3's four queued ahead of it; c3's in its order" ||
    { bad "turns between clients (catalog order: '$order', expected '41 32 33 34 35')"; }

echo "== reelctl gen cancels the GEN it gave up on"
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 4x16x16 --seed 1 --steps 10000 \
    --timeout-ms 1500 --quiet --out "$D/x.safetensors" 2>"$D/gen.err"
rc=$?
[ "$rc" != 0 ] && grep -qi "timeout\|in time" "$D/gen.err" && ok "reelctl gen --timeout-ms 1500 of a long GEN fails (exit $rc)" ||
    { bad "reelctl gen times out (exit $rc)"; show "$D/gen.err"; }
echo "== reelctl gen cancels its GEN on SIGINT"
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 4x16x16 --seed 2 --steps 10000 \
    --timeout-ms 120000 --quiet --out "$D/z.safetensors" 2>"$D/int.err" &
gp=$!
PIDS="$PIDS $gp"
inflight() { "$R" status --broker "$CE" --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(sum(w["inflight"] for w in json.load(sys.stdin)["workers"]))' 2>/dev/null; }
# wait_inflight N PID...: until the workers hold N requests, at most 60 s,
# or until one of the PIDs (the clients sending them) has ended
wait_inflight() {
    _n=$1; shift
    _end=$(($(date +%s) + 60))
    while [ "$(inflight)" != "$_n" ] && [ "$(date +%s)" -lt $_end ]; do
        for _p in "$@"; do gone "$_p" && return 1; done
        sleep 0.1
    done
    [ "$(inflight)" = "$_n" ]
}
# interrupt PID ERR WHAT: SIGINT to a reelctl gen; WHAT holds when it
# exits 130 (it cancelled its GEN), else ERR is shown
interrupt() {
    kill -INT "$1" 2>/dev/null
    reap "$1" 30
    _rc=$?
    [ "$_rc" = 130 ] && ok "$3 (reelctl gen exit 130)" || { bad "$3 (exit $_rc)"; show "$2"; }
}
wait_inflight 1 "$gp" && ok "its GEN runs on the worker" || bad "reelctl gen's GEN runs"
interrupt "$gp" "$D/int.err" "SIGINT: reelctl gen stops"
grep -q "interrupted; the GEN was cancelled" "$D/int.err" && ok "and says the GEN was cancelled" ||
    { bad "reelctl gen's SIGINT message"; show "$D/int.err"; }

# the driver cancelled 16 (6 running, 8 queued, the client's 2 running); reelctl 2 more (running)
wait_sql "$DB" "select count(*) from requests where status = 'cancelled'" 18 60 &&
    ok "the catalog records every cancelled GEN as cancelled (18 rows)" ||
    { bad "cancelled rows"; q "select id, status, steps from requests"; grep -E "cancelled|late|lost|requeued" "$D/broker.log" | tail -20; }
wait_count "$D/w0.log" "cancelled by its client after" 10 60 &&
    ok "the worker dropped each running one (10 log lines)" || { bad "the worker's cancels"; grep "failed" "$D/w0.log" | tail -5; grep -E "cancelled|late|lost|requeued" "$D/broker.log" | tail -20; }
grep "cancelled by its client after" "$D/w0.log" | grep -v " of 10000 steps" | head -3 >"$D/odd.txt"
awk '/cancelled by its client after/ { for (i = 1; i < NF; i++) if ($i == "after") n = $(i + 1); if (n + 0 >= 10000) bad++ } END { exit bad > 0 }' "$D/w0.log" &&
    [ ! -s "$D/odd.txt" ] && ok "each stopped before its last step (k of 10000, k < 10000)" || { bad "cancelled step counts"; grep "cancelled by its client" "$D/w0.log" | head; }
! grep -q "no late answer" "$D/broker.log" && ok "the worker answered every cancelled request (no slot waited out its grace)" ||
    { bad "a slot waited for its grace"; grep "no late answer" "$D/broker.log" | head -3; }
grep -q "cancelled by its client while queued" "$D/broker.log" && grep -q "cancelled by its client while running on w0" "$D/broker.log" &&
    ok "the broker logs where each was when cancelled" || bad "the broker's log lines"
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --seed 1 --steps 2 \
    --timeout-ms 60000 --quiet --out "$D/y.safetensors" 2>"$D/y.err" && ok "and it serves the next GEN" || { bad "a GEN after"; show "$D/y.err"; }

echo "== a cancelled member of a mixed batch: the others go on, bitwise as if alone"
stop_proc "$WORKER" || bad "w0 stops"
cli_worker wb "$D/broker.log" "$D/wb.log" --broker "$WE" --weights "$D/w1.safetensors" --streams 1 \
    --max-inflight 4 --max-batch 4 --batching always --heartbeat-ms 200 || { bad "the batching worker starts"; finish; }
MS=4000
# (2x16x16, not 2x8x8: the two short GENs must still run when the poll
# has seen all three in flight; 4,000 batched steps of 2x8x8 took 1-3 s
# on the worker here, which a faster machine could end before the poll.
# The broker's deadline is the client's 300 s, not the default 60 s: on a
# busy 2-core VM (3 busy loops and two more suites) these took over 60 s.)
bgen() { # SEED STEPS: a long GEN of one key (2x16x16, no CFG; the step count is no part of the key), its
    # output in $D/b.SEED.safetensors (exec: $! is reelctl's pid)
    exec "$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x16x16 --seed "$1" --steps "$2" \
        --deadline-ms 300000 --timeout-ms 300000 --out "$D/b.$1.safetensors" 2>"$D/b.$1.err"
}
bgen 11 $MS & b1=$!
bgen 12 10000 & b2=$! # the one cancelled: long, so that it is still running when the SIGINT comes
bgen 13 $MS & b3=$!
PIDS="$PIDS $b1 $b2 $b3"
wait_inflight 3 "$b1" "$b3" && ok "three GENs of one key run on the batching worker at once" || bad "three GENs in flight ($(inflight))"
interrupt "$b2" "$D/b.12.err" "the middle one is cancelled"
reap "$b1" 300 && reap "$b3" 300 && ok "the other two are answered" || { bad "the other two GENs"; show "$D/b.11.err"; show "$D/b.13.err"; }
wait_count "$D/wb.log" "cancelled by its client after" 1 60 &&
    ! grep "cancelled by its client after" "$D/wb.log" | grep -q " 10000 of 10000 steps" &&
    ok "the worker dropped it before its last step" || { bad "the batching worker's cancel"; grep -E "failed|cancel" "$D/wb.log" | tail -5; }
grep -q "batched with other requests" "$D/b.11.err" && grep -q "batched with other requests" "$D/b.13.err" &&
    ok "both ran in mixed steps (reelctl gen says batched)" || { bad "the two were not batched"; show "$D/b.11.err"; }
n=0
for s in 11 13; do
    timeout -k 5 300 "$R" run --weights "$D/w1.safetensors" --context "$D/ctx.safetensors" --size 2x16x16 --seed $s --steps $MS \
        --out "$D/ref.$s.safetensors" 2>"$D/ref.$s.err" || bad "reelctl run seed $s"
    "$R" tensor diff "$D/b.$s.safetensors" "$D/ref.$s.safetensors" --name latent >/dev/null 2>&1 && n=$((n + 1))
done
[ $n = 2 ] && ok "each latent is bitwise reelctl run of the request alone" || bad "$n of 2 latents equal reelctl run"
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --seed 1 --steps 2 \
    --timeout-ms 60000 --quiet --out "$D/y2.safetensors" 2>"$D/y2.err" && ok "and the worker serves the next GEN" || { bad "a GEN after the batch"; show "$D/y2.err"; }

echo "== a cancelled group split over two streams: both parts stop"
stop_proc "$WORKER" || bad "wb stops"
cli_worker wg "$D/broker.log" "$D/wg.log" --broker "$WE" --weights "$D/w1.safetensors" --streams 2 \
    --heartbeat-ms 200 || { bad "the two-stream worker starts"; finish; }
# 2x16x16: each part must still run at the SIGINT (it comes after a poll)
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x16x16 --n 4 --seed 5 --steps 10000 \
    --timeout-ms 300000 --quiet --out "$D/g.safetensors" 2>"$D/g.err" &
gp=$!
PIDS="$PIDS $gp"
wait_inflight 1 "$gp" && ok "the group of 4 runs on the two-stream worker" || bad "the group runs ($(inflight) in flight)"
interrupt "$gp" "$D/g.err" "the group is cancelled"
wait_count "$D/wg.log" "cancelled by its client after" 1 60 && wait_for "$D/wg.log" "another part of the group failed" 60 &&
    ok "both parts stopped: one answered cancelled, the other stopped with it (the worker's log)" ||
    { bad "the parts' cancels"; grep -E "failed|cancel|part" "$D/wg.log" | tail -5; }
[ "$(grep -c "another part of the group failed" "$D/wg.log")" = 1 ] && [ "$(grep -c "cancelled by its client after" "$D/wg.log")" = 1 ] &&
    ok "one ERROR for the group, one stop line for its other part" || { bad "the group's log lines"; grep -E "cancel|part" "$D/wg.log"; }
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --n 4 --seed 6 --steps 2 \
    --timeout-ms 60000 --quiet --out "$D/g2.safetensors" 2>"$D/g2.err" && ok "and the worker serves the next group" || { bad "a group after"; show "$D/g2.err"; }
! grep -q "no late answer" "$D/broker.log" && ok "no slot waited out its grace" || bad "a slot waited for its grace"

echo "== a GEN a drain holds, cancelled: dropped at once, not when the drain ends"
"$R" weights init --config tiny --seed 8 --out "$D/w2.safetensors" 2>/dev/null
stop_proc "$WORKER" || bad "wg stops"
cli_worker wd "$D/broker.log" "$D/wd.log" --broker "$WE" --weights "$D/w1.safetensors" --streams 2 \
    --sync-mode drain --heartbeat-ms 200 || { bad "the drain worker starts"; finish; }
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 4x32x32 --seed 7 --steps 10000 \
    --timeout-ms 300000 --quiet --out "$D/da.safetensors" 2>"$D/da.err" &
ga=$!
PIDS="$PIDS $ga"
wait_inflight 1 "$ga" && ok "a long GEN runs" || bad "the long GEN runs ($(inflight) in flight)"
"$R" sync --broker "$CE" --version 2 --weights "$D/w2.safetensors" >"$D/sync.out" 2>&1 &
sp=$!
PIDS="$PIDS $sp"
wait_for "$D/wd.log" "draining 1 request.* before applying v2" 60 && ok "the worker drains for v2 (the long GEN runs on)" ||
    { bad "the worker drains"; tail -5 "$D/wd.log"; }
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --seed 8 --steps 50 \
    --timeout-ms 300000 --quiet --out "$D/db.safetensors" 2>"$D/db.err" &
gb=$!
PIDS="$PIDS $gb"
wait_inflight 2 "$gb" && ok "a second GEN reaches the worker, which holds it" || bad "the held GEN ($(inflight) in flight)"
interrupt "$gb" "$D/db.err" "the held GEN is cancelled"
wait_inflight 1 "$ga" && ! grep -q "applied transformer v2" "$D/wd.log" && ! gone "$ga" &&
    ok "its slot frees while the drain still waits for the long GEN: the worker dropped it at once" ||
    { bad "the held GEN's slot ($(inflight) in flight)"; grep -E "cancel|drain|applied" "$D/wd.log" | tail -5; }
grep -q "cancelled by its client after 0 of 50 steps" "$D/wd.log" && ok "it never ran a step" ||
    { bad "the held GEN's stop"; grep "cancelled" "$D/wd.log" | tail -3; }
kill -INT "$ga" 2>/dev/null
reap "$ga" 30
reap "$sp" 90
rc=$?
[ "$rc" = 0 ] && wait_for "$D/wd.log" "applied transformer v2" 30 && ok "with the long GEN cancelled the drain ends and v2 applies" ||
    { bad "the sync after the drain (exit $rc)"; show "$D/sync.out"; }
finish
