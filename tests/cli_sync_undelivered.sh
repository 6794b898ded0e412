#!/bin/sh
# cli_sync_undelivered.sh -- a weight sync is not failed because a worker
# was between two broker sessions when it began (docs/PROTOCOL.md,
# "Weight syncs"): a real reel-broker over ipc, the trainer `reelctl
# sync`, and a raw worker (tests/away_peer.py) that leaves on cue (its
# socket closed: the broker's route to it is gone, and the broker's next
# HEARTBEAT to it fails, "unreachable") and comes back on cue (a new
# socket under the same routing id, READY again), as a reel-worker that
# gave up on a silent broker does.
#   1. The worker is away when the SYNC comes: its SYNC cannot be sent;
#      the sync stays pending (not failed "unreachable"), and when the
#      worker registers again it is sent the SYNC, acks it, and the sync
#      ends complete, applied by it.
#   2. It never comes back: the sync ends at its deadline (the trainer
#      does not hang), failed "SYNC not delivered: the worker did not
#      register again before the sync's deadline"; nothing changes.
#   3. It never comes back and the deadline is far: the broker's liveness
#      drops the worker, and the sync ends then, failed "SYNC not
#      delivered: the worker was lost (expired) ...".
# Usage: cli_sync_undelivered.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-syncaway.XXXXXX)
SUITE=sync_undelivered
PY=/usr/bin/python3
PEER="$(dirname "$0")/away_peer.py"
. "$(dirname "$0")/lib_cli.sh"
CE="ipc://$D/c"
WE="ipc://$D/w"
DB="$D/reel.db"
BL="$D/b.log"

for v in 2 3 4 5; do "$R" weights init --config tiny --seed $((6 + v)) --out "$D/w$v.safetensors" 2>/dev/null; done
state() { /usr/bin/sqlite3 "$DB" "select state from weight_versions where component = 'transformer' and version = $1"; }
sync_bg() { # V DEADLINE_MS: reelctl sync of w$V in the background ($!), its output in sync$V.err
    "$R" sync --broker "$CE" --version "$1" --weights "$D/w$1.safetensors" --deadline-ms "$2" --timeout-ms 60000 \
        >"$D/sync$1.err" 2>&1 &
}
away() { # the peer leaves; 0 once the broker found it unreachable (N: how many times so far)
    kill -USR1 "$P"
    wait_for "$D/p.out" "^away" 30 || return 1
    wait_count "$BL" "worker u unreachable \(HEARTBEAT send failed" "$1" 30
}

# A worker is dropped after 40 x 200 ms = 8 s of silence: each step below
# (a reelctl, a wait for a log line) has that long while the worker is
# away but still registered; the sync deadlines are shorter.
cli_broker "$BL" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 --liveness 40 ||
    { bad "the broker starts"; show "$BL"; finish; }
BP=$BROKER
$PY "$PEER" --endpoint "$WE" --name u --for 120 >"$D/p.out" 2>&1 &
P=$!
PIDS="$PIDS $P"
wait_for "$BL" "worker u ready" 30 || { bad "the raw worker registers"; show "$D/p.out"; finish; }

echo "== 0. a sync while the worker is there (it ends once the broker's rejoin window has)"
# A SYNC in a broker's first two liveness periods is held for workers
# that have not registered yet; this one ends after that window, so the
# syncs below are not held.
sync_bg 2 30000
S=$!
reap "$S" 60 && grep -q "sync transformer v2: complete; applied u;" "$D/sync2.err" &&
    ok "v2 complete, applied by the worker" || { bad "v2"; show "$D/sync2.err"; show "$BL"; finish; }

echo "== 1. away when the SYNC comes, back before the deadline: the SYNC goes again, and the sync completes"
away 1 || { bad "the worker leaves and the broker notices"; show "$BL"; finish; }
sync_bg 3 30000
S=$!
wait_for "$BL" "sync transformer v3: SYNC not delivered to u when the sync began \(unreachable\)" 30 &&
    ok "the broker could not send SYNC v3 and keeps waiting for the worker" || { bad "no undelivered SYNC"; show "$BL"; }
"$R" status --broker "$CE" --json 2>/dev/null | $PY -c '
import json, sys
s = json.load(sys.stdin)
print("PASS v3 still pending while the worker is away" if s.get("pending", {}).get("transformer") == 3
      else "FAIL status pending %r" % s.get("pending"))' >"$D/st1.out" 2>&1
py_checks "$D/st1.out" $?
gone "$S" && bad "the sync ended while the worker was away: $(cat "$D/sync3.err")" ||
    ok "the trainer is not answered while the worker may come back"
kill -USR2 "$P"
reap "$S" 60 && grep -q "sync transformer v3: complete; applied u;" "$D/sync3.err" &&
    ok "the worker registered again, was sent v3 and applied it: the sync ends complete" ||
    { bad "v3 did not complete"; show "$D/sync3.err"; show "$BL"; }
grep -q "^SYNC 3$" "$D/p.out" && ok "SYNC v3 reached the worker on its new session" || { bad "no SYNC v3"; show "$D/p.out"; }
grep -q "sync transformer v3 sent again to u: it registered again" "$BL" && ok "the broker says it sent v3 again" ||
    bad "no word of the resend"
[ "$(state 3)" = current ] && ok "the catalog says v3 is current" || bad "v3 is '$(state 3)'"

echo "== 2. away, and not back by the deadline: the sync ends at its deadline, saying why"
away 2 || { bad "the worker leaves again"; show "$BL"; finish; }
sync_bg 4 1500
S=$!
# bounded well under the liveness (8 s): the deadline ends it, not the worker's loss
reap "$S" 30 && bad "reelctl sync v4 exited 0" || true
grep -q "sync transformer v4: FAILED, no worker applied it.*failed u:SYNC not delivered: the worker did not register again before the sync's deadline" "$D/sync4.err" &&
    ok "v4 failed at its deadline: SYNC not delivered, the worker did not register again" ||
    { bad "v4's outcome"; show "$D/sync4.err"; }
grep -q "worker u lost (expired)" "$BL" && bad "the worker was dropped before v4's deadline (a slow machine?)" ||
    ok "the deadline, not the worker's loss, ended it"
wait_sql "$DB" "select count(*) from weight_versions where version = 4 and state = 'failed' and reason like '%SYNC not delivered%deadline%'" 1 30 &&
    ok "the catalog marks v4 failed, and why" || bad "v4 is '$(state 4)'"
"$R" status --broker "$CE" --json 2>/dev/null | $PY -c '
import json, sys
s = json.load(sys.stdin)
print("PASS v3 stays current" if s["versions"].get("transformer") == 3 else "FAIL status versions %r" % s["versions"])' \
    >"$D/st2.out" 2>&1
py_checks "$D/st2.out" $?

echo "== 3. still away, a far deadline: the worker's loss ends the sync"
sync_bg 5 60000
S=$!
reap "$S" 40 && bad "reelctl sync v5 exited 0" || true
grep -q "sync transformer v5: FAILED.*failed u:SYNC not delivered: the worker was lost (expired) before it registered again" "$D/sync5.err" &&
    ok "v5 failed when the broker dropped the silent worker, well before its 60 s deadline" ||
    { bad "v5's outcome"; show "$D/sync5.err"; show "$BL"; }
kill "$P" 2>/dev/null
reap "$P" 30
stop_proc "$BP" 30
finish
