#!/usr/bin/env python3
"""Where our q4 file is larger than the GGUF it was made from: each prepared
catalog model's `model.q4.siq`, tensor by tensor, against the bytes the same
tensors take in `model.gguf` (the GGUF type of each is in the siq header's
provenance, written by `store::quantize`).

Usage (from the repository root, models prepared in $SELECTINFER_MODELS,
else ./models):
  python3 lab/scripts/qfile_sizes.py [--models NAME ...] [--docs]

Writes docs/bench/qfile-sizes.json and prints one markdown table per model;
--docs also rewrites docs/BENCHMARKS.md between its `qfile-sizes` markers.
"""

import argparse
import collections
import json
import os
import re
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]

# Bits per weight of ggml's block formats (block bytes * 8 / block weights).
BITS = {"q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "q5_1": 6.0, "q8_0": 8.5,
        "q2k": 2.625, "q3k": 3.4375, "q4k": 4.5, "q5k": 5.5, "q6k": 6.5625,
        "f16": 16.0, "f32": 32.0}

WHY = {
    "down_proj": "neuron columns, Q8_0 (a)",
    "requantized": "no K-quant kernel: the 32-block format of ≥ its bits (b)",
    "kept": "GGUF blocks kept",
}
NOTES = [
    "(a) A neuron bundle holds each neuron's down_proj column; GGUF's blocks run along "
    "the neurons, and a block of 32 neurons cannot be split by selective loading, so the "
    "columns are requantized. 4-bit columns cost ten times candle's GGUF model's KL on "
    "SmolLM2 (the hidden size's outlier channels widen every block), Q5_0 five times; "
    "Q8_0 matches it (docs/EXPERIMENTS.md, \"Fidelity of the formats\").",
    "(b) Our kernels read ggml's 32-weight blocks (Q4_0, Q4_1, Q5_0, Q8_0), not the "
    "256-weight K-quants: Q4_K becomes Q4_1 (5.0 bits against 4.5), Q5_K Q5_0, Q6_K Q8_0 "
    "(8.5 against 6.56).",
]


def header(path):
    with open(path, "rb") as f:
        if f.read(8) != b"SIQUANT1":
            raise SystemExit(f"{path} is not a selectinfer quantized checkpoint")
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def role(name):
    for part in ["embed_tokens", "lm_head", "down_proj", "gate_proj", "up_proj"]:
        if part in name:
            return {"gate_proj": "gate/up_proj", "up_proj": "gate/up_proj"}.get(part, part)
    return "attention" if "self_attn" in name and name.endswith("proj.weight") else "other"


def sizes(folder):
    h = header(os.path.join(folder, "model.q4.siq"))
    ffn = h["ffn"]
    rows = collections.OrderedDict()
    for name, prov in sorted(h["provenance"].items()):
        if name in h["tensors"]:
            e = h["tensors"][name]
            params = 1
            for d in e["shape"]:
                params *= d
            ours = e["format"]
        else:
            layer = int(re.search(r"layers\.(\d+)\.", name).group(1))
            params = ffn[layer]["neurons"] * ffn[layer]["hidden"]
            ours = ffn[layer][name.split(".")[-2].replace("_proj", "")]
        m = re.search(r"GGUF (\w+)", prov)
        gguf = m.group(1).lower().replace("_k", "k") if m else ours
        how = "kept" if "blocks kept" in prov else (
            "down_proj" if "neuron rows" in prov else "requantized")
        key = (role(name), gguf, ours, how)
        r = rows.setdefault(key, {"role": key[0], "gguf": gguf, "ours": ours, "how": how,
                                  "tensors": 0, "params": 0})
        r["tensors"] += 1
        r["params"] += params
    out = list(rows.values())
    for r in out:
        r["gguf_bytes"] = r["params"] * BITS[r["gguf"]] / 8
        r["ours_bytes"] = r["params"] * BITS[r["ours"]] / 8
    files = {"gguf": os.path.getsize(os.path.join(folder, "model.gguf")),
             "q4_siq": os.path.getsize(os.path.join(folder, "model.q4.siq"))}
    return {"rows": out, "files": files}


def table(name, s):
    mb = lambda b: f"{b / 1e6:.0f}"  # noqa: E731
    f = s["files"]
    lines = [f"**{name}**: model.q4.siq {f['q4_siq'] / 1e6:.0f} MB against model.gguf "
             f"{f['gguf'] / 1e6:.0f} MB ({100 * (f['q4_siq'] / f['gguf'] - 1):+.0f} %).", "",
             "| tensors | count | GGUF type → ours | GGUF MB | ours MB | Δ MB | why |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(s["rows"], key=lambda r: r["gguf_bytes"] - r["ours_bytes"]):
        d = r["ours_bytes"] - r["gguf_bytes"]
        lines.append(f"| {r['role']} | {r['tensors']} | {r['gguf'].upper()} → {r['ours'].upper()} "
                     f"| {mb(r['gguf_bytes'])} | {mb(r['ours_bytes'])} | {d / 1e6:+.0f} "
                     f"| {WHY[r['how']]} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "qfile-sizes.json"))
    ap.add_argument("--docs", action="store_true")
    args = ap.parse_args()
    home = os.environ.get("SELECTINFER_MODELS", os.path.join(ROOT, "models"))
    result = {n: sizes(os.path.join(home, n)) for n in args.models}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    lines = ["Command: `python3 lab/scripts/qfile_sizes.py --docs` (figures: "
             f"`{os.path.relpath(args.out, ROOT)}`; bytes from bits per weight, headers and "
             "padding aside).", ""]
    for n in args.models:
        lines += table(n, result[n]) + [""]
    lines += [n + "\n" for n in NOTES]
    print("\n".join(lines))
    if args.docs:
        path = os.path.join(ROOT, "docs", "BENCHMARKS.md")
        text = open(path).read()
        start, end = "<!-- qfile-sizes -->", "<!-- /qfile-sizes -->"
        i, j = text.index(start) + len(start), text.index(end)
        open(path, "w").write(text[:i] + "\n" + "\n".join(lines) + text[j:])


if __name__ == "__main__":
    main()
