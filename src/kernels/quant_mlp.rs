//! The SwiGLU MLP over quantized *neuron bundles* (a neuron's gate row, up
//! row and down row stored together, [`BundleLayout`]): decode's one
//! parallel pass over every bundle ([`swiglu_bundles`]) and prefill's
//! activations for many tokens ([`swiglu_activations_q`]), on the row
//! kernels of [`super::quant`] and [`super::planar`], and the quads'
//! ([`super::quads`]) where the down rows are stored so.

use super::exp::exp;
use super::gemm_q;
use super::planar::RowForm;
use super::quads::{self, QUAD};
use super::quant::{self, axpy, dot, dot2, dot4, Q8Act, QFormat, QK};
use super::spin_pool::{DisjointSlice, SpinPool};
use anyhow::{bail, Result};

/// Smallest block of neurons a decode thread takes at once.
const MIN_ROWS: usize = super::matvec::MIN_ROWS_PER_BLOCK;

/// How a layer's neuron bundles are laid out: each neuron's gate row, up
/// row and down row (its column of `down_proj`), `hidden` weights each, one
/// after another; the neurons' bundles one after another.
/// The gate and up rows are whole blocks as in the file ([`RowForm::Blocks`])
/// or, in memory where the kernels for it run, [`RowForm::Planar`]; in
/// memory, bundles with `Q8_0` down rows may be stored four at a time in
/// quads ([`DownForm::Quads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleLayout {
    pub hidden: usize,
    pub gate: QFormat,
    pub up: QFormat,
    pub down: QFormat,
    pub rows: RowForm,
    pub down_form: DownForm,
}

/// How a buffer of bundles stores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DownForm {
    /// Bundle after bundle, each whole (as in the file).
    #[default]
    Rows,
    /// Every whole quad of four bundles `4q..4q + 4` of the buffer as
    /// [`quads`] stores them (gate/up pairs, then the down rows' tile);
    /// bundles after the last whole quad stay whole.
    Quads,
}

impl BundleLayout {
    pub(crate) fn check(&self) -> Result<()> {
        if self.hidden == 0 || !self.hidden.is_multiple_of(QK) {
            bail!(
                "neuron bundles need a hidden size that is a multiple of {QK}, not {}",
                self.hidden
            );
        }
        if self.down_form == DownForm::Quads && self.down != QFormat::Q8_0 {
            bail!("bundles in quads have Q8_0 down rows, not {}", self.down);
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
    pub(crate) fn up_bytes(&self) -> usize {
        self.up.row_bytes(self.hidden)
    }
    pub fn down_bytes(&self) -> usize {
        self.down.row_bytes(self.hidden)
    }
    /// Bytes of one neuron's bundle.
    pub fn bundle_bytes(&self) -> usize {
        self.gate_bytes() + self.up_bytes() + self.down_bytes()
    }
    /// Bytes of a bundle's gate and up rows.
    pub(crate) fn gate_up_bytes(&self) -> usize {
        self.gate_bytes() + self.up_bytes()
    }
    /// How many of the bundles of `buf` (a whole buffer of this layout)
    /// are stored in quads: every whole quad's, or none.
    pub(crate) fn in_quads(&self, buf: &[u8]) -> usize {
        match self.down_form {
            DownForm::Quads => buf.len() / self.bundle_bytes() / QUAD * QUAD,
            DownForm::Rows => 0,
        }
    }
    /// Bundle `i`'s gate and up rows in `buf`, whose first `in_quads`
    /// bundles are in quads ([`BundleLayout::in_quads`]).
    #[inline]
    pub(crate) fn gate_up_of<'a>(
        &self,
        buf: &'a [u8],
        i: usize,
        in_quads: usize,
    ) -> (&'a [u8], &'a [u8]) {
        let (bb, gu) = (self.bundle_bytes(), self.gate_up_bytes());
        let at = if i < in_quads {
            i / QUAD * QUAD * bb + i % QUAD * gu
        } else {
            i * bb
        };
        buf[at..at + gu].split_at(self.gate_bytes())
    }
    /// `(gate · x, up · x)` for a bundle's gate and up rows.
    #[inline]
    pub(crate) fn gate_up(&self, g: &[u8], u: &[u8], x: &Q8Act) -> (f32, f32) {
        match (self.rows, self.gate == self.up) {
            (RowForm::Blocks, true) => dot2(self.gate, g, u, x),
            (RowForm::Blocks, false) => (dot(self.gate, g, x), dot(self.up, u, x)),
            (RowForm::Planar, true) => quant::dot2_planar(self.gate, g, u, x),
            (RowForm::Planar, false) => (
                quant::dot_planar(self.gate, g, x),
                quant::dot_planar(self.up, u, x),
            ),
        }
    }
    /// A bundle's (gate, up, down) rows.
    #[inline]
    pub(crate) fn split<'a>(&self, b: &'a [u8]) -> (&'a [u8], &'a [u8], &'a [u8]) {
        let (g, rest) = b.split_at(self.gate_bytes());
        let (u, d) = rest.split_at(self.up_bytes());
        (g, u, d)
    }
}

/// `silu(g) · u`, with [`exp`](super::exp::exp): the same bits for a neuron wherever it is
/// computed (one at a time, or four lanes at once in [`swiglu4`]).
#[inline(always)]
pub(crate) fn swiglu(g: f32, u: f32) -> f32 {
    g / (1.0 + exp(-g)) * u
}

/// [`swiglu`] of four lanes (decode: a quad's four neurons; prefill: one
/// neuron's four tokens), in a form the compiler vectorises.
#[inline(always)]
pub(crate) fn swiglu4(g: [f32; 4], u: [f32; 4]) -> [f32; 4] {
    std::array::from_fn(|j| swiglu(g[j], u[j]))
}

/// Every whole quad of bundles in `buf` (a whole buffer of `layout`, its
/// down rows `Q8_0`) moved into `form` from the other form, in place;
/// bundles after the last whole quad stay whole. Bytes move, nothing is
/// requantized.
pub fn reform(layout: &BundleLayout, buf: &mut [u8], form: DownForm) {
    debug_assert_eq!(layout.down, QFormat::Q8_0);
    let (qb, gu) = (QUAD * layout.bundle_bytes(), layout.gate_up_bytes());
    let mut scratch = vec![0u8; qb];
    for quad in buf.chunks_exact_mut(qb) {
        scratch.copy_from_slice(quad);
        match form {
            DownForm::Quads => quads::to_quad(gu, &scratch, quad),
            DownForm::Rows => quads::to_bundles(gu, &scratch, quad),
        }
    }
}

/// The whole SwiGLU MLP of one row over the first `count` bundles of
/// `buf` (a whole buffer: a quad is read whole), in one parallel pass (as
/// [`super::swiglu_mlp`] over f16 rows): each thread takes blocks of
/// neurons and streams their bundles in memory order, dotting gate and up
/// rows with the quantized `x` and adding `act · down row` into its
/// block's partial output (a quad's four rows at once); the partials are
/// added in block order.
pub fn swiglu_bundles(x: &[f32], layout: &BundleLayout, buf: &[u8], count: usize, y: &mut [f32]) {
    let h = layout.hidden;
    debug_assert_eq!(x.len(), h);
    let (bb, gu) = (layout.bundle_bytes(), layout.gate_up_bytes());
    debug_assert!(count <= buf.len() / bb);
    // Units of work: the quads holding the first `count` neurons, then the
    // whole bundles after them.
    let n_quads = count.div_ceil(QUAD).min(layout.in_quads(buf) / QUAD);
    let rows_from = (QUAD * n_quads).min(count);
    let units = n_quads + (count - rows_from);
    let xq = Q8Act::quantize(x);
    let pool = SpinPool::global();
    let min_units = if n_quads > 0 {
        MIN_ROWS / QUAD
    } else {
        MIN_ROWS
    };
    let blocks = pool.partition(units, min_units);
    let mut partials = vec![0f32; blocks.len() * h];
    let parts = DisjointSlice::new(&mut partials);
    pool.run_blocks(&blocks, |index, block| {
        // SAFETY: one partial per block; the blocks of one call are distinct.
        let part = unsafe { parts.range(index * h..(index + 1) * h) };
        let act = |g: &[u8], u: &[u8]| {
            let (g, u) = layout.gate_up(g, u, &xq);
            swiglu(g, u)
        };
        // One pass in memory order: a neuron's gate and up rows, then its
        // down row; a quad's four gate/up pairs, then its tile.
        for unit in block {
            if unit < n_quads {
                let (first, qb) = (QUAD * unit, QUAD * bb);
                let quad = &buf[unit * qb..(unit + 1) * qb];
                // The four neurons' dots, then their SiLUs as four lanes.
                let (mut g, mut u) = ([0f32; QUAD], [0f32; QUAD]);
                for j in 0..QUAD.min(count - first) {
                    let (gr, ur) = quad[j * gu..(j + 1) * gu].split_at(layout.gate_bytes());
                    (g[j], u[j]) = layout.gate_up(gr, ur, &xq);
                }
                let a = swiglu4(g, u);
                let next = buf.get((unit + 1) * qb..).unwrap_or(&[]);
                quads::axpy_tile(a, &quad[QUAD * gu..], next, part);
            } else {
                let n = rows_from + (unit - n_quads);
                let (g, u, d) = layout.split(&buf[n * bb..(n + 1) * bb]);
                axpy(layout.down, act(g, u), d, part);
            }
        }
    });
    y.fill(0.0);
    for p in partials.chunks(h) {
        y.iter_mut().zip(p).for_each(|(yi, pi)| *yi += pi);
    }
}

/// `out[t · count + n] = silu(gate_n · x_t) · (up_n · x_t)` for the first
/// `count` bundles of `buf` and the `T` tokens of `x`: the prefill form of
/// the first half of [`swiglu_bundles`] on [`gemm_q`]'s tiled product
/// (sixteen neurons' gate and up rows at a time over eight tokens).
pub(crate) fn swiglu_activations_gemm(
    x: &gemm_q::Acts,
    layout: &BundleLayout,
    buf: &[u8],
    count: usize,
    out: &mut [f32],
) {
    let in_quads = layout.in_quads(buf);
    let gate = |r: usize| (layout.gate, layout.gate_up_of(buf, r, in_quads).0);
    let up = |r: usize| (layout.up, layout.gate_up_of(buf, r, in_quads).1);
    let rows = (&gate as gemm_q::RowOf, &up as gemm_q::RowOf, layout.rows);
    gemm_q::matmul_pair(count, rows, swiglu, x, out);
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

/// `out[n · T + t] = silu(gate_n · xs[t]) · (up_n · xs[t])` for the first
/// `count` bundles `n` of `buf` (a whole buffer; each bundle's `T`
/// results together), split over rayon's threads in tiles: the prefill
/// form of the first half of [`swiglu_bundles`], each row unpacked once
/// per four tokens.
pub(crate) fn swiglu_activations_q(
    xs: &[Q8Act],
    layout: &BundleLayout,
    buf: &[u8],
    count: usize,
    out: &mut [f32],
) {
    use rayon::prelude::*;
    let t = xs.len();
    if t == 0 {
        return;
    }
    debug_assert_eq!(out.len(), count * t);
    let in_quads = layout.in_quads(buf);
    // On rayon, as the rest of prefill (dequantized rows, candle's matmul):
    // a decode-pool job here would leave its helpers spinning for
    // `SPIN_BEFORE_PARK` beside rayon's threads after every layer.
    // A tile of bundles stays in L1/L2 while each group of four tokens
    // (their activations in L1) runs over it.
    out.par_chunks_mut(TILE_ROWS * t)
        .enumerate()
        .for_each(|(tile, o)| {
            for_token_groups(t, |j, four| {
                for (r, orow) in o.chunks_exact_mut(t).enumerate() {
                    let (gr, ur) = layout.gate_up_of(buf, tile * TILE_ROWS + r, in_quads);
                    if four {
                        let x = [&xs[j], &xs[j + 1], &xs[j + 2], &xs[j + 3]];
                        let (g, u) = match layout.rows {
                            RowForm::Blocks => (dot4(layout.gate, gr, x), dot4(layout.up, ur, x)),
                            RowForm::Planar => (
                                quant::dot4_planar(layout.gate, gr, x),
                                quant::dot4_planar(layout.up, ur, x),
                            ),
                        };
                        orow[j..j + 4].copy_from_slice(&swiglu4(g, u));
                    } else {
                        let (g, u) = layout.gate_up(gr, ur, &xs[j]);
                        orow[j] = swiglu(g, u);
                    }
                }
            });
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::planar;
    use crate::kernels::quant::matvec_q;
    use crate::kernels::test_data::{data, plain_dequantize, quantize_rows, ALL};
    use proptest::prelude::*;

    #[test]
    fn swiglu_saturates_and_keeps_nan() {
        assert_eq!(swiglu(200.0, 2.0), 400.0);
        assert!(swiglu(-200.0, 2.0).abs() < 1e-30);
        assert_eq!(swiglu(0.0, 5.0), 0.0);
        assert!(swiglu(f32::NAN, 1.0).is_nan());
    }

    proptest! {
        /// Four lanes at once give each neuron's bits one at a time (the
        /// vectorised code against the scalar call; it guards the
        /// quad-or-bundle independence against an edit that fuses the
        /// multiply-adds or writes the lanes with intrinsics), and both stay
        /// within a few ulp of the f64 form.
        #[test]
        fn swiglu4_is_swiglu_per_lane(g in prop::array::uniform4(-60f32..60.0),
                                      u in prop::array::uniform4(-8f32..8.0)) {
            let four = swiglu4(g, u);
            for j in 0..4 {
                prop_assert_eq!(four[j].to_bits(), swiglu(g[j], u[j]).to_bits());
                let libm = g[j] as f64 / (1.0 + (-g[j] as f64).exp()) * u[j] as f64;
                prop_assert!((four[j] as f64 - libm).abs() <= 1e-6 * libm.abs().max(1e-30));
            }
        }
    }

    #[test]
    fn matvec_and_bundled_mlp_match_plain_loops() {
        let silu = |v: f32| v / (1.0 + (-v).exp());
        for (n, h) in [(1, 32), (5, 96), (131, 64), (300, 576)] {
            let x = data(h, 2);
            let xq = Q8Act::quantize(&x);
            let xd: Vec<f32> = (0..h).map(|i| xq.q[i] as f32 * xq.d[i / QK]).collect();
            let plain_dot = |r: &[f32]| r.iter().zip(&xd).map(|(a, b)| a * b).sum::<f32>();
            for f in ALL {
                let (g, u, d) = (data(n * h, 3), data(n * h, 4), data(n * h, 6));
                let (gq, uq) = (quantize_rows(&g, h, f), quantize_rows(&u, h, f));
                let dq = quantize_rows(&d, h, QFormat::Q8_0);
                let mut out = vec![0f32; n];
                matvec_q(f, RowForm::Blocks, &gq, &xq, &mut out);
                let gd = plain_dequantize(f, &gq);
                for (r, o) in out.iter().enumerate() {
                    let want = plain_dot(&gd[r * h..(r + 1) * h]);
                    assert!((o - want).abs() < 1e-3 * (1.0 + want.abs()), "{f} matvec");
                }
                let forms = [
                    (RowForm::Blocks, DownForm::Rows),
                    (RowForm::Planar, DownForm::Rows),
                    (RowForm::Planar, DownForm::Quads),
                ];
                for (rows, down_form) in forms {
                    let layout = BundleLayout {
                        hidden: h,
                        gate: f,
                        up: f,
                        down: QFormat::Q8_0,
                        rows,
                        down_form,
                    };
                    let (gr, ur, dr) = (f.row_bytes(h), f.row_bytes(h), QFormat::Q8_0.row_bytes(h));
                    let mut bundles = Vec::new();
                    for i in 0..n {
                        let mut gate_up =
                            [&gq[i * gr..(i + 1) * gr], &uq[i * ur..(i + 1) * ur]].concat();
                        if rows == RowForm::Planar {
                            planar::make_planar(f, h, &mut gate_up);
                        }
                        bundles.extend_from_slice(&gate_up);
                        bundles.extend_from_slice(&dq[i * dr..(i + 1) * dr]);
                    }
                    // Plain bundles kept for the reference dots below.
                    let whole = bundles.clone();
                    if down_form == DownForm::Quads {
                        reform(&layout, &mut bundles, DownForm::Quads);
                    }
                    // The prefill form over 1, 4 and 7 tokens (groups of four
                    // and the tokens left), against decode's dots.
                    for t in [1, 4, 7] {
                        let xs: Vec<Q8Act> = (0..t)
                            .map(|j| Q8Act::quantize(&data(h, 20 + j as u32)))
                            .collect();
                        let mut acts = vec![0f32; n * t];
                        swiglu_activations_q(&xs, &layout, &bundles, n, &mut acts);
                        for (i, b) in whole.chunks_exact(layout.bundle_bytes()).enumerate() {
                            let (gr, ur, _) = layout.split(b);
                            for (j, x) in xs.iter().enumerate() {
                                let (g, u) = layout.gate_up(gr, ur, x);
                                let want = swiglu(g, u);
                                let got = acts[i * t + j];
                                assert_eq!(got, want, "{f} prefill activation {i}, token {j}/{t}");
                            }
                        }
                    }
                    let (ud, dd) = (
                        plain_dequantize(f, &uq),
                        plain_dequantize(QFormat::Q8_0, &dq),
                    );
                    let act: Vec<f32> = (0..n)
                        .map(|i| {
                            silu(plain_dot(&gd[i * h..(i + 1) * h]))
                                * plain_dot(&ud[i * h..(i + 1) * h])
                        })
                        .collect();
                    // Quads round each block's four coefficients to 8 bits
                    // against their largest: at most 2/127 of the largest
                    // |act · weight| of the block per quad (`quads`).
                    let largest = |q: usize, c: usize, count: usize| {
                        let b = c / QK * QK;
                        (4 * q..(4 * q + 4).min(count))
                            .map(|i| {
                                let top = dd[i * h + b..i * h + b + QK]
                                    .iter()
                                    .fold(0f32, |m, v| m.max(v.abs()));
                                (act[i] * top).abs()
                            })
                            .fold(0f32, f32::max)
                    };
                    // All bundles, and a view ending inside a quad.
                    for count in [n, n - 1] {
                        let mut y = vec![0f32; h];
                        swiglu_bundles(&x, &layout, &bundles, count, &mut y);
                        for c in 0..h {
                            let want: f32 = (0..count).map(|i| act[i] * dd[i * h + c]).sum();
                            let rounding: f32 = match down_form {
                                DownForm::Quads => (0..count.div_ceil(4))
                                    .map(|q| 2.0 * largest(q, c, count) / 127.0)
                                    .sum(),
                                DownForm::Rows => 0.0,
                            };
                            assert!(
                                (y[c] - want).abs() < 1e-3 * (1.0 + want.abs()) + rounding,
                                "{f} {rows:?} {down_form:?} {count} of {n}x{h}, col {c}: {} vs {want}",
                                y[c]
                            );
                        }
                    }
                }
            }
        }
    }
}
