#!/bin/sh
# soak_broker_kill.sh -- the broker killed (SIGKILL) at random moments under
# load and restarted, ROUNDS times (issue 30 §1): a real reel-broker, two
# real reel-workers (--sync-mode drain: every result on one version) over
# ipc, and in every round three clients (`reelctl gen`, each GEN its own
# seed, steps and context) and a trainer (`reelctl sync` of the next
# version, by path in odd rounds, uploaded through the broker in even ones)
# in flight when the kill lands (each GEN 300-3300 steps
# of tiny: 0.1-1.5 s here). The moment is drawn (0-400 ms after the round's
# traffic starts; SOAK_SEED replays a run's draws): a random moment is what
# this tests, so that sleep is the one wait here that is not for an event.
# Checked, every round: each GEN exits 0 with exactly one answer, bitwise
# `reelctl run` on the weights of the version its answer names; each sync
# ends complete (by the new broker, after the client's resend) or says why
# not. At the end: STATUS shows nothing queued or running and no version
# pending, the catalog holds no version pending and passes integrity_check.
# `make soak-broker` runs 20 rounds; tests/cli_broker_kill.sh runs 3 in
# `make test`.
# Usage: soak_broker_kill.sh BUILD [ROUNDS]
set -u
B="${1:-build}"
ROUNDS="${2:-20}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-bkill.XXXXXX)
SUITE=broker_kill
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"
export REEL_CLIENT_LIVENESS_MS=300
CE="ipc://$D/c"
WE="ipc://$D/w"
DB="$D/reel.db"
# a deterministic draw per round (the seed is printed: a failing round can be replayed)
SEED=${SOAK_SEED:-$(date +%s)}
echo "soak: $ROUNDS rounds, seed $SEED"
draw() { # N K: the K-th draw of round N, 0..999
    $PY -c "import random; r = random.Random($SEED * 1000 + $1); print([r.randrange(1000) for _ in range(8)][$2])"
}

V=$((ROUNDS + 1))
i=1
while [ $i -le $V ]; do "$R" weights init --config tiny --seed $((100 + i)) --out "$D/w$i.safetensors" 2>/dev/null; i=$((i + 1)); done
for k in 1 2 3; do "$R" tensor rand --name context --shape 5,32 --seed $((20 + k)) --out "$D/c$k.safetensors" >/dev/null; done

start_broker() { # LOG
    cli_broker "$1" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 --weights-dir "$D/up" ||
        { bad "broker starts ($1)"; show "$1"; finish; }
    BP=$BROKER
}
mkdir -p "$D/up"
start_broker "$D/b0.log"
for w in wa wb; do
    cli_worker $w "$D/b0.log" "$D/$w.log" --broker "$WE" --weights "$D/w1.safetensors" --streams 1 \
        --sync-mode drain --heartbeat-ms 200 || { bad "worker $w starts"; show "$D/$w.log"; finish; }
done

gens_ok=0; gens=0; syncs_ok=0; syncs_failed=0
r=1
while [ $r -le "$ROUNDS" ]; do
    gp=""
    for k in 1 2 3; do
        steps=$((300 + $(draw $r $k) * 3))
        seed=$((r * 10 + k))
        echo "--context $D/c$k.safetensors --steps $steps --seed $seed --size 2x8x8" >"$D/spec$r.$k"
        "$R" gen --broker "$CE" --model tiny $(cat "$D/spec$r.$k") --timeout-ms 120000 \
            --quiet --out "$D/g$r.$k.safetensors" >"$D/g$r.$k.err" 2>&1 &
        gp="$gp $!"
    done
    nv=$((r + 1))
    how=--weights
    [ $((r % 2)) = 0 ] && how=--upload # every other round by value, through the broker
    "$R" sync --broker "$CE" --version $nv $how "$D/w$nv.safetensors" --deadline-ms 30000 --timeout-ms 120000 \
        >"$D/s$r.err" 2>&1 &
    sp=$!
    ms=$(draw $r 0)
    sleep "$(echo "$ms" | awk '{ printf "%.3f", ($1 % 400) / 1000 }')" # the random moment (see the head)
    kill -9 "$BP"
    reap "$BP" 30
    start_broker "$D/b$r.log"
    # every client and the trainer end (bounded), each with its one answer
    for p in $gp; do reap "$p" 120; done
    reap "$sp" 120
    src=$?
    for k in 1 2 3; do
        gens=$((gens + 1))
        f="$D/g$r.$k.err"
        n=$(grep -c "^reelctl: gen tiny" "$f")
        v=$(sed -n 's/^reelctl: gen tiny .*weights v\([0-9]*\),.*/\1/p' "$f" | head -1)
        if [ "$n" != 1 ] || [ -z "$v" ]; then
            bad "round $r GEN $k: $n answers"; show "$f"; continue
        fi
        "$R" run --weights "$D/w$v.safetensors" $(cat "$D/spec$r.$k") --out "$D/r$r.$k.safetensors" 2>/dev/null
        if "$R" tensor diff "$D/g$r.$k.safetensors" "$D/r$r.$k.safetensors" --name latent >/dev/null 2>&1; then
            gens_ok=$((gens_ok + 1))
        else
            bad "round $r GEN $k (v$v): not bitwise reelctl run"
        fi
    done
    if [ "$src" = 0 ] && grep -q "sync transformer v$nv: complete" "$D/s$r.err"; then
        syncs_ok=$((syncs_ok + 1))
    elif grep -qE "sync transformer v$nv: (FAILED|INCOMPLETE)|reelctl: sync: " "$D/s$r.err"; then
        syncs_failed=$((syncs_failed + 1)) # ended, saying why
        echo "  round $r: sync v$nv did not complete: $(grep "reelctl: sync" "$D/s$r.err" | tail -1)"
    else
        bad "round $r: sync v$nv ended without a reason (exit $src)"; show "$D/s$r.err"
    fi
    r=$((r + 1))
done
echo "  in flight at the kill (sent again): $(cat "$D"/g*.err | grep -c "sent again") GEN sends, $(cat "$D"/s*.err | grep -c "sent again") SYNC sends"
[ $gens_ok = $gens ] && ok "$gens GENs over $ROUNDS kills: each answered once, bitwise reelctl run on its version" ||
    bad "$gens_ok of $gens GENs answered once and bitwise"
[ $((syncs_ok + syncs_failed)) = "$ROUNDS" ] &&
    ok "$ROUNDS syncs ended: $syncs_ok complete, $syncs_failed failed with a reason" || bad "syncs: $syncs_ok complete, $syncs_failed failed of $ROUNDS"
# nothing left waiting: no queue, nothing running, no version pending
i=0
while [ $i -lt 100 ]; do
    "$R" status --broker "$CE" --json >"$D/st.json" 2>/dev/null &&
        $PY -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["queue"]==0 and not s.get("pending") and sum(w["inflight"] for w in s["workers"])==0 and len(s["workers"])==2 else 1)' "$D/st.json" && break
    sleep 0.1; i=$((i + 1))
done
[ $i -lt 100 ] && ok "nothing left waiting: queue 0, nothing in flight, no version pending, both workers registered" ||
    { bad "left waiting"; show "$D/st.json"; }
[ "$(/usr/bin/sqlite3 "$DB" "select count(*) from weight_versions where state = 'pending'")" = 0 ] &&
    ok "no version pending in the catalog" || bad "versions pending: $(/usr/bin/sqlite3 "$DB" "select version from weight_versions where state = 'pending'")"
[ "$(/usr/bin/sqlite3 "$DB" "pragma integrity_check")" = ok ] && ok "the catalog passes integrity_check" || bad "catalog integrity"
finish
