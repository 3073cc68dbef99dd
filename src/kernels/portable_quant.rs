//! The quantized-row kernels without `std::arch` (an ARM CPU such as a
//! Jetson's, or an x86 one without AVX2/FMA/F16C): each block unpacked
//! into 32 small integers on the stack and summed in i32, in loops the
//! compiler vectorises for any target (NEON's widening multiplies on
//! aarch64). Formats: [`super::quant`].

use super::blocks::{f16_at, Q8Act, QFormat, QK};

/// A block's 32 quantized weights as integers, and the `(scale, offset)`
/// that turn `q` into `scale·q + offset`.
#[inline]
pub(super) fn unpack(format: QFormat, b: &[u8], q: &mut [i32; QK]) -> (f32, f32) {
    let d = f16_at(b, 0);
    let nibbles = |qs: &[u8], q: &mut [i32; QK]| {
        for j in 0..16 {
            q[j] = (qs[j] & 15) as i32;
            q[j + 16] = (qs[j] >> 4) as i32;
        }
    };
    match format {
        QFormat::Q3_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for (i, qi) in q.iter_mut().enumerate() {
                *qi = ((b[6 + i % 8] >> (2 * (i / 8))) & 3) as i32 | (((qh >> i) & 1) << 2) as i32;
            }
            (d, -4.0 * d)
        }
        QFormat::Q8_0 => {
            for (qi, &v) in q.iter_mut().zip(&b[2..2 + QK]) {
                *qi = v as i8 as i32;
            }
            (d, 0.0)
        }
        QFormat::Q4_0 => {
            nibbles(&b[2..18], q);
            (d, -8.0 * d)
        }
        QFormat::Q4_1 => {
            nibbles(&b[4..20], q);
            (d, f16_at(b, 2))
        }
        QFormat::Q5_0 => {
            nibbles(&b[6..22], q);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for (i, qi) in q.iter_mut().enumerate() {
                *qi |= (((qh >> i) & 1) << 4) as i32;
            }
            (d, -16.0 * d)
        }
    }
}

/// `row · x`: per block `scale·dx·Σ q·xq + offset·(dx·Σ xq)`.
pub(crate) fn dot(format: QFormat, row: &[u8], x: &Q8Act) -> f32 {
    let mut q = [0i32; QK];
    let mut sum = 0f32;
    for (i, b) in row.chunks_exact(format.block_bytes()).enumerate() {
        let (scale, offset) = unpack(format, b, &mut q);
        let xq = &x.q[i * QK..(i + 1) * QK];
        let isum: i32 = q.iter().zip(xq).map(|(&a, &b)| a * b as i32).sum();
        sum += scale * x.d[i] * isum as f32 + offset * x.s[i];
    }
    sum
}

/// `y += a · row`.
pub(crate) fn axpy(format: QFormat, a: f32, row: &[u8], y: &mut [f32]) {
    let mut q = [0i32; QK];
    for (b, yb) in row
        .chunks_exact(format.block_bytes())
        .zip(y.chunks_exact_mut(QK))
    {
        let (scale, offset) = unpack(format, b, &mut q);
        let (s, o) = (a * scale, a * offset);
        for (yi, &qi) in yb.iter_mut().zip(&q) {
            *yi += s * qi as f32 + o;
        }
    }
}

/// `Σ q_i·x_i` over a row of 2-bit codes ([`super::q2`]'s chunk layout).
pub(crate) fn dot_q2(codes: &[u8], x: &[i8]) -> i32 {
    let mut acc = 0i32;
    for (c, xc) in codes.chunks_exact(32).zip(x.chunks_exact(128)) {
        for (j, xs) in xc.chunks_exact(32).enumerate() {
            let part: i32 = c
                .iter()
                .zip(xs)
                .map(|(&b, &v)| ((b >> (2 * j)) & 3) as i32 * v as i32)
                .sum();
            acc += part;
        }
    }
    acc
}
