#!/bin/sh
# cli_standby_lora.sh -- a standby pair and a LoRA adapter's base
# (docs/PROTOCOL.md, "A worker below the base"): A (primary, active) and B
# (backup, standby), each with --weights-keep 2; a base v2 and adapters
# v3..v6 on it, all by upload. B copies the current upload and keeps the
# base beside its newest two; A is SIGKILLed, B takes over and serves v6, and
# a worker restarted on its startup weights (v1, below the base) is sent
# the base first, then v6, by B. Every wait is bounded; every process is
# killed on exit.
# Usage: cli_standby_lora.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-standby-lora.XXXXXX)
SUITE=standby_lora
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"
export REEL_CLIENT_LIVENESS_MS=300

CA="ipc://$D/ca"; CB="ipc://$D/cb"; WA="ipc://$D/wa"; WB="ipc://$D/wb"; PAIR="$CA,$CB"
mkdir -p "$D/w" "$D/out" "$D/upa" "$D/upb"
"$R" weights init --config tiny --seed 7 --out "$D/w/base.safetensors" 2>/dev/null
"$R" weights init --config tiny --seed 8 --out "$D/out/base2.safetensors" 2>/dev/null
$PY - "$(dirname "$0")/crosscheck" "$D/out" <<'EOF' || { bad "adapters written"; finish; }
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_np, test_lora
d = sys.argv[2]
base, meta = safetensors_np.load(d + "/base2.safetensors")
for i in range(4):
    test_lora.write_adapter(d + "/a%d" % i, base, range(int(meta["layers"])), test_lora.WAN_MODULES[:4], 4, 8,
                            seed=10 + i)
EOF
"$R" tensor rand --name latent --shape 4,1,8,8 --seed 1 --out "$D/lat.safetensors" >/dev/null
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors" >/dev/null
IN="--context $D/ctx.safetensors --latent $D/lat.safetensors --steps 2"
"$R" run --weights "$D/out/base2.safetensors" --lora "$D/out/a3" $IN --out "$D/ref6.safetensors" 2>/dev/null ||
    { bad "reelctl run --lora a3"; finish; }
lsync() { # out args...
    o=$1; shift
    "$R" sync --broker "$PAIR" --timeout-ms 30000 "$@" 2>"$o"
}
# wait_files DIR SECONDS NAME...: every NAME under DIR
wait_files() {
    _d=$1; _s=$2; shift 2
    _i=0
    while [ $_i -lt $((_s * 20)) ]; do
        _all=1
        for _f in "$@"; do [ -e "$_d/$_f" ] || _all=0; done
        [ $_all = 1 ] && return 0
        sleep 0.05; _i=$((_i + 1))
    done
    return 1
}

PAIRFLAGS="--heartbeat-ms 200 --peer-timeout-ms 1500 --weights-keep 2"
cli_broker "$D/a.log" --clients "$CA" --workers "$WA" --catalog "$D/a.db" --peer "$CB" --role primary \
    --weights-dir "$D/upa" $PAIRFLAGS || { bad "A starts"; finish; }
BA=$BROKER
cli_broker "$D/b.log" --clients "$CB" --workers "$WB" --catalog "$D/b.db" --peer "$CA" --role backup \
    --weights-dir "$D/upb" $PAIRFLAGS || { bad "B starts"; finish; }
wait_for "$D/b.log" "standby" 30 || { bad "B is the standby"; show "$D/b.log"; finish; }
for w in w1 w2; do
    cli_worker $w "$D/a.log" "$D/$w.log" --broker "$WA,$WB" --weights "$D/w/base.safetensors" --streams 1 \
        --heartbeat-ms 200 --lora || { bad "$w registers"; finish; }
    eval "P$w=\$WORKER"
done

lsync "$D/s2.err" --version 2 --upload "$D/out/base2.safetensors" && grep -q "complete" "$D/s2.err" ||
    { bad "sync v2 (full, by upload)"; show "$D/s2.err"; }
all=1
for v in 3 4 5 6; do
    lsync "$D/s$v.err" --version $v --base 2 --lora-upload "$D/out/a$((v - 3))" && grep -q "complete" "$D/s$v.err" ||
        { all=0; show "$D/s$v.err"; }
done
[ $all = 1 ] && ok "v2 (a full version) and v3..v6 (adapters on it), all by upload: complete" || bad "the adapters' syncs"
# B copies the peer's current version and its base (which versions in
# between it copied depends on when its PEERs came; --weights-keep then
# keeps the newest two of those, and the base besides)
wait_files "$D/upb" 60 transformer-v6.sha256 transformer-v2.sha256 &&
    wait_for "$D/b.log" "copied transformer v6" 60 && [ -e "$D/upb/transformer-v2.safetensors" ] &&
    ok "the standby holds v6 and the base v2" ||
    { bad "the standby's store: $(ls "$D/upb" | tr '\n' ' ')"; show "$D/b.log"; }
[ -e "$D/upa/transformer-v2.safetensors" ] && ok "the active one keeps the base v2 too" ||
    bad "A's store: $(ls "$D/upa" | tr '\n' ' ')"

kill -9 "$BA"
"$R" gen --broker "$PAIR" --model tiny $IN --timeout-ms 30000 --quiet --out "$D/g6.safetensors" 2>"$D/g6.err" &&
    "$R" tensor diff "$D/g6.safetensors" "$D/ref6.safetensors" >/dev/null 2>&1 &&
    ok "after A's SIGKILL, B serves v6 exactly" || { bad "GEN at B"; show "$D/g6.err" "$D/b.log"; }
# a worker restarted on its startup weights (v1): the base first, then v6
before=$(grep -c "worker w1 ready" "$D/b.log")
kill -9 "$Pw1"
"$B/reel-worker" --name w1 --broker "$WA,$WB" --weights "$D/w/base.safetensors" --streams 1 --heartbeat-ms 200 \
    --lora >"$D/w1b.log" 2>&1 &
PIDS="$PIDS $!"
wait_for "$D/w1b.log" "applied transformer v6" 60 && grep -q "applied transformer v2" "$D/w1b.log" &&
    ! grep -q "not this worker's base" "$D/w1b.log" &&
    ok "w1, restarted below the base, is sent v2 then v6 by B" ||
    { bad "w1 below the base at B (ready before: $before)"; show "$D/w1b.log" "$D/b.log"; }
finish
