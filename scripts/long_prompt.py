#!/usr/bin/env python3
"""Prints a long summarization prompt (~3,800 SmolLM2 tokens): the first 2,800
words of the 6th-8th longest XSum dev documents. Used for the chunked-prefill
figures in docs/BENCHMARKS.md:
    selectinfer generate --model DIR --prompt "$(scripts/long_prompt.py)" --max-new-tokens 8 --json
"""
import json
import pathlib

data = pathlib.Path(__file__).resolve().parents[1] / "../shared/data/summarization_xsum.dev.jsonl"
rows = [json.loads(line) for line in data.open()]
docs = sorted(rows, key=lambda r: -len(r["document"]))[5:8]
text = "Summarize the following articles in one sentence each.\n\n" + "\n\n".join(d["document"] for d in docs)
print(" ".join(text.split(" ")[:2800]))
