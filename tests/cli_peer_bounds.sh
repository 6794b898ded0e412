#!/bin/sh
# cli_peer_bounds.sh -- what one peer's messages make the broker write
# stays bounded, whatever their number. A real reel-broker over ipc;
# tests/bounds_peer.py plays the peers:
#   1. a trainer resends one SYNC 500 times while its barrier waits on a
#      (fake) worker that has not acked, and 500 times more once it is
#      current: the catalog's audit trail gets the SYNC's row, one
#      "resend" row per phase and one row per phase saying how many more
#      came ("resend: 500 more while ..."), not a row per resend.
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
timeout -k 5 220 $PY "$T/bounds_peer.py" resend --clients "ipc://$D/c" --workers "ipc://$D/w" \
    --weights "$D/w2.safetensors" --weights3 "$D/w3.safetensors" --n $N >"$D/resend.out" 2>&1
py_checks "$D/resend.out" $?
# The last row v2 gets is written when v3 replaces it as current (after
# v3's own "accepted" row): wait for it, then count them all.
if wait_sql "$DB" "select count(*) from audit where version = 2 and outcome like 'resend: % more while it was current'" 1 60 &&
    wait_sql "$DB" "select count(*) from audit where version = 3 and outcome = 'accepted'" 1 60; then
    rows=$(/usr/bin/sqlite3 "$DB" "select outcome from audit where version = 2 order by id" | tr '\n' '|')
    want="accepted|resend|resend: $((N - 1)) more while its barrier ran|resend|resend: $((N - 1)) more while it was current|"
    [ "$rows" = "$want" ] &&
        ok "$((2 * N + 1)) SYNCs of v2 (the first, $N resends pending, $N current): 5 audit rows that count them" ||
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

finish
