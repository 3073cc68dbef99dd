//! Decode attention: one query token over the KV cache, heads split over
//! the decode threads.

use super::blocks::{Q8Act, QFormat};
use super::exp::exp;
use super::kv_rows::KvRows;
use super::portable;
use super::quant;
use super::spin_pool::{DisjointSlice, SpinPool};
#[cfg(target_arch = "x86_64")]
use super::x86;
use super::StridedRows;
#[cfg(test)]
use candle_core::Layout;
use candle_core::Result;

/// Attention of one query token over the cached keys/values: `q` of
/// `heads × head_dim`; `k`, `v` the cached rows ([`KvRows`]). Returns
/// `heads × head_dim` values. Grouped-query: query head `h` uses kv head
/// `h / (heads / kv_heads)`. Heads are split over the decode threads.
/// Over `Q8_0` rows the query is quantized per block (as llama.cpp does
/// over a q8_0 cache) and each row is read as it is stored.
pub fn decode_attention(q: &[f32], k: KvRows, v: KvRows, heads: usize) -> Result<Vec<f32>> {
    let (kv_heads, t, hd) = k.dims()?;
    let same = matches!(
        (k, v),
        (KvRows::F32(..), KvRows::F32(..)) | (KvRows::Q8 { .. }, KvRows::Q8 { .. })
    );
    if v.dims()? != (kv_heads, t, hd)
        || !same
        || q.len() != heads * hd
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
    {
        candle_core::bail!(
            "decode attention: inconsistent shapes q {} ({heads} heads) k {:?} v {:?}",
            q.len(),
            k.dims()?,
            v.dims()?
        );
    }
    if t == 0 {
        candle_core::bail!("decode attention: no cached position");
    }
    k.check("decode attention")?;
    v.check("decode attention")?;
    let group = heads / kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    // Over `Q8_0` rows, each head's query quantized here, on the calling
    // thread: the decode threads allocate nothing (a first allocation in
    // a thread's own malloc arena can fault in a whole huge page).
    let queries: Vec<Q8Act> = match k {
        KvRows::Q8 { .. } => q.chunks_exact(hd).map(Q8Act::quantize).collect(),
        KvRows::F32(..) => Vec::new(),
    };
    let mut out = vec![0f32; heads * hd];
    let heads_out = DisjointSlice::new(&mut out);
    SpinPool::global().for_each_block(heads, 1, |_, block| {
        let mut scores = vec![0f32; t];
        for h in block {
            let kvh = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            // SAFETY: each head is in exactly one block.
            let o = unsafe { heads_out.range(h * hd..(h + 1) * hd) };
            let (KvRows::F32(k, kl), KvRows::F32(v, vl)) = (k, v) else {
                let (kr, vr) = (k.q8_rows(kvh, 0..t), v.q8_rows(kvh, 0..t));
                attend_head_q8(&queries[h], kr, vr, scale, &mut scores, o);
                continue;
            };
            let kr = (k, kl.start_offset() + kvh * kl.stride()[1], kl.stride()[2]);
            let vr = (v, vl.start_offset() + kvh * vl.stride()[1], vl.stride()[2]);
            #[cfg(target_arch = "x86_64")]
            if x86::available() && hd.is_multiple_of(8) {
                // SAFETY: AVX2/FMA checked, `hd` a multiple of 8, rows
                // inside the storage (checked above).
                unsafe { x86::attend_head_f32(qh, kr, vr, scale, &mut scores, o) };
                continue;
            }
            attend_head(qh, kr, vr, scale, &mut scores, o);
        }
    });
    Ok(out)
}

/// One query head's attention over `Q8_0` key and value rows (`k`, `v`:
/// one row of `qa.len()` values a position): the scores from the query
/// quantized per block (`qa`), the output an axpy of each value row.
fn attend_head_q8(qa: &Q8Act, k: &[u8], v: &[u8], scale: f32, scores: &mut [f32], out: &mut [f32]) {
    let rb = QFormat::Q8_0.row_bytes(qa.len());
    let mut max = f32::NEG_INFINITY;
    for (s, row) in scores.iter_mut().zip(k.chunks_exact(rb)) {
        *s = quant::dot(QFormat::Q8_0, row, qa) * scale;
        max = max.max(*s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = exp(*s - max);
        sum += *s;
    }
    out.fill(0.0);
    let inv = 1.0 / sum;
    for (s, row) in scores.iter().zip(v.chunks_exact(rb)) {
        quant::axpy(QFormat::Q8_0, s * inv, row, out);
    }
}

/// Portable form of `x86::attend_head_f32`: one query head's attention.
fn attend_head(
    q: &[f32],
    k: StridedRows,
    v: StridedRows,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let ((k, kbase, kstride), (v, vbase, vstride)) = (k, v);
    let hd = q.len();
    let mut max = f32::NEG_INFINITY;
    for (j, s) in scores.iter_mut().enumerate() {
        *s = portable::dot_f32(&k[kbase + j * kstride..][..hd], q) * scale;
        max = max.max(*s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.fill(0.0);
    for (j, s) in scores.iter().enumerate() {
        let p = s / sum;
        let row = &v[vbase + j * vstride..][..hd];
        out.iter_mut().zip(row).for_each(|(o, v)| *o += p * v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::data;

    #[test]
    fn decode_attention_matches_reference_on_a_strided_cache() {
        // A cache of capacity 24 holding 19 positions (two vectors of
        // scores and a tail), as the KV cache's views are; head_dim 16 and
        // 80 (64 + 16 columns in registers) take the vectorised path, 12
        // the portable one.
        for hd in [16, 80, 12] {
            let (heads, kv_heads, cap, t) = (6, 2, 24, 19);
            let layout = Layout::contiguous((1, kv_heads, cap, hd))
                .narrow(2, 0, t)
                .unwrap();
            let (k, v, q) = (
                data(kv_heads * cap * hd, 7),
                data(kv_heads * cap * hd, 8),
                data(heads * hd, 9),
            );
            let rows = |d| KvRows::F32(d, &layout);
            let out = decode_attention(&q, rows(&k), rows(&v), heads).unwrap();
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let row = |m: &[f32], j: usize| m[(kvh * cap + j) * hd..][..hd].to_vec();
                let qh = &q[h * hd..(h + 1) * hd];
                let scores: Vec<f32> = (0..t)
                    .map(|j| {
                        row(&k, j).iter().zip(qh).map(|(a, b)| a * b).sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                for c in 0..hd {
                    let want: f32 = (0..t).map(|j| e[j] / sum * row(&v, j)[c]).sum();
                    let got = out[h * hd + c];
                    assert!(
                        (got - want).abs() < 1e-5,
                        "hd {hd} head {h} col {c}: {got} vs {want}"
                    );
                }
            }
            // A view reaching outside the storage is refused, not read.
            let short = &k[..k.len() - 1];
            let wide = Layout::contiguous((1, kv_heads, cap, hd));
            let rows = |d| KvRows::F32(d, &wide);
            assert!(decode_attention(&q, rows(short), rows(&v), heads).is_err());
        }
    }

    /// Over `Q8_0` rows: the attention of the query as quantized per block
    /// over the values the rows hold, for head_dim 32 and 128, a cache
    /// holding fewer positions than its capacity.
    #[test]
    fn decode_attention_over_q8_rows_matches_its_reference() {
        use crate::kernels::test_data::plain_dequantize;
        for hd in [32, 128] {
            let (heads, kv_heads, cap, t) = (6, 2, 24, 19);
            let (k, v, q) = (
                data(kv_heads * cap * hd, 7),
                data(kv_heads * cap * hd, 8),
                data(heads * hd, 9),
            );
            let quantized = |x: &[f32]| {
                let mut b = vec![0u8; kv_heads * cap * QFormat::Q8_0.row_bytes(hd)];
                crate::kernels::store_q8(x, (kv_heads, cap, hd), (&mut b, cap), 0);
                let held = plain_dequantize(QFormat::Q8_0, &b);
                (b, held)
            };
            let ((kq, kd), (vq, vd)) = (quantized(&k), quantized(&v));
            let q8 = |data| KvRows::Q8 {
                data,
                kv_heads,
                capacity: cap,
                len: t,
                head_dim: hd,
            };
            let out = decode_attention(&q, q8(&kq), q8(&vq), heads).unwrap();
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let qa = Q8Act::quantize(&q[h * hd..(h + 1) * hd]);
                let qh: Vec<f32> = (0..hd).map(|i| qa.d[i / 32] * qa.q[i] as f32).collect();
                let row = |m: &[f32], j: usize| m[(kvh * cap + j) * hd..][..hd].to_vec();
                let scores: Vec<f64> = (0..t)
                    .map(|j| {
                        row(&kd, j)
                            .iter()
                            .zip(&qh)
                            .map(|(a, b)| (a * b) as f64)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for c in 0..hd {
                    let want: f64 = (0..t).map(|j| e[j] / sum * row(&vd, j)[c] as f64).sum();
                    let got = out[h * hd + c] as f64;
                    assert!(
                        (got - want).abs() < 1e-4,
                        "hd {hd} head {h} col {c}: {got} vs {want}"
                    );
                }
            }
            // Rows past the storage are refused.
            assert!(decode_attention(&q, q8(&kq[..kq.len() - 1]), q8(&vq), heads).is_err());
        }
    }
}
