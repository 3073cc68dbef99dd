#!/usr/bin/env bash
# Calibrates `layer_drop` (how the neurons phi leaves out are shared among
# the layers) for a model: one fidelity candidate per layer, that layer alone
# at phi 0.4 (coreinfer, wina) and every other layer whole, on calibration
# prompts (dev rows SKIP.. of each task, not the rows RESULTS.md compares
# on), then lab/scripts/layer_drop.py turns the layers' KL into weights.
# Usage: lab/scripts/layer_scan.sh [MODEL_DIR] [LIMIT] [OUT_JSON]
# Run by hand (Qwen 0.5B f16, 4 prompts per task: ~12 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/qwen2.5-coder-0.5b-instruct}; LIMIT=${2:-4}
OUT=${3:-docs/fidelity/$(basename "$MODEL")-layer-scan.json}
DTYPE=${DTYPE:-f16}; SKIP=${SKIP:-8}; BETA=${BETA:-0.67}; PHI=${PHI:-0.65}
LAYERS=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$MODEL/config.json")
C=()
for l in $(seq 0 $((LAYERS - 1))); do
  # phi 0.7 with weight 2 on layer l alone: phi_l = 1 - 2 * 0.3 = 0.4.
  W=$(python3 -c "print(':'.join('2' if i == $l else '0' for i in range($LAYERS)))")
  C+=(--candidate "mode=coreinfer,phi=0.7,score=wina,dense=,drop=$W")
done
mkdir -p "$(dirname "$OUT")"
cargo build --release --bin selectinfer
target/release/selectinfer fidelity --model "$MODEL" --dtype "$DTYPE" --reference-dtype "$DTYPE" \
  --skip "$SKIP" --limit "$LIMIT" --tokens 32 "${C[@]}" --json > "$OUT"
lab/scripts/layer_drop.py "$OUT" --beta "$BETA" --phi "$PHI" --dense "0,$((LAYERS - 1))"
