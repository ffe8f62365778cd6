#!/usr/bin/env bash
# Checks cross/Containerfile the way `cross` uses it: builds the image, then
# runs cargo inside it with the host's Rust toolchain and the workspace
# mounted (as cross mounts them) to build the aarch64 daemon, and checks the
# result is an aarch64 executable.
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
buildah run --isolation chroot \
  -v "$rustup_home:/rust/rustup" -v "$cargo_home:/rust/cargo" -v "$PWD:/project" -v "$tdir:/target" \
  --workingdir /project \
  --env RUSTUP_HOME=/rust/rustup --env CARGO_HOME=/rust/cargo --env CARGO_TARGET_DIR=/target \
  --env PATH=/rust/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  "$c" -- /rust/cargo/bin/cargo build --locked --target aarch64-unknown-linux-gnu -p dpu-service
bin="$tdir/aarch64-unknown-linux-gnu/debug/dpu-service"
machine=$(readelf -h "$bin" | sed -n 's/^ *Machine: *//p')
[ "$machine" = "AArch64" ] || { echo "cross image: $bin is built for '$machine', not AArch64" >&2; exit 1; }
echo "cross image: builds the aarch64 daemon ($bin, $machine)"
