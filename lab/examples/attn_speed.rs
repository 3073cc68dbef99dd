//! Times the CPU decode attention (`kernels::decode_attention`) at SmolLM2's
//! shape (9 query heads, 3 kv heads, head_dim 64) for a few cache lengths.
//! Run: cargo run --release -p selectinfer-lab --example attn_speed
use candle_core::Layout;
use selectinfer::kernels::{decode_attention, KvRows};
use std::time::Instant;

fn main() {
    let (heads, kv_heads, head_dim, capacity) = (9, 3, 64, 256);
    let values = |n: usize, m: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * m) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    };
    let (k, v) = (
        values(kv_heads * capacity * head_dim, 7919),
        values(kv_heads * capacity * head_dim, 104_729),
    );
    let q = values(heads * head_dim, 31);
    for positions in [64usize, 128, 192] {
        let layout = Layout::contiguous((1, kv_heads, capacity, head_dim))
            .narrow(2, 0, positions)
            .expect("narrowing inside the capacity");
        let mut times: Vec<f64> = (0..3000)
            .map(|_| {
                let t = Instant::now();
                let out = decode_attention(
                    &q,
                    KvRows::F32(&k, &layout),
                    KvRows::F32(&v, &layout),
                    heads,
                );
                std::hint::black_box(out.expect("consistent shapes"));
                t.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "{positions} cached positions: median {:.2} µs, best {:.2} µs",
            times[times.len() / 2] * 1e6,
            times[0] * 1e6
        );
    }
}
