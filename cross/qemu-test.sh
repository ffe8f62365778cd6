#!/usr/bin/env bash
# Runs one aarch64 test binary under qemu-user (cargo's runner in
# cross/test-aarch64.sh): qemu-aarch64-static -L "$SYSROOT" BINARY ARGS...
#
# qemu-user has once ended a test binary with SIGSEGV after it had printed
# that all its tests passed (rbd_tcp, as the process exited; not seen in 12
# runs since, nor natively). Such a binary, and only such a one, is run a
# second time, and the first crash is reported; a second crash, a failed
# test or a crash before the result line fails as usual.
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
qemu-aarch64-static -L "$SYSROOT" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -gt 128 ] && grep -qE '^test result: ok\. [0-9]+ passed; 0 failed' "$log" &&
  ! grep -qE '^test result: FAILED' "$log"; then
  echo "qemu-test: $(basename "$1") died by signal $((rc - 128)) after its tests passed; running it once more" >&2
  qemu-aarch64-static -L "$SYSROOT" "$@"
  rc=$?
fi
exit "$rc"
