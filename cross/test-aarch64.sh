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
# qemu-user does not emulate setsockopt(SOL_PACKET, PACKET_VERSION), so the
# net_af_packet veth test cannot open its ports here; it runs natively.
cargo test --locked --target aarch64-unknown-linux-gnu -p dpdk-sys -p dpdk -p dpu-dataplane -p dpu-control -p dpu-nvmeof \
  -- --skip ping_crosses_the_worker_between_two_namespaces

# Smoke run: the aarch64 daemon under qemu-user answers the native dpuctl.
cargo build --locked --target aarch64-unknown-linux-gnu -p dpu-service --bins
cargo build --locked -p dpu-client --bins
tdir=${CARGO_TARGET_DIR:-target}
state=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
qemu-aarch64-static -L "$SYSROOT" "$tdir/aarch64-unknown-linux-gnu/debug/dpu-service" --grpc-listen "127.0.0.1:$port" \
  --metrics-listen off --state-dir "$state" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$state"' EXIT
ok=0
for _ in $(seq 1 300); do
  if info=$("$tdir/debug/dpuctl" --endpoint "http://127.0.0.1:$port" --timeout 5 -o json info 2>/dev/null); then
    ok=1
    break
  fi
  sleep 0.2
done
[ "$ok" = 1 ] || { echo "aarch64 smoke: the daemon did not answer" >&2; exit 1; }
echo "$info" | grep -q '"targetTriple": "aarch64-unknown-linux-gnu"' || { echo "aarch64 smoke: unexpected info: $info" >&2; exit 1; }
kill -TERM "$pid"
wait "$pid"
echo "aarch64 smoke: daemon answered under qemu and stopped cleanly"
