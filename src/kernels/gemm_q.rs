//! Prefill's quantized matrix product: `out[t][r] = row_r · x_t` for every
//! token `t` of a chunk and every row `r` of a ggml-block matrix, on 8-bit
//! activations, as llamafile's tinyBLAS and ggml's repacked `gemm` kernels
//! do it rather than one row-dot per token.
//!
//! The rows go sixteen at a time into a [`Tile`] (once per chunk, the
//! weights as unsigned bytes `c + 128` of their centred values `c`,
//! interleaved so that one 512-bit register holds four consecutive weights
//! of each of the sixteen rows); the tokens' activations are quantized once
//! per chunk to [`Acts`] (per block of 32: `q` signed bytes, scale `d`,
//! `Σq`). A block of the product is then, per token, eight `vpdpbusd` with
//! the token's four activations broadcast, started at `-128·Σq` so the
//! sum is exact, one conversion and one multiply-add by the rows' scales
//! times the token's: sixteen rows' results in one register. `Q4_1`'s
//! `m·d·Σq` is one more multiply-add. The AVX-512 VNNI back end is
//! `x86_vnni_gemm`; [`tile_product_portable`] is the reference every back
//! end matches to the bit (the same integer sums, the same f32 operations
//! in the same order).
//!
//! [`matmul`] splits the rows' tiles over rayon's threads (as the rest of
//! prefill); each thread packs its tile into its own buffer and runs it
//! over every token, eight at a time.

use super::blocks::{QFormat, QK};
use super::planar::RowForm;
pub(crate) use super::tiles::Acts;
pub(crate) use super::tiles::QuadSource;
use super::tiles::{Four, Tile, TILE, TOKENS};
use std::cell::RefCell;

/// `out[t · stride + r] = Σ_b (d_r·d_t·Σ (c − 0)·q + m_r·d_t·Σq)` for the
/// tile's 16 rows and tokens `t0..t0 + n` (`n ≤ TOKENS`): the reference.
pub(crate) fn tile_product_portable(
    tile: &Tile,
    x: &Acts,
    t0: usize,
    n: usize,
    out: &mut [[f32; TILE]; TOKENS],
) {
    let k = x.k;
    for (t, o) in out.iter_mut().enumerate().take(n) {
        let tok = t0 + t;
        *o = [0.0; TILE];
        for b in 0..tile.blocks {
            let q = &x.q[tok * k + b * QK..tok * k + (b + 1) * QK];
            let (da, start, ds) = (
                x.d[tok * k / QK + b],
                x.start[tok * k / QK + b],
                x.ds[tok * k / QK + b],
            );
            let w = &tile.w[b * QK * TILE..(b + 1) * QK * TILE];
            for (r, acc) in o.iter_mut().enumerate() {
                let mut s = start;
                for g in 0..QK / 4 {
                    for j in 0..4 {
                        s += w[(g * TILE + r) * 4 + j] as i32 * q[g * 4 + j] as i32;
                    }
                }
                let f = s as f32 * tile.d[b * TILE + r];
                *acc = f.mul_add(da, *acc);
                if !tile.m.is_empty() {
                    *acc = tile.m[b * TILE + r].mul_add(ds, *acc);
                }
            }
        }
    }
}

/// The tile's product for tokens `t0..t0 + n`, on the best back end.
fn tile_product(tile: &Tile, x: &Acts, t0: usize, n: usize, out: &mut [[f32; TILE]; TOKENS]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86_vnni_gemm::available() {
        // SAFETY: the CPU has AVX-512 with VNNI (checked); the tile and the
        // activations have the same blocks per row (checked by `matmul`),
        // and `t0 + n` tokens exist.
        return unsafe { super::x86_vnni_gemm::tile_product(tile, x, t0, n, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::x86_avxvnni_gemm::available() {
        // SAFETY: the CPU has AVX-VNNI (checked); as above.
        return unsafe { super::x86_avxvnni_gemm::tile_product(tile, x, t0, n, out) };
    }
    tile_product_portable(tile, x, t0, n, out)
}

/// [`super::tiles::pack_quads_body`] of both halves of block `b` into
/// `tiles`, on the best back end.
fn pack_quads(tiles: &mut [Tile; 2], fours: &[Four], blocks: usize, b: usize, k: usize) {
    #[cfg(target_arch = "x86_64")]
    if super::x86_vnni_gemm::available() {
        // SAFETY: AVX-512 VNNI implies F, BW and VL (checked).
        return unsafe { super::x86_vnni_gemm::pack_quads(tiles, fours, blocks, b, k) };
    }
    for (half, tile) in tiles.iter_mut().enumerate() {
        super::tiles::pack_quads_body(tile, fours, blocks, (b, half), k)
    }
}

/// [`Tile::pack`] on the best back end.
fn pack(tile: &mut Tile, rows: &[(QFormat, &[u8])], form: RowForm, k: usize) {
    #[cfg(target_arch = "x86_64")]
    if super::x86_vnni_gemm::available() && super::x86_vnni_gemm::packs(rows) {
        // SAFETY: AVX-512 VNNI implies F, BW, VL and F16C (checked); the
        // rows are `Q4_0`/`Q4_1` (checked).
        return unsafe { super::x86_vnni_gemm::pack_q4(tile, rows, form, k) };
    }
    tile.pack(rows, form, k)
}

/// True when [`matmul`] is the faster way to run `tokens` tokens: it has a
/// back end ([`available`]) and more than one token (one is decode's: its
/// row-dot kernels read each weight once without packing it). From 43
/// tokens up (the benchmark's shortest prompt) packing is repaid:
/// docs/BENCHMARKS.md, "Prefill against llama.cpp".
pub(crate) fn pays(tokens: usize) -> bool {
    available() && tokens > 1
}

/// True where [`matmul`] has a back end faster than dequantized rows and
/// an f32 matmul (AVX-512 VNNI, or AVX-VNNI).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::x86_vnni_gemm::available() || super::x86_avxvnni_gemm::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A shared output written at disjoint indices by the tiles' threads.
struct SharedOut(*mut f32, usize);
// SAFETY: each tile writes only its own rows' elements (see `matmul`).
unsafe impl Sync for SharedOut {}

/// A matrix's row `r` as `(format, bytes)`.
pub(crate) type RowOf<'r, 'a> = &'r (dyn Fn(usize) -> (QFormat, &'a [u8]) + Sync);

/// `out = x · Wᵀ` for the `n` rows `row(r)` of `k` weights and every token
/// of `x` (`out[t · n + r]`, a token's results together); the rows' tiles split over rayon's
/// threads.
pub(crate) fn matmul(n: usize, (row, form): (RowOf, RowForm), x: &Acts, out: &mut [f32]) {
    run::<fn(f32, f32) -> f32>(n, (row, form), None, x, out)
}

/// `out = f(x · Gᵀ, x · Uᵀ)` elementwise, for two matrices of `n` rows
/// (a SwiGLU's gate and up: `f` its activation), each tile of both packed
/// and run together: one output, no transient product.
pub(crate) fn matmul_pair(
    n: usize,
    (gate, up, form): (RowOf, RowOf, RowForm),
    f: impl Fn(f32, f32) -> f32 + Sync,
    x: &Acts,
    out: &mut [f32],
) {
    run(n, (gate, form), Some((up, &f)), x, out)
}

thread_local! {
    static TILES: RefCell<[Tile; 2]> = RefCell::new([Tile::default(), Tile::default()]);
}

/// The tiles of [`matmul`] and [`matmul_pair`]; `F` a generic (not a
/// `dyn`), so that the pair's activation is inlined and runs over a
/// token's sixteen results as vectors (through a `dyn` call per result it
/// was 6 % of a 1.5B prefill of 2,048 tokens).
fn run<F: Fn(f32, f32) -> f32 + Sync>(
    n: usize,
    (row, form): (RowOf, RowForm),
    pair: Option<(RowOf, &F)>,
    x: &Acts,
    out: &mut [f32],
) {
    use rayon::prelude::*;
    let tokens = x.tokens();
    assert_eq!(out.len(), n * tokens, "matmul output size");
    let shared = SharedOut(out.as_mut_ptr(), out.len());
    (0..n.div_ceil(TILE)).into_par_iter().for_each(|ti| {
        let shared = &shared;
        TILES.with(|tiles| {
            let mut tiles = tiles.borrow_mut();
            let [a, b] = &mut *tiles;
            let rows = ti * TILE..((ti + 1) * TILE).min(n);
            let pack_rows = |tile: &mut Tile, row: RowOf| {
                let mut of: [(QFormat, &[u8]); TILE] = [(QFormat::Q8_0, &[]); TILE];
                for (o, r) in of.iter_mut().zip(rows.clone()) {
                    *o = row(r);
                }
                pack(tile, &of[..rows.len()], form, x.k);
            };
            pack_rows(a, row);
            if let Some((up, _)) = pair {
                pack_rows(b, up);
            }
            let (mut ra, mut rb) = ([[0f32; TILE]; TOKENS], [[0f32; TILE]; TOKENS]);
            for t0 in (0..tokens).step_by(TOKENS) {
                let m = TOKENS.min(tokens - t0);
                tile_product(a, x, t0, m, &mut ra);
                if pair.is_some() {
                    tile_product(b, x, t0, m, &mut rb);
                }
                for t in 0..m {
                    let mut v = ra[t];
                    if let Some((_, f)) = pair {
                        for (vj, &bj) in v.iter_mut().zip(&rb[t]) {
                            *vj = f(*vj, bj);
                        }
                    }
                    let at = (t0 + t) * n + rows.start;
                    debug_assert!(at + rows.len() <= shared.1);
                    // SAFETY: within the output (`at + rows.len() ≤ n ·
                    // tokens`); only this tile writes its rows' elements.
                    unsafe {
                        std::ptr::copy_nonoverlapping(v.as_ptr(), shared.0.add(at), rows.len())
                    };
                }
            }
        });
    });
}

/// Where [`matmul_columns`] reads a block of 32 outputs' weights.
#[derive(Clone, Copy)]
pub(crate) enum Columns<'r> {
    /// `fill(b, vals)` fills `vals[i · k + n]` with neuron `n`'s weight of
    /// output `32b + i` (any storage, any order of the neurons).
    Values(&'r (dyn Fn(usize, &mut [f32]) + Sync)),
    /// Every neuron in quads ([`QuadSource`], in its order), read in place
    /// ([`super::tiles::pack_quads_body`]).
    Quads(QuadSource<'r>),
}

/// `out[t · h + o] = Σ_n x_t[n] · w(n, o)` (`[tokens, h]`) for weights
/// stored neuron by neuron (a down projection: `x`'s columns are the
/// neurons, `x.k` of them, zero past the last), read from `columns`.
/// Blocks of 32 outputs split over rayon's threads; each thread packs its
/// block as two tiles ([`Tile::pack_columns`] from the filled values, or
/// straight from the quads) and runs every token.
pub(crate) fn matmul_columns(h: usize, columns: Columns, x: &Acts, out: &mut [f32]) {
    use rayon::prelude::*;
    let (tokens, k) = (x.tokens(), x.k);
    assert!(
        h.is_multiple_of(QK) && out.len() == h * tokens,
        "matmul_columns output size"
    );
    let shared = SharedOut(out.as_mut_ptr(), out.len());
    // The quads' neurons resolved once for every block.
    let fours = match &columns {
        Columns::Quads(src) => src.fours(k),
        Columns::Values(_) => Vec::new(),
    };
    (0..h / QK).into_par_iter().for_each(|b| {
        let shared = &shared;
        COLUMNS.with(|buf| {
            let mut buf = buf.borrow_mut();
            let (vals, tiles) = &mut *buf;
            match columns {
                Columns::Values(fill) => {
                    vals.clear();
                    vals.resize(k * QK, 0.0);
                    fill(b, vals);
                    for (half, tile) in tiles.iter_mut().enumerate() {
                        tile.pack_columns(vals, half, k);
                    }
                }
                Columns::Quads(src) => pack_quads(tiles, &fours, src.blocks, b, k),
            }
            let mut res = [[0f32; TILE]; TOKENS];
            for (half, tile) in tiles.iter().enumerate() {
                for t0 in (0..tokens).step_by(TOKENS) {
                    let m = TOKENS.min(tokens - t0);
                    tile_product(tile, x, t0, m, &mut res);
                    for (t, vals) in res.iter().enumerate().take(m) {
                        let at = (t0 + t) * h + b * QK + half * TILE;
                        debug_assert!(at + TILE <= shared.1);
                        // SAFETY: within the output (`at + 16 ≤ h · tokens`);
                        // only this block writes outputs `32b..32b + 32`.
                        unsafe {
                            std::ptr::copy_nonoverlapping(vals.as_ptr(), shared.0.add(at), TILE)
                        };
                    }
                }
            }
        });
    });
}

thread_local! {
    static COLUMNS: RefCell<(Vec<f32>, [Tile; 2])> = RefCell::new(Default::default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::planar;
    use crate::kernels::test_data::{data, plain_dequantize, quantize_rows, ALL};

    /// `n` rows of `k` weights in `format`, their dequantized values, and
    /// `tokens` activations.
    fn case(
        format: QFormat,
        n: usize,
        k: usize,
        tokens: usize,
        seed: u32,
    ) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
        let w = data(n * k, seed);
        let q = quantize_rows(&w, k, format);
        let deq: Vec<f32> = q
            .chunks_exact(format.row_bytes(k))
            .flat_map(|r| plain_dequantize(format, r))
            .collect();
        let x = data(tokens * k, seed + 7).iter().map(|v| v * 3.0).collect();
        (q, deq, x)
    }

    #[test]
    fn tiles_match_an_f32_product_on_odd_shapes() {
        // Rows and tokens not multiples of the tile's; every format.
        for (fi, &f) in ALL.iter().enumerate() {
            for (n, k, tokens) in [(1, 32, 1), (17, 96, 9), (35, 256, 13)] {
                let (q, deq, x) = case(f, n, k, tokens, 3 + fi as u32);
                let rb = f.row_bytes(k);
                let acts = Acts::quantize(&x, k);
                {
                    let mut out = vec![f32::NAN; n * tokens];
                    let row = |r: usize| (f, &q[r * rb..(r + 1) * rb]);
                    matmul(n, (&row, RowForm::Blocks), &acts, &mut out);
                    for t in 0..tokens {
                        for r in 0..n {
                            let exact: f32 = (0..k).map(|i| deq[r * k + i] * x[t * k + i]).sum();
                            let scale: f32 =
                                (0..k).map(|i| (deq[r * k + i] * x[t * k + i]).abs()).sum();
                            let got = out[t * n + r];
                            // 8-bit activations: within 1 % of Σ|w·x|.
                            assert!(
                                (got - exact).abs() <= 0.01 * scale + 1e-5,
                                "{f:?} n {n} k {k} row {r} token {t}: {got} vs {exact} (Σ|wx| {scale})"
                            );
                        }
                    }
                }
            }
        }
    }

    type Product = fn(&Tile, &Acts, usize, usize, &mut [[f32; TILE]; TOKENS]);

    /// Every back end of the tile product this CPU runs, by name (the
    /// dispatched one, and each x86 one whose features are present).
    fn back_ends() -> Vec<(&'static str, Product)> {
        let mut all: Vec<(&'static str, Product)> = vec![("dispatched", tile_product)];
        #[cfg(target_arch = "x86_64")]
        {
            if crate::kernels::x86_vnni_gemm::available() {
                // SAFETY: the CPU has AVX-512 VNNI (checked); the tests
                // pass tiles and activations of the same blocks.
                all.push(("avx512-vnni", |t, x, t0, n, o| unsafe {
                    crate::kernels::x86_vnni_gemm::tile_product(t, x, t0, n, o)
                }));
            }
            if is_x86_feature_detected!("avxvnni") && crate::kernels::cpu_features::avx2() {
                // SAFETY: the CPU has AVX-VNNI and AVX2 (checked); as above.
                all.push(("avx-vnni", |t, x, t0, n, o| unsafe {
                    crate::kernels::x86_avxvnni_gemm::tile_product(t, x, t0, n, o)
                }));
            }
        }
        all
    }

    #[test]
    fn back_ends_match_the_portable_kernel_to_the_bit() {
        let (n, k, tokens) = (16, 160, TOKENS);
        for (fi, &f) in ALL.iter().enumerate() {
            let (q, _, x) = case(f, n, k, tokens, 11 + fi as u32);
            let rb = f.row_bytes(k);
            // The format alone, and mixed with Q4_1 rows (the minimum's term).
            let (q1, _, _) = case(QFormat::Q4_1, n, k, 1, 5);
            let rb1 = QFormat::Q4_1.row_bytes(k);
            for mixed in [false, true] {
                let rows: Vec<(QFormat, &[u8])> = (0..n)
                    .map(|r| match (mixed, r % 3) {
                        (true, 0) => (QFormat::Q4_1, &q1[r * rb1..(r + 1) * rb1]),
                        _ => (f, &q[r * rb..(r + 1) * rb]),
                    })
                    .collect();
                let mut tile = Tile::default();
                tile.pack(&rows, RowForm::Blocks, k);
                let acts = Acts::quantize(&x, k);
                for m in 1..=TOKENS {
                    let mut a = [[0f32; TILE]; TOKENS];
                    tile_product_portable(&tile, &acts, 0, m, &mut a);
                    for (name, run) in back_ends() {
                        let mut b = [[f32::NAN; TILE]; TOKENS];
                        run(&tile, &acts, 0, m, &mut b);
                        for t in 0..m {
                            for r in 0..TILE {
                                assert_eq!(
                                    a[t][r].to_bits(),
                                    b[t][r].to_bits(),
                                    "{name}: {f:?} mixed {mixed} m {m} token {t} row {r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_pair_is_its_two_products_combined_and_planar_rows_are_their_blocks() {
        let (n, k, tokens) = (21, 128, 10);
        for f in ALL {
            let (g, _, x) = case(f, n, k, tokens, 1);
            let (u, _, _) = case(f, n, k, tokens, 2);
            let rb = f.row_bytes(k);
            let acts = Acts::quantize(&x, k);
            let (gr, ur) = (
                |r: usize| (f, &g[r * rb..(r + 1) * rb]),
                |r: usize| (f, &u[r * rb..(r + 1) * rb]),
            );
            let (mut go, mut uo, mut pair) = (
                vec![0.0; n * tokens],
                vec![0.0; n * tokens],
                vec![0.0; n * tokens],
            );
            matmul(n, (&gr, RowForm::Blocks), &acts, &mut go);
            matmul(n, (&ur, RowForm::Blocks), &acts, &mut uo);
            let comb = |a: f32, b: f32| a * 2.0 - b;
            matmul_pair(n, (&gr, &ur, RowForm::Blocks), comb, &acts, &mut pair);
            for i in 0..n * tokens {
                assert_eq!(pair[i].to_bits(), comb(go[i], uo[i]).to_bits(), "{f:?} {i}");
            }
            // The same rows planar give the same products.
            let mut gp = g.clone();
            planar::make_planar(f, k, &mut gp);
            let gpr = |r: usize| (f, &gp[r * rb..(r + 1) * rb]);
            let mut po = vec![0.0; n * tokens];
            matmul(n, (&gpr, RowForm::Planar), &acts, &mut po);
            assert!(
                po.iter().zip(&go).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{f:?} planar"
            );
        }
    }

    #[test]
    fn q4_and_q5_rows_pack_to_the_bit_on_every_back_end() {
        // Q4_0, Q4_1 and Q5_0 rows mixed, full and partial tiles, block
        // counts below, at and past the sixteen scales one conversion takes
        // (and Q5_0's planar fifth bits in groups of four blocks and a
        // rest); rows in whole blocks and planar.
        let formats = [QFormat::Q4_0, QFormat::Q4_1, QFormat::Q5_0];
        for (n, blocks) in [(16, 1), (5, 17), (16, 33), (11, 16), (16, 6)] {
            let k = blocks * QK;
            let whole: Vec<Vec<u8>> = (formats.iter().enumerate())
                .map(|(i, &f)| case(f, n, k, 1, 30 + 10 * i as u32 + n as u32).0)
                .collect();
            let planar: Vec<Vec<u8>> = (formats.iter().zip(&whole))
                .map(|(&f, q)| {
                    let mut p = q.clone();
                    planar::make_planar(f, k, &mut p);
                    p
                })
                .collect();
            for (form, bytes) in [(RowForm::Blocks, &whole), (RowForm::Planar, &planar)] {
                for mix in [0, 1, 2, 3, 4] {
                    let rows: Vec<(QFormat, &[u8])> = (0..n)
                        .map(|r| {
                            let i = match mix {
                                0..=2 => mix,
                                3 => usize::from(r % 3 == 0),
                                _ => r % 3,
                            };
                            let rb = formats[i].row_bytes(k);
                            (formats[i], &bytes[i][r * rb..(r + 1) * rb])
                        })
                        .collect();
                    let (mut a, mut b) = (Tile::default(), Tile::default());
                    // A used tile: every byte must be written again.
                    b.w = vec![7; 3 * k * TILE];
                    b.d = vec![f32::NAN; 2 * blocks * TILE];
                    b.m = vec![f32::NAN; 2 * blocks * TILE];
                    a.pack(&rows, form, k);
                    pack(&mut b, &rows, form, k);
                    let what = format!("{form:?} n {n} blocks {blocks} mix {mix}");
                    assert_eq!(a.blocks, b.blocks);
                    assert!(a.w == b.w, "{what}: bytes");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a.d), bits(&b.d), "{what}: scales");
                    assert_eq!(bits(&a.m), bits(&b.m), "{what}: minimums");
                }
            }
        }
    }

    #[test]
    fn columns_match_an_f32_product_on_odd_shapes() {
        // `n` neurons (not a multiple of 32: zero-padded), `h` outputs.
        for (n, h, tokens) in [(5usize, 32, 1), (45, 64, 11), (100, 96, 17)] {
            let k = n.next_multiple_of(QK);
            let w = data(n * h, 9); // neuron-major [n, h]
            let a: Vec<f32> = data(tokens * n, 4)
                .iter()
                .map(|v| v.max(0.0) * 2.0)
                .collect();
            let mut padded = vec![0f32; tokens * k];
            for t in 0..tokens {
                padded[t * k..t * k + n].copy_from_slice(&a[t * n..(t + 1) * n]);
            }
            let acts = Acts::quantize(&padded, k);
            let block = |b: usize, vals: &mut [f32]| {
                for j in 0..n {
                    for i in 0..QK {
                        vals[i * k + j] = w[j * h + b * QK + i];
                    }
                }
            };
            let mut out = vec![f32::NAN; tokens * h];
            matmul_columns(h, Columns::Values(&block), &acts, &mut out);
            for t in 0..tokens {
                for o in 0..h {
                    let (at, wo) = (&a[t * n..(t + 1) * n], |j: usize| w[j * h + o]);
                    let exact: f32 = (0..n).map(|j| at[j] * wo(j)).sum();
                    // Each side rounded to 8 bits against its largest: a
                    // half step of each, times the other side's sum.
                    let amax = at.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let wmax = (0..n).fold(0f32, |m, j| m.max(wo(j).abs()));
                    let (sa, sw) = (
                        at.iter().map(|v| v.abs()).sum::<f32>(),
                        (0..n).map(|j| wo(j).abs()).sum::<f32>(),
                    );
                    let bound = 1.05
                        * (amax / 254.0 * sw
                            + wmax / 254.0 * sa
                            + amax * wmax / 254.0 / 254.0 * n as f32)
                        + 1e-5;
                    let got = out[t * h + o];
                    assert!(
                        (got - exact).abs() <= bound,
                        "n {n} h {h} token {t} output {o}: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }

    #[test]
    fn quads_read_in_place_in_any_order_are_their_values_packed_to_the_bit() {
        use crate::kernels::quads;
        // Quads of random 8-bit codes and f16 scales (zeros among them).
        let (quads_n, blocks) = (16usize, 3usize);
        let (k, h, tokens) = (quads_n * 4, blocks * QK, 11);
        let qb = 8 * blocks + 128 * blocks;
        let mut bytes = vec![0u8; quads_n * qb];
        for (q, t) in bytes.chunks_exact_mut(qb).enumerate() {
            for (i, c) in data(qb, 20 + q as u32).iter().enumerate() {
                t[i] = (c * 97.0).rem_euclid(256.0) as u8;
            }
            for s in 0..4 * blocks {
                let d = data(1, (q * 64 + s) as u32)[0].abs() * 0.01 * (s % 5) as f32;
                t[2 * s..2 * s + 2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
            }
        }
        let quad = |q: usize| &bytes[q * qb..(q + 1) * qb];
        let fill = |b: usize, vals: &mut [f32]| {
            for q in 0..quads_n {
                quads::dequantize_block_t(quad(q), blocks, b, &mut vals[4 * q..], k);
            }
        };
        let acts = Acts::quantize(&data(tokens * k, 3), k);
        let (mut a, mut b) = (vec![0f32; tokens * h], vec![f32::NAN; tokens * h]);
        matmul_columns(h, Columns::Values(&fill), &acts, &mut a);
        let src = QuadSource {
            quad: &quad,
            blocks,
            order: None,
        };
        matmul_columns(h, Columns::Quads(src), &acts, &mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        // In an order: the values gathered in it, packed. Scrambled (no
        // two neighbours stored together), and as an arrangement leaves a
        // layer (the chosen first, each part in order: runs of neighbours
        // not aligned to quads).
        let scrambled: Vec<u32> = (0..k as u32).map(|i| (i * 37 + 5) % k as u32).collect();
        let chosen = |c: usize| c % 7 != 3 && !c.is_multiple_of(11);
        let front = (0..k).filter(|&c| chosen(c)).count();
        let (mut f, mut r) = (0u32, front as u32);
        let arranged: Vec<u32> = (0..k)
            .map(|c| {
                let at = if chosen(c) { &mut f } else { &mut r };
                *at += 1;
                *at - 1
            })
            .collect();
        let mut sources = vec![src];
        for order in [&scrambled, &arranged] {
            let gathered = |b: usize, vals: &mut [f32]| {
                let mut all = vec![0f32; vals.len()];
                fill(b, &mut all);
                for (o, row) in vals.chunks_exact_mut(k).zip(all.chunks_exact(k)) {
                    o.iter_mut()
                        .zip(order)
                        .for_each(|(v, &i)| *v = row[i as usize]);
                }
            };
            let ordered = QuadSource {
                order: Some(order),
                ..src
            };
            matmul_columns(h, Columns::Values(&gathered), &acts, &mut a);
            matmul_columns(h, Columns::Quads(ordered), &acts, &mut b);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
            sources.push(ordered);
        }
        // Both back ends of the packer (this CPU's and the portable one).
        for src in sources {
            let fours = src.fours(k);
            let mut pair = [Tile::default(), Tile::default()];
            pack_quads(&mut pair, &fours, blocks, 1, k);
            for (half, t1) in pair.into_iter().enumerate() {
                let mut t2 = Tile::default();
                crate::kernels::tiles::pack_quads_body(&mut t2, &fours, blocks, (1, half), k);
                assert_eq!((t1.w, t1.d), (t2.w, t2.d), "half {half}");
            }
        }
    }
}
