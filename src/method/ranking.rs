//! Neuron ranking files: what the profiler writes and selective loading reads.
//!
//! # Format (version 1)
//! A safetensors file. For every task `T` and for the model-wide ranking
//! (`model_wide`), two tensors of shape `[layers, intermediate_size]`:
//! - `scores.T` (f32): per-neuron score s_n = Σ_t |a_n(t)| over the task's
//!   profiled tokens, divided by that token count (`model_wide`: the mean of
//!   the tasks' normalised scores);
//! - `order.T` (u32): per layer, neuron indices by descending score (ties by
//!   ascending index) — row `l` is a permutation of `0..intermediate_size`.
//!
//! The safetensors `__metadata__` holds one key, `selectinfer`, whose value is
//! the JSON of [`RankingMeta`]: format name and version, tool version, model
//! identity (architecture, shapes, sha256 of the weights), tasks with their
//! datasets, example and token counts and prompt templates. A single key keeps
//! the bytes deterministic: the same inputs give a byte-identical file.
//!
//! [`Ranking::load`] validates everything (format, version, shapes, finite
//! non-negative scores, orders being permutations consistent with the scores)
//! and [`Ranking::check_model`] refuses a file made for another model.

use crate::model::Config;
use anyhow::{bail, ensure, Context, Result};
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

pub const FORMAT: &str = "selectinfer-neuron-ranking";
pub const VERSION: u32 = 1;
/// The name of the model-wide (secondary) ranking.
pub const MODEL_WIDE: &str = "model_wide";
/// Where a model folder carries its own ranking file, relative to the
/// folder (synthetic models do; in a subfolder, so it is never taken for a
/// weights file).
pub const IN_MODEL_FILE: &str = "ranking/neurons.ranking.safetensors";
const META_KEY: &str = "selectinfer";

/// Which model a ranking belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    pub architecture: String,
    pub num_hidden_layers: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    /// sha256 of the checkpoint's weight file(s), see [`crate::model::weights_sha256`].
    pub weights_sha256: String,
}

impl ModelIdentity {
    pub fn new(cfg: &Config, weights_sha256: String) -> Self {
        Self {
            architecture: cfg.model_type.clone(),
            num_hidden_layers: cfg.num_hidden_layers,
            hidden_size: cfg.hidden_size,
            intermediate_size: cfg.intermediate_size,
            vocab_size: cfg.vocab_size,
            weights_sha256,
        }
    }
}

fn one() -> usize {
    1
}

/// One profiled task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskMeta {
    pub name: String,
    /// Dataset path as given in the profile config.
    pub dataset: String,
    pub dataset_sha256: String,
    /// Rows of the dataset passed over before the first profiled one
    /// (the profile config's `skip`; files without it profiled from row 0).
    #[serde(default)]
    pub skip: usize,
    /// One row in every `stride` after `skip` (files without it: 1).
    #[serde(default = "one")]
    pub stride: usize,
    pub examples: usize,
    /// Rows passed over because their prompt exceeded `max_prompt_tokens`.
    pub skipped_too_long: usize,
    /// Tokens whose activations were scored (prompt + generated).
    pub tokens: u64,
    pub prompt_template: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankingMeta {
    pub format: String,
    pub version: u32,
    pub tool_version: String,
    pub model: ModelIdentity,
    pub tasks: Vec<TaskMeta>,
    /// Generated tokens scored per example after the prompt (at most).
    pub generated_tokens: usize,
    pub score: String,
}

/// Scores and orders of one ranking (a task or the model-wide one).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerRanking {
    /// `[layer][neuron]` normalised scores.
    pub scores: Vec<Vec<f32>>,
    /// `[layer][rank]` neuron index, descending score.
    pub order: Vec<Vec<u32>>,
}

impl LayerRanking {
    /// Builds the orders from scores (descending, ties by ascending index).
    pub fn from_scores(scores: Vec<Vec<f32>>) -> Self {
        let order = scores
            .iter()
            .map(|s| {
                let mut idx: Vec<u32> = (0..s.len() as u32).collect();
                idx.sort_by(|&a, &b| s[b as usize].total_cmp(&s[a as usize]).then(a.cmp(&b)));
                idx
            })
            .collect();
        Self { scores, order }
    }

    /// The `k` top-ranked neurons of `layer`.
    pub fn top(&self, layer: usize, k: usize) -> &[u32] {
        &self.order[layer][..k.min(self.order[layer].len())]
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ranking {
    pub meta: RankingMeta,
    /// Per-task (base) rankings, by task name.
    pub tasks: BTreeMap<String, LayerRanking>,
    /// The model-wide (secondary) ranking.
    pub model_wide: LayerRanking,
}

impl Ranking {
    /// Task names in the file.
    pub fn task_names(&self) -> Vec<&str> {
        self.tasks.keys().map(String::as_str).collect()
    }

    /// The base ranking of `task`, or a clear error listing the known tasks.
    pub fn task(&self, task: &str) -> Result<&LayerRanking> {
        self.tasks.get(task).with_context(|| {
            format!(
                "unknown task '{task}': the ranking has {}",
                self.task_names().join(", ")
            )
        })
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let meta = serde_json::to_string(&self.meta)?;
        let mut buffers: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Vec::new();
        let all = self
            .tasks
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .chain([(MODEL_WIDE, &self.model_wide)]);
        for (name, r) in all {
            let (l, n) = (r.scores.len(), r.scores.first().map_or(0, Vec::len));
            let scores: Vec<u8> = r
                .scores
                .iter()
                .flatten()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let order: Vec<u8> = r
                .order
                .iter()
                .flatten()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            buffers.push((format!("scores.{name}"), vec![l, n], Dtype::F32, scores));
            buffers.push((format!("order.{name}"), vec![l, n], Dtype::U32, order));
        }
        let views = buffers
            .iter()
            .map(|(name, shape, dtype, data)| {
                Ok((
                    name.clone(),
                    safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let metadata: HashMap<String, String> = [(META_KEY.to_string(), meta)].into();
        let bytes = safetensors::serialize(views, Some(metadata))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, bytes)
            .with_context(|| format!("writing ranking file {}", path.display()))
    }

    /// Reads and validates a ranking file.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading ranking file {}", path.display()))?;
        Self::parse(&bytes).with_context(|| format!("invalid ranking file {}", path.display()))
    }

    fn parse(bytes: &[u8]) -> Result<Self> {
        let (_, header) = SafeTensors::read_metadata(bytes)
            .context("not a safetensors file (truncated or corrupt)")?;
        let meta_json = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META_KEY))
            .context("no selectinfer metadata: not a ranking file")?;
        let meta: RankingMeta =
            serde_json::from_str(meta_json).context("malformed ranking metadata")?;
        ensure!(
            meta.format == FORMAT,
            "format is '{}', expected '{FORMAT}'",
            meta.format
        );
        ensure!(
            meta.version == VERSION,
            "format version {} is not supported (this build reads version {VERSION})",
            meta.version
        );
        let st = SafeTensors::deserialize(bytes)
            .context("not a safetensors file (truncated or corrupt)")?;
        let (l, n) = (meta.model.num_hidden_layers, meta.model.intermediate_size);
        ensure!(!meta.tasks.is_empty(), "the ranking has no tasks");
        let read = |name: &str| -> Result<LayerRanking> {
            let scores_t = st
                .tensor(&format!("scores.{name}"))
                .with_context(|| format!("missing tensor scores.{name}"))?;
            let order_t = st
                .tensor(&format!("order.{name}"))
                .with_context(|| format!("missing tensor order.{name}"))?;
            for (t, what, dtype) in [
                (&scores_t, "scores", Dtype::F32),
                (&order_t, "order", Dtype::U32),
            ] {
                ensure!(
                    t.dtype() == dtype,
                    "{what}.{name} has dtype {:?}, expected {dtype:?}",
                    t.dtype()
                );
                ensure!(
                    t.shape() == [l, n],
                    "{what}.{name} has shape {:?}, expected [{l}, {n}]",
                    t.shape()
                );
            }
            let scores: Vec<f32> = scores_t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let order: Vec<u32> = order_t
                .data()
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let r = LayerRanking {
                scores: scores.chunks(n.max(1)).map(<[f32]>::to_vec).collect(),
                order: order.chunks(n.max(1)).map(<[u32]>::to_vec).collect(),
            };
            validate(&r, name)?;
            Ok(r)
        };
        let mut tasks = BTreeMap::new();
        for t in &meta.tasks {
            ensure!(t.name != MODEL_WIDE, "task name '{MODEL_WIDE}' is reserved");
            ensure!(
                tasks.insert(t.name.clone(), read(&t.name)?).is_none(),
                "task '{}' appears twice",
                t.name
            );
        }
        let model_wide = read(MODEL_WIDE)?;
        Ok(Self {
            meta,
            tasks,
            model_wide,
        })
    }

    /// Refuses a ranking made for another model than `cfg` / `weights_sha256`.
    pub fn check_model(&self, cfg: &Config, weights_sha256: &str) -> Result<()> {
        let want = ModelIdentity::new(cfg, weights_sha256.to_string());
        let got = &self.meta.model;
        if *got != want {
            bail!(
                "the ranking was made for another model: it has {} ({} layers, hidden {}, intermediate {}, vocab {}, weights sha256 {}), \
                 the model is {} ({} layers, hidden {}, intermediate {}, vocab {}, weights sha256 {})",
                got.architecture, got.num_hidden_layers, got.hidden_size, got.intermediate_size, got.vocab_size, got.weights_sha256,
                want.architecture, want.num_hidden_layers, want.hidden_size, want.intermediate_size, want.vocab_size, want.weights_sha256
            );
        }
        Ok(())
    }
}

/// Checks scores are finite and non-negative and each order row is the
/// permutation that sorts its scores.
fn validate(r: &LayerRanking, name: &str) -> Result<()> {
    for (layer, (scores, order)) in r.scores.iter().zip(&r.order).enumerate() {
        let n = scores.len();
        if let Some((i, s)) = scores
            .iter()
            .enumerate()
            .find(|(_, s)| !s.is_finite() || **s < 0.0)
        {
            bail!("{name}: layer {layer} neuron {i} has invalid score {s}");
        }
        let mut seen = vec![false; n];
        for &i in order {
            let i = i as usize;
            ensure!(
                i < n,
                "{name}: layer {layer} order has out-of-range neuron index {i} (layer width {n})"
            );
            ensure!(
                !seen[i],
                "{name}: layer {layer} order lists neuron {i} twice"
            );
            seen[i] = true;
        }
        if let Some(w) = order
            .windows(2)
            .find(|w| scores[w[0] as usize] < scores[w[1] as usize])
        {
            bail!(
                "{name}: layer {layer} order is not by descending score (neuron {} before {})",
                w[0],
                w[1]
            );
        }
    }
    Ok(())
}

/// |A ∩ B| / |A ∪ B| of two neuron sets.
pub fn jaccard<T: Copy + Eq + std::hash::Hash>(a: &[T], b: &[T]) -> f64 {
    let set: std::collections::HashSet<T> = a.iter().copied().collect();
    let inter = b.iter().filter(|x| set.contains(x)).count();
    let union = a.len() + b.len() - inter;
    if union == 0 {
        1.0
    } else {
        inter as f64 / union as f64
    }
}
