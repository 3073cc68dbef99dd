#!/usr/bin/env bash
# Accuracy, speed and memory of every engine mode on the three dev tasks.
# Usage: scripts/eval_modes.sh MODEL_DIR LIMIT OUT_DIR [extra flags for every run]
# Per-example outputs go to OUT_DIR/<mode>.<task>.jsonl (resumable); prints a
# markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/smollm2-135m-instruct}; LIMIT=${2:-100}; OUT=${3:-runs/eval}
shift 3 || true
BIN=target/release/selectinfer
DATA=../shared/data
mkdir -p "$OUT"
echo "| mode | task | metrics | TTFT s | decode tok/s | φ used | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|"
for mode in dense load-only selectinfer coreinfer random-load; do
  for task in translation_wmt22_deen summarization_xsum qa_squad11; do
    "$BIN" eval --model "$MODEL" --mode "$mode" --task "${task%%_*}" \
      --load-ratio 0.7 --static-ratio 0.2 --compute-ratio 0.4 --token-ratio 0.2 "$@" \
      --data "$DATA/$task.dev.jsonl" --limit "$LIMIT" --max-new-tokens 48 \
      --out "$OUT/$mode.${task%%_*}.jsonl" --json 2>/dev/null | MODE=$mode python3 -c '
import json, os, sys
r = json.load(sys.stdin)
m = ", ".join("%s %.2f" % kv for kv in r["metrics"].items())
cells = [os.environ["MODE"], r["task"], m, "%.3f" % r["mean_ttft_s"], "%.1f" % r["mean_decode_tokens_per_s"],
         "%.3f" % r["mean_compute_ratio"], "%.0f" % (r["peak_rss_bytes"] / 2**20)]
print("| " + " | ".join(cells) + " |")'
  done
done
