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
    pub(crate) fn swap_neurons(
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
            // The same neurons: only back to canonical order, as every
            // swap leaves a layer (a fresh load's storage order, so the
            // same sums in the same order).
            if self.order.is_some() {
                self.arrange(&(0..self.width).collect::<Vec<_>>())?;
            }
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
            let src: Vec<usize> = new
                .iter()
                .map(|n| match old.binary_search(n) {
                    Ok(c) => stored[c] as usize,
                    Err(_) => slots[added.binary_search(n).expect("an added neuron")],
                })
                .collect();
            b.overwrite_and_permute(&slots, inc, &src)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A layer holding neurons 10.. of a model (a subset, so it can swap).
    fn held_mlp(n: usize, h: usize) -> Mlp {
        let mut m = crate::model::mlp::tests::random_mlp(n, h);
        m.neurons = Some((10..10 + n as u32).collect());
        m
    }

    /// A swap to the neurons already held reads nothing and still leaves
    /// the layer in canonical storage order, as a fresh load stores it.
    #[test]
    fn a_swap_to_the_same_neurons_restores_canonical_order() {
        let (n, h) = (12, 8);
        let fresh = held_mlp(n, h);
        let x = Tensor::arange(0f32, (2 * h) as f32, &Device::Cpu)
            .unwrap()
            .affine(0.05, -0.4)
            .unwrap()
            .reshape((1, 2, h))
            .unwrap();
        let want = fresh.activations(&x).unwrap().flatten_all().unwrap();
        let mut held = held_mlp(n, h);
        held.arrange(&[2, 5, 9]).unwrap();
        let ids = held.neurons().unwrap().to_vec();
        let read = held
            .swap_neurons(&ids, |_| panic!("nothing is added"))
            .unwrap();
        assert_eq!(read, 0);
        let got = held.activations(&x).unwrap().flatten_all().unwrap();
        assert_eq!(
            got.to_vec1::<f32>().unwrap(),
            want.to_vec1::<f32>().unwrap()
        );
        assert_eq!(held.front, n);
    }
}
