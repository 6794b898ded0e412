#!/bin/bash
# gpu-bench.sh -- issue 29's batching numbers on a GPU machine, from the
# bundle `make gpu-bundle` made, in one call of under 300 s (run
# deploy/gpu-check.sh first: it proves the bundle and the device):
#   1  bench_mix_step cuda: one CFG step of tiny and small replayed from
#      its graph, a mixed workspace of B requests against B single ones,
#      with node counts (limit 90 s)
#   2  bench_batching on CUDA in BF16: 16 clients of single requests
#      through a real broker and worker, batching off / auto / ladder /
#      exact, every batched result bitwise the unbatched worker's
#      (limit 190 s; REPS reps, default 2)
#
#   deploy/gpu-bench.sh [--bundle DIR] [REPS]
#
# Never builds or installs. Output on stdout and, when $OUT is set, in
# $OUT/gpu-bench.log; the last line is "gpu-bench: PASS" (both ran to
# their end, exit 0) or "gpu-bench: FAIL <why>".
set -u -o pipefail

if [ -n "${OUT:-}" ] && [ -z "${GPU_BENCH_LOGGING:-}" ]; then
    mkdir -p "$OUT" 2>/dev/null
    GPU_BENCH_LOGGING=1 "$0" "$@" 2>&1 | tee "$OUT/gpu-bench.log"
    exit "${PIPESTATUS[0]}"
fi

cd "$(dirname "$0")/.." || { echo "gpu-bench: FAIL cannot enter the repository"; exit 1; }
REPO=$(pwd -P)
BUNDLE=${GPU_BUNDLE:-gpu-bundle}
REPS=2
while [ $# -gt 0 ]; do
    case $1 in
    --bundle) [ $# -ge 2 ] || { echo "gpu-bench: FAIL --bundle needs a folder"; exit 2; }; BUNDLE=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    [1-9]) REPS=$1 ;;
    *) echo "gpu-bench: FAIL unknown argument '$1' (usage: deploy/gpu-bench.sh [--bundle DIR] [REPS 1-9])"; exit 2 ;;
    esac
    shift
done
case $BUNDLE in /*) ;; *) BUNDLE="$REPO/$BUNDLE" ;; esac
. deploy/gpu-common.sh

fail() { echo "gpu-bench: FAIL $*"; exit 1; }
[ -f "$BUNDLE/reel-gpu.tar.gz" ] && [ -f "$BUNDLE/SOURCES.sha256" ] ||
    fail "no bundle at $BUNDLE: run make gpu-bundle on the build machine and carry the folder"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/reel-gpu-bench.XXXXXX") || fail "cannot create a temp folder"
trap 'rm -rf "$WORK"' EXIT
stale=$(gpu_stale_sources "$BUNDLE" "$WORK/sources.now")
[ -z "$stale" ] || fail "the bundle is stale: $(echo "$stale" | wc -l) source file(s) differ from those it was built from (first: $(echo "$stale" | head -1)); run make gpu-bundle again and carry it"
tar -C "$WORK" -xzf "$BUNDLE/reel-gpu.tar.gz" bin lib || fail "cannot unpack $BUNDLE/reel-gpu.tar.gz"
BIN="$WORK/bin"
for b in bench_mix_step bench_batching reelctl reel-broker reel-worker; do
    [ -x "$BIN/$b" ] || fail "the bundle has no $b: run make gpu-bundle again"
done

# $1 seconds, then the command; its status (124: out of time)
run() {
    local secs=$1; shift
    echo "== $* (limit ${secs} s)"
    timeout -k 5 "$secs" "$@"
}
failed=""
run 90 "$BIN/bench_mix_step" "$BIN" cuda || failed="${failed:+$failed; }bench_mix_step exited $?"
run 190 "$BIN/bench_batching" "$BIN" "$REPS" 16 8 all cuda || failed="${failed:+$failed; }bench_batching exited $?"
[ -z "$failed" ] || fail "$failed"
echo "gpu-bench: PASS"
