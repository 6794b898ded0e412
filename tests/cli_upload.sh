#!/bin/sh
# cli_upload.sh -- weights by value (issue 11, part 4): a trainer whose
# files no worker can open uploads them through the broker, and workers
# fetch them back. A real reel-broker (CURVE on, --weights-dir) and
# reel-workers whose weights directories hold only their starting weights;
# the small config (100 MB: 24 chunks of 4 MiB).
#   - reelctl sync --upload: every worker applies it, and a gen on it is
#     bitwise what `reelctl run` gives with the same file;
#   - a client key may not upload (forbidden, and audited);
#   - bytes that do not hash to the announced sha256 are refused, and
#     nothing of them is kept;
#   - an interrupted upload resumes where the broker's copy ends;
#   - a worker that joins later fetches the current uploaded version, and
#     so does one joining after the broker restarted (the version restored
#     from the catalog as "uploaded", the file from --weights-dir);
#   - the Python client uploads too (sync(..., upload=True));
#   - a SYNC may name an upload still coming: workers fetch what came and
#     wait for the rest (chunks of 1 MiB here against fetches of 4 MiB:
#     never answered short), and the sync completes when the last chunk
#     does; an upload whose bytes then fail their sha256 fails every
#     worker's fetch (nothing applied, the current version unchanged) and
#     the same version published again with the right bytes completes; a
#     SYNC naming an upload in progress under another sha256 is refused;
#   - the broker keeps the current uploaded version and the one before it
#     (--weights-keep 2, the default), removing older ones;
#   - a SYNC's deadline counts from the upload's last chunk;
#   - a version fetched into the buffer a worker kept from its last fetch
#     serves bitwise what reelctl run gives with its file.
# Usage: cli_upload.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-upload.XXXXXX)
K="$D/keys"
CE="ipc://$D/clients"
WE="ipc://$D/workers"
SUITE=upload
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/lib_cli.sh"

for r in broker trainer client; do "$R" keys new --role "$r" --out "$K" >/dev/null 2>&1; done
for w in w1 w2 w3 w4; do "$R" keys new --role worker --name "$w" --out "$K" >/dev/null 2>&1; done
mkdir -p "$D/store" "$D/tr" "$D/w1" "$D/w2" "$D/w3" "$D/w4"
for v in 1 2 3 4 5 6; do "$R" weights init --config small --seed "$v" --out "$D/tr/v$v.safetensors" 2>/dev/null; done
for w in w1 w2 w3 w4; do cp "$D/tr/v1.safetensors" "$D/$w/v1.safetensors"; done
"$R" tensor rand --name context --shape 5,256 --seed 2 --out "$D/ctx.safetensors"

broker() {
    cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$D/reel.db" --keys "$K" \
        --weights-dir "$D/store" --heartbeat-ms 500
}
broker || { bad "broker starts"; finish; }
worker() { # name
    cli_worker "$1" "$D/broker.log" "$D/$1.log" --broker "$WE" --weights "$D/$1/v1.safetensors" \
        --weights-dir "$D/$1" --streams 1 --heartbeat-ms 500 --key "$K/$1.key" --broker-key "$K/broker.pub"
}
worker w1 && worker w2 || { bad "workers register"; finish; }
as() { k=$1; shift; REEL_KEY="$K/$k.key" REEL_BROKER_KEY="$K/broker.pub" "$@"; }

as trainer "$R" sync --broker "$CE" --version 2 --upload "$D/tr/v2.safetensors" --timeout-ms 60000 2>"$D/s2.err"
grep -q "complete; applied w1,w2\|complete; applied w2,w1" "$D/s2.err" &&
    ok "sync --upload v2: both workers applied it ($(grep -o 'uploaded .* in [0-9.]* s' "$D/s2.err"))" ||
    { bad "sync --upload v2"; show "$D/s2.err"; show "$D/broker.log"; }
[ "$(sha256sum <"$D/store/transformer-v2.safetensors" | cut -c1-64)" = "$(sha256sum <"$D/tr/v2.safetensors" | cut -c1-64)" ] &&
    ok "the broker stored the file byte for byte" || bad "stored copy differs"
as client "$R" gen --broker "$CE" --model small --context "$D/ctx.safetensors" --size 1x8x8 --seed 3 --steps 2 \
    --timeout-ms 60000 --quiet --out "$D/g2.safetensors" 2>"$D/g2.err"
"$R" run --weights "$D/tr/v2.safetensors" --context "$D/ctx.safetensors" --size 1x8x8 --seed 3 --steps 2 \
    --out "$D/r2.safetensors" 2>/dev/null
grep -q "weights v2" "$D/g2.err" && "$R" tensor diff "$D/g2.safetensors" "$D/r2.safetensors" --name latent >/dev/null 2>&1 &&
    ok "a gen on v2 is bitwise reelctl run with the uploaded file" || { bad "gen on the uploaded v2"; show "$D/g2.err"; }

as client "$R" sync --broker "$CE" --version 3 --upload "$D/tr/v3.safetensors" --timeout-ms 20000 2>"$D/c3.err"
[ $? = 1 ] && grep -q "may not publish" "$D/c3.err" && ok "a client key may not upload" ||
    { bad "client upload refused"; show "$D/c3.err"; }
wait_sql "$D/reel.db" "select count(*) from audit where action='upload' and outcome like 'denied%'" 1 60 &&
    ok "the refused upload is audited" || bad "refused upload audited"

# the raw protocol, from Python: a wrong digest, and an interrupted upload
PYTHONPATH="$HERE/../clients/python" REEL_KEY="$K/trainer.key" REEL_BROKER_KEY="$K/broker.pub" \
    $PY - "$CE" "$D" >"$D/raw.out" 2>&1 <<'EOF'
import hashlib, os, sys, time
import msgpack
from reel import Client, ReelError
ep, d = sys.argv[1], sys.argv[2]
c = Client(ep, timeout=30)
def say(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
v3 = d + "/tr/v3.safetensors"
data = open(v3, "rb").read()
digest = hashlib.sha256(data).hexdigest()
# 1. bytes that do not hash to what was announced
try:
    c.upload(3, v3, sha256="0" * 64)
    say(False, "a wrong sha256 is refused")
except ReelError as e:
    say(e.code == "bad_request" and "hash to" in str(e), "a wrong sha256 is refused: %s" % e)
# the broker removes the partial file after it answered: wait for that
# (bounded), not for a moment
def kept():
    return os.path.exists(d + "/store/transformer-v3.safetensors") or \
        any(n.endswith(".part") for n in os.listdir(d + "/store"))
t_end = time.monotonic() + 30
while kept() and time.monotonic() < t_end:
    time.sleep(0.05)
say(not kept(), "nothing of the refused upload is kept")
# 2. two chunks, then the trainer goes away
chunk = 4 << 20
def up(off, n, rid):
    hdr = {"proto": "reel/1", "type": "UPLOAD", "id": rid, "component": "transformer", "version": 3,
           "sha256": digest, "size": len(data), "offset": off,
           "tensors": [{"name": "chunk", "dtype": "U8", "shape": [n], "bytes": n}]}
    c._sock.send_multipart([msgpack.packb(hdr), data[off:off + n]])
    return c._recv(rid, time.monotonic() + 10)[0]
a = up(0, chunk, 900)
b = up(chunk, chunk, 901)
say(a.get("received") == chunk and b.get("received") == 2 * chunk and not b.get("complete"),
    "chunks are acknowledged with what the broker holds (%s, %s)" % (a.get("received"), b.get("received")))
z = up(0, chunk, 902)  # again from the start: not written, the answer says where to go on
say(z.get("received") == 2 * chunk, "a chunk at the wrong offset is not written; the answer says resume at %s" % z.get("received"))
# 3. the Python client finishes it (resuming) and publishes it by value
res = c.sync(3, path=v3, upload=True)
say(res.complete and sorted(res.applied) == ["w1", "w2"], "sync(3, upload=True) resumes and completes: %s" % res.applied)
EOF
rc=$?
while read -r line; do
    case "$line" in PASS*) ok "${line#PASS }" ;; FAIL*) bad "${line#FAIL }" ;; *) echo "  | $line" ;; esac
done <"$D/raw.out"
[ $rc = 0 ] || bad "the Python part (exit $rc)"

worker w3 || bad "w3 registers"
i=0
while [ $i -lt 100 ] && ! as client "$R" status --json --broker "$CE" 2>/dev/null | grep -q '"name":"w3"[^}]*"versions":{"transformer":3}'; do
    sleep 0.2; i=$((i + 1))
done
grep -q "applied transformer v3" "$D/w3.log" && ok "a worker joining later fetched the current uploaded version (v3)" ||
    { bad "w3 catches up"; show "$D/w3.log"; }
# the broker restarts: v3 is restored from the catalog as uploaded, and a
# worker that joins now fetches it from the broker's weights directory
kill -TERM "$BROKER"
i=0; while kill -0 "$BROKER" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
broker && grep -q "restored transformer v3 from the catalog (uploaded)" "$D/broker.log" &&
    ok "after a restart the broker restores v3 as an uploaded version" ||
    { bad "restart restores the uploaded v3"; show "$D/broker.log"; }
worker w4 || bad "w4 registers"
i=0; while [ $i -lt 100 ] && ! grep -q "applied transformer v3" "$D/w4.log"; do sleep 0.2; i=$((i + 1)); done
grep -q "applied transformer v3" "$D/w4.log" && ok "a worker joining after the restart fetched v3" ||
    { bad "w4 after the restart"; show "$D/w4.log"; }

# a SYNC while the upload still comes (the raw protocol from Python)
PYTHONPATH="$HERE/../clients/python" REEL_KEY="$K/trainer.key" REEL_BROKER_KEY="$K/broker.pub" \
    $PY - "$CE" "$D" >"$D/overlap.out" 2>&1 <<'EOF'
import hashlib, os, sys, time
import msgpack
from reel import Client, ReelError
ep, d = sys.argv[1], sys.argv[2]
c = Client(ep, timeout=30)
def say(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
MiB = 1 << 20
def up(v, data, digest, off, n, rid):
    hdr = {"proto": "reel/1", "type": "UPLOAD", "id": rid, "component": "transformer", "version": v,
           "sha256": digest, "size": len(data), "offset": off,
           "tensors": [{"name": "chunk", "dtype": "U8", "shape": [n], "bytes": n}]}
    c._sock.send_multipart([msgpack.packb(hdr), data[off:off + n]])
    return c._recv(rid, time.monotonic() + 10)[0]
def sync(v, digest, rid):
    c._send("SYNC", rid, {"component": "transformer", "version": v, "sha256": digest, "uploaded": True,
                          "deadline_ms": 60000}, by=time.monotonic() + 10)
def no_answer(rid, secs):
    try:
        c._recv(rid, time.monotonic() + secs)
        return False
    except Exception as e:
        return type(e).__name__ == "ReelTimeout"
workers = sorted(w["name"] for w in c.status()["workers"])
# 1. v5 in 1 MiB chunks, the SYNC after the first
data = open(d + "/tr/v5.safetensors", "rb").read()
digest = hashlib.sha256(data).hexdigest()
a = up(5, data, digest, 0, MiB, 1000)
sync(5, digest, 1001)
say(a.get("received") == MiB and no_answer(1001, 1.5),
    "a SYNC naming an upload in progress is accepted and waits for its last chunk")
off, rid = MiB, 1002
while off < len(data):
    n = min(MiB, len(data) - off)
    last = up(5, data, digest, off, n, rid)
    off, rid = off + n, rid + 1
done = c._recv(1001, time.monotonic() + 60)[0]
say(last.get("complete") and done.get("type") == "SYNC_DONE" and done.get("complete") and
    sorted(done.get("applied", [])) == workers,
    "the sync completes once the last chunk came: applied by %s of %s" % (done.get("applied"), workers))
st = c.status()
say(st.get("versions", {}).get("transformer") == 5, "v5 is current (%s)" % st.get("versions"))
# 2. v6 synced while coming, then its bytes fail their sha256
data6 = open(d + "/tr/v6.safetensors", "rb").read()
digest6 = hashlib.sha256(data6).hexdigest()
bad6 = data6[:-1] + bytes([data6[-1] ^ 1])
up(6, bad6, digest6, 0, 4 * MiB, 2000)
sync(6, digest6, 2001)
off, rid, err = 4 * MiB, 2002, None
try:
    while off < len(bad6):
        n = min(4 * MiB, len(bad6) - off)
        up(6, bad6, digest6, off, n, rid)
        off, rid = off + n, rid + 1
except ReelError as e:
    err = e
say(err is not None and err.code == "bad_request" and "hash to" in str(err),
    "the upload's last chunk is refused: its bytes do not hash to the sha256 (%s)" % err)
done = c._recv(2001, time.monotonic() + 60)[0]
say(done.get("type") == "SYNC_DONE" and not done.get("applied") and
    len(done.get("failed", [])) == len(workers) and
    all("could not send the uploaded file" in f.get("reason", "") for f in done.get("failed", [])),
    "no worker applied it, each failed its fetch: %s" % done.get("failed"))
st = c.status()
say(st.get("versions", {}).get("transformer") == 5 and
    all(w.get("versions", {}).get("transformer") == 5 for w in st["workers"]),
    "the broker and every worker stay on v5")
say(not os.path.exists(d + "/store/transformer-v6.safetensors") and
    not any(n.endswith(".part") for n in os.listdir(d + "/store")), "nothing of the refused v6 is kept")
res = c.sync(6, path=d + "/tr/v6.safetensors", upload=True)
say(res.complete and sorted(res.applied) == workers, "v6 published again with the right bytes completes: %s" % res.applied)
# the older files go on the broker's removal thread, off the routing thread
want = ["transformer-v5.safetensors", "transformer-v6.safetensors"]
end = time.monotonic() + 10
while True:
    kept = sorted(n for n in os.listdir(d + "/store") if n.endswith(".safetensors"))
    sums = sorted(n for n in os.listdir(d + "/store") if n.endswith(".sha256"))
    if (kept == want and len(sums) == 2) or time.monotonic() > end:
        break
    time.sleep(0.05)
say(kept == want and sums == ["transformer-v5.sha256", "transformer-v6.sha256"],
    "--weights-keep 2 (the default): the store keeps the current v6 and v5 before it: %s %s" % (kept, sums))
# 3. a SYNC may not name an upload in progress under another sha256
up(7, data, digest, 0, MiB, 3000)
try:
    c._send("SYNC", 3001, {"component": "transformer", "version": 7, "sha256": "ab" * 32, "uploaded": True},
            by=time.monotonic() + 10)
    c._recv(3001, time.monotonic() + 10)
    say(False, "a SYNC naming an upload in progress under another sha256 is refused")
except ReelError as e:
    say(e.code == "bad_request", "a SYNC naming an upload in progress under another sha256 is refused: %s" % e)
# 4. the sync's deadline counts from the upload's last chunk: a 1 s deadline,
# the rest of v7 (the v5 bytes) after 2.5 s, and the sync still completes
c._send("SYNC", 3003, {"component": "transformer", "version": 7, "sha256": digest, "uploaded": True,
                       "deadline_ms": 1000}, by=time.monotonic() + 10)
time.sleep(2.5)
off, rid = MiB, 3100
while off < len(data):
    n = min(MiB, len(data) - off)
    up(7, data, digest, off, n, rid)
    off, rid = off + n, rid + 1
done = c._recv(3003, time.monotonic() + 60)[0]
say(done.get("type") == "SYNC_DONE" and done.get("complete") and sorted(done.get("applied", [])) == workers,
    "a 1 s sync deadline counts from the last chunk, 2.5 s after the SYNC: complete, applied by %s" %
    done.get("applied"))
EOF
rc=$?
while read -r line; do
    case "$line" in PASS*) ok "${line#PASS }" ;; FAIL*) bad "${line#FAIL }" ;; *) echo "  | $line" ;; esac
done <"$D/overlap.out"
[ $rc = 0 ] || bad "the overlap part (exit $rc)"
# v7 (the v5 bytes) went into the buffer the workers kept from fetching
# v6: what they loaded must be those bytes to the bit, not only hash like them
as client "$R" gen --broker "$CE" --model small --context "$D/ctx.safetensors" --size 1x8x8 --seed 4 --steps 2 \
    --timeout-ms 60000 --quiet --out "$D/g7.safetensors" 2>"$D/g7.err"
"$R" run --weights "$D/tr/v5.safetensors" --context "$D/ctx.safetensors" --size 1x8x8 --seed 4 --steps 2 \
    --out "$D/r7.safetensors" 2>/dev/null
grep -q "weights v7" "$D/g7.err" && "$R" tensor diff "$D/g7.safetensors" "$D/r7.safetensors" --name latent >/dev/null 2>&1 &&
    ok "a gen on v7 (fetched into the buffer kept from v6) is bitwise reelctl run with its file" ||
    { bad "gen on v7 after a reused fetch buffer"; show "$D/g7.err"; }

# the broker stopped on purpose (SIGTERM) as soon as it holds the SYNC of
# an upload: its ERROR shutdown is no answer; reelctl waits for the broker
# that comes back, uploads and syncs again there, and completes (it used
# to fail with the ERROR)
(REEL_CLIENT_LIVENESS_MS=200 as trainer "$R" sync --broker "$CE" --version 8 --upload "$D/tr/v4.safetensors"     --timeout-ms 120000 >"$D/s8.err" 2>&1; echo $? >"$D/s8.rc") &
sp=$!
PIDS="$PIDS $sp"
if wait_for "$D/broker.log" "sync transformer v8 accepted" 60; then
    kill -TERM "$BROKER"
    i=0; while kill -0 "$BROKER" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    broker || bad "the broker restarts after SIGTERM"
    reap "$sp" 120
    [ "$(cat "$D/s8.rc" 2>/dev/null)" = 0 ] && grep -q "sync transformer v8: complete" "$D/s8.err" &&
        cmp -s "$D/store/transformer-v8.safetensors" "$D/tr/v4.safetensors" &&
        ok "SIGTERM while the broker held an upload's SYNC: reelctl sync --upload went again to the next broker, complete, the file byte for byte" ||
        { bad "sync --upload through a SIGTERM (exit $(cat "$D/s8.rc" 2>/dev/null))"; show "$D/s8.err"; }
else
    bad "the SYNC of v8 reached the broker"; show "$D/s8.err"
fi
finish
