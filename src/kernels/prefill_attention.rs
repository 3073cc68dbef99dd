//! Prefill attention: a chunk's queries over the cached keys and values,
//! causal, as blocked matrix products on plain buffers. Each task takes a
//! block of queries of every head: `S = Q·Kᵀ` over the keys up to the
//! block's last position only (the causal half of the work is skipped),
//! the softmax row by row over each query's own keys, `Y = P·V`, all in
//! one reused buffer; blocks run on rayon's threads. candle's form of the
//! same (a `[heads, seq, total]` score tensor, a mask tensor, a softmax
//! tensor) computed every key for every query and faulted in tens of
//! megabytes per layer.

use super::exp::exp;
use super::gemm::{self, Out, Rhs, View};
use candle_core::{Layout, Result};
use std::cell::RefCell;

/// Queries per task.
const BLOCK: usize = 32;

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Attention of `seq` queries at positions `pos..pos + seq` over the
/// cached keys/values: `q` is `[heads, seq, head_dim]` (contiguous); `k`,
/// `v` the storage of `[1, kv_heads, pos + seq, head_dim]` tensors laid out
/// by `kl`, `vl` (any strides, contiguous last dim). Returns `[seq, heads ·
/// head_dim]`. Grouped-query: head `h` reads kv head `h / (heads /
/// kv_heads)`.
pub(crate) fn prefill_attention(
    q: &[f32],
    (k, kl): (&[f32], &Layout),
    (v, vl): (&[f32], &Layout),
    heads: usize,
    pos: usize,
) -> Result<Vec<f32>> {
    use rayon::prelude::*;
    let (_, kv_heads, total, hd) = kl.shape().dims4()?;
    if vl.shape() != kl.shape()
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || total <= pos
        || q.len() != heads * (total - pos) * hd
    {
        candle_core::bail!(
            "prefill attention: inconsistent shapes q {} ({heads} heads, from position {pos}) k {:?} v {:?}",
            q.len(),
            kl.shape(),
            vl.shape()
        );
    }
    if kl.stride()[3] != 1 || vl.stride()[3] != 1 {
        candle_core::bail!("prefill attention: k/v rows must be contiguous");
    }
    let last = |l: &Layout| {
        l.start_offset() + (kv_heads - 1) * l.stride()[1] + (total - 1) * l.stride()[2] + hd
    };
    if last(kl) > k.len() || last(vl) > v.len() {
        candle_core::bail!("prefill attention: k/v views outside their storage");
    }
    let (seq, group) = (total - pos, heads / kv_heads);
    let scale = 1.0 / (hd as f32).sqrt();
    let width = heads * hd;
    let mut y = vec![0f32; seq * width];
    y.par_chunks_mut(BLOCK * width)
        .enumerate()
        .for_each(|(bi, yb)| {
            let (i0, rows) = (bi * BLOCK, yb.len() / width);
            // Keys the block's last query sees.
            let keys = pos + i0 + rows;
            SCORES.with(|s| {
                let s = &mut *s.borrow_mut();
                s.clear();
                s.resize(rows * keys, 0.0);
                for h in 0..heads {
                    let g = h / group;
                    let kv = |data, l| kv_rows(data, l, g, keys);
                    let qb = View::new(
                        &q[(h * seq + i0) * hd..(h * seq + i0 + rows) * hd],
                        rows,
                        hd,
                    );
                    let scores = Out {
                        data: s,
                        cols: keys,
                        col0: 0,
                        accumulate: false,
                    };
                    gemm::matmul_serial(qb, kv(k, kl), Rhs::Transposed, scores);
                    for (r, row) in s.chunks_exact_mut(keys).enumerate() {
                        softmax_causal(row, pos + i0 + r + 1, scale);
                    }
                    let out = Out {
                        data: yb,
                        cols: width,
                        col0: h * hd,
                        accumulate: false,
                    };
                    gemm::matmul_serial(View::new(s, rows, keys), kv(v, vl), Rhs::AsIs, out);
                }
            });
        });
    Ok(y)
}

/// The first `keys` rows of kv head `g` in the storage `data` laid out by `l`.
fn kv_rows<'a>(data: &'a [f32], l: &Layout, g: usize, keys: usize) -> View<'a> {
    View {
        data: &data[l.start_offset() + g * l.stride()[1]..],
        rows: keys,
        cols: l.dims()[3],
        stride: l.stride()[2],
    }
}

/// `row[..seen] = softmax(scale · row[..seen])`, `row[seen..] = 0`.
fn softmax_causal(row: &mut [f32], seen: usize, scale: f32) {
    let (live, dead) = row.split_at_mut(seen);
    dead.fill(0.0);
    let max = live.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) * scale;
    let mut sum = 0f32;
    for v in live.iter_mut() {
        *v = exp(*v * scale - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    live.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::data;
    use candle_core::Shape;

    /// Causal attention of each query over its keys, in f64.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        cap: usize,
        heads: usize,
        kv: usize,
        hd: usize,
        pos: usize,
        seq: usize,
    ) -> Vec<f32> {
        let mut y = vec![0f32; seq * heads * hd];
        for h in 0..heads {
            let g = h / (heads / kv);
            for i in 0..seq {
                let qi = &q[(h * seq + i) * hd..][..hd];
                let seen = pos + i + 1;
                let s: Vec<f64> = (0..seen)
                    .map(|j| {
                        let kj = &k[(g * cap + j) * hd..][..hd];
                        qi.iter()
                            .zip(kj)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let acc: f64 = (0..seen)
                        .map(|j| e[j] / z * v[(g * cap + j) * hd + d] as f64)
                        .sum();
                    y[i * heads * hd + h * hd + d] = acc as f32;
                }
            }
        }
        y
    }

    #[test]
    fn matches_a_reference_on_a_strided_cache_and_odd_shapes() {
        // A cache of capacity 96 (the views strided as the KV cache's),
        // queries after 0 or 13 cached positions, chunks not multiples of
        // the block, grouped heads.
        for (heads, kv, hd, pos, seq) in [(4, 2, 16, 0, 37), (6, 2, 8, 13, 70), (2, 1, 32, 5, 1)] {
            let cap = 96;
            let k = data(kv * cap * hd, 3);
            let v = data(kv * cap * hd, 5);
            let q = data(heads * seq * hd, 7);
            let total = pos + seq;
            let l = Layout::contiguous(Shape::from((1, kv, cap, hd)))
                .narrow(2, 0, total)
                .unwrap();
            let got = prefill_attention(&q, (&k, &l), (&v, &l), heads, pos).unwrap();
            let want = reference(&q, &k, &v, cap, heads, kv, hd, pos, seq);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() < 1e-5,
                    "heads {heads} pos {pos} seq {seq} at {i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn inconsistent_shapes_are_refused() {
        let l = Layout::contiguous(Shape::from((1, 2, 10, 8)));
        let (k, q) = (vec![0f32; 160], vec![0f32; 4 * 10 * 8]);
        assert!(prefill_attention(&q, (&k, &l), (&k, &l), 3, 0).is_err());
        assert!(prefill_attention(&q[1..], (&k, &l), (&k, &l), 4, 0).is_err());
        assert!(prefill_attention(&q, (&k[..100], &l), (&k, &l), 4, 0).is_err());
    }
}
