//! One decoder-only transformer implementation for the Llama and Qwen2
//! families, in the manner of candle-transformers: a serde [`Config`] read
//! from an HF `config.json`, blocks with `load(vb, cfg)` and `forward`.
//!
//! Supports grouped-query attention, RoPE with Llama 3 `rope_scaling`, tied
//! or separate `lm_head`, Qwen2's q/k/v biases, f32 and f16 weights (bf16
//! checkpoints are converted at load; CPU never computes in bf16) and a KV
//! cache. Activations are f32 throughout. The MLP lives in [`mlp`] and is
//! stored neuron-major so that it can run on a subset of neurons.

mod attention;
mod block;
pub(crate) mod bundles;
pub(crate) mod checkpoint;
pub(crate) mod config;
pub(crate) mod embedding;
pub(crate) mod ffn_tier;
pub(crate) mod file_rows;
pub(crate) mod footprint;
mod head;
pub(crate) mod head_screen;
pub(crate) mod kv_cache;
pub(crate) mod linear;
pub(crate) mod lm_head;
pub(crate) mod mlp;
mod norm;
mod options;
pub(crate) mod qfile;
mod rope;
pub(crate) mod rowread;
#[cfg(test)]
mod tests;
pub(crate) mod vocab;

pub(crate) use block::Block;
use checkpoint::safetensors_files;
pub use checkpoint::{sha256_file, weights_sha256};
pub use config::Config;
pub(crate) use config::Family;
pub use head_screen::{HeadScreen, ScreenBits};
pub use kv_cache::{KvCache, KvDtype};
pub use linear::Linear;
pub use lm_head::LmHead;
pub(crate) use mlp::Mlp;
pub(crate) use norm::RmsNorm;
pub use options::{FfnRows, LoadOptions};
use rope::Rope;
pub use vocab::OutputVocab;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::path::Path;

/// Sees one block's MLP activations `silu(gate)·up` (a profiler's or a selector's hook).
pub(crate) type MlpObserver<'a> = &'a mut dyn FnMut(&Tensor) -> Result<()>;
/// Sees every block's MLP activations, with the layer index.
pub(crate) type LayerObserver<'a> = &'a mut dyn FnMut(usize, &Tensor) -> Result<()>;
/// A [`LayerObserver`] reborrowed for one prefill chunk.
type ChunkObserver<'r, 'o> = &'r mut (dyn FnMut(usize, &Tensor) -> Result<()> + 'o);

/// Where a model's FFN neurons are read from.
#[derive(Debug, Clone)]
enum FfnSource {
    /// The safetensors checkpoint (f32/f16/bf16 rows).
    Rows(std::sync::Arc<rowread::RowSource>),
    /// The quantized checkpoint's neuron bundles.
    Bundles(std::sync::Arc<qfile::QFile>),
}

#[derive(Debug, Clone)]
pub struct Model {
    cfg: Config,
    /// The embedding table (held, a tied lm_head sharing it, or read from
    /// the quantized file as tokens come).
    embed_tokens: embedding::Embedding,
    pub(crate) blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: lm_head::LmHead,
    rope: Rope,
    max_context: usize,
    device: Device,
    /// [`FfnRows::Streamed`]: where each forward pass reads the FFN weights from.
    streamed_from: Option<std::sync::Arc<rowread::RowSource>>,
    /// The checkpoint the FFN rows were read from (kept open, so that
    /// [`Model::swap_ffn`] can read the neurons a new plan adds).
    ffn_source: Option<FfnSource>,
    dtype: DType,
    quant: Option<crate::sys::device::Quant>,
    prefill_chunk: usize,
    kv_dtype: KvDtype,
    /// The lm_head rows computed ([`Model::set_output_vocab`]); `None`: all.
    vocab: Option<std::sync::Arc<vocab::OutputVocab>>,
    /// The lm_head's screen ([`Model::set_head_screen`]); `None`: every row exact.
    screen: Option<head_screen::HeadScreen>,
}

impl Model {
    /// Loads a model from an HF checkpoint folder (`config.json` + `*.safetensors`).
    pub fn from_dir(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        if !dir.is_dir() {
            bail!(
                "model folder {} does not exist (run `selectinfer prepare-model` first)",
                dir.display()
            );
        }
        let cfg = Config::from_file(&dir.join("config.json"))?;
        if let Some(q) = opts.quant {
            crate::sys::device::check_quant(&opts.device, opts.quant)?;
            return Self::load_quantized(dir, &cfg, opts, q)
                .with_context(|| format!("loading model from {} as {q}", dir.display()));
        }
        let files = safetensors_files(dir)?;
        crate::sys::device::check_dtype(&opts.device, opts.dtype)?;
        // Every tensor is read with pread into its final buffer (the MLPs
        // row by row, only the neurons held), never through a mapping of
        // the file: a mapping's pages count in RSS next to the copies
        // (peak ≈ 2× the weights while loading).
        let source = std::sync::Arc::new(
            crate::model::rowread::RowSource::open(&files)
                .with_context(|| format!("reading weights in {}", dir.display()))?,
        );
        let vb = VarBuilder::from_backend(
            Box::new(crate::model::rowread::PreadTensors(source.clone())),
            opts.dtype,
            opts.device.clone(),
        );
        let mut model = Self::load(vb, &cfg, opts, Some(&source))
            .with_context(|| format!("loading model from {}", dir.display()))?;
        if opts.ffn == FfnRows::Streamed {
            source.drop_cached();
            model.streamed_from = Some(source);
        } else {
            model.ffn_source = Some(FfnSource::Rows(source));
        }
        Ok(model)
    }

    /// Loads from `vb`; MLPs are read from `rows` (with `pread`, only the
    /// neurons `opts.ffn` holds) when it is given.
    pub(crate) fn load(
        vb: VarBuilder,
        cfg: &Config,
        opts: &LoadOptions,
        rows: Option<&crate::model::rowread::RowSource>,
    ) -> Result<Self> {
        opts.check(cfg)?;
        if opts.quant.is_some() {
            bail!("quantized dtypes load from the model folder (Model::from_dir)");
        }
        let max_context = Self::context(cfg, opts);
        let embed_tokens = vb
            .get(
                (cfg.vocab_size, cfg.hidden_size),
                "model.embed_tokens.weight",
            )
            .context("loading model.embed_tokens.weight")?;
        let embed_tokens = Linear::new(embed_tokens, None)?;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| {
                let prefix = format!("model.layers.{i}.mlp");
                let held = match &opts.ffn {
                    FfnRows::Layers(layers) => layers[i].as_deref(),
                    FfnRows::All | FfnRows::Streamed => None,
                };
                let mlp = match (held, rows) {
                    _ if opts.ffn == FfnRows::Streamed => {
                        Some(Mlp::empty(cfg.hidden_size, opts.dtype, &opts.device)?)
                    }
                    (Some(ids), Some(rows)) => Some(Mlp::load_neurons(
                        rows,
                        &prefix,
                        ids,
                        cfg.hidden_size,
                        opts.dtype,
                        &opts.device,
                    )?),
                    (Some(_), None) => {
                        bail!("an FFN row selection needs the checkpoint's files to read rows from")
                    }
                    (None, Some(rows)) => Some(Mlp::load_all(
                        rows,
                        &prefix,
                        cfg.intermediate_size,
                        cfg.hidden_size,
                        opts.dtype,
                        &opts.device,
                    )?),
                    (None, None) => None,
                };
                Block::load(vb.pp(format!("model.layers.{i}")), cfg, mlp)
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(vb.pp("model.norm"), cfg.hidden_size, cfg.rms_norm_eps)?;
        let lm_head = if cfg.tie_word_embeddings {
            embed_tokens.clone()
        } else {
            Linear::new(
                vb.get((cfg.vocab_size, cfg.hidden_size), "lm_head.weight")
                    .context("loading lm_head.weight")?,
                None,
            )?
        };
        if opts.device.is_cpu() {
            // Decode streams these once per token (see `crate::sys::hugepages`).
            lm_head.collapse_to_huge_pages();
            for b in &blocks {
                b.attn.qkv.collapse_to_huge_pages();
                b.attn.o_proj.collapse_to_huge_pages();
                b.mlp.collapse_to_huge_pages();
            }
        }
        Ok(Self {
            cfg: cfg.clone(),
            embed_tokens: embedding::Embedding::Held(embed_tokens),
            blocks,
            norm,
            lm_head: lm_head::LmHead::Held(lm_head),
            rope: Rope::new(cfg, max_context, &opts.device)?,
            max_context,
            device: opts.device.clone(),
            streamed_from: None,
            ffn_source: None,
            dtype: opts.dtype,
            quant: None,
            prefill_chunk: opts.prefill_chunk,
            kv_dtype: opts.kv_dtype,
            vocab: None,
            screen: None,
        })
    }

    /// Loads the quantized dtype `q` from the folder's [`qfile`]: every
    /// tensor read with `pread` straight into the buffer decode runs on,
    /// the FFN as neuron bundles (only the neurons `opts.ffn` holds).
    fn load_quantized(
        dir: &Path,
        cfg: &Config,
        opts: &LoadOptions,
        q: crate::sys::device::Quant,
    ) -> Result<Self> {
        opts.check(cfg)?;
        if opts.ffn == FfnRows::Streamed {
            bail!("a streamed FFN (disk offload) reads f32/f16 rows; it has no {q} form");
        }
        let file = qfile::QFile::open(&dir.join(qfile::file_name(q.name())))?;
        file.check(cfg, &weights_sha256(dir)?)?;
        let file = std::sync::Arc::new(file);
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let in_file = |name| file_rows::stays_in_file(name, cfg, opts.head_in_file);
        let table = file_rows::EMBEDDING;
        let embed_tokens = match in_file(table) {
            true => {
                embedding::Embedding::InFile(file_rows::FileRows::open(file.clone(), table, v, h)?)
            }
            false => embedding::Embedding::Held(Linear::with_weights(
                linear::Weights::Quant(file.matrix(&[(table, v)], h)?),
                None,
            )?),
        };
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| {
                // Held in ascending order, as the tensor path holds them.
                let held = match &opts.ffn {
                    FfnRows::Layers(layers) => layers[i].clone().map(|mut ids| {
                        ids.sort_unstable();
                        ids.dedup();
                        ids
                    }),
                    _ => None,
                };
                let bundles = file.bundles(i, held.as_deref())?;
                let mlp = Mlp::from_bundles(bundles, held)?;
                let coarse = match opts.ffn_coarse.get(i) {
                    Some(ids) if !ids.is_empty() => {
                        let mut ids = ids.clone();
                        ids.sort_unstable();
                        Some(ffn_tier::CoarseFfn::load(&file, i, &ids, opts.coarse_bits)?)
                    }
                    _ => None,
                };
                Ok(Block::from_file(&file, cfg, i, mlp)
                    .with_context(|| format!("loading layer {i}"))?
                    .with_coarse(coarse))
            })
            .collect::<Result<Vec<_>>>()?;
        let head = file_rows::HEAD;
        let lm_head = match (&embed_tokens, in_file(head)) {
            (embedding::Embedding::Held(table), _) if cfg.tie_word_embeddings => {
                lm_head::LmHead::Held(table.clone())
            }
            (_, true) => {
                lm_head::LmHead::InFile(file_rows::FileRows::open(file.clone(), head, v, h)?)
            }
            (_, false) => lm_head::LmHead::Held(Linear::with_weights(
                linear::Weights::Quant(file.matrix(&[(head, v)], h)?),
                None,
            )?),
        };
        Ok(Self {
            cfg: cfg.clone(),
            embed_tokens,
            blocks,
            norm: RmsNorm::new(file.f32("model.norm.weight", h)?, cfg.rms_norm_eps),
            lm_head,
            rope: Rope::new(cfg, Self::context(cfg, opts), &Device::Cpu)?,
            max_context: Self::context(cfg, opts),
            device: Device::Cpu,
            streamed_from: None,
            ffn_source: Some(FfnSource::Bundles(file)),
            dtype: DType::F32,
            quant: Some(q),
            prefill_chunk: opts.prefill_chunk,
            kv_dtype: opts.kv_dtype,
            vocab: None,
            screen: None,
        })
    }

    /// The longest sequence served (see [`LoadOptions::max_context`]).
    pub(crate) fn context(cfg: &Config, opts: &LoadOptions) -> usize {
        opts.max_context
            .unwrap_or(cfg.max_position_embeddings.min(4096))
    }

    /// Bytes of weights read from the checkpoint so far (the load's and
    /// every swap's).
    pub(crate) fn weight_bytes_read(&self) -> u64 {
        match &self.ffn_source {
            Some(FfnSource::Rows(r)) => r.bytes_read(),
            Some(FfnSource::Bundles(f)) => f.bytes_read(),
            None => 0,
        }
    }

    /// Holds `rows` instead of the FFN neurons held now (a new load plan
    /// of the same size): per layer only the neurons added are read from
    /// the checkpoint the model was loaded from, and those dropped are
    /// freed; layers held whole stay whole. Returns the neurons read. f32/
    /// f16 rows read each added neuron's gate and up rows alone but the
    /// whole of `down_proj` (its columns are strided in the safetensors
    /// file); the quantized dtypes read exactly the added bundles.
    pub(crate) fn swap_ffn(&mut self, rows: &FfnRows) -> Result<usize> {
        let FfnRows::Layers(layers) = rows else {
            bail!("a swap names each sparse layer's neurons");
        };
        if self.blocks.iter().any(|b| b.coarse.is_some()) {
            bail!("a model with a coarse FFN tier (coarse_ratio > 0) swaps no neurons: load it again for another plan");
        }
        let probe = LoadOptions {
            ffn: rows.clone(),
            ..LoadOptions::default()
        };
        probe.check(&self.cfg)?;
        let source = self
            .ffn_source
            .clone()
            .context("this model was not read from a checkpoint folder: no neurons to swap in")?;
        let (h, dtype, device) = (self.cfg.hidden_size, self.dtype, self.device.clone());
        let mut read = 0;
        for (i, (b, want)) in self.blocks.iter_mut().zip(layers).enumerate() {
            let ids = match (b.mlp.neurons(), want) {
                (None, None) => continue,
                (Some(_), Some(ids)) => ids,
                _ => bail!("layer {i}: a swap keeps whole layers whole and sparse ones sparse"),
            };
            let prefix = format!("model.layers.{i}.mlp");
            read += b
                .mlp
                .swap_neurons(ids, |added| match &source {
                    FfnSource::Rows(r) => Mlp::load_neurons(r, &prefix, added, h, dtype, &device),
                    FfnSource::Bundles(f) => {
                        Mlp::from_bundles(f.bundles(i, Some(added))?, Some(added.to_vec()))
                    }
                })
                .with_context(|| format!("layer {i}: swapping in the new plan's neurons"))?;
        }
        Ok(read)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// The weights' dtype by name (`f16`, `q4` …).
    pub(crate) fn weights_name(&self) -> String {
        match self.quant {
            Some(q) => q.name().to_string(),
            None => self.dtype.as_str().to_string(),
        }
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.blocks.len(), self.kv_dtype)
    }

    /// Bytes of weights read to decode one token: every block, the final
    /// norm and the lm_head's rows computed (one embedding row is negligible).
    pub(crate) fn decode_weight_bytes(&self) -> usize {
        let blocks: usize = self.blocks.iter().map(Block::weight_bytes).sum();
        let streamed = if self.streamed_from.is_some() {
            self.cfg.num_hidden_layers
                * self.cfg.ffn_params_per_layer()
                * self.dtype.size_in_bytes()
        } else {
            0
        };
        // Only the CPU decode step computes the restricted rows alone.
        let head = match (&self.screen, &self.vocab) {
            (Some(s), v) => s.step_bytes(&self.lm_head, v.as_deref()),
            (None, Some(v)) if self.decodes_on_plain_buffers() => self.lm_head.rows_bytes(v.rows()),
            _ => self.lm_head.weight_bytes(),
        };
        blocks + streamed + head
    }

    /// Whether the FFN weights are streamed from the checkpoint ([`FfnRows::Streamed`]).
    pub(crate) fn ffn_streamed(&self) -> bool {
        self.streamed_from.is_some()
    }

    /// Runs `tokens` at positions `cache.len()..` and returns the logits of
    /// the last one, `[vocab]` f32.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.forward_inner(tokens, cache, None, None)
    }

    /// Like [`Model::forward`] with per-layer MLP replacements (`None`
    /// entries keep the layer's own MLP): selective decode.
    pub(crate) fn forward_with_mlps(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mlps: &[Option<Mlp>],
    ) -> Result<Tensor> {
        if mlps.len() != self.blocks.len() {
            bail!(
                "{} MLP replacements for {} layers",
                mlps.len(),
                self.blocks.len()
            );
        }
        self.forward_inner(tokens, cache, None, Some(mlps))
    }

    /// Runs `tokens` at positions `cache.len()..` through the general
    /// (prefill) path, with per-layer MLP replacements as
    /// [`Model::forward_with_mlps`], and returns the logits of every
    /// position, `[seq, vocab]` f32 (teacher forcing in one pass).
    pub(crate) fn forward_all(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mlps: Option<&[Option<Mlp>]>,
    ) -> Result<Tensor> {
        self.check_input(tokens, cache)?;
        if let Some(m) = mlps.filter(|m| m.len() != self.blocks.len()) {
            bail!(
                "{} MLP replacements for {} layers",
                m.len(),
                self.blocks.len()
            );
        }
        let mut parts = Vec::new();
        for chunk in tokens.chunks(self.prefill_chunk) {
            let x = self
                .norm
                .forward(&self.blocks_forward(chunk, cache, None, mlps)?)?;
            parts.push(match &self.screen {
                // Each row through the screen, as decode computes it.
                Some(_) => {
                    let h = self.cfg.hidden_size;
                    let rows = x.flatten_all()?.to_vec1::<f32>()?;
                    let mut logits = Vec::with_capacity(chunk.len() * self.cfg.vocab_size);
                    for row in rows.chunks_exact(h) {
                        logits.extend(self.head_row(row)?);
                    }
                    Tensor::from_vec(logits, (chunk.len(), self.cfg.vocab_size), &self.device)?
                }
                None => self.lm_head.forward(&x)?.squeeze(0)?,
            });
        }
        self.mask_vocab(Tensor::cat(&parts, 0)?.to_dtype(DType::F32)?)
    }

    /// Like [`Model::forward`], showing `observe(layer, a)` every MLP's
    /// activations `a = silu(gate)·up` (`[1, seq, N]`, f32) — a profiler's
    /// view of the network. A prompt longer than the prefill chunk is shown
    /// chunk by chunk (each layer once per chunk, in order), so observers
    /// accumulate.
    pub fn forward_observed(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        observe: LayerObserver,
    ) -> Result<Tensor> {
        self.forward_inner(tokens, cache, Some(observe), None)
    }

    /// Refuses an empty input, one past the context, or token ids outside
    /// the vocabulary.
    fn check_input(&self, tokens: &[u32], cache: &KvCache) -> Result<()> {
        if tokens.is_empty() {
            bail!("forward called with no tokens");
        }
        if cache.len() + tokens.len() > self.max_context {
            bail!(
                "sequence of {} tokens exceeds the context of {} tokens",
                cache.len() + tokens.len(),
                self.max_context
            );
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            bail!(
                "token id {bad} is outside the vocabulary ({})",
                self.cfg.vocab_size
            );
        }
        Ok(())
    }

    fn forward_inner(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mut observe: Option<LayerObserver>,
        mlps: Option<&[Option<Mlp>]>,
    ) -> Result<Tensor> {
        self.check_input(tokens, cache)?;
        if let [token] = tokens {
            if observe.is_none() && self.decodes_on_plain_buffers() {
                return self.decode_cpu(*token, cache, mlps);
            }
        }
        let mut x = None;
        for chunk in tokens.chunks(self.prefill_chunk) {
            x = Some(self.blocks_forward(chunk, cache, observe.as_deref_mut(), mlps)?);
        }
        let x = x.expect("tokens is not empty");
        let last = self.norm.forward(&x.narrow(1, x.dim(1)? - 1, 1)?)?;
        if self.screen.is_some() {
            let logits = self.head_row(&last.flatten_all()?.to_vec1::<f32>()?)?;
            return Ok(Tensor::from_vec(logits, self.cfg.vocab_size, &self.device)?);
        }
        let logits = self.lm_head.forward(&last)?;
        self.mask_vocab(logits.flatten_all()?)
    }

    /// Whether an unobserved decode step runs [`Model::decode_cpu`] (the
    /// only path that computes a restricted lm_head's rows alone).
    fn decodes_on_plain_buffers(&self) -> bool {
        self.device.is_cpu() && self.streamed_from.is_none()
    }

    /// One token on the CPU (the decode step) on plain buffers: no candle op
    /// between the kernels, so the decode threads are not kept waiting by
    /// allocation and dispatch. The same computation as the general path
    /// (tested: `decode_on_plain_buffers_matches_the_tensor_path`).
    fn decode_cpu(
        &self,
        token: u32,
        cache: &mut KvCache,
        mlps: Option<&[Option<Mlp>]>,
    ) -> Result<Tensor> {
        let (pos, h) = (cache.len(), self.cfg.hidden_size);
        let mut x = self.embed_tokens.rows(&[token])?;
        for (i, (block, layer_cache)) in self.blocks.iter().zip(cache.layers.iter_mut()).enumerate()
        {
            let mlp = mlps.and_then(|m| m[i].as_ref());
            block
                .forward_row(&mut x, pos, &self.rope, layer_cache, mlp)
                .with_context(|| format!("decoding layer {i}"))?;
        }
        let mut normed = vec![0f32; h];
        self.norm.forward_row(&x, &mut normed)?;
        let logits = self.head_row(&normed)?;
        Ok(Tensor::from_vec(logits, self.cfg.vocab_size, &self.device)?)
    }

    /// Embeds `tokens` and runs every block at positions `cache.len()..`;
    /// returns the last block's output `[1, seq, hidden]`.
    fn blocks_forward<'o>(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mut observe: Option<ChunkObserver<'_, 'o>>,
        mlps: Option<&[Option<Mlp>]>,
    ) -> Result<Tensor> {
        let pos = cache.len();
        let mut x = self
            .embed_tokens
            .lookup(tokens, &self.device)?
            .unsqueeze(0)?;
        for (i, (block, layer_cache)) in self.blocks.iter().zip(cache.layers.iter_mut()).enumerate()
        {
            let streamed = match &self.streamed_from {
                Some(source) => {
                    let mlp = Mlp::load_all(
                        source,
                        &format!("model.layers.{i}.mlp"),
                        self.cfg.intermediate_size,
                        self.cfg.hidden_size,
                        self.dtype,
                        &self.device,
                    )?;
                    source.drop_cached();
                    Some(mlp)
                }
                None => None,
            };
            let mlp = streamed.as_ref().or(mlps.and_then(|m| m[i].as_ref()));
            x = match observe.as_deref_mut() {
                Some(obs) => block.forward(
                    &x,
                    pos,
                    &self.rope,
                    layer_cache,
                    Some(&mut |a: &Tensor| obs(i, a)),
                    mlp,
                )?,
                None => block.forward(&x, pos, &self.rope, layer_cache, None, mlp)?,
            };
        }
        Ok(x)
    }
}
