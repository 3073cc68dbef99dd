#!/usr/bin/env python3
"""The baselines side by side: accuracy, decode speed, TTFT and peak memory
of one model under every way of running it, on the same prompts with the
same max tokens, in one run (the paper's "trilemma").

Usage (from the repository root, after `cargo build --release`, with
llama.cpp and matplotlib in a venv: `python3 -m venv /tmp/refvenv &&
/tmp/refvenv/bin/pip install xllamacpp==2026.10.11549 matplotlib`):
  /tmp/refvenv/bin/python scripts/compare.py [--model models/smollm2-135m-instruct]
      [--limit 10] [--max-new-tokens 32] [--out docs/compare]

Baselines (each task's first --limit dev examples, greedy, --threads 2 where
it applies; every run is its own process, one after another):
  dense f32, dense f16            our engine, all neurons
  candle GGUF                     candle-transformers' quantized model on the
                                  model's GGUF (the 4-bit baseline)
  selectinfer (f32, f16)          γ=0.7, δ=0.2, φ=0.4, α=0.2, first/last layer dense
  coreinfer                       full load, φ=0.4 chosen per prompt
  random-load                     random γ=0.7 subset, then as selectinfer
  disk offload                    all neurons, FFN weights re-read from disk at
                                  every forward pass with the page cache dropped
  llama.cpp                       xllamacpp on the same GGUF and token ids
                                  (scripts/reference/eval_llamacpp.py)
Per baseline: decode tok/s and TTFT are means over all examples, peak RSS
the largest of its three task processes, accuracy each task's headline
metric (BLEU, ROUGE-L, SQuAD F1) and their mean relative to dense f32.
Writes OUT/compare.json, OUT/compare.md and OUT/trilemma.png.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = [("translation", "translation_wmt22_deen", "bleu"),
         ("summarization", "summarization_xsum", "rougeL"),
         ("qa", "qa_squad11", "f1")]
SELECT = ["--load-ratio", "0.7", "--static-ratio", "0.2", "--compute-ratio", "0.4",
          "--token-ratio", "0.2"]


def baselines(layers):
    dense_layers = ["--dense-layers", f"0,{layers - 1}"]
    return [
        ("dense f32", ["--dtype", "f32"]),
        ("dense f16", ["--dtype", "f16"]),
        ("candle GGUF", ["--engine", "candle-gguf"]),
        ("selectinfer", ["--mode", "selectinfer", *SELECT, *dense_layers]),
        ("selectinfer f16", ["--dtype", "f16", "--mode", "selectinfer", *SELECT, *dense_layers]),
        ("coreinfer", ["--mode", "coreinfer", *SELECT, *dense_layers]),
        ("random-load", ["--mode", "random-load", *SELECT, *dense_layers]),
        ("disk offload", ["--mode", "disk-offload"]),
        ("llama.cpp", None),
    ]


def run(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser(description="baselines side by side (see docstring)")
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", default="target/release/selectinfer")
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", default="docs/compare")
    ap.add_argument("--work", default="runs/compare", help="per-example outputs (resumed)")
    ap.add_argument("--only", help="comma-separated baseline names to (re)run")
    args = ap.parse_args()

    with open(os.path.join(ROOT, args.model, "config.json")) as f:
        layers = json.load(f)["num_hidden_layers"]
    os.makedirs(os.path.join(ROOT, args.work), exist_ok=True)
    os.makedirs(os.path.join(ROOT, args.out), exist_ok=True)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), RUST_LOG="warn")
    only = set(args.only.split(",")) if args.only else None
    results_path = os.path.join(ROOT, args.out, "compare.json")
    previous = {}
    if only and os.path.exists(results_path):
        with open(results_path) as f:
            previous = {r["baseline"]: r for r in json.load(f)["results"]}

    results = []
    for name, flags in baselines(layers):
        if only and name not in only:
            if name in previous:
                results.append(previous[name])
            continue
        slug = name.replace(" ", "-").replace(".", "")
        per_task = {}
        for task, file, metric in TASKS:
            data = os.path.join(args.data, f"{file}.dev.jsonl")
            out = os.path.join(args.work, f"{slug}.{task}.jsonl")
            common = [args.bin, "eval", "--model", args.model, "--data", data,
                      "--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens)]
            rss = None
            if flags is None:  # llama.cpp: our prompts, its generation, our scoring
                prompts = os.path.join(args.work, f"prompts.{task}.jsonl")
                stats = os.path.join(args.work, f"{slug}.{task}.stats.json")
                run([*common, "--out", prompts, "--prompts-only"], env=env)
                if not os.path.exists(os.path.join(ROOT, out)):
                    run([sys.executable, "scripts/reference/eval_llamacpp.py",
                         "--gguf", os.path.join(args.model, "model.gguf"), "--prompts", prompts,
                         "--max-new-tokens", str(args.max_new_tokens),
                         "--threads", str(args.threads), "--out", out, "--stats", stats], env=env)
                with open(os.path.join(ROOT, stats)) as f:
                    rss = json.load(f)["peak_rss_bytes"]
                flags_here = []
            else:
                flags_here = flags
            r = json.loads(run([*common, *flags_here, "--out", out, "--json"], env=env).stdout)
            per_task[task] = {
                "metric": metric,
                "score": r["metrics"][metric],
                "metrics": r["metrics"],
                "examples": r["examples"],
                "mean_ttft_s": r["mean_ttft_s"],
                "mean_decode_tokens_per_s": r["mean_decode_tokens_per_s"],
                # llama.cpp's memory is its own process's, not the scoring run's.
                "peak_rss_bytes": rss if rss is not None else r["peak_rss_bytes"],
            }
        n = sum(t["examples"] for t in per_task.values())
        results.append({
            "baseline": name,
            "flags": flags if flags is not None else ["llama.cpp (xllamacpp) on model.gguf"],
            "tasks": per_task,
            "decode_tokens_per_s": sum(t["mean_decode_tokens_per_s"] * t["examples"] for t in per_task.values()) / n,
            "ttft_s": sum(t["mean_ttft_s"] * t["examples"] for t in per_task.values()) / n,
            "peak_rss_mib": max(t["peak_rss_bytes"] for t in per_task.values()) / 2**20,
        })

    dense = next(r for r in results if r["baseline"] == "dense f32")
    for r in results:
        rel = [r["tasks"][t]["score"] / dense["tasks"][t]["score"]
               for t, _, _ in TASKS if dense["tasks"][t]["score"] > 0]
        r["relative_accuracy"] = sum(rel) / len(rel) if rel else float("nan")
        r["speed_vs_dense"] = r["decode_tokens_per_s"] / dense["decode_tokens_per_s"]
        r["memory_vs_dense"] = r["peak_rss_mib"] / dense["peak_rss_mib"]
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": args.model, "limit_per_task": args.limit,
        "max_new_tokens": args.max_new_tokens, "threads": args.threads,
        "command": " ".join(sys.argv),
        # With --only, the other baselines' figures come from the previous run.
        "reused_from_previous_run": sorted(previous.keys() - (only or set())),
    }
    with open(results_path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)

    head = ["baseline", "decode tok/s", "× dense", "TTFT s", "peak RSS MiB", "× dense",
            "BLEU", "ROUGE-L", "QA F1", "accuracy vs dense"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        t = r["tasks"]
        lines.append("| " + " | ".join([
            r["baseline"], f"{r['decode_tokens_per_s']:.1f}", f"{r['speed_vs_dense']:.2f}",
            f"{r['ttft_s']:.3f}", f"{r['peak_rss_mib']:.0f}", f"{r['memory_vs_dense']:.2f}",
            f"{t['translation']['score']:.2f}", f"{t['summarization']['score']:.2f}",
            f"{t['qa']['score']:.2f}", f"{100 * r['relative_accuracy']:.0f}%"]) + " |")
    table = "\n".join(lines)
    with open(os.path.join(ROOT, args.out, "compare.md"), "w") as f:
        f.write(f"<!-- written by scripts/compare.py on {meta['date']} -->\n{table}\n")
    print(table)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    xs = [r["peak_rss_mib"] for r in results]
    ys = [r["decode_tokens_per_s"] for r in results]
    acc = [100 * r["relative_accuracy"] for r in results]
    sc = ax.scatter(xs, ys, c=acc, s=[40 + 3 * a for a in acc], cmap="viridis", vmin=0, vmax=110,
                    edgecolors="black")
    for r, x, y in zip(results, xs, ys):
        ax.annotate(r["baseline"], (x, y), textcoords="offset points", xytext=(7, 5), fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("peak RSS (MiB)  — lower is better")
    ax.set_ylabel("decode tokens/s (log)  — higher is better")
    ax.set_title(f"Memory / speed / accuracy: {os.path.basename(args.model)}\n"
                 f"{args.limit} examples per task, {args.max_new_tokens} new tokens, "
                 f"{args.threads} threads", fontsize=10)
    fig.colorbar(sc, ax=ax, label="accuracy vs dense f32 (%, mean of BLEU, ROUGE-L, QA F1)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, args.out, "trilemma.png"))


if __name__ == "__main__":
    main()
