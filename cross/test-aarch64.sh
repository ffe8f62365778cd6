#!/usr/bin/env bash
# Cross-compiles the workspace for aarch64 and runs the tests of its
# platform and protocol crates under qemu-user, against Debian's arm64
# DPDK and librbd unpacked into a sysroot (the RBD tests' Ceph cluster
# runs natively; the aarch64 librbd talks to it over loopback).
set -euo pipefail
cd "$(dirname "$0")/.."

# The build profile: `ci` by default (optimised like a release, without
# fat LTO; see Cargo.toml), `release` for what ships: AARCH64_PROFILE=release.
profile=${AARCH64_PROFILE:-ci}
# Every binary of the workspace, which also sets up the toolchain and the
# arm64 DPDK sysroot; the tests below share its compiled dependencies.
cross/build-aarch64.sh --profile "$profile"
# shellcheck source=cross/env.sh
source cross/env.sh "$(cross/sysroot.sh)"
# qemu-user does not emulate setsockopt(SOL_PACKET, ...) (PACKET_VERSION,
# PACKET_AUXDATA, PACKET_FANOUT), so the tests that open packet sockets
# (the net_af_packet veth test, the kernel driver's socket and veth tests)
# cannot run here; they run natively. Nor do the rte_flow provider's
# net_tap tests (dataplane/tests/rte_flow_tap.rs): TAP devices need the TUN
# ioctls and TC netlink that qemu-user passes on unchecked, and their guest
# is an x86-64 kernel-nvme VM that runs the test binary itself; the flow
# builder they exercise is built for aarch64 above.
# Each test binary runs through cross/qemu-test.sh (see there). The
# control plane (dpu-control) is left to the native run: it is safe Rust
# with no code of its own per architecture (no intrinsics, no FFI), and
# its aarch64 build is checked by the binaries above.
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/cross/qemu-test.sh" \
cargo test --locked --profile "$profile" --target aarch64-unknown-linux-gnu -p dpdk-sys -p dpdk -p rbd-sys -p dpu-rbd -p dpu-os -p dpu-dataplane -p dpu-tls -p dpu-nvmeof -p dpu-endpoint \
  -- --skip ping_crosses_the_worker_between_two_namespaces \
  --skip loopback_frames_cross_between_two_sockets --skip fanout_groups_get_kernel_chosen_ids \
  --skip ping_crosses_the_kernel_driver --skip two_queues_per_port_share_the_traffic \
  --skip every_shape_validates_on_net_tap_but_for_what_net_tap_cannot_express \
  --skip without_an_embedded_switch_the_provider_only_drops_and_says_why \
  --skip a_drop_rule_drops_in_a_guest_kernel_with_tc_flower

# Smoke run of the aarch64 daemon just built under qemu-user: EAL up
# on --no-huge with net_pcap vdevs, gRPC health SERVING, a tenant created
# over gRPC by the native dpuctl, a packet forwarded between its two ports,
# and a clean exit on SIGTERM.
cargo build --locked -p dpu-client --bins
tdir=${CARGO_TARGET_DIR:-target}
daemon="$tdir/aarch64-unknown-linux-gnu/$profile/dpu-service"
dpuctl="$tdir/debug/dpuctl"
work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
hport=$(free_port)
# One broadcast ARP request, replayed forever by net_pcap (infinite_rx) so
# that it keeps arriving once the tenant exists.
python3 - "$work/in.pcap" <<'PY'
import struct, sys
frame = (b"\xff" * 6 + bytes.fromhex("020000000001") + b"\x08\x06"
         + bytes.fromhex("0001080006040001") + bytes.fromhex("020000000001")
         + bytes([10, 0, 0, 1]) + b"\x00" * 6 + bytes([10, 0, 0, 2]))
frame += b"\x00" * (60 - len(frame))
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    f.write(struct.pack("<IIII", 0, 0, len(frame), len(frame)) + frame)
PY
cat >"$work/smoke.toml" <<TOML
[grpc]
listen = "127.0.0.1:$port"
health_listen = "127.0.0.1:$hport"
[metrics]
listen = "127.0.0.1:0"
[state]
dir = "$work/state"
[dataplane]
no_huge = true
memory_mb = 256
idle = "backoff"
mbufs = 4095
file_prefix = "aarch64-smoke-$$"
[[ports]]
id = "p0"
driver = "dpdk"
device = "net_pcap0,rx_pcap=$work/in.pcap,infinite_rx=1,tx_pcap=$work/p0-out.pcap"
[[ports]]
id = "pf0vf0"
driver = "dpdk"
device = "net_pcap1,rx_pcap=$work/empty.pcap,tx_pcap=$work/out.pcap"
TOML
python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<IHHiIII",0xA1B2C3D4,2,4,0,0,65535,1))' "$work/empty.pcap"
qemu-aarch64-static -L "$SYSROOT" "$daemon" --config "$work/smoke.toml" --log-format human &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
ok=0
for _ in $(seq 1 300); do
  if "$dpuctl" --endpoint "http://127.0.0.1:$hport" --timeout 5 health >/dev/null 2>&1; then
    ok=1
    break
  fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
[ "$ok" = 1 ] || { echo "aarch64 smoke: health never became SERVING" >&2; exit 1; }
ctl=("$dpuctl" --endpoint "http://127.0.0.1:$port" --timeout 20)
info=$("${ctl[@]}" -o json info)
for want in '"targetTriple": "aarch64-unknown-linux-gnu"' '"dataplaneDriver": "dpdk"'; do
  echo "$info" | grep -q "$want" || { echo "aarch64 smoke: info lacks $want: $info" >&2; exit 1; }
done
"${ctl[@]}" tenant create smoke --default-policy allow --port p0 --port pf0vf0 >/dev/null
fwd=0
for _ in $(seq 1 150); do
  tx=$("${ctl[@]}" -o json port get pf0vf0 | python3 -c 'import json,sys; p=json.load(sys.stdin); print(int(p.get("counters", {}).get("txPackets", 0)))')
  if [ "$tx" -gt 0 ]; then
    fwd=1
    break
  fi
  sleep 0.2
done
[ "$fwd" = 1 ] || { echo "aarch64 smoke: nothing was forwarded to pf0vf0" >&2; "${ctl[@]}" counters >&2; exit 1; }
kill -TERM "$pid"
wait "$pid"
trap 'rm -rf "$work"' EXIT
# net_pcap wrote what pf0vf0 sent when the port closed: the ARP request.
python3 - "$work/out.pcap" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
assert len(data) > 24 + 16, f"out.pcap holds no packet ({len(data)} bytes)"
incl = struct.unpack_from("<IIII", data, 24)[2]
frame = data[40:40 + incl]
assert frame[12:14] == b"\x08\x06" and frame[:6] == b"\xff" * 6, frame.hex()
PY
echo "aarch64 smoke: EAL up under qemu, health SERVING, a packet forwarded p0 -> pf0vf0, clean exit"
