#!/bin/bash
# The lm_head screen's speed: decode of the selective configuration against
# dense, both Qwen2.5-Coder-0.5B f16, alternated rounds in one run
# (docs/BENCHMARKS.md, "The selective configuration with the 2-bit lm_head screen"). Prints, per round and
# configuration: decode tok/s, weight bytes per token, the per-prompt
# arrangement in s, peak RSS in MiB.
#   lab/scripts/bench_head_screen.sh [ROUNDS]   (after cargo build --release and
#   target/release/selectinfer prepare-model qwen2.5-coder-0.5b-instruct)
set -euo pipefail
cd "$(dirname "$0")/../.."
W=0.000,0.517,1.191,1.637,0.205,1.589,1.697,1.410,1.377,1.482,1.219,0.907,0.784,0.648,0.952,0.865,0.665,0.750,0.927,0.565,0.641,1.080,0.893,0.000
export RAYON_NUM_THREADS=2 SELECTINFER_THREADS=2
SEL="--mode coreinfer --score wina --vocab latin --head-screen 256 --head-screen-bits 2 --dense-layers 0,23 --layer-drop $W"
for r in $(seq 1 "${1:-6}"); do
  for cfg in dense phi0.9 phi0.875; do
    case $cfg in
      dense) m="--mode dense" ;;
      phi0.9) m="$SEL --compute-ratio 0.9" ;;
      phi0.875) m="$SEL --compute-ratio 0.875" ;;
    esac
    # shellcheck disable=SC2086
    out=$(target/release/selectinfer bench --model models/qwen2.5-coder-0.5b-instruct --dtype f16 $m --json 2>/dev/null |
      python3 -c 'import json,sys;d=json.load(sys.stdin);print(round(d["decode_tokens_per_s"],2), d["weight_bytes_per_token"], round(d.get("compact_build_s") or 0,3), d["peak_rss_bytes"]>>20)')
    echo "$r $cfg $out"
  done
done
