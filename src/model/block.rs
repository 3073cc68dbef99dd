//! One decoder block: pre-norm attention and SwiGLU MLP with residuals.

use super::attention::Attention;
use super::ffn_tier::CoarseFfn;
use super::kv_cache::LayerCache;
use super::norm::RmsNorm;
use super::rope::Rope;
use super::{Config, Mlp, MlpObserver};
use anyhow::Result;
use candle_core::Tensor;
use candle_nn::VarBuilder;

#[derive(Debug, Clone)]
pub(crate) struct Block {
    input_norm: RmsNorm,
    pub(crate) attn: Attention,
    post_attention_norm: RmsNorm,
    pub mlp: Mlp,
    /// The layer's coarse FFN tier, computed after `mlp` (graded precision).
    pub(crate) coarse: Option<CoarseFfn>,
}

impl Block {
    /// Loads a block; `mlp` replaces the dense MLP (selective loading).
    pub(crate) fn load(vb: VarBuilder, cfg: &Config, mlp: Option<Mlp>) -> Result<Self> {
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
            coarse: None,
        })
    }

    /// Loads block `layer` of a quantized checkpoint, with `mlp` (its bundles).
    pub(crate) fn from_file(
        file: &super::qfile::QFile,
        cfg: &Config,
        layer: usize,
        mlp: Mlp,
    ) -> Result<Self> {
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let norm = |name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(
                file.f32(&format!("model.layers.{layer}.{name}.weight"), h)?,
                eps,
            ))
        };
        Ok(Self {
            input_norm: norm("input_layernorm")?,
            attn: Attention::from_file(file, cfg, layer)?,
            post_attention_norm: norm("post_attention_layernorm")?,
            mlp,
            coarse: None,
        })
    }

    /// The block with `coarse` as its coarse FFN tier.
    pub(crate) fn with_coarse(self, coarse: Option<CoarseFfn>) -> Self {
        Self { coarse, ..self }
    }

    /// Bytes of weights read per token: attention, MLP and coarse tier.
    pub(crate) fn weight_bytes(&self) -> usize {
        self.attn.weight_bytes()
            + self.mlp.weight_bytes()
            + self.coarse.as_ref().map_or(0, CoarseFfn::weight_bytes)
    }

    /// One block at positions `pos..`; `observe` (e.g. a profiler) sees the
    /// MLP activations `silu(gate)·up`; `mlp` replaces the block's own MLP
    /// (a per-prompt compact one).
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        pos: usize,
        rope: &Rope,
        cache: &mut LayerCache,
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
        let m = match &self.coarse {
            Some(c) => (m + c.forward(&normed)?)?,
            None => m,
        };
        Ok((h + m)?)
    }

    /// One token on the CPU, on plain buffers: `x [hidden]` becomes the
    /// block's output; the same computation as [`Block::forward`].
    pub(crate) fn forward_row(
        &self,
        x: &mut [f32],
        pos: usize,
        rope: &Rope,
        cache: &mut LayerCache,
        mlp: Option<&Mlp>,
    ) -> Result<()> {
        let mut normed = vec![0f32; x.len()];
        self.input_norm.forward_row(x, &mut normed)?;
        let attn = self.attn.forward_row(&normed, pos, rope, cache)?;
        x.iter_mut().zip(&attn).for_each(|(x, a)| *x += a);
        self.post_attention_norm.forward_row(x, &mut normed)?;
        let m = mlp.unwrap_or(&self.mlp).forward_row(&normed)?;
        x.iter_mut().zip(&m).for_each(|(x, m)| *x += m);
        if let Some(c) = &self.coarse {
            c.add_row(&normed, x)?;
        }
        Ok(())
    }
}
