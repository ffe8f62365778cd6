#!/usr/bin/env bash
# Prepares what a Linux 6.12 guest of the kernel-nvme harness
# (`--kernel-suite trixie`) needs to connect over the NVMe/TCP secure
# channel, in DIR, for the harness's `--share DIR`:
#   DIR/root/                 Debian 13's tlshd (ktls-utils), nvme-cli and
#                             keyctl with their libraries, run in the guest
#                             through their own loader (DIR/run, a wrapper)
#   DIR/modules/KVER/*.ko     the guest kernel's TLS and AES-GCM modules,
#                             which the harness's initramfs does not carry
# The guest loads the modules (`DIR/setup` does it all: modules, tlshd).
# Downloaded once with a private apt configuration (the machine's apt
# state is untouched) and kept in DIR; run again, it only checks.
#
# Usage: tests/kernel-tls-share.sh DIR
set -euo pipefail
out=$(realpath -m "${1:?usage: kernel-tls-share.sh DIR}")
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${KERNEL_NVME_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kernel-nvme}/trixie
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

apt_dir=$out/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/sources.list.d"
touch "$apt_dir/status"
echo "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$apt_dir/sources.list"
apt_() {
  local tool=$1; shift
  "$tool" -o Dir::Etc::sourcelist="$apt_dir/sources.list" -o Dir::Etc::sourceparts="$apt_dir/sources.list.d" \
    -o Dir::State::Lists="$apt_dir/lists" -o Dir::State::status="$apt_dir/status" -o Dir::Cache="$apt_dir/cache" \
    -o APT::Architecture=amd64 -o Acquire::Languages=none -o APT::Sandbox::User=root "$@"
}
[ -f "$apt_dir/lists/.updated" ] || { apt_ apt-get update -qq; touch "$apt_dir/lists/.updated"; }

# The guest's kernel: the one the harness built its image from, else the
# one it will take (the package linux-image-amd64 depends on).
kver=""
if [ -f "$cache/initrd.img" ]; then
  kver=$(cpio -t --quiet <"$cache/initrd.img" 2>/dev/null | sed -n 's|^lib/modules/\([^/]*\)$|\1|p' | head -n 1)
fi
if [ -z "$kver" ]; then
  kver=$(apt_ apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-/ {sub("^linux-image-", "", $2); print $2; exit}')
fi
[ -n "$kver" ] || { echo "kernel-tls-share: cannot tell the guest's kernel version" >&2; exit 1; }

want="userland-1 $kver"
if [ "$(cat "$out/.complete" 2>/dev/null)" = "$want" ]; then
  echo "$out"
  exit 0
fi

work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
pkgs=(ktls-utils nvme-cli keyutils libc6 libgcc-s1 libgnutls30t64 libnettle8t64 libhogweed6t64 libgmp10
  libp11-kit0 libtasn1-6 libidn2-0 libunistring5 libffi8 libnl-3-200 libnl-genl-3-200 libkeyutils1
  libglib2.0-0t64 libpcre2-8-0 libselinux1 libmount1 libblkid1 zlib1g libnvme1t64 libjson-c5 libssl3t64
  libdbus-1-3 libsystemd0 libcap2 liblz4-1 liblzma5 libzstd1 libgcrypt20 libgpg-error0 libxml2
  libatomic1 libuuid1 libstdc++6)
(cd "$work" && apt_ apt-get download -qq "${pkgs[@]}" "linux-image-$kver")
rm -rf "$out/root" "$out/modules"
mkdir -p "$out/root" "$out/modules/$kver"
for d in "$work"/*.deb; do
  case "$(basename "$d")" in
    linux-image-*) dpkg-deb --fsys-tarfile "$d" | tar -x -C "$work" --wildcards \
        '*/kernel/net/tls/tls.ko*' '*/kernel/crypto/gcm.ko*' '*/kernel/crypto/ghash-generic.ko*' \
        '*/kernel/crypto/crypto_null.ko*' '*/kernel/lib/crypto/gf128mul.ko*' ;;
    *) dpkg -x "$d" "$out/root" ;;
  esac
done
for f in $(find "$work" -name '*.ko*'); do
  name=$(basename "$f"); name=${name%.xz}
  case "$f" in *.xz) xz -dc "$f" >"$out/modules/$kver/$name" ;; *) cp "$f" "$out/modules/$kver/$name" ;; esac
done
[ "$(ls "$out/modules/$kver" | wc -l)" = 5 ] || { echo "kernel-tls-share: modules missing for $kver" >&2; exit 1; }

cat >"$out/run" <<'RUN'
#!/bin/sh
# Runs a program of this share's Debian 13 userland in the guest.
R=$(dirname "$0")/root
exec "$R/usr/lib64/ld-linux-x86-64.so.2" --library-path "$R/usr/lib/x86_64-linux-gnu" "$@"
RUN
cat >"$out/setup" <<'SETUP'
#!/bin/sh
# In the guest: the kernel's TLS and AES-GCM modules, and tlshd serving
# the kernel's handshakes with the keys of the .nvme keyring.
S=$(dirname "$0")
for m in gf128mul crypto_null ghash-generic gcm tls; do
  insmod "$S/modules/$(uname -r)/$m.ko" 2>/dev/null || true
done
grep -q '^tls ' /proc/modules || { echo "setup: no tls module for $(uname -r)"; exit 1; }
mkdir -p /etc
printf '[debug]\nloglevel=0\ntls=0\nnl=0\n[authenticate]\nkeyrings=.nvme\n[authenticate.client]\n[authenticate.server]\n' >/etc/tlshd.conf
"$S/run" "$S/root/usr/sbin/tlshd" -s -c /etc/tlshd.conf >/tmp/tlshd.log 2>&1 &
sleep 1
SETUP
chmod +x "$out/run" "$out/setup"
echo "$want" >"$out/.complete"
echo "$out"
