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
flock "${TMPDIR:-/tmp}/dpu-service-spdk-build.lock" "$build" \
  "${rbd[@]}" --dir "$cache" | tail -n 1
