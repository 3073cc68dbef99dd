#!/usr/bin/env python3
"""The memory plan against the measured peak: for each configuration, the
peak RSS `selectinfer bench` measures on a prompt that fills the context it
serves (--max-context 2048: a 2,000-token prompt, 48 new tokens) against the
peak the plan expects for it (`planned_peak_bytes`: src/method/budget.rs
from src/model/footprint.rs, before anything is loaded).

Usage (from the repository root, after `cargo build --release`; llama.cpp's
tokenizer from xllamacpp in the interpreter, to cut the prompts):
  /tmp/refvenv/bin/python scripts/plan_check.py [--docs]

Writes docs/bench/plan.json; --docs rewrites docs/BENCHMARKS.md's table
between its `plan-table` markers. Exits non-zero if a prediction is more
than 10 % off or below the measured peak (a budget must hold).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefill import text_prompts  # noqa: E402
from bench_quant import ROOT, fill_between, run_json  # noqa: E402
from frontier import HEAD, Q4  # noqa: E402

CONTEXT, NEW = 2048, 48
CONFIGS = [
    ("smollm2-135m-instruct", "dense q4", Q4),
    ("smollm2-135m-instruct", "dense f16", ["--no-preset", "--dtype", "f16"]),
    ("smollm2-135m-instruct", "dense f32", ["--no-preset", "--dtype", "f32"]),
    ("qwen2.5-coder-0.5b-instruct", "dense q4", Q4),
    ("qwen2.5-coder-0.5b-instruct", "dense q4, head in file", Q4 + HEAD),
    ("qwen2.5-coder-0.5b-instruct", "dense f16", ["--no-preset", "--dtype", "f16"]),
    ("qwen2.5-coder-1.5b-instruct", "dense q4", Q4),
    ("qwen2.5-coder-1.5b-instruct", "dense q4, head in file", Q4 + HEAD),
    ("qwen2.5-coder-1.5b-instruct", "load-only γ0.7, head in file",
     Q4 + HEAD + ["--mode", "load-only", "--load-ratio", "0.7"]),
    ("qwen2.5-coder-1.5b-instruct", "load-only γ0.6, head in file",
     Q4 + HEAD + ["--mode", "load-only", "--load-ratio", "0.6"]),
    ("qwen2.5-coder-1.5b-instruct", "load-only γ0.7 coarse, head in file",
     Q4 + HEAD + ["--mode", "load-only", "--load-ratio", "0.7", "--coarse-ratio", "1"]),
    ("qwen2.5-coder-1.5b-instruct", "dense q4, q8 KV", Q4 + ["--kv-dtype", "q8"]),
    ("qwen2.5-coder-1.5b-instruct", "load-only γ0.7 coarse 3-bit, q8 KV, head in file",
     Q4 + HEAD + ["--mode", "load-only", "--load-ratio", "0.7", "--coarse-ratio", "1",
                  "--coarse-bits", "3", "--kv-dtype", "q8"]),
]
MARK = "plan-table"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "selectinfer"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "plan.json"))
    ap.add_argument("--docs", action="store_true")
    args = ap.parse_args()
    home = os.environ.get("SELECTINFER_MODELS", os.path.join(ROOT, "models"))
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    rows, bad = [], []
    ids = {}
    for model, label, flags in CONFIGS:
        if model not in ids:
            gguf = os.path.join(home, model, "model.gguf")
            prompt = list(text_prompts(gguf, [CONTEXT - NEW]).values())[0]
            ids[model] = os.path.join(ROOT, "runs", "plan", f"{model}.{CONTEXT - NEW}.json")
            os.makedirs(os.path.dirname(ids[model]), exist_ok=True)
            json.dump([prompt], open(ids[model], "w"))
        r = run_json([args.bin, "--threads", str(args.threads), "bench", "--model", model,
                      "--max-context", str(CONTEXT), "--prompt-ids", ids[model],
                      "--new-tokens", str(NEW), "--json"] + flags, env)
        measured, planned = r["peak_rss_bytes"] / 2**20, r["planned_peak_bytes"] / 2**20
        ratio = planned / measured
        rows.append({"model": model, "label": label, "args": flags, "measured_mib": measured,
                     "planned_mib": planned, "planned_over_measured": ratio})
        if not 1.0 <= ratio <= 1.1:
            bad.append(f"{model} {label}: planned {planned:.0f} MiB, measured {measured:.0f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    json.dump({"context": CONTEXT, "new_tokens": NEW, "threads": args.threads,
               "command": " ".join(["scripts/plan_check.py"] + sys.argv[1:]), "rows": rows},
              open(args.out, "w"), indent=1, ensure_ascii=False)
    lines = ["| model | configuration | measured peak MiB | planned MiB | planned / measured |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['label']} | {r['measured_mib']:.0f} | {r['planned_mib']:.0f} "
              f"| {r['planned_over_measured']:.3f} |" for r in rows]
    print("\n".join(lines))
    if args.docs:
        fill_between(os.path.join(ROOT, "docs", "BENCHMARKS.md"), MARK, lines)
    if bad:
        sys.exit("off by more than the plan allows:\n" + "\n".join(bad))


if __name__ == "__main__":
    main()
