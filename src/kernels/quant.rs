//! Quantized weight rows for decode: ggml's 32-element blocks (`Q4_0`,
//! `Q4_1`, `Q5_0`, `Q8_0`, bit for bit as GGUF stores them), the
//! activations quantized per block to 8 bits (as llama.cpp's q8
//! activations), and the ops on them: a row's dot with the activations,
//! a row's axpy into an f32 vector (`down_proj`'s neuron rows), a matrix
//! product over rows of blocks, for rows of whole blocks or in the
//! [`planar`](super::planar) form (the SwiGLU MLP over neuron bundles is
//! [`super::quant_mlp`]). The back ends are apart: `x86_vnni` (AVX-512
//! with VNNI: Zen 4, Ice Lake and later; `x86_vnni_planar` for planar
//! rows), `x86_quant` (AVX2/FMA/F16C) and `portable_quant` (every other
//! target; NEON on aarch64 by the compiler).
//!
//! Every block holds 32 weights and an f16 scale `d` (`Q4_1` also an f16
//! minimum `m`). A weight is `d·q` for `Q8_0` (`q` an i8), `d·(q-8)` for
//! `Q4_0` (`q` a nibble), `d·q + m` for `Q4_1`, and `d·(q-16)` for `Q5_0`
//! (`q` a nibble plus a fifth bit). Nibble `j` of byte `j` is weight `j`,
//! its high nibble weight `j+16`; `Q5_0`'s fifth bits are one u32, bit
//! `i` for weight `i`.

use super::planar::{self, RowForm};
use super::portable_quant;
use super::spin_pool::{DisjointSlice, SpinPool};
#[cfg(target_arch = "x86_64")]
use super::{x86_quant, x86_vnni};

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

    /// Whether a `Q8_0` block holds this format's weights exactly
    /// ([`widen_to_q8_0`]): every format but `Q4_1`, whose `d·q + m` is
    /// not a scale times an integer in general.
    pub const fn exact_in_q8_0(self) -> bool {
        !matches!(self, Self::Q4_1)
    }
}

/// `row` (blocks of `format`) as `Q8_0` blocks holding exactly the same
/// weights, where that exists ([`QFormat::exact_in_q8_0`]): a `Q4_0` or
/// `Q5_0` block's weights are its scale `d` times the integers `q-8` or
/// `q-16`, which a `Q8_0` block with the same `d` holds as they are; `Q8_0`
/// rows are returned as they are. `None` for `Q4_1`.
pub fn widen_to_q8_0(format: QFormat, row: &[u8]) -> Option<Vec<u8>> {
    let offset = match format {
        QFormat::Q8_0 => return Some(row.to_vec()),
        QFormat::Q4_1 => return None,
        QFormat::Q4_0 => 8,
        QFormat::Q5_0 => 16,
    };
    debug_assert!(format.exact_in_q8_0());
    let bb = format.block_bytes();
    debug_assert!(row.len().is_multiple_of(bb));
    let mut out = Vec::with_capacity(row.len() / bb * QFormat::Q8_0.block_bytes());
    let mut q = [0i32; QK];
    for b in row.chunks_exact(bb) {
        // The same scale, then the block's integers as the kernels unpack them.
        out.extend_from_slice(&b[..2]);
        portable_quant::unpack(format, b, &mut q);
        out.extend(q.iter().map(|&v| (v - offset) as i8 as u8));
    }
    Some(out)
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
const ROUND: f32 = 12_582_912.0;

impl Q8Act {
    /// Quantizes `x` (a multiple of 32 long) to the nearest of 255 levels
    /// per block (scale `max|x| / 127`; ties to even).
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
            ..Self::default()
        };
        let mut sums = Vec::with_capacity(if wide { blocks } else { 0 });
        for (b, (xb, qb)) in x.chunks_exact(QK).zip(a.q.chunks_exact_mut(QK)).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = ((v * id + ROUND) - ROUND).clamp(-127.0, 127.0) as i8;
            }
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
            (a.qn, a.d16, a.corr16) = super::planar::planar_acts(&a.q, &a.d, &sums);
        }
        a
    }

    /// True when the planar kernels' arrays are here (where they run).
    #[inline]
    pub fn has_planar(&self) -> bool {
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

/// `row · x` for a row stored in `form`.
#[inline]
pub fn dot_in(format: QFormat, form: RowForm, row: &[u8], x: &Q8Act) -> f32 {
    match form {
        RowForm::Blocks => dot(format, row, x),
        RowForm::Planar => planar::dot_planar(format, row, x),
    }
}

/// The row, stored in `form`, dequantized into `out`.
pub fn dequantize_row_in(format: QFormat, form: RowForm, row: &[u8], out: &mut [f32]) {
    match form {
        RowForm::Blocks => dequantize_row(format, row, out),
        RowForm::Planar => {
            // Block by block, each gathered back whole (no allocation).
            let mut b = [0u8; 34];
            for (i, o) in out.chunks_exact_mut(QK).enumerate() {
                planar::block_of(format, row, i, &mut b);
                dequantize_row(format, &b[..format.block_bytes()], o);
            }
        }
    }
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

/// Smallest block of rows a decode thread takes at once (as the f16 kernels).
const MIN_ROWS: usize = super::matvec::MIN_ROWS_PER_BLOCK;

/// `out[r] = row r · x` for `out.len()` rows of blocks in `w`, split over
/// the decode threads.
pub fn matvec_q(format: QFormat, form: RowForm, w: &[u8], x: &Q8Act, out: &mut [f32]) {
    let rb = format.row_bytes(x.len());
    debug_assert_eq!(w.len(), out.len() * rb);
    let rows = out.len();
    let out = DisjointSlice::new(out);
    SpinPool::global().for_each_block(rows, MIN_ROWS, |_, block| {
        let w = &w[block.start * rb..block.end * rb];
        // SAFETY: the blocks of one call are disjoint.
        let o = unsafe { out.range(block) };
        for (oi, row) in o.iter_mut().zip(w.chunks_exact(rb)) {
            *oi = dot_in(format, form, row, x);
        }
    });
}

/// `out[j] = row ids[j] · x` for rows of blocks picked by index, split over
/// the decode threads.
pub fn matvec_q_ids(
    format: QFormat,
    form: RowForm,
    w: &[u8],
    ids: &[u32],
    x: &Q8Act,
    out: &mut [f32],
) {
    let rb = format.row_bytes(x.len());
    debug_assert_eq!(ids.len(), out.len());
    let out = DisjointSlice::new(out);
    SpinPool::global().for_each_block(ids.len(), MIN_ROWS, |_, block| {
        // SAFETY: the blocks of one call are disjoint.
        let o = unsafe { out.range(block.clone()) };
        for (oi, &id) in o.iter_mut().zip(&ids[block]) {
            let r = id as usize * rb;
            *oi = dot_in(format, form, &w[r..r + rb], x);
        }
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::quant_mlp::{
        reform, swiglu, swiglu_activations_q, swiglu_bundles, BundleLayout, DownForm,
    };
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
    fn widening_to_q8_0_keeps_every_weight_exactly() {
        let cols = 160;
        let w = data(3 * cols, 5);
        for f in ALL {
            let row = quantize_rows(&w, cols, f);
            match widen_to_q8_0(f, &row) {
                Some(wide) => {
                    assert_eq!(wide.len(), QFormat::Q8_0.row_bytes(3 * cols), "{f}");
                    assert_eq!(
                        plain_dequantize(QFormat::Q8_0, &wide),
                        plain_dequantize(f, &row),
                        "{f}"
                    );
                }
                None => assert_eq!(f, QFormat::Q4_1),
            }
            assert_eq!(f.exact_in_q8_0(), f != QFormat::Q4_1);
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
