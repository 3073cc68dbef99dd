//! Selective computation per prompt (SelectInfer phase 2): which loaded
//! neurons of a layer decode computes, from the prompt's activations at
//! prefill.
//!
//! For each prompt token the α fraction of loaded neurons with the largest
//! |activation| form the token's active set; the ε·N neurons (not static)
//! active for the most tokens are the prompt's dynamic set (a long prompt
//! prefilled in chunks adds up its chunks' [`PromptCounts`] first).

use crate::model::Mlp;
use anyhow::{bail, Result};
use candle_core::{DType, Tensor, D};

/// Positions (rows) in `mlp` of the original neuron ids `ids`.
pub(crate) fn positions_of(mlp: &Mlp, ids: &[u32]) -> Vec<usize> {
    let mut pos: Vec<usize> = match mlp.neurons() {
        Some(held) => ids
            .iter()
            .filter_map(|id| held.binary_search(id).ok())
            .collect(),
        None => ids.iter().map(|&i| i as usize).collect(),
    };
    pos.sort_unstable();
    pos
}

/// Widest layer whose selection runs on the GPU: candle's CUDA sort keeps a
/// row (padded to a power of two) in shared memory, 32 KiB at 8192.
const DEVICE_SORT_MAX: usize = 8192;

/// Selection rule of one sparse layer.
#[derive(Debug, Clone)]
pub struct LayerSelector {
    /// Rows of the loaded MLP that are always computed, ascending.
    pub static_positions: Vec<usize>,
    /// Per token, how many loaded neurons count as active (α · loaded).
    pub token_k: usize,
    /// How many dynamic neurons to add (ε · N).
    pub dynamic_k: usize,
}

impl LayerSelector {
    /// Rows to compute for a prompt whose MLP activations are `a [1, seq, n]`:
    /// the static rows plus the `dynamic_k` non-static rows most often among
    /// a token's top `token_k` by |activation| (ties: larger Σ|a|, then
    /// lower row). Ascending.
    pub fn select(&self, a: &Tensor) -> Result<Vec<usize>> {
        self.pick(&self.counts(a)?)
    }

    /// Per loaded row of `a [1, seq, n]`: hits and Σ|a| (see
    /// [`Self::counts_on_host`]), computed where `a` lives when that is
    /// possible. Counts of consecutive chunks of a prompt add up to the
    /// prompt's.
    pub fn counts(&self, a: &Tensor) -> Result<PromptCounts> {
        let (hits, mass) = if a.device().is_cpu() || a.dim(D::Minus1)? > DEVICE_SORT_MAX {
            self.counts_on_host(a)?
        } else {
            self.counts_on_device(a)?
        };
        Ok(PromptCounts { hits, mass })
    }

    /// Per loaded row: in how many tokens' top `token_k` it is, and Σ|a|.
    pub fn counts_on_host(&self, a: &Tensor) -> Result<(Vec<u32>, Vec<f64>)> {
        let rows = a.squeeze(0)?.abs()?.to_vec2::<f32>()?;
        let n = rows.first().map_or(0, Vec::len);
        let mut hits = vec![0u32; n];
        let mut mass = vec![0f64; n];
        let k = self.token_k.min(n);
        let mut idx: Vec<usize> = (0..n).collect();
        for row in &rows {
            if k < n {
                idx.select_nth_unstable_by(k, |&x, &y| row[y].total_cmp(&row[x]));
            }
            for &i in &idx[..k] {
                hits[i] += 1;
            }
            for (m, v) in mass.iter_mut().zip(row) {
                *m += f64::from(*v);
            }
        }
        Ok((hits, mass))
    }

    /// [`Self::counts_on_host`] computed where `a` lives (the GPU), with
    /// row-parallel ops only: a sort per token row gives its `token_k`-th
    /// largest |a|, every entry at or above it counts as a hit, and the
    /// hits and Σ|a| are column sums; only the two `[n]` vectors come back to
    /// the host. (Sums in f32 rather than f64, so ties on hits may break
    /// differently; an exact tie at the threshold counts both.)
    pub fn counts_on_device(&self, a: &Tensor) -> Result<(Vec<u32>, Vec<f64>)> {
        let abs = a.squeeze(0)?.abs()?.to_dtype(DType::F32)?.contiguous()?;
        let n = abs.dim(1)?;
        let k = self.token_k.min(n);
        let mass = abs.sum(0)?;
        let hits = if k == 0 {
            Tensor::zeros(n, DType::F32, abs.device())?
        } else {
            let order = abs.arg_sort_last_dim(false)?;
            let kth = order.narrow(1, k - 1, 1)?.contiguous()?;
            let threshold = abs.gather(&kth, 1)?; // [seq, 1]
            abs.broadcast_ge(&threshold)?.to_dtype(DType::F32)?.sum(0)?
        };
        Ok((
            hits.to_vec1::<f32>()?
                .into_iter()
                .map(|h| h as u32)
                .collect(),
            mass.to_vec1::<f32>()?.into_iter().map(f64::from).collect(),
        ))
    }

    /// The static rows plus the `dynamic_k` best non-static rows by
    /// (hits, mass, lower row), ascending.
    pub fn pick(&self, counts: &PromptCounts) -> Result<Vec<usize>> {
        let (hits, mass) = (&counts.hits, &counts.mass);
        let n = hits.len();
        if self.static_positions.iter().any(|&p| p >= n) {
            bail!("static neuron position out of range ({n} loaded)");
        }
        let mut is_static = vec![false; n];
        self.static_positions
            .iter()
            .for_each(|&p| is_static[p] = true);
        let mut candidates: Vec<usize> = (0..n).filter(|&i| !is_static[i]).collect();
        candidates.sort_by(|&x, &y| {
            hits[y]
                .cmp(&hits[x])
                .then(mass[y].total_cmp(&mass[x]))
                .then(x.cmp(&y))
        });
        candidates.truncate(self.dynamic_k);
        let mut chosen: Vec<usize> = self
            .static_positions
            .iter()
            .copied()
            .chain(candidates)
            .collect();
        chosen.sort_unstable();
        Ok(chosen)
    }
}

/// A prompt's selection statistics for one layer, per loaded row: in how
/// many tokens' top α the row is (`hits`) and its Σ|a| (`mass`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptCounts {
    pub hits: Vec<u32>,
    pub mass: Vec<f64>,
}

impl PromptCounts {
    /// Adds the counts of more tokens of the same prompt (the next chunk).
    pub fn add(&mut self, more: PromptCounts) -> Result<()> {
        if self.hits.is_empty() {
            *self = more;
            return Ok(());
        }
        if more.hits.len() != self.hits.len() {
            bail!(
                "selection counts of {} rows added to counts of {} rows",
                more.hits.len(),
                self.hits.len()
            );
        }
        self.hits
            .iter_mut()
            .zip(more.hits)
            .for_each(|(h, m)| *h += m);
        self.mass
            .iter_mut()
            .zip(more.mass)
            .for_each(|(h, m)| *h += m);
        Ok(())
    }
}
