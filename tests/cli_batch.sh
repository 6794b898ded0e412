#!/bin/sh
# cli_batch.sh -- requests of many clients batched into one step (issue 29)
# through a real reel-broker and reel-worker over ipc. Ten clients send
# single GENs at once (different contexts, seeds, guidance, shifts, step
# counts; Euler and SDE with trajectories and log-probs; CFG and not).
# They queue at the broker before the worker starts, so the worker holds
# several at a time. With --max-batch 1 each runs alone (no mixed step);
# with --max-batch 4 (ladder: padded to 2 or 4 rows) and with --batch-sizes
# exact (--batching always), requests of one kind share steps, and every result (latent,
# trajectory, means, log-probs) is bitwise the one served alone, its latent
# bitwise `reelctl run`. A sync landing among batched requests: with
# --sync-mode drain each request runs on one version, bitwise `reelctl run`
# on it; with steps every request is answered and names its versions.
# Under load, two workers: one key's requests all run on its owner, batched.
# Usage: cli_batch.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-batch.XXXXXX)
SUITE=batch
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"

"$R" weights init --config tiny --seed 7 --out "$D/w1.safetensors" 2>/dev/null
"$R" weights init --config tiny --seed 8 --out "$D/w2.safetensors" 2>/dev/null
for i in 0 1 2 3 4 5; do
    "$R" tensor rand --name context --shape 5,32 --seed $((10 + i)) --out "$D/c$i.safetensors" >/dev/null
done
"$R" tensor rand --name context --shape 5,32 --seed 20 --out "$D/unc.safetensors" >/dev/null

# request k: its context, guidance (none: no CFG), steps, shift, seed, SDE
# eta (none: Euler), what it records
N=10
spec() {
    case $1 in
    0) echo "c0 3 4 3 1 - -" ;;
    1) echo "c1 5 6 2 2 - -" ;;
    2) echo "c2 3 3 5 3 0.7 --trajectory --log-probs --means" ;;
    3) echo "c3 2 5 1 4 0.4 --log-probs" ;;
    4) echo "c4 - 4 3 5 - -" ;;
    5) echo "c5 - 5 3 6 0.5 --log-probs" ;;
    6) echo "c0 4 4 3 7 - -" ;;
    7) echo "c1 3 7 3 8 0.9 --trajectory" ;;
    8) echo "c2 - 3 4 9 - -" ;;
    9) echo "c3 6 4 2 10 - -" ;;
    esac
}
# args k [STEPS]: the flags request k shares between `gen` and `run` (its
# steps, or STEPS), then its records (gen only) after a '|'
args() {
    st=${2:-}
    set -- $(spec "$1")
    a="--context $D/$1.safetensors --steps ${st:-$3} --shift $4 --seed $5 --size 2x8x8"
    [ "$2" != - ] && a="$a --uncond $D/unc.safetensors --cfg $2"
    [ "$6" != - ] && a="$a --sde --eta $6"
    shift 6
    r="$*"
    [ "$r" = - ] && r=""
    echo "$a|$r"
}

# same_all A B k: every tensor request k's result holds (its latent and
# what it records) bitwise equal in A and B
same_all() {
    names="latent"
    case "$(spec "$3")" in *--trajectory*) names="$names trajectory" ;; esac
    case "$(spec "$3")" in *--means*) names="$names means" ;; esac
    case "$(spec "$3")" in *--log-probs*) names="$names log_probs" ;; esac
    for nm in $names; do
        "$R" tensor diff "$1" "$2" --name "$nm" >/dev/null 2>&1 || return 1
    done
}

cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" \
    --heartbeat-ms 200 || { bad "broker starts"; show "$D/broker.log"; finish; }

port_of() { sed -n 's/.*metrics and health on http:\/\/[^ ]* (port \([0-9]*\)).*/\1/p' "$1" | head -1; }
metric() { # PORT NAME: the value of sample NAME on that /metrics (waits for the publish after the last step)
    $PY - "$1" "$2" <<'EOF'
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=30).read().decode()
for line in body.splitlines():
    f = line.split()
    if len(f) == 2 and f[0] == sys.argv[2]:
        print(int(float(f[1])))
        break
else:
    print(-1)
EOF
}
queued() { "$R" status --broker "ipc://$D/c" --json 2>/dev/null | $PY -c 'import json,sys; print(json.load(sys.stdin)["queue"])' 2>/dev/null; }

# round TAG WORKER_ARGS...: the ten GENs queued, then a worker with those
# flags serves them; each GEN's output in $D/TAG.k.safetensors
round() {
    t=$1; shift
    gp=""
    k=0
    while [ $k -lt $N ]; do
        a=$(args $k)
        "$R" gen --broker "ipc://$D/c" --model tiny ${a%%|*} ${a#*|} --timeout-ms 120000 --out "$D/$t.$k.safetensors" \
            2>"$D/$t.$k.err" &
        gp="$gp $!"
        k=$((k + 1))
    done
    i=0
    while [ "$(queued)" != "$N" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    [ "$(queued)" = "$N" ] && ok "$t: the ten GENs wait at the broker" || bad "$t: queued $(queued) of $N"
    cli_worker "$t" "$D/broker.log" "$D/$t.log" --broker "ipc://$D/w" --weights "$D/w1.safetensors" \
        --streams 1 --warmup 1 --heartbeat-ms 200 --metrics 127.0.0.1:0 "$@" || { bad "$t registers"; show "$D/$t.log"; }
    failed=0
    for p in $gp; do reap "$p" 180 || failed=$((failed + 1)); done
    [ $failed = 0 ] && ok "$t: all ten GENs answered" || bad "$t: $failed GENs failed"
    P=$(port_of "$D/$t.log")
    # the metrics page is published every 500 ms: wait for the one that counts every step
    want=$(k=0; s=0; while [ $k -lt $N ]; do set -- $(spec $k); s=$((s + $3)); k=$((k + 1)); done; echo $s)
    i=0
    while [ "$(metric "$P" reel_worker_step_samples_sum)" != "$want" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    MIXED=$(metric "$P" reel_worker_mixed_steps_total)
    PADDED=$(metric "$P" reel_worker_batch_padded_rows_total)
    STEPS=$(metric "$P" reel_worker_step_samples_count)
    SAMPLES=$(metric "$P" reel_worker_step_samples_sum)
    echo "  ($t: $STEPS steps ran $SAMPLES request steps; $MIXED mixed, $PADDED padded rows)"
    stop_proc "$WORKER" || bad "$t stops"
}

round alone --max-batch 1 --threads 1
grep -q "sharing a pool of 1 thread on" "$D/alone.log" && ok "alone: --threads 1 sizes the CPU pool" ||
    bad "alone: the worker's log does not say a pool of 1 thread"
grep -q "attention fused (mode auto): the CPU's attention kernel" "$D/alone.log" &&
    ok "alone: the CPU worker logs its attention choice at start (docs/OPERATIONS.md)" ||
    bad "alone: the worker's log does not say its attention choice"
[ "$MIXED" = 0 ] && [ "$STEPS" = "$SAMPLES" ] && ok "--max-batch 1: every request stepped alone ($STEPS steps)" ||
    bad "--max-batch 1: $MIXED mixed steps, $STEPS steps for $SAMPLES request steps"

# the references: each latent from reelctl run, in this process, alone
k=0
while [ $k -lt $N ]; do
    a=$(args $k)
    "$R" run --weights "$D/w1.safetensors" ${a%%|*} --out "$D/ref.$k.safetensors" 2>"$D/ref.$k.err" || bad "reelctl run $k"
    k=$((k + 1))
done
k=0; n=0
while [ $k -lt $N ]; do
    "$R" tensor diff "$D/alone.$k.safetensors" "$D/ref.$k.safetensors" --name latent >/dev/null 2>&1 && n=$((n + 1))
    k=$((k + 1))
done
[ $n = $N ] && ok "alone: every latent is bitwise reelctl run" || bad "alone: $n of $N latents equal reelctl run"

for mode in ladder exact; do
    round "$mode" --max-batch 4 --batch-sizes "$mode" --batching always --threads 3
    grep -q "sharing a pool of 3 threads on" "$D/$mode.log" && ok "$mode: --threads 3 sizes the CPU pool" ||
        bad "$mode: the worker's log does not say a pool of 3 threads"
    [ "$MIXED" -gt 0 ] && [ "$STEPS" -lt "$SAMPLES" ] &&
        ok "$mode: $MIXED mixed steps; $STEPS steps ran the $SAMPLES request steps" ||
        bad "$mode: no batching ($MIXED mixed steps, $STEPS steps for $SAMPLES)"
    if [ "$mode" = ladder ]; then
        # the catalog: each request's steps run in a batch (the alone round's rows add 0)
        wait_sql "$D/reel.db" "select count(*) from requests where status='ok'" 20 60
        bs=$(/usr/bin/sqlite3 "$D/reel.db" "select sum(batched_steps) from requests" 2>/dev/null)
        [ "$bs" = "$((SAMPLES - (STEPS - MIXED)))" ] &&
            ok "ladder: the catalog's batched_steps ($bs) are the request steps of the $MIXED mixed steps" ||
            bad "ladder: catalog batched_steps $bs, expected $((SAMPLES - (STEPS - MIXED)))"
        rb=$("$R" requests --catalog "$D/reel.db" --json 2>/dev/null |
            $PY -c 'import json,sys; print(sum(r["batched_steps"] for r in json.load(sys.stdin)))' 2>/dev/null)
        [ "$rb" = "$bs" ] && "$R" requests --catalog "$D/reel.db" 2>/dev/null | head -1 | grep -q batched &&
            ok "ladder: reelctl requests shows them (a batched column; $rb in all)" || bad "reelctl requests: batched $rb"
        # each batched step was in a batch of 2..4 requests; padding as the metric saw it
        br=$(/usr/bin/sqlite3 "$D/reel.db" "select sum(batch_rows) || ' ' || sum(padded_rows) from requests where worker = 'ladder'" 2>/dev/null)
        set -- $br
        pc=n; [ "${2:-0}" -gt 0 ] && pc=y
        pm=n; [ "$PADDED" -gt 0 ] && pm=y
        [ "${1:-0}" -ge $((2 * bs)) ] && [ "${1:-0}" -le $((4 * bs)) ] && [ $pc = $pm ] &&
            ok "ladder: the catalog's batch_rows ($1, $(awk "BEGIN { printf \"%.2f\", $1 / $bs }") a batch) and padded_rows ($2)" ||
            bad "ladder: catalog batch_rows/padded_rows '$br' for $bs batched steps, $PADDED padded rows in the metric"
        nb=$(cat "$D"/ladder.*.err | grep -c "batched with other requests")
        [ "$nb" -gt 0 ] && ok "ladder: reelctl gen says so for $nb requests" || { bad "ladder: gen never says batched"; show "$D/ladder.0.err"; }
    fi
    if [ "$mode" = exact ]; then
        [ "$PADDED" = 0 ] && ok "exact: no padded rows" || bad "exact: $PADDED padded rows"
        wait_sql "$D/reel.db" "select count(*) from requests where worker = 'exact'" $N 60
        ep=$(/usr/bin/sqlite3 "$D/reel.db" "select sum(padded_rows) || ' ' || sum(batch_rows >= 2 * batched_steps) from requests where worker = 'exact'" 2>/dev/null)
        [ "$ep" = "0 $N" ] && ok "exact: the catalog records no padded rows and batches of 2 or more" ||
            bad "exact: catalog padded rows / requests with batches of 2+: $ep"
    else
        [ "$PADDED" -ge 0 ] && ok "ladder: $PADDED padded rows counted" || bad "ladder: padded rows metric missing"
    fi
    # the catalog counts each replay of a batch's graph once, under the
    # batch graph's own capture key (not once per member under the
    # member's key, which has no graph: a placeholder row), and each
    # request's capture_key is the graph its last step ran under
    reps=$(sed -n 's/.*stopping; capture cache: [0-9]* captures, \([0-9]*\) replays.*/\1/p' "$D/$mode.log")
    wait_sql "$D/reel.db" "select coalesce(sum(replay_count), 0) from captures where worker = '$mode'" "${reps:-x}" 30
    cr=$(/usr/bin/sqlite3 "$D/reel.db" "select coalesce(sum(replay_count), 0) from captures where worker = '$mode'" 2>/dev/null)
    [ -n "$reps" ] && [ "$cr" = "$reps" ] &&
        ok "$mode: the catalog's replays are the worker's own count ($reps): one per replay of a batch's graph" ||
        bad "$mode: catalog replays $cr, the worker counted '${reps:-?}'"
    ph=$(/usr/bin/sqlite3 "$D/reel.db" "select (select count(*) from captures where worker = '$mode' and placeholder = 1) || ' ' || (select count(*) from requests r where worker = '$mode' and status = 'ok' and not exists (select 1 from captures c where c.worker = r.worker and c.key_hash = r.capture_key and c.placeholder = 0))" 2>/dev/null)
    [ "$ph" = "0 0" ] && ok "$mode: no placeholder capture rows; every request's capture_key names a graph its worker captured" ||
        bad "$mode: placeholder rows / requests whose capture_key names no captured graph: $ph"
    k=0; n=0; bad_ones=""
    while [ $k -lt $N ]; do
        if same_all "$D/$mode.$k.safetensors" "$D/alone.$k.safetensors" $k; then n=$((n + 1)); else bad_ones="$bad_ones $k"; fi
        k=$((k + 1))
    done
    [ $n = $N ] && ok "$mode: every result (latent, trajectory, means, log-probs) is bitwise the request served alone" ||
        bad "$mode: requests$bad_ones differ from alone"
done

# --batching auto: batches only while they cost a request less (measured
# as it runs); whatever it chose, every result is the request alone
round auto --max-batch 4
k=0; n=0
while [ $k -lt $N ]; do
    same_all "$D/auto.$k.safetensors" "$D/alone.$k.safetensors" $k && n=$((n + 1))
    k=$((k + 1))
done
[ $n = $N ] && ok "auto: $MIXED mixed steps; every result bitwise the request served alone" || bad "auto: $n of $N equal"

# A sync lands while batched requests run: once the worker holds them.
sync_round() { # TAG WEIGHTS VERSION WORKER_ARGS...: the worker starts on WEIGHTS at VERSION; the sync brings $V
    t=$1; wf=$2; wv=$3; shift 3
    gp=""
    k=0
    while [ $k -lt $N ]; do
        a=$(args $k 40)
        "$R" gen --broker "ipc://$D/c" --model tiny ${a%%|*} --timeout-ms 120000 \
            --out "$D/$t.$k.safetensors" 2>"$D/$t.$k.err" &
        gp="$gp $!"
        k=$((k + 1))
    done
    i=0
    while [ "$(queued)" != "$N" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    cli_worker "$t" "$D/broker.log" "$D/$t.log" --broker "ipc://$D/w" --weights "$D/$wf.safetensors" \
        --weights-version "$wv" --streams 1 --warmup 1 --heartbeat-ms 200 --max-batch 4 --batching always "$@" ||
        { bad "$t registers"; show "$D/$t.log"; }
    i=0
    while [ $i -lt 600 ] && ! "$R" status --json --broker "ipc://$D/c" 2>/dev/null | grep -q '"inflight":[1-9]'; do
        sleep 0.05; i=$((i + 1))
    done
    "$R" sync --broker "ipc://$D/c" --version "$V" --weights "$D/w$(( (V + 1) % 2 + 1 )).safetensors" \
        --timeout-ms 120000 2>"$D/$t.sync" || { bad "$t: the sync"; show "$D/$t.sync"; }
    failed=0
    for p in $gp; do reap "$p" 240 || failed=$((failed + 1)); done
    [ $failed = 0 ] && ok "$t: all ten GENs answered across the sync" || bad "$t: $failed GENs failed"
    stop_proc "$WORKER" || bad "$t stops"
}
# v2 holds w2's weights, v3 w1's again (the sync before names the file)
V=2
sync_round drain w1 1 --sync-mode drain
grep -q "complete" "$D/drain.sync" && ok "drain: the sync completed" || { bad "drain: sync"; show "$D/drain.sync"; }
k=0; n=0; mixed=0; bad_ones=""
while [ $k -lt $N ]; do
    a=$(args $k 40)
    if grep -q "weights v1->" "$D/drain.$k.err"; then
        mixed=$((mixed + 1))
    else
        v=$(sed -n 's/.*weights v\([0-9]*\),.*/\1/p' "$D/drain.$k.err" | head -1)
        w=$([ "$v" = 2 ] && echo w2 || echo w1)
        "$R" run --weights "$D/$w.safetensors" ${a%%|*} --out "$D/dref.$k.safetensors" 2>/dev/null
        if "$R" tensor diff "$D/drain.$k.safetensors" "$D/dref.$k.safetensors" --name latent >/dev/null 2>&1; then
            n=$((n + 1))
        else
            bad_ones="$bad_ones $k(v$v)"
        fi
    fi
    k=$((k + 1))
done
[ $mixed = 0 ] && [ $n = $N ] && ok "drain: each request ran on one version, bitwise reelctl run on it" ||
    bad "drain: $mixed requests ran on two versions; differ from reelctl run:$bad_ones"
V=3
sync_round steps w2 2 --sync-mode steps
grep -q "complete" "$D/steps.sync" && ok "steps: the sync completed" || { bad "steps: sync"; show "$D/steps.sync"; }
k=0; n=0
while [ $k -lt $N ]; do
    grep -q "weights v[0-9]" "$D/steps.$k.err" && n=$((n + 1))
    k=$((k + 1))
done
[ $n = $N ] && ok "steps: every request names the versions it ran on" || bad "steps: $n of $N name their versions"

# Under load a key stays with its owner (rendezvous; a busy owner keeps its
# keys, the request waits for a slot), so its requests meet where its
# graphs are and batch there: two workers, twelve GENs of one key at once.
cli_broker "$D/b2.log" --clients "ipc://$D/c2" --workers "ipc://$D/w2" --catalog "$D/r2.db" --heartbeat-ms 200 ||
    bad "second broker starts"
for w in wa wb; do
    cli_worker "$w" "$D/b2.log" "$D/$w.log" --broker "ipc://$D/w2" --weights "$D/w1.safetensors" --streams 1 \
        --warmup 1 --heartbeat-ms 200 --max-batch 4 --batching always --max-inflight 4 --metrics 127.0.0.1:0 ||
        bad "$w registers"
done
gp=""
k=0
while [ $k -lt 12 ]; do
    "$R" gen --broker "ipc://$D/c2" --model tiny --context "$D/c$((k % 6)).safetensors" --uncond "$D/unc.safetensors" \
        --cfg $((2 + k % 5)) --steps 20 --shift 3 --seed $((900 + k)) --size 2x8x8 --timeout-ms 120000 --quiet \
        --out "$D/key.$k.safetensors" 2>"$D/key.$k.err" &
    gp="$gp $!"
    k=$((k + 1))
done
failed=0
for p in $gp; do reap "$p" 180 || failed=$((failed + 1)); done
[ $failed = 0 ] && ok "twelve GENs of one key answered by a cluster of two" || bad "$failed GENs of one key failed"
wait_sql "$D/r2.db" "select count(*) from requests where status='ok'" 12 60
owners=$(/usr/bin/sqlite3 "$D/r2.db" "select count(distinct worker) || ' ' || count(*) from requests where status='ok'")
[ "$owners" = "1 12" ] && ok "all twelve ran on the key's owner, four slots at a time" ||
    bad "one key spread over workers (distinct workers, rows): $owners"
owner=$(/usr/bin/sqlite3 "$D/r2.db" "select worker from requests where status='ok' limit 1")
P=$(port_of "$D/$owner.log")
i=0 # the page is published every 500 ms
while [ "$(metric "$P" reel_worker_step_samples_sum)" -lt 240 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
m=$(metric "$P" reel_worker_mixed_steps_total)
[ "${m:-0}" -gt 0 ] && ok "... where they shared steps ($m mixed steps on $owner)" || bad "no mixed steps on the owner $owner"

finish
