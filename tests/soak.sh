#!/usr/bin/env bash
# The soak: one dpu-service under NVMe/TCP I/O with verification, verified
# TCP across the switch in two tenants, API churn, connection floods, a
# graceful restart and a kill -9, for SECONDS (default 300); then checks
# that nothing acknowledged was lost, no verified byte was wrong and the
# service's memory, file descriptors and threads came back
# (tests/src/bin/soak.rs says what each part does). Needs root (network
# namespaces) and what tests/deps.sh installs.
#
#   tests/soak.sh          # 5 minutes
#   tests/soak.sh 3600     # an hour
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-300}
cargo build --locked --bins
exec "${CARGO_TARGET_DIR:-target}/debug/soak" "$secs"
