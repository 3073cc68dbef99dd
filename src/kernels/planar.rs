//! Quantized rows stored *planar*: a row's blocks with their fields apart
//! (every block's f16 scale `d`, then every `m` (`Q4_1`), then every `qh`
//! (`Q5_0`), then every block's quants), the same bytes as GGUF's blocks
//! ([`super::quant`]), moved, never requantized. The AVX-512 VNNI kernels
//! read four blocks' quants with one 64-byte load and four scales with one
//! conversion, where a row of whole blocks needs two loads, a broadcast and
//! a shift per pair of blocks and one scale load per block (`Q5_0` dot2 in
//! L2: 1.37× as fast, docs/EXPERIMENTS.md). The neuron bundles' gate and up
//! rows take this form in memory where those kernels run
//! ([`crate::kernels::quant_mlp::BundleLayout::rows`]); files keep whole blocks.
//!
//! A row's planar form: field `(offset, len)` of block `i` of `K` blocks is
//! at byte `K·offset + i·len` (the fields are contiguous within a block, so
//! each field's section starts where `K` copies of the fields before it end),
//! except `Q5_0`'s fifth bits in a whole group of four blocks: the four
//! blocks' bits 0–15, then their bits 16–31, two 64-bit masks the kernel
//! loads as they lie (a shuffle and two register moves fewer per group:
//! `Q5_0` dots 8–10 % faster in L2, docs/EXPERIMENTS.md, "A later run, and Q5_0's fifth bits as masks").

use super::quant::{dot, Q8Act, QFormat, QK};
#[cfg(target_arch = "x86_64")]
use super::x86_vnni_planar;

/// How a row's blocks are stored in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowForm {
    /// Block after block, each block's fields together (GGUF's form).
    #[default]
    Blocks,
    /// Each field of every block together (this module).
    Planar,
}

/// A block's fields as `(byte offset, length)`, in storage order. `Q8_0`
/// is one field: its planar form is its block form (kept so: a planar
/// `Q8_0` kernel streamed 7–8 % slower than the block kernel, whose two
/// 32-byte halves already load whole).
pub const fn fields(format: QFormat) -> &'static [(usize, usize)] {
    match format {
        QFormat::Q4_0 => &[(0, 2), (2, 16)],
        QFormat::Q4_1 => &[(0, 2), (2, 2), (4, 16)],
        QFormat::Q5_0 => &[(0, 2), (2, 4), (6, 16)],
        QFormat::Q8_0 => &[(0, 34)],
    }
}

/// True when rows should be made planar: the CPU runs the AVX-512 VNNI
/// kernels, the only ones with a planar form (elsewhere a planar row would
/// be gathered back into blocks for every product), unless
/// `SELECTINFER_ROWS=blocks` asks for whole blocks (to compare the two).
pub fn preferred() -> bool {
    #[cfg(target_arch = "x86_64")]
    if super::x86_vnni::available() {
        return std::env::var("SELECTINFER_ROWS").map_or(true, |v| v != "blocks");
    }
    false
}

/// Where block `i`'s piece of field `(off, len)` lies in a planar row of
/// `k` blocks: `(planar byte, block byte, bytes)`, one piece or two.
/// `Q5_0`'s fifth bits in a whole group of four blocks are stored as the
/// four blocks' low halves (bits 0–15) then their high halves, so that
/// each half loads as one 64-bit mask of the group's 64 weights 0–15 or
/// 16–31 (the order the kernels unpack the quants in); a last group of
/// fewer blocks keeps each block's u32 whole.
#[inline]
fn pieces(
    format: QFormat,
    k: usize,
    i: usize,
    (off, len): (usize, usize),
) -> [(usize, usize, usize); 2] {
    if format == QFormat::Q5_0 && off == 2 && i / 4 < k / 4 {
        let at = 2 * k + 16 * (i / 4) + 2 * (i % 4);
        return [(at, 2, 2), (at + 8, 4, 2)];
    }
    [(k * off + i * len, off, len), (0, 0, 0)]
}

/// `row` (whole blocks) in planar form into `out` (as long as `row`).
pub fn to_planar(format: QFormat, row: &[u8], out: &mut [u8]) {
    let bb = format.block_bytes();
    debug_assert_eq!(row.len(), out.len());
    let k = row.len() / bb;
    for (i, b) in row.chunks_exact(bb).enumerate() {
        for &field in fields(format) {
            for (at, from, n) in pieces(format, k, i, field) {
                out[at..at + n].copy_from_slice(&b[from..from + n]);
            }
        }
    }
}

/// Block `i` of planar `row` in GGUF's form, into `out[..block_bytes]`.
#[inline]
pub fn block_of(format: QFormat, row: &[u8], i: usize, out: &mut [u8; 34]) {
    let k = row.len() / format.block_bytes();
    for &field in fields(format) {
        for (at, to, n) in pieces(format, k, i, field) {
            out[to..to + n].copy_from_slice(&row[at..at + n]);
        }
    }
}

/// Planar `row` back in whole blocks into `out` (as long as `row`).
pub fn to_blocks(format: QFormat, row: &[u8], out: &mut [u8]) {
    let bb = format.block_bytes();
    let mut b = [0u8; 34];
    for (i, o) in out.chunks_exact_mut(bb).enumerate() {
        block_of(format, row, i, &mut b);
        o.copy_from_slice(&b[..bb]);
    }
}

/// Makes every row of `rows` (whole rows of `cols` weights) planar in place.
pub fn make_planar(format: QFormat, cols: usize, rows: &mut [u8]) {
    if fields(format).len() == 1 {
        return;
    }
    let rb = format.row_bytes(cols);
    let mut tmp = vec![0u8; rb];
    for r in rows.chunks_exact_mut(rb) {
        to_planar(format, r, &mut tmp);
        r.copy_from_slice(&tmp);
    }
}

/// `row · x` for a planar row.
#[inline]
pub fn dot_planar(format: QFormat, row: &[u8], x: &Q8Act) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if x.has_planar() {
        // SAFETY: `x` was quantized with the planar arrays, which happens
        // only where the AVX-512 VNNI kernels run; the row holds
        // `x.len() / 32` blocks (checked by the callers).
        return unsafe { x86_vnni_planar::dot(format, row, x) };
    }
    dot(format, &blocks(format, row), x)
}

/// `(r0 · x, r1 · x)` for two planar rows (a neuron's gate and up).
#[inline]
pub fn dot2_planar(format: QFormat, r0: &[u8], r1: &[u8], x: &Q8Act) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if x.has_planar() {
        // SAFETY: as in `dot_planar`.
        return unsafe { x86_vnni_planar::dot2(format, r0, r1, x) };
    }
    (dot_planar(format, r0, x), dot_planar(format, r1, x))
}

/// `[row · x[t]]` for four tokens' activations and a planar row.
#[inline]
pub fn dot4_planar(format: QFormat, row: &[u8], xs: [&Q8Act; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if xs.iter().all(|x| x.has_planar()) {
        // SAFETY: as in `dot_planar`.
        return unsafe { x86_vnni_planar::dot4(format, row, xs) };
    }
    xs.map(|x| dot_planar(format, row, x))
}

/// A planar row gathered back into whole blocks (the slow path for CPUs
/// without planar kernels; rows are made planar only where they run).
fn blocks(format: QFormat, row: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; row.len()];
    to_blocks(format, row, &mut out);
    out
}

/// The activations' planar arrays ([`Q8Act`]'s `qn`, `d16`, `corr16`) for
/// `q`, `d` and the blocks' `Σq`: per group of four blocks, their weights
/// 0–15 then 16–31 (as a planar row's low and high nibbles unpack), each
/// block's `d` over its four i32 lanes, and `-Σq` in the first of them; a
/// last group of fewer blocks padded with zeros.
pub(super) fn planar_acts(q: &[i8], d: &[f32], sums: &[i32]) -> (Vec<i8>, Vec<f32>, Vec<i32>) {
    let groups = d.len().div_ceil(4);
    let mut qn = vec![0; groups * 4 * QK];
    let mut d16 = vec![0.0; groups * 16];
    let mut corr16 = vec![0; groups * 16];
    for (b, &db) in d.iter().enumerate() {
        let (g, j) = (b / 4, b % 4);
        for (h, half) in [0..QK / 2, QK / 2..QK].into_iter().enumerate() {
            let at = g * 4 * QK + h * 2 * QK + j * QK / 2;
            qn[at..at + QK / 2].copy_from_slice(&q[b * QK..][half]);
        }
        d16[16 * g + 4 * j..][..4].fill(db);
        corr16[16 * g + 4 * j] = -sums[b];
    }
    (qn, d16, corr16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::tests::{plain_dequantize, quantize_rows, ALL};
    use crate::kernels::test_data::data;

    #[test]
    fn planar_rows_hold_the_same_bytes_and_come_back_whole() {
        for blocks in [1, 3, 4, 7, 28] {
            let k = blocks * QK;
            for f in ALL {
                let row = quantize_rows(&data(k, 9), k, f);
                let mut p = vec![0u8; row.len()];
                to_planar(f, &row, &mut p);
                let (mut a, mut b) = (p.clone(), row.clone());
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b, "{f}: a permutation of the bytes");
                let same = f == QFormat::Q8_0 || blocks == 1;
                assert_eq!(
                    p == row,
                    same,
                    "{f}: Q8_0 rows and single blocks stay as they are"
                );
                // The scales come first, one f16 per block.
                if blocks > 1 && f != QFormat::Q8_0 {
                    assert_eq!(&p[2..4], &row[f.block_bytes()..f.block_bytes() + 2]);
                }
                let mut back = vec![0u8; row.len()];
                to_blocks(f, &p, &mut back);
                assert_eq!(back, row, "{f}, {blocks} blocks");
                let mut rows = [row.clone(), row.clone()].concat();
                make_planar(f, k, &mut rows);
                assert_eq!(rows, [p.clone(), p].concat());
            }
        }
    }

    #[test]
    fn planar_dots_match_plain_loops_and_each_other_at_odd_lengths() {
        for blocks in [1, 2, 3, 4, 5, 17, 18, 28, 29] {
            let k = blocks * QK;
            let xs: Vec<Q8Act> = (0..4).map(|t| Q8Act::quantize(&data(k, 30 + t))).collect();
            for f in ALL {
                let rows = [
                    quantize_rows(&data(k, 3), k, f),
                    quantize_rows(&data(k, 4), k, f),
                ];
                let planar = rows.clone().map(|r| {
                    let mut p = vec![0u8; r.len()];
                    to_planar(f, &r, &mut p);
                    p
                });
                for x in &xs {
                    let xd: Vec<f32> = (0..k).map(|i| x.q[i] as f32 * x.d[i / QK]).collect();
                    let one = planar.clone().map(|p| dot_planar(f, &p, x));
                    for (r, got) in rows.iter().zip(one) {
                        let want: f64 = plain_dequantize(f, r)
                            .iter()
                            .zip(&xd)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        let tol = 1e-4 * (1.0 + want.abs());
                        assert!(
                            (got as f64 - want).abs() < tol,
                            "{f} {blocks}: {got} vs {want}"
                        );
                    }
                    let two = dot2_planar(f, &planar[0], &planar[1], x);
                    assert_eq!(
                        [two.0, two.1],
                        one,
                        "{f} {blocks}: dot2 is dot's to the bit"
                    );
                }
                let four = dot4_planar(f, &planar[0], [&xs[0], &xs[1], &xs[2], &xs[3]]);
                let one: Vec<f32> = xs.iter().map(|x| dot_planar(f, &planar[0], x)).collect();
                assert_eq!(four.to_vec(), one, "{f} {blocks}: dot4 is dot's to the bit");
            }
        }
    }
}
