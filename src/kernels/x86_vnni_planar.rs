//! The AVX-512 VNNI kernels over planar rows ([`super::planar`]): four
//! blocks per step. The nibble formats load the four blocks' 64 bytes of
//! quants at once; their low nibbles (each block's weights 0–15) and high
//! nibbles (16–31) meet the activations in the same order ([`Q8Act`]'s
//! `qn`), so both halves sum into one register, four i32 lanes per block,
//! and one conversion and one multiply-add by `d_w·d_x` finish the four
//! blocks. The weights are made unsigned and the offsets start the sums as
//! in [`super::x86_vnni`]. `Q8_0` rows are not made planar (their planar
//! form is their block form): they go to [`super::x86_vnni`]. [`dot2`] and [`dot4`] give
//! [`dot`]'s results to the bit. A last group of fewer than four blocks
//! loads masked (zeros after the row's end; the activations' planar arrays
//! are padded with zeros to whole groups).

use super::blocks::{Q8Act, QFormat};
use super::planar::gathered;
use super::x86_quant::format_of;
use std::arch::x86_64::*;

/// How far ahead of the loads the kernels ask for the weights: 4 KiB, as
/// the bundled MLP over quads streamed 10–17 % faster than at 2 KiB (at
/// 8 KiB slower; its compute per byte is lower, so it needs the bytes
/// sooner).
const PREFETCH_BYTES: usize = 4096;

/// Four blocks of one row: their 128 weights as unsigned bytes (`lo`:
/// weights 0–15 of each block, `hi`: 16–31), their scales `d` and `Q4_1`'s
/// minima `m`.
struct Group {
    lo: __m512i,
    hi: __m512i,
    d: __m128,
    m: __m128,
}

/// The low `n` bits set (`n` ≤ 64).
#[inline(always)]
fn low_bits(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// Group `g` of a planar row of `k` blocks at `r`; `t` of its blocks are in
/// the row (4, or fewer in a last group: the rest read as zeros, masked
/// loads, nothing read past the row).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_weights<const F: u8>(r: *const u8, k: usize, g: usize, t: usize) -> Group {
    let format = format_of(F);
    let i = 4 * g;
    let whole = t == 4;
    // `t` f16 values at `p`.
    let halves = |p: *const u8| {
        if whole {
            _mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i))
        } else {
            _mm_cvtph_ps(_mm_maskz_loadu_epi16(low_bits(t) as u8, p as *const i16))
        }
    };
    let d = halves(r.add(2 * i));
    let qs_at = k * match format {
        QFormat::Q4_0 => 2,
        QFormat::Q4_1 => 4,
        QFormat::Q5_0 => 6,
        QFormat::Q8_0 | QFormat::Q3_0 => unreachable!("{format} rows have no planar kernel"),
    };
    let p = r.add(qs_at + 16 * i);
    let q = if whole {
        _mm512_loadu_si512(p as *const __m512i)
    } else {
        _mm512_maskz_loadu_epi8(low_bits(16 * t), p as *const i8)
    };
    let nib = _mm512_set1_epi8(0x0f);
    let mut lo = _mm512_and_si512(q, nib);
    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), nib);
    if format == QFormat::Q5_0 {
        // The fifth bits of weights 0–15 of the four blocks, then of
        // weights 16–31, as `lo` and `hi` hold the weights: in a whole
        // group stored so ([`super::planar`]), two 64-bit masks; in a last
        // group each block's u32, shuffled into that order.
        let p = r.add(2 * k + 4 * i);
        let (lo_bits, hi_bits) = if whole {
            let bits = p as *const u64;
            (bits.read_unaligned(), bits.add(1).read_unaligned())
        } else {
            let qh = _mm_maskz_loadu_epi32(low_bits(t) as u8, p as *const i32);
            let order = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
            let halves = _mm_shuffle_epi8(qh, order);
            (
                _mm_cvtsi128_si64(halves) as u64,
                _mm_extract_epi64::<1>(halves) as u64,
            )
        };
        let bit = _mm512_set1_epi8(0x10);
        lo = _mm512_mask_add_epi8(lo, lo_bits, lo, bit);
        hi = _mm512_mask_add_epi8(hi, hi_bits, hi, bit);
    }
    let m = if format == QFormat::Q4_1 {
        halves(r.add(2 * k + 2 * i))
    } else {
        _mm_setzero_ps()
    };
    Group { lo, hi, d, m }
}

/// The activations that meet group `g`'s weights: `y0`/`y1` against `lo`/`hi`,
/// their scales per i32 lane, the sums' starting offsets, and `Q4_1`'s
/// per-block `s = d·Σq`.
struct XGroup {
    y0: __m512i,
    y1: __m512i,
    d: __m512,
    init: __m512i,
    s: __m128,
}

/// The i32 offset per block, as a power of two, that makes the weights
/// unsigned (as in [`super::x86_vnni`]).
const fn offset_shift(format: QFormat) -> i32 {
    match format {
        QFormat::Q4_0 => 3,
        QFormat::Q5_0 => 4,
        QFormat::Q8_0 | QFormat::Q4_1 | QFormat::Q3_0 => 0,
    }
}

/// The activations of group `g`, `t` of whose blocks are in the row (the
/// planar arrays hold whole groups, zeros after the last block; `s` is
/// read masked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn x_group<const F: u8>(x: &Q8Act, g: usize, t: usize) -> XGroup {
    let format = format_of(F);
    let q = x.qn.as_ptr().add(128 * g);
    let (init, s) = if format == QFormat::Q4_1 {
        let sp = x.s.as_ptr().add(4 * g);
        let s = if t == 4 {
            _mm_loadu_ps(sp)
        } else {
            _mm_maskz_loadu_ps(low_bits(t) as u8, sp)
        };
        (_mm512_setzero_si512(), s)
    } else {
        let shift = _mm_cvtsi32_si128(offset_shift(format));
        let c = _mm512_loadu_si512(x.corr16.as_ptr().add(16 * g) as *const __m512i);
        (_mm512_sll_epi32(c, shift), _mm_setzero_ps())
    };
    XGroup {
        y0: _mm512_loadu_si512(q as *const __m512i),
        y1: _mm512_loadu_si512(q.add(64) as *const __m512i),
        d: _mm512_loadu_ps(x.d16.as_ptr().add(16 * g)),
        init,
        s,
    }
}

/// Group `w` times its activations `x`, added into `acc` (and `Q4_1`'s
/// `m·s` into `off`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_dot<const F: u8>(w: &Group, x: &XGroup, acc: &mut __m512, off: &mut __m128) {
    let lanes = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    let s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x.init, w.lo, x.y0), w.hi, x.y1);
    let dw = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(w.d));
    *acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, x.d), _mm512_cvtepi32_ps(s), *acc);
    if format_of(F) == QFormat::Q4_1 {
        *off = _mm_fmadd_ps(w.m, x.s, *off);
    }
}

/// A row's sums finished: the two accumulators, then the offsets.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn finish(acc: [__m512; 2], off: __m128) -> f32 {
    let o = _mm_add_ps(off, _mm_movehl_ps(off, off));
    let o = _mm_add_ss(o, _mm_movehdup_ps(o));
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + _mm_cvtss_f32(o)
}

/// `step(g, g % 2, 4)` for each whole group of a row of `k` blocks, two
/// at a time (so that the accumulator index is a constant in each call),
/// then `step(g, g % 2, t)` for a last group of `t < 4` blocks.
#[inline(always)]
fn groups_of(k: usize, step: &mut impl FnMut(usize, usize, usize)) {
    let (groups, mut g) = (k / 4, 0);
    while g + 2 <= groups {
        step(g, 0, 4);
        step(g + 1, 1, 4);
        g += 2;
    }
    if g < groups {
        step(g, 0, 4);
        g += 1;
    }
    if !k.is_multiple_of(4) {
        step(g, g % 2, k % 4);
    }
}

/// `rows[j] · x` for `R` planar rows of one format, the activations loaded
/// once per group.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dots<const F: u8, const R: usize>(rows: [&[u8]; R], x: &Q8Act) -> [f32; R] {
    let format = format_of(F);
    let bb = format.block_bytes();
    let k = rows[0].len() / bb;
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mut off = [_mm_setzero_ps(); R];
    // Group `g` into accumulator `p` (`g % 2`, a constant where it is called).
    let mut step = |g: usize, p: usize, t: usize| {
        let xg = x_group::<F>(x, g, t);
        for j in 0..R {
            let r = rows[j].as_ptr();
            let ahead = (r.add(4 * g * bb) as *const i8).wrapping_add(PREFETCH_BYTES);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            let w = group_weights::<F>(r, k, g, t);
            group_dot::<F>(&w, &xg, &mut acc[j][p], &mut off[j]);
        }
    };
    groups_of(k, &mut step);
    std::array::from_fn(|j| finish(acc[j], off[j]))
}

/// `row · x` for a planar row.
///
/// # Safety
/// The AVX-512 VNNI kernels are available and `x` holds the planar arrays
/// ([`Q8Act::has_planar`]); `row` holds `x.len() / 32` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot(format: QFormat, row: &[u8], x: &Q8Act) -> f32 {
    let [v] = match format {
        QFormat::Q4_0 => dots::<0, 1>([row], x),
        QFormat::Q4_1 => dots::<1, 1>([row], x),
        QFormat::Q5_0 => dots::<2, 1>([row], x),
        QFormat::Q8_0 => [super::x86_vnni::dot(format, row, x)],
        QFormat::Q3_0 => [super::x86_vnni::dot(format, &gathered(format, row), x)],
    };
    v
}

/// `(r0 · x, r1 · x)` for two planar rows of one format.
///
/// # Safety
/// As [`dot`], for each row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot2(format: QFormat, r0: &[u8], r1: &[u8], x: &Q8Act) -> (f32, f32) {
    let [a, b] = match format {
        QFormat::Q4_0 => dots::<0, 2>([r0, r1], x),
        QFormat::Q4_1 => dots::<1, 2>([r0, r1], x),
        QFormat::Q5_0 => dots::<2, 2>([r0, r1], x),
        QFormat::Q8_0 => {
            let (a, b) = super::x86_vnni::dot2(format, r0, r1, x);
            [a, b]
        }
        QFormat::Q3_0 => {
            let (r0, r1) = (gathered(format, r0), gathered(format, r1));
            let (a, b) = super::x86_vnni::dot2(format, &r0, &r1, x);
            [a, b]
        }
    };
    (a, b)
}

/// `[row · x[t]]` for four tokens: each group unpacked once.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot4_format<const F: u8>(row: &[u8], xs: [&Q8Act; 4]) -> [f32; 4] {
    let format = format_of(F);
    let k = row.len() / format.block_bytes();
    let mut acc = [[_mm512_setzero_ps(); 2]; 4];
    let mut off = [_mm_setzero_ps(); 4];
    let mut step = |g: usize, p: usize, t: usize| {
        let w = group_weights::<F>(row.as_ptr(), k, g, t);
        for j in 0..4 {
            let xg = x_group::<F>(xs[j], g, t);
            group_dot::<F>(&w, &xg, &mut acc[j][p], &mut off[j]);
        }
    };
    groups_of(k, &mut step);
    std::array::from_fn(|j| finish(acc[j], off[j]))
}

/// `[row · x[t]]` for four tokens' activations.
///
/// # Safety
/// As [`dot`], for each `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot4(format: QFormat, row: &[u8], xs: [&Q8Act; 4]) -> [f32; 4] {
    match format {
        QFormat::Q4_0 => dot4_format::<0>(row, xs),
        QFormat::Q4_1 => dot4_format::<1>(row, xs),
        QFormat::Q5_0 => dot4_format::<2>(row, xs),
        QFormat::Q8_0 => super::x86_vnni::dot4(format, row, xs),
        QFormat::Q3_0 => super::x86_vnni::dot4(format, &gathered(format, row), xs),
    }
}
