//! The block formats the quantized kernels share (layer 1's leaf, as
//! ggml's `ggml-common.h`): ggml's 32-weight blocks ([`QFormat`]: `Q4_0`,
//! `Q4_1`, `Q5_0`, `Q8_0`, bit for bit as GGUF stores them, and our
//! 3-bit `Q3_0`, which ggml does not have), the
//! activations quantized per block to 8 bits ([`Q8Act`], as llama.cpp's
//! q8 activations) with the arrays the AVX-512 kernels read, and the
//! quads' width ([`QUAD`]). The ops are in [`super::quant`],
//! [`super::planar`], [`super::quads`]; the back ends import only this.
//!
//! Every block holds 32 weights and an f16 scale `d` (`Q4_1` also an f16
//! minimum `m`). A weight is `d·q` for `Q8_0` (`q` an i8), `d·(q-8)` for
//! `Q4_0` (`q` a nibble), `d·q + m` for `Q4_1`, and `d·(q-16)` for `Q5_0`
//! (`q` a nibble plus a fifth bit). Nibble `j` of byte `j` is weight `j`,
//! its high nibble weight `j+16`; `Q5_0`'s fifth bits are one u32, bit
//! `i` for weight `i`.
//!
//! `Q3_0` (14 bytes, 3.5 bits a weight; the coarse FFN tier's gate and up
//! rows, `crate::model::ffn_tier`) is laid out as `Q5_0` with a bit and
//! two fewer bytes: `d`, a u32 of third bits (bit `i` for weight `i`),
//! then 8 bytes of 2-bit pairs, bits `2k..2k+2` of byte `j` for weight
//! `j + 8k`; a weight is `d·(q-4)`, `q` in 0..8. [`quantize_q3_0`] makes
//! it.

use super::cpu_features;

/// Neurons per quad tile ([`super::quads`]).
pub(crate) const QUAD: usize = 4;

/// Weights per block.
pub(crate) const QK: usize = 32;

/// A block format, as ggml names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QFormat {
    Q3_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
}

crate::sys::named::impl_named!(QFormat, "block format", {
    Q3_0 => "q3_0", Q4_0 => "q4_0", Q4_1 => "q4_1", Q5_0 => "q5_0", Q8_0 => "q8_0"
});

impl QFormat {
    /// Bytes of one block of 32 weights.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q3_0 => 14,
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

    /// ggml's name for the format (candle's `GgmlDType`); `None` for
    /// `Q3_0`, which is ours.
    pub(crate) fn ggml(self) -> Option<candle_core::quantized::GgmlDType> {
        use candle_core::quantized::GgmlDType;
        Some(match self {
            Self::Q3_0 => return None,
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q5_0 => GgmlDType::Q5_0,
            Self::Q8_0 => GgmlDType::Q8_0,
        })
    }

    /// Bits per weight, scales included.
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / QK as f64
    }

    /// Whether a `Q8_0` block holds this format's weights exactly
    /// ([`widen_to_q8_0`]): every format but `Q4_1`, whose `d·q + m` is
    /// not a scale times an integer in general.
    pub(crate) const fn exact_in_q8_0(self) -> bool {
        !matches!(self, Self::Q4_1)
    }

    /// Whether rows of this format are made planar where planar rows are
    /// preferred (`super::planar`): all but `Q3_0`, which has no planar
    /// kernels (`Q8_0`'s planar form is its block form).
    pub(crate) const fn goes_planar(self) -> bool {
        !matches!(self, Self::Q3_0)
    }
}

/// Candidate steps [`quantize_q3_0`] tries per block, from `max/-4`
/// (the largest weight at the lowest level, as ggml's `Q4_0` makes its
/// step) to a step 1.8 times as large (`max/-2.2`): clipping the largest weight often
/// rounds the other 31 closer.
const Q3_STEPS: usize = 17;

/// `w` (a multiple of 32 long) as `Q3_0` blocks into `out` (14 bytes a
/// block): per block the step of [`Q3_STEPS`] candidates with the least
/// squared error, `imp` (as long as `w`, or empty for equal weights)
/// weighting each position's error.
pub(crate) fn quantize_q3_0(w: &[f32], imp: &[f32], out: &mut [u8]) {
    debug_assert!(w.len().is_multiple_of(QK));
    debug_assert_eq!(out.len(), w.len() / QK * QFormat::Q3_0.block_bytes());
    debug_assert!(imp.is_empty() || imp.len() == w.len());
    let level = |v: f32, id: f32| ((v * id + ROUND) - ROUND).clamp(-4.0, 3.0);
    for (b, (wb, ob)) in w.chunks_exact(QK).zip(out.chunks_exact_mut(14)).enumerate() {
        let weight = |i: usize| imp.get(b * QK + i).copied().unwrap_or(1.0);
        // The weight of largest magnitude, its sign kept.
        let max = wb
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let mut best = (f32::INFINITY, 0f32);
        for s in 0..Q3_STEPS {
            let d = half::f16::from_f32(max / (-4.0 + 0.1125 * s as f32)).to_f32();
            if d == 0.0 || !d.is_finite() {
                continue;
            }
            let id = 1.0 / d;
            let err: f32 = (0..QK)
                .map(|i| weight(i) * (wb[i] - d * level(wb[i], id)).powi(2))
                .sum();
            if err < best.0 {
                best = (err, d);
            }
        }
        let d = best.1;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        ob.fill(0);
        ob[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        let mut qh = 0u32;
        for (i, &v) in wb.iter().enumerate() {
            let q = (level(v, id) + 4.0) as u32;
            qh |= (q >> 2) << i;
            ob[6 + i % 8] |= ((q & 3) << (2 * (i / 8))) as u8;
        }
        ob[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// `x` (a multiple of 32 long) as `Q8_0` blocks into `out` (34 bytes a
/// block: the f16 scale `max|x| / 127`, then the nearest of 255 levels,
/// ties to even), as ggml's `quantize_row_q8_0`.
pub(crate) fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    debug_assert!(x.len().is_multiple_of(QK));
    debug_assert_eq!(out.len(), QFormat::Q8_0.row_bytes(x.len()));
    let mut q = [0i8; QK];
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(2 + QK)) {
        let d = quantize_block(xb, &mut q);
        ob[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        ob[2..].iter_mut().zip(q).for_each(|(o, q)| *o = q as u8);
    }
}

/// The activations of one row quantized per block of 32: `q` (i8), the
/// block's scale `d` and `s = d·Σq` (what the formats with an offset need);
/// for the AVX-512 kernels (and only where they run) also `d8` (each `d`
/// 8 times) and `corr` (per block 8 i32: `-Σq`, then 7 zeros), so that a
/// pair of blocks loads its scales and offsets in one register each; and
/// for the kernels over planar rows `qn`, `d16`, `corr16`
/// ([`super::planar`]), per whole group of four blocks.
#[derive(Debug, Clone, Default)]
pub struct Q8Act {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub d8: Vec<f32>,
    pub corr: Vec<i32>,
    pub qn: Vec<i8>,
    pub d16: Vec<f32>,
    pub corr16: Vec<i32>,
}

/// 1.5·2²³: adding and then subtracting it rounds an f32 below 2²² in
/// magnitude to the nearest integer, ties to even (as ggml's AVX2
/// `quantize_row_q8_0` rounds, `_mm256_round_ps` nearest), in a loop that
/// vectorises; `f32::round` is a libm call per value, which made the
/// activations' quantization 1–2 % of a Qwen q4 decode step's samples, all
/// of it on one thread between the parallel kernels.
pub(crate) const ROUND: f32 = 12_582_912.0;

/// Quantizes one block `xb` into `qb` (the nearest of 255 levels, ties to
/// even) and returns its scale `max|x| / 127`.
#[inline]
pub(crate) fn quantize_block(xb: &[f32], qb: &mut [i8]) -> f32 {
    // Eight running maxima (lanes the compiler keeps in one register), not
    // one chain of `f32::max` through the block; a NaN never wins either way.
    let mut lanes = [0f32; 8];
    for c in xb.chunks_exact(8) {
        for (m, v) in lanes.iter_mut().zip(c) {
            let a = v.abs();
            *m = if a > *m { a } else { *m };
        }
    }
    let amax = lanes.iter().fold(0f32, |m, &v| if v > m { v } else { m });
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qb.iter_mut().zip(xb) {
        *q = ((v * id + ROUND) - ROUND).clamp(-127.0, 127.0) as i8;
    }
    d
}

impl Q8Act {
    /// Quantizes `x` (a multiple of 32 long) to the nearest of 255 levels
    /// per block (scale `max|x| / 127`; ties to even).
    pub fn quantize(x: &[f32]) -> Self {
        debug_assert!(x.len().is_multiple_of(QK));
        let blocks = x.len() / QK;
        // `d8` and `corr` only for the kernels that read them.
        let wide = cpu_features::avx512_vnni();
        let mut a = Self {
            q: vec![0; x.len()],
            d: Vec::with_capacity(blocks),
            s: Vec::with_capacity(blocks),
            d8: Vec::with_capacity(if wide { blocks * 8 } else { 0 }),
            corr: vec![0; if wide { blocks * 8 } else { 0 }],
            ..Self::default()
        };
        let mut sums = Vec::with_capacity(if wide { blocks } else { 0 });
        for (b, (xb, qb)) in x.chunks_exact(QK).zip(a.q.chunks_exact_mut(QK)).enumerate() {
            let d = quantize_block(xb, qb);
            let sum: i32 = qb.iter().map(|&q| q as i32).sum();
            a.d.push(d);
            a.s.push(d * sum as f32);
            if wide {
                a.d8.extend([d; 8]);
                a.corr[b * 8] = -sum;
                sums.push(sum);
            }
        }
        if wide {
            (a.qn, a.d16, a.corr16) = planar_acts(&a.q, &a.d, &sums);
        }
        a
    }

    /// True when the planar kernels' arrays are here (where they run).
    #[inline]
    pub(crate) fn has_planar(&self) -> bool {
        !self.d8.is_empty()
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

/// The activations' planar arrays ([`Q8Act`]'s `qn`, `d16`, `corr16`) for
/// `q`, `d` and the blocks' `Σq`: per group of four blocks, their weights
/// 0–15 then 16–31 (as a planar row's low and high nibbles unpack), each
/// block's `d` over its four i32 lanes, and `-Σq` in the first of them; a
/// last group of fewer blocks padded with zeros.
fn planar_acts(q: &[i8], d: &[f32], sums: &[i32]) -> (Vec<i8>, Vec<f32>, Vec<i32>) {
    let groups = d.len().div_ceil(4);
    let mut qn = vec![0; groups * 4 * QK];
    let mut d16 = vec![0.0; groups * 16];
    let mut corr16 = vec![0; groups * 16];
    for (b, &db) in d.iter().enumerate() {
        let (g, j) = (b / 4, b % 4);
        for (h, half) in [0..QK / 2, QK / 2..QK].into_iter().enumerate() {
            let at = g * 4 * QK + h * 2 * QK + j * QK / 2;
            qn[at..at + QK / 2].copy_from_slice(&q[b * QK..][half]);
        }
        d16[16 * g + 4 * j..][..4].fill(db);
        corr16[16 * g + 4 * j] = -sums[b];
    }
    (qn, d16, corr16)
}
