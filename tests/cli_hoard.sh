#!/bin/sh
# cli_hoard.sh -- peers that make the daemons hold memory for them and
# never let it go: each bound holds, past it the peer is answered busy,
# and the daemons go on serving the others. A real reel-broker and
# reel-worker over ipc (tests/hoard_peer.py plays the peers):
#   1. FETCH answers nobody reads (--max-fetch-mb): 8 worker-socket
#      connections ask 16 FETCHes of 4 MiB each and read nothing (512 MiB
#      of answers without the bound); the broker holds at most the bound,
#      answers the rest busy naming it, and a real worker's fetch begun
#      meanwhile completes once they go;
#   2. resends of a SYNC whose barrier waits for its upload: a trainer
#      sends it again 1,000 times under new ids; 63 join the barrier, the
#      rest are answered busy, and at its end the SYNC and those 63 get
#      one SYNC_DONE each;
#   3. FETCH answers nobody reads on the client socket of a standby
#      pair's broker (where its peer copies uploads; without keys anyone
#      may FETCH there): the same 8 connections, the same bound, counted
#      with the worker socket's (before, nothing bounded them there: all
#      128 answers were read and held).
# Usage: cli_hoard.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
PY=/usr/bin/python3
D=$(mktemp -d /tmp/reel-hoard.XXXXXX)
SUITE=hoard
. "$(dirname "$0")/lib_cli.sh"
T=$(dirname "$0")

"$R" weights init --config tiny --seed 1 --out "$D/w.safetensors" 2>/dev/null &&
    "$R" weights init --config tiny --seed 2 --out "$D/w2.safetensors" 2>/dev/null ||
    { bad "tiny weights"; finish; }

# ---- 1. FETCH answers nobody reads ----
mkdir -p "$D/up"
cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "" --heartbeat-ms 200 \
    --weights-dir "$D/up" --max-fetch-mb 32 || { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "ipc://$D/w" --weights "$D/w.safetensors" --heartbeat-ms 200 \
    --streams 1 || { bad "worker registers"; finish; }
timeout -k 5 220 $PY "$T/hoard_peer.py" fetch --clients "ipc://$D/c" --workers "ipc://$D/w" --pid "$BROKER" \
    --bound-mb 32 --sync "$R" sync --broker "ipc://$D/c" --version 2 --upload "$D/w2.safetensors" \
    --timeout-ms 100000 >"$D/fetch.out" 2>&1
py_checks "$D/fetch.out" $?
grep -q "applied transformer v2" "$D/w1.log" && ok "the real worker applied the version it fetched" ||
    { bad "the real worker applied v2"; show "$D/w1.log"; }

# ---- 2. resends of a SYNC waiting for its upload ----
"$R" weights init --config tiny --seed 3 --out "$D/w3.safetensors" 2>/dev/null || bad "tiny weights v3"
timeout -k 5 220 $PY "$T/hoard_peer.py" resend --clients "ipc://$D/c" --weights "$D/w3.safetensors" --version 3 \
    >"$D/resend.out" 2>&1
py_checks "$D/resend.out" $?
grep -q "applied transformer v3" "$D/w1.log" && ok "the real worker applied v3" ||
    { bad "the real worker applied v3"; show "$D/w1.log"; }

gone "$BROKER" && { bad "the broker is still running"; show "$D/broker.log"; } || ok "the broker is still running"
stop_proc "$WORKER" || bad "the worker stops on SIGTERM"
stop_proc "$BROKER" && ok "the broker stops cleanly (exit 0)" || { bad "the broker stops cleanly"; show "$D/broker.log"; }

# ---- 3. FETCH answers nobody reads, on a pair's client socket ----
# One of a pair whose peer never answers: standby once the peer timeout
# passes, active at the trainer's first UPLOAD that comes back (on
# another connection: hoard_peer.py); then it serves FETCH on its client
# socket.
mkdir -p "$D/up2"
cli_broker "$D/pair.log" --clients "ipc://$D/pc" --workers "ipc://$D/pw" --catalog "" --heartbeat-ms 200 \
    --weights-dir "$D/up2" --max-fetch-mb 32 --peer "ipc://$D/nobody" --role primary --peer-timeout-ms 500 ||
    { bad "the pair's broker starts"; finish; }
wait_for "$D/pair.log" "peer not heard in" 30 || bad "the pair's broker gives up waiting for its peer"
timeout -k 5 220 $PY "$T/hoard_peer.py" fetch --clients "ipc://$D/pc" --workers "ipc://$D/pw" --pid "$BROKER" \
    --bound-mb 32 --fetch-on "ipc://$D/pc" >"$D/pairfetch.out" 2>&1
py_checks "$D/pairfetch.out" $?
gone "$BROKER" && { bad "the pair's broker is still running"; show "$D/pair.log"; } ||
    ok "the pair's broker is still running"
stop_proc "$BROKER" && ok "the pair's broker stops cleanly (exit 0)" || { bad "the pair's broker stops cleanly"; show "$D/pair.log"; }
finish
