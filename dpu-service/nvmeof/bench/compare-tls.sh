#!/usr/bin/env bash
# The secure channel's cost: one bare target (examples/nvmf-target) on
# CPU 0 whose listener allows TLS, the same nvmf-perf on CPU 1 as two
# hosts, one in clear text and one over TLS 1.3 (the key's SHA-256 suite,
# TLS_AES_128_GCM_SHA256), alternating in each round (clear/TLS, then
# TLS/clear). Both sides of a TLS run encrypt and decrypt.
#
#   compare-tls.sh [--target nvmf-target] [--perf nvmf-perf] [--rounds 5]
#       [--time 2] [--key FILE] [--job PATTERN:BS:QD[xCONNS]]...
#
# Every round is kept: over TLS the generator on CPU 1 decrypts what the
# target encrypts and may be the bound, so the table also gives the share
# of CPU 0 the target used (it busy polls: below 100% it waited for the
# generator, or something else took CPU 0). Prints medians as a Markdown
# table: TLS against clear text.
set -euo pipefail

target="" perf="" rounds=5 secs=2 key="" jobs=()
while (($#)); do
  case "$1" in
    --target) shift; target=$(realpath "$1") ;;
    --perf) shift; perf=$(realpath "$1") ;;
    --rounds) shift; rounds=$1 ;;
    --time) shift; secs=$1 ;;
    --key) shift; key=$(realpath "$1") ;;
    --job) shift; jobs+=("$1") ;;
    *) echo "compare-tls: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
cd "$(dirname "$0")/../../.."
if [ -z "$target" ] || [ -z "$perf" ]; then
  cargo build --release --locked -q -p dpu-nvmeof --bin nvmf-perf --example nvmf-target
  target=${target:-$(realpath "${CARGO_TARGET_DIR:-target}/release/examples/nvmf-target")}
  perf=${perf:-$(realpath "${CARGO_TARGET_DIR:-target}/release/nvmf-perf")}
fi
((${#jobs[@]})) || jobs=(randread:4k:32 read:128k:16 randwrite:4k:32 randread:4k:1)

work=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
# The specification's example key unless one is given.
[ -n "$key" ] || { key=$work/key; printf 'NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:' >"$key"; }

tls_host=nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000a1
clear_host=nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000c1
port=27420 nqn=nqn.2016-06.io.dpu-service:bench-tls
taskset -c 0 "$target" --listen "127.0.0.1:$port" --ram 1G --nqn "$nqn" \
  --tls-key "$tls_host=$key" --secure-channel allowed >"$work/target.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
taskset -c 1 "$perf" --addr "127.0.0.1:$port" --nqn "$nqn" --hostnqn "$clear_host" --job write:128k:16 --time 2 >/dev/null

for r in $(seq 1 "$rounds"); do
  order="clear tls"; [ $((r % 2)) -eq 0 ] && order="tls clear"
  for t in $order; do
    args=(--hostnqn "$clear_host")
    [ "$t" = tls ] && args=(--hostnqn "$tls_host" --tls-key "$key")
    for j in "${jobs[@]}"; do
      c0=$(cpu "$pid")
      conns=1; case "$j" in *x*) conns=${j##*x}; j=${j%x*} ;; esac
      taskset -c 1 "$perf" --addr "127.0.0.1:$port" --nqn "$nqn" "${args[@]}" --time "$secs" --job "$j" --conns "$conns" \
        | awk -v t="$t" -v r="$r" -v c0="$c0" -v pid="$pid" '$3 ~ /^QD/ {
            getline s < ("/proc/" pid "/stat"); split(s, f, " ");
            print t "\t" r "\t" $1 " " $2 " " $3 "\t" $4 "\t" $6 "\t" $7 "\t" (f[14] + f[15] - c0) }' >>"$work/results.tsv"
    done
    echo "round $r: $t done" >&2
  done
done
kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=""

python3 - "$work/results.tsv" "$secs" <<'PY'
import statistics, sys
from collections import defaultdict
secs = float(sys.argv[2])
rows, order = defaultdict(list), []
for line in open(sys.argv[1]):
    t, r, job, iops, p50, p99, ticks = line.rstrip("\n").split("\t")
    if job not in order:
        order.append(job)
    rows[(t, job)].append((float(iops), float(p50), float(p99), float(ticks) / (secs * 100)))
med = statistics.median
print("| job | clear text IOPS (rounds) | TLS IOPS (rounds) | TLS/clear | p50 µs clear/TLS | p99 µs clear/TLS | target CPU clear/TLS |")
print("|---|---|---|---|---|---|---|")
for job in order:
    b, a = rows[("clear", job)], rows[("tls", job)]
    m = lambda v, i: med([x[i] for x in v])
    runs = lambda v: "/".join(f"{x[0]/1000:.1f}K" for x in v)
    print(f"| {job} | {m(b,0):,.0f} ({runs(b)}) | {m(a,0):,.0f} ({runs(a)}) | {m(a,0)/m(b,0):.2f}× "
          f"| {m(b,1):.0f} / {m(a,1):.0f} | {m(b,2):.0f} / {m(a,2):.0f} | {m(b,3):.0%} / {m(a,3):.0%} |")
PY
