#!/usr/bin/env bash
# Builds the cargo-fuzz targets of the repository and runs each one for a
# bounded time, FUZZ_JOBS at a time; exits non-zero if any target crashes
# (or the build fails).
#
#   fuzz/run.sh                          # every target, FUZZ_SECONDS each
#   FUZZ_SECONDS=600 fuzz/run.sh switch  # only the named targets
#
# The targets are the binaries of the crate dpu-fuzz (fuzz/, a member of
# the workspace; `cargo fuzz list`): pdu, connection, handshake and auth
# (NVMe/TCP), host (its host side against a hostile controller), parse,
# switch, isolation, rules and saved_tables (the data plane), rule_proto, opi_proto and storage_proto (the control plane) and frames (storage endpoints). Each
# target's logic is `dpu_fuzz::<target>::run` (fuzz/src/<target>.rs). Each
# target runs on:
#   fuzz/corpus/<target>       the growing corpus (gitignored, kept
#                              between runs if the directory is)
#   fuzz/seeds/<target>        committed seed inputs, if any
#   fuzz/regressions/<target>  committed inputs that once crashed, if any
# A crash leaves its input under fuzz/artifacts/<target>/ and the command
# to reproduce it in the log. The seeds and regressions also replay as
# plain tests, without libFuzzer: `cargo test -p dpu-fuzz`.
#
# Environment:
#   FUZZ_SECONDS     run time per target (default 30)
#   FUZZ_JOBS        targets run at the same time, one core each (default:
#                    the number of CPUs); the run time per target stays
#                    FUZZ_SECONDS
#   FUZZ_TIMEOUT     seconds one input may take before it counts as a
#                    crash (default 10)
#   FUZZ_SANITIZER   cargo fuzz sanitizer (default none: the code under
#                    test forbids unsafe; "address" for ASan)
#   FUZZ_TOOLCHAIN   rustup toolchain to use (default: the active one). On a
#                    stable toolchain cargo-fuzz's nightly-only flags are
#                    allowed with RUSTC_BOOTSTRAP=1.
#   FUZZ_TARGET_DIR  cargo target directory of the fuzz build (default
#                    target/fuzz, apart from the workspace build)
#   FUZZ_BUILD_ONLY  if 1, build the targets and stop (CI builds them in
#                    the background, on cores the test suite leaves idle)
#   FUZZ_RSS_MB      memory a target may hold before it counts as a crash
#                    (libFuzzer's -rss_limit_mb; default 384 for the NVMe/TCP
#                    targets and frames, where a peer that makes the target
#                    allocate without bound must be caught (a thousand
#                    announced 512 KiB writes once took 500 MiB), 2048 for
#                    the rest)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=${FUZZ_SECONDS:-30}
parallel=${FUZZ_JOBS:-$(nproc)}
timeout=${FUZZ_TIMEOUT:-10}
sanitizer=${FUZZ_SANITIZER:-none}
target_dir=${FUZZ_TARGET_DIR:-$root/target/fuzz}
mkdir -p "$target_dir"
target_dir=$(cd "$target_dir" && pwd)
logs=$target_dir/logs
((parallel >= 1)) || parallel=1

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

# Build settings, for a fast build of the fuzz targets: `cargo fuzz build`
# builds the workspace's `release` profile, whose whole-program LTO and
# single codegen unit are for the daemon. cargo-fuzz passes no cargo
# options on (`cargo --config ... fuzz` does not reach the cargo it runs)
# and a member's [profile] tables are ignored, so:
# - profile-wide settings come from cargo's environment: no LTO, 16
#   codegen units (also cargo-fuzz's own flag: a much faster build for
#   slightly slower runs); debug info stays line tables (cargo-fuzz's
#   setting), for the backtraces of crashes;
export CARGO_PROFILE_RELEASE_LTO=false
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
export CARGO_PROFILE_RELEASE_INCREMENTAL=false
# - per-package settings, which cargo takes from configuration files only,
#   from the file below: cargo fuzz runs in the target directory, so cargo
#   finds it as .cargo/config.toml there (and the repository's own, if any,
#   above it). Dependencies outside the workspace are built without
#   optimizations (still instrumented): the control plane's server stack
#   (tonic, hyper, tokio, rustls) is most of the build and no target runs
#   it. The workspace's crates, the code under test, keep the release
#   profile's opt-level 3, and so do libFuzzer and the dependencies the
#   targets run on every input: smoltcp (the frames target's host stack),
#   the NVMe/TCP digests and DH-HMAC-CHAP hashes, the data plane's hash
#   tables (unoptimized, they made rules and switch 2-4 times slower) and
#   queues, and arbitrary (the rules target's input).
mkdir -p "$target_dir/.cargo"
cat >"$target_dir/.cargo/config.toml" <<'EOF'
# Written by fuzz/run.sh (see there); cargo reads it when run from here.
[profile.release.package."*"]
opt-level = 0
[profile.release.package.libfuzzer-sys]
opt-level = 3
[profile.release.package.smoltcp]
opt-level = 3
[profile.release.package.crc32c]
opt-level = 3
[profile.release.package.crc32fast]
opt-level = 3
[profile.release.package.sha2]
opt-level = 3
[profile.release.package.hmac]
opt-level = 3
[profile.release.package.hashbrown]
opt-level = 3
[profile.release.package.foldhash]
opt-level = 3
[profile.release.package.arbitrary]
opt-level = 3
[profile.release.package.crossbeam-queue]
opt-level = 3
[profile.release.package.crossbeam-utils]
opt-level = 3
EOF
# Build flags; `cargo fuzz run` must get the same ones or it rebuilds.
build_flags=(--features libfuzzer --sanitizer "$sanitizer" --codegen-units 16
  --target-dir "$target_dir" --fuzz-dir "$root/fuzz")
fuzz() {
  (cd "$target_dir" && "${cargo_cmd[@]}" fuzz "$@")
}

mapfile -t all < <(fuzz list --fuzz-dir "$root/fuzz")
targets=()
for t in "${all[@]}"; do
  if (($# == 0)) || [[ " $* " == *" $t "* ]]; then
    targets+=("$t")
  fi
done
for t in "$@"; do
  if [[ " ${all[*]} " != *" $t "* ]]; then
    echo "fuzz: no target $t (targets: ${all[*]})" >&2
    exit 2
  fi
done
((${#targets[@]})) || exit 0

start=$SECONDS
echo "fuzz: building ${targets[*]}" >&2
if ! fuzz build "${build_flags[@]}"; then
  echo "fuzz: FAILED: build" >&2
  exit 1
fi
build_s=$((SECONDS - start))
echo "fuzz: built in $build_s s" >&2
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

mkdir -p "$logs"
# Runs target $1 and leaves libFuzzer's exit status in $logs/$1.rc.
run_target() {
  local t=$1 rss=${FUZZ_RSS_MB:-2048} rc=0
  case $t in
    pdu | connection | handshake | auth | tls | host | frames) rss=${FUZZ_RSS_MB:-384} ;;
  esac
  local corpora=("$root/fuzz/corpus/$t")
  mkdir -p "${corpora[0]}"
  for extra in "$root/fuzz/seeds/$t" "$root/fuzz/regressions/$t"; do
    [ -d "$extra" ] && corpora+=("$extra")
  done
  fuzz run "${build_flags[@]}" "$t" "${corpora[@]}" -- \
    -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb="$rss" \
    -malloc_limit_mb="$rss" -print_final_stats=1 >"$logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$logs/$t.rc"
}

t0=$SECONDS
for t in "${targets[@]}"; do
  # At most $parallel targets at a time (`wait -n`: until one ends).
  while (($(jobs -rp | wc -l) >= parallel)); do
    wait -n || true
  done
  rm -f "$logs/$t.rc"
  echo "fuzz: running $t for $seconds s (log: $logs/$t.log)" >&2
  run_target "$t" &
done
wait

failed=()
summary=()
for t in "${targets[@]}"; do
  log=$logs/$t.log
  rc=$(cat "$logs/$t.rc" 2>/dev/null || echo '?')
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
  summary+=("$(printf '%-12s %-10s %10s execs %8s exec/s  %s' "$t" "rc=$rc" "${execs:-?}" "${rate:-?}" "$cov")")
  if [ "$rc" != 0 ]; then
    failed+=("$t")
    echo "fuzz: $t FAILED (exit $rc), from $log:" >&2
    grep -m1 -A4 'panicked at' "$log" >&2 || true
    grep -m1 'ERROR: libFuzzer' "$log" >&2 || true
    grep -m1 'Test unit written to' "$log" >&2 || true
    grep -m1 -A2 'Reproduce with' "$log" >&2 || tail -n 30 "$log" >&2
    input=$(sed -n 's/.*Test unit written to //p' "$log" | head -n 1)
    if [ -n "$input" ]; then
      echo "fuzz: or without a rebuild: $(echo "$target_dir"/*/release/"$t") $input;" \
        "as a test: copy it to fuzz/regressions/$t/, cargo test -p dpu-fuzz --test seeds $t" >&2
    fi
  fi
done

echo "fuzz: done in $((SECONDS - start)) s (build $build_s s, runs $((SECONDS - t0)) s, $parallel at a time)" >&2
printf 'fuzz:   %s\n' "${summary[@]}" >&2
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
