//! The f32 matrix products of prefill over quantized rows, written into
//! the caller's buffers: `gemm` (the crate candle's CPU matmul runs) on
//! strided views, and one reused per-thread buffer for the rows a chunk
//! dequantizes. Prefill then allocates no ~1 MiB transient per chunk (the
//! dequantized rows, candle's copy of them, each chunk's product and their
//! concatenation), which the allocator would otherwise keep resident or
//! map and fault in again for every chunk.

use std::cell::RefCell;

/// A row-major f32 matrix view: element `(r, c)` at `r * stride + c`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl<'a> View<'a> {
    /// The whole of a contiguous `[rows, cols]` matrix.
    pub(crate) fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            stride: cols,
        }
    }

    /// Columns `start..start + cols` of every row.
    pub(crate) fn columns(self, start: usize, cols: usize) -> Self {
        assert!(start + cols <= self.cols, "columns out of the view");
        Self {
            data: &self.data[start.min(self.data.len())..],
            cols,
            ..self
        }
    }

    fn check(&self, what: &str) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.stride + self.cols;
            assert!(
                self.cols <= self.stride && last <= self.data.len(),
                "{what}: a {}x{} view of stride {} over {} values",
                self.rows,
                self.cols,
                self.stride,
                self.data.len()
            );
        }
    }
}

/// How the right-hand matrix of [`matmul_into`] is stored.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Rhs {
    /// `b [k, n]`: the product is `a · b`.
    AsIs,
    /// `b [n, k]` (rows of weights, as stored): the product is `a · bᵀ`.
    Transposed,
}

/// Where [`matmul_into`] writes: columns `col0..col0 + n` of the
/// row-major `data` with `cols` columns; with `accumulate` the product is
/// added to what is there.
pub(crate) struct Out<'a> {
    pub data: &'a mut [f32],
    pub cols: usize,
    pub col0: usize,
    pub accumulate: bool,
}

/// `out (+)= a · b` (or `a · bᵀ`) for `a [m, k]`, written into `out`'s columns.
pub(crate) fn matmul_into(a: View, b: View, rhs: Rhs, out: Out) {
    let parallelism = match rayon::current_num_threads() {
        1 => gemm::Parallelism::None,
        t => gemm::Parallelism::Rayon(t),
    };
    product(a, b, rhs, out, parallelism)
}

/// [`matmul_into`] on the calling thread alone (inside a parallel task).
pub(crate) fn matmul_serial(a: View, b: View, rhs: Rhs, out: Out) {
    product(a, b, rhs, out, gemm::Parallelism::None)
}

fn product(a: View, b: View, rhs: Rhs, out: Out, parallelism: gemm::Parallelism) {
    a.check("matmul lhs");
    b.check("matmul rhs");
    // The right-hand matrix's (k, n) and (row, column) strides over `b.data`.
    let (k, n, rs, cs) = match rhs {
        Rhs::AsIs => (b.rows, b.cols, b.stride, 1),
        Rhs::Transposed => (b.cols, b.rows, 1, b.stride),
    };
    assert_eq!(a.cols, k, "matmul inner dimensions");
    let m = a.rows;
    assert!(
        out.col0 + n <= out.cols && m * out.cols <= out.data.len(),
        "matmul out: {m}x{n} at column {} of a {} value buffer, {} columns",
        out.col0,
        out.data.len(),
        out.cols
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !out.accumulate {
            out.data
                .chunks_mut(out.cols)
                .take(m)
                .for_each(|r| r[out.col0..out.col0 + n].fill(0.0));
        }
        return;
    }
    // SAFETY: the views were checked to lie inside their slices and `out`
    // holds `m` rows of `out.cols` with the `n` columns from `out.col0`;
    // `out.data` is borrowed mutably, so nothing else reads or writes it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.data.as_mut_ptr().add(out.col0),
            1,
            out.cols as isize,
            out.accumulate,
            a.data.as_ptr(),
            1,
            a.stride as isize,
            b.data.as_ptr(),
            cs as isize,
            rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's reused buffer of `len` f32 (contents
/// unspecified; grown, never shrunk). A call inside another on the same
/// thread (a rayon worker that picked up a second prefill job while
/// waiting) gets a buffer of its own.
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => {
            if s.len() < len {
                s.resize(len, 0.0);
            }
            f(&mut s[..len])
        }
        Err(_) => f(&mut vec![0f32; len]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::data;

    fn plain(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, bt: bool) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|p| a[i * k + p] * if bt { b[j * k + p] } else { b[p * n + j] })
                    .sum();
            }
        }
        out
    }

    #[test]
    fn products_into_column_ranges_match_plain_loops() {
        for &(m, k, n) in &[(1, 1, 1), (3, 7, 5), (17, 64, 33), (43, 96, 200)] {
            let (a, b) = (data(m * k, 1), data(n * k, 2));
            let want = plain(&a, &b, m, k, n, true);
            // Into columns 3..3 + n of a wider buffer, then again, accumulated.
            let cols = n + 5;
            let mut out = vec![7f32; m * cols];
            let into = Out {
                data: &mut out,
                cols,
                col0: 3,
                accumulate: false,
            };
            matmul_into(
                View::new(&a, m, k),
                View::new(&b, n, k),
                Rhs::Transposed,
                into,
            );
            for i in 0..m {
                assert!(out[i * cols..i * cols + 3].iter().all(|&v| v == 7.0));
                assert!(out[i * cols + 3 + n..(i + 1) * cols]
                    .iter()
                    .all(|&v| v == 7.0));
                for j in 0..n {
                    let (g, w) = (out[i * cols + 3 + j], want[i * n + j]);
                    assert!(
                        (g - w).abs() < 1e-4 * (1.0 + w.abs()),
                        "{m}x{k}x{n} ({i},{j}): {g} vs {w}"
                    );
                }
            }
            let into = Out {
                data: &mut out,
                cols,
                col0: 3,
                accumulate: true,
            };
            matmul_into(
                View::new(&a, m, k),
                View::new(&b, n, k),
                Rhs::Transposed,
                into,
            );
            let (g, w) = (out[3], 2.0 * want[0]);
            assert!(
                (g - w).abs() < 1e-4 * (1.0 + w.abs()),
                "accumulated: {g} vs {w}"
            );
            // a · b with b [k, n], a a column range of a wider matrix.
            let wide = data(m * (k + 4), 3);
            let a2: Vec<f32> = wide
                .chunks(k + 4)
                .flat_map(|r| r[2..2 + k].to_vec())
                .collect();
            let b2 = data(k * n, 4);
            let want = plain(&a2, &b2, m, k, n, false);
            let mut out = vec![0f32; m * n];
            let a_view = View {
                data: &wide,
                rows: m,
                cols: k + 4,
                stride: k + 4,
            }
            .columns(2, k);
            let out_all = Out {
                data: &mut out,
                cols: n,
                col0: 0,
                accumulate: false,
            };
            matmul_into(a_view, View::new(&b2, k, n), Rhs::AsIs, out_all);
            for (g, w) in out.iter().zip(&want) {
                assert!(
                    (g - w).abs() < 1e-4 * (1.0 + w.abs()),
                    "{m}x{k}x{n}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "matmul out")]
    fn an_output_too_small_is_refused() {
        let (a, b) = (data(6, 1), data(6, 2));
        let mut out = vec![0f32; 3];
        let into = Out {
            data: &mut out,
            cols: 2,
            col0: 0,
            accumulate: false,
        };
        matmul_into(
            View::new(&a, 2, 3),
            View::new(&b, 2, 3),
            Rhs::Transposed,
            into,
        );
    }
}
