//! The tiles of prefill's quantized matrix product ([`super::gemm_q`]):
//! a chunk's activations quantized to 8 bits ([`Acts`]) and sixteen rows of
//! a matrix repacked as unsigned bytes, four consecutive weights of each
//! row in one 32-bit lane ([`Tile`], from ggml blocks or, for a down
//! projection, from f32 weights rounded per 32 neurons). The product's
//! back ends read these; nothing here depends on them.

use super::blocks::{QFormat, QK, QUAD};
use super::planar::{self, RowForm};

/// Rows per tile: the lanes of one 512-bit register of i32.
pub(crate) const TILE: usize = 16;
/// Tokens the kernel runs over a tile's block at once.
pub(crate) const TOKENS: usize = 8;

/// A chunk's activations, each token's row quantized per block of 32 to the
/// nearest of 255 levels (scale `max|x| / 127`, as [`super::blocks::Q8Act`]).
#[derive(Debug, Default)]
pub(crate) struct Acts {
    /// Columns (a multiple of 32).
    pub k: usize,
    /// `[tokens, k]`.
    pub q: Vec<i8>,
    /// `[tokens, k / 32]`: the block's scale.
    pub d: Vec<f32>,
    /// `[tokens, k / 32]`: `-128·Σq`, where the block's i32 sums start.
    pub start: Vec<i32>,
    /// `[tokens, k / 32]`: `d·Σq` (for `Q4_1`'s offset).
    pub ds: Vec<f32>,
}

impl Acts {
    /// Quantizes `x` (`[tokens, k]`, row-major; `k` a multiple of 32).
    pub(crate) fn quantize(x: &[f32], k: usize) -> Self {
        Self::quantize_gathered(x, k, None, k)
    }

    /// Quantizes the rows of `x` (`[tokens, n]`), each row's values taken
    /// in `order` (positions `0..n` of it; `None`: as they lie) and zero
    /// from `n` up to `k` (a multiple of 32, at least `n`). Rows on
    /// rayon's threads (a 2,048-token chunk's down input is 40 MB).
    pub(crate) fn quantize_gathered(x: &[f32], n: usize, order: Option<&[u32]>, k: usize) -> Self {
        use rayon::prelude::*;
        assert!(n > 0 && n <= k && k.is_multiple_of(QK) && x.len().is_multiple_of(n));
        assert!(order.is_none_or(|o| o.len() >= n && o[..n].iter().all(|&i| (i as usize) < n)));
        let tokens = x.len() / n;
        let per_row = k / QK;
        let mut a = Self {
            k,
            q: vec![0; tokens * k],
            d: vec![0.0; tokens * per_row],
            start: vec![0; tokens * per_row],
            ds: vec![0.0; tokens * per_row],
        };
        // In an order: each block's runs of neighbours, copied (an
        // arranged layer keeps most neurons next to their neighbours).
        let runs = order.map(|o| super::gather::Runs::new(o, n, QK));
        let rows = (a.q.par_chunks_mut(k))
            .zip(a.d.par_chunks_mut(per_row))
            .zip(a.start.par_chunks_mut(per_row))
            .zip(a.ds.par_chunks_mut(per_row))
            .zip(x.par_chunks(n));
        rows.with_min_len(4)
            .for_each(|((((qrow, d), start), ds), row)| {
                let mut scratch = [0f32; QK];
                let mut xb;
                for (b, qb) in qrow.chunks_exact_mut(QK).enumerate() {
                    let at = b * QK;
                    let valid = n.saturating_sub(at).min(QK);
                    let block: &[f32] = if valid == QK {
                        match &runs {
                            Some(r) => r.chunk(row, b, &mut scratch),
                            None => &row[at..at + QK],
                        }
                    } else {
                        // The last block: zeros past `n`.
                        xb = [0.0; QK];
                        if valid > 0 {
                            let got = match &runs {
                                Some(r) => r.chunk(row, b, &mut scratch[..valid]),
                                None => &row[at..n],
                            };
                            xb[..valid].copy_from_slice(got);
                        }
                        &xb
                    };
                    let scale = super::blocks::quantize_block(block, qb);
                    let sum: i32 = qb.iter().map(|&v| v as i32).sum();
                    (d[b], start[b], ds[b]) = (scale, -128 * sum, scale * sum as f32);
                }
            });
        a
    }

    pub(crate) fn tokens(&self) -> usize {
        self.q.len() / self.k
    }
}

/// Sixteen rows of a matrix, repacked for the kernel (see `super::gemm_q`).
#[derive(Debug, Default, Clone)]
pub(crate) struct Tile {
    /// Blocks per row.
    pub blocks: usize,
    /// Per block 512 bytes: for each group `g` of four weights (8 per
    /// block), for each row, its weights `4g..4g + 4` as `c + 128`.
    pub w: Vec<u8>,
    /// `[blocks, 16]`: the rows' scales (0 for rows past the matrix).
    pub d: Vec<f32>,
    /// `[blocks, 16]`: `Q4_1`'s minimums; empty when no row has one.
    pub m: Vec<f32>,
}

/// One ggml block's weights (its fields `f`) as unsigned bytes `c + 128`
/// of their centred values `c` (`w = d·c + m`): simple loops over whole
/// blocks, which the compiler vectorises.
#[inline]
fn unsigned(format: QFormat, f: &planar::Fields, u: &mut [u8; QK]) {
    let (lo, hi) = u.split_at_mut(16);
    let qs = f.qs;
    match format {
        QFormat::Q8_0 => {
            for (ui, &q) in u.iter_mut().zip(qs) {
                *ui = q ^ 0x80;
            }
        }
        // `c = q - 8` (`Q4_0`) or `c = q` (`Q4_1`, with its minimum).
        QFormat::Q4_0 | QFormat::Q4_1 => {
            let off = if format == QFormat::Q4_0 { 120 } else { 128 };
            for i in 0..16 {
                lo[i] = (qs[i] & 0x0f) + off;
                hi[i] = (qs[i] >> 4) + off;
            }
        }
        // `c = q - 4`: 2-bit pairs, the third bit of weight `i` in bit `i` of `qh`.
        QFormat::Q3_0 => {
            let qh = f.qh;
            for (i, ui) in u.iter_mut().enumerate() {
                let q = (qs[i % 8] >> (2 * (i / 8))) & 3 | ((qh >> i) as u8 & 1) << 2;
                *ui = q + 124;
            }
        }
        // `c = q - 16`, the fifth bit of weight `i` in bit `i` of `qh`.
        QFormat::Q5_0 => {
            let qh = f.qh;
            for i in 0..16 {
                lo[i] = ((qs[i] & 0x0f) | ((qh >> i) as u8 & 1) << 4) + 112;
                hi[i] = ((qs[i] >> 4) | ((qh >> (i + 16)) as u8 & 1) << 4) + 112;
            }
        }
    }
}

/// Writes row `r`'s 32 unsigned weights `u` of a block into the block's
/// 512 bytes `w`: each group of four at its place among the 16 rows'.
#[inline]
fn scatter(u: &[u8; QK], r: usize, w: &mut [u8]) {
    for (g, four) in u.chunks_exact(4).enumerate() {
        let at = (g * TILE + r) * 4;
        w[at..at + 4].copy_from_slice(four);
    }
}

impl Tile {
    /// Empties the tile for `blocks` blocks per row: every weight `128`
    /// (zero), every scale 0, minimums only `with_min`.
    pub(crate) fn reset(&mut self, blocks: usize, with_min: bool) {
        self.size(blocks, with_min);
        self.w.fill(128);
        self.d.fill(0.0);
        self.m.fill(0.0);
    }

    /// Sizes the tile for `blocks` blocks per row, its contents left as
    /// they were: for a packer that writes every byte and scale.
    pub(crate) fn size(&mut self, blocks: usize, with_min: bool) {
        self.blocks = blocks;
        self.w.resize(blocks * QK * TILE, 128);
        self.d.resize(blocks * TILE, 0.0);
        self.m.resize(if with_min { blocks * TILE } else { 0 }, 0.0);
    }

    /// Packs up to sixteen rows of `k` weights, each `(format, bytes)` in
    /// `form`; the tile's other rows are zero. The portable reference;
    /// `x86_vnni_gemm::pack_q4` packs `Q4_0`/`Q4_1` rows (either form) to
    /// the bit on AVX-512.
    pub(crate) fn pack(&mut self, rows: &[(QFormat, &[u8])], form: RowForm, k: usize) {
        assert!(rows.len() <= TILE && k.is_multiple_of(QK));
        let blocks = k / QK;
        let any_min = rows.iter().any(|(f, _)| *f == QFormat::Q4_1);
        self.reset(blocks, any_min);
        let mut u = [0u8; QK];
        for (r, &(format, bytes)) in rows.iter().enumerate() {
            let bb = format.block_bytes();
            assert_eq!(
                bytes.len(),
                blocks * bb,
                "a row of {k} weights in {format:?}"
            );
            for b in 0..blocks {
                let f = planar::fields_at(format, form, bytes, blocks, b);
                unsigned(format, &f, &mut u);
                self.d[b * TILE + r] = f.d;
                if any_min {
                    self.m[b * TILE + r] = f.m;
                }
                scatter(&u, r, &mut self.w[b * QK * TILE..(b + 1) * QK * TILE]);
            }
        }
    }
}

impl Tile {
    /// Packs outputs `16·half..16·half + 16` of a block of 32 outputs
    /// whose weights `vals[i · k + n]` (f32, output `i`'s `k` neurons
    /// together) contract over the neurons: each output's weights rounded
    /// to 8 bits per 32 neurons (scale `max / 127`, as the activations), so
    /// a down projection, stored neuron by neuron, runs as a tile.
    pub(crate) fn pack_columns(&mut self, vals: &[f32], half: usize, k: usize) {
        assert!(k.is_multiple_of(QK) && vals.len() == k * QK && half < 2);
        let blocks = k / QK;
        self.reset(blocks, false);
        let (mut q, mut u) = ([0i8; QK], [0u8; QK]);
        for b in 0..blocks {
            let w = &mut self.w[b * QK * TILE..(b + 1) * QK * TILE];
            for r in 0..TILE {
                let at = (half * TILE + r) * k + b * QK;
                self.d[b * TILE + r] = super::blocks::quantize_block(&vals[at..at + QK], &mut q);
                for (ui, &qi) in u.iter_mut().zip(&q) {
                    *ui = qi as u8 ^ 0x80;
                }
                scatter(&u, r, w);
            }
        }
    }
}

/// A down projection's neurons in quads: `quad(q)` is quad `q`'s down
/// tile of `blocks` blocks of 32 outputs (per neuron its `f16` scales, then
/// per block 128 bytes, output by output its four neurons' `c + 128`);
/// `order`, when given, names per neuron position of the product (its
/// column of the activations) the stored neuron `i` there — quad `i / 4`,
/// lane `i % 4` (an arranged layer summed in its canonical order). `None`:
/// stored neuron `i` is position `i`.
#[derive(Clone, Copy)]
pub(crate) struct QuadSource<'r> {
    pub quad: &'r (dyn Fn(usize) -> &'r [u8] + Sync),
    pub blocks: usize,
    pub order: Option<&'r [u32]>,
}

impl<'r> QuadSource<'r> {
    /// The tile and lane of the neuron at position `pos`.
    #[inline]
    pub(crate) fn neuron(&self, pos: usize) -> (&'r [u8], usize) {
        let i = self.order.map_or(pos, |o| o[pos] as usize);
        ((self.quad)(i / QUAD), i % QUAD)
    }

    /// Positions `0..k` by four, resolved once for every block the
    /// packers read ([`Four`]).
    pub(crate) fn fours(&self, k: usize) -> Vec<Four<'r>> {
        assert!(k.is_multiple_of(QUAD) && self.order.is_none_or(|o| o.len() >= k));
        (0..k)
            .step_by(QUAD)
            .map(|pos| {
                let stored = |j: usize| self.order.map_or(pos + j, |o| o[pos + j] as usize);
                Four {
                    each: std::array::from_fn(|j| self.neuron(pos + j)),
                    run: (1..QUAD).all(|j| stored(j) == stored(0) + j),
                }
            })
            .collect()
    }
}

/// Four neighbouring positions of a down projection in quads: each
/// neuron's tile and lane; `run`: stored one after another — lanes
/// `each[0].1..4` of one quad then the first lanes of the next (`each[3]`'s),
/// in order a whole quad.
#[derive(Clone, Copy)]
pub(crate) struct Four<'r> {
    pub each: [(&'r [u8], usize); QUAD],
    pub run: bool,
}

/// Packs outputs `16·half..16·half + 16` of block `b` (outputs
/// `32b..32b + 32`) of a down projection whose `k` neurons all lie in
/// quads (`fours`, [`QuadSource::fours`]): each output's weights `d_j·c`
/// rounded to 8 bits per 32 neurons, to the bit as [`Tile::pack_columns`]
/// does from their f32 values, but read in place — in order, a quad's sixteen outputs' four
/// bytes are already a tile's lanes of four. The portable reference;
/// `x86_vnni_gemm::pack_quads` is the AVX-512 one (both halves in one
/// pass over the quads), equal to the bit (the down projection's
/// repacking: 10 % of a 1.5B bench's samples at 256 tokens before, through
/// f32 values, 5 % in place).
pub(crate) fn pack_quads_body(
    tile: &mut Tile,
    fours: &[Four],
    blocks: usize,
    (b, half): (usize, usize),
    k: usize,
) {
    use super::blocks::{f16_at, ROUND};
    assert!(k.is_multiple_of(QK) && half < 2 && b < blocks && fours.len() * QUAD >= k);
    let groups = k / QK;
    tile.reset(groups, false);
    // Per group of 32 neurons: their values, neuron by neuron, 16 outputs each.
    let mut v = [[0f32; TILE]; QK];
    for gi in 0..groups {
        for (n, vn) in v.iter_mut().enumerate() {
            let (t, j) = fours[(gi * QK + n) / QUAD].each[n % QUAD];
            let w = &t[8 * blocks + 128 * b + 64 * half..8 * blocks + 128 * b + 64 * (half + 1)];
            let d = f16_at(t, 2 * blocks * j + 2 * b);
            for r in 0..TILE {
                vn[r] = d * ((w[4 * r + j] ^ 0x80) as i8) as f32;
            }
        }
        let mut amax = [0f32; TILE];
        for vn in &v {
            for (m, &x) in amax.iter_mut().zip(vn) {
                let a = x.abs();
                *m = if a > *m { a } else { *m };
            }
        }
        let (mut d, mut id) = ([0f32; TILE], [0f32; TILE]);
        for r in 0..TILE {
            d[r] = amax[r] / 127.0;
            id[r] = if d[r] > 0.0 { 1.0 / d[r] } else { 0.0 };
        }
        tile.d[gi * TILE..(gi + 1) * TILE].copy_from_slice(&d);
        let out = &mut tile.w[gi * QK * TILE..(gi + 1) * QK * TILE];
        for (n, vn) in v.iter().enumerate() {
            let (g, j) = (n / 4, n % 4);
            for r in 0..TILE {
                let q = ((vn[r] * id[r] + ROUND) - ROUND).clamp(-127.0, 127.0) as i8;
                out[(g * TILE + r) * 4 + j] = q as u8 ^ 0x80;
            }
        }
    }
}
