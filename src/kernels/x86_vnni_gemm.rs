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

/// [`super::tiles::pack_quads_body`] on AVX-512, to the bit: a quad's
/// sixteen outputs' four bytes are one register; each neuron's values a
/// byte plane of it, scaled; the rounded bytes put back in their planes.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL, and F16C ([`available`] implies
/// them).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(crate) unsafe fn pack_quads<'a>(
    tile: &mut Tile,
    quad: &dyn Fn(usize) -> &'a [u8],
    (blocks, b, half): (usize, usize, usize),
    k: usize,
) {
    use super::blocks::ROUND;
    assert!(k.is_multiple_of(QK) && half < 2 && b < blocks);
    let groups = k / QK;
    tile.reset(groups, false);
    let flip = _mm512_set1_epi32(0x8080_8080u32 as i32);
    let (round, lo, hi) = (
        _mm512_set1_ps(ROUND),
        _mm512_set1_ps(-127.0),
        _mm512_set1_ps(127.0),
    );
    let mut v = [_mm512_setzero_ps(); QK];
    for gi in 0..groups {
        let mut amax = _mm512_setzero_ps();
        for g in 0..QK / 4 {
            let t = quad(gi * QK / 4 + g);
            let at = 8 * blocks + 128 * b + 64 * half;
            assert!(t.len() >= at + 64 && t.len() >= 8 * blocks);
            let w = _mm512_xor_si512(
                _mm512_loadu_si512(t.as_ptr().add(at) as *const __m512i),
                flip,
            );
            let h: [u16; 8] = std::array::from_fn(|j| {
                let s = 2 * blocks * (j % 4) + 2 * b;
                u16::from_le_bytes([t[s], t[s + 1]])
            });
            let d4 = _mm_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i));
            let d: [f32; 4] = std::mem::transmute(d4);
            for (j, &dj) in d.iter().enumerate() {
                // Byte `j` of each lane, sign-extended: the neuron's codes.
                let c = match j {
                    0 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(w)),
                    1 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(w)),
                    2 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(w)),
                    _ => _mm512_srai_epi32::<24>(w),
                };
                let x = _mm512_mul_ps(_mm512_set1_ps(dj), _mm512_cvtepi32_ps(c));
                amax = _mm512_max_ps(_mm512_abs_ps(x), amax);
                v[4 * g + j] = x;
            }
        }
        let d = _mm512_div_ps(amax, _mm512_set1_ps(127.0));
        let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(d, _mm512_setzero_ps());
        let id = _mm512_maskz_div_ps(positive, _mm512_set1_ps(1.0), d);
        _mm512_storeu_ps(tile.d.as_mut_ptr().add(gi * TILE), d);
        let out = tile.w.as_mut_ptr().add(gi * QK * TILE);
        for g in 0..QK / 4 {
            let mut lane = _mm512_setzero_si512();
            for j in 0..4 {
                let r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v[4 * g + j], id), round), round);
                let q = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi));
                let u = _mm512_and_si512(
                    _mm512_add_epi32(q, _mm512_set1_epi32(128)),
                    _mm512_set1_epi32(0xff),
                );
                lane = _mm512_or_si512(lane, _mm512_sllv_epi32(u, _mm512_set1_epi32(8 * j as i32)));
            }
            _mm512_storeu_si512(out.add(g * 64) as *mut __m512i, lane);
        }
    }
}
