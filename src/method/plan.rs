//! The per-layer load plan (SelectInfer phase 1): which FFN neurons of each
//! layer are loaded, and which of them are static, built from a ranking
//! file (or drawn at random for the `random-load` baseline).

use super::params::{coarse_count, count, load_count, SelectionParams};
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
    /// How many trailing entries of `loaded` (the lowest ranked) are held
    /// in the coarse tier (`coarse_ratio`).
    pub coarse: usize,
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
            coarse: 0,
        }
    }

    /// A sparse layer loading `loaded`, the first `num_static` of them static.
    fn sparse(loaded: Vec<u32>, num_static: usize) -> Self {
        Self {
            loaded,
            num_static,
            dense: false,
            coarse: 0,
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
        let n_coarse = coarse_count(params.coarse_ratio, n_load);
        let layers = (0..layers)
            .map(|l| match params.dense_layers.contains(&l) {
                true => LayerPlan::dense(width),
                false => LayerPlan {
                    coarse: n_coarse,
                    ..sparse(l, n_load, n_static)
                },
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

    /// The rows the model holds under this plan in the dtype's own
    /// format: dense layers whole, the others their loaded neurons but the
    /// coarse tier's.
    pub fn ffn_rows(&self) -> FfnRows {
        FfnRows::Layers(
            self.layers
                .iter()
                .map(|l| (!l.dense).then(|| l.loaded[..l.loaded.len() - l.coarse].to_vec()))
                .collect(),
        )
    }

    /// Per layer, the neurons held in the coarse tier (empty: none).
    pub fn ffn_coarse(&self) -> Vec<Vec<u32>> {
        if self.layers.iter().all(|l| l.coarse == 0) {
            return Vec::new();
        }
        self.layers
            .iter()
            .map(|l| l.loaded[l.loaded.len() - l.coarse..].to_vec())
            .collect()
    }

    /// Neurons loaded over all layers.
    pub fn loaded_neurons(&self) -> usize {
        self.layers.iter().map(|l| l.loaded.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(load_ratio: f64, coarse_ratio: f64) -> SelectionParams {
        SelectionParams {
            load_ratio,
            static_ratio: 0.2,
            compute_ratio: 0.2,
            token_ratio: 0.2,
            dense_layers: vec![0],
            task: "qa".into(),
            score: Default::default(),
            gate_keep: 1.0,
            layer_drop: Vec::new(),
            coarse_ratio,
            coarse_bits: 4,
        }
    }

    #[test]
    fn the_coarse_tier_is_the_lowest_ranked_whole_blocks_of_the_loaded() {
        let plan = LoadPlan::random(3, 512, &params(0.5, 0.3), 7).unwrap();
        let FfnRows::Layers(main) = plan.ffn_rows() else {
            panic!("a plan names its layers")
        };
        let coarse = plan.ffn_coarse();
        // Layer 0 is whole: no tier.
        assert_eq!((main[0].as_ref(), coarse[0].len()), (None, 0));
        for l in 1..3 {
            let loaded = &plan.layers[l].loaded;
            // 0.3 · 256 = 76.8 neurons: two whole blocks of 32.
            assert_eq!((loaded.len(), coarse[l].len()), (256, 64));
            let main = main[l].as_ref().unwrap();
            assert_eq!(main[..], loaded[..192]);
            assert_eq!(coarse[l][..], loaded[192..]);
        }
        // ρ = 0: no tier at all, the plan's rows as before.
        let plain = LoadPlan::random(3, 512, &params(0.5, 0.0), 7).unwrap();
        assert!(plain.ffn_coarse().is_empty());
        let FfnRows::Layers(all) = plain.ffn_rows() else {
            panic!("a plan names its layers")
        };
        assert_eq!(all[1].as_ref().unwrap(), &plain.layers[1].loaded);
        // ρ = 1 puts every loaded neuron in the tier.
        let every = LoadPlan::random(3, 512, &params(0.5, 1.0), 7).unwrap();
        assert_eq!(every.ffn_coarse()[2], every.layers[2].loaded);
    }
}
