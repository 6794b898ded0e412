#!/bin/sh
# run_asan_cli.sh -- the process-level scripts (tests/cli_*.sh) against the
# ASan + UBSan build of the daemons and reelctl (make asan-cli). Each
# sanitizer report goes to a file of its own (ASAN_OPTIONS log_path) and
# fails the run. A script's own failures are listed but do not: under
# ASan's slowdown some checks of timing (a flood shed within its window)
# can miss, and the main suite (make test) is what judges behaviour.
# cli_flood (a timing flood) and cli_gpu_check (a GPU bundle) are left to
# the main suite.
#   BUILD=build-asan   where the sanitized binaries are
#   REEL_TEST_ONLY=RE  only the scripts whose name (less cli_) matches RE
#   REEL_TEST_SKIP=RE  not those whose name matches RE
set -u
BUILD=${BUILD:-build-asan}
cd "$(dirname "$0")/.."
logs=$(mktemp -d /tmp/reel-asan-cli.XXXXXX)
trap 'rm -rf "$logs"' EXIT
# fast_unwind_on_malloc=0: a leak's stack goes on through libraries built
# without frame pointers (libzmq's allocations otherwise show one frame);
# log_exe_name=1: each report's file names the program that wrote it.
export ASAN_OPTIONS="detect_leaks=1 fast_unwind_on_malloc=0 log_exe_name=1 log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1 log_path=$logs/ubsan"
fail=0
warn=0
for s in tests/cli_*.sh; do
    n=$(basename "$s" .sh)
    case $n in cli_flood | cli_gpu_check) continue ;; esac
    if [ -n "${REEL_TEST_ONLY:-}" ] && ! echo "$n" | sed 's/^cli_//' | grep -Eq "$REEL_TEST_ONLY"; then continue; fi
    if [ -n "${REEL_TEST_SKIP:-}" ] && echo "$n" | sed 's/^cli_//' | grep -Eq "$REEL_TEST_SKIP"; then continue; fi
    out=$(timeout 600 sh "$s" "$BUILD" 2>&1)
    rc=$?
    echo "$n: $(echo "$out" | tail -n 1)"
    # each report named by the script whose processes wrote it
    for f in "$logs"/asan.* "$logs"/ubsan.*; do
        [ -e "$f" ] || continue
        echo "  sanitizer report from $n: $(basename "$f")"
        mv "$f" "$logs/$n.$(basename "$f")"
    done
    if [ $rc != 0 ]; then
        echo "$out" | grep '^FAIL' | sed 's/^/  (not counted) /'
        warn=$((warn + 1))
    fi
done
reports=$(ls "$logs" 2>/dev/null | wc -l)
if [ "$reports" != 0 ]; then
    echo "sanitizer reports: $reports"
    for f in "$logs"/*; do sed -n '1,25p' "$f" | sed 's/^/  | /'; done
    fail=$((fail + 1))
fi
echo "asan-cli: $fail sanitizer problem(s); $warn script(s) with failed checks (listed above, not counted)"
[ "$fail" = 0 ]
