#!/usr/bin/env bash
# Memory budgets honoured: for each model and budget, `generate` with
# --memory-budget-mb on a ~400-token prompt (prefill in chunks, the KV cache
# growing), then the γ the plan chose, its expected peak and the measured
# peak RSS (VmHWM). Prints a markdown table.
#
#   lab/scripts/budget_table.sh "MODEL DTYPE MODE B1 B2 B3" ...
#   lab/scripts/budget_table.sh "models/smollm2-135m-instruct f16 load-only 250 290 330"
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/selectinfer}
PROMPT=$(python3 -c "print('The robot drove along the corridor and checked each door of the lab. ' * 25 + 'Which doors did the robot check?')")
echo "| model | dtype | mode | budget MiB | γ chosen | expected peak MiB | measured peak RSS MiB | prompt tokens |"
echo "|---|---|---|---|---|---|---|---|"
for row in "$@"; do
  read -r model dtype mode b1 b2 b3 <<<"$row"
  for b in $b1 $b2 $b3; do
    err=$(mktemp)
    out=$("$BIN" generate --model "$model" --dtype "$dtype" --mode "$mode" --memory-budget-mb "$b" \
      --max-context 1024 --prefill-chunk 256 --max-new-tokens 16 --json --prompt "$PROMPT" 2>"$err") || {
      echo "| $(basename "$model") | $dtype | $mode | $b | refused: $(grep -o 'below the floor of [0-9]* MiB' "$err") | | | |"; continue; }
    python3 - "$out" "$(cat "$err")" "$model" "$dtype" "$mode" "$b" <<'PY'
import json, os, re, sys
r, log, model, dtype, mode, b = json.loads(sys.argv[1]), sys.argv[2], *sys.argv[3:]
g = re.search(r"load_ratio ([0-9.]+)", log).group(1)
e = re.search(r"expected peak ([0-9]+) MiB", log).group(1)
print(f"| {os.path.basename(model)} | {dtype} | {mode} | {b} | {g} | {e} | {r['peak_rss_bytes'] / 2**20:.0f} | {r['prompt_tokens']} |")
PY
    rm -f "$err"
  done
done
