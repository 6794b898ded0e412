#!/bin/sh
# cli_standby.sh -- a standby pair (issue 30 §2; docs/OPERATIONS.md "Two
# brokers"): two reel-brokers, A (--role primary) and B (--role backup),
# each with its own catalog, each sending the other a PEER through a TCP
# relay this test can cut (tests/tcp_relay.py: the link between the two
# brokers, and nothing else); two workers and the clients given both
# endpoints ("A,B"). Checked:
#   1. A becomes active and B standby; STATUS through the pair answers A's;
#      B answers a GEN sent to it alone ERROR standby, naming A.
#   2. a sync by path through the pair completes on both workers.
#   3. A SIGKILLed under load (3 GENs in flight): B takes over (the time is
#      printed), adopts the current version from A's last PEER, the workers
#      move to it, every GEN is answered once, bitwise `reelctl run` on
#      the version its answer names.
#   4. A restarted: it becomes the standby (B stays active, term 2).
#   5. the link between the brokers cut, clients still reaching both: no
#      second active broker; GENs through the pair (tried at A first,
#      refused there) answered by B; A says its peer is silent and stays
#      standby. Link restored: heard again.
#   6. the link cut and a client that reaches A and not B (given A and a
#      dead endpoint): refused by A, B silent, back to A: A takes over
#      (term 3), the limit of the fencing rule; the link restored, B (the
#      lower term) steps down, its workers move to A (at once: A was not
#      tried since B served them); v3, uploaded to B alone meanwhile, is
#      adopted by A and fetched from B, its standby now; and a GEN through
#      the pair is answered: never two active once they hear each other.
#   7. reports over both catalogs (reelctl requests, stats, versions,
#      report --html with --catalog A --catalog B): the union, each request
#      once (a catalog with its own copy: deduplicated by request id).
#   8. the standby listed first ("B,A"): an upload and a GEN without
#      resends (liveness 0) are refused by B and completed at A.
#   9. the standby's copy of an uploaded version: B copies v4 (uploaded to
#      A, current there) from A, byte for byte, audited; A SIGKILLed, a
#      client's GEN makes B active, and a worker that joins B only then
#      FETCHes v4 from B and applies it; GENs answered on v4, bitwise.
#  10. two brokers both given --role primary (a mistake): each warns, and
#      the older process acts as the primary: one active, one standby.
# Usage: cli_standby.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-standby.XXXXXX)
SUITE=standby
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"
export REEL_CLIENT_LIVENESS_MS=300

free_ports() { # N: N loopback ports free now, on one line
    $PY -c '
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))
for s in ss: s.close()' "$1"
}
# five loopback ports: the brokers' client endpoints, a relay to each, and
# one nothing listens on (a broker a client cannot reach)
ports=$(free_ports 5)
set -- $ports
PA=$1; PB=$2; RA=$3; RB=$4 # RA relays to A (B's peer link), RB to B (A's)
NOWHERE="tcp://127.0.0.1:$5"
CA="tcp://127.0.0.1:$PA"; CB="tcp://127.0.0.1:$PB"
PAIR="$CA,$CB"
WA="ipc://$D/wa"; WB="ipc://$D/wb"

mkdir -p "$D/upa" "$D/upb"
for v in 1 2 3 4; do "$R" weights init --config tiny --seed $((40 + v)) --out "$D/w$v.safetensors" 2>/dev/null; done
for k in 1 2 3 4; do "$R" tensor rand --name context --shape 5,32 --seed $((60 + k)) --out "$D/c$k.safetensors" >/dev/null; done

relay() { # NAME LISTEN TARGET
    : >"$D/$1.ready"
    $PY "$(dirname "$0")/tcp_relay.py" "$2" "$3" "$D/$1.ready" 2>"$D/$1.err" &
    eval "$1=$!"
    PIDS="$PIDS $!"
    wait_for "$D/$1.ready" listening 30 || { bad "relay $1 listens"; show "$D/$1.err"; finish; }
}
relay relA "$RA" "$PA"
relay relB "$RB" "$PB"
cut() { kill -USR1 "$relA" "$relB"; wait_for "$D/relA.ready" cut 30 && wait_for "$D/relB.ready" cut 30; }
mend() {
    kill -USR2 "$relA" "$relB"
    wait_for "$D/relA.ready" restored 30 && wait_for "$D/relB.ready" restored 30
    : >"$D/relA.ready"; : >"$D/relB.ready" # the next cut waits for its own line
}

broker_a() { # LOG
    cli_broker "$1" --clients "$CA" --workers "$WA" --catalog "$D/a.db" --heartbeat-ms 200 \
        --peer "tcp://127.0.0.1:$RB" --role primary --peer-timeout-ms 1500 --weights-dir "$D/upa" || { bad "broker A starts"; show "$1"; finish; }
    BA=$BROKER
}
broker_a "$D/a0.log"
cli_broker "$D/b.log" --clients "$CB" --workers "$WB" --catalog "$D/b.db" --heartbeat-ms 200 \
    --peer "tcp://127.0.0.1:$RA" --role backup --peer-timeout-ms 1500 --weights-dir "$D/upb" || { bad "broker B starts"; show "$D/b.log"; finish; }
BB=$BROKER

# --- 1. who is active -----------------------------------------------------------
if wait_for "$D/a0.log" "reel-broker: active \(term 1\)" 30 && wait_for "$D/b.log" "reel-broker: standby" 30; then
    ok "A (primary) active at term 1, B (backup) standby"
else
    bad "A active and B standby"; show "$D/a0.log"; show "$D/b.log"
fi
"$R" status --broker "$PAIR" --json >"$D/st1.json" 2>"$D/st1.err"
if $PY -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["ha"]["state"]=="active" and s["ha"]["role"]=="primary" and s["ha"]["peer"] in ("standby", "starting") else 1)' "$D/st1.json"; then
    ok "status through the pair answers the active broker's (A, its peer standby or still starting)"
else
    bad "status through the pair"; show "$D/st1.json" "$D/st1.err"
fi
"$R" gen --broker "$CB" --model tiny --context "$D/c1.safetensors" --steps 2 --size 2x8x8 --timeout-ms 20000 \
    --out "$D/x.safetensors" >"$D/gb.out" 2>&1
if grep -q "standby" "$D/gb.out" && grep -q "tcp://127.0.0.1:$RA" "$D/gb.out"; then
    ok "B alone answers a GEN ERROR standby, naming A as B reaches it (its --peer)"
else
    bad "B alone answers standby"; show "$D/gb.out"
fi

for w in wa wb; do
    cli_worker $w "$D/a0.log" "$D/$w.log" --broker "$WA,$WB" --weights "$D/w1.safetensors" --streams 1 \
        --heartbeat-ms 200 || { bad "worker $w registers with A"; show "$D/$w.log"; finish; }
done
ok "both workers registered with A"

# --- 2. a sync through the pair --------------------------------------------------
if "$R" sync --broker "$PAIR" --version 2 --weights "$D/w2.safetensors" --timeout-ms 60000 >"$D/s2.out" 2>&1 &&
    grep -q "sync transformer v2: complete" "$D/s2.out"; then
    ok "sync v2 through the pair: complete"
else
    bad "sync v2 through the pair"; show "$D/s2.out"
fi

# --- 3. A killed under load ------------------------------------------------------
# (tests/lib_cli.sh: long_gens, long_answered, long_running)
LG_STEPS=5000 LG_SEED=70 LG_TIMEOUT_MS=120000 LG_WEIGHTS=w%s.safetensors
long_gens k "$PAIR" 3
long_running "$CA" || bad "requests running at A before the kill"
kill -9 "$BA"
t0=$($PY -c 'import time; print(time.monotonic())')
reap "$BA" 30 >/dev/null
wait_for "$D/b.log" "reel-broker: active \(term 2\)" 60 && t1=$($PY -c 'import time; print(time.monotonic())')
w_b=$(grep -c "worker w[ab] ready" "$D/b.log")
wait_count "$D/b.log" "worker w[ab] ready" 2 60 && t2=$($PY -c 'import time; print(time.monotonic())')
if grep -q "reel-broker: active (term 2)" "$D/b.log"; then
    ok "B took over at term 2: $($PY -c "print(round(${t1:-0} - $t0, 2))") s after A's SIGKILL, both workers there $($PY -c "print(round(${t2:-0} - $t0, 2))") s after"
else
    bad "B took over"; show "$D/b.log"
fi
grep -q "takeover: transformer v2 is current" "$D/b.log" && ok "B adopted v2, current at A (its last PEER)" ||
    { bad "B adopted v2"; show "$D/b.log"; }
for p in $gp; do reap "$p" 120 >/dev/null; done
long_answered k 3 2 && ok "3 GENs in flight at A's kill: each answered once, on v2, bitwise reelctl run" ||
    bad "the GENs in flight at the kill"
grep -q "worker wa ready" "$D/b.log" || true

# --- 4. A back: the standby ------------------------------------------------------
hb=$(grep -c "peer heard" "$D/b.log")
broker_a "$D/a1.log"
if wait_for "$D/a1.log" "reel-broker: standby: the peer is active at term 2" 30; then
    ok "A restarted: standby (B active at term 2)"
else
    bad "A restarted as standby"; show "$D/a1.log"
fi
"$R" status --broker "$PAIR" --json >"$D/st4.json" 2>"$D/st4.err"
$PY -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["ha"]["state"]=="active" and s["ha"]["role"]=="backup" and s["ha"]["term"]==2 and len(s["workers"])==2 else 1)' "$D/st4.json" &&
    ok "status through the pair: B active, term 2, both workers" || { bad "status after A's return"; show "$D/st4.json"; }

# --- 5. the link between the brokers cut -------------------------------------------
# B must have heard A back first (A hearing B is not enough): else B's peer
# is silent already and the cut changes nothing B would log
wait_count "$D/b.log" "peer heard" $((hb + 1)) 30 || bad "B hears A back"
sa=$(grep -c "peer silent" "$D/a1.log"); sb=$(grep -c "peer silent" "$D/b.log")
cut || bad "the relays cut"
if wait_count "$D/a1.log" "peer silent" $((sa + 1)) 30 && wait_count "$D/b.log" "peer silent" $((sb + 1)) 30; then
    ok "link cut: each broker says its peer is silent"
else
    bad "both see the silence"; show "$D/a1.log"; show "$D/b.log"
fi
# (a liveness of 1 s here: two stalls of B on a busy machine must not send
# a client back to A, which would rightly take over)
REEL_CLIENT_LIVENESS_MS=1000 long_gens l "$PAIR" 2
for p in $gp; do reap "$p" 120 >/dev/null; done
long_answered l 2 2 && ok "link cut: 2 GENs through the pair answered once, bitwise" || bad "GENs with the link cut"
# a 12 MiB upload (its chunks pipelined: each one refused by A is not a
# comeback) and two trainers one after the other with the same SYNC (each
# its own token), every one given A first: none makes A active
"$R" tensor rand --name big --shape 3145728,1 --seed 9 --out "$D/big.safetensors" >/dev/null # 12 MiB, not a model
REEL_CLIENT_LIVENESS_MS=1000 "$R" sync --broker "$PAIR" --version 5 --upload "$D/big.safetensors" --deadline-ms 20000 \
    --timeout-ms 60000 >"$D/s5.out" 2>&1
for t in 1 2; do
    REEL_CLIENT_LIVENESS_MS=1000 "$R" sync --broker "$PAIR" --version 6 --weights "$D/big.safetensors" --deadline-ms 20000 \
        --timeout-ms 60000 >"$D/s6.$t.out" 2>&1
done
if grep -q "sync transformer v5: " "$D/s5.out" && grep -q "sync transformer v6: " "$D/s6.2.out" &&
    ! grep -q "reel-broker: active" "$D/a1.log" && [ -n "$(ls "$D/upb")" ] && [ -z "$(ls "$D/upa")" ]; then
    ok "link cut: a 12 MiB upload and two trainers' SYNCs, A listed first: all at B (they end), A never active"
else
    bad "uploads and syncs with the link cut"; show "$D/s5.out" "$D/s6.2.out"; show "$D/a1.log"
fi
"$R" status --broker "$CA" --json >"$D/st5.json" 2>&1
if ! grep -q "reel-broker: active" "$D/a1.log" &&
    $PY -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["ha"]["state"]=="standby" and s["ha"]["peer"]=="silent" else 1)' "$D/st5.json"; then
    ok "link cut, the clients reaching B: A stays standby (never two active)"
else
    bad "A stayed standby"; show "$D/st5.json"; show "$D/a1.log"
fi
nh=$(grep -c "peer heard" "$D/a1.log")
mend || bad "the relays restored"
wait_count "$D/a1.log" "peer heard" $((nh + 1)) 30 && ok "link restored: A hears B again" || bad "heard again"

# --- 6. two actives, resolved by the term ----------------------------------------------
sa=$(grep -c "peer silent" "$D/a1.log")
cut || bad "the relays cut (2)"
wait_count "$D/a1.log" "peer silent" $((sa + 1)) 30 >/dev/null
long_gens m "$CA,$NOWHERE" 1 # a client that cannot reach B: refused by A, B silent, back to A
if wait_for "$D/a1.log" "reel-broker: active \(term 3\)" 30; then
    ok "link cut, a client that reaches A and not B: A takes over at term 3 (the limit of the fencing rule)"
else
    bad "A took over"; show "$D/a1.log"
fi
# meanwhile v3 is uploaded to B alone (still active at term 2, its
# workers there): only B stores it
"$R" sync --broker "$CB" --version 3 --upload "$D/w3.safetensors" --timeout-ms 60000 >"$D/s3b.out" 2>&1
grep -q "sync transformer v3: complete" "$D/s3b.out" && [ ! -e "$D/upa/transformer-v3.safetensors" ] &&
    ok "two actives: v3 uploaded to B alone, complete there" || { bad "v3 at B"; show "$D/s3b.out"; }
# a GEN running at B (given B first) when B steps down: answered standby
# there, it moves to A and is answered once
s_gp=$gp
long_gens s "$CB,$CA" 1
s_p=$gp
gp=$s_gp
long_running "$CB" 1 || bad "a request running at B before it steps down"
mend || bad "the relays restored (2)"
if wait_for "$D/b.log" "reel-broker: standby: the peer is active at term 3" 30; then
    ok "link restored: B (term 2) steps down to standby"
else
    bad "B stepped down"; show "$D/b.log"
fi
wait_count "$D/a1.log" "worker w[ab] ready" 2 60 && ok "the workers moved to A" || { bad "workers to A"; show "$D/a1.log"; }
# A (the one that stays) adopted v3, which B made current, and does not
# store it: it fetches it from B, now its standby
if wait_for "$D/a1.log" "copied transformer v3 from the standby broker" 60 &&
    cmp -s "$D/w3.safetensors" "$D/upa/transformer-v3.safetensors"; then
    ok "A adopted B's uploaded v3 and fetched it from B (its standby now), byte for byte"
    wait_sql "$D/a.db" "SELECT count(*) FROM audit WHERE action = 'upload' AND version = 3 AND role = 'broker'" 1 30 ||
        bad "no audit row of A's copy of v3"
else
    bad "A's copy of v3 from its standby"; show "$D/a1.log"; ls -la "$D/upa"
fi
# B was the last broker that served them (the second of their list): A,
# not tried since, is tried at once, with no backoff
if grep -q "at $WB: trying $WA" "$D/wa.log" && grep -q "at $WB: trying $WA" "$D/wb.log"; then
    ok "from B (second in their list) the workers went to A at once: not tried since B served them"
else
    bad "the move from B to A"; grep "reconnecting" "$D/wa.log" "$D/wb.log" | tail -6
fi
for p in $gp; do reap "$p" 120 >/dev/null; done
long_answered m 1 3 && ok "that client's GEN answered once, on v3 (adopted from B), bitwise" || bad "the GEN of the client without B"
long_gens n "$PAIR" 1
for p in $gp; do reap "$p" 120 >/dev/null; done
long_answered n 1 3 && ok "a GEN through the pair afterwards answered by A, on v3, bitwise" || bad "GEN after the resolution"
reap "$s_p" 120 >/dev/null
if long_answered s 1 3 && grep -q "sent to the other" "$D/s.1.err"; then
    ok "the GEN running at B when it stepped down: answered standby there, sent to A, answered once, bitwise"
else
    bad "the GEN at B's step-down"; show "$D/s.1.err"
fi
wait_sql "$D/b.db" "SELECT count(*) FROM requests WHERE status = 'standby'" 1 30 &&
    ok "B's catalog records it given up at the step-down (status standby)" || bad "no standby row in B's catalog"
actives=0
for c in "$CA" "$CB"; do
    "$R" status --broker "$c" --json 2>/dev/null | $PY -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["ha"]["state"]=="active" else 1)' && actives=$((actives + 1))
done
[ $actives = 1 ] && ok "one active broker of the two" || bad "$actives active brokers"

# --- 7. the two catalogs as one -------------------------------------------------------
# each broker recorded the requests it answered; a report reads the union
wait_sql "$D/a.db" "SELECT count(*) FROM requests" 2 30 >/dev/null
na=$(sqlite3 "$D/a.db" "SELECT count(*) FROM requests"); nb=$(sqlite3 "$D/b.db" "SELECT count(*) FROM requests")
# distinct request ids over both (the GEN given up at B's step-down and
# answered by A is in both: once in the union, as answered)
nd=$(sqlite3 "$D/a.db" "ATTACH '$D/b.db' AS o; SELECT count(*) FROM (SELECT id FROM requests UNION SELECT id FROM o.requests)")
for order in "$D/a.db $D/b.db" "$D/b.db $D/a.db"; do
    set -- $order
    nu=$("$R" requests --catalog "$1" --catalog "$2" --json 2>"$D/u.err" |
        $PY -c 'import json,sys; r=json.load(sys.stdin); print(len(r), len({x["id"] for x in r}), sum(x["status"] != "ok" for x in r))')
    [ "$nu" = "$nd $nd 0" ] && [ "$nd" -ge 8 ] &&
        ok "reelctl requests over both catalogs ($(basename "$1") first): the union, $nd requests ($na + $nb rows), each once, as answered" ||
        { bad "the union of the catalogs: '$nu' for $nd distinct of $na + $nb"; show "$D/u.err"; }
done
sqlite3 "$D/a.db" ".backup '$D/a2.db'" # a copy with what its WAL holds (cp of a live WAL catalog copies no schema)
n2=$("$R" requests --catalog "$D/a.db" --catalog "$D/a2.db" --json 2>"$D/n2.err" | $PY -c 'import json,sys; print(len(json.load(sys.stdin)))')
[ "$n2" = "$na" ] && ok "a catalog with a copy of itself: each request once ($na), deduplicated by request id" ||
    { bad "dedup by request id: $n2 rows for $na requests"; show "$D/n2.err"; }
"$R" stats --catalog "$D/a.db" --catalog "$D/b.db" --json >"$D/us.json" 2>"$D/us.err"
$PY -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["overall"]["requests"]==int(sys.argv[2]) else 1)' "$D/us.json" $((na + nb)) &&
    ok "reelctl stats over both: the summaries added ($((na + nb)) requests)" || { bad "stats over both"; show "$D/us.json" "$D/us.err"; }
nv=$("$R" versions --catalog "$D/a.db" --catalog "$D/b.db" --json 2>/dev/null | $PY -c 'import json,sys; print(sum(1 for v in json.load(sys.stdin) if v["version"]==2))')
[ "$nv" = 1 ] && ok "v2, in both catalogs, once in the union" || bad "v2 appears $nv times in the union"
"$R" report --html "$D/u.html" --catalog "$D/a.db" --catalog "$D/b.db" 2>"$D/uh.err" && [ -s "$D/u.html" ] &&
    ok "reelctl report --html over both catalogs" || { bad "report over both"; show "$D/uh.err"; }
left=$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'reel-union-*' -newer "$D/a2.db" 2>/dev/null | wc -l)
[ "$left" = 0 ] && ok "the union's temporary catalogs are removed" || bad "$left temporary union catalogs left behind"

# --- 8. the standby listed first -----------------------------------------------------------
# (A is active now, B standby): an upload and a GEN without resends
# (liveness 0) given "B,A" are refused by B and go to A
"$R" sync --broker "$CB,$PAIR" --version 4 --upload "$D/w4.safetensors" --timeout-ms 60000 >"$D/s3.out" 2>&1
if grep -q "sync transformer v4: complete" "$D/s3.out" && cmp -s "$D/w4.safetensors" "$D/upa/transformer-v4.safetensors"; then
    ok "an upload through 'B,A' (B the standby): past B, stored byte for byte at A, complete"
else
    bad "the upload past the standby"; show "$D/s3.out"; ls -la "$D/upa" "$D/upb"
fi
REEL_CLIENT_LIVENESS_MS=0 "$R" gen --broker "$CB,$CA" --model tiny --context "$D/c1.safetensors" --steps 3 --size 2x8x8 \
    --seed 5 --timeout-ms 30000 --out "$D/z.safetensors" >"$D/z.out" 2>&1
grep -q "^reelctl: gen tiny .*weights v4" "$D/z.out" &&
    ok "a GEN without resends (liveness 0) through 'B,A': past the standby, answered on v4" ||
    { bad "liveness 0 past the standby"; show "$D/z.out"; }

# --- 9. the standby's copy of an uploaded version -------------------------------------------
# v4 is current at A, uploaded there: B copies it from A (FETCH on A's
# client socket) and keeps it as an upload, so that after a takeover a
# worker that joins B can fetch it there
if wait_for "$D/b.log" "copied transformer v4 from the active broker" 60 &&
    cmp -s "$D/w4.safetensors" "$D/upb/transformer-v4.safetensors" && [ -s "$D/upb/transformer-v4.sha256" ]; then
    ok "B (standby) copied v4, uploaded to A, from A: byte for byte, with its digest"
else
    bad "B's copy of v4"; show "$D/b.log"; ls -la "$D/upb"
fi
wait_sql "$D/b.db" "SELECT count(*) FROM audit WHERE action = 'upload' AND version = 4 AND role = 'broker' AND outcome LIKE '%copied from the peer broker%'" 1 30 &&
    ok "B's audit trail records the copy (role broker)" || { bad "no audit row of the copy"; sqlite3 "$D/b.db" "SELECT * FROM audit" | tail -5; }
kill -9 "$BA"
reap "$BA" 30 >/dev/null
long_gens p "$PAIR" 1 # refused by B while A was heard; A silent, back to B: B takes over
if wait_for "$D/b.log" "reel-broker: active \(term 4\)" 60 && wait_for "$D/b.log" "takeover: transformer v4 is current" 30; then
    ok "A SIGKILLed: B active at term 4, v4 (the copy's version) current"
else
    bad "B took over with v4"; show "$D/b.log"
fi
cli_worker wc "$D/b.log" "$D/wc.log" --broker "$WB" --weights "$D/w1.safetensors" --streams 1 --heartbeat-ms 200 ||
    { bad "worker wc registers with B"; show "$D/wc.log"; }
if wait_for "$D/wc.log" "applied transformer v4" 60; then
    ok "a worker that joined B after the takeover fetched v4 from B and applied it"
else
    bad "the new worker reached v4"; show "$D/wc.log"; show "$D/b.log"
fi
for p in $gp; do reap "$p" 120 >/dev/null; done
long_gens q "$CB" 2
for p in $gp; do reap "$p" 120 >/dev/null; done
if long_answered p 1 4 && long_answered q 2 4; then
    ok "GENs after the takeover answered once, on v4, bitwise reelctl run"
else
    bad "GENs on the copied v4"
fi

# --- 10. the same --role on both ------------------------------------------------------------
stop_proc "$BB" >/dev/null
ports=$(free_ports 2)
set -- $ports
cli_broker "$D/r1.log" --clients "tcp://127.0.0.1:$1" --workers "ipc://$D/r1w" --catalog "" --heartbeat-ms 200 \
    --peer "tcp://127.0.0.1:$2" --role primary --peer-timeout-ms 1500 || bad "the first primary starts"
R1=$BROKER
cli_broker "$D/r2.log" --clients "tcp://127.0.0.1:$2" --workers "ipc://$D/r2w" --catalog "" --heartbeat-ms 200 \
    --peer "tcp://127.0.0.1:$1" --role primary --peer-timeout-ms 1500 || bad "the second primary starts"
if wait_for "$D/r1.log" "warning: the peer says it is the primary too" 30 &&
    wait_for "$D/r2.log" "warning: the peer says it is the primary too" 30 &&
    wait_for "$D/r1.log" "reel-broker: active" 30 && wait_for "$D/r2.log" "reel-broker: standby" 30; then
    ok "both given --role primary: each warns; the older acts as the primary (active), the other is the standby"
else
    bad "the same --role on both"; show "$D/r1.log"; show "$D/r2.log"
fi
st=""
for p in $1 $2; do
    st="$st $("$R" status --broker "tcp://127.0.0.1:$p" --json 2>/dev/null | $PY -c 'import json,sys; print(json.load(sys.stdin)["ha"]["state"])')"
done
[ "$st" = " active standby" ] && ok "their STATUS: the first active, the second standby" || bad "states '$st'"
finish
