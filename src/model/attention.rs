//! Grouped-query self-attention with fused q/k/v (and Qwen2's biases): the
//! batched form for prefill and any device, and the single-row CPU decode
//! step on plain buffers.

use super::kv_cache::LayerCache;
use super::rope::Rope;
use super::{Config, Linear};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;

#[derive(Debug, Clone)]
pub(crate) struct Attention {
    /// q, k and v projections fused: `[(heads + 2 kv_heads) * head_dim, hidden]`.
    pub(crate) qkv: Linear,
    pub(crate) o_proj: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    pub(crate) fn load(vb: VarBuilder, cfg: &Config) -> Result<Self> {
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

    /// Loads layer `layer`'s attention from a quantized checkpoint: q, k
    /// and v as the parts of one quantized matrix (each keeps its format).
    pub(crate) fn from_file(
        file: &super::qfile::QFile,
        cfg: &Config,
        layer: usize,
    ) -> Result<Self> {
        use super::linear::Weights;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (heads, kv_heads) = (cfg.num_attention_heads, cfg.num_kv_heads());
        let name = |p: &str, what: &str| format!("model.layers.{layer}.self_attn.{p}.{what}");
        let (q, k, v) = (
            name("q_proj", "weight"),
            name("k_proj", "weight"),
            name("v_proj", "weight"),
        );
        let qkv = file.matrix(
            &[(&q, heads * hd), (&k, kv_heads * hd), (&v, kv_heads * hd)],
            h,
        )?;
        let bias = if cfg.qkv_bias() {
            Some(Tensor::cat(
                &[
                    file.f32(&name("q_proj", "bias"), heads * hd)?,
                    file.f32(&name("k_proj", "bias"), kv_heads * hd)?,
                    file.f32(&name("v_proj", "bias"), kv_heads * hd)?,
                ],
                0,
            )?)
        } else {
            None
        };
        let o = file.matrix(&[(&name("o_proj", "weight"), h)], heads * hd)?;
        Ok(Self {
            qkv: Linear::with_weights(Weights::Quant(qkv), bias)?,
            o_proj: Linear::with_weights(Weights::Quant(o), None)?,
            heads,
            kv_heads,
            head_dim: hd,
        })
    }

    pub(crate) fn weight_bytes(&self) -> usize {
        self.qkv.weight_bytes() + self.o_proj.weight_bytes()
    }

    /// `x [1, seq, hidden]` at positions `pos..pos+seq`; appends to `cache`.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        pos: usize,
        rope: &Rope,
        cache: &mut LayerCache,
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
        if x.device().is_cpu() && seq > 1 && b == 1 && k.dtype() == DType::F32 {
            // Blocked and causal, on plain buffers (`kernels::prefill_attention`).
            let q = q.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
            let y = cache.append_and(&k, &v, |k, v| {
                crate::kernels::prefill_attention(&q, k, v, nh, pos)
            })?;
            return self
                .o_proj
                .forward(&Tensor::from_vec(y, (b, seq, nh * hd), x.device())?);
        }
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
    pub(crate) fn forward_row(
        &self,
        x: &[f32],
        pos: usize,
        rope: &Rope,
        cache: &mut LayerCache,
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
