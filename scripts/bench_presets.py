#!/usr/bin/env python3
"""Each catalog model at its preset against llama.cpp on the same GGUF: the
same prompt token ids, the same thread count, in one run, alternated rounds.

Usage (from the repository root, on an otherwise idle machine, after
`cargo build --release`; llama.cpp from `pip install xllamacpp==2026.10.11549`
in the interpreter that runs this script):
  /tmp/refvenv/bin/python scripts/bench_presets.py [--rounds 3] [--threads 2] \\
      [--models NAME ...] [--readme]

Per round and model, one process after another: `selectinfer bench --model
NAME` (the preset config/models/NAME.yaml applies), the same with
`--no-preset` (dense q4, the built-in defaults), then llama.cpp
(scripts/reference/bench_llamacpp.py) on NAME/model.gguf of the models home
($SELECTINFER_MODELS, else ./models) with our first report's prompt ids.
Rows report their median round by decode tok/s; ratios pair each round with
llama.cpp's in the same round (median and range). Retention comes from the
JSON `selectinfer tune` wrote (docs/bench/tune-NAME.json). Writes
docs/bench/presets.json and prints a markdown table; --readme also rewrites
README.md's and docs/BENCHMARKS.md's tables between their `presets-table`
markers. Models left out of --models keep their rows of the previous
docs/bench/presets.json (the command line printed with the table says so).
"""

import argparse
import datetime
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import ROOT, fill_between, llamacpp, median_by_decode, run_json  # noqa: E402

MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]


def ours(args, name, preset):
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    cmd = [args.bin, "--threads", str(args.threads), "bench", "--model", name,
           "--new-tokens", str(args.new_tokens), "--json"]
    return run_json(cmd + ([] if preset else ["--no-preset"]), env)


def retention(name):
    path = os.path.join(ROOT, "docs", "bench", f"tune-{name}.json")
    if not os.path.exists(path):
        return "–"
    st = json.load(open(path))
    rows = st.get("retention", {}).get(st.get("chosen") or "", [])
    if not rows:
        return "100 % (dense q4)"
    return ", ".join(f"{r['task']} {100 * r['retention']:.0f} % "
                     f"({100 * r['interval'][0]:.0f}–{100 * r['interval'][1]:.0f})" for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "selectinfer"))
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "presets.json"))
    ap.add_argument("--readme", action="store_true")
    args = ap.parse_args()
    home = os.environ.get("SELECTINFER_MODELS", os.path.join(ROOT, "models"))
    runs = {}
    for _ in range(args.rounds):
        for name in args.models:
            preset = ours(args, name, True)
            dense = ours(args, name, False)
            ids = preset["prompt_token_ids"]
            if dense["prompt_token_ids"] != ids:
                sys.exit(f"{name}: the two runs were given different prompt token ids")
            runs.setdefault((name, "preset"), []).append(preset)
            runs.setdefault((name, "dense q4"), []).append(dense)
            runs.setdefault((name, "llama.cpp"), []).append(
                llamacpp(args, os.path.join(home, name), ids))
    # Models not run this time keep their rows of the previous run's file.
    kept = []
    if os.path.exists(args.out):
        kept = [r for r in json.load(open(args.out)).get("runs", [])
                if r["model"] not in args.models]
    for r in kept:
        runs[(r["model"], r["row"])] = r["reports"]
    args.models = [m for m in MODELS if any(r["model"] == m for r in kept)] + args.models
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:  # the raw runs first: a table error loses nothing
        json.dump({"args": vars(args),
                   "runs": [{"model": k[0], "row": k[1], "reports": v} for k, v in runs.items()]},
                  f, indent=1)
    head = ("| model | configuration | decode tok/s | × llama.cpp (median, range) | TTFT s "
            "| peak RSS MiB (llama.cpp's) | retention vs dense q4 (90 % interval) |")
    lines = [head, "|---|---|---|---|---|---|---|"]
    table = []
    for name in args.models:
        llama = runs[(name, "llama.cpp")]
        ref = median_by_decode(llama)
        for row in ["preset", "dense q4", "llama.cpp"]:
            reps = runs[(name, row)]
            r = median_by_decode(reps)
            paired = sorted(a["decode_tokens_per_s"] / b["decode_tokens_per_s"]
                            for a, b in zip(reps, llama))
            ratio = (f"{paired[len(paired) // 2]:.2f} ({paired[0]:.2f}–{paired[-1]:.2f})"
                     if row != "llama.cpp" else "1")
            label = {"preset": lambda: f"preset ({r['dtype']}, {r['mode']})",
                     "dense q4": lambda: "dense q4, no preset",
                     "llama.cpp": lambda: "llama.cpp, its GGUF"}[row]()
            cells = [name, label, f"{r['decode_tokens_per_s']:.1f}", ratio, f"{r['ttft_s']:.2f}",
                     f"{r['peak_rss_bytes'] / 2**20:.0f} ({ref['peak_rss_bytes'] / 2**20:.0f})",
                     retention(name) if row == "preset" else "–"]
            lines.append("| " + " | ".join(cells) + " |")
            table.append(cells)
    print("\n".join(lines))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "table": table,
                   "runs": [{"model": k[0], "row": k[1], "reports": v} for k, v in runs.items()]},
                  f, indent=1)
    if args.readme:
        when = (f"Measured {datetime.date.today()} on {platform.processor() or platform.machine()}, "
                f"{os.cpu_count()} cores, {args.threads} threads, {args.rounds} alternated rounds, "
                f"{args.new_tokens} new tokens per prompt; raw figures: "
                f"`{os.path.relpath(args.out, ROOT)}`. Command:")
        cmd = ("`" + " ".join(["scripts/bench_presets.py"] + sys.argv[1:]) + "`"
               + (f" (rows of {', '.join(m for m in args.models if m not in sys.argv)} from the "
                  "run before, `scripts/bench_presets.py --rounds 2 --readme`)"
                  if any(m not in sys.argv for m in args.models) else ""))
        fill_between(os.path.join(ROOT, "README.md"), "presets-table", lines)
        fill_between(os.path.join(ROOT, "docs", "BENCHMARKS.md"), "presets-table",
                     [when, "", cmd, ""] + lines)


if __name__ == "__main__":
    main()
