#!/usr/bin/env bash
# Storage through a tenant's storage endpoint, side by side with the
# kernel-socket listener of the same service, same nvmf-perf settings, one
# sitting (as root):
#
#   dpu-service/endpoint/bench/through-switch.sh [--bin target/release] \
#       [--time 3] [--idle backoff|busy] [--mtu 1500] [--job PATTERN:BS:QD]...
#       [--placement thread|worker] [--tls]
#
# One service (kernel driver, one worker, idle backoff or busy) with one switch
# port: a veth pair whose other end is in a network namespace, the host
# of tenant "blue" (default allow). Subsystem "ep" (256 MiB RAM) listens
# at blue's endpoint 10.79.0.250:4420; subsystem "k" (256 MiB RAM) on
# 127.0.0.1. nvmf-perf runs in the namespace for the first (its frames
# cross the veth, the worker's packet sockets, the switch, the endpoint's
# queues and its smoltcp stack) and on the host's loopback for the second
# (the kernel's TCP, the target's poll groups). Each namespace is written
# through once before it is measured. Prints a Markdown table.
#
# Then a second tenant, "red", with two hosts on two more ports of the
# same worker: one sends TCP to the other (a Python bulk sender, TIME
# seconds) alone, and again while blue's host reads 128 KiB blocks at
# QD 16 from its endpoint; prints both rates.
#
# --placement sets storage.endpoint_placement: the endpoints' stacks in a
# thread of their own (the default) or in the worker.
#
# --tls: the endpoint's listener allows TLS, and the second column is the
# endpoint again over TLS (nvmf-perf --tls-key, a host with a key) instead
# of the kernel sockets; the first stays clear text (another host, without
# a key). Red's part is skipped.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

bin=target/release secs=3 idle=backoff mtu=1500 jobs=() placement=thread tls=0
while (($#)); do
  case "$1" in
    --bin) shift; bin=$1 ;;
    --time) shift; secs=$1 ;;
    --idle) shift; idle=$1 ;;
    --mtu) shift; mtu=$1 ;;
    --placement) shift; placement=$1 ;;
    --job) shift; jobs+=("$1") ;;
    --tls) tls=1 ;;
    *) echo "through-switch: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
((${#jobs[@]})) || jobs=(randread:4k:1 randread:4k:32 read:128k:16)
for b in dpu-service dpuctl nvmf-perf; do
  [ -x "$bin/$b" ] || { echo "through-switch: no $bin/$b (cargo build --release -p dpu-service -p dpu-client -p dpu-nvmeof --bins)" >&2; exit 2; }
done
bin=$(realpath "$bin")

id=$$ ns=epb$$ port_if=epb$$
work=$(mktemp -d)
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  for h in epb epr1 epr2; do
    ip link del "$h$id" 2>/dev/null || true
    ip netns del "$h$id" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# host NAME ADDR: namespace NAME with one end of a veth pair (NAME inside
# as NAMEp, NAME outside for the service).
host() {
  local n=$1 p=$1p
  ip netns add "$n"
  ip -n "$n" link set lo up
  ip link add "$n" type veth peer name "$p"
  ip link set "$p" netns "$n"
  ip netns exec "$n" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  sysctl -qw "net.ipv6.conf.$n.disable_ipv6=1"
  ethtool -K "$n" tx off tso off gso off gro off >/dev/null
  ip netns exec "$n" ethtool -K "$p" tx off tso off gso off gro off >/dev/null
  # Both ends at --mtu: the worker's buffers and the endpoint's IP MTU
  # follow the port's.
  ip link set "$n" mtu "$mtu"
  ip -n "$n" link set "$p" mtu "$mtu"
  ip -n "$n" addr add "$2" dev "$p"
  ip -n "$n" link set "$p" up
  ip link set "$n" up
}
host "epb$id" 10.79.0.5/24
host "epr1$id" 10.80.0.1/24
host "epr2$id" 10.80.0.2/24

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
mbufs = 8192

[[ports]]
id = "pf0vf0"
role = "vf"
driver = "kernel"
device = "$port_if"

[[ports]]
id = "pf0vf1"
role = "vf"
driver = "kernel"
device = "epr1$id"

[[ports]]
id = "pf0vf2"
role = "vf"
driver = "kernel"
device = "epr2$id"
EOF
start_service
ctl tenant create blue --default-policy allow --port pf0vf0
ctl tenant create red --default-policy allow --port pf0vf1 --port pf0vf2
second=k
if [ "$tls" = 1 ]; then
  export EP_CHANNEL=allowed
  second=tls
fi
storage_setup
# nvmf-perf's own host NQN has a key; the clear-text column is another host.
perf_host=nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001
clear_host=nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000002
if [ "$tls" = 1 ]; then
  head -c 32 /dev/urandom | python3 -c 'import sys,base64,zlib; k=sys.stdin.buffer.read(); print("NVMeTLSkey-1:01:"+base64.b64encode(k+zlib.crc32(k).to_bytes(4,"little")).decode()+":")' >"$work/key"
  ctl subsystem set-tls-key ep "$perf_host" --psk-file "$work/key"
fi

perf() { # where: ep, tls or k; then nvmf-perf arguments
  local where=$1; shift
  if [ "$where" = ep ]; then
    ip netns exec "$ns" "$bin/nvmf-perf" --addr 10.79.0.250:4420 --nqn nqn.2024-01.io.dpu-service.bench:ep \
      --hostnqn "$clear_host" "$@"
  elif [ "$where" = tls ]; then
    ip netns exec "$ns" "$bin/nvmf-perf" --addr 10.79.0.250:4420 --nqn nqn.2024-01.io.dpu-service.bench:ep \
      --tls-key "$work/key" "$@"
  else
    "$bin/nvmf-perf" --addr "127.0.0.1:$kport" --nqn nqn.2024-01.io.dpu-service.bench:k "$@"
  fi
}
for _ in $(seq 1 50); do ip netns exec "$ns" ping -c 1 -W 1 10.79.0.250 >/dev/null 2>&1 && break; sleep 0.1; done
for w in ep "$second"; do perf "$w" --job write:128k:16 --time 2 >/dev/null; done

if [ "$tls" = 1 ]; then
  echo "| job | endpoint IOPS | endpoint MB/s | endpoint p50 us | endpoint over TLS IOPS | over TLS MB/s | over TLS p50 us |"
else
  echo "| job | endpoint IOPS | endpoint MB/s | endpoint p50 us | kernel sockets IOPS | kernel sockets MB/s | kernel sockets p50 us |"
fi
echo "|---|---:|---:|---:|---:|---:|---:|"
tcp_per_io=()
for j in "${jobs[@]}"; do
  row="| $j"
  for w in ep "$second"; do
    [ "$w" = ep ] && NSTAT_HISTORY=$work/nstat ip netns exec "$ns" nstat -n
    line=$(perf "$w" --job "$j" --time "$secs" | awk '!/^#/ && !/^job/' | tail -1)
    # job name is three words (pattern, size, QD), then IOPS, MB/s, p50.
    row+=$(awk '{printf " | %s | %s | %s", $4, $5, $6}' <<<"$line")
    if [ "$w" = ep ]; then
      # The host's TCP counters over the job, per I/O (IOPS x seconds).
      ios=$(awk -v s="$secs" '{printf "%.0f", $4 * s}' <<<"$line")
      tcp_per_io+=("$j: $(NSTAT_HISTORY=$work/nstat ip netns exec "$ns" nstat -z 2>/dev/null | awk -v n="$ios" '
        /^TcpInSegs /{i=$2} /^TcpOutSegs /{o=$2} /^TcpRetransSegs /{r=$2}
        /^TcpExtDelayedACKs /{d=$2} /^TcpExtTCPOFOQueue /{q=$2} /^TcpExtTCPDSACKOldSent /{x=$2}
        END {if (n < 1) n = 1; printf "host segments in %.2f, out %.2f, retransmitted %.3f, delayed ACKs %.2f per I/O; segments in out of order %d, already received (the endpoint resent them) %d", i/n, o/n, r/n, d/n, q, x}')")
    fi
  done
  echo "$row |"
done
echo
echo "The host's TCP through the endpoint (nstat in its namespace):"
printf '  %s\n' "${tcp_per_io[@]}"
if [ "$tls" = 1 ]; then
  curl -s "127.0.0.1:$metrics/metrics" | grep -E '^dpu_nvmf_tls_(handshakes|refused)' | grep -v ' 0$' >&2 || true
  exit 0
fi
# Red's TCP rate, alone and beside blue's storage load.
sink='import socket,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(("",5001)); s.listen(1)
c,_=s.accept(); n=0
while True:
    b=c.recv(1<<20)
    if not b: break
    n+=len(b)
print(n)'
send='import socket,sys,time
s=socket.create_connection(("10.80.0.2",5001)); b=bytes(1<<16); end=time.time()+float(sys.argv[1])
while time.time()<end: s.sendall(b)
s.close()'
red_rate() {
  ip netns exec "epr2$id" python3 -c "$sink" >"$work/sink" &
  local s=$!
  sleep 0.5
  local t0 t1
  t0=$(date +%s.%N)
  ip netns exec "epr1$id" python3 -c "$send" "$secs"
  wait "$s"
  t1=$(date +%s.%N)
  awk -v n="$(cat "$work/sink")" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f Mbit/s", n*8/(b-a)/1e6}'
}
for _ in $(seq 1 50); do ip netns exec "epr1$id" ping -c 1 -W 1 10.80.0.2 >/dev/null 2>&1 && break; sleep 0.1; done
alone=$(red_rate)
perf ep --job read:128k:16 --time "$((secs + 2))" >"$work/busy" &
busy=$!
sleep 1
beside=$(red_rate)
wait "$busy"
echo
echo "red's TCP rate: alone $alone; beside blue's endpoint at read:128k:16: $beside (blue: $(awk '!/^#/ && !/^job/ {print $4" IOPS"}' "$work/busy"))"

# What was dropped on the way (none, unless a queue overflowed).
curl -s "127.0.0.1:$metrics/metrics" | grep -E '^dpu_dropped_packets_total' | grep -v ' 0$' >&2 || true
