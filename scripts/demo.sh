#!/usr/bin/env bash
# The project's main job (README): builds, prepares the default model
# (SmolLM2-135M-Instruct) and answers a demo prompt.
set -euo pipefail
cd "$(dirname "$0")/.."

PROMPT=${1:-"A mobile robot must carry a box from the kitchen to the lab. List three safety checks it should make first."}
cargo build --release --bins
./target/release/selectinfer prepare-model smollm2-135m-instruct
./target/release/selectinfer generate --model models/smollm2-135m-instruct --prompt "$PROMPT" --max-new-tokens 128
