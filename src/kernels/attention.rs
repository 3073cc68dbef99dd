//! Decode attention: one query token over the KV cache, heads split over
//! the decode threads.

use super::portable;
use super::spin_pool::{DisjointSlice, SpinPool};
#[cfg(target_arch = "x86_64")]
use super::x86;
use super::StridedRows;
use candle_core::{Layout, Result};

/// Attention of one query token over the cached keys/values: `q` of
/// `heads × head_dim`; `k`, `v` the storage of `[1, kv_heads, T, head_dim]`
/// tensors laid out by `kl`, `vl` (any strides with a contiguous last dim).
/// Returns `heads × head_dim` values. Grouped-query: query head `h` uses kv
/// head `h / (heads / kv_heads)`. Heads are split over the decode threads.
pub fn decode_attention(
    q: &[f32],
    (k, kl): (&[f32], &Layout),
    (v, vl): (&[f32], &Layout),
    heads: usize,
) -> Result<Vec<f32>> {
    let (_, kv_heads, t, hd) = kl.shape().dims4()?;
    if vl.shape() != kl.shape()
        || q.len() != heads * hd
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
    {
        candle_core::bail!(
            "decode attention: inconsistent shapes q {} ({heads} heads) k {:?} v {:?}",
            q.len(),
            kl.shape(),
            vl.shape()
        );
    }
    if kl.stride()[3] != 1 || vl.stride()[3] != 1 {
        candle_core::bail!("decode attention: k/v rows must be contiguous");
    }
    // Every row the heads read must lie inside the storage.
    let last = |l: &Layout| {
        l.start_offset() + (kv_heads - 1) * l.stride()[1] + (t - 1) * l.stride()[2] + hd
    };
    if t == 0 || last(kl) > k.len() || last(vl) > v.len() {
        candle_core::bail!(
            "decode attention: no cached position, or k/v views outside their storage"
        );
    }
    let group = heads / kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; heads * hd];
    let heads_out = DisjointSlice::new(&mut out);
    SpinPool::global().for_each_block(heads, 1, |_, block| {
        let mut scores = vec![0f32; t];
        for h in block {
            let kvh = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            let kr = (k, kl.start_offset() + kvh * kl.stride()[1], kl.stride()[2]);
            let vr = (v, vl.start_offset() + kvh * vl.stride()[1], vl.stride()[2]);
            // SAFETY: each head is in exactly one block.
            let o = unsafe { heads_out.range(h * hd..(h + 1) * hd) };
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
            let out = decode_attention(&q, (&k, &layout), (&v, &layout), heads).unwrap();
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
            assert!(decode_attention(&q, (short, &wide), (&v, &wide), heads).is_err());
        }
    }
}
