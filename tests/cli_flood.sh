#!/bin/sh
# cli_flood.sh -- issue 10, part 3: no peer can stall the broker. A real
# reel-broker and reel-worker over ipc; peers (tests/flood_peer.py) flood
# the client socket, the worker socket as a stranger, and the worker socket
# as a registered worker, with junk, and never read a reply. Before, 2,000
# such messages on the worker socket made the broker unresponsive for over
# a minute: each got an ERROR sent with a 200 ms timeout into a full pipe.
# Here `reelctl gen` and `reelctl status` run before and during the flood;
# each must answer within its timeout, and their latency ratio is printed
# (a measure, not a pass mark: performance lives in `make bench`). Then
# STATUS must show the junk counted and the answers to it suppressed, and
# SIGTERM under the flood must end the broker within 2 s.
# Usage: cli_flood.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
HERE=$(cd "$(dirname "$0")" && pwd)
FLOOD="/usr/bin/python3 $HERE/flood_peer.py"
D=$(mktemp -d /tmp/reel-flood.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
SUITE=flood
. "$(dirname "$0")/lib_cli.sh"

ms() { date +%s%3N; }

"$R" weights init --config tiny --seed 7 --out "$D/w.safetensors" 2>/dev/null
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$D/reel.db" --heartbeat-ms 200 ||
    { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "$WE" --weights "$D/w.safetensors" --streams 1 --heartbeat-ms 200 ||
    { bad "worker registers"; finish; }

# probe TAG: 5 gens and 5 statuses, each bounded by its timeout; prints
# the median milliseconds of each ("GEN_MS STATUS_MS"); returns 1 when any
# failed (a stalled broker times them out).
probe() {
    rc=0; : >"$D/$1.gen"; : >"$D/$1.status"
    for i in 1 2 3 4 5; do
        t0=$(ms)
        "$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 1x8x8 --seed "$i" --steps 2 \
            --timeout-ms 10000 --quiet --out "$D/$1.$i.safetensors" 2>>"$D/$1.err" || rc=1
        t1=$(ms)
        timeout 15 "$R" status --json --broker "$CE" >"$D/$1.st" 2>>"$D/$1.err" || rc=1
        t2=$(ms)
        echo $((t1 - t0)) >>"$D/$1.gen"; echo $((t2 - t1)) >>"$D/$1.status"
    done
    echo "$(sort -n "$D/$1.gen" | sed -n 3p) $(sort -n "$D/$1.status" | sed -n 3p)"
    return $rc
}

quiet=$(probe quiet) && ok "unloaded: 5 gens and 5 statuses answered (median $quiet ms)" ||
    { bad "unloaded probe"; show "$D/quiet.err"; }

# the flood: 2,000-message bursts every 100 ms from each peer, for 8 s
$FLOOD --endpoint "$CE" --for 8 >"$D/flood.c.out" 2>&1 &
F1=$!
$FLOOD --endpoint "$WE" --for 8 >"$D/flood.w.out" 2>&1 &
F2=$!
$FLOOD --endpoint "$WE" --for 8 --ready impostor >"$D/flood.k.out" 2>&1 &
F3=$!
PIDS="$PIDS $F1 $F2 $F3"
# the flood is on once the broker has counted a burst's worth of junk (not
# after a fixed 2 s: a busy machine may take longer to start three Pythons)
mal=0; i=0
while [ "${mal:-0}" -lt 2000 ] && [ $i -lt 600 ]; do
    mal=$(timeout 15 "$R" status --json --broker "$CE" 2>/dev/null | sed -n 's/.*"malformed":\([0-9]*\).*/\1/p')
    [ "${mal:-0}" -ge 2000 ] || { sleep 0.1; i=$((i + 1)); }
done
[ "${mal:-0}" -ge 2000 ] || bad "the flood reaches the broker (malformed=${mal:-})"
loaded=$(probe loaded) && ok "under the flood: 5 gens and 5 statuses answered within their timeouts (median $loaded ms)" ||
    { bad "under the flood, gen and status still answer"; show "$D/loaded.err"; }
set -- $quiet $loaded
[ $# = 4 ] && echo "  latency under the flood / unloaded: gen $(awk "BEGIN{printf \"%.2f\", $3/($1>0?$1:1)}")x," \
    "status $(awk "BEGIN{printf \"%.2f\", $4/($2>0?$2:1)}")x (medians of 5: $1 -> $3 ms, $2 -> $4 ms)"

st=$(timeout 15 "$R" status --json --broker "$CE" 2>/dev/null)
num() { echo "$st" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
mal=$(num malformed); sup=$(num replies_suppressed)
[ "${mal:-0}" -ge 2000 ] && ok "the junk is counted: malformed=$mal" || bad "malformed counted (got '${mal:-}')"
# the stranger on the worker socket is never answered, and the others at
# most 20 at once and 10 a second: nearly every bad message goes unanswered
[ "${sup:-0}" -ge $((mal / 2)) ] && ok "answers to junk suppressed: replies_suppressed=$sup of malformed=$mal" ||
    bad "replies suppressed (replies_suppressed=${sup:-} malformed=${mal:-})"
echo "$st" | grep -q '"name":"impostor"' && ok "the junk-sending worker stays registered" ||
    bad "impostor registered"

# SIGTERM while the flood goes on
t0=$(ms)
kill -TERM "$BROKER"
i=0
while kill -0 "$BROKER" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.05; i=$((i + 1)); done
t1=$(ms)
if kill -0 "$BROKER" 2>/dev/null; then
    bad "SIGTERM under the flood: still running after $((t1 - t0)) ms"
else
    [ $((t1 - t0)) -le 2000 ] && ok "SIGTERM under the flood: the broker exited in $((t1 - t0)) ms" ||
        bad "SIGTERM took $((t1 - t0)) ms"
fi
for f in $F1 $F2 $F3; do reap "$f" 120; done
grep -h "^flood:" "$D"/flood.*.out | sed 's/^/  /'
finish
