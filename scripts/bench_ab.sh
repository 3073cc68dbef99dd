#!/usr/bin/env bash
# Same-run A/B of two builds of the CLI: `selectinfer bench` (3 fixed
# prompts, 64 new tokens each, f16 or $DTYPE) for dense and selectinfer on both
# models, the two binaries alternated config by config, ROUNDS rounds.
# Prints one JSON line per run and a table of medians.
#
#   scripts/bench_ab.sh BIN_A BIN_B [ROUNDS]
#
# E.g. the build of a commit against the working tree's:
#   git worktree add /tmp/a <commit> && (cd /tmp/a && cargo build --release)
#   cargo build --release && scripts/bench_ab.sh /tmp/a/target/release/selectinfer target/release/selectinfer
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
  echo "usage: $0 BIN_A BIN_B [ROUNDS]  (two selectinfer executables)" >&2
  exit 2
fi
A=$1 B=$2 ROUNDS=${3:-3} DTYPE=${DTYPE:-f16}
OUT=$(mktemp)
for round in $(seq "$ROUNDS"); do
  for model in smollm2-135m-instruct qwen2.5-coder-0.5b-instruct; do
    for mode in dense selectinfer; do
      for which in a b; do
        bin=$A; [ $which = b ] && bin=$B
        r=$("$bin" bench --model "models/$model" --dtype "$DTYPE" --mode $mode --json 2>/dev/null)
        python3 -c "import json,sys; r=json.loads(sys.argv[1]); print(json.dumps({'round':$round,'model':'$model','mode':'$mode','build':'$which','decode':r['decode_tokens_per_s'],'prefill':r['prefill_tokens_per_s'],'ttft':r['ttft_s'],'peak_rss_mib':r['peak_rss_bytes']/1048576,'mb_per_token':r['weight_bytes_per_token']/1e6}))" "$r" | tee -a "$OUT"
      done
    done
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\n| model | mode | decode tok/s A | decode tok/s B | B/A | prefill tok/s A | prefill tok/s B | peak RSS MiB A / B |")
print("|---|---|---|---|---|---|---|---|")
for model in dict.fromkeys(r["model"] for r in rows):
    for mode in dict.fromkeys(r["mode"] for r in rows):
        sel = lambda w, k: statistics.median(r[k] for r in rows if r["model"] == model and r["mode"] == mode and r["build"] == w)
        a, b = sel("a", "decode"), sel("b", "decode")
        print(f"| {model} | {mode} | {a:.1f} | {b:.1f} | {b / a:.3f} | {sel('a', 'prefill'):.1f} | {sel('b', 'prefill'):.1f} | {sel('a', 'peak_rss_mib'):.0f} / {sel('b', 'peak_rss_mib'):.0f} |")
PY
