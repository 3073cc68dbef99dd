#!/usr/bin/env bash
# Decode speed, TTFT, peak RSS, RSS after the runs (engine loaded, last
# prompt's decode weights built) and bytes/token of every engine mode on one
# model, one process per mode, one after another (same prompts, 64 tokens).
# Usage: lab/scripts/bench_modes.sh [MODEL_DIR] [extra bench flags...]
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/smollm2-135m-instruct}
shift || true
BIN=${BIN:-target/release/selectinfer}
COMMON=(--model "$MODEL" --task qa --load-ratio 0.7 --static-ratio 0.2 --compute-ratio 0.4 --token-ratio 0.2 "$@")
echo "| mode | decode tok/s | TTFT s | compact build ms | peak RSS MiB | RSS after MiB | weights MB/token |"
echo "|---|---|---|---|---|---|---|"
for mode in dense load-only selectinfer coreinfer random-load; do
  "$BIN" bench "${COMMON[@]}" --mode "$mode" --json 2>/dev/null | MODE=$mode python3 -c '
import json, os, sys
r = json.load(sys.stdin)
cells = [os.environ["MODE"], "%.1f" % r["decode_tokens_per_s"], "%.3f" % r["ttft_s"], "%.1f" % (1000 * r["compact_build_s"]),
         "%.0f" % (r["peak_rss_bytes"] / 2**20), "%.0f" % (r["rss_after_bytes"] / 2**20),
         "%.1f" % (r["weight_bytes_per_token"] / 1e6)]
print("| " + " | ".join(cells) + " |")'
done
