#!/bin/bash
# gpu-check.sh -- the device checks, as one prepared script for a machine
# with an NVIDIA GPU (sm_80+): builds with CUDA, runs the CUDA suite (CUDA
# vs CPU NMSE in F32 and BF16, graph replay bitwise equal to eager), a
# reelctl run on CUDA compared with the CPU, and the kernel and capture
# benchmarks (CUDA eager vs CUDA graph, wan2.1-1.3b-width blocks). Output
# goes to stdout and, when $OUT is set, to $OUT/gpu-check.log.
# Usage: deploy/gpu-check.sh   (about 5 minutes on an H200)
set -u
cd "$(dirname "$0")/.."
if [ -n "${OUT:-}" ]; then exec > >(tee "$OUT/gpu-check.log") 2>&1; fi
BUILD=${BUILD:-build}
nvidia-smi -L 2>/dev/null || echo "gpu-check: nvidia-smi not found"
deploy/install-deps.sh || exit 1
make -j"$(nproc)" BUILD="$BUILD" all || exit 1
echo "== CUDA suite"
timeout 300 "$BUILD/tests/test_cuda"
echo "== reelctl run: CUDA vs CPU on the tiny config"
R="$BUILD/reelctl"
D=$(mktemp -d /tmp/reel-gpu.XXXXXX)
"$R" weights init --config tiny --seed 7 --out "$D/w.safetensors"
"$R" tensor rand --name latent --shape 4,2,8,8 --seed 1 --out "$D/l.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/c.safetensors"
for b in cpu cuda; do
    "$R" run --weights "$D/w.safetensors" --latent "$D/l.safetensors" --context "$D/c.safetensors" \
        --uncond "$D/c.safetensors" --cfg 4 --steps 8 --shift 3 --backend "$b" --out "$D/$b.safetensors"
done
"$R" tensor diff "$D/cpu.safetensors" "$D/cuda.safetensors"
rm -rf "$D"
echo "== benchmarks"
timeout 600 "$BUILD/bench/bench_kernels" "$BUILD"
timeout 600 "$BUILD/bench/bench_capture" "$BUILD"
echo "gpu-check: done"
