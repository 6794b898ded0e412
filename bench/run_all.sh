#!/bin/sh
# run_all.sh -- runs every benchmark binary; numbers go to stdout.
set -eu
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
for b in "$BUILD"/bench/bench_*; do
    [ -x "$b" ] || continue
    echo "=== $(basename "$b")"
    "$b" "$BUILD"
    # Weights by value at wan2.1-1.3b size too, where the machine holds two
    # workers' models and, while they fetch, a copy of the 5.7 GB file each
    # (about 23 GB), the page cache of the files it reads, and seven copies
    # of the file on disk (the trainer's two, the broker's two kept, one
    # coming and two spares). On a 23 GB machine it ran memory-bound (docs/BENCH.md).
    if [ "$(basename "$b")" = bench_sync ]; then
        mem=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
        disk=$(df -Pk /tmp | awk 'NR == 2 {print int($4 / 1048576)}')
        if [ "$mem" -ge 32 ] && [ "$disk" -ge 40 ]; then
            echo "=== bench_sync wan2.1-1.3b"
            "$b" "$BUILD" 2 wan2.1-1.3b
        else
            echo "=== bench_sync wan2.1-1.3b: SKIP: needs 32 GB of memory available and 40 GB free under /tmp (have ${mem} GB, ${disk} GB)"
        fi
    fi
done
