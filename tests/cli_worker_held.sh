#!/bin/sh
# cli_worker_held.sh -- what a reel-worker holds for a broker that ignores
# its max_inflight, and what a flood of refusals writes to its log. A real
# reel-worker on the CPU backend (tiny config) behind a raw fake broker
# (tests/held_peer.py) over ipc, with --max-held-mb 8 and a --max-inflight
# whose 4 x count bound would hold 4 x that:
#   0. 2,000 ERRORs from the broker write at most 20 "broker says" lines a
#      10 s window, the rest counted and said once the window is over,
#      while the refused REQUESTs among them still write theirs (a budget
#      of their own); the worker still runs a REQUEST afterwards;
#   1. 128 REQUESTs of 1,024,000 bytes each, sent one at a time: those
#      that fit the byte bound are held, each later one is answered busy
#      naming --max-held-mb before its tensors are copied, and the worker's
#      peak resident memory stays within the bound (+ 64 MiB); the held
#      ones end when cancelled, after which the bound's worth is taken
#      again and runs to its RESULTs (the bytes were released);
#   2. 2,000 refused REQUESTs write at most 20 refusal lines a 10 s window,
#      the rest counted and said once the window is over; the worker keeps
#      serving and stops cleanly;
#   3. 2,000 REQUESTs cancelled at once or past a deadline of 1 ms write at
#      most 20 "request N failed" lines a window ("request ends: N more
#      ..." once it is over; before: 2,000 lines), and the worker still
#      runs a REQUEST;
#   4. 300 groups of 2 that --max-tokens 16 (one sample's tokens) splits
#      into batches of 1, each run to its RESULT: at most 20 "a group of 2
#      runs in batches of 1" lines a window ("request notes: ...");
#   5. 300 SYNCs of a path that is not there, each acked not ok: at most
#      20 "sync to vN refused" lines a window ("sync refusals: ..."), and
#      the worker still runs a REQUEST.
# Usage: cli_worker_held.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
PY=/usr/bin/python3
D=$(mktemp -d /tmp/reel-held.XXXXXX)
SUITE=worker_held
. "$(dirname "$0")/lib_cli.sh"
T=$(dirname "$0")

"$R" weights init --config tiny --seed 1 --out "$D/w.safetensors" 2>/dev/null || { bad "tiny weights"; finish; }
"$B/reel-worker" --name wheld --broker "ipc://$D/fb" --weights "$D/w.safetensors" --heartbeat-ms 200 \
    --streams 1 --max-inflight 64 --max-held-mb 8 --max-tokens 16 --prewarm 0 >"$D/wheld.log" 2>&1 &
WHELD=$!
PIDS="$PIDS $WHELD"
wait_for "$D/wheld.log" "holds at most 256 requests \(4 x --max-inflight 64\) and 8 MiB of their tensors" 60 "$WHELD" &&
    ok "the worker says what it holds at most: 4 x --max-inflight requests and --max-held-mb of their tensors" ||
    bad "the worker logs its bounds"
timeout -k 5 330 $PY "$T/held_peer.py" --bind "ipc://$D/fb" --log "$D/wheld.log" --pid "$WHELD" --bound-mb 8 \
    --for 300 >"$D/held.out" 2>&1
py_checks "$D/held.out" $?
gone "$WHELD" && { bad "the worker is still running"; show "$D/wheld.log"; } || ok "the worker is still running"
stop_proc "$WHELD" && ok "the worker stops cleanly (exit 0)" || { bad "the worker stops cleanly"; show "$D/wheld.log"; }
finish
