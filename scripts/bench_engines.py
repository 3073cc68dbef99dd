#!/usr/bin/env python3
"""Side-by-side decode benchmark: our engines vs. candle's GGUF model vs. llama.cpp.

Usage (from the repository root, on an otherwise idle machine, after
`cargo build --release`):
  /tmp/refvenv/bin/python scripts/bench_engines.py

Options: --models DIR... (default: models/smollm2-135m-instruct
models/qwen2.5-coder-0.5b-instruct), --new-tokens N (64), --threads N (2),
--rounds N (1), --bin PATH (target/release/selectinfer), --out-dir DIR
(docs/bench).

Steps, every measurement in its own process, strictly one after another:
  1. For each round, for each model: `selectinfer bench --json` with dense
     f32, dense f16 (both with --bandwidth: a memory-bandwidth probe after
     the measurement, in the same process) and candle-gguf
     (candle-transformers' quantized model on model.gguf), same
     --new-tokens, RAYON_NUM_THREADS=--threads (candle-gguf loads only the
     tokenizer and the GGUF). Each row reports its median round (by decode
     tok/s).
  2. The roofline bandwidth is the median of the run's probes, the same
     statistic as the rows' decode tok/s. On a shared host one probe can
     land on a busy moment (a single probe once read 23.4 GB/s where others
     read 27-31, which put two rows above 100 %); the table's header gives
     the probes' range, and engines.json keeps every round's report.
  3. llama.cpp (xllamacpp, scripts/reference/bench_llamacpp.py --token-ids) on
     the same model.gguf and the same prompt token ids (prompt_token_ids of our
     report), --threads threads. Its TTFT is llama.cpp's prompt_ms (prompt eval
     + first sample, no HTTP), its peak RSS includes the Python interpreter.
  4. % of roofline = weight bytes per token x decode tok/s / bandwidth. For
     llama.cpp the bytes are those of the candle-gguf row (same GGUF tensors).
Writes docs/bench/engines.json and docs/bench/engines.md and prints the table.
Decode tok/s excludes each prompt's first token (it is part of TTFT) everywhere.
"""

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
from llamacpp_server import read_gguf_metadata  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_BENCH = os.path.join(ROOT, "scripts", "reference", "bench_llamacpp.py")
DEFAULT_MODELS = ["models/smollm2-135m-instruct", "models/qwen2.5-coder-0.5b-instruct"]
FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
          10: "Q2_K", 12: "Q3_K_M", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
          18: "Q6_K", 32: "BF16"}
COLUMNS = ["model", "engine", "dtype", "weights MB/token", "prefill tok/s", "decode tok/s",
           "TTFT s", "peak RSS MiB", "% of roofline"]


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()


def run_json(cmd, env=None):
    print("+", shlex.join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    return json.loads(out.stdout)


def ours(args, model, engine, dtype, bandwidth=False):
    cmd = [args.bin, "bench", "--model", model, "--engine", engine, "--dtype", dtype,
           "--new-tokens", str(args.new_tokens), "--json"] + (["--bandwidth"] if bandwidth else [])
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    return run_json(cmd, env)


def llamacpp(args, model, prompts):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(prompts, f)
        f.flush()
        out = run_json([sys.executable, LLAMA_BENCH, "--gguf", os.path.join(model, "model.gguf"),
                        "--token-ids", f.name, "--threads", str(args.threads),
                        "--n-predict", str(args.new_tokens), "--json"])
    r = out["results"][0]
    return {"engine": "llama.cpp", "xllamacpp": out["xllamacpp"], **r}


def gguf_type(model):
    ft = read_gguf_metadata(os.path.join(model, "model.gguf")).get("general.file_type")
    return "gguf " + FTYPES.get(ft, f"ftype {ft}")


def row(model, rep, bytes_per_token, bandwidth):
    return {
        "model": os.path.basename(os.path.normpath(model)),
        "engine": rep["engine"],
        "dtype": rep["dtype"] if rep["engine"] == "dense" else gguf_type(model),
        "weight_bytes_per_token": bytes_per_token,
        "prefill_tokens_per_s": rep["prefill_tokens_per_s"],
        "decode_tokens_per_s": rep["decode_tokens_per_s"],
        "ttft_s": rep["ttft_s"],
        "peak_rss_bytes": rep["peak_rss_bytes"],
        "roofline_percent": 100 * bytes_per_token * rep["decode_tokens_per_s"] / (bandwidth * 1e9),
        "report": rep,
    }


def markdown(result):
    r = result
    probes = ", ".join(f"{b:.1f}" for b in r["bandwidth_probes_gb_s"])
    lines = [f"Memory read bandwidth {r['bandwidth_gb_s']:.2f} GB/s (median of the probes "
             f"{probes}); {r['date']}; threads {r['threads']}; {r['new_tokens']} new tokens/prompt; "
             f"median of {r['rounds']} round(s) per row; "
             f"start `{r['uptime_start']}`; end `{r['uptime_end']}`",
             "", f"Command: `{r['command']}`", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for x in r["rows"]:
        rss = f"{x['peak_rss_bytes'] / 2**20:.0f}"
        rss += {"llama.cpp": " (a)"}.get(x["engine"], "")
        cells = [x["model"], x["engine"], x["dtype"], f"{x['weight_bytes_per_token'] / 1e6:.1f}",
                 f"{x['prefill_tokens_per_s']:.1f}", f"{x['decode_tokens_per_s']:.1f}",
                 f"{x['ttft_s']:.3f}", rss, f"{x['roofline_percent']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "(a) llama.cpp runs inside a Python process (xllamacpp), which the "
              "peak RSS includes; its TTFT is llama.cpp's prompt_ms (prompt eval + first sample, "
              "no HTTP).", "Peak RSS of our rows is read before the bandwidth probe; dense rows "
              "include the transient mmap of model.safetensors during loading.", "Decode tok/s excludes each prompt's first token (counted in TTFT); "
              "llama.cpp's bytes/token are those of the candle-gguf row (same GGUF tensors)."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description="engines side by side (see docstring)")
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "selectinfer"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs", "bench"))
    args = ap.parse_args()

    result = {"command": shlex.join([sys.executable] + sys.argv),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "uptime_start": uptime(), "threads": args.threads, "new_tokens": args.new_tokens}
    result["rounds"] = args.rounds
    runs = {}  # (model, engine, dtype) -> reports, one per round
    for _ in range(args.rounds):
        for model in args.models:
            for engine, dtype in [("dense", "f32"), ("dense", "f16"), ("candle-gguf", "f16")]:
                rep = ours(args, model, engine, dtype, bandwidth=engine == "dense")
                runs.setdefault((model, engine, dtype), []).append(rep)
            ids = runs[(model, "dense", "f32")][0]["prompt_token_ids"]
            if any(r[-1]["prompt_token_ids"] != ids
                   for k, r in runs.items() if k[0] == model and k[1] != "llama.cpp"):
                sys.exit(f"{model}: engines were given different prompt token ids")
            runs.setdefault((model, "llama.cpp", ""), []).append(llamacpp(args, model, ids))
    probes = [r["bandwidth_gb_s"] for reps in runs.values() for r in reps if r.get("bandwidth_gb_s")]
    bandwidth = result["bandwidth_gb_s"] = statistics.median(probes)
    result["bandwidth_probes_gb_s"] = probes
    result["all_rounds"] = [{"model": k[0], "engine": k[1], "dtype": k[2], "reports": v}
                            for k, v in runs.items()]

    def median(reps):
        return sorted(reps, key=lambda r: r["decode_tokens_per_s"])[(len(reps) - 1) // 2]

    rows = []
    for model in args.models:
        gguf_bytes = median(runs[(model, "candle-gguf", "f16")])["weight_bytes_per_token"]
        for engine, dtype in [("dense", "f32"), ("dense", "f16"), ("candle-gguf", "f16")]:
            rep = median(runs[(model, engine, dtype)])
            rows.append(row(model, rep, rep["weight_bytes_per_token"], bandwidth))
        rows.append(row(model, median(runs[(model, "llama.cpp", "")]), gguf_bytes, bandwidth))
    result["uptime_end"] = uptime()
    result["rows"] = rows

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "engines.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = markdown(result)
    with open(os.path.join(args.out_dir, "engines.md"), "w") as f:
        f.write(md)
    print(md, end="")


if __name__ == "__main__":
    main()
