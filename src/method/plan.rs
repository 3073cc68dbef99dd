//! The per-layer load plan (SelectInfer phase 1): which FFN neurons of each
//! layer are loaded, and which of them are static, built from a ranking
//! file (or drawn at random for the `random-load` baseline).

use super::params::{count, load_count, SelectionParams};
use super::ranking::Ranking;
use crate::model::FfnRows;
use anyhow::Result;

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
    /// not yet chosen, until γ·N per sparse layer (in whole
    /// [`super::params::LOAD_BLOCK`]s).
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
    /// others by `sparse(layer, γ·N, δ·N)`, γ·N by [`load_count`].
    fn per_layer(
        layers: usize,
        width: usize,
        params: &SelectionParams,
        mut sparse: impl FnMut(usize, usize, usize) -> LayerPlan,
    ) -> Result<Self> {
        let n_static = count(params.static_ratio, width);
        let n_load = load_count(params.load_ratio, width, n_static);
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

    /// The rows the model holds under this plan: dense layers whole, the
    /// others their loaded neurons.
    pub fn ffn_rows(&self) -> FfnRows {
        FfnRows::Layers(
            self.layers
                .iter()
                .map(|l| (!l.dense).then(|| l.loaded.clone()))
                .collect(),
        )
    }

    /// Neurons loaded over all layers.
    pub fn loaded_neurons(&self) -> usize {
        self.layers.iter().map(|l| l.loaded.len()).sum()
    }
}
