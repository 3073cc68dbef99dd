//! The whole SwiGLU MLP of one decode row in one parallel pass over
//! neuron-major weights, optionally gated per token: within each group of
//! [`GATE_GROUP`] consecutive neurons only those with the largest
//! |silu(gate)| run their up and down rows ([`gate_keep_mask`]).

use super::matvec::{WeightElem, MIN_ROWS_PER_BLOCK};
use super::spin_pool::{DisjointSlice, SpinPool};
use super::Weight;
use candle_core::Result;

/// The whole SwiGLU MLP of one row in one parallel pass for `gate_up [2N, H]`
/// (gate rows, then up rows) and `down_t [N, H]` (neurons as rows) of the
/// same dtype: `y = down(silu(gate·x) * (up·x))`.
/// With `keep` (per group, how many neurons run up and down), the gated
/// kernel [`swiglu_mlp_gated`].
pub(crate) fn swiglu_mlp_weights(
    x: &[f32],
    gate_up: &Weight,
    down_t: &Weight,
    y: &mut [f32],
    keep: Option<usize>,
) -> Result<()> {
    let checked = |x: &[f32], y: &mut [f32]| -> Result<()> {
        match (gate_up, down_t) {
            (Weight::F32(g), Weight::F32(d)) => run(x, g, d, y, keep),
            (Weight::F16(g), Weight::F16(d)) => run(x, g, d, y, keep),
            _ => candle_core::bail!("swiglu-mlp: gate/up and down have different dtypes"),
        }
    };
    fn run<T: WeightElem>(
        x: &[f32],
        gate_up: &[T],
        down_t: &[T],
        y: &mut [f32],
        keep: Option<usize>,
    ) -> Result<()> {
        let (h, n) = (x.len(), down_t.len());
        if y.len() != h || gate_up.len() != 2 * n || !n.is_multiple_of(h.max(1)) {
            candle_core::bail!(
                "swiglu-mlp: input of {h} for {} gate/up and {n} down weights",
                gate_up.len()
            );
        }
        match keep {
            Some(k) => swiglu_mlp_gated(x, gate_up, down_t, y, k),
            None => swiglu_mlp(x, gate_up, down_t, y),
        }
        Ok(())
    }
    checked(x, y)
}

/// Neurons per gating group ([`swiglu_mlp_gated`]): groups are fixed by
/// neuron index, so the result does not depend on the thread count.
pub const GATE_GROUP: usize = 64;

/// `silu(g)`.
#[inline]
fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// Which neurons of one gating group run: the `keep` with the largest
/// |silu(gate)| (ties: the lower index). The decode kernel and the batched
/// path ([`crate::model::Mlp::activations`]) both decide with this.
pub fn gate_keep_mask(gates: &[f32], keep: usize, mask: &mut Vec<bool>) {
    mask.clear();
    mask.resize(gates.len(), false);
    let k = keep.min(gates.len());
    if k == gates.len() {
        mask.fill(true);
        return;
    }
    // (|silu|, index) once per neuron; the comparisons then cost nothing.
    assert!(gates.len() <= GATE_GROUP, "one gating group at a time");
    let mut scored = [(0f32, 0u32); GATE_GROUP];
    let scored = &mut scored[..gates.len()];
    for (s, (i, &g)) in scored.iter_mut().zip(gates.iter().enumerate()) {
        *s = (silu(g).abs(), i as u32);
    }
    scored.select_nth_unstable_by(k, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored[..k]
        .iter()
        .for_each(|&(_, i)| mask[i as usize] = true);
}

/// [`swiglu_mlp`] gated per token: in each group of [`GATE_GROUP`]
/// neurons (the last may be shorter: `keep` scales with it, at least one
/// kept) every gate row is read, and only the `keep` neurons with the
/// largest |silu(gate)| read their up and down rows (CATS, arXiv
/// 2404.08763, with a per-group top-k in place of a calibrated threshold);
/// the others count as 0.
pub fn swiglu_mlp_gated<T: WeightElem>(
    x: &[f32],
    gate_up: &[T],
    down_t: &[T],
    y: &mut [f32],
    keep: usize,
) {
    let h = x.len();
    let n = down_t.len() / h.max(1);
    debug_assert_eq!(gate_up.len(), 2 * n * h);
    let (gate, up) = gate_up.split_at(n * h);
    let pool = SpinPool::global();
    let blocks = pool.partition(n.div_ceil(GATE_GROUP), 1);
    let mut partials = vec![0f32; blocks.len() * h];
    let parts = DisjointSlice::new(&mut partials);
    pool.run_blocks(&blocks, |index, groups| {
        // SAFETY: one partial per block; the blocks of one call are distinct.
        let part = unsafe { parts.range(index * h..(index + 1) * h) };
        /// Kept neurons whose rows are asked for ahead of their turn.
        const AHEAD: usize = 2;
        let (mut mask, mut kept) = (
            Vec::with_capacity(GATE_GROUP),
            Vec::with_capacity(GATE_GROUP),
        );
        for g in groups {
            let rows = g * GATE_GROUP..((g + 1) * GATE_GROUP).min(n);
            let gates: Vec<f32> = gate[rows.start * h..rows.end * h]
                .chunks_exact(h)
                .map(|w| T::dot(w, x))
                .collect();
            gate_keep_mask(&gates, group_keep(keep, rows.len()), &mut mask);
            kept.clear();
            kept.extend((0..rows.len()).filter(|&j| mask[j]).map(|j| rows.start + j));
            let span = |i: usize| i * h..(i + 1) * h;
            // Kept rows are not consecutive: ask for them a few neurons
            // ahead, as the hardware prefetcher would for a stream.
            for &i in kept.iter().take(AHEAD) {
                T::prefetch(&up[span(i)]);
                T::prefetch(&down_t[span(i)]);
            }
            for (p, &i) in kept.iter().enumerate() {
                if let Some(&next) = kept.get(p + AHEAD) {
                    T::prefetch(&up[span(next)]);
                    T::prefetch(&down_t[span(next)]);
                }
                let a = silu(gates[i - rows.start]) * T::dot_alone(&up[span(i)], x);
                T::axpy_alone(&[a], &down_t[span(i)], part);
            }
        }
    });
    sum_rows(&partials, y);
}

/// Neurons the gated kernel runs up and down for, of `width`, when full
/// groups keep `keep`.
pub fn gated_neurons(width: usize, keep: usize) -> usize {
    (0..width.div_ceil(GATE_GROUP))
        .map(|g| group_keep(keep, (width - g * GATE_GROUP).min(GATE_GROUP)))
        .sum()
}

/// Neurons kept in a group of `len` when full groups keep `keep`.
pub(crate) fn group_keep(keep: usize, len: usize) -> usize {
    match len {
        GATE_GROUP => keep.min(len),
        _ => ((keep * len + GATE_GROUP / 2) / GATE_GROUP).clamp(1, len),
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
    fn the_gated_kernel_matches_a_masked_reference_and_keeping_all_is_ungated() {
        for &(n, h) in &[(1, 3), (63, 9), (64, 5), (200, 67), (1000, 576)] {
            let (gu, d, x) = (data(2 * n * h, 3), data(n * h, 4), data(h, 5));
            let g = reference_matvec(&gu[..n * h], &x);
            let u = reference_matvec(&gu[n * h..], &x);
            for keep in [1, 17, 32, 64] {
                let mut act = vec![0f32; n];
                let mut mask = Vec::new();
                for (c, group) in g.chunks(GATE_GROUP).enumerate() {
                    gate_keep_mask(group, group_keep(keep, group.len()), &mut mask);
                    let kept = mask.iter().filter(|&&m| m).count();
                    assert_eq!(kept, group_keep(keep, group.len()));
                    for (j, &m) in mask.iter().enumerate() {
                        let i = c * GATE_GROUP + j;
                        if m {
                            act[i] = silu(g[i]) * u[i];
                        }
                    }
                }
                let mut y = vec![0.0; h];
                swiglu_mlp_gated(&x, &gu, &d, &mut y, keep);
                for c in 0..h {
                    let want: f32 = (0..n).map(|i| act[i] * d[i * h + c]).sum();
                    assert!(
                        (y[c] - want).abs() < 1e-2 * (1.0 + want.abs()),
                        "{n}x{h} keep {keep} col {c}: {} vs {want}",
                        y[c]
                    );
                }
            }
            let (mut all, mut plain) = (vec![0.0; h], vec![0.0; h]);
            swiglu_mlp_gated(&x, &gu, &d, &mut all, GATE_GROUP);
            swiglu_mlp(&x, &gu, &d, &mut plain);
            for (a, p) in all.iter().zip(&plain) {
                assert!(
                    (a - p).abs() < 1e-3 * (1.0 + p.abs()),
                    "{n}x{h}: {a} vs {p}"
                );
            }
        }
    }

    #[test]
    fn the_gate_keeps_the_largest_silu_and_breaks_ties_by_index() {
        // |silu| of: -8 (≈0.0027), 3 (≈2.86), 0, 3 again, 1 (≈0.73), -1 (≈0.27).
        let mut mask = Vec::new();
        gate_keep_mask(&[-8.0, 3.0, 0.0, 3.0, 1.0, -1.0], 3, &mut mask);
        assert_eq!(mask, [false, true, false, true, true, false]);
        gate_keep_mask(&[3.0, 3.0, 3.0], 1, &mut mask);
        assert_eq!(mask, [true, false, false]);
        assert_eq!(
            (group_keep(32, 64), group_keep(32, 10), group_keep(1, 10)),
            (32, 5, 1)
        );
    }

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
