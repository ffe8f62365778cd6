#!/usr/bin/env bash
# Installs what building, running and testing dpu-service needs on Debian,
# skipping what is already there. Safe to run repeatedly.
set -euo pipefail

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }

have cc || need_apt+=(build-essential)
have pkg-config || need_apt+=(pkg-config)
have openssl || need_apt+=(openssl)
have curl || need_apt+=(curl)
# Traffic tests: network namespaces, veth pairs and ping.
have ip || need_apt+=(iproute2)
have ping || need_apt+=(iputils-ping)
# TCP through software ports needs the veths' offloads off (ethtool -K).
have ethtool || need_apt+=(ethtool)
have python3 || need_apt+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
# DPDK development files (dpdk-sys binds them) and libclang (bindgen).
pkg-config --exists libdpdk 2>/dev/null || need_apt+=(libdpdk-dev)
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || need_apt+=(libclang-dev)
# OpenSSL's development files (openssl-sys links libssl: the NVMe/TCP
# secure channel, dpu-tls).
pkg-config --exists openssl 2>/dev/null || need_apt+=(libssl-dev)
# Ceph's block device client (rbd-sys binds it; RBD namespaces), and a
# real single-node cluster for their tests (shared/tools/ceph/ceph-up.sh):
# monitor, OSD and the `rbd` tool.
for p in librbd-dev librados-dev ceph-mon ceph-osd ceph-common; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
# The kernel NVMe/TCP initiator's guest (tests/tests/e2e/nvme_kernel.rs), where
# its harness is present: installed here, once, because its tests start
# guests in parallel and each would otherwise run apt-get, racing for
# dpkg's lock.
if [ -x "${KERNEL_NVME_RUN:-../shared/tools/kernel-nvme/run.sh}" ] ||
  [ -x /work/shared/tools/kernel-nvme/run.sh ]; then
  have qemu-system-x86_64 || need_apt+=(qemu-system-x86)
  have cpio || need_apt+=(cpio)
  # tests/kernel-tls-share.sh unpacks the guest kernel's TLS modules.
  have xz || need_apt+=(xz-utils)
  have busybox || need_apt+=(busybox-static)
  have nvme || [ -x /usr/sbin/nvme ] || need_apt+=(nvme-cli)
  have fio || need_apt+=(fio)
  have depmod || [ -x /usr/sbin/depmod ] || [ -x /sbin/depmod ] || need_apt+=(kmod)
  have socat || need_apt+=(socat)
fi

# SPDK's initiator for the interop tests (tests/run.sh builds it with the
# shared tool in the background): its build dependencies, installed here
# with the rest, so the background build never runs apt itself.
if [ -x ../shared/tools/spdk/build.sh ] || [ -x /work/shared/tools/spdk/build.sh ]; then
  for p in build-essential pkg-config libdpdk-dev dpdk libnuma-dev uuid-dev libssl-dev \
    libaio-dev nasm autoconf automake libtool libncurses-dev libcunit1-dev libjson-c-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
  done
fi

if ((${#need_apt[@]})); then
  echo "deps: installing ${need_apt[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if ! have cargo; then
  cat >&2 <<'MSG'
deps: cargo is not installed. Install a current Rust toolchain (1.88 or newer)
with rustup (https://rustup.rs), then run this again. Debian's own cargo
package is too old for this workspace.
MSG
  exit 1
fi
