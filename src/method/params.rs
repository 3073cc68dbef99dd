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
//!   dynamic set ([`Score`]);
//! - `layer_drop`: how the neurons φ leaves out are shared among the sparse
//!   layers ([`SelectionParams::layer_compute_ratio`]; empty: evenly).
//!
//! Ratios become neuron counts by rounding `ratio · N` to the nearest integer.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// Layer numbers from layer indices as a user writes them (negative count
/// from the end: -1 is the last of `n` layers), duplicates dropped.
pub fn resolve_layers(raw: &[i64], n: usize) -> anyhow::Result<Vec<usize>> {
    let n = n as i64;
    let mut layers = Vec::new();
    for &l in raw {
        let r = if l < 0 { n + l } else { l };
        if !(0..n).contains(&r) {
            anyhow::bail!("layer {l} does not exist (the model has {n} layers)");
        }
        if !layers.contains(&(r as usize)) {
            layers.push(r as usize);
        }
    }
    Ok(layers)
}

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
    /// Per layer, its share of the left-out neurons relative to an even
    /// split: layer `l` computes `φ_l = 1 − w_l·(1 − φ)` of its width
    /// (clamped to `[1/N, γ]`); empty = every `w_l` = 1 (φ in every sparse
    /// layer). Weights that average 1 over the sparse layers keep φ's total.
    #[serde(default)]
    pub layer_drop: Vec<f64>,
    /// ρ: of each sparse layer's loaded neurons, the share — the lowest
    /// ranked — held in the coarse tier (down rows in 4 bits over
    /// per-channel scales, [`crate::model::ffn_tier`]) instead of the
    /// dtype's own; 0 = none (load-only mode).
    #[serde(default)]
    pub coarse_ratio: f64,
    /// Bits of the coarse tier's gate and up rows: 4 keeps the file's
    /// blocks as they are, 3 requantizes them to `Q3_0` (a Qwen 1.5B
    /// neuron 2,208 bytes, not 2,784; [`crate::model::ffn_tier`]).
    #[serde(default = "four_bits")]
    pub coarse_bits: u32,
}

fn no_gating() -> f64 {
    1.0
}

fn four_bits() -> u32 {
    4
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
    pub(crate) fn validate(&self, num_layers: usize) -> Result<()> {
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
            ("coarse_ratio", self.coarse_ratio),
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
        if !matches!(self.coarse_bits, 3 | 4) {
            bail!(
                "coarse_bits must be 3 or 4 (bits of the coarse tier's gate and up rows), got {}",
                self.coarse_bits
            );
        }
        if !(0.0..=1.0).contains(&self.coarse_ratio) {
            bail!(
                "coarse_ratio (ρ) must be in [0, 1] (0 = no coarse tier), got {}",
                self.coarse_ratio
            );
        }
        if !self.layer_drop.is_empty() {
            if num_layers != usize::MAX && self.layer_drop.len() != num_layers {
                bail!(
                    "layer_drop has {} weights, but the model has {num_layers} layers",
                    self.layer_drop.len()
                );
            }
            if let Some((l, w)) = self
                .layer_drop
                .iter()
                .enumerate()
                .find(|(_, w)| !(w.is_finite() && **w >= 0.0))
            {
                bail!("layer_drop[{l}] must be a finite weight ≥ 0, got {w}");
            }
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
    pub(crate) fn with_selection(
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
    /// φ_l: the share of layer `l`'s width that its prompts compute
    /// (`layer_drop`, see there), before rounding to neurons.
    pub(crate) fn layer_compute_ratio(&self, layer: usize, width: usize) -> f64 {
        let w = self.layer_drop.get(layer).copied().unwrap_or(1.0);
        (1.0 - w * (1.0 - self.compute_ratio)).clamp(1.0 / width.max(1) as f64, self.load_ratio)
    }

    /// Per gating group of [`crate::kernels::GATE_GROUP`] neurons, how many
    /// run up and down (`None`: κ = 1, no gating).
    pub(crate) fn gate_keep_count(&self) -> Option<usize> {
        let g = crate::kernels::GATE_GROUP;
        (self.gate_keep < 1.0).then(|| count(self.gate_keep, g).clamp(1, g))
    }
}

/// Rounds `ratio · width` to a neuron count.
pub fn count(ratio: f64, width: usize) -> usize {
    ((ratio * width as f64).round() as usize).min(width)
}

/// Of `n_load` loaded neurons, how many `ratio` puts in the coarse tier
/// (the lowest ranked): whole [`LOAD_BLOCK`]s, so that both tiers stay in
/// whole blocks.
pub fn coarse_count(ratio: f64, n_load: usize) -> usize {
    let blocks = (ratio * n_load as f64 / LOAD_BLOCK as f64).round() as usize;
    (blocks * LOAD_BLOCK).min(n_load)
}

/// Neurons a loaded layer holds come in whole blocks of this many: the
/// 8-bit block of the down projection's input in prefill, so the tiled
/// kernels read a selectively loaded layer's quads in place (a count off
/// the block took the dequantizing path: γ 0.97 prefilled 1.08-1.5× dense's
/// time on the 0.5B, where whole blocks take less than dense's).
pub const LOAD_BLOCK: usize = 32;

/// The neurons a sparse layer loads for `ratio · width`: all of them when
/// that rounds to `width`, else the nearest whole number of
/// [`LOAD_BLOCK`]s, at least one and at least `at_least` (rounded up to a
/// block), at most `width`. (φ·N is not raised with it: a selecting mode
/// computes at most what is loaded.)
pub fn load_count(ratio: f64, width: usize, at_least: usize) -> usize {
    if count(ratio, width) >= width {
        return width;
    }
    let wanted = ratio * width as f64 / LOAD_BLOCK as f64;
    let blocks = (wanted.round() as usize)
        .max(1)
        .max(at_least.div_ceil(LOAD_BLOCK));
    (blocks * LOAD_BLOCK).min(width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_counts_come_in_whole_blocks_except_all_of_a_layer() {
        assert_eq!(load_count(0.97, 4864, 0), 4704, "147.4 blocks");
        assert_eq!(load_count(0.7, 1536, 307), 1088, "33.6 blocks");
        assert_eq!(load_count(0.1, 1536, 300), 320, "δ·N rounded up");
        assert_eq!(load_count(0.001, 4864, 0), 32, "at least one block");
        assert_eq!(
            load_count(1.0, 1000, 0),
            1000,
            "a whole layer off the block"
        );
        assert_eq!(load_count(0.9999, 1000, 0), 1000);
        assert_eq!(load_count(0.99, 1000, 0), 992);
        assert_eq!(load_count(0.5, 40, 40), 40, "at most the width");
    }

    fn params(compute_ratio: f64, layer_drop: Vec<f64>) -> SelectionParams {
        SelectionParams {
            load_ratio: 0.9,
            static_ratio: 0.0,
            compute_ratio,
            token_ratio: 0.2,
            dense_layers: vec![],
            task: "qa".into(),
            score: Score::Wina,
            gate_keep: 1.0,
            layer_drop,
            coarse_ratio: 0.0,
            coarse_bits: 4,
        }
    }

    #[test]
    fn layer_drop_shares_the_left_out_neurons_and_is_validated() {
        let even = params(0.6, vec![]);
        let shared = params(0.6, vec![0.0, 0.5, 1.5, 2.0, 9.0]);
        assert_eq!(even.layer_compute_ratio(3, 100), 0.6);
        // φ_l = 1 − w·0.4, within [1/N, γ]: 0.9 (γ), 0.8, 0.4, 0.2, 0.01.
        let got: Vec<f64> = (0..5).map(|l| shared.layer_compute_ratio(l, 100)).collect();
        for (g, w) in got.iter().zip([0.9, 0.8, 0.4, 0.2, 0.01]) {
            assert!((g - w).abs() < 1e-12, "{got:?}");
        }
        assert!(shared.validate(5).is_ok());
        let e = shared.validate(4).unwrap_err().to_string();
        assert!(
            e.contains("layer_drop has 5 weights") && e.contains("4 layers"),
            "{e}"
        );
        let e = params(0.6, vec![1.0, f64::NAN])
            .validate(2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("layer_drop[1]"), "{e}");
    }
}
