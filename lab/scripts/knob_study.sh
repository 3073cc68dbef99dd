#!/usr/bin/env bash
# The knob study of docs/RESULTS.md: selectinfer at the issue's operating point
# (γ=0.7, δ=0.2, φ=0.4, α=0.2, first and last layer dense) with one knob moved
# at a time. Each knob gets its own folder OUT_ROOT/<knob> (resumable, like
# lab/scripts/eval_modes.sh, which runs every configuration) and its own table.
# Usage: lab/scripts/knob_study.sh MODEL_DIR LIMIT OUT_ROOT [knob ...]
# A knob may end in @φ to run at another compute ratio (e.g. dense6@0.3: six
# dense layers at the operating point's overall compute).
# Knobs (default: all): alpha0.5 alpha0.1 delta0.1 delta0.3 gamma0.9 dense6,
# heldout: the ranking profiled on rows the evaluation does not score
# (`selectinfer_profile --config config/profile-heldout.yaml` writes it), and
# gen<N>: the ranking profiled with N generated tokens scored per example
# instead of 8 (`selectinfer_profile --generated-tokens N --output
# rankings/<model>.gen<N>.ranking.safetensors` writes it).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/smollm2-135m-instruct}; LIMIT=${2:-100}; ROOT=${3:-runs/knobs}
shift 3 || true
KNOBS=${*:-"alpha0.5 alpha0.1 delta0.1 delta0.3 gamma0.9 dense6 heldout"}
LAST=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'] - 1)" "$MODEL/config.json")
for knob in $KNOBS; do
  env=(); extra=(); phi=0.4
  case $knob in *@*) phi=${knob#*@} ;; esac
  name=${knob%@*}
  case $name in
    heldout | gen[0-9]*) extra=(--ranking "rankings/$(basename "$MODEL").$name.ranking.safetensors") ;;
    alpha*) env=(ALPHA="${name#alpha}") ;;
    delta*) env=(DELTA="${name#delta}") ;;
    gamma*) env=(GAMMA="${name#gamma}") ;;
    dense6) env=(DENSE_LAYERS="0,1,2,$((LAST - 2)),$((LAST - 1)),$LAST") ;;
    *) echo "unknown knob '$knob' (alpha<x>, delta<x>, gamma<x>, dense6, heldout, gen<N>)" >&2; exit 2 ;;
  esac
  mkdir -p "$ROOT/$knob"
  echo "## $knob (${env[*]} ${extra[*]})"
  env "${env[@]}" CONFIGS="selectinfer:$phi" lab/scripts/eval_modes.sh "$MODEL" "$LIMIT" "$ROOT/$knob" "${extra[@]}" \
    | tee "$ROOT/$knob/table.md"
done
