//! What a model is loaded with ([`LoadOptions`]: dtype, device, context,
//! which FFN neurons it holds and in which tier) and the checks of those
//! options against the model's config, before anything is read.

use super::Config;
use anyhow::{bail, Result};
use candle_core::{DType, Device};

/// Which FFN neurons (rows of gate/up, columns of down) the model holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum FfnRows {
    /// Every neuron of every layer.
    #[default]
    All,
    /// Per layer: `None` holds every neuron, `Some(ids)` only those
    /// (original indices; read from the checkpoint with `pread`).
    Layers(Vec<Option<Vec<u32>>>),
    /// None in memory: each forward pass reads every neuron from the
    /// checkpoint (page cache dropped) and forgets it again.
    Streamed,
}

/// Options fixed at load time.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Weight dtype in memory (f32 or f16 on CPU; bf16 is refused on CPU);
    /// with `quant`, the dtype of the f32 parts (norms, biases).
    pub dtype: DType,
    /// The quantized dtypes (`q8`, `q4`, CPU only): every weight read as
    /// ggml blocks from the model folder's [`super::qfile`].
    pub quant: Option<crate::sys::device::Quant>,
    pub device: Device,
    /// Longest sequence (prompt + generated) this instance serves; defaults to
    /// `min(max_position_embeddings, 4096)`.
    pub max_context: Option<usize>,
    /// Which FFN neurons to hold in memory.
    pub ffn: FfnRows,
    /// Longest run of prompt tokens one forward pass takes; longer prompts
    /// are prefilled in chunks of this many tokens through the KV cache, so
    /// the attention scores (`heads × chunk × context`) and MLP activations
    /// of a long prompt never exist whole. Same logits up to rounding.
    pub prefill_chunk: usize,
    /// A quantized checkpoint's lm_head of its own stays in its file
    /// ([`super::file_rows`]): its screen reads the rows it computes exactly.
    pub head_in_file: bool,
    /// Per layer, neurons held in the coarse tier ([`super::ffn_tier`]: down rows
    /// in 4 bits over per-channel scales), none of them among `ffn`'s;
    /// empty: no tier (quantized dtypes only).
    pub ffn_coarse: Vec<Vec<u32>>,
    /// Bits of the coarse tier's gate and up rows: 4 (the file's blocks)
    /// or 3 (`Q3_0`).
    pub coarse_bits: u32,
    /// How the KV cache holds keys and values ([`super::KvDtype`]).
    pub kv_dtype: super::KvDtype,
}

impl LoadOptions {
    /// Refuses options that do not fit the model (the FFN row selection's
    /// shape, a prefill chunk of 0).
    pub(crate) fn check(&self, cfg: &Config) -> Result<()> {
        cfg.validate()?;
        if self.prefill_chunk == 0 {
            bail!("prefill_chunk must be at least 1 token");
        }
        if self.kv_dtype == super::KvDtype::Q8 && !self.device.is_cpu() {
            bail!("kv_dtype q8 is a CPU cache (the attention kernels read its rows); device {:?} takes kv_dtype f32", self.device);
        }
        if self.kv_dtype == super::KvDtype::Q8 && !cfg.head_dim().is_multiple_of(32) {
            bail!(
                "kv_dtype q8 stores rows in blocks of 32 values; this model's head_dim is {}",
                cfg.head_dim()
            );
        }
        if self.head_in_file && (cfg.tie_word_embeddings || self.quant.is_none()) {
            log::warn!(
                "head_in_file ignored: only a quantized checkpoint's lm_head of its own stays in the file (this one is {})",
                if cfg.tie_word_embeddings { "the embedding table's, held" } else { "not quantized" }
            );
        }
        if let FfnRows::Layers(layers) = &self.ffn {
            same_layers("the FFN row selection", layers.len(), cfg)?;
            let n = cfg.intermediate_size;
            if let Some(&bad) = layers
                .iter()
                .flatten()
                .flatten()
                .find(|&&id| id as usize >= n)
            {
                bail!("the FFN row selection names neuron {bad}; the layers have {n}");
            }
        }
        self.check_coarse(cfg)
    }

    /// The coarse tier's rows: one list a layer, ids in range, each once
    /// and none held in the layer's own MLP too; a quantized dtype.
    fn check_coarse(&self, cfg: &Config) -> Result<()> {
        let tiers = &self.ffn_coarse;
        if tiers.iter().all(Vec::is_empty) {
            return Ok(());
        }
        if self.quant.is_none() {
            bail!("a coarse FFN tier is requantized from a quantized checkpoint: it needs the q8 or q4 dtype");
        }
        same_layers("the coarse FFN tier", tiers.len(), cfg)?;
        let n = cfg.intermediate_size;
        for (l, ids) in tiers.iter().enumerate() {
            let mut held = vec![false; n];
            // Layer counts were checked before.
            let main = match &self.ffn {
                FfnRows::Layers(layers) => layers[l].as_deref(),
                _ => None,
            };
            if main.is_none() && !ids.is_empty() {
                bail!("layer {l} is held whole: it has no neurons left for a coarse tier");
            }
            for &id in main.unwrap_or_default() {
                if let Some(h) = held.get_mut(id as usize) {
                    *h = true;
                }
            }
            for &id in ids {
                match held.get_mut(id as usize) {
                    None => {
                        bail!("layer {l}: the coarse tier names neuron {id}; the layers have {n}")
                    }
                    Some(true) => bail!(
                        "layer {l}: neuron {id} is in the coarse tier twice, or also held exactly"
                    ),
                    Some(h) => *h = true,
                }
            }
        }
        Ok(())
    }
}

/// Refuses a per-layer list (`what`) of `len` layers for a model of another count.
fn same_layers(what: &str, len: usize, cfg: &Config) -> Result<()> {
    if len != cfg.num_hidden_layers {
        bail!(
            "{what} has {len} layers, the model {}",
            cfg.num_hidden_layers
        );
    }
    Ok(())
}
