//! The AVX-512 VNNI kernel over a quad's tile ([`super::quads`]): per
//! group of up to 16 blocks the four neurons' coefficients are rounded in
//! vector registers (one lane per block), then per block two 64-byte loads
//! (outputs 0–15 and 16–31, four neurons' bytes each), two `vpdpbusd` and
//! one multiply-add each into `y`. Equal to
//! [`super::quads::axpy_tile_portable`] to the bit for finite scales.
//! Also the AVX2 [`interleave`] / [`deinterleave`] of one block's four rows
//! that making and unmaking quads runs on.

use super::blocks::{QK, QUAD};
use std::arch::x86_64::*;

/// Blocks whose coefficients are rounded at once (one per f32 lane).
const GROUP: usize = 16;

/// `y += Σ_j a_j · down_j` over a tile.
///
/// # Safety
/// [`super::x86_vnni::available`] is true; the tile holds `y.len() / 32`
/// blocks of four rows. `next` is only prefetched (a hint, never read).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn axpy_tile(a: [f32; QUAD], tile: &[u8], next: *const u8, y: &mut [f32]) {
    let blocks = y.len() / QK;
    let t = tile.as_ptr();
    let quants = t.add(8 * blocks);
    let yp = y.as_mut_ptr();
    let (mut packed, mut corr, mut sigma) = ([0i32; GROUP], [0i32; GROUP], [0f32; GROUP]);
    let byte = _mm512_set1_epi32(0xff);
    let mut g0 = 0;
    while g0 < blocks {
        let n = GROUP.min(blocks - g0);
        let mask = (((1u32 << n) - 1) & 0xffff) as u16;
        // Lane b: block g0 + b. c_j = a_j·d_j, their largest |c|, k_j.
        let mut c = [_mm512_setzero_ps(); QUAD];
        let mut m = _mm512_setzero_ps();
        for (j, cj) in c.iter_mut().enumerate() {
            let d = _mm256_maskz_loadu_epi16(mask, t.add(2 * blocks * j + 2 * g0) as *const i16);
            *cj = _mm512_mul_ps(_mm512_cvtph_ps(d), _mm512_set1_ps(a[j]));
            m = _mm512_max_ps(m, _mm512_abs_ps(*cj));
        }
        let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(m, _mm512_setzero_ps());
        let inv = _mm512_maskz_div_ps(positive, _mm512_set1_ps(127.0), m);
        let mut pk = _mm512_setzero_si512();
        let mut sum = _mm512_setzero_si512();
        for (j, &cj) in c.iter().enumerate() {
            let kj = _mm512_cvtps_epi32(_mm512_mul_ps(cj, inv));
            let shift = _mm_cvtsi32_si128(8 * j as i32);
            pk = _mm512_or_si512(pk, _mm512_sll_epi32(_mm512_and_si512(kj, byte), shift));
            sum = _mm512_add_epi32(sum, kj);
        }
        _mm512_storeu_si512(packed.as_mut_ptr() as *mut __m512i, pk);
        _mm512_storeu_si512(
            corr.as_mut_ptr() as *mut __m512i,
            _mm512_slli_epi32::<7>(sum),
        );
        _mm512_storeu_ps(
            sigma.as_mut_ptr(),
            _mm512_mul_ps(m, _mm512_set1_ps(1.0 / 127.0)),
        );
        for b in 0..n {
            let blk = g0 + b;
            // Two lines of what follows the tile per block: the stream
            // does not stall behind it.
            let ahead = (next as *const i8).wrapping_add(128 * blk);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            let q = quants.add(128 * blk);
            let kv = _mm512_set1_epi32(packed[b]);
            let off = _mm512_set1_epi32(corr[b]);
            let s = _mm512_set1_ps(sigma[b]);
            let zero = _mm512_setzero_si512();
            let yq = yp.add(QK * blk);
            for (h, at) in [(0, 0), (16, 64)] {
                let w = _mm512_loadu_si512(q.add(at) as *const __m512i);
                let z = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, w, kv), off);
                let yv = _mm512_loadu_ps(yq.add(h));
                _mm512_storeu_ps(yq.add(h), _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(z), yv));
            }
        }
        g0 += n;
    }
}

/// Block `blk`'s weights of four rows (`rows[j]`: 32 bytes each) into a
/// tile's 128 bytes at `out` (output `i`'s four bytes together, sign bits
/// flipped): two rounds of byte and word unpacking, then the 128-bit
/// halves put in output order.
///
/// # Safety
/// AVX2 is available; each row has 32 bytes, `out` 128.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn interleave(rows: [*const u8; QUAD], out: *mut u8) {
    let flip = _mm256_set1_epi8(-128);
    let a = _mm256_xor_si256(_mm256_loadu_si256(rows[0] as *const __m256i), flip);
    let b = _mm256_xor_si256(_mm256_loadu_si256(rows[1] as *const __m256i), flip);
    let c = _mm256_xor_si256(_mm256_loadu_si256(rows[2] as *const __m256i), flip);
    let d = _mm256_xor_si256(_mm256_loadu_si256(rows[3] as *const __m256i), flip);
    let (ab_lo, ab_hi) = (_mm256_unpacklo_epi8(a, b), _mm256_unpackhi_epi8(a, b));
    let (cd_lo, cd_hi) = (_mm256_unpacklo_epi8(c, d), _mm256_unpackhi_epi8(c, d));
    // Per 128-bit half: outputs 0–3 / 16–19, 4–7 / 20–23, 8–11 / 24–27, 12–15 / 28–31.
    let w0 = _mm256_unpacklo_epi16(ab_lo, cd_lo);
    let w1 = _mm256_unpackhi_epi16(ab_lo, cd_lo);
    let w2 = _mm256_unpacklo_epi16(ab_hi, cd_hi);
    let w3 = _mm256_unpackhi_epi16(ab_hi, cd_hi);
    let o = out as *mut __m256i;
    _mm256_storeu_si256(o, _mm256_permute2x128_si256::<0x20>(w0, w1));
    _mm256_storeu_si256(o.add(1), _mm256_permute2x128_si256::<0x20>(w2, w3));
    _mm256_storeu_si256(o.add(2), _mm256_permute2x128_si256::<0x31>(w0, w1));
    _mm256_storeu_si256(o.add(3), _mm256_permute2x128_si256::<0x31>(w2, w3));
}

/// [`interleave`] undone: a tile's 128 bytes of one block back into four
/// rows of 32 bytes (sign bits flipped back).
///
/// # Safety
/// AVX2 is available; `tile` has 128 bytes, each row 32.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn deinterleave(tile: *const u8, rows: [*mut u8; QUAD]) {
    let flip = _mm256_set1_epi8(-128);
    // Within each 16 bytes (four outputs × four rows): the rows' bytes together.
    let by_row = _mm256_setr_epi8(
        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10,
        14, 3, 7, 11, 15,
    );
    let t = tile as *const __m256i;
    // v[k]: outputs 8k..8k+8, as row 0's four, row 1's four, … per half.
    let mut v = [_mm256_setzero_si256(); 4];
    for (k, vk) in v.iter_mut().enumerate() {
        *vk = _mm256_shuffle_epi8(_mm256_xor_si256(_mm256_loadu_si256(t.add(k)), flip), by_row);
    }
    // Dwords: v[k] holds [r0 r1 r2 r3 | r0 r1 r2 r3] for outputs 8k..8k+4
    // and 8k+4..8k+8. Row j = dword j of each half of v[0..4], in order.
    let lo01 = _mm256_unpacklo_epi32(v[0], v[1]); // r0a r0b r1a r1b (per half)
    let hi01 = _mm256_unpackhi_epi32(v[0], v[1]); // r2a r2b r3a r3b
    let lo23 = _mm256_unpacklo_epi32(v[2], v[3]);
    let hi23 = _mm256_unpackhi_epi32(v[2], v[3]);
    // Per half: r0 of v0,v1,v2,v3 | r1 of …  (a = first, b = second half of 8).
    let r01 = [
        _mm256_unpacklo_epi64(lo01, lo23),
        _mm256_unpackhi_epi64(lo01, lo23),
    ];
    let r23 = [
        _mm256_unpacklo_epi64(hi01, hi23),
        _mm256_unpackhi_epi64(hi01, hi23),
    ];
    // Each rXX[j] holds row j's outputs 0–3, 8–11, 16–19, 24–27 in the low
    // half and 4–7, 12–15, 20–23, 28–31 in the high half: in order, a
    // dword permutation.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (j, v) in [r01[0], r01[1], r23[0], r23[1]].into_iter().enumerate() {
        _mm256_storeu_si256(
            rows[j] as *mut __m256i,
            _mm256_permutevar8x32_epi32(v, order),
        );
    }
}
