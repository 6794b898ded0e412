#!/bin/sh
# cli_standby_sync.sh -- a sync that reaches the standby as it takes over,
# before the workers have moved to it (docs/OPERATIONS.md "When the broker
# dies mid-way"): a standby pair A (primary) and B (backup), two workers
# registered with A and then stopped (SIGSTOP, so they cannot move yet), A
# SIGKILLed, and a trainer's SYNC through the pair: it makes B active, and
# B holds it for the workers instead of failing it with no live worker.
# The workers resumed move to B, apply it, and the sync ends complete with
# both listed; a GEN after it runs on the new version, bitwise `reelctl
# run`. Every wait is bounded; every process is killed on exit.
# Usage: cli_standby_sync.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-standby-sync.XXXXXX)
SUITE=standby_sync
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"
export REEL_CLIENT_LIVENESS_MS=300

ports=$($PY -c '
import socket
ss = [socket.socket() for _ in range(4)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))
for s in ss: s.close()')
set -- $ports
CA="tcp://127.0.0.1:$1"; CB="tcp://127.0.0.1:$2"; PEA="tcp://127.0.0.1:$3"; PEB="tcp://127.0.0.1:$4"
PAIR="$CA,$CB"
WA="ipc://$D/wa"; WB="ipc://$D/wb"
for v in 1 2; do "$R" weights init --config tiny --seed $((40 + v)) --out "$D/w$v.safetensors" 2>/dev/null; done
"$R" tensor rand --name context --shape 5,32 --seed 61 --out "$D/c.safetensors" >/dev/null

# Each broker's --peer is the other's peer endpoint (here the peer link is
# the client endpoint itself, as docs/OPERATIONS.md's pair example).
cli_broker "$D/a.log" --clients "$CA" --workers "$WA" --catalog "$D/a.db" --heartbeat-ms 200 \
    --peer "$CB" --role primary --peer-timeout-ms 1500 || { bad "broker A starts"; show "$D/a.log"; finish; }
BA=$BROKER
cli_broker "$D/b.log" --clients "$CB" --workers "$WB" --catalog "$D/b.db" --heartbeat-ms 200 \
    --peer "$CA" --role backup --peer-timeout-ms 1500 || { bad "broker B starts"; show "$D/b.log"; finish; }
wait_for "$D/a.log" "reel-broker: active \(term 1\)" 30 && wait_for "$D/b.log" "reel-broker: standby" 30 ||
    { bad "A active, B standby"; show "$D/a.log" "$D/b.log"; finish; }
WPIDS=""
for w in wa wb; do
    cli_worker $w "$D/a.log" "$D/$w.log" --broker "$WA,$WB" --weights "$D/w1.safetensors" --streams 1 \
        --heartbeat-ms 200 || { bad "worker $w registers with A"; show "$D/$w.log"; finish; }
    WPIDS="$WPIDS $WORKER"
done
ok "A active with both workers, B standby"

kill -STOP $WPIDS
kill -9 "$BA"
reap "$BA" 30 >/dev/null
"$R" sync --broker "$PAIR" --version 2 --weights "$D/w2.safetensors" --deadline-ms 30000 --timeout-ms 60000 \
    >"$D/sync.err" 2>&1 &
S=$!
PIDS="$PIDS $S"
if wait_for "$D/b.log" "reel-broker: active \(term 2\)" 60 &&
    wait_for "$D/b.log" "sync transformer v2: 0 worker\(s\) registered .* after the broker started or took over: held" 60; then
    ok "the SYNC made B active, and B holds it for the workers (none has moved yet)"
else
    bad "B holds the sync"; show "$D/b.log"; show "$D/sync.err"
fi
kill -CONT $WPIDS
if reap "$S" 60 && grep -q "sync transformer v2: complete; applied w[ab],w[ab];" "$D/sync.err"; then
    ok "the workers moved to B and applied v2: the sync ends complete with both"
else
    bad "the sync at the takeover"; show "$D/sync.err"; show "$D/b.log"
fi
"$R" run --weights "$D/w2.safetensors" --context "$D/c.safetensors" --size 2x8x8 --steps 3 --seed 5 \
    --out "$D/ref.safetensors" 2>/dev/null
"$R" gen --broker "$PAIR" --model tiny --context "$D/c.safetensors" --size 2x8x8 --steps 3 --seed 5 \
    --timeout-ms 60000 --out "$D/g.safetensors" 2>"$D/g.err" &&
    "$R" tensor diff "$D/g.safetensors" "$D/ref.safetensors" >/dev/null 2>&1 && grep -q "weights v2" "$D/g.err" &&
    ok "a GEN after it runs on v2 at B, bitwise reelctl run" || { bad "GEN on v2"; show "$D/g.err"; }
finish
