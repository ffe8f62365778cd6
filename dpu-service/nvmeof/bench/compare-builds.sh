#!/usr/bin/env bash
# Two builds of the bare target (examples/nvmf-target) side by side in one
# sitting: alternating rounds (before/after, then after/before), each target
# alone on CPU 0 with the same nvmf-perf on CPU 1, the same command lines,
# the namespace written through once before it is measured, one nvmf-perf
# run per job.
#
#   compare-builds.sh --before OLD_nvmf-target --after NEW_nvmf-target \
#       [--perf nvmf-perf] [--rounds 9] [--time 2] [--job PATTERN:BS:QD[xCONNS]]...
#
# A job such as randread:4k:1x64 runs 64 I/O queues of QD 1 from one
# nvmf-perf (--conns 64).
#
# Keep a copy of the old binary before rebuilding. On a shared machine a
# round is only kept when the target had CPU 0 for at least 85% of the job:
# it polls its socket, so uncontended it holds its core throughout, and less
# means another program took CPU 0 or starved the generator on CPU 1 (load
# from other containers does not show in ps). Prints medians of kept rounds
# as a Markdown table.
set -euo pipefail

before="" after="" perf="" rounds=9 secs=2 jobs=()
while (($#)); do
  case "$1" in
    --before) shift; before=$(realpath "$1") ;;
    --after) shift; after=$(realpath "$1") ;;
    --perf) shift; perf=$(realpath "$1") ;;
    --rounds) shift; rounds=$1 ;;
    --time) shift; secs=$1 ;;
    --job) shift; jobs+=("$1") ;;
    *) echo "compare-builds: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$before" ] && [ -x "$after" ] || { echo "compare-builds: --before and --after must name nvmf-target binaries" >&2; exit 2; }
if [ -z "$perf" ]; then
  cd "$(dirname "$0")/../../.."
  cargo build --release --locked -q -p dpu-nvmeof --bin nvmf-perf
  perf=$(realpath "${CARGO_TARGET_DIR:-target}/release/nvmf-perf")
fi
((${#jobs[@]})) || jobs=(read:128k:16 read:128k:1 randread:4k:32 randread:4k:1)

work=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }

port=26420
for r in $(seq 1 "$rounds"); do
  order="before after"; [ $((r % 2)) -eq 0 ] && order="after before"
  for t in $order; do
    port=$((port + 1)); nqn="nqn.2016-06.io.dpu-service:bench-$t"
    bin=$before; [ "$t" = after ] && bin=$after
    taskset -c 0 "$bin" --listen "127.0.0.1:$port" --ram 1G --nqn "$nqn" >"$work/$t.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
    taskset -c 1 "$perf" --addr "127.0.0.1:$port" --nqn "$nqn" --job write:128k:16 --time 2 >/dev/null
    for j in "${jobs[@]}"; do
      c0=$(cpu "$pid")
      # PATTERN:BS:QDxCONNS: CONNS queues of QD each, from one nvmf-perf.
      conns=1; case "$j" in *x*) conns=${j##*x}; j=${j%x*} ;; esac
      taskset -c 1 "$perf" --addr "127.0.0.1:$port" --nqn "$nqn" --time "$secs" --job "$j" --conns "$conns" \
        | awk -v t="$t" -v r="$r" -v c0="$c0" -v pid="$pid" '$3 ~ /^QD/ {
            getline s < ("/proc/" pid "/stat"); split(s, f, " ");
            print t "\t" r "\t" $1 " " $2 " " $3 "\t" $4 "\t" $6 "\t" $7 "\t" (f[14] + f[15] - c0) }' >>"$work/results.tsv"
    done
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=""
    echo "round $r: $t done" >&2
  done
done

python3 - "$work/results.tsv" "$secs" <<'PY'
import statistics, sys
from collections import defaultdict
secs = float(sys.argv[2])
rows, order, dropped = defaultdict(list), [], defaultdict(int)
for line in open(sys.argv[1]):
    t, r, job, iops, p50, p99, ticks = line.rstrip("\n").split("\t")
    if job not in order:
        order.append(job)
    if float(ticks) < 0.85 * secs * 100:
        dropped[t] += 1
        continue
    rows[(t, job)].append((float(iops), float(p50), float(p99)))
med = statistics.median
print("| job | before IOPS (kept rounds) | after IOPS (kept rounds) | after/before | p50 µs before/after | p99 µs before/after |")
print("|---|---|---|---|---|---|")
for job in order:
    b, a = rows[("before", job)], rows[("after", job)]
    if not b or not a:
        print(f"| {job} | no round kept | | | | |")
        continue
    m = lambda v, i: med([x[i] for x in v])
    runs = lambda v: "/".join(f"{x[0]/1000:.1f}K" for x in v)
    print(f"| {job} | {m(b,0):,.0f} ({runs(b)}) | {m(a,0):,.0f} ({runs(a)}) | {m(a,0)/m(b,0):.2f}× "
          f"| {m(b,1):.0f} / {m(a,1):.0f} | {m(b,2):.0f} / {m(a,2):.0f} |")
print(f"\nrounds dropped (target below 85% of CPU 0): before {dropped['before']}, after {dropped['after']}")
PY
