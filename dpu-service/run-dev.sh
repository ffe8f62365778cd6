#!/usr/bin/env bash
# Runs dpu-service for development on this machine: gRPC on 127.0.0.1:50051,
# metrics on 127.0.0.1:9464, state under target/dev-state, and the switch on
# four TAP interfaces (p0, pf0vf0..pf0vf2). Creating TAP interfaces needs
# root or CAP_NET_ADMIN and /dev/net/tun; without them the ports exist for
# the API only (--no-dataplane). Extra arguments go to dpu-service (see
# --help).
set -euo pipefail
cd "$(dirname "$0")/.."

# True if this process may create TAP interfaces: /dev/net/tun is there to
# open, and CAP_NET_ADMIN (bit 12) is among the effective capabilities.
can_create_taps() {
  [ -c /dev/net/tun ] && [ -r /dev/net/tun ] && [ -w /dev/net/tun ] || return 1
  local caps
  caps=$(awk '/^CapEff:/ { print $2 }' /proc/self/status 2>/dev/null) || return 1
  [ -n "$caps" ] && (( (16#$caps >> 12) & 1 ))
}

tests/deps.sh
args=()
if ! can_create_taps; then
  echo "run-dev: no TAP interfaces (they need root or CAP_NET_ADMIN, and /dev/net/tun): starting with the ports for the API only (--no-dataplane)" >&2
  args+=(--no-dataplane)
fi
exec cargo run --release --locked -p dpu-service -- \
  --config dpu-service/daemon/config/dev.toml "${args[@]}" "$@"
