#!/usr/bin/env python3
"""Prefill side by side: time to first token against llama.cpp, per prompt length.

Usage (repository root, idle machine, after `cargo build --release`):
  /tmp/refvenv/bin/python scripts/bench_prefill.py
Options: --models NAME... (default qwen2.5-coder-0.5b-instruct
qwen2.5-coder-1.5b-instruct; folders in $SELECTINFER_MODELS or models/),
--lengths N... (43 256 1024 2048), --rounds N (3), --threads N (2),
--dtype q4, --extra "FLAGS" (more `selectinfer bench` flags, e.g. a preset's),
--bin PATH, --out FILE (docs/bench/prefill.json), --docs (also write the
table into docs/BENCHMARKS.md, between its prefill-table markers),
--docs-only (no run: the table of --out into the docs).

--presets: each catalog model's preset against its dense q4 instead of
llama.cpp: `selectinfer bench --model NAME` (config/models/NAME.yaml
applies) and `--model FOLDER` (dense q4, no preset) on the same ids,
alternated; the table gives the preset's TTFT over dense's (the issue's
"every shipped preset ≤ its model's dense q4"). Writes
docs/bench/prefill-presets.json and, with --docs, the docs' table between
the prefill-presets-table markers. --overlay FILE (with --presets): a node
parameter file laid over each preset (its ros__parameters as `selectinfer
bench` flags: `compute_ratio: 0.95` is `--compute-ratio 0.95`), e.g.
config/planner-qwen0.5b.yaml; writes docs/bench/prefill-STEM.json and the
table between the prefill-STEM-table markers.

Prompts: for each model and length L, a chat prompt of exactly L token ids
(the model's ChatML system + user turn + assistant header around the first
XSum dev documents, cut to fit), tokenized by llama.cpp's /tokenize on the
model's own model.gguf (our tokenizer gives the same ids: tests). Plus a
tool-call prompt: the BFCL dev row with the most function schemas among the
first 40, as `selectinfer eval --task tools --prompts-only` renders it (the
tools in the model's template), its length whatever it is.

Each round runs, strictly one after another, for each model and prompt: our
`selectinfer bench --prompt-ids FILE --new-tokens 2 --json` and llama.cpp
(xllamacpp, scripts/reference/bench_llamacpp.py --token-ids FILE
--n-predict 2) on the same GGUF and ids, alternating which goes first. Both
warm up on the prompt, then time it once: TTFT is the prompt's forward pass
plus the first token's sampling (llama.cpp: its prompt_ms). The table
reports per length the median TTFT over rounds, prefill tok/s, and the
ratio ours / llama.cpp's (median of the rounds' ratios, and their range).
Writes --out (every round's numbers) and prints the table (Markdown).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "reference"))
from llamacpp_server import LlamaServer  # noqa: E402

LLAMA_BENCH = os.path.join(ROOT, "scripts", "reference", "bench_llamacpp.py")
DATA = os.path.join(ROOT, "..", "shared", "data")
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def model_dir(name):
    home = os.environ.get("SELECTINFER_MODELS", os.path.join(ROOT, "models"))
    path = name if os.path.isdir(name) else os.path.join(home, name)
    if not os.path.isfile(os.path.join(path, "model.gguf")):
        sys.exit(f"{path}: no model.gguf (run `selectinfer prepare-model {name}` first)")
    return path


def text_prompts(gguf, lengths):
    """Chat prompts of exactly each length, cut from the XSum dev documents."""
    with open(os.path.join(DATA, "summarization_xsum.dev.jsonl")) as f:
        docs = [json.loads(line)["document"] for line in f]
    body = "Summarize the following articles.\n\n" + "\n\n".join(docs[:40])
    with LlamaServer(gguf, threads=1, n_ctx=512, verbosity=0) as srv:
        head = srv.tokenize(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")
        tail = srv.tokenize("<|im_end|>\n<|im_start|>assistant\n")
        content = srv.tokenize(body)
    out = {}
    for n in lengths:
        keep = n - len(head) - len(tail)
        if keep < 1 or keep > len(content):
            sys.exit(f"cannot make a {n}-token prompt ({len(content)} content tokens)")
        out[str(n)] = head + content[:keep] + tail
    return out


def tool_prompt(binary, model, env):
    """The BFCL dev row (of the first 40) with the most tools, as our eval renders it."""
    data = os.path.join(DATA, "tools_bfcl.dev.jsonl")
    with open(data) as f:
        rows = [json.loads(line) for line in f][:40]
    best = max(range(len(rows)), key=lambda i: len(json.dumps(rows[i])))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ids.jsonl")
        subprocess.run([binary, "eval", "--model", model, "--task", "tools", "--data", data,
                        "--limit", str(best + 1), "--prompts-only", "--out", out],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        with open(out) as f:
            lines = [json.loads(line) for line in f]
    row = lines[best]
    return row.get("prompt_token_ids") or row.get("ids") or row["token_ids"]


def overlay_flags(path):
    """A node parameter file's ros__parameters as `selectinfer bench` flags."""
    flags, inside = [], False
    if not os.path.isfile(path):
        where = "" if os.path.isabs(path) else f" (resolved against the working directory {os.getcwd()})"
        sys.exit(f"--overlay {path}: no such file{where}")
    with open(path) as f:
        for line in f:
            text = line.split("#", 1)[0].rstrip()
            if text.strip() == "ros__parameters:":
                inside = True
            elif inside and ":" in text and text.startswith("    "):
                key, value = (x.strip() for x in text.split(":", 1))
                if not value:
                    sys.exit(f"{path}: parameter {key} has no scalar value")
                flags += ["--" + key.replace("_", "-"), value]
    if not flags:
        sys.exit(f"{path}: no ros__parameters found")
    return flags


def ours(binary, model, ids, args, env, preset=False):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([ids], f)
    try:
        # A catalog name takes its preset (dtype included); a folder is dense.
        flags = args.overlay_flags if preset else ["--dtype", args.dtype, *args.extra.split()]
        cmd = [binary, "bench", "--model", model, "--threads", str(args.threads),
               "--new-tokens", "2", "--prompt-ids", f.name, "--json", *flags]
        r = json.loads(subprocess.run(cmd, check=True, env=env, capture_output=True,
                                      text=True).stdout)
    finally:
        os.unlink(f.name)
    return {"ttft_s": r["ttft_s"], "prefill_tokens_per_s": r["prefill_tokens_per_s"]}


def llamacpp(gguf, ids, args):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([ids], f)
    try:
        cmd = [sys.executable, LLAMA_BENCH, "--gguf", gguf, "--token-ids", f.name,
               "--n-predict", "2", "--threads", str(args.threads), "--json"]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    finally:
        os.unlink(f.name)
    r = r["results"][0]
    return {"ttft_s": r["ttft_s"], "prefill_tokens_per_s": r["prefill_tokens_per_s"]}


def main():
    ap = argparse.ArgumentParser(description="prefill side by side (see docstring)")
    ap.add_argument("--models", nargs="+",
                    default=["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[43, 256, 1024, 2048])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="q4")
    ap.add_argument("--extra", default="", help="more `selectinfer bench` flags")
    ap.add_argument("--no-tool-prompt", action="store_true")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "selectinfer"))
    ap.add_argument("--out", help="default docs/bench/prefill.json "
                    "(--presets: docs/bench/prefill-presets.json)")
    ap.add_argument("--presets", action="store_true",
                    help="each catalog model's preset against its dense q4 (no llama.cpp)")
    ap.add_argument("--overlay", help="with --presets: a node parameter file laid over "
                    "each preset (e.g. config/planner-qwen0.5b.yaml)")
    ap.add_argument("--docs", action="store_true",
                    help="write the table into docs/BENCHMARKS.md (between its prefill-table markers)")
    ap.add_argument("--docs-only", action="store_true",
                    help="no run: write --out's table into docs/BENCHMARKS.md")
    args = ap.parse_args()
    if args.overlay and not args.presets:
        sys.exit("--overlay lays a parameter file over the presets: give --presets too")
    # Read once, and refused now rather than after the prompts are made.
    args.overlay_flags = overlay_flags(args.overlay) if args.overlay else []
    args.out = args.out or os.path.join(ROOT, "docs", "bench", result_name(vars(args)) + ".json")
    if args.docs_only:
        with open(args.out) as f:
            fill_docs(json.load(f))
        return
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))

    prompts = {}
    for name in args.models:
        d = model_dir(name)
        prompts[name] = text_prompts(os.path.join(d, "model.gguf"), args.lengths)
        if not args.no_tool_prompt:
            prompts[name]["tools"] = tool_prompt(args.bin, d, env)
    rows = []
    for rnd in range(args.rounds):
        for name in args.models:
            d = model_dir(name)
            for label, ids in prompts[name].items():
                pair = {}
                rival = "preset" if args.presets else "llama.cpp"
                order = ["ours", rival] if rnd % 2 == 0 else [rival, "ours"]
                for who in order:
                    if who == "ours":
                        pair[who] = ours(args.bin, d, ids, args, env)
                    elif who == "preset":
                        pair[who] = ours(args.bin, name, ids, args, env, preset=True)
                    else:
                        pair[who] = llamacpp(os.path.join(d, "model.gguf"), ids, args)
                row = {"round": rnd, "model": name, "prompt": label, "tokens": len(ids), **pair,
                       "ratio": (pair["preset"]["ttft_s"] / pair["ours"]["ttft_s"] if args.presets
                                 else pair["ours"]["ttft_s"] / pair["llama.cpp"]["ttft_s"])}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)

    if args.presets:
        rival = f"preset + {os.path.basename(args.overlay)}" if args.overlay else "preset"
        table = [f"| model | prompt | tokens | dense q4 TTFT s | {rival} TTFT s "
                 f"| {rival} / dense TTFT (median, range) |", "|---|---|---|---|---|---|"]
    else:
        table = ["| model | prompt | tokens | ours TTFT s | ours prefill tok/s | llama.cpp TTFT s "
                 "| llama.cpp prefill tok/s | ours / llama.cpp TTFT (median, range) |",
                 "|---|---|---|---|---|---|---|---|"]
    summary = []
    for name in args.models:
        for label in prompts[name]:
            rs = [r for r in rows if r["model"] == name and r["prompt"] == label]
            med = lambda who, k: statistics.median(r[who][k] for r in rs)  # noqa: E731
            ratios = [r["ratio"] for r in rs]
            rival = "preset" if args.presets else "llama.cpp"
            s = {"model": name, "prompt": label, "tokens": rs[0]["tokens"],
                 "ours_ttft_s": med("ours", "ttft_s"),
                 "ours_prefill_tokens_per_s": med("ours", "prefill_tokens_per_s"),
                 f"{rival.replace('.', '')}_ttft_s": med(rival, "ttft_s"),
                 f"{rival.replace('.', '')}_prefill_tokens_per_s":
                     med(rival, "prefill_tokens_per_s"),
                 "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                 "ratio_max": max(ratios)}
            summary.append(s)
            spread = f"{s['ratio_median']:.2f} ({s['ratio_min']:.2f}–{s['ratio_max']:.2f})"
            if args.presets:
                table.append(f"| {name} | {label} | {s['tokens']} | {s['ours_ttft_s']:.2f} "
                             f"| {s['preset_ttft_s']:.2f} | {spread} |")
            else:
                table.append(f"| {name} | {label} | {s['tokens']} | {s['ours_ttft_s']:.2f} "
                             f"| {s['ours_prefill_tokens_per_s']:.0f} "
                             f"| {s['llamacpp_ttft_s']:.2f} "
                             f"| {s['llamacpp_prefill_tokens_per_s']:.0f} | {spread} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result = {"args": vars(args), "date": str(datetime.date.today()), "commit": commit,
              "cpu": platform.processor() or platform.machine(), "summary": summary,
              "rounds": rows, "table": "\n".join(table)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("\n".join(table))
    if args.docs:
        fill_docs(result)


def result_name(a):
    """prefill, prefill-presets or prefill-STEM (an overlay's): the JSON's
    name in docs/bench and the docs' markers."""
    if a.get("overlay"):
        return "prefill-" + os.path.splitext(os.path.basename(a["overlay"]))[0]
    return "prefill-presets" if a.get("presets") else "prefill"


def fill_docs(result):
    """Rewrites docs/BENCHMARKS.md's table between its prefill-table markers
    from a result of this script (its JSON)."""
    a = result["args"]
    marker, out = result_name(a) + "-table", result_name(a) + ".json"
    when = (f"Measured {result.get('date', '?')} (build {result.get('commit', '?')}), "
            f"{a['threads']} threads, {a['rounds']} "
            f"alternated round(s), {a['dtype']}; raw: `docs/bench/{out}`.")
    path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
    text = open(path).read()
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    i, j = text.index(start) + len(start), text.index(end)
    body = "\n".join(["", when, "", result["table"], ""])
    open(path, "w").write(text[:i] + body + text[j:])


if __name__ == "__main__":
    main()
