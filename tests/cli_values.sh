#!/bin/sh
# cli_values.sh -- values that are well formed but unusable, in reelctl and
# through a real reel-broker and reel-worker over ipc: a result of NaN or
# infinity is never returned (an overflowing guidance, shift or eta ends in
# a clear error, exit 2 or ERROR bad_request, and no file is written); a
# shift so extreme that a multistep solver's sigmas collapse is refused up
# front; a tiny shift (which once made Euler's first sigma infinite) runs;
# weights with a NaN are refused at load; an output path that is one of
# the command's inputs is refused, the input left as it was; a latent of
# zero frames or one too large for the VAE is refused, not "out of memory"
# or a video of NaN; a config past the machine's memory is refused before
# `weights init` allocates; a catalog row holding an infinity is shown, not
# taken for "out of memory"; `artifacts verify` of a folder with no bundle
# does not pass. Through the daemons, an overflow's ERROR names its cause:
# the request's value far outside what models step (bad_request), or, for
# usual values, the weights (internal: transformer or VAE); --max-tokens
# splits a group into batches that fit it. The daemons serve a good
# request after every bad one.
# Usage: cli_values.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-values.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
SUITE=values
. "$(dirname "$0")/lib_cli.sh"
PY=/usr/bin/python3

# expect CODE PATTERN -- CMD...: exit code CODE and stderr matching PATTERN
expect() {
    code=$1; pat=$2; shift 3
    timeout 120 "$@" >"$D/stdout" 2>"$D/stderr"
    rc=$?
    if [ "$rc" = "$code" ] && grep -qE -- "$pat" "$D/stderr"; then ok "exit $code /$pat/: $*"
    else bad "wanted exit $code /$pat/, got $rc: $*"; show "$D/stderr"; fi
}
# expect_out PATTERN -- CMD...: exit 0 and stdout matching PATTERN
expect_out() {
    pat=$1; shift 2
    timeout 120 "$@" >"$D/stdout" 2>"$D/stderr"
    rc=$?
    if [ "$rc" = 0 ] && grep -qE -- "$pat" "$D/stdout"; then ok "exit 0, stdout /$pat/: $*"
    else bad "wanted exit 0 and stdout /$pat/, got $rc: $*"; show "$D/stdout" "$D/stderr"; fi
}
# finite FILE: the file exists and every value of its tensors is finite
finite() {
    $PY - "$1" <<'EOF'
import sys, json, struct, numpy as np
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
for k, v in h.items():
    if k == '__metadata__': continue
    assert v['dtype'] == 'F32', v['dtype']
    a = np.frombuffer(b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]], np.float32)
    if not np.isfinite(a).all(): sys.exit(1)
EOF
}

W="$D/w.safetensors"
"$R" weights init --config tiny --seed 7 --out "$W" 2>/dev/null
"$R" tensor rand --name latent --shape 4,2,8,8 --seed 1 --out "$D/lat.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 3 --out "$D/unc.safetensors"
RUN="$R run --weights $W --latent $D/lat.safetensors --context $D/ctx.safetensors --steps 4"

# ---- reelctl run ------------------------------------------------------------
# An overflowing loop: exit 2, and nothing at --out (graphs on and off).
for g in on off; do
    rm -f "$D/o.safetensors"
    expect 2 "result holds NaN or infinite values" -- $RUN --graphs $g --shift 3 --sde --eta 1e10 --out "$D/o.safetensors"
    [ ! -e "$D/o.safetensors" ] && ok "no output written for an overflowing loop (graphs $g)" ||
        bad "an overflowing loop wrote its output (graphs $g)"
done
# Tiny shifts: Euler's sigmas stay finite (1e-30 made sigma_0 = 1/0).
for s in 1e-30 1e-300; do
    rm -f "$D/o.safetensors"
    expect 0 "Euler steps" -- $RUN --shift $s --out "$D/o.safetensors"
    finite "$D/o.safetensors" && ok "shift $s: a finite result" || bad "shift $s: the result is not finite"
done
# A multistep solver whose sigmas collapse is refused, naming the sigma;
# the same solvers at usual shifts run.
for sol in unipc dpm++; do
    re=$(printf '%s' "$sol" | sed 's/+/[+]/g')
    for s in 1e-50 1e30; do
        expect 2 "shift .* collapses the $re schedule of 4 steps: sigma [0-9]+" -- \
            $RUN --solver $sol --shift $s --out "$D/o.safetensors"
    done
    expect 0 "$re steps" -- $RUN --solver $sol --shift 5 --out "$D/o.safetensors"
done
# Weights holding a NaN or an infinity are refused at load, naming the tensor.
$PY - "$W" "$D" <<'EOF'
import sys, json, struct
b = bytearray(open(sys.argv[1], 'rb').read()); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
for name, val, out in (('blocks.1.ffn.0.weight', float('nan'), 'wnan'), ('blocks.0.modulation', float('inf'), 'winf')):
    c = bytearray(b); o = 8 + n + h[name]['data_offsets'][0] + 4 * 3
    c[o:o + 4] = struct.pack('<f', val)
    open(sys.argv[2] + '/' + out + '.safetensors', 'wb').write(c)
EOF
expect 2 "tensor blocks.1.ffn.0.weight holds a NaN or an infinity" -- \
    $R run --weights "$D/wnan.safetensors" --latent "$D/lat.safetensors" --context "$D/ctx.safetensors" --steps 2 --out "$D/o.safetensors"
expect 2 "tensor blocks.0.modulation holds a NaN or an infinity" -- \
    $R run --weights "$D/winf.safetensors" --latent "$D/lat.safetensors" --context "$D/ctx.safetensors" --steps 2 --graphs off --out "$D/o.safetensors"

# ---- outputs that are inputs ------------------------------------------------
cp "$W" "$D/w2.safetensors"; cp "$D/lat.safetensors" "$D/lat2.safetensors"
ln -s "$D/lat2.safetensors" "$D/latlink.safetensors"
expect 2 "would overwrite --weights" -- $R run --weights "$D/w2.safetensors" --latent "$D/lat.safetensors" --context "$D/ctx.safetensors" --steps 2 --out "$D/w2.safetensors"
expect 2 "would overwrite --latent" -- $R run --weights "$W" --latent "$D/latlink.safetensors" --context "$D/ctx.safetensors" --steps 2 --out "$D/lat2.safetensors"
expect 2 "would overwrite --uncond" -- $R run --weights "$W" --latent "$D/lat.safetensors" --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" --cfg 3 --steps 2 --out "$D/unc.safetensors"
cmp -s "$W" "$D/w2.safetensors" && cmp -s "$D/lat.safetensors" "$D/lat2.safetensors" &&
    ok "the inputs named at --out are untouched" || bad "an input named at --out was changed"
"$R" weights export "$W" --out "$D/rel" 2>/dev/null
cp "$D/rel/config.json" "$D/config.before"
expect 2 "would overwrite PATH" -- $R weights export "$D/rel" --out "$D/rel"
cmp -s "$D/rel/config.json" "$D/config.before" && ok "weights export into its own folder left it as it was" ||
    bad "weights export into its own folder changed config.json"
printf '{"name":"mini","dim":32,"heads":2,"layers":1,"ffn_dim":64,"in_channels":4,"text_dim":16,"freq_dim":256}' >"$D/mini.json"
expect 2 "would overwrite --config" -- $R weights init --config "$D/mini.json" --seed 1 --out "$D/mini.json"

# ---- sizes ----------------------------------------------------------------
printf '{"name":"huge","dim":65536,"heads":64,"layers":4,"ffn_dim":1024,"in_channels":4,"text_dim":32,"freq_dim":256}' >"$D/huge.json"
expect 2 "GiB of F32 weights, more than this machine's" -- $R weights init --config "$D/huge.json" --seed 1 --out "$D/h.safetensors"
[ ! -e "$D/h.safetensors" ] && ok "no file for a config past memory" || bad "a file was written for a config past memory"

# ---- the VAE ----------------------------------------------------------------
"$R" weights init-vae --config vae-tiny --seed 1 --out "$D/v.safetensors" 2>/dev/null
$PY - "$D" <<'EOF'
import sys, json, struct, numpy as np
def save(path, a):
    a = np.ascontiguousarray(a, np.float32); d = a.tobytes()
    h = json.dumps({'latent': {'dtype': 'F32', 'shape': list(a.shape), 'data_offsets': [0, len(d)]}}).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(h)) + h + d)
save(sys.argv[1] + '/vbig.safetensors', np.full((4, 2, 4, 4), 3e38))
save(sys.argv[1] + '/v0.safetensors', np.zeros((4, 0, 4, 4)))
save(sys.argv[1] + '/vok.safetensors', np.random.default_rng(1).standard_normal((4, 2, 4, 4)))
EOF
rm -f "$D/vo.safetensors"
expect 2 "latent frame 1 decodes to NaN or infinite values" -- $R decode --vae "$D/v.safetensors" "$D/vbig.safetensors" -o "$D/vo.safetensors" --quiet
[ ! -e "$D/vo.safetensors" ] && ok "no video written for a latent too large" || bad "a video was written for a latent too large"
expect 2 "latent \[4, 0, 4, 4\] out of range" -- $R decode --vae "$D/v.safetensors" "$D/v0.safetensors" -o "$D/vo.safetensors" --quiet
expect 2 "would overwrite --vae" -- $R decode --vae "$D/v.safetensors" "$D/vok.safetensors" -o "$D/v.safetensors" --quiet
expect 0 "decoded latent" -- $R decode --vae "$D/v.safetensors" "$D/vok.safetensors" -o "$D/vo.safetensors" --quiet

# ---- artifacts and the catalog ---------------------------------------------
mkdir -p "$D/noart"
expect 1 "holds no kernel artifact bundle" -- $R artifacts verify "$D/noart"
expect_out "^ID" -- $R artifacts list "$D/noart"

# ---- through the daemons ----------------------------------------------------
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$D/reel.db" --heartbeat-ms 200 ||
    { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "$WE" --weights "$W" --streams 1 --heartbeat-ms 200 ||
    { bad "worker registers"; finish; }
GEN="$R gen --broker $CE --model tiny --channels 4 --context $D/ctx.safetensors --size 2x8x8 --seed 3 --steps 4"
good() {
    rm -f "$D/g.safetensors"
    if $GEN --out "$D/g.safetensors" >"$D/g.log" 2>&1 && finite "$D/g.safetensors"; then ok "a good GEN after $1"
    else bad "a good GEN after $1"; show "$D/g.log"; fi
}
good "start"
rm -f "$D/g.safetensors"
expect 1 "bad_request: the loop's result holds NaN or infinite values" -- $GEN --sde --eta 1e10 --out "$D/g.safetensors"
[ ! -e "$D/g.safetensors" ] && ok "no RESULT for an overflowing GEN" || bad "an overflowing GEN wrote a result"
good "an overflowing GEN"
expect 1 "bad_request: .*the loop's (trajectory|means|log_probs|result) holds? NaN or infinite values" -- \
    $GEN --sde --eta 1e10 --log-probs --means --out "$D/g.safetensors"
good "an overflowing rollout"
expect 1 "bad_request: GEN: shift 1e\+30 collapses the unipc schedule" -- $GEN --solver unipc --shift 1e30 --out "$D/g.safetensors"
good "a collapsing schedule"
# The ERROR names the request's value that overflowed the loop.
expect 1 "bad_request: the loop's result holds NaN or infinite values after 4 steps: its eta 1e\+10 is far past" -- \
    $GEN --sde --eta 1e10 --out "$D/g.safetensors"
expect 1 "bad_request: .*its guidance scale 3e\+38 is far past" -- \
    $GEN --uncond "$D/unc.safetensors" --cfg 3e38 --out "$D/g.safetensors"
$PY - "$D" <<'EOF2'
import sys, json, struct, numpy as np
a = np.full((4, 2, 8, 8), 1.5e38, np.float32); d = a.tobytes()
h = json.dumps({'latent': {'dtype': 'F32', 'shape': list(a.shape), 'data_offsets': [0, len(d)]}}).encode()
h += b' ' * ((8 - len(h) % 8) % 8)
open(sys.argv[1] + '/hugelat.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h + d)
EOF2
expect 1 "bad_request: .*its latent holds values up to 1.5e\+38" -- \
    $R gen --broker "$CE" --model tiny --channels 4 --context "$D/ctx.safetensors" --latent "$D/hugelat.safetensors" \
    --steps 4 --out "$D/g.safetensors"
good "overflows named by their value"
expect 0 "steps" -- $GEN --shift 1e-30 --out "$D/g.safetensors"
finite "$D/g.safetensors" && ok "GEN with shift 1e-30: a finite result" || bad "GEN with shift 1e-30: not finite"
stop_proc "$WORKER"

# --max-tokens bounds every step: a group of 4 samples of 32 tokens on a
# worker allowing 64 runs as batches of 2 (8 batched steps for 4 steps,
# not 4), each sample still bitwise the same request alone.
cli_worker w2 "$D/broker.log" "$D/w2.log" --broker "$WE" --weights "$W" --streams 1 --heartbeat-ms 200 \
    --max-tokens 64 || { bad "worker w2 (--max-tokens 64) registers"; finish; }
PYTHONPATH=clients/python $PY - "$CE" "$D" >"$D/grp.out" 2>&1 <<'EOF2'
import sys, numpy as np, reel
ce, d = sys.argv[1:3]
ctx = np.random.default_rng(2).standard_normal((5, 32)).astype(np.float32)
with reel.Client(ce, timeout=60) as c:
    g = c.gen_group("tiny", ctx, n=4, steps=4, seed=11, latent_shape=(4, 2, 8, 8))
    steps = g[0].stats.get("captured", 0) + g[0].stats.get("replayed", 0) + g[0].stats.get("eager", 0)
    print(("PASS" if steps == 8 else "FAIL") + f" a group of 4 x 32 tokens under --max-tokens 64: {steps} batched steps (8: batches of 2)")
    same = all(np.array_equal(g[i].latent, c.gen("tiny", ctx, steps=4, seed=11 + i, latent_shape=(4, 2, 8, 8)).latent)
               for i in range(4))
    print(("PASS" if same else "FAIL") + " each sample of the group in batches of 2 is bitwise the request alone")
EOF2
py_checks "$D/grp.out" $?
stop_proc "$WORKER"

# Weights that pass the load checks (1e7 < 2^24) but overflow any step:
# a fine request is not blamed: internal, naming the weights.
$PY - "$W" "$D/w1e7.safetensors" <<'EOF2'
import sys, json, struct, numpy as np
b = bytearray(open(sys.argv[1], 'rb').read()); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
for k, v in h.items():
    if k == '__metadata__': continue
    o0, o1 = v['data_offsets']; b[8 + n + o0:8 + n + o1] = np.full((o1 - o0) // 4, 1e7, np.float32).tobytes()
open(sys.argv[2], 'wb').write(b)
EOF2
cli_worker w3 "$D/broker.log" "$D/w3.log" --broker "$WE" --weights "$D/w1e7.safetensors" --streams 1 \
    --heartbeat-ms 200 || { bad "worker w3 (weights of 1e7) registers"; finish; }
expect 1 "internal: the loop's result holds NaN or infinite values after 4 steps though the request's values are usual: the weights it ran on [(]transformer v1[)]" -- \
    $GEN --out "$D/g.safetensors"
stop_proc "$WORKER"

# A VAE whose weights (finite, 1e12 times the usual) overflow: a fine
# request's decoded video is NaN, and the ERROR blames the weights
# (internal), not the request; its latent alone still comes back.
$PY - "$D/v.safetensors" "$D/vhuge.safetensors" <<'EOF2'
import sys, json, struct, numpy as np
b = bytearray(open(sys.argv[1], 'rb').read()); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
for k, v in h.items():
    if k == '__metadata__': continue
    assert v['dtype'] == 'F32'
    o0, o1 = v['data_offsets']
    b[8 + n + o0:8 + n + o1] = (np.frombuffer(bytes(b[8 + n + o0:8 + n + o1]), np.float32) * 1e12).astype(np.float32).tobytes()
open(sys.argv[2], 'wb').write(b)
EOF2
cli_worker w4 "$D/broker.log" "$D/w4.log" --broker "$WE" --weights "$W" --vae "$D/vhuge.safetensors" --streams 1 \
    --heartbeat-ms 200 || { bad "worker w4 (a VAE of weights x 1e12) registers"; finish; }
expect 1 "internal: the loop's decoded video holds NaN or infinite values after 4 steps though the request's values are usual: the VAE's weights" -- \
    $GEN --output frames --out "$D/g.safetensors"
good "a VAE's overflow"
stop_proc "$WORKER"

# The catalog recorded the failures; a row holding an infinity is still
# shown (a corrupt or hostile catalog must not read as "out of memory").
stop_proc "$BROKER"
cp "$D/reel.db" "$D/inf.db"
/usr/bin/sqlite3 "$D/inf.db" "UPDATE requests SET t = 9e999 WHERE rowid = (SELECT min(rowid) FROM requests)"
expect 0 "report written" -- $R report --html "$D/r.html" --catalog "$D/inf.db"
expect_out "w1" -- $R requests --catalog "$D/inf.db"
finish
