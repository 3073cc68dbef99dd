#!/usr/bin/env bash
# Replay benchmark: the same 100-prompt bag (task mix from the dev sets,
# written by scripts/make_bag.py with rosbags) against the node in dense and
# selectinfer mode, one after the other in one run; prints the reports and
# the selectinfer/dense ratios.
# Usage: scripts/bench_replay.sh [OUT_DIR] [extra selectinfer_replay flags]
# Default flags: --timing fast --max-inflight 2 (throughput-bound).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/replay}
shift || true
FLAGS=("$@"); [ ${#FLAGS[@]} -eq 0 ] && FLAGS=(--timing fast --max-inflight 2)
# shellcheck disable=SC1091
source .ros/env.sh
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-$((RANDOM % 100 + 1))}
mkdir -p "$OUT"
BAG=$OUT/mix100
[ -d "$BAG" ] || python scripts/make_bag.py "$BAG" --count 100 --rate 0.5 --max-new-tokens 48
for mode in dense selectinfer; do
    ./target/release/selectinfer_node --ros-args --params-file config/node.yaml \
        -p mode:=$mode -p load_ratio:=0.7 -p static_ratio:=0.2 -p compute_ratio:=0.4 \
        -p token_ratio:=0.2 -p queue_depth:=8 >"$OUT/node-$mode.log" 2>&1 &
    NODE=$!
    until grep -qs "serving ~/generate" "$OUT/node-$mode.log"; do
        kill -0 $NODE 2>/dev/null || { cat "$OUT/node-$mode.log"; exit 1; }
        sleep 0.2
    done
    ./target/release/selectinfer_replay "$BAG" "${FLAGS[@]}" \
        --json "$OUT/$mode.json" --markdown "$OUT/$mode.md"
    kill -INT $NODE; wait $NODE
    grep "ready:" "$OUT/node-$mode.log" | sed "s/^/  $mode node: /"
done
python3 - "$OUT" <<'PY'
import json, sys
d = {m: json.load(open(f"{sys.argv[1]}/{m}.json")) for m in ("dense", "selectinfer")}
def ratio(key, sub=None):
    a, b = d["selectinfer"][key], d["dense"][key]
    if sub: a, b = a[sub], b[sub]
    return a / b if a and b else float("nan")
print(f"selectinfer/dense: throughput {ratio('throughput_rps'):.2f}x, tok/s {ratio('tokens_per_s'):.2f}x, "
      f"mean decode tok/s {ratio('mean_decode_tokens_per_s'):.2f}x, TTFT p50 {ratio('ttft_s','p50'):.2f}x, "
      f"latency p50 {ratio('latency_s','p50'):.2f}x p90 {ratio('latency_s','p90'):.2f}x")
PY
