#!/bin/sh
# cli_solvers.sh -- Wan's samplers and text_len through a real reel-broker
# and reel-worker over ipc: `reelctl gen --solver unipc|dpm++` is bitwise
# `reelctl run` with the same solver; a second gen of the key replays every
# step; each solver has its own key (loop=unipc, loop=dpm++), which the
# catalog's key report shows;
# --sde with --solver runs SDE steps on that solver's grid (loop=sde-unipc);
# unknown solvers are refused. A model whose config
# has text_len pads every context (and the negative prompt, at its own
# length) to it: prompts of different lengths share one key, the result is
# `reelctl run` with the same contexts, and a context longer than text_len
# is bad_request. A worker older than solvers (its READY lists none) is
# never handed a GEN naming one (it would answer Euler's result): with
# only such a worker the GEN fails no_worker, saying why, while Euler GENs
# still reach it.
# Usage: cli_solvers.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-solvers.XXXXXX)
CE="ipc://$D/clients"
WE="ipc://$D/workers"
CE2="ipc://$D/clients2"
WE2="ipc://$D/workers2"
SUITE=solvers
. "$(dirname "$0")/lib_cli.sh"

"$R" weights init --config tiny --seed 7 --out "$D/w.safetensors" 2>/dev/null
printf '{"name": "tinywan", "dim": 64, "heads": 4, "layers": 2, "ffn_dim": 128, "in_channels": 4, "text_dim": 32, "freq_dim": 256, "text_len": 12}' >"$D/tw.json"
"$R" weights init --config "$D/tw.json" --seed 8 --out "$D/tw.safetensors" 2>"$D/init.err" ||
    { bad "weights init with text_len"; show "$D/init.err"; }
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 3 --out "$D/unc.safetensors"
"$R" tensor rand --name context --shape 9,32 --seed 4 --out "$D/ctx9.safetensors"
"$R" tensor rand --name context --shape 3,32 --seed 5 --out "$D/unc3.safetensors"
"$R" tensor rand --name context --shape 13,32 --seed 6 --out "$D/ctx13.safetensors"
"$R" tensor rand --name context --shape 12,32 --seed 7 --out "$D/ctx12.safetensors"
cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$D/reel.db" --heartbeat-ms 200 ||
    { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "$WE" --weights "$D/w.safetensors" --streams 1 --heartbeat-ms 200 ||
    { bad "worker registers"; finish; }
cli_worker w2 "$D/broker.log" "$D/w2.log" --broker "$WE" --weights "$D/tw.safetensors" --streams 1 --heartbeat-ms 200 ||
    { bad "text_len worker registers"; finish; }

gen() { # out model ctx unc extra...
    o=$1; m=$2; c=$3; u=$4; shift 4
    "$R" gen --broker "$CE" --model "$m" --channels 4 --context "$c" --uncond "$u" --cfg 5 --size 2x8x8 --seed 9 --steps 6 \
        --shift 5 --timeout-ms 60000 --quiet --out "$D/$o.safetensors" "$@" 2>"$D/$o.err"
}
run() { # out weights ctx unc extra...
    o=$1; w=$2; c=$3; u=$4; shift 4
    "$R" run --weights "$w" --context "$c" --uncond "$u" --cfg 5 --size 2x8x8 --seed 9 --steps 6 --shift 5 \
        --out "$D/$o.safetensors" "$@" 2>"$D/$o.err"
}
same() { "$R" tensor diff "$D/$1.safetensors" "$D/$2.safetensors" --name latent >/dev/null 2>&1; }

for so in unipc dpm++; do
    gen "g-$so" tiny "$D/ctx.safetensors" "$D/unc.safetensors" --solver "$so" &&
        run "r-$so" "$D/w.safetensors" "$D/ctx.safetensors" "$D/unc.safetensors" --solver "$so" &&
        same "g-$so" "r-$so" && ok "gen --solver $so is bitwise reelctl run --solver $so" ||
        { bad "gen --solver $so vs run"; show "$D/g-$so.err" "$D/r-$so.err"; }
done
same g-unipc g-dpm++ && bad "unipc and dpm++ gave the same latent" || ok "unipc and dpm++ differ"
gen g-euler tiny "$D/ctx.safetensors" "$D/unc.safetensors" && ! same g-euler g-unipc &&
    ok "no --solver is Euler, not unipc" || { bad "default solver"; show "$D/g-euler.err"; }
grep -q "captured 1, replayed 3" "$D/g-dpm++.err" && ok "dpm++ captures a key of its own" ||
    { bad "dpm++ key"; show "$D/g-dpm++.err"; }
gen g-unipc2 tiny "$D/ctx.safetensors" "$D/unc.safetensors" --solver unipc &&
    grep -q "replayed 6, eager 0" "$D/g-unipc2.err" && same g-unipc g-unipc2 &&
    ok "gen --solver unipc on a warm key: replays only, the same bits" || { bad "warm unipc"; show "$D/g-unipc2.err"; }

# SDE rollouts on a solver's grid (Flow-GRPO's Wan trainer rolls out with
# Wan's UniPC scheduler): --sde --solver unipc|dpm++ runs Flow-GRPO's SDE
# step on that solver's sigmas, the transformer at its int timesteps; the
# key is loop=sde-unipc (sde-dpm++), and the rollout's sigmas are the
# solver's schedule (written in numpy from Wan's scheduler, solvers_ref.py),
# its log-probs those of its trajectory and means by Flow-GRPO's formula.
for so in unipc dpm++; do
    gen "gs-$so" tiny "$D/ctx.safetensors" "$D/unc.safetensors" --solver "$so" --sde --eta 0.7 --trajectory --log-probs --means &&
        run "rs-$so" "$D/w.safetensors" "$D/ctx.safetensors" "$D/unc.safetensors" --solver "$so" --sde --eta 0.7 &&
        same "gs-$so" "rs-$so" && ok "gen --solver $so --sde is bitwise reelctl run --solver $so --sde" ||
        { bad "sde on the $so grid: gen vs run"; show "$D/gs-$so.err" "$D/rs-$so.err"; }
done
gen gs-unipc2 tiny "$D/ctx.safetensors" "$D/unc.safetensors" --solver unipc --sde --eta 0.7 --trajectory --log-probs --means &&
    grep -q "replayed 6, eager 0" "$D/gs-unipc2.err" && same gs-unipc gs-unipc2 &&
    ok "sde on the unipc grid, a warm key: replays only, the same bits" || { bad "warm sde-unipc"; show "$D/gs-unipc2.err"; }
gen gs-euler tiny "$D/ctx.safetensors" "$D/unc.safetensors" --sde --eta 0.7 && ! same gs-euler gs-unipc &&
    ok "sde without --solver keeps Euler's grid (another result)" || { bad "sde grid default"; show "$D/gs-euler.err"; }
PYTHONPATH="$(dirname "$0")/../clients/python:$(dirname "$0")/crosscheck" /usr/bin/python3 - "$D" >"$D/grid.out" 2>&1 <<'PYEOF'
import sys
import numpy as np
from reel import safetensors as st
import solvers_ref as sr
d = sys.argv[1]
ok = True
def check(cond, what):
    global ok
    print(("PASS " if cond else "FAIL ") + what)
    ok = ok and cond
for so in ("unipc", "dpm++"):
    s, _ = st.load(d + "/gs-%s.safetensors" % so)
    sig, ts = sr.SOLVERS[so][0](6, 5.0)
    check(np.array_equal(s["sigmas"], np.asarray(sig, dtype=np.float32)),
          "sde on the %s grid: its sigmas are %s's schedule (6 steps, shift 5), bitwise" % (so, so))
    check(np.array_equal(s["timesteps"], np.asarray(ts, dtype=np.float32)),
          "sde on the %s grid: its timesteps are %s's int timesteps %s" % (so, so, list(ts)))
    # Flow-GRPO's Wan trainer (wan_pipeline_with_logprob.py, sde_step_with_logprob): std_dev_t =
    # sigma_min + (sigma_max - sigma_min) * sigma, sigma_max = sigmas[1], sigma_min = sigmas[-1] (0), times eta;
    # s = std sqrt(sigma_i - sigma_{i+1}); the log-prob of x_{i+1} given its mean, the mean over the latent of
    # -(x - mu)^2 / (2 s^2) - log s - log sqrt(2 pi)
    x, mu, sg = s["trajectory"].astype(np.float64), s["means"].astype(np.float64), s["sigmas"].astype(np.float64)
    lp = []
    for i in range(6):
        si, sn = sg[i], sg[i + 1]
        sd = 0.7 * (sg[-1] + (sg[1] - sg[-1]) * si) * np.sqrt(si - sn)
        lp.append(np.mean(-(x[i + 1] - mu[i]) ** 2 / (2 * sd * sd) - np.log(sd) - np.log(np.sqrt(2 * np.pi))))
    err = float(np.max(np.abs(np.array(lp) - s["log_probs"]) / np.maximum(np.abs(lp), 1)))
    check(err < 1e-4, "sde on the %s grid: log-probs are Flow-GRPO's Wan trainer's of its trajectory and means (err %.2e)"
          % (so, err))
    # and its step is that trainer's: mu_i from x_i and the drift, x_{i+1} - mu_i the noise of std s_i
    step0 = float(np.std(x[1] - mu[0]))
    s0 = 0.7 * sg[1] * sg[0] * np.sqrt(sg[0] - sg[1])
    check(abs(step0 / s0 - 1) < 0.25, "sde on the %s grid: step 0's noise is %.3g, the Wan trainer's std %.3g" % (so, step0, s0))
sys.exit(0 if ok else 1)
PYEOF
py_checks "$D/grid.out" $?
gen x tiny "$D/ctx.safetensors" "$D/unc.safetensors" --solver ddim
[ $? = 2 ] && grep -q "not euler, unipc or dpm++" "$D/x.err" && ok "--solver ddim: usage error" || { bad "unknown solver"; show "$D/x.err"; }
wait_sql "$D/reel.db" "select count(*) from key_texts where key_text like '%loop=sde-unipc %'" 1 60 &&
    "$R" keys --catalog "$D/reel.db" 2>&1 | grep -q "loop=sde-unipc" && ok "reelctl keys shows an SDE rollout's grid (loop=sde-unipc)" ||
    bad "loop=sde-unipc in the key report"
wait_sql "$D/reel.db" "select count(*) from key_texts where key_text like '%loop=unipc %'" 1 60 &&
    wait_sql "$D/reel.db" "select count(*) from key_texts where key_text like '%loop=dpm++ %'" 1 60 &&
    "$R" keys --catalog "$D/reel.db" >"$D/keys.txt" 2>&1 && grep -q "loop=unipc" "$D/keys.txt" && grep -q "loop=dpm++" "$D/keys.txt" &&
    ok "reelctl keys shows each key's solver (loop=unipc, loop=dpm++)" || { bad "solver in the key report"; show "$D/keys.txt"; }

# text_len 12: contexts of 5 and 9 rows, negative prompts of 5 and 3, all padded to 12.
gen t1 tinywan "$D/ctx.safetensors" "$D/unc3.safetensors" --solver unipc &&
    run rt1 "$D/tw.safetensors" "$D/ctx.safetensors" "$D/unc3.safetensors" --solver unipc && same t1 rt1 &&
    ok "text_len: gen with context 5 and negative prompt 3 rows is bitwise reelctl run" ||
    { bad "text_len gen vs run"; show "$D/t1.err" "$D/rt1.err"; }
gen t2 tinywan "$D/ctx9.safetensors" "$D/unc.safetensors" --solver unipc &&
    grep -q "replayed 6, eager 0" "$D/t2.err" && ok "text_len: a prompt of another length replays the same graphs" ||
    { bad "text_len shares the key"; show "$D/t2.err"; }
gen t5 tinywan "$D/ctx12.safetensors" "$D/unc3.safetensors" --solver dpm++ &&
    run rt5 "$D/tw.safetensors" "$D/ctx12.safetensors" "$D/unc3.safetensors" --solver dpm++ && same t5 rt5 &&
    ok "text_len: a context of exactly text_len rows beside a 3-row negative prompt is bitwise reelctl run" ||
    { bad "full-length context, short negative prompt"; show "$D/t5.err" "$D/rt5.err"; }
gen t3 tinywan "$D/ctx.safetensors" "$D/unc.safetensors" --solver unipc && ! same t1 t3 &&
    ok "text_len: another negative prompt, another result" || { bad "negative prompt ignored"; show "$D/t3.err"; }
gen t4 tinywan "$D/ctx13.safetensors" "$D/unc.safetensors"
[ $? != 0 ] && grep -q "bad_request.*GEN: tensor 'context' .*text_len 12" "$D/t4.err" && ok "text_len: a context of 13 rows is refused, the message naming its GEN and the tensor ($(grep -o 'bad_request.*' "$D/t4.err" | head -c 90))" ||
    { bad "context longer than text_len"; show "$D/t4.err"; }
gen t6 tinywan "$D/ctx.safetensors" "$D/ctx13.safetensors"
[ $? != 0 ] && grep -q "bad_request.*GEN: tensor 'uncond' has 13 rows.*text_len 12" "$D/t6.err" &&
    ok "text_len: a negative prompt of 13 rows is refused naming 'uncond', not the context" ||
    { bad "uncond longer than text_len"; show "$D/t6.err"; }
run x "$D/tw.safetensors" "$D/ctx13.safetensors" "$D/unc.safetensors"
[ $? = 2 ] && grep -q "text_len 12" "$D/x.err" && ok "text_len: reelctl run refuses 13 rows too" || { bad "run over text_len"; show "$D/x.err"; }
gen x tiny "$D/ctx.safetensors" "$D/unc3.safetensors"
[ $? != 0 ] && grep -q "bad_request.*GEN: tensor 'uncond' .*expected the context's" "$D/x.err" && ok "without text_len a negative prompt of another length is bad_request, the message naming its GEN" ||
    { bad "uncond length without text_len"; show "$D/x.err"; }
# Padding is not a no-op: the same prompt without text_len gives another result.
printf '{"name": "tinynl", "dim": 64, "heads": 4, "layers": 2, "ffn_dim": 128, "in_channels": 4, "text_dim": 32, "freq_dim": 256}' >"$D/nl.json"
"$R" weights init --config "$D/nl.json" --seed 8 --out "$D/nl.safetensors" 2>/dev/null
run rn "$D/nl.safetensors" "$D/ctx.safetensors" "$D/unc.safetensors" --solver unipc &&
    run rp "$D/tw.safetensors" "$D/ctx.safetensors" "$D/unc.safetensors" --solver unipc && ! same rn rp &&
    ok "text_len padding changes the result (the padded rows are attended to)" || bad "padding changed nothing"
grep -q "worker w1 ready" "$D/broker.log" && kill -0 "$BROKER" 2>/dev/null && ok "the broker is still up" || bad "broker alive"

echo "== a worker older than solvers gets no GEN naming one"
B1=$BROKER
cli_broker "$D/broker2.log" --clients "$CE2" --workers "$WE2" --heartbeat-ms 200 || bad "second broker starts"
/usr/bin/python3 "$(dirname "$0")/security_peer.py" --endpoint "$WE2" --id old --for 8 --heartbeat \
    '{"type":"READY","name":"old","models":["tiny"],"versions":{"transformer":1}}' >"$D/old.out" 2>&1 &
PIDS="$PIDS $!"; OLD=$!
wait_for "$D/broker2.log" "worker old ready" 60 || bad "the old worker registers"
"$R" gen --broker "$CE2" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --steps 2 --solver unipc \
    --deadline-ms 1500 --timeout-ms 10000 --quiet --out "$D/o1.safetensors" 2>"$D/o1.err"
[ $? != 0 ] && grep -q "no_worker" "$D/o1.err" && grep -q "with solver unipc" "$D/o1.err" &&
    ok "with only an older worker a unipc GEN fails no_worker, naming the solver" || { bad "unipc to an old worker"; show "$D/o1.err"; }
"$R" gen --broker "$CE2" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --steps 2 \
    --deadline-ms 1500 --timeout-ms 10000 --quiet --out "$D/o2.safetensors" 2>"$D/o2.err"
reap "$OLD" 60
grep -q "peer: .* (1 REQUEST)" "$D/old.out" && ok "an Euler GEN still reaches it (the only REQUEST it got)" ||
    { bad "euler to the old worker"; show "$D/old.out"; }
BROKER=$B1
finish
