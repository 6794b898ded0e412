#!/bin/sh
# cli_gen_prompts.sh -- `reelctl gen --prompts FILE --out-dir DIR` through
# real processes: a broker and a CPU worker with the tiny text encoder and
# VAE of tests/cli_prompt.sh. One request a line (plain prompts, a JSON
# line with its own seed and negative prompt, blank lines skipped, a CRLF
# line), one round on one connection: each output is bitwise what one
# `reelctl gen --prompt` of that line (and `reelctl run --prompt`) gives,
# named by its line; videos as NNNN.mp4; lines that fail are said with
# their line number and the exit status is 1; an output that cannot be
# written ends the round; --skip-existing runs only the lines whose output
# is not there yet; a bad file is refused with
# exit 2 before anything is sent (the broker's request counters do not
# move, no folder is made); SIGINT cancels the round (exit 130). Every
# wait is bounded; every process is killed on exit.
# Usage: cli_gen_prompts.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-genprompts.XXXXXX)
SUITE=gen_prompts
HERE=$(dirname "$0")
. "$HERE/lib_cli.sh"
PY=/usr/bin/python3
CE="ipc://$D/c"
WE="ipc://$D/w"

# The parts, as cli_prompt.sh makes them (lib_cli.sh): a DiT with
# text_len, umT5 (t5-tiny), its tokenizer, a VAE.
t2v_parts "$D" || finish
PARTS="--t5 $D/t5.safetensors --tokenizer $D/spiece.model --vae $D/vae.safetensors"

cli_broker "$D/broker.log" --clients "$CE" --workers "$WE" --catalog "$D/reel.db" --heartbeat-ms 200 || { bad "broker"; finish; }
# shellcheck disable=SC2086 # PARTS: words, paths without spaces
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "$WE" --weights "$D/dit.safetensors" $PARTS --heartbeat-ms 200 ||
    { bad "the worker starts"; finish; }

# The requests the broker has answered (ok + failed): a refused file must not move it.
answered() {
    "$R" status --broker "$CE" --json 2>/dev/null |
        $PY -c 'import json,sys; s=json.load(sys.stdin); print(s["requests_ok"] + s["requests_failed"])'
}

COMMON="--broker $CE --model tinyt --channels 4 --size 2x8x8 --steps 3 --shift 3 --cfg 4 --timeout-ms 60000 --quiet"

echo "== a round: one request a line, each output bitwise one gen --prompt of its line"
# line 1 plain, line 2 blank (no request), line 3 CRLF, line 4 JSON (its
# own seed and negative prompt), line 5 plain: --seed 5 gives line N the
# seed 5 + N - 1 (1: 5, 3: 7, 5: 9), line 4 its own 42
printf 'a cat on a skateboard\n  \na red car at night\r\n{"prompt": "a bird over the sea", "seed": 42, "negative_prompt": "blurry"}\nthe moon and a tree\n' \
    >"$D/p.txt"
# shellcheck disable=SC2086 # COMMON: words
"$R" gen $COMMON --seed 5 --window 2 --prompts "$D/p.txt" --out-dir "$D/out" 2>"$D/many.err"
rc=$?
[ $rc = 0 ] && [ "$(ls "$D/out" | tr '\n' ' ')" = "0001.safetensors 0003.safetensors 0004.safetensors 0005.safetensors " ] &&
    grep -q "^reelctl: gen --prompts $D/p.txt: 4 requests: 4 written to $D/out$" "$D/many.err" &&
    ok "gen --prompts: exit 0, one output a line named by its line (the blank line none), the summary says 4 of 4" ||
    { bad "gen --prompts (exit $rc)"; ls "$D/out"; show "$D/many.err"; }
grep -c "^reelctl: gen tinyt via .* -> $D/out/000[1345].safetensors$" "$D/many.err" | grep -qx 4 &&
    ok "each output is said as it is written, as one gen says its --out" || { bad "per-line lines"; show "$D/many.err"; }
same=0
for spec in "1|5|a cat on a skateboard|" "3|7|a red car at night|" "4|42|a bird over the sea|blurry" "5|9|the moon and a tree|"; do
    l=${spec%%|*}; rest=${spec#*|}; s=${rest%%|*}; rest=${rest#*|}; p=${rest%%|*}; n=${rest#*|}
    # shellcheck disable=SC2086
    if [ -n "$n" ]; then "$R" gen $COMMON --seed "$s" --prompt "$p" --negative-prompt "$n" --out "$D/one.$l.safetensors" 2>"$D/one.$l.err"
    else "$R" gen $COMMON --seed "$s" --prompt "$p" --out "$D/one.$l.safetensors" 2>"$D/one.$l.err"; fi
    "$R" tensor diff "$D/out/000$l.safetensors" "$D/one.$l.safetensors" --name latent >/dev/null 2>&1 && same=$((same + 1)) ||
        { echo "  line $l differs from its single gen"; show "$D/one.$l.err"; }
done
[ $same = 4 ] && ok "each line's latent is bitwise one gen --prompt of it (its seed: --seed + line - 1, or its JSON seed; its negative prompt)" ||
    bad "$same of 4 lines bitwise their single gen"
"$R" run --weights "$D/dit.safetensors" $PARTS --prompt "a red car at night" --seed 7 --size 2x8x8 --steps 3 --shift 3 \
    --cfg 4 --out "$D/run3.safetensors" 2>"$D/run3.err" &&
    "$R" tensor diff "$D/out/0003.safetensors" "$D/run3.safetensors" --name latent >/dev/null 2>&1 &&
    ok "line 3 (a CRLF line) is bitwise reelctl run --prompt with seed 7: its CR is no part of the prompt" ||
    { bad "line 3 vs reelctl run"; show "$D/run3.err"; }

echo "== a UTF-8 byte order mark at the start (Windows editors write one) is no part of line 1"
# a JSON first line behind a BOM was read as a plain prompt: its JSON text
# sent as the prompt, with --seed's seed and no negative prompt
printf '\357\273\277{"prompt": "a bird over the sea", "seed": 42, "negative_prompt": "blurry"}\nthe moon and a tree\n' \
    >"$D/bom.txt"
# shellcheck disable=SC2086 # COMMON: words
"$R" gen $COMMON --seed 8 --prompts "$D/bom.txt" --out-dir "$D/bout" 2>"$D/bom.err" &&
    "$R" tensor diff "$D/bout/0001.safetensors" "$D/out/0004.safetensors" --name latent >/dev/null 2>&1 &&
    "$R" tensor diff "$D/bout/0002.safetensors" "$D/out/0005.safetensors" --name latent >/dev/null 2>&1 &&
    ok "a file with a BOM: its JSON line 1 read as JSON (its seed and negative prompt), each line bitwise the same line without it" ||
    { bad "a file that starts with a BOM"; show "$D/bom.err"; }

echo "== videos: NNNN.mp4, the latent beside it"
printf 'a cat on a skateboard\nthe moon and a tree\n' >"$D/v.txt"
# shellcheck disable=SC2086
"$R" gen $COMMON --seed 5 --output video --prompts "$D/v.txt" --out-dir "$D/vout" 2>"$D/v.err" &&
    "$R" video probe "$D/vout/0002.mp4" --json 2>/dev/null | grep -q '"frames":5,"height":64,"width":64' &&
    "$R" tensor diff "$D/vout/0001.mp4.safetensors" "$D/out/0001.safetensors" --name latent >/dev/null 2>&1 &&
    ok "gen --prompts --output video: DIR/0002.mp4 of 5 frames, DIR/0001.mp4.safetensors bitwise the latent round's line 1" ||
    { bad "videos"; ls "$D/vout"; show "$D/v.err"; }

echo "== lines that fail: each said with its line number, exit 1"
# no worker serves model nope: the broker answers each prompt no_worker
"$R" gen --broker "$CE" --model nope --channels 4 --size 2x8x8 --steps 3 --cfg 4 --quiet \
    --prompts "$D/v.txt" --out-dir "$D/fout" 2>"$D/f.err"
rc=$?
[ $rc = 1 ] && grep -q "^reelctl: gen: line 1: no_worker: no live worker announces model nope" "$D/f.err" &&
    grep -q "^reelctl: gen: line 2: no_worker: " "$D/f.err" &&
    grep -q "^reelctl: gen --prompts $D/v.txt: 2 requests: 0 written to $D/fout, 2 failed (lines 1, 2)$" "$D/f.err" &&
    [ -z "$(ls "$D/fout")" ] &&
    ok "lines the cluster fails: each said with its line and the broker's reason, the summary lists them, exit 1" ||
    { bad "failed lines (exit $rc)"; show "$D/f.err"; }

echo "== an output that cannot be written (a full disk) ends the round"
# ulimit -f: every output is past the size a file may have (EFBIG, as a
# full disk's ENOSPC); each line after the first ran on the cluster only to
# fail the same way, to the end of the file
printf 'one\ntwo\nthree\nfour\n' >"$D/full4.txt"
# shellcheck disable=SC2086 # COMMON: words
(ulimit -f 1; trap '' XFSZ; exec "$R" gen $COMMON --window 1 --prompts "$D/full4.txt" --out-dir "$D/full") 2>"$D/full.err"
rc=$?
[ $rc = 1 ] && grep -q "^reelctl: gen: line 1: .*File too large" "$D/full.err" &&
    grep -q "0 written to $D/full, 1 failed (line 1), 3 not run (cancelled or never sent: lines 2, 3, 4)$" "$D/full.err" &&
    grep -q "^reelctl: gen: stopped: line 1's output could not be written" "$D/full.err" &&
    ok "line 1's output not written: said, the round stopped there (lines 2-4 not run), exit 1" ||
    { bad "an output that cannot be written (exit $rc)"; show "$D/full.err"; }

echo "== --skip-existing: a round cut short, run again, runs only the lines without their output"
# the full disk's round left no file that counts as done: all 4 lines run
# shellcheck disable=SC2086 # COMMON: words
"$R" gen $COMMON --window 1 --skip-existing --prompts "$D/full4.txt" --out-dir "$D/full" 2>"$D/full2.err" &&
    grep -q "^reelctl: gen --prompts $D/full4.txt: 4 requests: 4 written to $D/full$" "$D/full2.err" &&
    ok "after the full disk: --skip-existing runs all 4 lines (the failed write left nothing taken for done)" ||
    { bad "--skip-existing after the full disk"; ls -a "$D/full"; show "$D/full2.err"; }
# line 3's output gone (the round of p.txt above wrote lines 1, 3, 4, 5):
# only line 3 is sent (the broker answers one more request), its output
# bitwise what it was, the others not rewritten (same inode)
rm -f "$D/out/0003.safetensors"
ino1=$(stat -c %i "$D/out/0001.safetensors")
before=$(answered)
# shellcheck disable=SC2086 # COMMON: words
"$R" gen $COMMON --seed 5 --window 2 --skip-existing --prompts "$D/p.txt" --out-dir "$D/out" 2>"$D/skip.err"
rc=$?
after=$(answered)
[ $rc = 0 ] && grep -q "^reelctl: gen --prompts $D/p.txt: 4 requests: 1 written to $D/out, 3 skipped (their outputs were there: --skip-existing)$" "$D/skip.err" &&
    [ $((after - before)) = 1 ] && [ "$(stat -c %i "$D/out/0001.safetensors")" = "$ino1" ] &&
    "$R" tensor diff "$D/out/0003.safetensors" "$D/one.3.safetensors" --name latent >/dev/null 2>&1 &&
    ok "--skip-existing: only line 3 sent (1 request answered), bitwise its single gen; lines 1, 4, 5 untouched; exit 0" ||
    { bad "--skip-existing (exit $rc, answered $before -> $after)"; show "$D/skip.err"; }
before=$(answered)
# shellcheck disable=SC2086 # COMMON: words
"$R" gen $COMMON --seed 5 --skip-existing --prompts "$D/p.txt" --out-dir "$D/out" 2>"$D/skip2.err"
rc=$?
[ $rc = 0 ] && grep -q "4 requests: every output is in $D/out already (--skip-existing): nothing to run" "$D/skip2.err" &&
    [ "$(answered)" = "$before" ] && ok "--skip-existing with every output there: nothing sent, exit 0" ||
    { bad "--skip-existing, all there (exit $rc)"; show "$D/skip2.err"; }
# a video's line is done by its latent, written after the .mp4
rm -f "$D/vout/0002.mp4.safetensors"
# shellcheck disable=SC2086
"$R" gen $COMMON --seed 5 --output video --skip-existing --prompts "$D/v.txt" --out-dir "$D/vout" 2>"$D/vskip.err" &&
    grep -q "2 requests: 1 written to $D/vout, 1 skipped" "$D/vskip.err" && [ -s "$D/vout/0002.mp4.safetensors" ] &&
    ok "--skip-existing --output video: a line whose .mp4 is there but not its latent runs again" ||
    { bad "--skip-existing with videos"; show "$D/vskip.err"; }
"$R" gen $COMMON --prompt x --skip-existing --out "$D/x.safetensors" 2>"$D/bad.err"
[ $? = 2 ] && grep -q -- "--skip-existing goes with --prompts FILE" "$D/bad.err" && ok "--skip-existing without --prompts: exit 2" ||
    { bad "--skip-existing alone"; show "$D/bad.err"; }

echo "== a bad file is refused before anything is sent (exit 2)"
before=$(answered)
long=$(head -c 4097 /dev/zero | tr '\0' a)
printf 'a fine prompt\n%s\n' "$long" >"$D/long.txt"
printf 'a fine prompt\nbad \377\376 bytes\n' >"$D/utf8.txt"
printf 'a fine prompt\nbad \001 control\n' >"$D/ctl.txt"
printf 'a fine prompt\ran old Mac file\r' >"$D/cr.txt"
printf '{"prompt": "x", "sed": 1}\n' >"$D/key.txt"
printf '{"prompt": "x", \n' >"$D/json.txt"
printf '{"prompt": "x", "negative_prompt": "blurry"}\n' >"$D/neg.txt"
printf '\n  \n' >"$D/blank.txt"
printf '\377\376a\000 \000c\000a\000t\000\n\000' >"$D/utf16.txt"
: >"$D/empty.txt"
bad_case() { # FILE PATTERN WHAT [extra args]
    _f=$1; _p=$2; _w=$3; shift 3
    # shellcheck disable=SC2086
    "$R" gen $COMMON --prompts "$_f" --out-dir "$D/never" "$@" 2>"$D/bad.err"
    _rc=$?
    if [ $_rc = 2 ] && grep -q -- "$_p" "$D/bad.err" && [ ! -e "$D/never" ]; then ok "$_w: exit 2, said, no folder made"
    else bad "$_w (exit $_rc)"; show "$D/bad.err"; fi
}
bad_case "$D/missing.txt" "missing.txt: No such file" "a missing file"
bad_case "$D/empty.txt" "no request in it" "an empty file"
bad_case "$D/blank.txt" "no request in it" "a file of blank lines"
bad_case "$D/long.txt" "long.txt line 2: the prompt is 4097 bytes: at most 4096" "a prompt of 4097 bytes on line 2"
bad_case "$D/utf8.txt" "utf8.txt line 2: the prompt is not UTF-8 text" "a line that is not UTF-8"
bad_case "$D/ctl.txt" "ctl.txt line 2: the prompt is not UTF-8 text or holds a control character" "a line with a control character"
bad_case "$D/utf16.txt" "utf16.txt: UTF-16 text (its byte order mark says so): save it as UTF-8" "a UTF-16 file (Windows' \"Unicode\")"
bad_case "$D/cr.txt" "cr.txt line 1: a CR inside the line" "a file of CR line ends (one line with a CR inside)"
bad_case "$D/key.txt" "key.txt line 1: unknown key \"sed\"" "a JSON line with an unknown key"
bad_case "$D/json.txt" "json.txt line 1: starts with '{' but is not JSON" "a line that starts as JSON and is not"
bad_case "$D/neg.txt" "neg.txt line 1: negative_prompt is used only with guidance" "a JSON negative prompt with --cfg 1" --cfg 1
bad_case "$D/p.txt" "replaces --prompt" "--prompts with --prompt" --prompt x
"$R" gen $COMMON --prompts "$D/p.txt" --out "$D/x.safetensors" 2>"$D/bad.err"
[ $? = 2 ] && grep -q "into --out-dir DIR, not --out" "$D/bad.err" && ok "--prompts with --out: exit 2, naming --out-dir" ||
    { bad "--prompts with --out"; show "$D/bad.err"; }
"$R" gen $COMMON --prompt x --out-dir "$D/never" --out "$D/x.safetensors" 2>"$D/bad.err"
[ $? = 2 ] && grep -q -- "--out-dir goes with --prompts FILE" "$D/bad.err" && ok "--out-dir without --prompts: exit 2" ||
    { bad "--out-dir alone"; show "$D/bad.err"; }
after=$(answered)
[ -n "$before" ] && [ "$before" = "$after" ] && ok "the broker answered no request for any of them ($before before, $after after)" ||
    bad "requests answered moved from '$before' to '$after'"

echo "== a file of 100000 lines (the most): what the command holds for them is small"
# Each line held PATH_MAX (4 KiB) for its output's name: 563 MB at 100000
# lines before a GEN went. A broker endpoint that cannot be: the command
# ends once every line is read and prepared (exit 2), nothing sent.
$PY -c 'import sys
with open(sys.argv[1], "w") as f:
    f.writelines("a cat number %d\n" % i for i in range(100000))' "$D/100k.txt"
# shellcheck disable=SC2086 # COMMON: words
got=$($PY - "$R" gen $COMMON --broker bogus://nowhere --prompts "$D/100k.txt" --out-dir "$D/big" <<'EOF'
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stderr=subprocess.DEVNULL).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
EOF
)
[ "${got%% *}" = 2 ] && [ "${got#* }" -lt 300 ] &&
    ok "100000 lines read and prepared in ${got#* } MB (under 300)" || bad "100000 lines: exit and MB: $got"

echo "== SIGINT cancels the round"
# long GENs (10000 steps of 2x16x16, seconds each): still running at the SIGINT
printf 'one\ntwo\nthree\nfour\n' >"$D/long4.txt"
# shellcheck disable=SC2086
"$R" gen --broker "$CE" --model tinyt --channels 4 --size 2x16x16 --steps 10000 --cfg 4 --timeout-ms 600000 --quiet \
    --window 2 --prompts "$D/long4.txt" --out-dir "$D/iout" 2>"$D/i.err" &
gp=$!
PIDS="$PIDS $gp"
if long_running "$CE" 1 60; then
    kill -INT "$gp"
    reap "$gp" 30
    rc=$?
    [ $rc = 130 ] && grep -q "interrupted; the GENs in flight were cancelled" "$D/i.err" &&
        grep -q "0 written to $D/iout, 4 not run (cancelled or never sent: lines 1, 2, 3, 4)" "$D/i.err" &&
        wait_count "$D/broker.log" "cancelled by its client" 2 30 &&
        ok "SIGINT: exit 130, the 2 GENs in flight cancelled at the broker, the 4 lines listed as not run" ||
        { bad "SIGINT (exit $rc)"; show "$D/i.err"; }
else
    bad "the long round never ran"; show "$D/i.err"
fi
finish
