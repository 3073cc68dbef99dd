//! The x86-64 back ends of the 2-bit rows ([`super::q2`]): AVX2 (`maddubs`
//! sums pairs of code × activation products in i16, `madd` widens them),
//! and AVX-512 VNNI on 256-bit registers (`vpdpbusd` sums four products
//! into each i32 lane in one instruction). A chunk's 32 bytes of codes
//! load once; shifting by 0, 2, 4, 6 and masking gives its four runs of 32
//! weights, each against 32 consecutive activations.

use std::arch::x86_64::*;

/// A kernel: `Σ q_i·x_i` over a row of codes.
pub(crate) type DotCodes = unsafe fn(&[u8], &[i8]) -> i32;

/// The fastest kernel this CPU runs (VNNI unless `SELECTINFER_KERNELS=avx2`
/// asks for AVX2), or `None` without AVX2.
pub(crate) fn dot_codes() -> Option<DotCodes> {
    if super::x86_vnni::available() {
        Some(dot_codes_vnni)
    } else if super::x86_quant::available() {
        Some(dot_codes_avx2)
    } else {
        None
    }
}

/// Every kernel this CPU runs, by name (for tests).
#[cfg(test)]
pub(crate) fn every_kernel() -> Vec<(&'static str, DotCodes)> {
    let mut all: Vec<(&'static str, DotCodes)> = Vec::new();
    if super::x86_quant::available() {
        all.push(("avx2", dot_codes_avx2));
    }
    if super::x86_vnni::available() {
        all.push(("avx512vnni", dot_codes_vnni));
    }
    all
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
}

/// The four runs of 32 codes of the chunk at `p`, as bytes 0..=3.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn runs(p: *const u8) -> [__m256i; 4] {
    let v = _mm256_loadu_si256(p as *const __m256i);
    let m = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(v, m),
        _mm256_and_si256(_mm256_srli_epi16::<2>(v), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m),
        _mm256_and_si256(_mm256_srli_epi16::<6>(v), m),
    ]
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load(x: *const i8) -> __m256i {
    _mm256_loadu_si256(x as *const __m256i)
}

/// AVX2: per chunk, four `maddubs` (each i16 at most 2·3·127) summed in
/// i16 (at most 3,048), widened once.
///
/// # Safety
/// The CPU has AVX2; `x` holds 4 activations per byte of `codes`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dot_codes_avx2(codes: &[u8], x: &[i8]) -> i32 {
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_si256();
    for c in 0..codes.len() / 32 {
        let w = runs(codes.as_ptr().add(c * 32));
        let xp = x.as_ptr().add(c * 128);
        let p0 = _mm256_maddubs_epi16(w[0], load(xp));
        let p1 = _mm256_maddubs_epi16(w[1], load(xp.add(32)));
        let p2 = _mm256_maddubs_epi16(w[2], load(xp.add(64)));
        let p3 = _mm256_maddubs_epi16(w[3], load(xp.add(96)));
        let s = _mm256_add_epi16(_mm256_add_epi16(p0, p1), _mm256_add_epi16(p2, p3));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s, ones));
    }
    hsum_i32(acc)
}

/// AVX-512 VNNI on 256-bit registers: one `vpdpbusd` per run of 32, each
/// run into its own accumulator (two into one would chain them on the
/// instruction's latency).
///
/// # Safety
/// The CPU has AVX2, AVX512VL and AVX512VNNI; `x` as for [`dot_codes_avx2`].
#[target_feature(enable = "avx2,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_codes_vnni(codes: &[u8], x: &[i8]) -> i32 {
    let mut a = [_mm256_setzero_si256(); 4];
    for c in 0..codes.len() / 32 {
        let w = runs(codes.as_ptr().add(c * 32));
        let xp = x.as_ptr().add(c * 128);
        for j in 0..4 {
            a[j] = _mm256_dpbusd_epi32(a[j], w[j], load(xp.add(32 * j)));
        }
    }
    hsum_i32(_mm256_add_epi32(
        _mm256_add_epi32(a[0], a[1]),
        _mm256_add_epi32(a[2], a[3]),
    ))
}
