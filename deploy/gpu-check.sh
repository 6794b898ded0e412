#!/bin/bash
# gpu-check.sh -- the device checks, as one script for a machine with an
# NVIDIA GPU (sm_80+) that has none of Debian's libraries and reaches no
# registry. It runs the binaries of the bundle that `make gpu-bundle` made
# on the build machine (carry the folder gpu-bundle/ with the tree); it never
# installs and never builds anything (the build used every core there).
#
#   deploy/gpu-check.sh [--quick] [--bundle DIR]
#
# Full mode finishes in under 480 s, --quick (a re-run) in under 120 s; each
# step has a time limit and the whole run a deadline (the limits sum to the
# budget, under the device's 600 s per call). Steps 0 and 1 must pass for
# anything else to run; from step 2 on a failing step is one FAIL row and
# the next step runs all the same, so one attempt yields every number the
# device can give. The last line is always the verdict, after the table
# (one row per check: PASS, FAIL with the first error, or SKIP):
# "gpu-check: PASS", or "gpu-check: FAIL <the first failure>" (and how many
# more rows failed); the exit status is 0 only with PASS. The steps run in
# the order of what their numbers are worth: the probe, the CFG steps
# (6 and 6b: the Wan step on both attention paths; 6c: tiny, small), the Wan-size
# attention (5), the CUDA suite (2), reelctl run (3),
# the capture cache (4), the fused cuDNN attention (7), the VAE (8). Steps (docs/GPU.md
# says why each one cannot pass falsely):
#   0  preflight: shell tools, the bundle, built from this very tree (source
#      hashes), glibc new enough, every library found (ldd; the CUDA libraries
#      are looked for in the toolkit and in Python's nvidia packages), the
#      binaries start -- any gap is one FAIL line naming what is missing
#   1  versions: GPU, driver, CUDA runtime, cuBLAS, cuDNN, nvcc; the probe
#      fails unless Reel's CUDA backend comes up
#   2  the CUDA suite (tests/test_cuda): every check passes, none skips
#   3  reelctl run, tiny config, CUDA vs CPU in F32 and BF16 by NMSE (not
#      bitwise; a CUDA result bitwise equal to the CPU's fails as a fallback),
#      graphs on == graphs off bitwise; full mode also a wan2.1-1.3b-shaped
#      block (one layer, 1560 tokens, 512 text tokens) in BF16 and F32
#   4  the capture cache with 2 streams: a broker and a CUDA worker
#      (--streams 2 --warmup 1 --audit-every 1), concurrent requests on two
#      keys: captures, bitwise verify, replays, every replay audited, no bad
#      decline, results equal to eager CUDA runs within tolerance
#   5  BF16 attention at Wan size (32,760 tokens x 12 heads x 128), 256
#      query rows against a double-precision CPU reference; full mode also
#      the cross attention over 512 text tokens
#   6  one CFG step eager vs graph replay in BF16 on CUDA (replay bitwise
#      equal to eager first): tiny, small and, in full mode, wan2.1-1.3b at
#      81 frames 480x832 (latent 16x21x60x104, 32,760 tokens) on AUTO's
#      attention (cuDNN's SDPA where it loads); each row names the path
#      taken and carries reelctl plan's estimate for it
#   6b (full mode) the same Wan step on the decomposed path, and its latent
#      against the fused step's (NMSE, as BF16 CUDA vs CPU)
#   6c (full mode) tiny and small after them (--quick runs these as 6)
#   7  cuDNN's fused attention (the test_cuda case "cudnn": AUTO's path on
#      CUDA in BF16 where cuDNN loads), its own row: SKIP when it cannot load
#   8  the VAE decoder (tests/test_vae_cuda): video ops bitwise, decodes by
#      NMSE against the CPU, none skipped; full mode also times one decode
#      at Wan size (latent 16x21x60x104) on CUDA
# Output goes to stdout and, when $OUT is set, to $OUT/gpu-check.log.
set -u -o pipefail

if [ -n "${OUT:-}" ] && [ -z "${GPU_CHECK_LOGGING:-}" ]; then
    mkdir -p "$OUT" 2>/dev/null
    GPU_CHECK_LOGGING=1 "$0" "$@" 2>&1 | tee "$OUT/gpu-check.log"
    exit "${PIPESTATUS[0]}"
fi

cd "$(dirname "$0")/.." || { echo "gpu-check: FAIL cannot enter the repository"; exit 1; }
REPO=$(pwd -P)
MODE=full
BUNDLE=${GPU_BUNDLE:-gpu-bundle}
while [ $# -gt 0 ]; do
    case $1 in
    --quick) MODE=quick ;;
    --bundle) [ $# -ge 2 ] || { echo "gpu-check: FAIL --bundle needs a folder"; exit 2; }; BUNDLE=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: FAIL unknown argument '$1' (usage: deploy/gpu-check.sh [--quick] [--bundle DIR])"; exit 2 ;;
    esac
    shift
done
case $BUNDLE in /*) ;; *) BUNDLE="$REPO/$BUNDLE" ;; esac

# --- time, verdict, table ----------------------------------------------------
# 10 s under the promise: a command stopped at the deadline gets 5 s to go.
if [ "$MODE" = full ]; then BUDGET=470; else BUDGET=115; fi
# GPU_CHECK_BUDGET may shorten the deadline (the self-test does), never extend it.
if [[ ${GPU_CHECK_BUDGET:-} =~ ^[0-9]+$ ]] && [ "$GPU_CHECK_BUDGET" -lt "$BUDGET" ]; then BUDGET=$GPU_CHECK_BUDGET; fi
T0=$SECONDS
VERDICT=""
WORK=""
PIDS=""
CHILD=""
WATCHDOG=""
ENV_LINE="(GPU not probed yet)"
ROWS=""        # the table's rows, one per line (tab-separated): a step in a subshell adds its own
IN_STEP=""     # set inside a step's subshell: its failures are rows, not the verdict
STEP_PID=""

left() { echo $((BUDGET - (SECONDS - T0))); }

# row WHAT RESULT [LIMIT] [STATUS]: one line of the final table (STATUS
# PASS unless given: FAIL, SKIP).
SEP=$'\x1f' # between a row's fields: no whitespace, which read would merge
row() {
    local r=${2//$SEP/ }
    printf '%s%s%s%s%s%s%s\n' "$1" "$SEP" "${r//$'\n'/ }" "$SEP" "${3:-}" "$SEP" "${4:-PASS}" >>"${ROWS:-/dev/null}"
}

print_table() {
    echo
    echo "gpu-check: $MODE mode, $((SECONDS - T0)) s of $BUDGET s; $ENV_LINE"
    local bar=------------------------------------------------------------------------ what res lim st
    printf '| %-4s | %-52s | %-70s | %-24s |\n' "" "check" "result" "limit"
    printf '|%s|%s|%s|%s|\n' "${bar:0:6}" "${bar:0:54}" "${bar:0:72}" "${bar:0:26}"
    [ -n "$ROWS" ] && [ -f "$ROWS" ] || return 0
    while IFS=$SEP read -r what res lim st; do
        printf '| %-4s | %-52s | %-70s | %-24s |\n' "$st" "$what" "$res" "$lim"
    done <"$ROWS"
}

# kill_tree PID: the process and everything it started.
kill_tree() {
    local c
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$c"; done
    kill -KILL "$1" 2>/dev/null
}

cleanup() {
    local p
    if [ -n "$STEP_PID" ]; then
        disown "$STEP_PID" 2>/dev/null # no "Killed" notice after the verdict
        kill_tree "$STEP_PID"
    fi
    [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null # timeout(1) passes it on to the command
    for p in $PIDS; do kill -KILL "$p" 2>/dev/null; done
    [ -n "$WATCHDOG" ] && kill "$WATCHDOG" 2>/dev/null
    if [ -n "$WORK" ] && [ -z "${GPU_CHECK_KEEP:-}" ]; then rm -rf "$WORK" 2>/dev/null; fi
}

# fail REASON: in a step (run_step), a FAIL row and the end of that step
# (its processes stopped); the next step runs. Outside one (preflight, the
# probe, the deadline): the table so far, then the one verdict line; exit 1.
fail() {
    if [ -n "$IN_STEP" ] && [ "$BASHPID" != "$$" ]; then
        row "$IN_STEP" "$*" "" FAIL
        [ -s "$WORK/first-failure" ] || printf '%s\n' "$*" >"$WORK/first-failure"
        local p me=$BASHPID
        [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null
        for p in $PIDS; do kill -KILL "$p" 2>/dev/null; done
        for p in $(ps -o pid= --ppid "$me" 2>/dev/null); do kill_tree "$p"; done # requests still in flight
        exit 1
    fi
    trap '' INT TERM HUP # one verdict: a late signal waits for the exit
    if [ -n "$STEP_PID" ]; then # the step stops before the table, so nothing of it follows the verdict
        disown "$STEP_PID" 2>/dev/null
        kill_tree "$STEP_PID"
        STEP_PID=""
    fi
    VERDICT=fail
    print_table
    echo "gpu-check: FAIL $*"
    exit 1
}

# run_step NAME FUNCTION: FUNCTION in a subshell, in the background and
# waited for (a signal to this shell, the deadline, acts at once); a
# failure inside it is a FAIL row named NAME, and the script goes on.
run_step() {
    local name=$1
    shift
    ( IN_STEP=$name; trap - EXIT INT TERM HUP; "$@" ) &
    STEP_PID=$!
    wait "$STEP_PID"
    STEP_PID=""
}

on_exit() {
    local rc=$?
    # Only the script itself says a verdict: a subshell (the watchdog, a
    # command substitution) that ends must not print a second one (seen
    # under make test-busy: 'stopped (exit 0)' after the real FAIL line).
    [ "$BASHPID" = "$$" ] || return 0
    cleanup
    if [ -z "$VERDICT" ]; then
        print_table
        echo "gpu-check: FAIL the script stopped (exit $rc) before reaching a verdict"
        exit 1
    fi
}
trap on_exit EXIT
trap 'fail "stopped by a signal (the ${BUDGET} s deadline, or an interrupt)"' INT TERM HUP

# run_logged NAME LIMIT CMD...: CMD under a time limit (LIMIT, or less when
# the deadline is nearer), its output in $WORK/NAME.log and, indented, on
# stdout; RC is its exit status. A timeout is a FAIL.
RC=0
run_logged() {
    local name=$1 lim=$2 l
    shift 2
    l=$(left)
    [ "$l" -ge 5 ] || fail "out of time before '$name' ($BUDGET s budget)"
    [ "$lim" -le "$l" ] || lim=$l
    # In the background and waited for, so that a signal (the deadline)
    # is acted on at once; cleanup stops the command then.
    timeout -k 5 "$lim" "$@" >"$WORK/$name.log" 2>&1 &
    CHILD=$!
    wait "$CHILD"
    RC=$?
    CHILD=""
    indent "$WORK/$name.log"
    if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
        fail "'$name' timed out after $lim s$(l=$(lastline "$WORK/$name.log"); [ -n "$l" ] && echo ": $l")"
    fi
}

lastline() { grep -v '^[[:space:]]*$' "$1" | tail -1; }
# indent FILE: FILE's lines on stdout, each after "  | " (in bash: no fork).
indent() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do printf '  | %s\n' "$line"; done <"$1"
}

# --- 0. preflight -------------------------------------------------------------
echo "== 0. preflight ($MODE mode, deadline $BUDGET s)"
missing=""
for c in bash tar gzip sha256sum timeout awk sed grep sort find mktemp getconf cmp xargs tr head tail kill sleep ps; do
    command -v "$c" >/dev/null 2>&1 || missing="$missing $c"
done
[ -z "$missing" ] || fail "missing commands on this machine:$missing"
# shellcheck source=deploy/gpu-common.sh
. "$REPO/deploy/gpu-common.sh" || fail "deploy/gpu-common.sh is missing from the tree"
# The deadline, for anything a step limit does not bound; it goes away
# within a second of the script.
( trap - EXIT INT TERM HUP
  end=$((SECONDS + BUDGET + 2))
  while [ $SECONDS -lt $end ]; do sleep 1; kill -0 $$ 2>/dev/null || exit 0; done
  kill -TERM $$ 2>/dev/null ) &
WATCHDOG=$!
disown "$WATCHDOG" 2>/dev/null

[ -d "$BUNDLE" ] || fail "no bundle at $BUNDLE: run make gpu-bundle on the build machine and carry the folder (device tool: carry [\"$(basename "$BUNDLE")\"])"
for f in reel-gpu.tar.gz MANIFEST SOURCES.sha256; do
    [ -f "$BUNDLE/$f" ] || fail "the bundle lacks $f: run make gpu-bundle again"
done
mval() { sed -n "s/^$1=//p" "$BUNDLE/MANIFEST" | head -1; }
echo "  bundle: built $(mval built_at) on $(mval built_on), commit $(mval git_head) (+$(mval sources_changed_since_head) changed), nvcc $(mval nvcc)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/reel-gpu-check.XXXXXX") || fail "cannot create a temp folder"
ROWS="$WORK/rows"
: >"$ROWS"
# A bundle built from other sources would test other code: the tree here
# must hash to the same sources, file for file.
stale=$(gpu_stale_sources "$BUNDLE" "$WORK/sources.now")
if [ -n "$stale" ]; then
    fail "the bundle is stale: $(echo "$stale" | wc -l) source file(s) differ from those it was built from (first: $(echo "$stale" | head -1)); run make gpu-bundle again and carry it"
fi
echo "  sources: $(wc -l <"$WORK/sources.now") files, the ones the bundle was built from"

tar -C "$WORK" -xzf "$BUNDLE/reel-gpu.tar.gz" bin lib || fail "cannot unpack $BUNDLE/reel-gpu.tar.gz"
BIN="$WORK/bin"
for b in $GPU_BINS; do
    [ -x "$BIN/${b##*/}" ] || fail "the bundle has no ${b##*/}: run make gpu-bundle again"
done

have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
need=$(mval glibc_max)
echo "  glibc: $have here, the bundle needs $need"
if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    fail "this machine's glibc is $have and the bundle needs $need: make the bundle on an older system"
fi

# Every library of every binary must resolve: in the bundle's lib/, or on
# the list (glibc, libstdc++, the CUDA libraries). A CUDA library the loader
# misses is looked for where toolkits and Python wheels put it.
libdir=$(cd "$WORK/lib" && pwd -P)
scan_libs() {
    declare -gA NEED=()
    OUTSIDE=""
    local f name path
    for f in "$BIN"/*; do
        while read -r name path; do
            if [ "$name" = LDD-STATUS ]; then
                [ "$path" = 0 ] || NEED["[ldd cannot read it: not a dynamic x86-64 executable?]"]+=" ${f##*/}"
            elif [ "$name" = VERSION-NOT-FOUND ]; then
                # "BIN: /lib/.../libc.so.6: version `GLIBC_2.99' not found (required by BIN)"
                path=$(echo "$path" | sed -E 's/^[^:]*: ([^:]*): (version [^ ]*) not found.*/\1 \2/; s#^/[^ ]*/##')
                NEED["[$path]"]+=" ${f##*/}"
            elif [ "$path" = not-found ]; then NEED["$name"]+=" ${f##*/}"
            elif [ "$path" = - ]; then :
            elif [ "${path%/*}" = "$libdir" ] || [ "$(cd "${path%/*}" && pwd -P)" = "$libdir" ]; then :
            elif [[ $name =~ $GPU_ALLOWED_RE ]]; then :
            else case " $OUTSIDE " in *" $name=$path "*) ;; *) OUTSIDE="$OUTSIDE $name=$path" ;; esac
            fi
        done < <(gpu_ldd "$f"; echo "LDD-STATUS $?")
    done
}
scan_libs
if [ ${#NEED[@]} -gt 0 ]; then
    dirs="${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib"
    dirs="$dirs $(ls -d /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/x86_64-linux/lib 2>/dev/null | tr '\n' ' ')"
    for py in python3 /opt/torch/.venv/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        sp=$(timeout 20 "$py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
        for s in $sp; do dirs="$dirs $(ls -d "$s"/nvidia/*/lib "$s"/nvidia/*/*/lib 2>/dev/null | tr '\n' ' ')"; done
    done
    added=""
    for lib in "${!NEED[@]}"; do
        [[ $lib =~ $GPU_ALLOWED_RE ]] || continue
        for d in $dirs; do
            if [ -e "$d/$lib" ]; then
                case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
                added="$added $lib<-$d"
                break
            fi
        done
    done
    [ -n "$added" ] && echo "  found outside the loader's paths:$added"
    scan_libs
fi
if [ ${#NEED[@]} -gt 0 ]; then
    what=""
    for lib in "${!NEED[@]}"; do what="$what $lib (for$(echo "${NEED[$lib]}" | tr ' ' '\n' | sort -u | tr '\n' ' ' | sed 's/ $//'));"; done
    fail "missing on this machine:${what%;}"
fi
[ -z "$OUTSIDE" ] || fail "bundled binaries load libraries from outside the bundle and the allowed list:$OUTSIDE"
echo "  libraries: all found (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
# Each binary starts (test_cuda and gpu_probe, which have no harmless
# mode, run next): "BINARY ARGS=EXPECTED-STATUS".
for s in "reelctl kernels=0" "reel-broker --help=0" "reel-worker --help=0" "gpu_compare=2" \
         "gpu_attn_wan --usage=2" "gpu_step_time=2"; do
    # shellcheck disable=SC2086
    "$BIN"/${s%=*} >"$WORK/start.log" 2>&1
    rc=$?
    [ "$rc" = "${s##*=}" ] || fail "the bundled ${s%% *} does not start (exit $rc): $(lastline "$WORK/start.log")"
done
row "preflight (bundle, sources, libraries)" "bundle of $(mval git_head) fits this tree; glibc $have; $((SECONDS - T0)) s"

mkdir -p "$WORK/run" && cd "$WORK/run" || fail "cannot enter $WORK/run"
# A suite restricted by the environment would pass on fewer tests.
unset CK_RUN_SUITE CK_RUN_CASE CK_INCLUDE_TAGS CK_EXCLUDE_TAGS CK_VERBOSITY CK_FORK CK_DEFAULT_TIMEOUT \
      CK_TIMEOUT_MULTIPLIER CK_XML_LOG_FILE_NAME CK_TAP_LOG_FILE_NAME CK_LOG_FILE_NAME REEL_CATALOG

# --- 1. versions and the probe --------------------------------------------------
echo "== 1. GPU, driver, runtime, cuDNN, nvcc"
smi=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -1)
[ -n "$smi" ] || smi="nvidia-smi printed nothing"
command -v nvidia-smi >/dev/null 2>&1 || smi="nvidia-smi not found"
echo "  nvidia-smi: $smi"
nvcc=$(command -v nvcc 2>/dev/null || ls "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" 2>/dev/null)
nvv=$([ -n "$nvcc" ] && "$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\2/p')
echo "  nvcc: ${nvv:-not found} (not used: the bundle was built with nvcc $(mval nvcc))"
ENV_LINE="nvidia-smi: $smi; nvcc ${nvv:-none}"
run_logged probe 30 "$BIN/gpu_probe"
# A driver older than the CUDA the bundle needs: the toolkit's forward-
# compatibility libraries (a libcuda for the newer CUDA over the old
# kernel module), when the machine has them, are tried once before failing.
COMPAT=${CUDA_COMPAT_DIR:-/usr/local/cuda/compat}
if [ "$RC" != 0 ] && grep -qiE "driver version is insufficient|driver.*too old|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" \
    "$WORK/probe.log" && [ -e "$COMPAT/libcuda.so.1" ]; then
    echo "  the driver is older than this CUDA needs: trying the forward-compatibility libraries in $COMPAT"
    export LD_LIBRARY_PATH="$COMPAT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    run_logged probe-compat 30 "$BIN/gpu_probe"
    if [ "$RC" = 0 ]; then
        cp "$WORK/probe-compat.log" "$WORK/probe.log"
        row "CUDA forward compatibility" "the driver is too old for this CUDA: running with $COMPAT"
    fi
fi
[ "$RC" = 0 ] || fail "no usable GPU: $(grep -m1 '^probe: FAIL' "$WORK/probe.log" | sed 's/^probe: FAIL //' || lastline "$WORK/probe.log")"
pv() { sed -n "s/^$1: //p" "$WORK/probe.log" | head -1; }
driver=$(echo "$smi" | awk -F', ' 'NF >= 2 { print $2 }')
cudnn=$(pv cudnn)
case $cudnn in "not found"*) cudnn=none ;; *) cudnn=${cudnn%% *} ;; esac
ENV_LINE="$(pv gpu | cut -d, -f1-2), driver ${driver:-?} (CUDA $(pv 'cuda driver api')), runtime $(pv 'cuda runtime' | cut -d' ' -f1), cuBLAS $(pv cublas), cuDNN $cudnn, nvcc ${nvv:-none}"
row "GPU and Reel's CUDA backend" "$(pv 'reel backend'); $(pv gpu | cut -d, -f3-5 | sed 's/^ //')"

# --- 2. the CUDA suite -------------------------------------------------------------
step_suite() {
    SUITE_MIN=40 # checks in tests/test_cuda.c when this was written; a suite that runs fewer proves less
    if [ "$MODE" = full ]; then lim=120; else lim=45; fi
    echo "== 2. CUDA suite (tests/test_cuda, limit $lim s)"
    t=$SECONDS
    run_logged cuda-suite "$lim" env CK_RUN_CASE=cuda_vs_cpu "$BIN/test_cuda"
    log="$WORK/cuda-suite.log"
    skip=$(grep -m1 -E '(^|[^A-Za-z])SKIP' "$log")
    [ -z "$skip" ] || fail "the CUDA suite skipped on a GPU machine: $skip"
    sum=$(grep -E '^[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$log" | tail -1)
    [ -n "$sum" ] || fail "the CUDA suite printed no Check summary (exit $RC): $(lastline "$log")"
    n=$(echo "$sum" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
    nf=$(echo "$sum" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
    ne=$(echo "$sum" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
    [ "$nf" = 0 ] && [ "$ne" = 0 ] ||
        fail "the CUDA suite: $nf failures, $ne errors in $n checks; first: $(grep -m1 -E ':[FE]:' "$log")"
    [ "$RC" = 0 ] || fail "the CUDA suite exited $RC after '$sum'"
    [ "$n" -ge "$SUITE_MIN" ] || fail "the CUDA suite ran $n checks, fewer than the $SUITE_MIN it had when gpu-check.sh was written"
    row "CUDA suite (tests/test_cuda)" "$n checks, 0 failures, 0 skipped, $((SECONDS - t)) s" "all pass, none skips"
}

# --- 3. reelctl run: CUDA against the CPU --------------------------------------------
R="$BIN/reelctl"
D="$WORK/run"
BAD_REASONS='verify_mismatch|capture_failed|audit_mismatch|wrong_stream|backend_unavailable'
NMSE_F32=1e-5; REL_F32=1e-2   # F32 end to end: cuBLAS vs OpenBLAS order, fast exp/tanh
NMSE_BF16=5e-3; REL_BF16=1e-1 # BF16 weights and activations against the CPU in F32
prep() { # make weights/tensors, failing on any error
    run_logged "$1" 60 "${@:2}"
    [ "$RC" = 0 ] || fail "$1 failed: $(lastline "$WORK/$1.log")"
}
# prep_bg NAME CMD...: prep in the background (the draws of a step run at
# once, one core each); prep_wait waits for them all and fails on the first
# that failed. A failure or the deadline stops them with the step.
PREPS=""
prep_bg() {
    local l; l=$(left)
    [ "$l" -ge 5 ] || fail "out of time before '$1' ($BUDGET s budget)"
    [ "$l" -le 60 ] || l=60
    timeout -k 5 "$l" "${@:2}" >"$WORK/$1.log" 2>&1 &
    PREPS="$PREPS $1=$!"
}
prep_wait() {
    local e rc bad=""
    for e in $PREPS; do
        wait "${e#*=}"; rc=$?
        indent "$WORK/${e%%=*}.log"
        [ "$rc" = 0 ] || [ -n "$bad" ] || bad="${e%%=*} failed (exit $rc): $(lastline "$WORK/${e%%=*}.log")"
    done
    PREPS=""
    [ -z "$bad" ] || fail "$bad"
}

# run_case TAG BACKEND DTYPE GRAPHS WEIGHTS PREFIX STEPS LIMIT [extra flags]: one
# reelctl run; on CUDA it must say it ran on cuda (no CPU fallback) and, with
# graphs on, have captured and replayed with no bad decline.
run_case() {
    local tag=$1 b=$2 dt=$3 g=$4 w=$5 p=$6 steps=$7 lim=$8 nf=
    shift 8
    # --no-fallback: an unusable CUDA fails the run instead of quietly using the CPU.
    [ "$b" = cuda ] && nf=--no-fallback
    run_logged "run-$tag" "$lim" "$R" run --weights "$w" --latent "$D/$p-lat.st" --context "$D/$p-ctx.st" \
        --uncond "$D/$p-unc.st" --cfg 4 --steps "$steps" --shift 3 --backend "$b" --dtype "$dt" --graphs "$g" \
        $nf "$@" --out "$D/$tag.st"
    local log="$WORK/run-$tag.log"
    [ "$RC" = 0 ] || fail "reelctl run $tag failed (exit $RC): $(lastline "$log")"
    if [ "$b" = cuda ]; then
        grep -q "using the CPU backend" "$log" && fail "reelctl run $tag fell back to the CPU: $(grep -m1 'using the CPU' "$log")"
        grep -qE " on cuda:[0-9]+ \(sm_[0-9]+" "$log" || fail "reelctl run $tag did not report running on cuda:N (sm_..): $(grep -m1 ' on ' "$log")"
    else
        grep -qE " on cpu \(" "$log" || fail "reelctl run $tag did not report running on the CPU"
    fi
    grep -qE "$BAD_REASONS" "$log" && fail "reelctl run $tag: $(grep -m1 -E "$BAD_REASONS" "$log")"
    if [ "$g" = on ]; then
        local gl c r
        gl=$(grep -m1 "graphs on:" "$log")
        c=$(echo "$gl" | sed -n 's/.*: \([0-9]*\) captured.*/\1/p')
        r=$(echo "$gl" | sed -n 's/.* \([0-9]*\) replayed.*/\1/p')
        [ "${c:-0}" -ge 1 ] && [ "${r:-0}" -ge 1 ] || fail "reelctl run $tag captured ${c:-?} and replayed ${r:-?} steps (want >= 1 each): $gl"
    fi
}

# compare TAG GOT REF NMSE MAXREL [--differ]: gpu_compare, a row, FAIL if out.
compare() {
    local tag=$1 got=$2 ref=$3 tol=$4 rel=$5
    shift 5
    run_logged "cmp-$tag" 30 "$BIN/gpu_compare" "$D/$got.st" "$D/$ref.st" --nmse "$tol" --max-rel "$rel" "$@"
    local line
    line=$(grep -m1 '^compare' "$WORK/cmp-$tag.log")
    [ "$RC" = 0 ] || fail "$tag: ${line:-$(lastline "$WORK/cmp-$tag.log")}"
    row "$tag" "$(echo "$line" | sed -n 's/.*nmse \([^ ]*\) .*max err [^ ]* = \([^ ]*\) of.*/nmse \1, max err \2 of max|ref|/p')" "nmse <= $tol, <= $rel"
}

# same_bits TAG A B: the two outputs are bitwise equal (graphs on vs off).
same_bits() {
    run_logged "diff-$1" 30 "$R" tensor diff "$D/$2.st" "$D/$3.st"
    [ "$RC" = 0 ] || fail "$1: graph replay differs from eager on CUDA, bitwise: $(head -2 "$WORK/diff-$1.log" | tr '\n' ' ')"
    row "$1" "bitwise equal" "bitwise"
}

step_runs() {
    echo "== 3. reelctl run: CUDA vs CPU"
    t=$SECONDS
    prep_bg weights-tiny "$R" weights init --config tiny --seed 7 --out "$D/tiny.st"
    prep_bg latent-tiny "$R" tensor rand --name latent --shape 4,2,8,8 --seed 1 --out "$D/tiny-lat.st"
    prep_bg ctx-tiny "$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/tiny-ctx.st"
    prep_bg unc-tiny "$R" tensor rand --name context --shape 5,32 --seed 3 --out "$D/tiny-unc.st"
    prep_wait
    run_case tiny-cpu cpu f32 off "$D/tiny.st" tiny 8 60
    for dt in f32 bf16; do
        run_case "tiny-cuda-$dt" cuda "$dt" on "$D/tiny.st" tiny 8 60
        run_case "tiny-cuda-$dt-eager" cuda "$dt" off "$D/tiny.st" tiny 8 60
        if [ "$dt" = f32 ]; then tol=$NMSE_F32; rel=$REL_F32; else tol=$NMSE_BF16; rel=$REL_BF16; fi
        compare "tiny $dt run (8 steps, CFG), CUDA vs CPU" "tiny-cuda-$dt" tiny-cpu "$tol" "$rel" --differ
        same_bits "tiny $dt run on CUDA, graphs on vs off" "tiny-cuda-$dt" "tiny-cuda-$dt-eager"
    done

    if [ "$MODE" = full ]; then
        printf '%s\n' '{"name": "wan2.1-1.3b-block", "dim": 1536, "heads": 12, "layers": 1, "ffn_dim": 8960, "in_channels": 16, "text_dim": 4096, "freq_dim": 256}' >"$D/wanblock.json"
        prep_bg weights-wanblock "$R" weights init --config "$D/wanblock.json" --seed 11 --out "$D/wanblock.st"
        prep_bg latent-wanblock "$R" tensor rand --name latent --shape 16,4,30,52 --seed 4 --out "$D/wanblock-lat.st"
        prep_bg ctx-wanblock "$R" tensor rand --name context --shape 512,4096 --seed 5 --out "$D/wanblock-ctx.st"
        prep_bg unc-wanblock "$R" tensor rand --name context --shape 512,4096 --seed 6 --out "$D/wanblock-unc.st"
        prep_wait
        # 3 steps with --warmup 1: eager, capture + verify, replay.
        run_case wanblock-cpu cpu f32 off "$D/wanblock.st" wanblock 3 90
        for dt in bf16 f32; do
            run_case "wanblock-cuda-$dt" cuda "$dt" on "$D/wanblock.st" wanblock 3 60 --warmup 1
            if [ "$dt" = f32 ]; then tol=$NMSE_F32; rel=$REL_F32; else tol=$NMSE_BF16; rel=$REL_BF16; fi
            compare "wan2.1-1.3b block $dt (1560 tok), CUDA vs CPU" "wanblock-cuda-$dt" wanblock-cpu "$tol" "$rel" --differ
        done
    fi
    echo "  (runs in $((SECONDS - t)) s)"
}

# --- 4. the capture cache with 2 streams: broker + CUDA worker --------------------------
# wait_for FILE PATTERN SECONDS: 0 once FILE has a line matching PATTERN.
wait_for() {
    local i=0
    while [ $i -lt $(($3 * 10)) ]; do
        grep -qE "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

cache_phase() { # DTYPE LIMIT
    local dt=$1 lim=$2 P="$WORK/cache-$1" t=$SECONDS k
    mkdir -p "$P"
    local deadline=$((SECONDS + lim))
    [ "$(left)" -ge "$lim" ] || fail "out of time before the $dt cache phase ($BUDGET s budget)"
    # The references: each key's loop run eagerly on CUDA in one process.
    for k in keya keyb; do
        run_case "$k-eager-$dt" cuda "$dt" off "$D/tiny.st" "$k" 6 30
    done
    "$BIN/reel-broker" --clients "ipc://$P/c" --workers "ipc://$P/w" --catalog "$P/reel.db" --heartbeat-ms 200 \
        >"$P/broker.log" 2>&1 &
    local broker=$!
    disown "$broker" 2>/dev/null; PIDS="$PIDS $broker"
    wait_for "$P/broker.log" "reel-broker: ready" 10 || fail "the broker did not start: $(lastline "$P/broker.log")"
    "$BIN/reel-worker" --broker "ipc://$P/w" --name gpu0 --weights "$D/tiny.st" --backend cuda --dtype "$dt" \
        --streams 2 --warmup 1 --audit-every 1 --heartbeat-ms 200 >"$P/worker.log" 2>&1 &
    local worker=$!
    disown "$worker" 2>/dev/null; PIDS="$PIDS $worker"
    wait_for "$P/broker.log" "worker gpu0 ready" 30 ||
        fail "the CUDA worker did not become ready: $(lastline "$P/worker.log")"
    indent "$P/worker.log"
    grep -q "cuda unusable" "$P/worker.log" && fail "the worker fell back to the CPU: $(grep -m1 'cuda unusable' "$P/worker.log")"
    grep -qE "ready \(cuda:[0-9]+, 2 streams\)" "$P/worker.log" ||
        fail "the worker is not on cuda with 2 streams: $(grep -m1 'ready' "$P/worker.log")"
    # Two waves of 4 concurrent requests over 2 keys: both streams work, and
    # each key replays graphs captured by an earlier request.
    local n=0 wave pids i rc
    for wave in 1 2; do
        pids=""
        g=$(left)
        [ "$g" -ge 10 ] || fail "out of time in the $dt cache phase ($BUDGET s budget)"
        [ "$g" -le 60 ] || g=60
        for k in keya keyb keya keyb; do
            n=$((n + 1))
            timeout "$g" "$R" gen --broker "ipc://$P/c" --model tiny --latent "$D/$k-lat.st" --context "$D/$k-ctx.st" \
                --uncond "$D/$k-unc.st" --cfg 4 --steps 6 --shift 3 --timeout-ms 45000 --deadline-ms 40000 --quiet \
                --out "$P/o$n-$k.st" >"$P/gen$n.log" 2>&1 &
            pids="$pids $!"
        done
        i=$((n - 3))
        for p in $pids; do
            wait "$p"; rc=$?
            indent "$P/gen$i.log"
            [ "$rc" = 0 ] || fail "$dt cache: request $i failed (exit $rc): $(lastline "$P/gen$i.log")"
            i=$((i + 1))
        done
        [ $SECONDS -lt $deadline ] || fail "$dt cache phase ran past its $lim s"
    done
    kill -TERM "$worker" 2>/dev/null
    i=0; while kill -0 "$worker" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -0 "$worker" 2>/dev/null && fail "the worker did not stop within 10 s of SIGTERM"
    local close caps reps auds mism
    close=$(grep "stopping; capture cache:" "$P/worker.log" | tail -1)
    echo "  | $close"
    caps=$(echo "$close" | sed -n 's/.*capture cache: \([0-9]*\) captures.*/\1/p')
    reps=$(echo "$close" | sed -n 's/.* \([0-9]*\) replays.*/\1/p')
    auds=$(echo "$close" | sed -n 's/.*(\([0-9]*\) audited.*/\1/p')
    mism=$(echo "$close" | sed -n 's/.* \([0-9]*\) audit mismatches.*/\1/p')
    "$R" stats --catalog "$P/reel.db" --json >"$P/stats.json" 2>&1
    kill -TERM "$broker" 2>/dev/null
    grep -hE "$BAD_REASONS" "$P"/gen*.log "$P/worker.log" "$P/stats.json" | head -1 | grep . &&
        fail "$dt cache: a bad decline: $(grep -hE -m1 "$BAD_REASONS" "$P"/gen*.log "$P/worker.log" "$P/stats.json" | head -1)"
    [ "${caps:-0}" -ge 2 ] && [ "${reps:-0}" -ge 8 ] && [ "${auds:-0}" -ge 1 ] && [ "${mism:-1}" = 0 ] ||
        fail "$dt cache: the worker's closing line says '${close:-nothing}' (want >= 2 captures, >= 8 replays, audits > 0, 0 mismatches)"
    local same=0 o
    for o in "$P"/o*-key?.st; do
        k=${o##*-}; k=${k%.st}
        if [ "$dt" = f32 ]; then tol=1e-8; else tol=1e-4; fi
        run_logged "cmp-cache-$dt-$(basename "$o" .st)" 30 "$BIN/gpu_compare" "$o" "$D/$k-eager-$dt.st" --nmse "$tol"
        [ "$RC" = 0 ] || fail "$dt cache: $(basename "$o") against the eager CUDA run: $(grep -m1 '^compare' "$WORK/cmp-cache-$dt-$(basename "$o" .st).log")"
        grep -q "bitwise equal yes" "$WORK/cmp-cache-$dt-$(basename "$o" .st).log" && same=$((same + 1))
    done
    row "cache $dt, 2 streams: 8 requests, 2 keys" "$caps captures, $reps replays, $auds audited, 0 mismatches; $same/8 bitwise = eager, $((SECONDS - t)) s" "audits exact; nmse <= $tol"
}

step_cache() {
    echo "== 4. capture cache, 2 streams: broker + CUDA worker, every replay audited"
    prep_bg latent-b "$R" tensor rand --name latent --shape 4,1,8,12 --seed 21 --out "$D/keyb-lat.st"
    prep_bg ctx-b "$R" tensor rand --name context --shape 7,32 --seed 22 --out "$D/keyb-ctx.st"
    prep_bg unc-b "$R" tensor rand --name context --shape 7,32 --seed 23 --out "$D/keyb-unc.st"
    prep_wait
    cp "$D/tiny-lat.st" "$D/keya-lat.st" && cp "$D/tiny-ctx.st" "$D/keya-ctx.st" && cp "$D/tiny-unc.st" "$D/keya-unc.st" ||
        fail "cannot copy the inputs"
    cache_phase bf16 45
    [ "$MODE" != full ] || cache_phase f32 40
}

# --- 5. BF16 attention at Wan size -------------------------------------------------------
attn() { # TAG LIMIT flags...
    local tag=$1 lim=$2
    shift 2
    run_logged "attn-$tag" "$lim" "$BIN/gpu_attn_wan" --backend cuda --dtype bf16 --heads 12 --head-dim 128 --rows 256 "$@"
    local line
    line=$(grep -m1 '^attention' "$WORK/attn-$tag.log")
    [ "$RC" = 0 ] || fail "attention $tag: ${line:-$(lastline "$WORK/attn-$tag.log")}"
    echo "$line" | grep -qE "^attention bf16 cuda:[0-9]+ " || fail "attention $tag did not run on cuda: $line"
    row "attention bf16 $tag" "$(echo "$line" | sed -n 's/.*: \([0-9.]* ms\); .* nmse \([^ ]*\) .* = \([^ ]*\) of max.*/\1, nmse \2, max err \3 of max|ref|/p')" "nmse <= 1e-4, <= 1/32"
}
step_attention() {
    echo "== 5. BF16 attention at Wan size against a double-precision CPU reference"
    if [ "$MODE" = full ]; then
        attn "self 32760x12x128" 60 --tokens 32760 --sigma 1.5
        attn "cross 32760 x 512 text" 40 --tokens 32760 --kv 512 --sigma 1.0
    else # --quick: nothing at Wan size; the same kernels at 4096 tokens
        attn "self 4096x12x128" 30 --tokens 4096 --sigma 1.5
    fi
}

# --- 6. one step, eager vs graph replay, BF16 on CUDA ------------------------------------
# step_time CONFIG SIZE TEXT LIMIT BUDGET [ATTENTION]: one gpu_step_time row;
# with ATTENTION (auto|decomposed) the mode is set, the eager latent kept in
# $D/step-CONFIG-ATTENTION.st and the path taken in $WORK/path-CONFIG-ATTENTION.
step_time() {
    local attn=${6:-} tag=$1${6:+-$6}
    run_logged "step-$tag" "$4" "$BIN/gpu_step_time" --config "$1" --size "$2" --text "$3" --dtype bf16 --backend cuda \
        --budget-s "$5" ${attn:+--attention "$attn" --out "$D/step-$tag.st"}
    local line path
    line=$(grep -m1 '^step' "$WORK/step-$tag.log")
    [ "$RC" = 0 ] || fail "step $tag: ${line:-$(lastline "$WORK/step-$tag.log")}"
    echo "$line" | grep -qE "^step $1 bf16 cuda:[0-9]+ sm_" || fail "step $tag did not run on cuda: $line"
    path=$(echo "$line" | sed -n 's/.* CFG, attention \([a-z-]*\) .*/\1/p')
    [ -n "$attn" ] && echo "${path:-?}" >"$WORK/path-$tag"
    # next to the measurement: reelctl plan's estimate of the same step on this GPU (CFG, BF16, the path taken)
    local est="" gpu="" pa=""
    case $ENV_LINE in *H200*) gpu=h200 ;; *H100*) gpu=h100 ;; *A100*) gpu=a100 ;; esac
    case $path in sdpa) pa="--attention fused" ;; decomposed) pa="--attention decomposed" ;; esac
    # shellcheck disable=SC2086
    if [ -n "$gpu" ] && "$BIN/reelctl" plan --config "$1" --size "$2" --text "$3" --cfg --gpu "$gpu" $pa \
        >"$WORK/plan-$tag.log" 2>&1; then
        est=$(sed -n 's/^total: .* bytes, \([0-9.e+-]*\) s$/\1/p' "$WORK/plan-$tag.log" | tail -1)
        [ -n "$est" ] && est="; reelctl plan on $gpu: $(awk -v s="$est" 'BEGIN { printf "%.4g", s * 1000 }') ms"
    fi
    row "step $1 bf16 ($2, text $3), attention ${path:-?}: eager / replay" \
        "$(echo "$line" | sed -n 's/.*: eager \([0-9.]*\) ms, replay \([0-9.]*\) ms, eager\/replay \([0-9.]*x\).*, \([0-9]*\) nodes.*/\1 \/ \2 ms (\3), \4 nodes/p')$est" "replay == eager bitwise"
}
WAN_SIZE=21x60x104 # wan2.1-1.3b at 81 frames 480x832: latent 16x21x60x104, 32,760 tokens
# Full mode: the Wan step first (6), on the other path next (6b), then
# tiny and small (6c); --quick: tiny and small only.
step_steps() {
    echo "== 6. one CFG step, eager vs graph replay, BF16 on CUDA"
    if [ "$MODE" = full ]; then step_time wan2.1-1.3b "$WAN_SIZE" 512 150 30 auto
    else step_steps_small; fi
}
step_steps_small() {
    step_time tiny 2x8x8 5 30 4
    step_time small 4x16x16 16 40 8
}
# 6b, its own step (a failure of the fused one above must not cost this
# number): the Wan step on the decomposition, and its latent against the
# fused step's, where AUTO took cuDNN's SDPA.
step_steps_decomposed() {
    echo "== 6b. the wan2.1-1.3b step on the decomposed path, and fused vs decomposed"
    step_time wan2.1-1.3b "$WAN_SIZE" 512 120 15 decomposed
    local took
    took=$(cat "$WORK/path-wan2.1-1.3b-auto" 2>/dev/null)
    if [ "$took" != sdpa ]; then
        row "wan2.1-1.3b step: fused SDPA vs decomposed" \
            "not compared: AUTO took ${took:-nothing (its step failed)}, so the row above is the only path" "" SKIP
        return 0
    fi
    # One step from the same inputs; BF16 attention in a different order on each path.
    compare "wan2.1-1.3b step: fused SDPA vs decomposed latent" step-wan2.1-1.3b-auto step-wan2.1-1.3b-decomposed \
        "$NMSE_BF16" "$REL_BF16" --differ
}

# --- 7. cuDNN's fused attention --------------------------------------------------------
step_cudnn() {
    echo "== 7. the fused path: cuDNN SDPA attention (test_cuda case cudnn)"
    run_logged cudnn-suite 60 env CK_RUN_CASE=cudnn "$BIN/test_cuda"
    local log="$WORK/cudnn-suite.log" sum
    if grep -q "SKIP cudnn" "$log"; then
        row "cuDNN SDPA attention (the fused path)" "$(grep -m1 'SKIP cudnn' "$log" | sed 's/^.*SKIP //')" "" SKIP
        return 0
    fi
    sum=$(grep -E '^[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$log" | tail -1)
    [ -n "$sum" ] || fail "the cuDNN case printed no Check summary (exit $RC): $(lastline "$log")"
    [ "$RC" = 0 ] && echo "$sum" | grep -q "Failures: 0, Errors: 0" ||
        fail "the cuDNN case: $sum; first: $(grep -m1 -E ':[FE]:' "$log")"
    row "cuDNN SDPA attention (the fused path)" "$sum" "matches the decomposition"
}

# --- 8. the VAE decoder on CUDA -------------------------------------------------------
# tests/test_vae_cuda: the video ops bitwise and two decodes by NMSE against
# the CPU, none skipped; full mode then times one decode at Wan size on CUDA
# (latent 16x21x60x104 -> 81 frames of 480x832, random weights of the
# wan2.1 config), the number docs/GPU.md could only estimate before.
step_vae() {
    echo "== 8. the VAE decoder on CUDA (tests/test_vae_cuda)"
    run_logged vae-suite 120 "$BIN/test_vae_cuda"
    local log="$WORK/vae-suite.log" sum skip line
    skip=$(grep -m1 -E '(^|[^A-Za-z])SKIP' "$log")
    [ -z "$skip" ] || fail "the VAE suite skipped on a GPU machine: $skip"
    sum=$(grep -E '^[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$log" | tail -1)
    [ -n "$sum" ] || fail "the VAE suite printed no Check summary (exit $RC): $(lastline "$log")"
    [ "$RC" = 0 ] && echo "$sum" | grep -q "Failures: 0, Errors: 0" ||
        fail "the VAE suite: $sum; first: $(grep -m1 -E ':[FE]:' "$log")"
    row "VAE on CUDA (tests/test_vae_cuda)" "$sum" "video ops bitwise; decodes by nmse"
    [ "$MODE" = full ] || return 0
    prep vae-weights "$R" weights init-vae --config wan2.1 --seed 3 --out "$D/vae.st"
    prep vae-latent "$R" tensor rand --name latent --shape 16,21,60,104 --seed 5 --out "$D/vae-lat.st"
    run_logged vae-decode 150 "$R" decode --vae "$D/vae.st" "$D/vae-lat.st" -o "$D/vae-video.st" --backend cuda --quiet
    line=$(grep -m1 '^reelctl: decoded latent' "$WORK/vae-decode.log")
    [ "$RC" = 0 ] && [ -n "$line" ] || fail "reelctl decode on CUDA failed (exit $RC): $(lastline "$WORK/vae-decode.log")"
    echo "$line" | grep -q " on cuda:" || fail "reelctl decode did not run on CUDA: $line"
    rm -f "$D/vae-video.st"
    row "VAE decode wan2.1 on CUDA (latent 16x21x60x104, 81x480x832)" \
        "$(echo "$line" | sed -n 's/.* in \([0-9.]*\) s (\([0-9.]*\) s per latent frame).*/\1 s, \2 s a latent frame/p')" "runs on cuda"
}

# --- the steps, by the worth of their numbers ---------------------------------------------
run_step "one CFG step, eager vs replay (step 6)" step_steps
[ "$MODE" != full ] || run_step "wan2.1-1.3b step, decomposed path (step 6b)" step_steps_decomposed
[ "$MODE" != full ] || run_step "tiny and small steps (step 6c)" step_steps_small
run_step "attention at Wan size (step 5)" step_attention
run_step "CUDA suite (step 2)" step_suite
run_step "reelctl run, CUDA vs CPU (step 3)" step_runs
run_step "capture cache, 2 streams (step 4)" step_cache
run_step "cuDNN SDPA attention, the fused path (step 7)" step_cudnn
run_step "the VAE decoder on CUDA (step 8)" step_vae

trap '' INT TERM HUP # the verdict is being written: one, whatever comes now
if [ -s "$WORK/first-failure" ]; then
    VERDICT=fail
    print_table
    nf=$(grep -c "${SEP}FAIL\$" "$ROWS")
    echo "gpu-check: FAIL $(head -1 "$WORK/first-failure")$([ "$nf" -gt 1 ] && echo " (and $((nf - 1)) more failed rows above)")"
    exit 1
fi
VERDICT=pass
print_table
echo "gpu-check: PASS"
