#!/bin/sh
# cli_adversarial_peers.sh -- the daemons' internal sides under a hostile
# peer (tests/adversarial_peers.py), with a real reel-broker and
# reel-worker over ipc:
#   1. the broker's worker socket: a fake worker beside a real one sends
#      junk, unknown types, RESULTs for requests it was never sent, for
#      another worker's, twice, of the wrong shape, dtype, count or values,
#      or stats of more steps than the request runs,
#      PROGRESS past its end, acks of versions never sent, READYs with
#      impossible loads or a live worker's name or another model mid-life,
#      FETCHes past the end of an upload, and HEARTBEATs announcing large
#      messages that never come; the broker refuses each (the client gets
#      ERROR internal, never a garbage RESULT), logs it, and its real worker
#      answers a real GEN bitwise as before;
#   2. the worker's broker socket: a fake broker sends malformed REQUESTs,
#      more REQUESTs than 4 x the worker's --max-inflight (those past it
#      are answered busy), SYNCs of missing, foreign, mismatched or
#      outside files, more SYNCs than may wait (past 16, or twice the
#      model inline: acked busy), CANCELs of
#      unknown ids, duplicate ids and unknown types; each is answered as
#      docs/PROTOCOL.md says, and a valid REQUEST gives the bitwise result
#      it gave first.
# Usage: cli_adversarial_peers.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
PY=/usr/bin/python3
D=$(mktemp -d /tmp/reel-adv.XXXXXX)
SUITE=adversarial_peers
. "$(dirname "$0")/lib_cli.sh"
T=$(dirname "$0")

"$R" weights init --config tiny --seed 1 --out "$D/w.safetensors" 2>/dev/null &&
    "$R" weights init --config tiny --seed 2 --out "$D/w2.safetensors" 2>/dev/null ||
    { bad "tiny weights"; finish; }

# ---- 1. a fake worker against the broker ----
mkdir -p "$D/up"
cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "" --heartbeat-ms 200 \
    --weights-dir "$D/up" || { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "ipc://$D/w" --weights "$D/w.safetensors" --heartbeat-ms 200 \
    --streams 1 || { bad "worker registers"; finish; }
timeout -k 5 150 $PY "$T/adversarial_peers.py" broker --clients "ipc://$D/c" --workers "ipc://$D/w" \
    --log "$D/broker.log" --for 120 >"$D/broker.out" 2>&1
py_checks "$D/broker.out" $?
gone "$BROKER" && bad "the broker is still running after the battery" ||
    ok "the broker is still running after the battery"
stop_proc "$WORKER" || bad "the real worker stops on SIGTERM"
stop_proc "$BROKER" && ok "the broker stops cleanly (exit 0)" || { bad "the broker stops cleanly"; show "$D/broker.log"; }

# ---- 2. a fake broker against the worker ----
mkdir -p "$D/wd"
cp "$D/w.safetensors" "$D/w2.safetensors" "$D/wd/"
ln -s "$D/wd/w2.safetensors" "$D/wd/link.safetensors"
head -c 4096 /dev/urandom >"$D/wd/junk.safetensors"
echo '{"name":"alien","dim":32,"heads":2,"layers":1,"ffn_dim":64,"in_channels":4,"text_dim":32,"freq_dim":256}' >"$D/alien.json"
"$R" weights init --config "$D/alien.json" --seed 3 --out "$D/wd/alien.safetensors" 2>/dev/null ||
    { bad "another model's weights"; finish; }
"$B/reel-worker" --name wadv --broker "ipc://$D/fb" --weights "$D/wd/w.safetensors" --heartbeat-ms 200 \
    --streams 1 --max-inflight 1 >"$D/wadv.log" 2>&1 &
WADV=$!
PIDS="$PIDS $WADV"
timeout -k 5 150 $PY "$T/adversarial_peers.py" worker --bind "ipc://$D/fb" --log "$D/wadv.log" --dir "$D/wd" \
    --for 120 >"$D/worker.out" 2>&1
py_checks "$D/worker.out" $?
gone "$WADV" && { bad "the worker is still running after the battery"; show "$D/wadv.log"; } ||
    ok "the worker is still running after the battery"
stop_proc "$WADV" && ok "the worker stops cleanly (exit 0)" || { bad "the worker stops cleanly"; show "$D/wadv.log"; }
finish
