//! Streams the decode matvecs of one SmolLM2 token through the kernels, without
//! any other op, to see what the kernels alone reach, next to the bandwidth
//! probe of `bench --bandwidth` in the same process.
//! Run: cargo run --release -p selectinfer-lab --example kernel_speed [f16]
//!
//! The weights lie in one buffer advised for huge pages before it is
//! written, like the model's (`selectinfer::sys::hugepages`): the kernels stream
//! markedly faster on huge pages, so separate small buffers (which mostly get
//! none) would understate them. This VM's speed drifts by ±15% within
//! seconds; compare variants interleaved in one process (alternate them
//! token by token), not run after run.
use selectinfer::kernels::{matvec, swiglu_mlp, WeightElem};
use std::time::Instant;

fn main() {
    if std::env::args().any(|a| a == "f16") {
        run(half::f16::from_f32);
    } else {
        run(|v| v);
    }
}

fn run<T: WeightElem>(from_f32: fn(f32) -> T) {
    let (layers, h, n, vocab) = (30, 576, 1536, 49152);
    let (qkv_rows, o_rows) = (960, 576);
    let total = layers * (qkv_rows + o_rows + 3 * n) * h + vocab * h;
    let bytes = total * std::mem::size_of::<T>();
    let mut weights: Vec<T> = Vec::with_capacity(total);
    selectinfer::sys::hugepages::advise(weights.as_ptr().cast(), bytes);
    weights.extend((0..total).map(|i| from_f32(((i % 13) as f32 - 6.0) * 1e-3)));
    let x = vec![1.0f32; h];
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let mut rest = &weights[..];
        let mut take = |len: usize| {
            let (a, b) = rest.split_at(len);
            rest = b;
            a
        };
        for _ in 0..layers {
            let mut qkv = vec![0f32; qkv_rows];
            matvec(take(qkv_rows * h), &x, &mut qkv);
            let mut o = vec![0f32; o_rows];
            matvec(take(o_rows * h), &x, &mut o);
            let mut y = vec![0f32; h];
            let gate_up = take(2 * n * h);
            swiglu_mlp(&x, gate_up, take(n * h), &mut y);
        }
        let mut logits = vec![0f32; vocab];
        matvec(take(vocab * h), &x, &mut logits);
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let gb_s = |s: f64| bytes as f64 / s / 1e9;
    println!(
        "{:.1} MB/token ({} MiB on huge pages): median {:.2} ms = {:.1} GB/s, best {:.1} GB/s",
        bytes as f64 / 1e6,
        selectinfer::sys::memory::anon_huge_page_bytes() >> 20,
        times[times.len() / 2] * 1e3,
        gb_s(times[times.len() / 2]),
        gb_s(times[0])
    );
    drop(weights);
    println!(
        "bandwidth probe (best of 5 sums of 1 GiB): {:.1} GB/s",
        selectinfer::sys::memory::measure_read_bandwidth(1 << 30, 5)
    );
}
