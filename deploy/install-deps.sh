#!/bin/sh
# install-deps.sh -- installs every build and test dependency of Reel from
# Debian's packages. Idempotent: does nothing (and needs no network) when all
# are present. Run as root on a fresh machine; `make test` and `make demo`
# call it first.
set -eu

PKGS="build-essential pkg-config libzmq3-dev libsodium-dev libssl-dev libmsgpack-dev \
libsqlite3-dev sqlite3 check libsubunit-dev libopenblas-dev libjansson-dev \
python3-numpy python3-zmq python3-msgpack clang libclang-rt-14-dev \
libmicrohttpd-dev prometheus python3-yaml iproute2 iptables chromium \
libsentencepiece-dev sentencepiece python3-sentencepiece \
libavformat-dev libavcodec-dev libswscale-dev libavutil-dev ffmpeg procps gdb"

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing"
if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing packages and not root; run: sudo $0" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing
