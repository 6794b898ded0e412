#!/bin/sh
# cli_security.sh -- process-level tests of issue 10, parts 1 and 2: a real
# reel-broker and real reel-workers over ipc (and loopback tcp), driven by
# reelctl and by tests/security_peer.py, a raw peer that sends what an
# attacker on the network would. Keys: CURVE with a ZAP handler that fails
# closed, roles (client, trainer, worker), worker names bound to keys, no
# handover, SIGHUP reloads, secure by default; weights: only under the
# weights directories, regular files, judged by size, generic answers;
# versions, deadlines and paths bounded. Each reproduced failure of the
# issue is named where it is checked. Every wait is bounded; every process
# is killed on exit.
# Usage: cli_security.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
HERE=$(cd "$(dirname "$0")" && pwd)
PEER="/usr/bin/python3 $HERE/security_peer.py"
D=$(mktemp -d /tmp/reel-security.XXXXXX)
K="$D/keys"
CE="ipc://$D/clients"
WE="ipc://$D/workers"
DB="$D/reel.db"
SUITE=security
. "$(dirname "$0")/lib_cli.sh"

# wait_gone PID SECONDS: until the process is gone; 1 when it is not.
wait_gone() {
    i=0
    while [ $i -lt $(($2 * 10)) ]; do
        gone "$1" && return 0
        sleep 0.1; i=$((i + 1))
    done
    return 1
}

# wait_sql SQL EXPECTED SECONDS: the catalog is written in batches.
wait_sql() {
    i=0
    while [ $i -lt $(($3 * 10)) ]; do
        [ "$(/usr/bin/sqlite3 "$DB" "$1" 2>/dev/null)" = "$2" ] && return 0
        sleep 0.1; i=$((i + 1))
    done
    echo "  (catalog: '$1' is '$(/usr/bin/sqlite3 "$DB" "$1" 2>&1)', expected '$2')"
    return 1
}

ms() { date +%s%3N; }

start_broker() { # extra flags...
    # a restart appends to the log: wait for one more "ready" than before
    _ready=$(grep -c "reel-broker: ready" "$D/broker.log" 2>/dev/null)
    "$B/reel-broker" --clients "$CE" --workers "$WE" --catalog "$DB" --heartbeat-ms 500 \
        --sync-deadline-ms 10000 "$@" >>"$D/broker.log" 2>&1 &
    BROKER=$!
    PIDS="$PIDS $BROKER"
    wait_count "$D/broker.log" "reel-broker: ready" $((${_ready:-0} + 1)) 60 "$BROKER"
}

start_worker() { # name weights extra...
    n=$1; w=$2; shift 2
    before=$(grep -cE "worker $n ready" "$D/broker.log" 2>/dev/null || true)
    "$B/reel-worker" --broker "$WE" --name "$n" --weights "$w" --streams 1 --heartbeat-ms 500 "$@" \
        >>"$D/$n.log" 2>&1 &
    _p=$!
    eval "PID_$n=$_p"
    PIDS="$PIDS $_p"
    wait_count "$D/broker.log" "worker $n ready" $((${before:-0} + 1)) 60 "$_p"
}

# with KEYNAME cmd...: cmd with this peer's key and the broker's in the environment.
with() { k=$1; shift; REEL_KEY="$K/$k.key" REEL_BROKER_KEY="$K/broker.pub" "$@"; }
peer() { # key|- endpoint seconds headers...: the raw peer, its output on stdout
    # (the peer bounds itself, tests/peer_guard.py; timeout is the backstop)
    k=$1; ep=$2; s=$3; shift 3
    if [ "$k" = - ]; then timeout -k 5 $((s + 60)) $PEER --endpoint "$ep" --for "$s" "$@"
    else timeout -k 5 $((s + 60)) $PEER --endpoint "$ep" --key "$K/$k.key" --broker-key "$K/broker.pub" --for "$s" "$@"; fi
}
# ask key endpoint headers...: the raw peer until its first answer (30 s at
# most). A check that expects an answer waits for it: a fixed 1 s window
# (a CURVE handshake, the ZAP round, the reply) can pass by on a busy
# machine. `peer KEY EP 1` stays for the checks that expect no answer.
ask() { _k=$1; _ep=$2; shift 2; peer "$_k" "$_ep" 30 --answered "$@"; }

mkdir -p "$D/w"
"$R" weights init --config tiny --seed 7 --out "$D/w/w1.safetensors" 2>/dev/null
"$R" weights init --config tiny --seed 8 --out "$D/w/w2.safetensors" 2>/dev/null
"$R" weights init --config tiny --seed 9 --out "$D/w/w3.safetensors" 2>/dev/null
"$R" tensor rand --name latent --shape 4,1,8,8 --seed 1 --out "$D/lat.safetensors"
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors"
IN="--context $D/ctx.safetensors --latent $D/lat.safetensors --steps 2 --shift 3"
"$R" run --weights "$D/w/w1.safetensors" $IN --out "$D/ref1.safetensors" 2>/dev/null
same() { "$R" tensor diff "$1" "$2" >/dev/null 2>&1; }
gen() { # out [flags]: reelctl gen, stderr to out.err
    o=$1; shift
    "$R" gen --broker "$CE" --model tiny $IN --timeout-ms 20000 --quiet --out "$o.safetensors" "$@" 2>"$o.err"
}
SHA=$(sha256sum "$D/w/w2.safetensors" | cut -c1-64)
sync_hdr() { # id version path [deadline]: a SYNC header as JSON
    printf '{"type":"SYNC","id":%s,"component":"transformer","version":%s,"sha256":"%s","path":"%s"%s}' \
        "$1" "$2" "$SHA" "$3" "${4:+,\"deadline_ms\":$4}"
}

echo "== secure by default: no keys on a non-loopback endpoint is refused in one line"
PORT=$((21000 + $$ % 20000))
t0=$(ms)
timeout 5 "$B/reel-broker" --clients "tcp://0.0.0.0:$PORT" --workers "ipc://$D/w0" --catalog "" >"$D/open.out" 2>"$D/open.err"
rc=$?
[ "$rc" = 2 ] && [ "$(wc -l <"$D/open.err")" = 1 ] && grep -q "refusing to serve tcp://0.0.0.0:$PORT without keys" "$D/open.err" &&
    grep -q -- "--insecure" "$D/open.err" && [ $(($(ms) - t0)) -lt 2000 ] &&
    ok "tcp://0.0.0.0 without keys: exit 2, one line naming --keys and --insecure" || { bad "open broker refused (exit $rc)"; show "$D/open.err"; }
timeout 5 "$B/reel-broker" --clients "ipc://$D/c0" --workers "tcp://*:$PORT" --catalog "" 2>"$D/open2.err"
[ $? = 2 ] && grep -q "refusing to serve tcp://\*:$PORT" "$D/open2.err" && ok "tcp://* for workers is refused too" || { bad "tcp://* refused"; show "$D/open2.err"; }
"$B/reel-broker" --clients "tcp://0.0.0.0:$PORT" --workers "ipc://$D/w0" --catalog "" --insecure >"$D/insecure.log" 2>&1 &
p=$!; PIDS="$PIDS $p"
wait_for "$D/insecure.log" "reel-broker: ready" 60 && grep -q "no keys: every peer .* is admitted (--insecure)" "$D/insecure.log" &&
    ok "--insecure starts it, and says so" || bad "--insecure starts"
stop_proc "$p" || bad "the --insecure broker stops on SIGTERM"
"$B/reel-broker" --clients "tcp://127.0.0.1:$PORT" --workers "ipc://$D/w0" --catalog "" >"$D/lo.log" 2>&1 &
p=$!; PIDS="$PIDS $p"
wait_for "$D/lo.log" "reel-broker: ready" 60 && ok "loopback and ipc need no keys" || bad "loopback starts"
stop_proc "$p" || bad "the loopback broker stops on SIGTERM"

echo "== loopback by name: tcp://localhost and tcp://[::1] bind and connect as documented"
if /usr/bin/python3 -c "import socket; socket.socket(socket.AF_INET6).bind(('::1', 0))" 2>/dev/null; then
    WE6="tcp://[::1]:$((PORT + 2))"
else
    echo "SKIP IPv6 loopback: this machine cannot bind ::1 (the [::1] case runs where it can); workers on ipc"
    WE6="ipc://$D/w6"
fi
"$B/reel-broker" --clients "tcp://localhost:$((PORT + 1))" --workers "$WE6" --catalog "" >"$D/byname.log" 2>&1 &
p=$!; PIDS="$PIDS $p"
if wait_for "$D/byname.log" "reel-broker: ready" 60; then
    ok "a broker binds tcp://localhost and $WE6 without keys"
    "$B/reel-worker" --broker "$WE6" --name w6 --weights "$D/w/w1.safetensors" --streams 1 --heartbeat-ms 200 \
        >"$D/w6.log" 2>&1 &
    p6=$!; PIDS="$PIDS $p6"
    if wait_for "$D/byname.log" "worker w6 ready" 60; then
        "$R" gen --broker "tcp://localhost:$((PORT + 1))" --model tiny $IN --timeout-ms 20000 --quiet \
            --out "$D/byname.safetensors" 2>"$D/byname.err" && same "$D/byname.safetensors" "$D/ref1.safetensors" &&
            ok "a worker on $WE6 serves a GEN sent to tcp://localhost, bitwise reelctl run's" ||
            { bad "a GEN by name"; show "$D/byname.err"; }
    else
        bad "a worker connects to $WE6"; show "$D/w6.log"
    fi
    stop_proc "$p6" || bad "the worker on $WE6 stops on SIGTERM"
else
    bad "a broker binds tcp://localhost and $WE6"; show "$D/byname.log"
fi
stop_proc "$p" || bad "the broker by name stops on SIGTERM"

echo "== a 128 MiB GEN under a 100 ms heartbeat: announced, waited for, answered; nobody counts as dead"
# Nothing else reaches a worker while a large message arrives (one
# connection keeps order): the broker's HEARTBEAT "incoming" says how large
# it is, and both sides wait that much longer (helper-87: a healthy worker
# was dropped twice over one 256 MiB GEN, the request failed worker_lost).
"$R" tensor rand --name context --shape 32768,1024 --seed 3 --out "$D/big.safetensors" 2>/dev/null
"$B/reel-broker" --clients "ipc://$D/bc" --workers "ipc://$D/bw" --catalog "" --heartbeat-ms 100 >"$D/big.log" 2>&1 &
p=$!; PIDS="$PIDS $p"
if wait_for "$D/big.log" "reel-broker: ready" 60; then
    "$B/reel-worker" --broker "ipc://$D/bw" --name wb --weights "$D/w/w1.safetensors" --streams 1 --heartbeat-ms 100 \
        >"$D/wb.log" 2>&1 &
    pb=$!; PIDS="$PIDS $pb"
    if wait_for "$D/big.log" "worker wb ready" 60; then
        "$R" gen --broker "ipc://$D/bc" --model tiny --context "$D/big.safetensors" --latent "$D/lat.safetensors" \
            --steps 2 --timeout-ms 60000 --quiet --out "$D/bigout.safetensors" 2>"$D/big.err"
        rc=$?
        [ "$rc" != 0 ] && grep -q "bad_request.*GEN: context width 1024, model tiny expects text_dim 32" "$D/big.err" &&
            ok "the worker took the 128 MiB GEN in and refused it itself (its width), not worker_lost" ||
            { bad "a 128 MiB GEN under a 100 ms heartbeat (exit $rc)"; show "$D/big.err"; }
        ! grep -q "reconnecting" "$D/wb.log" && ! grep -q "lost (expired)" "$D/big.log" &&
            [ "$(grep -c "worker wb ready" "$D/big.log")" = 1 ] &&
            ok "neither side took the other's silence during the transfer for death" ||
            { bad "a silence taken for death"; show "$D/wb.log" "$D/big.log"; }
        "$R" gen --broker "ipc://$D/bc" --model tiny $IN --timeout-ms 20000 --quiet --out "$D/after.safetensors" \
            2>"$D/after.err" && same "$D/after.safetensors" "$D/ref1.safetensors" &&
            ok "and the worker serves the next GEN, bitwise" || { bad "a GEN after the large one"; show "$D/after.err"; }
    else
        bad "worker wb registers"; show "$D/wb.log"
    fi
    stop_proc "$pb" || bad "worker wb stops on SIGTERM"
else
    bad "the 100 ms broker starts"; show "$D/big.log"
fi
stop_proc "$p" || bad "the 100 ms broker stops on SIGTERM"
rm -f "$D/big.safetensors"

echo "== reelctl keys new: a pair, 0600, never over an existing one unless --force"
"$R" keys new --role broker --out "$K" >/dev/null 2>&1 &&
    "$R" keys new --role trainer --name alice --out "$K" >/dev/null 2>&1 &&
    "$R" keys new --role client --name bob --out "$K" >/dev/null 2>&1 &&
    "$R" keys new --role worker --name w1 --out "$K" >/dev/null 2>&1 &&
    "$R" keys new --role worker --name w2 --out "$K" >/dev/null 2>&1 &&
    "$R" keys new --role client --name stranger --out "$D/other" >/dev/null 2>&1 &&
    "$R" keys new --role client --name carol --out "$D/later" >/dev/null 2>&1 || bad "keys new"
cp "$D/other/stranger.key" "$D/later/carol.key" "$K/" # secrets the peers hold; the broker reads only *.pub
modes=$(stat -c %a "$K/alice.key" "$K/alice.pub" | sort -u | tr '\n' ' ')
[ "$modes" = "600 " ] && grep -q "^role = trainer" "$K/alice.pub" && ! grep -q secret "$K/alice.pub" &&
    ok "alice.key and alice.pub are 0600; the .pub holds no secret" || { bad "key files ($modes)"; show "$K/alice.pub"; }
before=$(sha256sum "$K/alice.key" "$K/alice.pub")
"$R" keys new --role trainer --name alice --out "$K" >/dev/null 2>"$D/again.err"
[ $? = 2 ] && [ "$(sha256sum "$K/alice.key" "$K/alice.pub")" = "$before" ] &&
    grep -q "^reelctl: keys new: $K/alice.key exists: a key pair is not replaced (peers may hold it); --force replaces" "$D/again.err" &&
    ok "a second alice is refused (exit 2, naming --force); the first pair is untouched" || { bad "no overwrite"; show "$D/again.err"; }
# --force: a new pair over the old one (elsewhere: alice's is the broker's below)
"$R" keys new --role client --name dave --out "$D/forced" >/dev/null 2>&1
old=$(sha256sum "$D/forced/dave.key" "$D/forced/dave.pub")
"$R" keys new --role client --name dave --force --out "$D/forced" >"$D/forced.out" 2>"$D/forced.err"
rc=$?
[ $rc = 0 ] && [ "$(sha256sum "$D/forced/dave.key" "$D/forced/dave.pub")" != "$old" ] &&
    [ "$(stat -c %a "$D/forced/dave.key" "$D/forced/dave.pub" | sort -u)" = 600 ] &&
    [ "$(ls "$D/forced")" = "$(printf 'dave.key\ndave.pub')" ] &&
    pk=$(sed -n 's/^public-key = //p' "$D/forced/dave.key") && grep -qxF "public-key = $pk" "$D/forced/dave.pub" &&
    grep -qF "public key $pk" "$D/forced.err" &&
    ok "keys new --force replaces both files with a new pair (0600, the .pub the .key's, no temporary left)" ||
    { bad "keys new --force (exit $rc)"; show "$D/forced.err"; ls -la "$D/forced"; }
touch "$D/afile"
"$R" keys new --role client --out "$D/afile" >/dev/null 2>"$D/afile.err"
[ $? = 2 ] && grep -q "^reelctl: keys new: --out $D/afile is not a folder" "$D/afile.err" &&
    ok "keys new --out FILE: exit 2, not a folder" || { bad "keys new --out FILE"; show "$D/afile.err"; }
"$R" keys new --role client --name 'bad name' --out "$D/badname" >/dev/null 2>"$D/badname.err"
[ $? = 2 ] && grep -q "key name 'bad name'" "$D/badname.err" && [ ! -e "$D/badname/bad name.key" ] &&
    ok "a bad key name: exit 2 (the caller's input), no file" || { bad "a bad key name"; show "$D/badname.err"; }

echo "== CURVE both ways: a peer is heard only with a key in the allowlist, of the socket's role"
start_broker --keys "$K" || { bad "the broker starts with keys"; finish; }
grep -q "keys: CURVE on both sockets, 4 peer keys" "$D/broker.log" && ok "4 peer keys (the broker's own pair is not a peer)" || { bad "keys loaded"; show "$D/broker.log"; }
start_worker w1 "$D/w/w1.safetensors" --key "$K/w1.key" --broker-key "$K/broker.pub" || bad "w1 starts with its key"
if with bob gen "$D/g1" && same "$D/g1.safetensors" "$D/ref1.safetensors"; then ok "bob (client) generates over CURVE, bitwise equal to reelctl run"
else bad "gen over CURVE"; show "$D/g1.err"; fi
status='{"type":"STATUS","id":9}'
peer - "$CE" 1 "$status" >"$D/plain.out"
grep -q "peer: 0 messages" "$D/plain.out" && ok "a peer without a key gets no answer (before: anyone was served)" || { bad "plain peer refused"; show "$D/plain.out"; }
# a HELLO that does not decrypt never reaches the ZAP handler: the socket's
# monitor tells (a keyless peer too, when libzmq sees its mechanism before
# it hangs up: a race, not checked here)
timeout -k 5 61 $PEER --endpoint "$CE" --key "$K/bob.key" --broker-key "$D/other/stranger.pub" --for 1 "$status" >"$D/wrongbk.out"
grep -q "peer: 0 messages" "$D/wrongbk.out" &&
    wait_for "$D/broker.log" "refused a peer on the client socket .*: its CURVE handshake does not decrypt" 60 &&
    [ "$(with bob "$R" status --broker "$CE" --json | sed -n 's/.*"auth_refused":\([0-9]*\).*/\1/p')" -ge 1 ] &&
    ok "a peer holding another broker's public key: no answer, and the broker says why and counts it (auth_refused)" ||
    { bad "wrong broker key logged"; show "$D/wrongbk.out"; show "$D/broker.log"; }
# reelctl says why the broker never answered: the client socket's monitor saw the handshake fail
REEL_KEY= REEL_BROKER_KEY= "$R" status --broker "$CE" >/dev/null 2>"$D/hs_nokey.err"
grep -q "timeout: .*requires CURVE keys and this client has none" "$D/hs_nokey.err" &&
    ok "reelctl without a key: its timeout says the broker requires CURVE keys" || { bad "no-key hint"; show "$D/hs_nokey.err"; }
"$R" keys new --role broker --name elsewhere --out "$D/elsewhere" >/dev/null 2>&1 # another cluster's broker
REEL_KEY="$K/bob.key" REEL_BROKER_KEY="$D/elsewhere/elsewhere.pub" "$R" status --broker "$CE" >/dev/null 2>"$D/hs_bk.err"
grep -q "timeout: .*(--broker-key or REEL_BROKER_KEY) is probably not its public key" "$D/hs_bk.err" &&
    ok "reelctl with another broker's public key: its timeout says so" || { bad "broker-key hint"; show "$D/hs_bk.err"; }
REEL_KEY="$K/stranger.key" REEL_BROKER_KEY="$K/broker.pub" "$R" status --broker "$CE" >/dev/null 2>"$D/hs_deny.err"
grep -q "timeout: .*the broker refused this client's key at the handshake (ZAP status 400" "$D/hs_deny.err" &&
    ok "reelctl with a key not in the allowlist: its timeout says the broker refused the key" ||
    { bad "refused-key hint"; show "$D/hs_deny.err"; }
peer stranger "$CE" 1 "$status" >"$D/stranger.out"
grep -q "peer: 0 messages" "$D/stranger.out" && wait_for "$D/broker.log" "refused a peer on the client socket .*not in the allowlist" 60 &&
    ok "a key not in the allowlist gets no answer, and the broker logs it" || { bad "stranger refused"; show "$D/stranger.out"; }
peer w2 "$CE" 1 "$status" >"$D/wrongsock.out"
grep -q "peer: 0 messages" "$D/wrongsock.out" && wait_for "$D/broker.log" "refused a peer on the client socket .*key w2 is a worker key" 60 &&
    ok "a worker key on the client socket is refused" || { bad "worker key on the client socket"; show "$D/wrongsock.out"; }
# auth_refused counts handshakes; auth_refused_peers the peers (a key from
# an address on one socket) they came from, and auth_refused_recent names
# them: the stranger's key came from two processes (reelctl, the raw
# peer), two peers (over ipc, ZAP's address names the process:
# localhost:UID:GID:PID), reelctl's several tries (a fresh socket each
# while its call waited) one of them; w2's key is named; the keyless
# handshakes of the many tries above are one peer per reason.
spub=$(sed -n 's/^public-key = //p' "$D/other/stranger.pub")
with bob "$R" status --broker "$CE" --json >"$D/refused.json" 2>&1
with bob "$R" status --broker "$CE" >"$D/refused.txt" 2>&1
if /usr/bin/python3 - "$D/refused.json" "$spub" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
recent = st["auth_refused_recent"]
mine = [p for p in recent if p["key"] == sys.argv[2]]
w2 = [p for p in recent if p["name"] == "w2"]
assert len(mine) == 2 and all("not in the allowlist" in p["why"] and p["socket"] == "client" for p in mine), recent
assert all(p["address"].startswith("localhost:") for p in mine) and mine[0]["address"] != mine[1]["address"], mine
assert max(p["count"] for p in mine) >= 2, mine
assert len(w2) == 1 and w2[0]["why"] == "key w2 is a worker key", recent
keyless = [p for p in recent if not p["key"]]
assert len(keyless) == len({p["why"] for p in keyless}) and sum(p["count"] for p in keyless) > len(keyless), keyless
assert st["auth_refused"] > st["auth_refused_peers"] >= len(recent) >= 4, st
PY
then grep -qE "^handshakes refused: [0-9]+ from [0-9]+ peers; most recently:" "$D/refused.txt" &&
    grep -qF "client socket, key $spub from localhost:" "$D/refused.txt" &&
    ok "STATUS counts the refused peers apart from their handshakes, and names the latest (reelctl status lists them)" ||
    { bad "refused peers in reelctl status"; show "$D/refused.txt"; }
else bad "refused peers in STATUS"; show "$D/refused.json"; fi
peer bob "$WE" 1 '{"type":"READY","name":"bob","models":["tiny"]}' >"$D/wrongsock2.out"
grep -q "peer: 0 messages" "$D/wrongsock2.out" && wait_for "$D/broker.log" "refused a peer on the worker socket .*key bob is a client key" 60 &&
    ok "a client key on the worker socket is refused" || { bad "client key on the worker socket"; show "$D/wrongsock2.out"; }
timeout 60 "$B/reel-worker" --broker "$WE" --name x --weights "$D/w/w1.safetensors" --key "$K/bob.key" --broker-key "$K/broker.pub" >"$D/x.log" 2>&1
[ $? = 2 ] && grep -q "a client key cannot be used here" "$D/x.log" && ok "reel-worker refuses a client key itself (exit 2)" || { bad "worker key role"; show "$D/x.log"; }
ask bob "$CE" "$status" >"$D/bob.out"
grep -q "^STATUS_REPLY" "$D/bob.out" && ok "the same raw peer with bob's key is answered" || { bad "bob answered"; show "$D/bob.out"; }
# FETCH on the client socket is the standby pair's (its shared broker key):
# a client's is forbidden; the broker key is admitted only by a broker of
# a pair (tests/cli_hosts_pair.sh checks it there)
fetch='{"type":"FETCH","id":11,"component":"transformer","version":1,"sha256":"'"$SHA"'","offset":0}'
ask bob "$CE" "$fetch" >"$D/bobfetch.out"
grep -q "^ERROR forbidden FETCH: only the peer broker" "$D/bobfetch.out" && ! grep -q "^FETCH_DATA" "$D/bobfetch.out" &&
    ok "a client key's FETCH on the client socket: forbidden (only the pair's key)" || { bad "client FETCH refused"; show "$D/bobfetch.out"; }
peer broker "$CE" 1 "$fetch" >"$D/brkfetch.out"
grep -q "peer: 0 messages" "$D/brkfetch.out" &&
    ok "the broker's own key at a broker alone (no --peer) is no peer: its FETCH gets no answer" || { bad "broker key at a lone broker"; show "$D/brkfetch.out"; }

echo "== roles: only a trainer may SYNC; every SYNC is audited with its key's name"
# w1 routable first: a worker starved past its liveness (200 ms heartbeats,
# a busy machine, CURVE) is dropped and registers again, and a sync in
# that gap fails "no live worker" (seen once under load 8)
w1_live() {
    with bob "$R" status --broker "$CE" --json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
sys.exit(0 if any(w["name"] == "w1" and w.get("routable") for w in s["workers"]) else 1)'
}
i=0
while ! w1_live && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
with bob "$R" sync --broker "$CE" --version 2 --weights "$D/w/w2.safetensors" --timeout-ms 10000 2>"$D/bobsync.err"
[ $? = 1 ] && grep -q "forbidden: SYNC: the client role may not publish weights" "$D/bobsync.err" &&
    ok "bob's SYNC: forbidden (before: anyone on the client port could publish)" || { bad "client SYNC refused"; show "$D/bobsync.err"; }
if with alice "$R" sync --broker "$CE" --version 2 --weights "$D/w/w2.safetensors" --timeout-ms 20000 2>"$D/alicesync.err" &&
    grep -q "complete; applied w1" "$D/alicesync.err"; then ok "alice (trainer) syncs v2, keys from REEL_KEY/REEL_BROKER_KEY"
else bad "trainer sync"; show "$D/alicesync.err"; fi
"$R" sync --broker "$CE" --version 2 --weights "$D/w/w2.safetensors" --timeout-ms 20000 --key "$K/alice.key" \
    --broker-key "$K/broker.pub" 2>"$D/alicesync2.err" && grep -q "complete" "$D/alicesync2.err" &&
    ok "alice resends v2 with --key/--broker-key flags" || { bad "trainer sync by flags"; show "$D/alicesync2.err"; }
wait_sql "select group_concat(key_name || ':' || role || ':' || substr(outcome, 1, 8), ',') from (select * from audit order by id)" \
    "bob:client:denied: ,alice:trainer:accepted,alice:trainer:resend" 60 &&
    ok "the audit table: bob denied, alice accepted, alice resent" || bad "audit rows"
# A client key that floods forbidden SYNCs and UPLOADs (never reading):
# each is logged, audited and answered within the peer's budget for bad
# messages (20 at once, then 10 a second), the rest only counted. Before:
# every one wrote a log line (its path whole) and a kept audit row, never
# pruned (20,000 SYNCs in 0.13 s: 22 MB of log, 18 MB of audit rows).
long_path="/w/$(printf '%0900d' 0)"
sup0=$(with alice "$R" status --broker "$CE" --json | sed -n 's/.*"replies_suppressed":\([0-9]*\).*/\1/p')
lines0=$(grep -c "from bob refused" "$D/broker.log")
rows0=$(/usr/bin/sqlite3 "$DB" "select count(*) from audit where key_name = 'bob'")
peer bob "$CE" 2 --repeat 1000 \
    "{\"type\":\"SYNC\",\"id\":7,\"component\":\"transformer\",\"version\":9,\"sha256\":\"$(printf 'ab%.0s' $(seq 32))\",\"path\":\"$long_path\"}" \
    '{"type":"UPLOAD","id":8,"component":"transformer","version":9,"sha256":"'"$(printf 'ab%.0s' $(seq 32))"'","size":1,"offset":0}' \
    >"$D/bobflood.out"
with bob gen "$D/gflood" || { bad "bob still generates after his flood"; show "$D/gflood.err"; }
sup1=$(with alice "$R" status --broker "$CE" --json | sed -n 's/.*"replies_suppressed":\([0-9]*\).*/\1/p')
lines1=$(grep -c "from bob refused" "$D/broker.log")
sleep 0.5 # the catalog writes in batches: a row past the budget would show by now
rows1=$(/usr/bin/sqlite3 "$DB" "select count(*) from audit where key_name = 'bob'")
ans=$(grep -c "^ERROR forbidden" "$D/bobflood.out")
if [ $((lines1 - lines0)) -le 60 ] && [ $((rows1 - rows0)) -le 60 ] && [ "$ans" -le 60 ] && [ "$ans" -ge 20 ] &&
    [ $((sup1 - sup0)) -ge 1900 ]; then
    ok "a client key's 2000 forbidden SYNCs/UPLOADs: $((lines1 - lines0)) log lines, $((rows1 - rows0)) audit rows, $ans answers, $((sup1 - sup0)) counted suppressed"
else
    bad "a flood of forbidden SYNCs: $((lines1 - lines0)) log lines, $((rows1 - rows0)) audit rows, $ans answers, $((sup1 - sup0)) suppressed"
fi

echo "== a worker's name is bound to its key; no handover"
stop_proc "$PID_w1" || bad "w1 stops on SIGTERM"
wait_for "$D/broker.log" "worker w1 lost" 60 || bad "w1 leaves"
ask w2 "$WE" '{"type":"READY","name":"w1","models":["tiny"],"versions":{"transformer":2}}' >"$D/steal.out"
grep -q "ERROR bad_request READY: worker name w1 is bound to another worker key" "$D/steal.out" &&
    ok "w2's key claiming the name w1 is refused, w1 gone or not (before: accepted)" || { bad "name bound to key"; show "$D/steal.out"; }
start_worker w1 "$D/w/w1.safetensors" --key "$K/w1.key" --broker-key "$K/broker.pub" && ok "w1 comes back with its own key" || bad "w1 restarts"
wait_for "$D/w1.log" "applied transformer v2" 60 || bad "w1 caught up to v2"
# A key holds at most 16 names: w2's key registers 17 (n0 on a connection
# that stays, then n1..n16 on one connection, each READY there a restart
# under a new name), and the 17th lets go of the one it registered least
# recently that no live worker has (n1: n0 is older, but live), which
# another key may then take; the others stay bound. Before: every READY
# under a new name kept a binding for the broker's life (a worker key
# could grow the broker's memory without end).
ready_n() { echo "{\"type\":\"READY\",\"name\":\"$1\",\"models\":[],\"versions\":{\"transformer\":2}}"; }
$PEER --endpoint "$WE" --key "$K/w2.key" --broker-key "$K/broker.pub" --for 30 --heartbeat "$(ready_n n0)" \
    >"$D/n0live.out" 2>&1 &
n0live=$!; PIDS="$PIDS $n0live"
wait_for "$D/broker.log" "worker n0 ready" 60 || bad "n0 registers"
names=""
for i in $(seq 1 16); do names="$names $(ready_n n$i)"; done
peer w2 "$WE" 1 $names >"$D/names.out"
# (the READY of n16 is handled once its name is bound: "ready" lines of
# READYs again on one connection come out of that worker's budget, 20 a
# 10 s window, and these are 15 restarts, 30 lines)
wait_for "$D/broker.log" "worker key w2 holds 16 worker names: .* is let go for n16" 60 ||
    bad "w2's key registers 17 names"
grep -q "worker key w2 holds 16 worker names: n1, the one it registered least recently, is let go for n16" \
    "$D/broker.log" && ok "the 17th name of w2's key lets go of its first but the live n0, logged" ||
    { bad "one name let go"; grep "worker key w2" "$D/broker.log"; }
ask w1 "$WE" "$(ready_n n2)" >"$D/n2.out"
grep -q "ERROR bad_request READY: worker name n2 is bound to another worker key" "$D/n2.out" &&
    ok "n2, still one of w2's 16, is refused to w1's key" || { bad "n2 stays bound"; show "$D/n2.out"; }
peer w1 "$WE" 1 "$(ready_n n1)" >"$D/n1.out"
wait_count "$D/broker.log" "worker n1 ready|READY refused: worker name n1 " 2 60
if grep -E "worker n1 ready|READY refused: worker name n1 " "$D/broker.log" | tail -1 | grep -q "worker n1 ready"; then
    ok "n1, let go, is taken by w1's key (before: bound to w2's for the broker's life)"
    wait_for "$D/broker.log" "worker n1 lost \(expired\)" 60 || bad "w1's raw n1 expires"
else bad "n1 let go"; grep "name n1 " "$D/broker.log"; fi
kill "$n0live"; reap "$n0live" 60
wait_for "$D/broker.log" "worker n16 lost \(expired\)" 60 && wait_for "$D/broker.log" "worker n0 lost \(expired\)" 60 ||
    bad "the raw peers' workers expire"

echo "== SYNC paths no peer can abuse: only the weights directory, generic answers"
sp() { # out header: alice's raw SYNC, its answer in out
    o=$1; shift; ask alice "$CE" "$@" >"$o"
}
sp "$D/passwd.out" "$(sync_hdr 31 3 /etc/passwd)"
grep -q "bad_weights: path not under the worker.s weights directories" "$D/passwd.out" && ! grep -qE "root|header length|[0-9]{12}" "$D/passwd.out" &&
    ok "/etc/passwd: a generic reason, no byte of the file (before: its first 8 bytes as a number)" || { bad "passwd answer"; show "$D/passwd.out"; }
grep -qE "sync to v3 refused: bad_weights: .*[(]/etc/passwd: not under any weights directory[)]" "$D/w1.log" && ok "the detail is in w1's log" || { bad "detail logged"; show "$D/w1.log"; }
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$D/w/junk.safetensors"
sp "$D/missing.out" "$(sync_hdr 32 3 "$D/w/missing.safetensors")"
sp "$D/junk.out" "$(sync_hdr 33 3 "$D/w/junk.safetensors")"
a=$(grep -o '"failed": \[[^]]*\]' "$D/missing.out"); b=$(grep -o '"failed": \[[^]]*\]' "$D/junk.out")
[ -n "$a" ] && [ "$a" = "$b" ] && echo "$a" | grep -q "bad_weights: not a safetensors file" &&
    ok "a missing file and a junk file get one answer (before: existence leaked)" || { bad "one answer"; echo "  | $a"; echo "  | $b"; }
ln -s /etc/passwd "$D/w/link.safetensors"
sp "$D/link.out" "$(sync_hdr 34 3 "$D/w/link.safetensors")"
sp "$D/dotdot.out" "$(sync_hdr 35 3 "$D/w/../w/w2.safetensors")"
grep -q "bad_weights: not a safetensors file" "$D/link.out" && grep -q "bad_weights: path not under" "$D/dotdot.out" &&
    ok "a symlink below the directory and a '..' path are refused" || { bad "symlink and .."; show "$D/link.out" "$D/dotdot.out"; }

echo "== a FIFO is refused at once, and SIGTERM still stops the worker"
mkfifo "$D/w/fifo.safetensors"
t0=$(ms)
sp "$D/fifo.out" "$(sync_hdr 36 3 "$D/w/fifo.safetensors")"
grep -q "bad_weights: not a safetensors file" "$D/fifo.out" && grep -q "not a regular file" "$D/w1.log" &&
    ok "FIFO: refused (before: the sync thread blocked in open() for good)" || { bad "FIFO refused"; show "$D/fifo.out"; }
t0=$(ms)
kill -TERM "$PID_w1"
if wait_gone "$PID_w1" 2; then ok "SIGTERM: w1 exits in $(($(ms) - t0)) ms (under 2 s)"; else bad "w1 hangs after SIGTERM"; kill -9 "$PID_w1"; fi
reap "$PID_w1" 60
start_worker w1 "$D/w/w1.safetensors" --key "$K/w1.key" --broker-key "$K/broker.pub" || bad "w1 restarts"

echo "== a 50 GiB sparse file is judged by its size, and the next sync is not held up"
/usr/bin/python3 -c "
import json, struct, sys
n = (50 << 30) // 4
h = json.dumps({'w': {'dtype': 'F32', 'shape': [n], 'data_offsets': [0, 4 * n]}}).encode()
f = open(sys.argv[1], 'wb'); f.write(struct.pack('<Q', len(h)) + h); f.truncate(8 + len(h) + 4 * n); f.close()
" "$D/w/huge.safetensors"
t0=$(ms)
sp "$D/huge.out" "$(sync_hdr 37 3 "$D/w/huge.safetensors")"
grep -q "bad_weights: not weights of this worker.s model" "$D/huge.out" && grep -q "more than the model's" "$D/w1.log" &&
    ok "50 GiB: refused before hashing (before: a core for minutes, later syncs timed out)" || { bad "huge file"; show "$D/huge.out"; }
t0=$(ms)
with alice "$R" sync --broker "$CE" --version 3 --weights "$D/w/w3.safetensors" --timeout-ms 20000 2>"$D/s3.err" &&
    grep -q "complete" "$D/s3.err" && [ $(($(ms) - t0)) -lt 5000 ] &&
    ok "the next sync (v3) completes in $(($(ms) - t0)) ms" || { bad "sync after the huge file"; show "$D/s3.err"; }

echo "== versions, deadlines and paths bounded on the wire"
sp "$D/v63.out" "$(sync_hdr 41 9223372036854775808 "$D/w/w2.safetensors")"
grep -q "ERROR bad_request SYNC: 'version' must be in 1..9223372036854775807" "$D/v63.out" &&
    ok "SYNC version 2^63: bad_request (before: accepted, and every later GEN broke)" || { bad "version 2^63"; show "$D/v63.out"; }
with bob gen "$D/g2" && grep -q "weights v3" "$D/g2.err" && ok "GENs still run on v3" || { bad "gen after 2^63"; show "$D/g2.err"; }
if with alice "$R" sync --broker "$CE" --version 4 --weights "$D/w/w2.safetensors" --deadline-ms 9223372036854775807 \
    --timeout-ms 20000 2>"$D/dl.err" && grep -q "complete" "$D/dl.err"; then
    ok "deadline_ms 2^63-1 is clamped, the sync completes (before: a signed overflow)"
else bad "huge deadline"; show "$D/dl.err"; fi
long="$D/w/$(/usr/bin/python3 -c 'print("/".join(["d" * 200] * 6))')/x.safetensors"
sp "$D/long.out" "$(sync_hdr 42 5 "$long")"
grep -qE "ERROR bad_request SYNC: 'path' must be a string of at most 1023 bytes" "$D/long.out" &&
    ok "a path over 1023 bytes: a clear bad_request (before: accepted, restored cut short)" || { bad "long path"; show "$D/long.out"; }
wait_sql "select count(*) from audit where key_name = 'alice' and outcome like 'refused: bad_request:%'" "2" 60 &&
    ok "the refused SYNCs are audited too" || bad "refusals audited"

echo "== a worker acks only what it was sent"
ready='{"type":"READY","name":"fw","models":["tiny"],"versions":{"transformer":4}}'
ack1='{"type":"SYNC_ACK","component":"transformer","version":9223372036854775807,"ok":true}'
ack2='{"type":"SYNC_ACK","component":"transformer","version":18446744073709551615,"ok":true}'
$PEER --endpoint "$WE" --id fw --key "$K/w2.key" --broker-key "$K/broker.pub" --for 4 --heartbeat "$ready" "$ack1" "$ack2" \
    >"$D/fw.out" 2>&1 &
fw=$!; PIDS="$PIDS $fw"
wait_for "$D/broker.log" "worker fw acked transformer v9223372036854775807, which it was never sent: ignored" 60 &&
    ok "an ack of a version never sent is ignored (before: the worker became eligible for every version)" || bad "unsent ack ignored"
with bob gen "$D/g3" --weights-version 9223372036854775807 --deadline-ms 1000
reap "$fw" 60
grep -q "no_worker" "$D/g3.err" && grep -q "peer: .* (0 REQUEST)" "$D/fw.out" &&
    grep -q "ERROR bad_request SYNC_ACK: 'version' must be in 0..9223372036854775807" "$D/fw.out" &&
    ok "no request reaches it; an ack of 2^64-1 is bad_request" || { bad "fake worker got work"; show "$D/g3.err" "$D/fw.out"; }

echo "== SIGHUP reloads the allowlist: new keys admitted, removed ones no longer heard"
peer carol "$CE" 1 "$status" >"$D/carol0.out"
# A long-lived C client with carol's key before it is allowed: reelctl top
# (one client, a STATUS a call, 5 s each). libzmq never retries a
# handshake the ZAP handler refused, and the socket keeps no pipe: its
# second call blocked in a send for ever, and a key added later was never
# tried again. Now each call says why, and a call whose socket was refused
# tries a fresh one (backoff: up to once a second) until its timeout: the
# call waiting when the key is reloaded is answered. The second top is one
# call of 60 s, waiting through the reload: before, it timed out.
REEL_KEY="$K/carol.key" REEL_BROKER_KEY="$K/broker.pub" timeout -k 5 120 "$R" top --broker "$CE" --interval-ms 100 \
    >"$D/top.out" 2>&1 &
top=$!; PIDS="$PIDS $top"
REEL_KEY="$K/carol.key" REEL_BROKER_KEY="$K/broker.pub" timeout -k 5 120 "$R" top --broker "$CE" --count 1 \
    --interval-ms 60000 >"$D/top1.out" 2>&1 &
top1=$!; PIDS="$PIDS $top1"
wait_count "$D/top.out" "timeout: .*the broker refused this client's key at the handshake \(ZAP status 400" 2 60 "$top"
refused=$?
gone "$top1" && { bad "the 60 s call ended before the reload"; show "$D/top1.out"; }
cp "$D/later/carol.pub" "$K/"
kill -HUP "$BROKER"
wait_for "$D/broker.log" "SIGHUP: keys reloaded from .*: 5 keys" 60 || bad "reload"
ask carol "$CE" "$status" >"$D/carol1.out"
grep -q "peer: 0 messages" "$D/carol0.out" && grep -q "^STATUS_REPLY" "$D/carol1.out" &&
    ok "carol is heard only after her key was added and the broker reloaded" || { bad "carol admitted on reload"; show "$D/carol0.out" "$D/carol1.out"; }
[ "$refused" = 0 ] && wait_for "$D/top.out" "^queue [0-9]+/[0-9]+" 60 "$top" &&
    ok "reelctl top with carol's key: each call refused (none blocks), then, once her key is reloaded, answered on a fresh socket" ||
    { bad "one C client refused, then admitted after the reload"; show "$D/top.out"; }
stop_proc "$top"
reap "$top1" 60
rc1=$?
[ "$rc1" = 0 ] && grep -qE "^queue [0-9]+/[0-9]+" "$D/top1.out" &&
    ok "a call waiting (60 s) through the reload is answered once the key is added: its socket refused, it tried fresh ones" ||
    { bad "the call waiting through the reload (exit $rc1)"; show "$D/top1.out"; }
# carol keeps one connection; each HEARTBEAT on the client socket is
# answered (unknown_type) while her key is allowed. The key is removed once
# she has been heard (not after a moment: a busy machine may not have
# answered yet), and once the broker says it dropped her message, at most
# the one answer already in flight may still reach her.
$PEER --endpoint "$CE" --key "$K/carol.key" --broker-key "$K/broker.pub" --for 8 --heartbeat >"$D/carol2.out" 2>&1 &
c=$!; PIDS="$PIDS $c"
wait_count "$D/carol2.out" "^ERROR unknown_type" 2 60 || bad "carol's live connection is heard before the revocation"
rm "$K/carol.pub"
kill -HUP "$BROKER"
wait_for "$D/broker.log" "dropped a message on the client socket from a key no longer allowed" 60
dropped=$?
n0=$(grep -c "^ERROR unknown_type" "$D/carol2.out")
reap "$c" 60
n=$(grep -c "^ERROR unknown_type" "$D/carol2.out")
[ "$dropped" = 0 ] && [ "$n" -le $((n0 + 1)) ] && grep -q "^peer: " "$D/carol2.out" &&
    ok "removed: carol's open connection is no longer heard ($n answered before the revocation, none after)" || { bad "revocation on a live connection ($n0 then $n)"; show "$D/carol2.out"; }
printf 'role = client\n' >"$K/broken.pub"
kill -HUP "$BROKER"
wait_for "$D/broker.log" "SIGHUP: keys NOT reloaded, the 4 loaded before stay" 60 && rm "$K/broken.pub" &&
    with bob gen "$D/g4" && ok "a broken allowlist is not loaded; the old one stays in force" || bad "broken reload"
rm "$K/w1.pub"
kill -HUP "$BROKER"
wait_for "$D/broker.log" "worker w1 lost \(key revoked\)" 60 && ok "a worker whose key is removed is dropped" || bad "worker key revoked"

echo "== no handover, even without keys: a second peer under a live worker's id takes nothing"
stop_proc "$BROKER" || bad "the broker stops on SIGTERM"
: >"$D/broker.log"
start_broker --catalog "$D/plain.db" || bad "the broker restarts without keys"
start_worker h1 "$D/w/w1.safetensors" || bad "h1 starts"
$PEER --endpoint "$WE" --id h1 --for 4 --heartbeat '{"type":"READY","name":"h1","models":["tiny"],"versions":{"transformer":1}}' \
    >"$D/imp.out" 2>&1 &
imp=$!; PIDS="$PIDS $imp"
sleep 0.5
served=0; exact=0
for i in 1 2 3 4 5 6 7 8 9 10; do
    gen "$D/h$i" --weights-version 1 && served=$((served + 1))
    same "$D/h$i.safetensors" "$D/ref1.safetensors" && exact=$((exact + 1))
done
reap "$imp" 60
[ "$served" = 10 ] && [ "$exact" = 10 ] && grep -q "peer: 0 messages (0 REQUEST)" "$D/imp.out" &&
    ok "10 of 10 requests served by the real h1, none by the impostor (before: 20 of 20 stolen)" || {
    bad "handover ($served served, $exact exact)"; show "$D/imp.out"; }

finish
