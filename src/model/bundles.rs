//! An FFN layer's neurons as quantized *bundles* (the `q8`/`q4` dtypes):
//! neuron `n`'s gate row, up row and down row (its column of `down_proj`)
//! stored together ([`crate::kernels::quant::BundleLayout`]), as in the
//! quantized checkpoint file, so a run of chosen neurons is one read and
//! one stream. Decode runs the fused kernel
//! ([`crate::kernels::quant::swiglu_bundles`]) over the bundles in any
//! order; prefill dequantizes a chunk of neurons at a time (~1 MiB of
//! f32) and multiplies with candle's matmul.

use crate::kernels::quant::{self, BundleLayout};
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor, D};
use std::sync::Arc;

/// A layer's bundles (or a view of the first bundles of one; clones and
/// views share the buffer).
#[derive(Debug, Clone)]
pub struct Bundles {
    layout: BundleLayout,
    data: Arc<Vec<u8>>,
    count: usize,
}

impl Bundles {
    /// Bundles over `data`, a whole number of them.
    pub fn new(layout: BundleLayout, data: Vec<u8>) -> Result<Self> {
        layout.check()?;
        let bb = layout.bundle_bytes();
        if !data.len().is_multiple_of(bb) {
            bail!(
                "{} bytes are not a whole number of neuron bundles of {bb} bytes",
                data.len()
            );
        }
        crate::sys::hugepages::collapse(data.as_ptr(), data.len());
        Ok(Self {
            layout,
            count: data.len() / bb,
            data: Arc::new(data),
        })
    }

    pub fn layout(&self) -> &BundleLayout {
        &self.layout
    }

    /// Neurons held.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes read per token.
    pub fn bytes(&self) -> usize {
        self.count * self.layout.bundle_bytes()
    }

    fn data(&self) -> &[u8] {
        &self.data[..self.bytes()]
    }

    /// The first `n` bundles, sharing this buffer.
    pub fn prefix(&self, n: usize) -> Self {
        Self {
            count: n.min(self.count),
            ..self.clone()
        }
    }

    pub fn collapse_to_huge_pages(&self) {
        crate::sys::hugepages::collapse(self.data.as_ptr(), self.data.len());
    }

    /// Stores bundle `src[i]` at `i` (moving blocks, never requantizing):
    /// in place when no view shares the buffer (so it keeps its huge
    /// pages), else into a new buffer.
    pub fn permute(&mut self, src: &[usize]) -> Result<()> {
        let bb = self.layout.bundle_bytes();
        if src.len() != self.count || src.iter().any(|&s| s >= self.count) {
            bail!(
                "a permutation of {} bundles names {} (largest {:?})",
                self.count,
                src.len(),
                src.iter().max()
            );
        }
        let old = self.data();
        let mut moved = vec![0u8; old.len()];
        for (dst, &s) in moved.chunks_exact_mut(bb).zip(src) {
            dst.copy_from_slice(&old[s * bb..(s + 1) * bb]);
        }
        match Arc::get_mut(&mut self.data) {
            Some(buf) => buf[..moved.len()].copy_from_slice(&moved),
            None => self.data = Arc::new(moved),
        }
        Ok(())
    }

    /// New bundles whose bundle `i` is bundle `r` of `a` when `picks[i] =
    /// (false, r)`, of `b` when `(true, r)` (a layer's kept neurons and the
    /// ones read in for a new plan; blocks moved, never requantized).
    pub fn merge(a: &Self, b: &Self, picks: &[(bool, u32)]) -> Result<Self> {
        if a.layout != b.layout {
            bail!("bundles of different layouts cannot be merged");
        }
        let bb = a.layout.bundle_bytes();
        let mut data = Vec::with_capacity(picks.len() * bb);
        for &(from_b, r) in picks {
            let src = if from_b { b } else { a };
            let r = r as usize;
            if r >= src.count {
                bail!("bundle {r} of {} is out of range", src.count);
            }
            data.extend_from_slice(&src.data()[r * bb..(r + 1) * bb]);
        }
        Self::new(a.layout, data)
    }

    /// One row `x [H]` → `[H]` over every bundle held.
    pub fn forward_row(&self, x: &[f32]) -> Result<Vec<f32>> {
        if x.len() != self.layout.hidden {
            bail!(
                "neuron bundles of hidden size {} given a row of {}",
                self.layout.hidden,
                x.len()
            );
        }
        let mut y = vec![0f32; x.len()];
        quant::swiglu_bundles(x, &self.layout, self.data(), &mut y);
        Ok(y)
    }

    /// Neurons dequantized at once in prefill (~1 MiB of f32 per matrix).
    fn chunk(&self) -> usize {
        ((1 << 18) / self.layout.hidden).max(8)
    }

    /// Rows `part` (0 gate, 1 up, 2 down) of bundles `range`, dequantized
    /// into `out` (`[range.len(), H]`).
    fn dequantize(&self, part: usize, range: std::ops::Range<usize>, out: &mut [f32]) {
        use rayon::prelude::*;
        let (l, h, bb) = (&self.layout, self.layout.hidden, self.layout.bundle_bytes());
        let format = [l.gate, l.up, l.down][part];
        let data = &self.data()[range.start * bb..range.end * bb];
        out.par_chunks_mut(h)
            .zip(data.par_chunks(bb))
            .with_min_len(8)
            .for_each(|(o, b)| {
                let rows = l.split(b);
                quant::dequantize_row(format, [rows.0, rows.1, rows.2][part], o)
            });
    }

    /// `‖down_j‖₂` of every bundle, in storage order.
    pub fn down_norms(&self) -> Vec<f32> {
        let h = self.layout.hidden;
        let mut out = Vec::with_capacity(self.count);
        let mut w = Vec::new();
        for n0 in (0..self.count).step_by(self.chunk()) {
            let r = n0..(n0 + self.chunk()).min(self.count);
            w.resize(r.len() * h, 0f32);
            self.dequantize(2, r, &mut w);
            out.extend(
                w.chunks_exact(h)
                    .map(|row| row.iter().map(|v| v * v).sum::<f32>().sqrt()),
            );
        }
        out
    }

    /// `x [m, H]` (f32, contiguous) times the rows `part` of `range`, transposed.
    fn times(&self, x: &Tensor, part: usize, range: std::ops::Range<usize>) -> Result<Tensor> {
        let h = self.layout.hidden;
        let mut w = vec![0f32; range.len() * h];
        self.dequantize(part, range.clone(), &mut w);
        let w = Tensor::from_vec(w, (range.len(), h), &Device::Cpu)?;
        Ok(if part == 2 {
            x.matmul(&w)?
        } else {
            x.matmul(&w.t()?)?
        })
    }

    /// `silu(gate·x) * (up·x)` of every bundle, `x [.., H]` → `[.., N]` f32, in storage order.
    pub fn activations(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.layout.hidden;
        let lead = x.dims()[..x.rank() - 1].to_vec();
        let x2 = x.reshape(((), h))?.to_dtype(DType::F32)?.contiguous()?;
        let mut parts = Vec::new();
        for n0 in (0..self.count).step_by(self.chunk()) {
            let r = n0..(n0 + self.chunk()).min(self.count);
            let g = self.times(&x2, 0, r.clone())?;
            let u = self.times(&x2, 1, r)?;
            parts.push((candle_nn::ops::silu(&g)? * u)?);
        }
        let a = if parts.is_empty() {
            Tensor::zeros((x2.dim(0)?, 0), DType::F32, &Device::Cpu)?
        } else {
            Tensor::cat(&parts, D::Minus1)?
        };
        let mut dims = lead;
        dims.push(self.count);
        Ok(a.reshape(dims)?)
    }

    /// `down_proj` of activations `a [.., N]` (storage order) → `[.., H]`.
    pub fn down(&self, a: &Tensor) -> Result<Tensor> {
        let h = self.layout.hidden;
        let lead = a.dims()[..a.rank() - 1].to_vec();
        let a2 = a.reshape(((), self.count))?.to_dtype(DType::F32)?;
        let mut y = Tensor::zeros((a2.dim(0)?, h), DType::F32, &Device::Cpu)?;
        for n0 in (0..self.count).step_by(self.chunk()) {
            let r = n0..(n0 + self.chunk()).min(self.count);
            let part = a2.narrow(1, n0, r.len())?.contiguous()?;
            y = (y + self.times(&part, 2, r)?)?;
        }
        let mut dims = lead;
        dims.push(h);
        Ok(y.reshape(dims)?)
    }
}
