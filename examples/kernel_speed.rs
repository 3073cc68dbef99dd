//! Streams the decode matvecs of one SmolLM2 token through the kernels, without
//! any other op, to see what the kernels alone reach.
use selectinfer::kernels::{matvec, vecmat};
use std::time::Instant;
fn main() {
    let layers = 30;
    let shapes = [(960usize, 576usize), (576, 576), (3072, 576)];
    let mats: Vec<Vec<Vec<f32>>> = (0..layers)
        .map(|_| shapes.iter().map(|&(n, k)| vec![0.01f32; n * k]).collect())
        .collect();
    let downs: Vec<Vec<f32>> = (0..layers).map(|_| vec![0.01f32; 1536 * 576]).collect();
    let head = vec![0.01f32; 49152 * 576];
    let x = vec![1.0f32; 576];
    let a = vec![1.0f32; 1536];
    let mut bytes = 0usize;
    let mut best = f64::INFINITY;
    for _ in 0..20 {
        let t = Instant::now();
        bytes = 0;
        for l in 0..layers {
            for (m, &(n, _)) in mats[l].iter().zip(&shapes) {
                let mut out = vec![0f32; n];
                matvec(m, &x, &mut out);
                bytes += m.len() * 4;
            }
            let mut y = vec![0f32; 576];
            vecmat(&a, &downs[l], &mut y);
            bytes += downs[l].len() * 4;
        }
        let mut out = vec![0f32; 49152];
        matvec(&head, &x, &mut out);
        bytes += head.len() * 4;
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{:.1} MB/token, {:.2} ms/token, {:.1} GB/s",
        bytes as f64 / 1e6,
        best * 1e3,
        bytes as f64 / best / 1e9
    );
}
