#!/bin/sh
# cli_deploy.sh -- the deployment files checked offline (issue 13, part 3):
# deploy/k8s/ and deploy/grafana/reel.json against Reel's own flags and
# metric names (tests/deploy_check.py), and the systemd units' ExecStart
# flags against the daemons' --help. No cluster is needed or touched.
# Usage: cli_deploy.sh BUILD
set -u
B="${1:-build}"
D=$(mktemp -d /tmp/reel-deploy.XXXXXX)
SUITE=deploy
HERE=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/lib_cli.sh"

/usr/bin/python3 "$HERE/deploy_check.py" "$HERE/.." "$B" >"$D/check.out" 2>&1
py_checks "$D/check.out" $?

for unit in "$HERE"/../deploy/systemd/*.service; do
    prog=$(sed -n 's/^ExecStart=[^ ]*\/\(reel-[a-z]*\).*/\1/p' "$unit")
    [ -n "$prog" ] || { bad "$(basename "$unit"): no ExecStart of a Reel daemon"; continue; }
    help=$("$B/$prog" --help 2>&1)
    missing=""
    for f in $(sed -n '/^ExecStart=/,/[^\\]$/p' "$unit" | grep -o -- '--[a-z][a-z-]*' | sort -u); do
        echo "$help" | grep -q -- "$f" || missing="$missing $f"
    done
    [ -z "$missing" ] && ok "$(basename "$unit"): every flag of its ExecStart is one $prog accepts" ||
        bad "$(basename "$unit"): $prog does not accept$missing"
done
finish
