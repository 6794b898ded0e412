#!/bin/sh
# isa_levels.sh -- the CPU path gives the same bits at every x86 level
# (make test-isa). The kernels promise it (kernels/cpu/cpu_vmath.h: IEEE
# operations only, every fused multiply-add written out, the same order of
# every sum whatever the vector width), and tests/test_vmath.c checks the
# element-wise functions level by level; this checks whole loops, end to
# end: reelctl run of tiny (CFG Euler, SDE with eta, UniPC; 4 steps) and of
# small (CFG, 2 steps) from three builds, the dispatching one (the best
# level this CPU has) and two built for one level each with dispatch off
# (x86-64-v3 and baseline x86-64), and every latent must be the same bytes.
# OpenBLAS picks its own kernels by CPU in every build alike, so the GEMMs
# agree by construction: what differs between the builds is Reel's code.
# A difference that only rare inputs show can pass here: GCC 12's fused
# multiply-add-subtract in the fused RMSNorm + RoPE (docs/BENCH.md) gave
# these runs the same bytes; near-cancelling inputs (test_ops_cpu) and a
# scan of the machine code (tests/cli_fp_contract.sh) are what see it.
# Usage: isa_levels.sh REF_BUILD BUILD...   (each with a reelctl)
set -u
[ $# -ge 2 ] || { echo "usage: $0 REF_BUILD BUILD..." >&2; exit 2; }
REF=$1
shift
SUITE=isa
D=$(mktemp -d /tmp/reel-isa.XXXXXX)
. "$(dirname "$0")/lib_cli.sh"
R0="$REF/reelctl"
"$R0" weights init --config tiny --seed 1 --out "$D/tiny.st" >/dev/null 2>&1 &&
    "$R0" weights init --config small --seed 2 --out "$D/small.st" >/dev/null 2>&1 &&
    "$R0" tensor rand --name context --shape 5,32 --seed 3 --out "$D/ctx.st" >/dev/null &&
    "$R0" tensor rand --name context --shape 5,32 --seed 4 --out "$D/unc.st" >/dev/null &&
    "$R0" tensor rand --name context --shape 16,256 --seed 6 --out "$D/sctx.st" >/dev/null &&
    "$R0" tensor rand --name context --shape 16,256 --seed 7 --out "$D/sunc.st" >/dev/null ||
    { bad "cannot make the inputs with $R0"; finish; }

# runs BUILD OUT: the four loops into OUT/
runs() {
    mkdir -p "$2"
    T="--weights $D/tiny.st --context $D/ctx.st --uncond $D/unc.st --cfg 4 --size 2x8x8 --seed 5 --steps 4"
    # shellcheck disable=SC2086
    "$1/reelctl" run $T --out "$2/euler.st" >"$2/euler.log" 2>&1 &&
        "$1/reelctl" run $T --sde --eta 0.7 --out "$2/sde.st" >"$2/sde.log" 2>&1 &&
        "$1/reelctl" run $T --solver unipc --out "$2/unipc.st" >"$2/unipc.log" 2>&1 &&
        "$1/reelctl" run --weights "$D/small.st" --context "$D/sctx.st" --uncond "$D/sunc.st" --cfg 5 \
            --size 2x16x16 --seed 8 --steps 2 --out "$2/small.st" >"$2/small.log" 2>&1
}
runs "$REF" "$D/ref" || { bad "the reference build's runs: $(tail -1 "$D"/ref/*.log | tail -1)"; }
i=0
for b in "$@"; do
    i=$((i + 1))
    if ! runs "$b" "$D/b$i"; then
        bad "$b: a run failed: $(cat "$D/b$i"/*.log | tail -1)"
        continue
    fi
    for f in euler sde unipc small; do
        if cmp -s "$D/ref/$f.st" "$D/b$i/$f.st"; then
            ok "$b: $f's latent is the same bytes as $REF's"
        else
            bad "$b: $f's latent differs from $REF's: $("$R0" tensor diff "$D/ref/$f.st" "$D/b$i/$f.st" | tail -1)"
        fi
    done
done
finish
