#!/bin/sh
# demo_local.sh -- one process, no broker: a real multi-step CFG generation on
# the `small` config on the CPU backend, then a check that the run is
# deterministic and that graph replay equals eager, and what every stage did.
set -eu
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
R="$BUILD/reelctl"
D=$(mktemp -d /tmp/reel-demo.XXXXXX)
trap 'rm -rf "$D"' EXIT

say() { printf '\n== %s\n' "$*"; }

say "1. deterministic random weights for the small config (nothing to download)"
"$R" weights init --config small --seed 1 --out "$D/w.safetensors"
"$R" weights info "$D/w.safetensors"

say "2. inputs: a latent [16,4,16,16] (4 frames, 256 tokens), a prompt context and an empty-prompt context [16,256]"
"$R" tensor rand --name latent --shape 16,4,16,16 --seed 10 --out "$D/latent.safetensors"
"$R" tensor rand --name context --shape 16,256 --seed 11 --out "$D/ctx.safetensors"
"$R" tensor rand --name context --shape 16,256 --seed 12 --out "$D/unc.safetensors"

say "3. an 8-step flow-matching loop, shift 3, classifier-free guidance 5 (two forwards per step),
   each step dispatched through capture_cache: 2 warmup steps, capture + bitwise verify, then replay"
"$R" run --weights "$D/w.safetensors" --latent "$D/latent.safetensors" \
    --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" \
    --steps 8 --shift 3 --cfg 5 --backend cpu --out "$D/out.safetensors"
"$R" tensor info "$D/latent.safetensors"
"$R" tensor info "$D/out.safetensors"

say "4. the same loop with graphs off (pure eager) is bitwise identical to the replayed one"
"$R" run --weights "$D/w.safetensors" --latent "$D/latent.safetensors" \
    --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" \
    --steps 8 --shift 3 --cfg 5 --backend cpu --graphs off --out "$D/out2.safetensors"
if cmp -s "$D/out.safetensors" "$D/out2.safetensors"; then
    echo "identical: yes"
else
    echo "identical: NO -- determinism is broken" >&2
    exit 1
fi

say "5. a Flow-GRPO SDE rollout (eta 0.7, seed 3): noise from Philox keyed by (seed, step, index);
   SDE steps are eager breaks (not capturable), counted as such"
"$R" run --weights "$D/w.safetensors" --latent "$D/latent.safetensors" \
    --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" \
    --steps 4 --shift 3 --cfg 5 --sde --eta 0.7 --seed 3 --out "$D/sde.safetensors"
"$R" tensor info "$D/sde.safetensors"

say "6. kernels registered on this build"
"$R" kernels
echo
echo "demo: done"
