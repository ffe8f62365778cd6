#!/usr/bin/env bash
# Builds dpdk-sys and dpdk against DPDK releases other than the system's
# (Debian 12: 22.11), each unpacked into a sysroot of its own, and runs their
# tests against that release's libraries: the unit tests and the safe
# layer's tests on real EAL with net_ring ports. One source must build
# against every release we support: 22.11 (the system's, checked by the
# normal build and tests), 23.11 and 24.11.
#
# Usage: dpu-service/dpdk-sys/check-versions.sh [VERSION...]  (default: 23.11 24.11)
#
# Where a release comes from:
# - Debian's archive: the first suite of DPDK_SUITES whose libdpdk-dev is
#   VERSION.x. Its amd64 libdpdk-dev and everything that depends on, glibc
#   included, are downloaded with apt-get under a private configuration (own
#   sources, lists, cache and an empty dpkg status: the machine's apt sources
#   and installed packages are left alone) and unpacked with dpkg -x.
#   Building uses --sysroot, so headers, glibc and libraries are all that
#   suite's, not /usr/include's 22.11; the tests run under the sysroot's own
#   dynamic loader (its libraries need a newer glibc than Debian 12's).
# - Otherwise, with DPDK_GIT set to a DPDK git repository: tag vVERSION,
#   built with meson/ninja (a minimal build: ethdev and the libraries it
#   needs, bus/pci, bus/vdev, mempool/ring, net/ring and net/null; about a
#   minute on 2 cores) with the sysroot as its prefix. Built here, it uses
#   the machine's glibc.
# - Otherwise the release is reported as SKIP and does not fail the run:
#   Debian's archive no longer carries 23.11 (trixie has 24.11, bookworm
#   22.11, sid the newest), so CI checks 23.11 only where DPDK_GIT is given.
#
# Environment:
#   DPDK_VERSIONS_DIR  cache of sysroots, apt state and the build
#                      (default: ${CARGO_TARGET_DIR:-target}/dpdk-versions);
#                      a finished sysroot is reused
#   DPDK_SUITES        Debian suites searched, in order
#                      (default: "bookworm-backports trixie trixie-backports sid")
#   DEBIAN_MIRROR      default: the first .../debian mirror of the machine's
#                      apt sources, else http://deb.debian.org/debian
#   DPDK_GIT           a DPDK git repository, for releases Debian lacks
#   DPDK_STRICT=1      a release that cannot be had fails instead of SKIP
#
# Prints one line per release (OK / FAIL / SKIP) and exits non-zero if any
# release failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

versions=("$@")
[ "${#versions[@]}" -gt 0 ] || versions=(23.11 24.11)
cache=$(realpath -m "${DPDK_VERSIONS_DIR:-${CARGO_TARGET_DIR:-target}/dpdk-versions}")
read -r -a suites <<<"${DPDK_SUITES:-bookworm-backports trixie trixie-backports sid}"
triple=x86_64-unknown-linux-gnu
multiarch=x86_64-linux-gnu
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

log() { echo "dpdk-versions: $*" >&2; }
now() { date +%s; }

debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then
    echo "$DEBIAN_MIRROR"
    return
  fi
  local m
  m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -v '^[[:space:]]*#' | grep -oE 'https?://[^[:space:]]+/debian/?([[:space:]]|$)' | head -n1 | tr -d '[:space:]' || true)
  echo "${m:-http://deb.debian.org/debian}"
}

# A private apt configuration for one suite: its own sources, lists, cache
# and an empty dpkg status, so dependency resolution lists every package a
# fresh install would need, and nothing of the machine's apt state changes.
apt_dir() { echo "$cache/apt/$1"; }
apt_conf() {
  local suite=$1 d
  d=$(apt_dir "$suite")
  if [ ! -f "$d/apt.conf" ]; then
    mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/sources.list.d" "$d/preferences.d"
    : >"$d/status"
    echo "deb [arch=amd64 signed-by=$keyring] $(debian_mirror) $suite main" >"$d/sources.list"
    cat >"$d/apt.conf" <<EOF
Dir::Etc::sourcelist "$d/sources.list";
Dir::Etc::sourceparts "$d/sources.list.d";
Dir::Etc::preferences "$d/preferences";
Dir::Etc::preferencesparts "$d/preferences.d";
Dir::State::Lists "$d/lists";
Dir::State::status "$d/status";
Dir::Cache "$d/cache";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
APT::Sandbox::User "root";
Acquire::Languages "none";
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled "false";
Acquire::IndexTargets::deb::CNF::DefaultEnabled "false";
EOF
  fi
  echo "$d/apt.conf"
}
# apt-get / apt-cache with a suite's private configuration. APT_CONFIG is
# read on top of /etc/apt/apt.conf.d (proxies and the like still apply); the
# -o options make sure the directories are ours whatever those say.
apt_in() {
  local suite=$1 tool=$2 d
  shift 2
  d=$(apt_dir "$suite")
  APT_CONFIG=$(apt_conf "$suite") "$tool" \
    -o Dir::Etc::sourcelist="$d/sources.list" -o Dir::Etc::sourceparts="$d/sources.list.d" \
    -o Dir::State::Lists="$d/lists" -o Dir::State::status="$d/status" -o Dir::Cache="$d/cache" \
    "$@"
}
updated=()
apt_update() {
  local s
  for s in "${updated[@]}"; do [ "$s" = "$1" ] && return 0; done
  apt_in "$1" apt-get update -qq >/dev/null || return 1
  updated+=("$1")
}

# Finds VERSION.x in Debian's suites; prints "suite full-version".
find_in_debian() {
  local ver=$1 suite full seen=()
  for suite in "${suites[@]}"; do
    if ! apt_update "$suite"; then
      log "  $suite: apt-get update failed"
      continue
    fi
    full=$(apt_in "$suite" apt-cache madison libdpdk-dev | awk -F'|' '{gsub(/ /, "", $2); print $2}' | head -n1)
    seen+=("$suite=${full:-none}")
    case "$full" in
      "$ver".*)
        log "  libdpdk-dev $full in $suite"
        echo "$suite $full"
        return 0
        ;;
    esac
  done
  log "  no libdpdk-dev $ver.x in Debian (${seen[*]})"
  return 1
}

# Debian's libdpdk-dev and its whole dependency closure, unpacked.
sysroot_from_debian() {
  local suite=$1 full=$2 sys=$3 debs t0
  t0=$(now)
  local -a pkgs
  mapfile -t pkgs < <(apt_in "$suite" apt-get install -s -y --no-install-recommends "libdpdk-dev=$full" 2>/dev/null \
    | awk '/^Inst / { print $2 }' | sort -u)
  [ "${#pkgs[@]}" -gt 0 ] || { log "  apt lists no packages for libdpdk-dev=$full"; return 1; }
  debs="$cache/debs-$suite"
  rm -rf "$debs" && mkdir -p "$debs"
  (cd "$debs" && apt_in "$suite" apt-get download -qq "${pkgs[@]}") || return 1
  log "  downloaded ${#pkgs[@]} packages ($(du -sh "$debs" | cut -f1)) in $(($(now) - t0)) s"
  t0=$(now)
  rm -rf "$sys" && mkdir -p "$sys/usr/lib" "$sys/usr/lib64" "$sys/usr/bin" "$sys/usr/sbin"
  # Merged /usr as on an installed system: the linker scripts (libc.so)
  # name /lib/... and /lib64/... paths.
  local l
  for l in lib lib64 bin sbin; do ln -s "usr/$l" "$sys/$l"; done
  local d
  for d in "$debs"/*.deb; do dpkg -x "$d" "$sys" || return 1; done
  rm -rf "$debs"
  echo "debian $suite $full" >"$sys/.complete"
  log "  unpacked into $sys ($(du -sh "$sys" | cut -f1)) in $(($(now) - t0)) s"
}

# tag vVERSION of $DPDK_GIT, a minimal meson build installed into the sysroot.
sysroot_from_git() {
  local ver=$1 sys=$2 src bld t0
  t0=$(now)
  local tool
  for tool in meson ninja; do
    command -v "$tool" >/dev/null || { log "  $tool not found (needed to build DPDK from DPDK_GIT)"; return 1; }
  done
  git -C "$DPDK_GIT" rev-parse -q --verify "v$ver^{commit}" >/dev/null \
    || { log "  $DPDK_GIT has no tag v$ver"; return 1; }
  src="$cache/src-$ver"
  bld="$src/build"
  rm -rf "$src" && mkdir -p "$src"
  git -C "$DPDK_GIT" archive --format=tar -o "$src.tar" "v$ver" && tar -xf "$src.tar" -C "$src" && rm -f "$src.tar" \
    || return 1
  # platform=generic: no -march=native. enable_libs also brings DPDK's
  # always-enabled libraries (eal, ring, mempool, mbuf, net, ...).
  rm -rf "$sys" && mkdir -p "$sys"
  meson setup "$bld" "$src" --prefix="$sys/usr" --libdir="lib/$multiarch" --includedir=include/dpdk \
    -Dplatform=generic -Dtests=false -Denable_docs=false -Denable_kmods=false \
    -Ddisable_apps='*' -Denable_libs=ethdev \
    -Denable_drivers=bus/pci,bus/vdev,mempool/ring,net/ring,net/null >"$cache/meson-$ver.log" 2>&1 \
    || { log "  meson setup failed: $cache/meson-$ver.log"; return 1; }
  ninja -C "$bld" >>"$cache/meson-$ver.log" 2>&1 || { log "  ninja failed: $cache/meson-$ver.log"; return 1; }
  meson install -C "$bld" --quiet >>"$cache/meson-$ver.log" 2>&1 || { log "  meson install failed: $cache/meson-$ver.log"; return 1; }
  rm -rf "$src"
  echo "git $DPDK_GIT v$ver" >"$sys/.complete"
  log "  built v$ver from $DPDK_GIT into $sys in $(($(now) - t0)) s"
}

# Makes the sysroot of VERSION if it is not there yet.
ensure_sysroot() {
  local ver=$1 sys=$2 found
  [ -f "$sys/.complete" ] && { log "  reusing $sys ($(cat "$sys/.complete"))"; return 0; }
  if found=$(find_in_debian "$ver"); then
    # shellcheck disable=SC2086 # two words: suite and version
    sysroot_from_debian $found "$sys"
  elif [ -n "${DPDK_GIT:-}" ]; then
    sysroot_from_git "$ver" "$sys"
  else
    return 2
  fi
}

# Builds and tests the crates against the sysroot. --target keeps the
# sysroot's link flags (RUSTFLAGS) off the build scripts, which run here.
# Called where set -e does not apply: every step checks for itself.
check() {
  local ver=$1 sys=$2 kind out t0
  kind=$(cut -d' ' -f1 "$sys/.complete")
  local libdirs="$sys/usr/lib/$multiarch"
  unset PKG_CONFIG_PATH
  export CARGO_TARGET_DIR="$cache/target"
  if [ "$kind" = debian ]; then
    # Everything from the sysroot: DPDK's headers and libraries, glibc's too.
    export PKG_CONFIG_SYSROOT_DIR="$sys"
    export PKG_CONFIG_LIBDIR="$sys/usr/lib/$multiarch/pkgconfig:$sys/usr/share/pkgconfig"
    export CFLAGS_x86_64_unknown_linux_gnu="--sysroot=$sys"
    export BINDGEN_EXTRA_CLANG_ARGS_x86_64_unknown_linux_gnu="--sysroot=$sys"
    export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C link-arg=--sysroot=$sys"
    # The tests run under the sysroot's own dynamic loader: its libraries
    # need its glibc, newer than this machine's. EAL looks for its PMD
    # plugins where the release installs them (/usr/lib/.../dpdk/pmds-N),
    # not in the sysroot, so the two the net_ring tests need are preloaded.
    local pmds_dirs=("$sys/usr/lib/$multiarch/dpdk/pmds-"*)
    local pmds=${pmds_dirs[-1]}
    export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$sys/usr/lib64/ld-linux-x86-64.so.2 --library-path $libdirs --preload $pmds/librte_mempool_ring.so:$pmds/librte_net_ring.so"
  else
    # Built on this machine with the sysroot as its prefix: the machine's
    # glibc and libbsd, DPDK from the sysroot (its .pc comes first).
    unset PKG_CONFIG_SYSROOT_DIR
    local host_pc
    host_pc=$(pkg-config --variable pc_path pkg-config)
    export PKG_CONFIG_LIBDIR="$sys/usr/lib/$multiarch/pkgconfig:$host_pc"
    export CFLAGS_x86_64_unknown_linux_gnu="-I$sys/usr/include/dpdk"
    export BINDGEN_EXTRA_CLANG_ARGS_x86_64_unknown_linux_gnu="-I$sys/usr/include/dpdk"
    export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="env LD_LIBRARY_PATH=$libdirs"
  fi
  log "  pkg-config libdpdk: $(pkg-config --modversion libdpdk)"
  t0=$(now)
  out=$(cargo build --locked --target "$triple" -p dpdk-sys -p dpdk --lib --message-format=json-render-diagnostics) \
    || return 1
  log "  cargo build: $(($(now) - t0)) s"
  # The version the headers bindgen read declare (rte_build_config.h).
  local outdir bindings year month minor hdr
  outdir=$(python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and "/dpdk-sys" in m.get("package_id", ""):
        print(m["out_dir"])
' <<<"$out" | tail -n1)
  bindings="$outdir/bindings.rs"
  year=$(sed -n 's/.*const RTE_VER_YEAR: u32 = \([0-9]*\);.*/\1/p' "$bindings")
  month=$(sed -n 's/.*const RTE_VER_MONTH: u32 = \([0-9]*\);.*/\1/p' "$bindings")
  minor=$(sed -n 's/.*const RTE_VER_MINOR: u32 = \([0-9]*\);.*/\1/p' "$bindings")
  hdr="$year.$month.$minor"
  log "  headers bindgen read: DPDK $hdr"
  case "$hdr" in
    "$ver".*) ;;
    *)
      log "  wrong headers: expected $ver.x"
      return 1
      ;;
  esac
  # The unit tests (headers, pkg-config and the loaded library agree on the
  # release) and the safe layer's tests on real EAL with net_ring ports,
  # against the release's libraries.
  t0=$(now)
  cargo test --locked --target "$triple" -p dpdk-sys -p dpdk --lib --tests >"$cache/test-$ver.log" 2>&1 \
    || { cat "$cache/test-$ver.log" >&2; return 1; }
  grep -E '^test result:' "$cache/test-$ver.log" | sed 's/^/dpdk-versions:   /' >&2
  log "  cargo test: $(($(now) - t0)) s"
  local passed
  passed=$(awk '/^test result: ok\./ { n += $4 } END { print n + 0 }' "$cache/test-$ver.log")
  echo "headers $hdr, $passed tests passed"
}

mkdir -p "$cache"
results=()
failed=0
for ver in "${versions[@]}"; do
  sys="$cache/$ver/sysroot"
  log "DPDK $ver"
  t_ver=$(now)
  rc=0
  ensure_sysroot "$ver" "$sys" || rc=$?
  if [ "$rc" = 2 ]; then
    if [ "${DPDK_STRICT:-0}" = 1 ]; then
      results+=("dpdk-sys/dpdk against DPDK $ver: FAIL (not in Debian's ${suites[*]}; no DPDK_GIT)")
      failed=1
    else
      results+=("dpdk-sys/dpdk against DPDK $ver: SKIP (not in Debian's ${suites[*]}; set DPDK_GIT to a DPDK git repository to build it)")
    fi
    continue
  elif [ "$rc" != 0 ]; then
    results+=("dpdk-sys/dpdk against DPDK $ver: FAIL (could not make the sysroot)")
    failed=1
    continue
  fi
  if summary=$(check "$ver" "$sys"); then
    results+=("dpdk-sys/dpdk against DPDK $ver: OK ($(cat "$sys/.complete"); $summary; $(($(now) - t_ver)) s)")
  else
    results+=("dpdk-sys/dpdk against DPDK $ver: FAIL ($(cat "$sys/.complete"))")
    failed=1
  fi
done
printf '%s\n' "${results[@]}"
exit "$failed"
