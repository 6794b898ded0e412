#!/bin/sh
# demo.sh -- the main job: a local Reel cluster on the CPU backend. A broker
# and two workers on loopback, with CURVE keys it makes (docs/SECURITY.md),
# serving a checkpoint in the layout a Wan2.1 release ships; a client load
# over several capture keys with CFG, part of it with Wan's UniPC sampler; a
# trainer weight sync in the middle (evictions, then recaptures), the
# capture report and the audit of syncs read back from the catalog, a
# Python RL trainer rewarding decoded frames, and a prompt in, a video out
# (the release folder's text encoder, tokenizer and VAE; ffprobe checks the
# MP4). Exits 0 and leaves no process behind.
set -eu
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
R="$BUILD/reelctl"
D=$(mktemp -d /tmp/reel-demo.XXXXXX)
PORT_BASE=${REEL_DEMO_PORT:-$((20000 + $$ % 20000))}
CE="tcp://127.0.0.1:$PORT_BASE"
WE="tcp://127.0.0.1:$((PORT_BASE + 1))"
DB="$D/reel.db"
PIDS=""
cleanup() {
    for p in $PIDS; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$D"
}
trap cleanup EXIT INT TERM

say() { printf '\n== %s\n' "$*"; }
wait_for() { # FILE PATTERN SECONDS
    i=0
    while [ $i -lt $(($3 * 10)) ]; do
        grep -qE "$2" "$1" 2>/dev/null && return 0
        sleep 0.1; i=$((i + 1))
    done
    echo "demo: timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}

say "1. weights: the small config (25 M parameters, deterministic, nothing downloaded), v1 and a trainer's v2"
"$R" weights init --config small --seed 1 --out "$D/w1.safetensors"
"$R" weights init --config small --seed 2 --out "$D/w2.safetensors"
echo "v1 as a Wan2.1 release ships it (diffusion_pytorch_model.safetensors in BF16, Wan's config.json beside it;"
echo "text_len 512: the workers pad every prompt's context to it, as Wan does), what the workers load:"
"$R" weights export "$D/w1.safetensors" --out "$D/wan-release" --dtype bf16
"$R" weights inspect "$D/wan-release"
echo "and beside it, under their release names, the parts that turn a prompt into a video (small stand-ins,"
echo "random weights): the umT5 text encoder (t5-small, 256 wide like small's text_dim) and the VAE as"
echo ".pth files laid out as torch.save writes them, the tokenizer (trained here) in google/umt5-xxl/:"
"$R" weights init-t5 --config t5-small --seed 3 --dtype bf16 --out "$D/t5.safetensors" >/dev/null
"$R" weights init-vae --config vae-tiny --z-dim 16 --seed 5 --out "$D/vae.safetensors" >/dev/null
/usr/bin/python3 tests/st_to_pth.py "$D/t5.safetensors" "$D/wan-release/models_t5_umt5-xxl-enc-bf16.pth"
/usr/bin/python3 tests/st_to_pth.py "$D/vae.safetensors" "$D/wan-release/Wan2.1_VAE.pth"
mkdir -p "$D/wan-release/google/umt5-xxl"
for i in $(seq 1 30); do
    echo "a cat on a skateboard, a red ball rolling on a beach, a city street at night in the rain, line $i"
done >"$D/corpus.txt"
spm_train --input="$D/corpus.txt" --model_prefix="$D/wan-release/google/umt5-xxl/spiece" --vocab_size=400 \
    --model_type=unigram --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1 --byte_fallback=true \
    --character_coverage=1.0 --hard_vocab_limit=false >/dev/null 2>&1
ls -R "$D/wan-release" | sed 's/^/  /'

say "2. keys (docs/SECURITY.md): the broker's pair, a trainer's, one per worker; CURVE on both sockets"
K="$D/keys"
for k in "broker broker" "trainer trainer" "worker w1" "worker w2"; do
    set -- $k
    "$R" keys new --role "$1" --name "$2" --out "$K" >/dev/null
done
ls "$K"
# reelctl and the Python trainer below take the trainer's key from here
export REEL_KEY="$K/trainer.key" REEL_BROKER_KEY="$K/broker.pub"

say "3. a broker ($CE clients, $WE workers, catalog $DB, --keys) and two CPU workers, 2 streams each"
mkdir -p "$D/store"
"$BUILD/reel-broker" --clients "$CE" --workers "$WE" --catalog "$DB" --keys "$K" --weights-dir "$D/store" \
    --metrics 127.0.0.1:0 >"$D/broker.log" 2>&1 &
PIDS="$PIDS $!"
wait_for "$D/broker.log" "reel-broker: ready" 10
grep "keys:" "$D/broker.log"
for w in w1 w2; do
    "$BUILD/reel-worker" --broker "$WE" --name "$w" --weights "$D/wan-release" --streams 2 --lora \
        --backend cpu --key "$K/$w.key" --broker-key "$K/broker.pub" --metrics 127.0.0.1:0 >"$D/$w.log" 2>&1 &
    PIDS="$PIDS $!"
    wait_for "$D/broker.log" "worker $w ready" 20
done
grep -h "text encoder\|VAE" "$D/w1.log"
"$R" status --broker "$CE"
if env -u REEL_KEY -u REEL_BROKER_KEY "$R" status --broker "$CE" >/dev/null 2>&1; then
    echo "demo: a client without a key was answered" >&2; exit 1
fi
echo "(and without a key: no answer, the handshake never completes)"

say "4. client load: 3 capture keys (latent shapes) x 2 requests, 6 steps, CFG 5; the 4x8x8 key with Wan's UniPC sampler (--solver unipc), the others Euler"
"$R" tensor rand --name context --shape 16,256 --seed 11 --out "$D/ctx.safetensors"
"$R" tensor rand --name context --shape 16,256 --seed 12 --out "$D/unc.safetensors"
load() { # tag
    pids=""
    for size in 2x8x8 2x8x16 4x8x8; do
        solver=euler
        [ "$size" = 4x8x8 ] && solver=unipc
        for r in 1 2; do
            "$R" gen --broker "$CE" --model small --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" \
                --cfg 5 --size "$size" --seed "$r" --steps 6 --shift 3 --solver "$solver" --quiet --timeout-ms 300000 --deadline-ms 290000 \
                --out "$D/$1-$size-$r.safetensors" 2>>"$D/$1.log" &
            pids="$pids $!"
        done
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    sort "$D/$1.log"
    return $rc
}
load before

say "5. the trainer publishes transformer v2 (its own Reel file); the sync is a barrier over every worker"
"$R" sync --broker "$CE" --version 2 --weights "$D/w2.safetensors"

say "6. the same load on v2: graphs that baked v1 were evicted, so each key warms up and captures again"
load after

say "7. one more request per key: it lands on the worker that holds its graphs and replays from its first step"
pids=""
for size in 2x8x8 2x8x16 4x8x8; do
    solver=euler
    [ "$size" = 4x8x8 ] && solver=unipc
    "$R" gen --broker "$CE" --model small --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" \
        --cfg 5 --size "$size" --seed 9 --steps 6 --shift 3 --solver "$solver" --quiet --timeout-ms 300000 --deadline-ms 290000 \
        --out "$D/warm-$size.safetensors" 2>>"$D/warm.log" &
    pids="$pids $!"
done
for p in $pids; do wait "$p"; done
sort "$D/warm.log"

say "8. live metrics (docs/OPERATIONS.md): Prometheus text from each daemon's --metrics endpoint"
scrape() { # PORT
    /usr/bin/python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$1/metrics', timeout=5).read().decode())"
}
# A daemon renders its /metrics every 500 ms: wait until the broker's copy
# counts the 15 requests above, then one more period for the worker's.
bport=$(sed -n 's/.*metrics and health on http:\/\/[^ ]* (port \([0-9]*\)).*/\1/p' "$D/broker.log" | head -1)
i=0
while [ -n "$bport" ] && [ $i -lt 100 ] && ! scrape "$bport" | grep -qx 'reel_broker_requests_total{outcome="ok"} 15'; do
    sleep 0.1; i=$((i + 1))
done
sleep 0.6
for f in "$D/broker.log" "$D/w1.log"; do
    port=$(sed -n 's/.*metrics and health on http:\/\/[^ ]* (port \([0-9]*\)).*/\1/p' "$f" | head -1)
    [ -n "$port" ] || continue
    echo "http://127.0.0.1:$port/metrics ($(basename "$f" .log)), a few of its lines:"
    scrape "$port" |
        grep -E '^reel_(broker_requests_total|broker_syncs_total|broker_workers\{|worker_captures_total|worker_replays_total|worker_evictions_total\{reason="weight_sync"\}|worker_weight_version)' | head -8
done

say "9. the capture report, from the catalog (each key names its sampler: loop=euler, loop=unipc)"
"$R" stats --catalog "$DB"
echo
echo "per capture key: a key names the sampler, the shapes and the weights version, so the 3 latent shapes"
echo "make 6 keys, 3 on v1 and 3 on v2 (key_text is cut here; reelctl why below prints one whole):"
"$R" keys --catalog "$DB"
echo
echo "evictions: the sync to v2 evicted every graph that baked v1 (a graph is per stream: a key captured on"
echo "both streams of a worker is evicted twice):"
"$R" evictions --catalog "$DB"
echo
"$R" versions --catalog "$DB"
echo
echo "every sync, with the key that sent it (the audit table):"
/usr/bin/sqlite3 -header -column "$DB" "select key_name, role, component, version, outcome from audit order by id"
echo

REPORT=/tmp/reel-demo-report.html
"$R" report --html "$REPORT" --catalog "$DB" && echo "the same as a page to look at (charts, no network): $REPORT"
echo

echo "why was the slowest request slow? (reelctl why: the request joined to its graph's history on its worker)"
slow=$(/usr/bin/sqlite3 -separator ' ' "$DB" "select id, worker from requests where status = 'ok' order by seconds desc limit 1")
if [ -n "$slow" ]; then
    set -- $slow
    "$R" why "$1" --worker "$2" --catalog "$DB"
fi
echo

say "10. an RL trainer in Python (clients/python/examples/grpo_loop.py): groups of SDE rollouts of a prompt with log-probs, a toy reward on their decoded frames, a LoRA adapter update published by value on base v2 (the workers run with --lora: no graph evicted), the next rollouts on the new version"
/usr/bin/python3 clients/python/examples/grpo_loop.py --broker "$CE" --weights "$D/w2.safetensors" --model small \
    --iters 2 --group 4 --steps 4 --latent 2x8x8 --base 2 --upload --weights-dir "$D" --prompt "a red ball rolling on a beach"
echo

say "11. a prompt in, a video out: the worker encodes the prompt (and Wan's default negative prompt, for CFG), runs the loop and decodes the latent with its VAE"
"$R" gen --broker "$CE" --model small --prompt "a cat on a skateboard" --cfg 5 --size 3x8x8 --seed 7 --steps 6 \
    --shift 3 --solver unipc --quiet --timeout-ms 300000 --deadline-ms 290000 --out "$D/cat.mp4"
VIDEO=/tmp/reel-demo-cat.mp4
cp "$D/cat.mp4" "$VIDEO"
if command -v ffprobe >/dev/null 2>&1; then
    echo "ffprobe $VIDEO (codec, width, height, fps, frames counted): $(ffprobe -v error -count_frames \
        -select_streams v:0 -show_entries stream=codec_name,width,height,r_frame_rate,nb_read_frames -of csv=p=0 "$VIDEO")"
fi
echo "reelctl video probe $VIDEO: $("$R" video probe "$VIDEO" | paste -sd ' ' -)"
frames=$("$R" video probe "$VIDEO" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["frames"])')
[ "$frames" = 9 ] || { echo "demo: the video has $frames frames, not 9" >&2; exit 1; }
echo "(9 frames of 64x64: 1 + 4(F-1) frames of 8H x 8W from the 3x8x8 latent; random weights draw noise)"
echo "the newest requests in the catalog: the video's, then the last GRPO group's (a group the worker split"
echo "over its 2 streams runs each step once per part: its captured, replayed and eager count those runs):"
"$R" requests --catalog "$DB" | head -3
echo
echo "demo: done"
