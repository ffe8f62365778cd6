#!/usr/bin/env bash
# Runs the whole test suite: unit and property tests of every crate, and the
# end-to-end tests that start the real dpu-service binary and drive it with
# dpuctl, the client library, HTTP and a foreign (Python grpcio) client.
set -euo pipefail
cd "$(dirname "$0")/.."

tests/deps.sh
# SPDK's initiator, which the SPDK interop tests run against the service
# (tests/spdk.sh): built once per machine, in the background at a lower
# priority while the workspace builds; the tests wait for it under the
# same lock, and fail if it cannot be built.
mkdir -p "${CARGO_TARGET_DIR:-target}"
nice -n 10 tests/spdk.sh >"${CARGO_TARGET_DIR:-target}/spdk-build.log" 2>&1 &
# The end-to-end tests start the binaries, so build them first; and
# nvmf-perf with its memif feature (its own TCP/IP stack on a DPDK memif
# port) as nvmf-perf-memif, for the storage endpoint on the DPDK data plane.
cargo build --locked -p dpu-nvmeof --features memif --bin nvmf-perf
cp "${CARGO_TARGET_DIR:-target}/debug/nvmf-perf" "${CARGO_TARGET_DIR:-target}/debug/nvmf-perf-memif"
cargo build --workspace --bins --locked
# The end-to-end tests spend much of their time waiting (guests booting,
# timeouts running out): three at a time on two cores finish about a
# fifth sooner than two, four another sixth sooner than three (339 s to
# 273-286 s for 103 tests). The rest are CPU-bound and keep one per core.
cargo test --workspace --locked --exclude dpu-e2e "$@"
RUST_TEST_THREADS=${RUST_TEST_THREADS:-4} cargo test --locked -p dpu-e2e "$@"
