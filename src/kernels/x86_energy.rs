//! AVX-512 back end of [`super::energy`]: the same per-lane operations as
//! its portable forms (a multiply, a multiply, an add; no fused
//! multiply-add), sixteen columns at a time, so the bits match.

use std::arch::x86_64::*;

/// Sixteen f32 in a register: the portable form's lanes.
pub(super) const LANES: usize = 16;

/// Where each [`LANES`]-wide chunk of canonical columns lies in a row
/// stored in another order: `start[i]` when the chunk's columns are stored
/// side by side from there (one load), [`Chunks::SCATTERED`] when not (a
/// gather).
pub(super) struct Chunks {
    start: Vec<u32>,
}

impl Chunks {
    const SCATTERED: u32 = u32::MAX;

    pub(super) fn new(stored: &[u32], n: usize) -> Self {
        let start = stored[..n - n % LANES]
            .chunks_exact(LANES)
            .map(|c| {
                let side_by_side = c.iter().zip(c[0]..).all(|(&s, want)| s == want);
                if side_by_side {
                    c[0]
                } else {
                    Self::SCATTERED
                }
            })
            .collect();
        Self { start }
    }
}

/// The lanes of [`super::energy::inv_norm`] before their f64 sum:
/// canonical columns sixteen at a time, loaded in place (no order, or a
/// chunk `chunks` finds stored side by side) or gathered through `stored`.
///
/// # Safety
/// AVX-512F must be present; `row` and `w2` as long as `stored`'s `n`
/// columns, each of them below `row.len()`; `chunks` made from `stored`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weighted_lanes(
    row: &[f32],
    w2: &[f32],
    stored: Option<&[u32]>,
    chunks: Option<&Chunks>,
) -> [f32; LANES] {
    let n = w2.len();
    debug_assert!(row.len() >= n);
    let whole = n - n % LANES;
    let mut part = _mm512_setzero_ps();
    for c in (0..whole).step_by(LANES) {
        let x = match (stored, chunks.map(|ch| ch.start[c / LANES])) {
            (Some(s), Some(Chunks::SCATTERED)) => {
                let idx = _mm512_loadu_si512(s.as_ptr().add(c).cast());
                _mm512_i32gather_ps::<4>(idx, row.as_ptr().cast())
            }
            (Some(_), Some(from)) => _mm512_loadu_ps(row.as_ptr().add(from as usize)),
            _ => _mm512_loadu_ps(row.as_ptr().add(c)),
        };
        let w = _mm512_loadu_ps(w2.as_ptr().add(c));
        part = _mm512_add_ps(part, _mm512_mul_ps(_mm512_mul_ps(w, x), x));
    }
    let mut lanes = [0f32; LANES];
    _mm512_storeu_ps(lanes.as_mut_ptr(), part);
    for c in whole..n {
        let x = row[stored.map_or(c, |s| s[c] as usize)];
        lanes[c % LANES] += w2[c] * x * x;
    }
    lanes
}

/// [`super::energy::add_scaled_squares`] sixteen columns at a time.
///
/// # Safety
/// AVX-512F must be present; `x` at least as long as `acc`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn add_scaled_squares(acc: &mut [f32], x: &[f32], k: f32) {
    let n = acc.len();
    debug_assert!(x.len() >= n);
    let whole = n - n % LANES;
    let kv = _mm512_set1_ps(k);
    for c in (0..whole).step_by(LANES) {
        let v = _mm512_loadu_ps(x.as_ptr().add(c));
        let o = acc.as_mut_ptr().add(c);
        _mm512_storeu_ps(
            o,
            _mm512_add_ps(_mm512_loadu_ps(o), _mm512_mul_ps(_mm512_mul_ps(v, v), kv)),
        );
    }
    for c in whole..n {
        acc[c] += x[c] * x[c] * k;
    }
}
