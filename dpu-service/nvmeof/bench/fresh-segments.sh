#!/usr/bin/env bash
# What a host writing where a RAM namespace holds no memory yet costs the
# other hosts of its poll group, for two builds of the daemon side by side
# in one sitting:
#
#   fresh-segments.sh --before OLD/dpu-service --after NEW/dpu-service \
#       [--perf nvmf-perf] [--dpuctl dpuctl] [--rounds 3] [--time 4] [--qd 16]
#
# Each round starts one build with one poll group, a "quiet" subsystem
# (64 MiB RAM, written through first) and a "fresh" one (8 GiB RAM, never
# written). A quiet host reads 4 KiB at QD 1 from the first while a busy
# host writes 128 KiB at QD 16 (--qd) sequentially into the second, so that
# a new 2 MiB segment starts every 16 writes; both nvmf-perf sleep in epoll
# between completions. Prints the quiet host's latency (p50, p99, p99.9,
# max) and the writer's IOPS, per build, as a Markdown table of medians.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
before="" after="" perf="" dpuctl="" rounds=3 secs=4 qd=16
while (($#)); do
  case "$1" in
    --before) shift; before=$(realpath "$1") ;;
    --after) shift; after=$(realpath "$1") ;;
    --perf) shift; perf=$(realpath "$1") ;;
    --dpuctl) shift; dpuctl=$(realpath "$1") ;;
    --rounds) shift; rounds=$1 ;;
    --time) shift; secs=$1 ;;
    --qd) shift; qd=$1 ;;
    *) echo "fresh-segments: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$before" ] && [ -x "$after" ] || { echo "fresh-segments: --before and --after must name dpu-service binaries" >&2; exit 2; }
perf=${perf:-$(dirname "$after")/nvmf-perf}
dpuctl=${dpuctl:-$(dirname "$after")/dpuctl}
work=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
grpc=$((30000 + $$ % 10000)) port=$((grpc + 1))
q=nqn.2024-01.io.dpu-service.bench:quiet f=nqn.2024-01.io.dpu-service.bench:fresh
run() { # build label
  rm -rf "$work/state"
  cat >"$work/config.toml" <<TOML
[log]
level = "warn"
[grpc]
listen = "127.0.0.1:$grpc"
[metrics]
listen = "127.0.0.1:0"
[state]
dir = "$work/state"
[storage]
poll_groups = 1
ram_limit = "16GiB"
TOML
  "$1" --config "$work/config.toml" 2>"$work/service.log" &
  pid=$!
  for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$grpc") 2>/dev/null && break; sleep 0.05; done
  ctl() { "$dpuctl" --endpoint "http://127.0.0.1:$grpc" "$@" >/dev/null; }
  ctl subsystem create quiet --nqn "$q" --allow-any-host
  ctl namespace create quiet --ram 64M
  ctl listener create quiet --address 127.0.0.1 --port "$port"
  ctl subsystem create fresh --nqn "$f" --allow-any-host
  ctl namespace create fresh --ram 8G
  ctl listener create fresh --address 127.0.0.1 --port "$port"
  "$perf" --addr "127.0.0.1:$port" --nqn "$q" --job write:128k:16 --time 1 >/dev/null
  "$perf" --addr "127.0.0.1:$port" --nqn "$f" --sleep --job "write:128k:$qd" --time "$((secs + 1))" >"$work/busy" &
  local w=$!
  sleep 0.5
  "$perf" --addr "127.0.0.1:$port" --nqn "$q" --sleep --job randread:4k:1 --time "$secs" >"$work/quiet"
  wait "$w"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  # quiet: IOPS p50 p99 p99.9 max; busy: IOPS
  echo "$2 $(awk '!/^#/ && !/^job/ {print $4, $6, $7, $8, $9}' "$work/quiet") $(awk '!/^#/ && !/^job/ {print $4}' "$work/busy")" >>"$work/rows"
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then run "$before" before; run "$after" after; else run "$after" after; run "$before" before; fi
done
echo "| build | quiet host IOPS | p50 µs | p99 µs | p99.9 µs | max µs | writer IOPS (128 KiB, fresh segments) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for b in before after; do
  awk -v b="$b" '$1 == b' "$work/rows" | python3 -c '
import sys, statistics
rows = [l.split()[1:] for l in sys.stdin if l.strip()]
cols = list(zip(*rows))
med = [statistics.median(float(x) for x in c) for c in cols]
runs = " / ".join(r[4] for r in rows)
print("| %s | %.0f | %.1f | %.1f | %.1f | %.1f (%s) | %.0f |" % (sys.argv[1], *med[:5], runs, med[5]))
' "$b"
done
