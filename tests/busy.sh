#!/bin/sh
# busy.sh -- `make test` with two CPU hogs running beside it the whole time
# (make test-busy): a suite that only passes on a quiet machine fails here.
# The hogs are bounded (they end with the run, or after 2 hours at most)
# and killed on any exit. Exits with make test's status.
set -u
cd "$(dirname "$0")/.."
HOGS=""
cleanup() { for h in $HOGS; do kill "$h" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT INT TERM
for i in 1 2; do
    timeout 7200 sh -c 'while :; do :; done' &
    HOGS="$HOGS $!"
done
echo "test-busy: make test beside 2 CPU hogs (pids$HOGS) on $(nproc) cores"
${MAKE:-make} test
rc=$?
echo "test-busy: make test exited $rc"
exit $rc
