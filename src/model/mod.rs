//! One decoder-only transformer implementation for the Llama and Qwen2
//! families, in the manner of candle-transformers: a serde [`Config`] read
//! from an HF `config.json`, blocks with `load(vb, cfg)` and `forward`.
//!
//! Supports grouped-query attention, RoPE with Llama 3 `rope_scaling`, tied
//! or separate `lm_head`, Qwen2's q/k/v biases, f32 and f16 weights (bf16
//! checkpoints are converted at load; CPU never computes in bf16) and a KV
//! cache. Activations are f32 throughout. The MLP lives in [`mlp`] and is
//! stored neuron-major so that it can run on a subset of neurons.

pub mod config;
pub mod kv_cache;
pub mod linear;
pub mod mlp;

pub use config::{Config, Family};
pub use kv_cache::KvCache;
pub use linear::Linear;
pub use mlp::Mlp;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;
use std::path::Path;

/// Sees one block's MLP activations `silu(gate)·up` (the profiler's hook).
pub type MlpObserver<'a> = &'a mut dyn FnMut(&Tensor) -> Result<()>;
/// Sees every block's MLP activations, with the layer index.
pub type LayerObserver<'a> = &'a mut dyn FnMut(usize, &Tensor) -> Result<()>;
/// A [`LayerObserver`] reborrowed for one prefill chunk.
type ChunkObserver<'r, 'o> = &'r mut (dyn FnMut(usize, &Tensor) -> Result<()> + 'o);

/// RoPE tables for positions `0..max_positions`.
#[derive(Debug, Clone)]
struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    fn new(cfg: &Config, max_positions: usize, device: &Device) -> Result<Self> {
        let dim = cfg.head_dim();
        let mut inv_freq: Vec<f64> = (0..dim)
            .step_by(2)
            .map(|i| 1.0 / cfg.rope_theta.powf(i as f64 / dim as f64))
            .collect();
        if let Some(s) = cfg
            .rope_scaling
            .as_ref()
            .filter(|s| s.rope_type == "llama3")
        {
            let orig = s.original_max_position_embeddings as f64;
            let low_wavelen = orig / s.low_freq_factor;
            let high_wavelen = orig / s.high_freq_factor;
            for f in inv_freq.iter_mut() {
                let wavelen = 2.0 * std::f64::consts::PI / *f;
                *f = if wavelen < high_wavelen {
                    *f
                } else if wavelen > low_wavelen {
                    *f / s.factor
                } else {
                    let smooth = (orig / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * *f / s.factor + smooth * *f
                };
            }
        }
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv_freq {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_positions, half), device)?,
            sin: Tensor::from_vec(sin, (max_positions, half), device)?,
        })
    }

    /// Rotates, in place, the first `heads` heads of one row of activations
    /// (`[.., head_dim]` each) at position `pos` (CPU).
    fn apply_row(&self, x: &mut [f32], heads: usize, head_dim: usize, pos: usize) -> Result<()> {
        let row = pos * (head_dim / 2)..(pos + 1) * (head_dim / 2);
        crate::kernels::with_f32(&self.cos, |cos| {
            crate::kernels::with_f32(&self.sin, |sin| {
                match (cos.get(row.clone()), sin.get(row.clone())) {
                    (Some(cos), Some(sin)) => {
                        crate::kernels::rope_row(x, cos, sin, head_dim, heads);
                        Ok(())
                    }
                    _ => candle_core::bail!("rope: position {pos} is beyond the table"),
                }
            })
        })?;
        Ok(())
    }

    /// Applies the rotation to `x [b, heads, seq, head_dim]` at positions `pos..`.
    fn apply(&self, x: &Tensor, pos: usize) -> Result<Tensor> {
        let seq = x.dim(2)?;
        let cos = self.cos.narrow(0, pos, seq)?;
        let sin = self.sin.narrow(0, pos, seq)?;
        Ok(candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin)?)
    }
}

#[derive(Debug, Clone)]
pub struct Attention {
    /// q, k and v projections fused: `[(heads + 2 kv_heads) * head_dim, hidden]`.
    qkv: Linear,
    o_proj: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    pub fn load(vb: VarBuilder, cfg: &Config) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (heads, kv_heads) = (cfg.num_attention_heads, cfg.num_kv_heads());
        let get = |name: &str, rows: usize| {
            vb.get((rows, h), &format!("{name}.weight"))
                .with_context(|| format!("loading {}.{name}.weight", vb.prefix()))
        };
        let q = get("q_proj", heads * hd)?;
        let k = get("k_proj", kv_heads * hd)?;
        let v = get("v_proj", kv_heads * hd)?;
        let bias = if cfg.qkv_bias() {
            let get_b = |name: &str, rows: usize| {
                vb.get_with_hints_dtype(
                    rows,
                    &format!("{name}.bias"),
                    Default::default(),
                    DType::F32,
                )
                .with_context(|| format!("loading {}.{name}.bias", vb.prefix()))
            };
            Some(Tensor::cat(
                &[
                    get_b("q_proj", heads * hd)?,
                    get_b("k_proj", kv_heads * hd)?,
                    get_b("v_proj", kv_heads * hd)?,
                ],
                0,
            )?)
        } else {
            None
        };
        let o = vb
            .get((h, heads * hd), "o_proj.weight")
            .with_context(|| format!("loading {}.o_proj.weight", vb.prefix()))?;
        Ok(Self {
            qkv: Linear::new(Tensor::cat(&[q, k, v], 0)?, bias)?,
            o_proj: Linear::new(o, None)?,
            heads,
            kv_heads,
            head_dim: hd,
        })
    }

    fn weight_bytes(&self) -> usize {
        self.qkv.weight_bytes() + self.o_proj.weight_bytes()
    }

    /// `x [1, seq, hidden]` at positions `pos..pos+seq`; appends to `cache`.
    fn forward(
        &self,
        x: &Tensor,
        pos: usize,
        rope: &Rope,
        cache: &mut kv_cache::LayerCache,
    ) -> Result<Tensor> {
        let (b, seq, _) = x.dims3()?;
        let (hd, nh, nkv) = (self.head_dim, self.heads, self.kv_heads);
        let qkv = self.qkv.forward(x)?;
        let split = |start: usize, heads: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(D::Minus1, start * hd, heads * hd)?
                .reshape((b, seq, heads, hd))?
                .transpose(1, 2)?)
        };
        let q = rope.apply(&split(0, nh)?, pos)?;
        let k = rope.apply(&split(nh, nkv)?, pos)?;
        let v = split(nh + nkv, nkv)?.contiguous()?;
        let (k, v) = cache.append(&k, &v)?;
        let total = k.dim(2)?;
        // Grouped-query attention without repeating k/v: the `group` query
        // heads sharing one kv head become extra rows of one matmul.
        let group = nh / nkv;
        let q = q.reshape((b, nkv, group * seq, hd))?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut att = (q.matmul(&k.t()?)? * scale)?;
        if seq > 1 {
            let mask = causal_mask(seq, pos, total, x.device())?;
            att = att
                .reshape((b, nkv, group, seq, total))?
                .broadcast_add(&mask)?
                .reshape((b, nkv, group * seq, total))?;
        }
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let y = att.matmul(&v)?; // [b, nkv, group*seq, hd]
        let y = y
            .reshape((b, nh, seq, hd))?
            .transpose(1, 2)?
            .reshape((b, seq, nh * hd))?;
        self.o_proj.forward(&y)
    }

    /// One token on the CPU, on plain buffers: `x [hidden]` (normed) at
    /// position `pos` → the attention output after `o_proj`, `[hidden]`.
    /// The same computation as [`Attention::forward`]; appends to `cache`.
    fn forward_row(
        &self,
        x: &[f32],
        pos: usize,
        rope: &Rope,
        cache: &mut kv_cache::LayerCache,
    ) -> Result<Vec<f32>> {
        let (hd, nh, nkv) = (self.head_dim, self.heads, self.kv_heads);
        let mut qkv = self.qkv.forward_row(x)?;
        rope.apply_row(&mut qkv, nh + nkv, hd, pos)?;
        let (q, kv) = qkv.split_at(nh * hd);
        let y = cache.push_row_and(kv.split_at(nkv * hd), (nkv, hd), |k, v| {
            crate::kernels::decode_attention(q, k, v, nh)
        })?;
        self.o_proj.forward_row(&y)
    }
}

/// Additive mask `[seq, total]`: query `i` (at position `pos + i`) sees keys `<= pos + i`.
fn causal_mask(seq: usize, pos: usize, total: usize, device: &Device) -> Result<Tensor> {
    let data: Vec<f32> = (0..seq)
        .flat_map(|i| (0..total).map(move |j| if j <= pos + i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Ok(Tensor::from_vec(data, (seq, total), device)?)
}

#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn load(vb: VarBuilder, size: usize, eps: f64) -> Result<Self> {
        let weight = vb
            .get_with_hints_dtype(size, "weight", Default::default(), DType::F32)
            .with_context(|| format!("loading {}.weight", vb.prefix()))?;
        Ok(Self {
            weight,
            eps: eps as f32,
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, &self.weight, self.eps)?)
    }

    /// One row on the CPU: `out = norm(x)`.
    fn forward_row(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        crate::kernels::with_f32(&self.weight, |w| {
            if w.len() != x.len() {
                candle_core::bail!("rms norm of {} for a row of {}", w.len(), x.len());
            }
            crate::kernels::rms_norm_row(x, w, self.eps, out);
            Ok(())
        })?;
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct Block {
    input_norm: RmsNorm,
    attn: Attention,
    post_attention_norm: RmsNorm,
    pub mlp: Mlp,
}

impl Block {
    /// Loads a block; `mlp` replaces the dense MLP (selective loading).
    pub fn load(vb: VarBuilder, cfg: &Config, mlp: Option<Mlp>) -> Result<Self> {
        let mlp = match mlp {
            Some(m) => m,
            None => Mlp::load(vb.pp("mlp"), cfg.hidden_size, cfg.intermediate_size)?,
        };
        Ok(Self {
            input_norm: RmsNorm::load(vb.pp("input_layernorm"), cfg.hidden_size, cfg.rms_norm_eps)?,
            attn: Attention::load(vb.pp("self_attn"), cfg)?,
            post_attention_norm: RmsNorm::load(
                vb.pp("post_attention_layernorm"),
                cfg.hidden_size,
                cfg.rms_norm_eps,
            )?,
            mlp,
        })
    }

    /// One block at positions `pos..`; `observe` (the profiler) sees the
    /// MLP activations `silu(gate)·up`; `mlp` replaces the block's own MLP
    /// (a per-prompt compact one).
    fn forward(
        &self,
        x: &Tensor,
        pos: usize,
        rope: &Rope,
        cache: &mut kv_cache::LayerCache,
        observe: Option<MlpObserver>,
        mlp: Option<&Mlp>,
    ) -> Result<Tensor> {
        let h = (x + self
            .attn
            .forward(&self.input_norm.forward(x)?, pos, rope, cache)?)?;
        let normed = self.post_attention_norm.forward(&h)?;
        let mlp = mlp.unwrap_or(&self.mlp);
        let m = match observe {
            Some(obs) => {
                let a = mlp.activations(&normed)?;
                obs(&a)?;
                mlp.down(&a)?
            }
            None => mlp.forward(&normed)?,
        };
        Ok((h + m)?)
    }

    /// One token on the CPU, on plain buffers: `x [hidden]` becomes the
    /// block's output; the same computation as [`Block::forward`].
    fn forward_row(
        &self,
        x: &mut [f32],
        pos: usize,
        rope: &Rope,
        cache: &mut kv_cache::LayerCache,
        mlp: Option<&Mlp>,
    ) -> Result<()> {
        let mut normed = vec![0f32; x.len()];
        self.input_norm.forward_row(x, &mut normed)?;
        let attn = self.attn.forward_row(&normed, pos, rope, cache)?;
        x.iter_mut().zip(&attn).for_each(|(x, a)| *x += a);
        self.post_attention_norm.forward_row(x, &mut normed)?;
        let m = mlp.unwrap_or(&self.mlp).forward_row(&normed)?;
        x.iter_mut().zip(&m).for_each(|(x, m)| *x += m);
        Ok(())
    }
}

/// Options fixed at load time.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Weight dtype in memory (f32 or f16 on CPU; bf16 is refused on CPU).
    pub dtype: DType,
    pub device: Device,
    /// Longest sequence (prompt + generated) this instance serves; defaults to
    /// `min(max_position_embeddings, 4096)`.
    pub max_context: Option<usize>,
    /// Selective loading: which FFN neurons of each layer to read. `None`
    /// loads every neuron.
    pub plan: Option<crate::plan::LoadPlan>,
    /// The disk-offload baseline: FFN weights are not kept in memory but
    /// read from the checkpoint (page cache dropped) at every forward pass.
    pub offload_ffn: bool,
    /// Longest run of prompt tokens one forward pass takes; longer prompts
    /// are prefilled in chunks of this many tokens through the KV cache, so
    /// the attention scores (`heads × chunk × context`) and MLP activations
    /// of a long prompt never exist whole. Same logits up to rounding.
    pub prefill_chunk: usize,
}

/// Default [`LoadOptions::prefill_chunk`]: large enough that matmuls stay
/// efficient, small enough that a 4096-token prompt's temporaries stay far
/// below the weights of the models we serve.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            device: Device::Cpu,
            max_context: None,
            plan: None,
            offload_ffn: false,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Model {
    cfg: Config,
    embed_tokens: Tensor,
    pub blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    max_context: usize,
    device: Device,
    /// Disk offload: where each forward pass reads the FFN weights from.
    offload: Option<std::sync::Arc<crate::rowread::RowSource>>,
    dtype: DType,
    prefill_chunk: usize,
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
        let files = safetensors_files(dir)?;
        crate::device::check_dtype(&opts.device, opts.dtype)?;
        // SAFETY: the files are not modified while mapped (we own the folder).
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, opts.dtype, &opts.device) }
            .with_context(|| format!("reading weights in {}", dir.display()))?;
        // MLP weights (most of the model) are read with pread, layer by
        // layer, rather than through the mmap: the mmap's pages would count
        // in RSS next to our copies (peak ≈ 2× the weights while loading).
        let source = crate::rowread::RowSource::open(&files)?;
        let mut model = Self::load(vb, &cfg, opts, Some(&source))
            .with_context(|| format!("loading model from {}", dir.display()))?;
        if opts.offload_ffn {
            source.drop_cached();
            model.offload = Some(std::sync::Arc::new(source));
        }
        Ok(model)
    }

    /// Loads from `vb`; with `opts.plan`, sparse layers' MLPs are read from
    /// `rows` instead (only the planned neurons).
    pub fn load(
        vb: VarBuilder,
        cfg: &Config,
        opts: &LoadOptions,
        rows: Option<&crate::rowread::RowSource>,
    ) -> Result<Self> {
        cfg.validate()?;
        if opts.prefill_chunk == 0 {
            bail!("prefill_chunk must be at least 1 token");
        }
        if let Some(plan) = &opts.plan {
            if plan.layers.len() != cfg.num_hidden_layers || plan.width != cfg.intermediate_size {
                bail!(
                    "the load plan has {} layers of {} neurons, the model {} of {}",
                    plan.layers.len(),
                    plan.width,
                    cfg.num_hidden_layers,
                    cfg.intermediate_size
                );
            }
        }
        let max_context = opts
            .max_context
            .unwrap_or(cfg.max_position_embeddings.min(4096));
        let embed_tokens = vb
            .get(
                (cfg.vocab_size, cfg.hidden_size),
                "model.embed_tokens.weight",
            )
            .context("loading model.embed_tokens.weight")?;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| {
                let prefix = format!("model.layers.{i}.mlp");
                let mlp = match (&opts.plan, rows) {
                    _ if opts.offload_ffn => {
                        if opts.plan.is_some() {
                            bail!("disk offload streams every neuron: it takes no load plan");
                        }
                        Some(Mlp::empty(cfg.hidden_size, opts.dtype, &opts.device)?)
                    }
                    (Some(plan), Some(rows)) if !plan.layers[i].dense => Some(Mlp::load_neurons(
                        rows,
                        &prefix,
                        &plan.layers[i].loaded,
                        cfg.hidden_size,
                        opts.dtype,
                        &opts.device,
                    )?),
                    (Some(_), None) => {
                        bail!("a load plan needs the checkpoint's files to read rows from")
                    }
                    (_, Some(rows)) => Some(Mlp::load_all(
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
            Linear::new(embed_tokens.clone(), None)?
        } else {
            Linear::new(
                vb.get((cfg.vocab_size, cfg.hidden_size), "lm_head.weight")
                    .context("loading lm_head.weight")?,
                None,
            )?
        };
        if opts.device.is_cpu() {
            // Decode streams these once per token (see `crate::hugepages`).
            crate::hugepages::collapse_tensor(lm_head.weight());
            for b in &blocks {
                crate::hugepages::collapse_tensor(b.attn.qkv.weight());
                crate::hugepages::collapse_tensor(b.attn.o_proj.weight());
                b.mlp.collapse_to_huge_pages();
            }
        }
        Ok(Self {
            cfg: cfg.clone(),
            embed_tokens,
            blocks,
            norm,
            lm_head,
            rope: Rope::new(cfg, max_context, &opts.device)?,
            max_context,
            device: opts.device.clone(),
            offload: None,
            dtype: opts.dtype,
            prefill_chunk: opts.prefill_chunk,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Dtype of the weight matrices.
    pub fn dtype(&self) -> DType {
        self.lm_head.weight().dtype()
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.blocks.len())
    }

    /// Bytes of weights read to decode one token: every block, the final
    /// norm and the lm_head (one embedding row is negligible).
    pub fn decode_weight_bytes(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| b.attn.weight_bytes() + b.mlp.weight_bytes())
            .sum();
        let streamed = if self.offload.is_some() {
            self.cfg.num_hidden_layers
                * self.cfg.ffn_params_per_layer()
                * self.dtype.size_in_bytes()
        } else {
            0
        };
        blocks + streamed + self.lm_head.weight_bytes()
    }

    /// Whether the FFN weights are streamed from disk (disk offload).
    pub fn ffn_offloaded(&self) -> bool {
        self.offload.is_some()
    }

    /// Runs `tokens` at positions `cache.len()..` and returns the logits of
    /// the last one, `[vocab]` f32.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.forward_inner(tokens, cache, None, None)
    }

    /// Like [`Model::forward`] with per-layer MLP replacements (`None`
    /// entries keep the layer's own MLP): selective decode.
    pub fn forward_with_mlps(
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

    /// Like [`Model::forward`], showing `observe(layer, a)` every MLP's
    /// activations `a = silu(gate)·up` (`[1, seq, N]`, f32) — the profiler's
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

    fn forward_inner(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        mut observe: Option<LayerObserver>,
        mlps: Option<&[Option<Mlp>]>,
    ) -> Result<Tensor> {
        if tokens.is_empty() {
            bail!("forward called with no tokens");
        }
        let pos = cache.len();
        if pos + tokens.len() > self.max_context {
            bail!(
                "sequence of {} tokens exceeds the context of {} tokens",
                pos + tokens.len(),
                self.max_context
            );
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            bail!(
                "token id {bad} is outside the vocabulary ({})",
                self.cfg.vocab_size
            );
        }
        if let [token] = tokens {
            if self.device.is_cpu() && observe.is_none() && self.offload.is_none() {
                return self.decode_cpu(*token, cache, mlps);
            }
        }
        let mut x = None;
        for chunk in tokens.chunks(self.prefill_chunk) {
            x = Some(self.blocks_forward(chunk, cache, observe.as_deref_mut(), mlps)?);
        }
        let x = x.expect("tokens is not empty");
        let last = x.narrow(1, x.dim(1)? - 1, 1)?;
        let logits = self.lm_head.forward(&self.norm.forward(&last)?)?;
        Ok(logits.flatten_all()?)
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
        let mut x = crate::kernels::with_weight(&self.embed_tokens, |w| {
            let r = token as usize * h..(token as usize + 1) * h;
            Ok(match w {
                crate::kernels::Weight::F32(w) => w[r].to_vec(),
                crate::kernels::Weight::F16(w) => w[r].iter().map(|v| v.to_f32()).collect(),
            })
        })?;
        for (i, (block, layer_cache)) in self.blocks.iter().zip(cache.layers.iter_mut()).enumerate()
        {
            let mlp = mlps.and_then(|m| m[i].as_ref());
            block
                .forward_row(&mut x, pos, &self.rope, layer_cache, mlp)
                .with_context(|| format!("decoding layer {i}"))?;
        }
        let mut normed = vec![0f32; h];
        self.norm.forward_row(&x, &mut normed)?;
        let logits = self.lm_head.forward_row(&normed)?;
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
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self
            .embed_tokens
            .index_select(&ids, 0)?
            .to_dtype(DType::F32)?
            .unsqueeze(0)?;
        for (i, (block, layer_cache)) in self.blocks.iter().zip(cache.layers.iter_mut()).enumerate()
        {
            let streamed = match &self.offload {
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

/// sha256 of a checkpoint's weight files (in name order), cached next to
/// them in `weights.sha256` keyed by size and modification time, so it is
/// computed once per prepared model rather than on every start.
pub fn weights_sha256(dir: &Path) -> Result<String> {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq)]
    struct Stamp {
        files: Vec<(String, u64, u128)>,
        sha256: String,
    }
    let files = safetensors_files(dir)?;
    let mut keys = Vec::new();
    for f in &files {
        let m = std::fs::metadata(f).with_context(|| format!("reading {}", f.display()))?;
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        keys.push((
            f.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string(),
            m.len(),
            mtime,
        ));
    }
    let cache = dir.join("weights.sha256");
    if let Some(stamp) = std::fs::read(&cache)
        .ok()
        .and_then(|b| serde_json::from_slice::<Stamp>(&b).ok())
    {
        if stamp.files == keys {
            return Ok(stamp.sha256);
        }
    }
    let digests: Vec<String> = files
        .iter()
        .map(|f| crate::prepare::sha256_file(f).map(|x| x.1))
        .collect::<Result<_>>()?;
    let sha256 = if digests.len() == 1 {
        digests[0].clone()
    } else {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(digests.join("\n").as_bytes()))
    };
    let stamp = Stamp {
        files: keys,
        sha256: sha256.clone(),
    };
    if let Err(e) = std::fs::write(&cache, serde_json::to_vec(&stamp)?) {
        log::debug!(
            "could not cache the weights hash in {}: {e}",
            cache.display()
        );
    }
    Ok(sha256)
}

/// The `*.safetensors` files of a checkpoint folder, sorted.
fn safetensors_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no *.safetensors weights in {}", dir.display());
    }
    Ok(files)
}
