#!/usr/bin/env python3
"""Per-layer shares of the left-out FFN neurons (`layer_drop`) from a
sensitivity scan on calibration prompts (TEAL-style allocation, arXiv
2408.14690, in closed form).

The scan (`lab/scripts/layer_scan.sh`) runs one fidelity candidate per layer:
that layer alone at a low φ, every other layer whole. Its mean KL is the
layer's sensitivity s_l. With KL_l(u) ≈ s_l·u^p for a dropped share u, the
least total KL for a fixed total drop gives u_l ∝ s_l^(-1/(p-1)) = s_l^-β;
the weights are u_l over their mean across the sparse layers (so φ's total
is kept), each layer dropping at most MAX_DROP of its width at the given φ.

Usage: lab/scripts/layer_drop.py SCAN.json [--beta B] [--phi PHI] [--dense 0,23]
Prints the weights, `:`-separated (fidelity's `drop=`), and as a YAML list.
"""
import argparse
import json

ap = argparse.ArgumentParser()
ap.add_argument("scan")
ap.add_argument("--beta", type=float, default=0.67, help="exponent: 0.67 measured best on Qwen 0.5B (1 and 1.33 steeper, worse)")
ap.add_argument("--phi", type=float, default=0.65, help="φ the weights must stay valid at")
ap.add_argument("--max-drop", type=float, default=0.8, help="largest share of a layer left out")
ap.add_argument("--dense", default="", help="layers kept whole (weight 0), comma-separated")
a = ap.parse_args()

scan = json.load(open(a.scan))
sens = {}
for name, tasks in scan:
    drop = dict(kv.split("=", 1) for kv in name.split(","))["drop"].split(":")
    layer = max(range(len(drop)), key=lambda i: float(drop[i]))
    sens[layer] = sum(t["mean_kl"] for t in tasks) / len(tasks)
layers = max(sens) + 1
dense = {int(x) for x in a.dense.split(",") if x.strip()}
sparse = [l for l in range(layers) if l not in dense]
u = {l: sens[l] ** -a.beta for l in sparse}
# Normalise to mean 1, capping each layer's drop at max_drop / (1 - phi) and
# spreading what the cap removes over the others.
cap = a.max_drop / (1.0 - a.phi)
w = {l: 0.0 for l in range(layers)}
free = list(sparse)
budget = float(len(sparse))
while True:
    scale = budget / sum(u[l] for l in free)
    over = [l for l in free if u[l] * scale > cap]
    if not over:
        for l in free:
            w[l] = u[l] * scale
        break
    for l in over:
        w[l] = cap
        budget -= cap
        free.remove(l)
print(f"# sensitivity (mean KL, one layer at low phi): " + " ".join(f"{l}:{sens[l]:.3f}" for l in range(layers)))
print(":".join(f"{w[l]:.3f}" for l in range(layers)))
print("[" + ", ".join(f"{w[l]:.3f}" for l in range(layers)) + "]")
