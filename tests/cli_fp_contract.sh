#!/bin/sh
# cli_fp_contract.sh -- no fused multiply-add-subtract in Reel's objects.
# The CPU kernels promise the same bits on every x86 level (and the fused
# kernels the bits of the unfused ones) because -std=c17 leaves no
# multiply-add contracted: every FMA Reel runs is one it wrote (fmaf,
# cpu_vfma). GCC 12's vectoriser breaks that in one place, its add-sub
# pattern: a·c − b·s next to a·s + b·c became vfmaddsub in the AVX2 and
# AVX-512 builds of the fused RMSNorm + RoPE (cpu_arith.h, cpu_opaque).
# Reel writes no add-sub FMA of its own, so any vfmaddsub or vfmsubadd in
# libreel.a, the binaries or the CPU artifacts is that pattern again. First it shows the scan
# can fail: a pair turn written plainly, compiled as the kernels are
# (-std=c17 -O2, target_clones for x86-64-v4/-v3), must come out with one
# on this compiler (or the line says the compiler no longer does it).
# Usage: cli_fp_contract.sh BUILD
set -u
B="${1:-build}"
cd "$(dirname "$0")/.."
SUITE=fp_contract
D=$(mktemp -d /tmp/reel-fpc.XXXXXX)
. tests/lib_cli.sh
CC="${CC:-cc}"

if [ "$(uname -m)" != x86_64 ]; then
    echo "$SUITE: SKIP: the scan reads x86 instructions; this machine is $(uname -m)"
    exit 0
fi
if ! command -v objdump >/dev/null; then
    bad "objdump (binutils) is missing: the scan cannot run"
    finish
fi

# 1. the checker on a known case
cat >"$D/turn.c" <<'EOF'
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void turn(float *x, const double *cs, long n) {
    for (long j = 0; j < n; j++) {
        double u = x[2 * j], w = x[2 * j + 1], c = cs[2 * j], s = cs[2 * j + 1];
        x[2 * j] = (float)(u * c - w * s);
        x[2 * j + 1] = (float)(u * s + w * c);
    }
}
EOF
if ! $CC -std=c17 -O2 -c "$D/turn.c" -o "$D/turn.o" 2>"$D/cc.err"; then
    bad "the known case does not compile: $(head -3 "$D/cc.err")"
elif objdump -d --no-show-raw-insn "$D/turn.o" | grep -qE "vfmaddsub|vfmsubadd"; then
    ok "the scan finds the add-sub pattern's vfmaddsub in a plainly written pair turn (this compiler: $($CC --version | head -1))"
else
    ok "this compiler ($($CC --version | head -1)) no longer fuses the plainly written pair turn: the scan below still guards"
fi

# 2. Reel's own objects
for f in "$B/libreel.a" "$B/reel-broker" "$B/reel-worker" "$B/reelctl" $(ls "$B"/artifacts/cpu_*/*.so 2>/dev/null); do
    if [ ! -f "$f" ]; then
        bad "$f is missing (build first)"
        continue
    fi
    objdump -d --no-show-raw-insn "$f" >"$D/dis" 2>/dev/null
    n=$(grep -cE "vfmaddsub|vfmsubadd" "$D/dis")
    if [ "$n" = 0 ]; then
        ok "$f: no fused multiply-add-subtract"
    else
        fns=$(awk '/^[0-9a-f]+ </ { f = $2 } /vfmaddsub|vfmsubadd/ { print f }' "$D/dis" | sort -u | head -5 | tr '\n' ' ')
        bad "$f: $n fused multiply-add-subtract instructions, in $fns(a product the source rounds is not rounded there: see cpu_opaque in kernels/cpu/cpu_arith.h)"
    fi
done

finish
