#!/usr/bin/env bash
# Builds the dpu-service runtime image (images/Containerfile) for
# linux/arm64 (the DPU) and linux/amd64, and optionally checks it.
#
# Usage: images/build.sh [options]
#   --arch amd64|arm64|all   which images (default: all)
#   --engine buildah|podman|docker
#                            default: buildah if installed (no daemon), else
#                            podman, else docker with a running daemon, else
#                            buildah (installed from Debian)
#   --base-from-debootstrap  make the Debian 12 base with debootstrap from the
#                            Debian mirror instead of pulling debian:bookworm-slim
#                            from a registry (buildah only; CI uses it)
#   --check                  run the checks below on each image (buildah only)
#   --skip-binaries          use the binaries already built
#   --profile [ARCH=]NAME    cargo profile of the binaries, of every
#                            architecture or of ARCH's (default release). CI
#                            passes arm64=ci (what its aarch64 stage built and
#                            tested: optimised, without fat LTO) and amd64=dev
#                            (the debug binaries its tests ran)
# Output: images tagged ghcr.io/dpu-service/dpu-service:VERSION-ARCH, a
# manifest list ghcr.io/dpu-service/dpu-service:VERSION, and OCI archives
# in ${CARGO_TARGET_DIR:-target}/images/. Push with e.g.
#   buildah manifest push --all ghcr.io/dpu-service/dpu-service:0.1.0 docker://REGISTRY/dpu-service:0.1.0
#
# The checks: the image's user, labels, health check and entrypoint; the
# file capabilities of the daemon; `dpu-service --version` inside the image
# (arm64 through qemu-user); and a real start inside the image: EAL on
# --no-huge with the image's net_null driver, gRPC health SERVING on the
# health listener, the data plane reported as DPDK, a clean stop.
set -euo pipefail
cd "$(dirname "$0")/.."

arches=(amd64 arm64)
engine=""
debootstrap_base=0
check=0
build_bins=1
profile_amd64=release
profile_arm64=release
while (($#)); do
  case "$1" in
    --arch) shift; [ "$1" = all ] && arches=(amd64 arm64) || arches=("$1") ;;
    --engine) shift; engine=$1 ;;
    --base-from-debootstrap) debootstrap_base=1 ;;
    --check) check=1 ;;
    --skip-binaries) build_bins=0 ;;
    --profile) shift
      case "$1" in
        amd64=*) profile_amd64=${1#*=} ;;
        arm64=*) profile_arm64=${1#*=} ;;
        *=*) echo "images/build.sh: --profile ARCH=NAME takes amd64 or arm64" >&2; exit 2 ;;
        *) profile_amd64=$1; profile_arm64=$1 ;;
      esac ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "images/build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for a in "${arches[@]}"; do
  case "$a" in amd64|arm64) ;; *) echo "images/build.sh: --arch must be amd64, arm64 or all" >&2; exit 2 ;; esac
done

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
apt_install() {
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
if [ -z "$engine" ]; then
  # A docker CLI counts only with a daemon behind it.
  if command -v buildah >/dev/null; then engine=buildah
  elif command -v podman >/dev/null; then engine=podman
  elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
  else engine=buildah  # installed below
  fi
fi
# What the offline base and the checks need is buildah's.
if { [ "$debootstrap_base" = 1 ] || [ "$check" = 1 ]; } && [ "$engine" != buildah ]; then
  echo "images/build.sh: --base-from-debootstrap and --check need --engine buildah" >&2
  exit 2
fi
need=()
command -v "$engine" >/dev/null || need+=("$engine")
[ "$debootstrap_base" = 1 ] && ! command -v debootstrap >/dev/null && need+=(debootstrap)
[ "$check" = 1 ] && ! command -v getcap >/dev/null && need+=(libcap2-bin)
[ "$check" = 1 ] && ! command -v pgrep >/dev/null && need+=(procps)
if ((${#need[@]})); then apt_install "${need[@]}"; fi

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
repo=ghcr.io/dpu-service/dpu-service
tdir=${CARGO_TARGET_DIR:-target}
out=$(realpath -m "$tdir/images")
mkdir -p "$out"

host_arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
case "$host_arch" in x86_64) host_arch=amd64 ;; aarch64) host_arch=arm64 ;; esac
foreign=0
for a in "${arches[@]}"; do [ "$a" != "$host_arch" ] && foreign=1; done

# RUN steps and checks of a foreign-architecture image execute through
# qemu-user, registered with binfmt_misc (flag F: usable inside chroots).
if [ "$foreign" = 1 ] && [ "$engine" = buildah ]; then
  command -v qemu-aarch64-static >/dev/null || apt_install qemu-user-static
  mountpoint -q /proc/sys/fs/binfmt_misc || "${sudo_cmd[@]}" mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  for a in "${arches[@]}"; do
    [ "$a" = "$host_arch" ] && continue
    q=$([ "$a" = arm64 ] && echo aarch64 || echo x86_64)
    if [ ! -e "/proc/sys/fs/binfmt_misc/qemu-$q" ]; then
      "${sudo_cmd[@]}" sh -c "cat /usr/lib/binfmt.d/qemu-$q.conf > /proc/sys/fs/binfmt_misc/register"
    fi
  done
fi

# The binaries, built outside the image: natively, or with cross/ for arm64.
triple_of() { [ "$1" = arm64 ] && echo aarch64-unknown-linux-gnu || echo x86_64-unknown-linux-gnu; }
profile_of() { if [ "$1" = arm64 ]; then echo "$profile_arm64"; else echo "$profile_amd64"; fi; }
bin_dir() {
  local dir
  dir=$(profile_of "$1")
  [ "$dir" = dev ] && dir=debug
  if [ "$1" = "$host_arch" ]; then echo "$tdir/$dir"; else echo "$tdir/$(triple_of "$1")/$dir"; fi
}
if [ "$build_bins" = 1 ]; then
  for a in "${arches[@]}"; do
    if [ "$a" = "$host_arch" ]; then
      tests/deps.sh
      cargo build --profile "$(profile_of "$a")" --locked -p dpu-service -p dpu-client --bins
    elif [ "$a" = arm64 ]; then
      cross/build-aarch64.sh --profile "$(profile_of "$a")" -p dpu-service -p dpu-client --bins
    else
      echo "images/build.sh: cannot build amd64 binaries on $host_arch" >&2
      exit 1
    fi
  done
fi

# The build context: only what the Containerfile copies.
ctx="$out/context"
rm -rf "$ctx"
mkdir -p "$ctx"
for a in "${arches[@]}"; do
  mkdir -p "$ctx/bin/$a"
  for b in dpu-service dpuctl; do
    src="$(bin_dir "$a")/$b"
    [ -x "$src" ] || { echo "images/build.sh: $src is missing (build it, or drop --skip-binaries)" >&2; exit 1; }
    # Line tables stay in target/ for debugging; symbols stay for backtraces.
    strip_tool=strip
    [ "$a" != "$host_arch" ] && [ "$a" = arm64 ] && strip_tool=aarch64-linux-gnu-strip
    "$strip_tool" --strip-debug -o "$ctx/bin/$a/$b" "$src"
  done
done
cp dpu-service/daemon/config/production.toml "$ctx/config.toml"

# A Debian 12 minbase root file system as the base, from the Debian mirror.
base_image() {
  local a=$1 img="localhost/dpu-service-base:bookworm-$1"
  if buildah inspect --type image "$img" >/dev/null 2>&1; then echo "$img"; return; fi
  local rootfs mirror
  rootfs=$(mktemp -d "$out/rootfs-$a.XXXX")
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p; s/^deb \(http[^ ]*debian\) bookworm .*/\1/p' \
    /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n1)
  mirror=${mirror:-http://deb.debian.org/debian}
  echo "images/build.sh: debootstrap bookworm $a from $mirror" >&2
  if [ "$a" = "$host_arch" ]; then
    "${sudo_cmd[@]}" debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >&2
  else
    "${sudo_cmd[@]}" debootstrap --arch "$a" --foreign --variant=minbase bookworm "$rootfs" "$mirror" >&2
    "${sudo_cmd[@]}" chroot "$rootfs" /debootstrap/debootstrap --second-stage >&2
  fi
  "${sudo_cmd[@]}" rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  local c
  c=$(buildah from --arch "$a" scratch)
  buildah copy --quiet "$c" "$rootfs" / >/dev/null
  buildah config --arch "$a" --os linux --cmd /bin/bash "$c"
  buildah commit --quiet "$c" "$img" >/dev/null
  buildah rm "$c" >/dev/null
  "${sudo_cmd[@]}" rm -rf "$rootfs"
  echo "$img"
}

tags=()
for a in "${arches[@]}"; do
  tag="$repo:$version-$a"
  base_args=()
  if [ "$debootstrap_base" = 1 ]; then base_args=(--build-arg "BASE=$(base_image "$a")"); fi
  echo "images/build.sh: building $tag" >&2
  previous=""
  if [ "$engine" = buildah ]; then previous=$(buildah inspect --type image --format '{{.FromImageID}}' "$tag" 2>/dev/null || true); fi
  build=(--platform "linux/$a" --build-arg "TARGETARCH=$a" "${base_args[@]}"
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "CREATED=$created"
    -f images/Containerfile -t "$tag" "$ctx")
  case "$engine" in
    # Docker format: OCI image configs cannot carry HEALTHCHECK.
    buildah) buildah bud --quiet --isolation chroot --format docker "${build[@]}" ;;
    podman) podman build --format docker "${build[@]}" ;;
    docker) docker build "${build[@]}" ;;
  esac
  tags+=("$tag")
  # A rebuild leaves the image it replaced untagged: remove it, so repeated
  # builds do not fill the disk (one image of each architecture is kept).
  if [ -n "$previous" ] && [ "$(buildah inspect --type image --format '{{.FromImageID}}' "$tag")" != "$previous" ]; then
    buildah rmi "$previous" >/dev/null 2>&1 || true
  fi
done

if [ "$engine" = buildah ]; then
  list="$repo:$version"
  buildah manifest rm "$list" >/dev/null 2>&1 || true
  buildah manifest create "$list" >/dev/null
  for t in "${tags[@]}"; do
    buildah manifest add "$list" "$t" >/dev/null
    a=${t##*-}
    rm -f "$out/dpu-service-$version-$a.oci.tar"
    buildah push --quiet "$t" "oci-archive:$out/dpu-service-$version-$a.oci.tar:$t"
  done
fi

[ "$check" = 1 ] || { echo "images/build.sh: built ${tags[*]}" >&2; exit 0; }

fail() { echo "image check ($1): $2" >&2; exit 1; }
descendants() {
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
dpuctl_host="$(bin_dir "$host_arch")/dpuctl"
for t in "${tags[@]}"; do
  a=${t##*-}
  buildah inspect --type image "$t" >"$out/inspect-$a.json"
  python3 - "$a" "$version" "$revision" "$out/inspect-$a.json" <<'PY' || exit 1
import json, sys
arch, version, revision = sys.argv[1], sys.argv[2], sys.argv[3]
image = json.load(open(sys.argv[4]))["Docker"]
cfg = image["config"]
def need(ok, what):
    if not ok:
        sys.exit(f"image check ({arch}): {what}; config: {json.dumps(cfg)}")
need(image.get("architecture") == arch and image.get("os") == "linux", f"platform linux/{arch}")
need(cfg.get("User") == "10001:10001", "runs as the non-root user 10001")
labels = cfg.get("Labels") or {}
need(labels.get("org.opencontainers.image.version") == version, "version label")
need(labels.get("org.opencontainers.image.revision") == revision, "revision label")
need(labels.get("org.opencontainers.image.source", "").startswith("https://"), "source label")
need(cfg.get("Entrypoint") == ["/usr/bin/dpu-service"], "entrypoint")
hc = (cfg.get("Healthcheck") or {}).get("Test") or []
need(hc[:2] == ["CMD", "/usr/bin/dpuctl"] and "health" in hc, "health check runs dpuctl health")
need({"50051/tcp", "50052/tcp", "9464/tcp", "4420/tcp", "8009/tcp"} <= set(cfg.get("ExposedPorts") or {}), "exposed ports")
PY
  c=$(buildah from --quiet --pull-never --arch "$a" "$t")
  mnt=$(buildah mount "$c")
  caps=$(getcap "$mnt/usr/bin/dpu-service")
  for cap in cap_ipc_lock cap_sys_rawio cap_sys_nice cap_net_admin cap_net_raw; do
    echo "$caps" | grep -q "$cap" || fail "$a" "dpu-service lacks file capability $cap: $caps"
  done
  [ ! -e "$mnt/usr/sbin/setcap" ] || fail "$a" "libcap2-bin was left in the image"
  buildah umount "$c" >/dev/null
  # Without the five capabilities in the bounding set the kernel refuses to
  # exec a binary whose file capabilities are effective: give them, as the
  # pod spec does.
  caps_add=(--cap-add CAP_IPC_LOCK --cap-add CAP_SYS_RAWIO --cap-add CAP_SYS_NICE
    --cap-add CAP_NET_ADMIN --cap-add CAP_NET_RAW)
  v=$(buildah run --isolation chroot "${caps_add[@]}" "$c" -- /usr/bin/dpu-service --version)
  [ "$v" = "dpu-service $version" ] || fail "$a" "--version printed '$v'"
  # A real start inside the image, as its user, on its own DPDK runtime.
  gp=$(free_port)
  hp=$(free_port)
  cat >"$ctx/check.toml" <<TOML
[grpc]
listen = "127.0.0.1:$gp"
health_listen = "127.0.0.1:$hp"
[metrics]
listen = "127.0.0.1:0"
[state]
dir = "/tmp/state"
[log]
format = "human"
[dataplane]
no_huge = true
memory_mb = 256
idle = "backoff"
mbufs = 2047
file_prefix = "image-check"
[[ports]]
id = "p0"
driver = "dpdk"
device = "net_null0"
[[ports]]
id = "pf0vf0"
driver = "dpdk"
device = "net_null1"
TOML
  buildah run --isolation chroot "${caps_add[@]}" --user 10001:10001 -v "$ctx/check.toml:/etc/dpu-service/check.toml:ro" \
    "$c" -- /usr/bin/dpu-service --config /etc/dpu-service/check.toml >"$out/check-$a.log" 2>&1 &
  pid=$!
  ok=0
  for _ in $(seq 1 300); do
    if "$dpuctl_host" --endpoint "http://127.0.0.1:$hp" --timeout 5 health >/dev/null 2>&1; then ok=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if [ "$ok" = 1 ]; then
    info=$("$dpuctl_host" --endpoint "http://127.0.0.1:$gp" --timeout 20 -o json info)
    echo "$info" | grep -q '"dataplaneDriver": "dpdk"' || { ok=0; echo "info: $info" >&2; }
  fi
  # The daemon runs under buildah's chroot helper: stop it, found among the
  # descendants of this buildah process only, with SIGTERM as a runtime would.
  for p in $(descendants "$pid"); do
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null || true)
    if [[ "$cmd" == *"/usr/bin/dpu-service --config"* && "$cmd" != buildah* ]]; then
      kill -TERM "$p" 2>/dev/null || true
    fi
  done
  wait "$pid" || ok=0
  buildah rm "$c" >/dev/null
  [ "$ok" = 1 ] || { cat "$out/check-$a.log" >&2; fail "$a" "the daemon in the image did not come up cleanly"; }
  grep -q 'INFO dpu_service: stopped' "$out/check-$a.log" || { cat "$out/check-$a.log" >&2; fail "$a" "no clean stop"; }
  echo "image check ($a): $t ok: $(du -h "$out/dpu-service-$version-$a.oci.tar" | cut -f1) archive"
done
