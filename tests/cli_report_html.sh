#!/bin/sh
# cli_report_html.sh -- `reelctl report --html` (issue 13, part 4): a real
# broker and worker fill a catalog (two capture keys, a weight sync between
# two loads), then:
#   - the report is one self-contained file: no script, no stylesheet or
#     image link, no http(s) URL; its numbers are the catalog's;
#   - headless Chromium (Debian's) loads it without errors: its DOM has the
#     three charts (timeline with the sync marked, per sync, declines) and
#     the tables, and a screenshot is drawn;
#   - a failed sync is not drawn, only listed as not applied;
#   - a hostile key text in the catalog comes out escaped, never as markup;
#   - --since narrows it; one after every row (even 1e300) is an empty
#     report with hit rate "-"; a missing catalog or --html is a usage error.
# Usage: cli_report_html.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-html.XXXXXX)
SUITE=report_html
. "$(dirname "$0")/lib_cli.sh"

"$R" weights init --config tiny --seed 1 --out "$D/v1.safetensors" 2>/dev/null
"$R" weights init --config tiny --seed 2 --out "$D/v2.safetensors" 2>/dev/null
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors" >/dev/null
cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" --heartbeat-ms 200 ||
    { bad "broker starts"; finish; }
cli_worker w1 "$D/broker.log" "$D/w1.log" --broker "ipc://$D/w" --weights "$D/v1.safetensors" --heartbeat-ms 200 \
    --events-ms 50 || { bad "worker registers"; finish; }
load() {
    for s in 2x8x8 2x8x16 2x8x8 2x8x16; do
        "$R" gen --broker "ipc://$D/c" --model tiny --context "$D/ctx.safetensors" --size "$s" --seed 1 --steps 6 \
            --timeout-ms 30000 --quiet --out "$D/g.safetensors" 2>>"$D/gen.err" || bad "gen $s"
    done
}
load
"$R" sync --broker "ipc://$D/c" --version 2 --weights "$D/v2.safetensors" --timeout-ms 30000 2>"$D/sync.err" ||
    bad "sync v2"
load
stop_proc "$WORKER" || bad "the worker stops on SIGTERM"
stop_proc "$BROKER" || bad "the broker stops on SIGTERM"

"$R" report --html "$D/r.html" --catalog "$D/reel.db" 2>"$D/report.err" && [ -s "$D/r.html" ] &&
    ok "reelctl report --html wrote $(wc -c <"$D/r.html") bytes" || { bad "report"; show "$D/report.err"; finish; }
if grep -qiE '<script|<link|<img|<iframe|https?://|src=' "$D/r.html"; then
    bad "the page fetches or runs something: $(grep -oiE '<script|<link|<img|<iframe|https?://[^"]*|src=' "$D/r.html" | head -3)"
else
    ok "self-contained: no script, no link, no URL"
fi
[ "$(grep -c '<svg class="chart"' "$D/r.html")" = 3 ] && grep -q 'class="sync"' "$D/r.html" &&
    grep -q 'transformer v2' "$D/r.html" && ok "three SVG charts, the sync to v2 marked" ||
    bad "charts or the sync marker missing"
grep -q '8 requests, 48 steps' "$D/r.html" && ok "its totals are the catalog's (8 requests, 48 steps)" ||
    { bad "totals: $(grep -o '<p class="sum">[^<]*' "$D/r.html")"; }

# headless Chromium: loads, the charts are in its DOM, a screenshot is drawn
CH=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CH" ]; then
    bad "chromium is not installed (deploy/install-deps.sh installs Debian's)"
else
    CHROME="timeout 60 $CH --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
        --user-data-dir=$D/chrome --enable-logging=stderr --v=0"
    $CHROME --dump-dom "file://$D/r.html" >"$D/dom.html" 2>"$D/chrome.err"
    rc=$?
    n=$(grep -o '<svg class="chart" id="[a-z-]*"' "$D/dom.html" | sort -u | wc -l)
    [ $rc = 0 ] && [ "$n" = 3 ] && grep -q '<table>' "$D/dom.html" &&
        ok "Chromium loads the page: its DOM holds the 3 charts and the tables" ||
        { bad "Chromium DOM (exit $rc, $n charts)"; show "$D/chrome.err"; }
    if grep -E 'CONSOLE|Uncaught|Failed to load|ERR_' "$D/chrome.err" | grep -v -E 'dbus|gpu|GPU|sandbox' >"$D/errs.txt" &&
        [ -s "$D/errs.txt" ]; then
        bad "the page logged errors in Chromium"; show "$D/errs.txt"
    else
        ok "no page errors in Chromium's log"
    fi
    $CHROME --screenshot="$D/r.png" --window-size=1000,2200 "file://$D/r.html" >/dev/null 2>&1
    [ -s "$D/r.png" ] && [ "$(wc -c <"$D/r.png")" -gt 20000 ] &&
        ok "Chromium draws it ($(wc -c <"$D/r.png") bytes of PNG)" || bad "screenshot"
fi

# a sync no worker applied is no sync: not drawn, listed as not applied
cp "$D/reel.db" "$D/failed.db"
/usr/bin/sqlite3 "$D/failed.db" "INSERT INTO weight_versions (component, version, sha256, t, state, reason)
    SELECT 'transformer', 3, 'cc', t + 0.5, 'failed', 'no worker applied it' FROM weight_versions WHERE version = 2"
"$R" report --html "$D/failed.html" --catalog "$D/failed.db" 2>/dev/null
[ "$(grep -c '<line class="sync"' "$D/failed.html")" = "$(grep -c '<line class="sync"' "$D/r.html")" ] &&
    ! grep -q 'transformer v3</text>' "$D/failed.html" &&
    grep -q 'Syncs not applied (not drawn): transformer v3 at [^,]*, failed (no worker applied it)' "$D/failed.html" &&
    ok "a failed sync is not drawn as a sync; it is listed as failed" ||
    bad "a failed sync: $(grep -o 'transformer v3[^<]*' "$D/failed.html" | head -3)"
# --json: the data the page draws, on stdout
"$R" report --json --catalog "$D/failed.db" >"$D/failed.json" 2>"$D/json.err" &&
    /usr/bin/python3 - "$D/failed.json" <<'PYEOF' && ok "report --json: the page's data (source, totals, the failed v3 in unapplied_syncs)" ||
import json, sys
r = json.load(open(sys.argv[1]))
steps = sum(b["steps"] for b in r["timeline"])
un = [(s["version"], s["state"]) for s in r["unapplied_syncs"]]
sys.exit(0 if r.get("source") and steps == 48 and (3, "failed") in un and r["syncs"] else 1)
PYEOF
    { bad "report --json"; show "$D/json.err"; head -c 600 "$D/failed.json" | show; }
"$R" report --catalog "$D/failed.db" >/dev/null 2>"$D/neither.err"
[ $? = 2 ] && grep -q "report needs --html OUT.html or --json" "$D/neither.err" &&
    ok "report without --html or --json: exit 2, naming both" || { bad "report without an output"; show "$D/neither.err"; }

# a hostile key text from the network stays text
cp "$D/reel.db" "$D/evil.db"
/usr/bin/sqlite3 "$D/evil.db" "UPDATE captures SET key_text = '<script>alert(1)</script><img src=x>' WHERE rowid = (SELECT min(rowid) FROM captures);
    UPDATE key_texts SET key_text = '<script>alert(1)</script><img src=x>' WHERE key_hash = (SELECT min(key_hash) FROM key_texts)"
"$R" report --html "$D/evil.html" --catalog "$D/evil.db" 2>/dev/null
! grep -q '<script>alert' "$D/evil.html" && grep -q '&lt;script&gt;alert(1)&lt;/script&gt;' "$D/evil.html" &&
    ok "a hostile key text is escaped, never markup" || bad "a key text was not escaped"

"$R" report --html "$D/late.html" --catalog "$D/reel.db" --since "$(($(date +%s) + 3600))" 2>/dev/null &&
    grep -q '0 requests, 0 steps, 0 replayed: graph hit rate <b>-</b>' "$D/late.html" &&
    ok "--since after every row: an empty report (hit rate -), not an error" ||
    bad "--since in the future: $(grep -o '<p class="sum">[^<]*<b>[^<]*' "$D/late.html")"
# -N is the last N seconds, -0 too (it read as the UNIX time -0.0: every row)
"$R" report --json --catalog "$D/reel.db" --since -0 >"$D/minus0.json" 2>/dev/null &&
    /usr/bin/python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); sys.exit(0 if r["requests"] == 0 and r["since"] > 1e9 else 1)' "$D/minus0.json" &&
    ok "--since -0: the last 0 seconds, an empty report" || bad "--since -0: $(head -c 200 "$D/minus0.json")"
# past any minute the summaries hold (1e300, or 9e15 and up): still after every row
cp "$D/reel.db" "$D/pruned.db"
/usr/bin/sqlite3 "$D/pruned.db" "DELETE FROM requests" # the report reads the summaries
for s in 1e300 9e15; do
    "$R" report --html "$D/far.html" --catalog "$D/pruned.db" --since $s 2>/dev/null &&
        grep -q '0 requests, 0 steps, 0 replayed: graph hit rate <b>-</b>. From the hour of the start on: 0 captures, 0 evictions' \
            "$D/far.html" && ok "--since $s from the summaries: an empty report" ||
        bad "--since $s: $(grep -o '<p class="sum">[^<]*<b>[^<]*</b>[^<]*' "$D/far.html")"
done
"$R" report --html "$D/x.html" --catalog "$D/nope.db" 2>/dev/null
[ $? = 2 ] && ok "a missing catalog is a usage error (exit 2)" || bad "missing catalog"
# a path that cannot be a catalog is the user's to fix too, for every
# command that reads one, and says what it is
mkdir -p "$D/adir"
printf 'not a database, but long enough' >"$D/junk.db"
for c in "report --html $D/y.html" "report --json" stats keys evictions versions workers requests "why 1"; do
    for p in "$D/adir" "$D/junk.db"; do
        # shellcheck disable=SC2086 # $c is a command and its flags
        "$R" $c --catalog "$p" >/dev/null 2>"$D/badcat.err"
        rc=$?
        if [ "$rc" = 2 ] && grep -qE "not a regular file|not a SQLite database" "$D/badcat.err"; then :; else
            bad "reelctl $c --catalog $(basename "$p"): exit $rc, $(head -c 200 "$D/badcat.err")"
            badcat=1
        fi
    done
done
[ -z "${badcat:-}" ] && ok "a folder or a non-SQLite file as --catalog: exit 2 with what it is, for report, stats, keys, evictions, versions, workers, requests, why"
"$R" report --catalog "$D/reel.db" 2>/dev/null
[ $? = 2 ] && ok "no --html is a usage error (exit 2)" || bad "missing --html"
# an output that cannot be written says which and why (it named only OUT.tmp)
"$R" report --html "$D/nodir/r.html" --catalog "$D/reel.db" 2>"$D/nodir.err"
[ $? = 1 ] && grep -q "report: cannot write $D/nodir/r.html (.*No such file or directory)" "$D/nodir.err" &&
    ok "--html into a missing folder: exit 1, naming the file and the reason" || { bad "--html into a missing folder"; show "$D/nodir.err"; }
finish
