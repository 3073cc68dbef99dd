#!/usr/bin/env python3
"""The memory frontier: task quality against peak resident memory, one line
per model and method, and the crossing — the lowest memory at which the
larger model's configuration beats every configuration of the smaller one
that fits there, on every task.

Usage (from the repository root, after `cargo build --release`, on an
otherwise idle machine; sacreBLEU, rouge-score and matplotlib in the
interpreter: `/tmp/refvenv/bin/pip install sacrebleu==2.4.3 rouge-score==0.1.2
matplotlib`):
  /tmp/refvenv/bin/python scripts/frontier.py [--rows 100] [--skip 100] \\
      [--only LABEL ...] [--docs]

Each configuration (CONFIGS below: a catalog model and `selectinfer` flags)
is run twice over: `selectinfer bench` on a prompt that fills a 512-token
context with its reply (448 + 64 new tokens) gives its peak RSS, the memory
coordinate, and the memory plan's prediction of it; `selectinfer eval` on
--rows rows of each task's dev file, after the first --skip (the rankings
were profiled on the first 32-40 rows), greedy, 48 new tokens, gives BLEU
(translation), exact match (QA) and ROUGE-L (summarization). Load-only
configurations load the task's own ranking (`--task TASK`). Outputs are
kept in runs/frontier/ and resumed (delete a file to rerun it).

The crossing: for each configuration of the larger model (by memory, lowest
first), its rivals are the smaller model's configurations that fit in its
memory, and the smaller model's dense q4 always; it crosses when its metric
is at least each task's best rival's. Every comparison carries a paired
bootstrap (1,000 resamples of the rows): the interval of the difference and
how often the larger one stays ahead. Point estimates are recomputed here
(sacreBLEU, rouge-score, SQuAD's normalisation) and checked against
`selectinfer eval`'s own.

Writes docs/bench/frontier.json and docs/bench/frontier.png; --docs also
rewrites docs/BENCHMARKS.md's table between its `frontier-table` markers.
"""

import argparse
import datetime
import json
import os
import random
import re
import string
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefill import text_prompts  # noqa: E402
from bench_quant import ROOT, fill_between, run_json  # noqa: E402

SMALL, LARGE = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
Q4 = ["--no-preset", "--dtype", "q4"]
# The lm_head behind a 2-bit screen, left in the file, Latin output rows.
HEAD = ["--vocab", "latin", "--head-screen", "256", "--head-screen-bits", "2", "--head-in-file"]


def load_only(gamma, coarse=0, bits=4):
    flags = Q4 + HEAD + ["--mode", "load-only", "--load-ratio", str(gamma)]
    flags += ["--coarse-ratio", str(coarse)] if coarse else []
    return flags + (["--coarse-bits", str(bits)] if bits != 4 else [])


# Prefill in chunks of 128 tokens: a 448-token prompt's MLP temporaries are
# a quarter (the 1.5B's plan: 71 → 18 MiB), for a slower first token.
CHUNK = ["--prefill-chunk", "128"]
# Keys and values cached as Q8_0 blocks: the 1.5B's 512-position cache
# takes 7.4 MiB instead of 28.
KV8 = ["--kv-dtype", "q8"]


# (model, label, flags, per-task ranking?)
CONFIGS = [
    ("smollm2-135m-instruct", "dense q4", Q4, False),
    (SMALL, "dense q4", Q4, False),
    (SMALL, "dense q4, head in file", Q4 + HEAD, False),
    (SMALL, "all coarse, head in file", load_only(1, 1), False),
    (LARGE, "dense q4, head in file", Q4 + HEAD, False),
    (LARGE, "load-only γ0.8, head in file", load_only(0.8), True),
    (LARGE, "load-only γ0.7, head in file", load_only(0.7), True),
    (LARGE, "load-only γ0.6, head in file", load_only(0.6), True),
    (LARGE, "load-only γ0.7 coarse, head in file, chunk 128", load_only(0.7, 1) + CHUNK, True),
    (LARGE, "load-only γ0.6 coarse, head in file, chunk 128", load_only(0.6, 1) + CHUNK, True),
    (LARGE, "load-only γ0.75 coarse 3-bit, head in file, chunk 128",
     load_only(0.75, 1, 3) + CHUNK, True),
    (LARGE, "load-only γ0.7 coarse 3-bit, head in file, chunk 128",
     load_only(0.7, 1, 3) + CHUNK, True),
    (LARGE, "load-only γ0.7 coarse 3-bit, q8 KV, head in file, chunk 128",
     load_only(0.7, 1, 3) + CHUNK + KV8, True),
    (LARGE, "load-only γ0.68 coarse 3-bit, q8 KV, head in file, chunk 128",
     load_only(0.68, 1, 3) + CHUNK + KV8, True),
    (LARGE, "all coarse, head in file", load_only(1, 1), False),
]
TASKS = {
    "translation": ("translation_wmt22_deen.dev.jsonl", "bleu", "BLEU"),
    "qa": ("qa_squad11.dev.jsonl", "exact_match", "EM"),
    "summarization": ("summarization_xsum.dev.jsonl", "rougeL", "ROUGE-L"),
}
MARK = "frontier-table"
# The memory coordinate: the peak of a prompt of 448 tokens and 64 new ones
# in a 512-token context.
BENCH_CONTEXT, BENCH_NEW = 512, 64


def slug(text):
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def rows_file(args, task):
    """The task's dev rows args.skip.. args.skip + args.rows, as a file."""
    src = os.path.join(ROOT, "..", "shared", "data", TASKS[task][0])
    path = os.path.join(args.runs, "data", f"{task}.{args.skip}+{args.rows}.jsonl")
    if not os.path.exists(path):
        lines = open(src).read().splitlines()[args.skip:args.skip + args.rows]
        if len(lines) < args.rows:
            sys.exit(f"{src}: fewer than {args.skip + args.rows} rows")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
    return path


def cached(path, make):
    if os.path.exists(path):
        return json.load(open(path))
    value = make()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json.dump(value, open(path, "w"), indent=1)
    return value


def bench_prompt(args, model):
    """A file of one chat prompt filling the bench's context but its reply."""
    path = os.path.join(args.runs, "data", f"{model}.prompt{BENCH_CONTEXT - BENCH_NEW}.json")
    if not os.path.exists(path):
        home = os.environ.get("SELECTINFER_MODELS", os.path.join(ROOT, "models"))
        gguf = os.path.join(home, model, "model.gguf")
        ids = list(text_prompts(gguf, [BENCH_CONTEXT - BENCH_NEW]).values())[0]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        json.dump([ids], open(path, "w"))
    return path


def run_config(args, model, label, flags, per_task):
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    base = [args.bin, "--threads", str(args.threads)]
    stem = os.path.join(args.runs, f"{model}.{slug(label)}")
    # A prompt filling the context with its reply: the peak the memory plan
    # predicts (`planned_peak_bytes`) is this one.
    fill = ["--max-context", str(BENCH_CONTEXT), "--prompt-ids", bench_prompt(args, model),
            "--new-tokens", str(BENCH_NEW)]
    bench = cached(f"{stem}.bench-filled{BENCH_CONTEXT}.json", lambda: run_json(
        base + ["bench", "--model", model, "--json"] + fill + flags, env))
    tasks = {}
    for task in TASKS:
        extra = ["--task", task] if per_task else []
        out = f"{stem}.{task}.jsonl"
        report = cached(f"{stem}.{task}.json", lambda: run_json(
            base + ["eval", "--model", model, "--data", rows_file(args, task),
                    "--max-new-tokens", str(args.max_new_tokens), "--out", out, "--json"]
            + flags + extra, env))
        rows = [json.loads(line) for line in open(out)]
        tasks[task] = {"report": report, "rows": rows, "args": flags + extra}
    return {"model": model, "label": label, "args": flags, "per_task_ranking": per_task,
            "peak_rss_mib": bench["peak_rss_bytes"] / 2**20,
            "planned_peak_mib": bench["planned_peak_bytes"] / 2**20,
            "decode_tokens_per_s": bench["decode_tokens_per_s"],
            "prefill_tokens_per_s": bench["prefill_tokens_per_s"], "tasks": tasks}


# ---- metrics, as selectinfer eval computes them --------------------------

def squad_normalize(s):
    s = s.lower()
    s = "".join(c for c in s if c not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def per_row(task, rows):
    """A scorer of a subset of row indices (the corpus metric, 0-100)."""
    if task == "translation":
        import sacrebleu
        hyps = [r["prediction"] for r in rows]
        refs = [r["references"][0] for r in rows]
        return lambda idx: sacrebleu.corpus_bleu([hyps[i] for i in idx],
                                                 [[refs[i] for i in idx]]).score
    if task == "qa":
        em = [float(any(squad_normalize(r["prediction"]) == squad_normalize(x)
                        for x in r["references"])) for r in rows]
    else:
        from rouge_score import rouge_scorer
        sc = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
        em = [max(sc.score(x, r["prediction"])["rougeL"].fmeasure for x in r["references"])
              for r in rows]
    return lambda idx: 100.0 * sum(em[i] for i in idx) / max(len(idx), 1)


def score(cfg, task):
    t = cfg["tasks"][task]
    ids = [r["id"] for r in t["rows"]]
    f = per_row(task, t["rows"])
    value = f(range(len(ids)))
    theirs = t["report"]["metrics"][TASKS[task][1]]
    if abs(value - theirs) > 0.05:
        sys.exit(f"{cfg['model']} {cfg['label']} {task}: {value:.3f} here, "
                 f"{theirs:.3f} by selectinfer eval")
    return ids, f, value


def paired(a, b, task, n_boot=1000):
    """Paired bootstrap of a's metric minus b's on the same rows."""
    ids_a, fa, va = score(a, task)
    ids_b, fb, vb = score(b, task)
    if ids_a != ids_b:
        sys.exit(f"{task}: {a['label']} and {b['label']} ran different rows")
    rng = random.Random(0)
    n = len(ids_a)
    diffs = []
    for _ in range(n_boot):
        idx = [rng.randrange(n) for _ in range(n)]
        diffs.append(fa(idx) - fb(idx))
    diffs.sort()
    return {"difference": va - vb, "interval_90": [diffs[int(0.05 * n_boot)], diffs[int(0.95 * n_boot)]],
            "share_ahead": sum(d >= 0 for d in diffs) / n_boot}


def crossing(configs):
    small = [c for c in configs if c["model"] == SMALL]
    dense_small = next(c for c in small if c["label"] == "dense q4")
    by_label = {c["label"]: c for c in small}
    result = None
    checks = []
    for big in sorted((c for c in configs if c["model"] == LARGE), key=lambda c: c["peak_rss_mib"]):
        m = big["peak_rss_mib"]
        rivals = [c for c in small if c["peak_rss_mib"] <= m or c is dense_small]
        wins = {}
        for task in TASKS:
            best = max(rivals, key=lambda c: c["metrics"][task])
            wins[task] = {"rival": best["label"], "large": big["metrics"][task],
                          "rival_value": best["metrics"][task], **paired(big, best, task)}
        ok = all(w["large"] >= w["rival_value"] for w in wins.values())
        checks.append({"large": big["label"], "memory_mib": round(m, 1), "beats_every_task": ok,
                       "tasks": wins})
        if ok and result is None:
            result = {"memory_mib": round(m, 1),
                      "large": {"model": LARGE, "args": big["args"],
                                "args_by_task": {t: big["tasks"][t]["args"] for t in TASKS}},
                      # The rival best on the most tasks (each task's own best
                      # is in best_rival_by_task).
                      "small": {"model": SMALL,
                                "args": by_label[Counter(w["rival"] for w in wins.values())
                                                 .most_common(1)[0][0]]["args"],
                                "best_rival_by_task": {t: w["rival"] for t, w in wins.items()}},
                      "tasks": wins}
    return result, checks


def plot(configs, path, cross, bar):
    """One panel per task: a line per model and lm_head form through its
    configurations by memory (dense points squares, load-only circles),
    the bar (1.2 x the smaller model's dense q4 peak) and the crossing."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(TASKS), figsize=(5 * len(TASKS), 4.2))
    for ax, task in zip(axes, TASKS):
        lines = {}
        for c in configs:
            head = "head in file" if "head in file" in c["label"] else "head held"
            lines.setdefault((c["model"], head), []).append(c)
        for (model, head), cs in lines.items():
            cs = sorted(cs, key=lambda c: c["peak_rss_mib"])
            xs = [c["peak_rss_mib"] for c in cs]
            ys = [c["metrics"][task] for c in cs]
            (line,) = ax.plot(xs, ys, "-", label=f"{model.split('-instruct')[0]}, {head}")
            for c, x, y in zip(cs, xs, ys):
                ax.plot([x], [y], "o" if "load-only" in c["label"] else "s", color=line.get_color())
        ax.axvline(bar, color="red", lw=0.8, ls="--", label=f"bar {bar:.0f} MiB")
        if cross:
            ax.axvline(cross["memory_mib"], color="grey", lw=0.8, ls=":",
                       label=f"crossing {cross['memory_mib']:.0f} MiB")
        ax.set_title(f"{task} ({TASKS[task][2]}; squares dense, circles load-only)", fontsize=9)
        ax.set_xlabel("peak RSS (MiB, selectinfer bench)")
        ax.set_ylabel(TASKS[task][2])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(configs, rows, skip):
    head = ["model", "configuration", "peak RSS MiB", "planned MiB", "decode tok/s"] + [
        f"{t} {TASKS[t][2]}" for t in TASKS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in sorted(configs, key=lambda c: (c["model"], c["peak_rss_mib"])):
        planned = f"{c['planned_peak_mib']:.0f} ({c['planned_peak_mib'] / c['peak_rss_mib']:.3f})"
        cells = [c["model"], c["label"], f"{c['peak_rss_mib']:.0f}", planned,
                 f"{c['decode_tokens_per_s']:.1f}"]
        cells += [f"{c['metrics'][t]:.1f}" for t in TASKS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--skip", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--only", nargs="+", help="labels (model:label) to run; the others only if cached")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "selectinfer"))
    ap.add_argument("--runs", default=os.path.join(ROOT, "runs", "frontier"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "frontier.json"))
    ap.add_argument("--docs", action="store_true")
    args = ap.parse_args()
    args.runs = os.path.join(args.runs, f"rows{args.skip}+{args.rows}")
    configs = []
    for model, label, flags, per_task in CONFIGS:
        name = f"{model}:{label}"
        done = os.path.exists(os.path.join(args.runs, f"{model}.{slug(label)}.summarization.json"))
        if args.only and name not in args.only and not done:
            continue
        c = run_config(args, model, label, flags, per_task)
        c["metrics"] = {t: score(c, t)[2] for t in TASKS}
        configs.append(c)
    cross, checks = crossing(configs)
    small_dense = next(c for c in configs if c["model"] == SMALL and c["label"] == "dense q4")
    png = os.path.splitext(args.out)[0] + ".png"
    plot(configs, png, cross, 1.2 * small_dense["peak_rss_mib"])
    doc = {
        "date": str(datetime.date.today()),
        "command": " ".join(["scripts/frontier.py"] + sys.argv[1:]),
        "rows": {t: {"file": TASKS[t][0], "first": args.skip, "count": args.rows} for t in TASKS},
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "bar_mib": round(1.2 * small_dense["peak_rss_mib"], 1),
        "crossing": cross,
        "checks": checks,
        "points": [{k: v for k, v in c.items() if k != "tasks"} for c in configs],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    json.dump(doc, open(args.out, "w"), indent=1, ensure_ascii=False)
    lines = table(configs, args.rows, args.skip)
    print("\n".join(lines))
    print("crossing:", json.dumps(cross and {k: cross[k] for k in ("memory_mib", "large")}))
    if args.docs:
        fill_between(os.path.join(ROOT, "docs", "BENCHMARKS.md"), MARK, lines)


if __name__ == "__main__":
    main()
