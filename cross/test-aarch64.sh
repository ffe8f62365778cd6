#!/usr/bin/env bash
# Cross-compiles the DPDK crates for aarch64 and runs their tests under
# qemu-user, against Debian's arm64 DPDK unpacked into a sysroot.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
if ((${#need[@]})); then
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu

sysroot=$(cross/sysroot.sh)
# shellcheck source=cross/env.sh
source cross/env.sh "$sysroot"
cargo test --locked --target aarch64-unknown-linux-gnu -p dpdk-sys -p dpdk -p dpu-control "$@"
