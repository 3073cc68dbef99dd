#!/usr/bin/env python3
"""The table of what `selectinfer tune` measured, one row per candidate of
each catalog model, from the JSON it wrote (docs/bench/tune-NAME.json).

Usage (from the repository root): python3 scripts/tune_table.py [--docs]
--docs rewrites docs/BENCHMARKS.md between its `tune-table` markers.
"""

import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]


def rows(name):
    d = json.load(open(os.path.join(ROOT, "docs", "bench", f"tune-{name}.json")))
    dense = d["measured"].get("dtype=q4,mode=dense", {}).get("decode_tokens_per_s")
    out = []
    for cand, m in sorted(d["measured"].items(), key=lambda kv: -kv[1]["decode_tokens_per_s"]):
        ret = d["retention"].get(cand)
        ret = ", ".join(f"{r['task']} {100 * r['retention']:.0f} %" for r in ret) if ret else "–"
        top1 = min(d["top1"].get(cand, {}).values() or [float("nan")])
        tps = m["decode_tokens_per_s"]
        out.append([name, f"`{cand}`", f"{tps:.1f}", f"{tps / dense:.2f}" if dense else "–",
                    f"{m['peak_rss_mib']:.0f}", f"{top1:.2f}", ret,
                    "**chosen**" if cand == d.get("chosen") else ""])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", action="store_true")
    args = ap.parse_args()
    lines = ["| model | candidate | decode tok/s | × dense q4 | peak RSS MiB | min top-1 | retention | |",
             "|---|---|---|---|---|---|---|---|"]
    for name in MODELS:
        lines += ["| " + " | ".join(r) + " |" for r in rows(name)]
    print("\n".join(lines))
    if args.docs:
        path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
        text = open(path).read()
        start, end = "<!-- tune-table -->", "<!-- /tune-table -->"
        i, j = text.index(start) + len(start), text.index(end)
        open(path, "w").write(text[:i] + "\n" + "\n".join(lines) + "\n" + text[j:])


if __name__ == "__main__":
    main()
