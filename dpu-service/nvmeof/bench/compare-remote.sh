#!/usr/bin/env bash
# Remote namespaces: what our target adds in front of another NVMe/TCP
# target. The remote is SPDK's nvmf_tgt serving a 1 GiB malloc bdev
# (512-byte blocks; a target we did not write). One initiator (nvmf-perf)
# runs each job straight to SPDK ("direct") and through our bare target
# (examples/nvmf-target --remote: the daemon's target, transport and
# remote backend) serving that same namespace ("ours"), the two
# alternating job by job, N rounds. The table gives the median IOPS of the
# rounds, ours/direct, the median p50/p99 of each, "p50 added" (ours p50 -
# direct p50, µs), the CPU time our target spent per I/O (all its threads)
# and how much CPU other processes of the machine took meanwhile.
#
# Placement, and what it costs on a 2-core machine: SPDK's reactor
# busy-polls CPU 0 (taskset -c 0, -m 0x1). Our target is the "one core for
# our target": the whole process on CPU 1 (taskset -c 1, one poll group),
# since --io-cpus pins the poll groups only and the remote's initiator
# thread (nvmf-remote) would otherwise run anywhere. nvmf-perf runs on CPU
# 1 by default (--perf-cpu), as CPU 0 is spun by SPDK: straight to SPDK it
# has CPU 1 to itself; through ours it shares CPU 1 with our target. So
# three processes share two CPUs, and "ours" pays for the generator's CPU
# time where "direct" does not: read the ratios as a floor for a machine
# where the generator has a core of its own. --perf-cpu any leaves the
# generator to the scheduler instead (it then also competes with SPDK's
# spinning reactor).
#
# Usage: dpu-service/nvmeof/bench/compare-remote.sh [--spdk DIR]
#            [--rounds N] [--time SECONDS] [--job PATTERN:BS:QD]...
#            [--perf-cpu CPU|any] [--queue-depth N] [--max-other PCT]
#   DIR: an SPDK tree built with its TCP transport (build/bin/nvmf_tgt and
#   scripts/rpc.py); by default what tests/spdk.sh gives. Run as root
#   (hugepages for SPDK, CPU pinning). Defaults: 3 rounds, 5 s a job, jobs
#   randread:4k:32 randwrite:4k:32 randread:4k:1 randwrite:4k:1
#   randread:128k:16, --queue-depth 128 (the remote namespace's
#   --remote-queue-depth). A shared machine's other work (builds) skews
#   such a sitting: a run during which processes other than SPDK, ours and
#   nvmf-perf took more than PCT% of one CPU (default 10; /proc/stat less
#   the three processes' own time) is measured again, up to 3 tries, and
#   the table says how many runs stayed above it. Every command it waits
#   on is bounded (nvmf-perf by the job's time plus 60 s, SPDK's RPCs by
#   30 s, a listener by 30 s): a sitting takes about rounds x jobs x 2 x
#   (time + 1) s plus half a minute (2.5 minutes by default), up to three
#   times that when runs are measured again. On exit, however it ends, it
#   stops what it started.
set -euo pipefail
cd "$(dirname "$0")/../../.."

spdk=""
rounds=3
secs=5
jobs=()
perf_cpu=1
qd=128
max_other=10
while (($#)); do
  case "$1" in
    --spdk) shift; spdk=$(realpath "$1") ;;
    --rounds) shift; rounds=$1 ;;
    --time) shift; secs=$1 ;;
    --job) shift; jobs+=("$1") ;;
    --perf-cpu) shift; perf_cpu=$1 ;;
    --queue-depth) shift; qd=$1 ;;
    --max-other) shift; max_other=$1 ;;
    *) echo "compare-remote: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$spdk" ]; then
  echo "compare-remote: SPDK_DIR, or SPDK built (or reused) with the shared tool (tests/spdk.sh)" >&2
  spdk=$(tests/spdk.sh | tail -n 1)
fi
[ -x "$spdk/build/bin/nvmf_tgt" ] || { echo "compare-remote: $spdk must hold build/bin/nvmf_tgt" >&2; exit 2; }
((${#jobs[@]})) || jobs=(randread:4k:32 randwrite:4k:32 randread:4k:1 randwrite:4k:1 randread:128k:16)
if [ "$perf_cpu" = any ]; then
  on_perf_cpu=()
else
  on_perf_cpu=(taskset -c "$perf_cpu")
fi

cargo build --release --locked -q -p dpu-nvmeof --example nvmf-target --bin nvmf-perf
tdir=${CARGO_TARGET_DIR:-target}
perf="$tdir/release/nvmf-perf"
work=$(mktemp -d)
pids=()
# Stops what it started, ours before the remote it is connected to.
cleanup() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=dpu-service/nvmeof/bench/spdk-env.sh
. dpu-service/nvmeof/bench/spdk-env.sh
spdk_env "$spdk"

remote_port=26420
ours_port=26421
remote_nqn="nqn.2016-06.io.dpu-service:remote-spdk"
ours_nqn="nqn.2016-06.io.dpu-service:remote-ours"

echo "compare-remote: load at start: $(uptime | sed "s/.*load average: //")" >&2

# The remote: SPDK on CPU 0, for the whole sitting.
taskset -c 0 "$spdk/build/bin/nvmf_tgt" -m 0x1 -u -r "$work/spdk.sock" >"$work/spdk.log" 2>&1 &
spdk_pid=$!
pids+=("$spdk_pid")
rpc=(timeout 40 python3 "$spdk/scripts/rpc.py" -s "$work/spdk.sock" -t 30)
for _ in $(seq 1 100); do [ -S "$work/spdk.sock" ] && break; sleep 0.1; done
"${rpc[@]}" nvmf_create_transport -t TCP -q 256 -m 65 >/dev/null
"${rpc[@]}" bdev_malloc_create -b Malloc0 1024 512 >/dev/null
"${rpc[@]}" nvmf_create_subsystem "$remote_nqn" -a -s SPDK0001 >/dev/null
"${rpc[@]}" nvmf_subsystem_add_ns "$remote_nqn" Malloc0 >/dev/null
"${rpc[@]}" nvmf_subsystem_add_listener "$remote_nqn" -t tcp -a 127.0.0.1 -s "$remote_port" >/dev/null
wait_port "$remote_port" || { cat "$work/spdk.log" >&2; exit 1; }

# Ours on CPU 1, the whole process (poll group and initiator thread).
taskset -c 1 "$tdir/release/examples/nvmf-target" --listen "127.0.0.1:$ours_port" --nqn "$ours_nqn" \
  --poll-groups 1 --remote "127.0.0.1:$remote_port" --remote-nqn "$remote_nqn" \
  --remote-queue-depth "$qd" >"$work/ours.log" 2>&1 &
ours=$!
pids+=("$ours")
wait_port "$ours_port" || { cat "$work/ours.log" >&2; exit 1; }
for t in /proc/"$ours"/task/*; do
  echo "compare-remote: ours: thread $(cat "$t/comm") on CPUs $(awk '/Cpus_allowed_list/ { print $2 }' "$t/status")" >&2
done

# Written through once, straight to the remote, so reads copy real data.
timeout 60 "${on_perf_cpu[@]}" "$perf" --addr "127.0.0.1:$remote_port" --nqn "$remote_nqn" \
  --job write:128k:16 --time 3 >/dev/null

# Clock ticks: the machine's busy time (both CPUs, steal included), then
# SPDK's, ours' and this shell's waited-for children's (nvmf-perf).
ticks() {
  awk '$1 == "cpu" { print $2 + $3 + $4 + $9 }' /proc/stat
  awk '{ print $14 + $15 }' "/proc/$spdk_pid/stat" "/proc/$ours/stat"
  awk '{ print $16 + $17 }' "/proc/$$/stat"
}

# Runs job $2 on path $1 (direct or ours) into $work/out, and sets
# "others" to the CPU time, in % of one CPU, that processes other than
# SPDK, ours and nvmf-perf took meanwhile, and "ours_cpu" to our
# target's CPU ticks.
measure() {
  local addr=127.0.0.1:$remote_port nqn=$remote_nqn t0 t1 a b
  if [ "$1" = ours ]; then addr=127.0.0.1:$ours_port nqn=$ours_nqn; fi
  mapfile -t a < <(ticks)
  t0=$(date +%s%N)
  timeout $((secs + 60)) "${on_perf_cpu[@]}" "$perf" --addr "$addr" --nqn "$nqn" \
    --time "$secs" --job "$2" >"$work/out"
  t1=$(date +%s%N)
  mapfile -t b < <(ticks)
  others=$(awk -v busy=$((b[0] - a[0])) -v ours=$((b[1] + b[2] + b[3] - a[1] - a[2] - a[3])) \
    -v ns=$((t1 - t0)) -v hz="$hz" 'BEGIN { o = (busy - ours) / (ns / 1e9 * hz) * 100; printf "%.0f", o < 0 ? 0 : o }')
  ours_cpu=$((b[2] - a[2]))
}

hz=$(getconf CLK_TCK)
results="$work/results.tsv"
for round in $(seq 1 "$rounds"); do
  for job in "${jobs[@]}"; do
    for path in direct ours; do
      for try in 1 2 3; do
        measure "$path" "$job"
        ((others <= max_other)) && break
        echo "round $round, $job, $path: other processes took ${others}% of a CPU; measured again" >&2
      done
      awk -v p="$path" -v r="$round" -v cpu="$ours_cpu" -v hz="$hz" -v secs="$secs" -v o="$others" -v try="$try" \
        '$3 ~ /^QD/ { print p "\t" r "\t" $1 " " $2 " " $3 "\t" $4 "\t" $6 "\t" $7 "\t" ($4 > 0 ? cpu / hz / ($4 * secs) * 1e6 : 0) "\t" o "\t" try }' \
        "$work/out" >>"$results"
    done
  done
  echo "round $round done" >&2
done
kill -0 "$ours" 2>/dev/null || { echo "compare-remote: our target died:" >&2; cat "$work/ours.log" >&2; exit 1; }
echo "compare-remote: load at end: $(uptime | sed "s/.*load average: //")" >&2

python3 - "$results" "$rounds" "$perf_cpu" "$max_other" <<'PY'
import statistics, sys
from collections import defaultdict
rows = defaultdict(list)
order = []
for line in open(sys.argv[1]):
    p, r, job, iops, p50, p99, cpu, other, tries = line.rstrip("\n").split("\t")
    if job not in order:
        order.append(job)
    rows[(p, job)].append((float(iops), float(p50), float(p99), float(cpu), float(other), int(tries)))
med = statistics.median
print(f"median of {sys.argv[2]} rounds; SPDK (remote) on CPU 0, ours on CPU 1, nvmf-perf on CPU {sys.argv[3]}\n")
print("| job | direct IOPS | through ours IOPS | ours/direct | p50 µs direct/ours | p99 µs direct/ours | p50 added µs | ours CPU µs/IO | others' CPU % (most) direct/ours |")
print("|---|---|---|---|---|---|---|---|---|")
tainted = 0
for job in order:
    d, o = rows[("direct", job)], rows[("ours", job)]
    iops = [med([x[0] for x in v]) for v in (d, o)]
    p50 = [med([x[1] for x in v]) for v in (d, o)]
    p99 = [med([x[2] for x in v]) for v in (d, o)]
    cpu = med([x[3] for x in o])
    other = [max(x[4] for x in v) for v in (d, o)]
    tainted += sum(1 for x in d + o if x[4] > float(sys.argv[4]))
    runs = lambda v: "/".join(f"{x[0]/1000:.1f}K" for x in v)
    ratio = iops[1] / iops[0] if iops[0] else 0.0
    print(f"| {job} | {iops[0]:,.0f} ({runs(d)}) | {iops[1]:,.0f} ({runs(o)}) | {ratio:.2f}× "
          f"| {p50[0]:.0f} / {p50[1]:.0f} | {p99[0]:.0f} / {p99[1]:.0f} | {p50[1]-p50[0]:+.0f} | {cpu:.1f} "
          f"| {other[0]:.0f} / {other[1]:.0f} |")
print(f"\nothers' CPU: the most that processes other than SPDK, ours and nvmf-perf took during one run, in % of one CPU;"
      f" {tainted} run(s) kept above {sys.argv[4]}% after 3 tries")
PY
