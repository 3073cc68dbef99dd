//! Matrix-vector products for decode (`out = W · x`, row by row) and the
//! per-dtype dot / row-axpy primitives every kernel uses, dispatched to the
//! x86 back end where the CPU has AVX2/FMA/F16C and to the portable one
//! elsewhere.

use super::portable;
use super::spin_pool::{DisjointSlice, SpinPool};
#[cfg(target_arch = "x86_64")]
use super::x86;
use half::f16;

/// Smallest block of rows a thread takes at once: 64 rows are 72–230 KiB of
/// weights at our widths, so handing out blocks costs nothing next to
/// reading them (16 was ~10% slower in SmolLM2 f16 decode).
pub(crate) const MIN_ROWS_PER_BLOCK: usize = 64;

/// Element types our weight matrices may have on CPU.
pub trait WeightElem: Copy + Send + Sync + 'static {
    fn dot(w: &[Self], x: &[f32]) -> f32;
    /// `y += a[0]*w[0] + ... + a[r-1]*w[r-1]` over `r` rows of length `y.len()`.
    fn axpy_rows(a: &[f32], w: &[Self], y: &mut [f32]);
    /// [`WeightElem::dot`] of a row read alone: no prefetch past its end
    /// (the gated kernel skips rows; fetching them would waste bandwidth).
    fn dot_alone(w: &[Self], x: &[f32]) -> f32 {
        Self::dot(w, x)
    }
    /// [`WeightElem::axpy_rows`] of rows read alone (see [`WeightElem::dot_alone`]).
    fn axpy_alone(a: &[f32], w: &[Self], y: &mut [f32]) {
        Self::axpy_rows(a, w, y)
    }
    /// Asks the caches for `w`, a row read alone soon (a hint).
    fn prefetch(w: &[Self]) {
        #[cfg(target_arch = "x86_64")]
        x86::prefetch_all(w);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = w;
    }
}

impl WeightElem for f32 {
    #[inline]
    fn dot_alone(w: &[f32], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            return unsafe { x86::dot_f32_ahead::<0>(w, x) };
        }
        portable::dot_f32(w, x)
    }
    #[inline]
    fn axpy_alone(a: &[f32], w: &[f32], y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: as above.
            return unsafe { x86::axpy_rows_f32_alone(a, w, y) };
        }
        Self::axpy_rows(a, w, y)
    }
    #[inline]
    fn dot(w: &[f32], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            return unsafe { x86::dot_f32(w, x) };
        }
        portable::dot_f32(w, x)
    }
    #[inline]
    fn axpy_rows(a: &[f32], w: &[f32], y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: as above.
            return unsafe { x86::axpy_rows_f32(a, w, y) };
        }
        let k = y.len();
        for (r, &ar) in a.iter().enumerate() {
            for (yi, wi) in y.iter_mut().zip(&w[r * k..(r + 1) * k]) {
                *yi += ar * wi;
            }
        }
    }
}

impl WeightElem for f16 {
    #[inline]
    fn dot_alone(w: &[f16], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: the CPU supports AVX2, FMA and F16C (checked above).
            return unsafe { x86::dot_f16_ahead::<0>(w, x) };
        }
        portable::dot_f16(w, x)
    }
    #[inline]
    fn axpy_alone(a: &[f32], w: &[f16], y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: as above.
            return unsafe { x86::axpy_rows_f16_alone(a, w, y) };
        }
        Self::axpy_rows(a, w, y)
    }
    #[inline]
    fn dot(w: &[f16], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: the CPU supports AVX2, FMA and F16C (checked above).
            return unsafe { x86::dot_f16(w, x) };
        }
        portable::dot_f16(w, x)
    }
    #[inline]
    fn axpy_rows(a: &[f32], w: &[f16], y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: as above.
            return unsafe { x86::axpy_rows_f16(a, w, y) };
        }
        portable::axpy_rows_f16(a, w, y)
    }
}

/// `out[r] = w[r, :] · x` for a row-major `w` of `out.len()` rows.
pub fn matvec<T: WeightElem>(w: &[T], x: &[f32], out: &mut [f32]) {
    let k = x.len();
    debug_assert_eq!(w.len(), out.len() * k);
    let rows = out.len();
    let out = DisjointSlice::new(out);
    SpinPool::global().for_each_block(rows, MIN_ROWS_PER_BLOCK, |_, block| {
        let w = &w[block.start * k..block.end * k];
        // SAFETY: the blocks of one call are disjoint.
        let o = unsafe { out.range(block) };
        for (oi, row) in o.iter_mut().zip(w.chunks_exact(k)) {
            *oi = T::dot(row, x);
        }
    });
}

/// `out[j] = w[ids[j], :] · x`: rows picked by index (the lm_head rows of
/// an output vocabulary past its prefix), split over the decode threads.
pub fn matvec_ids<T: WeightElem>(w: &[T], ids: &[u32], x: &[f32], out: &mut [f32]) {
    let k = x.len();
    debug_assert_eq!(ids.len(), out.len());
    let out = DisjointSlice::new(out);
    SpinPool::global().for_each_block(ids.len(), MIN_ROWS_PER_BLOCK, |_, block| {
        // SAFETY: the blocks of one call are disjoint.
        let o = unsafe { out.range(block.clone()) };
        for (oi, &id) in o.iter_mut().zip(&ids[block]) {
            let r = id as usize * k;
            *oi = T::dot(&w[r..r + k], x);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::{data, reference_matvec};

    #[test]
    fn matvec_matches_reference_for_odd_shapes() {
        for &(n, k) in &[(1, 1), (7, 13), (130, 67), (300, 576)] {
            let (w, x) = (data(n * k, 1), data(k, 2));
            let mut out = vec![0.0; n];
            matvec(&w, &x, &mut out);
            let want = reference_matvec(&w, &x);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 1e-3, "{n}x{k}: {a} vs {b}");
            }
            let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            matvec(&wh, &x, &mut out);
            let wr: Vec<f32> = wh.iter().map(|v| v.to_f32()).collect();
            for (a, b) in out.iter().zip(reference_matvec(&wr, &x)) {
                assert!((a - b).abs() < 1e-3, "f16 {n}x{k}: {a} vs {b}");
            }
        }
    }
}
