#!/bin/sh
# cli_worker_leaves.sh -- what the catalog keeps of a worker that leaves
# cleanly, with a real reel-broker and reel-worker over ipc:
#   1. its graphs leave the cache at SIGTERM as shutdown evictions, and
#      their rows reach the catalog before it says goodbye: captures -
#      evictions of the worker is 0, each eviction names the stream that
#      captured its graph, and its last log line counts them;
#   2. its catalog row's last_seen is when it left (its last message), not
#      its READY;
#   3. an entry that only warmed up (a workspace, no graph) is evicted too,
#      but as no graph: no catalog row, counted apart in the log line.
# Usage: cli_worker_leaves.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-leaves.XXXXXX)
SUITE=worker_leaves
. "$(dirname "$0")/lib_cli.sh"
sql() { /usr/bin/sqlite3 "$1" "$2" 2>/dev/null; }

"$R" weights init --config tiny --seed 1 --out "$D/w.safetensors" 2>/dev/null
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors" >/dev/null
cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" --heartbeat-ms 200 ||
    { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "ipc://$D/w" --weights "$D/w.safetensors" --heartbeat-ms 200 \
    --events-ms 50 || { bad "worker registers"; finish; }
for s in 2x8x8 2x8x16; do
    "$R" gen --broker "ipc://$D/c" --model tiny --context "$D/ctx.safetensors" --size "$s" --seed 1 --steps 6 \
        --timeout-ms 30000 --quiet --out "$D/g.safetensors" 2>>"$D/gen.err" || bad "gen $s"
done
# a group of 2 splits over the two streams: each captures its own graph of that key
"$R" gen --broker "ipc://$D/c" --model tiny --context "$D/ctx.safetensors" --size 2x16x16 --seed 1 --steps 6 --n 2 \
    --timeout-ms 30000 --quiet --out "$D/g.safetensors" 2>>"$D/gen.err" || bad "gen a group of 2"
# the captures are in the catalog before the worker stops
wait_sql "$D/reel.db" "SELECT count(*) FROM captures WHERE worker = 'w1' AND placeholder = 0" 4 30 &&
    [ "$(sql "$D/reel.db" "SELECT count(DISTINCT stream) FROM captures WHERE worker = 'w1' AND placeholder = 0")" = 2 ] &&
    ok "three shapes captured, the group's on both streams: $(sql "$D/reel.db" "SELECT count(*) FROM captures WHERE worker = 'w1' AND placeholder = 0") graphs" ||
    bad "captures in the catalog: $(sql "$D/reel.db" "SELECT group_concat(key_hash || ':' || stream) FROM captures WHERE worker = 'w1'")"
# a key that only warmed up (2 steps, --warmup 2): an entry with a workspace and no graph
"$R" gen --broker "ipc://$D/c" --model tiny --context "$D/ctx.safetensors" --size 2x8x24 --seed 1 --steps 2 \
    --timeout-ms 30000 --quiet --out "$D/g.safetensors" 2>>"$D/gen.err" || bad "gen a warm-up-only key"
stop_proc "$WORKER" && ok "the worker stops on SIGTERM (exit 0)" || bad "the worker stops on SIGTERM"
caps=$(sql "$D/reel.db" "SELECT count(*) FROM captures WHERE worker = 'w1' AND placeholder = 0")
wait_sql "$D/reel.db" "SELECT count(*) FROM evictions WHERE worker = 'w1'" "$caps" 30 &&
    ok "captures - evictions of a worker that left cleanly: $caps - $caps = 0" ||
    bad "captures $caps, evictions $(sql "$D/reel.db" "SELECT count(*) FROM evictions WHERE worker = 'w1'") \
($(sql "$D/reel.db" "SELECT group_concat(reason) FROM evictions WHERE worker = 'w1'"))"
# each eviction names the stream whose graph it dropped: the stream that captured that key
[ "$(sql "$D/reel.db" "SELECT count(*) FROM (SELECT key_hash, stream FROM captures WHERE worker = 'w1' AND placeholder = 0
    EXCEPT SELECT key_hash, stream FROM evictions WHERE worker = 'w1')")" = 0 ] &&
    [ "$(sql "$D/reel.db" "SELECT count(*) FROM (SELECT key_hash, stream FROM evictions WHERE worker = 'w1'
    EXCEPT SELECT key_hash, stream FROM captures WHERE worker = 'w1' AND placeholder = 0)")" = 0 ] &&
    ok "each eviction row names the stream that captured its graph ($(sql "$D/reel.db" "SELECT group_concat(stream) FROM evictions WHERE worker = 'w1'"))" ||
    bad "evictions' streams $(sql "$D/reel.db" "SELECT group_concat(key_hash || ':' || coalesce(stream, 'null')) FROM evictions WHERE worker = 'w1'"), captures' $(sql "$D/reel.db" "SELECT group_concat(key_hash || ':' || stream) FROM captures WHERE worker = 'w1'")"
[ "$(sql "$D/reel.db" "SELECT count(*) FROM evictions WHERE worker = 'w1' AND reason = 'shutdown'")" -ge 1 ] &&
    ok "its graphs left as shutdown evictions" || bad "no shutdown eviction rows"
grep -qE "stopping; capture cache: .* $caps evictions \($caps at shutdown\); 1 entries holding no graph evicted" "$D/w1.log" &&
    ok "its last log line counts them: $(grep -oE '[0-9]+ evictions \([0-9]+ at shutdown\)' "$D/w1.log")" ||
    { bad "the worker's totals line"; grep "stopping; capture cache" "$D/w1.log" | show; }
wait_sql "$D/reel.db" "SELECT count(*) FROM workers WHERE name = 'w1' AND gone_reason = 'disconnect'" 1 30 &&
    [ "$(sql "$D/reel.db" "SELECT last_seen > first_seen FROM workers WHERE name = 'w1'")" = 1 ] &&
    ok "last_seen is its leaving, $(sql "$D/reel.db" "SELECT printf('%.2f', last_seen - first_seen) FROM workers WHERE name = 'w1'") s after READY" ||
    bad "workers row: $(sql "$D/reel.db" "SELECT first_seen, last_seen, gone_at, gone_reason FROM workers WHERE name = 'w1'")"
# its events came before its goodbye: the counts are final now, and the
# warm-up-only entry it evicted at shutdown held no graph, so no row
[ "$(sql "$D/reel.db" "SELECT count(*) FROM evictions WHERE worker = 'w1'")" = "$caps" ] &&
    ok "exactly $caps eviction rows: the entry that only warmed up is no graph evicted" ||
    bad "evictions $(sql "$D/reel.db" "SELECT count(*) FROM evictions WHERE worker = 'w1'") for $caps captures"
stop_proc "$BROKER" || bad "the broker stops on SIGTERM"
finish
