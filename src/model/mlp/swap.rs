//! Swapping a layer's held neurons for another set of the same size (a
//! task hot-swap): kept neurons move, only the added ones are read. Quantized
//! bundles are swapped in place (the added neurons written over the dropped
//! ones, then one in-place permutation back to canonical order), so the
//! layer keeps its buffer and huge pages; f32/f16 rows are merged into new
//! tensors.

use super::{Mlp, Store};
use crate::model::linear::Linear;
use anyhow::{Context, Result};
use candle_core::Tensor;

impl Mlp {
    /// Holds `neurons` (original indices, as many as it holds now) instead
    /// of its current ones: the neurons both sets share stay in memory and
    /// are moved, `read` is given the added ones (ascending) and returns
    /// them as an MLP of the same storage, and the dropped ones are freed.
    /// The layer ends in canonical order (not arranged). Returns how many
    /// neurons were read. Bundles need no second copy; of f32/f16 rows at
    /// most one of the layer's matrices exists twice meanwhile.
    pub fn swap_neurons(
        &mut self,
        neurons: &[u32],
        read: impl FnOnce(&[u32]) -> Result<Mlp>,
    ) -> Result<usize> {
        let old = self
            .neurons
            .clone()
            .context("a layer holding every neuron has none to swap")?;
        let mut new = neurons.to_vec();
        new.sort_unstable();
        new.dedup();
        if new.len() != old.len() {
            anyhow::bail!(
                "a swap holds as many neurons as before: {} held, {} given",
                old.len(),
                new.len()
            );
        }
        let added: Vec<u32> = new
            .iter()
            .copied()
            .filter(|n| old.binary_search(n).is_err())
            .collect();
        if added.is_empty() {
            return Ok(0);
        }
        let incoming = read(&added)?;
        if incoming.width != added.len() || incoming.neurons.as_deref().is_some_and(|n| n != added)
        {
            anyhow::bail!(
                "{} neurons read in for the {} added",
                incoming.width,
                added.len()
            );
        }
        let stored = self.stored_rows();
        if let (Store::Bundles(b), Store::Bundles(inc)) = (&mut self.store, &incoming.store) {
            // The dropped neurons' stored rows take the added ones (both ascending).
            let slots: Vec<usize> = old
                .iter()
                .enumerate()
                .filter(|(_, n)| new.binary_search(n).is_err())
                .map(|(c, _)| stored[c] as usize)
                .collect();
            b.overwrite(&slots, inc)?;
            let src: Vec<usize> = new
                .iter()
                .map(|n| match old.binary_search(n) {
                    Ok(c) => stored[c] as usize,
                    Err(_) => slots[added.binary_search(n).expect("an added neuron")],
                })
                .collect();
            b.permute(&src)?;
            return Ok(self.swapped(new, added.len()));
        }
        // Per neuron of the new set: its stored row here, or its row in `incoming`.
        let src: Vec<std::result::Result<usize, usize>> = new
            .iter()
            .map(|n| match old.binary_search(n) {
                Ok(c) => Ok(stored[c] as usize),
                Err(_) => Err(added.binary_search(n).expect("an added neuron")),
            })
            .collect();
        let k = added.len() as u32;
        let (mut rows, mut gate, mut up) = (Vec::new(), Vec::new(), Vec::new());
        for s in &src {
            match *s {
                Ok(r) => {
                    let (g, u) = self.gate_up_rows(r);
                    rows.push((false, r as u32));
                    gate.push((false, g));
                    up.push((false, u));
                }
                Err(j) => {
                    rows.push((true, j as u32));
                    gate.push((true, j as u32));
                    up.push((true, k + j as u32));
                }
            }
        }
        let gate_up_picks = [gate, up].concat();
        match (&mut self.store, &incoming.store) {
            (
                Store::Rows { gate_up, down_t },
                Store::Rows {
                    gate_up: in_gate_up,
                    down_t: in_down_t,
                },
            ) => {
                fn dense(l: &Linear) -> Result<&Tensor> {
                    l.dense_weight()
                        .context("an MLP's gate/up rows are a tensor")
                }
                let merged = crate::kernels::merge_rows(
                    dense(gate_up)?,
                    dense(in_gate_up)?,
                    &gate_up_picks,
                )?;
                *gate_up = Linear::new(merged, None)?;
                *down_t = crate::kernels::merge_rows(down_t, in_down_t, &rows)?;
            }
            _ => anyhow::bail!("the neurons read in are stored differently from the layer's"),
        }
        Ok(self.swapped(new, added.len()))
    }

    /// Records a finished swap to `neurons` (canonical order); returns `read`.
    fn swapped(&mut self, neurons: Vec<u32>, read: usize) -> usize {
        self.neurons = Some(neurons);
        self.order = None;
        self.front = self.width;
        read
    }
}
