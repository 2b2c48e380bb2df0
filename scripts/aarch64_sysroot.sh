#!/usr/bin/env bash
# An aarch64 CPython to run under qemu-aarch64, for tests/test_wheel_platforms.py (the cross-compiled C launch
# path loaded and launching on aarch64). Debian/Ubuntu, as root: installs qemu-user, downloads Debian's arm64
# python3 packages and unpacks them (no install: nothing of the host's Python changes) into DIR.
#   bash scripts/aarch64_sysroot.sh DIR && export FORGE_AARCH64_SYSROOT=DIR
set -euo pipefail
root=${1:?usage: aarch64_sysroot.sh DIR}
command -v apt-get > /dev/null || { echo "aarch64 sysroot: no apt-get" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
if ! command -v qemu-aarch64 > /dev/null; then
  apt-get update -q > /dev/null
  apt-get install -y -q qemu-user > /dev/null
fi
# arm64 package lists only while downloading: left on, a mirror without arm64 (Ubuntu's amd64 archive) would fail
# every later apt-get update of this machine
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  trap 'dpkg --remove-architecture arm64 2> /dev/null; apt-get update -q > /dev/null 2>&1' EXIT
fi
apt-get update -q > /dev/null
mkdir -p "$root/.debs"
python=$(apt-cache depends python3:arm64 2>/dev/null | sed -n 's/.*Depends: \(python3\.[0-9]*\):arm64.*/\1/p' | head -1)
python=${python:-python3.11}
(cd "$root/.debs" && apt-get download -q "$python-minimal:arm64" "lib$python-minimal:arm64" "lib$python-stdlib:arm64" \
    libc6:arm64 zlib1g:arm64 libexpat1:arm64 libffi8:arm64 libssl3:arm64 > /dev/null 2>&1)
for deb in "$root"/.debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
qemu-aarch64 -L "$root" "$root/usr/bin/$python" -c "import ctypes, json, platform; print(platform.machine())"
