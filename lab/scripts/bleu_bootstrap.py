#!/usr/bin/env python3
"""Paired bootstrap of BLEU retention: each system's BLEU over dense's, on
the same rows, resampled 1,000 times (sacreBLEU's corpus BLEU; rows matched
by id). Prints the retention, its 95 % interval and how often it reaches
90 %. Inputs are `selectinfer eval --out` files.

    pip install sacrebleu==2.4.3
    lab/scripts/bleu_bootstrap.py DENSE.jsonl SYSTEM.jsonl [SYSTEM.jsonl ...]
"""
import json
import random
import sys

import sacrebleu


def load(path):
    rows = [json.loads(line) for line in open(path)]
    return {r["id"]: (r["prediction"], r["references"][0]) for r in rows}


def bleu(hyps, refs):
    return sacrebleu.corpus_bleu(hyps, [refs]).score


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    dense = load(sys.argv[1])
    for path in sys.argv[2:]:
        system = load(path)
        ids = [i for i in dense if i in system]
        refs = [dense[i][1] for i in ids]
        hd = [dense[i][0] for i in ids]
        hs = [system[i][0] for i in ids]
        bd, bs = bleu(hd, refs), bleu(hs, refs)
        rng = random.Random(0)
        ratios = []
        for _ in range(1000):
            k = [rng.randrange(len(ids)) for _ in ids]
            d = bleu([hd[j] for j in k], [refs[j] for j in k])
            s = bleu([hs[j] for j in k], [refs[j] for j in k])
            ratios.append(s / d if d > 0 else float("nan"))
        ratios.sort()
        same = sum(a == b for a, b in zip(hd, hs))
        print(
            f"{path}: {len(ids)} rows, dense BLEU {bd:.2f}, system {bs:.2f}: "
            f"retention {100 * bs / bd:.1f} % (95 % interval {100 * ratios[25]:.1f}-"
            f"{100 * ratios[974]:.1f}; >= 90 % in {sum(r >= 0.9 for r in ratios) / 10:.0f} % "
            f"of resamples); {same} outputs identical to dense's"
        )


if __name__ == "__main__":
    main()
