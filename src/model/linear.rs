//! A linear layer whose activations are always f32, whatever the weight
//! dtype: a candle tensor (f32/f16/bf16), or rows of ggml blocks
//! ([`QMatrix`], the `q8`/`q4` dtypes).
//!
//! Single-row inputs on CPU (the decode step) go through the streaming
//! [`crate::kernels::matvec`] / [`crate::kernels::quant::matvec_q`]
//! kernels; everything else through candle's matmul (quantized rows:
//! dequantized a chunk of rows at a time into a reused buffer of ~1 MiB,
//! multiplied by [`crate::kernels::gemm`]).

use crate::kernels::gemm::{self, Out, Rhs, View};
use crate::kernels::gemm_q;
use crate::kernels::planar::{self, RowForm};
use crate::kernels::quant::{self, Q8Act, QFormat};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};
use std::sync::Arc;

/// A matrix of `rows × cols` quantized weights: consecutive parts of rows,
/// each part in one block format (Qwen's fused q/k/v may mix `q5_0` and
/// `q8_0`), in one buffer. Clones share the buffer.
#[derive(Debug, Clone)]
pub(crate) struct QMatrix {
    cols: usize,
    /// `(format, rows)` of each part, in row order.
    parts: Vec<(QFormat, usize)>,
    /// How every row's blocks are stored ([`planar`]).
    form: RowForm,
    data: Arc<Vec<u8>>,
}

/// Rows of f32 one dequantized chunk holds in prefill (~1 MiB of f32).
pub(crate) fn chunk_rows(cols: usize) -> usize {
    ((1 << 20) / (4 * cols.max(1))).max(16)
}

impl QMatrix {
    /// A matrix over `data`, which holds exactly the parts' rows (whole
    /// blocks), made planar in place where the kernels for planar rows run.
    pub(crate) fn new(
        cols: usize,
        parts: Vec<(QFormat, usize)>,
        mut data: Vec<u8>,
    ) -> Result<Self> {
        if cols == 0 || !cols.is_multiple_of(quant::QK) {
            bail!(
                "quantized rows need a length that is a multiple of {}, not {cols}",
                quant::QK
            );
        }
        let want: usize = parts.iter().map(|(f, r)| f.row_bytes(cols) * r).sum();
        if data.len() != want {
            bail!(
                "quantized matrix of {cols} columns in parts {parts:?} needs {want} bytes, got {}",
                data.len()
            );
        }
        let form = if planar::preferred() {
            let mut at = 0;
            for &(f, n) in &parts {
                let bytes = f.row_bytes(cols) * n;
                planar::make_planar(f, cols, &mut data[at..at + bytes]);
                at += bytes;
            }
            RowForm::Planar
        } else {
            RowForm::Blocks
        };
        crate::sys::hugepages::collapse(data.as_ptr(), data.len());
        Ok(Self {
            cols,
            parts,
            form,
            data: Arc::new(data),
        })
    }

    pub(crate) fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.1).sum()
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Each part's format, first row and bytes.
    fn spans(&self) -> impl Iterator<Item = (QFormat, std::ops::Range<usize>, &[u8])> {
        let (mut row, mut at) = (0, 0);
        self.parts.iter().map(move |&(f, n)| {
            let bytes = f.row_bytes(self.cols) * n;
            let span = (f, row..row + n, &self.data[at..at + bytes]);
            row += n;
            at += bytes;
            span
        })
    }

    /// `out = W · x` for activations already quantized.
    pub(crate) fn matvec(&self, x: &Q8Act, out: &mut [f32]) {
        for (f, rows, data) in self.spans() {
            quant::matvec_q(f, self.form, data, x, &mut out[rows]);
        }
    }

    /// `out[r] = row r · x` for the rows `0..out.len()`, then
    /// `extra_out[j] = row extra[j] · x`.
    pub(crate) fn matvec_subset(
        &self,
        x: &Q8Act,
        out: &mut [f32],
        extra: &[u32],
        extra_out: &mut [f32],
    ) {
        for (f, rows, data) in self.spans() {
            let (lo, hi) = (rows.start, rows.end.min(out.len()));
            if lo < hi {
                let rb = f.row_bytes(self.cols);
                quant::matvec_q(f, self.form, &data[..(hi - lo) * rb], x, &mut out[lo..hi]);
            }
            // Extras are ascending: those of this part are one run.
            let a = extra.partition_point(|&e| (e as usize) < rows.start);
            let b = extra.partition_point(|&e| (e as usize) < rows.end);
            if a < b {
                let local: Vec<u32> = extra[a..b].iter().map(|&e| e - rows.start as u32).collect();
                quant::matvec_q_ids(f, self.form, data, &local, x, &mut extra_out[a..b]);
            }
        }
    }

    /// Rows `rows` dequantized, row-major, into `out`.
    pub(crate) fn dequantize_rows(&self, rows: std::ops::Range<usize>, out: &mut [f32]) {
        use rayon::prelude::*;
        let k = self.cols;
        let mut jobs: Vec<(QFormat, &[u8], &mut [f32])> = Vec::new();
        let mut rest = out;
        for (f, span, data) in self.spans() {
            let (lo, hi) = (rows.start.max(span.start), rows.end.min(span.end));
            let rb = f.row_bytes(k);
            for r in lo..hi {
                let (row_out, tail) = std::mem::take(&mut rest).split_at_mut(k);
                rest = tail;
                let at = (r - span.start) * rb;
                jobs.push((f, &data[at..at + rb], row_out));
            }
        }
        let form = self.form;
        jobs.into_par_iter()
            .with_min_len(8)
            .for_each(|(f, row, out)| quant::dequantize_row_in(f, form, row, out));
    }

    /// Rows `ids` dequantized (an embedding lookup), `[ids.len(), cols]`.
    pub(crate) fn gather_rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let n = self.rows();
        let mut out = vec![0f32; ids.len() * self.cols];
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(self.cols)) {
            let r = id as usize;
            let (f, span, data) = self
                .spans()
                .find(|(_, span, _)| span.contains(&r))
                .with_context(|| format!("row {id} of a quantized matrix of {n} rows"))?;
            let rb = f.row_bytes(self.cols);
            let at = (r - span.start) * rb;
            // One row at a time, on this thread (a decode step's embedding).
            quant::dequantize_row_in(f, self.form, &data[at..at + rb], o);
        }
        Ok(out)
    }

    /// `x [m, cols]` (f32) → `x · Wᵀ` `[m, rows]`, a chunk of rows dequantized
    /// at a time into the thread's reused buffer and multiplied into the
    /// output's columns ([`gemm`]).
    fn matmul_t(&self, x: &Tensor) -> Result<Tensor> {
        let (k, n) = (self.cols, self.rows());
        let m = x.dim(0)?;
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        if gemm_q::pays(m) {
            // 8-bit activations, as the FFN's (and llama.cpp's): SmolLM2 q4's
            // KL to f32 0.0044 against 0.0039 with f32 activations here,
            // over 1,416 dev positions (docs/EXPERIMENTS.md, "Prefill on
            // tiled 8-bit products"), for 7-18 % of prefill's time.
            let acts = gemm_q::Acts::quantize(&xs, k);
            let spans: Vec<_> = self.spans().collect();
            let row = |r: usize| {
                let (f, rows, data) = spans
                    .iter()
                    .find(|s| s.1.contains(&r))
                    .expect("a row of the matrix");
                let rb = f.row_bytes(k);
                (*f, &data[(r - rows.start) * rb..(r - rows.start + 1) * rb])
            };
            let mut out = vec![0f32; m * n];
            gemm_q::matmul(n, (&row as gemm_q::RowOf, self.form), &acts, &mut out);
            return Ok(Tensor::from_vec(out, (m, n), x.device())?);
        }
        let mut out = vec![0f32; m * n];
        let step = chunk_rows(k);
        gemm::with_scratch(step.min(n) * k, |buf| {
            for r0 in (0..n).step_by(step) {
                let r1 = (r0 + step).min(n);
                let w = &mut buf[..(r1 - r0) * k];
                self.dequantize_rows(r0..r1, w);
                let (a, b) = (View::new(&xs, m, k), View::new(w, r1 - r0, k));
                let into = Out {
                    data: &mut out,
                    cols: n,
                    col0: r0,
                    accumulate: false,
                };
                gemm::matmul_into(a, b, Rhs::Transposed, into);
            }
        });
        Ok(Tensor::from_vec(out, (m, n), x.device())?)
    }
}

/// A layer's weights: a tensor `[out, in]` (contiguous) or quantized rows.
#[derive(Debug, Clone)]
pub(crate) enum Weights {
    Dense(Tensor),
    Quant(QMatrix),
}

#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weights,
    /// `[out]`, f32.
    bias: Option<Tensor>,
}

/// True when `x` holds a single row (one token of one sequence).
pub(crate) fn is_single_row(x: &Tensor) -> bool {
    x.dims().iter().rev().skip(1).product::<usize>() == 1
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        Self::with_weights(Weights::Dense(weight.contiguous()?), bias)
    }

    pub(crate) fn with_weights(weight: Weights, bias: Option<Tensor>) -> Result<Self> {
        let bias = bias.map(|b| b.to_dtype(DType::F32)).transpose()?;
        Ok(Self { weight, bias })
    }

    /// The weight tensor (`None`: quantized rows).
    pub(crate) fn dense_weight(&self) -> Option<&Tensor> {
        match &self.weight {
            Weights::Dense(t) => Some(t),
            Weights::Quant(_) => None,
        }
    }

    pub(crate) fn weights(&self) -> &Weights {
        &self.weight
    }

    /// `(out, in)`.
    pub(crate) fn dims(&self) -> Result<(usize, usize)> {
        Ok(match &self.weight {
            Weights::Dense(t) => t.dims2()?,
            Weights::Quant(q) => (q.rows(), q.cols()),
        })
    }

    pub(crate) fn weight_bytes(&self) -> usize {
        match &self.weight {
            Weights::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Weights::Quant(q) => q.bytes(),
        }
    }

    /// Puts the weights on huge pages (see [`crate::sys::hugepages`]).
    pub(crate) fn collapse_to_huge_pages(&self) {
        match &self.weight {
            Weights::Dense(t) => crate::sys::hugepages::collapse_tensor(t),
            Weights::Quant(q) => crate::sys::hugepages::collapse(q.data.as_ptr(), q.data.len()),
        }
    }

    /// One row on the CPU: `x [in]` → `[out]`, bias added.
    pub fn forward_row(&self, x: &[f32]) -> Result<Vec<f32>> {
        let (out, k) = self.dims()?;
        if x.len() != k {
            anyhow::bail!("linear layer [{out}, {k}] given a row of {}", x.len());
        }
        let mut y = vec![0f32; out];
        match &self.weight {
            Weights::Dense(w) => crate::kernels::with_weight(w, |w| {
                w.matvec(x, &mut y);
                Ok(())
            })?,
            Weights::Quant(q) => q.matvec(&Q8Act::quantize(x), &mut y),
        }
        self.add_bias(y)
    }

    /// One row on the CPU restricted to the rows of `vocab` (an output
    /// vocabulary): `[out]` with −∞ for the rows not computed, bias added.
    pub(crate) fn forward_row_subset(
        &self,
        x: &[f32],
        vocab: &crate::model::vocab::OutputVocab,
    ) -> Result<Vec<f32>> {
        let (out, k) = self.dims()?;
        if x.len() != k || vocab.vocab_size() != out {
            anyhow::bail!(
                "linear layer [{out}, {k}] given a row of {} and an output vocabulary of {}",
                x.len(),
                vocab.vocab_size()
            );
        }
        let mut y = vec![f32::NEG_INFINITY; out];
        let (p, extra) = (vocab.prefix(), vocab.extra());
        let mut ey = vec![0f32; extra.len()];
        match &self.weight {
            Weights::Dense(w) => crate::kernels::with_weight(w, |w| {
                w.first_rows(p, k).matvec(x, &mut y[..p]);
                w.matvec_ids(extra, x, &mut ey);
                Ok(())
            })?,
            Weights::Quant(q) => q.matvec_subset(&Q8Act::quantize(x), &mut y[..p], extra, &mut ey),
        }
        for (&e, v) in extra.iter().zip(ey) {
            y[e as usize] = v;
        }
        self.add_bias(y)
    }

    /// One row on the CPU, the output rows `ids` alone (ascending, each
    /// once): `[ids.len()]`, bias added.
    pub(crate) fn forward_row_ids(&self, x: &[f32], ids: &[u32]) -> Result<Vec<f32>> {
        let (out, k) = self.dims()?;
        if x.len() != k
            || ids.windows(2).any(|w| w[0] >= w[1])
            || ids.last().is_some_and(|&i| i as usize >= out)
        {
            bail!("linear layer [{out}, {k}] given a row of {} and rows {ids:?} (ascending, below {out})", x.len());
        }
        let mut y = vec![0f32; ids.len()];
        match &self.weight {
            Weights::Dense(w) => crate::kernels::with_weight(w, |w| {
                w.matvec_ids(ids, x, &mut y);
                Ok(())
            })?,
            Weights::Quant(q) => q.matvec_subset(&Q8Act::quantize(x), &mut [], ids, &mut y),
        }
        if let Some(b) = &self.bias {
            crate::kernels::with_f32(b, |b| {
                y.iter_mut()
                    .zip(ids)
                    .for_each(|(y, &i)| *y += b[i as usize]);
                Ok(())
            })?;
        }
        Ok(y)
    }

    /// `y` with the bias added (−∞ entries stay −∞).
    fn add_bias(&self, mut y: Vec<f32>) -> Result<Vec<f32>> {
        self.add_bias_to(&mut y)?;
        Ok(y)
    }

    /// The bias added to `y` (all of the layer's outputs; −∞ stays −∞).
    pub(crate) fn add_bias_to(&self, y: &mut [f32]) -> Result<()> {
        if let Some(b) = &self.bias {
            crate::kernels::with_f32(b, |b| {
                y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
                Ok(())
            })?;
        }
        Ok(())
    }

    /// `x [.., in]` (f32) → `[.., out]` (f32).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if is_single_row(x) && x.device().is_cpu() {
            let y = self.forward_row(&x.flatten_all()?.to_vec1::<f32>()?)?;
            let mut dims = x.dims().to_vec();
            *dims.last_mut().expect("rank >= 1") = y.len();
            return Ok(Tensor::from_vec(y, dims, x.device())?);
        }
        let (out, k) = self.dims()?;
        let lead = x.dims()[..x.rank() - 1].to_vec();
        let x2 = x.reshape(((), k))?;
        let y = match &self.weight {
            Weights::Dense(w) => x2
                .to_dtype(w.dtype())?
                .matmul(&w.t()?)?
                .to_dtype(DType::F32)?,
            Weights::Quant(q) => {
                if !x.device().is_cpu() {
                    bail!("quantized weights run on the CPU only");
                }
                q.matmul_t(&x2.to_dtype(DType::F32)?.contiguous()?)?
            }
        };
        let mut dims = lead;
        dims.push(out);
        let y = y.reshape(dims)?;
        match &self.bias {
            Some(b) => Ok(y.broadcast_add(b)?),
            None => Ok(y),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::data;
    use crate::kernels::test_data::{plain_dequantize, quantize_rows};

    #[test]
    fn quantized_linear_in_parts_matches_its_dequantized_rows() {
        let (k, rows) = (64, [40usize, 24]);
        let w = data((rows[0] + rows[1]) * k, 1);
        let (a, b) = w.split_at(rows[0] * k);
        let mut bytes = quantize_rows(a, k, QFormat::Q5_0);
        bytes.extend(quantize_rows(b, k, QFormat::Q8_0));
        let mut deq = plain_dequantize(QFormat::Q5_0, &bytes[..QFormat::Q5_0.row_bytes(k) * 40]);
        deq.extend(plain_dequantize(
            QFormat::Q8_0,
            &bytes[QFormat::Q5_0.row_bytes(k) * 40..],
        ));
        let q = QMatrix::new(k, vec![(QFormat::Q5_0, 40), (QFormat::Q8_0, 24)], bytes).unwrap();
        let mut out = vec![0f32; 64 * k];
        q.dequantize_rows(0..64, &mut out);
        assert_eq!(out, deq);
        let lin = Linear::with_weights(Weights::Quant(q), None).unwrap();
        let dense = Linear::new(
            Tensor::from_vec(deq, (64, k), &candle_core::Device::Cpu).unwrap(),
            None,
        )
        .unwrap();
        let x = Tensor::from_vec(data(3 * k, 2), (1, 3, k), &candle_core::Device::Cpu).unwrap();
        // Several rows: 8-bit activations where `gemm_q` pays, so within
        // their step; f32 ones elsewhere.
        let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let (yq, yd) = (
            flat(lin.forward(&x).unwrap()),
            flat(dense.forward(&x).unwrap()),
        );
        let tolerance = if gemm_q::pays(3) { 0.05 } else { 1e-4 };
        for (a, b) in yq.iter().zip(&yd) {
            assert!(
                (a - b).abs() < tolerance * (1.0 + b.abs()),
                "batched: {a} vs {b}"
            );
        }
        // One row: activations quantized to 8 bits, so within their step.
        let row = data(k, 4);
        let (yq, yd) = (
            lin.forward_row(&row).unwrap(),
            dense.forward_row(&row).unwrap(),
        );
        for (a, b) in yq.iter().zip(&yd) {
            assert!((a - b).abs() < 0.05 * (1.0 + b.abs()), "{a} vs {b}");
        }
        assert!(QMatrix::new(k, vec![(QFormat::Q8_0, 2)], vec![0; 10]).is_err());
        assert!(QMatrix::new(33, vec![], vec![]).is_err());
    }
}
