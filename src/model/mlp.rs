//! The FFN block (SwiGLU MLP), stored neuron-major.
//!
//! Neuron `n` of a layer owns row `n` of `gate_proj`, row `n` of `up_proj`
//! and column `n` of `down_proj`. We keep `[gate; up]` as one `[2N, H]`
//! matrix and `down_proj` transposed to `[N, H]`, so every neuron is a set of
//! contiguous rows. A sub-network of neurons is then just a row selection of
//! the same three matrices (`Mlp::from_neuron_rows`), which is what selective
//! loading and computation build on. Decode runs the fused CPU kernels of
//! [`crate::kernels`]; prefill and non-CPU devices use candle matmuls.

use crate::kernels::SwiGluDown;
use crate::model::linear::{is_single_row, Linear};
use crate::rowread::RowSource;
use anyhow::{Context, Result};
use candle_core::{DType, Tensor, D};
use candle_nn::VarBuilder;

#[derive(Debug, Clone)]
pub struct Mlp {
    /// `[gate rows; up rows]`, shape `[2N, H]`.
    gate_up: Linear,
    /// `down_proj` transposed: neuron `n` is row `n`, shape `[N, H]`.
    down_t: Tensor,
    width: usize,
    /// Original indices of the neurons held, when this is a subset.
    neurons: Option<Vec<u32>>,
}

impl Mlp {
    /// Loads the dense MLP (all neurons) of one layer.
    pub fn load(vb: VarBuilder, hidden: usize, intermediate: usize) -> Result<Self> {
        let get = |name: &str, shape: (usize, usize)| {
            vb.get(shape, &format!("{name}.weight"))
                .with_context(|| format!("loading {}.{name}.weight", vb.prefix()))
        };
        let gate = get("gate_proj", (intermediate, hidden))?;
        let up = get("up_proj", (intermediate, hidden))?;
        let down = get("down_proj", (hidden, intermediate))?;
        Self::from_neuron_rows(&gate, &up, &down.t()?)
    }

    /// Builds an MLP from per-neuron rows: `gate [N, H]`, `up [N, H]`,
    /// `down_t [N, H]` (the transpose of `down_proj` restricted to the neurons).
    pub fn from_neuron_rows(gate: &Tensor, up: &Tensor, down_t: &Tensor) -> Result<Self> {
        let width = gate.dim(0)?;
        Ok(Self {
            gate_up: Linear::new(Tensor::cat(&[gate, up], 0)?, None)?,
            down_t: down_t.contiguous()?,
            width,
            neurons: None,
        })
    }

    /// An MLP holding no neuron (the placeholder of a layer whose FFN is
    /// streamed from disk at every forward pass).
    pub fn empty(hidden: usize, dtype: DType, device: &candle_core::Device) -> Result<Self> {
        let none = Tensor::zeros((0, hidden), dtype, device)?;
        let mut mlp = Self::from_neuron_rows(&none, &none, &none)?;
        mlp.neurons = Some(Vec::new());
        Ok(mlp)
    }

    /// Loads only `neurons` (original indices) of layer `prefix` (e.g.
    /// `model.layers.3.mlp`) with `pread`: gate/up rows and down_proj
    /// columns; nothing else of the MLP is read into memory. Neurons are
    /// held in ascending index order (so consecutive rows are read at once,
    /// and loading every neuron gives exactly the dense MLP).
    pub fn load_neurons(
        source: &RowSource,
        prefix: &str,
        neurons: &[u32],
        hidden: usize,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Result<Self> {
        let mut sorted = neurons.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let neurons = &sorted[..];
        let name = |part: &str| format!("{prefix}.{part}.weight");
        let read = |part: &str, down: bool| -> Result<Tensor> {
            let n = name(part);
            let r = source.find(&n)?;
            let t = if down {
                r.columns_t(&n, neurons, dtype)?
            } else {
                r.rows(&n, neurons, dtype)?
            };
            if t.dim(1)? != hidden {
                anyhow::bail!(
                    "{n}: expected {hidden} along the hidden dimension, found {:?}",
                    r.entry(&n)?.shape
                );
            }
            Ok(t.to_device(device)?)
        };
        let mut mlp = Self::from_neuron_rows(
            &read("gate_proj", false)?,
            &read("up_proj", false)?,
            &read("down_proj", true)?,
        )?;
        mlp.neurons = Some(neurons.to_vec());
        Ok(mlp)
    }

    /// A compact copy holding only rows `positions` (ascending) of this MLP:
    /// contiguous weights, built once per prompt for selective decode.
    pub fn select(&self, positions: &[usize]) -> Result<Self> {
        let rows: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        if let Some(&bad) = positions.iter().find(|&&p| p >= self.width) {
            anyhow::bail!("neuron row {bad} out of range ({} held)", self.width);
        }
        // One gather for [gate rows; up rows] (no concatenation copy) and one for down.
        let gate_up_rows: Vec<u32> = rows
            .iter()
            .copied()
            .chain(rows.iter().map(|r| r + self.width as u32))
            .collect();
        let gate_up = crate::kernels::gather_rows(self.gate_up.weight(), &gate_up_rows)?;
        let down_t = crate::kernels::gather_rows(&self.down_t, &rows)?;
        let mut mlp = Self {
            gate_up: Linear::new(gate_up, None)?,
            down_t,
            width: rows.len(),
            neurons: None,
        };
        mlp.neurons = Some(match &self.neurons {
            Some(held) => rows.iter().map(|&r| held[r as usize]).collect(),
            None => rows,
        });
        Ok(mlp)
    }

    /// Loads every neuron of layer `prefix` with `pread` (the dense MLP).
    pub fn load_all(
        source: &RowSource,
        prefix: &str,
        intermediate: usize,
        hidden: usize,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Result<Self> {
        for (part, want) in [
            ("gate_proj", [intermediate, hidden]),
            ("up_proj", [intermediate, hidden]),
            ("down_proj", [hidden, intermediate]),
        ] {
            let name = format!("{prefix}.{part}.weight");
            let got = &source.find(&name)?.entry(&name)?.shape;
            if got[..] != want {
                anyhow::bail!("{name} has shape {got:?}, the model config expects {want:?}");
            }
        }
        let all: Vec<u32> = (0..intermediate as u32).collect();
        let mut mlp = Self::load_neurons(source, prefix, &all, hidden, dtype, device)?;
        mlp.neurons = None;
        Ok(mlp)
    }

    /// Original indices of the neurons held (`None`: all, in order).
    pub fn neurons(&self) -> Option<&[u32]> {
        self.neurons.as_deref()
    }

    /// Number of neurons this MLP computes.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Bytes of weights read per token.
    pub fn weight_bytes(&self) -> usize {
        self.gate_up.weight_bytes() + self.down_t.elem_count() * self.down_t.dtype().size_in_bytes()
    }

    /// The input of `down_proj`: `silu(gate(x)) * up(x)`, shape `[.., N]`, f32.
    pub fn activations(&self, x: &Tensor) -> Result<Tensor> {
        let gu = self.gate_up.forward(x)?;
        let gate = gu.narrow(D::Minus1, 0, self.width)?;
        let up = gu.narrow(D::Minus1, self.width, self.width)?;
        Ok((candle_nn::ops::silu(&gate)? * up)?)
    }

    /// `down_proj` applied to activations `a [.., N]` → `[.., H]`, f32.
    pub fn down(&self, a: &Tensor) -> Result<Tensor> {
        let a = a.to_dtype(self.down_t.dtype())?;
        let (lead, n) = (a.dims()[..a.rank() - 1].to_vec(), self.width);
        let y = a.reshape(((), n))?.matmul(&self.down_t)?;
        let mut dims = lead;
        dims.push(self.down_t.dim(1)?);
        Ok(y.reshape(dims)?.to_dtype(DType::F32)?)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if is_single_row(x) && x.device().is_cpu() {
            let gu = self.gate_up.forward(x)?;
            return Ok(gu.apply_op2_no_bwd(&self.down_t, &SwiGluDown)?);
        }
        self.down(&self.activations(x)?)
    }
}
