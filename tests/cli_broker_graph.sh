#!/bin/sh
# cli_broker_graph.sh -- the broker's modules form a tree (broker/brk_broker.h):
# the include graph of broker/*.c (which module headers each includes) and
# the call graph of the built objects (which module defines each symbol an
# object uses, from nm) have no cycle, and requests, workers and sync never
# include or call one another: only the loop ties them together.
# Prints every edge, then "broker_graph: N passed, N failed".
# Usage: cli_broker_graph.sh BUILD
set -u
B="${1:-build}"
cd "$(dirname "$0")/.."
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "PASS $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
T=$(mktemp -d /tmp/reel-graph.XXXXXX)
trap 'rm -rf "$T"' EXIT

mod() { basename "$1" .c | sed 's/^brk_//'; }

# include edges: module -> module whose header it includes (brk_broker.h
# holds only the shared types and is not a module)
for c in broker/*.c; do
    m=$(mod "$c")
    sed -n 's|^#include "broker/brk_\([a-z_]*\)\.h".*|\1|p' "$c" | while read -r h; do
        [ "$h" = "$m" ] || [ "$h" = broker ] || echo "$m $h"
    done
done | sort -u >"$T/inc"

# call edges: module -> module defining a symbol it uses
for o in "$B"/broker/*.o; do
    nm --defined-only "$o" 2>/dev/null | awk -v m="$(mod "$o" | sed 's/\.o$//')" '$2 ~ /[TDBR]/ {print $3, m}'
done | sort -k1,1 >"$T/defs"
for o in "$B"/broker/*.o; do
    m=$(basename "$o" .o | sed 's/^brk_//')
    nm --undefined-only "$o" 2>/dev/null | awk -v m="$m" '{print $2, m}'
done | sort -k1,1 >"$T/uses"
join "$T/uses" "$T/defs" | awk '$2 != $3 {print $2, $3}' | sort -u >"$T/call"

if [ ! -s "$T/defs" ]; then
    bad "no broker objects under $B/broker (build first)"
else
    echo "-- include edges (module -> header of module)"; sed 's/^/  /' "$T/inc"
    echo "-- call edges (caller -> callee)"; sed 's/^/  /' "$T/call"
    for g in inc call; do
        if tsort "$T/$g" >/dev/null 2>"$T/$g.err" && [ ! -s "$T/$g.err" ]; then
            ok "no cycle in the $g graph"
        else
            bad "a cycle in the $g graph"; sed 's/^/  | /' "$T/$g.err"
        fi
    done
    cross=$(cat "$T/inc" "$T/call" | grep -E '^(requests|workers|sync) (requests|workers|sync)$' | sort -u)
    if [ -z "$cross" ]; then
        ok "requests, workers and sync neither include nor call one another"
    else
        bad "requests, workers and sync are tied: $cross"
    fi
    up=$(cat "$T/inc" "$T/call" | grep -E ' (loop|main)$' | grep -vE '^main ' | sort -u)
    [ -z "$up" ] && ok "nothing calls up into the loop or main" || bad "calls up into the loop: $up"
fi
echo "broker_graph: $pass passed, $fail failed"
[ "$fail" = 0 ]
