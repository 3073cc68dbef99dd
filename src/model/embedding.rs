//! The token embedding lookup. A table held in memory (dense, or quantized
//! rows; a tied lm_head shares it), or, for a quantized checkpoint whose
//! lm_head is a matrix of its own, rows read from the file as tokens come
//! (one `pread` a token, from the page cache once read): the table never
//! takes the process's memory (Qwen2.5-Coder-1.5B's is 139 MiB in q4),
//! and the values are the same bits as a held table's.

use super::linear::{self, Linear};
use super::qfile::QFile;
use super::Config;
use crate::kernels::{
    planar::RowForm,
    quant::{self, QFormat},
};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

/// The checkpoint's name of the table.
pub(crate) const TABLE: &str = "model.embed_tokens.weight";

/// Whether a quantized checkpoint's table stays in its file (read as
/// tokens come): unless the lm_head shares it.
pub(crate) fn stays_on_disk(cfg: &Config) -> bool {
    !cfg.tie_word_embeddings
}

#[derive(Debug, Clone)]
pub(crate) enum Embedding {
    Held(Linear),
    /// Tensor `name` (`[rows, cols]`, one block format) of `file`.
    OnDisk {
        file: Arc<QFile>,
        name: &'static str,
        format: QFormat,
        rows: usize,
        cols: usize,
    },
}

impl Embedding {
    /// Rows of tensor `name` of `file` read on demand (its shape and
    /// format checked now).
    pub(crate) fn on_disk(
        file: Arc<QFile>,
        name: &'static str,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let format = file.row_format(name, rows, cols)?;
        Ok(Self::OnDisk {
            file,
            name,
            format,
            rows,
            cols,
        })
    }

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
            Self::OnDisk { cols, .. } => *cols,
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
            Self::OnDisk {
                file,
                name,
                format,
                rows,
                cols,
            } => {
                let rb = format.row_bytes(*cols);
                let (mut bytes, mut out) = (vec![0u8; rb], vec![0f32; tokens.len() * cols]);
                for (&id, o) in tokens.iter().zip(out.chunks_exact_mut(*cols)) {
                    if id as usize >= *rows {
                        anyhow::bail!("token id {id} is outside the embedding's {rows} rows");
                    }
                    file.read_row(name, id as usize, &mut bytes)
                        .with_context(|| format!("embedding row of token {id}"))?;
                    quant::dequantize_row_in(*format, RowForm::Blocks, &bytes, o);
                }
                Ok(out)
            }
        }
    }
}
