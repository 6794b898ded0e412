#!/bin/sh
# cli_run.sh -- reelctl's contract at the process level: bad input exits 2
# with a message naming the problem, good input writes a result, and a
# missing GPU falls back to the CPU with one line. Usage: cli_run.sh BUILD
set -u
R="${1:-build}/reelctl"
D=$(mktemp -d /tmp/reel-cli.XXXXXX)
trap 'rm -rf "$D"' EXIT
pass=0; fail=0

# expect CODE PATTERN -- CMD...: exit code CODE and stderr matching PATTERN
expect() {
    code=$1; pat=$2; shift 3
    timeout 120 "$@" >"$D/stdout" 2>"$D/stderr"
    rc=$?
    if [ "$rc" = "$code" ] && grep -qE -- "$pat" "$D/stderr"; then
        pass=$((pass + 1)); echo "PASS exit $code /$pat/: $*"
    else
        fail=$((fail + 1)); echo "FAIL wanted exit $code /$pat/, got $rc: $*"; sed 's/^/    /' "$D/stderr"
    fi
}

W="$D/w.safetensors"
"$R" weights init --config tiny --seed 7 --out "$W" 2>/dev/null
"$R" tensor rand --name latent --shape 4,2,8,8 --seed 1 --out "$D/lat.safetensors"
"$R" tensor rand --name latent --shape 3,2,8,8 --seed 1 --out "$D/lat3.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
"$R" tensor rand --name context --shape 5,31 --seed 2 --out "$D/ctx31.safetensors"
"$R" tensor rand --name other --shape 5,32 --seed 2 --out "$D/noctx.safetensors"
printf 'not a safetensors file' > "$D/junk.safetensors"
RUN="$R run --weights $W --context $D/ctx.safetensors --steps 2 --out $D/o.safetensors"
/usr/bin/python3 -c 'import sys; sys.path.insert(0, sys.argv[2]); import numpy as np, safetensors_np as s
a = np.ones((5, 32), np.float32); a[1, 2] = np.nan; s.save(sys.argv[1], {"context": a})' "$D/nanctx.safetensors" tests/crosscheck
mkfifo "$D/fifo.safetensors"

expect 0 "2 Euler steps" -- $RUN --latent "$D/lat.safetensors"
expect 0 "with CFG" -- $RUN --latent "$D/lat.safetensors" --uncond "$D/ctx.safetensors" --cfg 3
expect 0 "SDE" -- $RUN --size 2x8x8 --seed 4 --sde --eta 0.5
# The CPU thread pool's size changes no bit (kernels/cpu/cpu_pool.h): at
# small's width the GEMMs run as tiles and attention in lanes, differently
# shared out over 1, 3 and 16 threads (16: more threads than tiles, so
# tiles and attention blocks are cut where OpenBLAS keeps their bits,
# ops_gemm.c); the outputs must be the same bytes.
"$R" weights init --config small --seed 3 --out "$D/small.safetensors" 2>/dev/null
"$R" tensor rand --name context --shape 8,256 --seed 2 --out "$D/sctx.safetensors"
for t in 1 3 16; do
    REEL_THREADS=$t timeout 300 "$R" run --weights "$D/small.safetensors" --context "$D/sctx.safetensors" \
        --uncond "$D/sctx.safetensors" --cfg 4 --size 2x16x16 --seed 5 --steps 2 --out "$D/pool$t.safetensors" \
        >/dev/null 2>"$D/pool$t.log" || echo "reelctl run with REEL_THREADS=$t failed: $(cat "$D/pool$t.log")"
done
for t in 3 16; do
    if [ -s "$D/pool1.safetensors" ] && cmp -s "$D/pool1.safetensors" "$D/pool$t.safetensors"; then
        pass=$((pass + 1)); echo "PASS small with REEL_THREADS=1 and $t: the same bytes"
    else
        fail=$((fail + 1)); echo "FAIL small with REEL_THREADS=1 and $t differ (or did not run)"
    fi
done
expect 2 "unknown or incomplete option '--bogus'" -- $RUN --latent "$D/lat.safetensors" --bogus
expect 2 "latent has 3 channels" -- $RUN --latent "$D/lat3.safetensors"
expect 2 "context width 31" -- $R run --weights "$W" --context "$D/ctx31.safetensors" --latent "$D/lat.safetensors" --steps 1 --out "$D/o.safetensors"
expect 2 "size" -- $R run --weights "$W" --context "$D/ctx.safetensors" --size 1x65536x65536 --steps 1 --out "$D/o.safetensors"
expect 2 "tensor 'context' holds NaN or infinite values" -- $R run --weights "$W" --context "$D/nanctx.safetensors" --latent "$D/lat.safetensors" --steps 1 --out "$D/o.safetensors"
# found before the run, as every output that cannot go where asked (exit 2; it was 1, after the loop)
expect 2 "fifo.safetensors: exists and is not a regular file" -- $R run --weights "$W" --context "$D/ctx.safetensors" --latent "$D/lat.safetensors" --steps 1 --out "$D/fifo.safetensors"
[ -p "$D/fifo.safetensors" ] && { pass=$((pass + 1)); echo "PASS the FIFO at --out is left a FIFO"; } ||
    { fail=$((fail + 1)); echo "FAIL the FIFO at --out was replaced"; }
expect 2 "no tensor named 'context'" -- $R run --weights "$W" --context "$D/noctx.safetensors" --latent "$D/lat.safetensors" --steps 1 --out "$D/o.safetensors"
expect 2 "junk.safetensors" -- $RUN --latent "$D/junk.safetensors"
expect 2 "--cfg needs --uncond" -- $RUN --latent "$D/lat.safetensors" --cfg 4
expect 2 "--steps: 'x'" -- $RUN --latent "$D/lat.safetensors" --steps x
expect 2 "steps must be in" -- $RUN --latent "$D/lat.safetensors" --steps 0
expect 2 "even" -- $RUN --size 2x7x8
expect 2 "'huge' is neither a built-in config" -- $R weights init --config huge --out "$D/x.safetensors"
expect 2 "unknown command" -- $R frobnicate
# Without a usable GPU, --backend cuda says why in one line and uses the CPU;
# with one, it runs on it. Either way the run succeeds.
expect 0 "cuda:0|using the CPU backend" -- $RUN --latent "$D/lat.safetensors" --backend cuda
# With --no-fallback an unusable CUDA is an error (exit 1), never a CPU run.
if "$R" run --weights "$D/w.safetensors" --context "$D/ctx.safetensors" --steps 2 --latent "$D/lat.safetensors" \
    --backend cuda --no-fallback --out "$D/nf.safetensors" >"$D/nf.log" 2>&1; then
    if grep -q " on cuda:" "$D/nf.log"; then pass=$((pass + 1)); echo "PASS --no-fallback ran on CUDA"
    else fail=$((fail + 1)); echo "FAIL --no-fallback succeeded without CUDA"; fi
else
    rc=$?
    if [ "$rc" = 1 ] && grep -q "no-fallback" "$D/nf.log" && ! grep -q "using the CPU" "$D/nf.log"; then
        pass=$((pass + 1)); echo "PASS --no-fallback without a GPU exits 1 and says why"
    else fail=$((fail + 1)); echo "FAIL --no-fallback: exit $rc: $(cat "$D/nf.log")"; fi
fi
# The worker's --no-fallback: without a GPU it stops at once (exit 1) and
# says why, never serving on the CPU; with one it starts (no broker here:
# it is stopped after its first lines).
timeout 10 "${R%/reelctl}/reel-worker" --name nf --weights "$D/w.safetensors" --backend cuda --no-fallback \
    --broker "ipc://$D/nobroker" >"$D/wnf.log" 2>&1
rc=$?
if grep -q "ready (cuda" "$D/wnf.log"; then pass=$((pass + 1)); echo "PASS reel-worker --no-fallback starts on CUDA"
elif [ "$rc" = 1 ] && grep -q "no-fallback was given" "$D/wnf.log" && ! grep -q "using the CPU" "$D/wnf.log"; then
    pass=$((pass + 1)); echo "PASS reel-worker --no-fallback without a GPU exits 1 and says why"
else fail=$((fail + 1)); echo "FAIL reel-worker --no-fallback: exit $rc: $(tail -2 "$D/wnf.log")"; fi

# Any config given in a weights file's metadata runs (here from a JSON file).
printf '{"name":"mini","dim":32,"heads":2,"layers":1,"ffn_dim":64,"in_channels":4,"text_dim":16,"freq_dim":256}' > "$D/mini.json"
expect 0 "wrote .*config mini" -- $R weights init --config "$D/mini.json" --seed 3 --out "$D/mini.safetensors"
"$R" tensor rand --name context --shape 3,16 --seed 2 --out "$D/ctx16.safetensors"
expect 0 "mini on cpu" -- $R run --weights "$D/mini.safetensors" --context "$D/ctx16.safetensors" --size 1x4x4 --seed 1 --steps 2 --out "$D/o.safetensors"
printf '{"name":"bad","dim":30,"heads":4,"layers":1,"ffn_dim":64,"in_channels":4,"text_dim":16,"freq_dim":256}' > "$D/bad.json"
expect 2 "not divisible by heads" -- $R weights init --config "$D/bad.json" --out "$D/x.safetensors"

# --help / -h anywhere after the command: its usage on stdout, exit 0 (an
# unknown command stays a usage error). Every command the overview lists
# (its entry lines, the catalog's "stats | keys | ..." line word by word,
# "artifacts list|verify|report" each) answers with its own usage: a
# synopsis naming it, its lines of the overview, its options; a flag it
# does not know prints that usage on stderr before the error, exit 2.
$R --help >"$D/all.out" 2>"$D/all.err" && [ ! -s "$D/all.err" ] && grep -q "^exit codes: " "$D/all.out" &&
    { pass=$((pass + 1)); echo "PASS reelctl --help: the overview on stdout, exit 0"; } ||
    { fail=$((fail + 1)); echo "FAIL reelctl --help"; }
/usr/bin/python3 - "$D/all.out" >"$D/cmds" <<'PYEOF'
import re, sys
seen = set()
for n, line in enumerate(open(sys.argv[1]).read().split("\n"), 1):
    if line.startswith("  stats | "):  # one line, six reports
        cmds = [w.split()[0] for w in line.split("|")]
    else:  # "  CMD [SUB|SUB] " then an option, an argument or the end
        m = re.match(r"^  ([a-z][a-z0-9-]*)( [a-z][a-z0-9|-]*)?( +[-\[A-Z(]|$)", line)
        if not m:
            continue
        cmds = [m.group(1) + " " + s for s in m.group(2).split()[0].split("|")] if m.group(2) else [m.group(1)]
    for c in cmds:
        if c not in seen:
            seen.add(c)
            print(f"{n} {c}")
PYEOF
[ "$(wc -l <"$D/cmds")" -ge 30 ] && { pass=$((pass + 1)); echo "PASS the overview lists $(wc -l <"$D/cmds") commands"; } ||
    { fail=$((fail + 1)); echo "FAIL the commands of the overview: $(tr '\n' ';' <"$D/cmds")"; }
while read -r n c; do
    line=$(sed -n "${n}p" "$D/all.out")
    set -- $c
    # its overview line, or for a catalog report its own synopsis
    case "$line" in "  stats | "*) named="^  $c \\[" ;; *) named="" ;; esac
    if $R "$@" --help >"$D/h.out" 2>"$D/h.err" && [ ! -s "$D/h.err" ] && head -1 "$D/h.out" | grep -q "^usage: reelctl $c " &&
        if [ -n "$named" ]; then grep -q "$named" "$D/h.out"; else grep -qxF -- "$line" "$D/h.out"; fi &&
        grep -q "^options:$" "$D/h.out"; then
        pass=$((pass + 1)); echo "PASS reelctl $c --help: its usage and options on stdout, exit 0"
    else
        fail=$((fail + 1)); echo "FAIL reelctl $c --help"; sed 's/^/  | /' "$D/h.out" "$D/h.err" | head -5
    fi
    $R "$@" --no-such-flag >"$D/u.out" 2>"$D/u.err"; rc=$?
    if [ "$rc" = 2 ] && [ ! -s "$D/u.out" ] && head -1 "$D/u.err" | grep -q "^usage: reelctl $c " &&
        grep -q "^options:$" "$D/u.err" && tail -1 "$D/u.err" | grep -q "^reelctl: .*'--no-such-flag'$"; then
        pass=$((pass + 1)); echo "PASS reelctl $c --no-such-flag: its usage on stderr, then the error, exit 2"
    else
        fail=$((fail + 1)); echo "FAIL reelctl $c --no-such-flag (exit $rc)"; sed 's/^/  | /' "$D/u.err" | tail -5
    fi
done <"$D/cmds"
# a subcommand's usage is its own, not its group's
$R weights init-t5 --help >"$D/h.out" 2>&1 && grep -q "^  --dtype f32|bf16 .*(default f32)$" "$D/h.out" &&
    ! grep -q "^  weights init --config\|^  weights export\|^  weights inspect" "$D/h.out" &&
    $R keys new --help >"$D/k.out" 2>&1 && grep -q "^  --force " "$D/k.out" && ! grep -q "^  stats | \|^  keys \[" "$D/k.out" &&
    { pass=$((pass + 1)); echo "PASS weights init-t5 and keys new --help: their own options only, with defaults"; } ||
    { fail=$((fail + 1)); echo "FAIL weights init-t5 / keys new --help"; sed 's/^/  | /' "$D/h.out" "$D/k.out" | head -20; }
# a group answers with its subcommands
$R weights --help >"$D/h.out" 2>&1 && grep -q "^usage: reelctl weights SUBCOMMAND " "$D/h.out" &&
    grep -q "^  weights init-t5 " "$D/h.out" && grep -q "^  weights export " "$D/h.out" &&
    { pass=$((pass + 1)); echo "PASS reelctl weights --help: every weights subcommand"; } ||
    { fail=$((fail + 1)); echo "FAIL weights --help"; sed 's/^/  | /' "$D/h.out" | head -8; }
$R run --weights x -h >"$D/h.out" 2>&1 && grep -q "^  run --weights" "$D/h.out" && ! grep -q "^  gen " "$D/h.out" &&
    { pass=$((pass + 1)); echo "PASS reelctl run ... -h: run's usage only"; } || { fail=$((fail + 1)); echo "FAIL run -h"; }
expect 2 "unknown command 'bogus'" -- $R bogus --help
# the daemons: --help and -h print the usage on stdout, exit 0
for p in reel-broker reel-worker; do
    for h in --help -h; do
        if "$(dirname "$R")/$p" $h >"$D/h.out" 2>"$D/h.err" && [ ! -s "$D/h.err" ] && grep -q "^usage: $p" "$D/h.out"; then
            pass=$((pass + 1)); echo "PASS $p $h: its usage on stdout, exit 0"
        else
            fail=$((fail + 1)); echo "FAIL $p $h"; sed 's/^/  | /' "$D/h.out" "$D/h.err" | head -5
        fi
    done
done

echo "cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
