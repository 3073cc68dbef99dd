//! The portable kernel forms (`selectinfer::kernels::portable`, what an ARM
//! CPU such as a Jetson's runs, or an x86 one without AVX2/FMA/F16C) against
//! the plain loops they replaced, on SmolLM2's `[1536, 576]` MLP shape, one
//! thread, variants alternated round by round in one process (this VM's speed
//! drifts). Prints each variant's best round and the ratio.
//! Run: cargo run --release -p selectinfer-lab --example portable_kernels
use half::f16;
use selectinfer::kernels::portable;
use std::time::Instant;

fn plain_dot_f32(w: &[f32], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| a * b).sum()
}
fn plain_dot_f16(w: &[f16], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| a.to_f32() * b).sum()
}
fn plain_axpy_rows_f16(a: &[f32], w: &[f16], y: &mut [f32]) {
    let k = y.len();
    for (r, &ar) in a.iter().enumerate() {
        for (yi, wi) in y.iter_mut().zip(&w[r * k..(r + 1) * k]) {
            *yi += ar * wi.to_f32();
        }
    }
}

fn main() {
    let (rows, k) = (1536usize, 576usize);
    let w32: Vec<f32> = (0..rows * k).map(|i| (i as f32 * 1e-3).sin()).collect();
    let w16: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
    let x: Vec<f32> = (0..k).map(|i| (i as f32 * 1e-2).cos()).collect();
    let a: Vec<f32> = (0..rows).map(|i| (i as f32 * 1e-2).cos()).collect();
    let mut y = vec![0f32; k];
    type Job<'a> = Box<dyn FnMut() -> f32 + 'a>;
    let pairs: Vec<(&str, Job, Job)> = vec![
        (
            "dot f32 (matvec rows)",
            Box::new(|| w32.chunks_exact(k).map(|r| plain_dot_f32(r, &x)).sum()),
            Box::new(|| w32.chunks_exact(k).map(|r| portable::dot_f32(r, &x)).sum()),
        ),
        (
            "dot f16 (matvec rows)",
            Box::new(|| w16.chunks_exact(k).map(|r| plain_dot_f16(r, &x)).sum()),
            Box::new(|| w16.chunks_exact(k).map(|r| portable::dot_f16(r, &x)).sum()),
        ),
        (
            "row sums f16 (down_proj)",
            Box::new(|| {
                y.fill(0.0);
                plain_axpy_rows_f16(&a, &w16, &mut y);
                y[3]
            }),
            Box::new(|| {
                let mut y = vec![0f32; k];
                portable::axpy_rows_f16(&a, &w16, &mut y);
                y[3]
            }),
        ),
    ];
    let time = |f: &mut Job| {
        let t = Instant::now();
        let mut s = 0.0;
        for _ in 0..10 {
            s += f();
        }
        std::hint::black_box(s);
        t.elapsed().as_secs_f64() / 10.0
    };
    println!("| kernel | plain loop µs | portable µs | speed-up |\n|---|---|---|---|");
    for (name, mut plain, mut new) in pairs {
        let (mut best_plain, mut best_new) = (f64::MAX, f64::MAX);
        for _ in 0..7 {
            best_plain = best_plain.min(time(&mut plain));
            best_new = best_new.min(time(&mut new));
        }
        println!(
            "| {name} | {:.0} | {:.0} | {:.1}× |",
            best_plain * 1e6,
            best_new * 1e6,
            best_plain / best_new
        );
    }
}
