//! The AVX-512 back end of the quantized-row kernels (AVX512F/BW/VL and
//! VNNI: AMD Zen 4 and later, Intel Ice Lake and later), used when
//! [`available`] says the CPU has them; otherwise [`super::x86_quant`]
//! (AVX2). Formats: [`super::quant`].
//!
//! Two blocks at a time in one 512-bit register, in weight order: block A's
//! 32 weights in bytes 0–31, block B's in 32–63, so the activations load as
//! they are stored. `vpdpbusd` sums four unsigned-weight × signed-activation
//! products per i32 lane, so lanes 0–7 hold block A's partial sums and 8–15
//! block B's; one conversion and one multiply-add by the blocks' scales
//! (`d_w·d_x`, each repeated over its 8 lanes) finish the pair. Weights are
//! made unsigned: the nibble formats are (`q`, `Q5_0`'s fifth bit added under
//! a mask; `Q3_0`'s 2-bit pairs likewise with its third bit), `Q8_0`'s bytes
//! get `+128` (an `xor`); the offset this leaves (`-4`, `-8`, `-16`, `-128`
//! times `Σ x_q` of the block) starts the i32 sum, from
//! [`Q8Act::corr`], so it is exact. `Q4_1`'s `m·Σx` is added per block in f32.
//!
//! `down_proj`'s `Q8_0` neuron rows (the axpy) widen 16 bytes at a time
//! to f32 in one instruction. The other formats' axpy stays with AVX2.
//! [`dot2`] (a neuron's gate and up rows) and [`dot4`] (prefill: four
//! tokens per unpacked row) give [`dot`]'s results to the bit.

use super::blocks::{Q8Act, QFormat, QK};
use super::x86_quant::{self, format_of};
use std::arch::x86_64::*;

/// How far ahead of the loads the kernels ask for the weights (as the
/// AVX2 kernels).
const PREFETCH_BYTES: usize = 2048;

pub(crate) use super::cpu_features::avx512_vnni as available;

/// The i32 offset per block, as a power of two, that makes the weights
/// unsigned: `q - 4`, `q - 8`, `q - 16`, `(q + 128) - 128`; none for `Q4_1`.
const fn offset_shift(format: QFormat) -> i32 {
    match format {
        QFormat::Q3_0 => 2,
        QFormat::Q4_0 => 3,
        QFormat::Q5_0 => 4,
        QFormat::Q8_0 => 7,
        QFormat::Q4_1 => -1,
    }
}

/// Blocks A (at `b`) and B (at `b + bb`): their 64 weights as unsigned
/// bytes, in weight order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pair_weights<const F: u8>(b: *const u8, bb: usize) -> __m512i {
    let format = format_of(F);
    if format == QFormat::Q8_0 {
        let a = _mm256_loadu_si256(b.add(2) as *const __m256i);
        let c = _mm256_loadu_si256(b.add(bb + 2) as *const __m256i);
        let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), c);
        return _mm512_xor_si512(w, _mm512_set1_epi8(-128));
    }
    let high = |at: usize| {
        let ha = (b.add(at) as *const u32).read_unaligned() as u64;
        let hc = (b.add(bb + at) as *const u32).read_unaligned() as u64;
        ha | hc << 32
    };
    if format == QFormat::Q3_0 {
        // Each block's 8 bytes of pairs four times, shifted by 0, 2, 4, 6.
        let qa = (b.add(6) as *const i64).read_unaligned();
        let qc = (b.add(bb + 6) as *const i64).read_unaligned();
        let w = _mm512_set_epi64(qc, qc, qc, qc, qa, qa, qa, qa);
        let w = _mm512_srlv_epi64(w, _mm512_set_epi64(6, 4, 2, 0, 6, 4, 2, 0));
        let w = _mm512_and_si512(w, _mm512_set1_epi8(3));
        return _mm512_mask_add_epi8(w, high(2), w, _mm512_set1_epi8(0x04));
    }
    let qs = match format {
        QFormat::Q4_0 => 2,
        QFormat::Q4_1 => 4,
        _ => 6,
    };
    // Each block's 16 bytes twice; the second copy shifted by 4: low
    // nibbles (weights 0–15), then high ones (16–31).
    let a = _mm256_broadcastsi128_si256(_mm_loadu_si128(b.add(qs) as *const __m128i));
    let c = _mm256_broadcastsi128_si256(_mm_loadu_si128(b.add(bb + qs) as *const __m128i));
    let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), c);
    let w = _mm512_srlv_epi64(w, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    let w = _mm512_and_si512(w, _mm512_set1_epi8(0x0f));
    if format == QFormat::Q5_0 {
        return _mm512_mask_add_epi8(w, high(2), w, _mm512_set1_epi8(0x10));
    }
    w
}

/// The pair's scales `d_w`, each over its block's 8 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pair_scales(b: *const u8, bb: usize) -> __m512 {
    let da = (b as *const u16).read_unaligned() as u32;
    let dc = (b.add(bb) as *const u16).read_unaligned() as u32;
    let f = _mm_cvtph_ps(_mm_cvtsi32_si128((da | dc << 16) as i32));
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_format<const F: u8>(row: &[u8], x: &Q8Act) -> f32 {
    let format = format_of(F);
    let bb = format.block_bytes();
    let blocks = row.len() / bb;
    let (rp, qp) = (row.as_ptr(), x.q.as_ptr());
    let (d8, corr) = (x.d8.as_ptr(), x.corr.as_ptr());
    let shift = _mm_cvtsi32_si128(offset_shift(format));
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut offset = 0f32;
    // Blocks `i` and `i + 1` into `acc`.
    let pair = |i: usize, acc: &mut __m512, offset: &mut f32| {
        let b = rp.add(i * bb);
        let w = pair_weights::<F>(b, bb);
        let y = _mm512_loadu_si512(qp.add(i * QK) as *const __m512i);
        let init = if format == QFormat::Q4_1 {
            _mm512_setzero_si512()
        } else {
            _mm512_sll_epi32(_mm512_loadu_si512(corr.add(i * 8) as *const __m512i), shift)
        };
        let sums = _mm512_dpbusd_epi32(init, w, y);
        let scale = _mm512_mul_ps(pair_scales(b, bb), _mm512_loadu_ps(d8.add(i * 8)));
        *acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), *acc);
        if format == QFormat::Q4_1 {
            *offset += x86_quant::f16_to_f32(b.add(2)) * *x.s.get_unchecked(i)
                + x86_quant::f16_to_f32(b.add(bb + 2)) * *x.s.get_unchecked(i + 1);
        }
    };
    let mut i = 0;
    // Two pairs at a time, into two accumulators.
    while i + 4 <= blocks {
        _mm_prefetch::<_MM_HINT_T0>((rp.add(i * bb) as *const i8).wrapping_add(PREFETCH_BYTES));
        pair(i, &mut acc0, &mut offset);
        pair(i + 2, &mut acc1, &mut offset);
        i += 4;
    }
    if i + 2 <= blocks {
        pair(i, &mut acc0, &mut offset);
        i += 2;
    }
    let mut sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + offset;
    if i < blocks {
        // An odd last block: the AVX2 kernel on it alone.
        sum += x86_quant::block_dot(format, rp.add(i * bb), x, i);
    }
    sum
}

/// `row · x`.
///
/// # Safety
/// [`available`] is true; `row` holds `x.len() / 32` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot(format: QFormat, row: &[u8], x: &Q8Act) -> f32 {
    match format {
        QFormat::Q4_0 => dot_format::<0>(row, x),
        QFormat::Q4_1 => dot_format::<1>(row, x),
        QFormat::Q5_0 => dot_format::<2>(row, x),
        QFormat::Q8_0 => dot_format::<3>(row, x),
        QFormat::Q3_0 => dot_format::<4>(row, x),
    }
}

/// `(r0 · x, r1 · x)` for two rows of one format (a neuron's gate and up
/// rows): the activations, their scales and offsets loaded once per pair.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot2_format<const F: u8>(r0: &[u8], r1: &[u8], x: &Q8Act) -> (f32, f32) {
    let format = format_of(F);
    let bb = format.block_bytes();
    let blocks = r0.len() / bb;
    let (p0, p1, qp) = (r0.as_ptr(), r1.as_ptr(), x.q.as_ptr());
    let (d8, corr) = (x.d8.as_ptr(), x.corr.as_ptr());
    let shift = _mm_cvtsi32_si128(offset_shift(format));
    // Pair `p` goes to accumulator `p % 2` of its row, as in `dot_format`.
    let mut acc = [[_mm512_setzero_ps(); 2]; 2];
    let (mut off0, mut off1) = (0f32, 0f32);
    let lanes01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let lanes23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
    let mut i = 0;
    while i + 2 <= blocks {
        let (b0, b1) = (p0.add(i * bb), p1.add(i * bb));
        _mm_prefetch::<_MM_HINT_T0>((b0 as *const i8).wrapping_add(PREFETCH_BYTES));
        _mm_prefetch::<_MM_HINT_T0>((b1 as *const i8).wrapping_add(PREFETCH_BYTES));
        let y = _mm512_loadu_si512(qp.add(i * QK) as *const __m512i);
        let init = if format == QFormat::Q4_1 {
            _mm512_setzero_si512()
        } else {
            _mm512_sll_epi32(_mm512_loadu_si512(corr.add(i * 8) as *const __m512i), shift)
        };
        let dx = _mm512_loadu_ps(d8.add(i * 8));
        let s0 = _mm512_dpbusd_epi32(init, pair_weights::<F>(b0, bb), y);
        let s1 = _mm512_dpbusd_epi32(init, pair_weights::<F>(b1, bb), y);
        // The four scales (rows 0 and 1, blocks A and B) converted at once.
        let h = |p: *const u8| (p as *const u16).read_unaligned() as u64;
        let four = h(b0) | h(b0.add(bb)) << 16 | h(b1) << 32 | h(b1.add(bb)) << 48;
        let f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128(four as i64)));
        let w0 = _mm512_mul_ps(_mm512_permutexvar_ps(lanes01, f), dx);
        let w1 = _mm512_mul_ps(_mm512_permutexvar_ps(lanes23, f), dx);
        let p = (i / 2) % 2;
        acc[0][p] = _mm512_fmadd_ps(w0, _mm512_cvtepi32_ps(s0), acc[0][p]);
        acc[1][p] = _mm512_fmadd_ps(w1, _mm512_cvtepi32_ps(s1), acc[1][p]);
        if format == QFormat::Q4_1 {
            let (sa, sb) = (*x.s.get_unchecked(i), *x.s.get_unchecked(i + 1));
            off0 +=
                x86_quant::f16_to_f32(b0.add(2)) * sa + x86_quant::f16_to_f32(b0.add(bb + 2)) * sb;
            off1 +=
                x86_quant::f16_to_f32(b1.add(2)) * sa + x86_quant::f16_to_f32(b1.add(bb + 2)) * sb;
        }
        i += 2;
    }
    let mut out = (
        _mm512_reduce_add_ps(_mm512_add_ps(acc[0][0], acc[0][1])) + off0,
        _mm512_reduce_add_ps(_mm512_add_ps(acc[1][0], acc[1][1])) + off1,
    );
    if i < blocks {
        out.0 += x86_quant::block_dot(format, p0.add(i * bb), x, i);
        out.1 += x86_quant::block_dot(format, p1.add(i * bb), x, i);
    }
    out
}

/// `(r0 · x, r1 · x)`, two rows of one format.
///
/// # Safety
/// [`available`] is true; each row holds `x.len() / 32` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot2(format: QFormat, r0: &[u8], r1: &[u8], x: &Q8Act) -> (f32, f32) {
    match format {
        QFormat::Q4_0 => dot2_format::<0>(r0, r1, x),
        QFormat::Q4_1 => dot2_format::<1>(r0, r1, x),
        QFormat::Q5_0 => dot2_format::<2>(r0, r1, x),
        QFormat::Q8_0 => dot2_format::<3>(r0, r1, x),
        QFormat::Q3_0 => dot2_format::<4>(r0, r1, x),
    }
}

/// `[row · x[t]]` for four tokens' activations (prefill): each pair of
/// blocks unpacked once, then one `vpdpbusd` per token.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot4_format<const F: u8>(row: &[u8], xs: [&Q8Act; 4]) -> [f32; 4] {
    let format = format_of(F);
    let bb = format.block_bytes();
    let blocks = row.len() / bb;
    let rp = row.as_ptr();
    let shift = _mm_cvtsi32_si128(offset_shift(format));
    // Pair `p` goes to accumulator `p % 2` of its token, as in `dot_format`,
    // so that each token's result is `dot`'s to the bit.
    let mut acc = [[_mm512_setzero_ps(); 2]; 4];
    let mut off = [0f32; 4];
    let mut i = 0;
    while i + 2 <= blocks {
        let p = (i / 2) % 2;
        let b = rp.add(i * bb);
        let w = pair_weights::<F>(b, bb);
        let ws = pair_scales(b, bb);
        let m = if format == QFormat::Q4_1 {
            (
                x86_quant::f16_to_f32(b.add(2)),
                x86_quant::f16_to_f32(b.add(bb + 2)),
            )
        } else {
            (0.0, 0.0)
        };
        for t in 0..4 {
            let x = xs[t];
            let y = _mm512_loadu_si512(x.q.as_ptr().add(i * QK) as *const __m512i);
            let init = if format == QFormat::Q4_1 {
                _mm512_setzero_si512()
            } else {
                let c = _mm512_loadu_si512(x.corr.as_ptr().add(i * 8) as *const __m512i);
                _mm512_sll_epi32(c, shift)
            };
            let sums = _mm512_dpbusd_epi32(init, w, y);
            let scale = _mm512_mul_ps(ws, _mm512_loadu_ps(x.d8.as_ptr().add(i * 8)));
            acc[t][p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), acc[t][p]);
            if format == QFormat::Q4_1 {
                off[t] += m.0 * *x.s.get_unchecked(i) + m.1 * *x.s.get_unchecked(i + 1);
            }
        }
        i += 2;
    }
    std::array::from_fn(|t| {
        let mut v = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1])) + off[t];
        if i < blocks {
            v += x86_quant::block_dot(format, rp.add(i * bb), xs[t], i);
        }
        v
    })
}

/// `[row · x[t]]` for four tokens' activations.
///
/// # Safety
/// [`available`] is true; `row` holds `x.len() / 32` blocks for each `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot4(format: QFormat, row: &[u8], xs: [&Q8Act; 4]) -> [f32; 4] {
    match format {
        QFormat::Q4_0 => dot4_format::<0>(row, xs),
        QFormat::Q4_1 => dot4_format::<1>(row, xs),
        QFormat::Q5_0 => dot4_format::<2>(row, xs),
        QFormat::Q8_0 => dot4_format::<3>(row, xs),
        QFormat::Q3_0 => dot4_format::<4>(row, xs),
    }
}

/// `y += a · row` for one `Q8_0` row, 32 values of `y` at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn axpy_q8(a: f32, row: *const u8, y: &mut [f32]) {
    let bb = QFormat::Q8_0.block_bytes();
    let yp = y.as_mut_ptr();
    for i in 0..y.len() / QK {
        let (b, yq) = (row.add(i * bb), yp.add(i * QK));
        _mm_prefetch::<_MM_HINT_T0>((b as *const i8).wrapping_add(PREFETCH_BYTES));
        let s = _mm512_set1_ps(a * x86_quant::f16_to_f32(b));
        let q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2) as *const __m128i));
        let q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(18) as *const __m128i));
        let lo = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(q0), _mm512_loadu_ps(yq));
        let hi = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(q1), _mm512_loadu_ps(yq.add(16)));
        _mm512_storeu_ps(yq, lo);
        _mm512_storeu_ps(yq.add(16), hi);
    }
}

/// `y += a · row` for one `Q4_0` row (the coarse tier's down rows,
/// [`crate::model::ffn_tier`]), 32 values of `y` at a time: a block's low
/// nibbles are its weights 0–15, its high ones 16–31, each `d·(q − 8)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn axpy_q4_0(a: f32, row: *const u8, y: &mut [f32]) {
    let bb = QFormat::Q4_0.block_bytes();
    let yp = y.as_mut_ptr();
    let (mask, eight) = (_mm_set1_epi8(0x0F), _mm512_set1_epi32(8));
    for i in 0..y.len() / QK {
        let (b, yq) = (row.add(i * bb), yp.add(i * QK));
        _mm_prefetch::<_MM_HINT_T0>((b as *const i8).wrapping_add(PREFETCH_BYTES));
        let s = _mm512_set1_ps(a * x86_quant::f16_to_f32(b));
        let qs = _mm_loadu_si128(b.add(2) as *const __m128i);
        let lo = _mm_and_si128(qs, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), mask);
        let q0 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(lo), eight);
        let q1 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(hi), eight);
        let y0 = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(q0), _mm512_loadu_ps(yq));
        let y1 = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(q1), _mm512_loadu_ps(yq.add(16)));
        _mm512_storeu_ps(yq, y0);
        _mm512_storeu_ps(yq.add(16), y1);
    }
}

/// `y += a · row`.
///
/// # Safety
/// [`available`] is true; `row` holds `y.len() / 32` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn axpy(format: QFormat, a: f32, row: &[u8], y: &mut [f32]) {
    match format {
        QFormat::Q8_0 => axpy_q8(a, row.as_ptr(), y),
        QFormat::Q4_0 => axpy_q4_0(a, row.as_ptr(), y),
        _ => x86_quant::axpy(format, a, row, y),
    }
}
