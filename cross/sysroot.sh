#!/usr/bin/env bash
# Builds an arm64 sysroot holding Debian's DPDK, Ceph client (librbd,
# librados) and OpenSSL development files, for cross-compiling dpdk-sys,
# rbd-sys and openssl-sys (the NVMe/TCP secure channel) without a
# container engine. Debian's arm64
# libdpdk-dev cannot be co-installed with the amd64 one (rdma-core, ethtool
# and libfdt-dev conflict across architectures), so the packages are
# unpacked into a folder instead of installed.
#
# Usage: cross/sysroot.sh [DIR]   (default: target/aarch64-sysroot)
set -euo pipefail
cd "$(dirname "$0")/.."
sysroot=$(realpath -m "${1:-target/aarch64-sysroot}")
# What the sysroot holds; one made for another list is made again.
want=(libdpdk-dev:arm64 librbd-dev:arm64 librados-dev:arm64 libssl-dev:arm64)
stamp="$sysroot/.complete"
[ "$(cat "$stamp" 2>/dev/null)" = "${want[*]}" ] && { echo "$sysroot"; exit 0; }

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
added_arch=0
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${sudo_cmd[@]}" dpkg --add-architecture arm64
  added_arch=1
fi
cleanup() {
  if [ "$added_arch" = 1 ]; then
    "${sudo_cmd[@]}" dpkg --remove-architecture arm64 || true
    "${sudo_cmd[@]}" apt-get update -qq || true
  fi
}
trap cleanup EXIT
"${sudo_cmd[@]}" apt-get update -qq

# Every arm64 package a real install of these would bring in.
mapfile -t pkgs < <(apt-get install -s -y "${want[@]}" 2>/dev/null \
  | awk '/^Inst / && /arm64\]/ { print $2 }' | sed 's/:arm64$//' | sort -u)
[ "${#pkgs[@]}" -gt 0 ] || { echo "sysroot: apt found no arm64 packages for ${want[*]}" >&2; exit 1; }

debs=$(mktemp -d)
(cd "$debs" && apt-get download -qq "${pkgs[@]/%/:arm64}")
rm -rf "$sysroot" && mkdir -p "$sysroot"
for d in "$debs"/*.deb; do dpkg -x "$d" "$sysroot"; done
rm -rf "$debs"
echo "${want[*]}" >"$stamp"
echo "$sysroot"
