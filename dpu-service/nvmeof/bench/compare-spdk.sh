#!/usr/bin/env bash
# Side-by-side benchmark of NVMe/TCP targets with one initiator (nvmf-perf)
# in one sitting: SPDK's nvmf_tgt (malloc bdev), our bare target
# (examples/nvmf-target) and the dpu-service daemon itself (RAM namespace
# from its configuration). Each target runs alone, pinned to CPU 0; the
# generator runs on CPU 1. Every target gets a fresh 1 GiB RAM namespace,
# written through once (sequential 128 KiB) before it is measured, so reads
# copy real memory everywhere. Rounds alternate the targets; the table gives
# the median IOPS of the rounds, the median p50/p99, and ours/SPDK ratios.
#
# Usage: dpu-service/nvmeof/bench/compare-spdk.sh [--spdk DIR] [--rounds N]
#            [--time SECONDS] [--job PATTERN:BS:QD[xCONNS]]... [--spdk-perf]
#            [--perf NVMF_PERF] [--tls]
#   DIR: an SPDK tree built with its TCP transport (build/bin/nvmf_tgt and
#   scripts/rpc.py); by default what tests/spdk.sh gives: $SPDK_DIR,
#   else the tree the shared tool tools/spdk/build.sh builds (once per
#   machine, 4-7 minutes on 2 cores) or has built. Run as root (hugepages for SPDK, CPU pinning).
#   A job such as randread:4k:1x64 runs 64 I/O queues of QD 1 from one
#   nvmf-perf process (--conns 64; a controller per 64 queues).
#   --spdk-perf: each job also runs with SPDK's spdk_nvme_perf as the
#   generator (one controller, -P CONNS queue pairs, up to 64), rows
#   marked "(spdk_nvme_perf)".
#   --perf: the nvmf-perf binary to drive the jobs with (default: the one
#   this tree builds), e.g. an older build to compare generators.
#   --tls: every target's listener requires TLS 1.3 and the one host has
#   the specification's example key (SHA-256, TLS_AES_128_GCM_SHA256);
#   both generators connect with a version 0 identity (NVMe0R01), the only
#   one SPDK v23.05 knows (its derivations are the specification's).
set -euo pipefail
cd "$(dirname "$0")/../../.."

spdk=""
rounds=3
secs=3
jobs=()
spdk_perf=0
perf=""
tls=0
while (($#)); do
  case "$1" in
    --spdk) shift; spdk=$(realpath "$1") ;;
    --rounds) shift; rounds=$1 ;;
    --time) shift; secs=$1 ;;
    --job) shift; jobs+=("$1") ;;
    --spdk-perf) spdk_perf=1 ;;
    --perf) shift; perf=$(realpath "$1") ;;
    --tls) tls=1 ;;
    *) echo "compare-spdk: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$spdk" ]; then
  echo "compare-spdk: SPDK_DIR, or SPDK built (or reused) with the shared tool (tests/spdk.sh)" >&2
  spdk=$(tests/spdk.sh | tail -n 1)
fi
[ -x "$spdk/build/bin/nvmf_tgt" ] || { echo "compare-spdk: $spdk must hold build/bin/nvmf_tgt" >&2; exit 2; }
((${#jobs[@]})) || jobs=(randread:4k:1 randread:4k:32 randread:4k:128 randwrite:4k:32 read:128k:16
  randread:4k:16x4 randread:4k:4x16 randread:4k:1x64 randread:4k:1x256)

cargo build --release --locked -q -p dpu-nvmeof --example nvmf-target --bin nvmf-perf
cargo build --release --locked -q -p dpu-service
tdir=${CARGO_TARGET_DIR:-target}
perf=${perf:-"$tdir/release/nvmf-perf"}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# With --tls: the host's key file and NQN, what each target is given and
# what each generator connects with.
host=nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000a1
key=$work/host.psk
perf_args=() spdk_args=() spdk_host=""
if ((tls)); then
  (umask 077; printf 'NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:' >"$key")
  perf_args=(--hostnqn "$host" --tls-key "$key" --tls-identity 0)
  spdk_args=(-S ssl --psk-path "$key")
  spdk_host=" hostnqn:$host"
fi

# SPDK wants hugepages: 1 GiB for the bdev and its own pools.
# shellcheck source=dpu-service/nvmeof/bench/spdk-env.sh
. dpu-service/nvmeof/bench/spdk-env.sh
spdk_env "$spdk"

start_spdk() {
  taskset -c 0 "$spdk/build/bin/nvmf_tgt" -m 0x1 -u -r "$work/spdk.sock" >"$work/spdk.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  local rpc=(python3 "$spdk/scripts/rpc.py" -s "$work/spdk.sock" -t 30)
  for _ in $(seq 1 100); do [ -S "$work/spdk.sock" ] && break; sleep 0.1; done
  # Queues deep enough for QD 128 (SPDK defaults to 128 entries, QD 127),
  # and as many queue pairs per controller as ours grants.
  "${rpc[@]}" nvmf_create_transport -t TCP -q 256 -m 65 >/dev/null
  "${rpc[@]}" bdev_malloc_create -b Malloc0 1024 512 >/dev/null
  if ((tls)); then
    # SPDK refuses a secure channel on a subsystem that allows any host.
    "${rpc[@]}" nvmf_create_subsystem "$nqn" -s SPDK0001 >/dev/null
    "${rpc[@]}" nvmf_subsystem_add_ns "$nqn" Malloc0 >/dev/null
    "${rpc[@]}" nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$port" -k >/dev/null
    "${rpc[@]}" nvmf_subsystem_add_host "$nqn" "$host" --psk "$key" >/dev/null
  else
    "${rpc[@]}" nvmf_create_subsystem "$nqn" -a -s SPDK0001 >/dev/null
    "${rpc[@]}" nvmf_subsystem_add_ns "$nqn" Malloc0 >/dev/null
    "${rpc[@]}" nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$port" >/dev/null
  fi
}

start_ours() {
  local args=()
  ((tls)) && args=(--tls-key "$host=$key" --secure-channel required)
  taskset -c 0 "$tdir/release/examples/nvmf-target" --listen "127.0.0.1:$port" --ram 1G --nqn "$nqn" \
    "${args[@]}" >"$work/ours.log" 2>&1 &
  pid=$!
  pids+=("$pid")
}

start_daemon() {
  cat >"$work/daemon.toml" <<TOML
[grpc]
listen = "127.0.0.1:0"
[metrics]
listen = "127.0.0.1:0"
[log]
level = "warn"
[storage]
ram_limit = "2GiB"
[[storage.subsystems]]
id = "bench"
nqn = "$nqn"
allow_any_host = true
$( ((tls)) && printf 'host_tls = { "%s" = { psk_file = "%s" } }' "$host" "$key")
[[storage.subsystems.namespaces]]
ram = "1GiB"
[[storage.subsystems.listeners]]
address = "127.0.0.1"
port = $port
$( ((tls)) && echo 'secure_channel = "required"')
TOML
  rm -rf "$work/state"
  taskset -c 0 "$tdir/release/dpu-service" --config "$work/daemon.toml" --state-dir "$work/state" >"$work/daemon.log" 2>&1 &
  pid=$!
  pids+=("$pid")
}

# One job with SPDK's initiator as the generator, on CPU 1 (256 MiB of
# hugepages); appends a row like nvmf-perf's.
spdk_generator() {
  local target=$1 round=$2 job=$3 conns=$4 rw bs qd
  IFS=: read -r rw bs qd <<<"$job"
  "$spdk/build/bin/spdk_nvme_perf" -c 0x2 -s 256 -L \
    -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn$spdk_host" "${spdk_args[@]}" \
    -o "$(( ${bs%k} * 1024 ))" -w "$rw" -q "$qd" -P "$conns" -t "$secs" >"$work/spdk-perf.out" 2>&1 || {
      echo "spdk_nvme_perf failed against $target:" >&2; tail -20 "$work/spdk-perf.out" >&2; return 0; }
  python3 - "$work/spdk-perf.out" "$target" "$round" "$rw ${bs} QD${qd}x${conns} (spdk_nvme_perf)" >>"$results" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
total = [l for l in text.splitlines() if l.strip().startswith("Total")][-1].split()
iops, mbs = float(total[2]), float(total[3])
def pct(p):
    m = re.findall(r"^\s*" + p + r"%\s*:\s*([0-9.]+)us", text, re.M)
    return max(float(v) for v in m) if m else 0.0
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{sys.argv[4]}\t{iops}\t{mbs}\t{pct('50.00000')}\t{pct('99.00000')}")
PY
}

results="$work/results.tsv"
port=24420
for round in $(seq 1 "$rounds"); do
  for target in spdk ours daemon; do
    port=$((port + 1))
    nqn="nqn.2016-06.io.dpu-service:bench-$target"
    "start_$target"
    wait_port "$port" || { cat "$work/$target.log" >&2; exit 1; }
    taskset -c 1 "$perf" --addr "127.0.0.1:$port" --nqn "$nqn" "${perf_args[@]}" --job write:128k:16 --time 2 >/dev/null
    for j in "${jobs[@]}"; do
      conns=1 job=$j
      case "$j" in *x*) conns=${j##*x}; job=${j%x*} ;; esac
      taskset -c 1 "$perf" --addr "127.0.0.1:$port" --nqn "$nqn" "${perf_args[@]}" --time "$secs" --job "$job" --conns "$conns" \
        | awk -v t="$target" -v r="$round" '$3 ~ /^QD/ { print t "\t" r "\t" $1 " " $2 " " $3 "\t" $4 "\t" $5 "\t" $6 "\t" $7 }' >>"$results"
      if ((spdk_perf)) && ((conns <= 64)); then
        spdk_generator "$target" "$round" "$job" "$conns"
      fi
    done
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    echo "round $round: $target done" >&2
  done
done

python3 - "$results" "$rounds" "$tls" <<'PY'
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
over = ", every connection over TLS 1.3 (PSK)" if sys.argv[3] == "1" else ""
print(f"median of {sys.argv[2]} rounds; target on CPU 0, nvmf-perf on CPU 1{over}\n")
print("| job | SPDK nvmf_tgt IOPS | ours (bare) IOPS | dpu-service IOPS | bare/SPDK | daemon/SPDK | p50 µs SPDK/bare/daemon | p99 µs SPDK/bare/daemon |")
print("|---|---|---|---|---|---|---|---|")
for job in order:
    s, o, d = (rows[(t, job)] for t in ("spdk", "ours", "daemon"))
    iops = [med([x[0] for x in v]) for v in (s, o, d)]
    p50 = [med([x[2] for x in v]) for v in (s, o, d)]
    p99 = [med([x[3] for x in v]) for v in (s, o, d)]
    runs = lambda v: "/".join(f"{x[0]/1000:.0f}K" for x in v)
    print(f"| {job} | {iops[0]:,.0f} ({runs(s)}) | {iops[1]:,.0f} ({runs(o)}) | {iops[2]:,.0f} ({runs(d)}) "
          f"| {iops[1]/iops[0]:.2f}× | {iops[2]/iops[0]:.2f}× "
          f"| {p50[0]:.0f} / {p50[1]:.0f} / {p50[2]:.0f} | {p99[0]:.0f} / {p99[1]:.0f} / {p99[2]:.0f} |")
PY
