#!/bin/sh
# cli_layering.sh -- the whole tree's layering (issue 25 section 2): the
# include and call graphs between folders follow their README.md Uses:
# lines (no upward arrow), those lines form layers, and no two files call
# each other in a circle (tests/layering.py on the built objects, CUDA's
# .cu.o included when built). First it proves the checker can fail:
# layering.py --self-test builds tiny trees with cc and must find an upward
# include, an upward call, a circle of calls and a cycle of Uses: lines,
# and nothing on a clean tree.
# Prints both reports, then "layering: N passed, N failed" (their checks
# together).
# Usage: cli_layering.sh BUILD
set -u
B="${1:-build}"
cd "$(dirname "$0")/.."
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "PASS $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
T=$(mktemp -d /tmp/reel-layering.XXXXXX)
trap 'rm -rf "$T"' EXIT

# One run of layering.py: its report, its checks added to ours (one more
# failure when it exits non-zero yet counts none, or prints no summary).
run() {
    what=$1; shift
    python3 tests/layering.py "$@" >"$T/out" 2>&1
    rc=$?
    sed 's/^/  /' "$T/out"
    line=$(grep -E '^[a-z_]+: [0-9]+ passed, [0-9]+ failed$' "$T/out" | tail -n 1)
    if [ -z "$line" ]; then
        bad "$what: no summary (exit $rc)"
        return
    fi
    n=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed$/\1/')
    pass=$((pass + n)); fail=$((fail + f))
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then bad "$what: exit $rc"; fi
}

echo "-- the checker on tiny trees (it must fail where it should)"
run "the self-test" --self-test
echo "-- the tree built in $B"
if [ -d "$B" ]; then
    run "the tree" --build "$B"
else
    bad "no build folder $B (build first)"
fi
echo "layering: $pass passed, $fail failed"
[ "$fail" = 0 ]
