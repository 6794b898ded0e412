#!/bin/sh
# cli_prewarm.sh -- a restarted worker warm before its requests come
# (issue 29 §2) through a real reel-broker and reel-worker over ipc. Four
# keys get hot (Euler, a CFG group of 3, UniPC, SDE); the worker is killed
# and restarted:
#   - with --prewarm 0 the first request of a hot key runs eager steps;
#   - with --prewarm 2 the broker names 2 keys, the hottest among them;
#   - with --prewarm 8 it names all 4, the worker captures each on each of
#     its 2 streams (catalog captures with origin 'prewarm'), and the first
#     request of every key then replays every step (captured 0, eager 0),
#     bitwise the result before the restart (and `reelctl run`);
#   - a request queued while the worker starts is answered, bitwise;
#   - with two workers, the restarted one is sent only the keys it owns:
#     exactly the keys that then route to it, each replayed from its first
#     step;
#   - batching (--max-batch 4): a hot single key's mixed batches of 2 and 4
#     rows are prewarmed too, and requests that then share steps run no
#     eager step;
#   - under --max-tokens 64 (2 samples of that key) neither prewarm nor a
#     batch goes past 2 rows;
#   - requests of a hot key queued through a restart that share steps in
#     mixed batches leave its prewarm to the background, so a lone request
#     afterwards runs no eager step; --max-inflight 2 prewarms no batch of
#     4.
# Usage: cli_prewarm.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-prewarm.XXXXXX)
SUITE=prewarm
. "$(dirname "$0")/lib_cli.sh"

"$R" weights init --config tiny --seed 7 --out "$D/w.safetensors" 2>/dev/null
for i in 0 1 2 3 4; do
    "$R" tensor rand --name context --shape 5,32 --seed $((10 + i)) --out "$D/c$i.safetensors" >/dev/null
done
"$R" tensor rand --name context --shape 5,32 --seed 20 --out "$D/unc.safetensors" >/dev/null

# key k: the flags its GENs share (`gen` and `run`; the group's are gen's)
spec() {
    case $1 in
    1) echo "--context $D/c1.safetensors --steps 4 --seed 31 --size 2x8x8" ;;
    2) echo "--context $D/c2.safetensors --uncond $D/unc.safetensors --cfg 3 --steps 3 --size 2x8x16 --n 3 --seeds 41,42,43" ;;
    3) echo "--context $D/c3.safetensors --steps 4 --seed 51 --size 2x8x8 --solver unipc" ;;
    4) echo "--context $D/c4.safetensors --steps 3 --seed 61 --size 2x16x8 --sde --eta 0.6" ;;
    5) echo "--context $D/c0.safetensors --steps 3 --seed 71 --size 2x16x16" ;;
    esac
}
# gen K OUT: one GEN of key K through the broker; its line in OUT.err
gen() {
    "$R" gen --broker "ipc://$D/c" --model tiny $(spec "$1") --timeout-ms 120000 --out "$D/$2.safetensors" \
        >"$D/$2.err" 2>&1
}
replayed_all() { grep -q "captured 0, replayed [1-9][0-9]*, eager 0)" "$D/$1.err"; }
prewarm_rows() { /usr/bin/sqlite3 "$D/reel.db" "SELECT count(*) FROM captures WHERE origin = 'prewarm'" 2>/dev/null || echo 0; }

cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" \
    --heartbeat-ms 200 || { bad "broker starts"; show "$D/broker.log"; finish; }
# start_w1 LOG FLAGS...: w1 with 2 streams
start_w1() {
    _l=$1; shift
    cli_worker w1 "$D/broker.log" "$D/$_l" --broker "ipc://$D/w" --weights "$D/w.safetensors" --streams 2 \
        --heartbeat-ms 200 "$@"
}
crash() { kill -9 "$1" 2>/dev/null; reap "$1" 30; }

# 1. the keys get hot: key 1 four times, 2 and 3 twice, 4 once
start_w1 w1a.log --prewarm 0 || { bad "w1 starts"; show "$D/w1a.log"; finish; }
W1=$WORKER
okay=1
for k in 1 1 1 1 2 2 3 3 4; do gen $k "before$k" || { okay=0; show "$D/before$k.err"; }; done
[ $okay = 1 ] && ok "nine GENs of four keys answered" || bad "GENs of the four keys"
"$R" run --weights "$D/w.safetensors" $(spec 1) --out "$D/run1.safetensors" 2>/dev/null &&
    "$R" tensor diff "$D/before1.safetensors" "$D/run1.safetensors" --name latent >/dev/null 2>&1 &&
    ok "key 1's result is bitwise reelctl run" || bad "key 1 against reelctl run"
crash "$W1"

# 2. without prewarm the first request after a restart runs eager steps
start_w1 w1b.log --prewarm 0 || bad "w1 restarts without prewarm"
W1=$WORKER
# the killed process's graphs are recorded gone when the new one's READY
# (another boot) comes: the catalog's graphs held stay true
wait_sql "$D/reel.db" "SELECT count(*) FROM evictions WHERE worker = 'w1' AND reason = 'worker_restarted'" 1 30 &&
    [ "$(/usr/bin/sqlite3 "$D/reel.db" "SELECT count(*) FROM captures c WHERE worker = 'w1' AND placeholder = 0 AND NOT EXISTS (SELECT 1 FROM evictions e WHERE e.worker = 'w1' AND e.key_hash = c.key_hash AND e.stream = c.stream AND e.t >= c.t)")" = 0 ] &&
    ok "the killed worker's graphs: each recorded evicted (worker_restarted) at its restart" ||
    { bad "worker_restarted evictions"; /usr/bin/sqlite3 "$D/reel.db" "SELECT worker, key_hash, stream, reason FROM evictions"; }
gen 1 cold1 && ! replayed_all cold1 && grep -q "eager [1-9]" "$D/cold1.err" &&
    ok "--prewarm 0: the first request of a hot key runs eager ($(sed -n 's/.*(\(captured[^)]*\)).*/\1/p' "$D/cold1.err"))" ||
    { bad "--prewarm 0: first request"; show "$D/cold1.err"; }
grep -q "PREWARM" "$D/broker.log" && bad "a worker with --prewarm 0 was sent a PREWARM" ||
    ok "a worker with --prewarm 0 asks for nothing"
crash "$W1"

# 3. --prewarm 2: the two hottest keys it owns (key 1 is the hottest)
rows0=$(prewarm_rows)
start_w1 w1c.log --prewarm 2 || bad "w1 restarts with --prewarm 2"
W1=$WORKER
wait_for "$D/broker.log" "worker w1: PREWARM with 2 of the 2 hot keys" 30 &&
    ok "--prewarm 2: the broker names 2 of the 4 hot keys" || bad "--prewarm 2: PREWARM"
wait_sql "$D/reel.db" "SELECT count(*) FROM captures WHERE origin = 'prewarm'" $((rows0 + 4)) 60 &&
    ok "--prewarm 2: 2 keys captured on each of 2 streams" || { bad "--prewarm 2 captures"; show "$D/w1c.log"; }
gen 1 warm2 && replayed_all warm2 && ok "--prewarm 2: the hottest key replays from its first request" ||
    { bad "--prewarm 2: key 1"; show "$D/warm2.err"; }
crash "$W1"
[ "$(prewarm_rows)" = $((rows0 + 4)) ] && ok "--prewarm 2: no more than 2 keys captured" ||
    bad "--prewarm 2: $(($(prewarm_rows) - rows0)) prewarm captures, not 4"

# 4. --prewarm 8: every hot key, replayed from its first request, bitwise;
#    a request of a new key (5), queued while no worker runs, is served as
#    the worker starts and prewarms (and is hot too: 5 keys)
rows0=$(prewarm_rows)
gen 5 queued5 &
QP=$!
queued() { "$R" status --broker "ipc://$D/c" --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["queue"])' 2>/dev/null; }
i=0
while [ "$(queued)" != 1 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(queued)" = 1 ] || bad "the GEN of key 5 waits at the broker"
start_w1 w1d.log --prewarm 8 || bad "w1 restarts with --prewarm 8"
W1=$WORKER
wait_for "$D/broker.log" "worker w1: PREWARM with 5 of the 8 hot keys" 30 &&
    ok "--prewarm 8: the broker names the 5 hot keys" || bad "--prewarm 8: PREWARM"
reap "$QP" 120 && "$R" run --weights "$D/w.safetensors" $(spec 5) --out "$D/run5.safetensors" 2>/dev/null &&
    "$R" tensor diff "$D/queued5.safetensors" "$D/run5.safetensors" --name latent >/dev/null 2>&1 &&
    ok "a request arriving as the worker prewarms is served, bitwise reelctl run" ||
    { bad "the request queued during prewarm"; show "$D/queued5.err"; }
# its key was in the PREWARM (sent before it): its first step captured, no warmup
grep -q "eager 0)" "$D/queued5.err" && ok "the request that came before its key's prewarm ran no eager step" ||
    { bad "the request before its prewarm ran eager"; show "$D/queued5.err"; }
# every key tried on both streams (key 5 may have been captured by its request first)
wait_count "$D/w1d.log" "prewarmed key|captured already|prewarm of key|came before its prewarm" 10 60 ||
    { bad "--prewarm 8: 5 keys tried on 2 streams"; show "$D/w1d.log"; }
# the catalog's rows arrive after the log lines (events through the broker): wait for them
wait_sql "$D/reel.db" "SELECT count(*) FROM captures WHERE origin = 'prewarm'" $((rows0 + 8)) 30 &&
    ok "--prewarm 8: the 4 older keys captured on each of 2 streams, recorded as prewarm" ||
    { bad "--prewarm 8 captures: $(($(prewarm_rows) - rows0))"; show "$D/w1d.log"; }
for k in 1 2 3 4; do
    gen $k warm$k && replayed_all warm$k && ok "key $k: replayed from its first request after the restart" ||
        { bad "key $k after prewarm"; show "$D/warm$k.err"; }
    same=1
    for nm in latent; do
        "$R" tensor diff "$D/before$k.safetensors" "$D/warm$k.safetensors" --name $nm >/dev/null 2>&1 || same=0
    done
    [ $same = 1 ] && ok "key $k: bitwise its result before the restart" || bad "key $k: result differs"
done
# (a group's parts on the two streams are two capture keys: batch 1 and 2)
"$R" keys --catalog "$D/reel.db" >"$D/keys.txt" 2>&1 && grep -q prewarmed "$D/keys.txt" &&
    [ "$(awk 'NR > 1 { s += $4 } END { print s }' "$D/keys.txt")" = "$(prewarm_rows)" ] &&
    [ "$(awk 'NR > 1 && $4 >= 1' "$D/keys.txt" | wc -l)" -ge 5 ] &&
    ok "reelctl keys: the prewarm captures of each key" || { bad "reelctl keys"; show "$D/keys.txt"; }

# 5. two workers: the restarted one is sent only the keys it owns
cli_worker w2 "$D/broker.log" "$D/w2.log" --broker "ipc://$D/w" --weights "$D/w.safetensors" --streams 2 \
    --heartbeat-ms 200 --prewarm 0 || bad "w2 starts"
W2=$WORKER
crash "$W1"
wait_for "$D/broker.log" "worker w1 lost" 30 || bad "the broker notices w1's end"
for k in 1 2 3 4 5; do gen $k onw2_$k || bad "key $k on w2 alone"; done
before=$(grep -c "worker w1: PREWARM" "$D/broker.log")
start_w1 w1e.log --prewarm 8 || bad "w1 restarts beside w2"
W1=$WORKER
wait_count "$D/broker.log" "worker w1: PREWARM" $((before + 1)) 30 || bad "w1's PREWARM beside w2"
K=$(grep "worker w1: PREWARM" "$D/broker.log" | tail -1 | sed 's/.*PREWARM with \([0-9]*\) of.*/\1/')
wait_for "$D/w1e.log" "prewarm: $K key" 30 || bad "w1 takes $K keys"
i=0
while [ "$(grep -cE 'prewarmed key|captured already|prewarm of key|came before its prewarm' "$D/w1e.log")" -lt $((K * 2)) ] && [ $i -lt 600 ]; do
    sleep 0.1; i=$((i + 1))
done
on1=0; warm=1
for k in 1 2 3 4 5; do
    gen $k two_$k || { bad "key $k with two workers"; continue; }
    if grep -q "worker w1," "$D/two_$k.err"; then
        on1=$((on1 + 1))
        replayed_all two_$k || { warm=0; show "$D/two_$k.err"; }
    fi
done
[ "$on1" = "$K" ] && ok "two workers: w1 was sent exactly the $K hot keys that route to it" ||
    bad "two workers: $K keys prewarmed, $on1 route to w1"
[ $warm = 1 ] && ok "two workers: each key that routes to w1 replays from its first request" ||
    bad "two workers: a key routed to w1 ran eager"
crash "$W1"
stop_proc "$W2" || bad "w2 stops"

# 6. batching (--max-batch 4, ladder): the mixed batches of 2 and 4 rows of
#    a hot single key are prewarmed too; six requests of it at once then
#    run no eager step, in mixed batches, bitwise reelctl run
gen_s() { # K SEED OUT: a GEN of key K with another seed
    "$R" gen --broker "ipc://$D/c" --model tiny $(spec "$1" | sed "s/--seed [0-9]*/--seed $2/") --timeout-ms 120000 \
        --out "$D/$3.safetensors" >"$D/$3.err" 2>&1
}
start_w1 w1f.log --prewarm 8 --max-batch 4 --batching always --streams 1 || bad "w1 starts batching"
W1=$WORKER
i=0
while [ "$(grep -cE 'prewarmed key|captured already|prewarm of key|came before its prewarm' "$D/w1f.log")" -lt 1 ] &&
    [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
wait_for "$D/w1f.log" "prewarmed key [0-9a-f]* .a mixed batch of 2" 60 && wait_for "$D/w1f.log" "prewarmed key [0-9a-f]* .a mixed batch of 4" 60 &&
    ok "batching: a hot key's mixed batches of 2 and 4 rows prewarmed" || { bad "batching: mixed prewarm"; show "$D/w1f.log"; }
# long_and_six LONG TAG SEED0 WHAT: a long request of key 1 (10000 steps,
# out $D/LONG) holds the stream once the broker counts it in flight; six
# short ones (seeds SEED0+1.., out $D/TAG<seed>) join its steps as they
# come; all seven answered within their bound. (3000 steps of key 1's
# 2x8x8 took 0.45 s here: after the poll, six reelctl starts on a busy
# machine could miss it, and the short ones then seldom share a step.)
inflight() { "$R" status --broker "ipc://$D/c" --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(sum(w["inflight"] for w in json.load(sys.stdin)["workers"]))' 2>/dev/null; }
long_and_six() {
    "$R" gen --broker "ipc://$D/c" --model tiny $(spec 1 | sed "s/--steps [0-9]*/--steps 10000/") --timeout-ms 120000 \
        --out "$D/$1.safetensors" >"$D/$1.err" 2>&1 &
    LP=$!
    i=0
    while [ "$(inflight)" != 1 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    gp=""
    for k in 1 2 3 4 5 6; do gen_s 1 $(($3 + k)) "$2$(($3 + k))" & gp="$gp $!"; done
    failed=0
    for p in $gp $LP; do reap "$p" 120 || failed=$((failed + 1)); done
    [ $failed = 0 ] && ok "$4: a long GEN and six short ones answered" || bad "$4: $failed GENs failed"
}
# mixed batches of 2 to 4 rows, padded to 2 or 4
long_and_six long mix 80 batching
noeager=0; nb=0
for f in mix81 mix82 mix83 mix84 mix85 mix86 long; do
    grep -q "eager 0)" "$D/$f.err" && noeager=$((noeager + 1))
    grep -q "batched with other requests" "$D/$f.err" && nb=$((nb + 1))
done
[ $nb -ge 2 ] && ok "batching: $nb of the seven ran steps in mixed batches" || { bad "batching: only $nb batched"; show "$D/long.err"; }
[ $noeager = 7 ] && ok "batching: no eager step in any of the seven" ||
    { bad "batching: $noeager of 7 without eager steps"; show "$D/mix81.err"; show "$D/long.err"; }
"$R" run --weights "$D/w.safetensors" $(spec 1 | sed "s/--seed [0-9]*/--seed 83/") --out "$D/run83.safetensors" 2>/dev/null &&
    "$R" tensor diff "$D/mix83.safetensors" "$D/run83.safetensors" --name latent >/dev/null 2>&1 &&
    ok "batching: a batched result after prewarm is bitwise reelctl run" || bad "batching: result differs from reelctl run"
crash "$W1"

# 7. --max-tokens bounds every step, prewarm's and batches' too: key 1 has
#    32 tokens a sample, so under --max-tokens 64 its mixed batches have 2
#    rows at most: the batch of 2 is prewarmed, the batch of 4 never is,
#    and requests sharing steps do so 2 at a time
start_w1 w1g.log --prewarm 8 --max-batch 4 --batching always --streams 1 --max-tokens 64 ||
    bad "w1 starts batching under --max-tokens 64"
W1=$WORKER
wait_for "$D/w1g.log" "prewarmed key [0-9a-f]* .a mixed batch of 2" 60 &&
    ok "--max-tokens 64: a hot key's mixed batch of 2 rows prewarmed" || { bad "--max-tokens 64: prewarm of 2"; show "$D/w1g.log"; }
long_and_six long2 cap 90 "--max-tokens 64"
nb=0; wide=0
for f in cap91 cap92 cap93 cap94 cap95 cap96 long2; do
    m=$(sed -n 's/.*batched with other requests (\([0-9.]*\) a batch.*/\1/p' "$D/$f.err")
    [ -n "$m" ] && nb=$((nb + 1))
    [ -n "$m" ] && awk -v m="$m" 'BEGIN { exit !(m > 2.0) }' && wide=$((wide + 1))
done
[ $nb -ge 2 ] && [ $wide = 0 ] && ok "--max-tokens 64: $nb of the seven shared steps, 2 rows a batch at most" ||
    { bad "--max-tokens 64: $nb batched, $wide with batches over 2 rows"; show "$D/long2.err"; }
grep -q "a mixed batch of 4" "$D/w1g.log" && { bad "--max-tokens 64: a batch of 4 was prewarmed"; show "$D/w1g.log"; } ||
    ok "--max-tokens 64: no batch of 4 prewarmed"
"$R" run --weights "$D/w.safetensors" $(spec 1 | sed "s/--seed [0-9]*/--seed 93/") --out "$D/run93.safetensors" 2>/dev/null &&
    "$R" tensor diff "$D/cap93.safetensors" "$D/run93.safetensors" --name latent >/dev/null 2>&1 &&
    ok "--max-tokens 64: a result of batches of 2 is bitwise reelctl run" || bad "--max-tokens 64: result differs"
crash "$W1"

# 8. requests of a hot key queued while the worker restarts, which then
#    share their steps in mixed batches, capture no graph of the key alone:
#    its prewarm stays on the list for the background (it was taken off
#    by the first of them, and lost: helper-71), so a lone request of the
#    key afterwards runs no eager step.
# 9. --max-inflight 2 bounds the mixed batches prewarmed too: the worker
#    never holds 4 requests at once, so no batch of 4 is captured.
gp=""
for k in 1 2 3; do gen_s 1 $((100 + k)) "q$k" & gp="$gp $!"; done
i=0
while [ "$(queued)" != 3 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(queued)" = 3 ] || bad "three GENs of key 1 wait at the broker"
start_w1 w1h.log --prewarm 8 --max-batch 4 --batching always --streams 1 --warmup 2 ||
    bad "w1 restarts batching with three GENs queued"
W1=$WORKER
failed=0
for p in $gp; do reap "$p" 120 || failed=$((failed + 1)); done
[ $failed = 0 ] && ok "queued: the three GENs of key 1 answered" || bad "queued: $failed GENs failed"
nb=0
for k in 1 2 3; do grep -q "batched with other requests" "$D/q$k.err" && nb=$((nb + 1)); done
echo "  | $nb of the three shared steps"
# key 1 alone: captured by the background prewarm, or by the first request that stepped alone
wait_for "$D/w1h.log" "prewarmed key [0-9a-f]* .batch 1.|came before its prewarm: its first step captures|captured already" 60 ||
    { bad "queued: key 1 alone never prewarmed"; show "$D/w1h.log"; }
gen_s 1 199 lone && grep -q "eager 0)" "$D/lone.err" &&
    ok "queued: a lone request of key 1 afterwards runs no eager step" || { bad "queued: the lone request"; show "$D/lone.err" "$D/w1h.log"; }
crash "$W1"
start_w1 w1i.log --prewarm 8 --max-batch 4 --max-inflight 2 --batching always --streams 1 ||
    bad "w1 restarts with --max-inflight 2"
W1=$WORKER
# two keys' batches of 2 (keys 1, 4 and 5 are single Euler or SDE keys): a
# key's batch of 4, were it listed, comes right after its batch of 2
wait_count "$D/w1i.log" "prewarmed key [0-9a-f]* .a mixed batch of 2" 2 60 &&
    ok "--max-inflight 2: mixed batches of 2 prewarmed" || { bad "--max-inflight 2: prewarm of 2"; show "$D/w1i.log"; }
grep -q "a mixed batch of 4" "$D/w1i.log" && { bad "--max-inflight 2: a batch of 4 was prewarmed"; show "$D/w1i.log"; } ||
    ok "--max-inflight 2: no batch of 4 prewarmed"
finish
