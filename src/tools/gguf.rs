//! candle-transformers' quantized GGUF models (the 4-bit baseline) behind
//! the same generation loop, template and statistics as our engine, so
//! `bench`, `eval` and the baselines comparison run them like any mode.

use crate::engine::decode::{decode_loop, GenerateOptions, Generation, Generator, Steps};
use crate::engine::text::TextCodec;
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
        let content = gguf_file::Content::read(&mut f)
            .with_context(|| format!("reading GGUF {}", path.display()))?;
        let has_output = content.tensor_infos.contains_key("output.weight");
        let bytes: u64 = content
            .tensor_infos
            .iter()
            .filter(|(name, _)| !(has_output && name.as_str() == "token_embd.weight"))
            .map(|(_, t)| {
                (t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size()) as u64
            })
            .sum();
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_default();
        let model = match arch.as_str() {
            "llama" => Self::Llama(
                candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
                    content,
                    &mut f,
                    &Device::Cpu,
                )?,
            ),
            "qwen2" => Self::Qwen2(
                candle_transformers::models::quantized_qwen2::ModelWeights::from_gguf(
                    content,
                    &mut f,
                    &Device::Cpu,
                )?,
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
            QuantizedModel::load(&model_dir.join(crate::tools::prepare::GGUF_FILE))?;
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
