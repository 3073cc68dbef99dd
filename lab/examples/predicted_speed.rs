//! A prototype of per-token selection with a predictor, against the plain
//! f16 MLP kernel (docs/EXPERIMENTS.md, "Per-token selection with a 4-bit
//! gate"): a Q4_0 copy of the gate rows ranks every neuron for the token,
//! then the KEEP of each 64 with the largest |silu| run their f16 gate, up
//! and down rows, stored together per neuron (one 5 KiB read each).
//! Qwen2.5-0.5B's FFN shape, 24 layers, out of cache, alternated token by
//! token. `SKIP_PRED=1` leaves the predictor out (its cost alone).
//! Run: cargo run --release -p selectinfer-lab --example predicted_speed [KEEP]
use half::f16;
use selectinfer::kernels::quant::{self, Q8Act, QFormat};
use selectinfer::kernels::spin_pool::{DisjointSlice, SpinPool};
use selectinfer::kernels::{gate_keep_mask, swiglu_mlp, WeightElem, GATE_GROUP};
use std::time::Instant;

fn main() {
    let keep: usize = std::env::args().nth(1).map_or(32, |a| a.parse().unwrap());
    let (layers, h, n) = (24, 896, 4864);
    let per_layer = 3 * n * h;
    let total = layers * per_layer;
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut weights: Vec<f16> = Vec::with_capacity(total);
    selectinfer::sys::hugepages::advise(weights.as_ptr().cast(), total * 2);
    weights.extend(
        (0..total).map(|_| f16::from_f32(((rnd() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1)),
    );
    let f = QFormat::Q4_0;
    let prow = f.row_bytes(h);
    let mut pred: Vec<u8> = Vec::with_capacity(layers * n * prow);
    selectinfer::sys::hugepages::advise(pred.as_ptr().cast(), layers * n * prow);
    for _ in 0..layers * n * h / 32 {
        pred.extend(f16::from_f32(0.01).to_le_bytes());
        pred.extend((0..16).map(|_| rnd() as u8));
    }
    let x: Vec<f32> = (0..h)
        .map(|i| ((i * 7919 % 101) as f32 - 50.0) * 0.02)
        .collect();
    let pool = SpinPool::global();
    let skip_pred = std::env::var("SKIP_PRED").is_ok();
    let (mut td, mut tp) = (Vec::new(), Vec::new());
    let mut y = vec![0f32; h];
    let silu = |g: f32| g / (1.0 + (-g).exp());
    for round in 0..60 {
        for predicted in [round % 2 == 0, round % 2 == 1] {
            let t = Instant::now();
            for l in 0..layers {
                let w = &weights[l * per_layer..(l + 1) * per_layer];
                if !predicted {
                    let (gate_up, down_t) = w.split_at(2 * n * h);
                    swiglu_mlp(&x, gate_up, down_t, &mut y);
                    continue;
                }
                // Bundled layout: neuron i = w[i*3h .. (i+1)*3h] = gate | up | down.
                let p = &pred[l * n * prow..(l + 1) * n * prow];
                let xq = Q8Act::quantize(&x);
                let blocks = pool.partition(n.div_ceil(GATE_GROUP), 1);
                let mut partials = vec![0f32; blocks.len() * h];
                let parts = DisjointSlice::new(&mut partials);
                pool.run_blocks(&blocks, |index, groups| {
                    let part = unsafe { parts.range(index * h..(index + 1) * h) };
                    let mut mask = Vec::with_capacity(GATE_GROUP);
                    let mut kept = Vec::with_capacity(GATE_GROUP);
                    for g in groups {
                        let rows = g * GATE_GROUP..((g + 1) * GATE_GROUP).min(n);
                        let gates: Vec<f32> = if skip_pred {
                            rows.clone().map(|r| r as f32).collect()
                        } else {
                            rows.clone()
                                .map(|r| quant::dot(f, &p[r * prow..(r + 1) * prow], &xq))
                                .collect()
                        };
                        gate_keep_mask(&gates, keep, &mut mask);
                        kept.clear();
                        kept.extend((0..rows.len()).filter(|&j| mask[j]).map(|j| rows.start + j));
                        const AHEAD: usize = 2;
                        let b = |i: usize| &w[i * 3 * h..(i + 1) * 3 * h];
                        for &i in kept.iter().take(AHEAD) {
                            f16::prefetch(b(i));
                        }
                        for (q, &i) in kept.iter().enumerate() {
                            if let Some(&next) = kept.get(q + AHEAD) {
                                f16::prefetch(b(next));
                            }
                            let (gu, d) = b(i).split_at(2 * h);
                            let a = silu(f16::dot(&gu[..h], &x)) * f16::dot(&gu[h..], &x);
                            f16::axpy_rows(&[a], d, part);
                        }
                    }
                });
                y.fill(0.0);
                for pp in partials.chunks(h) {
                    for (a, b) in y.iter_mut().zip(pp) {
                        *a += b;
                    }
                }
            }
            let s = t.elapsed().as_secs_f64();
            if predicted {
                tp.push(s)
            } else {
                td.push(s)
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (d, p) = (med(&mut td), med(&mut tp));
    let dense_bytes = (total * 2) as f64;
    let pbytes = (layers * (n * prow + (n / GATE_GROUP) * keep.min(GATE_GROUP) * 3 * h * 2)) as f64;
    println!(
        "plain {:.2} ms {:.1} GB/s | predicted keep {keep}/64: {:.2} ms {:.1} GB/s ({:.0} % bytes, {:.0} % time)",
        d * 1e3, dense_bytes / d / 1e9, p * 1e3, pbytes / p / 1e9, 100.0 * pbytes / dense_bytes, 100.0 * p / d
    );
}
