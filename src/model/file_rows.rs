//! A quantized checkpoint's matrix left in its file and read a row or a
//! chunk of rows at a time with `pread` (from the page cache once read):
//! Qwen's embedding table (a row per token) and, behind the lm_head's
//! screen, the lm_head (the `k` rows the screen picks per step; every row,
//! a chunk at a time, for a pass that needs them all). The process holds
//! one chunk's bytes at most, and the values are the same bits as a held
//! matrix's: each row is dequantized or multiplied by the same kernel, in
//! the same storage form.

use super::linear::QMatrix;
use super::qfile::QFile;
use super::Config;
use crate::kernels::{
    planar::{self, RowForm},
    quant::{self, Q8Act, QFormat},
};
use anyhow::{bail, Context, Result};
use std::sync::Arc;

/// Rows one read of a whole-matrix pass takes (~3 MiB of Qwen 1.5B's
/// Q8_0 lm_head rows: one read per 2,048 rows, the buffer in L2/L3).
pub(crate) const CHUNK_ROWS: usize = 2048;

/// Whether tensor `name` of a quantized checkpoint stays in its file: the
/// embedding table unless a tied lm_head shares it, and an lm_head of its
/// own when `head_in_file` (its screen computes a few rows a step).
pub(crate) fn stays_in_file(name: &str, cfg: &Config, head_in_file: bool) -> bool {
    !cfg.tie_word_embeddings && (name == EMBEDDING || (head_in_file && name == HEAD))
}

/// The checkpoint's name of the embedding table.
pub(crate) const EMBEDDING: &str = "model.embed_tokens.weight";
/// The checkpoint's name of the lm_head.
pub(crate) const HEAD: &str = "lm_head.weight";

/// Tensor `name` (`[rows, cols]`, one block format) of `file`.
#[derive(Debug, Clone)]
pub struct FileRows {
    file: Arc<QFile>,
    name: &'static str,
    format: QFormat,
    rows: usize,
    cols: usize,
}

impl FileRows {
    /// Rows of tensor `name` of `file` read on demand (its shape, format
    /// and size checked now).
    pub(crate) fn open(
        file: Arc<QFile>,
        name: &'static str,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let format = file.row_format(name, rows, cols)?;
        Ok(Self {
            file,
            name,
            format,
            rows,
            cols,
        })
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the whole matrix in the file.
    pub(crate) fn bytes(&self) -> usize {
        self.format.row_bytes(self.cols) * self.rows
    }

    /// Refuses a row past the matrix, naming `what` (a token id, a row).
    fn check(&self, r: usize, what: &str) -> Result<()> {
        if r >= self.rows {
            bail!(
                "{what} {r} is outside the {} rows of {} in {}",
                self.rows,
                self.name,
                self.file.path().display()
            );
        }
        Ok(())
    }

    /// Rows `first..first + n` into `buf`, in whole blocks.
    fn read(&self, first: usize, n: usize, buf: &mut Vec<u8>) -> Result<()> {
        let rb = self.format.row_bytes(self.cols);
        buf.resize(n * rb, 0);
        self.file.read_rows(self.name, first, rb, buf)
    }

    /// The rows `ids`, dequantized to f32, one after another
    /// (`ids.len() × cols`); `what` names an id in an error.
    pub(crate) fn gather(&self, ids: &[u32], what: &str) -> Result<Vec<f32>> {
        let (mut bytes, mut out) = (Vec::new(), vec![0f32; ids.len() * self.cols]);
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(self.cols)) {
            self.check(id as usize, what)?;
            self.read(id as usize, 1, &mut bytes)
                .with_context(|| format!("{what} {id}"))?;
            quant::dequantize_row_in(self.format, RowForm::Blocks, &bytes, o);
        }
        Ok(out)
    }

    /// Rows `rows` dequantized, row-major, into `out`.
    pub(crate) fn dequantize_rows(
        &self,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<()> {
        if rows.end > self.rows || out.len() != rows.len() * self.cols {
            bail!(
                "rows {rows:?} of {} ([{}, {}]) into {} values",
                self.name,
                self.rows,
                self.cols,
                out.len()
            );
        }
        let mut bytes = Vec::new();
        self.read(rows.start, rows.len(), &mut bytes)?;
        let rb = self.format.row_bytes(self.cols);
        for (row, o) in bytes.chunks_exact(rb).zip(out.chunks_exact_mut(self.cols)) {
            quant::dequantize_row_in(self.format, RowForm::Blocks, row, o);
        }
        Ok(())
    }

    /// Rows `rows` as a matrix held in memory (the form and bits a held
    /// matrix's rows take), for a pass over many positions.
    pub(crate) fn chunk(&self, rows: std::ops::Range<usize>) -> Result<QMatrix> {
        let mut bytes = Vec::new();
        self.read(rows.start, rows.len(), &mut bytes)?;
        QMatrix::new(self.cols, vec![(self.format, rows.len())], bytes)
    }

    /// `bytes` (whole rows in blocks) in the form a held matrix's rows
    /// take on this CPU ([`planar::preferred`]), and that form.
    fn held_form(&self, bytes: &mut [u8]) -> RowForm {
        if planar::preferred() {
            planar::make_planar(self.format, self.cols, bytes);
            RowForm::Planar
        } else {
            RowForm::Blocks
        }
    }

    /// `out[r] = row r · x` for the rows `0..out.len()` (all, or an
    /// output vocabulary's prefix), [`CHUNK_ROWS`] rows read at a time.
    pub(crate) fn matvec(&self, x: &Q8Act, out: &mut [f32]) -> Result<()> {
        self.check_row(x, out.len(), out.len().min(self.rows))?;
        let n = out.len();
        let mut bytes = Vec::new();
        for r0 in (0..n).step_by(CHUNK_ROWS) {
            let r1 = (r0 + CHUNK_ROWS).min(n);
            self.read(r0, r1 - r0, &mut bytes)?;
            let form = self.held_form(&mut bytes);
            quant::matvec_q(self.format, form, &bytes, x, &mut out[r0..r1]);
        }
        Ok(())
    }

    /// `out[j] = row ids[j] · x` (ids ascending, each below the rows):
    /// each run of consecutive ids one read.
    pub(crate) fn matvec_ids(&self, x: &Q8Act, ids: &[u32], out: &mut [f32]) -> Result<()> {
        self.check_row(x, out.len(), ids.len())?;
        if let Some(&last) = ids.last() {
            self.check(last as usize, "row")?;
        }
        let rb = self.format.row_bytes(self.cols);
        let mut bytes = vec![0u8; ids.len() * rb];
        let mut at = 0;
        for group in ids.chunk_by(|a, b| a + 1 == *b) {
            let span = &mut bytes[at..at + group.len() * rb];
            self.file
                .read_rows(self.name, group[0] as usize, rb, span)?;
            at += span.len();
        }
        let form = self.held_form(&mut bytes);
        quant::matvec_q(self.format, form, &bytes, x, out);
        Ok(())
    }

    fn check_row(&self, x: &Q8Act, out: usize, want: usize) -> Result<()> {
        if x.len() != self.cols || out != want {
            bail!(
                "{} [{}, {}] given a row of {} for {out} outputs ({want} wanted)",
                self.name,
                self.rows,
                self.cols,
                x.len()
            );
        }
        Ok(())
    }
}
