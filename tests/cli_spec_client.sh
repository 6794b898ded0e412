#!/bin/sh
# cli_spec_client.sh -- a real reel-broker and reel-worker (CPU, the tiny
# model) driven by tests/spec_client.py, a client written from
# docs/PROTOCOL.md alone in raw ZeroMQ and MessagePack: every client-facing
# message and field the document describes, and each documented refusal
# with its code and id. A check that fails is a place where the code and
# the document disagree; a worker of its own on the worker endpoint shows
# what the broker makes of a worker's answers (codes, RESULTs, PROGRESS).
# Skips (one SKIP line) only when this python3 has
# no zmq or msgpack module. Every wait is bounded; every process is killed
# and the temp dir removed on exit.
# Usage: cli_spec_client.sh BUILD   (REEL_KEEP=1 keeps the temp dir)
set -u
B="${1:-build}"
R="$B/reelctl"
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
SUITE=spec_client
if ! err=$($PY -c 'import zmq, msgpack' 2>&1); then
    echo "SKIP spec_client: $PY cannot import zmq and msgpack ($(echo "$err" | tail -1)); nothing was run"
    echo "$SUITE: 0 passed, 0 failed (skipped)"
    exit 0
fi
D=$(mktemp -d /tmp/reel-spec.XXXXXX)
. "$(dirname "$0")/lib_cli.sh"

mkdir -p "$D/wd" "$D/up"
# v1 the workers start on, v2 published by path (under the worker's
# weights directory), v3 uploaded by value
"$R" weights init --config tiny --seed 7 --out "$D/wd/w1.safetensors" >/dev/null 2>&1 &&
    "$R" weights init --config tiny --seed 8 --out "$D/wd/w2.safetensors" >/dev/null 2>&1 &&
    "$R" weights init --config tiny --seed 9 --out "$D/w3.safetensors" >/dev/null 2>&1 || { bad "weights init"; finish; }

# --max-held-mb 1: a GEN of 1 MiB of tensors is too_large; --queue-max 4:
# a full queue takes 4 GENs; the worker's one slot (--max-inflight 1) lets
# a long GEN hold it so others queue; --max-tokens 256: a 64x64 latent is
# past the worker's bound
cli_broker "$D/broker.log" --clients "ipc://$D/clients" --workers "ipc://$D/workers" --catalog "$D/reel.db" \
    --heartbeat-ms 200 --max-held-mb 1 --queue-max 4 --weights-dir "$D/up" || { bad "broker start"; show "$D/broker.log"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "ipc://$D/workers" --weights "$D/wd/w1.safetensors" \
    --streams 1 --max-inflight 1 --max-tokens 256 --heartbeat-ms 200 || { bad "worker start"; show "$D/w1.log"; finish; }

timeout -k 5 150 $PY "$HERE/spec_client.py" --clients "ipc://$D/clients" --workers "ipc://$D/workers" --weights-dir "$D/wd" \
    --weights2 "$D/wd/w2.safetensors" --weights3 "$D/w3.safetensors" --for 120 >"$D/spec.out" 2>&1
rc=$?
py_checks "$D/spec.out" "$rc"
gone "$BROKER" && bad "the broker ended during the checks" && show "$D/broker.log"
gone "$WORKER" && bad "the worker ended during the checks" && show "$D/w1.log"
finish
