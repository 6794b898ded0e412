#!/bin/sh
# cli_wan.sh -- Wan2.1 checkpoints as published, at the process level
# (docs/MODEL.md, "Which Wan releases load"): tests/wan_layouts.py writes,
# from Reel's own weights, a release folder, a sharded one, a diffusers
# folder (one file and sharded) and a pipeline root; `reelctl weights
# inspect` tells each one's layout, config and identity; `reelctl run` on
# them equals the native file; a worker started on a release folder serves
# as the native file does, takes a sync by path naming a sharded folder and
# one uploaded as a raw diffusers file, and refuses an image-to-video
# release. Every wait is bounded; every process is killed on exit.
# Usage: cli_wan.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d /tmp/reel-wan.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
PY=/usr/bin/python3
SUITE=wan
. "$HERE/lib_cli.sh"

# tiny, with Wan's text_len: the native file and every layout pad alike
printf '{"name":"tiny","dim":64,"heads":4,"layers":2,"ffn_dim":128,"in_channels":4,"text_dim":32,"freq_dim":256,"text_len":512}\n' >"$D/tiny512.json"
"$R" weights init --config "$D/tiny512.json" --seed 7 --out "$D/w.safetensors" 2>/dev/null
L="$D/l"
if ! $PY "$HERE/wan_layouts.py" "$D/w.safetensors" "$L" >"$D/ids.json" 2>"$D/ids.err"; then
    bad "tests/wan_layouts.py writes the layouts"; show "$D/ids.err"; finish
fi
id_of() { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$D/ids.json" "$1"; }

echo "== reelctl weights inspect"
# inspect PATH LAYOUT DTYPE FILES: its text names the layout, tiny's config with text_len 512, the dtype of all 69 tensors
inspect() {
    if "$R" weights inspect "$1" >"$D/i.txt" 2>"$D/i.err" && grep -q "^layout *$2\$" "$D/i.txt" &&
        grep -q "^config *tiny\$" "$D/i.txt" && grep -q "^text_len *512\$" "$D/i.txt" &&
        grep -q "^dtypes *$3 69\$" "$D/i.txt" && grep -q "^parameters *155344\$" "$D/i.txt" &&
        [ "$(grep -c '^file ' "$D/i.txt")" = "$4" ]; then
        ok "inspect $(basename "$1"): $2, tiny, text_len 512, $3, $4 file(s)"
    else
        bad "inspect $1 ($2 $3 $4)"; show "$D/i.txt" "$D/i.err"
    fi
}
inspect "$D/w.safetensors" reel F32 1
inspect "$L/original" wan-original F32 1
inspect "$L/original/diffusion_pytorch_model.safetensors" wan-original F32 1
inspect "$L/original-bf16" wan-original BF16 1
inspect "$L/sharded" wan-sharded BF16 3
inspect "$L/sharded/diffusion_pytorch_model.safetensors.index.json" wan-sharded BF16 3
inspect "$L/diffusers" diffusers F16 1
inspect "$L/diffusers-sharded" diffusers F32 2
inspect "$L/pipeline" diffusers-pipeline F32 1
# the identity: one file's bytes; an index's bytes then each shard's digest
sum1=$(sha256sum "$L/original/diffusion_pytorch_model.safetensors" | cut -d' ' -f1)
"$R" weights inspect "$L/original" | grep -q "^sha256 *$sum1 " && ok "one file: the identity is its sha256" ||
    bad "one file's identity is its sha256"
for s in sharded diffusers-sharded; do
    "$R" weights inspect "$L/$s" | grep -q "^sha256 *$(id_of $s) " && ok "$s: the identity is the index's bytes, then each shard's sha256" ||
        { bad "$s identity"; "$R" weights inspect "$L/$s" | show; }
done
"$R" weights inspect --json "$L/pipeline" >"$D/p.json" 2>&1
$PY - "$D/p.json" "$L" <<'EOF' >"$D/pj.out" 2>&1
import hashlib, json, sys
j = json.load(open(sys.argv[1]))
f = sys.argv[2] + "/pipeline/transformer/diffusion_pytorch_model.safetensors"
want = hashlib.sha256(open(f, "rb").read()).hexdigest()
ok = (j["layout"] == "diffusers-pipeline" and j["config"]["name"] == "tiny" and j["config"]["text_len"] == 512
      and j["config"]["dim"] == 64 and j["dtypes"] == {"F32": 69} and j["tensors"] == 69 and j["index"] is None
      and [x["name"] for x in j["files"]] == ["transformer/diffusion_pytorch_model.safetensors"]
      and j["files"][0]["sha256"] == want == j["sha256"])
print(("PASS" if ok else "FAIL") + " inspect --json: layout, config, dtypes, files and identity of a pipeline root")
if not ok: print(json.dumps(j))
EOF
py_checks "$D/pj.out" $?
"$R" weights info "$L/sharded" 2>&1 | grep -q "^layout *wan-sharded" && ok "weights info is inspect's other name" ||
    bad "weights info still works"

# refused, with what was found named
cp -r "$L/original" "$L/i2v"
sed -i 's/"model_type": "t2v"/"model_type": "i2v"/' "$L/i2v/config.json"
"$R" weights inspect "$L/i2v" >/dev/null 2>"$D/e.err"
[ $? = 2 ] && grep -q "model_type 'i2v'" "$D/e.err" && ok "an i2v release is refused (exit 2): $(cat "$D/e.err")" ||
    { bad "i2v refused"; show "$D/e.err"; }
cp -r "$L/original" "$L/nocfg" && rm "$L/nocfg/config.json"
"$R" weights inspect "$L/nocfg" >/dev/null 2>"$D/e.err"
[ $? = 2 ] && grep -q "no config.json" "$D/e.err" && ok "a release file without its config.json is refused" ||
    { bad "no config.json refused"; show "$D/e.err"; }
cp -r "$L/sharded" "$L/torn" && rm "$L/torn/diffusion_pytorch_model-00002-of-00003.safetensors"
"$R" weights inspect "$L/torn" >/dev/null 2>"$D/e.err"
[ $? = 2 ] && grep -q "00002-of-00003.safetensors" "$D/e.err" && ok "a missing shard is named" ||
    { bad "missing shard named"; show "$D/e.err"; }

echo "== reelctl run: each layout as the native file"
"$R" tensor rand --name latent --shape 4,2,8,8 --seed 1 --out "$D/lat.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 3 --out "$D/unc.safetensors"
IN="--context $D/ctx.safetensors --uncond $D/unc.safetensors --cfg 4 --latent $D/lat.safetensors --steps 2 --shift 3"
"$R" run --weights "$D/w.safetensors" $IN --out "$D/ref.safetensors" 2>/dev/null
"$R" run --weights "$L/reel-bf16.safetensors" $IN --out "$D/ref-bf16.safetensors" 2>/dev/null
"$R" run --weights "$L/reel-f16.safetensors" $IN --out "$D/ref-f16.safetensors" 2>/dev/null
same() { "$R" tensor diff "$1" "$2" >/dev/null 2>&1; }
for c in "original ref" "original/diffusion_pytorch_model.safetensors ref" "original-bf16 ref-bf16" "sharded ref-bf16" \
         "diffusers ref-f16" "diffusers-sharded ref" "pipeline ref"; do
    set -- $c
    if "$R" run --weights "$L/$1" $IN --out "$D/o.safetensors" >/dev/null 2>"$D/o.err"; then
        same "$D/o.safetensors" "$D/$2.safetensors" && ok "run --weights $1: bitwise the native file's result" ||
            bad "run --weights $1 differs from the native file's result"
    elif grep -qE "not a regular file|names no config" "$D/o.err"; then
        # ctl/cmd_run.c opens --weights with st_open until it calls wan_ckpt_load
        echo "SKIP run --weights $1: reelctl run reads Reel files only so far ($(head -c 120 "$D/o.err"))"
    else
        bad "run --weights $1"; show "$D/o.err"
    fi
done

echo "== reelctl weights export: any layout back to the one a Wan2.1 release ships"
if "$R" weights export "$D/w.safetensors" --out "$D/exp-bf16" --dtype bf16 2>"$D/e.err" &&
    "$R" weights inspect "$D/exp-bf16" >"$D/e.txt" 2>&1 && grep -q "^layout *wan-original\$" "$D/e.txt" &&
    grep -q "^text_len *512\$" "$D/e.txt"; then
    ok "export --dtype bf16: a wan-original folder, text_len 512"
else
    bad "export bf16"; show "$D/e.err" "$D/e.txt"
fi
cmp -s "$D/exp-bf16/diffusion_pytorch_model.safetensors" "$L/original-bf16/diffusion_pytorch_model.safetensors" &&
    ok "its safetensors file is byte for byte the one tests/wan_layouts.py writes" || bad "exported bytes differ from Python's"
"$R" run --weights "$D/exp-bf16" $IN --out "$D/o.safetensors" >/dev/null 2>&1 && same "$D/o.safetensors" "$D/ref-bf16.safetensors" &&
    ok "run on the export: bitwise the native BF16 result" || bad "run on the bf16 export"
"$R" weights export "$L/diffusers" --out "$D/exp-d" 2>/dev/null &&
    "$R" run --weights "$D/exp-d" $IN --out "$D/o.safetensors" >/dev/null 2>&1 && same "$D/o.safetensors" "$D/ref-f16.safetensors" &&
    ok "a diffusers folder exported (F32) runs bitwise as its F16 values" || bad "export of a diffusers folder"
"$R" weights export "$D/w.safetensors" --out "$D/x" --dtype f64 2>"$D/e.err"
[ $? = 2 ] && grep -q "not f32, bf16 or f16" "$D/e.err" && ok "export --dtype f64: usage error" || { bad "export bad dtype"; show "$D/e.err"; }
"$R" weights export "$D/nonexistent" --out "$D/x2" 2>"$D/e.err"
[ $? = 2 ] && [ ! -e "$D/x2" ] && ok "export of a missing checkpoint: usage error, nothing written" ||
    { bad "export of a missing path"; show "$D/e.err"; }

echo "== a worker on a release folder; syncs by path to a sharded folder and by upload of a raw diffusers file"
mkdir -p "$D/store"
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "" --heartbeat-ms 200 \
    --sync-deadline-ms 20000 --weights-dir "$D/store" || { bad "the broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "$WE" --weights "$L/original" --streams 1 --heartbeat-ms 200 ||
    { bad "a worker starts on a release folder"; show "$D/w1.log"; finish; }
ok "reel-worker --weights FOLDER (wan-original) starts"
gen() { # out [flags]
    o=$1; shift
    "$R" gen --broker "$CE" --model tiny $IN --timeout-ms 20000 --quiet --out "$o.safetensors" "$@" 2>"$o.err"
}
gen "$D/g1" && same "$D/g1.safetensors" "$D/ref.safetensors" && ok "GEN on it equals reelctl run on the native file" ||
    { bad "GEN on a release folder"; show "$D/g1.err" "$D/w1.log"; }
# pysync WHAT: one sync from the Python client (which takes the identity
# as given: reelctl sync computes it for a folder once it uses wan_sync_source)
pysync() {
    PYTHONPATH="$HERE/../clients/python" $PY - "$CE" "$L" "$(id_of sharded)" "$1" >"$D/sync.out" 2>&1 <<'EOF'
import sys
from reel import Client, SyncFailed
ep, l, ident, what = sys.argv[1:5]
c = Client(ep, timeout=30)
def say(ok, msg):
    print(("PASS " if ok else "FAIL ") + msg, flush=True)
if what == "sharded":
    r = c.sync(2, path=l + "/sharded", sha256=ident)
    say(r.complete and r.applied == ["w1"], "a sync by path naming a sharded folder (its identity) is applied: %s" % r.applied)
elif what == "upload":
    r = c.sync(3, path=l + "/diffusers/diffusion_pytorch_model.safetensors", upload=True)
    say(r.complete, "a raw diffusers file uploaded as it is is applied (judged against the running model)")
else:
    try:
        c.sync(4, path=l + "/i2v", sha256="0" * 64)
        say(False, "an image-to-video release is refused")
    except SyncFailed as e:
        say("not weights of this worker" in str(e), "an image-to-video release is refused: %s" % e)
EOF
    py_checks "$D/sync.out" $?
}
pysync sharded
gen "$D/g2" && same "$D/g2.safetensors" "$D/ref-bf16.safetensors" && ok "GEN on v2 equals reelctl run on the shards' BF16 values" ||
    { bad "GEN on v2 (sharded BF16 folder)"; show "$D/g2.err"; }
pysync upload
gen "$D/g3" && same "$D/g3.safetensors" "$D/ref-f16.safetensors" && ok "GEN on v3 equals reelctl run on the F16 values" ||
    { bad "GEN on v3 (uploaded diffusers F16)"; show "$D/g3.err"; }
pysync i2v
grep -q "applied transformer v2" "$D/w1.log" && grep -q "applied transformer v3" "$D/w1.log" &&
    grep -q "model_type 'i2v'" "$D/w1.log" && ok "the worker's log: v2 and v3 applied, v4's model_type named" ||
    { bad "worker log"; show "$D/w1.log"; }
gen "$D/g4" && same "$D/g4.safetensors" "$D/ref-f16.safetensors" && ok "after the refused v4, GEN still runs on v3 exactly" ||
    { bad "GEN after a refused release"; show "$D/g4.err"; }
# reelctl sync naming a folder (by path: its identity), and uploading a
# sharded one (packed into one Reel file)
rsync_v() { # version flag path ref
    if "$R" sync --broker "$CE" --version "$1" "$2" "$3" --timeout-ms 20000 2>"$D/rs.err"; then
        gen "$D/g$1" && same "$D/g$1.safetensors" "$D/$4.safetensors" &&
            ok "reelctl sync $2 $(basename "$3"): applied, GEN equals the native file's result" ||
            { bad "GEN after reelctl sync $2 $3"; show "$D/g$1.err"; }
    elif grep -qE "not a regular file|names no config" "$D/rs.err"; then
        # ctl/cmd_gen.c hashes one file until it calls wan_sync_source
        echo "SKIP reelctl sync $2 $(basename "$3"): reelctl sync takes Reel files only so far"
    else
        bad "reelctl sync $2 $3"; show "$D/rs.err"
    fi
}
rsync_v 5 --weights "$L/diffusers-sharded" ref
rsync_v 6 --upload "$L/sharded" ref-bf16
rsync_v 7 --upload "$L/pipeline" ref
[ -z "$(find /tmp -maxdepth 1 -name 'reel-pack-*' -newer "$D/w.safetensors")" ] &&
    ok "no packed upload is left in /tmp" || bad "a packed upload's temporary folder is left behind"
finish
