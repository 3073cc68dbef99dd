#!/usr/bin/env bash
# The selection methods' retention/speed-up frontier on the fidelity
# instrument (docs/RESULTS.md, "Selection methods"): every method at several
# budgets against dense at the same dtype, same prompts, one run; then the
# plot (selectinfer_plot, the lab crate).
# Usage: lab/scripts/fidelity_frontier.sh [MODEL_DIR] [LIMIT] [OUT_JSON]
# Run by hand (Qwen 0.5B f16, 8 prompts per task: ~40 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/qwen2.5-coder-0.5b-instruct}; LIMIT=${2:-8}
OUT=${3:-docs/fidelity/$(basename "$MODEL")-f16.json}
DTYPE=${DTYPE:-f16}
LAYERS=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$MODEL/config.json")
C=(--candidate mode=dense)
for p in 0.3 0.4 0.5; do C+=(--candidate "mode=selectinfer,phi=$p"); done
for p in 0.4 0.5; do C+=(--candidate "mode=random-load,phi=$p"); done
for p in 0.4 0.5 0.6; do C+=(--candidate "mode=coreinfer,phi=$p"); done
C+=(--candidate mode=coreinfer,phi=0.5,score=griffin)
for p in 0.4 0.5 0.6 0.7; do C+=(--candidate "mode=coreinfer,phi=$p,score=wina"); done
for p in 0.5 0.6; do C+=(--candidate "mode=selectinfer,gamma=0.9,phi=$p,score=wina"); done
C+=(--candidate mode=coreinfer,phi=0.75,keep=0.5,score=wina
    --candidate mode=coreinfer,phi=0.6,keep=0.75,score=wina
    --candidate mode=coreinfer,phi=1,keep=0.5)
mkdir -p "$(dirname "$OUT")"
cargo build --release --bin selectinfer
# The paper's settings elsewhere: γ 0.7, δ 0.2, α 0.2; first and last layers dense.
target/release/selectinfer fidelity --model "$MODEL" --dtype "$DTYPE" --reference-dtype "$DTYPE" \
  --load-ratio 0.7 --static-ratio 0.2 --token-ratio 0.2 --dense-layers "0,$((LAYERS - 1))" \
  --limit "$LIMIT" --tokens 32 "${C[@]}" --json > "$OUT"
cargo run --release -p selectinfer-lab --bin selectinfer_plot -- "$OUT" --out "${OUT%.json}.png" \
  --title "$(basename "$MODEL") $DTYPE: top-1 agreement vs decode speed-up ($LIMIT prompts/task)"
