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
pub struct View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl<'a> View<'a> {
    /// The whole of a contiguous `[rows, cols]` matrix.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            stride: cols,
        }
    }

    /// Columns `start..start + cols` of every row.
    pub fn columns(self, start: usize, cols: usize) -> Self {
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

/// `out[:, col0..col0 + n] (+)= a · bᵀ` for `a [m, k]`, `b [n, k]` (rows of
/// weights, as stored) and `out` row-major with `out_cols` columns; with
/// `accumulate` the product is added to what `out` holds.
pub fn matmul_t_into(
    a: View,
    b: View,
    out: &mut [f32],
    out_cols: usize,
    col0: usize,
    accumulate: bool,
) {
    assert_eq!(a.cols, b.cols, "inner dimensions");
    // bᵀ as a view: element (i, j) = b[j, i], so row stride 1, column stride b.stride.
    product(a, (1, b.stride), b.rows, b, out, out_cols, col0, accumulate);
}

/// `out[:, col0..col0 + n] (+)= a · b` for `a [m, k]` and `b [k, n]`.
pub fn matmul_into(
    a: View,
    b: View,
    out: &mut [f32],
    out_cols: usize,
    col0: usize,
    accumulate: bool,
) {
    assert_eq!(a.cols, b.rows, "inner dimensions");
    product(a, (b.stride, 1), b.cols, b, out, out_cols, col0, accumulate);
}

/// `out (+)= a · rhs`, `rhs` (`k × n`) read from `b.data` with (row,
/// column) strides `rhs_strides`.
#[allow(clippy::too_many_arguments)]
fn product(
    a: View,
    rhs_strides: (usize, usize),
    n: usize,
    b: View,
    out: &mut [f32],
    out_cols: usize,
    col0: usize,
    accumulate: bool,
) {
    a.check("matmul lhs");
    b.check("matmul rhs");
    let (m, k) = (a.rows, a.cols);
    assert!(
        col0 + n <= out_cols && m * out_cols <= out.len(),
        "matmul out: {m}x{n} at column {col0} of a {} value buffer, {out_cols} columns",
        out.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            out.chunks_mut(out_cols)
                .take(m)
                .for_each(|r| r[col0..col0 + n].fill(0.0));
        }
        return;
    }
    let threads = rayon::current_num_threads();
    let parallelism = match threads {
        1 => gemm::Parallelism::None,
        t => gemm::Parallelism::Rayon(t),
    };
    // SAFETY: the views were checked to lie inside their slices and `out`
    // holds `m` rows of `out_cols` with the `n` columns from `col0`;
    // `out` is borrowed mutably, so nothing else reads or writes it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr().add(col0),
            1,
            out_cols as isize,
            accumulate,
            a.data.as_ptr(),
            1,
            a.stride as isize,
            b.data.as_ptr(),
            rhs_strides.1 as isize,
            rhs_strides.0 as isize,
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
pub fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
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
            matmul_t_into(
                View::new(&a, m, k),
                View::new(&b, n, k),
                &mut out,
                cols,
                3,
                false,
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
            matmul_t_into(
                View::new(&a, m, k),
                View::new(&b, n, k),
                &mut out,
                cols,
                3,
                true,
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
            matmul_into(a_view, View::new(&b2, k, n), &mut out, n, 0, false);
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
        matmul_t_into(
            View::new(&a, 2, 3),
            View::new(&b, 2, 3),
            &mut out,
            2,
            0,
            false,
        );
    }
}
