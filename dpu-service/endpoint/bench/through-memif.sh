#!/usr/bin/env bash
# Storage through a tenant's storage endpoint on the DPDK data plane,
# side by side with the kernel-socket listener of the same service, the
# same generator and settings, one sitting (as root):
#
#   dpu-service/endpoint/bench/through-memif.sh [--bin target/release] \
#       [--time 3] [--rounds 3] [--idle backoff|busy] [--job PATTERN:BS:QD]...
#       [--placement thread|worker] [--profile FILE]
#
# One service, confined to CPU 0 (taskset), DPDK without hugepages, one
# worker: its one switch port is a net_memif server. Tenant "blue" (default
# allow) has that port and a storage endpoint 10.79.0.250:4420 serving
# subsystem "ep" (256 MiB RAM); subsystem "k" (256 MiB RAM) listens on the
# kernel's loopback. The generator, nvmf-perf built with its `memif`
# feature, runs on CPU 1: for the endpoint it is a memif client with a
# TCP/IP stack of its own (smoltcp) as blue's host 10.79.0.5, so the
# frames go memif -> worker (switch, blue's rules and counters) ->
# endpoint queues -> the endpoint's smoltcp stack and NVMe/TCP target,
# and back, with no kernel network stack on either side; for the kernel
# sockets it is the same binary on loopback TCP. Rounds alternate the two;
# medians of the rounds.
#
# --placement sets storage.endpoint_placement: the endpoints' stacks in a
# thread of their own (the default) or in the worker.
#
# --profile FILE records the service with `perf record -g` while the
# endpoint serves each job of the first round (FILE.JOB), for where the
# cycles go.
#
# "per core" is I/Os over the CPU time the whole service used during the
# job (every thread of it on CPU 0: worker, endpoint thread, poll groups).
# The kernel-socket column leaves out what loopback TCP charges to the
# generator's CPU (the target's receive path runs there), so it flatters
# the kernel sockets.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

bin=target/release secs=3 rounds=3 idle=backoff jobs=() profile="" placement=thread
while (($#)); do
  case "$1" in
    --bin) shift; bin=$1 ;;
    --time) shift; secs=$1 ;;
    --rounds) shift; rounds=$1 ;;
    --idle) shift; idle=$1 ;;
    --job) shift; jobs+=("$1") ;;
    --profile) shift; profile=$1 ;;
    --placement) shift; placement=$1 ;;
    *) echo "through-memif: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
((${#jobs[@]})) || jobs=(randread:4k:1 randread:4k:32 read:128k:16)
cd "$(dirname "$0")/../../.."
cargo build --release --locked -q -p dpu-nvmeof --features memif --bin nvmf-perf
work=$(mktemp -d)
cp "${CARGO_TARGET_DIR:-target}/release/nvmf-perf" "$work/nvmf-perf"
perf_bin=$work/nvmf-perf
for b in dpu-service dpuctl; do
  [ -x "$bin/$b" ] || { echo "through-memif: no $bin/$b (cargo build --release -p dpu-service -p dpu-client --bins)" >&2; exit 2; }
done
bin=$(realpath "$bin")

pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

id=$$
# shellcheck source=dpu-service/endpoint/bench/common.sh
. "$here/common.sh"
cat >"$work/config.toml" <<EOF
[log]
level = "warn"

[storage]
ram_limit = "1GiB"
endpoint_placement = "$placement"

[dataplane]
workers = 1
idle = "$idle"
no_huge = true
memory_mb = 512
file_prefix = "through-memif-$id"
lcores = "0"

[[ports]]
id = "pf0vf0"
role = "vf"
driver = "dpdk"
device = "net_memif0,role=server,socket=$work/memif.sock"
EOF
start_service taskset -c 0
ctl tenant create blue --default-policy allow --port pf0vf0
storage_setup

gen() { # where: ep or k; then nvmf-perf arguments
  local where=$1; shift
  if [ "$where" = ep ]; then
    taskset -c 1 "$perf_bin" --memif "$work/memif.sock" --addr 10.79.0.250:4420 \
      --nqn nqn.2024-01.io.dpu-service.bench:ep "$@"
  else
    taskset -c 1 "$perf_bin" --addr "127.0.0.1:$kport" --nqn nqn.2024-01.io.dpu-service.bench:k "$@"
  fi
}
# The service's CPU time so far, in clock ticks (all its threads).
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)

for w in ep k; do gen "$w" --job write:128k:16 --time 2 >/dev/null; done
: >"$work/results.tsv"
for r in $(seq 1 "$rounds"); do
  order="ep k"; [ $((r % 2)) -eq 0 ] && order="k ep"
  for j in "${jobs[@]}"; do
    for w in $order; do
      rec=""
      if [ -n "$profile" ] && [ "$r" = 1 ] && [ "$w" = ep ]; then
        # From a second into the job (connected, past ARP), for a second.
        (sleep 1; perf record -q -g -p "$pid" -o "$profile.${j//:/-}" -- sleep 1 >/dev/null 2>&1) &
        rec=$!
      fi
      t0=$(ticks)
      line=$(gen "$w" --job "$j" --time "$secs" | awk '!/^#/ && !/^job/' | tail -1)
      t1=$(ticks)
      [ -n "$rec" ] && wait "$rec"
      # job name is three words (pattern, size, QD), then IOPS, MB/s, p50, p99.
      awk -v w="$w" -v j="$j" -v s="$secs" -v c="$((t1 - t0))" -v hz="$hz" \
        '{printf "%s\t%s\t%s\t%s\t%s\t%s\n", w, j, $4, $6, $7, ($4 * s) / (c > 0 ? c / hz : 1e-9)}' \
        <<<"$line" >>"$work/results.tsv"
    done
  done
  echo "round $r done" >&2
done

python3 - "$work/results.tsv" <<'PY'
import statistics, sys
from collections import defaultdict
rows, order = defaultdict(list), []
for line in open(sys.argv[1]):
    w, j, iops, p50, p99, per_core = line.rstrip("\n").split("\t")
    if j not in order:
        order.append(j)
    rows[(w, j)].append((float(iops), float(p50), float(p99), float(per_core)))
med = statistics.median
m = lambda v, i: med([x[i] for x in v])
print("| job | endpoint IOPS (rounds) | endpoint IOPS per core | endpoint p50 / p99 us | kernel sockets IOPS (rounds) | kernel sockets IOPS per core | kernel p50 / p99 us | endpoint/kernel per core |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for j in order:
    e, k = rows[("ep", j)], rows[("k", j)]
    runs = lambda v: "/".join(f"{x[0]/1000:.1f}K" for x in v)
    print(f"| {j} | {m(e,0):,.0f} ({runs(e)}) | {m(e,3):,.0f} | {m(e,1):.0f} / {m(e,2):.0f} "
          f"| {m(k,0):,.0f} ({runs(k)}) | {m(k,3):,.0f} | {m(k,1):.0f} / {m(k,2):.0f} | {m(e,3)/m(k,3):.2f}× |")
PY
# What was dropped on the way (none, unless a queue overflowed).
curl -s "127.0.0.1:$metrics/metrics" | grep -E '^dpu_dropped_packets_total' | grep -v ' 0$' >&2 || true
