#!/usr/bin/env python3
"""The quantized dtypes against llama.cpp, same run, alternated rounds.

Usage (from the repository root, on an otherwise idle machine, after
`cargo build --release` and `selectinfer prepare-model` of both models):
  /tmp/refvenv/bin/python scripts/bench_quant.py [--rounds 3] [--threads 2]

For each round and each model, one process after another: our engine
(`selectinfer bench --json`) for every (dtype, mode) of ROWS, then llama.cpp
(xllamacpp, scripts/reference/bench_llamacpp.py --token-ids) on the same
model.gguf, the same prompt token ids (prompt_token_ids of our first
report) and the same thread count (RAYON_NUM_THREADS and the decode pool
of our engine = --threads). Every row reports its median round by decode
tok/s; ratios are of medians, and a second decode ratio pairs each round
with llama.cpp's in the same round (median and range over the rounds: how
far one run's figure can move). Peak RSS of llama.cpp is its Python
process's (llama.cpp runs in it). Decode tok/s excludes each prompt's first
token everywhere (it is part of TTFT). Our decode tok/s also leaves out the
per-prompt arrangement after the first token (selective modes); a third
ratio, per round, counts it as decode time. Prints a markdown table and
writes docs/bench/quant.json.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_BENCH = os.path.join(ROOT, "scripts", "reference", "bench_llamacpp.py")
MODELS = ["models/smollm2-135m-instruct", "models/qwen2.5-coder-0.5b-instruct"]
# (dtype, mode, vocab) of our engine; γ0.7 φ0.4 for selectinfer (the
# defaults). `--rows q4:selectinfer:latin ...` picks others; a fourth
# field `blocks` keeps the rows as whole blocks (SELECTINFER_ROWS=blocks:
# no planar rows), to compare the two forms in one run; a fifth, K, screens
# the lm_head (`--head-screen K`), e.g. `q4:dense:all::64`.
ROWS = [("f16", "dense", "all", "", "0"), ("q8", "dense", "all", "", "0"),
        ("q4", "dense", "all", "", "0"), ("q4", "selectinfer", "all", "", "0")]
SEL = ["--task", "qa", "--load-ratio", "0.7", "--static-ratio", "0.2",
       "--compute-ratio", "0.4", "--token-ratio", "0.2"]


def run_json(cmd, env=None):
    print("+", shlex.join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    return json.loads(out.stdout)


def fill_between(path, mark, lines):
    """Rewrites what lies between `path`'s `<!-- mark -->` and
    `<!-- /mark -->` markers with `lines`."""
    text = open(path).read()
    start, end = f"<!-- {mark} -->", f"<!-- /{mark} -->"
    i, j = text.index(start) + len(start), text.index(end)
    with open(path, "w") as f:
        f.write(text[:i] + "\n" + "\n".join(lines) + "\n" + text[j:])


def ours(args, model, dtype, mode, vocab, form, screen):
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads),
               SELECTINFER_THREADS=str(args.threads))
    if form:
        env["SELECTINFER_ROWS"] = form
    cmd = [args.bin, "bench", "--model", model, "--dtype", dtype, "--mode", mode,
           "--vocab", vocab, "--head-screen", screen or "0", "--new-tokens", str(args.new_tokens),
           "--json"] + SEL
    return run_json(cmd, env)


def llamacpp(args, model, prompts):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    cmd = [sys.executable, LLAMA_BENCH, "--gguf", os.path.join(model, "model.gguf"),
           "--threads", str(args.threads), "--n-predict", str(args.new_tokens),
           "--token-ids", f.name, "--json"]
    out = run_json(cmd)
    os.unlink(f.name)
    return out["results"][0] if "results" in out else out


def with_arrangement(r, new_tokens):
    """Decode tok/s counting the per-prompt arrangement after the first
    token (`compact_build_s`, which `decode_tokens_per_s` leaves out) as
    decode time: what a caller waits for between the first and last token."""
    n = new_tokens - 1
    return n / (n / r["decode_tokens_per_s"] + r.get("compact_build_s", 0.0))


def median_by_decode(reps):
    reps = sorted(reps, key=lambda r: r["decode_tokens_per_s"])
    return reps[len(reps) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "selectinfer"))
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "quant.json"))
    ap.add_argument("--rows", nargs="+", metavar="DTYPE:MODE[:VOCAB[:blocks|planar[:K]]]",
                    help="our rows (default: " + " ".join(":".join(r) for r in ROWS) + ")")
    args = ap.parse_args()
    rows = ROWS
    if args.rows:
        rows = [tuple((r.split(":") + ["all", "", "0"][len(r.split(":")) - 2:])[:5])
                for r in args.rows]
    runs = {}
    for _ in range(args.rounds):
        for model in args.models:
            ids = None
            for dtype, mode, vocab, form, screen in rows:
                rep = ours(args, model, dtype, mode, vocab, form, screen)
                ids = ids or rep["prompt_token_ids"]
                if rep["prompt_token_ids"] != ids:
                    sys.exit(f"{model}: rows were given different prompt token ids")
                runs.setdefault((model, dtype, mode, vocab, form, screen), []).append(rep)
            runs.setdefault((model, "gguf", "llama.cpp", "", "", "0"), []).append(
                llamacpp(args, model, ids))
    print("| model | engine | dtype, mode | decode tok/s | × llama.cpp | per round × (median, range) "
          "| per round × with the arrangement | TTFT s | × llama.cpp | peak RSS MiB "
          "| RSS after load MiB | weights MB/token |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    table = []
    for model in args.models:
        llama = runs[(model, "gguf", "llama.cpp", "", "", "0")]
        ref = median_by_decode(llama)
        for dtype, mode, vocab, form, screen in rows + [("gguf", "llama.cpp", "", "", "0")]:
            reps = runs[(model, dtype, mode, vocab, form, screen)]
            r = median_by_decode(reps)
            ours_row = mode != "llama.cpp"
            # Each round against llama.cpp in the same round (the pairs the
            # alternation makes): the spread a single median hides.
            paired = sorted(a["decode_tokens_per_s"] / b["decode_tokens_per_s"]
                            for a, b in zip(reps, llama))
            spread = (f"{paired[len(paired) // 2]:.2f} ({paired[0]:.2f}–{paired[-1]:.2f})"
                      if ours_row else "–")
            arranged = sorted(with_arrangement(a, args.new_tokens) / b["decode_tokens_per_s"]
                              for a, b in zip(reps, llama))
            spread_arranged = (f"{arranged[len(arranged) // 2]:.2f} "
                               f"({arranged[0]:.2f}–{arranged[-1]:.2f})" if ours_row else "–")
            label = f"{dtype}, {mode}" + (f", vocab {vocab}" if vocab not in ("all", "") else "")
            label += {"blocks": ", whole-block rows", "planar": ", planar rows (no quads)"}.get(form, "")
            label += f", head_screen {screen}" if screen not in ("0", "") else ""
            cells = [os.path.basename(model), "selectinfer" if ours_row else "llama.cpp",
                     label if ours_row else "its GGUF",
                     f"{r['decode_tokens_per_s']:.1f}",
                     f"{r['decode_tokens_per_s'] / ref['decode_tokens_per_s']:.2f}", spread,
                     spread_arranged,
                     f"{r['ttft_s']:.3f}", f"{r['ttft_s'] / ref['ttft_s']:.2f}",
                     f"{r['peak_rss_bytes'] / 2**20:.0f}",
                     f"{r['rss_after_load_bytes'] / 2**20:.0f}" if "rss_after_load_bytes" in r else "–",
                     f"{r['weight_bytes_per_token'] / 1e6:.1f}" if "weight_bytes_per_token" in r else "–"]
            print("| " + " | ".join(cells) + " |")
            table.append(cells)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "table": table,
                   "runs": [{"model": k[0], "dtype": k[1], "mode": k[2], "vocab": k[3],
                             "rows": k[4] or "default", "head_screen": int(k[5] or 0), "reports": v}
                            for k, v in runs.items()]}, f, indent=1)


if __name__ == "__main__":
    main()
