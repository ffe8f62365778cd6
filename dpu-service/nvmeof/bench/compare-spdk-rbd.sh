#!/usr/bin/env bash
# Side-by-side benchmark of NVMe/TCP targets serving one RBD image of one
# Ceph cluster, with one initiator (nvmf-perf), in one sitting: SPDK's
# nvmf_tgt with its bdev_rbd (librbd, as SPDK users get it) and our bare
# target (examples/nvmf-target --rbd, the daemon's target and backend).
# The cluster is a real single-node one (shared/tools/ceph: one monitor,
# one memstore OSD, cephx); its own figure (`rbd bench`, librbd with no
# NVMe/TCP in between) is printed beside them. Each target runs alone,
# pinned to CPU 0; the generator runs on CPU 1; the cluster's daemons run
# where the kernel puts them (the same for both). The image (512 MiB) is
# written through once before anything is measured. Rounds alternate the
# targets; the table gives the median IOPS of the rounds, the median
# p50/p99, and ours/SPDK.
#
# Usage: dpu-service/nvmeof/bench/compare-spdk-rbd.sh [--spdk DIR]
#            [--rounds N] [--time SECONDS] [--job PATTERN:BS:QD]...
#   DIR: an SPDK tree built with bdev_rbd (build/bin/nvmf_tgt and
#   scripts/rpc.py); by default what `tests/spdk.sh --with-rbd` gives.
#   Run as root.
set -euo pipefail
cd "$(dirname "$0")/../../.."

spdk=""
rounds=3
secs=5
jobs=()
while (($#)); do
  case "$1" in
    --spdk) shift; spdk=$(realpath "$1") ;;
    --rounds) shift; rounds=$1 ;;
    --time) shift; secs=$1 ;;
    --job) shift; jobs+=("$1") ;;
    *) echo "compare-spdk-rbd: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
shared=""
for d in ../shared /work/shared; do [ -d "$d/tools/ceph" ] && { shared=$(realpath "$d"); break; }; done
[ -n "$shared" ] || { echo "compare-spdk-rbd: no shared/tools/ceph beside the repository" >&2; exit 2; }
if [ -z "$spdk" ]; then
  echo "compare-spdk-rbd: SPDK_RBD_DIR, or SPDK with bdev_rbd built (or reused) with the shared tool (tests/spdk.sh --with-rbd)" >&2
  spdk=$(tests/spdk.sh --with-rbd | tail -n 1)
fi
[ -x "$spdk/build/bin/nvmf_tgt" ] || { echo "compare-spdk-rbd: $spdk must hold build/bin/nvmf_tgt" >&2; exit 2; }
((${#jobs[@]})) || jobs=(randread:4k:32 randwrite:4k:32 randread:128k:16 randwrite:128k:16)

cargo build --release --locked -q -p dpu-nvmeof --example nvmf-target --bin nvmf-perf
tdir=${CARGO_TARGET_DIR:-target}
perf="$tdir/release/nvmf-perf"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -d "$work/ceph" ] && "$shared/tools/ceph/ceph-down.sh" "$work/ceph" --purge >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# The cluster and its image, written through once.
CEPH_MON_PORT=auto CEPH_STORE_SIZE=$((4 << 30)) "$shared/tools/ceph/ceph-up.sh" "$work/ceph" >"$work/ceph-up.log" 2>&1 \
  || { cat "$work/ceph-up.log" >&2; exit 1; }
export CEPH_CONF="$work/ceph/ceph.conf"
mon_host=$(sed -n 's/^mon host = //p' "$CEPH_CONF")
awk '/key = / { print $3 }' "$work/ceph/keyring" >"$work/key"
rbd create rbd/vol --size 512M
rbd bench --io-type write --io-size 4M --io-pattern seq --io-total 512M rbd/vol >/dev/null
cluster_figure() {
  local type=$1 size=$2 threads=$3 total=$4
  rbd bench --io-type "$type" --io-size "$size" --io-threads "$threads" --io-total "$total" \
    --io-pattern rand rbd/vol 2>/dev/null | awk '/elapsed:/ { for (i = 1; i <= NF; i++) if ($i == "ops/sec:") print $(i + 1) }'
}

# shellcheck source=dpu-service/nvmeof/bench/spdk-env.sh
. dpu-service/nvmeof/bench/spdk-env.sh
spdk_env "$spdk"

start_spdk() {
  taskset -c 0 "$spdk/build/bin/nvmf_tgt" -m 0x1 -u -r "$work/spdk.sock" >"$work/spdk.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  local rpc=(python3 "$spdk/scripts/rpc.py" -s "$work/spdk.sock" -t 60)
  for _ in $(seq 1 100); do [ -S "$work/spdk.sock" ] && break; sleep 0.1; done
  "${rpc[@]}" nvmf_create_transport -t TCP -q 256 -m 65 >/dev/null
  "${rpc[@]}" bdev_rbd_register_cluster bench --user admin \
    --config-param "mon_host=$mon_host" --config-param "key=$(cat "$work/key")" >/dev/null
  "${rpc[@]}" bdev_rbd_create -b Rbd0 -c bench rbd vol 512 >/dev/null
  "${rpc[@]}" nvmf_create_subsystem "$nqn" -a -s SPDK0001 >/dev/null
  "${rpc[@]}" nvmf_subsystem_add_ns "$nqn" Rbd0 >/dev/null
  "${rpc[@]}" nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$port" >/dev/null
}

start_ours() {
  taskset -c 0 "$tdir/release/examples/nvmf-target" --listen "127.0.0.1:$port" --nqn "$nqn" \
    --rbd rbd/vol --mon-host "$mon_host" --ceph-user admin --ceph-key-file "$work/key" \
    >"$work/ours.log" 2>&1 &
  pid=$!
  pids+=("$pid")
}

results="$work/results.tsv"
port=25420
for round in $(seq 1 "$rounds"); do
  for target in spdk ours; do
    port=$((port + 1))
    nqn="nqn.2016-06.io.dpu-service:rbd-$target"
    "start_$target"
    wait_port "$port" || { cat "$work/$target.log" >&2; exit 1; }
    for job in "${jobs[@]}"; do
      taskset -c 1 "$perf" --addr "127.0.0.1:$port" --nqn "$nqn" --time "$secs" --job "$job" \
        | awk -v t="$target" -v r="$round" '$3 ~ /^QD/ { print t "\t" r "\t" $1 " " $2 " " $3 "\t" $4 "\t" $5 "\t" $6 "\t" $7 }' >>"$results"
    done
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    echo "round $round: $target done" >&2
  done
done

echo "the cluster's own figure (rbd bench, librbd, random, ops/s):"
echo "  4 KiB read x32 $(cluster_figure read 4K 32 64M), 4 KiB write x32 $(cluster_figure write 4K 32 64M)"
echo "  128 KiB read x16 $(cluster_figure read 128K 16 512M), 128 KiB write x16 $(cluster_figure write 128K 16 512M)"
echo
python3 - "$results" "$rounds" <<'PY'
import statistics, sys
from collections import defaultdict
rows = defaultdict(list)
order = []
for line in open(sys.argv[1]):
    t, r, job, iops, mbs, p50, p99 = line.rstrip("\n").split("\t")
    if job not in order:
        order.append(job)
    rows[(t, job)].append((float(iops), float(mbs), float(p50), float(p99)))
med = lambda xs: statistics.median(xs)
print(f"median of {sys.argv[2]} rounds; target on CPU 0, nvmf-perf on CPU 1, one RBD image\n")
print("| job | SPDK nvmf_tgt + bdev_rbd IOPS | ours IOPS | ours/SPDK | p50 µs SPDK/ours | p99 µs SPDK/ours |")
print("|---|---|---|---|---|---|")
for job in order:
    s, o = (rows[(t, job)] for t in ("spdk", "ours"))
    iops = [med([x[0] for x in v]) for v in (s, o)]
    p50 = [med([x[2] for x in v]) for v in (s, o)]
    p99 = [med([x[3] for x in v]) for v in (s, o)]
    runs = lambda v: "/".join(f"{x[0]/1000:.1f}K" for x in v)
    print(f"| {job} | {iops[0]:,.0f} ({runs(s)}) | {iops[1]:,.0f} ({runs(o)}) "
          f"| {iops[1]/iops[0]:.2f}× | {p50[0]:.0f} / {p50[1]:.0f} | {p99[0]:.0f} / {p99[1]:.0f} |")
PY
