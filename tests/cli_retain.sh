#!/bin/sh
# cli_retain.sh -- a catalog that stays fast (issue 13, part 5), with a real
# reel-broker and reel-worker over ipc:
#   - traffic (gens, a sync) is summarised as it is written: the summary
#     tables hold what the raw rows hold;
#   - the raw rows are then made three days old (sqlite3), and a broker
#     started with --catalog-retain 1 prunes them all, off the routing path,
#     logs how many and counts them in reel_broker_catalog_pruned_total;
#     versions, workers and the SYNC audit trail stay; `reelctl stats`,
#     `keys` and `metrics` print the same totals as before; the HTML
#     report reads the summaries; new traffic is kept and counted on top;
#   - --catalog-max-rows 1 keeps the newest request only;
#   - bad values of both flags are refused at startup (exit 2).
# Usage: cli_retain.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-retain.XXXXXX)
SUITE=retain
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"

sql() { /usr/bin/sqlite3 "$D/reel.db" "$1" 2>&1; }
stop() { stop_proc "$1" || bad "process $1 stops on SIGTERM"; }
gens() { # FROM TO: gens with seeds FROM..TO-1
    i=$1
    while [ "$i" -lt "$2" ]; do
        "$R" gen --broker "ipc://$D/c" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --seed $((i % 3)) \
            --steps 4 --timeout-ms 30000 --quiet --out "$D/g$i.safetensors" 2>>"$D/gen.err" || bad "gen $i"
        i=$((i + 1))
    done
}
# the totals a report shows, one line: requests captures replays evictions steps replayed hit_rate
totals() {
    "$R" stats --catalog "$D/reel.db" --json | $PY -c '
import json, sys
o = json.load(sys.stdin)["overall"]
print(o["requests"], o["captures"], o["replays"], o["evictions"], o["steps"], o["replayed_steps"], o["hit_rate"])'
}

"$R" weights init --config tiny --seed 1 --out "$D/v1.safetensors" 2>/dev/null
"$R" weights init --config tiny --seed 2 --out "$D/v2.safetensors" 2>/dev/null
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors" >/dev/null

# ---- traffic, summarised as it is written ---------------------------------------
cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" \
    --heartbeat-ms 200 || { bad "broker starts"; show "$D/broker.log"; finish; }
BPID=$BROKER
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "ipc://$D/w" --weights "$D/v1.safetensors" --heartbeat-ms 200 ||
    { bad "w1 registers"; show "$D/w1.log"; finish; }
WPID=$WORKER
gens 0 5
"$R" sync --broker "ipc://$D/c" --version 2 --weights "$D/v2.safetensors" --timeout-ms 30000 2>"$D/sync.err" ||
    { bad "sync v2"; show "$D/sync.err"; }
gens 5 8
stop "$WPID"
stop "$BPID"

REQ=$(sql "SELECT count(*) FROM requests")
[ "$REQ" = 8 ] && ok "8 requests recorded" || bad "requests recorded: $REQ"
[ "$(sql "SELECT sum(requests) FROM key_totals")" = "$REQ" ] && ok "key_totals count every request" ||
    bad "key_totals: $(sql "SELECT sum(requests) FROM key_totals") requests"
[ "$(sql "SELECT sum(requests) FROM rollups")" = "$REQ" ] && [ "$(sql "SELECT sum(requests) FROM timeline")" = "$REQ" ] &&
    ok "rollups and the timeline count every request" || bad "rollups/timeline: $(sql "SELECT sum(requests) FROM rollups")"
CAPS=$(sql "SELECT count(*) FROM captures WHERE placeholder = 0")
[ "$CAPS" -ge 1 ] && [ "$(sql "SELECT sum(captures) FROM key_totals")" = "$CAPS" ] &&
    ok "captures summarised ($CAPS)" || bad "captures: raw $CAPS, summary $(sql "SELECT sum(captures) FROM key_totals")"
[ "$(sql "SELECT count(DISTINCT version) FROM rollups WHERE requests > 0")" = 2 ] &&
    ok "rollups split the requests by weight version (1 and 2)" || bad "versions in rollups: $(sql "SELECT group_concat(DISTINCT version) FROM rollups")"
BEFORE=$(totals)
KEYS_BEFORE=$("$R" keys --catalog "$D/reel.db" --json)
AUDIT=$(sql "SELECT count(*) FROM audit")
VERS=$(sql "SELECT count(*) FROM weight_versions")

# ---- three days later: --catalog-retain 1 prunes every raw row ------------------
DAY3=259200
sql "UPDATE requests SET t = t - $DAY3; UPDATE captures SET t = t - $DAY3, last_replay = last_replay - $DAY3;
     UPDATE evictions SET t = t - $DAY3;" >/dev/null
RAW=$(sql "SELECT (SELECT count(*) FROM requests) + (SELECT count(*) FROM captures) + (SELECT count(*) FROM evictions)")
cli_broker "$D/broker2.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" \
    --heartbeat-ms 200 --catalog-retain 1 --metrics 127.0.0.1:0 || { bad "broker restarts"; show "$D/broker2.log"; finish; }
BPID=$BROKER
grep -q "catalog retention: raw rows older than 1 days are pruned" "$D/broker2.log" &&
    ok "the broker says what it prunes" || { bad "retention line"; show "$D/broker2.log"; }
wait_for "$D/broker2.log" "pruned $RAW raw rows" 60 && ok "the broker pruned all $RAW raw rows and logged it" ||
    { bad "pruned log"; show "$D/broker2.log"; }
[ "$(sql "SELECT (SELECT count(*) FROM requests) + (SELECT count(*) FROM captures) + (SELECT count(*) FROM evictions)")" = 0 ] &&
    ok "no raw request, capture or eviction is left" || bad "raw rows left: $(sql "SELECT count(*) FROM requests")"
[ "$(sql "SELECT count(*) FROM audit")" = "$AUDIT" ] && [ "$(sql "SELECT count(*) FROM weight_versions")" = "$VERS" ] &&
    [ "$(sql "SELECT count(*) FROM workers")" -ge 1 ] &&
    ok "the audit trail ($AUDIT), versions ($VERS) and workers are kept" || bad "audit/versions changed"
AFTER=$(totals)
[ "$AFTER" = "$BEFORE" ] && ok "reelctl stats prints the same totals ($AFTER)" || bad "stats: before '$BEFORE', after '$AFTER'"
[ "$("$R" keys --catalog "$D/reel.db" --json)" = "$KEYS_BEFORE" ] && ok "reelctl keys prints the same keys" ||
    bad "keys changed by pruning"
"$R" metrics --catalog "$D/reel.db" | grep -q "^reel_requests_total{worker=\"w1\"} $REQ\$" &&
    ok "reelctl metrics still counts $REQ requests of w1" || bad "metrics: $("$R" metrics --catalog "$D/reel.db" | grep reel_requests_total)"
"$R" report --html "$D/r.html" --catalog "$D/reel.db" 2>/dev/null && grep -q "<svg" "$D/r.html" &&
    grep -q "From the catalog's summaries" "$D/r.html" && grep -q ">$REQ requests" "$D/r.html" &&
    ok "the HTML report draws the $REQ requests from the summaries" || bad "report --html after pruning"
BP=$(sed -n 's/.*metrics and health on http:\/\/[^ ]* (port \([0-9]*\)).*/\1/p' "$D/broker2.log" | head -1)
i=0
while :; do # the loop publishes its metrics about once a heartbeat
    PR=$($PY -c "
import urllib.request
for l in urllib.request.urlopen('http://127.0.0.1:$BP/metrics', timeout=5).read().decode().splitlines():
    if l.startswith('reel_broker_catalog_pruned_total '): print(int(float(l.split()[1])))" 2>&1)
    [ "$PR" = "$RAW" ] || [ $i -ge 50 ] && break
    sleep 0.1; i=$((i + 1))
done
[ "$PR" = "$RAW" ] && ok "reel_broker_catalog_pruned_total = $RAW" || bad "pruned_total: '$PR', want $RAW"

# new traffic is kept, and counted on top
cli_worker w1 "$D/broker2.log" "$D/w1b.log" --broker "ipc://$D/w" --weights "$D/v2.safetensors" --weights-version 2 \
    --heartbeat-ms 200 || { bad "w1 rejoins"; show "$D/w1b.log"; finish; }
WPID=$WORKER
gens 10 12
i=0; while [ "$(sql "SELECT count(*) FROM requests")" != 2 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(sql "SELECT count(*) FROM requests")" = 2 ] && ok "new requests are kept" || bad "new rows: $(sql "SELECT count(*) FROM requests")"
[ "$(totals | cut -d' ' -f1)" = $((REQ + 2)) ] && ok "stats count them on top ($((REQ + 2)))" || bad "stats after: $(totals)"
stop "$WPID"
stop "$BPID"

# ---- a row cap ---------------------------------------------------------------
NEWEST=$(sql "SELECT max(rowid) FROM requests")
cli_broker "$D/broker3.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" \
    --heartbeat-ms 200 --catalog-max-rows 1 || { bad "broker with a row cap"; show "$D/broker3.log"; finish; }
BPID=$BROKER
wait_for "$D/broker3.log" "pruned [0-9]+ raw rows" 60
[ "$(sql "SELECT count(*) FROM requests")" = 1 ] && [ "$(sql "SELECT rowid FROM requests")" = "$NEWEST" ] &&
    ok "--catalog-max-rows 1 keeps the newest request" || bad "row cap: $(sql "SELECT count(*) FROM requests") rows"
[ "$(totals | cut -d' ' -f1)" = $((REQ + 2)) ] && ok "and the totals stay" || bad "totals after the cap: $(totals)"
stop "$BPID"

# ---- bad values --------------------------------------------------------------
for a in "--catalog-retain 0" "--catalog-retain -1" "--catalog-retain abc" "--catalog-retain nan" \
         "--catalog-max-rows x" "--catalog-max-rows -5" "--catalog-queue 15" "--catalog-queue 10000001"; do
    # shellcheck disable=SC2086
    "$B/reel-broker" --clients "ipc://$D/c9" --workers "ipc://$D/w9" --catalog "$D/x.db" $a >"$D/bad.out" 2>&1
    rc=$?
    [ "$rc" = 2 ] && grep -q "bad value" "$D/bad.out" && ok "$a refused (exit 2)" || { bad "$a: exit $rc"; show "$D/bad.out"; }
done
finish
