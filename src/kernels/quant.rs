//! Quantized weight rows for decode: ggml's 32-element blocks (`Q4_0`,
//! `Q4_1`, `Q5_0`, `Q8_0`, bit for bit as GGUF stores them), the
//! activations quantized per block to 8 bits (as llama.cpp's q8
//! activations), and the ops on them: a row's dot with the activations,
//! a row's axpy into an f32 vector (`down_proj`'s neuron rows), a matrix
//! product over rows of blocks, and the whole SwiGLU MLP over *neuron
//! bundles* (a neuron's gate row, up row and down row stored together).
//! The back ends are apart: `x86_vnni` (AVX-512 with VNNI: Zen 4, Ice
//! Lake and later), `x86_quant` (AVX2/FMA/F16C) and `portable_quant`
//! (every other target; NEON on aarch64 by the compiler).
//!
//! Every block holds 32 weights and an f16 scale `d` (`Q4_1` also an f16
//! minimum `m`). A weight is `d·q` for `Q8_0` (`q` an i8), `d·(q-8)` for
//! `Q4_0` (`q` a nibble), `d·q + m` for `Q4_1`, and `d·(q-16)` for `Q5_0`
//! (`q` a nibble plus a fifth bit). Nibble `j` of byte `j` is weight `j`,
//! its high nibble weight `j+16`; `Q5_0`'s fifth bits are one u32, bit
//! `i` for weight `i`.

use super::portable_quant;
use super::spin_pool::{DisjointSlice, SpinPool};
#[cfg(target_arch = "x86_64")]
use super::{x86_quant, x86_vnni};
use anyhow::{bail, Result};

/// Weights per block.
pub const QK: usize = 32;

/// A block format, as ggml names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QFormat {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
}

crate::sys::named::impl_named!(QFormat, "block format", {
    Q4_0 => "q4_0", Q4_1 => "q4_1", Q5_0 => "q5_0", Q8_0 => "q8_0"
});

impl QFormat {
    /// Bytes of one block of 32 weights.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
        }
    }

    /// Bytes of a row of `cols` weights (`cols` a multiple of [`QK`]).
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / QK * self.block_bytes()
    }

    /// ggml's name for the format (candle's `GgmlDType`).
    pub fn ggml(self) -> candle_core::quantized::GgmlDType {
        use candle_core::quantized::GgmlDType;
        match self {
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q5_0 => GgmlDType::Q5_0,
            Self::Q8_0 => GgmlDType::Q8_0,
        }
    }

    /// Bits per weight, scales included.
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / QK as f64
    }
}

/// The activations of one row quantized per block of 32: `q` (i8), the
/// block's scale `d` and `s = d·Σq` (what the formats with an offset need);
/// for the AVX-512 kernels (and only where they run) also `d8` (each `d`
/// 8 times) and `corr` (per block 8 i32: `-Σq`, then 7 zeros), so that a
/// pair of blocks loads its scales and offsets in one register each.
#[derive(Debug, Clone, Default)]
pub struct Q8Act {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub d8: Vec<f32>,
    pub corr: Vec<i32>,
}

impl Q8Act {
    /// Quantizes `x` (a multiple of 32 long) to the nearest of 255 levels
    /// per block (scale `max|x| / 127`).
    pub fn quantize(x: &[f32]) -> Self {
        debug_assert!(x.len().is_multiple_of(QK));
        let blocks = x.len() / QK;
        // `d8` and `corr` only for the kernels that read them.
        let wide = vnni();
        let mut a = Self {
            q: vec![0; x.len()],
            d: Vec::with_capacity(blocks),
            s: Vec::with_capacity(blocks),
            d8: Vec::with_capacity(if wide { blocks * 8 } else { 0 }),
            corr: vec![0; if wide { blocks * 8 } else { 0 }],
        };
        for (b, (xb, qb)) in x.chunks_exact(QK).zip(a.q.chunks_exact_mut(QK)).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = (v * id).round().clamp(-127.0, 127.0) as i8;
                sum += *q as i32;
            }
            a.d.push(d);
            a.s.push(d * sum as f32);
            if wide {
                a.d8.extend([d; 8]);
                a.corr[b * 8] = -sum;
            }
        }
        a
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

/// A block's f16 field at byte `at` as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `row · x` for one row of blocks (`x` quantized, as long as the row).
#[inline]
pub fn dot(format: QFormat, row: &[u8], x: &Q8Act) -> f32 {
    debug_assert_eq!(row.len(), format.row_bytes(x.len()));
    #[cfg(target_arch = "x86_64")]
    if x86_vnni::available() {
        // SAFETY: the CPU has AVX-512 with VNNI (checked); as below.
        return unsafe { x86_vnni::dot(format, row, x) };
    }
    #[cfg(target_arch = "x86_64")]
    if x86_quant::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above); the row
        // holds `x.len() / 32` blocks.
        return unsafe { x86_quant::dot(format, row, x) };
    }
    portable_quant::dot(format, row, x)
}

/// `(r0 · x, r1 · x)` for two rows of one format (a neuron's gate and up).
#[inline]
pub fn dot2(format: QFormat, r0: &[u8], r1: &[u8], x: &Q8Act) -> (f32, f32) {
    debug_assert_eq!(r0.len(), format.row_bytes(x.len()));
    debug_assert_eq!(r1.len(), format.row_bytes(x.len()));
    #[cfg(target_arch = "x86_64")]
    if x86_vnni::available() {
        // SAFETY: the CPU has AVX-512 with VNNI (checked); each row holds
        // `x.len() / 32` blocks.
        return unsafe { x86_vnni::dot2(format, r0, r1, x) };
    }
    (dot(format, r0, x), dot(format, r1, x))
}

/// `y += a · row` (the row dequantized; as long as `y`).
#[inline]
pub fn axpy(format: QFormat, a: f32, row: &[u8], y: &mut [f32]) {
    debug_assert_eq!(row.len(), format.row_bytes(y.len()));
    #[cfg(target_arch = "x86_64")]
    if x86_vnni::available() {
        // SAFETY: the CPU has AVX-512 (checked); the row holds `y.len() / 32` blocks.
        return unsafe { x86_vnni::axpy(format, a, row, y) };
    }
    #[cfg(target_arch = "x86_64")]
    if x86_quant::available() {
        // SAFETY: as above; the row holds `y.len() / 32` blocks.
        return unsafe { x86_quant::axpy(format, a, row, y) };
    }
    portable_quant::axpy(format, a, row, y)
}

/// The row dequantized into `out` (as long as the row has weights).
pub fn dequantize_row(format: QFormat, row: &[u8], out: &mut [f32]) {
    out.fill(0.0);
    axpy(format, 1.0, row, out);
}

/// True when prefill runs the bundles' gate and up rows on 8-bit
/// activations ([`swiglu_activations_q`], as decode does): the CPU has the
/// AVX-512 VNNI kernels, whose 8-bit dot products outrun an f32 matmul
/// over dequantized rows. Elsewhere, and for every other matrix (the
/// attention's: 8-bit activations there raised SmolLM2 q4's KL to f32 by
/// half, the MLP's left it as it was), prefill dequantizes rows and uses
/// candle's matmul.
pub fn int8_prefill() -> bool {
    vnni()
}

/// True when the AVX-512 VNNI back end runs the quantized rows.
fn vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    if x86_vnni::available() {
        return true;
    }
    false
}

/// `[row · x[t]]` for four tokens' activations.
#[inline]
pub fn dot4(format: QFormat, row: &[u8], xs: [&Q8Act; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if x86_vnni::available() {
        // SAFETY: the CPU has AVX-512 with VNNI (checked); the row holds
        // `x.len() / 32` blocks for each `x` (checked by the callers).
        return unsafe { x86_vnni::dot4(format, row, xs) };
    }
    xs.map(|x| dot(format, row, x))
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
                        let (g, u) = (dot4(layout.gate, gr, x), dot4(layout.up, ur, x));
                        for k in 0..4 {
                            orow[j + k] = swiglu(g[k], u[k]);
                        }
                    } else {
                        let x = &xs[j];
                        orow[j] = swiglu(dot(layout.gate, gr, x), dot(layout.up, ur, x));
                    }
                }
            });
        });
}

/// Smallest block of rows a decode thread takes at once (as the f16 kernels).
const MIN_ROWS: usize = super::matvec::MIN_ROWS_PER_BLOCK;

/// `out[r] = row r · x` for `out.len()` rows of blocks in `w`, split over
/// the decode threads.
pub fn matvec_q(format: QFormat, w: &[u8], x: &Q8Act, out: &mut [f32]) {
    let rb = format.row_bytes(x.len());
    debug_assert_eq!(w.len(), out.len() * rb);
    let rows = out.len();
    let out = DisjointSlice::new(out);
    SpinPool::global().for_each_block(rows, MIN_ROWS, |_, block| {
        let w = &w[block.start * rb..block.end * rb];
        // SAFETY: the blocks of one call are disjoint.
        let o = unsafe { out.range(block) };
        for (oi, row) in o.iter_mut().zip(w.chunks_exact(rb)) {
            *oi = dot(format, row, x);
        }
    });
}

/// `out[j] = row ids[j] · x` for rows of blocks picked by index, split over
/// the decode threads.
pub fn matvec_q_ids(format: QFormat, w: &[u8], ids: &[u32], x: &Q8Act, out: &mut [f32]) {
    let rb = format.row_bytes(x.len());
    debug_assert_eq!(ids.len(), out.len());
    let out = DisjointSlice::new(out);
    SpinPool::global().for_each_block(ids.len(), MIN_ROWS, |_, block| {
        // SAFETY: the blocks of one call are disjoint.
        let o = unsafe { out.range(block.clone()) };
        for (oi, &id) in o.iter_mut().zip(&ids[block]) {
            let r = id as usize * rb;
            *oi = dot(format, &w[r..r + rb], x);
        }
    });
}

/// How a layer's neuron bundles are laid out: each neuron's gate row, up
/// row and down row (its column of `down_proj`), `hidden` weights each, one
/// after another; the neurons' bundles one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleLayout {
    pub hidden: usize,
    pub gate: QFormat,
    pub up: QFormat,
    pub down: QFormat,
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
            let (g, u) = if layout.gate == layout.up {
                dot2(layout.gate, g, u, &xq)
            } else {
                (dot(layout.gate, g, &xq), dot(layout.up, u, &xq))
            };
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::test_data::data;
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    pub const ALL: [QFormat; 4] = [QFormat::Q4_0, QFormat::Q4_1, QFormat::Q5_0, QFormat::Q8_0];

    /// Rows of `w` (`[rows, cols]`) quantized by ggml's own code (candle's port).
    pub fn quantize_rows(w: &[f32], cols: usize, f: QFormat) -> Vec<u8> {
        let t = Tensor::from_slice(w, (w.len() / cols, cols), &Device::Cpu).unwrap();
        QTensor::quantize(&t, f.ggml())
            .unwrap()
            .data()
            .unwrap()
            .to_vec()
    }

    /// A plain loop: block `b` of a row, dequantized one weight at a time.
    pub fn plain_dequantize(f: QFormat, row: &[u8]) -> Vec<f32> {
        let mut out = Vec::new();
        for b in row.chunks_exact(f.block_bytes()) {
            let d = f16_at(b, 0);
            for i in 0..QK {
                let nib = |qs: &[u8]| {
                    let byte = qs[i % 16];
                    (if i < 16 { byte & 15 } else { byte >> 4 }) as i32
                };
                out.push(match f {
                    QFormat::Q8_0 => d * (b[2 + i] as i8) as f32,
                    QFormat::Q4_0 => d * (nib(&b[2..]) - 8) as f32,
                    QFormat::Q4_1 => d * nib(&b[4..]) as f32 + f16_at(b, 2),
                    QFormat::Q5_0 => {
                        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                        let hi = ((qh >> i) & 1) as i32;
                        d * ((nib(&b[6..]) | hi << 4) - 16) as f32
                    }
                });
            }
        }
        out
    }

    #[test]
    fn plain_dequantize_matches_ggml() {
        let cols = 96;
        let w = data(4 * cols, 11);
        for f in ALL {
            let q = quantize_rows(&w, cols, f);
            let t = QTensor::quantize(
                &Tensor::from_slice(&w, (4, cols), &Device::Cpu).unwrap(),
                f.ggml(),
            )
            .unwrap();
            let want: Vec<f32> = t
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(plain_dequantize(f, &q), want, "{f}");
        }
    }

    #[test]
    fn dot_and_axpy_match_dequantize_then_f32_loops_at_odd_lengths() {
        for blocks in [1, 2, 3, 17, 18, 28, 29] {
            let k = blocks * QK;
            let (w, x) = (data(k, 3), data(k, 5));
            let xq = Q8Act::quantize(&x);
            // The quantized activations, dequantized: what the dot must equal.
            let xd: Vec<f32> =
                xq.q.iter()
                    .enumerate()
                    .map(|(i, &q)| q as f32 * xq.d[i / QK])
                    .collect();
            for f in ALL {
                let row = quantize_rows(&w, k, f);
                let wd = plain_dequantize(f, &row);
                let want: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
                let got = dot(f, &row, &xq);
                assert!(
                    (got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{f} dot of {k}: {got} vs {want}"
                );
                let got = portable_quant::dot(f, &row, &xq);
                assert!(
                    (got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "portable {f} dot of {k}: {got} vs {want}"
                );
                // Both x86 back ends, whichever `dot` picked.
                #[cfg(target_arch = "x86_64")]
                for (name, ok) in [
                    ("avx2", x86_quant::available()),
                    ("avx512", x86_vnni::available()),
                ] {
                    if !ok {
                        continue;
                    }
                    // SAFETY: the back end's features are present (checked).
                    let got = unsafe {
                        if name == "avx2" {
                            x86_quant::dot(f, &row, &xq)
                        } else {
                            x86_vnni::dot(f, &row, &xq)
                        }
                    };
                    assert!(
                        (got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{name} {f} dot of {k}: {got} vs {want}"
                    );
                }
                let w2 = data(k, 13);
                let row2 = quantize_rows(&w2, k, f);
                let xs: Vec<Q8Act> = (0..4).map(|j| Q8Act::quantize(&data(k, 30 + j))).collect();
                // dot4 and dot2 give dot's results to the bit (a token's
                // result must not depend on the tokens beside it).
                let four = dot4(f, &row, [&xs[0], &xs[1], &xs[2], &xs[3]]);
                let want: Vec<f32> = xs.iter().map(|x| dot(f, &row, x)).collect();
                assert_eq!(four.to_vec(), want, "{f} dot4 of {k}");
                let two = dot2(f, &row, &row2, &xq);
                assert_eq!(
                    two,
                    (dot(f, &row, &xq), dot(f, &row2, &xq)),
                    "{f} dot2 of {k}"
                );
                let mut y = data(k, 9);
                let mut yp = y.clone();
                let want: Vec<f32> = y.iter().zip(&wd).map(|(y, w)| y + 0.37 * w).collect();
                axpy(f, 0.37, &row, &mut y);
                portable_quant::axpy(f, 0.37, &row, &mut yp);
                for (i, ((a, p), b)) in y.iter().zip(&yp).zip(&want).enumerate() {
                    assert!((a - b).abs() < 1e-5, "{f} axpy of {k} at {i}: {a} vs {b}");
                    assert!((p - b).abs() < 1e-5, "portable {f} axpy of {k} at {i}");
                }
                let mut out = vec![0f32; k];
                dequantize_row(f, &row, &mut out);
                assert_eq!(out, wd, "{f} dequantize of {k}");
            }
        }
    }

    #[test]
    fn activations_quantize_within_half_a_step() {
        let x = data(5 * QK, 7);
        let q = Q8Act::quantize(&x);
        for (i, v) in x.iter().enumerate() {
            let d = q.d[i / QK];
            assert!((q.q[i] as f32 * d - v).abs() <= 0.5 * d + 1e-7);
        }
        let zeros = Q8Act::quantize(&[0.0; QK]);
        assert_eq!((zeros.d[0], zeros.s[0]), (0.0, 0.0));
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
                matvec_q(f, &gq, &xq, &mut out);
                let gd = plain_dequantize(f, &gq);
                for (r, o) in out.iter().enumerate() {
                    let want = plain_dot(&gd[r * h..(r + 1) * h]);
                    assert!((o - want).abs() < 1e-3 * (1.0 + want.abs()), "{f} matvec");
                }
                let layout = BundleLayout {
                    hidden: h,
                    gate: f,
                    up: f,
                    down: QFormat::Q8_0,
                };
                let (gr, ur, dr) = (f.row_bytes(h), f.row_bytes(h), QFormat::Q8_0.row_bytes(h));
                let mut bundles = Vec::new();
                for i in 0..n {
                    bundles.extend_from_slice(&gq[i * gr..(i + 1) * gr]);
                    bundles.extend_from_slice(&uq[i * ur..(i + 1) * ur]);
                    bundles.extend_from_slice(&dq[i * dr..(i + 1) * dr]);
                }
                // The prefill form over 1, 4 and 7 tokens (groups of four
                // and the tokens left), against decode's dots.
                for t in [1, 4, 7] {
                    let xs: Vec<Q8Act> = (0..t)
                        .map(|j| Q8Act::quantize(&data(h, 20 + j as u32)))
                        .collect();
                    let mut acts = vec![0f32; n * t];
                    swiglu_activations_q(&xs, &layout, &bundles, &mut acts);
                    for (i, b) in bundles.chunks_exact(layout.bundle_bytes()).enumerate() {
                        let (gr, ur, _) = layout.split(b);
                        for (j, x) in xs.iter().enumerate() {
                            let want = swiglu(dot(f, gr, x), dot(f, ur, x));
                            let got = acts[i * t + j];
                            assert_eq!(got, want, "{f} prefill activation {i}, token {j}/{t}");
                        }
                    }
                }
                let mut y = vec![0f32; h];
                swiglu_bundles(&x, &layout, &bundles, &mut y);
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
                for c in 0..h {
                    let want: f32 = (0..n).map(|i| act[i] * dd[i * h + c]).sum();
                    assert!(
                        (y[c] - want).abs() < 1e-3 * (1.0 + want.abs()),
                        "{f} {n}x{h} col {c}: {} vs {want}",
                        y[c]
                    );
                }
            }
        }
    }
}
