#!/bin/bash
# gpu-bundle.sh -- builds here, with CUDA, everything deploy/gpu-check.sh runs
# on a GPU machine that has none of Debian's libraries and reaches no
# registry, and packs it into one git-ignored folder (default gpu-bundle/,
# under 64 MiB with the tree) to carry there. `make gpu-bundle` runs it.
#
# The binaries (tests/test_cuda, tests/test_vae_cuda, bench/bench_batching, bench/bench_mix_step,
# reelctl, reel-broker, reel-worker and the
# check's own tools deploy/gpu_*.c) are linked with Debian's static archives
# (msgpack-c, jansson, SQLite, libsodium, libcrypto, Check, subunit) and the static CUDA
# runtime; libzmq and OpenBLAS have no usable static form here (libzmq.a
# needs a GSSAPI that Debian ships only as .so; a static OpenBLAS adds 26 MB
# to each binary), so they and what they load go into lib/ as .so files,
# found through RPATH $ORIGIN/../lib. Left to the machine: glibc, libstdc++
# (+ libgcc_s), the CUDA driver, cuBLAS(Lt) and cuDNN (deploy/gpu-common.sh
# has the list).
#
# Then it proves it: ldd of every binary resolves each library either in the
# bundle or in that list, and (as root, where unshare works) the binaries
# start and gpu-check.sh runs to a one-line FAIL (no GPU here) in a mount
# namespace where /usr/lib/x86_64-linux-gnu holds nothing but glibc,
# libstdc++ and what the shell tools need. It prints the bundle's size.
#
# The folder holds reel-gpu.tar.gz (bin/, lib/, LDD.txt), MANIFEST (what,
# when, from which commit; the newest glibc symbol version needed) and
# SOURCES.sha256 (the sources it was built from: gpu-check.sh refuses a
# bundle older than the tree). Exits non-zero with one "gpu-bundle: FAIL"
# line on any problem. Env: GPU_BUNDLE (gpu-bundle), GPU_BUILD (build-gpu),
# JOBS (all cores), CUDA_HOME (/usr/local/cuda), MAKE.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. deploy/gpu-common.sh

BUNDLE=${GPU_BUNDLE:-gpu-bundle}
BUILD=${GPU_BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
MAKE=${MAKE:-make}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
MAX_BYTES=$((56 * 1024 * 1024)) # the device tool carries 64 MiB, tree included

die() { echo "gpu-bundle: FAIL $*"; exit 1; }
note() { echo "gpu-bundle: $*"; }

# --- 1. what the build needs here --------------------------------------------
[ -x "$CUDA_HOME/bin/nvcc" ] || die "no $CUDA_HOME/bin/nvcc: the bundle's CUDA code is built here (set CUDA_HOME)"
for c in ldd readelf tar gzip sha256sum find awk; do
    command -v "$c" >/dev/null 2>&1 || die "'$c' is missing here"
done
ML=/usr/lib/x86_64-linux-gnu
mkdir -p "$BUILD/static" || die "cannot create $BUILD/static"
# lib.a:package -- each linked statically through $BUILD/static
for ap in libmsgpackc.a:libmsgpack-dev libjansson.a:libjansson-dev libsqlite3.a:libsqlite3-dev \
          libsodium.a:libsodium-dev libcrypto.a:libssl-dev libcheck_pic.a:check libsubunit.a:libsubunit-dev; do
    a=${ap%%:*}
    [ -f "$ML/$a" ] || die "$ML/$a is missing (Debian package ${ap#*:}; deploy/install-deps.sh installs it)"
    ln -sfn "$ML/$a" "$BUILD/static/$a"
done

# --- 2. build ------------------------------------------------------------------
note "building in $BUILD with CUDA ($JOBS jobs)"
targets=""
for b in $GPU_BINS; do
    case $b in deploy/*) ;; *) targets="$targets $BUILD/$b" ;; esac
done
# shellcheck disable=SC2086
$MAKE -j"$JOBS" BUILD="$BUILD" CUDA=1 REEL_GPU_BUNDLE=1 $targets gpu-tools ||
    die "the build failed (above)"
for b in $GPU_BINS; do [ -x "$BUILD/$b" ] || die "$BUILD/$b was not built"; done

# --- 3. stage: bin/ and the libraries the binaries need from outside the list -
STAGE="$BUILD/bundle-root"
rm -rf "$STAGE" && mkdir -p "$STAGE/bin" "$STAGE/lib" || die "cannot create $STAGE"
for b in $GPU_BINS; do cp "$BUILD/$b" "$STAGE/bin/" || die "cannot copy $b"; done
for f in "$STAGE"/bin/*; do
    gpu_ldd "$f" >"$STAGE/.deps" || die "ldd $(basename "$f") failed: $(head -2 "$STAGE/.deps" | tr '\n' ' ')"
    while read -r name path; do
        [ "$name" = VERSION-NOT-FOUND ] && die "$(basename "$f"): $path"
        [ "$path" = not-found ] && die "$(basename "$f") needs $name, which is not found here"
        [[ $name =~ $GPU_ALLOWED_RE ]] && continue
        [ -e "$STAGE/lib/$name" ] || cp -L "$path" "$STAGE/lib/$name" || die "cannot copy $path"
    done <"$STAGE/.deps"
done
rm -f "$STAGE/.deps"

# --- 4. proof 1: with the bundle in place, every library of every binary
# resolves in the bundle's lib/ or is on the list -------------------------------
libdir=$(cd "$STAGE/lib" && pwd -P)
{
    echo "# ldd of each bundled binary, built $(date -u +%FT%TZ): where each library resolves"
    for f in "$STAGE"/bin/*; do
        inb=""; sys=""; bad=""
        while read -r name path; do
            if [ "$name" = VERSION-NOT-FOUND ] || [ "$path" = not-found ]; then bad="$bad $name:$path"
            elif [ "$path" != - ] && [ "$(cd "$(dirname "$path")" && pwd -P)" = "$libdir" ]; then inb="$inb $name"
            elif [[ $name =~ $GPU_ALLOWED_RE ]]; then sys="$sys $name"
            else bad="$bad $name:$path"
            fi
        done < <(gpu_ldd "$f")
        echo "$(basename "$f"): bundle:${inb:- none}; machine:$sys${bad:+; NOT ALLOWED:$bad}"
    done
} >"$STAGE/LDD.txt"
cat "$STAGE/LDD.txt"
grep -q "NOT ALLOWED" "$STAGE/LDD.txt" && die "a binary loads a library outside the bundle and the list (above)"

# The RPATH of each binary names the bundle's lib/ and nothing else: the
# CUDA libraries are the GPU machine's, chosen by its LD_LIBRARY_PATH and
# loader cache, never a folder of this build machine.
for f in "$STAGE"/bin/*; do
    rp=$(readelf -d "$f" | sed -n 's/.*(\(RPATH\|RUNPATH\)).*\[\(.*\)\]$/\1=\2/p' | tr '\n' ' ')
    [ "$rp" = 'RPATH=$ORIGIN/../lib ' ] || die "$(basename "$f") has '${rp:-no RPATH}', not RPATH=\$ORIGIN/../lib alone"
done
note "every binary's RPATH is \$ORIGIN/../lib alone: LD_LIBRARY_PATH chooses the CUDA libraries"

# The newest glibc / libstdc++ symbol versions anything in the bundle needs.
vmax() { readelf -V -W "$STAGE"/bin/* "$STAGE"/lib/* 2>/dev/null | grep -o "Name: $1_[0-9.]*" |
         sed "s/Name: $1_//" | sort -V | tail -1; }
glibc_max=$(vmax GLIBC); glibcxx_max=$(vmax GLIBCXX)

# --- 5. pack -------------------------------------------------------------------
TMPB="$BUILD/bundle.tmp"
rm -rf "$TMPB" && mkdir -p "$TMPB" || die "cannot create $TMPB"
tar -C "$STAGE" -czf "$TMPB/reel-gpu.tar.gz" bin lib LDD.txt || die "tar failed"
gpu_sources | tr '\n' '\0' | xargs -0 sha256sum >"$TMPB/SOURCES.sha256" || die "cannot hash the sources"
# Every source must travel: a git-ignored one would not reach the GPU machine.
if command -v git >/dev/null 2>&1 && git rev-parse --git-dir >/dev/null 2>&1; then
    ign=$(gpu_sources | git check-ignore --stdin | head -3 | tr '\n' ' ')
    [ -z "$ign" ] || die "git ignores sources the bundle is built from ($ign): they would not travel"
    head=$(git rev-parse --short HEAD 2>/dev/null)
    # shellcheck disable=SC2046
    dirty=$(git status --porcelain -- $(gpu_sources) 2>/dev/null | wc -l)
else
    head=unknown; dirty=unknown
fi
unpacked=$(du -sb "$STAGE/bin" "$STAGE/lib" | awk '{ s += $1 } END { print s }')
{
    echo "built_at=$(date -u +%FT%TZ)"
    echo "built_on=$(uname -srm) $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
    echo "git_head=$head"
    echo "sources_changed_since_head=$dirty"
    echo "nvcc=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    echo "cuda_archs=sm_80 sm_90 compute_90"
    echo "glibc_max=$glibc_max"
    echo "glibcxx_max=${glibcxx_max:-none}"
    echo "binaries=$(cd "$STAGE/bin" && echo *)"
    echo "libs=$(cd "$STAGE/lib" && echo *)"
    echo "unpacked_bytes=$unpacked"
} >"$TMPB/MANIFEST"
rm -rf "$BUNDLE" && mv "$TMPB" "$BUNDLE" || die "cannot move $TMPB to $BUNDLE"
size=$(du -sb "$BUNDLE" | awk '{ print $1 }')
[ "$size" -le "$MAX_BYTES" ] || { rm -rf "$BUNDLE"; die "the bundle is $size bytes, over $MAX_BYTES"; }

# --- 6. proof 2: where Debian's libraries are not on the default paths, the
# binaries find every library and start, and gpu-check.sh runs with this
# bundle to its one-line FAIL (there is no GPU here) ------------------------------
gpu_here=no
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu_here=yes
ns_proof() {
    local T; T=$(mktemp -d /tmp/reel-nslibs.XXXXXX) || return 1
    local tools="bash sh ls cat sed grep awk mawk tar gzip sha256sum find sort timeout mktemp date head tail tr wc cut dirname basename rm mkdir cp mv ln kill sleep getconf readlink env uname nproc xargs cmp tee"
    # glibc and the C++ runtime (the list), plus what the shell tools load:
    # the base system of any GPU machine's image.
    local keep="ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 libstdc++.so.6 libgcc_s.so.1" t l
    for t in $tools; do
        t=$(command -v "$t") || continue
        keep="$keep $(gpu_ldd "$t" | awk '$2 != "-" && $2 != "not-found" { print $1 }')"
    done
    for l in $(echo "$keep" | tr ' ' '\n' | sort -u); do
        [ -e "$ML/$l" ] && cp -L "$ML/$l" "$T/"
    done
    for l in "$STAGE"/lib/*; do # none of what the bundle carries may come in with the tools
        l=$(basename "$l")
        [ -e "$T/$l" ] && { echo "  ($l is also a shell tool's library: removed from the namespace)"; rm -f "$T/$l"; }
    done
    # the folders cuDNN is found in (the loader's cache, the toolkit's), hidden in the namespace
    local cudnn_dirs
    cudnn_dirs=$( { ldconfig -p 2>/dev/null | awk '/libcudnn/ { print $NF }'; ls "$CUDA_HOME"/lib64/libcudnn* 2>/dev/null; } |
                 xargs -r -n1 readlink -f | xargs -r -n1 dirname | grep -v "^$ML\$" | sort -u | tr '\n' ' ')
    unshare -m --propagation private bash -c '
        set -u
        # cuDNN hidden as well (first: mount needs libmount, hidden next): it is
        # opened on first use, so nothing may need it to start
        for dir in $4; do
            side=$(mktemp -d "$1.cudnn.XXXXXX") && mkdir "$side/orig" "$side/filtered" || exit 3
            mount --bind "$dir" "$side/orig" || exit 3
            for f in "$side/orig"/* "$side/orig"/.[!.]*; do
                [ -e "$f" ] || [ -L "$f" ] || continue
                case ${f##*/} in libcudnn*) ;; *) ln -s "$f" "$side/filtered/" ;; esac
            done
            mount --bind "$side/filtered" "$dir" || exit 3
        done
        for dir in $4; do
            ls "$dir"/libcudnn* >/dev/null 2>&1 && { echo "  cuDNN is still visible in $dir"; exit 3; }
        done
        echo "  cuDNN hidden (${4:-it was not installed here})"
        mount --bind "$1" /usr/lib/x86_64-linux-gnu || exit 3
        echo "  /usr/lib/x86_64-linux-gnu now holds $(ls /usr/lib/x86_64-linux-gnu | wc -l) files: glibc, libstdc++ and the shell tools'"'"' libraries"
        for l in libzmq.so.5 libopenblas.so.0 libsqlite3.so.0 libjansson.so.4 libmsgpackc.so.2 libsodium.so.23 libcrypto.so.3; do
            [ -e "/usr/lib/x86_64-linux-gnu/$l" ] && { echo "  $l is still visible"; exit 3; }
        done
        D=$(mktemp -d /tmp/reel-nsbundle.XXXXXX) && tar -C "$D" -xzf "$2/reel-gpu.tar.gz" || exit 3
        for f in "$D"/bin/*; do
            out=$(LD_TRACE_LOADED_OBJECTS=1 "$f" 2>&1) || { echo "  $(basename "$f"): $out"; exit 4; }
            if echo "$out" | grep -q "not found"; then echo "  $(basename "$f"): $(echo "$out" | grep "not found" | tr "\n" " ")"; exit 4; fi
        done
        echo "  every bundled binary resolves all its libraries"
        for f in "$D"/bin/*; do
            out=$(LD_TRACE_LOADED_OBJECTS=1 "$f" 2>&1) || { echo "  without cuDNN: $(basename "$f"): $out"; exit 4; }
            echo "$out" | grep -q "not found\|libcudnn" && { echo "  without cuDNN: $(basename "$f"): $(echo "$out" | grep "not found\|libcudnn" | tr "\n" " ")"; exit 4; }
        done
        "$D/bin/reel-worker" --help >/dev/null || { echo "  reel-worker --help failed without cuDNN"; exit 4; }
        "$D/bin/reelctl" weights init --config tiny --seed 1 --out "$D/w.st" >/dev/null 2>&1 &&
            "$D/bin/reelctl" tensor rand --name latent --shape 4,1,4,4 --seed 2 --out "$D/l.st" >/dev/null &&
            "$D/bin/reelctl" tensor rand --name context --shape 3,32 --seed 3 --out "$D/c.st" >/dev/null &&
            "$D/bin/reelctl" run --weights "$D/w.st" --latent "$D/l.st" --context "$D/c.st" --steps 2 \
                --backend cpu --out "$D/o.st" >/dev/null 2>&1 ||
            { echo "  reelctl run on the CPU failed without cuDNN"; exit 4; }
        echo "  without cuDNN: the binaries start and reelctl runs a step"
        "$D/bin/reelctl" kernels >/dev/null || { echo "  reelctl kernels failed"; exit 4; }
        "$D/bin/gpu_compare" 2>/dev/null; [ $? = 2 ] || { echo "  gpu_compare did not start"; exit 4; }
        echo "  reelctl and gpu_compare start"
        rm -rf "$D"
        [ "$3" = yes ] && exit 0
        out=$(OUT= timeout 120 deploy/gpu-check.sh --quick --bundle "$2" 2>&1); rc=$?
        echo "$out" | grep -E "^  (glibc|libraries|sources):" | sed "s/^/  /"
        last=$(echo "$out" | tail -1)
        echo "  gpu-check.sh --quick: exit $rc, last line: $last"
        [ "$rc" != 0 ] && [ "${last#gpu-check: FAIL }" != "$last" ] || exit 5
        echo "$out" | grep -q "^  libraries: all found" || { echo "  gpu-check did not get past its library check"; exit 5; }
        exit 0' _ "$T" "$BUNDLE" "$gpu_here" "$cudnn_dirs"
    local rc=$?
    rm -rf "$T" "$T".cudnn.*
    return $rc
}
if [ "$(id -u)" = 0 ] && unshare -m --propagation private true 2>/dev/null; then
    note "proof 2: in a mount namespace without Debian's libraries"
    ns_proof || { rm -rf "$BUNDLE"; die "the bundle does not stand alone without Debian's libraries (above)"; }
    echo "namespace_proof=yes" >>"$BUNDLE/MANIFEST"
else
    note "proof 2 skipped (needs root and unshare): the ldd table above is the proof"
    echo "namespace_proof=no" >>"$BUNDLE/MANIFEST"
    if [ "$gpu_here" = no ]; then
        out=$(OUT= timeout 120 deploy/gpu-check.sh --quick --bundle "$BUNDLE" 2>&1); rc=$?
        last=$(printf '%s\n' "$out" | tail -1)
        echo "  gpu-check.sh --quick without a GPU: exit $rc, last line: $last"
        [ "$rc" != 0 ] && [[ $last == "gpu-check: FAIL "* ]] || { rm -rf "$BUNDLE"; die "gpu-check.sh did not FAIL in one final line without a GPU"; }
    fi
fi
[ "$gpu_here" = yes ] && note "a GPU is visible here: run deploy/gpu-check.sh yourself"

note "bundle $BUNDLE/: $(du -sh "$BUNDLE" | cut -f1) ($size bytes; unpacked $((unpacked / 1048576)) MiB: $(cd "$STAGE/bin" && ls | wc -l) binaries, $(cd "$STAGE/lib" && ls | wc -l) libraries); needs glibc >= $glibc_max, libstdc++ >= ${glibcxx_max:-any}"
note "carry it to the GPU machine as \"$BUNDLE\" and run: deploy/gpu-check.sh [--quick]"
