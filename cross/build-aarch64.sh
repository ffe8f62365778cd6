#!/usr/bin/env bash
# Builds the whole workspace for the DPU's Arm cores (aarch64-unknown-linux-gnu)
# without a container engine: the rustup target, Debian's cross gcc and
# Debian's arm64 DPDK unpacked into a sysroot (cross/sysroot.sh).
#
# Usage: cross/build-aarch64.sh [--debug | --profile NAME] [cargo build arguments...]
#   Default: a release build of every binary of the workspace, in
#   ${CARGO_TARGET_DIR:-target}/aarch64-unknown-linux-gnu/release/.
#   --profile NAME builds with that cargo profile instead (CI uses `ci`:
#   optimised, without fat LTO), in .../aarch64-unknown-linux-gnu/NAME/.
# Installs what it needs on Debian (gcc-aarch64-linux-gnu, qemu-user-static,
# libclang-dev, the rustup target). With a container engine, `cross` does the
# same in the image of cross/Containerfile (see cross/Cross.toml).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=(--release)
if [ "${1:-}" = "--debug" ]; then
  profile=()
  shift
elif [ "${1:-}" = "--profile" ]; then
  profile=(--profile "$2")
  shift 2
fi

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || need+=(libclang-dev)
if ((${#need[@]})); then
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu

sysroot=$(cross/sysroot.sh)
# shellcheck source=cross/env.sh
source cross/env.sh "$sysroot"
if (($#)); then
  cargo build --locked --target aarch64-unknown-linux-gnu "${profile[@]}" "$@"
else
  cargo build --locked --target aarch64-unknown-linux-gnu "${profile[@]}" --workspace --bins
fi
