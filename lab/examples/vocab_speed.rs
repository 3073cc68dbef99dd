//! The lm_head of Qwen2.5-0.5B's shape (151,936 × 896, f16, on huge
//! pages, out of cache) whole against restricted to an output vocabulary
//! (`selectinfer::model::vocab`), alternated in one process: ms per
//! decode step's logits. Run:
//! cargo run --release -p selectinfer-lab --example vocab_speed [PREFIX] [EXTRA]
//! (rows 0..PREFIX, then EXTRA rows spread evenly past it; default the
//! `latin` cut of Qwen2.5: 99,156 and 4,992).
use half::f16;
use selectinfer::kernels::{matvec, matvec_ids};
use std::time::Instant;

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .map_or(d, |a| a.parse().expect("a count"))
    };
    let (prefix, extra) = (arg(1, 99_156), arg(2, 4_992));
    let (vocab, h) = (151_936usize, 896usize);
    let mut w: Vec<f16> = Vec::with_capacity(vocab * h);
    selectinfer::sys::hugepages::advise(w.as_ptr().cast(), vocab * h * 2);
    w.extend((0..vocab * h).map(|i| f16::from_f32(((i % 13) as f32 - 6.0) * 1e-3)));
    let step = (vocab - prefix) as f64 / extra.max(1) as f64;
    let ids: Vec<u32> = (0..extra)
        .map(|j| (prefix as f64 + j as f64 * step) as u32)
        .collect();
    let x = vec![0.5f32; h];
    let (mut full, mut part) = (Vec::new(), Vec::new());
    let mut out = vec![0f32; vocab];
    let mut ex = vec![0f32; extra];
    for round in 0..40 {
        for restricted in [round % 2 == 0, round % 2 == 1] {
            let t = Instant::now();
            if restricted {
                matvec(&w[..prefix * h], &x, &mut out[..prefix]);
                matvec_ids(&w, &ids, &x, &mut ex);
            } else {
                matvec(&w, &x, &mut out);
            }
            let s = t.elapsed().as_secs_f64();
            if restricted {
                part.push(s)
            } else {
                full.push(s)
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (f, p) = (med(&mut full), med(&mut part));
    println!(
        "whole: {:.2} ms | rows 0..{prefix} + {extra}: {:.2} ms ({:.0} % of the rows, {:.0} % of the time)",
        f * 1e3,
        p * 1e3,
        100.0 * (prefix + extra) as f64 / vocab as f64,
        100.0 * p / f
    );
}
