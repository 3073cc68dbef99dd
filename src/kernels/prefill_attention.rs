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
use super::kv_rows::KvRows;
use candle_core::Result;
use std::cell::RefCell;

/// Queries per task.
const BLOCK: usize = 32;

thread_local! {
    /// A task's scores, and its buffer for one kv head's dequantized rows.
    static SCORES: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Attention of `seq` queries at positions `pos..pos + seq` over the
/// cached keys/values: `q` is `[heads, seq, head_dim]` (contiguous); `k`,
/// `v` the cached rows of positions `..pos + seq` ([`KvRows`]; `Q8_0` rows
/// are dequantized a head at a time into the task's buffer). Returns
/// `[seq, heads · head_dim]`. Grouped-query: head `h` reads kv head `h /
/// (heads / kv_heads)`.
pub(crate) fn prefill_attention(
    q: &[f32],
    k: KvRows,
    v: KvRows,
    heads: usize,
    pos: usize,
) -> Result<Vec<f32>> {
    use rayon::prelude::*;
    let (kv_heads, total, hd) = k.dims()?;
    if v.dims()? != (kv_heads, total, hd)
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || total <= pos
        || q.len() != heads * (total - pos) * hd
    {
        candle_core::bail!(
            "prefill attention: inconsistent shapes q {} ({heads} heads, from position {pos}) k {:?} v {:?}",
            q.len(),
            k.dims()?,
            v.dims()?
        );
    }
    k.check("prefill attention")?;
    v.check("prefill attention")?;
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
                let (s, buf) = &mut *s.borrow_mut();
                s.clear();
                s.resize(rows * keys, 0.0);
                for h in 0..heads {
                    let g = h / group;
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
                    gemm::matmul_serial(qb, k.head(g, keys, buf), Rhs::Transposed, scores);
                    for (r, row) in s.chunks_exact_mut(keys).enumerate() {
                        softmax_causal(row, pos + i0 + r + 1, scale);
                    }
                    let out = Out {
                        data: yb,
                        cols: width,
                        col0: h * hd,
                        accumulate: false,
                    };
                    let p = View::new(s, rows, keys);
                    gemm::matmul_serial(p, v.head(g, keys, buf), Rhs::AsIs, out);
                }
            });
        });
    Ok(y)
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
    use crate::kernels::blocks::QFormat;
    use crate::kernels::test_data::data;
    use candle_core::{Layout, Shape};

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
        // the block, grouped heads; as `Q8_0` rows where head_dim is whole
        // blocks.
        for (heads, kv, hd, pos, seq) in [
            (4, 2, 16, 0, 37),
            (6, 2, 8, 13, 70),
            (2, 1, 32, 5, 1),
            (4, 2, 64, 13, 70),
        ] {
            let cap = 96;
            let k = data(kv * cap * hd, 3);
            let v = data(kv * cap * hd, 5);
            let q = data(heads * seq * hd, 7);
            let total = pos + seq;
            let l = Layout::contiguous(Shape::from((1, kv, cap, hd)))
                .narrow(2, 0, total)
                .unwrap();
            let rows = |d| KvRows::F32(d, &l);
            let got = prefill_attention(&q, rows(&k), rows(&v), heads, pos).unwrap();
            let want = reference(&q, &k, &v, cap, heads, kv, hd, pos, seq);
            let close = |got: &[f32], want: &[f32], what: &str| {
                for (i, (a, b)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "{what}: heads {heads} pos {pos} seq {seq} at {i}: {a} vs {b}"
                    );
                }
            };
            close(&got, &want, "f32 rows");
            if hd % 32 != 0 {
                continue;
            }
            // The same keys and values as `Q8_0` rows: the attention over
            // the values they hold.
            let (kq, kd) = q8_rows(&k, (kv, cap, hd));
            let (vq, vd) = q8_rows(&v, (kv, cap, hd));
            let q8 = |data| KvRows::Q8 {
                data,
                kv_heads: kv,
                capacity: cap,
                len: total,
                head_dim: hd,
            };
            let got = prefill_attention(&q, q8(&kq), q8(&vq), heads, pos).unwrap();
            close(
                &got,
                &reference(&q, &kd, &vd, cap, heads, kv, hd, pos, seq),
                "q8 rows",
            );
        }
    }

    /// `[heads, cap, hd]` rows as `Q8_0` rows, and the values they hold.
    pub(crate) fn q8_rows(
        x: &[f32],
        (heads, cap, hd): (usize, usize, usize),
    ) -> (Vec<u8>, Vec<f32>) {
        let mut q = vec![0u8; heads * cap * QFormat::Q8_0.row_bytes(hd)];
        crate::kernels::store_q8(x, (heads, cap, hd), (&mut q, cap), 0);
        let held = crate::kernels::test_data::plain_dequantize(QFormat::Q8_0, &q);
        (q, held)
    }

    #[test]
    fn inconsistent_shapes_are_refused() {
        let l = Layout::contiguous(Shape::from((1, 2, 10, 8)));
        let (k, q) = (vec![0f32; 160], vec![0f32; 4 * 10 * 8]);
        let rows = |d| KvRows::F32(d, &l);
        assert!(prefill_attention(&q, rows(&k), rows(&k), 3, 0).is_err());
        assert!(prefill_attention(&q[1..], rows(&k), rows(&k), 4, 0).is_err());
        assert!(prefill_attention(&q, rows(&k[..100]), rows(&k), 4, 0).is_err());
        // `Q8_0` rows: a buffer short of the capacity, a head_dim not of whole blocks.
        let q8 = |data, head_dim| KvRows::Q8 {
            data,
            kv_heads: 2,
            capacity: 10,
            len: 10,
            head_dim,
        };
        let (k8, _) = q8_rows(&vec![0f32; 2 * 10 * 32], (2, 10, 32));
        let q32 = vec![0f32; 4 * 10 * 32];
        assert!(prefill_attention(&q32, q8(&k8, 32), q8(&k8, 32), 4, 0).is_ok());
        assert!(prefill_attention(&q32, q8(&k8[1..], 32), q8(&k8, 32), 4, 0).is_err());
        assert!(prefill_attention(&q, q8(&k8, 8), q8(&k8, 8), 4, 0).is_err());
    }
}
