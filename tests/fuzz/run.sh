#!/bin/sh
# run.sh BUILD SECONDS -- runs every fuzzer in BUILD/fuzz for SECONDS each,
# starting from its seed corpus (copied: the tree's corpus is never written).
# Prints one line per fuzzer and "fuzz: N passed, N failed"; a crash, leak
# or timeout fails and leaves the reproducer in the printed folder.
set -u
B=${1:-build-fuzz}
SECS=${2:-60}
cd "$(dirname "$0")/../.."
pass=0; fail=0
for f in "$B"/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f"); corp=tests/fuzz/corpus/${name#fuzz_}
    work=$(mktemp -d /tmp/reel-fuzz-"$name".XXXXXX)
    [ -d "$corp" ] && cp -r "$corp"/. "$work"/ 2>/dev/null
    if "$f" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$work/" \
        -print_final_stats=1 "$work" >"$work/log" 2>&1; then
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
        echo "PASS $name: ${execs:-?} runs in ${SECS} s, no crash"
        pass=$((pass + 1)); rm -rf "$work"
    else
        echo "FAIL $name: see $work (log and crash reproducer)"; tail -20 "$work/log" | sed 's/^/  | /'
        fail=$((fail + 1))
    fi
done
echo "fuzz: $pass passed, $fail failed"
[ "$fail" = 0 ]
