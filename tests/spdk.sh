#!/usr/bin/env bash
# Prints the SPDK tree the SPDK interop tests and benchmarks use, on its
# last line: $SPDK_DIR when set, else the tree the shared tool
# tools/spdk/build.sh builds from its tarballs (once per machine, 4-7
# minutes on 2 cores) or has built, in ${SPDK_CACHE:-~/.cache/spdk-v23.05}.
# Builds run under a lock, so callers at the same time wait for one build
# (tests/run.sh starts one in the background; the tests wait for it).
# Exits non-zero, saying why, when there is no tree and no tool to build one.
# With --with-rbd: a tree whose bdev_rbd serves Ceph images (the RBD
# benchmark), $SPDK_RBD_DIR or ${SPDK_RBD_CACHE:-~/.cache/spdk-v23.05-rbd}.
set -euo pipefail
cd "$(dirname "$0")/.."
rbd=()
dir=${SPDK_DIR:-}
cache=${SPDK_CACHE:-$HOME/.cache/spdk-v23.05}
if [ "${1:-}" = --with-rbd ]; then
  rbd=(--with-rbd)
  dir=${SPDK_RBD_DIR:-}
  cache=${SPDK_RBD_CACHE:-$HOME/.cache/spdk-v23.05-rbd}
fi
if [ -n "$dir" ]; then
  echo "$dir"
  exit 0
fi
build=""
for t in ../shared/tools/spdk/build.sh /work/shared/tools/spdk/build.sh; do
  [ -x "$t" ] && { build=$t; break; }
done
[ -n "$build" ] || { echo "spdk: no SPDK_DIR, and no shared tools/spdk/build.sh to build SPDK with" >&2; exit 1; }
# --dir always: the tool stops at once without it unless given --with-rbd.
# SPDK v23.05 derives its TLS keys (HKDF) with a NULL salt, which
# OpenSSL 3.0.17 and later refuse (Debian 12 has 3.0.19): no key could be
# loaded and no TLS connection made. An empty salt is what it meant (HKDF
# with no salt uses a string of zeros either way); the two calls are
# changed and the objects that include them rebuilt, once per tree.
fix_tls_salt() {
  local h=$1/include/spdk_internal/nvme_tcp.h
  grep -q 'set1_hkdf_salt(ctx, NULL, 0)' "$h" || return 0
  echo "spdk: $1: HKDF with an empty salt instead of NULL (OpenSSL >= 3.0.17), rebuilding" >&2
  sed -i 's/set1_hkdf_salt(ctx, NULL, 0)/set1_hkdf_salt(ctx, (const unsigned char *)"", 0)/' "$h"
  make -C "$1" -j"$(nproc)" >&2
}
# One build (and fix) at a time: the lock is held until this script ends.
exec 9>"${TMPDIR:-/tmp}/dpu-service-spdk-build.lock"
flock 9
tree=$("$build" "${rbd[@]}" --dir "$cache" | tail -n 1)
fix_tls_salt "$tree"
echo "$tree"
