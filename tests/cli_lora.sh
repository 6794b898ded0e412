#!/bin/sh
# cli_lora.sh -- process-level tests of issue 27's LoRA syncs: a real
# reel-broker and reel-worker (--lora) over ipc, PEFT adapters written by
# tests/crosscheck/test_lora.py's writer, published with `reelctl sync
# --lora DIR --base B`. Every GEN after a LoRA sync must equal `reelctl run
# --lora` on the same base bitwise (itself checked against numpy's
# W + s*B@A by the cross-check); switching adapters back and forth gives
# bitwise the first result again (a PEFT DoRA adapter among them);
# `--lora none` returns to the base (after the DoRA adapter); the
# one graph captured before the syncs serves every version after them
# (the worker's closing counts: no eviction before the full sync, the one
# at the stop aside); a full sync makes
# a new base; bad adapters, a wrong base and a worker without --lora are
# refused by name and change nothing. Every wait is bounded.
# Usage: cli_lora.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d /tmp/reel-lora.XXXXXX)
SUITE=lora
. "$(dirname "$0")/lib_cli.sh"
CE="ipc://$D/clients.ipc"
WE="ipc://$D/workers.ipc"

mkdir -p "$D/w"
"$R" weights init --config tiny --seed 7 --out "$D/w/base.safetensors" 2>/dev/null &&
    "$R" weights init --config tiny --seed 8 --out "$D/w/base2.safetensors" 2>/dev/null || { bad "weights init"; finish; }
/usr/bin/python3 - "$HERE/crosscheck" "$D/w" <<'EOF' || { bad "adapters written"; finish; }
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_np, test_lora
d = sys.argv[2]
base, meta = safetensors_np.load(d + "/base.safetensors")
L = range(int(meta["layers"]))
test_lora.write_adapter(d + "/x", base, L, test_lora.WAN_MODULES[:8], 4, 8, seed=1)
test_lora.write_adapter(d + "/y", base, L, ["ffn.0", "ffn.2", "self_attn.q"], 2, 4, rslora=True,
                        layout="diffusers", dtype="BF16", seed=2)
test_lora.write_adapter(d + "/dora", base, L, test_lora.WAN_MODULES[:4], 4, 8, config_extra={"use_dora": True})
# PEFT's DoRA: use_dora with a lora_magnitude_vector per target
test_lora.write_adapter(d + "/dorad", base, L, test_lora.WAN_MODULES[:4] + ["ffn.0"], 4, 8, seed=6, dora=True)
# the same whose row 0 of block 0's q is W - W = 0 (A's row 0 that row of
# the base, B's row 0 -1/s): a row DoRA cannot scale, only the base shows it
import shutil as _sh
_sh.copytree(d + "/dorad", d + "/dorazero")
t, m = safetensors_np.load(d + "/dorazero/adapter_model.safetensors")
ka, kb = "base_model.model.blocks.0.self_attn.q.lora_A.weight", "base_model.model.blocks.0.self_attn.q.lora_B.weight"
t[ka], t[kb] = t[ka].copy(), t[kb].copy()
t[ka][0] = base["blocks.0.self_attn.q.weight"][0]
t[kb][0] = [-0.5, 0, 0, 0]  # s = 8 / 4
safetensors_np.save(d + "/dorazero/adapter_model.safetensors", t, m)
# scale 1e7 x rank 4 x |A| x |B| (about 0.6 each): a merge that can add 1e7 to a weight
test_lora.write_adapter(d + "/huge", base, L, test_lora.WAN_MODULES[:4], 4, 4e7, seed=3)
# without adapter_config.json: a ComfyUI Wan LoRA file (lora_down/up, a
# module's alpha) and diffusers' save_lora_weights folder
import os, numpy as np
rng = np.random.default_rng(5)
for sub, fname, fmt, down, up, mods in [
        ("comfy", "wan_lora.safetensors", "diffusion_model.blocks.%d.%s", "lora_down", "lora_up",
         {"self_attn.q": 16.0, "ffn.0": None}),
        ("dsaved", "pytorch_lora_weights.safetensors", "transformer.blocks.%d.%s", "lora_A", "lora_B",
         {"self_attn.o": None, "cross_attn.k": None})]:
    os.makedirs(d + "/" + sub)
    t = {}
    for n in L:
        for m, alpha in mods.items():
            o_f, i_f = base["blocks.%d.%s.weight" % (n, m)].shape
            key = fmt % (n, m if down == "lora_down" else test_lora.DIFFUSERS[m])
            t[key + "." + down + ".weight"] = (rng.standard_normal((4, i_f)) * 0.2).astype(np.float32)
            t[key + "." + up + ".weight"] = (rng.standard_normal((o_f, 4)) * 0.2).astype(np.float32)
            if alpha is not None:
                t[key + ".alpha"] = np.array(alpha, np.float32)
    if sub == "comfy":  # and differences, as lightx2v's / CausVid's files carry them
        for n in L:
            t["diffusion_model.blocks.%d.norm3.diff" % n] = (rng.standard_normal(base["blocks.%d.norm3.weight" % n].shape) * 0.05).astype(np.float32)
            t["diffusion_model.blocks.%d.self_attn.q.diff_b" % n] = (rng.standard_normal(base["blocks.%d.self_attn.q.bias" % n].shape) * 0.05).astype(np.float32)
        t["diffusion_model.head.head.diff_b"] = (rng.standard_normal(base["head.head.bias"].shape) * 0.05).astype(np.float32)
    safetensors_np.save(d + "/" + sub + "/" + fname, t)
# x with a NaN in its last lora_B, under a long folder name (a trainer's
# checkpoint path): the refusal names the file and the key, whole
import shutil
nd = d + "/a-rather-long-adapter-folder-name-as-trainers-write-them/checkpoint-step-000200"
os.makedirs(nd)
t, m = safetensors_np.load(d + "/x/adapter_model.safetensors")
k = sorted(k for k in t if k.endswith("lora_B.weight"))[-1]
t[k] = t[k].copy()
t[k][0, 0] = np.nan
safetensors_np.save(nd + "/adapter_model.safetensors", t, m)
shutil.copy(d + "/x/adapter_config.json", nd)
EOF
mkdir -p "$D/outside" && cp -r "$D/w/x" "$D/w/y" "$D/w/dsaved" "$D/outside/"
"$R" tensor rand --name latent --shape 4,1,8,8 --seed 1 --out "$D/lat.safetensors" &&
    "$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors" || { bad "inputs"; finish; }
IN="--context $D/ctx.safetensors --latent $D/lat.safetensors --steps 2 --shift 3"
run() { # out weights [--lora DIR]
    o=$1; shift
    "$R" run --weights "$@" $IN --out "$o" 2>"$o.err" || { bad "reelctl run $*"; show "$o.err"; }
}
run "$D/ref_base.safetensors" "$D/w/base.safetensors"
run "$D/ref_x.safetensors" "$D/w/base.safetensors" --lora "$D/w/x"
run "$D/ref_y.safetensors" "$D/w/base.safetensors" --lora "$D/w/y"
run "$D/ref_dorad.safetensors" "$D/w/base.safetensors" --lora "$D/w/dorad"
run "$D/ref_b2x.safetensors" "$D/w/base2.safetensors" --lora "$D/w/x"
run "$D/ref_b2y.safetensors" "$D/w/base2.safetensors" --lora "$D/w/y"
run "$D/ref_b2comfy.safetensors" "$D/w/base2.safetensors" --lora "$D/w/comfy/wan_lora.safetensors"
run "$D/ref_b2dsaved.safetensors" "$D/w/base2.safetensors" --lora "$D/w/dsaved"
same() { "$R" tensor diff "$1" "$2" >/dev/null 2>&1; }
gen() { # out: reelctl gen, stderr to out.err
    "$R" gen --broker "$CE" --model tiny $IN --timeout-ms 30000 --quiet --out "$1" 2>"$1.err"
}
lsync() { # out args...: reelctl sync, its stderr in out
    o=$1; shift
    "$R" sync --broker "$CE" --timeout-ms 30000 "$@" 2>"$o"
}

mkdir -p "$D/up"
DB="$D/reel.db"
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 --weights-dir "$D/up" ||
    { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "$WE" --weights "$D/w/base.safetensors" --streams 1 \
    --heartbeat-ms 200 --lora --warmup 1 --policy evict || { bad "worker starts"; show "$D/w1.log"; finish; }
W1=$WORKER
grep -q "LoRA syncs accepted: base v1 kept" "$D/w1.log" && ok "--lora: the worker keeps base v1 for adapters" ||
    { bad "base kept"; show "$D/w1.log"; }

echo "== GENs on the base, then adapters by path: no graph evicted or captured again"
gen "$D/g1.safetensors" && gen "$D/g1b.safetensors" && same "$D/g1.safetensors" "$D/ref_base.safetensors" &&
    ok "GEN on base v1 equals reelctl run" || { bad "GEN on v1"; show "$D/g1.safetensors.err"; }
lsync "$D/s2.err" --version 2 --base 1 --lora "$D/w/x" && grep -q "complete; applied w1" "$D/s2.err" &&
    ok "sync --lora x --base 1 as v2: complete" || { bad "sync v2"; show "$D/s2.err"; }
grep -q "applied transformer v2 (LoRA adapter on base v1, graphs kept)" "$D/w1.log" &&
    ok "the worker merged it on base v1 and kept its graphs (--policy evict notwithstanding)" ||
    { bad "worker log v2"; show "$D/w1.log"; }
gen "$D/g2.safetensors" && same "$D/g2.safetensors" "$D/ref_x.safetensors" &&
    ok "GEN on v2 equals reelctl run --lora x bitwise" || { bad "GEN on v2"; show "$D/g2.safetensors.err"; }
lsync "$D/s3.err" --version 3 --base 1 --lora "$D/w/y" && gen "$D/g3.safetensors" &&
    same "$D/g3.safetensors" "$D/ref_y.safetensors" &&
    ok "v3 = adapter y (diffusers names, BF16, rsLoRA, other targets): GEN equals run --lora y" ||
    { bad "v3"; show "$D/s3.err" "$D/g3.safetensors.err"; }
ok_alt=yes
for v in 4 5 6 7 8 9; do
    # x, DoRA, y, DoRA, x, DoRA: each adapter's targets differ from the last's
    a=dorad; [ $v = 4 ] || [ $v = 8 ] && a=x; [ $v = 6 ] && a=y
    lsync "$D/s$v.err" --version $v --base 1 --lora "$D/w/$a" && gen "$D/g$v.safetensors" &&
        same "$D/g$v.safetensors" "$D/ref_$a.safetensors" || { ok_alt=no; show "$D/s$v.err"; }
done
[ $ok_alt = yes ] && ok "x, y and a DoRA adapter alternated six times: every GEN bitwise what reelctl run --lora gives" ||
    bad "alternating adapters drifted"
grep -q "applied transformer v9 (LoRA adapter on base v1, graphs kept)" "$D/w1.log" &&
    ok "the DoRA adapter (v9) merged in place, graphs kept" || { bad "worker log v9"; show "$D/w1.log"; }
lsync "$D/s10.err" --version 10 --base 1 --lora none --weights "$D/w/base.safetensors" && gen "$D/g10.safetensors" &&
    same "$D/g10.safetensors" "$D/ref_base.safetensors" &&
    ok "v10 = --lora none after the DoRA adapter: back to the base, bitwise" || { bad "back to base"; show "$D/s10.err"; }

echo "== the catalog: each adapter version with its base and what was applied"
wait_sql "$DB" "select count(*) from weight_versions where version = 2 and base_version = 1 and json_extract(adapter, '$.rank') = 4 and json_extract(adapter, '$.targets') = 16 and json_extract(adapter, '$.sha256') = '$(sha256sum "$D/w/x/adapter_model.safetensors" | cut -c1-64)'" 1 60 &&
    ok "weight_versions: v2 is an adapter on base v1 (rank 4, 16 targets, its sha256)" || bad "catalog v2 adapter"
wait_sql "$DB" "select count(*) from weight_versions where version = 3 and json_extract(adapter, '$.rslora') = 1 and json_extract(adapter, '$.layout') = 'diffusers' and json_extract(adapter, '$.modules') = 'ffn.0,ffn.2,self_attn.q'" 1 60 &&
    ok "v3: rsLoRA, diffusers names, its modules" || bad "catalog v3 adapter"
wait_sql "$DB" "select count(*) from weight_versions where version = 10 and base_version = 1 and adapter is null and state in ('current', 'superseded')" 1 60 &&
    ok "v10 (--lora none): the base again, no adapter" || bad "catalog v10"
"$R" versions --catalog "$DB" >"$D/versions.txt" 2>&1 && grep -E "^transformer +2 .*\"rank\":4" "$D/versions.txt" >/dev/null &&
    ok "reelctl versions shows the base and the adapter" || { bad "reelctl versions"; show "$D/versions.txt"; }
"$R" versions --catalog "$DB" --json >"$D/versions.json" 2>&1 && /usr/bin/python3 -c '
import json, sys
v = {r["version"]: r for r in json.load(open(sys.argv[1]))}
sys.exit(0 if v[2]["adapter"]["rank"] == 4 and v[2]["base_version"] == 1 and v[10]["source"] == "(its base)" else 1)' \
    "$D/versions.json" && ok "reelctl versions --json: an adapter is an object (rank 4); --lora none's source is (its base)" ||
    { bad "reelctl versions --json"; head -c 800 "$D/versions.json" | show; }

echo "== refused by name, nothing changed"
lsync "$D/r1.err" --version 11 --base 1 --lora "$D/w/dora"
[ $? != 0 ] && grep -q "no lora_magnitude_vector, and the adapter is DoRA" "$D/r1.err" &&
    ok "a DoRA adapter without its magnitudes: refused locally, naming DoRA" ||
    { bad "DoRA refused"; show "$D/r1.err"; }
/usr/bin/python3 "$HERE/security_peer.py" --endpoint "$CE" --for 60 --answered \
    "{\"type\":\"SYNC\",\"id\":7,\"component\":\"transformer\",\"version\":11,\"base_version\":1,\"sha256\":\"$(sha256sum "$D/w/dora/adapter_model.safetensors" | cut -c1-64)\",\"path\":\"$D/w/dora\"}" \
    >"$D/r2.out" 2>&1
grep -q "bad_adapter: .*no lora_magnitude_vector, and the adapter is DoRA" "$D/r2.out" &&
    ok "the same adapter sent raw: the worker answers bad_adapter naming DoRA" ||
    { bad "worker DoRA"; show "$D/r2.out"; }
lsync "$D/r3.err" --version 12 --base 2 --lora "$D/w/x"
[ $? != 0 ] && grep -q "its base version is not this worker's base" "$D/r3.err" &&
    ok "an adapter on base v2 (not the worker's base, v1): refused" || { bad "wrong base"; show "$D/r3.err"; }
lsync "$D/r4.err" --version 13 --base 1 --lora "$D/outside/x"
[ $? != 0 ] && grep -q "bad_weights: path not under the worker.s weights directories" "$D/r4.err" &&
    ok "an adapter outside the weights directories: refused as any path is" || { bad "outside roots"; show "$D/r4.err"; }
lsync "$D/r5.err" --version 14 --base 1 --lora "$D/w/huge"
[ $? != 0 ] && grep -q "bad_adapter: its merge could add .* to a weight" "$D/r5.err" &&
    ok "an adapter whose merge could carry a weight past 2^23 (a diverged trainer's): refused, nothing changed" ||
    { bad "huge adapter refused"; show "$D/r5.err"; }
lsync "$D/r8.err" --version 14 --base 1 --lora "$D/w/dorazero"
[ $? != 0 ] && grep -q "bad_adapter: blocks.0.self_attn.q.weight: DoRA row 0: ||W + s·B·A|| = 0" "$D/r8.err" &&
    ok "a DoRA adapter with a row of norm 0 on the base: the worker refuses it before the reload, nothing changed" ||
    { bad "DoRA zero row refused"; show "$D/r8.err"; }
lsync "$D/r7.err" --version 14 --base 1 --lora "$D/w/a-rather-long-adapter-folder-name-as-trainers-write-them/checkpoint-step-000200"
[ $? != 0 ] && grep -q "checkpoint-step-000200/adapter_model.safetensors: base_model.model.blocks.[0-9]*.[a-z_.0-9]*lora_B.weight: NaN or infinite values" "$D/r7.err" &&
    ok "a NaN in an adapter under a long path: every worker's reason whole in reelctl sync's output (file and key, past 127 bytes)" ||
    { bad "long refusal reason"; show "$D/r7.err"; }
# two sources, or a base not below the version: refused by reelctl (exit 2)
# before anything is read or sent
allrefused=yes
for a in "--version 14 --weights $D/w/base.safetensors --upload $D/w/base2.safetensors" \
    "--version 14 --base 1 --lora $D/w/x --lora-upload $D/w/y" "--version 14 --base 14 --lora $D/w/x" \
    "--version 14 --base 1 --lora-upload $D/w/x --weights $D/w/base.safetensors"; do
    lsync "$D/r6.err" $a
    rc=$?
    [ $rc = 2 ] && grep -q "exclude each other\|must be below --version" "$D/r6.err" || { allrefused="no ($a: exit $rc)"; show "$D/r6.err"; }
done
[ "$allrefused" = yes ] && ok "sync with two sources (--weights and --upload, --lora and --lora-upload) or --base >= --version: exit 2, named" ||
    bad "conflicting sync flags: $allrefused"
"$R" gen --broker "$CE" --model tiny $IN --timeout-ms 30000 --quiet --out "$D/no/such/dir/g.safetensors" 2>"$D/gdir.err"
[ $? = 2 ] && grep -q "$D/no/such/dir is not a folder" "$D/gdir.err" &&
    ok "gen --out in a folder that is not there: exit 2 before the request is sent" || { bad "gen --out folder"; show "$D/gdir.err"; }
gen "$D/g14.safetensors" && same "$D/g14.safetensors" "$D/ref_base.safetensors" &&
    ok "after the refusals GEN still runs on v10 (the base) exactly" || bad "GEN after refusals"

echo "== a full sync is the new base"
lsync "$D/s15.err" --version 15 --weights "$D/w/base2.safetensors" && grep -q complete "$D/s15.err" &&
    ok "full sync v15 applied" || { bad "full sync"; show "$D/s15.err"; }
lsync "$D/s16.err" --version 16 --base 15 --lora "$D/w/x" && gen "$D/g16.safetensors" &&
    same "$D/g16.safetensors" "$D/ref_b2x.safetensors" &&
    ok "v16 = x on base v15: GEN equals run --weights base2 --lora x" || { bad "x on the new base"; show "$D/s16.err"; }
# a worker that joins on its startup weights (v1, below the adapter's
# base v15) is sent v15 first, then v16
cli_worker wl "$D/broker.log" "$D/wl.log" --broker "$WE" --weights "$D/w/base.safetensors" --streams 1 \
    --heartbeat-ms 200 --lora || { bad "wl starts"; show "$D/wl.log"; finish; }
WL=$WORKER
wait_for "$D/wl.log" "applied transformer v16" 60 && grep -q "applied transformer v15" "$D/wl.log" &&
    ! grep -q "not this worker's base" "$D/wl.log" &&
    ok "a worker joining below the adapter's base applies base v15, then v16" || { bad "late joiner below the base"; show "$D/wl.log"; }
stop_proc "$WL" || bad "wl stops"
wait_for "$D/broker.log" "worker wl lost" 30 || bad "the broker lets wl go"
lsync "$D/s17.err" --version 17 --base 15 --lora-upload "$D/outside/y" && gen "$D/g17.safetensors" &&
    same "$D/g17.safetensors" "$D/ref_b2y.safetensors" &&
    ok "v17 = y uploaded from outside the workers' directories (by value): GEN equals run --lora y" ||
    { bad "adapter by upload"; show "$D/s17.err" "$D/g17.safetensors.err"; }
lsync "$D/r18.err" --version 18 --base 1 --lora "$D/w/x"
[ $? != 0 ] && grep -q "not this worker's base" "$D/r18.err" && ok "the old base v1 is no longer one: refused" ||
    { bad "old base"; show "$D/r18.err"; }
# Adapters without adapter_config.json: by path, a ComfyUI file; by value,
# diffusers' folder (its SYNC carries "{}": the file's own config)
lsync "$D/s20.err" --version 20 --base 15 --lora "$D/w/comfy/wan_lora.safetensors" && gen "$D/g20.safetensors" &&
    same "$D/g20.safetensors" "$D/ref_b2comfy.safetensors" &&
    ok "v20 = a ComfyUI Wan LoRA file (lora_down/up, alphas, .diff and .diff_b, no config) by path: GEN equals run --lora" ||
    { bad "ComfyUI adapter by path"; show "$D/s20.err" "$D/g20.safetensors.err"; }
lsync "$D/s21.err" --version 21 --base 15 --lora-upload "$D/outside/dsaved" && gen "$D/g21.safetensors" &&
    same "$D/g21.safetensors" "$D/ref_b2dsaved.safetensors" &&
    ok "v21 = diffusers' pytorch_lora_weights.safetensors folder by value (v20's differences gone): GEN equals run --lora" ||
    { bad "diffusers adapter by upload"; show "$D/s21.err" "$D/g21.safetensors.err"; }

echo "== the graphs: captured once, before the syncs, never evicted"
stop_proc "$W1" || bad "w1 stops on SIGTERM"
line=$(grep "stopping; capture cache:" "$D/w1.log")
echo "  | $line"
echo "$line" | grep -qE ": 2 captures, [0-9]+ replays .* 2 evictions \(1 at shutdown\)$" &&
    ok "two captures: one before the adapters (serving v1 to v10), one after the full sync v15 evicted it (--policy evict); the second leaves at the stop" ||
    bad "captures and evictions: $line"
# each adapter sync re-keyed the kept graph in place (no capture): the
# worker's rekey events give the catalog each new key's text, so the
# replays under it are not on a key the catalog cannot name
nt=$(/usr/bin/sqlite3 "$DB" "select count(*) from captures c where worker = 'w1' and replay_count > 0 and not exists (select 1 from key_texts x where x.key_hash = c.key_hash)" 2>/dev/null)
nr=$(/usr/bin/sqlite3 "$DB" "select count(distinct key_hash) from captures where worker = 'w1' and placeholder = 1" 2>/dev/null)
[ "$nt" = 0 ] && [ "${nr:-0}" -ge 1 ] &&
    ok "every key w1 replayed under ($nr re-keyed in place by a sync) has its text in the catalog" ||
    { bad "keys replayed without a text: $nt (re-keyed: $nr)"; "$R" keys --catalog "$DB" 2>&1 | head -8; }

echo "== a worker without --lora says how to take adapters"
cli_worker w2 "$D/broker.log" "$D/w2.log" --broker "$WE" --weights "$D/w/base2.safetensors" --weights-version 15 \
    --streams 1 --heartbeat-ms 200 || { bad "w2 starts"; show "$D/w2.log"; finish; }
lsync "$D/r19.err" --version 22 --base 15 --lora "$D/w/x"
[ $? != 0 ] && grep -q "start it with --lora" "$D/r19.err" && ok "w2 (no --lora): refused, naming --lora" ||
    { bad "no --lora"; show "$D/r19.err"; }

echo "== a restarted broker resumes a LoRA version on its base"
stop_proc "$WORKER" || bad "w2 stops"
cli_worker w3 "$D/broker.log" "$D/w3.log" --broker "$WE" --weights "$D/w/base2.safetensors" --weights-version 15 \
    --streams 1 --heartbeat-ms 200 --lora || { bad "w3 starts"; show "$D/w3.log"; finish; }
# restarted V FLAG SRC WHAT REF WNEW N: sync V = SRC on base v15 (FLAG:
# --lora or --lora-upload), applied by the worker running ($WORKER); it and
# the broker stop, a broker restarts (broker$N.log) and restores V as "the
# LoRA adapter WHAT on v15", and a worker WNEW joining after it is caught
# up to V: its GEN equals REF (run --lora)
restarted() {
    v=$1 flag=$2 src=$3 what=$4 ref=$5 wnew=$6 n=$7 wold=$WORKER
    lsync "$D/s$v.err" --version "$v" --base 15 "$flag" "$src" && grep -q "complete; applied " "$D/s$v.err" &&
        ok "v$v = $src on base v15 ($flag): complete" || { bad "sync v$v"; show "$D/s$v.err"; }
    stop_proc "$wold" || bad "the worker stops"
    stop_proc "$BROKER" || bad "the broker stops"
    cli_broker "$D/broker$n.log" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 \
        --weights-dir "$D/up" || { bad "the broker restarts"; finish; }
    grep -qF "restored transformer v$v from the catalog (the LoRA adapter $what on v15)" "$D/broker$n.log" &&
        ok "the restarted broker restores v$v as the adapter ($what) on base v15" ||
        { bad "v$v restored"; show "$D/broker$n.log"; }
    cli_worker "$wnew" "$D/broker$n.log" "$D/$wnew.log" --broker "$WE" --weights "$D/w/base2.safetensors" \
        --weights-version 15 --streams 1 --heartbeat-ms 200 --lora || { bad "$wnew starts"; show "$D/$wnew.log"; finish; }
    wait_for "$D/$wnew.log" "applied transformer v$v" 60 && gen "$D/g$v.safetensors" &&
        same "$D/g$v.safetensors" "$ref" &&
        ok "a worker joining after the restart is caught up to v$v: GEN equals run --lora" ||
        { bad "catch-up to v$v after the restart"; show "$D/$wnew.log" "$D/g$v.safetensors.err"; }
}
restarted 23 --lora "$D/w/x" "$D/w/x" "$D/ref_b2x.safetensors" w4 2

echo "== ... and one sent by upload, with its config"
restarted 24 --lora-upload "$D/outside/y" uploaded "$D/ref_b2y.safetensors" w5 3

echo "== a restarted broker sends a worker below the base the base first"
cli_worker w6 "$D/broker3.log" "$D/w6.log" --broker "$WE" --weights "$D/w/base.safetensors" --streams 1 \
    --heartbeat-ms 200 --lora || { bad "w6 starts"; show "$D/w6.log"; finish; }
wait_for "$D/w6.log" "applied transformer v24" 60 && grep -q "applied transformer v15" "$D/w6.log" &&
    ok "w6 (startup v1) applies base v15 from the catalog, then the uploaded v24" || { bad "w6 below the base"; show "$D/w6.log" "$D/broker3.log"; }
finish
