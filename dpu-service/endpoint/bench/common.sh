# Shared by the endpoint benchmarks (sourced, not run): the service's
# start and blue's storage, the same in each script.
#
# Needs: bin (the built binaries), work (a scratch folder), id (a number
# that keeps ports and EAL files apart), and $work/config.toml written.
# Sets: pid (the service), grpc, metrics, kport (the kernel listener's
# port), DPU_ENDPOINT; defines ctl (dpuctl, quiet).

grpc=$((20000 + id % 20000)) metrics=$((grpc + 1)) kport=$((grpc + 2))

# start_service [PREFIX..]: the service under PREFIX (taskset -c 0, say),
# waited for until its gRPC port answers.
start_service() {
  "$@" "$bin/dpu-service" --config "$work/config.toml" --grpc-listen "127.0.0.1:$grpc" \
    --metrics-listen "127.0.0.1:$metrics" --state-dir "$work/state" 2>"$work/service.log" &
  pid=$!
  for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$grpc") 2>/dev/null && break; sleep 0.1; done
  export DPU_ENDPOINT="http://127.0.0.1:$grpc"
}

ctl() { "$bin/dpuctl" "$@" >/dev/null; }

# storage_setup: subsystems "ep" (blue's endpoint 10.79.0.250:4420, its
# secure channel EP_CHANNEL if set) and "k" (the kernel's loopback, port
# kport), 256 MiB of RAM each. Blue must exist.
storage_setup() {
  for s in ep k; do
    ctl subsystem create "$s" --nqn "nqn.2024-01.io.dpu-service.bench:$s" --allow-any-host
    ctl namespace create "$s" --ram 256M
  done
  ctl listener create ep --id ep --tenant blue --address 10.79.0.250 --port 4420 \
    ${EP_CHANNEL:+--secure-channel "$EP_CHANNEL"}
  ctl listener create k --id k --address 127.0.0.1 --port "$kport"
}
