//! Selection parameters and the per-layer load plan (SelectInfer phase 2).
//!
//! All ratios are fractions of a layer's original FFN width N:
//! - γ `load_ratio`: neurons kept in memory per sparse layer — the task's base
//!   neurons first (its top δ·N), then model-wide (secondary) ones until γ·N;
//! - δ `static_ratio`: base neurons always computed;
//! - φ `compute_ratio` = δ + ε: neurons computed per prompt, ε dynamic;
//! - α `token_ratio`: per prompt token, the α fraction of loaded neurons with
//!   the largest activations are that token's active set;
//! - `dense_layers`: layers kept whole.
//!
//! Ratios become neuron counts by rounding `ratio · N` to the nearest integer.

use crate::ranking::Ranking;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The method's knobs, validated together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectionParams {
    pub load_ratio: f64,
    pub static_ratio: f64,
    pub compute_ratio: f64,
    pub token_ratio: f64,
    /// Layers kept dense (all neurons loaded and computed).
    #[serde(default)]
    pub dense_layers: Vec<usize>,
    /// Which base ranking of the ranking file to use.
    pub task: String,
}

impl SelectionParams {
    /// Checks `0 < φ ≤ γ ≤ 1`, `0 ≤ δ ≤ φ`, `0 < α ≤ 1`, naming the parameter at fault.
    pub fn validate(&self, num_layers: usize) -> Result<()> {
        let (g, d, p, a) = (
            self.load_ratio,
            self.static_ratio,
            self.compute_ratio,
            self.token_ratio,
        );
        for (name, v) in [
            ("load_ratio", g),
            ("static_ratio", d),
            ("compute_ratio", p),
            ("token_ratio", a),
        ] {
            if !v.is_finite() {
                bail!("{name} must be a finite number, got {v}");
            }
        }
        if !(g > 0.0 && g <= 1.0) {
            bail!("load_ratio (γ) must be in (0, 1], got {g}");
        }
        if !(p > 0.0 && p <= g) {
            bail!("compute_ratio (φ) must be in (0, load_ratio = {g}], got {p}");
        }
        if !(0.0..=p).contains(&d) {
            bail!("static_ratio (δ) must be in [0, compute_ratio = {p}], got {d}");
        }
        if !(a > 0.0 && a <= 1.0) {
            bail!("token_ratio (α) must be in (0, 1], got {a}");
        }
        if let Some(&l) = self.dense_layers.iter().find(|&&l| l >= num_layers) {
            bail!("dense_layers lists layer {l}, but the model has {num_layers} layers");
        }
        if self.task.is_empty() {
            bail!("task must be set");
        }
        Ok(())
    }
}

/// Rounds `ratio · width` to a neuron count.
pub fn count(ratio: f64, width: usize) -> usize {
    ((ratio * width as f64).round() as usize).min(width)
}

/// Which neurons of one layer are loaded, and which of them are static.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerPlan {
    /// Loaded neurons (original indices): static (base) ones first, in rank
    /// order, then secondary ones in rank order. All when the layer is dense.
    pub loaded: Vec<u32>,
    /// How many leading entries of `loaded` are static (always computed).
    pub num_static: usize,
    pub dense: bool,
}

/// The per-layer load plan built from a ranking file.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadPlan {
    pub layers: Vec<LayerPlan>,
    pub width: usize,
}

impl LayerPlan {
    /// A layer kept whole: every neuron loaded and computed.
    fn dense(width: usize) -> Self {
        Self {
            loaded: (0..width as u32).collect(),
            num_static: width,
            dense: true,
        }
    }

    /// A sparse layer loading `loaded`, the first `num_static` of them static.
    fn sparse(loaded: Vec<u32>, num_static: usize) -> Self {
        Self {
            loaded,
            num_static,
            dense: false,
        }
    }
}

impl LoadPlan {
    /// Base neurons of `params.task` first (top δ·N), then model-wide ones
    /// not yet chosen, until γ·N per sparse layer.
    pub fn from_ranking(ranking: &Ranking, params: &SelectionParams) -> Result<Self> {
        let (layers, width) = (
            ranking.meta.model.num_hidden_layers,
            ranking.meta.model.intermediate_size,
        );
        params.validate(layers)?;
        let base = ranking.task(&params.task)?;
        Self::per_layer(layers, width, params, |l, n_load, n_static| {
            let mut chosen = vec![false; width];
            let mut loaded = Vec::with_capacity(n_load);
            for &n in base.top(l, n_static) {
                chosen[n as usize] = true;
                loaded.push(n);
            }
            for &n in &ranking.model_wide.order[l] {
                if loaded.len() == n_load {
                    break;
                }
                if !chosen[n as usize] {
                    chosen[n as usize] = true;
                    loaded.push(n);
                }
            }
            LayerPlan::sparse(loaded, n_static)
        })
    }

    /// Builds each layer from validated `params`: dense layers whole, the
    /// others by `sparse(layer, γ·N, δ·N)`.
    fn per_layer(
        layers: usize,
        width: usize,
        params: &SelectionParams,
        mut sparse: impl FnMut(usize, usize, usize) -> LayerPlan,
    ) -> Result<Self> {
        let (n_load, n_static) = (
            count(params.load_ratio, width),
            count(params.static_ratio, width),
        );
        let layers = (0..layers)
            .map(|l| match params.dense_layers.contains(&l) {
                true => LayerPlan::dense(width),
                false => sparse(l, n_load, n_static),
            })
            .collect();
        Ok(Self { layers, width })
    }

    /// A plan of `load_ratio · N` neurons per sparse layer drawn at random
    /// (seeded), the first δ·N of them static: the `random-load` baseline.
    pub fn random(
        layers: usize,
        width: usize,
        params: &SelectionParams,
        seed: u64,
    ) -> Result<Self> {
        params.validate(layers)?;
        use rand::seq::SliceRandom;
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        Self::per_layer(layers, width, params, |_, n_load, n_static| {
            let mut all: Vec<u32> = (0..width as u32).collect();
            all.shuffle(&mut rng);
            all.truncate(n_load);
            LayerPlan::sparse(all, n_static)
        })
    }

    /// Neurons loaded over all layers.
    pub fn loaded_neurons(&self) -> usize {
        self.layers.iter().map(|l| l.loaded.len()).sum()
    }
}
