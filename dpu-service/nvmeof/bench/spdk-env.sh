# Sourced by the benchmark scripts that run SPDK beside our target:
# what SPDK needs of the machine, and waiting for a target to listen.

# Reserves 1 GiB of hugepages (SPDK's bdevs and pools), mounts hugetlbfs
# and puts SPDK tree $1's shared libraries on LD_LIBRARY_PATH.
spdk_env() {
  local spdk=$1 need=1024
  if [ "$(cat /proc/sys/vm/nr_hugepages)" -lt "$need" ]; then echo "$need" >/proc/sys/vm/nr_hugepages; fi
  mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages; mount -t hugetlbfs nodev /dev/hugepages; }
  export LD_LIBRARY_PATH="$spdk/build/lib:$spdk/isa-l/.libs:${LD_LIBRARY_PATH:-}"
}

# Waits up to 30 s for something to accept connections on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq 1 300); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$(basename "$0"): nothing listens on $1" >&2
  return 1
}
