#!/bin/sh
# cli_metrics.sh -- live metrics and health (issue 13, part 1): a real
# reel-broker and two reel-workers with --metrics on loopback (port 0: the
# kernel picks, the log says which), scraped by a real Prometheus server
# (Debian's, started here on loopback with a generated config, bounded in
# time), and checked through its HTTP query API against what was sent:
#   - every endpoint's /metrics passes `promtool check metrics`;
#   - Prometheus sees all three targets up, the broker's ok requests equal
#     the gens sent, the workers' captures + replays + eager steps equal the
#     steps those gens ran, one complete sync, the new weight version on
#     both workers, and no capture-key or request-id label anywhere;
#   - `reelctl top` prints plain views when piped and redraws in place on
#     a terminal (script(1)); STATUS counts the requests and their steps;
#   - /healthz and /readyz answer 200; a worker whose broker is gone turns
#     /readyz to 503 (with the reason) but stays /healthz 200; an unknown
#     path is 404, a POST 405; a bad or taken --metrics address stops the
#     daemon at startup with a clear error (exit 2 / 1).
# Usage: cli_metrics.sh BUILD
set -u
B="${1:-build}"
R="$B/reelctl"
D=$(mktemp -d /tmp/reel-metrics.XXXXXX)
SUITE=metrics
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    bad "prometheus and promtool are not installed (deploy/install-deps.sh installs Debian's)"
    finish
fi

"$R" weights init --config tiny --seed 1 --out "$D/v1.safetensors" 2>/dev/null
"$R" weights init --config tiny --seed 2 --out "$D/v2.safetensors" 2>/dev/null
"$R" tensor rand --name context --shape 5,32 --seed 2 --out "$D/ctx.safetensors" >/dev/null

port_of() { sed -n 's/.*metrics and health on http:\/\/[^ ]* (port \([0-9]*\)).*/\1/p' "$1" | head -1; }
get() { # URL -> "CODE BODY" (python: no curl needed)
    $PY - "$@" <<'EOF'
import sys, urllib.request, urllib.error
method = sys.argv[2] if len(sys.argv) > 2 else "GET"
try:
    r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], method=method, data=b"x" if method == "POST" else None), timeout=5)
    print(r.status, r.read().decode().strip().replace("\n", " | ")[:300])
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip()[:300])
except Exception as e:
    print("000", e)
EOF
}

cli_broker "$D/broker.log" --clients "ipc://$D/c" --workers "ipc://$D/w" --catalog "$D/reel.db" \
    --heartbeat-ms 200 --metrics 127.0.0.1:0 || { bad "broker starts"; show "$D/broker.log"; finish; }
for w in w1 w2; do
    cli_worker "$w" "$D/broker.log" "$D/$w.log" --broker "ipc://$D/w" --weights "$D/v1.safetensors" \
        --heartbeat-ms 200 --metrics 127.0.0.1:0 || { bad "$w registers"; show "$D/$w.log"; finish; }
done
BP=$(port_of "$D/broker.log"); P1=$(port_of "$D/w1.log"); P2=$(port_of "$D/w2.log")
[ -n "$BP" ] && [ -n "$P1" ] && [ -n "$P2" ] && ok "each daemon says where it serves (ports $BP, $P1, $P2)" ||
    { bad "metrics ports"; show "$D/broker.log"; finish; }

# a second broker on the live one's ipc paths refuses to start (ZeroMQ would
# unlink and take them over, splitting the cluster), before it touches the
# catalog (a pending sync of the first stays pending) or the uploads (a
# partial upload stays), and the first serves on
mkdir -p "$D/wd"
# second V LOG ARGS...: a pending sync V in the catalog and its partial
# upload, then a second reel-broker ARGS (output LOG); sets rc (its exit)
# and st (V's state after it), and removes V's row
second() {
    _v=$1 _log=$2
    shift 2
    /usr/bin/sqlite3 "$D/reel.db" "INSERT INTO weight_versions (component, version, sha256, source, t, state)
        VALUES ('transformer', $_v, 'ee', '/w/x', 1, 'pending')"
    : >"$D/wd/.transformer-v$_v.part"
    timeout 20 "$B/reel-broker" "$@" --catalog "$D/reel.db" --weights-dir "$D/wd" >"$_log" 2>&1
    rc=$?
    st=$(/usr/bin/sqlite3 "$D/reel.db" "select state from weight_versions where version = $_v")
    /usr/bin/sqlite3 "$D/reel.db" "DELETE FROM weight_versions WHERE version = $_v"
}
second 999999 "$D/second.log" --clients "ipc://$D/c" --workers "ipc://$D/w"
[ $rc != 0 ] && [ $rc != 124 ] && grep -q "another process is listening on it" "$D/second.log" &&
    [ "$st" = pending ] && [ -e "$D/wd/.transformer-v999999.part" ] &&
    "$R" status --broker "ipc://$D/c" 2>/dev/null | grep -q "^w1 " &&
    ok "a second broker on the same ipc endpoints refuses to start (exit $rc), the catalog and uploads untouched; the first still serves w1" ||
    { bad "second broker on the same ipc paths (exit $rc, the pending row: $st)"; show "$D/second.log"; }
# the same on tcp, where the bind fails (EADDRINUSE): the broker's own
# metrics port is a live tcp listener to clash with
second 999998 "$D/second-tcp.log" --clients "tcp://127.0.0.1:$BP" --workers "ipc://$D/w-tcp"
[ $rc != 0 ] && [ $rc != 124 ] && grep -q "127.0.0.1:$BP" "$D/second-tcp.log" &&
    [ "$st" = pending ] && [ -e "$D/wd/.transformer-v999998.part" ] &&
    ok "a second broker on a tcp port in use stops (exit $rc) before the catalog and uploads" ||
    { bad "second broker on a tcp port in use (exit $rc, the pending row: $st)"; show "$D/second-tcp.log"; }

# Prometheus, scraping all three every second
PP=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$D/prom.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: reel
    static_configs:
      - targets: ['127.0.0.1:$BP', '127.0.0.1:$P1', '127.0.0.1:$P2']
EOF
promtool check config "$D/prom.yml" >/dev/null 2>&1 && ok "the generated Prometheus config is valid" || bad "promtool check config"
timeout 120 prometheus --config.file="$D/prom.yml" --storage.tsdb.path="$D/tsdb" \
    --web.listen-address="127.0.0.1:$PP" >"$D/prom.log" 2>&1 &
PROM=$!
PIDS="$PIDS $PROM"

# traffic: gens, and a sync by path
N=6
i=0
while [ $i -lt $N ]; do
    "$R" gen --broker "ipc://$D/c" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --seed $((i % 2)) \
        --steps 4 --timeout-ms 30000 --quiet --out "$D/g$i.safetensors" 2>>"$D/gen.err" || bad "gen $i"
    i=$((i + 1))
done
"$R" sync --broker "ipc://$D/c" --version 2 --weights "$D/v2.safetensors" --timeout-ms 30000 2>"$D/sync.err" &&
    ok "sync v2 complete" || { bad "sync v2"; show "$D/sync.err"; }

for p in "$BP" "$P1" "$P2"; do
    get "http://127.0.0.1:$p/metrics" >/dev/null
    $PY -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$p/metrics', timeout=5).read().decode())" \
        >"$D/m$p.txt" 2>/dev/null
    if promtool check metrics <"$D/m$p.txt" >"$D/promtool$p.txt" 2>&1; then
        ok "promtool check metrics passes on :$p ($(grep -vc '^#' "$D/m$p.txt") samples)"
    else
        bad "promtool check metrics on :$p"; show "$D/promtool$p.txt"
    fi
done
# `reelctl metrics --broker` (from STATUS, with the catalog's counters):
# valid text, and the same label set as the live /metrics for a name both have.
"$R" metrics --broker "ipc://$D/c" --catalog "$D/reel.db" >"$D/mctl.txt" 2>&1
if promtool check metrics <"$D/mctl.txt" >"$D/promtool-ctl.txt" 2>&1; then
    ok "promtool check metrics passes on reelctl metrics --broker ($(grep -vc '^#' "$D/mctl.txt") samples)"
else
    bad "promtool check metrics on reelctl metrics --broker"; show "$D/promtool-ctl.txt"
fi
grep -q '^reel_broker_workers{state="routable"} 2$' "$D/mctl.txt" && grep -q '^reel_broker_workers{state="routable"} 2$' "$D/m$BP.txt" &&
    ok "reel_broker_workers{state=...} in both, 2 routable" ||
    { bad "reel_broker_workers label sets"; grep reel_broker_workers "$D/mctl.txt" "$D/m$BP.txt" | head -6; }
same=$($PY - "$D/mctl.txt" "$D/m$BP.txt" <<'EOF'
import re, sys
def families(path):
    f = {}
    for line in open(path):
        m = re.match(r'^([a-z_:]+)(\{[^}]*\})? ', line)
        if m:
            keys = tuple(sorted(re.findall(r'([a-z_]+)="', m.group(2) or "")))
            f.setdefault(m.group(1), set()).add(keys)
    return f
a, b = families(sys.argv[1]), families(sys.argv[2])
both = sorted(set(a) & set(b))
diff = [n for n in both if a[n] != b[n]]
print("%d %s" % (len(both), " ".join(diff) or "-"))
EOF
)
[ "${same#* }" = "-" ] && [ "${same%% *}" -ge 4 ] && ok "the ${same%% *} names both sources print have the same label sets" ||
    bad "label sets differ between reelctl metrics --broker and /metrics: $same"
grep -q '^reel_worker_attention_info{path="fused",mode="auto",reason="the CPU.s attention kernel: direct up to 64 keys and head width, else whole rows below 2^20 scores per head, flash-style blocks from there on"} 1$' "$D/m$P1.txt" &&
    ok "a CPU worker exports its attention path, mode and why" ||
    { bad "reel_worker_attention_info"; grep attention "$D/m$P1.txt" | head -3; }
grep -q '^reel_worker_attention_fallbacks_total 0$' "$D/m$P1.txt" &&
    ok "a CPU worker counts no fused-attention fallbacks" ||
    { bad "reel_worker_attention_fallbacks_total"; grep fallbacks "$D/m$P1.txt" | head -3; }
if grep -qiE '(key|key_hash|request|id)="' "$D/m$BP.txt" "$D/m$P1.txt" "$D/m$P2.txt"; then
    bad "a capture-key or request-id label"; grep -iE '(key|key_hash|request|id)="' "$D"/m*.txt | head -3
else
    ok "no capture-key or request-id labels"
fi

# what Prometheus scraped, through its query API (retried while it catches up)
$PY - "$PP" "$N" >"$D/query.out" 2>&1 <<'EOF'
import json, sys, time, urllib.parse, urllib.request
port, n = sys.argv[1], int(sys.argv[2])
def q(expr):
    u = "http://127.0.0.1:%s/api/v1/query?query=%s" % (port, urllib.parse.quote(expr))
    try:
        d = json.load(urllib.request.urlopen(u, timeout=5))
    except Exception:
        return None
    r = d.get("data", {}).get("result", [])
    return float(r[0]["value"][1]) if r else None
def want(expr, ok, what):
    deadline = time.time() + 40
    v = q(expr)
    while not (v is not None and ok(v)) and time.time() < deadline:
        time.sleep(0.5)
        v = q(expr)
    print(("PASS " if v is not None and ok(v) else "FAIL ") + "%s (%s = %s)" % (what, expr, v), flush=True)
want('count(up{job="reel"} == 1)', lambda v: v == 3, "Prometheus scrapes all three daemons")
want('sum(reel_broker_requests_total{outcome="ok"})', lambda v: v == n, "the broker counted the %d gens ok" % n)
# A busy machine can stall a worker past the broker's liveness (5 x 200 ms):
# its requests are requeued and run again elsewhere, so each requeue may
# add up to one request's steps. Every step ran at least once, and no more
# than the requeues explain.
requeues = lambda: q('sum(reel_broker_requeues_total)') or 0
want('sum(reel_worker_captures_total) + sum(reel_worker_replays_total) + sum(reel_worker_eager_steps_total)',
     lambda v: 4 * n <= v <= 4 * (n + requeues()),
     "the workers ran every step of the gens once (4 x %d), plus at most the requeued requests' again" % n)
want('sum(reel_worker_replays_total)', lambda v: v > 0, "some steps were replayed")
want('sum(reel_broker_syncs_total{result="complete"})', lambda v: v == 1, "one complete sync")
want('count(reel_worker_weight_version{component="transformer"} == 2)', lambda v: v == 2,
     "both workers report weight version 2")
want('sum(reel_broker_workers{state="routable"})', lambda v: v == 2, "two routable workers")
want('sum(reel_broker_request_seconds_count)', lambda v: v == n, "the latency histogram counted every request")
steps = lambda: q('sum(reel_worker_captures_total) + sum(reel_worker_replays_total) + sum(reel_worker_eager_steps_total)')
want('sum(reel_worker_step_samples_count)', lambda v: v == steps(), "the samples-per-step histogram counted every step")
want('sum(reel_worker_step_samples_bucket{le="1"})', lambda v: v == steps(), "every step of single gens ran one sample")
want('sum(reel_worker_step_samples_sum)', lambda v: v == steps(), "and the samples sum to the steps")
EOF
py_checks "$D/query.out" $?

# reelctl top: plain lines when piped, redrawn in place on a terminal
"$R" top --broker "ipc://$D/c" --count 2 --interval-ms 200 >"$D/top.txt" 2>&1
grep -q "requests $N ok, 0 failed since start" "$D/top.txt" && grep -q '^w1 ' "$D/top.txt" && grep -q '^w2 ' "$D/top.txt" &&
    grep -q "hit rate .* since start" "$D/top.txt" && ! grep -q "$(printf '')" "$D/top.txt" &&
    [ "$(grep -c '^reelctl top' "$D/top.txt")" = 2 ] &&
    ok "reelctl top piped: two plain views (requests, hit rate, both workers), no escape codes" ||
    { bad "reelctl top piped"; show "$D/top.txt"; }
if command -v script >/dev/null 2>&1; then
    script -q -c "'$R' top --broker 'ipc://$D/c' --count 1" /dev/null >"$D/toptty.txt" 2>&1
    grep -q "$(printf '')\[H" "$D/toptty.txt" && grep -q "w2" "$D/toptty.txt" &&
        ok "reelctl top on a terminal redraws in place (home + clear)" || { bad "reelctl top on a tty"; show "$D/toptty.txt"; }
fi
"$R" status --broker "ipc://$D/c" --json >"$D/status.json"
$PY -c "import json,sys; d=json.load(open('$D/status.json')); sys.exit(0 if d['requests_ok'] == $N and d['steps_replayed'] + d['steps_eager'] + d['steps_captured'] == 4 * $N else 1)" &&
    ok "STATUS counts the requests and their steps by how they ran" || { bad "STATUS counters"; show "$D/status.json"; }

r=$(get "http://127.0.0.1:$BP/healthz"); case "$r" in "200 ok") ok "broker /healthz: $r" ;; *) bad "broker /healthz: $r" ;; esac
r=$(get "http://127.0.0.1:$P1/readyz"); case "$r" in "200 ok") ok "worker /readyz: $r" ;; *) bad "worker /readyz: $r" ;; esac
r=$(get "http://127.0.0.1:$BP/nope"); case "$r" in 404*) ok "an unknown path is 404" ;; *) bad "unknown path: $r" ;; esac
r=$(get "http://127.0.0.1:$BP/metrics" POST); case "$r" in 405*) ok "a POST is 405" ;; *) bad "POST: $r" ;; esac

# A group of 3 runs as batched steps: 12 samples more in the sum over its
# 4 steps (in one batch, or in sub-batches: the executor's choice), and
# some step ran more than one sample, on whichever worker ran it. The
# daemons publish their metrics every 500 ms: the check waits for the
# snapshot that holds the group. Each snapshot reads both workers and the
# broker once (retried: a busy machine may be slow to answer).
snap() { # TAG: the daemons' /metrics into $D/snap.TAG, or fail
    : >"$D/snap.$1"
    for p in "$P1" "$P2" "$BP"; do
        $PY - "$p" >>"$D/snap.$1" <<'PYEOF' || return 1
import sys, time, urllib.request
for i in range(10):
    try:
        sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:%s/metrics' % sys.argv[1], timeout=30).read().decode())
        sys.exit(0)
    except Exception as e:
        err = e
        time.sleep(0.5)
sys.exit('metrics of port %s: %s' % (sys.argv[1], err))
PYEOF
    done
}
field() { # TAG NAME: the sum of the samples named NAME in snapshot TAG
    awk -v f="$2" '$1 == f { s += $2 } END { print s + 0 }' "$D/snap.$1"
}
if snap before; then
    le1=$(field before 'reel_worker_step_samples_bucket{le="1"}'); n0=$(field before reel_worker_step_samples_count)
    sum0=$(field before reel_worker_step_samples_sum); rq0=$(field before reel_broker_requeues_total)
    "$R" gen --broker "ipc://$D/c" --model tiny --context "$D/ctx.safetensors" --size 2x8x8 --seed 5 --n 3 \
        --steps 4 --timeout-ms 30000 --quiet --out "$D/grp.safetensors" 2>"$D/grp.err" || { bad "a group of 3"; show "$D/grp.err"; }
    i=0
    while snap after && [ "$(field after reel_worker_step_samples_sum)" -lt $((sum0 + 12)) ] && [ $i -lt 120 ]; do
        sleep 0.25; i=$((i + 1))
    done
    le1b=$(field after 'reel_worker_step_samples_bucket{le="1"}'); n1=$(field after reel_worker_step_samples_count)
    sum1=$(field after reel_worker_step_samples_sum); rq1=$(field after reel_broker_requeues_total)
    seen="count $n0 -> $n1, le1 $le1 -> $le1b, sum $sum0 -> $sum1, requeues $rq0 -> $rq1"
    if [ "$rq1" = "$rq0" ]; then
        [ "$sum1" = "$((sum0 + 12))" ] && [ $((n1 - n0)) -ge 4 ] && [ $((n1 - n0)) -lt 12 ] && [ $((le1b - le1)) -lt 12 ] &&
            ok "a group of 3 x 4 steps: $((n1 - n0)) steps of 12 samples in reel_worker_step_samples, some of more than one" ||
            bad "reel_worker_step_samples after a group of 3: $seen"
    else # a stalled worker's part ran again elsewhere: at least the group's samples, and batched steps among them
        [ "$sum1" -ge "$((sum0 + 12))" ] && [ $((n1 - n0)) -ge 4 ] && [ $((sum1 - sum0)) -gt $((n1 - n0)) ] &&
            ok "a group of 3 x 4 steps (requeued on the way): $seen" ||
            bad "reel_worker_step_samples after a requeued group of 3: $seen"
    fi
else
    bad "the daemons' /metrics before the group could not be read"
fi

# A worker behind the current version is unroutable (helper-91: a worker
# lagging after a sync it could not apply was counted routable), and a
# lost one is counted (the dead gauge is 0 but for an instant: the broker
# drops a dead worker at once). w3 reads weights only below its own
# folder, so the sync of v3 by a path in $D fails there: w1 and w2 apply
# it, w3 lags.
mkdir -p "$D/w3dir" && cp "$D/v1.safetensors" "$D/w3dir/"
"$R" weights init --config tiny --seed 3 --out "$D/v3.safetensors" 2>/dev/null
if cli_worker w3 "$D/broker.log" "$D/w3.log" --broker "ipc://$D/w" --weights "$D/w3dir/v1.safetensors"     --heartbeat-ms 200; then
    W3=$WORKER
    "$R" sync --broker "ipc://$D/c" --version 3 --weights "$D/v3.safetensors" --timeout-ms 30000 >"$D/sync3.err" 2>&1
    i=0
    while snap lag && [ "$(field lag 'reel_broker_workers{state="unroutable"}')" != 1 ] && [ $i -lt 120 ]; do
        sleep 0.25; i=$((i + 1))
    done
    grep -q "w3:bad_weights: path not under" "$D/sync3.err" && [ "$(field lag 'reel_broker_workers{state="unroutable"}')" = 1 ] &&
        [ "$(field lag 'reel_broker_workers{state="routable"}')" = 2 ] &&
        ok "w3 lagging behind v3 (its sync refused): reel_broker_workers unroutable 1, routable 2" ||
        { bad "a lagging worker in reel_broker_workers"; grep reel_broker_workers "$D/snap.lag"; show "$D/sync3.err"; }
    "$R" metrics --broker "ipc://$D/c" --catalog "$D/reel.db" >"$D/mlag.txt" 2>&1
    grep -q '^reel_broker_workers{state="unroutable"} 1$' "$D/mlag.txt" &&
        ok "... and the same from reelctl metrics --broker" ||
        { bad "reelctl metrics --broker: a lagging worker"; grep reel_broker_workers "$D/mlag.txt"; }
    lost() { # TAG: reel_broker_workers_lost_total summed over its labels
        awk '$1 ~ /^reel_broker_workers_lost_total(\{|$)/ { s += $2 } END { print s + 0 }' "$D/snap.$1"
    }
    lost0=$(lost lag)
    kill -KILL "$W3"
    i=0
    while snap lost && [ "$(lost lost)" -le "$lost0" ] && [ $i -lt 120 ]; do
        sleep 0.25; i=$((i + 1))
    done
    # (at least one more: on a busy machine another worker starved past
    # 3 x 200 ms may be dropped too, and registers again; w3's own loss is
    # in the broker's log)
    [ "$(lost lost)" -ge $((lost0 + 1)) ] && wait_for "$D/broker.log" "worker w3 lost" 30 &&
        [ "$(field lost 'reel_broker_workers{state="unroutable"}')" = 0 ] &&
        ok "w3 killed: reel_broker_workers_lost_total counts it ($(grep '^reel_broker_workers_lost_total' "$D/snap.lost" | awk '$2 > 0 { print $1 }'))" ||
        { bad "a lost worker in reel_broker_workers_lost_total"; grep reel_broker_workers "$D/snap.lost"; }
else
    bad "w3 registers"; show "$D/w3.log"
fi

# the broker goes: a worker stays healthy but is no longer ready
kill -TERM "$BROKER"
i=0
r=$(get "http://127.0.0.1:$P1/readyz")
while [ $i -lt 40 ] && [ "${r%% *}" = 200 ]; do sleep 0.25; r=$(get "http://127.0.0.1:$P1/readyz"); i=$((i + 1)); done
case "$r" in 503*) ok "without its broker a worker's /readyz is 503: ${r#503 }" ;; *) bad "worker /readyz without the broker: $r" ;; esac
# ... and stays 503 through its reconnects (each new connection counted as
# heard made it 200 again between them): polled until two more
# "reconnecting" lines are in its log
n0=$(grep -c "reconnecting:" "$D/w1.log")
flips=0 i=0
while [ "$(grep -c "reconnecting:" "$D/w1.log")" -lt $((n0 + 2)) ] && [ $i -lt 400 ]; do
    r=$(get "http://127.0.0.1:$P1/readyz")
    case "$r" in 200*) flips=$((flips + 1)) ;; esac
    sleep 0.05
    i=$((i + 1))
done
[ "$(grep -c "reconnecting:" "$D/w1.log")" -ge $((n0 + 2)) ] && [ $flips = 0 ] &&
    ok "... and stays 503 through two reconnects ($i probes: ${r#503 })" ||
    bad "worker /readyz through its reconnects: $flips probes 200 of $i, reconnects $(grep -c "reconnecting:" "$D/w1.log") from $n0"
r=$(get "http://127.0.0.1:$P1/healthz"); case "$r" in "200 ok") ok "... and its /healthz stays 200" ;; *) bad "worker /healthz: $r" ;; esac
# reelctl top without a broker, piped: the block says so, with its time (helper-91: no time)
"$R" top --broker "ipc://$D/c" --count 1 --interval-ms 200 >"$D/topdead.txt" 2>&1
grep -qE "^reelctl top  [0-9]{2}:[0-9]{2}:[0-9]{2}  broker ipc://.*: timeout" "$D/topdead.txt" &&
    ok "reelctl top piped with the broker gone: one line with its time, timeout" || { bad "reelctl top, broker gone"; show "$D/topdead.txt"; }

# bad addresses stop a daemon at startup, saying why
"$B/reel-broker" --clients "ipc://$D/c2" --workers "ipc://$D/w2" --catalog "" --metrics nonsense >"$D/bad1.log" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "not ADDR:PORT" "$D/bad1.log" && ok "--metrics nonsense: the broker refuses to start (exit $rc)" ||
    { bad "--metrics nonsense (exit $rc)"; show "$D/bad1.log"; }
timeout 20 "$B/reel-worker" --name w8 --broker "ipc://$D/w" --weights "$D/v1.safetensors" --attention flash >"$D/bad3.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "auto, fused or decomposed" "$D/bad3.log" && ok "--attention flash: a usage error naming the modes (exit 2)" ||
    { bad "--attention flash (exit $rc)"; show "$D/bad3.log"; }
timeout 20 "$B/reel-worker" --name w9 --broker "ipc://$D/w" --weights "$D/v1.safetensors" --metrics "127.0.0.1:$P2" \
    >"$D/bad2.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "cannot serve HTTP there" "$D/bad2.log" && ok "a taken --metrics port stops the worker (exit 2)" ||
    { bad "taken port (exit $rc)"; show "$D/bad2.log"; }
finish
