//! Two-bit rows with one scale a row: the compact form of the lm_head's
//! screen ([`crate::model::head_screen`], 2.0 bits a weight against
//! `Q4_0`'s 4.5). Weight `i` of a row is `d·(2q_i − 3)` (levels ±d, ±3d),
//! `q_i` two bits. A row is padded to a multiple of [`CHUNK`] weights (the
//! activations are zero there); byte `i` of a chunk holds weights `i`,
//! `i+32`, `i+64` and `i+96` in its bit pairs 0–1, 2–3, 4–5 and 6–7, so one
//! shift and one mask give 32 consecutive weights. The activations are
//! quantized to i8 with one scale for the row ([`Q8Row`]), so a dot stays
//! in integers to the end: `d·d_x·(2·Σq·x_q − 3·Σx_q)`.
//!
//! The back ends are apart: `x86_q2` (AVX2, and AVX-512 VNNI where the CPU
//! has it) and [`super::portable_quant::dot_q2`] (every other target).

use super::portable_quant;
use super::spin_pool::{DisjointSlice, SpinPool};
#[cfg(target_arch = "x86_64")]
use super::x86_q2;

/// Weights per chunk (32 bytes of codes).
pub(crate) const CHUNK: usize = 128;

/// A row of `cols` weights, padded to whole chunks.
pub(crate) const fn padded(cols: usize) -> usize {
    cols.div_ceil(CHUNK) * CHUNK
}

/// Bytes of codes of a row of `cols` weights.
pub(crate) const fn row_bytes(cols: usize) -> usize {
    padded(cols) / 4
}

/// Quantizes the row `w` into `codes` (`row_bytes(w.len())` bytes) and
/// returns its scale `d`: of the scales `max|w|·f/3` (`f` from 0.2 to 1
/// in steps of 0.05), each refitted by least squares to its codes, the one
/// with the least squared error.
pub(crate) fn quantize_row(w: &[f32], codes: &mut [u8]) -> f32 {
    assert_eq!(codes.len(), row_bytes(w.len()), "q2: codes of a row");
    let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        codes.fill(0);
        return 0.0;
    }
    // The nearest level (ties up): clamped, then truncated (`round` is a
    // libm call on baseline x86-64, which keeps this loop from vectorising).
    let code = |v: f32, id: f32| ((v * id + 3.0) * 0.5 + 0.5).clamp(0.0, 3.5) as u8;
    // With the least-squares scale `d = Σw·l / Σl²` for the levels `l`,
    // the squared error is `Σw² − (Σw·l)² / Σl²`: the largest
    // `(Σw·l)² / Σl²` wins.
    let (mut best, mut best_id, mut best_gain) = (0f32, 0f32, f32::NEG_INFINITY);
    for step in 0..=16 {
        let id = 3.0 / (amax * (0.2 + 0.05 * step as f32));
        let (mut wl, mut ll) = (0f32, 0f32);
        for &v in w {
            let l = (2 * code(v, id) as i32 - 3) as f32;
            wl += v * l;
            ll += l * l;
        }
        if wl * wl / ll > best_gain {
            (best, best_id, best_gain) = (wl / ll, id, wl * wl / ll);
        }
    }
    pack(w, |v| code(v, best_id), codes);
    best
}

/// Writes the codes of `w` (`code(v)` each, 0 past the row's end) in the
/// chunk layout.
fn pack(w: &[f32], code: impl Fn(f32) -> u8, codes: &mut [u8]) {
    for (c, out) in codes.chunks_exact_mut(CHUNK / 4).enumerate() {
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = (0..4).fold(0u8, |b, j| {
                let at = c * CHUNK + j * 32 + i;
                b | w.get(at).map_or(0, |&v| code(v)) << (2 * j)
            });
        }
    }
}

/// One row's activations quantized to i8 with one scale (`max|x| / 127`),
/// zero-padded to whole chunks, and the sum of the quantized values.
#[derive(Debug, Clone)]
pub(crate) struct Q8Row {
    pub q: Vec<i8>,
    pub d: f32,
    pub sum: i32,
}

impl Q8Row {
    pub(crate) fn quantize(x: &[f32]) -> Self {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut q = vec![0i8; padded(x.len())];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        let sum = q.iter().map(|&v| v as i32).sum();
        Self { q, d, sum }
    }
}

/// `Σ q_i·x_i` over one row of codes (the integer part of its dot).
#[inline]
pub(crate) fn dot_codes(codes: &[u8], x: &[i8]) -> i32 {
    debug_assert_eq!(codes.len() * 4, x.len());
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = x86_q2::dot_codes() {
        // SAFETY: `dot_codes` hands out a kernel only where the CPU has
        // its features; the codes cover `x` (checked above in debug).
        return unsafe { f(codes, x) };
    }
    portable_quant::dot_q2(codes, x)
}

/// `row · x` for a row of codes with scale `d`.
#[inline]
pub(crate) fn dot(codes: &[u8], d: f32, x: &Q8Row) -> f32 {
    d * x.d * (2 * dot_codes(codes, &x.q) - 3 * x.sum) as f32
}

/// Smallest block of rows a decode thread takes at once (as the f16 kernels).
const MIN_ROWS: usize = super::matvec::MIN_ROWS_PER_BLOCK;

/// `out[r] = row r · x` for the first `out.len()` rows of `codes`
/// (scales `d`), split over the decode threads.
pub(crate) fn matvec(codes: &[u8], d: &[f32], x: &Q8Row, out: &mut [f32]) {
    let rb = x.q.len() / 4;
    debug_assert!(codes.len() >= out.len() * rb && d.len() >= out.len());
    let rows = out.len();
    let out = DisjointSlice::new(out);
    SpinPool::global().for_each_block(rows, MIN_ROWS, |_, block| {
        let c = &codes[block.start * rb..block.end * rb];
        let d = &d[block.clone()];
        // SAFETY: the blocks of one call are disjoint.
        let o = unsafe { out.range(block) };
        for ((oi, row), &d) in o.iter_mut().zip(c.chunks_exact(rb)).zip(d) {
            *oi = dot(row, d, x);
        }
    });
}

/// `out[j] = row ids[j] · x`, rows picked by index, split over the decode
/// threads.
pub(crate) fn matvec_ids(codes: &[u8], d: &[f32], ids: &[u32], x: &Q8Row, out: &mut [f32]) {
    if ids.is_empty() {
        return;
    }
    let rb = x.q.len() / 4;
    debug_assert_eq!(ids.len(), out.len());
    let out = DisjointSlice::new(out);
    SpinPool::global().for_each_block(ids.len(), MIN_ROWS, |_, block| {
        // SAFETY: the blocks of one call are disjoint.
        let o = unsafe { out.range(block.clone()) };
        for (oi, &id) in o.iter_mut().zip(&ids[block]) {
            let r = id as usize;
            *oi = dot(&codes[r * rb..(r + 1) * rb], d[r], x);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::data;

    /// Weight `i` of a row of codes with scale `d`, read as the layout says.
    fn weight(codes: &[u8], d: f32, i: usize) -> f32 {
        let (c, r) = (i / CHUNK, i % CHUNK);
        let q = (codes[c * CHUNK / 4 + r % 32] >> (2 * (r / 32))) & 3;
        d * (2 * q as i32 - 3) as f32
    }

    /// The row's weights read back one at a time.
    fn plain(codes: &[u8], d: f32, cols: usize) -> Vec<f32> {
        (0..cols).map(|i| weight(codes, d, i)).collect()
    }

    #[test]
    fn quantizing_keeps_every_weight_within_its_level_and_the_error_below_a_uniform_grid() {
        for cols in [32, 96, 128, 576, 896, 1000] {
            let w = data(cols, 7);
            let mut codes = vec![0u8; row_bytes(cols)];
            let d = quantize_row(&w, &mut codes);
            let back = plain(&codes, d, cols);
            let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err: f32 = w.iter().zip(&back).map(|(a, b)| (a - b).powi(2)).sum();
            // The grid ±amax/3, ±amax (f = 1, before its refit) is one of the
            // candidates: its error bounds the chosen one's.
            let g = amax / 3.0;
            let grid: f32 = w
                .iter()
                .map(|&v| {
                    let q = ((v / g + 3.0) * 0.5).round().clamp(0.0, 3.0);
                    (v - g * (2.0 * q - 3.0)).powi(2)
                })
                .sum();
            assert!(err <= grid * 1.0001, "{cols}: {err} vs {grid}");
            assert!(back.iter().all(|b| b.abs() <= 3.0 * d.abs() * 1.0001));
            // Padding codes are zero.
            for i in cols..padded(cols) {
                let (c, r) = (i / CHUNK, i % CHUNK);
                assert_eq!((codes[c * 32 + r % 32] >> (2 * (r / 32))) & 3, 0);
            }
        }
        let mut codes = vec![9u8; row_bytes(64)];
        assert_eq!(quantize_row(&[0.0; 64], &mut codes), 0.0);
        assert!(codes.iter().all(|&c| c == 0));
    }

    #[test]
    fn dot_matches_a_plain_loop_over_the_dequantized_row_at_odd_lengths() {
        for cols in [32, 64, 96, 128, 160, 576, 896, 1000] {
            let (w, x) = (data(cols, 3), data(cols, 5));
            let mut codes = vec![0u8; row_bytes(cols)];
            let d = quantize_row(&w, &mut codes);
            let xq = Q8Row::quantize(&x);
            let xd: Vec<f64> = xq.q[..cols]
                .iter()
                .map(|&q| q as f64 * xq.d as f64)
                .collect();
            let want: f64 = plain(&codes, d, cols)
                .iter()
                .zip(&xd)
                .map(|(a, b)| *a as f64 * b)
                .sum();
            let tol = 1e-5 * (1.0 + want.abs());
            let got = dot(&codes, d, &xq) as f64;
            assert!((got - want).abs() < tol, "{cols}: {got} vs {want}");
            let portable =
                d * xq.d * (2 * portable_quant::dot_q2(&codes, &xq.q) - 3 * xq.sum) as f32;
            assert!((portable as f64 - want).abs() < tol, "portable {cols}");
            #[cfg(target_arch = "x86_64")]
            for (name, f) in x86_q2::every_kernel() {
                // SAFETY: `every_kernel` lists only kernels the CPU runs.
                let got = unsafe { f(&codes, &xq.q) };
                assert_eq!(got, portable_quant::dot_q2(&codes, &xq.q), "{name} {cols}");
            }
        }
    }

    #[test]
    fn matvec_and_matvec_ids_give_each_rows_dot() {
        let (rows, cols) = (300, 576);
        let w = data(rows * cols, 11);
        let rb = row_bytes(cols);
        let mut codes = vec![0u8; rows * rb];
        let d: Vec<f32> = w
            .chunks_exact(cols)
            .zip(codes.chunks_exact_mut(rb))
            .map(|(w, c)| quantize_row(w, c))
            .collect();
        let xq = Q8Row::quantize(&data(cols, 2));
        let mut out = vec![0f32; rows];
        matvec(&codes, &d, &xq, &mut out);
        for r in 0..rows {
            assert_eq!(out[r], dot(&codes[r * rb..(r + 1) * rb], d[r], &xq));
        }
        let ids = [0u32, 7, 64, 299];
        let mut some = vec![0f32; ids.len()];
        matvec_ids(&codes, &d, &ids, &xq, &mut some);
        for (j, &id) in ids.iter().enumerate() {
            assert_eq!(some[j], out[id as usize]);
        }
    }
}
