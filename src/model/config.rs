//! Model configuration, read from an HF checkpoint's `config.json`.
//!
//! One `Config` covers the Llama (incl. Llama 3.x `rope_scaling`) and Qwen2
//! families; the differences the implementation cares about are exposed as
//! methods (`family`, `qkv_bias`, `head_dim`, ...).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Llama 3.x RoPE frequency scaling (`rope_scaling` with `rope_type: llama3`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct RopeScaling {
    #[serde(alias = "type")]
    pub rope_type: String,
    #[serde(default = "one")]
    pub factor: f64,
    #[serde(default = "one")]
    pub low_freq_factor: f64,
    #[serde(default = "four")]
    pub high_freq_factor: f64,
    #[serde(default)]
    pub original_max_position_embeddings: usize,
}

fn one() -> f64 {
    1.0
}
fn four() -> f64 {
    4.0
}

/// `eos_token_id` may be one id or a list.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub(crate) enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub(crate) fn to_vec(&self) -> Vec<u32> {
        match self {
            Self::One(x) => vec![*x],
            Self::Many(v) => v.clone(),
        }
    }
}

/// Architecture family of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Family {
    Llama,
    Qwen2,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Config {
    #[serde(default)]
    pub architectures: Vec<String>,
    #[serde(default)]
    pub model_type: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub(crate) rope_scaling: Option<RopeScaling>,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub(crate) eos_token_id: Option<TokenIds>,
}

fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_max_positions() -> usize {
    4096
}
fn default_act() -> String {
    "silu".to_string()
}

impl Config {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let cfg: Config = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a valid model config", path.display()))?;
        cfg.validate()
            .with_context(|| format!("invalid model config {}", path.display()))?;
        Ok(cfg)
    }

    pub(crate) fn family(&self) -> Result<Family> {
        let arch = self.architectures.first().map(String::as_str).unwrap_or("");
        match (self.model_type.as_str(), arch) {
            ("llama", _) | (_, "LlamaForCausalLM") => Ok(Family::Llama),
            ("qwen2", _) | (_, "Qwen2ForCausalLM") => Ok(Family::Qwen2),
            (mt, arch) => bail!("unsupported model_type '{mt}' / architecture '{arch}' (llama and qwen2 are supported)"),
        }
    }

    pub(crate) fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Whether q/k/v projections carry biases (Qwen2 does, Llama normally not).
    pub(crate) fn qkv_bias(&self) -> bool {
        self.attention_bias
            .unwrap_or(matches!(self.family(), Ok(Family::Qwen2)))
    }

    pub(crate) fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token_id
            .as_ref()
            .map(TokenIds::to_vec)
            .unwrap_or_default()
    }

    pub fn validate(&self) -> Result<()> {
        self.family()?;
        let checks: [(bool, String); 6] = [
            (self.hidden_size > 0 && self.intermediate_size > 0 && self.vocab_size > 0, "sizes must be positive".into()),
            (self.num_hidden_layers > 0, "num_hidden_layers must be positive".into()),
            (
                self.num_attention_heads > 0 && self.num_kv_heads() > 0
                    && self.num_attention_heads.is_multiple_of(self.num_kv_heads()),
                format!(
                    "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                    self.num_attention_heads,
                    self.num_kv_heads()
                ),
            ),
            (self.head_dim().is_multiple_of(2) && self.head_dim() > 0, format!("head_dim {} must be even", self.head_dim())),
            (self.hidden_act == "silu", format!("hidden_act '{}' is not supported (silu only)", self.hidden_act)),
            (self.rms_norm_eps > 0.0 && self.rope_theta > 0.0, "rms_norm_eps and rope_theta must be positive".into()),
        ];
        for (ok, msg) in checks {
            if !ok {
                bail!(msg);
            }
        }
        if let Some(s) = &self.rope_scaling {
            match s.rope_type.as_str() {
                "default" => {}
                "llama3" => {
                    if s.factor <= 0.0
                        || s.high_freq_factor <= s.low_freq_factor
                        || s.original_max_position_embeddings == 0
                    {
                        bail!("rope_scaling (llama3) needs factor > 0, high_freq_factor > low_freq_factor and original_max_position_embeddings > 0");
                    }
                }
                other => {
                    bail!("rope_scaling type '{other}' is not supported (llama3 and default are)")
                }
            }
        }
        Ok(())
    }

    /// Number of weights in one layer's FFN (gate, up and down).
    pub(crate) fn ffn_params_per_layer(&self) -> usize {
        3 * self.hidden_size * self.intermediate_size
    }
}
