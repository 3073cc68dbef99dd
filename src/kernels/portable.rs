//! The kernels' forms without `std::arch` (an ARM CPU such as a Jetson's,
//! or an x86 one without AVX2/FMA/F16C), written so that the compiler
//! vectorises them for any target: sums run in [`LANES`]
//! independent lanes (a single running sum is a dependency chain the
//! compiler may not reorder), and f16 rows are widened a chunk at a time
//! with `half`'s slice conversion (NEON `fcvtl`, F16C) rather than one
//! element at a time.

use half::{f16, slice::HalfFloatSliceExt};

/// Independent partial sums of a dot product.
pub(crate) const LANES: usize = 16;
/// f16 values widened at once (on the stack).
const CHUNK: usize = 256;

pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let (w, x) = (&w[..n], &x[..n]);
    let mut acc = [0f32; LANES];
    for (a, b) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] += a[i] * b[i];
        }
    }
    let tail = n - n % LANES;
    let rest: f32 = w[tail..].iter().zip(&x[tail..]).map(|(a, b)| a * b).sum();
    acc.iter().sum::<f32>() + rest
}

pub fn dot_f16(w: &[f16], x: &[f32]) -> f32 {
    let mut wide = [0f32; CHUNK];
    w.chunks(CHUNK)
        .zip(x.chunks(CHUNK))
        .map(|(w, x)| {
            let wide = &mut wide[..w.len()];
            w.convert_to_f32_slice(wide);
            dot_f32(wide, x)
        })
        .sum()
}

/// `y += Σ_r a[r] · w[r, :]` over f16 rows of length `y.len()`.
pub fn axpy_rows_f16(a: &[f32], w: &[f16], y: &mut [f32]) {
    let k = y.len();
    let mut wide = [0f32; CHUNK];
    for (r, &ar) in a.iter().enumerate() {
        let row = &w[r * k..(r + 1) * k];
        for (start, part) in (0..k).step_by(CHUNK).zip(row.chunks(CHUNK)) {
            let wide = &mut wide[..part.len()];
            part.convert_to_f32_slice(wide);
            y[start..start + part.len()]
                .iter_mut()
                .zip(wide.iter())
                .for_each(|(yi, wi)| *yi += ar * wi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
    }

    #[test]
    fn dots_and_row_sums_match_plain_loops_for_odd_lengths() {
        for n in [0, 1, 15, 16, 17, 255, 256, 257, 576, 1000] {
            let (w, x) = (data(n, 0.3), data(n, 1.1));
            let plain: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            assert!(
                (dot_f32(&w, &x) as f64 - plain).abs() < 1e-4,
                "f32 dot of {n}"
            );
            let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            let plain: f64 = wh.iter().zip(&x).map(|(a, b)| a.to_f64() * *b as f64).sum();
            assert!(
                (dot_f16(&wh, &x) as f64 - plain).abs() < 1e-4,
                "f16 dot of {n}"
            );
        }
        for (rows, k) in [(1, 1), (3, 17), (5, 256), (2, 300)] {
            let a = data(rows, 0.7);
            let w: Vec<f16> = data(rows * k, 2.0)
                .iter()
                .map(|&v| f16::from_f32(v))
                .collect();
            let mut y = data(k, 0.1);
            let mut want = y.clone();
            for r in 0..rows {
                for i in 0..k {
                    want[i] += a[r] * w[r * k + i].to_f32();
                }
            }
            axpy_rows_f16(&a, &w, &mut y);
            let diff = y
                .iter()
                .zip(&want)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-5, "f16 axpy of {rows}x{k}: {diff}");
        }
    }
}
