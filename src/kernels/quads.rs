//! Neuron bundles in *quads*: four consecutive bundles stored as their
//! four gate/up row pairs, then their four `Q8_0` down rows interleaved
//! into one *tile*, so that decode adds the four down rows into `y` with
//! integer dot products (`vpdpbusd`: one i32 lane holds the four neurons'
//! weights of one output) instead of converting every weight to f32. The
//! f32 axpy of a `Q8_0` row is bound by those conversions (18–22 GB/s a
//! core on Zen 4, however it is arranged); a tile runs at 36–39 GB/s
//! (docs/EXPERIMENTS.md). The stream stays in memory order: a quad's gate
//! and up rows, then its tile.
//!
//! The tile holds the rows' own bytes, moved (each weight's sign bit
//! flipped, to the unsigned operand of `vpdpbusd`), never requantized:
//! first the four neurons' f16 scales (neuron `j`'s `blocks` scales
//! together), then per block of 32 outputs 128 bytes: for outputs
//! `0..32`, the four neurons' weights of each output together.
//! [`to_bundles`] gives the bundles back to the bit.
//!
//! The product: per block, the four neurons' coefficients `c_j = a_j·d_j`
//! are rounded to 8 bits against their largest (`k_j`, scale `σ`), the
//! i32 sums `Σ_j k_j·q_j` are exact, and `σ·sum` is added to `y`. That
//! rounding is finer than llama.cpp's (and candle's), which round the
//! whole activation vector entering `down_proj` to 8 bits per 32 (or 256)
//! neurons. [`axpy_tile_portable`] is the reference; the AVX-512 VNNI
//! kernel equals it to the bit for finite scales.

pub(crate) use super::blocks::QUAD;
use super::blocks::{f16_at, QFormat, QK};
#[cfg(target_arch = "x86_64")]
use super::x86_vnni_quads;

/// True when bundles with `Q8_0` down rows should be stored in quads: the
/// CPU runs the AVX-512 VNNI kernels (elsewhere the portable product is
/// slower than a row's axpy), unless `SELECTINFER_ROWS` is `blocks` or
/// `planar` (whole-block rows, or planar gate/up rows with down rows per
/// bundle: to compare).
pub fn preferred() -> bool {
    #[cfg(target_arch = "x86_64")]
    if super::x86_vnni::available() {
        return std::env::var("SELECTINFER_ROWS").map_or(true, |v| v != "blocks" && v != "planar");
    }
    false
}

/// Byte of neuron `j`'s weight `i` (output `32b + i`) in a tile of
/// `blocks` blocks.
#[inline]
fn weight_at(blocks: usize, b: usize, i: usize, j: usize) -> usize {
    8 * blocks + 128 * b + QUAD * i + j
}

/// Four bundles (`bundles`: each `gate_up` bytes of gate and up rows, then
/// a `Q8_0` down row) as a quad in `quad` (as long): the four gate/up
/// pairs, then the tile.
pub(crate) fn to_quad(gate_up: usize, bundles: &[u8], quad: &mut [u8]) {
    let bb = bundles.len() / QUAD;
    let blocks = (bb - gate_up) / QFormat::Q8_0.block_bytes();
    debug_assert_eq!(quad.len(), bundles.len());
    let (pairs, tile) = quad.split_at_mut(QUAD * gate_up);
    let (scales, weights) = tile.split_at_mut(8 * blocks);
    for (j, b) in bundles.chunks_exact(bb).enumerate() {
        pairs[j * gate_up..(j + 1) * gate_up].copy_from_slice(&b[..gate_up]);
        for (blk, block) in b[gate_up..].chunks_exact(34).enumerate() {
            scales[2 * blocks * j + 2 * blk..][..2].copy_from_slice(&block[..2]);
        }
    }
    for (blk, out) in weights.chunks_exact_mut(128).enumerate() {
        let out: &mut [u8; 128] = out.try_into().expect("128 bytes");
        let rows: [&[u8; 32]; QUAD] = std::array::from_fn(|j| {
            let at = j * bb + gate_up + 34 * blk + 2;
            bundles[at..at + 32].try_into().expect("32 bytes")
        });
        #[cfg(target_arch = "x86_64")]
        if super::x86_quant::available() {
            // SAFETY: AVX2 is there; 32 bytes per row, 128 out.
            unsafe { x86_vnni_quads::interleave(rows.map(|r| r.as_ptr()), out.as_mut_ptr()) };
            continue;
        }
        for i in 0..QK {
            for j in 0..QUAD {
                out[QUAD * i + j] = rows[j][i] ^ 0x80;
            }
        }
    }
}

/// A quad back as four bundles, into `bundles` (as long as `quad`).
pub(crate) fn to_bundles(gate_up: usize, quad: &[u8], bundles: &mut [u8]) {
    let bb = quad.len() / QUAD;
    let blocks = (bb - gate_up) / QFormat::Q8_0.block_bytes();
    let (pairs, tile) = quad.split_at(QUAD * gate_up);
    let (scales, weights) = tile.split_at(8 * blocks);
    for (j, b) in bundles.chunks_exact_mut(bb).enumerate() {
        b[..gate_up].copy_from_slice(&pairs[j * gate_up..(j + 1) * gate_up]);
        for (blk, block) in b[gate_up..].chunks_exact_mut(34).enumerate() {
            block[..2].copy_from_slice(&scales[2 * blocks * j + 2 * blk..][..2]);
        }
    }
    for (blk, w) in weights.chunks_exact(128).enumerate() {
        let w: &[u8; 128] = w.try_into().expect("128 bytes");
        let mut rows = [[0u8; 32]; QUAD];
        #[cfg(target_arch = "x86_64")]
        let done = super::x86_quant::available() && {
            let [r0, r1, r2, r3] = &mut rows;
            // SAFETY: AVX2 is there; 128 bytes in, 32 per row out.
            unsafe {
                x86_vnni_quads::deinterleave(w.as_ptr(), [r0, r1, r2, r3].map(|r| r.as_mut_ptr()))
            };
            true
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = false;
        if !done {
            for i in 0..QK {
                for j in 0..QUAD {
                    rows[j][i] = w[QUAD * i + j] ^ 0x80;
                }
            }
        }
        for (j, row) in rows.iter().enumerate() {
            let at = j * bb + gate_up + 34 * blk + 2;
            bundles[at..at + 32].copy_from_slice(row);
        }
    }
}

/// Block `b` (outputs `32b..32b + 32`) of the tile's four down rows,
/// dequantized output by output: `out[i · stride + j]` is neuron `j`'s
/// weight of output `32b + i`.
pub(crate) fn dequantize_block_t(
    tile: &[u8],
    blocks: usize,
    b: usize,
    out: &mut [f32],
    stride: usize,
) {
    let d: [f32; QUAD] = std::array::from_fn(|j| f16_at(tile, 2 * blocks * j + 2 * b));
    let w = &tile[8 * blocks + 128 * b..8 * blocks + 128 * (b + 1)];
    for (i, four) in w.chunks_exact(QUAD).enumerate() {
        let o = &mut out[i * stride..i * stride + QUAD];
        for j in 0..QUAD {
            o[j] = d[j] * ((four[j] ^ 0x80) as i8) as f32;
        }
    }
}

/// Neuron `j`'s down row from a tile, dequantized into `out` (the row's
/// length: `tile.len() / 4 / 34 · 32`).
pub(crate) fn dequantize(tile: &[u8], j: usize, out: &mut [f32]) {
    let blocks = out.len() / QK;
    let weights = &tile[8 * blocks..];
    for (b, o) in out.chunks_exact_mut(QK).enumerate() {
        let d = f16_at(tile, 2 * blocks * j + 2 * b);
        let w: &[u8; 128] = weights[128 * b..128 * (b + 1)]
            .try_into()
            .expect("128 bytes");
        for (i, v) in o.iter_mut().enumerate() {
            *v = d * ((w[QUAD * i + j] ^ 0x80) as i8) as f32;
        }
    }
}

/// Block `b`'s coefficients `a_j·d_j` rounded to 8 bits against their
/// largest: `(k, σ)` with `c_j ≈ σ·k_j` (all zero: zeros). Nearest, ties
/// to even, as `vcvtps2dq`; a non-finite or huge value gives its
/// `0x8000_0000`.
#[inline]
fn coefficients(a: [f32; QUAD], d: [f32; QUAD]) -> ([i32; QUAD], f32) {
    let c: [f32; QUAD] = std::array::from_fn(|j| a[j] * d[j]);
    let m = c.iter().fold(0f32, |m, v| m.max(v.abs()));
    let inv = if m > 0.0 { 127.0 / m } else { 0.0 };
    let k = c.map(|v| {
        let r = (v * inv).round_ties_even();
        if r.abs() < 2_147_483_648.0 {
            r as i32
        } else {
            i32::MIN
        }
    });
    (k, m * (1.0 / 127.0))
}

/// `y += Σ_j a_j · down_j` over a quad's tile (`y`: one f32 per output).
/// `next`: what the caller reads after the tile (a hint for the caches;
/// may be empty).
pub(crate) fn axpy_tile(a: [f32; QUAD], tile: &[u8], next: &[u8], y: &mut [f32]) {
    assert!(
        tile.len() >= QUAD * 34 * (y.len() / QK),
        "a tile of {} bytes for {} outputs",
        tile.len(),
        y.len()
    );
    #[cfg(target_arch = "x86_64")]
    if super::x86_vnni::available() {
        // SAFETY: the kernel's features are there and the tile holds
        // `y.len() / 32` blocks (asserted); prefetches are hints.
        return unsafe { x86_vnni_quads::axpy_tile(a, tile, next.as_ptr(), y) };
    }
    let _ = next;
    axpy_tile_portable(a, tile, y)
}

/// [`axpy_tile`] in plain Rust (every target; the kernel's reference).
pub(crate) fn axpy_tile_portable(a: [f32; QUAD], tile: &[u8], y: &mut [f32]) {
    let blocks = y.len() / QK;
    for (b, yb) in y.chunks_exact_mut(QK).enumerate() {
        let d = std::array::from_fn(|j| f16_at(tile, 2 * blocks * j + 2 * b));
        let (k, sigma) = coefficients(a, d);
        // As the kernel: the weights' bytes are unsigned (`q + 128`), the
        // `k_j` packed as bytes; `128·Σk` comes off the i32 sum.
        let kb = k.map(|v| v as i8 as i32);
        let corr = k
            .iter()
            .fold(0i32, |s, &v| s.wrapping_add(v))
            .wrapping_shl(7);
        for (i, yv) in yb.iter_mut().enumerate() {
            let s = (0..QUAD).fold(0i32, |s, j| {
                s.wrapping_add(tile[weight_at(blocks, b, i, j)] as i32 * kb[j])
            });
            *yv = sigma.mul_add(s.wrapping_sub(corr) as f32, *yv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::{plain_dequantize, quantize_rows};

    /// Four bundles of `gate_up` bytes (numbered) and a real `Q8_0` down
    /// row of `blocks` blocks each.
    fn bundles(gate_up: usize, blocks: usize, seed: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut out = Vec::new();
        let mut downs = Vec::new();
        for j in 0..QUAD {
            let w: Vec<f32> = (0..blocks * QK)
                .map(|i| (((i * 37 + j * 11 + seed) % 97) as f32 - 48.0) * 0.013 * (1 + j) as f32)
                .collect();
            let down = quantize_rows(&w, blocks * QK, QFormat::Q8_0);
            out.extend((0..gate_up).map(|i| (i + 7 * j) as u8));
            out.extend_from_slice(&down);
            downs.push(down);
        }
        (out, downs)
    }

    #[test]
    fn quads_hold_the_bundles_bytes_and_give_them_back() {
        for (gate_up, blocks) in [(0, 1), (36, 2), (44, 5), (40, 18), (1232, 28)] {
            let (b, downs) = bundles(gate_up, blocks, blocks);
            let mut q = vec![0u8; b.len()];
            to_quad(gate_up, &b, &mut q);
            let mut back = vec![0u8; b.len()];
            to_bundles(gate_up, &q, &mut back);
            assert_eq!(back, b, "{blocks} blocks");
            let tile = &q[QUAD * gate_up..];
            for (j, down) in downs.iter().enumerate() {
                assert_eq!(
                    &q[j * gate_up..(j + 1) * gate_up],
                    &b[j * (b.len() / 4)..][..gate_up]
                );
                let mut out = vec![0f32; blocks * QK];
                dequantize(tile, j, &mut out);
                assert_eq!(out, plain_dequantize(QFormat::Q8_0, down), "row {j}");
            }
        }
    }

    #[test]
    fn the_tile_product_follows_plain_loops_within_its_rounding() {
        for blocks in [1, 3, 17, 18, 28] {
            let (b, downs) = bundles(8, blocks, 3 * blocks);
            let mut q = vec![0u8; b.len()];
            to_quad(8, &b, &mut q);
            let tile = &q[QUAD * 8..];
            let w: Vec<Vec<f32>> = downs
                .iter()
                .map(|d| plain_dequantize(QFormat::Q8_0, d))
                .collect();
            for a in [[0.5, -1.25, 0.0, 3.0], [1e-3, 2.0, -2.0, 0.7], [0.0; 4]] {
                let y0: Vec<f32> = (0..blocks * QK).map(|i| (i % 5) as f32 * 0.1).collect();
                let mut y = y0.clone();
                axpy_tile_portable(a, tile, &mut y);
                let mut fast = y0.clone();
                axpy_tile(a, tile, &[], &mut fast);
                assert_eq!(fast, y, "{blocks} blocks: the kernel equals the reference");
                for (h, (&got, &start)) in y.iter().zip(&y0).enumerate() {
                    let blk = h / QK * QK;
                    // Half a step (1/254 of the largest |a_j·d_j|) per
                    // weight of at most 127 steps, four weights.
                    let largest = (0..QUAD)
                        .map(|j| {
                            let top = w[j][blk..blk + QK].iter().fold(0f32, |m, v| m.max(v.abs()));
                            (a[j] * top).abs() as f64
                        })
                        .fold(0f64, f64::max);
                    let want: f64 =
                        start as f64 + (0..QUAD).map(|j| a[j] as f64 * w[j][h] as f64).sum::<f64>();
                    let bound = 2.0 * largest / 127.0 * 1.0001 + 1e-5 * want.abs() + 1e-6;
                    let err = (got as f64 - want).abs();
                    assert!(
                        err <= bound,
                        "{blocks} blocks, {a:?}, output {h}: {err} > {bound}"
                    );
                }
            }
        }
    }
}
