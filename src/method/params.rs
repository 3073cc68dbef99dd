//! The method's parameters, validated in one place.
//!
//! All ratios are fractions of a layer's original FFN width N:
//! - γ `load_ratio`: neurons kept in memory per sparse layer — the task's base
//!   neurons first (its top δ·N), then model-wide (secondary) ones until γ·N;
//! - δ `static_ratio`: base neurons always computed;
//! - φ `compute_ratio` = δ + ε: neurons computed per prompt, ε dynamic;
//! - α `token_ratio`: per prompt token, the α fraction of loaded neurons with
//!   the largest activations are that token's active set;
//! - `dense_layers`: layers kept whole;
//! - `score`: how a prompt's activations rank the loaded neurons for its
//!   dynamic set ([`Score`]).
//!
//! Ratios become neuron counts by rounding `ratio · N` to the nearest integer.

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
    /// How the prompt's activations rank the loaded neurons (dynamic set).
    #[serde(default)]
    pub score: Score,
    /// κ: per decode token, the share of the computed neurons that run
    /// their up and down rows — those with the largest |silu(gate)| in each
    /// group of 64 ([`crate::kernels::swiglu_mlp_gated`]); 1 = no gating.
    #[serde(default = "no_gating")]
    pub gate_keep: f64,
}

fn no_gating() -> f64 {
    1.0
}

/// How prefill ranks a layer's loaded neurons for the prompt's dynamic set,
/// from the activations `a[t, j]` (input of `down_proj`) of prompt tokens `t`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Score {
    /// The paper's: in how many tokens' top α by |a| the neuron is (ties: Σ|a|).
    #[default]
    Counts,
    /// GRIFFIN's (arXiv 2404.01365): `Σ_t (a[t,j] / ‖a[t]‖₂)²`, each token's
    /// activations normalised so that no token dominates; α is unused.
    Griffin,
    /// GRIFFIN's statistic over contributions `a[t,j] · ‖down_j‖₂` (the
    /// neuron's output norm, as WINA, arXiv 2505.19427, weighs activations).
    Wina,
}

crate::sys::named::impl_named!(Score, "score", {
    Counts => "counts",
    Griffin => "griffin",
    Wina => "wina",
});

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
            ("gate_keep", self.gate_keep),
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
        let k = self.gate_keep;
        if !(k > 0.0 && k <= 1.0) {
            bail!("gate_keep (κ) must be in (0, 1] (1 = no per-token gating), got {k}");
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

impl SelectionParams {
    /// These parameters with φ and α changed (what may change between
    /// prompts), validated against the rest.
    pub fn with_selection(
        &self,
        compute_ratio: f64,
        token_ratio: f64,
        num_layers: usize,
    ) -> Result<Self> {
        let p = Self {
            compute_ratio,
            token_ratio,
            ..self.clone()
        };
        p.validate(num_layers)?;
        Ok(p)
    }
}

impl SelectionParams {
    /// Per gating group of [`crate::kernels::GATE_GROUP`] neurons, how many
    /// run up and down (`None`: κ = 1, no gating).
    pub fn gate_keep_count(&self) -> Option<usize> {
        let g = crate::kernels::GATE_GROUP;
        (self.gate_keep < 1.0).then(|| count(self.gate_keep, g).clamp(1, g))
    }
}

/// Rounds `ratio · width` to a neuron count.
pub fn count(ratio: f64, width: usize) -> usize {
    ((ratio * width as f64).round() as usize).min(width)
}
