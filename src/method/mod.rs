//! SelectInfer itself (layer 3): the method's parameters ([`params`], one
//! validation), its modes ([`mode`]), the profiler's neuron rankings
//! ([`ranking`]), the per-layer load plans built from them ([`plan`], phase
//! 1: which neurons to load) and the per-prompt selection ([`selection`],
//! phase 2: which loaded neurons to compute); a memory budget turned into γ
//! ([`budget`]); which output tokens decode computes ([`vocab`]).
//!
//! At prefill every loaded neuron runs and the prompt's activations choose
//! each sparse layer's rows; the engine then rearranges each layer's loaded
//! rows once per prompt with the chosen ones in front
//! ([`crate::model::Mlp::arrange`]) and decode runs dense on a view of that
//! front: no per-token gathers on the decode path. The model sees only a
//! neutral description of the rows to hold ([`crate::model::FfnRows`]).

pub(crate) mod budget;
pub mod mode;
pub mod params;
pub mod plan;
pub mod ranking;
pub mod selection;
pub mod vocab;

pub use mode::Mode;
pub use params::SelectionParams;
pub use plan::LoadPlan;
pub use selection::LayerSelector;
pub(crate) use selection::PromptCounts;

use crate::model::{Config, FfnRows, Mlp};
use anyhow::{bail, Context, Result};
use params::{count, Score};
use ranking::Ranking;
use selection::positions_of;
use std::path::Path;

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
        if params.coarse_ratio > 0.0 && mode != Mode::LoadOnly {
            bail!(
                "coarse_ratio {} holds a coarse tier beside the loaded neurons, which mode {} does not select among: use mode load-only (or coarse_ratio 0)",
                params.coarse_ratio,
                mode.name()
            );
        }
        let mut ranking_tasks = Vec::new();
        let plan = if mode.needs_ranking() {
            let path = ranking
                .with_context(|| format!("mode {mode:?} needs a ranking file (--ranking)"))?;
            let r = Ranking::load(path)?;
            r.check_model(&cfg, &crate::model::weights_sha256(model_dir)?)
                .with_context(|| format!("ranking file {}", path.display()))?;
            ranking_tasks = r.task_names().into_iter().map(String::from).collect();
            Some(LoadPlan::from_ranking(&r, &params)?)
        } else if mode.loads_subset() {
            Some(LoadPlan::random(
                cfg.num_hidden_layers,
                cfg.intermediate_size,
                &params,
                seed,
            )?)
        } else {
            None
        };
        Ok(Self {
            mode,
            params,
            plan,
            ranking_tasks,
        })
    }

    /// The FFN rows the model holds in this mode.
    pub fn ffn_rows(&self) -> FfnRows {
        match &self.plan {
            _ if self.mode.streams_ffn() => FfnRows::Streamed,
            Some(plan) => plan.ffn_rows(),
            None => FfnRows::All,
        }
    }

    /// Per layer, the neurons held in the coarse tier (empty: none).
    pub fn ffn_coarse(&self) -> Vec<Vec<u32>> {
        self.plan.as_ref().map_or(Vec::new(), LoadPlan::ffn_coarse)
    }

    /// Per-layer selection rules for prompts, `None` when the mode computes
    /// every loaded neuron.
    pub(crate) fn selector(
        &self,
        mlps: &[&Mlp],
        width: usize,
    ) -> Result<Option<Vec<Option<LayerSelector>>>> {
        let p = &self.params;
        if !self.mode.selects() {
            return Ok(None);
        }
        mlps.iter()
            .enumerate()
            .map(|(l, mlp)| {
                if p.dense_layers.contains(&l) {
                    return Ok(None);
                }
                let statics: Vec<u32> = match &self.plan {
                    Some(plan) => plan.layers[l].loaded[..plan.layers[l].num_static].to_vec(),
                    None => Vec::new(),
                };
                let static_positions = positions_of(mlp, &statics);
                let down_norms = match p.score {
                    Score::Wina => Some(mlp.down_norms().with_context(|| {
                        format!("layer {l}: down_proj column norms for the wina score")
                    })?),
                    _ => None,
                };
                Ok(Some(LayerSelector {
                    token_k: count(p.token_ratio, mlp.width()).max(1),
                    dynamic_k: count(p.layer_compute_ratio(l, width), width)
                        .saturating_sub(static_positions.len()),
                    static_positions,
                    score: p.score,
                    down_norms,
                }))
            })
            .collect::<Result<_>>()
            .map(Some)
    }
}
