#!/bin/bash
# run_all.sh -- runs every test suite, prints each suite's output as it ends
# and a final "N passed, N failed, N skipped" line; exits non-zero on any
# failure.
#   BUILD=build            where the binaries are
#   REEL_UNIT_ONLY=1       Check suites only (make asan, make tsan)
#   REEL_TEST_JOBS=N       suites run at once (default: cores + 1, at least
#                          2; 1 runs them one after another). Every suite
#                          waits for the events it checks and uses its own
#                          temporary directory, ipc paths and ports (port 0
#                          or a per-process one), so they run side by side
#                          as they do beside the hogs of make test-busy.
#   REEL_TEST_ONLY=RE      only the suites whose name matches RE (grep -E)
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
PY=/usr/bin/python3   # Debian's python3-numpy installs for this interpreter
JOBS=${REEL_TEST_JOBS:-$(($(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) + 1))}
[ "$JOBS" -ge 1 ] 2>/dev/null || JOBS=2
[ -n "${REEL_TEST_JOBS:-}" ] || [ "$JOBS" -ge 2 ] || JOBS=2
pass=0; fail=0; skip=0; failed=""
log=$(mktemp -d /tmp/reel-tests.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$log"' EXIT
trap 'exit 130' INT TERM

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

# The suites, the longest first (their times in make test on 2 cores), so
# the pool ends together; each line is NAME KIND ARGS... (KIND check or
# script).
slow="cli_gpu_check crosscheck cli_batch cli_security test_gemm_merge cli_mixed
cli_upload cli_cluster python cli_layering cli_broker_restart cli_hosts
test_ops_cpu cli_catalog test_worker_unit test_broker_unit cli_upload_disk
test_vmath cli_sync_restart cli_solvers cli_broker_kill test_tdit_cache"
list() {
    for t in "$BUILD"/tests/test_*; do
        [ -x "$t" ] && echo "$(basename "$t") check $t"
    done
    [ "${REEL_UNIT_ONLY:-0}" = 1 ] && return
    mkdir -p "$log/xc" "$log/t5" "$log/vae"
    echo "crosscheck script $PY tests/crosscheck/test_crosscheck.py --reelctl $BUILD/reelctl --workdir $log/xc"
    echo "t5 script $PY tests/crosscheck/test_t5.py --reelctl $BUILD/reelctl --workdir $log/t5"
    echo "vae-crosscheck script $PY tests/crosscheck/test_vae.py --reelctl $BUILD/reelctl --workdir $log/vae"
    echo "python script $PY clients/python/tests/test_client.py --build $BUILD"
    for s in tests/cli_*.sh; do
        [ -f "$s" ] && echo "$(basename "$s" .sh) script sh $s $BUILD"
    done
}
list >"$log/all"
if [ -n "${REEL_TEST_ONLY:-}" ]; then
    awk -v re="$REEL_TEST_ONLY" '$1 ~ re' "$log/all" >"$log/sel"; mv "$log/sel" "$log/all"
fi
{
    for n in $slow; do grep "^$n " "$log/all"; done
    awk -v slow="$slow" 'BEGIN { n = split(slow, a); for (i = 1; i <= n; i++) s[a[i]] = 1 } !($1 in s)' "$log/all"
} >"$log/order"
echo "run_all: $(wc -l <"$log/order") suites, $JOBS at a time (REEL_TEST_JOBS)"

# One suite in the background: its output and its counts go to files, read
# when it ends.
start() { # NAME KIND ARGS...
    local name=$1 kind=$2; shift 2
    (
        pass=0; fail=0; skip=0; failed=""
        echo "=== $name"
        if [ "$kind" = check ]; then run_check "$@"; else run_script "$name" "$@"; fi
        echo "$pass $fail $skip $failed" >"$log/$name.res"
    ) </dev/null >"$log/$name.print" 2>&1 &
    echo "$!" >"$log/$name.pid"
    running="$running $name"
}
# Prints and counts every suite that has ended; "running" keeps the others.
reap() {
    local n still="" p f k x
    for n in $running; do
        if kill -0 "$(cat "$log/$n.pid")" 2>/dev/null; then still="$still $n"; continue; fi
        wait "$(cat "$log/$n.pid")" 2>/dev/null
        cat "$log/$n.print"
        if [ -f "$log/$n.res" ]; then
            read -r p f k x <"$log/$n.res"
            pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + k))
            [ -n "${x:-}" ] && failed="$failed $x"
        else
            echo "$n: FAILED (the runner lost it: no result file)"
            fail=$((fail + 1)); failed="$failed $n"
        fi
    done
    running=$still
}
running=""
while read -r name kind args; do
    # shellcheck disable=SC2086 # ARGS are words: paths without spaces
    start "$name" "$kind" $args
    while [ "$(echo $running | wc -w)" -ge "$JOBS" ]; do
        wait -n 2>/dev/null
        reap
    done
done <"$log/order"
while [ -n "$(echo $running)" ]; do wait -n 2>/dev/null; reap; done

echo
[ -n "$failed" ] && echo "failed suites:$failed"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ] && [ -z "$failed" ]
