//! Selective computation (SelectInfer phase 2, per prompt) and the engine
//! modes that combine it with selective loading.
//!
//! At prefill every loaded neuron runs. For each prompt token the α fraction
//! of loaded neurons with the largest |activation| form the token's active
//! set; the ε·N neurons (not static) active for the most tokens are the
//! prompt's dynamic set (a long prompt prefilled in chunks adds up its
//! chunks' [`PromptCounts`] first). Each layer's loaded rows are then
//! rearranged once per prompt with the static + dynamic ones in front
//! ([`crate::model::Mlp::arrange`]) and decode runs dense on a view of that
//! front: no per-token gathers on the decode path.

use crate::model::{Config, Mlp};
use crate::plan::{count, LoadPlan, SelectionParams};
use crate::ranking::Ranking;
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor, D};
use std::path::Path;

/// How the engine treats the FFN.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every neuron loaded and computed.
    Dense,
    /// γ of the neurons loaded (base then secondary), all loaded ones computed.
    LoadOnly,
    /// γ loaded; δ static + ε dynamic (chosen at prefill) computed.
    Selectinfer,
    /// Full load, φ·N neurons chosen dynamically per prompt (no profiler).
    Coreinfer,
    /// A random γ subset loaded, then as selectinfer.
    RandomLoad,
    /// The disk-offloading baseline: every neuron computed, FFN weights read
    /// from disk (page cache dropped) at every forward pass, none kept.
    DiskOffload,
}

impl Mode {
    /// The mode's name as written on the command line and in YAML.
    pub fn name(self) -> &'static str {
        match self {
            Self::Dense => "dense",
            Self::LoadOnly => "load-only",
            Self::Selectinfer => "selectinfer",
            Self::Coreinfer => "coreinfer",
            Self::RandomLoad => "random-load",
            Self::DiskOffload => "disk-offload",
        }
    }

    pub fn needs_ranking(self) -> bool {
        matches!(self, Self::LoadOnly | Self::Selectinfer)
    }
}

/// What a mode needs at load time and per prompt.
#[derive(Debug, Clone)]
pub struct Method {
    pub mode: Mode,
    pub params: SelectionParams,
    pub plan: Option<LoadPlan>,
    /// Tasks of the ranking file, when the mode read one.
    pub ranking_tasks: Vec<String>,
}

impl Method {
    /// Builds the load plan of `mode` (reading and checking the ranking when
    /// the mode needs one).
    pub fn new(
        mode: Mode,
        params: SelectionParams,
        model_dir: &Path,
        ranking: Option<&Path>,
        seed: u64,
    ) -> Result<Self> {
        let cfg = Config::from_file(&model_dir.join("config.json"))?;
        params.validate(cfg.num_hidden_layers)?;
        let mut ranking_tasks = Vec::new();
        let plan = match mode {
            Mode::Dense | Mode::Coreinfer | Mode::DiskOffload => None,
            Mode::LoadOnly | Mode::Selectinfer => {
                let path = ranking
                    .with_context(|| format!("mode {mode:?} needs a ranking file (--ranking)"))?;
                let r = Ranking::load(path)?;
                r.check_model(&cfg, &crate::model::weights_sha256(model_dir)?)
                    .with_context(|| format!("ranking file {}", path.display()))?;
                ranking_tasks = r.task_names().into_iter().map(String::from).collect();
                Some(LoadPlan::from_ranking(&r, &params)?)
            }
            Mode::RandomLoad => Some(LoadPlan::random(
                cfg.num_hidden_layers,
                cfg.intermediate_size,
                &params,
                seed,
            )?),
        };
        Ok(Self {
            mode,
            params,
            plan,
            ranking_tasks,
        })
    }

    /// Per-layer selection rules for prompts, `None` when the mode computes
    /// every loaded neuron.
    pub fn selector(&self, mlps: &[&Mlp], width: usize) -> Option<Vec<Option<LayerSelector>>> {
        let p = &self.params;
        let selects = matches!(
            self.mode,
            Mode::Selectinfer | Mode::Coreinfer | Mode::RandomLoad
        );
        if !selects {
            return None;
        }
        let n_compute = count(p.compute_ratio, width);
        Some(
            mlps.iter()
                .enumerate()
                .map(|(l, mlp)| {
                    if p.dense_layers.contains(&l) {
                        return None;
                    }
                    let statics: Vec<u32> = match &self.plan {
                        Some(plan) => plan.layers[l].loaded[..plan.layers[l].num_static].to_vec(),
                        None => Vec::new(),
                    };
                    let static_positions = positions_of(mlp, &statics);
                    Some(LayerSelector {
                        token_k: count(p.token_ratio, mlp.width()).max(1),
                        dynamic_k: n_compute.saturating_sub(static_positions.len()),
                        static_positions,
                    })
                })
                .collect(),
        )
    }
}

/// Positions (rows) in `mlp` of the original neuron ids `ids`.
fn positions_of(mlp: &Mlp, ids: &[u32]) -> Vec<usize> {
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
