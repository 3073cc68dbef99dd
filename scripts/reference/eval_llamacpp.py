#!/usr/bin/env python3
"""Runs an evaluation's prompts through llama.cpp (xllamacpp) and writes the
per-example outputs in `selectinfer eval`'s format, so `selectinfer eval
--out FILE` scores them with exactly our metrics.

Usage (from the repository root):
  target/release/selectinfer eval --data ../shared/data/qa_squad11.dev.jsonl \\
      --limit 10 --max-new-tokens 32 --out prompts.jsonl --prompts-only
  /tmp/refvenv/bin/python scripts/reference/eval_llamacpp.py \\
      --gguf models/smollm2-135m-instruct/model.gguf --prompts prompts.jsonl \\
      --max-new-tokens 32 --out llamacpp.qa.jsonl --stats llamacpp.qa.stats.json
  target/release/selectinfer eval --data ../shared/data/qa_squad11.dev.jsonl \\
      --limit 10 --max-new-tokens 32 --out llamacpp.qa.jsonl --json   # scores only

The prompts are our chat-formatted token ids (sent as ids: no tokenization,
no BOS added). Greedy (temperature 0, top_k 1), stops at the model's
end-of-generation tokens or --max-new-tokens, one warm-up request first.
Per example: ttft_s = llama.cpp's prompt_ms (prompt eval + first sample),
decode_tokens_per_s = (predicted_n - 1) / predicted_ms. --stats gets the
process's peak RSS (llama.cpp runs in-process, so it includes Python).
"""

import argparse
import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_server import LlamaServer  # noqa: E402


def prediction(text):
    """First non-empty line, trimmed (as `selectinfer eval` scores)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompts", required=True, help="JSONL of `selectinfer eval --prompts-only`")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stats")
    args = ap.parse_args()

    with open(args.prompts) as f:
        prompts = [json.loads(line) for line in f if line.strip()]
    if not prompts:
        sys.exit(f"{args.prompts}: no prompts")
    n_ctx = max(len(p["prompt_token_ids"]) for p in prompts) + args.max_new_tokens + 16
    with LlamaServer(args.gguf, threads=args.threads, n_ctx=n_ctx, verbosity=0) as srv:
        def complete(ids):
            return srv.request("/completion", {
                "prompt": [int(t) for t in ids], "n_predict": args.max_new_tokens,
                "temperature": 0.0, "top_k": 1, "samplers": ["top_k", "temperature"],
                "seed": 42, "cache_prompt": False})
        complete(prompts[0]["prompt_token_ids"])  # warm-up
        with open(args.out, "w") as out:
            for p in prompts:
                r = complete(p["prompt_token_ids"])
                t = r["timings"]
                n = t["predicted_n"]
                out.write(json.dumps({
                    "id": p["id"],
                    "prediction": prediction(r["content"]),
                    "raw_text": r["content"],
                    "references": p["references"],
                    "prompt_tokens": len(p["prompt_token_ids"]),
                    "generated_tokens": n,
                    "ttft_s": t["prompt_ms"] / 1e3,
                    "decode_tokens_per_s": (n - 1) / (t["predicted_ms"] / 1e3) if n > 1 and t["predicted_ms"] > 0 else 0.0,
                    "compute_ratio": 1.0,
                }) + "\n")
    if args.stats:
        with open(args.stats, "w") as f:
            json.dump({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                       "examples": len(prompts)}, f)


if __name__ == "__main__":
    main()
