#!/usr/bin/env bash
# The Jetson's CPU side, checked from an x86 machine: builds the library and
# binaries for aarch64 (what a native Jetson build compiles, less CUDA and
# ROS) and runs tests under qemu-user, so the portable CPU kernels (the x86
# build takes its AVX2 paths) are exercised too.
#
#   scripts/check_aarch64.sh          # build + unit tests (7.5 min from cold on 2 cores)
#   scripts/check_aarch64.sh --real   # + parity and real-weights tests (+6 min;
#                                     #   needs models/, see scripts/test.sh)
#
# Installs what it needs: the aarch64 std (rustup), Debian's cross gcc (for
# the -sys crates' C code) and qemu-user. Not part of scripts/test.sh: the
# rustup download is not a registry every CI machine reaches.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "" | --real) ;;
  *) echo "usage: $0 [--real]   (unknown argument: $1)" >&2; exit 2 ;;
esac
TARGET=aarch64-unknown-linux-gnu
need() { command -v "$1" >/dev/null 2>&1; }
if ! rustup target list --installed | grep -qx "$TARGET"; then
  rustup target add "$TARGET"
fi
if ! need aarch64-linux-gnu-gcc || ! need qemu-aarch64; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get install -y -q gcc-aarch64-linux-gnu qemu-user
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo build --release --target "$TARGET" --bins
cargo test --release --target "$TARGET" --lib
if [ "${1:-}" = "--real" ]; then
  cargo test --release --target "$TARGET" --lib model::tests::parity
  cargo test --release --target "$TARGET" --test real_weights
fi
echo "aarch64: build and tests passed"
