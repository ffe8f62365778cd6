#!/usr/bin/env bash
# How much of its IOPS a well-behaved NVMe/TCP host keeps while hostile and
# numerous peers attack the real binary: runs the end-to-end tests of
# tests/tests/e2e/nvme_hostile.rs one at a time, alone, with each
# `nvmf-perf` job (4 KiB random reads, QD 4, one queue) running SECONDS
# (default 3) before and during each attack, and prints a table of both
# figures and their ratio per attack. The tests themselves only assert
# that the host is served; this is the measurement.
#
# Usage: tests/bench/nvme-hostile.sh [SECONDS]   (as root, like the tests)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-3}
tests/deps.sh
cargo build --locked --workspace --bins -q
log=$(mktemp)
trap 'rm -f "$log"' EXIT
DPU_HOSTILE_PERF_SECS=$secs cargo test --locked -q -p dpu-e2e --test e2e nvme_hostile:: \
  -- --test-threads=1 --nocapture 2>&1 | tee "$log" >&2
echo
echo "| attack | IOPS before | IOPS during | during/before |"
echo "|---|---:|---:|---:|"
grep -o 'hostile: .*' "$log" | sed 's/^hostile: //' | while IFS=$'\t' read -r attack before during; do
  ratio=$(python3 -c "print(f'{$during / $before:.2f}' if $before else 'n/a')")
  echo "| $attack | $before | $during | $ratio |"
done
