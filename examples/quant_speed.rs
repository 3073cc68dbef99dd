//! Streams one SmolLM2-shaped token's quantized rows through the quantized
//! kernels alone (matvec over every row, one thread and the decode pool),
//! per block format, to see what they reach in GB/s.
//! Run: cargo run --release --example quant_speed
use selectinfer::kernels::quant::{self, Q8Act, QFormat};
use std::time::Instant;

fn main() {
    let rows: usize = std::env::var("ROWS").map_or(200_000, |v| v.parse().unwrap());
    let h = 576usize;
    let x: Vec<f32> = (0..h).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
    let xq = Q8Act::quantize(&x);
    for f in [QFormat::Q8_0, QFormat::Q4_1, QFormat::Q5_0, QFormat::Q4_0] {
        let bytes = f.row_bytes(h) * rows;
        let mut w: Vec<u8> = Vec::with_capacity(bytes);
        selectinfer::sys::hugepages::advise(w.as_ptr(), bytes);
        w.extend((0..bytes).map(|i| (i % 251) as u8 & 0x3f));
        // Scales: keep them finite (small f16 values).
        let bb = f.block_bytes();
        for b in w.chunks_exact_mut(bb) {
            b[0] = 0x00;
            b[1] = 0x1c;
            if f == QFormat::Q4_1 {
                b[2] = 0;
                b[3] = 0x1c;
            }
        }
        let mut out = vec![0f32; rows];
        let mut best = f64::MAX;
        let mut best1 = f64::MAX;
        for _ in 0..(4_000_000 / rows).max(20) {
            let t = Instant::now();
            quant::matvec_q(f, &w, &xq, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            for (o, r) in out.iter_mut().zip(w.chunks_exact(f.row_bytes(h))) {
                *o = quant::dot(f, r, &xq);
            }
            best1 = best1.min(t.elapsed().as_secs_f64());
        }
        let mut y = vec![0f32; h];
        let mut besta = f64::MAX;
        for _ in 0..(2_000_000 / rows).max(10) {
            let t = Instant::now();
            for r in w.chunks_exact(f.row_bytes(h)) {
                quant::axpy(f, 0.5, r, &mut y);
            }
            besta = besta.min(t.elapsed().as_secs_f64());
        }
        let mut best4 = f64::MAX;
        let rb = f.row_bytes(h);
        for _ in 0..(2_000_000 / rows).max(10) {
            let t = Instant::now();
            for r in w.chunks_exact(4 * rb) {
                let r4 = [&r[..rb], &r[rb..2 * rb], &r[2 * rb..3 * rb], &r[3 * rb..]];
                quant::axpy4(f, [0.5, 0.25, -0.5, 0.1], r4, &mut y);
            }
            best4 = best4.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{f}: matvec pool {:.1} GB/s, one thread {:.1} GB/s, axpy one thread {:.1} GB/s, axpy4 {:.1} GB/s ({})",
            bytes as f64 / best / 1e9,
            bytes as f64 / best1 / 1e9,
            bytes as f64 / besta / 1e9,
            bytes as f64 / best4 / 1e9,
            out[7] + y[3]
        );
    }
}
