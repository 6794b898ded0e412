# lib_cli.sh -- what the process-level test scripts share. Source it after
# setting D (the script's temporary folder), SUITE (its name in the
# closing line) and, for cli_broker and cli_worker, B (the build folder). It sets PIDS (processes to kill on exit), the pass/fail
# counters, and an exit trap that kills them and removes D (REEL_KEEP=1
# keeps it). Every wait is bounded.
PIDS=""
pass=0; fail=0

cleanup() {
    # TERM first: a `timeout CMD` passes it on to CMD (a KILL of timeout
    # would leave CMD running, orphaned); then KILL whatever is left.
    for p in $PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $PIDS; do
        _w=0
        while ! gone "$p" && [ $_w -lt 20 ]; do sleep 0.1; _w=$((_w + 1)); done
        kill -9 "$p" 2>/dev/null
    done
    wait 2>/dev/null
    [ -n "${REEL_KEEP:-}" ] || rm -rf "$D"
}
trap cleanup EXIT
# A signal (run_all.sh's time limit, ^C) ends the script here: cleanup runs
# once, from the EXIT trap, and nothing goes on without D.
trap 'echo "$SUITE: stopped by a signal (run_all.sh allows a suite 900 s)"; exit 143' INT TERM

ok() { pass=$((pass + 1)); echo "PASS $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
finish() { echo "$SUITE: $pass passed, $fail failed"; [ "$fail" = 0 ]; exit $?; }
show() { sed 's/^/  | /' "$@" 2>/dev/null | tail -8; }

# wait_count FILE PATTERN N SECONDS [PID]: until FILE has at least N
# matching lines; with PID, 1 at once when that process has ended first
# (a daemon that exited will never log what is awaited).
wait_count() {
    i=0
    while [ $i -lt $(($4 * 10)) ]; do
        _c=$(grep -cE "$2" "$1" 2>/dev/null)
        [ "${_c:-0}" -ge "$3" ] && return 0
        if [ -n "${5:-}" ] && gone "$5"; then
            _c=$(grep -cE "$2" "$1" 2>/dev/null)
            [ "${_c:-0}" -ge "$3" ] && return 0
            echo "  (process $5 ended before $3 x /$2/ in $(basename "$1"))"; tail -5 "$1" 2>/dev/null | sed 's/^/  | /'
            return 1
        fi
        sleep 0.1; i=$((i + 1))
    done
    echo "  (timed out waiting for $3 x /$2/ in $(basename "$1"))"; tail -5 "$1" 2>/dev/null | sed 's/^/  | /'
    return 1
}
wait_for() { wait_count "$1" "$2" 1 "$3"; }

# gone PID: the process has ended (a zombie not yet reaped counts).
gone() {
    _s=$(sed -E 's/^[0-9]+ [(].*[)] (.).*/\1/' "/proc/$1/stat" 2>/dev/null)
    [ -z "$_s" ] || [ "$_s" = Z ]
}

# stacks PID: what a process that outlived its bound is doing: its command
# line and, where gdb is installed, every thread's stack.
stacks() {
    echo "  (process $1 still running after its bound: $(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | cut -c1-200))"
    command -v gdb >/dev/null 2>&1 || return 0
    timeout 60 gdb -p "$1" -batch -ex 'thread apply all bt' 2>/dev/null | grep -E '^(Thread|#)' | head -80 | sed 's/^/  | /'
}

# reap PID SECONDS: the exit status of a child once it ends, within
# SECONDS; past that its stacks are shown, it is killed, and 124 returned.
# Every wait for a process is bounded: one that hangs fails its check and
# says where, instead of holding the suite until run_all.sh's limit.
reap() {
    _t=0
    while ! gone "$1"; do
        if [ $_t -ge $(($2 * 10)) ]; then
            stacks "$1"
            kill -9 "$1" 2>/dev/null
            wait "$1" 2>/dev/null
            return 124
        fi
        sleep 0.1; _t=$((_t + 1))
    done
    wait "$1" 2>/dev/null
}

# stop_proc PID [SECONDS]: SIGTERM, then reap within SECONDS (60); 124 when it
# did not stop, after showing why.
stop_proc() { kill -TERM "$1" 2>/dev/null; reap "$1" "${2:-60}"; }

# wait_sql DB QUERY N SECONDS: until QUERY (a count) on the SQLite file DB
# answers at least N: the catalog's writer thread stores rows after the
# reply that caused them, so a test waits for the row, not for a moment.
wait_sql() {
    i=0
    while [ $i -lt $(($4 * 10)) ]; do
        [ "$(/usr/bin/sqlite3 "$1" "$2" 2>/dev/null || echo 0)" -ge "$3" ] 2>/dev/null && return 0
        sleep 0.1; i=$((i + 1))
    done
    echo "  (timed out waiting for $3 from: $2)"
    return 1
}

# cli_broker LOG ARGS...: $B/reel-broker ARGS, its output in LOG; sets
# BROKER; 0 once it logs ready (within 30 s: generous, for a busy machine;
# a restart restores the catalog's versions and re-hashes stored uploads).
cli_broker() {
    _log=$1; shift
    # emptied here, not by the background redirection: that may run after
    # the wait below has already read a previous run's "ready"
    : >"$_log"
    "$B/reel-broker" "$@" >>"$_log" 2>&1 &
    BROKER=$!
    PIDS="$PIDS $BROKER"
    wait_count "$_log" "reel-broker: ready" 1 60 "$BROKER"
}

# cli_worker NAME BROKER_LOG LOG ARGS...: $B/reel-worker --name NAME ARGS,
# its output in LOG; sets WORKER; 0 once the broker logs it ready one more
# time than before (within 60 s: generous, for a busy machine).
cli_worker() {
    _n=$1; _bl=$2; _log=$3; shift 3
    _before=$(grep -cE "worker $_n ready" "$_bl" 2>/dev/null)
    : >"$_log"
    "$B/reel-worker" --name "$_n" "$@" >>"$_log" 2>&1 &
    WORKER=$!
    PIDS="$PIDS $WORKER"
    wait_count "$_bl" "worker $_n ready" $((${_before:-0} + 1)) 60 "$WORKER"
}

# py_checks OUT RC: counts the PASS/FAIL lines a Python check printed to
# OUT (other lines shown), and a failure when it exited RC != 0.
py_checks() {
    while read -r line; do
        case "$line" in
        PASS*) ok "${line#PASS }" ;;
        FAIL*) bad "${line#FAIL }" ;;
        *) echo "  | $line" ;;
        esac
    done <"$1"
    [ "$2" = 0 ] || bad "the Python checks exited $2"
}

# ---- long GENs under a broker's death (cli_standby.sh, cli_hosts_pair.sh) ----
# Set by the script: D, R, PY; LG_RUN a command prefix for every reelctl
# (e.g. "nsx rh1", a network namespace; empty: none), LG_STEPS and LG_SEED
# the bases of each GEN's steps and seed, LG_TIMEOUT_MS, LG_WEIGHTS the
# weights file of a version under $D (printf pattern, e.g. w%s.safetensors).

# long_gens TAG BROKER N: N tiny GENs in the background (their pids in gp),
# the k-th with context $D/c$k.safetensors, LG_STEPS + 1000k steps and
# seed LG_SEED + k; each one's arguments kept in $D/TAG.k.spec, its output
# in $D/TAG.k.err, its latent in $D/TAG.k.safetensors. The broker's
# deadline is LG_TIMEOUT_MS too, not its default 60 s, which a starved
# machine ran past (6065 of 8000 steps at 60 s).
long_gens() {
    gp=""
    _k=1
    while [ $_k -le "$3" ]; do
        echo "--context $D/c$_k.safetensors --steps $((${LG_STEPS:-5000} + 1000 * _k)) --seed $((_k + ${LG_SEED:-70})) --size 2x8x8" >"$D/$1.$_k.spec"
        ${LG_RUN:-} "$R" gen --broker "$2" --model tiny $(cat "$D/$1.$_k.spec") --timeout-ms "${LG_TIMEOUT_MS:-120000}" \
            --deadline-ms "${LG_TIMEOUT_MS:-120000}" \
            --quiet --out "$D/$1.$_k.safetensors" >"$D/$1.$_k.err" 2>&1 &
        gp="$gp $!"
        _k=$((_k + 1))
    done
}

# long_answered TAG N VERSION: 0 when each of TAG's N GENs was answered
# once, on VERSION, bitwise `reelctl run` on that version's weights.
long_answered() {
    _good=0
    _k=1
    while [ $_k -le "$2" ]; do
        _f="$D/$1.$_k.err"
        _n=$(grep -c "^reelctl: gen tiny" "$_f")
        _v=$(sed -n 's/^reelctl: gen tiny .*weights v\([0-9]*\),.*/\1/p' "$_f" | head -1)
        if [ "$_n" = 1 ] && [ "$_v" = "$3" ]; then
            "$R" run --weights "$D/$(printf "${LG_WEIGHTS:-w%s.safetensors}" "$_v")" $(cat "$D/$1.$_k.spec") \
                --out "$D/$1.$_k.run.safetensors" 2>/dev/null
            if "$R" tensor diff "$D/$1.$_k.safetensors" "$D/$1.$_k.run.safetensors" --name latent >/dev/null 2>&1; then
                _good=$((_good + 1))
            else
                echo "  $1 GEN $_k: not bitwise reelctl run"
            fi
        else
            echo "  $1 GEN $_k: $_n answers, version '$_v'"; show "$_f"
        fi
        _k=$((_k + 1))
    done
    [ "$_good" = "$2" ]
}

# long_running BROKER [N [SECONDS]]: 0 once the workers at BROKER run N
# (2) requests at once (STATUS inflight), within SECONDS (60).
long_running() {
    _until=$(($(date +%s) + ${3:-60}))
    while [ "$(date +%s)" -lt "$_until" ]; do
        ${LG_RUN:-} "$R" status --broker "$1" --json 2>/dev/null |
            $PY -c 'import json,sys; sys.exit(0 if sum(w["inflight"] for w in json.load(sys.stdin)["workers"]) >= int(sys.argv[1]) else 1)' "${2:-2}" &&
            return 0
    done
    echo "  (fewer than ${2:-2} requests running at $1 after ${3:-60} s)"
    return 1
}

# The text-to-video parts the prompt suites run on, in folder $1 with
# reelctl $R: a tokenizer trained on a short corpus (spiece.model), a DiT
# with text_len 16 (tinyt.json, dit.safetensors), umT5 t5-tiny in BF16
# (t5.safetensors) and a tiny VAE (vae.safetensors). Fails (a FAIL said)
# when a part cannot be made.
t2v_parts() {
    {
        echo "a cat on a skateboard in the park"; echo "a red car driving at night in the rain"
        for i in $(seq 1 40); do echo "line $i with ocean mountain river sky cloud sun moon star tree flower bird"; done
    } >"$1/corpus.txt"
    spm_train --input="$1/corpus.txt" --model_prefix="$1/spiece" --vocab_size=300 --model_type=unigram --pad_id=0 \
        --eos_id=1 --unk_id=2 --bos_id=-1 --byte_fallback=true --character_coverage=1.0 --hard_vocab_limit=false \
        >"$1/spm.log" 2>&1 || { bad "spm_train trains a tokenizer"; show "$1/spm.log"; return 1; }
    echo '{"name":"tinyt","dim":64,"heads":4,"layers":2,"ffn_dim":128,"in_channels":4,"text_dim":32,"freq_dim":256,"text_len":16}' >"$1/tinyt.json"
    "$R" weights init --config "$1/tinyt.json" --seed 7 --out "$1/dit.safetensors" 2>/dev/null &&
        "$R" weights init-t5 --config t5-tiny --seed 3 --dtype bf16 --out "$1/t5.safetensors" 2>/dev/null &&
        "$R" weights init-vae --config vae-tiny --seed 5 --out "$1/vae.safetensors" 2>/dev/null ||
        { bad "the text-to-video parts' weights"; return 1; }
}
