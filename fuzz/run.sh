#!/usr/bin/env bash
# Builds every cargo-fuzz target of the repository and runs each one for a
# bounded time; exits non-zero if any target crashes (or fails to build).
#
#   fuzz/run.sh                          # every target, FUZZ_SECONDS each
#   FUZZ_SECONDS=600 fuzz/run.sh switch  # only the named targets
#
# Fuzz crates, one beside each crate that parses untrusted input:
# dpu-service/nvmeof/fuzz (pdu, connection, handshake, auth), dpu-service/dataplane/fuzz
# (parse, switch, isolation, rules), dpu-service/control/fuzz (rule_proto) and
# dpu-service/endpoint/fuzz (frames). Each
# target runs on:
#   <crate>/corpus/<target>       the growing corpus (gitignored, kept
#                                 between runs if the directory is)
#   <crate>/seeds/<target>        committed seed inputs, if any
#   <crate>/regressions/<target>  committed inputs that once crashed, if any
# A crash leaves its input under <crate>/artifacts/<target>/ and the
# command to reproduce it in the log.
#
# Environment:
#   FUZZ_SECONDS     run time per target (default 30)
#   FUZZ_TIMEOUT     seconds one input may take before it counts as a
#                    crash (default 10)
#   FUZZ_SANITIZER   cargo fuzz sanitizer (default none: the code under
#                    test forbids unsafe; "address" for ASan)
#   FUZZ_TOOLCHAIN   rustup toolchain to use (default: the active one). On a
#                    stable toolchain cargo-fuzz's nightly-only flags are
#                    allowed with RUSTC_BOOTSTRAP=1.
#   FUZZ_TARGET_DIR  cargo target directory shared by the fuzz crates
#                    (default target/fuzz, apart from the workspace build)
#   FUZZ_RSS_MB      memory a target may hold before it counts as a crash
#                    (libFuzzer's -rss_limit_mb; default 384 for the NVMe/TCP
#                    targets, where a peer that makes the target allocate
#                    without bound must be caught (a thousand announced
#                    512 KiB writes once took 500 MiB), 2048 for the rest)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=${FUZZ_SECONDS:-30}
timeout=${FUZZ_TIMEOUT:-10}
sanitizer=${FUZZ_SANITIZER:-none}
target_dir=${FUZZ_TARGET_DIR:-$root/target/fuzz}
crates=(dpu-service/nvmeof/fuzz dpu-service/dataplane/fuzz dpu-service/control/fuzz dpu-service/endpoint/fuzz)

cargo_cmd=(cargo)
if [ -n "${FUZZ_TOOLCHAIN:-}" ]; then
  cargo_cmd=(cargo "+$FUZZ_TOOLCHAIN")
fi
# cargo-fuzz passes -Z and -C flags that only nightly accepts; this lets
# the stable compiler take them (the targets use no unstable features).
export RUSTC_BOOTSTRAP=1

if ! "${cargo_cmd[@]}" fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  "${cargo_cmd[@]}" install cargo-fuzz --locked
fi

# Build flags; `cargo fuzz run` must get the same ones or it rebuilds.
# 16 codegen units: a much faster build for slightly slower runs.
build_flags=(--sanitizer "$sanitizer" --codegen-units 16 --target-dir "$target_dir")
mkdir -p "$target_dir/logs"

failed=()
summary=()
start=$SECONDS
for crate in "${crates[@]}"; do
  # A fuzz crate is a workspace of its own: give it the workspace's
  # dependency versions the first time (cargo only adds what is missing).
  [ -f "$crate/Cargo.lock" ] || cp Cargo.lock "$crate/Cargo.lock"
  project=$(dirname "$crate")
  mapfile -t all < <(cd "$project" && "${cargo_cmd[@]}" fuzz list)
  targets=()
  for t in "${all[@]}"; do
    if (($# == 0)) || [[ " $* " == *" $t "* ]]; then
      targets+=("$t")
    fi
  done
  ((${#targets[@]})) || continue

  rss=${FUZZ_RSS_MB:-2048}
  [ "$crate" = dpu-service/nvmeof/fuzz ] && rss=${FUZZ_RSS_MB:-384}
  [ "$crate" = dpu-service/endpoint/fuzz ] && rss=${FUZZ_RSS_MB:-384}

  t0=$SECONDS
  echo "fuzz: building $crate (${targets[*]})" >&2
  if ! (cd "$project" && "${cargo_cmd[@]}" fuzz build "${build_flags[@]}"); then
    failed+=("$crate: build")
    continue
  fi
  echo "fuzz: built $crate in $((SECONDS - t0)) s" >&2

  for t in "${targets[@]}"; do
    corpora=("$crate/corpus/$t")
    mkdir -p "${corpora[0]}"
    for extra in "$crate/seeds/$t" "$crate/regressions/$t"; do
      [ -d "$extra" ] && corpora+=("$extra")
    done
    log="$target_dir/logs/$(basename "$project")-$t.log"
    echo "fuzz: running $t for ${seconds} s (log: $log)" >&2
    rc=0
    (cd "$project" && "${cargo_cmd[@]}" fuzz run "${build_flags[@]}" "$t" \
      "${corpora[@]/#/$root/}" -- \
      -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb="$rss" \
      -malloc_limit_mb="$rss" -print_final_stats=1) \
      >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
    summary+=("$(printf '%-12s %-10s %10s execs %8s exec/s  %s' "$t" "rc=$rc" "${execs:-?}" "${rate:-?}" "$cov")")
    if ((rc != 0)); then
      failed+=("$t")
      echo "fuzz: $t FAILED (exit $rc), from $log:" >&2
      grep -m1 -A4 'panicked at' "$log" >&2 || true
      grep -m1 'ERROR: libFuzzer' "$log" >&2 || true
      grep -m1 'Test unit written to' "$log" >&2 || true
      grep -m1 -A2 'Reproduce with' "$log" >&2 || tail -n 30 "$log" >&2
    fi
  done
done

echo "fuzz: done in $((SECONDS - start)) s" >&2
printf 'fuzz:   %s\n' "${summary[@]}" >&2
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
