#!/usr/bin/env bash
# Fidelity of the weight formats against dense f32 (the exactly dequantized
# GGUF), teacher-forced on the dev prompts of each task (selectinfer
# fidelity): q8 and q4 on every task in one pass of the reference, then q4
# next to candle's quantized GGUF model (the same blocks) on the translation
# prompts (candle's Q4_1 dot is its scalar one: a 500-token summarization
# prompt takes it minutes).
# Usage: lab/scripts/fidelity_quant.sh [MODEL_DIR] [LIMIT] [TOKENS] [GGUF_LIMIT]
# Writes docs/bench/fidelity-<model>.json, ...-gguf.json and prints the tables.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/smollm2-135m-instruct}
LIMIT=${2:-20}
TOKENS=${3:-32}
GGUF_LIMIT=${4:-10}
BIN=${BIN:-target/release/selectinfer}
mkdir -p docs/bench
out=docs/bench/fidelity-$(basename "$MODEL")
"$BIN" fidelity --model "$MODEL" --dtypes q8,q4 --limit "$LIMIT" --tokens "$TOKENS" --json > "$out.json"
"$BIN" fidelity --model "$MODEL" --dtypes q4 --gguf --data ../shared/data/translation_wmt22_deen.dev.jsonl \
  --limit "$GGUF_LIMIT" --tokens "$TOKENS" --json > "$out-gguf.json"
for f in "$out.json" "$out-gguf.json"; do
python3 - "$f" <<'PY'
import json, sys
print("| engine | task | prompts | positions | mean KL | top-1 | first divergence | MB/token | s |")
print("|---|---|---|---|---|---|---|---|---|")
for name, tasks in json.load(open(sys.argv[1])):
    for t in tasks:
        print(f"| {name} | {t['task']} | {t['prompts']} | {t['positions']} | {t['mean_kl']:.4f} | "
              f"{t['top1_agreement']:.3f} | {t['mean_first_divergence']:.1f} | {t['decode_bytes_per_token'] / 1e6:.1f} | {t['seconds']:.0f} |")
PY
done
