#!/bin/sh
# cli_protocol_cleanroom.sh -- a second client written from docs/PROTOCOL.md
# alone (tests/protocol_cleanroom.py: pyzmq and msgpack, nothing of Reel's
# client code or of tests/spec_client.py), as a user or an outside test team
# would write one, run against a real reel-broker and two CPU reel-workers
# of the tiny model over ipc: STATUS and every field it lists, GENs (seeded
# and with a latent, CFG, SDE rollouts, a group, a solver, several in
# flight), PROGRESS, RESULT, CANCEL, the documented refusals with their
# codes and ids, a trainer's SYNC by path and by value (UPLOAD) against
# both workers. A FAIL is a place where the code and the document disagree.
# Skips (one SKIP line) only when /usr/bin/python3 cannot import zmq and
# msgpack. Every wait is bounded; every process is killed and the temp dir
# removed on exit.
# Usage: cli_protocol_cleanroom.sh BUILD   (REEL_KEEP=1 keeps the temp dir)
set -u
B="${1:-build}"
R="$B/reelctl"
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
SUITE=protocol_cleanroom
if ! err=$($PY -c 'import zmq, msgpack' 2>&1); then
    echo "SKIP $SUITE: $PY cannot import zmq and msgpack ($(echo "$err" | tail -1)); nothing was run"
    echo "$SUITE: 0 passed, 0 failed (skipped)"
    exit 0
fi
D=$(mktemp -d /tmp/reel-cleanroom.XXXXXX)
. "$(dirname "$0")/lib_cli.sh"

# v1 the workers start on (under their weights directory wd), v2 published
# by path, v3 uploaded by value (out/ is outside every weights directory),
# v4 by a path only worker wb may read (wbonly/: its second --weights-dir)
mkdir -p "$D/wd" "$D/wbonly" "$D/up" "$D/out"
for s in 1 2; do
    "$R" weights init --config tiny --seed $((6 + s)) --out "$D/wd/w$s.safetensors" >/dev/null 2>&1 || { bad "weights init"; finish; }
done
"$R" weights init --config tiny --seed 9 --out "$D/out/w3.safetensors" >/dev/null 2>&1 &&
    "$R" weights init --config tiny --seed 10 --out "$D/wbonly/w4.safetensors" >/dev/null 2>&1 || { bad "weights init"; finish; }

# --max-held-mb 1: a GEN of more than 1 MiB of tensors is too_large; each
# worker has one slot, so a second GEN of a key waits in the queue
cli_broker "$D/broker.log" --clients "ipc://$D/clients" --workers "ipc://$D/workers" --catalog "$D/reel.db" \
    --heartbeat-ms 200 --max-held-mb 1 --queue-max 8 --weights-dir "$D/up" || { bad "broker start"; show "$D/broker.log"; finish; }
W=""
for n in wa wb; do
    extra=""
    [ $n = wb ] && extra="--weights-dir $D/wd --weights-dir $D/wbonly"
    # shellcheck disable=SC2086 # extra: words without spaces
    cli_worker $n "$D/broker.log" "$D/$n.log" --broker "ipc://$D/workers" --weights "$D/wd/w1.safetensors" \
        --streams 1 --max-inflight 1 --heartbeat-ms 200 --prewarm 0 $extra || { bad "worker $n start"; show "$D/$n.log"; finish; }
    W="$W $WORKER"
done

timeout -k 5 50 $PY "$HERE/protocol_cleanroom.py" --clients "ipc://$D/clients" --worker-ep "ipc://$D/workers" --workers wa,wb \
    --v2 "$D/wd/w2.safetensors" --v3 "$D/out/w3.safetensors" \
    --v4 "$D/wbonly/w4.safetensors" --for 45 >"$D/out.txt" 2>&1
py_checks "$D/out.txt" $?
gone "$BROKER" && bad "the broker ended during the checks" && show "$D/broker.log"
for p in $W; do gone "$p" && bad "worker $p ended during the checks"; done
finish
