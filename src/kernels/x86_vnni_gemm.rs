//! The AVX-512 VNNI back end of prefill's quantized matrix product
//! ([`super::gemm_q`]): a tile's sixteen rows in the lanes of one register,
//! up to eight tokens per pass over the tile's blocks, each block's eight
//! groups of four weights kept in registers across the tokens. Results are
//! [`super::gemm_q::tile_product_portable`]'s to the bit.

use super::blocks::QK;
use super::tiles::{Acts, Tile, TILE, TOKENS};
use std::arch::x86_64::*;

pub(crate) use super::cpu_features::avx512_vnni as available;

/// Tokens `t0..t0 + N` over the tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn run<const N: usize>(tile: &Tile, x: &Acts, t0: usize, out: &mut [[f32; TILE]; TOKENS]) {
    let (k, per_token) = (x.k, x.k / QK);
    let has_min = !tile.m.is_empty();
    let (wp, dp, mp) = (tile.w.as_ptr(), tile.d.as_ptr(), tile.m.as_ptr());
    let (qp, ap, sp, dsp) = (x.q.as_ptr(), x.d.as_ptr(), x.start.as_ptr(), x.ds.as_ptr());
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..tile.blocks {
        let wb = wp.add(b * QK * TILE);
        let w: [__m512i; 8] =
            std::array::from_fn(|g| _mm512_loadu_si512(wb.add(g * 64) as *const __m512i));
        let dw = _mm512_loadu_ps(dp.add(b * TILE));
        let mv = if has_min {
            _mm512_loadu_ps(mp.add(b * TILE))
        } else {
            _mm512_setzero_ps()
        };
        for (t, acc) in acc.iter_mut().enumerate() {
            let ib = (t0 + t) * per_token + b;
            let q = qp.add((t0 + t) * k + b * QK) as *const i32;
            let four = |g: usize| _mm512_set1_epi32(q.add(g).read_unaligned());
            // Two chains of four, for the latency of `vpdpbusd`.
            let mut s0 = _mm512_set1_epi32(*sp.add(ib));
            let mut s1 = _mm512_setzero_si512();
            for g in 0..4 {
                s0 = _mm512_dpbusd_epi32(s0, w[g], four(g));
                s1 = _mm512_dpbusd_epi32(s1, w[g + 4], four(g + 4));
            }
            let s = _mm512_add_epi32(s0, s1);
            let f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), dw);
            *acc = _mm512_fmadd_ps(f, _mm512_set1_ps(*ap.add(ib)), *acc);
            if has_min {
                *acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(*dsp.add(ib)), *acc);
            }
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(out[t].as_mut_ptr(), *acc);
    }
}

/// The tile's product for tokens `t0..t0 + n` (`n ≤ 8`) into `out[..n]`.
///
/// # Safety
/// [`available`] is true; `tile.blocks == x.k / 32`; tokens `t0..t0 + n`
/// exist in `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
pub(crate) unsafe fn tile_product(
    tile: &Tile,
    x: &Acts,
    t0: usize,
    n: usize,
    out: &mut [[f32; TILE]; TOKENS],
) {
    debug_assert!(tile.blocks * QK == x.k && t0 + n <= x.tokens());
    match n {
        8 => run::<8>(tile, x, t0, out),
        7 => run::<7>(tile, x, t0, out),
        6 => run::<6>(tile, x, t0, out),
        5 => run::<5>(tile, x, t0, out),
        4 => run::<4>(tile, x, t0, out),
        3 => run::<3>(tile, x, t0, out),
        2 => run::<2>(tile, x, t0, out),
        1 => run::<1>(tile, x, t0, out),
        _ => {}
    }
}
