#!/usr/bin/env bash
# The knob study of docs/RESULTS.md: selectinfer at the issue's operating point
# (γ=0.7, δ=0.2, φ=0.4, α=0.2, first and last layer dense) with one knob moved
# at a time. Each knob gets its own folder OUT_ROOT/<knob> (resumable, like
# scripts/eval_modes.sh, which runs every configuration) and its own table.
# Usage: scripts/knob_study.sh MODEL_DIR LIMIT OUT_ROOT [knob ...]
# Knobs: alpha0.5 alpha0.1 delta0.1 delta0.3 gamma0.9 dense6 (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/smollm2-135m-instruct}; LIMIT=${2:-100}; ROOT=${3:-runs/knobs}
shift 3 || true
KNOBS=${*:-"alpha0.5 alpha0.1 delta0.1 delta0.3 gamma0.9 dense6"}
LAST=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'] - 1)" "$MODEL/config.json")
for knob in $KNOBS; do
  env=()
  case $knob in
    alpha*) env=(ALPHA="${knob#alpha}") ;;
    delta*) env=(DELTA="${knob#delta}") ;;
    gamma*) env=(GAMMA="${knob#gamma}") ;;
    dense6) env=(DENSE_LAYERS="0,1,2,$((LAST - 2)),$((LAST - 1)),$LAST") ;;
    *) echo "unknown knob '$knob' (alpha<x>, delta<x>, gamma<x>, dense6)" >&2; exit 2 ;;
  esac
  mkdir -p "$ROOT/$knob"
  echo "## $knob (${env[*]})"
  env "${env[@]}" CONFIGS="selectinfer:0.4" scripts/eval_modes.sh "$MODEL" "$LIMIT" "$ROOT/$knob" | tee "$ROOT/$knob/table.md"
done
