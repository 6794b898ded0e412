#!/bin/bash
# cli_gpu_check.sh -- deploy/gpu-check.sh, driven without a GPU through a
# bundle of stubs (tests/gpu_check_stub.sh), proves that the check can fail:
# with everything well it passes (so the faults below are what fails it);
# with each fault a GPU machine can show (no GPU, a skipped or failing or
# too small suite, a CPU fallback loud or silent, graphs that differ from
# eager, a bad decline, missing audits, a missing or version-short library,
# a stale or absent bundle, a hang, a signal) it ends non-zero with exactly
# one final "gpu-check: FAIL <reason>" line naming the cause. Needs no build.
# Usage: cli_gpu_check.sh [BUILD]   (BUILD is unused; run_all.sh passes it)
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@" # run_all.sh runs it with sh
set -u
cd "$(dirname "$0")/.." || exit 1
T=$(mktemp -d /tmp/reel-gpucheck-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "PASS $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

# --- a bundle of stubs that hashes to this tree ----------------------------
. deploy/gpu-common.sh
mkdir -p "$T/stage/bin" "$T/stage/lib" "$T/fakebin" "$T/bundle"
for b in $GPU_BINS; do cp tests/gpu_check_stub.sh "$T/stage/bin/$(basename "$b")"; done
echo "not really a library" >"$T/stage/lib/libopenblas.so.0"
tar -C "$T/stage" -czf "$T/bundle/reel-gpu.tar.gz" bin lib
# Hashed again before each run: the tree may change while the test runs.
rehash() { gpu_sources | tr '\n' '\0' | xargs -0 sha256sum >"$T/bundle/SOURCES.sha256"; }
rehash
cat >"$T/bundle/MANIFEST" <<EOF
built_at=2026-01-01T00:00:00Z
built_on=test stubs
git_head=stub
sources_changed_since_head=0
nvcc=13.0
glibc_max=2.17
EOF
for t in ldd nvidia-smi; do cp tests/gpu_check_stub.sh "$T/fakebin/$t"; done
chmod +x "$T"/stage/bin/* "$T"/fakebin/*

# check NAME EXPECT PATTERN [GPU_FAKE faults] [-- gpu-check args]: runs the
# check; EXPECT pass needs exit 0 and a last line "gpu-check: PASS"; EXPECT
# fail needs exit != 0, a last line "gpu-check: FAIL ..." matching PATTERN,
# and no other verdict line.
check() {
    local name=$1 expect=$2 pat=$3 faults=${4:-}
    shift 4 2>/dev/null || shift $#
    [ "${1:-}" = -- ] && shift
    local out rc last verdicts
    rehash
    out=$(PATH="$T/fakebin:$PATH" GPU_FAKE="$faults" GPU_CHECK_BUDGET="${GCB:-}" OUT= timeout 100 deploy/gpu-check.sh --bundle "$T/bundle" "$@" 2>&1)
    rc=$?
    last=$(printf '%s\n' "$out" | tail -1)
    verdicts=$(printf '%s\n' "$out" | grep -c '^gpu-check: \(PASS\|FAIL\)')
    if [ "$expect" = pass ]; then
        if [ "$rc" = 0 ] && [ "$last" = "gpu-check: PASS" ] && [ "$verdicts" = 1 ]; then ok "$name: passes"
        else bad "$name: wanted PASS, got exit $rc, last line '$last'"; printf '%s\n' "$out" | tail -8 | sed 's/^/  | /'; fi
    else
        if [ "$rc" != 0 ] && [ "$verdicts" = 1 ] && [[ $last == "gpu-check: FAIL "* ]] && printf '%s' "$last" | grep -qE "$pat"; then
            ok "$name: $last"
        else
            bad "$name: wanted one final FAIL line matching /$pat/, got exit $rc, $verdicts verdict lines, last '$last'"
            printf '%s\n' "$out" | tail -8 | sed 's/^/  | /'
        fi
    fi
}

bash -n deploy/gpu-check.sh && bash -n deploy/gpu-bundle.sh && ok "the scripts parse" || bad "a script does not parse"

# --- a GPU machine where all is well ------------------------------------------
check "all well, --quick" pass "" "" -- --quick
check "all well, full" pass "" "" --
# What --quick itself costs (its steps' own work aside): said, not asserted.
rehash
t0=$(date +%s.%N)
PATH="$T/fakebin:$PATH" GPU_FAKE= OUT= deploy/gpu-check.sh --bundle "$T/bundle" --quick >/dev/null 2>&1
echo "info: --quick with the stand-in binaries took $(echo "$(date +%s.%N) $t0" | awk '{ printf "%.1f", $1 - $2 }') s of its 115 s budget"
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE= OUT= deploy/gpu-check.sh --bundle "$T/bundle" --quick 2>&1)
printf '%s\n' "$out" | grep -q '^| PASS | CUDA suite (tests/test_cuda) *| 48 checks, 0 failures' &&
    printf '%s\n' "$out" | grep -q '^| PASS | step small bf16 .*eager / replay *| 1.234 / 0.321 ms (3.84x), 148 nodes; reelctl plan on h200: 2 ms' &&
    printf '%s\n' "$out" | grep -q '^| PASS | cuDNN SDPA attention (the fused path) *| 100%: Checks: 1' &&
    ok "the PASS comes after one table of the numbers, a row per check" || bad "no table of numbers before the PASS"

# --- a failing step is a row; every later step still runs -------------------------
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE=suite_fail OUT= deploy/gpu-check.sh --bundle "$T/bundle" --quick 2>&1)
rc=$?
last=$(printf '%s\n' "$out" | tail -1)
printf '%s\n' "$out" | grep -q '^| FAIL | CUDA suite (step 2) *| the CUDA suite: 2 failures' &&
    printf '%s\n' "$out" | grep -q '^| PASS | step small bf16' &&
    printf '%s\n' "$out" | grep -q '^| PASS | tiny bf16 run on CUDA, graphs on vs off' &&
    printf '%s\n' "$out" | grep -q '^| PASS | cache bf16, 2 streams' &&
    printf '%s\n' "$out" | grep -q '^| PASS | cuDNN SDPA attention (the fused path)' && [ "$rc" != 0 ] &&
    [[ $last == "gpu-check: FAIL the CUDA suite: 2 failures"* ]] &&
    ok "a failing suite is one FAIL row; the runs, the cache and cuDNN after it still give their rows" ||
    { bad "a failing step stopped the rest (exit $rc, last '$last')"; printf '%s\n' "$out" | grep '^|' | sed 's/^/  | /'; }
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE="suite_fail graphs_differ" OUT= deploy/gpu-check.sh --bundle "$T/bundle" --quick 2>&1)
last=$(printf '%s\n' "$out" | tail -1)
[[ $last == "gpu-check: FAIL the CUDA suite: 2 failures"*"(and 1 more failed rows above)" ]] &&
    printf '%s\n' "$out" | grep -q '^| FAIL | reelctl run, CUDA vs CPU (step 3) *| tiny f32 run on CUDA, graphs on vs off' &&
    ok "two failing steps: two FAIL rows, the verdict names the first and counts the other" ||
    { bad "two failures: last '$last'"; printf '%s\n' "$out" | grep '^|' | sed 's/^/  | /'; }
check "no cuDNN on the machine: the fused-path row SKIPs, the rest passes" pass "" cudnn_missing -- --quick

# --- the Wan step on both attention paths (full mode) -------------------------------
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE= OUT= deploy/gpu-check.sh --bundle "$T/bundle" 2>&1)
printf '%s\n' "$out" | grep -q '^| PASS | step wan2.1-1.3b bf16 (21x60x104, text 512), attention sdpa: eager / replay *| 1.234 / 0.321 ms (3.84x), 148 nodes; reelctl plan' &&
    printf '%s\n' "$out" | grep -q '^| PASS | step wan2.1-1.3b bf16 (21x60x104, text 512), attention decomposed: eager / replay' &&
    printf '%s\n' "$out" | grep -q '^| PASS | wan2.1-1.3b step: fused SDPA vs decomposed latent *| nmse' &&
    printf '%s\n' "$out" | grep -q '^| PASS | VAE on CUDA (tests/test_vae_cuda) *| 100%: Checks: 4' &&
    printf '%s\n' "$out" | grep -q '^| PASS | VAE decode wan2.1 on CUDA (latent 16x21x60x104, 81x480x832) *| 12.345 s, 0.588 s a latent frame' &&
    [ "$(printf '%s\n' "$out" | grep -n '^| PASS | wan2.1-1.3b step: fused SDPA vs decomposed' | cut -d: -f1)" -lt \
      "$(printf '%s\n' "$out" | grep -n '^| PASS | step tiny bf16' | cut -d: -f1)" ] &&
    [ "$(printf '%s\n' "$out" | grep -n '^| PASS | step small bf16' | cut -d: -f1)" -lt \
      "$(printf '%s\n' "$out" | grep -n '^| PASS | attention bf16 self' | cut -d: -f1)" ] &&
    ok "full mode: the Wan step on the fused and on the decomposed path and their comparison first, then tiny and small, then the attention rows; the VAE's suite and its decode at Wan size" ||
    { bad "full mode: no Wan step on both paths"; printf '%s\n' "$out" | grep '^|' | sed 's/^/  | /'; }
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE=step_wan_fused OUT= deploy/gpu-check.sh --bundle "$T/bundle" 2>&1)
last=$(printf '%s\n' "$out" | tail -1)
printf '%s\n' "$out" | grep -q '^| FAIL | one CFG step, eager vs replay (step 6) *| step wan2.1-1.3b-auto: .*cuDNN has no plan' &&
    printf '%s\n' "$out" | grep -q '^| PASS | step wan2.1-1.3b bf16 (21x60x104, text 512), attention decomposed' &&
    printf '%s\n' "$out" | grep -q '^| SKIP | wan2.1-1.3b step: fused SDPA vs decomposed *| not compared: AUTO took nothing (its step failed)' &&
    [[ $last == "gpu-check: FAIL step wan2.1-1.3b-auto: "* ]] &&
    ok "a failing fused Wan step is a FAIL row; the decomposed Wan step still gives its number" ||
    { bad "fused Wan step failure (last '$last')"; printf '%s\n' "$out" | grep '^|' | sed 's/^/  | /'; }
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE=no_sdpa OUT= deploy/gpu-check.sh --bundle "$T/bundle" 2>&1)
printf '%s\n' "$out" | grep -q '^| SKIP | wan2.1-1.3b step: fused SDPA vs decomposed *| not compared: AUTO took decomposed' &&
    [ "$(printf '%s\n' "$out" | tail -1)" = "gpu-check: PASS" ] &&
    ok "no fused path: the comparison SKIPs and says AUTO took the decomposition" ||
    { bad "no fused path"; printf '%s\n' "$out" | grep '^|' | sed 's/^/  | /'; printf '%s\n' "$out" | tail -1; }
# An old driver: the toolkit's forward-compatibility libcuda is tried before failing.
mkdir -p "$T/compat" && echo "not really a library" >"$T/compat/libcuda.so.1"
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE=old_driver CUDA_COMPAT_DIR="$T/compat" OUT= deploy/gpu-check.sh --bundle "$T/bundle" --quick 2>&1)
rc=$?
[ "$rc" = 0 ] && printf '%s\n' "$out" | grep -q '^| PASS | CUDA forward compatibility *| the driver is too old for this CUDA' &&
    ok "an old driver: the forward-compatibility libraries are tried, and the check passes with them" ||
    { bad "old driver with compat: exit $rc"; printf '%s\n' "$out" | tail -5 | sed 's/^/  | /'; }
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE=old_driver CUDA_COMPAT_DIR="$T/none" OUT= deploy/gpu-check.sh --bundle "$T/bundle" --quick 2>&1)
rc=$?; last=$(printf '%s\n' "$out" | tail -1)
[ "$rc" != 0 ] && [[ $last == "gpu-check: FAIL no usable GPU: cudaGetDeviceCount: CUDA driver version is insufficient"* ]] &&
    ok "an old driver and no compat libraries: one FAIL naming the driver" || bad "old driver without compat: '$last'"
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE=cudnn_missing OUT= deploy/gpu-check.sh --bundle "$T/bundle" --quick 2>&1)
printf '%s\n' "$out" | grep -q '^| SKIP | cuDNN SDPA attention (the fused path) *| cudnn sdpa: built without cuDNN' &&
    ok "the SKIP row says why" || bad "no SKIP row for a missing cuDNN"
check "the fused cuDNN case fails: its own row, the verdict FAIL" fail "the cuDNN case: 0%: Checks: 1, Failures: 1" cudnn_fail -- --quick

# --- each fault fails the check, in one line ------------------------------------
check "the VAE suite prints SKIP" fail "the VAE suite skipped on a GPU machine" vae_skip -- --quick
check "the VAE suite fails" fail "the VAE suite: 75%: Checks: 4, Failures: 1" vae_fail -- --quick
check "the Wan-size VAE decode fails (full mode)" fail "reelctl decode on CUDA failed \(exit 1\): reelctl: decode: out of device memory" decode_fail --
check "no GPU (the probe fails)" fail "no usable GPU: no NVIDIA driver" probe -- --quick
check "suite prints SKIP and exits 0" fail "CUDA suite skipped" suite_skip -- --quick
check "suite skips one test loudly, passes the rest" fail "CUDA suite skipped" suite_loud_skip -- --quick
check "suite fails" fail "2 failures, 0 errors in 48 checks; first: tests/test_cuda.c:251" suite_fail -- --quick
check "suite fails but exits 0" fail "2 failures" "suite_fail suite_exit0" -- --quick
check "suite crashes (no summary)" fail "printed no Check summary \(exit 139\)" suite_crash -- --quick
check "suite passes with a bad exit status" fail "exited 3" suite_rc -- --quick
check "suite runs too few checks" fail "ran 3 checks" suite_few -- --quick
check "reelctl run falls back to the CPU, saying so" fail "fell back to the CPU" run_fallback -- --quick
check "reelctl run on 'CUDA' is bitwise the CPU's" fail "bitwise equal to the reference" silent_fallback -- --quick
check "graphs on differ from graphs off" fail "graph replay differs from eager on CUDA" graphs_differ -- --quick
check "reelctl run never replays" fail "captured 0 and replayed 0" no_replay -- --quick
check "reelctl run declines with capture_failed" fail "capture_failed" run_bad_decline -- --quick
check "CUDA vs CPU out of tolerance" fail "nmse above tolerance" cmp_nmse -- --quick
check "the worker falls back to the CPU" fail "worker fell back to the CPU" worker_fallback -- --quick
check "the worker runs one stream" fail "not on cuda with 2 streams" worker_one_stream -- --quick
check "a request fails" fail "request 1 failed" gen_fail -- --quick
check "the catalog records verify_mismatch" fail "bad decline" bad_decline -- --quick
check "replays not audited" fail "0 audited" no_audits -- --quick
check "an audit mismatch" fail "1 audit mismatches" audit_mismatch -- --quick
check "Wan attention out of tolerance" fail "attention self .*FAIL nmse" attn -- --quick
check "Wan attention ran on the CPU" fail "attention self .*did not run on cuda" attn_cpu -- --quick
check "step replay differs from eager" fail "graph replay differs from the eager step" step_replay -- --quick
check "step ran on the CPU" fail "did not run on cuda" step_cpu -- --quick
check "a CUDA library is missing" fail "missing on this machine: libcudnn_fake.so.9 \(for " missing_lib -- --quick
check "a library from outside the bundle" fail "outside the bundle and the allowed list: libzmq.so.5" outside_lib -- --quick
check "ldd cannot read the binaries" fail "ldd cannot read it" ldd_fails -- --quick
check "a binary does not start" fail "the bundled reel-worker does not start \(exit 127\)" no_start -- --quick
check "glibc symbol version missing" fail "missing on this machine: \[.*GLIBC_2.99" glibc_version -- --quick
GCB=15 check "the suite hangs (deadline 15 s)" fail "timed out after" suite_hang -- --quick
check "no bundle" fail "no bundle at" "" -- --quick --bundle "$T/none"
check "bad argument" fail "unknown argument" "" -- --bogus

# A bundle built from other sources is refused.
rehash
cp -r "$T/bundle" "$T/stale"
sed -i '1{s/^0/1/;t;s/^./0/}' "$T/stale/SOURCES.sha256" # its first hash, changed (whatever its first digit)
check "stale bundle" fail "the bundle is stale: 1 source file" "" -- --quick --bundle "$T/stale"
# A bundle that needs a newer glibc than this machine's.
rehash
cp -r "$T/bundle" "$T/newglibc"
sed -i 's/^glibc_max=.*/glibc_max=9.99/' "$T/newglibc/MANIFEST"
check "glibc too old" fail "glibc is [0-9.]+ and the bundle needs 9.99" "" -- --quick --bundle "$T/newglibc"

# A signal mid-run (the deadline's watchdog sends TERM) still ends in one FAIL line.
rehash
out=$(PATH="$T/fakebin:$PATH" GPU_FAKE=suite_hang OUT= timeout 60 bash -c '
    deploy/gpu-check.sh --quick --bundle "$1" & p=$!; sleep 4; kill -TERM $p; wait $p' _ "$T/bundle" 2>&1)
rc=$?; last=$(printf '%s\n' "$out" | tail -1)
[ "$rc" != 0 ] && [[ $last == "gpu-check: FAIL "* ]] && ok "SIGTERM mid-run: $last" ||
    bad "SIGTERM mid-run: exit $rc, last '$last'"

# With $OUT set the log is kept there and the verdict is unchanged.
mkdir -p "$T/out"
rehash
PATH="$T/fakebin:$PATH" GPU_FAKE=probe OUT="$T/out" deploy/gpu-check.sh --quick --bundle "$T/bundle" >/dev/null 2>&1
rc=$?
[ "$rc" != 0 ] && tail -1 "$T/out/gpu-check.log" | grep -q "^gpu-check: FAIL no usable GPU" &&
    ok "\$OUT/gpu-check.log ends with the verdict, exit $rc" || bad "\$OUT log: exit $rc, $(tail -1 "$T/out/gpu-check.log" 2>&1)"

# deploy/gpu-bench.sh (issue 29's benches on the device) on the same stubs:
# both benches run and it passes; a bench that fails, a stale bundle and no
# bundle each end in one "gpu-bench: FAIL" line naming it.
bench() { # NAME EXPECT PATTERN FAULTS BUNDLE
    local out rc last
    rehash
    out=$(PATH="$T/fakebin:$PATH" GPU_FAKE="$4" OUT= timeout 60 deploy/gpu-bench.sh --bundle "$5" 2>&1)
    rc=$?; last=$(printf '%s\n' "$out" | tail -1)
    if [ "$2" = pass ]; then
        [ "$rc" = 0 ] && [ "$last" = "gpu-bench: PASS" ] && printf '%s\n' "$out" | grep -q "^mix step tiny" &&
            printf '%s\n' "$out" | grep -q "^tiny   off" && ok "gpu-bench $1: passes" ||
            { bad "gpu-bench $1: wanted PASS, got exit $rc, last '$last'"; printf '%s\n' "$out" | tail -5 | sed 's/^/  | /'; }
    else
        [ "$rc" != 0 ] && [[ $last == "gpu-bench: FAIL "* ]] && printf '%s' "$last" | grep -qE "$3" && ok "gpu-bench $1: $last" ||
            { bad "gpu-bench $1: wanted FAIL /$3/, got exit $rc, last '$last'"; printf '%s\n' "$out" | tail -5 | sed 's/^/  | /'; }
    fi
}
bash -n deploy/gpu-bench.sh && ok "gpu-bench.sh parses" || bad "gpu-bench.sh does not parse"
bench "all well" pass "" "" "$T/bundle"
bench "a bench fails" fail "bench_mix_step exited 1" bench_fail "$T/bundle"
rehash
bench "stale bundle" fail "the bundle is stale: 1 source file" "" "$T/stale"
bench "no bundle" fail "no bundle at" "" "$T/nowhere"

echo "gpu-check-selftest: $pass passed, $fail failed"
[ "$fail" = 0 ]
