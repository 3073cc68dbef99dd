#!/bin/bash
# Peak RSS (VmHWM) against RSS after load, per dtype and mode, for one or
# more builds alternated: `scripts/bench_rss.sh BIN [BIN ...] [-- MODEL]`
# (e.g. a copy of an earlier build's target/release/selectinfer and the
# current one). Prints: round, binary, dtype, mode, peak MiB, after-load
# MiB, ratio, decode tok/s, TTFT s. docs/EXPERIMENTS.md, "Memory after load: the allocator and prefill's buffers (2026-12-03, evening)".
set -euo pipefail
cd "$(dirname "$0")/.."
bins=()
model=models/smollm2-135m-instruct
while [ $# -gt 0 ]; do
  case "$1" in
    --) model="$2"; shift 2 ;;
    *) bins+=("$1"); shift ;;
  esac
done
[ ${#bins[@]} -gt 0 ] || bins=(target/release/selectinfer)
rows=("f32 dense" "f16 dense" "q8 dense" "q4 dense" "q4 load-only" "q4 selectinfer" "f16 selectinfer" "q8 selectinfer")
for round in 1 2; do
  for row in "${rows[@]}"; do
    set -- $row
    for bin in "${bins[@]}"; do
      "$bin" bench --model "$model" --dtype "$1" --mode "$2" --new-tokens 64 --json |
        python3 -c "import json,sys; d=json.load(sys.stdin); M=2**20; print('$round', '$bin', '$1', '$2', d['peak_rss_bytes']//M, d['rss_after_load_bytes']//M, '%.3f' % (d['peak_rss_bytes']/d['rss_after_load_bytes']), '%.1f' % d['decode_tokens_per_s'], '%.3f' % d['ttft_s'])"
    done
  done
done
