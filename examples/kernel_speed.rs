//! Streams the decode matvecs of one SmolLM2 token through the kernels, without
//! any other op, to see what the kernels alone reach.
//! Run: cargo run --release --example kernel_speed [f16]
use selectinfer::kernels::{matvec, swiglu_mlp, WeightElem};
use std::time::Instant;
fn main() {
    if std::env::args().any(|a| a == "f16") {
        run::<half::f16>(half::f16::from_f32(0.01), 2);
    } else {
        run::<f32>(0.01, 4);
    }
}
fn run<T: WeightElem>(v: T, elem: usize) {
    let layers = 30;
    let shapes = [(960usize, 576usize), (576, 576)];
    let gate_ups: Vec<Vec<T>> = (0..layers).map(|_| vec![v; 3072 * 576]).collect();
    let mats: Vec<Vec<Vec<T>>> = (0..layers)
        .map(|_| shapes.iter().map(|&(n, k)| vec![v; n * k]).collect())
        .collect();
    let downs: Vec<Vec<T>> = (0..layers).map(|_| vec![v; 1536 * 576]).collect();
    let head = vec![v; 49152 * 576];
    let x = vec![1.0f32; 576];
    let mut bytes = 0usize;
    let mut best = f64::INFINITY;
    for _ in 0..20 {
        let t = Instant::now();
        bytes = 0;
        for l in 0..layers {
            for (m, &(n, _)) in mats[l].iter().zip(&shapes) {
                let mut out = vec![0f32; n];
                matvec(m, &x, &mut out);
                bytes += m.len() * elem;
            }
            let mut y = vec![0f32; 576];
            swiglu_mlp(&x, &gate_ups[l], &downs[l], &mut y);
            bytes += (gate_ups[l].len() + downs[l].len()) * elem;
        }
        let mut out = vec![0f32; 49152];
        matvec(&head, &x, &mut out);
        bytes += head.len() * elem;
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{:.1} MB/token, {:.2} ms/token, {:.1} GB/s",
        bytes as f64 / 1e6,
        best * 1e3,
        bytes as f64 / best / 1e9
    );
}
