#!/usr/bin/env python3
"""Tool calls side by side: our engine (calls held to the offered
functions' schemas while generated) and llama.cpp (xllamacpp, the same GGUF
and the same prompt token ids, unconstrained, its text scored leniently:
any call found in it), on BFCL dev rows, scored by `selectinfer eval`'s
BFCL AST check per category, with decode speed.

Usage (from the repository root; xllamacpp in /tmp/refvenv as for the
other llama.cpp scripts):
  /tmp/refvenv/bin/python scripts/eval_tools.py [--model qwen2.5-coder-0.5b-instruct]
      [--per-category 20] [--max-new-tokens 128] [--threads 2] [--docs]

Rows: the first N of each category of ../shared/data/tools_bfcl.dev.jsonl
(the file's own order), skipping the rows the call gate was tuned on
(rows 20-39 of each category and irrelevance rows 80-119; EXPERIMENTS.md). Writes docs/bench/tools-MODEL.json; --docs rewrites
docs/BENCHMARKS.md between its `tools-table` markers. Outputs are kept in
runs/tools/ and resumed.
"""

import argparse
import collections
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "selectinfer")
CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"]
# Rows (0-based, per category) the call gate's thresholds were tuned on.
TUNE_ROWS = set(range(20, 40))
TUNE_ROWS_IRRELEVANCE = TUNE_ROWS | set(range(80, 120))


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, cwd=ROOT, **kw)


def eval_json(model, data, out, max_new, *extra):
    p = run([BIN, "eval", "--model", model, "--data", data, "--max-new-tokens", str(max_new),
             "--out", out, "--json", *extra], capture_output=True, text=True)
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--per-category", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "tools_bfcl.dev.jsonl"))
    ap.add_argument("--docs", action="store_true")
    ap.add_argument("--only-candidates", action="store_true",
                    help="keep ours and llama.cpp from the JSON of an earlier run; run the candidates only")
    ap.add_argument("--candidate", action="append", default=[], metavar="LABEL=FLAGS",
                    help="another configuration of ours, e.g. 'load-only γ0.9=--mode load-only "
                         "--load-ratio 0.9 --task tools' (repeatable)")
    a = ap.parse_args()
    os.environ.setdefault("SELECTINFER_MODELS", os.path.join(ROOT, "models"))
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)
    work = os.path.join(ROOT, "runs", "tools")
    os.makedirs(work, exist_ok=True)
    by = collections.defaultdict(list)
    for line in open(a.data):
        row = json.loads(line)
        by[row["category"]].append(line.strip())
    rows = os.path.join(work, f"rows-{a.per_category}.jsonl")
    with open(rows, "w") as f:
        for c in CATEGORIES:
            tune = TUNE_ROWS_IRRELEVANCE if c == "irrelevance" else TUNE_ROWS
            kept = [r for i, r in enumerate(by[c]) if i not in tune][: a.per_category]
            assert len(kept) == a.per_category, f"{c}: {len(kept)} rows outside the tuning rows"
            f.write("\n".join(kept) + "\n")
    tag = f"{a.model}.{a.per_category}.{a.max_new_tokens}"
    out = os.path.join(ROOT, "docs", "bench", f"tools-{a.model}.json")
    if a.only_candidates:
        result = json.load(open(out))
        assert (result["per_category"], result["max_new_tokens"]) == (a.per_category, a.max_new_tokens), \
            "the earlier run used other rows or tokens"
        result["candidates"] = run_candidates(a, rows, work, tag)
        result["command_candidates"] = "scripts/eval_tools.py --only-candidates" + "".join(
            f" --candidate '{c}'" for c in a.candidate)
        finish(a, result, out)
        return
    ours = eval_json(a.model, rows, os.path.join(work, f"ours.{tag}.jsonl"), a.max_new_tokens)
    prompts = os.path.join(work, f"prompts.{tag}.jsonl")
    run([BIN, "eval", "--model", a.model, "--data", rows, "--max-new-tokens", str(a.max_new_tokens),
         "--out", prompts, "--prompts-only"], capture_output=True)
    folder = os.path.join(os.environ["SELECTINFER_MODELS"], a.model)
    llama_out = os.path.join(work, f"llamacpp.{tag}.jsonl")
    run([sys.executable, os.path.join(ROOT, "scripts", "reference", "eval_llamacpp.py"),
         "--gguf", os.path.join(folder, "model.gguf"), "--prompts", prompts,
         "--max-new-tokens", str(a.max_new_tokens), "--threads", str(a.threads), "--out", llama_out])
    llama = eval_json(a.model, rows, llama_out, a.max_new_tokens, "--lenient-calls")
    candidates = run_candidates(a, rows, work, tag)
    result = {"model": a.model, "per_category": a.per_category, "max_new_tokens": a.max_new_tokens,
              "threads": a.threads, "ours": ours, "llamacpp_lenient": llama, "candidates": candidates,
              "command": f"scripts/eval_tools.py --model {a.model} --per-category {a.per_category} "
                         f"--max-new-tokens {a.max_new_tokens} --threads {a.threads}"
                         + "".join(f" --candidate '{c}'" for c in a.candidate)}
    finish(a, result, out)


def run_candidates(a, rows, work, tag):
    """Each --candidate LABEL=FLAGS: our eval with those flags."""
    candidates = []
    for c in a.candidate:
        label, flags = c.split("=", 1)
        slug = "".join(ch if ch.isalnum() or ch == "." else "_" for ch in label)
        rep = eval_json(a.model, rows, os.path.join(work, f"ours-{slug}.{tag}.jsonl"), a.max_new_tokens,
                        *flags.split())
        candidates.append({"label": label, "flags": flags, "report": rep})
    return candidates


def finish(a, result, out):
    """Writes the JSON and prints the table (into BENCHMARKS with --docs)."""
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    table = render(result)
    print(table)
    if a.docs:
        path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
        text = open(path).read()
        start, end = "<!-- tools-table -->", "<!-- /tools-table -->"
        i, j = text.index(start) + len(start), text.index(end)
        open(path, "w").write(text[:i] + "\n" + table + "\n" + text[j:])


def render(r):
    head = ["engine"] + CATEGORIES + ["overall", "invalid calls", "decode tok/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    runs = [("ours, dense q4 + preset, calls constrained", r["ours"])]
    runs += [(f"ours, {c['label']} (`{c['flags']}`)", c["report"]) for c in r.get("candidates", [])]
    runs += [("llama.cpp, same GGUF and prompt ids, lenient", r["llamacpp_lenient"])]
    for label, rep in runs:
        m = rep["metrics"]
        cells = [label] + [f"{100 * m.get(c, 0):.0f} %" for c in CATEGORIES]
        cells += [f"{100 * m['overall']:.0f} %", f"{m['invalid_calls']:.0f}",
                  f"{rep['mean_decode_tokens_per_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
