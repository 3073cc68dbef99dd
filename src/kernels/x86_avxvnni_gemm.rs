//! The AVX-VNNI back end of prefill's quantized matrix product
//! ([`super::gemm_q`]): the 256-bit `vpdpbusd` of CPUs with VNNI but no
//! AVX-512 (Intel's Alder Lake and later client cores, as in the mini PCs
//! many robots carry). A tile's sixteen rows are two registers of eight;
//! per token and block the token's eight groups of four activations are
//! broadcast once and serve both halves, the weights reloaded from L1
//! (sixteen 256-bit registers cannot hold a block's sixteen as well).
//! Results are [`super::gemm_q::tile_product_portable`]'s to the bit: the
//! same exact integer sums, the same f32 operations in the same order.

use super::blocks::QK;
use super::tiles::{Acts, Tile, TILE, TOKENS};
use std::arch::x86_64::*;

pub(crate) use super::cpu_features::avx_vnni as available;

/// Token `t` over the tile into `out`.
#[inline]
#[target_feature(enable = "avx2,avxvnni,fma")]
unsafe fn token<const MIN: bool>(tile: &Tile, x: &Acts, t: usize, out: &mut [f32; TILE]) {
    let per_token = x.k / QK;
    let (wp, dp, mp) = (tile.w.as_ptr(), tile.d.as_ptr(), tile.m.as_ptr());
    let q = x.q.as_ptr().add(t * x.k);
    let mut acc = [_mm256_setzero_ps(); 2];
    for b in 0..tile.blocks {
        let ib = t * per_token + b;
        let qb = q.add(b * QK) as *const i32;
        let a: [__m256i; 8] =
            std::array::from_fn(|g| _mm256_set1_epi32(qb.add(g).read_unaligned()));
        let (da, start) = (_mm256_set1_ps(x.d[ib]), _mm256_set1_epi32(x.start[ib]));
        let wb = wp.add(b * QK * TILE);
        for (half, acc) in acc.iter_mut().enumerate() {
            let mut s = start;
            for (g, &ag) in a.iter().enumerate() {
                let w = _mm256_loadu_si256(wb.add(g * 64 + half * 32) as *const __m256i);
                s = _mm256_dpbusd_avx_epi32(s, w, ag);
            }
            let dw = _mm256_loadu_ps(dp.add(b * TILE + half * 8));
            let f = _mm256_mul_ps(_mm256_cvtepi32_ps(s), dw);
            *acc = _mm256_fmadd_ps(f, da, *acc);
            if MIN {
                let m = _mm256_loadu_ps(mp.add(b * TILE + half * 8));
                *acc = _mm256_fmadd_ps(m, _mm256_set1_ps(x.ds[ib]), *acc);
            }
        }
    }
    _mm256_storeu_ps(out.as_mut_ptr(), acc[0]);
    _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[1]);
}

/// The tile's product for tokens `t0..t0 + n` (`n ≤ 8`) into `out[..n]`.
///
/// # Safety
/// [`available`] is true; `tile.blocks == x.k / 32`; tokens `t0..t0 + n`
/// exist in `x`.
#[target_feature(enable = "avx2,avxvnni,fma")]
pub(crate) unsafe fn tile_product(
    tile: &Tile,
    x: &Acts,
    t0: usize,
    n: usize,
    out: &mut [[f32; TILE]; TOKENS],
) {
    assert!(tile.blocks * QK == x.k && t0 + n <= x.tokens() && n <= TOKENS);
    for (t, o) in out.iter_mut().enumerate().take(n) {
        if tile.m.is_empty() {
            token::<false>(tile, x, t0 + t, o)
        } else {
            token::<true>(tile, x, t0 + t, o)
        }
    }
}
