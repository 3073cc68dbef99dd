#!/usr/bin/env bash
# Accuracy, speed and memory of the engine modes on the three dev tasks.
# Usage: lab/scripts/eval_modes.sh MODEL_DIR LIMIT OUT_DIR [extra flags for every run]
# CONFIGS (env) lists "mode:φ" entries; the default is the issue's set:
# dense, load-only γ=0.7, selectinfer γ=0.7 φ∈{0.3,0.4,0.5}, coreinfer φ=0.4,
# random-load γ=0.7 φ=0.4 (δ=0.2, α=0.2, layers 0 and last dense unless the
# extra flags say otherwise). The knobs can be moved with GAMMA, DELTA, ALPHA
# and DENSE_LAYERS (env; defaults 0.7, 0.2, 0.2, "0,LAST") for the knob study.
# Per-example outputs go to
# OUT_DIR/<mode>-<φ>.<task>.jsonl (resumable); prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/smollm2-135m-instruct}; LIMIT=${2:-100}; OUT=${3:-runs/eval}
shift 3 || true
CONFIGS=${CONFIGS:-"dense:1 load-only:0.7 selectinfer:0.3 selectinfer:0.4 selectinfer:0.5 coreinfer:0.4 random-load:0.4"}
TASKS=${TASKS:-"translation_wmt22_deen summarization_xsum qa_squad11"}
BIN=${BIN:-target/release/selectinfer}
DATA=../shared/data
LAYERS=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$MODEL/config.json")
GAMMA=${GAMMA:-0.7}; DELTA=${DELTA:-0.2}; ALPHA=${ALPHA:-0.2}; DENSE_LAYERS=${DENSE_LAYERS:-"0,$((LAYERS - 1))"}
mkdir -p "$OUT"
echo "| mode | φ | task | metrics | n | TTFT s | decode tok/s | φ used | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|"
for cfg in $CONFIGS; do
  mode=${cfg%%:*}; phi=${cfg##*:}
  phi_flag=(--compute-ratio "$phi"); [ "$mode" = dense ] || [ "$mode" = load-only ] && phi_flag=(--compute-ratio 0.4)
  for task in $TASKS; do
    "$BIN" eval --model "$MODEL" --mode "$mode" --task "${task%%_*}" \
      --load-ratio "$GAMMA" --static-ratio "$DELTA" "${phi_flag[@]}" --token-ratio "$ALPHA" \
      --dense-layers "$DENSE_LAYERS" "$@" \
      --data "$DATA/$task.dev.jsonl" --limit "$LIMIT" --max-new-tokens 48 \
      --out "$OUT/$mode-$phi.${task%%_*}.jsonl" --json 2>/dev/null | MODE=$mode PHI=$phi python3 -c '
import json, os, sys
r = json.load(sys.stdin)
m = ", ".join("%s %.2f" % kv for kv in r["metrics"].items())
cells = [os.environ["MODE"], os.environ["PHI"], r["task"], m, str(r.get("examples", "")), "%.3f" % r["mean_ttft_s"],
         "%.1f" % r["mean_decode_tokens_per_s"], "%.3f" % r["mean_compute_ratio"], "%.0f" % (r["peak_rss_bytes"] / 2**20)]
print("| " + " | ".join(cells) + " |")'
  done
done
