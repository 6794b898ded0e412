#!/bin/sh
# cli_mixed_chaos.sh -- mixed traffic with failures through one real
# reel-broker and two reel-workers (tiny model, --streams 2, --max-batch 4;
# one --sync-mode steps, one drain), driven by tests/mixed_chaos.py with the
# Python client: several client threads send a seeded random mix of plain,
# CFG, group and SDE-rollout GENs, GENs whose deadline expires, CANCELs of
# requests in flight, resends under one client token and STATUS calls,
# while a trainer publishes three weight syncs by path and one worker is
# killed (SIGKILL) and restarted. Checked by invariants, not timings: one
# final answer per request, of a code its kind allows; a sample of the
# RESULTs bitwise the request run alone on a quiet reference worker at the
# version it reports; versions current while each request ran; the catalog
# (reelctl why, versions, evictions, report, keys) agreeing with the
# clients; every daemon's exit status. The seed is printed; REEL_CHAOS_SEED
# replays one. Usage: cli_mixed_chaos.sh BUILD   (REEL_KEEP=1 keeps the dir)
set -u
B="${1:-build}"
D=$(mktemp -d /tmp/reel-chaos.XXXXXX)
SUITE=mixed_chaos
PY=/usr/bin/python3
. "$(dirname "$0")/lib_cli.sh"

SEED=${REEL_CHAOS_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}
echo "== seed $SEED (REEL_CHAOS_SEED=$SEED replays it)"
timeout 300 $PY "$(dirname "$0")/mixed_chaos.py" --build "$B" --dir "$D" --seed "$SEED" \
    --seconds "${REEL_CHAOS_SECONDS:-40}" >"$D/driver.out" 2>&1 &
DRV=$!; PIDS="$PIDS $DRV"
reap "$DRV" 320; rc=$?
py_checks "$D/driver.out" "$rc"
finish
