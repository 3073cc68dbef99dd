//! The SwiGLU MLP over quantized *neuron bundles* (a neuron's gate row, up
//! row and down row stored together, [`BundleLayout`]): decode's one
//! parallel pass over every bundle ([`swiglu_bundles`]) and prefill's
//! activations for many tokens ([`swiglu_activations_q`]), on the row
//! kernels of [`super::quant`] and [`super::planar`].

use super::planar::{self, RowForm};
use super::quant::{axpy, dot, dot2, dot4, Q8Act, QFormat, QK};
use super::spin_pool::{DisjointSlice, SpinPool};
use anyhow::{bail, Result};

/// Smallest block of neurons a decode thread takes at once.
const MIN_ROWS: usize = super::matvec::MIN_ROWS_PER_BLOCK;

/// How a layer's neuron bundles are laid out: each neuron's gate row, up
/// row and down row (its column of `down_proj`), `hidden` weights each, one
/// after another; the neurons' bundles one after another.
/// The gate and up rows are whole blocks as in the file ([`RowForm::Blocks`])
/// or, in memory where the kernels for it run, [`RowForm::Planar`]; the
/// down rows are always whole blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleLayout {
    pub hidden: usize,
    pub gate: QFormat,
    pub up: QFormat,
    pub down: QFormat,
    pub rows: RowForm,
}

impl BundleLayout {
    pub fn check(&self) -> Result<()> {
        if self.hidden == 0 || !self.hidden.is_multiple_of(QK) {
            bail!(
                "neuron bundles need a hidden size that is a multiple of {QK}, not {}",
                self.hidden
            );
        }
        // A hidden size read from a file: its bundle size must not overflow.
        let blocks = [self.gate, self.up, self.down].map(QFormat::block_bytes);
        if (self.hidden / QK)
            .checked_mul(blocks.iter().sum())
            .is_none()
        {
            bail!(
                "neuron bundles of hidden size {} are too large",
                self.hidden
            );
        }
        Ok(())
    }
    pub fn gate_bytes(&self) -> usize {
        self.gate.row_bytes(self.hidden)
    }
    pub fn up_bytes(&self) -> usize {
        self.up.row_bytes(self.hidden)
    }
    pub fn down_bytes(&self) -> usize {
        self.down.row_bytes(self.hidden)
    }
    /// Bytes of one neuron's bundle.
    pub fn bundle_bytes(&self) -> usize {
        self.gate_bytes() + self.up_bytes() + self.down_bytes()
    }
    /// `(gate · x, up · x)` for a bundle's gate and up rows.
    #[inline]
    pub fn gate_up(&self, g: &[u8], u: &[u8], x: &Q8Act) -> (f32, f32) {
        match (self.rows, self.gate == self.up) {
            (RowForm::Blocks, true) => dot2(self.gate, g, u, x),
            (RowForm::Blocks, false) => (dot(self.gate, g, x), dot(self.up, u, x)),
            (RowForm::Planar, true) => planar::dot2_planar(self.gate, g, u, x),
            (RowForm::Planar, false) => (
                planar::dot_planar(self.gate, g, x),
                planar::dot_planar(self.up, u, x),
            ),
        }
    }
    /// A bundle's (gate, up, down) rows.
    #[inline]
    pub fn split<'a>(&self, b: &'a [u8]) -> (&'a [u8], &'a [u8], &'a [u8]) {
        let (g, rest) = b.split_at(self.gate_bytes());
        let (u, d) = rest.split_at(self.up_bytes());
        (g, u, d)
    }
}

/// `silu(g) · u`.
#[inline]
pub fn swiglu(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// The whole SwiGLU MLP of one row over neuron bundles, in one parallel
/// pass (as [`super::swiglu_mlp`] over f16 rows): each thread takes blocks
/// of neurons and streams their bundles in memory order, dotting gate and
/// up rows with the quantized `x` and adding `act · down row` into its
/// block's partial output; the partials are added in block order.
pub fn swiglu_bundles(x: &[f32], layout: &BundleLayout, bundles: &[u8], y: &mut [f32]) {
    let h = layout.hidden;
    debug_assert_eq!(x.len(), h);
    let bb = layout.bundle_bytes();
    let n = bundles.len() / bb;
    let xq = Q8Act::quantize(x);
    let pool = SpinPool::global();
    let blocks = pool.partition(n, MIN_ROWS);
    let mut partials = vec![0f32; blocks.len() * h];
    let parts = DisjointSlice::new(&mut partials);
    pool.run_blocks(&blocks, |index, block| {
        // SAFETY: one partial per block; the blocks of one call are distinct.
        let part = unsafe { parts.range(index * h..(index + 1) * h) };
        let mine = &bundles[block.start * bb..block.end * bb];
        // One pass in memory order: a neuron's gate and up rows, then its
        // down row (Qwen 0.5B shape, out of cache: 18–20 GB/s, against
        // 12–17 for four neurons' gate and up rows, then their four down
        // rows with `y` in registers, whose reads jump back and forth).
        let act = |b: &[u8]| {
            let (g, u, _) = layout.split(b);
            let (g, u) = layout.gate_up(g, u, &xq);
            swiglu(g, u)
        };
        for b in mine.chunks_exact(bb) {
            axpy(layout.down, act(b), layout.split(b).2, part);
        }
    });
    y.fill(0.0);
    for p in partials.chunks(h) {
        y.iter_mut().zip(p).for_each(|(yi, pi)| *yi += pi);
    }
}

/// Bundles of a tile in [`swiglu_activations_q`] (~40–70 KB for Qwen
/// 0.5B's 4–5-bit gate and up rows: in L2 while four tokens run over it).
const TILE_ROWS: usize = 32;

/// Calls `f(j, true)` for each group of four tokens `j..j + 4` of `t`,
/// then `f(j, false)` for each token left.
#[inline]
fn for_token_groups(t: usize, mut f: impl FnMut(usize, bool)) {
    let mut j = 0;
    while j + 4 <= t {
        f(j, true);
        j += 4;
    }
    for j in j..t {
        f(j, false);
    }
}

/// `out[n · T + t] = silu(gate_n · xs[t]) · (up_n · xs[t])` for every
/// bundle `n` (each bundle's `T` results together), split over rayon's
/// threads in tiles: the prefill form of the first half of [`swiglu_bundles`], each
/// row unpacked once per four tokens.
pub fn swiglu_activations_q(xs: &[Q8Act], layout: &BundleLayout, bundles: &[u8], out: &mut [f32]) {
    use rayon::prelude::*;
    let t = xs.len();
    if t == 0 {
        return;
    }
    let bb = layout.bundle_bytes();
    debug_assert_eq!(out.len(), bundles.len() / bb * t);
    // On rayon, as the rest of prefill (dequantized rows, candle's matmul):
    // a decode-pool job here would leave its helpers spinning for
    // `SPIN_BEFORE_PARK` beside rayon's threads after every layer.
    // A tile of bundles stays in L1/L2 while each group of four tokens
    // (their activations in L1) runs over it.
    out.par_chunks_mut(TILE_ROWS * t)
        .zip(bundles.par_chunks(TILE_ROWS * bb))
        .for_each(|(o, tile)| {
            for_token_groups(t, |j, four| {
                for (orow, b) in o.chunks_exact_mut(t).zip(tile.chunks_exact(bb)) {
                    let (gr, ur, _) = layout.split(b);
                    if four {
                        let x = [&xs[j], &xs[j + 1], &xs[j + 2], &xs[j + 3]];
                        let (g, u) = match layout.rows {
                            RowForm::Blocks => (dot4(layout.gate, gr, x), dot4(layout.up, ur, x)),
                            RowForm::Planar => (
                                planar::dot4_planar(layout.gate, gr, x),
                                planar::dot4_planar(layout.up, ur, x),
                            ),
                        };
                        for k in 0..4 {
                            orow[j + k] = swiglu(g[k], u[k]);
                        }
                    } else {
                        let (g, u) = layout.gate_up(gr, ur, &xs[j]);
                        orow[j] = swiglu(g, u);
                    }
                }
            });
        });
}
