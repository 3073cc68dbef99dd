#!/usr/bin/env bash
# The capped-memory demonstration: a model that does not fit runs. Puts each
# run in a memory cgroup of its own with a hard limit (cgroup v2 memory.max,
# or v1 memory.limit_in_bytes; needs root), then, on the same prompts under
# the same limit:
#   1. dense, as it is            -> must fail (OOM-killed, or an error)
#   2. dense with the budget      -> must refuse at start-up, naming its floor
#   3. $MODE with the budget      -> must answer (each prompt's expected text)
#                                    with peak RSS <= the limit
# and prints a table (exit status, peak RSS, decode tok/s, answer). Exit 0
# only when all three hold.
#
#   scripts/fit_demo.sh                          # SmolLM2 f16 under 285 MiB (CI)
#   MODEL=models/qwen2.5-coder-1.5b-instruct LIMIT_MB=2600 scripts/fit_demo.sh
#   MODEL=/tmp/llama3.2-3b-shape LIMIT_MB=6144 CHECK=0 scripts/fit_demo.sh
#
# Settings (environment): MODEL, DTYPE (f16), LIMIT_MB (285), MODE
# (load-only: SmolLM2-135M answers wrongly once φ < γ), CONTEXT (max
# context, 256: the demo prompts need under 100 tokens; 512 left γ at 0.55, where
# SmolLM2 loses Paris once the binary grew), PREFILL (prefill chunk, 128), TOKENS (new tokens, 24),
# CHECK (1: answers must contain the expected text; 0 for random weights),
# BIN (target/release/selectinfer), EXTRA (more flags for every run).
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-models/smollm2-135m-instruct}
DTYPE=${DTYPE:-f16}
LIMIT_MB=${LIMIT_MB:-285}
MODE=${MODE:-load-only}
CONTEXT=${CONTEXT:-256}
PREFILL=${PREFILL:-128}
TOKENS=${TOKENS:-24}
CHECK=${CHECK:-1}
BIN=${BIN:-target/release/selectinfer}
EXTRA=${EXTRA:-}
# Prompt <TAB> a regular expression its answer must match.
PROMPTS=$'What is the capital of France? Answer in one word.\tParis
What is the capital of Japan?\tTokyo'

[ -x "$BIN" ] || { echo "fit_demo: $BIN is missing (cargo build --release)" >&2; exit 2; }
[ -d "$MODEL" ] || { echo "fit_demo: no model folder $MODEL (selectinfer prepare-model)" >&2; exit 2; }

# Which cgroup hierarchy can be written here.
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers \
    && [ -w /sys/fs/cgroup ]; then
  ROOT=/sys/fs/cgroup; VERSION=2
elif [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
  ROOT=/sys/fs/cgroup/memory; VERSION=1
else
  echo "fit_demo: no writable memory cgroup (v2 /sys/fs/cgroup with the memory controller, or v1 /sys/fs/cgroup/memory); run as root" >&2
  exit 2
fi
LIMIT=$((LIMIT_MB * 1024 * 1024))
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# run_capped NAME ARGS...: runs the CLI in a fresh cgroup limited to LIMIT;
# writes NAME.json (stdout), NAME.err, NAME.rc and NAME.oom (kills seen).
run_capped() {
  local name=$1; shift
  local cg="$ROOT/selectinfer-fit-$$-$name"
  mkdir "$cg"
  if [ $VERSION = 2 ]; then
    echo "$LIMIT" >"$cg/memory.max"
    [ -f "$cg/memory.swap.max" ] && echo 0 >"$cg/memory.swap.max"
  else
    echo "$LIMIT" >"$cg/memory.limit_in_bytes"
    [ -f "$cg/memory.memsw.limit_in_bytes" ] && echo "$LIMIT" >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true
  fi
  set +e
  # (The braces' stderr takes the shell's "Killed" notice of an OOM kill.)
  { bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"; } 2>/dev/null
  echo $? >"$OUT/$name.rc"
  set -e
  if [ $VERSION = 2 ]; then
    awk '/^oom_kill /{print $2}' "$cg/memory.events" >"$OUT/$name.oom"
  else
    awk '/^oom_kill /{print $2}' "$cg/memory.oom_control" >"$OUT/$name.oom"
  fi
  rmdir "$cg" 2>/dev/null || true
}

common=(--model "$MODEL" --dtype "$DTYPE" --max-context "$CONTEXT" --prefill-chunk "$PREFILL" --max-new-tokens "$TOKENS" --json)
# shellcheck disable=SC2206
extra=($EXTRA)
i=0
while IFS=$'\t' read -r prompt expect; do
  i=$((i + 1))
  printf '%s\t%s\n' "$prompt" "$expect" >"$OUT/prompt$i"
  run_capped "dense-$i" "$BIN" generate "${common[@]}" "${extra[@]}" --mode dense --prompt "$prompt"
  run_capped "dense_budget-$i" "$BIN" generate "${common[@]}" "${extra[@]}" --mode dense --memory-budget-mb "$LIMIT_MB" --prompt "$prompt"
  run_capped "selective-$i" "$BIN" generate "${common[@]}" "${extra[@]}" --mode "$MODE" --memory-budget-mb "$LIMIT_MB" --prompt "$prompt"
done <<<"$PROMPTS"

python3 - "$OUT" "$i" "$LIMIT" "$CHECK" "$MODEL" "$DTYPE" "$MODE" "$LIMIT_MB" "cgroup v$VERSION" <<'PY'
import json, os, re, sys
out, n, limit, check = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
model, dtype, mode, limit_mb, cg = sys.argv[5:10]
print(f"\nfit_demo: {model} ({dtype}) under a hard limit of {limit_mb} MiB ({cg})\n")
print("| run | prompt | exit | outcome | peak RSS MiB | new tokens | decode tok/s | answer |")
print("|---|---|---|---|---|---|---|---|")
ok = True
for i in range(1, n + 1):
    prompt, expect = open(f"{out}/prompt{i}").read().rstrip("\n").split("\t")
    for name, label in [("dense", "dense"), ("dense_budget", "dense, budget"), ("selective", f"{mode}, budget")]:
        base = f"{out}/{name}-{i}"
        rc = int(open(base + ".rc").read())
        err = open(base + ".err").read()
        oom = open(base + ".oom").read().strip() or "0"
        try:
            r = json.loads(open(base + ".json").read())
        except ValueError:
            r = None
        plan = re.search(r"load_ratio ([0-9.]+)", err)
        if r is not None and rc == 0:
            rss = r["peak_rss_bytes"]
            answer = r["text"].strip().replace("\n", " ")
            right = re.search(expect, answer) is not None
            outcome = "answered" + (f" (γ {float(plan.group(1)):.3f})" if plan else "")
            speed = f"{r['decode_tokens_per_s']:.1f}" if r["generated_tokens"] > 2 else "-"
            row = (f"{rss / 2**20:.0f}", str(r["generated_tokens"]), speed, answer[:60])
        else:
            refused = re.search(r"error: (.*)", err)
            if rc in (137, -9) or (refused is None and oom != "0"):
                outcome = "OOM-killed"
            elif refused:
                floor = re.search(r"floor of ([0-9]+) MiB", refused.group(1))
                outcome = f"refused (floor {floor.group(1)} MiB)" if floor else "error: " + refused.group(1)[:80]
            else:
                outcome = f"failed (exit {rc})"
            row, right, rss = ("-", "-", "-", "-"), False, None
        print(f"| {label} | {i} | {rc} | {outcome} | {' | '.join(row)} |")
        if name == "dense" and rc == 0:
            ok = False; print(f"  FAIL: dense fits under {limit_mb} MiB: lower LIMIT_MB")
        if name == "dense_budget" and not outcome.startswith("refused"):
            ok = False; print("  FAIL: dense with the budget did not refuse cleanly:", err.strip()[-300:])
        if name == "selective":
            if rc != 0:
                ok = False; print("  FAIL: the selective run did not answer:", err.strip()[-400:])
            elif rss > limit:
                ok = False; print(f"  FAIL: peak RSS {rss} > limit {limit}")
            elif check and not right:
                ok = False; print(f"  FAIL: the answer does not match /{expect}/")
print("\nfit_demo:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
