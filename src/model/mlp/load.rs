//! Selective loading of a layer's neurons from the safetensors checkpoint:
//! gate/up rows and down_proj columns read with `pread` straight into the
//! buffers decode runs on.

use super::{Mlp, Store};
use crate::model::linear::Linear;
use crate::model::rowread::{RowBuf, RowSource};
use anyhow::Result;
use candle_core::DType;

impl Mlp {
    /// Loads only `neurons` (original indices) of layer `prefix` (e.g.
    /// `model.layers.3.mlp`) with `pread`: gate/up rows and down_proj
    /// columns; nothing else of the MLP is read into memory. Neurons are
    /// held in ascending index order (so consecutive rows are read at once,
    /// and loading every neuron gives exactly the dense MLP).
    pub(crate) fn load_neurons(
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
        let (gate, up, down) = (name("gate_proj"), name("up_proj"), name("down_proj"));
        let check = |n: &str, axis: usize| -> Result<()> {
            let shape = &source.find(n)?.entry(n)?.shape;
            if shape.len() != 2 || shape[axis] != hidden {
                anyhow::bail!("{n}: expected {hidden} along the hidden dimension, found {shape:?}");
            }
            Ok(())
        };
        check(&gate, 1)?;
        check(&up, 1)?;
        check(&down, 0)?;
        // Read and converted straight into the buffers decode runs on:
        // `[gate rows; up rows]` in one, down_proj's columns in the other.
        let mut gate_up = RowBuf::new(dtype)?;
        gate_up
            .rows(source.find(&gate)?, &gate, neurons)?
            .rows(source.find(&up)?, &up, neurons)?;
        let mut down_t = RowBuf::new(dtype)?;
        down_t.columns_t(source.find(&down)?, &down, neurons)?;
        let (gate_up, down_t) = (
            gate_up.into_tensor(hidden)?.to_device(device)?,
            down_t.into_tensor(hidden)?.to_device(device)?,
        );
        let width = neurons.len();
        let mut mlp = Self {
            store: Store::Rows {
                gate_up: Linear::new(gate_up, None)?,
                down_t,
            },
            width,
            neurons: None,
            order: None,
            front: width,
            gate_keep: None,
        };
        mlp.neurons = Some(neurons.to_vec());
        Ok(mlp)
    }
}
