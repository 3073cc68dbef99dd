//! The x86-64 back end of the quantized-row kernels (AVX2/FMA/F16C), used
//! when [`available`] says the CPU has them. Formats: [`super::quant`].
//!
//! A block's weights become 32 bytes in one register: `Q8_0`'s as they
//! are (signed), the others' as unsigned `q` (nibbles, plus `Q5_0`'s fifth
//! bits; `Q3_0`'s 2-bit pairs plus third bits), whose products with the i8
//! activations `maddubs` sums in pairs; the offset (`Q4_0`'s -8, `Q5_0`'s
//! -16, `Q3_0`'s -4, `Q4_1`'s `m`) is applied once
//! per block through the activations' block sum.

use super::blocks::{Q8Act, QFormat, QK};
use std::arch::x86_64::*;

pub(crate) use super::x86::available;

/// How far ahead of the loads the kernels ask for the weights (as the f16
/// kernels, [`super::x86`]).
const PREFETCH_BYTES: usize = 1024;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_to_f32(p: *const u8) -> f32 {
    // Inserted into a zeroed register: a plain 16-bit load becomes a
    // `vpinsrw` merging into whatever register is free, which chained
    // every block to the one before (through the offset sum).
    let bits = (p as *const u16).read_unaligned();
    let v = _mm_insert_epi16::<0>(_mm_setzero_si128(), bits as i32);
    _mm_cvtss_f32(_mm_cvtph_ps(v))
}

/// 16 bytes of nibbles → 32 bytes: the low nibbles, then the high ones.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let b = _mm_loadu_si128(p as *const __m128i);
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(b, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m);
    _mm256_set_m128i(hi, lo)
}

/// 8 bytes of 2-bit pairs (`Q3_0`'s) → 32 bytes: bits `2k..2k+2` of
/// byte `j` to byte `8k + j`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn pairs(p: *const u8) -> __m256i {
    let v = _mm256_set1_epi64x((p as *const i64).read_unaligned());
    let v = _mm256_srlv_epi64(v, _mm256_set_epi64x(6, 4, 2, 0));
    _mm256_and_si256(v, _mm256_set1_epi8(3))
}

/// 32 high bits (a u32 at `p`: `Q5_0`'s fifth, `Q3_0`'s third) as bytes
/// `BIT` or `0`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn high_bits<const BIT: i8>(p: *const u8) -> __m256i {
    let x32 = (p as *const u32).read_unaligned();
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
    let bit = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    let set = _mm256_cmpeq_epi8(bit, _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(BIT))
}

/// Σ of the 32 products of unsigned bytes `q` and signed bytes `y`, as
/// eight i32 partial sums in f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn udot(q: __m256i, y: __m256i) -> __m256 {
    let pairs = _mm256_maddubs_epi16(q, y);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

/// A block's weights in one register and its `(scale, offset)` (as in
/// [`super::portable_quant`]); `Q8_0`'s bytes are signed, the others' unsigned.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block(format: QFormat, b: *const u8) -> (__m256i, f32, f32) {
    let d = f16_to_f32(b);
    match format {
        QFormat::Q8_0 => (_mm256_loadu_si256(b.add(2) as *const __m256i), d, 0.0),
        QFormat::Q4_0 => (nibbles(b.add(2)), d, -8.0 * d),
        QFormat::Q4_1 => (nibbles(b.add(4)), d, f16_to_f32(b.add(2))),
        QFormat::Q3_0 => (
            _mm256_or_si256(pairs(b.add(6)), high_bits::<0x04>(b.add(2))),
            d,
            -4.0 * d,
        ),
        QFormat::Q5_0 => (
            _mm256_or_si256(nibbles(b.add(6)), high_bits::<0x10>(b.add(2))),
            d,
            -16.0 * d,
        ),
    }
}

/// The format a kernel's const parameter stands for (0 `Q4_0`, 1 `Q4_1`,
/// 2 `Q5_0`, 3 `Q8_0`, 4 `Q3_0`; also the AVX-512 back end's).
pub(super) const fn format_of(f: u8) -> QFormat {
    match f {
        0 => QFormat::Q4_0,
        1 => QFormat::Q4_1,
        2 => QFormat::Q5_0,
        3 => QFormat::Q8_0,
        _ => QFormat::Q3_0,
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_format<const F: u8>(row: &[u8], x: &Q8Act) -> f32 {
    let format = format_of(F);
    let bb = format.block_bytes();
    let blocks = row.len() / bb;
    let (rp, qp) = (row.as_ptr(), x.q.as_ptr());
    let (dp, sp) = (x.d.as_ptr(), x.s.as_ptr());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut offset = 0f32;
    // One block: its products summed into `acc`, its offset into `offset`.
    let step = |i: usize, acc: &mut __m256, offset: &mut f32| {
        let (w, scale, off) = block(format, rp.add(i * bb));
        let y = _mm256_loadu_si256(qp.add(i * QK) as *const __m256i);
        let p = if format == QFormat::Q8_0 {
            udot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w))
        } else {
            udot(w, y)
        };
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(scale * *dp.add(i)), p, *acc);
        if format != QFormat::Q8_0 {
            *offset += off * *sp.add(i);
        }
    };
    let mut i = 0;
    // Two blocks at a time, into two accumulators.
    while i + 2 <= blocks {
        _mm_prefetch::<_MM_HINT_T0>((rp.add(i * bb) as *const i8).wrapping_add(PREFETCH_BYTES));
        step(i, &mut acc0, &mut offset);
        step(i + 1, &mut acc1, &mut offset);
        i += 2;
    }
    if i < blocks {
        step(i, &mut acc0, &mut offset);
    }
    hsum(_mm256_add_ps(acc0, acc1)) + offset
}

/// Block `i` of a row (at `b`) times block `i` of `x`.
///
/// # Safety
/// AVX2, FMA and F16C are available; `b` holds one block; `x` has block `i`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block_dot(format: QFormat, b: *const u8, x: &Q8Act, i: usize) -> f32 {
    let (w, scale, off) = block(format, b);
    let y = _mm256_loadu_si256(x.q.as_ptr().add(i * QK) as *const __m256i);
    let p = if format == QFormat::Q8_0 {
        udot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w))
    } else {
        udot(w, y)
    };
    hsum(p) * scale * x.d[i] + off * x.s[i]
}

/// `row · x`.
///
/// # Safety
/// AVX2, FMA and F16C are available; `row` holds `x.len() / 32` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot(format: QFormat, row: &[u8], x: &Q8Act) -> f32 {
    // One copy of the loop per format (the const parameter), so the
    // format's matches fold away.
    match format {
        QFormat::Q4_0 => dot_format::<0>(row, x),
        QFormat::Q4_1 => dot_format::<1>(row, x),
        QFormat::Q5_0 => dot_format::<2>(row, x),
        QFormat::Q8_0 => dot_format::<3>(row, x),
        QFormat::Q3_0 => dot_format::<4>(row, x),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_format<const F: u8>(a: f32, row: &[u8], y: &mut [f32]) {
    let format = format_of(F);
    let bb = format.block_bytes();
    let (rp, yp) = (row.as_ptr(), y.as_mut_ptr());
    for i in 0..y.len() / QK {
        let b = rp.add(i * bb);
        _mm_prefetch::<_MM_HINT_T0>((b as *const i8).wrapping_add(PREFETCH_BYTES));
        let (w, scale, off) = block(format, b);
        let (s, o) = (_mm256_set1_ps(a * scale), _mm256_set1_ps(a * off));
        let (lo, hi) = (_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
        for (j, part) in [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)]
            .into_iter()
            .enumerate()
        {
            let q = if format == QFormat::Q8_0 {
                _mm256_cvtepi8_epi32(part)
            } else {
                _mm256_cvtepu8_epi32(part)
            };
            let yq = yp.add(i * QK + 8 * j);
            let v = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q), _mm256_loadu_ps(yq));
            _mm256_storeu_ps(yq, _mm256_add_ps(v, o));
        }
    }
}

/// `y += a · row`.
///
/// # Safety
/// AVX2, FMA and F16C are available; `row` holds `y.len() / 32` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy(format: QFormat, a: f32, row: &[u8], y: &mut [f32]) {
    match format {
        QFormat::Q4_0 => axpy_format::<0>(a, row, y),
        QFormat::Q4_1 => axpy_format::<1>(a, row, y),
        QFormat::Q5_0 => axpy_format::<2>(a, row, y),
        QFormat::Q8_0 => axpy_format::<3>(a, row, y),
        QFormat::Q3_0 => axpy_format::<4>(a, row, y),
    }
}
