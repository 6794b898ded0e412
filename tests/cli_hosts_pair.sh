#!/bin/sh
# cli_hosts_pair.sh -- a standby pair across hosts (issue 30 §2; part of
# `make test-hosts` and `make test`): four network namespaces on one
# bridge (10.78.0.0/24): broker A (primary, .1), broker B (backup, .2), and
# two worker hosts (.3, .4) whose workers and clients are given both
# brokers; TCP with CURVE (the pair shares one broker key). Checks, each
# under load (two GENs in flight from a worker host):
#   - A active, B standby, both workers at A; a sync by upload through
#     the pair, and B's copy of it fetched from A (the pair's key);
#   - A's link cut (ip link set down: A still runs, cut off from all):
#     B takes over (time printed), the GENs in flight are answered once,
#     bitwise `reelctl run` on the version their answers name;
#   - A's link back: A, still active at term 1, hears B active at term 2
#     and steps down: one active broker;
#   - B's process killed: A takes over (time printed), the GENs answered.
# Needs `ip netns` (root, CAP_NET_ADMIN): where it is not permitted it
# prints one SKIP line and exits 0.
# Usage: cli_hosts_pair.sh BUILD
set -u
B="$(cd "${1:-build}" && pwd)"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-hpair.XXXXXX)
SUITE=hosts_pair
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"

NS="rsw$$ rpa$$ rpb$$ rh1$$ rh2$$"
nsx() { _n=$1; shift; ip netns exec "$_n$$" "$@"; }
cleanup_ns() { for n in $NS; do ip netns del "$n" 2>/dev/null; done; }
trap 'cleanup; cleanup_ns' EXIT INT TERM

if ! ip netns add "rsw$$" 2>/dev/null; then
    echo "SKIP hosts_pair: ip netns is not permitted here (needs root and CAP_NET_ADMIN); nothing was run"
    echo "$SUITE: 0 passed, 0 failed (skipped)"
    exit 0
fi
skip_net() {
    echo "SKIP hosts_pair: $1 is not permitted here; nothing of Reel was run"
    echo "$SUITE: 0 passed, 0 failed (skipped)"
    exit 0
}
nsx rsw ip link add br0 type bridge && nsx rsw ip link set br0 up && nsx rsw ip link set lo up ||
    skip_net "a bridge in a namespace"
i=1
for h in rpa rpb rh1 rh2; do
    ip netns add "$h$$" || skip_net "creating network namespaces"
    ip link add "v$h$$" type veth peer name "s$h$$" &&
        ip link set "v$h$$" netns "$h$$" && ip link set "s$h$$" netns "rsw$$" &&
        nsx rsw ip link set "s$h$$" master br0 && nsx rsw ip link set "s$h$$" up &&
        nsx "$h" ip addr add "10.78.0.$i/24" dev "v$h$$" && nsx "$h" ip link set "v$h$$" up &&
        nsx "$h" ip link set lo up || skip_net "joining a namespace to the bridge"
    i=$((i + 1))
done
nsx rpa ip -o addr show "vrpa$$" | grep -q 10.78.0.1 && nsx rh2 ip -o addr show "vrh2$$" | grep -q 10.78.0.4 &&
    ok "four namespaces on one bridge: brokers 10.78.0.1 and .2, worker hosts .3 and .4" ||
    { bad "the namespaces are not addressed"; finish; }

K="$D/keys"
"$R" keys new --role broker --out "$K" >/dev/null 2>&1
"$R" keys new --role trainer --out "$K" >/dev/null 2>&1
for w in w1 w2; do "$R" keys new --role worker --name "$w" --out "$K" >/dev/null 2>&1; done
for v in 1 2; do "$R" weights init --config tiny --seed $((80 + v)) --out "$D/v$v.safetensors" 2>/dev/null; done
for k in 1 2; do "$R" tensor rand --name context --shape 5,32 --seed $((90 + k)) --out "$D/c$k.safetensors" >/dev/null; done
A=10.78.0.1; BB=10.78.0.2
PAIR="tcp://$A:5555,tcp://$BB:5555"

broker() { # NAME NS ADDR PEER ROLE LOG
    : >"$6"
    ip netns exec "$2$$" "$B/reel-broker" --clients "tcp://$3:5555" --workers "tcp://$3:5556" --keys "$K" \
        --catalog "$D/$1.db" --heartbeat-ms 200 --peer "tcp://$4:5555" --role "$5" --peer-timeout-ms 1500 \
        --weights-dir "$D/up$1" >>"$6" 2>&1 &
    eval "P$1=$!"
    PIDS="$PIDS $!"
}
mkdir -p "$D/upa" "$D/upb"
broker a rpa $A $BB primary "$D/a.log"
broker b rpb $BB $A backup "$D/b.log"
wait_for "$D/a.log" "reel-broker: active \(term 1\)" 60 && wait_for "$D/b.log" "reel-broker: standby" 60 &&
    wait_for "$D/b.log" "peer heard" 60 && wait_for "$D/a.log" "peer heard" 60 &&
    ok "A active (term 1), B standby, each hearing the other over the bridge (TCP, CURVE)" || { bad "the pair starts"; show "$D/a.log"; show "$D/b.log"; finish; }
worker() { # NAME NS
    ip netns exec "$2$$" "$B/reel-worker" --name "$1" --broker "tcp://$A:5556,tcp://$BB:5556" \
        --weights "$D/v1.safetensors" --weights-dir "$D" --key "$K/$1.key" --broker-key "$K/broker.pub" \
        --heartbeat-ms 200 --liveness 5 --streams 1 >>"$D/$1.log" 2>&1 &
    PIDS="$PIDS $!"
}
worker w1 rh1
worker w2 rh2
wait_for "$D/a.log" "worker w1 ready" 60 && wait_for "$D/a.log" "worker w2 ready" 60 &&
    ok "both workers registered with A" || { bad "workers at A"; show "$D/a.log"; finish; }

export REEL_KEY="$K/trainer.key" REEL_BROKER_KEY="$K/broker.pub" REEL_CLIENT_LIVENESS_MS=300
nsx rh1 "$R" sync --broker "$PAIR" --version 2 --upload "$D/v2.safetensors" --timeout-ms 60000 2>"$D/s2.err"
grep -q "sync transformer v2: complete" "$D/s2.err" && ok "sync v2 by upload through the pair: complete on both hosts" ||
    { bad "sync v2"; show "$D/s2.err"; }
wait_for "$D/b.log" "copied transformer v2 from the active broker" 60 &&
    cmp -s "$D/v2.safetensors" "$D/upb/transformer-v2.safetensors" &&
    ok "B (standby) copied the uploaded v2 from A over the bridge (FETCH with the pair's key), byte for byte" ||
    { bad "B's copy of v2"; show "$D/b.log"; }
# the pair's key on the client socket sends PEER, FETCH and STATUS only;
# FETCH there under another key is forbidden
fetch='{"type":"FETCH","id":11,"component":"transformer","version":2,"sha256":"'"$(sha256sum "$D/v2.safetensors" | cut -c1-64)"'","offset":0}'
# speer KEY HEADER: a raw peer on A's client endpoint until its answer (30 s
# at most; each of the three below is answered: not a 1 s window)
speer() { _k=$1; shift; nsx rh1 $PY "$(dirname "$0")/security_peer.py" --endpoint "tcp://$A:5555" --key "$K/$_k.key" --broker-key "$K/broker.pub" --for 30 --answered "$@"; }
speer broker "$fetch" >"$D/pf.out" 2>&1
speer broker '{"type":"GEN","id":12,"model":"tiny"}' >"$D/pg.out" 2>&1
speer trainer "$fetch" >"$D/tf.out" 2>&1
if grep -q "^FETCH_DATA" "$D/pf.out" && grep -q "^ERROR forbidden the peer broker's key sends PEER, FETCH and STATUS only" "$D/pg.out" &&
    grep -q "^ERROR forbidden FETCH: only the peer broker" "$D/tf.out" && ! grep -q "^FETCH_DATA" "$D/tf.out"; then
    ok "A's client endpoint: the pair's key FETCHes, its GEN is forbidden; a trainer key's FETCH is forbidden"
else
    bad "the pair key's roles"; show "$D/pf.out" "$D/pg.out" "$D/tf.out"
fi

# two long GENs from worker host .3 (tests/lib_cli.sh: long_gens, long_answered, long_running)
LG_RUN="nsx rh1" LG_STEPS=6000 LG_SEED=30 LG_TIMEOUT_MS=180000 LG_WEIGHTS=v%s.safetensors
now_ms() { $PY -c 'import time; print(int(time.monotonic() * 1000))'; }

# --- A's link cut under load ------------------------------------------------------
long_gens cut "$PAIR" 2
long_running "tcp://$A:5555" || bad "requests running at A before the cut"
t0=$(now_ms)
nsx rpa ip link set "vrpa$$" down
wait_for "$D/b.log" "reel-broker: active \(term 2\)" 60 && t1=$(now_ms)
wait_count "$D/b.log" "worker w[12] ready" 2 60 && t2=$(now_ms)
[ -n "${t1:-}" ] && ok "A's link cut: B active at term 2 $((t1 - t0)) ms later, both workers there $((${t2:-0} - t0)) ms after the cut" ||
    { bad "B takes over after A's link is cut"; show "$D/b.log"; }
for p in $gp; do reap "$p" 180 >/dev/null; done
long_answered cut 2 2 && ok "the 2 GENs in flight at the cut: each answered once, bitwise reelctl run" || bad "GENs at the cut"

# --- A back: it steps down ---------------------------------------------------------
nsx rpa ip link set "vrpa$$" up
wait_for "$D/a.log" "reel-broker: standby: the peer is active at term 2" 60 &&
    ok "A's link back: A (active at term 1 through the cut) hears B at term 2 and steps down" ||
    { bad "A steps down"; show "$D/a.log"; }
actives=0
for h in $A $BB; do
    nsx rh1 "$R" status --broker "tcp://$h:5555" --json 2>/dev/null |
        $PY -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["ha"]["state"]=="active" else 1)' && actives=$((actives + 1))
done
[ $actives = 1 ] && ok "one active broker of the two" || bad "$actives active brokers"

# --- B killed under load -------------------------------------------------------------
long_gens kill "$PAIR" 2
long_running "tcp://$BB:5555" || bad "requests running at B before the kill"
nb=$(grep -c "worker w[12] ready" "$D/a.log")
t0=$(now_ms)
kill -9 "$Pb"
t1=""
wait_for "$D/a.log" "reel-broker: active \(term 3\)" 60 && t1=$(now_ms)
wait_count "$D/a.log" "worker w[12] ready" $((nb + 2)) 60 && t2=$(now_ms)
[ -n "$t1" ] && ok "B killed: A active at term 3 $((t1 - t0)) ms later, both workers there $((${t2:-0} - t0)) ms after the kill" ||
    { bad "A takes over after B's kill"; show "$D/a.log"; }
for p in $gp; do reap "$p" 180 >/dev/null; done
long_answered kill 2 2 && ok "the 2 GENs in flight at the kill: each answered once, bitwise reelctl run" || bad "GENs at the kill"
finish
