#!/bin/sh
# cli_mixed.sh -- a long, varied sequence of requests through a real
# reel-broker and one real reel-worker (--streams 1, --streams 2, then
# --streams 2 with every replay audited), each
# result compared bitwise with `reelctl run` on the same inputs (issue 7).
# The sequence mixes latent shapes (growing, shrinking, interleaved), context
# lengths, CFG on and off, Euler and SDE, steps and shift, same-key requests
# with other values (replays after other shapes were captured), and groups
# sent at once so the steps of different keys interleave on the streams.
# Every wait is bounded; every process is killed and the temp dir removed on
# exit. Usage: cli_mixed.sh BUILD   (REEL_KEEP=1 keeps the temp dir)
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-mixed.XXXXXX)
W="$D/w.safetensors"
SUITE=mixed
. "$(dirname "$0")/lib_cli.sh"

# ---- inputs, all drawn deterministically ----------------------------------
"$R" weights init --config tiny --seed 7 --out "$W" 2>/dev/null || { bad "weights init"; finish; }
lat() { # shape(C,F,H,W) seed -> path
    f="$D/lat_$1_$2.safetensors"
    [ -f "$f" ] || "$R" tensor rand --name latent --shape "$1" --seed "$2" --out "$f" || bad "tensor rand latent $1"
    echo "$f"
}
ctx() { # L seed -> path
    f="$D/ctx_$1_$2.safetensors"
    [ -f "$f" ] || "$R" tensor rand --name context --shape "$1,32" --seed "$2" --out "$f" || bad "tensor rand context $1"
    echo "$f"
}

# The cases: the input flags shared by `reelctl run` and `reelctl gen`.
# A case name may be repeated in the sequence; same-shaped cases with other
# values (a/a2, b/b2, d/d2) share a capture key, so they replay each other's
# graphs with new latents, contexts, guidance, sigmas and SDE seeds.
CASES="t a a2 a3 e e2 f b b2 s c d d2 h j g"
args_of() {
    case $1 in
    # name) latent [C,F,H,W] and seed, context [L,32] and seed, [uncond + CFG scale], [SDE], steps, shift
    t)  echo "--latent $(lat 4,1,2,2 40)   --context $(ctx 1 50)                                                 --steps 4 --shift 1" ;;
    a)  echo "--latent $(lat 4,1,4,4 41)   --context $(ctx 5 51)                                                 --steps 6 --shift 1" ;;
    a2) echo "--latent $(lat 4,1,4,4 42)   --context $(ctx 5 52)                                                 --steps 9 --shift 3" ;;
    a3) echo "--latent $(lat 4,1,4,4 43)   --context $(ctx 6 53)                                                 --steps 6 --shift 2" ;;
    e)  echo "--latent $(lat 4,2,4,4 44)   --context $(ctx 3 54)                                  --sde --eta 0.5 --seed 3 --steps 4 --shift 2" ;;
    e2) echo "--latent $(lat 4,2,4,4 45)   --context $(ctx 3 55) --uncond $(ctx 3 56) --cfg 2                     --steps 5 --shift 2" ;;
    f)  echo "--latent $(lat 4,1,8,8 46)   --context $(ctx 5 57) --uncond $(ctx 5 58) --cfg 2.5                   --steps 8 --shift 3" ;;
    b)  echo "--latent $(lat 4,2,8,8 47)   --context $(ctx 5 59) --uncond $(ctx 5 60) --cfg 4                     --steps 6 --shift 3" ;;
    b2) echo "--latent $(lat 4,2,8,8 48)   --context $(ctx 5 61) --uncond $(ctx 5 62) --cfg 7.5                   --steps 5 --shift 1.5" ;;
    s)  echo "--size 2x8x8                 --context $(ctx 5 63)                                  --sde --eta 0.7 --seed 21 --steps 5 --shift 3" ;;
    c)  echo "--latent $(lat 4,1,16,16 49) --context $(ctx 7 64)                                                 --steps 5 --shift 2" ;;
    d)  echo "--latent $(lat 4,3,8,12 50)  --context $(ctx 12 65) --uncond $(ctx 12 66) --cfg 5  --sde --eta 0.7 --seed 11 --steps 6 --shift 3" ;;
    d2) echo "--latent $(lat 4,3,8,12 51)  --context $(ctx 12 67) --uncond $(ctx 12 68) --cfg 3  --sde --eta 0.3 --seed 12 --steps 7 --shift 5" ;;
    h)  echo "--latent $(lat 4,4,8,8 52)   --context $(ctx 9 69) --uncond $(ctx 9 70) --cfg 3    --sde --eta 1.0 --seed 5 --steps 5 --shift 2" ;;
    j)  echo "--latent $(lat 4,2,16,16 53) --context $(ctx 16 71) --uncond $(ctx 16 72) --cfg 6                  --steps 5 --shift 3" ;;
    g)  echo "--latent $(lat 4,2,12,8 54)  --context $(ctx 2 73)                                  --sde --eta 0.8 --seed 9 --steps 4 --shift 1" ;;
    *)  echo "unknown case $1" >&2; return 1 ;;
    esac
}

# The sequence: words run one after the other; a+b+c is a group sent at once
# (its requests are in flight together, so their steps interleave on the
# worker's streams). With --warmup 1 a key's first step on a stream runs
# eagerly, its second is captured and verified, the rest replay; a key seen
# before on that stream replays from its first step.
SEQ="t a e f b c d h j
     j h d2 b2 s a2 t
     a j a c t d b g a2 j e f
     b b2 d d2 a a2 e t
     a+j b+d+t c+e+s h+a3+g+f j+t d2+b2
     e2 a3 g s c h e2"

# ---- the references: the same loops in one process, no broker ------------
echo "== references from reelctl run"
t0=$(date +%s)
for c in $CASES; do
    a=$(args_of "$c") || { bad "case $c"; continue; }
    timeout 120 "$R" run --weights "$W" $a --out "$D/ref_$c.safetensors" 2>"$D/ref_$c.err" ||
        { bad "reelctl run for case $c"; sed 's/^/  | /' "$D/ref_$c.err"; }
done
echo "  (references in $(($(date +%s) - t0)) s)"

# ---- one phase: a broker and one worker with S streams, the whole sequence -
phase() { # tag streams [extra worker flags...]
    tag=$1; S=$2; shift 2; XF="$*"
    P="$D/$tag"; mkdir -p "$P"
    CE="ipc://$P/clients"; WE="ipc://$P/workers"; DB="$P/reel.db"
    echo "== $tag: a broker and one worker with --streams $S --warmup 1 $XF"
    "$B/reel-broker" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 200 --queue-max 64 \
        >"$P/broker.log" 2>&1 &
    BROKER=$!; PIDS="$PIDS $BROKER"
    wait_for "$P/broker.log" "reel-broker: ready" 60 || { bad "$tag: the broker starts"; return; }
    # shellcheck disable=SC2086
    "$B/reel-worker" --broker "$WE" --name "mx$S" --weights "$W" --streams "$S" --warmup 1 \
        --heartbeat-ms 200 $XF >"$P/worker.log" 2>&1 &
    WORKER=$!; PIDS="$PIDS $WORKER"
    wait_for "$P/broker.log" "worker mx$S ready" 60 || { bad "$tag: the worker starts"; return; }

    n=0; served=0; exact=0; wrong=0; failed=0
    t0=$(date +%s)
    for grp in $SEQ; do
        kill -0 "$WORKER" 2>/dev/null && kill -0 "$BROKER" 2>/dev/null ||
            { bad "$tag: the broker or the worker died; the rest of the sequence is not sent"; tail -3 "$P/worker.log"; break; }
        pids=""; names=""
        for c in $(echo "$grp" | tr '+' ' '); do
            n=$((n + 1))
            a=$(args_of "$c")
            timeout 60 "$R" gen --broker "$CE" --model tiny $a --timeout-ms 30000 --deadline-ms 25000 --quiet \
                --out "$P/o$n.safetensors" 2>"$P/o$n.err" &
            pids="$pids $!"; names="$names $n:$c"; echo "$c" >>"$P/cases"
        done
        set -- $pids
        for nc in $names; do
            i=${nc%%:*}; c=${nc#*:}
            reap "$1" 300; rc=$?; shift
            what="$tag #$i $c [$grp]"
            if [ "$rc" != 0 ]; then
                failed=$((failed + 1))
                bad "$what served (exit $rc): $(grep -v '^$' "$P/o$i.err" | tail -1)"
            elif "$R" tensor diff "$P/o$i.safetensors" "$D/ref_$c.safetensors" >"$P/d$i.txt" 2>&1; then
                served=$((served + 1)); exact=$((exact + 1))
                ok "$what == reelctl run ($(sed -n 's/.*steps (\(.*\)), .*/\1/p' "$P/o$i.err"))"
            else
                served=$((served + 1)); wrong=$((wrong + 1))
                bad "$what differs from reelctl run: $(head -2 "$P/d$i.txt" | tr '\n' ' ')"
            fi
        done
    done
    echo "  ($tag: $n requests, $served served, $exact exact, $wrong different, $failed failed, $(($(date +%s) - t0)) s)"
    [ "$n" -ge 40 ] && [ "$exact" = "$n" ] && ok "$tag: all $n requests served, bitwise equal to reelctl run" ||
        bad "$tag: $exact of $n requests served exactly ($failed not served, $wrong different)"

    # Graphs were used: steps replayed overall, and requests served from
    # start to end by graphs an earlier request captured on this worker
    # (after other shapes had been captured in between).
    reqrep=0; full=0; steps_rep=0; fullcases=" "
    for i in $(seq 1 "$n"); do
        line=$(grep "reelctl: gen " "$P/o$i.err" 2>/dev/null) || continue
        r=$(echo "$line" | sed -n 's/.*replayed \([0-9]*\),.*/\1/p')
        [ -n "$r" ] || continue
        steps_rep=$((steps_rep + r))
        [ "$r" -gt 0 ] && reqrep=$((reqrep + 1))
        if echo "$line" | grep -qE "captured 0, replayed [1-9][0-9]*, eager 0[),:]"; then
            full=$((full + 1))
            c=$(sed -n "${i}p" "$P/cases")
            case "$fullcases" in *" $c "*) ;; *) fullcases="$fullcases$c " ;; esac
        fi
    done
    fullcases=$(echo $fullcases); nfc=$(echo $fullcases | wc -w)
    [ "$served" -gt 0 ] && [ $((reqrep * 2)) -ge "$served" ] &&
        ok "$tag: $reqrep of $served served requests replayed graphs ($steps_rep steps replayed)" ||
        bad "$tag: graphs replayed in only $reqrep of $served served requests"
    [ "$full" -ge 5 ] && [ "$nfc" -ge 3 ] &&
        ok "$tag: $full requests of $nfc cases ($fullcases) ran every step as a replay of graphs captured earlier" ||
        bad "$tag: $full requests of $nfc cases ($fullcases) were served entirely by replays of earlier captures (wanted >= 5 of >= 3)"
    # The worker batches its events every 200 ms and the broker's writer
    # follows: poll the catalog until it has every replay the clients saw.
    i=0; while :; do
        "$R" stats --catalog "$DB" >"$P/stats.txt" 2>&1
        caps=$(awk '$1 == "(all)" { print $3 }' "$P/stats.txt"); reps=$(awk '$1 == "(all)" { print $4 }' "$P/stats.txt")
        [ "${reps:-0}" -ge "$steps_rep" ] 2>/dev/null && break
        i=$((i + 1)); [ $i -ge 50 ] && break; sleep 0.1
    done
    [ "${caps:-0}" -ge 5 ] 2>/dev/null && [ "${reps:-0}" -ge "$steps_rep" ] 2>/dev/null && [ "$steps_rep" -gt 0 ] &&
        ok "$tag: reelctl stats shows $caps captures and $reps replays" ||
        { bad "$tag: reelctl stats shows ${caps:-?} captures (wanted >= 5), ${reps:-?} replays (wanted >= $steps_rep)"
          sed 's/^/  | /' "$P/stats.txt"; }
    # An audit re-runs a replay eagerly and compares bitwise: on a correct
    # cache it never finds a difference.
    if "$R" stats --catalog "$DB" --json >"$P/stats.json" 2>&1 && ! grep -q audit_mismatch "$P/stats.json"; then
        ok "$tag: no audit_mismatch in the catalog"
    else
        bad "$tag: the catalog records an audit_mismatch (or stats failed)"; sed 's/^/  | /' "$P/stats.json" | head -5
    fi
    kill -0 "$WORKER" 2>/dev/null && ok "$tag: the worker is still up" || bad "$tag: the worker died"
    nf=$(grep -c "failed" "$P/worker.log")
    [ "$nf" = 0 ] || { echo "  worker log: $nf lines say failed, the first:"; grep "failed" "$P/worker.log" | head -2 | sed 's/^/  | /'; }
    kill -TERM "$WORKER" "$BROKER" 2>/dev/null
    i=0; while [ $i -lt 50 ] && { kill -0 "$WORKER" 2>/dev/null || kill -0 "$BROKER" 2>/dev/null; }; do
        sleep 0.1; i=$((i + 1)); done
    kill -9 "$WORKER" "$BROKER" 2>/dev/null
    reap "$WORKER" 60; reap "$BROKER" 60
    # The worker's closing line counts audits: with --audit-every 1 every
    # replay after a capture is one, so a phase that audits must show some.
    aud=$(sed -n 's/.*replays (\([0-9]*\) audited, \([0-9]*\) audit mismatches).*/\1 \2/p' "$P/worker.log" | tail -1)
    case "$XF" in
    *audit-every*)
        set -- $aud
        [ "${1:-0}" -gt 0 ] && [ "${2:-1}" = 0 ] && ok "$tag: the worker audited $1 replays, 0 mismatches" ||
            bad "$tag: the worker's closing line says '${aud:-nothing}' (wanted audits > 0, 0 mismatches)";;
    esac
}

phase s1 1
phase s2 2
# Every replay audited (eager re-run, bitwise compare): still exact, and
# still replaying.
phase s2a 2 --audit-every 1
finish
