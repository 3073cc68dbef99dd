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

use super::blocks::QFormat;

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
pub(crate) const fn fields(format: QFormat) -> &'static [(usize, usize)] {
    match format {
        QFormat::Q3_0 => &[(0, 2), (2, 4), (6, 8)],
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
    super::cpu_features::avx512_vnni()
        && std::env::var("SELECTINFER_ROWS").map_or(true, |v| v != "blocks")
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
pub(crate) fn to_planar(format: QFormat, row: &[u8], out: &mut [u8]) {
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

/// A block's fields, read where they lie: scale `d`, minimum `m` (`Q4_1`,
/// else 0), high bits `qh` (`Q5_0`'s fifth, `Q3_0`'s third, else 0) and
/// quants.
pub(crate) struct Fields<'a> {
    pub d: f32,
    pub m: f32,
    pub qh: u32,
    pub qs: &'a [u8],
}

/// Block `i`'s fields in `row` of `k` blocks stored in `form`, read in
/// place (no copy of the block, as [`block_of`] makes).
#[inline]
pub(crate) fn fields_at(
    format: QFormat,
    form: RowForm,
    row: &[u8],
    k: usize,
    i: usize,
) -> Fields<'_> {
    use super::blocks::f16_at;
    let u32_at = |at: usize| u32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
    if form == RowForm::Blocks || format == QFormat::Q8_0 {
        let b = i * format.block_bytes();
        return match format {
            QFormat::Q3_0 => Fields {
                d: f16_at(row, b),
                m: 0.0,
                qh: u32_at(b + 2),
                qs: &row[b + 6..b + 14],
            },
            QFormat::Q4_0 => Fields {
                d: f16_at(row, b),
                m: 0.0,
                qh: 0,
                qs: &row[b + 2..b + 18],
            },
            QFormat::Q4_1 => Fields {
                d: f16_at(row, b),
                m: f16_at(row, b + 2),
                qh: 0,
                qs: &row[b + 4..b + 20],
            },
            QFormat::Q5_0 => Fields {
                d: f16_at(row, b),
                m: 0.0,
                qh: u32_at(b + 2),
                qs: &row[b + 6..b + 22],
            },
            QFormat::Q8_0 => Fields {
                d: f16_at(row, b),
                m: 0.0,
                qh: 0,
                qs: &row[b + 2..b + 34],
            },
        };
    }
    // Planar: field `(off, len)` of block `i` at `k·off + i·len` ([`pieces`]).
    match format {
        QFormat::Q3_0 => Fields {
            d: f16_at(row, 2 * i),
            m: 0.0,
            qh: u32_at(2 * k + 4 * i),
            qs: &row[6 * k + 8 * i..][..8],
        },
        QFormat::Q4_0 => Fields {
            d: f16_at(row, 2 * i),
            m: 0.0,
            qh: 0,
            qs: &row[2 * k + 16 * i..][..16],
        },
        QFormat::Q4_1 => Fields {
            d: f16_at(row, 2 * i),
            m: f16_at(row, 2 * k + 2 * i),
            qh: 0,
            qs: &row[4 * k + 16 * i..][..16],
        },
        _ => Fields {
            d: f16_at(row, 2 * i),
            m: 0.0,
            qh: fifth_bits_at(form, row, k, i),
            qs: &row[6 * k + 16 * i..][..16],
        },
    }
}

/// The fifth bits `qh` of block `i` of a `Q5_0` row of `k` blocks stored
/// in `form` (alone: the packers read the other fields their own way).
#[inline]
pub(crate) fn fifth_bits_at(form: RowForm, row: &[u8], k: usize, i: usize) -> u32 {
    let u32_at = |at: usize| u32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
    let u16_at = |at: usize| u16::from_le_bytes([row[at], row[at + 1]]) as u32;
    match form {
        RowForm::Blocks => u32_at(i * QFormat::Q5_0.block_bytes() + 2),
        RowForm::Planar if i / 4 < k / 4 => {
            let at = 2 * k + 16 * (i / 4) + 2 * (i % 4);
            u16_at(at) | u16_at(at + 8) << 16
        }
        RowForm::Planar => u32_at(2 * k + 4 * i),
    }
}

/// Block `i` of planar `row` in GGUF's form, into `out[..block_bytes]`.
#[inline]
pub(crate) fn block_of(format: QFormat, row: &[u8], i: usize, out: &mut [u8; 34]) {
    let k = row.len() / format.block_bytes();
    for &field in fields(format) {
        for (at, to, n) in pieces(format, k, i, field) {
            out[to..to + n].copy_from_slice(&row[at..at + n]);
        }
    }
}

/// Planar `row` back in whole blocks into `out` (as long as `row`).
pub(crate) fn to_blocks(format: QFormat, row: &[u8], out: &mut [u8]) {
    let bb = format.block_bytes();
    let mut b = [0u8; 34];
    for (i, o) in out.chunks_exact_mut(bb).enumerate() {
        block_of(format, row, i, &mut b);
        o.copy_from_slice(&b[..bb]);
    }
}

/// A planar row gathered back into whole blocks (the slow path for CPUs
/// and formats without planar kernels; rows are made planar only where
/// they run).
pub(crate) fn gathered(format: QFormat, row: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; row.len()];
    to_blocks(format, row, &mut out);
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::blocks::QK;
    use crate::kernels::test_data::{data, quantize_rows, ALL};

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
}
