#!/bin/sh
# cli_units.sh -- the shipped systemd units: valid for systemd-analyze
# verify (with ExecStart pointed at a binary that exists), bound to
# loopback by default (never 0.0.0.0), and sandboxed: a dedicated user, no
# new privileges, a read-only system, a private /tmp, and the worker's
# weights directory read-only.
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "PASS $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
T=$(mktemp -d /tmp/reel-units.XXXXXX)
trap 'rm -rf "$T"' EXIT

has() { # unit key=value
    grep -qx "$2" "$1" && ok "$(basename "$1"): $2" || bad "$(basename "$1"): no '$2'"
}

for u in deploy/systemd/reel-broker.service deploy/systemd/reel-worker@.service; do
    n=$(basename "$u")
    if grep -v '^#' "$u" | grep -q '0\.0\.0\.0'; then bad "$n binds 0.0.0.0"; else ok "$n binds no wildcard address"; fi
    has "$u" "NoNewPrivileges=yes"
    has "$u" "ProtectSystem=strict"
    has "$u" "PrivateTmp=yes"
    has "$u" "DynamicUser=yes"
    has "$u" "CapabilityBoundingSet="
    has "$u" "UMask=0077"
    if command -v systemd-analyze >/dev/null 2>&1; then
        sed 's#^ExecStart=/usr/local/bin/reel-[a-z]*#ExecStart=/bin/true#' "$u" >"$T/$n"
        if out=$(systemd-analyze verify "$T/$n" 2>&1) && [ -z "$out" ]; then
            ok "$n: systemd-analyze verify is clean"
        else
            bad "$n: systemd-analyze verify: $out"
        fi
    else
        echo "SKIP $n: systemd-analyze is not installed here"
    fi
done
has deploy/systemd/reel-worker@.service "ReadOnlyPaths=/var/lib/reel/weights"
has deploy/systemd/reel-broker.service "PrivateDevices=yes"
has deploy/systemd/reel-broker.service "MemoryDenyWriteExecute=yes"
echo "units: $pass passed, $fail failed"
[ "$fail" = 0 ]
