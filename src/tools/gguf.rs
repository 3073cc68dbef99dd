//! candle-transformers' quantized GGUF models (the 4-bit baseline) behind
//! the same generation loop, template and statistics as our engine, so
//! `bench`, `eval` and the baselines comparison run them like any mode.

use crate::engine::decode::{decode_loop, GenerateOptions, Generation, Generator, Steps};
use crate::engine::TextCodec;
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use std::path::Path;

/// candle-transformers' quantized model for either family.
pub enum QuantizedModel {
    Llama(candle_transformers::models::quantized_llama::ModelWeights),
    Qwen2(candle_transformers::models::quantized_qwen2::ModelWeights),
}

impl QuantizedModel {
    /// Loads the GGUF; also returns the bytes of quantized weights read per token.
    pub fn load(path: &Path) -> Result<(Self, u64)> {
        let mut f =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let size = f.metadata()?.len();
        let content = crate::store::convert::read_gguf_header(path, &mut f)?;
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_default();
        if !matches!(arch.as_str(), "llama" | "qwen2") {
            bail!("{}: unsupported GGUF architecture '{arch}'", path.display());
        }
        check_loadable(&content, size)
            .with_context(|| format!("GGUF {} cannot be loaded", path.display()))?;
        let has_output = content.tensor_infos.contains_key("output.weight");
        let bytes: u64 = content
            .tensor_infos
            .iter()
            .filter(|(name, _)| !(has_output && name.as_str() == "token_embd.weight"))
            .map(|(_, t)| {
                (t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size()) as u64
            })
            .sum();
        let model = match arch.as_str() {
            "llama" => Self::Llama(
                candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
                    content,
                    &mut f,
                    &Device::Cpu,
                )
                .with_context(|| format!("loading GGUF {}", path.display()))?,
            ),
            "qwen2" => Self::Qwen2(
                candle_transformers::models::quantized_qwen2::ModelWeights::from_gguf(
                    content,
                    &mut f,
                    &Device::Cpu,
                )
                .with_context(|| format!("loading GGUF {}", path.display()))?,
            ),
            other => bail!(
                "{}: unsupported GGUF architecture '{other}'",
                path.display()
            ),
        };
        Ok((model, bytes))
    }

    pub fn forward(&mut self, ids: &[u32], pos: usize) -> Result<Tensor> {
        let x = Tensor::new(ids, &Device::Cpu)?.unsqueeze(0)?;
        let logits = match self {
            Self::Llama(m) => {
                if pos == 0 {
                    m.clear_kv_cache();
                }
                m.forward(&x, pos)?
            }
            Self::Qwen2(m) => {
                if pos == 0 {
                    m.clear_kv_cache();
                }
                m.forward(&x, pos)?
            }
        };
        Ok(logits.flatten_all()?)
    }
}

/// Entries of one rotary table candle builds at load (positions × half the
/// head dimension): 64 Mi, just above the largest real contexts
/// (Qwen2.5-1M: 1,010,000 × 64 ≈ 61.6 Mi). Candle's peak is about three f32
/// tables of that size (frequencies × positions, cos, sin): at 128 Mi, a
/// llama header with `rope.dimension_count` 65,535 loaded with a peak of
/// 1.6 GB (found by the GGUF fuzzer).
const ROPE_TABLE_MAX: u64 = 1 << 26;

/// Refuses what candle's loaders would panic on or allocate without
/// bound from the header's word alone: tensors reaching past the file or
/// with an empty dimension, zero head counts, a block (or expert) count
/// larger than the tensors the file holds, a rotary table larger than
/// [`ROPE_TABLE_MAX`].
fn check_loadable(content: &gguf_file::Content, file_size: u64) -> Result<()> {
    for (name, t) in &content.tensor_infos {
        let (bs, ts) = (
            t.ggml_dtype.block_size() as u64,
            t.ggml_dtype.type_size() as u64,
        );
        let dims = t.shape.dims();
        // No elements to check against the file, yet its other dimensions
        // size what a forward pass allocates.
        if dims.contains(&0) {
            bail!("tensor {name} has an empty dimension ({dims:?})");
        }
        let end = dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .filter(|n| n.is_multiple_of(bs))
            .and_then(|n| (n / bs).checked_mul(ts))
            .and_then(|b| {
                content
                    .tensor_data_offset
                    .checked_add(t.offset)?
                    .checked_add(b)
            });
        if end.is_none_or(|end| end > file_size) {
            bail!(
                "tensor {name} ({dims:?}, {:?}) does not lie inside the file ({file_size} bytes)",
                t.ggml_dtype
            );
        }
    }
    let arch = content
        .metadata
        .get("general.architecture")
        .and_then(|v| v.to_string().ok().cloned())
        .unwrap_or_default();
    let get = |key: &str| {
        content
            .metadata
            .get(&format!("{arch}.{key}"))
            .and_then(|v| v.to_u32().ok())
            .map(u64::from)
    };
    for key in ["attention.head_count", "attention.head_count_kv"] {
        if get(key) == Some(0) {
            bail!("{arch}.{key} is 0");
        }
    }
    let has = |name: String| content.tensor_infos.contains_key(&name);
    // Bounded by the tensor count: the loop stops at the first one missing.
    if let Some(i) =
        (0..get("block_count").unwrap_or(0)).find(|i| !has(format!("blk.{i}.attn_q.weight")))
    {
        bail!(
            "{arch}.block_count is {}, but there is no tensor blk.{i}.attn_q.weight",
            get("block_count").unwrap_or(0)
        );
    }
    let experts = get("expert_count").filter(|&n| n > 1).unwrap_or(0);
    if let Some(i) = (0..experts).find(|i| !has(format!("blk.0.ffn_gate.{i}.weight"))) {
        bail!("{arch}.expert_count is {experts}, but there is no tensor blk.0.ffn_gate.{i}.weight");
    }
    let rope = match arch.as_str() {
        // candle's llama: 4096 positions × rope.dimension_count / 2.
        "llama" => get("rope.dimension_count").map(|d| 4096 * d.div_ceil(2)),
        // candle's qwen2: context_length × (embedding_length / head_count) / 2
        // (its positions and frequencies are allocated even when the other
        // is 0).
        "qwen2" => get("context_length")
            .zip(get("embedding_length"))
            .map(|(c, e)| {
                let heads = get("attention.head_count").unwrap_or(1).max(1);
                c.max(1) * (e / heads).div_ceil(2).max(1)
            }),
        _ => None,
    };
    if let Some(n) = rope.filter(|&n| n > ROPE_TABLE_MAX) {
        bail!(
            "its rotary dimensions make a table of {n} entries (at most {ROPE_TABLE_MAX} are taken)"
        );
    }
    Ok(())
}

/// The GGUF kept in a prepared model folder, with the folder's tokenizer and
/// chat template.
pub struct GgufEngine {
    model: QuantizedModel,
    codec: TextCodec,
    /// Quantized weight bytes read per token.
    weight_bytes: u64,
    max_context: usize,
}

impl GgufEngine {
    /// The model, its text codec and the weight bytes read per token (for
    /// `bench`, which times a fixed token count with its own loop).
    pub fn into_parts(self) -> (QuantizedModel, TextCodec, u64) {
        (self.model, self.codec, self.weight_bytes)
    }

    /// Loads `model.gguf` of a prepared folder.
    pub fn load(model_dir: &Path) -> Result<Self> {
        let cfg = crate::model::Config::from_file(&model_dir.join("config.json"))?;
        let codec = TextCodec::from_dir(model_dir, &cfg.eos_token_ids())?;
        let (model, weight_bytes) =
            QuantizedModel::load(&model_dir.join(crate::store::prepare::GGUF_FILE))?;
        Ok(Self {
            model,
            codec,
            weight_bytes,
            max_context: cfg.max_position_embeddings.min(4096),
        })
    }
}

struct GgufSteps<'a> {
    model: &'a mut QuantizedModel,
    pos: usize,
}

impl Steps for GgufSteps<'_> {
    fn prefill(&mut self, prompt: &[u32]) -> Result<Tensor> {
        self.pos = prompt.len();
        self.model.forward(prompt, 0)
    }
    fn step(&mut self, token: u32) -> Result<Tensor> {
        let logits = self.model.forward(&[token], self.pos)?;
        self.pos += 1;
        Ok(logits)
    }
}

impl Generator for GgufEngine {
    fn codec(&self) -> &TextCodec {
        &self.codec
    }
    fn max_context(&self) -> usize {
        self.max_context
    }
    fn generate(&mut self, prompt: &[u32], opts: &GenerateOptions) -> Result<Generation> {
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        if prompt.len() + opts.max_new_tokens > self.max_context {
            bail!(
                "the prompt has {} tokens; with max_new_tokens {} it exceeds the context of {} tokens",
                prompt.len(),
                opts.max_new_tokens,
                self.max_context
            );
        }
        let mut steps = GgufSteps {
            model: &mut self.model,
            pos: 0,
        };
        let out = decode_loop(&self.codec, prompt, opts, &mut steps, &mut |_| true)?;
        Ok(out.into_generation(prompt.len(), 1.0, self.weight_bytes))
    }
}
