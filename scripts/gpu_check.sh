#!/usr/bin/env bash
# The GPU machine's check, in one run (about 4 minutes on an H200):
#  1. CPU-vs-GPU logits parity (f16) on SmolLM2- and Qwen2.5-0.5B-shaped
#     synthetic models, dense / load-only / selectinfer;
#  2. decode tok/s, TTFT and GPU memory of dense, load-only and selectinfer
#     (γ=0.7, φ=0.4) on a Llama-3.2-3B-shaped synthetic model, twice in
#     alternating order, with the GPU's memory polled by nvidia-smi.
# Synthetic weights: speed and memory only, never accuracy.
#
# Here (build, no GPU needed):
#   scripts/setup_cuda.sh && source .ros/env.sh && source .cuda/env.sh
#   CUDA_COMPUTE_CAP=90 CARGO_TARGET_DIR=target/cuda cargo build --release --features cuda,ros --bins
# There (the device tool carries the binary; BIN names it):
#   BIN=path/to/selectinfer scripts/gpu_check.sh OUT_DIR
# Every result lands in OUT_DIR (JSON per run, nvidia-smi traces, log.txt).
# The CUDA runtime libraries (cudart, cublas, curand of CUDA 13) are taken
# from the machine's Python packages (nvidia/cu13/lib) unless
# CUDA_RUNTIME_LIBS names a folder.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu}
mkdir -p "$OUT"
BIN=${BIN:-target/cuda/release/selectinfer}
W=${SYNTH_DIR:-/tmp/selectinfer-synth}
SHAPE3B=${SHAPE3B:-config/shapes/llama-3.2-3b.json}
ROUNDS=${ROUNDS:-2}
if [ -z "${CUDA_RUNTIME_LIBS:-}" ]; then
  CUBLAS=$(find /opt /usr -name 'libcublas.so.13*' -path '*cu13*' 2>/dev/null | head -1)
  CUDA_RUNTIME_LIBS=$(dirname "$CUBLAS")
fi
export LD_LIBRARY_PATH=$CUDA_RUNTIME_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export RUST_LOG=${RUST_LOG:-warn}
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv | tee "$OUT/gpu.txt"
ldd "$BIN" | grep -E 'cuda|cublas|curand' | tee -a "$OUT/log.txt"

log "1. parity on small synthetic models"
for shape in smollm2-135m qwen2.5-0.5b; do
  "$BIN" synth-model --shape "config/shapes/$shape.json" --out "$W/$shape" --dtype f16 >/dev/null
  L=$(python3 -c "import json;print(json.load(open('config/shapes/$shape.json'))['num_hidden_layers']-1)")
  "$BIN" device-check --model "$W/$shape" --dtype f16 --device cuda:0 \
    --modes dense,load-only,selectinfer --load-ratio 0.7 --static-ratio 0.2 \
    --compute-ratio 0.4 --token-ratio 0.2 --dense-layers "0,$L" --steps 16 \
    > "$OUT/parity-$shape.json" 2>>"$OUT/log.txt" || log "device-check $shape FAILED"
  cat "$OUT/parity-$shape.json"
done

log "2. 3B-shape speed and memory"
"$BIN" synth-model --shape "$SHAPE3B" --out "$W/3b" --dtype f16 >/dev/null
L=$(python3 -c "import json;print(json.load(open('$SHAPE3B'))['num_hidden_layers']-1)")
# Warm the page cache and hash the weights once (the ranking check reads the sha256).
cat "$W/3b/model.safetensors" >/dev/null
for round in $(seq 1 "$ROUNDS"); do
  for mode in dense load-only selectinfer; do
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 > "$OUT/smi-$mode-$round.txt" &
    SMI=$!
    "$BIN" bench --model "$W/3b" --dtype f16 --device cuda:0 --mode "$mode" \
      --load-ratio 0.7 --static-ratio 0.2 --compute-ratio 0.4 --token-ratio 0.2 \
      --dense-layers "0,$L" --new-tokens 128 --json \
      > "$OUT/bench-$mode-$round.json" 2>>"$OUT/log.txt" || log "bench $mode FAILED"
    kill $SMI; wait $SMI 2>/dev/null
    python3 - "$OUT" "$mode" "$round" <<'EOF' | tee -a "$OUT/log.txt"
import json, sys
out, mode, rnd = sys.argv[1:]
r = json.load(open(f"{out}/bench-{mode}-{rnd}.json"))
smi = [int(x) for x in open(f"{out}/smi-{mode}-{rnd}.txt").read().split() if x.strip().isdigit()]
print(f"{mode} r{rnd}: decode {r['decode_tokens_per_s']:.1f} tok/s, TTFT {r['ttft_s']*1e3:.1f} ms, "
      f"compact {r['compact_build_s']*1e3:.1f} ms, weights/token {r['weight_bytes_per_token']/1e9:.3f} GB, "
      f"device mem {r['device_memory_bytes']/2**20:.0f} MiB, nvidia-smi peak {max(smi) - min(smi) if smi else -1} MiB")
EOF
  done
done
log "3. where decode time goes at the 3B shape (one run each)"
run_extra() {
  local name=$1; shift
  "$BIN" bench --model "$W/3b" --device cuda:0 --new-tokens 128 --json "$@" \
    > "$OUT/bench-$name.json" 2>>"$OUT/log.txt" || { log "bench $name FAILED"; return; }
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], 'decode %.1f tok/s, TTFT %.1f ms, weights/token %.3f GB' % (r['decode_tokens_per_s'], r['ttft_s']*1e3, r['weight_bytes_per_token']/1e9))" \
    "$OUT/bench-$name.json" "$name" | tee -a "$OUT/log.txt"
}
run_extra dense-bf16 --dtype bf16 --mode dense
run_extra selectinfer-no-dense-layers --dtype f16 --mode selectinfer --load-ratio 0.7 --static-ratio 0.2 --compute-ratio 0.4 --token-ratio 0.2
run_extra selectinfer-phi0.1 --dtype f16 --mode selectinfer --load-ratio 0.7 --static-ratio 0.05 --compute-ratio 0.1 --token-ratio 0.2 --dense-layers "0,$L"
log "done"
