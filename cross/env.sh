# Source this to cross-compile for aarch64-unknown-linux-gnu against the
# sysroot made by cross/sysroot.sh, and to run the results under qemu-user:
#   source cross/env.sh [SYSROOT]
# Needs: rustup target aarch64-unknown-linux-gnu, gcc-aarch64-linux-gnu,
# qemu-user-static, libclang-dev (bindgen).
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SYSROOT=$(realpath -m "${1:-$_root/target/aarch64-sysroot}")
export PKG_CONFIG_SYSROOT_DIR="$SYSROOT"
export PKG_CONFIG_LIBDIR="$SYSROOT/usr/lib/aarch64-linux-gnu/pkgconfig:$SYSROOT/usr/share/pkgconfig"
export PKG_CONFIG_ALLOW_CROSS=1
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CFLAGS_aarch64_unknown_linux_gnu="--sysroot=$SYSROOT"
export BINDGEN_EXTRA_CLANG_ARGS_aarch64_unknown_linux_gnu="--sysroot=$SYSROOT"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C link-arg=--sysroot=$SYSROOT"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L $SYSROOT"
unset _root
