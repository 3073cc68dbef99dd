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
//! The formats themselves are [`super::blocks`].

pub(crate) use super::blocks::QK;
pub use super::blocks::{Q8Act, QFormat};
use super::planar::{self, RowForm};
use super::portable_quant;
use super::spin_pool::{DisjointSlice, SpinPool};
#[cfg(target_arch = "x86_64")]
use super::{x86_quant, x86_vnni, x86_vnni_planar};

/// `row` (blocks of `format`) as `Q8_0` blocks holding exactly the same
/// weights, where that exists ([`QFormat::exact_in_q8_0`]): a `Q3_0`,
/// `Q4_0` or `Q5_0` block's weights are its scale `d` times the integers
/// `q-4`, `q-8` or `q-16`, which a `Q8_0` block with the same `d` holds as they are; `Q8_0`
/// rows are returned as they are. `None` for `Q4_1`.
pub(crate) fn widen_to_q8_0(format: QFormat, row: &[u8]) -> Option<Vec<u8>> {
    let offset = match format {
        QFormat::Q8_0 => return Some(row.to_vec()),
        QFormat::Q4_1 => return None,
        QFormat::Q3_0 => 4,
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
        RowForm::Planar => dot_planar(format, row, x),
    }
}

/// The row, stored in `form`, dequantized into `out`.
pub(crate) fn dequantize_row_in(format: QFormat, form: RowForm, row: &[u8], out: &mut [f32]) {
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
pub(crate) fn dot2(format: QFormat, r0: &[u8], r1: &[u8], x: &Q8Act) -> (f32, f32) {
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
pub(crate) fn dequantize_row(format: QFormat, row: &[u8], out: &mut [f32]) {
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
pub(crate) fn int8_prefill() -> bool {
    super::cpu_features::avx512_vnni()
}

/// `[row · x[t]]` for four tokens' activations.
#[inline]
pub(crate) fn dot4(format: QFormat, row: &[u8], xs: [&Q8Act; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if x86_vnni::available() {
        // SAFETY: the CPU has AVX-512 with VNNI (checked); the row holds
        // `x.len() / 32` blocks for each `x` (checked by the callers).
        return unsafe { x86_vnni::dot4(format, row, xs) };
    }
    xs.map(|x| dot(format, row, x))
}

/// `row · x` for a planar row.
#[inline]
pub(crate) fn dot_planar(format: QFormat, row: &[u8], x: &Q8Act) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if x.has_planar() {
        // SAFETY: `x` was quantized with the planar arrays, which happens
        // only where the AVX-512 VNNI kernels run; the row holds
        // `x.len() / 32` blocks (checked by the callers).
        return unsafe { x86_vnni_planar::dot(format, row, x) };
    }
    dot(format, &planar::gathered(format, row), x)
}

/// `(r0 · x, r1 · x)` for two planar rows (a neuron's gate and up).
#[inline]
pub(crate) fn dot2_planar(format: QFormat, r0: &[u8], r1: &[u8], x: &Q8Act) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if x.has_planar() {
        // SAFETY: as in `dot_planar`.
        return unsafe { x86_vnni_planar::dot2(format, r0, r1, x) };
    }
    (dot_planar(format, r0, x), dot_planar(format, r1, x))
}

/// `[row · x[t]]` for four tokens' activations and a planar row.
#[inline]
pub(crate) fn dot4_planar(format: QFormat, row: &[u8], xs: [&Q8Act; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if xs.iter().all(|x| x.has_planar()) {
        // SAFETY: as in `dot_planar`.
        return unsafe { x86_vnni_planar::dot4(format, row, xs) };
    }
    xs.map(|x| dot_planar(format, row, x))
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
pub(crate) fn matvec_q_ids(
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
    use crate::kernels::planar::to_planar;
    use crate::kernels::test_data::{data, plain_dequantize, quantize_rows, ALL};
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    #[test]
    fn plain_dequantize_matches_ggml() {
        let cols = 96;
        let w = data(4 * cols, 11);
        for f in ALL {
            let q = quantize_rows(&w, cols, f);
            let Some(ggml) = f.ggml() else {
                continue; // Q3_0: ours (its quantizer's test is below)
            };
            let t = QTensor::quantize(
                &Tensor::from_slice(&w, (4, cols), &Device::Cpu).unwrap(),
                ggml,
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
    fn q3_0_holds_its_levels_exactly_and_rounds_no_worse_than_plain_rounding() {
        use crate::kernels::blocks::quantize_q3_0;
        let f = QFormat::Q3_0;
        // Weights on the levels of a step 0.5 (each block's first at -4
        // steps, the largest): they come back bit for bit.
        let w: Vec<f32> = (0..4 * QK)
            .map(|i| match i % QK {
                0 => -2.0,
                j => 0.5 * ((j * 7 + i / QK) % 8) as f32 - 2.0,
            })
            .collect();
        let mut q = vec![0u8; f.row_bytes(w.len())];
        quantize_q3_0(&w, &[], &mut q);
        assert_eq!(plain_dequantize(f, &q), w);
        // Smooth data: the searched step's squared error per block is at
        // most that of the plain step `max/-4`, and every weight is within
        // one step of its value.
        let w = data(8 * QK, 21);
        let mut q = vec![0u8; f.row_bytes(w.len())];
        quantize_q3_0(&w, &[], &mut q);
        let back = plain_dequantize(f, &q);
        for (b, (wb, bb)) in w.chunks_exact(QK).zip(back.chunks_exact(QK)).enumerate() {
            let max = wb
                .iter()
                .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            let d = half::f16::from_f32(max / -4.0).to_f32();
            let plain: f32 = wb
                .iter()
                .map(|&v| (v - d * (v / d).round().clamp(-4.0, 3.0)).powi(2))
                .sum();
            let got: f32 = wb.iter().zip(bb).map(|(a, b)| (a - b).powi(2)).sum();
            assert!(got <= plain * 1.0001, "block {b}: {got} > {plain}");
            let step = half::f16::from_le_bytes([q[14 * b], q[14 * b + 1]])
                .to_f32()
                .abs();
            for (a, b) in wb.iter().zip(bb) {
                assert!((a - b).abs() <= step * 1.0001, "block {b}: {a} vs {b}");
            }
        }
        // An importance of zero on a position frees it: the rest fit better.
        let mut imp = vec![1f32; w.len()];
        imp.iter_mut().step_by(QK).for_each(|v| *v = 0.0);
        let mut qi = vec![0u8; q.len()];
        quantize_q3_0(&w, &imp, &mut qi);
        let err = |q: &[u8]| -> f32 {
            let back = plain_dequantize(f, q);
            (0..w.len())
                .map(|i| imp[i] * (w[i] - back[i]).powi(2))
                .sum()
        };
        assert!(err(&qi) <= err(&q) * 1.0001);
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
    fn planar_dots_match_plain_loops_and_each_other_at_odd_lengths() {
        for blocks in [1, 2, 3, 4, 5, 17, 18, 28, 29] {
            let k = blocks * QK;
            let xs: Vec<Q8Act> = (0..4).map(|t| Q8Act::quantize(&data(k, 30 + t))).collect();
            for f in ALL {
                let rows = [
                    quantize_rows(&data(k, 3), k, f),
                    quantize_rows(&data(k, 4), k, f),
                ];
                let planar = rows.clone().map(|r| {
                    let mut p = vec![0u8; r.len()];
                    to_planar(f, &r, &mut p);
                    p
                });
                for x in &xs {
                    let xd: Vec<f32> = (0..k).map(|i| x.q[i] as f32 * x.d[i / QK]).collect();
                    let one = planar.clone().map(|p| dot_planar(f, &p, x));
                    for (r, got) in rows.iter().zip(one) {
                        let want: f64 = plain_dequantize(f, r)
                            .iter()
                            .zip(&xd)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        let tol = 1e-4 * (1.0 + want.abs());
                        assert!(
                            (got as f64 - want).abs() < tol,
                            "{f} {blocks}: {got} vs {want}"
                        );
                    }
                    let two = dot2_planar(f, &planar[0], &planar[1], x);
                    assert_eq!(
                        [two.0, two.1],
                        one,
                        "{f} {blocks}: dot2 is dot's to the bit"
                    );
                }
                let four = dot4_planar(f, &planar[0], [&xs[0], &xs[1], &xs[2], &xs[3]]);
                let one: Vec<f32> = xs.iter().map(|x| dot_planar(f, &planar[0], x)).collect();
                assert_eq!(four.to_vec(), one, "{f} {blocks}: dot4 is dot's to the bit");
            }
        }
    }
}
