#!/bin/sh
# cli_rollout.sh -- `reelctl gen` with the rollout outputs of issue 11
# (--trajectory, --log-probs, --means): a real reel-broker and reel-worker
# over ipc. The file gen writes holds the latent, the trajectory x_0..x_N
# (its last entry bitwise the latent, its first the seeded noise that a
# plain gen with the same seed starts from), log_probs [N] and sigmas
# [N+1] and means [N,...] for an SDE rollout, and the weight version of
# each step (metadata version_runs); asking for log-probs without --sde is
# a usage error.
# Usage: cli_rollout.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-rollout.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
SUITE=rollout
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"

"$R" weights init --config tiny --seed 7 --out "$D/w.safetensors" 2>/dev/null
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$D/reel.db" --heartbeat-ms 200 ||
    { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "$WE" --weights "$D/w.safetensors" --streams 1 --heartbeat-ms 200 ||
    { bad "worker registers"; finish; }

gen() { # out extra...
    o=$1; shift
    "$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --seed 5 --steps 4 \
        --timeout-ms 20000 --quiet --out "$D/$o.safetensors" "$@" 2>"$D/$o.err"
}

gen sde --sde --eta 0.7 --trajectory --log-probs --means && ok "gen --sde --trajectory --log-probs --means" ||
    { bad "gen with rollout outputs"; show "$D/sde.err"; }
gen ode --trajectory && ok "gen --trajectory (Euler)" || { bad "gen --trajectory"; show "$D/ode.err"; }
gen plain && ok "plain gen" || { bad "plain gen"; show "$D/plain.err"; }
"$R" gen --broker "$CE" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --seed 5 --steps 4 \
    --log-probs --out "$D/x.safetensors" 2>"$D/x.err"
[ $? = 2 ] && grep -q "for SDE rollouts" "$D/x.err" && ok "--log-probs without --sde: usage error (exit 2)" ||
    { bad "--log-probs without --sde"; show "$D/x.err"; }

PYTHONPATH="$(dirname "$0")/../clients/python" $PY - "$D" >"$D/check.out" 2>&1 <<'EOF'
import sys
import numpy as np
from reel import safetensors as st
d = sys.argv[1]
ok = True
def check(cond, what):
    global ok
    print(("PASS " if cond else "FAIL ") + what)
    ok = ok and cond
s, sm = st.load(d + "/sde.safetensors")
o, om = st.load(d + "/ode.safetensors")
p, _ = st.load(d + "/plain.safetensors")
check(s["trajectory"].shape == (5, 4, 2, 8, 8), "SDE trajectory is [N+1,C,F,H,W] = %s" % (s["trajectory"].shape,))
check(s["log_probs"].shape == (4,) and s["sigmas"].shape == (5,), "log_probs [N] and sigmas [N+1]")
check(s["means"].shape == (4, 4, 2, 8, 8), "means [N,C,F,H,W]")
check(np.array_equal(s["trajectory"][-1], s["latent"]), "the trajectory ends with the latent, bitwise")
check(np.all(np.isfinite(s["log_probs"])) and np.all(s["sigmas"][:-1] > s["sigmas"][1:]),
      "log-probs finite, sigmas decreasing")
check(s["timesteps"].shape == (4,) and np.array_equal(
          s["timesteps"], (1000.0 * s["sigmas"][:-1].astype(np.float64)).astype(np.float32)),
      "timesteps [N]: 1000 sigma_i as the transformer took it (Euler's grid)")
check(np.array_equal(o["trajectory"][-1], o["latent"]) and np.array_equal(o["latent"], p["latent"]),
      "Euler: the trajectory ends with the latent a plain gen returns, bitwise")
check(np.array_equal(o["trajectory"][0], s["trajectory"][0]), "both start from the same seeded noise")
check("log_probs" not in o and "means" not in o, "an Euler gen carries no log-probs or means")
check(sm.get("version_runs", "") != "", "version_runs metadata: '%s'" % sm.get("version_runs", ""))
sys.exit(0 if ok else 1)
EOF
py_checks "$D/check.out" $?
finish
