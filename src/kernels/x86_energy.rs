//! AVX-512 back end of [`super::energy`]: the same per-lane operations as
//! its portable forms (a multiply, a multiply, an add; no fused
//! multiply-add), sixteen columns at a time, so the bits match.

use super::gather::Runs;
use std::arch::x86_64::*;

/// Sixteen f32 in a register: the portable form's lanes.
pub(super) const LANES: usize = 16;

/// The lanes of [`super::energy`]'s per-row norm before their f64 sum:
/// canonical columns sixteen at a time, loaded in place (no order, or a
/// chunk `runs` keeps in one run) or gathered through `stored`.
///
/// # Safety
/// AVX-512F must be present; `row` and `w2` as long as `stored`'s `n`
/// columns, each of them below `row.len()`; `runs` made from `stored`
/// with [`LANES`]-wide chunks.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weighted_lanes(
    row: &[f32],
    w2: &[f32],
    stored: Option<&[u32]>,
    runs: Option<&Runs>,
) -> [f32; LANES] {
    let n = w2.len();
    debug_assert!(row.len() >= n);
    let whole = n - n % LANES;
    let mut part = _mm512_setzero_ps();
    for c in (0..whole).step_by(LANES) {
        let x = match (stored, runs) {
            (Some(s), Some(r)) => match r.one_run(c / LANES) {
                Some(from) => _mm512_loadu_ps(row.as_ptr().add(from)),
                None => {
                    let idx = _mm512_loadu_si512(s.as_ptr().add(c).cast());
                    _mm512_i32gather_ps::<4>(idx, row.as_ptr().cast())
                }
            },
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
