//! The whole SwiGLU MLP of one decode row in one parallel pass over
//! neuron-major weights.

use super::matvec::{WeightElem, MIN_ROWS_PER_BLOCK};
use super::spin_pool::{DisjointSlice, SpinPool};
use super::Weight;
use candle_core::Result;

/// The whole SwiGLU MLP of one row in one parallel pass for `gate_up [2N, H]`
/// (gate rows, then up rows) and `down_t [N, H]` (neurons as rows) of the
/// same dtype: `y = down(silu(gate·x) * (up·x))`.
pub fn swiglu_mlp_weights(
    x: &[f32],
    gate_up: &Weight,
    down_t: &Weight,
    y: &mut [f32],
) -> Result<()> {
    fn checked<T: WeightElem>(x: &[f32], gate_up: &[T], down_t: &[T], y: &mut [f32]) -> Result<()> {
        let (h, n) = (x.len(), down_t.len());
        if y.len() != h || gate_up.len() != 2 * n || !n.is_multiple_of(h.max(1)) {
            candle_core::bail!(
                "swiglu-mlp: input of {h} for {} gate/up and {n} down weights",
                gate_up.len()
            );
        }
        swiglu_mlp(x, gate_up, down_t, y);
        Ok(())
    }
    match (gate_up, down_t) {
        (Weight::F32(g), Weight::F32(d)) => checked(x, g, d, y),
        (Weight::F16(g), Weight::F16(d)) => checked(x, g, d, y),
        _ => candle_core::bail!("swiglu-mlp: gate/up and down have different dtypes"),
    }
}

/// `y = down_t^T · (silu(gate · x) * (up · x))` with `gate_up = [gate; up]`.
/// Each thread takes blocks of neurons and, for each block, reads its gate,
/// up and down rows one after another: no barrier and no activation vector
/// between the projections, and the activation function runs in parallel.
pub fn swiglu_mlp<T: WeightElem>(x: &[f32], gate_up: &[T], down_t: &[T], y: &mut [f32]) {
    let h = x.len();
    let n = down_t.len() / h.max(1);
    debug_assert_eq!(gate_up.len(), 2 * n * h);
    let (gate, up) = gate_up.split_at(n * h);
    let pool = SpinPool::global();
    // One partial output per block, added up in block order: the same
    // result whichever thread ran which block.
    let blocks = pool.partition(n, MIN_ROWS_PER_BLOCK);
    let mut partials = vec![0f32; blocks.len() * h];
    let parts = DisjointSlice::new(&mut partials);
    pool.run_blocks(&blocks, |index, block| {
        let span = block.start * h..block.end * h;
        let mut act: Vec<f32> = gate[span.clone()]
            .chunks_exact(h)
            .map(|g| T::dot(g, x))
            .collect();
        for (a, u) in act.iter_mut().zip(up[span.clone()].chunks_exact(h)) {
            *a = *a / (1.0 + (-*a).exp()) * T::dot(u, x);
        }
        // SAFETY: one partial per block; the blocks of one call are distinct.
        let part = unsafe { parts.range(index * h..(index + 1) * h) };
        T::axpy_rows(&act, &down_t[span], part);
    });
    sum_rows(&partials, y);
}

/// `y = Σ` of the rows of `partials` (rows of `y.len()`).
fn sum_rows(partials: &[f32], y: &mut [f32]) {
    y.fill(0.0);
    for p in partials.chunks(y.len()) {
        for (yi, pi) in y.iter_mut().zip(p) {
            *yi += pi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::{data, reference_matvec};

    #[test]
    fn swiglu_mlp_matches_reference_for_odd_shapes() {
        let silu = |v: f32| v / (1.0 + (-v).exp());
        for &(n, h) in &[(1, 1), (5, 9), (131, 67), (1000, 576)] {
            let (gu, d, x) = (data(2 * n * h, 3), data(n * h, 4), data(h, 5));
            let mut y = vec![0.0; h];
            swiglu_mlp(&x, &gu, &d, &mut y);
            let g = reference_matvec(&gu[..n * h], &x);
            let u = reference_matvec(&gu[n * h..], &x);
            let act: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
            for c in 0..h {
                let want: f32 = (0..n).map(|i| act[i] * d[i * h + c]).sum();
                assert!(
                    (y[c] - want).abs() < 1e-2 * (1.0 + want.abs()),
                    "{n}x{h} col {c}: {} vs {want}",
                    y[c]
                );
            }
        }
    }
}
