#!/bin/sh
# cli_upload_disk.sh -- weights by value when the broker's disk is full
# (issue 11, part 4): a real reel-broker whose --weights-dir is a small
# tmpfs, partly filled, and two reel-workers (small config, 100 MB).
#   - `reelctl sync --upload` of a version that does not fit: the trainer
#     gets the broker's "No space left on device" (exit 1); the SYNC it sent
#     after the first chunk fails on every worker with that reason, at
#     once, not after a fetch timeout; nothing is applied (a gen still runs
#     on v1); the broker keeps serving (STATUS, a gen);
#   - the catalog records the version failed;
#   - when there is room again the same command resumes the upload where
#     the broker's copy stopped, every worker applies it, a gen runs on it,
#     and no partial file is left in --weights-dir;
#   - a broker killed (-9) with an upload half-way and its SYNC sent: the
#     restarted broker resumes the last version applied (uploaded, from
#     --weights-dir), removes the partial file, the catalog says the half
#     one failed, the workers reconnect and serve on the old version, and
#     the upload sent again completes;
#   - a spare file (a removed version's, kept for the next upload to
#     write over) that the upload cannot use and whose room it needs is
#     removed, and the upload completes.
# Needs a tmpfs mount (root): where it cannot mount one it prints one SKIP
# line and exits 0.
# Usage: cli_upload_disk.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-updisk.XXXXXX)
SUITE=upload_disk
FS="$D/fs"
. "$(dirname "$0")/lib_cli.sh"
# the tmpfs goes before the folder it sits in
trap 'mountpoint -q "$FS" 2>/dev/null && umount -l "$FS"; cleanup' EXIT INT TERM

mkdir -p "$FS" "$D/tr" "$D/w1" "$D/w2"
if ! mount -t tmpfs -o size=160m tmpfs "$FS" 2>"$D/mount.err"; then
    echo "SKIP upload_disk: cannot mount a tmpfs here ($(head -c 200 "$D/mount.err")); nothing was run"
    echo "$SUITE: 0 passed, 0 failed (skipped)"
    exit 0
fi
for v in 1 2; do "$R" weights init --config small --seed "$v" --out "$D/tr/v$v.safetensors" 2>/dev/null; done
for w in w1 w2; do cp "$D/tr/v1.safetensors" "$D/$w/v1.safetensors"; done
"$R" tensor rand --name context --shape 5,256 --seed 2 --out "$D/ctx.safetensors" >/dev/null
# 100 MB of the 160: the 100 MB upload stops about 60 MB in
dd if=/dev/zero of="$FS/filler" bs=1M count=100 2>/dev/null

cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" \
    --weights-dir "$FS" --heartbeat-ms 200 || { bad "broker starts"; show "$D/broker.log"; finish; }
for w in w1 w2; do
    cli_worker "$w" "$D/broker.log" "$D/$w.log" --broker "ipc://$D/w" --weights "$D/$w/v1.safetensors" \
        --weights-dir "$D/$w" --streams 1 --heartbeat-ms 200 || { bad "$w registers"; show "$D/$w.log"; finish; }
done
gen() { # OUT: one gen; prints its stderr's "weights vN"
    "$R" gen --broker "ipc://$D/c" --model small --context "$D/ctx.safetensors" --size 2x8x8 --seed 1 --steps 2 \
        --timeout-ms 60000 --out "$1" 2>"$1.err" && grep -o "weights v[0-9]*" "$1.err" | head -1
}

# ---- the upload does not fit ------------------------------------------------------
t0=$(date +%s)
"$R" sync --broker "ipc://$D/c" --version 2 --upload "$D/tr/v2.safetensors" --timeout-ms 60000 >"$D/sync1.out" 2>&1
rc=$?
t1=$(date +%s)
[ "$rc" = 1 ] && grep -q "No space left on device" "$D/sync1.out" &&
    ok "the trainer hears the full disk (exit 1): $(grep -m1 -o 'cannot write the upload: [^;]*' "$D/sync1.out")" ||
    { bad "sync --upload on a full disk: exit $rc"; show "$D/sync1.out"; }
grep -q "upload transformer v2 stalls at" "$D/broker.log" && ok "the broker logs where the upload stalled" ||
    { bad "stall log"; show "$D/broker.log"; }
# every worker's fetch fails with the reason, not a timeout
for w in w1 w2; do
    wait_for "$D/$w.log" "No space left on device" 60 && ok "$w's sync fails with the broker's reason" ||
        { bad "$w's fetch error"; show "$D/$w.log"; }
done
# the broker's disk, not the request: internal (the FETCHes waiting when it
# filled and those after), never bad_request
if grep -h "No space left on device" "$D/w1.log" "$D/w2.log" | grep -q "the broker answered bad_request" ||
    ! grep -h "No space left on device" "$D/w1.log" "$D/w2.log" | grep -q "the broker answered internal"; then
    bad "a FETCH on the full disk was not answered internal"; grep -h "answered" "$D/w1.log" "$D/w2.log" | show
else ok "every FETCH the full disk failed was answered internal"; fi
"$R" status --broker "ipc://$D/c" >/dev/null 2>&1 && ok "the broker keeps answering STATUS" || bad "status"
[ "$(gen "$D/g1.safetensors")" = "weights v1" ] && ok "a gen still runs on v1: nothing was applied" ||
    { bad "gen after the failed upload"; show "$D/g1.safetensors.err"; }
i=0
while [ "$(/usr/bin/sqlite3 "$D/reel.db" "SELECT state FROM weight_versions WHERE version = 2" 2>/dev/null)" != failed ] &&
    [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(/usr/bin/sqlite3 "$D/reel.db" "SELECT state FROM weight_versions WHERE version = 2")" = failed ] &&
    ok "the catalog records v2 failed" ||
    bad "v2's state: $(/usr/bin/sqlite3 "$D/reel.db" "SELECT state, reason FROM weight_versions WHERE version = 2")"

# ---- room again: the same command resumes and completes -----------------------------
rm -f "$FS/filler"
"$R" sync --broker "ipc://$D/c" --version 2 --upload "$D/tr/v2.safetensors" --timeout-ms 60000 >"$D/sync2.out" 2>&1 &&
    grep -q "applied w1,w2" "$D/sync2.out" && ok "with room again the upload completes and both workers apply v2" ||
    { bad "sync --upload after freeing space"; show "$D/sync2.out"; show "$D/broker.log"; }
grep -q "upload transformer v2 stored" "$D/broker.log" && ok "the broker stored v2" || bad "stored log"
[ "$(gen "$D/g2.safetensors")" = "weights v2" ] && ok "a gen runs on v2" ||
    { bad "gen on v2"; show "$D/g2.safetensors.err"; }
[ -z "$(find "$FS" -name '*.part')" ] && [ -f "$FS/transformer-v2.safetensors" ] &&
    ok "no partial file is left, v2 is stored whole ($(wc -c <"$FS/transformer-v2.safetensors") bytes)" ||
    { bad "files in --weights-dir"; ls -la "$FS"; }
cmp -s "$FS/transformer-v2.safetensors" "$D/tr/v2.safetensors" && ok "byte for byte the trainer's file" ||
    bad "the stored v2 differs from the trainer's"

# ---- the broker dies with an upload half-way (its SYNC already sent) ----------------
# v2 holds 100 MB of the 160: v3 stalls about 60 MB in, its SYNC sent.
"$R" weights init --config small --seed 3 --out "$D/tr/v3.safetensors" 2>/dev/null
"$R" sync --broker "ipc://$D/c" --version 3 --upload "$D/tr/v3.safetensors" --timeout-ms 60000 >"$D/sync3.out" 2>&1
[ -n "$(find "$FS" -name '*.part')" ] && ok "v3 stalled half-way: its partial file is there" ||
    { bad "no partial v3"; ls -la "$FS"; show "$D/sync3.out"; }
kill -9 "$BROKER"
reap "$BROKER" 60
cli_broker "$D/broker2.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" \
    --weights-dir "$FS" --heartbeat-ms 200 || { bad "broker restarts"; show "$D/broker2.log"; finish; }
grep -q "restored transformer v2 from the catalog (uploaded)" "$D/broker2.log" &&
    ok "the restarted broker resumes v2 (uploaded), not the half-uploaded v3" || { bad "restore"; show "$D/broker2.log"; }
grep -q "an upload a previous run did not finish" "$D/broker2.log" && [ -z "$(find "$FS" -name '*.part')" ] &&
    ok "it removes the partial v3 it finds" || { bad "partial v3 at restart"; ls -la "$FS"; }
for w in w1 w2; do
    wait_for "$D/broker2.log" "worker $w ready" 60 || bad "$w reconnects"
done
[ "$(gen "$D/g3.safetensors")" = "weights v2" ] && ok "the workers reconnect and a gen runs on v2" ||
    { bad "gen after the restart"; show "$D/g3.safetensors.err"; }
[ "$(/usr/bin/sqlite3 "$D/reel.db" "SELECT state FROM weight_versions WHERE version = 3")" = failed ] &&
    ok "the catalog records v3 failed" ||
    bad "v3's state: $(/usr/bin/sqlite3 "$D/reel.db" "SELECT state, reason FROM weight_versions WHERE version = 3")"
rm -f "$FS/transformer-v2.safetensors" "$FS/transformer-v2.sha256" # room for v3 (v2 stays loaded in the workers)
"$R" sync --broker "ipc://$D/c" --version 3 --upload "$D/tr/v3.safetensors" --timeout-ms 60000 >"$D/sync4.out" 2>&1 &&
    grep -q "applied w1,w2" "$D/sync4.out" && ok "uploaded again, v3 completes on both workers" ||
    { bad "v3 after the restart"; show "$D/sync4.out"; show "$D/broker2.log"; }

# ---- a spare file takes the room an upload needs ------------------------------------
# A removed version's file is kept as DIR/.spare-N for the next upload to
# write over; one too long for v4 (130 MB > 100 MB + 1/8) is not taken, so
# on this disk v4 runs out of room 30 MB in: the broker removes the spare
# and goes on, and nothing of it shows to the trainer.
stop_proc "$BROKER" || bad "the broker stops on SIGTERM"
rm -f "$FS"/transformer-v*
dd if=/dev/zero of="$FS/.spare-9" bs=1M count=130 2>/dev/null
cli_broker "$D/broker3.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" \
    --weights-dir "$FS" --heartbeat-ms 200 || { bad "broker restarts (spare)"; show "$D/broker3.log"; finish; }
for w in w1 w2; do
    wait_for "$D/broker3.log" "worker $w ready" 60 || bad "$w reconnects (spare)"
done
"$R" weights init --config small --seed 4 --out "$D/tr/v4.safetensors" 2>/dev/null
"$R" sync --broker "ipc://$D/c" --version 4 --upload "$D/tr/v4.safetensors" --timeout-ms 60000 >"$D/sync5.out" 2>&1 &&
    grep -q "applied w1,w2" "$D/sync5.out" && grep -q "removed the spare .*/.spare-9 for room" "$D/broker3.log" &&
    [ ! -e "$FS/.spare-9" ] && cmp -s "$FS/transformer-v4.safetensors" "$D/tr/v4.safetensors" &&
    ok "a full disk with a spare on it: the spare goes, v4 is stored whole and applied on both workers" ||
    { bad "v4 over a spare"; show "$D/sync5.out"; show "$D/broker3.log"; ls -la "$FS"; }
finish
