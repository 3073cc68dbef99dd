#!/usr/bin/env bash
# Starts selectinfer_node with a parameters file, the way `ros2 launch
# selectinfer node.launch.py` does on a real ROS 2 install (ros2 launch is
# not installable from PyPI). Sets ROS 2 up first (scripts/setup_ros.sh).
#
#   scripts/run_node.sh [PARAMS_FILE] [extra --ros-args ...]
#   default PARAMS_FILE: config/node.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
PARAMS=${1:-config/node.yaml}
shift || true
scripts/setup_ros.sh >/dev/null
# shellcheck disable=SC1091
source .ros/env.sh
cargo build --release --features ros --bins --quiet   # a no-op when up to date
exec target/release/selectinfer_node --ros-args --params-file "$PARAMS" "$@"
