#!/usr/bin/env python3
"""Benchmark llama.cpp (via xllamacpp) prompt-eval and decode throughput.

Usage:
  /tmp/refvenv/bin/python scripts/reference/bench_llamacpp.py \\
      --gguf /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --gguf /tmp/gguf/qwen2.5-coder-0.5b-instruct.gguf \\
      --threads 2 --n-predict 64 --json

For each --gguf (repeatable) it starts llama.cpp's server in-process
(xllamacpp==2026.10.11549, CPU backend, 1 slot, 127.0.0.1, see
llamacpp_server.py), sends one warm-up POST /completion, then --repeats measured
requests with the same fixed prompt (a ChatML-rendered user message, tokenized
by the server; no BOS) and reports llama.cpp's own ``timings`` fields:
  prompt_per_second     prompt-eval tokens/s (prompt_n tokens, batched)
  predicted_per_second  decode tokens/s (predicted_n tokens, one at a time)
Requests use cache_prompt=false (the whole prompt is re-evaluated every time),
greedy sampling (temperature 0, top_k 1, samplers [top_k, temperature]) and
ignore_eos=true so exactly --n-predict tokens are decoded. The median over the
measured repeats is reported together with every individual run and the 1-min
load average at start/end (the numbers are only meaningful on an idle machine).
Prints JSON with --json, a short table otherwise.

With ``--token-ids FILE`` (a JSON list of token-id lists, e.g. the
``prompt_token_ids`` of ``selectinfer bench --json``) each GGUF is instead run
on exactly those prompts (``bench_token_prompts``): the token ids are sent as
``prompt`` (no tokenization, no BOS added), one warm-up request, then each
prompt once, with the same sampling settings as above. Reported:
  prefill_tokens_per_s  sum(prompt_n) / sum(prompt_ms)
  decode_tokens_per_s   sum(predicted_n - 1) / sum(predicted_ms): llama.cpp's
                        predicted_ms starts after the first token is sampled, so
                        it covers predicted_n - 1 forward passes (the first
                        token's cost is in prompt_ms)
  ttft_s                mean prompt_ms: server-side prompt eval + first sample,
                        an approximation of time-to-first-token (no HTTP overhead)
  peak_rss_bytes        ru_maxrss of this Python process (llama.cpp runs
                        in-process, so it includes the interpreter)
This mirrors ``selectinfer bench`` (decode excludes the first token; TTFT is
prompt forward + first sample). Example:
  /tmp/refvenv/bin/python scripts/reference/bench_llamacpp.py \\
      --gguf models/smollm2-135m-instruct/model.gguf --token-ids ids.json \\
      --threads 2 --n-predict 64 --json
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_server import LlamaServer, sha256_file, xllamacpp_versions  # noqa: E402

BENCH_PROMPT = (
    "<|im_start|>user\n"
    "You are reviewing a short technical report about selective inference in "
    "transformer language models. The report argues that many layers can be "
    "skipped for easy tokens while hard tokens still use the full network. "
    "Summarize the main idea in three sentences, then list two risks of this "
    "approach and one experiment that would measure its benefit on a laptop CPU."
    "<|im_end|>\n<|im_start|>assistant\n"
)


def bench_one(gguf, args):
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    with LlamaServer(gguf, threads=args.threads, n_ctx=args.n_ctx, verbosity=0) as srv:
        load_s = time.perf_counter() - t0
        n_prompt = len(srv.tokenize(BENCH_PROMPT))
        body = {
            "prompt": BENCH_PROMPT, "n_predict": args.n_predict, "ignore_eos": True,
            "temperature": 0.0, "top_k": 1, "samplers": ["top_k", "temperature"],
            "seed": 42, "cache_prompt": False,
        }
        srv.request("/completion", body)  # warm-up
        runs = []
        for _ in range(args.repeats):
            t = srv.request("/completion", body)["timings"]
            runs.append({k: t[k] for k in ("prompt_n", "prompt_ms", "prompt_per_second",
                                           "predicted_n", "predicted_ms", "predicted_per_second",
                                           "cache_n")})
    return {
        "gguf_file": os.path.basename(gguf),
        "gguf_sha256": sha256_file(gguf) if args.sha256 else None,
        "threads": args.threads,
        "n_predict": args.n_predict,
        "prompt_tokens": n_prompt,
        "repeats": args.repeats,
        "prompt_per_second": statistics.median(r["prompt_per_second"] for r in runs),
        "predicted_per_second": statistics.median(r["predicted_per_second"] for r in runs),
        "runs": runs,
        "model_load_s": round(load_s, 3),
        "loadavg_1m_start": load0,
        "loadavg_1m_end": os.getloadavg()[0],
    }


def bench_token_prompts(gguf, prompts, n_predict=64, threads=2, n_ctx=1024):
    """Runs each token-id prompt once (after one warm-up) and sums llama.cpp's timings."""
    n_ctx = max(n_ctx, max(map(len, prompts)) + n_predict + 16)
    load0 = os.getloadavg()[0]
    with LlamaServer(gguf, threads=threads, n_ctx=n_ctx, verbosity=0) as srv:
        def body(ids):
            return {"prompt": [int(t) for t in ids], "n_predict": n_predict, "ignore_eos": True,
                    "temperature": 0.0, "top_k": 1, "samplers": ["top_k", "temperature"],
                    "seed": 42, "cache_prompt": False}
        srv.request("/completion", body(prompts[0]))  # warm-up
        runs = [{k: r["timings"][k] for k in ("prompt_n", "prompt_ms", "predicted_n",
                                               "predicted_ms", "cache_n")}
                for r in (srv.request("/completion", body(p)) for p in prompts)]
    for p, r in zip(prompts, runs):
        if r["prompt_n"] != len(p) or r["predicted_n"] != n_predict or r["cache_n"]:
            raise RuntimeError(f"unexpected llama.cpp timings {r} for a {len(p)}-token prompt")
    prompt_ms = sum(r["prompt_ms"] for r in runs)
    return {
        "gguf_file": os.path.basename(gguf),
        "threads": threads,
        "n_predict": n_predict,
        "prompts": len(prompts),
        "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts),
        "prefill_tokens_per_s": 1e3 * sum(r["prompt_n"] for r in runs) / prompt_ms,
        "decode_tokens_per_s": 1e3 * sum(r["predicted_n"] - 1 for r in runs)
        / sum(r["predicted_ms"] for r in runs),
        "ttft_s": prompt_ms / 1e3 / len(runs),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "runs": runs,
        "loadavg_1m_start": load0,
        "loadavg_1m_end": os.getloadavg()[0],
    }


def main():
    ap = argparse.ArgumentParser(description="llama.cpp tokens/s benchmark (see docstring)")
    ap.add_argument("--gguf", action="append", required=True, help="repeatable")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="measured requests after 1 warm-up")
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--sha256", action="store_true", help="also hash the GGUF files")
    ap.add_argument("--token-ids", metavar="FILE",
                    help="JSON list of token-id prompts: run those instead (see docstring)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    if args.token_ids:
        with open(args.token_ids) as f:
            prompts = json.load(f)
        results = [bench_token_prompts(g, prompts, args.n_predict, args.threads, args.n_ctx)
                   for g in args.gguf]
        out = {"tool": "llama.cpp via xllamacpp", **xllamacpp_versions(),
               "cpu_count": os.cpu_count(), "results": results}
        if args.json:
            print(json.dumps(out, indent=1))
        else:
            for r in results:
                print(f"{r['gguf_file']}: threads={r['threads']} {r['prompts']} prompts, "
                      f"prefill {r['prefill_tokens_per_s']:.1f} tok/s, "
                      f"decode {r['decode_tokens_per_s']:.1f} tok/s, TTFT {r['ttft_s']:.3f} s")
        return

    results = [bench_one(g, args) for g in args.gguf]
    out = {"tool": "llama.cpp via xllamacpp", **xllamacpp_versions(),
           "cpu_count": os.cpu_count(), "results": results}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for r in results:
            print(f"{r['gguf_file']}: threads={r['threads']} prompt {r['prompt_tokens']} tok "
                  f"@ {r['prompt_per_second']:.1f} tok/s, decode {r['n_predict']} tok "
                  f"@ {r['predicted_per_second']:.1f} tok/s")


if __name__ == "__main__":
    main()
