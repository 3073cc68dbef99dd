//! The lm_head's weights: a [`Linear`] held in memory, or rows left in the
//! quantized checkpoint ([`FileRows`]) where a screen ranks them
//! ([`super::head_screen`]): a decode step reads the `k` rows the screen
//! picks; a pass without the screen (a grammar's step) reads every row, a
//! chunk at a time. Either way the same bits.

use super::file_rows::{FileRows, CHUNK_ROWS};
use super::linear::{Linear, Weights};
use super::vocab::OutputVocab;
use crate::kernels::quant::Q8Act;
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};

#[derive(Debug, Clone)]
pub enum LmHead {
    Held(Linear),
    /// Rows read from the file (no bias: Qwen's lm_head has none).
    InFile(FileRows),
}

impl LmHead {
    /// `(out, in)`.
    pub(crate) fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Held(l) => l.dims(),
            Self::InFile(f) => Ok((f.rows(), f.cols())),
        }
    }

    /// Bytes of all of its rows (held, or in the file).
    pub(crate) fn weight_bytes(&self) -> usize {
        match self {
            Self::Held(l) => l.weight_bytes(),
            Self::InFile(f) => f.bytes(),
        }
    }

    /// Bytes `rows` of its rows take.
    pub(crate) fn rows_bytes(&self, rows: usize) -> usize {
        let (out, _) = self.dims().unwrap_or((1, 0));
        (self.weight_bytes() as u128 * rows as u128 / out.max(1) as u128) as usize
    }

    /// One row on the CPU: `x [in]` → `[out]`, bias added.
    pub fn forward_row(&self, x: &[f32]) -> Result<Vec<f32>> {
        match self {
            Self::Held(l) => l.forward_row(x),
            Self::InFile(f) => {
                let mut y = vec![0f32; f.rows()];
                f.matvec(&quantized(f, x)?, &mut y)?;
                Ok(y)
            }
        }
    }

    /// One row restricted to the rows of `vocab`: `[out]` with −∞ for the
    /// rows not computed, bias added.
    pub(crate) fn forward_row_subset(&self, x: &[f32], vocab: &OutputVocab) -> Result<Vec<f32>> {
        match self {
            Self::Held(l) => l.forward_row_subset(x, vocab),
            Self::InFile(f) => {
                vocab.check_size(f.rows())?;
                let xq = quantized(f, x)?;
                let mut y = vec![f32::NEG_INFINITY; f.rows()];
                f.matvec(&xq, &mut y[..vocab.prefix()])?;
                let mut ey = vec![0f32; vocab.extra().len()];
                f.matvec_ids(&xq, vocab.extra(), &mut ey)?;
                for (&e, v) in vocab.extra().iter().zip(ey) {
                    y[e as usize] = v;
                }
                Ok(y)
            }
        }
    }

    /// One row, the output rows `ids` alone (ascending, each once):
    /// `[ids.len()]`, bias added.
    pub(crate) fn forward_row_ids(&self, x: &[f32], ids: &[u32]) -> Result<Vec<f32>> {
        match self {
            Self::Held(l) => l.forward_row_ids(x, ids),
            Self::InFile(f) => {
                if ids.windows(2).any(|w| w[0] >= w[1]) {
                    bail!("lm_head rows {ids:?} are not ascending");
                }
                let mut y = vec![0f32; ids.len()];
                f.matvec_ids(&quantized(f, x)?, ids, &mut y)?;
                Ok(y)
            }
        }
    }

    /// The bias added to `y` (all of the layer's outputs; −∞ stays −∞).
    pub(crate) fn add_bias_to(&self, y: &mut [f32]) -> Result<()> {
        match self {
            Self::Held(l) => l.add_bias_to(y),
            Self::InFile(_) => Ok(()),
        }
    }

    /// `x [.., in]` (f32) → `[.., out]` (f32); rows in the file a chunk
    /// of [`CHUNK_ROWS`] at a time, each chunk as a held matrix computes.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let f = match self {
            Self::Held(l) => return l.forward(x),
            Self::InFile(f) => f,
        };
        if super::linear::is_single_row(x) && x.device().is_cpu() {
            let y = self.forward_row(&x.flatten_all()?.to_vec1::<f32>()?)?;
            let mut dims = x.dims().to_vec();
            *dims.last_mut().expect("rank >= 1") = y.len();
            return Ok(Tensor::from_vec(y, dims, x.device())?);
        }
        let (n, k) = (f.rows(), f.cols());
        let mut dims = x.dims().to_vec();
        let x2 = x.reshape(((), k))?.to_dtype(DType::F32)?.contiguous()?;
        // Whole chunks of a held matrix's f32 path, so its products split
        // the rows where a held head's would.
        let step = CHUNK_ROWS.next_multiple_of(super::linear::chunk_rows(k));
        let parts = (0..n)
            .step_by(step)
            .map(|r0| {
                let chunk = f.chunk(r0..(r0 + step).min(n))?;
                Linear::with_weights(Weights::Quant(chunk), None)?.forward(&x2)
            })
            .collect::<Result<Vec<_>>>()?;
        *dims.last_mut().expect("rank >= 1") = n;
        Ok(Tensor::cat(&parts, 1)?.reshape(dims)?)
    }

    /// Rows `rows` dequantized to f32, row-major, into `out` (a screen's
    /// build). CPU only.
    pub(crate) fn dequantize_rows(
        &self,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<()> {
        match self {
            Self::InFile(f) => f.dequantize_rows(rows, out),
            Self::Held(l) => match l.weights() {
                Weights::Quant(q) => {
                    q.dequantize_rows(rows, out);
                    Ok(())
                }
                Weights::Dense(t) => {
                    let v = t
                        .narrow(0, rows.start, rows.len())?
                        .to_dtype(DType::F32)?
                        .flatten_all()?
                        .to_vec1::<f32>()
                        .context("reading the lm_head's rows (CPU only)")?;
                    out.copy_from_slice(&v);
                    Ok(())
                }
            },
        }
    }
}

/// `x` in 8 bits, checked to be a row of `f`'s width.
fn quantized(f: &FileRows, x: &[f32]) -> Result<Q8Act> {
    if x.len() != f.cols() {
        bail!(
            "lm_head [{}, {}] given a row of {}",
            f.rows(),
            f.cols(),
            x.len()
        );
    }
    Ok(Q8Act::quantize(x))
}
