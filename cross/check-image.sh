#!/usr/bin/env bash
# Checks cross/Containerfile the way `cross` uses it: builds the image, then
# runs cargo inside it with the host's Rust toolchain and the workspace
# mounted (as cross mounts them) to build and link, for aarch64, what needs
# the image's C side: dpdk-sys (bindgen with the image's libclang, the shim
# with its aarch64 gcc, against the arm64 DPDK of its sysroot) and the
# dpdk crate's tests, linked against that DPDK with its linker; and checks
# the results are aarch64 executables. The rest of the workspace is pure
# Rust (and ring, built with the same gcc), which the aarch64 stage of CI
# already builds, tests and runs with the same settings (cross/env.sh,
# whose values the image's environment must hold, checked first).
#
# Usage: cross/check-image.sh [--base IMAGE]
#   --base IMAGE  build FROM this image instead of docker.io/library/debian:bookworm
#                 (CI passes the debootstrap base made by images/build.sh)
# Needs buildah (installed if missing); no Docker daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

from=()
if [ "${1:-}" = "--base" ]; then
  from=(--from "$2")
fi
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
if ! command -v buildah >/dev/null; then
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends buildah >/dev/null
fi

img=localhost/dpu-service-cross:check
buildah rmi "$img" >/dev/null 2>&1 || true # one an interrupted run left
buildah bud --quiet --isolation chroot "${from[@]}" -f cross/Containerfile -t "$img" . >/dev/null
tdir=$(realpath -m "${CARGO_TARGET_DIR:-target}/cross-image")
mkdir -p "$tdir"
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
c=$(buildah from --quiet --pull-never "$img")
# The image exists only for this check (2 GB): removed with its container.
trap 'buildah rm "$c" >/dev/null 2>&1 || true; buildah rmi "$img" >/dev/null 2>&1 || true' EXIT
# The image's environment is cross/env.sh's, with the sysroot at /opt.
vars='^(SYSROOT|PKG_CONFIG_[A-Z_]+|CC_aarch64[a-z_]*|CFLAGS_aarch64[a-z_]*|BINDGEN_[A-Z_]+_aarch64[a-z_]*|CARGO_TARGET_AARCH64_[A-Z_]+)='
want=$(env -i PATH="$PATH" bash -c 'source cross/env.sh /opt/aarch64-sysroot; env' | grep -E "$vars" | sort)
have=$(buildah inspect --type container --format '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' "$c" | grep -E "$vars" | sort)
if [ "$want" != "$have" ]; then
  echo "cross image: its environment differs from cross/env.sh's:" >&2
  diff <(echo "$want") <(echo "$have") >&2 || true
  exit 1
fi
buildah run --isolation chroot \
  -v "$rustup_home:/rust/rustup" -v "$cargo_home:/rust/cargo" -v "$PWD:/project" -v "$tdir:/target" \
  --workingdir /project \
  --env RUSTUP_HOME=/rust/rustup --env CARGO_HOME=/rust/cargo --env CARGO_TARGET_DIR=/target \
  --env PATH=/rust/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  "$c" -- /rust/cargo/bin/cargo test --locked --no-run --target aarch64-unknown-linux-gnu -p dpdk-sys -p dpdk -p rbd-sys
n=0
for bin in "$tdir"/aarch64-unknown-linux-gnu/debug/deps/{dpdk_sys,dpdk,net_ring}-*; do
  [ -x "$bin" ] && [ -f "$bin" ] || continue
  machine=$(readelf -h "$bin" | sed -n 's/^ *Machine: *//p')
  [ "$machine" = "AArch64" ] || { echo "cross image: $bin is built for '$machine', not AArch64" >&2; exit 1; }
  n=$((n + 1))
done
[ "$n" -ge 3 ] || { echo "cross image: found $n aarch64 test executables of dpdk-sys and dpdk" >&2; exit 1; }
for bin in "$tdir"/aarch64-unknown-linux-gnu/debug/deps/net_ring-*; do
  [ -x "$bin" ] && [ -f "$bin" ] || continue
  readelf -d "$bin" | grep -q 'librte_eal' || { echo "cross image: $bin does not link DPDK's EAL" >&2; exit 1; }
done
rbd=0
for bin in "$tdir"/aarch64-unknown-linux-gnu/debug/deps/rbd_sys-*; do
  [ -x "$bin" ] && [ -f "$bin" ] || continue
  readelf -d "$bin" | grep -q 'librbd' || { echo "cross image: $bin does not link librbd" >&2; exit 1; }
  rbd=$((rbd + 1))
done
[ "$rbd" -ge 1 ] || { echo "cross image: no aarch64 test executable of rbd-sys" >&2; exit 1; }
echo "cross image: its environment is cross/env.sh's; it builds dpdk-sys and rbd-sys and links $n aarch64 test executables of the DPDK crates against its arm64 DPDK, $rbd of rbd-sys against its arm64 librbd"
