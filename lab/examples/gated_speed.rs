//! The per-token gated MLP kernel against the plain one on Qwen2.5-0.5B's
//! FFN shape (24 layers, 896 × 4864, f16, out of cache), alternated token
//! by token in one process: GB/s of the bytes each actually reads, and
//! ms per token. Run: cargo run --release -p selectinfer-lab --example gated_speed [KEEP]
//! (KEEP: neurons kept per group of 64, default 32).
//!
//! What it showed on the Zen 4 VM (docs/RESULTS.md, "Per-token gating"):
//! keeping 32 of 64 reads 67 % of the bytes but takes 100–130 % of the
//! plain kernel's time. Skipped rows are 1,792-byte gaps inside 4 KiB
//! pages, and the hardware prefetchers stream the pages whole; gating
//! blocks of 16–32 adjacent neurons (28–57 KB runs) instead took 74–83 %.
use half::f16;
use selectinfer::kernels::{gated_neurons, swiglu_mlp, swiglu_mlp_gated, GATE_GROUP};
use std::time::Instant;

fn main() {
    let keep: usize = std::env::args()
        .nth(1)
        .map_or(GATE_GROUP / 2, |a| a.parse().expect("KEEP is a count"));
    let (layers, h, n) = (24, 896, 4864);
    let per_layer = 3 * n * h;
    let total = layers * per_layer;
    let mut weights: Vec<f16> = Vec::with_capacity(total);
    selectinfer::sys::hugepages::advise(weights.as_ptr().cast(), total * 2);
    // A cheap hash, so that gates differ from neuron to neuron.
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    weights.extend((0..total).map(|_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        f16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1)
    }));
    let x: Vec<f32> = (0..h)
        .map(|i| ((i * 7919 % 101) as f32 - 50.0) * 0.02)
        .collect();
    let dense_bytes = total * 2;
    let gated_bytes = layers * (n + 2 * gated_neurons(n, keep)) * h * 2;
    let (mut td, mut tg) = (Vec::new(), Vec::new());
    let mut y = vec![0f32; h];
    for round in 0..60 {
        for gated in [round % 2 == 0, round % 2 == 1] {
            let t = Instant::now();
            for l in 0..layers {
                let w = &weights[l * per_layer..(l + 1) * per_layer];
                let (gate_up, down_t) = w.split_at(2 * n * h);
                match gated {
                    true => swiglu_mlp_gated(&x, gate_up, down_t, &mut y, keep),
                    false => swiglu_mlp(&x, gate_up, down_t, &mut y),
                }
            }
            let s = t.elapsed().as_secs_f64();
            match gated {
                true => tg.push(s),
                false => td.push(s),
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (d, g) = (med(&mut td), med(&mut tg));
    println!(
        "plain: {:.2} ms, {:.1} GB/s | gated keep {keep}/{GATE_GROUP}: {:.2} ms, {:.1} GB/s ({:.0} % of the bytes, {:.0} % of the time)",
        d * 1e3,
        dense_bytes as f64 / d / 1e9,
        g * 1e3,
        gated_bytes as f64 / g / 1e9,
        100.0 * gated_bytes as f64 / dense_bytes as f64,
        100.0 * g / d
    );
}
