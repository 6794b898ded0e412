#!/bin/sh
# cli_group.sh -- groups (GEN n > 1) through a real reel-broker and
# reel-worker over ipc: `reelctl gen --n G --seeds ...` runs G samples of
# one prompt as batched steps and each sample is bitwise the single gen
# with its seed (latent, trajectory, means, log-probs); --n without seeds
# uses seed + i; a second group of the same key replays every step; a
# worker whose budget cannot hold the whole batch runs it in smaller
# batches, and a two-stream worker splits it over its streams, all with
# the same bits; bad groups are usage errors.
# Usage: cli_group.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-group.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
CE2="ipc://$D/clients2"
WE2="ipc://$D/workers2"
SUITE=group
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"

"$R" weights init --config tiny --seed 7 --out "$D/w.safetensors" 2>/dev/null
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 3 --out "$D/unc.safetensors"
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$D/reel.db" --heartbeat-ms 200 ||
    { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "$WE" --weights "$D/w.safetensors" --streams 1 --heartbeat-ms 200 ||
    { bad "worker registers"; finish; }

gen() { # endpoint out extra...
    ep=$1; o=$2; shift 2
    "$R" gen --broker "$ep" --model tiny --context "$D/ctx.safetensors" --uncond "$D/unc.safetensors" --cfg 3 \
        --size 2x8x8 --steps 4 --sde --eta 0.8 --trajectory --log-probs --means \
        --timeout-ms 30000 --quiet --out "$D/$o.safetensors" "$@" 2>"$D/$o.err"
}

gen "$CE" g1 --n 3 --seeds 11,12,11 && ok "gen --n 3 --seeds 11,12,11" || { bad "gen a group"; show "$D/g1.err"; }
gen "$CE" g2 --n 3 --seeds 11,12,11 && ok "the same group again" || { bad "gen the group again"; show "$D/g2.err"; }
grep -q "replayed 4, eager 0" "$D/g2.err" && ok "the second group replays all 4 batched steps" ||
    { bad "second group replays"; show "$D/g2.err"; }
grep -q "a group of 3 in batched steps" "$D/g1.err" && ok "gen reports the group" || { bad "group report"; show "$D/g1.err"; }
gen "$CE" s11 --seed 11 && gen "$CE" s12 --seed 12 && ok "single gens with seeds 11 and 12" ||
    { bad "single gens"; show "$D/s11.err" "$D/s12.err"; }
gen "$CE" g4 --n 4 --seed 20 && ok "gen --n 4 --seed 20 (seeds 20..23)" || { bad "gen --n 4"; show "$D/g4.err"; }
gen "$CE" s23 --seed 23 && ok "single gen with seed 23" || bad "single gen 23"

"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --steps 2 --n 3 --seeds 1,2 \
    --out "$D/x.safetensors" 2>"$D/x.err"
[ $? = 2 ] && grep -q "2 seeds for --n 3" "$D/x.err" && ok "--seeds count differs from --n: usage error" ||
    { bad "--seeds/--n mismatch"; show "$D/x.err"; }
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --steps 2 --n 65 \
    --out "$D/x.safetensors" 2>"$D/x.err"
[ $? = 2 ] && grep -q "group size in 1..64" "$D/x.err" && ok "--n 65: usage error" || { bad "--n 65"; show "$D/x.err"; }

# A worker whose budget holds two samples' workspace, not four: the group
# runs in smaller batches, with the same bits.
cli_broker "$D/broker2.log" --clients "$CE2" --workers "$WE2" --catalog "$D/reel2.db" --heartbeat-ms 200 || bad "second broker starts"
cli_worker w2 "$D/broker2.log" "$D/w2.log" --broker "$WE2" --weights "$D/w.safetensors" --streams 1 \
    --heartbeat-ms 200 --budget 250K || bad "small-budget worker registers"
gen "$CE2" g4small --n 4 --seed 20 && ok "the group of 4 on a worker with a 250K budget" ||
    { bad "group on a small budget"; show "$D/g4small.err" "$D/w2.log"; }
grep -q "a group of 4 runs in batches of 2" "$D/w2.log" && ok "the worker says it split the group by its budget" ||
    { bad "split logged"; show "$D/w2.log"; }
kill "$WORKER" 2>/dev/null
# A worker with two streams (CPU: two threads) runs a group split over
# both, a batched part on each (part p on stream p): the same bits, and from
# its second run every batched step of both parts replays; with a budget
# too small for a part's batch, each part runs in batches of one.
cli_worker w3 "$D/broker2.log" "$D/w3.log" --broker "$WE2" --weights "$D/w.safetensors" --streams 2 \
    --heartbeat-ms 200 || bad "two-stream worker registers"
for k in 1 2 3; do gen "$CE2" g4two$k --n 4 --seed 20 || { bad "group on two streams"; show "$D/g4two$k.err"; }; done
grep -q "replayed 8, eager 0" "$D/g4two2.err" && grep -q "replayed 8, eager 0" "$D/g4two3.err" &&
    ok "from its second run, both parts (each on its own stream) replay all 4 steps (8 batched steps)" ||
    { bad "split group replays"; show "$D/g4two2.err" "$D/g4two3.err"; }
grep -q "4 steps, a group of 4 in batched steps run in parts, 8 steps in all (captured 0, replayed 8, eager 0)" \
    "$D/g4two2.err" && ok "gen says the split group's counts are of its 8 step runs, not its 4 steps" ||
    { bad "split group report"; show "$D/g4two2.err"; }
grep -q "4 steps, a group of 3 in batched steps (captured 0, replayed 4, eager 0)" "$D/g2.err" &&
    ok "an unsplit group's report is unchanged" || { bad "unsplit group report"; show "$D/g2.err"; }
kill "$WORKER" 2>/dev/null
cli_worker w4 "$D/broker2.log" "$D/w4.log" --broker "$WE2" --weights "$D/w.safetensors" --streams 2 \
    --heartbeat-ms 200 --budget 150K || bad "two-stream small-budget worker registers"
gen "$CE2" g4tb --n 4 --seed 20 && ok "the group on two streams and a 150K budget" || { bad "split + budget"; show "$D/g4tb.err"; }
grep -q "a group of 2 runs in batches of 1" "$D/w4.log" && ok "each part of 2 runs in batches of 1" ||
    { bad "parts split by the budget"; show "$D/w4.log"; }

PYTHONPATH="$(dirname "$0")/../clients/python" $PY - "$D" >"$D/check.out" 2>&1 <<'PYEOF'
import sys
import numpy as np
from reel import safetensors as st
d = sys.argv[1]
ok = True
def check(cond, what):
    global ok
    print(("PASS " if cond else "FAIL ") + what)
    ok = ok and cond
def load(n):
    return st.load(d + "/" + n + ".safetensors")[0]
g1, g2, s11, s12, g4, s23, g4s, g4t, g4tb = (load(n) for n in ("g1", "g2", "s11", "s12", "g4", "s23", "g4small",
                                                               "g4two3", "g4tb"))
check(g1["latent"].shape == (3, 4, 2, 8, 8), "group latent is [G,C,F,H,W] = %s" % (g1["latent"].shape,))
check(g1["log_probs"].shape == (3, 4) and g1["sigmas"].shape == (5,), "log_probs [G,N], sigmas [N+1]")
check(g1["trajectory.0"].shape == (5, 4, 2, 8, 8) and g1["means.2"].shape == (4, 4, 2, 8, 8),
      "trajectory.i [N+1,...] and means.i [N,...] per sample")
for i, s in ((0, s11), (1, s12), (2, s11)):
    check(np.array_equal(g1["latent"][i], s["latent"]), "sample %d's latent is bitwise the single gen's" % i)
    check(np.array_equal(g1["trajectory.%d" % i], s["trajectory"]), "sample %d's trajectory, bitwise" % i)
    check(np.array_equal(g1["means.%d" % i], s["means"]), "sample %d's means, bitwise" % i)
    check(np.array_equal(g1["log_probs"][i], s["log_probs"]), "sample %d's log-probs, bitwise" % i)
check(not np.array_equal(g1["latent"][0], g1["latent"][1]), "different seeds, different samples")
check(all(np.array_equal(g1[k], g2[k]) for k in g1), "the replayed group is bitwise the captured one")
check(np.array_equal(g4["latent"][3], s23["latent"]), "--n 4 --seed 20: sample 3 is seed 23's single gen")
check(all(np.array_equal(g4[k], g4s[k]) for k in g4), "the group split by the budget: the same bits")
check(all(np.array_equal(g4[k], g4t[k]) for k in g4), "the group split over two streams: the same bits")
check(all(np.array_equal(g4[k], g4tb[k]) for k in g4), "split over streams and by the budget: the same bits")
sys.exit(0 if ok else 1)
PYEOF
py_checks "$D/check.out" $?
finish
