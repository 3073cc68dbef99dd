//! A column-energy statistic over a matrix of activations (`rows × n`,
//! row-major), for the selection scores: per row the inverse of its
//! weighted squared norm, summed in a canonical column order whatever order
//! the columns are stored in, and per stored column the sum of its squares
//! scaled by each row's factor, in fixed groups of rows
//! ([`column_energies`]). One pass over the matrix, a group of rows a
//! rayon task; the same bits on every back end and thread count: the
//! AVX-512 back end (`x86_energy`) does lane for lane the operations of
//! the portable one.

use super::gather::Runs;
use rayon::prelude::*;

/// Lanes of the norm's partial sums: canonical column `c` adds into lane
/// `c % LANES`.
pub(crate) const LANES: usize = 16;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(LANES == super::x86_energy::LANES);
/// Rows summed in f32 before their sum joins the column's f64 total.
pub(crate) const GROUP: usize = 32;
/// Per stored column `j` of `a` (`n` values a row): the f64 sum, over
/// groups of [`GROUP`] rows in order, of each group's f32 sum in row order
/// of `(a[t,j]·a[t,j])·k[t]`, where `k[t] = 1 / Σ_c w2[c]·x_c²` over the
/// canonical columns `c` in order, `x_c = row[stored[c]]` (`None`:
/// `row[c]`), summed in [`LANES`] f32 lanes (`(w2·x)·x` each) and the lanes
/// in f64 (`k = 0` for a row whose sum is 0). `stored` must hold `n`
/// distinct columns `< n` (asserted). Sixteen canonical columns are read
/// at once by the runs of `stored` ([`Runs`]): in place where a chunk is
/// one run, else copied (portable) or gathered (AVX-512).
pub(crate) fn column_energies(a: &[f32], n: usize, w2: &[f32], stored: Option<&[u32]>) -> Vec<f64> {
    assert!(w2.len() == n && n > 0 && a.len().is_multiple_of(n));
    // The gathers below read `row[stored[c]]`: every column must lie in the row.
    assert!(stored.is_none_or(|s| s.len() == n && s.iter().all(|&c| (c as usize) < n)));
    let runs = stored.map(|s| Runs::new(s, n, LANES));
    #[cfg(target_arch = "x86_64")]
    let simd = super::cpu_features::avx512_vnni();
    let groups: Vec<Vec<f32>> = a
        .par_chunks(GROUP * n)
        .map(|rows| {
            let mut e = vec![0f32; n];
            for row in rows.chunks_exact(n) {
                #[cfg(target_arch = "x86_64")]
                if simd {
                    // SAFETY: AVX-512F is present (part of the VNNI set);
                    // every stored column is below `n` (asserted above).
                    unsafe {
                        let lanes =
                            super::x86_energy::weighted_lanes(row, w2, stored, runs.as_ref());
                        let k = lanes_to_inverse(&lanes);
                        super::x86_energy::add_scaled_squares(&mut e, row, k);
                    }
                    continue;
                }
                let k = inv_norm_in_chunks(row, w2, stored, runs.as_ref());
                add_scaled_squares(&mut e, row, k);
            }
            e
        })
        .collect();
    let mut out = vec![0f64; n];
    for g in &groups {
        out.iter_mut().zip(g).for_each(|(o, &x)| *o += f64::from(x));
    }
    out
}

/// One row's `k` of [`column_energies`], the portable form: sixteen
/// canonical columns at a time, a slice of the row or copied by the runs
/// `runs` (made from `stored`) keeps, so the lanes' loop vectorises.
fn inv_norm_in_chunks(row: &[f32], w2: &[f32], stored: Option<&[u32]>, runs: Option<&Runs>) -> f32 {
    let n = w2.len();
    let whole = n - n % LANES;
    let (mut part, mut buf) = ([0f32; LANES], [0f32; LANES]);
    for (i, w) in w2[..whole].chunks_exact(LANES).enumerate() {
        let x = match runs {
            Some(r) => r.chunk(row, i, &mut buf),
            None => &row[LANES * i..LANES * (i + 1)],
        };
        (0..LANES).for_each(|j| part[j] += w[j] * x[j] * x[j]);
    }
    for c in whole..n {
        let x = row[stored.map_or(c, |s| s[c] as usize)];
        part[c % LANES] += w2[c] * x * x;
    }
    lanes_to_inverse(&part)
}

/// One row's `k` of [`column_energies`] column by column: the definition
/// the other forms are checked against.
#[cfg(test)]
fn inv_norm(row: &[f32], w2: &[f32], stored: Option<&[u32]>) -> f32 {
    let n = w2.len();
    let at = |c: usize| stored.map_or(c, |s| s[c] as usize);
    let mut part = [0f32; LANES];
    for c in 0..n {
        let x = row[at(c)];
        part[c % LANES] += w2[c] * x * x;
    }
    lanes_to_inverse(&part)
}

/// The lanes' sum in f64, in lane order; its inverse as f32, 0 for 0.
#[inline]
pub(crate) fn lanes_to_inverse(part: &[f32; LANES]) -> f32 {
    let s: f64 = part.iter().map(|&p| f64::from(p)).sum();
    if s > 0.0 {
        (1.0 / s) as f32
    } else {
        0.0
    }
}

/// `acc[j] += (x[j]·x[j])·k`, the portable form.
pub(crate) fn add_scaled_squares(acc: &mut [f32], x: &[f32], k: f32) {
    acc.iter_mut().zip(x).for_each(|(o, &x)| *o += x * x * k);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 8.0
            })
            .collect()
    }

    /// The statistic one row and one column at a time, portably.
    fn reference(a: &[f32], n: usize, w2: &[f32], stored: Option<&[u32]>) -> Vec<f64> {
        let k: Vec<f32> = a.chunks(n).map(|r| inv_norm(r, w2, stored)).collect();
        let mut sums = vec![0f64; n];
        for (rows, k) in a.chunks(GROUP * n).zip(k.chunks(GROUP)) {
            let mut acc = vec![0f32; n];
            for (row, &k) in rows.chunks_exact(n).zip(k) {
                add_scaled_squares(&mut acc, row, k);
            }
            sums.iter_mut()
                .zip(&acc)
                .for_each(|(s, &e)| *s += f64::from(e));
        }
        sums
    }

    #[test]
    fn energies_are_the_portable_bits_on_this_cpu_in_any_column_order() {
        // Widths below, at and past a lane chunk, row counts across a
        // group, a zero row; canonical order, chunks kept side by side and
        // chunks scattered.
        for (n, rows) in [(1, 3), (16, 1), (37, 33), (530, 70), (1100, 5)] {
            let mut a = values(n * rows, n as u32);
            if rows > 1 {
                a[n..2 * n].fill(0.0);
            }
            let w2: Vec<f32> = values(n, 7).iter().map(|w| w * w).collect();
            let mut scrambled: Vec<u32> = (0..n as u32).collect();
            scrambled.sort_by_key(|&c| (c.wrapping_mul(40_503) % 97, c));
            let mut chosen_first: Vec<u32> = (0..n as u32).collect();
            chosen_first.sort_by_key(|&c| (c % 19 == 5, c));
            for stored in [
                None,
                Some(scrambled.as_slice()),
                Some(chosen_first.as_slice()),
            ] {
                let want = reference(&a, n, &w2, stored);
                let runs = stored.map(|s| Runs::new(s, n, LANES));
                for row in a.chunks(n) {
                    let (got, k) = (
                        inv_norm_in_chunks(row, &w2, stored, runs.as_ref()),
                        inv_norm(row, &w2, stored),
                    );
                    assert_eq!(got.to_bits(), k.to_bits(), "portable chunks n={n}");
                }
                let got = column_energies(&a, n, &w2, stored);
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "n={n} rows={rows}");
            }
        }
    }

    #[test]
    fn a_row_read_through_its_storage_order_has_its_canonical_norm() {
        let n = 45;
        let canonical = values(n, 3);
        let w2 = vec![1.0; n];
        let order: Vec<u32> = (0..n as u32).rev().collect();
        let mut stored = vec![0f32; n];
        (0..n).for_each(|c| stored[order[c] as usize] = canonical[c]);
        let k = inv_norm(&canonical, &w2, None);
        let plain: f64 = canonical.iter().map(|&x| f64::from(x * x)).sum();
        assert!((f64::from(k) * plain - 1.0).abs() < 1e-5);
        // One row: each column's energy is its share of the row's.
        let by_stored = column_energies(&stored, n, &w2, Some(&order));
        for c in 0..n {
            let want = f64::from(canonical[c] * canonical[c] * k);
            assert_eq!(by_stored[order[c] as usize], want, "column {c}");
        }
    }
}
