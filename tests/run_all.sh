#!/bin/sh
# run_all.sh -- runs every test suite, prints one line per suite and a final
# "N passed, N failed, N skipped" line; exits non-zero on any failure.
#   BUILD=build            where the binaries are
#   REEL_UNIT_ONLY=1       Check suites only (make asan)
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
PY=/usr/bin/python3   # Debian's python3-numpy installs for this interpreter
pass=0; fail=0; skip=0; failed=""
log=$(mktemp -d /tmp/reel-tests.XXXXXX)
trap 'rm -rf "$log"' EXIT

# One Check suite: counts its checks from the "Checks: N, Failures: F,
# Errors: E" summary; a crash or a missing summary counts as a failure.
run_check() {
    name=$(basename "$1")
    out="$log/$name.out"
    t0=$(date +%s)
    timeout -k 30 600 "$1" >"$out" 2>&1
    rc=$?
    cat "$out"
    echo "$name: took $(($(date +%s) - t0)) s"
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "$name: TIMED OUT (600 s): the last lines above are where it was"
    if grep -q '^[a-z_]*: SKIP' "$out"; then
        skip=$((skip + 1)); return
    fi
    summary=$(grep -E '^[0-9]+%: Checks: ' "$out" | tail -n 1)
    if [ -z "$summary" ]; then
        echo "$name: FAILED (exit $rc, no Check summary)"
        fail=$((fail + 1)); failed="$failed $name"; return
    fi
    n=$(echo "$summary" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
    f=$(echo "$summary" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
    e=$(echo "$summary" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
    pass=$((pass + n - f - e)); fail=$((fail + f + e))
    if [ "$rc" != 0 ] || [ $((f + e)) != 0 ]; then failed="$failed $name"; [ "$rc" != 0 ] && [ $((f + e)) = 0 ] && fail=$((fail + 1)); fi
}

# A script suite printing "<name>: N passed, N failed" as its last line.
run_script() {
    name=$1; shift
    out="$log/$name.out"
    t0=$(date +%s)
    timeout -k 30 900 "$@" >"$out" 2>&1
    rc=$?
    cat "$out"
    echo "$name: took $(($(date +%s) - t0)) s"
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "$name: TIMED OUT (900 s): the last lines above are where it was"
    line=$(grep -E '^[a-z0-9_-]+: [0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$name: FAILED (exit $rc, no summary line)"
        fail=$((fail + 1)); failed="$failed $name"; return
    fi
    n=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    pass=$((pass + n)); fail=$((fail + f))
    if [ "$rc" != 0 ] || [ "$f" != 0 ]; then failed="$failed $name"; [ "$rc" != 0 ] && [ "$f" = 0 ] && fail=$((fail + 1)); fi
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    echo "=== $(basename "$t")"
    run_check "$t"
done

if [ "${REEL_UNIT_ONLY:-0}" != 1 ]; then
    echo "=== crosscheck (numpy implementation of TINYDIT.md vs reelctl run)"
    mkdir -p "$log/xc"
    run_script crosscheck "$PY" tests/crosscheck/test_crosscheck.py --reelctl "$BUILD/reelctl" --workdir "$log/xc"
    echo "=== t5 (numpy umT5 encoder from wan/modules/t5.py vs reelctl encode)"
    mkdir -p "$log/t5"
    run_script t5 "$PY" tests/crosscheck/test_t5.py --reelctl "$BUILD/reelctl" --workdir "$log/t5"
    echo "=== vae crosscheck (numpy implementation of Wan2.1's VAE decoder vs reelctl decode)"
    mkdir -p "$log/vae"
    run_script vae-crosscheck "$PY" tests/crosscheck/test_vae.py --reelctl "$BUILD/reelctl" --workdir "$log/vae"
    echo "=== python client (clients/python against a real broker and worker)"
    run_script python "$PY" clients/python/tests/test_client.py --build "$BUILD"
    for s in tests/cli_*.sh; do
        [ -f "$s" ] || continue
        echo "=== $(basename "$s")"
        run_script "$(basename "$s" .sh)" sh "$s" "$BUILD"
    done
fi

echo
[ -n "$failed" ] && echo "failed suites:$failed"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ] && [ -z "$failed" ]
