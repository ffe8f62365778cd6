#!/usr/bin/env bash
# Runs the whole test suite: unit and property tests of every crate, and the
# end-to-end tests that start the real dpu-service binary and drive it with
# dpuctl, the client library, HTTP and a foreign (Python grpcio) client.
set -euo pipefail
cd "$(dirname "$0")/.."

tests/deps.sh
# The end-to-end tests start the binaries, so build them first; and
# nvmf-perf with its memif feature (its own TCP/IP stack on a DPDK memif
# port) as nvmf-perf-memif, for the storage endpoint on the DPDK data plane.
cargo build --locked -p dpu-nvmeof --features memif --bin nvmf-perf
cp "${CARGO_TARGET_DIR:-target}/debug/nvmf-perf" "${CARGO_TARGET_DIR:-target}/debug/nvmf-perf-memif"
cargo build --workspace --bins --locked
cargo test --workspace --locked "$@"
