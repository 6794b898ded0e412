# gpu-common.sh -- what deploy/gpu-bundle.sh (here) and deploy/gpu-check.sh
# (on the GPU machine) must agree on; sourced by both, never run.
# shellcheck shell=bash

# The binaries the bundle carries, as paths under the build folder.
GPU_BINS="tests/test_cuda tests/test_vae_cuda reelctl reel-broker reel-worker deploy/gpu_probe deploy/gpu_compare deploy/gpu_attn_wan deploy/gpu_step_time bench/bench_batching bench/bench_mix_step"

# Libraries a bundled binary may load from outside the bundle, by soname:
# glibc (libc, libm, libpthread, libdl, librt, libresolv, the loader), the
# C++ runtime (libstdc++ and the libgcc_s it needs), the CUDA driver and the
# CUDA libraries (runtime, cuBLAS, cuBLASLt, cuDNN). Everything else is
# linked statically or carried in the bundle's lib/.
GPU_ALLOWED_RE='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libcuda\.so\.1|libcudart\.so\.[0-9]+|libcublas\.so\.[0-9]+|libcublasLt\.so\.[0-9]+|libcudnn[a-z_]*\.so\.[0-9]+|libnvidia-[a-z0-9_-]+\.so[0-9.]*)$'

# The source files the bundle's binaries are built from, one path a line,
# sorted: what a stale bundle is told apart by. Run from the repo root.
# Uses find, not git: the GPU machine gets a copy of the tree without .git.
gpu_sources() {
    {
        # every folder the library and the binaries are built from (Makefile's LIB_SRC and mains)
        find base schema net catalog kernels capture_cache model media clients/c ctl worker broker -type f \
            \( -name '*.c' -o -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.sql' -o -name '*.inc' \)
        find deploy -maxdepth 1 -type f -name 'gpu_*.c'
        echo tests/test_cuda.c
        echo tests/test_vae_cuda.c
        echo tests/row_groups_check.h
        echo bench/bench_batching.c
        echo bench/bench_mix_step.c
        echo bench/bench.h
        echo bench/bench_proc.h
        echo tests/support.c
        echo tests/support.h
        echo Makefile
    } | LC_ALL=C sort
}

# The source files that differ between the bundle BUNDLE was built from
# and this tree, one path a line (none: the bundle is this tree's); the
# tree's hashes go to the file NOW. Run from the repo root.
gpu_stale_sources() {
    gpu_sources | tr '\n' '\0' | xargs -0 sha256sum >"$2" 2>/dev/null
    awk 'NR == FNR { h[$2] = $1; next } { if (!($2 in h) || h[$2] != $1) print $2; delete h[$2] }
         END { for (p in h) print p }' "$1/SOURCES.sha256" "$2"
}

# `ldd FILE` as "SONAME PATH" lines (PATH "-" for the vDSO and the loader,
# "not-found" for a library the loader cannot find). Missing symbol
# versions ("version `GLIBC_2.38' not found") come out as
# "VERSION-NOT-FOUND <what>". Uses the loader's trace mode when there is
# no ldd. Returns ldd's status.
gpu_ldd() {
    local out rc
    if command -v ldd >/dev/null 2>&1; then
        out=$(ldd "$1" 2>&1); rc=$?
    else
        out=$(LD_TRACE_LOADED_OBJECTS=1 "$1" 2>&1); rc=$?
    fi
    printf '%s\n' "$out" | awk '
        /version `.*not found/ { sub(/^[ \t]*/, ""); print "VERSION-NOT-FOUND " $0; next }
        /=> not found/ { print $1, "not-found"; next }
        /=>/ { n = $1; p = $3; if (p ~ /^\(/) p = "-"; print n, p; next }
        /^[ \t]*\// { n = $1; sub(/.*\//, "", n); print n, "-"; next }
        /^[ \t]*linux-vdso/ { print $1, "-"; next }'
    return $rc
}
