//! Cached keys or values as the attention kernels read them: the f32
//! storage of a `[1, kv_heads, T, head_dim]` tensor view, or rows of
//! ggml's `Q8_0` blocks (a quarter of the bytes, as llama.cpp's
//! `--cache-type-k q8_0`) laid out `[kv_heads][capacity]`, the first `len`
//! positions of each head filled.

use super::blocks::{quantize_q8_0, QFormat};
use super::gemm::View;
use super::quant;
use candle_core::{Layout, Result};

/// One side (keys or values) of a layer's cache.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    /// A tensor's storage and its layout (any strides, contiguous rows).
    F32(&'a [f32], &'a Layout),
    /// `Q8_0` rows of `head_dim` values, kv head `g`'s position `j` at row
    /// `g * capacity + j`; positions `..len` are read.
    Q8 {
        data: &'a [u8],
        kv_heads: usize,
        capacity: usize,
        len: usize,
        head_dim: usize,
    },
}

impl<'a> KvRows<'a> {
    /// `(kv_heads, positions, head_dim)`.
    pub(crate) fn dims(&self) -> Result<(usize, usize, usize)> {
        Ok(match *self {
            Self::F32(_, l) => {
                let (_, kv_heads, t, hd) = l.shape().dims4()?;
                (kv_heads, t, hd)
            }
            Self::Q8 {
                kv_heads,
                len,
                head_dim,
                ..
            } => (kv_heads, len, head_dim),
        })
    }

    /// Refuses rows the kernels cannot read: f32 rows not contiguous, or
    /// any row the heads read outside the storage (`what`: the kernel).
    pub(crate) fn check(&self, what: &str) -> Result<()> {
        let (kv_heads, t, hd) = self.dims()?;
        let fits = match *self {
            Self::F32(data, l) => {
                if l.stride()[3] != 1 {
                    candle_core::bail!("{what}: k/v rows must be contiguous");
                }
                t == 0
                    || kv_heads == 0
                    || l.start_offset()
                        + (kv_heads - 1) * l.stride()[1]
                        + (t - 1) * l.stride()[2]
                        + hd
                        <= data.len()
            }
            Self::Q8 { data, capacity, .. } => {
                hd.is_multiple_of(super::blocks::QK)
                    && t <= capacity
                    && kv_heads * capacity * QFormat::Q8_0.row_bytes(hd) <= data.len()
            }
        };
        if !fits {
            candle_core::bail!("{what}: k/v rows outside their storage");
        }
        Ok(())
    }

    /// Positions `..keys` of kv head `g` as an f32 matrix: f32 rows as they
    /// are, `Q8_0` rows dequantized into `buf`.
    pub(crate) fn head<'b>(&'b self, g: usize, keys: usize, buf: &'b mut Vec<f32>) -> View<'b>
    where
        'a: 'b,
    {
        match *self {
            Self::F32(data, l) => View {
                data: &data[l.start_offset() + g * l.stride()[1]..],
                rows: keys,
                cols: l.dims()[3],
                stride: l.stride()[2],
            },
            Self::Q8 {
                head_dim, capacity, ..
            } => {
                if buf.capacity() < keys * head_dim {
                    // Room for the whole capacity at once: one mapping of
                    // its own, not a buffer grown through the thread's heap.
                    *buf = Vec::with_capacity(capacity * head_dim);
                }
                buf.resize(keys * head_dim, 0.0);
                let rows = self.q8_rows(g, 0..keys);
                quant::dequantize_row(QFormat::Q8_0, rows, &mut buf[..keys * head_dim]);
                View::new(&buf[..keys * head_dim], keys, head_dim)
            }
        }
    }

    /// The bytes of kv head `g`'s `Q8_0` rows at `positions` (one run: a
    /// head's rows are contiguous).
    pub(crate) fn q8_rows(&self, g: usize, positions: std::ops::Range<usize>) -> &'a [u8] {
        let Self::Q8 {
            data,
            capacity,
            head_dim,
            ..
        } = *self
        else {
            unreachable!("q8_rows of f32 rows")
        };
        let rb = QFormat::Q8_0.row_bytes(head_dim);
        &data[(g * capacity + positions.start) * rb..(g * capacity + positions.end) * rb]
    }
}

/// Writes `rows` (`[heads, seq, head_dim]` f32, contiguous) as `Q8_0`
/// rows at positions `pos..pos + seq` of a `[heads][capacity]` buffer.
pub(crate) fn store_q8(
    rows: &[f32],
    (heads, seq, head_dim): (usize, usize, usize),
    (buffer, capacity): (&mut [u8], usize),
    pos: usize,
) {
    let rb = QFormat::Q8_0.row_bytes(head_dim);
    debug_assert!(pos + seq <= capacity && rows.len() == heads * seq * head_dim);
    for (i, row) in rows.chunks_exact(head_dim).enumerate() {
        let (h, p) = (i / seq, pos + i % seq);
        let at = (h * capacity + p) * rb;
        quantize_q8_0(row, &mut buffer[at..at + rb]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::{data, quantize_rows};

    /// Rows stored at a position land at `g * capacity + position`, in
    /// ggml's `Q8_0` blocks exactly (candle's quantizer as the reference).
    #[test]
    fn stored_rows_are_ggml_q8_0_blocks_at_their_positions() {
        let (heads, seq, hd, cap, pos) = (2, 3, 64, 8, 4);
        let x = data(heads * seq * hd, 11);
        let rb = QFormat::Q8_0.row_bytes(hd);
        let mut buffer = vec![0u8; heads * cap * rb];
        store_q8(&x, (heads, seq, hd), (&mut buffer, cap), pos);
        let want = quantize_rows(&x, hd, QFormat::Q8_0);
        let rows = KvRows::Q8 {
            data: &buffer,
            kv_heads: heads,
            capacity: cap,
            len: pos + seq,
            head_dim: hd,
        };
        for h in 0..heads {
            let got = rows.q8_rows(h, pos..pos + seq);
            assert_eq!(got, &want[h * seq * rb..(h + 1) * seq * rb], "head {h}");
            assert!(rows.q8_rows(h, 0..pos).iter().all(|&b| b == 0));
        }
    }
}
