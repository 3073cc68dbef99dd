#!/usr/bin/env bash
# Fidelity of the weight formats against dense f32 (the exactly dequantized
# GGUF), teacher-forced on the dev prompts of each task (selectinfer
# fidelity): q8, q4 and candle's quantized GGUF model (the same blocks), in
# one pass of the reference.
# Usage: scripts/fidelity_quant.sh [MODEL_DIR] [LIMIT] [TOKENS]
# Writes docs/bench/fidelity-<model>.json and prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/smollm2-135m-instruct}
LIMIT=${2:-20}
TOKENS=${3:-32}
BIN=${BIN:-target/release/selectinfer}
mkdir -p docs/bench
out=docs/bench/fidelity-$(basename "$MODEL").json
"$BIN" fidelity --model "$MODEL" --dtypes q8,q4 --gguf --limit "$LIMIT" --tokens "$TOKENS" --json > "$out"
python3 - "$out" <<'PY'
import json, sys
print("| engine | task | prompts | positions | mean KL | top-1 | first divergence | MB/token |")
print("|---|---|---|---|---|---|---|---|")
for name, tasks in json.load(open(sys.argv[1])):
    for t in tasks:
        print(f"| {name} | {t['task']} | {t['prompts']} | {t['positions']} | {t['mean_kl']:.4f} | "
              f"{t['top1_agreement']:.3f} | {t['mean_first_divergence']:.1f} | {t['decode_bytes_per_token'] / 1e6:.1f} |")
PY
