//! The token embedding lookup. A table held in memory (dense, or quantized
//! rows; a tied lm_head shares it), or, for a quantized checkpoint whose
//! lm_head is a matrix of its own, rows read from the file as tokens come
//! (one `pread` a token, from the page cache once read): the table never
//! takes the process's memory (Qwen2.5-Coder-1.5B's is 139 MiB in q4),
//! and the values are the same bits as a held table's.

use super::file_rows::FileRows;
use super::linear::{self, Linear};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};

#[derive(Debug, Clone)]
pub(crate) enum Embedding {
    Held(Linear),
    /// Rows read from the file as tokens come.
    InFile(FileRows),
}

impl Embedding {
    /// `[tokens.len(), hidden]` f32 on `device`: a dense table's rows
    /// selected where it lives, the others as [`Embedding::rows`].
    pub(crate) fn lookup(&self, tokens: &[u32], device: &Device) -> Result<Tensor> {
        if let Self::Held(l) = self {
            if let linear::Weights::Dense(t) = l.weights() {
                let ids = Tensor::new(tokens, device)?;
                return Ok(t.index_select(&ids, 0)?.to_dtype(DType::F32)?);
            }
        }
        let h = match self {
            Self::Held(l) => l.dims()?.1,
            Self::InFile(rows) => rows.cols(),
        };
        Ok(Tensor::from_vec(
            self.rows(tokens)?,
            (tokens.len(), h),
            device,
        )?)
    }

    /// The rows of `tokens`, dequantized to f32, one after another
    /// (`tokens.len() × hidden`), on the host.
    pub(crate) fn rows(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        match self {
            Self::Held(l) => match l.weights() {
                linear::Weights::Quant(q) => q.gather_rows(tokens),
                linear::Weights::Dense(t) => Ok(crate::kernels::with_weight(t, |w| {
                    let h = t.dim(1)?;
                    let mut out = Vec::with_capacity(tokens.len() * h);
                    for &id in tokens {
                        let r = id as usize * h..(id as usize + 1) * h;
                        match w {
                            crate::kernels::Weight::F32(w) => out.extend_from_slice(&w[r]),
                            crate::kernels::Weight::F16(w) => {
                                out.extend(w[r].iter().map(|v| v.to_f32()))
                            }
                        }
                    }
                    Ok(out)
                })?),
            },
            Self::InFile(rows) => rows.gather(tokens, "token id"),
        }
    }
}
