//! What a model will cost in memory before it is loaded, read from the
//! checkpoint's headers (nothing else is read): the weights outside the FFN,
//! one FFN neuron's bytes per layer, the KV cache at the longest context
//! served and the largest prefill temporaries. A memory budget
//! ([`crate::method::budget`]) plans how many neurons fit from these.

use super::{qfile, safetensors_files, Config, KvDtype, LoadOptions, Model};
use anyhow::{Context, Result};
use std::path::Path;

/// Bytes a model needs in memory, by part.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Footprint {
    /// Embeddings and lm_head (unless a quantized checkpoint's stay in its
    /// file), attention, norms, biases: held whole in every mode.
    pub other_weights: u64,
    /// Per layer: one FFN neuron's gate row, up row and down column.
    pub neuron_bytes: Vec<u64>,
    /// Per layer: one neuron's bytes in the coarse tier ([`super::ffn_tier`];
    /// `neuron_bytes` where the dtype has none).
    pub coarse_neuron_bytes: Vec<u64>,
    /// FFN neurons per layer.
    pub width: usize,
    /// The KV cache when it holds [`Footprint::context`] positions.
    pub kv_cache: u64,
    /// The largest temporaries of one prefill chunk at the longest context:
    /// activations, attention scores, the f32 copy a quantized prefill
    /// dequantizes a weight chunk into.
    pub activations: u64,
    /// The longest sequence served.
    pub context: usize,
    /// What a coarse tier adds to a prefill chunk's temporaries: its
    /// output, scaled, and the sum with the layer's own (three rows of
    /// the hidden size a token; [`super::ffn_tier`]).
    pub coarse_activations: u64,
}

impl Footprint {
    /// The footprint of the model in `dir` loaded with `opts` (dtype, max
    /// context and prefill chunk; the FFN selection is what a plan decides).
    pub(crate) fn of(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        let cfg = Config::from_file(&dir.join("config.json"))?;
        let width = cfg.intermediate_size;
        let (other_weights, neuron_bytes, coarse_neuron_bytes) = match opts.quant {
            Some(q) => {
                let path = dir.join(qfile::file_name(q.name()));
                let file = qfile::QFile::open(&path)?;
                // The matrices read from the file take no memory.
                let other = (file.header.tensors.iter())
                    .filter(|(name, _)| {
                        !super::file_rows::stays_in_file(name, &cfg, opts.head_in_file)
                    })
                    .map(|(_, e)| e.bytes)
                    .sum();
                let neurons = file
                    .header
                    .ffn
                    .iter()
                    .map(|l| l.bytes / l.neurons.max(1) as u64)
                    .collect();
                let coarse = (file.header.ffn.iter())
                    .map(|l| {
                        let layout = l.layout()?;
                        let tier = super::ffn_tier::layout(&layout, opts.coarse_bits)?;
                        Ok(tier.bundle_bytes() as u64)
                    })
                    .collect::<Result<_>>()
                    .with_context(|| format!("{}: its FFN layouts", path.display()))?;
                (other, neurons, coarse)
            }
            None => {
                let files = safetensors_files(dir)?;
                let source = super::rowread::RowSource::open(&files)
                    .with_context(|| format!("reading the tensor index in {}", dir.display()))?;
                let size = opts.dtype.size_in_bytes() as u64;
                let other = source
                    .tensors()
                    .filter(|(name, _)| !name.contains(".mlp."))
                    .map(|(_, e)| e.shape.iter().product::<usize>() as u64 * size)
                    .sum();
                let neuron = 3 * cfg.hidden_size as u64 * size;
                let neurons = vec![neuron; cfg.num_hidden_layers];
                (other, neurons.clone(), neurons)
            }
        };
        let context = Model::context(&cfg, opts);
        Ok(Self {
            other_weights,
            neuron_bytes,
            coarse_neuron_bytes,
            width,
            kv_cache: kv_cache_bytes(&cfg, context, opts.kv_dtype),
            activations: activation_bytes(&cfg, opts, context),
            context,
            coarse_activations: (4 * 3 * opts.prefill_chunk.min(context) * cfg.hidden_size) as u64,
        })
    }

    /// Weight bytes when layer `l` holds `held[l]` neurons, `coarse[l]`
    /// of them in the coarse tier (`coarse` may be empty: none).
    pub(crate) fn weights(&self, held: &[usize], coarse: &[usize]) -> u64 {
        let ffn: u64 = (0..held.len().min(self.neuron_bytes.len()))
            .map(|l| {
                let c = coarse.get(l).copied().unwrap_or(0).min(held[l]);
                self.neuron_bytes[l] * (held[l] - c) as u64 + self.coarse_neuron_bytes[l] * c as u64
            })
            .sum();
        self.other_weights + ffn
    }
}

/// Keys and values of every layer at `context` positions, in the steps
/// the cache grows by.
fn kv_cache_bytes(cfg: &Config, context: usize, dtype: KvDtype) -> u64 {
    let capacity = context.div_ceil(super::kv_cache::GROW_BY) * super::kv_cache::GROW_BY;
    let row = dtype.row_bytes(cfg.head_dim());
    (2 * cfg.num_hidden_layers * cfg.num_kv_heads() * capacity * row) as u64
}

/// The peak temporaries of one prefill chunk of `prefill_chunk` tokens,
/// all f32: the MLP's gate, up and product over the chunk (a tensor
/// model's matmuls add their outputs in the weights' dtype and the inputs
/// converted to it: nine in all), the residual stream, its
/// normed copy and the attention's input and output (four rows of the
/// hidden size each), q/k/v, each thread's block of attention scores over
/// the whole context ([`crate::kernels::prefill_attention`]: 32 queries at
/// a time), the last position's logits twice, and a quantized layer's
/// dequantized chunk; with a `Q8_0` KV cache, each thread's one kv head of
/// rows dequantized over the whole context. With the rest of the plan, 0.2-5.9 % above the peak
/// a prompt filling a 2,048-token context measures, for SmolLM2 and both
/// Qwen models, q4/f16/f32 (docs/BENCHMARKS.md, "The memory plan against
/// the measured peak"; candle's whole score tensor, planned before, was
/// 30-45 % over).
fn activation_bytes(cfg: &Config, opts: &LoadOptions, context: usize) -> u64 {
    let c = opts.prefill_chunk.min(context);
    let (h, heads, kv, hd) = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_kv_heads(),
        cfg.head_dim(),
    );
    let mlp = match opts.quant {
        Some(_) => 3,
        // Each product also in the weights' dtype, x converted per matmul.
        None => 9,
    } * c
        * cfg.intermediate_size;
    let stream = 4 * c * h;
    let qkv = c * (heads + 2 * kv) * hd;
    let threads = rayon::current_num_threads();
    let scores = threads * 32 * context;
    let kv_rows = match opts.kv_dtype {
        KvDtype::Q8 => threads * context * hd,
        KvDtype::F32 => 0,
    };
    let logits = 2 * cfg.vocab_size;
    // One reused f32 buffer of about 1 MiB (`linear::chunk_rows`).
    let dequantized = match opts.quant {
        Some(_) => 1 << 18,
        None => 0,
    };
    4 * (mlp + stream + qkv + scores + kv_rows + logits + dequantized) as u64
}
