#!/bin/sh
# run_all.sh -- runs every benchmark binary; numbers go to stdout.
set -eu
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
for b in "$BUILD"/bench/bench_*; do
    [ -x "$b" ] || continue
    echo "=== $(basename "$b")"
    "$b" "$BUILD"
done
