#!/usr/bin/env bash
# Runs dpu-service for development on this machine: gRPC on 127.0.0.1:50051,
# metrics on 127.0.0.1:9464, state under target/dev-state. Extra arguments go
# to dpu-service (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."

tests/deps.sh
exec cargo run --release --locked -p dpu-service -- \
  --config dpu-service/dpu-service/config/dev.toml "$@"
