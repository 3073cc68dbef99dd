//! Selective computation per prompt (SelectInfer phase 2): which loaded
//! neurons of a layer decode computes, from the prompt's activations at
//! prefill.
//!
//! The paper's rule ([`Score::Counts`]): for each prompt token the α
//! fraction of loaded neurons with the largest |activation| form the token's
//! active set; the ε·N neurons (not static) active for the most tokens are
//! the prompt's dynamic set. [`Score::Griffin`] and [`Score::Wina`] rank by
//! normalised activation energy instead (see there). A long prompt
//! prefilled in chunks adds up its chunks' [`PromptCounts`] first.

use super::params::Score;
use crate::kernels::energy;
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
    /// How the dynamic neurons are ranked.
    pub score: Score,
    /// `‖down_j‖₂` per loaded row in canonical order ([`Score::Wina`] only).
    pub down_norms: Option<Vec<f32>>,
}

impl LayerSelector {
    /// Rows to compute for a prompt whose MLP activations are `a [1, seq, n]`:
    /// the static rows plus the `dynamic_k` non-static rows most often among
    /// a token's top `token_k` by |activation| (ties: larger Σ|a|, then
    /// lower row). Ascending.
    pub fn select(&self, a: &Tensor) -> Result<Vec<usize>> {
        self.pick(&self.counts_in(a, None)?)
    }

    /// [`Self::counts_in`] of activations in canonical order.
    #[cfg(test)]
    pub(crate) fn counts(&self, a: &Tensor) -> Result<PromptCounts> {
        self.counts_in(a, None)
    }

    /// Per loaded row of `a [1, seq, n]`: hits and Σ|a| (see
    /// [`Self::counts_on_host`]) for [`Score::Counts`], else its energy,
    /// computed where `a` lives when that is possible. `a` is in an MLP's
    /// storage order: `stored[c]` is the column of canonical row `c`
    /// (`None`: the same); the energy scores read `a` through it on the
    /// CPU, otherwise `a` is put in canonical order first. Counts of
    /// consecutive chunks of a prompt add up to the prompt's.
    pub(crate) fn counts_in(&self, a: &Tensor, stored: Option<&[u32]>) -> Result<PromptCounts> {
        let weights = match (&self.score, &self.down_norms) {
            (Score::Wina, Some(c)) => Some(c.as_slice()),
            (Score::Wina, None) => bail!("the wina score needs the down_proj column norms"),
            _ => None,
        };
        let n = a.dim(D::Minus1)?;
        if let Some(s) = stored.filter(|s| s.len() != n || s.iter().any(|&c| c as usize >= n)) {
            bail!(
                "a storage order of {} rows for {n} activations per token",
                s.len()
            );
        }
        if self.score != Score::Counts && a.device().is_cpu() && a.dtype() == DType::F32 {
            let a = a.contiguous()?;
            let energy =
                crate::kernels::with_f32(&a, |v| Ok(energy_on_host(v, n, weights, stored)))?;
            return Ok(PromptCounts {
                energy,
                ..Default::default()
            });
        }
        let a = match stored {
            Some(s) => a.index_select(&Tensor::new(s, a.device())?, a.rank() - 1)?,
            None => a.clone(),
        };
        if self.score != Score::Counts {
            return Ok(PromptCounts {
                energy: energy_on_device(&a, weights)?,
                ..Default::default()
            });
        }
        let (hits, mass) = if a.device().is_cpu() || n > DEVICE_SORT_MAX {
            self.counts_on_host(&a)?
        } else {
            self.counts_on_device(&a)?
        };
        Ok(PromptCounts {
            hits,
            mass,
            energy: Vec::new(),
        })
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

    /// The static rows plus the `dynamic_k` best non-static rows, ascending:
    /// by (hits, mass, lower row) for [`Score::Counts`], else by (energy,
    /// lower row).
    pub(crate) fn pick(&self, counts: &PromptCounts) -> Result<Vec<usize>> {
        let (hits, mass, energy) = (&counts.hits, &counts.mass, &counts.energy);
        let n = match self.score {
            Score::Counts => hits.len(),
            _ => energy.len(),
        };
        if self.static_positions.iter().any(|&p| p >= n) {
            bail!("static neuron position out of range ({n} loaded)");
        }
        let mut is_static = vec![false; n];
        self.static_positions
            .iter()
            .for_each(|&p| is_static[p] = true);
        let mut candidates: Vec<usize> = (0..n).filter(|&i| !is_static[i]).collect();
        // Best first; a total order (ties to the lower row), so the best
        // `dynamic_k` are one set, found without sorting them all.
        let better = |&x: &usize, &y: &usize| match self.score {
            Score::Counts => hits[y]
                .cmp(&hits[x])
                .then(mass[y].total_cmp(&mass[x]))
                .then(x.cmp(&y)),
            _ => energy[y].total_cmp(&energy[x]).then(x.cmp(&y)),
        };
        if (1..candidates.len()).contains(&self.dynamic_k) {
            candidates.select_nth_unstable_by(self.dynamic_k - 1, better);
        }
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

/// The energy scores' statistic, per loaded row `j` of `a [1, seq, n]`
/// with weights `w` (`None`: 1): `Σ_t (w_j·a[t,j])² / Σ_i (w_i·a[t,i])²`,
/// each token's share of its weighted energy (a token whose activations are
/// all zero adds nothing). Here with tensor ops in f32, where `a` lives
/// (the GPU); [`energy_on_host`] on the CPU.
fn energy_on_device(a: &Tensor, w: Option<&[f32]>) -> Result<Vec<f64>> {
    let a = a.squeeze(0)?.to_dtype(DType::F32)?;
    let a = match w {
        Some(w) => a.broadcast_mul(&Tensor::new(w, a.device())?)?,
        None => a,
    };
    let sq = a.sqr()?;
    let norms = sq.sum_keepdim(1)?.clamp(f32::MIN_POSITIVE, f32::INFINITY)?;
    let e = sq.broadcast_div(&norms)?.sum(0)?;
    Ok(e.to_vec1::<f32>()?.into_iter().map(f64::from).collect())
}

/// [`energy_on_device`] on the host, on the prefill's activations where
/// they lie (`n` per token, canonical row `c` in column `stored[c]`, each
/// `< n`): per token `1 / Σ_c w_c²·a_c²` summed in canonical order, then
/// every column's `a² / norm` summed over the tokens
/// ([`energy::column_energies`]), times `w²`. The result depends
/// on neither the storage order nor the threads nor the back end.
fn energy_on_host(a: &[f32], n: usize, w: Option<&[f32]>, stored: Option<&[u32]>) -> Vec<f64> {
    if n == 0 {
        return Vec::new();
    }
    let w2: Vec<f32> = match w {
        Some(w) => w.iter().map(|&x| x * x).collect(),
        None => vec![1.0; n],
    };
    let by_column = energy::column_energies(a, n, &w2, stored);
    (0..n)
        .map(|c| f64::from(w2[c]) * by_column[stored.map_or(c, |s| s[c] as usize)])
        .collect()
}

/// A prompt's selection statistics for one layer, per loaded row: in how
/// many tokens' top α the row is (`hits`) and its Σ|a| (`mass`) for
/// [`Score::Counts`]; its normalised energy for the other scores.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PromptCounts {
    pub hits: Vec<u32>,
    pub mass: Vec<f64>,
    pub energy: Vec<f64>,
}

impl PromptCounts {
    /// Adds the counts of more tokens of the same prompt (the next chunk).
    pub(crate) fn add(&mut self, more: PromptCounts) -> Result<()> {
        if self.hits.is_empty() && self.energy.is_empty() {
            *self = more;
            return Ok(());
        }
        if more.hits.len() != self.hits.len() || more.energy.len() != self.energy.len() {
            bail!(
                "selection counts of {} rows added to counts of {} rows",
                more.hits.len().max(more.energy.len()),
                self.hits.len().max(self.energy.len())
            );
        }
        self.energy
            .iter_mut()
            .zip(more.energy)
            .for_each(|(h, m)| *h += m);
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn selector(score: Score, dynamic_k: usize, down_norms: Option<Vec<f32>>) -> LayerSelector {
        LayerSelector {
            static_positions: vec![0],
            token_k: 2,
            dynamic_k,
            score,
            down_norms,
        }
    }

    #[test]
    fn griffin_normalises_each_token_and_wina_weighs_by_the_down_norms() {
        // Token 0 is loud, token 1 quiet: the paper's counts tie rows 1, 2
        // and 3 (each in one token's top 2) and Σ|a| then favours row 1;
        // GRIFFIN's per-token normalised energy favours row 3, token 1's
        // main neuron.
        let a = Tensor::new(
            &[[[10f32, 9.0, 0.0, 0.5], [0.0, 0.0, 0.2, -1.0]]],
            &Device::Cpu,
        )
        .unwrap();
        let c = selector(Score::Counts, 1, None);
        assert_eq!(c.pick(&c.counts(&a).unwrap()).unwrap(), vec![0, 1]);
        let g = selector(Score::Griffin, 1, None);
        let e = g.counts(&a).unwrap().energy;
        let (n0, n1) = (181.25f64, 1.04f64);
        let want = [100.0 / n0, 81.0 / n0, 0.04 / n1, 0.25 / n0 + 1.0 / n1];
        for (e, w) in e.iter().zip(want) {
            assert!((e - w).abs() < 1e-6, "{e} vs {w}");
        }
        assert_eq!(g.pick(&g.counts(&a).unwrap()).unwrap(), vec![0, 3]);
        // WINA: row 1's output weighs 100× the others'.
        let w = selector(Score::Wina, 1, Some(vec![1.0, 100.0, 1.0, 1.0]));
        assert_eq!(w.pick(&w.counts(&a).unwrap()).unwrap(), vec![0, 1]);
        let e = selector(Score::Wina, 1, None).counts(&a).unwrap_err();
        assert!(e.to_string().contains("column norms"), "{e}");
    }

    #[test]
    fn energies_of_chunks_add_up_and_every_row_can_be_chosen() {
        let a = Tensor::new(
            &[[[1f32, 2.0, 3.0], [0.0, 0.0, 0.0], [-3.0, 1.0, 0.5]]],
            &Device::Cpu,
        )
        .unwrap();
        let sel = selector(Score::Griffin, 2, None);
        let whole = sel.counts(&a).unwrap();
        let mut parts = PromptCounts::default();
        for t in 0..3 {
            parts
                .add(sel.counts(&a.narrow(1, t, 1).unwrap()).unwrap())
                .unwrap();
        }
        for (x, y) in whole.energy.iter().zip(&parts.energy) {
            assert!((x - y).abs() < 1e-6);
        }
        assert_eq!(sel.pick(&whole).unwrap(), vec![0, 1, 2]);
        let mismatched = PromptCounts {
            energy: vec![1.0],
            ..Default::default()
        };
        assert!(parts.add(mismatched).is_err());
    }

    #[test]
    fn host_energies_match_the_tensor_ops_and_ignore_the_storage_order() {
        // 70 tokens (groups of 32 and a rest), 83 rows (not a multiple of
        // the sixteen lanes), a token of zeros among them.
        let (tokens, n) = (70usize, 83usize);
        let mut v: Vec<f32> = (0..tokens * n)
            .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * (1 + i % 5) as f32)
            .collect();
        v[5 * n..6 * n].iter_mut().for_each(|x| *x = 0.0);
        let w: Vec<f32> = (0..n).map(|j| 0.5 + (j % 7) as f32).collect();
        let canonical = Tensor::from_vec(v.clone(), (1, tokens, n), &Device::Cpu).unwrap();
        let sel = selector(Score::Wina, 20, Some(w.clone()));
        let host = sel.counts(&canonical).unwrap().energy;
        let ops = energy_on_device(&canonical, Some(&w)).unwrap();
        for (j, (h, o)) in host.iter().zip(&ops).enumerate() {
            assert!(
                (h - o).abs() <= 1e-5 * o.abs().max(1e-3),
                "row {j}: {h} vs {o}"
            );
        }
        // The same activations stored in another order (canonical row `c`
        // in column `stored[c]`): the same energies, to the bit.
        let stored: Vec<u32> = (0..n as u32).map(|c| (c * 31 + 11) % n as u32).collect();
        let mut moved = vec![0f32; v.len()];
        for t in 0..tokens {
            for c in 0..n {
                moved[t * n + stored[c] as usize] = v[t * n + c];
            }
        }
        let moved = Tensor::from_vec(moved, (1, tokens, n), &Device::Cpu).unwrap();
        let again = sel.counts_in(&moved, Some(&stored)).unwrap().energy;
        assert!(host
            .iter()
            .zip(&again)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let mut repeated = stored.clone();
        repeated[1] = repeated[0];
        let bad = sel.counts_in(&moved, Some(&repeated[..n - 1]));
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("storage order of 82 rows"));
    }
}
