#!/bin/sh
# demo.sh -- the main job: a local Reel cluster on the CPU backend. A broker
# and two workers on loopback, a client load over several capture keys with
# CFG, a trainer weight sync in the middle (evictions, then recaptures), and
# the capture report read back from the catalog. Exits 0 and leaves no
# process behind.
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

say "2. a broker ($CE clients, $WE workers, catalog $DB) and two CPU workers, 2 streams each"
"$BUILD/reel-broker" --clients "$CE" --workers "$WE" --catalog "$DB" >"$D/broker.log" 2>&1 &
PIDS="$PIDS $!"
wait_for "$D/broker.log" "reel-broker: ready" 10
for w in w1 w2; do
    "$BUILD/reel-worker" --broker "$WE" --name "$w" --weights "$D/w1.safetensors" --streams 2 \
        --backend cpu >"$D/$w.log" 2>&1 &
    PIDS="$PIDS $!"
    wait_for "$D/broker.log" "worker $w ready" 20
done
"$R" status --broker "$CE"

say "3. client load: 3 capture keys (latent shapes) x 2 requests, 6 steps, CFG 5"
"$R" tensor rand --name context --shape 16,256 --seed 11 --out "$D/ctx.safetensors"
"$R" tensor rand --name context --shape 16,256 --seed 12 --out "$D/unc.safetensors"
load() { # tag
    pids=""
    for size in 2x8x8 2x8x16 4x8x8; do
        for r in 1 2; do
            "$R" gen --broker "$CE" --model small --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" \
                --cfg 5 --size "$size" --seed "$r" --steps 6 --shift 3 --quiet --timeout-ms 300000 \
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

say "4. the trainer publishes transformer v2; the sync is a barrier over every worker"
"$R" sync --broker "$CE" --version 2 --weights "$D/w2.safetensors"

say "5. the same load on v2: graphs that baked v1 were evicted, so each key warms up and captures again"
load after

say "6. one more request per key: it lands on the worker that holds its graphs and replays from its first step"
pids=""
for size in 2x8x8 2x8x16 4x8x8; do
    "$R" gen --broker "$CE" --model small --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" \
        --cfg 5 --size "$size" --seed 9 --steps 6 --shift 3 --quiet --timeout-ms 300000 \
        --out "$D/warm-$size.safetensors" 2>>"$D/warm.log" &
    pids="$pids $!"
done
for p in $pids; do wait "$p"; done
sort "$D/warm.log"

say "7. the capture report, from the catalog"
"$R" stats --catalog "$DB"
echo
"$R" keys --catalog "$DB"
echo
"$R" evictions --catalog "$DB"
echo
"$R" versions --catalog "$DB"
echo

say "8. an RL trainer in Python (clients/python/examples/grpo_loop.py): groups of SDE rollouts with log-probs, a toy update published by value, the next rollouts on the new version"
/usr/bin/python3 clients/python/examples/grpo_loop.py --broker "$CE" --weights "$D/w2.safetensors" --model small \
    --iters 2 --group 4 --steps 4 --latent 2x8x8 --weights-dir "$D"
echo
echo "demo: done"
