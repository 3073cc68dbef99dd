//! The AVX-512 VNNI back end of prefill's quantized matrix product
//! ([`super::gemm_q`]): a tile's sixteen rows in the lanes of one register,
//! up to eight tokens per pass over the tile's blocks, each block's eight
//! groups of four weights kept in registers across the tokens. Results are
//! [`super::gemm_q::tile_product_portable`]'s to the bit.

use super::blocks::{QFormat, QK};
use super::planar::{self, RowForm};
use super::tiles::{Acts, Four, Tile, TILE, TOKENS};
use std::arch::x86_64::*;

pub(crate) use super::cpu_features::avx512_vnni as available;

/// Tokens `t0..t0 + N` over the tile (`MIN`: it has `Q4_1`'s minimums).
/// The tokens are unrolled by hand, each accumulator a register of its
/// own: left to the compiler, the token loop stayed a loop with the
/// accumulators on the stack (a load, a store and the loop's own
/// instructions per token and block). One chain of eight `vpdpbusd` per
/// token: the tokens' chains are independent, which covers its latency.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn run<const N: usize, const MIN: bool>(
    tile: &Tile,
    x: &Acts,
    t0: usize,
    out: &mut [[f32; TILE]; TOKENS],
) {
    let (k, per_token) = (x.k, x.k / QK);
    let (wp, dp, mp) = (tile.w.as_ptr(), tile.d.as_ptr(), tile.m.as_ptr());
    let (qp, ap, sp, dsp) = (x.q.as_ptr(), x.d.as_ptr(), x.start.as_ptr(), x.ds.as_ptr());
    let mut acc = [_mm512_setzero_ps(); TOKENS];
    for b in 0..tile.blocks {
        let wb = wp.add(b * QK * TILE);
        let w: [__m512i; 8] =
            std::array::from_fn(|g| _mm512_loadu_si512(wb.add(g * 64) as *const __m512i));
        let dw = _mm512_loadu_ps(dp.add(b * TILE));
        let mv = if MIN {
            _mm512_loadu_ps(mp.add(b * TILE))
        } else {
            _mm512_setzero_ps()
        };
        macro_rules! token {
            ($t:literal) => {
                if $t < N {
                    let ib = (t0 + $t) * per_token + b;
                    let q = qp.add((t0 + $t) * k + b * QK) as *const i32;
                    let mut s = _mm512_set1_epi32(*sp.add(ib));
                    for (g, &wg) in w.iter().enumerate() {
                        s = _mm512_dpbusd_epi32(
                            s,
                            wg,
                            _mm512_set1_epi32(q.add(g).read_unaligned()),
                        );
                    }
                    let f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), dw);
                    acc[$t] = _mm512_fmadd_ps(f, _mm512_set1_ps(*ap.add(ib)), acc[$t]);
                    if MIN {
                        acc[$t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(*dsp.add(ib)), acc[$t]);
                    }
                }
            };
        }
        token!(0);
        token!(1);
        token!(2);
        token!(3);
        token!(4);
        token!(5);
        token!(6);
        token!(7);
    }
    for (o, a) in out.iter_mut().zip(&acc).take(N) {
        _mm512_storeu_ps(o.as_mut_ptr(), *a);
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
    macro_rules! by_count {
        ($min:literal) => {
            match n {
                8 => run::<8, $min>(tile, x, t0, out),
                7 => run::<7, $min>(tile, x, t0, out),
                6 => run::<6, $min>(tile, x, t0, out),
                5 => run::<5, $min>(tile, x, t0, out),
                4 => run::<4, $min>(tile, x, t0, out),
                3 => run::<3, $min>(tile, x, t0, out),
                2 => run::<2, $min>(tile, x, t0, out),
                1 => run::<1, $min>(tile, x, t0, out),
                _ => {}
            }
        };
    }
    if tile.m.is_empty() {
        by_count!(false)
    } else {
        by_count!(true)
    }
}

/// [`super::tiles::pack_quads_body`] on AVX-512 for both halves of block
/// `b` at once (`tiles[half]`), to the bit: a quad's sixteen outputs' four
/// bytes are one register; each neuron's values a byte plane of it,
/// scaled; the rounded bytes put back in their planes. Both halves in one
/// pass: their lines are adjacent in the quad, and its scales serve both.
/// Under an order each neuron's plane is taken from its own quad's lines.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL, and F16C ([`available`] implies
/// them).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(crate) unsafe fn pack_quads(
    tiles: &mut [Tile; 2],
    fours: &[Four],
    blocks: usize,
    b: usize,
    k: usize,
) {
    assert!(k.is_multiple_of(QK) && b < blocks && fours.len() * 4 >= k);
    let groups = k / QK;
    for tile in tiles.iter_mut() {
        // Every byte and scale written below.
        tile.size(groups, false);
    }
    let flip = _mm512_set1_epi32(0x8080_8080u32 as i32);
    // Byte `4r + j` of each 128-bit lane from byte `4j + r`.
    let transpose = _mm512_broadcast_i32x4(_mm_setr_epi8(
        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
    ));
    // Byte `j` of each 32-bit lane of `w`, sign-extended: a neuron's codes.
    let plane = |w: __m512i, j: usize| match j {
        0 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(w)),
        1 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(w)),
        2 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(w)),
        _ => _mm512_srai_epi32::<24>(w),
    };
    let line = |t: &[u8], at: usize| {
        assert!(t.len() >= at + 64);
        _mm512_xor_si512(
            _mm512_loadu_si512(t.as_ptr().add(at) as *const __m512i),
            flip,
        )
    };
    let mut v = [[_mm512_setzero_ps(); QK]; 2];
    const AHEAD: usize = 32;
    let at = 8 * blocks + 128 * b;
    for gi in 0..groups {
        let mut amax = [_mm512_setzero_ps(); 2];
        for g in 0..QK / 4 {
            // The quad `AHEAD` on: its block's two lines, fetched now
            // (quads lie ~6 KB apart, a stride the hardware does not
            // follow; the scales, shared by the blocks before, are in L2).
            let ahead = gi * QK / 4 + g + AHEAD;
            if ahead < k / 4 {
                let p = fours[ahead].each[0].0.as_ptr().add(at);
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(p.add(64) as *const i8);
            }
            // The four neurons' tiles and lanes. Four stored one after
            // another (in order: one quad's four; arranged, most of a run
            // of chosen neurons) lie in one quad's lines or two
            // neighbours': each output's four bytes are shifted together
            // from them, a lane of each. Otherwise neuron by neuron.
            let Four { each: four, run } = fours[gi * QK / 4 + g];
            let h: [u16; 8] = std::array::from_fn(|j| {
                let (t, lane) = four[j % 4];
                let s = 2 * blocks * lane + 2 * b;
                u16::from_le_bytes([t[s], t[s + 1]])
            });
            let d4 = _mm_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i));
            let d: [f32; 4] = std::mem::transmute(d4);
            let off = four[0].1 as i32;
            for half in 0..2 {
                let at = at + 64 * half;
                // Bytes `off..4` of the first quad's lanes, then `0..off`
                // of the next's.
                let whole = match (run, off) {
                    (false, _) => None,
                    (true, 0) => Some(line(four[0].0, at)),
                    (true, _) => Some(_mm512_or_si512(
                        _mm512_srlv_epi32(line(four[0].0, at), _mm512_set1_epi32(8 * off)),
                        _mm512_sllv_epi32(line(four[3].0, at), _mm512_set1_epi32(32 - 8 * off)),
                    )),
                };
                for (j, &dj) in d.iter().enumerate() {
                    let (t, lane) = four[j];
                    let c = match whole {
                        Some(w) => plane(w, j),
                        // Any lane, without a branch: shifted to the top.
                        None => _mm512_srai_epi32::<24>(_mm512_sllv_epi32(
                            line(t, at),
                            _mm512_set1_epi32(24 - 8 * lane as i32),
                        )),
                    };
                    let x = _mm512_mul_ps(_mm512_set1_ps(dj), _mm512_cvtepi32_ps(c));
                    amax[half] = _mm512_max_ps(_mm512_abs_ps(x), amax[half]);
                    v[half][4 * g + j] = x;
                }
            }
        }
        for (half, tile) in tiles.iter_mut().enumerate() {
            let d = _mm512_div_ps(amax[half], _mm512_set1_ps(127.0));
            let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(d, _mm512_setzero_ps());
            let id = _mm512_maskz_div_ps(positive, _mm512_set1_ps(1.0), d);
            _mm512_storeu_ps(tile.d.as_mut_ptr().add(gi * TILE), d);
            let out = tile.w.as_mut_ptr().add(gi * QK * TILE);
            for g in 0..QK / 4 {
                // Rounded to the nearest, ties to even (the reference's
                // `ROUND` sum; `|v·id| ≤ 127` by the scale, so its clamp
                // never binds), then the four neurons' codes of each output
                // as one lane: packed to bytes (neuron-major within each
                // 128-bit lane) and transposed there.
                let q: [__m512i; 4] = std::array::from_fn(|j| {
                    _mm512_cvtps_epi32(_mm512_mul_ps(v[half][4 * g + j], id))
                });
                let bytes = _mm512_packs_epi16(
                    _mm512_packs_epi32(q[0], q[1]),
                    _mm512_packs_epi32(q[2], q[3]),
                );
                let lane = _mm512_xor_si512(_mm512_shuffle_epi8(bytes, transpose), flip);
                _mm512_storeu_si512(out.add(g * 64) as *mut __m512i, lane);
            }
        }
    }
}

/// True when [`pack_q4`] packs `rows`: `Q4_0`, `Q4_1` and `Q5_0` rows
/// (mixed), planar (the gate and up rows where this back end runs) or
/// whole blocks (the attention projections).
pub(crate) fn packs(rows: &[(QFormat, &[u8])]) -> bool {
    rows.iter()
        .all(|(f, _)| matches!(f, QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0))
}

/// Scales `count` f16, `stride` bytes apart from `src[0]`, into
/// `dst[i · 16 + r]` (a tile's scales of row `r`), sixteen conversions at
/// a time.
#[target_feature(enable = "avx512f,f16c")]
unsafe fn scatter_f16(src: &[u8], stride: usize, count: usize, dst: &mut [f32], r: usize) {
    assert!(count == 0 || src.len() >= stride * (count - 1) + 2);
    assert!(dst.len() >= count * TILE);
    for from in (0..count).step_by(16) {
        let n = 16.min(count - from);
        let mut h = [0u16; 16];
        // Planar scales lie together: sixteen in one load.
        let p = match (stride, n) {
            (2, 16) => src.as_ptr().add(2 * from),
            _ => {
                for (i, hi) in h.iter_mut().enumerate().take(n) {
                    let at = (from + i) * stride;
                    *hi = u16::from_le_bytes([src[at], src[at + 1]]);
                }
                h.as_ptr() as *const u8
            }
        };
        let v: [f32; 16] =
            std::mem::transmute(_mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)));
        for (i, &x) in v.iter().enumerate().take(n) {
            dst[(from + i) * TILE + r] = x;
        }
    }
}

/// [`Tile::pack`] on AVX-512 for `Q4_0`/`Q4_1`/`Q5_0` rows in `form`
/// ([`packs`]), to the bit: per block the sixteen rows' 16 bytes of nibbles
/// (four 512-bit registers) transposed by 32-bit words, so that word `g` of
/// every row is one register; its low nibbles are the tile's group `g`, its
/// high ones group `g + 4`, each with its fifth bits (`Q5_0`: bits
/// `4g..4g + 4` and `16 + 4g..` of the block's `qh`, spread to bit 4 of
/// each byte by one multiplication) plus its row's offset (`c + 128`).
///
/// # Safety
/// The CPU must have AVX-512 F and BW, and F16C ([`available`] implies
/// them).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(crate) unsafe fn pack_q4(tile: &mut Tile, rows: &[(QFormat, &[u8])], form: RowForm, k: usize) {
    assert!(rows.len() <= TILE && k.is_multiple_of(QK) && packs(rows));
    let blocks = k / QK;
    let any_min = rows.iter().any(|(f, _)| *f == QFormat::Q4_1);
    let any_fifth = rows.iter().any(|(f, _)| *f == QFormat::Q5_0);
    // Every byte and scale written below.
    tile.size(blocks, any_min);
    // A missing row reads these nibbles (8: zero in `Q4_0`) for every block.
    static EIGHTS: [u8; 16] = [0x88; 16];
    let mut quants = [(EIGHTS.as_ptr(), 0usize); TILE];
    // Per row its bytes' offset, four times: `Q4_0`'s `c = q − 8`, `Q4_1`'s
    // `c = q`, `Q5_0`'s `c = q − 16`.
    let mut offsets = [0x7878_7878u32; TILE];
    for r in 0..TILE {
        let Some(&(format, row)) = rows.get(r) else {
            for b in 0..blocks {
                tile.d[b * TILE + r] = 0.0;
                if any_min {
                    tile.m[b * TILE + r] = 0.0;
                }
            }
            continue;
        };
        let block_bytes = format.block_bytes();
        let lead = block_bytes - 16;
        assert_eq!(
            row.len(),
            blocks * block_bytes,
            "a row of {k} weights in {format:?}"
        );
        // Planar: every scale, every minimum or fifth bits, then every
        // block's quants; whole blocks: the fields block by block.
        let (quant_at, step, min_at, stride) = match form {
            RowForm::Planar => (lead * blocks, 16, 2 * blocks, 2),
            RowForm::Blocks => (lead, block_bytes, 2, block_bytes),
        };
        quants[r] = (row.as_ptr().add(quant_at), step);
        scatter_f16(row, stride, blocks, &mut tile.d, r);
        match format {
            QFormat::Q4_1 => {
                offsets[r] = 0x8080_8080;
                scatter_f16(&row[min_at..], stride, blocks, &mut tile.m, r);
            }
            QFormat::Q5_0 => offsets[r] = 0x7070_7070,
            _ => {}
        }
        if any_min && format != QFormat::Q4_1 {
            for b in 0..blocks {
                tile.m[b * TILE + r] = 0.0;
            }
        }
    }
    // Block `b`'s fifth bits of the sixteen rows (0 for the others).
    let fifth_bits = |b: usize| {
        let qh: [u32; TILE] = std::array::from_fn(|r| match rows.get(r) {
            Some(&(QFormat::Q5_0, row)) => planar::fifth_bits_at(form, row, blocks, b),
            _ => 0,
        });
        _mm512_loadu_si512(qh.as_ptr() as *const __m512i)
    };
    // Four bits `x & 15` of each lane to bit 4 of its four bytes: the
    // products land in disjoint ranges (no carries), the mask keeps one each.
    let low4 = _mm512_set1_epi32(15);
    let spread = _mm512_set1_epi32(0x0204_0810);
    let bit4 = _mm512_set1_epi32(0x1010_1010);
    let fifth = |qh: __m512i, shift: u32| {
        let x = _mm512_and_si512(_mm512_srlv_epi32(qh, _mm512_set1_epi32(shift as i32)), low4);
        _mm512_and_si512(_mm512_mullo_epi32(x, spread), bit4)
    };
    let offsets = _mm512_loadu_si512(offsets.as_ptr() as *const __m512i);
    let nibble = _mm512_set1_epi8(0x0f);
    // Words 0 and 1 (2 and 3) of rows 0–7 from two registers of four rows each.
    let first = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    let second = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    for b in 0..blocks {
        let load = |r: usize| {
            let (p, step) = quants[r];
            _mm_loadu_si128(p.add(step * b) as *const __m128i)
        };
        let z: [__m512i; 4] = std::array::from_fn(|i| {
            let z = _mm512_castsi128_si512(load(4 * i));
            let z = _mm512_inserti32x4::<1>(z, load(4 * i + 1));
            let z = _mm512_inserti32x4::<2>(z, load(4 * i + 2));
            _mm512_inserti32x4::<3>(z, load(4 * i + 3))
        });
        let (a0, a1) = (
            _mm512_permutex2var_epi32(z[0], first, z[1]),
            _mm512_permutex2var_epi32(z[2], first, z[3]),
        );
        let (c0, c1) = (
            _mm512_permutex2var_epi32(z[0], second, z[1]),
            _mm512_permutex2var_epi32(z[2], second, z[3]),
        );
        let words = [
            _mm512_shuffle_i64x2::<0x44>(a0, a1),
            _mm512_shuffle_i64x2::<0xee>(a0, a1),
            _mm512_shuffle_i64x2::<0x44>(c0, c1),
            _mm512_shuffle_i64x2::<0xee>(c0, c1),
        ];
        let out = tile.w.as_mut_ptr().add(b * QK * TILE);
        let qh = if any_fifth {
            fifth_bits(b)
        } else {
            _mm512_setzero_si512()
        };
        for (g, &w) in words.iter().enumerate() {
            let (mut lo, mut hi) = (
                _mm512_and_si512(w, nibble),
                _mm512_and_si512(_mm512_srli_epi16::<4>(w), nibble),
            );
            if any_fifth {
                lo = _mm512_or_si512(lo, fifth(qh, 4 * g as u32));
                hi = _mm512_or_si512(hi, fifth(qh, 16 + 4 * g as u32));
            }
            _mm512_storeu_si512(
                out.add(g * 64) as *mut __m512i,
                _mm512_add_epi8(lo, offsets),
            );
            _mm512_storeu_si512(
                out.add((g + 4) * 64) as *mut __m512i,
                _mm512_add_epi8(hi, offsets),
            );
        }
    }
}
