#!/bin/sh
# cli_peer_bounds.sh -- what one peer's messages make the broker write
# stays bounded, whatever their number. A real reel-broker over ipc;
# tests/bounds_peer.py plays the peers:
#   1. a trainer resends one SYNC 500 times while its barrier waits on a
#      (fake) worker that has not acked, and 2,000 times more once it is
#      current: the catalog's audit trail gets the SYNC's row, one
#      "resend" row per phase and one row per phase saying how many more
#      came ("resend: 499 more while ..."), not a row per resend; the
#      current version's resends, each answered SYNC_DONE, write at most
#      20 log lines a 10 s window and one "SYNC resends: N more lines like
#      the ones above" line once it is over (before: 2 lines each); then
#      the (fake) worker acks v3 2,000 times and sends READY 2,000 times
#      more, lagging or asking for a PREWARM: within its own share of the
#      log, 20 lines a window and "fw: N more ..." (before: 1 line an ack,
#      3 a READY: its loss, "ready", the catch-up SYNC or the PREWARM);
#   2. peers that never read send 2,000 each of refused messages (SYNCs
#      refused for their fields or by the sync module, junk, unknown
#      types), 3,000 STATUS whose answers pile up, and 300 strangers one RESULT
#      each on the worker socket: each kind of refusal writes its first
#      lines verbatim and then one "N more lines like the ones above"
#      line a 10 s window, and a refused SYNC is audited only while its
#      peer may be answered (before: a line, or two and an audit row, per
#      message: over 8,000 lines);
#   3. a client resends a live GEN 2,000 times from two connections (its
#      answer goes to the last one's), and sends GENs that end in a loop:
#      2,000 failing no_worker, 2,000 cancelled queued, 1,000 cancelled on
#      a (fake) worker that answers late, 500 past their deadline there;
#      a worker that never reads sends 2,000 HEARTBEATs, each making it
#      reachable again and, a GEN sent to it failing, unreachable: each
#      kind ("GEN resends", "request ends", the worker's share) writes at
#      most 20 lines a 10 s window and says the rest once it is over
#      (before: 2,000, 9,065 and 4,001 lines), and the broker still answers;
#   4. a trainer sends 300 UPLOADs whose bytes do not hash to their
#      sha256 (a broker with --weights-dir): each answered ERROR, their
#      lines ("uploads") at most 20 a 10 s window, the rest said once it
#      is over (before: 300 lines), and a good UPLOAD is stored after.
# Usage: cli_peer_bounds.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
PY=/usr/bin/python3
D=$(mktemp -d /tmp/reel-bounds.XXXXXX)
SUITE=peer_bounds
. "$(dirname "$0")/lib_cli.sh"
T=$(dirname "$0")

"$R" weights init --config tiny --seed 2 --out "$D/w2.safetensors" 2>/dev/null &&
    "$R" weights init --config tiny --seed 3 --out "$D/w3.safetensors" 2>/dev/null ||
    { bad "tiny weights"; finish; }

# ---- 1. SYNC resends and the audit trail ----
DB="$D/reel.db"
cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$DB" --heartbeat-ms 500 ||
    { bad "broker starts"; finish; }
N=500
NC=2000
timeout -k 5 220 $PY "$T/bounds_peer.py" resend --clients "ipc://$D/c" --workers "ipc://$D/w" \
    --weights "$D/w2.safetensors" --weights3 "$D/w3.safetensors" --log "$D/broker.log" --n $N --current $NC \
    --workers-n 2000 >"$D/resend.out" 2>&1
py_checks "$D/resend.out" $?
# The last row v2 gets is written when v3 replaces it as current (after
# v3's own "accepted" row): wait for it, then count them all.
if wait_sql "$DB" "select count(*) from audit where version = 2 and outcome like 'resend: % more while it was current'" 1 60 &&
    wait_sql "$DB" "select count(*) from audit where version = 3 and outcome = 'accepted'" 1 60; then
    rows=$(/usr/bin/sqlite3 "$DB" "select outcome from audit where version = 2 order by id" | tr '\n' '|')
    want="accepted|resend|resend: $((N - 1)) more while its barrier ran|resend|resend: $((NC - 1)) more while it was current|"
    [ "$rows" = "$want" ] &&
        ok "$((N + NC + 1)) SYNCs of v2 (the first, $N resends pending, $NC current): 5 audit rows that count them" ||
        bad "audit rows of v2: '$rows', wanted '$want'"
else
    bad "the resends' summary rows were not written"
    /usr/bin/sqlite3 "$DB" "select version, outcome from audit order by id" | sort | uniq -c | head -8 | sed 's/^/  | /'
fi
n_audit=$(grep -c "audit: sync" "$D/broker.log")
[ "$n_audit" -le 8 ] && ok "the broker logged $n_audit audit lines for them" ||
    bad "the broker logged $n_audit audit lines for the resends"
gone "$BROKER" && bad "the broker is still running" || ok "the broker is still running"
stop_proc "$BROKER" && ok "the broker stops cleanly (exit 0)" || { bad "the broker stops cleanly"; show "$D/broker.log"; }

# ---- 2. a flood of refused messages: the log's budget ----
cli_broker "$D/flood.log" --clients "ipc://$D/fc" --workers "ipc://$D/fw" --catalog "$DB.2" --heartbeat-ms 500 ||
    { bad "broker starts"; finish; }
lines0=$(wc -l <"$D/flood.log")
timeout -k 5 220 $PY "$T/bounds_peer.py" flood --clients "ipc://$D/fc" --workers "ipc://$D/fw" --n 2000 \
    --conns 300 --log "$D/flood.log" >"$D/flood.out" 2>&1
py_checks "$D/flood.out" $?
# every kind's window ends within 10 s of its first line: its summary
# comes with the timers then (the event waited for)
for kind in "SYNC refused" "answers not held" "RECONNECT"; do
    wait_for "$D/flood.log" "reel-broker: $kind: [0-9]+ more lines like the ones above" 40 ||
        bad "no summary of the '$kind' lines left out"
done
lines=$(($(wc -l <"$D/flood.log") - lines0))
missing=""
# (the two SYNC floods are one kind: the one the broker reads first has its
# 20 lines, the other none)
for want in "reel-broker: SYNC refused: ('version' must be|workers serve component \"transformer\" only, not \"vae\")" \
    "reel-broker: unknown worker sent RESULT: told to RECONNECT" \
    "reel-broker: client [0-9a-f]*: (STATUS_REPLY|ERROR) not held"; do
    grep -Eq "$want" "$D/flood.log" || missing="$missing [$want]"
done
[ -z "$missing" ] && ok "the first lines of each kind are written as they were" ||
    { bad "the first lines: none like$missing"; grep -E "SYNC refused|not held|RECONNECT" "$D/flood.log" | sort | uniq -c | sort -rn | head -12 | sed 's/^/  | /'; }
[ "$lines" -le 200 ] && ok "11,300 refused messages wrote $lines log lines" ||
    { bad "11,300 refused messages wrote $lines log lines"; sed 's/[0-9]\+/N/g' "$D/flood.log" | sort | uniq -c | sort -rn | head -5; }
secs=$(sed -n 's/^ *| ELAPSED //p; s/^ELAPSED //p' "$D/flood.out" | head -1)
most=$(/usr/bin/python3 -c "import math; print(2 * (20 + 10 * math.ceil(${secs:-100})) + 4)")
wait_sql "$DB.2" "select count(*) from audit" 1 30 || bad "refused SYNCs are audited"
rows=$(/usr/bin/sqlite3 "$DB.2" "select count(*) from audit")
[ "$rows" -le "$most" ] && ok "4,000 refused SYNCs in ${secs} s: $rows audit rows (at most $most: 20 and 10 a second each peer)" ||
    bad "4,000 refused SYNCs in ${secs} s: $rows audit rows (more than $most)"
gone "$BROKER" && bad "the broker is still running" || ok "the broker is still running"
stop_proc "$BROKER" && ok "the broker stops cleanly (exit 0)" || { bad "the broker stops cleanly"; show "$D/flood.log"; }

# ---- 3. a client's requests in a loop, a worker that never reads ----
cli_broker "$D/requests.log" --clients "ipc://$D/rc" --workers "ipc://$D/rw" --heartbeat-ms 500 ||
    { bad "broker starts"; finish; }
timeout -k 5 220 $PY "$T/bounds_peer.py" requests --clients "ipc://$D/rc" --workers "ipc://$D/rw" --n 2000 \
    --log "$D/requests.log" >"$D/requests.out" 2>&1
py_checks "$D/requests.out" $?
gone "$BROKER" && bad "the broker is still running" || ok "the broker is still running"
stop_proc "$BROKER" && ok "the broker stops cleanly (exit 0)" || { bad "the broker stops cleanly"; show "$D/requests.log"; }

# ---- 4. a trainer's refused UPLOADs in a loop ----
mkdir -p "$D/wd"
cli_broker "$D/uploads.log" --clients "ipc://$D/uc" --workers "ipc://$D/uw" --weights-dir "$D/wd" --heartbeat-ms 500 ||
    { bad "broker starts"; finish; }
timeout -k 5 220 $PY "$T/bounds_peer.py" uploads --clients "ipc://$D/uc" --n 300 --log "$D/uploads.log" \
    >"$D/uploads.out" 2>&1
py_checks "$D/uploads.out" $?
gone "$BROKER" && bad "the broker is still running" || ok "the broker is still running"
stop_proc "$BROKER" && ok "the broker stops cleanly (exit 0)" || { bad "the broker stops cleanly"; show "$D/uploads.log"; }

finish
